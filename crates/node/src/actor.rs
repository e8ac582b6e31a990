//! The actor that owns the protocol machine: one task, so the machine needs no locks and handles
//! requests in a single order, which is also the order their changes reach the disk.

use crate::Rejections;
use bulwark_core::{ClientId, Key, NodeId, Time, wire};
use bulwark_protocol::powerstore::{Access, Change, Request, ServerLogic, Timestamp};
use bulwark_protocol::service::{NodeFrame, NodeStatus};
use bulwark_storage::{Committer, StorageOp, Table};
use bytes::Bytes;
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
        committer,
        started,
        rejections,
    } = context;
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
                        let handled = server.handle(now(started), from, access, request);
                        if let Some(refusal) = &handled.refused {
                            rejections.record(&peer, &format!("refused: {refusal}"));
                        }
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
                durability.submit(changes);
                let stats = server.stats();
                metrics::gauge!("bulwark_node_objects").set(stats.objects as f64);
                metrics::gauge!("bulwark_node_versions").set(stats.versions as f64);
                metrics::gauge!("bulwark_node_fragment_bytes").set(stats.fragment_bytes as f64);
                metrics::gauge!("bulwark_node_collected_total").set(stats.collected as f64);
            }
        }
    }
    // Dropping the committer commits what is queued and joins its thread: off the runtime.
    drop(server);
    let Durability { committer, .. } = durability;
    let _ = tokio::task::spawn_blocking(move || drop(committer)).await;
}
