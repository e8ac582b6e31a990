//! A shard: one task that owns some of the node's replicas and drives them, so a replica needs no
//! locks and handles its inputs in a single order, which is also the order their changes reach
//! the disk. A node runs several shards, so one busy group does not hold up the others.
//!
//! This is the node's one effect loop: every replica's output is persisted as one batch through
//! the shared group committer, and its reply and messages leave only once that batch and every
//! batch before it are durable ([`Sequencer`], the rule the simulator checks too).

use crate::Rejections;
use crate::host::{Effects, Hosted};
use crate::peers::Peers;
use crate::trusted::{Answered, TrustedLog};
use bulwark_core::envelope::Envelope;
use bulwark_core::membership::Ring;
use bulwark_core::{ClientId, GroupId, NodeId, ServiceId, Time};
use bulwark_protocol::machine::{Access, ReplicaStats, Sequencer, TimerId};
use bulwark_protocol::service::ReplicaStatus;
use bulwark_storage::{Committer, StorageOp};
use bulwark_transport::Replies;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Inputs waiting for a shard; connections wait (back-pressure) beyond this.
const JOBS_QUEUED_MAX: usize = 4096;

/// Which replica: a service's replica of one group.
pub type ReplicaKey = (ServiceId, GroupId);

/// Work for a shard.
pub enum Job {
    /// A client's request.
    Request {
        replica: ReplicaKey,
        client: ClientId,
        peer: Arc<str>,
        access: Access,
        envelope: Envelope,
        received: Instant,
        replies: Replies,
    },
    /// A message from a peer node.
    Message {
        replica: ReplicaKey,
        from: NodeId,
        envelope: Envelope,
    },
    /// Asks for every replica's status.
    Status(oneshot::Sender<ShardStatus>),
    /// Starts hosting a replica (the configuration service's of a new epoch).
    Install {
        replica: ReplicaKey,
        hosted: Box<dyn Hosted>,
    },
    /// Stops hosting a replica; what it queued for the disk still commits.
    Remove { replica: ReplicaKey },
    /// An operation of the node's own for a replica (an eviction its monitoring proposes).
    Submit { replica: ReplicaKey, op: Bytes },
    /// The certified ring of the next epoch, for a replica that follows the configuration.
    Epoch {
        replica: ReplicaKey,
        ring: Arc<Ring>,
    },
}

/// What a shard reports for `bulwark status`.
pub struct ShardStatus {
    pub requests: u64,
    pub replicas: Vec<ReplicaStatus>,
    pub cs: Option<bulwark_protocol::service::CsStatus>,
    pub causal: Vec<bulwark_protocol::service::CausalStatus>,
}

/// The clock a shard's replicas are driven by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Milliseconds since the node started: for protocols that only measure intervals.
    Monotonic,
    /// Milliseconds since the Unix epoch: the configuration service agrees on times with
    /// other nodes (when an epoch began, when it may end).
    Wall,
}

/// A handle to send jobs.
#[derive(Clone)]
pub struct ShardHandle(mpsc::Sender<Job>);

impl ShardHandle {
    pub async fn send(&self, job: Job) -> bool {
        self.0.send(job).await.is_ok()
    }
}

/// Stops a shard on shutdown.
pub struct Stopper {
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Stopper {
    /// Asks the shard to stop after the job in hand and waits until everything it queued for the
    /// disk is durable. Replies still waiting for a commit are sent only if that commit succeeds.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.done.await;
    }
}

/// What a shard is given at start.
pub struct ShardContext {
    pub index: usize,
    pub replicas: HashMap<ReplicaKey, Box<dyn Hosted>>,
    pub committer: Arc<Committer>,
    pub peers: Arc<Peers>,
    pub started: Instant,
    pub rejections: Rejections,
    pub clock: Clock,
    /// How often replicas get `on_tick` (garbage collection; the configuration service's
    /// protocol timers).
    pub tick: Duration,
    /// The node's trusted log, if it has one.
    pub trusted: Option<TrustedLog>,
}

pub fn spawn(context: ShardContext) -> (ShardHandle, Stopper) {
    let (sender, receiver) = mpsc::channel(JOBS_QUEUED_MAX);
    let (stop, stopped) = oneshot::channel();
    let done = tokio::spawn(run(context, receiver, stopped));
    (ShardHandle(sender), Stopper { stop, done })
}

/// A reply or message waiting for the disk.
enum Outgoing {
    Reply {
        replies: Replies,
        frame: Bytes,
        name: &'static str,
        received: Instant,
    },
    Peer {
        to: NodeId,
        frame: Bytes,
    },
    Notify {
        client: ClientId,
        op: u64,
        frame: Bytes,
    },
    Attest {
        replica: ReplicaKey,
        token: u64,
        calls: Vec<bulwark_core::a2m::Call>,
    },
}

/// Clients whose latest connection a shard remembers, to answer requests that complete later.
const CLIENTS_REMEMBERED_MAX: usize = 4096;
/// Requests awaiting a later answer whose connection a shard remembers.
const UNANSWERED_MAX: usize = 4096;
/// How often a storage shard's replicas get `on_tick`.
pub const TICK_INTERVAL: Duration = Duration::from_millis(500);

struct Shard {
    replicas: HashMap<ReplicaKey, Box<dyn Hosted>>,
    committer: Arc<Committer>,
    peers: Arc<Peers>,
    rejections: Rejections,
    sequencer: Sequencer<Outgoing>,
    /// Batches whose commit completed, reported by the tasks that wait for the committer.
    durable: mpsc::UnboundedSender<u64>,
    /// Timers set by replicas: when, then which.
    timers: BTreeMap<(Time, ReplicaKey, TimerId), ()>,
    requests: u64,
    /// Each client's latest connection, for answers that leave after the request's turn.
    clients: HashMap<ClientId, Replies>,
    /// The connection each unanswered request came in on: a client may run several sessions
    /// under one name, and each must get its own answers.
    unanswered: HashMap<(ClientId, u64), Replies>,
    /// `unanswered`'s keys, oldest first, to bound it.
    unanswered_order: std::collections::VecDeque<(ClientId, u64)>,
    /// How often replicas get `on_tick`.
    tick: Duration,
    trusted: Option<TrustedLog>,
    /// Where the trusted log answers this shard's batches.
    attested: mpsc::UnboundedSender<Answered>,
}

impl Shard {
    /// Persists `effects.ops` as one batch, then queues the reply and messages behind it.
    fn apply(
        &mut self,
        replica: ReplicaKey,
        effects: Effects,
        reply: Option<(Replies, &'static str, Instant)>,
    ) {
        let Effects {
            ops,
            reply: frame,
            sends,
            notify,
            timers,
            attest,
            refused: _,
        } = effects;
        if !ops.is_empty() {
            self.submit(ops);
        }
        if let (Some(frame), Some((replies, name, received))) = (frame, reply) {
            metrics::counter!("bulwark_node_reply_bytes_total", "op" => name)
                .increment(frame.len() as u64);
            let outgoing = Outgoing::Reply {
                replies,
                frame,
                name,
                received,
            };
            if let Some(ready) = self.sequencer.send(outgoing) {
                self.release(ready);
            }
        }
        for (to, frame) in sends {
            if let Some(ready) = self.sequencer.send(Outgoing::Peer { to, frame }) {
                self.release(ready);
            }
        }
        for (client, op, frame) in notify {
            if let Some(ready) = self.sequencer.send(Outgoing::Notify { client, op, frame }) {
                self.release(ready);
            }
        }
        for (token, calls) in attest {
            let outgoing = Outgoing::Attest {
                replica,
                token,
                calls,
            };
            if let Some(ready) = self.sequencer.send(outgoing) {
                self.release(ready);
            }
        }
        for (timer, at) in timers {
            self.timers
                .retain(|(_, key, id), _| !(*key == replica && *id == timer));
            self.timers.insert((at, replica, timer), ());
        }
    }

    fn submit(&mut self, ops: Vec<StorageOp>) {
        let batch = self.sequencer.submit();
        let done = self.committer.submit(ops);
        let durable = self.durable.clone();
        tokio::spawn(async move {
            match done.await {
                // Batches become durable in submission order, so this covers all before it.
                Ok(Ok(())) => {
                    let _ = durable.send(batch);
                }
                outcome => {
                    // A failed fsync leaves the disk in an unknown state: acknowledging anything
                    // more could lose it, and retrying could ack data that is not there. Stop.
                    tracing::error!(?outcome, "durable commit failed; stopping the node");
                    std::process::exit(70);
                }
            }
        });
    }

    fn release(&mut self, outgoing: Outgoing) {
        match outgoing {
            Outgoing::Reply {
                replies,
                frame,
                name,
                received,
            } => {
                if replies.send(frame).is_ok() {
                    metrics::histogram!("bulwark_node_request_seconds", "op" => name)
                        .record(received.elapsed().as_secs_f64());
                }
            }
            Outgoing::Peer { to, frame } => {
                if let Err(error) = self.peers.send(to, frame) {
                    tracing::debug!(%to, %error, "message to a peer not queued");
                }
            }
            Outgoing::Notify { client, op, frame } => {
                // A client that left gets nothing; it asks again when it returns.
                let replies = self
                    .unanswered
                    .remove(&(client, op))
                    .or_else(|| self.clients.get(&client).cloned());
                if let Some(replies) = replies {
                    let _ = replies.send(frame);
                }
            }
            Outgoing::Attest {
                replica,
                token,
                calls,
            } => match &self.trusted {
                Some(log) => log.call(replica, token, calls, &self.attested),
                None => {
                    // Its replica waits for an answer: it gets one, and says the request failed.
                    let refusal = bulwark_core::a2m::Refusal::Stopped(
                        "this node has no trusted log (cluster.toml names no a2m_key for it)"
                            .into(),
                    );
                    let _ = self.attested.send(Answered {
                        replica,
                        token,
                        answers: vec![Err(refusal)],
                    });
                }
            },
        }
    }

    fn on_durable(&mut self, batch: u64) {
        for replica in self.replicas.values_mut() {
            replica.durable(batch);
        }
        for outgoing in self.sequencer.durable(batch) {
            self.release(outgoing);
        }
    }

    /// Remembers the connection of request `op` of `client` until it is answered.
    fn remember(&mut self, client: ClientId, op: u64, replies: &Replies) {
        if self
            .unanswered
            .insert((client, op), replies.clone())
            .is_none()
        {
            self.unanswered_order.push_back((client, op));
        }
        while self.unanswered_order.len() > UNANSWERED_MAX {
            if let Some(oldest) = self.unanswered_order.pop_front() {
                self.unanswered.remove(&oldest);
            }
        }
    }

    fn status(&self) -> ShardStatus {
        ShardStatus {
            requests: self.requests,
            replicas: self
                .replicas
                .iter()
                .map(|((service, group), replica)| ReplicaStatus {
                    service: replica.service_name().to_string(),
                    service_id: service.0,
                    group: group.0,
                    slot: replica.slot().0,
                    stats: replica.stats(),
                })
                .collect(),
            cs: self
                .replicas
                .values()
                .find_map(|replica| replica.cs_status()),
            causal: self
                .replicas
                .values()
                .flat_map(|replica| replica.causal_status())
                .collect(),
        }
    }

    fn totals(&self) -> ReplicaStats {
        let mut totals = ReplicaStats::default();
        for replica in self.replicas.values() {
            totals.add(&replica.stats());
        }
        totals
    }
}

async fn run(
    context: ShardContext,
    mut jobs: mpsc::Receiver<Job>,
    mut stopped: oneshot::Receiver<()>,
) {
    let ShardContext {
        index,
        replicas,
        committer,
        peers,
        started,
        rejections,
        clock,
        tick: tick_interval,
        trusted,
    } = context;
    let (durable, mut durable_batches) = mpsc::unbounded_channel();
    let (attested, mut answered) = mpsc::unbounded_channel();
    let mut shard = Shard {
        replicas,
        committer,
        peers,
        rejections,
        sequencer: Sequencer::default(),
        durable,
        timers: BTreeMap::new(),
        requests: 0,
        clients: HashMap::new(),
        unanswered: HashMap::new(),
        unanswered_order: std::collections::VecDeque::new(),
        tick: tick_interval,
        trusted,
        attested,
    };
    let mut tick = tokio::time::interval(shard.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let now = || match clock {
        Clock::Monotonic => Time(started.elapsed().as_millis() as u64),
        Clock::Wall => crate::cs::wall_clock(),
    };
    let shard_label = index.to_string();
    loop {
        let next_timer = shard.timers.keys().next().map(|(at, _, _)| *at);
        let timer_due = async {
            match next_timer {
                Some(at) => {
                    let wait = Duration::from_millis(at.0.saturating_sub(now().0));
                    tokio::time::sleep(wait).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stopped => break,
            Some(batch) = durable_batches.recv() => shard.on_durable(batch),
            Some(Answered { replica, token, answers }) = answered.recv() => {
                let batch = shard.sequencer.next_batch();
                if let Some(hosted) = shard.replicas.get_mut(&replica) {
                    let effects = hosted.on_attested(now(), token, answers, batch);
                    shard.apply(replica, effects, None);
                }
            }
            job = jobs.recv() => {
                let Some(job) = job else { break };
                match job {
                    Job::Request { replica, client, peer, access, envelope, received, replies } => {
                        shard.requests += 1;
                        let batch = shard.sequencer.next_batch();
                        let Some(hosted) = shard.replicas.get_mut(&replica) else {
                            continue;
                        };
                        if shard.clients.len() < CLIENTS_REMEMBERED_MAX || shard.clients.contains_key(&client) {
                            shard.clients.insert(client, replies.clone());
                        }
                        let name = hosted.service_name();
                        metrics::counter!("bulwark_node_requests_total", "op" => name).increment(1);
                        let op = envelope.header.op;
                        let effects = hosted.on_request(now(), client, access, &envelope, batch);
                        if effects.reply.is_none() && effects.refused.is_none() {
                            // Answered later, when it executes: on this connection.
                            shard.remember(client, op, &replies);
                        }
                        if let Some(refusal) = &effects.refused {
                            shard.rejections.record(&peer, &format!("refused: {refusal}"));
                        }
                        shard.apply(replica, effects, Some((replies, name, received)));
                    }
                    Job::Message { replica, from, envelope } => {
                        let batch = shard.sequencer.next_batch();
                        let Some(hosted) = shard.replicas.get_mut(&replica) else {
                            continue;
                        };
                        let effects = hosted.on_message(now(), from, &envelope, batch);
                        if let Some(refusal) = &effects.refused {
                            shard.rejections.record(&from.to_string(), &format!("refused: {refusal}"));
                        }
                        shard.apply(replica, effects, None);
                    }
                    Job::Status(answer) => {
                        let _ = answer.send(shard.status());
                    }
                    Job::Install { replica, hosted } => {
                        shard.replicas.insert(replica, hosted);
                    }
                    Job::Remove { replica } => {
                        shard.replicas.remove(&replica);
                        shard.timers.retain(|(_, key, _), _| *key != replica);
                    }
                    Job::Epoch { replica, ring } => {
                        let batch = shard.sequencer.next_batch();
                        if let Some(hosted) = shard.replicas.get_mut(&replica) {
                            let effects = hosted.on_epoch(now(), ring, batch);
                            shard.apply(replica, effects, None);
                        }
                    }
                    Job::Submit { replica, op } => {
                        let batch = shard.sequencer.next_batch();
                        if let Some(hosted) = shard.replicas.get_mut(&replica) {
                            let effects = hosted.submit_own(now(), &op, batch);
                            shard.apply(replica, effects, None);
                        }
                    }
                }
            }
            _ = timer_due => {
                let due: Vec<(Time, ReplicaKey, TimerId)> = shard
                    .timers
                    .keys()
                    .take_while(|(at, _, _)| *at <= now())
                    .copied()
                    .collect();
                for (at, replica, timer) in due {
                    shard.timers.remove(&(at, replica, timer));
                    let batch = shard.sequencer.next_batch();
                    if let Some(hosted) = shard.replicas.get_mut(&replica) {
                        let effects = hosted.on_timer(now(), timer, batch);
                        shard.apply(replica, effects, None);
                    }
                }
            }
            _ = tick.tick() => {
                let keys: Vec<ReplicaKey> = shard.replicas.keys().copied().collect();
                for replica in keys {
                    let batch = shard.sequencer.next_batch();
                    if let Some(hosted) = shard.replicas.get_mut(&replica) {
                        let effects = hosted.on_tick(now(), batch);
                        shard.apply(replica, effects, None);
                    }
                }
                let stats = shard.totals();
                let label = shard_label.clone();
                metrics::gauge!("bulwark_node_objects", "shard" => label.clone()).set(stats.objects as f64);
                metrics::gauge!("bulwark_node_versions", "shard" => label.clone()).set(stats.versions as f64);
                metrics::gauge!("bulwark_node_fragment_bytes", "shard" => label.clone()).set(stats.bytes as f64);
                metrics::gauge!("bulwark_node_collected_total", "shard" => label.clone()).set(stats.collected as f64);
                metrics::gauge!("bulwark_node_damaged_fragments_total", "shard" => label.clone()).set(stats.damaged as f64);
                metrics::gauge!("bulwark_node_transfers_pending", "shard" => label.clone()).set(stats.transfers_pending as f64);
                metrics::gauge!("bulwark_node_transfers_undecided", "shard" => label.clone()).set(stats.transfers_undecided as f64);
                metrics::gauge!("bulwark_node_transferred_keys_total", "shard" => label.clone()).set(stats.transferred_keys as f64);
                metrics::gauge!("bulwark_node_transferred_bytes_total", "shard" => label.clone()).set(stats.transferred_bytes as f64);
                metrics::gauge!("bulwark_node_gated_requests_total", "shard" => label.clone()).set(stats.gated as f64);
                metrics::gauge!("bulwark_node_table_bad_signatures_total", "shard" => label.clone()).set(stats.bad_signatures as f64);
                metrics::gauge!("bulwark_node_table_forged_cells_total", "shard" => label.clone()).set(stats.forged_cells as f64);
                metrics::gauge!("bulwark_node_table_resolved_reads_total", "shard" => label.clone()).set(stats.resolved_reads as f64);
                metrics::gauge!("bulwark_node_table_repairs_total", "shard" => label.clone()).set(stats.repairs as f64);
                metrics::gauge!("bulwark_node_table_synced_cells_total", "shard" => label.clone()).set(stats.synced as f64);
                metrics::gauge!("bulwark_node_table_mac_fallbacks_total", "shard" => label.clone()).set(stats.mac_fallbacks as f64);
                metrics::gauge!("bulwark_node_table_live_confirmed_total", "shard" => label.clone()).set(stats.confirmed_live as f64);
                metrics::gauge!("bulwark_node_table_not_live_total", "shard" => label.clone()).set(stats.not_live as f64);
                metrics::gauge!("bulwark_node_table_revoked_clients", "shard" => label.clone()).set(stats.revoked_clients as f64);
                metrics::gauge!("bulwark_node_table_revoked_refused_total", "shard" => label).set(stats.revoked_refused as f64);
            }
        }
    }
    // Replies and messages waiting for the disk go out once their batches are durable, as they
    // would have without the stop; the committer keeps committing until its last handle goes.
    while shard.sequencer.held() > 0 {
        match tokio::time::timeout(Duration::from_secs(10), durable_batches.recv()).await {
            Ok(Some(batch)) => shard.on_durable(batch),
            _ => break,
        }
    }
    // Dropping the last committer handle commits what is queued and joins its thread, off the
    // runtime.
    drop(shard.replicas);
    let committer = shard.committer;
    let _ = tokio::task::spawn_blocking(move || drop(committer)).await;
}
