//! The actor that owns the protocol machine: one task, so the machine needs no locks and handles
//! requests in a single order, which is also the order their changes reach the disk.

use crate::Rejections;
use crate::verified::{VERIFIED_BYTES_MAX, Verified};
use bulwark_core::Digest;
use bulwark_core::{ClientId, Key, NodeId, Time, wire};
use bulwark_protocol::powerstore::{
    Access, Change, Fragments, Request, ServerLogic, ServerStats, StoredEntry, Timestamp,
    fragment_digest,
};
use bulwark_protocol::service::{NodeFrame, NodeStatus};
use bulwark_protocol::{abd, phalanx};
use bulwark_storage::{Committer, Namespace, StorageOp, Store, Table};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Requests waiting for the actor; connections wait (back-pressure) beyond this.
const JOBS_QUEUED_MAX: usize = 4096;
/// How often superseded versions are garbage-collected and gauges refreshed.
const TICK_INTERVAL: Duration = Duration::from_millis(500);

/// PoWerStore's `Hist` entries: fragments and their metadata, one record per version.
pub const HIST: &str = "hist";
/// PoWerStore's `lc`: one candidate per key.
pub const LC: &str = "lc";
/// The baselines' (ABD, Phalanx) stored version: one record per key.
pub const REGISTER: &str = "register";

/// The server of the protocol the cluster runs: the one thing in the node that differs between
/// protocols. A request for another protocol is refused and counted.
pub enum Machine {
    PowerStore(Box<dyn ServerLogic>),
    Abd(abd::Server),
    Phalanx(phalanx::Server),
}

impl Machine {
    fn protocol(&self) -> &'static str {
        match self {
            Machine::PowerStore(_) => "powerstore",
            Machine::Abd(_) => "abd",
            Machine::Phalanx(_) => "phalanx",
        }
    }

    fn stats(&self) -> ServerStats {
        match self {
            Machine::PowerStore(server) => server.stats(),
            Machine::Abd(server) => {
                let stats = server.stats();
                baseline_stats(stats.objects, stats.keys, stats.value_bytes)
            }
            Machine::Phalanx(server) => {
                let stats = server.stats();
                baseline_stats(stats.objects, stats.keys, stats.value_bytes)
            }
        }
    }
}

/// A baseline keeps one whole version per key.
fn baseline_stats(objects: u64, keys: u64, value_bytes: u64) -> ServerStats {
    ServerStats {
        objects,
        keys,
        versions: keys,
        fragment_bytes: value_bytes,
        ..ServerStats::default()
    }
}

/// A protocol request, as decoded from a client frame.
pub enum ProtocolRequest {
    PowerStore(Request),
    Abd(abd::Request),
    Phalanx(phalanx::Request),
}

impl ProtocolRequest {
    fn name(&self) -> &'static str {
        match self {
            ProtocolRequest::PowerStore(request) => request.body.name(),
            ProtocolRequest::Abd(request) => request.body.name(),
            ProtocolRequest::Phalanx(request) => request.body.name(),
        }
    }
}

/// What the actor is given at start.
pub struct ActorContext {
    pub node: NodeId,
    pub server: Machine,
    /// Where `server`'s state is stored.
    pub namespace: Namespace,
    /// Read by FILTER replies; written only through `committer`.
    pub store: Arc<Store>,
    pub committer: Committer,
    pub started: Instant,
    pub rejections: Rejections,
}

/// Work for the actor.
// Short-lived and moved once through a channel; boxing the request would cost an allocation each.
#[allow(clippy::large_enum_variant)]
pub enum Job {
    Request {
        from: ClientId,
        peer: Arc<str>,
        access: Access,
        request: ProtocolRequest,
        received: Instant,
        reply: mpsc::Sender<Bytes>,
    },
    Status {
        nonce: u64,
        reply: mpsc::Sender<Bytes>,
    },
}

/// A handle to send jobs.
#[derive(Clone)]
pub struct ActorHandle(mpsc::Sender<Job>);

impl ActorHandle {
    pub async fn send(&self, job: Job) -> bool {
        self.0.send(job).await.is_ok()
    }
}

/// Stops the actor on shutdown.
pub struct Stopper {
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Stopper {
    /// Asks the actor to stop after the job in hand and waits until everything it queued for
    /// the disk is durable and its committer has stopped. Replies still waiting for a commit are
    /// sent only if that commit succeeds, as always.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.done.await;
    }
}

pub fn spawn(context: ActorContext) -> (ActorHandle, Stopper) {
    let (sender, receiver) = mpsc::channel(JOBS_QUEUED_MAX);
    let (stop, stopped) = oneshot::channel();
    let done = tokio::spawn(run(context, receiver, stopped));
    (ActorHandle(sender), Stopper { stop, done })
}

struct Durability {
    committer: Committer,
    submitted: u64,
    durable: watch::Sender<u64>,
}

impl Durability {
    /// The sequence number the next non-empty [`Durability::submit`] will return.
    fn submit_next(&self) -> u64 {
        self.submitted + 1
    }

    /// Queues `ops` for the next group commit and returns their sequence number.
    fn submit(&mut self, ops: Vec<StorageOp>) -> u64 {
        if ops.is_empty() {
            return self.submitted;
        }
        self.submitted += 1;
        let sequence = self.submitted;
        let done = self.committer.submit(ops);
        let durable = self.durable.clone();
        tokio::spawn(async move {
            match done.await {
                Ok(Ok(())) => {
                    // Batches become durable in submission order, so this covers all before it.
                    durable.send_if_modified(|d| {
                        let raised = sequence > *d;
                        if raised {
                            *d = sequence;
                        }
                        raised
                    });
                }
                outcome => {
                    // A failed fsync leaves the disk in an unknown state: acknowledging anything
                    // more could lose it, and retrying could ack data that is not there. Stop.
                    tracing::error!(?outcome, "durable commit failed; stopping the node");
                    std::process::exit(70);
                }
            }
        });
        sequence
    }

    /// Sends `frame` once everything submitted so far is durable.
    fn reply_when_durable(
        &self,
        frame: Bytes,
        reply: mpsc::Sender<Bytes>,
        finished: impl FnOnce() + Send + 'static,
    ) {
        let needed = self.submitted;
        if *self.durable.borrow() >= needed {
            if reply.try_send(frame).is_ok() {
                finished();
            }
            return;
        }
        let mut durable = self.durable.subscribe();
        tokio::spawn(async move {
            if durable.wait_for(|d| *d >= needed).await.is_ok() && reply.try_send(frame).is_ok() {
                finished();
            }
        });
    }
}

/// The server's view of its fragments: what was handled but is not yet durable, then the disk.
/// Requests are handled in order, so a fragment a FILTER needs is either committed or queued here.
struct StorageView<'a> {
    /// `Hist` records queued for commit, with the sequence number of the batch carrying them.
    unsynced: &'a HashMap<Vec<u8>, (u64, Bytes)>,
    store: &'a Store,
    hist: Table,
    /// Fragments already found intact: served again without a disk read or a re-hash.
    verified: &'a RefCell<Verified>,
}

impl Fragments for StorageView<'_> {
    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        let record = hist_record(key, ts);
        if let Some((_, fragment)) = self.unsynced.get(&record) {
            return Some(fragment.clone());
        }
        let value = match self.store.get(self.hist, &record) {
            Ok(value) => value?,
            Err(error) => {
                tracing::error!(%error, "reading a fragment failed");
                return None;
            }
        };
        // The fragment is served as a slice of the record read from disk: no second copy.
        match wire::decode_shared::<(Key, StoredEntry)>(&value, usize::MAX) {
            Ok((_, entry)) => Some(entry.fragment),
            Err(error) => {
                tracing::error!(%error, "a stored fragment record does not decode");
                None
            }
        }
    }

    fn intact_fragment(&self, key: &Key, ts: &Timestamp, digest: &Digest) -> Option<Bytes> {
        let record = hist_record(key, ts);
        if let Some(fragment) = self.verified.borrow().get(&record, digest) {
            return Some(fragment);
        }
        // Not yet durable: a slice of the STORE's receive buffer, which may be larger than the
        // fragment, so it is not kept; it is about to be on disk anyway.
        if let Some((_, fragment)) = self.unsynced.get(&record) {
            return Some(fragment.clone()).filter(|f| fragment_digest(f) == *digest);
        }
        let fragment = self.fragment(key, ts)?;
        if fragment_digest(&fragment) != *digest {
            return None;
        }
        self.verified
            .borrow_mut()
            .insert(record, *digest, fragment.clone());
        Some(fragment)
    }
}

/// Remembers the fragments of `changes` until batch `sequence` is durable.
fn track_unsynced(
    unsynced: &mut HashMap<Vec<u8>, (u64, Bytes)>,
    verified: &RefCell<Verified>,
    changes: &[Change],
    sequence: u64,
) {
    for change in changes {
        match change {
            Change::PutHist { key, entry } => {
                let record = hist_record(key, &entry.ts);
                verified.borrow_mut().remove(&record);
                unsynced.insert(record, (sequence, entry.fragment.clone()));
            }
            Change::DeleteHist { key, ts } => {
                let record = hist_record(key, ts);
                verified.borrow_mut().remove(&record);
                unsynced.remove(&record);
            }
            Change::SetLc { .. } => {}
        }
    }
}

/// The storage record id of `Hist[ts]` of `key`: length-prefixed key, then the fixed-width ts.
pub fn hist_record(key: &Key, ts: &Timestamp) -> Vec<u8> {
    let bytes = key.as_bytes();
    let mut record = Vec::with_capacity(2 + bytes.len() + 52);
    record.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    record.extend_from_slice(bytes);
    record.extend_from_slice(&ts.canonical());
    record
}

/// The storage record of a baseline's stored version: the key's bytes, the value `(key, entry)`
/// encoded.
pub fn register_op(namespace: Namespace, key: &Key, encoded: Vec<u8>) -> StorageOp {
    StorageOp::Put {
        table: namespace.table(REGISTER),
        key: key.as_bytes().to_vec(),
        value: Bytes::from(encoded),
    }
}

fn abd_op(namespace: Namespace, change: abd::Change) -> StorageOp {
    match change {
        abd::Change::Put { key, entry } => {
            register_op(namespace, &key, wire::encode(&(&key, &entry)))
        }
    }
}

fn phalanx_op(namespace: Namespace, change: phalanx::Change) -> StorageOp {
    match change {
        phalanx::Change::Put { key, entry } => {
            register_op(namespace, &key, wire::encode(&(&key, &entry)))
        }
    }
}

fn storage_op(namespace: Namespace, change: Change) -> StorageOp {
    match change {
        Change::PutHist { key, entry } => StorageOp::Put {
            table: namespace.table(HIST),
            key: hist_record(&key, &entry.ts),
            value: Bytes::from(wire::encode(&(&key, &entry))),
        },
        Change::DeleteHist { key, ts } => StorageOp::Delete {
            table: namespace.table(HIST),
            key: hist_record(&key, &ts),
        },
        Change::SetLc { key, candidate } => StorageOp::Put {
            table: namespace.table(LC),
            key: key.as_bytes().to_vec(),
            value: Bytes::from(wire::encode(&(&key, &candidate))),
        },
    }
}

async fn run(
    context: ActorContext,
    mut jobs: mpsc::Receiver<Job>,
    mut stopped: oneshot::Receiver<()>,
) {
    let ActorContext {
        node,
        mut server,
        namespace,
        store,
        committer,
        started,
        rejections,
    } = context;
    let mut unsynced: HashMap<Vec<u8>, (u64, Bytes)> = HashMap::new();
    let verified = RefCell::new(Verified::new(VERIFIED_BYTES_MAX));
    let (durable, _) = watch::channel(0u64);
    let mut durability = Durability {
        committer,
        submitted: 0,
        durable,
    };
    let mut requests: u64 = 0;
    let mut tick = tokio::time::interval(TICK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let now = |started: Instant| Time(started.elapsed().as_millis() as u64);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            job = jobs.recv() => {
                let Some(job) = job else { break };
                match job {
                    Job::Request { from, peer, access, request, received, reply } => {
                        requests += 1;
                        let name = request.name();
                        metrics::counter!("bulwark_node_requests_total", "op" => name).increment(1);
                        let (ops, frame, refused) = match (&mut server, request) {
                            (Machine::PowerStore(server), ProtocolRequest::PowerStore(request)) => {
                                let durable = *durability.durable.borrow();
                                unsynced.retain(|_, (sequence, _)| *sequence > durable);
                                let view = StorageView { unsynced: &unsynced, store: &store, hist: namespace.table(HIST), verified: &verified };
                                let handled = server.handle(now(started), from, access, request, &view);
                                track_unsynced(&mut unsynced, &verified, &handled.changes, durability.submit_next());
                                let ops = handled.changes.into_iter().map(|c| storage_op(namespace, c)).collect();
                                let frame = handled.reply.map(NodeFrame::PowerStore);
                                (ops, frame, handled.refused.map(|r| r.to_string()))
                            }
                            (Machine::Abd(server), ProtocolRequest::Abd(request)) => {
                                let handled = server.handle(access.write, access.read, request);
                                let ops = handled.changes.into_iter().map(|c| abd_op(namespace, c)).collect();
                                (ops, Some(NodeFrame::Abd(handled.reply)), handled.refused.map(|r| r.to_string()))
                            }
                            (Machine::Phalanx(server), ProtocolRequest::Phalanx(request)) => {
                                let handled = server.handle(from, access.write, access.read, request);
                                let ops = handled.changes.into_iter().map(|c| phalanx_op(namespace, c)).collect();
                                (ops, Some(NodeFrame::Phalanx(handled.reply)), handled.refused.map(|r| r.to_string()))
                            }
                            (server, _) => {
                                let reason = format!("a request for another protocol than {}", server.protocol());
                                (Vec::new(), None, Some(reason))
                            }
                        };
                        if let Some(refusal) = &refused {
                            rejections.record(&peer, &format!("refused: {refusal}"));
                        }
                        durability.submit(ops);
                        if let Some(frame) = frame {
                            let frame = Bytes::from(wire::encode(&frame));
                            metrics::counter!("bulwark_node_reply_bytes_total", "op" => name).increment(frame.len() as u64);
                            durability.reply_when_durable(frame, reply, move || {
                                metrics::histogram!("bulwark_node_request_seconds", "op" => name)
                                    .record(received.elapsed().as_secs_f64());
                            });
                        }
                    }
                    Job::Status { nonce, reply } => {
                        let status = NodeStatus {
                            node: node.0,
                            version: env!("CARGO_PKG_VERSION").to_string(),
                            uptime_seconds: started.elapsed().as_secs(),
                            protocol: server.protocol().to_string(),
                            server: server.stats(),
                            requests,
                            rejected: rejections.snapshot(),
                        };
                        let frame = Bytes::from(wire::encode(&NodeFrame::Status { nonce, status }));
                        let _ = reply.try_send(frame);
                    }
                }
            }
            _ = tick.tick() => {
                if let Machine::PowerStore(server) = &mut server {
                    let changes = server.tick(now(started));
                    track_unsynced(&mut unsynced, &verified, &changes, durability.submit_next());
                    durability.submit(changes.into_iter().map(|c| storage_op(namespace, c)).collect());
                }
                let stats = server.stats();
                metrics::gauge!("bulwark_node_objects").set(stats.objects as f64);
                metrics::gauge!("bulwark_node_versions").set(stats.versions as f64);
                metrics::gauge!("bulwark_node_fragment_bytes").set(stats.fragment_bytes as f64);
                metrics::gauge!("bulwark_node_collected_total").set(stats.collected as f64);
                metrics::gauge!("bulwark_node_damaged_fragments_total").set(stats.damaged_fragments as f64);
                metrics::gauge!("bulwark_node_verified_fragment_bytes").set(verified.borrow().bytes() as f64);
            }
        }
    }
    // Dropping the committer commits what is queued and joins its thread: off the runtime.
    drop(server);
    let Durability { committer, .. } = durability;
    let _ = tokio::task::spawn_blocking(move || drop(committer)).await;
}
