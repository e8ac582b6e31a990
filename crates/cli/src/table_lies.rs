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
