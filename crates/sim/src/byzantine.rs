//! The catalogue of Byzantine M-PoWerStore servers (spec §5.2, §7.2 "Byzantine servers"), in
//! [`phalanx`] the same behaviours for the Phalanx baseline, and in [`reader`] Byzantine readers.
//!
//! Every Byzantine server wraps a real, honest [`Server`] and implements [`ServerLogic`], so it can
//! behave honestly for a while and lie later, and so that the same wrapper runs inside the
//! simulator and inside a real node process (`bulwark-byzantine`, through [`wrap`]). Nothing here
//! knows about the scheduler: a behaviour sees only the requests it is handed, the time it is told
//! and its own seeded RNG, so a run stays reproducible from its seed.
//!
//! The behaviours stay within what the spec says a Byzantine server can do: it may lie in any
//! reply, but it holds only its own MAC key `k_i`, never `k_W` or another server's key, and it
//! cannot forge a nonce it has not been shown. A simulator that places at most `f` of them must see
//! no violation; placing `f+1` (a negative control) must be caught.
//!
//! What this module deliberately does not do: lie about its identity (the channel authenticates
//! nodes) or talk to other servers (the protocol has no server-to-server messages). Colluding
//! servers share a story only through a common seed, which is enough to vouch for the same forged
//! candidate, because the forgery is a deterministic function of that seed and the key.

pub mod cs;
pub mod cs_ea;
pub mod phalanx;
pub mod reader;

use bulwark_core::erasure::{ErasureCodec, Layout, ReedSolomonSimd};
use bulwark_core::{ClientId, Digest, Key, Tag, Time};
use bulwark_protocol::powerstore::{
    Access, Candidate, Change, CrossChecksum, FilterAck, Fragments, Handled, LcEntry, MacVec,
    Nonce, Pid, Refusal, Request, RequestBody, Response, ResponseBody, Server, ServerConfig,
    ServerKeys, ServerLogic, ServerStats, Timestamp, fragment_digest,
};
use bytes::Bytes;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// How a server behaves. `Honest` is the real server; every other variant is one Byzantine
/// behaviour from the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Behaviour {
    /// The real server, unwrapped.
    Honest,
    /// Answers nothing (possibly after an honest start): the crash-like fault.
    Silent,
    /// Honest to some clients, the initial or an old state to others (spec §7.2 "equivocation
    /// between readers").
    Equivocating,
    /// Stops applying writes at some point, acks them anyway, and serves reads from the frozen
    /// state (a stale `lc`, spec §5.2; a fresh server when frozen from the start).
    Stale,
    /// Honest for a while, then forgets everything and reverts to the initial state while still
    /// acknowledging writes (`T2` in the lower-bound proof, spec §5.3).
    Amnesiac,
    /// Flips bytes in fragments, cross-checksums, `N̄`, MAC vectors and tags; plants corrupted MAC
    /// vectors ("BigMac") in COLLECT replies.
    Corrupting,
    /// Invents high-timestamp candidates, twins of genuine candidates with garbage nonces,
    /// self-consistent FILTER entries of another value, and CLOCK timestamps with bad tags.
    Forging,
    /// Like `Forging`, but every server built with the same seed tells the same story: the same
    /// forged candidate and value, and the same strategy for the same read.
    Colluding,
    /// Configuration service only: as PBFT primary, sends different batches for one sequence
    /// number to different backups ([`cs`]).
    EquivocatingPrimary,
    /// Configuration service only: VIEW-CHANGEs (and, as the new primary, NEW-VIEWs) whose
    /// prepared certificates carry forged or re-targeted prepares ([`cs`]).
    ForgedViewChange,
    /// Configuration service only: as primary, proposes STOP with a clock reading far in the
    /// future; as any replica, submits STOP long before the epoch is due ([`cs`]).
    EarlyStop,
    /// Configuration service only: submits EVICTs with `2f_cs` genuine agreements, or with forged,
    /// duplicated or replayed ones ([`cs`]).
    ForgedEvict,
    /// Configuration service only: otherwise honest, with a clock off by more than the STOP
    /// tolerance, fast or slow ([`cs`]).
    SkewedClock,
}

impl Behaviour {
    /// Every behaviour, the honest one first.
    pub const ALL: [Behaviour; 13] = [
        Behaviour::Honest,
        Behaviour::Silent,
        Behaviour::Equivocating,
        Behaviour::Stale,
        Behaviour::Amnesiac,
        Behaviour::Corrupting,
        Behaviour::Forging,
        Behaviour::Colluding,
        Behaviour::EquivocatingPrimary,
        Behaviour::ForgedViewChange,
        Behaviour::EarlyStop,
        Behaviour::ForgedEvict,
        Behaviour::SkewedClock,
    ];

    /// Every lying behaviour, of every catalogue.
    pub const BYZANTINE: [Behaviour; 12] = [
        Behaviour::Silent,
        Behaviour::Equivocating,
        Behaviour::Stale,
        Behaviour::Amnesiac,
        Behaviour::Corrupting,
        Behaviour::Forging,
        Behaviour::Colluding,
        Behaviour::EquivocatingPrimary,
        Behaviour::ForgedViewChange,
        Behaviour::EarlyStop,
        Behaviour::ForgedEvict,
        Behaviour::SkewedClock,
    ];

    /// The storage servers' catalogue (M-PoWerStore and Phalanx).
    pub const STORAGE: [Behaviour; 7] = [
        Behaviour::Silent,
        Behaviour::Equivocating,
        Behaviour::Stale,
        Behaviour::Amnesiac,
        Behaviour::Corrupting,
        Behaviour::Forging,
        Behaviour::Colluding,
    ];

    /// The configuration service's catalogue (PBFT replicas, [`cs`]).
    pub const CONFIG_SERVICE: [Behaviour; 6] = [
        Behaviour::Silent,
        Behaviour::EquivocatingPrimary,
        Behaviour::ForgedViewChange,
        Behaviour::EarlyStop,
        Behaviour::ForgedEvict,
        Behaviour::SkewedClock,
    ];

    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Behaviour::Honest => "honest",
            Behaviour::Silent => "silent",
            Behaviour::Equivocating => "equivocating",
            Behaviour::Stale => "stale",
            Behaviour::Amnesiac => "amnesiac",
            Behaviour::Corrupting => "corrupting",
            Behaviour::Forging => "forging",
            Behaviour::Colluding => "colluding",
            Behaviour::EquivocatingPrimary => "equivocating-primary",
            Behaviour::ForgedViewChange => "forged-view-change",
            Behaviour::EarlyStop => "early-stop",
            Behaviour::ForgedEvict => "forged-evict",
            Behaviour::SkewedClock => "skewed-clock",
        }
    }

    /// Whether the storage servers' catalogue has this behaviour (`Honest` included).
    pub fn is_storage(self) -> bool {
        self == Behaviour::Honest || Behaviour::STORAGE.contains(&self)
    }

    /// Whether this behaviour counts against `f`.
    pub fn is_byzantine(self) -> bool {
        self != Behaviour::Honest
    }
}

impl fmt::Display for Behaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A behaviour name that is not in the catalogue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown behaviour {0:?}; expected one of honest, silent, equivocating, stale, amnesiac, corrupting, forging, colluding (storage), equivocating-primary, forged-view-change, early-stop, forged-evict, skewed-clock (configuration service)"
)]
pub struct UnknownBehaviour(pub String);

impl FromStr for Behaviour {
    type Err = UnknownBehaviour;

    fn from_str(text: &str) -> Result<Behaviour, UnknownBehaviour> {
        let wanted = text.trim().to_ascii_lowercase();
        Behaviour::ALL
            .into_iter()
            .find(|b| b.name() == wanted)
            .ok_or_else(|| UnknownBehaviour(text.to_string()))
    }
}

/// A server with empty state and `behaviour` wrapped around it.
pub fn make_server(
    behaviour: Behaviour,
    config: ServerConfig,
    keys: ServerKeys,
    seed: u64,
) -> Box<dyn ServerLogic> {
    wrap(behaviour, Server::new(config, keys), seed)
}

/// Wraps an existing (possibly restored) honest server in `behaviour`. Servers wrapped with
/// `Colluding` and the same `seed` tell the same forged story.
///
/// The configuration service's behaviours have no storage counterpart: a storage server given
/// one stays honest (the simulator never places them on storage servers).
pub fn wrap(behaviour: Behaviour, server: Server, seed: u64) -> Box<dyn ServerLogic> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb12a_47c0_5eed_0001);
    match behaviour {
        Behaviour::Honest
        | Behaviour::EquivocatingPrimary
        | Behaviour::ForgedViewChange
        | Behaviour::EarlyStop
        | Behaviour::ForgedEvict
        | Behaviour::SkewedClock => Box::new(server),
        Behaviour::Silent => Box::new(Silent {
            honest_requests: honest_prefix(&mut rng),
            handled: 0,
            inner: server,
        }),
        Behaviour::Equivocating => Box::new(Equivocating {
            honest_parity: rng.random_range(0..2u32),
            old_lc: BTreeMap::new(),
            inner: server,
        }),
        Behaviour::Stale => Box::new(Stale {
            honest_requests: honest_prefix(&mut rng),
            handled: 0,
            inner: server,
        }),
        Behaviour::Amnesiac => Box::new(Amnesiac {
            honest_requests: honest_prefix(&mut rng),
            handled: 0,
            inner: server,
        }),
        Behaviour::Corrupting => Box::new(Corrupting {
            lie_probability: rng.random_range(0.3..1.0),
            rng,
            inner: server,
        }),
        Behaviour::Forging => Box::new(Forging {
            lie_probability: rng.random_range(0.3..1.0),
            rng,
            inner: server,
        }),
        Behaviour::Colluding => Box::new(Colluding {
            story_seed: seed,
            previous_lc: BTreeMap::new(),
            inner: server,
        }),
    }
}

/// How many requests a behaviour serves honestly before it starts lying: often none, otherwise
/// long enough that real writes have landed (so the lie reverts or hides something).
fn honest_prefix(rng: &mut ChaCha8Rng) -> u64 {
    if rng.random_bool(0.4) {
        0
    } else {
        rng.random_range(1..400)
    }
}

/// A reply with no state changes, as Byzantine servers make them up.
fn answer(request: &Request, body: ResponseBody) -> Handled {
    Handled {
        changes: Vec::new(),
        reply: Some(Response {
            op: request.op,
            attempt: request.attempt,
            body,
        }),
        refused: None,
    }
}

/// The reply a correct server would give if it held no state at all (`c_0` everywhere), while
/// acknowledging writes it does not keep.
fn initial_state_reply(request: &Request) -> Handled {
    let body = match &request.body {
        RequestBody::Clock => ResponseBody::ClockAck { lc_ts: None },
        RequestBody::Store { ts, .. } => ResponseBody::StoreAck { ts: *ts },
        RequestBody::Complete { ts, .. } => ResponseBody::CompleteAck { ts: *ts },
        RequestBody::Collect { .. } => ResponseBody::CollectAck {
            lc: None,
            entry: None,
        },
        RequestBody::Filter { .. } => ResponseBody::FilterAck(FilterAck::Initial),
        RequestBody::Repair { .. } => ResponseBody::RepairAck,
        RequestBody::Hold { .. } => ResponseBody::HoldAck { lc_ts: None },
    };
    answer(request, body)
}

fn random_tag(rng: &mut impl RngCore) -> Tag {
    let mut tag = [0u8; 32];
    rng.fill_bytes(&mut tag);
    Tag(tag)
}

fn random_nonce(rng: &mut impl RngCore) -> Nonce {
    let mut nonce = [0u8; 32];
    rng.fill_bytes(&mut nonce);
    Nonce(nonce)
}

fn random_vec(rng: &mut impl RngCore, n: usize) -> MacVec {
    MacVec((0..n).map(|_| random_tag(rng)).collect())
}

/// A timestamp no writer made: its tag is random, so writers ignore it (Alg. 4, l. 100) and no
/// correct server validates a candidate carrying it.
fn forged_timestamp(rng: &mut impl RngCore, above: u64) -> Timestamp {
    let jump = 1 + u64::from(rng.next_u32() % 1_000_000);
    Timestamp {
        num: above.saturating_add(jump),
        pid: Pid {
            writer: ClientId(rng.next_u32()),
            seq: rng.next_u64(),
        },
        tag: random_tag(rng),
    }
}

fn flip_byte(bytes: &mut [u8], rng: &mut impl RngCore) {
    if bytes.is_empty() {
        return;
    }
    let at = (rng.next_u32() as usize) % bytes.len();
    bytes[at] ^= 1 + (rng.next_u32() % 255) as u8;
}

fn flip_tag(tag: &mut Tag, rng: &mut impl RngCore) {
    flip_byte(&mut tag.0, rng);
}

/// Corrupts between one and all slots of a MAC vector ("BigMac", spec §4.1): the candidate stays
/// valid at servers whose slot survived or that hold the version in `Hist`, and at no other.
fn corrupt_vec(vec: &mut MacVec, rng: &mut impl RngCore) {
    if vec.0.is_empty() {
        return;
    }
    let slots = 1 + (rng.next_u32() as usize) % vec.0.len();
    for _ in 0..slots {
        let at = (rng.next_u32() as usize) % vec.0.len();
        flip_tag(&mut vec.0[at], rng);
    }
}

/// A value other than any writer's, cut into fragments with its own self-consistent
/// cross-checksum. One server can vouch for it; only `f+1` agreeing liars could make it `safe`.
struct ForgedValue {
    cc: CrossChecksum,
    fragments: Vec<Bytes>,
}

fn forge_value(rng: &mut impl RngCore, n: usize, f: usize) -> Option<ForgedValue> {
    let len = if rng.next_u32().is_multiple_of(4) {
        4_097 + (rng.next_u32() as usize) % 8_000
    } else {
        1 + (rng.next_u32() as usize) % 300
    };
    let mut value = vec![0u8; len];
    rng.fill_bytes(&mut value);
    // Marked so a reader that returns it is easy to recognise in a trace.
    value[0] = 0xf0;
    let layout = Layout::for_value(len, n, f);
    let fragments = ReedSolomonSimd.encode(&layout, &value).ok()?;
    let cc = CrossChecksum {
        layout,
        tombstone: false,
        hashes: fragments
            .iter()
            .map(|fragment| fragment_digest(fragment))
            .collect(),
    };
    Some(ForgedValue { cc, fragments })
}

/// The highest candidate a FILTER asked about, if any.
fn highest_requested(request: &Request) -> Option<&Candidate> {
    let RequestBody::Filter { candidates } = &request.body else {
        return None;
    };
    candidates.iter().max_by(|a, b| a.ts.cmp_order(&b.ts))
}

// ---------------------------------------------------------------------------------------------

/// Honest for a prefix of requests, then silent forever.
struct Silent {
    honest_requests: u64,
    handled: u64,
    inner: Server,
}

impl ServerLogic for Silent {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        self.handled += 1;
        if self.handled <= self.honest_requests {
            return self.inner.handle(now, from, access, request, fragments);
        }
        Handled {
            changes: Vec::new(),
            reply: None,
            refused: None,
        }
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        self.inner.tick(now)
    }

    fn stats(&self) -> ServerStats {
        self.inner.stats()
    }
}

/// Applies every request honestly but answers clients of one parity as if nothing had happened
/// since it first saw the key: `c_0` in FILTER (a "lower" vote that pushes genuine candidates
/// towards exclusion), the first `lc` it saw in COLLECT and CLOCK.
struct Equivocating {
    /// Clients whose id has this parity get honest replies.
    honest_parity: u32,
    /// `lc` of each key before the first request for it was applied.
    old_lc: BTreeMap<Key, Option<Candidate>>,
    inner: Server,
}

impl ServerLogic for Equivocating {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        let old = self
            .old_lc
            .entry(request.key.clone())
            .or_insert_with(|| self.inner.lc(&request.key).cloned())
            .clone();
        let lied_to = from.0 % 2 != self.honest_parity;
        let body = match &request.body {
            RequestBody::Clock if lied_to => Some(ResponseBody::ClockAck {
                lc_ts: old.as_ref().map(|c| c.ts),
            }),
            RequestBody::Collect { .. } if lied_to => Some(ResponseBody::CollectAck {
                lc: old,
                entry: None,
            }),
            RequestBody::Filter { .. } if lied_to => {
                Some(ResponseBody::FilterAck(FilterAck::Initial))
            }
            _ => None,
        };
        let mut handled = self.inner.handle(now, from, access, request, fragments);
        if let (Some(body), Some(reply)) = (body, handled.reply.as_mut()) {
            reply.body = body;
        }
        handled
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        self.inner.tick(now)
    }

    fn stats(&self) -> ServerStats {
        self.inner.stats()
    }
}

/// Honest for a prefix, then frozen: writes are acknowledged but never applied, and reads are
/// served from the frozen server (whose `lc` can still rise through MAC-validated write-backs,
/// as a lagging replica's would). Frozen from the start it is a fresh server that acks writes.
struct Stale {
    honest_requests: u64,
    handled: u64,
    inner: Server,
}

impl ServerLogic for Stale {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        self.handled += 1;
        let frozen = self.handled > self.honest_requests;
        let write = matches!(
            request.body,
            RequestBody::Store { .. } | RequestBody::Complete { .. }
        );
        if frozen && write {
            return initial_state_reply(&request);
        }
        self.inner.handle(now, from, access, request, fragments)
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        self.inner.tick(now)
    }

    fn stats(&self) -> ServerStats {
        self.inner.stats()
    }
}

/// Honest for a prefix, then reverts to the initial state for good: it acks every STORE and
/// COMPLETE without keeping anything and answers every read as `c_0`.
struct Amnesiac {
    honest_requests: u64,
    handled: u64,
    inner: Server,
}

impl ServerLogic for Amnesiac {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        self.handled += 1;
        if self.handled <= self.honest_requests {
            return self.inner.handle(now, from, access, request, fragments);
        }
        initial_state_reply(&request)
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        if self.handled <= self.honest_requests {
            return self.inner.tick(now);
        }
        Vec::new()
    }

    fn stats(&self) -> ServerStats {
        if self.handled <= self.honest_requests {
            return self.inner.stats();
        }
        ServerStats::default()
    }
}

/// Applies requests honestly and corrupts its replies.
struct Corrupting {
    lie_probability: f64,
    rng: ChaCha8Rng,
    inner: Server,
}

impl Corrupting {
    fn corrupt(&mut self, body: &mut ResponseBody) {
        let rng = &mut self.rng;
        match body {
            ResponseBody::ClockAck { lc_ts: Some(ts) }
            | ResponseBody::HoldAck { lc_ts: Some(ts) } => {
                if rng.random_bool(0.5) {
                    flip_tag(&mut ts.tag, rng);
                } else {
                    ts.num = ts.num.saturating_add(rng.random_range(1..1_000));
                }
            }
            ResponseBody::CollectAck {
                lc: Some(candidate),
                entry,
            } => match (rng.random_range(0..7), entry.as_mut()) {
                (2, _) => flip_byte(&mut candidate.nonce.0, rng),
                (3, _) => flip_tag(&mut candidate.ts.tag, rng),
                (4, Some(entry)) => {
                    let mut bytes = entry.fragment.to_vec();
                    flip_byte(&mut bytes, rng);
                    entry.fragment = Bytes::from(bytes);
                }
                // A fragment of another value that matches its own, altered, cross-checksum
                // slot: only agreement on `cc` can tell.
                (5, Some(entry)) => {
                    let mut bytes = entry.fragment.to_vec();
                    flip_byte(&mut bytes, rng);
                    let me = self.inner.config().node.index();
                    if let Some(slot) = entry.cc.hashes.get_mut(me) {
                        *slot = fragment_digest(&bytes);
                    }
                    entry.fragment = Bytes::from(bytes);
                }
                (6, Some(entry)) => flip_byte(&mut entry.nonce_hash.0, rng),
                _ => corrupt_vec(&mut candidate.vec, rng),
            },
            ResponseBody::FilterAck(ack) => match ack {
                FilterAck::Entry {
                    ts,
                    fragment,
                    cc,
                    nonce_hash,
                    vec,
                } => match rng.random_range(0..8) {
                    0 | 1 => {
                        let mut bytes = fragment.to_vec();
                        flip_byte(&mut bytes, rng);
                        *fragment = Bytes::from(bytes);
                    }
                    2 => {
                        if !cc.hashes.is_empty() {
                            let at = rng.random_range(0..cc.hashes.len());
                            flip_byte(&mut cc.hashes[at].0, rng);
                        }
                    }
                    3 => corrupt_vec(vec, rng),
                    4 => flip_byte(&mut nonce_hash.0, rng),
                    5 => cc.layout.len = cc.layout.len.wrapping_add(rng.random_range(1..64)),
                    6 => flip_tag(&mut ts.tag, rng),
                    _ => *ack = FilterAck::Initial,
                },
                FilterAck::MacOnly { .. } | FilterAck::Superseded { .. } => {
                    *ack = FilterAck::Initial;
                }
                FilterAck::Initial => {}
            },
            ResponseBody::StoreAck { .. }
            | ResponseBody::CompleteAck { .. }
            | ResponseBody::RepairAck => {
                // A refusal from one node is allowed to cost nothing: f of them never end an op.
                if rng.random_bool(0.2) {
                    *body = ResponseBody::Refused(Refusal::Malformed("corrupting".to_string()));
                }
            }
            ResponseBody::ClockAck { lc_ts: None }
            | ResponseBody::HoldAck { lc_ts: None }
            | ResponseBody::CollectAck { lc: None, .. }
            | ResponseBody::Refused(_) => {}
        }
    }
}

impl ServerLogic for Corrupting {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        let mut handled = self.inner.handle(now, from, access, request, fragments);
        if self.rng.random_bool(self.lie_probability)
            && let Some(reply) = handled.reply.as_mut()
        {
            let mut body = std::mem::replace(&mut reply.body, ResponseBody::RepairAck);
            self.corrupt(&mut body);
            reply.body = body;
        }
        handled
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        self.inner.tick(now)
    }

    fn stats(&self) -> ServerStats {
        self.inner.stats()
    }
}

/// Stores honestly (so it can later vouch for real versions when that suits it) and fabricates
/// replies: high candidates, twins with garbage nonces, forged FILTER entries, "superseded" replies
/// offering versions nobody wrote, bad CLOCK tags.
struct Forging {
    lie_probability: f64,
    rng: ChaCha8Rng,
    inner: Server,
}

impl Forging {
    /// Replaces `body` with a fabrication; `target` is the highest candidate the request carried.
    fn forge(&mut self, target: Option<Candidate>, body: &mut ResponseBody) {
        let n = self.inner.config().n;
        let f = self.inner.config().f;
        let me = self.inner.config().node.index();
        let rng = &mut self.rng;
        match body {
            ResponseBody::ClockAck { lc_ts } | ResponseBody::HoldAck { lc_ts } => {
                let above = lc_ts.map_or(0, |ts| ts.num);
                *lc_ts = Some(forged_timestamp(rng, above));
            }
            ResponseBody::CollectAck { lc, entry } => {
                let plan = rng.random_range(0..3);
                if plan == 0
                    && let Some(genuine) = lc.as_ref()
                {
                    // The genuine `lc` vouched for with another value's self-consistent entry:
                    // one voucher must never be enough.
                    if let Some(forged) = forge_value(rng, n, f)
                        && let Some(fragment) = forged.fragments.get(me)
                    {
                        *entry = Some(LcEntry {
                            fragment: fragment.clone(),
                            cc: forged.cc,
                            nonce_hash: genuine.nonce.commitment(),
                        });
                    }
                    return;
                }
                let twin = lc.as_ref().filter(|_| plan == 1).map(|genuine| {
                    // §4.8(a): the genuine timestamp and MAC vector with a nonce nobody wrote.
                    Candidate {
                        ts: genuine.ts,
                        nonce: random_nonce(rng),
                        vec: genuine.vec.clone(),
                    }
                });
                let claimed = twin.unwrap_or_else(|| {
                    let above = lc.as_ref().map_or(0, |c| c.ts.num);
                    Candidate {
                        ts: forged_timestamp(rng, above),
                        nonce: random_nonce(rng),
                        vec: random_vec(rng, n),
                    }
                });
                // Whatever it claims, it vouches for with a value of its own.
                *entry = forge_value(rng, n, f).and_then(|forged| {
                    Some(LcEntry {
                        fragment: forged.fragments.get(me)?.clone(),
                        cc: forged.cc,
                        nonce_hash: claimed.nonce.commitment(),
                    })
                });
                *lc = Some(claimed);
            }
            ResponseBody::FilterAck(ack) => match (rng.random_range(0..4), target) {
                (0, Some(target)) => {
                    if let Some(forged) = forge_value(rng, n, f)
                        && let Some(fragment) = forged.fragments.get(me)
                    {
                        *ack = FilterAck::Entry {
                            ts: target.ts,
                            fragment: fragment.clone(),
                            cc: forged.cc.clone(),
                            nonce_hash: target.nonce.commitment(),
                            vec: target.vec.clone(),
                        };
                    }
                }
                (1, _) => {
                    let above = ack.ts().map_or(0, |ts| ts.num);
                    *ack = FilterAck::MacOnly {
                        ts: forged_timestamp(rng, above),
                    };
                }
                (2, Some(target)) => {
                    // Bait: "superseded", offering a newer version nobody wrote.
                    *ack = FilterAck::Superseded {
                        ts: target.ts,
                        newer: Candidate {
                            ts: forged_timestamp(rng, target.ts.num),
                            nonce: random_nonce(rng),
                            vec: random_vec(rng, n),
                        },
                    };
                }
                _ => *ack = FilterAck::Initial,
            },
            ResponseBody::StoreAck { .. }
            | ResponseBody::CompleteAck { .. }
            | ResponseBody::RepairAck
            | ResponseBody::Refused(_) => {}
        }
    }
}

impl ServerLogic for Forging {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        let target = highest_requested(&request).cloned();
        let mut handled = self.inner.handle(now, from, access, request, fragments);
        if self.rng.random_bool(self.lie_probability)
            && let Some(reply) = handled.reply.as_mut()
        {
            let mut body = std::mem::replace(&mut reply.body, ResponseBody::RepairAck);
            self.forge(target, &mut body);
            reply.body = body;
        }
        handled
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        self.inner.tick(now)
    }

    fn stats(&self) -> ServerStats {
        self.inner.stats()
    }
}

/// Servers that share a seed and tell one story per key: the same forged candidate, the same
/// forged value (each vouching with the fragment of its own index), and the same plot for the same
/// read operation. With at most `f` of them the story never gathers `f+1` vouchers; with `f+1` it
/// does, and readers return a value nobody wrote (the negative control).
struct Colluding {
    story_seed: u64,
    /// Per key, the `lc` this server held before its current one: what it shows while hiding the
    /// newest version.
    previous_lc: BTreeMap<Key, Option<Candidate>>,
    inner: Server,
}

/// What the colluders do for one read attempt; all of them pick the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plot {
    /// Offer the forged candidate, vouch for it, and vote everything else down to `c_0`.
    Forge,
    /// §4.8(a): some offer a twin of their newest candidate (its `ts` and `vec`, a nonce nobody
    /// wrote), the others the genuine candidate with every MAC slot corrupted; all vouch honestly
    /// in FILTER. The version is then `safe`, while the genuine candidate's write-back is valid
    /// only where `Hist` holds it. A reader that picks the twin skips REPAIR.
    Twin,
    /// Pretend the newest version never happened: offer the previous `lc` and vote the newest
    /// down. Played after a `Twin`, it turns a reader's skipped REPAIR into a new-old inversion.
    Hide,
    /// Pretend to hold nothing.
    Initial,
    /// Behave.
    Honest,
}

impl Colluding {
    /// A generator every colluder seeds identically for the same `parts`.
    fn shared_rng(&self, domain: &str, parts: &[&[u8]]) -> ChaCha8Rng {
        let mut material = self.story_seed.to_be_bytes().to_vec();
        for part in parts {
            material.extend_from_slice(&(part.len() as u64).to_be_bytes());
            material.extend_from_slice(part);
        }
        ChaCha8Rng::from_seed(Digest::of(domain, &material).0)
    }

    fn plot(&self, from: ClientId, request: &Request) -> Plot {
        let mut rng = self.shared_rng(
            "bulwark sim colluding plot",
            &[
                request.key.as_bytes(),
                &from.0.to_be_bytes(),
                &request.op.0.to_be_bytes(),
                &request.attempt.to_be_bytes(),
            ],
        );
        match rng.random_range(0..8) {
            0..=1 => Plot::Forge,
            2..=3 => Plot::Twin,
            4..=5 => Plot::Hide,
            6 => Plot::Initial,
            _ => Plot::Honest,
        }
    }

    /// Whether this colluder plays the twin or the corrupted genuine in a `Twin` plot. Decided per
    /// (node, read) so that, among several colluders, both roles usually appear.
    fn offers_twin(&self, from: ClientId, request: &Request) -> bool {
        let me = self.inner.config().node.0;
        let mut rng = self.shared_rng(
            "bulwark sim colluding role",
            &[
                &me.to_be_bytes(),
                &from.0.to_be_bytes(),
                &request.op.0.to_be_bytes(),
            ],
        );
        rng.random_bool(0.5)
    }

    /// The forged candidate and value of `key`, identical at every colluder.
    fn story(&self, key: &Key) -> Option<(Candidate, ForgedValue)> {
        let config = self.inner.config();
        let mut rng = self.shared_rng("bulwark sim colluding story", &[key.as_bytes()]);
        let candidate = Candidate {
            ts: forged_timestamp(&mut rng, 1 << 32),
            nonce: random_nonce(&mut rng),
            vec: random_vec(&mut rng, config.n),
        };
        let forged = forge_value(&mut rng, config.n, config.f)?;
        Some((candidate, forged))
    }

    /// The twin of a genuine candidate: every colluder derives the same garbage nonce.
    fn twin_of(&self, genuine: &Candidate) -> Candidate {
        let mut rng = self.shared_rng("bulwark sim colluding twin", &[&genuine.ts.canonical()]);
        Candidate {
            ts: genuine.ts,
            nonce: random_nonce(&mut rng),
            vec: genuine.vec.clone(),
        }
    }

    /// The genuine candidate with every MAC slot corrupted: no correct server can validate it by
    /// MAC, only those holding its `Hist` entry.
    fn big_mac_of(&self, genuine: &Candidate) -> Candidate {
        let mut rng = self.shared_rng("bulwark sim colluding bigmac", &[&genuine.ts.canonical()]);
        let mut damaged = genuine.clone();
        for tag in &mut damaged.vec.0 {
            flip_tag(tag, &mut rng);
        }
        damaged
    }

    fn story_lc_entry(&self, forged: &Candidate, value: &ForgedValue) -> Option<LcEntry> {
        let me = self.inner.config().node.index();
        Some(LcEntry {
            fragment: value.fragments.get(me)?.clone(),
            cc: value.cc.clone(),
            nonce_hash: forged.nonce.commitment(),
        })
    }

    fn story_entry(&self, forged: &Candidate, value: &ForgedValue) -> Option<FilterAck> {
        let me = self.inner.config().node.index();
        let fragment = value.fragments.get(me)?;
        Some(FilterAck::Entry {
            ts: forged.ts,
            fragment: fragment.clone(),
            cc: value.cc.clone(),
            nonce_hash: forged.nonce.commitment(),
            vec: forged.vec.clone(),
        })
    }
}

impl ServerLogic for Colluding {
    fn handle(
        &mut self,
        now: Time,
        from: ClientId,
        access: Access,
        request: Request,
        fragments: &dyn Fragments,
    ) -> Handled {
        let plot = self.plot(from, &request);
        let twin_role = self.offers_twin(from, &request);
        let story = self.story(&request.key);
        let key = request.key.clone();
        let requested: Vec<Timestamp> = match &request.body {
            RequestBody::Filter { candidates } => candidates.iter().map(|c| c.ts).collect(),
            _ => Vec::new(),
        };
        let requested_story = story
            .as_ref()
            .is_some_and(|(forged, _)| requested.contains(&forged.ts));
        let before = self.inner.lc(&key).cloned();
        let mut handled = self.inner.handle(now, from, access, request, fragments);
        let current = self.inner.lc(&key).cloned();
        if current != before {
            self.previous_lc.insert(key.clone(), before);
        }
        let previous = self.previous_lc.get(&key).cloned().flatten();
        let story_ack = story
            .as_ref()
            .and_then(|(forged, value)| self.story_entry(forged, value));
        let Some(reply) = handled.reply.as_mut() else {
            return handled;
        };
        match (&mut reply.body, plot) {
            (ResponseBody::ClockAck { lc_ts }, Plot::Forge) => {
                if let Some((forged, _)) = &story {
                    *lc_ts = Some(forged.ts);
                }
            }
            (ResponseBody::ClockAck { lc_ts }, Plot::Hide) => {
                *lc_ts = previous.as_ref().map(|c| c.ts);
            }
            (ResponseBody::CollectAck { lc, entry }, Plot::Forge) => {
                if let Some((forged, value)) = &story {
                    *lc = Some(forged.clone());
                    *entry = self.story_lc_entry(forged, value);
                }
            }
            (ResponseBody::CollectAck { lc, entry }, Plot::Twin) => {
                if let Some(genuine) = lc.as_ref() {
                    // The corrupted genuine keeps its honest entry: same timestamp and nonce.
                    *lc = Some(if twin_role {
                        *entry = None;
                        self.twin_of(genuine)
                    } else {
                        self.big_mac_of(genuine)
                    });
                }
            }
            (ResponseBody::CollectAck { lc, entry }, Plot::Hide) => {
                *lc = previous;
                *entry = None;
            }
            (ResponseBody::CollectAck { lc, entry }, Plot::Initial) => {
                *lc = None;
                *entry = None;
            }
            (ResponseBody::FilterAck(ack), _) if requested_story => {
                // Vouch for the story whenever a reader carries it: with f+1 colluders, that is
                // exactly the voucher it needs.
                if let Some(entry) = story_ack {
                    *ack = entry;
                }
            }
            (ResponseBody::FilterAck(ack), Plot::Forge | Plot::Initial) => {
                *ack = FilterAck::Initial;
            }
            (ResponseBody::FilterAck(ack), Plot::Hide) => {
                let hidden = current.as_ref().is_some_and(|c| requested.contains(&c.ts));
                if hidden {
                    *ack = FilterAck::Initial;
                }
            }
            _ => {}
        }
        handled
    }

    fn tick(&mut self, now: Time) -> Vec<Change> {
        self.inner.tick(now)
    }

    fn stats(&self) -> ServerStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::Slot;

    #[test]
    fn behaviour_names_round_trip() {
        for behaviour in Behaviour::ALL {
            assert_eq!(behaviour.name().parse::<Behaviour>(), Ok(behaviour));
            assert_eq!(behaviour.to_string(), behaviour.name());
        }
        assert!("Forging".parse::<Behaviour>().is_ok());
        assert!("liar".parse::<Behaviour>().is_err());
    }

    #[test]
    fn colluders_with_one_seed_tell_one_story() {
        let f = 1;
        let key = Key::new(Bytes::from_static(b"k")).unwrap();
        let a = Colluding {
            story_seed: 7,
            previous_lc: BTreeMap::new(),
            inner: Server::new(ServerConfig::new(Slot(1), f), ServerKeys::default()),
        };
        let b = Colluding {
            story_seed: 7,
            previous_lc: BTreeMap::new(),
            inner: Server::new(ServerConfig::new(Slot(2), f), ServerKeys::default()),
        };
        let (ca, va) = a.story(&key).unwrap();
        let (cb, vb) = b.story(&key).unwrap();
        assert_eq!(ca, cb);
        assert_eq!(va.cc, vb.cc);
        // Each vouches with a fragment that matches its own slot of the shared checksum.
        assert_eq!(fragment_digest(&va.fragments[1]), va.cc.hashes[1]);
        assert_eq!(fragment_digest(&vb.fragments[2]), vb.cc.hashes[2]);
    }
}
