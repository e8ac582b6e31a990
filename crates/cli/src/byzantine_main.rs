//! `bulwark-byzantine`: a storage node that lies on purpose, for fault tests and the demo.
//!
//! It serves exactly as `bulwark node` does, with one of the simulator's Byzantine behaviours
//! wrapped around the honest server. It is a separate binary so that the production `bulwark`
//! binary cannot be switched into lying by any flag.

mod causal_lies;
mod forking;
mod table_lies;
mod transfer_lies;

use bulwark_cli as bulwark_main;
use clap::Parser;

/// A Byzantine Bulwark node (tests and demos only).
#[derive(Parser)]
#[command(name = "bulwark-byzantine")]
struct Cli {
    /// How its PoWerStore servers misbehave: silent, equivocating, stale, amnesiac, corrupting,
    /// forging, colluding (honest when absent).
    #[arg(long)]
    behaviour: Option<bulwark_sim::byzantine::Behaviour>,
    /// How its single-server volumes misbehave: `fork` shows every client but the first the
    /// state the first one saw (the A2M paper's Figure 1).
    #[arg(long)]
    volumes: Option<VolumeLie>,
    /// How its causal volumes' servers lie: withhold, tamper or fork.
    #[arg(long)]
    causal: Option<causal_lies::CausalLie>,
    /// How its table replicas lie, as replica and as proxy: silent, stale, corrupting (signs
    /// nothing validly and spoils what it relays), forging, colluding (the lying coordinator of
    /// spec §2.8).
    #[arg(long)]
    table: Option<bulwark_sim::byzantine::Behaviour>,
    /// Its table replicas serve every operation correctly as proxy but hold each answer to a
    /// client this many milliseconds first (a stalling proxy).
    #[arg(long, conflicts_with = "table")]
    stall_table_ms: Option<u64>,
    /// How its replicas that follow the configuration fall behind it: `skip-epochs` never
    /// enters a new epoch, `stall` never finishes a pull (the configuration service must evict
    /// the node either way).
    #[arg(long)]
    transfers: Option<transfer_lies::Lag>,
    /// Seed for the behaviour's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum VolumeLie {
    Fork,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Runs the lying node.
    Node(bulwark_main::NodeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    bulwark_main::init_tracing(true);
    let Command::Node(args) = cli.command;
    let seed = cli.seed;
    let mut wrap = bulwark_node::Wrap::honest();
    if let Some(behaviour) = cli.behaviour {
        tracing::warn!(%behaviour, "this node's PoWerStore servers are Byzantine on purpose");
        wrap.powerstore =
            Box::new(move |server| bulwark_sim::byzantine::wrap(behaviour, server, seed));
    }
    if let Some(VolumeLie::Fork) = cli.volumes {
        tracing::warn!("this node forks its single-server volumes on purpose");
        wrap.volumes = Box::new(forking::wrap);
    }
    if let Some(hold) = cli.stall_table_ms {
        tracing::warn!(
            hold,
            "this node stalls its answers as table proxy on purpose"
        );
        wrap.table = table_lies::stalling(hold);
    }
    if let Some(lag) = cli.transfers {
        tracing::warn!(?lag, "this node falls behind the configuration on purpose");
        wrap.followers = transfer_lies::wrap(lag);
    }
    if cli.causal.is_some() || cli.table.is_some() {
        let Some(id) = args.id else {
            eprintln!("error: --id is required to run a node");
            return std::process::ExitCode::FAILURE;
        };
        let options = match bulwark_node::NodeOptions::load(&args.cluster, id, args.data.clone()) {
            Ok(options) => options,
            Err(error) => {
                eprintln!("error: {error:#}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let secret = bulwark_core::sign::SecretKey::from_seed(&options.secrets.signing_key);
        if let Some(lie) = cli.causal {
            tracing::warn!(?lie, "this node's causal volumes lie on purpose");
            wrap.depots = causal_lies::wrap(lie, secret.clone());
        }
        if let Some(behaviour) = cli.table {
            tracing::warn!(%behaviour, "this node's table replicas lie on purpose");
            wrap.table = table_lies::wrap(behaviour, secret);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let Ok(runtime) = runtime else {
        return std::process::ExitCode::FAILURE;
    };
    match runtime.block_on(bulwark_main::run_node(args, wrap)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
