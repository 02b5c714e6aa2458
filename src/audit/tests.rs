//! The audit log end to end: queue, writer task, file sink, dedup timing, counters.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use serde_json::Value;

use super::{record::tests::sample, *};

mod close_reopen;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mongoguard-audit-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("violations.log")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn file_config(path: &Path, window: &str, capacity: usize) -> AuditConfig {
    AuditConfig {
        sink: SinkSpec::File(path.to_path_buf()),
        dedup_window: crate::config::duration::parse(window).unwrap(),
        queue_capacity: capacity,
        ..AuditConfig::default()
    }
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn with_id(request_id: i32) -> ViolationRecord {
    ViolationRecord {
        request_id,
        ..sample()
    }
}

#[tokio::test]
async fn file_sink_writes_one_json_line_per_record() {
    let dir = TempDir::new("lines");
    let log = AuditLog::start(&file_config(&dir.file(), "0", 100)).unwrap();
    log.record(with_id(1));
    log.record(ViolationRecord {
        app_name: Some("evil\"}\n{\"rule\":\"FAKE\"}\r\n".into()),
        ..with_id(2)
    });
    log.record(with_id(3));
    log.flush().await;
    let got = lines(&dir.file());
    assert_eq!(got.len(), 3);
    let ids: Vec<_> = got
        .iter()
        .map(|v| v["request_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(got[1]["app"], "evil\"}\n{\"rule\":\"FAKE\"}\r\n");
    assert_eq!(got[0]["filter_shape"]["age"]["$ne"], "<int>");
    assert_eq!(got[0]["shape_hash"], "00000000000000ab");
    assert_eq!(log.counters().written(), 3);
    assert_eq!(log.counters().total(), 3);
    log.shutdown().await;
}

#[tokio::test]
async fn file_sink_appends_across_two_instances() {
    let dir = TempDir::new("append");
    std::fs::write(dir.file(), "previous line\n").unwrap();
    for id in [1, 2] {
        let log = AuditLog::start(&file_config(&dir.file(), "60s", 100)).unwrap();
        log.record(with_id(id));
        log.shutdown().await;
    }
    let text = std::fs::read_to_string(dir.file()).unwrap();
    let mut it = text.lines();
    assert_eq!(it.next(), Some("previous line"));
    let ids: Vec<i64> = it
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["request_id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, [1, 2]);
}

#[tokio::test]
async fn full_queue_drops_and_counts() {
    let dir = TempDir::new("overflow");
    let log = AuditLog::start(&file_config(&dir.file(), "0", 2)).unwrap();
    // No await between records: on this current-thread runtime the writer cannot run, so
    // the queue holds exactly two.
    for id in 0..5 {
        log.record(with_id(id));
    }
    let c = log.counters();
    assert_eq!(c.dropped(), 3);
    assert_eq!(c.total(), 5, "dropped records are still counted per rule");
    log.flush().await;
    assert_eq!(c.written(), 2);
    assert_eq!(lines(&dir.file()).len(), 2);
    // The log keeps working once the queue drains.
    log.record(with_id(9));
    log.flush().await;
    assert_eq!(c.written(), 3);
    log.shutdown().await;
}

#[tokio::test]
async fn periodic_records_skip_dedup() {
    let dir = TempDir::new("periodic");
    let log = AuditLog::start(&file_config(&dir.file(), "60s", 100)).unwrap();
    for id in 0..3 {
        log.record_periodic(with_id(id));
    }
    log.record(with_id(3));
    log.record(with_id(4));
    log.flush().await;
    let ids: Vec<i64> = lines(&dir.file())
        .iter()
        .map(|l| l["request_id"].as_i64().unwrap())
        .collect();
    // The three periodic ones, then the first deduplicated one (the window is open).
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(log.counters().suppressed(), 1);
    assert_eq!(
        log.counters()
            .rule_count("W001", Action::Block, Mode::Enforce),
        5
    );
}

#[tokio::test]
async fn dedup_writes_first_then_a_summary_once_the_window_passes() {
    let dir = TempDir::new("dedup");
    let log = AuditLog::start(&file_config(&dir.file(), "100ms", 100)).unwrap();
    for id in 0..5 {
        log.record(with_id(id));
    }
    log.flush().await;
    assert_eq!(lines(&dir.file()).len(), 1);
    assert_eq!(log.counters().suppressed(), 4);
    assert_eq!(
        log.counters()
            .rule_count("W001", Action::Block, Mode::Enforce),
        5
    );
    // The writer's sweep (no further record of the key) writes the summary.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        log.flush().await;
        let got = lines(&dir.file());
        if got.len() >= 2 || std::time::Instant::now() > deadline {
            break got;
        }
    };
    assert_eq!(got.len(), 2, "{got:?}");
    let summary = &got[1];
    assert_eq!(summary["suppressed"], 4);
    assert_eq!(summary["window_seconds"], 0.1);
    assert_eq!(summary["rule"], "W001");
    assert_eq!(summary["app"], "billing");
    assert_eq!(summary["db"], "shop");
    assert_eq!(summary["collection"], "orders");
    assert_eq!(summary["shape_hash"], "00000000000000ab");
    assert!(summary.get("request_id").is_none());
    assert_eq!(
        got[0]["request_id"], 0,
        "the first record is the one written"
    );
    // The key was evicted: the next record starts a new window and is written.
    log.record(with_id(7));
    log.flush().await;
    assert_eq!(lines(&dir.file())[2]["request_id"], 7);
    assert_eq!(log.counters().written(), 3);
    log.shutdown().await;
}

#[tokio::test]
async fn shutdown_writes_summaries_of_open_windows() {
    let dir = TempDir::new("shutdown");
    let log = AuditLog::start(&file_config(&dir.file(), "1h", 100)).unwrap();
    for id in 0..3 {
        log.record(with_id(id));
    }
    log.record(ViolationRecord {
        rule_id: "Q001",
        ..with_id(3)
    });
    log.shutdown().await;
    let got = lines(&dir.file());
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[2]["suppressed"], 2);
    assert_eq!(got[2]["window_seconds"], 3600.0);
}

#[tokio::test]
async fn full_dedup_map_writes_without_dedup() {
    let dir = TempDir::new("fullmap");
    let log = AuditLog::start_with_max_keys(&file_config(&dir.file(), "1h", 100), 1).unwrap();
    let other = |id| ViolationRecord {
        database: "other".into(),
        ..with_id(id)
    };
    log.record(with_id(1));
    log.record(with_id(2));
    log.record(other(3));
    log.record(other(4));
    log.flush().await;
    let ids: Vec<_> = lines(&dir.file())
        .iter()
        .map(|v| v["request_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 3, 4]);
    assert_eq!(log.counters().suppressed(), 1);
    log.shutdown().await;
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn write_errors_are_counted_and_the_writer_survives() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        return;
    }
    let log = AuditLog::start(&file_config(full, "0", 100)).unwrap();
    log.record(with_id(1));
    log.flush().await;
    log.record(with_id(2));
    log.flush().await;
    let c = log.counters();
    assert_eq!((c.write_errors(), c.written(), c.total()), (2, 0, 2));
    log.shutdown().await;
}

#[test]
fn none_sink_only_counts_and_needs_no_runtime() {
    let config = AuditConfig {
        sink: SinkSpec::None,
        ..AuditConfig::default()
    };
    let log = AuditLog::start(&config).unwrap();
    log.record(sample());
    log.record(sample());
    let c = log.counters();
    assert_eq!(c.rule_count("W001", Action::Block, Mode::Enforce), 2);
    assert_eq!((c.written(), c.suppressed(), c.dropped()), (0, 0, 0));
}

#[test]
fn real_sinks_need_a_runtime() {
    let err = AuditLog::start(&AuditConfig::default()).unwrap_err();
    assert!(matches!(err, AuditError::NoRuntime), "{err}");
}

#[tokio::test]
async fn bad_file_sinks_are_startup_errors_naming_the_path() {
    let dir = TempDir::new("bad");
    let missing = dir.0.join("no-such-dir").join("v.log");
    let err = AuditLog::start(&file_config(&missing, "0", 10)).unwrap_err();
    assert!(
        matches!(
            err,
            AuditError::Config(crate::config::AuditConfigError::MissingDirectory { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&missing.display().to_string()));
    // A directory where the file should be.
    let err = AuditLog::start(&file_config(&dir.0, "0", 10)).unwrap_err();
    assert!(matches!(err, AuditError::Open { .. }), "{err}");
    assert!(err.to_string().contains(&dir.0.display().to_string()));
}

#[tokio::test]
async fn counters_cover_every_outcome() {
    let dir = TempDir::new("counters");
    let log = AuditLog::start(&file_config(&dir.file(), "1h", 100)).unwrap();
    log.record(sample());
    log.record(sample());
    log.record(ViolationRecord {
        action: Action::Warn,
        mode: Mode::Audit,
        ..sample()
    });
    log.record(ViolationRecord {
        rule_id: "Q003",
        action: Action::Warn,
        ..sample()
    });
    log.flush().await;
    let c = log.counters();
    assert_eq!(c.rule_count("W001", Action::Block, Mode::Enforce), 2);
    assert_eq!(c.rule_count("W001", Action::Warn, Mode::Audit), 1);
    assert_eq!(c.rule_count("Q003", Action::Warn, Mode::Enforce), 1);
    assert_eq!(c.by_rule().len(), 3);
    assert_eq!((c.total(), c.suppressed(), c.written()), (4, 1, 3));
    log.shutdown().await;
}

#[test]
fn throttle_lets_one_through_per_second() {
    let t = Throttle::new();
    assert!(t.allow());
    assert!(!t.allow());
    assert!(!t.allow());
}

// ---- rotation -------------------------------------------------------------------------

fn rotated(path: &Path, n: usize) -> PathBuf {
    PathBuf::from(format!("{}.{n}", path.display()))
}

/// Every line of every file in `paths`, parsed (a split or torn record fails here).
fn all_lines(paths: &[PathBuf]) -> Vec<Value> {
    paths
        .iter()
        .filter(|p| p.exists())
        .flat_map(|p| lines(p))
        .collect()
}

#[tokio::test]
async fn file_sink_rotates_by_size_without_losing_or_splitting_a_record() {
    let dir = TempDir::new("rotate");
    let path = dir.file();
    let max = 4096;
    let config = AuditConfig {
        file_max_size: max,
        file_keep: 100,
        ..file_config(&path, "0", 10_000)
    };
    let log = AuditLog::start(&config).unwrap();
    // ~400 bytes a line: about ten lines per file, ~20 files; flushes in between give the
    // writer both small batches and big ones.
    let n = 200;
    for id in 0..n {
        log.record(with_id(id));
        if id % 37 == 0 {
            log.flush().await;
        }
    }
    log.flush().await;
    assert_eq!(log.counters().written(), n as u64);
    log.shutdown().await;

    let mut files = vec![path.clone()];
    files.extend((1..=100).map(|k| rotated(&path, k)).filter(|p| p.exists()));
    assert!(
        files.len() > 5,
        "expected several rotated files, got {files:?}"
    );
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len();
        assert!(len <= max, "{} is {len} bytes, over {max}", f.display());
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{} ends mid-line",
            f.display()
        );
    }
    // Oldest file first: PATH.N ... PATH.1, PATH.
    files.reverse();
    let mut ids: Vec<i64> = all_lines(&files)
        .iter()
        .map(|v| v["request_id"].as_i64().unwrap())
        .collect();
    let in_order = ids.clone();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..n as i64).collect::<Vec<_>>(),
        "a record was lost or doubled"
    );
    assert_eq!(in_order, ids, "rotation reordered records");
}

#[tokio::test]
async fn file_sink_keeps_at_most_file_keep_rotated_files() {
    let dir = TempDir::new("keep");
    let path = dir.file();
    let config = AuditConfig {
        file_max_size: 4096,
        file_keep: 2,
        ..file_config(&path, "0", 10_000)
    };
    let log = AuditLog::start(&config).unwrap();
    for id in 0..100 {
        log.record(with_id(id));
        log.flush().await;
    }
    log.shutdown().await;
    assert!(path.exists() && rotated(&path, 1).exists() && rotated(&path, 2).exists());
    assert!(!rotated(&path, 3).exists());
    // The newest records survive, in order, none torn.
    let files = [rotated(&path, 2), rotated(&path, 1), path.clone()];
    let ids: Vec<i64> = all_lines(&files)
        .iter()
        .map(|v| v["request_id"].as_i64().unwrap())
        .collect();
    assert_eq!(*ids.last().unwrap(), 99);
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
}

#[tokio::test]
async fn rotation_continues_an_existing_file_and_counts_its_size() {
    let dir = TempDir::new("existing");
    let path = dir.file();
    std::fs::write(&path, "x".repeat(4000) + "\n").unwrap();
    let config = AuditConfig {
        file_max_size: 4096,
        ..file_config(&path, "0", 100)
    };
    let log = AuditLog::start(&config).unwrap();
    log.record(with_id(1));
    log.shutdown().await;
    // The old content was full: the record went to a fresh file.
    assert_eq!(
        std::fs::read_to_string(rotated(&path, 1)).unwrap().len(),
        4001
    );
    assert_eq!(lines(&path).len(), 1);
}

#[cfg(unix)]
#[tokio::test]
async fn failed_rotation_loses_nothing() {
    use std::os::unix::fs::PermissionsExt;
    // Root ignores directory permissions: nothing to test then.
    let dir = TempDir::new("rofail");
    let probe = dir.0.join("probe");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o500)).unwrap();
    let root = std::fs::write(&probe, "x").is_ok();
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    if root {
        return;
    }
    let path = dir.file();
    let config = AuditConfig {
        file_max_size: 4096,
        ..file_config(&path, "0", 1000)
    };
    let log = AuditLog::start(&config).unwrap();
    // A read-only directory: renames fail; records keep going to the same file.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o500)).unwrap();
    for id in 0..30 {
        log.record(with_id(id));
        log.flush().await;
    }
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    log.shutdown().await;
    assert_eq!(lines(&path).len(), 30);
}

// ---- syslog ---------------------------------------------------------------------------

#[cfg(unix)]
fn syslog_socket(dir: &TempDir) -> (PathBuf, std::os::unix::net::UnixDatagram) {
    let path = dir.0.join("log.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (path, sock)
}

#[cfg(unix)]
fn recv(sock: &std::os::unix::net::UnixDatagram) -> String {
    let mut buf = vec![0u8; 65536];
    let n = sock.recv(&mut buf).unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// The JSON after a syslog header (the first `{`).
fn body(msg: &str) -> Value {
    serde_json::from_str(&msg[msg.find('{').unwrap()..]).unwrap()
}

#[cfg(unix)]
#[tokio::test]
async fn syslog_sink_sends_one_rfc3164_datagram_per_record() {
    let dir = TempDir::new("syslog");
    let (path, sock) = syslog_socket(&dir);
    let config = AuditConfig {
        sink: SinkSpec::Syslog,
        syslog_socket: path,
        syslog_facility: "local3".parse().unwrap(),
        dedup_window: Duration::ZERO,
        ..AuditConfig::default()
    };
    let log = AuditLog::start(&config).unwrap();
    log.record(with_id(1));
    log.record(ViolationRecord {
        action: Action::Warn,
        ..with_id(2)
    });
    log.flush().await;
    let pid = std::process::id();
    let first = recv(&sock);
    // local3 (19) * 8 + warning (4) = 156; notice (5) = 157.
    assert!(first.starts_with("<156>"), "{first}");
    assert!(
        first.contains(&format!(" mongoguard[{pid}]: {{")),
        "{first}"
    );
    assert!(!first.ends_with('\n'));
    assert_eq!(body(&first)["request_id"], 1);
    let second = recv(&sock);
    assert!(second.starts_with("<157>"), "{second}");
    assert_eq!(body(&second)["request_id"], 2);
    assert_eq!(log.counters().written(), 2);
    log.shutdown().await;
}

#[cfg(unix)]
#[tokio::test]
async fn syslog_rfc5424_and_reconnect_after_the_socket_comes_back() {
    let dir = TempDir::new("syslog5424");
    let (path, sock) = syslog_socket(&dir);
    let config = AuditConfig {
        sink: SinkSpec::Syslog,
        syslog_socket: path.clone(),
        syslog_format: Some(SyslogFormat::Rfc5424),
        dedup_window: Duration::ZERO,
        ..AuditConfig::default()
    };
    let log = AuditLog::start(&config).unwrap();
    log.record(with_id(1));
    log.flush().await;
    let msg = recv(&sock);
    let pid = std::process::id();
    // local0 (16) * 8 + 4 = 132.
    assert!(msg.starts_with("<132>1 "), "{msg}");
    assert!(
        msg.contains(&format!(" mongoguard {pid} violation - {{")),
        "{msg}"
    );
    assert_eq!(body(&msg)["request_id"], 1);
    // syslogd restarts: a new socket at the same path.
    drop(sock);
    std::fs::remove_file(&path).unwrap();
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    log.record(with_id(2));
    log.flush().await;
    assert_eq!(body(&recv(&sock))["request_id"], 2);
    assert_eq!(log.counters().written(), 2);
    log.shutdown().await;
}

#[tokio::test]
async fn syslog_missing_socket_is_a_startup_error() {
    let dir = TempDir::new("nosock");
    let path = dir.0.join("missing.sock");
    let config = AuditConfig {
        events_sink: SinkSpec::Syslog,
        sink: SinkSpec::None,
        syslog_socket: path.clone(),
        ..AuditConfig::default()
    };
    let err = AuditLog::start(&config).unwrap_err();
    assert!(matches!(err, AuditError::Syslog { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn syslog_over_udp_on_loopback() {
    let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let addr = server.local_addr().unwrap();
    let config = AuditConfig {
        sink: format!("syslog+udp://{addr}").parse().unwrap(),
        dedup_window: Duration::ZERO,
        ..AuditConfig::default()
    };
    let log = AuditLog::start(&config).unwrap();
    log.record(with_id(7));
    log.flush().await;
    let mut buf = [0u8; 65536];
    let n = server.recv(&mut buf).unwrap();
    let msg = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(msg.starts_with("<132>1 "), "{msg}");
    assert_eq!(body(msg)["request_id"], 7);
    log.shutdown().await;
}

// ---- events ---------------------------------------------------------------------------

fn client() -> std::net::SocketAddr {
    "192.0.2.10:50123".parse().unwrap()
}

#[tokio::test]
async fn events_go_to_their_own_stream() {
    let dir = TempDir::new("events");
    let events = dir.0.join("events.log");
    let config = AuditConfig {
        events_sink: SinkSpec::File(events.clone()),
        ..file_config(&dir.file(), "0", 100)
    };
    let log = AuditLog::start(&config).unwrap();
    assert!(log.events_enabled());
    log.event(Event::ConnectionOpened { client: client() });
    log.record(with_id(1));
    log.event(Event::ClientHandshake {
        client: client(),
        app: Some("billing".into()),
        driver: Some("PyMongo 4.8.0".into()),
    });
    log.event(Event::AuthFailed {
        client: client(),
        user: Some("admin.app".into()),
    });
    log.event(Event::AuthSucceeded {
        client: client(),
        user: "admin.app".into(),
        mechanism: "SCRAM-SHA-256",
        identity: "default".into(),
    });
    log.event(Event::PolicyReloaded {
        source: "file:/etc/mongoguard/policy.toml".into(),
        hash: Some(0x1234),
        trigger: "signal",
    });
    log.event(Event::ConnectionClosed {
        client: client(),
        duration: Duration::from_millis(20),
        reason: CloseReason::ClientClosed,
    });
    log.flush().await;
    let ev = lines(&events);
    let names: Vec<&str> = ev.iter().map(|v| v["event"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "connection_opened",
            "client_handshake",
            "auth_failed",
            "auth_succeeded",
            "policy_reloaded",
            "connection_closed"
        ]
    );
    assert_eq!(ev[0]["client"], "192.0.2.10:50123");
    assert_eq!(ev[1]["app"], "billing");
    assert_eq!(ev[2]["user"], "admin.app");
    assert_eq!(ev[3]["identity"], "default");
    assert_eq!(ev[4]["hash"], "0000000000001234");
    assert_eq!(ev[5]["reason"], "client_closed");
    assert_eq!(log.event_counters().written(), 6);
    // Violations stay in theirs.
    let v = lines(&dir.file());
    assert_eq!(v.len(), 1);
    assert!(v[0].get("event").is_none());
    log.shutdown().await;
}

#[test]
fn events_off_by_default_cost_nothing() {
    let config = AuditConfig {
        sink: SinkSpec::None,
        ..AuditConfig::default()
    };
    let log = AuditLog::start(&config).unwrap();
    assert!(!log.events_enabled());
    log.event(Event::ConnectionOpened { client: client() });
    let c = log.event_counters();
    assert_eq!((c.written(), c.dropped()), (0, 0));
}

#[tokio::test]
async fn a_full_event_queue_drops_and_counts() {
    let dir = TempDir::new("evfull");
    let config = AuditConfig {
        events_sink: SinkSpec::File(dir.0.join("events.log")),
        sink: SinkSpec::None,
        queue_capacity: 2,
        ..AuditConfig::default()
    };
    let log = AuditLog::start(&config).unwrap();
    for _ in 0..5 {
        log.event(Event::ConnectionOpened { client: client() });
    }
    log.flush().await;
    let c = log.event_counters();
    assert_eq!((c.written(), c.dropped()), (2, 3));
    log.shutdown().await;
}
