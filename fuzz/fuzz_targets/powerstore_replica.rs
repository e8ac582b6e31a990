//! M-PoWerStore servers under a hostile client. One honest writer and one honest reader run
//! operations on a group of four servers while a client with read access sends them whatever
//! the input holds (decoded as a request, as a node would decode it). Nothing may panic, and
//! every honest read returns the last honest write: a client that may only read cannot change
//! what the group stores.
#![no_main]

use arbitrary::{Result, Unstructured};
use bulwark_core::erasure::ReedSolomonSimd;
use bulwark_core::wire::FRAME_BYTES_MAX;
use bulwark_core::{ClientId, Key, MacKey, Slot, Time};
use bulwark_protocol::powerstore::{
    Access, ClientConfig, MemoryFragments, Outbound, Pid, ReadOp, Request, Server, ServerConfig,
    ServerKeys, ServerLogic, Step, WriteOp, WriterKeys,
};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

const F: usize = 1;
const N: usize = 3 * F + 1;
const WRITER: Access = Access {
    write: true,
    read: true,
};
const READER: Access = Access {
    write: false,
    read: true,
};

struct Group {
    servers: Vec<Server>,
    disks: Vec<MemoryFragments>,
    keys: Arc<WriterKeys>,
    now: Time,
    next_op: u64,
    /// The last honest write to each key.
    written: HashMap<Key, Option<Bytes>>,
}

impl Group {
    fn new() -> Group {
        let server_keys: Vec<MacKey> = (0..N).map(|i| MacKey([i as u8 + 1; 32])).collect();
        Group {
            servers: (0..N)
                .map(|i| {
                    // The honest writer is client 0.
                    let keys = ServerKeys::from_keys([(ClientId(0), server_keys[i].clone())]);
                    Server::new(ServerConfig::new(Slot(i as u32), F), keys)
                })
                .collect(),
            disks: vec![MemoryFragments::default(); N],
            keys: Arc::new(WriterKeys {
                timestamp: MacKey([99; 32]),
                servers: server_keys,
            }),
            now: Time(0),
            next_op: 1,
            written: HashMap::new(),
        }
    }

    fn deliver(
        &mut self,
        client: ClientId,
        access: Access,
        to: Slot,
        request: Request,
    ) -> Option<bulwark_protocol::powerstore::Response> {
        let i = to.index();
        let handled = self.servers[i].handle(self.now, client, access, request, &self.disks[i]);
        for change in &handled.changes {
            self.disks[i].apply(change);
        }
        handled.reply
    }

    fn op(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    fn write(&mut self, key: Key, value: Option<Bytes>) {
        let op = self.op();
        let mut write = WriteOp::new(
            ClientConfig::new(F),
            self.keys.clone(),
            Arc::new(ReedSolomonSimd),
            key.clone(),
            bulwark_protocol::powerstore::OpId(op),
            Pid {
                writer: ClientId(0),
                seq: op,
            },
            [op as u8; 32],
            value.clone(),
        );
        let mut queue: VecDeque<Outbound> = write.start().into();
        let mut done = false;
        while let Some((to, request)) = queue.pop_front() {
            let Some(response) = self.deliver(ClientId(0), WRITER, to, request) else {
                continue;
            };
            if done {
                continue;
            }
            match write.on_response(to, response) {
                Step::Continue(more) => queue.extend(more),
                Step::Done(result) => {
                    result.expect("an honest write on four honest servers completes");
                    done = true;
                }
            }
        }
        assert!(done, "an honest write on four honest servers completes");
        self.written.insert(key, value);
    }

    fn read(&mut self, key: Key) {
        let op = self.op();
        let mut read = ReadOp::new(
            ClientConfig::new(F),
            Arc::new(ReedSolomonSimd),
            key.clone(),
            bulwark_protocol::powerstore::OpId(op),
        );
        let mut queue: VecDeque<Outbound> = read.start().into();
        while let Some((to, request)) = queue.pop_front() {
            let Some(response) = self.deliver(ClientId(1), READER, to, request) else {
                continue;
            };
            match read.on_response(to, response) {
                Step::Continue(more) => queue.extend(more),
                Step::Done(result) => {
                    let outcome = result.expect("an honest read on four honest servers completes");
                    let expected = self.written.get(&key).cloned().flatten();
                    assert_eq!(
                        outcome.value, expected,
                        "a read returned something other than the last honest write"
                    );
                    return;
                }
            }
        }
        panic!("an honest read on four honest servers completes");
    }
}

fn key(u: &mut Unstructured) -> Result<Key> {
    let names: [&[u8]; 2] = [b"a", b"b"];
    Ok(Key::new(names[u.choose_index(names.len())?].to_vec()).expect("a short key"))
}

fn run(u: &mut Unstructured, group: &mut Group) -> Result<()> {
    while !u.is_empty() {
        match u.int_in_range(0..=4u8)? {
            0 => {
                let key = key(u)?;
                let value = match u.int_in_range(0..=3u8)? {
                    0 => None,
                    // Past the inline limit: erasure-coded fragments.
                    1 => Some(Bytes::from(vec![u.arbitrary::<u8>()?; 5000])),
                    _ => {
                        let len = u.int_in_range(0..=32)?;
                        Some(Bytes::copy_from_slice(u.bytes(len)?))
                    }
                };
                group.write(key, value);
            }
            1 => {
                let key = key(u)?;
                group.read(key);
            }
            2 => {
                group.now = Time(group.now.0 + u.int_in_range(0..=60_000u64)?);
                let now = group.now;
                for (server, disk) in group.servers.iter_mut().zip(&mut group.disks) {
                    for change in server.tick(now) {
                        disk.apply(&change);
                    }
                }
            }
            _ => {
                let to = Slot(u.int_in_range(0..=(N as u32 - 1))?);
                let len = u.arbitrary_len::<u8>()?;
                let bytes = u.bytes(len)?;
                if let Ok(request) = bulwark_core::wire::decode::<Request>(bytes, FRAME_BYTES_MAX) {
                    group.deliver(ClientId(7), READER, to, request);
                }
            }
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut group = Group::new();
    let _ = run(&mut Unstructured::new(data), &mut group);
    // Whatever came before, both keys still read back as last written.
    let keys: Vec<Key> = group.written.keys().cloned().collect();
    for key in keys {
        group.read(key);
    }
});
