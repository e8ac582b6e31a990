//! A node whose replicas that follow the configuration fall behind it (Rosebud §4.9): one never
//! enters a newly certified epoch, the other enters it but never finishes pulling what it takes
//! over. Either way the node withholds its answers to the configuration service's pings, which
//! must then evict it. For tests and the demo only: linked into `bulwark-byzantine`, never into
//! `bulwark`.

use bulwark_core::envelope::Envelope;
use bulwark_core::membership::Ring;
use bulwark_core::{ClientId, NodeId, Slot, Time};
use bulwark_node::host::{Effects, Hosted};
use bulwark_protocol::machine::{Access, Attested, ReplicaStats, TimerId};
use std::sync::Arc;

/// How the node falls behind.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Lag {
    /// Its followers stay in the epoch they were in when it started.
    SkipEpochs,
    /// Its followers enter every epoch but send nothing to other nodes, so no pull of theirs
    /// ever ends (and they answer no other node's).
    Stall,
}

/// Wraps each of the node's followers.
pub fn wrap(lag: Lag) -> bulwark_node::WrapHosted {
    Box::new(move |inner| Box::new(Lagging { inner, lag }))
}

struct Lagging {
    inner: Box<dyn Hosted>,
    lag: Lag,
}

impl Lagging {
    fn sent(&self, mut effects: Effects) -> Effects {
        if matches!(self.lag, Lag::Stall) {
            effects.sends.clear();
        }
        effects
    }
}

impl Hosted for Lagging {
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
        let effects = self.inner.on_request(now, client, access, envelope, batch);
        self.sent(effects)
    }

    fn on_message(&mut self, now: Time, from: NodeId, envelope: &Envelope, batch: u64) -> Effects {
        let effects = self.inner.on_message(now, from, envelope, batch);
        self.sent(effects)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, batch: u64) -> Effects {
        let effects = self.inner.on_timer(now, timer, batch);
        self.sent(effects)
    }

    fn on_tick(&mut self, now: Time, batch: u64) -> Effects {
        let effects = self.inner.on_tick(now, batch);
        self.sent(effects)
    }

    fn on_epoch(&mut self, now: Time, ring: Arc<Ring>, batch: u64) -> Effects {
        match self.lag {
            Lag::SkipEpochs => Effects::default(),
            Lag::Stall => {
                let effects = self.inner.on_epoch(now, ring, batch);
                self.sent(effects)
            }
        }
    }

    fn on_attested(&mut self, now: Time, token: u64, answers: Attested, batch: u64) -> Effects {
        let effects = self.inner.on_attested(now, token, answers, batch);
        self.sent(effects)
    }

    fn durable(&mut self, batch: u64) {
        self.inner.durable(batch);
    }

    fn stats(&self) -> ReplicaStats {
        self.inner.stats()
    }
}
