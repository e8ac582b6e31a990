//! Unit tests of the M-PoWerStore machines, driven by a synchronous in-test harness. Whole-system
//! schedules (delays, crashes, Byzantine catalogues) live in `bulwark-sim`.

use super::*;
use bulwark_core::Epoch;
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::membership::Incarnation;
use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, GroupId, Slot, Time};
use bytes::Bytes;
use std::sync::Arc;

const READER: Access = Access {
    write: false,
    read: true,
};
const WRITER: Access = Access {
    write: true,
    read: true,
};

/// Writers the harness's servers share keys with.
const WRITERS: u32 = 16;

struct Harness {
    config: ClientConfig,
    /// Writer 0's keys, which the harness writes with.
    keys: Arc<WriterKeys>,
    /// Every server's keys shared with the writers, by slot.
    server_keys: Vec<ServerKeys>,
    /// Every writer's signing key, by client id.
    writer_secrets: Vec<SecretKey>,
    node_secrets: Vec<SecretKey>,
    servers: Vec<Server>,
    /// Each server's storage: every change it emitted is applied at once.
    disks: Vec<MemoryFragments>,
    now: Time,
    next_op: u64,
    /// Servers that drop everything.
    down: Vec<bool>,
    /// The nodes reads ask for fragments first (`ReadOp::asking_fragments_of`).
    fragments_from: Vec<Slot>,
}

impl Harness {
    fn new(f: usize) -> Harness {
        Harness::incarnation(f, 1, Incarnation::new(&[], Epoch(0)), Epoch(0))
    }

    /// A group of nodes whose signing keys are seeded from `first_seed` on, serving
    /// `incarnation` in `epoch`; its writers are the same as every harness's.
    fn incarnation(f: usize, first_seed: u8, incarnation: Incarnation, epoch: Epoch) -> Harness {
        let n = 3 * f + 1;
        // Real agreements, as nodes and clients make them.
        let writer_secrets: Vec<SecretKey> = (0..WRITERS)
            .map(|w| SecretKey::from_seed(&[w as u8 + 100; 32]))
            .collect();
        let node_secrets: Vec<SecretKey> = (0..n)
            .map(|i| SecretKey::from_seed(&[i as u8 + first_seed; 32]))
            .collect();
        let server_keys: Vec<ServerKeys> = node_secrets
            .iter()
            .map(|node| {
                ServerKeys::derived(
                    node,
                    (0..WRITERS).map(|w| (ClientId(w), writer_secrets[w as usize].public_key())),
                )
            })
            .collect();
        let servers = (0..n)
            .map(|i| {
                let config = ServerConfig {
                    epoch,
                    incarnation,
                    ..ServerConfig::new(Slot(i as u32), f)
                };
                Server::new(config, server_keys[i].clone())
            })
            .collect();
        let keys = writer_keys(&writer_secrets[0], &node_secrets);
        Harness {
            config: ClientConfig {
                epoch,
                incarnation,
                ..ClientConfig::new(f)
            },
            keys,
            server_keys,
            writer_secrets,
            node_secrets,
            servers,
            disks: vec![MemoryFragments::default(); n],
            now: Time(0),
            next_op: 1,
            down: vec![false; n],
            fragments_from: Vec::new(),
        }
    }

    /// The same group, named `group` (a group of a certified ring): its servers start afresh.
    fn named(mut self, group: GroupId) -> Harness {
        self.config.group = group;
        self.servers = (0..self.servers.len())
            .map(|i| {
                let config = ServerConfig {
                    epoch: self.config.epoch,
                    group,
                    incarnation: self.config.incarnation,
                    ..ServerConfig::new(Slot(i as u32), self.config.f)
                };
                Server::new(config, self.server_keys[i].clone())
            })
            .collect();
        self
    }

    /// The keys of writer `writer`.
    fn keys_of(&self, writer: ClientId) -> Arc<WriterKeys> {
        writer_keys(&self.writer_secrets[writer.0 as usize], &self.node_secrets)
    }

    fn op(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    fn deliver(&mut self, access: Access, to: Slot, request: Request) -> Option<Response> {
        if self.down[to.index()] {
            return None;
        }
        self.handle(to, access, request).reply
    }

    /// Hands `request` to server `to` and applies its changes to that server's disk.
    fn handle(&mut self, to: Slot, access: Access, request: Request) -> Handled {
        let i = to.index();
        let handled =
            self.servers[i].handle(self.now, ClientId(0), access, request, &self.disks[i]);
        for change in &handled.changes {
            self.disks[i].apply(change);
        }
        handled
    }

    fn write_op(&mut self, key: &Key, value: Option<&[u8]>) -> WriteOp {
        let op = self.op();
        WriteOp::new(
            self.config.clone(),
            self.keys.clone(),
            Arc::new(ReedSolomonSimd),
            key.clone(),
            op,
            Pid {
                writer: ClientId(0),
                seq: op.0,
            },
            [op.0 as u8; 32],
            value.map(Bytes::copy_from_slice),
        )
    }

    /// Runs a write to completion, delivering to every live server in node order. Messages still
    /// in flight when the writer finishes are delivered too: channels are reliable.
    fn write(&mut self, key: &Key, value: Option<&[u8]>) -> WriteOutcome {
        self.write_where(key, value, |_, _| true)
            .expect("write completes")
    }

    /// A write whose requests reach a server only where `reaches` says so: a writer that crashes
    /// part-way through a broadcast. `None` when it could not complete.
    fn write_where(
        &mut self,
        key: &Key,
        value: Option<&[u8]>,
        mut reaches: impl FnMut(Slot, &RequestBody) -> bool,
    ) -> Option<WriteOutcome> {
        let mut write = self.write_op(key, value);
        let mut queue: std::collections::VecDeque<Outbound> = write.start().into();
        let mut outcome = None;
        while let Some((to, request)) = queue.pop_front() {
            if !reaches(to, &request.body) {
                continue;
            }
            if let Some(response) = self.deliver(WRITER, to, request) {
                if outcome.is_some() {
                    continue;
                }
                match write.on_response(to, response) {
                    Step::Continue(more) => queue.extend(more),
                    Step::Done(result) => outcome = Some(result.expect("write succeeds")),
                }
            }
        }
        outcome
    }

    fn read_with(
        &mut self,
        key: &Key,
        respond: impl FnMut(&mut Harness, Slot, Request) -> Option<Response>,
    ) -> ReadOutcome {
        self.try_read_with(key, respond)
            .expect("read did not complete")
    }

    /// A read whose requests `respond` answers (or not); `None` when the read is left waiting
    /// with nothing more in flight.
    fn try_read_with(
        &mut self,
        key: &Key,
        mut respond: impl FnMut(&mut Harness, Slot, Request) -> Option<Response>,
    ) -> Option<ReadOutcome> {
        let op = self.op();
        let mut read = ReadOp::new(
            self.config.clone(),
            Arc::new(ReedSolomonSimd),
            key.clone(),
            op,
        )
        .asking_fragments_of(&self.fragments_from);
        self.run_read(&mut read, &mut respond)
            .map(|result| result.expect("read succeeds"))
    }

    /// Runs `read` until it ends or nothing is left in flight after [`TIMEOUTS`] ticks of its
    /// timer (each tick fired once nothing is in flight).
    fn run_read(
        &mut self,
        read: &mut ReadOp,
        respond: &mut impl FnMut(&mut Harness, Slot, Request) -> Option<Response>,
    ) -> Option<Result<ReadOutcome, ProtocolError>> {
        let mut queue: std::collections::VecDeque<Outbound> = read.start().into();
        for _ in 0..=TIMEOUTS {
            while let Some((to, request)) = queue.pop_front() {
                if let Some(response) = respond(self, to, request) {
                    match read.on_response(to, response) {
                        Step::Continue(more) => queue.extend(more),
                        Step::Done(result) => return Some(result),
                    }
                }
            }
            queue.extend(read.on_timeout());
        }
        None
    }

    fn read(&mut self, key: &Key) -> ReadOutcome {
        self.read_with(key, |h, to, request| h.deliver(READER, to, request))
    }
}

/// How many times a read's retransmission timer fires before the harness gives up on it.
const TIMEOUTS: usize = 3;

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

// Reference: PoWerStore §7.2 "Basics".
#[test]
fn read_before_any_write_is_absent() {
    let mut h = Harness::new(1);
    let outcome = h.read(&key("k"));
    assert_eq!(outcome.value, None);
    assert_eq!(outcome.ts, None);
}

#[test]
fn write_then_read_for_small_and_coded_values_and_every_f() {
    for f in 1..=3 {
        let mut h = Harness::new(f);
        for len in [1usize, 100, 4096, 4097, 70_000] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let written = h.write(&key("k"), Some(&value));
            let outcome = h.read(&key("k"));
            assert_eq!(
                outcome.value.as_deref(),
                Some(&value[..]),
                "f={f} len={len}"
            );
            assert_eq!(outcome.ts, Some(written.ts));
            assert!(!outcome.repaired);
            assert!(outcome.one_round, "nothing concurrent: COLLECT is enough");
            assert!(outcome.evidence.is_empty());
        }
    }
}

#[test]
fn sequential_writes_get_increasing_timestamps_and_reads_follow() {
    let mut h = Harness::new(1);
    let mut last: Option<Timestamp> = None;
    for i in 0..5u8 {
        let out = h.write(&key("k"), Some(&[i; 10]));
        if let Some(last) = last {
            assert_eq!(out.ts.cmp_order(&last), Ordering::Greater);
            assert_eq!(out.ts.num, last.num + 1, "non-skipping");
        }
        last = Some(out.ts);
        assert_eq!(h.read(&key("k")).value.as_deref(), Some(&[i; 10][..]));
    }
}

#[test]
fn delete_is_a_tombstone_that_reads_as_absent() {
    let mut h = Harness::new(1);
    h.write(&key("k"), Some(b"v"));
    let deleted = h.write(&key("k"), None);
    let outcome = h.read(&key("k"));
    assert_eq!(outcome.value, None);
    assert_eq!(outcome.ts, Some(deleted.ts));
    assert_eq!(h.servers[0].stats().objects, 0);
    h.write(&key("k"), Some(b"again"));
    assert_eq!(h.read(&key("k")).value.as_deref(), Some(&b"again"[..]));
}

#[test]
fn keys_are_independent() {
    let mut h = Harness::new(1);
    h.write(&key("a"), Some(b"1"));
    h.write(&key("b"), Some(b"2"));
    assert_eq!(h.read(&key("a")).value.as_deref(), Some(&b"1"[..]));
    assert_eq!(h.read(&key("b")).value.as_deref(), Some(&b"2"[..]));
    assert_eq!(h.read(&key("c")).value, None);
}

// Reference: PoWerStore Th 5.10: with f servers silent, operations complete.
#[test]
fn operations_complete_with_f_servers_down() {
    let mut h = Harness::new(2);
    h.down[1] = true;
    h.down[5] = true;
    let value = vec![7u8; 50_000];
    h.write(&key("k"), Some(&value));
    assert_eq!(h.read(&key("k")).value.as_deref(), Some(&value[..]));
}

#[test]
fn a_corrupted_fragment_is_blamed_and_the_value_still_returned() {
    let mut h = Harness::new(1);
    // FILTER is what this tests: no read may end after COLLECT.
    h.config.one_round = false;
    let value = vec![3u8; 20_000];
    h.write(&key("k"), Some(&value));
    let outcome = h.read_with(&key("k"), |h, to, request| {
        let mut response = h.deliver(READER, to, request)?;
        if to == Slot(0)
            && let ResponseBody::FilterAck(FilterAck::Entry { fragment, .. }) = &mut response.body
        {
            let mut bytes = fragment.to_vec();
            bytes[0] ^= 0xff;
            *fragment = Bytes::from(bytes);
        }
        Some(response)
    });
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert_eq!(
        outcome.evidence,
        vec![Evidence {
            node: Slot(0),
            kind: EvidenceKind::CorruptFragment
        }]
    );
}

#[test]
fn a_forged_cross_checksum_cannot_gather_f_plus_one_vouchers() {
    let mut h = Harness::new(1);
    // FILTER is what this tests: no read may end after COLLECT.
    h.config.one_round = false;
    let value = vec![5u8; 10_000];
    h.write(&key("k"), Some(&value));
    let forged_value = vec![6u8; 10_000];
    let outcome = h.read_with(&key("k"), |h, to, request| {
        let mut response = h.deliver(READER, to, request)?;
        if to == Slot(2)
            && let ResponseBody::FilterAck(FilterAck::Entry { fragment, cc, .. }) =
                &mut response.body
        {
            // A self-consistent forgery: a fragment of another value and its own checksum.
            let layout = cc.layout;
            let fragments = ReedSolomonSimd.encode(&layout, &forged_value).unwrap();
            cc.hashes = fragments.iter().map(|f| fragment_digest(f)).collect();
            *fragment = fragments[2].clone();
        }
        Some(response)
    });
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert!(
        outcome
            .evidence
            .iter()
            .any(|e| e.node == Slot(2) && e.kind == EvidenceKind::ConflictingMetadata)
    );
}

#[test]
fn a_fabricated_high_candidate_is_excluded() {
    let mut h = Harness::new(1);
    h.write(&key("k"), Some(b"real"));
    let fake_ts = Timestamp {
        num: 1_000,
        pid: Pid {
            writer: ClientId(9),
            seq: 9,
        },
        tag: Tag([1; 32]),
    };
    let outcome = h.read_with(&key("k"), |h, to, request| {
        let mut response = h.deliver(READER, to, request)?;
        if to == Slot(3) {
            match &mut response.body {
                ResponseBody::CollectAck { lc, .. } => {
                    *lc = Some(Candidate {
                        ts: fake_ts,
                        nonce: Nonce([2; 32]),
                        vec: MacVec(vec![Tag([0; 32]); 4]),
                    });
                }
                // It also insists the fake is valid: "not lower" cannot stop exclusion by 2f+1.
                ResponseBody::FilterAck(ack) => *ack = FilterAck::MacOnly { ts: fake_ts },
                _ => {}
            }
        }
        Some(response)
    });
    assert_eq!(outcome.value.as_deref(), Some(&b"real"[..]));
    for server in &h.servers[..3] {
        assert_ne!(
            server.lc(&key("k")).unwrap().ts,
            fake_ts,
            "correct servers never adopt a forgery"
        );
    }
}

// Reference: spec §4.8(a). A Byzantine server offers a twin of the highest candidate carrying the
// genuine MAC vector but a garbage nonce, while the genuine candidate arrives with a corrupted
// vector. Picking the twin would skip REPAIR and leave the value at too few correct servers.
#[test]
fn the_twin_with_a_garbage_nonce_is_never_selected() {
    let mut h = Harness::new(1);
    h.write(&key("k"), Some(b"v4"));
    h.write(&key("k"), Some(b"v5"));
    let genuine = h.servers[0].lc(&key("k")).unwrap().clone();
    let mut corrupted = genuine.clone();
    corrupted.vec.0[2] = Tag([0xee; 32]);
    let twin = Candidate {
        ts: genuine.ts,
        nonce: Nonce([0x66; 32]),
        vec: genuine.vec.clone(),
    };
    let mut repair_sent = None;
    let outcome = h.read_with(&key("k"), |h, to, request| {
        if let RequestBody::Repair { candidate } = &request.body {
            repair_sent = Some(candidate.clone());
        }
        let mut response = h.deliver(READER, to, request)?;
        if let ResponseBody::CollectAck { lc, .. } = &mut response.body {
            *lc = Some(if to == Slot(0) {
                twin.clone()
            } else {
                corrupted.clone()
            });
        }
        Some(response)
    });
    assert_eq!(outcome.value.as_deref(), Some(&b"v5"[..]));
    assert!(
        outcome.repaired,
        "the genuine candidate had a corrupted vector, so REPAIR must run"
    );
    let repaired = repair_sent.expect("REPAIR sent");
    assert_eq!(
        repaired.nonce, genuine.nonce,
        "the twin's garbage nonce is never written back"
    );
    assert_eq!(repaired.vec, genuine.vec);
}

// Reference: PoWerStore §5.2: Byzantine readers cannot get a fabricated candidate into lc.
#[test]
fn a_malicious_reader_cannot_plant_fabricated_or_replayed_candidates() {
    let mut h = Harness::new(1);
    let first = h.write(&key("k"), Some(b"one"));
    let old = h.servers[0].lc(&key("k")).unwrap().clone();
    h.write(&key("k"), Some(b"two"));
    let forged = |num: u64, nonce: u8| Candidate {
        ts: Timestamp {
            num,
            pid: Pid {
                writer: ClientId(0),
                seq: 77,
            },
            tag: Tag([nonce; 32]),
        },
        nonce: Nonce([nonce; 32]),
        vec: MacVec(vec![Tag([nonce; 32]); 4]),
    };
    // Right (num, pid) as the latest write but a made-up tag (§4.8(b)), a far-future timestamp,
    // and a replay of an old genuine candidate.
    let mut bad_tag = h.servers[0].lc(&key("k")).unwrap().clone();
    bad_tag.ts.tag = Tag([0; 32]);
    let attacks = vec![bad_tag, forged(50, 1), forged(1 << 40, 2), old.clone()];
    for node in 0..4 {
        let request = Request {
            op: OpId(1),
            attempt: 0,
            epoch: Epoch(0),
            group: GroupId(0),
            key: key("k"),
            body: RequestBody::Filter {
                candidates: attacks.clone(),
            },
        };
        h.deliver(READER, Slot(node), request);
        for candidate in &attacks {
            let request = Request {
                op: OpId(2),
                attempt: 0,
                epoch: Epoch(0),
                group: GroupId(0),
                key: key("k"),
                body: RequestBody::Repair {
                    candidate: candidate.clone(),
                },
            };
            h.deliver(READER, Slot(node), request);
        }
    }
    for server in &h.servers {
        let lc = server.lc(&key("k")).unwrap();
        assert_eq!(
            lc.ts.num,
            first.ts.num + 1,
            "lc still the genuine latest write"
        );
        assert_ne!(lc.ts.tag, Tag([0; 32]));
    }
    assert_eq!(h.read(&key("k")).value.as_deref(), Some(&b"two"[..]));
    // And the next write still gets the next timestamp: nothing was skipped.
    assert_eq!(h.write(&key("k"), Some(b"three")).ts.num, first.ts.num + 2);
}

#[test]
fn readers_cannot_write_and_writers_are_told_when_refused() {
    let mut h = Harness::new(1);
    let mut write = h.write_op(&key("k"), Some(b"x"));
    let mut result = None;
    for (to, request) in write.start() {
        let response = h.deliver(READER, to, request).unwrap();
        assert_eq!(response.body, ResponseBody::Refused(Refusal::NotWriter));
        if let Step::Done(r) = write.on_response(to, response) {
            result = Some(r);
            break;
        }
    }
    match result {
        Some(Err(ProtocolError::Refused {
            refusal: Refusal::NotWriter,
            nodes,
        })) => assert_eq!(nodes.len(), 2),
        other => panic!("expected refusal after f+1 nodes, got {other:?}"),
    }
}

#[test]
fn a_single_refusal_does_not_end_an_operation() {
    let mut h = Harness::new(1);
    h.write(&key("k"), Some(b"x"));
    let outcome = h.read_with(&key("k"), |h, to, request| {
        if to == Slot(1) {
            return Some(Response {
                op: request.op,
                attempt: request.attempt,
                body: ResponseBody::Refused(Refusal::NotReader),
            });
        }
        h.deliver(READER, to, request)
    });
    assert_eq!(outcome.value.as_deref(), Some(&b"x"[..]));
}

#[test]
fn server_refuses_malformed_store_and_oversized_filter() {
    let mut h = Harness::new(1);
    let mut write = h.write_op(&key("k"), Some(&[1u8; 9000]));
    let clock: Vec<Outbound> = write.start();
    let mut stores = Vec::new();
    for (to, request) in clock {
        let response = h.deliver(WRITER, to, request).unwrap();
        if let Step::Continue(more) = write.on_response(to, response) {
            stores.extend(more);
        }
    }
    let (to, mut request) = stores.into_iter().next().unwrap();
    if let RequestBody::Store { fragment, .. } = &mut request.body {
        let mut bytes = fragment.to_vec();
        bytes[10] ^= 1;
        *fragment = Bytes::from(bytes);
    }
    let handled = h.handle(to, WRITER, request);
    assert!(matches!(handled.refused, Some(Refusal::Malformed(_))));
    assert!(
        handled.changes.is_empty(),
        "nothing persisted for a refused STORE"
    );

    let candidates = vec![
        Candidate {
            ts: Timestamp {
                num: 1,
                pid: Pid {
                    writer: ClientId(0),
                    seq: 0
                },
                tag: Tag([0; 32])
            },
            nonce: Nonce([0; 32]),
            vec: MacVec(vec![])
        };
        9
    ];
    let request = Request {
        op: OpId(1),
        attempt: 0,
        epoch: Epoch(0),
        group: GroupId(0),
        key: key("k"),
        body: RequestBody::Filter { candidates },
    };
    assert!(matches!(
        h.handle(Slot(0), READER, request).refused,
        Some(Refusal::Malformed(_))
    ));
}

#[test]
fn acknowledgements_wait_for_their_changes() {
    // Every ack that changes state carries the change with it, so the driver persists first.
    let mut h = Harness::new(1);
    let mut write = h.write_op(&key("k"), Some(b"x"));
    let mut queue: std::collections::VecDeque<Outbound> = write.start().into();
    while let Some((to, request)) = queue.pop_front() {
        let name = request.body.name();
        let handled = h.handle(to, WRITER, request);
        match name {
            "store" => assert!(matches!(
                handled.changes.as_slice(),
                [Change::PutHist { .. }]
            )),
            "complete" => assert!(matches!(handled.changes.as_slice(), [Change::SetLc { .. }])),
            _ => assert!(handled.changes.is_empty()),
        }
        if let Step::Continue(more) = write.on_response(to, handled.reply.unwrap()) {
            queue.extend(more);
        }
    }
}

#[test]
fn concurrent_writers_with_equal_num_are_ordered_by_pid() {
    let mut h = Harness::new(1);
    let mut a = h.write_op(&key("k"), Some(b"a"));
    let mut b = h.write_op(&key("k"), Some(b"b"));
    // Both CLOCK before either stores: they pick the same num.
    let mut pending = Vec::new();
    for w in [&mut a, &mut b] {
        for (to, request) in w.start() {
            let response = h.deliver(WRITER, to, request).unwrap();
            if let Step::Continue(more) = w.on_response(to, response) {
                pending.push(more);
            }
        }
    }
    let mut finished = Vec::new();
    for (w, first) in [&mut a, &mut b]
        .into_iter()
        .zip(pending.into_iter().filter(|m| !m.is_empty()))
    {
        let mut queue: std::collections::VecDeque<Outbound> = first.into();
        while let Some((to, request)) = queue.pop_front() {
            let response = h.deliver(WRITER, to, request).unwrap();
            match w.on_response(to, response) {
                Step::Continue(more) => queue.extend(more),
                Step::Done(r) => {
                    finished.push(r.unwrap());
                    break;
                }
            }
        }
    }
    assert_eq!(finished[0].ts.num, finished[1].ts.num);
    let winner = if finished[0].ts.cmp_order(&finished[1].ts) == Ordering::Greater {
        b"a"
    } else {
        b"b"
    };
    assert_eq!(h.read(&key("k")).value.as_deref(), Some(&winner[..]));
}

// Reference: spec §3.8. Endless overwrites keep storage bounded...
#[test]
fn garbage_collection_bounds_versions_under_endless_overwrites() {
    let mut h = Harness::new(1);
    for i in 0..200u32 {
        h.now = Time(u64::from(i) * 1_000);
        h.write(&key("k"), Some(&i.to_be_bytes()));
    }
    for server in &h.servers {
        let max = server.config().superseded_max;
        assert!(
            server.versions(&key("k")) <= max + 1,
            "{} versions",
            server.versions(&key("k"))
        );
        assert!(server.stats().collected >= 150);
    }
    assert_eq!(
        h.read(&key("k")).value.as_deref(),
        Some(&199u32.to_be_bytes()[..])
    );
}

// ...and a read whose version was collected between its rounds asks again instead of going stale.
#[test]
fn a_read_whose_version_was_collected_restarts_and_returns_a_newer_value() {
    let mut h = Harness::new(1);
    // FILTER is what this tests: no read may end after COLLECT.
    h.config.one_round = false;
    h.write(&key("k"), Some(b"old"));
    let mut overwritten = false;
    let outcome = h.read_with(&key("k"), |h, to, request| {
        if matches!(request.body, RequestBody::Filter { .. }) && !overwritten {
            // Between COLLECT and FILTER the key is overwritten and the grace period passes.
            overwritten = true;
            h.write(&key("k"), Some(b"new"));
            h.now = Time(1_000_000);
            for s in &mut h.servers {
                s.tick(Time(1_000_000));
            }
        }
        h.deliver(READER, to, request)
    });
    assert_eq!(outcome.value.as_deref(), Some(&b"new"[..]));
    assert_eq!(outcome.restarts, 1);
}

#[test]
fn restored_state_serves_the_same_reads() {
    let mut h = Harness::new(1);
    let mut changes = vec![Vec::new(); 4];
    let mut write = h.write_op(&key("k"), Some(&[9u8; 30_000]));
    let mut queue: std::collections::VecDeque<Outbound> = write.start().into();
    while let Some((to, request)) = queue.pop_front() {
        let handled = h.handle(to, WRITER, request);
        changes[to.index()].extend(handled.changes);
        if let Step::Continue(more) = write.on_response(to, handled.reply.unwrap()) {
            queue.extend(more);
        }
    }
    // Rebuild every server from its durable changes alone.
    for (i, list) in changes.into_iter().enumerate() {
        let mut fresh = Server::new(
            ServerConfig::new(Slot(i as u32), 1),
            h.server_keys[i].clone(),
        );
        let mut disk = MemoryFragments::default();
        for change in &list {
            disk.apply(change);
        }
        fresh.restore_key(key("k"), disk.stored_key(&key("k")), Time(0));
        h.servers[i] = fresh;
    }
    assert_eq!(h.read(&key("k")).value.as_deref(), Some(&[9u8; 30_000][..]));
}

#[test]
fn a_damaged_fragment_on_disk_is_never_served() {
    let mut h = Harness::new(1);
    let value = [5u8; 30_000];
    h.write(&key("k"), Some(&value));
    // Bit rot in s0's stored fragment.
    let ts = h.servers[0].lc(&key("k")).unwrap().ts;
    let stored = &mut h.disks[0]
        .entries
        .get_mut(&(key("k"), ts))
        .unwrap()
        .fragment;
    let mut bytes = stored.to_vec();
    bytes[7] ^= 0x40;
    *stored = Bytes::from(bytes);
    let outcome = h.read(&key("k"));
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert!(outcome.evidence.is_empty(), "{:?}", outcome.evidence);
    // s0 withholds the damaged entry from COLLECT and FILTER alike.
    assert!(h.servers[0].stats().damaged_fragments >= 1);
    assert_eq!(h.servers[1].stats().damaged_fragments, 0);
}

/// The garbage-collection stall: a read's only candidate `v1` ends up with one vouching server
/// (s0), one that collected it for a newer `lc` (s1), one that never stored it (s2) and a silent
/// one (s3). Nothing can make `v1` safe or exclude it; only the `lc` that s1 offers moves the read
/// on. `None` when the read is left waiting.
fn read_across_a_collected_version(h: &mut Harness) -> Option<ReadOutcome> {
    let k = key("k");
    h.write_where(&k, Some(b"v1"), |to, body| {
        !(to == Slot(2) && matches!(body, RequestBody::Store { .. }))
    })
    .expect("v1 completes without s2's STORE");
    let mut interleaved = false;
    h.try_read_with(&k, |h, to, request| {
        if matches!(request.body, RequestBody::Filter { .. }) && !interleaved {
            interleaved = true;
            // Between COLLECT and FILTER: v2 is stored on s0, s1, s3 and completed on s1 only
            // (its writer crashes), the grace period passes, and s3 falls silent.
            let v2 = h.write_where(&k, Some(b"v2"), |to, body| match body {
                RequestBody::Store { .. } => to != Slot(2),
                RequestBody::Complete { .. } => to == Slot(1),
                _ => true,
            });
            assert!(v2.is_none(), "v2's writer crashed during COMPLETE");
            h.now = Time(1_000_000);
            for server in &mut h.servers {
                server.tick(Time(1_000_000));
            }
            assert_eq!(h.servers[0].versions(&k), 2, "s0 still holds v1 and v2");
            assert_eq!(h.servers[1].versions(&k), 1, "s1 collected v1");
            h.down[3] = true;
        }
        h.deliver(READER, to, request)
    })
}

#[test]
fn a_read_whose_version_was_collected_from_some_servers_takes_the_offered_newer_one() {
    let mut h = Harness::new(1);
    // FILTER is what this tests: no read may end after COLLECT.
    h.config.one_round = false;
    let outcome = read_across_a_collected_version(&mut h).expect("the read completes");
    assert_eq!(outcome.value.as_deref(), Some(&b"v2"[..]));
    assert_eq!(outcome.restarts, 1);
    assert!(outcome.evidence.is_empty(), "{:?}", outcome.evidence);

    // The control: the same schedule with a reader that ignores offers waits forever.
    let mut h = Harness::new(1);
    h.config.one_round = false;
    h.config.mutations.no_offers = true;
    assert!(read_across_a_collected_version(&mut h).is_none());
}

#[test]
fn a_server_never_answers_lower_than_a_collected_version_it_cannot_validate() {
    let mut h = Harness::new(1);
    let k = key("k");
    h.write(&k, Some(b"v1"));
    let v1 = h.servers[0].lc(&k).cloned().unwrap();
    h.write(&k, Some(b"v2"));
    let v2 = h.servers[0].lc(&k).cloned().unwrap();
    h.now = Time(1_000_000);
    h.servers[0].tick(h.now);
    assert_eq!(h.servers[0].versions(&k), 1);
    // v1 with its MAC vector corrupted at s0's slot: s0 can no longer validate it, by Hist or MAC.
    let mut bigmac = v1.clone();
    bigmac.vec.0[0].0[0] ^= 1;
    let request = Request {
        op: OpId(7),
        attempt: 0,
        epoch: Epoch(0),
        group: GroupId(0),
        key: k.clone(),
        body: RequestBody::Filter {
            candidates: vec![bigmac],
        },
    };
    let reply = h.deliver(READER, Slot(0), request).unwrap();
    assert_eq!(
        reply.body,
        ResponseBody::FilterAck(FilterAck::Superseded {
            ts: v1.ts,
            newer: v2
        }),
        "'superseded' is not lower than v1: v1 stays a candidate"
    );
}

#[test]
fn a_false_offer_is_excluded_and_its_maker_blamed() {
    let mut h = Harness::new(1);
    // FILTER is what this tests: no read may end after COLLECT.
    h.config.one_round = false;
    let k = key("k");
    // s2 misses v1's STORE, so the first FILTER round has one voucher when s1 is slow.
    h.write_where(&k, Some(b"v1"), |to, body| {
        !(to == Slot(2) && matches!(body, RequestBody::Store { .. }))
    })
    .unwrap();
    let outcome = h.read_with(&k, |h, to, request| {
        let first_filter =
            matches!(request.body, RequestBody::Filter { .. }) && request.attempt == 0;
        if first_filter && to == Slot(1) {
            return None;
        }
        let (op, attempt) = (request.op, request.attempt);
        let mut reply = h.deliver(READER, to, request)?;
        if to == Slot(3) && matches!(reply.body, ResponseBody::FilterAck(_)) {
            // Byzantine s3 claims a newer version nobody wrote, in every round.
            let mut fake = h.servers[3].lc(&key("k")).cloned().unwrap();
            fake.ts.num += 1_000;
            reply = Response {
                op,
                attempt,
                body: ResponseBody::FilterAck(FilterAck::Superseded {
                    ts: h.servers[3].lc(&key("k")).unwrap().ts,
                    newer: fake,
                }),
            };
        }
        Some(reply)
    });
    assert_eq!(outcome.value.as_deref(), Some(&b"v1"[..]));
    assert_eq!(outcome.restarts, 1, "the bait cost one round, once");
    assert_eq!(
        outcome.evidence,
        vec![Evidence {
            node: Slot(3),
            kind: EvidenceKind::FalseSupersession
        }]
    );
}

/// Spec §4.8(a)'s trace (f = 1, s3 Byzantine): v4 complete everywhere; v5 stored on s0, s1, s3 and
/// completed on s3 only; a malicious reader writes v5 back to s1 with a corrupted MAC vector. Read
/// `rd` collects from s1, s2, s3 (s3 offers a twin: v5's timestamp and genuine vector with a
/// garbage nonce) and filters without s0; read `rd2` then collects from s0, s2, s3 (s3 claiming
/// v4). Returns what `rd` and `rd2` read.
fn twin_trace(server: ServerMutations, client: ClientMutations) -> (Bytes, Bytes) {
    let mut h = Harness::new(1);
    h.config.mutations = client;
    for (i, slot) in h.servers.iter_mut().enumerate() {
        let mut config = ServerConfig::new(Slot(i as u32), 1);
        config.mutations = server;
        *slot = Server::new(config, h.server_keys[i].clone());
    }
    let k = key("k");
    h.write(&k, Some(b"v4"));
    let v4 = h.servers[3].lc(&k).cloned().unwrap();
    let v5 = h.write_where(&k, Some(b"v5"), |to, body| match body {
        RequestBody::Store { .. } => to != Slot(2),
        RequestBody::Complete { .. } => to == Slot(3),
        _ => true,
    });
    assert!(v5.is_none(), "v5's writer crashed during COMPLETE");
    let genuine = h.servers[3].lc(&k).cloned().unwrap();
    let mut bigmac = genuine.clone();
    for tag in &mut bigmac.vec.0 {
        tag.0[0] ^= 1;
    }
    let write_back = Request {
        op: OpId(900),
        attempt: 0,
        epoch: Epoch(0),
        group: GroupId(0),
        key: k.clone(),
        body: RequestBody::Filter {
            candidates: vec![bigmac],
        },
    };
    h.deliver(READER, Slot(1), write_back).unwrap();
    let twin = Candidate {
        ts: genuine.ts,
        nonce: Nonce([0x66; 32]),
        vec: genuine.vec.clone(),
    };
    let rd = h.read_with(&k, |h, to, request| {
        let round = matches!(
            request.body,
            RequestBody::Collect { .. } | RequestBody::Filter { .. }
        );
        if round && to == Slot(0) {
            return None;
        }
        let mut response = h.deliver(READER, to, request)?;
        if let (Slot(3), ResponseBody::CollectAck { lc, .. }) = (to, &mut response.body) {
            *lc = Some(twin.clone());
        }
        Some(response)
    });
    let rd2 = h.read_with(&k, |h, to, request| {
        if to == Slot(1) {
            return None;
        }
        let mut response = h.deliver(READER, to, request)?;
        if let (Slot(3), ResponseBody::CollectAck { lc, .. }) = (to, &mut response.body) {
            *lc = Some(v4.clone());
        }
        Some(response)
    });
    (rd.value.unwrap(), rd2.value.unwrap())
}

// Spec §4.8(a): the paper's literal selection (any twin at the highest timestamp) plus its literal
// write-back (the candidate's own vector kept in `lc`) lets rd return v5 and a later rd2 return
// v4: a new-old inversion. Either correction alone closes it.
#[test]
fn the_twin_trace_inverts_only_without_both_corrections() {
    let literal_server = ServerMutations {
        candidate_vec_in_lc: true,
        ..ServerMutations::default()
    };
    let literal_client = ClientMutations {
        any_twin: true,
        ..ClientMutations::default()
    };
    let (rd, rd2) = twin_trace(literal_server, literal_client);
    assert_eq!((&rd[..], &rd2[..]), (&b"v5"[..], &b"v4"[..]), "the control");
    for (server, client) in [
        (literal_server, ClientMutations::default()),
        (ServerMutations::default(), literal_client),
        (ServerMutations::default(), ClientMutations::default()),
    ] {
        let (rd, rd2) = twin_trace(server, client);
        assert_eq!((&rd[..], &rd2[..]), (&b"v5"[..], &b"v5"[..]));
    }
}

/// Beyond the fault bound a read can have a quorum of answers and still no version to return:
/// it says so, rather than only counting replies.
#[test]
fn a_read_whose_quorum_disagrees_says_so() {
    let mut h = Harness::new(1);
    let k = key("k");
    h.write(&k, Some(b"v"));
    // Two servers lose everything (one more than f), a third is down: the one intact server
    // vouches alone for the version, which the two amnesiacs cannot exclude either.
    for i in [2usize, 3] {
        h.servers[i] = Server::new(
            ServerConfig::new(Slot(i as u32), 1),
            h.server_keys[i].clone(),
        );
        h.disks[i] = MemoryFragments::default();
    }
    h.down[0] = true;
    let op = h.op();
    let mut read = ReadOp::new(h.config.clone(), Arc::new(ReedSolomonSimd), k.clone(), op);
    assert_eq!(read.stalled(), None, "nothing answered yet");
    // s0 was asked for its fragment: COLLECT waits for it until the timer fires, then FILTER.
    let result = h.run_read(&mut read, &mut |h, to, request| {
        h.deliver(READER, to, request)
    });
    assert!(result.is_none(), "the read completed: {result:?}");
    assert_eq!(read.answered().len(), 3);
    let stalled = read
        .stalled()
        .expect("a quorum answered and the read is stuck");
    assert!(stalled.contains("did not agree"), "{stalled}");
}

// ---------------------------------------------------------------------------------------------
// The one-round read (docs/one-round-reads.md)

/// A COLLECT request for `key`, as a reader sends it.
fn collect_request(key: &Key) -> Request {
    Request {
        op: OpId(77),
        attempt: 0,
        epoch: Epoch(0),
        group: GroupId(0),
        key: key.clone(),
        body: RequestBody::Collect { fragment: true },
    }
}

/// `lc`'s version as another value, with its own self-consistent cross-checksum: what a liar
/// vouches with.
fn forged_entry(lc: &Candidate, n: usize, f: usize, slot: usize) -> LcEntry {
    let value = b"forged";
    let layout = bulwark_core::erasure::Layout::for_value(value.len(), n, f);
    let fragments = ReedSolomonSimd.encode(&layout, value).unwrap();
    LcEntry {
        fragment: fragments[slot].clone(),
        cc: CrossChecksum {
            layout,
            tombstone: false,
            hashes: fragments.iter().map(|f| fragment_digest(f)).collect(),
        },
        nonce_hash: lc.nonce.commitment(),
    }
}

#[test]
fn collect_carries_the_entry_of_lc_only_when_hist_proves_it() {
    let mut h = Harness::new(1);
    let k = key("k");
    let reply = h.deliver(READER, Slot(0), collect_request(&k)).unwrap();
    assert_eq!(
        reply.body,
        ResponseBody::CollectAck {
            lc: None,
            entry: None
        }
    );
    h.write(&k, Some(b"value"));
    let ResponseBody::CollectAck {
        lc: Some(lc),
        entry: Some(entry),
    } = h
        .deliver(READER, Slot(0), collect_request(&k))
        .unwrap()
        .body
    else {
        panic!("a server holding its lc's version sends it");
    };
    assert_eq!(entry.nonce_hash, lc.nonce.commitment());
    assert_eq!(entry.fragment.as_ref(), b"value");
    // Asked for `lc` alone, it sends `lc` alone.
    let mut lc_only = collect_request(&k);
    lc_only.body = RequestBody::Collect { fragment: false };
    assert_eq!(
        h.deliver(READER, Slot(0), lc_only).unwrap().body,
        ResponseBody::CollectAck {
            lc: Some(lc.clone()),
            entry: None
        }
    );
    // Its fragment rotted on disk: the entry is withheld, not served damaged.
    let stored = &mut h.disks[0]
        .entries
        .get_mut(&(k.clone(), lc.ts))
        .unwrap()
        .fragment;
    *stored = Bytes::from_static(b"valuf");
    let ResponseBody::CollectAck { lc: Some(_), entry } = h
        .deliver(READER, Slot(0), collect_request(&k))
        .unwrap()
        .body
    else {
        panic!("lc is still sent");
    };
    assert_eq!(entry, None);
    assert_eq!(h.servers[0].stats().damaged_fragments, 1);
}

#[test]
fn collect_asks_f_plus_1_nodes_for_their_entry_and_the_rest_for_lc() {
    let h = Harness::new(2);
    let asked = |nodes: &[Slot]| -> Vec<bool> {
        ReadOp::new(
            h.config.clone(),
            Arc::new(ReedSolomonSimd),
            key("k"),
            OpId(5),
        )
        .asking_fragments_of(nodes)
        .start()
        .into_iter()
        .map(|(_, request)| match request.body {
            RequestBody::Collect { fragment } => fragment,
            other => panic!("{other:?}"),
        })
        .collect()
    };
    // The data fragments' nodes unless told otherwise; named nodes first, topped up from the
    // lowest slots; never more than f+1, repeats and strangers ignored.
    assert_eq!(asked(&[]), [true, true, true, false, false, false, false]);
    assert_eq!(
        asked(&[Slot(6), Slot(6), Slot(9), Slot(3)]),
        [true, false, false, true, false, false, true]
    );
    assert_eq!(
        asked(&[Slot(5), Slot(4), Slot(3), Slot(2)]),
        [false, false, false, true, true, true, false]
    );
}

/// Metadata-only replies come first and make a quorum with one fragment: the read waits for
/// the other node it asked and still ends in one round.
#[test]
fn collect_waits_past_the_quorum_for_the_fragments_it_asked_for() {
    let mut h = Harness::new(1);
    let k = key("k");
    let value = vec![8u8; 20_000];
    h.write(&k, Some(&value));
    let op = h.op();
    let mut read = ReadOp::new(h.config.clone(), Arc::new(ReedSolomonSimd), k, op);
    let mut sends = read.start();
    sends.sort_by_key(|(to, _)| std::cmp::Reverse(*to));
    let mut outcome = None;
    for (i, (to, request)) in sends.into_iter().enumerate() {
        let response = h.deliver(READER, to, request).expect("every node is up");
        match read.on_response(to, response) {
            Step::Continue(more) => {
                assert!(more.is_empty(), "no FILTER while s0 may still vouch");
                assert!(i < 3, "the fourth reply ends the read");
            }
            Step::Done(result) => outcome = Some(result.expect("read succeeds")),
        }
    }
    let outcome = outcome.expect("the read ended");
    assert!(outcome.one_round);
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert!(outcome.unhelpful.is_empty());
}

/// A node asked for its fragment whose entry is gone cannot complete the one-round rule: the read
/// goes on to FILTER at the quorum, without waiting for the other node asked, and names it.
#[test]
fn a_read_does_not_wait_for_fragments_that_cannot_complete_the_rule() {
    let mut h = Harness::new(1);
    let k = key("k");
    let value = vec![4u8; 20_000];
    h.write(&k, Some(&value));
    // Bit rot in s0's fragment: s0 names its lc without an entry.
    let ts = h.servers[0].lc(&k).unwrap().ts;
    let stored = &mut h.disks[0]
        .entries
        .get_mut(&(k.clone(), ts))
        .unwrap()
        .fragment;
    let mut bytes = stored.to_vec();
    bytes[3] ^= 0x01;
    *stored = Bytes::from(bytes);
    let op = h.op();
    let mut read = ReadOp::new(h.config.clone(), Arc::new(ReedSolomonSimd), k.clone(), op);
    let mut collects: Vec<Outbound> = read.start();
    // s3, s2 and s0 answer first; s1 (asked) has not yet.
    collects.sort_by_key(|(to, _)| std::cmp::Reverse(*to));
    let mut filter = Vec::new();
    for (to, request) in collects.into_iter().filter(|(to, _)| *to != Slot(1)) {
        let response = h.deliver(READER, to, request).expect("up");
        match read.on_response(to, response) {
            Step::Continue(more) => filter.extend(more),
            Step::Done(result) => panic!("one round with one voucher: {result:?}"),
        }
    }
    assert_eq!(filter.len(), 4, "FILTER to every node at the quorum");
    let mut queue: std::collections::VecDeque<Outbound> = filter.into();
    let mut outcome = None;
    while let Some((to, request)) = queue.pop_front() {
        let response = h.deliver(READER, to, request).expect("up");
        match read.on_response(to, response) {
            Step::Continue(more) => queue.extend(more),
            Step::Done(result) => outcome = Some(result.expect("read succeeds")),
        }
    }
    let outcome = outcome.expect("FILTER ends the read");
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert_eq!(outcome.unhelpful, [Slot(0)]);
}

/// A node asked for its fragment stays silent: the read goes on to FILTER when the timer
/// fires, and names the node so that the caller asks others next time.
#[test]
fn a_silent_fragment_node_costs_a_timeout_and_is_named() {
    let mut h = Harness::new(1);
    let k = key("k");
    let value = vec![6u8; 20_000];
    h.write(&k, Some(&value));
    h.down[1] = true;
    let outcome = h.read(&k);
    assert!(!outcome.one_round);
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert_eq!(outcome.unhelpful, [Slot(1)]);
    // Asked of the live nodes instead, the read takes one round again.
    h.fragments_from = vec![Slot(2), Slot(0)];
    let outcome = h.read(&k);
    assert!(outcome.one_round);
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert!(outcome.unhelpful.is_empty());
}

#[test]
fn a_read_that_finds_lc_only_at_some_nodes_runs_filter() {
    let mut h = Harness::new(1);
    let k = key("k");
    h.write(&k, Some(b"old"));
    // The newer write's COMPLETE reaches s0 and s1 only: it has not completed.
    h.write_where(&k, Some(b"new"), |to, body| {
        !matches!(body, RequestBody::Complete { .. }) || to.index() < 2
    });
    let outcome = h.read(&k);
    assert!(!outcome.one_round, "three replies, two lcs: no agreement");
    // FILTER finds `new` valid (its nonce was revealed to two nodes) and safe.
    assert_eq!(outcome.value.as_deref(), Some(&b"new"[..]));
}

#[test]
fn one_liar_cannot_vouch_for_another_value_in_one_round() {
    for f_vouchers in [false, true] {
        let mut h = Harness::new(1);
        h.config.mutations.one_round_f_vouchers = f_vouchers;
        let k = key("k");
        h.write(&k, Some(b"genuine"));
        let outcome = h.read_with(&k, |h, to, request| {
            let mut response = h.deliver(READER, to, request)?;
            // s0 names the genuine lc and vouches for it with another value.
            if let (
                Slot(0),
                ResponseBody::CollectAck {
                    lc: Some(lc),
                    entry,
                },
            ) = (to, &mut response.body)
            {
                *entry = Some(forged_entry(lc, 4, 1, 0));
            }
            Some(response)
        });
        if f_vouchers {
            // The control: a rule that takes f vouchers returns the liar's value.
            assert!(outcome.one_round);
            assert_eq!(outcome.value.as_deref(), Some(&b"forged"[..]));
        } else {
            // s1 alone vouches for the genuine version in COLLECT: FILTER decides.
            assert!(!outcome.one_round);
            assert_eq!(outcome.value.as_deref(), Some(&b"genuine"[..]));
        }
    }
}

#[test]
fn a_stale_lc_at_a_liar_and_a_lagging_node_is_not_returned() {
    for small_agreement in [false, true] {
        let mut h = Harness::new(1);
        h.config.mutations.one_round_small_agreement = small_agreement;
        // The liar and the lagging node are the ones asked for fragments.
        h.fragments_from = vec![Slot(0), Slot(2)];
        let k = key("k");
        h.write(&k, Some(b"old"));
        // `new` completes at s0, s1 and s3; s2 lags at `old`.
        h.write_where(&k, Some(b"new"), |to, body| {
            !matches!(body, RequestBody::Complete { .. }) || to.index() != 2
        })
        .expect("n - f COMPLETE acks");
        let outcome = h.read_with(&k, |h, to, request| {
            let lying = matches!(request.body, RequestBody::Collect { .. }) && to == Slot(0);
            if matches!(request.body, RequestBody::Collect { .. }) && to == Slot(3) {
                return None;
            }
            // s0 answers COLLECT as the lagging s2 does.
            let response = h.deliver(READER, to, request.clone())?;
            if lying {
                let mut lie = h.deliver(READER, Slot(2), request)?;
                lie.op = response.op;
                return Some(lie);
            }
            Some(response)
        });
        if small_agreement {
            // The control: f+1 agreeing replies let a completed write be missed.
            assert!(outcome.one_round);
            assert_eq!(outcome.value.as_deref(), Some(&b"old"[..]));
        } else {
            assert!(!outcome.one_round);
            assert_eq!(outcome.value.as_deref(), Some(&b"new"[..]));
        }
    }
}

#[test]
fn a_damaged_entry_is_blamed_and_the_read_goes_on_to_filter() {
    let mut h = Harness::new(1);
    let k = key("k");
    let value = vec![3u8; 20_000];
    h.write(&k, Some(&value));
    let outcome = h.read_with(&k, |h, to, request| {
        let mut response = h.deliver(READER, to, request)?;
        if let (
            Slot(0),
            ResponseBody::CollectAck {
                entry: Some(entry), ..
            },
        ) = (to, &mut response.body)
        {
            let mut bytes = entry.fragment.to_vec();
            bytes[0] ^= 1;
            entry.fragment = Bytes::from(bytes);
        }
        Some(response)
    });
    // One of the f+1 fragments asked for is bad: FILTER, which asks every node, decides, and the
    // caller hears which node to ask last.
    assert!(!outcome.one_round);
    assert_eq!(outcome.unhelpful, [Slot(0)]);
    assert_eq!(outcome.value.as_deref(), Some(&value[..]));
    assert!(
        outcome
            .evidence
            .iter()
            .any(|e| e.node == Slot(0) && e.kind == EvidenceKind::CorruptFragment),
        "{:?}",
        outcome.evidence
    );
}

// ---------------------------------------------------------------------------------------------
// Registers with one writer

/// What a writer holding `secret` shares with the nodes holding `nodes`, as a client derives it.
fn writer_keys(secret: &SecretKey, nodes: &[SecretKey]) -> Arc<WriterKeys> {
    Arc::new(WriterKeys {
        timestamp: MacKey([99; 32]),
        servers: nodes
            .iter()
            .map(|node| pair_key(secret, &node.public_key()))
            .collect(),
    })
}

/// A write by `writer` of `value` to `key`, which knows its clock is `last`.
fn sole_write(h: &mut Harness, writer: ClientId, key: &Key, last: Option<u64>) -> WriteOp {
    let op = h.op();
    WriteOp::new(
        h.config.clone(),
        h.keys_of(writer),
        Arc::new(ReedSolomonSimd),
        key.clone(),
        op,
        Pid { writer, seq: op.0 },
        [op.0 as u8; 32],
        Some(Bytes::from_static(b"sole")),
    )
    .sole(last)
    .unwrap()
}

/// Hands one request from `writer` to server `to`, applying its changes; its reply.
fn drive_one(h: &mut Harness, writer: ClientId, to: Slot, request: Request) -> Option<Response> {
    let i = to.index();
    let handled = h.servers[i].handle(h.now, writer, WRITER, request, &h.disks[i]);
    for change in &handled.changes {
        h.disks[i].apply(change);
    }
    handled.reply
}

/// Runs `write` from `writer` against every server that is up; returns its result and the
/// rounds it sent.
fn drive_as(
    h: &mut Harness,
    writer: ClientId,
    mut write: WriteOp,
) -> (Result<WriteOutcome, ProtocolError>, Vec<&'static str>) {
    let mut rounds = Vec::new();
    let mut queue: std::collections::VecDeque<Outbound> = write.start().into();
    while let Some((to, request)) = queue.pop_front() {
        if rounds.last() != Some(&request.body.name()) {
            rounds.push(request.body.name());
        }
        if h.down[to.index()] {
            continue;
        }
        let Some(response) = drive_one(h, writer, to, request) else {
            continue;
        };
        match write.on_response(to, response) {
            Step::Continue(more) => queue.extend(more),
            Step::Done(result) => return (result, rounds),
        }
    }
    panic!("the write neither completed nor failed")
}

#[test]
fn a_sole_writer_that_knows_its_clock_writes_in_two_rounds() {
    let mut h = Harness::new(1);
    let writer = ClientId(7);
    let key = Key::new(sole_writer_key(writer, b"k")).unwrap();
    assert_eq!(sole_writer(&key), Some(writer));
    assert_eq!(sole_writer(&Key::new(b"\0sw\0ab".to_vec()).unwrap()), None);

    let first = sole_write(&mut h, writer, &key, None);
    let (outcome, rounds) = drive_as(&mut h, writer, first);
    assert_eq!(
        rounds,
        ["clock", "store", "complete"],
        "no clock known: CLOCK runs"
    );
    assert_eq!(outcome.unwrap().ts.num, 1);

    let second = sole_write(&mut h, writer, &key, Some(1));
    let (outcome, rounds) = drive_as(&mut h, writer, second);
    assert_eq!(rounds, ["store", "complete"]);
    let outcome = outcome.unwrap();
    assert_eq!((outcome.ts.num, outcome.restarts), (2, 0));
    assert_eq!(h.read(&key).value.as_deref(), Some(&b"sole"[..]));
}

#[test]
fn another_client_cannot_write_a_sole_writers_register() {
    let mut h = Harness::new(1);
    let key = Key::new(sole_writer_key(ClientId(7), b"k")).unwrap();
    let intruder = ClientId(8);
    let write = sole_write(&mut h, intruder, &key, None);
    let (outcome, rounds) = drive_as(&mut h, intruder, write);
    assert_eq!(rounds, ["clock"]);
    match outcome {
        Err(ProtocolError::Refused { refusal, nodes }) => {
            assert_eq!(
                refusal,
                Refusal::NotSoleWriter {
                    writer: ClientId(7)
                }
            );
            assert_eq!(nodes.len(), 2, "f+1 refusals end it");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Nor may it skip CLOCK: STORE is refused the same way, and nothing is stored.
    let write = sole_write(&mut h, intruder, &key, Some(5));
    let (outcome, _) = drive_as(&mut h, intruder, write);
    assert!(matches!(
        outcome,
        Err(ProtocolError::Refused {
            refusal: Refusal::NotSoleWriter { .. },
            ..
        })
    ));
    assert_eq!(h.read(&key).value, None);
}

#[test]
fn a_store_below_a_complete_write_is_refused_and_the_writer_stores_above_it() {
    let mut h = Harness::new(1);
    let writer = ClientId(7);
    let key = Key::new(sole_writer_key(writer, b"k")).unwrap();
    let ahead = sole_write(&mut h, writer, &key, Some(4));
    assert_eq!(drive_as(&mut h, writer, ahead).0.unwrap().ts.num, 5);

    // The writer restarted with its clock at 1: every node's `lc` is above 2.
    let behind = sole_write(&mut h, writer, &key, Some(1));
    let (outcome, rounds) = drive_as(&mut h, writer, behind);
    assert_eq!(
        rounds,
        ["store", "complete"],
        "stored again above 5 at once"
    );
    let outcome = outcome.unwrap();
    assert_eq!((outcome.ts.num, outcome.restarts), (6, 1));
}

#[test]
fn one_stale_refusal_with_a_tagged_lc_is_enough_to_store_above_it() {
    // Node 3 is down. Write B stores on nodes 0-2 and its COMPLETE reaches node 0 only; write A,
    // concurrent and below B, then has acks from 1 and 2 and a stale refusal from 0: it must not
    // wait for a third ack that cannot come.
    let mut h = Harness::new(1);
    h.down[3] = true;
    let writer = ClientId(7);
    let key = Key::new(sole_writer_key(writer, b"k")).unwrap();
    let mut b = sole_write(&mut h, writer, &key, Some(4));
    let mut completes = Vec::new();
    for (to, request) in b.start() {
        if h.down[to.index()] {
            continue;
        }
        let reply = drive_one(&mut h, writer, to, request).unwrap();
        if let Step::Continue(more) = b.on_response(to, reply) {
            completes.extend(more);
        }
    }
    let (to, complete) = completes.into_iter().next().expect("B's COMPLETE");
    assert_eq!(to, Slot(0));
    drive_one(&mut h, writer, to, complete);

    let a = sole_write(&mut h, writer, &key, Some(3));
    let (outcome, rounds) = drive_as(&mut h, writer, a);
    assert_eq!(
        rounds,
        ["store", "complete"],
        "no CLOCK: the second STORE is above B"
    );
    let outcome = outcome.unwrap();
    assert_eq!((outcome.ts.num, outcome.restarts), (6, 1));
    // A tag the writers did not make is no reason to store again: a liar's refusal is ignored.
    let mut forged = h.servers[0].lc(&key).unwrap().ts;
    forged.num = 1_000;
    let mut c = sole_write(&mut h, writer, &key, Some(6));
    let stores = c.start();
    let step = c.on_response(
        Slot(1),
        Response {
            op: stores[0].1.op,
            attempt: 0,
            body: ResponseBody::Refused(Refusal::Stale { lc: forged }),
        },
    );
    assert!(matches!(step, Step::Continue(ref sends) if sends.is_empty()));
}

#[test]
fn without_the_stale_check_a_writer_behind_completes_a_write_no_read_sees() {
    // The mutation the simulator's negative control uses.
    let mut h = Harness::new(1);
    h.servers = (0..4)
        .map(|i| {
            let mut config = ServerConfig::new(Slot(i as u32), 1);
            config.mutations.no_stale_check = true;
            Server::new(config, h.server_keys[i].clone())
        })
        .collect();
    let writer = ClientId(7);
    let key = Key::new(sole_writer_key(writer, b"k")).unwrap();
    let ahead = sole_write(&mut h, writer, &key, Some(4));
    drive_as(&mut h, writer, ahead).0.unwrap();
    let behind = sole_write(&mut h, writer, &key, Some(1));
    let (outcome, rounds) = drive_as(&mut h, writer, behind);
    assert_eq!(rounds, ["store", "complete"]);
    assert_eq!(outcome.unwrap().ts.num, 2);
    assert_eq!(h.read(&key).ts.map(|ts| ts.num), Some(5));
}

#[test]
fn a_retransmitted_store_of_a_held_version_is_acknowledged_again() {
    let mut h = Harness::new(1);
    let writer = ClientId(7);
    let key = Key::new(sole_writer_key(writer, b"k")).unwrap();
    let mut write = sole_write(&mut h, writer, &key, Some(0));
    let stores = write.start();
    let (to, store) = stores[0].clone();
    let i = to.index();
    let first = h.servers[i].handle(h.now, writer, WRITER, store.clone(), &h.disks[i]);
    assert!(matches!(
        first.reply.unwrap().body,
        ResponseBody::StoreAck { .. }
    ));
    // A later write completes (on every node but through another op), then the STORE comes again,
    // within the GC grace: once the superseded version is collected, the node says stale instead,
    // and the writer, whose write completed or was abandoned by then, ignores it.
    let later = sole_write(&mut h, writer, &key, Some(3));
    drive_as(&mut h, writer, later).0.unwrap();
    let again = h.servers[i].handle(h.now, writer, WRITER, store, &h.disks[i]);
    assert!(matches!(
        again.reply.unwrap().body,
        ResponseBody::StoreAck { .. }
    ));
}

/// Writes and overwrites 24 keys, reads every one back, and returns what was read with each
/// server's counters, on servers that keep the metadata of at most `cached` keys.
fn many_keys(
    cached: usize,
    mutate: impl Fn(&mut ServerConfig),
) -> (Vec<Option<Bytes>>, Vec<ServerStats>, Harness) {
    let mut h = Harness::new(1);
    for (i, server) in h.servers.iter_mut().enumerate() {
        let mut config = ServerConfig::new(Slot(i as u32), 1);
        config.cached_keys_max = cached;
        mutate(&mut config);
        *server = Server::new(config, h.server_keys[i].clone());
    }
    let names: Vec<Key> = (0..24).map(|i| key(&format!("k{i}"))).collect();
    for (i, k) in names.iter().enumerate() {
        h.write(k, Some(format!("first {i}").as_bytes()));
    }
    // Overwrite every third key, and delete one, while the others are cold.
    for (i, k) in names.iter().enumerate().step_by(3) {
        h.write(k, Some(format!("second {i}").as_bytes()));
    }
    h.write(&names[1], None);
    let read = names.iter().map(|k| h.read(k).value).collect();
    let stats = h.servers.iter().map(ServerLogic::stats).collect();
    (read, stats, h)
}

#[test]
fn a_server_that_caches_one_key_answers_as_one_that_caches_every_key() {
    let (all, all_stats, _) = many_keys(CACHED_KEYS_MAX, |_| {});
    let (one, one_stats, h) = many_keys(1, |_| {});
    for (i, value) in all.iter().enumerate() {
        let expected = match i {
            1 => None,
            i if i % 3 == 0 => Some(format!("second {i}")),
            i => Some(format!("first {i}")),
        };
        assert_eq!(
            value.as_deref(),
            expected.as_deref().map(str::as_bytes),
            "key {i}"
        );
    }
    assert_eq!(one, all);
    // The running totals agree with the ones counted over every key held in memory.
    assert_eq!(one_stats, all_stats);
    assert_eq!(all_stats[0].keys, 24);
    assert_eq!(all_stats[0].objects, 23);
    for server in &h.servers {
        // Only the last key and those awaiting collection stay.
        assert!(server.cached_keys() <= 1 + 9, "{}", server.cached_keys());
    }
}

#[test]
fn a_cache_that_forgets_what_it_evicts_is_caught() {
    let (forgot, _, _) = many_keys(1, |config| config.mutations.forget_evicted = true);
    let (kept, _, _) = many_keys(CACHED_KEYS_MAX, |_| {});
    assert_ne!(forgot, kept, "the mutation must change what reads return");
}

#[test]
fn a_restart_counts_every_key_and_caches_only_what_fits() {
    let (_, stats, h) = many_keys(CACHED_KEYS_MAX, |_| {});
    let mut config = ServerConfig::new(Slot(0), 1);
    config.cached_keys_max = 4;
    let mut fresh = Server::new(config, h.server_keys[0].clone());
    let mut keys: Vec<Key> = h.disks[0].lcs.keys().cloned().collect();
    keys.sort();
    for k in keys {
        let stored = h.disks[0].stored_key(&k);
        fresh.restore_key(k, stored, h.now);
    }
    assert_eq!(
        ServerLogic::stats(&fresh),
        ServerStats {
            collected: 0,
            ..stats[0].clone()
        }
    );
    assert!(fresh.cached_keys() <= 4 + 9, "{}", fresh.cached_keys());
}

#[test]
fn a_slot_verifies_only_under_the_key_its_writer_shares_with_that_server_in_its_incarnation() {
    let h = Harness::new(1);
    let k = key("k");
    let members: Vec<bulwark_core::NodeId> = (0..4).map(bulwark_core::NodeId).collect();
    let here = Incarnation::new(&members, Epoch(3));
    let writer = ClientId(3);
    let ts = Timestamp::authenticated(&k, 1, Pid { writer, seq: 1 }, &MacKey([99; 32]));
    let nonce_hash = Nonce([5; 32]).commitment();
    let vec = MacVec::compute(&here, &k, &ts, &nonce_hash, &h.keys_of(writer).servers);
    for (i, keys) in h.server_keys.iter().enumerate() {
        assert!(vec.verify_slot(i, &here, &k, &ts, &nonce_hash, keys));
    }
    // Each side derives the key alone.
    assert_eq!(
        pair_key(&h.node_secrets[2], &h.writer_secrets[3].public_key()),
        h.keys_of(writer).servers[2]
    );
    // Another server's slot, a timestamp naming another writer, a writer the server does not know.
    assert!(!vec.verify_slot(0, &here, &k, &ts, &nonce_hash, &h.server_keys[1]));
    let other = Timestamp {
        pid: Pid {
            writer: ClientId(4),
            ..ts.pid
        },
        ..ts
    };
    assert!(!vec.verify_slot(0, &here, &k, &other, &nonce_hash, &h.server_keys[0]));
    assert!(!vec.verify_slot(0, &here, &k, &ts, &nonce_hash, &ServerKeys::default()));
    // The same members in a later life, or other members: the vector was not made for them.
    for elsewhere in [
        Incarnation::new(&members, Epoch(5)),
        Incarnation::new(&[members[1], members[0], members[2], members[3]], Epoch(3)),
    ] {
        assert!(!vec.verify_slot(0, &elsewhere, &k, &ts, &nonce_hash, &h.server_keys[0]));
    }
}

mod epochs;
mod takeover;
