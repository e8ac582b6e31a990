//! The trusted log as its own process (`bulwark a2m serve`): killed and restarted it keeps every
//! slot it attested; started on a directory restored from an older copy it refuses to attest at
//! all (A2M spec §7.1 item 8, §7.2 T1).

use crate::common;

use common::copy_dir;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bulwark_a2m::A2m;
use bulwark_a2m::socket::Remote;
use bulwark_core::a2m::{Expected, contradicts, nonce_of};
use bulwark_core::sign::PublicKey;

fn bulwark() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bulwark"))
}

fn serve(dir: &Path, socket: &Path) -> Child {
    serve_with(dir, socket, None)
}

/// Connects once the process serves, within 10 s.
fn connect(socket: &Path, key: PublicKey) -> Remote {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Remote::connect(socket, Some(key)) {
            Ok(remote) => return remote,
            Err(error) if Instant::now() > deadline => {
                panic!("the trusted log never served: {error}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn kill(mut child: Child) {
    child.kill().expect("kill");
    child.wait().expect("wait");
}

#[test]
fn a_killed_trusted_log_keeps_its_word_and_a_rolled_back_one_refuses_to_serve() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("a2m");
    let socket = root.path().join("a2m.sock");
    let init = bulwark()
        .args(["a2m", "init", "--dir"])
        .arg(&dir)
        .output()
        .expect("init");
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let key: PublicKey = String::from_utf8_lossy(&init.stdout)
        .trim()
        .parse()
        .expect("init prints the key");

    let child = serve(&dir, &socket);
    let mut remote = connect(&socket, key);
    let mut attested = Vec::new();
    for value in 1..=5u8 {
        let attestation = remote
            .append_attest(1, [value; 32], nonce_of(value.into()))
            .expect("append");
        attested.push(*attestation.value());
    }
    let older = root.path().join("older.redb");
    std::fs::copy(dir.join("state.redb"), &older).expect("copy the store");
    for value in 6..=8u8 {
        attested.push(
            *remote
                .append_attest(1, [value; 32], nonce_of(value.into()))
                .expect("append")
                .value(),
        );
    }
    drop(remote);
    kill(child);

    // Killed with SIGKILL and restarted: the same identity, every slot as attested.
    let child = serve(&dir, &socket);
    let mut remote = connect(&socket, key);
    for (slot, before) in (1..).zip(&attested) {
        let now = Expected::assigned(1, slot, [slot as u8; 32])
            .check(
                &key,
                remote
                    .lookup(1, slot, nonce_of(slot))
                    .expect("lookup")
                    .to_unverified(),
            )
            .expect("still assigned as attested");
        assert!(!contradicts(before, now.value()), "slot {slot}");
    }
    assert_eq!(remote.end(1, [7; 32]).expect("end").value().seq, 8);
    drop(remote);
    kill(child);

    // The store restored from the older copy: the process refuses to start, naming the rollback.
    std::fs::copy(&older, dir.join("state.redb")).expect("roll back");
    let refused = serve(&dir, &socket)
        .wait_with_output()
        .expect("serve exits");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a rolled-back trusted log served"
    );
    assert!(
        stderr.contains("rolled back") && stderr.contains(&dir.display().to_string()),
        "{stderr}"
    );
    assert!(
        Remote::connect(&socket, Some(key)).is_err(),
        "something still serves"
    );
}

/// With its generation in a TPM counter (`--tpm`), the trusted log catches what no file anchor
/// can: its whole disk (directory and anchor alike) restored from a snapshot. The same restore of
/// a file-anchored log is served, which is the limit the TPM removes. Runs on its own swtpm;
/// SKIPPED without one unless BULWARK_REQUIRE_TPM=1.
#[test]
fn a_tpm_anchored_trusted_log_refuses_a_restored_disk_that_a_file_anchor_accepts() {
    let root = tempfile::tempdir().expect("tempdir");
    let Some(swtpm) = bulwark_a2m::swtpm::for_test(
        "a_tpm_anchored_trusted_log_refuses_a_restored_disk_that_a_file_anchor_accepts",
        &root.path().join("tpm"),
    ) else {
        return;
    };
    let tcti = swtpm.tcti();
    // The disk holds both logs' directories and the file-anchored one's anchor.
    let disk = root.path().join("disk");
    let sealed = disk.join("sealed");
    let filed = disk.join("filed");
    let sealed_key = init(&sealed, &["--tpm", &tcti, "--tpm-index", "0x01500042"]);
    let filed_key = init(&filed, &[]);
    let sealed_socket = root.path().join("sealed.sock");
    let filed_socket = root.path().join("filed.sock");

    let append = |socket: &Path, key: PublicKey, tpm: Option<&str>, dir: &Path, values| {
        let child = serve_with(dir, socket, tpm);
        let mut remote = connect(socket, key);
        for value in values {
            remote
                .append_attest(1, [value; 32], nonce_of(value.into()))
                .expect("append");
        }
        drop(remote);
        kill(child);
    };
    append(&sealed_socket, sealed_key, Some(&tcti), &sealed, 1..=3u8);
    append(&filed_socket, filed_key, None, &filed, 1..=3u8);
    let snapshot = root.path().join("snapshot");
    copy_dir(&disk, &snapshot);
    append(&sealed_socket, sealed_key, Some(&tcti), &sealed, 4..=6u8);
    append(&filed_socket, filed_key, None, &filed, 4..=6u8);

    // The machine reboots with its disk restored from the snapshot; the TPM keeps its counter.
    let swtpm = swtpm.restart().expect("reboot");
    let tcti = swtpm.tcti();
    std::fs::remove_dir_all(&disk).expect("wipe");
    copy_dir(&snapshot, &disk);

    let refused = serve_with(&sealed, &sealed_socket, Some(&tcti))
        .wait_with_output()
        .expect("serve exits");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a rolled-back trusted log served"
    );
    assert!(
        stderr.contains("the state was rolled back") && stderr.contains("TPM NV index 0x01500042"),
        "{stderr}"
    );
    // Served without its TPM, it says what it needs instead of falling back to a file.
    let no_tpm = serve_with(&sealed, &sealed_socket, None)
        .wait_with_output()
        .expect("serve exits");
    let stderr = String::from_utf8_lossy(&no_tpm.stderr);
    assert!(!no_tpm.status.success(), "served without its TPM");
    assert!(stderr.contains("serve it with --tpm"), "{stderr}");

    // The file-anchored log restored with its anchor: nothing on the disk can tell.
    let child = serve_with(&filed, &filed_socket, None);
    let mut remote = connect(&filed_socket, filed_key);
    assert_eq!(remote.end(1, [9; 32]).expect("end").value().seq, 3);
    drop(remote);
    kill(child);
}

fn init(dir: &Path, extra: &[&str]) -> PublicKey {
    let init = bulwark()
        .args(["a2m", "init", "--dir"])
        .arg(dir)
        .args(extra)
        .output()
        .expect("init");
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    String::from_utf8_lossy(&init.stdout)
        .trim()
        .parse()
        .expect("init prints the key")
}

fn serve_with(dir: &Path, socket: &Path, tpm: Option<&str>) -> Child {
    let mut command = bulwark();
    command
        .args(["a2m", "serve", "--dir"])
        .arg(dir)
        .arg("--socket")
        .arg(socket);
    if let Some(tcti) = tpm {
        command.args(["--tpm", tcti]);
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bulwark a2m serve")
}
