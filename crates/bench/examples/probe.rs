//! A fixed number of puts then gets of one size against a running cluster, sequentially from one
//! client, so that a profiler attached to a node (or to this process) sees a known number of
//! operations: `probe CLUSTER_DIR SIZE_BYTES PUTS GETS [CLIENT]`.
//!
//! `PROBE_PAUSE_MS` pauses after each put; `PROBE_LINGER_MS` waits before exiting, so a node under a
//! profiler reads every request before the connection closes. Puts cycle through four keys, so a gets-only run needs an earlier run with at least four puts
//! of the same size. The times it prints are per operation; a profile's instruction count divided
//! by the operations gives the cost of one.

use anyhow::{Context, Result, bail};
use bulwark_client::Client;
use bytes::Bytes;
use std::path::PathBuf;
use std::time::Instant;

const KEYS: usize = 4;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, size, puts, gets, rest @ ..] = args.as_slice() else {
        bail!("usage: probe CLUSTER_DIR SIZE_BYTES PUTS GETS [CLIENT]");
    };
    let client_name = rest.first().map_or("admin", String::as_str);
    let size: usize = size.parse().context("size")?;
    let puts: usize = puts.parse().context("puts")?;
    let gets: usize = gets.parse().context("gets")?;
    let client = Client::connect(&PathBuf::from(dir), client_name).await?;
    // Every link up before the first operation, so no node misses a request.
    for (node, _, status) in client.status().await {
        if let Err(error) = status {
            bail!("node {node} is not up: {error}");
        }
    }
    // A pause after each put lets a slow node (one under a profiler) store every version: the
    // client drops what a node's link cannot take and relies on the quorum.
    let pause = std::env::var("PROBE_PAUSE_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(std::time::Duration::from_millis);
    let value = Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("probe-{i}").into_bytes())
        .collect();
    let started = Instant::now();
    for i in 0..puts {
        client.put(&keys[i % KEYS], value.clone()).await?;
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
    }
    let put_elapsed = started.elapsed();
    let started = Instant::now();
    for i in 0..gets {
        let (got, _) = client.get(&keys[i % KEYS]).await?;
        if got.as_ref().map(Bytes::len) != Some(size) {
            bail!("get {i} returned the wrong value");
        }
    }
    let get_elapsed = started.elapsed();
    // A node slowed by a profiler may still be reading requests the operations no longer
    // needed; exiting would reset the connection and take them with it.
    if let Some(linger) = std::env::var("PROBE_LINGER_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        tokio::time::sleep(std::time::Duration::from_millis(linger)).await;
    }
    println!(
        "size {size}: {puts} puts {:.3} ms each, {gets} gets {:.3} ms each",
        put_elapsed.as_secs_f64() * 1e3 / puts.max(1) as f64,
        get_elapsed.as_secs_f64() * 1e3 / gets.max(1) as f64,
    );
    Ok(())
}
