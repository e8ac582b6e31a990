//! The gateway's configuration file.
//!
//! ```toml
//! listen = "127.0.0.1:9000"
//! cluster = ".bulwark-dev"          # the directory `bulwark cluster init` wrote
//! object_bytes_max = 5368709120     # largest single PUT; larger ones get EntityTooLarge
//! max_connections = 256
//!
//! [[access_keys]]
//! access_key = "AKEXAMPLE"
//! secret_key = "a long random secret"
//! client = "admin"                  # a client in cluster.toml whose secrets are in the directory
//!
//! # SSE-S3: the first key seals new objects; keep older ones listed to read what they sealed.
//! [[sse_s3_keys]]
//! id = "2026-12"
//! key_file = "sse-2026-12.key"      # 64 hex digits; relative to this file's directory
//! ```

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// One access key and the Bulwark client it acts as.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKey {
    /// The S3 access key id.
    pub access_key: String,
    /// Its secret.
    pub secret_key: String,
    /// The cluster client it acts as.
    pub client: String,
}

/// One SSE-S3 key: its id (kept in the records of the objects it sealed) and where it is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SseKey {
    /// The key's name; at most 64 bytes.
    pub id: String,
    /// A file holding the 256-bit key as 64 hex digits (surrounding whitespace ignored).
    pub key_file: PathBuf,
}

impl SseKey {
    /// Reads the key; a relative `key_file` is taken from `base`.
    pub fn read(&self, base: &std::path::Path) -> Result<[u8; 32], ConfigError> {
        let path = base.join(&self.key_file);
        let invalid = |problem: String| ConfigError::Invalid {
            file: path.display().to_string(),
            problem,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| invalid(e.to_string()))?;
        hex::decode(text.trim())
            .ok()
            .and_then(|key| <[u8; 32]>::try_from(key).ok())
            .ok_or_else(|| invalid(format!("SSE-S3 key {:?} is not 64 hex digits", self.id)))
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000))
}
fn default_object_bytes_max() -> u64 {
    5 << 30
}
fn default_max_connections() -> usize {
    256
}
fn default_chunk_buffers() -> usize {
    32
}
fn default_chunk_grace_secs() -> u64 {
    60
}

/// The least age at which a gateway collecting on its own deletes a chunk no object names.
pub const COLLECT_MIN_AGE_FLOOR_SECS: u64 = 3600;

fn default_collect_min_age_secs() -> u64 {
    24 * 3600
}

/// The whole configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Where to serve S3.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The cluster directory.
    pub cluster: PathBuf,
    /// Largest single PUT or copy, in bytes.
    #[serde(default = "default_object_bytes_max")]
    pub object_bytes_max: u64,
    /// Connections served at once; more wait in the listen backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Chunk buffers of 4 MiB all requests together may hold.
    #[serde(default = "default_chunk_buffers")]
    pub chunk_buffers: usize,
    /// Seconds the chunks of a replaced or deleted version stay readable.
    #[serde(default = "default_chunk_grace_secs")]
    pub chunk_grace_secs: u64,
    /// Seconds between two runs of the collector of chunks no object names
    /// ([`crate::collect`]), as the first access key's client; 0 (the default): never, leave it
    /// to `bulwark gateway collect`.
    #[serde(default)]
    pub collect_every_secs: u64,
    /// Chunks younger than this many seconds are never collected: longer than any body write
    /// through any gateway of the cluster may last.
    #[serde(default = "default_collect_min_age_secs")]
    pub collect_min_age_secs: u64,
    /// Who may connect.
    pub access_keys: Vec<AccessKey>,
    /// SSE-S3 keys, the first sealing new objects; none: SSE-S3 requests are refused.
    #[serde(default)]
    pub sse_s3_keys: Vec<SseKey>,
    /// The directory relative key files are read from: the configuration file's.
    #[serde(skip)]
    pub base: PathBuf,
}

/// Why a configuration is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid TOML of this shape.
    #[error("{file}: {error}")]
    Parse {
        /// The file.
        file: String,
        /// The problem.
        error: String,
    },
    /// Valid TOML but not a usable configuration.
    #[error("{file}: {problem}")]
    Invalid {
        /// The file.
        file: String,
        /// The problem.
        problem: String,
    },
}

impl GatewayConfig {
    /// Parses and checks a configuration; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<GatewayConfig, ConfigError> {
        let config: GatewayConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_owned(),
            error: e.to_string(),
        })?;
        config.check(file)?;
        Ok(config)
    }

    /// Checks what the types cannot.
    pub fn check(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |problem: String| ConfigError::Invalid {
            file: file.to_owned(),
            problem,
        };
        if self.access_keys.is_empty() {
            return Err(invalid("access_keys: at least one is needed".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for key in &self.access_keys {
            if key.access_key.is_empty() || key.access_key.len() > 128 {
                return Err(invalid(
                    "access_keys: an access_key must be 1 to 128 bytes".into(),
                ));
            }
            if key.secret_key.len() < 8 {
                return Err(invalid(format!(
                    "access_keys: the secret of {:?} is shorter than 8 bytes",
                    key.access_key
                )));
            }
            if !seen.insert(&key.access_key) {
                return Err(invalid(format!(
                    "access_keys: {:?} appears twice",
                    key.access_key
                )));
            }
        }
        let mut ids = std::collections::HashSet::new();
        for key in &self.sse_s3_keys {
            if key.id.is_empty() || key.id.len() > 64 {
                return Err(invalid("sse_s3_keys: an id must be 1 to 64 bytes".into()));
            }
            if !ids.insert(&key.id) {
                return Err(invalid(format!("sse_s3_keys: {:?} appears twice", key.id)));
            }
        }
        if self.max_connections == 0 || self.chunk_buffers == 0 {
            return Err(invalid(
                "max_connections and chunk_buffers must be at least 1".into(),
            ));
        }
        if self.collect_every_secs > 0 && self.collect_min_age_secs < COLLECT_MIN_AGE_FLOOR_SECS {
            return Err(invalid(format!(
                "collect_min_age_secs must be at least {COLLECT_MIN_AGE_FLOOR_SECS} when the gateway collects on its own: a younger chunk may belong to an upload still in flight"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses() {
        let c = GatewayConfig::parse(
            "listen = \"127.0.0.1:9100\"\ncluster = \"c\"\n[[access_keys]]\naccess_key = \"ak\"\nsecret_key = \"12345678\"\nclient = \"admin\"\n",
            "g.toml",
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9100);
        assert_eq!(c.object_bytes_max, 5 << 30);
        assert_eq!(c.access_keys[0].client, "admin");
        assert_eq!(
            (c.collect_every_secs, c.collect_min_age_secs),
            (0, 24 * 3600)
        );
    }

    #[test]
    fn a_gateway_collects_on_its_own_only_chunks_older_than_an_hour() {
        let base = "cluster = \"c\"\n[[access_keys]]\naccess_key = \"a\"\nsecret_key = \"12345678\"\nclient = \"x\"\n";
        let c =
            GatewayConfig::parse(&format!("collect_every_secs = 3600\n{base}"), "g.toml").unwrap();
        assert_eq!(
            (c.collect_every_secs, c.collect_min_age_secs),
            (3600, 24 * 3600)
        );
        let e = GatewayConfig::parse(
            &format!("collect_every_secs = 60\ncollect_min_age_secs = 60\n{base}"),
            "g.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("collect_min_age_secs"), "{e}");
    }

    #[test]
    fn sse_s3_keys_are_read_and_checked() {
        let dir = std::env::temp_dir().join(format!("bulwark-sse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("good.key"), format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::write(dir.join("short.key"), "abcd").unwrap();
        let base = "cluster = \"c\"\n[[access_keys]]\naccess_key = \"a\"\nsecret_key = \"12345678\"\nclient = \"x\"\n";
        let key = |id: &str, file: &str| {
            format!("[[sse_s3_keys]]\nid = \"{id}\"\nkey_file = \"{file}\"\n")
        };
        let c =
            GatewayConfig::parse(&format!("{base}{}", key("k1", "good.key")), "g.toml").unwrap();
        assert_eq!(c.sse_s3_keys[0].read(&dir).unwrap(), [0xab; 32]);
        let c =
            GatewayConfig::parse(&format!("{base}{}", key("k2", "short.key")), "g.toml").unwrap();
        let e = c.sse_s3_keys[0].read(&dir).unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
        let twice = format!("{base}{}{}", key("k", "good.key"), key("k", "short.key"));
        let e = GatewayConfig::parse(&twice, "g.toml").unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mistakes_are_named() {
        let e = GatewayConfig::parse("cluster = \"c\"\naccess_keys = []\n", "g.toml").unwrap_err();
        assert!(e.to_string().contains("at least one"), "{e}");
        let e = GatewayConfig::parse("cluster = \"c\"\nlisten = 5\naccess_keys = []\n", "g.toml")
            .unwrap_err();
        assert!(e.to_string().starts_with("g.toml"), "{e}");
        let dup = "cluster = \"c\"\n[[access_keys]]\naccess_key = \"a\"\nsecret_key = \"12345678\"\nclient = \"x\"\n";
        let e = GatewayConfig::parse(&format!("{dup}{}", &dup[14..]), "g.toml").unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}
