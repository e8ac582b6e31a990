//! Causal volumes (Depot) as a client takes part in them: a client is a member of the volume
//! with a log of its own, kept in its directory (`depot/`, a redb store), since Depot clients
//! are nodes (§3). A write is accepted and made durable here first, then handed to a server,
//! whose acknowledgement means it is durable there too; a read asks the servers in turn with
//! the compact hash of what the client holds, and takes only values that updates it verified
//! itself name. Nothing a server says is believed without a signature that checks.
//!
//! A volume's configuration (its members' keys and write prefixes, and its number, the hash of
//! the rest) is made from `cluster.toml` when the volume is created: its servers are the nodes
//! named then, its clients every client with a signing key, those that may write with the right
//! to every key. It is recorded in the system volume, and in the client's own store once used,
//! so that a client that has used a volume keeps using it whatever its servers do.

use crate::{Client, ClientError, OpReport, Serving, Volume};
use bulwark_core::membership::GroupView;
use bulwark_core::{Key, NodeId, ServiceId};
/// A causal volume's number.
pub use bulwark_protocol::depot::VolumeId;
use bulwark_protocol::depot::discard::Discard;
use bulwark_protocol::depot::node::{Output, ReadStart, VALUE_BYTES_MAX};
use bulwark_protocol::depot::records::{self, Recorder};
use bulwark_protocol::depot::served::{self, Call, Reply, Request};
use bulwark_protocol::depot::{
    Member, Message, Node, ReadResult, Role, Staleness, UpdateId, VolumeConfig, Writer,
};
use bulwark_storage::{Namespace, StorageOp, Store};
use bytes::Bytes;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The client's Depot store, in its directory.
pub const DEPOT_DIR: &str = "depot";
/// The store's table of configurations, by volume number (8 bytes, big-endian).
const CONFIGS: &str = "configs";
/// The store's table of volume names the client has used: name to volume number.
const NAMES: &str = "names";
/// The namespace group of the store's own tables: no volume's ([`served::group_of`] never
/// gives it).
const LOCAL: bulwark_core::GroupId = bulwark_core::GroupId(u32::MAX);
/// Messages exchanged with one server for one operation at most: a pull and the pushes it
/// makes, a put and the pull a server lacking its dependencies answers with.
const ROUNDS_MAX: usize = 64;

/// How long one call waits for a server before the operation moves to the next: a causal
/// volume never needs a particular server.
const CALL_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A causal volume's record in the system volume names its number; its configuration is
/// recorded beside it, under [`config_key`].
pub(crate) const CAUSAL: &str = "causal";

/// Where the system volume keeps the configuration of causal volume `volume`.
pub(crate) fn config_key(volume: VolumeId) -> Vec<u8> {
    let mut key = b"\0sys\0depot/".to_vec();
    key.extend_from_slice(format!("{:016x}", volume.0).as_bytes());
    key
}

/// The client's part in the causal volumes it uses.
#[derive(Default)]
pub(crate) struct Local {
    store: Option<Arc<Store>>,
    volumes: HashMap<VolumeId, Membership>,
}

/// One volume the client is a member of.
struct Membership {
    node: Node,
    recorder: Recorder,
    namespace: Namespace,
    /// The servers, in the order a read asks them.
    servers: Vec<(Writer, NodeId)>,
    /// Which server the next pull starts with: pulls go round the servers (from a random
    /// start), so that one faulty server cannot keep a client from what the others hold, the
    /// proofs of its own forks among them.
    turn: usize,
    /// Whether this client's log holds its own past: it restored an update of its own, or has
    /// since pulled from the servers. A client that lost its log (Depot's T10: a new machine
    /// with the old keys) signs nothing, not even a beacon, until then: an update after an
    /// older previous one than its last would fork its own history, and correct nodes would
    /// prove it and evict it.
    own_past: bool,
    /// When this client last looked for a discard proposal or consent to write (§6.6).
    discard_checked_micros: u64,
}

/// How often a client looks for a discard proposal to consent to, or its turn to propose: the
/// look reads its whole log.
const DISCARD_CHECK_MICROS: u64 = 60_000_000;

/// What one exchange with a server brought.
#[derive(Default)]
struct Exchanged {
    /// Reads that ended.
    reads: Vec<(u64, ReadResult)>,
    /// Puts the server acknowledged durable, by operation.
    acknowledged: Vec<u64>,
    /// Updates accepted from what it sent.
    learned: usize,
    /// Updates, values and puts refused from what it sent.
    refused: usize,
    /// What the node had to say to other members meanwhile (a read moving on to the next).
    elsewhere: Vec<(Writer, Message)>,
}

/// Who an exchange is with, and how requests reach it.
enum End<'a> {
    /// A server, through the client's links.
    Server(NodeId),
    /// A client serving its log, on a connection of its own.
    Client(&'a mut bulwark_transport::FramedStream),
}

/// Answers the member clients that connect to a client serving its log.
#[derive(Clone)]
struct PeerHandler {
    client: Arc<Client>,
    name: String,
    volume: VolumeId,
}

impl bulwark_transport::Handler for PeerHandler {
    async fn handle(&self, incoming: bulwark_transport::Incoming) -> bool {
        let bulwark_transport::Peer::Client(from) = incoming.from else {
            return false;
        };
        let header = incoming.envelope.header;
        if header.service != ServiceId::DEPOT
            || header.kind != bulwark_core::envelope::Kind::Request
        {
            return true;
        }
        let reply = match incoming
            .envelope
            .body::<Request>(bulwark_core::wire::FRAME_BYTES_MAX)
        {
            Ok(request) => {
                self.client
                    .answer_peer(&self.name, self.volume, from, request)
                    .await
            }
            Err(error) => Reply::Refused {
                reason: format!("malformed request: {error}"),
            },
        };
        let _ = incoming
            .replies
            .send(bulwark_core::envelope::frame(&header.reply(), &reply));
        true
    }
}

/// One request to a peer client on `stream`, and its reply.
async fn peer_call(
    stream: &mut bulwark_transport::FramedStream,
    header: &bulwark_core::envelope::Header,
    request: &Request,
) -> Result<Reply, ClientError> {
    use futures::{SinkExt, StreamExt};
    let failed = |problem: String| ClientError::Protocol(format!("a peer client: {problem}"));
    stream
        .send(bulwark_core::envelope::frame(header, request))
        .await
        .map_err(|error| failed(error.to_string()))?;
    let answer = tokio::time::timeout(CALL_WAIT, stream.next())
        .await
        .map_err(|_| failed("no answer in time".into()))?
        .ok_or_else(|| failed("the connection closed".into()))?
        .map_err(|error| failed(error.to_string()))?;
    let envelope = bulwark_core::envelope::Envelope::decode(answer.freeze())
        .map_err(|error| failed(error.to_string()))?;
    if envelope.header.op != header.op {
        return Err(failed("an answer to another request".into()));
    }
    envelope
        .body::<Reply>(bulwark_core::wire::FRAME_BYTES_MAX)
        .map_err(|error| failed(error.to_string()))
}

/// One version a causal read returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CausalVersion {
    /// The update that wrote it.
    pub id: UpdateId,
    /// Its writer's name in `cluster.toml`, or its member index.
    pub writer: String,
    /// Its logical clock.
    pub clock: u64,
    /// The value; `None` for a delete.
    pub value: Option<Bytes>,
}

/// What a causal read returns: every version of the key no other supersedes, newest first by
/// [`newest`]'s rule; more than one when writes were concurrent or a writer forked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CausalRead {
    /// The versions.
    pub versions: Vec<CausalVersion>,
    /// Versions whose values no member asked could give.
    pub unavailable: usize,
    /// Clients from whom this client has heard nothing within the volume's staleness bound:
    /// their latest writes may be missing (Depot §6.4).
    pub suspects: Vec<String>,
    /// Writers this client holds proof of forking against.
    pub forked: Vec<String>,
    /// The servers that answered.
    pub answered: Vec<NodeId>,
    /// The member clients that answered, asked for values no server gave.
    pub answered_by_clients: Vec<String>,
    /// Servers that passed on what this client refused (updates whose signatures or histories
    /// do not check, values no update names), with how many: faulty, or relaying for one.
    pub refused_from: Vec<(NodeId, usize)>,
}

impl CausalRead {
    /// The version a single-valued read returns: the highest clock, then the writer's name,
    /// then the update's id (the order `versions` is in). `None` when there is none or the
    /// newest is a delete.
    pub fn newest(&self) -> Option<&Bytes> {
        self.versions.first().and_then(|v| v.value.as_ref())
    }
}

/// One version of a key in a causal volume's history (Depot §6.6's versioning): current or
/// superseded, as this client's log holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CausalPast {
    /// The update that wrote it.
    pub id: UpdateId,
    /// Its writer's name in `cluster.toml`, or its member index.
    pub writer: String,
    /// Its logical clock.
    pub clock: u64,
    /// Its value's length; `None` for a delete.
    pub len: Option<u64>,
    /// No other version supersedes it: a read returns it.
    pub current: bool,
    /// Its value was dropped by every client's consent (§6.6): nobody serves it any more.
    pub discarded: bool,
}

/// What a causal write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CausalWrite {
    /// The update.
    pub id: UpdateId,
    /// The server that acknowledged it durable, if one did; it is durable in the client's own
    /// store either way and reaches the servers in a later exchange.
    pub acknowledged_by: Option<NodeId>,
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

fn local_error(problem: impl std::fmt::Display) -> ClientError {
    ClientError::Protocol(format!("the client's causal-volume store: {problem}"))
}

impl Client {
    /// The configuration of a new causal volume `name` served by `servers`: every client of
    /// `cluster.toml` with a signing key is a member, the writers with the right to every key.
    pub fn causal_config(
        &self,
        name: &str,
        servers: &[NodeId],
    ) -> Result<VolumeConfig, ClientError> {
        let mut members = Vec::new();
        for id in servers {
            let entry = self.cluster.node(*id).ok_or_else(|| ClientError::Volume {
                name: String::new(),
                problem: format!("{id} is not in cluster.toml"),
            })?;
            let key = bulwark_core::sign::PublicKey::from_bytes(&entry.signing_key)
                .map_err(|error| ClientError::Protocol(format!("{id}'s signing key: {error}")))?;
            members.push(Member {
                key,
                role: Role::Server,
                writes: Vec::new(),
            });
        }
        for client in &self.cluster.clients {
            let Some(key) = client.signing_key else {
                continue;
            };
            let key = bulwark_core::sign::PublicKey::from_bytes(&key).map_err(|error| {
                ClientError::Protocol(format!("{}'s signing key: {error}", client.name))
            })?;
            members.push(Member {
                key,
                role: Role::Client,
                writes: if client.write {
                    vec![Vec::new()]
                } else {
                    Vec::new()
                },
            });
        }
        let config = VolumeConfig::new(name, members, Staleness::default());
        config
            .check()
            .map_err(|problem| ClientError::Protocol(format!("a causal volume: {problem}")))?;
        Ok(config)
    }

    /// Creates causal volume `name` on `servers` (every node of `cluster.toml` when empty):
    /// each is asked to serve it, and the volume is recorded once at least one does.
    pub async fn create_causal_volume(
        &self,
        name: &str,
        servers: &[NodeId],
    ) -> Result<(Volume, OpReport), ClientError> {
        Volume::check_name(name)?;
        let servers: Vec<NodeId> = if servers.is_empty() {
            self.cluster
                .nodes
                .iter()
                .map(|node| NodeId(node.id))
                .collect()
        } else {
            servers.to_vec()
        };
        let config = self.causal_config(name, &servers)?;
        let volume = config.volume;
        if let Some(existing) = self.existing(name).await?
            && existing.serving != (Serving::Causal { volume })
        {
            return Err(ClientError::Volume {
                name: name.to_string(),
                problem: format!("exists already, served by {}", existing.serving),
            });
        }
        let mut opened = Vec::new();
        let mut refusals = Vec::new();
        for server in &servers {
            let request = Request::Open {
                config: config.clone(),
            };
            match self.call(*server, volume, request).await {
                Ok(Reply::Opened { .. }) => opened.push(*server),
                Ok(other) => refusals.push(format!("{server} answered {other:?}")),
                Err(error) => refusals.push(format!("{server}: {error}")),
            }
        }
        if opened.is_empty() {
            return Err(ClientError::Volume {
                name: name.to_string(),
                problem: format!("no server would serve it: {}", refusals.join("; ")),
            });
        }
        for refusal in &refusals {
            tracing::warn!(volume = name, %refusal, "a server did not open the causal volume");
        }
        self.write_system(&config_key(volume), Bytes::from(wire_encode(&config)))
            .await?;
        self.remember_causal(name, &config)?;
        let (volume, mut report) = self.record_volume(name, Serving::Causal { volume }).await?;
        report.answered = opened;
        report.n = servers.len();
        Ok((volume, report))
    }

    /// The configuration of causal volume `volume`: from the client's own store, or else from
    /// the system volume, checked against its number.
    pub(crate) async fn causal_volume_config(
        &self,
        name: &str,
        volume: VolumeId,
    ) -> Result<VolumeConfig, ClientError> {
        if let Some(config) = self.stored_config(volume)? {
            return Ok(config);
        }
        let (record, _) = self.read_system(&config_key(volume)).await?;
        let problem = |problem: String| ClientError::Volume {
            name: name.to_string(),
            problem,
        };
        let record = record.ok_or_else(|| problem("its configuration is not recorded".into()))?;
        let config: VolumeConfig =
            bulwark_core::wire::decode(&record, bulwark_core::wire::FRAME_BYTES_MAX)
                .map_err(|error| problem(format!("its configuration: {error}")))?;
        config
            .check()
            .map_err(|error| problem(format!("its configuration: {error}")))?;
        if config.volume != volume {
            return Err(problem("its configuration is another volume's".into()));
        }
        self.remember_causal(name, &config)?;
        Ok(config)
    }

    /// The causal volume this client used under `name` before, from its own store.
    pub(crate) fn remembered_causal(&self, name: &str) -> Result<Option<VolumeId>, ClientError> {
        let Some(store) = self.causal_store(false)? else {
            return Ok(None);
        };
        let table = Namespace::new(ServiceId::DEPOT, LOCAL).table(NAMES);
        Ok(store
            .get(table, name.as_bytes())
            .map_err(local_error)?
            .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_ref()).ok())
            .map(|bytes| VolumeId(u64::from_be_bytes(bytes))))
    }

    fn stored_config(&self, volume: VolumeId) -> Result<Option<VolumeConfig>, ClientError> {
        let Some(store) = self.causal_store(false)? else {
            return Ok(None);
        };
        let table = Namespace::new(ServiceId::DEPOT, LOCAL).table(CONFIGS);
        let Some(record) = store
            .get(table, &volume.0.to_be_bytes())
            .map_err(local_error)?
        else {
            return Ok(None);
        };
        let config: VolumeConfig =
            bulwark_core::wire::decode(&record, bulwark_core::wire::FRAME_BYTES_MAX)
                .map_err(local_error)?;
        config.check().map_err(local_error)?;
        if config.volume != volume {
            return Err(local_error("a configuration stored under another number"));
        }
        Ok(Some(config))
    }

    /// Keeps `config` and `name` in the client's own store.
    fn remember_causal(&self, name: &str, config: &VolumeConfig) -> Result<(), ClientError> {
        let Some(store) = self.causal_store(true)? else {
            return Ok(());
        };
        let node_wide = Namespace::new(ServiceId::DEPOT, LOCAL);
        store
            .apply(&[
                StorageOp::Put {
                    table: node_wide.table(CONFIGS),
                    key: config.volume.0.to_be_bytes().to_vec(),
                    value: Bytes::from(wire_encode(config)),
                },
                StorageOp::Put {
                    table: node_wide.table(NAMES),
                    key: name.as_bytes().to_vec(),
                    value: Bytes::copy_from_slice(&config.volume.0.to_be_bytes()),
                },
            ])
            .map_err(local_error)
    }

    /// The client's Depot store, opened once; `None` for a client without a directory, or,
    /// unless `create`, one that has none yet.
    fn causal_store(&self, create: bool) -> Result<Option<Arc<Store>>, ClientError> {
        let Some(dir) = &self.depot_dir else {
            return Ok(None);
        };
        let mut local = self
            .causal_local
            .lock()
            .map_err(|_| local_error("poisoned"))?;
        if let Some(store) = &local.store {
            return Ok(Some(store.clone()));
        }
        if !create && !dir.exists() {
            return Ok(None);
        }
        std::fs::create_dir_all(dir).map_err(|error| ClientError::File {
            path: dir.clone(),
            error,
        })?;
        let store = Arc::new(
            Store::open(dir).map_err(|error| local_error(format!("{}: {error}", dir.display())))?,
        );
        local.store = Some(store.clone());
        Ok(Some(store))
    }

    /// This client's node of `config`'s volume, restored from its store the first time.
    fn causal_member(&self, config: &VolumeConfig) -> Result<Membership, ClientError> {
        let store = self.causal_store(true)?.ok_or_else(|| {
            ClientError::Protocol(
                "causal volumes need a client directory to keep the client's log in".into(),
            )
        })?;
        let secret = self.signing.clone().ok_or_else(|| ClientError::NotWriter {
            name: self.name.clone(),
        })?;
        let me = config
            .member_with(&secret.public_key())
            .filter(|writer| config.member(*writer).map(|m| m.role) == Some(Role::Client))
            .ok_or_else(|| ClientError::Volume {
                name: format!("{:016x}", config.volume.0),
                problem: format!("client {:?} is not a member", self.name),
            })?;
        let namespace = Namespace::new(ServiceId::DEPOT, served::group_of(config.volume));
        let tables =
            records::Tables::load(|table| store.load(namespace.table(table)).map_err(local_error))?;
        let (changes, recorder) = records::restore(tables).map_err(local_error)?;
        let node = Node::restore(
            Arc::new(config.clone()),
            me,
            (*secret).clone(),
            &changes,
            now_micros(),
        );
        let peers_of = |writer: Writer| {
            let key = config.member(writer)?.key.to_bytes();
            self.cluster
                .nodes
                .iter()
                .find(|node| node.signing_key == key)
                .map(|node| NodeId(node.id))
        };
        let mut servers: Vec<(Writer, NodeId)> = config
            .servers()
            .filter_map(|writer| Some((writer, peers_of(writer)?)))
            .collect();
        // Clients start with different servers, so that no one server carries every client.
        if !servers.is_empty() {
            let turn = (self.id.0 as usize) % servers.len();
            servers.rotate_left(turn);
        }
        let own_past = !node.log().frontier().heads(me).is_empty();
        Ok(Membership {
            node,
            recorder,
            namespace,
            servers,
            own_past,
            turn: rand::random::<u32>() as usize,
            discard_checked_micros: 0,
        })
    }

    /// The volume's servers in the order to try them: those proven to have forked last (§4.7:
    /// evicted, but a client with nowhere else to go still tries them).
    fn servers_in_order(member: &Membership) -> Vec<(Writer, NodeId)> {
        let forks = member.node.log().forks();
        let (mut trusted, evicted): (Vec<_>, Vec<_>) = member
            .servers
            .iter()
            .copied()
            .partition(|(writer, _)| !forks.contains_key(writer));
        trusted.extend(evicted);
        trusted
    }

    /// Makes `out`'s changes durable in the client's store, in order.
    fn persist(&self, member: &mut Membership, out: &Output) -> Result<(), ClientError> {
        if out.changes.is_empty() {
            return Ok(());
        }
        let store = self
            .causal_store(true)?
            .ok_or_else(|| local_error("no store"))?;
        let ops: Vec<StorageOp> = out
            .changes
            .iter()
            .flat_map(|change| member.recorder.record(change))
            .map(|record| {
                let table = member.namespace.table(record.table);
                StorageOp::set(table, record.key, record.value)
            })
            .collect();
        store.apply(&ops).map_err(local_error)
    }

    /// One request to `server` about `volume`, and its reply.
    async fn call(
        &self,
        server: NodeId,
        volume: VolumeId,
        request: Request,
    ) -> Result<Reply, ClientError> {
        let view = GroupView::new(served::group_of(volume), self.epoch(), vec![server])
            .map_err(|error| ClientError::Protocol(error.to_string()))?;
        let mut machine = Call::new(self.op_id().0, request);
        let name = format!("{:016x}", volume.0);
        let wait = CALL_WAIT.min(self.deadline);
        match tokio::time::timeout(wait, self.drive(&view, &name, 0, &mut machine)).await {
            Ok(answer) => answer,
            Err(_) => Err(ClientError::Unavailable {
                deadline: wait,
                answered: 0,
                quorum: 1,
                n: 1,
                unreachable: self
                    .cluster
                    .node(server)
                    .map(|node| vec![(server, node.address)])
                    .unwrap_or_default(),
                stalled: None,
            }),
        }
    }

    /// Sends `message` to server `to` and feeds every answer back to the node, with what the
    /// node says to that server in turn, until it says nothing more to it.
    async fn exchange(
        &self,
        member: &mut Membership,
        to: (Writer, NodeId),
        message: Message,
    ) -> Result<Exchanged, ClientError> {
        let label = to.1.to_string();
        self.exchange_via(member, to.0, &label, message, &mut End::Server(to.1))
            .await
    }

    /// One request to `end`, and its reply.
    async fn send_to(
        &self,
        end: &mut End<'_>,
        volume: VolumeId,
        request: Request,
    ) -> Result<Reply, ClientError> {
        match end {
            End::Server(node) => self.call(*node, volume, request).await,
            End::Client(stream) => {
                let header = bulwark_core::envelope::Header::request(
                    ServiceId::DEPOT,
                    served::group_of(volume),
                    self.epoch(),
                    self.op_id().0,
                );
                peer_call(stream, &header, &request).await
            }
        }
    }

    /// [`Client::exchange`] with member `to` (`label` names it in logs), whatever carries the
    /// requests: `send` answers one request with the reply.
    async fn exchange_via(
        &self,
        member: &mut Membership,
        to: Writer,
        label: &str,
        message: Message,
        end: &mut End<'_>,
    ) -> Result<Exchanged, ClientError> {
        let volume = member.node.log().config().volume;
        let mut queue = vec![message];
        let mut exchanged = Exchanged::default();
        let mut rounds = 0;
        while let Some(message) = queue.pop() {
            rounds += 1;
            if rounds > ROUNDS_MAX {
                tracing::warn!(peer = label, "a causal exchange reached its bound");
                break;
            }
            let reply = self
                .send_to(end, volume, Request::Exchange { volume, message })
                .await?;
            let Reply::Exchange { messages, .. } = reply else {
                return Err(ClientError::Protocol(format!(
                    "{label} answered an exchange with {reply:?}"
                )));
            };
            for answer in messages.into_iter().take(ROUNDS_MAX) {
                if let Message::PutAck { op, .. } = &answer {
                    exchanged.acknowledged.push(*op);
                }
                let out = member.node.on_message(to, answer, now_micros());
                self.persist(member, &out)?;
                for refusal in &out.refused {
                    tracing::warn!(peer = label, %refusal, "refused what a causal peer sent");
                }
                exchanged.refused += out.refused.len();
                exchanged.learned += out
                    .changes
                    .iter()
                    .filter(|change| matches!(change, bulwark_protocol::depot::Change::Update(..)))
                    .count();
                exchanged.reads.extend(out.reads);
                for (peer, next) in out.sends {
                    if peer == to {
                        queue.insert(0, next);
                    } else {
                        exchanged.elsewhere.push((peer, next));
                    }
                }
            }
        }
        Ok(exchanged)
    }

    /// The member client `client` is of `config`'s volume.
    fn client_member(
        &self,
        config: &VolumeConfig,
        client: bulwark_core::ClientId,
    ) -> Option<Writer> {
        let entry = self
            .cluster
            .clients
            .iter()
            .find(|entry| entry.id == client.0)?;
        let key = bulwark_core::sign::PublicKey::from_bytes(&entry.signing_key?).ok()?;
        config
            .member_with(&key)
            .filter(|writer| config.member(*writer).map(|m| m.role) == Some(Role::Client))
    }

    /// Exchanges this client's log of causal volume `volume` (named `name`) with member client
    /// `peer`, which serves its own at `address` (`bulwark volume serve`): pulls what it lacks
    /// and pushes back what the peer lacks (Depot §5.6, when no server answers). The updates
    /// learned.
    pub async fn sync_causal_with_client(
        &self,
        name: &str,
        volume: VolumeId,
        peer: &str,
        address: std::net::SocketAddr,
    ) -> Result<usize, ClientError> {
        let (peer_id, mut stream) = self.connect_peer(name, peer, address).await?;
        self.with_causal(
            name,
            volume,
            async |client: &Client, member: &mut Membership| {
                let to = client
                    .client_member(member.node.log().config(), peer_id)
                    .ok_or_else(|| ClientError::Volume {
                        name: name.to_string(),
                        problem: format!("client {peer:?} is not a member"),
                    })?;
                client.beacon_if_due(member)?;
                let mut pull = member.node.pull(to);
                // The values too: no server may be there to give them at read time.
                if let Message::Pull { values, .. } = &mut pull {
                    *values = true;
                }
                let exchanged = client
                    .exchange_via(member, to, peer, pull, &mut End::Client(&mut stream))
                    .await?;
                Ok(exchanged.learned)
            },
        )
        .await
    }

    /// Names member client `peer` as serving its logs of causal volumes at `address` (`bulwark
    /// volume serve`): a read asks it, after every server, for the values of its own updates
    /// that no server gave (Depot §5.7).
    pub fn add_causal_peer(&self, peer: &str, address: std::net::SocketAddr) {
        if let Ok(mut peers) = self.causal_peers.lock() {
            peers.insert(peer.to_string(), address);
        }
    }

    /// A connection to client `peer` at `address`, checked against its pinned certificate.
    async fn connect_peer(
        &self,
        volume: &str,
        peer: &str,
        address: std::net::SocketAddr,
    ) -> Result<(bulwark_core::ClientId, bulwark_transport::FramedStream), ClientError> {
        let (peer_id, entry) = self
            .cluster
            .client(peer)
            .ok_or_else(|| ClientError::Volume {
                name: volume.to_string(),
                problem: format!("no client named {peer:?} in cluster.toml"),
            })?;
        let stream = self
            .connector
            .connect(address, entry.fingerprint)
            .await
            .map_err(ClientError::Transport)?;
        Ok((peer_id, stream))
    }

    /// One exchange with member client `to`, if it is one this client was told serves its log
    /// ([`Client::add_causal_peer`]); the peer's name and what the exchange brought.
    async fn exchange_with_peer(
        &self,
        member: &mut Membership,
        to: Writer,
        message: Message,
    ) -> Result<(String, Exchanged), ClientError> {
        let config = member.node.log().config().clone();
        let known: Vec<(String, std::net::SocketAddr)> = self
            .causal_peers
            .lock()
            .map_err(|_| local_error("poisoned"))?
            .iter()
            .map(|(name, address)| (name.clone(), *address))
            .collect();
        let (peer, address) = known
            .into_iter()
            .find(|(name, _)| {
                self.cluster
                    .client(name)
                    .and_then(|(id, _)| self.client_member(&config, id))
                    == Some(to)
            })
            .ok_or_else(|| {
                ClientError::Protocol(format!(
                    "member {} is a client whose address this client was not given",
                    to.0
                ))
            })?;
        let (_, mut stream) = self.connect_peer(&config.label, &peer, address).await?;
        let exchanged = self
            .exchange_via(member, to, &peer, message, &mut End::Client(&mut stream))
            .await?;
        Ok((peer, exchanged))
    }

    /// Opens this client's log of causal volume `volume` (named `name`): an error says why this
    /// client cannot take part (no directory, no signing key, not a member).
    pub async fn open_causal(&self, name: &str, volume: VolumeId) -> Result<(), ClientError> {
        self.with_causal(name, volume, async |_: &Client, _: &mut Membership| Ok(()))
            .await
    }

    /// Serves this client's log of causal volume `volume` (named `name`) to the volume's other
    /// member clients that connect to `listener` with their pinned certificates, as a server
    /// does (Depot §5.6: clients exchange with each other when no server answers); `identity`
    /// is this client's TLS identity. Runs until `stop` resolves.
    pub async fn serve_causal_peers(
        self: &Arc<Self>,
        name: &str,
        volume: VolumeId,
        listener: tokio::net::TcpListener,
        identity: &bulwark_transport::Identity,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), ClientError> {
        self.open_causal(name, volume).await?;
        let peers = self
            .cluster
            .clients
            .iter()
            .filter(|entry| entry.id != self.id.0)
            .map(|entry| {
                (
                    entry.fingerprint,
                    bulwark_transport::Peer::Client(bulwark_core::ClientId(entry.id)),
                )
            })
            .collect();
        let inbound = Arc::new(
            bulwark_transport::Inbound::new(identity, peers).map_err(ClientError::Transport)?,
        );
        let handler = PeerHandler {
            client: self.clone(),
            name: name.to_string(),
            volume,
        };
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut stop => return Ok(()),
            };
            let Ok((tcp, _)) = accepted else {
                continue;
            };
            let inbound = inbound.clone();
            let handler = handler.clone();
            tokio::spawn(async move {
                if let Err(error) = inbound.serve(tcp, handler).await {
                    tracing::debug!(%error, "a peer client's connection ended");
                }
            });
        }
    }

    /// One request of member client `from`, answered as a server answers it.
    async fn answer_peer(
        &self,
        name: &str,
        volume: VolumeId,
        from: bulwark_core::ClientId,
        request: Request,
    ) -> Reply {
        let answered = self
            .with_causal(
                name,
                volume,
                async |client: &Client, member: &mut Membership| {
                    let config = member.node.log().config().clone();
                    let Some(peer) = client.client_member(&config, from) else {
                        return Ok(Reply::Refused {
                            reason: format!("client {} is not a member", from.0),
                        });
                    };
                    let Request::Exchange {
                        volume: asked,
                        message,
                    } = request
                    else {
                        return Ok(Reply::Refused {
                            reason: "a client serves exchanges only".into(),
                        });
                    };
                    if asked != config.volume {
                        return Ok(Reply::Refused {
                            reason: format!("volume {:016x} is not served here", asked.0),
                        });
                    }
                    let out = member.node.on_message(peer, message, now_micros());
                    // Durable before the answer leaves, as on a server.
                    client.persist(member, &out)?;
                    let messages = out
                        .sends
                        .into_iter()
                        .filter(|(to, _)| *to == peer)
                        .map(|(_, message)| message)
                        .collect();
                    Ok(Reply::Exchange {
                        volume: asked,
                        messages,
                    })
                },
            )
            .await;
        answered.unwrap_or_else(|error| Reply::Refused {
            reason: error.to_string(),
        })
    }

    /// Brings this client's log up to date with the first server that answers, starting with
    /// the next in turn, sending it what it lacks; the server that answered.
    async fn sync(&self, member: &mut Membership) -> Option<NodeId> {
        let mut servers = Self::servers_in_order(member);
        let trusted = servers
            .iter()
            .filter(|(writer, _)| !member.node.log().forks().contains_key(writer))
            .count();
        if trusted > 0 {
            servers[..trusted].rotate_left(member.turn % trusted);
        }
        member.turn = member.turn.wrapping_add(1);
        for server in servers {
            let pull = member.node.pull(server.0);
            match self.exchange(member, server, pull).await {
                Ok(_) => return Some(server.1),
                Err(error) => {
                    tracing::debug!(server = %server.1, %error, "a server did not answer a pull")
                }
            }
        }
        None
    }

    /// Learns this client's own past, when its log does not hold it, from every server that
    /// answers a pull (its last update may have reached one server only, and gossip may not have
    /// carried it yet); whether the log now holds it. With no server answering it stays unknown.
    async fn recover(&self, member: &mut Membership) -> bool {
        if member.own_past {
            return true;
        }
        let mut answered = 0;
        for server in Self::servers_in_order(member) {
            let pull = member.node.pull(server.0);
            match self.exchange(member, server, pull).await {
                Ok(_) => answered += 1,
                Err(error) => {
                    tracing::debug!(server = %server.1, %error, "a server did not answer a pull")
                }
            }
        }
        let me = member.node.me();
        let own = member.node.log().frontier().heads(me).len();
        tracing::info!(
            answered,
            own_heads = own,
            "this client's log held nothing of its own: learned its past from the servers"
        );
        member.own_past = answered > 0 || own > 0;
        member.own_past
    }

    /// Runs `f` on this client's member of causal volume `name` (`volume`), one operation at a
    /// time per client.
    async fn with_causal<T>(
        &self,
        name: &str,
        volume: VolumeId,
        f: impl AsyncFnOnce(&Client, &mut Membership) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let _one = self.causal_turn.lock().await;
        let taken = self
            .causal_local
            .lock()
            .map_err(|_| local_error("poisoned"))?
            .volumes
            .remove(&volume);
        let mut member = match taken {
            Some(member) => member,
            None => {
                let config = self.causal_volume_config(name, volume).await?;
                self.causal_member(&config)?
            }
        };
        self.recover(&mut member).await;
        let result = f(self, &mut member).await;
        if let Ok(mut local) = self.causal_local.lock() {
            local.volumes.insert(volume, member);
        }
        result
    }

    /// Writes `value` (`None`: deletes) under `key` of causal volume `volume` (named `name`):
    /// after catching up with a server, so that the write supersedes what that server holds;
    /// accepted and durable in the client's store, then acknowledged durable by a server.
    pub async fn causal_write(
        &self,
        name: &str,
        volume: VolumeId,
        key: &[u8],
        value: Option<Bytes>,
    ) -> Result<CausalWrite, ClientError> {
        let key = causal_key(key)?;
        if let Some(value) = &value
            && value.len() > VALUE_BYTES_MAX
        {
            return Err(ClientError::TooLarge {
                len: value.len(),
                max: VALUE_BYTES_MAX,
            });
        }
        self.with_causal(name, volume, async |client: &Client, member: &mut Membership| {
            if !member.own_past {
                return Err(ClientError::Volume {
                    name: name.to_string(),
                    problem: "this client's log holds none of its own updates and no server \
                              answered to give them back: a write now could fork its history"
                        .to_string(),
                });
            }
            client.beacon_if_due(member)?;
            client.sync(member).await;
            let (update, out) = member.node.write(key, value, now_micros());
            client.persist(member, &out)?;
            let id = update.id();
            let mut acknowledged_by = None;
            for server in Self::servers_in_order(member) {
                let op = client.op_id().0;
                let Some(put) = member.node.put_message(op, &id) else {
                    break;
                };
                match client.exchange(member, server, put).await {
                    Ok(exchanged) if exchanged.acknowledged.contains(&op) => {
                        acknowledged_by = Some(server.1);
                        break;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(server = %server.1, %error, "a server did not take a put")
                    }
                }
            }
            Ok(CausalWrite {
                id,
                acknowledged_by,
            })
        })
        .await
    }

    /// Writes this client's beacon when the last is older than the volume's announce interval
    /// (§6.4): a client that writes or reads is heard from.
    fn beacon_if_due(&self, member: &mut Membership) -> Result<(), ClientError> {
        if !member.own_past {
            return Ok(());
        }
        let now = now_micros();
        let me = member.node.me();
        let announce_ms = member.node.log().config().staleness.announce_ms;
        let due = member
            .node
            .log()
            .beacon(me)
            .is_none_or(|last| (now / 1000).saturating_sub(last) >= announce_ms);
        if due {
            let (_, out) = member.node.beacon(now);
            self.persist(member, &out)?;
        }
        self.discard_if_due(member, now)
    }

    /// Writes this client's consent to a proposal its ladder agrees with, or on its turn a
    /// proposal, at most once a minute (§6.6); the next exchange with a server carries it.
    fn discard_if_due(&self, member: &mut Membership, now: u64) -> Result<(), ClientError> {
        if now.saturating_sub(member.discard_checked_micros) < DISCARD_CHECK_MICROS {
            return Ok(());
        }
        member.discard_checked_micros = now;
        if let Some(discard) = member.node.discard_due(now) {
            match &discard {
                Discard::Propose { ids, .. } => {
                    tracing::info!(
                        versions = ids.len(),
                        "proposing to discard old versions' values"
                    )
                }
                Discard::Consent(proposal) => {
                    tracing::info!(?proposal, "consenting to a discard proposal")
                }
            }
            let (_, out) = member.node.write_discard(&discard, now);
            self.persist(member, &out)?;
        }
        // A proposal this client agreed to, a whole turn old and still short of a consent: a
        // client refuses, or is down or cut off; discard waits for it (§6.6), and an
        // administrator should know. (One this client refused itself is premature by its own
        // ladder: the others are right to withhold too.)
        let turn = member.node.ladder().turn(now);
        let config = member.node.log().config().clone();
        let me = member.node.me();
        for pending in member.node.discard_pending() {
            if pending.turn.saturating_add(1) < turn && !pending.missing.contains(&me) {
                let missing: Vec<String> = pending
                    .missing
                    .iter()
                    .map(|w| self.member_name(&config, *w))
                    .collect();
                tracing::warn!(
                    proposer = %self.member_name(&config, pending.proposer),
                    turn = pending.turn,
                    versions = pending.versions,
                    missing = %missing.join(","),
                    "a discard proposal lacks consent a turn later: discard waits for these clients"
                );
            }
        }
        Ok(())
    }

    /// Reads `key` of causal volume `volume` (named `name`): every version no other supersedes.
    pub async fn causal_read(
        &self,
        name: &str,
        volume: VolumeId,
        key: &[u8],
    ) -> Result<CausalRead, ClientError> {
        let key = causal_key(key)?;
        self.with_causal(
            name,
            volume,
            async |client: &Client, member: &mut Membership| {
                client.beacon_if_due(member)?;
                let op = client.op_id().0;
                let servers: Vec<Writer> = Self::servers_in_order(member)
                    .iter()
                    .map(|(w, _)| *w)
                    .collect();
                let mut answered = Vec::new();
                let mut answered_by_clients = Vec::new();
                let mut refused_from = Vec::new();
                let mut result = None;
                let mut next = match member.node.start_read(op, key, &servers, now_micros()) {
                    ReadStart::Done(done) => {
                        result = Some(done);
                        None
                    }
                    ReadStart::Ask(to, message) => Some((to, *message)),
                };
                let mut asks = 0;
                while let Some((to, message)) = next.take() {
                    asks += 1;
                    let server = member.servers.iter().copied().find(|(w, _)| *w == to);
                    let outcome = match server {
                        _ if asks > ROUNDS_MAX => {
                            Err(ClientError::Protocol("a read asked too many members".into()))
                        }
                        Some(server) => client
                            .exchange(member, server, message)
                            .await
                            .map(|r| (Ok(server), r)),
                        // A writer client, asked last for a value it hoards (§5.7).
                        None => client
                            .exchange_with_peer(member, to, message)
                            .await
                            .map(|(name, r)| (Err(name), r)),
                    };
                    match outcome {
                        Ok((by, exchanged)) => {
                            match by {
                                Ok(server) => {
                                    answered.push(server.1);
                                    if exchanged.refused > 0 {
                                        refused_from.push((server.1, exchanged.refused));
                                    }
                                }
                                Err(name) => answered_by_clients.push(name),
                            }
                            let mut reads = exchanged.reads.into_iter();
                            if let Some((_, done)) = reads.find(|(of, _)| *of == op) {
                                result = Some(done);
                            } else if let Some(ask) = exchanged.elsewhere.into_iter().find(
                                |(_, message)| matches!(message, Message::Get { op: of, .. } if *of == op),
                            ) {
                                // The answer moved the read on to another member.
                                next = Some(ask);
                                continue;
                            }
                        }
                        Err(error) => {
                            tracing::debug!(%error, "a member did not answer a read");
                        }
                    }
                    if result.is_none() {
                        // Unanswered, or answered without ending the read: the next member.
                        let out = member.node.read_timeout(op, now_micros());
                        client.persist(member, &out)?;
                        if let Some((_, done)) = out.reads.into_iter().find(|(of, _)| *of == op) {
                            result = Some(done);
                        }
                        next = out.sends.into_iter().next();
                    }
                }
                let result = result
                    .ok_or_else(|| ClientError::Protocol("a read that never ended".into()))?;
                let mut read = client.causal_result(member, result, answered);
                read.answered_by_clients = answered_by_clients;
                read.refused_from = refused_from;
                Ok(read)
            },
        )
        .await
    }

    /// A read's result with writers named and versions newest first.
    fn causal_result(
        &self,
        member: &Membership,
        result: ReadResult,
        answered: Vec<NodeId>,
    ) -> CausalRead {
        let config = member.node.log().config().clone();
        let name = |writer: Writer| self.member_name(&config, writer);
        let mut versions: Vec<CausalVersion> = result
            .versions
            .into_iter()
            .map(|version| CausalVersion {
                id: version.id,
                writer: name(version.writer),
                clock: version.clock,
                value: version.value,
            })
            .collect();
        versions.sort_by(|a, b| (b.clock, &b.writer, b.id).cmp(&(a.clock, &a.writer, a.id)));
        CausalRead {
            versions,
            unavailable: result.unavailable.len(),
            suspects: result.suspects.into_iter().map(name).collect(),
            forked: member.node.log().forks().keys().map(|w| name(*w)).collect(),
            answered,
            answered_by_clients: Vec::new(),
            refused_from: Vec::new(),
        }
    }

    /// A member's name: its client's or node's in `cluster.toml`, or its index.
    fn member_name(&self, config: &VolumeConfig, writer: Writer) -> String {
        let Some(member) = config.member(writer) else {
            return format!("member {}", writer.0);
        };
        let key = member.key.to_bytes();
        if let Some(client) = self
            .cluster
            .clients
            .iter()
            .find(|client| client.signing_key == Some(key))
        {
            return client.name.clone();
        }
        if let Some(node) = self
            .cluster
            .nodes
            .iter()
            .find(|node| node.signing_key == key)
        {
            return format!("node {}", node.id);
        }
        format!("member {}", writer.0)
    }

    /// The keys of causal volume `volume` (named `name`) that start with `prefix`, come after
    /// `after` and whose versions are not all deletes, in key order, at most `limit`, after
    /// catching up with a server (the one that answered, if one did). Each comes with what this
    /// client holds of it: the versions whose values it has, and how many it lacks the values of
    /// (`unavailable`; a read of that key fetches them).
    pub async fn causal_list(
        &self,
        name: &str,
        volume: VolumeId,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<(Vec<(Key, CausalRead)>, Option<NodeId>), ClientError> {
        let after = after
            .map(|after| Key::new(after.to_vec()))
            .transpose()
            .map_err(|error| ClientError::Volume {
                name: name.to_string(),
                problem: format!("a listing's starting point: {error}"),
            })?;
        self.with_causal(
            name,
            volume,
            async |client: &Client, member: &mut Membership| {
                client.beacon_if_due(member)?;
                let answered = client.sync(member).await;
                let now = now_micros();
                let log = member.node.log();
                let listed: Vec<(Key, ReadResult)> = log
                    .keys_after(after.as_ref())
                    .skip_while(|key| key.as_bytes() < prefix)
                    .take_while(|key| key.as_bytes().starts_with(prefix))
                    .filter(|key| !key.as_bytes().starts_with(&[0]))
                    .filter_map(|key| {
                        let held = member.node.held(key, now);
                        let live = !held.unavailable.is_empty()
                            || held.versions.iter().any(|v| v.value.is_some());
                        live.then(|| (key.clone(), held))
                    })
                    .take(limit)
                    .collect();
                let keys = listed
                    .into_iter()
                    .map(|(key, held)| (key, client.causal_result(member, held, Vec::new())))
                    .collect();
                Ok((keys, answered))
            },
        )
        .await
    }
}

impl Client {
    /// Every version of `key` in causal volume `volume` (named `name`) this client's log holds
    /// after an exchange with a server, superseded ones too, newest first (by clock, then
    /// writer, then update): what an overwritten or deleted value can be recovered from.
    pub async fn causal_versions(
        &self,
        name: &str,
        volume: VolumeId,
        key: &[u8],
    ) -> Result<Vec<CausalPast>, ClientError> {
        let key = causal_key(key)?;
        self.with_causal(
            name,
            volume,
            async |client: &Client, member: &mut Membership| {
                client.beacon_if_due(member)?;
                client.sync(member).await;
                Ok(client.history(member, &key))
            },
        )
        .await
    }

    /// The value of the version of `key` whose update id starts with the hex digits `id` (at
    /// least 8, naming one version), from this client's log or else from the servers in turn,
    /// checked against its hash; `None` for a delete.
    pub async fn causal_read_version(
        &self,
        name: &str,
        volume: VolumeId,
        key: &[u8],
        id: &str,
    ) -> Result<(CausalPast, Option<Bytes>), ClientError> {
        let key = causal_key(key)?;
        let problem = |problem: String| ClientError::Volume {
            name: name.to_string(),
            problem,
        };
        let prefix = id.to_ascii_lowercase();
        if prefix.len() < 8 || prefix.len() > 64 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(problem(format!(
                "a version is named by 8 to 64 hex digits of its id, not {id:?}"
            )));
        }
        self.with_causal(
            name,
            volume,
            async |client: &Client, member: &mut Membership| {
                client.beacon_if_due(member)?;
                client.sync(member).await;
                let matching: Vec<CausalPast> = client
                    .history(member, &key)
                    .into_iter()
                    .filter(|past| hex::encode(past.id.0.0).starts_with(&prefix))
                    .collect();
                let shown = String::from_utf8_lossy(key.as_bytes()).to_string();
                let past = match &matching[..] {
                    [past] => past,
                    [] => {
                        return Err(problem(format!(
                            "no version of {shown:?} has an id starting with {prefix} \
                             (`get --versions` lists them)"
                        )));
                    }
                    _ => {
                        return Err(problem(format!(
                            "{} versions of {shown:?} have ids starting with {prefix}: give more \
                             digits",
                            matching.len()
                        )));
                    }
                };
                let hash = member
                    .node
                    .log()
                    .get(&past.id)
                    .and_then(|update| update.body().value)
                    .map(|reference| reference.hash);
                let Some(hash) = hash else {
                    return Ok((past.clone(), None));
                };
                if past.discarded {
                    return Err(problem(format!(
                        "version {prefix} of {shown:?} was discarded by every client's consent"
                    )));
                }
                for server in Self::servers_in_order(member) {
                    if member.node.has_value(&hash) {
                        break;
                    }
                    let mut pull = member.node.pull(server.0);
                    if let Message::Pull { want_values, .. } = &mut pull {
                        want_values.insert(0, hash);
                    }
                    if let Err(error) = client.exchange(member, server, pull).await {
                        tracing::debug!(%error, "a server did not answer for an old version");
                    }
                }
                match member.node.value(&hash) {
                    Some(value) => Ok((past.clone(), Some(value.clone()))),
                    None => Err(problem(format!(
                        "no server gave the value of version {prefix} of {shown:?} (none answered, \
                         or it was discarded by every client's consent)"
                    ))),
                }
            },
        )
        .await
    }

    /// The versions of `key` `member`'s log holds, newest first.
    fn history(&self, member: &Membership, key: &Key) -> Vec<CausalPast> {
        let log = member.node.log();
        let config = log.config().clone();
        let current: Vec<UpdateId> = log.heads(key).iter().map(|head| head.id()).collect();
        let mut versions: Vec<CausalPast> = log
            .versions(key)
            .into_iter()
            .map(|update| {
                let body = update.body();
                CausalPast {
                    id: update.id(),
                    writer: self.member_name(&config, body.writer),
                    clock: body.clock,
                    len: body.value.map(|reference| reference.len),
                    current: current.contains(&update.id()),
                    discarded: body
                        .value
                        .is_some_and(|reference| member.node.is_discarded(&reference.hash)),
                }
            })
            .collect();
        versions.sort_by(|a, b| (b.clock, &b.writer, b.id).cmp(&(a.clock, &a.writer, a.id)));
        versions
    }
}

/// One update a client's log of a causal volume holds, as a history checker needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedUpdate {
    /// Its name.
    pub id: UpdateId,
    /// Its writer's member index.
    pub writer: u32,
    /// The key it writes.
    pub key: Key,
    /// What it names: its writer's previous update, then its dependencies.
    pub named: Vec<UpdateId>,
    /// Whether its writer may write its key (reads ignore it otherwise).
    pub authorised: bool,
}

impl Client {
    /// Every update this client's log of causal volume `volume` (named `name`) holds, in the
    /// order it accepted them (dependencies first), without asking anyone.
    pub async fn causal_updates(
        &self,
        name: &str,
        volume: VolumeId,
    ) -> Result<Vec<LoggedUpdate>, ClientError> {
        self.with_causal(name, volume, async |_: &Client, member: &mut Membership| {
            let log = member.node.log();
            Ok(log
                .in_order()
                .map(|update| {
                    let body = update.body();
                    LoggedUpdate {
                        id: update.id(),
                        writer: body.writer.0,
                        key: body.key.clone(),
                        named: body
                            .prev
                            .into_iter()
                            .chain(body.deps.iter().map(|dep| dep.id))
                            .collect(),
                        authorised: log.config().may_write(body.writer, &body.key),
                    }
                })
                .collect())
        })
        .await
    }

    /// This client's member index in causal volume `volume` (named `name`).
    pub async fn causal_index(&self, name: &str, volume: VolumeId) -> Result<u32, ClientError> {
        self.with_causal(name, volume, async |_: &Client, member: &mut Membership| {
            Ok(member.node.me().0)
        })
        .await
    }
}

/// A user's key in a causal volume: any key but those starting with NUL (Depot's own).
fn causal_key(key: &[u8]) -> Result<Key, ClientError> {
    if key.first() == Some(&0) {
        return Err(ClientError::Volume {
            name: String::new(),
            problem: "keys of a causal volume may not begin with a NUL byte".into(),
        });
    }
    Key::new(key.to_vec()).map_err(ClientError::Key)
}

fn wire_encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    bulwark_core::wire::encode(value)
}

/// A volume's record text: `causal volume=<16 hex digits>`.
pub(crate) fn record_text(volume: VolumeId) -> String {
    format!("{CAUSAL} volume={:016x}", volume.0)
}

/// The volume a record names, if it is a causal one's.
pub(crate) fn parse_record(text: &str) -> Option<VolumeId> {
    let mut words = text.split(' ');
    if words.next()? != CAUSAL {
        return None;
    }
    let hex = words.next()?.strip_prefix("volume=")?;
    if words.next().is_some() || hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(VolumeId)
}

/// Where a client keeps its Depot store, under its directory.
pub(crate) fn store_dir(client_dir: &std::path::Path) -> PathBuf {
    client_dir.join(DEPOT_DIR)
}
