//! Content-hash objects (Rosebud §4.3) in the simulator: the real replica (or a Byzantine one)
//! over a simulated disk, the real write and read machines, and a checker of what the paper
//! promises: once the write that created an object completes, every later read returns it, and
//! no read ever returns bytes other than the object's.
//!
//! The world's workload names keys and values; an object is named by its content, so each key
//! stands for one fixed object ([`object_of`]): every write of the key creates that object (the
//! value drawn for it is not used), and every read of the key reads it by its id.
//!
//! Writers never crash here ([`Protocol::tolerated`] drops the nemesis): a writer that dies after
//! reaching fewer than `f+1` replicas leaves an object no read can rebuild or deny (fewer than
//! `f+1` fragments, fewer than `2f+1` denials), and Rosebud's clients read only objects whose
//! creation they know completed. Every other fault applies.

use crate::byzantine::Behaviour;
use crate::checker::{History, KeyReport, KeyVerdict, Op, OpKind, Outcome, Report, Violation};
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Finish, Finished, Protocol, Storage};
use crate::sim::swarm::Swarm;
use crate::sim::world::unwritten_name;
use bulwark_core::erasure::{ErasureCodec, ReedSolomonSimd};
use bulwark_core::sign::{PublicKey, SecretKey};
use bulwark_core::{ClientId, Digest, Epoch, GroupId, Key, ServiceId, Slot, Time};
use bulwark_protocol::content::{
    Change, ContentId, Encoded, Fragments, Held, Place, ReadOp, ReadOutcome, Request, RequestBody,
    Response, ResponseBody, Server, WriteOp, WriteOutcome,
};
use bulwark_protocol::machine::{Access, Never, Output, Replica, ReplicaStats};
use bulwark_protocol::round::{OpId, RegisterMutations};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The object key `key` stands for: a few sizes on both sides of the replication threshold.
pub fn object_of(key: &[u8]) -> Vec<u8> {
    let seed = Digest::of("bulwark/sim/content-object", key).0;
    let len = [0, 37, 4_096, 4_097, 12_345][seed[0] as usize % 5];
    (0..len)
        .map(|i| seed[i % 32] ^ (i as u8).wrapping_mul(31))
        .collect()
}

/// One run's group of content-hash replicas.
pub struct ContentSim {
    f: usize,
    secrets: Vec<SecretKey>,
    keys: Arc<[PublicKey]>,
    codec: Arc<dyn ErasureCodec>,
    mutations: RegisterMutations,
    /// Each key's object, cut once: every write and read of the key needs it.
    encoded: RefCell<BTreeMap<Key, Encoded>>,
}

impl ContentSim {
    fn place(&self, slot: usize) -> Place {
        Place {
            slot: Slot(slot as u32),
            n: self.secrets.len(),
            f: self.f,
            epoch: Epoch(0),
            group: GroupId(0),
        }
    }

    fn encoded(&self, key: &Key) -> Encoded {
        let n = self.secrets.len();
        self.encoded
            .borrow_mut()
            .entry(key.clone())
            .or_insert_with(|| {
                Encoded::new(&*self.codec, n, self.f, &object_of(key.as_bytes())).unwrap_or_else(
                    |error| unreachable!("a simulated object is within bounds: {error}"),
                )
            })
            .clone()
    }
}

/// One server's disk: every object it stored, in id order.
#[derive(Default)]
pub struct ContentDisk(BTreeMap<ContentId, Held>);

impl Protocol for ContentSim {
    type Request = Request;
    type Response = Response;
    type Change = Change;
    type Disk = ContentDisk;
    type Server = ContentNode;
    type Write = WriteOp;
    type Read = ReadOp;

    fn nodes(f: usize) -> usize {
        3 * f + 1
    }

    /// The storage catalogue of Byzantine servers and every network and server fault; no
    /// crashing writers (see the module's documentation) and no catalogue of Byzantine readers
    /// (a read changes nothing on a replica).
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.retain(|behaviour| behaviour.is_storage());
        faults.nemeses.remove(&Nemesis::ClientCrashes);
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> ContentSim {
        let n = Self::nodes(config.f);
        let secrets: Vec<SecretKey> = (0..n)
            .map(|_| SecretKey::from_seed(&rng.random()))
            .collect();
        let keys = secrets.iter().map(SecretKey::public_key).collect();
        ContentSim {
            f: config.f,
            secrets,
            keys,
            codec: Arc::new(ReedSolomonSimd),
            mutations: config.mutations.register,
            encoded: RefCell::new(BTreeMap::new()),
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> ContentNode {
        ContentNode {
            honest: Server::new(self.place(index), self.secrets[index].clone(), 0, 0),
            behaviour,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    fn restore(&self, index: usize, disk: &ContentDisk, _now: u64) -> ContentNode {
        let bytes = disk.0.values().map(|held| held.fragment.len() as u64).sum();
        ContentNode {
            honest: Server::new(
                self.place(index),
                self.secrets[index].clone(),
                disk.0.len() as u64,
                bytes,
            ),
            behaviour: Behaviour::Honest,
            rng: ChaCha8Rng::seed_from_u64(0),
        }
    }

    fn view(storage: &Storage<Self>) -> &(dyn Fragments + 'static) {
        storage
    }

    fn persist(disk: &mut ContentDisk, change: &Change) {
        match change {
            Change::Put { id, held } => {
                disk.0.insert(*id, held.clone());
            }
            Change::Delete { id } => {
                disk.0.remove(id);
            }
        }
    }

    fn disk_versions(disk: &ContentDisk) -> usize {
        disk.0.len()
    }

    fn write(
        &self,
        _client: usize,
        key: Key,
        op: OpId,
        _value: Option<Bytes>,
        _now: u64,
        _rng: &mut ChaCha8Rng,
    ) -> WriteOp {
        WriteOp::new(self.place(0), self.keys.clone(), op, self.encoded(&key))
            .unwrap_or_else(|error| unreachable!("keys and fragments fit the group: {error}"))
            .with_mutations(self.mutations)
    }

    fn read(&self, _client: usize, key: Key, op: OpId) -> ReadOp {
        let id = self.encoded(&key).id;
        ReadOp::new(self.place(0), self.codec.clone(), op, id).with_mutations(self.mutations)
    }

    fn response_op(response: &Response) -> OpId {
        response.op
    }

    fn request_name(request: &Request) -> &'static str {
        match request.body {
            RequestBody::Store { .. } => "store-ch",
            RequestBody::Fetch => "fetch-ch",
            RequestBody::Delete => "delete-ch",
        }
    }

    fn request_kind(request: &Request) -> usize {
        match request.body {
            RequestBody::Store { .. } => 1,
            RequestBody::Fetch => 3,
            RequestBody::Delete => 2,
        }
    }

    fn describe_request(request: &Request) -> String {
        let detail = match &request.body {
            RequestBody::Store { fragment, .. } => format!(" fragment={}B", fragment.len()),
            RequestBody::Fetch | RequestBody::Delete => String::new(),
        };
        format!(
            "{} id={:?} op{}{detail}",
            Self::request_name(request),
            request.id,
            request.op.0
        )
    }

    fn describe_response(response: &Response) -> String {
        let detail = match &response.body {
            ResponseBody::Stored(_) => "stored".to_string(),
            ResponseBody::Fragment { fragment, .. } => format!("fragment {}B", fragment.len()),
            ResponseBody::Missing => "missing".to_string(),
            ResponseBody::Deleted => "deleted".to_string(),
            ResponseBody::Refused(refusal) => format!("refused: {refusal}"),
        };
        format!("{detail} op{}", response.op.0)
    }

    fn check(&self, history: &History, _servers: &[Option<&ContentNode>]) -> Report {
        check_objects(history)
    }
}

/// A replica reads what it stored back from the disk, or from batches still on their way.
impl Fragments for Storage<ContentSim> {
    fn fragment(&self, id: &ContentId) -> Option<Held> {
        let pending = self.pending().rev().find_map(|change| match change {
            Change::Put { id: stored, held } => (stored == id).then(|| Some(held.clone())),
            Change::Delete { id: deleted } => (deleted == id).then_some(None),
        });
        pending.unwrap_or_else(|| self.durable.0.get(id).cloned())
    }
}

impl Finish for WriteOutcome {
    fn finish(self) -> Finished {
        Finished {
            read: None,
            version: format!("{:?}", self.id),
            evidence: self
                .evidence
                .iter()
                .map(|e| (e.node, format!("{:?}", e.kind)))
                .collect(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

impl Finish for ReadOutcome {
    fn finish(self) -> Finished {
        Finished {
            version: if self.value.is_some() {
                "object".to_string()
            } else {
                "not found".to_string()
            },
            evidence: self
                .evidence
                .iter()
                .map(|e| (e.node, format!("{:?}", e.kind)))
                .collect(),
            read: Some(self.value),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Byzantine replicas

/// A content-hash replica: honest, or bending the honest one's answers as the storage catalogue's
/// behaviours do.
///
/// - Silent: never answers.
/// - Corrupting: serves its fragment with bytes flipped.
/// - Forging: acknowledges every STORE, with a genuine signature, without storing anything.
/// - Equivocating: serves its fragment under a manifest of another length (another "object").
/// - Amnesiac, Stale, Colluding: denies holding anything (colluders deny together).
pub struct ContentNode {
    honest: Server,
    behaviour: Behaviour,
    rng: ChaCha8Rng,
}

impl Replica for ContentNode {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    type Request = Request;
    type Reply = Response;
    type Message = Never;
    type Change = Change;
    type View = dyn Fragments;

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Request,
        view: &(dyn Fragments + 'static),
    ) -> Output<Self> {
        let fetch = matches!(request.body, RequestBody::Fetch);
        let honest = self.honest.on_request(now, client, access, request, view);
        let mut out: Output<Self> = Output {
            changes: honest.changes,
            reply: honest.reply,
            refused: honest.refused,
            ..Output::none()
        };
        match self.behaviour {
            Behaviour::Silent => return Output::none(),
            Behaviour::Forging if !fetch => out.changes.clear(),
            Behaviour::Corrupting => {
                if let Some(Response {
                    body: ResponseBody::Fragment { fragment, .. },
                    ..
                }) = &mut out.reply
                    && !fragment.is_empty()
                {
                    let mut bad = fragment.to_vec();
                    let at = self.rng.random_range(0..bad.len());
                    bad[at] ^= 1 << self.rng.random_range(0..8);
                    *fragment = Bytes::from(bad);
                }
            }
            Behaviour::Equivocating => {
                if let Some(Response {
                    body: ResponseBody::Fragment { manifest, .. },
                    ..
                }) = &mut out.reply
                {
                    manifest.layout.len ^= 1;
                }
            }
            Behaviour::Amnesiac | Behaviour::Stale | Behaviour::Colluding if fetch => {
                if let Some(reply) = &mut out.reply
                    && matches!(reply.body, ResponseBody::Fragment { .. })
                {
                    reply.body = ResponseBody::Missing;
                }
            }
            _ => {}
        }
        out
    }

    fn stats(&self) -> ReplicaStats {
        self.honest.stats()
    }
}

// ---------------------------------------------------------------------------------------------
// The checker

/// What Rosebud promises of content-hash objects, key by key: a read returns the object or
/// nothing, never other bytes; and it returns the object if a write of it completed before the
/// read began.
pub fn check_objects(history: &History) -> Report {
    let mut by_key: BTreeMap<&[u8], Vec<&Op>> = BTreeMap::new();
    for op in &history.ops {
        by_key.entry(op.key.as_slice()).or_default().push(op);
    }
    let mut report = Report {
        keys_checked: by_key.len(),
        ..Report::default()
    };
    for (key, ops) in by_key {
        // The history names a value read by its first bytes and length (the workload did not
        // write it): that name is what the object must come back as.
        let object = unwritten_name(&object_of(key));
        // The earliest completion of any acknowledged write of the object.
        let created = ops
            .iter()
            .filter(|op| matches!(op.kind, OpKind::Write(_)) && op.outcome == Outcome::Ok)
            .filter_map(|op| op.complete)
            .min();
        let mut problems = Vec::new();
        let mut checked = 0;
        for op in ops.iter().filter(|op| op.kind == OpKind::Read) {
            let Outcome::Read(value) = &op.outcome else {
                continue;
            };
            checked += 1;
            match value {
                Some(name) if *name != object => problems.push((
                    format!(
                        "a read returned {} instead of the object, {}",
                        String::from_utf8_lossy(name),
                        String::from_utf8_lossy(&object)
                    ),
                    (*op).clone(),
                )),
                None if created.is_some_and(|at| at < op.invoke) => problems.push((
                    format!(
                        "a read invoked at {} found nothing, though the object's creation \
                         completed at {}",
                        op.invoke,
                        created.unwrap_or_default()
                    ),
                    (*op).clone(),
                )),
                _ => {}
            }
        }
        report.ops_checked += checked;
        let verdict = if problems.is_empty() {
            KeyVerdict::Linearizable
        } else {
            KeyVerdict::Violation
        };
        if let Some((explanation, first)) = problems.into_iter().next() {
            report.violations.push(Violation {
                key: key.to_vec(),
                explanation,
                conflicting: vec![first],
            });
        }
        report.keys.push(KeyReport {
            key: key.to_vec(),
            verdict,
            ops: checked,
            segments: 0,
            steps: 0,
        });
    }
    report.ok = report.violations.is_empty();
    report
}
