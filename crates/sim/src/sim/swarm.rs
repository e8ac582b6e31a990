//! Swarm testing: each seed switches on a random subset of the allowed faults, at random rates.
//!
//! One configuration with every fault at a fixed rate explores less than many configurations
//! that each stress a few things hard (Groce et al., "Swarm Testing"; TigerBeetle's VOPR does the
//! same). A fault that is allowed may still be off for a given seed, and the rates differ by an
//! order of magnitude between seeds.

use super::config::{FaultSet, Nemesis, SimConfig};
use crate::byzantine::Behaviour;
use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand_chacha::ChaCha8Rng;

/// The per-seed choices. Everything a run does beyond its event-by-event randomness.
#[derive(Clone, Debug)]
pub struct Swarm {
    /// `(server index, behaviour)` of each Byzantine server.
    pub byzantine: Vec<(usize, Behaviour)>,
    /// The seed every colluding server shares.
    pub collusion_seed: u64,
    /// Correct clients that write (and sometimes read).
    pub writers: usize,
    /// Correct clients that only read.
    pub readers: usize,
    /// Byzantine readers.
    pub attackers: usize,
    /// Upper end of the common one-way delay, in milliseconds.
    pub delay_max: u64,
    /// Probability that a message takes the long tail instead.
    pub tail_probability: f64,
    /// Upper end of the long tail.
    pub tail_max: u64,
    /// Per request kind (CLOCK, STORE, COMPLETE, COLLECT, FILTER, REPAIR, in that order), the
    /// probability that a request of that kind takes the long tail, when the scheduler targets
    /// rounds rather than messages; `None` means every message uses `tail_probability`. Slowing one
    /// round (say COMPLETE to some servers and a reader's FILTER to others) opens the windows that
    /// the §4.8(a) and write-back arguments are about, which independent delays rarely do.
    pub tail_by_request: Option<[f64; 6]>,
    /// The scheduler sides with the Byzantine servers: their messages never take the long tail,
    /// so they learn of a write before the correct servers do (the adversary controls both).
    pub favour_byzantine: bool,
    /// Probability that a message is lost (safety phase only).
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplication: f64,
    /// Upper end of the delay between handling a request and its changes being durable.
    pub persist_max: u64,
    /// Probability per nemesis tick of starting a partition.
    pub partition_rate: f64,
    /// Probability per nemesis tick of crashing a correct server.
    pub crash_rate: f64,
    /// Whether more correct servers than `f` minus the Byzantine ones may be down at once during
    /// the safety phase (safety must hold; progress may stall until the liveness phase).
    pub crash_overload: bool,
    /// Probability that a client crashes at a round boundary, and per nemesis tick.
    pub client_crash_rate: f64,
    /// Servers' garbage-collection grace period.
    pub grace_millis: u64,
    /// Servers' cap on superseded versions per key.
    pub superseded_max: usize,
    /// Servers' bound on keys whose metadata stays in memory: often a single key, so that most
    /// requests read their key back from the disk.
    pub cached_keys_max: usize,
    /// Interval of the servers' GC ticks.
    pub tick_millis: u64,
    /// Interval of client retransmissions.
    pub retransmit_millis: u64,
    /// Probability that a writer's operation is a write rather than a read.
    pub write_ratio: f64,
    /// Probability that a write is a delete.
    pub delete_probability: f64,
    /// Probability that a written value is large enough to be erasure-coded.
    pub large_probability: f64,
    /// Upper end of a client's pause between operations.
    pub think_max: u64,
}

impl Swarm {
    /// Draws the choices for one seed, for a group of `n` servers, from the `faults` the protocol
    /// under test tolerates.
    pub fn choose(rng: &mut ChaCha8Rng, config: &SimConfig, n: usize, faults: &FaultSet) -> Swarm {
        let behaviours: Vec<Behaviour> = faults.behaviours.iter().copied().collect();
        let byzantine_count = match config.byzantine_servers {
            Some(count) => count.min(n),
            None if behaviours.is_empty() => 0,
            // Mostly the full budget: the interesting runs are the ones at the edge.
            None if rng.random_bool(0.6) => config.f,
            None => rng.random_range(0..=config.f),
        };
        let mut nodes: Vec<usize> = (0..n).collect();
        nodes.shuffle(rng);
        let byzantine = nodes
            .into_iter()
            .take(byzantine_count)
            .map(|node| {
                let behaviour = behaviours.choose(rng).copied().unwrap_or(Behaviour::Silent);
                (node, behaviour)
            })
            .collect();
        let clients = config.clients.max(1);
        let writers = if clients == 1 {
            1
        } else {
            rng.random_range(1..clients)
        };
        let on =
            |rng: &mut ChaCha8Rng, nemesis: Nemesis| faults.has(nemesis) && rng.random_bool(0.6);
        let rate = |rng: &mut ChaCha8Rng, choices: &[f64]| *choices.choose(rng).unwrap_or(&0.0);
        let attackers = if on(rng, Nemesis::ByzantineReaders) {
            rng.random_range(1..=2)
        } else {
            0
        };
        let reordering = on(rng, Nemesis::Reordering);
        let loss = if on(rng, Nemesis::Loss) {
            rate(rng, &[0.01, 0.05, 0.2])
        } else {
            0.0
        };
        let duplication = if on(rng, Nemesis::Duplication) {
            rate(rng, &[0.02, 0.1, 0.3])
        } else {
            0.0
        };
        let partition_rate = if on(rng, Nemesis::Partitions) {
            rate(rng, &[0.005, 0.02, 0.05])
        } else {
            0.0
        };
        let crash_rate = if on(rng, Nemesis::Crashes) {
            rate(rng, &[0.005, 0.02, 0.05])
        } else {
            0.0
        };
        let client_crash_rate = if on(rng, Nemesis::ClientCrashes) {
            rate(rng, &[0.01, 0.05, 0.15])
        } else {
            0.0
        };
        let small_gc = on(rng, Nemesis::Gc);
        Swarm {
            byzantine,
            collusion_seed: rng.random(),
            writers,
            readers: clients - writers,
            attackers,
            delay_max: *[2u64, 10, 30, 100].choose(rng).unwrap_or(&10),
            tail_probability: if reordering {
                rate(rng, &[0.02, 0.1, 0.3])
            } else {
                0.0
            },
            tail_max: *[300u64, 1_000, 3_000].choose(rng).unwrap_or(&1_000),
            tail_by_request: (reordering && rng.random_bool(0.5)).then(|| {
                let mut tails = [0.0; 6];
                for tail in &mut tails {
                    *tail = rate(rng, &[0.0, 0.1, 0.3, 0.6]);
                }
                tails
            }),
            favour_byzantine: reordering && rng.random_bool(0.5),
            loss,
            duplication,
            persist_max: *[0u64, 1, 5, 20].choose(rng).unwrap_or(&1),
            partition_rate,
            crash_rate,
            crash_overload: crash_rate > 0.0 && rng.random_bool(0.3),
            client_crash_rate,
            grace_millis: if small_gc {
                *[0u64, 20, 100, 500].choose(rng).unwrap_or(&100)
            } else {
                10_000
            },
            superseded_max: if small_gc { rng.random_range(0..4) } else { 16 },
            // From a stream of its own, so that every other choice of a seed stays as it was.
            cached_keys_max: if config.mutations.server.forget_evicted {
                1
            } else {
                let mut side = rng.clone();
                side.set_stream(0x0063_6163_6865);
                *[1usize, 2, bulwark_protocol::powerstore::CACHED_KEYS_MAX]
                    .choose(&mut side)
                    .unwrap_or(&1)
            },
            tick_millis: *[10u64, 50, 200].choose(rng).unwrap_or(&50),
            retransmit_millis: *[50u64, 150, 400].choose(rng).unwrap_or(&150),
            write_ratio: rate(rng, &[0.3, 0.6, 0.9]),
            delete_probability: rate(rng, &[0.0, 0.05, 0.2]),
            large_probability: rate(rng, &[0.0, 0.1, 0.4]),
            think_max: *[0u64, 10, 100].choose(rng).unwrap_or(&10),
        }
    }

    /// One line naming what this seed switched on, for reports.
    pub fn describe(&self) -> String {
        let byzantine: Vec<String> = self
            .byzantine
            .iter()
            .map(|(node, behaviour)| format!("s{node}={behaviour}"))
            .collect();
        format!(
            "byzantine=[{}] writers={} readers={} attackers={} delay<={}ms tail={}@{}ms{}{} loss={} dup={} persist<={}ms partitions={} crashes={}{} client-crashes={} grace={}ms superseded-max={} cached-keys={} retransmit={}ms",
            byzantine.join(","),
            self.writers,
            self.readers,
            self.attackers,
            self.delay_max,
            self.tail_probability,
            self.tail_max,
            self.tail_by_request
                .map(|tails| format!(" request-tails={tails:?}"))
                .unwrap_or_default(),
            if self.favour_byzantine {
                " favour-byzantine"
            } else {
                ""
            },
            self.loss,
            self.duplication,
            self.persist_max,
            self.partition_rate,
            self.crash_rate,
            if self.crash_overload {
                "(overload)"
            } else {
                ""
            },
            self.client_crash_rate,
            self.grace_millis,
            self.superseded_max,
            self.cached_keys_max,
            self.retransmit_millis,
        )
    }
}
