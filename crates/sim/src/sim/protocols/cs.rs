//! The configuration service in the simulator: PBFT replicas of [`ConfigService`] (honest, or
//! from the Byzantine catalogue of [`crate::byzantine::cs`]) over a simulated disk of PBFT
//! records, clients submitting authority-signed ADD and REVOKE orders, STOPs and reads, and a
//! checker of the service's promises.
//!
//! The run's genesis configuration has the `3f_cs+1` simulated servers as its configuration
//! service plus [`EXTRA_MEMBERS`] storage members that are not simulated (so REVOKE has targets
//! beyond the CS): server `i` is the member in CS slot `i` of the genesis, and the world's client
//! `c` submits as `ClientId(c)`. The epoch lasts a few seconds of virtual time (drawn per seed,
//! sometimes a minute, so some runs never stop), so STOP usually executes inside a run and the
//! operations after it are answered `Ended`, which completes them. Writes are ADDs of a member
//! derived from the written value, sometimes REVOKEs of a genesis member, rarely a client's STOP;
//! reads read the pending state. A replica's disk is its PBFT records in durable order, compacted
//! at each stable checkpoint; a restart is [`PbftReplica::restore`] from them.
//!
//! The checker ([`ConfigServiceSim`]'s `check`) files each violation under the property it
//! breaks (`cs/<property>` in the report):
//!
//! - **agreement**: no number is committed as two different batches, whether by a correct
//!   replica's commit certificate or by `f+1` correct replicas' COMMITs (PBFT's `committed`
//!   predicate, watched on the wire); correct replicas that executed up to the same number are in
//!   the same replicated state; every configuration certificate any server ever held (observed
//!   after every step, so one held only in memory before a crash counts too) verifies as the
//!   genesis's successor, and all of them certify the same configuration.
//! - **stopped-state**: every correct replica that executed STOP holds the same [`Pending`], and
//!   the certified configuration is the one it gives.
//! - **validity**: the certified configuration is the genesis's `next` of its ADDed members,
//!   dropped ids and STOP time; every ADDed member and dropped id was ordered by the authority
//!   for some client (orders cannot be forged, and no EVICT passes without `2f_cs+1` agreements);
//!   the STOP time is no earlier than the epoch allows and no later than the tolerance past the
//!   moment a correct replica first executed it (no clock reading from the future).
//! - **outcomes**: every ADD or REVOKE a correct client saw `Accepted` is in the STOPped state
//!   and the certified configuration, under the id the outcome named; every `Stopped` outcome
//!   names the certified configuration's digest; `Ended` only after some correct replica stopped.
//! - **reads**: every read returned a state that only holds ordered changes, is a prefix of the
//!   STOPped one, contains every change acknowledged before the read began, and is ordered with
//!   every other read (and after every read that completed before it began).
//! - **certified**: an epoch long past due while clients were still being served was certified.
//!   (That *every* correct replica ends up holding the certificate is not required: see the
//!   configuration service's share exchange.) Operations that do not complete once the network
//!   heals are the world's wait-freedom violations.
//!
//! The report also names, per property, how much it examined, and (`cs/views`, `cs/refused`,
//! `cs/executed`) the highest view a correct replica reached, the messages correct replicas
//! refused and the highest number executed, so that sweeps can show their coverage.

use crate::byzantine::Behaviour;
use crate::byzantine::cs::{CsKit, CsLiar, EvictKit};
use crate::byzantine::cs_ea::EaLiar;
use crate::checker::{History, KeyReport, KeyVerdict, Report, Violation};
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Finish, Finished, Protocol, Storage};
use crate::sim::swarm::Swarm;
use bulwark_core::config::Fingerprint;
use bulwark_core::configuration::CsProtocol;
use bulwark_core::configuration::{ConfigCert, Configuration, NewMember, verify_successor};
use bulwark_core::membership::Member;
use bulwark_core::sign::{SecretKey, Signed};
use bulwark_core::{ClientId, Digest, Epoch, Key, NodeId, ServiceId, Slot, Time};
use bulwark_protocol::cs::{Action, ConfigService, EvictVote, Op, Order, Outcome, Pending};
use bulwark_protocol::machine::{
    Access, OpError, Operation, Output, Progress, Replica, ReplicaStats, TimerId,
};
use bulwark_protocol::pbft::{
    Answer, Change, Message, Params, PbftReplica, Phase, Setup, Submit, Submitted, Vote, ea,
};
use bulwark_protocol::round::OpId;
use bytes::Bytes;
use rand::Rng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::rc::Rc;

/// Genesis members beyond the configuration service: storage nodes, not simulated, that REVOKE
/// may name.
pub const EXTRA_MEMBERS: u32 = 3;
/// Faults tolerated per storage group in the genesis (it only has to validate).
const STORAGE_F: u32 = 1;
/// The STOP tolerance.
pub const STOP_DELTA_MS: u64 = 200;
/// Epoch lengths a seed draws from, in virtual milliseconds.
const T_EPOCH_CHOICES_MS: [u64; 5] = [1_500, 3_000, 5_000, 8_000, 60_000];
/// How long before the end of a run the epoch must have been due (and a correct client's
/// operation completed after that) for its certificate to be required.
const CERTIFY_WITHIN_MS: u64 = 15_000;
/// What the checker's properties are named with, in its report's keys and violations.
pub const KEY_PREFIX: &str = "cs/";

/// The agreement core a simulated configuration service runs on: PBFT ([`Pbft`]) or
/// A2M-PBFT-EA ([`Ea`]). The service, its clients and the checker are the same for both.
pub trait CsCore: Sized + 'static {
    /// A replica as the world runs it: honest, or bent by this core's Byzantine catalogue.
    type Server: Replica<
            Request = Submitted<Op>,
            Reply = Answer<Outcome>,
            Message = Self::Message,
            Change = Self::Change,
            View = (),
        >;
    /// What replicas send each other.
    type Message: Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned;
    /// A replica's durable record.
    type Change: Clone;

    /// The protocol the genesis names.
    const PROTOCOL: CsProtocol;

    /// The Byzantine behaviours this core's catalogue has.
    fn behaviours() -> &'static [Behaviour];

    /// Replica `index` with `behaviour`.
    fn server(
        sim: &ConfigServiceSim<Self>,
        index: usize,
        behaviour: Behaviour,
        seed: u64,
    ) -> Self::Server;

    /// Honest replica `index` rebuilt from its records.
    fn restore(
        sim: &ConfigServiceSim<Self>,
        index: usize,
        records: &[Self::Change],
        now: u64,
    ) -> Self::Server;

    /// Appends a record to a disk, compacting what a stable checkpoint makes redundant.
    fn persist(records: &mut Vec<Self::Change>, change: &Self::Change);

    /// The (view, number, batch) a committed certificate in `change` decides.
    fn committed(change: &Self::Change) -> Option<(u64, u64, Digest)>;

    /// The (number, view, batch) of the COMMITs replica `me` sent in `sends`.
    fn commits_sent(sends: &[(Slot, Self::Message)], me: u32) -> Vec<(u64, u64, Digest)>;

    /// What the checker reads of a replica.
    fn look(server: &Self::Server) -> Look<'_>;

    /// Replica `index`'s trusted log, if the core uses one.
    fn trusted_log(_sim: &ConfigServiceSim<Self>, _index: usize) -> Option<bulwark_a2m::Component> {
        None
    }
}

/// What the checker reads of a replica, whatever its core.
pub struct Look<'a> {
    /// The view it is in.
    pub view: u64,
    /// Messages it refused.
    pub refused: u64,
    /// The last number it executed.
    pub executed: u64,
    /// The digest of its replicated state.
    pub state: Digest,
    /// The service.
    pub app: &'a ConfigService,
}

/// The configuration service on PBFT (`E` false) or A2M-PBFT-E (`E` true: the same replicas,
/// each answering with its trusted request history, and clients that need `2f+1` attested
/// answers), with the Byzantine catalogue of [`crate::byzantine::cs`].
pub struct PbftCore<const E: bool>;

/// The configuration service on PBFT.
pub type Pbft = PbftCore<false>;

/// The configuration service on A2M-PBFT-E.
pub type PbftE = PbftCore<true>;

/// The configuration service on A2M-PBFT-EA, with the catalogue of
/// [`crate::byzantine::cs_ea`].
pub struct Ea;

/// The configuration service under simulation, for [`crate::sim::run_service`] and friends.
pub struct ConfigServiceSim<C: CsCore = Pbft> {
    genesis: Configuration,
    params: Params,
    /// A2M-PBFT-EA's sizes, for [`Ea`].
    ea_params: ea::Params,
    /// Each CS replica's trusted-log seed, by slot, for [`Ea`].
    trusted_seeds: Vec<[u8; 32]>,
    core: std::marker::PhantomData<C>,
    /// CS node and signing key by slot (= server index).
    nodes: Vec<NodeId>,
    secrets: Vec<SecretKey>,
    authority: SecretKey,
    /// Probability that a write is a REVOKE, and that it is a STOP.
    revoke_probability: f64,
    stop_probability: f64,
    record: Rc<RefCell<Record>>,
}

/// What the run saw, shared by the protocol, its servers and its operations.
#[derive(Default)]
struct Record {
    /// Every ADD handed to a client, and every id a REVOKE handed to a client named.
    adds: Vec<NewMember>,
    revokes: BTreeSet<NodeId>,
    /// One per operation, in invocation order (the history's order).
    ops: Vec<OpRecord>,
    /// Every certificate a server held: who, since when, whether correct.
    certs: Vec<Seen<ConfigCert>>,
    /// Every pending state of a replica that executed STOP (and each change of it).
    stops: Vec<Seen<Pending>>,
    /// The replicated state (PBFT's state digest) after each number some correct replica was
    /// seen to have executed up to: who, and when, first.
    executed: BTreeMap<u64, (Digest, usize, u64)>,
    /// The batch (digest), view, replica and time of the first commit certificate a correct
    /// replica held for each number.
    committed: BTreeMap<u64, (Digest, u64, usize, u64)>,
    /// Numbers already reported as committed twice.
    conflicted: BTreeSet<u64>,
    /// The correct replicas that sent a COMMIT for each (number, view, batch).
    commit_votes: BTreeMap<(u64, u64, Digest), BTreeSet<usize>>,
    /// The batch (digest), view and time for which `f+1` correct replicas first sent COMMITs,
    /// by number.
    committed_predicate: BTreeMap<u64, (Digest, u64, u64)>,
    /// Correct replicas seen in different states after the same number, or committing different
    /// batches for it.
    diverged: Vec<String>,
}

struct Seen<T> {
    server: usize,
    at: u64,
    honest: bool,
    what: T,
}

struct OpRecord {
    client: usize,
    op: OpId,
    kind: OpKind,
    outcome: Option<Outcome>,
}

#[derive(Clone, Debug)]
enum OpKind {
    Add(Box<NewMember>),
    Revoke(NodeId),
    Stop,
    Read,
}

impl<C: CsCore> ConfigServiceSim<C> {
    fn setup(&self, index: usize) -> Setup<ConfigService> {
        let mut setup = ConfigService::setup(
            &self.genesis,
            self.nodes[index],
            self.secrets[index].clone(),
        )
        .unwrap_or_else(|error| panic!("the genesis CS slot {index}: {error}"));
        setup.params = self.params;
        if C::PROTOCOL == CsProtocol::A2mPbftE {
            setup.history = Some(
                ConfigService::history(&self.genesis)
                    .unwrap_or_else(|error| panic!("the genesis CS's histories: {error}")),
            );
        }
        setup
    }

    fn kit(&self, index: usize, behaviour: Behaviour, seed: u64) -> CsKit {
        let setup = self.setup(index);
        let evict = (behaviour == Behaviour::ForgedEvict).then(|| self.evict_kit(index, seed));
        CsKit {
            params: setup.params,
            me: setup.me,
            secret: setup.secret,
            keys: setup.keys,
            instance: setup.instance,
            config: self.genesis.clone(),
            evict,
        }
    }

    /// `2f_cs` genuine agreements to evict a member chosen by `seed`: the forger's own, and
    /// those of CS replicas that (on some evidence) agreed with it.
    fn evict_kit(&self, index: usize, seed: u64) -> EvictKit {
        let members: Vec<NodeId> = self.genesis.members.iter().map(|m| m.id).collect();
        let target = members[(seed % members.len() as u64) as usize];
        let quorum = self.genesis.cs_quorum();
        let mut voters = vec![index];
        voters.extend(
            (0..self.nodes.len())
                .filter(|i| *i != index)
                .take(quorum - 2),
        );
        let genuine = voters
            .into_iter()
            .filter_map(|slot| {
                let vote = EvictVote {
                    epoch: self.genesis.epoch,
                    node: target,
                    voter: self.nodes[slot],
                };
                let signed = Signed::sign(&self.secrets[slot], vote).ok()?;
                Some((self.nodes[slot], signed.to_unverified()))
            })
            .collect();
        let outsider = members.iter().copied().find(|id| !self.nodes.contains(id));
        EvictKit {
            target,
            genuine,
            outsider,
        }
    }

    fn ea_setup(&self, index: usize) -> ea::Setup<ConfigService> {
        let mut setup = ConfigService::ea_setup(
            &self.genesis,
            self.nodes[index],
            self.secrets[index].clone(),
        )
        .unwrap_or_else(|error| panic!("the genesis CS slot {index}: {error}"));
        setup.params = self.ea_params;
        setup
    }

    fn wrap(&self, index: usize, honest: bool, liar: C::Server) -> CsServer<C> {
        CsServer {
            honest,
            liar,
            index,
            record: self.record.clone(),
            seen_cert: None,
            seen_stop: None,
            seen_executed: 0,
            f: self.genesis.f_cs as usize,
        }
    }

    fn order(&self, action: Action) -> Op {
        let order = Order {
            epoch: self.genesis.epoch,
            action,
        };
        let signed = Signed::sign(&self.authority, order)
            .unwrap_or_else(|error| panic!("an order is far below its bound: {error}"));
        Op::Order(signed.to_unverified())
    }

    fn submit(&self, client: usize, op: OpId, kind: OpKind, request: Op) -> CsOp {
        let mut record = self.record.borrow_mut();
        let index = record.ops.len();
        record.ops.push(OpRecord {
            client,
            op,
            kind,
            outcome: None,
        });
        CsOp {
            inner: ConfigService::submit(&self.genesis, ClientId(client as u32), op.0, request)
                .unwrap_or_else(|error| panic!("a request to the genesis CS: {error}")),
            index,
            read: false,
            record: self.record.clone(),
        }
    }

    /// The id the genesis gives the first ADDed node.
    fn first_new_id(&self) -> u32 {
        self.genesis.next_node_id
    }

    /// The earliest agreed time a STOP may execute with.
    fn stop_due(&self) -> u64 {
        self.genesis
            .started_at_ms
            .saturating_add(self.genesis.t_epoch_ms)
            .saturating_sub(self.genesis.stop_delta_ms)
    }
}

/// A new member made from a written value: the value's bytes (unique per write) pick its
/// address, certificate and key.
fn new_member(value: &[u8]) -> NewMember {
    let id = value
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes);
    let address = SocketAddr::from((
        Ipv4Addr::from(0x0b00_0000 + (id as u32 & 0x00ff_ffff)),
        7000,
    ));
    let seed = Digest::of("bulwark.sim.cs.key", value).0;
    NewMember {
        trusted_key: None,
        address,
        fingerprint: Fingerprint(Digest::of("bulwark.sim.cs.fingerprint", value).0),
        signing_key: SecretKey::from_seed(&seed).public_key(),
    }
}

// ---------------------------------------------------------------------------------------------
// Servers

/// A configuration-service replica in the world: the (possibly Byzantine) replica, watched after
/// every step for the certificates and STOPped states it holds.
pub struct CsServer<C: CsCore = Pbft> {
    liar: C::Server,
    index: usize,
    honest: bool,
    record: Rc<RefCell<Record>>,
    seen_cert: Option<ConfigCert>,
    seen_stop: Option<Pending>,
    seen_executed: u64,
    /// Faults the CS tolerates.
    f: usize,
}

impl<C: CsCore> CsServer<C> {
    /// What the checker reads of the replica (the honest one under a Byzantine wrapper).
    pub fn look(&self) -> Look<'_> {
        C::look(&self.liar)
    }

    fn observe(&mut self, now: Time, out: &Output<C::Server>) {
        if self.honest {
            for change in &out.changes {
                if let Some((view, seq, digest)) = C::committed(change) {
                    self.committed(now, view, seq, digest);
                }
            }
            let votes: BTreeSet<(u64, u64, Digest)> =
                C::commits_sent(&out.sends, self.index as u32)
                    .into_iter()
                    .collect();
            for (seq, view, digest) in votes {
                self.commit_vote(now, seq, view, digest);
            }
        }
        let look = C::look(&self.liar);
        let executed = look.executed;
        if self.honest && executed != self.seen_executed {
            self.seen_executed = executed;
            let digest = look.state;
            let mut record = self.record.borrow_mut();
            match record.executed.get(&executed) {
                None => {
                    record
                        .executed
                        .insert(executed, (digest, self.index, now.0));
                }
                Some((first, server, at)) if *first != digest => {
                    let line = format!(
                        "correct replicas s{server} (at {at}ms) and s{} (at {}ms) executed up to number {executed} into different states",
                        self.index, now.0
                    );
                    record.diverged.push(line);
                }
                Some(_) => {}
            }
        }
        let app = look.app;
        if let Some(cert) = app.certified()
            && self.seen_cert.as_ref() != Some(cert)
        {
            self.seen_cert = Some(cert.clone());
            self.record.borrow_mut().certs.push(Seen {
                server: self.index,
                at: now.0,
                honest: self.honest,
                what: cert.clone(),
            });
        }
        let pending = app.pending();
        if pending.stopped_at.is_some() && self.seen_stop.as_ref() != Some(pending) {
            self.seen_stop = Some(pending.clone());
            self.record.borrow_mut().stops.push(Seen {
                server: self.index,
                at: now.0,
                honest: self.honest,
                what: pending.clone(),
            });
        }
    }
}

impl<C: CsCore> CsServer<C> {
    /// A commit certificate this correct replica made or accepted: no correct replica may
    /// commit another batch for the same number, in any view.
    fn committed(&mut self, now: Time, view: u64, seq: u64, digest: Digest) {
        let mut record = self.record.borrow_mut();
        match record.committed.get(&seq).copied() {
            None => {
                record
                    .committed
                    .insert(seq, (digest, view, self.index, now.0));
            }
            Some((first, first_view, server, at))
                if first != digest && record.conflicted.insert(seq) =>
            {
                let line = format!(
                    "number {seq} was committed as two different batches: by s{server} in view {first_view} (at {at}ms) and by s{} in view {view} (at {}ms)",
                    self.index, now.0
                );
                record.diverged.push(line);
            }
            Some(_) => {}
        }
    }
}

impl<C: CsCore> CsServer<C> {
    /// A COMMIT this correct replica sent. Once `f+1` correct replicas sent one for a batch in a
    /// view, that batch is committed at its number (PBFT's `committed` predicate: whatever the
    /// replicas executed, no other batch may ever be committed there).
    fn commit_vote(&mut self, now: Time, seq: u64, view: u64, digest: Digest) {
        let f = self.f;
        let mut record = self.record.borrow_mut();
        let voters = record.commit_votes.entry((seq, view, digest)).or_default();
        if !voters.insert(self.index) || voters.len() != f + 1 {
            return;
        }
        match record.committed_predicate.get(&seq).copied() {
            None => {
                record
                    .committed_predicate
                    .insert(seq, (digest, view, now.0));
            }
            Some((first, first_view, at)) if first != digest && record.conflicted.insert(seq) => {
                let line = format!(
                    "number {seq} was committed as two different batches: by f+1 correct replicas in view {first_view} (by {at}ms) and by f+1 correct replicas in view {view} (by {}ms)",
                    now.0
                );
                record.diverged.push(line);
            }
            Some(_) => {}
        }
    }
}

impl<C: CsCore> Replica for CsServer<C> {
    const SERVICE: ServiceId = <C::Server as Replica>::SERVICE;
    type Request = Submitted<Op>;
    type Reply = Answer<Outcome>;
    type Message = C::Message;
    type Change = C::Change;
    type View = ();

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: Submitted<Op>,
        view: &(),
    ) -> Output<Self> {
        let out = self.liar.on_request(now, client, access, request, view);
        self.observe(now, &out);
        out.retyped()
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: C::Message,
        view: &(),
    ) -> Output<Self> {
        let out = self.liar.on_message(now, from, message, view);
        self.observe(now, &out);
        out.retyped()
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, view: &()) -> Output<Self> {
        let out = self.liar.on_timer(now, timer, view);
        self.observe(now, &out);
        out.retyped()
    }

    fn on_attested(
        &mut self,
        now: Time,
        token: u64,
        answers: bulwark_protocol::machine::Attested,
        view: &(),
    ) -> Output<Self> {
        let out = self.liar.on_attested(now, token, answers, view);
        self.observe(now, &out);
        out.retyped()
    }

    fn on_tick(&mut self, now: Time) -> Output<Self> {
        let out = self.liar.on_tick(now);
        self.observe(now, &out);
        out.retyped()
    }

    fn stats(&self) -> ReplicaStats {
        self.liar.stats()
    }
}

/// A replica's disk: its records in the order they became durable, compacted at each stable
/// checkpoint (records about numbers it covers go, and only the latest view is kept).
pub struct CsDisk<C: CsCore = Pbft> {
    records: Vec<C::Change>,
}

impl<C: CsCore> Default for CsDisk<C> {
    fn default() -> Self {
        CsDisk {
            records: Vec::new(),
        }
    }
}

impl<const E: bool> CsCore for PbftCore<E> {
    type Server = CsLiar;
    type Message = Message<ConfigService>;
    type Change = Change<ConfigService>;
    const PROTOCOL: CsProtocol = if E {
        CsProtocol::A2mPbftE
    } else {
        CsProtocol::Pbft
    };

    fn behaviours() -> &'static [Behaviour] {
        &Behaviour::CONFIG_SERVICE
    }

    fn server(
        sim: &ConfigServiceSim<Self>,
        index: usize,
        behaviour: Behaviour,
        seed: u64,
    ) -> CsLiar {
        let replica = PbftReplica::new(sim.setup(index))
            .unwrap_or_else(|error| panic!("replica {index}: {error}"));
        CsLiar::new(behaviour, replica, sim.kit(index, behaviour, seed), seed)
    }

    fn restore(
        sim: &ConfigServiceSim<Self>,
        index: usize,
        records: &[Self::Change],
        now: u64,
    ) -> CsLiar {
        let replica = PbftReplica::restore(sim.setup(index), records.iter().cloned(), Time(now))
            .unwrap_or_else(|error| {
                panic!("replica {index} cannot restore from its own disk: {error}")
            });
        CsLiar::new(
            Behaviour::Honest,
            replica,
            sim.kit(index, Behaviour::Honest, 0),
            0,
        )
    }

    fn persist(records: &mut Vec<Self::Change>, change: &Self::Change) {
        match change {
            Change::Checkpoint(transfer) => {
                let stable = transfer.proof.seq;
                records.retain(|record| match record {
                    Change::Checkpoint(old) => old.proof.seq > stable,
                    other => other.seq().is_none_or(|seq| seq > stable),
                });
            }
            Change::View { .. } => records.retain(|record| !matches!(record, Change::View { .. })),
            _ => {}
        }
        records.push(change.clone());
    }

    fn committed(change: &Self::Change) -> Option<(u64, u64, Digest)> {
        match change {
            Change::Committed(committed) => {
                Some((committed.view, committed.seq, committed.batch.digest()))
            }
            _ => None,
        }
    }

    fn commits_sent(sends: &[(Slot, Self::Message)], me: u32) -> Vec<(u64, u64, Digest)> {
        sends
            .iter()
            .filter_map(|(_, message)| match message {
                Message::Vote(cast) if cast.slot == me => {
                    bulwark_core::wire::decode::<Vote>(cast.signed.bytes(), 128).ok()
                }
                _ => None,
            })
            .filter(|vote| vote.phase == Phase::Commit)
            .map(|vote| (vote.seq, vote.view, vote.digest))
            .collect()
    }

    fn look(server: &CsLiar) -> Look<'_> {
        let replica = server.replica();
        Look {
            view: replica.view().0,
            refused: replica.pbft_stats().refused,
            executed: replica.executed(),
            state: replica.state_digest(),
            app: replica.app(),
        }
    }

    fn trusted_log(sim: &ConfigServiceSim<Self>, index: usize) -> Option<bulwark_a2m::Component> {
        E.then(|| {
            bulwark_a2m::Component::in_memory(
                &sim.trusted_seeds[index],
                bulwark_a2m::Limits::default(),
            )
        })
    }
}

impl CsCore for Ea {
    type Server = EaLiar;
    type Message = ea::Message<ConfigService>;
    type Change = ea::Change<ConfigService>;
    const PROTOCOL: CsProtocol = CsProtocol::A2mPbftEa;

    fn behaviours() -> &'static [Behaviour] {
        &EaLiar::BEHAVIOURS
    }

    fn server(sim: &ConfigServiceSim<Ea>, index: usize, behaviour: Behaviour, seed: u64) -> EaLiar {
        let replica = ea::EaReplica::new(sim.ea_setup(index))
            .unwrap_or_else(|error| panic!("replica {index}: {error}"));
        EaLiar::new(behaviour, replica, sim.ea_setup(index), seed)
    }

    fn restore(
        sim: &ConfigServiceSim<Ea>,
        index: usize,
        records: &[Self::Change],
        now: u64,
    ) -> EaLiar {
        let replica =
            ea::EaReplica::restore(sim.ea_setup(index), records.iter().cloned(), Time(now))
                .unwrap_or_else(|error| {
                    panic!("replica {index} cannot restore from its own disk: {error}")
                });
        EaLiar::new(Behaviour::Honest, replica, sim.ea_setup(index), 0)
    }

    fn persist(records: &mut Vec<Self::Change>, change: &Self::Change) {
        // Kept whole: an instance lives one epoch, and a restart must see every message it said
        // (its trusted log is asked again for each).
        records.push(change.clone());
    }

    fn committed(change: &Self::Change) -> Option<(u64, u64, Digest)> {
        match change {
            ea::Change::Committed(committed) => {
                let view = committed
                    .votes
                    .first()
                    .and_then(|v| v.peek())
                    .map_or(0, |v| v.view);
                Some((view, committed.seq, committed.batch.digest()))
            }
            _ => None,
        }
    }

    fn commits_sent(sends: &[(Slot, Self::Message)], me: u32) -> Vec<(u64, u64, Digest)> {
        sends
            .iter()
            .filter_map(|(_, message)| match message {
                ea::Message::Vote(attested) => attested.peek(),
                _ => None,
            })
            .filter(|vote| vote.phase == Phase::Commit && vote.replica == me)
            .map(|vote| (vote.seq, vote.view, vote.digest))
            .collect()
    }

    fn look(server: &EaLiar) -> Look<'_> {
        let replica = server.replica();
        Look {
            view: replica.view().0,
            refused: replica.ea_stats().refused,
            executed: replica.executed(),
            state: replica.state_digest(),
            app: replica.app(),
        }
    }

    fn trusted_log(sim: &ConfigServiceSim<Ea>, index: usize) -> Option<bulwark_a2m::Component> {
        Some(bulwark_a2m::Component::in_memory(
            &sim.trusted_seeds[index],
            bulwark_a2m::Limits::default(),
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Operations

/// A correct client's request, recording its outcome for the checker.
pub struct CsOp {
    inner: Submit<ConfigService>,
    index: usize,
    read: bool,
    record: Rc<RefCell<Record>>,
}

/// A completed request's outcome.
pub struct CsDone {
    outcome: Outcome,
    read: bool,
}

impl Operation for CsOp {
    const SERVICE: ServiceId = <Submit<ConfigService> as Operation>::SERVICE;
    type Request = Submitted<Op>;
    type Reply = Answer<Outcome>;
    type Output = CsDone;

    fn op(&self) -> u64 {
        self.inner.op()
    }

    fn start(&mut self) -> Vec<(Slot, Submitted<Op>)> {
        self.inner.start()
    }

    fn on_reply(&mut self, from: Slot, reply: Answer<Outcome>) -> Progress<Self> {
        match self.inner.on_reply(from, reply) {
            Progress::Send(sends) => Progress::Send(sends),
            Progress::Done(Ok(outcome)) => {
                if let Some(op) = self.record.borrow_mut().ops.get_mut(self.index) {
                    op.outcome = Some(outcome.clone());
                }
                Progress::Done(Ok(CsDone {
                    outcome,
                    read: self.read,
                }))
            }
            Progress::Done(Err(error)) => Progress::Done(Err::<CsDone, OpError>(error)),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Submitted<Op>)> {
        self.inner.on_timeout()
    }

    fn answered(&self) -> Vec<Slot> {
        self.inner.answered()
    }

    fn quorum(&self) -> usize {
        self.inner.quorum()
    }
}

impl Finish for CsDone {
    fn finish(self) -> Finished {
        Finished {
            read: self.read.then_some(None),
            version: describe_outcome(&self.outcome),
            evidence: Vec::new(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

fn describe_outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Done => "done".into(),
        Outcome::Accepted { epoch, node } => match node {
            Some(node) => format!("accepted {node} for epoch {}", epoch.0),
            None => format!("accepted for epoch {}", epoch.0),
        },
        Outcome::Rejected(reason) => format!("rejected: {reason}"),
        Outcome::Stopped { epoch, digest } => format!("stopped: epoch {} is {digest:?}", epoch.0),
        Outcome::State(pending) => describe_pending(pending),
        Outcome::Ended { next } => format!("ended: submit to epoch {}", next.0),
    }
}

fn describe_pending(pending: &Pending) -> String {
    format!(
        "{} added, dropped {:?}, {}",
        pending.added.len(),
        pending.dropped.iter().map(|id| id.0).collect::<Vec<_>>(),
        pending
            .stopped_at
            .map_or("running".into(), |at| format!("stopped at {at}"))
    )
}

fn describe_op(op: &Op) -> String {
    match op {
        Op::Noop => "noop".into(),
        Op::Read => "read".into(),
        Op::Stop => "stop".into(),
        Op::Order(order) => {
            match bulwark_core::wire::decode::<Order>(order.bytes(), 512).map(|o| o.action) {
                Ok(Action::Add(member)) => format!("add {}", member.address),
                Ok(Action::Revoke(node)) => format!("revoke {node}"),
                Err(_) => "order (undecodable)".into(),
            }
        }
        Op::Evict { node, votes } => format!("evict {node} with {} agreements", votes.len()),
    }
}

// ---------------------------------------------------------------------------------------------
// The protocol

impl<C: CsCore> Protocol for ConfigServiceSim<C> {
    type Request = Submitted<Op>;
    type Response = Answer<Outcome>;
    type Change = C::Change;
    type Disk = CsDisk<C>;
    type Server = CsServer<C>;
    type Write = CsOp;
    type Read = CsOp;

    /// Time for lagging replicas to catch up and for shares to meet once clients are done.
    const SETTLE_MILLIS: u64 = 5_000;

    fn nodes(f: usize) -> usize {
        match C::PROTOCOL {
            CsProtocol::Pbft | CsProtocol::A2mPbftE => 3 * f + 1,
            CsProtocol::A2mPbftEa => 2 * f + 1,
        }
    }

    /// The core's catalogue of Byzantine replicas; no Byzantine readers.
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults
            .behaviours
            .retain(|behaviour| C::behaviours().contains(behaviour));
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> ConfigServiceSim<C> {
        let f_cs = config.f.max(1);
        let n = Self::nodes(f_cs) as u32;
        let mut member_secrets = Vec::new();
        let mut members = Vec::new();
        let mut member_trusted = Vec::new();
        for i in 0..n + EXTRA_MEMBERS {
            let secret = SecretKey::from_seed(&rng.random());
            // Only the cores on trusted logs draw their seeds, so PBFT's seeds replay as they
            // always did.
            let trusted: Option<[u8; 32]> = C::PROTOCOL.needs_trusted_logs().then(|| rng.random());
            member_trusted.push((NodeId(i), trusted));
            members.push(Member {
                trusted_key: trusted.map(|seed| SecretKey::from_seed(&seed).public_key()),
                id: NodeId(i),
                address: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1 + i as u8), 7000)),
                fingerprint: Fingerprint(rng.random()),
                signing_key: secret.public_key(),
            });
            member_secrets.push((NodeId(i), secret));
        }
        let authority = SecretKey::from_seed(&rng.random());
        let t_epoch_ms = *T_EPOCH_CHOICES_MS.choose(rng).unwrap_or(&10_000);
        let genesis = Configuration::genesis(
            members,
            STORAGE_F,
            f_cs as u32,
            authority.public_key(),
            t_epoch_ms,
            STOP_DELTA_MS,
            0,
        )
        .and_then(|genesis| genesis.with_cs_protocol(C::PROTOCOL))
        .unwrap_or_else(|error| panic!("the simulated genesis: {error}"));
        let nodes = genesis.cs();
        let trusted_seeds = nodes
            .iter()
            .map(|id| {
                member_trusted
                    .iter()
                    .find(|(member, _)| member == id)
                    .and_then(|(_, seed)| *seed)
                    .unwrap_or_default()
            })
            .collect();
        let secrets = nodes
            .iter()
            .map(|id| {
                member_secrets
                    .iter()
                    .find(|(member, _)| member == id)
                    .map(|(_, secret)| secret.clone())
                    .unwrap_or_else(|| unreachable!("the CS is chosen among the members"))
            })
            .collect();
        let mut params = Params::new(f_cs);
        params.mutations = config.mutations.pbft;
        let mut ea_params = ea::Params::new(f_cs);
        ea_params.mutations = config.mutations.ea;
        ConfigServiceSim {
            genesis,
            params,
            ea_params,
            trusted_seeds,
            core: std::marker::PhantomData,
            nodes,
            secrets,
            authority,
            revoke_probability: *[0.05, 0.15, 0.3].choose(rng).unwrap_or(&0.15),
            stop_probability: *[0.0, 0.02, 0.05].choose(rng).unwrap_or(&0.02),
            record: Rc::new(RefCell::new(Record::default())),
        }
    }

    fn server(&self, index: usize, behaviour: Behaviour, seed: u64) -> CsServer<C> {
        self.wrap(
            index,
            behaviour == Behaviour::Honest,
            C::server(self, index, behaviour, seed),
        )
    }

    fn trusted_log(&self, index: usize) -> Option<bulwark_a2m::Component> {
        C::trusted_log(self, index)
    }

    fn restore(&self, index: usize, disk: &CsDisk<C>, now: u64) -> CsServer<C> {
        self.wrap(index, true, C::restore(self, index, &disk.records, now))
    }

    fn view(_: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut CsDisk<C>, change: &C::Change) {
        C::persist(&mut disk.records, change);
    }

    fn disk_versions(disk: &CsDisk<C>) -> usize {
        disk.records.len()
    }

    fn write(
        &self,
        client: usize,
        _key: Key,
        op: OpId,
        value: Option<Bytes>,
        _now: u64,
        rng: &mut ChaCha8Rng,
    ) -> CsOp {
        let roll: f64 = rng.random();
        let revoke = value.is_none() || roll < self.revoke_probability;
        let stop = !revoke && roll < self.revoke_probability + self.stop_probability;
        if revoke {
            let members = &self.genesis.members;
            let target = members[rng.random_range(0..members.len())].id;
            self.record.borrow_mut().revokes.insert(target);
            let request = self.order(Action::Revoke(target));
            return self.submit(client, op, OpKind::Revoke(target), request);
        }
        if stop {
            return self.submit(client, op, OpKind::Stop, Op::Stop);
        }
        let member = new_member(value.as_deref().unwrap_or_default());
        self.record.borrow_mut().adds.push(member.clone());
        let request = self.order(Action::Add(member.clone()));
        self.submit(client, op, OpKind::Add(Box::new(member)), request)
    }

    fn read(&self, client: usize, _key: Key, op: OpId) -> CsOp {
        let mut read = self.submit(client, op, OpKind::Read, Op::Read);
        read.read = true;
        read
    }

    fn response_op(response: &Answer<Outcome>) -> OpId {
        OpId(response.id())
    }

    fn request_name(request: &Submitted<Op>) -> &'static str {
        match &request.op {
            Op::Noop => "noop",
            Op::Read => "read",
            Op::Order(_) => "order",
            Op::Evict { .. } => "evict",
            Op::Stop => "stop",
        }
    }

    fn request_kind(request: &Submitted<Op>) -> usize {
        match &request.op {
            Op::Order(_) => 1,
            Op::Stop => 2,
            Op::Read | Op::Noop => 3,
            Op::Evict { .. } => 4,
        }
    }

    fn describe_request(request: &Submitted<Op>) -> String {
        format!("submit op{} {}", request.id, describe_op(&request.op))
    }

    fn describe_response(response: &Answer<Outcome>) -> String {
        match response {
            Answer::Executed(reply) => format!(
                "executed op{} in view {}: {}",
                reply.id,
                reply.view,
                describe_outcome(&reply.result)
            ),
            Answer::Attested { reply, history } => format!(
                "executed op{} in view {} at history slot {}: {}",
                reply.id,
                reply.view,
                history
                    .peek()
                    .map_or_else(|_| "?".into(), |h| h.seq.to_string()),
                describe_outcome(&reply.result)
            ),
            Answer::Refused { id, reason } => format!("refused op{id}: {reason}"),
        }
    }

    fn describe_message(message: &C::Message) -> String {
        format!("{message:?}")
    }

    fn check(&self, history: &History, servers: &[Option<&CsServer<C>>]) -> Report {
        let checker = Checker {
            sim: self,
            record: &self.record.borrow(),
            history,
            servers,
            category: "agreement",
            violations: Vec::new(),
        };
        checker.run()
    }
}

// ---------------------------------------------------------------------------------------------
// The checker

struct Checker<'a, C: CsCore> {
    sim: &'a ConfigServiceSim<C>,
    record: &'a Record,
    history: &'a History,
    servers: &'a [Option<&'a CsServer<C>>],
    /// The property being checked, which violations are filed under.
    category: &'static str,
    violations: Vec<(&'static str, String)>,
}

impl<C: CsCore> Checker<'_, C> {
    fn violation(&mut self, explanation: String) {
        self.violations.push((self.category, explanation));
    }

    fn run(mut self) -> Report {
        self.category = "agreement";
        if self.history.ops.len() != self.record.ops.len() {
            self.violation(format!(
                "the history has {} operations but the service was asked {} times",
                self.history.ops.len(),
                self.record.ops.len()
            ));
        }
        for line in &self.record.diverged {
            self.violations.push(("agreement", line.clone()));
        }
        let agreed = self.agreement();
        self.category = "stopped-state";
        let pending = self.stopped_states(agreed.as_ref());
        self.category = "validity";
        if let Some(next) = &agreed {
            self.validity(next);
        }
        self.category = "outcomes";
        self.outcomes(agreed.as_ref(), pending.as_ref());
        self.category = "reads";
        self.reads(pending.as_ref());
        self.category = "certified";
        self.certified_in_time(agreed.as_ref());
        self.report(agreed.is_some())
    }

    /// The verdict: every violation under the property it breaks, and one entry per property
    /// saying how much it examined (`ops`), so sweeps can show that the checks had material.
    fn report(self, certified: bool) -> Report {
        let correct = self.servers.iter().flatten();
        let highest_view = correct.clone().map(|s| s.look().view).max().unwrap_or(0);
        let refused: u64 = correct.clone().map(|s| s.look().refused).sum();
        let executed = correct.map(|s| s.look().executed).max().unwrap_or(0);
        let reads = self
            .record
            .ops
            .iter()
            .filter(|op| matches!(op.outcome, Some(Outcome::State(_))))
            .count();
        let checked = self
            .record
            .ops
            .iter()
            .filter(|op| op.outcome.is_some())
            .count();
        let examined: [(&str, usize); 9] = [
            (
                "agreement",
                self.record.committed_predicate.len() + self.record.certs.len(),
            ),
            ("stopped-state", self.record.stops.len()),
            ("validity", usize::from(certified)),
            ("outcomes", checked - reads),
            ("reads", reads),
            ("certified", usize::from(certified)),
            // What the run went through, for coverage: the highest view a correct replica
            // reached, the messages correct replicas refused, the highest number executed.
            ("views", highest_view as usize),
            ("refused", refused as usize),
            ("executed", executed as usize),
        ];
        let keys = examined
            .into_iter()
            .map(|(property, ops)| KeyReport {
                key: format!("{KEY_PREFIX}{property}").into_bytes(),
                verdict: if self.violations.iter().any(|(p, _)| *p == property) {
                    KeyVerdict::Violation
                } else {
                    KeyVerdict::Linearizable
                },
                ops,
                segments: 0,
                steps: 0,
            })
            .collect();
        let violations: Vec<Violation> = self
            .violations
            .into_iter()
            .map(|(property, explanation)| Violation {
                key: format!("{KEY_PREFIX}{property}").into_bytes(),
                explanation,
                conflicting: Vec::new(),
            })
            .collect();
        Report {
            ok: violations.is_empty(),
            keys_checked: 6,
            ops_checked: checked,
            violations,
            inconclusive: Vec::new(),
            keys,
        }
    }

    /// Every certificate anyone held verifies from the genesis, and all certify one
    /// configuration: that one.
    fn agreement(&mut self) -> Option<Configuration> {
        let genesis = &self.sim.genesis;
        let mut certs: Vec<(usize, u64, ConfigCert)> = self
            .record
            .certs
            .iter()
            .map(|seen| (seen.server, seen.at, seen.what.clone()))
            .collect();
        for (index, server) in self.servers.iter().enumerate() {
            if let Some(cert) = server.and_then(|s| s.look().app.certified()) {
                certs.push((index, u64::MAX, cert.clone()));
            }
        }
        let mut agreed: Option<(usize, u64, Configuration)> = None;
        for (server, at, cert) in certs {
            let next = match verify_successor(genesis, &cert) {
                Ok(next) => next,
                Err(error) => {
                    self.violation(format!("s{server} held a certificate that does not verify from the genesis: {error}"));
                    continue;
                }
            };
            match &agreed {
                None => agreed = Some((server, at, next)),
                Some((first, first_at, config)) if *config != next => {
                    let (first, first_at, config) = (*first, *first_at, config.clone());
                    self.violation(format!(
                        "two configurations certified for epoch {}: s{first}'s (held at {}) {} and s{server}'s (held at {}) {}",
                        next.epoch.0,
                        when(first_at),
                        describe_config(&config, genesis),
                        when(at),
                        describe_config(&next, genesis)
                    ));
                }
                Some(_) => {}
            }
        }
        agreed.map(|(_, _, config)| config)
    }

    /// The certified configuration follows from the genesis by changes clients ordered, at a
    /// STOP time the epoch allows.
    fn validity(&mut self, next: &Configuration) {
        let genesis = &self.sim.genesis;
        let dropped: Vec<NodeId> = genesis
            .members
            .iter()
            .map(|m| m.id)
            .filter(|id| next.member(*id).is_none())
            .collect();
        let added: Vec<Member> = next
            .members
            .iter()
            .filter(|m| m.id.0 >= self.sim.first_new_id())
            .cloned()
            .collect();
        for member in &added {
            let new = NewMember {
                trusted_key: None,
                address: member.address,
                fingerprint: member.fingerprint,
                signing_key: member.signing_key,
            };
            if !self.record.adds.contains(&new) {
                self.violation(format!(
                    "the certified configuration adds {} ({}), which no client's order added",
                    member.id, member.address
                ));
            }
        }
        for id in &dropped {
            if !self.record.revokes.contains(id) {
                self.violation(format!(
                    "the certified configuration drops {id}, which no client's order revoked (an eviction without a quorum?)"
                ));
            }
        }
        let rebuilt = genesis.next(
            added
                .iter()
                .map(|m| NewMember {
                    trusted_key: None,
                    address: m.address,
                    fingerprint: m.fingerprint,
                    signing_key: m.signing_key,
                })
                .collect(),
            &dropped,
            next.started_at_ms,
        );
        match rebuilt {
            Ok(rebuilt) if rebuilt == *next => {}
            Ok(_) => self.violation(format!(
                "the certified configuration {} is not the genesis's successor by its own changes",
                describe_config(next, genesis)
            )),
            Err(error) => self.violation(format!(
                "the certified configuration's changes do not apply to the genesis: {error}"
            )),
        }
        let due = self.sim.stop_due();
        if next.started_at_ms < due {
            self.violation(format!(
                "epoch {} begins at {}, before the STOP of epoch {} was allowed ({due})",
                next.epoch.0, next.started_at_ms, genesis.epoch.0
            ));
        }
        let first_stop = self
            .record
            .stops
            .iter()
            .filter(|seen| seen.honest)
            .map(|seen| seen.at)
            .min();
        if let Some(first) = first_stop
            && next.started_at_ms > first.saturating_add(genesis.stop_delta_ms)
        {
            self.violation(format!(
                "epoch {} begins at {}, more than {} ms after a correct replica first executed the STOP ({first}): a clock reading from the future was agreed",
                next.epoch.0, next.started_at_ms, genesis.stop_delta_ms
            ));
        }
    }

    /// Every correct replica that executed STOP holds one pending state, the certified one's.
    fn stopped_states(&mut self, agreed: Option<&Configuration>) -> Option<Pending> {
        let mut states: Vec<(usize, u64, Pending)> = self
            .record
            .stops
            .iter()
            .filter(|seen| seen.honest)
            .map(|seen| (seen.server, seen.at, seen.what.clone()))
            .collect();
        for (index, server) in self.servers.iter().enumerate() {
            if let Some(server) = server {
                let pending = server.look().app.pending();
                if pending.stopped_at.is_some() {
                    states.push((index, u64::MAX, pending.clone()));
                }
            }
        }
        let mut first: Option<(usize, u64, Pending)> = None;
        for (server, at, pending) in states {
            match &first {
                None => first = Some((server, at, pending)),
                Some((s, a, p)) if *p != pending => {
                    let line = format!(
                        "correct replicas executed STOP from different states: s{s} at {} ({}) and s{server} at {} ({})",
                        when(*a),
                        describe_pending(p),
                        when(at),
                        describe_pending(&pending)
                    );
                    self.violation(line);
                }
                Some(_) => {}
            }
        }
        let pending = first.map(|(_, _, pending)| pending)?;
        if let Some(next) = agreed {
            let dropped: Vec<NodeId> = pending.dropped.iter().copied().collect();
            let expected = pending
                .stopped_at
                .map(|at| self.sim.genesis.next(pending.added.clone(), &dropped, at));
            match expected {
                Some(Ok(expected)) if expected == *next => {}
                _ => self.violation(format!(
                    "the certified configuration {} is not the one the STOPped state ({}) gives",
                    describe_config(next, &self.sim.genesis),
                    describe_pending(&pending)
                )),
            }
        }
        Some(pending)
    }

    /// What correct clients were told agrees with the outcome.
    fn outcomes(&mut self, agreed: Option<&Configuration>, pending: Option<&Pending>) {
        let first_new = self.sim.first_new_id();
        let next_epoch = Epoch(self.sim.genesis.epoch.0 + 1);
        let mut stopped: Option<(u64, Digest)> = None;
        // An operation told the epoch ended, when no correct replica was seen to execute STOP.
        let mut ended: Option<usize> = None;
        for (at, op) in self.record.ops.iter().enumerate() {
            let Some(outcome) = &op.outcome else {
                continue;
            };
            let who = format!(
                "client {} op {} ({})",
                op.client_name(),
                op.op.0,
                op.kind.describe()
            );
            match (&op.kind, outcome) {
                (OpKind::Add(member), Outcome::Accepted { epoch, node }) => {
                    let Some(node) = node else {
                        self.violation(format!("{who} was accepted without an id"));
                        continue;
                    };
                    if *epoch != next_epoch {
                        self.violation(format!("{who} was accepted for epoch {}", epoch.0));
                    }
                    if let Some(pending) = pending {
                        let position = node.0.checked_sub(first_new).map(|p| p as usize);
                        if position.and_then(|p| pending.added.get(p)) != Some(member) {
                            self.violation(format!(
                                "{who} was accepted as {node}, but the STOPped state ({}) does not add it there",
                                describe_pending(pending)
                            ));
                        }
                    }
                    if let Some(next) = agreed
                        && next.member(*node) != Some(&member.clone().with_id(*node))
                    {
                        self.violation(format!(
                            "{who} was accepted as {node}, but the certified configuration {} does not have it",
                            describe_config(next, &self.sim.genesis)
                        ));
                    }
                }
                (OpKind::Revoke(target), Outcome::Accepted { epoch, node }) => {
                    if *epoch != next_epoch || *node != Some(*target) {
                        self.violation(format!(
                            "{who} was accepted as {node:?} for epoch {}",
                            epoch.0
                        ));
                    }
                    if let Some(pending) = pending
                        && !pending.dropped.contains(target)
                    {
                        self.violation(format!(
                            "{who} was accepted, but the STOPped state ({}) keeps {target}",
                            describe_pending(pending)
                        ));
                    }
                    if let Some(next) = agreed
                        && next.member(*target).is_some()
                    {
                        self.violation(format!(
                            "{who} was accepted, but the certified configuration {} keeps {target}",
                            describe_config(next, &self.sim.genesis)
                        ));
                    }
                }
                (OpKind::Add(_) | OpKind::Revoke(_) | OpKind::Stop, Outcome::Rejected(_)) => {}
                (OpKind::Add(_) | OpKind::Revoke(_) | OpKind::Stop, Outcome::Ended { next }) => {
                    if *next != next_epoch {
                        self.violation(format!("{who} was told to submit to epoch {}", next.0));
                    }
                    if pending.is_none() && agreed.is_none() && ended.is_none() {
                        ended = Some(at);
                    }
                }
                (
                    OpKind::Stop | OpKind::Add(_) | OpKind::Revoke(_),
                    Outcome::Stopped { epoch, digest },
                ) => {
                    if !matches!(op.kind, OpKind::Stop) {
                        self.violation(format!("{who} was answered as a STOP"));
                    }
                    if *epoch != next_epoch {
                        self.violation(format!("{who} stopped into epoch {}", epoch.0));
                    }
                    match stopped {
                        None => stopped = Some((at as u64, *digest)),
                        Some((_, first)) if first != *digest => {
                            self.violation(format!(
                                "{who} saw epoch {} as {digest:?}, another client as {first:?}",
                                epoch.0
                            ));
                        }
                        Some(_) => {}
                    }
                    if let Some(next) = agreed
                        && next.digest() != *digest
                    {
                        self.violation(format!(
                            "{who} saw epoch {} as {digest:?}, but the certified configuration is {:?}",
                            epoch.0,
                            next.digest()
                        ));
                    }
                }
                (OpKind::Read, Outcome::State(_)) => {}
                (_, outcome) => {
                    self.violation(format!("{who} was answered {}", describe_outcome(outcome)));
                }
            }
        }
        if let Some(at) = ended {
            let op = &self.record.ops[at];
            let line = format!(
                "client {} op {} ({}) was told the epoch ended, but no correct replica executed a STOP",
                op.client_name(),
                op.op.0,
                op.kind.describe()
            );
            self.violation(line);
        }
    }

    /// Reads return states that grow with the execution order and in real time: each a prefix
    /// of the STOPped state, holding every change acknowledged before it began.
    fn reads(&mut self, pending: Option<&Pending>) {
        let genesis_epoch = self.sim.genesis.epoch;
        let ops = &self.record.ops;
        let times = |at: usize| self.history.ops.get(at).map(|op| (op.invoke, op.complete));
        let mut reads: Vec<(usize, u64, u64, &Pending)> = Vec::new();
        let mut acknowledged: Vec<(usize, u64)> = Vec::new();
        for (at, op) in ops.iter().enumerate() {
            let Some((invoke, complete)) = times(at) else {
                continue;
            };
            match (&op.kind, &op.outcome) {
                (OpKind::Read, Some(Outcome::State(state))) => {
                    reads.push((at, invoke, complete.unwrap_or(invoke), state));
                }
                (OpKind::Add(_) | OpKind::Revoke(_), Some(Outcome::Accepted { .. })) => {
                    acknowledged.push((at, complete.unwrap_or(invoke)));
                }
                _ => {}
            }
        }
        let mut lines = Vec::new();
        for &(at, invoke, _, state) in &reads {
            let who = format!("read op {} (invoked at {invoke}ms)", ops[at].op.0);
            if state.epoch != genesis_epoch {
                lines.push(format!(
                    "{who} returned the state of epoch {}",
                    state.epoch.0
                ));
            }
            for member in &state.added {
                if !self.record.adds.contains(member) {
                    lines.push(format!(
                        "{who} returned an ADD of {} no client ordered",
                        member.address
                    ));
                }
            }
            for id in &state.dropped {
                if !self.record.revokes.contains(id) {
                    lines.push(format!(
                        "{who} returned {id} as dropped, which no client revoked"
                    ));
                }
            }
            if let Some(pending) = pending
                && !below(state, pending)
            {
                lines.push(format!(
                    "{who} returned a state ({}) that is not a prefix of the STOPped one ({})",
                    describe_pending(state),
                    describe_pending(pending)
                ));
            }
            for &(ack, completed) in &acknowledged {
                if completed >= invoke {
                    continue;
                }
                let present = match &ops[ack].kind {
                    OpKind::Add(member) => state.added.contains(member),
                    OpKind::Revoke(id) => state.dropped.contains(id),
                    _ => true,
                };
                if !present {
                    lines.push(format!(
                        "{who} returned a state ({}) without client {} op {} ({}), acknowledged at {completed}ms",
                        describe_pending(state),
                        ops[ack].client_name(),
                        ops[ack].op.0,
                        ops[ack].kind.describe()
                    ));
                }
            }
        }
        for (i, &(a, _, a_done, a_state)) in reads.iter().enumerate() {
            for &(b, b_invoke, _, b_state) in &reads[i + 1..] {
                let ordered = below(a_state, b_state) || below(b_state, a_state);
                if !ordered {
                    lines.push(format!(
                        "read ops {} and {} returned states that no order of execution gives: {} and {}",
                        ops[a].op.0,
                        ops[b].op.0,
                        describe_pending(a_state),
                        describe_pending(b_state)
                    ));
                } else if a_done < b_invoke && !below(a_state, b_state) {
                    lines.push(format!(
                        "read op {} (done at {a_done}ms) returned {}, and the later read op {} returned less: {}",
                        ops[a].op.0,
                        describe_pending(a_state),
                        ops[b].op.0,
                        describe_pending(b_state)
                    ));
                }
            }
        }
        for line in lines {
            self.violation(line);
        }
    }

    /// An epoch long past due when correct clients were still being served must have been
    /// certified by the end of the run.
    fn certified_in_time(&mut self, agreed: Option<&Configuration>) {
        let due = self.sim.stop_due() + self.sim.genesis.stop_delta_ms;
        let last = self.history.ops.iter().filter_map(|op| op.complete).max();
        if agreed.is_some() {
            // Once certified, every correct replica up at the end that executed the STOP holds
            // the certificate too (it collects the shares it missed, after a restart or a state
            // transfer, from replicas that have it), given time.
            if last.is_some_and(|last| last >= due + CERTIFY_WITHIN_MS) {
                let lacking: Vec<usize> = self
                    .servers
                    .iter()
                    .enumerate()
                    .filter_map(|(index, server)| server.map(|s| (index, s)))
                    .filter(|(_, server)| {
                        let app = server.look().app;
                        app.pending().stopped_at.is_some() && app.certified().is_none()
                    })
                    .map(|(index, _)| index)
                    .collect();
                if !lacking.is_empty() {
                    self.violation(format!(
                        "correct replicas {lacking:?} executed the STOP but never assembled the certificate"
                    ));
                }
            }
            return;
        }
        if let Some(last) = last
            && last >= due + CERTIFY_WITHIN_MS
        {
            self.violation(format!(
                "epoch {} was due at {due}ms and clients were served until {last}ms, but no replica holds a certificate for epoch {}",
                self.sim.genesis.epoch.0,
                self.sim.genesis.epoch.0 + 1
            ));
        }
    }
}

impl OpRecord {
    fn client_name(&self) -> String {
        self.client.to_string()
    }
}

impl OpKind {
    fn describe(&self) -> String {
        match self {
            OpKind::Add(member) => format!("add {}", member.address),
            OpKind::Revoke(id) => format!("revoke {id}"),
            OpKind::Stop => "stop".into(),
            OpKind::Read => "read".into(),
        }
    }
}

/// Whether state `a` can precede state `b` in one execution: `b` extends `a`.
fn below(a: &Pending, b: &Pending) -> bool {
    a.epoch == b.epoch
        && b.added.starts_with(&a.added)
        && a.dropped.is_subset(&b.dropped)
        && (a.stopped_at.is_none() || a.stopped_at == b.stopped_at)
}

fn when(at: u64) -> String {
    if at == u64::MAX {
        "the end".into()
    } else {
        format!("{at}ms")
    }
}

fn describe_config(config: &Configuration, genesis: &Configuration) -> String {
    let added: Vec<u32> = config
        .members
        .iter()
        .map(|m| m.id.0)
        .filter(|id| *id >= genesis.next_node_id)
        .collect();
    let dropped: Vec<u32> = genesis
        .members
        .iter()
        .map(|m| m.id.0)
        .filter(|id| config.member(NodeId(*id)).is_none())
        .collect();
    format!(
        "(epoch {}, adds {added:?}, drops {dropped:?}, starts at {})",
        config.epoch.0, config.started_at_ms
    )
}

/// Runs one seed of the configuration service (`config.protocol` is ignored).
pub fn run(seed: u64, config: &SimConfig) -> crate::sim::RunResult {
    crate::sim::run_service::<ConfigServiceSim>(seed, config)
}

/// Sweeps `seeds` of the configuration service over `threads` threads.
pub fn sweep(
    seeds: std::ops::Range<u64>,
    config: &SimConfig,
    threads: usize,
) -> crate::sim::SweepSummary {
    crate::sim::sweep_service::<ConfigServiceSim>(seeds, config, threads)
}

/// The first failing seed of the configuration service in `seeds`.
pub fn first_failure(
    seeds: std::ops::Range<u64>,
    config: &SimConfig,
    threads: usize,
) -> crate::sim::FirstFailure {
    crate::sim::first_failure_service::<ConfigServiceSim>(seeds, config, threads)
}

/// The command that replays `seed` of the configuration service under `config`.
pub fn replay_command(config: &SimConfig, seed: u64) -> String {
    config.service_replay_command(seed, "cs")
}

/// The properties whose violation is a broken safety promise of the configuration service (as
/// opposed to liveness).
pub const SAFETY: [&str; 5] = [
    "agreement",
    "stopped-state",
    "validity",
    "outcomes",
    "reads",
];

/// The first seed below `bound` on which the configuration service on core `C`, run under
/// `broken` (a configuration with a mutation), breaks a safety promise while `reference` (the
/// same without it) passes the same seed: a negative control's verdict, with the violation.
/// Seeds that fail otherwise (a mutated run can also lose liveness) are skipped.
pub fn caught_on_safety<C: CsCore>(
    reference: &SimConfig,
    broken: &SimConfig,
    bound: u64,
    threads: usize,
) -> Option<(u64, String)> {
    let mut start = 0;
    while start < bound {
        let found =
            crate::sim::first_failure_service::<ConfigServiceSim<C>>(start..bound, broken, threads);
        let (seed, _) = found.failure?;
        start = seed + 1;
        let failed = crate::sim::run_service::<ConfigServiceSim<C>>(seed, broken);
        let safety = failed.report.violations.iter().find(|v| {
            SAFETY
                .iter()
                .any(|property| v.key == format!("{KEY_PREFIX}{property}").into_bytes())
        });
        let Some(violation) = safety else {
            continue;
        };
        if !crate::sim::run_service::<ConfigServiceSim<C>>(seed, reference).passed() {
            continue;
        }
        return Some((
            seed,
            format!(
                "{}: {}",
                String::from_utf8_lossy(&violation.key),
                violation.explanation
            ),
        ));
    }
    None
}

/// The command that replays `seed` of the configuration service on A2M-PBFT-E.
pub fn replay_command_e(config: &SimConfig, seed: u64) -> String {
    config.service_replay_command(seed, "cs-e")
}

/// Runs one seed of the configuration service on A2M-PBFT-E.
pub fn run_e(seed: u64, config: &SimConfig) -> crate::sim::RunResult {
    crate::sim::run_service::<ConfigServiceSim<PbftE>>(seed, config)
}

/// Sweeps `seeds` of the configuration service on A2M-PBFT-E over `threads` threads.
pub fn sweep_e(
    seeds: std::ops::Range<u64>,
    config: &SimConfig,
    threads: usize,
) -> crate::sim::SweepSummary {
    crate::sim::sweep_service::<ConfigServiceSim<PbftE>>(seeds, config, threads)
}

/// The command that replays `seed` of the configuration service on A2M-PBFT-EA.
pub fn replay_command_ea(config: &SimConfig, seed: u64) -> String {
    config.service_replay_command(seed, "cs-ea")
}

/// Runs one seed of the configuration service on A2M-PBFT-EA.
pub fn run_ea(seed: u64, config: &SimConfig) -> crate::sim::RunResult {
    crate::sim::run_service::<ConfigServiceSim<Ea>>(seed, config)
}

/// Sweeps `seeds` of the configuration service on A2M-PBFT-EA over `threads` threads.
pub fn sweep_ea(
    seeds: std::ops::Range<u64>,
    config: &SimConfig,
    threads: usize,
) -> crate::sim::SweepSummary {
    crate::sim::sweep_service::<ConfigServiceSim<Ea>>(seeds, config, threads)
}
