//! Content-hash objects (Rosebud §4.3): immutable objects named by a hash of what they hold,
//! erasure-coded over the group their id falls in, and stored once `2f+1` replicas have signed
//! that they hold their fragment.
//!
//! The paper names an object `H(content)` and stores it whole on every replica. Bulwark codes it
//! instead (any `f+1` of the `3f+1` fragments rebuild it, as M-PoWerStore's values are), so a
//! replica must be able to check its own fragment without seeing the rest. The id is therefore
//! the hash of the object's [`Manifest`] (its length, its layout and the hash of every fragment),
//! and the manifest travels with each fragment: a replica accepts a fragment only if the
//! manifest hashes to the id and the fragment to its own entry in it.
//!
//! A reader decodes from `f+1` fragments that pass the same checks, then encodes the value again
//! and returns it only if every fragment hash comes out as the manifest says. A faulty writer
//! that stored fragments of different values under one id thus gets the same answer from every
//! reader ("inconsistent"), and no two readers can be given different values for one id. The
//! layout is fixed by the length, `n` and `f`, so an id is a function of the content: writing the
//! same bytes again gives the same id, and the second write only collects acknowledgements.
//!
//! What the paper's figures leave out and this module adds (spec §4.2, §4.3 [R]): the epoch and
//! group on every request, checked by the replica; acknowledgements that sign the id together
//! with the epoch, the group and the replica's slot, so none can be replayed for another epoch or
//! counted for another replica; "not found" only after `2f+1` denials (after a completed write at
//! most `f` correct replicas that missed it and `f` faulty ones can deny).

pub mod epochs;
#[cfg(test)]
mod tests;

use crate::machine::{Access, OpError, Operation, Output, Progress, Replica, ReplicaStats};
use crate::round::{Evidence, EvidenceKind, OpId, Refusals, RegisterMutations, Replies};
use crate::transfer::{Rebase, Turned, node_slot};
use bulwark_core::erasure::{self, ErasureCodec, Layout};
use bulwark_core::membership::{Chain, GroupView};
use bulwark_core::sign::{Context, PublicKey, SecretKey, Signable, Signed, Unverified};
use bulwark_core::wire;
use bulwark_core::{ClientId, Digest, Epoch, GroupId, NodeId, ServiceId, Slot, Time};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The largest object: the same bound as a register's value.
pub const CONTENT_BYTES_MAX: usize = bulwark_core::OBJECT_BYTES_MAX;

/// Hash domains.
const DOMAIN_ID: &str = "bulwark/content/id/v1";
const DOMAIN_FRAGMENT: &str = "bulwark/content/fragment/v1";

/// The id of a content-hash object: the hash of its [`Manifest`], so it commits to every byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContentId(pub Digest);

impl ContentId {
    /// The id of the object `manifest` describes.
    pub fn of(manifest: &Manifest) -> ContentId {
        ContentId(Digest::of(DOMAIN_ID, &wire::encode(manifest)))
    }

    /// The id as lowercase hex, as the CLI prints it.
    pub fn to_hex(&self) -> String {
        self.0.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Option<ContentId> {
        let text = text.trim();
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(ContentId(Digest(bytes)))
    }

    /// The bytes the object is placed by.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0.0
    }
}

impl fmt::Debug for ContentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentId({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for ContentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// What an object's id commits to: how it was cut and the hash of every fragment, by slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The layout (the value's length and its scheme).
    pub layout: Layout,
    /// `H(fragment_i)` for every slot `i` of the group.
    pub fragments: Vec<Digest>,
}

impl Manifest {
    /// The manifest of a value cut into `fragments`.
    pub fn of(layout: Layout, fragments: &[Bytes]) -> Manifest {
        Manifest {
            layout,
            fragments: fragments.iter().map(|f| fragment_digest(f)).collect(),
        }
    }

    /// Whether this is the one manifest a correct writer makes for a value of its length on a
    /// group of `n` tolerating `f`: the layout [`Layout::for_value`] gives, one hash per slot.
    pub fn is_canonical(&self, n: usize, f: usize) -> bool {
        let len = self.layout.len;
        len <= CONTENT_BYTES_MAX as u64
            && self.layout == Layout::for_value(len as usize, n, f)
            && self.layout.is_valid(CONTENT_BYTES_MAX)
            && self.fragments.len() == n
    }

    /// Whether `fragment` is slot `slot`'s.
    pub fn holds(&self, slot: Slot, fragment: &[u8]) -> bool {
        fragment.len() == self.layout.fragment_len()
            && self
                .fragments
                .get(slot.index())
                .is_some_and(|digest| *digest == fragment_digest(fragment))
    }
}

/// The hash of one fragment.
pub fn fragment_digest(fragment: &[u8]) -> Digest {
    Digest::of(DOMAIN_FRAGMENT, fragment)
}

/// A replica's signed statement that its fragment of `id` is durable (STORE_CH_ACK).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The object.
    pub id: ContentId,
    /// The epoch it was stored in.
    pub epoch: Epoch,
    /// The group.
    pub group: GroupId,
    /// The replica's slot in the group.
    pub slot: Slot,
}

impl Signable for Stored {
    const CONTEXT: Context = Context::new("bulwark/content/stored/v1");
    const BYTES_MAX: usize = 128;
}

/// A client-to-replica message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The operation.
    pub op: OpId,
    /// The configuration the client believes in.
    pub epoch: Epoch,
    /// The group addressed.
    pub group: GroupId,
    /// The object.
    pub id: ContentId,
    /// What to do.
    pub body: RequestBody,
}

/// STORE_CH and FETCH_CH.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RequestBody {
    /// Stores this replica's fragment.
    Store {
        /// The object's manifest.
        manifest: Manifest,
        /// The addressed replica's fragment.
        #[serde(with = "bulwark_core::wire::shared_bytes")]
        fragment: Bytes,
    },
    /// Asks for this replica's fragment.
    Fetch,
    /// Forgets the object: a writer that owns it (the gateway, whose chunks are objects of one
    /// body write each) no longer needs it. Idempotent.
    Delete,
}

/// A replica-to-client message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Echoes the request's operation.
    pub op: OpId,
    /// The epoch the replica answered in: a client counts only answers of its own epoch.
    pub epoch: Epoch,
    /// The answer.
    pub body: ResponseBody,
}

/// Answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ResponseBody {
    /// The fragment is durable here (signed [`Stored`]).
    Stored(Unverified<Stored>),
    /// This replica's fragment, with the manifest it was stored under.
    Fragment {
        /// The manifest.
        manifest: Manifest,
        /// The fragment.
        #[serde(with = "bulwark_core::wire::shared_bytes")]
        fragment: Bytes,
    },
    /// This replica holds no intact fragment of the object.
    Missing,
    /// The replica holds nothing of the object any more, durably.
    Deleted,
    /// The replica will not serve the request.
    Refused(Refusal),
}

/// Why a replica refused a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The client may not write.
    #[error("not a writer")]
    NotWriter,
    /// The client may not read.
    #[error("not a reader")]
    NotReader,
    /// Another epoch than the replica's, which it names so that a client behind can catch up.
    #[error("wrong epoch: the replica is in epoch {}", current.0)]
    WrongEpoch {
        /// The replica's epoch.
        current: Epoch,
    },
    /// The replica is still taking the object's arc over from its previous group.
    #[error("the object is still being transferred")]
    Transferring,
    /// A group this replica does not serve.
    #[error("wrong replica group")]
    WrongGroup,
    /// The manifest is not one a correct writer makes, or does not hash to the id.
    #[error("the manifest does not match the id")]
    BadManifest,
    /// The fragment does not hash to this replica's entry of the manifest.
    #[error("the fragment does not match the manifest")]
    BadFragment,
}

/// What a replica keeps of one object: its fragment and the manifest it was accepted under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// The manifest.
    pub manifest: Manifest,
    /// This replica's fragment.
    #[serde(with = "bulwark_core::wire::shared_bytes")]
    pub fragment: Bytes,
}

/// A change to a replica's durable state.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Stores this replica's fragment of `id`.
    Put {
        /// The object.
        id: ContentId,
        /// What to keep.
        held: Held,
    },
    /// Forgets `id`.
    Delete {
        /// The object.
        id: ContentId,
    },
}

/// What a replica reads back from its driver's storage: what it stored of an object (durable
/// or not yet). The replica checks it again before serving it.
pub trait Fragments {
    /// What is stored of `id`, if anything.
    fn fragment(&self, id: &ContentId) -> Option<Held>;
}

/// One replica's place: its slot and group, the group's size and fault bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// This replica's slot, or the client's group for client machines.
    pub slot: Slot,
    /// Members of the group (`3f+1`).
    pub n: usize,
    /// Faults tolerated.
    pub f: usize,
    /// The epoch.
    pub epoch: Epoch,
    /// The group.
    pub group: GroupId,
}

impl Place {
    /// Acknowledgements a write needs, and denials that make "not found".
    pub fn quorum(&self) -> usize {
        2 * self.f + 1
    }
}

/// A content-hash replica. It keeps no per-object state in memory: every object is on disk.
pub struct Server {
    place: Place,
    secret: SecretKey,
    stats: ReplicaStats,
}

impl Server {
    /// A replica at `place` that signs its acknowledgements with `secret`, holding `objects`
    /// fragments of `bytes` bytes from before a restart.
    pub fn new(place: Place, secret: SecretKey, objects: u64, bytes: u64) -> Server {
        assert!(place.slot.index() < place.n, "the slot is in the group");
        assert!(place.n > 3 * place.f, "a group of n = 3f+1 at least");
        Server {
            place,
            secret,
            stats: ReplicaStats {
                objects,
                keys: objects,
                versions: objects,
                bytes,
                ..ReplicaStats::default()
            },
        }
    }

    fn serve(
        &mut self,
        access: Access,
        request: Request,
        view: &(dyn Fragments + '_),
    ) -> Result<(Vec<Change>, ResponseBody), Refusal> {
        if request.epoch != self.place.epoch {
            return Err(Refusal::WrongEpoch {
                current: self.place.epoch,
            });
        }
        if request.group != self.place.group {
            return Err(Refusal::WrongGroup);
        }
        let id = request.id;
        let held = view.fragment(&id);
        let had = held.is_some();
        let served = serve_at(&self.place, &self.secret, access, request, held, false)?;
        self.stats.damaged += u64::from(served.damaged);
        let changes = match served.store {
            Some(held) => {
                self.stats.objects += 1;
                self.stats.keys += 1;
                self.stats.versions += 1;
                self.stats.bytes += held.fragment.len() as u64;
                vec![Change::Put { id, held }]
            }
            None if served.forget => {
                if had {
                    self.stats.objects = self.stats.objects.saturating_sub(1);
                    self.stats.keys = self.stats.keys.saturating_sub(1);
                    self.stats.versions = self.stats.versions.saturating_sub(1);
                }
                vec![Change::Delete { id }]
            }
            None => Vec::new(),
        };
        Ok((changes, served.body))
    }
}

/// What a replica makes of one request for an object, at its place: what to store, the answer,
/// and whether what it held was damaged.
pub(crate) struct ServedAt {
    /// The fragment to make durable before the answer leaves.
    pub store: Option<Held>,
    /// The answer.
    pub body: ResponseBody,
    /// What the replica held of the object was not what it accepted (damage on disk).
    pub damaged: bool,
    /// The object is to be forgotten before the answer leaves.
    pub forget: bool,
}

/// Serves `request` (of the replica's epoch and group, already checked) at `place`, holding
/// `held` of the object: a STORE is checked against the id and the replica's slot and
/// acknowledged with a signature once durable; a FETCH is answered with the fragment held if it
/// still checks. `checked`: the caller found `held` intact against the id and the slot already.
pub(crate) fn serve_at(
    place: &Place,
    secret: &SecretKey,
    access: Access,
    request: Request,
    held: Option<Held>,
    checked: bool,
) -> Result<ServedAt, Refusal> {
    let id = request.id;
    let intact = |held: &Held| {
        checked
            || (ContentId::of(&held.manifest) == id
                && held.manifest.holds(place.slot, &held.fragment))
    };
    match request.body {
        RequestBody::Store { manifest, fragment } => {
            if !access.write {
                return Err(Refusal::NotWriter);
            }
            if !manifest.is_canonical(place.n, place.f) || ContentId::of(&manifest) != id {
                return Err(Refusal::BadManifest);
            }
            if !manifest.holds(place.slot, &fragment) {
                return Err(Refusal::BadFragment);
            }
            // Written before (the same bytes name the same object): acknowledged again.
            let store = (!held.as_ref().is_some_and(intact)).then_some(Held { manifest, fragment });
            let ack = Stored {
                id,
                epoch: place.epoch,
                group: place.group,
                slot: place.slot,
            };
            // Signing cannot fail for a value this small; a replica that cannot sign says
            // nothing rather than something unverifiable.
            let body = match Signed::sign(secret, ack) {
                Ok(signed) => ResponseBody::Stored(signed.to_unverified()),
                Err(_) => ResponseBody::Missing,
            };
            Ok(ServedAt {
                store,
                body,
                damaged: false,
                forget: false,
            })
        }
        RequestBody::Delete => {
            if !access.write {
                return Err(Refusal::NotWriter);
            }
            Ok(ServedAt {
                store: None,
                body: ResponseBody::Deleted,
                damaged: false,
                forget: true,
            })
        }
        RequestBody::Fetch => {
            if !access.read {
                return Err(Refusal::NotReader);
            }
            let (body, damaged) = match held {
                Some(held) if intact(&held) => (
                    ResponseBody::Fragment {
                        manifest: held.manifest,
                        fragment: held.fragment,
                    },
                    false,
                ),
                // The disk gave back something this replica never accepted.
                Some(_) => (ResponseBody::Missing, true),
                None => (ResponseBody::Missing, false),
            };
            Ok(ServedAt {
                store: None,
                body,
                damaged,
                forget: false,
            })
        }
    }
}

impl Replica for Server {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    type Request = Request;
    type Reply = Response;
    type Message = crate::machine::Never;
    type Change = Change;
    type View = dyn Fragments;

    fn on_request(
        &mut self,
        _now: Time,
        _client: ClientId,
        access: Access,
        request: Request,
        view: &(dyn Fragments + 'static),
    ) -> Output<Self> {
        let op = request.op;
        match self.serve(access, request, view) {
            Ok((changes, body)) => Output::reply(
                changes,
                Response {
                    op,
                    epoch: self.place.epoch,
                    body,
                },
            ),
            Err(refusal) => Output {
                refused: Some(refusal.to_string()),
                ..Output::reply(
                    Vec::new(),
                    Response {
                        op,
                        epoch: self.place.epoch,
                        body: ResponseBody::Refused(refusal),
                    },
                )
            },
        }
    }

    fn stats(&self) -> ReplicaStats {
        self.stats.clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Client side

/// A completed write: the id and the signed acknowledgements that prove it.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// The object's id.
    pub id: ContentId,
    /// `2f+1` verified acknowledgements, by slot.
    pub acks: Vec<(Slot, Signed<Stored>)>,
    /// Misbehaviour seen along the way.
    pub evidence: Vec<Evidence>,
}

/// CH_Write: every replica gets its fragment; done at `2f+1` valid signed acknowledgements.
pub struct WriteOp {
    place: Place,
    /// The group's signing keys, by slot (`None` for a member whose key the client does not
    /// know: its acknowledgements never count).
    keys: Vec<Option<PublicKey>>,
    op: OpId,
    id: ContentId,
    manifest: Manifest,
    fragments: Vec<Bytes>,
    acks: Replies<Signed<Stored>>,
    refusals: Refusals<Refusal>,
    evidence: Vec<Evidence>,
    /// Acknowledgements that finish the write: `2f+1`.
    quorum: usize,
    /// Once the write follows the configuration: the node in each slot of the group it runs
    /// in now, so that what it blames is named by node whatever epoch it was seen in.
    members: Vec<NodeId>,
}

/// A value cut into fragments, with its manifest and id: what a write sends. Its id does not
/// depend on the group, only on its size `n = 3f+1`, so a client computes the id first and then
/// finds the group.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// The object's id.
    pub id: ContentId,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its fragments, by slot.
    pub fragments: Vec<Bytes>,
}

impl Encoded {
    /// Cuts `value` for a group of `n` tolerating `f`.
    pub fn new(
        codec: &dyn ErasureCodec,
        n: usize,
        f: usize,
        value: &[u8],
    ) -> Result<Encoded, String> {
        if value.len() > CONTENT_BYTES_MAX {
            return Err(format!(
                "an object of {} bytes exceeds the limit of {CONTENT_BYTES_MAX}",
                value.len()
            ));
        }
        let layout = Layout::for_value(value.len(), n, f);
        let fragments = codec.encode(&layout, value).map_err(|e| e.to_string())?;
        let manifest = Manifest::of(layout, &fragments);
        debug_assert!(manifest.is_canonical(n, f));
        Ok(Encoded {
            id: ContentId::of(&manifest),
            manifest,
            fragments,
        })
    }
}

impl WriteOp {
    /// A write of `encoded` to the group at `place` (whose `slot` is ignored), checking
    /// acknowledgements against the group's `keys`, by slot.
    pub fn new(
        place: Place,
        keys: Arc<[PublicKey]>,
        op: OpId,
        encoded: Encoded,
    ) -> Result<WriteOp, String> {
        if keys.len() != place.n || encoded.fragments.len() != place.n {
            return Err(format!(
                "{} keys and {} fragments for a group of {}",
                keys.len(),
                encoded.fragments.len(),
                place.n
            ));
        }
        Ok(WriteOp {
            place,
            keys: keys.iter().cloned().map(Some).collect(),
            op,
            id: encoded.id,
            manifest: encoded.manifest,
            fragments: encoded.fragments,
            acks: Replies::new(place.n),
            refusals: Refusals::new(place.n),
            evidence: Vec::new(),
            quorum: place.quorum(),
            members: Vec::new(),
        })
    }

    /// Deliberate breakage for the simulator's negative controls; never in a real client.
    pub fn with_mutations(mut self, mutations: RegisterMutations) -> WriteOp {
        self.quorum = mutations.quorum(self.place.quorum());
        self
    }

    /// The id the object will have.
    pub fn id(&self) -> ContentId {
        self.id
    }

    fn store(&self, slot: Slot) -> (Slot, Request) {
        let request = Request {
            op: self.op,
            epoch: self.place.epoch,
            group: self.place.group,
            id: self.id,
            body: RequestBody::Store {
                manifest: self.manifest.clone(),
                fragment: self.fragments[slot.index()].clone(),
            },
        };
        (slot, request)
    }

    /// Checks a signed acknowledgement from `from`.
    fn verify(&self, from: Slot, ack: Unverified<Stored>) -> Option<Signed<Stored>> {
        let key = self.keys.get(from.index())?.as_ref()?;
        let signed = ack.verify(key).ok()?;
        let expected = Stored {
            id: self.id,
            epoch: self.place.epoch,
            group: self.place.group,
            slot: from,
        };
        (*signed.value() == expected).then_some(signed)
    }
}

impl Operation for WriteOp {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    type Request = Request;
    type Reply = Response;
    type Output = WriteOutcome;

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        (0..self.place.n)
            .map(|i| self.store(Slot(i as u32)))
            .collect()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        // An answer of another epoch is for a round this write left (or not yet joined): its
        // slot is a position in another group.
        if reply.op != self.op || from.index() >= self.place.n || reply.epoch != self.place.epoch {
            return Progress::Send(Vec::new());
        }
        match reply.body {
            ResponseBody::Stored(ack) => match self.verify(from, ack) {
                Some(signed) => {
                    self.acks.record(from, signed);
                }
                None => self.evidence.push(Evidence {
                    node: named(&self.members, from),
                    kind: EvidenceKind::MalformedReply,
                }),
            },
            ResponseBody::Refused(refusal) => {
                if let Some((reason, by)) = self.refusals.record(from, refusal, self.place.f) {
                    return Progress::Done(Err(OpError::Refused {
                        reason: reason.to_string(),
                        by,
                    }));
                }
            }
            // A correct replica answers a STORE with an acknowledgement or a refusal.
            ResponseBody::Fragment { .. } | ResponseBody::Missing | ResponseBody::Deleted => {}
        }
        if self.acks.count() >= self.quorum {
            let acks = self
                .acks
                .present()
                .map(|(slot, ack)| (slot, ack.clone()))
                .collect();
            return Progress::Done(Ok(WriteOutcome {
                id: self.id,
                acks,
                evidence: std::mem::take(&mut self.evidence),
            }));
        }
        Progress::Send(Vec::new())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let missing: Vec<Slot> = self.acks.missing().collect();
        missing.into_iter().map(|slot| self.store(slot)).collect()
    }

    fn answered(&self) -> Vec<Slot> {
        self.acks.nodes()
    }

    fn quorum(&self) -> usize {
        self.quorum
    }
}

/// The object `manifest` describes, rebuilt from `pieces` (fragments by index, each already
/// checked against the manifest, at least as many as the layout needs), with every one of its
/// fragments; `Err` when the manifest names no codeword, the work of a faulty writer. Every
/// reader and every new member gets the same answer from any `f+1` fragments: they rebuild the
/// one codeword the manifest names (its first fragments hold the value), or none.
pub(crate) fn rebuild(
    codec: &dyn ErasureCodec,
    manifest: &Manifest,
    pieces: &[(usize, Bytes)],
) -> Result<(Bytes, Vec<Bytes>), ()> {
    let layout = &manifest.layout;
    let originals = codec.originals(layout, pieces).map_err(|_| ())?;
    let recovery = codec.recovery(layout, &originals).map_err(|_| ())?;
    let fragments: Vec<Bytes> = originals.iter().cloned().chain(recovery).collect();
    // The fragments rebuilt must be the manifest's codeword, so that any `f+1` of its fragments
    // give every reader this value. A fragment received was checked against the manifest
    // already, so comparing bytes is enough there (nothing, when it is the very fragment given);
    // the rest are hashed.
    let consistent = fragments.len() == manifest.fragments.len()
        && fragments.iter().enumerate().all(|(i, fragment)| {
            match pieces.iter().find(|(index, _)| *index == i) {
                Some((_, received)) => {
                    (received.as_ptr() == fragment.as_ptr() && received.len() == fragment.len())
                        || received == fragment
                }
                None => fragment_digest(fragment) == manifest.fragments[i],
            }
        });
    if !consistent {
        return Err(());
    }
    Ok((erasure::join(layout, originals), fragments))
}

/// A completed read.
#[derive(Clone, Debug)]
pub struct ReadOutcome {
    /// The object; `None` after `2f+1` replicas said they hold none of it.
    pub value: Option<Bytes>,
    /// The replicas whose fragments (or denials) decided it.
    pub answered_by: Vec<Slot>,
    /// Misbehaviour seen along the way.
    pub evidence: Vec<Evidence>,
}

/// CH_Read: asks the first `n - f` replicas for their fragment (the data fragments' among them,
/// so a read of a correct writer's object decodes nothing), rebuilds from the first `f+1` that
/// check against the id, and verifies the value by encoding it again. The other `f` are asked as
/// soon as one of the first answers anything but a fragment that checks, or stays silent until
/// the retransmission: when every replica asked is correct and holds its fragment, `n - f`
/// answers bring `f+1` fragments, and otherwise every replica is asked, as the paper's read does.
pub struct ReadOp {
    place: Place,
    /// Slots `0..asked` have been asked for their fragment.
    asked: usize,
    codec: Arc<dyn ErasureCodec>,
    op: OpId,
    id: ContentId,
    /// Fragments that check against the id, with the manifest they came with (all manifests that
    /// hash to the id are the same).
    fragments: Replies<(Manifest, Bytes)>,
    denials: Replies<()>,
    refusals: Refusals<Refusal>,
    evidence: Vec<Evidence>,
    /// Denials that make "not found": `2f+1`.
    quorum: usize,
    /// As [`WriteOp`]'s.
    members: Vec<NodeId>,
}

impl ReadOp {
    /// A read of `id` from the group at `place`.
    pub fn new(place: Place, codec: Arc<dyn ErasureCodec>, op: OpId, id: ContentId) -> ReadOp {
        ReadOp {
            place,
            asked: 0,
            codec,
            op,
            id,
            fragments: Replies::new(place.n),
            denials: Replies::new(place.n),
            refusals: Refusals::new(place.n),
            evidence: Vec::new(),
            quorum: place.quorum(),
            members: Vec::new(),
        }
    }

    /// Deliberate breakage for the simulator's negative controls; never in a real client.
    pub fn with_mutations(mut self, mutations: RegisterMutations) -> ReadOp {
        self.quorum = mutations.quorum(self.place.quorum());
        self
    }

    fn fetch(&self, slot: Slot) -> (Slot, Request) {
        let request = Request {
            op: self.op,
            epoch: self.place.epoch,
            group: self.place.group,
            id: self.id,
            body: RequestBody::Fetch,
        };
        (slot, request)
    }

    fn blame(&mut self, from: Slot, kind: EvidenceKind) {
        let node = named(&self.members, from);
        self.evidence.push(Evidence { node, kind });
    }

    /// Asks the replicas not asked yet.
    fn widen(&mut self) -> Vec<(Slot, Request)> {
        let from = std::mem::replace(&mut self.asked, self.place.n);
        (from..self.place.n)
            .map(|i| self.fetch(Slot(i as u32)))
            .collect()
    }

    /// Rebuilds the value once enough fragments check, and verifies it.
    fn rebuild(&mut self) -> Option<Result<ReadOutcome, OpError>> {
        let (manifest, _) = self.fragments.present().next()?.1.clone();
        if self.fragments.count() < manifest.layout.needed() {
            return None;
        }
        let pieces: Vec<(usize, Bytes)> = self
            .fragments
            .present()
            .map(|(slot, (_, fragment))| (slot.index(), fragment.clone()))
            .collect();
        let Ok((value, _)) = rebuild(&*self.codec, &manifest, &pieces) else {
            return Some(Err(OpError::Failed(format!(
                "object {} is inconsistent: its writer stored fragments of different values",
                self.id
            ))));
        };
        Some(Ok(ReadOutcome {
            value: Some(value),
            answered_by: self.fragments.nodes(),
            evidence: std::mem::take(&mut self.evidence),
        }))
    }
}

impl Operation for ReadOp {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    type Request = Request;
    type Reply = Response;
    type Output = ReadOutcome;

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        self.asked = self.place.n - self.place.f;
        (0..self.asked)
            .map(|i| self.fetch(Slot(i as u32)))
            .collect()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.op || from.index() >= self.place.n || reply.epoch != self.place.epoch {
            return Progress::Send(Vec::new());
        }
        match reply.body {
            ResponseBody::Fragment { manifest, fragment } => {
                if !manifest.is_canonical(self.place.n, self.place.f)
                    || ContentId::of(&manifest) != self.id
                {
                    self.blame(from, EvidenceKind::MalformedReply);
                } else if !manifest.holds(from, &fragment) {
                    self.blame(from, EvidenceKind::CorruptFragment);
                } else {
                    if self.fragments.record(from, (manifest, fragment))
                        && let Some(done) = self.rebuild()
                    {
                        return Progress::Done(done);
                    }
                    return Progress::Send(Vec::new());
                }
            }
            ResponseBody::Missing => {
                self.denials.record(from, ());
                if self.denials.count() >= self.quorum {
                    return Progress::Done(Ok(ReadOutcome {
                        value: None,
                        answered_by: self.denials.nodes(),
                        evidence: std::mem::take(&mut self.evidence),
                    }));
                }
            }
            ResponseBody::Refused(refusal) => {
                if let Some((reason, by)) = self.refusals.record(from, refusal, self.place.f) {
                    return Progress::Done(Err(OpError::Refused {
                        reason: reason.to_string(),
                        by,
                    }));
                }
            }
            ResponseBody::Stored(_) | ResponseBody::Deleted => {
                self.blame(from, EvidenceKind::MalformedReply);
            }
        }
        // Anything but a fragment that checks: the first `n - f` may not bring `f+1`.
        Progress::Send(self.widen())
    }

    /// Every replica that has not given a fragment is asked again, those that denied too (one
    /// that denied while the object's write was still on its way may hold it now), and those
    /// not asked yet. (A denial is counted once; it stays counted, which is safe: a replica that
    /// held a fragment of a write completed before this read began never denies.)
    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        self.asked = self.place.n;
        let missing: Vec<Slot> = self.fragments.missing().collect();
        missing.into_iter().map(|slot| self.fetch(slot)).collect()
    }

    fn answered(&self) -> Vec<Slot> {
        let mut answered = self.fragments.nodes();
        answered.extend(self.denials.nodes());
        answered.sort();
        answered
    }

    fn quorum(&self) -> usize {
        self.quorum
    }
}

/// A completed delete.
#[derive(Clone, Debug)]
pub struct DeleteOutcome {
    /// The replicas that said they hold nothing of the object any more.
    pub answered_by: Vec<Slot>,
}

/// CH_Delete: every replica forgets its fragment; done once `2f+1` said they did. A delete is a
/// writer's statement that it no longer needs an object only it refers to (the gateway names
/// each chunk by its body write, so no two objects share one): what a replica that missed it
/// still holds is never read again, and is only space.
pub struct DeleteOp {
    place: Place,
    op: OpId,
    id: ContentId,
    done: Replies<()>,
    refusals: Refusals<Refusal>,
    quorum: usize,
}

impl DeleteOp {
    /// A delete of `id` from the group at `place` (whose `slot` is ignored).
    pub fn new(place: Place, op: OpId, id: ContentId) -> DeleteOp {
        DeleteOp {
            place,
            op,
            id,
            done: Replies::new(place.n),
            refusals: Refusals::new(place.n),
            quorum: place.quorum(),
        }
    }

    fn delete(&self, slot: Slot) -> (Slot, Request) {
        let request = Request {
            op: self.op,
            epoch: self.place.epoch,
            group: self.place.group,
            id: self.id,
            body: RequestBody::Delete,
        };
        (slot, request)
    }
}

impl Operation for DeleteOp {
    const SERVICE: ServiceId = ServiceId::CONTENT;
    type Request = Request;
    type Reply = Response;
    type Output = DeleteOutcome;

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        (0..self.place.n)
            .map(|i| self.delete(Slot(i as u32)))
            .collect()
    }

    fn on_reply(&mut self, from: Slot, reply: Response) -> Progress<Self> {
        if reply.op != self.op || from.index() >= self.place.n || reply.epoch != self.place.epoch {
            return Progress::Send(Vec::new());
        }
        match reply.body {
            ResponseBody::Deleted => {
                self.done.record(from, ());
            }
            ResponseBody::Refused(refusal) => {
                if let Some((reason, by)) = self.refusals.record(from, refusal, self.place.f) {
                    return Progress::Done(Err(OpError::Refused {
                        reason: reason.to_string(),
                        by,
                    }));
                }
            }
            ResponseBody::Stored(_) | ResponseBody::Fragment { .. } | ResponseBody::Missing => {}
        }
        if self.done.count() >= self.quorum {
            return Progress::Done(Ok(DeleteOutcome {
                answered_by: self.done.nodes(),
            }));
        }
        Progress::Send(Vec::new())
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        let missing: Vec<Slot> = self.done.missing().collect();
        missing.into_iter().map(|slot| self.delete(slot)).collect()
    }

    fn answered(&self) -> Vec<Slot> {
        self.done.nodes()
    }

    fn quorum(&self) -> usize {
        self.quorum
    }
}

// ---------------------------------------------------------------------------------------------
// Across epochs

/// Whom an operation blames for what came from `slot`: the node in it (`Slot(id)`) once the
/// operation follows the configuration, the slot itself before.
fn named(members: &[NodeId], slot: Slot) -> Slot {
    members.get(slot.index()).map_or(slot, |node| Slot(node.0))
}

/// Which refusals a reply carries that are not answers.
fn turned(reply: &Response) -> Option<Turned> {
    match &reply.body {
        ResponseBody::Refused(Refusal::WrongEpoch { current }) => {
            Some(Turned::WrongEpoch { current: *current })
        }
        ResponseBody::Refused(Refusal::Transferring) => Some(Turned::Transferring),
        _ => None,
    }
}

impl Rebase for WriteOp {
    fn turned(reply: &Response) -> Option<Turned> {
        turned(reply)
    }

    /// Acknowledgements by node; evidence is named when it is seen.
    fn named(mut output: WriteOutcome, view: &GroupView) -> WriteOutcome {
        for (slot, _) in &mut output.acks {
            *slot = node_slot(view, *slot);
        }
        output
    }

    /// Stores every fragment again in the object's group of `epoch`, each with the member in its
    /// slot, and counts only acknowledgements signed there: a write completes with `2f+1`
    /// members of one epoch's group.
    fn rebase(&mut self, epoch: Epoch, view: &GroupView, chain: &Chain) -> Progress<Self> {
        self.place.epoch = epoch;
        self.place.group = view.id();
        self.members = view.members().to_vec();
        self.keys = view
            .members()
            .iter()
            .map(|node| chain.signing_key(*node).cloned())
            .collect();
        self.acks = Replies::new(self.place.n);
        self.refusals = Refusals::new(self.place.n);
        Progress::Send(self.start())
    }

    fn epoch(&self) -> Epoch {
        self.place.epoch
    }
}

impl Rebase for ReadOp {
    fn turned(reply: &Response) -> Option<Turned> {
        turned(reply)
    }

    fn named(mut output: ReadOutcome, view: &GroupView) -> ReadOutcome {
        for slot in &mut output.answered_by {
            *slot = node_slot(view, *slot);
        }
        output
    }

    /// Asks the object's group of `epoch` from the start: fragments are checked against the
    /// slot they come from, which is a position in one epoch's group.
    fn rebase(&mut self, epoch: Epoch, view: &GroupView, _chain: &Chain) -> Progress<Self> {
        self.place.epoch = epoch;
        self.place.group = view.id();
        self.members = view.members().to_vec();
        self.fragments = Replies::new(self.place.n);
        self.denials = Replies::new(self.place.n);
        self.refusals = Refusals::new(self.place.n);
        Progress::Send(self.start())
    }

    fn epoch(&self) -> Epoch {
        self.place.epoch
    }
}

impl Rebase for DeleteOp {
    fn turned(reply: &Response) -> Option<Turned> {
        turned(reply)
    }

    fn named(mut output: DeleteOutcome, view: &GroupView) -> DeleteOutcome {
        for slot in &mut output.answered_by {
            *slot = node_slot(view, *slot);
        }
        output
    }

    /// Asks the object's group of `epoch` from the start.
    fn rebase(&mut self, epoch: Epoch, view: &GroupView, _chain: &Chain) -> Progress<Self> {
        self.place.epoch = epoch;
        self.place.group = view.id();
        self.done = Replies::new(self.place.n);
        self.refusals = Refusals::new(self.place.n);
        Progress::Send(self.start())
    }

    fn epoch(&self) -> Epoch {
        self.place.epoch
    }
}
