//! Content-hash objects from the client's side (Rosebud §4.3): immutable objects named by their
//! content, placed on the group their id falls in in the newest configuration the client has
//! verified, and followed into newer epochs when a replica says the configuration moved on.

use crate::{Client, ClientError, OpReport, blame, by_id, nodes};
use bulwark_core::membership::{Chain, GroupView, RingPoint};
use bulwark_core::sign::PublicKey;
use bulwark_core::{Digest, Key};
use bulwark_protocol::content::{self, ContentId, Place};
use bulwark_protocol::service::{SystemReply, SystemRequest};
use bulwark_protocol::transfer::Routed;
use bytes::Bytes;
use std::sync::Arc;

impl Client {
    /// Stores `value` as a content-hash object and returns its id: the same bytes always get the
    /// same id. Done when `2f+1` replicas of its group in one epoch have signed that their
    /// fragment is durable.
    pub async fn put_content(&self, value: &[u8]) -> Result<(ContentId, OpReport), ClientError> {
        self.may_store(value.len())?;
        self.fresh().await?;
        let op = self.op_id();
        // The id decides the group; it depends only on the group's size, 3f+1 for every group.
        let f = self.cluster.f;
        let encoded = content::Encoded::new(&*self.codec, 3 * f + 1, f, value)
            .map_err(ClientError::Protocol)?;
        let id = encoded.id;
        let (chain, point, view) = self.content_route(&id).await?;
        let keys = content_keys(&chain, &view)?;
        let inner = content::WriteOp::new(content_place(&view, f), keys, op, encoded)
            .map_err(ClientError::Protocol)?;
        let mut machine = Routed::new(inner, point, chain, view.epoch());
        let outcome = self.drive(&view, &id, f, &mut machine).await?;
        let answered: Vec<_> = outcome.acks.iter().map(|(slot, _)| *slot).collect();
        let report = OpReport {
            answered: nodes(by_id, &answered),
            n: view.len(),
            evidence: blame(by_id, &format!("content {id}"), &outcome.evidence),
            restarts: 0,
            repaired: false,
        };
        self.record(&report.evidence);
        Ok((id, report))
    }

    /// Reads the content-hash object `id`: `None` when `2f+1` replicas of its group hold none of
    /// it. Whatever is returned hashes to `id`.
    pub async fn get_content(
        &self,
        id: &ContentId,
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        self.fresh().await?;
        let op = self.op_id();
        let (chain, point, view) = self.content_route(id).await?;
        let inner = content::ReadOp::new(
            content_place(&view, self.cluster.f),
            self.codec.clone(),
            op,
            *id,
        );
        let mut machine = Routed::new(inner, point, chain, view.epoch());
        let outcome = self.drive(&view, id, self.cluster.f, &mut machine).await?;
        let report = OpReport {
            answered: nodes(by_id, &outcome.answered_by),
            n: view.len(),
            evidence: blame(by_id, &format!("content {id}"), &outcome.evidence),
            restarts: 0,
            repaired: false,
        };
        self.record(&report.evidence);
        Ok((outcome.value, report))
    }

    /// Deletes the content-hash object `id`: done once `2f+1` replicas of its group have
    /// forgotten it. Only for an object no one else refers to: the same bytes name the same
    /// object, whoever stored them (the gateway makes each chunk's bytes its own).
    pub async fn delete_content(&self, id: &ContentId) -> Result<OpReport, ClientError> {
        self.may_store(0)?;
        self.fresh().await?;
        let op = self.op_id();
        let (chain, point, view) = self.content_route(id).await?;
        let inner = content::DeleteOp::new(content_place(&view, self.cluster.f), op, *id);
        let mut machine = Routed::new(inner, point, chain, view.epoch());
        let outcome = self.drive(&view, id, self.cluster.f, &mut machine).await?;
        Ok(OpReport {
            answered: nodes(by_id, &outcome.answered_by),
            n: view.len(),
            evidence: Vec::new(),
            restarts: 0,
            repaired: false,
        })
    }

    /// One page of the ids of the content-hash objects the members of the newest verified
    /// configuration hold, in key order (ring point, then id) after object `after`: the union of
    /// every answering member's listing, at most `limit`, and whether more may follow. A
    /// faulty member may list ids nobody stored or leave some out, so this is what to look at,
    /// not proof that an object exists (a read says that) or that nothing else does.
    pub async fn list_content(
        &self,
        after: Option<&ContentId>,
        limit: usize,
    ) -> Result<(Vec<ContentId>, bool), ClientError> {
        let limit = limit.clamp(1, bulwark_protocol::service::CONTENT_OBJECTS_PER_ANSWER);
        let chain = self.rings().await?;
        let request = SystemRequest::ContentObjects {
            after: after.map(|id| id.0.0),
            limit: limit as u32,
        };
        let asks = chain.newest().members().map(|node| {
            let request = &request;
            async move { (node, self.ask_within(node, request, self.deadline).await) }
        });
        let key = |id: [u8; 32]| content::epochs::key_of(&ContentId(Digest(id)));
        let floor = after.map(content::epochs::key_of);
        let mut union = std::collections::BTreeSet::new();
        // The lowest last key of the members that hold more than they listed: past it, one of
        // them may hold objects no one listed yet.
        let mut horizon: Option<Key> = None;
        let mut answered = 0;
        for (node, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(SystemReply::ContentObjects { ids, more }) => {
                    answered += 1;
                    // Only what lies past `after`: a member that names it again, or anything
                    // before it, would hold the listing in place.
                    let ids: Vec<Key> = ids
                        .into_iter()
                        .take(limit)
                        .map(key)
                        .filter(|listed| floor.as_ref().is_none_or(|floor| listed > floor))
                        .collect();
                    if more && let Some(last) = ids.last() {
                        horizon =
                            Some(horizon.map_or_else(|| last.clone(), |h| h.min(last.clone())));
                    }
                    union.extend(ids);
                }
                Ok(_) => tracing::debug!(%node, "answered a listing with something else"),
                Err(error) => tracing::debug!(%node, %error, "no listing of content objects"),
            }
        }
        if answered == 0 {
            return Err(ClientError::Protocol(
                "no member answered a listing of content objects".into(),
            ));
        }
        let within: Vec<Key> = union
            .into_iter()
            .filter(|key| horizon.as_ref().is_none_or(|horizon| key <= horizon))
            .collect();
        let more = horizon.is_some() || within.len() > limit;
        let ids = within
            .iter()
            .take(limit)
            .filter_map(content::epochs::id_of)
            .collect();
        Ok((ids, more))
    }

    /// The verified configurations, the point `id` is placed at, and its group in the newest.
    async fn content_route(
        &self,
        id: &ContentId,
    ) -> Result<(Arc<Chain>, RingPoint, GroupView), ClientError> {
        let chain = self.rings().await?;
        let point = RingPoint::of_key(id.as_bytes());
        let view = chain.newest().group_at(point);
        Ok((chain, point, view))
    }
}

/// A client operation's place in `view`, whose `slot` is unused.
fn content_place(view: &GroupView, f: usize) -> Place {
    Place {
        slot: bulwark_core::Slot(0),
        n: view.len(),
        f,
        epoch: view.epoch(),
        group: view.id(),
    }
}

/// The signing keys of `view`'s members, by slot, as the verified configurations name them:
/// what their acknowledgements are checked against.
fn content_keys(chain: &Chain, view: &GroupView) -> Result<Arc<[PublicKey]>, ClientError> {
    view.members()
        .iter()
        .map(|node| {
            chain
                .signing_key(*node)
                .cloned()
                .ok_or_else(|| ClientError::Protocol(format!("no verified key for {node}")))
        })
        .collect()
}
