//! The strict reader's own tests: misspelt keys, unreadable lines and files, empty and
//! missing folders.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/tests")
}

#[test]
fn policy_vectors() {
    let dir = shipped();
    let (count, failures) = run_all(&dir);
    assert!(
        failures.is_empty(),
        "{} failures ({count} vectors run):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        count >= 50,
        "only {count} vectors found in {}",
        dir.display()
    );
}

/// Staging runs in audit mode to see what enforcement would break: every vector, judged
/// again in audit mode, must record what enforcement finds and block nothing but what fails
/// closed (G001).
#[test]
fn audit_mode_records_what_every_vector_enforces() {
    let (count, failures) = run_all_in_audit_mode(&shipped());
    assert!(
        failures.is_empty(),
        "{} failures ({count} vectors run):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(count >= 50, "only {count} vectors");
}

#[test]
fn every_implemented_rule_has_vectors_that_fire_and_stay_quiet() {
    let vectors = load_all(&shipped()).unwrap_or_else(|e| panic!("{}", e.join("\n")));
    // A001 is decided by the learned allowlist, outside the policy engine the vectors run
    // (its tests: src/allowlist/tests.rs, tests/allowlist.rs); the connection standards are
    // not per command: their detector has its own tests (policy::connections).
    let per_command = RULES.iter().filter(|r| {
        r.implemented
            && r.scope == crate::policy::Scope::Command
            && r.id != crate::policy::RuleId::A001
    });
    for rule in per_command {
        let firing = vectors
            .iter()
            .filter(|(_, v)| v.expect.iter().any(|c| c == rule.code))
            .count();
        let quiet = vectors
            .iter()
            .filter(|(_, v)| v.quiet.as_deref() == Some(rule.code))
            .count();
        assert!(firing > 0, "no vector shows {} firing", rule.code);
        assert!(
            quiet > 0,
            "no vector shows {} staying quiet (mark one with \"quiet\": \"{}\")",
            rule.code,
            rule.code
        );
    }
}

// ---- the reader is strict ------------------------------------------------------------

const GOOD: &str = r#"{"name": "multi update, empty filter", "command": {"update": "users", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": true}]}, "expect": ["W001"], "verdict": "block"}"#;

fn rejected(line: &str) -> String {
    match parse_line(line) {
        Ok(v) => panic!("accepted {line}: {v:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_good_line_is_read_and_passes() {
    let v = parse_line(GOOD).unwrap_or_else(|e| panic!("{e}"));
    run_case(&v).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_misspelt_top_level_key_is_an_error() {
    // "verdcit": the verdict would be missing; "expcet" next to "expect": ignored data.
    let e = rejected(&GOOD.replace("\"verdict\"", "\"verdcit\""));
    assert!(e.contains("unknown field `verdcit`"), "{e}");
    let e = rejected(&GOOD.replace("\"expect\"", "\"expect\": [], \"expcet\""));
    assert!(e.contains("unknown field `expcet`"), "{e}");
    let e = rejected(&GOOD.replace("\"name\"", "\"profile\": \"strict\", \"nmae\""));
    assert!(e.contains("unknown field `nmae`"), "{e}");
}

#[test]
fn a_misspelt_nested_key_is_an_error() {
    let ctx = GOOD.replace(
        "\"expect\"",
        "\"context\": {\"wire_verison\": 7}, \"expect\"",
    );
    let e = rejected(&ctx);
    assert!(e.contains("unknown field `wire_verison`"), "{e}");
    let legacy = r#"{"name": "x", "legacy": {"op": "delete", "ns": "app.c", "selectr": {}}, "expect": [], "verdict": "allow"}"#;
    let e = rejected(legacy);
    assert!(e.contains("selectr"), "{e}");
    let op = r#"{"name": "x", "legacy": {"op": "remove", "ns": "app.c", "selector": {}}, "expect": [], "verdict": "allow"}"#;
    let e = rejected(op);
    assert!(e.contains("unknown variant `remove`"), "{e}");
}

#[test]
fn wrong_values_are_errors() {
    for (bad, why) in [
        (GOOD.replace("\"block\"", "\"blocked\""), "unknown variant"),
        (GOOD.replace("[\"W001\"]", "\"W001\""), "invalid type"),
        (GOOD.replace("[\"W001\"]", "[\"W999\"]"), "unknown rule id"),
        (GOOD.replace("[\"W001\"]", "[\"W001\", \"W001\"]"), "twice"),
        (
            GOOD.replace("\"verdict\"", "\"quiet\": \"W001\", \"verdict\""),
            "also expected",
        ),
        (
            GOOD.replace("\"verdict\"", "\"more_to_come\": \"yes\", \"verdict\""),
            "invalid type",
        ),
        (
            GOOD.replace("\"command\"", "\"policy\": \"\", \"profile\": \"strict\", \"command\""),
            "both policy and profile",
        ),
        (
            GOOD.replace("\"command\"", "\"legacy\": {\"op\": \"query\", \"ns\": \"a.c\", \"query\": {}}, \"command\""),
            "both command and legacy",
        ),
        (
            r#"{"name": "x", "expect": [], "verdict": "allow"}"#.to_string(),
            "neither command nor legacy",
        ),
        (
            r#"{"name": "x", "db": "app", "legacy": {"op": "query", "ns": "app.c", "query": {}}, "expect": [], "verdict": "allow"}"#.to_string(),
            "not legacy",
        ),
        ("{\"name\": \"x\",".to_string(), "EOF"),
    ] {
        let e = rejected(&bad);
        assert!(e.contains(why), "{bad}\n  -> {e} (expected {why:?})");
    }
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mongoguard-vectors-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_unreadable_line_fails_the_run_with_file_and_line() {
    let s = Scratch::new("badline");
    let bad = GOOD.replace("\"verdict\"", "\"verdcit\"");
    s.write(
        "a.jsonl",
        &format!("// a comment\n{GOOD}\n\n{bad}\n{GOOD}\n"),
    );
    let (count, failures) = run_all(&s.0);
    assert_eq!(count, 0, "nothing runs when a vector is unreadable");
    let want = format!("{}:4: unreadable vector", s.0.join("a.jsonl").display());
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].starts_with(&want), "{failures:?}");
    assert!(failures[0].contains("verdcit"), "{failures:?}");
}

#[test]
fn a_mismatch_fails_with_file_and_line() {
    let s = Scratch::new("mismatch");
    s.write(
        "a.jsonl",
        &format!("{GOOD}\n{}\n", GOOD.replace("\"block\"", "\"warn\"")),
    );
    let (count, failures) = run_all(&s.0);
    assert_eq!(count, 2);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].starts_with(&format!("{}:2 [", s.0.join("a.jsonl").display())),
        "{failures:?}"
    );
}

#[test]
fn an_empty_file_a_missing_directory_and_no_files_are_failures() {
    let s = Scratch::new("empty");
    s.write("good.jsonl", &format!("{GOOD}\n"));
    s.write("empty.jsonl", "// only a comment\n\n");
    let (_, failures) = run_all(&s.0);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].contains("empty.jsonl: no vectors"),
        "{failures:?}"
    );

    let (count, failures) = run_all(&s.0.join("missing"));
    assert_eq!(count, 0);
    assert!(
        failures.len() == 1 && failures[0].contains("cannot list"),
        "{failures:?}"
    );

    let none = Scratch::new("nofiles");
    none.write("notes.txt", "not vectors\n");
    let (count, failures) = run_all(&none.0);
    assert_eq!(count, 0);
    assert!(
        failures.len() == 1 && failures[0].contains("no .jsonl"),
        "{failures:?}"
    );
}

#[test]
fn an_unreadable_file_is_a_failure() {
    let s = Scratch::new("notutf8");
    std::fs::write(s.0.join("bad.jsonl"), [0xff, 0xfe, b'\n']).unwrap_or_else(|e| panic!("{e}"));
    let (count, failures) = run_all(&s.0);
    assert_eq!(count, 0);
    assert!(
        failures.len() == 1 && failures[0].contains("cannot read"),
        "{failures:?}"
    );
}

#[test]
fn files_in_subdirectories_are_read() {
    let s = Scratch::new("nested");
    s.write("top.jsonl", &format!("{GOOD}\n"));
    s.write("more/deeper.jsonl", &format!("{GOOD}\n{GOOD}\n"));
    let (count, failures) = run_all(&s.0);
    assert_eq!((count, failures), (3, Vec::<String>::new()));
}
