//! `bench compare --links RATE`: every server and the client on a host of its own, each host a
//! network namespace whose one link to a shared switch is shaped to RATE in both directions with
//! tc's token bucket filter (tbf). The paper's testbed bridged its machines with a 1 Gbps switch
//! (PoWerStore §6); on loopback the same protocols are CPU-bound instead, which is a different
//! comparison.
//!
//! ```text
//!   bwk<pid>-c (client)   bwk<pid>-h0 ... bwk<pid>-h<k>   (servers)
//!        eth0 ─ tbf            eth0 ─ tbf
//!         │                     │
//!   tbf ─ c                tbf ─ h0 ...     bwk<pid>-sw: bridge br0
//! ```
//!
//! Everything is removed when the [`ShapedNetwork`] is dropped: processes still in its
//! namespaces are killed first, then the namespaces (their links go with them). A run killed too
//! hard to drop anything (SIGKILL) leaves its namespaces behind; the next `--links` run finds
//! those whose process is gone and removes them with their processes.

use crate::driver::LinkBytes;
use anyhow::{Context, Result, bail};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

/// Every namespace this module makes is named `bwk<pid>-...`, so that one run's leftovers can be
/// told from another live run's.
const PREFIX: &str = "bwk";
/// The hosts' subnet. It exists only inside the namespaces: the machine's own namespace gets no
/// address and no route, so nothing here can reach or shadow a real network.
const SUBNET: [u8; 3] = [10, 77, 0];
/// The client is host `.1`, servers `.2` on; a /24 leaves room for this many servers.
pub const SERVERS_MAX: usize = 200;
/// Ports handed out to servers start here (every host has its own address, so any port is free
/// in a fresh namespace).
const FIRST_PORT: u16 = 20_000;

/// A link rate in bits per second, written as tc writes it: `1gbit`, `100mbit`, `512kbit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate(pub u64);

impl Rate {
    /// Bytes the token bucket may send at once: 4 ms at the rate (tbf needs at least the rate
    /// over the kernel's timer frequency, at most 250 Hz here), and never less than 64 KiB, so that
    /// one segmentation-offloaded packet always fits.
    fn burst_bytes(self) -> u64 {
        (self.0 / 8 / 250).max(64 * 1024)
    }
}

impl FromStr for Rate {
    type Err = anyhow::Error;
    fn from_str(text: &str) -> Result<Rate> {
        let lower = text.trim().to_ascii_lowercase();
        let (digits, scale) = [
            ("gbit", 1_000_000_000u64),
            ("mbit", 1_000_000),
            ("kbit", 1_000),
        ]
        .iter()
        .find_map(|(unit, scale)| lower.strip_suffix(unit).map(|d| (d, *scale)))
        .with_context(|| {
            format!("link rate {text:?}: give a number with kbit, mbit or gbit (e.g. 1gbit)")
        })?;
        let amount: u64 = digits
            .trim()
            .parse()
            .with_context(|| format!("link rate {text:?}: {digits:?} is not a whole number"))?;
        let bits = amount.saturating_mul(scale);
        // tc's tbf takes 32-bit byte rates only through its 64-bit extension; stay in the range
        // every iproute2 accepts, and above what a token bucket can meter at all.
        if !(100_000..=100_000_000_000).contains(&bits) {
            bail!("link rate {text:?}: choose between 100kbit and 100gbit");
        }
        Ok(Rate(bits))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            b if b % 1_000_000_000 == 0 => write!(f, "{}gbit", b / 1_000_000_000),
            b if b % 1_000_000 == 0 => write!(f, "{}mbit", b / 1_000_000),
            b => write!(f, "{}kbit", b / 1_000),
        }
    }
}

/// Runs `ip` or `tc` with `args`; its stderr becomes the error.
fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program} (from iproute2)"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// What `--links` needs, checked before anything is made, with what to do about each.
fn preflight() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!(
            "--links makes network namespaces and shapes their links, which needs root \
             (CAP_SYS_ADMIN and CAP_NET_ADMIN); run the benchmark as root, or drop --links"
        );
    }
    for (program, what) in [("ip", "ip netns and veth"), ("tc", "the tbf shaper")] {
        if Command::new(program)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            bail!(
                "--links needs `{program}` for {what}: install iproute2 (apt-get install iproute2)"
            );
        }
    }
    Ok(())
}

/// The client's host and `servers` server hosts, each on one shaped link to a shared switch.
pub struct ShapedNetwork {
    /// `bwk<pid>`.
    name: String,
    rate: Rate,
    servers: usize,
    /// Namespaces made so far, removed in reverse on drop (also after a failed `create`).
    made: Vec<String>,
    next_port: AtomicU16,
}

impl fmt::Debug for ShapedNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} servers at {})",
            self.name, self.servers, self.rate
        )
    }
}

impl ShapedNetwork {
    /// Makes the switch, the client's host and `servers` server hosts, every link shaped to
    /// `rate` each way.
    pub fn create(servers: usize, rate: Rate) -> Result<ShapedNetwork> {
        if servers == 0 || servers > SERVERS_MAX {
            bail!("--links holds 1 to {SERVERS_MAX} servers, not {servers}");
        }
        preflight()?;
        remove_leftovers();
        let mut network = ShapedNetwork {
            name: format!("{PREFIX}{}", std::process::id()),
            rate,
            servers,
            made: Vec::new(),
            next_port: AtomicU16::new(FIRST_PORT),
        };
        let switch = network.namespace("sw");
        network.add_namespace(&switch)?;
        run(
            "ip",
            &["-n", &switch, "link", "add", "br0", "type", "bridge"],
        )?;
        run("ip", &["-n", &switch, "link", "set", "br0", "up"])?;
        for host in std::iter::once(Host::Client).chain((0..servers).map(Host::Server)) {
            network.add_host(&switch, host)?;
        }
        Ok(network)
    }

    fn namespace(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.name)
    }

    fn add_namespace(&mut self, namespace: &str) -> Result<()> {
        run("ip", &["netns", "add", namespace])?;
        self.made.push(namespace.to_string());
        Ok(())
    }

    fn add_host(&mut self, switch: &str, host: Host) -> Result<()> {
        let namespace = self.namespace(&host.suffix());
        self.add_namespace(&namespace)?;
        let port = format!("p{}", host.suffix());
        run(
            "ip",
            &[
                "link", "add", "eth0", "netns", &namespace, "type", "veth", "peer", "name", &port,
                "netns", switch,
            ],
        )?;
        run("ip", &["-n", switch, "link", "set", &port, "master", "br0"])?;
        run("ip", &["-n", switch, "link", "set", &port, "up"])?;
        run("ip", &["-n", &namespace, "link", "set", "lo", "up"])?;
        run("ip", &["-n", &namespace, "link", "set", "eth0", "up"])?;
        let address = format!("{}/24", host.ip());
        run(
            "ip",
            &["-n", &namespace, "addr", "add", &address, "dev", "eth0"],
        )?;
        // Both directions: the host's egress on its own end, its ingress on the switch's end.
        for (ns, dev) in [(namespace.as_str(), "eth0"), (switch, port.as_str())] {
            self.shape(ns, dev)?;
        }
        Ok(())
    }

    fn shape(&self, namespace: &str, dev: &str) -> Result<()> {
        let rate = self.rate.to_string();
        let burst = self.rate.burst_bytes().to_string();
        run(
            "tc",
            &[
                "-n", namespace, "qdisc", "add", "dev", dev, "root", "tbf", "rate", &rate, "burst",
                &burst, "latency", "50ms",
            ],
        )
        .context("shaping a link with tbf (is the sch_tbf kernel module available?)")?;
        Ok(())
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Server hosts (their indices are `0..servers`).
    pub fn servers(&self) -> usize {
        self.servers
    }

    /// Server `i`'s address (`i` taken modulo the hosts there are).
    pub fn server_ip(&self, i: usize) -> IpAddr {
        Host::Server(i % self.servers).ip()
    }

    /// The client's address.
    pub fn client_ip(&self) -> IpAddr {
        Host::Client.ip()
    }

    /// `count` consecutive ports no other caller was given (each host has its own address, so
    /// they are free on every host).
    pub fn ports(&self, count: u16) -> Result<u16> {
        let first = self.next_port.fetch_add(count, Ordering::Relaxed);
        if first.checked_add(count).is_none() {
            bail!("the shaped network ran out of ports");
        }
        Ok(first)
    }

    /// A command that runs `program` on server host `i`.
    pub fn command_on_server(&self, i: usize, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec"])
            .arg(self.namespace(&Host::Server(i % self.servers).suffix()))
            .arg(program);
        command
    }

    /// Moves the calling thread onto the client's host: the sockets it opens from now on, the
    /// threads it starts and the processes it spawns are there.
    pub fn enter_client(&self) -> Result<()> {
        let path = Path::new("/run/netns").join(self.namespace(&Host::Client.suffix()));
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .context("entering the client's network namespace")?;
        Ok(())
    }

    /// The bytes the client host's link has received and sent so far.
    pub fn client_link_bytes(&self) -> Result<LinkBytes> {
        let namespace = self.namespace(&Host::Client.suffix());
        let json = run(
            "ip",
            &["-n", &namespace, "-s", "-j", "link", "show", "dev", "eth0"],
        )?;
        let parsed: serde_json::Value =
            serde_json::from_str(&json).context("reading ip's link statistics")?;
        let stats = &parsed[0]["stats64"];
        let count = |way: &str| {
            stats[way]["bytes"]
                .as_f64()
                .with_context(|| format!("no {way} byte count in ip's link statistics"))
        };
        Ok(LinkBytes {
            received: count("rx")?,
            sent: count("tx")?,
        })
    }

    /// The qdisc on every link, as tc reports it (for tests and the report's notes).
    pub fn qdiscs(&self) -> Result<String> {
        let mut all = String::new();
        for namespace in &self.made {
            all.push_str(&run("tc", &["-n", namespace, "qdisc", "show"])?);
        }
        Ok(all)
    }

    /// The namespaces this network is made of.
    pub fn namespaces(&self) -> &[String] {
        &self.made
    }
}

impl Drop for ShapedNetwork {
    fn drop(&mut self) {
        for namespace in self.made.iter().rev() {
            remove_namespace(namespace);
        }
    }
}

#[derive(Clone, Copy)]
enum Host {
    Client,
    Server(usize),
}

impl Host {
    fn suffix(self) -> String {
        match self {
            Host::Client => "c".into(),
            Host::Server(i) => format!("h{i}"),
        }
    }

    fn ip(self) -> IpAddr {
        let last = match self {
            Host::Client => 1,
            Host::Server(i) => 2 + i,
        };
        debug_assert!(last < 255, "SERVERS_MAX keeps hosts inside the /24");
        IpAddr::V4(Ipv4Addr::new(
            SUBNET[0],
            SUBNET[1],
            SUBNET[2],
            u8::try_from(last).unwrap_or(254),
        ))
    }
}

/// Kills every process in `namespace` (never this one), then removes it.
fn remove_namespace(namespace: &str) {
    let me = std::process::id();
    if let Ok(pids) = run("ip", &["netns", "pids", namespace]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            if pid as u32 == me {
                continue;
            }
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
    // The kernel releases a namespace's links once its last process is gone; give the killed
    // ones a moment to be reaped before the name goes.
    for _ in 0..50 {
        if run("ip", &["netns", "pids", namespace]).is_ok_and(|p| {
            p.split_whitespace()
                .all(|pid| pid.parse::<u32>().ok() == Some(me))
        }) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if let Err(e) = run("ip", &["netns", "delete", namespace]) {
        eprintln!("could not remove network namespace {namespace}: {e:#}");
    }
}

/// Removes the namespaces of earlier `--links` runs whose process is gone.
fn remove_leftovers() {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return;
    };
    for namespace in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = namespace
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("removing {namespace}, left by an earlier --links run");
            remove_namespace(namespace);
        }
    }
}

/// Where the systems under test run: all on loopback, or each server on its own shaped host.
#[derive(Clone, Debug, Default)]
pub enum Hosts {
    #[default]
    Loopback,
    Shaped(Arc<ShapedNetwork>),
}

impl Hosts {
    /// Server `i`'s address.
    pub fn server_ip(&self, i: usize) -> IpAddr {
        match self {
            Hosts::Loopback => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Hosts::Shaped(network) => network.server_ip(i),
        }
    }

    /// A command that runs `program` as server `i`.
    pub fn command(&self, i: usize, program: &Path) -> Command {
        match self {
            Hosts::Loopback => Command::new(program),
            Hosts::Shaped(network) => network.command_on_server(i, program),
        }
    }

    /// The bytes the client's link has carried so far each way (none on loopback, where no
    /// link binds).
    pub fn client_link_bytes(&self) -> Option<LinkBytes> {
        match self {
            Hosts::Loopback => None,
            Hosts::Shaped(network) => network
                .client_link_bytes()
                .inspect_err(|e| eprintln!("  client link counters: {e:#}"))
                .ok(),
        }
    }

    /// A port for a server to listen on.
    pub fn port(&self) -> Result<u16> {
        match self {
            Hosts::Loopback => Ok(crate::targets::free_port()?),
            Hosts::Shaped(network) => network.ports(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_as_tc_writes_them() {
        assert_eq!("1gbit".parse::<Rate>().unwrap(), Rate(1_000_000_000));
        assert_eq!(" 100Mbit ".parse::<Rate>().unwrap(), Rate(100_000_000));
        assert_eq!("512kbit".parse::<Rate>().unwrap(), Rate(512_000));
        for bad in ["1g", "gbit", "-1gbit", "1.5gbit", "1kbit", "101gbit", ""] {
            assert!(bad.parse::<Rate>().is_err(), "{bad:?} accepted");
        }
        for rate in ["1gbit", "250mbit", "1500kbit"] {
            assert_eq!(rate.parse::<Rate>().unwrap().to_string(), rate);
        }
    }

    #[test]
    fn the_burst_fits_an_offloaded_packet_and_a_timer_tick() {
        assert_eq!(Rate(1_000_000_000).burst_bytes(), 500_000);
        assert_eq!(Rate(1_000_000).burst_bytes(), 64 * 1024);
    }

    #[test]
    fn hosts_are_numbered_inside_their_subnet() {
        assert_eq!(Host::Client.ip().to_string(), "10.77.0.1");
        assert_eq!(Host::Server(0).ip().to_string(), "10.77.0.2");
        assert_eq!(
            Host::Server(SERVERS_MAX - 1).ip().to_string(),
            "10.77.0.201"
        );
    }
}
