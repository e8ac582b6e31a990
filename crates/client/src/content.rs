//! Content-hash objects from the client's side (Rosebud §4.3): immutable objects named by their
//! content, placed on the group their id falls in.

use crate::{Client, ClientError, OpReport, blame, nodes};
use bulwark_core::membership::GroupView;
use bulwark_core::sign::PublicKey;
use bulwark_protocol::content::{self, ContentId, Place};
use bytes::Bytes;
use std::sync::Arc;

impl Client {
    /// Stores `value` as a content-hash object and returns its id: the same bytes always get the
    /// same id. Done when `2f+1` replicas of its group have signed that their fragment is durable.
    pub async fn put_content(&self, value: &[u8]) -> Result<(ContentId, OpReport), ClientError> {
        self.may_store(value.len())?;
        self.fresh().await?;
        let op = self.op_id();
        // The id decides the group; it depends only on the group's size, 3f+1 for every group.
        let f = self.cluster.f;
        let encoded = content::Encoded::new(&*self.codec, 3 * f + 1, f, value)
            .map_err(ClientError::Protocol)?;
        let id = encoded.id;
        let view = self.placement.group_of(id.as_bytes());
        let place = self.content_place(&view, f);
        let mut machine = content::WriteOp::new(place, self.content_keys(&view)?, op, encoded)
            .map_err(ClientError::Protocol)?;
        let outcome = self.drive(&view, &id, f, &mut machine).await?;
        let answered: Vec<_> = outcome.acks.iter().map(|(slot, _)| *slot).collect();
        let report = OpReport {
            answered: nodes(&view, &answered),
            n: view.len(),
            evidence: blame(&view, &format!("content {id}"), &outcome.evidence),
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
        let view = self.placement.group_of(id.as_bytes());
        let place = self.content_place(&view, self.cluster.f);
        let mut machine = content::ReadOp::new(place, self.codec.clone(), op, *id);
        let outcome = self.drive(&view, id, self.cluster.f, &mut machine).await?;
        let report = OpReport {
            answered: nodes(&view, &outcome.answered_by),
            n: view.len(),
            evidence: blame(&view, &format!("content {id}"), &outcome.evidence),
            restarts: 0,
            repaired: false,
        };
        self.record(&report.evidence);
        Ok((outcome.value, report))
    }

    fn content_place(&self, view: &GroupView, f: usize) -> Place {
        Place {
            slot: bulwark_core::Slot(0),
            n: view.len(),
            f,
            epoch: self.epoch(),
            group: view.id(),
        }
    }

    /// The signing keys of `view`'s members, by slot: what their acknowledgements are checked
    /// against.
    pub(crate) fn content_keys(&self, view: &GroupView) -> Result<Arc<[PublicKey]>, ClientError> {
        self.cluster
            .signing_keys(view.members())
            .map_err(ClientError::Protocol)
    }
}
