//! The S3 gateway against a real local cluster: `bulwark gateway` in front of four `bulwark node`
//! processes, exercised by the boto3 / aws-cli / rclone / s3cmd suite in `tests/s3/`.

use crate::common;

use common::{BULWARK, TestCluster};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
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
    /// The cluster directory, every node's store under it: the suite looks there for plaintext
    /// of encrypted objects.
    stores: std::path::PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_gateway(cluster: &Path) -> Gateway {
    // SSE-S3's key, kept beside the cluster's secrets.
    let key_file = cluster.join("sse-s3.key");
    std::fs::write(&key_file, hex::encode(rand::random::<[u8; 32]>())).expect("write the key");
    let mut child = Command::new(BULWARK)
        .args(["gateway", "--listen", "127.0.0.1:0", "--client", "admin"])
        .arg("--cluster")
        .arg(cluster)
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg("--object-bytes-max")
        .arg(OBJECT_BYTES_MAX.to_string())
        .args(["--chunk-grace-secs", "5"])
        .arg("--sse-s3-key-file")
        .arg(&key_file)
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
    Gateway {
        child,
        endpoint,
        stores: cluster.to_owned(),
    }
}

fn run_suite(gateway: &Gateway, pytest_args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/s3/run.sh");
    let status = Command::new("bash")
        .arg(&script)
        .args(["--endpoint", &gateway.endpoint])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg("--max-object-bytes")
        .arg(OBJECT_BYTES_MAX.to_string())
        .args(pytest_args)
        .env("S3_NODE_STORES", &gateway.stores)
        .stdin(Stdio::null())
        .status()
        .expect("run tests/s3/run.sh");
    assert!(status.success(), "tests/s3/run.sh failed: {status}");
}

#[test]
fn the_s3_suite_passes_against_a_real_cluster() {
    let cluster = TestCluster::start(1, 10_000);
    std::thread::sleep(Duration::from_millis(300));
    let gateway = start_gateway(cluster.path());
    run_suite(&gateway, &[]);
}

/// One node flips bytes in every fragment and checksum it serves: objects still come back whole
/// (the cluster's reads reject the node's fragments, the gateway re-hashes every chunk).
#[test]
fn objects_survive_a_corrupting_node() {
    let mut cluster = TestCluster::start(1, 10_000);
    cluster.spawn(3, Some("corrupting"));
    std::thread::sleep(Duration::from_millis(300));
    let gateway = start_gateway(cluster.path());
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/s3");
    let objects = here.join("test_objects.py");
    let multipart = here.join("test_multipart.py");
    run_suite(
        &gateway,
        &[objects.to_str().unwrap(), multipart.to_str().unwrap()],
    );
}

/// Sends raw bytes on a fresh connection and returns whatever comes back before the gateway
/// closes it or goes quiet.
fn exchange(endpoint: &str, request: &[u8]) -> String {
    let address = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect to the gateway");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // The gateway may answer and close before reading everything; that is fine.
    let _ = stream.write_all(request);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

fn unsigned_list(endpoint: &str) -> String {
    exchange(
        endpoint,
        b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
}

#[test]
fn garbage_gets_errors_and_the_gateway_keeps_serving() {
    let cluster = TestCluster::start(1, 10_000);
    let gateway = start_gateway(cluster.path());
    let endpoint = gateway.endpoint.as_str();
    let denied = unsigned_list(endpoint);
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert!(denied.contains("AccessDenied"), "{denied}");

    let reply = exchange(endpoint, b"\x00\xffNOT HTTP AT ALL\r\n\r\n");
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 400"),
        "{reply}"
    );

    let mut big_head = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: ".to_vec();
    big_head.extend(std::iter::repeat_n(b'a', 100 * 1024));
    big_head.extend_from_slice(b"\r\n\r\n");
    let reply = exchange(endpoint, &big_head);
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 431"),
        "{reply}"
    );

    let mut many = b"GET / HTTP/1.1\r\nHost: localhost\r\n".to_vec();
    for i in 0..500 {
        many.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let reply = exchange(endpoint, &many);
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 431"),
        "{reply}"
    );

    let forged = exchange(
        endpoint,
        b"PUT /b/k HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nx-amz-date: 20260101T000000Z\r\n\
          x-amz-content-sha256: UNSIGNED-PAYLOAD\r\nAuthorization: AWS4-HMAC-SHA256 Credential=nobody/20260101/us-east-1/s3/aws4_request, \
          SignedHeaders=host, Signature=00\r\nConnection: close\r\n\r\nhello",
    );
    assert!(forged.starts_with("HTTP/1.1 4"), "{forged}");

    // Still serving, and still refusing the anonymous.
    let again = unsigned_list(endpoint);
    assert!(again.starts_with("HTTP/1.1 403"), "{again}");
}

/// The collector on real processes: the members list the content objects they hold (paged, the
/// union of every member's listing), and `bulwark gateway collect` deletes a chunk no object
/// names while an object's chunks and another client's content object stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_deletes_only_chunks_no_object_names() {
    use bulwark_gateway::engine::{Engine, Integrity, Limits, ObjectMeta};
    use bulwark_gateway::layout::{self, ChunkOrigin, ChunkRef};
    use bulwark_gateway::store::Registers;
    use futures::StreamExt;

    let cluster = TestCluster::start(1, 10_000);
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let client = std::sync::Arc::new(cluster.client("admin").await);
    let engine = Engine::new(Limits::default());
    engine
        .create_bucket(client.as_ref(), "b", false)
        .await
        .expect("bucket");
    let data: Vec<u8> = (0..layout::CHUNK_BYTES + 4321)
        .map(|i| (i % 251) as u8)
        .collect();
    let pieces: Vec<_> = data
        .chunks(1 << 20)
        .map(|piece| Ok(bytes::Bytes::copy_from_slice(piece)))
        .collect();
    let (manifest, _) = engine
        .put_object(
            &client,
            "b",
            "kept",
            ObjectMeta::default(),
            futures::stream::iter(pieces),
            &Integrity::default(),
            None,
        )
        .await
        .expect("put");
    assert_eq!(manifest.data.chunks().len(), 2);
    // A chunk a write stored and never named (its gateway died before the manifest).
    let lost = bytes::Bytes::from_static(b"a chunk of a write that never finished");
    let origin = ChunkOrigin {
        bucket: "b".into(),
        key: "ghost".into(),
        upload: None,
    };
    let orphan = Registers::put_chunk(
        client.as_ref(),
        ChunkRef::of(layout::new_write_id(), &lost),
        lost.clone(),
        &origin,
    )
    .await
    .expect("orphan chunk");
    let (theirs, _) = client
        .put_content(b"another client's own object")
        .await
        .expect("content put");

    // Every member's listing, a page of two at a time, names the four objects.
    let mut listed = std::collections::BTreeSet::new();
    let mut after = None;
    loop {
        let (ids, more) = client.list_content(after.as_ref(), 2).await.expect("list");
        assert!(ids.len() <= 2);
        listed.extend(ids.iter().map(|id| id.0.0));
        match (more, ids.last()) {
            (true, Some(last)) => after = Some(*last),
            _ => break,
        }
    }
    let mut expected: std::collections::BTreeSet<[u8; 32]> = manifest
        .data
        .chunks()
        .iter()
        .filter_map(|c| c.object)
        .collect();
    expected.extend([orphan.object.expect("a content object"), theirs.0.0]);
    assert_eq!(listed, expected);

    let out = std::process::Command::new(BULWARK)
        .args(["gateway", "collect", "--client", "admin"])
        .arg("--cluster")
        .arg(cluster.path())
        .args(["--min-age-secs", "0", "--chunk-grace-secs", "0"])
        .stdin(Stdio::null())
        .output()
        .expect("run bulwark gateway collect");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("4 objects listed: 2 named") && said.contains("deleted 1 ("),
        "{said}"
    );

    assert_eq!(
        Registers::get_chunk(client.as_ref(), &orphan)
            .await
            .expect("read"),
        None,
        "the orphan is gone"
    );
    let (value, _) = client.get_content(&theirs).await.expect("read");
    assert_eq!(value.as_deref(), Some(&b"another client's own object"[..]));
    let mut stream = engine
        .read(&client, &manifest, 0..manifest.size, None)
        .await
        .expect("read");
    let mut back = Vec::new();
    while let Some(piece) = stream.next().await {
        back.extend_from_slice(&piece.expect("chunk"));
    }
    assert_eq!(back, data);
}
