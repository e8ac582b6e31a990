//! Registers on the certified ring, across epochs (`super::super::epochs`): nodes that each run
//! an `EpochHost<Registers>`, the key's group changing under them, and clients whose operations
//! follow the key (`Routed`). Every message between nodes goes through the hosts, as a node's
//! transport carries them.

use super::*;
use crate::machine::{Operation, Output, Progress, Replica};
use crate::powerstore::epochs::{MemoryStores, Registers};
use crate::transfer::{EpochHost, Message, Rebase, Routed, TransferMutations};
use bulwark_core::NodeId;
use bulwark_core::membership::{Chain, PlacementParams, Ring, RingPoint};
use bulwark_core::sign::PublicKey;
use std::collections::VecDeque;

/// The time a tick moves on: the hosts' retries run on it.
const TICK_MILLIS: u64 = 100;

struct Node {
    host: EpochHost<Registers>,
    stores: MemoryStores,
}

/// Nodes `0..nodes` and the certified rings they go through.
struct Cluster {
    chain: Arc<Chain>,
    nodes: Vec<Node>,
    /// Node-to-node messages in flight.
    wire: VecDeque<(NodeId, NodeId, Message<Registers>)>,
    /// Answers to requests a host held, by operation id: from which node.
    notified: Vec<(u64, Slot, Response)>,
    now: Time,
    next_op: u64,
    identity: Arc<WriterIdentity>,
    /// Messages delivered between nodes, in all.
    delivered: u64,
}

fn ring(epoch: u64, ids: &[u32]) -> Arc<Ring> {
    let ring = Ring::new(
        Epoch(epoch),
        PlacementParams::new(1),
        ids.iter().copied().map(NodeId),
    );
    Arc::new(ring.expect("enough members"))
}

impl Cluster {
    /// Nodes `0..nodes`, at the first of `rings`; the others are certified and entered later.
    fn new(nodes: u32, rings: Vec<Arc<Ring>>, mutations: TransferMutations) -> Cluster {
        let writer = SecretKey::from_seed(&[100; 32]);
        let secrets: Vec<SecretKey> = (0..nodes)
            .map(|i| SecretKey::from_seed(&[i as u8 + 1; 32]))
            .collect();
        let signing: Vec<(NodeId, PublicKey)> = (0..nodes)
            .map(|i| (NodeId(i), secrets[i as usize].public_key()))
            .collect();
        let chain = Arc::new(Chain::new(rings.clone()).with_keys(signing));
        let genesis = rings[0].clone();
        let nodes = (0..nodes)
            .map(|i| {
                let keys =
                    ServerKeys::derived(&secrets[i as usize], [(ClientId(0), writer.public_key())]);
                let kind =
                    Registers::new(NodeId(i), genesis.clone(), keys, Arc::new(ReedSolomonSimd));
                let host =
                    EpochHost::new(NodeId(i), genesis.clone(), kind).with_mutations(mutations);
                Node {
                    host,
                    stores: MemoryStores::default(),
                }
            })
            .collect();
        Cluster {
            chain,
            nodes,
            wire: VecDeque::new(),
            notified: Vec::new(),
            now: Time(1_000),
            next_op: 0,
            identity: Arc::new(WriterIdentity {
                signing: writer,
                timestamp: MacKey([99; 32]),
            }),
            delivered: 0,
        }
    }

    /// Makes `output` of node `at` durable, then sends what it sends and fires its timers.
    fn apply(&mut self, at: usize, output: Output<EpochHost<Registers>>) {
        let mut timers = Vec::new();
        let mut outputs = VecDeque::from([(at, output)]);
        while let Some((at, output)) = outputs.pop_front() {
            for change in &output.changes {
                self.nodes[at].stores.apply(change);
            }
            for (to, message) in output.sends {
                self.wire
                    .push_back((NodeId(at as u32), NodeId(to.0), message));
            }
            for (_, op, reply) in output.notify {
                self.notified.push((op, Slot(at as u32), reply));
            }
            timers.extend(output.timers.into_iter().map(|(timer, _)| (at, timer)));
            if outputs.is_empty() {
                for (at, timer) in timers.drain(..) {
                    let node = &mut self.nodes[at];
                    let fired = node.host.on_timer(self.now, timer, &node.stores);
                    outputs.push_back((at, fired));
                }
            }
        }
    }

    /// Delivers every message in flight, and those they cause.
    fn pump(&mut self) {
        let mut budget = 200_000;
        while let Some((from, to, message)) = self.wire.pop_front() {
            budget -= 1;
            assert!(budget > 0, "messages between nodes do not settle");
            self.delivered += 1;
            let node = &mut self.nodes[to.0 as usize];
            let output = node
                .host
                .on_message(self.now, Slot(from.0), message, &node.stores);
            self.apply(to.0 as usize, output);
        }
    }

    /// Time moves on a tick: every host's retries and take-overs' timers.
    fn tick(&mut self) {
        self.now = Time(self.now.0 + TICK_MILLIS);
        for at in 0..self.nodes.len() {
            let output = self.nodes[at].host.on_tick(self.now);
            self.apply(at, output);
        }
        self.pump();
    }

    /// Every node enters the chain's ring of `epoch`.
    fn enter(&mut self, epoch: u64, nodes: &[u32]) {
        let ring = self.chain.ring(Epoch(epoch)).expect("certified").clone();
        for &at in nodes {
            let output = self.nodes[at as usize].host.enter(ring.clone());
            self.apply(at as usize, output);
        }
    }

    /// Ticks until every node's pulls are in and no take-over runs, at most `ticks` times.
    fn settle(&mut self, ticks: usize) {
        self.pump();
        for _ in 0..ticks {
            let done = self
                .nodes
                .iter()
                .all(|node| node.host.settled() && node.host.kind().running() == 0);
            if done {
                return;
            }
            self.tick();
        }
        panic!("the take-overs did not end");
    }

    fn op(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    /// A client's view of the key's group in `epoch`.
    fn config(&self, key: &Key, epoch: u64) -> ClientConfig {
        let point = RingPoint::of_key(key.as_bytes());
        let (view, incarnation) = self.chain.incarnation(Epoch(epoch), point).expect("ring");
        ClientConfig {
            epoch: Epoch(epoch),
            group: view.id(),
            incarnation,
            ..ClientConfig::new(1)
        }
    }

    /// A write of `value` to `key` by writer 0, from a client in `epoch`.
    fn write(&mut self, key: &Key, value: &[u8], epoch: u64) -> Routed<WriteOp> {
        let config = self.config(key, epoch);
        let point = RingPoint::of_key(key.as_bytes());
        let members = self.chain.ring(Epoch(epoch)).expect("ring").group_at(point);
        let keys = self
            .identity
            .keys_for(members.members(), &self.chain)
            .expect("certified keys");
        let op = self.op();
        let write = WriteOp::new(
            config,
            Arc::new(keys),
            Arc::new(ReedSolomonSimd),
            key.clone(),
            op,
            Pid {
                writer: ClientId(0),
                seq: op.0,
            },
            [op.0 as u8; 32],
            Some(Bytes::copy_from_slice(value)),
        )
        .following(self.identity.clone());
        Routed::new(write, point, self.chain.clone(), Epoch(epoch))
    }

    /// A read of `key` from a client in `epoch`.
    fn read(&mut self, key: &Key, epoch: u64) -> Routed<ReadOp> {
        let config = self.config(key, epoch);
        let op = self.op();
        let read = ReadOp::new(config, Arc::new(ReedSolomonSimd), key.clone(), op);
        let point = RingPoint::of_key(key.as_bytes());
        Routed::new(read, point, self.chain.clone(), Epoch(epoch))
    }

    /// Runs `op` to its end through the hosts, ticking whenever nothing is in flight; `between`
    /// runs after each batch of requests, before the answers are fed back.
    fn run<O: Rebase<Request = Request, Reply = Response>>(
        &mut self,
        op: &mut Routed<O>,
        mut between: impl FnMut(&mut Cluster),
    ) -> Result<O::Output, crate::machine::OpError> {
        let id = op.op();
        let mut queue: VecDeque<(Slot, Request)> = op.start().into();
        for _ in 0..400 {
            let mut answers = Vec::new();
            while let Some((to, request)) = queue.pop_front() {
                let at = to.0 as usize;
                let node = &mut self.nodes[at];
                let mut output =
                    node.host
                        .on_request(self.now, ClientId(0), WRITER, request, &node.stores);
                let reply = output.reply.take();
                self.apply(at, output);
                if let Some(reply) = reply {
                    answers.push((to, reply));
                }
            }
            between(self);
            self.pump();
            let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.notified)
                .into_iter()
                .partition(|(op, _, _)| *op == id);
            self.notified = others;
            answers.extend(mine.into_iter().map(|(_, from, reply)| (from, reply)));
            for (from, reply) in answers {
                match op.on_reply(from, reply) {
                    Progress::Send(more) => queue.extend(more),
                    Progress::Done(result) => return result,
                }
            }
            if queue.is_empty() {
                self.tick();
                queue.extend(op.on_timeout());
            }
        }
        panic!("the operation did not end");
    }

    fn put(&mut self, key: &Key, value: &[u8], epoch: u64) {
        let mut write = self.write(key, value, epoch);
        self.run(&mut write, |_| {}).expect("the write completes");
    }

    fn get(&mut self, key: &Key, epoch: u64) -> Option<Bytes> {
        let mut read = self.read(key, epoch);
        self.run(&mut read, |_| {})
            .expect("the read completes")
            .value
    }
}

fn keys(count: usize) -> Vec<Key> {
    (0..count).map(|i| key(&format!("key-{i}"))).collect()
}

#[test]
fn registers_move_to_a_group_that_replaces_every_member_and_stay_readable() {
    let rings = vec![ring(1, &[0, 1, 2, 3]), ring(2, &[4, 5, 6, 7])];
    let mut cluster = Cluster::new(8, rings, TransferMutations::default());
    let keys = keys(6);
    for (i, k) in keys.iter().enumerate() {
        cluster.put(k, format!("first {i}").as_bytes(), 1);
        cluster.put(k, format!("second {i}").as_bytes(), 1);
    }
    cluster.enter(2, &[0, 1, 2, 3, 4, 5, 6, 7]);
    cluster.settle(200);
    // Clients still in epoch 1 are turned away and read the new group from the start.
    for (i, k) in keys.iter().enumerate() {
        let expected = format!("second {i}");
        assert_eq!(cluster.get(k, 1).as_deref(), Some(expected.as_bytes()));
    }
    let stats = cluster.nodes[4].host.stats();
    assert_eq!(
        stats.transferred_keys,
        keys.len() as u64,
        "each key moved once"
    );
    // Writes of the new incarnation order after the carried versions.
    cluster.put(&keys[0], b"third", 2);
    assert_eq!(cluster.get(&keys[0], 2).as_deref(), Some(&b"third"[..]));
}

/// A key written in epoch 1 and read by a client in epoch 2 whose requests reach the new
/// members before their take-overs ran; whether the read waited at a new member.
fn read_before_take_overs(mutations: TransferMutations) -> (Option<Bytes>, bool) {
    let rings = vec![ring(1, &[0, 1, 2, 3]), ring(2, &[4, 5, 6, 7])];
    let mut cluster = Cluster::new(8, rings, mutations);
    let k = key("k");
    cluster.put(&k, b"one", 1);
    cluster.enter(2, &[0, 1, 2, 3, 4, 5, 6, 7]);
    let mut read = cluster.read(&k, 2);
    let got = cluster.run(&mut read, |_| {}).expect("the read ends").value;
    (got, cluster.nodes[4].host.stats().gated > 0)
}

#[test]
fn a_read_held_while_the_key_is_taken_over_returns_the_carried_version() {
    let (got, waited) = read_before_take_overs(TransferMutations::default());
    assert_eq!(got.as_deref(), Some(&b"one"[..]));
    assert!(waited, "the read waited for the take-over");
}

#[test]
fn a_new_member_that_serves_before_its_take_over_is_confirmed_is_caught() {
    let broken = TransferMutations {
        serve_before_transfer: true,
        ..TransferMutations::default()
    };
    let (got, _) = read_before_take_overs(broken);
    assert_eq!(
        got, None,
        "the broken variant reads the key as never written"
    );
}

#[test]
fn a_joining_node_takes_over_only_the_keys_whose_group_changed() {
    // Node 8 joins eight: the groups of the arcs around it change, the others stay.
    let rings = vec![
        ring(1, &[0, 1, 2, 3, 4, 5, 6, 7]),
        ring(2, &[0, 1, 2, 3, 4, 5, 6, 7, 8]),
    ];
    let mut cluster = Cluster::new(9, rings.clone(), TransferMutations::default());
    let keys = keys(40);
    for (i, k) in keys.iter().enumerate() {
        cluster.put(k, format!("value {i}").as_bytes(), 1);
    }
    cluster.enter(2, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
    cluster.settle(300);
    let moved: Vec<&Key> = keys
        .iter()
        .filter(|k| {
            let point = RingPoint::of_key(k.as_bytes());
            rings[0].group_at(point).members() != rings[1].group_at(point).members()
        })
        .collect();
    assert!(!moved.is_empty() && moved.len() < keys.len());
    // The joining node holds each key of its groups, and only those.
    let joined = cluster.nodes[8].host.stats().transferred_keys;
    let its: usize = moved
        .iter()
        .filter(|k| {
            let point = RingPoint::of_key(k.as_bytes());
            rings[1].group_at(point).contains(NodeId(8))
        })
        .count();
    assert_eq!(joined, its as u64);
    for (i, k) in keys.iter().enumerate() {
        let expected = format!("value {i}");
        assert_eq!(
            cluster.get(k, 1).as_deref(),
            Some(expected.as_bytes()),
            "{k}"
        );
    }
}

#[test]
fn a_write_the_change_cuts_in_clock_completes_in_the_new_incarnation() {
    let rings = vec![ring(1, &[0, 1, 2, 3]), ring(2, &[4, 5, 6, 7])];
    let mut cluster = Cluster::new(8, rings, TransferMutations::default());
    let k = key("k");
    cluster.put(&k, b"one", 1);
    let mut write = cluster.write(&k, b"two", 1);
    // Every node enters epoch 2 once the old members answered the write's CLOCK: its STORE is
    // turned away and goes to the new members, who hold it until the key is theirs.
    let mut entered = false;
    let outcome = cluster.run(&mut write, |cluster| {
        if !entered {
            entered = true;
            cluster.enter(2, &[0, 1, 2, 3, 4, 5, 6, 7]);
        }
    });
    let outcome = outcome.expect("the write completes in epoch 2");
    assert!(
        outcome
            .acknowledged_by
            .iter()
            .all(|slot| (4..8).contains(&slot.0)),
        "completed by the new members: {:?}",
        outcome.acknowledged_by
    );
    cluster.settle(200);
    assert_eq!(cluster.get(&k, 1).as_deref(), Some(&b"two"[..]));
}

#[test]
fn a_key_moves_on_through_a_second_change_and_its_first_incarnation_is_not_read_again() {
    // Nodes 0-3 serve the key in epoch 1, 4-7 in epoch 2, and 0-3 again in epoch 3: a new
    // incarnation of the same members, which takes the key over from 4-7.
    let rings = vec![
        ring(1, &[0, 1, 2, 3]),
        ring(2, &[4, 5, 6, 7]),
        ring(3, &[0, 1, 2, 3]),
    ];
    let mut cluster = Cluster::new(8, rings, TransferMutations::default());
    let k = key("k");
    cluster.put(&k, b"one", 1);
    cluster.enter(2, &[0, 1, 2, 3, 4, 5, 6, 7]);
    cluster.settle(200);
    cluster.put(&k, b"two", 2);
    cluster.enter(3, &[0, 1, 2, 3, 4, 5, 6, 7]);
    cluster.settle(200);
    assert_eq!(cluster.get(&k, 1).as_deref(), Some(&b"two"[..]));
    cluster.put(&k, b"three", 3);
    assert_eq!(cluster.get(&k, 3).as_deref(), Some(&b"three"[..]));
}

#[test]
fn old_members_answer_a_take_over_only_once_they_left_the_epoch_it_reads() {
    let rings = vec![ring(1, &[0, 1, 2, 3]), ring(2, &[4, 5, 6, 7])];
    let mut cluster = Cluster::new(8, rings, TransferMutations::default());
    let k = key("k");
    cluster.put(&k, b"one", 1);
    // The new members enter first; the old ones, still in epoch 1, leave their reads unanswered
    // and complete a client's write meanwhile.
    cluster.enter(2, &[4, 5, 6, 7]);
    for _ in 0..20 {
        cluster.tick();
    }
    assert!(
        !cluster.nodes[4].host.settled(),
        "nothing was taken over yet"
    );
    cluster.put(&k, b"two", 1);
    cluster.enter(2, &[0, 1, 2, 3]);
    cluster.settle(200);
    assert_eq!(cluster.get(&k, 2).as_deref(), Some(&b"two"[..]));
}

#[test]
fn nodes_that_enter_two_epochs_before_any_take_over_ran_carry_the_key_through_both() {
    let rings = vec![
        ring(1, &[0, 1, 2, 3]),
        ring(2, &[4, 5, 6, 7]),
        ring(3, &[0, 1, 2, 3]),
    ];
    let mut cluster = Cluster::new(8, rings, TransferMutations::default());
    let k = key("k");
    cluster.put(&k, b"one", 1);
    cluster.enter(2, &[0, 1, 2, 3, 4, 5, 6, 7]);
    cluster.enter(3, &[0, 1, 2, 3, 4, 5, 6, 7]);
    cluster.settle(300);
    assert_eq!(cluster.get(&k, 1).as_deref(), Some(&b"one"[..]));
}
