//! Closing at shutdown (every record and pending summary written, bounded on a stuck sink) and
//! reopening file sinks (SIGHUP after logrotate renamed them).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_through_an_arc_writes_records_and_open_summaries_then_refuses_more() {
    let dir = TempDir::new("close");
    let events = dir.0.join("events.log");
    let config = AuditConfig {
        events_sink: SinkSpec::File(events.clone()),
        ..file_config(&dir.file(), "1h", 100)
    };
    let log = std::sync::Arc::new(AuditLog::start(&config).unwrap());
    for id in 0..5 {
        log.record(with_id(id));
    }
    log.event(Event::ConnectionOpened { client: client() });
    tokio::time::timeout(Duration::from_secs(10), log.close(Duration::from_secs(5)))
        .await
        .expect("close is bounded");
    // Everything is on disk when close returns: no flush, no drop of the log.
    let got = lines(&dir.file());
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["request_id"], 0);
    assert_eq!(got[1]["suppressed"], 4);
    assert_eq!(lines(&events).len(), 1);
    // Closed: later records are dropped and counted, and close again returns at once.
    log.record(ViolationRecord {
        rule_id: "Q001",
        ..with_id(9)
    });
    log.close(Duration::from_secs(5)).await;
    log.flush().await;
    assert_eq!(lines(&dir.file()).len(), 2);
    assert_eq!(log.counters().dropped(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_after_a_rename_writes_to_a_new_file_at_the_path() {
    let dir = TempDir::new("reopen");
    let events = dir.0.join("events.log");
    let config = AuditConfig {
        events_sink: SinkSpec::File(events.clone()),
        ..file_config(&dir.file(), "0", 100)
    };
    let log = AuditLog::start(&config).unwrap();
    log.record(with_id(1));
    log.event(Event::ConnectionOpened { client: client() });
    log.flush().await;
    // logrotate without copytruncate: rename, then signal.
    let old = dir.0.join("violations.log.1");
    let old_events = dir.0.join("events.log.1");
    std::fs::rename(dir.file(), &old).unwrap();
    std::fs::rename(&events, &old_events).unwrap();
    log.reopen();
    log.record(with_id(2));
    log.event(Event::ConnectionOpened { client: client() });
    log.flush().await;
    let ids = |p: &Path| -> Vec<i64> {
        lines(p)
            .iter()
            .map(|v| v["request_id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&old), [1], "the renamed file is left alone");
    assert_eq!(ids(&dir.file()), [2], "a new file at the configured path");
    assert_eq!(lines(&old_events).len(), 1);
    assert_eq!(lines(&events).len(), 1);
    // Reopening a file that was not renamed appends to it.
    log.reopen();
    log.record(with_id(3));
    log.flush().await;
    assert_eq!(ids(&dir.file()), [2, 3]);
    log.close(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_when_the_path_cannot_be_created_keeps_writing_to_the_open_file() {
    let dir = TempDir::new("reopen-fail");
    let sub = dir.0.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join("violations.log");
    let log = AuditLog::start(&file_config(&path, "0", 100)).unwrap();
    log.record(with_id(1));
    log.flush().await;
    // The directory is renamed away: the path cannot be created.
    let moved = dir.0.join("moved");
    std::fs::rename(&sub, &moved).unwrap();
    log.reopen();
    log.record(with_id(2));
    log.flush().await;
    assert_eq!(
        lines(&moved.join("violations.log")).len(),
        2,
        "nothing lost"
    );
    // Once the path can be created again, the next batch moves there.
    std::fs::create_dir_all(&sub).unwrap();
    log.record(with_id(3));
    log.flush().await;
    assert_eq!(lines(&path).len(), 1);
    assert_eq!(log.counters().written(), 3);
    log.close(Duration::from_secs(5)).await;
}

/// A FIFO opened read-write by the test and never read: once its buffer is full, every write
/// to it blocks, as a file on a stuck network mount or a pipe nobody drains would.
#[cfg(target_os = "linux")]
fn stuck_fifo(dir: &TempDir) -> (PathBuf, std::fs::File) {
    let path = dir.0.join("stuck.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    // Read-write: opening does not wait for a writer, and the pipe has a reader.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    (path, reader)
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_is_bounded_when_the_sink_blocks_or_fails() {
    let dir = TempDir::new("stuck");
    let (fifo, reader) = stuck_fifo(&dir);
    let config = AuditConfig {
        // A failing sink on the other stream.
        events_sink: SinkSpec::File("/dev/full".into()),
        ..file_config(&fifo, "1h", 10_000)
    };
    let log = AuditLog::start(&config).unwrap();
    // Far more than a pipe buffer (64 KiB): the writer blocks in write(2).
    for id in 0..2000 {
        log.record(ViolationRecord {
            database: format!("db{id}"),
            ..with_id(id)
        });
        log.event(Event::ConnectionOpened { client: client() });
    }
    let start = std::time::Instant::now();
    tokio::time::timeout(
        Duration::from_secs(10),
        log.close(Duration::from_millis(500)),
    )
    .await
    .expect("close returns after its bound even though the sink blocks");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}: it did wait");
    assert!(log.event_counters().write_errors() >= 1);
    // Unblock the writer (no reader left: EPIPE) so the runtime can end.
    drop(reader);
}
