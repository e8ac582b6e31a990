//! The deterministic simulator: seeded runs of the real protocol machines (M-PoWerStore, and the
//! ABD and Phalanx baselines, each behind [`protocol::Protocol`]) under adversarial schedules,
//! checked for linearizability and wait-freedom (DESIGN.md §9.4 step 4); and, through
//! [`run_service`], services with checkers of their own, such as the configuration service
//! (PBFT, [`protocols::cs`]).
//!
//! A run ([`run`]) is a function of its seed and [`SimConfig`] alone. The swarm ([`swarm`])
//! picks which faults the seed switches on; the world (`world.rs`) then plays a *safety phase* in
//! which anything allowed may happen (Byzantine servers and readers, loss, duplication, long
//! reordering, partitions, crashes of servers and clients, aggressive garbage collection), and a
//! *liveness phase* in which the network heals and stops losing messages, crashed servers
//! restart, at most `f` servers stay faulty, and every operation of a correct client must
//! complete within a bound of virtual time. The history of correct clients' operations goes to the
//! per-key linearizability checker.
//!
//! [`sweep`] runs many seeds on several threads (one run per thread at a time, so each run stays
//! single-threaded and reproducible) and [`first_failure`] finds the first failing seed, which the
//! negative controls use to prove the simulator can fail. What this module does not do: simulate
//! the async node and client shells (that is turmoil's job) or model disk corruption.

pub mod config;
pub mod protocol;
pub mod protocols;
pub mod swarm;
mod world;

pub use config::{FaultSet, Mutations, Nemesis, SimConfig, UnknownFault, UnknownMutation};

use crate::checker;
use bulwark_core::config::Protocol;

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counters of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Operations correct clients invoked.
    pub ops_invoked: u64,
    /// Writes (and deletes) that completed.
    pub writes_completed: u64,
    /// Reads that completed.
    pub reads_completed: u64,
    /// Operations that ended in a protocol error.
    pub failed: u64,
    /// Operations that ended without learning whether they took effect (writes cut by a change
    /// of their key's group after revealing their nonce).
    pub unknown: u64,
    /// Reads that ran REPAIR.
    pub repairs: u64,
    /// Reads that ended after their first round.
    pub one_round_reads: u64,
    /// Read restarts because a version was garbage-collected.
    pub read_restarts: u64,
    /// Writes of a sole writer stored again above a stale refusal's `lc`.
    pub write_restarts: u64,
    /// FILTER rounds of correct readers that carried a twin: two candidates with the same
    /// timestamp and different nonces (spec §4.8(a)).
    pub twin_filters: u64,
    /// Misbehaviour reports readers produced.
    pub evidence: u64,
    /// Messages sent (requests and replies, retransmissions included).
    pub messages: u64,
    /// Messages handed to their destination.
    pub delivered: u64,
    /// Messages the network lost.
    pub lost: u64,
    /// Messages the network delivered twice.
    pub duplicated: u64,
    /// Messages dropped by a partition.
    pub partitioned: u64,
    /// Messages that arrived at a crashed process.
    pub to_crashed: u64,
    /// Requests clients retransmitted.
    pub retransmitted: u64,
    /// Requests servers refused.
    pub refusals: u64,
    /// Requests Byzantine readers made up.
    pub attacks: u64,
    /// Correct-server crashes.
    pub server_crashes: u64,
    /// Correct-client crashes.
    pub client_crashes: u64,
    /// Partitions started.
    pub partitions: u64,
    /// Changes that became durable, over all servers.
    pub durable_changes: u64,
    /// Calls servers made to their trusted logs.
    pub attested: u64,
    /// When the liveness phase began.
    pub liveness_started_millis: u64,
    /// Virtual time at the end of the run.
    pub virtual_millis: u64,
}

/// The result of one seed.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The seed.
    pub seed: u64,
    /// What the swarm switched on for this seed.
    pub swarm: String,
    /// Every operation of a correct client, in invocation order. Clients appear as
    /// `index * 1000 + incarnation`; written values as `w<write id>`; a read of bytes no write
    /// produced as `unwritten:` with a hex prefix and the length.
    pub history: checker::History,
    /// The linearizability checker's verdict on `history`.
    pub report: checker::Report,
    /// Operations of correct clients that missed their liveness deadline.
    pub liveness_violations: Vec<String>,
    /// Other broken promises: a correct client's operation failed, or a reader blamed a correct
    /// server.
    pub other_violations: Vec<String>,
    /// Counters.
    pub stats: RunStats,
    /// One line per event, when the configuration asked for a trace.
    pub trace: Vec<String>,
}

impl RunResult {
    /// Whether the run broke no promise. A history the checker could not decide within its
    /// budget is not a failure, but is counted by [`sweep`] (see [`RunResult::inconclusive`]).
    pub fn passed(&self) -> bool {
        self.report.violations.is_empty()
            && self.liveness_violations.is_empty()
            && self.other_violations.is_empty()
    }

    /// A report for humans: what the swarm chose, the counters, every violation, and the trace
    /// when one was recorded. This is what `bulwark sim --seed S --trace` prints.
    pub fn render(&self) -> String {
        let mut out = format!(
            "seed {}\nswarm: {}\n{:#?}\n",
            self.seed, self.swarm, self.stats
        );
        out.push_str(&format!(
            "checked {} operations on {} keys\n",
            self.report.ops_checked, self.report.keys_checked
        ));
        if !self.report.inconclusive.is_empty() {
            out.push_str(&format!(
                "inconclusive keys: {}\n",
                self.report
                    .inconclusive
                    .iter()
                    .map(|key| String::from_utf8_lossy(key).into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let violations = self.violations();
        out.push_str(&format!("violations: {}\n", violations.len()));
        for violation in violations {
            out.push_str(&format!("  {violation}\n"));
        }
        if !self.trace.is_empty() {
            out.push_str("trace (c = client, s = server; a line is written when a message is delivered or lost):\n");
            for line in &self.trace {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Whether the checker gave up on some key.
    pub fn inconclusive(&self) -> bool {
        !self.report.inconclusive.is_empty()
    }

    /// Every violation, one line each.
    pub fn violations(&self) -> Vec<String> {
        let safety = self.report.violations.iter().map(|v| {
            format!(
                "linearizability: key {}: {}",
                String::from_utf8_lossy(&v.key),
                v.explanation
            )
        });
        let liveness = self
            .liveness_violations
            .iter()
            .map(|v| format!("wait-freedom: {v}"));
        let other = self.other_violations.iter().cloned();
        safety.chain(liveness).chain(other).collect()
    }

    /// Operations the checker examined.
    pub fn ops_checked(&self) -> u64 {
        self.report.ops_checked as u64
    }
}

/// Runs one seed of `config.protocol`.
pub fn run(seed: u64, config: &SimConfig) -> RunResult {
    match config.protocol {
        Protocol::PowerStore => run_service::<protocols::powerstore::PowerStore>(seed, config),
        Protocol::Abd => run_service::<protocols::registers::Abd>(seed, config),
        Protocol::Phalanx => run_service::<protocols::registers::Phalanx>(seed, config),
    }
}

/// Runs one seed of service `S`, judged by its own checker (`config.protocol` is ignored).
pub fn run_service<S: protocol::Protocol>(seed: u64, config: &SimConfig) -> RunResult {
    let (swarm, outcome) = world::simulate::<S>(seed, config);
    RunResult {
        seed,
        swarm: swarm.describe(),
        history: outcome.history,
        report: outcome.report,
        liveness_violations: outcome.liveness_violations,
        other_violations: outcome.other_violations,
        stats: outcome.stats,
        trace: outcome.trace,
    }
}

/// What a sweep found.
#[derive(Clone, Debug, Default)]
pub struct SweepSummary {
    /// Seeds run.
    pub seeds_run: u64,
    /// Operations the checker examined, over all seeds.
    pub ops_checked: u64,
    /// Operations correct clients invoked, over all seeds.
    pub ops_invoked: u64,
    /// Every failing seed with its first violation, in seed order.
    pub violations: Vec<(u64, String)>,
    /// Failing seeds whose failures include a wait-freedom violation.
    pub liveness_failures: u64,
    /// Seeds the checker could not decide within its budget.
    pub inconclusive: u64,
    /// Wall-clock time the sweep took.
    pub elapsed: Duration,
}

impl SweepSummary {
    /// Seeds per wall-clock second.
    pub fn seeds_per_second(&self) -> f64 {
        self.seeds_run as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Fails (a test) unless no seed failed or was inconclusive and the sweep checked more than
    /// `ops_per_seed` operations per seed; `render` says which seeds failed, and how to replay
    /// them.
    pub fn assert_clean(&self, ops_per_seed: u64, render: impl FnOnce() -> String) {
        assert!(self.violations.is_empty(), "{}", render());
        assert_eq!(self.inconclusive, 0, "inconclusive seeds");
        assert!(
            self.ops_checked > self.seeds_run * ops_per_seed,
            "the sweep checked too little: {} operations in {} seeds",
            self.ops_checked,
            self.seeds_run
        );
    }

    /// One line for a test's output: seeds, speed, operations, failures.
    pub fn headline(&self, name: &str) -> String {
        format!(
            "{name}: {} seeds in {:.1?} ({:.1} seeds/s), {} operations invoked, {} checked, {} failing seeds ({} on liveness), {} inconclusive",
            self.seeds_run,
            self.elapsed,
            self.seeds_per_second(),
            self.ops_invoked,
            self.ops_checked,
            self.violations.len(),
            self.liveness_failures,
            self.inconclusive,
        )
    }

    /// A report for humans: totals, then each failing seed with the command that replays it.
    pub fn render(&self, config: &SimConfig) -> String {
        self.render_replaying(|seed| config.replay_command(seed))
    }

    /// [`SweepSummary::render`] for a service with its own workload and checker, whose replay
    /// commands name it (`--protocol cs`, `content`, `pubkey`).
    pub fn render_service(&self, config: &SimConfig, service: &str) -> String {
        self.render_replaying(|seed| config.service_replay_command(seed, service))
    }

    fn render_replaying(&self, replay: impl Fn(u64) -> String) -> String {
        let mut out = format!(
            "seeds run: {}\noperations checked: {}\nviolations: {}\n",
            self.seeds_run,
            self.ops_checked,
            self.violations.len()
        );
        if self.inconclusive > 0 {
            out.push_str(&format!("inconclusive seeds: {}\n", self.inconclusive));
        }
        for (seed, description) in &self.violations {
            out.push_str(&format!(
                "seed {seed}: {description}\n  replay: {}\n",
                replay(*seed)
            ));
        }
        out
    }
}

/// Runs every seed in `seeds` over `threads` threads and summarises. A panic inside a run is a
/// violation of that seed, not the end of the sweep.
pub fn sweep(seeds: Range<u64>, config: &SimConfig, threads: usize) -> SweepSummary {
    sweep_with(seeds, config, threads, run)
}

/// [`sweep`] for service `S`.
pub fn sweep_service<S: protocol::Protocol>(
    seeds: Range<u64>,
    config: &SimConfig,
    threads: usize,
) -> SweepSummary {
    sweep_with(seeds, config, threads, run_service::<S>)
}

fn sweep_with(seeds: Range<u64>, config: &SimConfig, threads: usize, run: Runner) -> SweepSummary {
    let started = Instant::now();
    let quiet = SimConfig {
        trace: false,
        ..config.clone()
    };
    let next = AtomicU64::new(seeds.start);
    let results: Mutex<Vec<SeedVerdict>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end {
                        break;
                    }
                    let verdict = judge(seed, &quiet, run);
                    if let Ok(mut results) = results.lock() {
                        results.push(verdict);
                    }
                }
            });
        }
    });
    let mut verdicts = results.into_inner().unwrap_or_default();
    verdicts.sort_by_key(|v| v.seed);
    let mut summary = SweepSummary {
        elapsed: started.elapsed(),
        ..SweepSummary::default()
    };
    for verdict in verdicts {
        summary.seeds_run += 1;
        summary.ops_checked += verdict.ops_checked;
        summary.ops_invoked += verdict.ops_invoked;
        summary.inconclusive += u64::from(verdict.inconclusive);
        if verdict.liveness_failure {
            summary.liveness_failures += 1;
        }
        if let Some(description) = verdict.failure {
            summary.violations.push((verdict.seed, description));
        }
    }
    summary
}

/// The first failing seed of a range, if any.
#[derive(Clone, Debug)]
pub struct FirstFailure {
    /// The seed and its first violation.
    pub failure: Option<(u64, String)>,
    /// Seeds up to and including the failing one (all of them when none failed).
    pub seeds_run: u64,
    /// Wall-clock time taken.
    pub elapsed: Duration,
}

/// Runs seeds in order over `threads` threads until one fails, and returns the lowest failing
/// seed: workers only skip seeds above a failure already found, so the answer does not depend on
/// thread timing.
pub fn first_failure(seeds: Range<u64>, config: &SimConfig, threads: usize) -> FirstFailure {
    first_failure_with(seeds, config, threads, run)
}

/// [`first_failure`] for service `S`.
pub fn first_failure_service<S: protocol::Protocol>(
    seeds: Range<u64>,
    config: &SimConfig,
    threads: usize,
) -> FirstFailure {
    first_failure_with(seeds, config, threads, run_service::<S>)
}

/// A negative control: finds a seed within `within` on which `mutation` of service `S` (named
/// `service` in replay commands) fails the check whose words include `expect`, and asserts that
/// the same seed passes without it. Panics otherwise.
pub fn assert_caught_service<S: protocol::Protocol>(
    service: &str,
    mutation: &str,
    reference: SimConfig,
    within: u64,
    expect: &str,
) {
    let broken = SimConfig {
        mutations: mutation
            .parse::<Mutations>()
            .unwrap_or_else(|error| panic!("{mutation}: {error}")),
        ..reference.clone()
    };
    let found = first_failure_service::<S>(0..within, &broken, 2);
    let (seed, why) = found
        .failure
        .unwrap_or_else(|| panic!("{mutation} is caught within {within} seeds"));
    println!(
        "{mutation} caught at seed {seed} after {} seeds: {why}\n  replay: {}",
        found.seeds_run,
        broken.service_replay_command(seed, service)
    );
    assert!(
        why.contains(expect),
        "{mutation} is caught by the check that says {expect:?}, not by: {why}"
    );
    assert!(
        run_service::<S>(seed, &reference).passed(),
        "the seed passes without the mutation"
    );
}

/// One seed's run, whichever service it is.
type Runner = fn(u64, &SimConfig) -> RunResult;

fn first_failure_with(
    seeds: Range<u64>,
    config: &SimConfig,
    threads: usize,
    run: Runner,
) -> FirstFailure {
    let started = Instant::now();
    let quiet = SimConfig {
        trace: false,
        ..config.clone()
    };
    let next = AtomicU64::new(seeds.start);
    let lowest_failure = AtomicU64::new(u64::MAX);
    let failures: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= seeds.end || seed > lowest_failure.load(Ordering::SeqCst) {
                        break;
                    }
                    let verdict = judge(seed, &quiet, run);
                    if let Some(description) = verdict.failure {
                        lowest_failure.fetch_min(seed, Ordering::SeqCst);
                        if let Ok(mut failures) = failures.lock() {
                            failures.push((seed, description));
                        }
                    }
                }
            });
        }
    });
    let failure = failures
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .min_by_key(|(seed, _)| *seed);
    let seeds_run = match &failure {
        Some((seed, _)) => seed - seeds.start + 1,
        None => seeds.end.saturating_sub(seeds.start),
    };
    FirstFailure {
        failure,
        seeds_run,
        elapsed: started.elapsed(),
    }
}

struct SeedVerdict {
    seed: u64,
    ops_checked: u64,
    ops_invoked: u64,
    inconclusive: bool,
    liveness_failure: bool,
    failure: Option<String>,
}

fn judge(seed: u64, config: &SimConfig, run: Runner) -> SeedVerdict {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, config)));
    match outcome {
        Ok(result) => {
            let violations = result.violations();
            SeedVerdict {
                seed,
                ops_checked: result.ops_checked(),
                ops_invoked: result.stats.ops_invoked,
                inconclusive: result.inconclusive(),
                liveness_failure: !result.liveness_violations.is_empty(),
                failure: (!violations.is_empty()).then(|| {
                    let more = violations.len() - 1;
                    let first = violations.into_iter().next().unwrap_or_default();
                    if more > 0 {
                        format!("{first} (and {more} more) [{}]", result.swarm)
                    } else {
                        format!("{first} [{}]", result.swarm)
                    }
                }),
            }
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".to_string());
            SeedVerdict {
                seed,
                ops_checked: 0,
                ops_invoked: 0,
                inconclusive: false,
                liveness_failure: false,
                failure: Some(format!("panicked: {message}")),
            }
        }
    }
}
