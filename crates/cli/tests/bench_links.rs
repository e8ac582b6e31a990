//! `bulwark bench compare --links`: servers and client on shaped hosts of their own (network
//! namespaces). The rate holds (what the nodes received never exceeds what the client's link can
//! carry), and the hosts, their links and their processes are gone when the run ends: normally,
//! on SIGTERM, and, for a run killed outright, at the next run.
//!
//! Namespaces need root; elsewhere these tests say SKIPPED and pass, unless
//! BULWARK_REQUIRE_NETNS=1 makes that a failure (.ci/run runs as root).

use crate::common;

use common::BULWARK;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn can_make_namespaces() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let ip = Command::new("ip").arg("-V").output().is_ok();
    if root && ip {
        return true;
    }
    assert!(
        std::env::var("BULWARK_REQUIRE_NETNS").as_deref() != Ok("1"),
        "BULWARK_REQUIRE_NETNS=1 but namespaces cannot be made here (root: {root}, ip: {ip})"
    );
    eprintln!("SKIPPED: shaped links need root and iproute2");
    false
}

/// The namespaces a run of process `pid` made.
fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("bwk{pid}-")))
        .map(String::from)
        .collect()
}

/// Processes whose command line names `needle` (a run's own cluster directory).
fn processes_naming(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
        {
            found.push(pid);
        }
    }
    found
}

fn compare(out: &Path, rate: &str, systems: &str, seconds: &str) -> Command {
    let mut command = Command::new(BULWARK);
    command
        .args(["bench", "compare", "--links", rate, "--systems", systems])
        .args([
            "--workloads",
            "",
            "--sizes",
            "64k",
            "--size-concurrency",
            "4",
        ])
        .args(["--seconds", seconds, "--out"])
        .arg(out)
        .stdin(Stdio::null());
    command
}

/// Starts a long comparison and returns once its nodes serve (it has begun its first run).
fn start_long_run(out: &Path) -> Child {
    let mut child = compare(out, "100mbit", "powerstore", "600")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (seen, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = seen.send(line);
        }
    });
    let started = Instant::now();
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(120).saturating_sub(started.elapsed()))
            .expect("the comparison began no run within 120 s");
        // Nodes answer once `starting powerstore` is followed by the first run's own output;
        // the driver prints nothing before, so wait for the nodes' processes to exist.
        if line.contains("starting powerstore") {
            break;
        }
    }
    let work = format!("bulwark-bench-{}", child.id());
    while processes_naming(&work).len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no nodes started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Leave the nodes time to come up and the run to start.
    std::thread::sleep(Duration::from_secs(3));
    child
}

fn wait_gone(pid: u32, work: &str) {
    let started = Instant::now();
    while !(namespaces_of(pid).is_empty() && processes_naming(work).is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "left behind: namespaces {:?}, processes {:?}",
            namespaces_of(pid),
            processes_naming(work)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn shaped_links_carry_a_comparison_at_their_rate_and_are_removed_after() {
    if !can_make_namespaces() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    // 8 Mbit/s: a 64 KiB put sends 4 fragments of 32 KiB, so the client's link allows about
    // seven puts a second, where loopback would take hundreds.
    let child = compare(out.path(), "8mbit", "powerstore", "3")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "compare failed: {stderr}");
    assert!(stderr.contains("the client at 10.77.0.1"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("report.json")).unwrap()).unwrap();
    let notes = report["notes"].to_string();
    assert!(notes.contains("Links shaped to 8mbit"), "{notes}");
    let runs = report["runs"].as_array().unwrap();
    let run = |kind: &str| {
        runs.iter()
            .find(|r| r["workload"] == kind)
            .unwrap_or_else(|| panic!("no {kind} run in {runs:?}"))
    };
    for kind in ["put", "get"] {
        assert!(
            run(kind)["ops"].as_u64().unwrap() > 0,
            "{kind}: {:?}",
            run(kind)
        );
        assert_eq!(run(kind)["failures"], 0, "{kind}: {:?}", run(kind));
    }
    // Every fragment crosses the client's link: what the nodes received (frames, before TLS's
    // own bytes) cannot exceed what 8 Mbit/s carries in the run, plus the bucket's first burst.
    let put = run("put");
    let received = put["bytes_sent_per_op"].as_f64().unwrap() * put["ops"].as_u64().unwrap() as f64;
    let capacity = 8e6 / 8.0 * put["elapsed_s"].as_f64().unwrap() + 64.0 * 1024.0;
    assert!(
        received <= capacity * 1.25,
        "nodes received {received:.0} B in {} s, more than an 8 Mbit/s link carries ({capacity:.0} B)",
        put["elapsed_s"]
    );
    // The client's link counted what crossed it: at least the n - f = 3 fragments of 32 KiB a
    // put waits for (the fourth of the run's last puts may still be queued when the window
    // closes), and more than the frames the nodes received (TLS and IP add their own bytes).
    let link_sent = put["link_bytes_per_op"]["sent"].as_f64().unwrap();
    assert!(link_sent >= 3.0 * 32.0 * 1024.0, "{put:?}");
    assert!(
        link_sent > put["bytes_sent_per_op"].as_f64().unwrap(),
        "{put:?}"
    );
    let get = run("get");
    assert!(
        get["link_bytes_per_op"]["received"].as_f64().unwrap() >= 2.0 * 32.0 * 1024.0,
        "a get brings at least f + 1 fragments: {get:?}"
    );
    wait_gone(pid, &format!("bulwark-bench-{pid}"));
}

#[test]
fn a_terminated_run_removes_its_hosts_and_a_killed_runs_are_removed_by_the_next() {
    if !can_make_namespaces() {
        return;
    }
    let out = tempfile::tempdir().unwrap();

    let mut terminated = start_long_run(out.path());
    let pid = terminated.id();
    assert_eq!(
        namespaces_of(pid).len(),
        6,
        "switch, client and four servers"
    );
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = terminated.wait().unwrap();
    assert!(!status.success(), "a terminated run says it did not finish");
    wait_gone(pid, &format!("bulwark-bench-{pid}"));

    let mut killed = start_long_run(out.path());
    let pid = killed.id();
    killed.kill().unwrap();
    killed.wait().unwrap();
    let work = format!("bulwark-bench-{pid}");
    assert_eq!(namespaces_of(pid).len(), 6, "SIGKILL leaves the hosts");
    assert!(!processes_naming(&work).is_empty(), "... and the nodes");
    // The next run sweeps them before it makes its own, even one that then fails.
    let next = compare(out.path(), "8mbit", "no-such-system", "1")
        .output()
        .unwrap();
    assert!(!next.status.success());
    wait_gone(pid, &work);
}
