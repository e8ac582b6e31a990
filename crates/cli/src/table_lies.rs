//! A node whose table replicas lie, as the simulator's lying members do
//! (`bulwark_sim::sim::protocols::table::TableNode`): as replica and as proxy at once.
//!
//! For tests only: linked into `bulwark-byzantine`, never into `bulwark`.

use bulwark_core::sign::SecretKey;
use bulwark_core::{ClientId, Slot, Time};
use bulwark_node::host::TableLogic;
use bulwark_protocol::machine::{Access, Output, Replica, ReplicaStats, TimerId};
use bulwark_protocol::table;
use bulwark_sim::byzantine::Behaviour;
use bulwark_sim::sim::protocols::table::TableNode;
use std::collections::VecDeque;

/// Wraps each of the node's table replicas; `secret` is the node's signing key.
pub fn wrap(
    behaviour: Behaviour,
    secret: SecretKey,
) -> Box<dyn Fn(table::Server) -> Box<dyn TableLogic> + Send + Sync> {
    Box::new(move |server| Box::new(Lying(TableNode::lying(server, behaviour, secret.clone()))))
}

struct Lying(TableNode);

impl TableLogic for Lying {
    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: table::Request,
    ) -> Output<table::Server> {
        self.0
            .on_request(now, client, access, request, &())
            .retyped()
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: table::Message,
    ) -> Output<table::Server> {
        self.0.on_message(now, from, message, &()).retyped()
    }

    fn on_timer(&mut self, now: Time, timer: TimerId) -> Output<table::Server> {
        self.0.on_timer(now, timer, &()).retyped()
    }

    fn on_tick(&mut self, now: Time) -> Output<table::Server> {
        self.0.on_tick(now).retyped()
    }

    fn stats(&self) -> ReplicaStats {
        self.0.stats()
    }
}

/// Wraps each of the node's table replicas in a proxy that stalls: it serves every operation
/// correctly but holds each answer to a client for `hold_millis` first (spec `cassandra.md`
/// §4.5's stalling proxy: just under the client's timeout hurts most and is never caught).
pub fn stalling(
    hold_millis: u64,
) -> Box<dyn Fn(table::Server) -> Box<dyn TableLogic> + Send + Sync> {
    Box::new(move |server| {
        Box::new(Stalling {
            honest: Box::new(server),
            hold_millis,
            held: VecDeque::new(),
        })
    })
}

/// Apart from every timer the honest replica sets (its proxy operations' numbers, and
/// `u64::MAX`).
const RELEASE_TIMER: TimerId = TimerId(u64::MAX - 1);

struct Stalling {
    honest: Box<dyn TableLogic>,
    hold_millis: u64,
    /// Answers held, oldest first (all are held alike, so this is release order).
    held: VecDeque<(Time, ClientId, u64, table::Response)>,
}

impl Stalling {
    /// `out` with its answers to clients taken out and held; `asked` is the client and
    /// operation its `reply` answers.
    fn hold(
        &mut self,
        now: Time,
        asked: Option<(ClientId, u64)>,
        mut out: Output<table::Server>,
    ) -> Output<table::Server> {
        let was_empty = self.held.is_empty();
        let release = now.plus_millis(self.hold_millis);
        if let (Some(reply), Some((client, op))) = (out.reply.take(), asked) {
            self.held.push_back((release, client, op, reply));
        }
        for (client, op, reply) in out.notify.drain(..) {
            self.held.push_back((release, client, op, reply));
        }
        if was_empty && !self.held.is_empty() {
            out.timers.push((RELEASE_TIMER, release));
        }
        out
    }
}

impl TableLogic for Stalling {
    fn on_request(
        &mut self,
        now: Time,
        client: ClientId,
        access: Access,
        request: table::Request,
    ) -> Output<table::Server> {
        let op = request.op;
        let out = TableLogic::on_request(self.honest.as_mut(), now, client, access, request);
        self.hold(now, Some((client, op)), out)
    }

    fn on_message(
        &mut self,
        now: Time,
        from: Slot,
        message: table::Message,
    ) -> Output<table::Server> {
        let out = TableLogic::on_message(self.honest.as_mut(), now, from, message);
        self.hold(now, None, out)
    }

    fn on_timer(&mut self, now: Time, timer: TimerId) -> Output<table::Server> {
        if timer != RELEASE_TIMER {
            let out = TableLogic::on_timer(self.honest.as_mut(), now, timer);
            return self.hold(now, None, out);
        }
        let mut out = Output::none();
        while self.held.front().is_some_and(|(at, ..)| *at <= now) {
            if let Some((_, client, op, reply)) = self.held.pop_front() {
                out.notify.push((client, op, reply));
            }
        }
        if let Some((at, ..)) = self.held.front() {
            out.timers.push((RELEASE_TIMER, *at));
        }
        out
    }

    fn on_tick(&mut self, now: Time) -> Output<table::Server> {
        let out = TableLogic::on_tick(self.honest.as_mut(), now);
        self.hold(now, None, out)
    }

    fn stats(&self) -> ReplicaStats {
        TableLogic::stats(self.honest.as_ref())
    }
}
