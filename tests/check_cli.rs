//! `mongoguard check` and `mongoguard policy` as a user runs them: the real binary on the
//! sample inputs shipped in examples/.

use std::process::Command;

fn mongoguard(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run mongoguard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_reports_the_sample_mongod_log_and_fails_on_blocking_rules() {
    let (code, out, _) = mongoguard(&["check", "examples/mongod.log"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("W001 multi-update-without-filter [block]"),
        "{out}"
    );
    assert!(out.contains("shop.orders"), "{out}");
    assert!(out.contains("W006 journal-disabled [block]"), "{out}");
    assert!(out.contains("W004 delete-many [warn]"), "{out}");
    assert!(out.contains("1 x command truncated by mongod"), "{out}");
    // Shapes only: no literal from the log reaches the report.
    for literal in [
        "shipped",
        "gmail",
        "archived\":true",
        "6560f1a2b3c4d5e6f7a8b9c0",
    ] {
        assert!(!out.contains(literal), "literal {literal:?} leaked: {out}");
    }
}

#[test]
fn check_reads_profiler_exports_and_command_lines() {
    let (code, out, _) = mongoguard(&[
        "check",
        "--format",
        "json",
        "examples/profile.jsonl",
        "examples/commands.jsonl",
    ]);
    assert_eq!(code, 1, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert_eq!(report["blocking"], true);
    let groups = report["groups"].as_array().unwrap();
    let find = |rule: &str, ns: &str| {
        groups
            .iter()
            .find(|g| g["rule"] == rule && g["namespace"] == ns)
            .unwrap_or_else(|| panic!("no {rule} on {ns} in {out}"))
    };
    assert_eq!(find("W001", "app.users")["count"], 2);
    assert_eq!(
        find("W003", "app.tokens")["example_shape"],
        serde_json::json!({"$expr": "<bool>"})
    );
    assert_eq!(find("W005", "app.system.js")["action"], "block");
    assert_eq!(find("W008", "app")["action"], "warn");
    // getMore entries carry no command to judge.
    assert!(report["ignored"].as_u64().unwrap() >= 1);
}

#[test]
fn check_exits_zero_without_blocking_violations() {
    let dir = std::env::temp_dir().join(format!("mg-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clean.jsonl");
    std::fs::write(
        &file,
        "{\"find\": \"users\", \"filter\": {\"_id\": 1}, \"$db\": \"app\"}\n",
    )
    .unwrap();
    let (code, out, _) = mongoguard(&["check", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no violations"), "{out}");
    // The audit profile turns every block into a warning: exit 0 on the same log.
    let (code, out, _) = mongoguard(&[
        "check",
        "--policy",
        "policies/audit.toml",
        "examples/mongod.log",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("W001 multi-update-without-filter [warn]"),
        "{out}"
    );
}

#[test]
fn policy_validate_accepts_the_shipped_profiles_and_names_errors() {
    for p in [
        "policies/standard.toml",
        "policies/strict.toml",
        "policies/audit.toml",
    ] {
        let (code, out, err) = mongoguard(&["policy", "validate", p]);
        assert_eq!(code, 0, "{p}: {out}{err}");
        assert!(out.contains("valid"), "{out}");
    }
    let dir = std::env::temp_dir().join(format!("mg-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "extends = \"standard\"\n[rules]\nW999 = \"block\"\n").unwrap();
    let (code, _, err) = mongoguard(&["policy", "validate", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown rule \"W999\""), "{err}");
    std::fs::write(
        &bad,
        "extends = \"standard\"\nmode = \"enforce\"\ntypo = 1\n",
    )
    .unwrap();
    let (code, _, err) = mongoguard(&["policy", "validate", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("line 3"), "{err}");
}

#[test]
fn a_missing_policy_file_stops_the_proxy_from_starting() {
    let (code, _, err) = mongoguard(&[
        "--listen",
        "127.0.0.1:0",
        "--policy",
        "/nonexistent/policy.toml",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/policy.toml"), "{err}");
}

#[test]
fn users_add_writes_secrets_not_passwords_and_refuses_duplicates() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("mg-users-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("users.toml");
    let _ = std::fs::remove_file(&file);
    let add = |name: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
            .args(["users", "add", "--file", file.to_str().unwrap(), name])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"s3cret-pw\n")
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = add("alice");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("alice") && text.contains("SCRAM-SHA-256") && text.contains("SCRAM-SHA-1")
    );
    assert!(!text.contains("s3cret-pw"), "the password was written");
    let users = mongoguard::auth::users::Users::load(&file).unwrap();
    assert_eq!(users.len(), 1);
    let again = add("alice");
    assert!(!again.status.success());
}
