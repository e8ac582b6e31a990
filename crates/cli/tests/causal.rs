//! Causal volumes (Depot) on real processes: a volume on the four nodes of a cluster, written by
//! two clients. Writes that could not see each other (each made while only one server was up,
//! a different one) are both returned by later reads, as concurrent versions, once the servers
//! have gossiped; a write made after both supersedes them. The servers' logs survive their
//! restart, and a client writes and reads through whichever server answers; with every server
//! stopped, a read falls back to the writer of a value no server gave, and two clients exchange
//! their logs directly. With three of the
//! four servers lying (one forking, one withholding, one tampering), the clients still write and
//! read, converge through the one correct server, and hold proof of the fork.

use crate::common;

use bulwark_client::Client;
use bulwark_client::causal::CausalRead;
use bulwark_core::NodeId;
use bulwark_protocol::depot::VolumeId;
use bytes::Bytes;
use common::TestCluster;
use std::time::{Duration, Instant};

/// Reads `key` until `done` holds of what the read returns, for at most 30 s (servers gossip
/// every second; a read may need a few rounds of it).
async fn read_until(
    client: &Client,
    volume: VolumeId,
    key: &[u8],
    what: &str,
    done: impl Fn(&CausalRead) -> bool,
) -> CausalRead {
    let started = Instant::now();
    loop {
        let read = client.causal_read("notes", volume, key).await;
        if let Ok(read) = &read
            && done(read)
        {
            return read.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never read {what}: last {read:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn values(read: &CausalRead) -> Vec<Option<Bytes>> {
    read.versions.iter().map(|v| v.value.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_causal_volume_keeps_concurrent_writes_as_versions_and_needs_no_particular_server() {
    let mut cluster = TestCluster::init("powerstore", 1, 4, 10_000, &[]);
    // No value's bytes stay in a server's memory past the input that brought them: every value
    // served is read back from the store (not yet committed, or from disk after a restart).
    cluster.node_args = vec!["--causal-cache-bytes".into(), "1".into()];
    cluster.spawn_all();
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let writer2 = cluster.client("writer2").await;
    let (volume, report) = admin
        .create_causal_volume("notes", &[])
        .await
        .expect("create the volume");
    assert_eq!(report.answered.len(), 4, "every node serves it");
    let (again, _) = admin
        .create_causal_volume("notes", &[])
        .await
        .expect("creating it again is a no-op");
    assert_eq!(again, volume);
    let found = writer2.volume("notes").await.expect("writer2 finds it");
    assert_eq!(found, volume);
    let bulwark_client::Serving::Causal { volume: number } = volume.serving else {
        panic!("not causal: {volume:?}");
    };

    // A write another client then reads, through another server (gossip carries it).
    admin
        .put_in(&volume, b"greeting", Bytes::from_static(b"hello"))
        .await
        .expect("put");
    let read = read_until(&writer2, number, b"greeting", "hello", |read| {
        values(read) == vec![Some(Bytes::from_static(b"hello"))]
    })
    .await;
    assert_eq!(read.versions[0].writer, "admin");

    // Two writes that cannot see each other: each made while only one server, another one, is up.
    for id in [1, 2, 3] {
        cluster.kill(id);
    }
    let written = admin
        .causal_write(
            "notes",
            number,
            b"doc",
            Some(Bytes::from_static(b"from admin")),
        )
        .await
        .expect("write")
        .acknowledged_by;
    assert_eq!(written, Some(NodeId(0)), "node 0 alone is up");
    cluster.kill(0);
    cluster.spawn(1, None);
    cluster.wait_up(&[1]).await;
    let written = writer2
        .causal_write(
            "notes",
            number,
            b"doc",
            Some(Bytes::from_static(b"from writer2")),
        )
        .await
        .expect("write")
        .acknowledged_by;
    assert_eq!(written, Some(NodeId(1)), "node 1 alone is up");
    for id in [0, 2, 3] {
        cluster.spawn(id, None);
    }
    cluster.wait_up(&[0, 1, 2, 3]).await;
    for client in [&admin, &writer2] {
        let read = read_until(client, number, b"doc", "both versions", |read| {
            read.versions.len() == 2
        })
        .await;
        let mut seen = values(&read);
        seen.sort();
        assert_eq!(
            seen,
            vec![
                Some(Bytes::from_static(b"from admin")),
                Some(Bytes::from_static(b"from writer2"))
            ]
        );
        assert!(read.forked.is_empty(), "nobody forked: {:?}", read.forked);
        assert_eq!(read.newest(), read.versions[0].value.as_ref());
    }
    let (_, single) = admin.get_in(&volume, b"doc").await.expect("get");
    assert_eq!(single.answered.len(), 1);

    // A write made after both supersedes them.
    admin
        .put_in(&volume, b"doc", Bytes::from_static(b"merged"))
        .await
        .expect("put");
    read_until(&writer2, number, b"doc", "the merge alone", |read| {
        values(read) == vec![Some(Bytes::from_static(b"merged"))]
    })
    .await;

    // Every version stays readable (§6.6's versioning): the greeting overwritten twice, its
    // history read by another client, which fetches an overwritten value it never read.
    for value in ["bonjour", "hallo"] {
        admin
            .put_in(&volume, b"greeting", Bytes::from(value))
            .await
            .expect("put");
    }
    let started = Instant::now();
    let versions = loop {
        let versions = writer2
            .causal_versions("notes", number, b"greeting")
            .await
            .expect("versions");
        if versions.len() == 3 {
            break versions;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never saw the greeting's three versions: {versions:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let standing: Vec<(Option<u64>, bool)> = versions.iter().map(|v| (v.len, v.current)).collect();
    assert_eq!(
        standing,
        vec![(Some(5), true), (Some(7), false), (Some(5), false)],
        "hallo, then bonjour and hello superseded: {versions:?}"
    );
    let bonjour = hex::encode(versions[1].id.0.0);
    let (_, value) = writer2
        .causal_read_version("notes", number, b"greeting", &bonjour[..10])
        .await
        .expect("an overwritten version");
    assert_eq!(value, Some(Bytes::from_static(b"bonjour")));
    // From the command line, as writer2 (the process takes its client directory, so the
    // in-process client steps aside): the list, then the first greeting back.
    drop(writer2);
    let listed = cluster.cli(
        &[
            "get",
            "--client",
            "writer2",
            "--volume",
            "notes",
            "greeting",
            "--versions",
        ],
        b"",
    );
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(
        lines[0].ends_with("  current") && lines[2].ends_with("  superseded"),
        "{listed}"
    );
    let hello = lines[2].split_whitespace().next().expect("an id");
    let got = cluster.cli(
        &[
            "get",
            "--client",
            "writer2",
            "--volume",
            "notes",
            "greeting",
            "--version",
            hello,
        ],
        b"",
    );
    assert_eq!(got.stdout, b"hello", "{got:?}");
    let writer2 = cluster.client("writer2").await;

    // The servers' logs survive their restart: every server ends with the same updates.
    let updates = |statuses: &[(NodeId, _, Result<bulwark_protocol::service::NodeStatus, _>)]| {
        statuses
            .iter()
            .map(|(_, _, status)| {
                status
                    .as_ref()
                    .ok()
                    .and_then(|s| s.causal.first())
                    .map(|c| c.updates)
            })
            .collect::<Vec<_>>()
    };
    let started = Instant::now();
    let before = loop {
        let now = updates(&admin.status().await);
        if now.iter().all(|u| u.is_some() && *u == now[0]) {
            break now;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "servers never agreed: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for id in 0..4 {
        cluster.kill(id);
        cluster.spawn(id, None);
    }
    cluster.wait_up(&[0, 1, 2, 3]).await;
    assert_eq!(updates(&admin.status().await), before, "restored whole");

    // With its first server down, a client writes and reads through another.
    cluster.kill(0);
    let written = admin
        .causal_write(
            "notes",
            number,
            b"later",
            Some(Bytes::from_static(b"still here")),
        )
        .await
        .expect("write")
        .acknowledged_by;
    assert!(
        matches!(written, Some(node) if node != NodeId(0)),
        "{written:?}"
    );
    read_until(
        &writer2,
        number,
        b"later",
        "the write past node 0",
        |read| values(read) == vec![Some(Bytes::from_static(b"still here"))],
    )
    .await;
    admin.delete_in(&volume, b"later").await.expect("delete");
    let read = admin
        .causal_read("notes", number, b"later")
        .await
        .expect("read");
    assert_eq!(read.newest(), None, "deleted");
    let (keys, _) = admin
        .causal_list("notes", number, b"", None, 100)
        .await
        .expect("list");
    let keys: Vec<&[u8]> = keys.iter().map(|(key, _)| key.as_bytes()).collect();
    assert_eq!(keys, vec![&b"doc"[..], b"greeting"]);

    // A write admin learns of without its value: a listing brings updates, not values.
    writer2
        .causal_write(
            "notes",
            number,
            b"hoarded",
            Some(Bytes::from_static(b"kept by its writer")),
        )
        .await
        .expect("write");
    let started = Instant::now();
    loop {
        let (keys, _) = admin
            .causal_list("notes", number, b"hoarded", None, 10)
            .await
            .expect("list");
        if keys.iter().any(|(key, _)| key.as_bytes() == b"hoarded") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "admin never learned of writer2's write"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every server stopped: each client writes into its own log, and two clients exchange
    // directly, one serving its log to the other (`volume serve`, `volume sync`).
    for id in 0..4 {
        cluster.kill(id);
    }
    let mut admin = admin;
    let mut writer2 = writer2;
    admin.deadline = Duration::from_millis(300);
    writer2.deadline = Duration::from_millis(300);
    let offline = admin
        .causal_write(
            "notes",
            number,
            b"offline/a",
            Some(Bytes::from_static(b"a")),
        )
        .await
        .expect("a write with no server up");
    assert_eq!(offline.acknowledged_by, None);
    writer2
        .causal_write(
            "notes",
            number,
            b"offline/b",
            Some(Bytes::from_static(b"b")),
        )
        .await
        .expect("a write with no server up");
    let admin = std::sync::Arc::new(admin);
    let writer2 = std::sync::Arc::new(writer2);
    let (address, stop, serving) = serve_log(&cluster, &writer2, "writer2", number).await;
    // No server gives the value: the read falls back to its writer, once admin knows where
    // writer2 serves (Depot §5.7).
    let read = admin
        .causal_read("notes", number, b"hoarded")
        .await
        .expect("read");
    assert_eq!(
        (read.newest(), read.unavailable),
        (None, 1),
        "no server answered and the writer's address is unknown: {read:?}"
    );
    admin.add_causal_peer("writer2", address);
    let read = admin
        .causal_read("notes", number, b"hoarded")
        .await
        .expect("read");
    assert_eq!(
        read.newest().map(|v| &v[..]),
        Some(&b"kept by its writer"[..]),
        "{read:?}"
    );
    assert_eq!(read.answered_by_clients, vec!["writer2".to_string()]);
    assert!(read.answered.is_empty(), "no server answered");

    // The read's exchange already brought writer2's other updates to admin, and admin's to
    // writer2 without their values (clients take values when they read them); the sync
    // exchanges the rest, and writer2 takes admin's value from admin itself.
    admin
        .sync_causal_with_client("notes", number, "writer2", address)
        .await
        .expect("sync with writer2");
    let (admin_address, admin_stop, admin_serving) =
        serve_log(&cluster, &admin, "admin", number).await;
    writer2.add_causal_peer("admin", admin_address);
    for (client, key, value) in [
        (&*admin, &b"offline/b"[..], &b"b"[..]),
        (&*writer2, b"offline/a", b"a"),
    ] {
        let read = client
            .causal_read("notes", number, key)
            .await
            .expect("read");
        assert_eq!(read.newest().map(|v| &v[..]), Some(value), "{read:?}");
        assert!(read.answered.is_empty(), "no server answered");
    }
    for (stop, serving) in [(stop, serving), (admin_stop, admin_serving)] {
        let _ = stop.send(());
        serving.await.expect("join").expect("served");
    }
}

/// Starts `client` (named `name`) serving its log of the volume to the other clients, as `bulwark
/// volume serve` does: where it listens, the sender that stops it, and its task.
async fn serve_log(
    cluster: &TestCluster,
    client: &std::sync::Arc<Client>,
    name: &str,
    volume: VolumeId,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), bulwark_client::ClientError>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let address = listener.local_addr().expect("address");
    let dir = cluster.path().join(format!("client-{name}"));
    let identity = bulwark_transport::Identity::from_pem(
        &std::fs::read_to_string(dir.join("tls.crt")).expect("cert"),
        &std::fs::read_to_string(dir.join("tls.key")).expect("key"),
    )
    .expect("identity");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let client = client.clone();
    let serving = tokio::spawn(async move {
        client
            .serve_causal_peers("notes", volume, listener, &identity, async {
                let _ = stopped.await;
            })
            .await
    });
    (address, stop, serving)
}

/// Each client's own keys in the Byzantine test, and what it writes there.
fn own(client: &str, i: u32) -> (Vec<u8>, Bytes) {
    (
        format!("{client}/{i}").into_bytes(),
        Bytes::from(format!("{client} wrote {i}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_of_four_servers_lying_correct_clients_converge_and_prove_the_fork() {
    let mut cluster = TestCluster::start_nodes("powerstore", 1, 4, 10_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    // Replaced before the volume exists: the forking node signs its branches for the volume it
    // is asked to open. Their registers stay honest, so the system volume works.
    cluster.spawn_byzantine(1, &["--causal", "fork"]);
    cluster.spawn_byzantine(2, &["--causal", "withhold"]);
    cluster.spawn_byzantine(3, &["--causal", "tamper"]);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let writer2 = cluster.client("writer2").await;
    let (volume, _) = admin
        .create_causal_volume("notes", &[])
        .await
        .expect("create the volume");
    let bulwark_client::Serving::Causal { volume: number } = volume.serving else {
        panic!("not causal: {volume:?}");
    };
    let found = writer2.volume("notes").await.expect("writer2 finds it");
    assert_eq!(found, volume);

    // admin's first server is the correct one, writer2's the forking one: both write.
    for i in 0..4 {
        for (client, name) in [(&admin, "admin"), (&writer2, "writer2")] {
            let (key, value) = own(name, i);
            let written = client
                .causal_write("notes", number, &key, Some(value))
                .await
                .expect("write");
            assert!(
                matches!(written.acknowledged_by, Some(NodeId(0 | 1))),
                "only the correct and the forking server acknowledge: {written:?}"
            );
        }
    }
    // A write acknowledged only by the forker reaches the correct server when its writer next
    // exchanges with it (the forker's own gossip may be refused by then: node 0 evicts it once
    // it holds the proof). Each client's next operations go round the servers it trusts.
    for client in [&admin, &writer2] {
        for _ in 0..4 {
            client
                .causal_list("notes", number, b"", None, 0)
                .await
                .expect("an exchange");
        }
    }
    // Each reads the other's writes, through the one correct server.
    for (reader, other) in [(&admin, "writer2"), (&writer2, "admin")] {
        for i in 0..4 {
            let (key, value) = own(other, i);
            read_until(reader, number, &key, "the other client's write", |read| {
                values(read) == vec![Some(value.clone())]
            })
            .await;
        }
    }
    // Both hold proof that node 1 forked, and neither reads what it signed.
    for client in [&admin, &writer2] {
        let read = read_until(
            client,
            number,
            b"admin/0",
            "the proof of node 1's fork",
            |read| read.forked == vec!["node 1".to_string()],
        )
        .await;
        assert_eq!(read.versions.len(), 1);
        let forged = client
            .causal_read("notes", number, b"forged")
            .await
            .expect("read");
        assert!(
            forged.versions.is_empty(),
            "a server's own writes are never read"
        );
    }
    // The correct server holds the proof too, and evicts the forker: its gossip is refused.
    let started = Instant::now();
    loop {
        let statuses = admin.status().await;
        let correct = statuses[0].2.as_ref().ok();
        let proven = correct
            .and_then(|s| s.causal.first())
            .is_some_and(|volume| volume.forks == vec![1]);
        let evicted = correct.is_some_and(|s| {
            s.rejected
                .iter()
                .any(|r| r.peer == NodeId(1).to_string() && r.reason.contains("evicted"))
        });
        if proven && evicted {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node 0 never proved and evicted the fork: {correct:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Depot's T10: a client that lost its log (a new machine with the old keys) must not fork its
/// own history. It learns its own updates back from the servers before it writes anything, a
/// beacon included, so its next write follows its last one and nobody holds a proof against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_lost_its_log_resumes_without_forking() {
    let cluster = TestCluster::start_nodes("powerstore", 1, 4, 10_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let (volume, _) = admin
        .create_causal_volume("notes", &[])
        .await
        .expect("create the volume");
    let bulwark_client::Serving::Causal { volume: number } = volume.serving else {
        panic!("not causal: {volume:?}");
    };
    {
        let writer2 = cluster.client("writer2").await;
        for i in 0..3 {
            let value = Bytes::from(format!("before {i}"));
            let written = writer2
                .causal_write("notes", number, b"doc", Some(value))
                .await
                .expect("write");
            assert!(written.acknowledged_by.is_some());
        }
    }
    read_until(&admin, number, b"doc", "the last write", |read| {
        values(read) == vec![Some(Bytes::from_static(b"before 2"))]
    })
    .await;
    std::fs::remove_dir_all(cluster.path().join("client-writer2").join("depot"))
        .expect("the client's log is lost");

    let writer2 = cluster.client("writer2").await;
    writer2
        .causal_write("notes", number, b"doc", Some(Bytes::from_static(b"after")))
        .await
        .expect("write");
    let read = read_until(&admin, number, b"doc", "the new write alone", |read| {
        values(read) == vec![Some(Bytes::from_static(b"after"))]
    })
    .await;
    assert!(read.forked.is_empty(), "nobody forked: {:?}", read.forked);
    let read = writer2
        .causal_read("notes", number, b"doc")
        .await
        .expect("read");
    assert_eq!(values(&read), vec![Some(Bytes::from_static(b"after"))]);
    assert!(read.forked.is_empty(), "nobody forked: {:?}", read.forked);
}
