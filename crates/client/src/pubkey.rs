//! Public-key objects from the client's side (Rosebud §4.4): mutable objects named by the hash of
//! their owner's key, written by whoever holds the private key, placed on the group their id
//! falls in.

use crate::{Client, ClientError, OpReport, by_id, nodes, register_report};
use bulwark_core::Key;
use bulwark_core::membership::{Chain, GroupView};
use bulwark_core::sign::{PublicKey, SecretKey};
use bulwark_protocol::pubkey;
use bulwark_protocol::register::reconfig::routed;
use bytes::Bytes;
use std::sync::Arc;

impl Client {
    /// The verified configurations, and the group `id` belongs to in the newest of them.
    async fn route(&self, id: &Key) -> Result<(Arc<Chain>, GroupView), ClientError> {
        let chain = self.rings().await?;
        let view = chain.newest().group_of(id.as_bytes());
        Ok((chain, view))
    }

    /// Writes `value` (`None` deletes) as the next version of the object `owner` owns, signed
    /// with its key, and returns the object's id. Any client that may write and holds the key
    /// can do so; versions of different clients never collide.
    pub async fn put_owned(
        &self,
        owner: &SecretKey,
        value: Option<Bytes>,
    ) -> Result<(Key, OpReport), ClientError> {
        self.may_store(value.as_ref().map_or(0, Bytes::len))?;
        self.fresh().await?;
        let op = self.op_id();
        let id = pubkey::object_id(&owner.public_key());
        let (chain, view) = self.route(&id).await?;
        let mut config = pubkey::ClientConfig::new(self.cluster.f);
        config.epoch = view.epoch();
        config.group = view.id();
        let inner = pubkey::WriteOp::new(config, op, self.id, op.0, Arc::new(owner.clone()), value);
        let mut machine = routed(inner, &id, chain, view.epoch());
        let outcome = self.drive(&view, &id, self.cluster.f, &mut machine).await?;
        let report = OpReport {
            answered: nodes(by_id, &outcome.acknowledged_by),
            n: view.len(),
            evidence: Vec::new(),
            restarts: 0,
            repaired: false,
        };
        Ok((id, report))
    }

    /// Reads the object `owner` owns: its newest version every correct replica will agree on,
    /// or `None` if it was never written or was deleted.
    pub async fn get_owned(
        &self,
        owner: &PublicKey,
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        self.fresh().await?;
        let op = self.op_id();
        let id = pubkey::object_id(owner);
        let (chain, view) = self.route(&id).await?;
        let mut config = pubkey::ClientConfig::new(self.cluster.f);
        config.epoch = view.epoch();
        config.group = view.id();
        let inner = pubkey::ReadOp::new(config, id.clone(), op);
        let mut machine = routed(inner, &id, chain, view.epoch());
        let outcome = self.drive(&view, &id, self.cluster.f, &mut machine).await?;
        let report = register_report(by_id, view.len(), &id, &outcome);
        self.record(&report.evidence);
        Ok((outcome.value, report))
    }
}
