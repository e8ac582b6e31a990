//! T1 of ../shared/specs/a2m.md §7.2: the component against an independent model, its refusals,
//! its durability and its identity rules.

use std::collections::BTreeMap;

use bulwark_core::a2m::Refusal;
use bulwark_core::a2m::{Attestation, Expected, Kind, LogId, Seq, Status, Value, chain, nonce_of};
use bulwark_storage::{StorageOp, Store};
use proptest::prelude::*;

use crate::component::{ENTRIES, entry_key};

use super::*;

/// What one slot of the model is: a slot by slot picture, unlike the component's sparse map.
fn anchor(dir: &std::path::Path) -> Box<dyn Anchor> {
    Box::new(FileAnchor::beside(dir).expect("a named directory"))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Slot {
    Assigned {
        value: Value,
        digest: ChainDigest,
    },
    /// Jumped over by the advance that filled slot `by`.
    Skipped {
        by: Seq,
    },
    Forgotten,
}

/// The model: every slot from 0 to the end, spelled out.
#[derive(Clone, Debug)]
struct Model {
    slots: Vec<Slot>,
}

impl Model {
    fn new() -> Model {
        Model {
            slots: vec![Slot::Assigned {
                value: [0; 32],
                digest: [0; 32],
            }],
        }
    }

    fn high(&self) -> Seq {
        (self.slots.len() - 1) as Seq
    }

    fn low(&self) -> Seq {
        self.slots
            .iter()
            .position(|slot| *slot != Slot::Forgotten)
            .unwrap_or(0) as Seq
    }

    fn digest_at(&self, seq: Seq) -> ChainDigest {
        match self.slots[seq as usize] {
            Slot::Assigned { digest, .. } => digest,
            _ => unreachable!("the end is always assigned"),
        }
    }

    fn append(&mut self, value: Value) -> Seq {
        let seq = self.high() + 1;
        let digest = chain(seq, &value, &self.digest_at(self.high()));
        self.slots.push(Slot::Assigned { value, digest });
        seq
    }

    fn advance(&mut self, seq: Seq, digest: ChainDigest, value: Value) -> bool {
        if seq <= self.high() {
            return false;
        }
        while self.high() + 1 < seq {
            self.slots.push(Slot::Skipped { by: seq });
        }
        self.slots.push(Slot::Assigned {
            value,
            digest: chain(seq, &value, &digest),
        });
        true
    }

    fn truncate(&mut self, seq: Seq) -> bool {
        if seq <= self.low() || seq > self.high() {
            return false;
        }
        for slot in &mut self.slots[..seq as usize] {
            *slot = Slot::Forgotten;
        }
        true
    }

    fn lookup(&self, seq: Seq) -> (Status, Seq, Value, ChainDigest) {
        if seq > self.high() {
            return (Status::Unassigned, self.high(), [0; 32], [0; 32]);
        }
        match self.slots[seq as usize] {
            Slot::Forgotten => (Status::Forgotten, self.low(), [0; 32], [0; 32]),
            Slot::Assigned { value, digest } => (Status::Assigned, seq, value, digest),
            Slot::Skipped { by } => match self.slots[by as usize] {
                Slot::Assigned { value, digest } => (Status::Skipped, by, value, digest),
                _ => unreachable!("an advance's own slot is assigned"),
            },
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append(LogId, u8),
    /// Advance by a distance past the end (0 means "to the end itself", which must fail).
    Advance(LogId, u8, u8, u8),
    /// Truncate to a slot picked relative to the log's bounds.
    Truncate(LogId, u8),
    Lookup(LogId, u8),
    End(LogId),
}

fn op() -> impl Strategy<Value = Op> {
    let log = 0..3u64;
    prop_oneof![
        4 => (log.clone(), any::<u8>()).prop_map(|(l, v)| Op::Append(l, v)),
        2 => (log.clone(), 0..4u8, any::<u8>(), any::<u8>())
            .prop_map(|(l, by, d, v)| Op::Advance(l, by, d, v)),
        1 => (log.clone(), any::<u8>()).prop_map(|(l, at)| Op::Truncate(l, at)),
        3 => (log.clone(), any::<u8>()).prop_map(|(l, at)| Op::Lookup(l, at)),
        1 => log.prop_map(Op::End),
    ]
}

fn check_statement(model: &Model, got: &Attestation, seq: Seq) {
    let (status, ref_seq, value, digest) = model.lookup(seq);
    assert_eq!(
        (got.status, got.ref_seq, got.value, got.digest),
        (status, ref_seq, value, digest),
        "slot {seq}"
    );
}

fn run(component: &mut Component, models: &mut BTreeMap<LogId, Model>, op: &Op) {
    let key = component.public_key();
    match *op {
        Op::Append(log, v) => {
            let model = models.entry(log).or_insert_with(Model::new);
            let seq = component.append(log, [v; 32]).expect("room");
            assert_eq!(seq, model.append([v; 32]));
        }
        Op::Advance(log, by, d, v) => {
            let model = models.entry(log).or_insert_with(Model::new);
            let seq = model.high() + by as Seq;
            let nonce = [by; 32];
            let accepted = model.advance(seq, [d; 32], [v; 32]);
            match component.advance_attest(log, seq, [d; 32], [v; 32], nonce) {
                Ok(attestation) => {
                    assert!(accepted, "advance to {seq} must fail");
                    let checked = Expected {
                        nonce,
                        ..Expected::assigned(log, seq, [v; 32])
                    }
                    .check(&key, attestation.to_unverified())
                    .expect("valid");
                    check_statement(model, checked.value(), seq);
                }
                Err(A2mError::Refused(Refusal::NotMonotone { .. })) => {
                    assert!(!accepted, "advance to {seq}")
                }
                Err(error) => panic!("{error}"),
            }
        }
        Op::Truncate(log, at) => {
            let model = models.entry(log).or_insert_with(Model::new);
            // Anywhere from below the low end to past the high end.
            let span = model.high() - model.low() + 3;
            let seq = (model.low() + at as Seq % span).saturating_sub(1);
            let accepted = model.truncate(seq);
            match component.truncate(log, seq) {
                Ok(()) => assert!(accepted, "truncate to {seq} must fail"),
                Err(A2mError::Refused(Refusal::OutOfRange { .. })) => {
                    assert!(!accepted, "truncate to {seq}")
                }
                Err(error) => panic!("{error}"),
            }
        }
        Op::Lookup(log, at) => {
            let model = models.get(&log).cloned().unwrap_or_else(Model::new);
            let seq = at as Seq % (model.high() + 3);
            let attestation = component.lookup(log, seq, nonce_of(seq)).expect("running");
            let statement = attestation.value();
            assert_eq!(
                (statement.kind, statement.log, statement.seq),
                (Kind::Lookup, log, seq)
            );
            check_statement(&model, statement, seq);
        }
        Op::End(log) => {
            let model = models.get(&log).cloned().unwrap_or_else(Model::new);
            let nonce = [log as u8 + 1; 32];
            let end = Expected::end(log, nonce)
                .check(
                    &key,
                    component.end(log, nonce).expect("running").to_unverified(),
                )
                .expect("valid");
            assert_eq!(end.value().seq, model.high());
            check_statement(&model, end.value(), model.high());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random appends, advances, truncations, lookups and ends agree with the slot-by-slot model:
    /// statuses, reference slots, values and digests (spec §7.2 T1).
    #[test]
    fn the_component_answers_as_the_model_does(ops in proptest::collection::vec(op(), 1..80)) {
        let mut component = Component::in_memory(&[3; 32], Limits::default());
        let mut models = BTreeMap::new();
        for op in &ops {
            run(&mut component, &mut models, op);
        }
    }

    /// The same, with the component closed and reopened from its store between operations: what
    /// it attests after a restart is what it would have attested without one.
    #[test]
    fn a_reopened_component_answers_as_before(
        ops in proptest::collection::vec(op(), 1..40),
        restarts in proptest::collection::vec(any::<bool>(), 40),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut component = Component::create(dir.path(), anchor(dir.path()), Limits::default()).expect("create");
        let key = component.public_key();
        let mut models = BTreeMap::new();
        for (op, restart) in ops.iter().zip(restarts) {
            run(&mut component, &mut models, op);
            if restart {
                drop(component);
                component = Component::open(dir.path(), anchor(dir.path()), Limits::default()).expect("reopen");
                prop_assert_eq!(component.public_key(), key);
            }
        }
    }
}

#[test]
fn the_chain_runs_through_an_advance() {
    let mut component = Component::in_memory(&[1; 32], Limits::default());
    assert_eq!(component.append(7, [1; 32]).expect("room"), 1);
    component
        .advance(7, 5, [9; 32], [2; 32])
        .expect("past the end");
    assert_eq!(component.append(7, [3; 32]).expect("room"), 6);
    let d1 = chain(1, &[1; 32], &[0; 32]);
    let d5 = chain(5, &[2; 32], &[9; 32]);
    let d6 = chain(6, &[3; 32], &d5);
    for (seq, digest) in [(1, d1), (5, d5), (6, d6)] {
        assert_eq!(
            component
                .lookup(7, seq, [0; 32])
                .expect("running")
                .value()
                .digest,
            digest
        );
    }
    let skipped = *component.lookup(7, 3, [0; 32]).expect("running").value();
    assert_eq!(
        (
            skipped.status,
            skipped.ref_seq,
            skipped.value,
            skipped.digest
        ),
        (Status::Skipped, 5, [2; 32], d5)
    );
    // An advance to the end or before it fails and changes nothing.
    assert!(matches!(
        component.advance(7, 6, [0; 32], [4; 32]),
        Err(A2mError::Refused(Refusal::NotMonotone {
            seq: 6,
            high: 6,
            ..
        }))
    ));
    assert_eq!(
        component.end(7, [0; 32]).expect("running").value().digest,
        d6
    );
}

/// A full log refuses the next append and drops nothing; truncating at a checkpoint makes room
/// (spec §7.2 T11).
#[test]
fn a_full_log_refuses_and_keeps_everything() {
    let limits = Limits {
        logs_max: 2,
        entries_max: 4,
    };
    let mut component = Component::in_memory(&[1; 32], limits);
    for value in 1..=3u8 {
        component.append(0, [value; 32]).expect("room");
    }
    assert!(matches!(
        component.append(0, [4; 32]),
        Err(A2mError::Refused(Refusal::Full { log: 0, max: 4 }))
    ));
    assert!(matches!(
        component.advance(0, 9, [0; 32], [4; 32]),
        Err(A2mError::Refused(Refusal::Full { .. }))
    ));
    for seq in 0..=3u8 {
        let statement = *component
            .lookup(0, seq.into(), [0; 32])
            .expect("running")
            .value();
        assert_eq!(
            (statement.status, statement.value[0]),
            (Status::Assigned, seq)
        );
    }
    assert_eq!(component.end(0, [0; 32]).expect("running").value().seq, 3);
    component.truncate(0, 2).expect("in range");
    assert_eq!(
        component.append(0, [4; 32]).expect("room after truncation"),
        4
    );
    // Logs are bounded too.
    component.append(1, [1; 32]).expect("a second log");
    assert!(matches!(
        component.append(2, [1; 32]),
        Err(A2mError::Refused(Refusal::TooManyLogs { max: 2 }))
    ));
}

#[test]
fn truncation_keeps_its_slot_and_forgets_below() {
    let mut component = Component::in_memory(&[1; 32], Limits::default());
    for value in 1..=5u8 {
        component.append(0, [value; 32]).expect("room");
    }
    for bad in [0, 6] {
        assert!(matches!(
            component.truncate(0, bad),
            Err(A2mError::Refused(Refusal::OutOfRange { .. }))
        ));
    }
    component.truncate(0, 3).expect("in range");
    assert!(matches!(
        component.truncate(0, 3),
        Err(A2mError::Refused(Refusal::OutOfRange {
            low: 3,
            high: 5,
            ..
        }))
    ));
    let forgotten = *component.lookup(0, 2, [0; 32]).expect("running").value();
    assert_eq!(
        (forgotten.status, forgotten.ref_seq, forgotten.value),
        (Status::Forgotten, 3, [0; 32])
    );
    assert_eq!(
        component
            .lookup(0, 3, [0; 32])
            .expect("running")
            .value()
            .status,
        Status::Assigned
    );
}

#[test]
fn an_identity_is_made_once_and_never_remade_over_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("a2m");
    let refused = Component::open(&empty, anchor(&empty), Limits::default())
        .err()
        .expect("no identity");
    assert!(
        refused.to_string().contains("holds no trusted log"),
        "{refused}"
    );

    let mut component =
        Component::create(&empty, anchor(&empty), Limits::default()).expect("create");
    let key = component.public_key();
    component.append(0, [1; 32]).expect("room");
    let busy = Component::open(&empty, anchor(&empty), Limits::default())
        .err()
        .expect("held by the first");
    assert!(busy.to_string().contains("another process"), "{busy}");
    drop(component);

    let again = Component::create(&empty, anchor(&empty), Limits::default())
        .err()
        .expect("state is there");
    assert!(again.to_string().contains("already holds"), "{again}");
    let reopened = Component::open(&empty, anchor(&empty), Limits::default()).expect("open");
    assert_eq!(reopened.public_key(), key);
    assert_eq!(reopened.heads(), vec![(0, Head { low: 0, high: 1 })]);
}

/// State a component could not have written (here: a log whose last slot is gone) stops it from
/// starting, with the directory named: it must take a new identity.
#[test]
fn damaged_state_is_refused_not_repaired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut component =
        Component::create(dir.path(), anchor(dir.path()), Limits::default()).expect("create");
    component.append(4, [1; 32]).expect("room");
    component.append(4, [2; 32]).expect("room");
    drop(component);
    let store = Store::open(dir.path()).expect("store");
    store
        .apply(&[StorageOp::Delete {
            table: ENTRIES,
            key: entry_key(4, 2),
        }])
        .expect("delete");
    drop(store);
    let refused = Component::open(dir.path(), anchor(dir.path()), Limits::default())
        .err()
        .expect("damaged");
    let message = refused.to_string();
    assert!(
        message.contains("slot 2") && message.contains("make a new one"),
        "{message}"
    );
    assert!(
        message.contains(&dir.path().display().to_string()),
        "{message}"
    );
}

#[test]
fn the_anchor_lies_beside_its_directory_never_inside() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("a2m");
    assert_eq!(
        FileAnchor::beside(&dir).expect("named").describe(),
        root.path().join("a2m.anchor").display().to_string()
    );
    // `.` is the working directory, named by its absolute path: its anchor is in the parent.
    let here = std::env::current_dir().expect("cwd");
    let anchor = FileAnchor::beside(std::path::Path::new("."))
        .expect("named")
        .describe();
    assert!(
        !anchor.starts_with(&format!("{}/", here.display())),
        "{anchor}"
    );
    for unnamed in ["..", "x/.."] {
        assert!(
            FileAnchor::beside(std::path::Path::new(unnamed)).is_none(),
            "{unnamed}"
        );
    }
}

/// A directory restored from an older copy is refused at start, and so is one whose anchor is
/// missing or another log's; a crash between the commit and the anchor's write is not a
/// rollback (spec §7.2 T1: "a rollback attempt is detected or refused").
#[test]
fn a_rolled_back_state_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("a2m");
    let mut component = Component::create(&dir, anchor(&dir), Limits::default()).expect("create");
    component.append(0, [1; 32]).expect("room");
    drop(component);
    let copy = root.path().join("copy.redb");
    std::fs::copy(dir.join("state.redb"), &copy).expect("copy");

    let mut component = Component::open(&dir, anchor(&dir), Limits::default()).expect("open");
    assert_eq!(component.generation(), Some(1));
    component.append(0, [2; 32]).expect("room");
    drop(component);

    std::fs::copy(&copy, dir.join("state.redb")).expect("roll back");
    let refused = Component::open(&dir, anchor(&dir), Limits::default())
        .err()
        .expect("rolled back");
    let message = refused.to_string();
    assert!(
        message.contains("generation 1") && message.contains("recorded generation 2"),
        "{message}"
    );
    assert!(message.contains("rolled back"), "{message}");

    // A crash after the commit and before the anchor's write: the state is one ahead.
    let crashed = root.path().join("crashed");
    let mut component =
        Component::create(&crashed, anchor(&crashed), Limits::default()).expect("create");
    let key = component.public_key();
    component.append(0, [1; 32]).expect("room");
    drop(component);
    FileAnchor::beside(&crashed)
        .expect("named")
        .record(Mark { key, generation: 0 })
        .expect("record");
    let reopened = Component::open(&crashed, anchor(&crashed), Limits::default()).expect("open");
    assert_eq!(reopened.generation(), Some(1));
    drop(reopened);
    assert_eq!(
        FileAnchor::beside(&crashed)
            .expect("named")
            .read()
            .expect("read"),
        Some(Mark { key, generation: 1 })
    );

    // No anchor, or another log's anchor.
    std::fs::remove_file(crashed.with_file_name("crashed.anchor")).expect("remove");
    let missing = Component::open(&crashed, anchor(&crashed), Limits::default())
        .err()
        .expect("no anchor");
    assert!(missing.to_string().contains("holds no record"), "{missing}");
    let other = Component::create(
        &root.path().join("other"),
        anchor(&crashed),
        Limits::default(),
    )
    .expect("a new log on the free anchor");
    drop(other);
    let foreign = Component::open(&crashed, anchor(&crashed), Limits::default())
        .err()
        .expect("another log's anchor");
    assert!(
        foreign.to_string().contains("another trusted log"),
        "{foreign}"
    );
    let reuse = Component::create(
        &root.path().join("third"),
        anchor(&crashed),
        Limits::default(),
    )
    .err()
    .expect("the anchor is taken");
    assert!(reuse.to_string().contains("retired"), "{reuse}");
}

mod socket {
    use std::io::Write;
    use std::os::unix::net::{UnixListener, UnixStream};

    use bulwark_core::a2m::Expected;

    use super::*;
    use crate::socket::{Remote, serve};

    fn served(dir: &std::path::Path) -> (std::path::PathBuf, PublicKey) {
        let state = dir.join("a2m");
        let component =
            Component::create(&state, anchor(&state), Limits::default()).expect("create");
        let key = component.public_key();
        let path = dir.join("a2m.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        std::thread::spawn(move || serve(component, listener));
        (path, key)
    }

    /// The host gets verified attestations and the component's refusals through the socket, and a
    /// host that sends garbage loses its connection without hurting the component.
    #[test]
    fn a_component_behind_its_socket_answers_as_in_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, key) = served(dir.path());
        let mut remote = Remote::connect(&path, Some(key)).expect("connect");
        assert_eq!(remote.append(2, [1; 32]).expect("room"), 1);
        let attestation = remote.append_attest(2, [2; 32], nonce_of(2)).expect("room");
        Expected::assigned(2, 2, [2; 32])
            .check(&key, attestation.to_unverified())
            .expect("valid");
        remote
            .advance(2, 9, [0; 32], [3; 32])
            .expect("past the end");
        assert!(matches!(
            remote.advance(2, 9, [0; 32], [3; 32]),
            Err(A2mError::Refused(Refusal::NotMonotone {
                seq: 9,
                high: 9,
                ..
            }))
        ));
        let end = remote.end(2, [5; 32]).expect("running");
        assert_eq!(end.value().seq, 9);
        remote.truncate(2, 9).expect("in range");
        assert_eq!(
            remote
                .lookup(2, 1, [0; 32])
                .expect("running")
                .value()
                .status,
            Status::Forgotten
        );

        // Garbage, and a frame longer than any call, end their connections.
        for junk in [
            &[0, 0, 0, 3, 0xff, 0xff, 0xff][..],
            &[0xff, 0xff, 0xff, 0xff][..],
        ] {
            let mut stream = UnixStream::connect(&path).expect("connect");
            stream.write_all(junk).expect("write");
            let mut answer = Vec::new();
            let _ = std::io::Read::read_to_end(&mut stream, &mut answer);
            assert!(answer.is_empty(), "answered {answer:?}");
        }
        let status = remote.status().expect("status");
        assert_eq!(status.key, key);
        assert_eq!(status.heads, vec![(2, Head { low: 9, high: 9 })]);
        assert_eq!(status.generation, Some(4));
        assert_eq!(
            status.refused, 3,
            "one refused advance and two junk connections"
        );

        // A host configured with another component's key refuses this one.
        let other = Component::in_memory(&[9; 32], Limits::default()).public_key();
        let wrong = Remote::connect(&path, Some(other)).err().expect("not ours");
        assert!(wrong.to_string().contains("not the configured"), "{wrong}");
    }
}

/// The TPM anchor (T1 with a TPM): a rollback of the whole disk, which no file anchor can see, is
/// caught by the TPM's counter; so is a counter defined again; and a state is never opened on
/// another kind of anchor than the one it was made with. Runs on its own emulator; SKIPPED
/// without one unless BULWARK_REQUIRE_TPM=1.
#[test]
fn a_tpm_anchor_catches_a_rollback_of_the_whole_disk() {
    let root = tempfile::tempdir().expect("tempdir");
    let Some(swtpm) = crate::swtpm::for_test(
        "a_tpm_anchor_catches_a_rollback_of_the_whole_disk",
        &root.path().join("tpm"),
    ) else {
        return;
    };
    let index = crate::tpm::INDEX_FIRST + 7;
    let tpm = |swtpm: &crate::swtpm::Swtpm| -> Box<dyn Anchor> {
        Box::new(TpmAnchor::new(&swtpm.tcti(), index).expect("tpm anchor"))
    };
    // The "disk": the component's directory, and nothing else it keeps.
    let disk = root.path().join("disk");
    let dir = disk.join("a2m");
    let mut component = Component::create(&dir, tpm(&swtpm), Limits::default()).expect("create");
    let key = component.public_key();
    let start = component.generation().expect("durable");
    component.append(0, [1; 32]).expect("room");
    drop(component);
    let snapshot = root.path().join("snapshot.redb");
    std::fs::copy(dir.join("state.redb"), &snapshot).expect("snapshot");

    // The machine reboots; the TPM keeps its counter.
    let swtpm = swtpm.restart().expect("reboot");
    let mut component = Component::open(&dir, tpm(&swtpm), Limits::default()).expect("open");
    assert_eq!(component.generation(), Some(start + 1));
    component.append(0, [2; 32]).expect("room");
    component.append(0, [3; 32]).expect("room");
    drop(component);
    assert_eq!(
        TpmAnchor::new(&swtpm.tcti(), index)
            .expect("anchor")
            .read()
            .expect("read"),
        Some(Mark {
            key,
            generation: start + 3
        })
    );

    // The disk restored from its snapshot: the state is behind the TPM's counter.
    std::fs::copy(&snapshot, dir.join("state.redb")).expect("roll back");
    let refused = Component::open(&dir, tpm(&swtpm), Limits::default())
        .err()
        .expect("rolled back")
        .to_string();
    assert!(refused.contains("the state was rolled back"), "{refused}");
    assert!(refused.contains(&format!("{index:#010x}")), "{refused}");

    // The counter defined again under the same log's name starts above every count this TPM
    // held: still ahead of the restored state.
    redefine(&swtpm, index, key);
    let again = Component::open(&dir, tpm(&swtpm), Limits::default())
        .err()
        .expect("still rolled back")
        .to_string();
    assert!(again.contains("the state was rolled back"), "{again}");

    // A second log cannot claim an index in use, and a TPM-anchored state does not open on a
    // file anchor (nor a file-anchored one on the TPM).
    let claimed = Component::create(&root.path().join("second"), tpm(&swtpm), Limits::default())
        .err()
        .expect("index in use")
        .to_string();
    assert!(
        claimed.contains("already holds the counter of trusted log"),
        "{claimed}"
    );
    let fresh = root.path().join("fresh");
    drop(Component::create(&fresh, tpm_at(&swtpm, index + 1), Limits::default()).expect("create"));
    let on_file = Component::open(&fresh, anchor(&fresh), Limits::default())
        .err()
        .expect("made on a TPM")
        .to_string();
    assert!(on_file.contains("anchored in tpm"), "{on_file}");
    let filed = root.path().join("filed");
    drop(Component::create(&filed, anchor(&filed), Limits::default()).expect("create"));
    let on_tpm = Component::open(&filed, tpm_at(&swtpm, index + 2), Limits::default())
        .err()
        .expect("made on a file")
        .to_string();
    assert!(on_tpm.contains("anchored in file"), "{on_tpm}");
}

/// A crash between the store's commit and the counter's increment leaves the state one ahead of
/// the TPM: nothing about that change was attested, so it opens and the counter catches up. A
/// TPM that goes away stops the component; it serves again once the TPM is back.
#[test]
fn a_tpm_anchor_one_behind_catches_up_and_a_lost_tpm_stops_attesting() {
    let root = tempfile::tempdir().expect("tempdir");
    let Some(swtpm) = crate::swtpm::for_test(
        "a_tpm_anchor_one_behind_catches_up_and_a_lost_tpm_stops_attesting",
        &root.path().join("tpm"),
    ) else {
        return;
    };
    let index = crate::tpm::INDEX_FIRST + 9;
    let dir = root.path().join("a2m");
    let mut component =
        Component::create(&dir, tpm_at(&swtpm, index), Limits::default()).expect("create");
    let start = component.generation().expect("durable");
    component.append(0, [1; 32]).expect("room");
    drop(component);

    // The crash: the store took generation start + 2, the counter stayed at start + 1.
    let store = Store::open(&dir).expect("store");
    store
        .apply(&[crate::component::generation_op(start + 2)])
        .expect("commit");
    drop(store);
    let mut component =
        Component::open(&dir, tpm_at(&swtpm, index), Limits::default()).expect("one ahead opens");
    assert_eq!(component.generation(), Some(start + 2));
    let counted = TpmAnchor::new(&swtpm.tcti(), index)
        .expect("anchor")
        .read()
        .expect("read")
        .expect("defined");
    assert_eq!(counted.generation, start + 2);

    // The TPM goes away: the next change cannot be anchored, and nothing more is attested.
    let state = root.path().join("tpm");
    drop(swtpm);
    let stopped = component.append(0, [2; 32]).expect_err("no TPM");
    assert!(
        matches!(stopped, A2mError::Refused(Refusal::Stopped(_))),
        "{stopped}"
    );
    assert!(
        component.end(0, [0; 32]).is_err(),
        "a stopped log attests nothing"
    );
    drop(component);
    let swtpm = crate::swtpm::Swtpm::start(&state)
        .expect("restart")
        .expect("swtpm");
    let mut component =
        Component::open(&dir, tpm_at(&swtpm, index), Limits::default()).expect("serves again");
    // The refused append reached the store (one ahead of the counter again, caught up at open)
    // but was never attested; this one comes after it.
    assert_eq!(component.generation(), Some(start + 3));
    component.append(0, [2; 32]).expect("room");
    assert_eq!(component.generation(), Some(start + 4));
}

fn tpm_at(swtpm: &crate::swtpm::Swtpm, index: u32) -> Box<dyn Anchor> {
    Box::new(TpmAnchor::new(&swtpm.tcti(), index).expect("tpm anchor"))
}

/// Deletes the counter at `index` and defines it again under `key`'s name, incremented once: what
/// a host that holds the TPM's owner authorization can do.
#[cfg(feature = "tpm")]
fn redefine(swtpm: &crate::swtpm::Swtpm, index: u32, key: bulwark_core::sign::PublicKey) {
    use std::str::FromStr;
    use tss_esapi::handles::{NvIndexHandle, NvIndexTpmHandle, TpmHandle};
    use tss_esapi::interface_types::resource_handles::{NvAuth, Provision};

    let mut context = tss_esapi::Context::new(
        tss_esapi::tcti_ldr::TctiNameConf::from_str(&swtpm.tcti()).expect("tcti"),
    )
    .expect("context");
    let nv = NvIndexTpmHandle::new(index).expect("index");
    let handle: NvIndexHandle = context
        .execute_without_session(|context| context.tr_from_tpm_public(TpmHandle::NvIndex(nv)))
        .expect("open")
        .into();
    context
        .execute_with_session(
            Some(tss_esapi::interface_types::session_handles::AuthSession::Password),
            |context| context.nv_undefine_space(Provision::Owner, handle),
        )
        .expect("undefine");
    let public = crate::tpm::counter_public(index, key).expect("public");
    let handle = context
        .execute_with_session(
            Some(tss_esapi::interface_types::session_handles::AuthSession::Password),
            |context| context.nv_define_space(Provision::Owner, None, public.clone()),
        )
        .expect("define again");
    context
        .execute_with_session(
            Some(tss_esapi::interface_types::session_handles::AuthSession::Password),
            |context| context.nv_increment(NvAuth::NvIndex(handle), handle),
        )
        .expect("first increment");
}

#[cfg(not(feature = "tpm"))]
fn redefine(_: &crate::swtpm::Swtpm, _: u32, _: bulwark_core::sign::PublicKey) {
    unreachable!("the TPM tests skip without the `tpm` feature")
}

/// With a TPM anchor the log's key is sealed by the TPM: the store holds only the sealed form,
/// the same TPM opens it again (attestations after a reboot verify under the same key), and the
/// directory copied to a machine with another TPM cannot be served there: no second copy of the
/// log can sign.
#[test]
fn a_tpm_anchored_log_keeps_its_key_sealed_by_that_tpm_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let test = "a_tpm_anchored_log_keeps_its_key_sealed_by_that_tpm_alone";
    let Some(swtpm) = crate::swtpm::for_test(test, &root.path().join("tpm")) else {
        return;
    };
    let index = crate::tpm::INDEX_FIRST + 11;
    let dir = root.path().join("a2m");
    let mut component =
        Component::create(&dir, tpm_at(&swtpm, index), Limits::default()).expect("create");
    let key = component.public_key();
    component.append(0, [1; 32]).expect("room");
    drop(component);
    let store = Store::open(&dir).expect("store");
    assert_eq!(
        store
            .get(crate::component::IDENTITY, crate::component::SECRET)
            .expect("read"),
        None,
        "the seed is not stored as it is"
    );
    let sealed = store
        .get(crate::component::IDENTITY, crate::component::SEALED)
        .expect("read")
        .expect("the sealed seed is stored");
    drop(store);

    let swtpm = swtpm.restart().expect("reboot");
    let mut component =
        Component::open(&dir, tpm_at(&swtpm, index), Limits::default()).expect("open");
    assert_eq!(component.public_key(), key);
    let end = component.end(0, [5; 32]).expect("end");
    Expected::end(0, [5; 32])
        .check(&key, end.to_unverified())
        .expect("verifies under the same key");
    drop(component);

    // Copied to another machine: its TPM cannot open the key.
    let Some(other) = crate::swtpm::for_test(test, &root.path().join("other-tpm")) else {
        return;
    };
    let copy = root.path().join("copy");
    std::fs::create_dir_all(&copy).expect("mkdir");
    std::fs::copy(dir.join("state.redb"), copy.join("state.redb")).expect("copy");
    let refused = Component::open(&copy, tpm_at(&other, index), Limits::default())
        .err()
        .expect("another TPM")
        .to_string();
    assert!(
        refused.contains("cannot open this trusted log's key"),
        "{refused}"
    );

    // A sealed key damaged on disk is refused, never a panic.
    let mut anchor = TpmAnchor::new(&swtpm.tcti(), index).expect("anchor");
    for cut in [0, 1, 2, sealed.len() / 2, sealed.len() - 1] {
        assert!(anchor.unseal(&sealed[..cut]).is_err(), "cut at {cut}");
    }
    assert!(anchor.unseal(&vec![7; 4096]).is_err());
}

/// Two copies of one TPM-anchored log on the same machine share its counter: each reads it back
/// after its increment, so the first change of the second copy finds the count moved and stops
/// both before either attests to a change the other did not make.
#[test]
fn a_copy_of_a_tpm_anchored_log_on_the_same_tpm_is_caught_at_its_first_change() {
    let root = tempfile::tempdir().expect("tempdir");
    let test = "a_copy_of_a_tpm_anchored_log_on_the_same_tpm_is_caught_at_its_first_change";
    let Some(swtpm) = crate::swtpm::for_test(test, &root.path().join("tpm")) else {
        return;
    };
    let index = crate::tpm::INDEX_FIRST + 13;
    let original = root.path().join("original");
    let mut component =
        Component::create(&original, tpm_at(&swtpm, index), Limits::default()).expect("create");
    component.append(0, [1; 32]).expect("room");
    drop(component);
    let copy = root.path().join("copy");
    std::fs::create_dir_all(&copy).expect("mkdir");
    std::fs::copy(original.join("state.redb"), copy.join("state.redb")).expect("copy");

    let mut first = Component::open(&original, tpm_at(&swtpm, index), Limits::default())
        .expect("the original opens");
    let mut second =
        Component::open(&copy, tpm_at(&swtpm, index), Limits::default()).expect("so does the copy");
    first.append(0, [2; 32]).expect("the first change");
    let caught = second
        .append(0, [3; 32])
        .expect_err("the copy's change")
        .to_string();
    assert!(caught.contains("another process advances"), "{caught}");
    assert!(
        second.end(0, [0; 32]).is_err(),
        "the copy attests nothing more"
    );
    assert!(
        first.append(0, [4; 32]).is_err(),
        "the original finds its counter moved too"
    );
}

/// A new identity that cannot be stored gives its TPM counter back: the index is free for the
/// retry, instead of being refused as another log's.
#[test]
fn a_tpm_anchored_log_that_could_not_be_made_frees_its_index() {
    let root = tempfile::tempdir().expect("tempdir");
    let test = "a_tpm_anchored_log_that_could_not_be_made_frees_its_index";
    let Some(swtpm) = crate::swtpm::for_test(test, &root.path().join("tpm")) else {
        return;
    };
    let index = crate::tpm::INDEX_FIRST + 15;
    // A file where the directory should be: the store cannot be made, after the claim.
    let blocked = root.path().join("blocked");
    std::fs::write(&blocked, b"not a directory").expect("write");
    Component::create(&blocked, tpm_at(&swtpm, index), Limits::default())
        .err()
        .expect("no directory");
    assert_eq!(
        TpmAnchor::new(&swtpm.tcti(), index)
            .expect("anchor")
            .read()
            .expect("read"),
        None,
        "the index was given back"
    );
    Component::create(
        &root.path().join("a2m"),
        tpm_at(&swtpm, index),
        Limits::default(),
    )
    .expect("the retry finds the index free");
}
