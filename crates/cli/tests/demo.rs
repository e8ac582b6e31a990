//! The README's first command: `bulwark dev --demo` on a fresh directory must run to the end,
//! through the lying nodes and the node that joins under load.

use std::process::{Command, Stdio};

#[test]
fn the_demo_runs_to_the_end_on_a_fresh_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_bulwark"))
        .args(["dev", "--demo", "--dir"])
        .arg(dir.path().join("cluster"))
        .stdin(Stdio::null())
        .output()
        .expect("run bulwark dev --demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed:\n{stdout}\n{stderr}"
    );
    for expected in [
        "read 1: correct value",
        "4. Node 3 is replaced by a corrupting liar",
        "5. Node 3 is replaced by a forging liar",
        "7. The cluster as",
        "joins (`bulwark node join`)",
        "are linearizable",
        "node 4 ",
        "Demo finished",
    ] {
        assert!(
            stdout.contains(expected),
            "the demo did not say {expected:?}:\n{stdout}"
        );
    }
}
