//! Volumes: named sets of objects, each served by one register protocol. A cluster serves every
//! protocol at once; the protocol is chosen when the volume is created and recorded in the
//! system volume (a PoWerStore register per volume, `\0sys\0volume/NAME`), so every client finds
//! the same one. Objects of a named volume live under keys prefixed with the volume's name, so
//! two volumes never share a register even on one protocol; the default volume's keys are the
//! user's keys as they are, and may not begin with the NUL byte that starts every prefix.

use crate::{Client, ClientError, OpReport};
use bulwark_core::Key;
use bulwark_core::config::Protocol;
use bytes::Bytes;

/// The longest volume name.
pub const VOLUME_NAME_BYTES_MAX: usize = 63;

/// The prefix of every system and volume key: no default-volume key may start with it.
const RESERVED: u8 = 0;

/// A volume: its name (empty for the default volume) and its protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    name: String,
    /// The register protocol that serves it.
    pub protocol: Protocol,
    /// The system volume's keys carry their own reserved prefix.
    system: bool,
}

impl Volume {
    /// The default volume of a cluster whose `cluster.toml` names `protocol`.
    pub fn default_of(protocol: Protocol) -> Volume {
        Volume {
            name: String::new(),
            protocol,
            system: false,
        }
    }

    /// The volume's name; empty for the default volume.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Checks a volume name: 1 to 63 characters of `a-z`, `0-9`, `-`, `_`, `.`.
    pub fn check_name(name: &str) -> Result<(), ClientError> {
        let problem = if name.is_empty() || name.len() > VOLUME_NAME_BYTES_MAX {
            Some(format!("a name is 1 to {VOLUME_NAME_BYTES_MAX} bytes"))
        } else if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        {
            Some("a name uses only a-z, 0-9, '-', '_' and '.'".to_string())
        } else {
            None
        };
        match problem {
            Some(problem) => Err(ClientError::Volume {
                name: name.to_string(),
                problem,
            }),
            None => Ok(()),
        }
    }

    /// The register key of the user's `key` in this volume.
    pub(crate) fn register_key(&self, key: &[u8]) -> Result<Key, ClientError> {
        if self.system {
            return Ok(Key::new(key.to_vec())?);
        }
        if self.name.is_empty() {
            if key.first() == Some(&RESERVED) {
                return Err(ClientError::Volume {
                    name: String::new(),
                    problem: "keys of the default volume may not begin with a NUL byte".into(),
                });
            }
            return Ok(Key::new(key.to_vec())?);
        }
        if key.is_empty() {
            return Err(ClientError::Key(bulwark_core::ids::KeyError::Empty));
        }
        let mut bytes = Vec::with_capacity(self.name.len() + 6 + key.len());
        bytes.extend_from_slice(&[RESERVED]);
        bytes.extend_from_slice(b"vol\0");
        bytes.extend_from_slice(self.name.as_bytes());
        bytes.push(RESERVED);
        bytes.extend_from_slice(key);
        Ok(Key::new(bytes)?)
    }

    /// Where the system volume records `name`.
    fn record_key(name: &str) -> Vec<u8> {
        let mut key = vec![RESERVED];
        key.extend_from_slice(b"sys\0volume/");
        key.extend_from_slice(name.as_bytes());
        key
    }
}

/// The system volume: always PoWerStore, whatever the default volume's protocol.
fn system() -> Volume {
    Volume {
        system: true,
        ..Volume::default_of(Protocol::PowerStore)
    }
}

impl Client {
    /// Creates volume `name` served by `protocol`. Creating a volume that exists with the same
    /// protocol is a no-op; with another protocol, an error (its objects would be lost to view).
    pub async fn create_volume(
        &self,
        name: &str,
        protocol: Protocol,
    ) -> Result<(Volume, OpReport), ClientError> {
        Volume::check_name(name)?;
        let key = Volume::record_key(name);
        let (existing, _) = self.read(&system(), &key).await?;
        if let Some(existing) = existing {
            let volume = parse_record(name, &existing)?;
            if volume.protocol != protocol {
                return Err(ClientError::Volume {
                    name: name.to_string(),
                    problem: format!("exists already, served by {}", volume.protocol),
                });
            }
        }
        // The record is a write like any other: its own register, linearizable.
        let report = self
            .write(&system(), &key, Some(Bytes::from(protocol.name())))
            .await?;
        let volume = Volume {
            name: name.to_string(),
            protocol,
            system: false,
        };
        if let Ok(mut known) = self.volumes.lock() {
            known.insert(name.to_string(), volume.clone());
        }
        Ok((volume, report))
    }

    /// The volume `name`, as the system volume records it. A volume's protocol never changes,
    /// so a client remembers what it read.
    pub async fn volume(&self, name: &str) -> Result<Volume, ClientError> {
        Volume::check_name(name)?;
        if let Some(volume) = self.volumes.lock().ok().and_then(|v| v.get(name).cloned()) {
            return Ok(volume);
        }
        let (record, _) = self.read(&system(), &Volume::record_key(name)).await?;
        let Some(record) = record else {
            return Err(ClientError::Volume {
                name: name.to_string(),
                problem: "no such volume (create it with `bulwark volume create`)".into(),
            });
        };
        let volume = parse_record(name, &record)?;
        if let Ok(mut known) = self.volumes.lock() {
            known.insert(name.to_string(), volume.clone());
        }
        Ok(volume)
    }
}

fn parse_record(name: &str, record: &[u8]) -> Result<Volume, ClientError> {
    let protocol = std::str::from_utf8(record)
        .ok()
        .and_then(|text| text.parse::<Protocol>().ok())
        .ok_or_else(|| ClientError::Volume {
            name: name.to_string(),
            problem: "its record names no protocol this client knows".into(),
        })?;
    Ok(Volume {
        name: name.to_string(),
        protocol,
        system: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_keys_never_meet_default_keys_or_each_other() {
        let default = Volume::default_of(Protocol::PowerStore);
        let photos = Volume {
            name: "photos".into(),
            protocol: Protocol::PowerStore,
            system: false,
        };
        let photo = Volume {
            name: "photo".into(),
            ..photos.clone()
        };
        let a = photos.register_key(b"a").unwrap();
        let b = photo.register_key(b"sa").unwrap();
        assert_ne!(a, b, "the NUL after the name keeps prefixes apart");
        assert_ne!(a.as_bytes(), b"a");
        assert!(default.register_key(a.as_bytes()).is_err());
        assert_eq!(default.register_key(b"a").unwrap().as_bytes(), b"a");
        assert_ne!(Volume::record_key("photos"), a.as_bytes());
        assert!(system().register_key(&Volume::record_key("photos")).is_ok());
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "photos-2024", "x.y_z"] {
            Volume::check_name(good).unwrap();
        }
        for bad in ["", "Photos", "a/b", "a\0", &"x".repeat(64)] {
            assert!(Volume::check_name(bad).is_err(), "{bad:?}");
        }
    }
}
