//! `bulwark-byzantine`: a storage node that lies on purpose, for fault tests and the demo.
//!
//! It serves exactly as `bulwark node` does, with one of the simulator's Byzantine behaviours
//! wrapped around the honest server. It is a separate binary so that the production `bulwark`
//! binary cannot be switched into lying by any flag.

use bulwark_cli as bulwark_main;
use clap::Parser;

/// A Byzantine Bulwark node (tests and demos only).
#[derive(Parser)]
#[command(name = "bulwark-byzantine")]
struct Cli {
    /// How to misbehave: silent, equivocating, stale, amnesiac, corrupting, forging, colluding.
    #[arg(long)]
    behaviour: bulwark_sim::byzantine::Behaviour,
    /// Seed for the behaviour's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(subcommand)]
    command: Command,
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
    let behaviour = cli.behaviour;
    let seed = cli.seed;
    tracing::warn!(%behaviour, "this node is Byzantine on purpose");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let Ok(runtime) = runtime else {
        return std::process::ExitCode::FAILURE;
    };
    let wrap: bulwark_node::Wrap =
        Box::new(move |server| bulwark_sim::byzantine::wrap(behaviour, server, seed));
    match runtime.block_on(bulwark_main::run_node(args, wrap)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
