//! Volumes: named sets of objects, each served by one register protocol or by one server with a
//! trusted log. A cluster serves every protocol at once; the choice is made when the volume is
//! created and recorded in the system volume (a PoWerStore register per volume,
//! `\0sys\0volume/NAME`), so every client finds the same one. Objects of a named volume live
//! under keys prefixed with the volume's name, so two volumes never share a register even on one
//! protocol; the default volume's keys are the user's keys as they are, and may not begin with
//! the NUL byte that starts every prefix.
//!
//! A single-server volume (A2M-Storage, A2M §4.2) lives on the node named at its creation, under
//! a number that node's volumes do not share: the name's hash, claimed in the system volume
//! (`\0sys\0a2m/NODE/NUMBER` holds the name), the next number when another name holds it.

use crate::{Client, ClientError, OpReport};
use bulwark_core::config::Protocol;
use bulwark_core::{ClientId, Digest, Key, NodeId};
use bulwark_protocol::depot::VolumeId;
use bulwark_protocol::powerstore;
use bytes::Bytes;
use std::fmt;

/// The longest volume name.
pub const VOLUME_NAME_BYTES_MAX: usize = 63;

/// The prefix of every system and volume key: no default-volume key may start with it.
const RESERVED: u8 = 0;

/// How a volume's objects are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// By the replica group of each key, with this register protocol.
    Replicated(Protocol),
    /// By the replica group of each key, with PoWerStore, every register of the volume written
    /// by `writer` alone: the nodes refuse anyone else's writes, and the writer, which knows its
    /// own clock, writes in two rounds (STORE, COMPLETE) instead of three.
    SoleWriter {
        /// The only client that may write it.
        writer: ClientId,
    },
    /// By one server with a trusted log (A2M-Storage): the node, and the volume's number there.
    SingleServer {
        /// The node that serves it.
        server: NodeId,
        /// Its number on that node.
        number: u32,
    },
    /// As a causal volume (Depot): available and fork-join-causal whatever its servers do;
    /// its configuration is recorded beside it.
    Causal {
        /// Its number: the hash of its configuration.
        volume: VolumeId,
    },
}

impl fmt::Display for Serving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Serving::Replicated(protocol) => write!(f, "{protocol}"),
            Serving::SoleWriter { writer } => write!(f, "powerstore, written by {writer} alone"),
            Serving::SingleServer { server, number } => {
                write!(f, "a2m-storage on {server} (volume {number} there)")
            }
            Serving::Causal { volume } => write!(f, "causal (volume {:016x})", volume.0),
        }
    }
}

/// A volume: its name (empty for the default volume) and what serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    name: String,
    /// What serves it.
    pub serving: Serving,
    /// The system volume's keys carry their own reserved prefix.
    system: bool,
}

impl Volume {
    /// The default volume of a cluster whose `cluster.toml` names `protocol`.
    pub fn default_of(protocol: Protocol) -> Volume {
        Volume {
            name: String::new(),
            serving: Serving::Replicated(protocol),
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
        if let Serving::SoleWriter { writer } = self.serving {
            // The writer is part of every key, so the nodes know whom to refuse.
            bytes = powerstore::sole_writer_key(writer, &[]);
        }
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

/// Where the system volume records which name holds volume `number` of `server`.
fn claim_key(server: NodeId, number: u32) -> Vec<u8> {
    let mut key = vec![RESERVED];
    key.extend_from_slice(b"sys\0a2m/");
    key.extend_from_slice(format!("{}/{number}", server.0).as_bytes());
    key
}

/// The first number tried for single-server volume `name`: its hash, never `u32::MAX` (the
/// node-wide replica's group).
fn first_number(name: &str) -> u32 {
    let digest = Digest::of("bulwark.volume.number", name.as_bytes());
    let bytes: [u8; 4] = digest.0[..4].try_into().unwrap_or_default();
    u32::from_be_bytes(bytes) % u32::MAX
}

/// Numbers tried before creation gives up: another name holding each of them is as unlikely as
/// 32-bit hash collisions that many times over.
const CLAIMS_MAX: u32 = 16;

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
        if let Some(volume) = self.existing(name).await?
            && volume.serving != Serving::Replicated(protocol)
        {
            return Err(ClientError::Volume {
                name: name.to_string(),
                problem: format!("exists already, served by {}", volume.serving),
            });
        }
        self.record_volume(name, Serving::Replicated(protocol))
            .await
    }

    /// Creates volume `name` on PoWerStore with `writer` its only writer (see
    /// [`Serving::SoleWriter`]). Creating it again with the same writer is a no-op; otherwise,
    /// an error.
    pub async fn create_sole_writer_volume(
        &self,
        name: &str,
        writer: ClientId,
    ) -> Result<(Volume, OpReport), ClientError> {
        Volume::check_name(name)?;
        let serving = Serving::SoleWriter { writer };
        if !self
            .cluster
            .clients
            .iter()
            .any(|client| client.id == writer.0 && client.write)
        {
            return Err(ClientError::Volume {
                name: name.to_string(),
                problem: format!("{writer} is not a writer in cluster.toml"),
            });
        }
        if let Some(volume) = self.existing(name).await? {
            return match volume.serving {
                existing if existing == serving => Ok((volume, OpReport::default())),
                existing => Err(ClientError::Volume {
                    name: name.to_string(),
                    problem: format!("exists already, served by {existing}"),
                }),
            };
        }
        self.record_volume(name, serving).await
    }

    /// Creates volume `name` served by node `server` alone, with its trusted log (A2M-Storage):
    /// linearizable for its clients whatever the server does, which can stop serving but cannot
    /// fork or roll back what they see without their noticing. Creating it again on the same
    /// node is a no-op; on another node, or served otherwise, an error.
    pub async fn create_single_server_volume(
        &self,
        name: &str,
        server: NodeId,
    ) -> Result<(Volume, OpReport), ClientError> {
        Volume::check_name(name)?;
        self.single_server(server, 0)?;
        if let Some(volume) = self.existing(name).await? {
            return match volume.serving {
                Serving::SingleServer { server: on, .. } if on == server => {
                    Ok((volume, OpReport::default()))
                }
                serving => Err(ClientError::Volume {
                    name: name.to_string(),
                    problem: format!("exists already, served by {serving}"),
                }),
            };
        }
        let mut number = first_number(name);
        for _ in 0..CLAIMS_MAX {
            let claim = claim_key(server, number);
            let (holder, _) = self.read(&system(), &claim).await?;
            match holder {
                Some(holder) if holder.as_ref() != name.as_bytes() => {
                    number = (number + 1) % u32::MAX;
                }
                Some(_) => break,
                None => {
                    self.write(&system(), &claim, Some(Bytes::from(name.to_string())))
                        .await?;
                    break;
                }
            }
        }
        let (holder, _) = self.read(&system(), &claim_key(server, number)).await?;
        if holder.as_deref() != Some(name.as_bytes()) {
            return Err(ClientError::Volume {
                name: name.to_string(),
                problem: format!("found no free volume number on {server}"),
            });
        }
        self.record_volume(name, Serving::SingleServer { server, number })
            .await
    }

    /// The volume `name` as recorded, if it is.
    pub(crate) async fn existing(&self, name: &str) -> Result<Option<Volume>, ClientError> {
        let (existing, _) = self.read(&system(), &Volume::record_key(name)).await?;
        existing
            .map(|record| parse_record(name, &record))
            .transpose()
    }

    /// Records volume `name` as served by `serving`.
    pub(crate) async fn record_volume(
        &self,
        name: &str,
        serving: Serving,
    ) -> Result<(Volume, OpReport), ClientError> {
        // The record is a write like any other: its own register, linearizable.
        let report = self
            .write(
                &system(),
                &Volume::record_key(name),
                Some(Bytes::from(record_text(serving))),
            )
            .await?;
        let volume = Volume {
            name: name.to_string(),
            serving,
            system: false,
        };
        if let Ok(mut known) = self.volumes.lock() {
            known.insert(name.to_string(), volume.clone());
        }
        Ok((volume, report))
    }

    /// Writes `value` under the system volume's `key`.
    pub(crate) async fn write_system(&self, key: &[u8], value: Bytes) -> Result<(), ClientError> {
        self.write(&system(), key, Some(value)).await.map(|_| ())
    }

    /// Reads the system volume's `key`.
    pub(crate) async fn read_system(
        &self,
        key: &[u8],
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        self.read_replicated(&system(), key).await
    }

    /// The volume `name`, as the system volume records it. A volume's protocol never changes,
    /// so a client remembers what it read; a causal volume it used, across runs too (its own
    /// servers may be all it can reach).
    pub async fn volume(&self, name: &str) -> Result<Volume, ClientError> {
        Volume::check_name(name)?;
        if let Some(volume) = self.volumes.lock().ok().and_then(|v| v.get(name).cloned()) {
            return Ok(volume);
        }
        if let Some(volume) = self.remembered_causal(name)? {
            return Ok(Volume {
                name: name.to_string(),
                serving: Serving::Causal { volume },
                system: false,
            });
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

/// How the system volume records `serving`: a protocol's name, or
/// `a2m-storage node=N number=V`.
fn record_text(serving: Serving) -> String {
    match serving {
        Serving::Replicated(protocol) => protocol.name().to_string(),
        Serving::SoleWriter { writer } => format!("{} writer={}", Protocol::PowerStore, writer.0),
        Serving::SingleServer { server, number } => {
            format!("{SINGLE_SERVER} node={} number={number}", server.0)
        }
        Serving::Causal { volume } => crate::causal::record_text(volume),
    }
}

/// The record name of single-server volumes.
const SINGLE_SERVER: &str = "a2m-storage";

fn parse_serving(text: &str) -> Option<Serving> {
    if let Ok(protocol) = text.parse::<Protocol>() {
        return Some(Serving::Replicated(protocol));
    }
    if let Some(volume) = crate::causal::parse_record(text) {
        return Some(Serving::Causal { volume });
    }
    let mut words = text.split(' ');
    let first = words.next()?;
    if first == Protocol::PowerStore.name() {
        let writer = words.next()?.strip_prefix("writer=")?.parse().ok()?;
        return match words.next() {
            None => Some(Serving::SoleWriter {
                writer: ClientId(writer),
            }),
            Some(_) => None,
        };
    }
    if first != SINGLE_SERVER {
        return None;
    }
    let server = words.next()?.strip_prefix("node=")?.parse().ok()?;
    let number = words.next()?.strip_prefix("number=")?.parse().ok()?;
    if words.next().is_some() || number == u32::MAX {
        return None;
    }
    Some(Serving::SingleServer {
        server: NodeId(server),
        number,
    })
}

fn parse_record(name: &str, record: &[u8]) -> Result<Volume, ClientError> {
    let serving = std::str::from_utf8(record)
        .ok()
        .and_then(parse_serving)
        .ok_or_else(|| ClientError::Volume {
            name: name.to_string(),
            problem: "its record names nothing this client knows to serve it".into(),
        })?;
    Ok(Volume {
        name: name.to_string(),
        serving,
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
            serving: Serving::Replicated(Protocol::PowerStore),
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
        let sole = Volume {
            serving: Serving::SoleWriter {
                writer: ClientId(5),
            },
            ..photos.clone()
        };
        let c = sole.register_key(b"a").unwrap();
        assert_eq!(powerstore::sole_writer(&c), Some(ClientId(5)));
        assert_eq!(powerstore::sole_writer(&a), None);
        assert_ne!(c, a);
        assert!(default.register_key(c.as_bytes()).is_err());
    }

    #[test]
    fn records_say_what_serves_a_volume_and_nothing_else_parses() {
        let single = Serving::SingleServer {
            server: NodeId(3),
            number: 77,
        };
        let causal = Serving::Causal {
            volume: VolumeId(0x0123_4567_89ab_cdef),
        };
        let sole = Serving::SoleWriter {
            writer: ClientId(12),
        };
        for serving in [Serving::Replicated(Protocol::Abd), single, causal, sole] {
            assert_eq!(parse_serving(&record_text(serving)), Some(serving));
        }
        for bad in [
            "",
            "a2m-storage",
            "a2m-storage node=3",
            "a2m-storage node=3 number=x",
            "a2m-storage node=3 number=77 more",
            "a2m-storage number=77 node=3",
            "a2m-storage node=3 number=4294967295",
            "causal",
            "causal volume=123",
            "causal volume=0123456789abcdefg",
            "causal volume=0123456789abcdef more",
            "powerstore writer=",
            "powerstore writer=x",
            "powerstore writer=1 more",
            "powerstore node=1",
        ] {
            assert_eq!(parse_serving(bad), None, "{bad:?}");
        }
        assert_ne!(first_number("photos"), u32::MAX);
        assert_ne!(claim_key(NodeId(1), 2), claim_key(NodeId(12), 2));
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
