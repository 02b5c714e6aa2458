//! Passthrough sessions run on `proxy.threads` event loops (`mongoguard::proxy::loops`): each
//! client is served there, the threads end with the proxy, and `proxy.work_stealing` (and
//! pooled mode) start none.
//!
//! The threads are counted by name in `/proc/self/task`, process-wide, so the tests of this
//! file take turns (`SERIAL`).

mod support;

use std::{sync::Arc, time::Duration};

use bson::doc;
use mongoguard::{app::Proxy, config::Config};
use mongoguard_standin::{StandIn, StandInConfig};
use support::raw::RawConn;
use tokio::io::AsyncReadExt;

/// A safety net against hangs, not a performance assertion.
const BOUND: Duration = Duration::from_secs(20);

/// Held for a whole test: the thread counts are process-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The names of this process's session threads.
fn session_threads() -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let comm = task.expect("task").path().join("comm");
        // A thread that ended between the listing and the read has no comm any more.
        if let Ok(name) = std::fs::read_to_string(comm) {
            let name = name.trim_end().to_string();
            if name.starts_with("mg-session-") {
                names.push(name);
            }
        }
    }
    names.sort_unstable();
    names
}

async fn config(tweak: impl FnOnce(&mut Config)) -> (StandIn, Config) {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    tweak(&mut config);
    (standin, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_threads_serve_every_client_and_end_with_the_proxy() {
    let _serial = SERIAL.lock().await;
    let (_standin, config) = config(|c| c.proxy.threads = 3).await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    assert_eq!(
        session_threads(),
        ["mg-session-1", "mg-session-2", "mg-session-3"],
        "proxy.threads = 3 starts three named session threads"
    );
    let mut clients = Vec::new();
    for i in 0..7 {
        let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
        let reply = tokio::time::timeout(BOUND, c.command(doc! {"ping": 1, "$db": "admin"}))
            .await
            .expect("answered");
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "client {i}: {reply:?}");
        clients.push(c);
    }
    assert_eq!(proxy.stats().active.get(), 7);
    tokio::time::timeout(BOUND, proxy.shutdown())
        .await
        .expect("shutdown is bounded");
    // Idle at the drain: every client is closed.
    for (i, mut c) in clients.into_iter().enumerate() {
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(BOUND, c.stream_mut().read(&mut byte))
            .await
            .expect("closed in time");
        assert!(
            matches!(n, Ok(0) | Err(_)),
            "client {i} still open after shutdown"
        );
    }
    // Shutdown waited for the loops; the threads exit right after saying so.
    let deadline = tokio::time::Instant::now() + BOUND;
    while !session_threads().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "session threads left after shutdown: {:?}",
            session_threads()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_stealing_serves_clients_without_session_threads() {
    let _serial = SERIAL.lock().await;
    let (_standin, config) = config(|c| {
        c.proxy.threads = 3;
        c.proxy.work_stealing = true;
    })
    .await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
    let reply = tokio::time::timeout(BOUND, c.command(doc! {"ping": 1, "$db": "admin"}))
        .await
        .expect("answered");
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply:?}");
    assert_eq!(
        session_threads(),
        Vec::<String>::new(),
        "work_stealing: no session thread, whatever proxy.threads says"
    );
    tokio::time::timeout(BOUND, proxy.shutdown())
        .await
        .expect("shutdown is bounded");
}
