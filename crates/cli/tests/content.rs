//! Content-hash objects on real node processes: stored on the group their id falls in, read
//! back through any f+1 fragments with a node down, kept through every node's SIGKILL, refused
//! to a client that may not write, and used from the command line.

mod common;

use bulwark_client::ClientError;
use common::TestCluster;
use std::process::Command;

fn object(i: usize) -> Vec<u8> {
    // Sizes on both sides of the replication threshold, and a 3 MiB one.
    let len = [0, 10, 4096, 4097, 70_000, 3 << 20][i % 6] + i;
    (0..len).map(|j| ((j * 7 + i * 13) % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_objects_survive_a_down_node_and_a_killed_cluster() {
    // Seven nodes: the ids fall in several groups.
    let mut cluster = TestCluster::start_nodes("powerstore", 1, 7, 10_000);
    cluster.wait_up(&[0, 1, 2, 3, 4, 5, 6]).await;
    let admin = cluster.client("admin").await;

    let mut stored = Vec::new();
    let mut groups = std::collections::BTreeSet::new();
    for i in 0..12 {
        let value = object(i);
        let (id, report) = admin.put_content(&value).await.expect("stored");
        assert!(report.answered.len() >= 3, "2f+1 acknowledgements");
        let (again, _) = admin.put_content(&value).await.expect("stored again");
        assert_eq!(again, id, "the same bytes get the same id");
        groups.insert(admin.placement().group_of(id.as_bytes()).id());
        stored.push((id, value));
    }
    assert!(groups.len() > 1, "ids are placed on several groups");

    // A node down: every object is still read, from the others.
    cluster.kill(2);
    let reader = cluster.client("reader").await;
    for (id, value) in &stored {
        let (got, _) = reader.get_content(id).await.expect("read with a node down");
        assert_eq!(got.as_deref(), Some(&value[..]), "object {id}");
    }
    // A reader may not store, and is told so before anything is sent.
    assert!(matches!(
        reader.put_content(b"nope").await,
        Err(ClientError::NotWriter { .. })
    ));
    // An id nobody stored is "not found", not an error.
    let (missing, _) = reader
        .get_content(&bulwark_protocol::content::ContentId(bulwark_core::Digest(
            [7; 32],
        )))
        .await
        .expect("a definite answer");
    assert_eq!(missing, None);

    // Every node SIGKILLed and restarted: every acknowledged object is still there.
    for node in 0..7 {
        cluster.kill(node);
    }
    for node in 0..7 {
        cluster.spawn(node, None);
    }
    cluster.wait_up(&[0, 1, 2, 3, 4, 5, 6]).await;
    let reader = cluster.client("reader").await;
    for (id, value) in &stored {
        let (got, _) = reader.get_content(id).await.expect("read after restart");
        assert_eq!(
            got.as_deref(),
            Some(&value[..]),
            "object {id} after restart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_stores_content_and_prints_its_id() {
    let cluster = TestCluster::start(1, 10_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let file = cluster.path().join("input.bin");
    std::fs::write(&file, object(4)).unwrap();
    let bulwark = common::BULWARK;
    let put = Command::new(bulwark)
        .args(["content", "put"])
        .arg(&file)
        .arg("--cluster")
        .arg(cluster.path())
        .output()
        .expect("run content put");
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let id = String::from_utf8(put.stdout).unwrap().trim().to_string();
    assert_eq!(id.len(), 64, "{id}");

    let out = cluster.path().join("output.bin");
    let get = Command::new(bulwark)
        .args(["content", "get", &id, "-o"])
        .arg(&out)
        .arg("--cluster")
        .arg(cluster.path())
        .output()
        .expect("run content get");
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(std::fs::read(&out).unwrap(), object(4));

    let bad = Command::new(bulwark)
        .args(["content", "get", "xyz", "--cluster"])
        .arg(cluster.path())
        .output()
        .expect("run content get");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("64 hex digits"));
    let absent = Command::new(bulwark)
        .args(["content", "get", &"ab".repeat(32), "--cluster"])
        .arg(cluster.path())
        .output()
        .expect("run content get");
    assert_eq!(absent.status.code(), Some(2), "not found");
}
