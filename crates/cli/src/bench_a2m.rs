//! `bulwark bench a2m`: what one trusted-log call costs, for each way a node can hold its
//! component, side by side in one run: in memory (the signature alone), durable in the node's
//! process (a store commit and the anchor's flush per change), and in its own process behind
//! the local socket (`bulwark a2m serve`, the default backend), fused and unfused, and with
//! `--tpm` durable with its generation in a TPM's counter. Verifying an attestation, which every
//! receiver does, is measured beside them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bulwark_a2m::socket::Remote;
use bulwark_a2m::swtpm::Swtpm;
use bulwark_a2m::{A2m, Component, FileAnchor, Limits, TpmAnchor};
use bulwark_core::a2m::{Expected, nonce_of};

/// `bulwark bench a2m`.
#[derive(clap::Args)]
pub struct A2mArgs {
    /// Calls of each kind.
    #[arg(long, default_value_t = 2000)]
    pub calls: usize,
    /// Also measure a durable component whose generation is in a TPM counter: `swtpm` starts a
    /// throwaway emulator (Debian's swtpm), anything else is the TPM software stack's address of
    /// a TPM (`device:/dev/tpmrm0`), whose counter at --tpm-index is defined and left there.
    #[arg(long)]
    pub tpm: Option<String>,
    /// The NV index of the measured counter on a real TPM.
    #[arg(long, value_parser = crate::a2m::parse_index, default_value = "0x015fffff")]
    pub tpm_index: u32,
}

pub async fn run(args: &A2mArgs) -> Result<()> {
    if args.calls == 0 {
        bail!("--calls must be at least 1");
    }
    let dir = std::env::temp_dir().join(format!("bulwark-bench-a2m-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let calls = args.calls;
    let exe = std::env::current_exe()?;
    let inside = dir.clone();
    let tpm = args.tpm.clone().map(|tcti| (tcti, args.tpm_index));
    let rows = tokio::task::spawn_blocking(move || measure(calls, &inside, &exe, tpm)).await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = rows??;
    println!("| call | median µs | p99 µs | calls/s (one caller) |");
    println!("|---|---|---|---|");
    for (name, mut times) in rows {
        times.sort();
        let at = |q: usize| times[(times.len() * q).div_ceil(100).max(1) - 1];
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        println!(
            "| {name} | {:.1} | {:.1} | {:.0} |",
            at(50).as_secs_f64() * 1e6,
            at(99).as_secs_f64() * 1e6,
            1.0 / mean.as_secs_f64()
        );
    }
    Ok(())
}

type Row = (&'static str, Vec<Duration>);

fn time(calls: usize, mut call: impl FnMut(u64) -> Result<()>) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(calls);
    for i in 0..calls as u64 {
        let start = Instant::now();
        call(i)?;
        times.push(start.elapsed());
    }
    Ok(times)
}

fn measure(calls: usize, dir: &Path, exe: &Path, tpm: Option<(String, u32)>) -> Result<Vec<Row>> {
    let mut rows = Vec::new();

    let mut memory = Component::in_memory(&[1; 32], Limits::default());
    let key = memory.public_key();
    rows.push((
        "lookup, in memory (sign only)",
        time(calls, |i| {
            memory.lookup(0, 0, nonce_of(i.into()))?;
            Ok(())
        })?,
    ));
    let sample = memory.append_attest(0, [1; 32], nonce_of(1))?;
    rows.push((
        "verify an attestation (every receiver)",
        time(calls, |_| {
            Expected::assigned(0, 1, [1; 32]).check(&key, sample.to_unverified())?;
            Ok(())
        })?,
    ));

    let state = dir.join("in-process");
    let mut durable = Component::create(
        &state,
        Box::new(FileAnchor::beside(&state).context("the state directory has a name")?),
        Limits::default(),
    )?;
    rows.push((
        "append_attest, durable in the node's process",
        time(calls, |i| {
            durable.append_attest(0, [i as u8; 32], nonce_of(i.into()))?;
            Ok(())
        })?,
    ));

    drop(durable);

    if let Some((tcti, index)) = tpm {
        // Kept until the measurement ends: the emulator, if the bench started one.
        let mut emulator = None;
        let tcti = if tcti == "swtpm" {
            let swtpm = Swtpm::start(&dir.join("swtpm"))
                .map_err(anyhow::Error::msg)?
                .context("--tpm swtpm needs Debian's swtpm")?;
            let tcti = swtpm.tcti();
            emulator = Some(swtpm);
            tcti
        } else {
            tcti
        };
        let state = dir.join("tpm-anchored");
        let mut anchored = Component::create(
            &state,
            Box::new(TpmAnchor::new(&tcti, index).map_err(anyhow::Error::msg)?),
            Limits::default(),
        )?;
        rows.push((
            "append_attest, durable, generation in the TPM's counter",
            time(calls, |i| {
                anchored.append_attest(0, [i as u8; 32], nonce_of(i.into()))?;
                Ok(())
            })?,
        ));
        drop(anchored);
        drop(emulator);
    }

    let served = dir.join("served");
    let init = Command::new(exe)
        .args(["a2m", "init", "--dir"])
        .arg(&served)
        .stdout(Stdio::null())
        .status()?;
    if !init.success() {
        bail!("bulwark a2m init failed");
    }
    let socket = dir.join("a2m.sock");
    let child = Command::new(exe)
        .args(["a2m", "serve", "--dir"])
        .arg(&served)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let _serving = Reaper(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut remote = loop {
        match Remote::connect(&socket, None) {
            Ok(remote) => break remote,
            Err(error) if Instant::now() > deadline => bail!("bulwark a2m serve: {error}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    rows.push((
        "lookup, own process over the socket",
        time(calls, |i| {
            remote.lookup(0, 0, nonce_of(i.into()))?;
            Ok(())
        })?,
    ));
    rows.push((
        "append_attest (fused), own process",
        time(calls, |i| {
            remote.append_attest(0, [i as u8; 32], nonce_of(i.into()))?;
            Ok(())
        })?,
    ));
    rows.push((
        "append then lookup (unfused), own process",
        time(calls, |i| {
            let seq = remote.append(1, [i as u8; 32])?;
            remote.lookup(1, seq, nonce_of(seq))?;
            Ok(())
        })?,
    ));
    Ok(rows)
}

/// Kills the serving process however the measurement ends.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
