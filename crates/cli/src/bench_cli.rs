//! `bulwark bench cli`: what a user waits for at the command line. Each command is a whole
//! process (start, read the cluster files, connect, one operation, exit), timed from outside
//! against a local 4-node cluster, beside the same binary's `--version` (the floor no command
//! can beat: process start-up alone) in the same run.

use super::cs::start_cluster;
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `bulwark bench cli`.
#[derive(clap::Args)]
pub struct CliArgs {
    /// Runs of each command.
    #[arg(long, default_value_t = 100)]
    pub runs: usize,
    /// Bytes the put sends on standard input.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Where the cluster lives (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// A command as timed: its name in the table, its arguments, what it reads on standard input.
type CliCommand<'a> = (String, Vec<&'a str>, Option<&'a [u8]>);

pub async fn run(args: &CliArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("bulwark-bench-cli-{}", std::process::id())),
    };
    let result = measure(args, &dir).await;
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn measure(args: &CliArgs, dir: &Path) -> Result<()> {
    let (_nodes, _admin) = start_cluster(
        dir,
        4,
        vec!["admin:rw".to_string()],
        3_600_000,
        2_000,
        bulwark_core::configuration::CsProtocol::Pbft,
    )
    .await?;
    let exe = std::env::current_exe()?;
    let cluster = dir.display().to_string();
    let value = vec![b'v'; args.value_bytes];
    let size = crate::objects::human_bytes(args.value_bytes as u64);
    let commands: [CliCommand; 4] = [
        (
            "--version (process start-up)".into(),
            vec!["--version"],
            None,
        ),
        (
            format!("put, {size} on standard input"),
            vec!["put", "bench/cli", "--cluster", &cluster],
            Some(&value),
        ),
        (
            format!("get, {size}"),
            vec!["get", "bench/cli", "--cluster", &cluster],
            None,
        ),
        ("status".into(), vec!["status", "--cluster", &cluster], None),
    ];
    println!(
        "Whole process, {} runs each, against a local 4-node cluster ({}):\n",
        args.runs,
        exe.display()
    );
    println!("| command | median ms | p99 ms | max ms | median vs start-up |");
    println!("|---|---|---|---|---|");
    let mut floor = None;
    for (name, arguments, stdin) in &commands {
        let mut times = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            times.push(time(&exe, arguments, *stdin)?);
        }
        times.sort();
        let median = times[times.len() / 2];
        // Nearest rank: of 100 runs, the 99th.
        let p99 = times[(times.len() * 99).div_ceil(100) - 1];
        let max = times[times.len() - 1];
        let floor = *floor.get_or_insert(median);
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1}x |",
            ms(median),
            ms(p99),
            ms(max),
            median.as_secs_f64() / floor.as_secs_f64()
        );
    }
    Ok(())
}

/// One run of `bulwark <arguments>`, from spawn to exit; a failed command fails the benchmark.
fn time(exe: &Path, arguments: &[&str], stdin: Option<&[u8]>) -> Result<Duration> {
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args(arguments)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting bulwark {}", arguments.join(" ")))?;
    if let (Some(bytes), Some(mut input)) = (stdin, child.stdin.take()) {
        input.write_all(bytes)?;
    }
    let output = child.wait_with_output()?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        bail!(
            "bulwark {} failed: {}",
            arguments.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(elapsed)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
