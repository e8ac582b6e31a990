//! The scenarios of spec §5.2 on real replica, proxy and client machines, delivered by a small
//! synchronous driver whose hooks let a test make any replica or proxy lie.

use super::local::{Event, Hook, LocalGroup};
use super::*;
use crate::machine::{OpError, Operation, Progress, Replica};
use crate::round::{EvidenceKind, OpId};
use bulwark_core::sign::{SecretKey, Signature, Signed};
use bulwark_core::{ClientId, Epoch, GroupId, Slot, Time};
use proptest::prelude::*;
use std::sync::Arc;

const NOW: Time = Time(1_700_000_000_000);
const WRITER: ClientId = ClientId(7);

/// The variants that protect something.
const SIGNING: [Variant; 4] = [
    Variant::ProxyVerifies,
    Variant::ProxyNoVerify,
    Variant::HalfSym,
    Variant::FullSym,
];

fn row(key: &str) -> RowKey {
    RowKey {
        table: "users".into(),
        partition: key.as_bytes().to_vec(),
        clustering: Vec::new(),
    }
}

struct Cluster {
    f: usize,
    secrets: Vec<SecretKey>,
    keys: Arc<[PublicKey]>,
    writer: SecretKey,
    writers: Arc<Writers>,
    group: LocalGroup,
    next_op: u64,
    /// The MAC keys the writer shares with each replica, by slot.
    pairs: Arc<[PairKeys]>,
    /// Where reads take the table's GC grace to end (0: nothing is past it).
    grace_line: u64,
    /// Who resolves reads.
    resolver: Resolver,
    /// The authority whose revocations members and readers take.
    authority: SecretKey,
}

impl Cluster {
    /// A group whose replicas take any timestamp up to their clock as fresh, so tests can
    /// name versions 10, 20, ...
    fn new(f: usize, variant: Variant) -> Cluster {
        let settings = Settings {
            fresh_micros: u64::MAX,
            ..Settings::default()
        };
        Cluster::with_settings(f, variant, settings)
    }

    fn with_settings(f: usize, variant: Variant, settings: Settings) -> Cluster {
        Cluster::with_grace(f, variant, settings, GC_GRACE_DEFAULT_SECS)
    }

    /// A group whose table keeps tombstones `gc_grace_secs`.
    fn with_grace(f: usize, variant: Variant, settings: Settings, gc_grace_secs: u64) -> Cluster {
        Cluster::build(f, variant, settings, gc_grace_secs, Replication::Strong)
    }

    /// A group whose table is replicated as `replication` says.
    fn build(
        f: usize,
        variant: Variant,
        settings: Settings,
        gc_grace_secs: u64,
        replication: Replication,
    ) -> Cluster {
        let n = 3 * f + 1;
        let secrets: Vec<SecretKey> = (0..n)
            .map(|i| SecretKey::from_seed(&[i as u8 + 1; 32]))
            .collect();
        let keys: Arc<[PublicKey]> = secrets.iter().map(SecretKey::public_key).collect();
        let writer = SecretKey::from_seed(&[99; 32]);
        let authority = SecretKey::from_seed(&[77; 32]);
        let mut writers = Writers::default();
        writers.insert(WRITER, writer.public_key());
        let writers = Arc::new(writers);
        let mut catalog = Catalog::default();
        catalog
            .add(Schema {
                name: "users".into(),
                partition_key: "id".into(),
                clustering: Vec::new(),
                columns: vec!["a".into(), "b".into(), "c".into()],
                variant,
                gc_grace_secs,
                replication,
            })
            .unwrap();
        let servers = (0..n)
            .map(|i| {
                Server::new(
                    place(i, n, f),
                    secrets[i].clone(),
                    keys.clone(),
                    writers.clone(),
                    catalog.clone(),
                    settings,
                )
                .with_pair_keys(Arc::new(replica_pair_keys(
                    &secrets[i],
                    [(WRITER, writer.public_key())],
                )))
                .with_authority(authority.public_key())
            })
            .collect();
        let pairs = secrets
            .iter()
            .map(|secret| PairKeys::between(&writer, &secret.public_key()))
            .collect();
        Cluster {
            f,
            secrets,
            keys,
            writer,
            writers,
            group: LocalGroup::new(servers, NOW, WRITER),
            next_op: 0,
            pairs,
            grace_line: 0,
            resolver: Resolver::Proxy,
            authority,
        }
    }

    fn n(&self) -> usize {
        self.group.servers.len()
    }

    /// The table's schema, as member 0 holds it.
    fn schema(&self) -> Schema {
        self.group.servers[0]
            .catalog()
            .get("users")
            .unwrap()
            .clone()
    }

    fn cell(&self, key: &str, column: &str, ts: u64, value: Option<&str>) -> SignedCell {
        Cell {
            row: row(key),
            column: column.into(),
            ts,
            writer: WRITER,
            value: value.map(|v| v.as_bytes().to_vec()),
        }
        .sign(&self.writer)
        .unwrap()
    }

    fn write_op(&mut self, cells: Vec<SignedCell>, proxy: usize) -> WriteOp {
        self.next_op += 1;
        WriteOp::new(
            place(0, self.n(), self.f),
            self.keys.clone(),
            OpId(self.next_op),
            cells,
            Consistency::Quorum,
            Slot(proxy as u32),
        )
        .for_table(&self.schema())
        .with_pair_keys(self.pairs.clone())
    }

    fn read_op(&mut self, key: &str, proxy: usize) -> ReadOp {
        self.next_op += 1;
        ReadOp::new(
            place(0, self.n(), self.f),
            self.keys.clone(),
            self.writers.clone(),
            OpId(self.next_op),
            row(key),
            Vec::new(),
            (self.next_op as u128).to_le_bytes(),
            Consistency::Quorum,
            Slot(proxy as u32),
        )
        .for_table(&self.schema())
        .with_pair_keys(self.pairs.clone())
        .with_grace_line(self.grace_line)
        .with_resolver(self.resolver)
        .with_authority(self.authority.public_key())
    }

    fn run<O>(&mut self, op: &mut O, rounds: usize) -> Result<O::Output, OpError>
    where
        O: Operation<Request = Request, Reply = Response>,
    {
        self.group.run(op, rounds)
    }

    fn write(&mut self, cells: Vec<SignedCell>, proxy: usize) -> WriteOutcome {
        let mut op = self.write_op(cells, proxy);
        self.run(&mut op, 50).expect("the write completes")
    }

    fn read(&mut self, key: &str, proxy: usize) -> ReadOutcome {
        let mut op = self.read_op(key, proxy);
        self.run(&mut op, 50).expect("the read completes")
    }
}

fn place(slot: usize, n: usize, f: usize) -> Place {
    Place {
        slot: Slot(slot as u32),
        n,
        f,
        epoch: Epoch(3),
        group: GroupId(5),
    }
}

fn values(outcome: &ReadOutcome) -> Vec<(String, Option<String>)> {
    outcome
        .cells
        .iter()
        .map(|cell| {
            let value = cell
                .value
                .as_ref()
                .map(|v| String::from_utf8_lossy(v).into_owned());
            (cell.column.clone(), value)
        })
        .collect()
}

fn col(column: &str, value: &str) -> (String, Option<String>) {
    (column.to_string(), Some(value.to_string()))
}

/// `slot` answers reads with `cell` in place of what it holds, and signs the answer properly:
/// it vouches for that cell.
fn vouches_for(cluster: &Cluster, slot: Slot, cell: SignedCell) -> Hook {
    let secret = cluster.secrets[slot.index()].clone();
    Box::new(move |event| {
        if let Event::Peer {
            from,
            message: Message::Answer { answered, .. },
            ..
        } = event
            && *from == slot
        {
            let mut answer = answered.answer.peek().unwrap();
            let decoded = cell.peek().unwrap();
            answer.entries = entries_of([(&decoded, &cell)]);
            answered.answer = Signed::sign(&secret, answer).unwrap().to_unverified();
            answered.cells = answered.cells.as_ref().map(|_| vec![cell.clone()]);
        }
        true
    })
}

/// Flips a bit of every signature on what `slot` sends: a replica that always signs badly.
fn signs_badly(slot: Slot) -> Hook {
    fn spoil<T>(signed: &mut Unverified<T>) {
        let mut bytes = signed.signature().0;
        bytes[5] ^= 1;
        *signed = Unverified::new(signed.bytes().clone(), Signature(bytes));
    }
    Box::new(move |event| {
        if let Event::Peer { from, message, .. } = event
            && *from == slot
        {
            match message {
                Message::StoreAck { ack, .. } => spoil(ack),
                Message::Answer { answered, .. } => spoil(&mut answered.answer),
                Message::WriteBackAck { ack, .. } => spoil(ack),
                _ => {}
            }
        }
        true
    })
}

// ---------------------------------------------------------------------------------------------
// Quorum arithmetic (spec §5.2, first scenario)

proptest! {
    #[test]
    fn byzantine_quorums_intersect_in_a_correct_replica_and_stay_live(f in 0usize..=5, extra in 0usize..=5) {
        let n = 3 * f + 1 + extra;
        let q = byzantine_quorum(n, f);
        // Two quorums of q out of n share at least 2q - n replicas.
        prop_assert!(2 * q > n + f, "n={n} f={f} q={q}");
        prop_assert!(q <= n - f, "n={n} f={f} q={q}");
        prop_assert_eq!(judge_quorums(n, f, q, q), Ok(Guarantee::Strong));
    }
}

#[test]
fn majorities_are_not_byzantine_quorums_from_f_2() {
    for f in 0..=5 {
        let n = 3 * f + 1;
        let majority = n / 2 + 1;
        let overlap = 2 * majority - n;
        assert_eq!(overlap > f, f < 2, "f={f}: majorities overlap in {overlap}");
    }
    assert_eq!(
        judge_quorums(7, 2, 4, 4),
        Ok(Guarantee::Eventual),
        "majorities of 7 with f=2 are only eventual"
    );
    assert!(matches!(
        judge_quorums(4, 1, 4, 2),
        Err(QuorumError::NotLive { .. })
    ));
    assert!(matches!(
        judge_quorums(4, 1, 1, 3),
        Err(QuorumError::TooSmall { .. })
    ));
    assert_eq!(judge_quorums(3, 1, 2, 2), Ok(Guarantee::Eventual));
    assert_eq!(Consistency::Quorum.threshold(4, 1), 3);
    assert_eq!(Consistency::Quorum.threshold(7, 2), 5);
    assert_eq!(Consistency::One.threshold(7, 2), 3);
}

// ---------------------------------------------------------------------------------------------
// Happy path and merges

#[test]
fn every_variant_writes_and_reads_back_on_the_fast_path() {
    for variant in SIGNING {
        let mut cluster = Cluster::new(1, variant);
        let cells = vec![
            cluster.cell("k", "a", 10, Some("alpha")),
            cluster.cell("k", "b", 10, Some("beta")),
        ];
        let written = cluster.write(cells, 1);
        assert!(written.acks.len() >= 3, "{variant:?}: a quorum of acks");
        assert_eq!(written.proxies, 1);
        let read = cluster.read("k", 2);
        assert_eq!(read.path, ReadPath::Fast, "{variant:?}");
        assert_eq!(values(&read), vec![col("a", "alpha"), col("b", "beta")]);
        let missing = cluster.read("nobody", 0);
        assert!(
            missing.cells.is_empty(),
            "an empty answer is signed and counts"
        );
    }
}

#[test]
fn cells_written_on_different_replicas_merge_per_column() {
    // One replica set holds a new A and a stale B, the other the reverse (spec §2.11).
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    let (a_old, a_new) = (
        cluster.cell("k", "a", 10, Some("a-old")),
        cluster.cell("k", "a", 20, Some("a-new")),
    );
    let (b_old, b_new) = (
        cluster.cell("k", "b", 10, Some("b-old")),
        cluster.cell("k", "b", 20, Some("b-new")),
    );
    for (i, server) in cluster.group.servers.iter_mut().enumerate() {
        let (a, b) = if i < 2 {
            (&a_new, &b_old)
        } else {
            (&a_old, &b_new)
        };
        server.restore(a.clone());
        server.restore(b.clone());
    }
    let read = cluster.read("k", 0);
    assert!(matches!(read.path, ReadPath::Resolved { .. }));
    assert_eq!(values(&read), vec![col("a", "a-new"), col("b", "b-new")]);
    let again = cluster.read("k", 3);
    assert_eq!(
        again.path,
        ReadPath::Fast,
        "the write-back made a quorum current"
    );
    assert_eq!(values(&again), values(&read));
}

#[test]
fn a_stale_replica_is_repaired_and_the_next_read_is_fast() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    let old = cluster.cell("k", "a", 10, Some("old"));
    let new = cluster.cell("k", "a", 20, Some("new"));
    for server in &mut cluster.group.servers {
        server.restore(old.clone());
    }
    // Replica 3 misses the second write.
    cluster.group.hooks.push(Box::new(|event| {
        !matches!(
            event,
            Event::Peer {
                to: Slot(3),
                message: Message::Store { .. },
                ..
            }
        )
    }));
    cluster.write(vec![new], 0);
    cluster.group.hooks.clear();
    assert_eq!(cluster.group.servers[3].cells(&row("k"))[0].ts, 10);
    // Proxy 3 answers with its stale cell itself; the digests disagree and it resolves.
    let read = cluster.read("k", 3);
    assert_eq!(read.path, ReadPath::Resolved { written_back: 1 });
    assert_eq!(values(&read), vec![col("a", "new")]);
    assert_eq!(
        cluster.group.servers[3].cells(&row("k"))[0].ts,
        20,
        "written back"
    );
    assert_eq!(cluster.read("k", 3).path, ReadPath::Fast);
}

#[test]
fn a_tombstone_hides_the_value_and_wins_a_tie() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    cluster.write(vec![cluster.cell("k", "a", 10, Some("v"))], 0);
    cluster.write(vec![cluster.cell("k", "a", 10, None)], 1);
    let read = cluster.read("k", 2);
    assert_eq!(values(&read), vec![("a".to_string(), None)]);
    // An older write arriving late is acknowledged but never served (spec §5.1 item 7).
    cluster.write(vec![cluster.cell("k", "a", 5, Some("late"))], 3);
    assert_eq!(values(&cluster.read("k", 0)), vec![("a".to_string(), None)]);
}

/// Reads resolved by their client (spec §3.6, Figure 21) on a group where members 0-1 hold a
/// new A and an old B and members 2-3 the reverse.
fn split_for_client_resolution(variant: Variant) -> Cluster {
    let mut cluster = Cluster::new(1, variant);
    cluster.resolver = Resolver::Client;
    let a = [(10, "a-old"), (20, "a-new")].map(|(ts, v)| cluster.cell("k", "a", ts, Some(v)));
    let b = [(10, "b-old"), (20, "b-new")].map(|(ts, v)| cluster.cell("k", "b", ts, Some(v)));
    for (i, server) in cluster.group.servers.iter_mut().enumerate() {
        let (a, b) = if i < 2 {
            (&a[1], &b[0])
        } else {
            (&a[0], &b[1])
        };
        server.restore(a.clone());
        server.restore(b.clone());
    }
    cluster
}

#[test]
fn a_client_resolves_disagreeing_answers_itself_and_the_proxy_writes_its_resolution_back() {
    for variant in SIGNING.into_iter().filter(|v| *v != Variant::ProxyVerifies) {
        let mut cluster = split_for_client_resolution(variant);
        let read = cluster.read("k", 0);
        assert_eq!(
            values(&read),
            vec![col("a", "a-new"), col("b", "b-new")],
            "{variant:?}"
        );
        let ReadPath::Resolved { written_back } = read.path else {
            panic!("{variant:?}: the answers disagreed");
        };
        assert!(written_back >= 1, "{variant:?}: a quorum made current");
        let proxy_resolutions: u64 = cluster
            .group
            .servers
            .iter()
            .map(|s| s.table_stats().resolved_reads)
            .sum();
        assert_eq!(proxy_resolutions, 0, "{variant:?}: no proxy resolved");
        assert_eq!(cluster.read("k", 3).path, ReadPath::Fast, "{variant:?}");
    }
}

#[test]
fn a_client_resolving_passes_over_a_forged_newest_cell_and_blames_its_voucher() {
    let forged_read = |mutations: TableMutations| {
        let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
        cluster.resolver = Resolver::Client;
        cluster.write(vec![cluster.cell("k", "a", 10, Some("real"))], 0);
        let forged = Unverified::<Cell>::new(
            bulwark_core::wire::encode(&Cell {
                row: row("k"),
                column: "a".into(),
                ts: 1_000,
                writer: WRITER,
                value: Some(b"forged".to_vec()),
            })
            .into(),
            Signature([7; 64]),
        );
        // Replica 2 answers with the forgery and signs its answer properly: it vouches for it.
        let vouch = vouches_for(&cluster, Slot(2), forged.clone());
        cluster.group.hooks.push(vouch);
        let mut op = cluster.read_op("k", 0).with_mutations(mutations);
        let read = cluster.run(&mut op, 50).expect("the read completes");
        let blamed: Vec<(Slot, EvidenceKind)> = read
            .evidence
            .iter()
            .map(|e| (e.node, e.kind.clone()))
            .collect();
        (values(&read), blamed, read.proxies)
    };
    let (read, blamed, proxies) = forged_read(TableMutations::default());
    assert_eq!(read, vec![col("a", "real")]);
    assert_eq!(blamed, vec![(Slot(2), EvidenceKind::ForgedVersion)]);
    assert_eq!(proxies, 1);
    // A client that resolves without checking writers' signatures picks the forgery and
    // blames no one; only the replicas, refusing to take it back, keep it from the reader.
    let broken = TableMutations {
        unverified_cells: true,
        ..TableMutations::default()
    };
    let (read, blamed, proxies) = forged_read(broken);
    assert_eq!(read, vec![col("a", "real")]);
    assert!(blamed.is_empty());
    assert!(proxies > 1, "its write-back of the forgery was refused");
}

#[test]
fn a_proxy_that_alters_the_client_resolution_is_left_for_the_next() {
    // Proxy 0 writes back an older A than the client resolved: the acknowledgements it
    // collects are for other cells, so the client moves on to proxy 1.
    let mut cluster = split_for_client_resolution(Variant::ProxyNoVerify);
    let stale = cluster.cell("k", "a", 10, Some("a-old"));
    cluster.group.hooks.push(Box::new(move |event| {
        if let Event::Request(Slot(0), Request { body, .. }) = event
            && let RequestBody::WriteBack { cells, .. } = body
        {
            cells.retain(|c| c.peek().is_ok_and(|c| c.column != "a"));
            cells.insert(0, stale.clone());
        }
        true
    }));
    let read = cluster.read("k", 0);
    assert_eq!(values(&read), vec![col("a", "a-new"), col("b", "b-new")]);
    assert!(read.proxies >= 2, "proxy 0's write-back did not count");
}

/// The administrator's revocation of the test's writer, recorded on every member it reaches.
fn revoke_writer(cluster: &mut Cluster) -> Vec<Slot> {
    let order = Revocation {
        client: WRITER,
        at_micros: 0,
    };
    let revocation = Signed::sign(&cluster.authority, order)
        .unwrap()
        .to_unverified();
    cluster.next_op += 1;
    let mut op = CreateOp::revoke(
        place(0, cluster.n(), cluster.f),
        OpId(cluster.next_op),
        revocation,
    );
    cluster
        .run(&mut op, 20)
        .expect("the revocation is recorded")
}

/// Spec §5.2 "Revocation": once the administrator revokes a writer, its new writes are
/// refused, and a write it signed earlier and a colluding member (3) saved for later comes back
/// neither through a read nor through a write-back; what it wrote before stays readable.
fn saved_write_after_revocation(
    mutations: TableMutations,
) -> (Vec<(String, Option<String>)>, Vec<u64>) {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    for server in &mut cluster.group.servers {
        *server = std::mem::replace(server, placeholder()).with_mutations(mutations);
    }
    cluster.write(vec![cluster.cell("k", "a", 10, Some("before"))], 0);
    let saved = cluster.cell("k", "a", 30, Some("saved"));
    assert!(revoke_writer(&mut cluster).len() >= 3);
    if !mutations.ignore_revocations {
        let mut op = cluster.write_op(vec![cluster.cell("k", "a", 20, Some("new"))], 0);
        let refused = cluster.run(&mut op, 50);
        assert!(
            matches!(&refused, Err(OpError::Refused { reason, .. }) if reason.contains("revoked")),
            "{refused:?}"
        );
    }
    // Member 3 holds the saved write, and answers with it under its own signature.
    let vouch = vouches_for(&cluster, Slot(3), saved.clone());
    cluster.group.hooks.push(vouch);
    let mut op = cluster.read_op("k", 2).with_mutations(mutations);
    let read = cluster.run(&mut op, 50).expect("the read completes");
    let held_ts = (0..3)
        .map(|i| cluster.group.servers[i].cells(&row("k"))[0].ts)
        .collect();
    (values(&read), held_ts)
}

/// A member to swap out while rebuilding one in place.
fn placeholder() -> Server {
    Cluster::new(1, Variant::ProxyNoVerify)
        .group
        .servers
        .remove(0)
}

#[test]
fn a_revoked_writer_cannot_write_and_its_saved_writes_do_not_come_back() {
    let (read, held) = saved_write_after_revocation(TableMutations::default());
    assert_eq!(read, vec![col("a", "before")]);
    assert_eq!(
        held,
        vec![10, 10, 10],
        "no correct member took the saved write"
    );
    // Members and readers that ignore the revocation take the saved write back.
    let broken = TableMutations {
        ignore_revocations: true,
        ..TableMutations::default()
    };
    let (read, held) = saved_write_after_revocation(broken);
    assert_eq!(read, vec![col("a", "saved")]);
    assert!(held.contains(&30), "{held:?}");
}

#[test]
fn a_revocation_is_checked_against_the_authority_and_passed_on_by_anti_entropy() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    cluster.write(vec![cluster.cell("k", "a", 10, Some("v"))], 0);
    // One signed by anyone else is refused by every member.
    let forged = Signed::sign(
        &cluster.writer,
        Revocation {
            client: WRITER,
            at_micros: 0,
        },
    )
    .unwrap()
    .to_unverified();
    cluster.next_op += 1;
    let mut op = CreateOp::revoke(place(0, 4, 1), OpId(cluster.next_op), forged);
    assert!(cluster.run(&mut op, 20).is_err());
    // Member 3 misses the real one, and learns it from the others' anti-entropy.
    cluster.group.hooks.push(Box::new(|event| {
        !matches!(
            event,
            Event::Request(
                Slot(3),
                Request {
                    body: RequestBody::Revoke { .. },
                    ..
                }
            )
        )
    }));
    assert_eq!(revoke_writer(&mut cluster).len(), 3);
    cluster.group.hooks.clear();
    assert!(cluster.group.servers[3].revoked().is_empty());
    for _ in 0..40 {
        cluster.group.tick(1_000);
    }
    assert_eq!(cluster.group.servers[3].revoked(), vec![WRITER]);
}

/// Spec §2.3 and §5.2 "eventual mode": a table on `2f+1` of the group's members with quorums of
/// `f+1`. Each write misses one replica in turn; once writes stop and anti-entropy runs, every
/// replica holds the newest write and every read, through any member, returns it.
fn eventual_after_writes(settings: Settings) -> (Cluster, Vec<Slot>) {
    let mut cluster = Cluster::build(
        1,
        Variant::HalfSym,
        settings,
        GC_GRACE_DEFAULT_SECS,
        Replication::Eventual,
    );
    let replicas = cluster.schema().replicas(4, 1);
    assert_eq!(replicas.len(), 3);
    for i in 0..6u64 {
        let missed = replicas[i as usize % 3];
        let proxy = replicas[(i as usize + 1) % 3];
        cluster.group.hooks = vec![Box::new(
            move |event| !matches!(event, Event::Peer { to, message: Message::Store { .. }, .. } if *to == missed),
        )];
        let value = format!("v{i}");
        let written = cluster.write(
            vec![cluster.cell("k", "a", 10 * (i + 1), Some(&value))],
            proxy.index(),
        );
        assert!(written.acks.iter().all(|(slot, _)| replicas.contains(slot)));
        assert!(written.acks.len() >= 2, "f+1 acknowledgements");
    }
    cluster.group.hooks.clear();
    (cluster, replicas)
}

#[test]
fn an_eventual_table_lives_on_2f_plus_1_members_and_converges_once_writes_stop() {
    let (mut cluster, replicas) = eventual_after_writes(Settings {
        fresh_micros: u64::MAX,
        ..Settings::default()
    });
    let outsider = (0..4)
        .map(|i| Slot(i as u32))
        .find(|s| !replicas.contains(s))
        .unwrap();
    for _ in 0..10 {
        cluster.group.tick(1_000);
    }
    for slot in &replicas {
        let cells = cluster.group.servers[slot.index()].cells(&row("k"));
        assert_eq!(cells[0].ts, 60, "replica {slot:?} caught up");
    }
    assert!(
        cluster.group.servers[outsider.index()]
            .cells(&row("k"))
            .is_empty()
    );
    for proxy in 0..4 {
        let read = cluster.read("k", proxy);
        assert_eq!(values(&read), vec![col("a", "v5")], "through {proxy}");
    }
    // The member outside the replicas refuses to answer for the table.
    let refused = cluster.group.servers[outsider.index()].on_message(
        NOW,
        replicas[0],
        Message::Read {
            pop: 1,
            client: WRITER,
            row: row("k"),
            columns: Vec::new(),
            nonce: [0; 16],
            data: true,
        },
        &(),
    );
    assert!(matches!(
        refused.sends.as_slice(),
        [(
            _,
            Message::Refused {
                refusal: Refusal::NotReplica(_),
                ..
            }
        )]
    ));
}

// A proxy outside an eventual table asks its first replica for data. That replica, faulty,
// sends a validly signed answer with cells other than those it names: the proxy takes it as no
// data and runs the data round, so the client gets its read from this proxy, the first it asked.
#[test]
fn a_proxy_outside_an_eventual_table_survives_a_data_replica_that_swaps_cells() {
    let (mut cluster, replicas) = eventual_after_writes(Settings {
        fresh_micros: u64::MAX,
        ..Settings::default()
    });
    for _ in 0..10 {
        cluster.group.tick(1_000);
    }
    let outsider = (0..4)
        .map(|i| Slot(i as u32))
        .find(|s| !replicas.contains(s))
        .unwrap();
    let first = (1..4)
        .map(|i| Slot((outsider.0 + i) % 4))
        .find(|s| replicas.contains(s))
        .unwrap();
    cluster.group.hooks = vec![Box::new(move |event| {
        if let Event::Peer {
            from,
            message: Message::Answer { answered, .. },
            ..
        } = event
            && *from == first
            && let Some(cells) = &mut answered.cells
        {
            cells.clear();
        }
        true
    })];
    let mut op = cluster.read_op("k", outsider.index());
    let read = cluster.run(&mut op, 50).expect("the read completes");
    assert_eq!(values(&read), vec![col("a", "v5")]);
    assert_eq!(read.proxies, 1, "the client stayed with the correct proxy");
}

#[test]
fn without_anti_entropy_an_eventual_table_stays_apart() {
    let (mut cluster, replicas) = eventual_after_writes(Settings {
        fresh_micros: u64::MAX,
        anti_entropy_millis: 0,
        ..Settings::default()
    });
    for _ in 0..10 {
        cluster.group.tick(1_000);
    }
    let newest: Vec<u64> = replicas
        .iter()
        .map(|slot| cluster.group.servers[slot.index()].cells(&row("k"))[0].ts)
        .collect();
    assert!(
        newest.contains(&50),
        "the replica that missed the last write still misses it: {newest:?}"
    );
}

#[test]
fn schemas_stored_in_earlier_encodings_are_read_as_the_tables_they_were() {
    let current = Schema {
        name: "users".into(),
        partition_key: "id".into(),
        clustering: vec!["at".into()],
        columns: vec!["a".into()],
        variant: Variant::HalfSym,
        gc_grace_secs: 3_600,
        replication: Replication::Eventual,
    };
    let encoded = bulwark_core::wire::encode(&current);
    assert_eq!(Schema::decode_stored(&encoded).unwrap(), current);
    let old = bulwark_core::wire::encode(&SchemaBeforeReplication {
        name: "users".into(),
        partition_key: "id".into(),
        clustering: vec!["at".into()],
        columns: vec!["a".into()],
        variant: Variant::HalfSym,
        gc_grace_secs: 3_600,
    });
    let strong = Schema {
        replication: Replication::Strong,
        ..current.clone()
    };
    assert_eq!(Schema::decode_stored(&old).unwrap(), strong);
    let older = bulwark_core::wire::encode(&SchemaBeforeGrace {
        name: "users".into(),
        partition_key: "id".into(),
        clustering: vec!["at".into()],
        columns: vec!["a".into()],
        variant: Variant::HalfSym,
    });
    let default_grace = Schema {
        gc_grace_secs: GC_GRACE_DEFAULT_SECS,
        ..strong
    };
    assert_eq!(Schema::decode_stored(&older).unwrap(), default_grace);
    assert!(Schema::decode_stored(&[0xff; 3]).is_err());
}

#[test]
fn a_proxy_that_answers_a_client_write_back_with_the_read_again_is_left() {
    // Proxy 0 answers the client's write-back with the read's answers once more, as if it had
    // been asked to read: the client must not resolve and write back through it again and
    // again, but move on to proxy 1.
    let mut cluster = split_for_client_resolution(Variant::ProxyNoVerify);
    let first: std::rc::Rc<std::cell::RefCell<Option<Response>>> = Default::default();
    let seen = first.clone();
    cluster.group.hooks.push(Box::new(move |event| {
        if let Event::Reply(Slot(0), response) = event
            && let ResponseBody::Read {
                answers, resolved, ..
            } = &response.body
        {
            if resolved.is_none() && !answers.is_empty() {
                *seen.borrow_mut() = Some(response.clone());
            } else if let Some(again) = seen.borrow().clone() {
                *response = again;
            }
        }
        true
    }));
    let read = cluster.read("k", 0);
    assert_eq!(values(&read), vec![col("a", "a-new"), col("b", "b-new")]);
    assert!(read.proxies >= 2, "proxy 0 was left");
}

// ---------------------------------------------------------------------------------------------
// Byzantine replicas

#[test]
fn a_forged_high_timestamp_cell_is_ignored_and_its_replica_blamed() {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    cluster.write(vec![cluster.cell("k", "a", 10, Some("real"))], 0);
    // Replica 2 answers with a cell "signed" by the writer with a made-up signature, and signs
    // its answer properly: it vouches for a forgery.
    let forged = Unverified::<Cell>::new(
        bulwark_core::wire::encode(&Cell {
            row: row("k"),
            column: "a".into(),
            ts: 1_000,
            writer: WRITER,
            value: Some(b"forged".to_vec()),
        })
        .into(),
        Signature([7; 64]),
    );
    let vouch = vouches_for(&cluster, Slot(2), forged.clone());
    cluster.group.hooks.push(vouch);
    let read = cluster.read("k", 0);
    assert_eq!(values(&read), vec![col("a", "real")]);
    assert_eq!(
        read.evidence
            .iter()
            .map(|e| (e.node, e.kind.clone()))
            .collect::<Vec<_>>(),
        vec![(Slot(2), EvidenceKind::ForgedVersion)]
    );
    assert!(cluster.group.servers[0].table_stats().forged_cells >= 1);
}

#[test]
fn a_replica_that_always_signs_badly_is_survived_by_every_variant() {
    for variant in SIGNING {
        let mut cluster = Cluster::new(1, variant);
        cluster.group.hooks.push(signs_badly(Slot(2)));
        let written = cluster.write(vec![cluster.cell("k", "a", 10, Some("v"))], 0);
        assert!(written.acks.iter().all(|(slot, _)| *slot != Slot(2)));
        // Within (f+1)^2 requests (spec §5.2).
        assert!(
            written.proxies <= 4,
            "{variant:?}: {} proxies",
            written.proxies
        );
        let read = cluster.read("k", 1);
        assert_eq!(values(&read), vec![col("a", "v")], "{variant:?}");
        if variant == Variant::ProxyVerifies {
            assert!(cluster.group.servers[0].table_stats().bad_signatures[&Slot(2)] >= 1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Byzantine proxies

/// Proxy 0 plays spec §2.8 scenario 2 with f = 1: it stores nothing, has one correct replica
/// (slot 1) store, signs its own acknowledgement, and makes up one for slot 2.
fn scenario_two(event: &mut Event, secrets: &[SecretKey]) -> bool {
    match event {
        Event::Peer {
            from: Slot(0),
            to,
            message: Message::Store { .. },
        } => *to == Slot(1),
        Event::Reply(Slot(0), Response { body, .. }) => {
            if let ResponseBody::Acks(acks) = body
                && let Some((_, ack)) = acks.iter().find(|(slot, _)| *slot == Slot(1))
            {
                let ack = ack.peek().unwrap();
                acks.retain(|(slot, _)| *slot == Slot(1));
                let own = WriteAck {
                    slot: Slot(0),
                    ..ack.clone()
                };
                acks.push((
                    Slot(0),
                    Signed::sign(&secrets[0], own).unwrap().to_unverified(),
                ));
                let made_up = Unverified::new(
                    bulwark_core::wire::encode(&WriteAck {
                        slot: Slot(2),
                        ..ack
                    })
                    .into(),
                    Signature([1; 64]),
                );
                acks.push((Slot(2), made_up));
            }
            true
        }
        _ => true,
    }
}

#[test]
fn f_plus_one_valid_acknowledgements_are_not_a_write() {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    let secrets = cluster.secrets.clone();
    cluster
        .group
        .hooks
        .push(Box::new(move |event| scenario_two(event, &secrets)));
    let cell = cluster.cell("k", "a", 10, Some("v"));
    let written = cluster.write(vec![cell.clone()], 0);
    assert!(
        written.proxies >= 2,
        "the lying proxy's reply was not enough"
    );
    assert!(written.acks.len() >= 3);

    // The broken variant takes the lying proxy's f+1 valid acknowledgements as a write.
    let mut broken = Cluster::new(1, Variant::ProxyNoVerify);
    let secrets = broken.secrets.clone();
    broken
        .group
        .hooks
        .push(Box::new(move |event| scenario_two(event, &secrets)));
    let mut op = broken
        .write_op(vec![cell], 0)
        .with_mutations(TableMutations {
            accept_f_plus_one: true,
            ..TableMutations::default()
        });
    let written = broken.run(&mut op, 50).unwrap();
    assert_eq!(written.proxies, 1, "accepted from the lying proxy");
    assert_eq!(written.acks.len(), 2, "only f+1");
}

#[test]
fn replayed_answers_and_acknowledgements_do_not_count() {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    let w1 = cluster.cell("k", "a", 10, Some("one"));
    let w2 = cluster.cell("k", "a", 20, Some("two"));
    let first = cluster.write(vec![w1], 0);
    // A proxy replays w1's acknowledgements as w2's.
    let mut op = cluster.write_op(vec![w2], 0);
    op.start();
    let replay = Response {
        op: op.op(),
        body: ResponseBody::Acks(
            first
                .acks
                .iter()
                .map(|(slot, ack)| (*slot, ack.clone()))
                .collect(),
        ),
    };
    assert!(matches!(op.on_reply(Slot(0), replay), Progress::Send(_)));

    // A proxy replays answers made for another read's nonce.
    let mut old = cluster.read_op("k", 1);
    let mut new = cluster.read_op("k", 1);
    new.start();
    let answers: Vec<(Slot, Answered)> = (0..4)
        .map(|i| {
            let nonce = match old.start().pop().unwrap().1.body {
                RequestBody::Read { nonce, .. } => nonce,
                _ => unreachable!(),
            };
            let server = &cluster.group.servers[i];
            (
                Slot(i as u32),
                server.answer(WRITER, &row("k"), &[], nonce, true).unwrap(),
            )
        })
        .collect();
    let replay = Response {
        op: new.op(),
        body: ResponseBody::Read {
            answers,
            resolved: None,
            write_backs: Vec::new(),
            revocations: Vec::new(),
        },
    };
    assert!(matches!(new.on_reply(Slot(1), replay), Progress::Send(_)));
}

/// Stores `cell` on the replicas of `slots` directly.
fn plant(cluster: &mut Cluster, slots: &[usize], cell: &SignedCell) {
    for slot in slots {
        cluster.group.servers[*slot].restore(cell.clone());
    }
}

#[test]
fn a_stale_write_back_is_caught_by_the_original_answers() {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    let old = cluster.cell("k", "a", 10, Some("old"));
    let new = cluster.cell("k", "a", 20, Some("new"));
    plant(&mut cluster, &[0, 1, 2, 3], &old);
    plant(&mut cluster, &[1, 2, 3], &new);
    let mut read = cluster.read_op("k", 0);
    let nonce = match &read.start()[0].1.body {
        RequestBody::Read { nonce, .. } => *nonce,
        _ => unreachable!(),
    };
    // Proxy 0 presents its old cell as resolved, with genuine write-back acknowledgements (the
    // replicas hold newer and say so for the old cell too) and the original answers.
    let answers: Vec<(Slot, Answered)> = (0..3)
        .map(|i| {
            let answered = cluster.group.servers[i]
                .answer(WRITER, &row("k"), &[], nonce, true)
                .unwrap();
            (Slot(i as u32), answered)
        })
        .collect();
    let write_backs: Vec<(Slot, Unverified<WriteBackAck>)> = (0..4)
        .map(|i| {
            let (_, ack) = cluster.group.servers[i]
                .write_back(NOW, WRITER, &row("k"), nonce, std::slice::from_ref(&old))
                .unwrap();
            (Slot(i as u32), ack)
        })
        .collect();
    let op = read.op();
    let reply = |answers: Vec<(Slot, Answered)>| Response {
        op,
        body: ResponseBody::Read {
            answers,
            resolved: Some(vec![old.clone()]),
            write_backs: write_backs.clone(),
            revocations: Vec::new(),
        },
    };
    assert!(matches!(
        read.on_reply(Slot(0), reply(answers)),
        Progress::Send(_)
    ));
    // Without the original answers, nothing shows the resolution was needed: refused too.
    assert!(matches!(
        read.on_reply(Slot(0), reply(Vec::new())),
        Progress::Send(_)
    ));
}

#[test]
fn a_split_brain_write_is_resolved_to_the_greater_value_on_first_read() {
    // A Byzantine client signs two values with one timestamp and a colluding proxy stores one
    // on each half (spec §2.13).
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    let a = cluster.cell("k", "a", 10, Some("aaa"));
    let b = cluster.cell("k", "a", 10, Some("bbb"));
    plant(&mut cluster, &[0, 1], &a);
    plant(&mut cluster, &[2, 3], &b);
    let first = cluster.read("k", 0);
    assert_eq!(values(&first), vec![col("a", "bbb")]);
    for proxy in 0..4 {
        let read = cluster.read("k", proxy);
        assert_eq!(values(&read), vec![col("a", "bbb")]);
        assert_eq!(read.path, ReadPath::Fast, "consistent after the first read");
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals

#[test]
fn bad_cells_are_refused_with_a_reason_and_counted() {
    let mut cluster = Cluster::with_settings(1, Variant::ProxyVerifies, Settings::default());
    let now_micros = NOW.0 * 1000;
    let refused = |cluster: &mut Cluster, cell: SignedCell| {
        let mut op = cluster.write_op(vec![cell], 0);
        match cluster.run(&mut op, 20) {
            Err(OpError::Refused { reason, .. }) => reason,
            other => panic!("expected a refusal, got {:?}", other.map(|o| o.acks.len())),
        }
    };
    let future = cluster.cell("k", "a", now_micros + 60_000_000, Some("v"));
    assert!(refused(&mut cluster, future).contains("future"));
    let skewed = cluster.cell("k", "a", now_micros + 1_000_000, Some("v"));
    assert!(
        cluster.write(vec![skewed], 1).acks.len() >= 3,
        "within the skew allowed"
    );
    let old = cluster.cell("k", "a", now_micros - 3_600_000_000, Some("v"));
    assert!(refused(&mut cluster, old.clone()).contains("old"));
    // The same old cell is taken as a write-back: that is how a stale replica catches up.
    assert!(
        cluster.group.servers[2]
            .write_back(NOW, WRITER, &row("k"), [0; 16], &[old])
            .is_ok()
    );
    let unknown = cluster.cell("k", "zzz", now_micros, Some("v"));
    assert!(refused(&mut cluster, unknown).contains("no column"));
    let mut other_table = cluster
        .cell("k", "a", now_micros, Some("v"))
        .peek()
        .unwrap();
    other_table.row.table = "orders".into();
    let other_table = other_table.sign(&cluster.writer).unwrap();
    assert!(refused(&mut cluster, other_table).contains("no table"));
    let stranger = Cell {
        row: row("k"),
        column: "a".into(),
        ts: now_micros,
        writer: ClientId(8),
        value: Some(b"v".to_vec()),
    }
    .sign(&SecretKey::from_seed(&[50; 32]))
    .unwrap();
    assert!(refused(&mut cluster, stranger).contains("signature"));
    assert!(cluster.group.servers[0].table_stats().forged_cells >= 1);
}

#[test]
fn a_replica_that_missed_a_table_learns_it_from_f_plus_one_members() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    let orders = Schema {
        name: "orders".into(),
        partition_key: "id".into(),
        clustering: vec!["line".into()],
        columns: vec!["item".into()],
        variant: Variant::ProxyNoVerify,
        gc_grace_secs: GC_GRACE_DEFAULT_SECS,
        replication: Replication::Strong,
    };
    // Replica 3 is down while the table is created: n - f members suffice.
    cluster.group.hooks.push(Box::new(|event| {
        !matches!(event, Event::Request(Slot(3), _))
    }));
    let mut create = CreateOp::new(place(0, 4, 1), OpId(900), orders.clone());
    let created = cluster.run(&mut create, 5).unwrap();
    assert_eq!(created, vec![Slot(0), Slot(1), Slot(2)]);
    cluster.group.hooks.clear();
    assert!(cluster.group.servers[3].catalog().get("orders").is_none());
    // One member's offer is not enough (it could be the faulty one's)...
    let out = cluster.group.servers[3].on_message(
        NOW,
        Slot(0),
        Message::Schema {
            schema: orders.clone(),
        },
        &(),
    );
    assert!(out.changes.is_empty());
    // ...and a made-up schema offered by another does not count towards it.
    let forged = Schema {
        columns: vec!["item".into(), "price".into()],
        ..orders.clone()
    };
    let out =
        cluster.group.servers[3].on_message(NOW, Slot(1), Message::Schema { schema: forged }, &());
    assert!(out.changes.is_empty());
    // Writes through proxies that hold the table teach it.
    let now_micros = NOW.0 * 1000;
    let writer = cluster.writer.clone();
    let cell = |line: &str, item: &str| {
        Cell {
            row: RowKey {
                table: "orders".into(),
                partition: b"o1".to_vec(),
                clustering: line.as_bytes().to_vec(),
            },
            column: "item".into(),
            ts: now_micros,
            writer: WRITER,
            value: Some(item.as_bytes().to_vec()),
        }
        .sign(&writer)
        .unwrap()
    };
    cluster.write(vec![cell("1", "apple")], 2);
    assert_eq!(
        cluster.group.servers[3].catalog().get("orders"),
        Some(&orders)
    );
    cluster.write(vec![cell("2", "pear")], 0);
    assert_eq!(
        cluster.group.servers[3]
            .cells(&RowKey {
                table: "orders".into(),
                partition: b"o1".to_vec(),
                clustering: b"2".to_vec(),
            })
            .len(),
        1,
        "and then stores its rows"
    );
    // A table that signs nothing is for the bench alone: nodes refuse to create one.
    let plain = Schema {
        name: "plain".into(),
        partition_key: "id".into(),
        clustering: Vec::new(),
        columns: vec!["v".into()],
        variant: Variant::Plain,
        gc_grace_secs: GC_GRACE_DEFAULT_SECS,
        replication: Replication::Strong,
    };
    let mut create = CreateOp::new(place(0, 4, 1), OpId(902), plain);
    assert!(matches!(
        cluster.run(&mut create, 5),
        Err(OpError::Refused { .. })
    ));
    // Creating it again with another schema is refused by every correct member.
    let mut again = CreateOp::new(
        place(0, 4, 1),
        OpId(901),
        Schema {
            columns: vec!["x".into()],
            ..orders
        },
    );
    assert!(matches!(
        cluster.run(&mut again, 5),
        Err(OpError::Refused { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Range reads and scans

impl Cluster {
    fn cell_at(&self, row: RowKey, column: &str, ts: u64, value: Option<&str>) -> SignedCell {
        Cell {
            row,
            column: column.into(),
            ts,
            writer: WRITER,
            value: value.map(|v| v.as_bytes().to_vec()),
        }
        .sign(&self.writer)
        .unwrap()
    }

    fn range_op(&mut self, range: Range, proxy: usize) -> RangeOp {
        self.next_op += 1;
        RangeOp::new(
            place(0, self.n(), self.f),
            self.keys.clone(),
            self.writers.clone(),
            OpId(self.next_op),
            range,
            (self.next_op as u128).to_le_bytes(),
            Consistency::Quorum,
            Slot(proxy as u32),
        )
        .for_table(&self.schema())
        .with_pair_keys(self.pairs.clone())
        .with_grace_line(self.grace_line)
    }

    /// Every page of `range` through `proxy`: the rows in the order returned.
    fn scan_all(&mut self, mut range: Range, proxy: usize) -> Vec<(RowKey, Vec<Cell>)> {
        let mut rows = Vec::new();
        for _ in 0..100 {
            let mut op = self.range_op(range.clone(), proxy);
            let page = self.run(&mut op, 50).expect("the page completes");
            assert!(page.rows.len() <= range.limit as usize);
            rows.extend(page.rows);
            match page.next {
                Some(next) => range.after = Some(next),
                None => return rows,
            }
        }
        panic!("the scan never ended");
    }
}

fn scan(limit: u32) -> Range {
    Range::scan("users", limit)
}

fn clustered(partition: &str, clustering: &str) -> RowKey {
    RowKey {
        table: "users".into(),
        partition: partition.as_bytes().to_vec(),
        clustering: clustering.as_bytes().to_vec(),
    }
}

/// Replaces what replica `slot` answers to range reads with `lie(answer, cells)`, re-signed
/// with its own key: a replica that vouches for what it says.
fn lies_in_pages(
    slot: usize,
    secret: SecretKey,
    mut lie: impl FnMut(&mut RangeAnswer, &mut Vec<SignedCell>) + 'static,
) -> Hook {
    Box::new(move |event| {
        let answered = match event {
            Event::Peer {
                from,
                message: Message::RangeAnswer { answered, .. },
                ..
            } if from.index() == slot => answered,
            // As proxy, its own page goes straight into its reply.
            Event::Reply(
                from,
                Response {
                    body: ResponseBody::Range { answers, .. },
                    ..
                },
            ) if from.index() == slot => {
                match answers.iter_mut().find(|(s, _)| s.index() == slot) {
                    Some((_, answered)) => answered,
                    None => return true,
                }
            }
            _ => return true,
        };
        let mut answer = answered.answer.peek().unwrap();
        lie(&mut answer, &mut answered.cells);
        answered.answer = Signed::sign(&secret, answer).unwrap().to_unverified();
        true
    })
}

#[test]
fn a_scan_returns_every_row_once_in_token_order_across_pages_and_replicas() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    // 25 rows, each on a different quorum of 3 of the 4 replicas.
    let mut expected = Vec::new();
    for i in 0..25 {
        let key = format!("k{i:02}");
        let cell = cluster.cell(&key, "a", 10 + i, Some(&key));
        let missing = (i % 4) as usize;
        let holders: Vec<usize> = (0..4).filter(|s| *s != missing).collect();
        plant(&mut cluster, &holders, &cell);
        expected.push(row(&key));
    }
    expected.sort_by_key(Position::of);
    for proxy in 0..4 {
        let rows = cluster.scan_all(scan(7), proxy);
        let keys: Vec<RowKey> = rows.iter().map(|(row, _)| row.clone()).collect();
        assert_eq!(keys, expected, "through proxy {proxy}");
        for (row, cells) in &rows {
            assert_eq!(cells.len(), 1);
            assert_eq!(cells[0].value.as_deref(), Some(&row.partition[..]));
        }
    }
    // The first scan wrote back what it read: every replica now holds every row.
    for server in &cluster.group.servers {
        for row in &expected {
            assert_eq!(server.cells(row).len(), 1, "{:?}", server.place().slot);
        }
    }
}

#[test]
fn a_range_reads_the_clustering_keys_of_one_partition_between_its_bounds() {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    for partition in ["p", "q"] {
        for c in 0..10 {
            let row = clustered(partition, &format!("c{c}"));
            let cell = cluster.cell_at(row, "b", 10, Some(partition));
            cluster.write(vec![cell], c % 4);
        }
    }
    let range = Range {
        partition: Some(b"p".to_vec()),
        start: Some(b"c3".to_vec()),
        end: Some(b"c7".to_vec()),
        ..scan(2)
    };
    let rows = cluster.scan_all(range, 1);
    let keys: Vec<&[u8]> = rows.iter().map(|(row, _)| &row.clustering[..]).collect();
    assert_eq!(keys, vec![&b"c3"[..], b"c4", b"c5", b"c6"]);
    assert!(
        rows.iter()
            .all(|(row, cells)| row.partition == b"p"
                && cells[0].value.as_deref() == Some(&b"p"[..]))
    );
}

#[test]
fn deleted_cells_come_back_as_tombstones_and_columns_can_be_chosen() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    let r = row("k");
    cluster.write(
        vec![
            cluster.cell_at(r.clone(), "a", 10, Some("x")),
            cluster.cell_at(r.clone(), "b", 10, Some("y")),
        ],
        0,
    );
    cluster.write(vec![cluster.cell_at(r.clone(), "a", 20, None)], 1);
    let rows = cluster.scan_all(scan(10), 2);
    let cells: Vec<(&str, Option<&[u8]>)> = rows[0]
        .1
        .iter()
        .map(|c| (c.column.as_str(), c.value.as_deref()))
        .collect();
    assert_eq!(cells, vec![("a", None), ("b", Some(&b"y"[..]))]);
    let only_b = cluster.scan_all(
        Range {
            columns: vec!["b".into()],
            ..scan(10)
        },
        3,
    );
    assert_eq!(only_b[0].1.len(), 1);
    assert_eq!(only_b[0].1[0].column, "b");
}

#[test]
fn a_replica_that_omits_rows_or_serves_old_versions_cannot_hide_a_write() {
    for proxy in 0..4 {
        let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
        for i in 0..6 {
            let key = format!("k{i}");
            cluster.write(vec![cluster.cell(&key, "a", 10, Some("old"))], 0);
            cluster.write(vec![cluster.cell(&key, "a", 20, Some("new"))], 1);
        }
        // Replica 3 drops every other row from its pages, and serves the rest at their first
        // version (which it kept aside): an honest-looking, signed, stale answer.
        let old: Vec<SignedCell> = (0..6)
            .map(|i| cluster.cell(&format!("k{i}"), "a", 10, Some("old")))
            .collect();
        let secret = cluster.secrets[3].clone();
        cluster
            .group
            .hooks
            .push(lies_in_pages(3, secret, move |answer, cells| {
                let mut kept_rows = Vec::new();
                let mut kept_cells = Vec::new();
                for (index, (row, _)) in answer.rows.iter().enumerate() {
                    if index % 2 == 1 {
                        continue;
                    }
                    let stale = old
                        .iter()
                        .find(|c| c.peek().unwrap().row == *row)
                        .unwrap()
                        .clone();
                    let decoded = stale.peek().unwrap();
                    kept_rows.push((row.clone(), entries_of([(&decoded, &stale)])));
                    kept_cells.push(stale);
                }
                answer.rows = kept_rows;
                *cells = kept_cells;
            }));
        let rows = cluster.scan_all(scan(4), proxy);
        assert_eq!(rows.len(), 6, "through proxy {proxy}");
        for (row, cells) in &rows {
            assert_eq!(cells[0].value.as_deref(), Some(&b"new"[..]), "{row:?}");
        }
    }
}

#[test]
fn a_forged_row_in_a_page_is_left_out_and_its_replica_blamed() {
    let mut cluster = Cluster::new(1, Variant::ProxyNoVerify);
    for i in 0..3 {
        let key = format!("k{i}");
        cluster.write(vec![cluster.cell(&key, "a", 10, Some("real"))], 0);
    }
    let forged = Unverified::<Cell>::new(
        bulwark_core::wire::encode(&Cell {
            row: row("zz-forged"),
            column: "a".into(),
            ts: 1_000,
            writer: WRITER,
            value: Some(b"forged".to_vec()),
        })
        .into(),
        Signature([7; 64]),
    );
    let secret = cluster.secrets[2].clone();
    cluster
        .group
        .hooks
        .push(lies_in_pages(2, secret, move |answer, cells| {
            let decoded = forged.peek().unwrap();
            let mut listed: Vec<(Position, (RowKey, Vec<Entry>), SignedCell)> = answer
                .rows
                .drain(..)
                .zip(cells.drain(..))
                .map(|(row, cell)| (Position::of(&row.0), row, cell))
                .collect();
            listed.push((
                Position::of(&decoded.row),
                (decoded.row.clone(), entries_of([(&decoded, &forged)])),
                forged.clone(),
            ));
            listed.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, row, cell) in listed {
                answer.rows.push(row);
                cells.push(cell);
            }
        }));
    let mut op = cluster.range_op(scan(10), 0);
    let page = cluster.run(&mut op, 50).expect("the page completes");
    assert_eq!(page.rows.len(), 3);
    assert!(
        page.rows
            .iter()
            .all(|(row, _)| row.partition != b"zz-forged")
    );
    assert_eq!(page.next, None);
    let mut op = cluster.range_op(scan(10), 2);
    let page = cluster.run(&mut op, 50).expect("the page completes");
    assert_eq!(page.rows.len(), 3);
    assert!(
        page.evidence
            .iter()
            .any(|e| e.node == Slot(2) && e.kind == EvidenceKind::ForgedVersion),
        "{:?}",
        page.evidence
    );
    assert!(cluster.group.servers[0].table_stats().forged_cells >= 1);

    // The negative control: a reader that takes cells unchecked returns the forgery.
    let mutations = TableMutations {
        unverified_cells: true,
        ..TableMutations::default()
    };
    for server in std::mem::take(&mut cluster.group.servers) {
        cluster.group.servers.push(server.with_mutations(mutations));
    }
    let mut op = cluster.range_op(scan(10), 1).with_mutations(mutations);
    let page = cluster.run(&mut op, 50).expect("the page completes");
    assert!(
        page.rows
            .iter()
            .any(|(row, _)| row.partition == b"zz-forged")
    );
}

#[test]
fn a_page_cut_short_without_reason_does_not_count() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    for i in 0..8 {
        let key = format!("k{i}");
        cluster.write(vec![cluster.cell(&key, "a", 10, Some("v"))], i % 4);
    }
    // Replica 1 answers one row and says there are more: it would pin every scan's bound.
    let secret = cluster.secrets[1].clone();
    cluster
        .group
        .hooks
        .push(lies_in_pages(1, secret, |answer, cells| {
            let first = answer.rows[0].1.len();
            answer.rows.truncate(1);
            cells.truncate(first);
            answer.complete = false;
        }));
    let mut op = cluster.range_op(scan(5), 0);
    let page = cluster.run(&mut op, 50).expect("the page completes");
    assert_eq!(page.rows.len(), 5);
    let rows = cluster.scan_all(scan(5), 2);
    assert_eq!(rows.len(), 8);
}

#[test]
fn bad_range_queries_are_refused_with_a_reason() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    for (range, reason) in [
        (scan(0), "1 to 100 rows"),
        (scan(101), "1 to 100 rows"),
        (
            Range {
                start: Some(b"a".to_vec()),
                ..scan(5)
            },
            "need a partition",
        ),
        (
            Range {
                table: "nope".into(),
                ..scan(5)
            },
            "no table",
        ),
        (
            Range {
                columns: vec!["zz".into()],
                ..scan(5)
            },
            "no column",
        ),
    ] {
        let mut op = cluster.range_op(range, 0);
        let error = cluster.run(&mut op, 50).expect_err("refused");
        assert!(error.to_string().contains(reason), "{error} vs {reason}");
    }
}

#[test]
fn pages_cut_by_bytes_at_different_rows_are_read_up_to_the_earliest_end() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    let big = "x".repeat(60 * 1024);
    let mut expected = Vec::new();
    for i in 0..12 {
        expected.push(row(&format!("k{i:02}")));
    }
    expected.sort_by_key(Position::of);
    // Replica 0 lacks the rows at places 1, 2, 3 and 7 of the scan, so its page (about six
    // rows of 180 KiB) reaches further than the others'.
    for (place, row) in expected.iter().enumerate() {
        let holders: &[usize] = if [1, 2, 3, 7].contains(&place) {
            &[1, 2, 3]
        } else {
            &[0, 1, 2, 3]
        };
        for column in ["a", "b", "c"] {
            let cell = cluster.cell_at(row.clone(), column, 10, Some(&big));
            plant(&mut cluster, holders, &cell);
        }
    }
    let rows = cluster.scan_all(scan(100), 0);
    let keys: Vec<RowKey> = rows.into_iter().map(|(row, _)| row).collect();
    assert_eq!(keys, expected);
    let mut op = cluster.range_op(scan(100), 0);
    let page = cluster.run(&mut op, 50).expect("the page completes");
    assert!(page.next.is_some(), "pages are cut by bytes");
}

// ---------------------------------------------------------------------------------------------
// Anti-entropy

#[test]
fn a_member_that_missed_writes_and_deletes_catches_up_by_anti_entropy_alone() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    // Replica 3 misses every write.
    cluster.group.hooks.push(Box::new(|event| {
        !matches!(
            event,
            Event::Peer {
                to: Slot(3),
                message: Message::Store { .. },
                ..
            }
        )
    }));
    for i in 0..250 {
        let key = format!("k{i:03}");
        cluster.write(vec![cluster.cell(&key, "a", 10, Some("v"))], i % 3);
    }
    cluster.write(vec![cluster.cell("k007", "a", 20, None)], 0);
    cluster.group.hooks.clear();
    assert!(cluster.group.servers[3].cells(&row("k000")).is_empty());
    // Rounds every second; each member offers 100 rows to the next member in turn.
    for _ in 0..12 {
        cluster.group.tick(1_000);
    }
    for i in 0..250 {
        let key = format!("k{i:03}");
        let cells = cluster.group.servers[3].cells(&row(&key));
        assert_eq!(cells.len(), 1, "{key}");
        assert_eq!(cells[0].value.is_none(), i == 7, "{key}");
    }
    let synced = cluster.group.servers[3].table_stats().synced;
    assert_eq!(synced, 250, "each missing cell taken once");
    assert_eq!(cluster.group.servers[0].table_stats().synced, 0);
}

// Two correct replicas of an eventual table meet by anti-entropy for every window of its rows,
// though the third replica takes part in none and the fourth member holds none of them.
#[test]
fn an_eventual_tables_correct_replicas_exchange_every_window_directly() {
    let mut cluster = Cluster::build(
        1,
        Variant::ProxyVerifies,
        Settings {
            fresh_micros: u64::MAX,
            ..Settings::default()
        },
        GC_GRACE_DEFAULT_SECS,
        Replication::Eventual,
    );
    let replicas = cluster.schema().replicas(4, 1);
    let (missed, mute) = (replicas[0], replicas[2]);
    // Every replica holds a first version of each row, so each offers windows of 100 rows.
    for i in 0..250 {
        let key = format!("k{i:03}");
        cluster.write(vec![cluster.cell(&key, "a", 10, Some("old"))], 0);
    }
    cluster.group.hooks.push(Box::new(move |event| match event {
        Event::Peer {
            to,
            message: Message::Store { .. },
            ..
        } => *to != missed,
        Event::Peer { from, to, message } => {
            let sync = matches!(
                message,
                Message::SyncOffer { .. } | Message::SyncReply { .. } | Message::SyncCells { .. }
            );
            !(sync && (*from == mute || *to == mute))
        }
        _ => true,
    }));
    for i in 0..250 {
        let key = format!("k{i:03}");
        let proxy = replicas[1 + i % 2].index();
        cluster.write(vec![cluster.cell(&key, "a", 20, Some("new"))], proxy);
    }
    for _ in 0..30 {
        cluster.group.tick(1_000);
    }
    let current = (0..250)
        .filter(|i| {
            let key = format!("k{i:03}");
            cluster.group.servers[missed.index()].cells(&row(&key))[0].ts == 20
        })
        .count();
    assert_eq!(
        current, 250,
        "every new version reached the replica that missed it"
    );
}

#[test]
fn anti_entropy_takes_no_forged_cell_and_no_cell_it_did_not_ask_for() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    for i in 0..5 {
        let key = format!("k{i}");
        cluster.write(vec![cluster.cell(&key, "a", 10, Some("v"))], 0);
    }
    let forged = Unverified::<Cell>::new(
        bulwark_core::wire::encode(&Cell {
            row: row("k1"),
            column: "a".into(),
            ts: 1_000,
            writer: WRITER,
            value: Some(b"forged".to_vec()),
        })
        .into(),
        Signature([7; 64]),
    );
    let unasked = cluster.cell("zz", "a", 10, Some("pushed"));
    // Replica 2 answers every offer with a forged newer cell, and sends an unasked one with
    // what it is asked for.
    cluster.group.hooks.push(Box::new(move |event| {
        if let Event::Peer {
            from: Slot(2),
            message,
            ..
        } = event
        {
            match message {
                Message::SyncReply { cells, .. } => cells.push(forged.clone()),
                Message::SyncCells { cells, .. } => cells.push(unasked.clone()),
                _ => {}
            }
        }
        true
    }));
    for _ in 0..8 {
        cluster.group.tick(1_000);
    }
    for server in &cluster.group.servers {
        assert_eq!(
            server.cells(&row("k1"))[0].value.as_deref(),
            Some(&b"v"[..])
        );
        assert!(server.cells(&row("zz")).is_empty());
    }
    let refused: u64 = cluster
        .group
        .servers
        .iter()
        .map(|s| {
            s.table_stats()
                .bad_syncs
                .get(&Slot(2))
                .copied()
                .unwrap_or(0)
        })
        .sum();
    assert!(refused >= 1, "the forger is counted");
}

#[test]
fn a_member_that_lost_everything_learns_the_table_and_its_rows_by_anti_entropy() {
    let mut cluster = Cluster::new(1, Variant::ProxyVerifies);
    for i in 0..30 {
        let key = format!("k{i:02}");
        cluster.write(vec![cluster.cell(&key, "b", 10, Some("v"))], i % 4);
    }
    let settings = Settings {
        fresh_micros: u64::MAX,
        ..Settings::default()
    };
    cluster.group.servers[2] = Server::new(
        place(2, 4, 1),
        cluster.secrets[2].clone(),
        cluster.keys.clone(),
        cluster.writers.clone(),
        Catalog::default(),
        settings,
    );
    for _ in 0..10 {
        cluster.group.tick(1_000);
    }
    let rebuilt = &cluster.group.servers[2];
    assert!(
        rebuilt.catalog().get("users").is_some(),
        "the schema, from f+1 members"
    );
    for i in 0..30 {
        assert_eq!(rebuilt.cells(&row(&format!("k{i:02}"))).len(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// MAC variants (spec §2.10; §5.2 "MAC")

fn stats_sum(cluster: &Cluster, stat: impl Fn(&TableStats) -> u64) -> u64 {
    cluster
        .group
        .servers
        .iter()
        .map(|server| stat(server.table_stats()))
        .sum()
}

#[test]
fn half_and_full_sym_mac_to_the_client_and_full_sym_checks_writers_off_the_write_path() {
    for variant in SIGNING {
        let mut cluster = Cluster::new(1, variant);
        let written = cluster.write(vec![cluster.cell("k", "a", 10, Some("v"))], 0);
        assert!(
            written
                .acks
                .iter()
                .all(|(_, ack)| ack.is_mac() == variant.macs_to_client()),
            "{variant:?}"
        );
        // No member verified the writer's signature to acknowledge it: each will, later.
        let unchecked: usize = cluster.group.servers.iter().map(Server::unchecked).sum();
        assert_eq!(unchecked, 4 * usize::from(variant == Variant::FullSym));
        let read = cluster.read("k", 1);
        assert_eq!(values(&read), vec![col("a", "v")], "{variant:?}");
        assert_eq!(stats_sum(&cluster, |s| s.mac_fallbacks), 0, "{variant:?}");
        cluster.group.tick(1);
        assert!(cluster.group.servers.iter().all(|s| s.unchecked() == 0));
        assert_eq!(stats_sum(&cluster, |s| s.quarantined), 0, "{variant:?}");
    }
}

#[test]
fn a_tag_made_for_the_other_direction_is_no_tag_and_no_statement() {
    let mut cluster = Cluster::new(1, Variant::FullSym);
    // The client's tags made with the keys of the replica-to-client direction (what a
    // reflected replica MAC would be keyed with): every replica falls back to the signature.
    let cells = vec![cluster.cell("k", "a", 10, Some("v"))];
    let reflected: Vec<Tag> = cluster
        .pairs
        .iter()
        .map(|keys| {
            let swapped = PairKeys {
                to_client: keys.to_replica.clone(),
                to_replica: keys.to_client.clone(),
            };
            swapped.write_tag(&cells)
        })
        .collect();
    cluster.group.hooks.push(Box::new(move |event| {
        if let Event::Request(_, Request { body, .. }) = event
            && let RequestBody::Write { tags, .. } = body
        {
            tags.clone_from(&reflected);
        }
        true
    }));
    assert!(cluster.write(cells, 0).acks.len() >= 3);
    assert_eq!(stats_sum(&cluster, |s| s.mac_fallbacks), 4);
    assert!(cluster.group.servers.iter().all(|s| s.unchecked() == 0));
    // And acknowledgements MACed with the client-to-replica keys count for nothing, while the
    // same statements MACed with the right keys make the write.
    let mut cluster = Cluster::new(1, Variant::HalfSym);
    let cells = vec![cluster.cell("k", "a", 20, Some("w"))];
    let mut op = cluster.write_op(cells.clone(), 0);
    let pairs = cluster.pairs.clone();
    let ack = |slot: usize| WriteAck {
        slot: Slot(slot as u32),
        epoch: Epoch(3),
        group: GroupId(5),
        cells: cells.iter().map(Cell::digest).collect(),
    };
    let reply = |op: &WriteOp, reflected: bool| {
        let acks = (0..4)
            .map(|slot| {
                let keys = &pairs[slot];
                let key = if reflected {
                    &keys.to_replica
                } else {
                    &keys.to_client
                };
                (Slot(slot as u32), Unverified::mac(key, &ack(slot)).unwrap())
            })
            .collect();
        Response {
            op: op.op(),
            body: ResponseBody::Acks(acks),
        }
    };
    op.start();
    let reflected = reply(&op, true);
    assert!(matches!(op.on_reply(Slot(0), reflected), Progress::Send(_)));
    let genuine = reply(&op, false);
    assert!(matches!(
        op.on_reply(Slot(0), genuine),
        Progress::Done(Ok(_))
    ));
}

#[test]
fn a_proxy_that_alters_the_tags_forces_the_fallback_not_a_failure() {
    let mut cluster = Cluster::new(1, Variant::FullSym);
    // Proxy 0 spoils the tag it forwards to every other replica.
    cluster.group.hooks.push(Box::new(|event| {
        if let Event::Peer {
            from: Slot(0),
            message: Message::Store { tag: Some(tag), .. },
            ..
        } = event
        {
            tag.0[0] ^= 1;
        }
        true
    }));
    let written = cluster.write(vec![cluster.cell("k", "a", 10, Some("v"))], 0);
    assert!(written.acks.len() >= 3);
    assert_eq!(written.proxies, 1);
    assert_eq!(cluster.group.servers[0].table_stats().mac_fallbacks, 0);
    for server in &cluster.group.servers[1..] {
        assert_eq!(server.table_stats().mac_fallbacks, 1);
        assert_eq!(Replica::stats(server).mac_fallbacks, 1, "what status shows");
        assert_eq!(server.unchecked(), 0, "checked on the write path instead");
    }
    assert_eq!(values(&cluster.read("k", 1)), vec![col("a", "v")]);
}

/// A cell whose writer's signature fails, as a Byzantine writer makes it.
fn badly_signed(cell: SignedCell) -> SignedCell {
    let mut signature = cell.signature().0;
    signature[7] ^= 1;
    Unverified::new(cell.bytes().clone(), Signature(signature))
}

#[test]
fn a_badly_signed_cell_kept_on_its_writers_tag_is_removed_and_blames_no_replica() {
    let mut cluster = Cluster::new(1, Variant::FullSym);
    cluster.write(vec![cluster.cell("k", "a", 10, Some("good"))], 0);
    // The writer tags a cell it signed badly; replica 3 never gets it.
    let forged = badly_signed(cluster.cell("k", "a", 20, Some("forged")));
    cluster.group.hooks.push(Box::new(|event| {
        !matches!(
            event,
            Event::Peer {
                to: Slot(3),
                message: Message::Store { .. },
                ..
            }
        )
    }));
    let written = cluster.write(vec![forged], 0);
    assert!(
        written.acks.len() >= 3,
        "its tags vouch for it on the write path"
    );
    cluster.group.hooks.clear();
    // A read that meets both versions resolves to the genuine one and blames no replica: a
    // correct one holds such a cell until it checks it (spec §5.1 item 15).
    let read = cluster.read("k", 1);
    assert_eq!(values(&read), vec![col("a", "good")]);
    assert!(read.evidence.is_empty(), "{:?}", read.evidence);
    // Off the write path, the holders find the bad signature and remove the cell.
    cluster.group.tick(1);
    for server in &cluster.group.servers {
        assert!(
            server
                .cells(&row("k"))
                .iter()
                .all(|cell| cell.value.as_deref() != Some(&b"forged"[..]))
        );
    }
    assert_eq!(stats_sum(&cluster, |s| s.quarantined), 3);
    // Half-Sym takes no writer's word for it: the same write is refused on the write path.
    let mut half = Cluster::new(1, Variant::HalfSym);
    let forged = badly_signed(half.cell("k", "a", 20, Some("forged")));
    let mut op = half.write_op(vec![forged], 0);
    assert!(half.run(&mut op, 10).is_err());
}

// ---------------------------------------------------------------------------------------------
// GC grace (spec §2.14; §5.2 "Resurrection after GC grace")

/// New writes fresh for a minute.
fn grace_settings() -> Settings {
    Settings {
        fresh_micros: 60_000_000,
        ..Settings::default()
    }
}

/// The table's GC grace in these tests: an hour.
const HOUR_SECS: u64 = 3600;

fn graced_cluster() -> Cluster {
    Cluster::with_grace(1, Variant::ProxyVerifies, grace_settings(), HOUR_SECS)
}

/// `NOW` on the cells' clock, less `seconds`.
fn stamp_before(seconds: u64) -> u64 {
    NOW.0 * 1000 - seconds * 1_000_000
}

const TWO_HOURS_MILLIS: u64 = 2 * 3_600_000;

/// Member 3 never takes a delete, by write or by anti-entropy: it keeps the deleted value.
fn keeps_deleted_values(event: &mut Event) -> bool {
    !matches!(
        event,
        Event::Peer {
            to: Slot(3),
            message: Message::Store { .. } | Message::SyncReply { .. } | Message::SyncCells { .. },
            ..
        }
    )
}

/// Writes `v` everywhere, deletes it everywhere but on member 3, and lets two hours pass.
fn deleted_and_collected(mutations: TableMutations) -> Cluster {
    let mut cluster = graced_cluster();
    let servers = std::mem::take(&mut cluster.group.servers);
    cluster.group.servers = servers
        .into_iter()
        .enumerate()
        .map(|(i, server)| {
            if i < 3 {
                server.with_mutations(mutations)
            } else {
                server
            }
        })
        .collect();
    cluster.write(vec![cluster.cell("k", "a", stamp_before(2), Some("v"))], 0);
    cluster.group.hooks.push(Box::new(keeps_deleted_values));
    cluster.write(vec![cluster.cell("k", "a", stamp_before(1), None)], 0);
    // Within the grace, the tombstone stands on every member that took it.
    cluster.group.tick(1_000);
    for server in &cluster.group.servers[..3] {
        let cells = server.cells(&row("k"));
        assert!(cells.len() == 1 && cells[0].value.is_none());
    }
    assert_eq!(stats_sum(&cluster, |s| s.collected), 0);
    cluster.group.tick(TWO_HOURS_MILLIS);
    cluster
}

#[test]
fn tombstones_are_collected_after_the_grace_and_a_deleted_value_cannot_come_back() {
    let mut cluster = deleted_and_collected(TableMutations::default());
    assert_eq!(
        stats_sum(&cluster, |s| s.collected),
        3,
        "one tombstone each"
    );
    // Member 3 offers its deleted value by anti-entropy, and vouches for it when asked; the
    // others, holding nothing, ask whether f+1 members hold it: one does.
    for _ in 0..12 {
        cluster.group.tick(1_000);
    }
    for server in &cluster.group.servers[..3] {
        assert!(server.cells(&row("k")).is_empty(), "the value came back");
    }
    assert!(stats_sum(&cluster, |s| s.not_live) >= 1);
    assert_eq!(stats_sum(&cluster, |s| s.confirmed_live), 0);
    // Reads and scans pass over it too, through every proxy, member 3 included: it is past the
    // grace and fewer than f+1 answers hold it. (Chosen, it could never be written back: the
    // read would fail instead.)
    cluster.grace_line = cluster.group.now.0 * 1000 - HOUR_SECS * 1_000_000;
    assert!(!cluster.group.servers[3].cells(&row("k")).is_empty());
    for proxy in 0..4 {
        let read = cluster.read("k", proxy);
        assert_eq!(values(&read), vec![], "through {proxy}");
        assert_eq!(read.proxies, 1, "the first proxy, {proxy}, could answer");
        let mut op = cluster.range_op(scan(10), proxy);
        let page = cluster.run(&mut op, 50).expect("the page completes");
        assert!(page.rows.is_empty(), "scan through {proxy}");
        assert_eq!(
            page.proxies, 1,
            "the first proxy, {proxy}, could answer the scan"
        );
    }
    // A proxy writing it back is refused, and the refusal says why.
    let write_back = Message::WriteBack {
        pop: 1,
        client: WRITER,
        row: row("k"),
        nonce: [0; 16],
        cells: vec![cluster.cell("k", "a", stamp_before(2), Some("v"))],
    };
    let now = cluster.group.now;
    let out = cluster.group.servers[0].on_message(now, Slot(3), write_back, &());
    assert!(out.changes.is_empty());
    assert!(
        matches!(
            &out.sends[..],
            [(
                _,
                Message::Refused {
                    refusal: Refusal::PastGrace { .. },
                    ..
                }
            )]
        ),
        "{:?}",
        out.sends
    );
}

// The broken variant: replicas that take old values on one member's word bring it back.
#[test]
fn without_the_liveness_check_a_deleted_value_comes_back() {
    let mutations = TableMutations {
        skip_liveness_check: true,
        ..TableMutations::default()
    };
    let mut cluster = deleted_and_collected(mutations);
    for _ in 0..12 {
        cluster.group.tick(1_000);
    }
    let back = cluster.group.servers[..3]
        .iter()
        .filter(|server| !server.cells(&row("k")).is_empty())
        .count();
    assert!(back >= 1, "the mutation must resurrect the value");
}

#[test]
fn a_live_value_past_the_grace_reaches_a_member_that_lost_it_once_f_plus_one_hold_it() {
    let mut cluster = graced_cluster();
    for i in 0..20 {
        let key = format!("k{i:02}");
        cluster.write(
            vec![cluster.cell(&key, "a", stamp_before(1), Some("v"))],
            i % 4,
        );
    }
    cluster.group.tick(TWO_HOURS_MILLIS);
    let catalog = cluster.group.servers[2].catalog().clone();
    cluster.group.servers[2] = Server::new(
        place(2, 4, 1),
        cluster.secrets[2].clone(),
        cluster.keys.clone(),
        cluster.writers.clone(),
        catalog,
        grace_settings(),
    );
    for _ in 0..12 {
        cluster.group.tick(1_000);
    }
    let rebuilt = &cluster.group.servers[2];
    for i in 0..20 {
        assert_eq!(rebuilt.cells(&row(&format!("k{i:02}"))).len(), 1, "k{i:02}");
    }
    assert_eq!(rebuilt.table_stats().confirmed_live, 20);
    assert_eq!(rebuilt.table_stats().not_live, 0);
    // Reads see the value on every member.
    let read = cluster.read("k03", 2);
    assert_eq!(values(&read), vec![col("a", "v")]);
}
