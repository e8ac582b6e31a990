//! The Bulwark storage node.
//!
//! A node hosts one replica per service for every replica group the configuration's placement
//! puts it in. It accepts mutually authenticated TLS connections from the clients and nodes listed
//! in the configuration, routes each envelope by its header to the shard that hosts the replica
//! (`dispatch`), and keeps links to the other nodes for replicas that talk to their group. Shards
//! drive replicas through the protocols' one contract (`host`, `shard`); state changes go to the
//! group committer, and a reply or message leaves only once every change handled before it is
//! durable, so a crash never loses anything acknowledged and never un-says anything a client saw
//! (DESIGN.md §2 "Rules").
//!
//! What it deliberately does not do: trust anything a peer sends before the protocol machine has
//! checked it.

pub mod cs;
pub mod depots;
mod dispatch;
mod follow;
pub mod host;
mod peers;
mod rejections;
mod shard;
mod trusted;
mod verified;
pub mod volumes;

pub use rejections::Rejections;

use bulwark_core::config::Protocol;
use bulwark_core::config::{ClusterConfig, NodeSecrets, parse_secrets};
use bulwark_core::envelope::Header;
use bulwark_core::membership::{GroupView, Incarnation};
use bulwark_core::{ClientId, Epoch, NodeId, ServiceId, Time};
use bulwark_protocol::powerstore::{Server, ServerConfig, ServerKeys, ServerLogic, StoredEntry};
use bulwark_protocol::{abd, phalanx, table};
use bulwark_storage::{Committer, Namespace, StorageError, Store};
use bulwark_transport::Peer;
use host::Hosted;
use shard::ReplicaKey;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use verified::{VERIFIED_BYTES_MAX, Verified};

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
    /// The most registers per group whose metadata a PoWerStore replica keeps in memory; the
    /// rest are read back from the store when asked for.
    pub cached_keys_max: usize,
    /// The bytes of values each causal volume keeps in memory; the rest are read back from the
    /// store when asked for.
    pub causal_cache_bytes: u64,
    /// Where to dial some peers instead of their configured addresses (`host:port`, resolved at
    /// every dial): containers reach each other by name. Their pinned certificates still apply.
    pub peer_addresses: HashMap<NodeId, String>,
    /// Whether clients may create tables that protect nothing (Plain, No-Sign), to measure
    /// them beside the others.
    pub unprotected_tables: bool,
}

/// Why a node could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A configuration or secrets file is wrong.
    #[error(transparent)]
    Config(#[from] bulwark_core::config::ConfigError),
    /// A file could not be read.
    // `error`, not `source`: a source is printed again by every error chain.
    #[error("{path}: {error}")]
    File {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// The durable store could not be opened: its file is damaged or not a Bulwark store.
    #[error(
        "cannot open the store in {path}: {reason} (restore the data directory from a copy, or \
         move it aside to start this node empty)"
    )]
    OpenStore {
        /// The data directory.
        path: PathBuf,
        /// What the store said.
        reason: String,
    },
    /// Another process holds the store: most likely this node is already running. The data is
    /// not damaged, and must not be moved or restored while that process runs.
    #[error(
        "the store in {path} is in use by another process: is this node already running? Stop \
         it first (do not move or restore the data directory while it runs)"
    )]
    StoreInUse {
        /// The data directory.
        path: PathBuf,
    },
    /// The store is intact but in a format this release does not read: a copy would not help,
    /// so the store's own advice is all there is to say.
    #[error("cannot open the store in {path}: {reason}")]
    StoreFormat {
        /// The data directory.
        path: PathBuf,
        /// Which formats, and what to do.
        reason: StorageError,
    },
    /// The durable store failed.
    #[error("storage: {0}")]
    Storage(StorageError),
    /// TLS set-up failed.
    #[error("transport: {0}")]
    Transport(bulwark_transport::TransportError),
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

// By hand rather than `#[from]`: a `#[from]` source would print its message twice in a chain.
impl From<StorageError> for NodeError {
    fn from(error: StorageError) -> Self {
        NodeError::Storage(error)
    }
}

impl From<bulwark_transport::TransportError> for NodeError {
    fn from(error: bulwark_transport::TransportError) -> Self {
        NodeError::Transport(error)
    }
}

fn read(path: &Path) -> Result<String, NodeError> {
    std::fs::read_to_string(path).map_err(|error| NodeError::File {
        path: path.to_path_buf(),
        error,
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
        if cluster.node(NodeId(id)).is_none() && !secrets_file.exists() {
            return Err(bulwark_core::config::ConfigError::Invalid {
                file: cluster_file.display().to_string(),
                field: "nodes".into(),
                problem: format!(
                    "node {id} is not in it (its nodes are {}) and {} does not exist; a node that \
                     joins later is set up by `bulwark node join`",
                    cluster
                        .nodes
                        .iter()
                        .map(|node| node.id.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    secrets_file.display()
                ),
            }
            .into());
        }
        let mut secrets: NodeSecrets =
            parse_secrets(&read(&secrets_file)?, &secrets_file.display().to_string())?;
        secrets.a2m_socket = secrets.a2m_socket.map(|socket| node_dir.join(socket));
        // A node joined after the genesis is not in `cluster.toml`; it has its own address, and
        // the certified configuration that added it says the rest.
        let listed = cluster.node(NodeId(id)).is_some() || secrets.address.is_some();
        if secrets.id != id || !listed {
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
            cached_keys_max: bulwark_protocol::powerstore::CACHED_KEYS_MAX,
            causal_cache_bytes: depots::RESIDENT_VALUE_BYTES,
            peer_addresses: HashMap::new(),
            unprotected_tables: false,
        })
    }

    fn id(&self) -> NodeId {
        NodeId(self.secrets.id)
    }
}

/// Wraps what a node serves before it serves it: the identity for production, a Byzantine
/// behaviour in the test binary that links one (`bulwark-byzantine`).
pub struct Wrap {
    /// Each honest PoWerStore server.
    pub powerstore: Box<dyn Fn(Server) -> Box<dyn ServerLogic> + Send + Sync>,
    /// The host of the node's single-server volumes.
    pub volumes: WrapHosted,
    /// The host of the node's causal volumes.
    pub depots: WrapHosted,
    /// Each honest table replica.
    pub table: Box<dyn Fn(table::Server) -> Box<dyn host::TableLogic> + Send + Sync>,
    /// Each replica that follows the configuration (public-key and content-hash objects).
    pub followers: WrapHosted,
}

/// Wraps a hosted replica in another.
pub type WrapHosted = Box<dyn Fn(Box<dyn Hosted>) -> Box<dyn Hosted> + Send + Sync>;

impl Wrap {
    /// Serves everything as the protocols say.
    pub fn honest() -> Wrap {
        Wrap {
            powerstore: Box::new(|server| Box::new(server)),
            volumes: Box::new(|volumes| volumes),
            depots: Box::new(|depots| depots),
            table: Box::new(|server| Box::new(server)),
            followers: Box::new(|follower| follower),
        }
    }
}

/// Runs a node until the process is killed, or until SIGTERM or SIGINT, after which it stops
/// accepting, makes everything queued durable and closes its store cleanly.
pub async fn run(options: NodeOptions, wrap: Wrap) -> Result<(), NodeError> {
    let id = options.id();
    // A node of `cluster.toml` listens where it says; one that joined later, where it asked to
    // be certified at (its `node.toml`).
    let entry = options.cluster.node(id);
    let listen = options
        .listen
        .or(entry.map(|entry| entry.address))
        .or(options.secrets.address)
        .ok_or_else(|| {
            NodeError::Config(bulwark_core::config::ConfigError::Invalid {
                file: "node.toml".into(),
                field: "address".into(),
                problem: format!("{id} is not in cluster.toml and has no address of its own"),
            })
        })?;
    // The store first: a node already running on this data directory holds it, and that is
    // what to say, before its metrics port is found taken.
    let store = Arc::new(open_store(&options.data_dir)?);
    if let Some(address) = options.metrics.or(entry.and_then(|entry| entry.metrics)) {
        // The exporter binds its own listener and cannot wait: the port is waited for here.
        drop(
            bind_patiently(address)
                .await
                .map_err(|e| NodeError::Metrics(format!("serving on {address}: {e}")))?,
        );
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets(&[
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 16.0, 64.0, 256.0,
                1024.0,
            ])
            .map_err(|e| NodeError::Metrics(format!("serving on {address}: {e}")))?
            .install()
            .map_err(|e| NodeError::Metrics(format!("serving on {address}: {e}")))?;
        tracing::info!(%address, "serving metrics");
    }

    let started = Instant::now();
    let rejections = Rejections::default();
    let placement = options.cluster.placement()?;
    let groups = placement.groups_of(id);
    let verified = Arc::new(Mutex::new(Verified::new(VERIFIED_BYTES_MAX)));
    // What the store cannot give back while the node restores is the data directory's damage:
    // said with the directory and what to do about it.
    let damaged = |error: NodeError| match error {
        NodeError::CorruptState { .. } | NodeError::Storage(_) => NodeError::OpenStore {
            path: options.data_dir.clone(),
            reason: error.to_string(),
        },
        error => error,
    };
    let trusted = trusted_log(&options).await?;
    let mut replicas: Vec<HostedReplica> = Vec::new();
    if let Some(log) = &trusted {
        let writers = bulwark_protocol::a2m_storage::writers(&options.cluster)
            .into_iter()
            .map(|(_, key)| key)
            .collect();
        let volumes = volumes::Volumes::new(
            id,
            log.key(),
            writers,
            store.clone(),
            Epoch(options.cluster.epoch),
        );
        replicas.push((
            (ServiceId::A2M_STORAGE, host::NODE_WIDE),
            (wrap.volumes)(Box::new(volumes)),
        ));
    }
    // The shards' time zero on the wall clock: Depot's clocks and table cells' timestamps are in
    // the time members and clients share.
    let wall_at_zero_ms = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64)
        .saturating_sub(started.elapsed().as_millis() as u64);
    {
        let depots = depots::Depots::restore(
            id,
            bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key),
            Arc::new(options.cluster.clone()),
            store.clone(),
            Epoch(options.cluster.epoch),
            wall_at_zero_ms,
            options.causal_cache_bytes,
            Time(started.elapsed().as_millis() as u64),
        )
        .map_err(|reason| {
            damaged(NodeError::CorruptState {
                table: depots::CONFIGS,
                problem: reason,
            })
        })?;
        replicas.push((
            (ServiceId::DEPOT, host::NODE_WIDE),
            (wrap.depots)(Box::new(depots)),
        ));
    }
    for view in &groups {
        replicas.extend(
            build_replicas(
                &options,
                view,
                &store,
                &verified,
                &rejections,
                &wrap,
                wall_at_zero_ms,
            )
            .map_err(damaged)?,
        );
    }
    // The certified configurations, when the cluster has a configuration service; otherwise
    // `cluster.toml`'s members are the only epoch there is.
    let chain = match options.cluster.genesis()? {
        Some(genesis) => Some(cs::Chain::load(&store, genesis).map_err(damaged)?),
        None => None,
    };
    let rings = match &chain {
        Some(chain) => chain.rings().map_err(damaged)?,
        None => bulwark_core::membership::Chain::new(vec![Arc::new(placement.ring().clone())]),
    };
    let (follower, pubkey) =
        follow::pubkey_replica(id, &store, &rings, &groups, &rejections).map_err(damaged)?;
    replicas.push((follower, (wrap.followers)(Box::new(pubkey))));
    let secret = bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key);
    let (content_follower, content) =
        follow::content_replica(id, &store, &rings, &groups, secret).map_err(damaged)?;
    replicas.push((content_follower, (wrap.followers)(Box::new(content))));
    let followers = [follower, content_follower];
    tracing::info!(
        node = id.0,
        groups = groups.len(),
        replicas = replicas.len(),
        data = %options.data_dir.display(),
        "state restored"
    );

    // Node-to-node links: replicas that talk to their group reach its other members through
    // these; replies to what this node asked come back through the router. The listener admits
    // the clients and nodes of `cluster.toml`, and every member certified since.
    let connector = Arc::new(bulwark_transport::Connector::new(&options.identity)?);
    let (loopback, mut to_itself) = tokio::sync::mpsc::channel(peers::LOOPBACK_FRAMES_MAX);
    let peers = Arc::new(peers::Peers::new(
        id,
        loopback,
        options.peer_addresses.clone(),
        connector,
        bulwark_transport::Router::new(),
    ));
    let mut known = HashMap::new();
    for client in &options.cluster.clients {
        known.insert(client.fingerprint, Peer::Client(ClientId(client.id)));
    }
    for node in &options.cluster.nodes {
        known.insert(node.fingerprint, Peer::Node(NodeId(node.id)));
        peers.learn(
            NodeId(node.id),
            peers::Reach {
                address: node.address,
                fingerprint: node.fingerprint,
            },
        );
    }
    let directory = Arc::new(peers::Directory {
        peers: peers.clone(),
        inbound: Arc::new(bulwark_transport::Inbound::new(&options.identity, known)?),
    });
    if let Some(chain) = &chain {
        for config in chain.configurations()? {
            directory.meet(&config.members);
        }
        let public =
            bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key).public_key();
        if let Some(certified) = chain.current().member(id)
            && (certified.signing_key != public
                || certified.fingerprint != options.identity.fingerprint())
        {
            return Err(NodeError::Config(
                bulwark_core::config::ConfigError::Invalid {
                    file: "node.toml".into(),
                    field: "signing_key".into(),
                    problem: format!(
                        "the certified configuration of epoch {} gives {id} another key or \
                         certificate than this node's",
                        chain.current().epoch.0
                    ),
                },
            ));
        }
        if chain.current().member(id).is_none() {
            tracing::info!(
                node = id.0,
                epoch = chain.current().epoch.0,
                "not a member of the newest configuration this node holds; fetching newer ones"
            );
        }
    }

    let committer = Arc::new(Committer::start(store.clone()));
    let shard_count = SHARDS.min(replicas.len()).max(1);
    let mut routes = HashMap::new();
    let mut per_shard: Vec<HashMap<ReplicaKey, Box<dyn Hosted>>> =
        (0..shard_count).map(|_| HashMap::new()).collect();
    for (index, (key, replica)) in replicas.into_iter().enumerate() {
        // Round-robin in a fixed order: groups of one service spread over every shard.
        let shard = index % shard_count;
        routes.insert(key, shard);
        per_shard[shard].insert(key, replica);
    }
    let mut shards = Vec::new();
    let mut stoppers = Vec::new();
    for (index, replicas) in per_shard.into_iter().enumerate() {
        let (handle, stopper) = shard::spawn(shard::ShardContext {
            index,
            replicas,
            committer: committer.clone(),
            peers: peers.clone(),
            started,
            rejections: rejections.clone(),
            clock: shard::Clock::Monotonic,
            tick: shard::TICK_INTERVAL,
            trusted: trusted.clone(),
        });
        shards.push(handle);
        stoppers.push(stopper);
    }
    let followers: Vec<(ReplicaKey, shard::ShardHandle)> = followers
        .into_iter()
        .filter_map(|key| Some((key, shards.get(*routes.get(&key)?)?.clone())))
        .collect();
    // Every epoch certified after the one each follower entered last, in order, before any
    // newer one the manager hands over.
    for ring in rings.after(rings.genesis().epoch()) {
        cs::hand_over(&followers, ring).await;
    }
    let (cs, manager) = match chain {
        Some(chain) => {
            tracing::info!(
                node = id.0,
                epoch = chain.current().epoch.0,
                "configuration chain verified"
            );
            let (events, events_received) = tokio::sync::mpsc::unbounded_channel();
            let shared = Arc::new(cs::Shared {
                node: id,
                secret: bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key),
                chain: std::sync::RwLock::new(chain),
                hosted: std::sync::atomic::AtomicU64::new(0),
                events,
            });
            // Its own shard, on the wall clock: a busy storage group does not delay agreement,
            // and epochs are measured in the time every node shares.
            let (handle, stopper) = shard::spawn(shard::ShardContext {
                index: shards.len(),
                replicas: HashMap::new(),
                committer: committer.clone(),
                peers: peers.clone(),
                started,
                rejections: rejections.clone(),
                clock: shard::Clock::Wall,
                // PBFT's deadlines (view changes, STATUS, the epoch's STOP) are checked on the
                // tick: finer than the storage shards' garbage collection needs.
                tick: std::time::Duration::from_millis(100),
                trusted: trusted.clone(),
            });
            stoppers.push(stopper);
            let settings = options
                .cluster
                .configuration_service
                .as_ref()
                .map_or((60_000, 5, 3), |cs| {
                    (cs.ping_cycle_ms, cs.evict_after, cs.agree_after)
                });
            let manager = cs::Manager {
                monitoring: bulwark_protocol::cs::monitor::MonitorParams {
                    cycle_ms: settings.0,
                    timeout_ms: (settings.0 / 2).clamp(1, 5_000),
                    n_evict: settings.1,
                    n_accept: settings.2,
                    signed_every: 20,
                },
                node: id,
                secret: bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key),
                store: store.clone(),
                shared: shared.clone(),
                directory: directory.clone(),
                shard: handle.clone(),
                rejections: rejections.clone(),
                followers,
            };
            let task = tokio::spawn(manager.run(events_received));
            (Some((shared, handle)), Some(task))
        }
        None => (None, None),
    };
    drop(committer);

    let inbound = directory.inbound.clone();
    let listener = bind_patiently(listen)
        .await
        .map_err(|source| NodeError::Listen {
            address: listen,
            source,
        })?;
    tracing::info!(node = id.0, %listen, "serving");
    let dispatcher = Arc::new(dispatch::Dispatcher {
        node: id.0,
        epoch: Epoch(options.cluster.epoch),
        cluster: Arc::new(options.cluster),
        routes,
        shards,
        rejections: rejections.clone(),
        started,
        cs,
        trusted,
        store: store.clone(),
    });
    {
        let dispatcher = dispatcher.clone();
        tokio::spawn(async move {
            while let Some(frame) = to_itself.recv().await {
                match bulwark_core::envelope::Envelope::decode(frame) {
                    Ok(envelope) => {
                        if !dispatcher.replica_message(id, envelope).await {
                            break;
                        }
                    }
                    Err(error) => tracing::error!(%error, "a frame to itself does not decode"),
                }
            }
        });
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            signal = &mut stop => {
                tracing::info!(node = id.0, signal, "stopping");
                break;
            }
        };
        let (tcp, address) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let inbound = inbound.clone();
        let connection = dispatch::Connection(dispatcher.clone());
        let rejections = rejections.clone();
        tokio::spawn(async move {
            match inbound.serve(tcp, connection).await {
                Ok(ended) => {
                    tracing::debug!(peer = %ended.peer, reason = ?ended.reason, "connection ended")
                }
                // A peer that hangs up mid-handshake (a CLI that got its quorum and exited) is
                // not misbehaving; one that fails TLS or is not in the configuration is.
                Err(bulwark_transport::InboundError::Handshake(
                    bulwark_transport::TransportError::Io(error),
                )) if bulwark_transport::is_disconnect(&error) => {
                    tracing::debug!(%address, %error, "handshake abandoned");
                }
                Err(error) => {
                    rejections.record(&address.to_string(), "unauthenticated");
                    tracing::debug!(%address, %error, "handshake refused");
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    drop(dispatcher);
    if let Some(manager) = manager {
        manager.abort();
    }
    for stopper in stoppers {
        stopper.stop().await;
    }
    drop(peers);
    // The committer's thread has ended, so this is the last handle: closing it now marks the
    // file clean, and the next start skips redb's full repair scan.
    let closed = tokio::task::spawn_blocking(move || drop(store)).await;
    if closed.is_err() {
        tracing::warn!(node = id.0, "closing the store failed");
    }
    tracing::info!(node = id.0, "stopped");
    Ok(())
}

/// A replica and the key the dispatcher routes it by.
type HostedReplica = (ReplicaKey, Box<dyn Hosted>);

/// The node's trusted log, when `cluster.toml` gives it one (`a2m_key`): reached at the socket
/// its `node.toml` names, and refused unless the component there has that key.
async fn trusted_log(options: &NodeOptions) -> Result<Option<trusted::TrustedLog>, NodeError> {
    let id = options.id();
    let key = options.cluster.node(id).and_then(|entry| entry.a2m_key);
    let invalid = |file: &str, field: &str, problem: String| {
        NodeError::Config(bulwark_core::config::ConfigError::Invalid {
            file: file.into(),
            field: field.into(),
            problem,
        })
    };
    let (key, socket) = match (key, options.secrets.a2m_socket.clone()) {
        (None, None) => return Ok(None),
        (Some(key), Some(socket)) => (key, socket),
        (Some(_), None) => {
            return Err(invalid(
                "node.toml",
                "a2m_socket",
                format!("cluster.toml gives {id} a trusted log (a2m_key); say where it serves"),
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "cluster.toml",
                "a2m_key",
                format!("node.toml names a trusted log's socket but cluster.toml no key for {id}"),
            ));
        }
    };
    let key = bulwark_core::sign::PublicKey::from_bytes(&key)
        .map_err(|error| invalid("cluster.toml", "a2m_key", error.to_string()))?;
    let log = tokio::task::spawn_blocking(move || trusted::TrustedLog::start(&socket, key))
        .await
        .map_err(|error| invalid("node.toml", "a2m_socket", error.to_string()))?
        .map_err(|problem| invalid("node.toml", "a2m_socket", problem))?;
    tracing::info!(node = id.0, key = %log.key(), "trusted log reached");
    Ok(Some(log))
}

/// Shard tasks per node: enough that one busy group does not hold up the others, few enough that
/// their group commits still fold many requests into one fsync.
const SHARDS: usize = 4;

/// The registered public key of every client that has one: what the node agrees MAC keys from
/// (PoWerStore writers' vectors, Half-Sym and Full-Sym tables).
fn client_keys(
    cluster: &ClusterConfig,
) -> impl Iterator<Item = (bulwark_core::ClientId, bulwark_core::sign::PublicKey)> + '_ {
    cluster.clients.iter().filter_map(|client| {
        let key = bulwark_core::sign::PublicKey::from_bytes(&client.signing_key?).ok()?;
        Some((bulwark_core::ClientId(client.id), key))
    })
}

/// This node's replicas of one group: one per service, restored from its namespace. An ABD
/// register lives on the first `2f+1` members of each group, so a node in a later slot hosts no
/// ABD replica of that group.
fn build_replicas(
    options: &NodeOptions,
    view: &GroupView,
    store: &Arc<Store>,
    verified: &Arc<Mutex<Verified>>,
    rejections: &Rejections,
    wrap: &Wrap,
    wall_at_zero_ms: u64,
) -> Result<Vec<HostedReplica>, NodeError> {
    let id = options.id();
    let Some(slot) = view.slot_of(id) else {
        return Ok(Vec::new());
    };
    let f = options.cluster.f;
    let epoch = Epoch(options.cluster.epoch);
    let group = view.id();
    let members = view.members().to_vec();
    let header = |service| Header::request(service, group, epoch, 0);
    let mut replicas: Vec<HostedReplica> = Vec::new();

    let namespace = Namespace::new(ServiceId::POWERSTORE, group);
    let mut config = ServerConfig::new(slot, f);
    config.epoch = epoch;
    config.group = group;
    // Registers stay on `cluster.toml`'s placement: each group lives once, from its epoch.
    config.incarnation = Incarnation::new(view.members(), epoch);
    config.grace_millis = options.grace_millis;
    config.cached_keys_max = options.cached_keys_max.max(1);
    let secret = bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key);
    let keys = ServerKeys::derived(&secret, client_keys(&options.cluster));
    let mut server = Server::new(config.clone(), keys.clone());
    let checks = host::EntryChecks {
        config: config.clone(),
        keys,
    };
    let restored = restore(store, namespace, &mut server, &checks, rejections)?;
    tracing::debug!(
        node = id.0,
        group = group.0,
        slot = slot.0,
        versions = restored.versions,
        dropped = restored.dropped,
        "powerstore replica restored"
    );
    replicas.push((
        (ServiceId::POWERSTORE, group),
        Box::new(host::Hosting {
            replica: (wrap.powerstore)(server),
            adapter: host::PowerStoreStorage {
                namespace,
                store: store.clone(),
                unsynced: HashMap::new(),
                pending: HashMap::new(),
                checks,
                verified: verified.clone(),
            },
            members: host::Members::Group(members.clone()),
            slot,
            header: header(ServiceId::POWERSTORE),
        }),
    ));

    if slot.index() < Protocol::Abd.nodes(f) {
        let namespace = Namespace::new(ServiceId::ABD, group);
        let mut server = abd::Server::new(slot, epoch, group);
        restore_register(store, namespace, rejections, |record, value| {
            let (key, entry) = decode_register::<abd::Entry>(record, value)?;
            if !server.restore(key, entry) {
                return Err("a stored version is malformed".into());
            }
            Ok(())
        })?;
        replicas.push((
            (ServiceId::ABD, group),
            Box::new(host::Hosting {
                replica: server,
                adapter: host::RegisterStorage { namespace },
                members: host::Members::Group(members[..Protocol::Abd.nodes(f)].to_vec()),
                slot,
                header: header(ServiceId::ABD),
            }),
        ));
    }

    let namespace = Namespace::new(ServiceId::PHALANX, group);
    let writers = phalanx::Writers::from_config(&options.cluster, "cluster.toml")?;
    let table_writers: table::Writers = writers.keys().collect();
    let mut server = phalanx::Server::new(slot, epoch, group, Arc::new(writers));
    restore_register(store, namespace, rejections, |record, value| {
        let (key, entry) = decode_register::<phalanx::Entry>(record, value)?;
        if !server.restore(key, entry) {
            return Err("a stored version's signature does not verify".into());
        }
        Ok(())
    })?;
    replicas.push((
        (ServiceId::PHALANX, group),
        Box::new(host::Hosting {
            replica: server,
            adapter: host::RegisterStorage { namespace },
            members: host::Members::Group(members.clone()),
            slot,
            header: header(ServiceId::PHALANX),
        }),
    ));

    let namespace = Namespace::new(ServiceId::TABLE, group);
    let place = table::Place {
        slot,
        n: members.len(),
        f,
        epoch,
        group,
    };
    let keys = options.cluster.signing_keys(&members).map_err(|problem| {
        NodeError::Config(bulwark_core::config::ConfigError::Invalid {
            file: "cluster.toml".into(),
            field: "nodes".into(),
            problem,
        })
    })?;
    // Every client with a registered key shares MAC keys with this node (Half-Sym, Full-Sym).
    let pairs = Arc::new(table::replica_pair_keys(
        &secret,
        client_keys(&options.cluster),
    ));
    let mut server = table::Server::new(
        place,
        secret,
        keys,
        Arc::new(table_writers),
        table::Catalog::default(),
        table::Settings {
            wall_at_zero_millis: wall_at_zero_ms,
            unprotected_tables: options.unprotected_tables,
            ..table::Settings::default()
        },
    )
    .with_pair_keys(pairs);
    if let Some(authority) = options.cluster.authority() {
        server = server.with_authority(authority);
    }
    restore_records(
        store,
        namespace,
        host::TABLE_REVOKED,
        rejections,
        |_, value| {
            let revocation = bulwark_core::wire::decode(value, 1024)
                .map_err(|error| format!("a stored revocation does not decode: {error}"))?;
            server.restore_revocation(revocation);
            Ok(())
        },
    )?;
    restore_records(
        store,
        namespace,
        host::TABLE_SCHEMAS,
        rejections,
        |_, value| {
            let schema = table::Schema::decode_stored(value)
                .map_err(|error| format!("a stored schema does not decode: {error}"))?;
            server.restore_schema(schema);
            Ok(())
        },
    )?;
    restore_records(
        store,
        namespace,
        host::TABLE_CELLS,
        rejections,
        |_, value| {
            let cell: table::SignedCell =
                bulwark_core::wire::decode(value, bulwark_core::wire::FRAME_BYTES_MAX)
                    .map_err(|error| format!("a stored cell does not decode: {error}"))?;
            server.restore(cell);
            Ok(())
        },
    )?;
    replicas.push((
        (ServiceId::TABLE, group),
        Box::new(host::Hosting {
            replica: (wrap.table)(server),
            adapter: host::TableStorage { namespace },
            members: host::Members::Group(members),
            slot,
            header: header(ServiceId::TABLE),
        }),
    ));
    Ok(replicas)
}

/// How long a node waits for a port still taken when it starts: a node restarted at once may
/// find its previous process not yet gone, or another program's short-lived probe on the port.
const BIND_PATIENCE: Duration = Duration::from_secs(5);

/// Binds `address`, waiting up to [`BIND_PATIENCE`] while it is in use.
async fn bind_patiently(address: SocketAddr) -> std::io::Result<TcpListener> {
    let started = Instant::now();
    let mut warned = false;
    loop {
        match TcpListener::bind(address).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && started.elapsed() < BIND_PATIENCE =>
            {
                if !warned {
                    tracing::warn!(%address, "address in use; waiting for it to be free");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// Opens the store in `data_dir`, saying what to do about a store this release cannot open.
fn open_store(data_dir: &Path) -> Result<Store, NodeError> {
    Store::open(data_dir).map_err(|error| match error {
        StorageError::InUse => NodeError::StoreInUse {
            path: data_dir.to_path_buf(),
        },
        StorageError::Format { .. } => NodeError::StoreFormat {
            path: data_dir.to_path_buf(),
            reason: error,
        },
        error => NodeError::OpenStore {
            path: data_dir.to_path_buf(),
            reason: error.to_string(),
        },
    })
}

/// Resolves on SIGTERM or SIGINT, naming it; never when no handler can be installed.
pub async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut terminate), Ok(mut interrupt)) => tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            },
            _ => {
                tracing::warn!("cannot handle SIGTERM/SIGINT; stop this node by killing it");
                std::future::pending().await
            }
        }
    }
    #[cfg(not(unix))]
    {
        match tokio::signal::ctrl_c().await {
            Ok(()) => "Ctrl-C",
            Err(_) => std::future::pending().await,
        }
    }
}

/// Replays a baseline's stored versions (table `register` of `namespace`) through `adopt`, which
/// refuses a record that does not decode or a version no correct server would have stored.
/// Returns how many were restored. A refused record is logged, counted as rejected from `disk`
/// and deleted before the node serves: the node then lacks that version, as a node that missed
/// the write does. Losing an acknowledged version makes this node one of the `f` faulty ones its
/// group tolerates, where stopping it would have made it one just the same, and unavailable for
/// every other key.
fn restore_register(
    store: &Store,
    namespace: Namespace,
    rejections: &Rejections,
    adopt: impl FnMut(&[u8], &[u8]) -> Result<(), String>,
) -> Result<usize, NodeError> {
    restore_records(store, namespace, host::REGISTER, rejections, adopt)
}

/// Hands every record of `namespace`'s table `name` to `adopt`; a record it refuses is dropped
/// from the store, logged and counted, as if it had never been stored.
fn restore_records(
    store: &Store,
    namespace: Namespace,
    name: &'static str,
    rejections: &Rejections,
    mut adopt: impl FnMut(&[u8], &[u8]) -> Result<(), String>,
) -> Result<usize, NodeError> {
    let table = namespace.table(name);
    let mut restored = 0;
    let mut dropped = Vec::new();
    for (record, value) in store.load(table)? {
        match adopt(&record, &value) {
            Ok(()) => restored += 1,
            Err(problem) => {
                tracing::error!(
                    service = namespace.service.0,
                    group = namespace.group.0,
                    %problem,
                    "stored version refused; dropped as if never stored"
                );
                rejections.add(
                    "disk",
                    &format!("stored version dropped at start-up: {problem}"),
                    1,
                );
                dropped.push(bulwark_storage::StorageOp::Delete { table, key: record });
            }
        }
    }
    metrics::counter!("bulwark_node_corrupt_entries_dropped_total").increment(dropped.len() as u64);
    if !dropped.is_empty() {
        store.apply(&dropped)?;
    }
    Ok(restored)
}

/// Decodes one `register` record `(key, entry)` and checks it is filed under its key.
pub(crate) fn decode_register<E: bulwark_core::wire::DeserializeOwned>(
    record: &[u8],
    value: &[u8],
) -> Result<(bulwark_core::Key, E), String> {
    let (key, entry): (bulwark_core::Key, E) =
        bulwark_core::wire::decode(value, usize::MAX).map_err(|e| e.to_string())?;
    if record != key.as_bytes() {
        return Err("record id does not match its key".into());
    }
    Ok((key, entry))
}

/// What start-up restored.
struct Restored {
    /// `Hist` entries now served.
    versions: usize,
    /// `Hist` and `lc` records that did not decode or failed verification, deleted.
    dropped: u64,
}

/// Replays the durable state of `namespace` into `server`, one key at a time: the server counts
/// every key and keeps only a bounded cache of them, so a store far larger than memory restores.
/// A `Hist` entry that fails verification (bytes flipped on disk) is logged, counted as rejected
/// from `disk`, and deleted before the node serves, as if it had never been stored: a node may
/// always lack a version (it may have missed the STORE), but it must never serve a fragment it
/// did not accept. A record that does not even decode goes the same way, and so does an `lc`
/// that does not: the node then knows an older completed write, as one that missed a COMPLETE
/// does.
fn restore(
    store: &Store,
    namespace: Namespace,
    server: &mut Server,
    checks: &host::EntryChecks,
    rejections: &Rejections,
) -> Result<Restored, NodeError> {
    use bulwark_core::Key;
    use bulwark_protocol::powerstore::{Candidate, EntryMeta, StoredKey};
    let mut versions = 0;
    let mut dropped: Vec<bulwark_storage::StorageOp> = Vec::new();
    let mut reasons: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let hist = namespace.table(host::HIST);
    let lc_table = namespace.table(host::LC);
    let mut drop = |table, record: &[u8], problem: &'static str| {
        *reasons.entry(problem).or_insert(0) += 1;
        dropped.push(bulwark_storage::StorageOp::Delete {
            table,
            key: record.to_vec(),
        });
    };
    // The `lc` of `key`, or `None` (and dropped) when its record does not decode as `key`'s.
    let read_lc = |key: &Key, drop: &mut dyn FnMut(bulwark_storage::Table, &[u8], &'static str)| {
        let value = store.get(lc_table, key.as_bytes())?;
        Ok::<_, NodeError>(value.and_then(|value| {
            match bulwark_core::wire::decode::<(Key, Candidate)>(&value, usize::MAX) {
                Ok((stored, candidate)) if stored == *key => Some(candidate),
                _ => {
                    tracing::error!(%key, "stored lc does not decode as its key's; dropped");
                    drop(lc_table, key.as_bytes(), "lc record does not decode");
                    None
                }
            }
        }))
    };
    // Records of one key are adjacent: the record id is the length-prefixed key, then the ts.
    let mut current: Option<(Key, Vec<EntryMeta>)> = None;
    let mut flush = |current: &mut Option<(Key, Vec<EntryMeta>)>,
                     drop: &mut dyn FnMut(bulwark_storage::Table, &[u8], &'static str)|
     -> Result<(), NodeError> {
        if let Some((key, hist)) = current.take() {
            let lc = read_lc(&key, drop)?;
            server.restore_key(key, StoredKey { lc, hist }, Time(0));
        }
        Ok(())
    };
    let mut failed: Option<NodeError> = None;
    store.scan(hist, |record, value| {
        let named = host::hist_record_key(record);
        if let Some(key) = &named
            && current.as_ref().is_none_or(|(k, _)| k != key)
        {
            if let Err(error) = flush(&mut current, &mut drop) {
                failed.get_or_insert(error);
            }
            current = Some((key.clone(), Vec::new()));
        }
        let entry = match bulwark_core::wire::decode::<(Key, StoredEntry)>(value, usize::MAX) {
            Ok((_, entry)) => entry,
            Err(error) => {
                tracing::error!(%error, bytes = value.len(), "stored entry does not decode; dropped");
                drop(hist, record, "record does not decode");
                return Ok(());
            }
        };
        let Some(key) = named else {
            tracing::error!(bytes = record.len(), "stored entry id names no key; dropped");
            drop(hist, record, "record id does not match its entry");
            return Ok(());
        };
        if let Some(problem) = checks.problem(record, &key, &entry, true) {
            tracing::error!(
                %key,
                ts = entry.ts.num,
                problem,
                "stored entry failed verification; dropped as if never stored"
            );
            drop(hist, record, problem);
            return Ok(());
        }
        if let Some((_, metas)) = current.as_mut() {
            metas.push(EntryMeta::from(&entry));
        }
        versions += 1;
        Ok(())
    })?;
    if let Some(error) = failed {
        return Err(error);
    }
    flush(&mut current, &mut drop)?;
    // Keys with an `lc` and no entry at all (a reader's write-back reached this node, the
    // version did not): every key with entries was restored above.
    let mut failed: Option<NodeError> = None;
    store.scan(lc_table, |record, _| {
        let mut has_entries = false;
        store.scan_prefix(hist, &host::hist_prefix_of(record), |_, _| {
            has_entries = true;
            Ok(())
        })?;
        if has_entries {
            return Ok(());
        }
        let Ok(key) = Key::new(bytes::Bytes::copy_from_slice(record)) else {
            drop(lc_table, record, "lc record does not decode");
            return Ok(());
        };
        match read_lc(&key, &mut drop) {
            Ok(Some(lc)) => server.restore_key(
                key,
                StoredKey {
                    lc: Some(lc),
                    hist: Vec::new(),
                },
                Time(0),
            ),
            Ok(None) => {}
            Err(error) => {
                failed.get_or_insert(error);
            }
        }
        Ok(())
    })?;
    if let Some(error) = failed {
        return Err(error);
    }
    let count = dropped.len() as u64;
    metrics::counter!("bulwark_node_corrupt_entries_dropped_total").increment(count);
    if count > 0 {
        store.apply(&dropped)?;
        for (problem, n) in reasons {
            rejections.add(
                "disk",
                &format!("stored entry dropped at start-up: {problem}"),
                n,
            );
        }
    }
    Ok(Restored {
        versions,
        dropped: count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::erasure::Layout;
    use bulwark_core::{ClientId, Digest, GroupId, Key, MacKey};
    use bulwark_protocol::powerstore::{CrossChecksum, MacVec, Pid, Timestamp};
    use bulwark_storage::{StorageOp, Table};
    use bytes::Bytes;

    const POWERSTORE: Namespace = Namespace::new(ServiceId::POWERSTORE, GroupId(0));
    const HIST: Table = POWERSTORE.table(host::HIST);

    /// A `Hist` entry exactly as node 1 of 4 accepts it, for a replicated value.
    fn entry(key: &Key, value: &[u8], num: u64, keys: &[MacKey]) -> StoredEntry {
        let writer_key = MacKey([9; 32]);
        let pid = Pid {
            writer: ClientId(0),
            seq: num,
        };
        let ts = Timestamp::authenticated(key, num, pid, &writer_key);
        let layout = Layout::for_value(value.len(), 4, 1);
        let nonce_hash = Digest::of("test nonce", &num.to_be_bytes());
        StoredEntry {
            ts,
            fragment: Bytes::copy_from_slice(value),
            cc: CrossChecksum {
                layout,
                tombstone: false,
                hashes: vec![bulwark_protocol::powerstore::fragment_digest(value); 4],
            },
            nonce_hash,
            vec: MacVec::compute(
                &ServerConfig::new(bulwark_core::Slot(1), 1).incarnation,
                key,
                &ts,
                &nonce_hash,
                keys,
            ),
        }
    }

    fn put(key: &Key, entry: &StoredEntry) -> StorageOp {
        StorageOp::Put {
            table: HIST,
            key: host::hist_record(key, &entry.ts),
            value: Bytes::from(bulwark_core::wire::encode(&(key, entry))),
        }
    }

    #[test]
    fn entries_damaged_on_disk_are_dropped_counted_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<MacKey> = (0..4).map(|i| MacKey([i; 32])).collect();
        let config = ServerConfig::new(bulwark_core::Slot(1), 1);
        let key = Key::new(b"k".to_vec()).unwrap();
        let mut flipped = entry(&key, b"a value whose bytes rot away", 2, &keys);
        let mut rotten = flipped.fragment.to_vec();
        rotten[3] ^= 0x40;
        flipped.fragment = Bytes::from(rotten);
        let mut forged = entry(&key, b"a value with a bad MAC slot", 3, &keys);
        forged.vec.0[1].0[0] ^= 1;
        // An intact entry filed under another version's record id.
        let misfiled = entry(&key, b"a value under the wrong record", 4, &keys);
        let elsewhere = entry(&key, b"x", 1, &keys).ts;
        let misfiled = StorageOp::Put {
            table: HIST,
            key: host::hist_record(&key, &elsewhere),
            value: Bytes::from(bulwark_core::wire::encode(&(&key, &misfiled))),
        };
        let other = Key::new(b"other".to_vec()).unwrap();
        let good = entry(&other, b"a value that stays intact", 1, &keys);
        let store = Store::open(dir.path()).unwrap();
        let lc = POWERSTORE.table(host::LC);
        store
            .apply(&[
                put(&key, &flipped),
                put(&key, &forged),
                misfiled,
                put(&other, &good),
                // Bytes that decode to nothing, in `hist` and in `lc`.
                StorageOp::Put {
                    table: HIST,
                    key: b"rotten".to_vec(),
                    value: Bytes::from_static(&[0xff; 9]),
                },
                StorageOp::Put {
                    table: lc,
                    key: b"rotten".to_vec(),
                    value: Bytes::from_static(&[0xff; 9]),
                },
            ])
            .unwrap();

        let rejections = Rejections::default();
        // Node 1's key with writer 0 is `keys[1]`.
        let node_keys = ServerKeys::from_keys([(ClientId(0), keys[1].clone())]);
        let mut server = Server::new(config.clone(), node_keys.clone());
        let checks = host::EntryChecks {
            config: config.clone(),
            keys: node_keys.clone(),
        };
        let restored = restore(&store, POWERSTORE, &mut server, &checks, &rejections).unwrap();
        assert_eq!(restored.versions, 1, "only the intact entry is served");
        assert_eq!(restored.dropped, 5);
        assert_eq!(server.versions(&other), 1);
        assert_eq!(server.versions(&key), 0);
        assert_eq!(
            store.count(HIST).unwrap(),
            1,
            "dropped entries are deleted, not kept to be dropped again"
        );
        let disk: Vec<_> = rejections
            .snapshot()
            .into_iter()
            .filter(|r| r.peer == "disk")
            .collect();
        assert_eq!(disk.iter().map(|r| r.count).sum::<u64>(), 5, "{disk:?}");
        assert_eq!(store.count(lc).unwrap(), 0);
        for problem in [
            "cross-checksum",
            "MAC vector",
            "record id",
            "record does not decode",
            "lc record",
        ] {
            assert!(
                disk.iter().any(|r| r.reason.contains(problem)),
                "{problem}: {disk:?}"
            );
        }

        // The next start finds nothing more to drop.
        let again = Rejections::default();
        let mut server = Server::new(config.clone(), node_keys);
        let restored = restore(&store, POWERSTORE, &mut server, &checks, &again).unwrap();
        assert_eq!((restored.versions, restored.dropped), (1, 0));
        assert!(again.snapshot().is_empty());
    }

    #[test]
    fn a_store_that_cannot_be_opened_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.redb"), vec![0x5a; 8192]).unwrap();
        let error = open_store(dir.path())
            .err()
            .expect("garbage is not a store");
        let text = error.to_string();
        assert!(text.contains("cannot open the store in"), "{text}");
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(
            text.contains("restore the data directory from a copy"),
            "{text}"
        );
    }

    /// `testdata/format1-state.redb` is what the release before storage format versions wrote:
    /// `Store::open` and `apply` of commit ab8a8dc, with one `register` and one `hist` record.
    #[test]
    fn a_store_of_the_older_format_stops_the_start_saying_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("state.redb"),
            include_bytes!("../testdata/format1-state.redb"),
        )
        .unwrap();
        let error = open_store(dir.path())
            .err()
            .expect("a store of the older format opened");
        assert!(matches!(error, NodeError::StoreFormat { .. }), "{error:?}");
        let text = error.to_string();
        for needed in [
            "cannot open the store in",
            &dir.path().display().to_string(),
            "older Bulwark storage format",
            "format 1",
            "format 3",
            "empty data directory",
        ] {
            assert!(text.contains(needed), "{needed:?} missing: {text}");
        }
        assert!(
            !text.contains("from a copy"),
            "a copy of an old store is just as old: {text}"
        );
    }

    #[test]
    fn baseline_versions_survive_a_restart_and_a_misfiled_or_undecodable_one_is_dropped() {
        use bulwark_protocol::abd;
        let abd = Namespace::new(ServiceId::ABD, GroupId(0));
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let key = Key::new(b"k".to_vec()).unwrap();
        let entry = abd::Entry {
            ts: abd::Timestamp {
                num: 3,
                writer: ClientId(0),
                seq: 9,
            },
            value: Some(Bytes::from("v")),
        };
        store
            .apply(&[StorageOp::Put {
                table: abd.table(host::REGISTER),
                key: key.as_bytes().to_vec(),
                value: Bytes::from(bulwark_core::wire::encode(&(&key, &entry))),
            }])
            .unwrap();
        let rejections = Rejections::default();
        let load = |store: &Store| {
            let mut server =
                abd::Server::new(bulwark_core::Slot(0), bulwark_core::Epoch(0), GroupId(0));
            restore_register(store, abd, &rejections, |record, value| {
                let (key, entry) = decode_register::<abd::Entry>(record, value)?;
                server.restore(key, entry);
                Ok(())
            })
            .map(|count| (count, server))
        };
        let (count, server) = load(&store).unwrap();
        assert_eq!(count, 1);
        assert_eq!(server.stored(&key), Some(&entry));

        // A version filed under another key, and bytes that decode to nothing: each is dropped
        // (the node lacks that version, as one that missed the write does), counted, deleted.
        let other = Key::new(b"other".to_vec()).unwrap();
        store
            .apply(&[
                StorageOp::Put {
                    table: abd.table(host::REGISTER),
                    key: other.as_bytes().to_vec(),
                    value: Bytes::from(bulwark_core::wire::encode(&(&key, &entry))),
                },
                StorageOp::Put {
                    table: abd.table(host::REGISTER),
                    key: b"rotten".to_vec(),
                    value: Bytes::from_static(&[0xff; 7]),
                },
            ])
            .unwrap();
        let (count, server) = load(&store).expect("damaged versions do not stop the start");
        assert_eq!(count, 1);
        assert_eq!(server.stored(&key), Some(&entry));
        assert_eq!(server.stored(&other), None);
        assert_eq!(store.count(abd.table(host::REGISTER)).unwrap(), 1);
        let disk: u64 = rejections
            .snapshot()
            .into_iter()
            .filter(|r| r.peer == "disk")
            .map(|r| r.count)
            .sum();
        assert_eq!(disk, 2);
    }
}
