//! A node whose causal volumes' servers lie (Depot §8.2's faulty servers), one way each:
//!
//! - `withhold`: answers every exchange with nothing (no updates, no values, no acknowledgement
//!   of a put) and gossips with no other server;
//! - `tamper`: passes on every update with one byte of its signed bytes changed and every value
//!   with one byte changed, names heads in its frontier that nobody wrote, and acknowledges no
//!   put, to clients and servers alike;
//! - `fork`: serves honestly, and also signs two first updates of its own (a server has no right
//!   to write keys, so they are kept but never read), showing one to the other servers and to
//!   clients of even id and the other to clients of odd id: a fork that clients and servers
//!   detect and prove once the two branches meet.
//!
//! For tests only: linked into `bulwark-byzantine`, never into `bulwark`.

use bulwark_core::envelope::{self, Envelope, Header};
use bulwark_core::sign::SecretKey;
use bulwark_core::sign::Unverified;
use bulwark_core::wire::FRAME_BYTES_MAX;
use bulwark_core::{ClientId, Key, NodeId, Slot, Time};
use bulwark_node::host::{Effects, Hosted};
use bulwark_protocol::depot::served::{PeerMessage, Reply, Request, group_of};
use bulwark_protocol::depot::{Message, Node, UpdateId, VolumeConfig, WireUpdate};
use bulwark_protocol::machine::{Access, Attested, ReplicaStats, TimerId};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;

/// How a node's causal volumes lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CausalLie {
    /// Answers nothing and gossips with nobody.
    Withhold,
    /// Changes what it passes on.
    Tamper,
    /// Signs two histories of its own.
    Fork,
}

/// Wraps the node's causal volumes; `secret` is the node's signing key.
pub fn wrap(lie: CausalLie, secret: SecretKey) -> bulwark_node::WrapHosted {
    Box::new(move |inner| {
        Box::new(Lying {
            inner,
            lie,
            secret: secret.clone(),
            configs: HashMap::new(),
            branches: HashMap::new(),
        })
    })
}

struct Lying {
    inner: Box<dyn Hosted>,
    lie: CausalLie,
    secret: SecretKey,
    /// Each volume's configuration, as opened through this node, by group.
    configs: HashMap<u32, Arc<VolumeConfig>>,
    /// A forking node's two branches of each volume: its first update, twice, and its value.
    branches: HashMap<u32, [(WireUpdate, Bytes); 2]>,
}

/// `bytes` with one byte changed.
fn flipped(bytes: &Bytes) -> Bytes {
    let mut changed = bytes.to_vec();
    if let Some(last) = changed.last_mut() {
        *last ^= 0x5a;
    }
    Bytes::from(changed)
}

fn tampered(update: WireUpdate) -> WireUpdate {
    WireUpdate {
        writer: update.writer,
        signed: Unverified::new(flipped(update.signed.bytes()), *update.signed.signature()),
    }
}

impl Lying {
    /// The two branches of volume `group`, made the first time they are needed.
    fn branches(&mut self, group: u32, now: Time) -> Option<&[(WireUpdate, Bytes); 2]> {
        if !self.branches.contains_key(&group) {
            let config = self.configs.get(&group)?.clone();
            let me = config.member_with(&self.secret.public_key())?;
            let wall_micros = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(now.0 * 1000, |since| since.as_micros() as u64);
            let branch = |side: u8| {
                let mut node = Node::new(config.clone(), me, self.secret.clone());
                let value = Bytes::from(format!("branch {side} of node {}", me.0));
                let key = Key::new(b"forged".to_vec()).ok()?;
                let (update, _) = node.write(key, Some(value.clone()), wall_micros + side as u64);
                Some((update.to_wire(), value))
            };
            let pair = [branch(0)?, branch(1)?];
            tracing::warn!(group, "forking: two first updates signed");
            self.branches.insert(group, pair);
        }
        self.branches.get(&group)
    }

    /// What this node answers `client` instead of `reply`.
    fn lie_to(&mut self, client: ClientId, group: u32, reply: Reply, now: Time) -> Reply {
        let Reply::Exchange { volume, messages } = reply else {
            return reply;
        };
        let messages = match self.lie {
            CausalLie::Withhold => Vec::new(),
            CausalLie::Tamper => messages.into_iter().filter_map(tamper).collect(),
            CausalLie::Fork => {
                let mut messages = messages;
                if let Some(branches) = self.branches(group, now) {
                    let (update, value) = branches[(client.0 % 2) as usize].clone();
                    messages.push(Message::push(vec![update], vec![value]));
                }
                messages
            }
        };
        Reply::Exchange { volume, messages }
    }
}

/// `message` as a tampering server passes it on; `None` for an acknowledgement it withholds.
fn tamper(message: Message) -> Option<Message> {
    Some(match message {
        Message::Push {
            updates,
            values,
            mut frontier,
            forks,
            more,
            want_values,
        } => {
            // A head nobody wrote: the puller asks for it by name, once.
            if let Some(&(writer, clock, _)) = frontier.first() {
                frontier.push((
                    writer,
                    clock + 1,
                    UpdateId(bulwark_core::Digest([0x66; 32])),
                ));
            }
            Message::Push {
                updates: updates.into_iter().map(tampered).collect(),
                values: values.iter().map(flipped).collect(),
                frontier,
                forks,
                more,
                want_values,
            }
        }
        Message::Got {
            op,
            values,
            updates,
            more,
            forks,
        } => Message::Got {
            op,
            values: values.iter().map(flipped).collect(),
            updates: updates.into_iter().map(tampered).collect(),
            more,
            forks,
        },
        Message::PutAck { .. } => return None,
        other => other,
    })
}

impl Lying {
    /// What this node sends other servers instead of `effects.sends`.
    fn lie_to_servers(&mut self, effects: &mut Effects, now: Time) {
        match self.lie {
            CausalLie::Withhold => effects.sends.clear(),
            CausalLie::Tamper => {
                for (_, frame) in &mut effects.sends {
                    let Ok(envelope) = Envelope::decode(frame.clone()) else {
                        continue;
                    };
                    let Ok(peer) = envelope.body::<PeerMessage>(FRAME_BYTES_MAX) else {
                        continue;
                    };
                    if let Some(message) = tamper(peer.message) {
                        let peer = PeerMessage {
                            volume: peer.volume,
                            message,
                        };
                        *frame = envelope::frame(&envelope.header, &peer);
                    }
                }
            }
            CausalLie::Fork => {
                // One branch to every server this node gossips with, unasked.
                let mut more = Vec::new();
                for (node, frame) in &effects.sends {
                    let Ok(envelope) = Envelope::decode(frame.clone()) else {
                        continue;
                    };
                    let Ok(peer) = envelope.body::<PeerMessage>(FRAME_BYTES_MAX) else {
                        continue;
                    };
                    let group = envelope.header.group.0;
                    if let Some(branches) = self.branches(group, now) {
                        let (update, value) = branches[0].clone();
                        let push = PeerMessage {
                            volume: peer.volume,
                            message: Message::push(vec![update], vec![value]),
                        };
                        more.push((*node, envelope::frame(&envelope.header, &push)));
                    }
                }
                effects.sends.extend(more);
            }
        }
    }
}

impl Hosted for Lying {
    fn service_name(&self) -> &'static str {
        self.inner.service_name()
    }

    fn slot(&self) -> Slot {
        self.inner.slot()
    }

    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        envelope: &Envelope,
        batch: u64,
    ) -> Effects {
        let request = envelope.body::<Request>(FRAME_BYTES_MAX).ok();
        let mut effects = self.inner.on_request(now, client, access, envelope, batch);
        let group = match &request {
            Some(Request::Open { config }) => {
                let group = group_of(config.volume).0;
                self.configs.insert(group, Arc::new(config.clone()));
                return effects;
            }
            Some(Request::Exchange { volume, .. }) => group_of(*volume).0,
            None => return effects,
        };
        self.lie_to_servers(&mut effects, now);
        let Some(frame) = effects.reply.take() else {
            return effects;
        };
        let reply = Envelope::decode(frame.clone())
            .ok()
            .and_then(|envelope| envelope.body::<Reply>(FRAME_BYTES_MAX).ok());
        effects.reply = Some(match reply {
            Some(reply) => {
                let header: Header = envelope.header.reply();
                envelope::frame(&header, &self.lie_to(client, group, reply, now))
            }
            None => frame,
        });
        effects
    }

    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects {
        let mut effects = self.inner.on_message(now, from, envelope, batch);
        self.lie_to_servers(&mut effects, now);
        effects
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, batch: u64) -> Effects {
        self.inner.on_timer(now, timer, batch)
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        let mut effects = self.inner.on_tick(now, batch);
        self.lie_to_servers(&mut effects, now);
        effects
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, batch: u64) -> Effects {
        self.inner.on_attested(now, token, answers, batch)
    }

    fn durable(&mut self, batch: u64) {
        self.inner.durable(batch);
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }

    fn causal_status(&self) -> Vec<bulwark_protocol::service::CausalStatus> {
        self.inner.causal_status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tampered_update_no_longer_verifies() {
        let secret = SecretKey::from_seed(&[3; 32]);
        let config = Arc::new(VolumeConfig::new(
            "lies",
            vec![bulwark_protocol::depot::Member {
                key: secret.public_key(),
                role: bulwark_protocol::depot::Role::Client,
                writes: vec![Vec::new()],
            }],
            bulwark_protocol::depot::Staleness::default(),
        ));
        let mut node = Node::new(config.clone(), bulwark_protocol::depot::Writer(0), secret);
        let key = Key::new(b"k".to_vec()).unwrap();
        let (update, _) = node.write(key, Some(Bytes::from_static(b"v")), 1_000_000);
        assert!(update.to_wire().verify(&config).is_ok());
        assert!(tampered(update.to_wire()).verify(&config).is_err());
    }
}
