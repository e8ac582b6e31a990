//! The Bulwark storage node.
//!
//! A node accepts mutually authenticated TLS connections from the clients listed in the cluster
//! configuration, decodes each frame under a size limit, and hands protocol requests to one actor
//! task that owns the protocol machine. The machine's state changes go to the group committer;
//! a reply leaves only once every change handled before it is durable, so a crash never loses
//! anything acknowledged and never un-says anything a client saw (DESIGN.md §2 "Rules").
//!
//! What it deliberately does not do: talk to other nodes (PoWerStore servers never do), or trust
//! anything a peer sends before the protocol machine has checked it.

mod actor;
mod connection;
mod rejections;

pub use rejections::Rejections;

use bulwark_core::config::{ClusterConfig, NodeSecrets, parse_secrets};
use bulwark_core::{NodeId, Time};
use bulwark_protocol::powerstore::{Server, ServerConfig, ServerLogic, StoredEntry};
use bulwark_storage::{Committer, Store, Table};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;

/// Connections served at once; more wait in the listener's backlog.
const CONNECTIONS_MAX: usize = 1024;

/// Everything a node needs to start.
pub struct NodeOptions {
    /// The public cluster configuration.
    pub cluster: ClusterConfig,
    /// This node's secrets.
    pub secrets: NodeSecrets,
    /// This node's TLS identity.
    pub identity: bulwark_transport::Identity,
    /// Where its durable state lives.
    pub data_dir: PathBuf,
    /// Overrides the configured listen address (containers bind 0.0.0.0).
    pub listen: Option<SocketAddr>,
    /// Overrides the configured metrics address.
    pub metrics: Option<SocketAddr>,
    /// How long superseded versions stay readable.
    pub grace_millis: u64,
}

/// Why a node could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A configuration or secrets file is wrong.
    #[error(transparent)]
    Config(#[from] bulwark_core::config::ConfigError),
    /// A file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The durable store failed.
    #[error("storage: {0}")]
    Storage(#[from] bulwark_storage::StorageError),
    /// TLS set-up failed.
    #[error("transport: {0}")]
    Transport(#[from] bulwark_transport::TransportError),
    /// A durable state record did not decode: the data directory is damaged.
    #[error("stored {table} record could not be decoded: {problem}")]
    CorruptState {
        /// Which table.
        table: &'static str,
        /// Why.
        problem: String,
    },
    /// The listener could not bind.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// Metrics could not be served.
    #[error("metrics: {0}")]
    Metrics(String),
}

fn read(path: &Path) -> Result<String, NodeError> {
    std::fs::read_to_string(path).map_err(|source| NodeError::File {
        path: path.to_path_buf(),
        source,
    })
}

impl NodeOptions {
    /// Loads `cluster.toml` and `node-<id>/` from a directory written by `bulwark cluster init`.
    pub fn load(
        cluster_dir: &Path,
        id: u32,
        data_dir: Option<PathBuf>,
    ) -> Result<NodeOptions, NodeError> {
        let cluster_file = cluster_dir.join("cluster.toml");
        let cluster =
            ClusterConfig::parse(&read(&cluster_file)?, &cluster_file.display().to_string())?;
        let node_dir = cluster_dir.join(format!("node-{id}"));
        let secrets_file = node_dir.join("node.toml");
        let secrets: NodeSecrets =
            parse_secrets(&read(&secrets_file)?, &secrets_file.display().to_string())?;
        if secrets.id != id || cluster.node(NodeId(id)).is_none() {
            return Err(bulwark_core::config::ConfigError::Invalid {
                file: secrets_file.display().to_string(),
                field: "id".into(),
                problem: format!(
                    "this is node {} but node {id} was asked for (cluster has {})",
                    secrets.id,
                    cluster.n()
                ),
            }
            .into());
        }
        let identity = bulwark_transport::Identity::from_pem(
            &read(&node_dir.join("tls.crt"))?,
            &read(&node_dir.join("tls.key"))?,
        )?;
        Ok(NodeOptions {
            cluster,
            secrets,
            identity,
            data_dir: data_dir.unwrap_or_else(|| node_dir.join("data")),
            listen: None,
            metrics: None,
            grace_millis: 10_000,
        })
    }

    fn id(&self) -> NodeId {
        NodeId(self.secrets.id)
    }
}

/// Wraps the honest server before it serves: the identity for production, a Byzantine behaviour
/// in test builds that link one.
pub type Wrap = Box<dyn FnOnce(Server) -> Box<dyn ServerLogic> + Send>;

/// Runs a node until the process is stopped.
pub async fn run(options: NodeOptions, wrap: Wrap) -> Result<(), NodeError> {
    let id = options.id();
    let entry = options
        .cluster
        .node(id)
        .cloned()
        .ok_or_else(|| NodeError::Metrics("node missing".into()))?;
    let listen = options.listen.unwrap_or(entry.address);
    if let Some(address) = options.metrics.or(entry.metrics) {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets(&[
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 16.0, 64.0, 256.0,
                1024.0,
            ])
            .map_err(|e| NodeError::Metrics(e.to_string()))?
            .install()
            .map_err(|e| NodeError::Metrics(e.to_string()))?;
        tracing::info!(%address, "serving metrics");
    }

    let started = Instant::now();
    let store = Arc::new(Store::open(&options.data_dir)?);
    let mut config = ServerConfig::new(id, options.cluster.f);
    config.epoch = bulwark_core::Epoch(options.cluster.epoch);
    config.grace_millis = options.grace_millis;
    let mut server = Server::new(config, options.secrets.mac_key.clone());
    let restored = restore(&store, &mut server)?;
    server.finish_restore(Time(0));
    tracing::info!(node = id.0, versions = restored, data = %options.data_dir.display(), "state restored");
    let server = wrap(server);

    let committer = Committer::start(store.clone());
    let rejections = Rejections::default();
    let actor = actor::spawn(actor::ActorContext {
        node: id,
        server,
        committer,
        started,
        rejections: rejections.clone(),
    });

    let allowed = options
        .cluster
        .clients
        .iter()
        .map(|c| c.fingerprint)
        .collect();
    let acceptor = Arc::new(bulwark_transport::Acceptor::new(
        &options.identity,
        allowed,
    )?);
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| NodeError::Listen {
            address: listen,
            source,
        })?;
    tracing::info!(node = id.0, %listen, "serving");
    let cluster = Arc::new(options.cluster);
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break Ok(());
        };
        let context = connection::ConnectionContext {
            cluster: cluster.clone(),
            acceptor: acceptor.clone(),
            actor: actor.clone(),
            rejections: rejections.clone(),
        };
        tokio::spawn(async move {
            connection::serve(context, tcp, peer).await;
            drop(slot);
        });
    }
}

/// Replays the durable state into `server`; returns the number of versions restored.
fn restore(store: &Store, server: &mut Server) -> Result<usize, NodeError> {
    use bulwark_protocol::powerstore::Candidate;
    let mut versions = 0;
    for (record, value) in store.load(Table::Hist)? {
        let (key, entry): (bulwark_core::Key, StoredEntry) =
            bulwark_core::wire::decode(&value, usize::MAX).map_err(|e| {
                NodeError::CorruptState {
                    table: "hist",
                    problem: format!("{e} (record {} bytes)", record.len()),
                }
            })?;
        server.restore_hist(key, entry);
        versions += 1;
    }
    for (_, value) in store.load(Table::Lc)? {
        let (key, candidate): (bulwark_core::Key, Candidate) =
            bulwark_core::wire::decode(&value, usize::MAX).map_err(|e| {
                NodeError::CorruptState {
                    table: "lc",
                    problem: e.to_string(),
                }
            })?;
        server.restore_lc(key, candidate);
    }
    Ok(versions)
}
