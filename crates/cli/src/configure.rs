//! `bulwark config show`, `bulwark node add|revoke|evict` and `bulwark epoch end`: the configuration
//! service from the command line. Every configuration shown is verified from the genesis in
//! `cluster.toml`, one certificate after another.

use crate::ClientArgs;
use crate::objects::connect;
use anyhow::{Context, Result, bail};
use bulwark_client::{ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::config::Fingerprint;
use bulwark_core::configuration::{Configuration, NewMember};
use bulwark_core::sign::PublicKey;
use bulwark_protocol::cs::Op;
use std::net::SocketAddr;

/// `bulwark node add|revoke|evict`.
#[derive(clap::Subcommand)]
pub enum MembershipCommand {
    /// Orders, as the trusted authority, that a node joins in the next epoch.
    Add {
        /// Where clients and peers will reach it.
        #[arg(long)]
        address: SocketAddr,
        /// Its TLS certificate's SHA-256 fingerprint (hex).
        #[arg(long)]
        fingerprint: String,
        /// Its Ed25519 public key (hex).
        #[arg(long)]
        signing_key: String,
        /// Its trusted log's public key (hex, as `bulwark a2m init` prints it): needed when the
        /// configuration service runs on A2M-PBFT-EA, where every member has one.
        #[arg(long)]
        trusted_key: Option<String>,
        /// Wait until the epoch it joins in is certified.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Brings a new node in and runs it: makes its keys and certificate, orders as the trusted
    /// authority that it joins in the next epoch, waits until that epoch is certified, then
    /// serves as the member it was certified as (`bulwark node --id N` restarts it later).
    Join {
        /// Where clients and peers will reach it.
        #[arg(long)]
        address: SocketAddr,
        /// Listen here instead (e.g. 0.0.0.0:PORT in a container).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Serve Prometheus metrics here.
        #[arg(long)]
        metrics: Option<SocketAddr>,
        /// Where to keep durable state (default: <cluster>/node-<id>/data).
        #[arg(long)]
        data: Option<std::path::PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Orders, as the trusted authority, that a member leaves in the next epoch.
    Revoke {
        /// The member's id.
        id: u32,
        /// Wait until the epoch it leaves in is certified.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Evicts an unresponsive member now: the CS replicas sign their agreement only if their
    /// own pings have gone unanswered, and 2f_cs+1 agreements make the eviction.
    Evict {
        /// The member's id.
        id: u32,
        /// Wait until the epoch it leaves in is certified.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `bulwark config`.
#[derive(clap::Subcommand)]
pub enum ConfigCommand {
    /// Prints the newest certified configuration: epoch, members and configuration service.
    Show {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `bulwark epoch`.
#[derive(clap::Subcommand)]
pub enum EpochCommand {
    /// Asks the configuration service to end the current epoch (it agrees only once the epoch
    /// has lasted its length, less the clock tolerance) and waits for the next to be certified.
    End {
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn config(command: &ConfigCommand) -> Result<()> {
    let ConfigCommand::Show { client } = command;
    let client = connect(client).await?;
    let config = client.configuration().await?;
    crate::objects::emit(&describe(&config))?;
    Ok(())
}

/// A configuration as `config show` prints it.
pub fn describe(config: &Configuration) -> String {
    let cs = config.cs();
    let mut text = format!(
        "epoch {} (began at {} ms after the Unix epoch; lasts {:.1} s; digest {:?})\n",
        config.epoch.0,
        config.started_at_ms,
        config.t_epoch_ms as f64 / 1000.0,
        config.digest()
    );
    text += &format!(
        "f = {} (groups of {}), f_cs = {} (a configuration service of {} on {})\n",
        config.f,
        3 * config.f + 1,
        config.f_cs,
        config.cs_size(),
        config.cs_protocol.name()
    );
    text += &format!(
        "{:<6} {:<22} {:<4} {}\n",
        "node", "address", "cs", "signing key"
    );
    for member in &config.members {
        let slot = cs
            .iter()
            .position(|id| *id == member.id)
            .map_or_else(String::new, |slot| slot.to_string());
        text += &format!(
            "{:<6} {:<22} {:<4} {}\n",
            member.id.0,
            member.address.to_string(),
            slot,
            member.signing_key
        );
    }
    text += &format!(
        "configuration service (slot order): {}\n",
        cs.iter()
            .map(|id| id.0.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    text
}

pub async fn membership(command: &MembershipCommand) -> Result<()> {
    let (action, wait, args) = match command {
        MembershipCommand::Add {
            address,
            fingerprint,
            signing_key,
            trusted_key,
            wait,
            client,
        } => {
            let fingerprint = bulwark_core::config::parse_hex32(fingerprint)
                .map(Fingerprint)
                .map_err(anyhow::Error::msg)
                .context("--fingerprint")?;
            let signing_key: PublicKey = signing_key
                .parse()
                .map_err(|e| anyhow::anyhow!("--signing-key: {e}"))?;
            let trusted_key = trusted_key
                .as_deref()
                .map(str::parse::<PublicKey>)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--trusted-key: {e}"))?;
            let member = NewMember {
                trusted_key,
                address: *address,
                fingerprint,
                signing_key,
            };
            (Some(ConfigAction::Add(member)), *wait, client)
        }
        MembershipCommand::Revoke { id, wait, client } => {
            (Some(ConfigAction::Revoke(NodeId(*id))), *wait, client)
        }
        MembershipCommand::Evict { wait, client, .. } => (None, *wait, client),
        MembershipCommand::Join { .. } => bail!("`node join` runs the node it adds"),
    };
    let client = connect(args).await?;
    let (config, outcome, verb) = match (action, command) {
        (Some(action), _) => {
            let verb = match action {
                ConfigAction::Add(_) => "joins",
                ConfigAction::Revoke(_) => "leaves",
            };
            let (config, outcome) = client.order(action).await?;
            (config, outcome, verb)
        }
        (None, MembershipCommand::Evict { id, .. }) => {
            let (config, outcome) = client.evict(NodeId(*id)).await?;
            (config, outcome, "is evicted; it leaves")
        }
        (None, _) => bail!("no membership change to make"),
    };
    accepted(&client, &config, outcome, verb, wait).await
}

/// Reports a membership change the CS of `config`'s epoch answered, and waits for the epoch it
/// takes effect in if asked.
async fn accepted(
    client: &bulwark_client::Client,
    config: &Configuration,
    outcome: ConfigOutcome,
    verb: &str,
    wait: bool,
) -> Result<()> {
    let (epoch, node) = match outcome {
        ConfigOutcome::Accepted { epoch, node } => (epoch, node),
        ConfigOutcome::Rejected(reason) => {
            bail!(
                "the configuration service of epoch {} refused: {reason}",
                config.epoch.0
            )
        }
        other => bail!("unexpected answer: {other:?}"),
    };
    let who = node.map_or_else(|| "the node".to_string(), |n| format!("node {}", n.0));
    println!(
        "{who} {verb} in epoch {} (accepted by the configuration service of epoch {})",
        epoch.0, config.epoch.0
    );
    if wait {
        let next = client.await_epoch(epoch.0).await?;
        println!(
            "epoch {} certified: {} members",
            next.epoch.0,
            next.members.len()
        );
    }
    Ok(())
}

pub async fn epoch(command: &EpochCommand) -> Result<()> {
    let EpochCommand::End { client } = command;
    let client = connect(client).await?;
    let (config, outcome) = client.configure(|_| Ok(Op::Stop)).await?;
    match outcome {
        ConfigOutcome::Stopped { epoch, .. } => {
            let next = client.await_epoch(epoch.0).await?;
            println!(
                "epoch {} ended; epoch {} certified with {} members",
                config.epoch.0,
                next.epoch.0,
                next.members.len()
            );
            Ok(())
        }
        ConfigOutcome::Rejected(reason) => bail!("{reason}"),
        other => bail!("unexpected answer: {other:?}"),
    }
}

/// `bulwark node join`: what the new node is, once the epoch that adds it is certified; the
/// caller runs it. Its keys are made in `<cluster>/joining-<port>/` and kept there until it is
/// certified, so a join interrupted while waiting resumes with the same identity; the directory
/// then becomes `node-<id>`.
pub async fn join(
    address: SocketAddr,
    listen: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    data: Option<std::path::PathBuf>,
    args: &ClientArgs,
) -> Result<crate::NodeArgs> {
    use bulwark_core::config::NodeSecrets;
    let pending = args.cluster.join(format!("joining-{}", address.port()));
    let secrets_file = pending.join("node.toml");
    let (seed, fingerprint) = if secrets_file.exists() {
        let secrets: NodeSecrets = bulwark_core::config::parse_secrets(
            &std::fs::read_to_string(&secrets_file)?,
            &secrets_file.display().to_string(),
        )?;
        let identity = bulwark_transport::Identity::from_pem(
            &std::fs::read_to_string(pending.join("tls.crt"))?,
            &std::fs::read_to_string(pending.join("tls.key"))?,
        )?;
        (secrets.signing_key, identity.fingerprint())
    } else {
        std::fs::create_dir_all(&pending)
            .with_context(|| format!("creating {}", pending.display()))?;
        let seed: [u8; 32] = rand::random();
        let fingerprint = crate::cluster_init::write_identity(
            &pending,
            &format!("bulwark-node-{}", address.port()),
        )?;
        // Written now, with no id yet, so that a second attempt finds the same keys.
        write_secrets(&secrets_file, u32::MAX, seed, address)?;
        (seed, fingerprint)
    };
    let signing_key = bulwark_core::sign::SecretKey::from_seed(&seed).public_key();

    let mut client = connect(args).await?;
    let current = client.configuration().await?;
    let id = match current
        .members
        .iter()
        .find(|member| member.fingerprint == fingerprint)
    {
        // An earlier attempt got as far as being certified.
        Some(member) => member.id,
        // Not the administrator: the administrator adds it, from wherever the authority key is.
        None if !client.is_authority() => {
            println!(
                "this client holds no authority key; ask the administrator to run:\n  \
                 bulwark node add --address {address} --fingerprint {fingerprint} \
                 --signing-key {signing_key}\nwaiting up to {JOIN_WAIT_MINUTES} minutes for a \
                 certified configuration that lists it"
            );
            await_member(&client, fingerprint).await?
        }
        None => {
            let member = NewMember {
                trusted_key: None,
                address,
                fingerprint,
                signing_key,
            };
            let (config, outcome) = client.order(ConfigAction::Add(member)).await?;
            let (epoch, node) = match outcome {
                ConfigOutcome::Accepted { epoch, node } => (epoch, node),
                ConfigOutcome::Rejected(reason) => bail!(
                    "the configuration service of epoch {} refused: {reason}",
                    config.epoch.0
                ),
                other => bail!("unexpected answer: {other:?}"),
            };
            println!(
                "the configuration service of epoch {} accepted: {} joins in epoch {}; \
                 waiting for it to be certified (epochs last {:.1} s)",
                config.epoch.0,
                node.map_or_else(|| "the node".to_string(), |n| n.to_string()),
                epoch.0,
                config.t_epoch_ms as f64 / 1000.0
            );
            // The epoch ends when it has lasted its length, give or take the clock tolerance.
            client.deadline = client.deadline.max(std::time::Duration::from_millis(
                config.t_epoch_ms + 2 * config.stop_delta_ms + 30_000,
            ));
            let certified = client.await_epoch(epoch.0).await?;
            certified
                .members
                .iter()
                .find(|member| member.fingerprint == fingerprint)
                .map(|member| member.id)
                .with_context(|| {
                    format!(
                        "epoch {} was certified without this node (it may have been revoked \
                         meanwhile)",
                        certified.epoch.0
                    )
                })?
        }
    };
    write_secrets(&secrets_file, id.0, seed, address)?;
    let node_dir = args.cluster.join(format!("node-{}", id.0));
    if node_dir.exists() {
        bail!(
            "{} already exists: {id} cannot be set up there",
            node_dir.display()
        );
    }
    std::fs::rename(&pending, &node_dir)
        .with_context(|| format!("moving {} to {}", pending.display(), node_dir.display()))?;
    println!(
        "{id} is a member; serving at {address} (restart it with `bulwark node --id {}`)",
        id.0
    );
    Ok(crate::NodeArgs {
        cluster: args.cluster.clone(),
        id: Some(id.0),
        data,
        listen,
        metrics,
        grace_ms: crate::GRACE_MS_DEFAULT,
        cached_keys: bulwark_protocol::powerstore::CACHED_KEYS_MAX,
        causal_cache_bytes: bulwark_node::depots::RESIDENT_VALUE_BYTES,
        peers: Vec::new(),
        unprotected_tables: false,
    })
}

/// How long `node join` waits for an administrator to add the node.
const JOIN_WAIT_MINUTES: u64 = 60;

/// The id of the member with certificate `fingerprint`, once a certified configuration lists
/// it; polled, for at most [`JOIN_WAIT_MINUTES`].
async fn await_member(client: &bulwark_client::Client, fingerprint: Fingerprint) -> Result<NodeId> {
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(JOIN_WAIT_MINUTES * 60);
    loop {
        let config = client.configuration().await?;
        if let Some(member) = config.members.iter().find(|m| m.fingerprint == fingerprint) {
            return Ok(member.id);
        }
        if std::time::Instant::now() >= deadline {
            bail!("no certified configuration listed this node within {JOIN_WAIT_MINUTES} minutes");
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// A joining node's `node.toml`: its keys, its address and (once certified) its id. Its MAC key
/// is its own: it serves no static group, where writers would need to share it.
fn write_secrets(
    path: &std::path::Path,
    id: u32,
    seed: [u8; 32],
    address: SocketAddr,
) -> Result<()> {
    let secrets = bulwark_core::config::NodeSecrets {
        id,
        signing_key: seed,
        address: Some(address),
        a2m_socket: None,
    };
    crate::cluster_init::write_private(path, &crate::cluster_init::toml_text(&secrets)?)
}
