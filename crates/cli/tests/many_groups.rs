//! One cluster, many replica groups and several protocols, on real node processes: a 7-node
//! cluster whose nodes each serve several groups, with concurrent clients on keys of every group
//! and a node SIGKILLed and restarted; and volumes of every protocol, one of them with a single
//! writer, used at the same time. Every history is checked for linearizability per key.

use crate::common;

use bulwark_client::{Client, Volume};
use bulwark_core::NodeId;
use bulwark_core::config::Protocol;
use bulwark_sim::checker::{OpKind, Outcome};
use bytes::Bytes;
use common::{Recorder, TestCluster, value_for};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Writers and readers running until `stop`, each on every key in turn: `(client, volume)` pairs
/// for writers then readers. Each op is recorded under `label/key`, so one checker run covers
/// every volume.
fn workload(
    writers: Vec<(Arc<Client>, Volume, &'static str)>,
    readers: Vec<(Arc<Client>, Volume, &'static str)>,
    keys: Arc<Vec<Vec<u8>>>,
    recorder: &Recorder,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    const OPS_PER_CLIENT_MAX: u64 = 2_000;
    let mut tasks = Vec::new();
    for (writer, (client, volume, label)) in writers.into_iter().enumerate() {
        let (recorder, keys, stop) = (recorder.clone(), keys.clone(), stop.clone());
        let writer = writer as u64;
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let key = &keys[((writer * 7 + sequence) % keys.len() as u64) as usize];
                let value = value_for(writer, sequence);
                let invoke = recorder.now();
                let outcome = match client
                    .put_in(&volume, key, Bytes::from(value.clone()))
                    .await
                {
                    Ok(_) => Outcome::Ok,
                    Err(_) => Outcome::Unknown,
                };
                let name = [label.as_bytes(), b"/", key].concat();
                recorder.record(writer, &name, OpKind::Write(Some(value)), invoke, outcome);
            }
        }));
    }
    for (reader, (client, volume, label)) in readers.into_iter().enumerate() {
        let (recorder, keys, stop) = (recorder.clone(), keys.clone(), stop.clone());
        let reader = 100 + reader as u64;
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let key = &keys[((reader * 3 + sequence) % keys.len() as u64) as usize];
                let invoke = recorder.now();
                let outcome = match client.get_in(&volume, key).await {
                    Ok((value, _)) => Outcome::Read(value.map(|v| v.to_vec())),
                    Err(_) => Outcome::Unknown,
                };
                let name = [label.as_bytes(), b"/", key].concat();
                recorder.record(reader, &name, OpKind::Read, invoke, outcome);
            }
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seven_nodes_serve_many_groups_linearizably_through_a_restart() {
    let mut cluster = TestCluster::start_nodes("powerstore", 1, 7, 1_000);
    let all: Vec<usize> = (0..7).collect();
    cluster.wait_up(&all).await;
    let admin = Arc::new(cluster.client("admin").await);
    let placement = admin.placement().clone();
    let groups = placement.groups();
    assert_eq!(groups.len(), 7, "one group per member on the ring");

    // Two keys in every group.
    let mut by_group: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    for i in 0.. {
        let key = format!("key-{i}").into_bytes();
        let group = placement.group_of(&key).id().0;
        let keys = by_group.entry(group).or_default();
        if keys.len() < 2 {
            keys.push(key);
        }
        if by_group.len() == groups.len() && by_group.values().all(|k| k.len() == 2) {
            break;
        }
    }
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(by_group.values().flatten().cloned().collect());

    // Every node hosts a PoWerStore replica of each of its four groups.
    for (id, _, status) in admin.status().await {
        let status = status.expect("status");
        let hosted: BTreeSet<u32> = status
            .replicas
            .iter()
            .filter(|r| r.service == "powerstore")
            .map(|r| r.group)
            .collect();
        let expected: BTreeSet<u32> = placement.groups_of(id).iter().map(|g| g.id().0).collect();
        assert_eq!(hosted, expected, "{id} hosts its groups");
        assert_eq!(hosted.len(), 4, "{id} serves several groups");
    }

    let default = admin.default_volume();
    let writer2 = Arc::new(cluster.client("writer2").await);
    let reader = Arc::new(cluster.client("reader").await);
    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = workload(
        vec![
            (admin.clone(), default.clone(), "d"),
            (writer2.clone(), default.clone(), "d"),
            (writer2.clone(), default.clone(), "d"),
        ],
        vec![
            (reader.clone(), default.clone(), "d"),
            (reader.clone(), default.clone(), "d"),
        ],
        keys.clone(),
        &recorder,
        &stop,
    );
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.kill(1);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    cluster.spawn(1, None);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }
    cluster.wait_up(&[1]).await;
    let report = recorder.assert_linearizable("7 nodes");
    let acknowledged = recorder
        .history()
        .ops()
        .iter()
        .filter(|op| op.outcome == Outcome::Ok)
        .count();
    eprintln!(
        "7 nodes: checked {} operations ({acknowledged} acknowledged writes) on {} keys",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 60,
        "too few writes completed ({acknowledged})"
    );

    // Node 1 serves every group it is in again, from what it restored: for each of its groups,
    // with another member down, a quorum needs node 1, and the group's keys still read.
    let mine = placement.groups_of(NodeId(1));
    assert_eq!(mine.len(), 4);
    for group in &mine {
        let victim = *group
            .members()
            .iter()
            .find(|m| m.0 != 1)
            .expect("another member");
        cluster.kill(victim.0 as usize);
        for key in &by_group[&group.id().0] {
            let (value, report) = reader.get(key).await.expect("read with a member down");
            assert!(
                value.is_some(),
                "key {key:?} of group {:?} lost",
                group.id()
            );
            assert!(
                report.answered.contains(&NodeId(1)),
                "group {:?} was served without node 1",
                group.id()
            );
        }
        cluster.spawn(victim.0 as usize, None);
        cluster.wait_up(&[victim.0 as usize]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_of_every_protocol_are_served_at_the_same_time() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = Arc::new(cluster.client("admin").await);
    let (crash, _) = admin
        .create_volume("crash", Protocol::Abd)
        .await
        .expect("create an ABD volume");
    let (signed, _) = admin
        .create_volume("signed", Protocol::Phalanx)
        .await
        .expect("create a Phalanx volume");
    let (solo, _) = admin
        .create_sole_writer_volume("solo", admin.id())
        .await
        .expect("create a volume with one writer");
    let default = admin.default_volume();
    assert_eq!(
        default.serving,
        bulwark_client::Serving::Replicated(Protocol::PowerStore)
    );

    // Another client finds the volumes through the system volume.
    let writer2 = Arc::new(cluster.client("writer2").await);
    assert_eq!(writer2.volume("crash").await.expect("found"), crash);
    let reader = Arc::new(cluster.client("reader").await);
    assert_eq!(reader.volume("signed").await.expect("found"), signed);
    assert!(reader.volume("absent").await.is_err());
    assert!(
        admin
            .create_volume("crash", Protocol::PowerStore)
            .await
            .is_err(),
        "a volume keeps its protocol"
    );
    assert_eq!(writer2.volume("solo").await.expect("found"), solo);
    assert!(
        admin
            .create_sole_writer_volume("solo", writer2.id())
            .await
            .is_err(),
        "a volume keeps its writer"
    );
    let refused = writer2
        .put_in(&solo, b"mine", Bytes::from_static(b"no"))
        .await
        .expect_err("only admin writes solo");
    assert!(refused.to_string().contains("only writer"), "{refused}");

    let keys: Arc<Vec<Vec<u8>>> =
        Arc::new((0..3).map(|k| format!("shared-{k}").into_bytes()).collect());
    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = workload(
        vec![
            (admin.clone(), default.clone(), "powerstore"),
            (writer2.clone(), crash.clone(), "abd"),
            (admin.clone(), crash.clone(), "abd"),
            (writer2.clone(), signed.clone(), "phalanx"),
            (admin.clone(), solo.clone(), "solo"),
        ],
        vec![
            (reader.clone(), solo.clone(), "solo"),
            (reader.clone(), default.clone(), "powerstore"),
            (reader.clone(), crash.clone(), "abd"),
            (reader.clone(), signed.clone(), "phalanx"),
        ],
        keys.clone(),
        &recorder,
        &stop,
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }
    let report = recorder.assert_linearizable("four volumes");
    let history = recorder.history();
    for label in ["powerstore", "abd", "phalanx", "solo"] {
        let acknowledged = history
            .ops()
            .iter()
            .filter(|op| op.key.starts_with(label.as_bytes()) && op.outcome == Outcome::Ok)
            .count();
        assert!(
            acknowledged >= 10,
            "{label}: only {acknowledged} writes completed"
        );
    }
    eprintln!(
        "four volumes: checked {} operations on {} keys",
        report.ops_checked, report.keys_checked
    );

    // The same key names, three registers: what one volume holds is not another's.
    admin
        .put_in(&default, b"same", Bytes::from_static(b"in powerstore"))
        .await
        .expect("put");
    admin
        .put_in(&crash, b"same", Bytes::from_static(b"in abd"))
        .await
        .expect("put");
    let (a, _) = reader.get_in(&default, b"same").await.expect("get");
    let (b, _) = reader.get_in(&crash, b"same").await.expect("get");
    let (c, _) = reader.get_in(&signed, b"same").await.expect("get");
    assert_eq!(a.as_deref(), Some(&b"in powerstore"[..]));
    assert_eq!(b.as_deref(), Some(&b"in abd"[..]));
    assert_eq!(c, None);
}
