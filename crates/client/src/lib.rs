//! The Bulwark client library: the trusted side of the system.
//!
//! A [`Client`] keeps one authenticated link per node (re-established in the background when it
//! drops) and drives one protocol operation per request through ONE generic driver
//! ([`Client::drive`]) over the protocols' common contract (`bulwark_protocol::machine`): it
//! places the key on its replica group, sends each round in envelopes the nodes route by
//! `(service, group, epoch)`, feeds replies back, retransmits to replicas that have not answered,
//! and gives up at the deadline with an error that names the nodes it could not reach. Safety
//! never depends on these timings; they only decide when to retry and when to stop waiting.
//!
//! A cluster serves every register protocol at once; a [`Volume`] names one. Objects written
//! without a volume go to the default volume, whose protocol `cluster.toml` names.

pub mod causal;
mod configuration;
mod content;
pub mod evidence;
mod pubkey;
mod single_server;
pub mod table;
mod volumes;

pub use configuration::{ConfigAction, ConfigOutcome, KNOWN_FILE};

pub use bulwark_protocol::content::ContentId;
pub use volumes::{Serving, VOLUME_NAME_BYTES_MAX, Volume};

use bulwark_core::config::{ClientSecrets, ClusterConfig, Protocol, parse_secrets};
use bulwark_core::envelope::{self, Header, Kind, Refusal as EnvelopeRefusal};
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::evidence::{Evidence, EvidenceKind};
use bulwark_core::membership::{GroupView, Incarnation, Placement};
use bulwark_core::wire::FRAME_BYTES_MAX;
use bulwark_core::{ClientId, Epoch, Key, MacKey, NodeId, OBJECT_BYTES_MAX, ServiceId, Slot};
use bulwark_protocol::machine::{OpError, Operation, Progress};
use bulwark_protocol::powerstore::{self, OpId, Pid, WriterKeys};
use bulwark_protocol::service::{NodeStatus, SystemReply, SystemRequest};
use bulwark_protocol::{a2m_storage, abd, phalanx};
use bulwark_transport::{Link, Router};
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long an operation keeps trying by default.
pub const DEADLINE_DEFAULT: Duration = Duration::from_secs(30);

/// Keys of single-writer volumes whose clock a client keeps.
const CLOCKS_MAX: usize = 1 << 16;
/// How long to wait for an answer before resending a round to the replicas that have not
/// answered. Links queue frames while a node is unreachable, so this only covers frames lost
/// with a connection.
const RETRANSMIT_AFTER: Duration = Duration::from_millis(1000);
/// How long a node that left an operation unanswered is asked last ([`Client::mark_silent`]).
const SILENT_FOR: Duration = Duration::from_secs(5);

/// What went wrong with an operation.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A configuration or secrets file is wrong.
    #[error(transparent)]
    Config(#[from] bulwark_core::config::ConfigError),
    /// A file could not be read.
    #[error("{path}: {error}")]
    File {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// TLS set-up failed.
    #[error("transport: {0}")]
    Transport(bulwark_transport::TransportError),
    /// The key is not a valid key.
    #[error("invalid key: {0}")]
    Key(bulwark_core::ids::KeyError),
    /// The object exceeds the register's size limit; nothing was sent.
    #[error("object is {len} bytes; the limit is {max} bytes")]
    TooLarge {
        /// Offered size.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// This client may not write (or holds no keys for this volume's protocol).
    #[error("client {name:?} is not a writer in this cluster")]
    NotWriter {
        /// The client's name.
        name: String,
    },
    /// Enough replicas refused that at least one correct one did.
    #[error("refused by nodes {nodes:?}: {refusal}")]
    Refused {
        /// Why.
        refusal: String,
        /// Who.
        nodes: Vec<NodeId>,
    },
    /// No quorum answered before the deadline, or one did and its answers could not complete
    /// the operation.
    #[error("{}", unavailable(*deadline, *answered, *quorum, *n, unreachable, stalled.as_deref()))]
    Unavailable {
        /// The deadline.
        deadline: Duration,
        /// Nodes that answered the last round.
        answered: usize,
        /// The quorum needed.
        quorum: usize,
        /// Group size.
        n: usize,
        /// Nodes that did not answer, with their addresses.
        unreachable: Vec<(NodeId, SocketAddr)>,
        /// Why a quorum's answers could not complete the operation, if one answered.
        stalled: Option<String>,
    },
    /// No such volume, or a volume record that does not parse.
    #[error("volume {name:?}: {problem}")]
    Volume {
        /// The volume.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The protocol failed in a way that indicates a bug.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The server of a single-server volume answered what its trusted log's attestations
    /// contradict (a fork, a rollback, a forged object): nothing it said is believed. Recorded
    /// in the evidence log.
    #[error("{node} misbehaved: {detail}")]
    Misbehaved {
        /// The server.
        node: NodeId,
        /// What it did.
        detail: String,
    },
    /// The configuration service has not confirmed this client's configuration for longer than
    /// the cluster allows: serving on may mean trusting groups whose fault bound no longer holds
    /// (Rosebud §3.8).
    #[error("stopped: the configuration could not be confirmed as current for {} s: {reason}", since.as_secs())]
    Stale {
        /// How long since the last confirmation (or since the first attempt).
        since: Duration,
        /// What the last attempt found.
        reason: String,
    },
}

fn unavailable(
    deadline: Duration,
    answered: usize,
    quorum: usize,
    n: usize,
    unreachable: &[(NodeId, SocketAddr)],
    stalled: Option<&str>,
) -> String {
    let mut text = match stalled {
        Some(why) => format!(
            "no result within {deadline:?}: {answered} of {n} nodes answered (quorum {quorum}), \
             but {why}"
        ),
        None => format!(
            "no quorum within {deadline:?}: {answered} of {n} nodes answered (quorum {quorum})"
        ),
    };
    if !unreachable.is_empty() {
        text.push_str(&format!("; no answer from {}", describe(unreachable)));
    }
    text
}

fn describe(nodes: &[(NodeId, SocketAddr)]) -> String {
    nodes
        .iter()
        .map(|(id, address)| format!("{id} ({address})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an operation learned besides its result.
#[derive(Clone, Debug, Default)]
pub struct OpReport {
    /// Nodes whose answers completed the final round.
    pub answered: Vec<NodeId>,
    /// Group size.
    pub n: usize,
    /// Misbehaviour observed, with the node to blame.
    pub evidence: Vec<Evidence>,
    /// Read restarts caused by garbage-collected versions.
    pub restarts: u32,
    /// Whether a read repaired (PoWerStore REPAIR, or a baseline's write-back).
    pub repaired: bool,
}

/// A PoWerStore writer's MAC keys: `k_W`, and the key it shares with each node, agreed from its
/// signing key and the node's as first needed.
struct WriterMacs {
    timestamp: MacKey,
    secret: Arc<phalanx::SigningKey>,
    shared: Mutex<HashMap<NodeId, MacKey>>,
}

/// A connected client.
pub struct Client {
    cluster: Arc<ClusterConfig>,
    placement: Arc<Placement>,
    name: String,
    id: ClientId,
    may_write: bool,
    /// A writer's signing key (Phalanx volumes).
    signing: Option<Arc<phalanx::SigningKey>>,
    /// A writer's MAC keys (PoWerStore volumes).
    macs: Option<WriterMacs>,
    /// The writers' public keys (Phalanx volumes).
    writers: Arc<phalanx::Writers>,
    /// One link per node: `cluster.toml`'s from the start, and each member of a configuration
    /// verified since, from the moment it is verified.
    links: std::sync::RwLock<HashMap<NodeId, Arc<Link>>>,
    connector: Arc<bulwark_transport::Connector>,
    router: Router,
    next_op: AtomicU64,
    /// The last timestamp this client stamped a table cell with, in microseconds.
    last_stamp: AtomicU64,
    /// Nodes that left an operation unanswered or unhelped (a table proxy, a node asked for a
    /// register's fragment), and until when they are asked last ([`Client::mark_silent`]).
    silent_until: Mutex<HashMap<NodeId, std::time::Instant>>,
    /// How long this client's table writes, reads and scan pages usually take through each
    /// member as proxy, in microseconds (a moving average; `table::Kind` indexes it).
    table_latency: Mutex<HashMap<NodeId, [Option<f64>; 3]>>,
    /// Tables' schemas as `f+1` members described them, by name.
    table_schemas: Mutex<HashMap<String, bulwark_protocol::table::Schema>>,
    /// The MAC keys this client shares with each node it used a table through.
    table_pairs: Mutex<HashMap<NodeId, bulwark_protocol::table::PairKeys>>,
    session: u64,
    codec: Arc<dyn ErasureCodec>,
    volumes: Mutex<HashMap<String, Volume>>,
    /// The clock of each register this client alone writes, from its own last write there (at
    /// most [`CLOCKS_MAX`] keys).
    clocks: Mutex<HashMap<Key, u64>>,
    /// The newest state this client saw of each single-server volume (server, number): a
    /// server that later shows it an older one rolled back (A2M-Storage's timestamps).
    seen: Mutex<HashMap<(NodeId, u32), a2m_storage::Timestamp>>,
    /// Where `seen` is kept between runs ([`single_server::SEEN_FILE`]), when the client has a
    /// directory of its own.
    seen_file: Option<PathBuf>,
    evidence_log: Option<PathBuf>,
    /// Where the client keeps its logs of causal volumes, when it has a directory.
    depot_dir: Option<PathBuf>,
    /// Its part in the causal volumes it used.
    causal_local: Mutex<causal::Local>,
    /// One causal operation at a time: each changes the client's log.
    causal_turn: tokio::sync::Mutex<()>,
    /// Member clients serving their logs of causal volumes (`bulwark volume serve`), by name:
    /// where a read asks the writer for a value no server gave (Depot §5.7).
    causal_peers: Mutex<HashMap<String, std::net::SocketAddr>>,
    /// Where the newest configuration this client verified is kept between runs
    /// ([`configuration`]'s cache), when it has a directory of its own.
    known_file: Option<PathBuf>,
    /// The trusted authority's key seed: the administrator's, to order ADD and REVOKE.
    authority: Option<[u8; 32]>,
    /// When the configuration service last confirmed this client's configuration as current,
    /// and that configuration's epoch.
    confirmed: Mutex<Option<(std::time::Instant, Epoch)>>,
    /// The newest configuration verified, and where each epoch up to it placed keys, once
    /// fetched ([`Client::configuration`], [`Client::rings`]).
    known: Mutex<
        Option<(
            bulwark_core::configuration::Configuration,
            Arc<bulwark_core::membership::Chain>,
        )>,
    >,
    /// Whether M-PoWerStore reads may end after their first round when the replies agree
    /// (`powerstore::ClientConfig::one_round`). On by default; off reads as the paper does, for
    /// comparisons.
    pub one_round_reads: bool,
    /// How long an operation keeps trying.
    pub deadline: Duration,
    /// How long a round waits for answers before it is sent again to the replicas that have
    /// not answered; a table operation moves to its next proxy then. Shorter passes over a
    /// stalling proxy sooner, and gives up on slow correct ones under load (spec `cassandra.md`
    /// §4.5).
    pub retransmit_after: Duration,
    /// Who resolves a table read whose replicas disagree: the proxy (the default), or this
    /// client, which then has the proxy write its resolution back (spec `cassandra.md` §2.9),
    /// so no proxy verifies a writer's signature for it.
    pub table_resolver: bulwark_protocol::table::Resolver,
}

// By hand rather than `#[from]`: a `#[from]` source would print its message twice in an error
// chain (`transport: x: x`).
impl From<bulwark_transport::TransportError> for ClientError {
    fn from(error: bulwark_transport::TransportError) -> Self {
        ClientError::Transport(error)
    }
}

impl From<bulwark_core::ids::KeyError> for ClientError {
    fn from(error: bulwark_core::ids::KeyError) -> Self {
        ClientError::Key(error)
    }
}

fn read(path: &Path) -> Result<String, ClientError> {
    std::fs::read_to_string(path).map_err(|error| ClientError::File {
        path: path.to_path_buf(),
        error,
    })
}

fn invalid(file: &str, field: &str, problem: String) -> ClientError {
    bulwark_core::config::ConfigError::Invalid {
        file: file.into(),
        field: field.into(),
        problem,
    }
    .into()
}

impl Client {
    /// Connects as client `name` using the files `bulwark cluster init` wrote into `cluster_dir`.
    /// Misbehaviour it observes is appended to the cluster's evidence log ([`evidence`]).
    pub async fn connect(cluster_dir: &Path, name: &str) -> Result<Client, ClientError> {
        let cluster_file = cluster_dir.join("cluster.toml");
        let cluster =
            ClusterConfig::parse(&read(&cluster_file)?, &cluster_file.display().to_string())?;
        let dir = cluster_dir.join(format!("client-{name}"));
        let secrets_file = dir.join("client.toml");
        let secrets: ClientSecrets =
            parse_secrets(&read(&secrets_file)?, &secrets_file.display().to_string())?;
        let identity = bulwark_transport::Identity::from_pem(
            &read(&dir.join("tls.crt"))?,
            &read(&dir.join("tls.key"))?,
        )?;
        let mut client = Client::new(cluster, secrets, identity).await?;
        client.evidence_log = Some(cluster_dir.join(evidence::LOG_FILE));
        client.known_file = Some(dir.join(configuration::KNOWN_FILE));
        client.seen_file = Some(dir.join(single_server::SEEN_FILE));
        client.depot_dir = Some(causal::store_dir(&dir));
        Ok(client)
    }

    /// Connects with explicit configuration and secrets.
    pub async fn new(
        cluster: ClusterConfig,
        secrets: ClientSecrets,
        identity: bulwark_transport::Identity,
    ) -> Result<Client, ClientError> {
        let Some((id, entry)) = cluster.client(&secrets.name) else {
            return Err(invalid(
                "cluster.toml",
                "clients",
                format!("no client named {:?}", secrets.name),
            ));
        };
        let may_write = entry.write;
        let registered = entry.signing_key;
        let signing = match secrets.signing_key {
            Some(secret) if registered == Some(phalanx::public_key(&secret)) => {
                Some(Arc::new(phalanx::signing_key(&secret)))
            }
            Some(_) => {
                return Err(invalid(
                    "client.toml",
                    "signing_key",
                    "does not match this client's public key in cluster.toml".into(),
                ));
            }
            None => None,
        };
        let macs = match (secrets.writer, &signing) {
            (Some(w), Some(secret)) => Some(WriterMacs {
                timestamp: w.timestamp_key,
                secret: secret.clone(),
                shared: Mutex::new(HashMap::new()),
            }),
            // The MAC key with each node is agreed from the signing key: without one the client
            // cannot write PoWerStore registers, and says so when asked to.
            (_, None) | (None, _) => None,
        };
        let placement = cluster.placement()?;
        let writers = phalanx::Writers::from_config(&cluster, "cluster.toml")?;
        let connector = Arc::new(bulwark_transport::Connector::new(&identity)?);
        let router = Router::new();
        let links = bulwark_transport::links_to(&cluster.nodes, &connector, &router)
            .into_iter()
            .map(|(node, link)| (node, Arc::new(link)))
            .collect();
        Ok(Client {
            cluster: Arc::new(cluster),
            placement: Arc::new(placement),
            name: secrets.name,
            id,
            may_write,
            signing,
            macs,
            writers: Arc::new(writers),
            links: std::sync::RwLock::new(links),
            connector,
            router,
            next_op: AtomicU64::new(1),
            last_stamp: AtomicU64::new(0),
            silent_until: Mutex::new(HashMap::new()),
            table_latency: Mutex::new(HashMap::new()),
            table_schemas: Mutex::new(HashMap::new()),
            table_pairs: Mutex::new(HashMap::new()),
            session: rand::random::<u32>() as u64,
            codec: Arc::new(ReedSolomonSimd),
            volumes: Mutex::new(HashMap::new()),
            clocks: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            seen_file: None,
            evidence_log: None,
            depot_dir: None,
            causal_local: Mutex::new(causal::Local::default()),
            causal_turn: tokio::sync::Mutex::new(()),
            causal_peers: Mutex::new(HashMap::new()),
            known_file: None,
            authority: secrets.authority_key,
            confirmed: Mutex::new(None),
            known: Mutex::new(None),
            deadline: DEADLINE_DEFAULT,
            one_round_reads: true,
            retransmit_after: RETRANSMIT_AFTER,
            table_resolver: bulwark_protocol::table::Resolver::Proxy,
        })
    }

    /// The link to `node`, if it is in `cluster.toml` or a configuration verified so far.
    fn link(&self, node: NodeId) -> Option<Arc<Link>> {
        self.links.read().ok()?.get(&node).cloned()
    }

    /// `nodes` left an operation unanswered, or answered without what it needed: operations
    /// that ask one or a few nodes for the expensive part (a table proxy, register fragments)
    /// ask them last for [`SILENT_FOR`].
    fn mark_silent(&self, nodes: impl IntoIterator<Item = NodeId>) {
        let until = std::time::Instant::now() + SILENT_FOR;
        let mut silent = self.silent_until.lock().unwrap_or_else(|e| e.into_inner());
        for node in nodes {
            silent.insert(node, until);
        }
    }

    /// The nodes [`Client::mark_silent`] named within the last [`SILENT_FOR`].
    fn silent_now(&self) -> std::collections::HashSet<NodeId> {
        let now = std::time::Instant::now();
        let mut silent = self.silent_until.lock().unwrap_or_else(|e| e.into_inner());
        silent.retain(|_, until| *until > now);
        silent.keys().copied().collect()
    }

    /// Every slot of `view` in the order a PoWerStore read asks them for fragments (it asks the
    /// first `f + 1`): connected nodes first, then nodes this client is not connected to (yet),
    /// then nodes that recently did not help a read; in slot order within each, so the data
    /// fragments' nodes, whose fragments decode by copying, come first when all is well.
    fn fragment_nodes(&self, view: &GroupView) -> Vec<Slot> {
        let silent = self.silent_now();
        let mut slots: Vec<Slot> = (0..view.len()).map(|i| Slot(i as u32)).collect();
        slots.sort_by_key(|slot| match view.node(*slot) {
            Some(node) if silent.contains(&node) => 2,
            Some(node) if self.link(node).is_some_and(|link| link.connected()) => 0,
            _ => 1,
        });
        slots
    }

    /// Opens a link to every one of `members` this client has none to: members of a verified
    /// configuration. A node id is never given to another certificate, so an existing link stays.
    fn meet(&self, members: &[bulwark_core::membership::Member]) {
        let Ok(mut links) = self.links.write() else {
            return;
        };
        for member in members {
            links.entry(member.id).or_insert_with(|| {
                Arc::new(Link::spawn(
                    member.id,
                    member.address,
                    member.fingerprint,
                    self.connector.clone(),
                    self.router.clone(),
                ))
            });
        }
    }

    /// The signing keys of `view`'s members, by slot, as `cluster.toml` names them: what their
    /// signed statements are checked against.
    pub(crate) fn member_keys(
        &self,
        view: &GroupView,
    ) -> Result<Arc<[bulwark_core::sign::PublicKey]>, ClientError> {
        self.cluster
            .signing_keys(view.members())
            .map_err(ClientError::Protocol)
    }

    /// The cluster configuration.
    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// The placement of keys on replica groups.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// This client's id in the configuration.
    pub fn id(&self) -> ClientId {
        self.id
    }

    fn op_id(&self) -> OpId {
        // Unique per session: a random prefix keeps a restarted client from reusing ids and
        // timestamps' `seq` (spec §7.1 item 15).
        OpId((self.session << 32) | self.next_op.fetch_add(1, Ordering::Relaxed))
    }

    fn epoch(&self) -> Epoch {
        Epoch(self.cluster.epoch)
    }

    /// The default volume: objects written without naming a volume.
    pub fn default_volume(&self) -> Volume {
        Volume::default_of(self.cluster.protocol)
    }

    /// Stores `value` under `key` in the default volume.
    pub async fn put(&self, key: &[u8], value: Bytes) -> Result<OpReport, ClientError> {
        self.write(&self.default_volume(), key, Some(value)).await
    }

    /// Deletes `key` from the default volume: a tombstone write, after which reads return `None`.
    pub async fn delete(&self, key: &[u8]) -> Result<OpReport, ClientError> {
        self.write(&self.default_volume(), key, None).await
    }

    /// Reads `key` from the default volume: `None` when it was never written or was deleted.
    pub async fn get(&self, key: &[u8]) -> Result<(Option<Bytes>, OpReport), ClientError> {
        self.read(&self.default_volume(), key).await
    }

    /// Stores `value` under `key` in `volume`.
    pub async fn put_in(
        &self,
        volume: &Volume,
        key: &[u8],
        value: Bytes,
    ) -> Result<OpReport, ClientError> {
        self.write(volume, key, Some(value)).await
    }

    /// Deletes `key` from `volume`.
    pub async fn delete_in(&self, volume: &Volume, key: &[u8]) -> Result<OpReport, ClientError> {
        self.write(volume, key, None).await
    }

    /// Reads `key` from `volume`.
    pub async fn get_in(
        &self,
        volume: &Volume,
        key: &[u8],
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        self.read(volume, key).await
    }

    /// The replica group of `key` for `protocol`: its view, and the members the protocol uses
    /// (an ABD register lives on the first `2f+1` of the group's `3f+1`).
    fn group(&self, key: &Key, protocol: Protocol) -> (GroupView, usize) {
        let view = self.placement.group_of(key.as_bytes());
        (view, protocol.nodes(self.cluster.f))
    }

    /// A PoWerStore writer's keys for one group, by slot.
    fn writer_keys(&self, view: &GroupView) -> Result<Arc<WriterKeys>, ClientError> {
        let not_writer = || ClientError::NotWriter {
            name: self.name.clone(),
        };
        let macs = self.macs.as_ref().ok_or_else(not_writer)?;
        let mut shared = macs.shared.lock().unwrap_or_else(|e| e.into_inner());
        // Decoding the members' keys costs a point decompression each: only for a node met
        // for the first time, never on every write.
        if view.members().iter().any(|node| !shared.contains_key(node)) {
            let public = self.member_keys(view)?;
            for (node, public) in view.members().iter().zip(public.iter()) {
                shared
                    .entry(*node)
                    .or_insert_with(|| powerstore::pair_key(&macs.secret, public));
            }
        }
        let servers = view
            .members()
            .iter()
            .map(|node| shared.get(node).cloned().ok_or_else(not_writer))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(WriterKeys {
            timestamp: macs.timestamp.clone(),
            servers,
        }))
    }

    async fn write(
        &self,
        volume: &Volume,
        key: &[u8],
        value: Option<Bytes>,
    ) -> Result<OpReport, ClientError> {
        if let Serving::Causal { volume: number } = volume.serving {
            // A causal volume has its own key space and answers without the configuration
            // service: its servers may be all a client can reach.
            let written = self.causal_write(volume.name(), number, key, value).await?;
            return Ok(OpReport {
                answered: written.acknowledged_by.into_iter().collect(),
                n: 1,
                ..OpReport::default()
            });
        }
        let key = volume.register_key(key)?;
        // Refused here, before anything is sent: no node sees a write it would refuse.
        self.may_store(value.as_ref().map_or(0, Bytes::len))?;
        let not_writer = || ClientError::NotWriter {
            name: self.name.clone(),
        };
        self.fresh().await?;
        let op = self.op_id();
        let (protocol, sole) = match volume.serving {
            Serving::Replicated(protocol) => (protocol, false),
            Serving::SoleWriter { writer } if writer == self.id => (Protocol::PowerStore, true),
            Serving::SoleWriter { writer } => {
                return Err(ClientError::Volume {
                    name: volume.name().to_string(),
                    problem: format!("its only writer is {writer}, not {}", self.name),
                });
            }
            Serving::SingleServer { server, number } => {
                return self
                    .single_server_write(server, number, key, op, value)
                    .await;
            }
            Serving::Causal { .. } => unreachable!("causal writes are taken above"),
        };
        let (view, n) = self.group(&key, protocol);
        let answered = match protocol {
            Protocol::PowerStore => {
                let mut config = powerstore::ClientConfig::new(self.cluster.f);
                config.epoch = self.epoch();
                config.group = view.id();
                config.incarnation = Incarnation::new(view.members(), self.epoch());
                let pid = Pid {
                    writer: self.id,
                    seq: op.0,
                };
                let nonce: [u8; 32] = rand::random();
                let mut machine = powerstore::WriteOp::new(
                    config,
                    self.writer_keys(&view)?,
                    self.codec.clone(),
                    key.clone(),
                    op,
                    pid,
                    nonce,
                    value,
                );
                if !sole {
                    self.drive(&view, &key, self.cluster.f, &mut machine)
                        .await?
                        .acknowledged_by
                } else {
                    self.sole_write(&view, &key, machine).await?
                }
            }
            Protocol::Abd => {
                // ABD writers hold no keys: the configuration's access list is all there is.
                if !self.may_write {
                    return Err(not_writer());
                }
                let mut config = abd::ClientConfig::new(self.cluster.f);
                config.epoch = self.epoch();
                config.group = view.id();
                let mut machine = abd::WriteOp::new(config, key.clone(), op, self.id, op.0, value);
                self.drive(&view, &key, self.cluster.f, &mut machine)
                    .await?
                    .acknowledged_by
            }
            Protocol::Phalanx => {
                let signing = self.signing.clone().ok_or_else(not_writer)?;
                let mut config = phalanx::ClientConfig::new(self.cluster.f, self.writers.clone());
                config.epoch = self.epoch();
                config.group = view.id();
                let mut machine =
                    phalanx::WriteOp::new(config, key.clone(), op, self.id, op.0, signing, value);
                self.drive(&view, &key, self.cluster.f, &mut machine)
                    .await?
                    .acknowledged_by
            }
        };
        Ok(OpReport {
            answered: nodes(in_view(&view), &answered),
            n,
            evidence: Vec::new(),
            restarts: 0,
            repaired: false,
        })
    }

    async fn read(
        &self,
        volume: &Volume,
        key: &[u8],
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        if let Serving::Causal { volume: number } = volume.serving {
            let read = self.causal_read(volume.name(), number, key).await?;
            let report = OpReport {
                answered: read.answered.clone(),
                n: 1,
                ..OpReport::default()
            };
            return Ok((read.newest().cloned(), report));
        }
        self.read_replicated(volume, key).await
    }

    /// A read of a volume that is not causal.
    async fn read_replicated(
        &self,
        volume: &Volume,
        key: &[u8],
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        let key = volume.register_key(key)?;
        self.fresh().await?;
        let op = self.op_id();
        let protocol = match volume.serving {
            Serving::Replicated(protocol) => protocol,
            Serving::SoleWriter { .. } => Protocol::PowerStore,
            Serving::SingleServer { server, number } => {
                return self.single_server_read(server, number, key, op).await;
            }
            Serving::Causal { .. } => unreachable!("causal reads are taken above"),
        };
        let (view, n) = self.group(&key, protocol);
        let (value, report) = match protocol {
            Protocol::PowerStore => {
                let mut config = powerstore::ClientConfig::new(self.cluster.f);
                config.epoch = self.epoch();
                config.group = view.id();
                config.incarnation = Incarnation::new(view.members(), self.epoch());
                config.one_round = self.one_round_reads;
                let mut machine =
                    powerstore::ReadOp::new(config, self.codec.clone(), key.clone(), op)
                        .asking_fragments_of(&self.fragment_nodes(&view));
                let outcome = self
                    .drive(&view, &key, self.cluster.f, &mut machine)
                    .await?;
                self.mark_silent(outcome.unhelpful.iter().filter_map(|s| view.node(*s)));
                let report = OpReport {
                    answered: nodes(in_view(&view), &outcome.answered_by),
                    n,
                    evidence: blame(in_view(&view), &format!("key {key}"), &outcome.evidence),
                    restarts: outcome.restarts,
                    repaired: outcome.repaired,
                };
                (outcome.value, report)
            }
            Protocol::Abd => {
                let mut config = abd::ClientConfig::new(self.cluster.f);
                config.epoch = self.epoch();
                config.group = view.id();
                let mut machine = abd::ReadOp::new(config, key.clone(), op);
                let outcome = self
                    .drive(&view, &key, self.cluster.f, &mut machine)
                    .await?;
                let report = register_report(in_view(&view), n, &key, &outcome);
                (outcome.value, report)
            }
            Protocol::Phalanx => {
                let mut config = phalanx::ClientConfig::new(self.cluster.f, self.writers.clone());
                config.epoch = self.epoch();
                config.group = view.id();
                let mut machine = phalanx::ReadOp::new(config, key.clone(), op);
                let outcome = self
                    .drive(&view, &key, self.cluster.f, &mut machine)
                    .await?;
                let report = register_report(in_view(&view), n, &key, &outcome);
                (outcome.value, report)
            }
        };
        self.record(&report.evidence);
        Ok((value, report))
    }

    /// A write of a register this client alone writes: it skips CLOCK when this client knows
    /// the key's clock from its own last write. A write that fails forgets the key's clock (it
    /// may still complete at a timestamp this client never learned), so the next one runs CLOCK;
    /// should a concurrent write record a clock below it, the nodes' stale refusal corrects it.
    async fn sole_write(
        &self,
        view: &GroupView,
        key: &Key,
        machine: powerstore::WriteOp,
    ) -> Result<Vec<Slot>, ClientError> {
        let last = self.clocks.lock().ok().and_then(|c| c.get(key).copied());
        let mut machine = machine
            .sole(last)
            .map_err(|error| ClientError::Protocol(error.to_string()))?;
        let written = self.drive(view, key, self.cluster.f, &mut machine).await;
        if let Ok(mut clocks) = self.clocks.lock() {
            match &written {
                Ok(outcome) => {
                    if clocks.len() >= CLOCKS_MAX && !clocks.contains_key(key) {
                        // Forgetting costs each key one CLOCK round, never correctness.
                        clocks.clear();
                    }
                    let clock = clocks.entry(key.clone()).or_default();
                    *clock = (*clock).max(outcome.ts.num);
                }
                Err(_) => {
                    clocks.remove(key);
                }
            }
        }
        Ok(written?.acknowledged_by)
    }

    /// Logs, counts and (when connected through a cluster directory) records misbehaviour.
    fn record(&self, observed: &[Evidence]) {
        for evidence in observed {
            tracing::info!(node = %evidence.node, kind = %evidence.kind, detail = %evidence.detail, "node misbehaved");
        }
        if let Some(path) = &self.evidence_log {
            evidence::append(path, &self.name, observed);
        }
    }

    /// Drives one operation on one group to completion or the deadline: the one driver every
    /// protocol's operations share. An operation that follows the configuration
    /// ([`Operation::route`]) names nodes by id, says itself which epoch and group each round
    /// runs in, and may ask for configurations newer than it holds ([`Operation::needs`]),
    /// which the driver fetches, verifies and hands over; `view` is then its starting group.
    async fn drive<O: Operation>(
        &self,
        view: &GroupView,
        key: &(dyn std::fmt::Display + Sync),
        faults: usize,
        machine: &mut O,
    ) -> Result<O::Output, ClientError> {
        let routed = machine.route().is_some();
        let node_of = |slot: Slot| {
            if routed {
                Some(NodeId(slot.0))
            } else {
                view.node(slot)
            }
        };
        let n = view.len();
        let (sender, mut replies) = mpsc::channel(8 * n.max(1));
        let _registration = self
            .router
            .register(machine.op(), sender)
            .map_err(|taken| ClientError::Protocol(format!("operation id {} reused", taken.0)))?;
        let header = |machine: &O| {
            let (epoch, group) = machine.route().unwrap_or((view.epoch(), view.id()));
            Header::request(O::SERVICE, group, epoch, machine.op())
        };
        let first = machine.start();
        self.send_all(&node_of, &header(machine), first);
        let deadline = tokio::time::Instant::now() + self.deadline;
        let mut retransmit = tokio::time::interval_at(
            tokio::time::Instant::now() + self.retransmit_after,
            self.retransmit_after,
        );
        // Refusals before any replica saw the request (wrong epoch or group): f+1 of them mean a
        // correct node refused.
        let mut refused: BTreeSet<NodeId> = BTreeSet::new();
        // When the configurations were last fetched for the operation: a faulty replica naming
        // epochs that do not exist makes the client ask at most once a retransmission period.
        let mut fetched: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                reply = replies.recv() => {
                    let Some((from, envelope)) = reply else {
                        return Err(ClientError::Protocol("reply channel closed".into()));
                    };
                    let slot = if routed { Some(Slot(from.0)) } else { view.slot_of(from) };
                    let Some(slot) = slot else {
                        continue;
                    };
                    match envelope.header.kind {
                        Kind::Reply => match envelope.body::<O::Reply>(FRAME_BYTES_MAX) {
                            Ok(reply) => match machine.on_reply(slot, reply) {
                                Progress::Send(sends) => {
                                    self.send_all(&node_of, &header(machine), sends);
                                }
                                Progress::Done(result) => {
                                    return result.map_err(|error| op_error(view, error));
                                }
                            },
                            Err(error) => {
                                let evidence = Evidence::new(from, EvidenceKind::MalformedReply)
                                    .with_detail(format!("key {key}: {error}"));
                                self.record(std::slice::from_ref(&evidence));
                            }
                        },
                        Kind::Refused => {
                            let refusal = envelope
                                .body::<EnvelopeRefusal>(FRAME_BYTES_MAX)
                                .map_or_else(|e| format!("undecodable refusal: {e}"), |r| r.to_string());
                            refused.insert(from);
                            if refused.len() > faults {
                                return Err(ClientError::Refused {
                                    refusal,
                                    nodes: refused.into_iter().collect(),
                                });
                            }
                        }
                        Kind::Request | Kind::Message => {}
                    }
                    if machine.needs().is_some()
                        && fetched.is_none_or(|at| at.elapsed() >= self.retransmit_after)
                    {
                        fetched = Some(tokio::time::Instant::now());
                        match self.refresh_rings().await {
                            Ok(chain) => match machine.learn(chain) {
                                Progress::Send(sends) => {
                                    self.send_all(&node_of, &header(machine), sends);
                                }
                                Progress::Done(result) => {
                                    return result.map_err(|error| op_error(view, error));
                                }
                            },
                            Err(error) => {
                                tracing::debug!(%error, "newer configurations could not be fetched");
                            }
                        }
                    }
                }
                _ = retransmit.tick() => {
                    let sends = machine.on_timeout();
                    self.send_all(&node_of, &header(machine), sends);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let answered: Vec<NodeId> =
                        machine.answered().into_iter().filter_map(node_of).collect();
                    let unreachable = view
                        .members()
                        .iter()
                        .filter(|node| !answered.contains(node))
                        .filter_map(|node| Some((*node, self.link(*node)?.address())))
                        .collect();
                    // A quorum answered and still nothing came of it: their answers are what
                    // was missing, however the protocol puts it.
                    let stalled = machine.stalled().or_else(|| {
                        (answered.len() >= machine.quorum())
                            .then(|| "their answers did not complete the operation".to_string())
                    });
                    return Err(ClientError::Unavailable {
                        deadline: self.deadline,
                        answered: answered.len(),
                        quorum: machine.quorum(),
                        n,
                        unreachable,
                        stalled,
                    });
                }
            }
        }
    }

    fn send_all<R: serde::Serialize>(
        &self,
        node_of: &impl Fn(Slot) -> Option<NodeId>,
        header: &Header,
        sends: Vec<(Slot, R)>,
    ) {
        for (slot, request) in sends {
            let Some(link) = node_of(slot).and_then(|node| self.link(node)) else {
                continue;
            };
            if let Err(error) = link.send(envelope::frame(header, &request)) {
                tracing::debug!(node = %link.node(), %error, "frame not queued; retransmission resends it");
            }
        }
    }

    /// Whether `node` answers a protocol request, not just its status: one PoWerStore COLLECT
    /// (it reads and changes nothing) for a key of a group `node` serves, answered within
    /// `wait`. `None` when `node` holds no PoWerStore replica of `cluster.toml`'s placement.
    /// A node that answers status but not this is up for everything but the data it holds.
    pub async fn probe(&self, node: NodeId, wait: Duration) -> Option<bool> {
        // Keys spread evenly over the ring: a few hundred find every group of any placement.
        let key = (0..1024u32)
            .filter_map(|i| Key::new(format!("bulwark/probe/{i}").into_bytes()).ok())
            .find(|key| {
                self.placement
                    .group_of(key.as_bytes())
                    .slot_of(node)
                    .is_some()
            })?;
        let request = powerstore::Request {
            op: self.op_id(),
            attempt: 0,
            epoch: self.epoch(),
            group: Default::default(),
            key,
            body: powerstore::RequestBody::Collect { fragment: false },
        };
        Some(self.raw_request(node, request, wait).await.is_some())
    }

    /// Sends one raw PoWerStore request to one node and returns its first reply: for tests that
    /// play a malicious client. The request's group is the node's group for `key`. A correct
    /// client never needs this.
    #[doc(hidden)]
    pub async fn raw_request(
        &self,
        to: NodeId,
        mut request: powerstore::Request,
        wait: Duration,
    ) -> Option<powerstore::Response> {
        let view = self.placement.group_of(request.key.as_bytes());
        request.group = view.id();
        let (sender, mut replies) = mpsc::channel(4);
        let _registration = self.router.register(request.op.0, sender).ok()?;
        let header = Header::request(
            ServiceId::POWERSTORE,
            view.id(),
            request.epoch,
            request.op.0,
        );
        self.link(to)?
            .send(envelope::frame(&header, &request))
            .ok()?;
        match tokio::time::timeout(wait, replies.recv()).await {
            Ok(Some((_, envelope))) if envelope.header.kind == Kind::Reply => {
                envelope.body(FRAME_BYTES_MAX).ok()
            }
            _ => None,
        }
    }

    /// The slot `node` holds in the group of `key` (for tests that craft requests).
    #[doc(hidden)]
    pub fn slot_for(&self, key: &[u8], node: NodeId) -> Option<Slot> {
        self.placement.group_of(key).slot_of(node)
    }

    /// Asks one node for its status: one round trip on the authenticated channel.
    pub async fn status_of(&self, node: NodeId) -> Result<NodeStatus, String> {
        self.status_within(node, self.deadline).await
    }

    async fn status_within(&self, node: NodeId, wait: Duration) -> Result<NodeStatus, String> {
        match self.ask_within(node, &SystemRequest::Status, wait).await? {
            SystemReply::Status(status) => Ok(status),
            _ => Err("an answer to another question".into()),
        }
    }

    /// Asks `node` itself (the system service) and waits up to `wait` for its answer; the error
    /// says what went wrong, naming the link's last error when the node cannot be reached.
    async fn ask_within(
        &self,
        node: NodeId,
        request: &SystemRequest,
        wait: Duration,
    ) -> Result<SystemReply, String> {
        let Some(link) = self.link(node) else {
            return Err(format!("no {node}"));
        };
        let op = self.op_id().0;
        let (sender, mut replies) = mpsc::channel(1);
        let _registration = self
            .router
            .register(op, sender)
            .map_err(|_| "operation id reused".to_string())?;
        let header = Header::request(ServiceId::SYSTEM, Default::default(), self.epoch(), op);
        link.send(envelope::frame(&header, request))
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(wait, replies.recv()).await {
            Ok(Some((_, reply))) if reply.header.kind == Kind::Reply => reply
                .body::<SystemReply>(FRAME_BYTES_MAX)
                .map_err(|error| format!("malformed answer: {error}")),
            Ok(Some((_, reply))) => Err(format!("refused: {:?}", reply.header.kind)),
            _ if !link.connected() => Err(link
                .last_error()
                .unwrap_or_else(|| "not connected yet".to_string())),
            _ => Err("no answer".to_string()),
        }
    }

    /// Asks every node for its status: the nodes of `cluster.toml` (they hold the registers
    /// whatever the epoch) and, where the cluster has a configuration service, the members of
    /// the newest configuration.
    pub async fn status(&self) -> Vec<(NodeId, SocketAddr, Result<NodeStatus, String>)> {
        const STATUS_WAIT: Duration = Duration::from_secs(3);
        let mut ids: Vec<NodeId> = self.cluster.nodes.iter().map(|n| NodeId(n.id)).collect();
        if self.cluster.configuration_service.is_some() {
            match tokio::time::timeout(STATUS_WAIT, self.configuration()).await {
                Ok(Ok(newest)) => ids.extend(newest.members.iter().map(|m| m.id)),
                Ok(Err(error)) => tracing::debug!(%error, "no configuration: cluster.toml's nodes"),
                Err(_) => tracing::debug!("no configuration in time: cluster.toml's nodes"),
            }
        }
        ids.sort_unstable();
        ids.dedup();
        let nodes: Vec<(NodeId, SocketAddr)> = ids
            .into_iter()
            .filter_map(|id| Some((id, self.link(id)?.address())))
            .collect();
        let asks = nodes.into_iter().map(|(id, address)| async move {
            let status = self.status_within(id, STATUS_WAIT).await;
            (id, address, status)
        });
        futures::future::join_all(asks).await
    }
}

/// Slots to the nodes holding them in `view`.
impl Client {
    /// Refuses, before anything is sent, an object over the size limit or a client that may not
    /// write: for the object kinds whose writers need nothing but the access list.
    fn may_store(&self, len: usize) -> Result<(), ClientError> {
        if len > OBJECT_BYTES_MAX {
            return Err(ClientError::TooLarge {
                len,
                max: OBJECT_BYTES_MAX,
            });
        }
        if !self.may_write {
            return Err(ClientError::NotWriter {
                name: self.name.clone(),
            });
        }
        Ok(())
    }
}

/// Misbehaviour a client machine saw, named by node; `what` says which object it was about.
fn blame(
    name: impl Fn(Slot) -> Option<NodeId>,
    what: &str,
    seen: &[bulwark_protocol::round::Evidence],
) -> Vec<Evidence> {
    seen.iter()
        .filter_map(|e| {
            let node = name(e.node)?;
            Some(Evidence::new(node, e.kind.clone()).with_detail(what.to_string()))
        })
        .collect()
}

fn nodes(name: impl Fn(Slot) -> Option<NodeId>, slots: &[Slot]) -> Vec<NodeId> {
    slots.iter().filter_map(|slot| name(*slot)).collect()
}

/// The node in each slot of `view`: how the outcome of an operation on one group names nodes.
fn in_view(view: &GroupView) -> impl Fn(Slot) -> Option<NodeId> + Copy + '_ {
    |slot| view.node(slot)
}

/// How the outcome of an operation that follows the configuration names nodes: by id.
fn by_id(slot: Slot) -> Option<NodeId> {
    Some(NodeId(slot.0))
}

fn op_error(view: &GroupView, error: OpError) -> ClientError {
    match error {
        OpError::Refused { reason, by } => ClientError::Refused {
            refusal: reason,
            nodes: nodes(in_view(view), &by),
        },
        OpError::Failed(text) => ClientError::Protocol(text),
        OpError::Unknown(text) => ClientError::Protocol(format!("outcome unknown: {text}")),
    }
}

/// A baseline read's report: a Phalanx server that served a version no writer signed is a forger.
fn register_report(
    name: impl Fn(Slot) -> Option<NodeId> + Copy,
    n: usize,
    key: &Key,
    outcome: &bulwark_protocol::register::ReadOutcome,
) -> OpReport {
    OpReport {
        answered: nodes(name, &outcome.answered_by),
        n,
        evidence: nodes(name, &outcome.forgers)
            .into_iter()
            .map(|node| {
                Evidence::new(node, EvidenceKind::ForgedVersion)
                    .with_detail(format!("key {key}: a version no writer signed"))
            })
            .collect(),
        restarts: 0,
        repaired: outcome.wrote_back,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_operation_says_whether_replies_or_agreement_were_missing() {
        let node = (NodeId(3), "127.0.0.1:7103".parse().unwrap());
        let short = ClientError::Unavailable {
            deadline: Duration::from_secs(5),
            answered: 2,
            quorum: 3,
            n: 4,
            unreachable: vec![node],
            stalled: None,
        }
        .to_string();
        assert!(short.starts_with("no quorum within 5s: 2 of 4"), "{short}");
        assert!(
            short.ends_with("no answer from node3 (127.0.0.1:7103)"),
            "{short}"
        );
        let disagreeing = ClientError::Unavailable {
            deadline: Duration::from_secs(5),
            answered: 3,
            quorum: 3,
            n: 4,
            unreachable: vec![node],
            stalled: Some("their answers did not agree".into()),
        }
        .to_string();
        assert!(
            disagreeing.starts_with(
                "no result within 5s: 3 of 4 nodes answered (quorum 3), but their answers did not agree"
            ),
            "{disagreeing}"
        );
    }
}
