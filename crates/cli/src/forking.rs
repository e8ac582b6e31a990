//! A node that forks its single-server volumes, as the server of the A2M paper's Figure 1: the
//! first client to read a key is served honestly, and every later client reading that key is
//! shown the state the first one saw then, as if nothing had been written since. Without a
//! trusted log this fork goes unseen; with one, the server has no attestation of that older
//! state for the later client's nonce, so it can only hand over the one it has, which the
//! client refuses (and records as evidence). For tests and the demo only: linked into
//! `bulwark-byzantine`, never into `bulwark`.

use bulwark_core::envelope::{self, Envelope};
use bulwark_core::wire::FRAME_BYTES_MAX;
use bulwark_core::{ClientId, Key, NodeId, Slot, Time};
use bulwark_node::host::{Effects, Hosted};
use bulwark_protocol::a2m_storage::{Reply, Request, Snapshot};
use bulwark_protocol::machine::{Access, Attested, ReplicaStats, TimerId};
use std::collections::HashMap;

/// Wraps the node's volumes.
pub fn wrap(volumes: Box<dyn Hosted>) -> Box<dyn Hosted> {
    Box::new(Forking {
        inner: volumes,
        favoured: None,
        frozen: HashMap::new(),
        reads: HashMap::new(),
    })
}

struct Forking {
    inner: Box<dyn Hosted>,
    /// The client shown the real state.
    favoured: Option<ClientId>,
    /// What the favoured client was first shown of each key of each volume.
    frozen: HashMap<(u32, Key), Box<Snapshot>>,
    /// The favoured client's reads in flight: their volume and key.
    reads: HashMap<u64, (u32, Key)>,
}

impl Forking {
    /// Freezes the first state the favoured client is shown of each key.
    fn watch(&mut self, effects: &Effects) {
        for (client, op, frame) in &effects.notify {
            if Some(*client) != self.favoured {
                continue;
            }
            let Some((volume, key)) = self.reads.remove(op) else {
                continue;
            };
            let Ok(envelope) = Envelope::decode(frame.clone()) else {
                continue;
            };
            if let Ok(Reply::State { snapshot, .. }) = envelope.body::<Reply>(FRAME_BYTES_MAX) {
                self.frozen.entry((volume, key)).or_insert(snapshot);
            }
        }
    }
}

impl Hosted for Forking {
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
        let volume = envelope.header.group.0;
        if let Ok(Request::Read { op, key, nonce }) = envelope.body::<Request>(FRAME_BYTES_MAX) {
            let favoured = *self.favoured.get_or_insert(client);
            if favoured == client {
                self.reads.insert(op.0, (volume, key));
            } else if let Some(snapshot) = self.frozen.get(&(volume, key)) {
                // The other side of the fork: the state before everything since.
                let reply = Reply::State {
                    op,
                    nonce,
                    snapshot: snapshot.clone(),
                };
                return Effects {
                    reply: Some(envelope::frame(&envelope.header.reply(), &reply)),
                    ..Effects::default()
                };
            }
        }
        let effects = self.inner.on_request(now, client, access, envelope, batch);
        self.watch(&effects);
        effects
    }

    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects {
        self.inner.on_message(now, from, envelope, batch)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, batch: u64) -> Effects {
        self.inner.on_timer(now, timer, batch)
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        let effects = self.inner.on_tick(now, batch);
        self.watch(&effects);
        effects
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, batch: u64) -> Effects {
        let effects = self.inner.on_attested(now, token, answers, batch);
        self.watch(&effects);
        effects
    }

    fn durable(&mut self, batch: u64) {
        self.inner.durable(batch);
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}
