//! Public-key objects across a reconfiguration, in real node processes: the configuration
//! service certifies an epoch without one member, every node enters it and pulls the key ranges
//! it takes over from their old group (Rosebud §4.7), and clients that still hold the old
//! configuration are told of the new one by the replicas, fetch and verify it, and carry on.
//! Nothing acknowledged may be lost, and every history must stay linearizable.

mod common;

use bulwark_client::{ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::sign::SecretKey;
use bulwark_protocol::pubkey;
use bulwark_sim::checker::{OpKind, Outcome};
use bytes::Bytes;
use common::{Recorder, TestCluster, value_for};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Objects written once before the reconfiguration and checked after it.
const SETTLED: u8 = 24;
/// Objects written and read throughout.
const BUSY: u8 = 3;
/// Operations per client at most: the load is bounded in count as well as time.
const OPS_PER_CLIENT_MAX: u64 = 5_000;

fn owner(i: u8) -> SecretKey {
    SecretKey::from_seed(&[i.wrapping_add(1); 32])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_objects_move_to_their_new_groups_when_a_member_leaves_under_load() {
    // Five nodes at f = 1: five groups of four. Without node 4, one group of the other four.
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        5,
        10_000,
        &["--epoch-ms", "3000", "--stop-tolerance-ms", "500"],
    );
    cluster.wait_up(&[0, 1, 2, 3, 4]).await;
    let admin = cluster.client("admin").await;
    let genesis = admin.configuration().await.expect("configuration");

    let settled: Vec<Vec<u8>> = (0..SETTLED).map(|i| value_for(u64::from(i), 1)).collect();
    for i in 0..SETTLED {
        admin
            .put_owned(&owner(i), Some(Bytes::from(settled[i as usize].clone())))
            .await
            .expect("settled write");
    }

    // Load on a few objects while the membership changes: two writers and a reader, each
    // holding the configuration it started with until a replica tells it of a newer one.
    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for writer in 0..2u64 {
        let client = cluster
            .client(if writer == 0 { "admin" } else { "writer2" })
            .await;
        let (recorder, stop) = (recorder.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let object = SETTLED + ((writer + sequence) % u64::from(BUSY)) as u8;
                let owner = owner(object);
                let value = value_for(writer, sequence);
                let invoke = recorder.now();
                let outcome = match client
                    .put_owned(&owner, Some(Bytes::from(value.clone())))
                    .await
                {
                    Ok(_) => Outcome::Ok,
                    Err(_) => Outcome::Unknown,
                };
                recorder.record(
                    writer,
                    &[object],
                    OpKind::Write(Some(value)),
                    invoke,
                    outcome,
                );
            }
        }));
    }
    {
        let client = cluster.client("reader").await;
        let (recorder, stop) = (recorder.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                sequence += 1;
                let object = SETTLED + (sequence % u64::from(BUSY)) as u8;
                let invoke = recorder.now();
                let outcome = match client.get_owned(&owner(object).public_key()).await {
                    Ok((value, _)) => Outcome::Read(value.map(|v| v.to_vec())),
                    Err(_) => Outcome::Unknown,
                };
                recorder.record(100, &[object], OpKind::Read, invoke, outcome);
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, outcome) = admin
        .order(ConfigAction::Revoke(NodeId(4)))
        .await
        .expect("revoke accepted");
    let ConfigOutcome::Accepted { epoch, .. } = outcome else {
        panic!("revoke: {outcome:?}");
    };
    let next = admin.await_epoch(epoch.0).await.expect("the epoch ends");
    let reconfigured_at = recorder.now();
    assert!(next.member(NodeId(4)).is_none());
    assert!(next.epoch > genesis.epoch);

    // Every remaining node enters the epoch and finishes taking over its key ranges.
    let started = Instant::now();
    loop {
        let statuses = admin.status().await;
        let settled = statuses[..4].iter().all(|(_, _, status)| {
            status.as_ref().is_ok_and(|status| {
                status.replicas.iter().any(|r| {
                    // Epochs go on ending every 3 s, with nothing more to move.
                    r.service == "pubkey"
                        && r.stats.epoch >= next.epoch.0
                        && r.stats.transfers_pending == 0
                })
            })
        });
        if settled {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "transfers did not finish: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }

    // A node outside an object's old group never held it: it must have taken it over.
    let old_ring = genesis.ring().expect("genesis ring");
    let mut moved = 0;
    for (id, _, status) in &admin.status().await[..4] {
        let taken: u64 = status
            .as_ref()
            .expect("status")
            .replicas
            .iter()
            .map(|r| r.stats.transferred_keys)
            .sum();
        let new_to_it = (0..SETTLED)
            .map(|i| pubkey::object_id(&owner(i).public_key()))
            .filter(|object| !old_ring.group_of(object.as_bytes()).contains(*id))
            .count() as u64;
        assert!(
            taken >= new_to_it,
            "node {id} took over {taken} keys, but {new_to_it} settled objects were new to it"
        );
        moved += taken;
    }

    // A node killed and restarted comes back in the new epoch with its transfers done: it
    // recorded both before it answered anything in that epoch.
    cluster.kill(2);
    cluster.spawn(2, None);
    cluster.wait_up(&[2]).await;
    let restarted = admin.status_of(NodeId(2)).await.expect("node 2 answers");
    let pubkey_replica = restarted
        .replicas
        .iter()
        .find(|r| r.service == "pubkey")
        .expect("a public-key replica");
    assert!(pubkey_replica.stats.epoch >= next.epoch.0);
    assert_eq!(pubkey_replica.stats.transfers_pending, 0);
    assert_eq!(
        pubkey_replica.stats.transferred_keys, 0,
        "a restart pulls nothing it had finished pulling"
    );

    // The node that left is gone, and one more: what the three left serve, they held or took
    // over. (A fresh client waits for no node that left: after the genesis it asks the newest
    // configuration's members for newer ones.)
    cluster.kill(4);
    cluster.kill(0);
    let reader = cluster.client("reader").await;
    for i in 0..SETTLED {
        let (value, _) = reader
            .get_owned(&owner(i).public_key())
            .await
            .unwrap_or_else(|error| panic!("object {i}: {error}"));
        assert_eq!(
            value.as_deref(),
            Some(settled[i as usize].as_slice()),
            "object {i} lost its acknowledged value in the move"
        );
    }
    for object in SETTLED..SETTLED + BUSY {
        let invoke = recorder.now();
        let (value, _) = reader
            .get_owned(&owner(object).public_key())
            .await
            .expect("final read");
        recorder.record(
            999,
            &[object],
            OpKind::Read,
            invoke,
            Outcome::Read(value.map(|v| v.to_vec())),
        );
    }

    let report = recorder.assert_linearizable("public-key objects across a reconfiguration");
    let history = recorder.history();
    let ops = history.ops();
    let acknowledged = ops.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let after = ops
        .iter()
        .filter(|op| op.outcome != Outcome::Unknown && op.invoke > reconfigured_at)
        .count();
    eprintln!(
        "checked {} operations ({acknowledged} acknowledged writes, {after} completed after the \
         new epoch was certified) on {} objects; {moved} keys transferred",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 20,
        "too few writes completed ({acknowledged})"
    );
    assert!(
        after >= 20,
        "the load must go on in the new epoch ({after})"
    );
}
