use super::*;

const GROUP: GroupId = GroupId(0);

fn key(k: &str) -> Key {
    Key::new(k.as_bytes().to_vec()).unwrap()
}

fn signing(writer: u8) -> SigningKey {
    SigningKey::from_seed(&[writer + 1; 32])
}

fn writers() -> Arc<Writers> {
    let mut writers = Writers::default();
    for w in 0..2u8 {
        writers
            .register(ClientId(w as u32), &signing(w).public_key().to_bytes())
            .unwrap();
    }
    Arc::new(writers)
}

fn ts(num: u64, writer: u32) -> Timestamp {
    Timestamp {
        num,
        writer: ClientId(writer),
        seq: num,
    }
}

fn entry(num: u64, value: &str) -> Entry {
    Entry::sign(
        GROUP,
        &key("k"),
        ts(num, 0),
        Some(Bytes::from(value.to_string())),
        &signing(0),
    )
}

fn request(op: u64, body: RequestBody) -> Request {
    Request {
        op: OpId(op),
        epoch: Epoch(0),
        group: GROUP,
        key: key("k"),
        body,
    }
}

fn servers(n: usize) -> Vec<Server> {
    (0..n)
        .map(|i| Server::new(Slot(i as u32), Epoch(0), GROUP, writers()))
        .collect()
}

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
        let handled = servers[to.index()].handle(ClientId(0), true, true, request);
        match feed(to, handled.reply) {
            Step::Continue(more) => queue.extend(more),
            Step::Done(result) => return result.unwrap(),
        }
    }
    panic!("operation did not finish");
}

#[test]
fn weak_and_malformed_keys_are_refused_at_registration() {
    let mut writers = Writers::default();
    // The identity point: small order, so "signatures" under it prove nothing.
    let mut identity = [0u8; 32];
    identity[0] = 1;
    assert!(matches!(
        writers.register(ClientId(0), &identity),
        Err(bulwark_core::sign::SignError::WeakKey)
    ));
    // Not a point at all (y = 2 has no x on the curve).
    let mut off_curve = [0u8; 32];
    off_curve[0] = 2;
    assert!(matches!(
        writers.register(ClientId(0), &off_curve),
        Err(bulwark_core::sign::SignError::InvalidKey)
    ));
    assert!(
        writers
            .register(ClientId(0), &signing(0).public_key().to_bytes())
            .is_ok()
    );
}

#[test]
fn signatures_bind_group_key_timestamp_value_and_writer() {
    let writers = writers();
    let good = entry(3, "v");
    assert!(writers.verify(GROUP, &key("k"), &good));
    assert!(
        !writers.verify(GroupId(1), &key("k"), &good),
        "another group"
    );
    assert!(!writers.verify(GROUP, &key("other"), &good), "another key");
    let mut changed = good.clone();
    changed.value = Some(Bytes::from("w"));
    assert!(!writers.verify(GROUP, &key("k"), &changed), "another value");
    let mut changed = good.clone();
    changed.value = None;
    assert!(!writers.verify(GROUP, &key("k"), &changed), "a tombstone");
    let mut changed = good.clone();
    changed.ts.num = 4;
    assert!(!writers.verify(GROUP, &key("k"), &changed), "another ts");
    let mut changed = good.clone();
    changed.ts.writer = ClientId(1);
    assert!(
        !writers.verify(GROUP, &key("k"), &changed),
        "another writer"
    );
    let mut changed = good.clone();
    changed.signature = changed.signature.slice(..63);
    assert!(
        !writers.verify(GROUP, &key("k"), &changed),
        "short signature"
    );
    let unregistered = Entry::sign(GROUP, &key("k"), ts(1, 7), None, &signing(7));
    assert!(!writers.verify(GROUP, &key("k"), &unregistered));
}

#[test]
fn server_stores_only_verified_versions_and_keeps_the_highest() {
    let mut server = Server::new(Slot(0), Epoch(0), GROUP, writers());
    let stored = server.handle(
        ClientId(0),
        true,
        true,
        request(1, RequestBody::Store(entry(5, "new"))),
    );
    assert_eq!(stored.changes.len(), 1);
    assert_eq!(stored.reply.body, ResponseBody::StoreAck(ts(5, 0)));
    let older = server.handle(
        ClientId(0),
        true,
        true,
        request(2, RequestBody::Store(entry(3, "old"))),
    );
    assert!(older.changes.is_empty());
    let again = server.handle(
        ClientId(0),
        true,
        true,
        request(1, RequestBody::Store(entry(5, "new"))),
    );
    assert!(
        again.changes.is_empty(),
        "a retransmission is not rewritten"
    );

    let mut forged = entry(9, "forged");
    forged.value = Some(Bytes::from("swapped"));
    let refused = server.handle(
        ClientId(0),
        true,
        true,
        request(3, RequestBody::WriteBack(forged)),
    );
    assert_eq!(refused.refused, Some(Refusal::BadSignature));
    assert!(refused.changes.is_empty());

    // Writer 1 may not store a version signed as writer 0's.
    let impostor = server.handle(
        ClientId(1),
        true,
        true,
        request(4, RequestBody::Store(entry(9, "x"))),
    );
    assert_eq!(impostor.refused, Some(Refusal::NotWriter));
    // A reader may write back any writer's signed version.
    let write_back = server.handle(
        ClientId(5),
        false,
        true,
        request(5, RequestBody::WriteBack(entry(9, "x"))),
    );
    assert_eq!(write_back.refused, None);
    assert_eq!(write_back.changes.len(), 1);
    assert_eq!(
        server
            .handle(
                ClientId(5),
                false,
                true,
                request(6, RequestBody::Store(entry(10, "x")))
            )
            .refused,
        Some(Refusal::NotWriter)
    );
    assert_eq!(
        server
            .handle(ClientId(0), true, false, request(7, RequestBody::Get))
            .refused,
        Some(Refusal::NotReader)
    );
    let clock = server.handle(ClientId(0), true, true, request(9, RequestBody::Clock));
    let ResponseBody::ClockAck(Some(signed)) = clock.reply.body else {
        panic!("CLOCK answers the stored timestamp");
    };
    assert_eq!(signed.ts, ts(9, 0));
    assert!(
        writers().verify_timestamp(GROUP, &key("k"), &signed),
        "verifiable without the value"
    );
    let get = server.handle(ClientId(0), true, true, request(8, RequestBody::Get));
    assert_eq!(get.reply.body, ResponseBody::Value(Some(entry(9, "x"))));
    assert_eq!(get.reply.op, OpId(8));

    // Restoring a version damaged on disk keeps nothing.
    let mut fresh = Server::new(Slot(0), Epoch(0), GROUP, writers());
    let mut damaged = entry(2, "v");
    damaged.value = Some(Bytes::from("rotted"));
    assert!(!fresh.restore(key("k"), damaged));
    assert!(fresh.stored(&key("k")).is_none());
    assert!(fresh.restore(key("k"), entry(2, "v")));
}

fn value_reply(op: u64, e: Option<Entry>) -> Response {
    Response {
        op: OpId(op),
        epoch: Epoch(0),
        body: ResponseBody::Value(e),
    }
}

#[test]
fn read_ignores_forgeries_names_the_forger_and_writes_back_on_disagreement() {
    let config = ClientConfig::new(1, writers());
    let mut op = ReadOp::new(config, key("k"), OpId(1));
    op.start();
    let mut forged = entry(50, "forged");
    forged.value = Some(Bytes::from("lie"));
    op.on_response(Slot(3), value_reply(1, Some(forged)));
    op.on_response(Slot(0), value_reply(1, Some(entry(4, "new"))));
    let Step::Continue(write_back) = op.on_response(Slot(1), value_reply(1, Some(entry(4, "new"))))
    else {
        panic!("3 replies but one forged: must write back");
    };
    assert_eq!(write_back.len(), 4);
    assert!(
        write_back
            .iter()
            .all(|(_, r)| r.body == RequestBody::WriteBack(entry(4, "new")))
    );
    let ack = |op| Response {
        op: OpId(op),
        epoch: Epoch(0),
        body: ResponseBody::StoreAck(ts(4, 0)),
    };
    for node in [0, 1] {
        assert!(matches!(op.on_response(Slot(node), ack(1)), Step::Continue(v) if v.is_empty()));
    }
    let Step::Done(Ok(outcome)) = op.on_response(Slot(2), ack(1)) else {
        panic!("n - f acks");
    };
    assert_eq!(outcome.value, Some(Bytes::from("new")));
    assert!(outcome.wrote_back);
    assert_eq!(outcome.forgers, vec![Slot(3)]);
}

#[test]
fn read_skips_the_write_back_only_when_n_minus_f_hold_the_version() {
    let config = ClientConfig::new(1, writers());
    let mut op = ReadOp::new(config.clone(), key("k"), OpId(1));
    op.start();
    op.on_response(Slot(0), value_reply(1, Some(entry(4, "v"))));
    op.on_response(Slot(1), value_reply(1, Some(entry(4, "v"))));
    let Step::Done(Ok(outcome)) = op.on_response(Slot(2), value_reply(1, Some(entry(4, "v"))))
    else {
        panic!("n - f agree: one round");
    };
    assert!(!outcome.wrote_back);
    assert_eq!(outcome.value, Some(Bytes::from("v")));

    // Two agree, one is behind: the version must be written back.
    let mut op = ReadOp::new(config, key("k"), OpId(2));
    op.start();
    op.on_response(Slot(0), value_reply(2, Some(entry(4, "v"))));
    op.on_response(Slot(1), value_reply(2, Some(entry(4, "v"))));
    assert!(matches!(
        op.on_response(Slot(2), value_reply(2, Some(entry(3, "old")))),
        Step::Continue(v) if v.len() == 4
    ));
}

#[test]
fn writer_ignores_unsigned_timestamps() {
    let config = ClientConfig::new(1, writers());
    let mut op = WriteOp::new(
        config,
        key("k"),
        OpId(1),
        ClientId(1),
        77,
        Arc::new(signing(1)),
        Some(Bytes::from("v")),
    );
    op.start();
    let clock = |e: Option<Entry>| Response {
        op: OpId(1),
        epoch: Epoch(0),
        body: ResponseBody::ClockAck(e.map(|e| e.signed_timestamp())),
    };
    let mut inflated = entry(1_000_000, "x");
    inflated.signature = Bytes::from(vec![0u8; 64]);
    op.on_response(Slot(0), clock(Some(inflated)));
    op.on_response(Slot(1), clock(Some(entry(6, "v"))));
    let Step::Continue(stores) = op.on_response(Slot(2), clock(None)) else {
        panic!("n - f answered");
    };
    let RequestBody::Store(stored) = &stores[0].1.body else {
        panic!("STORE follows CLOCK");
    };
    assert_eq!(
        stored.ts,
        Timestamp {
            num: 7,
            writer: ClientId(1),
            seq: 77
        },
        "the forged timestamp is ignored"
    );
    assert!(writers().verify(GROUP, &key("k"), stored));
}

#[test]
fn a_partial_write_seen_by_one_read_is_seen_by_every_later_read() {
    let mut servers = servers(4);
    // The write reached node 0 only; node 3 is Byzantine-silent for the first read.
    servers[0].handle(
        ClientId(0),
        true,
        true,
        request(1, RequestBody::Store(entry(5, "partial"))),
    );
    let config = ClientConfig::new(1, writers());
    let mut read = ReadOp::new(config.clone(), key("k"), OpId(2));
    let first = read.start();
    let outcome = run(&mut servers, &[3], first, |n, r| read.on_response(n, r));
    assert_eq!(outcome.value, Some(Bytes::from("partial")));
    assert!(outcome.wrote_back);
    let mut later = ReadOp::new(config, key("k"), OpId(3));
    let first = later.start();
    let outcome = run(&mut servers, &[0], first, |n, r| later.on_response(n, r));
    assert_eq!(outcome.value, Some(Bytes::from("partial")));
}

#[test]
fn writes_and_deletes_round_trip() {
    let mut servers = servers(4);
    let config = ClientConfig::new(1, writers());
    for (i, value) in [Some("one"), Some("two"), None].into_iter().enumerate() {
        let mut write = WriteOp::new(
            config.clone(),
            key("k"),
            OpId(10 + i as u64),
            ClientId(0),
            i as u64,
            Arc::new(signing(0)),
            value.map(Bytes::from),
        );
        let first = write.start();
        let outcome = run(&mut servers, &[i % 4], first, |n, r| {
            write.on_response(n, r)
        });
        assert_eq!(outcome.ts.num, i as u64 + 1);
        let mut read = ReadOp::new(config.clone(), key("k"), OpId(20 + i as u64));
        let first = read.start();
        let got = run(&mut servers, &[(i + 1) % 4], first, |n, r| {
            read.on_response(n, r)
        });
        assert_eq!(got.value, value.map(Bytes::from));
    }
}

#[test]
fn a_weak_key_in_the_configuration_is_refused_naming_its_field() {
    use bulwark_core::config::{ClientEntry, ClusterConfig, Fingerprint, Protocol};
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let client = |id, name: &str, write, signing_key| ClientEntry {
        id,
        name: name.into(),
        fingerprint: Fingerprint([name.len() as u8; 32]),
        write,
        read: true,
        signing_key,
    };
    let mut cluster = ClusterConfig {
        protocol: Protocol::Phalanx,
        f: 1,
        epoch: 0,
        nodes: Vec::new(),
        clients: vec![
            client(0, "admin", true, Some(signing(0).public_key().to_bytes())),
            client(1, "reader", false, None),
            client(2, "mallory", true, Some(identity)),
        ],
        configuration_service: None,
    };
    let error = Writers::from_config(&cluster, "cluster.toml")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("clients[2].signing_key") && error.contains("weak"),
        "{error}"
    );
    cluster.clients.pop();
    let writers = Writers::from_config(&cluster, "cluster.toml").unwrap();
    assert!(writers.verify(GROUP, &key("k"), &entry(1, "v")));
}
