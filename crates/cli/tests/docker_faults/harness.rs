//! Docker plumbing for the fault tests: the engine check, both images, and
//! a 4-node cluster of containers laid out exactly as `deploy/compose.yaml` lays it out (one
//! container, one named volume and only its own secrets per node, ports published on 127.0.0.1
//! only), under names unique to this run and removed when the [`DockerCluster`] is dropped.
//!
//! Every command is bounded in time. Traffic goes only from this host to 127.0.0.1 and from there
//! to this run's own containers on this run's own network.

use crate::common::Recorder;
use bulwark_client::Client;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const NODE_IMAGE: &str = "bulwark:local";
pub const BYZANTINE_IMAGE: &str = "bulwark-byzantine:local";
/// Every container, network and volume this suite creates carries this label.
const LABEL: &str = "org.bulwark.test=docker_faults";
const DOCKER_TIMEOUT: Duration = Duration::from_secs(120);
const UP_TIMEOUT: Duration = Duration::from_secs(40);
/// Inside every container: the node port and the metrics port.
const NODE_PORT: u16 = 7100;
const METRICS_PORT: u16 = 9100;
/// Nodes a scenario may add with [`DockerCluster::join_node`].
const JOINERS_MAX: usize = 2;

/// What a finished command said.
pub struct Output {
    pub ok: bool,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Output {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn reader(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = from.read_to_end(&mut bytes);
        bytes
    })
}

/// Runs `command` to completion, killing it after `limit`.
fn run_bounded(mut command: Command, limit: Duration) -> Result<Output, String> {
    let description = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{description}: {e}"))?;
    let stdout = reader(child.stdout.take().expect("piped"));
    let stderr = reader(child.stderr.take().expect("piped"));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{description}: no answer within {limit:?}"));
            }
            Err(e) => return Err(format!("{description}: {e}")),
        }
    };
    Ok(Output {
        ok: status.success(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned(),
    })
}

/// Runs `docker ARGS` within [`DOCKER_TIMEOUT`].
pub fn docker(args: &[&str]) -> Result<Output, String> {
    let mut command = Command::new("docker");
    command.args(args);
    run_bounded(command, DOCKER_TIMEOUT)
}

/// Runs `docker ARGS` and panics, with what docker said, unless it succeeds.
pub fn docker_ok(args: &[&str]) -> String {
    match docker(args) {
        Ok(output) if output.ok => output.text(),
        Ok(output) => panic!("docker {}: {}", args.join(" "), output.stderr.trim()),
        Err(error) => panic!("{error}"),
    }
}

/// [`docker_ok`] off the async runtime.
pub async fn docker_async(args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_ok(&args)
    })
    .await
    .expect("docker task")
}

/// The engine's version, or why there is none to use.
fn engine() -> Result<String, String> {
    let output = docker(&["version", "--format", "{{.Server.Version}}"])?;
    let version = output.text().trim().to_string();
    if output.ok && !version.is_empty() {
        Ok(version)
    } else {
        Err(output.stderr.trim().to_string())
    }
}

/// Whether this run has a Docker engine; prints the skip line once when it has not. With
/// `BULWARK_REQUIRE_DOCKER=1` a missing engine is a failure instead.
pub fn have_engine() -> bool {
    static ENGINE: OnceLock<Result<String, String>> = OnceLock::new();
    match ENGINE.get_or_init(engine) {
        Ok(_) => true,
        Err(why) => {
            if std::env::var("BULWARK_REQUIRE_DOCKER").is_ok_and(|v| v == "1") {
                panic!("BULWARK_REQUIRE_DOCKER=1 but there is no docker engine: {why}");
            }
            println!("docker_faults: SKIPPED: no docker engine ({why})");
            false
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace().join(dir),
        None => workspace().join("target"),
    }
}

/// The shared libraries the dynamic loader maps for `binary`, by `ldd`: none for a static one.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let mut command = Command::new("ldd");
    command.arg(binary);
    let output = run_bounded(command, DOCKER_TIMEOUT)?;
    let text = output.text();
    if !output.ok {
        return if text.contains("not a dynamic executable")
            || output.stderr.contains("not a dynamic executable")
        {
            Ok(Vec::new())
        } else {
            Err(format!(
                "ldd {}: {}",
                binary.display(),
                output.stderr.trim()
            ))
        };
    }
    let mut libraries = Vec::new();
    for line in text.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux-x86-64.so.2 (0x...)`;
        // the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, resolved)) => resolved.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(path) if path.starts_with('/') => libraries.push(PathBuf::from(path)),
            Some(path) if line.contains("not found") => {
                return Err(format!("{}: {path} not found", binary.display()));
            }
            _ => {}
        }
    }
    Ok(libraries)
}

/// Builds `image` from `dockerfile` with a context that is the image's whole file tree: `binary`
/// at the root and each shared library it loads at its own path. Unless the image was already
/// built from these exact bytes. Returns the paths it put in the image.
///
/// The binary is this test's own build of it (`CARGO_BIN_EXE_*`, the test profile), not the
/// static release build of `deploy/up.sh`: that one would compile the whole workspace a second
/// time in every CI run. Same code, same Dockerfile; only the linking differs.
fn build_image(binary: &Path, image: &str, dockerfile: &str) -> Result<Vec<String>, String> {
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: no file name", binary.display()))?;
    let mut files = vec![(name.to_string(), binary.to_path_buf())];
    for library in shared_libraries(binary)? {
        let inside = library
            .to_string_lossy()
            .trim_start_matches('/')
            .to_string();
        files.push((inside, library));
    }
    let mut hasher = blake3::Hasher::new();
    let mut contents = Vec::with_capacity(files.len());
    for (inside, from) in &files {
        let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
        hasher.update(inside.as_bytes());
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
        contents.push(bytes);
    }
    let inside: Vec<String> = files.iter().map(|(inside, _)| inside.clone()).collect();
    let hash = hasher.finalize().to_hex().to_string();
    let label = format!("org.bulwark.binary={hash}");
    let current = docker(&[
        "image",
        "inspect",
        "--format",
        "{{index .Config.Labels \"org.bulwark.binary\"}}",
        image,
    ])?;
    if current.ok && current.text().trim() == hash {
        return Ok(inside);
    }
    let previous = docker(&["image", "inspect", "--format", "{{.Id}}", image])?;
    let context = target_dir().join("docker").join(name);
    let _ = std::fs::remove_dir_all(&context);
    for ((inside, _), bytes) in files.iter().zip(&contents) {
        let copy = context.join(inside);
        if let Some(parent) = copy.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&copy, bytes).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    let dockerfile = workspace().join(dockerfile);
    let output = docker(&[
        "build",
        "--quiet",
        "--tag",
        image,
        "--label",
        &label,
        "--file",
        &dockerfile.to_string_lossy(),
        &context.to_string_lossy(),
    ])?;
    if !output.ok {
        return Err(format!("docker build {image}: {}", output.stderr.trim()));
    }
    // The image this one replaced would linger untagged; a container still using it keeps it.
    if previous.ok {
        let _ = docker(&["image", "rm", previous.text().trim()]);
    }
    Ok(inside)
}

/// Builds both images once per process; returns the files of the node image.
pub fn images() -> &'static [String] {
    static BUILT: OnceLock<Result<Vec<String>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let node = build_image(
            Path::new(env!("CARGO_BIN_EXE_bulwark")),
            NODE_IMAGE,
            "deploy/Dockerfile",
        )?;
        build_image(
            Path::new(env!("CARGO_BIN_EXE_bulwark-byzantine")),
            BYZANTINE_IMAGE,
            "deploy/Dockerfile.byzantine",
        )?;
        Ok(node)
    });
    match built {
        Ok(files) => files,
        Err(error) => panic!("cannot build the images: {error}"),
    }
}

/// One scenario at a time on this machine, whatever runs the tests: the scenarios measure
/// timing-sensitive behaviour on 2 cores. Held for the scenario's whole life.
fn exclusive() -> std::fs::File {
    let path = std::env::temp_dir().join("bulwark-docker-faults.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("lock file");
    file.lock().expect("lock");
    file
}

/// Removes what an earlier run left behind when it was killed before its clean-up ran. Only
/// runs under the lock, so nothing found belongs to a live run.
fn remove_leftovers() {
    let filter = format!("label={LABEL}");
    for (list, remove) in [
        (vec!["ps", "-aq", "--filter", &filter], vec!["rm", "-f"]),
        (
            vec!["network", "ls", "-q", "--filter", &filter],
            vec!["network", "rm"],
        ),
        (
            vec!["volume", "ls", "-q", "--filter", &filter],
            vec!["volume", "rm", "-f"],
        ),
    ] {
        let Ok(found) = docker(&list) else { continue };
        let ids: Vec<String> = found.text().split_whitespace().map(String::from).collect();
        if ids.is_empty() {
            continue;
        }
        println!(
            "docker_faults: removing {} left over by an earlier run",
            ids.len()
        );
        let mut args = remove.clone();
        args.extend(ids.iter().map(String::as_str));
        let _ = docker(&args);
    }
}

/// A 4-node cluster of containers.
pub struct DockerCluster {
    pub scenario: &'static str,
    pub dir: tempfile::TempDir,
    pub n: usize,
    pub recorder: Recorder,
    /// What was done to the cluster, with times since the scenario started.
    pub faults: Vec<String>,
    pub addresses: Vec<SocketAddr>,
    pub metrics: Vec<SocketAddr>,
    prefix: String,
    /// The network's /24: containers have fixed addresses in it, so nodes dial each other by IP
    /// (the production image's static binary resolves no names) across restarts and
    /// reconnections.
    subnet: [u8; 3],
    /// Nodes that also share a second network, its /24: cut off the first, they still reach
    /// each other (a split of the cluster in two, [`DockerCluster::split`]).
    side: Option<(Vec<usize>, [u8; 3])>,
    grace_ms: u64,
    _exclusive: std::fs::File,
}

/// Creates the scenario's network on a free private /24; returns its first three octets.
fn create_network(name: &str) -> [u8; 3] {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut last = String::new();
    for attempt in 0..8u64 {
        let mix = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(attempt * 7919);
        let subnet = [10, 200 + (mix % 50) as u8, ((mix >> 8) % 250) as u8];
        let cidr = format!("{}.{}.{}.0/24", subnet[0], subnet[1], subnet[2]);
        match docker(&[
            "network", "create", "--label", LABEL, "--subnet", &cidr, name,
        ]) {
            Ok(output) if output.ok => return subnet,
            Ok(output) => last = output.stderr,
            Err(error) => last = error,
        }
    }
    panic!("no free subnet for {name}: {last}");
}

impl DockerCluster {
    /// Builds what is missing and starts the cluster, node `id` with `behaviour` for each entry
    /// of `byzantine`. `None` when there is no engine (the skip line is printed).
    pub async fn start(
        scenario: &'static str,
        byzantine: &[(usize, &str)],
    ) -> Option<DockerCluster> {
        Self::start_with_epochs(scenario, byzantine, 3_600_000).await
    }

    /// [`DockerCluster::start`] with configuration-service epochs of `epoch_ms`.
    pub async fn start_with_epochs(
        scenario: &'static str,
        byzantine: &[(usize, &str)],
        epoch_ms: u64,
    ) -> Option<DockerCluster> {
        Self::start_configured(scenario, byzantine, epoch_ms, 60_000).await
    }

    /// [`DockerCluster::start_with_epochs`] with the CS replicas pinging every member each
    /// `ping_cycle_ms` (a silent one is evicted after 5 missed pings).
    pub async fn start_configured(
        scenario: &'static str,
        byzantine: &[(usize, &str)],
        epoch_ms: u64,
        ping_cycle_ms: u64,
    ) -> Option<DockerCluster> {
        Self::launch(scenario, byzantine, epoch_ms, ping_cycle_ms, &[]).await
    }

    /// A cluster that [`DockerCluster::split`] can cut in two: nodes `side` share a second
    /// network, and reach each other over it.
    pub async fn start_two_sided(scenario: &'static str, side: &[usize]) -> Option<DockerCluster> {
        Self::launch(scenario, &[], 3_600_000, 60_000, side).await
    }

    async fn launch(
        scenario: &'static str,
        byzantine: &[(usize, &str)],
        epoch_ms: u64,
        ping_cycle_ms: u64,
        side: &[usize],
    ) -> Option<DockerCluster> {
        if !have_engine() {
            return None;
        }
        let exclusive = exclusive();
        remove_leftovers();
        tokio::task::spawn_blocking(images).await.expect("build");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = bulwark_cli::cluster_init::run(&bulwark_cli::cluster_init::InitArgs {
            clients: vec!["admin:rw".into(), "writer2:rw".into(), "reader:r".into()],
            epoch_ms,
            stop_tolerance_ms: 1_000,
            ping_cycle_ms,
            ..bulwark_cli::cluster_init::InitArgs::local(dir.path().to_path_buf())
        })
        .expect("cluster init");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let prefix = format!("bwft-{}-{nanos:x}-{scenario}", std::process::id());
        let mut cluster = DockerCluster {
            scenario,
            dir,
            n: config.n(),
            recorder: Recorder::default(),
            faults: Vec::new(),
            addresses: config.nodes.iter().map(|n| n.address).collect(),
            metrics: config
                .nodes
                .iter()
                .map(|n| n.metrics.expect("metrics address"))
                .collect(),
            prefix,
            subnet: [0, 0, 0],
            side: None,
            grace_ms: 1_000,
            _exclusive: exclusive,
        };
        cluster.subnet = create_network(&cluster.network());
        if !side.is_empty() {
            cluster.side = Some((side.to_vec(), create_network(&cluster.side_network())));
        }
        for id in 0..cluster.n {
            docker_ok(&["volume", "create", "--label", LABEL, &cluster.volume(id)]);
        }
        for id in 0..cluster.n {
            let behaviour = byzantine.iter().find(|(b, _)| *b == id).map(|(_, b)| *b);
            cluster.run_container(id, behaviour).await;
        }
        cluster.wait_up(&(0..cluster.n).collect::<Vec<_>>()).await;
        println!(
            "docker_faults[{scenario}]: 4 containers up on network {}",
            cluster.network()
        );
        Some(cluster)
    }

    fn network(&self) -> String {
        format!("{}-net", self.prefix)
    }

    fn side_network(&self) -> String {
        format!("{}-side", self.prefix)
    }

    /// Node `id`'s address on the side network, if it is on it.
    fn side_ip(&self, id: usize) -> Option<String> {
        let (members, [a, b, c]) = self.side.as_ref()?;
        members
            .contains(&id)
            .then(|| format!("{a}.{b}.{c}.{}", 10 + id))
    }

    /// Where node `id` dials `peer`: on the side network when both are on it.
    fn peer_ip(&self, id: usize, peer: usize) -> String {
        match (self.side_ip(id), self.side_ip(peer)) {
            (Some(_), Some(theirs)) => theirs,
            _ => self.ip(peer),
        }
    }

    /// Cuts the cluster in two: the side's nodes leave the main network, so they reach each
    /// other and not the rest; their published ports move with them to the side network, so
    /// the host still reaches every node.
    pub async fn split(&mut self) {
        let members = self.side.as_ref().expect("a two-sided cluster").0.clone();
        let network = self.network();
        for id in &members {
            self.on(&["network", "disconnect", &network], *id).await;
        }
        self.fault(format!("split off nodes {members:?}"));
    }

    /// Joins the two sides again.
    pub async fn heal(&mut self) {
        let members = self.side.as_ref().expect("a two-sided cluster").0.clone();
        let network = self.network();
        for id in &members {
            let ip = self.ip(*id);
            self.on(&["network", "connect", "--ip", &ip, &network], *id)
                .await;
        }
        self.fault(format!("healed the split of nodes {members:?}"));
    }

    fn volume(&self, id: usize) -> String {
        format!("{}-data{id}", self.prefix)
    }

    /// Node `id`'s address on the scenario's network.
    fn ip(&self, id: usize) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}.{}", 10 + id)
    }

    pub fn container(&self, id: usize) -> String {
        format!("{}-node{id}", self.prefix)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn seconds(&self) -> f64 {
        self.recorder.now() as f64 / 1e6
    }

    /// Notes something done to the cluster, with its time.
    pub fn fault(&mut self, what: impl std::fmt::Display) {
        let line = format!("{what} at {:.1}s", self.seconds());
        self.faults.push(line);
    }

    /// `docker run` of node `id`: the production image, or the test image with `behaviour`.
    async fn run_container(&self, id: usize, behaviour: Option<&str>) {
        let dir = self.path().display().to_string();
        let mut args: Vec<String> = [
            "run",
            "--detach",
            "--init",
            "--name",
            &self.container(id),
            "--label",
            LABEL,
            "--network",
            &self.network(),
            "--ip",
            &self.ip(id),
            "--publish",
            &format!("127.0.0.1:{}:{NODE_PORT}", self.addresses[id].port()),
            "--publish",
            &format!("127.0.0.1:{}:{METRICS_PORT}", self.metrics[id].port()),
            "--volume",
            &format!("{}:/data", self.volume(id)),
            "--volume",
            &format!("{dir}/cluster.toml:/cluster/cluster.toml:ro"),
            "--volume",
            &format!("{dir}/node-{id}:/cluster/node-{id}:ro"),
            "--env",
            "BULWARK_LOG=info",
            "--env",
            "NO_COLOR=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match behaviour {
            Some(behaviour) => {
                args.push(BYZANTINE_IMAGE.into());
                args.extend(["--behaviour".into(), behaviour.into()]);
            }
            None => args.push(NODE_IMAGE.into()),
        }
        args.extend(
            [
                "node",
                "--cluster",
                "/cluster",
                "--id",
                &id.to_string(),
                "--listen",
                &format!("0.0.0.0:{NODE_PORT}"),
                "--metrics",
                &format!("0.0.0.0:{METRICS_PORT}"),
                "--data",
                "/data",
                "--grace-ms",
                &self.grace_ms.to_string(),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        // Nodes reach each other at their fixed addresses on the scenario's network, including
        // nodes that join later: ids are given out in order, so theirs are known in advance.
        for peer in 0..self.n + JOINERS_MAX {
            args.push("--peer".into());
            args.push(format!("{peer}={}:{NODE_PORT}", self.peer_ip(id, peer)));
        }
        docker_async(args).await;
        if let Some(ip) = self.side_ip(id) {
            let network = self.side_network();
            self.on(&["network", "connect", "--ip", &ip, &network], id)
                .await;
        }
    }

    async fn on(&self, verb: &[&str], id: usize) {
        let mut args: Vec<String> = verb.iter().map(|s| s.to_string()).collect();
        args.push(self.container(id));
        docker_async(args).await;
    }

    /// SIGKILL to the container: the node gets no chance to flush or close anything.
    pub async fn kill(&mut self, id: usize) {
        self.on(&["kill", "--signal", "KILL"], id).await;
        self.fault(format!("SIGKILL node{id}"));
    }

    /// `docker stop`: SIGTERM (through docker-init), the node closes its store and exits.
    pub async fn stop(&mut self, id: usize) {
        self.on(&["stop", "--time", "10"], id).await;
        self.fault(format!("stop node{id}"));
    }

    pub async fn start_node(&mut self, id: usize) {
        self.on(&["start"], id).await;
        self.fault(format!("start node{id}"));
    }

    /// Cuts node `id` off this run's network; its published ports go with it.
    pub async fn disconnect(&mut self, id: usize) {
        let network = self.network();
        self.on(&["network", "disconnect", &network], id).await;
        self.fault(format!("disconnect node{id}"));
    }

    pub async fn connect(&mut self, id: usize) {
        let network = self.network();
        let ip = self.ip(id);
        self.on(&["network", "connect", "--ip", &ip, &network], id)
            .await;
        self.fault(format!("reconnect node{id}"));
    }

    /// Brings a new node in with `bulwark node join`'s own code, run here as the administrator
    /// (keys made, ADD ordered, its epoch awaited, `node-<id>/` written), then starts its
    /// container; returns its id.
    pub async fn join_node(&mut self) -> bulwark_core::NodeId {
        assert!(self.n < 4 + JOINERS_MAX, "room for {JOINERS_MAX} joiners");
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|probe| probe.local_addr())
                .expect("a free port")
        };
        let (address, metrics) = (free(), free());
        let args = bulwark_cli::ClientArgs {
            cluster: self.path().to_path_buf(),
            client: "admin".into(),
            timeout: 60,
            volume: None,
        };
        let node = bulwark_cli::configure::join(address, None, None, None, &args)
            .await
            .expect("node join");
        let id = node.id.expect("the id it was certified as") as usize;
        assert_eq!(id, self.n, "ids are given out in order");
        self.addresses.push(address);
        self.metrics.push(metrics);
        self.n += 1;
        docker_ok(&["volume", "create", "--label", LABEL, &self.volume(id)]);
        self.run_container(id, None).await;
        self.fault(format!("node{id} joined"));
        bulwark_core::NodeId(id as u32)
    }

    /// Replaces node `id`'s container, keeping its volume: honest, or from the test image.
    pub async fn replace(&mut self, id: usize, behaviour: Option<&str>) {
        self.on(&["rm", "--force"], id).await;
        self.run_container(id, behaviour).await;
        self.fault(format!(
            "node{id} replaced ({})",
            behaviour.map_or("honest".to_string(), |b| format!("test image, {b}"))
        ));
    }

    /// The image node `id`'s container runs.
    pub async fn image_of(&self, id: usize) -> String {
        let args = vec![
            "inspect".to_string(),
            "--format".into(),
            "{{.Config.Image}}".into(),
            self.container(id),
        ];
        docker_async(args).await.trim().to_string()
    }

    /// Everything node `id` logged.
    pub fn logs(&self, id: usize) -> String {
        match docker(&["logs", &self.container(id)]) {
            Ok(output) => format!("{}{}", output.text(), output.stderr),
            Err(error) => error,
        }
    }

    /// Waits until node `id`'s container has exited; its exit code, or `None` within `limit`.
    pub async fn wait_exit(&self, id: usize, limit: Duration) -> Option<i64> {
        let started = Instant::now();
        while started.elapsed() < limit {
            let args = vec![
                "inspect".to_string(),
                "--format".into(),
                "{{.State.Running}} {{.State.ExitCode}}".into(),
                self.container(id),
            ];
            let state = docker_async(args).await;
            let mut words = state.split_whitespace();
            if words.next() == Some("false") {
                return words.next().and_then(|c| c.parse().ok());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// Copies a file out of node `id`'s container (running or not).
    pub async fn copy_out(&self, id: usize, inside: &str, to: &Path) {
        let args = vec![
            "cp".to_string(),
            format!("{}:{inside}", self.container(id)),
            to.display().to_string(),
        ];
        docker_async(args).await;
    }

    /// Copies a file into node `id`'s container (running or not), replacing what is there.
    pub async fn copy_in(&self, id: usize, from: &Path, inside: &str) {
        let args = vec![
            "cp".to_string(),
            from.display().to_string(),
            format!("{}:{inside}", self.container(id)),
        ];
        docker_async(args).await;
    }

    /// Node `id`'s Prometheus text, fetched through its published metrics port.
    pub async fn metrics_text(&self, id: usize) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = self.metrics[id];
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(address).await?;
            stream
                .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut body = Vec::new();
            stream.take(16 << 20).read_to_end(&mut body).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&body).into_owned())
        };
        match tokio::time::timeout(Duration::from_secs(10), fetch).await {
            Ok(Ok(text)) => text,
            Ok(Err(error)) => panic!("metrics of node{id} at {address}: {error}"),
            Err(_) => panic!("metrics of node{id} at {address}: no answer"),
        }
    }

    /// A client of this cluster whose operations give up after `deadline`.
    pub async fn client(&self, name: &str, deadline: Duration) -> Client {
        let mut client = Client::connect(self.path(), name)
            .await
            .expect("client connects");
        client.deadline = deadline;
        client
    }

    /// Waits until the given nodes answer status through their published ports.
    pub async fn wait_up(&self, ids: &[usize]) {
        let client = self.client("admin", Duration::from_secs(3)).await;
        let started = Instant::now();
        loop {
            let statuses = client.status().await;
            let up = |id: &usize| {
                statuses
                    .iter()
                    .any(|(node, _, status)| node.0 as usize == *id && status.is_ok())
            };
            if ids.iter().all(up) {
                return;
            }
            if started.elapsed() > UP_TIMEOUT {
                for id in ids {
                    eprintln!("--- node{id} log ---\n{}", self.logs(*id));
                }
                panic!("nodes {ids:?} did not come up within {UP_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for id in 0..self.n {
                let logs = self.logs(id);
                let tail: Vec<&str> = logs.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                eprintln!("--- node{id} log (last lines) ---\n{}", tail.join("\n"));
            }
        }
        let containers: Vec<String> = (0..self.n).map(|id| self.container(id)).collect();
        let volumes: Vec<String> = (0..self.n).map(|id| self.volume(id)).collect();
        let mut failed = Vec::new();
        let mut rm = vec!["rm", "--force", "--volumes"];
        rm.extend(containers.iter().map(String::as_str));
        let network = self.network();
        let mut networks = vec!["network", "rm", &network];
        let side = self.side_network();
        if self.side.is_some() {
            networks.push(&side);
        }
        let mut volume_rm = vec!["volume", "rm", "--force"];
        volume_rm.extend(volumes.iter().map(String::as_str));
        for args in [rm, networks, volume_rm] {
            match docker(&args) {
                Ok(output) if output.ok => {}
                Ok(output) => failed.push(format!("docker {}: {}", args[0], output.stderr.trim())),
                Err(error) => failed.push(error),
            }
        }
        if failed.is_empty() {
            println!(
                "docker_faults[{}]: removed {n} containers, {n} volumes and the network",
                self.scenario,
                n = self.n
            );
        } else {
            eprintln!(
                "docker_faults[{}]: clean-up incomplete: {failed:?}",
                self.scenario
            );
        }
    }
}
