//! What this machine allows a 1 MiB get before any protocol runs, measured in the same run as the
//! systems: Reed-Solomon decoding, BLAKE3 hashing and a plain TCP copy over loopback. A PoWerStore
//! get of 1 MiB at f = 1 receives `f + 1 = 2` fragments of 512 KiB (1 MiB over loopback), the
//! servers re-hash what they serve and the client hashes what it receives (2 MiB in all), and it
//! decodes only when a data fragment is missing. The ceiling below adds those costs for one core.

use bulwark_core::Digest;
use bulwark_core::erasure::{ErasureCodec, Layout, ReedSolomonSimd};
use bytes::Bytes;
use serde::Serialize;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1024 * 1024;
/// How long each measurement runs.
const MEASURE_FOR: Duration = Duration::from_millis(700);
/// Bytes the loopback measurement moves.
const LOOPBACK_BYTES: usize = 512 * MIB;

/// The machine's own limits for the work a 1 MiB get does.
#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    /// Reed-Solomon (n = 4, k = 2) decodes of 1 MiB from one data and one parity fragment, MiB/s.
    pub decode_mib_s: f64,
    /// BLAKE3 over 512 KiB fragments, MiB/s.
    pub hash_mib_s: f64,
    /// A plain TCP stream over 127.0.0.1, MiB/s.
    pub loopback_mib_s: f64,
    /// 1 MiB gets per second one core could do with nothing but that work, when all data
    /// fragments arrive (no decode).
    pub get_1mib_ceiling_ops: f64,
    /// The same when every get must decode.
    pub get_1mib_ceiling_decoding_ops: f64,
}

/// Calls `work` until [`MEASURE_FOR`] has passed; returns calls per second.
fn rate(mut work: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < MEASURE_FOR {
        work();
        calls += 1;
    }
    calls as f64 / started.elapsed().as_secs_f64()
}

fn decode_mib_s() -> anyhow::Result<f64> {
    let value: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let layout = Layout::for_value(value.len(), 4, 1);
    let fragments = ReedSolomonSimd.encode(&layout, &value)?;
    // Data fragment 0 missing: a real decode from fragment 1 and parity fragment 2.
    let present: Vec<(usize, Bytes)> = vec![(1, fragments[1].clone()), (2, fragments[2].clone())];
    let mut failed = None;
    let per_second = rate(|| {
        if let Err(e) = ReedSolomonSimd.decode(&layout, &present) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        anyhow::bail!("decode failed: {e}");
    }
    Ok(per_second)
}

fn hash_mib_s() -> f64 {
    let fragment = vec![7u8; MIB / 2];
    let mut sink = 0u8;
    let per_second = rate(|| sink ^= Digest::of("bulwark bench limits", &fragment).0[0]);
    std::hint::black_box(sink);
    per_second / 2.0
}

async fn loopback_mib_s() -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut buffer = vec![0u8; MIB];
        let mut total = 0usize;
        loop {
            let read = stream.read(&mut buffer).await?;
            if read == 0 {
                return Ok::<usize, std::io::Error>(total);
            }
            total += read;
        }
    });
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let chunk = vec![1u8; MIB];
    let started = Instant::now();
    for _ in 0..LOOPBACK_BYTES / MIB {
        stream.write_all(&chunk).await?;
    }
    stream.shutdown().await?;
    drop(stream);
    let received = reader.await??;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(received == LOOPBACK_BYTES, "loopback lost bytes");
    Ok(received as f64 / MIB as f64 / seconds)
}

/// Seconds of one core per 1 MiB get that needs no decode: [`GET_COPIED_MIB`] copied over
/// loopback at `loopback` MiB/s and [`GET_HASHED_MIB`] hashed at `hash` MiB/s.
fn get_1mib_seconds(loopback: f64, hash: f64) -> f64 {
    GET_COPIED_MIB / loopback + GET_HASHED_MIB / hash
}

/// MiB of fragments a 1 MiB get moves over loopback: `f + 1` of 512 KiB.
const GET_COPIED_MIB: f64 = 1.0;
/// MiB a 1 MiB get hashes: the servers what they serve, the client what it receives.
const GET_HASHED_MIB: f64 = 2.0;

/// Measures every limit; takes a few seconds.
pub async fn measure() -> anyhow::Result<Limits> {
    let decode = decode_mib_s()?;
    let hash = hash_mib_s();
    let loopback = loopback_mib_s().await?;
    let base = get_1mib_seconds(loopback, hash);
    Ok(Limits {
        decode_mib_s: decode,
        hash_mib_s: hash,
        loopback_mib_s: loopback,
        get_1mib_ceiling_ops: 1.0 / base,
        get_1mib_ceiling_decoding_ops: 1.0 / (base + 1.0 / decode),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limits_are_positive_and_the_ceiling_adds_the_costs() {
        let limits = measure().await.unwrap();
        assert!(
            limits.decode_mib_s > 0.0 && limits.hash_mib_s > 0.0 && limits.loopback_mib_s > 0.0
        );
        assert!(limits.get_1mib_ceiling_decoding_ops < limits.get_1mib_ceiling_ops);
        let base = get_1mib_seconds(limits.loopback_mib_s, limits.hash_mib_s);
        assert!((limits.get_1mib_ceiling_ops - 1.0 / base).abs() < 1e-6);
    }
}
