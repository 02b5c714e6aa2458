//! Memory and state that a client controls.
//!
//! * Compression bombs: OP_COMPRESSED messages declaring ~16 MB that compress to a few KB.
//!   Decompression runs inline on the runtime threads today; 20 connections sending bombs in a
//!   loop must not stop a bystander's requests from being answered (liveness bound 2 s each).
//! * A process-wide memory budget (`memory_budget`, `memory_budget_wait`): a request that
//!   cannot get budget is refused with 65003 "MongoguardMemoryBudget" and its connection stays
//!   usable. Today the keys do not exist ("unknown field") and nothing bounds the bytes.
//! * Bounded state: `lsid.id` must be a 16-byte UUID (binary subtype 4), as mongod's
//!   `LogicalSessionFromClient.id` is typed `uuid` (src/mongo/db/session/logical_session_id.idl);
//!   anything else is refused with BadValue (2) without touching the pin maps. Today the raw
//!   bytes of any binary are the key of the transaction pin map, uncapped.
//!
//! Truncation of client strings is in resilience_truncation.rs.

#[path = "support/hostile.rs"]
mod hostile;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bson::{doc, Bson, Document};
use hostile::{
    bomb, lsid, num, op_msg, proxy_from_toml, read_frame, set_request_id, within, RawClient,
    BAD_VALUE, MEMORY_BUDGET_CODE, MEMORY_BUDGET_CODE_NAME,
};
use mongoguard::{app::ProxyHandle, wire::Compressor};
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};
use tokio::io::AsyncWriteExt;

const REPLY: Duration = Duration::from_secs(10);

async fn standin() -> StandIn {
    StandIn::start(StandInConfig::default())
        .await
        .expect("start the stand-in")
}

/// A stand-in on a separate one-thread runtime (kept alive by the returned guard).
fn standin_on_own_runtime() -> (StandIn, RuntimeGuard) {
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the stand-in");
        let standin = rt
            .block_on(StandIn::start(StandInConfig::default()))
            .expect("start the stand-in");
        (standin, RuntimeGuard(Some(rt)))
    })
    .join()
    .expect("stand-in thread")
}

struct RuntimeGuard(Option<tokio::runtime::Runtime>);

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

async fn passthrough(standin: &StandIn, extra_proxy: &str) -> ProxyHandle {
    proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n{extra_proxy}\n\
         [upstream]\nuri = \"{}\"\n\
         [admin]\nlisten = \"off\"\n",
        standin.uri()
    ))
    .await
}

// ---------------------------------------------------------------------------------------------
// Compression bombs and the memory budget.

/// Failed once: decompression (and the decompressed copy) ran inline on the runtime
/// threads, so 20 connections sending 16 MB bombs kept a bystander from being answered for
/// seconds (on the 2-worker test runtime, debug build). Failed again when sessions moved to
/// per-thread loops: judging each 16 MB message (the policy scans it for JavaScript
/// operators) ran on the bombs' thread, which the bystander shares. Proves that bombs do not
/// starve the bystander: a request mongoguard answers by itself (a blocked delete, no upstream
/// involved) is answered within 2 s every time over a 5 s window. One session thread
/// (`threads = 1`), so the bystander shares its thread with every bomb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_bombs_do_not_stall_a_bystander() {
    const SIZE: usize = 15_900_000;
    // The bombs are deletes of everything: mongoguard decompresses and parses each, then
    // answers it itself (blocked by the standard policy), so the upstream never sees them and
    // only the proxy is measured. The stand-in runs on a runtime of its own anyway.
    let (standin, _standin_rt) = standin_on_own_runtime();
    let proxy = passthrough(&standin, "max_message_size = 16000000\nthreads = 1").await;
    let addr = proxy.local_addr();
    let t0 = Instant::now();
    let blocked = || doc! {"delete": "c", "$db": "bomb", "deletes": [{"q": {}, "limit": 0}]};
    let zstd = Arc::new(hostile::bomb_of(blocked(), 1, SIZE, Compressor::Zstd));
    let zlib = Arc::new(hostile::bomb_of(blocked(), 1, SIZE, Compressor::Zlib));
    println!(
        "bombs built in {:?}: zstd {} bytes, zlib {} bytes, each {SIZE} bytes decompressed",
        t0.elapsed(),
        zstd.len(),
        zlib.len()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut attackers = Vec::new();
    for i in 0..20 {
        let frame = if i % 2 == 0 {
            zstd.clone()
        } else {
            zlib.clone()
        };
        let (stop, sent) = (stop.clone(), sent.clone());
        attackers.push(tokio::spawn(async move {
            let mut c = RawClient::connect(addr).await;
            let mut id = 1;
            while !stop.load(Ordering::Relaxed) {
                let mut f = frame.as_ref().clone();
                set_request_id(&mut f, id);
                id += 1;
                if c.send_bytes(&f).await.is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                // Take mongoguard's reply, or stop if closed.
                match read_frame(&mut c.stream, Duration::from_secs(30)).await {
                    Ok(reply) => {
                        let code = num(&hostile::body_of(&reply), "code");
                        assert_eq!(code, Some(65001), "the bomb was not blocked");
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    assert!(
        within(REPLY, || sent.load(Ordering::Relaxed) >= 20).await,
        "the bombs are not being sent"
    );
    let mut bystander = RawClient::connect(addr).await;
    let mut worst = Duration::ZERO;
    let window = Instant::now();
    let mut pings = 0;
    while window.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        // A command mongoguard answers itself (the standard policy blocks a delete of
        // everything, 65001), so that only the proxy is measured, not the upstream.
        let result = bystander
            .command(
                doc! {"delete": "c", "$db": "bystander", "deletes": [{"q": {}, "limit": 0}]},
                Duration::from_secs(2),
            )
            .await
            .and_then(|r| match num(&r, "code") {
                Some(65001) => Ok(()),
                _ => Err(format!("not answered by mongoguard's policy: {r}")),
            });
        let took = t.elapsed();
        worst = worst.max(took);
        result.unwrap_or_else(|e| {
            panic!("bystander request #{pings} under 20 bomb senders: {e} (after {took:?})")
        });
        pings += 1;
        // Pacing of the bystander's requests while the bombs fly (not a synchronisation).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    println!(
        "bystander: {pings} requests, worst {worst:?}; {} bombs sent",
        sent.load(Ordering::Relaxed)
    );
    for a in attackers {
        a.abort();
    }
    proxy.shutdown().await;
}

/// A 6 MB (decompressed) ping sent as zstd.
fn six_mb_ping() -> Vec<u8> {
    bomb(1, 6 * 1024 * 1024, Compressor::Zstd)
}

fn assert_budget_refusal(reply: &Document) {
    assert_eq!(num(reply, "ok"), Some(0), "{reply}");
    assert_eq!(
        num(reply, "code"),
        Some(i64::from(MEMORY_BUDGET_CODE)),
        "{reply}"
    );
    assert_eq!(
        reply.get_str("codeName").ok(),
        Some(MEMORY_BUDGET_CODE_NAME),
        "{reply}"
    );
}

/// Fails today: `memory_budget` is an unknown field (and nothing refuses a message for
/// memory). Proves: a message that alone exceeds the budget is refused with 65003 after at
/// most memory_budget_wait, and its connection still answers a ping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_larger_than_the_memory_budget_is_refused_and_the_connection_stays() {
    let standin = standin().await;
    let proxy = passthrough(
        &standin,
        "memory_budget = \"8MiB\"\nmemory_budget_wait = \"200ms\"",
    )
    .await;
    let mut c = RawClient::connect(proxy.local_addr()).await;
    let mut frame = bomb(1, 12 * 1024 * 1024, Compressor::Zstd);
    set_request_id(&mut frame, 77);
    c.send_bytes(&frame).await.expect("send 12 MB compressed");
    let reply = read_frame(&mut c.stream, REPLY)
        .await
        .expect("a reply to the message over budget, not a closed connection");
    assert_budget_refusal(&hostile::body_of(&reply));
    c.ping(REPLY).await.expect("ping on the refused connection");
    proxy.shutdown().await;
}

/// Fails today (unknown field). Proves: under contention some 6 MB messages are refused with
/// 65003, none is answered otherwise than ok:1 or 65003, and every connection still answers a
/// ping. memory_budget_wait is short (10 ms) so that contention shows even on a fast machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_messages_over_the_memory_budget_get_65003() {
    let standin = standin().await;
    let proxy = passthrough(
        &standin,
        "memory_budget = \"8MiB\"\nmemory_budget_wait = \"10ms\"",
    )
    .await;
    let frame = Arc::new(six_mb_ping());
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(RawClient::connect(proxy.local_addr()).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut tasks = Vec::new();
    for mut c in clients {
        let (frame, barrier) = (frame.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for round in 0..3 {
                barrier.wait().await;
                let mut f = frame.as_ref().clone();
                set_request_id(&mut f, 100 + round);
                c.stream.write_all(&f).await.expect("send 6 MB");
                let reply = read_frame(&mut c.stream, REPLY)
                    .await
                    .expect("a reply, not a closed connection");
                results.push(hostile::body_of(&reply));
            }
            c.ping(REPLY).await.expect("ping after the 6 MB messages");
            results
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        for reply in tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("client task ends")
            .expect("client task")
        {
            if num(&reply, "ok") == Some(1) {
                ok += 1;
            } else {
                assert_budget_refusal(&reply);
                refused += 1;
            }
        }
    }
    println!("30 concurrent 6 MB messages with an 8 MiB budget: {ok} ok, {refused} refused");
    assert!(ok > 0, "every message was refused");
    assert!(refused > 0, "no message was refused by the memory budget");
    proxy.shutdown().await;
}

/// Eight documents of 1 MiB in `t.big`, inserted straight into the stand-in.
async fn eight_mib_collection(standin: &StandIn) {
    let mut c = RawClient::connect(standin.addr()).await;
    let pad = "x".repeat(1024 * 1024);
    for i in 0..8 {
        let reply = c
            .command(
                doc! {"insert": "big", "documents": [{"_id": i, "pad": &pad}], "$db": "t"},
                REPLY,
            )
            .await
            .expect("insert a 1 MiB document");
        assert_eq!(num(&reply, "n"), Some(1), "{reply}");
    }
}

fn find_big() -> Document {
    doc! {"find": "big", "filter": {"_id": {"$gte": 0}}, "batchSize": 8, "$db": "t"}
}

/// Failed before replies took budget: the memory budget counted client messages only, so
/// clients that ask for large replies and never read them made mongoguard hold every reply
/// (up to 48 MB each) with no bound. Proves: a large reply takes its size from the budget
/// before it is buffered and holds it until it is sent; a second client whose 8 MiB reply
/// finds the budget spent (12 MiB, 8 held by a client that does not read) gets error 65003
/// saying its command ran and the reply was not relayed, then its connection is closed; the
/// first client's reply arrives whole once it reads; the budget is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_replies_take_the_memory_budget_and_a_reply_over_it_gets_65003() {
    large_replies_over_the_budget(false).await;
}

/// The same in pooled mode (the reply is read from a pooled connection, which is discarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_large_replies_take_the_memory_budget_and_a_reply_over_it_gets_65003() {
    large_replies_over_the_budget(true).await;
}

async fn large_replies_over_the_budget(pooled: bool) {
    let standin = standin().await;
    eight_mib_collection(&standin).await;
    let limits = "memory_budget = \"12MiB\"\nmemory_budget_wait = \"200ms\"\n\
                  client_write_timeout = \"60s\"";
    let proxy = if pooled {
        proxy_from_toml(&format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\nmode = \"pooled\"\n{limits}\n\
             [upstream]\nuri = \"{}\"\n[auth]\nallow_unauthenticated = true\n\
             [admin]\nlisten = \"off\"\n",
            standin.uri()
        ))
        .await
    } else {
        passthrough(&standin, limits).await
    };
    // A client that asks for 8 MiB and does not read: its reply is stuck in mongoguard's send.
    let mut slow = RawClient::connect_small_window(proxy.local_addr()).await;
    let id = slow.send(&find_big()).await;
    assert!(
        within(Duration::from_secs(20), || proxy.memory_budget_in_use()
            >= 8 * 1024 * 1024)
        .await,
        "the unread 8 MiB reply holds the budget"
    );

    let mut other = RawClient::connect(proxy.local_addr()).await;
    let reply = other
        .command(find_big(), REPLY)
        .await
        .expect("an error reply, not a closed connection or a timeout");
    assert_budget_refusal(&reply);
    let errmsg = reply.get_str("errmsg").unwrap_or_default();
    assert!(errmsg.contains("reply was not relayed"), "{errmsg}");
    assert!(
        read_frame(&mut other.stream, REPLY).await.is_err(),
        "the connection whose reply was dropped is closed"
    );

    let frame = read_frame(&mut slow.stream, Duration::from_secs(30))
        .await
        .expect("the slow client's whole reply");
    let response_to = i32::from_le_bytes([frame[8], frame[9], frame[10], frame[11]]);
    assert_eq!(response_to, id);
    let body = hostile::body_of(&frame);
    assert_eq!(num(&body, "ok"), Some(1), "ok");
    let batch = body
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .expect("cursor.firstBatch");
    assert_eq!(batch.len(), 8);
    assert!(
        within(Duration::from_secs(10), || proxy.memory_budget_in_use()
            == 0)
        .await,
        "the budget is given back once the reply is sent"
    );
    let mut again = RawClient::connect(proxy.local_addr()).await;
    let reply = again.command(find_big(), REPLY).await.expect("find");
    assert_eq!(
        num(&reply, "ok"),
        Some(1),
        "with the budget free the reply is relayed"
    );
    proxy.shutdown().await;
}

/// A write whose reply is large must not lose its outcome to readers that hold the budget:
/// it waits for them to be served or cut off (`client_write_timeout`), not only
/// `memory_budget_wait`. Failed with the reply budget alone: the findAndModify ran, its 5 MiB
/// reply found 8 of the 12 MiB held by a client that does not read, and after 200 ms the
/// client got 65003 for a write the server had applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_reply_waits_for_slow_readers_to_be_cut_off() {
    let standin = standin().await;
    eight_mib_collection(&standin).await;
    let mut direct = RawClient::connect(standin.addr()).await;
    let reply = direct
        .command(
            doc! {"insert": "big", "documents": [{"_id": 100, "n": 0, "pad": "y".repeat(5 << 20)}], "$db": "t"},
            REPLY,
        )
        .await
        .expect("insert a 5 MiB document");
    assert_eq!(num(&reply, "n"), Some(1), "{reply}");
    let proxy = passthrough(
        &standin,
        "memory_budget = \"12MiB\"\nmemory_budget_wait = \"200ms\"\nclient_write_timeout = \"2s\"",
    )
    .await;
    let mut slow = RawClient::connect_small_window(proxy.local_addr()).await;
    slow.send(&find_big()).await;
    assert!(
        within(Duration::from_secs(20), || proxy.memory_budget_in_use()
            >= 8 * 1024 * 1024)
        .await,
        "the unread 8 MiB reply holds the budget"
    );
    let mut writer = RawClient::connect(proxy.local_addr()).await;
    let started = Instant::now();
    let reply = writer
        .command(
            doc! {
                "findAndModify": "big", "query": {"_id": 100}, "update": {"$inc": {"n": 1}},
                "new": true, "$db": "t",
            },
            REPLY,
        )
        .await
        .expect("the write's reply");
    assert_eq!(num(&reply, "ok"), Some(1), "{reply}");
    let value = reply.get_document("value").expect("value");
    assert_eq!(
        num(value, "n"),
        Some(1),
        "applied once: {}",
        value.get_i32("n").unwrap_or(-1)
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "{took:?}");
    writer
        .ping(REPLY)
        .await
        .expect("the writer's connection stays");
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Bounded state: lsid and the transaction pin map.

async fn pooled_rs(rs: &ReplicaSet) -> ProxyHandle {
    proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nmode = \"pooled\"\n\
         [upstream]\nuri = \"{}\"\nheartbeat_interval = \"200ms\"\n\
         [auth]\nallow_unauthenticated = true\n\
         [admin]\nlisten = \"off\"\n",
        rs.uri()
    ))
    .await
}

async fn replica_set(name: &str) -> ReplicaSet {
    ReplicaSet::start(ReplicaSetConfig {
        name: name.into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .expect("start a 3-member stand-in replica set")
}

fn pinned_transactions(proxy: &ProxyHandle) -> u64 {
    proxy.pool_stats().expect("pooled mode").1.transaction.get()
}

fn txn_find(lsid: Document, txn: i64) -> Document {
    doc! {
        "find": "t", "$db": "lsid", "filter": {},
        "lsid": lsid, "txnNumber": txn, "autocommit": false, "startTransaction": true,
    }
}

/// Fails today: every binary lsid.id is accepted and pinned (the 1 MB one is a 1 MB map
/// key). Proves: a 1 MB UUID-subtype id, a 16-byte id of subtype 0, and a string id are
/// refused with BadValue (2), a short errmsg, nothing pinned, the connection usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsid_that_is_not_a_uuid_is_refused_without_pinning() {
    let rs = replica_set("rslsid").await;
    let proxy = pooled_rs(&rs).await;
    let mut c = RawClient::connect(proxy.local_addr()).await;
    c.hello(REPLY).await.expect("hello");
    let bad = [
        (
            "1 MB id of subtype 4",
            doc! {"id": Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Uuid,
                bytes: vec![0x5a; 1024 * 1024],
            })},
        ),
        (
            "16-byte id of subtype 0",
            doc! {"id": Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![7; 16],
            })},
        ),
        ("string id", doc! {"id": "0123456789abcdef"}),
    ];
    for (what, l) in bad {
        let reply = c
            .command(txn_find(l, 1), REPLY)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(num(&reply, "ok"), Some(0), "{what}: {reply}");
        assert_eq!(
            num(&reply, "code"),
            Some(i64::from(BAD_VALUE)),
            "{what}: {reply}"
        );
        let errmsg = reply.get_str("errmsg").unwrap_or("");
        assert!(
            !errmsg.is_empty() && errmsg.len() < 2048,
            "{what}: errmsg of {} bytes",
            errmsg.len()
        );
        assert_eq!(pinned_transactions(&proxy), 0, "{what} was pinned");
        c.ping(REPLY)
            .await
            .unwrap_or_else(|e| panic!("ping after {what}: {e}"));
    }
    // A proper UUID still works and is pinned.
    let good = c
        .command(txn_find(lsid(1), 1), REPLY)
        .await
        .expect("a UUID lsid");
    assert_eq!(num(&good, "ok"), Some(1), "{good}");
    assert_eq!(pinned_transactions(&proxy), 1);
    proxy.shutdown().await;
    rs.shutdown().await;
}

/// The cap the transaction pin map must have, like CURSOR_MAP_CAP in src/proxy/pooled.rs.
const TXN_MAP_CAP: u64 = 100_000;
/// How long an idle transaction pin lives (TXN_TTL in src/proxy/pooled.rs).
const PIN_TTL: Duration = Duration::from_secs(5 * 60);
/// Distinct transactions started; above the cap.
const TXNS: u64 = 150_000;

/// `TXNS` in the environment overrides the number (e.g. to watch the gauge grow on main with
/// a shorter run).
fn txns() -> u64 {
    std::env::var("TXNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TXNS)
}

/// Fails today: the transaction pin map has no cap (measured on main with TXNS=16000: 16,000
/// pinned of 16,000; the full run, 519 s under load, ended with 103,672 pinned, the older
/// ones having expired after 5 minutes). Proves: the pinned-transaction gauge never exceeds 100,000 whatever the
/// number of distinct lsids. Ignored by default: 150,000 pipelined round trips run at about
/// 500 per second in a debug build on the 2-core machine (5 minutes), far over the 20 s
/// budget of a test; run it with `cargo test --release --test resilience_memory -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "150,000 round trips: minutes in a debug build; run with --ignored"]
async fn transaction_pin_map_is_capped() {
    let rs = replica_set("rscap").await;
    let proxy = pooled_rs(&rs).await;
    let addr = proxy.local_addr();
    let started = Instant::now();
    let conns = 8u64;
    let per = txns() / conns;
    let mut tasks = Vec::new();
    for k in 0..conns {
        tasks.push(tokio::spawn(async move {
            let c = RawClient::connect(addr).await;
            let (mut read, mut write) = c.stream.into_split();
            let writer = tokio::spawn(async move {
                let mut buf = Vec::with_capacity(64 * 1024);
                for i in 0..per {
                    let n = k * per + i;
                    buf.extend_from_slice(&op_msg(i as i32 + 1, 0, &txn_find(lsid(n), 1)));
                    if buf.len() >= 60 * 1024 || i + 1 == per {
                        write.write_all(&buf).await.expect("pipeline");
                        buf.clear();
                    }
                }
                write
            });
            let mut ok = 0u64;
            let mut header = [0u8; 16];
            for _ in 0..per {
                tokio::io::AsyncReadExt::read_exact(&mut read, &mut header)
                    .await
                    .expect("reply header");
                let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
                let mut frame = vec![0u8; len as usize];
                frame[..16].copy_from_slice(&header);
                tokio::io::AsyncReadExt::read_exact(&mut read, &mut frame[16..])
                    .await
                    .expect("reply body");
                if num(&hostile::body_of(&frame), "ok") == Some(1) {
                    ok += 1;
                }
            }
            let _write = writer.await.expect("writer");
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        // Generous: this test is ignored by default because it is long (see above).
        ok += tokio::time::timeout(Duration::from_secs(900), t)
            .await
            .expect("pipelined transactions finish")
            .expect("task");
    }
    let elapsed = started.elapsed();
    let pinned = pinned_transactions(&proxy);
    println!(
        "{} transactions started ({ok} ok) in {elapsed:?}; {pinned} pinned",
        txns()
    );
    assert!(ok > 0, "no transaction statement succeeded");
    assert!(
        pinned <= TXN_MAP_CAP,
        "{pinned} transactions pinned, over the cap of {TXN_MAP_CAP}"
    );
    // Pins idle for TXN_TTL (5 min in src/proxy/pooled.rs) are expired by the maintenance
    // task: a run slower than that could stay under the cap without one. Inconclusive then,
    // so it fails rather than passes.
    assert!(
        elapsed < PIN_TTL,
        "inconclusive: the run took {elapsed:?}, longer than the pins' {PIN_TTL:?} lifetime; \
         run it on a less loaded machine or with --release"
    );
    proxy.shutdown().await;
    rs.shutdown().await;
}
