//! A table group in one process: every member, and one client operation at a time, with every
//! message delivered at once and in order. What the unit tests drive (with hooks that make a
//! member or a proxy lie) and what `bulwark bench table` measures the variants' CPU and bytes
//! on, free of the network's noise. Time stands still: proxies' waits end only when nothing
//! else is left to deliver.

use super::{Message, Request, Response, Server};
use crate::machine::{Access, OpError, Operation, Output, Progress, Replica, TimerId};
use bulwark_core::{ClientId, Slot, Time};
use std::collections::VecDeque;

/// What travels between the client, the proxy and the replicas.
#[derive(Clone, Debug)]
pub enum Event {
    /// Client to proxy.
    Request(Slot, Request),
    /// Member to member.
    Peer {
        /// The sender.
        from: Slot,
        /// The receiver.
        to: Slot,
        /// What it says.
        message: Message,
    },
    /// Proxy to client.
    Reply(Slot, Response),
}

/// Sees every event before it is delivered: may change it, or drop it by answering `false`.
pub type Hook = Box<dyn FnMut(&mut Event) -> bool>;

/// The members of one group, driven synchronously.
pub struct LocalGroup {
    /// The members, by slot.
    pub servers: Vec<Server>,
    /// Applied to every event, in order.
    pub hooks: Vec<Hook>,
    /// The clock every member reads.
    pub now: Time,
    /// The client the operations run as, and what it may do.
    pub client: ClientId,
    /// What the client may do.
    pub access: Access,
    /// Encoded bytes of every event delivered, when counting.
    pub bytes: u64,
    /// Whether to encode each event to count its bytes (costs CPU).
    pub count_bytes: bool,
    /// Events delivered.
    pub delivered: u64,
}

impl LocalGroup {
    /// `servers` at `now`, serving `client` with every right.
    pub fn new(servers: Vec<Server>, now: Time, client: ClientId) -> LocalGroup {
        LocalGroup {
            servers,
            hooks: Vec::new(),
            now,
            client,
            access: Access {
                write: true,
                read: true,
            },
            bytes: 0,
            count_bytes: false,
            delivered: 0,
        }
    }

    /// Runs `op` to its end: events in order; when none is left, the proxies' pending waits
    /// end, then the client times out; at most `rounds` times.
    pub fn run<O>(&mut self, op: &mut O, rounds: usize) -> Result<O::Output, OpError>
    where
        O: Operation<Request = Request, Reply = Response>,
    {
        let mut queue: VecDeque<Event> = op
            .start()
            .into_iter()
            .map(|(slot, request)| Event::Request(slot, request))
            .collect();
        let mut timers: Vec<(Slot, TimerId)> = Vec::new();
        for _ in 0..rounds {
            while let Some(mut event) = queue.pop_front() {
                if !self.hooks.iter_mut().all(|hook| hook(&mut event)) {
                    continue;
                }
                self.delivered += 1;
                if self.count_bytes {
                    self.bytes += event_bytes(&event);
                }
                let (at, out) = match event {
                    Event::Request(slot, request) => {
                        let Some(server) = self.servers.get_mut(slot.index()) else {
                            continue;
                        };
                        let out =
                            server.on_request(self.now, self.client, self.access, request, &());
                        (slot, out)
                    }
                    Event::Peer { from, to, message } => {
                        let Some(server) = self.servers.get_mut(to.index()) else {
                            continue;
                        };
                        (to, server.on_message(self.now, from, message, &()))
                    }
                    Event::Reply(slot, response) => match op.on_reply(slot, response) {
                        Progress::Done(result) => return result,
                        Progress::Send(sends) => {
                            queue.extend(sends.into_iter().map(|(s, r)| Event::Request(s, r)));
                            continue;
                        }
                    },
                };
                deliver(at, out, &mut queue, &mut timers);
            }
            if let Some((at, timer)) = timers.pop() {
                if let Some(server) = self.servers.get_mut(at.index()) {
                    let out = server.on_timer(self.now, timer, &());
                    deliver(at, out, &mut queue, &mut timers);
                }
                continue;
            }
            queue.extend(
                op.on_timeout()
                    .into_iter()
                    .map(|(slot, request)| Event::Request(slot, request)),
            );
        }
        Err(OpError::Failed(format!(
            "did not finish in {rounds} rounds"
        )))
    }
}

impl LocalGroup {
    /// Moves the clock on by `millis`, ticks every member once (anti-entropy rounds fall due)
    /// and delivers what follows until the group is quiet.
    pub fn tick(&mut self, millis: u64) {
        self.now = self.now.plus_millis(millis);
        let mut queue: VecDeque<Event> = VecDeque::new();
        let mut timers: Vec<(Slot, TimerId)> = Vec::new();
        for index in 0..self.servers.len() {
            let out = self.servers[index].on_tick(self.now);
            deliver(Slot(index as u32), out, &mut queue, &mut timers);
        }
        while let Some(mut event) = queue.pop_front() {
            if !self.hooks.iter_mut().all(|hook| hook(&mut event)) {
                continue;
            }
            self.delivered += 1;
            if let Event::Peer { from, to, message } = event
                && let Some(server) = self.servers.get_mut(to.index())
            {
                let out = server.on_message(self.now, from, message, &());
                deliver(to, out, &mut queue, &mut timers);
            }
        }
    }
}

/// Queues what member `at` said.
fn deliver(
    at: Slot,
    out: Output<Server>,
    queue: &mut VecDeque<Event>,
    timers: &mut Vec<(Slot, TimerId)>,
) {
    queue.extend(out.reply.map(|reply| Event::Reply(at, reply)));
    queue.extend(
        out.notify
            .into_iter()
            .map(|(_, _, reply)| Event::Reply(at, reply)),
    );
    queue.extend(out.sends.into_iter().map(|(to, message)| Event::Peer {
        from: at,
        to,
        message,
    }));
    timers.extend(out.timers.into_iter().map(|(id, _)| (at, id)));
}

/// The encoded size of what `event` carries, as a frame's body.
fn event_bytes(event: &Event) -> u64 {
    let len = match event {
        Event::Request(_, request) => bulwark_core::wire::encode(request).len(),
        Event::Peer { message, .. } => bulwark_core::wire::encode(message).len(),
        Event::Reply(_, response) => bulwark_core::wire::encode(response).len(),
    };
    len as u64
}
