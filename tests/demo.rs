//! The README's first command works: `cargo run --release --example demo` (here in the test's
//! own profile). With `--once` it walks through the commands against the embedded stand-in,
//! refuses the blocked steps with the documented code, writes their records and exits; without
//! it, it keeps serving on the printed connection string (a driver can use it) until SIGINT.
//!
//! Cargo gives integration tests the path of the crate's binaries, not of its examples, so
//! the test builds the example with the cargo that runs it (a no-op when `cargo test` has
//! already built the examples) and takes the executable's path from cargo's JSON messages.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::{error::ErrorKind, Client};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
    sync::OnceCell,
    time::timeout,
};

/// Building the example may compile it from scratch on a loaded machine.
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);
/// The walkthrough is eight round trips to an in-process stand-in.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The cargo profile this test binary was built with, from its path
/// (`<target dir>/<profile dir>/deps/demo-<hash>`): the example is built with the same one so
/// that nothing is compiled twice.
fn profile_args() -> Vec<String> {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|d| d.to_str())
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_owned();
    match dir.as_str() {
        "debug" => Vec::new(),
        other => vec!["--profile".to_owned(), other.to_owned()],
    }
}

/// The built example, shared by the tests of this file (built once).
async fn demo() -> &'static Path {
    static DEMO: OnceCell<PathBuf> = OnceCell::const_new();
    DEMO.get_or_init(build_demo).await
}

/// `cargo build --example demo`; returns the built executable.
async fn build_demo() -> PathBuf {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args([
        "build",
        "--example",
        "demo",
        "--message-format=json-render-diagnostics",
        "--manifest-path",
        manifest,
    ])
    .args(profile_args())
    .stdin(Stdio::null())
    .kill_on_drop(true);
    // Cargo runs this test with the variables it sets for the crate (CARGO_MANIFEST_DIR, ...,
    // and the build script's MONGOGUARD_GIT_COMMIT). Build scripts watch some of them (ring's
    // reads CARGO_MANIFEST_DIR, ours MONGOGUARD_GIT_COMMIT): passed on, they would make this
    // build, and then the next `cargo test`, recompile ring, rustls and mongoguard each time.
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_by_cargo = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
            || name == "OUT_DIR"
            || name == "MONGOGUARD_GIT_COMMIT";
        if set_by_cargo {
            cmd.env_remove(name);
        }
    }
    let out = timeout(BUILD_TIMEOUT, cmd.output())
        .await
        .expect("cargo build --example demo finishes in time")
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo build --example demo failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let executables: Vec<PathBuf> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "demo")
        .filter(|msg| {
            msg["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "example"))
        })
        .filter_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .collect();
    assert_eq!(
        executables.len(),
        1,
        "one demo executable in cargo's messages:\n{stdout}"
    );
    executables.into_iter().next().expect("checked above")
}

/// The text of one walkthrough step: from its `* <title>` line to the next step's.
fn step<'a>(stdout: &'a str, title: &str) -> &'a str {
    let start = stdout
        .find(&format!("* {title}\n"))
        .unwrap_or_else(|| panic!("no step {title:?}:\n{stdout}"));
    let rest = stdout.get(start + 2..).unwrap_or_default();
    let end = rest.find("\n* ").map_or(rest.len(), |i| i + 1);
    rest.get(..end).unwrap_or_default()
}

#[tokio::test]
async fn demo_once_walks_through_blocks_records_and_exits() {
    let out = timeout(
        RUN_TIMEOUT,
        Command::new(demo().await)
            .args(["--listen", "127.0.0.1:0", "--once"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the demo exits after the walkthrough with --once")
    .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --listen 127.0.0.1:0: a free port was picked, not the default 27017.
    let port = connect_port(&stdout);
    assert!(port != 0 && port != 27017, "port {port}:\n{stdout}");

    assert!(step(&stdout, "insert three documents").contains("  -> ok, n = 3\n"));
    for (title, rule) in [
        ("update with multi and an empty filter (W001)", "W001"),
        ("delete everything (W003)", "W003"),
        ("write into admin (W005)", "W005"),
        ("a write concern with j:false (W006)", "W006"),
    ] {
        let text = step(&stdout, title);
        assert!(
            text.contains(&format!(
                "  -> refused, code 65001 MongoguardPolicyViolation: mongoguard blocked this command: {rule}"
            )),
            "{rule} not refused:\n{stdout}"
        );
        assert!(
            text.contains(&format!("\"rule\":\"{rule}\","))
                && text.contains("\"action\":\"block\""),
            "no {rule} block record:\n{stdout}"
        );
    }
    // Q001 only warns: recorded, and the find is forwarded and answered.
    let q001 = step(&stdout, "find with $ne (Q001: warns, forwarded)");
    assert!(
        q001.contains("\"rule\":\"Q001\",") && q001.contains("\"action\":\"warn\""),
        "{stdout}"
    );
    assert!(q001.ends_with("  -> ok\n"), "{stdout}");
    // The blocked writes never happened: the three documents are left, and nothing more.
    assert_eq!(
        step(&stdout, "count what is left"),
        "count what is left\n  -> ok, n = 3\n",
        "{stdout}"
    );
}

/// The port of the `connect:  mongodb://127.0.0.1:<port>/...` line.
fn connect_port(stdout: &str) -> u16 {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("connect:  mongodb://127.0.0.1:"))
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no connection string on 127.0.0.1:\n{stdout}"))
}

#[tokio::test]
async fn demo_without_once_serves_the_printed_uri_until_sigint() {
    // --listen is honoured: a port that was free a moment ago, not the default 27017 nor one
    // the system picks.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(demo().await)
        .args(["--listen", &listen])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the demo");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    // Everything up to the "serving" line, which comes after the walkthrough.
    let mut printed = String::new();
    timeout(RUN_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("read the demo's stdout") {
            printed.push_str(&line);
            printed.push('\n');
            if line.starts_with("serving; try: mongosh ") {
                return;
            }
        }
        panic!("the demo closed its stdout before serving:\n{printed}");
    })
    .await
    .unwrap_or_else(|_| panic!("no \"serving\" line in time:\n{printed}"));
    let uri = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("connect:  "))
        .unwrap_or_else(|| panic!("no connection string:\n{printed}"))
        .to_owned();
    assert_eq!(uri, format!("mongodb://{listen}/?directConnection=true"));
    assert!(
        printed.contains(&format!("serving; try: mongosh \"{uri}\"")),
        "{printed}"
    );

    // A driver uses the printed string as it is (plus a bounded server selection).
    let client = Client::with_uri_str(format!("{uri}&serverSelectionTimeoutMS=10000"))
        .await
        .unwrap_or_else(|e| panic!("client for {uri}: {e}"));
    let users = client.database("db_demo").collection::<Document>("users");
    let mut ids: Vec<i32> = timeout(RUN_TIMEOUT, async {
        users
            .find(doc! {})
            .await
            .expect("find through the demo")
            .try_collect::<Vec<Document>>()
            .await
            .expect("read the cursor")
    })
    .await
    .expect("find in time")
    .iter()
    .map(|d| d.get_i32("_id").expect("integer _id"))
    .collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3], "the walkthrough's documents");
    // The policy is live: an unfiltered delete_many is refused (W003) and deletes nothing.
    let err = timeout(RUN_TIMEOUT, users.delete_many(doc! {}))
        .await
        .expect("delete_many in time")
        .expect_err("delete_many({}) is blocked");
    match &*err.kind {
        ErrorKind::Command(ce) => {
            assert_eq!(ce.code, 65001, "{err:?}");
            assert!(ce.message.contains("W003"), "{err:?}");
        }
        _ => panic!("expected the W003 command error, got {err:?}"),
    }
    let left = timeout(RUN_TIMEOUT, users.estimated_document_count())
        .await
        .expect("count in time")
        .expect("count through the demo");
    assert_eq!(left, 3);

    // Ctrl-C stops it: SIGINT, then a clean exit in bounded time.
    let pid = child.id().expect("the demo is running").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill(1)");
    assert!(kill.success(), "kill -INT {pid}: {kill}");
    let status = timeout(RUN_TIMEOUT, child.wait())
        .await
        .expect("the demo exits after SIGINT")
        .expect("wait for the demo");
    assert!(status.success(), "exit status after SIGINT: {status}");
}
