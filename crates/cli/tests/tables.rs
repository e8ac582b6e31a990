//! Hardened tables on real node processes: `bulwark table` against a four-node cluster, and
//! concurrent clients writing and reading cells while a node is SIGKILLed and restarted, every
//! cell's history checked (with one machine's clock, the per-cell guarantee at QUORUM makes each
//! cell a linearizable register), then read again once another node is down too, so the
//! restarted node's cells must have come back from its disk.

use crate::common;

use bulwark_protocol::table::{Consistency, Resolver, RowKey, Schema, Variant};
use bulwark_sim::checker::{OpKind, Outcome};
use common::{BULWARK, Recorder, TestCluster};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn bulwark(cluster: &TestCluster, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BULWARK)
        .args(args)
        .arg("--cluster")
        .arg(cluster.path())
        .output()
        .expect("run bulwark")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A table `name` of `variant` keyed by `key`, with one column, `v`.
fn one_column(name: &str, variant: Variant) -> Schema {
    Schema {
        name: name.into(),
        partition_key: "key".into(),
        clustering: Vec::new(),
        columns: vec!["v".into()],
        variant,
        gc_grace_secs: bulwark_protocol::table::GC_GRACE_DEFAULT_SECS,
        replication: bulwark_protocol::table::Replication::Strong,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_writes_reads_and_deletes_rows_and_refuses_bad_input() {
    let cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let create = bulwark(
        &cluster,
        &["table", "create", "users", "--schema", "id: name,email"],
    );
    assert!(create.status.success(), "{create:?}");
    let put = bulwark(
        &cluster,
        &[
            "table",
            "put",
            "users",
            "ada",
            "name=Ada",
            "email=ada@x.org",
        ],
    );
    assert!(put.status.success(), "{put:?}");
    let get = bulwark(&cluster, &["table", "get", "users", "ada"]);
    assert!(get.status.success(), "{get:?}");
    assert_eq!(text(&get.stdout), "email=ada@x.org\nname=Ada\n");
    let delete = bulwark(
        &cluster,
        &["table", "delete", "users", "ada", "--columns", "email"],
    );
    assert!(delete.status.success(), "{delete:?}");
    let get = bulwark(
        &cluster,
        &["table", "get", "users", "ada", "--consistency", "all"],
    );
    assert_eq!(text(&get.stdout), "name=Ada\n", "{get:?}");
    let get = bulwark(
        &cluster,
        &["table", "get", "users", "ada", "--resolve", "client"],
    );
    assert_eq!(text(&get.stdout), "name=Ada\n", "{get:?}");

    // Scans: every partition in token order, and a clustering range within one partition.
    for key in ["bob", "cyd"] {
        let name = format!("name={key}");
        let put = bulwark(&cluster, &["table", "put", "users", key, &name]);
        assert!(put.status.success(), "{put:?}");
    }
    let scan = bulwark(&cluster, &["table", "scan", "users"]);
    assert!(scan.status.success(), "{scan:?}");
    let mut lines: Vec<String> = text(&scan.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    lines.sort();
    assert_eq!(lines, ["ada name=Ada", "bob name=bob", "cyd name=cyd"]);
    let create = bulwark(
        &cluster,
        &["table", "create", "events", "--schema", "user,at: what"],
    );
    assert!(create.status.success(), "{create:?}");
    for at in ["t1", "t2", "t3", "t4"] {
        let what = format!("what={at}");
        let args = ["table", "put", "events", "u1", &what, "--clustering", at];
        let put = bulwark(&cluster, &args);
        assert!(put.status.success(), "{put:?}");
    }
    let put = bulwark(&cluster, &["table", "put", "events", "u2", "what=x"]);
    assert!(put.status.success(), "{put:?}");
    let args = [
        "table",
        "scan",
        "events",
        "--partition",
        "u1",
        "--from",
        "t2",
        "--to",
        "t4",
    ];
    let range = bulwark(&cluster, &args);
    assert_eq!(
        text(&range.stdout),
        "u1/t2 what=t2\nu1/t3 what=t3\n",
        "{range:?}"
    );
    let limited = bulwark(&cluster, &["table", "scan", "events", "--limit", "2"]);
    assert_eq!(text(&limited.stdout).lines().count(), 2, "{limited:?}");

    // Each refused with its reason, by the nodes themselves or before anything is sent.
    let refusals = [
        (
            vec!["table", "put", "users", "ada", "phone=1"],
            "has no column \"phone\"",
        ),
        (vec!["table", "get", "orders", "o1"], "no table \"orders\""),
        (vec!["table", "scan", "orders"], "no table \"orders\""),
        (
            vec!["table", "scan", "users", "--from", "a"],
            "clustering bounds need a partition",
        ),
        (
            vec![
                "table", "put", "users", "ada", "name=x", "--client", "reader",
            ],
            "not a writer",
        ),
        (
            vec!["table", "create", "users", "--schema", "id: name"],
            "exists with another schema",
        ),
        (
            vec!["table", "create", "t", "--schema", "id: id"],
            "a name appears twice",
        ),
    ];
    for (args, reason) in refusals {
        let out = bulwark(&cluster, &args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            text(&out.stderr).contains(reason),
            "{args:?}: expected {reason:?} in {:?}",
            text(&out.stderr)
        );
    }
    let big = format!("name={}", "x".repeat(70_000));
    let out = bulwark(&cluster, &["table", "put", "users", "ada", &big]);
    assert!(
        text(&out.stderr).contains("out of bounds"),
        "{}",
        text(&out.stderr)
    );
    // The nodes counted what they refused, by client.
    let status = bulwark(&cluster, &["status"]);
    assert!(
        text(&status.stdout).contains("has no column"),
        "{}",
        text(&status.stdout)
    );

    // An eventual table: on 3 of the 4 members, quorums of 2.
    let create = bulwark(
        &cluster,
        &[
            "table",
            "create",
            "logs",
            "--schema",
            "id: line",
            "--consistency",
            "eventual",
        ],
    );
    assert!(create.status.success(), "{create:?}");
    let put = bulwark(&cluster, &["table", "put", "logs", "l1", "line=hello"]);
    assert!(put.status.success(), "{put:?}");
    assert!(
        text(&put.stderr).contains("2 of 3 nodes answered"),
        "{put:?}"
    );
    for consistency in ["one", "quorum", "all"] {
        let args = ["table", "get", "logs", "l1", "--consistency", consistency];
        let get = bulwark(&cluster, &args);
        assert_eq!(text(&get.stdout), "line=hello\n", "{get:?}");
    }

    // Revocation (spec §5.2): writer2's row stays, its new writes are refused, and only the
    // administrator may revoke.
    let as_writer2 = |args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["--client", "writer2"]);
        bulwark(&cluster, &args)
    };
    let put = as_writer2(&["table", "put", "users", "eve", "name=Eve"]);
    assert!(put.status.success(), "{put:?}");
    let refused = as_writer2(&["table", "revoke", "admin"]);
    assert!(
        text(&refused.stderr).contains("no authority key"),
        "{refused:?}"
    );
    let revoke = bulwark(&cluster, &["table", "revoke", "writer2"]);
    assert!(revoke.status.success(), "{revoke:?}");
    let put = as_writer2(&["table", "put", "users", "eve", "name=Mallory"]);
    assert!(!put.status.success(), "{put:?}");
    assert!(text(&put.stderr).contains("is revoked"), "{put:?}");
    let get = bulwark(&cluster, &["table", "get", "users", "eve"]);
    assert_eq!(text(&get.stdout), "name=Eve\n", "{get:?}");
    let put = bulwark(&cluster, &["table", "put", "users", "eve", "name=Eve2"]);
    assert!(put.status.success(), "{put:?}");
    let status = bulwark(&cluster, &["status"]);
    assert!(
        text(&status.stdout).contains("tables: 1 clients revoked"),
        "{}",
        text(&status.stdout)
    );
}

/// The workload's tables: one per signing variant.
const TABLES: [(&str, Variant); 4] = [
    ("verified", Variant::ProxyVerifies),
    ("unverified", Variant::ProxyNoVerify),
    ("halfsym", Variant::HalfSym),
    ("fullsym", Variant::FullSym),
];

/// Concurrent clients on three rows of each of four tables (one per signing variant): three
/// writers and two readers, each operation recorded for the checker, until `stop`. The writers
/// share MAC keys with the nodes; the readers have no signing key, so replicas sign for them.
struct Workload {
    rows: Vec<RowKey>,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u32>>,
}

fn cell_name(row: &RowKey) -> Vec<u8> {
    format!("{}/{}", row.table, text(&row.partition)).into_bytes()
}

impl Workload {
    async fn start(cluster: &TestCluster) -> Workload {
        const OPS_PER_CLIENT_MAX: u64 = 1_500;
        let admin = cluster.client("admin").await;
        for (name, variant) in TABLES {
            let schema = one_column(name, variant);
            admin.create_table(&schema).await.expect("create");
        }
        let rows: Vec<RowKey> = TABLES
            .iter()
            .flat_map(|(table, _)| {
                (0..3).map(move |r| RowKey {
                    table: table.to_string(),
                    partition: format!("row-{r}").into_bytes(),
                    clustering: Vec::new(),
                })
            })
            .collect();
        let recorder = Recorder::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for writer in 0..3u64 {
            let client = cluster
                .client(if writer == 0 { "admin" } else { "writer2" })
                .await;
            let (recorder, rows, stop) = (recorder.clone(), rows.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let (mut sequence, mut retries) = (0, 0);
                while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                    sequence += 1;
                    let row = &rows[((writer + sequence) % rows.len() as u64) as usize];
                    let value = format!("w{writer}-s{sequence}").into_bytes();
                    let invoke = recorder.now();
                    let cells = [("v".to_string(), Some(value.clone()))];
                    let outcome = match client.table_write(row, &cells, Consistency::Quorum).await {
                        Ok(report) => {
                            retries += report.restarts;
                            Outcome::Ok
                        }
                        Err(_) => Outcome::Unknown,
                    };
                    let kind = OpKind::Write(Some(value));
                    recorder.record(writer, &cell_name(row), kind, invoke, outcome);
                }
                retries
            }));
        }
        for reader in 0..2u64 {
            let mut client = cluster.client("reader").await;
            // One reader resolves disagreeing answers itself (spec §3.6), the other leaves it
            // to the proxy.
            if reader == 1 {
                client.table_resolver = Resolver::Client;
            }
            let (recorder, rows, stop) = (recorder.clone(), rows.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let (mut sequence, mut retries) = (0, 0);
                while !stop.load(Ordering::Relaxed) && sequence < OPS_PER_CLIENT_MAX {
                    sequence += 1;
                    let row = &rows[((reader + 2 * sequence) % rows.len() as u64) as usize];
                    let invoke = recorder.now();
                    // Every other read goes through the range path: a page of the row's
                    // partition, resolved by the client from signed pages.
                    let read = if sequence % 2 == 0 {
                        client
                            .table_read(row, &[], Consistency::Quorum)
                            .await
                            .map(|(found, report)| (Some(found), report))
                    } else {
                        let partition = Some(&row.partition[..]);
                        client
                            .table_scan(
                                &row.table,
                                partition,
                                None,
                                None,
                                &[],
                                1,
                                Consistency::Quorum,
                            )
                            .await
                            .map(|(rows, report)| (rows.into_iter().next().map(|(_, r)| r), report))
                    };
                    let outcome = match read {
                        Ok((found, report)) => {
                            retries += report.restarts;
                            let value =
                                found.and_then(|found| found.value("v").map(<[u8]>::to_vec));
                            Outcome::Read(value)
                        }
                        Err(_) => Outcome::Unknown,
                    };
                    recorder.record(100 + reader, &cell_name(row), OpKind::Read, invoke, outcome);
                }
                retries
            }));
        }
        Workload {
            rows,
            recorder,
            stop,
            tasks,
        }
    }

    /// Stops the clients; how many times their operations moved to another proxy.
    async fn stop(&mut self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        let mut retries = 0;
        for task in self.tasks.drain(..) {
            retries += task.await.expect("client task");
        }
        retries
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_survives_a_sigkilled_node_and_every_cell_stays_linearizable() {
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let mut workload = Workload::start(&cluster).await;
    let recorder = workload.recorder.clone();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let killed_at = recorder.now();
    cluster.kill(1);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let restarted_at = recorder.now();
    cluster.spawn(1, None);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    workload.stop().await;
    cluster.wait_up(&[1]).await;

    // With node 3 down too, every quorum needs node 1: what it acknowledged came back from disk.
    cluster.kill(3);
    let client = cluster.client("reader").await;
    for row in &workload.rows {
        let invoke = recorder.now();
        let (found, _) = client
            .table_read(row, &[], Consistency::Quorum)
            .await
            .expect("a read with node 3 down");
        assert!(
            found.value("v").is_some(),
            "an acknowledged write to {row:?} vanished"
        );
        let value = found.value("v").map(<[u8]>::to_vec);
        recorder.record(
            999,
            &cell_name(row),
            OpKind::Read,
            invoke,
            Outcome::Read(value),
        );
    }
    let report = recorder.assert_linearizable("tables");
    let history = recorder.history();
    let ops = history.ops();
    let acknowledged = ops.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let during_outage = ops
        .iter()
        .filter(|op| {
            op.outcome != Outcome::Unknown
                && op.invoke > killed_at
                && op.complete.is_some_and(|c| c < restarted_at)
        })
        .count();
    eprintln!(
        "tables: checked {} operations ({acknowledged} acknowledged writes, {during_outage} completed while node 1 was down) on {} cells",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 60,
        "too few writes completed ({acknowledged})"
    );
    assert!(
        during_outage >= 20,
        "operations must continue while a node is down ({during_outage})"
    );
}

// Seven nodes tolerate two liars: node 5 signs nothing validly and, as proxy, spoils every
// signature it relays (framing correct replicas); node 6 acknowledges writes it never stores
// and, as proxy, relays f+1 valid acknowledgements of a write one correct replica holds
// (spec §2.8 scenario 2). Clients must pass over both and every cell's history stay correct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_a_bad_signer_and_a_lying_coordinator_stays_linearizable() {
    let mut cluster = TestCluster::start(2, 1_000);
    let all: Vec<usize> = (0..7).collect();
    cluster.wait_up(&all).await;
    cluster.spawn_byzantine(5, &["--table", "corrupting"]);
    cluster.spawn_byzantine(6, &["--table", "colluding"]);
    cluster.wait_up(&[5, 6]).await;
    let mut workload = Workload::start(&cluster).await;
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let retries = workload.stop().await;
    let report = workload
        .recorder
        .assert_linearizable("tables with two liars");
    let history = workload.recorder.history();
    let ops = history.ops();
    let acknowledged = ops.iter().filter(|op| op.outcome == Outcome::Ok).count();
    let reads = ops
        .iter()
        .filter(|op| matches!(op.outcome, Outcome::Read(Some(_))))
        .count();
    eprintln!(
        "tables with two liars: checked {} operations ({acknowledged} acknowledged writes, {reads} reads of a value) on {} cells; operations moved to another proxy {retries} times",
        report.ops_checked, report.keys_checked
    );
    assert!(
        acknowledged >= 60,
        "too few writes completed ({acknowledged})"
    );
    assert!(reads >= 60, "too few reads found a value ({reads})");
    assert!(retries > 0, "no operation ever met a lying proxy");
    // The correct proxies counted the signatures of the bad signer they refused.
    let status = text(&bulwark(&cluster, &["status"]).stdout);
    assert!(
        status.contains("signatures of other members refused as proxy"),
        "{status}"
    );
    assert!(
        status.contains("\n  node 5: "),
        "the bad signer is named: {status}"
    );
    assert!(
        !status.contains("\n  node 6: "),
        "the colluder signs validly: {status}"
    );
}

/// Node 3's table cells, by `bulwark status` (position 3 in `cluster.toml`), and the cells it
/// took by anti-entropy.
async fn held_by_node_3(client: &bulwark_client::Client) -> Option<(u64, u64)> {
    let statuses = client.status().await;
    let (_, _, Ok(status)) = statuses.get(3)? else {
        return None;
    };
    let cells = status
        .replicas
        .iter()
        .filter(|replica| replica.service == "table")
        .map(|replica| replica.stats.keys)
        .sum();
    Some((cells, status.server.synced))
}

/// Waits until node 3 holds `cells` table cells; how long that took and how many it took by
/// anti-entropy.
async fn catch_up(client: &bulwark_client::Client, cells: u64) -> (Duration, u64) {
    let back = std::time::Instant::now();
    while back.elapsed() < Duration::from_secs(60) {
        if let Some((held, synced)) = held_by_node_3(client).await
            && held >= cells
        {
            return (back.elapsed(), synced);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("node 3 never caught up on {cells} cells");
}

/// The paper's outage (Fig. 15), scaled down: a node is down while rows are written at QUORUM
/// and comes back (the writes its peers queued for it arrive as Cassandra's hints would); then
/// it loses its disk and comes back empty, and catches up by anti-entropy alone (no read
/// touches the rows), every cell its writer's. Both catch-up times are reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_an_outage_or_a_lost_disk_catches_up() {
    const ROWS: usize = 300;
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let schema = one_column("outage", Variant::ProxyNoVerify);
    admin.create_table(&schema).await.expect("create");
    let row = |i: usize| RowKey {
        table: "outage".into(),
        partition: format!("row-{i:04}").into_bytes(),
        clustering: Vec::new(),
    };
    cluster.kill(3);
    let written_from = std::time::Instant::now();
    for i in 0..ROWS {
        let cells = [("v".to_string(), Some(format!("value-{i}").into_bytes()))];
        admin
            .table_write(&row(i), &cells, Consistency::Quorum)
            .await
            .expect("a write with node 3 down");
    }
    let outage = written_from.elapsed();
    cluster.spawn(3, None);
    cluster.wait_up(&[3]).await;
    let (after_outage, _) = catch_up(&admin, ROWS as u64).await;

    cluster.kill(3);
    // The store is the redb file and the change log beside it.
    for file in ["state.redb", "changes.log"] {
        std::fs::remove_file(cluster.path().join("node-3/data").join(file))
            .expect("node 3's store");
    }
    cluster.spawn(3, None);
    cluster.wait_up(&[3]).await;
    let (after_loss, synced) = catch_up(&admin, ROWS as u64).await;
    eprintln!(
        "outage: {ROWS} rows written in {:.1} s while node 3 was down; back, it held them all \
         {:.1} s later; after losing its disk, {:.1} s later, {synced} cells taken by anti-entropy",
        outage.as_secs_f64(),
        after_outage.as_secs_f64(),
        after_loss.as_secs_f64(),
    );
    assert!(synced >= ROWS as u64, "taken by anti-entropy: {synced}");
    // What it took is what the writer signed: with node 0 down, reads need node 3.
    cluster.kill(0);
    let reader = cluster.client("reader").await;
    for i in (0..ROWS).step_by(37) {
        let (found, _) = reader
            .table_read(&row(i), &[], Consistency::Quorum)
            .await
            .expect("a read with node 0 down");
        assert_eq!(found.value("v"), Some(format!("value-{i}").as_bytes()));
    }
}

/// Six nodes make six overlapping groups: a scan walks each and merges their rows by token,
/// every row once, in token order, however the partitions fell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_over_several_groups_returns_every_row_once_in_token_order() {
    let cluster = TestCluster::start_nodes("powerstore", 1, 6, 1_000);
    cluster.wait_up(&[0, 1, 2, 3, 4, 5]).await;
    let admin = cluster.client("admin").await;
    let schema = one_column("spread", Variant::ProxyVerifies);
    admin.create_table(&schema).await.expect("create");
    let mut keys: Vec<String> = (0..40).map(|i| format!("key-{i:02}")).collect();
    for key in &keys {
        let row = RowKey {
            table: "spread".into(),
            partition: key.clone().into_bytes(),
            clustering: Vec::new(),
        };
        let cells = [("v".to_string(), Some(key.clone().into_bytes()))];
        admin
            .table_write(&row, &cells, Consistency::Quorum)
            .await
            .expect("write");
    }
    keys.sort_by_key(|key| bulwark_core::membership::RingPoint::of_key(key.as_bytes()));
    for limit in [40, 7] {
        let (rows, _) = admin
            .table_scan("spread", None, None, None, &[], limit, Consistency::Quorum)
            .await
            .expect("scan");
        let got: Vec<String> = rows
            .iter()
            .map(|(row, found)| {
                assert_eq!(found.value("v"), Some(&row.partition[..]));
                String::from_utf8(row.partition.clone()).unwrap()
            })
            .collect();
        assert_eq!(got, keys[..limit], "limit {limit}");
    }
}

/// A proxy that serves every operation correctly but holds each answer most of the client's
/// timeout (spec §4.5's stalling proxy) is never silent, so no timeout passes over it: the
/// client notices that its answers come far slower than the others' and asks it last for a
/// while, so only the first operations it serves pay its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalling_proxy_is_asked_last_once_its_answers_come_slow() {
    const STALL_MS: u64 = 400;
    const READS: usize = 40;
    let mut cluster = TestCluster::start(1, 1_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    cluster.spawn_byzantine(3, &["--stall-table-ms", &STALL_MS.to_string()]);
    cluster.wait_up(&[3]).await;
    let admin = cluster.client("admin").await;
    let schema = one_column("stalled", Variant::HalfSym);
    admin.create_table(&schema).await.expect("create");
    let row = RowKey {
        table: "stalled".into(),
        partition: b"k".to_vec(),
        clustering: Vec::new(),
    };
    let cells = [("v".to_string(), Some(b"v".to_vec()))];
    admin
        .table_write(&row, &cells, Consistency::Quorum)
        .await
        .expect("write");
    // Operations spread over the four proxies: a quarter would go to node 3 first.
    let mut stalled = 0;
    for _ in 0..READS {
        let started = std::time::Instant::now();
        let (found, _) = admin
            .table_read(&row, &[], Consistency::Quorum)
            .await
            .expect("read");
        assert_eq!(found.value("v"), Some(&b"v"[..]));
        if started.elapsed() >= Duration::from_millis(STALL_MS) {
            stalled += 1;
        }
    }
    eprintln!("a stalling proxy: {stalled} of {READS} reads waited for it");
    assert!(
        stalled >= 1,
        "node 3 must have stalled an answer at least once"
    );
    assert!(
        stalled <= 3,
        "{stalled} of {READS} reads waited for the stalling proxy: it was not passed over"
    );
}
