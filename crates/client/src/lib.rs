//! The Bulwark client library: the trusted side of the system.
//!
//! A [`Client`] keeps one authenticated connection per node (re-established in the background when
//! it drops) and drives one protocol machine per operation: it sends each round, feeds replies
//! back, retransmits to nodes that have not answered, and gives up at the deadline with an error
//! that names the nodes it could not reach. Safety never depends on these timings; they only
//! decide when to retry and when to stop waiting.

mod connection;

use bulwark_core::config::{ClientSecrets, ClusterConfig, parse_secrets};
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::{ClientId, Key, NodeId, OBJECT_BYTES_MAX};
use bulwark_protocol::powerstore::{
    ClientConfig, Evidence, OpId, Outbound, Pid, ProtocolError, ReadOp, Refusal, Request, Response,
    Step, WriteOp, WriterKeys,
};
use bulwark_protocol::service::{ClientFrame, NodeStatus};
use bytes::Bytes;
use connection::NodeLink;
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
    #[error("{path}: {source}")]
    File {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// TLS set-up failed.
    #[error("transport: {0}")]
    Transport(#[from] bulwark_transport::TransportError),
    /// The key is not a valid key.
    #[error("invalid key: {0}")]
    Key(#[from] bulwark_core::ids::KeyError),
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
    writer: Option<Arc<WriterKeys>>,
    links: Vec<NodeLink>,
    router: connection::Router,
    next_op: AtomicU64,
    session: u64,
    codec: Arc<dyn ErasureCodec>,
    /// How long an operation keeps trying.
    pub deadline: Duration,
}

fn read(path: &Path) -> Result<String, ClientError> {
    std::fs::read_to_string(path).map_err(|source| ClientError::File {
        path: path.to_path_buf(),
        source,
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
        Ok(Client {
            cluster: Arc::new(cluster),
            name: secrets.name,
            protocol,
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
        let Some(keys) = self.writer.clone() else {
            return Err(ClientError::NotWriter {
                name: self.name.clone(),
            });
        };
        let op = self.op_id();
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
        let n = self.protocol.n;
        let first = machine.start();
        let outcome = self.drive(op, &mut machine, first).await?;
        Ok(OpReport {
            answered: outcome.acknowledged_by,
            n,
            evidence: Vec::new(),
            restarts: 0,
            repaired: false,
        })
    }

    /// Reads `key`: `None` when it was never written or was deleted.
    pub async fn get(&self, key: &[u8]) -> Result<(Option<Bytes>, OpReport), ClientError> {
        let key = Key::new(key.to_vec())?;
        let op = self.op_id();
        let mut machine = ReadOp::new(self.protocol.clone(), self.codec.clone(), key.clone(), op);
        let n = self.protocol.n;
        let first = machine.start();
        let outcome = self.drive(op, &mut machine, first).await?;
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

    /// Drives one machine to completion or the deadline.
    async fn drive<O: Operation>(
        &self,
        op: OpId,
        machine: &mut O,
        first: Vec<Outbound>,
    ) -> Result<O::Output, ClientError> {
        let n = self.protocol.n;
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
                    let Some((from, response)) = reply else {
                        return Err(ClientError::Protocol("reply channel closed".into()));
                    };
                    match machine.feed(from, response) {
                        Step::Continue(outbound) => self.send_all(outbound),
                        Step::Done(result) => return result.map_err(protocol_error),
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
                        quorum: self.protocol.quorum(),
                        n,
                        unreachable,
                    });
                }
            }
        }
    }

    fn send_all(&self, outbound: Vec<Outbound>) {
        for (to, request) in outbound {
            if let Some(link) = self.links.get(to.index()) {
                link.send(&ClientFrame::PowerStore(request));
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
        let _registration = self.router.register(request.op, sender);
        self.links
            .get(to.index())?
            .send(&ClientFrame::PowerStore(request));
        tokio::time::timeout(wait, replies.recv())
            .await
            .ok()
            .flatten()
            .map(|(_, response)| response)
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

/// The two operation machines, seen alike by [`Client::drive`].
trait Operation {
    type Output;
    fn feed(&mut self, from: NodeId, response: Response) -> Step<Self::Output>;
    fn resend(&self) -> Vec<Outbound>;
    fn answered(&self) -> Vec<NodeId>;
}

impl Operation for WriteOp {
    type Output = bulwark_protocol::powerstore::WriteOutcome;
    fn feed(&mut self, from: NodeId, response: Response) -> Step<Self::Output> {
        self.on_response(from, response)
    }
    fn resend(&self) -> Vec<Outbound> {
        self.retransmit()
    }
    fn answered(&self) -> Vec<NodeId> {
        WriteOp::answered(self)
    }
}

impl Operation for ReadOp {
    type Output = bulwark_protocol::powerstore::ReadOutcome;
    fn feed(&mut self, from: NodeId, response: Response) -> Step<Self::Output> {
        self.on_response(from, response)
    }
    fn resend(&self) -> Vec<Outbound> {
        self.retransmit()
    }
    fn answered(&self) -> Vec<NodeId> {
        ReadOp::answered(self)
    }
}
