//! Public-key objects across reconfigurations, in real node processes: the configuration service
//! certifies an epoch with members added (`bulwark node join`) or removed, every node enters it
//! and pulls the key ranges it takes over from their old group (Rosebud §4.7), and clients that
//! still hold the old configuration are told of the new one by the replicas, fetch and verify it,
//! and carry on. Nothing acknowledged may be lost, and every history must stay linearizable.

use crate::common;

use bulwark_client::Client;
use bulwark_client::{ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::configuration::Configuration;
use bulwark_core::sign::SecretKey;
use bulwark_protocol::pubkey;
use bulwark_protocol::service::NodeStatus;
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
/// Content-hash objects written once before the reconfiguration and read after it.
const CONTENT_OBJECTS: u64 = 24;
/// Operations per client at most: the load is bounded in count as well as time.
const OPS_PER_CLIENT_MAX: u64 = 5_000;

fn owner(i: u8) -> SecretKey {
    SecretKey::from_seed(&[i.wrapping_add(1); 32])
}

/// Writes the settled objects, each once; returns their values.
async fn write_settled(admin: &Client) -> Vec<Vec<u8>> {
    let settled: Vec<Vec<u8>> = (0..SETTLED).map(|i| value_for(u64::from(i), 1)).collect();
    for i in 0..SETTLED {
        admin
            .put_owned(&owner(i), Some(Bytes::from(settled[i as usize].clone())))
            .await
            .expect("settled write");
    }
    settled
}

/// Load on the busy objects until `stop`: two writers and a reader, each holding the
/// configuration it started with until a replica tells it of a newer one.
async fn start_load(
    cluster: &TestCluster,
    recorder: &Recorder,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
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
    tasks
}

/// The members of `config`.
fn originals_ids(config: &Configuration) -> Vec<NodeId> {
    config.members.iter().map(|m| m.id).collect()
}

/// The public-key replica's figures in a node's status.
fn pubkey_stats(status: &NodeStatus) -> Option<&bulwark_protocol::machine::ReplicaStats> {
    follower_stats(status, "pubkey")
}

/// The counters of `status`'s replica of `service` that follows the configuration.
fn follower_stats<'a>(
    status: &'a NodeStatus,
    service: &str,
) -> Option<&'a bulwark_protocol::machine::ReplicaStats> {
    status
        .replicas
        .iter()
        .find(|r| r.service == service)
        .map(|r| &r.stats)
}

/// Content-hash objects written before a reconfiguration, each with its id: what must read back
/// whole after it.
async fn write_content(admin: &Client) -> Vec<(bulwark_protocol::content::ContentId, Vec<u8>)> {
    let mut written = Vec::new();
    for i in 0..CONTENT_OBJECTS {
        let value = value_for(1_000 + i, 7).repeat(64 + i as usize);
        let (id, _) = admin.put_content(&value).await.expect("content write");
        written.push((id, value));
    }
    written
}

/// Every content-hash object of `written` reads back whole.
async fn assert_content_readable(
    reader: &Client,
    written: &[(bulwark_protocol::content::ContentId, Vec<u8>)],
) {
    for (id, value) in written {
        let (read, _) = reader.get_content(id).await.expect("content read");
        assert_eq!(
            read.as_deref(),
            Some(value.as_slice()),
            "content object {id} after the reconfigurations"
        );
    }
}

/// Waits until every one of `nodes` has entered `epoch` (or a later one: epochs go on ending,
/// with nothing more to move) and finished taking over its key ranges; returns their statuses.
async fn wait_settled(admin: &Client, epoch: u64, nodes: &[NodeId]) -> Vec<NodeStatus> {
    let started = Instant::now();
    loop {
        let statuses = admin.status().await;
        let of_nodes: Vec<NodeStatus> = statuses
            .iter()
            .filter(|(id, _, _)| nodes.contains(id))
            .filter_map(|(_, _, status)| status.as_ref().ok().cloned())
            .collect();
        let settled = of_nodes.len() == nodes.len()
            && of_nodes.iter().all(|status| {
                ["pubkey", "content"].iter().all(|service| {
                    follower_stats(status, service)
                        .is_some_and(|stats| stats.epoch >= epoch && stats.transfers_pending == 0)
                })
            });
        if settled {
            return of_nodes;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "transfers into epoch {epoch} did not finish: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts that every node of `statuses` took over at least the settled objects that `after`
/// places on it and `before` did not (it never held them); returns the keys taken over in all.
fn assert_took_over(statuses: &[NodeStatus], before: &Configuration, after: &Configuration) -> u64 {
    let old_ring = before.ring().expect("ring");
    let new_ring = after.ring().expect("ring");
    let mut moved = 0;
    for status in statuses {
        let id = NodeId(status.node);
        let taken = pubkey_stats(status).map_or(0, |stats| stats.transferred_keys);
        let new_to_it = (0..SETTLED)
            .map(|i| pubkey::object_id(&owner(i).public_key()))
            .filter(|object| {
                new_ring.group_of(object.as_bytes()).contains(id)
                    && !old_ring.group_of(object.as_bytes()).contains(id)
            })
            .count() as u64;
        assert!(
            taken >= new_to_it,
            "node {id} took over {taken} keys, but {new_to_it} settled objects were new to it"
        );
        moved += taken;
    }
    moved
}

/// Waits until every one of `nodes` has dropped at least the settled objects that `before`
/// placed on it and `after` does not (their new groups hold them, spec §4.8); returns the keys
/// dropped in all.
async fn wait_dropped(
    admin: &Client,
    before: &Configuration,
    after: &Configuration,
    nodes: &[NodeId],
) -> u64 {
    let old_ring = before.ring().expect("ring");
    let new_ring = after.ring().expect("ring");
    let moved_away = |id: NodeId| {
        (0..SETTLED)
            .map(|i| pubkey::object_id(&owner(i).public_key()))
            .filter(|object| {
                old_ring.group_of(object.as_bytes()).contains(id)
                    && !new_ring.group_of(object.as_bytes()).contains(id)
            })
            .count() as u64
    };
    let started = Instant::now();
    loop {
        let statuses = admin.status().await;
        let dropped: Vec<(NodeId, u64)> = statuses
            .iter()
            .filter(|(id, _, _)| nodes.contains(id))
            .filter_map(|(id, _, status)| {
                let stats = pubkey_stats(status.as_ref().ok()?)?;
                Some((*id, stats.collected))
            })
            .collect();
        let done = dropped.len() == nodes.len()
            && dropped.iter().all(|(id, count)| *count >= moved_away(*id));
        if done {
            return dropped.iter().map(|(_, count)| count).sum();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "moved keys were not dropped (node, dropped): {dropped:?}, expected at least {:?}",
            nodes
                .iter()
                .map(|id| (*id, moved_away(*id)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads every settled object: each must hold its acknowledged value.
async fn assert_settled_readable(reader: &Client, settled: &[Vec<u8>]) {
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
}

/// Reads every settled object (its acknowledged value) and every busy one (recorded), then
/// checks the whole history; returns how many operations completed after each of `since`.
async fn assert_all_readable(
    reader: &Client,
    settled: &[Vec<u8>],
    recorder: &Recorder,
    since: &[u64],
) -> Vec<usize> {
    assert_settled_readable(reader, settled).await;
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
    let report = recorder.assert_linearizable("public-key objects across reconfigurations");
    let history = recorder.history();
    let ops = history.ops();
    let acknowledged = ops.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let after: Vec<usize> = since
        .iter()
        .map(|since| {
            ops.iter()
                .filter(|op| op.outcome != Outcome::Unknown && op.invoke > *since)
                .count()
        })
        .collect();
    eprintln!(
        "checked {} operations ({acknowledged} acknowledged writes; completed after each \
         reconfiguration: {after:?}) on {} objects",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 20,
        "too few writes completed ({acknowledged})"
    );
    after
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
    let settled = write_settled(&admin).await;
    let content = write_content(&admin).await;

    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = start_load(&cluster, &recorder, &stop).await;
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
    let remaining: Vec<NodeId> = (0..4).map(NodeId).collect();
    let statuses = wait_settled(&admin, next.epoch.0, &remaining).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }
    // A node outside an object's old group never held it: it must have taken it over.
    let moved = assert_took_over(&statuses, &genesis, &next);

    // A node killed and restarted comes back in the new epoch with its transfers done: it
    // recorded both before it answered anything in that epoch.
    cluster.kill(2);
    cluster.spawn(2, None);
    cluster.wait_up(&[2]).await;
    let restarted = admin.status_of(NodeId(2)).await.expect("node 2 answers");
    let stats = pubkey_stats(&restarted).expect("a public-key replica");
    assert!(stats.epoch >= next.epoch.0);
    assert_eq!(stats.transfers_pending, 0);
    assert_eq!(
        stats.transferred_keys, 0,
        "a restart pulls nothing it had finished pulling"
    );

    // The node that left is gone, and one more: what the three left serve, they held or took
    // over. (A fresh client waits for no node that left: after the genesis it asks the newest
    // configuration's members for newer ones.)
    cluster.kill(4);
    cluster.kill(0);
    let reader = cluster.client("reader").await;
    let after = assert_all_readable(&reader, &settled, &recorder, &[reconfigured_at]).await;
    // Content-hash objects too, from the three left: the five groups became one, in another
    // slot order, so every member rebuilt its slot's fragments.
    assert_content_readable(&reader, &content).await;
    eprintln!("{moved} keys transferred");
    assert!(
        after[0] >= 20,
        "the load must go on in the new epoch ({after:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_nodes_grow_to_twelve_through_node_join_and_shrink_back_under_load() {
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        8,
        10_000,
        &["--epoch-ms", "3000", "--stop-tolerance-ms", "500"],
    );
    let originals: Vec<usize> = (0..8).collect();
    cluster.wait_up(&originals).await;
    let admin = cluster.client("admin").await;
    let genesis = admin.configuration().await.expect("configuration");
    let settled = write_settled(&admin).await;
    let content = write_content(&admin).await;

    let recorder = Recorder::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = start_load(&cluster, &recorder, &stop).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Four new nodes, each brought in by `bulwark node join`: keys made, ADD ordered by the
    // administrator, the epoch that adds it awaited, then served from the certified chain.
    let ports: Vec<u16> = (0..4).map(|_| cluster.join()).collect();
    let grown_at = recorder.now();
    let started = Instant::now();
    let grown = loop {
        let config = admin.configuration().await.expect("configuration");
        let joined = ports
            .iter()
            .filter(|port| config.members.iter().any(|m| m.address.port() == **port))
            .count();
        if joined == ports.len() {
            break config;
        }
        if started.elapsed() > Duration::from_secs(60) {
            for port in &ports {
                eprintln!("--- join {port} ---\n{}", cluster.join_log(*port));
            }
            panic!("the joins were not certified: epoch {}", config.epoch.0);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(grown.members.len(), 12);
    let newcomers: Vec<NodeId> = grown
        .members
        .iter()
        .filter(|m| ports.contains(&m.address.port()))
        .map(|m| m.id)
        .collect();
    let everyone: Vec<NodeId> = grown.members.iter().map(|m| m.id).collect();
    let statuses = wait_settled(&admin, grown.epoch.0, &everyone).await;
    // A new node held nothing: every settled object its groups now hold, it took over.
    let joined_statuses: Vec<NodeStatus> = statuses
        .iter()
        .filter(|s| newcomers.contains(&NodeId(s.node)))
        .cloned()
        .collect();
    let moved_in = assert_took_over(&joined_statuses, &genesis, &grown);
    assert!(moved_in > 0, "the new nodes took over nothing");
    // The original nodes drop what moved to the new ones, once those hold it.
    let dropped = wait_dropped(&admin, &genesis, &grown, &originals_ids(&genesis)).await;
    assert!(dropped > 0, "the original nodes dropped nothing");

    // Shrink back: four of the original nodes leave, so what they held moves to the others,
    // the new nodes among them.
    let leaving: Vec<NodeId> = (0..4).map(NodeId).collect();
    let mut epoch = grown.epoch;
    for node in &leaving {
        let (_, outcome) = admin
            .order(ConfigAction::Revoke(*node))
            .await
            .expect("revoke accepted");
        let ConfigOutcome::Accepted { epoch: at, .. } = outcome else {
            panic!("revoke {node}: {outcome:?}");
        };
        epoch = epoch.max(at);
    }
    let shrunk = admin.await_epoch(epoch.0).await.expect("the epoch ends");
    let shrunk_at = recorder.now();
    assert_eq!(shrunk.members.len(), 8, "{:?}", shrunk.members);
    assert!(leaving.iter().all(|node| shrunk.member(*node).is_none()));
    let staying: Vec<NodeId> = shrunk.members.iter().map(|m| m.id).collect();
    let statuses = wait_settled(&admin, shrunk.epoch.0, &staying).await;
    let moved_out = assert_took_over(&statuses, &grown, &shrunk);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }

    // The nodes that left are stopped: everything acknowledged is served by the eight left,
    // four of which were not in the cluster when it was written.
    for node in &leaving {
        cluster.kill(node.0 as usize);
    }
    let reader = cluster.client("reader").await;
    let after = assert_all_readable(&reader, &settled, &recorder, &[grown_at, shrunk_at]).await;
    // Content-hash objects moved with their groups too: their fragments were rebuilt for the
    // slots that changed, on nodes that joined and nodes that stayed.
    assert_content_readable(&reader, &content).await;
    eprintln!(
        "{moved_in} keys moved to the new nodes ({dropped} dropped by the original ones), \
         {moved_out} after the shrink"
    );
    assert!(
        after.iter().all(|completed| *completed >= 20),
        "the load must go on through both reconfigurations ({after:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_revoked_and_the_others_take_its_ranges_from_the_survivors() {
    // Every old group that held node 4 has three survivors: exactly the 2f+1 a pull needs, the
    // puller itself among them where it was an old member too, so it must answer itself.
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
    let settled = write_settled(&admin).await;
    cluster.kill(4);
    let (_, outcome) = admin
        .order(ConfigAction::Revoke(NodeId(4)))
        .await
        .expect("revoke accepted");
    let ConfigOutcome::Accepted { epoch, .. } = outcome else {
        panic!("revoke: {outcome:?}");
    };
    let next = admin.await_epoch(epoch.0).await.expect("the epoch ends");
    let remaining: Vec<NodeId> = (0..4).map(NodeId).collect();
    let statuses = wait_settled(&admin, next.epoch.0, &remaining).await;
    let moved = assert_took_over(&statuses, &genesis, &next);
    assert_settled_readable(&cluster.client("reader").await, &settled).await;
    eprintln!("{moved} keys pulled from the three survivors of each old group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_without_the_authority_key_once_the_administrator_adds_it() {
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        4,
        10_000,
        &["--epoch-ms", "2000", "--stop-tolerance-ms", "300"],
    );
    cluster.wait_up(&[0, 1, 2, 3]).await;
    // The new host has a reader's identity only: it makes its keys and says what to add.
    let port = cluster.join_as("reader");
    let started = Instant::now();
    let (fingerprint, signing_key) = loop {
        let log = cluster.join_log(port);
        let asked = log
            .lines()
            .find_map(|line| line.trim().strip_prefix("bulwark node add "))
            .map(|line| {
                line.split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            });
        if let Some(words) = asked {
            let after = |flag: &str| {
                let at = words.iter().position(|w| w == flag).expect(flag);
                words[at + 1].clone()
            };
            break (after("--fingerprint"), after("--signing-key"));
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node join did not say what to add:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let admin = cluster.client("admin").await;
    let member = bulwark_core::configuration::NewMember {
        trusted_key: None,
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        fingerprint: bulwark_core::config::Fingerprint(
            bulwark_core::config::parse_hex32(&fingerprint).unwrap(),
        ),
        signing_key: signing_key.parse().unwrap(),
    };
    let (_, outcome) = admin
        .order(ConfigAction::Add(member))
        .await
        .expect("add accepted");
    let ConfigOutcome::Accepted { epoch, node } = outcome else {
        panic!("add: {outcome:?}");
    };
    let joined = node.expect("the id it gets");
    let certified = admin.await_epoch(epoch.0).await.expect("certified");
    assert!(certified.member(joined).is_some());
    // It found its id by its certificate and serves as that member.
    let members: Vec<NodeId> = certified.members.iter().map(|m| m.id).collect();
    let statuses = wait_settled(&admin, certified.epoch.0, &members).await;
    assert!(
        statuses.iter().any(|status| NodeId(status.node) == joined),
        "{}",
        cluster.join_log(port)
    );
    assert!(cluster.path().join(format!("node-{}", joined.0)).exists());

    // The administrator's next run starts from the configuration it kept, which names a member
    // `cluster.toml` does not: it reaches that member too.
    let again = cluster.client("admin").await;
    again.configuration().await.expect("configuration");
    let status = again.status_of(joined).await;
    assert!(
        status.is_ok(),
        "the joined node from a kept configuration: {status:?}"
    );
}
