//! The baselines (multi-writer ABD, and the Phalanx-style register) end to end on real node
//! processes: `bulwark cluster init --protocol`, the CLI against such a cluster, and concurrent
//! clients with a node SIGKILLed and restarted mid-run, the history checked for linearizability.
//! Also PoWerStore's own single-writer volume from the CLI, the write the paper measured first.

use crate::common;

use common::TestCluster;

/// `bulwark put/get/delete/status` against a cluster of `protocol`.
async fn cli_round_trip(protocol: &str, n: usize) {
    let cluster = TestCluster::start_protocol(protocol, 1, 1_000);
    let all: Vec<usize> = (0..n).collect();
    cluster.wait_up(&all).await;
    let put = cluster.cli(&["put", "greeting"], b"hello baseline");
    assert!(put.status.success(), "{put:?}");
    let get = cluster.cli(&["get", "greeting"], b"");
    assert!(get.status.success(), "{get:?}");
    assert_eq!(get.stdout, b"hello baseline");
    let reader_put = cluster.cli(&["put", "--client", "reader", "x"], b"no");
    assert!(!reader_put.status.success(), "a reader cannot write");
    let delete = cluster.cli(&["delete", "greeting"], b"");
    assert!(delete.status.success(), "{delete:?}");
    let gone = cluster.cli(&["get", "greeting"], b"");
    assert_eq!(gone.status.code(), Some(2), "{gone:?}");
    let status = cluster.cli(&["status"], b"");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abd_cli_round_trip() {
    cli_round_trip("abd", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abd_survives_a_sigkilled_node_and_stays_linearizable() {
    common::survives_a_sigkilled_node("abd", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phalanx_cli_round_trip() {
    cli_round_trip("phalanx", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phalanx_survives_a_sigkilled_node_and_stays_linearizable() {
    common::survives_a_sigkilled_node("phalanx", 4).await;
}

/// `bulwark volume create --writer`: the named client writes, everyone reads, and another writer
/// is told whose volume it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_with_one_writer_from_the_cli() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let create = cluster.cli(&["volume", "create", "solo", "--writer", "admin"], b"");
    assert!(create.status.success(), "{create:?}");
    let said = String::from_utf8_lossy(&create.stderr);
    assert!(said.contains("alone"), "{said}");
    for round in 0..3 {
        let value = format!("entry {round}");
        let put = cluster.cli(&["put", "--volume", "solo", "log"], value.as_bytes());
        assert!(put.status.success(), "{put:?}");
        let get = cluster.cli(
            &["get", "--client", "reader", "--volume", "solo", "log"],
            b"",
        );
        assert_eq!(get.stdout, value.as_bytes(), "{get:?}");
    }
    let other = cluster.cli(
        &["put", "--client", "writer2", "--volume", "solo", "log"],
        b"mine",
    );
    assert!(!other.status.success(), "{other:?}");
    let said = String::from_utf8_lossy(&other.stderr);
    assert!(said.contains("only writer is client"), "{said}");
    let unknown = cluster.cli(&["volume", "create", "solo2", "--writer", "nobody"], b"");
    assert!(!unknown.status.success(), "{unknown:?}");
}
