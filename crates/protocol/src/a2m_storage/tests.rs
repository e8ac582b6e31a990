//! A2M-Storage with a real trusted log (the software component, in memory): two writers racing
//! (spec T10), a crash between the disk and the log, and the server's lies of spec T9 (the
//! fork of the paper's Figure 1, replays, blocks no writer signed), each caught by the client.

use super::*;
use crate::machine::{OpError, Operation, Progress};
use bulwark_a2m::{A2m, Component, Limits};
use bulwark_core::Slot;
use bulwark_core::sign::SecretKey;

const REQUESTS: LogId = 10;
const VERSIONS: LogId = 11;

fn writer_key(index: u8) -> Arc<SecretKey> {
    Arc::new(SecretKey::from_seed(&[100 + index; 32]))
}

fn volume(log: &Component) -> Volume {
    Volume {
        id: 7,
        log_key: log.public_key(),
        requests: REQUESTS,
        versions: VERSIONS,
        writers: Arc::new(vec![writer_key(0).public_key(), writer_key(1).public_key()]),
    }
}

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).expect("a valid key")
}

const WRITER: Access = Access {
    write: true,
    read: true,
};
const READER: Access = Access {
    write: false,
    read: true,
};

/// One server, its trusted log and its disk, driven as a node would: changes durable first,
/// then the replies and the trusted-log calls, answers handed back at once.
struct Rig {
    log: Component,
    server: Server,
    disk: Disk,
    /// Replies not yet taken, by client.
    replies: Vec<(ClientId, Reply)>,
    /// When set, trusted-log calls are not made (the server crashes before they run).
    crash_before_log: bool,
    /// When set, the trusted log cannot be reached: every batch is refused at its first call,
    /// as the node's driver answers when the component's process is gone.
    log_down: bool,
}

impl Rig {
    fn new() -> Rig {
        let log = Component::in_memory(&[9; 32], Limits::default());
        let server = Server::new(volume(&log));
        Rig {
            log,
            server,
            disk: Disk::default(),
            replies: Vec::new(),
            crash_before_log: false,
            log_down: false,
        }
    }

    fn volume(&self) -> Volume {
        volume(&self.log)
    }

    fn effects(&mut self, output: Output<Server>) {
        for change in &output.changes {
            self.disk.apply(change);
        }
        for (client, _, reply) in output.notify {
            self.replies.push((client, reply));
        }
        for attest in output.attest {
            if self.crash_before_log {
                continue;
            }
            let answers = if self.log_down {
                vec![Err(bulwark_core::a2m::Refusal::Stopped(
                    "cannot reach the trusted log".into(),
                ))]
            } else {
                self.log.call_all(&attest.calls)
            };
            let next = self.server.on_attested(Time(0), attest.token, answers, &());
            self.effects(next);
        }
    }

    fn send(&mut self, client: u32, access: Access, request: Request) {
        let output = self
            .server
            .on_request(Time(0), ClientId(client), access, request, &());
        self.effects(output);
    }

    /// The replies to `client` so far.
    fn take(&mut self, client: u32) -> Vec<Reply> {
        let (mine, others) = std::mem::take(&mut self.replies)
            .into_iter()
            .partition(|(to, _)| to.0 == client);
        self.replies = others;
        mine.into_iter().map(|(_, reply)| reply).collect()
    }

    /// Runs `op` for `client` to its end.
    fn run<O>(&mut self, client: u32, access: Access, op: &mut O) -> Result<O::Output, OpError>
    where
        O: Operation<Request = Request, Reply = Reply>,
    {
        let mut sends = op.start();
        for _ in 0..(2 * client::ROUNDS_MAX + 4) {
            for (_, request) in sends.drain(..) {
                self.send(client, access, request);
            }
            for reply in self.take(client) {
                match op.on_reply(Slot(0), reply) {
                    Progress::Send(more) => sends.extend(more),
                    Progress::Done(result) => return result,
                }
            }
        }
        panic!("the operation did not end");
    }

    fn write(&mut self, writer: u8, key: &Key, value: Option<&str>) -> Result<Timestamp, OpError> {
        let mut op = self.writer_op(writer, key, value, u64::from(writer) + 1);
        self.run(u32::from(writer), WRITER, &mut op)
    }

    fn writer_op(&self, writer: u8, key: &Key, value: Option<&str>, op: u64) -> Write {
        Write::new(
            self.volume(),
            OpId(op),
            key.clone(),
            value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            u32::from(writer),
            writer_key(writer),
            [op as u8; 32],
            None,
        )
    }

    fn read(&mut self, client: u32, key: &Key) -> Result<(Option<Bytes>, Timestamp), OpError> {
        let mut op = Read::new(
            self.volume(),
            OpId(99),
            key.clone(),
            [client as u8; 32],
            None,
        );
        self.run(client, READER, &mut op)
    }
}

fn value(text: &str) -> Option<Bytes> {
    Some(Bytes::copy_from_slice(text.as_bytes()))
}

fn misbehaviour(result: Result<impl std::fmt::Debug, OpError>, says: &str) {
    match result {
        Err(OpError::Failed(reason)) => assert!(
            reason.contains("misbehaved") && reason.contains(says),
            "{reason}"
        ),
        other => panic!("the lie was believed: {other:?}"),
    }
}

#[test]
fn writes_and_reads_follow_one_history() {
    let mut rig = Rig::new();
    let (a, b) = (key("a"), key("b"));
    assert_eq!(rig.read(5, &a).expect("read").0, None);
    let first = rig.write(0, &a, Some("one")).expect("write");
    assert_eq!(first.seq, 1);
    let second = rig.write(1, &b, Some("two")).expect("write");
    assert_eq!(second.seq, 2);
    let (read, at) = rig.read(5, &a).expect("read");
    assert_eq!((read, at), (value("one"), second));
    let third = rig.write(0, &a, None).expect("delete");
    assert_eq!(rig.read(5, &a).expect("read"), (None, third));
    assert_eq!(rig.read(5, &b).expect("read").0, value("two"));
    assert_eq!(rig.server.timestamp(), third);
}

#[test]
fn of_two_writers_on_one_state_one_wins_and_the_other_computes_again() {
    let mut rig = Rig::new();
    let k = key("k");
    rig.write(0, &k, Some("before")).expect("write");
    let mut first = rig.writer_op(0, &k, Some("first"), 11);
    let mut second = rig.writer_op(1, &k, Some("second"), 12);
    // Both read the same state...
    let mut sends = Vec::new();
    for (client, op) in [(0, &mut first), (1, &mut second)] {
        for (_, request) in op.start() {
            rig.send(client, WRITER, request);
        }
        for reply in rig.take(client) {
            match op.on_reply(Slot(0), reply) {
                Progress::Send(more) => sends.push((client, more)),
                Progress::Done(result) => panic!("ended early: {result:?}"),
            }
        }
    }
    // ... then both write, conditioned on it: the first wins.
    let mut done = Vec::new();
    let mut stale = 0;
    while let Some((client, more)) = sends.pop() {
        for (_, request) in more {
            rig.send(client, WRITER, request);
        }
        let op = if client == 0 { &mut first } else { &mut second };
        for reply in rig.take(client) {
            if matches!(reply, Reply::Stale { .. }) {
                stale += 1;
            }
            match op.on_reply(Slot(0), reply) {
                Progress::Send(more) => sends.push((client, more)),
                Progress::Done(result) => done.push((client, result.expect("write"))),
            }
        }
    }
    assert_eq!(stale, 1, "exactly one write lost the race");
    let mut seqs: Vec<u64> = done.iter().map(|(_, t)| t.seq).collect();
    seqs.sort();
    assert_eq!(seqs, vec![2, 3], "both committed, one after the other");
    let last = done.iter().find(|(_, t)| t.seq == 3).map(|(c, _)| *c);
    let expected = if last == Some(0) { "first" } else { "second" };
    assert_eq!(rig.read(5, &k).expect("read").0, value(expected));
}

#[test]
fn a_write_durable_but_not_logged_is_logged_after_the_restart() {
    let mut rig = Rig::new();
    let k = key("k");
    rig.write(0, &k, Some("one")).expect("write");
    // Write two reaches the disk; the server crashes before its log takes it.
    let mut op = rig.writer_op(1, &k, Some("two"), 21);
    let fetch = op.start();
    for (_, request) in fetch {
        rig.send(1, WRITER, request);
    }
    let mut sends = Vec::new();
    for reply in rig.take(1) {
        if let Progress::Send(more) = op.on_reply(Slot(0), reply) {
            sends = more;
        }
    }
    rig.crash_before_log = true;
    for (_, request) in sends {
        rig.send(1, WRITER, request);
    }
    assert!(
        rig.take(1).is_empty(),
        "nothing answered before the log took it"
    );
    assert_eq!(rig.disk.last.as_ref().map(|l| l.2.seq), Some(2));
    rig.crash_before_log = false;
    rig.server = Server::restore(rig.volume(), &rig.disk);
    // The first request after the restart finds the log a write behind and completes it.
    let (read, at) = rig.read(5, &k).expect("read after the restart");
    assert_eq!((read, at.seq), (value("two"), 2));
    assert_eq!(rig.write(0, &k, Some("three")).expect("write").seq, 3);
}

#[test]
fn a_trusted_log_that_goes_away_mid_write_takes_the_write_when_it_returns() {
    let mut rig = Rig::new();
    let k = key("k");
    rig.write(0, &k, Some("one")).expect("write");
    let mut op = rig.writer_op(1, &k, Some("two"), 31);
    for (_, request) in op.start() {
        rig.send(1, WRITER, request);
    }
    let reply = rig.take(1).pop().expect("the state to compute on");
    let Progress::Send(write) = op.on_reply(Slot(0), reply) else {
        panic!("a write to send");
    };
    // The write reaches the disk; its appends are refused: the log's process is gone.
    rig.log_down = true;
    rig.send(1, WRITER, write[0].1.clone());
    assert!(
        rig.take(1).is_empty(),
        "a write the log did not take is not answered"
    );
    assert_eq!(rig.disk.last.as_ref().map(|l| l.2.seq), Some(2));
    // A read meanwhile is refused, saying why; nothing is served from an unchecked log.
    rig.send(
        5,
        READER,
        Request::Read {
            op: OpId(77),
            key: k.clone(),
            nonce: [5; 32],
        },
    );
    match rig.take(5).pop() {
        Some(Reply::Refused { reason, .. }) => assert!(reason.contains("trusted log"), "{reason}"),
        other => panic!("a read with the log down: {other:?}"),
    }
    // The log returns: the server checks where it ends and appends the write it holds; the
    // writer's retransmission gets the slots its write was given.
    rig.log_down = false;
    let output = rig.server.on_tick(Time(1));
    rig.effects(output);
    rig.send(1, WRITER, write[0].1.clone());
    let reply = rig.take(1).pop().expect("the retransmission answered");
    match op.on_reply(Slot(0), reply) {
        Progress::Done(result) => assert_eq!(result.expect("written").seq, 2),
        Progress::Send(_) => panic!("the write was computed again"),
    }
    let (read, at) = rig.read(5, &k).expect("read");
    assert_eq!((read, at.seq), (value("two"), 2));
}

#[test]
fn a_log_that_does_not_hold_the_state_stops_the_server() {
    let mut rig = Rig::new();
    let k = key("k");
    rig.write(0, &k, Some("one")).expect("write");
    rig.write(0, &k, Some("two")).expect("write");
    // The disk rolled back two writes: the log is ahead of it.
    let mut disk = Disk::default();
    let mut old = Rig::new();
    old.write(0, &k, Some("one")).expect("write");
    disk.objects = old.disk.objects.clone();
    disk.last = None;
    rig.server = Server::restore(rig.volume(), &disk);
    match rig.read(5, &k) {
        Err(OpError::Refused { reason, .. }) => {
            assert!(reason.contains("past the state"), "{reason}")
        }
        other => panic!("a rolled-back server served: {other:?}"),
    }
}

#[test]
fn the_fork_of_figure_1_is_caught_by_the_client_it_is_shown_to() {
    // The server keeps a second copy of its state without write 2a, and shows client b that
    // copy. Both copies share the one trusted log, which the server cannot fork.
    let mut rig = Rig::new();
    let k = key("k");
    rig.write(0, &k, Some("1")).expect("write 1");
    let mut forked = Server::restore(rig.volume(), &rig.disk);
    // A lying server does not check its log against its state.
    forked.recovered = true;
    // Client b reads state 1 and computes its write 2b on it...
    let mut write_b = rig.writer_op(1, &k, Some("2b"), 41);
    for (_, request) in write_b.start() {
        rig.send(1, WRITER, request);
    }
    let reply = rig.take(1).pop().expect("state 1");
    let Progress::Send(computed) = write_b.on_reply(Slot(0), reply) else {
        panic!("a write to send");
    };
    // ... while a's write 2a commits.
    rig.write(0, &k, Some("2a")).expect("write 2a");
    let honest = std::mem::replace(&mut rig.server, forked);
    // A read: the log's END names write 2a; the fork has only write 1's version block.
    misbehaviour(rig.read(6, &k), "not the one its log holds");
    // b's write reaches the fork, whose state is still 1: the log takes it at slot 3, not right
    // after write 1.
    for (_, request) in computed {
        rig.send(1, WRITER, request);
    }
    let reply = rig.take(1).pop().expect("an answer");
    match write_b.on_reply(Slot(0), reply) {
        Progress::Done(result) => misbehaviour(result, "right after write 1"),
        Progress::Send(_) => panic!("the write went on"),
    }
    rig.server = honest;
}

#[test]
fn replayed_and_forged_answers_are_refused() {
    let mut rig = Rig::new();
    let k = key("k");
    rig.write(0, &k, Some("one")).expect("write");
    // An old answer for another nonce, replayed to a new read.
    rig.send(
        5,
        READER,
        Request::Read {
            op: OpId(1),
            key: k.clone(),
            nonce: [1; 32],
        },
    );
    let old = rig.take(5).pop().expect("an answer");
    let Reply::State {
        op,
        nonce: answered,
        mut snapshot,
    } = old
    else {
        panic!("a state");
    };
    let mut read = Read::new(rig.volume(), OpId(1), k.clone(), [2; 32], None);
    read.start();
    // As a late answer to another request, it is not this read's answer...
    let late = Reply::State {
        op,
        nonce: answered,
        snapshot: snapshot.clone(),
    };
    assert!(matches!(read.on_reply(Slot(0), late), Progress::Send(sends) if sends.is_empty()));
    // ... and passed off as one, its attestations answer another nonce.
    let replayed = Reply::State {
        op,
        nonce: [2; 32],
        snapshot: snapshot.clone(),
    };
    match read.on_reply(Slot(0), replayed) {
        Progress::Done(result) => misbehaviour(result, "nonce"),
        Progress::Send(_) => panic!("no answer taken"),
    }
    // The same answer with another object in it.
    snapshot.value = value("forged");
    let mut read = Read::new(rig.volume(), OpId(1), k.clone(), [1; 32], None);
    read.start();
    match read.on_reply(
        Slot(0),
        Reply::State {
            op,
            nonce: answered,
            snapshot,
        },
    ) {
        Progress::Done(result) => misbehaviour(result, "not in the state"),
        Progress::Send(_) => panic!("no answer taken"),
    }
    // A state older than the one this client saw.
    let newer = rig.write(0, &k, Some("two")).expect("write");
    let mut read = Read::new(
        rig.volume(),
        OpId(3),
        k.clone(),
        [3; 32],
        Some(Timestamp {
            seq: newer.seq + 1,
            ..newer
        }),
    );
    misbehaviour(rig.run(5, READER, &mut read), "rollback");
}

#[test]
fn the_server_refuses_blocks_no_writer_signed_and_writes_by_readers() {
    let mut rig = Rig::new();
    let k = key("k");
    let mut op = rig.writer_op(0, &k, Some("x"), 31);
    let mut fetch = op.start();
    rig.send(0, WRITER, fetch.remove(0).1);
    let Some(reply) = rig.take(0).pop() else {
        panic!("an answer");
    };
    let Progress::Send(mut write) = op.on_reply(Slot(0), reply) else {
        panic!("a write to send");
    };
    let Request::Write {
        op: id,
        write,
        version,
    } = write.remove(0).1
    else {
        panic!("a write");
    };
    // Signed by a key that is no writer's.
    let outsider = SecretKey::from_seed(&[1; 32]);
    let block = *version
        .block
        .clone()
        .verify(&writer_key(0).public_key())
        .expect("signed")
        .value();
    let forged = Version {
        writer: 0,
        block: bulwark_core::sign::Signed::sign(&outsider, block)
            .expect("sign")
            .to_unverified(),
    };
    rig.send(
        0,
        WRITER,
        Request::Write {
            op: id,
            write: write.clone(),
            version: Box::new(forged),
        },
    );
    assert!(
        matches!(rig.take(0).pop(), Some(Reply::Refused { reason, .. }) if reason.contains("signature"))
    );
    // A block for another root than the write makes.
    let wrong = Version {
        writer: 0,
        block: bulwark_core::sign::Signed::sign(
            &writer_key(0),
            VersionBlock {
                root: [5; 32],
                ..block
            },
        )
        .expect("sign")
        .to_unverified(),
    };
    rig.send(
        0,
        WRITER,
        Request::Write {
            op: id,
            write: write.clone(),
            version: Box::new(wrong),
        },
    );
    assert!(
        matches!(rig.take(0).pop(), Some(Reply::Refused { reason, .. }) if reason.contains("not the state"))
    );
    // A client that may not even read.
    rig.send(
        6,
        Access {
            write: false,
            read: false,
        },
        Request::Read {
            op: OpId(2),
            key: k.clone(),
            nonce: [6; 32],
        },
    );
    assert!(
        matches!(rig.take(6).pop(), Some(Reply::Refused { reason, .. }) if reason.contains("may not read"))
    );
    // A client that may only read.
    rig.send(
        5,
        READER,
        Request::Write {
            op: id,
            write,
            version,
        },
    );
    assert!(
        matches!(rig.take(5).pop(), Some(Reply::Refused { reason, .. }) if reason.contains("may not write"))
    );
    assert_eq!(
        rig.server.timestamp(),
        Timestamp::GENESIS,
        "nothing was taken"
    );
}

#[test]
fn a_retransmitted_write_is_answered_as_the_write_it_was() {
    let mut rig = Rig::new();
    let k = key("k");
    // One write, and the same machine again: it sends the same bytes, as a retransmission does.
    let mut ops = [
        rig.writer_op(0, &k, Some("once"), 51),
        rig.writer_op(0, &k, Some("once"), 51),
    ];
    let mut writes = Vec::new();
    for op in &mut ops {
        for (_, request) in op.start() {
            rig.send(0, WRITER, request);
        }
        let reply = rig.take(0).pop().expect("state");
        let Progress::Send(write) = op.on_reply(Slot(0), reply) else {
            panic!("a write to send");
        };
        writes.push(write[0].1.clone());
    }
    // The write goes out twice, another writer's write in between.
    rig.send(0, WRITER, writes[0].clone());
    rig.write(1, &key("other"), Some("x"))
        .expect("another write");
    rig.send(0, WRITER, writes[1].clone());
    let replies = rig.take(0);
    assert_eq!(replies.len(), 2);
    for (op, reply) in ops.iter_mut().zip(replies) {
        match op.on_reply(Slot(0), reply) {
            Progress::Done(result) => assert_eq!(result.expect("written").seq, 1),
            Progress::Send(_) => panic!("the write was computed again"),
        }
    }
    assert_eq!(rig.server.timestamp().seq, 2, "the write was taken once");
}

#[test]
fn the_logs_forget_old_writes_instead_of_filling_up() {
    let log = Component::in_memory(
        &[9; 32],
        Limits {
            logs_max: 4,
            entries_max: (RECENT_WRITES + TRUNCATE_EVERY + 2) as usize,
        },
    );
    let mut rig = Rig {
        server: Server::new(volume(&log)),
        log,
        ..Rig::new()
    };
    let k = key("k");
    rig.write(0, &k, Some("first")).expect("write");
    // A write computed on the state after the first one, whose sender goes quiet for a while.
    let mut late = rig.writer_op(1, &k, Some("late"), 61);
    for (_, request) in late.start() {
        rig.send(1, WRITER, request);
    }
    let reply = rig.take(1).pop().expect("state");
    let Progress::Send(late_write) = late.on_reply(Slot(0), reply) else {
        panic!("a write to send");
    };
    let writes = RECENT_WRITES + 2 * TRUNCATE_EVERY + 1;
    for i in 1..writes {
        let at = rig
            .write((i % 2) as u8, &k, Some(&i.to_string()))
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        assert_eq!(at.seq, i + 1);
    }
    assert_eq!(
        rig.read(5, &k).expect("read").0,
        value(&(writes - 1).to_string())
    );
    // It comes back: the server no longer knows whether it took it, and says so rather than
    // having it computed again (which could take it twice).
    for (_, request) in late_write {
        rig.send(1, WRITER, request);
    }
    match rig.take(1).pop() {
        Some(Reply::Refused { reason, .. }) => assert!(reason.contains("too old"), "{reason}"),
        other => panic!("an old write was answered {other:?}"),
    }
    assert_eq!(rig.server.timestamp().seq, writes);
}
