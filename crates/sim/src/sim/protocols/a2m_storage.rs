//! A2M-Storage (A2M §4.2) in the simulator: the one server of a volume, its trusted log (the
//! software component, in memory, surviving the server's crashes as a durable one would), and
//! the real read and write machines, under crashes with restart from disk, partitions, loss,
//! duplication and reordering. The register checker judges the history: every key must be
//! linearizable.
//!
//! The server is the volume's single point of failure, so its crashes stop every operation until
//! it restarts; and it is correct here: the lies a client must catch are tested against the
//! machines directly (`bulwark_protocol::a2m_storage`'s tests), since a lying server makes every
//! operation fail, which the world counts as a broken promise.

use crate::byzantine::Behaviour;
use crate::sim::config::{FaultSet, Nemesis, SimConfig};
use crate::sim::protocol::{Finish, Finished, Protocol, Storage};
use crate::sim::swarm::Swarm;
use bulwark_a2m::{Component, Limits};
use bulwark_core::sign::SecretKey;
use bulwark_core::{Digest, Key};
use bulwark_protocol::a2m_storage::{
    Change, Disk, Read, Reply, Request, Server, Timestamp, Volume, Write,
};
use bulwark_protocol::round::OpId;
use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// One run's volume: the trusted log's seed and every client's writer key.
pub struct A2mStorageSim {
    log_seed: [u8; 32],
    volume: Volume,
    writers: Vec<Arc<SecretKey>>,
}

impl Finish for Timestamp {
    fn finish(self) -> Finished {
        Finished {
            read: None,
            version: format!("w{}", self.seq),
            evidence: Vec::new(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

impl Finish for (Option<Bytes>, Timestamp) {
    fn finish(self) -> Finished {
        Finished {
            version: format!("w{}", self.1.seq),
            read: Some(self.0),
            evidence: Vec::new(),
            repaired: false,
            restarts: 0,
            one_round: false,
        }
    }
}

impl Protocol for A2mStorageSim {
    type Request = Request;
    type Response = Reply;
    type Change = Change;
    type Disk = Disk;
    type Server = Server;
    type Write = Write;
    type Read = Read;

    /// One server, whatever `f`.
    fn nodes(_f: usize) -> usize {
        1
    }

    /// Crashes, partitions and the network's faults; no Byzantine server (see the module docs)
    /// and no Byzantine readers (a reader only reads).
    fn tolerated(wanted: &FaultSet) -> FaultSet {
        let mut faults = wanted.clone();
        faults.behaviours.clear();
        faults.nemeses.remove(&Nemesis::ByzantineReaders);
        faults
    }

    fn new(rng: &mut ChaCha8Rng, config: &SimConfig, _swarm: &Swarm) -> A2mStorageSim {
        let log_seed: [u8; 32] = rng.random();
        let writers: Vec<Arc<SecretKey>> = (0..config.clients.max(1))
            .map(|_| Arc::new(SecretKey::from_seed(&rng.random())))
            .collect();
        let volume = Volume {
            id: 1,
            log_key: SecretKey::from_seed(&log_seed).public_key(),
            requests: 0,
            versions: 1,
            writers: Arc::new(writers.iter().map(|key| key.public_key()).collect()),
        };
        A2mStorageSim {
            log_seed,
            volume,
            writers,
        }
    }

    fn trusted_log(&self, _index: usize) -> Option<Component> {
        Some(Component::in_memory(&self.log_seed, Limits::default()))
    }

    fn server(&self, _index: usize, _behaviour: Behaviour, _seed: u64) -> Server {
        Server::new(self.volume.clone())
    }

    fn restore(&self, _index: usize, disk: &Disk, _now: u64) -> Server {
        Server::restore(self.volume.clone(), disk)
    }

    fn view(_: &Storage<Self>) -> &() {
        &()
    }

    fn persist(disk: &mut Disk, change: &Change) {
        disk.apply(change);
    }

    fn disk_versions(disk: &Disk) -> usize {
        disk.objects.len()
    }

    fn write(
        &self,
        client: usize,
        key: Key,
        op: OpId,
        value: Option<Bytes>,
        _now: u64,
        rng: &mut ChaCha8Rng,
    ) -> Write {
        let writer = client % self.writers.len();
        Write::new(
            self.volume.clone(),
            op,
            key,
            value,
            writer as u32,
            self.writers[writer].clone(),
            rng.random(),
            None,
        )
    }

    fn read(&self, client: usize, key: Key, op: OpId) -> Read {
        // Fresh for the run: no two operations share one.
        let nonce = Digest::of(
            "bulwark/sim/a2m-storage/nonce",
            &[client.to_be_bytes(), op.0.to_be_bytes()].concat(),
        )
        .0;
        Read::new(self.volume.clone(), op, key, nonce, None)
    }

    fn response_op(response: &Reply) -> OpId {
        response.op()
    }

    fn request_name(request: &Request) -> &'static str {
        match request {
            Request::Read { .. } => "READ",
            Request::Write { .. } => "WRITE",
        }
    }

    fn request_kind(request: &Request) -> usize {
        match request {
            Request::Read { .. } => 0,
            Request::Write { .. } => 1,
        }
    }

    fn describe_request(request: &Request) -> String {
        match request {
            Request::Read { op, key, .. } => format!("READ op{} {key:?}", op.0),
            Request::Write { op, write, .. } => format!(
                "WRITE op{} {:?} after w{}{}",
                op.0,
                write.key,
                write.after.seq,
                if write.value.is_none() {
                    " (delete)"
                } else {
                    ""
                }
            ),
        }
    }

    fn describe_response(response: &Reply) -> String {
        match response {
            Reply::State { op, .. } => format!("STATE op{}", op.0),
            Reply::Written { op, .. } => format!("WRITTEN op{}", op.0),
            Reply::Stale { op, .. } => format!("STALE op{}", op.0),
            Reply::Refused { op, reason, .. } => format!("REFUSED op{} {reason}", op.0),
        }
    }
}
