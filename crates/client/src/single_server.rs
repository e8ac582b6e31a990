//! Single-server volumes (A2M-Storage, A2M §4.2): every operation goes to the one node that
//! serves the volume and is checked against that node's trusted log before it is believed. A
//! server caught contradicting its log (a fork, a rollback, a forged object) is recorded in the
//! evidence log and the operation fails with what it did; it is never retried elsewhere, since
//! there is nowhere else.

use crate::{Client, ClientError, OpReport};
use bulwark_core::evidence::{Evidence, EvidenceKind};
use bulwark_core::membership::GroupView;
use bulwark_core::sign::PublicKey;
use bulwark_core::{GroupId, Key, NodeId};
use bulwark_protocol::a2m_storage::{self, Read, Timestamp, Write};
use bulwark_protocol::powerstore::OpId;
use bytes::Bytes;
use std::sync::Arc;

/// What a failed A2M-Storage check says first (the machines' `misbehaved`).
const MISBEHAVED: &str = "the server misbehaved: ";

impl Client {
    /// Volume `number` of `server` as its clients check it: the server's trusted-log key from
    /// `cluster.toml`, the cluster's writers, and the one-node group its frames go to.
    pub(crate) fn single_server(
        &self,
        server: NodeId,
        number: u32,
    ) -> Result<(GroupView, a2m_storage::Volume), ClientError> {
        let problem = |problem: String| ClientError::Volume {
            name: format!("{number} on {server}"),
            problem,
        };
        let entry = self
            .cluster
            .node(server)
            .ok_or_else(|| problem(format!("{server} is not in cluster.toml")))?;
        let key = entry.a2m_key.ok_or_else(|| {
            problem(format!(
                "{server} has no trusted log (no a2m_key in cluster.toml; see `cluster init --a2m`)"
            ))
        })?;
        let log_key = PublicKey::from_bytes(&key)
            .map_err(|error| problem(format!("{server}'s a2m_key: {error}")))?;
        let writers = a2m_storage::writers(&self.cluster)
            .into_iter()
            .map(|(_, key)| key)
            .collect();
        let volume = a2m_storage::Volume::numbered(number, log_key, Arc::new(writers));
        let view = GroupView::new(GroupId(number), self.epoch(), vec![server])
            .map_err(|error| problem(error.to_string()))?;
        Ok((view, volume))
    }

    /// The newest state this client saw of the volume.
    fn seen(&self, server: NodeId, number: u32) -> Option<Timestamp> {
        self.seen.lock().ok()?.get(&(server, number)).copied()
    }

    /// Remembers `timestamp` if it is newer than what this client saw.
    fn saw(&self, server: NodeId, number: u32, timestamp: Timestamp) {
        if let Ok(mut seen) = self.seen.lock() {
            let newest = seen.entry((server, number)).or_insert(timestamp);
            if timestamp.seq > newest.seq {
                *newest = timestamp;
            }
        }
    }

    pub(crate) async fn single_server_write(
        &self,
        server: NodeId,
        number: u32,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
    ) -> Result<OpReport, ClientError> {
        let (view, volume) = self.single_server(server, number)?;
        let not_writer = || ClientError::NotWriter {
            name: self.name.clone(),
        };
        let writer = a2m_storage::writers(&self.cluster)
            .iter()
            .position(|(id, _)| *id == self.id)
            .ok_or_else(not_writer)?;
        let secret = self.signing.clone().ok_or_else(not_writer)?;
        let mut machine = Write::new(
            volume,
            op,
            key.clone(),
            value,
            writer as u32,
            secret,
            rand::random(),
            self.seen(server, number),
        );
        let timestamp = self
            .drive(&view, &key, 0, &mut machine)
            .await
            .map_err(|error| self.unwrap_op(&view, &key, error))?;
        self.saw(server, number, timestamp);
        Ok(OpReport {
            answered: vec![server],
            n: 1,
            ..OpReport::default()
        })
    }

    pub(crate) async fn single_server_read(
        &self,
        server: NodeId,
        number: u32,
        key: Key,
        op: OpId,
    ) -> Result<(Option<Bytes>, OpReport), ClientError> {
        let (view, volume) = self.single_server(server, number)?;
        let mut machine = Read::new(
            volume,
            op,
            key.clone(),
            rand::random(),
            self.seen(server, number),
        );
        let (value, timestamp) = self
            .drive(&view, &key, 0, &mut machine)
            .await
            .map_err(|error| self.unwrap_op(&view, &key, error))?;
        self.saw(server, number, timestamp);
        let report = OpReport {
            answered: vec![server],
            n: 1,
            ..OpReport::default()
        };
        Ok((value, report))
    }

    /// `drive` reports a machine's failure as a protocol error: a lie the machine caught is
    /// recorded as evidence against the server and named as what it is.
    fn unwrap_op(&self, view: &GroupView, key: &Key, error: ClientError) -> ClientError {
        let ClientError::Protocol(text) = &error else {
            return error;
        };
        let Some(detail) = text.strip_prefix(MISBEHAVED) else {
            return error;
        };
        let server = view.members()[0];
        let evidence = Evidence::new(server, EvidenceKind::other("trusted_log_contradicted"))
            .with_detail(format!("key {key}: {detail}"));
        self.record(std::slice::from_ref(&evidence));
        ClientError::Misbehaved {
            node: server,
            detail: detail.to_string(),
        }
    }
}
