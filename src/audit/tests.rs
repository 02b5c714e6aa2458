//! The audit log end to end: queue, writer task, file sink, dedup timing, counters.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use serde_json::Value;

use super::{record::tests::sample, *};

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
    assert!(matches!(err, AuditError::MissingDirectory { .. }), "{err}");
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
