//! The README's demo command works: the walkthrough runs against the embedded stand-in, the
//! blocked steps are refused with the documented code and the records are written.

use std::process::Command;

#[test]
fn demo_walkthrough_blocks_and_records() {
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard-demo"))
        .args(["--listen", "127.0.0.1:0", "--once"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("connect:  mongodb://127.0.0.1:"),
        "{stdout}"
    );
    for rule in ["W001", "W003", "W005", "W006"] {
        assert!(
            stdout.contains(&format!(
                "code 65001 MongoguardPolicyViolation: mongoguard blocked this command: {rule}"
            )),
            "{rule} not refused:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!("\"rule\":\"{rule}\"")),
            "no {rule} record:\n{stdout}"
        );
    }
    // The blocked writes never happened: three documents are left.
    assert!(stdout.contains("-> ok, n = 3\n"), "{stdout}");
}
