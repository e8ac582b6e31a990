//! The Bulwark client library: the trusted side of the system.
//!
//! A [`Client`] keeps one authenticated connection per node (re-established in the background when
//! it drops) and drives one protocol machine per operation: it sends each round, feeds replies
//! back, retransmits to nodes that have not answered, and gives up at the deadline with an error
//! that names the nodes it could not reach. Safety never depends on these timings; they only
//! decide when to retry and when to stop waiting.

mod connection;

use bulwark_core::config::{ClientSecrets, ClusterConfig, Protocol, parse_secrets};
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::{ClientId, Key, NodeId, OBJECT_BYTES_MAX};
use bulwark_protocol::powerstore::{
    ClientConfig, Evidence, OpId, Pid, ProtocolError, ReadOp, Refusal, Request, Response, Step,
    WriteOp, WriterKeys,
};
use bulwark_protocol::service::{ClientFrame, NodeStatus};
use bulwark_protocol::{abd, phalanx};
use bytes::Bytes;
use connection::{NodeLink, Reply};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long an operation keeps trying by default.
pub const DEADLINE_DEFAULT: Duration = Duration::from_secs(30);
/// How long to wait for an answer before resending a round to the nodes that have not answered.
const RETRANSMIT_AFTER: Duration = Duration::from_millis(1000);

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
    /// This client holds no writer keys.
    #[error("client {name:?} is not a writer in this cluster")]
    NotWriter {
        /// The client's name.
        name: String,
    },
    /// Enough nodes refused that at least one correct node did.
    #[error("refused by nodes {nodes:?}: {refusal}")]
    Refused {
        /// Why.
        refusal: Refusal,
        /// Who.
        nodes: Vec<NodeId>,
    },
    /// Enough nodes of a baseline cluster refused; the text says why.
    #[error("refused by nodes {nodes:?}: {refusal}")]
    RefusedBaseline {
        /// Why.
        refusal: String,
        /// Who.
        nodes: Vec<NodeId>,
    },
    /// No quorum answered before the deadline.
    #[error(
        "no quorum within {deadline:?}: {answered} of {n} nodes answered (quorum {quorum}); no answer from {}",
        describe(unreachable)
    )]
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
    },
    /// The protocol failed in a way that indicates a bug.
    #[error("protocol: {0}")]
    Protocol(String),
}

fn describe(nodes: &[(NodeId, SocketAddr)]) -> String {
    nodes
        .iter()
        .map(|(id, address)| format!("{id} ({address})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an operation learned besides its result.
#[derive(Clone, Debug)]
pub struct OpReport {
    /// Nodes whose answers completed the final round.
    pub answered: Vec<NodeId>,
    /// Group size.
    pub n: usize,
    /// Misbehaviour observed, with the node to blame.
    pub evidence: Vec<Evidence>,
    /// Read restarts caused by garbage-collected versions.
    pub restarts: u32,
    /// Whether a read ran REPAIR.
    pub repaired: bool,
}

/// A connected client.
pub struct Client {
    cluster: Arc<ClusterConfig>,
    name: String,
    protocol: ClientConfig,
    abd: abd::ClientConfig,
    phalanx: phalanx::ClientConfig,
    /// A Phalanx writer's signing key.
    signing: Option<Arc<phalanx::SigningKey>>,
    writer: Option<Arc<WriterKeys>>,
    links: Vec<NodeLink>,
    router: connection::Router,
    next_op: AtomicU64,
    session: u64,
    codec: Arc<dyn ErasureCodec>,
    /// How long an operation keeps trying.
    pub deadline: Duration,
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

impl Client {
    /// Connects as client `name` using the files `bulwark cluster init` wrote into `cluster_dir`.
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
        Client::new(cluster, secrets, identity).await
    }

    /// Connects with explicit configuration and secrets.
    pub async fn new(
        cluster: ClusterConfig,
        secrets: ClientSecrets,
        identity: bulwark_transport::Identity,
    ) -> Result<Client, ClientError> {
        if cluster.client(&secrets.name).is_none() {
            return Err(bulwark_core::config::ConfigError::Invalid {
                file: "cluster.toml".into(),
                field: "clients".into(),
                problem: format!("no client named {:?}", secrets.name),
            }
            .into());
        }
        let writer = match secrets.writer {
            // Baselines use no MAC keys; a writer there is one the configuration lets write.
            _ if cluster.protocol != Protocol::PowerStore => None,
            Some(w) if w.server_keys.len() == cluster.n() => Some(Arc::new(WriterKeys {
                timestamp: w.timestamp_key,
                servers: w.server_keys,
            })),
            Some(w) => {
                return Err(bulwark_core::config::ConfigError::Invalid {
                    file: "client.toml".into(),
                    field: "writer.server_keys".into(),
                    problem: format!("{} keys for {} nodes", w.server_keys.len(), cluster.n()),
                }
                .into());
            }
            None => None,
        };
        let connector = Arc::new(bulwark_transport::Connector::new(&identity)?);
        let router = connection::Router::default();
        let links = cluster
            .nodes
            .iter()
            .map(|node| {
                NodeLink::spawn(
                    NodeId(node.id),
                    node.address,
                    node.fingerprint,
                    connector.clone(),
                    router.clone(),
                )
            })
            .collect();
        let mut protocol = ClientConfig::new(cluster.f);
        protocol.epoch = bulwark_core::Epoch(cluster.epoch);
        let mut abd = abd::ClientConfig::new(cluster.f);
        abd.epoch = protocol.epoch;
        let writers = phalanx::Writers::from_config(&cluster, "cluster.toml")?;
        let mut phalanx = phalanx::ClientConfig::new(cluster.f, Arc::new(writers));
        phalanx.epoch = protocol.epoch;
        let signing = match (cluster.protocol, secrets.signing_key) {
            (Protocol::Phalanx, Some(secret)) => {
                let registered = cluster
                    .client(&secrets.name)
                    .and_then(|(_, entry)| entry.signing_key);
                if registered != Some(phalanx::public_key(&secret)) {
                    return Err(bulwark_core::config::ConfigError::Invalid {
                        file: "client.toml".into(),
                        field: "signing_key".into(),
                        problem: "does not match this client's public key in cluster.toml".into(),
                    }
                    .into());
                }
                Some(Arc::new(phalanx::signing_key(&secret)))
            }
            _ => None,
        };
        Ok(Client {
            cluster: Arc::new(cluster),
            name: secrets.name,
            protocol,
            abd,
            phalanx,
            signing,
            writer,
            links,
            router,
            next_op: AtomicU64::new(1),
            session: rand::random::<u32>() as u64,
            codec: Arc::new(ReedSolomonSimd),
            deadline: DEADLINE_DEFAULT,
        })
    }

    /// The cluster configuration.
    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// This client's id in the configuration.
    pub fn id(&self) -> ClientId {
        self.cluster
            .client(&self.name)
            .map_or(ClientId(u32::MAX), |(id, _)| id)
    }

    fn op_id(&self) -> OpId {
        // Unique per session: a random prefix keeps a restarted client from reusing ids and
        // timestamps' `seq` (spec §7.1 item 15).
        OpId((self.session << 32) | self.next_op.fetch_add(1, Ordering::Relaxed))
    }

    /// Stores `value` under `key`.
    pub async fn put(&self, key: &[u8], value: Bytes) -> Result<OpReport, ClientError> {
        self.write(key, Some(value)).await
    }

    /// Deletes `key`: a tombstone write, after which reads return `None`.
    pub async fn delete(&self, key: &[u8]) -> Result<OpReport, ClientError> {
        self.write(key, None).await
    }

    async fn write(&self, key: &[u8], value: Option<Bytes>) -> Result<OpReport, ClientError> {
        let key = Key::new(key.to_vec())?;
        if let Some(value) = &value
            && value.len() > OBJECT_BYTES_MAX
        {
            return Err(ClientError::TooLarge {
                len: value.len(),
                max: OBJECT_BYTES_MAX,
            });
        }
        let op = self.op_id();
        let may_write = self
            .cluster
            .client(&self.name)
            .is_some_and(|(_, entry)| entry.write);
        let not_writer = || ClientError::NotWriter {
            name: self.name.clone(),
        };
        let answered = match self.cluster.protocol {
            Protocol::PowerStore => {
                let keys = self.writer.clone().ok_or_else(not_writer)?;
                let pid = Pid {
                    writer: self.id(),
                    seq: op.0,
                };
                let nonce: [u8; 32] = rand::random();
                let mut machine = WriteOp::new(
                    self.protocol.clone(),
                    keys,
                    self.codec.clone(),
                    key,
                    op,
                    pid,
                    nonce,
                    value,
                );
                let first = machine.start();
                self.drive(op.0, &mut machine, frames(first))
                    .await?
                    .acknowledged_by
            }
            Protocol::Abd => {
                if !may_write {
                    return Err(not_writer());
                }
                let op = abd::OpId(op.0);
                let mut machine =
                    abd::WriteOp::new(self.abd.clone(), key, op, self.id(), op.0, value);
                let first = machine.start();
                self.drive(op.0, &mut machine, abd_frames(first))
                    .await?
                    .acknowledged_by
            }
            Protocol::Phalanx => {
                let signing = self.signing.clone().ok_or_else(not_writer)?;
                let op = phalanx::OpId(op.0);
                let mut machine = phalanx::WriteOp::new(
                    self.phalanx.clone(),
                    key,
                    op,
                    self.id(),
                    op.0,
                    signing,
                    value,
                );
                let first = machine.start();
                self.drive(op.0, &mut machine, phalanx_frames(first))
                    .await?
                    .acknowledged_by
            }
        };
        Ok(OpReport {
            answered,
            n: self.cluster.n(),
            evidence: Vec::new(),
            restarts: 0,
            repaired: false,
        })
    }

    /// Reads `key`: `None` when it was never written or was deleted.
    pub async fn get(&self, key: &[u8]) -> Result<(Option<Bytes>, OpReport), ClientError> {
        let key = Key::new(key.to_vec())?;
        let op = self.op_id();
        let n = self.cluster.n();
        match self.cluster.protocol {
            Protocol::PowerStore => {
                let mut machine =
                    ReadOp::new(self.protocol.clone(), self.codec.clone(), key.clone(), op);
                let first = machine.start();
                let outcome = self.drive(op.0, &mut machine, frames(first)).await?;
                for evidence in &outcome.evidence {
                    tracing::warn!(node = %evidence.node, kind = ?evidence.kind, %key, "node misbehaved");
                }
                let report = OpReport {
                    answered: outcome.answered_by,
                    n,
                    evidence: outcome.evidence,
                    restarts: outcome.restarts,
                    repaired: outcome.repaired,
                };
                Ok((outcome.value, report))
            }
            Protocol::Abd => {
                let mut machine = abd::ReadOp::new(self.abd.clone(), key, abd::OpId(op.0));
                let first = machine.start();
                let outcome = self.drive(op.0, &mut machine, abd_frames(first)).await?;
                let report = OpReport {
                    answered: outcome.answered_by,
                    n,
                    evidence: Vec::new(),
                    restarts: 0,
                    repaired: outcome.wrote_back,
                };
                Ok((outcome.value, report))
            }
            Protocol::Phalanx => {
                let mut machine =
                    phalanx::ReadOp::new(self.phalanx.clone(), key.clone(), phalanx::OpId(op.0));
                let first = machine.start();
                let outcome = self
                    .drive(op.0, &mut machine, phalanx_frames(first))
                    .await?;
                for node in &outcome.forgers {
                    tracing::warn!(%node, %key, "node served a version no writer signed");
                }
                let report = OpReport {
                    answered: outcome.answered_by,
                    n,
                    evidence: outcome
                        .forgers
                        .into_iter()
                        .map(|node| Evidence {
                            node,
                            kind: bulwark_protocol::powerstore::EvidenceKind::MalformedReply,
                        })
                        .collect(),
                    restarts: 0,
                    repaired: outcome.wrote_back,
                };
                Ok((outcome.value, report))
            }
        }
    }

    /// Every round's quorum in this cluster's protocol.
    fn quorum(&self) -> usize {
        match self.cluster.protocol {
            Protocol::Abd => self.abd.quorum(),
            Protocol::Phalanx => self.phalanx.quorum(),
            Protocol::PowerStore => self.protocol.quorum(),
        }
    }

    /// Drives one machine to completion or the deadline.
    async fn drive<O: Operation>(
        &self,
        op: u64,
        machine: &mut O,
        first: Vec<(NodeId, ClientFrame)>,
    ) -> Result<O::Output, ClientError> {
        let n = self.cluster.n();
        let (sender, mut replies) = mpsc::channel(8 * n);
        let _registration = self.router.register(op, sender);
        self.send_all(first);
        let deadline = tokio::time::Instant::now() + self.deadline;
        let mut retransmit = tokio::time::interval_at(
            tokio::time::Instant::now() + RETRANSMIT_AFTER,
            RETRANSMIT_AFTER,
        );
        loop {
            tokio::select! {
                reply = replies.recv() => {
                    let Some((from, reply)) = reply else {
                        return Err(ClientError::Protocol("reply channel closed".into()));
                    };
                    match machine.feed(from, reply) {
                        Progress::Send(outbound) => self.send_all(outbound),
                        Progress::Done(result) => return result,
                    }
                }
                _ = retransmit.tick() => self.send_all(machine.resend()),
                _ = tokio::time::sleep_until(deadline) => {
                    let answered = machine.answered();
                    let unreachable = self
                        .cluster
                        .nodes
                        .iter()
                        .filter(|node| !answered.contains(&NodeId(node.id)))
                        .map(|node| (NodeId(node.id), node.address))
                        .collect();
                    return Err(ClientError::Unavailable {
                        deadline: self.deadline,
                        answered: answered.len(),
                        quorum: self.quorum(),
                        n,
                        unreachable,
                    });
                }
            }
        }
    }

    fn send_all(&self, outbound: Vec<(NodeId, ClientFrame)>) {
        for (to, frame) in outbound {
            if let Some(link) = self.links.get(to.index()) {
                link.send(&frame);
            }
        }
    }

    /// Sends one raw request to one node and returns its first reply: for tests that play a
    /// malicious client. A correct client never needs this.
    #[doc(hidden)]
    pub async fn raw_request(
        &self,
        to: NodeId,
        request: Request,
        wait: Duration,
    ) -> Option<Response> {
        let (sender, mut replies) = mpsc::channel(4);
        let _registration = self.router.register(request.op.0, sender);
        self.links
            .get(to.index())?
            .send(&ClientFrame::PowerStore(request));
        match tokio::time::timeout(wait, replies.recv()).await {
            Ok(Some((_, Reply::PowerStore(response)))) => Some(response),
            _ => None,
        }
    }

    /// Asks one node for its status: one round trip on the authenticated channel.
    pub async fn status_of(&self, node: NodeId) -> Result<NodeStatus, String> {
        match self.links.get(node.index()) {
            Some(link) => link.status(self.deadline).await,
            None => Err(format!("no {node}")),
        }
    }

    /// Asks every node for its status.
    pub async fn status(&self) -> Vec<(NodeId, SocketAddr, Result<NodeStatus, String>)> {
        let mut results = Vec::new();
        for (index, link) in self.links.iter().enumerate() {
            let address = self.cluster.nodes[index].address;
            let status = link.status(Duration::from_secs(3)).await;
            results.push((NodeId(index as u32), address, status));
        }
        results
    }
}

fn protocol_error(error: ProtocolError) -> ClientError {
    match error {
        ProtocolError::Refused { refusal, nodes } => ClientError::Refused { refusal, nodes },
        other => ClientError::Protocol(other.to_string()),
    }
}

fn frames(outbound: Vec<bulwark_protocol::powerstore::Outbound>) -> Vec<(NodeId, ClientFrame)> {
    outbound
        .into_iter()
        .map(|(to, request)| (to, ClientFrame::PowerStore(request)))
        .collect()
}

fn abd_frames(outbound: Vec<abd::Outbound>) -> Vec<(NodeId, ClientFrame)> {
    outbound
        .into_iter()
        .map(|(to, request)| (to, ClientFrame::Abd(request)))
        .collect()
}

fn phalanx_frames(outbound: Vec<phalanx::Outbound>) -> Vec<(NodeId, ClientFrame)> {
    outbound
        .into_iter()
        .map(|(to, request)| (to, ClientFrame::Phalanx(request)))
        .collect()
}

/// What [`Client::drive`] does after feeding a reply.
enum Progress<T> {
    Send(Vec<(NodeId, ClientFrame)>),
    Done(Result<T, ClientError>),
}

impl<T> Progress<T> {
    fn powerstore(step: Step<T>) -> Progress<T> {
        match step {
            Step::Continue(outbound) => Progress::Send(frames(outbound)),
            Step::Done(result) => Progress::Done(result.map_err(protocol_error)),
        }
    }

    fn abd(step: abd::Step<T>) -> Progress<T> {
        match step {
            abd::Step::Continue(outbound) => Progress::Send(abd_frames(outbound)),
            abd::Step::Done(result) => Progress::Done(result.map_err(|error| match error {
                abd::ProtocolError::Refused { refusal, nodes } => ClientError::RefusedBaseline {
                    refusal: refusal.to_string(),
                    nodes,
                },
            })),
        }
    }
}

impl<T> Progress<T> {
    fn phalanx(step: phalanx::Step<T>) -> Progress<T> {
        match step {
            phalanx::Step::Continue(outbound) => Progress::Send(phalanx_frames(outbound)),
            phalanx::Step::Done(result) => Progress::Done(result.map_err(|error| match error {
                phalanx::ProtocolError::Refused { refusal, nodes } => {
                    ClientError::RefusedBaseline {
                        refusal: refusal.to_string(),
                        nodes,
                    }
                }
            })),
        }
    }
}

/// Every protocol's operation machines, seen alike by [`Client::drive`]. A reply of another
/// protocol than the machine's is ignored.
trait Operation {
    type Output;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output>;
    fn resend(&self) -> Vec<(NodeId, ClientFrame)>;
    fn answered(&self) -> Vec<NodeId>;
}

impl Operation for WriteOp {
    type Output = bulwark_protocol::powerstore::WriteOutcome;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output> {
        match reply {
            Reply::PowerStore(response) => Progress::powerstore(self.on_response(from, response)),
            _ => Progress::Send(Vec::new()),
        }
    }
    fn resend(&self) -> Vec<(NodeId, ClientFrame)> {
        frames(self.retransmit())
    }
    fn answered(&self) -> Vec<NodeId> {
        WriteOp::answered(self)
    }
}

impl Operation for ReadOp {
    type Output = bulwark_protocol::powerstore::ReadOutcome;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output> {
        match reply {
            Reply::PowerStore(response) => Progress::powerstore(self.on_response(from, response)),
            _ => Progress::Send(Vec::new()),
        }
    }
    fn resend(&self) -> Vec<(NodeId, ClientFrame)> {
        frames(self.retransmit())
    }
    fn answered(&self) -> Vec<NodeId> {
        ReadOp::answered(self)
    }
}

impl Operation for abd::WriteOp {
    type Output = abd::WriteOutcome;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output> {
        match reply {
            Reply::Abd(response) => Progress::abd(self.on_response(from, response)),
            _ => Progress::Send(Vec::new()),
        }
    }
    fn resend(&self) -> Vec<(NodeId, ClientFrame)> {
        abd_frames(self.retransmit())
    }
    fn answered(&self) -> Vec<NodeId> {
        abd::WriteOp::answered(self)
    }
}

impl Operation for abd::ReadOp {
    type Output = abd::ReadOutcome;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output> {
        match reply {
            Reply::Abd(response) => Progress::abd(self.on_response(from, response)),
            _ => Progress::Send(Vec::new()),
        }
    }
    fn resend(&self) -> Vec<(NodeId, ClientFrame)> {
        abd_frames(self.retransmit())
    }
    fn answered(&self) -> Vec<NodeId> {
        abd::ReadOp::answered(self)
    }
}

impl Operation for phalanx::WriteOp {
    type Output = phalanx::WriteOutcome;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output> {
        match reply {
            Reply::Phalanx(response) => Progress::phalanx(self.on_response(from, response)),
            _ => Progress::Send(Vec::new()),
        }
    }
    fn resend(&self) -> Vec<(NodeId, ClientFrame)> {
        phalanx_frames(self.retransmit())
    }
    fn answered(&self) -> Vec<NodeId> {
        phalanx::WriteOp::answered(self)
    }
}

impl Operation for phalanx::ReadOp {
    type Output = phalanx::ReadOutcome;
    fn feed(&mut self, from: NodeId, reply: Reply) -> Progress<Self::Output> {
        match reply {
            Reply::Phalanx(response) => Progress::phalanx(self.on_response(from, response)),
            _ => Progress::Send(Vec::new()),
        }
    }
    fn resend(&self) -> Vec<(NodeId, ClientFrame)> {
        phalanx_frames(self.retransmit())
    }
    fn answered(&self) -> Vec<NodeId> {
        phalanx::ReadOp::answered(self)
    }
}
