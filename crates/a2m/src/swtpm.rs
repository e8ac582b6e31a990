//! A TPM 2.0 emulator (Debian's `swtpm`) run as a child process, for the TPM anchor's tests and
//! benchmark: a machine without a TPM, or one whose TPM must not be written to, gets a TPM of its
//! own whose state lives in a directory and survives the emulator's restarts, as a real TPM's
//! survives reboots.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set to `1`, a test that cannot get a TPM (no `swtpm`, or a build without TPM support) fails
/// instead of passing as skipped. CI sets it.
pub const REQUIRE_ENV: &str = "BULWARK_REQUIRE_TPM";

/// A running emulator; stopped when dropped.
pub struct Swtpm {
    child: Child,
    state: PathBuf,
    port: u16,
}

impl Swtpm {
    /// Starts an emulator whose state is kept in `state` (made if missing) on two free loopback
    /// ports. `Ok(None)` when there is no `swtpm` to run.
    pub fn start(state: &Path) -> Result<Option<Swtpm>, String> {
        std::fs::create_dir_all(state)
            .map_err(|error| format!("making {}: {error}", state.display()))?;
        // Another process may take a port between the probe and the emulator's bind: try again
        // on new ports.
        let mut last = String::new();
        for _ in 0..5 {
            let (port, control) = free_ports()?;
            let child = Command::new("swtpm")
                .arg("socket")
                .arg("--tpm2")
                .arg("--tpmstate")
                .arg(format!("dir={}", state.display()))
                .args([
                    "--server",
                    &format!("type=tcp,port={port},bindaddr=127.0.0.1"),
                ])
                .args([
                    "--ctrl",
                    &format!("type=tcp,port={control},bindaddr=127.0.0.1"),
                ])
                // Started and ready, as a TPM is once its platform has booted.
                .args(["--flags", "not-need-init,startup-clear"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(format!("starting swtpm: {error}")),
            };
            let mut swtpm = Swtpm {
                child,
                state: state.to_path_buf(),
                port,
            };
            match swtpm.wait_ready() {
                Ok(()) => return Ok(Some(swtpm)),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                return Err(format!("swtpm exited ({status}): {}", stderr.trim()));
            }
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("swtpm did not listen within 10 s".to_string());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How the TPM software stack reaches it ([`crate::TpmAnchor::new`]'s `tcti`).
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// Stops the emulator and starts it again on the same state: a reboot of the machine.
    pub fn restart(self) -> Result<Swtpm, String> {
        let state = self.state.clone();
        drop(self);
        Swtpm::start(&state)?.ok_or_else(|| "swtpm went missing".to_string())
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two free adjacent ports: the TPM software stack finds the emulator's control channel on the
/// port after its command port.
fn free_ports() -> Result<(u16, u16), String> {
    let bind = |port: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, port));
    for _ in 0..64 {
        let first = bind(0).map_err(|error| format!("finding a free port: {error}"))?;
        let port = first
            .local_addr()
            .map_err(|error| format!("finding a free port: {error}"))?
            .port();
        let Some(control) = port.checked_add(1) else {
            continue;
        };
        if bind(control).is_ok() {
            return Ok((port, control));
        }
    }
    Err("found no two free adjacent ports".to_string())
}

/// An emulator for a test named `test`, with its state in `state`; `None` (after saying
/// SKIPPED) when this machine or build cannot run one, unless [`REQUIRE_ENV`] is `1`, which
/// makes that a failure.
// Failing the calling test is this helper's purpose when a TPM is required.
#[allow(clippy::panic)]
pub fn for_test(test: &str, state: &Path) -> Option<Swtpm> {
    let reason = if !cfg!(feature = "tpm") {
        "this build has no TPM support (bulwark-a2m's `tpm` feature)".to_string()
    } else {
        match Swtpm::start(state) {
            Ok(Some(swtpm)) => return Some(swtpm),
            Ok(None) => "no swtpm on this machine (Debian: apt-get install swtpm)".to_string(),
            Err(error) => error,
        }
    };
    if std::env::var(REQUIRE_ENV).is_ok_and(|value| value == "1") {
        panic!("{test}: a TPM is required ({REQUIRE_ENV}=1) but {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    None
}
