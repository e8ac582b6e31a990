//! `bulwark cluster init`: keys, certificates and `cluster.toml` for a new cluster.

use anyhow::{Context, Result, bail};
use bulwark_core::MacKey;
use bulwark_core::config::{
    ClientEntry, ClientSecrets, ClusterConfig, Fingerprint, NodeEntry, NodeSecrets, Protocol,
    WriterSecrets,
};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// `bulwark cluster init`.
#[derive(clap::Args)]
pub struct InitArgs {
    /// The directory to write (created; must not already hold a cluster unless --force).
    #[arg(long)]
    pub dir: PathBuf,
    /// Faults to tolerate per replica group; each group has 3f+1 members.
    #[arg(long, default_value_t = 1)]
    pub f: usize,
    /// Nodes in the cluster (at least 3f+1, the default); with more, keys spread over several
    /// groups and each node serves several.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// The address nodes listen on (one host, consecutive ports) ...
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// ... starting at this port; 0 picks free ports now.
    #[arg(long, default_value_t = 7100)]
    pub base_port: u16,
    /// Node addresses, one per node, instead of --host/--base-port (e.g. for containers).
    #[arg(long, value_delimiter = ',')]
    pub addresses: Vec<SocketAddr>,
    /// Metrics ports start here (one per node, on --host, or with --addresses on each node's
    /// own address); 0 picks free ports on --host, and "none" is spelled --no-metrics.
    #[arg(long, default_value_t = 9100)]
    pub metrics_base_port: u16,
    /// Serve no metrics.
    #[arg(long)]
    pub no_metrics: bool,
    /// Clients as NAME:ROLES with ROLES `rw` or `r`.
    #[arg(long, value_delimiter = ',', default_value = "admin:rw,reader:r")]
    pub clients: Vec<String>,
    /// Overwrite an existing cluster directory.
    #[arg(long)]
    pub force: bool,
    /// Faults the configuration service tolerates: it runs on 3f_cs+1 of the nodes.
    #[arg(long, default_value_t = 1)]
    pub f_cs: u32,
    /// How long an epoch lasts, in milliseconds: membership changes take effect when it ends.
    #[arg(long, default_value_t = 3_600_000)]
    pub epoch_ms: u64,
    /// How far the configuration service's clocks may disagree on when an epoch ends, in
    /// milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub stop_tolerance_ms: u64,
    /// A fixed membership: no configuration service.
    #[arg(long)]
    pub no_configuration_service: bool,
    /// How often each CS replica pings every member, in milliseconds; a member that misses 5
    /// pings in a row is evicted (once 2f_cs+1 CS replicas agree) when the epoch ends.
    #[arg(long, default_value_t = 60_000)]
    pub ping_cycle_ms: u64,
    /// How often clients confirm with the configuration service that their configuration is
    /// current, in milliseconds; a client that cannot for a further --contact-grace-ms stops.
    #[arg(long, default_value_t = 24 * 60 * 60 * 1000)]
    pub contact_ms: u64,
    /// See --contact-ms.
    #[arg(long, default_value_t = 60_000)]
    pub contact_grace_ms: u64,
    /// Give every node a trusted log (A2M), made in `node-<id>/a2m` with its key in
    /// cluster.toml; each must then be served with `bulwark a2m serve --dir node-<id>/a2m
    /// --socket node-<id>/a2m.sock` before its node starts. Single-server volumes need one.
    #[arg(long)]
    pub a2m: bool,
    /// With --a2m: anchor every node's trusted log in a counter of this TPM (the TPM software
    /// stack's address; see `bulwark a2m init --tpm`), node i's at NV index --a2m-tpm-index + i.
    /// Each must then be served with `--tpm` too.
    #[arg(long, requires = "a2m")]
    pub a2m_tpm: Option<String>,
    /// The NV index of node 0's counter with --a2m-tpm.
    #[arg(long, value_parser = crate::a2m::parse_index, default_value = "0x01500000")]
    pub a2m_tpm_index: u32,
    /// The configuration service's agreement core: pbft (3f_cs+1 replicas), a2m-pbft-ea
    /// (2f_cs+1 replicas whose every order message their trusted log attests) or a2m-pbft-e
    /// (3f_cs+1 replicas answering with their trusted request history, safe with 2f_cs faulty).
    /// Both a2m cores need --a2m.
    #[arg(long, default_value = "pbft")]
    pub cs_protocol: bulwark_core::configuration::CsProtocol,
}

impl InitArgs {
    /// `cluster init`'s defaults for a cluster on this machine: `dir`, free loopback ports for
    /// nodes and metrics. Callers change what they need with `..InitArgs::local(dir)`.
    pub fn local(dir: PathBuf) -> InitArgs {
        InitArgs {
            dir,
            f: 1,
            nodes: None,
            host: IpAddr::from([127, 0, 0, 1]),
            base_port: 0,
            addresses: Vec::new(),
            metrics_base_port: 0,
            no_metrics: false,
            clients: vec!["admin:rw".into(), "reader:r".into()],
            force: false,
            f_cs: 1,
            epoch_ms: 3_600_000,
            stop_tolerance_ms: 5_000,
            no_configuration_service: false,
            ping_cycle_ms: 60_000,
            contact_ms: 24 * 60 * 60 * 1000,
            contact_grace_ms: 60_000,
            a2m: false,
            a2m_tpm: None,
            a2m_tpm_index: bulwark_a2m::tpm::INDEX_FIRST,
            cs_protocol: bulwark_core::configuration::CsProtocol::Pbft,
        }
    }
}

/// Where `cluster init --a2m` puts a node's trusted log, within the node's directory.
pub const A2M_DIR: &str = "a2m";
/// The socket `cluster init --a2m` names in a node's `node.toml`, within the node's directory.
pub const A2M_SOCKET: &str = "a2m.sock";

/// Makes a node's trusted log in `node_dir/a2m` and returns its public key: anchored beside it,
/// or in the counter at `tpm`'s index.
fn trusted_log(node_dir: &Path, tpm: Option<(&str, u32)>) -> Result<[u8; 32]> {
    let dir = node_dir.join(A2M_DIR);
    let anchor: Box<dyn bulwark_a2m::Anchor> = match tpm {
        Some((tcti, index)) => {
            Box::new(bulwark_a2m::TpmAnchor::new(tcti, index).map_err(anyhow::Error::msg)?)
        }
        None => {
            Box::new(bulwark_a2m::FileAnchor::beside(&dir).context("the trusted log's anchor")?)
        }
    };
    let component = bulwark_a2m::Component::create(&dir, anchor, bulwark_a2m::Limits::default())
        .with_context(|| format!("making the trusted log in {}", dir.display()))?;
    Ok(bulwark_a2m::A2m::public_key(&component).to_bytes())
}

/// `bulwark cluster init`, with the protocol choice.
#[derive(clap::Args)]
pub struct InitCommand {
    /// Everything but the protocol.
    #[command(flatten)]
    pub args: InitArgs,
    /// The protocol of the default volume: powerstore (Byzantine), abd (the crash-tolerant
    /// baseline, on 2f+1 of each group) or phalanx (the signature-based Byzantine baseline).
    /// Every cluster serves all three; named volumes pick their own (`bulwark volume create`).
    #[arg(long, default_value = "powerstore")]
    pub protocol: Protocol,
}

/// `count` distinct free ports on `host`. Every probe stays bound until all are chosen: a port
/// probed and released at once can be handed out again by the next probe, which once gave a node
/// the same port for its clients and its metrics.
///
/// Ports come from below the kernel's ephemeral range where it can: a port the kernel handed to a
/// probe is one it may hand to any outgoing connection (a client dialling a node that is not up
/// yet) before the node that was given it binds it, which once stopped a node of a test cluster
/// with "address already in use".
pub(crate) fn free_ports(host: IpAddr, count: usize) -> Result<std::vec::IntoIter<u16>> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let below = PORTS_BELOW_EPHEMERAL_MIN..ephemeral_low;
    let mut probes = Vec::with_capacity(count);
    // Random starting points, so concurrent inits rarely try the same ports; a taken port is
    // simply skipped. Bounded: a crowded range falls back to the kernel's choice.
    for _ in 0..count * 20 {
        if probes.len() == count || below.is_empty() {
            break;
        }
        let port = rand::random_range(below.clone());
        if let Ok(probe) = std::net::TcpListener::bind((host, port)) {
            probes.push(probe);
        }
    }
    while probes.len() < count {
        probes.push(std::net::TcpListener::bind((host, 0)).context("finding free ports")?);
    }
    let ports = probes
        .iter()
        .map(|probe| Ok(probe.local_addr()?.port()))
        .collect::<Result<Vec<u16>>>()?;
    Ok(ports.into_iter())
}

/// The lowest port `free_ports` picks itself: above the well-known and most registered services.
const PORTS_BELOW_EPHEMERAL_MIN: u16 = 20_000;

pub(crate) fn write_private(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

pub(crate) fn write_identity(dir: &Path, name: &str) -> Result<Fingerprint> {
    let identity = bulwark_transport::Identity::generate(name)?;
    let (cert, key) = identity.to_pem();
    std::fs::write(dir.join("tls.crt"), cert)?;
    write_private(&dir.join("tls.key"), &key)?;
    Ok(identity.fingerprint())
}

/// Writes a PoWerStore cluster directory; returns the configuration.
pub fn run(args: &InitArgs) -> Result<ClusterConfig> {
    run_protocol(args, Protocol::PowerStore)
}

/// Writes a cluster directory for `protocol`; returns the configuration.
pub fn run_protocol(args: &InitArgs, protocol: Protocol) -> Result<ClusterConfig> {
    if args.f == 0 {
        bail!("--f must be at least 1");
    }
    if args.cs_protocol.needs_trusted_logs() && !args.a2m {
        bail!(
            "--cs-protocol {} needs --a2m: every node's trusted log attests its part",
            args.cs_protocol.name()
        );
    }
    let group = 3 * args.f + 1;
    let n = args.nodes.unwrap_or(group);
    if n < group {
        bail!(
            "--nodes {n} is fewer than one replica group: f = {} needs {group}",
            args.f
        );
    }
    if args.dir.join("cluster.toml").exists() && !args.force {
        bail!(
            "{} already holds a cluster (use --force to overwrite)",
            args.dir.display()
        );
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let picked_nodes = args.addresses.is_empty() && args.base_port == 0;
    let picked_metrics = !args.no_metrics && args.metrics_base_port == 0;
    let mut free = free_ports(
        args.host,
        n * (usize::from(picked_nodes) + usize::from(picked_metrics)),
    )?;
    let mut next_free = move || free.next().context("finding free ports");
    let addresses: Vec<SocketAddr> = if args.addresses.is_empty() {
        (0..n)
            .map(|i| {
                let port = if args.base_port == 0 {
                    next_free()?
                } else {
                    args.base_port + i as u16
                };
                Ok(SocketAddr::new(args.host, port))
            })
            .collect::<Result<_>>()?
    } else if args.addresses.len() == n {
        args.addresses.clone()
    } else {
        bail!(
            "--addresses lists {} nodes; the cluster has {n}",
            args.addresses.len()
        );
    };
    let mut nodes = Vec::new();
    for (i, address) in addresses.iter().enumerate() {
        let dir = args.dir.join(format!("node-{i}"));
        std::fs::create_dir_all(&dir)?;
        let signing_seed: [u8; 32] = rand::random();
        let a2m_key = if args.a2m {
            let tpm = match &args.a2m_tpm {
                Some(tcti) => {
                    let index = u32::try_from(i)
                        .ok()
                        .and_then(|i| args.a2m_tpm_index.checked_add(i))
                        .context("too many nodes for the TPM's index range")?;
                    Some((tcti.as_str(), index))
                }
                None => None,
            };
            Some(trusted_log(&dir, tpm)?)
        } else {
            None
        };
        let secrets = NodeSecrets {
            id: i as u32,
            signing_key: signing_seed,
            address: None,
            a2m_socket: a2m_key.map(|_| PathBuf::from(A2M_SOCKET)),
        };
        write_private(&dir.join("node.toml"), &toml_text(&secrets)?)?;
        let fingerprint = write_identity(&dir, &format!("bulwark-node-{i}"))?;
        let metrics = if args.no_metrics {
            None
        } else if args.metrics_base_port == 0 {
            Some(SocketAddr::new(args.host, next_free()?))
        } else {
            // Nodes given addresses of their own (hosts, containers) serve metrics there too.
            let host = if args.addresses.is_empty() {
                args.host
            } else {
                address.ip()
            };
            Some(SocketAddr::new(host, args.metrics_base_port + i as u16))
        };
        nodes.push(NodeEntry {
            id: i as u32,
            address: *address,
            metrics,
            fingerprint,
            signing_key: bulwark_core::sign::SecretKey::from_seed(&signing_seed)
                .public_key()
                .to_bytes(),
            a2m_key,
        });
    }
    let timestamp_key = MacKey(rand::random());
    // The trusted authority (Rosebud §3.1) signs ADD and REVOKE; the administrator holds it: the
    // client named `admin`, or else the first writer.
    let authority_seed: [u8; 32] = rand::random();
    let administrator = args
        .clients
        .iter()
        .map(|spec| spec.split_once(':').unwrap_or((spec.as_str(), "rw")))
        .find(|(name, _)| *name == "admin")
        .or_else(|| {
            args.clients
                .iter()
                .map(|spec| spec.split_once(':').unwrap_or((spec.as_str(), "rw")))
                .find(|(_, roles)| roles.contains('w'))
        })
        .map(|(name, _)| name.to_string());
    let mut clients = Vec::new();
    for (id, spec) in args.clients.iter().enumerate() {
        let (name, roles) = spec.split_once(':').unwrap_or((spec.as_str(), "rw"));
        let (write, read) = match roles {
            "rw" | "wr" => (true, true),
            "r" => (false, true),
            "w" => (true, false),
            other => bail!("client {name:?}: roles {other:?} must be rw, r or w"),
        };
        let dir = args.dir.join(format!("client-{name}"));
        std::fs::create_dir_all(&dir)?;
        let writer = write.then(|| WriterSecrets {
            timestamp_key: timestamp_key.clone(),
        });
        // Writers sign their Phalanx versions, nodes and readers checking them against the public
        // half in `cluster.toml`, and agree the MAC key of their PoWerStore vectors with each
        // node from it. Any cluster may hold either kind of volume, so every writer has one.
        let signing_secret: Option<[u8; 32]> = write.then(rand::random);
        let with_cs = !args.no_configuration_service;
        let secrets = ClientSecrets {
            name: name.to_string(),
            writer,
            signing_key: signing_secret,
            authority_key: (with_cs && administrator.as_deref() == Some(name))
                .then_some(authority_seed),
        };
        write_private(&dir.join("client.toml"), &toml_text(&secrets)?)?;
        let fingerprint = write_identity(&dir, &format!("bulwark-client-{name}"))?;
        clients.push(ClientEntry {
            id: id as u32,
            name: name.to_string(),
            fingerprint,
            write,
            read,
            signing_key: signing_secret
                .as_ref()
                .map(bulwark_protocol::phalanx::public_key),
        });
    }
    let configuration_service =
        (!args.no_configuration_service).then(|| bulwark_core::config::ConfigurationService {
            f_cs: args.f_cs,
            authority: bulwark_core::sign::SecretKey::from_seed(&authority_seed)
                .public_key()
                .to_bytes(),
            epoch_ms: args.epoch_ms,
            stop_tolerance_ms: args.stop_tolerance_ms,
            genesis_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64),
            ping_cycle_ms: args.ping_cycle_ms,
            evict_after: 5,
            agree_after: 3,
            contact_ms: args.contact_ms,
            contact_grace_ms: args.contact_grace_ms,
            protocol: args.cs_protocol,
        });
    let config = ClusterConfig {
        protocol,
        f: args.f,
        epoch: 0,
        nodes,
        clients,
        configuration_service,
    };
    let text = config.to_toml();
    // Validate what we wrote exactly as a node will read it.
    ClusterConfig::parse(&text, "cluster.toml")?;
    std::fs::write(args.dir.join("cluster.toml"), text)?;
    Ok(config)
}

pub(crate) fn toml_text<T: serde::Serialize>(value: &T) -> Result<String> {
    toml::to_string_pretty(value).context("serialising secrets")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_are_distinct_across_nodes_and_metrics() {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let config = run(&InitArgs {
                f: 3,
                clients: vec!["admin:rw".into()],
                ..InitArgs::local(dir.path().to_path_buf())
            })
            .unwrap();
            let mut ports: Vec<u16> = config
                .nodes
                .iter()
                .flat_map(|node| [Some(node.address.port()), node.metrics.map(|m| m.port())])
                .flatten()
                .collect();
            assert_eq!(ports.len(), 20);
            ports.sort_unstable();
            ports.dedup();
            assert_eq!(ports.len(), 20, "a port was picked twice");
        }
    }
}
