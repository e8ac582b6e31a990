//! Rosebud's two object kinds on real node processes. Content-hash objects: stored on the group
//! their id falls in, read back through any f+1 fragments with a node down, kept through every
//! node's SIGKILL, refused to a client that may not write, used from the command line.
//! Public-key objects: written by any client holding the owner's key, read by anyone, deleted,
//! kept through SIGKILLs, used from the command line.

use crate::common;

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

    // Deleted, the object is found no more.
    let delete = Command::new(bulwark)
        .args(["content", "delete", &id, "--cluster"])
        .arg(cluster.path())
        .output()
        .expect("run content delete");
    assert!(
        delete.status.success(),
        "{}",
        String::from_utf8_lossy(&delete.stderr)
    );
    let gone = Command::new(bulwark)
        .args(["content", "get", &id, "--cluster"])
        .arg(cluster.path())
        .output()
        .expect("run content get");
    assert_eq!(gone.status.code(), Some(2), "not found once deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_key_objects_follow_their_owners_key_through_kills() {
    use bulwark_core::sign::SecretKey;
    use bytes::Bytes;
    let mut cluster = TestCluster::start_nodes("powerstore", 1, 7, 10_000);
    cluster.wait_up(&[0, 1, 2, 3, 4, 5, 6]).await;
    let admin = cluster.client("admin").await;
    let writer2 = cluster.client("writer2").await;
    let reader = cluster.client("reader").await;
    let alice = SecretKey::from_seed(&[0xa1; 32]);
    let bob = SecretKey::from_seed(&[0xb0; 32]);

    // Two clients holding Alice's key write in turn; the later version wins.
    let (id, _) = admin
        .put_owned(&alice, Some(Bytes::from_static(b"first")))
        .await
        .expect("written");
    writer2
        .put_owned(&alice, Some(Bytes::from_static(b"second")))
        .await
        .expect("written by another client with the key");
    admin
        .put_owned(&bob, Some(Bytes::from_static(b"bob's")))
        .await
        .expect("written");
    let (got, _) = reader.get_owned(&alice.public_key()).await.unwrap();
    assert_eq!(got.as_deref(), Some(&b"second"[..]));
    assert_eq!(id, bulwark_protocol::pubkey::object_id(&alice.public_key()));
    assert!(matches!(
        reader
            .put_owned(&alice, Some(Bytes::from_static(b"x")))
            .await,
        Err(ClientError::NotWriter { .. })
    ));

    // Concurrent writers: the object ends at one of their values, and every read after agrees.
    let writes = (0..6).map(|i| {
        let client = if i % 2 == 0 { &admin } else { &writer2 };
        let alice = &alice;
        async move {
            client
                .put_owned(alice, Some(Bytes::from(format!("v{i}"))))
                .await
                .expect("concurrent write");
        }
    });
    futures::future::join_all(writes).await;
    let (settled, _) = reader.get_owned(&alice.public_key()).await.unwrap();
    let settled = settled.expect("a value");
    assert!(settled.starts_with(b"v"), "{settled:?}");
    for _ in 0..3 {
        let (again, _) = admin.get_owned(&alice.public_key()).await.unwrap();
        assert_eq!(again.as_ref(), Some(&settled));
    }

    // Every node SIGKILLed and restarted: the versions are still there; then a delete.
    for node in 0..7 {
        cluster.kill(node);
    }
    for node in 0..7 {
        cluster.spawn(node, None);
    }
    cluster.wait_up(&[0, 1, 2, 3, 4, 5, 6]).await;
    let reader = cluster.client("reader").await;
    let (after, _) = reader.get_owned(&alice.public_key()).await.unwrap();
    assert_eq!(after.as_ref(), Some(&settled));
    let (bobs, _) = reader.get_owned(&bob.public_key()).await.unwrap();
    assert_eq!(bobs.as_deref(), Some(&b"bob's"[..]));
    let admin = cluster.client("admin").await;
    admin.put_owned(&alice, None).await.expect("deleted");
    let (gone, _) = reader.get_owned(&alice.public_key()).await.unwrap();
    assert_eq!(gone, None);
    let (never, _) = reader
        .get_owned(&SecretKey::from_seed(&[3; 32]).public_key())
        .await
        .unwrap();
    assert_eq!(never, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_writes_an_owned_object_with_a_key_file() {
    let cluster = TestCluster::start(1, 10_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let run = |args: &[&str]| {
        Command::new(common::BULWARK)
            .args(args)
            .arg("--cluster")
            .arg(cluster.path())
            .output()
            .expect("run bulwark")
    };
    let key = cluster.path().join("owner.key");
    let made = Command::new(common::BULWARK)
        .args(["owned", "new-key"])
        .arg(&key)
        .output()
        .expect("run new-key");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let public = String::from_utf8(made.stdout).unwrap().trim().to_string();
    assert_eq!(public.len(), 64);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the secret is readable by its owner alone");

    let input = cluster.path().join("input.bin");
    std::fs::write(&input, b"owned bytes").unwrap();
    let key_arg = key.to_str().unwrap();
    let put = run(&["owned", "put", "--key", key_arg, input.to_str().unwrap()]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&put.stdout).trim(), public);
    let get = run(&["owned", "get", &public]);
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(get.stdout, b"owned bytes");
    let delete = run(&["owned", "delete", "--key", key_arg]);
    assert!(
        delete.status.success(),
        "{}",
        String::from_utf8_lossy(&delete.stderr)
    );
    assert_eq!(run(&["owned", "get", &public]).status.code(), Some(2));
    let bad = run(&["owned", "get", "nothex"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("public key"));
}
