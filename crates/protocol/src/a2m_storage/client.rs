//! A2M-Storage's client operations: a read, and a write that reads the state it is computed on
//! first. Every answer is checked against the trusted log's attestations before it is believed;
//! an answer that fails a check ends the operation with the reason, which names what the server
//! did (a correct server's answers always pass).

use super::{
    OBJECT_BYTES_MAX, Reply, Request, Snapshot, Timestamp, Version, VersionBlock, Volume,
    WriteRequest, leaf, path,
};
use crate::machine::{OpError, Operation, Progress};
use crate::round::OpId;
use bulwark_core::a2m::{Expected, Kind, Nonce, Status};
use bulwark_core::sign::{SecretKey, Signed};
use bulwark_core::smt::{Proof, Tree};
use bulwark_core::{Digest, Key, ServiceId, Slot};
use bytes::Bytes;
use std::sync::Arc;

/// Times a write is computed again after losing the race to another writer.
pub const ROUNDS_MAX: u32 = 64;

/// A state the server proved: the key's value and where it sits in the version block's tree.
struct Proven {
    value: Option<Bytes>,
    timestamp: Timestamp,
    proof: Proof,
}

/// Why the server's answer is not believed: what it did, for the operation's error.
fn misbehaved(reason: String) -> OpError {
    OpError::Failed(format!("the server misbehaved: {reason}"))
}

/// Checks a snapshot of `key` for `nonce` (spec §4.2 "Read"): both ENDs are the log's, for this
/// nonce, at one write `n`; the version block is the one the `versions` log ends with, signed by
/// a writer, for write `n`; the proof leads from the value to its root. And nothing older or
/// different from what this client already saw (`known`).
fn check(
    volume: &Volume,
    key: &Key,
    nonce: Nonce,
    known: Option<Timestamp>,
    snapshot: &Snapshot,
) -> Result<Proven, String> {
    let end = |log, attestation| {
        Expected::end(log, nonce)
            .check(&volume.log_key, attestation)
            .map(|signed| *signed.value())
            .map_err(|e| format!("log {log}'s END: {e}"))
    };
    let requests = end(volume.requests, snapshot.requests.clone())?;
    let versions = end(volume.versions, snapshot.versions.clone())?;
    if requests.seq != versions.seq {
        return Err(format!(
            "its logs end at different writes ({} and {})",
            requests.seq, versions.seq
        ));
    }
    let seq = u64::try_from(requests.seq).map_err(|_| "its log ends past any write".to_string())?;
    let timestamp = Timestamp {
        seq,
        requests: requests.digest,
        versions: versions.digest,
    };
    let root = match &snapshot.version {
        None if seq == 0 => Tree::new().root(),
        None => return Err(format!("no version block for write {seq}")),
        Some(version) => {
            if version.hash() != versions.value {
                return Err(format!(
                    "its version block is not the one its log holds at write {seq}"
                ));
            }
            let signer = volume
                .writers
                .get(version.writer as usize)
                .ok_or("its version block names no writer")?;
            let block = version
                .block
                .clone()
                .verify(signer)
                .map_err(|e| format!("its version block: {e}"))?;
            let block = block.value();
            if block.volume != volume.id || block.writer != version.writer || block.seq != seq {
                return Err(format!(
                    "its version block is not write {seq} of this volume"
                ));
            }
            block.root
        }
    };
    if snapshot
        .value
        .as_ref()
        .is_some_and(|value| value.len() > OBJECT_BYTES_MAX)
    {
        return Err("the object is larger than the limit".into());
    }
    let value_leaf = snapshot.value.as_deref().map(leaf);
    if !snapshot
        .proof
        .proves(&root, &path(key), value_leaf.as_ref())
    {
        return Err("the object is not in the state its version block names".into());
    }
    if let Some(known) = known {
        if seq < known.seq {
            return Err(format!(
                "it showed write {seq} after write {} (a rollback)",
                known.seq
            ));
        }
        if seq == known.seq && timestamp != known {
            return Err(format!("it showed two histories of write {seq} (a fork)"));
        }
    }
    Ok(Proven {
        value: snapshot.value.clone(),
        timestamp,
        proof: snapshot.proof.clone(),
    })
}

/// A read of one key.
pub struct Read {
    volume: Volume,
    op: OpId,
    key: Key,
    nonce: Nonce,
    known: Option<Timestamp>,
}

impl Read {
    /// A read of `key` with a fresh `nonce`, by a client that last saw `known`.
    pub fn new(volume: Volume, op: OpId, key: Key, nonce: Nonce, known: Option<Timestamp>) -> Read {
        Read {
            volume,
            op,
            key,
            nonce,
            known,
        }
    }
}

impl Operation for Read {
    const SERVICE: ServiceId = ServiceId::A2M_STORAGE;
    type Request = Request;
    type Reply = Reply;
    /// The value, and the timestamp of the state it was read from.
    type Output = (Option<Bytes>, Timestamp);

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        vec![(
            Slot(0),
            Request::Read {
                op: self.op,
                key: self.key.clone(),
                nonce: self.nonce,
            },
        )]
    }

    fn on_reply(&mut self, from: Slot, reply: Reply) -> Progress<Self> {
        if reply.op() != self.op || reply.nonce() != self.nonce {
            return Progress::Send(Vec::new());
        }
        Progress::Done(match reply {
            Reply::State { snapshot, .. } => {
                check(&self.volume, &self.key, self.nonce, self.known, &snapshot)
                    .map(|proven| (proven.value, proven.timestamp))
                    .map_err(misbehaved)
            }
            Reply::Refused { reason, .. } => Err(OpError::Refused {
                reason,
                by: vec![from],
            }),
            Reply::Written { .. } | Reply::Stale { .. } => {
                Err(misbehaved("it answered a read as a write".into()))
            }
        })
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        self.start()
    }

    fn answered(&self) -> Vec<Slot> {
        Vec::new()
    }

    fn quorum(&self) -> usize {
        1
    }
}

/// Where a write is.
enum Phase {
    /// Reading the state it will be computed on.
    Fetch { nonce: Nonce },
    /// Sent, computed on `request.after`.
    Sent {
        request: Box<WriteRequest>,
        version: Box<Version>,
    },
}

/// A write (or delete) of one key by one writer.
pub struct Write {
    volume: Volume,
    op: OpId,
    key: Key,
    value: Option<Bytes>,
    writer: u32,
    secret: Arc<SecretKey>,
    seed: Nonce,
    rounds: u32,
    known: Option<Timestamp>,
    phase: Phase,
}

impl Write {
    /// A write of `value` (`None` deletes) to `key` by writer `writer`, who signs version
    /// blocks with `secret`; its nonces derive from the fresh `seed`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        volume: Volume,
        op: OpId,
        key: Key,
        value: Option<Bytes>,
        writer: u32,
        secret: Arc<SecretKey>,
        seed: Nonce,
        known: Option<Timestamp>,
    ) -> Write {
        Write {
            volume,
            op,
            key,
            value,
            writer,
            secret,
            seed,
            rounds: 0,
            known,
            phase: Phase::Fetch {
                nonce: nonce(&seed, 0),
            },
        }
    }

    /// The write computed on `proven`, signed, with a fresh nonce.
    fn compute(&mut self, proven: Proven) -> Result<Vec<(Slot, Request)>, OpError> {
        self.rounds += 1;
        if self.rounds > ROUNDS_MAX {
            return Err(OpError::Failed(format!(
                "other writes came first {ROUNDS_MAX} times in a row"
            )));
        }
        let root = proven
            .proof
            .root(&path(&self.key), self.value.as_deref().map(leaf).as_ref())
            .map_err(|e| misbehaved(format!("its proof: {e}")))?;
        let Some(seq) = proven.timestamp.seq.checked_add(1) else {
            return Err(misbehaved("its log ends at the last write there is".into()));
        };
        let block = VersionBlock {
            volume: self.volume.id,
            seq,
            root,
            writer: self.writer,
        };
        let signed = Signed::sign(&self.secret, block)
            .map_err(|e| OpError::Failed(format!("signing the version block: {e}")))?;
        let version = Version {
            writer: self.writer,
            block: signed.to_unverified(),
        };
        let request = WriteRequest {
            volume: self.volume.id,
            key: self.key.clone(),
            value: self.value.clone(),
            after: proven.timestamp,
            nonce: nonce(&self.seed, self.rounds),
        };
        self.known = Some(proven.timestamp);
        let (request, version) = (Box::new(request), Box::new(version));
        self.phase = Phase::Sent {
            request: request.clone(),
            version: version.clone(),
        };
        Ok(vec![(
            Slot(0),
            Request::Write {
                op: self.op,
                write: request,
                version,
            },
        )])
    }

    /// The attestation of slot `after.seq + 1` of `log` a committed write gets: the write's
    /// value there, chained right after the state it was computed on.
    fn slot(log: u64, seq: u64, nonce: Nonce, value: [u8; 32], digest: [u8; 32]) -> Expected {
        Expected {
            kind: Kind::Lookup,
            log,
            seq: u128::from(seq),
            nonce,
            status: Status::Assigned,
            ref_seq: u128::from(seq),
            value: Some(value),
            digest: Some(digest),
        }
    }
}

impl Operation for Write {
    const SERVICE: ServiceId = ServiceId::A2M_STORAGE;
    type Request = Request;
    type Reply = Reply;
    /// The timestamp right after the write.
    type Output = Timestamp;

    fn op(&self) -> u64 {
        self.op.0
    }

    fn start(&mut self) -> Vec<(Slot, Request)> {
        match &self.phase {
            Phase::Fetch { nonce } => vec![(
                Slot(0),
                Request::Read {
                    op: self.op,
                    key: self.key.clone(),
                    nonce: *nonce,
                },
            )],
            Phase::Sent { request, version } => vec![(
                Slot(0),
                Request::Write {
                    op: self.op,
                    write: request.clone(),
                    version: version.clone(),
                },
            )],
        }
    }

    fn on_reply(&mut self, from: Slot, reply: Reply) -> Progress<Self> {
        let current = match &self.phase {
            Phase::Fetch { nonce } => *nonce,
            Phase::Sent { request, .. } => request.nonce,
        };
        // An answer to an earlier round (a retransmission's, late) is not this round's.
        if reply.op() != self.op || reply.nonce() != current {
            return Progress::Send(Vec::new());
        }
        let (fetched, nonce) = match (&self.phase, &reply) {
            (Phase::Fetch { nonce }, Reply::State { snapshot, .. }) => (snapshot, *nonce),
            (Phase::Sent { request, .. }, Reply::Stale { snapshot, .. }) => {
                (snapshot, request.nonce)
            }
            (
                Phase::Sent { request, version },
                Reply::Written {
                    requests, versions, ..
                },
            ) => {
                let after = request.after.next(&request.hash(), &version.hash());
                let expect =
                    |log, value, digest| Self::slot(log, after.seq, request.nonce, value, digest);
                let requests = expect(self.volume.requests, request.hash(), after.requests)
                    .check(&self.volume.log_key, requests.clone());
                let versions = expect(self.volume.versions, version.hash(), after.versions)
                    .check(&self.volume.log_key, versions.clone());
                return Progress::Done(match (requests, versions) {
                    (Ok(_), Ok(_)) => Ok(after),
                    (Err(e), _) | (_, Err(e)) => Err(misbehaved(format!(
                        "its log did not take the write right after write {}: {e}",
                        request.after.seq
                    ))),
                });
            }
            (_, Reply::Refused { reason, .. }) => {
                return Progress::Done(Err(OpError::Refused {
                    reason: reason.clone(),
                    by: vec![from],
                }));
            }
            // An answer to a round this write is no longer in: a retransmission's.
            _ => return Progress::Send(Vec::new()),
        };
        let proven = match check(&self.volume, &self.key, nonce, self.known, fetched) {
            Ok(proven) => proven,
            Err(reason) => return Progress::Done(Err(misbehaved(reason))),
        };
        if let Phase::Sent { request, .. } = &self.phase
            && proven.timestamp == request.after
        {
            return Progress::Done(Err(misbehaved(format!(
                "it refused a write computed on its current state (write {})",
                proven.timestamp.seq
            ))));
        }
        match self.compute(proven) {
            Ok(sends) => Progress::Send(sends),
            Err(error) => Progress::Done(Err(error)),
        }
    }

    fn on_timeout(&mut self) -> Vec<(Slot, Request)> {
        self.start()
    }

    fn answered(&self) -> Vec<Slot> {
        Vec::new()
    }

    fn quorum(&self) -> usize {
        1
    }
}

/// The nonce of round `round` of an operation whose fresh seed is `seed`.
fn nonce(seed: &Nonce, round: u32) -> Nonce {
    let mut bytes = seed.to_vec();
    bytes.extend_from_slice(&round.to_be_bytes());
    Digest::of("bulwark/a2m-storage/nonce/v1", &bytes).0
}
