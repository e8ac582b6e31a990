//! `bulwark put`, `get`, `delete` and `status`.

use crate::ClientArgs;
use anyhow::{Context, Result, bail};
use bulwark_client::{Client, OpReport, Serving, Volume};
use bulwark_protocol::depot::VolumeId;
use bytes::Bytes;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Appends one line to a `String` (formatting into a `String` cannot fail).
macro_rules! out {
    ($text:ident, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($text, $($arg)*);
    }};
}

/// Objects at least this large get a progress indicator on a terminal.
const PROGRESS_BYTES_MIN: usize = 1024 * 1024;

pub async fn connect(args: &ClientArgs) -> Result<Client> {
    let mut client = Client::connect(&args.cluster, &args.client)
        .await
        .with_context(|| {
            format!(
                "connecting as {:?} with {}",
                args.client,
                args.cluster.display()
            )
        })?;
    client.deadline = Duration::from_secs(args.timeout);
    Ok(client)
}

/// The volume `--volume` names, or the default volume.
async fn volume(client: &Client, args: &ClientArgs) -> Result<Volume> {
    Ok(match &args.volume {
        Some(name) => client.volume(name).await?,
        None => client.default_volume(),
    })
}

/// How a volume is served (`bulwark volume create --mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Every key on its replica group.
    Replicated,
    /// One node with a trusted log.
    SingleServer,
}

/// What `bulwark volume create` was asked for, besides the name.
pub struct VolumeSpec {
    /// `--mode`.
    pub mode: Mode,
    /// `--protocol`.
    pub protocol: Option<bulwark_core::config::Protocol>,
    /// `--server`.
    pub server: Option<u32>,
    /// `--writer`: a client's name.
    pub writer: Option<String>,
}

/// `bulwark volume create`.
pub async fn create_volume(args: &ClientArgs, name: &str, spec: VolumeSpec) -> Result<()> {
    use bulwark_core::config::Protocol;
    let client = connect(args).await?;
    let VolumeSpec {
        mode,
        protocol,
        server,
        writer,
    } = spec;
    let (volume, report) = match (mode, server, writer) {
        (Mode::Replicated, None, None) => {
            client
                .create_volume(name, protocol.unwrap_or_default())
                .await?
        }
        (Mode::Replicated, None, Some(writer)) => {
            if protocol.is_some_and(|p| p != Protocol::PowerStore) {
                anyhow::bail!("--writer makes a PoWerStore volume; leave out --protocol");
            }
            let Some(entry) = client.cluster().clients.iter().find(|c| c.name == writer) else {
                anyhow::bail!("no client named {writer:?} in cluster.toml");
            };
            let id = bulwark_core::ClientId(entry.id);
            client.create_sole_writer_volume(name, id).await?
        }
        (Mode::Replicated, Some(_), _) => {
            anyhow::bail!("--server names a single-server volume's node; add --mode single-server")
        }
        (Mode::SingleServer, None, _) => {
            anyhow::bail!("a single-server volume needs --server NODE")
        }
        (Mode::SingleServer, Some(server), writer) => {
            if let Some(protocol) = protocol {
                anyhow::bail!("--protocol {protocol} is for replicated volumes");
            }
            if writer.is_some() {
                anyhow::bail!("--writer is for replicated volumes");
            }
            client
                .create_single_server_volume(name, bulwark_core::NodeId(server))
                .await?
        }
    };
    eprintln!(
        "volume {:?} is served by {}: {}",
        volume.name(),
        volume.serving,
        summary(&report)
    );
    Ok(())
}

/// What a volume promises readers (`bulwark volume create --consistency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Consistency {
    /// Registers: every read returns the latest completed write.
    Linearizable,
    /// Depot: fork-join-causal, available whatever its servers do.
    Causal,
}

/// `bulwark volume create --consistency causal`.
pub async fn create_causal_volume(args: &ClientArgs, name: &str, servers: &[u32]) -> Result<()> {
    let client = connect(args).await?;
    let servers: Vec<bulwark_core::NodeId> =
        servers.iter().map(|id| bulwark_core::NodeId(*id)).collect();
    let (volume, report) = client.create_causal_volume(name, &servers).await?;
    let nodes: Vec<String> = report.answered.iter().map(|n| n.0.to_string()).collect();
    eprintln!(
        "volume {:?} is {}: served by {} of {} nodes (nodes {})",
        volume.name(),
        volume.serving,
        report.answered.len(),
        report.n,
        nodes.join(",")
    );
    Ok(())
}

/// The causal volume `--volume` names, if it is one.
async fn causal(client: &Client, args: &ClientArgs) -> Result<Option<(Volume, VolumeId)>> {
    let volume = volume(client, args).await?;
    Ok(match volume.serving {
        Serving::Causal { volume: number } => Some((volume, number)),
        _ => None,
    })
}

/// The causal volume named `name`.
async fn causal_named(client: &Client, name: &str) -> Result<VolumeId> {
    match client.volume(name).await?.serving {
        Serving::Causal { volume } => Ok(volume),
        serving => bail!("volume {name:?} is not causal: it is served by {serving}"),
    }
}

/// A causal volume's member by name where the node knows it, else by index.
fn member_name(names: &[(u32, String)], member: u32) -> String {
    names
        .iter()
        .find(|(index, _)| *index == member)
        .map_or_else(|| format!("member {member}"), |(_, name)| name.clone())
}

/// `bulwark volume serve`.
pub async fn serve_causal(
    args: &ClientArgs,
    name: &str,
    listen: std::net::SocketAddr,
) -> Result<()> {
    let client = std::sync::Arc::new(connect(args).await?);
    let volume = causal_named(&client, name).await?;
    let dir = args.cluster.join(format!("client-{}", args.client));
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .with_context(|| format!("reading {}", dir.join(file).display()))
    };
    let identity = bulwark_transport::Identity::from_pem(&read("tls.crt")?, &read("tls.key")?)?;
    client.open_causal(name, volume).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let listen = listener.local_addr().unwrap_or(listen);
    eprintln!(
        "serving {:?}'s log of causal volume {name:?} to its other clients on {listen}; Ctrl-C stops",
        args.client
    );
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    client
        .serve_causal_peers(name, volume, listener, &identity, stop)
        .await?;
    Ok(())
}

/// A member client serving its log, given as NAME@HOST:PORT.
fn client_peer(peer: &str) -> Result<(&str, std::net::SocketAddr)> {
    let Some((name, address)) = peer.split_once('@') else {
        bail!("--peer is NAME@HOST:PORT, not {peer:?}");
    };
    let address = address
        .parse()
        .with_context(|| format!("--peer's address {address:?}"))?;
    Ok((name, address))
}

/// `bulwark volume sync`.
pub async fn sync_causal(args: &ClientArgs, name: &str, peer: &str) -> Result<()> {
    let (peer_name, address) = client_peer(peer)?;
    let client = connect(args).await?;
    let volume = causal_named(&client, name).await?;
    let learned = client
        .sync_causal_with_client(name, volume, peer_name, address)
        .await?;
    eprintln!("exchanged with {peer_name}: {learned} updates learned");
    Ok(())
}

/// `bulwark list`: a causal volume's keys.
pub async fn list(args: &ClientArgs, prefix: &str, limit: usize) -> Result<()> {
    let client = connect(args).await?;
    let Some((volume, number)) = causal(&client, args).await? else {
        bail!("only causal volumes list their keys (name one with --volume)");
    };
    let (keys, answered) = client
        .causal_list(volume.name(), number, prefix.as_bytes(), None, limit)
        .await?;
    let mut out = String::new();
    for (key, held) in &keys {
        let key = String::from_utf8_lossy(key.as_bytes());
        let versions = held.versions.len() + held.unavailable;
        if versions > 1 {
            out!(out, "{key}\t({versions} concurrent versions)");
        } else {
            out!(out, "{key}");
        }
    }
    std::io::stdout()
        .write_all(out.as_bytes())
        .context("writing standard output")?;
    match answered {
        Some(node) => eprintln!("{} keys, caught up with {node}", keys.len()),
        None => eprintln!(
            "{} keys, from this client's own log: no server answered",
            keys.len()
        ),
    }
    Ok(())
}

/// A spinner on standard error while a large transfer runs, only when a person is watching.
fn progress(what: &str, bytes: usize) -> Option<indicatif::ProgressBar> {
    if bytes < PROGRESS_BYTES_MIN || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("{what} {}", human_bytes(bytes as u64)));
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

fn finish(bar: Option<indicatif::ProgressBar>, bytes: usize, started: Instant) {
    if let Some(bar) = bar {
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        bar.finish_with_message(format!(
            "{} in {:.2}s ({}/s)",
            human_bytes(bytes as u64),
            seconds,
            human_bytes((bytes as f64 / seconds) as u64)
        ));
    }
}

pub fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// What a causal write's report says: which server holds it durable, or that only this client
/// does yet.
fn causal_ack(report: &OpReport) -> String {
    match report.answered.first() {
        Some(node) => format!("durable here and on {node}"),
        None => "durable in this client's log only: no server acknowledged it yet; it reaches \
                 them with this client's next exchange"
            .to_string(),
    }
}

pub(crate) fn summary(report: &OpReport) -> String {
    let nodes: Vec<String> = report.answered.iter().map(|n| n.0.to_string()).collect();
    let mut text = format!(
        "{} of {} nodes answered (nodes {})",
        report.answered.len(),
        report.n,
        nodes.join(",")
    );
    for evidence in &report.evidence {
        text.push_str(&format!(
            "; node {} misbehaved: {}",
            evidence.node.0, evidence.kind
        ));
    }
    text
}

/// The bytes of FILE, or of standard input when it is `-` or absent.
fn read_input(file: Option<PathBuf>) -> Result<Vec<u8>> {
    Ok(match file.as_deref() {
        None => read_stdin()?,
        Some(path) if path.as_os_str() == "-" => read_stdin()?,
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    })
}

pub async fn put(args: &ClientArgs, key: &str, file: Option<PathBuf>) -> Result<()> {
    let value = read_input(file)?;
    let client = connect(args).await?;
    let len = value.len();
    let started = Instant::now();
    let bar = progress("storing", len);
    let volume = volume(&client, args).await?;
    let causal = matches!(volume.serving, Serving::Causal { .. });
    let report = client
        .put_in(&volume, key.as_bytes(), Bytes::from(value))
        .await?;
    finish(bar, len, started);
    if causal {
        eprintln!(
            "stored {key:?} ({}): {}",
            human_bytes(len as u64),
            causal_ack(&report)
        );
        return Ok(());
    }
    eprintln!(
        "stored {key:?} ({}): {}",
        human_bytes(len as u64),
        summary(&report)
    );
    Ok(())
}

fn read_stdin() -> Result<Vec<u8>> {
    let mut value = Vec::new();
    // Read one byte past the limit so an oversized input is refused without buffering it all.
    std::io::stdin()
        .take(bulwark_core::OBJECT_BYTES_MAX as u64 + 1)
        .read_to_end(&mut value)
        .context("reading standard input")?;
    if value.len() > bulwark_core::OBJECT_BYTES_MAX {
        // Its true length is unknown: only that it is over the limit.
        bail!(
            "standard input holds more than {}, the largest object",
            human_bytes(bulwark_core::OBJECT_BYTES_MAX as u64)
        );
    }
    Ok(value)
}

/// Which version of a key `get` is after.
pub enum Past {
    /// The newest (a causal volume's every current version named).
    Newest,
    /// Causal volumes: every version the log holds, listed.
    List,
    /// Causal volumes: the version whose id starts with these hex digits.
    Version(String),
}

pub async fn get(
    args: &ClientArgs,
    key: &str,
    output: Option<PathBuf>,
    peers: &[String],
    past: Past,
) -> Result<std::process::ExitCode> {
    let peers = peers
        .iter()
        .map(|peer| client_peer(peer))
        .collect::<Result<Vec<_>>>()?;
    let client = connect(args).await?;
    let started = Instant::now();
    let volume = volume(&client, args).await?;
    if let Serving::Causal { volume: number } = volume.serving {
        for (name, address) in peers {
            client.add_causal_peer(name, address);
        }
        match past {
            Past::Newest => {}
            Past::List => {
                let versions = client
                    .causal_versions(volume.name(), number, key.as_bytes())
                    .await?;
                if versions.is_empty() {
                    eprintln!("not found: {key:?} has no version");
                    return Ok(std::process::ExitCode::from(2));
                }
                for version in &versions {
                    println!("{}", past_line(version));
                }
                return Ok(std::process::ExitCode::SUCCESS);
            }
            Past::Version(id) => {
                let (version, value) = client
                    .causal_read_version(volume.name(), number, key.as_bytes(), &id)
                    .await?;
                let Some(value) = value else {
                    eprintln!("{key:?} version {}: a delete", past_line(&version));
                    return Ok(std::process::ExitCode::from(2));
                };
                write_out(&value, output, started)?;
                eprintln!("fetched {key:?} version {}", past_line(&version));
                return Ok(std::process::ExitCode::SUCCESS);
            }
        }
        let read = client
            .causal_read(volume.name(), number, key.as_bytes())
            .await?;
        return deliver_causal(key, read, output, started);
    }
    if !peers.is_empty() {
        bail!(
            "--peer names a client serving a causal volume's log; volume {:?} is not causal",
            volume.name()
        );
    }
    if !matches!(past, Past::Newest) {
        bail!(
            "--versions and --version read a causal volume's history; volume {:?} keeps only \
             each key's latest value",
            volume.name()
        );
    }
    let (value, report) = client.get_in(&volume, key.as_bytes()).await?;
    deliver(&format!("{key:?}"), value, &report, output, started)
}

/// One version of a causal key's history, as `get --versions` lists it: its id (as `--version`
/// takes it), clock, writer, size and standing.
fn past_line(version: &bulwark_client::causal::CausalPast) -> String {
    let size = match version.len {
        Some(len) => human_bytes(len),
        None => "deleted".to_string(),
    };
    let standing = if version.current {
        "current"
    } else if version.discarded {
        "superseded, value discarded"
    } else {
        "superseded"
    };
    format!(
        "{}  clock {}  by {}  {size}  {standing}",
        &hex::encode(version.id.0.0)[..16],
        version.clock,
        version.writer
    )
}

/// A causal read: the newest version written out (by clock, then writer, then update), every
/// concurrent one named, and what the read could not vouch for said.
fn deliver_causal(
    key: &str,
    read: bulwark_client::causal::CausalRead,
    output: Option<PathBuf>,
    started: Instant,
) -> Result<std::process::ExitCode> {
    let servers: Vec<String> = read.answered.iter().map(|n| n.0.to_string()).collect();
    let mut from = if servers.is_empty() {
        "from this client's own log: no server answered".to_string()
    } else {
        format!("with nodes {}", servers.join(","))
    };
    if !read.answered_by_clients.is_empty() {
        from = format!(
            "{from}; values from clients {}",
            read.answered_by_clients.join(",")
        );
    }
    if read.versions.len() > 1 {
        eprintln!(
            "{key:?} has {} concurrent versions; the newest (highest clock) is written out:",
            read.versions.len()
        );
        for version in &read.versions {
            eprintln!(
                "  {:?} clock {} by {}: {}",
                version.id.0,
                version.clock,
                version.writer,
                version
                    .value
                    .as_ref()
                    .map_or("deleted".to_string(), |v| human_bytes(v.len() as u64))
            );
        }
    }
    if !read.forked.is_empty() {
        eprintln!(
            "warning: proof held that {} forked (signed two histories)",
            read.forked.join(", ")
        );
    }
    for (node, refused) in &read.refused_from {
        eprintln!("warning: {node} passed on {refused} update(s) or value(s) that do not check");
    }
    if !read.suspects.is_empty() {
        eprintln!(
            "note: nothing heard lately from {}: their newest writes may not be here yet",
            read.suspects.join(", ")
        );
    }
    if read.unavailable > 0 {
        eprintln!(
            "warning: {} version(s) whose values no one asked could give",
            read.unavailable
        );
    }
    let Some(value) = read.newest().cloned() else {
        eprintln!("not found: {key:?} ({from})");
        return Ok(std::process::ExitCode::from(2));
    };
    write_out(&value, output, started)?;
    eprintln!(
        "fetched {key:?} ({}) {from}",
        human_bytes(value.len() as u64)
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// Writes a fetched value to `output`, or to standard output.
fn write_out(value: &Bytes, output: Option<PathBuf>, started: Instant) -> Result<()> {
    finish(progress("fetched", value.len()), value.len(), started);
    match output {
        Some(path) => {
            std::fs::write(&path, value).with_context(|| format!("writing {}", path.display()))
        }
        None => std::io::stdout()
            .write_all(value)
            .context("writing standard output"),
    }
}

/// Writes a fetched object out and says so, or says it was not found (exit code 2).
fn deliver(
    what: &str,
    value: Option<Bytes>,
    report: &OpReport,
    output: Option<PathBuf>,
    started: Instant,
) -> Result<std::process::ExitCode> {
    let Some(value) = value else {
        eprintln!("not found: {what} ({})", summary(report));
        return Ok(std::process::ExitCode::from(2));
    };
    write_out(&value, output, started)?;
    eprintln!(
        "fetched {what} ({}): {}",
        human_bytes(value.len() as u64),
        summary(report)
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// Content-hash objects are named by their content alone; a volume would be silently ignored.
fn no_volume(args: &ClientArgs) -> Result<()> {
    if let Some(volume) = &args.volume {
        anyhow::bail!("content-hash objects belong to no volume; drop --volume {volume}");
    }
    Ok(())
}

/// `bulwark content put`: prints the id on standard output, the rest on standard error.
pub async fn put_content(args: &ClientArgs, file: Option<PathBuf>) -> Result<()> {
    no_volume(args)?;
    let value = read_input(file)?;
    let client = connect(args).await?;
    let len = value.len();
    let started = Instant::now();
    let bar = progress("storing", len);
    let (id, report) = client.put_content(&value).await?;
    finish(bar, len, started);
    println!("{id}");
    eprintln!(
        "stored content {} ({}): {}",
        &id.to_hex()[..16],
        human_bytes(len as u64),
        summary(&report)
    );
    Ok(())
}

/// The content id `id` names, or why it names none.
fn content_id(id: &str) -> Result<bulwark_protocol::content::ContentId> {
    bulwark_protocol::content::ContentId::from_hex(id)
        .ok_or_else(|| anyhow::anyhow!("{id:?} is not a content id (64 hex digits)"))
}

/// `bulwark content delete`.
pub async fn delete_content(args: &ClientArgs, id: &str) -> Result<()> {
    no_volume(args)?;
    let id = content_id(id)?;
    let client = connect(args).await?;
    let report = client.delete_content(&id).await?;
    eprintln!(
        "deleted content {}: {}",
        &id.to_hex()[..16],
        summary(&report)
    );
    Ok(())
}

/// `bulwark content get`.
pub async fn get_content(
    args: &ClientArgs,
    id: &str,
    output: Option<PathBuf>,
) -> Result<std::process::ExitCode> {
    no_volume(args)?;
    let id = content_id(id)?;
    let client = connect(args).await?;
    let started = Instant::now();
    let (value, report) = client.get_content(&id).await?;
    deliver(
        &format!("content {}", &id.to_hex()[..16]),
        value,
        &report,
        output,
        started,
    )
}

pub async fn delete(args: &ClientArgs, key: &str) -> Result<()> {
    let client = connect(args).await?;
    let volume = volume(&client, args).await?;
    let report = client.delete_in(&volume, key.as_bytes()).await?;
    if matches!(volume.serving, Serving::Causal { .. }) {
        eprintln!("deleted {key:?}: {}", causal_ack(&report));
        return Ok(());
    }
    eprintln!("deleted {key:?}: {}", summary(&report));
    Ok(())
}

/// How long `status` waits for a node's answer to a read before calling it silent: a local
/// node answers in a millisecond, one across clouds in tens.
const PROBE_WAIT: Duration = Duration::from_secs(1);

pub async fn status(args: &ClientArgs) -> Result<std::process::ExitCode> {
    let client = connect(args).await?;
    let statuses = client.status().await;
    // A node can answer status and nothing else (its replicas stuck, or lying by silence):
    // each answering node is asked one read-only protocol request too.
    let probes = futures::future::join_all(statuses.iter().map(|(id, _, status)| {
        let client = &client;
        async move {
            match status {
                Ok(_) => client.probe(*id, PROBE_WAIT).await,
                Err(_) => None,
            }
        }
    }))
    .await;
    // Written whole at the end: a reader that stops early (`| head`) is not an error.
    let mut text = String::new();
    let mut reachable = 0;
    out!(
        text,
        "{:<6} {:<22} {:<10} {:<8} {:>8} {:>9} {:>10} {:>9}",
        "node",
        "address",
        "state",
        "version",
        "objects",
        "versions",
        "requests",
        "rejected"
    );
    for ((id, address, status), probe) in statuses.iter().zip(probes) {
        match status {
            Ok(status) => {
                reachable += 1;
                let rejected: u64 = status.rejected.iter().map(|r| r.count).sum();
                out!(
                    text,
                    "{:<6} {:<22} {:<10} {:<8} {:>8} {:>9} {:>10} {:>9}",
                    id.0,
                    address.to_string(),
                    if probe == Some(false) { "silent" } else { "up" },
                    status.version,
                    status.server.objects,
                    status.server.versions,
                    status.requests,
                    rejected
                );
                if probe == Some(false) {
                    out!(
                        text,
                        "         answers status, but no read within {PROBE_WAIT:?}: its groups \
                         count it as one of their faulty nodes"
                    );
                }
                for r in &status.rejected {
                    out!(
                        text,
                        "         rejected {} from {}: {}",
                        r.count,
                        r.peer,
                        r.reason
                    );
                }
                let mut groups: Vec<String> = status
                    .replicas
                    .iter()
                    .filter(|r| r.service == "powerstore")
                    .map(|r| format!("{}@slot{}", r.group, r.slot))
                    .collect();
                groups.dedup();
                if groups.is_empty() {
                    // Registers and content-hash objects are placed on cluster.toml's nodes.
                    out!(
                        text,
                        "         groups none (joined after cluster.toml was written)"
                    );
                } else {
                    out!(text, "         groups {}", groups.join(" "));
                }
                if status.config_epoch > 0 {
                    match &status.cs {
                        Some(cs) => out!(
                            text,
                            "         configuration epoch {}; CS replica (slot {}), view {}{} with primary node {}, {} batches executed, {} waiting",
                            status.config_epoch,
                            cs.slot,
                            cs.view,
                            if cs.active { "" } else { " (changing)" },
                            cs.primary,
                            cs.executed,
                            cs.waiting
                        ),
                        None => out!(text, "         configuration epoch {}", status.config_epoch),
                    }
                    if let Some(reason) = status.cs.as_ref().and_then(|cs| cs.stopped.as_ref()) {
                        out!(text, "         CS replica STOPPED: {reason}");
                    }
                }
                for follower in status.replicas.iter().filter(|r| r.stats.epoch > 0) {
                    let stats = &follower.stats;
                    out!(
                        text,
                        "         {} objects: epoch {}, {}; {} keys ({} bytes) taken over since start, {} requests held for a transfer, {} keys dropped once their new group held them",
                        follower.service,
                        stats.epoch,
                        match (stats.transfers_pending, stats.transfers_undecided) {
                            (0, 0) => "every transfer done".to_string(),
                            (0, undecided) => format!(
                                "every transfer heard out, {undecided} objects undecided (a creation never completed; their requests wait)"
                            ),
                            (pending, _) =>
                                format!("{pending} key ranges still being transferred in"),
                        },
                        stats.transferred_keys,
                        stats.transferred_bytes,
                        stats.gated,
                        stats.collected
                    );
                }
                {
                    // Every group's table replica on this node, together.
                    let mut stats = bulwark_protocol::machine::ReplicaStats::default();
                    for tables in status.replicas.iter().filter(|r| r.service == "table") {
                        stats.add(&tables.stats);
                    }
                    if stats.bad_signatures
                        + stats.forged_cells
                        + stats.resolved_reads
                        + stats.repairs
                        + stats.synced
                        + stats.mac_fallbacks
                        > 0
                    {
                        out!(
                            text,
                            "         tables: {} signatures of other members refused as proxy, {} forged cells refused, {} reads resolved, {} write-backs taken, {} cells taken by anti-entropy, {} Full-Sym writes checked by signature (tag missing or altered)",
                            stats.bad_signatures,
                            stats.forged_cells,
                            stats.resolved_reads,
                            stats.repairs,
                            stats.synced,
                            stats.mac_fallbacks
                        );
                    }
                    if stats.collected + stats.confirmed_live + stats.not_live > 0 {
                        out!(
                            text,
                            "         tables past the GC grace: {} tombstones collected, {} old cells taken once f+1 members held them, {} refused as not live",
                            stats.collected,
                            stats.confirmed_live,
                            stats.not_live
                        );
                    }
                    if stats.revoked_clients > 0 {
                        out!(
                            text,
                            "         tables: {} clients revoked, {} of their writes refused",
                            stats.revoked_clients,
                            stats.revoked_refused
                        );
                    }
                }
                if let Some(log) = &status.trusted_log {
                    let key = hex::encode(log.key);
                    out!(
                        text,
                        "         trusted log: {}, key {}…, {} batches, {} attestations, {} refused",
                        log.backend,
                        &key[..16],
                        log.batches,
                        log.attestations,
                        log.refused
                    );
                    if let Some(why) = &log.unreachable {
                        out!(text, "         trusted log unreachable: {why}");
                    }
                    if let Some(why) = &log.last_refusal {
                        out!(text, "         trusted log's last refusal: {why}");
                    }
                    for (id, low, high) in &log.heads {
                        let name = match id.checked_sub(bulwark_protocol::a2m_storage::LOGS_BASE) {
                            Some(at) => format!(
                                "volume {}'s {} log",
                                at / 2,
                                if at % 2 == 0 { "writes" } else { "versions" }
                            ),
                            None => format!("log {id}"),
                        };
                        out!(text, "         trusted log, {name}: slots {low} to {high}");
                    }
                }
                for volume in &status.causal {
                    let frontier: Vec<String> = volume
                        .frontier
                        .iter()
                        .map(|(member, clocks)| {
                            let clocks: Vec<String> =
                                clocks.iter().map(|c| c.to_string()).collect();
                            format!(
                                "{}:{}",
                                member_name(&volume.names, *member),
                                clocks.join("|")
                            )
                        })
                        .collect();
                    out!(
                        text,
                        "         causal volume {:016x}: {} updates ({} waiting), {} values ({}), {} discarded, {} refused; frontier {}",
                        volume.volume,
                        volume.updates,
                        volume.pending,
                        volume.values,
                        human_bytes(volume.value_bytes),
                        volume.discarded,
                        volume.refused,
                        if frontier.is_empty() {
                            "empty".to_string()
                        } else {
                            frontier.join(" ")
                        }
                    );
                    if volume.values_damaged > 0 {
                        out!(
                            text,
                            "           {} values did not read back intact from this node's store (fetched again from peers)",
                            volume.values_damaged
                        );
                    }
                    if !volume.forks.is_empty() {
                        let forks: Vec<String> = volume
                            .forks
                            .iter()
                            .map(|m| member_name(&volume.names, *m))
                            .collect();
                        out!(
                            text,
                            "         causal volume {:016x}: proof held that {} forked (evicted)",
                            volume.volume,
                            forks.join(",")
                        );
                    }
                    for pending in &volume.pending_discards {
                        let missing: Vec<String> = pending
                            .missing
                            .iter()
                            .map(|m| member_name(&volume.names, *m))
                            .collect();
                        out!(
                            text,
                            "         causal volume {:016x}: discard proposal of {} (turn {}, {} versions) waits for the consent of {}",
                            volume.volume,
                            member_name(&volume.names, pending.proposer),
                            pending.turn,
                            pending.versions,
                            missing.join(",")
                        );
                    }
                }
                if status.server.damaged > 0 {
                    out!(
                        text,
                        "         damaged disk: {} reads found a stored fragment missing or not matching its checksum (withheld, not served)",
                        status.server.damaged
                    );
                }
            }
            Err(error) => out!(
                text,
                "{:<6} {:<22} {:<10} {error}",
                id.0,
                address.to_string(),
                "unreachable"
            ),
        }
    }
    // Table replicas whose signatures other members' proxies refused, by node: a bad signature
    // alone proves nothing a third party can check (the proxy could be lying), so this is what
    // the correct proxies saw, counted where they saw it.
    let mut bad_signers: std::collections::BTreeMap<u32, (u64, Vec<u32>)> = Default::default();
    for (by, _, status) in &statuses {
        let Ok(status) = status else { continue };
        for replica in status.replicas.iter().filter(|r| r.service == "table") {
            let group = client
                .placement()
                .group(bulwark_core::GroupId(replica.group));
            for (slot, count) in &replica.stats.bad_signers {
                let Some(node) = group
                    .as_ref()
                    .and_then(|view| view.node(bulwark_core::Slot(*slot)))
                else {
                    continue;
                };
                let entry = bad_signers.entry(node.0).or_default();
                entry.0 += count;
                entry.1.push(by.0);
            }
        }
    }
    if !bad_signers.is_empty() {
        out!(text, "table replicas whose signatures proxies refused:");
        for (node, (count, by)) in bad_signers {
            let by: Vec<String> = by.iter().map(u32::to_string).collect();
            out!(
                text,
                "  node {node}: {count} signatures, refused by nodes {}",
                by.join(",")
            );
        }
    }
    let caught = bulwark_client::evidence::summary(&args.cluster);
    if !caught.is_empty() {
        out!(
            text,
            "misbehaviour observed by clients (from {}):",
            args.cluster
                .join(bulwark_client::evidence::LOG_FILE)
                .display()
        );
        for line in caught {
            out!(text, "  {line}");
        }
    }
    let n = statuses.len();
    let f = client.cluster().f;
    let groups = client.placement().groups().len();
    out!(
        text,
        "{reachable} of {n} nodes reachable; {groups} replica group(s) of {}, each needing {} (f = {f}; default volume: {})",
        3 * f + 1,
        2 * f + 1,
        client.cluster().protocol
    );
    emit(&text)?;
    Ok(if reachable >= n - f {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(3)
    })
}

/// Writes `text` to standard output; a reader that went away (`bulwark status | head -1`) is
/// not an error, and no panic.
pub fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => Ok(written?),
    }
}

/// `bulwark owned new-key`: the secret to a file only its owner can read, the public key out.
pub fn new_owner_key(file: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let seed: [u8; 32] = rand::random();
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("creating {}", file.display()))?;
    writeln!(out, "{}", hex::encode(seed))
        .with_context(|| format!("writing {}", file.display()))?;
    let public = bulwark_core::sign::SecretKey::from_seed(&seed).public_key();
    println!("{}", hex::encode(public.to_bytes()));
    Ok(())
}

/// The owner's secret from a file `owned new-key` wrote.
fn owner_key(file: &std::path::Path) -> Result<bulwark_core::sign::SecretKey> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .with_context(|| {
            format!(
                "{} does not hold an owner key (64 hex digits)",
                file.display()
            )
        })?;
    Ok(bulwark_core::sign::SecretKey::from_seed(&seed))
}

/// `bulwark owned put` (`file` given, possibly `-`) and `owned delete` (`None`).
pub async fn put_owned(
    args: &ClientArgs,
    key: &std::path::Path,
    file: Option<Option<PathBuf>>,
) -> Result<()> {
    no_volume(args)?;
    let owner = owner_key(key)?;
    let value = match file {
        Some(file) => Some(Bytes::from(read_input(file)?)),
        None => None,
    };
    let client = connect(args).await?;
    let public = hex::encode(owner.public_key().to_bytes());
    let deleting = value.is_none();
    let (_, report) = client.put_owned(&owner, value).await?;
    if deleting {
        eprintln!(
            "deleted the object of {}: {}",
            &public[..16],
            summary(&report)
        );
    } else {
        println!("{public}");
        eprintln!(
            "stored the object of {}: {}",
            &public[..16],
            summary(&report)
        );
    }
    Ok(())
}

/// `bulwark owned get`.
pub async fn get_owned(
    args: &ClientArgs,
    public: &str,
    output: Option<PathBuf>,
) -> Result<std::process::ExitCode> {
    no_volume(args)?;
    let owner = hex::decode(public.trim())
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .and_then(|bytes| bulwark_core::sign::PublicKey::from_bytes(&bytes).ok())
        .with_context(|| format!("{public:?} is not an owner's public key (64 hex digits)"))?;
    let client = connect(args).await?;
    let started = Instant::now();
    let (value, report) = client.get_owned(&owner).await?;
    deliver(
        &format!("the object of {}", &public.trim()[..16]),
        value,
        &report,
        output,
        started,
    )
}
