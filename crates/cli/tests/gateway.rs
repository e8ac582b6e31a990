//! The S3 gateway against a real local cluster: `bulwark gateway` in front of four `bulwark node`
//! processes, exercised by the boto3 / aws-cli / rclone / s3cmd suite in `tests/s3/`.

mod common;

use common::{BULWARK, TestCluster};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const ACCESS_KEY: &str = "gateway-test";
const SECRET_KEY: &str = "gateway-test-secret";
/// Small enough that the suite can exercise EntityTooLarge quickly.
const OBJECT_BYTES_MAX: u64 = 32 << 20;

/// A running gateway; killed when dropped.
struct Gateway {
    child: Child,
    endpoint: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_gateway(cluster: &Path) -> Gateway {
    let mut child = Command::new(BULWARK)
        .args(["gateway", "--listen", "127.0.0.1:0", "--client", "admin"])
        .arg("--cluster")
        .arg(cluster)
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg("--object-bytes-max")
        .arg(OBJECT_BYTES_MAX.to_string())
        .args(["--chunk-grace-secs", "5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start bulwark gateway");
    let stdout = child.stdout.take().expect("gateway stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the gateway's address");
    let endpoint = line
        .trim()
        .strip_prefix("S3 gateway listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from the gateway: {line:?}"))
        .to_owned();
    Gateway { child, endpoint }
}

#[test]
fn the_s3_suite_passes_against_a_real_cluster() {
    let cluster = TestCluster::start(1, 10_000);
    std::thread::sleep(Duration::from_millis(300));
    let gateway = start_gateway(cluster.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/s3/run.sh");
    let status = Command::new("bash")
        .arg(&script)
        .args(["--endpoint", &gateway.endpoint])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg("--max-object-bytes")
        .arg(OBJECT_BYTES_MAX.to_string())
        .stdin(Stdio::null())
        .status()
        .expect("run tests/s3/run.sh");
    assert!(status.success(), "tests/s3/run.sh failed: {status}");
}
