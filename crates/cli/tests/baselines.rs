//! The baselines (multi-writer ABD, and the Phalanx-style register) end to end on real node
//! processes: `bulwark cluster init --protocol`, the CLI against such a cluster, and concurrent
//! clients with a node SIGKILLed and restarted mid-run, the history checked for linearizability.

mod common;

use bulwark_core::NodeId;
use bulwark_sim::checker::{self, OpKind, Outcome};
use bytes::Bytes;
use common::{BULWARK, Recorder, TestCluster};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn value_for(writer: u64, sequence: u64) -> Vec<u8> {
    let len = if sequence.is_multiple_of(3) {
        9_000
    } else {
        24
    };
    let mut value = format!("w{writer}-s{sequence}-").into_bytes();
    value.resize(len, b'.');
    value
}

fn bulwark(cluster: &TestCluster, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(BULWARK)
        .args(args)
        .arg("--cluster")
        .arg(cluster.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bulwark");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("bulwark output")
}

/// `bulwark put/get/delete/status` against a cluster of `protocol`.
async fn cli_round_trip(protocol: &str, n: usize) {
    let cluster = TestCluster::start_protocol(protocol, 1, 1_000);
    let all: Vec<usize> = (0..n).collect();
    cluster.wait_up(&all).await;
    let put = bulwark(&cluster, &["put", "greeting"], b"hello baseline");
    assert!(put.status.success(), "{put:?}");
    let get = bulwark(&cluster, &["get", "greeting"], b"");
    assert!(get.status.success(), "{get:?}");
    assert_eq!(get.stdout, b"hello baseline");
    let reader_put = bulwark(&cluster, &["put", "--client", "reader", "x"], b"no");
    assert!(!reader_put.status.success(), "a reader cannot write");
    let delete = bulwark(&cluster, &["delete", "greeting"], b"");
    assert!(delete.status.success(), "{delete:?}");
    let gone = bulwark(&cluster, &["get", "greeting"], b"");
    assert_eq!(gone.status.code(), Some(2), "{gone:?}");
    let status = bulwark(&cluster, &["status"], b"");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    assert!(
        text.contains(&format!("{n} of {n} nodes reachable")) && text.contains(protocol),
        "{text}"
    );
    // The largest object any protocol takes: baselines send it whole in one frame per node.
    let admin = cluster.client("admin").await;
    let value: Vec<u8> = (0..bulwark_core::OBJECT_BYTES_MAX)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0])
        .collect();
    admin
        .put(b"huge", bytes::Bytes::from(value.clone()))
        .await
        .unwrap_or_else(|e| panic!("{protocol}: 16 MiB put: {e}"));
    let (read, _) = admin.get(b"huge").await.expect("16 MiB get");
    assert!(
        read.as_deref() == Some(&value[..]),
        "{protocol}: 16 MiB object did not read back identically"
    );
}

/// Concurrent writers and readers on three keys; one node SIGKILLed and restarted mid-run.
async fn survives_a_sigkilled_node(protocol: &str, n: usize) {
    const OPS_PER_CLIENT_MAX: u64 = 1_500;
    let mut cluster = TestCluster::start_protocol(protocol, 1, 1_000);
    let all: Vec<usize> = (0..n).collect();
    cluster.wait_up(&all).await;
    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let keys: Vec<Vec<u8>> = (0..3).map(|k| format!("key-{k}").into_bytes()).collect();
    let mut tasks = Vec::new();
    for writer in 0..3u64 {
        let client = cluster
            .client(if writer == 0 { "admin" } else { "writer2" })
            .await;
        let (recorder, keys, stop) = (recorder.clone(), keys.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let key = &keys[((writer + sequence) % 3) as usize];
                let value = value_for(writer, sequence);
                let invoke = recorder.now();
                let outcome = match client.put(key, Bytes::from(value.clone())).await {
                    Ok(_) => Outcome::Ok,
                    Err(_) => Outcome::Unknown,
                };
                recorder.record(writer, key, OpKind::Write(Some(value)), invoke, outcome);
            }
        }));
    }
    for reader in 0..2u64 {
        let client = cluster.client("reader").await;
        let (recorder, keys, stop) = (recorder.clone(), keys.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let key = &keys[((reader + sequence) % 3) as usize];
                let invoke = recorder.now();
                let outcome = match client.get(key).await {
                    Ok((value, _)) => Outcome::Read(value.map(|v| v.to_vec())),
                    Err(_) => Outcome::Unknown,
                };
                recorder.record(100 + reader, key, OpKind::Read, invoke, outcome);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let killed_at = recorder.now();
    cluster.kill(1);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let restarted_at = recorder.now();
    cluster.spawn(1, None);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }
    cluster.wait_up(&[1]).await;
    let client = cluster.client("reader").await;
    for key in &keys {
        let invoke = recorder.now();
        let (value, _) = client.get(key).await.expect("final read");
        assert!(value.is_some(), "an acknowledged write to {key:?} vanished");
        recorder.record(
            999,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(value.map(|v| v.to_vec())),
        );
    }
    let history = recorder.history();
    let report = checker::check(&history);
    assert!(
        report.ok,
        "{protocol}: history is not linearizable: {:#?} (inconclusive keys: {:?})",
        report.violations, report.inconclusive
    );
    let ops = history.ops();
    let acknowledged = ops.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let during_outage = ops
        .iter()
        .filter(|op| {
            op.outcome != Outcome::Unknown
                && op.invoke > killed_at
                && op.complete.is_some_and(|c| c < restarted_at)
        })
        .count();
    eprintln!(
        "{protocol}: checked {} operations ({acknowledged} acknowledged writes, {during_outage} completed while node 1 was down) on {} keys",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 60,
        "too few writes completed ({acknowledged})"
    );
    assert!(
        during_outage >= 20,
        "operations must continue while a node is down ({during_outage})"
    );

    // Node 1 recovered its acknowledged state from disk: with the last node down too, every
    // quorum needs node 1, and every key still reads its latest value.
    let last = n - 1;
    cluster.kill(last);
    for key in &keys {
        let (value, report) = client.get(key).await.expect("read with another node down");
        assert!(value.is_some());
        assert!(report.answered.contains(&NodeId(1)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abd_cli_round_trip() {
    cli_round_trip("abd", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abd_survives_a_sigkilled_node_and_stays_linearizable() {
    survives_a_sigkilled_node("abd", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phalanx_cli_round_trip() {
    cli_round_trip("phalanx", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phalanx_survives_a_sigkilled_node_and_stays_linearizable() {
    survives_a_sigkilled_node("phalanx", 4).await;
}
