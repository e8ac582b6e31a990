//! The `bulwark` binary.

use bulwark_cli::clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = bulwark_cli::Cli::parse();
    match cli.command {
        bulwark_cli::Command::Node(bulwark_cli::NodeCommand {
            change: None | Some(bulwark_cli::configure::MembershipCommand::Join { .. }),
            ..
        }) => bulwark_cli::init_tracing(true),
        bulwark_cli::Command::Gateway(_) => {
            bulwark_cli::init_tracing_with(bulwark_cli::GATEWAY_LOG_DEFAULT)
        }
        _ => bulwark_cli::init_tracing(false),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bulwark_cli::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
