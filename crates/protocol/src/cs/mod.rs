//! The configuration service (Rosebud §3): the replicated state machine that decides who is in
//! the system for the next epoch, ordered by PBFT (`crate::pbft`) among the epoch's CS replicas.
//!
//! One instance serves one epoch `e`, started from the certified configuration of `e` and nothing
//! else (Rosebud §3.7: no state passes between CS generations). Its replicated state is the set of
//! changes accepted for `e+1`: ADDed nodes in order, REVOKEd and EVICTed ids, and whether the
//! epoch has been STOPped. Operations:
//!
//! - **ADD** and **REVOKE** are orders signed by the trusted authority, bound to the epoch they are
//!   for, so a replayed order from an earlier epoch is refused rather than re-applied. ADD takes
//!   effect in the next epoch, where the node receives the next unused id.
//! - **EVICT** carries `2f_cs+1` signed agreements from distinct CS replicas of this epoch
//!   (each over `(epoch, node, voter)`, so none can be replayed in another epoch).
//! - **STOP** ends the epoch. The primary proposes its clock reading with the batch (BASE's
//!   non-deterministic choice); a backup prepares a batch holding a STOP only if that reading is
//!   within `stop_delta_ms` of its own clock, and the STOP executes only if the agreed reading is
//!   at least `t_epoch − delta` after the epoch began. After STOP, the next configuration is
//!   `members − (REVOKEd ∪ EVICTed) + ADDed`, computed by every replica alike; each signs its
//!   exact encoding and sends the signature to the others, and `2f_cs+1` signatures make the
//!   configuration certificate. Everything submitted after STOP is refused: it belongs to the
//!   next epoch's CS.
//!
//! Time here is wall-clock milliseconds (the node feeds its system clock; the simulator its
//! virtual one): the epoch's start is a wall-clock reading agreed by the previous STOP, and a
//! replica that restarts must still judge STOP proposals against it. Correct replicas' clocks
//! must agree within `stop_delta_ms` for STOP to be accepted; other batches do not depend on it.

pub mod monitor;

use crate::pbft::{self, App, AppOutput, Params};
use bulwark_core::configuration::{ConfigCert, Configuration, NewMember};
use bulwark_core::crypto::Digest;
use bulwark_core::sign::{Context, SecretKey, Signable, Signature, Signed, Unverified};
use bulwark_core::{Epoch, NodeId, ServiceId, Slot, Time, wire};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The service frames to and from the configuration service carry.
pub const SERVICE: ServiceId = ServiceId::CONFIG;

/// What the trusted authority orders for the next epoch.
// Orders are few and short-lived; boxing the member would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Admit a node.
    Add(NewMember),
    /// Remove a member.
    Revoke(NodeId),
}

/// An authority's order, bound to the epoch whose CS may execute it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The epoch it is submitted in (it takes effect in the next).
    pub epoch: Epoch,
    /// What to do.
    pub action: Action,
}

impl Signable for Order {
    const CONTEXT: Context = Context::new("bulwark.cs.order.v1");
    const BYTES_MAX: usize = 512;
}

/// A CS replica's agreement to evict `node` in `epoch` (Rosebud §3.3, with the spec's binding of
/// epoch and voter).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictVote {
    /// The epoch.
    pub epoch: Epoch,
    /// The node to evict.
    pub node: NodeId,
    /// The CS replica agreeing.
    pub voter: NodeId,
}

impl Signable for EvictVote {
    const CONTEXT: Context = Context::new("bulwark.cs.evict.v1");
    const BYTES_MAX: usize = 64;
}

/// An operation on the configuration service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Nothing: measures the service, and confirms it is reachable.
    Noop,
    /// The pending changes and whether the epoch ended.
    Read,
    /// An authority-signed ADD or REVOKE.
    Order(Unverified<Order>),
    /// An eviction with the CS replicas' signed agreements.
    Evict {
        /// The node.
        node: NodeId,
        /// Agreements, each with its voter.
        votes: Vec<(NodeId, Unverified<EvictVote>)>,
    },
    /// End the epoch.
    Stop,
}

/// What the configuration service answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A no-op executed.
    Done,
    /// The change is accepted; it takes effect in `epoch`.
    Accepted {
        /// The epoch it takes effect in.
        epoch: Epoch,
        /// For an ADD, the id the node will have.
        node: Option<NodeId>,
    },
    /// The operation was valid but cannot apply now.
    Rejected(String),
    /// The epoch ended: the next configuration is `epoch` with this digest.
    Stopped {
        /// The next epoch.
        epoch: Epoch,
        /// The digest of its configuration.
        digest: Digest,
    },
    /// The state, for [`Op::Read`].
    State(Pending),
    /// The epoch ended before the operation was ordered: submit it to the next epoch's CS.
    Ended {
        /// The next epoch.
        next: Epoch,
    },
}

/// The replicated state: changes accepted for the next epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The epoch this instance serves.
    pub epoch: Epoch,
    /// ADDed nodes, in the order they will receive ids.
    pub added: Vec<NewMember>,
    /// REVOKEd and EVICTed members.
    pub dropped: BTreeSet<NodeId>,
    /// The agreed time of the STOP, once the epoch ended.
    pub stopped_at: Option<u64>,
}

/// What CS replicas tell each other outside agreement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum CsMessage {
    /// The sender's signature over the next configuration's encoding.
    Share {
        /// The next epoch.
        epoch: Epoch,
        /// The signature.
        signature: Signature,
        /// The sender is still collecting shares: a replica that has the certificate answers
        /// with its own (and never answers an answer).
        collecting: bool,
    },
}

/// What a CS replica keeps durable besides the PBFT log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CsChange {
    /// The next configuration, certified.
    Certified(ConfigCert),
}

/// The configuration service's state machine on one CS replica.
pub struct ConfigService {
    config: Configuration,
    /// This replica's node and key (shares and eviction votes are signed with it).
    node: NodeId,
    secret: SecretKey,
    /// The CS replicas, by slot.
    cs: Vec<NodeId>,
    pending: Pending,
    /// The next configuration once STOP executed (derived, not replicated state of its own).
    next: Option<(Configuration, Bytes)>,
    /// Shares received, by signer, checked once the next configuration is known.
    shares: BTreeMap<NodeId, Signature>,
    certified: Option<ConfigCert>,
    /// When this replica last asked for the epoch to end.
    stop_asked: Option<Time>,
    /// When it last sent its share.
    share_sent: Option<Time>,
}

/// How often a replica repeats a STOP or its share until the epoch is certified.
const REPEAT_MS: u64 = 1_000;

impl ConfigService {
    /// The service of `config`'s epoch on the CS replica `node`, signing with `secret`.
    pub fn new(
        config: Configuration,
        node: NodeId,
        secret: SecretKey,
    ) -> Result<ConfigService, String> {
        let cs = config.cs();
        if !cs.contains(&node) {
            return Err(format!(
                "{node} is not a configuration-service replica of epoch {}",
                config.epoch.0
            ));
        }
        let pending = Pending {
            epoch: config.epoch,
            ..Pending::default()
        };
        Ok(ConfigService {
            config,
            node,
            secret,
            cs,
            pending,
            next: None,
            shares: BTreeMap::new(),
            certified: None,
            stop_asked: None,
            share_sent: None,
        })
    }

    /// The PBFT setup for `config`'s CS, as replica `node`: slots in CS order, the members'
    /// keys, and the configuration's digest as the instance (votes of one epoch's CS never count
    /// in another's).
    pub fn setup(
        config: &Configuration,
        node: NodeId,
        secret: SecretKey,
    ) -> Result<pbft::Setup<ConfigService>, String> {
        let cs = config.cs();
        let me = cs
            .iter()
            .position(|id| *id == node)
            .ok_or_else(|| format!("{node} is not in the configuration service"))?;
        let keys = cs
            .iter()
            .map(|id| {
                config
                    .member(*id)
                    .map(|member| member.signing_key)
                    .ok_or_else(|| format!("CS replica {id} is not a member"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let params = Params::new(config.f_cs as usize);
        let app = ConfigService::new(config.clone(), node, secret.clone())?;
        Ok(pbft::Setup {
            params,
            me: Slot(me as u32),
            secret,
            keys,
            instance: config.digest(),
            app,
        })
    }

    /// The configuration this instance serves.
    pub fn config(&self) -> &Configuration {
        &self.config
    }

    /// The changes accepted so far.
    pub fn pending(&self) -> &Pending {
        &self.pending
    }

    /// The next configuration's certificate, once `2f_cs+1` replicas signed it.
    pub fn certified(&self) -> Option<&ConfigCert> {
        self.certified.as_ref()
    }

    /// Signs this replica's agreement to evict `node` in this epoch.
    pub fn evict_vote(&self, node: NodeId) -> Option<(NodeId, Unverified<EvictVote>)> {
        let vote = EvictVote {
            epoch: self.config.epoch,
            node,
            voter: self.node,
        };
        Signed::sign(&self.secret, vote)
            .ok()
            .map(|signed| (self.node, signed.to_unverified()))
    }

    /// Every ADDed node must be a new principal and every drop must leave enough members: checked
    /// when an operation executes, so that STOP can always compute the next configuration.
    fn admissible(&self, added: &[NewMember], dropped: &BTreeSet<NodeId>) -> Result<(), String> {
        self.config
            .next(
                added.to_vec(),
                &dropped.iter().copied().collect::<Vec<_>>(),
                self.config.started_at_ms,
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn check_evict(
        &self,
        node: NodeId,
        votes: &[(NodeId, Unverified<EvictVote>)],
    ) -> Result<(), String> {
        if self.config.member(node).is_none() {
            return Err(format!("{node} is not a member"));
        }
        if votes.len() > self.cs.len() {
            return Err(format!(
                "{} agreements from {} CS replicas",
                votes.len(),
                self.cs.len()
            ));
        }
        let mut voters = BTreeSet::new();
        for (voter, vote) in votes {
            if !self.cs.contains(voter) {
                return Err(format!(
                    "{voter} is not a CS replica of epoch {}",
                    self.config.epoch.0
                ));
            }
            let key = self
                .config
                .member(*voter)
                .map(|member| member.signing_key)
                .ok_or_else(|| format!("{voter} is not a member"))?;
            let vote = vote
                .clone()
                .verify(&key)
                .map_err(|e| format!("{voter}'s agreement to evict: {e}"))?
                .into_value();
            if vote.epoch != self.config.epoch || vote.node != node || vote.voter != *voter {
                return Err(format!("{voter}'s agreement is for another eviction"));
            }
            if !voters.insert(*voter) {
                return Err(format!("{voter} agrees twice"));
            }
        }
        let needed = self.config.cs_quorum();
        if voters.len() < needed {
            return Err(format!(
                "{} agreements to evict {node}; {needed} needed",
                voters.len()
            ));
        }
        Ok(())
    }

    fn stop_due(&self) -> u64 {
        self.config
            .started_at_ms
            .saturating_add(self.config.t_epoch_ms)
            .saturating_sub(self.config.stop_delta_ms)
    }

    fn execute_stop(&mut self, nondet: u64, out: &mut AppOutput<Self>) -> Outcome {
        let due = self.stop_due();
        if nondet < due {
            return Outcome::Rejected(format!(
                "epoch {} cannot end for another {} ms (it lasts {} ms, less a tolerance of {} ms)",
                self.config.epoch.0,
                due - nondet,
                self.config.t_epoch_ms,
                self.config.stop_delta_ms
            ));
        }
        let dropped: Vec<NodeId> = self.pending.dropped.iter().copied().collect();
        let next = match self
            .config
            .next(self.pending.added.clone(), &dropped, nondet)
        {
            Ok(next) => next,
            Err(error) => return Outcome::Rejected(format!("the next configuration: {error}")),
        };
        self.pending.stopped_at = Some(nondet);
        let outcome = Outcome::Stopped {
            epoch: next.epoch,
            digest: next.digest(),
        };
        let bytes = Bytes::from(next.encode());
        let signature = ConfigCert::share(&self.secret, &bytes);
        self.shares.insert(self.node, signature);
        out.sends.push((
            None,
            CsMessage::Share {
                epoch: next.epoch,
                signature,
                collecting: true,
            },
        ));
        self.next = Some((next, bytes));
        self.collect(out);
        outcome
    }

    /// With `2f_cs+1` good shares, the certificate (made durable).
    fn collect(&mut self, out: &mut AppOutput<Self>) {
        if self.certified.is_some() {
            return;
        }
        let Some((next, bytes)) = &self.next else {
            return;
        };
        let config = &self.config;
        self.shares.retain(|signer, signature| {
            ConfigCert::verify_share(config, *signer, bytes, signature)
        });
        if self.shares.len() < config.cs_quorum() {
            return;
        }
        let cert = ConfigCert {
            bytes: bytes.clone(),
            signatures: self.shares.iter().map(|(n, s)| (*n, *s)).collect(),
        };
        debug_assert_eq!(next.epoch.0, config.epoch.0 + 1);
        match bulwark_core::configuration::verify_successor(config, &cert) {
            Ok(_) => {
                out.changes.push(CsChange::Certified(cert.clone()));
                self.certified = Some(cert);
            }
            Err(error) => debug_assert!(false, "checked shares made a bad certificate: {error}"),
        }
    }
}

/// The largest encoded operation: an eviction with a full CS's agreements.
const OP_BYTES_MAX: usize = 64 * 1024;

impl App for ConfigService {
    const SERVICE: ServiceId = SERVICE;
    const OP_BYTES_MAX: usize = OP_BYTES_MAX;
    const SNAPSHOT_BYTES_MAX: usize = 2 * bulwark_core::configuration::BYTES_MAX;
    type Op = Op;
    type Result = Outcome;
    type Message = CsMessage;
    type Change = CsChange;

    fn check_op(&self, op: &Op) -> Result<(), String> {
        if wire::encode(op).len() > OP_BYTES_MAX {
            return Err("operation too large".into());
        }
        match op {
            Op::Noop | Op::Read | Op::Stop => Ok(()),
            Op::Order(order) => {
                let order = order
                    .clone()
                    .verify(&self.config.authority)
                    .map_err(|e| format!("an order not signed by the authority: {e}"))?
                    .into_value();
                if order.epoch != self.config.epoch {
                    return Err(format!(
                        "an order for epoch {} submitted in epoch {}",
                        order.epoch.0, self.config.epoch.0
                    ));
                }
                Ok(())
            }
            Op::Evict { node, votes } => self.check_evict(*node, votes),
        }
    }

    fn propose(&self, now: Time) -> u64 {
        now.0
    }

    fn check_proposal(&self, now: Time, nondet: u64, ops: &[&Op]) -> Result<(), String> {
        if !ops.iter().any(|op| matches!(op, Op::Stop)) {
            return Ok(());
        }
        if nondet.abs_diff(now.0) > self.config.stop_delta_ms {
            return Err(format!(
                "a STOP proposed at {nondet}, {} ms from this replica's clock ({})",
                nondet.abs_diff(now.0),
                now.0
            ));
        }
        Ok(())
    }

    fn execute(&mut self, op: &Op, nondet: u64, _seq: u64, out: &mut AppOutput<Self>) -> Outcome {
        let next_epoch = Epoch(self.config.epoch.0 + 1);
        if self.pending.stopped_at.is_some() && !matches!(op, Op::Read | Op::Noop) {
            return Outcome::Ended { next: next_epoch };
        }
        match op {
            Op::Noop => Outcome::Done,
            Op::Read => Outcome::State(self.pending.clone()),
            Op::Stop => self.execute_stop(nondet, out),
            Op::Order(order) => {
                // check_op verified it before it was ordered; decode the signed bytes again.
                let Ok(order) = wire::decode::<Order>(order.bytes(), Order::BYTES_MAX) else {
                    return Outcome::Rejected("an undecodable order".into());
                };
                match order.action {
                    Action::Add(member) => {
                        if self.pending.added.contains(&member) {
                            return Outcome::Rejected("that node is already being added".into());
                        }
                        let mut added = self.pending.added.clone();
                        added.push(member);
                        if let Err(reason) = self.admissible(&added, &self.pending.dropped) {
                            return Outcome::Rejected(reason);
                        }
                        let node =
                            NodeId(self.config.next_node_id + self.pending.added.len() as u32);
                        self.pending.added = added;
                        Outcome::Accepted {
                            epoch: next_epoch,
                            node: Some(node),
                        }
                    }
                    Action::Revoke(node) => self.drop_member(node, next_epoch),
                }
            }
            Op::Evict { node, .. } => self.drop_member(*node, next_epoch),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        wire::encode(&self.pending)
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let pending: Pending =
            wire::decode(snapshot, Self::SNAPSHOT_BYTES_MAX).map_err(|e| e.to_string())?;
        if pending.epoch != self.config.epoch {
            return Err(format!("a state of epoch {}", pending.epoch.0));
        }
        self.pending = pending;
        self.next = None;
        if let Some(at) = self.pending.stopped_at {
            let dropped: Vec<NodeId> = self.pending.dropped.iter().copied().collect();
            let next = self
                .config
                .next(self.pending.added.clone(), &dropped, at)
                .map_err(|e| e.to_string())?;
            let bytes = Bytes::from(next.encode());
            self.shares
                .insert(self.node, ConfigCert::share(&self.secret, &bytes));
            self.next = Some((next, bytes));
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        _now: Time,
        from: Slot,
        message: CsMessage,
        out: &mut AppOutput<Self>,
    ) {
        let CsMessage::Share {
            epoch,
            signature,
            collecting,
        } = message;
        let Some(signer) = self.cs.get(from.index()).copied() else {
            return;
        };
        if epoch.0 != self.config.epoch.0 + 1 {
            return;
        }
        if self.certified.is_some() {
            // The sender still collects (it restarted, or reached the STOP by state transfer):
            // it needs this replica's share, which it may have missed.
            if collecting && let Some((_, bytes)) = &self.next {
                let signature = ConfigCert::share(&self.secret, bytes);
                out.sends.push((
                    Some(from),
                    CsMessage::Share {
                        epoch,
                        signature,
                        collecting: false,
                    },
                ));
            }
            return;
        }
        self.shares.insert(signer, signature);
        self.collect(out);
    }

    fn on_tick(&mut self, now: Time, out: &mut AppOutput<Self>) {
        let repeat =
            |last: Option<Time>| last.is_none_or(|at| now.0 >= at.0.saturating_add(REPEAT_MS));
        let due = now.0 >= self.stop_due().saturating_add(self.config.stop_delta_ms);
        if self.pending.stopped_at.is_none() && due && repeat(self.stop_asked) {
            self.stop_asked = Some(now);
            out.submit.push((self.config.epoch.0, Op::Stop));
        }
        // Shares that arrived before this replica knew the next configuration (it restarted, or
        // installed the STOP by state transfer) count once it does.
        self.collect(out);
        if self.certified.is_none()
            && let Some((_, bytes)) = &self.next
            && repeat(self.share_sent)
        {
            self.share_sent = Some(now);
            let signature = ConfigCert::share(&self.secret, bytes);
            out.sends.push((
                None,
                CsMessage::Share {
                    epoch: Epoch(self.config.epoch.0 + 1),
                    signature,
                    collecting: true,
                },
            ));
        }
    }

    fn replay(&mut self, change: &CsChange) {
        let CsChange::Certified(cert) = change;
        if bulwark_core::configuration::verify_successor(&self.config, cert).is_ok() {
            self.certified = Some(cert.clone());
        }
    }
}

impl ConfigService {
    fn drop_member(&mut self, node: NodeId, next_epoch: Epoch) -> Outcome {
        if self.config.member(node).is_none() {
            return Outcome::Rejected(format!("{node} is not a member"));
        }
        if self.pending.dropped.contains(&node) {
            return Outcome::Rejected(format!("{node} is already leaving"));
        }
        let mut dropped = self.pending.dropped.clone();
        dropped.insert(node);
        if let Err(reason) = self.admissible(&self.pending.added, &dropped) {
            return Outcome::Rejected(reason);
        }
        self.pending.dropped = dropped;
        Outcome::Accepted {
            epoch: next_epoch,
            node: Some(node),
        }
    }
}
