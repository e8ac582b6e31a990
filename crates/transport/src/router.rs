//! Hands each received envelope to whoever waits for it, reading the header alone.
//!
//! Replies and refusals go to the operation registered for `header.op`: the requester chose the
//! op, so only its own registrations can claim it. Requests carry the *sender's* op, which means
//! nothing in our op space, so they never match a registration; they all go to the one request
//! handler (a node's dispatcher), if there is one.

use bulwark_core::NodeId;
use bulwark_core::envelope::{Envelope, Kind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::mpsc;

/// Where routed envelopes go, each tagged with the node it came from.
pub type RouteSender = mpsc::Sender<(NodeId, Envelope)>;

/// Routes envelopes received from nodes by their header; cheap to clone, and every clone routes
/// through the same table.
#[derive(Clone, Default)]
pub struct Router(Arc<Inner>);

#[derive(Default)]
struct Inner {
    routes: Mutex<Routes>,
    requests: Option<RouteSender>,
    counters: Counters,
}

#[derive(Default)]
struct Routes {
    by_op: HashMap<u64, (u64, RouteSender)>,
    /// Tells registrations apart, so a late drop never removes a later registration of its op.
    next_generation: u64,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    unknown_op: AtomicU64,
    overflow: AtomicU64,
    unrouted_requests: AtomicU64,
}

/// What became of one envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Handed to its receiver.
    Delivered,
    /// A reply or refusal for an op nobody (any longer) waits for: dropped.
    UnknownOp,
    /// The op's receiver was full: dropped rather than stall every other op on the connection.
    Overflow,
    /// A request, and no request handler (or it is gone): dropped.
    UnroutedRequest,
}

/// How many envelopes went where, since the router was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterStats {
    /// Handed to a registration or the request handler.
    pub delivered: u64,
    /// Replies and refusals for unregistered ops.
    pub unknown_op: u64,
    /// Replies and refusals whose op's receiver was full.
    pub overflow: u64,
    /// Requests with no request handler to take them.
    pub unrouted_requests: u64,
}

/// Another registration holds this op; a second one would silently steal its replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("op {0} is already registered")]
pub struct OpTaken(pub u64);

/// Keeps an op's route; dropping it removes the route.
#[must_use = "the route is removed when the registration is dropped"]
pub struct Registration {
    router: Router,
    op: u64,
    generation: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut routes = self.router.routes();
        if routes
            .by_op
            .get(&self.op)
            .is_some_and(|(generation, _)| *generation == self.generation)
        {
            routes.by_op.remove(&self.op);
        }
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("op", &self.op)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router for replies only: requests are dropped and counted (a client serves none).
    pub fn new() -> Router {
        Router::default()
    }

    /// A router that also hands every request to `requests`. Requests wait for room there: a
    /// dispatcher that falls behind slows the connections feeding it instead of losing requests.
    pub fn with_requests(requests: RouteSender) -> Router {
        Router(Arc::new(Inner {
            requests: Some(requests),
            ..Inner::default()
        }))
    }

    /// Routes replies and refusals for `op` to `sender` until the registration is dropped.
    ///
    /// Replies are offered without waiting: size the channel for the replies the op expects
    /// (one per node asked, say), since those that find it full are dropped.
    pub fn register(&self, op: u64, sender: RouteSender) -> Result<Registration, OpTaken> {
        let mut routes = self.routes();
        if routes.by_op.contains_key(&op) {
            return Err(OpTaken(op));
        }
        let generation = routes.next_generation;
        routes.next_generation = generation.wrapping_add(1);
        routes.by_op.insert(op, (generation, sender));
        Ok(Registration {
            router: self.clone(),
            op,
            generation,
        })
    }

    /// Routes one envelope received from `from`. Links call this for every frame they read; a
    /// node calls it for replies that reach it on connections other nodes dialled.
    pub async fn deliver(&self, from: NodeId, envelope: Envelope) -> Delivery {
        let delivery = match envelope.header.kind {
            Kind::Request | Kind::Message => match &self.0.requests {
                Some(requests) => match requests.send((from, envelope)).await {
                    Ok(()) => Delivery::Delivered,
                    Err(_) => Delivery::UnroutedRequest,
                },
                None => Delivery::UnroutedRequest,
            },
            Kind::Reply | Kind::Refused => {
                let op = envelope.header.op;
                let route = self.routes().by_op.get(&op).map(|(_, s)| s.clone());
                match route {
                    None => Delivery::UnknownOp,
                    Some(sender) => match sender.try_send((from, envelope)) {
                        Ok(()) => Delivery::Delivered,
                        Err(mpsc::error::TrySendError::Full(_)) => Delivery::Overflow,
                        // The op ended but its registration lingers: the same as unknown.
                        Err(mpsc::error::TrySendError::Closed(_)) => Delivery::UnknownOp,
                    },
                }
            }
        };
        self.count(from, delivery);
        delivery
    }

    /// The counts so far.
    pub fn stats(&self) -> RouterStats {
        let c = &self.0.counters;
        RouterStats {
            delivered: c.delivered.load(Ordering::Relaxed),
            unknown_op: c.unknown_op.load(Ordering::Relaxed),
            overflow: c.overflow.load(Ordering::Relaxed),
            unrouted_requests: c.unrouted_requests.load(Ordering::Relaxed),
        }
    }

    fn count(&self, from: NodeId, delivery: Delivery) {
        let c = &self.0.counters;
        let (counter, metric) = match delivery {
            Delivery::Delivered => (&c.delivered, None),
            Delivery::UnknownOp => (&c.unknown_op, Some("unknown_op")),
            Delivery::Overflow => (&c.overflow, Some("overflow")),
            Delivery::UnroutedRequest => (&c.unrouted_requests, Some("unrouted_request")),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = metric {
            // Late replies after an op finished are routine; this is for tracing, not alarm.
            tracing::trace!(node = %from, reason, "envelope dropped");
            metrics::counter!("bulwark_transport_envelopes_dropped_total", "reason" => reason)
                .increment(1);
        }
    }

    fn routes(&self) -> MutexGuard<'_, Routes> {
        // Nothing panics while holding the lock, and the table is valid between statements.
        self.0.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("ops", &self.routes().by_op.len())
            .field("requests", &self.0.requests.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::envelope::{Header, frame_raw};
    use bulwark_core::{Epoch, GroupId, ServiceId};

    fn envelope(kind: Kind, op: u64) -> Envelope {
        let header = Header {
            kind,
            ..Header::request(ServiceId(1), GroupId(0), Epoch(0), op)
        };
        Envelope::decode(frame_raw(&header, b"body")).unwrap()
    }

    #[tokio::test]
    async fn replies_go_to_their_op_and_requests_to_the_handler() {
        let (requests, mut incoming) = mpsc::channel(4);
        let router = Router::with_requests(requests);
        let (sender, mut replies) = mpsc::channel(4);
        let registration = router.register(7, sender.clone()).unwrap();
        assert_eq!(router.register(7, sender.clone()).err(), Some(OpTaken(7)));

        let from = NodeId(3);
        for kind in [Kind::Reply, Kind::Refused] {
            assert_eq!(
                router.deliver(from, envelope(kind, 7)).await,
                Delivery::Delivered
            );
            let (node, got) = replies.try_recv().unwrap();
            assert_eq!((node, got.header.kind), (from, kind));
        }
        // A request's op is the sender's; it must not reach our op 7.
        assert_eq!(
            router.deliver(from, envelope(Kind::Request, 7)).await,
            Delivery::Delivered
        );
        assert_eq!(incoming.try_recv().unwrap().1.header.kind, Kind::Request);
        assert!(replies.try_recv().is_err());

        assert_eq!(
            router.deliver(from, envelope(Kind::Reply, 8)).await,
            Delivery::UnknownOp
        );
        drop(registration);
        assert_eq!(
            router.deliver(from, envelope(Kind::Reply, 7)).await,
            Delivery::UnknownOp
        );
        assert_eq!(
            router.stats(),
            RouterStats {
                delivered: 3,
                unknown_op: 2,
                overflow: 0,
                unrouted_requests: 0
            }
        );
    }

    #[tokio::test]
    async fn a_full_receiver_drops_and_a_stale_registration_never_removes_a_new_one() {
        let router = Router::new();
        let (sender, _replies) = mpsc::channel(1);
        let _registration = router.register(1, sender).unwrap();
        assert_eq!(
            router.deliver(NodeId(0), envelope(Kind::Reply, 1)).await,
            Delivery::Delivered
        );
        assert_eq!(
            router.deliver(NodeId(0), envelope(Kind::Reply, 1)).await,
            Delivery::Overflow
        );
        assert_eq!(
            router.deliver(NodeId(0), envelope(Kind::Request, 1)).await,
            Delivery::UnroutedRequest,
            "a router without a request handler drops requests"
        );

        let (first, _r1) = mpsc::channel(1);
        let old = router.register(2, first).unwrap();
        // Simulates a registration outliving its entry: the entry is replaced behind its back.
        router.routes().by_op.remove(&2);
        let (second, mut r2) = mpsc::channel(1);
        let _new = router.register(2, second).unwrap();
        drop(old);
        assert_eq!(
            router.deliver(NodeId(0), envelope(Kind::Reply, 2)).await,
            Delivery::Delivered
        );
        assert!(r2.try_recv().is_ok());
    }
}
