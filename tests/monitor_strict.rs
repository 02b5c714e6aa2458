//! Pooled mode's topology monitor against a stand-in replica set as strict as mongod: mongod
//! refuses `client` metadata in any hello after a connection's first
//! (ClientMetadataCannotBeMutated, 186; src/mongo/rpc/metadata/client_metadata.cpp in
//! mongodb/mongo). A monitor that sends it in every heartbeat gets every other check refused,
//! marks the member down, reconnects, and logs "primary changed" over and over.
//! Here: an idle proxy with a 50 ms heartbeat keeps its monitoring connections, every member
//! stays up and the primary never changes.

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use bson::doc;
use mongodb::{bson::Document, options::ClientOptions, Client};
use mongoguard::{
    app::Proxy,
    config::{Config, Mode},
};
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandInConfig};

const BOUND: Duration = Duration::from_secs(60);

/// Every log line of this test process (the proxy runs in it).
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| Mutex::new(Vec::new()))
}

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        logs().lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("mongoguard=info")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

fn log_lines(needle: &str) -> usize {
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    text.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_monitor_keeps_its_connections_and_the_primary() {
    capture_logs();
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "strict0".into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    let mut cfg = Config::for_upstream(&rs.uri()).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.auth.allow_unauthenticated = true;
    cfg.upstream.heartbeat_interval = Duration::from_millis(50);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();

    // Warm up: a write through the proxy (the primary is known), then every monitor has
    // checked its member a few times on one connection.
    let mut opts = ClientOptions::parse(format!("mongodb://{}", proxy.local_addr()))
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(30));
    let client = Client::with_options(opts).unwrap();
    tokio::time::timeout(
        BOUND,
        client
            .database("strict")
            .collection::<Document>("c")
            .insert_one(doc! {"x": 1}),
    )
    .await
    .unwrap()
    .unwrap();
    tokio::time::timeout(BOUND, async {
        while rs
            .members()
            .iter()
            .any(|m| m.stats().command_count("hello") < 6)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the monitors never checked every member");
    let changed_before = log_lines("upstream primary changed");
    let down_before = log_lines("upstream server is down");
    for m in rs.members() {
        m.stats().reset();
    }

    // Idle until every member has been checked at least 20 more times (about a second at
    // 50 ms; bounded, not timed), then nothing may have reconnected or changed.
    let idle = Instant::now();
    tokio::time::timeout(BOUND, async {
        while rs
            .members()
            .iter()
            .any(|m| m.stats().command_count("hello") < 20)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the monitors stopped checking their members");

    for (i, m) in rs.members().iter().enumerate() {
        let s = m.stats();
        let hellos = s.command_count("hello");
        println!(
            "member {i}: {hellos} heartbeats, {} new connections in {:?} idle",
            s.connections_accepted(),
            idle.elapsed()
        );
        assert_eq!(
            s.connections_accepted(),
            0,
            "member {i}: the monitor reconnected ({hellos} heartbeats)"
        );
    }
    assert_eq!(
        log_lines("upstream server is down") - down_before,
        0,
        "a member was marked down while idle"
    );
    assert_eq!(
        log_lines("upstream primary changed") - changed_before,
        0,
        "the primary \"changed\" while idle"
    );
    assert_eq!(rs.primary(), Some(0));
    proxy.shutdown().await;
    rs.shutdown().await;
}
