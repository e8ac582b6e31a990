//! Single-server volumes (A2M-Storage, A2M §4.2): every operation goes to the one node that
//! serves the volume and is checked against that node's trusted log before it is believed. A
//! server caught contradicting its log (a fork, a rollback, a forged object) is recorded in the
//! evidence log and the operation fails with what it did; it is never retried elsewhere, since
//! there is nowhere else.

use crate::{Client, ClientError, OpReport};
use bulwark_core::evidence::{Evidence, EvidenceKind};
use bulwark_core::membership::GroupView;
use bulwark_core::sign::PublicKey;
use bulwark_core::wire;
use bulwark_core::{GroupId, Key, NodeId};
use bulwark_protocol::a2m_storage::{self, Read, Timestamp, Write};
use bulwark_protocol::powerstore::OpId;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a failed A2M-Storage check says first (the machines' `misbehaved`).
const MISBEHAVED: &str = "the server misbehaved: ";

/// Where a client with a directory keeps the newest state it saw of each single-server volume,
/// so that its next run still catches a server showing it an older one.
pub const SEEN_FILE: &str = "volumes-seen.bin";
/// The largest [`SEEN_FILE`] read.
const SEEN_BYTES_MAX: u64 = 1 << 20;
/// Volumes [`SEEN_FILE`] keeps at most (the most written first).
const SEEN_VOLUMES_MAX: usize = 4096;

/// One volume's newest state seen, with the trusted log it was attested by: a cluster made
/// again in the same directory has other keys, and its volumes start over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    node: u32,
    number: u32,
    log_key: [u8; 32],
    timestamp: Timestamp,
}

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

    /// The newest state this client saw of `volume` on `server`, in this run or (for a client
    /// with a directory) an earlier one.
    fn seen(&self, server: NodeId, volume: &a2m_storage::Volume) -> Option<Timestamp> {
        let number = volume.id as u32;
        if let Some(timestamp) = self.seen.lock().ok()?.get(&(server, number)) {
            return Some(*timestamp);
        }
        let kept = self
            .load_seen()
            .into_iter()
            .find(|seen| seen.node == server.0 && seen.number == number)
            .filter(|seen| seen.log_key == volume.log_key.to_bytes())?;
        self.seen
            .lock()
            .ok()?
            .insert((server, number), kept.timestamp);
        Some(kept.timestamp)
    }

    /// Remembers `timestamp` if it is newer than what this client saw, and keeps it for the
    /// next run.
    fn saw(&self, server: NodeId, volume: &a2m_storage::Volume, timestamp: Timestamp) {
        let number = volume.id as u32;
        let advanced = match self.seen.lock() {
            Ok(mut seen) => {
                let newest = seen.entry((server, number)).or_insert(Timestamp::GENESIS);
                let advanced = timestamp.seq > newest.seq;
                if advanced {
                    *newest = timestamp;
                }
                advanced
            }
            Err(_) => false,
        };
        if advanced {
            self.save_seen(Seen {
                node: server.0,
                number,
                log_key: volume.log_key.to_bytes(),
                timestamp,
            });
        }
    }

    /// What [`SEEN_FILE`] holds; nothing when it is missing or damaged.
    fn load_seen(&self) -> Vec<Seen> {
        use std::io::Read;
        let Some(path) = self.seen_file.as_ref() else {
            return Vec::new();
        };
        let mut bytes = Vec::new();
        let read = std::fs::File::open(path)
            .and_then(|file| file.take(SEEN_BYTES_MAX).read_to_end(&mut bytes));
        if read.is_err() {
            return Vec::new();
        }
        wire::decode::<Vec<Seen>>(&bytes, SEEN_BYTES_MAX as usize).unwrap_or_else(|error| {
            tracing::warn!(path = %path.display(), %error, "kept volume states ignored");
            Vec::new()
        })
    }

    /// Adds `seen` to [`SEEN_FILE`], keeping the newer of it and what the file holds (another
    /// process of this client may have saved since), replacing the file whole. Best effort:
    /// without it the next run checks freshness by its nonces alone.
    fn save_seen(&self, seen: Seen) {
        let Some(path) = self.seen_file.as_ref() else {
            return;
        };
        let mut all = self.load_seen();
        match all.iter_mut().find(|kept| {
            (kept.node, kept.number, kept.log_key) == (seen.node, seen.number, seen.log_key)
        }) {
            Some(kept) if kept.timestamp.seq >= seen.timestamp.seq => return,
            Some(kept) => *kept = seen,
            None => all.push(seen),
        }
        if all.len() > SEEN_VOLUMES_MAX {
            all.sort_by_key(|kept| std::cmp::Reverse(kept.timestamp.seq));
            all.truncate(SEEN_VOLUMES_MAX);
        }
        let staged = path.with_extension(format!("{:016x}.tmp", rand::random::<u64>()));
        let written = std::fs::write(&staged, wire::encode(&all))
            .and_then(|()| std::fs::rename(&staged, path));
        if let Err(error) = written {
            let _ = std::fs::remove_file(&staged);
            tracing::debug!(path = %path.display(), %error, "volume state not kept");
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
        let known = self.seen(server, &volume);
        let mut machine = Write::new(
            volume.clone(),
            op,
            key.clone(),
            value,
            writer as u32,
            secret,
            rand::random(),
            known,
        );
        let timestamp = self
            .drive(&view, &key, 0, &mut machine)
            .await
            .map_err(|error| self.unwrap_op(&view, &key, error))?;
        self.saw(server, &volume, timestamp);
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
        let known = self.seen(server, &volume);
        let mut machine = Read::new(volume.clone(), op, key.clone(), rand::random(), known);
        let (value, timestamp) = self
            .drive(&view, &key, 0, &mut machine)
            .await
            .map_err(|error| self.unwrap_op(&view, &key, error))?;
        self.saw(server, &volume, timestamp);
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
