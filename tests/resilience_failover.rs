//! Failovers, in both modes.
//!
//! * Pooled mode, a transaction pinned to the old primary: its next statement gets
//!   NotWritablePrimary (10107); today the one resend goes back to the pinned (stale) server,
//!   the second not-primary reply reaches `unreachable!("only reported when asked to retry")`
//!   in src/proxy/pooled.rs `forward`, the session task panics: the client's connection is
//!   dropped without a reply, `active` stays counted and no close event is written. The same
//!   panic is reached without a transaction when the upstream says not-primary twice in a row
//!   (a fake upstream that claims to be primary in hello and refuses every write).
//! * Passthrough with a replica-set seed list connects every client to the first host; after a
//!   step-down no acknowledged write resumes. Fixed: sessions follow the primary.
//! * Passthrough connects to the upstream at accept: an idle client, or one that sent half a
//!   header, costs an upstream connection. Fixed: lazily, on the first request.

#[path = "support/hostile.rs"]
mod hostile;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use hostile::{
    lsid, num, proxy_from_toml, temp_dir, within, Answer, FakeUpstream, RawClient, CLOSE_INSTEAD,
    NOT_WRITABLE_PRIMARY,
};
use mongodb::{options::ClientOptions, Client};
use mongoguard::app::ProxyHandle;
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};

const REPLY: Duration = Duration::from_secs(10);

async fn replica_set(name: &str) -> ReplicaSet {
    ReplicaSet::start(ReplicaSetConfig {
        name: name.into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .expect("start a 3-member stand-in replica set")
}

/// A pooled proxy (no client authentication, loopback) in front of `uri`, with connection
/// events written to `events` (a file).
async fn pooled(uri: &str, events: &std::path::Path) -> ProxyHandle {
    proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nmode = \"pooled\"\n\
         [upstream]\nuri = \"{uri}\"\nheartbeat_interval = \"200ms\"\n\
         server_selection_timeout = \"3s\"\n\
         [auth]\nallow_unauthenticated = true\n\
         [audit]\nevents_sink = \"file:{}\"\n\
         [admin]\nlisten = \"off\"\n",
        events.display()
    ))
    .await
}

fn pinned_transactions(proxy: &ProxyHandle) -> u64 {
    proxy
        .pool_stats()
        .expect("pooled mode has pool stats")
        .1
        .transaction
        .get()
}

/// A transaction statement: `insert` into `db.coll` with the session's lsid and txnNumber.
fn txn_insert(session: u64, txn: i64, start: bool, n: i32) -> Document {
    let mut cmd = doc! {
        "insert": "t", "$db": "txn", "documents": [{"n": n}],
        "lsid": lsid(session), "txnNumber": txn, "autocommit": false,
    };
    if start {
        cmd.insert("startTransaction", true);
    }
    cmd
}

/// After shutdown: every connection_opened event has its connection_closed.
fn events_balanced(events: &std::path::Path) {
    let text = std::fs::read_to_string(events).unwrap_or_default();
    let opened = text.matches("\"connection_opened\"").count();
    let closed = text.matches("\"connection_closed\"").count();
    assert!(opened > 0, "no connection event written:\n{text}");
    assert_eq!(
        opened, closed,
        "{opened} connections opened, {closed} close events:\n{text}"
    );
}

/// Fails today: the session panics on the second not-primary reply (connection dropped
/// without a reply). Proves: the client gets the upstream's error, the pin is dropped, the
/// connection stays usable, `active` returns to 0 and a close event is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_transaction_pinned_to_the_old_primary_gets_an_error_not_a_panic() {
    let rs = replica_set("rstx").await;
    let dir = temp_dir("txn-failover");
    let events = dir.join("events.log");
    let proxy = pooled(&rs.uri(), &events).await;
    let stats = proxy.stats();
    let mut c = RawClient::connect(proxy.local_addr()).await;
    c.hello(REPLY).await.expect("hello");
    let first = c
        .command(txn_insert(1, 1, true, 1), REPLY)
        .await
        .expect("first statement of the transaction");
    assert_eq!(num(&first, "ok"), Some(1), "{first}");
    assert_eq!(pinned_transactions(&proxy), 1, "the transaction is pinned");
    // Member 0 steps down; member 1 is elected at once.
    rs.step_down(1, Duration::ZERO);
    assert_eq!(rs.primary(), Some(1));
    let second = c
        .command(txn_insert(1, 1, false, 2), REPLY)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "second statement after the step-down: {e} (active = {})",
                stats.active.get()
            )
        });
    assert_eq!(num(&second, "ok"), Some(0), "{second}");
    assert_eq!(
        num(&second, "code"),
        Some(i64::from(NOT_WRITABLE_PRIMARY)),
        "the client gets the upstream's error: {second}"
    );
    assert!(
        within(REPLY, || pinned_transactions(&proxy) == 0).await,
        "the pin to the old primary was not dropped ({} pinned)",
        pinned_transactions(&proxy)
    );
    // The connection still serves, and a new transaction goes to the new primary.
    c.ping(REPLY)
        .await
        .expect("ping after the failed statement");
    let before = rs.member(1).stats().command_count("insert");
    let next = c
        .command(txn_insert(1, 2, true, 3), REPLY)
        .await
        .expect("a new transaction after the failover");
    assert_eq!(num(&next, "ok"), Some(1), "{next}");
    assert_eq!(rs.member(1).stats().command_count("insert"), before + 1);
    drop(c);
    assert!(
        within(REPLY, || stats.active.get() == 0).await,
        "active = {} after the client left",
        stats.active.get()
    );
    tokio::time::timeout(Duration::from_secs(15), proxy.shutdown())
        .await
        .expect("shutdown");
    events_balanced(&events);
    rs.shutdown().await;
}

/// A fake primary that refuses every command but ping/endSessions with NotWritablePrimary.
async fn always_not_primary() -> FakeUpstream {
    let answer: Answer = Arc::new(|name: &str, _body: &Document| match name {
        "ping" | "endSessions" | "buildInfo" | "buildinfo" => doc! {"ok": 1.0},
        _ => doc! {
            "ok": 0.0, "code": NOT_WRITABLE_PRIMARY, "codeName": "NotWritablePrimary",
            "errmsg": "not primary",
        },
    });
    FakeUpstream::start("fk", answer).await
}

/// The not-primary error codes, and 133 FailedToSatisfyReadPreference (what mongoguard answers
/// when no primary is found within server_selection_timeout): a proxy that keeps hearing
/// "not primary" may answer either, but it must answer.
const ACCEPTED_CODES: [i64; 4] = [10107, 13435, 13436, 133];

/// Fails today (panic on the second not-primary reply, no reply at all). Proves: any number
/// of not-primary replies gets the client an error reply, the connection stays usable, no
/// session is leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_upstream_that_keeps_saying_not_primary_never_panics_a_session() {
    let fake = always_not_primary().await;
    let dir = temp_dir("always-not-primary");
    let events = dir.join("events.log");
    let proxy = pooled(&fake.uri("fk"), &events).await;
    let stats = proxy.stats();
    let mut c = RawClient::connect(proxy.local_addr()).await;
    c.hello(REPLY).await.expect("hello");
    // A plain write, a transaction's first statement, then its second.
    let commands = [
        doc! {"insert": "t", "$db": "fk", "documents": [{"n": 1}]},
        txn_insert(7, 1, true, 1),
        txn_insert(7, 1, false, 2),
    ];
    for (i, cmd) in commands.into_iter().enumerate() {
        let reply = c
            .command(cmd, Duration::from_secs(15))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "command #{i} against an upstream that keeps saying not-primary: {e} \
                 (active = {})",
                    stats.active.get()
                )
            });
        assert_eq!(num(&reply, "ok"), Some(0), "{reply}");
        let code = num(&reply, "code").unwrap_or(0);
        assert!(
            ACCEPTED_CODES.contains(&code),
            "command #{i}: unexpected error {reply}"
        );
        c.ping(REPLY)
            .await
            .unwrap_or_else(|e| panic!("ping after command #{i}: {e}"));
    }
    assert!(
        fake.commands.load(Ordering::Relaxed) >= 3,
        "the writes never reached the upstream"
    );
    assert!(
        within(REPLY, || pinned_transactions(&proxy) == 0).await,
        "{} transactions still pinned",
        pinned_transactions(&proxy)
    );
    drop(c);
    assert!(
        within(REPLY, || stats.active.get() == 0).await,
        "active = {} after the client left",
        stats.active.get()
    );
    tokio::time::timeout(Duration::from_secs(15), proxy.shutdown())
        .await
        .expect("shutdown");
    events_balanced(&events);
}

// ---------------------------------------------------------------------------------------------
// Passthrough.

async fn passthrough(uri: &str, extra_proxy: &str) -> ProxyHandle {
    proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n{extra_proxy}\n\
         [upstream]\nuri = \"{uri}\"\nheartbeat_interval = \"200ms\"\n\
         [admin]\nlisten = \"off\"\n"
    ))
    .await
}

/// A blocked statement of a transaction makes mongoguard send abortTransaction upstream; here
/// the upstream dies instead of answering it. Before the single request pipeline, passthrough
/// ended the session on that failure before answering, so the client lost its connection
/// without learning why (reasoned from the old code's `abort_transaction(..).await?`; not
/// re-run against it). Proves: the client gets the block error (65001), its connection stays
/// usable (the next command opens a new upstream connection: the ping only works if it does),
/// and nothing is left counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_abort_on_a_dying_upstream_still_answers_the_block() {
    let answer: Answer = Arc::new(|name: &str, _body: &Document| match name {
        "abortTransaction" => doc! {CLOSE_INSTEAD: true},
        _ => doc! {"ok": 1.0},
    });
    let fake = FakeUpstream::start("fa", answer).await;
    let proxy = passthrough(&fake.uri("fa"), "").await;
    let stats = proxy.stats();
    let mut c = RawClient::connect(proxy.local_addr()).await;
    c.hello(REPLY).await.expect("hello");
    // An always-true multi-update inside a transaction: W001 blocks it.
    let blocked = doc! {
        "update": "t", "$db": "txn", "lsid": lsid(9), "txnNumber": 1_i64,
        "autocommit": false, "startTransaction": true,
        "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": true}],
    };
    let reply = c
        .command(blocked, REPLY)
        .await
        .expect("the blocked statement is answered although the abort failed");
    assert_eq!(num(&reply, "code"), Some(65001), "{reply}");
    c.ping(REPLY)
        .await
        .expect("the client connection stays usable after the failed abort");
    drop(c);
    assert!(
        within(REPLY, || stats.active.get() == 0).await,
        "active = {} after the client left",
        stats.active.get()
    );
    proxy.shutdown().await;
}

/// Fails today: passthrough stays on the first seed; after the step-down every write gets
/// NotWritablePrimary and no acknowledged write resumes. Proves: acknowledged writes resume
/// within 10 s of a step-down (300 ms election gap) and nothing acknowledged is lost or
/// doubled (checked on the new primary directly).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_follows_the_primary_and_loses_no_acknowledged_write() {
    let rs = replica_set("rspt").await;
    let proxy = passthrough(&rs.uri(), "").await;
    let mut opts = ClientOptions::parse(format!(
        "mongodb://{}/?directConnection=true&retryWrites=true",
        proxy.local_addr()
    ))
    .await
    .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    let client = Client::with_options(opts).unwrap();
    let coll = client.database("ledger").collection::<Document>("w");
    let stop = Arc::new(AtomicBool::new(false));
    let acked_total = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..4i64 {
        let (coll, stop, acked_total) = (coll.clone(), stop.clone(), acked_total.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut failures = 0usize;
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let n = w * 1_000_000 + i;
                i += 1;
                match coll.insert_one(doc! {"n": n}).await {
                    Ok(_) => {
                        acked.push(n);
                        acked_total.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        failures += 1;
                        // A writer's back-off after a failed write (pacing, not a
                        // synchronisation).
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (acked, failures)
        }));
    }
    assert!(
        within(REPLY, || acked_total.load(Ordering::Relaxed) >= 20).await,
        "writes through passthrough do not work before the failover"
    );
    let m1_before = rs.member(1).stats().command_count("insert");
    rs.step_down(1, Duration::from_millis(300));
    let stepped = Instant::now();
    let acked_at_step = acked_total.load(Ordering::Relaxed);
    // Resumed = the new primary took writes through mongoguard and more than a handful of
    // acknowledgements arrived after the step-down.
    let resumed = within(Duration::from_secs(10), || {
        rs.member(1).stats().command_count("insert") > m1_before
            && acked_total.load(Ordering::Relaxed) > acked_at_step + 10
    })
    .await;
    let resumed_after = stepped.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    let mut failures = 0;
    for w in writers {
        let (a, f) = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("writer ends")
            .expect("writer task");
        acked.extend(a);
        failures += f;
    }
    assert!(
        resumed,
        "no acknowledged write on the new primary within 10 s of the step-down \
         ({} inserts reached member 1; {failures} writes failed)",
        rs.member(1).stats().command_count("insert") - m1_before
    );
    println!(
        "writes resumed {resumed_after:?} after the step-down; {} acknowledged, {failures} failed",
        acked.len()
    );
    // The ledger: every acknowledged n exactly once, read from the new primary directly.
    let direct = Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true",
        rs.member(1).addr()
    ))
    .await
    .unwrap();
    let docs: Vec<Document> = direct
        .database("ledger")
        .collection::<Document>("w")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut seen: HashMap<i64, usize> = HashMap::new();
    for d in &docs {
        let n = match d.get("n") {
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Int32(n)) => i64::from(*n),
            other => panic!("document without n: {other:?}"),
        };
        *seen.entry(n).or_default() += 1;
    }
    for n in &acked {
        match seen.get(n) {
            Some(1) => {}
            Some(k) => panic!("acknowledged write {n} stored {k} times"),
            None => panic!("acknowledged write {n} lost"),
        }
    }
    tokio::time::timeout(Duration::from_secs(15), proxy.shutdown())
        .await
        .expect("shutdown");
    rs.shutdown().await;
}

/// Fails today: passthrough sends every new session to the first seed, and keeps a session
/// on the old primary. Proves, at the wire level, the two halves of "follows the primary"
/// after a step-down: (a) a new session's write reaches the new primary; (b) a session that
/// was attached to the old primary never gets NotWritablePrimary for its next request: it is
/// closed between requests (EOF, so the driver reconnects and retries) or its request is
/// served by the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_sessions_follow_the_primary_after_a_step_down() {
    let rs = replica_set("rsidle").await;
    let proxy = passthrough(&rs.uri(), "").await;
    let insert = |n: i32| doc! {"insert": "t", "$db": "idle", "documents": [{"n": n}]};
    let mut old = RawClient::connect(proxy.local_addr()).await;
    let first = old.command(insert(1), REPLY).await.expect("insert");
    assert_eq!(num(&first, "ok"), Some(1), "{first}");
    assert_eq!(rs.member(0).stats().command_count("insert"), 1);
    rs.step_down(1, Duration::ZERO);
    // (a) A new session writes to member 1 (polled: the proxy learns of the change through
    // its monitor).
    let started = Instant::now();
    let mut last = String::new();
    let mut routed = false;
    while !routed && started.elapsed() < Duration::from_secs(5) {
        let mut c = RawClient::connect(proxy.local_addr()).await;
        match c.command(insert(2), REPLY).await {
            Ok(r) if num(&r, "ok") == Some(1) => routed = true,
            Ok(r) => last = r.to_string(),
            Err(e) => last = e,
        }
        if !routed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        routed,
        "no new session could write within 5 s of the step-down: {last}"
    );
    println!(
        "new sessions write again {:?} after the step-down",
        started.elapsed()
    );
    assert_eq!(rs.member(1).stats().command_count("insert"), 1);
    // (b) The session opened before the step-down.
    match old.command(insert(3), REPLY).await {
        Err(e) if e.contains("closed") => {}
        Err(e) => panic!("the old session neither closed nor answered: {e}"),
        Ok(r) => {
            assert_eq!(
                num(&r, "ok"),
                Some(1),
                "the session attached to the old primary got {r}"
            );
            assert_eq!(rs.member(1).stats().command_count("insert"), 2);
        }
    }
    tokio::time::timeout(Duration::from_secs(15), proxy.shutdown())
        .await
        .expect("shutdown");
    rs.shutdown().await;
}

/// Fails today: passthrough opens the upstream connection at accept, so 100 clients that
/// send no whole request cost 100 upstream connections. Proves: the upstream connection is
/// opened on the first request that needs it (idle clients and half headers cost none), and
/// a client that then sends a request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_connects_upstream_lazily() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = passthrough(&standin.uri(), "").await;
    let stats = proxy.stats();
    let upstream = standin.stats();
    // Warm-up: one request, then the client leaves.
    {
        let mut c = RawClient::connect(proxy.local_addr()).await;
        c.ping(REPLY).await.expect("warm-up ping");
    }
    assert!(within(REPLY, || stats.active.get() == 0).await);
    let baseline = upstream.connections_accepted();
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(RawClient::connect(proxy.local_addr()).await);
    }
    let mut half = Vec::new();
    let frame = hostile::op_msg(1, 0, &doc! {"ping": 1, "$db": "admin"});
    for _ in 0..50 {
        let mut c = RawClient::connect(proxy.local_addr()).await;
        c.send_bytes(&frame[..8]).await.expect("half a header");
        half.push(c);
    }
    assert!(
        within(REPLY, || stats.active.get() == 100).await,
        "active = {}",
        stats.active.get()
    );
    // Whatever the proxy does at accept is done by now; the absence of upstream connections
    // can only be checked after some time (this wait is the condition, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let opened = upstream.connections_accepted() - baseline;
    assert!(
        opened <= 2,
        "100 clients without a whole request opened {opened} upstream connections"
    );
    // One of the idle clients now sends a request: it is served (through one new connection).
    let mut first = idle.pop().expect("an idle client");
    first
        .ping(REPLY)
        .await
        .expect("ping from a formerly idle client");
    assert!(upstream.connections_accepted() - baseline <= opened + 1);
    drop((idle, half, first));
    tokio::time::timeout(Duration::from_secs(15), proxy.shutdown())
        .await
        .expect("shutdown");
}
