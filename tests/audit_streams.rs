//! The two audit streams end to end: violation records and events (connections, handshakes,
//! authentication, policy reloads) written to files by a running proxy, and nothing
//! sensitive — passwords, SASL payloads, literal filter values — in either of them.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bson::{doc, Document};
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    app::Proxy,
    audit::SinkSpec,
    config::{Config, Mode},
};
use mongoguard_standin::{StandIn, StandInConfig};
use serde_json::Value;

const UPSTREAM: (&str, &str) = ("app", "upstream-Secret-7731");
const USER: (&str, &str) = ("alice", "alice-Secret-5150");
const WRONG_PASSWORD: &str = "wrong-Secret-9009";
const LITERAL: &str = "literal-Secret-4242";

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("mongoguard-streams-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

async fn client(addr: std::net::SocketAddr, password: &str) -> Client {
    let uri = format!(
        "mongodb://{}:{password}@{addr}/?authSource=admin&appName=billing",
        USER.0
    );
    let mut opts = ClientOptions::parse(&uri).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(opts).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_violations_carry_who_and_what_but_no_secret() {
    let dir = temp_dir("pooled");
    let violations = dir.join("violations.log");
    let events = dir.join("events.log");
    let users = dir.join("users.toml");
    mongoguard::auth::users::add(&users, USER.0, USER.1, "admin").unwrap();
    let standin = StandIn::start(StandInConfig {
        users: vec![(UPSTREAM.0.into(), UPSTREAM.1.into())],
        ..Default::default()
    })
    .await
    .unwrap();
    let upstream = format!(
        "mongodb://{}:{}@{}/?authSource=admin",
        UPSTREAM.0,
        UPSTREAM.1,
        standin.addr()
    );
    let mut cfg = Config::for_upstream(&upstream).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.auth.users_file = Some(users);
    cfg.audit.sink = SinkSpec::File(violations.clone());
    cfg.audit.events_sink = SinkSpec::File(events.clone());
    cfg.audit.dedup_window = Duration::ZERO;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let addr = proxy.local_addr();

    // A good client: a warned query and a blocked delete, both with the literal.
    let good = client(addr, USER.1).await;
    let coll = good.database("shop").collection::<Document>("orders");
    coll.insert_one(doc! {"code": LITERAL}).await.unwrap();
    coll.find_one(doc! {"code": {"$ne": LITERAL}})
        .await
        .unwrap();
    let blocked = coll
        .delete_many(doc! {"$or": [{"code": LITERAL}, {"_id": {"$exists": true}}]})
        .await;
    assert!(blocked.is_err(), "W003 blocks");
    good.shutdown().await;

    // A client with a wrong password.
    let bad = client(addr, WRONG_PASSWORD).await;
    let err = bad
        .database("shop")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Authentication failed"), "{err}");
    bad.shutdown().await;

    let audit = proxy.audit();
    proxy.shutdown().await;
    audit.flush().await;

    let v = read_lines(&violations);
    let rules: Vec<&str> = v.iter().map(|r| r["rule"].as_str().unwrap()).collect();
    assert!(
        rules.contains(&"Q001") && rules.contains(&"W003"),
        "{rules:?}"
    );
    let w003 = v.iter().find(|r| r["rule"] == "W003").unwrap();
    assert_eq!(w003["user"], "admin.alice");
    assert_eq!(w003["app"], "billing");

    let e = read_lines(&events);
    let of = |name: &str| -> Vec<&Value> { e.iter().filter(|x| x["event"] == name).collect() };
    assert!(!of("connection_opened").is_empty());
    assert_eq!(
        of("connection_opened").len(),
        of("connection_closed").len(),
        "{e:#?}"
    );
    assert!(of("client_handshake").iter().all(|x| x["app"] == "billing"));
    let ok = of("auth_succeeded");
    assert!(!ok.is_empty(), "{e:#?}");
    assert!(ok.iter().all(|x| x["user"] == "admin.alice"
        && x["identity"] == "default"
        && x["mechanism"] == "SCRAM-SHA-256"));
    let failed = of("auth_failed");
    assert!(!failed.is_empty(), "{e:#?}");
    assert!(
        failed.iter().all(|x| x["user"] == "admin.alice"),
        "{failed:?}"
    );
    let client = ok[0]["client"].as_str().unwrap();
    assert!(client.starts_with("127.0.0.1:"), "{client}");

    // Nothing sensitive in either stream.
    for path in [&violations, &events] {
        let text = std::fs::read_to_string(path).unwrap();
        for secret in [USER.1, UPSTREAM.1, WRONG_PASSWORD, LITERAL, "Secret"] {
            assert!(!text.contains(secret), "{secret:?} in {}", path.display());
        }
        // SCRAM messages: client-first "n,,n=...,r=", client-final "c=biws,r=...,p=" (also
        // base64-encoded as BinData would be rendered), server "r=...,s=...,i=".
        for marker in [
            "n,,n=", "c=biws", ",r=", ",p=", ",s=", ",i=", "payload", "biws",
        ] {
            assert!(!text.contains(marker), "{marker:?} in {}", path.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bounded wait for the reload poller (not a timing assertion).
async fn wait_until(f: impl Fn() -> bool) {
    for _ in 0..800 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out");
}

#[tokio::test]
async fn policy_reloads_are_events() {
    let dir = temp_dir("reload");
    let file = dir.join("policy.toml");
    let events = dir.join("events.log");
    std::fs::write(&file, "extends = \"standard\"\n").unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.policy.file = Some(file.clone());
    config.policy.reload_poll = Duration::from_millis(50);
    config.audit.sink = SinkSpec::None;
    config.audit.events_sink = SinkSpec::File(events.clone());
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let audit = proxy.audit();
    let stats = proxy.stats();

    std::fs::write(&file, "extends = \"standard\"\nmode = \"audit\"\n").unwrap();
    wait_until(|| stats.policy_reloads.get() >= 1).await;
    // A different length changes the file even within one mtime tick.
    std::fs::write(
        &file,
        "extends = \"standard\"\n[rules]\nW003 = \"maybe-not\"\n",
    )
    .unwrap();
    wait_until(|| stats.policy_reload_failures.get() >= 1).await;
    audit.flush().await;
    proxy.shutdown().await;

    let e = read_lines(&events);
    let ok = e
        .iter()
        .find(|x| x["event"] == "policy_reloaded")
        .expect("reload event");
    assert_eq!(ok["trigger"], "file_change");
    assert_eq!(ok["hash"].as_str().unwrap().len(), 16);
    assert!(ok["source"].as_str().unwrap().contains("policy.toml"));
    let bad = e
        .iter()
        .find(|x| x["event"] == "policy_reload_failed")
        .expect("failure event");
    assert!(bad["error"].as_str().unwrap().contains("W003"), "{bad}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends `n` deletes of everything (W003, blocked: code 65001) on one raw connection.
async fn blocked_deletes(addr: std::net::SocketAddr, n: i32) {
    use futures::StreamExt;
    use mongoguard::wire::{builder::MsgBuilder, MessageCodec, OpMsg};
    use tokio::io::AsyncWriteExt;
    let (r, mut w) = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap()
        .into_split();
    let mut read = tokio_util::codec::FramedRead::new(r, MessageCodec::default());
    for id in 1..=n {
        let cmd = bson::rawdoc! {"delete": "t", "$db": "shop", "deletes": [{"q": {}, "limit": 0}]};
        w.write_all(&MsgBuilder::new(cmd).encode(id, 0))
            .await
            .unwrap();
        let frame = tokio::time::timeout(Duration::from_secs(20), read.next())
            .await
            .expect("a reply")
            .expect("open")
            .expect("valid");
        let body = OpMsg::parse(frame.bytes()).unwrap().body().to_owned();
        assert_eq!(body.get_i32("code").unwrap_or(0), 65001, "{body:?}");
    }
}

/// What `main` does: the proxy runs on its own runtime, shuts down gracefully, and the
/// runtime ends right after (tasks still running then are cancelled). Every record and every
/// pending dedup summary must be in the file, in every run.
#[test]
fn records_and_dedup_summaries_survive_shutdown_in_every_run() {
    const RUNS: usize = 10;
    const REQUESTS: i32 = 20;
    let dir = temp_dir("shutdown");
    let mut missing = Vec::new();
    for run in 0..RUNS {
        let violations = dir.join(format!("violations-{run}.log"));
        let events = dir.join(format!("events-{run}.log"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let standin = StandIn::start(StandInConfig::default()).await.unwrap();
            let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
            cfg.audit.sink = SinkSpec::File(violations.clone());
            cfg.audit.events_sink = SinkSpec::File(events.clone());
            cfg.audit.dedup_window = Duration::from_secs(3600);
            cfg.validate().unwrap();
            let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
            blocked_deletes(proxy.local_addr(), REQUESTS).await;
            tokio::time::timeout(Duration::from_secs(30), proxy.shutdown())
                .await
                .expect("shutdown is bounded");
        });
        drop(runtime);
        let v = read_lines(&violations);
        let records = v.iter().filter(|r| r.get("suppressed").is_none()).count();
        let suppressed: Vec<i64> = v
            .iter()
            .filter_map(|r| r.get("suppressed")?.as_i64())
            .collect();
        let e = read_lines(&events);
        let closed = e
            .iter()
            .filter(|x| x["event"] == "connection_closed")
            .count();
        if records != 1 || suppressed != [i64::from(REQUESTS) - 1] || closed != 1 {
            missing.push(format!(
                "run {run}: {records} record(s), summaries {suppressed:?}, {closed} close event(s)"
            ));
        }
    }
    assert!(missing.is_empty(), "lost at shutdown: {missing:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A violation sink that blocks (a FIFO nobody reads, like a stuck network mount) and an
/// event sink that fails (/dev/full) must not hold the proxy's shutdown.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_blocks_or_fails_does_not_hang_shutdown() {
    let dir = temp_dir("stuck");
    let fifo = dir.join("violations.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    // Opened read-write and never read: the pipe has a reader, so writes block once its
    // buffer (64 KiB) is full.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.audit.sink = SinkSpec::File(fifo.clone());
    cfg.audit.events_sink = SinkSpec::File("/dev/full".into());
    cfg.audit.dedup_window = Duration::ZERO;
    cfg.proxy.drain_timeout = Duration::from_secs(2);
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let audit = proxy.audit();
    // About 400 bytes per record: 600 records are several pipe buffers.
    blocked_deletes(proxy.local_addr(), 600).await;
    let start = std::time::Instant::now();
    // drain_timeout plus a margin for the audit close (bounded by a few seconds).
    let bound = Duration::from_secs(2) + Duration::from_secs(8);
    if tokio::time::timeout(bound, proxy.shutdown()).await.is_err() {
        drop(reader);
        panic!("shutdown still waiting on the audit sink after {bound:?}");
    }
    eprintln!("shutdown took {:?}", start.elapsed());
    assert!(audit.event_counters().write_errors() >= 1);
    // Let the blocked write fail (no reader left) so the runtime can end.
    drop(reader);
    let _ = std::fs::remove_dir_all(&dir);
}

/// logrotate without copytruncate: the files are renamed, then SIGHUP calls `reopen`; the
/// renamed files keep what was written, new files at the configured paths get what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_after_a_rename_writes_to_new_files_at_the_configured_paths() {
    let dir = temp_dir("reopen");
    let violations = dir.join("violations.log");
    let events = dir.join("events.log");
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.audit.sink = SinkSpec::File(violations.clone());
    cfg.audit.events_sink = SinkSpec::File(events.clone());
    cfg.audit.dedup_window = Duration::ZERO;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let audit = proxy.audit();
    blocked_deletes(proxy.local_addr(), 1).await;
    audit.flush().await;
    let (old_v, old_e) = (dir.join("violations.log.1"), dir.join("events.log.1"));
    std::fs::rename(&violations, &old_v).unwrap();
    std::fs::rename(&events, &old_e).unwrap();
    audit.reopen();
    blocked_deletes(proxy.local_addr(), 2).await;
    proxy.shutdown().await;
    assert_eq!(read_lines(&old_v).len(), 1);
    assert_eq!(read_lines(&violations).len(), 2);
    let opened = |p: &Path| {
        read_lines(p)
            .iter()
            .filter(|x| x["event"] == "connection_opened")
            .count()
    };
    assert_eq!((opened(&old_e), opened(&events)), (1, 1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `DIR/violations.pipe`, a named pipe (mkfifo).
fn named_pipe(dir: &Path) -> PathBuf {
    let fifo = dir.join("violations.pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    fifo
}

/// A file sink whose path is a named pipe nobody reads yet (a log shipper not started, or
/// one that died): opening it for writing blocked until a reader came, so mongoguard hung in
/// its start, not listening, for ever (the unit is Type=simple: "active"). Nothing that
/// writes a sink may wait on its reader; the start must end, here with an error naming the
/// sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_on_a_pipe_without_reader_does_not_hang_the_start() {
    let dir = temp_dir("mg-audit-fifo");
    let fifo = named_pipe(&dir);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = mongoguard::config::Config::for_upstream(&standin.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::File(fifo.clone());
    let start = tokio::spawn(mongoguard::app::Proxy::start(std::sync::Arc::new(config)));
    let ended = tokio::time::timeout(Duration::from_secs(10), start).await;
    if ended.is_err() {
        // Release the blocked open before failing.
        let _ = std::fs::File::open(&fifo);
    }
    let started = ended.expect("the start ends with a sink on a pipe nobody reads");
    match started.unwrap() {
        Ok(proxy) => {
            proxy.shutdown().await;
            panic!("started with an audit sink nobody can read");
        }
        Err(e) => assert!(e.to_string().contains("violations.pipe"), "{e}"),
    }
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A named pipe that has a reader (a log shipper reading it) is a sink like a file: the
/// start opens it for blocking writes, and a violation record arrives whole, on its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_on_a_pipe_with_a_reader_gets_whole_lines() {
    use std::io::BufRead;
    let dir = temp_dir("mg-audit-fifo-read");
    let fifo = named_pipe(&dir);
    // The reader. It holds the pipe open for reading (without waiting: O_NONBLOCK) before
    // the proxy starts, so the proxy's "is anyone reading?" probe sees it whatever the
    // threads' timing (a reader thread that had not reached its open yet made the start
    // refuse the pipe on a loaded machine); then it reads through a blocking descriptor,
    // whose open waits for the proxy's.
    let (tx, rx) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        use std::os::unix::fs::OpenOptionsExt;
        let holder = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        ready_tx.send(()).unwrap();
        let reader = std::io::BufReader::new(std::fs::File::open(path).unwrap());
        drop(holder);
        for line in reader.lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the reader holds the pipe");
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = mongoguard::config::Config::for_upstream(&standin.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::File(fifo.clone());
    let proxy = tokio::time::timeout(
        Duration::from_secs(20),
        mongoguard::app::Proxy::start(std::sync::Arc::new(config)),
    )
    .await
    .expect("the start ends")
    .expect("a pipe with a reader is accepted");
    blocked_deletes(proxy.local_addr(), 1).await;
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a violation record through the pipe");
    let record: Value = serde_json::from_str(&line).expect("one whole JSON record per line");
    assert_eq!(record["rule"], "W003", "{record}");
    proxy.shutdown().await;
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
