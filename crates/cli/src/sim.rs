//! `bulwark sim`: seed sweeps of the deterministic simulator, and the replay of one seed with a
//! readable trace. Every failing seed of a sweep is printed with the one command that replays it.

use anyhow::{Result, bail};
use bulwark_sim::sim::protocols::content::ContentSim;
use bulwark_sim::sim::protocols::content_epochs::{ContentEpochsSim, ScaleContentEpochsSim};
use bulwark_sim::sim::protocols::powerstore::SoleWriterSim;
use bulwark_sim::sim::protocols::powerstore_epochs::PowerStoreReconfigSim;
use bulwark_sim::sim::protocols::reconfig::{ReconfigSim, ScaleReconfigSim};
use bulwark_sim::sim::protocols::registers::PubKeySim;
use bulwark_sim::sim::protocols::table::{EventualTableSim, TableSim};
use bulwark_sim::sim::{self, FaultSet, Mutations, SimConfig};
use std::process::ExitCode;

/// `bulwark sim`.
#[derive(clap::Args)]
pub struct SimArgs {
    /// Replay this one seed and print its report (with `--trace`, every message).
    #[arg(long, conflicts_with_all = ["seeds", "start"])]
    pub seed: Option<u64>,
    /// How many seeds a sweep runs.
    #[arg(long, default_value_t = 1_000)]
    pub seeds: u64,
    /// The first seed of a sweep.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// The protocol under test: powerstore, powerstore-sw (every register with one writer, which
    /// keeps its clock), abd (crash faults only: Byzantine behaviours and readers are left out),
    /// phalanx, cs (the configuration service: PBFT with 3f+1 replicas
    /// ordering membership changes and epoch ends), cs-ea (the same on A2M-PBFT-EA: 2f+1
    /// replicas with trusted logs), cs-e (the same on A2M-PBFT-E: 3f+1 replicas answering with
    /// their trusted request history), content (content-hash objects), content-epochs
    /// (content-hash objects on 2(3f+1) nodes whose configuration changes under the clients,
    /// fragments rebuilt for the slots that change), content-epochs-50 (the same on 50 nodes),
    /// pubkey
    /// (public-key objects), reconfig (public-key objects on 2(3f+1) nodes whose configuration
    /// changes under the clients, keys moving between groups), reconfig-50 (the same on 50
    /// nodes), powerstore-reconfig (M-PoWerStore registers on 2(3f+1) nodes whose configuration
    /// changes under the clients, taken over into each new incarnation by reading), table (hardened tables, linearizable per cell) or table-eventual (eventual tables,
    /// judged on convergence).
    #[arg(long, default_value = "powerstore")]
    pub protocol: String,
    /// Faults tolerated; the group has 3f+1 servers (2f+1 for abd).
    #[arg(long, default_value_t = 1)]
    pub f: usize,
    /// Faults the swarm may switch on: `all`, `none`, or a comma-separated list of Byzantine
    /// behaviours and nemeses (an unknown name lists them all).
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Correct clients.
    #[arg(long)]
    pub clients: Option<usize>,
    /// Keys the operations spread over.
    #[arg(long)]
    pub keys: Option<usize>,
    /// Operations of the safety phase.
    #[arg(long)]
    pub ops: Option<usize>,
    /// Operations of the liveness phase, each of which must complete.
    #[arg(long)]
    pub liveness_ops: Option<usize>,
    /// Exactly this many Byzantine servers (more than f is a negative control).
    #[arg(long)]
    pub byzantine: Option<usize>,
    /// Deliberately broken protocol variants, comma-separated (negative controls).
    #[arg(long, default_value = "none")]
    pub mutations: String,
    /// Virtual milliseconds an operation may take once the network has healed.
    #[arg(long)]
    pub liveness_bound_ms: Option<u64>,
    /// With `--seed`: print one line per message delivered or lost.
    #[arg(long)]
    pub trace: bool,
    /// Worker threads for a sweep (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl SimArgs {
    fn config(&self) -> Result<SimConfig> {
        if self.f == 0 {
            bail!("--f must be at least 1");
        }
        let defaults = SimConfig::default();
        let protocol = if self.service().is_some() {
            defaults.protocol
        } else {
            self.protocol.parse().map_err(anyhow::Error::msg)?
        };
        Ok(SimConfig {
            protocol,
            f: self.f,
            clients: self.clients.unwrap_or(defaults.clients).max(1),
            keys: self.keys.unwrap_or(defaults.keys).max(1),
            ops: self.ops.unwrap_or(defaults.ops),
            liveness_ops: self.liveness_ops.unwrap_or(defaults.liveness_ops),
            faults: self.faults.parse::<FaultSet>()?,
            byzantine_servers: self.byzantine,
            mutations: self.mutations.parse::<Mutations>()?,
            liveness_bound_millis: self
                .liveness_bound_ms
                .unwrap_or(defaults.liveness_bound_millis),
            trace: self.trace,
        })
    }

    /// The configuration service and content-hash objects run in the same world but have their
    /// own workloads and checkers.
    fn service(&self) -> Option<&'static str> {
        match self.protocol.as_str() {
            "cs" => Some("cs"),
            "cs-ea" => Some("cs-ea"),
            "cs-e" => Some("cs-e"),
            "content" => Some("content"),
            "content-epochs" => Some("content-epochs"),
            "content-epochs-50" => Some("content-epochs-50"),
            "pubkey" => Some("pubkey"),
            "reconfig" => Some("reconfig"),
            "reconfig-50" => Some("reconfig-50"),
            "table" => Some("table"),
            "table-eventual" => Some("table-eventual"),
            "powerstore-sw" => Some("powerstore-sw"),
            "powerstore-reconfig" => Some("powerstore-reconfig"),
            _ => None,
        }
    }
}

/// Runs `bulwark sim`; the exit code is 1 when any seed broke a promise.
pub fn run(args: &SimArgs) -> Result<ExitCode> {
    let config = args.config()?;
    let service = args.service();
    if let Some(seed) = args.seed {
        let result = match service {
            Some("cs") => sim::protocols::cs::run(seed, &config),
            Some("cs-ea") => sim::protocols::cs::run_ea(seed, &config),
            Some("cs-e") => sim::protocols::cs::run_e(seed, &config),
            Some("pubkey") => sim::run_service::<PubKeySim>(seed, &config),
            Some("content-epochs") => sim::run_service::<ContentEpochsSim>(seed, &config),
            Some("content-epochs-50") => sim::run_service::<ScaleContentEpochsSim>(seed, &config),
            Some("reconfig") => sim::run_service::<ReconfigSim>(seed, &config),
            Some("reconfig-50") => sim::run_service::<ScaleReconfigSim>(seed, &config),
            Some("table") => sim::run_service::<TableSim>(seed, &config),
            Some("table-eventual") => sim::run_service::<EventualTableSim>(seed, &config),
            Some("powerstore-sw") => sim::run_service::<SoleWriterSim>(seed, &config),
            Some("powerstore-reconfig") => sim::run_service::<PowerStoreReconfigSim>(seed, &config),
            Some(_) => sim::run_service::<ContentSim>(seed, &config),
            None => sim::run(seed, &config),
        };
        print!("{}", result.render());
        return Ok(if result.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let end = args.start.saturating_add(args.seeds);
    eprintln!(
        "sweeping seeds {}..{end} on {threads} threads: protocol={} f={} faults={} mutations={}",
        args.start, args.protocol, config.f, config.faults, config.mutations
    );
    let range = args.start..end;
    let summary = match service {
        Some("cs") => sim::protocols::cs::sweep(range, &config, threads),
        Some("cs-ea") => sim::protocols::cs::sweep_ea(range, &config, threads),
        Some("cs-e") => sim::protocols::cs::sweep_e(range, &config, threads),
        Some("pubkey") => sim::sweep_service::<PubKeySim>(range, &config, threads),
        Some("content-epochs") => sim::sweep_service::<ContentEpochsSim>(range, &config, threads),
        Some("content-epochs-50") => {
            sim::sweep_service::<ScaleContentEpochsSim>(range, &config, threads)
        }
        Some("reconfig") => sim::sweep_service::<ReconfigSim>(range, &config, threads),
        Some("reconfig-50") => sim::sweep_service::<ScaleReconfigSim>(range, &config, threads),
        Some("table") => sim::sweep_service::<TableSim>(range, &config, threads),
        Some("table-eventual") => sim::sweep_service::<EventualTableSim>(range, &config, threads),
        Some("powerstore-sw") => sim::sweep_service::<SoleWriterSim>(range, &config, threads),
        Some("powerstore-reconfig") => {
            sim::sweep_service::<PowerStoreReconfigSim>(range, &config, threads)
        }
        Some(_) => sim::sweep_service::<ContentSim>(range, &config, threads),
        None => sim::sweep(range, &config, threads),
    };
    match service {
        // Replay lines must name the service, which SimConfig cannot.
        Some(service) => print!("{}", summary.render_service(&config, service)),
        None => print!("{}", summary.render(&config)),
    }
    println!(
        "operations invoked: {}\nliveness failures: {}\nelapsed: {:.1?} ({:.0} seeds/s)",
        summary.ops_invoked,
        summary.liveness_failures,
        summary.elapsed,
        summary.seeds_per_second()
    );
    Ok(if summary.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
