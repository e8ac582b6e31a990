use super::*;

fn key(k: &str) -> Key {
    Key::new(k.as_bytes().to_vec()).unwrap()
}

fn ts(num: u64, writer: u32) -> Timestamp {
    Timestamp {
        num,
        writer: ClientId(writer),
        seq: num,
    }
}

fn entry(num: u64, value: &str) -> Entry {
    Entry {
        ts: ts(num, 0),
        value: Some(Bytes::from(value.to_string())),
    }
}

fn request(op: u64, body: RequestBody) -> Request {
    Request {
        op: OpId(op),
        epoch: Epoch(0),
        group: GroupId(0),
        key: key("k"),
        body,
    }
}

fn servers(n: usize) -> Vec<Server> {
    (0..n)
        .map(|i| Server::new(Slot(i as u32), Epoch(0), GroupId(0)))
        .collect()
}

/// Delivers every outbound message to `servers` (skipping `down`), feeding replies back, until
/// the operation finishes.
fn run<T>(
    servers: &mut [Server],
    down: &[usize],
    first: Vec<Outbound>,
    mut feed: impl FnMut(Slot, Response) -> Step<T>,
) -> T {
    let mut queue = first;
    while let Some((to, request)) = queue.pop() {
        if down.contains(&to.index()) {
            continue;
        }
        let handled = servers[to.index()].handle(true, true, request);
        match feed(to, handled.reply) {
            Step::Continue(more) => queue.extend(more),
            Step::Done(result) => return result.unwrap(),
        }
    }
    panic!("operation did not finish");
}

#[test]
fn store_keeps_only_the_highest_version_and_acks_either_way() {
    let mut server = Server::new(Slot(0), Epoch(0), GroupId(0));
    let newer = server.handle(true, true, request(1, RequestBody::Store(entry(5, "new"))));
    assert_eq!(newer.changes.len(), 1, "a newer version is persisted");
    assert_eq!(newer.reply.body, ResponseBody::StoreAck(ts(5, 0)));
    let older = server.handle(true, true, request(2, RequestBody::Store(entry(3, "old"))));
    assert!(older.changes.is_empty(), "an older version changes nothing");
    assert_eq!(older.reply.body, ResponseBody::StoreAck(ts(3, 0)));
    let again = server.handle(true, true, request(1, RequestBody::Store(entry(5, "new"))));
    assert!(
        again.changes.is_empty(),
        "a retransmission is not rewritten"
    );
    let get = server.handle(true, true, request(3, RequestBody::Get));
    assert_eq!(get.reply.body, ResponseBody::Value(Some(entry(5, "new"))));
    let clock = server.handle(true, true, request(4, RequestBody::Clock));
    assert_eq!(clock.reply.body, ResponseBody::ClockAck(Some(ts(5, 0))));
    assert_eq!(clock.reply.op, OpId(4));
}

#[test]
fn server_refuses_what_it_must_not_serve() {
    let mut server = Server::new(Slot(0), Epoch(0), GroupId(0));
    let refusal = |h: Handled| h.refused.unwrap();
    assert_eq!(
        refusal(server.handle(false, true, request(1, RequestBody::Store(entry(1, "v"))))),
        Refusal::NotWriter
    );
    assert_eq!(
        refusal(server.handle(false, true, request(1, RequestBody::Clock))),
        Refusal::NotWriter
    );
    assert_eq!(
        refusal(server.handle(true, false, request(1, RequestBody::Get))),
        Refusal::NotReader
    );
    assert!(matches!(
        refusal(server.handle(true, true, request(1, RequestBody::Store(entry(0, "v"))))),
        Refusal::Malformed(_)
    ));
    let huge = Entry {
        ts: ts(1, 0),
        value: Some(Bytes::from(vec![0u8; OBJECT_BYTES_MAX + 1])),
    };
    assert!(matches!(
        refusal(server.handle(true, true, request(1, RequestBody::WriteBack(huge)))),
        Refusal::Malformed(_)
    ));
    let mut wrong = request(1, RequestBody::Get);
    wrong.epoch = Epoch(9);
    assert_eq!(
        refusal(server.handle(true, true, wrong)),
        Refusal::WrongEpoch { current: Epoch(0) }
    );
    let mut wrong = request(1, RequestBody::Get);
    wrong.group = GroupId(9);
    assert_eq!(
        refusal(server.handle(true, true, wrong)),
        Refusal::WrongGroup
    );
    assert!(
        server.stored(&key("k")).is_none(),
        "nothing refused was stored"
    );
    // A reader may write back, since reads must.
    let wb = server.handle(
        false,
        true,
        request(2, RequestBody::WriteBack(entry(1, "v"))),
    );
    assert!(wb.refused.is_none());
    assert_eq!(wb.changes.len(), 1);
}

#[test]
fn write_takes_the_highest_majority_timestamp_plus_one() {
    let config = ClientConfig::new(1);
    let mut op = WriteOp::new(
        config,
        key("k"),
        OpId(7),
        ClientId(3),
        99,
        Some(Bytes::from("v")),
    );
    let first = op.start();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|(_, r)| r.body == RequestBody::Clock));
    let ack = |t: Option<Timestamp>| Response {
        op: OpId(7),
        epoch: Epoch(0),
        body: ResponseBody::ClockAck(t),
    };
    assert!(
        matches!(op.on_response(Slot(0), ack(Some(ts(4, 1)))), Step::Continue(v) if v.is_empty())
    );
    // A duplicate from the same node does not make a quorum.
    assert!(
        matches!(op.on_response(Slot(0), ack(Some(ts(9, 1)))), Step::Continue(v) if v.is_empty())
    );
    // A reply to another operation is ignored.
    let other = Response {
        op: OpId(8),
        epoch: Epoch(0),
        body: ResponseBody::ClockAck(Some(ts(50, 1))),
    };
    assert!(matches!(op.on_response(Slot(1), other), Step::Continue(v) if v.is_empty()));
    let Step::Continue(stores) = op.on_response(Slot(2), ack(Some(ts(6, 2)))) else {
        panic!("a majority answered");
    };
    assert_eq!(stores.len(), 3);
    let RequestBody::Store(entry) = &stores[0].1.body else {
        panic!("STORE follows CLOCK");
    };
    assert_eq!(
        entry.ts,
        Timestamp {
            num: 7,
            writer: ClientId(3),
            seq: 99
        }
    );
    let store_ack = |t| Response {
        op: OpId(7),
        epoch: Epoch(0),
        body: ResponseBody::StoreAck(t),
    };
    // An ack for another version does not count.
    assert!(
        matches!(op.on_response(Slot(1), store_ack(ts(3, 0))), Step::Continue(v) if v.is_empty())
    );
    assert!(
        matches!(op.on_response(Slot(1), store_ack(entry.ts)), Step::Continue(v) if v.is_empty())
    );
    assert_eq!(op.retransmit().len(), 2, "only nodes that have not acked");
    let Step::Done(Ok(outcome)) = op.on_response(Slot(0), store_ack(entry.ts)) else {
        panic!("a majority acked");
    };
    assert_eq!(outcome.acknowledged_by, vec![Slot(0), Slot(1)]);
}

#[test]
fn read_writes_back_when_the_quorum_disagrees() {
    let config = ClientConfig::new(1);
    let mut op = ReadOp::new(config, key("k"), OpId(1));
    op.start();
    let value = |e: Option<Entry>| Response {
        op: OpId(1),
        epoch: Epoch(0),
        body: ResponseBody::Value(e),
    };
    assert!(matches!(
        op.on_response(Slot(0), value(Some(entry(2, "old")))),
        Step::Continue(_)
    ));
    let Step::Continue(write_back) = op.on_response(Slot(1), value(Some(entry(3, "new")))) else {
        panic!("a majority answered with different versions: the read must write back");
    };
    assert_eq!(write_back.len(), 3);
    assert!(
        write_back
            .iter()
            .all(|(_, r)| r.body == RequestBody::WriteBack(entry(3, "new")))
    );
    let ack = Response {
        op: OpId(1),
        epoch: Epoch(0),
        body: ResponseBody::StoreAck(ts(3, 0)),
    };
    assert!(matches!(op.on_response(Slot(0), ack.clone()), Step::Continue(v) if v.is_empty()));
    let Step::Done(Ok(outcome)) = op.on_response(Slot(2), ack) else {
        panic!("a majority acked the write-back");
    };
    assert_eq!(outcome.value, Some(Bytes::from("new")));
    assert!(outcome.wrote_back);
}

#[test]
fn read_skips_the_write_back_only_when_the_whole_quorum_holds_the_version() {
    let config = ClientConfig::new(1);
    let mut op = ReadOp::new(config.clone(), key("k"), OpId(1));
    op.start();
    let value = |e: Option<Entry>| Response {
        op: OpId(1),
        epoch: Epoch(0),
        body: ResponseBody::Value(e),
    };
    op.on_response(Slot(0), value(Some(entry(3, "v"))));
    let Step::Done(Ok(outcome)) = op.on_response(Slot(2), value(Some(entry(3, "v")))) else {
        panic!("a majority agrees: done in one round");
    };
    assert_eq!(outcome.value, Some(Bytes::from("v")));
    assert!(!outcome.wrote_back);

    // One node of the majority has nothing: the version must be written back.
    let mut op = ReadOp::new(config.clone(), key("k"), OpId(2));
    op.start();
    let value = |e: Option<Entry>| Response {
        op: OpId(2),
        epoch: Epoch(0),
        body: ResponseBody::Value(e),
    };
    op.on_response(Slot(0), value(Some(entry(3, "v"))));
    assert!(matches!(op.on_response(Slot(1), value(None)), Step::Continue(v) if v.len() == 3));

    // Nothing anywhere: absent at once.
    let mut op = ReadOp::new(config, key("k"), OpId(3));
    op.start();
    let value = |e: Option<Entry>| Response {
        op: OpId(3),
        epoch: Epoch(0),
        body: ResponseBody::Value(e),
    };
    op.on_response(Slot(0), value(None));
    let Step::Done(Ok(outcome)) = op.on_response(Slot(1), value(None)) else {
        panic!("done");
    };
    assert_eq!((outcome.value, outcome.ts), (None, None));
}

#[test]
fn a_read_after_a_partial_write_is_seen_by_every_later_read() {
    // A write reached only node 0 (its writer crashed). A read that sees it must make it
    // visible to every later read, whichever majority that read meets.
    let mut servers = servers(3);
    servers[0].handle(
        true,
        true,
        request(1, RequestBody::Store(entry(5, "partial"))),
    );
    let config = ClientConfig::new(1);
    let mut read = ReadOp::new(config.clone(), key("k"), OpId(2));
    let first = read.start();
    let outcome = run(&mut servers, &[2], first, |n, r| read.on_response(n, r));
    assert_eq!(outcome.value, Some(Bytes::from("partial")));
    assert!(outcome.wrote_back);
    // A later read that misses node 0 still returns it.
    let mut later = ReadOp::new(config, key("k"), OpId(3));
    let first = later.start();
    let outcome = run(&mut servers, &[0], first, |n, r| later.on_response(n, r));
    assert_eq!(outcome.value, Some(Bytes::from("partial")));
}

#[test]
fn writes_then_deletes_round_trip_through_a_majority() {
    let mut servers = servers(3);
    let config = ClientConfig::new(1);
    for (i, value) in [Some("one"), Some("two"), None].into_iter().enumerate() {
        let down = [i % 3];
        let mut write = WriteOp::new(
            config.clone(),
            key("k"),
            OpId(10 + i as u64),
            ClientId(1),
            i as u64,
            value.map(Bytes::from),
        );
        let first = write.start();
        let outcome = run(&mut servers, &down, first, |n, r| write.on_response(n, r));
        assert_eq!(
            outcome.ts.num,
            i as u64 + 1,
            "each write follows the previous"
        );
        let mut read = ReadOp::new(config.clone(), key("k"), OpId(20 + i as u64));
        let first = read.start();
        let down = [(i + 1) % 3];
        let got = run(&mut servers, &down, first, |n, r| read.on_response(n, r));
        assert_eq!(got.value, value.map(Bytes::from));
    }
    assert_eq!(
        servers[1].stats().objects,
        0,
        "a tombstone is not an object"
    );
}

#[test]
fn f_plus_one_refusals_end_an_operation() {
    let config = ClientConfig::new(1);
    let mut op = WriteOp::new(config, key("k"), OpId(1), ClientId(0), 0, None);
    op.start();
    let refused = Response {
        op: OpId(1),
        epoch: Epoch(0),
        body: ResponseBody::Refused(Refusal::NotWriter),
    };
    assert!(matches!(
        op.on_response(Slot(0), refused.clone()),
        Step::Continue(_)
    ));
    let Step::Done(Err(ProtocolError::Refused { refusal, nodes })) =
        op.on_response(Slot(1), refused)
    else {
        panic!("f+1 refusals");
    };
    assert_eq!(refusal, Refusal::NotWriter);
    assert_eq!(nodes.len(), 2);
}
