//! `bulwark a2m`: a node's trusted log (A2M) as a process of its own, owning its key and its
//! store, answering its node on a local socket.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bulwark_a2m::socket::{Delay, Remote, serve_with};
use bulwark_a2m::{Anchor, AnchorKind, Component, FileAnchor, Limits, TpmAnchor};
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
        /// For measurement only: microseconds added to every call, as a slower trusted device
        /// would take (`bench cs --a2m-latency-us`).
        #[arg(long, default_value_t = 0)]
        inject_latency_us: u64,
        /// For measurement only: charge each fused call (append or advance with its lookup) as
        /// the two calls it replaces.
        #[arg(long)]
        unfused: bool,
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
    #[arg(long, conflicts_with = "tpm")]
    anchor: Option<PathBuf>,
    /// Record its generation in a counter of this TPM instead (the TPM software stack's address:
    /// `device:/dev/tpmrm0`, or `swtpm:host=127.0.0.1,port=2321` for an emulator), which also
    /// catches a rollback of the whole disk. A log made with it must be served with it.
    #[arg(long)]
    tpm: Option<String>,
    /// The TPM NV index of its counter, for `init` (`serve` finds it in DIR): 0x01500000 to
    /// 0x015fffff, one per trusted log on that TPM.
    #[arg(long, value_parser = parse_index, default_value = "0x01500000")]
    tpm_index: u32,
}

pub(crate) fn parse_index(text: &str) -> Result<u32, String> {
    let hex = text.strip_prefix("0x").unwrap_or(text);
    u32::from_str_radix(hex, 16).map_err(|error| format!("{text:?} is no hex NV index: {error}"))
}

impl StateArgs {
    /// The anchor to make a new trusted log with.
    fn new_anchor(&self) -> Result<Box<dyn Anchor>> {
        match &self.tpm {
            Some(tcti) => self.tpm_anchor(tcti, self.tpm_index),
            None => self.file_anchor(),
        }
    }

    /// The anchor the trusted log in DIR was made with.
    fn existing_anchor(&self) -> Result<Box<dyn Anchor>> {
        match Component::anchor_kind(&self.dir)? {
            AnchorKind::File => {
                if self.tpm.is_some() {
                    bail!(
                        "the trusted log in {} keeps its generation in a file, not a TPM: serve it \
                         without --tpm",
                        self.dir.display()
                    );
                }
                self.file_anchor()
            }
            AnchorKind::Tpm { index } => {
                let Some(tcti) = &self.tpm else {
                    bail!(
                        "the trusted log in {} keeps its generation in TPM NV index {index:#010x}: \
                         serve it with --tpm and that TPM's address",
                        self.dir.display()
                    );
                };
                self.tpm_anchor(tcti, index)
            }
        }
    }

    fn tpm_anchor(&self, tcti: &str, index: u32) -> Result<Box<dyn Anchor>> {
        Ok(Box::new(
            TpmAnchor::new(tcti, index).map_err(anyhow::Error::msg)?,
        ))
    }

    fn file_anchor(&self) -> Result<Box<dyn Anchor>> {
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
            let component = Component::create(&state.dir, state.new_anchor()?, Limits::default())?;
            println!("{}", bulwark_a2m::A2m::public_key(&component));
        }
        A2mCommand::Serve {
            state,
            socket,
            inject_latency_us,
            unfused,
        } => {
            let delay = Delay {
                per_call: Duration::from_micros(inject_latency_us),
                unfused,
            };
            let component =
                Component::open(&state.dir, state.existing_anchor()?, Limits::default())?;
            let listener = bind(&socket)?;
            tracing::info!(
                key = %bulwark_a2m::A2m::public_key(&component),
                socket = %socket.display(),
                "trusted log serving"
            );
            if delay != Delay::default() {
                tracing::warn!(?delay, "every trusted-log call is delayed, for measurement");
            }
            tokio::task::spawn_blocking(move || serve_with(component, listener, delay))
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
            println!("anchor       {}", status.anchor);
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
