//! `bulwark bench depot`: what a causal volume's PUT and GET cost beside the baseline family of
//! Depot's §7.2, built from the same code: **Plain** (a trusted server: the key and the value),
//! **+Hash** (the value's hash travels with it and the reader checks it), **+Hash+Sig** (the
//! writer signs the key and hash and the reader checks both; as in the paper, a baseline's
//! server checks nothing) and
//! **Depot** (the signed update with its dependencies and history hash, accepted by the server
//! with every check of §3.3, read by the fast path with its compact hash). Every variant encodes
//! with the same wire codec and signs with the same Ed25519 keys. One process, no disk and no
//! network: CPU per operation on each side, and bytes per message, one operation at a time.

use anyhow::{Result, bail};
use bulwark_core::sign::{Context, PublicKey, SecretKey, Signature};
use bulwark_core::{Digest, Key, wire};
use bulwark_protocol::depot::update::value_hash;
use bulwark_protocol::depot::{
    Member, Message, Node, ReadStart, Role, Staleness, VolumeConfig, Writer,
};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `bulwark bench depot`.
#[derive(clap::Args)]
pub struct DepotArgs {
    /// Operations of each kind per variant and size.
    #[arg(long, default_value_t = 2000)]
    pub ops: usize,
    /// Value sizes (k and m suffixes).
    #[arg(long, value_delimiter = ',', default_value = "1k,10k,1m")]
    pub sizes: Vec<String>,
    /// Instead: what a server pays to answer a pull from a peer that holds its whole log, for
    /// logs of these many updates, with a writer idle since its first update and with a writer
    /// that forked at its first update and wrote the rest on one branch.
    #[arg(long, value_delimiter = ',')]
    pub pull_logs: Vec<usize>,
}

/// How many keys the operations go round.
const KEYS: usize = 100;
const BASELINE: Context = Context::new("bulwark.bench.baseline");

/// What one variant measured at one size.
#[derive(Default)]
struct Costs {
    put_client: Duration,
    put_server: Duration,
    put_bytes: usize,
    gossip_bytes: usize,
    get_client: Duration,
    get_server: Duration,
    get_bytes: usize,
}

pub fn run(args: &DepotArgs) -> Result<()> {
    if args.ops == 0 {
        bail!("--ops must be at least 1");
    }
    if !args.pull_logs.is_empty() {
        return pulls(&args.pull_logs);
    }
    println!(
        "| size | variant | PUT client µs | PUT server µs | PUT ops/s (one core) | GET client µs | GET server µs | GET ops/s (one core) | PUT bytes | server-to-server bytes | GET bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for size in &args.sizes {
        let len = crate::bench::parse_size(size)?;
        let value = Bytes::from(vec![0x5a; len]);
        let rows: [(&str, Costs); 4] = [
            ("Plain", baseline(args.ops, &value, Checks::None)?),
            ("+Hash", baseline(args.ops, &value, Checks::Hash)?),
            ("+Hash+Sig", baseline(args.ops, &value, Checks::Signature)?),
            ("Depot", depot(args.ops, &value)?),
        ];
        let plain_put = rows[0].1.put_bytes as f64;
        let plain_gossip = rows[0].1.gossip_bytes as f64;
        for (name, costs) in &rows {
            let per = |d: Duration| d.as_secs_f64() * 1e6 / args.ops as f64;
            let rate = |a: Duration, b: Duration| args.ops as f64 / (a + b).as_secs_f64();
            let put = costs.put_bytes as f64 / args.ops as f64;
            let gossip = costs.gossip_bytes as f64 / args.ops as f64;
            println!(
                "| {size} | {name} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.0} | {put:.0} ({:+.1}%) | {gossip:.0} ({:+.1}%) | {:.0} |",
                per(costs.put_client),
                per(costs.put_server),
                rate(costs.put_client, costs.put_server),
                per(costs.get_client),
                per(costs.get_server),
                rate(costs.get_client, costs.get_server),
                (costs.put_bytes as f64 / plain_put - 1.0) * 100.0,
                (costs.gossip_bytes as f64 / plain_gossip - 1.0) * 100.0,
                costs.get_bytes as f64 / args.ops as f64,
            );
        }
    }
    Ok(())
}

fn key_of(i: usize) -> Vec<u8> {
    format!("bench/{:04}", i % KEYS).into_bytes()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Checks {
    None,
    Hash,
    Signature,
}

/// A baseline's PUT, as the writer sends it and a server forwards it to the others.
#[derive(Serialize, Deserialize)]
struct BaselinePut {
    key: Vec<u8>,
    value: Bytes,
    hash: Option<Digest>,
    signature: Option<Signature>,
}

/// What a baseline signs: the key and the value's hash.
fn signed_bytes(key: &[u8], hash: &Digest) -> Vec<u8> {
    wire::encode(&(key, hash))
}

/// A baseline's stored record, answered to a GET as it is.
type Stored = HashMap<Vec<u8>, Bytes>;

fn baseline(ops: usize, value: &Bytes, checks: Checks) -> Result<Costs> {
    let secret = SecretKey::from_seed(&[7; 32]);
    let writer: PublicKey = secret.public_key();
    let mut costs = Costs::default();
    let mut stored = Stored::new();
    for i in 0..ops {
        let key = key_of(i);
        let started = Instant::now();
        let hash = (checks != Checks::None).then(|| value_hash(value));
        let signature = match (checks, &hash) {
            (Checks::Signature, Some(hash)) => {
                Some(secret.sign(BASELINE, &signed_bytes(&key, hash)))
            }
            _ => None,
        };
        let put = wire::encode(&BaselinePut {
            key,
            value: value.clone(),
            hash,
            signature,
        });
        costs.put_client += started.elapsed();
        costs.put_bytes += put.len();

        let started = Instant::now();
        // As in the paper's baselines, the server checks nothing: readers do.
        let received: BaselinePut = wire::decode(&put, wire::FRAME_BYTES_MAX)?;
        // The server keeps the record as it came, to answer GETs and to forward it.
        stored.insert(received.key, Bytes::from(put));
        costs.put_server += started.elapsed();
        // A server forwards the same message to the others.
        costs.gossip_bytes += stored.get(&key_of(i)).map_or(0, Bytes::len);
    }
    for i in 0..ops {
        let key = key_of(i);
        let started = Instant::now();
        let request = wire::encode(&key);
        costs.get_client += started.elapsed();
        let started = Instant::now();
        let asked: Vec<u8> = wire::decode(&request, wire::FRAME_BYTES_MAX)?;
        let answer = stored.get(&asked).cloned().unwrap_or_default();
        costs.get_server += started.elapsed();
        costs.get_bytes += request.len() + answer.len();
        let started = Instant::now();
        let got: BaselinePut = wire::decode(&answer, wire::FRAME_BYTES_MAX)?;
        if checks != Checks::None && got.hash != Some(value_hash(&got.value)) {
            bail!("a baseline value does not match its hash");
        }
        if let (Some(signature), Some(hash)) = (&got.signature, &got.hash) {
            writer.verify(BASELINE, &signed_bytes(&got.key, hash), signature)?;
        }
        costs.get_client += started.elapsed();
    }
    Ok(costs)
}

/// Depot: a writer client, a reader client that caught up in the background, and two servers.
/// One node per role, member `i` the `i`-th, clients allowed to write every key.
fn volume(roles: &[Role]) -> Vec<Node> {
    let secrets: Vec<SecretKey> = (0..roles.len())
        .map(|i| SecretKey::from_seed(&[i as u8; 32]))
        .collect();
    let members = secrets
        .iter()
        .zip(roles)
        .map(|(secret, &role)| Member {
            key: secret.public_key(),
            role,
            writes: if role == Role::Client {
                vec![Vec::new()]
            } else {
                Vec::new()
            },
        })
        .collect();
    let config = Arc::new(VolumeConfig::new("bench", members, Staleness::default()));
    secrets
        .into_iter()
        .enumerate()
        .map(|(i, secret)| Node::new(config.clone(), Writer(i as u32), secret))
        .collect()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn depot(ops: usize, value: &Bytes) -> Result<Costs> {
    let mut nodes = volume(&[Role::Server, Role::Server, Role::Client, Role::Client]);
    let (server, peer, writer, reader) = (Writer(0), Writer(1), Writer(2), Writer(3));
    let decode =
        |bytes: &[u8]| -> Result<Message> { Ok(wire::decode(bytes, wire::FRAME_BYTES_MAX)?) };
    let mut costs = Costs::default();
    for i in 0..ops {
        let key = Key::new(key_of(i))?;
        let started = Instant::now();
        let (update, _) = nodes[2].write(key, Some(value.clone()), now());
        let Some(put) = nodes[2].put_message(i as u64, &update.id()) else {
            bail!("the writer lost its own update");
        };
        let put = wire::encode(&put);
        costs.put_client += started.elapsed();
        costs.put_bytes += put.len();

        let started = Instant::now();
        let out = nodes[0].on_message(writer, decode(&put)?, now());
        costs.put_server += started.elapsed();
        if !out
            .sends
            .iter()
            .any(|(_, m)| matches!(m, Message::PutAck { .. }))
        {
            bail!("the server did not acknowledge a put: {:?}", out.refused);
        }
        // The other server's background pull, and the answer it brings: gossip per update.
        costs.gossip_bytes += exchange(&mut nodes, peer, server, now())?;
    }
    // The reader catches up in the background (§5.4: updates verified before any GET).
    for _ in 0..ops {
        if nodes[3].log().len() >= ops {
            break;
        }
        exchange(&mut nodes, reader, server, now())?;
    }
    for i in 0..ops {
        let key = Key::new(key_of(i))?;
        let started = Instant::now();
        let ask = match nodes[3].start_read(i as u64, key, &[server], now()) {
            ReadStart::Ask(_, message) => wire::encode(&*message),
            ReadStart::Done(_) => bail!("a read that asked no one"),
        };
        costs.get_client += started.elapsed();
        let started = Instant::now();
        let out = nodes[0].on_message(reader, decode(&ask)?, now());
        let answers: Vec<Vec<u8>> = out.sends.iter().map(|(_, m)| wire::encode(m)).collect();
        costs.get_server += started.elapsed();
        costs.get_bytes += ask.len() + answers.iter().map(Vec::len).sum::<usize>();
        let started = Instant::now();
        let mut done = false;
        for answer in &answers {
            let out = nodes[3].on_message(server, decode(answer)?, now());
            done |= out
                .reads
                .iter()
                .any(|(op, read)| *op == i as u64 && read.versions.len() == 1);
        }
        costs.get_client += started.elapsed();
        if !done {
            bail!("a Depot read did not end with the one version");
        }
    }
    Ok(costs)
}

/// `--pull-logs`: µs per pull answered, by log length and scenario.
fn pulls(logs: &[usize]) -> Result<()> {
    println!(
        "| updates in the log | a writer idle since its first update: µs per pull | a writer forked at its first update: µs per pull |"
    );
    println!("|---|---|---|");
    for &updates in logs {
        println!(
            "| {updates} | {:.1} | {:.1} |",
            pull_cost(updates, false)?.as_secs_f64() * 1e6,
            pull_cost(updates, true)?.as_secs_f64() * 1e6,
        );
    }
    Ok(())
}

/// What server 0 spends answering a pull from server 1, which holds all `updates` of its log:
/// the pull a server answers every gossip round and a slow GET makes. Client 3 writes once
/// and then nothing; client 2 writes the rest, or, `forked`, client 4 writes two first updates
/// (a fork) and the rest on top of one of them.
fn pull_cost(updates: usize, forked: bool) -> Result<Duration> {
    let mut nodes = volume(&[
        Role::Server,
        Role::Server,
        Role::Client,
        Role::Client,
        Role::Client,
    ]);
    let (server, peer) = (Writer(0), Writer(1));
    let mut twin = Node::new(
        nodes[0].log().config().clone(),
        Writer(4),
        SecretKey::from_seed(&[4; 32]),
    );
    let value = Bytes::from_static(b"sixteen bytes...");
    let deliver = |node: &mut Node, server: &mut Node, i: usize| -> Result<()> {
        let (update, _) = node.write(Key::new(key_of(i))?, Some(value.clone()), now());
        let Some(put) = node.put_message(i as u64, &update.id()) else {
            bail!("a writer lost its own update");
        };
        let out = server.on_message(node.me(), put, now());
        if !out.refused.is_empty() {
            bail!("the server refused a put: {:?}", out.refused);
        }
        Ok(())
    };
    let (head, rest) = nodes.split_at_mut(2);
    let writer = if forked { 2 } else { 0 };
    deliver(&mut rest[1], &mut head[0], 0)?;
    if forked {
        deliver(&mut rest[2], &mut head[0], 1)?;
        deliver(&mut twin, &mut head[0], 2)?;
    }
    for i in 1 + 2 * usize::from(forked)..updates {
        deliver(&mut rest[writer], &mut head[0], i)?;
    }
    for _ in 0..updates {
        if nodes[1].log().len() == nodes[0].log().len() {
            break;
        }
        exchange(&mut nodes, peer, server, now())?;
    }
    if nodes[1].log().len() != nodes[0].log().len() {
        bail!("the peer did not catch up");
    }
    let (mut spent, mut pulls) = (Duration::ZERO, 0u32);
    while pulls < 3 || (spent < Duration::from_secs(1) && pulls < 10_000) {
        let pull = nodes[1].pull(server);
        let started = Instant::now();
        let out = nodes[0].on_message(peer, pull, now());
        spent += started.elapsed();
        pulls += 1;
        let sent = out.sends.iter().any(
            |(_, message)| matches!(message, Message::Push { updates, .. } if updates.is_empty()),
        );
        if !sent {
            bail!("an up-to-date peer's pull was not answered with nothing");
        }
    }
    Ok(spent / pulls)
}

/// One pull by `from` from `to` and the answers, run to the end; the bytes that crossed.
fn exchange(nodes: &mut [Node], from: Writer, to: Writer, now: u64) -> Result<usize> {
    let mut bytes = 0;
    let mut queue = vec![(from, to, nodes[from.0 as usize].pull(to))];
    while let Some((sender, receiver, message)) = queue.pop() {
        let encoded = wire::encode(&message);
        bytes += encoded.len();
        let message: Message = wire::decode(&encoded, wire::FRAME_BYTES_MAX)?;
        let out = nodes[receiver.0 as usize].on_message(sender, message, now);
        for (next, reply) in out.sends {
            if next == sender && queue.len() < 16 {
                queue.push((receiver, sender, reply));
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant runs to the end with its checks passing, and a Depot PUT carries less than
    /// 200 bytes beyond Plain's key and value (the signed update, its dependency, the framing).
    #[test]
    fn every_variant_round_trips_and_depot_adds_under_200_bytes_a_put() {
        let value = Bytes::from(vec![1; 1024]);
        let ops = 20;
        let plain = baseline(ops, &value, Checks::None).unwrap();
        baseline(ops, &value, Checks::Hash).unwrap();
        baseline(ops, &value, Checks::Signature).unwrap();
        let depot = depot(ops, &value).unwrap();
        let extra = (depot.put_bytes - plain.put_bytes) / ops;
        assert!((100..200).contains(&extra), "{extra} bytes");
        assert!(
            depot.gossip_bytes > depot.put_bytes,
            "gossip carries every update"
        );
    }
}
