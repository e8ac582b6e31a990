//! The node's trusted log (A2M): the component's own process (`bulwark a2m serve`), reached
//! through its local socket. Replicas never call it themselves: they ask their shard in
//! `Output::attest`, the shard hands each batch here once the changes before it are durable, and
//! the answers go back to the replica as an input (docs/a2m.md).
//!
//! One thread makes every call, batch after batch, in the order the shards handed them over: the
//! socket is blocking, and a replica's batches must reach the log in the order it asked. A call
//! the component could not be asked (its process gone, the connection broken mid-call) is
//! answered as refused; the replica decides what that means (A2M-Storage checks where its logs
//! end before it serves again). The connection is made again for the next batch.

use crate::shard::ReplicaKey;
use bulwark_a2m::A2m;
use bulwark_a2m::socket::{Remote, Status};
use bulwark_core::a2m::{Call, Outcome, Refusal};
use bulwark_core::sign::PublicKey;
use bulwark_protocol::machine::Attested;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Batches waiting for the trusted log's thread, at most; a shard beyond it is told the log is
/// overloaded rather than growing a queue without bound.
const BATCHES_QUEUED_MAX: usize = 4096;
/// How long a node waits at start for its trusted log to answer.
const START_WAIT: Duration = Duration::from_secs(10);

/// The answers to one batch, for the shard that asked: which replica, and its token.
pub struct Answered {
    pub replica: ReplicaKey,
    pub token: u64,
    pub answers: Attested,
}

enum Job {
    Batch {
        replica: ReplicaKey,
        token: u64,
        calls: Vec<Call>,
        to: tokio::sync::mpsc::UnboundedSender<Answered>,
    },
    Status(tokio::sync::oneshot::Sender<Result<Status, String>>),
}

/// What the node shows of its trusted log (`bulwark status`, metrics).
#[derive(Default)]
struct Counters {
    batches: u64,
    attestations: u64,
    refused: u64,
    /// The last refusal or failure.
    last_refusal: Option<String>,
}

/// A handle on the node's trusted log.
#[derive(Clone)]
pub struct TrustedLog {
    jobs: mpsc::SyncSender<Job>,
    key: PublicKey,
    socket: Arc<PathBuf>,
    counters: Arc<Mutex<Counters>>,
}

impl TrustedLog {
    /// Connects to the component serving on `socket`, which must be `key`'s (refused
    /// otherwise: the node's verifiers check its attestations under `key` alone), waiting for
    /// it a little if its process is starting too; then starts the thread that makes the calls.
    pub fn start(socket: &Path, key: PublicKey) -> Result<TrustedLog, String> {
        let deadline = Instant::now() + START_WAIT;
        let remote = loop {
            match Remote::connect(socket, Some(key)) {
                Ok(remote) => break remote,
                // Another identity is final; an absent socket may be a process still starting.
                Err(error) if error.to_string().contains("not the configured") => {
                    return Err(error.to_string());
                }
                Err(error) if Instant::now() >= deadline => {
                    return Err(format!(
                        "{error} (start it with `bulwark a2m serve --socket {}`)",
                        socket.display()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let (jobs, received) = mpsc::sync_channel(BATCHES_QUEUED_MAX);
        let log = TrustedLog {
            jobs,
            key,
            socket: Arc::new(socket.to_path_buf()),
            counters: Arc::default(),
        };
        let worker = log.clone();
        std::thread::Builder::new()
            .name("trusted-log".into())
            .spawn(move || worker.run(Some(remote), received))
            .map_err(|error| format!("starting the trusted log's thread: {error}"))?;
        Ok(log)
    }

    /// The component's key.
    pub fn key(&self) -> PublicKey {
        self.key
    }

    /// Queues `calls` for `replica`; the answers come back on `to`. When the queue is full the
    /// batch is answered at once as refused.
    pub fn call(
        &self,
        replica: ReplicaKey,
        token: u64,
        calls: Vec<Call>,
        to: &tokio::sync::mpsc::UnboundedSender<Answered>,
    ) {
        let job = Job::Batch {
            replica,
            token,
            calls,
            to: to.clone(),
        };
        if let Err(error) = self.jobs.try_send(job) {
            let why = match error {
                mpsc::TrySendError::Full(_) => "the trusted log is overloaded",
                mpsc::TrySendError::Disconnected(_) => "the trusted log's thread stopped",
            };
            let answers = vec![Err(Refusal::Stopped(why.into()))];
            self.count(&answers);
            let _ = to.send(Answered {
                replica,
                token,
                answers,
            });
        }
    }

    /// What the component reports of itself, with the node's own counts.
    pub async fn status(&self) -> bulwark_protocol::service::TrustedLogStatus {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let reported = match self.jobs.try_send(Job::Status(answer)) {
            Ok(()) => answered
                .await
                .unwrap_or_else(|_| Err("the trusted log's thread stopped".into())),
            Err(_) => Err("the trusted log is overloaded".into()),
        };
        let counters = self
            .counters
            .lock()
            .map(|c| (c.batches, c.attestations, c.refused, c.last_refusal.clone()));
        let (batches, attestations, refused, last_refusal) =
            counters.unwrap_or((0, 0, 0, Some("counters unavailable".into())));
        let (heads, unreachable, anchor) = match reported {
            Ok(status) => (
                status
                    .heads
                    .into_iter()
                    .map(|(log, head)| (log, head.low, head.high))
                    .collect(),
                None,
                status.anchor,
            ),
            Err(error) => (Vec::new(), Some(error), "unknown".into()),
        };
        bulwark_protocol::service::TrustedLogStatus {
            backend: format!("software (a2m serve), anchored in {anchor}"),
            key: self.key.to_bytes(),
            socket: self.socket.display().to_string(),
            heads,
            batches,
            attestations,
            refused,
            last_refusal,
            unreachable,
        }
    }

    fn count(&self, answers: &[Result<Outcome, Refusal>]) {
        let attestations = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(Outcome::Attested(_))))
            .count() as u64;
        let refusal = answers.iter().find_map(|answer| answer.as_ref().err());
        metrics::counter!("bulwark_node_a2m_batches_total").increment(1);
        metrics::counter!("bulwark_node_a2m_attestations_total").increment(attestations);
        if refusal.is_some() {
            metrics::counter!("bulwark_node_a2m_refusals_total").increment(1);
        }
        if let Ok(mut counters) = self.counters.lock() {
            counters.batches += 1;
            counters.attestations += attestations;
            if let Some(refusal) = refusal {
                counters.refused += 1;
                counters.last_refusal = Some(refusal.to_string());
            }
        }
    }

    fn run(self, mut remote: Option<Remote>, jobs: mpsc::Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            if remote.as_ref().is_some_and(Remote::is_closed) {
                remote = None;
            }
            if remote.is_none() {
                remote = Remote::connect(&self.socket, Some(self.key))
                    .map_err(|error| tracing::warn!(%error, "the trusted log is unreachable"))
                    .ok();
            }
            match job {
                Job::Batch {
                    replica,
                    token,
                    calls,
                    to,
                } => {
                    let started = Instant::now();
                    let answers = match &mut remote {
                        Some(remote) => remote.call_all(&calls),
                        None => vec![Err(Refusal::Stopped(format!(
                            "cannot reach the trusted log at {}",
                            self.socket.display()
                        )))],
                    };
                    metrics::histogram!("bulwark_node_a2m_batch_seconds")
                        .record(started.elapsed().as_secs_f64());
                    // A component that stopped, or a connection that broke, is asked again
                    // through a new connection: it says then whether it can serve.
                    if matches!(answers.last(), Some(Err(Refusal::Stopped(_)))) {
                        remote = None;
                    }
                    self.count(&answers);
                    let _ = to.send(Answered {
                        replica,
                        token,
                        answers,
                    });
                }
                Job::Status(answer) => {
                    let status = match remote.as_mut().map(Remote::status) {
                        Some(Ok(status)) => Ok(status),
                        Some(Err(error)) => {
                            remote = None;
                            Err(error.to_string())
                        }
                        None => Err(format!(
                            "cannot reach the trusted log at {}",
                            self.socket.display()
                        )),
                    };
                    let _ = answer.send(status);
                }
            }
        }
    }
}
