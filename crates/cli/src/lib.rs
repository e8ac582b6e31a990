//! The `bulwark` command line: set up a cluster, run a node, store and fetch objects, inspect
//! nodes, and start a local development cluster. Argument parsing and presentation only; the work
//! happens in the library crates. A library target so that `bulwark-byzantine` shares it.

pub mod a2m;
pub mod bench;
pub mod cluster_init;
pub mod configure;
mod demo_join;
pub mod dev;
pub mod gateway;
pub mod objects;
pub mod sim;
pub mod tables;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

pub use clap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Byzantine-fault-tolerant object storage.
#[derive(Parser)]
#[command(name = "bulwark", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Options every client command shares.
#[derive(clap::Args, Clone)]
pub struct ClientArgs {
    /// The cluster directory written by `bulwark cluster init` (or `bulwark dev`).
    #[arg(long, env = "BULWARK_CLUSTER", default_value = dev::DEFAULT_DIR, global = true)]
    pub cluster: PathBuf,
    /// Which client identity to use.
    #[arg(long, env = "BULWARK_CLIENT", default_value = "admin", global = true)]
    pub client: String,
    /// How long an operation may keep retrying, in seconds.
    #[arg(long, default_value_t = 30, global = true)]
    pub timeout: u64,
    /// The volume to use (see `bulwark volume create`); the default volume when absent.
    #[arg(long, global = true)]
    pub volume: Option<String>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Cluster set-up.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Runs a storage node; `node add`, `node revoke` and `node evict` change the membership
    /// instead.
    Node(NodeCommand),
    /// The configuration: `config show` prints the newest certified one.
    Config {
        #[command(subcommand)]
        command: configure::ConfigCommand,
    },
    /// Epochs: `epoch end` ends the current one once it has lasted its length.
    Epoch {
        #[command(subcommand)]
        command: configure::EpochCommand,
    },
    /// Stores an object: from FILE, or from standard input when FILE is `-` or absent.
    Put {
        /// The object's key.
        key: String,
        /// Where the bytes come from.
        file: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Fetches an object to standard output or to `-o FILE`.
    Get {
        /// The object's key.
        key: String,
        /// Write here instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Causal volumes: a member client serving its log (`bulwark volume serve`), as
        /// NAME@HOST:PORT, asked after every server for the values of its own writes that no
        /// server gives. Repeatable.
        #[arg(long = "peer")]
        peers: Vec<String>,
        /// Causal volumes: list every version of the key the log holds, superseded and deleted
        /// ones too, newest first, instead of fetching it.
        #[arg(long, conflicts_with = "version")]
        versions: bool,
        /// Causal volumes: fetch the version whose id starts with these hex digits (at least 8,
        /// as `--versions` lists them) instead of the newest: an overwritten or deleted value
        /// back.
        #[arg(long, value_name = "ID")]
        version: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Lists the keys of a causal volume that start with PREFIX, with how many concurrent
    /// versions each has.
    List {
        /// Only keys starting with this.
        #[arg(default_value = "")]
        prefix: String,
        /// At most this many keys.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deletes an object.
    Delete {
        /// The object's key.
        key: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Content-hash objects: immutable, named by their content (`content put` prints the id).
    Content {
        #[command(subcommand)]
        command: ContentCommand,
    },
    /// Public-key objects: mutable, named by their owner's public key, written only with the
    /// owner's key (`owned new-key` makes one).
    Owned {
        #[command(subcommand)]
        command: OwnedCommand,
    },
    /// Hardened tables: rows of cells signed by their writers, read and written through
    /// Byzantine quorums (`table create` first).
    Table {
        #[command(subcommand)]
        command: tables::TableCommand,
    },
    /// Volumes: named sets of objects, each served by the protocol chosen at creation.
    Volume {
        #[command(subcommand)]
        command: VolumeCommand,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Shows every node: reachable, version, objects, rejected messages and from whom.
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Measures put and get on a fresh local cluster, and node memory under overwrites.
    Bench(bench::BenchArgs),
    /// Runs the deterministic simulator: a sweep of seeds, or one seed replayed with a trace.
    Sim(sim::SimArgs),
    /// Serves the S3 API over the cluster (SigV4 against configured access keys).
    Gateway(gateway::GatewayArgs),
    /// A node's trusted log (A2M): `a2m init` makes one, `a2m serve` runs it as its own process.
    A2m {
        #[command(subcommand)]
        command: a2m::A2mCommand,
    },
    /// Starts a local cluster (4 nodes unless --nodes) as separate processes and serves until
    /// Ctrl-C.
    Dev {
        /// Where the cluster lives.
        #[arg(long, default_value = dev::DEFAULT_DIR)]
        dir: PathBuf,
        /// Nodes in a new cluster (at least 4); ignored when the directory holds one already.
        #[arg(long, default_value_t = 4)]
        nodes: usize,
        /// Also run a demonstration, including a lying node, and exit.
        #[arg(long)]
        demo: bool,
    },
}

#[derive(Subcommand)]
pub enum ContentCommand {
    /// Stores FILE (or standard input) and prints its id on standard output.
    Put {
        /// Where the bytes come from; standard input when `-` or absent.
        file: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Fetches the object with id ID (64 hex digits) to standard output or to `-o FILE`.
    Get {
        /// The object's id.
        id: String,
        /// Write here instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deletes the object with id ID from its group. The same bytes name the same object
    /// whoever stored them: delete only what nothing else refers to.
    Delete {
        /// The object's id.
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand)]
pub enum OwnedCommand {
    /// Makes an owner key: writes its secret to FILE (readable by you alone) and prints the
    /// public key, the object's name.
    NewKey {
        /// Where the secret goes; it must not exist yet.
        file: PathBuf,
    },
    /// Writes FILE (or standard input) as the next version of the object whose owner key is in
    /// the --key file.
    Put {
        /// The owner's secret, as `owned new-key` wrote it.
        #[arg(long)]
        key: PathBuf,
        /// Where the bytes come from; standard input when `-` or absent.
        file: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Fetches the object owned by PUBLIC (64 hex digits) to standard output or `-o FILE`.
    Get {
        /// The owner's public key.
        public: String,
        /// Write here instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deletes the object whose owner key is in the --key file (a signed tombstone).
    Delete {
        /// The owner's secret.
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Creates a volume, replicated by one protocol or served by one node with a trusted log;
    /// its objects are then reached with `--volume`.
    Create {
        /// The volume's name: 1 to 63 characters of a-z, 0-9, '-', '_', '.'.
        name: String,
        /// replicated (every key on its replica group) or single-server (one node with a
        /// trusted log serves it, A2M-Storage: clients catch a server that forks or rolls back
        /// what they see, but the volume is down while its server is).
        #[arg(long, default_value = "replicated")]
        mode: objects::Mode,
        /// For a replicated volume: powerstore (Byzantine, erasure-coded; the default), abd
        /// (crash-tolerant baseline) or phalanx (signature-based Byzantine baseline).
        #[arg(long)]
        protocol: Option<bulwark_core::config::Protocol>,
        /// For a single-server volume: the node that serves it (it needs a trusted log, see
        /// `cluster init --a2m`).
        #[arg(long)]
        server: Option<u32>,
        /// For a replicated PoWerStore volume: the one client (its name in cluster.toml) that
        /// may write it. The nodes refuse every other client's writes, and its writes take two
        /// rounds instead of three (it keeps its own clock).
        #[arg(long)]
        writer: Option<String>,
        /// linearizable (the default: registers, by --mode) or causal (Depot: available and
        /// fork-join-causal whatever number of its servers fail or lie; a get of a key written
        /// concurrently returns every version).
        #[arg(long, default_value = "linearizable")]
        consistency: objects::Consistency,
        /// For a causal volume: the nodes that serve it, comma-separated (default: every node
        /// of cluster.toml).
        #[arg(long, value_delimiter = ',')]
        servers: Vec<u32>,
    },
    /// Serves this client's log of causal volume NAME to the volume's other clients at
    /// --listen, until Ctrl-C: how clients exchange when no server answers.
    Serve {
        /// The causal volume.
        name: String,
        /// Where to listen (loopback or an address the other clients reach).
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Exchanges this client's log of causal volume NAME with another client's
    /// (`volume serve`): what each lacks goes to the other.
    Sync {
        /// The causal volume.
        name: String,
        /// The other client, as NAME@HOST:PORT.
        #[arg(long)]
        peer: String,
    },
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Writes keys and configuration for a new cluster into a directory.
    Init(cluster_init::InitCommand),
}

/// `bulwark node`: run one, or change the membership.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeCommand {
    #[command(subcommand)]
    pub change: Option<configure::MembershipCommand>,
    #[command(flatten)]
    pub run: NodeArgs,
}

/// How long a superseded version stays readable, by default.
pub const GRACE_MS_DEFAULT: u64 = 10_000;

/// `bulwark node` (running one).
#[derive(clap::Args)]
pub struct NodeArgs {
    /// The cluster directory.
    #[arg(long, env = "BULWARK_CLUSTER", default_value = dev::DEFAULT_DIR)]
    pub cluster: PathBuf,
    /// This node's id.
    #[arg(long, required = true)]
    pub id: Option<u32>,
    /// Where to keep durable state (default: <cluster>/node-<id>/data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Listen here instead of the configured address (e.g. 0.0.0.0:7100 in a container).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Serve metrics here instead of the configured address.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Milliseconds a superseded version stays readable before garbage collection.
    #[arg(long, default_value_t = GRACE_MS_DEFAULT)]
    pub grace_ms: u64,
    /// The most registers per group whose metadata stays in memory; others are read back from
    /// disk when asked for, so memory stays bounded however many keys the node stores.
    #[arg(long, default_value_t = bulwark_protocol::powerstore::CACHED_KEYS_MAX)]
    pub cached_keys: usize,
    /// The bytes of values each causal volume keeps in memory; others are read back from disk
    /// when asked for.
    #[arg(long, default_value_t = bulwark_node::depots::RESIDENT_VALUE_BYTES)]
    pub causal_cache_bytes: u64,
    /// Dial node ID at HOST:PORT instead of its configured address, as ID=HOST:PORT (repeat or
    /// separate with commas): containers reach each other by name. The node must still present
    /// the certificate pinned in cluster.toml.
    #[arg(long = "peer", value_delimiter = ',', value_parser = parse_peer)]
    pub peers: Vec<(u32, String)>,
    /// Let clients create tables of the variants that protect nothing (Plain, No-Sign), as
    /// `bulwark bench compare` does to measure hardened tables against them.
    #[arg(long)]
    pub unprotected_tables: bool,
}

fn parse_peer(text: &str) -> Result<(u32, String), String> {
    let (id, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ID=HOST:PORT"))?;
    let id = id.parse().map_err(|e| format!("node id {id:?}: {e}"))?;
    if !address.contains(':') {
        return Err(format!("{address:?} has no port"));
    }
    Ok((id, address.to_string()))
}

/// Logs go to standard error; nodes log at info, client commands only warnings.
pub fn init_tracing(node: bool) {
    init_tracing_with(if node { "info" } else { "warn" });
}

/// The gateway logs its own warnings; s3s logs every client error (with the offending request
/// body) at error level, which would let any client fill the log, so it is silenced by default.
pub const GATEWAY_LOG_DEFAULT: &str = "warn,s3s=off";

/// Logs go to standard error, filtered by `BULWARK_LOG` or else `default`.
pub fn init_tracing_with(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BULWARK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs one parsed command.
pub async fn run(cli: Cli) -> Result<std::process::ExitCode> {
    match cli.command {
        Command::Cluster {
            command: ClusterCommand::Init(init),
        } => {
            cluster_init::run_protocol(&init.args, init.protocol)?;
        }
        Command::Node(NodeCommand {
            change:
                Some(configure::MembershipCommand::Join {
                    address,
                    listen,
                    metrics,
                    data,
                    client,
                }),
            ..
        }) => {
            let args = configure::join(address, listen, metrics, data, &client).await?;
            run_node(args, bulwark_node::Wrap::honest()).await?
        }
        Command::Node(NodeCommand {
            change: Some(change),
            ..
        }) => configure::membership(&change).await?,
        Command::Node(NodeCommand { run, .. }) => {
            run_node(run, bulwark_node::Wrap::honest()).await?
        }
        Command::Config { command } => configure::config(&command).await?,
        Command::Epoch { command } => configure::epoch(&command).await?,
        Command::Put { key, file, client } => objects::put(&client, &key, file).await?,
        Command::Get {
            key,
            output,
            peers,
            versions,
            version,
            client,
        } => {
            let past = if versions {
                objects::Past::List
            } else {
                version.map_or(objects::Past::Newest, objects::Past::Version)
            };
            return objects::get(&client, &key, output, &peers, past).await;
        }
        Command::Delete { key, client } => objects::delete(&client, &key).await?,
        Command::List {
            prefix,
            limit,
            client,
        } => objects::list(&client, &prefix, limit).await?,
        Command::Content {
            command: ContentCommand::Put { file, client },
        } => objects::put_content(&client, file).await?,
        Command::Content {
            command: ContentCommand::Get { id, output, client },
        } => return objects::get_content(&client, &id, output).await,
        Command::Content {
            command: ContentCommand::Delete { id, client },
        } => objects::delete_content(&client, &id).await?,
        Command::Table { command } => tables::run(command).await?,
        Command::Owned { command } => match command {
            OwnedCommand::NewKey { file } => objects::new_owner_key(&file)?,
            OwnedCommand::Put { key, file, client } => {
                objects::put_owned(&client, &key, Some(file)).await?
            }
            OwnedCommand::Delete { key, client } => objects::put_owned(&client, &key, None).await?,
            OwnedCommand::Get {
                public,
                output,
                client,
            } => return objects::get_owned(&client, &public, output).await,
        },
        Command::Status { client } => return objects::status(&client).await,
        Command::Dev { dir, nodes, demo } => dev::run(&dir, nodes, demo).await?,
        Command::Volume {
            command:
                VolumeCommand::Create {
                    name,
                    mode,
                    protocol,
                    server,
                    writer,
                    consistency,
                    servers,
                },
            client,
        } => match consistency {
            objects::Consistency::Linearizable => {
                if !servers.is_empty() {
                    anyhow::bail!(
                        "--servers names a causal volume's nodes; add --consistency causal"
                    );
                }
                let spec = objects::VolumeSpec {
                    mode,
                    protocol,
                    server,
                    writer,
                };
                objects::create_volume(&client, &name, spec).await?
            }
            objects::Consistency::Causal => {
                if mode != objects::Mode::Replicated
                    || protocol.is_some()
                    || server.is_some()
                    || writer.is_some()
                {
                    anyhow::bail!(
                        "a causal volume has no --mode, --protocol, --server or --writer; --servers names its nodes"
                    );
                }
                objects::create_causal_volume(&client, &name, &servers).await?
            }
        },
        Command::Volume {
            command: VolumeCommand::Serve { name, listen },
            client,
        } => objects::serve_causal(&client, &name, listen).await?,
        Command::Volume {
            command: VolumeCommand::Sync { name, peer },
            client,
        } => objects::sync_causal(&client, &name, &peer).await?,
        Command::Bench(args) => bench::run(&args).await?,
        Command::Gateway(args) => gateway::run(&args).await?,
        Command::Sim(args) => return sim::run(&args),
        Command::A2m { command } => a2m::run(command).await?,
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Starts a node; `wrap` turns the honest server into what this binary serves.
pub async fn run_node(args: NodeArgs, wrap: bulwark_node::Wrap) -> Result<()> {
    let id = args.id.context("--id is required to run a node")?;
    let mut options = bulwark_node::NodeOptions::load(&args.cluster, id, args.data)?;
    options.listen = args.listen;
    options.metrics = args.metrics;
    options.grace_millis = args.grace_ms;
    options.cached_keys_max = args.cached_keys;
    options.causal_cache_bytes = args.causal_cache_bytes;
    options.unprotected_tables = args.unprotected_tables;
    options.peer_addresses = args
        .peers
        .into_iter()
        .map(|(id, address)| (bulwark_core::NodeId(id), address))
        .collect();
    bulwark_node::run(options, wrap).await?;
    Ok(())
}
