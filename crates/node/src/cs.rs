//! The node's part in the configuration service (Rosebud §3): the chain of certified
//! configurations it holds, its CS replica when the current configuration names it one, and the
//! exchange of certificates with other nodes.
//!
//! - The **chain** starts at the genesis configuration (`cluster.toml`'s
//!   `[configuration_service]`) and grows one verified certificate at a time; each certificate is
//!   durable (table `certs` of the configuration service's namespace for group 0) before the
//!   node acts on it, and the whole chain is verified again at start.
//! - The **CS replica** of epoch `e` is a PBFT replica of [`ConfigService`], hosted like any other
//!   replica in a shard of its own (one driven by the wall clock: the configuration service judges
//!   STOP by it) and restored from its own namespace (the configuration service's, group `e`). Its
//!   log is compacted at each stable checkpoint.
//! - **Dissemination** (§3.6): every CS replica whose instance certifies the next configuration
//!   starts the three-level multicast among the new configuration's members in ring order
//!   (`membership::multicast_targets`: `⌈∛N⌉` copies per node per hop, three hops), of each
//!   certificate's delta from the epoch before where one carries it; a node that
//!   learns of a later epoch than its own, or that has heard nothing for a while, pulls the
//!   certificates it lacks from a peer. Every certificate is verified against the configuration
//!   before it, so a peer can withhold but never forge; one it already holds goes no further.
//! - When a certificate is added, the node drops its replica of the old CS instance and starts
//!   one for the new epoch if it is among the new CS (§3.7: no state passes between CS
//!   generations).

use crate::host::{Adapter, Effects, Hosted, Hosting, Members};
use crate::peers::Directory;
use crate::shard::{Job, ReplicaKey, ShardHandle};
use crate::{NodeError, Rejections};
use bulwark_core::configuration::CsProtocol;
use bulwark_core::configuration::{self, ConfigCert, ConfigDelta, Configuration};
use bulwark_core::envelope::{self, Envelope, Header, Kind};
use bulwark_core::membership;
use bulwark_core::sign::{SecretKey, Unverified};
use bulwark_core::wire;
use bulwark_core::{ClientId, Epoch, GroupId, NodeId, ServiceId, Slot, Time};
use bulwark_protocol::cs::monitor::{Monitor, MonitorParams, Pong};
use bulwark_protocol::cs::{ConfigService, CsChange, EvictVote, Op};
use bulwark_protocol::machine::{Access, ReplicaStats, TimerId};
use bulwark_protocol::pbft::ea::{self, EaReplica};
use bulwark_protocol::pbft::{Change, PbftReplica};
use bulwark_protocol::service::{
    CERT_ANSWER_BYTES_MAX, CERTS_PER_ANSWER, Certificate, CsStatus, NodeMessage,
};
use bulwark_storage::{Namespace, StorageOp, Store};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// The certified configurations, by epoch (namespace group 0; CS instances use their epoch).
pub const CERTS: &str = "certs";
/// A CS replica's PBFT records, in the order they were made.
pub const LOG: &str = "log";
/// The largest PBFT record read back from disk.
const RECORD_BYTES_MAX: usize = 2 * bulwark_core::wire::FRAME_BYTES_MAX;
/// How often a node asks a peer for configurations it may have missed.
const PULL_EVERY: Duration = Duration::from_secs(3);

/// The namespace certificates live in.
fn certs_namespace() -> Namespace {
    Namespace::new(ServiceId::CONFIG, GroupId(0))
}

/// The namespace of the CS instance of `epoch`.
fn instance_namespace(epoch: Epoch) -> Namespace {
    Namespace::new(ServiceId::CONFIG, group_of(epoch))
}

use bulwark_core::configuration::cs_group as group_of;

/// The genesis configuration and every certified one after it.
pub struct Chain {
    genesis: Configuration,
    certs: Vec<ConfigCert>,
    current: Configuration,
}

impl Chain {
    /// The chain stored in `store`, every certificate verified from `genesis` again.
    pub fn load(store: &Store, genesis: Configuration) -> Result<Chain, NodeError> {
        let mut chain = Chain {
            current: genesis.clone(),
            genesis,
            certs: Vec::new(),
        };
        for (_, value) in store.load(certs_namespace().table(CERTS))? {
            let cert: ConfigCert =
                wire::decode(&value, configuration::CERT_BYTES_MAX).map_err(|e| {
                    NodeError::CorruptState {
                        table: CERTS,
                        problem: e.to_string(),
                    }
                })?;
            chain.extend(cert).map_err(|e| NodeError::CorruptState {
                table: CERTS,
                problem: e.to_string(),
            })?;
        }
        Ok(chain)
    }

    /// The latest configuration.
    pub fn current(&self) -> &Configuration {
        &self.current
    }

    /// The genesis configuration.
    pub fn genesis(&self) -> &Configuration {
        &self.genesis
    }

    /// Certificates of epochs after `after`, oldest first, at most [`CERTS_PER_ANSWER`] and
    /// [`CERT_ANSWER_BYTES_MAX`] encoded bytes beyond the first: what one answer carries.
    pub fn after(&self, after: u64) -> Vec<ConfigCert> {
        // certs[i] certifies epoch genesis + 1 + i.
        let first = after.saturating_sub(self.genesis.epoch.0) as usize;
        answer(self.certs.iter().skip(first))
    }

    /// Every configuration, from the genesis on.
    pub fn configurations(&self) -> Result<Vec<Configuration>, NodeError> {
        let mut configurations = vec![self.genesis.clone()];
        for cert in &self.certs {
            configurations.push(Configuration::decode(&cert.bytes).map_err(|e| {
                NodeError::CorruptState {
                    table: CERTS,
                    problem: e.to_string(),
                }
            })?);
        }
        Ok(configurations)
    }

    /// Where each epoch placed keys, from the genesis on.
    pub fn rings(&self) -> Result<membership::Chain, NodeError> {
        let rings = self
            .configurations()?
            .iter()
            .map(ring_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|problem| NodeError::CorruptState {
                table: CERTS,
                problem,
            })?;
        Ok(membership::Chain::new(rings))
    }

    /// `certs`, consecutive certificates this chain holds, each as the change from the
    /// configuration before it where a delta can carry it.
    pub fn deltas(&self, certs: &[ConfigCert]) -> Vec<Certificate> {
        let decode = |cert: &ConfigCert| Configuration::decode(&cert.bytes).ok();
        certs
            .iter()
            .map(|cert| {
                let delta = decode(cert).and_then(|next| {
                    // certs[i] certifies epoch genesis + 1 + i: the one before is certs[i - 1].
                    let at = next.epoch.0.checked_sub(self.genesis.epoch.0 + 1)? as usize;
                    let prev = match at.checked_sub(1) {
                        None => self.genesis.clone(),
                        Some(before) => decode(self.certs.get(before)?)?,
                    };
                    ConfigDelta::between(&prev, &next, cert.signatures.clone())
                });
                delta.map_or_else(|| Certificate::Full(cert.clone()), Certificate::Delta)
            })
            .collect()
    }

    /// Adds `cert` if it certifies the epoch after the current one.
    pub fn extend(&mut self, cert: ConfigCert) -> Result<&Configuration, configuration::CertError> {
        let next = configuration::verify_successor(&self.current, &cert)?;
        self.certs.push(cert);
        self.current = next;
        Ok(&self.current)
    }
}

/// Hands the certified `ring` to every replica that follows the configuration, in the order
/// epochs are certified.
pub async fn hand_over(followers: &[(ReplicaKey, ShardHandle)], ring: &Arc<membership::Ring>) {
    for (replica, shard) in followers {
        shard
            .send(Job::Epoch {
                replica: *replica,
                ring: ring.clone(),
            })
            .await;
    }
}

/// Where `config` places keys.
pub fn ring_of(config: &Configuration) -> Result<Arc<membership::Ring>, String> {
    config.ring().map(Arc::new).map_err(|e| e.to_string())
}

/// Why this node leaves a ping unanswered, if it does (Rosebud §4.9): a node answers only a CS
/// replica of the newest configuration it knows, and only once every replica that follows the
/// configuration (`followers`) has entered that epoch and finished pulling what it takes over.
/// So a node that skipped an epoch, or transfers too slowly, misses pings and is evicted, and no
/// node has to keep configurations older than the one before its current.
pub(crate) fn ping_withheld(
    current: &Configuration,
    ping_epoch: Epoch,
    from: NodeId,
    followers: &[ReplicaStats],
) -> Option<String> {
    if ping_epoch != current.epoch {
        return Some(format!(
            "a ping of epoch {} while this node is in epoch {}",
            ping_epoch.0, current.epoch.0
        ));
    }
    if !current.cs().contains(&from) {
        return Some(format!(
            "{from} is not a CS replica of epoch {}",
            current.epoch.0
        ));
    }
    followers.iter().find_map(|stats| {
        (stats.epoch < current.epoch.0 || stats.transfers_pending > 0).then(|| {
            format!(
                "transfers into epoch {} unfinished (in epoch {}, {} ranges pending)",
                current.epoch.0, stats.epoch, stats.transfers_pending
            )
        })
    })
}

/// What the chain's manager hears.
pub enum Event {
    /// Certificates from this node's CS replica (`from` = `None`) or a peer; `hop`, the
    /// multicast hop this node passes them on at, if it does.
    Certified {
        certs: Vec<Certificate>,
        from: Option<NodeId>,
        hop: Option<u8>,
    },
    /// A peer asks for certificates after `after`.
    Pull { from: NodeId, after: u64 },
    /// A peer spoke of an epoch after this node's: ask it.
    Behind { peer: NodeId },
    /// A node's message about liveness or an eviction.
    Peer { from: NodeId, message: NodeMessage },
    /// A client asks for this CS replica's agreement to evict `node` in `epoch`.
    EvictAsked {
        epoch: Epoch,
        node: NodeId,
        answer: tokio::sync::oneshot::Sender<Result<Unverified<EvictVote>, String>>,
    },
}

// ---------------------------------------------------------------------------------------------
// The CS replica's storage

/// What a record is about, for compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kept {
    Seq(u64),
    Checkpoint(u64),
    View,
    /// A NEW-VIEW entered (A2M-PBFT-EA): only the latest matters.
    NewView,
    App,
}

fn kept(change: &Change<ConfigService>) -> Kept {
    match change {
        Change::Checkpoint(transfer) => Kept::Checkpoint(transfer.proof.seq),
        Change::View { .. } => Kept::View,
        Change::App(_) => Kept::App,
        other => Kept::Seq(other.seq().unwrap_or(0)),
    }
}

/// [`kept`] for an A2M-PBFT-EA replica's records. Its own view changes and new views are kept
/// whole (after a restart it asks its trusted log again for each); its votes and certificates
/// go with the checkpoint that covers their number.
fn kept_ea(change: &ea::Change<ConfigService>) -> Kept {
    use bulwark_protocol::pbft::Vote;
    match change {
        ea::Change::Checkpoint(transfer) => Kept::Checkpoint(transfer.stable.seq),
        ea::Change::View { .. } => Kept::View,
        ea::Change::NewView(_) => Kept::NewView,
        ea::Change::App(_) => Kept::App,
        ea::Change::Prepared(prepared) => Kept::Seq(prepared.seq),
        ea::Change::Committed(committed) => Kept::Seq(committed.seq),
        ea::Change::Said(said) => match &**said {
            ea::Said::PrePrepare(body, _) | ea::Said::Vote(body) => {
                wire::decode::<Vote>(body, 128).map_or(Kept::App, |vote| Kept::Seq(vote.seq))
            }
            ea::Said::Checkpoint(body) => wire::decode::<ea::Checkpoint>(body, 192)
                .map_or(Kept::App, |checkpoint| Kept::Seq(checkpoint.seq)),
            ea::Said::ViewChange(_) | ea::Said::NewView(_) => Kept::App,
        },
    }
}

/// A CS replica's records: one per change, numbered in order; a stable checkpoint deletes the
/// records it makes redundant.
pub struct CsStorage {
    namespace: Namespace,
    next: u64,
    records: BTreeMap<u64, Kept>,
    events: mpsc::UnboundedSender<Event>,
}

impl CsStorage {
    /// Records `change` (encoded as `value`, about `what`), deleting the records it makes
    /// redundant.
    fn put(&mut self, what: Kept, value: Bytes, ops: &mut Vec<StorageOp>) {
        let table = self.namespace.table(LOG);
        let drop: Vec<u64> = match what {
            Kept::Checkpoint(stable) => self
                .records
                .iter()
                .filter(|(_, kept)| match kept {
                    Kept::Seq(seq) => *seq <= stable,
                    Kept::Checkpoint(older) => *older < stable,
                    Kept::View | Kept::NewView | Kept::App => false,
                })
                .map(|(record, _)| *record)
                .collect(),
            Kept::View | Kept::NewView => self
                .records
                .iter()
                .filter(|(_, kept)| **kept == what)
                .map(|(record, _)| *record)
                .collect(),
            Kept::Seq(_) | Kept::App => Vec::new(),
        };
        for record in drop {
            self.records.remove(&record);
            ops.push(StorageOp::Delete {
                table,
                key: record.to_be_bytes().to_vec(),
            });
        }
        let record = self.next;
        self.next += 1;
        self.records.insert(record, what);
        ops.push(StorageOp::Put {
            table,
            key: record.to_be_bytes().to_vec(),
            value,
        });
    }

    fn certified(&self, change: &CsChange) {
        let CsChange::Certified(cert) = change;
        // Valid whether or not it is durable yet: a quorum of the CS signed it.
        let _ = self.events.send(Event::Certified {
            certs: vec![Certificate::Full(cert.clone())],
            from: None,
            hop: Some(0),
        });
    }
}

impl Adapter<PbftReplica<ConfigService>> for CsStorage {
    const NAME: &'static str = "config";

    fn record(&mut self, change: &Change<ConfigService>, _batch: u64, ops: &mut Vec<StorageOp>) {
        self.put(kept(change), Bytes::from(wire::encode(change)), ops);
        if let Change::App(change) = change {
            self.certified(change);
        }
    }

    fn view(&self) -> &() {
        &()
    }
}

impl Adapter<EaReplica<ConfigService>> for CsStorage {
    const NAME: &'static str = "config";

    fn record(
        &mut self,
        change: &ea::Change<ConfigService>,
        _batch: u64,
        ops: &mut Vec<StorageOp>,
    ) {
        self.put(kept_ea(change), Bytes::from(wire::encode(change)), ops);
        if let ea::Change::App(change) = change {
            self.certified(change);
        }
    }

    fn view(&self) -> &() {
        &()
    }
}

/// The agreement core a CS replica runs on, as the configuration names it.
// One per node, held for an epoch: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Core {
    Pbft(Hosting<PbftReplica<ConfigService>, CsStorage>),
    Ea(Hosting<EaReplica<ConfigService>, CsStorage>),
}

impl Core {
    fn hosted(&mut self) -> &mut dyn Hosted {
        match self {
            Core::Pbft(hosting) => hosting,
            Core::Ea(hosting) => hosting,
        }
    }

    fn hosted_ref(&self) -> &dyn Hosted {
        match self {
            Core::Pbft(hosting) => hosting,
            Core::Ea(hosting) => hosting,
        }
    }
}

/// The CS replica as a shard hosts it, with what `bulwark status` shows of it.
pub struct CsHosted {
    inner: Core,
    epoch: Epoch,
}

impl Hosted for CsHosted {
    fn service_name(&self) -> &'static str {
        self.inner.hosted_ref().service_name()
    }

    fn slot(&self) -> Slot {
        self.inner.hosted_ref().slot()
    }

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        envelope: &Envelope,
        batch: u64,
    ) -> Effects {
        self.inner
            .hosted()
            .on_request(now, client, access, envelope, batch)
    }

    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects {
        self.inner.hosted().on_message(now, from, envelope, batch)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, batch: u64) -> Effects {
        self.inner.hosted().on_timer(now, timer, batch)
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        self.inner.hosted().on_tick(now, batch)
    }

    fn on_attested(
        &mut self,
        now: Time,
        token: u64,
        answers: bulwark_protocol::machine::Attested,
        batch: u64,
    ) -> Effects {
        self.inner.hosted().on_attested(now, token, answers, batch)
    }

    fn durable(&mut self, batch: u64) {
        self.inner.hosted().durable(batch);
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.hosted_ref().stats()
    }

    fn submit_own(&mut self, now: Time, op: &[u8], batch: u64) -> Effects {
        let op = match wire::decode::<Op>(op, bulwark_core::wire::FRAME_BYTES_MAX) {
            Ok(op) => op,
            Err(error) => {
                return Effects {
                    refused: Some(format!("own operation: {error}")),
                    ..Effects::default()
                };
            }
        };
        match &mut self.inner {
            Core::Pbft(hosting) => {
                let output = hosting.replica.submit_own(now, op);
                hosting.effects(output, None, batch)
            }
            Core::Ea(hosting) => {
                let output = hosting.replica.submit_own(now, op);
                hosting.effects(output, None, batch)
            }
        }
    }

    fn cs_status(&self) -> Option<CsStatus> {
        let (slot, members, view, primary, executed, waiting, stopped) = match &self.inner {
            Core::Pbft(h) => (
                h.slot,
                &h.members,
                h.replica.view(),
                h.replica.primary(),
                h.replica.executed(),
                h.replica.waiting(),
                h.replica.stopped().map(str::to_string),
            ),
            Core::Ea(h) => (
                h.slot,
                &h.members,
                h.replica.view(),
                h.replica.primary(),
                h.replica.executed(),
                h.replica.waiting(),
                None,
            ),
        };
        Some(CsStatus {
            epoch: self.epoch.0,
            slot: slot.0,
            view: view.0,
            active: view.1,
            primary: members.node(primary).map_or(u32::MAX, |node| node.0),
            executed,
            waiting: waiting as u64,
            stopped,
        })
    }
}

/// This node's CS replica for `config`'s epoch, restored from its namespace.
fn build_replica(
    store: &Store,
    config: &Configuration,
    node: NodeId,
    secret: &SecretKey,
    events: &mpsc::UnboundedSender<Event>,
) -> Result<Option<CsHosted>, NodeError> {
    let cs = config.cs();
    let Some(slot) = cs.iter().position(|id| *id == node) else {
        return Ok(None);
    };
    let namespace = instance_namespace(config.epoch);
    let corrupt = |problem: String| NodeError::CorruptState {
        table: LOG,
        problem,
    };
    let mut records = BTreeMap::new();
    let mut values = Vec::new();
    let mut next = 0;
    for (key, value) in store.load(namespace.table(LOG))? {
        let record = <[u8; 8]>::try_from(key.as_slice())
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt("a record id that is not a number".into()))?;
        values.push((record, value));
        next = record + 1;
    }
    let restored = values.len();
    let group = group_of(config.epoch);
    let header = Header::request(ServiceId::CONFIG, group, config.epoch, 0);
    let mut adapter = CsStorage {
        namespace,
        next,
        records: BTreeMap::new(),
        events: events.clone(),
    };
    let (inner, executed) = match config.cs_protocol {
        CsProtocol::Pbft | CsProtocol::A2mPbftE => {
            // A2M-PBFT-E is PBFT with each replica's request history in its trusted log.
            let setup = if config.cs_protocol == CsProtocol::A2mPbftE {
                ConfigService::e_setup(config, node, secret.clone())
            } else {
                ConfigService::setup(config, node, secret.clone())
            }
            .map_err(corrupt)?;
            let mut changes = Vec::new();
            for (record, value) in values {
                let change: Change<ConfigService> =
                    wire::decode(&value, RECORD_BYTES_MAX).map_err(|e| corrupt(e.to_string()))?;
                records.insert(record, kept(&change));
                changes.push(change);
            }
            let replica = PbftReplica::restore(setup, changes, wall_clock())
                .map_err(|e| corrupt(e.to_string()))?;
            let executed = replica.executed();
            adapter.records = records;
            let hosting = Hosting {
                replica,
                adapter,
                members: Members::Group(cs),
                slot: Slot(slot as u32),
                header,
            };
            (Core::Pbft(hosting), executed)
        }
        CsProtocol::A2mPbftEa => {
            let setup = ConfigService::ea_setup(config, node, secret.clone()).map_err(corrupt)?;
            let mut changes = Vec::new();
            for (record, value) in values {
                let change: ea::Change<ConfigService> =
                    wire::decode(&value, RECORD_BYTES_MAX).map_err(|e| corrupt(e.to_string()))?;
                records.insert(record, kept_ea(&change));
                changes.push(change);
            }
            let replica = EaReplica::restore(setup, changes, wall_clock())
                .map_err(|e| corrupt(e.to_string()))?;
            let executed = replica.executed();
            adapter.records = records;
            let hosting = Hosting {
                replica,
                adapter,
                members: Members::Group(cs),
                slot: Slot(slot as u32),
                header,
            };
            (Core::Ea(hosting), executed)
        }
    };
    tracing::info!(
        node = node.0,
        epoch = config.epoch.0,
        slot,
        records = restored,
        executed,
        protocol = config.cs_protocol.name(),
        "configuration-service replica ready"
    );
    Ok(Some(CsHosted {
        inner,
        epoch: config.epoch,
    }))
}

/// Milliseconds since the Unix epoch: the clock the configuration service's epochs are measured
/// by (the genesis time and every STOP are wall-clock readings).
pub fn wall_clock() -> Time {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Time(now.as_millis() as u64)
}

// ---------------------------------------------------------------------------------------------
// The manager

/// What the dispatcher reads of the configuration service without waiting for the manager.
pub struct Shared {
    pub node: NodeId,
    pub secret: SecretKey,
    pub chain: RwLock<Chain>,
    /// The epoch of the CS instance this node hosts; 0 when it hosts none.
    pub hosted: AtomicU64,
    pub events: mpsc::UnboundedSender<Event>,
}

impl Shared {
    /// This node's answer to a freshness challenge: signed only while it is a CS replica of the
    /// epoch it holds as current.
    pub fn fresh(
        &self,
        nonce: u64,
    ) -> Option<bulwark_core::sign::Unverified<configuration::Fresh>> {
        let chain = self.chain.read().ok()?;
        let current = chain.current();
        if self.hosted.load(Ordering::Acquire) != current.epoch.0 {
            return None;
        }
        let fresh = configuration::Fresh {
            nonce,
            epoch: current.epoch,
            digest: current.digest(),
            node: self.node,
        };
        bulwark_core::sign::Signed::sign(&self.secret, fresh)
            .ok()
            .map(|signed| signed.to_unverified())
    }

    /// The current epoch.
    pub fn epoch(&self) -> Epoch {
        self.chain
            .read()
            .map_or(Epoch(0), |chain| chain.current().epoch)
    }
}

/// Keeps the chain: adds certificates, answers pulls, moves the CS replica; as a CS replica,
/// monitors the members and proposes evictions.
pub struct Manager {
    pub node: NodeId,
    pub secret: SecretKey,
    pub store: Arc<Store>,
    pub shared: Arc<Shared>,
    /// Links to the members, and the listener's admitted certificates: each certified
    /// configuration's members are met as it is added.
    pub directory: Arc<Directory>,
    pub shard: ShardHandle,
    pub rejections: Rejections,
    pub monitoring: MonitorParams,
    /// The replicas that follow the configuration, handed each new epoch's ring in order.
    pub followers: Vec<(ReplicaKey, ShardHandle)>,
}

/// How often monitoring looks for pings to send and answers overdue.
const MONITOR_EVERY: Duration = Duration::from_millis(100);

/// What monitoring keeps for the CS instance this node serves.
struct Watch {
    epoch: Epoch,
    monitor: Monitor,
    /// Agreements gathered for each proposed eviction, by voter.
    proposals: BTreeMap<NodeId, BTreeMap<NodeId, Unverified<EvictVote>>>,
    /// Evictions already submitted.
    submitted: std::collections::BTreeSet<NodeId>,
}

impl Manager {
    /// Hosts this node's CS replica of the current epoch, if it has one, then serves events
    /// until the event channel closes.
    pub async fn run(self, mut events: mpsc::UnboundedReceiver<Event>) {
        self.install().await;
        let mut watch = self.watch(None);
        let mut pull = tokio::time::interval(PULL_EVERY);
        pull.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut monitor = tokio::time::interval(MONITOR_EVERY);
        monitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_peer = 0usize;
        loop {
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { break };
                    let event = match event {
                        Event::Peer { from, message } => {
                            self.on_peer(&mut watch, from, message).await;
                            continue;
                        }
                        Event::EvictAsked { epoch, node, answer } => {
                            let _ = answer.send(self.agreement(watch.as_ref(), epoch, node));
                            continue;
                        }
                        event => event,
                    };
                    if self.handle(event).await {
                        watch = self.watch(watch.take());
                    }
                }
                _ = monitor.tick() => self.monitor(&mut watch).await,
                _ = pull.tick() => {
                    // Anti-entropy: one peer per period, in turn.
                    let peers: Vec<NodeId> = self.members().into_iter().filter(|n| *n != self.node).collect();
                    if !peers.is_empty() {
                        let peer = peers[next_peer % peers.len()];
                        next_peer = next_peer.wrapping_add(1);
                        self.pull_from(peer);
                    }
                }
            }
        }
    }

    fn members(&self) -> Vec<NodeId> {
        self.shared.chain.read().map_or_else(
            |_| Vec::new(),
            |chain| chain.current().members.iter().map(|m| m.id).collect(),
        )
    }

    /// Passes `certs` on at multicast hop `hop` (Rosebud §3.6) among the members of the newest
    /// configuration in ring order, from this node's place there (a CS replica that left starts
    /// from its successor's); where the rule names this node itself, it takes the next hop too.
    fn multicast(&self, certs: &[ConfigCert], hop: u8) {
        let Ok(certs) = self.shared.chain.read().map(|chain| chain.deltas(certs)) else {
            return;
        };
        let mut ring = self.members();
        ring.sort_by_key(|id| membership::RingPoint::of_node(*id));
        let n = ring.len();
        if n == 0 {
            return;
        }
        let mine = membership::RingPoint::of_node(self.node);
        let at = ring
            .iter()
            .position(|id| membership::RingPoint::of_node(*id) >= mine)
            .unwrap_or(0);
        let mut holds = vec![(at, hop)];
        while let Some((at, hop)) = holds.pop() {
            for target in membership::multicast_targets(n, at, hop) {
                if ring[target] == self.node {
                    holds.push((target, hop + 1));
                } else {
                    metrics::counter!("bulwark_node_config_multicast_sent_total").increment(1);
                    self.send(
                        ring[target],
                        &NodeMessage::Multicast {
                            certs: certs.clone(),
                            hop: hop + 1,
                        },
                    );
                }
            }
        }
    }

    fn pull_from(&self, peer: NodeId) {
        let after = self.shared.epoch().0;
        self.send(peer, &NodeMessage::Pull { after });
    }

    fn send(&self, to: NodeId, message: &NodeMessage) {
        let header = Header {
            kind: Kind::Message,
            ..Header::request(ServiceId::SYSTEM, GroupId(0), self.shared.epoch(), 0)
        };
        if let Err(error) = self
            .directory
            .peers
            .send(to, envelope::frame(&header, message))
        {
            tracing::debug!(%to, %error, "configuration message not queued");
        }
    }

    /// Monitoring for the current epoch, if this node is one of its CS replicas, carrying over
    /// what its monitoring of an earlier epoch (`previous`) saw of the members still there.
    fn watch(&self, previous: Option<Watch>) -> Option<Watch> {
        let config = self.shared.chain.read().ok()?.current().clone();
        if !config.cs().contains(&self.node) {
            return None;
        }
        let mut monitor = Monitor::new(&config, self.node, self.monitoring);
        if let Some(previous) = previous.filter(|previous| previous.epoch <= config.epoch) {
            monitor.carry(&previous.monitor);
        }
        Some(Watch {
            epoch: config.epoch,
            monitor,
            proposals: BTreeMap::new(),
            submitted: Default::default(),
        })
    }

    async fn monitor(&self, watch: &mut Option<Watch>) {
        let Some(watch) = watch.as_mut() else {
            return;
        };
        let mut fresh = || rand::random::<u64>();
        for (node, ping) in watch.monitor.tick(wall_clock(), &mut fresh) {
            self.send(node, &NodeMessage::Ping(ping));
        }
        for suspect in watch.monitor.suspects() {
            if watch.submitted.contains(&suspect) || watch.proposals.contains_key(&suspect) {
                continue;
            }
            tracing::warn!(
                node = self.node.0,
                suspect = suspect.0,
                epoch = watch.epoch.0,
                "proposing to evict an unresponsive member"
            );
            let mut votes = BTreeMap::new();
            if let Some(vote) = self.evict_vote(watch.epoch, suspect) {
                votes.insert(self.node, vote);
            }
            watch.proposals.insert(suspect, votes);
            let cs = self.cs_members();
            for member in cs.into_iter().filter(|m| *m != self.node) {
                self.send(
                    member,
                    &NodeMessage::EvictAsk {
                        epoch: watch.epoch,
                        node: suspect,
                    },
                );
            }
        }
        self.submit_evictions(watch).await;
    }

    fn cs_members(&self) -> Vec<NodeId> {
        self.shared
            .chain
            .read()
            .map_or_else(|_| Vec::new(), |chain| chain.current().cs())
    }

    fn evict_vote(&self, epoch: Epoch, node: NodeId) -> Option<Unverified<EvictVote>> {
        let vote = EvictVote {
            epoch,
            node,
            voter: self.node,
        };
        bulwark_core::sign::Signed::sign(&self.secret, vote)
            .ok()
            .map(|signed| signed.to_unverified())
    }

    /// This replica's agreement to evict `node` in `epoch`, on its own monitoring's evidence.
    fn agreement(
        &self,
        watch: Option<&Watch>,
        epoch: Epoch,
        node: NodeId,
    ) -> Result<Unverified<EvictVote>, String> {
        let Some(watch) = watch else {
            return Err(format!(
                "{} is not a CS replica of its current epoch",
                self.node
            ));
        };
        if watch.epoch != epoch {
            return Err(format!(
                "{} serves the CS of epoch {}, not {}",
                self.node, watch.epoch.0, epoch.0
            ));
        }
        if let Some(reason) = watch.monitor.disagreement(node) {
            return Err(reason);
        }
        self.evict_vote(epoch, node)
            .ok_or_else(|| "the agreement could not be signed".to_string())
    }

    /// Submits each eviction with `2f_cs+1` agreements to this node's CS replica, once.
    async fn submit_evictions(&self, watch: &mut Watch) {
        let quorum = match self.shared.chain.read() {
            Ok(chain) => chain.current().cs_quorum(),
            Err(_) => return,
        };
        let ready: Vec<NodeId> = watch
            .proposals
            .iter()
            .filter(|(node, votes)| votes.len() >= quorum && !watch.submitted.contains(node))
            .map(|(node, _)| *node)
            .collect();
        for node in ready {
            let Some(votes) = watch.proposals.get(&node) else {
                continue;
            };
            let op = Op::Evict {
                node,
                votes: votes
                    .iter()
                    .map(|(voter, vote)| (*voter, vote.clone()))
                    .collect(),
            };
            let key: ReplicaKey = (ServiceId::CONFIG, group_of(watch.epoch));
            if self
                .shard
                .send(Job::Submit {
                    replica: key,
                    op: Bytes::from(wire::encode(&op)),
                })
                .await
            {
                tracing::warn!(
                    node = self.node.0,
                    evicted = node.0,
                    epoch = watch.epoch.0,
                    "eviction submitted with {} agreements",
                    votes.len()
                );
                watch.submitted.insert(node);
            }
        }
    }

    async fn on_peer(&self, watch: &mut Option<Watch>, from: NodeId, message: NodeMessage) {
        match message {
            NodeMessage::Ping(ping) => {
                let current = self.shared.chain.read().ok().map(|c| c.current().clone());
                let Some(current) = current else {
                    return;
                };
                if ping.epoch > current.epoch {
                    // A CS of an epoch this node has not verified: catch up first.
                    self.pull_from(from);
                }
                let followers = self.follower_stats().await;
                if let Some(reason) = ping_withheld(&current, ping.epoch, from, &followers) {
                    tracing::debug!(%from, %reason, "ping not answered");
                    metrics::counter!("bulwark_node_pings_withheld_total").increment(1);
                    return;
                }
                self.send(
                    from,
                    &NodeMessage::Pong(Pong::answer(&ping, self.node, &self.secret)),
                );
            }
            NodeMessage::Pong(pong) => {
                if let Some(watch) = watch.as_mut()
                    && let Err(reason) = watch.monitor.on_pong(from, pong)
                {
                    tracing::debug!(%from, %reason, "ping answer not counted");
                }
            }
            NodeMessage::EvictAsk { epoch, node } => {
                let agrees = watch
                    .as_ref()
                    .is_some_and(|watch| watch.epoch == epoch && watch.monitor.agrees(node));
                if agrees && let Some(vote) = self.evict_vote(epoch, node) {
                    self.send(from, &NodeMessage::EvictAgree(vote));
                }
            }
            NodeMessage::EvictAgree(vote) => {
                let Some(watch) = watch.as_mut() else {
                    return;
                };
                // The CS checks every agreement before it orders the eviction; here only the
                // voter's key, so that one bad vote does not spoil a proposal.
                let key = self
                    .shared
                    .chain
                    .read()
                    .ok()
                    .and_then(|chain| chain.current().member(from).map(|m| m.signing_key));
                let Some(key) = key else {
                    return;
                };
                match vote.clone().verify(&key) {
                    Ok(signed) => {
                        let agreed = signed.value();
                        if agreed.epoch == watch.epoch
                            && agreed.voter == from
                            && let Some(votes) = watch.proposals.get_mut(&agreed.node)
                        {
                            votes.insert(from, vote);
                        }
                    }
                    Err(error) => {
                        self.rejections
                            .record(&from.to_string(), "forged eviction agreement");
                        tracing::warn!(%from, %error, "eviction agreement refused");
                    }
                }
                self.submit_evictions(watch).await;
            }
            NodeMessage::Certified(certs) => {
                let _ = self.shared.events.send(Event::Certified {
                    certs: certs.into_iter().map(Certificate::Full).collect(),
                    from: Some(from),
                    hop: None,
                });
            }
            NodeMessage::Multicast { certs, hop } => {
                let _ = self.shared.events.send(Event::Certified {
                    certs,
                    from: Some(from),
                    hop: Some(hop),
                });
            }
            NodeMessage::Pull { after } => {
                let _ = self.shared.events.send(Event::Pull { from, after });
            }
        }
    }

    /// The figures of this node's replicas that follow the configuration, as their shards
    /// report them now.
    async fn follower_stats(&self) -> Vec<ReplicaStats> {
        let mut stats = Vec::new();
        for (replica, shard) in &self.followers {
            let (answer, status) = tokio::sync::oneshot::channel();
            if !shard.send(Job::Status(answer)).await {
                continue;
            }
            if let Ok(status) = status.await {
                stats.extend(
                    status
                        .replicas
                        .into_iter()
                        // Node-wide replicas of several services share one group.
                        .filter(|r| r.service_id == replica.0.0 && r.group == replica.1.0)
                        .map(|r| r.stats),
                );
            }
        }
        stats
    }

    /// Handles a chain event; true when a certificate was added (the epoch moved).
    async fn handle(&self, event: Event) -> bool {
        match event {
            Event::Pull { from, after } => {
                let certs = self
                    .shared
                    .chain
                    .read()
                    .map(|chain| chain.after(after))
                    .unwrap_or_default();
                if !certs.is_empty() {
                    self.send(from, &NodeMessage::Certified(certs));
                }
                false
            }
            Event::Behind { peer } => {
                self.pull_from(peer);
                false
            }
            Event::Peer { .. } | Event::EvictAsked { .. } => false,
            Event::Certified { certs, from, hop } => {
                let mut added = Vec::new();
                for certificate in certs {
                    let cert = match certificate {
                        Certificate::Full(cert) => Ok(Some(cert)),
                        Certificate::Delta(delta) => self.rebuild(&delta),
                    };
                    let outcome = match cert {
                        Ok(Some(cert)) => {
                            self.add(cert.clone()).await.map(|new| new.then_some(cert))
                        }
                        Ok(None) => Ok(None),
                        Err(reason) => Err(reason),
                    };
                    match outcome {
                        Ok(Some(cert)) => added.push(cert),
                        Ok(None) => {}
                        Err(reason) => {
                            let peer = from.map_or_else(|| "self".to_string(), |n| n.to_string());
                            if reason.starts_with("ahead:") {
                                if let Some(from) = from {
                                    self.pull_from(from);
                                }
                            } else {
                                self.rejections
                                    .record(&peer, &format!("configuration certificate: {reason}"));
                                tracing::warn!(%peer, %reason, "configuration certificate refused");
                            }
                            break;
                        }
                    }
                }
                if added.is_empty() {
                    return false;
                }
                // This node's CS instance certified it (every CS replica starts the multicast),
                // or a peer passed it on at a hop this node takes part in: pass it on. What a
                // pull brought goes no further; a node the multicast misses pulls.
                if let Some(hop) = hop {
                    self.multicast(&added, hop);
                }
                self.install().await;
                true
            }
        }
    }

    /// The certificate `delta` stands for, rebuilt on the current configuration: `Ok(None)` for
    /// an epoch this node already has, `Err("ahead: …")` for one after the next (the delta's base
    /// is not held yet). Whatever else differs from the base shows when its signatures are
    /// verified over the rebuilt bytes.
    fn rebuild(&self, delta: &ConfigDelta) -> Result<Option<ConfigCert>, String> {
        let Ok(chain) = self.shared.chain.read() else {
            return Err("the chain is poisoned".into());
        };
        let current = chain.current().epoch;
        if delta.epoch <= current {
            return Ok(None);
        }
        if delta.epoch.0 > current.0 + 1 {
            return Err(format!(
                "ahead: epoch {} after {}",
                delta.epoch.0, current.0
            ));
        }
        delta
            .apply(chain.current())
            .map(Some)
            .map_err(|error| error.to_string())
    }

    /// Verifies `cert` against the current configuration and makes it durable; `Ok(false)` for
    /// an epoch this node already has, `Err("ahead: …")` for one it cannot verify yet.
    async fn add(&self, cert: ConfigCert) -> Result<bool, String> {
        let current = self.shared.epoch();
        let next = {
            let Ok(chain) = self.shared.chain.read() else {
                return Err("the chain is poisoned".into());
            };
            match configuration::verify_successor(chain.current(), &cert) {
                Ok(next) => next,
                Err(configuration::CertError::WrongEpoch { got, .. }) if got <= current => {
                    return Ok(false);
                }
                Err(configuration::CertError::WrongEpoch { got, .. }) => {
                    return Err(format!("ahead: epoch {} after {}", got.0, current.0));
                }
                Err(error) => return Err(error.to_string()),
            }
        };
        let op = StorageOp::Put {
            table: certs_namespace().table(CERTS),
            key: next.epoch.0.to_be_bytes().to_vec(),
            value: Bytes::from(wire::encode(&cert)),
        };
        let store = self.store.clone();
        let written = tokio::task::spawn_blocking(move || store.apply(&[op])).await;
        if !matches!(written, Ok(Ok(()))) {
            return Err("the certificate could not be made durable".into());
        }
        {
            let Ok(mut chain) = self.shared.chain.write() else {
                return Err("the chain is poisoned".into());
            };
            chain.extend(cert).map_err(|e| e.to_string())?;
        }
        tracing::info!(
            node = self.node.0,
            epoch = next.epoch.0,
            members = next.members.len(),
            "configuration certified"
        );
        metrics::gauge!("bulwark_node_config_epoch").set(next.epoch.0 as f64);
        self.directory.meet(&next.members);
        match ring_of(&next) {
            Ok(ring) => hand_over(&self.followers, &ring).await,
            // verify_successor checked the configuration: it has enough members for a ring.
            Err(error) => tracing::error!(%error, "a certified configuration places no keys"),
        }
        Ok(true)
    }

    /// Hosts the CS replica of the current epoch if this node is in its CS, dropping any older.
    async fn install(&self) {
        let current = match self.shared.chain.read() {
            Ok(chain) => chain.current().clone(),
            Err(_) => return,
        };
        let hosted = self.shared.hosted.load(Ordering::Acquire);
        if hosted == current.epoch.0 {
            return;
        }
        if hosted != 0 {
            let key: ReplicaKey = (ServiceId::CONFIG, group_of(Epoch(hosted)));
            self.shard.send(Job::Remove { replica: key }).await;
            self.shared.hosted.store(0, Ordering::Release);
        }
        let store = self.store.clone();
        let node = self.node;
        let secret = self.secret.clone();
        let events = self.shared.events.clone();
        let config = current.clone();
        let built = tokio::task::spawn_blocking(move || {
            build_replica(&store, &config, node, &secret, &events)
        })
        .await;
        match built {
            Ok(Ok(Some(replica))) => {
                let key: ReplicaKey = (ServiceId::CONFIG, group_of(current.epoch));
                if self
                    .shard
                    .send(Job::Install {
                        replica: key,
                        hosted: Box::new(replica),
                    })
                    .await
                {
                    self.shared.hosted.store(current.epoch.0, Ordering::Release);
                }
            }
            Ok(Ok(None)) => {
                tracing::info!(
                    node = node.0,
                    epoch = current.epoch.0,
                    "not a configuration-service replica this epoch"
                );
            }
            Ok(Err(error)) => {
                tracing::error!(node = node.0, epoch = current.epoch.0, %error, "configuration-service replica could not be restored");
            }
            Err(error) => tracing::error!(%error, "configuration-service restore panicked"),
        }
    }
}

/// The first of `certs` that one answer carries: at most [`CERTS_PER_ANSWER`], and at most
/// [`CERT_ANSWER_BYTES_MAX`] encoded bytes beyond the first.
fn answer<'a>(certs: impl Iterator<Item = &'a ConfigCert>) -> Vec<ConfigCert> {
    let mut bytes = 0;
    let mut answer = Vec::new();
    for cert in certs.take(CERTS_PER_ANSWER) {
        // The configuration with its length, and each signature with its signer's id.
        bytes += 4 + cert.bytes.len() + 3 + cert.signatures.len() * (5 + 64);
        if !answer.is_empty() && bytes > CERT_ANSWER_BYTES_MAX {
            break;
        }
        answer.push(cert.clone());
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::config::Fingerprint;
    use bulwark_core::membership::Member;

    /// A genesis of five members (f = 1, f_cs = 1: four of them are CS replicas).
    fn five() -> Configuration {
        let members = (0..5u8)
            .map(|i| Member {
                trusted_key: None,
                id: NodeId(u32::from(i)),
                address: format!("127.0.0.1:{}", 7000 + u16::from(i))
                    .parse()
                    .unwrap(),
                fingerprint: Fingerprint([i; 32]),
                signing_key: SecretKey::from_seed(&[i + 1; 32]).public_key(),
            })
            .collect();
        let authority = SecretKey::from_seed(&[99; 32]).public_key();
        Configuration::genesis(members, 1, 1, authority, 60_000, 5_000, 0).unwrap()
    }

    fn follower(epoch: u64, transfers_pending: u64) -> ReplicaStats {
        ReplicaStats {
            epoch,
            transfers_pending,
            ..ReplicaStats::default()
        }
    }

    #[test]
    fn a_ping_is_answered_only_from_the_newest_cs_and_once_every_transfer_is_in() {
        let config = five();
        let epoch = config.epoch;
        let cs = config.cs()[0];
        let outsider = (0..5)
            .map(NodeId)
            .find(|node| !config.cs().contains(node))
            .unwrap();
        let settled = [follower(epoch.0, 0)];
        assert_eq!(ping_withheld(&config, epoch, cs, &settled), None);
        assert_eq!(ping_withheld(&config, epoch, cs, &[]), None);

        let withheld = |ping_epoch: Epoch, from: NodeId, followers: &[ReplicaStats]| {
            ping_withheld(&config, ping_epoch, from, followers).is_some()
        };
        // A CS of an older epoch, or one this node has not reached.
        assert!(withheld(Epoch(epoch.0 - 1), cs, &settled));
        assert!(withheld(Epoch(epoch.0 + 1), cs, &settled));
        // A member that is not a CS replica of the epoch.
        assert!(withheld(epoch, outsider, &settled));
        // Still pulling, or not yet in the epoch: it says nothing until it is.
        assert!(withheld(epoch, cs, &[follower(epoch.0, 2)]));
        assert!(withheld(epoch, cs, &[follower(epoch.0 - 1, 0)]));
        assert!(withheld(
            epoch,
            cs,
            &[follower(epoch.0, 0), follower(epoch.0, 1)]
        ));
    }

    /// `next` certified by the CS of `prev`, members of `five` signing with their seeds.
    fn certify(prev: &Configuration, next: &Configuration) -> ConfigCert {
        let bytes = next.encode();
        let signatures = prev
            .cs()
            .into_iter()
            .map(|id| {
                let secret = SecretKey::from_seed(&[id.0 as u8 + 1; 32]);
                (id, ConfigCert::share(&secret, &bytes))
            })
            .collect();
        ConfigCert {
            bytes: Bytes::from(bytes),
            signatures,
        }
    }

    #[test]
    fn the_multicast_carries_deltas_that_rebuild_each_certificate_exactly() {
        let genesis = five();
        let one = genesis.next(Vec::new(), &[NodeId(4)], 1_000).unwrap();
        let two = one.next(Vec::new(), &[], 2_000).unwrap();
        let certs = [certify(&genesis, &one), certify(&one, &two)];
        let mut chain = Chain {
            current: genesis.clone(),
            genesis: genesis.clone(),
            certs: Vec::new(),
        };
        for cert in &certs {
            chain.extend(cert.clone()).unwrap();
        }
        let deltas = chain.deltas(&certs);
        assert_eq!(deltas.len(), 2);
        // Applied in turn to what a node holds, each rebuilds its certificate to the byte.
        let mut held = genesis;
        for (delta, cert) in deltas.iter().zip(&certs) {
            let Certificate::Delta(delta) = delta else {
                panic!("a change of members travels as a delta: {delta:?}");
            };
            assert!(delta.added.is_empty() && delta.dropped.len() <= 1);
            let rebuilt = delta.apply(&held).unwrap();
            assert_eq!(rebuilt.bytes, cert.bytes);
            held = configuration::verify_successor(&held, &rebuilt).unwrap();
        }
        // On the wrong base, the signatures do not verify.
        let Certificate::Delta(second) = &deltas[1] else {
            unreachable!()
        };
        let wrong = chain.genesis().clone();
        assert!(
            second
                .apply(&wrong)
                .and_then(|cert| configuration::verify_successor(&wrong, &cert))
                .is_err()
        );
    }

    /// Sixteen certificates of the largest configurations do not fit one frame: an answer
    /// stops where the next would not, and always carries one.
    #[test]
    fn an_answer_of_certificates_fits_one_frame() {
        use bulwark_core::sign::Signature;
        let cert = |bytes: usize| ConfigCert {
            bytes: Bytes::from(vec![7; bytes]),
            signatures: vec![(NodeId(u32::MAX), Signature([1; 64])); 3],
        };
        let large: Vec<ConfigCert> = (0..20).map(|_| cert(configuration::BYTES_MAX)).collect();
        let answered = super::answer(large.iter());
        let encoded = wire::encode(&answered).len();
        assert!(answered.len() > 1 && answered.len() < CERTS_PER_ANSWER);
        assert!(encoded <= CERT_ANSWER_BYTES_MAX, "{encoded}");
        let next = wire::encode(&large[..answered.len() + 1].to_vec()).len();
        assert!(
            next > CERT_ANSWER_BYTES_MAX,
            "one more would have fit: {next}"
        );
        let small: Vec<ConfigCert> = (0..20).map(|_| cert(1_000)).collect();
        assert_eq!(super::answer(small.iter()).len(), CERTS_PER_ANSWER);
    }
}
