//! `bulwark gateway`: the S3-compatible front end.

use crate::dev;
use anyhow::{Context, Result};
use bulwark_gateway::GatewayConfig;
use bulwark_gateway::config::{AccessKey, SseKey};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The demo credentials, used only when neither a configuration file nor keys are given.
const DEMO_ACCESS_KEY: &str = "bulwark";
const DEMO_SECRET_KEY: &str = "bulwark-dev-secret";

/// `bulwark gateway`.
#[derive(clap::Args)]
pub struct GatewayArgs {
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<GatewayCommand>,
    /// A TOML configuration (listen address, cluster, access keys and their clients); when
    /// given, the other options are not used.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where to serve S3 (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// The cluster directory written by `bulwark cluster init` (or `bulwark dev`).
    #[arg(long, global = true, env = "BULWARK_CLUSTER", default_value = dev::DEFAULT_DIR)]
    pub cluster: PathBuf,
    /// The cluster client the access key acts as (or the collector runs as).
    #[arg(long, global = true, env = "BULWARK_CLIENT", default_value = "admin")]
    pub client: String,
    /// The one access key accepted.
    #[arg(long, env = "BULWARK_S3_ACCESS_KEY", default_value = DEMO_ACCESS_KEY)]
    pub access_key: String,
    /// Its secret.
    #[arg(long, env = "BULWARK_S3_SECRET_KEY", default_value = DEMO_SECRET_KEY)]
    pub secret_key: String,
    /// Largest single PUT, in bytes.
    #[arg(long, default_value_t = 5 << 30)]
    pub object_bytes_max: u64,
    /// Seconds the chunks of a replaced or deleted version stay readable.
    #[arg(long, global = true, default_value_t = 60)]
    pub chunk_grace_secs: u64,
    /// A file holding the SSE-S3 key (64 hex digits), kept in object records as key "default";
    /// without it (or `sse_s3_keys` in --config) SSE-S3 requests are refused.
    #[arg(long)]
    pub sse_s3_key_file: Option<PathBuf>,
}

/// What `bulwark gateway` does instead of serving.
#[derive(clap::Subcommand)]
pub enum GatewayCommand {
    /// Deletes the chunks no object or upload part names (left by a gateway that crashed
    /// mid-upload, or a manifest write that failed), once they are older than any body write
    /// may last; prints what it found. Run it as a client that may write.
    Collect {
        /// Chunks written less than this many seconds ago are kept: a write may still be in
        /// flight. It must exceed the longest PUT or UploadPart the gateways serve.
        #[arg(long, default_value_t = 24 * 3600)]
        min_age_secs: u64,
        /// Only count what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Serves until Ctrl-C, or runs the subcommand.
pub async fn run(args: &GatewayArgs) -> Result<()> {
    if let Some(GatewayCommand::Collect {
        min_age_secs,
        dry_run,
    }) = &args.command
    {
        return collect(args, *min_age_secs, *dry_run).await;
    }
    let config = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            let mut config = GatewayConfig::parse(&text, &path.display().to_string())?;
            config.base = path.parent().map(PathBuf::from).unwrap_or_default();
            config
        }
        None => {
            if args.secret_key == DEMO_SECRET_KEY {
                eprintln!(
                    "warning: serving with the demo credentials {DEMO_ACCESS_KEY} / {DEMO_SECRET_KEY}; use --config for real keys"
                );
            }
            let config = GatewayConfig {
                listen: args.listen,
                cluster: args.cluster.clone(),
                object_bytes_max: args.object_bytes_max,
                max_connections: 256,
                chunk_buffers: 32,
                chunk_grace_secs: args.chunk_grace_secs,
                collect_every_secs: 0,
                collect_min_age_secs: 24 * 3600,
                access_keys: vec![AccessKey {
                    access_key: args.access_key.clone(),
                    secret_key: args.secret_key.clone(),
                    client: args.client.clone(),
                }],
                sse_s3_keys: args
                    .sse_s3_key_file
                    .iter()
                    .map(|key_file| SseKey {
                        id: "default".to_owned(),
                        key_file: key_file.clone(),
                    })
                    .collect(),
                base: PathBuf::new(),
            };
            config.check("command line")?;
            config
        }
    };
    bulwark_gateway::run(config, |address| {
        // Tests and scripts read this line to learn a port chosen by the system.
        println!("S3 gateway listening on http://{address}");
        let _ = std::io::stdout().flush();
    })
    .await
}

/// `bulwark gateway collect`.
async fn collect(args: &GatewayArgs, min_age_secs: u64, dry_run: bool) -> Result<()> {
    // The gateways' own configuration, when given, says where the cluster is and how long a
    // replaced version's chunks stay readable.
    let (cluster, chunk_grace_secs) = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            let config = GatewayConfig::parse(&text, &path.display().to_string())?;
            (config.cluster, config.chunk_grace_secs)
        }
        None => (args.cluster.clone(), args.chunk_grace_secs),
    };
    if min_age_secs < 3600 {
        eprintln!(
            "warning: --min-age-secs {min_age_secs}: chunks of uploads still in flight may be deleted"
        );
    }
    let client = bulwark_client::Client::connect(&cluster, &args.client)
        .await
        .with_context(|| format!("client {:?} of {}", args.client, cluster.display()))?;
    let chunk_grace = std::time::Duration::from_secs(chunk_grace_secs);
    let engine = bulwark_gateway::engine::Engine::new(bulwark_gateway::engine::Limits {
        chunk_grace,
        ..bulwark_gateway::engine::Limits::default()
    });
    let options = bulwark_gateway::collect::Collect {
        min_age: std::time::Duration::from_secs(min_age_secs),
        // Past the grace in which a GET of a replaced version may still be reading its chunks.
        settle: chunk_grace + std::time::Duration::from_secs(1),
        dry_run,
    };
    let collected =
        bulwark_gateway::collect::collect(&engine, &std::sync::Arc::new(client), options)
            .await
            .map_err(|e| anyhow::anyhow!("collecting: {e}"))?;
    let verb = if dry_run { "would delete" } else { "deleted" };
    println!(
        "{} objects listed: {} named by an object or upload, {} not the gateway's chunks, {} younger than {min_age_secs} s, {} named by their object although not listed; {verb} {} ({} bytes)",
        collected.listed,
        collected.named,
        collected.not_chunks,
        collected.young,
        collected.named_by_origin,
        collected.deleted,
        collected.deleted_bytes
    );
    Ok(())
}
