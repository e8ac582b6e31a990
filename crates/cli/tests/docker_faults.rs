//! Fault tests against a containerised cluster (issue 5): the production image from
//! `deploy/Dockerfile` on a private Docker network, driven from this host through the ports
//! published on 127.0.0.1, with faults injected through the Docker engine. Each scenario records
//! every client operation and checks the history for linearizability, and prints its operation
//! counts, the faults it injected and the checker's verdict.
//!
//! Without a Docker engine every scenario prints `docker_faults: SKIPPED: no docker engine` and
//! passes; with `BULWARK_REQUIRE_DOCKER=1` it fails instead. The first scenario builds both images
//! from this test build's binaries (with the shared libraries they load), in seconds.

use crate::common;
#[path = "docker_faults/harness.rs"]
mod harness;

use bulwark_core::NodeId;
use bulwark_core::evidence::Evidence;
use bulwark_protocol::depot::UpdateId;
use bulwark_sim::checker::{self, History, Op, OpKind, Outcome};
use bulwark_sim::fjc;
use bytes::Bytes;
use common::value_for;
use harness::DockerCluster;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// No load client runs more operations than this, however long its scenario lasts.
const OPS_PER_CLIENT_MAX: u64 = 5_000;
/// How long a load operation keeps trying before it is recorded as unknown.
const LOAD_DEADLINE: Duration = Duration::from_secs(10);

fn keys(count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|k| format!("key-{k}").into_bytes())
        .collect()
}

/// Concurrent writers and readers over a few keys until stopped, each operation recorded.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    evidence: Arc<Mutex<Vec<Evidence>>>,
}

impl Load {
    async fn start(cluster: &DockerCluster, keys: &[Vec<u8>], writers: u64, readers: u64) -> Load {
        Self::start_on(cluster, keys, None, writers, readers).await
    }

    /// [`Load::start`] on registers (`owners` none) or on the public-key objects of `owners`,
    /// recorded under `keys` (one per owner).
    async fn start_on(
        cluster: &DockerCluster,
        keys: &[Vec<u8>],
        owners: Option<Arc<Vec<bulwark_core::sign::SecretKey>>>,
        writers: u64,
        readers: u64,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let evidence = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let nkeys = keys.len() as u64;
        for writer in 0..writers {
            let name = if writer % 2 == 0 { "admin" } else { "writer2" };
            let client = cluster.client(name, LOAD_DEADLINE).await;
            let (recorder, keys, stop) = (cluster.recorder.clone(), keys.to_vec(), stop.clone());
            let owners = owners.clone();
            tasks.push(tokio::spawn(async move {
                let mut sequence = 0;
                while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                    sequence += 1;
                    let at = ((writer + sequence) % nkeys) as usize;
                    let key = &keys[at];
                    let value = value_for(writer, sequence);
                    let invoke = recorder.now();
                    let written = match &owners {
                        None => client.put(key, Bytes::from(value.clone())).await.map(drop),
                        Some(owners) => client
                            .put_owned(&owners[at], Some(Bytes::from(value.clone())))
                            .await
                            .map(drop),
                    };
                    let outcome = match written {
                        Ok(()) => Outcome::Ok,
                        Err(_) => Outcome::Unknown,
                    };
                    let failed = outcome == Outcome::Unknown;
                    recorder.record(writer, key, OpKind::Write(Some(value)), invoke, outcome);
                    if failed {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }));
        }
        for reader in 0..readers {
            let client = cluster.client("reader", LOAD_DEADLINE).await;
            let (recorder, keys, stop) = (cluster.recorder.clone(), keys.to_vec(), stop.clone());
            let evidence = evidence.clone();
            let owners = owners.clone();
            tasks.push(tokio::spawn(async move {
                let mut sequence = 0;
                while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                    sequence += 1;
                    let at = ((reader + sequence) % nkeys) as usize;
                    let key = &keys[at];
                    let invoke = recorder.now();
                    let read = match &owners {
                        None => client.get(key).await,
                        Some(owners) => client.get_owned(&owners[at].public_key()).await,
                    };
                    let outcome = match read {
                        Ok((value, report)) => {
                            evidence.lock().unwrap().extend(report.evidence);
                            Outcome::Read(value.map(|v| v.to_vec()))
                        }
                        Err(_) => Outcome::Unknown,
                    };
                    let failed = outcome == Outcome::Unknown;
                    recorder.record(100 + reader, key, OpKind::Read, invoke, outcome);
                    if failed {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }));
        }
        Load {
            stop,
            tasks,
            evidence,
        }
    }

    /// Stops every client after its operation in hand; returns the evidence readers reported.
    async fn stop(self) -> Vec<Evidence> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("load client");
        }
        self.evidence.lock().unwrap().clone()
    }
}

/// Operations that completed with an answer entirely inside `[from, to]` (microseconds).
fn answered_between(history: &History, from: u64, to: u64) -> usize {
    history
        .ops()
        .iter()
        .filter(|op| {
            op.outcome != Outcome::Unknown
                && op.invoke >= from
                && op.complete.is_some_and(|c| c <= to)
        })
        .count()
}

fn acknowledged_writes(history: &History) -> usize {
    history
        .ops()
        .iter()
        .filter(|op| op.outcome == Outcome::Ok)
        .count()
}

/// Reads every key once more after the faults, recorded: each must find a value.
async fn final_reads(cluster: &DockerCluster, keys: &[Vec<u8>]) {
    let client = cluster.client("reader", LOAD_DEADLINE).await;
    for key in keys {
        let invoke = cluster.recorder.now();
        let (value, _) = client.get(key).await.expect("final read");
        assert!(value.is_some(), "an acknowledged write to {key:?} vanished");
        cluster.recorder.record(
            999,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(value.map(|v| v.to_vec())),
        );
    }
}

/// Checks the scenario's history, prints its summary line, and fails unless it is linearizable.
fn verdict(cluster: &DockerCluster, notes: &str) {
    let history = cluster.recorder.history();
    let report = checker::check(&history);
    let ops: &[Op] = history.ops();
    let count = |f: &dyn Fn(&Op) -> bool| ops.iter().filter(|op| f(op)).count();
    let writes = count(&|op| matches!(op.kind, OpKind::Write(_)));
    let acknowledged = count(&|op| op.outcome == Outcome::Ok);
    let reads = count(&|op| op.kind == OpKind::Read);
    let answered = count(&|op| matches!(op.outcome, Outcome::Read(_)));
    let verdict = if report.ok {
        format!(
            "linearizable ({} operations on {} keys)",
            report.ops_checked, report.keys_checked
        )
    } else {
        format!(
            "NOT linearizable ({} violations, {} keys inconclusive)",
            report.violations.len(),
            report.inconclusive.len()
        )
    };
    println!(
        "docker_faults[{}]: {} operations: {writes} writes ({acknowledged} acknowledged, {} unknown), \
         {reads} reads ({answered} answered, {} failed); faults: {}; {notes}; checker: {verdict}",
        cluster.scenario,
        ops.len(),
        writes - acknowledged,
        reads - answered,
        if cluster.faults.is_empty() {
            "none".to_string()
        } else {
            cluster.faults.join(", ")
        },
    );
    assert!(
        report.ok,
        "history is not linearizable: {:#?} (inconclusive keys: {:?})",
        report.violations, report.inconclusive
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_node_loses_nothing_acknowledged() {
    let Some(mut cluster) = DockerCluster::start("sigkill", &[]).await else {
        return;
    };
    let keys = keys(3);
    let load = Load::start(&cluster, &keys, 3, 2).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let killed_at = cluster.recorder.now();
    cluster.kill(1).await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let restarted_at = cluster.recorder.now();
    cluster.start_node(1).await;
    cluster.wait_up(&[1]).await;
    cluster.fault("node1 answering");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    load.stop().await;
    final_reads(&cluster, &keys).await;

    // The restarted node reloaded what it had acknowledged from its volume.
    let log = cluster.logs(1);
    let restores: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("state restored"))
        .collect();
    assert_eq!(restores.len(), 2, "node1 started twice: {restores:?}");
    assert!(
        !restores[1].contains("versions=0 "),
        "node1 restarted empty: {}",
        restores[1]
    );
    // With node 3 gone too, every quorum needs the restarted node 1, and reads still return
    // every key's latest value.
    cluster.kill(3).await;
    let client = cluster.client("reader", LOAD_DEADLINE).await;
    for key in &keys {
        let invoke = cluster.recorder.now();
        let (value, report) = client.get(key).await.expect("read with node 3 down");
        assert!(report.answered.contains(&NodeId(1)));
        cluster.recorder.record(
            998,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(value.map(|v| v.to_vec())),
        );
    }

    let history = cluster.recorder.history();
    let acknowledged = acknowledged_writes(&history);
    let during = answered_between(&history, killed_at, restarted_at);
    verdict(
        &cluster,
        &format!(
            "{during} operations answered while node1 was down; node1 restored: {}",
            restores[1]
                .split("state restored")
                .nth(1)
                .unwrap_or_default()
                .trim()
        ),
    );
    assert!(
        acknowledged >= 30,
        "too few writes acknowledged ({acknowledged})"
    );
    assert!(
        during >= 10,
        "reads and writes must go on while a node is down ({during})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_the_network_and_healed() {
    let Some(mut cluster) = DockerCluster::start("cut-off", &[]).await else {
        return;
    };
    let keys = keys(3);
    let load = Load::start(&cluster, &keys, 3, 2).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let cut_at = cluster.recorder.now();
    cluster.disconnect(2).await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let healed_at = cluster.recorder.now();
    cluster.connect(2).await;
    cluster.wait_up(&[2]).await;
    cluster.fault("node2 answering");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    load.stop().await;

    // Healed means usable: with node 0 cut off instead, every quorum needs node 2.
    cluster.disconnect(0).await;
    let writer = cluster.client("admin", LOAD_DEADLINE).await;
    let reader = cluster.client("reader", LOAD_DEADLINE).await;
    for (k, key) in keys.iter().enumerate() {
        let value = value_for(50, k as u64);
        let invoke = cluster.recorder.now();
        let report = writer
            .put(key, Bytes::from(value.clone()))
            .await
            .expect("write needing node 2");
        cluster
            .recorder
            .record(50, key, OpKind::Write(Some(value)), invoke, Outcome::Ok);
        assert!(report.answered.contains(&NodeId(2)));
        let invoke = cluster.recorder.now();
        let (read, report) = reader.get(key).await.expect("read needing node 2");
        assert!(report.answered.contains(&NodeId(2)));
        cluster.recorder.record(
            51,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(read.map(|v| v.to_vec())),
        );
    }
    cluster.connect(0).await;
    cluster.wait_up(&[0]).await;
    final_reads(&cluster, &keys).await;

    let history = cluster.recorder.history();
    let during = answered_between(&history, cut_at, healed_at);
    verdict(
        &cluster,
        &format!(
            "{during} operations answered while node2 was cut off; after healing, 6 operations with node0 cut off needed node2 and got it"
        ),
    );
    assert!(acknowledged_writes(&history) >= 30);
    assert!(
        during >= 10,
        "operations must go on while one node is cut off ({during})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_two_split_stalls_then_completes_after_healing() {
    let Some(mut cluster) = DockerCluster::start("split", &[]).await else {
        return;
    };
    let keys = keys(3);
    let writer = Arc::new(cluster.client("admin", Duration::from_secs(40)).await);
    for (k, key) in keys.iter().enumerate() {
        let value = value_for(0, k as u64);
        let invoke = cluster.recorder.now();
        writer
            .put(key, Bytes::from(value.clone()))
            .await
            .expect("write before the split");
        cluster
            .recorder
            .record(0, key, OpKind::Write(Some(value)), invoke, Outcome::Ok);
    }
    // The client now sees nodes 0 and 1 only: no quorum of n - f = 3.
    cluster.disconnect(2).await;
    cluster.disconnect(3).await;
    let split_at = cluster.recorder.now();

    // Operations with a short deadline fail, naming the nodes they could not reach.
    let impatient = cluster.client("admin", Duration::from_secs(2)).await;
    let mut timed_out = 0;
    for (k, key) in keys.iter().enumerate() {
        let value = value_for(1, k as u64);
        let invoke = cluster.recorder.now();
        let error = impatient
            .put(key, Bytes::from(value.clone()))
            .await
            .expect_err("a write without a quorum must not succeed");
        cluster
            .recorder
            .record(1, key, OpKind::Write(Some(value)), invoke, Outcome::Unknown);
        match error {
            bulwark_client::ClientError::Unavailable { unreachable, .. } => {
                let ids: Vec<NodeId> = unreachable.iter().map(|(id, _)| *id).collect();
                assert!(
                    ids.contains(&NodeId(2)) && ids.contains(&NodeId(3)),
                    "{ids:?}"
                );
            }
            other => panic!("expected unavailability, got {other}"),
        }
        timed_out += 1;
    }
    let invoke = cluster.recorder.now();
    let failed_read = impatient.get(&keys[0]).await;
    assert!(
        failed_read.is_err(),
        "a read without a quorum must not answer"
    );
    cluster
        .recorder
        .record(1, &keys[0], OpKind::Read, invoke, Outcome::Unknown);
    timed_out += 1;

    // Patient operations wait through the split.
    let reader = Arc::new(cluster.client("reader", Duration::from_secs(40)).await);
    let mut waiting = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        let (writer, recorder, key) = (writer.clone(), cluster.recorder.clone(), key.clone());
        waiting.push(tokio::spawn(async move {
            let value = value_for(2, k as u64);
            let invoke = recorder.now();
            let written = writer.put(&key, Bytes::from(value.clone())).await;
            let outcome = if written.is_ok() {
                Outcome::Ok
            } else {
                Outcome::Unknown
            };
            recorder.record(2, &key, OpKind::Write(Some(value)), invoke, outcome);
            written.expect("a patient write completes after healing");
        }));
        let (reader, recorder, key) = (reader.clone(), cluster.recorder.clone(), keys[k].clone());
        waiting.push(tokio::spawn(async move {
            let invoke = recorder.now();
            let (value, _) = reader
                .get(&key)
                .await
                .expect("a patient read completes after healing");
            recorder.record(
                3,
                &key,
                OpKind::Read,
                invoke,
                Outcome::Read(value.map(|v| v.to_vec())),
            );
        }));
    }
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let stalled = waiting.iter().filter(|t| !t.is_finished()).count();
    assert_eq!(
        stalled,
        waiting.len(),
        "an operation completed without a quorum"
    );
    let healed_at = cluster.recorder.now();
    cluster.connect(2).await;
    cluster.connect(3).await;
    for task in waiting {
        task.await.expect("patient operation");
    }
    let completed_at = cluster.recorder.now();
    final_reads(&cluster, &keys).await;

    let history = cluster.recorder.history();
    assert_eq!(
        answered_between(&history, split_at, healed_at),
        0,
        "nothing may complete during the split"
    );
    verdict(
        &cluster,
        &format!(
            "{timed_out} impatient operations timed out naming node2 and node3; the split lasted {:.1}s, and {stalled} patient operations invoked during it all stalled until it healed, then completed within {:.1}s",
            (healed_at - split_at) as f64 / 1e6,
            (completed_at - healed_at) as f64 / 1e6
        ),
    );
}

/// One round of a writer of causal volume `split`: a write and then a read of each key, as the
/// FJC checker takes them, and how many reads saw concurrent versions.
async fn causal_round(
    client: &bulwark_client::Client,
    me: u32,
    number: bulwark_client::causal::VolumeId,
    round: usize,
) -> (Vec<fjc::Op<UpdateId>>, usize) {
    let mut ops = Vec::new();
    let mut concurrent = 0;
    for (k, key) in CAUSAL_KEYS.iter().enumerate() {
        let value = Bytes::from(format!("{me}:{round}:{k}"));
        let written = client
            .causal_write("split", number, key.as_bytes(), Some(value))
            .await
            .expect("a causal write always succeeds");
        ops.push(fjc::Op::Write(written.id));
        let read = client
            .causal_read("split", number, key.as_bytes())
            .await
            .expect("a causal read answers while any server is reachable");
        assert_eq!(
            read.unavailable, 0,
            "every value is held by a correct server"
        );
        if read.versions.len() > 1 {
            concurrent += 1;
        }
        ops.push(fjc::Op::Read {
            key: key.as_bytes().to_vec(),
            returned: read.versions.iter().map(|v| v.id).collect(),
        });
    }
    (ops, concurrent)
}

/// A round of both writers at once, recorded in `history`; the reads that saw concurrent
/// versions.
async fn causal_rounds(
    clients: [(&bulwark_client::Client, u32); 2],
    number: bulwark_client::causal::VolumeId,
    round: usize,
    history: &mut BTreeMap<u32, Vec<fjc::Op<UpdateId>>>,
) -> usize {
    let [(a, a_me), (b, b_me)] = clients;
    let ((a_ops, a_seen), (b_ops, b_seen)) = tokio::join!(
        causal_round(a, a_me, number, round),
        causal_round(b, b_me, number, round)
    );
    history.entry(a_me).or_default().extend(a_ops);
    history.entry(b_me).or_default().extend(b_ops);
    a_seen + b_seen
}

const CAUSAL_KEYS: [&str; 3] = ["a", "b", "c"];

/// Each node's accepted updates and frontier of the causal volume, as its status shows them.
async fn causal_frontiers(
    client: &bulwark_client::Client,
    number: bulwark_client::causal::VolumeId,
) -> Vec<Option<(u64, Vec<(u32, Vec<u64>)>)>> {
    client
        .status()
        .await
        .into_iter()
        .map(|(_, _, status)| {
            let status = status.ok()?;
            let causal = status.causal.into_iter().find(|c| c.volume == number.0)?;
            Some((causal.updates, causal.frontier))
        })
        .collect()
}

/// Waits until every server of the causal volume holds the same updates and frontier (they
/// gossip every second), for at most a minute; returns them.
async fn converge(
    client: &bulwark_client::Client,
    number: bulwark_client::causal::VolumeId,
) -> Vec<Option<(u64, Vec<(u32, Vec<u64>)>)>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let frontiers = causal_frontiers(client, number).await;
        if frontiers.iter().all(Option::is_some) && frontiers.windows(2).all(|w| w[0] == w[1]) {
            return frontiers;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "servers did not converge: {frontiers:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The servers of a causal volume split 2|2 and healed (issue 14): both writers keep writing
/// and reading throughout, every operation answers, the history is fork-join-causal by Depot's
/// Appendix A (`bulwark_sim::fjc`), and once healed every server holds every update. The servers'
/// gossip is cut between the sides; the writers, on the host, reach both and carry updates
/// across as Depot's clients do, so their concurrent writes meet in reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_causal_volume_split_two_two_and_healed_stays_fork_join_causal() {
    let Some(mut cluster) = DockerCluster::start_two_sided("causal-split", &[2, 3]).await else {
        return;
    };
    let admin = cluster.client("admin", Duration::from_secs(10)).await;
    let writer2 = cluster.client("writer2", Duration::from_secs(10)).await;
    let (volume, _) = admin
        .create_causal_volume("split", &[])
        .await
        .expect("create the causal volume");
    let bulwark_client::Serving::Causal { volume: number } = volume.serving else {
        panic!("a causal volume: {:?}", volume.serving);
    };
    let clients = [&admin, &writer2];
    let mut members = Vec::new();
    for client in clients {
        members.push(client.causal_index("split", number).await.expect("member"));
    }
    let pair = [(&admin, members[0]), (&writer2, members[1])];
    let mut history: BTreeMap<u32, Vec<fjc::Op<UpdateId>>> = BTreeMap::new();
    let mut concurrent = causal_rounds(pair, number, 0, &mut history).await;
    let before: usize = history.values().map(Vec::len).sum();

    // Split for several gossip periods, both writers working the whole time.
    cluster.split().await;
    let split_at = cluster.recorder.now();
    let mut round = 1;
    while cluster.recorder.now() - split_at < 5_000_000 && round <= 40 {
        concurrent += causal_rounds(pair, number, round, &mut history).await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let during: usize = history.values().map(Vec::len).sum::<usize>() - before;
    let apart = causal_frontiers(&admin, number).await;
    cluster.heal().await;
    let healed_at = cluster.recorder.now();

    // Gossip every second: every server ends with the same updates and frontier.
    converge(&admin, number).await;
    let converged_in = (cluster.recorder.now() - healed_at) as f64 / 1e6;
    // A last round after healing, and gossip again: both writers read the same versions.
    concurrent += causal_rounds(pair, number, round, &mut history).await;
    let converged = converge(&admin, number).await;
    let mut finals = Vec::new();
    for client in clients {
        let mut heads = Vec::new();
        for key in CAUSAL_KEYS {
            let read = client
                .causal_read("split", number, key.as_bytes())
                .await
                .expect("read after healing");
            heads.push(read.versions.iter().map(|v| v.id).collect::<Vec<_>>());
        }
        finals.push(heads);
    }
    assert_eq!(finals[0], finals[1], "both writers read the same versions");

    let mut execution = fjc::Execution::default();
    for client in clients {
        for update in client
            .causal_updates("split", number)
            .await
            .expect("the client's log")
        {
            execution.updates.insert(
                update.id,
                fjc::Update {
                    node: update.writer,
                    key: update.key.as_bytes().to_vec(),
                    deps: update.named,
                    authorised: update.authorised,
                },
            );
        }
    }
    let ops: usize = history.values().map(Vec::len).sum();
    execution.correct = history;
    let violations = fjc::check(&execution);
    assert!(
        violations.is_empty(),
        "not fork-join-causal: {violations:#?}"
    );
    // The checker is not vacuous on this history: a read that forgets a version is caught.
    let mut forgetful = execution.clone();
    let forgot = forgetful
        .correct
        .values_mut()
        .flat_map(|ops| ops.iter_mut())
        .rev()
        .find_map(|op| match op {
            fjc::Op::Read { returned, .. } => returned.pop_first(),
            fjc::Op::Write(_) => None,
        });
    assert!(forgot.is_some(), "reads returned versions");
    assert!(
        !fjc::check(&forgetful).is_empty(),
        "a read that forgot a version must be caught"
    );
    let updates = converged[0].as_ref().map_or(0, |(updates, _)| *updates);
    println!(
        "docker_faults[causal-split]: {ops} operations by 2 writers ({during} during the split, \
         which lasted {:.1}s), {concurrent} reads returned concurrent versions; servers' updates \
         and frontiers while split {apart:?}; after healing all 4 converged to {updates} updates \
         within {converged_in:.1}s; faults: {:?}; fork-join-causal (Appendix A) on {} updates: \
         no violation",
        (healed_at - split_at) as f64 / 1e6,
        cluster.faults,
        execution.updates.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_continuous_load() {
    let Some(mut cluster) = DockerCluster::start("rolling-restart", &[]).await else {
        return;
    };
    let keys = keys(3);
    let load = Load::start(&cluster, &keys, 3, 2).await;
    let mut windows = Vec::new();
    for id in 0..cluster.n {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let down_at = cluster.recorder.now();
        cluster.stop(id).await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        cluster.start_node(id).await;
        cluster.wait_up(&[id]).await;
        let up_at = cluster.recorder.now();
        windows.push((down_at, up_at));
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    load.stop().await;
    final_reads(&cluster, &keys).await;

    let history = cluster.recorder.history();
    let during: Vec<usize> = windows
        .iter()
        .map(|(from, to)| answered_between(&history, *from, *to))
        .collect();
    for id in 0..cluster.n {
        // SIGTERM stops a node cleanly: its store is closed, and it restarts from it.
        let log = cluster.logs(id);
        assert!(
            log.contains("stopping") && log.contains("SIGTERM") && log.contains("stopped"),
            "node{id} did not stop cleanly:\n{log}"
        );
        assert_eq!(log.matches("state restored").count(), 2, "node{id}");
    }
    verdict(
        &cluster,
        &format!("operations answered while each node restarted: {during:?}"),
    );
    assert!(acknowledged_writes(&history) >= 30);
    assert!(
        during.iter().all(|d| *d >= 3),
        "operations must go on while each node restarts: {during:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byzantine_container_is_outvoted_and_named() {
    let Some(mut cluster) = DockerCluster::start("byzantine", &[(3, "corrupting")]).await else {
        return;
    };
    cluster.fault("node3 started from the test image as a corrupting node");
    assert_eq!(cluster.image_of(3).await, harness::BYZANTINE_IMAGE);
    assert_eq!(cluster.image_of(0).await, harness::NODE_IMAGE);
    production_image_cannot_lie(&cluster);

    let keys = keys(2);
    let load = Load::start(&cluster, &keys, 2, 2).await;
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let mut evidence = load.stop().await;

    // A correct reader returns the latest value, and blames only node 3.
    let writer = cluster.client("admin", LOAD_DEADLINE).await;
    let reader = cluster.client("reader", LOAD_DEADLINE).await;
    for round in 0..8u64 {
        let key = &keys[(round % 2) as usize];
        let value = value_for(60, round);
        let invoke = cluster.recorder.now();
        writer
            .put(key, Bytes::from(value.clone()))
            .await
            .expect("put");
        cluster.recorder.record(
            60,
            key,
            OpKind::Write(Some(value.clone())),
            invoke,
            Outcome::Ok,
        );
        let invoke = cluster.recorder.now();
        let (read, report) = reader.get(key).await.expect("get");
        cluster.recorder.record(
            61,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(read.as_ref().map(|v| v.to_vec())),
        );
        assert_eq!(
            read.as_deref(),
            Some(&value[..]),
            "a correct reader missed the latest value"
        );
        evidence.extend(report.evidence);
    }
    assert!(
        evidence.iter().all(|e| e.node == NodeId(3)),
        "an honest node was blamed: {evidence:?}"
    );
    assert!(
        !evidence.is_empty(),
        "corrupted fragments must be detected and blamed on node3"
    );

    // The command line names the liar too.
    // A lie is provable only when the liar's reply is among the n - f a read uses and it lied in
    // that reply: about one read in six on a quiet machine, fewer when the liar's container is
    // the slowest to answer (a loaded CI machine once went 60 reads without one), so allow many:
    // each is one short process.
    let mut named = None;
    for _ in 0..240 {
        let output = std::process::Command::new(common::BULWARK)
            .args(["get", "key-0", "--cluster"])
            .arg(cluster.path())
            .args(["--client", "reader", "--timeout", "10"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("bulwark get");
        assert!(output.status.success(), "bulwark get failed");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if let Some(line) = stderr.lines().find(|l| l.contains("node 3 misbehaved")) {
            named = Some(line.to_string());
            break;
        }
    }
    let named = named.expect("`bulwark get` names node 3 within 240 reads");
    let status = std::process::Command::new(common::BULWARK)
        .arg("status")
        .arg("--cluster")
        .arg(cluster.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("bulwark status");
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let caught = status
        .lines()
        .find(|l| l.contains("caught"))
        .unwrap_or_else(|| panic!("`bulwark status` names no caught node:\n{status}"))
        .trim()
        .to_string();
    assert!(caught.starts_with("node 3 caught"), "{caught}");

    // A second behaviour in the same slot, from the same volume.
    cluster.replace(3, Some("equivocating")).await;
    cluster.wait_up(&[3]).await;
    for round in 8..14u64 {
        let key = &keys[(round % 2) as usize];
        let value = value_for(60, round);
        let invoke = cluster.recorder.now();
        writer
            .put(key, Bytes::from(value.clone()))
            .await
            .expect("put");
        cluster.recorder.record(
            60,
            key,
            OpKind::Write(Some(value.clone())),
            invoke,
            Outcome::Ok,
        );
        let invoke = cluster.recorder.now();
        let (read, report) = reader.get(key).await.expect("get");
        cluster.recorder.record(
            61,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(read.as_ref().map(|v| v.to_vec())),
        );
        assert_eq!(
            read.as_deref(),
            Some(&value[..]),
            "equivocating: stale read"
        );
        assert!(report.evidence.iter().all(|e| e.node == NodeId(3)));
    }

    let mut kinds: Vec<String> = evidence.iter().map(|e| format!("{:?}", e.kind)).collect();
    kinds.sort();
    kinds.dedup();
    verdict(
        &cluster,
        &format!(
            "{} pieces of evidence, all against node3 ({}); `bulwark get` said: {named:?}; `bulwark status` said: {caught:?}",
            evidence.len(),
            kinds.join(", ")
        ),
    );
}

/// The production image holds the `bulwark` binary, the libraries it loads, and nothing that
/// can lie.
fn production_image_cannot_lie(cluster: &DockerCluster) {
    let name = format!("{}-inspect", cluster.container(0));
    harness::docker_ok(&["create", "--name", &name, harness::NODE_IMAGE]);
    let exported = harness::docker(&["export", &name]);
    let _ = harness::docker(&["rm", &name]);
    let exported = exported.expect("docker export");
    assert!(exported.ok, "docker export: {}", exported.stderr);
    let files = tar_files(&exported.stdout);
    let mut with_content: Vec<&str> = files
        .iter()
        .filter(|(_, size)| *size > 0)
        .map(|(name, _)| name.as_str())
        .collect();
    with_content.sort_unstable();
    // The binary and the C libraries the loader maps for it (none for deploy/up.sh's static one).
    let mut put_in: Vec<&str> = harness::images().iter().map(String::as_str).collect();
    put_in.sort_unstable();
    assert!(put_in.contains(&"bulwark"));
    assert!(put_in.iter().all(|f| *f == "bulwark" || f.contains(".so")));
    assert_eq!(
        with_content, put_in,
        "the production image must hold only the bulwark binary and its libraries: {files:?}"
    );
    assert!(files.iter().all(|(name, _)| !name.contains("byzantine")));
    let refused = harness::docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        harness::NODE_IMAGE,
        "--behaviour",
        "corrupting",
        "node",
    ])
    .expect("docker run");
    assert!(!refused.ok && refused.stderr.contains("unexpected argument"));
}

/// `(name, size)` of every entry of an uncompressed tar stream.
fn tar_files(tar: &[u8]) -> Vec<(String, u64)> {
    let mut files = Vec::new();
    let mut at = 0;
    while at + 512 <= tar.len() {
        let header = &tar[at..at + 512];
        if header.iter().all(|b| *b == 0) {
            break;
        }
        let name_end = header[..100].iter().position(|b| *b == 0).unwrap_or(100);
        let name = String::from_utf8_lossy(&header[..name_end]).into_owned();
        let size_text = String::from_utf8_lossy(&header[124..136]);
        let size = u64::from_str_radix(size_text.trim_matches(|c: char| c == '\0' || c == ' '), 8)
            .unwrap_or(0);
        files.push((name, size));
        at += 512 + (size as usize).div_ceil(512) * 512;
    }
    files
}

/// A recognisable replicated value: `period` repeated to `len` bytes (at most 4 KiB, so every
/// node stores all of it verbatim).
fn pattern(period: &str, len: usize) -> Vec<u8> {
    period.bytes().cycle().take(len).collect()
}

/// Flips one byte in every occurrence of `needle`; returns how many it flipped.
fn flip_all(bytes: &mut [u8], needle: &[u8]) -> usize {
    let mut flipped = 0;
    let mut at = 0;
    while at + needle.len() <= bytes.len() {
        if &bytes[at..at + needle.len()] == needle {
            bytes[at + needle.len() / 2] ^= 0xff;
            flipped += 1;
            at += needle.len();
        } else {
            at += 1;
        }
    }
    flipped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_fragments_on_disk_are_dropped_and_reported() {
    let Some(mut cluster) = DockerCluster::start("disk-corruption", &[]).await else {
        return;
    };
    const ROTTEN: usize = 4;
    const INTACT: usize = 2;
    let victim = 2;
    let writer = cluster.client("admin", LOAD_DEADLINE).await;
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for k in 0..ROTTEN + INTACT {
        let (key, value) = if k < ROTTEN {
            (format!("rot-{k}"), pattern(&format!("ROTTEN-{k}|"), 3_000))
        } else {
            (format!("ok-{k}"), pattern(&format!("intact-{k}|"), 3_000))
        };
        let invoke = cluster.recorder.now();
        writer
            .put(key.as_bytes(), Bytes::from(value.clone()))
            .await
            .expect("put");
        cluster.recorder.record(
            0,
            key.as_bytes(),
            OpKind::Write(Some(value.clone())),
            invoke,
            Outcome::Ok,
        );
        expected.push((key.into_bytes(), value));
    }
    // Every node stores every STORE it is sent; wait until the victim holds all of them.
    let started = std::time::Instant::now();
    loop {
        let status = writer
            .status_of(NodeId(victim as u32))
            .await
            .expect("status");
        if status.server.versions == (ROTTEN + INTACT) as u64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "node{victim} holds {} versions",
            status.server.versions
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stopped cleanly, then bytes flipped inside the stored fragments of the ROTTEN keys.
    cluster.stop(victim).await;
    let work = cluster.path().join("victim");
    std::fs::create_dir_all(&work).unwrap();
    let saved = work.join("state.redb");
    cluster.copy_out(victim, "/data/state.redb", &saved).await;
    let mut bytes = std::fs::read(&saved).unwrap();
    let mut flips = 0;
    for k in 0..ROTTEN {
        let needle = pattern(&format!("ROTTEN-{k}|"), 64);
        let found = flip_all(&mut bytes, &needle);
        assert!(found > 0, "fragment of rot-{k} not found in the store file");
        flips += found;
    }
    let rotten = work.join("rotten.redb");
    std::fs::write(&rotten, &bytes).unwrap();
    cluster.copy_in(victim, &rotten, "/data/state.redb").await;
    cluster.fault(format!(
        "{flips} bytes flipped in the fragments of {ROTTEN} keys in node{victim}'s store"
    ));
    cluster.start_node(victim).await;
    cluster.wait_up(&[victim]).await;

    // The node dropped exactly the damaged entries, said so, and counts them.
    let status = writer
        .status_of(NodeId(victim as u32))
        .await
        .expect("status");
    assert_eq!(status.server.versions, INTACT as u64, "{status:?}");
    let disk: Vec<_> = status
        .rejected
        .iter()
        .filter(|r| r.peer == "disk")
        .collect();
    assert_eq!(
        disk.iter().map(|r| r.count).sum::<u64>(),
        ROTTEN as u64,
        "{disk:?}"
    );
    assert!(
        disk.iter().all(|r| r.reason.contains("cross-checksum")),
        "{disk:?}"
    );
    let metrics = cluster.metrics_text(victim).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == format!("bulwark_node_corrupt_entries_dropped_total {ROTTEN}")),
        "metrics do not count the dropped entries:\n{metrics}"
    );
    let log = cluster.logs(victim);
    assert_eq!(
        log.matches("stored entry failed verification").count(),
        ROTTEN,
        "{log}"
    );
    let shown = std::process::Command::new(common::BULWARK)
        .args(["status", "--cluster"])
        .arg(cluster.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("bulwark status");
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    let line = shown
        .lines()
        .find(|l| l.contains("from disk"))
        .unwrap_or_else(|| panic!("`bulwark status` does not show the dropped entries:\n{shown}"))
        .trim()
        .to_string();

    // Reads stay correct even where node 2 is needed, and nobody is blamed: node 2 never
    // served the damaged fragments.
    cluster.disconnect(0).await;
    let reader = cluster.client("reader", LOAD_DEADLINE).await;
    for (key, value) in &expected {
        let invoke = cluster.recorder.now();
        let (read, report) = reader.get(key).await.expect("read needing node 2");
        cluster.recorder.record(
            1,
            key,
            OpKind::Read,
            invoke,
            Outcome::Read(read.as_ref().map(|v| v.to_vec())),
        );
        assert_eq!(read.as_deref(), Some(&value[..]));
        assert!(report.answered.contains(&NodeId(victim as u32)));
        assert!(report.evidence.is_empty(), "{:?}", report.evidence);
    }
    // And the node takes new writes of the keys it lost.
    let key = &expected[0].0;
    let value = pattern("rewritten|", 3_000);
    let invoke = cluster.recorder.now();
    let report = writer
        .put(key, Bytes::from(value.clone()))
        .await
        .expect("rewrite");
    cluster
        .recorder
        .record(0, key, OpKind::Write(Some(value)), invoke, Outcome::Ok);
    assert!(report.answered.contains(&NodeId(victim as u32)));
    cluster.connect(0).await;

    // A store file redb cannot open at all stops the node with a clear error.
    cluster.stop(victim).await;
    let good = work.join("good.redb");
    cluster.copy_out(victim, "/data/state.redb", &good).await;
    let mut unreadable = std::fs::read(&good).unwrap();
    unreadable[..64].fill(0);
    let unreadable_path = work.join("unreadable.redb");
    std::fs::write(&unreadable_path, &unreadable).unwrap();
    cluster
        .copy_in(victim, &unreadable_path, "/data/state.redb")
        .await;
    cluster.fault(format!("node{victim}'s store header zeroed"));
    cluster.start_node(victim).await;
    let code = cluster
        .wait_exit(victim, Duration::from_secs(20))
        .await
        .expect("a node with an unreadable store must exit");
    assert_ne!(code, 0);
    let log = cluster.logs(victim);
    let error = log
        .lines()
        .find(|l| l.contains("cannot open the store in /data"))
        .unwrap_or_else(|| panic!("no clear error:\n{log}"))
        .to_string();
    cluster.copy_in(victim, &good, "/data/state.redb").await;
    cluster.fault(format!("node{victim}'s store restored"));
    cluster.start_node(victim).await;
    cluster.wait_up(&[victim]).await;
    final_reads(
        &cluster,
        &expected.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
    )
    .await;

    verdict(
        &cluster,
        &format!(
            "node{victim} dropped {ROTTEN} of {} entries at start-up and kept {INTACT}; status: {line:?}; reads needing node{victim} correct, no evidence; unreadable store: exit code {code}, {error:?}",
            ROTTEN + INTACT
        ),
    );
}

/// A node identity the authority adds; no container runs it.
fn newcomer(seed: u8) -> bulwark_core::configuration::NewMember {
    bulwark_core::configuration::NewMember {
        trusted_key: None,
        address: format!("127.0.0.1:{}", 1000 + u16::from(seed))
            .parse()
            .unwrap(),
        fingerprint: bulwark_core::config::Fingerprint([0xB0 + seed; 32]),
        signing_key: bulwark_core::sign::SecretKey::from_seed(&[0x70 + seed; 32]).public_key(),
    }
}

/// Every node's own certified configurations, once each holds at least `epoch`.
async fn chains_at(
    cluster: &DockerCluster,
    client: &bulwark_client::Client,
    epoch: u64,
) -> Vec<Vec<bulwark_core::configuration::ConfigCert>> {
    let genesis = client.genesis().expect("a configuration service");
    let started = std::time::Instant::now();
    let mut chains = Vec::new();
    for node in 0..cluster.n as u32 {
        loop {
            let mut certs = Vec::new();
            let mut after = genesis.epoch.0;
            while let Ok(page) = client.certificates_from(NodeId(node), after).await {
                if page.is_empty() {
                    break;
                }
                after += page.len() as u64;
                certs.extend(page);
            }
            if after >= epoch {
                bulwark_core::configuration::verify_chain(&genesis, &certs)
                    .unwrap_or_else(|e| panic!("node {node}'s chain: {e}"));
                chains.push(certs);
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "node {node} holds epoch {after}, not {epoch}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    chains
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cs_primary_cut_off_during_reconfiguration() {
    use bulwark_client::{ConfigAction, ConfigOutcome};
    let Some(mut cluster) = DockerCluster::start_with_epochs("cs-cut-off", &[], 5_000).await else {
        return;
    };
    let admin = cluster.client("admin", Duration::from_secs(60)).await;
    let status = admin.status_of(NodeId(0)).await.expect("node 0 answers");
    let primary = status.cs.expect("every node is a CS replica").primary as usize;
    cluster.disconnect(primary).await;

    // With the primary gone, the other three CS replicas change view, order the ADD, end the
    // epoch and certify the next with three signatures.
    let (config, outcome) = admin
        .order(ConfigAction::Add(newcomer(1)))
        .await
        .expect("an ADD while the CS primary is cut off");
    let ConfigOutcome::Accepted { epoch, node } = outcome else {
        panic!("add: {outcome:?}");
    };
    let node = node.expect("the id it gets");
    let joined = admin
        .await_epoch(epoch.0)
        .await
        .expect("the next epoch is certified");
    assert!(joined.member(node).is_some());
    cluster.fault(format!(
        "CS primary node{primary} cut off in epoch {}; ADD ordered and epoch {} certified without it",
        config.epoch.0, joined.epoch.0
    ));

    // The newcomer never runs; with it in the CS as well as the cut-off node, the CS may stall
    // until the network heals, and must then go on.
    let revoke = {
        let admin = cluster.client("admin", Duration::from_secs(90)).await;
        tokio::spawn(async move { admin.order(ConfigAction::Revoke(node)).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.connect(primary).await;
    cluster.wait_up(&[primary]).await;
    let (_, outcome) = revoke
        .await
        .expect("task")
        .expect("the REVOKE completes once healed");
    let ConfigOutcome::Accepted { epoch, .. } = outcome else {
        panic!("revoke: {outcome:?}");
    };
    let left = admin.await_epoch(epoch.0).await.expect("certified");
    assert!(left.member(node).is_none());

    let chains = chains_at(&cluster, &admin, left.epoch.0).await;
    for epoch in 0..(left.epoch.0 - 1) as usize {
        for (other, chain) in chains.iter().enumerate() {
            assert_eq!(
                chain[epoch].bytes,
                chains[0][epoch].bytes,
                "node {other} holds another configuration for epoch {}",
                epoch + 2
            );
        }
    }
    println!(
        "docker_faults[cs-cut-off]: {} epochs certified, identical on all 4 nodes; faults: {}",
        left.epoch.0,
        cluster.faults.join("; ")
    );
}

/// Waits until every one of `members` has entered `epoch` (or later) with its public-key
/// transfers done; returns the keys each took over since it started.
async fn transfers_done(
    client: &bulwark_client::Client,
    epoch: u64,
    members: &[NodeId],
) -> Vec<(NodeId, u64)> {
    let started = std::time::Instant::now();
    loop {
        let statuses = client.status().await;
        let done: Vec<(NodeId, u64)> = members
            .iter()
            .filter_map(|member| {
                let (_, _, status) = statuses.iter().find(|(node, _, _)| node == member)?;
                let stats = &status
                    .as_ref()
                    .ok()?
                    .replicas
                    .iter()
                    .find(|r| r.service == "pubkey")?
                    .stats;
                (stats.epoch >= epoch && stats.transfers_pending == 0)
                    .then_some((*member, stats.transferred_keys))
            })
            .collect();
        if done.len() == members.len() {
            return done;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "transfers into epoch {epoch} did not finish: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_and_another_is_evicted_under_load() {
    const SETTLED: u8 = 16;
    const BUSY: u8 = 3;
    let Some(mut cluster) = DockerCluster::start_configured("join-evict", &[], 6_000, 600).await
    else {
        return;
    };
    let admin = cluster.client("admin", Duration::from_secs(30)).await;
    let genesis = admin.configuration().await.expect("configuration");
    let owners: Vec<bulwark_core::sign::SecretKey> = (0..SETTLED + BUSY)
        .map(|i| bulwark_core::sign::SecretKey::from_seed(&[0x40 + i; 32]))
        .collect();
    let keys: Vec<Vec<u8>> = owners
        .iter()
        .map(|owner| {
            bulwark_protocol::pubkey::object_id(&owner.public_key())
                .as_bytes()
                .to_vec()
        })
        .collect();
    for (i, owner) in owners.iter().enumerate().take(SETTLED as usize) {
        admin
            .put_owned(owner, Some(Bytes::from(value_for(7, i as u64))))
            .await
            .expect("settled write");
    }
    let busy = SETTLED as usize..(SETTLED + BUSY) as usize;
    let load = Load::start_on(
        &cluster,
        &keys[busy.clone()],
        Some(Arc::new(owners[busy].to_vec())),
        2,
        1,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A fifth container joins: certified, it fetches the chain and takes over its key ranges.
    let joined = cluster.join_node().await;
    let grown = admin.configuration().await.expect("configuration");
    assert!(grown.member(joined).is_some());
    let members: Vec<NodeId> = grown.members.iter().map(|m| m.id).collect();
    let taken = transfers_done(&admin, grown.epoch.0, &members).await;
    let old_ring = genesis.ring().expect("ring");
    let new_ring = grown.ring().expect("ring");
    let new_to_it = keys[..SETTLED as usize]
        .iter()
        .filter(|key| {
            new_ring.group_of(key).contains(joined) && !old_ring.group_of(key).contains(joined)
        })
        .count() as u64;
    let by_joined = taken
        .iter()
        .find(|(node, _)| *node == joined)
        .map_or(0, |(_, keys)| *keys);
    assert!(
        by_joined >= new_to_it && new_to_it > 0,
        "{joined} took over {by_joined} keys; {new_to_it} settled objects are new to it"
    );

    // Node 1 goes silent: the CS replicas miss its pings and evict it; its key ranges move.
    cluster.stop(1).await;
    let started = std::time::Instant::now();
    let evicted = loop {
        let config = admin.configuration().await.expect("configuration");
        if config.member(NodeId(1)).is_none() {
            break config;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node 1 is still a member in epoch {}",
            config.epoch.0
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    cluster.fault(format!("node1 evicted in epoch {}", evicted.epoch.0));
    let members: Vec<NodeId> = evicted.members.iter().map(|m| m.id).collect();
    assert!(members.contains(&joined));
    transfers_done(&admin, evicted.epoch.0, &members).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let evidence = load.stop().await;

    // Everything acknowledged is still there, served by a membership that is no longer the
    // genesis one.
    let reader = cluster.client("reader", LOAD_DEADLINE).await;
    for (i, owner) in owners.iter().enumerate() {
        let invoke = cluster.recorder.now();
        let (value, _) = reader
            .get_owned(&owner.public_key())
            .await
            .unwrap_or_else(|error| panic!("object {i}: {error}"));
        if i < SETTLED as usize {
            assert_eq!(
                value.as_deref(),
                Some(value_for(7, i as u64).as_slice()),
                "object {i} lost its acknowledged value"
            );
        } else {
            cluster.recorder.record(
                999,
                &keys[i],
                OpKind::Read,
                invoke,
                Outcome::Read(value.map(|v| v.to_vec())),
            );
        }
    }
    verdict(
        &cluster,
        &format!(
            "{joined} took over {by_joined} keys in epoch {}; epoch {} without node1; evidence: {}",
            grown.epoch.0,
            evicted.epoch.0,
            evidence.len()
        ),
    );
}
