//! The trusted log as its own process (`bulwark a2m serve`): killed and restarted it keeps every
//! slot it attested; started on a directory restored from an older copy it refuses to attest at
//! all (A2M spec §7.1 item 8, §7.2 T1).

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
    bulwark()
        .args(["a2m", "serve", "--dir"])
        .arg(dir)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bulwark a2m serve")
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
