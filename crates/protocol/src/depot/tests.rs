//! The log and the node against the rules of Depot §3-§5, one rule per test, with forks and
//! tampering written by hand.

use super::log::{CLOCK_AHEAD_MAX_MICROS, ForkProof, Offer, Refusal};
use super::node::{Change, Message, Node, ReadStart};
use super::update::{
    Dep, Member, Role, Staleness, Update, UpdateBody, UpdateId, ValueRef, VolumeConfig, VolumeId,
    WireUpdate, Writer, history_hash, value_hash,
};
use bulwark_core::Key;
use bulwark_core::sign::{SecretKey, Signed};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;

const NOW: u64 = 1_000_000_000;

fn secret(i: u32) -> SecretKey {
    SecretKey::from_seed(&[i as u8 + 1; 32])
}

/// Servers 0 and 1; clients 2, 3 and 4 (4 is the one that forks), each writing keys under its own
/// prefix `c<i>/` and the shared prefix `shared/`.
fn config() -> Arc<VolumeConfig> {
    let members = (0..5)
        .map(|i| Member {
            key: secret(i).public_key(),
            role: if i < 2 { Role::Server } else { Role::Client },
            writes: if i < 2 {
                Vec::new()
            } else {
                vec![format!("c{i}/").into_bytes(), b"shared/".to_vec()]
            },
        })
        .collect();
    Arc::new(VolumeConfig {
        volume: VolumeId(7),
        label: "test".into(),
        members,
        staleness: Staleness::default(),
    })
}

fn node(i: u32) -> Node {
    Node::new(config(), Writer(i), secret(i))
}

fn key(text: &str) -> Key {
    Key::new(Bytes::from(text.to_string())).expect("a valid key")
}

fn put(node: &mut Node, k: &str, v: &str) -> Update {
    node.write(key(k), Some(Bytes::from(v.to_string())), NOW).0
}

/// Delivers messages among `nodes` until none is left; starts with each pulling from each.
fn exchange(nodes: &mut [&mut Node]) {
    exchange_at(nodes, NOW);
}

/// [`exchange`] at time `now`, returning the changes each node made.
fn exchange_at(
    nodes: &mut [&mut Node],
    now: u64,
) -> std::collections::BTreeMap<Writer, Vec<Change>> {
    let mut changes: std::collections::BTreeMap<Writer, Vec<Change>> = Default::default();
    let mut queue: VecDeque<(Writer, Writer, Message)> = VecDeque::new();
    for a in 0..nodes.len() {
        for b in 0..nodes.len() {
            if a != b {
                let to = nodes[b].me();
                let from = nodes[a].me();
                queue.push_back((from, to, nodes[a].pull(to)));
            }
        }
    }
    let mut steps = 0;
    while let Some((from, to, message)) = queue.pop_front() {
        steps += 1;
        assert!(steps < 10_000, "the exchange ends");
        let Some(target) = nodes.iter_mut().find(|n| n.me() == to) else {
            continue;
        };
        let out = target.on_message(from, message, now);
        changes.entry(to).or_default().extend(out.changes);
        for (peer, message) in out.sends {
            queue.push_back((to, peer, message));
        }
    }
    changes
}

fn values(node: &Node, k: &str) -> Vec<String> {
    let mut values: Vec<String> = node
        .log()
        .heads(&key(k))
        .iter()
        .map(|head| {
            let hash = head.body().value.expect("a value").hash;
            assert!(node.has_value(&hash) || node.me().0 >= 2, "servers hoard");
            format!("{}@{}", head.body().writer.0, head.body().clock)
        })
        .collect();
    values.sort();
    values
}

/// A signed update with every field chosen by the test: what a faulty writer can send.
fn forge(
    writer: u32,
    clock: u64,
    k: &str,
    prev: Option<UpdateId>,
    deps: Vec<Dep>,
    history_of: &[(Writer, u64, UpdateId)],
) -> Update {
    forge_value(writer, clock, k, k, prev, deps, history_of)
}

/// [`forge`] with a value other than the key.
fn forge_value(
    writer: u32,
    clock: u64,
    k: &str,
    v: &str,
    prev: Option<UpdateId>,
    deps: Vec<Dep>,
    history_of: &[(Writer, u64, UpdateId)],
) -> Update {
    let body = UpdateBody {
        volume: VolumeId(7),
        writer: Writer(writer),
        clock,
        key: key(k),
        value: Some(ValueRef {
            hash: value_hash(v.as_bytes()),
            len: v.len() as u64,
        }),
        prev,
        deps,
        history: history_hash(history_of),
        beacon: None,
    };
    Update::new(Signed::sign(&secret(writer), body).expect("fits"))
}

#[test]
fn updates_cross_and_concurrent_writes_are_both_returned_until_one_supersedes_them() {
    let (mut a, mut b, mut s) = (node(2), node(3), node(0));
    put(&mut a, "shared/x", "from a");
    put(&mut b, "shared/x", "from b");
    exchange(&mut [&mut a, &mut b, &mut s]);
    for n in [&a, &b, &s] {
        assert_eq!(
            values(n, "shared/x"),
            vec!["2@1", "3@1"],
            "concurrent writes are both heads"
        );
        assert_eq!(n.log().len(), 2);
    }
    // A write after reading both supersedes both, everywhere it arrives.
    let merged = put(&mut a, "shared/x", "merged");
    assert_eq!(
        merged.body().deps.len(),
        1,
        "the delta names only what moved"
    );
    exchange(&mut [&mut a, &mut b, &mut s]);
    for n in [&a, &b, &s] {
        assert_eq!(values(n, "shared/x"), vec!["2@2"]);
    }
}

#[test]
fn an_update_waits_for_its_dependencies_and_is_accepted_when_they_arrive() {
    let (mut a, mut b) = (node(2), node(3));
    let first = put(&mut a, "c2/k", "1");
    let second = put(&mut a, "c2/k", "2");
    let mut received = b.log().frontier().flat();
    assert!(received.is_empty());
    let out = b.on_message(
        Writer(2),
        Message::push(vec![second.to_wire()], Vec::new()),
        NOW,
    );
    assert!(!b.log().holds(&second.id()), "never before its dependency");
    assert_eq!(b.log().pending(), 1);
    assert!(
        matches!(&out.sends[..], [(Writer(2), Message::Pull { want, .. })] if want == &vec![first.id()]),
        "it asks the sender for what it waits for by name"
    );
    b.on_message(
        Writer(2),
        Message::push(vec![first.to_wire()], Vec::new()),
        NOW,
    );
    assert!(b.log().holds(&second.id()));
    received = b.log().frontier().flat();
    assert_eq!(received, vec![(Writer(2), 2, second.id())]);
}

#[test]
fn forged_tampered_and_inconsistent_updates_are_refused() {
    let mut a = node(2);
    let good = put(&mut a, "c2/k", "1");
    let config = config();

    // Signed by someone else than the writer it claims.
    let mut stolen = forge(3, 1, "c2/k", None, Vec::new(), &[]).to_wire();
    stolen.writer = Writer(2);
    assert!(
        stolen.verify(&config).is_err(),
        "a fabrication fails its signature"
    );

    // A relay flips a byte of the signed body.
    let wire = good.to_wire();
    let mut bytes = wire.signed.bytes().to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let tampered = WireUpdate {
        writer: Writer(2),
        signed: bulwark_core::sign::Unverified::new(Bytes::from(bytes), *wire.signed.signature()),
    };
    assert!(tampered.verify(&config).is_err());

    // Validly signed, but the history hash does not match what its dependencies name.
    let mut b = node(3);
    assert_eq!(b.log_offer(good.clone()), Offer::Accepted);
    let dep = Dep {
        writer: Writer(2),
        clock: 1,
        id: good.id(),
    };
    let lying = forge(3, 2, "c3/k", None, vec![dep], &[]);
    assert_eq!(b.log_offer(lying), Offer::Refused(Refusal::History));

    // Its clock does not exceed a dependency's.
    let history = [(Writer(2), 1, good.id())];
    let stale = forge(3, 1, "c3/k", None, vec![dep], &history);
    assert!(matches!(
        b.log_offer(stale),
        Offer::Refused(Refusal::Clock { .. })
    ));

    // A dependency whose clock is not the named update's.
    let wrong = Dep { clock: 5, ..dep };
    let mismatched = forge(3, 9, "c3/k", None, vec![wrong], &history);
    assert_eq!(
        b.log_offer(mismatched),
        Offer::Refused(Refusal::DepMismatch(good.id()))
    );

    // The same update, well formed, is accepted.
    let honest = forge(3, 2, "c3/k", None, vec![dep], &history);
    assert_eq!(b.log_offer(honest), Offer::Accepted);
}

#[test]
fn a_clock_far_ahead_of_the_receivers_time_is_deferred_not_followed() {
    let mut b = node(3);
    let far = forge(
        2,
        NOW + CLOCK_AHEAD_MAX_MICROS + 1,
        "c2/k",
        None,
        Vec::new(),
        &[],
    );
    assert_eq!(b.log_offer(far.clone()), Offer::Deferred);
    assert_eq!(
        b.log().clock(),
        0,
        "the receiver's clock is not dragged forward"
    );
    b.on_tick(NOW + 2 * CLOCK_AHEAD_MAX_MICROS);
    assert!(b.log().holds(&far.id()), "accepted once its time has come");
}

#[test]
fn an_unauthorised_write_is_kept_and_passed_on_but_never_read() {
    let (mut a, mut b, mut s) = (node(2), node(3), node(0));
    put(&mut a, "c2/k", "a's own");
    exchange(&mut [&mut a, &mut b]);
    // b writes under a's prefix: valid signature, no right.
    let trespass = put(&mut b, "c2/k", "b's");
    exchange(&mut [&mut a, &mut b, &mut s]);
    for n in [&a, &b, &s] {
        assert!(
            n.log().holds(&trespass.id()),
            "propagated (others may depend on it)"
        );
        assert_eq!(values(n, "c2/k"), vec!["2@1"], "a no-op for reads");
    }
    // And a's next write, which depends on it, is accepted everywhere.
    let after = put(&mut a, "c2/k", "again");
    exchange(&mut [&mut a, &mut b, &mut s]);
    assert!(s.log().holds(&after.id()));
}

/// Client 4 forks: two updates after the same previous one, one to each of a and b, each of
/// which then writes on top of the branch it saw.
fn fork_setup() -> (Node, Node, Node, Node, Update, Update) {
    let (mut a, mut b, mut s0, mut s1) = (node(2), node(3), node(0), node(1));
    let mut m = node(4);
    let base = put(&mut m, "shared/f", "base");
    let base_history = [(Writer(4), base.body().clock, base.id())];
    let left = forge(4, 2, "shared/f", Some(base.id()), Vec::new(), &base_history);
    // One stamp, two updates: as a forking writer makes them.
    let right = forge_value(
        4,
        2,
        "shared/f",
        "other",
        Some(base.id()),
        Vec::new(),
        &base_history,
    );
    for (n, branch) in [(&mut a, &left), (&mut b, &right)] {
        for u in [&base, branch] {
            n.on_message(
                Writer(4),
                Message::push(
                    vec![u.to_wire()],
                    vec![Bytes::from("shared/f"), Bytes::from("other")],
                ),
                NOW,
            );
        }
        assert!(n.log().holds(&branch.id()));
    }
    put(&mut a, "c2/after", "on left");
    put(&mut b, "c3/after", "on right");
    // Each server first hears from one side only.
    exchange(&mut [&mut a, &mut s0]);
    exchange(&mut [&mut b, &mut s1]);
    (a, b, s0, s1, left, right)
}

#[test]
fn a_fork_is_joined_both_branches_reach_every_node_and_the_forker_is_proven() {
    let (mut a, mut b, mut s0, mut s1, left, right) = fork_setup();
    exchange(&mut [&mut s0, &mut s1]);
    exchange(&mut [&mut a, &mut s0]);
    exchange(&mut [&mut b, &mut s1]);
    let config = config();
    for n in [&a, &b, &s0, &s1] {
        assert!(n.log().holds(&left.id()) && n.log().holds(&right.id()));
        assert_eq!(
            n.log().len(),
            5,
            "{:?} holds every update of both branches",
            n.me()
        );
        assert_eq!(
            values(n, "shared/f"),
            vec!["4@2", "4@2"],
            "both branches are heads, as two virtual nodes' writes"
        );
        let proof = n.log().forks().get(&Writer(4)).expect("the fork is proven");
        assert!(
            proof.verify(&config),
            "anyone with the configuration can check it"
        );
        assert_eq!(n.log().forks().len(), 1, "no correct node is blamed");
        assert_eq!(
            n.log().frontier().forked().collect::<Vec<_>>(),
            vec![Writer(4)]
        );
    }
}

/// Bytes an update carries beyond its key and value, as it travels: what Depot §7 calls its
/// metadata (285 B in the paper's implementation).
fn metadata_bytes(update: &Update) -> usize {
    bulwark_core::wire::encode(&update.to_wire()).len() - update.body().key.as_bytes().len()
}

#[test]
fn an_update_carries_at_most_its_budget_of_metadata() {
    let mut a = node(2);
    let mut b = node(3);
    let first = put(&mut a, "shared/k", "v");
    // A writer's first update depends on nothing; a later one that saw another writer's update
    // names one dependency: the common case of a volume with one other active writer.
    let alone = put(&mut b, "shared/k", "v");
    exchange(&mut [&mut a, &mut b]);
    let after = put(&mut b, "shared/k", "w");
    assert_eq!(after.body().deps.len(), 1, "{:?}", after.body().deps);
    assert_eq!(first.body().deps.len(), 0);
    let (none, one) = (metadata_bytes(&alone), metadata_bytes(&after));
    println!("metadata: {none} B with no dependency, {one} B with one");
    // 64 signature, 32 each for the value's hash, the previous update, the history and each
    // dependency, and small integers; the volume's number is 8 bytes of hash.
    assert!(none <= 140, "{none} B");
    assert!(one <= 210, "{one} B");
}

#[test]
fn a_read_moves_past_a_member_that_withholds_or_answers_what_does_not_check() {
    let mut a = node(2);
    put(&mut a, "c2/k", "mine");
    // The reader holds every value of the key: only an answer may end the read, never silence.
    let ReadStart::Ask(first, _) = a.start_read(5, key("c2/k"), &[Writer(0), Writer(1)], NOW)
    else {
        panic!("asks a server");
    };
    assert_eq!(first, Writer(0));
    let out = a.read_timeout(5, NOW);
    assert!(
        out.reads.is_empty(),
        "one silent server does not end the read"
    );
    assert!(matches!(
        &out.sends[..],
        [(Writer(1), Message::Get { op: 5, .. })]
    ));
    // An answer carrying a value nobody wrote is no answer either: with nobody left to ask, the
    // read ends with what the reader holds.
    let lie = Message::Got {
        op: 5,
        values: vec![Bytes::from_static(b"a lie")],
        updates: Vec::new(),
        more: false,
        forks: Vec::new(),
    };
    let out = a.on_message(Writer(1), lie, NOW);
    assert_eq!(out.refused.len(), 1);
    let [(5, result)] = &out.reads[..] else {
        panic!("the read ends: {:?}", out.reads);
    };
    assert_eq!(result.versions.len(), 1);
}

#[test]
fn a_read_carries_the_proofs_of_forks_the_reader_does_not_hold() {
    let (mut a, _, mut s0, mut s1, _, _) = fork_setup();
    exchange(&mut [&mut s0, &mut s1]);
    assert!(s0.log().forks().contains_key(&Writer(4)));
    assert!(
        !a.log().forks().contains_key(&Writer(4)),
        "a saw one branch"
    );
    // A read on the fast path carries no updates, yet the proof comes with it.
    let ReadStart::Ask(to, get) = a.start_read(9, key("c2/after"), &[Writer(0)], NOW) else {
        panic!("asks a server");
    };
    let mut answers = s0.on_message(Writer(2), *get, NOW).sends;
    let (_, got) = answers.remove(0);
    assert!(
        matches!(&got, Message::Got { updates, forks, .. } if updates.is_empty() && forks.len() == 1)
    );
    a.on_message(to, got, NOW);
    assert!(
        a.log().forks().contains_key(&Writer(4)),
        "the reader holds the proof"
    );
}

#[test]
fn a_node_on_one_branch_gets_the_other_by_asking_for_the_peers_heads_by_name() {
    // The branches carry one stamp: by the clock rule of the plain exchange each server has
    // "seen" the other's branch, so without asking by hash it would never be sent.
    let (_a, _b, mut s0, mut s1, left, right) = fork_setup();
    assert!(s0.log().holds(&left.id()) && !s0.log().holds(&right.id()));
    let (mut broken0, mut broken1) = (
        Node::restore(config(), Writer(0), secret(0), &durable(&s0), NOW),
        Node::restore(config(), Writer(1), secret(1), &durable(&s1), NOW),
    );
    exchange(&mut [&mut s0, &mut s1]);
    assert!(s0.log().holds(&right.id()) && s1.log().holds(&left.id()));

    // The control: the same two servers, never asking by name, stay apart for ever.
    let never = super::log::Mutations {
        never_ask_by_name: true,
        ..Default::default()
    };
    broken0.mutate(never);
    broken1.mutate(never);
    exchange(&mut [&mut broken0, &mut broken1]);
    assert!(!broken0.log().holds(&right.id()) && !broken1.log().holds(&left.id()));
}

/// What a node would have on its disk: its updates in log order and its values.
fn durable(node: &Node) -> Vec<Change> {
    node.log()
        .in_order()
        .map(|u| Change::Update(u.to_wire(), None))
        .collect()
}

#[test]
fn a_fork_proof_convicts_only_two_updates_naming_one_previous() {
    let config = config();
    let mut m = node(4);
    let first = put(&mut m, "shared/f", "1");
    let second = put(&mut m, "shared/f", "2");
    assert!(
        ForkProof::of(&first, &second, &config).is_none(),
        "a chain is not a fork"
    );
    let twin = forge(4, 1, "c4/other", None, Vec::new(), &[]);
    let proof =
        ForkProof::of(&first, &twin, &config).expect("same previous (none), different updates");
    assert!(proof.verify(&config));
    // Pinning it on someone else fails.
    let framed = ForkProof {
        writer: Writer(2),
        ..proof
    };
    assert!(!framed.verify(&config));
}

#[test]
fn a_restarted_node_rebuilds_the_same_log_from_what_it_made_durable() {
    let (mut a, mut s) = (node(2), node(0));
    let mut disk: Vec<Change> = Vec::new();
    let (_, out) = a.write(key("c2/x"), Some(Bytes::from("v")), NOW);
    let put_id = a.log().frontier().heads(Writer(2))[0].1;
    assert!(out.changes.iter().any(|c| matches!(c, Change::Value(_))));
    let message = a.put_message(9, &put_id).expect("held");
    let out = s.on_message(Writer(2), message, NOW);
    disk.extend(out.changes);
    assert!(
        matches!(&out.sends[..], [(Writer(2), Message::PutAck { op: 9, id })] if *id == put_id),
        "the put is acknowledged, after its changes"
    );
    let restored = Node::restore(config(), Writer(0), secret(0), &disk, NOW);
    assert_eq!(restored.log().frontier(), s.log().frontier());
    assert_eq!(values(&restored, "c2/x"), vec!["2@1"]);
}

#[test]
fn a_read_takes_the_fast_path_when_current_and_the_slow_path_when_not() {
    let (mut a, mut b, mut s) = (node(2), node(3), node(0));
    let (update, _) = a.write(key("shared/r"), Some(Bytes::from("v1")), NOW);
    let put = a.put_message(1, &update.id()).expect("held");
    s.on_message(Writer(2), put, NOW);
    // b has never heard of it: the slow path brings the update and the value.
    let ReadStart::Ask(to, get) = b.start_read(5, key("shared/r"), &[Writer(0)], NOW) else {
        panic!("b must ask a server");
    };
    let reply = s.on_message(Writer(3), *get, NOW).sends.remove(0).1;
    let out = b.on_message(to, reply, NOW);
    let (_, result) = &out.reads[0];
    assert_eq!(result.versions.len(), 1);
    assert_eq!(result.versions[0].value.as_deref(), Some(&b"v1"[..]));
    assert_eq!(s.stats().slow_gets, 1);
    // Now current: the fast path, and a lying value is not accepted.
    let ReadStart::Ask(_, get) = b.start_read(6, key("shared/r"), &[Writer(0)], NOW) else {
        panic!("a read always asks a server");
    };
    let reply = s.on_message(Writer(3), *get, NOW).sends.remove(0).1;
    assert!(matches!(&reply, Message::Got { updates, .. } if updates.is_empty()));
    assert_eq!(s.stats().fast_gets, 1);
    let forged = Message::Got {
        op: 7,
        values: vec![Bytes::from("not v1")],
        updates: Vec::new(),
        more: false,
        forks: Vec::new(),
    };
    let ReadStart::Ask(..) = b.start_read(7, key("shared/r"), &[Writer(0), Writer(1)], NOW) else {
        panic!("asks");
    };
    let out = b.on_message(Writer(0), forged, NOW);
    assert!(
        out.reads.is_empty() || out.reads[0].1.versions[0].value.as_deref() == Some(&b"v1"[..])
    );
    assert_eq!(
        b.stats().values_refused,
        1,
        "a value no verified update names is refused"
    );
}

impl Node {
    /// Offers one update straight to the log, as if it arrived alone.
    fn log_offer(&mut self, update: Update) -> Offer {
        self.log_mut().offer(update, NOW)
    }
}

#[test]
fn a_reader_suspects_a_client_whose_beacons_stopped_and_a_beacon_proves_what_came_before() {
    let (mut a, mut b, mut s) = (node(2), node(3), node(0));
    let bound = config().staleness.bound_ms() * 1000;
    let later = NOW + bound + 1;
    // b has heard nothing from a (nor from client 4) for longer than the bound.
    let ReadStart::Ask(_, get) = b.start_read(1, key("shared/z"), &[Writer(0)], later) else {
        panic!("asks a server");
    };
    let reply = s.on_message(Writer(3), *get, later).sends.remove(0).1;
    let out = b.on_message(Writer(0), reply, later);
    assert_eq!(out.reads[0].1.suspects, vec![Writer(2), Writer(4)]);

    // a writes, then beacons; the beacon carries the write with it.
    let write = put(&mut a, "shared/z", "fresh");
    a.beacon(later);
    exchange(&mut [&mut a, &mut s]);
    exchange(&mut [&mut s, &mut b]);
    assert_eq!(b.log().beacon(Writer(2)), Some(later / 1000));
    assert!(
        b.log().holds(&write.id()),
        "whoever holds the beacon holds what came before it"
    );
    assert_eq!(b.log().suspects(later / 1000), vec![Writer(4)]);

    // A beacon time on another key, or on someone else's beacon, is refused or never read.
    let config = config();
    let mut wrong = forge(3, 1, "shared/z", None, Vec::new(), &[])
        .body()
        .clone();
    wrong.beacon = Some(1);
    let signed = Update::new(Signed::sign(&secret(3), wrong).expect("fits"));
    assert!(signed.to_wire().verify(&config).is_err());
    assert!(!config.may_write(Writer(3), &super::update::beacon_key(Writer(2))));
}

/// T20's pitfall: a beacon on an update whose past is not held yet vouches for nothing. The
/// reader keeps suspecting its writer until the writes before the beacon arrive; the mutation
/// that takes the time at once stops suspecting a writer whose writes it lacks.
#[test]
fn a_beacon_whose_past_is_missing_gives_no_staleness_bound() {
    let bound = config().staleness.bound_ms() * 1000;
    let later = NOW + bound + 1;
    for (mutations, trusted) in [
        (super::log::Mutations::default(), false),
        (
            super::log::Mutations {
                beacon_before_accept: true,
                ..super::log::Mutations::default()
            },
            true,
        ),
    ] {
        let (mut a, mut b) = (node(2), node(3));
        b.mutate(mutations);
        let write = put(&mut a, "shared/z", "fresh");
        let (beacon, _) = a.beacon(later);
        // The beacon alone, as a withholding peer would pass it on.
        assert!(matches!(
            b.log_mut().offer(beacon, later),
            Offer::Missing(_)
        ));
        assert!(!b.log().holds(&write.id()));
        assert_eq!(b.log().beacon(Writer(2)).is_some(), trusted);
        assert_eq!(
            b.log().suspects(later / 1000).contains(&Writer(2)),
            !trusted,
            "a writer whose writes the reader lacks stays suspected"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A volume on a node: its configuration's number, its records, and the hosted replica.

mod served {
    use super::super::records::{self, Recorder};
    use super::super::served::{GOSSIP_EVERY_MS, PeerMessage, Peers, Reply, Request, Served};
    use super::super::update::BadConfig;
    use super::*;
    use crate::machine::{Access, Replica};
    use bulwark_core::{ClientId, NodeId, Slot, Time};

    const ACCESS: Access = Access {
        write: true,
        read: true,
    };

    /// The test volume with its number made from the rest, as creation makes it.
    fn numbered() -> Arc<VolumeConfig> {
        let config = config();
        Arc::new(VolumeConfig::new(
            "test",
            config.members.clone(),
            config.staleness,
        ))
    }

    /// Servers 0 and 1 on nodes 10 and 11; clients 2-4 as client ids 0-2.
    fn peers() -> Peers {
        Peers {
            nodes: [(Writer(0), NodeId(10)), (Writer(1), NodeId(11))].into(),
            clients: (2..5).map(|i| (ClientId(i - 2), Writer(i))).collect(),
        }
    }

    fn server(config: &Arc<VolumeConfig>) -> Served {
        Served::new(
            Node::new(config.clone(), Writer(0), secret(0)),
            peers(),
            NOW / 1000,
        )
    }

    #[test]
    fn a_configuration_s_number_is_the_hash_of_the_rest_and_bounds_are_checked() {
        let config = numbered();
        assert_eq!(config.check(), Ok(()));
        let mut renumbered = (*config).clone();
        renumbered.volume = VolumeId(config.volume.0 ^ 1);
        assert_eq!(renumbered.check(), Err(BadConfig::Number));
        let mut twice = (*config).clone();
        twice.members.push(twice.members[2].clone());
        let twice = VolumeConfig::new("test", twice.members, twice.staleness);
        assert_eq!(twice.check(), Err(BadConfig::DuplicateKey));
        let clients_only: Vec<Member> = config.members[2..].to_vec();
        let clients_only = VolumeConfig::new("test", clients_only, config.staleness);
        assert_eq!(clients_only.check(), Err(BadConfig::Members));
        // Same members, another name: another volume, whose keys never mix with these.
        let renamed = VolumeConfig::new("other", config.members.clone(), config.staleness);
        assert_eq!(renamed.check(), Ok(()));
        assert_ne!(renamed.volume, config.volume);
        let mut relabelled = (*config).clone();
        relabelled.label = "other".into();
        assert_eq!(relabelled.check(), Err(BadConfig::Number));
        let long = VolumeConfig::new(&"x".repeat(64), config.members.clone(), config.staleness);
        assert_eq!(long.check(), Err(BadConfig::Label));
        let mut hasty = config.staleness;
        hasty.announce_ms = 10;
        assert_eq!(
            VolumeConfig::new("test", config.members.clone(), hasty).check(),
            Err(BadConfig::Staleness)
        );
    }

    #[test]
    fn records_restore_the_node_they_came_from_and_damage_is_named() {
        let config = numbered();
        let mut writer = Node::new(config.clone(), Writer(2), secret(2));
        let mut recorder = Recorder::default();
        let mut tables: std::collections::BTreeMap<&str, Vec<(Vec<u8>, Bytes)>> =
            Default::default();
        for i in 0..5 {
            let (_, out) =
                writer.write(key(&format!("c2/{i}")), Some(Bytes::from(vec![i; 9])), NOW);
            for record in out.changes.iter().flat_map(|c| recorder.record(c)) {
                let table = tables.entry(record.table).or_default();
                table.retain(|(key, _)| *key != record.key);
                if let Some(value) = record.value {
                    table.push((record.key, value));
                }
            }
        }
        let load = |table| tables.get(table).cloned().unwrap_or_default();
        let all = records::Tables::load(|table| Ok::<_, ()>(load(table))).expect("in memory");
        assert_eq!(all.accepted.len(), 5, "acceptance times are kept");
        let (changes, _) = records::restore(all.clone()).expect("restore");
        let restored = Node::restore(config.clone(), Writer(2), secret(2), &changes, NOW);
        assert_eq!(restored.log().len(), 5);
        assert_eq!(restored.log().frontier(), writer.log().frontier());
        assert_eq!(restored.values_held(), 5);
        let mut values = all.values.clone();
        values[0].1 = Bytes::from_static(b"another value");
        let damaged = records::restore(records::Tables {
            values,
            ..all.clone()
        });
        assert!(damaged.is_err(), "a value under another hash is damage");
        let mut updates = all.updates.clone();
        updates[0].0 = vec![1, 2, 3];
        let damaged = records::restore(records::Tables {
            updates,
            ..records::Tables::default()
        });
        assert!(damaged.unwrap_err().contains("acceptance number"));
        let damaged = records::restore(records::Tables {
            discarded: vec![(vec![1], Bytes::new())],
            ..records::Tables::default()
        });
        assert!(damaged.unwrap_err().contains("32 bytes"));
        // A discard deletes the value's record and keeps the hash.
        let hash = super::super::update::value_hash(&[0; 9]);
        let records = recorder.record(&Change::Discard(hash));
        assert_eq!(
            records
                .iter()
                .map(|r| (r.table, r.value.is_some()))
                .collect::<Vec<_>>(),
            vec![(records::DISCARDED, true), (records::VALUES, false)]
        );
        let records = recorder.record(&Change::Value(Bytes::from(vec![0; 9])));
        assert_eq!(
            records
                .iter()
                .map(|r| (r.table, r.value.is_some()))
                .collect::<Vec<_>>(),
            vec![(records::VALUES, true), (records::DISCARDED, false)],
            "storing a value again undoes its discard"
        );
    }

    #[test]
    fn a_server_answers_members_only_and_acknowledges_a_put_in_its_reply() {
        let config = numbered();
        let mut served = server(&config);
        let mut client = Node::new(config.clone(), Writer(2), secret(2));
        let (update, _) = client.write(key("c2/a"), Some(Bytes::from_static(b"v")), NOW);
        let put = client.put_message(9, &update.id()).expect("a put");
        let exchange = |message: Message| Request::Exchange {
            volume: config.volume,
            message,
        };
        // Not a member of the volume: refused, and nothing changes.
        let output = served.on_request(Time(0), ClientId(7), ACCESS, exchange(put.clone()), &());
        assert!(matches!(output.reply, Some(Reply::Refused { .. })));
        assert!(output.changes.is_empty());
        // Another volume: refused.
        let other = Request::Exchange {
            volume: VolumeId(config.volume.0 ^ 1),
            message: put.clone(),
        };
        let output = served.on_request(Time(0), ClientId(0), ACCESS, other, &());
        assert!(matches!(output.reply, Some(Reply::Refused { .. })));
        // The member: the update is a change to make durable, and the ack is in the reply the
        // driver sends only after it.
        let output = served.on_request(Time(0), ClientId(0), ACCESS, exchange(put), &());
        assert!(!output.changes.is_empty());
        let Some(Reply::Exchange { messages, .. }) = output.reply else {
            panic!("no exchange reply");
        };
        assert!(
            messages
                .iter()
                .any(|m| matches!(m, Message::PutAck { op: 9, id } if *id == update.id())),
            "{messages:?}"
        );
        // Opening the same volume again is answered as opened; another configuration is not.
        let open = Request::Open {
            config: (*config).clone(),
        };
        let output = served.on_request(Time(0), ClientId(0), ACCESS, open, &());
        assert!(matches!(output.reply, Some(Reply::Opened { .. })));
        let mut other = (*config).clone();
        other.staleness.announce_ms += 1;
        let other = VolumeConfig::new("test", other.members, other.staleness);
        let output = served.on_request(
            Time(0),
            ClientId(0),
            ACCESS,
            Request::Open { config: other },
            &(),
        );
        assert!(matches!(output.reply, Some(Reply::Refused { .. })));
    }

    #[test]
    fn a_member_proven_to_fork_is_evicted_neither_answered_nor_gossiped_with() {
        let config = numbered();
        let mut served = server(&config);
        // Server 1 (node 11) signs two first updates: a fork, proven to server 0.
        let forker = |value: &str| {
            let mut branch = Node::new(config.clone(), Writer(1), secret(1));
            let (update, _) = branch.write(key("c2/x"), Some(Bytes::from(value.to_string())), NOW);
            update
        };
        let (left, right) = (forker("left"), forker("right"));
        let push = PeerMessage {
            volume: config.volume,
            message: Message::push(vec![left.to_wire(), right.to_wire()], Vec::new()),
        };
        served.on_message(Time(1), Slot(11), push, &());
        assert!(served.node().log().forks().contains_key(&Writer(1)));
        let pull = Node::new(config.clone(), Writer(1), secret(1)).pull(Writer(0));
        let message = PeerMessage {
            volume: config.volume,
            message: pull,
        };
        let refused = served.on_message(Time(2), Slot(11), message, &());
        assert!(refused.refused.is_some_and(|why| why.contains("evicted")));
        assert!(refused.sends.is_empty());
        for at in 0..4 {
            let gossip = served.on_tick(Time(at * GOSSIP_EVERY_MS));
            assert!(gossip.sends.is_empty(), "the only other server is evicted");
        }
    }

    #[test]
    fn servers_gossip_with_the_other_servers_in_turn_and_hear_only_from_them() {
        let config = numbered();
        let mut served = server(&config);
        let first = served.on_tick(Time(0));
        assert_eq!(first.sends.len(), 1);
        assert_eq!(
            first.sends[0].0,
            Slot(11),
            "the other server, by its node id"
        );
        assert!(matches!(first.sends[0].1.message, Message::Pull { .. }));
        assert!(served.on_tick(Time(GOSSIP_EVERY_MS - 1)).sends.is_empty());
        assert_eq!(served.on_tick(Time(GOSSIP_EVERY_MS)).sends.len(), 1);
        // A node that serves no part of the volume is not heard.
        let mut other = Node::new(config.clone(), Writer(1), secret(1));
        let pull = other.pull(Writer(0));
        let message = PeerMessage {
            volume: config.volume,
            message: pull,
        };
        let refused = served.on_message(Time(1), Slot(12), message.clone(), &());
        assert!(refused.refused.is_some());
        assert!(refused.sends.is_empty());
        // What a peer server passes on that does not check is refused and said, for the
        // driver to count against that peer.
        let mut client = Node::new(config.clone(), Writer(2), secret(2));
        let (update, _) = client.write(key("c2/x"), None, NOW);
        let mut wire = update.to_wire();
        wire.writer = Writer(3);
        let forged = PeerMessage {
            volume: config.volume,
            message: Message::push(vec![wire], Vec::new()),
        };
        let refused = served.on_message(Time(1), Slot(11), forged, &());
        assert!(refused.refused.is_some(), "a forged update is refused");
        assert!(refused.changes.is_empty());
        // The other server is, and its pull is answered to its node.
        let answered = served.on_message(Time(1), Slot(11), message, &());
        assert!(answered.refused.is_none());
        assert_eq!(answered.sends.len(), 1);
        assert_eq!(answered.sends[0].0, Slot(11));
        assert!(matches!(answered.sends[0].1.message, Message::Push { .. }));
    }
}

/// A ladder in seconds: every version alive in the last 10 s, one turn to propose for ever.
fn short_ladder() -> super::discard::Ladder {
    super::discard::Ladder {
        keep_all_micros: 10_000_000,
        rungs: Vec::new(),
        turn_micros: u64::MAX,
    }
}

fn discard_node(i: u32) -> Node {
    let mut n = node(i);
    n.set_ladder(short_ladder());
    n
}

fn value_of(update: &Update) -> bulwark_core::Digest {
    update.body().value.expect("a value").hash
}

#[test]
fn a_discard_takes_every_clients_consent_and_drops_only_values_no_kept_version_names() {
    use super::discard::Discard;
    let (mut s0, mut s1) = (discard_node(0), discard_node(1));
    let (mut c2, mut c3, mut c4) = (discard_node(2), discard_node(3), discard_node(4));
    let old = c2.write(key("c2/a"), Some(Bytes::from("old")), NOW).0;
    let new = c2.write(key("c2/a"), Some(Bytes::from("new")), NOW + 1).0;
    // Equal bytes, one value: superseded under one key, current under the other.
    let shared_old = c2.write(key("c2/x"), Some(Bytes::from("same")), NOW + 2).0;
    c2.write(key("c2/x"), Some(Bytes::from("x2")), NOW + 3);
    c2.write(key("c2/y"), Some(Bytes::from("same")), NOW + 4);
    exchange(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4]);
    // Lives bounded from outside: begun by the writer's last beacon before it (none here: 0),
    // ended when this node accepted the first update covering it.
    assert_eq!(c2.log().life(&old.id()), Some((0, Some(NOW + 1))));
    assert_eq!(c3.log().life(&old.id()), Some((0, Some(NOW))));
    assert_eq!(c2.log().life(&new.id()).map(|(_, end)| end), Some(None));

    // Within the ladder's day (here 10 s), nothing is proposed.
    assert_eq!(c2.discard_due(NOW + 1_000_000), None);
    let later = NOW + 60_000_000;
    let proposal = c2
        .discard_due(later)
        .expect("the proposer lists what its ladder lets go");
    let Discard::Propose { ids, .. } = proposal.clone() else {
        panic!("a proposal: {proposal:?}");
    };
    // Not the version whose bytes the current c2/y shares: its value could not go.
    assert_eq!(ids, vec![old.id()]);
    assert_eq!(
        c3.discard_due(later),
        None,
        "only the proposer proposes in its turn"
    );
    let proposed = c2.write_discard(&proposal, later).0;
    exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    assert!(c2.discard_due(later).is_none(), "one proposal per turn");

    let consent = c3.discard_due(later).expect("a correct client consents");
    assert_eq!(consent, Discard::Consent(proposed.id()));
    c3.write_discard(&consent, later);
    exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    // Two of three clients: nothing goes.
    assert!(s0.has_value(&value_of(&old)) && s1.has_value(&value_of(&old)));
    assert_eq!(s0.discarded(), 0);

    let consent = c4.discard_due(later).expect("the last client consents too");
    c4.write_discard(&consent, later);
    let changes = exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    for server in [&s0, &s1] {
        assert!(
            !server.has_value(&value_of(&old)),
            "unanimous: the old value goes"
        );
        assert!(
            server.has_value(&value_of(&new)),
            "the current version stays"
        );
        assert!(
            server.has_value(&value_of(&shared_old)),
            "a value a kept version names stays"
        );
        assert_eq!(server.discarded(), 1);
    }
    assert!(
        !c2.has_value(&value_of(&old)),
        "the writer drops its copy too"
    );
    // A proposal listing the version whose bytes a current version shares, agreed by all: the
    // value stays, since c2/y still names it.
    let shared = c3
        .write_discard(
            &Discard::Propose {
                turn: 0,
                ids: vec![shared_old.id()],
            },
            later,
        )
        .0;
    exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    for client in [&mut c2, &mut c4] {
        assert_eq!(
            client.discard_due(later),
            Some(Discard::Consent(shared.id()))
        );
        client.write_discard(&Discard::Consent(shared.id()), later);
    }
    exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    for server in [&s0, &s1] {
        assert!(server.has_value(&value_of(&shared_old)));
        assert_eq!(server.discarded(), 1);
    }
    assert_eq!(values(&s0, "c2/a").len(), 1);
    assert!(
        changes[&Writer(0)]
            .iter()
            .any(|c| matches!(c, Change::Discard(h) if *h == value_of(&old)))
    );
    // A peer that still had the value cannot give it back, and nobody asks for it again.
    let restored = {
        let mut disk = durable(&s0);
        disk.push(Change::Value(Bytes::from("old")));
        disk.extend(
            changes[&Writer(0)]
                .iter()
                .filter(|c| matches!(c, Change::Discard(_)))
                .cloned(),
        );
        Node::restore(config(), Writer(0), secret(0), &disk, later)
    };
    assert!(!restored.has_value(&value_of(&old)));
    let Message::Pull { want_values, .. } = s0.pull(Writer(1)) else {
        panic!("a pull");
    };
    assert!(!want_values.contains(&value_of(&old)));
}

/// §8.2 T16: a faulty client refuses to consent, or proposes a premature discard; nothing is
/// discarded either way, and the correct clients never consent to the premature one.
#[test]
fn a_faulty_client_can_delay_a_discard_but_never_hasten_one() {
    use super::discard::{Discard, Withheld};
    let (mut s0, mut s1) = (discard_node(0), discard_node(1));
    let (mut c2, mut c3, mut c4) = (discard_node(2), discard_node(3), discard_node(4));
    let old = c2.write(key("c2/a"), Some(Bytes::from("old")), NOW).0;
    let current = c2.write(key("c2/a"), Some(Bytes::from("new")), NOW + 1).0;
    let recent = c3.write(key("c3/r"), Some(Bytes::from("r1")), NOW).0;
    exchange(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4]);
    let later = NOW + 60_000_000;
    c3.write(key("c3/r"), Some(Bytes::from("r2")), later - 5_000_000);
    exchange_at(
        &mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4],
        later - 5_000_000,
    );

    // Premature: the current version, and one superseded 5 s ago, inside the ladder's 10 s.
    let mut premature = vec![old.id(), current.id(), recent.id()];
    premature.sort();
    for listed in [vec![current.id()], vec![recent.id()], premature] {
        assert!(
            c2.log()
                .check_discard(&listed, &short_ladder(), later)
                .is_err()
        );
        let proposal = c4
            .write_discard(
                &Discard::Propose {
                    turn: 0,
                    ids: listed,
                },
                later,
            )
            .0;
        exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
        for correct in [&c2, &c3] {
            assert_ne!(
                correct.discard_due(later),
                Some(Discard::Consent(proposal.id())),
                "a correct client never consents to a premature discard"
            );
        }
    }
    assert_eq!(
        c2.log()
            .check_discard(&[current.id()], &short_ladder(), later),
        Err(Withheld::Kept(current.id()))
    );
    for n in [&s0, &s1, &c2] {
        assert!(n.has_value(&value_of(&current)) && n.has_value(&value_of(&recent)));
        assert_eq!(n.discarded(), 0);
    }

    // A valid proposal that the faulty client never consents to: nothing goes.
    let proposal = c2.discard_due(later).expect("the proposer's turn");
    assert_eq!(
        proposal,
        Discard::Propose {
            turn: 0,
            ids: vec![old.id()]
        }
    );
    c2.write_discard(&proposal, later);
    exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    let consent = c3.discard_due(later).expect("the correct client consents");
    c3.write_discard(&consent, later);
    exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
    for n in [&s0, &s1, &c2] {
        assert!(n.has_value(&value_of(&old)), "one refusal keeps it");
        assert_eq!(n.discarded(), 0);
        // What an administrator is shown: the valid proposal waits for the refuser alone.
        let pending = n.discard_pending();
        let valid = pending
            .iter()
            .find(|p| p.proposer == Writer(2))
            .expect("the valid proposal is pending");
        assert_eq!((valid.versions, &valid.missing[..]), (1, &[Writer(4)][..]));
    }
    // A consent forged under the faulty client's name does not verify (Depot's signatures), and
    // one to its discard key by another client is no consent: it is not that client's to write.
    let forged = forge(3, later, "\0depot/discard/4", None, Vec::new(), &[]);
    assert!(!config().may_write(Writer(3), &forged.body().key));
}

/// A proposer's newer proposal replaces its older ones only while they wait: one every client
/// agreed to stays applied, on the node that applied it and after that node restarts (which
/// decodes both proposals at once), so nobody asks again for a value every correct node dropped.
#[test]
fn a_newer_proposal_never_takes_back_an_applied_one_even_across_a_restart() {
    use super::discard::Discard;
    let (mut s0, mut s1) = (discard_node(0), discard_node(1));
    let (mut c2, mut c3, mut c4) = (discard_node(2), discard_node(3), discard_node(4));
    let old = c2.write(key("c2/a"), Some(Bytes::from("old")), NOW).0;
    c2.write(key("c2/a"), Some(Bytes::from("new")), NOW + 1);
    let b1 = c3.write(key("c3/b"), Some(Bytes::from("b1")), NOW).0;
    c3.write(key("c3/b"), Some(Bytes::from("b2")), NOW + 1);
    let mut disk = exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], NOW)
        .remove(&Writer(0))
        .unwrap_or_default();
    let later = NOW + 60_000_000;
    let first = Discard::Propose {
        turn: 0,
        ids: vec![old.id()],
    };
    let first = c2.write_discard(&first, later).0;
    for client in [&mut c3, &mut c4] {
        client.write_discard(&Discard::Consent(first.id()), later);
    }
    let round = |nodes: &mut [&mut Node], disk: &mut Vec<Change>| {
        disk.extend(
            exchange_at(nodes, later)
                .remove(&Writer(0))
                .unwrap_or_default(),
        );
    };
    round(
        &mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4],
        &mut disk,
    );
    assert!(s0.is_discarded(&value_of(&old)) && !s0.has_value(&value_of(&old)));
    // The proposer's next turn: a proposal nobody agreed to yet.
    let second = Discard::Propose {
        turn: 1,
        ids: vec![b1.id()],
    };
    let second = c2.write_discard(&second, later).0;
    round(
        &mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4],
        &mut disk,
    );
    for node in [
        &mut s0,
        &mut Node::restore(config(), Writer(0), secret(0), &disk, later),
    ] {
        assert!(node.is_discarded(&value_of(&old)), "still discarded");
        assert!(!node.has_value(&value_of(&old)));
        assert!(node.has_value(&value_of(&b1)), "the second waits");
        assert_eq!(node.discarded(), 1);
        let pending: Vec<UpdateId> = node.discard_pending().iter().map(|p| p.proposal).collect();
        assert_eq!(pending, vec![second.id()]);
        let Message::Pull { want_values, .. } = node.pull(Writer(1)) else {
            panic!("a pull");
        };
        assert!(
            !want_values.contains(&value_of(&old)),
            "nobody is asked for a value every correct node dropped"
        );
    }
}

#[test]
fn bytes_written_again_after_their_discard_are_kept_and_served() {
    let (mut s0, mut s1) = (discard_node(0), discard_node(1));
    let (mut c2, mut c3, mut c4) = (discard_node(2), discard_node(3), discard_node(4));
    let old = c2.write(key("c2/a"), Some(Bytes::from("on")), NOW).0;
    c2.write(key("c2/a"), Some(Bytes::from("off")), NOW + 1);
    exchange(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4]);
    let later = NOW + 60_000_000;
    let mut disk0: Vec<Change> = Vec::new();
    for _ in 0..3 {
        for client in [&mut c2, &mut c3, &mut c4] {
            if let Some(discard) = client.discard_due(later) {
                client.write_discard(&discard, later);
            }
        }
        let changes = exchange_at(&mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4], later);
        disk0.extend(changes.get(&Writer(0)).cloned().unwrap_or_default());
    }
    assert!(!s0.has_value(&value_of(&old)) && !c2.has_value(&value_of(&old)));
    // The same bytes again, now the current version: kept by its writer, fetched by servers.
    let again = c2.write(key("c2/a"), Some(Bytes::from("on")), later + 1).0;
    assert!(
        c2.has_value(&value_of(&again)),
        "the writer keeps its own write's value"
    );
    // A put brings the bytes with their update: the server keeps them at once.
    let put = c2.put_message(7, &again.id()).expect("a put");
    let out = s0.on_message(Writer(2), put, later + 1);
    disk0.extend(
        out.changes
            .into_iter()
            .filter(|c| !matches!(c, Change::Update(..))),
    );
    assert!(s0.has_value(&value_of(&again)), "taken with the put");
    let changes = exchange_at(
        &mut [&mut s0, &mut s1, &mut c2, &mut c3, &mut c4],
        later + 1,
    );
    disk0.extend(changes.get(&Writer(0)).cloned().unwrap_or_default());
    for server in [&s0, &s1] {
        assert!(
            server.has_value(&value_of(&again)),
            "servers serve it again"
        );
    }
    assert_eq!(values(&s0, "c2/a").len(), 1);
    // A restart keeps it: storing the value again undoes the record of its discard.
    let mut disk = durable(&s0);
    disk.extend(
        disk0
            .into_iter()
            .filter(|c| !matches!(c, Change::Update(..))),
    );
    let restored = Node::restore(config(), Writer(0), secret(0), &disk, later + 2);
    assert!(restored.has_value(&value_of(&again)));
}

#[test]
fn a_proposer_proposes_once_a_turn_and_a_restart_never_shortens_a_life() {
    use super::discard::{DAY_MICROS, Discard, Ladder};
    // The paper's ladder, with turns of a day: c2's turn is every third day.
    let day0 = 3_000 * DAY_MICROS;
    let hour = 3_600_000_000;
    let mut c2 = node(2);
    c2.beacon(day0);
    let first = c2.write(key("c2/a"), Some(Bytes::from("1")), day0 + 1).0;
    let later = day0 + 2 * DAY_MICROS + hour;
    c2.beacon(later);
    c2.write(key("c2/a"), Some(Bytes::from("2")), later + 1);
    let quiet = c2.write(key("c2/q"), Some(Bytes::from("q1")), later + 2).0;
    c2.write(key("c2/q"), Some(Bytes::from("q2")), later + 3);
    // "1" was alive over three midnights, so it is on the daily rung for a week; "q1" over none.
    let now = day0 + 6 * DAY_MICROS;
    assert!(Ladder::paper().proposer(&config(), now) == Some(Writer(2)));
    let Some(Discard::Propose { ids, turn }) = c2.discard_due(now) else {
        panic!("c2's turn");
    };
    assert_eq!(ids, vec![quiet.id()]);
    c2.write_discard(&Discard::Propose { turn, ids }, now);
    assert_eq!(
        c2.discard_due(now + 60_000_000),
        None,
        "one proposal a turn"
    );
    // Restarted a day later, it accepts its log again: lives are no shorter for it.
    let restored = Node::restore(
        config(),
        Writer(2),
        secret(2),
        &durable(&c2),
        now + DAY_MICROS,
    );
    let (born, ended) = restored.log().life(&first.id()).expect("a version");
    assert!(born <= day0 && ended.is_some_and(|end| end >= day0 + 2 * DAY_MICROS));
    assert!(
        restored
            .log()
            .discardable(&Ladder::paper(), now + 3 * DAY_MICROS, usize::MAX)
            .iter()
            .all(|id| *id != first.id()),
        "a version on the daily rung stays"
    );
    // With the acceptance times it recorded, a restart changes no life at all: a client that
    // restarts (as the command line does on every run) still proposes and consents.
    let mut disk: Vec<Change> = Vec::new();
    let mut c2 = node(2);
    disk.extend(c2.beacon(day0).1.changes);
    disk.extend(
        c2.write(key("c2/a"), Some(Bytes::from("1")), day0 + 1)
            .1
            .changes,
    );
    disk.extend(c2.beacon(later).1.changes);
    disk.extend(
        c2.write(key("c2/a"), Some(Bytes::from("2")), later + 1)
            .1
            .changes,
    );
    disk.extend(
        c2.write(key("c2/q"), Some(Bytes::from("q1")), later + 2)
            .1
            .changes,
    );
    disk.extend(
        c2.write(key("c2/q"), Some(Bytes::from("q2")), later + 3)
            .1
            .changes,
    );
    let restored = Node::restore(config(), Writer(2), secret(2), &disk, now);
    for id in [first.id(), quiet.id()] {
        assert_eq!(restored.log().life(&id), c2.log().life(&id));
    }
    assert!(matches!(
        restored.discard_due(now),
        Some(Discard::Propose { ids, .. }) if ids == vec![quiet.id()]
    ));
}

/// §8.2 T18: a faulty peer pulls again and again, asking for the whole log's ancestry by name
/// (a fork search that never ends) with a frontier of thousands of invented heads and
/// thousands of invented values, and puts an update with more dependencies than any honest one
/// names. Every answer stays within the push bounds, nothing it sends is stored or changes what
/// the node holds, the oversized update is refused and counted, and a correct client still gets
/// the whole log in a few exchanges afterwards.
#[test]
fn a_peer_that_asks_again_and_again_gets_bounded_answers_and_changes_nothing() {
    use super::node::{
        PUSH_FORKS_MAX, PUSH_UPDATE_BYTES_MAX, PUSH_UPDATES_MAX, PUSH_VALUE_BYTES_MAX,
    };
    use super::update::DEPS_MAX;
    use bulwark_core::Digest;
    let mut s0 = node(0);
    let mut c2 = node(2);
    for i in 0..700 {
        put(&mut c2, &format!("c2/k{}", i % 50), &format!("v{i}"));
    }
    exchange(&mut [&mut s0, &mut c2]);
    let held = s0.log().len();
    assert!(held >= 700, "the server holds the writer's log");

    let ids: Vec<UpdateId> = s0.log().in_order().map(|u| u.id()).collect();
    let invented = |i: u32| Digest::of("invented", &i.to_le_bytes());
    let frontier: Vec<(Writer, u64, UpdateId)> = (0..5_000u32)
        .map(|i| {
            (
                Writer(5 + i),
                u64::MAX - u64::from(i),
                UpdateId(invented(i)),
            )
        })
        .collect();
    for round in 0..100u32 {
        let want: Vec<UpdateId> = ids
            .iter()
            .rev()
            .copied()
            .chain((0..3_000).map(|i| UpdateId(invented(round * 3_000 + i))))
            .collect();
        let pull = Message::Pull {
            frontier: frontier.clone(),
            want,
            want_values: (0..5_000).map(invented).collect(),
            values: true,
        };
        let out = s0.on_message(Writer(4), pull, NOW);
        assert!(out.changes.is_empty(), "a pull changes nothing stored");
        let [
            (
                to,
                Message::Push {
                    updates,
                    values,
                    forks,
                    ..
                },
            ),
        ] = &out.sends[..]
        else {
            panic!("one push answers one pull: {:?}", out.sends.len());
        };
        assert_eq!(*to, Writer(4));
        let update_bytes: usize = updates.iter().map(|u| u.signed.bytes().len()).sum();
        let value_bytes: usize = values.iter().map(Bytes::len).sum();
        assert!(updates.len() <= PUSH_UPDATES_MAX && update_bytes <= PUSH_UPDATE_BYTES_MAX);
        assert!(value_bytes <= PUSH_VALUE_BYTES_MAX && forks.len() <= PUSH_FORKS_MAX);
    }
    assert_eq!((s0.log().len(), s0.log().pending()), (held, 0));

    // A vector of more dependencies than DEPS_MAX: refused, counted, not stored.
    let deps: Vec<Dep> = (0..=DEPS_MAX as u32)
        .map(|i| Dep {
            writer: Writer(2),
            clock: u64::from(i),
            id: UpdateId(invented(i)),
        })
        .collect();
    let huge = forge(4, NOW, "c4/huge", None, deps, &[]);
    let before = s0.stats();
    let out = s0.on_message(
        Writer(4),
        Message::Put {
            op: 1,
            update: huge.to_wire(),
            value: Some(Bytes::from("c4/huge")),
        },
        NOW,
    );
    let after = s0.stats();
    assert!(
        after.refused + after.puts_refused > before.refused + before.puts_refused,
        "the oversized update is refused and counted"
    );
    assert!(out.changes.is_empty() && !s0.log().holds(&huge.id()));

    // A correct client is served as before: the whole log, in a bounded exchange.
    let mut c3 = node(3);
    exchange(&mut [&mut s0, &mut c3]);
    assert_eq!(c3.log().len(), held);
}

/// A driver's store for [`Node::on_message_with`]: every value its node made a change of.
#[derive(Default)]
struct ValueStore(std::collections::BTreeMap<bulwark_core::Digest, Bytes>);

impl super::hoard::Values for ValueStore {
    fn value(&self, hash: &bulwark_core::Digest) -> Option<Bytes> {
        self.0.get(hash).cloned()
    }
}

impl ValueStore {
    fn record(&mut self, out: &super::node::Output) {
        for change in &out.changes {
            match change {
                Change::Value(value) => {
                    self.0.insert(value_hash(value), value.clone());
                }
                Change::Discard(hash) => {
                    self.0.remove(hash);
                }
                _ => {}
            }
        }
    }
}

/// A server that keeps the bytes of few values in memory holds and serves every value from its
/// store: to a server's pull, to a read, after a restart that reads only hashes and lengths; a
/// value the store damaged is not served and is counted.
#[test]
fn a_server_that_keeps_few_values_in_memory_serves_every_value_from_its_store() {
    const BOUND: u64 = 64;
    let (mut s0, mut c2) = (node(0), node(2));
    s0.bound_resident_values(BOUND);
    let mut store = ValueStore::default();
    let mut written = Vec::new();
    for i in 0..20u64 {
        let value = Bytes::from(format!("value number {i} of twenty"));
        let (update, _) = c2.write(key(&format!("c2/k{i}")), Some(value.clone()), NOW + i);
        let put = c2.put_message(i, &update.id()).expect("held");
        let out = s0.on_message_with(Writer(2), put, NOW, &store);
        store.record(&out);
        assert!(matches!(
            out.sends[..],
            [(Writer(2), Message::PutAck { .. })]
        ));
        written.push((update, value));
    }
    let total: u64 = written.iter().map(|(_, v)| v.len() as u64).sum();
    assert_eq!((s0.values_held(), s0.value_bytes()), (20, total));
    let resident = written
        .iter()
        .filter(|(update, _)| s0.value(&value_of(update)).is_some())
        .count();
    assert!(resident <= 3, "{resident} values in memory");

    // Another server's pull brings every value, read back from the store.
    let mut s1 = node(1);
    for _ in 0..4 {
        let pull = s1.pull(Writer(0));
        let out = s0.on_message_with(Writer(1), pull, NOW, &store);
        store.record(&out);
        for (to, message) in out.sends {
            assert_eq!(to, Writer(1));
            s1.on_message(Writer(0), message, NOW);
        }
    }
    assert_eq!((s1.values_held(), s1.value_bytes()), (20, total));
    // A reader gets the first value written, long gone from memory.
    let mut c3 = node(3);
    let ReadStart::Ask(to, get) = c3.start_read(1, key("c2/k0"), &[Writer(0)], NOW) else {
        panic!("a read asks the server");
    };
    let reply = s0.on_message_with(Writer(3), *get, NOW, &store).sends;
    let out = c3.on_message(to, reply.into_iter().next().expect("an answer").1, NOW);
    assert_eq!(
        out.reads[0].1.versions[0].value.as_ref(),
        Some(&written[0].1)
    );

    // Restarted from its records with the values left on disk.
    let mut disk: Vec<Change> = written
        .iter()
        .map(|(_, value)| Change::Stored(value_hash(value), value.len() as u64))
        .collect();
    disk.extend(durable(&s0));
    let mut restored = Node::restore_with(
        config(),
        Writer(0),
        secret(0),
        &disk,
        NOW,
        Some(BOUND),
        &store,
    );
    assert_eq!(
        (restored.values_held(), restored.value_bytes()),
        (20, total)
    );
    // Bytes damaged on disk are not served: counted, held no more, and fetched again.
    let damaged = value_of(&written[5].0);
    store.0.insert(damaged, Bytes::from("rotten"));
    let mut s4 = node(1);
    for _ in 0..4 {
        let pull = s4.pull(Writer(0));
        let out = restored.on_message_with(Writer(1), pull, NOW, &store);
        store.record(&out);
        for (_, message) in out.sends {
            s4.on_message(Writer(0), message, NOW);
        }
    }
    assert_eq!(s4.values_held(), 19);
    assert!(!s4.has_value(&damaged));
    assert_eq!(s4.stats().values_refused, 0, "nothing unchecked was sent");
    assert_eq!(restored.stats().values_damaged, 1);
    assert!(!restored.has_value(&damaged));
    let Message::Pull { want_values, .. } = restored.pull(Writer(1)) else {
        panic!("a pull");
    };
    assert_eq!(want_values, vec![damaged], "asked for again");
    let push = s1.on_message(
        Writer(0),
        Message::Pull {
            frontier: restored.log().frontier().flat(),
            want: Vec::new(),
            want_values,
            values: true,
        },
        NOW,
    );
    for (_, message) in push.sends {
        let out = restored.on_message_with(Writer(1), message, NOW, &store);
        store.record(&out);
    }
    assert!(restored.has_value(&damaged));
    assert_eq!(store.0[&damaged], written[5].1, "stored again intact");
}

/// What a peer lacks, by the rule itself: for each update, whether some head of the peer's
/// covers it, judged one update at a time over the whole log (the log's own answer looks at
/// each writer's updates apart and walks a forked writer's branches once).
fn missing_by_definition(node: &Node, theirs: &[(Writer, u64, UpdateId)]) -> Vec<UpdateId> {
    let log = node.log();
    let forked: Vec<Writer> = log.frontier().forked().collect();
    // Whether `a` is `b` or before it on `b`'s branch.
    let precedes = |a: &Update, b: &Update| {
        let mut cursor = Some(b.id());
        while let Some(id) = cursor {
            if id == a.id() {
                return true;
            }
            cursor = log.get(&id).and_then(|u| u.body().prev);
        }
        false
    };
    log.in_order()
        .filter(|update| {
            let body = update.body();
            !theirs.iter().any(|(writer, clock, head)| {
                *writer == body.writer
                    && *clock >= body.clock
                    && match log.get(head) {
                        Some(head) => precedes(update, head),
                        None => !forked.contains(writer),
                    }
            })
        })
        .map(|update| update.id())
        .collect()
}

/// A pull is answered with exactly what the peer lacks, in log order and cut at the limit,
/// whatever the peer claims: frontiers of real peers at every stage, heads it holds and heads
/// it does not, clocks claimed too high and too low, with and without a writer that forked and
/// wrote on after its fork, and a writer idle since its first update.
#[test]
fn a_pull_is_answered_with_exactly_what_the_peer_lacks_in_log_order() {
    use rand::{Rng, SeedableRng};
    for seed in 0..40u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (mut server, mut a, mut b) = (node(0), node(2), node(3));
        let mut forker = node(4);
        let mut twin = node(4);
        let mut snapshots: Vec<Vec<(Writer, u64, UpdateId)>> = vec![Vec::new()];
        put(&mut b, "c3/idle", "once");
        let fork = seed % 2 == 0;
        put(&mut forker, "c4/first", "left");
        if fork {
            // The other branch, a few updates long, reaches client 3 alone at first (the
            // exchange finds nodes by member, so the twin cannot take part in it).
            for i in 0..rng.random_range(1..4) {
                let update = put(&mut twin, "c4/first", &format!("right{i}"));
                let value = Bytes::from(format!("right{i}"));
                b.on_message(
                    Writer(4),
                    Message::push(vec![update.to_wire()], vec![value]),
                    NOW,
                );
            }
            snapshots.push(b.log().frontier().flat());
        }
        for step in 0..rng.random_range(5..40) {
            let writer: &mut Node = if rng.random_bool(0.5) {
                &mut a
            } else {
                &mut forker
            };
            put(writer, &format!("shared/{}", step % 4), &format!("v{step}"));
            if rng.random_bool(0.3) {
                exchange(&mut [&mut a, &mut forker]);
            }
            if rng.random_bool(0.3) {
                snapshots.push(server.log().frontier().flat());
                exchange(&mut [&mut server, &mut a, &mut b, &mut forker]);
                snapshots.push(a.log().frontier().flat());
            }
        }
        exchange(&mut [&mut server, &mut a, &mut b, &mut forker]);
        assert_eq!(
            server.log().frontier().forked().count(),
            usize::from(fork),
            "seed {seed}: the server holds the fork"
        );
        snapshots.push(b.log().frontier().flat());
        // The frontier keeps one head per branch: the updates of each writer none names as its
        // previous one.
        for writer in [Writer(2), Writer(3), Writer(4)] {
            let log = server.log();
            let ours: Vec<&Update> = log
                .in_order()
                .filter(|u| u.body().writer == writer)
                .collect();
            let mut leaves: Vec<UpdateId> = ours
                .iter()
                .filter(|u| !ours.iter().any(|v| v.body().prev == Some(u.id())))
                .map(|u| u.id())
                .collect();
            let mut heads: Vec<UpdateId> = log
                .frontier()
                .heads(writer)
                .iter()
                .map(|(_, id)| *id)
                .collect();
            leaves.sort();
            heads.sort();
            assert_eq!(heads, leaves, "seed {seed}: the heads of {writer:?}");
        }
        let all: Vec<UpdateId> = server.log().in_order().map(|u| u.id()).collect();
        for snapshot in &snapshots {
            let mut claims = vec![snapshot.clone()];
            // Claims as a faulty peer makes them: clocks moved, heads it cannot hold, a head
            // from the middle of the log.
            let mut moved = snapshot.clone();
            for (_, clock, _) in &mut moved {
                *clock = match rng.random_range(0..3) {
                    0 => clock.saturating_sub(rng.random_range(0..5)),
                    1 => *clock + rng.random_range(0..5),
                    _ => *clock,
                };
            }
            claims.push(moved);
            let middle = server
                .log()
                .get(&all[rng.random_range(0..all.len())])
                .unwrap();
            let mut extra = snapshot.clone();
            extra.push((middle.body().writer, middle.body().clock, middle.id()));
            extra.push((
                Writer(4),
                rng.random_range(0..50),
                UpdateId(value_hash(b"unheld")),
            ));
            claims.push(extra);
            for theirs in &claims {
                let expected = missing_by_definition(&server, theirs);
                for limit in [1, 3, usize::MAX] {
                    let (got, more) = server.log().missing_for(theirs, limit);
                    let got: Vec<UpdateId> = got.iter().map(|u| u.id()).collect();
                    let cut = expected.len().min(limit);
                    assert_eq!(got, expected[..cut], "seed {seed}, limit {limit}");
                    assert_eq!(more, expected.len() > limit, "seed {seed}, limit {limit}");
                }
            }
        }
    }
}
