//! Content-hash objects: every replica check, and the client machines against honest, lying and
//! silent replicas, driven by hand.

use super::*;
use bulwark_core::erasure::ReedSolomonSimd;
use std::cell::RefCell;
use std::collections::HashMap;

const F: usize = 1;
const N: usize = 4;
const EPOCH: Epoch = Epoch(3);
const GROUP: GroupId = GroupId(7);

fn place(slot: usize) -> Place {
    Place {
        slot: Slot(slot as u32),
        n: N,
        f: F,
        epoch: EPOCH,
        group: GROUP,
    }
}

fn secret(slot: usize) -> SecretKey {
    SecretKey::from_seed(&[slot as u8 + 1; 32])
}

fn keys() -> Arc<[PublicKey]> {
    (0..N).map(|i| secret(i).public_key()).collect()
}

fn codec() -> Arc<dyn ErasureCodec> {
    Arc::new(ReedSolomonSimd)
}

const WRITE: Access = Access {
    write: true,
    read: true,
};

/// A replica with its storage: what it put is what it reads back (no crash in these tests).
struct Node {
    server: Server,
    disk: RefCell<HashMap<ContentId, Held>>,
}

impl Fragments for RefCell<HashMap<ContentId, Held>> {
    fn fragment(&self, id: &ContentId) -> Option<Held> {
        self.borrow().get(id).cloned()
    }
}

impl Node {
    fn new(slot: usize) -> Node {
        Node {
            server: Server::new(place(slot), secret(slot), 0, 0),
            disk: RefCell::new(HashMap::new()),
        }
    }

    fn handle(&mut self, access: Access, request: Request) -> Output<Server> {
        let out = self
            .server
            .on_request(Time(0), ClientId(1), access, request, &self.disk);
        for change in &out.changes {
            match change {
                Change::Put { id, held } => {
                    self.disk.borrow_mut().insert(*id, held.clone());
                }
                Change::Delete { id } => {
                    self.disk.borrow_mut().remove(id);
                }
            }
        }
        out
    }

    fn answer(&mut self, request: Request) -> ResponseBody {
        self.handle(WRITE, request).reply.expect("a reply").body
    }
}

fn value(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn write_op(value: &[u8]) -> WriteOp {
    let encoded = Encoded::new(&ReedSolomonSimd, N, F, value).unwrap();
    WriteOp::new(place(0), keys(), OpId(1), encoded).unwrap()
}

fn done<O: Operation>(progress: Progress<O>) -> Option<Result<O::Output, OpError>> {
    match progress {
        Progress::Done(result) => Some(result),
        Progress::Send(_) => None,
    }
}

/// Writes `value` to every node of `nodes` (the write is done after 2f+1 of them; the last
/// still stores its fragment); the outcome.
fn write_all(nodes: &mut [Node], value: &[u8]) -> WriteOutcome {
    let mut op = write_op(value);
    let mut outcome = None;
    for (slot, request) in op.start() {
        let reply = Response {
            op: OpId(1),
            epoch: EPOCH,
            body: nodes[slot.index()].answer(request),
        };
        if outcome.is_none() {
            outcome = done(op.on_reply(slot, reply));
        }
    }
    outcome
        .expect("the write finishes with every node answering")
        .unwrap()
}

fn read_from(
    nodes: &mut [Node],
    order: &[usize],
    id: ContentId,
) -> Option<Result<ReadOutcome, OpError>> {
    let mut op = ReadOp::new(place(0), codec(), OpId(2), id);
    let mut requests: HashMap<Slot, Request> = op.start().into_iter().collect();
    for &i in order {
        let slot = Slot(i as u32);
        if !requests.contains_key(&slot) {
            // The read asks the last f only after a failure or its retransmission timer.
            requests.extend(op.on_timeout());
        }
        let reply = Response {
            op: OpId(2),
            epoch: EPOCH,
            body: nodes[i].answer(requests[&slot].clone()),
        };
        match op.on_reply(slot, reply) {
            Progress::Done(result) => return Some(result),
            Progress::Send(more) => requests.extend(more),
        }
    }
    None
}

fn nodes() -> Vec<Node> {
    (0..N).map(Node::new).collect()
}

#[test]
fn an_id_names_its_content_and_nothing_else() {
    let a = write_op(&value(10_000)).id();
    assert_eq!(
        a,
        write_op(&value(10_000)).id(),
        "the same bytes, the same id"
    );
    let mut other = value(10_000);
    other[9_999] ^= 1;
    assert_ne!(a, write_op(&other).id());
    assert_ne!(a, write_op(&value(9_999)).id());
    assert_eq!(ContentId::from_hex(&a.to_hex()), Some(a));
    assert_eq!(ContentId::from_hex("00"), None);
    assert_eq!(ContentId::from_hex(&"zz".repeat(32)), None);
}

#[test]
fn objects_large_and_small_round_trip_and_need_f_plus_1_fragments() {
    for len in [0, 1, 4096, 4097, 100_000] {
        let mut nodes = nodes();
        let data = value(len);
        let written = write_all(&mut nodes, &data);
        assert_eq!(written.acks.len(), 2 * F + 1);
        // Any f+1 of them rebuild it.
        for order in [[0, 1], [2, 3], [3, 0]] {
            let read = read_from(&mut nodes, &order, written.id)
                .unwrap_or_else(|| panic!("{len} bytes from {order:?}"))
                .unwrap();
            assert_eq!(read.value.as_deref(), Some(&data[..]), "{len} bytes");
        }
    }
}

#[test]
fn a_replica_stores_only_its_own_fragment_of_a_canonical_manifest() {
    let data = value(50_000);
    let op = write_op(&data);
    let start = |op: &mut WriteOp| op.start();
    let mut op2 = write_op(&data);
    let requests = start(&mut op2);
    let mut node = Node::new(1);
    let ours = requests[1].1.clone();
    let theirs = requests[2].1.clone();

    // Another slot's fragment.
    let mut wrong = ours.clone();
    wrong.body = theirs.body.clone();
    assert_eq!(
        node.answer(wrong),
        ResponseBody::Refused(Refusal::BadFragment)
    );
    // A manifest for another id.
    let mut renamed = ours.clone();
    renamed.id = write_op(&value(50_001)).id();
    assert_eq!(
        node.answer(renamed),
        ResponseBody::Refused(Refusal::BadManifest)
    );
    // A manifest that hashes to its id but is not what a correct writer makes.
    let RequestBody::Store { manifest, fragment } = ours.body.clone() else {
        unreachable!()
    };
    let mut odd = manifest.clone();
    odd.fragments.push(odd.fragments[0]);
    let crafted = Request {
        id: ContentId::of(&odd),
        body: RequestBody::Store {
            manifest: odd,
            fragment: fragment.clone(),
        },
        ..ours.clone()
    };
    assert_eq!(
        node.answer(crafted),
        ResponseBody::Refused(Refusal::BadManifest)
    );
    // Another epoch or group.
    let mut stale = ours.clone();
    stale.epoch = Epoch(2);
    assert_eq!(
        node.answer(stale),
        ResponseBody::Refused(Refusal::WrongEpoch { current: EPOCH })
    );
    let mut elsewhere = ours.clone();
    elsewhere.group = GroupId(8);
    assert_eq!(
        node.answer(elsewhere),
        ResponseBody::Refused(Refusal::WrongGroup)
    );
    // A reader may not store.
    let reader = Access {
        write: false,
        read: true,
    };
    let out = node.handle(reader, ours.clone());
    assert!(out.refused.is_some() && out.changes.is_empty());
    assert!(node.disk.borrow().is_empty(), "nothing refused is stored");

    // The right one is stored once, acknowledged every time, and signed for this place only.
    let first = node.handle(WRITE, ours.clone());
    assert_eq!(first.changes.len(), 1);
    let again = node.handle(WRITE, ours.clone());
    assert!(
        again.changes.is_empty(),
        "a second store of the same object writes nothing"
    );
    let ResponseBody::Stored(ack) = again.reply.unwrap().body else {
        panic!("acknowledged again")
    };
    let ack = ack.verify(&secret(1).public_key()).unwrap();
    assert_eq!(
        *ack.value(),
        Stored {
            id: op.id(),
            epoch: EPOCH,
            group: GROUP,
            slot: Slot(1)
        }
    );
    assert_eq!(node.server.stats().objects, 1);
    assert_eq!(node.server.stats().bytes, fragment.len() as u64);
}

#[test]
fn a_write_counts_only_genuine_acknowledgements_for_this_object_and_place() {
    let data = value(20_000);
    let mut nodes = nodes();
    let mut op = write_op(&data);
    let requests = op.start();
    let reply = |body| Response {
        op: OpId(1),
        epoch: EPOCH,
        body,
    };
    let genuine = |nodes: &mut Vec<Node>, i: usize| nodes[i].answer(requests[i].1.clone());

    // Slot 0's ack replayed by slot 1, an ack for another epoch, and one signed by another key.
    let from0 = genuine(&mut nodes, 0);
    assert!(done(op.on_reply(Slot(1), reply(from0.clone()))).is_none());
    let foreign = Stored {
        id: op.id(),
        epoch: Epoch(2),
        group: GROUP,
        slot: Slot(2),
    };
    let foreign = Signed::sign(&secret(2), foreign).unwrap().to_unverified();
    assert!(done(op.on_reply(Slot(2), reply(ResponseBody::Stored(foreign)))).is_none());
    let forged = Stored {
        id: op.id(),
        epoch: EPOCH,
        group: GROUP,
        slot: Slot(3),
    };
    let forged = Signed::sign(&secret(0), forged).unwrap().to_unverified();
    assert!(done(op.on_reply(Slot(3), reply(ResponseBody::Stored(forged)))).is_none());
    assert_eq!(op.answered(), Vec::<Slot>::new(), "none of them counts");
    assert_eq!(op.evidence.len(), 3, "each is evidence against its sender");

    // Genuine ones from 0, 2 and 3 finish it.
    assert!(done(op.on_reply(Slot(0), reply(from0))).is_none());
    let from2 = genuine(&mut nodes, 2);
    assert!(done(op.on_reply(Slot(2), reply(from2))).is_none());
    let from3 = genuine(&mut nodes, 3);
    let outcome = done(op.on_reply(Slot(3), reply(from3))).unwrap().unwrap();
    let slots: Vec<Slot> = outcome.acks.iter().map(|(s, _)| *s).collect();
    assert_eq!(slots, vec![Slot(0), Slot(2), Slot(3)]);
    assert_eq!(outcome.evidence.len(), 3);
}

#[test]
fn a_write_retransmits_only_to_replicas_that_have_not_acknowledged() {
    let data = value(100);
    let mut nodes = nodes();
    let mut op = write_op(&data);
    let requests = op.start();
    let body = nodes[2].answer(requests[2].1.clone());
    assert!(
        done(op.on_reply(
            Slot(2),
            Response {
                op: OpId(1),
                epoch: EPOCH,
                body
            }
        ))
        .is_none()
    );
    let again: Vec<Slot> = op.on_timeout().into_iter().map(|(s, _)| s).collect();
    assert_eq!(again, vec![Slot(0), Slot(1), Slot(3)]);
}

#[test]
fn f_plus_one_refusals_end_a_write_and_f_do_not() {
    let mut op = write_op(&value(10));
    op.start();
    let refused = |refusal| Response {
        op: OpId(1),
        epoch: EPOCH,
        body: ResponseBody::Refused(refusal),
    };
    assert!(done(op.on_reply(Slot(0), refused(Refusal::NotWriter))).is_none());
    let Some(Err(OpError::Refused { by, .. })) =
        done(op.on_reply(Slot(3), refused(Refusal::NotWriter)))
    else {
        panic!("f+1 refusals end the write");
    };
    assert_eq!(by, vec![Slot(0), Slot(3)]);
}

#[test]
fn a_read_asks_n_minus_f_first_and_the_rest_only_when_one_fails_it() {
    let data = value(30_000);
    let mut nodes = nodes();
    let written = write_all(&mut nodes, &data);
    let mut op = ReadOp::new(place(0), codec(), OpId(2), written.id);
    let requests: HashMap<Slot, Request> = op.start().into_iter().collect();
    let mut asked: Vec<Slot> = requests.keys().copied().collect();
    asked.sort();
    assert_eq!(asked, (0..(N - F) as u32).map(Slot).collect::<Vec<_>>());
    let mut quiet = ReadOp::new(place(0), codec(), OpId(3), written.id);
    quiet.start();
    let again: Vec<Slot> = quiet.on_timeout().into_iter().map(|(s, _)| s).collect();
    assert_eq!(
        again,
        (0..N as u32).map(Slot).collect::<Vec<_>>(),
        "silence until the retransmission asks every replica"
    );
    // Correct replicas: f+1 of the first n-f rebuild it, and nobody else is asked.
    for (i, node) in nodes.iter_mut().enumerate().take(F + 1) {
        let slot = Slot(i as u32);
        let body = node.answer(requests[&slot].clone());
        match op.on_reply(
            slot,
            Response {
                op: OpId(2),
                epoch: EPOCH,
                body,
            },
        ) {
            Progress::Send(more) => {
                assert!(more.is_empty(), "a fragment that checks widens nothing")
            }
            Progress::Done(read) => {
                assert_eq!(i, F);
                assert_eq!(read.unwrap().value.as_deref(), Some(&data[..]));
                return;
            }
        }
    }
    panic!("f+1 fragments rebuild the object");
}

#[test]
fn a_corrupt_fragment_is_blamed_and_the_read_goes_on_with_others() {
    let data = value(30_000);
    let mut nodes = nodes();
    let written = write_all(&mut nodes, &data);
    // Slot 1's disk rots: it must not serve it (counted as damage), and a lying slot 2 that
    // serves a damaged fragment anyway is named.
    {
        let mut disk = nodes[1].disk.borrow_mut();
        let held = disk.get_mut(&written.id).unwrap();
        let mut bad = held.fragment.to_vec();
        bad[0] ^= 0xff;
        held.fragment = Bytes::from(bad);
    }
    let mut op = ReadOp::new(place(0), codec(), OpId(2), written.id);
    let mut requests: HashMap<Slot, Request> = op.start().into_iter().collect();
    let body = nodes[1].answer(requests[&Slot(1)].clone());
    assert_eq!(
        body,
        ResponseBody::Missing,
        "a replica never serves what it did not accept"
    );
    assert_eq!(nodes[1].server.stats().damaged, 1);
    let Progress::Send(widened) = op.on_reply(
        Slot(1),
        Response {
            op: OpId(2),
            epoch: EPOCH,
            body,
        },
    ) else {
        panic!("one denial does not end a read");
    };
    assert_eq!(
        widened.iter().map(|(slot, _)| *slot).collect::<Vec<_>>(),
        vec![Slot(3)],
        "a denial among the first n-f asks the last f"
    );
    requests.extend(widened);

    let ResponseBody::Fragment { manifest, fragment } = nodes[2].answer(requests[&Slot(2)].clone())
    else {
        panic!("slot 2 holds its fragment")
    };
    let mut bad = fragment.to_vec();
    bad[7] ^= 1;
    let lie = ResponseBody::Fragment {
        manifest,
        fragment: Bytes::from(bad),
    };
    assert!(
        done(op.on_reply(
            Slot(2),
            Response {
                op: OpId(2),
                epoch: EPOCH,
                body: lie
            }
        ))
        .is_none()
    );
    assert_eq!(
        op.evidence,
        vec![Evidence {
            node: Slot(2),
            kind: EvidenceKind::CorruptFragment
        }]
    );
    for i in [0, 3] {
        let body = nodes[i].answer(requests[&Slot(i as u32)].clone());
        if let Some(result) = done(op.on_reply(
            Slot(i as u32),
            Response {
                op: OpId(2),
                epoch: EPOCH,
                body,
            },
        )) {
            let read = result.unwrap();
            assert_eq!(read.value.as_deref(), Some(&data[..]));
            assert_eq!(read.answered_by, vec![Slot(0), Slot(3)]);
            assert_eq!(read.evidence.len(), 1);
            return;
        }
    }
    panic!("slots 0 and 3 rebuild the object");
}

#[test]
fn not_found_needs_2f_plus_1_denials_so_f_liars_cannot_hide_a_written_object() {
    let data = value(5_000);
    let mut nodes = nodes();
    // Written with slot 3 missing the STORE: slots 0-2 hold it.
    let mut op = write_op(&data);
    let requests = op.start();
    for (slot, request) in requests.into_iter().take(3) {
        let body = nodes[slot.index()].answer(request);
        let _ = op.on_reply(
            slot,
            Response {
                op: OpId(1),
                epoch: EPOCH,
                body,
            },
        );
    }
    let id = op.id();
    // Slot 3 (missed it) and a lying slot 0 deny: 2f denials are not enough.
    let mut read = ReadOp::new(place(0), codec(), OpId(2), id);
    read.start();
    let missing = |slot: u32| {
        (
            Slot(slot),
            Response {
                op: OpId(2),
                epoch: EPOCH,
                body: ResponseBody::Missing,
            },
        )
    };
    for (slot, reply) in [missing(3), missing(0)] {
        assert!(done(read.on_reply(slot, reply)).is_none());
    }
    // A repeated denial does not count twice.
    assert!(done(read.on_reply(missing(3).0, missing(3).1)).is_none());
    let requests: HashMap<Slot, Request> = read.start().into_iter().collect();
    let mut outcome = None;
    for i in [1, 2] {
        let body = nodes[i].answer(requests[&Slot(i as u32)].clone());
        outcome = done(read.on_reply(
            Slot(i as u32),
            Response {
                op: OpId(2),
                epoch: EPOCH,
                body,
            },
        ));
    }
    let outcome = outcome.unwrap().unwrap();
    assert_eq!(outcome.value.as_deref(), Some(&data[..]));

    // An object never written: 2f+1 denials say so.
    let never = write_op(&value(77)).id();
    let mut nodes = self::nodes();
    let read = read_from(&mut nodes, &[0, 1, 2], never).unwrap().unwrap();
    assert_eq!(read.value, None);
    assert_eq!(read.answered_by, vec![Slot(0), Slot(1), Slot(2)]);
}

#[test]
fn a_writer_that_stores_fragments_of_different_values_gets_one_answer_from_every_reader() {
    // A faulty writer: fragments of two values of one length, under one manifest that matches
    // each slot's own fragment.
    let a = value(40_000);
    let mut b = a.clone();
    b[0] ^= 1;
    let codec = ReedSolomonSimd;
    let layout = Layout::for_value(a.len(), N, F);
    let from_a = codec.encode(&layout, &a).unwrap();
    let from_b = codec.encode(&layout, &b).unwrap();
    let mixed: Vec<Bytes> = vec![
        from_a[0].clone(),
        from_b[1].clone(),
        from_a[2].clone(),
        from_b[3].clone(),
    ];
    let manifest = Manifest::of(layout, &mixed);
    let id = ContentId::of(&manifest);
    let mut nodes = nodes();
    for (i, node) in nodes.iter_mut().enumerate() {
        let stored = node.answer(Request {
            op: OpId(1),
            epoch: EPOCH,
            group: GROUP,
            id,
            body: RequestBody::Store {
                manifest: manifest.clone(),
                fragment: mixed[i].clone(),
            },
        });
        assert!(
            matches!(stored, ResponseBody::Stored(_)),
            "each fragment checks alone"
        );
    }
    for order in [[0, 1], [0, 2], [1, 3], [2, 3]] {
        match read_from(&mut nodes, &order, id) {
            Some(Err(OpError::Failed(reason))) => assert!(reason.contains("inconsistent")),
            other => panic!("{order:?}: {:?}", other.map(|r| r.map(|o| o.value))),
        }
    }
}

#[test]
fn a_writer_deletes_an_object_from_2f_plus_1_replicas_and_a_reader_cannot() {
    let mut nodes = nodes();
    let stored = write_all(&mut nodes, &value(9_000));
    let id = stored.id;
    let mut op = DeleteOp::new(place(0), OpId(3), id);
    let requests = op.start();
    assert_eq!(requests.len(), N);
    // A reader's delete is refused and changes nothing.
    let (_, request) = requests[0].clone();
    let reader = Access {
        write: false,
        read: true,
    };
    let refused = nodes[0].handle(reader, request);
    assert_eq!(
        refused.reply.unwrap().body,
        ResponseBody::Refused(Refusal::NotWriter)
    );
    assert!(refused.changes.is_empty());
    // Three replicas forget it; the delete is done then.
    let mut outcome = None;
    for (slot, request) in requests.into_iter().take(3) {
        let reply = Response {
            op: OpId(3),
            epoch: EPOCH,
            body: nodes[slot.index()].answer(request),
        };
        assert_eq!(reply.body, ResponseBody::Deleted);
        outcome = done(op.on_reply(slot, reply));
    }
    let outcome = outcome.expect("done at 2f+1").unwrap();
    assert_eq!(outcome.answered_by.len(), 3);
    for node in &nodes[..3] {
        assert!(node.disk.borrow().get(&id).is_none());
    }
    // What is left is one fragment: a read neither rebuilds the object nor denies it yet.
    assert!(read_from(&mut nodes, &[3], id).is_none());
    // Deleting again is answered the same.
    let again = nodes[0].answer(DeleteOp::new(place(0), OpId(4), id).start()[0].1.clone());
    assert_eq!(again, ResponseBody::Deleted);
}
