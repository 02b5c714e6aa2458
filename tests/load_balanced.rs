//! `loadBalanced=true` upstreams: mongoguard in front of a load balancer that spreads
//! connections over two mongos. The stand-ins act as mongos reached through a load balancer
//! (a connection's first hello must say `loadBalanced: true`, as
//! src/mongo/s/load_balancer_support.cpp requires), and a round-robin TCP relay is the load
//! balancer. The two stand-ins do not share cursors, exactly like two mongos: a getMore on a
//! connection that reaches the other one fails with CursorNotFound, so every cursor must stay
//! on the connection that opened it.

mod support;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::{Config, Mode},
};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// A layer-4 load balancer: each new connection goes to the next backend, round robin.
async fn round_robin_relay(backends: Vec<SocketAddr>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut next = 0usize;
        while let Ok((mut client, _)) = listener.accept().await {
            let backend = backends[next % backends.len()];
            next += 1;
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

async fn balanced_standin() -> StandIn {
    balanced_standin_at(StandInConfig::default().wire_version).await
}

/// [`balanced_standin`] at `wire_version` (13, MongoDB 5.0: the last with legacy opcodes).
async fn balanced_standin_at(wire_version: i32) -> StandIn {
    StandIn::start(StandInConfig {
        load_balanced: true,
        wire_version,
        ..StandInConfig::default()
    })
    .await
    .unwrap()
}

/// The same 60 documents on both "mongos" (one cluster behind them).
async fn seed(backends: &[&StandIn]) {
    seed_as(backends, "").await
}

/// [`seed`], authenticating with `credentials` (`user:password@`, or empty).
async fn seed_as(backends: &[&StandIn], credentials: &str) {
    for s in backends {
        let direct = Client::with_uri_str(format!(
            "mongodb://{credentials}{}/?loadBalanced=true&authSource=admin",
            s.addr()
        ))
        .await
        .unwrap();
        direct
            .database("lb")
            .collection::<Document>("c")
            .insert_many((0..60).map(|i| doc! {"i": i}))
            .await
            .unwrap();
        direct.shutdown().await;
    }
}

async fn start(upstream: &str, mode: Mode) -> ProxyHandle {
    let mut cfg = Config::for_upstream(upstream).unwrap();
    cfg.proxy.mode = mode;
    cfg.pool.pool_size = 6;
    cfg.auth.allow_unauthenticated = true;
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    Proxy::start(Arc::new(cfg)).await.unwrap()
}

async fn client(proxy: &ProxyHandle) -> Client {
    let mut opts = ClientOptions::parse(format!("mongodb://{}", proxy.local_addr()))
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    opts.max_pool_size = Some(8);
    Client::with_options(opts).unwrap()
}

/// Many concurrent cursors, each drained with getMores, through pooled mode: the pool's
/// connections reach both mongos, and every getMore goes on its cursor's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_cursors_stay_on_their_load_balanced_connection() {
    let (a, b) = (balanced_standin().await, balanced_standin().await);
    seed(&[&a, &b]).await;
    let relay = round_robin_relay(vec![a.addr(), b.addr()]).await;
    let proxy = start(
        &format!("mongodb://{relay}/?loadBalanced=true"),
        Mode::Pooled,
    )
    .await;
    let c = client(&proxy).await;
    let coll = c.database("lb").collection::<Document>("c");
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let coll = coll.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let all: Vec<Document> = coll
                    .find(doc! {})
                    .batch_size(7)
                    .await
                    .unwrap()
                    .try_collect()
                    .await
                    .expect("every getMore finds its cursor");
                assert_eq!(all.len(), 60);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (fa, fb) = (
        a.stats().command_count("find"),
        b.stats().command_count("find"),
    );
    assert!(
        fa > 0 && fb > 0,
        "the load balancer spread the pool over both mongos: {fa} / {fb}"
    );
    assert_eq!(fa + fb, 36);
    // A cursor left open by a client that goes away does not leak its pin: the next
    // client's requests run normally.
    let mut cursor = coll.find(doc! {}).batch_size(2).await.unwrap();
    assert!(cursor.try_next().await.unwrap().is_some());
    drop(cursor);
    c.shutdown().await;
    let c2 = client(&proxy).await;
    let n = c2
        .database("lb")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(n, 60);
    c2.shutdown().await;
    proxy.shutdown().await;
}

/// Passthrough relays each client connection to its own upstream connection, so a client
/// behind mongoguard connects as it would to the load balancer itself: with
/// `loadBalanced=true` in its URI, its driver pins cursors to connections and sends the hello
/// mongos wants; CRUD and concurrent cursors work, and `/readyz` probes the upstream with
/// `loadBalanced: true` too. A client without it gets mongos's own refusal
/// (LoadBalancerSupportMismatch), not a cursor lost at random later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_clients_reach_mongos_behind_a_load_balancer() {
    let (a, b) = (balanced_standin().await, balanced_standin().await);
    seed(&[&a, &b]).await;
    let relay = round_robin_relay(vec![a.addr(), b.addr()]).await;
    let proxy = start(
        &format!("mongodb://{relay}/?loadBalanced=true"),
        Mode::Passthrough,
    )
    .await;
    let mut opts = ClientOptions::parse(format!(
        "mongodb://{}/?loadBalanced=true",
        proxy.local_addr()
    ))
    .await
    .unwrap();
    opts.max_pool_size = Some(8);
    let c = Client::with_options(opts).unwrap();
    let coll = c.database("lb").collection::<Document>("c");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let coll = coll.clone();
        tasks.push(tokio::spawn(async move {
            let all: Vec<Document> = coll
                .find(doc! {})
                .batch_size(5)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            assert_eq!(all.len(), 60);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(a.stats().command_count("find") > 0 && b.stats().command_count("find") > 0);
    coll.insert_one(doc! {"i": 100}).await.unwrap();
    let admin = proxy.admin_addr().expect("admin listener");
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    c.shutdown().await;

    // A plain hello without loadBalanced, as a driver not told about the load balancer
    // sends it.
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let reply = raw.command(doc! {"hello": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_i32("code").unwrap_or(0), 354, "{reply}");
    proxy.shutdown().await;
}

/// Without `loadBalanced=true` in the upstream URI, the same load balancer refuses
/// mongoguard's own connections (the stand-in is as strict as mongos): the pooled client
/// gets an error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_without_load_balanced_in_the_uri_is_refused_clearly() {
    let a = balanced_standin().await;
    let proxy = start(&format!("mongodb://{}/", a.addr()), Mode::Pooled).await;
    let mut opts = ClientOptions::parse(format!("mongodb://{}", proxy.local_addr()))
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(3));
    let c = Client::with_options(opts).unwrap();
    let err = c
        .database("lb")
        .run_command(doc! {"ping": 1})
        .await
        .expect_err("the load balancer refuses a hello without loadBalanced");
    assert!(!err.to_string().is_empty());
    // Nothing got past the refused handshakes.
    assert_eq!(a.stats().command_count("ping"), 0, "{err}");
    proxy.shutdown().await;
}

#[test]
fn load_balanced_uri_rules() {
    for bad in [
        "mongodb://a:1,b:2/?loadBalanced=true",
        "mongodb://a:1/?loadBalanced=true&replicaSet=rs",
        "mongodb://a:1/?loadBalanced=true&directConnection=true",
        "mongodb://a:1/?loadBalanced=yes",
    ] {
        let refused = Config::for_upstream(bad).and_then(|c| c.validate());
        assert!(refused.is_err(), "{bad}");
    }
    let cfg = Config::for_upstream("mongodb://a:1/?loadBalanced=true").unwrap();
    cfg.validate().unwrap();
}

/// A layer-4 load balancer that sends each new connection to the backend `target` names at
/// that moment, so a test decides where mongoguard's next upstream connection lands.
async fn switch_relay(backends: Vec<SocketAddr>, target: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let backend = backends[target.load(Ordering::SeqCst) % backends.len()];
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

/// Pooled mode in front of `relay` with no idle connections opened ahead (every upstream
/// connection is opened for a request, where the relay's target says).
async fn start_lazy(relay: SocketAddr) -> ProxyHandle {
    start_lazy_with(relay, |_| {}).await
}

/// [`start_lazy`] with `tweak` applied to the configuration.
async fn start_lazy_with(relay: SocketAddr, tweak: impl FnOnce(&mut Config)) -> ProxyHandle {
    let mut cfg = Config::for_upstream(&format!("mongodb://{relay}/?loadBalanced=true")).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.pool.pool_size = 6;
    cfg.pool.min_idle = 0;
    cfg.auth.allow_unauthenticated = true;
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    tweak(&mut cfg);
    cfg.validate().unwrap();
    Proxy::start(Arc::new(cfg)).await.unwrap()
}

/// Two seeded "mongos" behind a relay whose target (0: A, 1: B) the test switches.
async fn switched_pair() -> (StandIn, StandIn, Arc<AtomicUsize>, SocketAddr) {
    switched_pair_at(StandInConfig::default().wire_version).await
}

/// [`switched_pair`], the "mongos" at `wire_version`.
async fn switched_pair_at(wire_version: i32) -> (StandIn, StandIn, Arc<AtomicUsize>, SocketAddr) {
    let (a, b) = (
        balanced_standin_at(wire_version).await,
        balanced_standin_at(wire_version).await,
    );
    seed(&[&a, &b]).await;
    let target = Arc::new(AtomicUsize::new(0));
    let relay = switch_relay(vec![a.addr(), b.addr()], target.clone()).await;
    (a, b, target, relay)
}

/// Opens a cursor (batch of 2) on A's connection, then one on B's, over `conn`.
async fn cursor_on_each(conn: &mut support::raw::RawConn, target: &AtomicUsize) -> [i64; 2] {
    let mut ids = [0; 2];
    for (backend, id) in ids.iter_mut().enumerate() {
        // A find's new connection reaches the relay's target: its cursor lives there.
        target.store(backend, Ordering::SeqCst);
        let found = conn
            .command(doc! {"find": "c", "batchSize": 2, "$db": "lb"})
            .await;
        *id = found.get_document("cursor").unwrap().get_i64("id").unwrap();
        assert_ne!(*id, 0, "{found}");
    }
    ids
}

/// Each cursor of `lb.c` in `ids` is gone: a getMore through `raw` gets CursorNotFound.
async fn assert_gone(raw: &mut support::raw::RawConn, ids: [i64; 2]) {
    for id in ids {
        let more = raw
            .command(doc! {"getMore": id, "collection": "c", "$db": "lb"})
            .await;
        assert_eq!(more.get_i32("code").unwrap_or(0), 43, "{more}");
    }
}

/// Makes `backend` hold its next `command` for `ms` milliseconds (a fail point); the
/// returned client is closed by the caller.
async fn hold_next(backend: &StandIn, command: &str, ms: i32) -> Client {
    let direct = Client::with_uri_str(format!("mongodb://{}/?loadBalanced=true", backend.addr()))
        .await
        .unwrap();
    direct
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": [command], "blockConnection": true, "blockTimeMS": ms},
        })
        .await
        .unwrap();
    direct
}

/// Waits (bounded) until `backend` has seen a killCursors; `what` names the wait.
async fn until_killed_on(backend: &StandIn, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while backend.stats().command_count("killCursors") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn batch_ids(reply: &Document, batch: &str) -> Vec<i32> {
    let cursor = reply
        .get_document("cursor")
        .unwrap_or_else(|_| panic!("{reply}"));
    cursor
        .get_array(batch)
        .unwrap()
        .iter()
        .map(|d| d.as_document().unwrap().get_i32("i").unwrap())
        .collect()
}

/// A getMore that arrives while its cursor's connection is busy (here: the previous getMore
/// of the cursor, held 1 s by mongos A; in the field: the round trip whose reply the client
/// already has, not yet settled) waits for that connection. Every connection opened after the
/// find goes to mongos B, which does not know the cursor: a getMore sent on any other
/// connection would get CursorNotFound there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_more_waits_for_its_busy_cursor_connection() {
    let (a, b) = (balanced_standin().await, balanced_standin().await);
    seed(&[&a, &b]).await;
    let target = Arc::new(AtomicUsize::new(0));
    let relay = switch_relay(vec![a.addr(), b.addr()], target.clone()).await;
    let proxy = start_lazy(relay).await;
    let mut first = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let mut second = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let found = first
        .command(doc! {"find": "c", "batchSize": 2, "$db": "lb"})
        .await;
    let id = found.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0, "{found}");
    let mut seen = batch_ids(&found, "firstBatch");
    // From now on every new upstream connection reaches B.
    target.store(1, Ordering::SeqCst);
    let direct = Client::with_uri_str(format!("mongodb://{}/?loadBalanced=true", a.addr()))
        .await
        .unwrap();
    direct
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": ["getMore"], "blockConnection": true, "blockTimeMS": 1000},
        })
        .await
        .unwrap();
    let get_more = doc! {"getMore": id, "collection": "c", "batchSize": 2, "$db": "lb"};
    let held = {
        let get_more = get_more.clone();
        tokio::spawn(async move {
            let reply = first.command(get_more).await;
            (first, reply)
        })
    };
    // The first getMore is on A's connection, held there.
    while a.stats().command_count("getMore") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited = second.command(get_more).await;
    let (_first, held) = held.await.unwrap();
    seen.extend(batch_ids(&held, "nextBatch"));
    seen.extend(batch_ids(&waited, "nextBatch"));
    seen.sort_unstable();
    assert_eq!(seen, (0..6).collect::<Vec<_>>(), "{held} / {waited}");
    assert_eq!(a.stats().command_count("getMore"), 2);
    assert_eq!(
        b.stats().command_count("getMore"),
        0,
        "no getMore reached B"
    );
    direct.shutdown().await;
    proxy.shutdown().await;
}

/// A getMore of a cursor open on no upstream connection is answered CursorNotFound by
/// mongoguard: it is not sent on some other connection, which may reach another mongos.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_more_of_an_unknown_cursor_fails_closed() {
    let (a, b) = (balanced_standin().await, balanced_standin().await);
    seed(&[&a, &b]).await;
    let relay = round_robin_relay(vec![a.addr(), b.addr()]).await;
    let proxy = start_lazy(relay).await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let reply = raw
        .command(doc! {"getMore": 4_242_424_242i64, "collection": "c", "$db": "lb"})
        .await;
    assert_eq!(reply.get_i32("code").unwrap_or(0), 43, "{reply}");
    assert!(
        reply.get_str("errmsg").unwrap().contains("mongoguard"),
        "{reply}"
    );
    // A cursor that finished is unknown again.
    let done = raw
        .command(doc! {"find": "c", "batchSize": 50, "$db": "lb"})
        .await;
    let id = done.get_document("cursor").unwrap().get_i64("id").unwrap();
    let last = raw
        .command(doc! {"getMore": id, "collection": "c", "$db": "lb"})
        .await;
    assert_eq!(batch_ids(&last, "nextBatch").len(), 10, "{last}");
    let again = raw
        .command(doc! {"getMore": id, "collection": "c", "$db": "lb"})
        .await;
    assert_eq!(again.get_i32("code").unwrap_or(0), 43, "{again}");
    let sent = a.stats().command_count("getMore") + b.stats().command_count("getMore");
    assert_eq!(sent, 1, "only the cursor's own getMore reached a mongos");
    proxy.shutdown().await;
}

/// Two load-balanced stand-ins that know both identities' upstream users.
async fn two_identity_lb_standins() -> (StandIn, StandIn) {
    let users = support::identities::upstream_users();
    let lb = || {
        StandIn::start(StandInConfig {
            load_balanced: true,
            users: users.clone(),
            ..StandInConfig::default()
        })
    };
    (lb().await.unwrap(), lb().await.unwrap())
}

/// Pooled mode parks a load-balanced connection for its cursors, and a getMore takes it by
/// cursor id. That connection is authenticated as one upstream identity: a client mapped to
/// another identity must not get it, or its getMore would run as the cursor owner's user
/// and mongod's own ownership check (the cursor's user must be the caller,
/// src/mongo/db/commands/getmore_cmd.cpp) would be bypassed. It gets CursorNotFound, as for a
/// cursor open on no connection its identity can reach; the owner continues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_serves_only_its_own_identity() {
    let (a, b) = two_identity_lb_standins().await;
    seed_as(&[&a, &b], "app:apppw@").await;
    let relay = round_robin_relay(vec![a.addr(), b.addr()]).await;
    let mut cfg = support::identities::pooled_config(
        &relay.to_string(),
        "&loadBalanced=true",
        "lb-identity",
        6,
    );
    cfg.pool.min_idle = 0;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let connect = |user: &str, pw: &str| {
        let uri = format!(
            "mongodb://{user}:{pw}@{}/?authSource=admin&maxPoolSize=1",
            proxy.local_addr()
        );
        async move { Client::with_uri_str(uri).await.unwrap() }
    };
    let alice = connect("alice", "alicepw").await;
    let mallory = connect("mallory", "mallorypw").await;
    let lbdb = |c: &Client| c.database("lb");
    let found = lbdb(&alice)
        .run_command(doc! {"find": "c", "batchSize": 2})
        .await
        .unwrap();
    let id = found.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0, "{found}");
    let get_more = doc! {"getMore": id, "collection": "c", "batchSize": 2};
    let stolen = lbdb(&mallory).run_command(get_more.clone()).await;
    match stolen {
        Err(e) => match e.kind.as_ref() {
            mongodb::error::ErrorKind::Command(c) => assert_eq!(c.code, 43, "{e}"),
            other => panic!("{other:?}"),
        },
        Ok(reply) => panic!("another identity's getMore got the cursor: {reply}"),
    }
    let mine = lbdb(&alice).run_command(get_more).await.unwrap();
    assert_eq!(batch_ids(&mine, "nextBatch"), vec![2, 3], "{mine}");
    let sent = a.stats().command_count("getMore") + b.stats().command_count("getMore");
    assert_eq!(sent, 1, "only the owner's getMore reached a mongos");
    alice.shutdown().await;
    mallory.shutdown().await;
    proxy.shutdown().await;
}

/// The transaction of a session is parked under its session id *and* identity. mongod keys a
/// session by its id and the digest of its user (`makeLogicalSessionId`,
/// src/mongo/db/session/logical_session_id_helpers.cpp): another user who sends the same
/// `lsid.id` has a session of its own and cannot touch the first. Here a client of another
/// identity runs a transaction statement with alice's lsid: it must not take over the parked
/// record of alice's transaction, or alice's next statement would go out on a fresh connection
/// (possibly another mongos: NoSuchTransaction) instead of the one her transaction lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_with_the_same_lsid_does_not_take_over_a_transaction() {
    let (a, b) = two_identity_lb_standins().await;
    let relay = round_robin_relay(vec![a.addr(), b.addr()]).await;
    let mut cfg = support::identities::pooled_config(
        &relay.to_string(),
        "&loadBalanced=true",
        "lb-txn-identity",
        6,
    );
    cfg.pool.min_idle = 0;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let addr = proxy.local_addr();

    let (mut alice, mut mallory) = support::identities::connect_both(addr).await;
    let lsid = support::identities::lsid(7);
    let statement = |id: i32, first: bool| {
        let mut d = doc! {"insert": "t", "documents": [{"_id": id}], "lsid": lsid.clone(),
        "txnNumber": 1i64, "autocommit": false, "$db": "lb"};
        if first {
            d.insert("startTransaction", true);
        }
        d
    };
    let r = alice.command(statement(1, true)).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let connects = |proxy: &ProxyHandle| proxy.pool_stats().unwrap().0.connects;
    // Another identity, the same lsid.id: its own session upstream (whatever it answers).
    let _ = mallory.command(statement(100, true)).await;
    let before = connects(&proxy);
    // alice's transaction goes on where it lives: no new upstream connection.
    let r = alice.command(statement(2, false)).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    assert_eq!(
        connects(&proxy),
        before,
        "alice's transaction statement left the connection her transaction lives on"
    );
    let r = alice
        .command(
            doc! {"commitTransaction": 1, "lsid": lsid.clone(), "txnNumber": 1i64,
            "autocommit": false, "$db": "admin"},
        )
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    proxy.shutdown().await;
}

/// A killCursors naming cursors parked on different upstream connections (pymongo batches
/// the kills of a namespace's abandoned cursors into one command, and to the client
/// mongoguard is one server) reaches each of them: the forwarded command kills the first
/// cursor on its connection, and mongoguard kills the others on theirs, so no parked
/// connection is left holding a cursor its client has given up (a parked connection counts
/// against `pool_size` for up to 11 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_cursors_of_cursors_on_several_connections_reaches_each() {
    let (a, b, target, relay) = switched_pair().await;
    let proxy = start_lazy(relay).await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each(&mut raw, &target).await;
    assert_eq!(
        proxy.pool_stats().unwrap().0.in_use,
        2,
        "two parked connections"
    );
    let killed = raw
        .command(doc! {"killCursors": "c", "cursors": [ids[0], ids[1]], "$db": "lb"})
        .await;
    assert_eq!(killed.get_f64("ok").ok(), Some(1.0), "{killed}");
    // Each mongos got a killCursors on the cursor's own connection.
    until_killed_on(&b, "B's cursor was never killed").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.pool_stats().unwrap().0.in_use > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a connection stayed parked: {:?}",
            proxy.pool_stats().unwrap().0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.stats().command_count("killCursors"), 1);
    // Neither cursor is open anywhere mongoguard reaches.
    assert_gone(&mut raw, ids).await;
    assert_eq!(
        a.stats().command_count("getMore") + b.stats().command_count("getMore"),
        0
    );
    proxy.shutdown().await;
}

/// The same with a legacy OP_KILL_CURSORS (no namespace, no reply): the message goes on the
/// first cursor's connection, and mongoguard sends an OP_KILL_CURSORS on the other's; both
/// parked connections go back to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_kill_cursors_of_cursors_on_several_connections_reaches_each() {
    let (a, b, target, relay) = switched_pair_at(13).await;
    let proxy = start_lazy(relay).await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each(&mut raw, &target).await;
    assert_eq!(proxy.pool_stats().unwrap().0.in_use, 2);
    let message = mongoguard::wire::builder::encode_kill_cursors(4244, &ids);
    raw.stream_mut().write_all(&message).await.unwrap();
    let kills = |s: &StandIn| s.stats().command_count("op_kill_cursors");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while kills(&a) == 0 || kills(&b) == 0 || proxy.pool_stats().unwrap().0.in_use > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a cursor was not killed on its connection: A {}, B {}, {:?}",
            kills(&a),
            kills(&b),
            proxy.pool_stats().unwrap().0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_gone(&mut raw, ids).await;
    proxy.shutdown().await;
}

/// A killCursors follow-up whose killCursors mongos does not answer within its bound
/// (`reply_timeout`) gives up: its connection is dropped (closed: mongos ends what lived on
/// it). The connection's slot must not stay "busy" forever: a later getMore of the cursor
/// must get CursorNotFound, not wait out the checkout timeout for a connection that will
/// never come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_cursors_follow_up_that_times_out_leaves_no_busy_slot() {
    let (_a, b, target, relay) = switched_pair().await;
    let proxy = start_lazy_with(relay, |cfg| {
        cfg.pool.checkout_timeout = Duration::from_secs(2);
        cfg.upstream.reply_timeout = Duration::from_secs(1);
    })
    .await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each(&mut raw, &target).await;
    // B holds its next killCursors well past the follow-up's bound.
    let direct = hold_next(&b, "killCursors", 4000).await;
    let killed = raw
        .command(doc! {"killCursors": "c", "cursors": [ids[0], ids[1]], "$db": "lb"})
        .await;
    assert_eq!(killed.get_f64("ok").ok(), Some(1.0), "{killed}");
    // The follow-up reaches B, then gives up after 1 s.
    until_killed_on(&b, "no follow-up reached B").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = tokio::time::Instant::now();
    let more = raw
        .command(doc! {"getMore": ids[1], "collection": "c", "$db": "lb"})
        .await;
    assert_eq!(
        more.get_i32("code").unwrap_or(0),
        43,
        "after {:?}: {more}",
        started.elapsed()
    );
    direct.shutdown().await;
    proxy.shutdown().await;
}

/// Follow-ups are bounded in all (64 at once), and a follow-up waits for a busy parked
/// connection for a while (up to `checkout_timeout`). One client that keeps one of its own
/// cursors' connections busy (here a getMore held by a fail point; in the field any slow
/// getMore, e.g. an awaitData one) and names that cursor in 70 killCursors gets one
/// follow-up, not 64 (one at a time per client connection): another client's killCursors of
/// cursors on two connections is still followed up, and its second cursor killed. (Found by
/// an attacker's review: with 16 permits shared by all and a wait as long as the whole
/// bound, this test failed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_hold_every_kill_follow_up_permit() {
    let (a, b, target, relay) = switched_pair().await;
    let proxy = start_lazy_with(relay, |cfg| cfg.pool.pool_size = 8).await;
    let connect = || support::raw::RawConn::connect(proxy.local_addr());
    let (mut hog, mut victim) = (connect().await.unwrap(), connect().await.unwrap());
    // The hog's cursor, its connection held busy by a slow getMore.
    let found = hog
        .command(doc! {"find": "c", "batchSize": 2, "$db": "lb"})
        .await;
    let slow = found.get_document("cursor").unwrap().get_i64("id").unwrap();
    let direct = hold_next(&a, "getMore", 20_000).await;
    let mut held = connect().await.unwrap();
    let _held = tokio::spawn(async move {
        held.command(doc! {"getMore": slow, "collection": "c", "$db": "lb"})
            .await
    });
    while a.stats().command_count("getMore") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 70 killCursors of an unknown cursor and the busy one: more than the 64 follow-ups
    // that may run at once, if one client could start them all.
    for bogus in 1..=70i64 {
        let r = hog
            .command(doc! {"killCursors": "c", "cursors": [bogus, slow], "$db": "lb"})
            .await;
        assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    }
    // The victim's cursors, one on each connection.
    let ids = cursor_on_each(&mut victim, &target).await;
    let r = victim
        .command(doc! {"killCursors": "c", "cursors": [ids[0], ids[1]], "$db": "lb"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    until_killed_on(
        &b,
        "the victim's second cursor was never killed: every follow-up permit is held",
    )
    .await;
    direct.shutdown().await;
    proxy.shutdown().await;
}

/// Shutdown with a killCursors follow-up waiting on a mongos that holds its reply: the
/// follow-up is cancelled (its connection closed) and shutdown does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_a_kill_follow_up_in_flight() {
    let (a, b, target, relay) = switched_pair().await;
    // The plan guard's explain of the find's shape opens a connection of its own through
    // the relay, to whichever backend is the target by then (B in about half of the runs:
    // B then held 2 connections, its commands an explain and a listIndexes): off, so that
    // B's connections are mongoguard's parked one only.
    let proxy = start_lazy_with(relay, |cfg| {
        cfg.plan.enabled = mongoguard::config::PlanEnabled::Off;
    })
    .await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each(&mut raw, &target).await;
    // mongoguard's connection to B is the only one left once the stand-in has seen the
    // seeding client's connections close (under load that can take a while).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while b.stats().connections_open() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B holds {} connections, not mongoguard's one (A holds {}; mongoguard's pool: {:?}; \
             B's commands: {:?})",
            b.stats().connections_open(),
            a.stats().connections_open(),
            proxy.pool_stats().unwrap().0,
            b.stats().command_counts()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // B reads and never answers from now on (the stand-in's handler sees the close).
    b.set_fault(mongoguard_standin::Fault::Stall);
    let r = raw
        .command(doc! {"killCursors": "c", "cursors": [ids[0], ids[1]], "$db": "lb"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    // The follow-up is on B's connection, waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.stats().connections_open(), 1);
    drop(raw);
    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), proxy.shutdown())
        .await
        .expect("shutdown waited for the follow-up");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while b.stats().connections_open() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follow-up's connection to B stayed open after shutdown ({:?})",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A legacy OP_KILL_CURSORS whose first id mongoguard holds on no parked connection (a cursor
/// whose connection expired or broke, another identity's, or simply unknown), followed by
/// the client's cursors parked on two connections that fill the pool. The message is routed
/// by its first id: unknown, it needs a fresh connection, which the full pool (full of the
/// very connections the kill would free) cannot give; the message is dropped at the checkout
/// timeout (no reply to carry the error) and its follow-up never starts: the parked
/// connections stay out of the pool (up to `PARKED_TTL`), and every other request of this
/// identity waits out the checkout timeout meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_kill_whose_first_cursor_is_unknown_still_frees_a_full_pool() {
    let (_a, _b, target, relay) = switched_pair_at(13).await;
    let proxy = start_lazy_with(relay, |cfg| {
        cfg.pool.pool_size = 2;
        cfg.pool.checkout_timeout = Duration::from_secs(1);
    })
    .await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each(&mut raw, &target).await;
    assert_eq!(
        proxy.pool_stats().unwrap().0.in_use,
        2,
        "two parked connections: the pool is full"
    );
    let unknown = 0x0123_4567_89ab_cdef_i64;
    assert!(!ids.contains(&unknown));
    let message = mongoguard::wire::builder::encode_kill_cursors(4246, &[unknown, ids[0], ids[1]]);
    raw.stream_mut().write_all(&message).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while proxy.pool_stats().unwrap().0.in_use > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the killed cursors' connections stayed parked: {:?}",
            proxy.pool_stats().unwrap().0
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_gone(&mut raw, ids).await;
    proxy.shutdown().await;
}

/// A legacy OP_KILL_CURSORS whose first cursor's parked connection stays busy (a slow
/// getMore of another of the client's connections: in the field an awaitData one) past the
/// checkout timeout is dropped (no reply to carry the error); its other cursor, parked on an
/// idle connection, must still be killed there (its follow-up needs no reply of the message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_kill_whose_first_cursor_stays_busy_still_kills_the_others() {
    let (a, b, target, relay) = switched_pair_at(13).await;
    let proxy = start_lazy_with(relay, |cfg| {
        cfg.pool.checkout_timeout = Duration::from_secs(1);
    })
    .await;
    let connect = || support::raw::RawConn::connect(proxy.local_addr());
    let mut raw = connect().await.unwrap();
    let ids = cursor_on_each(&mut raw, &target).await;
    // A's cursor's connection busy for 4 s with a getMore of another client connection.
    let direct = hold_next(&a, "getMore", 4000).await;
    let mut held = connect().await.unwrap();
    let slow = ids[0];
    let _held = tokio::spawn(async move {
        held.command(doc! {"getMore": slow, "collection": "c", "$db": "lb"})
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.stats().command_count("getMore") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the getMore never reached A"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let message = mongoguard::wire::builder::encode_kill_cursors(4247, &ids);
    raw.stream_mut().write_all(&message).await.unwrap();
    // Well before A's getMore ends (4 s): B's cursor is killed on its connection.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(2500);
    while b.stats().command_count("op_kill_cursors") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's cursor was never killed: {:?}",
            proxy.pool_stats().unwrap().0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    direct.shutdown().await;
    proxy.shutdown().await;
}

/// Pooled sessions on two session loops (a pool of 8 over `proxy.threads = 2`: one shard
/// each): a cursor one client opens (its connection parked, checked out of the first loop's
/// shard) is continued and finished by a client on the other loop, whose request runs on
/// that parked connection. The connection goes back to the shard it came from, idle, and the
/// first loop's next request reuses it: over many rounds nothing is left in use or waiting,
/// and no connection is opened past each loop's first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_continued_from_another_session_loop_goes_back_to_its_shard() {
    let (_a, _b, target, relay) = switched_pair().await;
    let proxy = start_lazy_with(relay, |c| {
        c.proxy.threads = 2;
        c.pool.pool_size = 8;
    })
    .await;
    // A new client goes to the loop with the fewest sessions: x on one, y on the other.
    let mut x = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let r = x.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let mut y = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let r = y.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    target.store(0, Ordering::SeqCst);
    let settled = |proxy: &ProxyHandle| {
        let s = proxy.pool_stats().unwrap().0;
        s.in_use == 0 && s.waiting == 0
    };
    for round in 0..20 {
        let found = x
            .command(doc! {"find": "c", "batchSize": 2, "$db": "lb"})
            .await;
        let id = found.get_document("cursor").unwrap().get_i64("id").unwrap();
        assert_ne!(id, 0, "round {round}: {found}");
        let more = y
            .command(doc! {"getMore": id, "collection": "c", "batchSize": 100, "$db": "lb"})
            .await;
        let cursor = more.get_document("cursor").unwrap();
        assert_eq!(cursor.get_i64("id").unwrap(), 0, "round {round}: {more}");
        assert_eq!(cursor.get_array("nextBatch").unwrap().len(), 58);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !settled(&proxy) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: {:?}",
                proxy.pool_stats().unwrap().0
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let s = proxy.pool_stats().unwrap().0;
    assert_eq!(
        (s.total, s.idle, s.connects, s.discards),
        (2, 2, 2, 0),
        "one connection per loop's shard (opened for its client's ping), none since: {s:?}"
    );
    proxy.shutdown().await;
}
