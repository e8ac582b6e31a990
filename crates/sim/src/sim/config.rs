//! What a simulation run may do: the fault kinds a sweep enables, the deliberate protocol
//! mutations of the negative controls, and the sizes of a run. Every type here round-trips through
//! a command-line string, so a failing seed prints a command that replays it exactly.

use crate::byzantine::Behaviour;
use bulwark_core::config::Protocol;
use bulwark_protocol::pbft::Mutations as PbftMutations;
use bulwark_protocol::powerstore::{ClientMutations, ServerMutations};
use bulwark_protocol::register::reconfig::TransferMutations;
use bulwark_protocol::round::RegisterMutations;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// A fault of the environment (network, crashes, clients, garbage collection), as opposed to a
/// Byzantine server behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Nemesis {
    /// Readers that write back fabricated, replayed and damaged candidates.
    ByzantineReaders,
    /// Correct servers crash, losing what was not yet durable, and restart from their disk.
    Crashes,
    /// Correct clients crash mid-operation, writers between rounds or in the middle of a
    /// broadcast (so COMPLETE may reach a single server).
    ClientCrashes,
    /// Subsets of servers are cut off from subsets of clients for a while.
    Partitions,
    /// Messages are lost (clients retransmit).
    Loss,
    /// Messages are delivered twice.
    Duplication,
    /// A long-tailed delay distribution, so messages overtake one another by seconds.
    Reordering,
    /// Small garbage-collection grace periods and version caps on the servers.
    Gc,
}

impl Nemesis {
    /// Every nemesis.
    pub const ALL: [Nemesis; 8] = [
        Nemesis::ByzantineReaders,
        Nemesis::Crashes,
        Nemesis::ClientCrashes,
        Nemesis::Partitions,
        Nemesis::Loss,
        Nemesis::Duplication,
        Nemesis::Reordering,
        Nemesis::Gc,
    ];

    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::ByzantineReaders => "byzantine-readers",
            Nemesis::Crashes => "crashes",
            Nemesis::ClientCrashes => "client-crashes",
            Nemesis::Partitions => "partitions",
            Nemesis::Loss => "loss",
            Nemesis::Duplication => "duplication",
            Nemesis::Reordering => "reordering",
            Nemesis::Gc => "gc",
        }
    }
}

/// The faults a run may inject. The swarm picks, per seed, a subset of these and their rates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSet {
    /// Byzantine server behaviours that may be placed (never `Honest`).
    pub behaviours: BTreeSet<Behaviour>,
    /// Environment faults that may be switched on.
    pub nemeses: BTreeSet<Nemesis>,
}

impl FaultSet {
    /// Every behaviour and every nemesis.
    pub fn all() -> FaultSet {
        FaultSet {
            behaviours: Behaviour::BYZANTINE.into_iter().collect(),
            nemeses: Nemesis::ALL.into_iter().collect(),
        }
    }

    /// No faults at all: a reliable network and honest servers.
    pub fn none() -> FaultSet {
        FaultSet {
            behaviours: BTreeSet::new(),
            nemeses: BTreeSet::new(),
        }
    }

    /// Whether `nemesis` may be switched on.
    pub fn has(&self, nemesis: Nemesis) -> bool {
        self.nemeses.contains(&nemesis)
    }
}

/// A name in a fault list that is neither a behaviour nor a nemesis.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault {0:?}; expected all, none, a behaviour ({behaviours}) or a nemesis ({nemeses})", behaviours = behaviour_names(), nemeses = nemesis_names())]
pub struct UnknownFault(pub String);

fn behaviour_names() -> String {
    Behaviour::BYZANTINE.map(Behaviour::name).join(", ")
}

fn nemesis_names() -> String {
    Nemesis::ALL.map(Nemesis::name).join(", ")
}

impl FromStr for FaultSet {
    type Err = UnknownFault;

    /// A comma-separated list of behaviours and nemeses; `all` and `none` stand for themselves.
    fn from_str(text: &str) -> Result<FaultSet, UnknownFault> {
        let mut set = FaultSet::none();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let lower = word.to_ascii_lowercase();
            if lower == "all" {
                let all = FaultSet::all();
                set.behaviours.extend(all.behaviours);
                set.nemeses.extend(all.nemeses);
            } else if lower == "none" {
                continue;
            } else if let Some(nemesis) = Nemesis::ALL.into_iter().find(|n| n.name() == lower) {
                set.nemeses.insert(nemesis);
            } else {
                match lower.parse::<Behaviour>() {
                    Ok(behaviour) if behaviour.is_byzantine() => {
                        set.behaviours.insert(behaviour);
                    }
                    _ => return Err(UnknownFault(word.to_string())),
                }
            }
        }
        Ok(set)
    }
}

impl fmt::Display for FaultSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == FaultSet::all() {
            return f.write_str("all");
        }
        let names: Vec<&str> = self
            .behaviours
            .iter()
            .map(|b| b.name())
            .chain(self.nemeses.iter().map(|n| n.name()))
            .collect();
        if names.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&names.join(","))
    }
}

/// The deliberately broken protocol variants of the negative controls. All off: the real protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// Client-side breakage.
    pub client: ClientMutations,
    /// Server-side breakage (applied to correct servers too).
    pub server: ServerMutations,
    /// Breakage of the ABD and Phalanx clients.
    pub register: RegisterMutations,
    /// Breakage of the effect driver every protocol shares.
    pub driver: DriverMutations,
    /// Breakage of PBFT, under the configuration service (applied to every replica).
    pub pbft: PbftMutations,
    /// Breakage of A2M-PBFT-EA, under the configuration service (applied to every replica).
    pub ea: bulwark_protocol::pbft::ea::Mutations,
    /// Breakage of the transfer of keys between epochs (applied to every node).
    pub transfer: TransferMutations,
    /// Breakage of hardened tables (clients and every replica).
    pub table: bulwark_protocol::table::TableMutations,
}

/// Breakage of the driver's persist-then-send rule, which every protocol's safety argument
/// assumes of its servers (a reply is a promise about durable state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverMutations {
    /// Replies and messages leave at once instead of waiting for their batch to be durable: a
    /// crash can then take back what a client was already told.
    pub send_before_durable: bool,
}

impl Mutations {
    /// Whether any mutation is on.
    pub fn any(&self) -> bool {
        *self != Mutations::default()
    }

    fn flags(&self) -> [(&'static str, bool); 35] {
        [
            ("quorum-f-plus-one", self.client.quorum_f_plus_one),
            ("any-twin", self.client.any_twin),
            ("no-offers", self.client.no_offers),
            (
                "one-round-small-agreement",
                self.client.one_round_small_agreement,
            ),
            ("one-round-f-vouchers", self.client.one_round_f_vouchers),
            ("sole-writer-from-one", self.client.sole_writer_from_one),
            ("no-write-back", self.server.no_write_back),
            ("accept-unproven", self.server.accept_unproven),
            ("naive-gc", self.server.naive_gc),
            ("candidate-vec-in-lc", self.server.candidate_vec_in_lc),
            ("no-stale-check", self.server.no_stale_check),
            ("forget-evicted", self.server.forget_evicted),
            ("register-small-quorum", self.register.quorum_minus_one),
            ("register-no-write-back", self.register.no_write_back),
            ("register-unverified", self.register.unverified),
            ("send-before-durable", self.driver.send_before_durable),
            ("pbft-quorum-2f", self.pbft.quorum_2f),
            ("pbft-drop-prepared", self.pbft.drop_prepared),
            ("ea-unchecked-attestations", self.ea.unchecked_attestations),
            ("serve-before-transfer", self.transfer.serve_before_transfer),
            ("small-transfer-quorum", self.transfer.small_transfer_quorum),
            (
                "answer-without-entering",
                self.transfer.answer_without_entering,
            ),
            ("pull-unchanged-arcs", self.transfer.pull_unchanged_arcs),
            ("hand-over-held", self.transfer.hand_over_held),
            ("small-drop-quorum", self.transfer.small_drop_quorum),
            ("keep-moved-keys", self.transfer.keep_moved_keys),
            ("drop-without-grace", self.transfer.drop_without_grace),
            ("displace-fragments", self.transfer.displace_fragments),
            ("undecided-denies", self.transfer.undecided_denies),
            ("table-accept-f-plus-one", self.table.accept_f_plus_one),
            ("table-majority", self.table.majority),
            ("table-unverified-cells", self.table.unverified_cells),
            ("table-skip-write-back", self.table.skip_write_back),
            ("table-ignore-revocations", self.table.ignore_revocations),
            ("table-no-anti-entropy", self.table.no_anti_entropy),
        ]
    }
}

/// A mutation name that does not exist.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown mutation {0:?}; expected quorum-f-plus-one, any-twin, no-offers, one-round-small-agreement, one-round-f-vouchers, sole-writer-from-one, no-write-back, accept-unproven, naive-gc, candidate-vec-in-lc, no-stale-check, forget-evicted (PoWerStore), register-small-quorum, register-no-write-back or register-unverified (ABD, Phalanx; the first also content-hash objects), pbft-quorum-2f, pbft-drop-prepared or ea-unchecked-attestations (configuration service), serve-before-transfer, small-transfer-quorum, answer-without-entering, pull-unchanged-arcs, hand-over-held, small-drop-quorum or keep-moved-keys (reconfiguration), displace-fragments or undecided-denies (content-hash objects across epochs), table-accept-f-plus-one, table-majority, table-unverified-cells, table-skip-write-back, table-ignore-revocations or table-no-anti-entropy (tables), send-before-durable (any)"
)]
pub struct UnknownMutation(pub String);

impl FromStr for Mutations {
    type Err = UnknownMutation;

    fn from_str(text: &str) -> Result<Mutations, UnknownMutation> {
        let mut mutations = Mutations::default();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word.to_ascii_lowercase().as_str() {
                "none" => {}
                "quorum-f-plus-one" => mutations.client.quorum_f_plus_one = true,
                "any-twin" => mutations.client.any_twin = true,
                "no-offers" => mutations.client.no_offers = true,
                "one-round-small-agreement" => mutations.client.one_round_small_agreement = true,
                "one-round-f-vouchers" => mutations.client.one_round_f_vouchers = true,
                "sole-writer-from-one" => mutations.client.sole_writer_from_one = true,
                "no-write-back" => mutations.server.no_write_back = true,
                "accept-unproven" => mutations.server.accept_unproven = true,
                "naive-gc" => mutations.server.naive_gc = true,
                "candidate-vec-in-lc" => mutations.server.candidate_vec_in_lc = true,
                "no-stale-check" => mutations.server.no_stale_check = true,
                "forget-evicted" => mutations.server.forget_evicted = true,
                "register-small-quorum" => mutations.register.quorum_minus_one = true,
                "register-no-write-back" => mutations.register.no_write_back = true,
                "register-unverified" => mutations.register.unverified = true,
                "send-before-durable" => mutations.driver.send_before_durable = true,
                "pbft-quorum-2f" => mutations.pbft.quorum_2f = true,
                "pbft-drop-prepared" => mutations.pbft.drop_prepared = true,
                "ea-unchecked-attestations" => mutations.ea.unchecked_attestations = true,
                "serve-before-transfer" => mutations.transfer.serve_before_transfer = true,
                "small-transfer-quorum" => mutations.transfer.small_transfer_quorum = true,
                "answer-without-entering" => mutations.transfer.answer_without_entering = true,
                "pull-unchanged-arcs" => mutations.transfer.pull_unchanged_arcs = true,
                "hand-over-held" => mutations.transfer.hand_over_held = true,
                "small-drop-quorum" => mutations.transfer.small_drop_quorum = true,
                "keep-moved-keys" => mutations.transfer.keep_moved_keys = true,
                "drop-without-grace" => mutations.transfer.drop_without_grace = true,
                "displace-fragments" => mutations.transfer.displace_fragments = true,
                "undecided-denies" => mutations.transfer.undecided_denies = true,
                "table-accept-f-plus-one" => mutations.table.accept_f_plus_one = true,
                "table-majority" => mutations.table.majority = true,
                "table-unverified-cells" => mutations.table.unverified_cells = true,
                "table-skip-write-back" => mutations.table.skip_write_back = true,
                "table-ignore-revocations" => mutations.table.ignore_revocations = true,
                "table-no-anti-entropy" => mutations.table.no_anti_entropy = true,
                _ => return Err(UnknownMutation(word.to_string())),
            }
        }
        Ok(mutations)
    }
}

impl fmt::Display for Mutations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<&str> = self
            .flags()
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
            .collect();
        if on.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&on.join(","))
    }
}

/// Everything that shapes a run besides its seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// The protocol under test.
    pub protocol: Protocol,
    /// Faults tolerated; the group has `3f+1` servers (`2f+1` for ABD).
    pub f: usize,
    /// Correct clients. The swarm makes between one and all but one of them writers (writers
    /// also read); the rest only read.
    pub clients: usize,
    /// Distinct keys the operations spread over; few keys mean contention.
    pub keys: usize,
    /// Operations correct clients invoke during the safety phase.
    pub ops: usize,
    /// Operations correct clients invoke during the liveness phase, each of which must complete.
    pub liveness_ops: usize,
    /// The faults the swarm may pick from; those the protocol is not built to survive (any
    /// Byzantine behaviour for ABD) are left out.
    pub faults: FaultSet,
    /// Exactly this many Byzantine servers, when set; otherwise the swarm picks between none and
    /// `f` (when any behaviour is allowed). More than `f` is a negative control.
    pub byzantine_servers: Option<usize>,
    /// Deliberate protocol breakage (negative controls).
    pub mutations: Mutations,
    /// Virtual milliseconds within which every operation of a correct client must complete once
    /// the liveness phase has begun.
    pub liveness_bound_millis: u64,
    /// Record one readable line per event.
    pub trace: bool,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            protocol: Protocol::PowerStore,
            f: 1,
            clients: 4,
            keys: 2,
            ops: 80,
            liveness_ops: 16,
            faults: FaultSet::all(),
            byzantine_servers: None,
            mutations: Mutations::default(),
            liveness_bound_millis: 20_000,
            trace: false,
        }
    }
}

impl SimConfig {
    /// The command that replays `seed` of `service` (a service with its own workload and
    /// checker, which `--protocol` names but this configuration cannot) under this configuration.
    pub fn service_replay_command(&self, seed: u64, service: &str) -> String {
        let command = self.replay_command(seed);
        let command = match command.find(" --protocol ") {
            Some(at) => {
                let rest = &command[at + " --protocol ".len()..];
                let end = rest
                    .find(' ')
                    .map_or(command.len(), |e| at + " --protocol ".len() + e);
                format!("{}{}", &command[..at], &command[end..])
            }
            None => command,
        };
        command.replacen(" --faults ", &format!(" --protocol {service} --faults "), 1)
    }

    /// The command that replays `seed` under this configuration, with a trace. Flags equal to
    /// the defaults are left out.
    pub fn replay_command(&self, seed: u64) -> String {
        let defaults = SimConfig::default();
        let mut command = format!(
            "bulwark sim --seed {seed} --f {} --faults {}",
            self.f, self.faults
        );
        if self.protocol != defaults.protocol {
            command.push_str(&format!(" --protocol {}", self.protocol));
        }
        if self.clients != defaults.clients {
            command.push_str(&format!(" --clients {}", self.clients));
        }
        if self.keys != defaults.keys {
            command.push_str(&format!(" --keys {}", self.keys));
        }
        if self.ops != defaults.ops {
            command.push_str(&format!(" --ops {}", self.ops));
        }
        if self.liveness_ops != defaults.liveness_ops {
            command.push_str(&format!(" --liveness-ops {}", self.liveness_ops));
        }
        if let Some(count) = self.byzantine_servers {
            command.push_str(&format!(" --byzantine {count}"));
        }
        if self.mutations.any() {
            command.push_str(&format!(" --mutations {}", self.mutations));
        }
        if self.liveness_bound_millis != defaults.liveness_bound_millis {
            command.push_str(&format!(
                " --liveness-bound-ms {}",
                self.liveness_bound_millis
            ));
        }
        command.push_str(" --trace");
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_sets_and_mutations_round_trip_through_text() {
        for text in [
            "all",
            "none",
            "corrupting,forging",
            "silent,crashes,gc,loss",
        ] {
            let set: FaultSet = text.parse().unwrap();
            assert_eq!(set.to_string().parse::<FaultSet>().unwrap(), set);
        }
        let set: FaultSet = "corrupting, forging".parse().unwrap();
        assert_eq!(set.to_string(), "corrupting,forging");
        assert!("honest".parse::<FaultSet>().is_err());
        assert!("earthquake".parse::<FaultSet>().is_err());
        let mutations: Mutations = "any-twin,naive-gc,pbft-drop-prepared".parse().unwrap();
        assert!(mutations.client.any_twin && mutations.server.naive_gc);
        assert!(mutations.pbft.drop_prepared && !mutations.pbft.quorum_2f);
        assert_eq!(
            mutations.to_string().parse::<Mutations>().unwrap(),
            mutations
        );
        assert_eq!(Mutations::default().to_string(), "none");
    }
}
