//! Sessions run on `proxy.threads` event loops (`mongoguard::proxy::loops`): each client is
//! served there, the threads end with the proxy, and `proxy.work_stealing` starts none.
//! Pooled sessions run there too, each loop checking out of its own shard of the pool, when
//! the pool is large enough to give every loop `MIN_SHARD` (4) connections; a loop whose
//! clients wait gets a slot another loop has free.
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

/// `command` on `c`, answered within [`BOUND`] with `ok: 1` (`what` names the client).
async fn answered(c: &mut RawConn, command: bson::Document, what: &str) -> bson::Document {
    let reply = tokio::time::timeout(BOUND, c.command(command))
        .await
        .expect("answered");
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{what}: {reply:?}");
    reply
}

async fn shut_down(proxy: mongoguard::app::ProxyHandle) {
    tokio::time::timeout(BOUND, proxy.shutdown())
        .await
        .expect("shutdown is bounded");
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
        answered(
            &mut c,
            doc! {"ping": 1, "$db": "admin"},
            &format!("client {i}"),
        )
        .await;
        clients.push(c);
    }
    assert_eq!(proxy.stats().active.get(), 7);
    shut_down(proxy).await;
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
    answered(&mut c, doc! {"ping": 1, "$db": "admin"}, "the client").await;
    assert_eq!(
        session_threads(),
        Vec::<String>::new(),
        "work_stealing: no session thread, whatever proxy.threads says"
    );
    shut_down(proxy).await;
}

fn pooled(c: &mut Config, threads: usize, pool_size: usize) {
    c.proxy.mode = mongoguard::config::Mode::Pooled;
    c.auth.allow_unauthenticated = true;
    c.proxy.threads = threads;
    c.pool.pool_size = pool_size;
}

/// Pooled mode with a pool of 8 over two threads: two session threads, and every client
/// served (pool shards of 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sessions_run_on_the_loops_when_the_pool_shards() {
    let _serial = SERIAL.lock().await;
    let (_standin, config) = config(|c| pooled(c, 2, 8)).await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    assert_eq!(session_threads(), ["mg-session-1", "mg-session-2"]);
    let mut clients = Vec::new();
    for i in 0..6 {
        let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
        answered(
            &mut c,
            doc! {"find": "t", "filter": {}, "$db": "shards"},
            &format!("client {i}"),
        )
        .await;
        clients.push(c);
    }
    shut_down(proxy).await;
}

/// A pool too small to give two loops 4 connections each keeps pooled sessions on the
/// shared runtime, whatever `proxy.threads` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sessions_stay_on_the_shared_runtime_with_a_small_pool() {
    let _serial = SERIAL.lock().await;
    let (_standin, config) = config(|c| pooled(c, 2, 7)).await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
    answered(&mut c, doc! {"ping": 1, "$db": "admin"}, "the client").await;
    assert_eq!(session_threads(), Vec::<String>::new());
    shut_down(proxy).await;
}

/// A pooled proxy (pool of 8 on two loops, `tweak` applied) whose first loop has its 4
/// connections held by 4 commands the upstream holds for `hold_ms`, while the second
/// loop's 5 clients stay idle and its shard has every slot free. Returns the first loop's
/// fifth client (the probe), the held commands, and the idle clients (kept open: a closed
/// one would leave its loop with fewer sessions).
async fn one_loop_held(
    tweak: impl FnOnce(&mut Config),
    hold_ms: i32,
) -> (
    mongoguard::app::ProxyHandle,
    StandIn,
    RawConn,
    Vec<tokio::task::JoinHandle<bson::Document>>,
    Vec<RawConn>,
) {
    let (standin, config) = config(|c| {
        pooled(c, 2, 8);
        tweak(c);
    })
    .await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    // A new client goes to the loop with the fewest sessions, the first on a tie: clients
    // 0, 2, 4, 6 and 8 share a loop (each answered before the next connects, so that it is
    // counted there).
    let (mut busy_loop, mut idle_loop) = (Vec::new(), Vec::new());
    for i in 0..10 {
        let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
        let ping = doc! {"ping": 1, "$db": "admin"};
        answered(&mut c, ping, &format!("client {i}")).await;
        if i % 2 == 0 {
            busy_loop.push(c);
        } else {
            idle_loop.push(c);
        }
    }
    let probe_client = busy_loop.pop().unwrap();
    let direct = mongodb::Client::with_uri_str(standin.uri()).await.unwrap();
    direct
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand", "mode": {"times": 4},
            "data": {"failCommands": ["distinct"], "blockConnection": true, "blockTimeMS": hold_ms},
        })
        .await
        .unwrap();
    direct.shutdown().await;
    let held: Vec<_> = busy_loop
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                c.command(doc! {"distinct": "t", "key": "a", "$db": "shards"})
                    .await
            })
        })
        .collect();
    // All four are at the upstream, holding the busy loop's four connections.
    let deadline = tokio::time::Instant::now() + BOUND;
    while standin.stats().command_count("distinct") < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held commands never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (proxy, standin, probe_client, held, idle_loop)
}

/// Every held command of [`one_loop_held`] ends with `ok: 1`.
async fn held_end(held: Vec<tokio::task::JoinHandle<bson::Document>>) {
    for h in held {
        let reply = tokio::time::timeout(BOUND, h)
            .await
            .expect("held ends")
            .unwrap();
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply:?}");
    }
}

/// The loop a pooled client is on has its 4 connections held (4 commands the upstream holds
/// for 8 s); the other loop's clients are idle and its shard has every slot free. A fifth
/// request on the busy loop is served from a slot the idle loop gives up (the pool's
/// rebalancing, every 50 ms), while the 4 held commands are still running: it does not
/// wait for one of them to end, nor time out while the pool has connections to spare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_whose_connections_are_all_held_gets_a_slot_the_other_loop_has_free() {
    let _serial = SERIAL.lock().await;
    let (proxy, _standin, mut probe_client, held, idle_loop) = one_loop_held(|_| {}, 8000).await;
    let probe = doc! {"find": "t", "filter": {}, "$db": "shards"};
    answered(&mut probe_client, probe, "the probe").await;
    assert!(
        held.iter().all(|h| !h.is_finished()),
        "the probe waited for a held command to end: no slot came from the idle loop"
    );
    held_end(held).await;
    drop(idle_loop);
    shut_down(proxy).await;
}

/// As above, with `pool.checkout_timeout` at 60 ms: shorter than a stranded waiter can wait
/// for the pool's rebalancing (it moves a slot once the waiter waited 50 ms, every 50 ms).
/// The probe is served while the 4 held commands run: the pool has 4 connections free, and
/// a client must not fail with "all 8 connections stayed in use" (65002) while they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_checkout_timeout_does_not_fail_clients_while_the_pool_has_slots_free() {
    let _serial = SERIAL.lock().await;
    let short = |c: &mut Config| c.pool.checkout_timeout = Duration::from_millis(60);
    let (proxy, _standin, mut probe_client, held, idle_loop) = one_loop_held(short, 3000).await;
    let probe = doc! {"find": "t", "filter": {}, "$db": "shards"};
    answered(
        &mut probe_client,
        probe,
        "the probe, while 4 of the pool's 8 connections were free",
    )
    .await;
    held_end(held).await;
    drop(idle_loop);
    shut_down(proxy).await;
}

/// Forty clients on a pool of 8 over two loops (four clients per connection): almost every
/// request waits for a connection, and the session releasing one writes the next waiter's
/// request on it before the hand-over (`Pool::checkout_sending`). Each client inserts its
/// own documents and reads each back by `_id`, so a reply delivered to the wrong client, a
/// request written twice or lost, shows: every find returns the client's own document, and
/// the collection holds exactly one document per insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_outnumbering_connections_get_their_own_replies_when_requests_are_sent_ahead() {
    const CLIENTS: usize = 40;
    const ROUNDS: usize = 25;
    let _serial = SERIAL.lock().await;
    let (standin, config) = config(|c| pooled(c, 2, 8)).await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    assert_eq!(session_threads(), ["mg-session-1", "mg-session-2"]);
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let addr = proxy.local_addr();
        clients.push(tokio::spawn(async move {
            let mut c = RawConn::connect(addr).await.unwrap();
            for k in 0..ROUNDS {
                let id = format!("c{i}-{k}");
                let insert = doc! {"insert": "ahead", "documents": [{"_id": &id, "i": i as i32}],
                "$db": "shards"};
                let reply = answered(&mut c, insert, &id).await;
                assert_eq!(reply.get_i32("n").ok(), Some(1), "{id}: {reply:?}");
                let find = doc! {"find": "ahead", "filter": {"_id": &id}, "$db": "shards"};
                let reply = answered(&mut c, find, &id).await;
                let batch = reply
                    .get_document("cursor")
                    .and_then(|c| c.get_array("firstBatch"))
                    .unwrap_or_else(|_| panic!("{id}: {reply:?}"));
                assert_eq!(batch.len(), 1, "{id}: {reply:?}");
                let got = batch[0].as_document().and_then(|d| d.get_str("_id").ok());
                assert_eq!(got, Some(id.as_str()), "client {i} got another's reply");
            }
        }));
    }
    all_end(clients).await;
    sent_ahead_end(proxy, &standin, "ahead", CLIENTS * ROUNDS).await;
}

/// Every task ends within [`BOUND`], without panicking.
async fn all_end(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        tokio::time::timeout(BOUND, t)
            .await
            .expect("every task ends")
            .unwrap();
    }
}

/// The end of a send-ahead test: requests were written ahead (a test of the path that never
/// took it would prove nothing), the pool stayed within its 8 connections, and `collection`
/// holds exactly `inserts` documents (none lost, none applied twice).
async fn sent_ahead_end(
    proxy: mongoguard::app::ProxyHandle,
    standin: &StandIn,
    collection: &str,
    inserts: usize,
) {
    let stats = proxy.pool_stats().unwrap().0;
    assert!(
        stats.sent_ahead > 0,
        "no request was written ahead, the path this test is about: {stats:?}"
    );
    assert!(stats.total <= 8, "{stats:?}");
    let direct = mongodb::Client::with_uri_str(standin.uri()).await.unwrap();
    let n = direct
        .database("shards")
        .collection::<bson::Document>(collection)
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(n, inserts as u64, "an insert was lost or applied twice");
    direct.shutdown().await;
    shut_down(proxy).await;
}

/// A pooled proxy (pool of 8 on two loops, `upstream.reply_timeout` `reply`,
/// `pool.checkout_timeout` `checkout`) whose eight connections are all held 300 ms (so that
/// no slot is free for the pool's rebalancing to move), while the first loop's fifth client
/// sends a `count` the upstream holds 6 s: it waits for a connection, which the first loop's
/// first release hands it, with the `count` written ahead when that is done. Returns how long
/// after the `count` was sent its client's connection closed (`None`: not within `within`),
/// and how many requests were written ahead meanwhile.
async fn count_held_past_the_reply_timeout(
    reply: Duration,
    checkout: Duration,
    within: Duration,
) -> (Option<Duration>, u64) {
    let (standin, config) = config(|c| {
        pooled(c, 2, 8);
        c.upstream.reply_timeout = reply;
        c.pool.checkout_timeout = checkout;
    })
    .await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    // Clients 0, 2, 4, 6, 8 on the first loop, the odd ones on the second (see one_loop_held).
    let mut clients = Vec::new();
    for i in 0..10 {
        let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
        let ping = doc! {"ping": 1, "$db": "admin"};
        answered(&mut c, ping, &format!("client {i}")).await;
        clients.push(c);
    }
    // Past the pings' reply timers (armed, never disarmed): none wakes a session later.
    tokio::time::sleep(reply + Duration::from_millis(200)).await;
    let mut probe = clients.remove(8);
    let direct = mongodb::Client::with_uri_str(standin.uri()).await.unwrap();
    let fail_point = |command: &str, times: i32, ms: i32| {
        doc! {
            "configureFailPoint": "failCommand", "mode": {"times": times},
            "data": {"failCommands": [command], "blockConnection": true, "blockTimeMS": ms},
        }
    };
    let admin = direct.database("admin");
    admin
        .run_command(fail_point("distinct", 8, 300))
        .await
        .unwrap();
    // The first loop's four first (clients 0, 2, 4, 6), so that they are answered first.
    let (first, second): (Vec<_>, Vec<_>) = clients
        .drain(..8)
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let mut held = Vec::new();
    for (_, mut c) in first.into_iter().chain(second) {
        held.push(tokio::spawn(async move {
            c.command(doc! {"distinct": "t", "key": "a", "$db": "shards"})
                .await
        }));
    }
    let deadline = tokio::time::Instant::now() + BOUND;
    while standin.stats().command_count("distinct") < 8 {
        assert!(tokio::time::Instant::now() < deadline, "not all held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    admin
        .run_command(fail_point("count", 1, 6000))
        .await
        .unwrap();
    let before = proxy.pool_stats().unwrap().0.sent_ahead;
    let sent = tokio::time::Instant::now();
    probe.send(0, &doc! {"count": "t", "$db": "shards"}).await;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(within, probe.stream_mut().read(&mut byte)).await;
    let closed = match read {
        Ok(Ok(0) | Err(_)) => Some(sent.elapsed()),
        Ok(Ok(_)) => panic!("the count was answered after {:?}", sent.elapsed()),
        Err(_) => None,
    };
    let ahead = proxy.pool_stats().unwrap().0.sent_ahead - before;
    held_end(held).await;
    drop(clients);
    direct.shutdown().await;
    shut_down(proxy).await;
    (closed, ahead)
}

/// A request written ahead whose reply does not come is bounded by `upstream.reply_timeout`
/// from its write, as one its client's session writes itself: its client's connection closes
/// about `reply_timeout` after the write (300 ms after it was sent), not once the session's
/// checkout timer or the late reply (6 s) wakes the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_written_ahead_is_bounded_by_the_reply_timeout_from_its_write() {
    let _serial = SERIAL.lock().await;
    // As long as the checkout timeout: written ahead; closed ~2.3 s after it was sent (the
    // session woken by its checkout timer at 2 s, then waiting 2 s more, closed it at 4 s).
    let (s2, c2) = (Duration::from_secs(2), Duration::from_secs(2));
    let (closed, ahead) =
        count_held_past_the_reply_timeout(s2, c2, Duration::from_millis(3200)).await;
    assert!(ahead >= 1, "the count was not written ahead");
    assert!(
        closed.is_some(),
        "reply_timeout (2 s) did not close a request written ahead within 3.2 s"
    );
    // Shorter than the checkout timeout (8 s): closed ~1.3 s after it was sent (the session,
    // not woken before the held reply came at 6.3 s, relayed it).
    let (s1, c8) = (Duration::from_secs(1), Duration::from_secs(8));
    let (closed, _) = count_held_past_the_reply_timeout(s1, c8, Duration::from_millis(2800)).await;
    assert!(
        closed.is_some(),
        "reply_timeout (1 s) did not close a request waiting for a connection (checkout \
         timeout 8 s) within 2.8 s"
    );
}

/// The same through an unmodified driver (the Rust driver, its own pool of up to 40
/// connections to mongoguard): 40 tasks on a pool of 8 over two loops, each inserting its own
/// documents and reading each back by `_id`. Requests are written ahead (counted), every task
/// reads its own documents, and the collection holds exactly one document per insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_with_more_connections_than_the_pool_reads_its_own_writes_when_requests_are_sent_ahead(
) {
    const TASKS: usize = 40;
    const ROUNDS: usize = 20;
    let _serial = SERIAL.lock().await;
    let (standin, config) = config(|c| pooled(c, 2, 8)).await;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let uri = format!(
        "mongodb://{}/?maxPoolSize={TASKS}&directConnection=true",
        proxy.local_addr()
    );
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let coll = client
        .database("shards")
        .collection::<bson::Document>("driver_ahead");
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let coll = coll.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..ROUNDS {
                let id = format!("d{i}-{k}");
                coll.insert_one(doc! {"_id": &id, "i": i as i32})
                    .await
                    .unwrap_or_else(|e| panic!("{id}: {e}"));
                let got = coll
                    .find_one(doc! {"_id": &id})
                    .await
                    .unwrap_or_else(|e| panic!("{id}: {e}"));
                let got = got.as_ref().and_then(|d| d.get_str("_id").ok());
                assert_eq!(got, Some(id.as_str()), "task {i} read another's document");
            }
        }));
    }
    all_end(tasks).await;
    client.shutdown().await;
    sent_ahead_end(proxy, &standin, "driver_ahead", TASKS * ROUNDS).await;
}
