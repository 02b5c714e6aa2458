//! `mongoguard check` on mongod logs of every version with a structured log (4.4, 5.0, 6.0,
//! 7.0) and topology (standalone, replica-set primary and secondary, mongos and a shard).
//!
//! The logs in tests/data/logs are built from the documented log format (one JSON object per
//! line: t, s, c, id, ctx, msg, attr; "Slow query" is id 51803, attr.type the operation,
//! attr.command the command or, for a write's per-statement line, the statement; `truncated`
//! and `size` beside `attr` when mongod cut an attribute longer than maxLogSizeKB) and from the
//! facts users met on real ones: `$binary.subType` written as one hex digit in
//! `$clusterTime` / `lsid`, internal threads (LogicalSessionCacheRefresh,
//! TenantMigrationDonorService) creating TTL indexes in `config`, time-series bucket writes on
//! `system.buckets.*` logged per statement without their update document, a write logged
//! both per statement and as a command, secondaries' "Applied op" lines.

use std::process::Command;

use serde_json::Value;

fn check(args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
        .arg("check")
        .args(["--format", "json"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run mongoguard");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not a JSON report ({e}): {stdout}"));
    (out.status.code().unwrap_or(-1), report)
}

fn rules(report: &Value, section: &str) -> Vec<(String, String, String, u64)> {
    let mut v: Vec<_> = report[section]
        .as_array()
        .unwrap_or_else(|| panic!("no {section} in {report}"))
        .iter()
        .map(|g| {
            (
                g["rule"].as_str().unwrap().to_owned(),
                g["namespace"].as_str().unwrap().to_owned(),
                g["action"].as_str().unwrap().to_owned(),
                g["count"].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn g(rule: &str, ns: &str, action: &str, n: u64) -> (String, String, String, u64) {
    (rule.into(), ns.into(), action.into(), n)
}

#[test]
fn mongod_4_4_standalone_a_write_logged_per_statement_and_as_a_command_counts_once() {
    let (code, r) = check(&["tests/data/logs/mongod-4.4-standalone.log"]);
    assert_eq!(code, 1, "{r}");
    assert_eq!(r["lines"], 8);
    assert_eq!(
        r["evaluated"], 3,
        "update (statement + command), find, insert: {r}"
    );
    assert_eq!(r["statements_merged"], 1);
    assert_eq!(
        rules(&r, "groups"),
        vec![
            g("Q001", "shop.orders", "warn", 1),
            g("W001", "shop.orders", "block", 1),
            g("W006", "shop.orders", "block", 1),
        ]
    );
    let w001 = r["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["rule"] == "W001")
        .unwrap();
    // Labelled with the client's command, not the statement's fields.
    assert_eq!(w001["command"], "update", "{w001}");
}

#[test]
fn mongod_5_0_primary_reads_one_digit_binary_subtypes_and_dedups_statements() {
    let (code, r) = check(&["tests/data/logs/mongod-5.0-replset-primary.log"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["unreadable"], serde_json::json!({}), "{r}");
    assert_eq!(
        r["evaluated"], 4,
        "delete (merged), update (carries its statements), find, find by BinData md5"
    );
    assert_eq!(r["statements_merged"], 2);
    assert_eq!(
        rules(&r, "groups"),
        vec![g("W004", "app.sessions", "warn", 1)]
    );
    assert_eq!(r["unknown"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["unknown"][0]["count"], 1, "counted once: {r}");
}

#[test]
fn mongod_5_0_secondary_ignores_replication() {
    let (code, r) = check(&["tests/data/logs/mongod-5.0-replset-secondary.log"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["replication"], 2, "{r}");
    assert_eq!(r["unreadable"], serde_json::json!({}), "{r}");
    assert_eq!(r["evaluated"], 1);
    assert_eq!(rules(&r, "groups"), vec![g("Q003", "app.users", "warn", 1)]);
}

/// The ordinary 6.0 replica-set log that made `check` exit 1: mongod's own threads create TTL
/// indexes in `config`. They are reported apart and never block; a client writing into
/// `config` still does.
#[test]
fn mongod_6_0_internal_threads_are_apart_and_never_block() {
    let (code, r) = check(&["tests/data/logs/mongod-6.0-replset.log"]);
    assert_eq!(r["internal_commands"], 2, "{r}");
    assert_eq!(
        rules(&r, "internal"),
        vec![
            g("W005", "config.system.sessions", "block", 1),
            g("W005", "config.tenantMigrationDonors", "block", 1),
            g("W016", "config.tenantMigrationDonors", "warn", 1),
        ]
    );
    assert_eq!(
        rules(&r, "groups"),
        vec![g("W005", "config.settings", "block", 1)]
    );
    assert_eq!(code, 1, "the client's write into config blocks: {r}");

    // Without the client's line, the same log passes.
    let dir = std::env::temp_dir().join(format!("mg-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let only_internal = dir.join("internal.log");
    let text = std::fs::read_to_string("tests/data/logs/mongod-6.0-replset.log").unwrap();
    let kept: Vec<&str> = text.lines().filter(|l| !l.contains("\"conn")).collect();
    assert_eq!(kept.len(), 2);
    std::fs::write(&only_internal, kept.join("\n")).unwrap();
    let (code, r) = check(&[only_internal.to_str().unwrap()]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["blocking"], false);
}

#[test]
fn mongod_7_0_sharded_time_series_bucket_writes_and_truncation() {
    let (code, r) = check(&[
        "tests/data/logs/mongos-7.0.log",
        "tests/data/logs/mongod-7.0-shard.log",
    ]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["bucket_writes"], 2, "not G001: {r}");
    assert_eq!(rules(&r, "groups"), vec![], "{r}");
    assert_eq!(
        r["evaluated"], 4,
        "mongos: insert + update; shard: the same two"
    );
    assert_eq!(
        r["unreadable"],
        serde_json::json!({"command truncated by mongod": 1})
    );
    assert_eq!(
        r["unreadable_at"],
        serde_json::json!([{"at": "tests/data/logs/mongod-7.0-shard.log:5", "reason": "command truncated by mongod"}])
    );
}

/// A CI gate must not pass what it could not read: a pre-4.4 text log (or any wrong file)
/// exits 2, with the unreadable lines named.
#[test]
fn a_file_with_no_readable_line_exits_2() {
    let (code, r) = check(&["tests/data/logs/mongod-4.2-text.log"]);
    assert_eq!(code, 2, "{r}");
    assert_eq!(r["readable"], 0);
    assert_eq!(
        r["unreadable_at"][1]["at"],
        "tests/data/logs/mongod-4.2-text.log:2"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
        .args(["check", "tests/data/logs/mongod-4.2-text.log"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no line could be read"), "{text}");
    assert!(!text.contains("no violations"), "{text}");
    // An empty input is not a pass either.
    let (code, _) = check(&["/dev/null"]);
    assert_eq!(code, 2);
}

/// `--policy` takes a profile name wherever it takes a file, like `policy show`.
#[test]
fn profile_names_are_policies() {
    let (code, r) = check(&[
        "--policy",
        "strict",
        "tests/data/logs/mongod-4.4-standalone.log",
    ]);
    assert_eq!(code, 1, "{r}");
    // strict turns Q001 on as a warning too, and D005 naming on: more than standard.
    assert!(rules(&r, "groups").iter().any(|x| x.0 == "D005"), "{r}");
    let (code, r) = check(&[
        "--policy",
        "audit",
        "tests/data/logs/mongod-4.4-standalone.log",
    ]);
    assert_eq!(code, 0, "audit never blocks: {r}");
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
        .args(["check", "--policy", "no-such-profile-or-file", "/dev/null"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-profile-or-file"));
}
