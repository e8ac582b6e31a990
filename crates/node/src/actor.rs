//! The actor that owns the protocol machine: one task, so the machine needs no locks and handles
//! requests in a single order, which is also the order their changes reach the disk.

use crate::Rejections;
use bulwark_core::{ClientId, Key, NodeId, Time, wire};
use bulwark_protocol::powerstore::{
    Access, Change, Fragments, Request, ServerLogic, StoredEntry, Timestamp,
};
use bulwark_protocol::service::{NodeFrame, NodeStatus};
use bulwark_storage::{Committer, StorageOp, Store, Table};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Requests waiting for the actor; connections wait (back-pressure) beyond this.
const JOBS_QUEUED_MAX: usize = 4096;
/// How often superseded versions are garbage-collected and gauges refreshed.
const TICK_INTERVAL: Duration = Duration::from_millis(500);

/// What the actor is given at start.
pub struct ActorContext {
    pub node: NodeId,
    pub server: Box<dyn ServerLogic>,
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
        request: Request,
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

    /// Queues `changes` for the next group commit and returns their sequence number.
    fn submit(&mut self, changes: Vec<Change>) -> u64 {
        if changes.is_empty() {
            return self.submitted;
        }
        self.submitted += 1;
        let sequence = self.submitted;
        let ops = changes.into_iter().map(storage_op).collect();
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
}

impl Fragments for StorageView<'_> {
    fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        let record = hist_record(key, ts);
        if let Some((_, fragment)) = self.unsynced.get(&record) {
            return Some(fragment.clone());
        }
        let value = match self.store.get(Table::Hist, &record) {
            Ok(value) => value?,
            Err(error) => {
                tracing::error!(%error, "reading a fragment failed");
                return None;
            }
        };
        match wire::decode::<(Key, StoredEntry)>(&value, usize::MAX) {
            Ok((_, entry)) => Some(entry.fragment),
            Err(error) => {
                tracing::error!(%error, "a stored fragment record does not decode");
                None
            }
        }
    }
}

/// Remembers the fragments of `changes` until batch `sequence` is durable.
fn track_unsynced(
    unsynced: &mut HashMap<Vec<u8>, (u64, Bytes)>,
    changes: &[Change],
    sequence: u64,
) {
    for change in changes {
        match change {
            Change::PutHist { key, entry } => {
                unsynced.insert(
                    hist_record(key, &entry.ts),
                    (sequence, entry.fragment.clone()),
                );
            }
            Change::DeleteHist { key, ts } => {
                unsynced.remove(&hist_record(key, ts));
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

fn storage_op(change: Change) -> StorageOp {
    match change {
        Change::PutHist { key, entry } => StorageOp::Put {
            table: Table::Hist,
            key: hist_record(&key, &entry.ts),
            value: Bytes::from(wire::encode(&(&key, &entry))),
        },
        Change::DeleteHist { key, ts } => StorageOp::Delete {
            table: Table::Hist,
            key: hist_record(&key, &ts),
        },
        Change::SetLc { key, candidate } => StorageOp::Put {
            table: Table::Lc,
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
        store,
        committer,
        started,
        rejections,
    } = context;
    let mut unsynced: HashMap<Vec<u8>, (u64, Bytes)> = HashMap::new();
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
                        let name = request.body.name();
                        metrics::counter!("bulwark_node_requests_total", "op" => name).increment(1);
                        let durable = *durability.durable.borrow();
                        unsynced.retain(|_, (sequence, _)| *sequence > durable);
                        let view = StorageView { unsynced: &unsynced, store: &store };
                        let handled = server.handle(now(started), from, access, request, &view);
                        if let Some(refusal) = &handled.refused {
                            rejections.record(&peer, &format!("refused: {refusal}"));
                        }
                        let sequence = durability.submit_next();
                        track_unsynced(&mut unsynced, &handled.changes, sequence);
                        durability.submit(handled.changes);
                        if let Some(response) = handled.reply {
                            let frame = Bytes::from(wire::encode(&NodeFrame::PowerStore(response)));
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
                let changes = server.tick(now(started));
                track_unsynced(&mut unsynced, &changes, durability.submit_next());
                durability.submit(changes);
                let stats = server.stats();
                metrics::gauge!("bulwark_node_objects").set(stats.objects as f64);
                metrics::gauge!("bulwark_node_versions").set(stats.versions as f64);
                metrics::gauge!("bulwark_node_fragment_bytes").set(stats.fragment_bytes as f64);
                metrics::gauge!("bulwark_node_collected_total").set(stats.collected as f64);
                metrics::gauge!("bulwark_node_damaged_fragments_total").set(stats.damaged_fragments as f64);
            }
        }
    }
    // Dropping the committer commits what is queued and joins its thread: off the runtime.
    drop(server);
    let Durability { committer, .. } = durability;
    let _ = tokio::task::spawn_blocking(move || drop(committer)).await;
}
