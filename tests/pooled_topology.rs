//! Pooled mode in front of several upstream servers: a stand-in replica set that fails over
//! under load, and a list of servers balanced like mongos with cursor pinning. The Rust
//! driver is the client; the stand-ins' counters and data are checked directly.

mod support;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use tokio::io::AsyncWriteExt;

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::{Config, Mode},
};
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};

const BOUND: Duration = Duration::from_secs(120);

async fn pooled_proxy(upstream: &str) -> ProxyHandle {
    let mut cfg = Config::for_upstream(upstream).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.pool.pool_size = 4;
    cfg.auth.allow_unauthenticated = true;
    cfg.upstream.heartbeat_interval = Duration::from_millis(200);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    Proxy::start(Arc::new(cfg))
        .await
        .expect("start pooled proxy")
}

async fn client(proxy: &ProxyHandle) -> Client {
    let mut opts = ClientOptions::parse(format!("mongodb://{}", proxy.local_addr()))
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(30));
    Client::with_options(opts).unwrap()
}

/// Inserts a member takes before and after the step-down while the load runs.
const WARM_WRITES: u64 = 40;

/// Waits (bounded) until `member` has received at least `n` inserts.
async fn inserts_reach(rs: &ReplicaSet, member: usize, n: u64, what: &str) {
    let deadline = Instant::now() + BOUND;
    while rs.member(member).stats().command_count("insert") < n {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_mid_load_loses_no_acknowledged_write() {
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rs0".into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    let proxy = pooled_proxy(&rs.uri()).await;
    let c = client(&proxy).await;
    let coll = c.database("failover").collection::<Document>("w");
    // Four writers insert numbered documents and keep the numbers of acknowledged ones.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let coll = coll.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut failed = 0;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let n = w * 1_000_000 + i;
                i += 1;
                match coll.insert_one(doc! {"n": n}).await {
                    Ok(_) => acked.push(n),
                    Err(e) => {
                        failed += 1;
                        eprintln!("write {n} failed: {e}");
                    }
                }
            }
            (acked, failed)
        }));
    }
    // The load is on: the first primary has taken writes (not a fixed wait).
    inserts_reach(
        &rs,
        0,
        WARM_WRITES,
        "the writers never got going on member 0",
    )
    .await;
    assert_eq!(rs.primary(), Some(0));
    let before = rs.member(1).stats().command_count("insert");
    rs.step_down(1, Duration::from_millis(700));
    let stepped = Instant::now();
    // Wait until member 1 is primary and has taken writes through mongoguard.
    inserts_reach(&rs, 1, before + 1, "writes never reached the new primary").await;
    // Reported, not asserted: from the step-down (including the 700 ms without a primary)
    // to the first write on the new primary.
    println!(
        "first write on the new primary {:?} after the step-down (700 ms election gap)",
        stepped.elapsed()
    );
    // The load goes on against the new primary for a while before it stops.
    inserts_reach(
        &rs,
        1,
        before + WARM_WRITES,
        "the writers stalled on the new primary",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    let mut failed = 0;
    for w in writers {
        let (a, f) = tokio::time::timeout(BOUND, w).await.unwrap().unwrap();
        acked.extend(a);
        failed += f;
    }
    // Through the failover no write failed: the driver's retryable writes and mongoguard's
    // wait for the new primary hide it from the application.
    assert_eq!(failed, 0, "writes failed during the failover");
    assert!(acked.len() > 20, "only {} writes", acked.len());
    // Every acknowledged write is there, exactly once (read from the new primary directly).
    let direct = Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true",
        rs.member(1).addr()
    ))
    .await
    .unwrap();
    let docs: Vec<Document> = direct
        .database("failover")
        .collection::<Document>("w")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut stored: Vec<i64> = docs
        .iter()
        .map(|d| {
            d.get_i64("n")
                .or_else(|_| d.get_i32("n").map(i64::from))
                .unwrap()
        })
        .collect();
    stored.sort_unstable();
    let mut expected = acked.clone();
    expected.sort_unstable();
    let before_dedup = stored.len();
    stored.dedup();
    assert_eq!(before_dedup, stored.len(), "a write was applied twice");
    for n in &expected {
        assert!(
            stored.binary_search(n).is_ok(),
            "acknowledged write {n} lost"
        );
    }
    // Writes after the failover went to member 1 only; the old primary took none after it.
    assert!(rs.member(1).stats().command_count("insert") > before);
    proxy.shutdown().await;
    rs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_reads_follow_read_preference() {
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rs1".into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    let proxy = pooled_proxy(&rs.uri()).await;
    let c = client(&proxy).await;
    let db = c.database("rp");
    db.collection::<Document>("c")
        .insert_many((0..30).map(|i| doc! {"i": i}))
        .await
        .unwrap();
    let secondaries_before: u64 = (1..3)
        .map(|i| rs.member(i).stats().command_count("find"))
        .sum();
    let mut opts = ClientOptions::parse(format!(
        "mongodb://{}/?readPreference=secondary",
        proxy.local_addr()
    ))
    .await
    .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(30));
    let sec = Client::with_options(opts).unwrap();
    let scoll = sec.database("rp").collection::<Document>("c");
    // Cursors opened on a secondary are continued there (getMore pinned to the member).
    for _ in 0..6 {
        let all: Vec<Document> = scoll
            .find(doc! {})
            .batch_size(7)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(all.len(), 30);
    }
    let secondaries_after: u64 = (1..3)
        .map(|i| rs.member(i).stats().command_count("find"))
        .sum();
    assert_eq!(secondaries_after - secondaries_before, 6);
    assert_eq!(rs.member(0).stats().command_count("getmore"), 0);
    proxy.shutdown().await;
    rs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_list_is_balanced_and_cursors_stay_on_their_server() {
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let b = StandIn::start(StandInConfig::default()).await.unwrap();
    // The same data on both (like two mongos in front of one cluster).
    for s in [&a, &b] {
        let direct = Client::with_uri_str(s.uri()).await.unwrap();
        direct
            .database("bal")
            .collection::<Document>("c")
            .insert_many((0..50).map(|i| doc! {"i": i}))
            .await
            .unwrap();
    }
    let proxy = pooled_proxy(&format!("mongodb://{},{}", a.addr(), b.addr())).await;
    let c = client(&proxy).await;
    let coll = c.database("bal").collection::<Document>("c");
    for _ in 0..10 {
        let all: Vec<Document> = coll
            .find(doc! {})
            .batch_size(5)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(all.len(), 50);
    }
    let (fa, fb) = (
        a.stats().command_count("find"),
        b.stats().command_count("find"),
    );
    assert_eq!(fa + fb, 10);
    assert!(fa > 0 && fb > 0, "not balanced: {fa} / {fb}");
    // Every getMore reached the server holding its cursor (a wrong server answers
    // CursorNotFound, which would have failed the iteration above).
    assert_eq!(
        a.stats().command_count("getmore") + b.stats().command_count("getmore"),
        10 * 9
    );
    proxy.shutdown().await;
}

/// `find` counts of every member.
fn finds(rs: &ReplicaSet) -> Vec<u64> {
    (0..rs.members().len())
        .map(|i| rs.member(i).stats().command_count("find"))
        .collect()
}

/// Sends `find` with `read_pref` over `conn` and returns the reply.
async fn find_with(conn: &mut support::raw::RawConn, read_pref: Document) -> Document {
    conn.command(doc! {"find": "c", "filter": {"i": 1}, "$db": "tags",
    "$readPreference": read_pref})
        .await
}

/// Read-preference tag sets and maxStalenessSeconds choose among a replica set's members as
/// the server selection and max staleness specifications say, and a `$readPreference` that
/// mongod refuses is refused with mongod's code (src/mongo/client/read_preference.cpp,
/// `ReadPreferenceSetting::fromInnerBSON`): mode primary with tags or a staleness is
/// BadValue (2); a staleness under 90 s is MaxStalenessOutOfRange (160).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_preference_tags_and_max_staleness_pick_the_member() {
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rstags".into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    rs.set_tags(0, doc! {"dc": "east", "rack": "a"});
    rs.set_tags(1, doc! {"dc": "west"});
    rs.set_tags(2, doc! {"dc": "east", "rack": "b"});
    let mut cfg = Config::for_upstream(&rs.uri()).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.auth.allow_unauthenticated = true;
    cfg.upstream.heartbeat_interval = Duration::from_millis(100);
    cfg.upstream.server_selection_timeout = Duration::from_millis(700);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let (mut conn, _) = support::raw::RawConn::connect_with_hello(proxy.local_addr()).await;
    // Wait until every member's hello (and its tags) is known.
    let deadline = Instant::now() + BOUND;
    loop {
        let r = find_with(
            &mut conn,
            doc! {"mode": "secondary", "tags": [{"dc": "west"}]},
        )
        .await;
        if support::num(&r, "ok") == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "members never known: {r}");
    }

    // The first tag set that matches a secondary wins; only the members it matches serve.
    let before = finds(&rs);
    for _ in 0..6 {
        let r = find_with(
            &mut conn,
            doc! {"mode": "secondary", "tags": [{"dc": "north"}, {"dc": "east"}, {}]},
        )
        .await;
        assert_eq!(support::num(&r, "ok"), 1, "{r}");
    }
    let after = finds(&rs);
    assert_eq!(
        after[2] - before[2],
        6,
        "every read on the east secondary: {after:?}"
    );
    assert_eq!(after[1], before[1], "west secondary untouched: {after:?}");
    assert_eq!(after[0], before[0], "primary untouched: {after:?}");

    // nearest with tags may use the primary when it matches.
    let before = finds(&rs);
    for _ in 0..4 {
        let r = find_with(&mut conn, doc! {"mode": "nearest", "tags": [{"rack": "a"}]}).await;
        assert_eq!(support::num(&r, "ok"), 1, "{r}");
    }
    let after = finds(&rs);
    assert_eq!(after[0] - before[0], 4, "rack a is the primary: {after:?}");

    // No secondary matches: secondary fails (after the selection timeout, with mongod's
    // FailedToSatisfyReadPreference), secondaryPreferred falls back to the primary.
    let r = find_with(
        &mut conn,
        doc! {"mode": "secondary", "tags": [{"dc": "south"}]},
    )
    .await;
    assert_eq!(support::num(&r, "code"), 133, "{r}");
    let before = finds(&rs);
    let r = find_with(
        &mut conn,
        doc! {"mode": "secondaryPreferred", "tags": [{"dc": "south"}]},
    )
    .await;
    assert_eq!(support::num(&r, "ok"), 1, "{r}");
    assert_eq!(finds(&rs)[0] - before[0], 1);

    // Member 2 lags 10 minutes: maxStalenessSeconds 120 leaves member 1 only.
    rs.set_lag(2, Duration::from_secs(600));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = finds(&rs);
    for _ in 0..5 {
        let r = find_with(
            &mut conn,
            doc! {"mode": "secondary", "maxStalenessSeconds": 120},
        )
        .await;
        assert_eq!(support::num(&r, "ok"), 1, "{r}");
    }
    let after = finds(&rs);
    assert_eq!(
        after[1] - before[1],
        5,
        "the fresh secondary serves: {after:?}"
    );
    assert_eq!(
        after[2], before[2],
        "the stale secondary does not: {after:?}"
    );
    // Both constraints: fresh and east is nobody.
    let r = find_with(
        &mut conn,
        doc! {"mode": "secondary", "maxStalenessSeconds": 120, "tags": [{"dc": "east"}]},
    )
    .await;
    assert_eq!(support::num(&r, "code"), 133, "{r}");
    // The lag is over: the east secondary is eligible again.
    rs.set_lag(2, Duration::ZERO);
    let r = find_with(
        &mut conn,
        doc! {"mode": "secondary", "maxStalenessSeconds": 120, "tags": [{"dc": "east"}]},
    )
    .await;
    assert_eq!(
        support::num(&r, "ok"),
        1,
        "a waiting selection sees the member catch up: {r}"
    );

    // Refused as mongod refuses them, at once and without reaching any member.
    let before = finds(&rs);
    for (rp, code) in [
        (doc! {"mode": "primary", "tags": [{"dc": "east"}]}, 2),
        (doc! {"mode": "primary", "maxStalenessSeconds": 120}, 2),
        (doc! {"mode": "secondary", "maxStalenessSeconds": 30}, 160),
        (doc! {"mode": "secondary", "maxStalenessSeconds": -1}, 2),
        (doc! {"mode": "secondary", "maxStalenessSeconds": 90.5}, 2),
        (doc! {"mode": "secondary", "tags": {"dc": "east"}}, 14),
        (doc! {"mode": "sideways"}, 2),
        (doc! {"tags": []}, 4),
    ] {
        let r = find_with(&mut conn, rp.clone()).await;
        assert_eq!(support::num(&r, "code"), code, "{rp}: {r}");
    }
    assert_eq!(finds(&rs), before);
    // `[{}]` and `[]` are no tags at all, also with mode primary.
    for tags in [
        bson::Bson::Array(vec![]),
        bson::Bson::Array(vec![doc! {}.into()]),
    ] {
        let r = find_with(&mut conn, doc! {"mode": "primary", "tags": tags}).await;
        assert_eq!(support::num(&r, "ok"), 1, "{r}");
    }
    proxy.shutdown().await;
    rs.shutdown().await;
}

/// Two stand-ins with both upstream identities' users (two mongos in front of one cluster),
/// and a pooled mongoguard in front of both (`tag`: its users file's name), checking their
/// health every 200 ms.
async fn two_servers_two_identities(tag: &str) -> (StandIn, StandIn, ProxyHandle) {
    two_servers_two_identities_at(tag, StandInConfig::default().wire_version).await
}

/// [`two_servers_two_identities`], the servers at `wire_version`.
async fn two_servers_two_identities_at(
    tag: &str,
    wire_version: i32,
) -> (StandIn, StandIn, ProxyHandle) {
    let users = support::identities::upstream_users();
    let start = || {
        StandIn::start(StandInConfig {
            users: users.clone(),
            wire_version,
            ..StandInConfig::default()
        })
    };
    let (a, b) = (start().await.unwrap(), start().await.unwrap());
    let mut cfg =
        support::identities::pooled_config(&format!("{},{}", a.addr(), b.addr()), "", tag, 4);
    cfg.upstream.heartbeat_interval = Duration::from_millis(200);
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    (a, b, proxy)
}

/// A transaction's server pin (several upstream servers: mongoguard remembers which one a
/// transaction started on) is kept per session id *and* identity. mongod keys a session by
/// its id and its user's digest (`makeLogicalSessionId`,
/// src/mongo/db/session/logical_session_id_helpers.cpp): a client of another identity that
/// starts a transaction with the same `lsid.id` has a session of its own, and must not replace
/// the first one's pin (its next statement would then go to whichever server is chosen) nor
/// drop it when its own transaction ends. Checked on the pin map itself (the stand-ins keep
/// the two sessions apart too: see `end_sessions_of_one_identity_leave_another_identitys_session`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_with_the_same_lsid_keeps_its_own_transaction_pin() {
    let (_a, _b, proxy) = two_servers_two_identities("pin-identity").await;
    let addr = proxy.local_addr();
    let (mut alice, mut mallory) = support::identities::connect_both(addr).await;
    let lsid = support::identities::lsid(9);
    let start_txn = |txn_number: i64| {
        doc! {"insert": "t", "documents": [{"x": txn_number}], "lsid": lsid.clone(),
        "txnNumber": txn_number, "autocommit": false, "startTransaction": true, "$db": "pin"}
    };
    let pinned = |proxy: &ProxyHandle| proxy.pool_stats().unwrap().1.transaction.get();
    let r = alice.command(start_txn(1)).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    assert_eq!(pinned(&proxy), 1);
    // Another identity starts a transaction of the same lsid.id (a higher txnNumber, which
    // for one session would replace the first transaction).
    let _ = mallory.command(start_txn(2)).await;
    assert_eq!(
        pinned(&proxy),
        2,
        "another identity's transaction replaced alice's pin"
    );
    // Its end drops its own pin only.
    let _ = mallory
        .command(
            doc! {"abortTransaction": 1, "lsid": lsid.clone(), "txnNumber": 2i64,
            "autocommit": false, "$db": "admin"},
        )
        .await;
    // A pin is dropped once the round trip is settled, just after the reply is relayed (a
    // start pins before the request is sent: the checks above need no wait). Pins of other
    // keys cannot be dropped by it, so the one left is alice's.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pinned(&proxy) != 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        pinned(&proxy),
        1,
        "alice's pin went with mallory's transaction"
    );
    proxy.shutdown().await;
}

/// The same `n` documents `{i}` in `db.c` on every server of `servers` (several mongos in
/// front of one cluster), written directly as `user:password@` (or no one, when empty).
async fn seed_each(servers: &[&StandIn], db: &str, n: i32, credentials: &str) {
    for s in servers {
        let uri = format!("mongodb://{credentials}{}/?authSource=admin", s.addr());
        let direct = Client::with_uri_str(uri).await.unwrap();
        direct
            .database(db)
            .collection::<Document>("c")
            .insert_many((0..n).map(|i| doc! {"i": i}))
            .await
            .unwrap();
    }
}

/// With several servers a cursor is pinned by its id alone, and a killCursors unpinned it
/// whatever the server answered: another identity's killCursors of the id — refused by the
/// server (the cursor is another user's: Unauthorized, killcursors_cmd.cpp) — dropped the
/// owner's pin, so the owner's next getMore went wherever selection sent it (CursorNotFound
/// on another server). A refused killCursors (or getMore) leaves the pin alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_cannot_unpin_a_cursor() {
    let (a, b, proxy) = two_servers_two_identities("cursor-identity").await;
    let (mut alice, mut mallory) = support::identities::connect_both(proxy.local_addr()).await;
    // The same data on both servers (two mongos in front of one cluster): the find goes
    // to either.
    seed_each(&[&a, &b], "pin", 10, "app:apppw@").await;
    let pinned = |proxy: &ProxyHandle| proxy.pool_stats().unwrap().1.cursor.get();
    let r = alice
        .command(doc! {"find": "c", "filter": {}, "batchSize": 2, "$db": "pin"})
        .await;
    let id = r
        .get_document("cursor")
        .and_then(|c| c.get_i64("id"))
        .unwrap_or_else(|_| panic!("{r}"));
    assert_ne!(id, 0);
    assert_eq!(pinned(&proxy), 1);
    let r = mallory
        .command(doc! {"killCursors": "c", "cursors": [id], "$db": "pin"})
        .await;
    assert_eq!(
        r.get_f64("ok").ok(),
        Some(0.0),
        "the server killed another user's cursor: {r}"
    );
    let r = mallory
        .command(doc! {"getMore": id, "collection": "c", "$db": "pin"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(0.0), "{r}");
    // Mallory's session settles each round trip before it reads its next request.
    let r = mallory.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    assert_eq!(
        pinned(&proxy),
        1,
        "another identity's refused killCursors dropped the pin"
    );
    // Alice's getMores still reach her cursor's server, whichever the selection picks.
    for _ in 0..4 {
        let r = alice
            .command(doc! {"getMore": id, "collection": "c", "batchSize": 2, "$db": "pin"})
            .await;
        assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    }
    // Her own killCursors ends the pin.
    let r = alice
        .command(doc! {"killCursors": "c", "cursors": [id], "$db": "pin"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let r = alice.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    assert_eq!(pinned(&proxy), 0);
    proxy.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// mongod keys a session by its id and its user (and so does the stand-in now): two
/// identities sending the same `lsid.id` each have a session, and an endSessions one of them
/// sends — answered by mongoguard, ended upstream in the background — ends its own session
/// only: the background command runs as the identity of the client that sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_sessions_of_one_identity_leave_another_identitys_session() {
    let standin = StandIn::start(StandInConfig {
        users: support::identities::upstream_users(),
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let cfg =
        support::identities::pooled_config(&standin.addr().to_string(), "", "end-identity", 4);
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let (mut alice, mut mallory) = support::identities::connect_both(proxy.local_addr()).await;
    let lsid = support::identities::lsid(5);
    let start = doc! {"insert": "t", "documents": [{"x": 1}], "lsid": lsid.clone(),
    "txnNumber": 1_i64, "autocommit": false, "startTransaction": true, "$db": "ends"};
    let commit = doc! {"commitTransaction": 1, "lsid": lsid.clone(), "txnNumber": 1_i64,
    "autocommit": false, "$db": "admin"};
    for c in [&mut alice, &mut mallory] {
        let r = c.command(start.clone()).await;
        assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    }
    let stats = standin.stats();
    let ended = stats.command_count("endSessions");
    let r = mallory
        .command(doc! {"endSessions": [lsid.clone()], "$db": "admin"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let deadline = Instant::now() + BOUND;
    while stats.command_count("endSessions") == ended {
        assert!(
            Instant::now() < deadline,
            "the endSessions never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = alice.command(commit.clone()).await;
    assert_eq!(
        r.get_f64("ok").ok(),
        Some(1.0),
        "alice's session was ended: {r}"
    );
    let r = mallory.command(commit).await;
    assert_eq!(
        r.get_i32("code").ok(),
        Some(251),
        "mallory's session lives on: {r}"
    );
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// A users-file reload that maps a user to another upstream identity: his open connections
/// run as the new identity from their next request (they kept the old one before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remapped_user_runs_as_his_new_identity_after_a_reload() {
    let standin = StandIn::start(StandInConfig {
        users: support::identities::upstream_users(),
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let cfg = support::identities::pooled_config(&standin.addr().to_string(), "", "remap", 4);
    cfg.validate().unwrap();
    let users_file = cfg.auth.users_file.clone().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let (_alice, mut mallory) = support::identities::connect_both(proxy.local_addr()).await;
    let upstream_user = |r: &Document| -> String {
        r.get_document("authInfo")
            .and_then(|a| a.get_array("authenticatedUsers"))
            .ok()
            .and_then(|u| u.first()?.as_document()?.get_str("user").ok())
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    };
    let status = doc! {"connectionStatus": 1, "$db": "admin"};
    assert_eq!(upstream_user(&mallory.command(status.clone()).await), "bob");
    let text = std::fs::read_to_string(&users_file).unwrap();
    std::fs::write(&users_file, text.replace("upstream = \"other\"\n", "")).unwrap();
    assert_eq!(proxy.reload_users().unwrap(), 2);
    assert_eq!(upstream_user(&mallory.command(status).await), "app");
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// Each cursor of `kc.c` in `ids` is gone: a getMore through `raw` gets CursorNotFound.
async fn assert_gone(raw: &mut support::raw::RawConn, ids: [i64; 2]) {
    for id in ids {
        let r = raw
            .command(doc! {"getMore": id, "collection": "c", "$db": "kc"})
            .await;
        assert_eq!(
            r.get_i32("code").ok(),
            Some(43),
            "cursor {id} still open: {r}"
        );
    }
}

/// Opens cursors of `kc.c` through `raw` (a pooled mongoguard over A and another server)
/// until one lives on A and one on the other (selection spreads finds over both): their ids.
async fn cursor_on_each_server(raw: &mut support::raw::RawConn, a: &StandIn) -> [i64; 2] {
    let (mut on_a, mut on_b) = (None, None);
    for _ in 0..200 {
        if on_a.is_some() && on_b.is_some() {
            break;
        }
        let before = a.stats().command_count("find");
        let r = raw
            .command(doc! {"find": "c", "batchSize": 2, "$db": "kc"})
            .await;
        let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
        let slot = if a.stats().command_count("find") > before {
            &mut on_a
        } else {
            &mut on_b
        };
        match slot {
            None => *slot = Some(id),
            Some(_) => {
                let r = raw
                    .command(doc! {"killCursors": "c", "cursors": [id], "$db": "kc"})
                    .await;
                assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
            }
        }
    }
    [on_a.expect("a cursor on A"), on_b.expect("a cursor on B")]
}

/// A killCursors naming cursors open on different servers (to its client pooled mode is one
/// server, so a driver may batch them; pymongo does for abandoned cursors) goes to the first
/// cursor's server, and mongoguard kills the others on theirs: without it they stayed open
/// there until the server's cursor timeout, pinned. mongod's killCursors of a cursor it does
/// not hold reports it in `cursorsNotFound` and kills nothing
/// (src/mongo/db/commands/killcursors_common.h).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_cursors_of_cursors_on_several_servers_reaches_each() {
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let b = StandIn::start(StandInConfig::default()).await.unwrap();
    seed_each(&[&a, &b], "kc", 20, "").await;
    let proxy = pooled_proxy(&format!("mongodb://{},{}", a.addr(), b.addr())).await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each_server(&mut raw, &a).await;
    let (ka, kb) = (
        a.stats().command_count("killCursors"),
        b.stats().command_count("killCursors"),
    );
    let r = raw
        .command(doc! {"killCursors": "c", "cursors": [ids[0], ids[1]], "$db": "kc"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let pinned = |proxy: &ProxyHandle| proxy.pool_stats().unwrap().1.cursor.get();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.stats().command_count("killCursors") == ka
        || b.stats().command_count("killCursors") == kb
        || pinned(&proxy) > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a cursor was not killed on its server: A {} -> {}, B {} -> {}, pinned {}",
            ka,
            a.stats().command_count("killCursors"),
            kb,
            b.stats().command_count("killCursors"),
            pinned(&proxy)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_gone(&mut raw, ids).await;
    proxy.shutdown().await;
}

/// Two stand-ins at wire version 13 (MongoDB 5.0, the last with the legacy opcodes), `kc.c`
/// seeded on each.
async fn legacy_servers() -> (StandIn, StandIn) {
    let legacy = || StandInConfig {
        wire_version: 13,
        ..StandInConfig::default()
    };
    let a = StandIn::start(legacy()).await.unwrap();
    let b = StandIn::start(legacy()).await.unwrap();
    seed_each(&[&a, &b], "kc", 20, "").await;
    (a, b)
}

/// [`legacy_servers`], a pooled mongoguard over both, a raw client of it and its cursor on
/// each server.
async fn legacy_pair() -> (
    StandIn,
    StandIn,
    ProxyHandle,
    support::raw::RawConn,
    [i64; 2],
) {
    let (a, b) = legacy_servers().await;
    let proxy = pooled_proxy(&format!("mongodb://{},{}", a.addr(), b.addr())).await;
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each_server(&mut raw, &a).await;
    (a, b, proxy, raw, ids)
}

/// OP_KILL_CURSORS messages `s` has received.
fn legacy_kills(s: &StandIn) -> u64 {
    s.stats().command_count("op_kill_cursors")
}

/// Waits (≤ 10 s) until A and B have each received an OP_KILL_CURSORS since `before` (their
/// counts then).
async fn until_legacy_killed_on_both(a: &StandIn, b: &StandIn, before: (u64, u64)) {
    let (ka, kb) = before;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while legacy_kills(a) == ka || legacy_kills(b) == kb {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an OP_KILL_CURSORS did not reach its server: A {ka} -> {}, B {kb} -> {}",
            legacy_kills(a),
            legacy_kills(b)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The same with a legacy OP_KILL_CURSORS (an old driver batches its kills the same way; to
/// it pooled mode is one server): the message goes where its first cursor lives, and
/// mongoguard sends each other server an OP_KILL_CURSORS of its cursors there. The opcode has
/// no reply (mongod skips, silently, a cursor the user may not kill: runOpKillCursors in
/// src/mongo/db/run_op_kill_cursors.cpp), so nothing says a cursor died: the
/// pins stay until their TTL, and a getMore of a killed cursor still reaches its server,
/// which reports it gone. The stand-ins speak wire version 13 (5.0), the last with the
/// legacy opcodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_kill_cursors_of_cursors_on_several_servers_reaches_each() {
    let (a, b, proxy, mut raw, ids) = legacy_pair().await;
    let kills = legacy_kills;
    let (ka, kb) = (kills(&a), kills(&b));
    let message = mongoguard::wire::builder::encode_kill_cursors(4242, &ids);
    raw.stream_mut().write_all(&message).await.unwrap();
    until_legacy_killed_on_both(&a, &b, (ka, kb)).await;
    assert_gone(&mut raw, ids).await;
    proxy.shutdown().await;
}

/// Seeds `pin.c` on A and B, then opens Alice's cursor and one of Mallory's on the other
/// server: their ids.
async fn alice_and_mallory_cursors(
    a: &StandIn,
    b: &StandIn,
    alice: &mut support::raw::RawConn,
    mallory: &mut support::raw::RawConn,
) -> (i64, i64) {
    seed_each(&[a, b], "pin", 10, "app:apppw@").await;
    let on_a = |before: u64| a.stats().command_count("find") > before;
    let before = a.stats().command_count("find");
    let r = alice
        .command(doc! {"find": "c", "batchSize": 2, "$db": "pin"})
        .await;
    let alice_id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let alice_on_a = on_a(before);
    for _ in 0..200 {
        let before = a.stats().command_count("find");
        let r = mallory
            .command(doc! {"find": "c", "batchSize": 2, "$db": "pin"})
            .await;
        let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
        if on_a(before) != alice_on_a {
            return (alice_id, id);
        }
        mallory
            .command(doc! {"killCursors": "c", "cursors": [id], "$db": "pin"})
            .await;
    }
    panic!("no cursor of Mallory's on the other server");
}

/// Alice's cursor `id` of `pin.c` still serves four getMores.
async fn still_reads(alice: &mut support::raw::RawConn, id: i64) {
    for _ in 0..4 {
        let r = alice
            .command(doc! {"getMore": id, "collection": "c", "batchSize": 2, "$db": "pin"})
            .await;
        assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    }
}

/// A killCursors naming the client's own cursor first and another identity's cursor, open
/// on the other server, after it: the follow-up runs as the client's identity, the server
/// refuses it (Unauthorized), and the owner's cursor stays open and pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identitys_cursor_on_another_server_survives_a_kill_follow_up() {
    let (a, b, proxy) = two_servers_two_identities("kill-follow-identity").await;
    let (mut alice, mut mallory) = support::identities::connect_both(proxy.local_addr()).await;
    let (alice_id, mallory_id) = alice_and_mallory_cursors(&a, &b, &mut alice, &mut mallory).await;
    let pinned = |proxy: &ProxyHandle| proxy.pool_stats().unwrap().1.cursor.get();
    assert_eq!(pinned(&proxy), 2);
    let (ka, kb) = (
        a.stats().command_count("killCursors"),
        b.stats().command_count("killCursors"),
    );
    let r = mallory
        .command(doc! {"killCursors": "c", "cursors": [mallory_id, alice_id], "$db": "pin"})
        .await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    // The follow-up reaches Alice's server (and is refused there).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.stats().command_count("killCursors") + b.stats().command_count("killCursors")
        < ka + kb + 2
    {
        assert!(tokio::time::Instant::now() < deadline, "no follow-up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pinned(&proxy), 1, "Alice's pin must stay");
    still_reads(&mut alice, alice_id).await;
    proxy.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// The same with a legacy OP_KILL_CURSORS: the follow-up (an OP_KILL_CURSORS as Mallory's
/// identity) reaches Alice's server, which skips a cursor the user may not kill
/// (`killCursorIfAuthorized`, src/mongo/db/run_op_kill_cursors.cpp): Alice's cursor stays
/// open, and pinned (a legacy kill has no reply, so no pin ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identitys_cursor_on_another_server_survives_a_legacy_kill_follow_up() {
    let (a, b, proxy) = two_servers_two_identities_at("legacy-kill-identity", 13).await;
    let (mut alice, mut mallory) = support::identities::connect_both(proxy.local_addr()).await;
    let (alice_id, mallory_id) = alice_and_mallory_cursors(&a, &b, &mut alice, &mut mallory).await;
    let pinned = |proxy: &ProxyHandle| proxy.pool_stats().unwrap().1.cursor.get();
    assert_eq!(pinned(&proxy), 2);
    let kills = legacy_kills;
    let (ka, kb) = (kills(&a), kills(&b));
    let message = mongoguard::wire::builder::encode_kill_cursors(4243, &[mallory_id, alice_id]);
    mallory.stream_mut().write_all(&message).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while kills(&a) == ka || kills(&b) == kb {
        assert!(tokio::time::Instant::now() < deadline, "no follow-up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pinned(&proxy), 2, "a legacy kill ends no pin");
    // Mallory's own cursor is gone; Alice's is not.
    let r = mallory
        .command(doc! {"getMore": mallory_id, "collection": "c", "$db": "pin"})
        .await;
    assert_eq!(r.get_i32("code").ok(), Some(43), "{r}");
    still_reads(&mut alice, alice_id).await;
    proxy.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Attack probes of the legacy kill follow-up (several servers): the OP_KILL_CURSORS wrapped
/// in OP_COMPRESSED, named with a flood of duplicates, and repeated quickly, reaches both
/// servers, and leaves no connection checked out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_legacy_kill_with_duplicates_reaches_each_server_and_leaks_nothing() {
    let (a, b, proxy, mut raw, ids) = legacy_pair().await;
    let kills = legacy_kills;
    // Many quick legacy kills of cursors mongoguard does not know (first one known on A,
    // the rest bogus): no reply, so the client does not wait between them.
    for i in 0..300i64 {
        let bogus: Vec<i64> = (0..50).map(|k| 1_000_000 + i * 50 + k).collect();
        let message = mongoguard::wire::builder::encode_kill_cursors(5000 + i as i32, &bogus);
        raw.stream_mut().write_all(&message).await.unwrap();
    }
    // A round trip: the session has handled every message before it.
    let r = raw.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
    let (ka, kb) = (kills(&a), kills(&b));
    // The real one: compressed, B's cursor first, then A's repeated 2000 times.
    let mut list = vec![ids[1]];
    list.extend(std::iter::repeat_n(ids[0], 2000));
    let message = mongoguard::wire::builder::encode_kill_cursors(4250, &list);
    let packed =
        mongoguard::wire::compression::compress(&message, mongoguard::wire::Compressor::Zlib)
            .unwrap();
    raw.stream_mut().write_all(&packed).await.unwrap();
    until_legacy_killed_on_both(&a, &b, (ka, kb)).await;
    assert_gone(&mut raw, ids).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while proxy.pool_stats().unwrap().0.in_use > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a connection stayed checked out: {:?}",
            proxy.pool_stats().unwrap().0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.shutdown().await;
}

/// A legacy kill whose follow-up's server stalls: shutdown does not wait for the follow-up
/// (its bound, `reply_timeout`, is longer than the shutdown's here). That the follow-up is
/// cancelled is shown behind a load balancer (`shutdown_cancels_a_kill_follow_up_in_flight`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_kill_follow_up_to_a_stalled_server_is_bounded() {
    let (a, b) = legacy_servers().await;
    let mut cfg = Config::for_upstream(&format!("mongodb://{},{}", a.addr(), b.addr())).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.pool.pool_size = 4;
    cfg.auth.allow_unauthenticated = true;
    cfg.upstream.heartbeat_interval = Duration::from_millis(200);
    // Longer than the shutdown bound below: a shutdown that waited for the follow-up fails.
    cfg.upstream.reply_timeout = Duration::from_secs(30);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let mut raw = support::raw::RawConn::connect(proxy.local_addr())
        .await
        .unwrap();
    let ids = cursor_on_each_server(&mut raw, &a).await;
    b.set_fault(mongoguard_standin::Fault::Stall);
    let ka = legacy_kills(&a);
    let message = mongoguard::wire::builder::encode_kill_cursors(4260, &ids);
    raw.stream_mut().write_all(&message).await.unwrap();
    // The message reached A; its follow-up waits on the stalled B. (No request of the client
    // is checked here: selection may send it to B, which answers nothing.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while legacy_kills(&a) == ka {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A got no OP_KILL_CURSORS"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(raw);
    tokio::time::timeout(Duration::from_secs(10), proxy.shutdown())
        .await
        .expect("shutdown waited");
}

/// A legacy OP_KILL_CURSORS whose first cursor lives on a server that is gone (its checkout
/// fails; a legacy message has no reply to carry the error, and is dropped): its other
/// cursor, on a server that is up, must still be killed there (the follow-up needs no reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_kill_whose_first_server_is_gone_still_kills_the_others() {
    let (a, b, proxy, mut raw, ids) = legacy_pair().await;
    b.shutdown().await;
    let kills = legacy_kills;
    let ka = kills(&a);
    // B's cursor first: the message is routed to B.
    let message = mongoguard::wire::builder::encode_kill_cursors(4270, &[ids[1], ids[0]]);
    raw.stream_mut().write_all(&message).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while kills(&a) == ka {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A's cursor was never killed: {:?}",
            proxy.pool_stats().unwrap().0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = raw
        .command(doc! {"getMore": ids[0], "collection": "c", "$db": "kc"})
        .await;
    assert_eq!(
        r.get_i32("code").ok(),
        Some(43),
        "A's cursor still open: {r}"
    );
    proxy.shutdown().await;
}
