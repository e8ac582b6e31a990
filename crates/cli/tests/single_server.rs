//! Single-server volumes (A2M-Storage) on real processes: a node with its trusted log as a
//! process of its own (`cluster init --a2m`, `bulwark a2m serve`) serves a volume to two writers
//! and two readers at once, linearizably; its state survives the node's restart; a node whose
//! disk was rolled back stops serving the volume instead of serving the older state; its
//! trusted log killed, the volume refuses (saying why) and serves again once the log is back; a
//! trusted log restored from an older copy refuses to start at all; a node restored whole from
//! a copy is caught by the client that saw more, in a later run, or, with the trusted log
//! anchored in a TPM, by the trusted log itself before any client; and a node that forks the
//! volume (the A2M paper's Figure 1) is caught and recorded by the clients it lies to.

use crate::common;

use bulwark_client::{Client, ClientError, Volume};
use bulwark_core::NodeId;
use bulwark_sim::checker::{OpKind, Outcome};
use bytes::Bytes;
use common::{Recorder, TestCluster, copy_dir, value_for};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node that serves the volumes.
const SERVER: usize = 1;
/// Operations per client in the concurrent phase.
const OPS: u64 = 40;

fn replace_dir(dir: &Path, with: &Path) {
    std::fs::remove_dir_all(dir).expect("remove");
    copy_dir(with, dir);
}

/// The parts of a node's directory its operator copies to restore it whole: its store and its
/// trusted log.
const NODE_PARTS: [&str; 2] = ["data", "a2m"];

/// Copies the server node's store, its trusted log and `files` beside them into `saved`, and
/// returns the node's directory.
fn save_server(cluster: &TestCluster, saved: &Path, files: &[&str]) -> PathBuf {
    let node = cluster.path().join(format!("node-{SERVER}"));
    for part in NODE_PARTS {
        copy_dir(&node.join(part), &saved.join(part));
    }
    for file in files {
        std::fs::copy(node.join(file), saved.join(file)).expect("copy a file");
    }
    node
}

/// Puts back what [`save_server`] copied.
fn restore_server(node: &Path, saved: &Path, files: &[&str]) {
    for part in NODE_PARTS {
        replace_dir(&node.join(part), &saved.join(part));
    }
    for file in files {
        std::fs::copy(saved.join(file), node.join(file)).expect("restore a file");
    }
}

/// Retries `get` until the server answers (it restarts), for at most 20 s.
async fn get_when_up(client: &Client, volume: &Volume, key: &[u8]) -> Option<Bytes> {
    let started = Instant::now();
    loop {
        match client.get_in(volume, key).await {
            Ok((value, _)) => return value,
            Err(error) if started.elapsed() > Duration::from_secs(20) => {
                panic!("the volume never served again: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn refused_saying(result: Result<impl std::fmt::Debug, ClientError>, says: &str) {
    match result {
        Err(ClientError::Refused { refusal, nodes }) => {
            assert!(refusal.contains(says), "{refusal}");
            assert_eq!(nodes, vec![NodeId(SERVER as u32)]);
        }
        other => panic!("expected a refusal saying {says:?}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_volume_is_linearizable_and_never_serves_a_rolled_back_state() {
    let mut cluster = TestCluster::start_with("powerstore", 1, 4, 10_000, &["--a2m"]);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = Arc::new(cluster.client("admin").await);
    let (ledger, _) = admin
        .create_single_server_volume("ledger", NodeId(SERVER as u32))
        .await
        .expect("create the volume");
    let (again, _) = admin
        .create_single_server_volume("ledger", NodeId(SERVER as u32))
        .await
        .expect("creating it again is a no-op");
    assert_eq!(again, ledger);
    assert!(
        admin
            .create_single_server_volume("ledger", NodeId(2))
            .await
            .is_err(),
        "one name, one server"
    );

    // Two writers and two readers on three keys at once.
    let keys: Arc<Vec<Vec<u8>>> = Arc::new((0..3).map(|k| format!("k{k}").into_bytes()).collect());
    let recorder = Recorder::default();
    let mut tasks = Vec::new();
    for (index, name) in ["admin", "writer2"].into_iter().enumerate() {
        let client = cluster.client(name).await;
        let (recorder, keys, volume) = (recorder.clone(), keys.clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            let writer = index as u64;
            for sequence in 1..=OPS {
                let key = &keys[(sequence % keys.len() as u64) as usize];
                let value = value_for(writer, sequence);
                let invoke = recorder.now();
                let outcome = match client
                    .put_in(&volume, key, Bytes::from(value.clone()))
                    .await
                {
                    Ok(_) => Outcome::Ok,
                    Err(error) => panic!("a write failed on a healthy server: {error}"),
                };
                recorder.record(writer, key, OpKind::Write(Some(value)), invoke, outcome);
            }
        }));
    }
    for (index, name) in ["reader", "mallory"].into_iter().enumerate() {
        let client = cluster.client(name).await;
        let (recorder, keys, volume) = (recorder.clone(), keys.clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            let reader = 100 + index as u64;
            for sequence in 1..=OPS {
                let key = &keys[((sequence + index as u64) % keys.len() as u64) as usize];
                let invoke = recorder.now();
                let outcome = match client.get_in(&volume, key).await {
                    Ok((value, _)) => Outcome::Read(value.map(|v| v.to_vec())),
                    Err(error) => panic!("a read failed on a healthy server: {error}"),
                };
                recorder.record(reader, key, OpKind::Read, invoke, outcome);
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    recorder.assert_linearizable("a single-server volume");
    // Every acknowledged write was taken once: the server's write count is theirs.
    let status = admin.status().await;
    let served = status[SERVER].2.as_ref().expect("status");
    let volumes = served
        .replicas
        .iter()
        .find(|replica| replica.service == "a2m-storage")
        .expect("the node hosts its volumes");
    assert_eq!(volumes.stats.versions, 2 * OPS, "writes taken");
    let log = served
        .trusted_log
        .as_ref()
        .expect("the node reports its trusted log");
    assert!(log.attestations >= 4 * OPS, "{log:?}");
    assert_eq!(log.refused, 0, "{log:?}");

    // The node restarts: the volume is what it was.
    let before: Vec<Option<Bytes>> = {
        let mut values = Vec::new();
        for key in keys.iter() {
            values.push(admin.get_in(&ledger, key).await.expect("read").0);
        }
        values
    };
    cluster.kill(SERVER);
    cluster.spawn(SERVER, None);
    for (key, value) in keys.iter().zip(&before) {
        assert_eq!(&get_when_up(&admin, &ledger, key).await, value);
    }

    // A second volume on the same node.
    let (journal, _) = admin
        .create_single_server_volume("journal", NodeId(SERVER as u32))
        .await
        .expect("create a second volume");
    admin
        .put_in(&journal, b"entry", Bytes::from_static(b"one"))
        .await
        .expect("write");

    // The node's disk is rolled back to a copy taken before one more write to the ledger: its
    // trusted log holds a write its state does not, and the ledger stops rather than serve the
    // older state. The journal, whose state is all there, serves on.
    cluster.kill(SERVER);
    let data = cluster.path().join(format!("node-{SERVER}/data"));
    let old = cluster.path().join("data-before");
    copy_dir(&data, &old);
    cluster.spawn(SERVER, None);
    cluster.wait_up(&[SERVER]).await;
    admin
        .put_in(&ledger, b"k0", Bytes::from_static(b"after the copy"))
        .await
        .expect("write");
    cluster.kill(SERVER);
    replace_dir(&data, &old);
    cluster.spawn(SERVER, None);
    cluster.wait_up(&[SERVER]).await;
    assert_eq!(
        get_when_up(&admin, &journal, b"entry").await,
        Some(Bytes::from_static(b"one"))
    );
    refused_saying(admin.get_in(&ledger, b"k0").await, "past the state");

    // The trusted log's process is killed: the volume says so, and serves again when it is back.
    cluster.kill_trusted_log(SERVER);
    refused_saying(
        admin
            .put_in(&journal, b"entry", Bytes::from_static(b"two"))
            .await,
        "trusted log",
    );
    cluster.spawn_trusted_log(SERVER);
    let started = Instant::now();
    loop {
        match admin
            .put_in(&journal, b"entry", Bytes::from_static(b"two"))
            .await
        {
            Ok(_) => break,
            Err(error) if started.elapsed() > Duration::from_secs(20) => {
                panic!("the volume never served again after its log came back: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let reader = cluster.client("reader").await;
    assert_eq!(
        reader.get_in(&journal, b"entry").await.expect("read").0,
        Some(Bytes::from_static(b"two"))
    );

    // The trusted log restored from an older copy of its directory refuses to start: it would
    // attest slots it already attested, with other contents.
    let a2m = cluster.path().join(format!("node-{SERVER}/a2m"));
    let a2m_copy = cluster.path().join("a2m-before");
    cluster.kill_trusted_log(SERVER);
    copy_dir(&a2m, &a2m_copy);
    cluster.spawn_trusted_log(SERVER);
    admin
        .put_in(&journal, b"entry", Bytes::from_static(b"three"))
        .await
        .expect("write");
    cluster.kill_trusted_log(SERVER);
    replace_dir(&a2m, &a2m_copy);
    let refused = std::process::Command::new(common::BULWARK)
        .args(["a2m", "serve", "--dir"])
        .arg(&a2m)
        .arg("--socket")
        .arg(cluster.path().join(format!("node-{SERVER}/a2m.sock")))
        .output()
        .expect("run a2m serve");
    assert!(
        !refused.status.success(),
        "a rolled-back trusted log started"
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("generation"), "{said}");
    refused_saying(admin.get_in(&journal, b"entry").await, "trusted log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_of_figure_1_is_caught_and_recorded_on_real_processes() {
    let mut cluster = TestCluster::start_with("powerstore", 1, 4, 10_000, &["--a2m"]);
    // The server shows every client but the first the state the first one saw (Figure 1). The
    // honest process it replaces may have been killed while it made its store: it starts empty.
    cluster.kill(SERVER);
    let _ = std::fs::remove_dir_all(cluster.path().join(format!("node-{SERVER}/data")));
    cluster.spawn_byzantine(SERVER, &["--volumes", "fork"]);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let a = cluster.client("admin").await;
    let (volume, _) = a
        .create_single_server_volume("forked", NodeId(SERVER as u32))
        .await
        .expect("create the volume");
    // Client a writes twice; its reads are answered honestly.
    a.put_in(&volume, b"k", Bytes::from_static(b"1"))
        .await
        .expect("write 1");
    a.put_in(&volume, b"k", Bytes::from_static(b"2a"))
        .await
        .expect("write 2a");
    assert_eq!(
        a.get_in(&volume, b"k").await.expect("read").0,
        Some(Bytes::from_static(b"2a"))
    );
    // Client b is shown the state before both: it has no attestation for b's nonce, and b
    // says so, naming the server, whether it reads or writes.
    for name in ["reader", "writer2"] {
        let b = cluster.client(name).await;
        let read = b.get_in(&volume, b"k").await;
        match read {
            Err(ClientError::Misbehaved { node, detail }) => {
                assert_eq!(node, NodeId(SERVER as u32));
                assert!(detail.contains("END"), "{detail}");
            }
            other => panic!("{name} believed the fork: {other:?}"),
        }
    }
    let b = cluster.client("writer2").await;
    assert!(
        matches!(
            b.put_in(&volume, b"k", Bytes::from_static(b"2b")).await,
            Err(ClientError::Misbehaved { .. })
        ),
        "a write computed on the forked state"
    );
    let recorded = bulwark_client::evidence::summary(cluster.path());
    assert!(
        recorded.iter().any(
            |line| line.starts_with(&format!("node {SERVER} caught")) && line.contains("nonce")
        ),
        "{recorded:?}"
    );
    // What a saw stands: b's write never happened.
    assert_eq!(
        a.get_in(&volume, b"k").await.expect("read").0,
        Some(Bytes::from_static(b"2a"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_catches_a_server_rolled_back_whole_in_a_later_run() {
    let mut cluster = TestCluster::start_with("powerstore", 1, 4, 10_000, &["--a2m"]);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let (vault, _) = admin
        .create_single_server_volume("vault", NodeId(SERVER as u32))
        .await
        .expect("create the volume");
    admin
        .put_in(&vault, b"k", Bytes::from_static(b"1"))
        .await
        .expect("write 1");
    // The operator of node 1 copies everything it has: its disk, its trusted log and the log's
    // anchor. Nothing on the node can tell the copy from the original.
    cluster.kill(SERVER);
    cluster.kill_trusted_log(SERVER);
    let saved = cluster.path().join("saved");
    let node = save_server(&cluster, &saved, &["a2m.anchor"]);
    cluster.spawn_trusted_log(SERVER);
    cluster.spawn(SERVER, None);
    cluster.wait_up(&[SERVER]).await;
    admin
        .put_in(&vault, b"k", Bytes::from_static(b"2"))
        .await
        .expect("write 2");
    let reader = cluster.client("reader").await;
    assert_eq!(
        reader.get_in(&vault, b"k").await.expect("read").0,
        Some(Bytes::from_static(b"2"))
    );
    drop(reader);
    // Then puts the copy back, whole: to the node and its trusted log, write 2 never happened.
    cluster.kill(SERVER);
    cluster.kill_trusted_log(SERVER);
    restore_server(&node, &saved, &["a2m.anchor"]);
    cluster.spawn_trusted_log(SERVER);
    cluster.spawn(SERVER, None);
    cluster.wait_up(&[SERVER]).await;
    // The reader, in a later run, remembers write 2 and refuses the older state.
    let reader = cluster.client("reader").await;
    match reader.get_in(&vault, b"k").await {
        Err(ClientError::Misbehaved { node, detail }) => {
            assert_eq!(node, NodeId(SERVER as u32));
            assert!(detail.contains("rollback"), "{detail}");
        }
        other => panic!("the rolled-back state was believed: {other:?}"),
    }
    // A client that never saw write 2 cannot tell: only what a client saw protects it.
    let mallory = cluster.client("mallory").await;
    assert_eq!(
        mallory.get_in(&vault, b"k").await.expect("read").0,
        Some(Bytes::from_static(b"1"))
    );
}

/// The same whole-node restore as above, with the node's trusted log anchored in a TPM
/// (`cluster init --a2m-tpm`): the restored trusted log refuses to start, so no client, not even
/// one that never saw write 2, is served the older state. Runs on its own swtpm; SKIPPED without
/// one unless BULWARK_REQUIRE_TPM=1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restored_whole_is_refused_by_its_tpm_before_any_client_sees_it() {
    let state = tempfile::tempdir().expect("tempdir");
    let Some(swtpm) = bulwark_a2m::swtpm::for_test(
        "a_server_restored_whole_is_refused_by_its_tpm_before_any_client_sees_it",
        state.path(),
    ) else {
        return;
    };
    let tcti = swtpm.tcti();
    let mut cluster =
        TestCluster::start_with("powerstore", 1, 4, 10_000, &["--a2m", "--a2m-tpm", &tcti]);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let status = admin.status().await;
    let log = status[SERVER]
        .2
        .as_ref()
        .expect("status")
        .trusted_log
        .clone();
    let backend = log.expect("the node reports its trusted log").backend;
    assert!(
        backend.contains(&format!("TPM NV index {:#010x}", 0x0150_0000 + SERVER)),
        "{backend}"
    );
    let (vault, _) = admin
        .create_single_server_volume("vault", NodeId(SERVER as u32))
        .await
        .expect("create the volume");
    admin
        .put_in(&vault, b"k", Bytes::from_static(b"1"))
        .await
        .expect("write 1");
    cluster.kill(SERVER);
    cluster.kill_trusted_log(SERVER);
    let saved = cluster.path().join("saved");
    let node = save_server(&cluster, &saved, &[]);
    cluster.spawn_trusted_log(SERVER);
    cluster.spawn(SERVER, None);
    cluster.wait_up(&[SERVER]).await;
    admin
        .put_in(&vault, b"k", Bytes::from_static(b"2"))
        .await
        .expect("write 2");

    cluster.kill(SERVER);
    cluster.kill_trusted_log(SERVER);
    restore_server(&node, &saved, &[]);
    let refused = cluster
        .trusted_log_command(SERVER)
        .output()
        .expect("run a2m serve");
    assert!(
        !refused.status.success(),
        "a trusted log restored from a copy started"
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("the state was rolled back") && said.contains("TPM NV index"),
        "{said}"
    );
    // A node refuses to start without its trusted log, so the older state is served to no one:
    // the operator must give the node a new trusted log (a new identity) and the clients learn
    // it, which is what a lost trusted log takes (docs/a2m.md).
    drop(swtpm);
}
