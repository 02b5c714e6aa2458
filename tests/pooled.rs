//! Pooled mode end to end: the Rust `mongodb` driver (and raw OP_MSG where the driver cannot
//! be made to do something) through mongoguard in pooled mode, in front of the stand-in with
//! authentication on. The stand-in's own counters show what reached the upstream: how many
//! connections and how many authentications. No test asserts on time.

mod support;

use std::{path::PathBuf, sync::Arc, time::Duration};

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::{Config, Mode},
    proxy::CHECKOUT_TIMEOUT_CODE,
};
use mongoguard_standin::{Fault, StandIn, StandInConfig};
use support::raw::{RawConn, EXHAUST_ALLOWED};

/// Safety net against hangs (not a performance assertion).
const BOUND: Duration = Duration::from_secs(60);

const UPSTREAM_USER: (&str, &str) = ("app", "apppw");
const CLIENT_USER: (&str, &str) = ("alice", "alicepw");

async fn standin() -> StandIn {
    standin_on("127.0.0.1:0".parse().unwrap()).await
}

async fn standin_on(listen: std::net::SocketAddr) -> StandIn {
    StandIn::start(StandInConfig {
        listen,
        users: vec![(UPSTREAM_USER.0.into(), UPSTREAM_USER.1.into())],
        ..Default::default()
    })
    .await
    .expect("start stand-in")
}

fn users_file() -> PathBuf {
    users_file_at().1
}

/// The users file and its path (for tests that change it).
fn users_file_at() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "mongoguard-pooled-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("users.toml");
    mongoguard::auth::users::add(&path, CLIENT_USER.0, CLIENT_USER.1, "admin").unwrap();
    (dir, path)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

struct Setup {
    pool_size: usize,
    checkout_timeout: Duration,
    unauthenticated: bool,
    per_user: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            pool_size: 2,
            checkout_timeout: Duration::from_secs(5),
            unauthenticated: false,
            per_user: 0,
        }
    }
}

async fn proxy(standin: &StandIn, setup: Setup) -> ProxyHandle {
    let upstream = format!(
        "mongodb://{}:{}@{}/?authSource=admin",
        UPSTREAM_USER.0,
        UPSTREAM_USER.1,
        standin.addr()
    );
    let mut cfg = Config::for_upstream(&upstream).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.pool.pool_size = setup.pool_size;
    cfg.pool.checkout_timeout = setup.checkout_timeout;
    cfg.upstream.reply_timeout = Duration::from_secs(30);
    cfg.auth.users_file = Some(users_file());
    cfg.auth.allow_unauthenticated = setup.unauthenticated;
    cfg.pool.max_connections_per_user = setup.per_user;
    // These tests count the stand-in's connections: the plan guard's own (explains) would
    // be one more, and it is tested in tests/plan_guard.rs.
    cfg.plan.enabled = mongoguard::config::PlanEnabled::Off;
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    Proxy::start(Arc::new(cfg))
        .await
        .expect("start pooled proxy")
}

async fn client(proxy: &ProxyHandle, user: Option<(&str, &str)>) -> Client {
    let uri = match user {
        Some((u, p)) => format!("mongodb://{u}:{p}@{}/?authSource=admin", proxy.local_addr()),
        None => format!("mongodb://{}", proxy.local_addr()),
    };
    let mut opts = ClientOptions::parse(&uri).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(opts).unwrap()
}

fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
            Some(w.code)
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_short_clients_share_a_few_authenticated_upstream_connections() {
    let standin = standin().await;
    let proxy = proxy(&standin, Setup::default()).await;
    let stats = standin.stats();
    let clients: i64 = 40;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let c = client(&proxy, Some(CLIENT_USER)).await;
        tasks.push(tokio::spawn(async move {
            let coll = c.database("pooled").collection::<Document>("short");
            coll.insert_one(doc! {"i": i}).await.unwrap();
            let found = coll.find_one(doc! {"i": i}).await.unwrap();
            assert!(found.is_some());
            c.shutdown().await;
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
    // 40 clients, each with its own connections and its own SCRAM conversation, reached the
    // stand-in through at most pool_size connections, each authenticated once.
    assert!(
        stats.connections_accepted() <= 2,
        "{}",
        stats.connections_accepted()
    );
    assert!(stats.authentications() <= 2, "{}", stats.authentications());
    assert!(stats.authentications() >= 1);
    let direct = Client::with_uri_str(format!(
        "mongodb://{}:{}@{}/?authSource=admin",
        UPSTREAM_USER.0,
        UPSTREAM_USER.1,
        standin.addr()
    ))
    .await
    .unwrap();
    let n = direct
        .database("pooled")
        .collection::<Document>("short")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(n, clients as u64);
    let (pool, _) = proxy.pool_stats().unwrap();
    assert_eq!(pool.in_use, 0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_is_answered_by_mongoguard_as_one_mongos() {
    let standin = standin().await;
    let proxy = proxy(&standin, Setup::default()).await;
    let c = client(&proxy, Some(CLIENT_USER)).await;
    let hello = c
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    assert_eq!(hello.get_str("msg").unwrap(), "isdbgrid");
    for absent in ["hosts", "setName", "topologyVersion", "compression"] {
        assert!(hello.get(absent).is_none(), "{absent} in {hello}");
    }
    assert_eq!(hello.get_i32("maxWireVersion").unwrap(), 21);
    assert!(hello.get_i32("connectionId").is_ok());
    let hellos_before = standin.stats().command_count("hello");
    for _ in 0..5 {
        c.database("admin")
            .run_command(doc! {"hello": 1})
            .await
            .unwrap();
    }
    assert_eq!(standin.stats().command_count("hello"), hellos_before);
    // Authentication commands after the handshake are refused.
    let err = c
        .database("admin")
        .run_command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
            "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: b"n,,n=alice,r=abc".to_vec() }})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(13), "{err}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_password_and_unauthenticated_clients_are_refused() {
    let standin = standin().await;
    let proxy = proxy(&standin, Setup::default()).await;
    let bad = client(&proxy, Some((CLIENT_USER.0, "wrong"))).await;
    let err = bad
        .database("x")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind.as_ref(),
            mongodb::error::ErrorKind::Authentication { .. }
        ),
        "{err}"
    );
    let anon = client(&proxy, None).await;
    let err = anon
        .database("x")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), Some(13), "{err}");
    // ping needs no authentication, like mongod.
    anon.database("x")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    // Nor does buildInfo (mongod: requiresAuth() false in db/commands/generic.cpp through
    // 7.0): the Java driver 3.x sends it in its handshake, before authenticating.
    let info = anon
        .database("admin")
        .run_command(doc! {"buildInfo": 1})
        .await
        .unwrap();
    assert!(info.get_str("version").is_ok(), "{info}");
    assert_eq!(standin.stats().command_count("find"), 0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_transactions_and_blocks_work_pooled() {
    let standin = standin().await;
    let proxy = proxy(&standin, Setup::default()).await;
    let c = client(&proxy, Some(CLIENT_USER)).await;
    let coll = c.database("pooled").collection::<Document>("big");
    let docs: Vec<Document> = (0..1000).map(|i| doc! {"i": i}).collect();
    coll.insert_many(docs).await.unwrap();
    let all: Vec<Document> = coll
        .find(doc! {"i": {"$gte": 0}})
        .batch_size(100)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 1000);
    assert!(standin.stats().command_count("getmore") >= 9);

    let mut session = c.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    coll.insert_one(doc! {"txn": 1})
        .session(&mut session)
        .await
        .unwrap();
    session.commit_transaction().await.unwrap();
    assert_eq!(standin.stats().command_count("committransaction"), 1);

    let err = coll.delete_many(doc! {}).await.unwrap_err();
    assert_eq!(code_of(&err), Some(65001), "{err}");
    assert_eq!(standin.stats().command_count("delete"), 0);
    assert_eq!(coll.count_documents(doc! {"txn": 1}).await.unwrap(), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhaust_and_fire_and_forget_writes_over_the_pool() {
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            unauthenticated: true,
            ..Setup::default()
        },
    )
    .await;
    let (mut raw, hello) = RawConn::connect_with_hello(proxy.local_addr()).await;
    assert_eq!(hello.get_str("msg").unwrap(), "isdbgrid");
    // w:0 (moreToCome) inserts, then read back on the same client connection.
    for i in 0..50 {
        raw.send(
            support::raw::MORE_TO_COME,
            &doc! {"insert": "ff", "documents": [{"i": i}], "$db": "pooled",
            "writeConcern": {"w": 0}},
        )
        .await;
    }
    let count = raw
        .command(doc! {"count": "ff", "query": {}, "$db": "pooled"})
        .await;
    assert_eq!(count.get_i32("n").unwrap(), 50, "{count}");
    // An exhaust getMore streams every batch over one pinned upstream connection.
    let first = raw
        .command(doc! {"find": "ff", "filter": {"i": {"$gte": 0}}, "batchSize": 5, "$db": "pooled"})
        .await;
    let id = first.get_document("cursor").unwrap().get_i64("id").unwrap();
    raw.send(
        EXHAUST_ALLOWED,
        &doc! {"getMore": id, "collection": "ff", "batchSize": 5, "$db": "pooled"},
    )
    .await;
    let mut got = 5;
    loop {
        let r = raw.read().await;
        got += r
            .body
            .get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len();
        if !r.more_to_come() {
            break;
        }
    }
    assert_eq!(got, 50);
    let (pool, pinned) = proxy.pool_stats().unwrap();
    assert_eq!((pool.in_use, pinned.exhaust.get()), (0, 0));
    assert!(pool.total <= 2);
    proxy.shutdown().await;
}

/// Client A warms the single pooled connection, then the upstream stops answering and A's
/// find holds that connection: returns once it has been checked out and reached the upstream.
async fn hold_the_only_connection(proxy: &ProxyHandle, standin: &StandIn) -> RawConn {
    let (mut a, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    a.command(doc! {"ping": 1, "$db": "admin"}).await;
    a.command(doc! {"insert": "c", "documents": [{"x": 1}], "$db": "pooled"})
        .await;
    standin.set_fault(Fault::Stall);
    let messages = standin.stats().messages();
    a.send(0, &doc! {"find": "c", "filter": {"x": 1}, "$db": "pooled"})
        .await;
    tokio::time::timeout(BOUND, async {
        while proxy.pool_stats().unwrap().0.in_use != 1 || standin.stats().messages() == messages {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("A's find never held the pooled connection");
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_timeout_then_client_killed_mid_request_does_not_poison_the_pool() {
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            pool_size: 1,
            checkout_timeout: Duration::from_millis(300),
            unauthenticated: true,
            ..Setup::default()
        },
    )
    .await;
    let a = hold_the_only_connection(&proxy, &standin).await;
    let (mut b, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let err = b
        .command(doc! {"find": "c", "filter": {"x": 1}, "$db": "pooled"})
        .await;
    assert_eq!(err.get_i32("code").unwrap(), CHECKOUT_TIMEOUT_CODE, "{err}");
    assert!(err.get("errorLabels").is_none());
    assert!(
        err.get_str("errmsg").unwrap().contains("pool_size"),
        "{err}"
    );
    // A leaves mid-request. Its reply never comes (the upstream stalls), so after a short
    // grace period its upstream connection is discarded, not returned, and the pool recovers.
    drop(a);
    standin.set_fault(Fault::None);
    let mut ok = Document::new();
    for _ in 0..100 {
        ok = tokio::time::timeout(
            BOUND,
            b.command(doc! {"find": "c", "filter": {"x": 1}, "$db": "pooled"}),
        )
        .await
        .unwrap();
        if ok.get_f64("ok").ok() == Some(1.0) {
            break;
        }
        assert_eq!(ok.get_i32("code").unwrap(), CHECKOUT_TIMEOUT_CODE, "{ok}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ok.get_f64("ok").unwrap(), 1.0, "{ok}");
    let batch = ok
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1);
    let (pool, _) = proxy.pool_stats().unwrap();
    assert!(pool.discards >= 1, "{pool:?}");
    assert!(pool.timeouts >= 1, "{pool:?}");
    proxy.shutdown().await;
}

/// A request to the admin listener; the status and body.
async fn admin_request(admin: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut raw))
        .await
        .expect("admin reply")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// A session waiting for a pooled connection (every one in use) ends when it is killed, not
/// when `checkout_timeout` runs out: the kill is watched while it waits for a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_killed_while_waiting_for_a_slot_ends_at_once() {
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            pool_size: 1,
            // Far beyond BOUND: only the kill can end B's wait within the test.
            checkout_timeout: Duration::from_secs(600),
            unauthenticated: true,
            ..Setup::default()
        },
    )
    .await;
    let admin = proxy.admin_addr().unwrap();
    let a = hold_the_only_connection(&proxy, &standin).await;
    // B's find waits for the slot.
    let (mut b, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let b_peer = b.stream_mut().local_addr().unwrap().to_string();
    b.send(0, &doc! {"find": "c", "filter": {"x": 1}, "$db": "pooled"})
        .await;
    tokio::time::timeout(BOUND, async {
        while proxy.pool_stats().unwrap().0.waiting != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("B's find never waited for the slot");
    let (status, body) = admin_request(admin, "GET", "/connections").await;
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = list["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["peer"] == b_peer.as_str())
        .and_then(|r| r["id"].as_u64())
        .unwrap_or_else(|| panic!("B ({b_peer}) not listed: {list}"));
    let (status, body) = admin_request(admin, "POST", &format!("/connections/{id}/kill")).await;
    assert_eq!(status, 200, "{body}");
    // B's connection closes without a reply. Bounded below reply_timeout (30 s here), which
    // would also end the wait: only a kill seen while waiting closes it within the bound.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        b.stream_mut().read(&mut buf).await
    })
    .await
    .expect("the killed session kept waiting for a slot");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    let (pool, _) = proxy.pool_stats().unwrap();
    assert_eq!((pool.waiting, pool.timeouts), (0, 0), "{pool:?}");
    drop(a);
    standin.set_fault(Fault::None);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_its_reply_does_not_cost_a_connection() {
    // The Node driver's close: endSessions sent, socket closed without reading the reply.
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            pool_size: 1,
            unauthenticated: true,
            ..Setup::default()
        },
    )
    .await;
    for _ in 0..20 {
        let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
        c.command(doc! {"ping": 1, "$db": "admin"}).await;
        c.send(0, &doc! {"endSessions": [], "$db": "admin"}).await;
        drop(c);
    }
    let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let r = c
        .command(doc! {"count": "x", "query": {}, "$db": "pooled"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_eq!(standin.stats().connections_accepted(), 1);
    assert_eq!(standin.stats().authentications(), 1);
    let (pool, _) = proxy.pool_stats().unwrap();
    assert_eq!(pool.discards, 0, "{pool:?}");
    proxy.shutdown().await;
}

/// A stand-in and a pooled proxy authenticating clients from a users file (CLIENT_USER), with
/// no audit sink: (stand-in, users file, proxy).
async fn pooled_with_users_file() -> (StandIn, PathBuf, ProxyHandle) {
    let standin = standin().await;
    let upstream = format!(
        "mongodb://{}:{}@{}/?authSource=admin",
        UPSTREAM_USER.0,
        UPSTREAM_USER.1,
        standin.addr()
    );
    let (_, users) = users_file_at();
    let mut cfg = Config::for_upstream(&upstream).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.auth.users_file = Some(users.clone());
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    (standin, users, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hangup_reloads_the_users_file() {
    let (_standin, users, proxy) = pooled_with_users_file().await;
    let alice = client(&proxy, Some(CLIENT_USER)).await;
    alice
        .database("x")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    alice
        .database("x")
        .collection::<Document>("c")
        .insert_one(doc! {"a": 1})
        .await
        .unwrap();
    let bob = ("bob", "bobpw");
    assert!(client(&proxy, Some(bob))
        .await
        .database("x")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .is_err());
    // An invalid file is refused and the users in force stay.
    let saved = std::fs::read_to_string(&users).unwrap();
    std::fs::write(&users, "[[users]]\nname = \"broken\"\n").unwrap();
    assert!(proxy.reload_users().is_err());
    std::fs::write(&users, saved).unwrap();
    // Bob is added; a hangup (what SIGHUP, `systemctl reload`, does, here for this proxy
    // only: a signal would reach every proxy of the test process) makes him known. It has
    // reloaded when it returns. The binary's SIGHUP handler is tested in
    // tests/resilience_signals.rs.
    mongoguard::auth::users::add(&users, bob.0, bob.1, "admin").unwrap();
    proxy.hangup();
    let c = client(&proxy, Some(bob)).await;
    tokio::time::timeout(
        BOUND,
        c.database("x")
            .collection::<Document>("c")
            .find_one(doc! {}),
    )
    .await
    .expect("bob's find within the bound")
    .expect("bob was not accepted after the hangup");
    // Alice's connection authenticated before the reload still works.
    alice
        .database("x")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap();
    assert_eq!(proxy.reload_users().unwrap(), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_restart_is_survived() {
    let standin = standin().await;
    let addr = standin.addr();
    let proxy = proxy(&standin, Setup::default()).await;
    let c = client(&proxy, Some(CLIENT_USER)).await;
    let coll = c.database("pooled").collection::<Document>("restart");
    coll.insert_one(doc! {"before": 1}).await.unwrap();
    standin.shutdown().await;
    // The same address comes back (a restarted mongod); its data is gone, as in a restart of
    // an in-memory server.
    // No wait here: the idle connection to the old server is either noticed closed at
    // checkout or fails on use and is discarded (the driver retries the write once).
    let again = standin_on(addr).await;
    coll.insert_one(doc! {"after": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {"after": 1}).await.unwrap(), 1);
    assert!(again.stats().authentications() >= 1);
    let (pool, _) = proxy.pool_stats().unwrap();
    assert!(pool.unusable + pool.discards >= 1, "{pool:?}");
    proxy.shutdown().await;
}

/// `pool.max_connections_per_user`: the connection that authenticates past the limit gets a
/// MongoDB error naming it (not a bare reset) and is closed; a closed connection frees its
/// slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_user_are_limited_with_an_error() {
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            per_user: 1,
            ..Setup::default()
        },
    )
    .await;
    let first = client(&proxy, Some(CLIENT_USER)).await;
    first
        .database("x")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    // The first client's connection stays checked in to its own pool: the second client's
    // authenticated connection is the user's second.
    let second = client(&proxy, Some(CLIENT_USER)).await;
    let err = second
        .database("x")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("max_connections_per_user = 1"),
        "{err}"
    );
    let text = proxy.metrics().encode();
    let refused: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "mongoguard_connections_refused_total{limit=\"max_connections_per_user\"} ",
            )
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused >= 1, "the refusal is counted: {text}");
    // The first client is unaffected; once it closes, the user may connect again.
    first
        .database("x")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    first.shutdown().await;
    let third = client(&proxy, Some(CLIENT_USER)).await;
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match third.database("x").run_command(doc! {"ping": 1}).await {
                Ok(_) => break,
                // The first client's sockets close asynchronously.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the slot is freed when the connection closes");
    proxy.shutdown().await;
}

/// Wire compression toward clients in pooled mode: mongoguard's hello agrees the client's
/// compressors it offers (in the client's order, as mongod does); a compressed request reaches
/// the upstream decompressed (mongoguard's own connections agree none) and its reply comes
/// back compressed with the request's compressor, large replies included; an uncompressed
/// request still gets an uncompressed reply. The Rust driver then runs CRUD with each
/// compressor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_toward_clients() {
    use mongoguard::wire::{builder::MsgBuilder, compression::Compressor};
    use support::guard::WireConn;
    let s = standin().await;
    let p = proxy(
        &s,
        Setup {
            unauthenticated: true,
            ..Setup::default()
        },
    )
    .await;
    let (mut c, hello) = WireConn::connect_hello(p.local_addr(), &["lz4", "zstd", "snappy"]).await;
    assert_eq!(
        hello.get_array("compression").expect("compression agreed"),
        &vec![bson::Bson::from("zstd"), bson::Bson::from("snappy")],
        "{hello}"
    );
    let upstream_compressed = s.stats().compressed_messages();
    let big = "x".repeat(1024);
    for (i, compressor) in [Compressor::Zstd, Compressor::Snappy, Compressor::Zlib]
        .into_iter()
        .enumerate()
    {
        let docs: Vec<bson::RawDocumentBuf> = (0..150)
            .map(|j| bson::rawdoc! {"k": i as i32, "j": j, "pad": big.as_str()})
            .collect();
        let mut arr = bson::RawArrayBuf::new();
        for d in docs {
            arr.push(d);
        }
        let insert =
            MsgBuilder::new(bson::rawdoc! {"insert": "cmp", "documents": arr, "$db": "pooled"});
        let r = c.msg_compressed(insert, compressor).await;
        assert!(r.compressed, "{compressor:?}: reply not compressed: {r:?}");
        assert_eq!(support::num(r.doc(), "n"), 150, "{r:?}");
        // A reply of about 150 KiB: compressed off the runtime threads, same result.
        let find = MsgBuilder::new(bson::rawdoc! {"find": "cmp", "filter": {"k": i as i32},
        "batchSize": 1000, "$db": "pooled"});
        let r = c.msg_compressed(find, compressor).await;
        assert!(r.compressed, "{compressor:?}: find reply not compressed");
        let batch = r
            .doc()
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        assert_eq!(batch.len(), 150);
    }
    assert_eq!(
        s.stats().compressed_messages(),
        upstream_compressed,
        "the upstream got compressed messages"
    );
    assert!(
        p.metrics()
            .encode()
            .contains("mongoguard_compressed_requests_total 6"),
        "compressed requests are counted"
    );
    // Uncompressed request, uncompressed reply.
    let id = c.id();
    let plain =
        MsgBuilder::new(bson::rawdoc! {"count": "cmp", "query": {}, "$db": "pooled"}).encode(id, 0);
    let r = c.round_trip(id, &plain).await;
    assert!(!r.compressed);
    assert_eq!(support::num(r.doc(), "n"), 450);
    // The Rust driver with each compressor: the handshake agrees it and CRUD works.
    for name in ["zstd", "snappy", "zlib"] {
        let mut opts =
            ClientOptions::parse(format!("mongodb://{}/?compressors={name}", p.local_addr()))
                .await
                .unwrap();
        opts.server_selection_timeout = Some(Duration::from_secs(10));
        let client = Client::with_options(opts).unwrap();
        let coll = client.database("pooled").collection::<Document>(name);
        coll.insert_many((0..20).map(|i| doc! {"i": i}))
            .await
            .unwrap();
        let all: Vec<Document> = coll
            .find(doc! {})
            .batch_size(3)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(all.len(), 20, "{name}");
        client.shutdown().await;
    }
    p.shutdown().await;
}

fn session(n: u8) -> Document {
    doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![n; 16] }}
}

fn ok_reply(r: &Document) {
    assert_eq!(r.get("ok").and_then(bson::Bson::as_f64), Some(1.0), "{r}");
}

/// A transaction statement on session `n` (a new transaction `txn`).
fn txn_insert(n: u8, txn: i64) -> Document {
    doc! {"insert": "ended", "documents": [{"txn": txn}], "lsid": session(n), "txnNumber": txn,
    "autocommit": false, "startTransaction": true, "$db": "pooled"}
}

/// Session `n` at transaction number 5 on the upstream (a lower number is TransactionTooOld
/// there until the session ends: the stand-in forgets an ended session, as mongod does).
async fn session_at_five(c: &mut RawConn, n: u8) {
    ok_reply(&c.command(txn_insert(n, 5)).await);
    ok_reply(
        &c.command(
            doc! {"commitTransaction": 1, "lsid": session(n), "txnNumber": 5i64,
            "autocommit": false, "$db": "admin"},
        )
        .await,
    );
    assert_eq!(
        c.command(txn_insert(n, 1)).await.get_i32("code").ok(),
        Some(225)
    );
}

/// Until the upstream has forgotten session `n` (bounded).
async fn until_ended_upstream(c: &mut RawConn, n: u8) {
    tokio::time::timeout(BOUND, async {
        loop {
            let r = c.command(txn_insert(n, 1)).await;
            if r.get_f64("ok").ok() == Some(1.0) {
                return;
            }
            assert_eq!(r.get_i32("code").ok(), Some(225), "{r}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the upstream never ended the session");
}

/// Drivers end their sessions when a client closes: pymongo waits for the reply, which in
/// pooled mode is a second upstream round trip for a serverless client that makes one
/// request per connection. mongoguard answers a plain endSessions itself and ends the same
/// sessions upstream in the background, as the identity that used them; a stalled upstream
/// delays the upstream part only; anything unusual is forwarded and answered by the
/// upstream (which refuses what mongod refuses: standin/tests/strict.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_sessions_is_answered_here_and_ends_the_sessions_upstream() {
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            unauthenticated: true,
            ..Setup::default()
        },
    )
    .await;
    let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let stats = standin.stats();

    // Awaited (pymongo), then with moreToCome (the Node.js driver).
    session_at_five(&mut c, 1).await;
    let r = c
        .command(doc! {"endSessions": [session(1)], "$db": "admin",
        "$readPreference": {"mode": "primaryPreferred"}})
        .await;
    ok_reply(&r);
    until_ended_upstream(&mut c, 1).await;
    session_at_five(&mut c, 2).await;
    c.send(2, &doc! {"endSessions": [session(2)], "$db": "admin"})
        .await;
    ok_reply(&c.command(doc! {"ping": 1, "$db": "admin"}).await);
    until_ended_upstream(&mut c, 2).await;
    assert_eq!(stats.command_count("endSessions"), 2);

    // What mongod would refuse is forwarded, and its error comes back.
    let generic = bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes: vec![3; 16],
    };
    let r = c
        .command(doc! {"endSessions": [{"id": generic}], "$db": "admin"})
        .await;
    assert_eq!(r.get_i32("code").ok(), Some(14), "{r}");
    let r = c
        .command(doc! {"endSessions": [{"id": session(3).get("id").unwrap().clone(), "uid": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 32] }}], "$db": "admin"})
        .await;
    assert_eq!(r.get_i32("code").ok(), Some(13), "{r}");
    assert_eq!(stats.command_count("endSessions"), 4);

    // The upstream stops answering: a forwarded endSessions would wait for the reply
    // timeout (30 s here); this one is answered, and still reaches the upstream.
    standin.set_fault(Fault::Stall);
    let messages = stats.messages();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        c.command(doc! {"endSessions": [session(4)], "$db": "admin"}),
    )
    .await
    .expect("endSessions waited for a stalled upstream");
    ok_reply(&r);
    tokio::time::timeout(BOUND, async {
        while stats.messages() == messages {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the background endSessions never reached the upstream");
    let text = proxy.metrics().encode();
    for line in [
        "mongoguard_end_sessions_total{outcome=\"answered\"} 3",
        "mongoguard_end_sessions_total{outcome=\"sent\"} 2",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    // Shutdown does not wait for the stalled background endSessions.
    tokio::time::timeout(BOUND, proxy.shutdown())
        .await
        .expect("shutdown hung on the background endSessions");
}

/// A users file refused at SIGHUP keeps the users in force, and said so only in a log line:
/// unlike the policy and the allowlist, no metric (nor event) told the operator that the
/// users file in place is not the one in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_file_reloads_are_counted_in_the_metrics() {
    let (_standin, users, proxy) = pooled_with_users_file().await;
    let value = |name: &str| {
        proxy.metrics().encode().lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    let saved = std::fs::read_to_string(&users).unwrap();
    std::fs::write(&users, "[[users]]\nname = \"broken\"\n").unwrap();
    proxy.hangup();
    assert_eq!(value("mongoguard_users_reload_failures_total"), Some(1.0));
    assert_eq!(value("mongoguard_users_reloads_total"), Some(0.0));
    std::fs::write(&users, saved).unwrap();
    proxy.hangup();
    assert_eq!(value("mongoguard_users_reload_failures_total"), Some(1.0));
    assert_eq!(value("mongoguard_users_reloads_total"), Some(1.0));
    proxy.shutdown().await;
}

/// The stand-in and proxy of [`pooled_with_users_file`], with `bob` (password `bobpw`) added
/// to the users file and loaded.
async fn pooled_with_bob() -> (StandIn, PathBuf, ProxyHandle) {
    let (standin, users, proxy) = pooled_with_users_file().await;
    mongoguard::auth::users::add(&users, "bob", "bobpw", "admin").unwrap();
    assert_eq!(proxy.reload_users().unwrap(), 2);
    (standin, users, proxy)
}

/// The users file without `bob`: alice alone, as before he was added.
fn remove_bob(users: &std::path::Path) {
    std::fs::remove_file(users).unwrap();
    mongoguard::auth::users::add(users, CLIENT_USER.0, CLIENT_USER.1, "admin").unwrap();
}

/// A users-file reload that removes a user between his saslStart and his saslContinue: the
/// conversation had his credential from saslStart, and his proof is right, but he is no
/// longer a user. mongoguard mapped the user it could no longer find to the `default`
/// identity and served him as that (fail open); he must not be authenticated at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_removed_during_his_conversation_is_not_authenticated() {
    use mongoguard::auth::scram::{ClientConversation, Mechanism};
    let (_standin, users, proxy) = pooled_with_bob().await;
    let bin = |bytes: Vec<u8>| bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    };
    let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let mut scram = ClientConversation::new(Mechanism::ScramSha256, "bob", "bobpw").unwrap();
    let start = c
        .command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
        "payload": bin(scram.client_first()), "options": {"skipEmptyExchange": true},
        "$db": "admin"})
        .await;
    let id = start.get_i32("conversationId").expect("saslStart answered");
    let server_first = start.get_binary_generic("payload").unwrap().clone();
    let client_final = scram.handle_server_first(&server_first).unwrap();
    remove_bob(&users);
    assert_eq!(proxy.reload_users().unwrap(), 1);
    let reply = c
        .command(doc! {"saslContinue": 1, "conversationId": id,
        "payload": bin(client_final), "$db": "admin"})
        .await;
    assert_eq!(reply.get_i32("code").ok(), Some(18), "{reply}");
    let r = c
        .command(doc! {"find": "c", "filter": {}, "$db": "pooled"})
        .await;
    assert_eq!(r.get_i32("code").ok(), Some(13), "{r}");
    proxy.shutdown().await;
}

/// mongod drops a removed user from the connections authenticated as him: their next
/// command is Unauthorized (AuthorizationSessionImpl::_refreshUserInfoAsNeeded, UserNotFound:
/// "Removed deleted user ... from session cache"). Pooled mode kept serving a user removed
/// from the users file on his open connections, for as long as they lived — a leaked or
/// revoked credential kept its connections (a pooled client's may live for hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_removed_by_a_reload_loses_his_open_connections() {
    let (_standin, users, proxy) = pooled_with_bob().await;
    let mut bob = RawConn::connect_as(proxy.local_addr(), "bob", "bobpw").await;
    let mut alice = RawConn::connect_as(proxy.local_addr(), CLIENT_USER.0, CLIENT_USER.1).await;
    let find = doc! {"find": "c", "filter": {}, "$db": "pooled"};
    for c in [&mut bob, &mut alice] {
        let r = c.command(find.clone()).await;
        assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    }
    remove_bob(&users);
    assert_eq!(proxy.reload_users().unwrap(), 1);
    let r = bob.command(find.clone()).await;
    assert_eq!(r.get_i32("code").ok(), Some(13), "{r}");
    // Nor does the connection authenticate again as anyone.
    let r = bob
        .command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
        "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic,
        bytes: b"n,,n=alice,r=abcdefgh".to_vec() }, "$db": "admin"})
        .await;
    assert_eq!(r.get_i32("code").ok(), Some(13), "{r}");
    // Alice, still in the file, is served as before.
    let r = alice.command(find).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    proxy.shutdown().await;
}

/// Every client (and every users-file user) mapped to an upstream identity runs as one
/// upstream user, where mongod would keep their sessions and operations apart: sessions are
/// keyed by id and user, and `$ownOps` / killOp without the `killop` privilege cover the
/// user's own operations. Commands that reach every session or operation of that user then
/// reach other clients': `killSessions: []` killed every pooled client's sessions (their
/// transactions and cursors), `currentOp` and `$currentOp` showed their commands (filters:
/// data), session ids and idle cursor ids, `$listLocalSessions` their session ids, killOp
/// killed their operations by a small sequential id. Pooled mode refuses them; a
/// killSessions naming sessions still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reaching_every_client_of_an_identity_are_refused() {
    let standin = standin().await;
    let proxy = proxy(&standin, Setup::default()).await;
    let stats = standin.stats();
    // Another client of the same identity has a transaction open.
    let mut other = RawConn::connect_as(proxy.local_addr(), CLIENT_USER.0, CLIENT_USER.1).await;
    let lsid = support::identities::lsid(3);
    let r = other
        .command(
            doc! {"insert": "t", "documents": [{"x": 1}], "lsid": lsid.clone(),
            "txnNumber": 1_i64, "autocommit": false, "startTransaction": true, "$db": "pooled"},
        )
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let mut c = RawConn::connect_as(proxy.local_addr(), CLIENT_USER.0, CLIENT_USER.1).await;
    let refused = [
        doc! {"killSessions": [], "$db": "admin"},
        doc! {"killAllSessions": [], "$db": "admin"},
        doc! {"killAllSessionsByPattern": [], "$db": "admin"},
        doc! {"currentOp": 1, "$ownOps": true, "$db": "admin"},
        doc! {"killOp": 1, "op": 12, "$db": "admin"},
        doc! {"getPrevError": 1, "$db": "pooled"},
        doc! {"aggregate": 1, "pipeline": [{"$currentOp": {"idleCursors": true}}],
        "cursor": {}, "$db": "admin"},
        doc! {"aggregate": 1, "pipeline": [{"$listLocalSessions": {}}], "cursor": {},
        "$db": "admin"},
        doc! {"aggregate": "system.sessions", "pipeline": [{"$listSessions": {}}],
        "cursor": {}, "$db": "config"},
        doc! {"aggregate": "c", "pipeline": [{"$match": {}}, {"$unionWith": {"coll": "d",
        "pipeline": [{"$listLocalSessions": {}}]}}], "cursor": {}, "$db": "pooled"},
    ];
    let messages = stats.messages();
    for cmd in refused {
        let r = c.command(cmd.clone()).await;
        // 13 from pooled mode; the default policy's W013 blocks the killAllSessions forms
        // first (65001).
        let code = r.get_i32("code").ok();
        assert!(matches!(code, Some(13 | 65001)), "{cmd} -> {r}");
    }
    assert_eq!(
        stats.messages(),
        messages,
        "a refused command reached the upstream"
    );
    // The other client's transaction was not killed.
    let r = other
        .command(
            doc! {"commitTransaction": 1, "lsid": lsid, "txnNumber": 1_i64,
            "autocommit": false, "$db": "admin"},
        )
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    // Naming its own sessions is the client's business.
    let named = doc! {"killSessions": [support::identities::lsid(7)], "$db": "admin"};
    let r = c.command(named).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    assert_eq!(stats.command_count("killSessions"), 1);
    let r = c
        .command(
            doc! {"aggregate": "c", "pipeline": [{"$match": {}}], "cursor": {},
            "$db": "pooled"},
        )
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    proxy.shutdown().await;
}

/// getLastError reports its connection's previous request (mongod's LastError is per
/// connection; src/mongo/db/lasterror.cpp). A pooled connection's previous request is
/// usually another client's: a getLastError that followed no fire-and-forget write of this
/// client's ran on whichever connection the pool handed out and reported another client's
/// write — its errors, the duplicate key's value included. It is answered as mongod answers
/// one whose previous request was no write (after the client's own legacy write it still
/// runs where that write ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_last_error_never_reports_another_clients_write() {
    let standin = standin().await;
    let proxy = proxy(
        &standin,
        Setup {
            pool_size: 1,
            ..Setup::default()
        },
    )
    .await;
    let mut a = RawConn::connect_as(proxy.local_addr(), CLIENT_USER.0, CLIENT_USER.1).await;
    let mut b = RawConn::connect_as(proxy.local_addr(), CLIENT_USER.0, CLIENT_USER.1).await;
    let insert = doc! {"insert": "gle", "documents": [{"_id": "victim@example.com"}],
    "$db": "pooled"};
    let r = a.command(insert.clone()).await;
    assert_eq!(r.get_i32("n").ok(), Some(1), "{r}");
    // A's duplicate, on the only upstream connection.
    let r = a.command(insert.clone()).await;
    assert!(r.get_array("writeErrors").is_ok(), "{r}");
    let r = b.command(doc! {"getLastError": 1, "$db": "pooled"}).await;
    assert!(
        !r.to_string().contains("victim@example.com"),
        "B's getLastError reported A's write: {r}"
    );
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    proxy.shutdown().await;
}

/// Two unauthenticated legacy clients of a pooled mongoguard with one upstream connection,
/// in front of a mongod 5.0 stand-in (the last to serve the legacy opcodes); `checkout`:
/// the pool's checkout timeout, when the test needs it set.
async fn legacy_clients_on_one_connection(
    checkout: Option<Duration>,
) -> (
    StandIn,
    ProxyHandle,
    support::guard::WireConn,
    support::guard::WireConn,
) {
    use support::guard::WireConn;
    let standin = StandIn::start(StandInConfig {
        users: vec![(UPSTREAM_USER.0.into(), UPSTREAM_USER.1.into())],
        wire_version: 13,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut setup = Setup {
        pool_size: 1,
        unauthenticated: true,
        ..Setup::default()
    };
    if let Some(t) = checkout {
        setup.checkout_timeout = t;
    }
    let proxy = proxy(&standin, setup).await;
    let (a, _) = WireConn::connect_hello(proxy.local_addr(), &[]).await;
    let (b, _) = WireConn::connect_hello(proxy.local_addr(), &[]).await;
    (standin, proxy, a, b)
}

/// A legacy write's getLastError runs on the connection the write ran on (mongod 5.0, which
/// still serves the legacy opcodes), and reports it; another client's getLastError never
/// gets that connection's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_writes_get_last_error_reports_that_write_only() {
    let (_standin, proxy, mut a, mut b) = legacy_clients_on_one_connection(None).await;
    let doc = bson::rawdoc! {"_id": "victim@example.com"};
    a.legacy_insert("pooled.legacy", &[&doc]).await;
    let r = a.get_last_error("pooled").await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    assert!(r.get("code").is_none(), "{r}");
    a.legacy_insert("pooled.legacy", &[&doc]).await;
    let r = a.get_last_error("pooled").await;
    assert_eq!(r.get_i32("code").ok(), Some(11000), "{r}");
    // The only upstream connection's previous request is A's duplicate (getLastError does
    // not count as one).
    let r = b.get_last_error("pooled").await;
    assert!(
        !r.to_string().contains("victim@example.com"),
        "B's getLastError reported A's write: {r}"
    );
    proxy.shutdown().await;
}

/// A legacy write's connection is kept for the getLastError that follows it. A client that
/// wrote without asking (an unacknowledged legacy write) and went idle held it for as long
/// as it stayed connected: with `pool_size` 1 every other client's request waited for
/// `checkout_timeout` and failed. The connection now goes back to the pool when no request
/// follows within a second; a getLastError later than that learns that the write's outcome
/// is unknown (never "no error").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_legacy_writer_does_not_hold_the_pool() {
    // Far longer than the kept connection's wait: B's find must not need it.
    let (_standin, proxy, mut a, mut b) =
        legacy_clients_on_one_connection(Some(Duration::from_secs(20))).await;
    a.legacy_insert("pooled.idle", &[&bson::rawdoc! {"x": 1}])
        .await;
    // A holds the only connection once its write went out; B's find waits for it to go
    // back.
    let kept = || proxy.pool_stats().unwrap().1.legacy_write.get();
    tokio::time::timeout(BOUND, async {
        while kept() != 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("A's legacy write kept its connection");
    let r = tokio::time::timeout(
        BOUND,
        b.msg(bson::rawdoc! {"find": "idle", "filter": {}, "$db": "pooled"}),
    )
    .await
    .expect("B's find within the bound");
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let n = r
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(Vec::len)
        .ok();
    assert_eq!(n, Some(1), "{r}");
    let r = a.get_last_error("pooled").await;
    assert!(
        r.get_str("err").is_ok_and(|e| e.contains("unknown")),
        "a late getLastError: {r}"
    );
    proxy.shutdown().await;
}
