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

#[test]
fn check_lists_unknown_multi_writes_apart_from_violations() {
    // Multi-document writes whose filter is a range: neither proved to match everything nor
    // proved selective. The proxy measures them; check reads no data, so it lists them.
    let dir = std::env::temp_dir().join(format!("mg-check-unknown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("unknown.jsonl");
    std::fs::write(
        &file,
        "{\"update\": \"users\", \"updates\": [{\"q\": {\"age\": {\"$gt\": 30417}}, \"u\": {\"$set\": {\"x\": 1}}, \"multi\": true}], \"$db\": \"app\"}\n\
         {\"update\": \"users\", \"updates\": [{\"q\": {\"age\": {\"$lt\": 30418}}, \"u\": {\"$set\": {\"x\": 1}}, \"multi\": true}, {\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"x\": 1}}}], \"$db\": \"app\"}\n\
         {\"delete\": \"logs\", \"deletes\": [{\"q\": {\"at\": {\"$lt\": 30419}}, \"limit\": 0}], \"$db\": \"app\"}\n\
         {\"find\": \"users\", \"filter\": {\"_id\": 1}, \"$db\": \"app\"}\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (code, out, err) = mongoguard(&["check", path]);
    assert_eq!(code, 0, "{out}{err}");
    let (violations, unknown) = out
        .split_once("\nunknown: ")
        .unwrap_or_else(|| panic!("{out}"));
    // The delete-many is a violation (W004 warn); the measured ones are not violations.
    assert!(violations.contains("W004 delete-many [warn]"), "{out}");
    assert!(!violations.contains("W001"), "{out}");
    assert!(!violations.contains("W003"), "{out}");
    assert!(unknown.starts_with("3 multi-document write(s)"), "{out}");
    assert!(
        unknown.contains("app.users") && unknown.contains("2 x update (W001)"),
        "{out}"
    );
    assert!(
        unknown.contains("app.logs") && unknown.contains("1 x delete (W003)"),
        "{out}"
    );
    for literal in ["30417", "30418", "30419"] {
        assert!(!out.contains(literal), "literal {literal} leaked: {out}");
    }

    let (code, out, _) = mongoguard(&["check", "--format", "json", path]);
    assert_eq!(code, 0, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert_eq!(report["blocking"], false);
    let unknown = report["unknown"].as_array().unwrap();
    assert_eq!(unknown.len(), 2, "{out}");
    let users = unknown
        .iter()
        .find(|u| u["namespace"] == "app.users")
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(users["count"], 2);
    assert_eq!(users["rule"], "W001");
    assert_eq!(users["command"], "update");
    assert!(users["example_shape"].is_object(), "{out}");
    let groups = report["groups"].as_array().unwrap();
    assert!(
        groups
            .iter()
            .all(|g| g["rule"] != "W001" && g["rule"] != "W003"),
        "{out}"
    );

    // Nothing to measure: no section at all.
    std::fs::write(
        &file,
        "{\"find\": \"users\", \"filter\": {\"_id\": 1}, \"$db\": \"app\"}\n",
    )
    .unwrap();
    let (_, out, _) = mongoguard(&["check", path]);
    assert!(!out.contains("unknown:"), "{out}");
    let (_, out, _) = mongoguard(&["check", "--format", "json", path]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert_eq!(report["unknown"], serde_json::json!([]));
}

#[test]
fn check_counts_every_statement_past_the_listed_ones() {
    let dir = std::env::temp_dir().join(format!("mg-check-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("many.jsonl");
    let docs: Vec<String> = (0..50).map(|i| format!("{{\"_id\": \"k{i}\"}}")).collect();
    std::fs::write(
        &file,
        format!(
            "{{\"insert\": \"users\", \"documents\": [{}], \"$db\": \"app\"}}\n",
            docs.join(", ")
        ),
    )
    .unwrap();
    let (code, out, _) = mongoguard(&["check", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("50 x insert"), "{out}");
}

#[test]
fn policy_validate_refuses_app_overrides_that_relax_and_warns_when_trusted() {
    let dir = std::env::temp_dir().join(format!("mg-policy-app-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("app.toml");
    let relax = "[[overrides]]\napp = \"nightly-*\"\nrules = { W001 = \"warn\" }\n";
    std::fs::write(&file, relax).unwrap();
    let (code, out, err) = mongoguard(&["policy", "validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("relaxes rules on `app`"), "{err}");
    std::fs::write(&file, format!("trust_app_name = true\n{relax}")).unwrap();
    let (code, out, err) = mongoguard(&["policy", "validate", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("valid"), "{out}");
    assert!(
        out.contains("warning: overrides[0] relaxes rules on `app`"),
        "{out}"
    );
    std::fs::write(
        &file,
        "[[overrides]]\napp = \"nightly-*\"\nrules = { W004 = \"block\" }\n",
    )
    .unwrap();
    let (code, out, err) = mongoguard(&["policy", "validate", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("warning"), "{out}");
}
