//! `bulwark a2m`: a node's trusted log (A2M) as a process of its own, owning its key and its
//! store, answering its node on a local socket.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bulwark_a2m::socket::{Remote, serve};
use bulwark_a2m::{Component, FileAnchor, Limits};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum A2mCommand {
    /// Makes a new trusted log in an empty DIR and prints its public key, the identity its node's
    /// peers will check its attestations against.
    Init(StateArgs),
    /// Serves the trusted log in DIR on a local socket until stopped. Refuses a directory whose
    /// state is lost, damaged or older than its anchor records.
    Serve {
        #[command(flatten)]
        state: StateArgs,
        /// The socket its node connects to (created; readable and writable by the owner and the
        /// owner's group only).
        #[arg(long)]
        socket: PathBuf,
    },
    /// Shows what the trusted log serving on SOCKET reports: its key, each log's bounds, its
    /// generation, the attestations it made and the requests it refused.
    Status {
        /// The socket it serves on.
        #[arg(long)]
        socket: PathBuf,
    },
}

#[derive(Args)]
pub struct StateArgs {
    /// The trusted log's directory (its key and logs).
    #[arg(long)]
    dir: PathBuf,
    /// Where its generation is recorded, outside DIR so that a restored copy of DIR is caught:
    /// `DIR.anchor` beside DIR unless given (put it on another disk to catch a restored disk).
    #[arg(long)]
    anchor: Option<PathBuf>,
}

impl StateArgs {
    fn anchor(&self) -> Result<Box<FileAnchor>> {
        Ok(Box::new(match &self.anchor {
            Some(path) => FileAnchor::new(path),
            None => FileAnchor::beside(&self.dir).with_context(|| {
                format!(
                    "{} has no name to put its anchor beside; name the directory, or give --anchor",
                    self.dir.display()
                )
            })?,
        }))
    }
}

pub async fn run(command: A2mCommand) -> Result<()> {
    match command {
        A2mCommand::Init(state) => {
            let component = Component::create(&state.dir, state.anchor()?, Limits::default())?;
            println!("{}", bulwark_a2m::A2m::public_key(&component));
        }
        A2mCommand::Serve { state, socket } => {
            let component = Component::open(&state.dir, state.anchor()?, Limits::default())?;
            let listener = bind(&socket)?;
            tracing::info!(
                key = %bulwark_a2m::A2m::public_key(&component),
                socket = %socket.display(),
                "trusted log serving"
            );
            tokio::task::spawn_blocking(move || serve(component, listener))
                .await
                .context("the trusted log's server")?
                .with_context(|| format!("accepting on {}", socket.display()))?;
        }
        A2mCommand::Status { socket } => {
            let status = tokio::task::spawn_blocking(move || {
                Remote::connect(&socket, None).and_then(|mut remote| remote.status())
            })
            .await
            .context("asking the trusted log")??;
            println!("key          {}", status.key);
            match status.generation {
                Some(generation) => println!("generation   {generation}"),
                None => println!("generation   (kept in memory only)"),
            }
            println!("attestations {}", status.attestations);
            println!("refused      {}", status.refused);
            for (log, head) in status.heads {
                println!("log {log:<8} slots {} to {}", head.low, head.high);
            }
        }
    }
    Ok(())
}

/// Binds `socket`, replacing a socket file no process serves on (left by one that was killed),
/// never one that is in use.
fn bind(socket: &Path) -> Result<UnixListener> {
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            bail!(
                "{} is in use: another trusted log serves on it",
                socket.display()
            );
        }
        std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale socket {}", socket.display()))?;
    }
    let listener =
        UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("restricting {}", socket.display()))?;
    Ok(listener)
}
