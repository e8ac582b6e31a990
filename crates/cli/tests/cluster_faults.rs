//! Issue 2's end-to-end tests on real node processes: concurrent clients with a node SIGKILLed and
//! restarted mid-run, Byzantine nodes, a malicious reader, access control and hostile frames.

use crate::common;

use bulwark_core::NodeId;
use bytes::Bytes;
use common::{TestCluster, value_for};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_survive_a_sigkilled_node_and_stay_linearizable() {
    common::survives_a_sigkilled_node("powerstore", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_byzantine_behaviour_is_outvoted() {
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let writer = cluster.client("admin").await;
    let reader = cluster.client("reader").await;
    let behaviours = [
        "silent",
        "equivocating",
        "stale",
        "amnesiac",
        "corrupting",
        "forging",
        "colluding",
    ];
    let mut sequence = 0u64;
    for behaviour in behaviours {
        cluster.spawn(3, Some(behaviour));
        // Status is served by the node shell, so even a silent liar answers it.
        cluster.wait_up(&[3]).await;
        // A liar is caught only when its reply is among the n - f a read uses, and a behaviour may
        // serve an honest prefix first: the corrupting one gets rounds until it is caught.
        let rounds = if behaviour == "corrupting" { 400 } else { 6 };
        let mut caught = false;
        for round in 0..rounds {
            if caught && round >= 6 {
                break;
            }
            let key = format!("byz-{}", round % 2).into_bytes();
            sequence += 1;
            let value = value_for(7, sequence);
            writer
                .put(&key, Bytes::from(value.clone()))
                .await
                .unwrap_or_else(|e| panic!("{behaviour}: put failed: {e}"));
            let (read, report) = reader
                .get(&key)
                .await
                .unwrap_or_else(|e| panic!("{behaviour}: get failed: {e}"));
            assert_eq!(
                read.as_deref(),
                Some(&value[..]),
                "{behaviour}: a correct reader saw a wrong value"
            );
            assert!(
                report.evidence.iter().all(|e| e.node == NodeId(3)),
                "{behaviour}: blamed an honest node: {:?}",
                report.evidence
            );
            caught |= !report.evidence.is_empty();
        }
        if behaviour == "corrupting" {
            assert!(
                caught,
                "corrupted fragments must be detected and blamed on node 3 within {rounds} rounds"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malicious_reader_cannot_disturb_later_reads() {
    use bulwark_protocol::powerstore::{
        Candidate, MacVec, Nonce, OpId, Pid, Request, RequestBody, Timestamp,
    };
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let writer = cluster.client("admin").await;
    let mallory = cluster.client("mallory").await;
    writer
        .put(b"target", Bytes::from_static(b"version one"))
        .await
        .expect("put");
    // Mallory collects the genuine candidate so she can replay it later.
    let mut genuine = None;
    for node in 0..4u32 {
        let request = Request {
            op: OpId(1_000 + u64::from(node)),
            attempt: 0,
            epoch: Default::default(),
            group: Default::default(),
            key: bulwark_core::Key::new(&b"target"[..]).unwrap(),
            body: RequestBody::Collect { fragment: false },
        };
        let response = mallory
            .raw_request(NodeId(node), request, Duration::from_secs(5))
            .await;
        if let Some(response) = response
            && let bulwark_protocol::powerstore::ResponseBody::CollectAck { lc: Some(c), .. } =
                response.body
        {
            genuine = Some(c);
        }
    }
    let genuine = genuine.expect("collected a candidate");
    writer
        .put(b"target", Bytes::from_static(b"version two"))
        .await
        .expect("put");
    let forged = |num: u64, byte: u8| Candidate {
        ts: Timestamp {
            num,
            pid: Pid {
                writer: bulwark_core::ClientId(0),
                seq: 5,
            },
            tag: bulwark_core::Tag([byte; 32]),
        },
        nonce: Nonce([byte; 32]),
        vec: MacVec(vec![bulwark_core::Tag([byte; 32]); 4]),
    };
    let mut bad_tag = genuine.clone();
    bad_tag.ts.num += 1;
    let attacks = vec![genuine.clone(), forged(1 << 40, 1), forged(3, 2), bad_tag];
    let mut op = 2_000;
    for node in 0..4u32 {
        for body in [RequestBody::Filter {
            candidates: attacks.clone(),
        }]
        .into_iter()
        .chain(attacks.iter().map(|c| RequestBody::Repair {
            candidate: c.clone(),
        })) {
            op += 1;
            let request = Request {
                op: OpId(op),
                attempt: 0,
                epoch: Default::default(),
                group: Default::default(),
                key: bulwark_core::Key::new(&b"target"[..]).unwrap(),
                body,
            };
            let _ = mallory
                .raw_request(NodeId(node), request, Duration::from_secs(5))
                .await;
        }
    }
    let reader = cluster.client("reader").await;
    for _ in 0..3 {
        let (value, _) = reader.get(b"target").await.expect("get");
        assert_eq!(
            value.as_deref(),
            Some(&b"version two"[..]),
            "a malicious write-back changed what correct readers see"
        );
    }
    writer
        .put(b"target", Bytes::from_static(b"version three"))
        .await
        .expect("writes still work");
    let (value, _) = reader.get(b"target").await.expect("get");
    assert_eq!(value.as_deref(), Some(&b"version three"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_and_hostile_frames() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    // A reader has no writer keys: refused locally, before anything is sent.
    let reader = cluster.client("reader").await;
    let error = reader
        .put(b"k", Bytes::from_static(b"v"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not a writer"), "{error}");

    // A reader that somehow holds writer keys is still refused by the nodes.
    let dir = cluster.path();
    let stolen = std::fs::read_to_string(dir.join("client-admin/client.toml"))
        .unwrap()
        .replace("name = \"admin\"", "name = \"mallory\"")
        .lines()
        // Its timestamp key, that is: admin's signing key would not match mallory's registered
        // one, and without a signing key it agrees no MAC key with any node.
        .filter(|line| !line.starts_with("signing_key"))
        .map(|line| format!("{line}\n"))
        .collect::<String>();
    std::fs::write(dir.join("client-mallory/client.toml"), stolen).unwrap();
    let mallory = cluster.client("mallory").await;
    let error = mallory
        .put(b"k", Bytes::from_static(b"v"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("not a writer"),
        "a non-writer is refused: {error}"
    );
    // Its library refuses before sending; the nodes refuse too when it sends anyway.
    let clock = bulwark_protocol::powerstore::Request {
        op: bulwark_protocol::powerstore::OpId(9_000),
        attempt: 0,
        epoch: Default::default(),
        group: Default::default(),
        key: bulwark_core::Key::new(&b"k"[..]).unwrap(),
        body: bulwark_protocol::powerstore::RequestBody::Clock,
    };
    let answer = mallory
        .raw_request(NodeId(0), clock, Duration::from_secs(5))
        .await;
    assert!(
        !matches!(
            answer.map(|a| a.body),
            Some(bulwark_protocol::powerstore::ResponseBody::ClockAck { .. })
        ),
        "a node answered a non-writer's CLOCK"
    );

    // Oversized objects are refused before any node sees them.
    let admin = cluster.client("admin").await;
    let error = admin
        .put(
            b"k",
            Bytes::from(vec![0u8; bulwark_core::OBJECT_BYTES_MAX + 1]),
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("limit"), "{error}");

    // Garbage and an oversized frame from an authenticated peer are dropped and counted, and the
    // node keeps serving everyone.
    let config = admin.cluster().clone();
    let identity = bulwark_transport::Identity::from_pem(
        &std::fs::read_to_string(dir.join("client-mallory/tls.crt")).unwrap(),
        &std::fs::read_to_string(dir.join("client-mallory/tls.key")).unwrap(),
    )
    .unwrap();
    let connector = bulwark_transport::Connector::new(&identity).unwrap();
    {
        use futures::SinkExt;
        let mut framed = connector
            .connect(config.nodes[0].address, config.nodes[0].fingerprint)
            .await
            .unwrap();
        framed
            .send(Bytes::from_static(b"\xff\xff\xffnot a frame"))
            .await
            .unwrap();
        framed.send(Bytes::from(vec![7u8; 100])).await.unwrap();
    }
    {
        use tokio::io::AsyncWriteExt;
        let mut framed = connector
            .connect(config.nodes[0].address, config.nodes[0].fingerprint)
            .await
            .unwrap();
        let stream = framed.get_mut();
        let _ = stream.write_all(&(u32::MAX).to_be_bytes()).await;
        let _ = stream.flush().await;
    }
    // A client whose key is not in the configuration cannot even connect.
    let stranger = bulwark_transport::Identity::generate("stranger").unwrap();
    let stranger = bulwark_transport::Connector::new(&stranger).unwrap();
    let refused = stranger
        .connect(config.nodes[0].address, config.nodes[0].fingerprint)
        .await;
    if let Ok(mut framed) = refused {
        use futures::{SinkExt, StreamExt};
        // TLS 1.3 reports a rejected client certificate only on first use.
        let _ = framed.send(Bytes::from_static(b"x")).await;
        assert!(
            !matches!(framed.next().await, Some(Ok(_))),
            "an unknown client got an answer"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    admin
        .put(b"still", Bytes::from_static(b"serving"))
        .await
        .expect("node 0 still serves");
    let statuses = admin.status().await;
    let status = statuses[0].2.as_ref().expect("node 0 up");
    let from_mallory: Vec<_> = status
        .rejected
        .iter()
        .filter(|r| r.peer == "mallory")
        .collect();
    assert!(
        from_mallory.iter().any(|r| r.reason.contains("malformed")),
        "{:?}",
        status.rejected
    );
    assert!(
        from_mallory.iter().any(|r| r.reason.contains("bad frame")),
        "{:?}",
        status.rejected
    );
    assert!(
        from_mallory
            .iter()
            .any(|r| r.reason.contains("not a writer")),
        "{:?}",
        status.rejected
    );
    assert!(
        status
            .rejected
            .iter()
            .any(|r| r.reason.contains("unauthenticated")),
        "{:?}",
        status.rejected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_object_round_trips_and_deletes() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    // The largest value the register takes: its fragments are the largest frames a node accepts.
    let value: Vec<u8> = (0..bulwark_core::OBJECT_BYTES_MAX)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0])
        .collect();
    admin
        .put(b"huge", Bytes::from(value.clone()))
        .await
        .expect("16 MiB put");
    let (read, report) = admin.get(b"huge").await.expect("16 MiB get");
    assert!(
        read.as_deref() == Some(&value[..]),
        "16 MiB object did not read back identically"
    );
    assert!(report.evidence.is_empty());
    admin.delete(b"huge").await.expect("delete");
    assert_eq!(admin.get(b"huge").await.expect("get").0, None);
}

/// What a `bulwark` command printed, run against `cluster` as `client`.
fn bulwark(cluster: &TestCluster, client: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::BULWARK)
        .args(args)
        .arg("--cluster")
        .arg(cluster.path())
        .args(["--client", client, "--timeout", "20"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run bulwark")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_node_that_client_commands_caught() {
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let put = bulwark(&cluster, "admin", &["put", "caught", "-"]);
    assert!(put.status.success(), "{put:?}");
    let clean = bulwark(&cluster, "admin", &["status"]);
    let clean = String::from_utf8_lossy(&clean.stdout).into_owned();
    assert!(
        !clean.contains("caught"),
        "nothing was caught yet:\n{clean}"
    );

    cluster.spawn(3, Some("corrupting"));
    cluster.wait_up(&[3]).await;
    // Each get is a fresh process; the liar is provable only when its reply is used, and the
    // corrupting behaviour serves a seeded honest prefix of up to 400 requests (two per get).
    let mut named = false;
    for _ in 0..500 {
        let get = bulwark(&cluster, "reader", &["get", "caught"]);
        assert!(get.status.success(), "{get:?}");
        if String::from_utf8_lossy(&get.stderr).contains("node 3 misbehaved") {
            named = true;
            break;
        }
    }
    assert!(named, "500 gets never caught the corrupting node");
    let status = bulwark(&cluster, "admin", &["status"]);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let line = status
        .lines()
        .find(|l| l.contains("caught"))
        .unwrap_or_else(|| panic!("status names no caught node:\n{status}"));
    assert!(
        line.contains("node 3 caught") && line.contains("by client reader on key \"caught\""),
        "{line}"
    );
    assert!(
        !status.contains("node 0 caught")
            && !status.contains("node 1 caught")
            && !status.contains("node 2 caught"),
        "{status}"
    );
}

/// A command confirms the configuration with f_cs + 1 CS replicas and is done: a replica that
/// is down is not waited for. (It was: with one node down, every command took the whole 3 s a
/// replica is given to answer, where it takes tens of milliseconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_does_not_wait_for_a_node_that_is_down() {
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    cluster.kill(3);
    for args in [&["put", "down", "-"][..], &["get", "down"][..]] {
        let started = std::time::Instant::now();
        let out = bulwark(&cluster, "admin", args);
        let took = started.elapsed();
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(
            took < std::time::Duration::from_millis(2_900),
            "{args:?} took {took:?}: it waited for the node that is down"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_a_running_nodes_data_directory_says_it_is_in_use() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let second = std::process::Command::new(common::BULWARK)
        .arg("node")
        .arg("--cluster")
        .arg(cluster.path())
        .args(["--id", "0"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run a second node 0");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        stderr.contains("in use by another process") && !stderr.contains("from a copy"),
        "{stderr}"
    );
    // The running node was not disturbed.
    let admin = cluster.client("admin").await;
    admin
        .status_of(NodeId(0))
        .await
        .expect("node 0 still answers");

    // An id the cluster does not have is named as such, with the OS error said once.
    let unknown = std::process::Command::new(common::BULWARK)
        .arg("node")
        .arg("--cluster")
        .arg(cluster.path())
        .args(["--id", "7"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run node 7");
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success());
    assert!(
        stderr.contains("node 7 is not in it") && stderr.matches("os error").count() <= 1,
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_config_show_into_a_closed_pipe_end_quietly() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    for command in [&["status"][..], &["config", "show"]] {
        let mut child = std::process::Command::new(common::BULWARK)
            .args(command)
            .arg("--cluster")
            .arg(cluster.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run");
        // The reader is gone before anything is written, as with `| head -1` after its line.
        drop(child.stdout.take());
        let output = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && !stderr.contains("panicked"),
            "{command:?}: {:?} {stderr}",
            output.status
        );
    }
}

#[test]
fn an_oversized_put_from_standard_input_is_refused_before_dialling() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new(common::BULWARK)
        .args(["put", "big", "--cluster"])
        .arg(dir.path().join("no-cluster-here"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run put");
    let mut stdin = child.stdin.take().expect("stdin");
    // One byte over the limit is all it may read; what it does not read is not an error here.
    let _ = stdin.write_all(&vec![0u8; bulwark_core::OBJECT_BYTES_MAX + 4096]);
    drop(stdin);
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("more than 16.0 MiB") && !stderr.contains("connecting"),
        "{stderr}"
    );
}

#[test]
fn a_command_refused_locally_dials_no_node() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let init = std::process::Command::new(common::BULWARK)
        .args([
            "cluster",
            "init",
            "--base-port",
            "0",
            "--no-metrics",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .expect("cluster init");
    assert!(init.status.success());
    let text = std::fs::read_to_string(dir.path().join("cluster.toml")).unwrap();
    let config = bulwark_core::config::ClusterConfig::parse(&text, "cluster.toml").unwrap();
    // Stand-ins at the nodes' addresses: they count who connects.
    let listeners: Vec<std::net::TcpListener> = config
        .nodes
        .iter()
        .map(|node| {
            let listener = std::net::TcpListener::bind(node.address).expect("bind");
            listener.set_nonblocking(true).unwrap();
            listener
        })
        .collect();
    let mut put = std::process::Command::new(common::BULWARK)
        .args(["put", "k", "--client", "reader", "--cluster"])
        .arg(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run put");
    put.stdin.take().unwrap().write_all(b"v").unwrap();
    let output = put.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("writer"),
        "{stderr}"
    );
    for (node, listener) in config.nodes.iter().zip(&listeners) {
        assert!(
            listener.accept().is_err(),
            "node {} was dialled by a command refused before it sent anything",
            node.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_stops_a_node_with_a_clear_message_or_is_served_around_never_a_panic() {
    use rand::{Rng, SeedableRng};
    const DAMAGES: u64 = 40;
    const DAMAGE_BYTES: usize = 200;
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    // Inline values and erasure-coded ones, some written twice: every record kind a replica keeps.
    for i in 0..40u64 {
        let len = if i % 4 == 0 { 20_000 } else { 100 };
        let key = format!("damage-{}", i % 30);
        admin
            .put(key.as_bytes(), Bytes::from(vec![i as u8; len]))
            .await
            .expect("put");
    }
    cluster.kill(3);
    let data = cluster.path().join("node-3").join("data");
    let file = data.join("state.redb");

    // Records that no longer decode, in every table a PoWerStore replica restores from: each is
    // dropped and counted, and the node serves (a node may always lack a version).
    {
        use bulwark_storage::{StorageOp, Store};
        let store = Store::open(&data).expect("node 3's store");
        let ops: Vec<StorageOp> = store
            .namespaces()
            .expect("namespaces")
            .into_iter()
            .filter(|namespace| namespace.service == bulwark_core::ServiceId::POWERSTORE)
            .flat_map(|namespace| {
                ["hist", "lc"].map(|table| StorageOp::Put {
                    table: namespace.table(table),
                    key: b"rotten".to_vec(),
                    value: Bytes::from_static(&[0xff; 9]),
                })
            })
            .collect();
        assert!(!ops.is_empty(), "node 3 holds PoWerStore state");
        store.apply(&ops).expect("damage records");
    }
    cluster.spawn(3, None);
    cluster.wait_up(&[3]).await;
    let status = admin.status_of(NodeId(3)).await.expect("node 3 serves");
    let dropped: u64 = status
        .rejected
        .iter()
        .filter(|r| r.peer == "disk" && r.reason.contains("does not decode"))
        .map(|r| r.count)
        .sum();
    assert_eq!(dropped, 2, "{:?}", status.rejected);
    cluster.kill(3);
    let pristine = std::fs::read(&file).expect("node 3's store");

    let (mut served, mut refused) = (0, 0);
    for seed in 0..DAMAGES {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut damaged = pristine.clone();
        let at = rng.random_range(0..damaged.len() - DAMAGE_BYTES);
        rng.fill(&mut damaged[at..at + DAMAGE_BYTES]);
        std::fs::write(&file, &damaged).expect("write the damaged store");
        let log = cluster.path().join(format!("damaged-{seed}.log"));
        let mut node = std::process::Command::new(common::BULWARK)
            .arg("node")
            .arg("--cluster")
            .arg(cluster.path())
            .args(["--id", "3"])
            // Its configured metrics port is free between starts, for any other test to take.
            .args(["--metrics", "127.0.0.1:0"])
            .env("BULWARK_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log"))
            .stderr(std::fs::File::create(log.with_extension("err")).expect("log"))
            .spawn()
            .expect("start node 3 on a damaged store");
        let started = std::time::Instant::now();
        let exit = loop {
            if let Some(exit) = node.try_wait().expect("wait") {
                break Some(exit);
            }
            let answered =
                tokio::time::timeout(Duration::from_millis(300), admin.status_of(NodeId(3)));
            if answered.await.is_ok_and(|status| status.is_ok()) {
                break None;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let _ = node.kill();
                panic!(
                    "seed {seed} (200 bytes at {at}): node 3 neither served nor stopped\n{}{}",
                    std::fs::read_to_string(&log).unwrap_or_default(),
                    std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let stderr = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
        match exit {
            None => {
                served += 1;
                let _ = node.kill();
                let _ = node.wait();
            }
            Some(exit) => {
                refused += 1;
                assert!(
                    exit.code() == Some(1) && !stderr.contains("panicked"),
                    "seed {seed} (200 bytes at {at}): {exit}\n{stderr}"
                );
                assert!(
                    stderr.contains(&data.display().to_string()),
                    "seed {seed} (200 bytes at {at}): the message must name the data directory\n{stderr}"
                );
            }
        }
    }
    eprintln!("{served} damaged stores were served around, {refused} refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_node_that_answers_status_but_no_read_as_silent() {
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    // Seed 4: silent from its first request on.
    cluster.spawn_seeded(3, Some("silent"), 4);
    cluster.wait_up(&[3]).await;
    let output = std::process::Command::new(common::BULWARK)
        .arg("status")
        .arg("--cluster")
        .arg(cluster.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run status");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let state = |node: &str| {
        stdout
            .lines()
            .find(|line| line.split_whitespace().next() == Some(node))
            .and_then(|line| line.split_whitespace().nth(2))
            .unwrap_or_default()
            .to_string()
    };
    for node in ["0", "1", "2"] {
        assert_eq!(state(node), "up", "{stdout}");
    }
    assert_eq!(state("3"), "silent", "{stdout}");
    assert!(stdout.contains("answers status, but no read"), "{stdout}");
}
