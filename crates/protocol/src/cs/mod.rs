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
use bulwark_core::configuration::{ConfigCert, Configuration, CsProtocol, NewMember};
use bulwark_core::crypto::Digest;
use bulwark_core::sign::{Context, SecretKey, Signable, Signature, Signed, Unverified};
use bulwark_core::{ClientId, Epoch, NodeId, ServiceId, Slot, Time, wire};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The service frames to and from the configuration service carry.
pub const SERVICE: ServiceId = ServiceId::CONFIG;

/// The first of the six trusted-log logs a CS replica on A2M-PBFT-EA keeps, every epoch's
/// instance in a slot range of its own (A2M-Storage's volumes use `1 << 40` and up).
pub const CS_LOGS: bulwark_core::a2m::LogId = 1 << 32;

/// The request-history log a CS replica on A2M-PBFT-E keeps (after EA's six), every epoch's
/// instance in a slot range of its own as on EA.
pub const CS_HISTORY_LOG: bulwark_core::a2m::LogId = CS_LOGS + 6;

/// Every CS replica's trusted-log key, in slot order.
fn trusted_keys(config: &Configuration) -> Result<Vec<bulwark_core::sign::PublicKey>, String> {
    config
        .cs()
        .iter()
        .map(|id| {
            config
                .member(*id)
                .and_then(|member| member.trusted_key)
                .ok_or_else(|| format!("CS replica {id} has no trusted log"))
        })
        .collect()
}

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
            history: None,
        })
    }

    /// The A2M-PBFT-E setup for `config`'s CS, as replica `node`: PBFT's, with every CS
    /// replica's request history ([`ConfigService::history`]).
    pub fn e_setup(
        config: &Configuration,
        node: NodeId,
        secret: SecretKey,
    ) -> Result<pbft::Setup<ConfigService>, String> {
        Ok(pbft::Setup {
            history: Some(ConfigService::history(config)?),
            ..ConfigService::setup(config, node, secret)?
        })
    }

    /// The request histories of `config`'s CS on A2M-PBFT-E, as replicas keep them and clients
    /// check them: each CS replica's trusted-log key, [`CS_HISTORY_LOG`], and this epoch's range
    /// of slots.
    pub fn history(config: &Configuration) -> Result<pbft::History, String> {
        let attesters = trusted_keys(config)?
            .into_iter()
            .map(|key| pbft::Attester {
                key,
                log: CS_HISTORY_LOG,
            })
            .collect();
        let epoch = u32::try_from(config.epoch.0)
            .map_err(|_| "an epoch beyond the trusted logs' ranges".to_string())?;
        Ok(pbft::History {
            attesters,
            base: bulwark_core::a2m::Seq::from(epoch) << 96,
        })
    }

    /// A client's request `id` for `op` to `config`'s CS, sized and checked as its agreement
    /// core answers: `f_cs+1` matching results on PBFT and A2M-PBFT-EA, `2f_cs+1` with matching
    /// attested request histories on A2M-PBFT-E.
    pub fn submit(
        config: &Configuration,
        client: ClientId,
        id: u64,
        op: Op,
    ) -> Result<pbft::Submit<ConfigService>, String> {
        let f = config.f_cs as usize;
        Ok(match config.cs_protocol {
            CsProtocol::Pbft | CsProtocol::A2mPbftEa => {
                pbft::Submit::sized(config.cs_size(), f, client, id, op)
            }
            CsProtocol::A2mPbftE => pbft::Submit::attested(
                Params::new(f),
                ConfigService::history(config)?,
                client,
                id,
                op,
            ),
        })
    }

    /// The A2M-PBFT-EA setup for `config`'s CS, as replica `node`: as [`ConfigService::setup`],
    /// with every CS replica's trusted-log key and this epoch's range of the trusted-log logs
    /// ([`CS_LOGS`]).
    pub fn ea_setup(
        config: &Configuration,
        node: NodeId,
        secret: SecretKey,
    ) -> Result<pbft::ea::Setup<ConfigService>, String> {
        let pbft::Setup {
            me,
            secret,
            keys,
            instance,
            app,
            ..
        } = ConfigService::setup(config, node, secret)?;
        let trusted = trusted_keys(config)?;
        let epoch = u32::try_from(config.epoch.0)
            .map_err(|_| "an epoch beyond the trusted logs' ranges".to_string())?;
        Ok(pbft::ea::Setup {
            params: pbft::ea::Params::new(config.f_cs as usize),
            me,
            secret,
            keys,
            trusted,
            logs: pbft::ea::Logs::new(CS_LOGS, epoch),
            instance,
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

#[cfg(test)]
mod tests {
    //! The configuration rules, one operation at a time against the state machine itself (the
    //! agreement that orders them is PBFT's, tested in `pbft::tests` and by the simulator).

    use super::*;
    use bulwark_core::config::Fingerprint;
    use bulwark_core::configuration::verify_successor;
    use bulwark_core::membership::Member;

    const T_EPOCH: u64 = 60_000;
    const DELTA: u64 = 1_000;
    const STARTED: u64 = 5_000;
    const AUTHORITY: u32 = 99;

    fn secret(i: u32) -> SecretKey {
        SecretKey::from_seed(&[i as u8 + 1; 32])
    }

    /// Six members with f = f_cs = 1: the CS is four of them, and two more can be dropped.
    fn genesis() -> Configuration {
        let members = (0..6)
            .map(|i| Member {
                trusted_key: None,
                id: NodeId(i),
                address: format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                fingerprint: Fingerprint([i as u8; 32]),
                signing_key: secret(i).public_key(),
            })
            .collect();
        let authority = secret(AUTHORITY).public_key();
        Configuration::genesis(members, 1, 1, authority, T_EPOCH, DELTA, STARTED).unwrap()
    }

    fn service(config: &Configuration, node: NodeId) -> ConfigService {
        ConfigService::new(config.clone(), node, secret(node.0)).unwrap()
    }

    /// The first CS replica of `config`.
    fn replica(config: &Configuration) -> ConfigService {
        service(config, config.cs()[0])
    }

    fn newcomer(n: u8) -> NewMember {
        NewMember {
            trusted_key: None,
            address: format!("127.0.0.2:{}", 8000 + n as u16).parse().unwrap(),
            fingerprint: Fingerprint([0xa0 + n; 32]),
            signing_key: secret(200 + n as u32).public_key(),
        }
    }

    fn order_by(signer: u32, epoch: Epoch, action: Action) -> Op {
        let signed = Signed::sign(&secret(signer), Order { epoch, action }).unwrap();
        Op::Order(signed.to_unverified())
    }

    fn order(epoch: Epoch, action: Action) -> Op {
        order_by(AUTHORITY, epoch, action)
    }

    fn vote_by(
        signer: u32,
        epoch: Epoch,
        node: NodeId,
        voter: NodeId,
    ) -> (NodeId, Unverified<EvictVote>) {
        let vote = EvictVote { epoch, node, voter };
        (
            voter,
            Signed::sign(&secret(signer), vote).unwrap().to_unverified(),
        )
    }

    /// Every CS replica's own agreement to evict `node` in `config`'s epoch.
    fn votes(config: &Configuration, node: NodeId) -> Vec<(NodeId, Unverified<EvictVote>)> {
        config
            .cs()
            .into_iter()
            .map(|voter| vote_by(voter.0, config.epoch, node, voter))
            .collect()
    }

    /// Checks `op` as a backup does, then executes it as the batch's `at`.
    fn run(service: &mut ConfigService, op: &Op, at: u64) -> Result<Outcome, String> {
        service.check_op(op)?;
        Ok(service.execute(op, at, 1, &mut AppOutput::default()))
    }

    fn accepted(outcome: Result<Outcome, String>) -> Option<NodeId> {
        match outcome {
            Ok(Outcome::Accepted { epoch, node }) => {
                assert_eq!(epoch, Epoch(2), "changes take effect in the next epoch");
                node
            }
            other => panic!("expected Accepted, got {other:?}"),
        }
    }

    fn rejected(outcome: Result<Outcome, String>) -> String {
        match outcome {
            Ok(Outcome::Rejected(reason)) => reason,
            other => panic!("expected Rejected, got {other:?}"),
        }
    }

    fn refused(outcome: Result<Outcome, String>) -> String {
        match outcome {
            Err(reason) => reason,
            other => panic!("expected check_op to refuse, got {other:?}"),
        }
    }

    fn due() -> u64 {
        STARTED + T_EPOCH - DELTA
    }

    #[test]
    fn an_add_takes_effect_in_the_next_epoch_under_the_next_unused_id() {
        let config = genesis();
        let mut cs = replica(&config);
        let first = accepted(run(&mut cs, &order(Epoch(1), Action::Add(newcomer(1))), 0));
        let second = accepted(run(&mut cs, &order(Epoch(1), Action::Add(newcomer(2))), 0));
        assert_eq!(first, Some(NodeId(6)));
        assert_eq!(second, Some(NodeId(7)));
        assert_eq!(
            cs.config(),
            &config,
            "the epoch's own configuration never changes"
        );
        assert_eq!(cs.pending().added, vec![newcomer(1), newcomer(2)]);

        let reason = rejected(run(&mut cs, &order(Epoch(1), Action::Add(newcomer(1))), 0));
        assert!(reason.contains("already being added"), "{reason}");
        // The same principal under another address is still the same principal.
        let mut again = newcomer(3);
        again.signing_key = newcomer(1).signing_key;
        rejected(run(&mut cs, &order(Epoch(1), Action::Add(again)), 0));
        // A member's key cannot join a second time either.
        let mut member = newcomer(4);
        member.signing_key = secret(2).public_key();
        rejected(run(&mut cs, &order(Epoch(1), Action::Add(member)), 0));

        let Ok(Outcome::Stopped { epoch, digest }) = run(&mut cs, &Op::Stop, due()) else {
            panic!("a due STOP ends the epoch");
        };
        let (next, _) = cs.next.clone().unwrap();
        assert_eq!((epoch, digest), (Epoch(2), next.digest()));
        assert_eq!(
            next.member(NodeId(6)).unwrap().fingerprint,
            newcomer(1).fingerprint
        );
        assert_eq!(
            next.member(NodeId(7)).unwrap().fingerprint,
            newcomer(2).fingerprint
        );
        assert_eq!(next.next_node_id, 8);
    }

    #[test]
    fn orders_are_executed_only_if_the_authority_signed_them_for_this_epoch() {
        let config = genesis();
        let mut cs = replica(&config);
        let forged = order_by(0, Epoch(1), Action::Revoke(NodeId(5)));
        assert!(refused(run(&mut cs, &forged, 0)).contains("authority"));
        let early = order(Epoch(2), Action::Revoke(NodeId(5)));
        assert!(refused(run(&mut cs, &early, 0)).contains("for epoch 2"));

        // An order of epoch 1, replayed to epoch 2's CS, is refused there.
        let revoke = order(Epoch(1), Action::Revoke(NodeId(5)));
        accepted(run(&mut cs, &revoke, 0));
        run(&mut cs, &Op::Stop, due()).unwrap();
        let (next, _) = cs.next.clone().unwrap();
        assert!(next.member(NodeId(5)).is_none());
        let mut later = replica(&next);
        let replayed = order(Epoch(1), Action::Add(newcomer(1)));
        assert!(refused(run(&mut later, &replayed, 0)).contains("for epoch 1"));
        assert!(later.pending().added.is_empty());
    }

    #[test]
    fn a_drop_must_name_a_member_once_and_leave_enough_members() {
        let config = genesis();
        let mut cs = replica(&config);
        accepted(run(&mut cs, &order(Epoch(1), Action::Revoke(NodeId(4))), 0));
        let twice = rejected(run(&mut cs, &order(Epoch(1), Action::Revoke(NodeId(4))), 0));
        assert!(twice.contains("already leaving"), "{twice}");
        let stranger = rejected(run(
            &mut cs,
            &order(Epoch(1), Action::Revoke(NodeId(40))),
            0,
        ));
        assert!(stranger.contains("not a member"), "{stranger}");
        accepted(run(&mut cs, &order(Epoch(1), Action::Revoke(NodeId(5))), 0));
        // Four members left: a fifth drop would leave too few for a group and a CS.
        rejected(run(&mut cs, &order(Epoch(1), Action::Revoke(NodeId(3))), 0));
        assert_eq!(cs.pending().dropped, BTreeSet::from([NodeId(4), NodeId(5)]));
        // An ADD makes room for the drop.
        accepted(run(&mut cs, &order(Epoch(1), Action::Add(newcomer(1))), 0));
        accepted(run(&mut cs, &order(Epoch(1), Action::Revoke(NodeId(3))), 0));
    }

    #[test]
    fn an_evict_needs_2f_cs_plus_1_genuine_agreements_of_this_epoch() {
        let config = genesis();
        let cs_members = config.cs();
        let outsider = (0..6)
            .map(NodeId)
            .find(|id| !cs_members.contains(id))
            .unwrap();
        let target = NodeId(5);
        let mut cs = replica(&config);
        let all = votes(&config, target);
        let quorum = config.cs_quorum();
        assert_eq!(quorum, 3);

        let evict = |votes: Vec<(NodeId, Unverified<EvictVote>)>| Op::Evict {
            node: target,
            votes,
        };
        let short = refused(run(&mut cs, &evict(all[..quorum - 1].to_vec()), 0));
        assert!(
            short.contains("2 agreements") && short.contains("3 needed"),
            "{short}"
        );
        let mut doubled = all[..quorum - 1].to_vec();
        doubled.push(all[0].clone());
        assert!(refused(run(&mut cs, &evict(doubled), 0)).contains("twice"));
        let mut forged = all[..quorum - 1].to_vec();
        let voter = cs_members[quorum - 1];
        forged.push(vote_by(0xee, Epoch(1), target, voter));
        assert!(refused(run(&mut cs, &evict(forged), 0)).contains("agreement to evict"));
        let mut foreign = all[..quorum - 1].to_vec();
        foreign.push(vote_by(outsider.0, Epoch(1), target, outsider));
        assert!(refused(run(&mut cs, &evict(foreign), 0)).contains("not a CS replica"));
        let mut replayed = all[..quorum - 1].to_vec();
        replayed.push(vote_by(voter.0, Epoch(2), target, voter));
        assert!(refused(run(&mut cs, &evict(replayed), 0)).contains("another eviction"));
        let mut other_node = all[..quorum - 1].to_vec();
        other_node.push(vote_by(voter.0, Epoch(1), NodeId(4), voter));
        assert!(refused(run(&mut cs, &evict(other_node), 0)).contains("another eviction"));
        // A genuine signature listed under a voter it does not name.
        let mut lent = all[..quorum - 1].to_vec();
        let (_, theirs) = vote_by(voter.0, Epoch(1), target, outsider);
        lent.push((voter, theirs));
        assert!(refused(run(&mut cs, &evict(lent), 0)).contains("another eviction"));
        assert!(cs.pending().dropped.is_empty(), "nothing refused may apply");

        assert_eq!(
            accepted(run(&mut cs, &evict(all[..quorum].to_vec()), 0)),
            Some(target)
        );
        assert!(cs.pending().dropped.contains(&target));
        // The replica's own helper signs the same agreement.
        assert_eq!(cs.evict_vote(target).unwrap().0, cs.node);
    }

    #[test]
    fn an_early_stop_is_rejected_and_a_due_one_ends_the_epoch() {
        let config = genesis();
        let mut cs = replica(&config);
        let reason = rejected(run(&mut cs, &Op::Stop, due() - 1));
        assert!(reason.contains("cannot end for another 1 ms"), "{reason}");
        assert!(cs.pending().stopped_at.is_none());

        let mut out = AppOutput::default();
        let outcome = cs.execute(&Op::Stop, due(), 1, &mut out);
        assert!(matches!(
            outcome,
            Outcome::Stopped {
                epoch: Epoch(2),
                ..
            }
        ));
        assert_eq!(cs.pending().stopped_at, Some(due()));
        let (next, _) = cs.next.clone().unwrap();
        assert_eq!(
            next.started_at_ms,
            due(),
            "the next epoch starts at the agreed reading"
        );
        assert!(
            matches!(
                out.sends.as_slice(),
                [(
                    None,
                    CsMessage::Share {
                        epoch: Epoch(2),
                        collecting: true,
                        ..
                    }
                )]
            ),
            "the replica shares its signature with every other"
        );
        assert!(out.changes.is_empty(), "one share does not certify");
    }

    #[test]
    fn after_stop_every_change_is_sent_to_the_next_epoch() {
        let config = genesis();
        let mut cs = replica(&config);
        run(&mut cs, &Op::Stop, due()).unwrap();
        let ended = Ok(Outcome::Ended { next: Epoch(2) });
        assert_eq!(
            run(&mut cs, &order(Epoch(1), Action::Add(newcomer(1))), 0),
            ended
        );
        assert_eq!(
            run(&mut cs, &order(Epoch(1), Action::Revoke(NodeId(5))), 0),
            ended
        );
        let evict = Op::Evict {
            node: NodeId(5),
            votes: votes(&config, NodeId(5)),
        };
        assert_eq!(run(&mut cs, &evict, 0), ended);
        assert_eq!(run(&mut cs, &Op::Stop, due() + 5), ended);
        assert_eq!(run(&mut cs, &Op::Noop, 0), Ok(Outcome::Done));
        let Ok(Outcome::State(state)) = run(&mut cs, &Op::Read, 0) else {
            panic!("a read after STOP answers the state");
        };
        assert_eq!(state.stopped_at, Some(due()));
        assert!(state.added.is_empty() && state.dropped.is_empty());
    }

    #[test]
    fn a_stop_is_prepared_only_with_a_clock_reading_within_the_tolerance() {
        let config = genesis();
        let cs = replica(&config);
        let stop = [&Op::Stop];
        let now = Time(due() + 10_000);
        assert!(cs.check_proposal(now, now.0 - DELTA, &stop).is_ok());
        assert!(cs.check_proposal(now, now.0 + DELTA, &stop).is_ok());
        // A slow primary's reading (or a fast backup's clock) delays STOP; it never passes.
        assert!(cs.check_proposal(now, now.0 - DELTA - 1, &stop).is_err());
        assert!(cs.check_proposal(now, now.0 + DELTA + 1, &stop).is_err());
        // Batches without a STOP do not depend on clocks.
        assert!(cs.check_proposal(now, 0, &[&Op::Noop, &Op::Read]).is_ok());
        assert_eq!(cs.propose(now), now.0);
    }

    /// Every CS replica of `config`, each having executed STOP at `at`, with its own share out.
    fn stopped(config: &Configuration, at: u64) -> Vec<(ConfigService, Signature)> {
        config
            .cs()
            .into_iter()
            .map(|node| {
                let mut cs = service(config, node);
                let mut out = AppOutput::default();
                cs.execute(&Op::Stop, at, 1, &mut out);
                let Some((_, CsMessage::Share { signature, .. })) = out.sends.pop() else {
                    panic!("STOP shares a signature");
                };
                (cs, signature)
            })
            .collect()
    }

    fn share(signature: Signature, collecting: bool) -> CsMessage {
        CsMessage::Share {
            epoch: Epoch(2),
            signature,
            collecting,
        }
    }

    #[test]
    fn shares_of_2f_cs_plus_1_replicas_certify_and_forged_ones_do_not_count() {
        let config = genesis();
        let mut replicas = stopped(&config, due());
        let signatures: Vec<Signature> = replicas.iter().map(|(_, s)| *s).collect();
        let (cs, _) = &mut replicas[0];
        let mut out = AppOutput::default();
        // A forged share (slot 1's slot, another key) and a share for the wrong epoch.
        let forged = ConfigCert::share(&secret(0xee), &cs.next.clone().unwrap().1);
        cs.on_message(Time(0), Slot(1), share(forged, true), &mut out);
        cs.on_message(
            Time(0),
            Slot(2),
            CsMessage::Share {
                epoch: Epoch(3),
                signature: signatures[2],
                collecting: true,
            },
            &mut out,
        );
        cs.on_message(Time(0), Slot(9), share(signatures[3], true), &mut out);
        assert!(cs.certified().is_none() && out.changes.is_empty());

        cs.on_message(Time(0), Slot(1), share(signatures[1], true), &mut out);
        assert!(
            cs.certified().is_none(),
            "two genuine shares are not a quorum"
        );
        cs.on_message(Time(0), Slot(2), share(signatures[2], true), &mut out);
        let cert = cs
            .certified()
            .cloned()
            .expect("three genuine shares certify");
        assert!(matches!(out.changes.as_slice(), [CsChange::Certified(c)] if *c == cert));
        let next = verify_successor(&config, &cert).unwrap();
        assert_eq!(next, cs.next.clone().unwrap().0);

        // A replica still collecting gets this one's share in answer, once; answers are not
        // answered.
        let mut out = AppOutput::default();
        cs.on_message(Time(0), Slot(3), share(signatures[3], true), &mut out);
        assert!(matches!(
            out.sends.as_slice(),
            [(
                Some(Slot(3)),
                CsMessage::Share {
                    collecting: false,
                    ..
                }
            )]
        ));
        let mut out = AppOutput::default();
        cs.on_message(Time(0), Slot(3), share(signatures[3], false), &mut out);
        assert!(out.sends.is_empty());
    }

    #[test]
    fn replicas_that_stopped_at_different_readings_never_certify_together() {
        let config = genesis();
        let early = stopped(&config, due());
        let late = stopped(&config, due() + 1);
        let (mut cs, _) = early.into_iter().next().unwrap();
        let mut out = AppOutput::default();
        for (slot, (_, signature)) in late.iter().enumerate().skip(1) {
            cs.on_message(
                Time(0),
                Slot(slot as u32),
                share(*signature, true),
                &mut out,
            );
        }
        assert!(
            cs.certified().is_none(),
            "shares over another configuration never count"
        );
    }

    #[test]
    fn a_stop_becomes_due_on_the_timer_and_is_repeated_until_certified() {
        let config = genesis();
        let mut cs = replica(&config);
        let asks = |cs: &mut ConfigService, at: u64| {
            let mut out = AppOutput::default();
            cs.on_tick(Time(at), &mut out);
            out.submit.iter().filter(|(_, op)| *op == Op::Stop).count()
        };
        assert_eq!(asks(&mut cs, STARTED + T_EPOCH - 1), 0);
        assert_eq!(asks(&mut cs, STARTED + T_EPOCH), 1);
        assert_eq!(asks(&mut cs, STARTED + T_EPOCH + 10), 0);
        assert_eq!(asks(&mut cs, STARTED + T_EPOCH + REPEAT_MS), 1);
        run(&mut cs, &Op::Stop, STARTED + T_EPOCH).unwrap();
        assert_eq!(asks(&mut cs, STARTED + T_EPOCH + 5 * REPEAT_MS), 0);
    }

    #[test]
    fn a_snapshot_restores_the_state_and_the_next_configuration() {
        let config = genesis();
        let mut cs = replica(&config);
        accepted(run(&mut cs, &order(Epoch(1), Action::Add(newcomer(1))), 0));
        run(&mut cs, &Op::Stop, due()).unwrap();
        let mut fresh = replica(&config);
        fresh.restore(&cs.snapshot()).unwrap();
        assert_eq!(fresh.pending(), cs.pending());
        assert_eq!(fresh.next, cs.next);
        assert_eq!(fresh.snapshot(), cs.snapshot());

        let (next, _) = cs.next.clone().unwrap();
        let mut later = replica(&next);
        assert!(
            later
                .restore(&cs.snapshot())
                .unwrap_err()
                .contains("epoch 1")
        );
        assert!(later.restore(&[0xff; 7]).is_err());
    }
}
