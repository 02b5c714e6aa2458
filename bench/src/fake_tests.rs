//! End-to-end tests of the request loop against an in-process fake server.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongoguard::wire::Compressor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::wire::{parse_op_msg_body, Body, Endpoint, OP_MSG};
use crate::workload::{self, Op, RunResult, Scenario, Settings, BULK, DRAIN_BATCH, DRAIN_DOCS};

#[derive(Clone, Copy)]
enum Mode {
    Healthy,
    /// Reply `ok: 0` to every Nth non-hello request of a connection.
    FailEvery(u32),
    /// Close the connection right after answering `hello`.
    CloseAfterHello,
    /// A range find returns one document less than the range holds.
    ShortRange,
    /// A cursor is only reported exhausted by one more getMore with an empty batch.
    LateCursorEnd,
    /// getMore never reports the cursor exhausted (id != 0 with empty batches).
    EndlessCursor,
}

#[derive(Default)]
struct Seen {
    commands: HashMap<String, u64>,
    insert_ids: HashSet<i64>,
    duplicate_ids: u64,
    /// Documents per `insert` / statements per `update` that came in a kind-1 sequence.
    insert_sequences: Vec<usize>,
    update_sequences: Vec<usize>,
    /// Commands that carried `documents` / `updates` in their body and as a sequence.
    body_and_sequence: u64,
    /// Statements whose filter was not `{_id: <int64 in 0..docs>}` or had no `$set`.
    bad_statements: u64,
    /// `ordered` of the bulk writes.
    unordered: u64,
    /// getMores naming a cursor this connection does not have.
    unknown_cursor: u64,
    /// `batchSize` of the drain's find and getMores.
    batch_sizes: HashSet<i32>,
}

/// The kind-1 document sequences of an OP_MSG payload (checksum flag not used by loadgen).
fn sequences(payload: &[u8]) -> Vec<(String, Vec<Document>)> {
    let mut out = Vec::new();
    let mut pos = 4;
    while pos < payload.len() {
        let kind = payload[pos];
        pos += 1;
        let size = i32::from_le_bytes(payload[pos..pos + 4].try_into().expect("size")) as usize;
        if kind == 1 {
            let section = &payload[pos + 4..pos + size];
            let nul = section.iter().position(|&b| b == 0).expect("identifier");
            let ident = std::str::from_utf8(&section[..nul])
                .expect("utf-8")
                .to_string();
            let mut docs = Vec::new();
            let mut rest = &section[nul + 1..];
            while !rest.is_empty() {
                let len = i32::from_le_bytes(rest[..4].try_into().expect("len")) as usize;
                docs.push(Document::from_reader(&rest[..len]).expect("document"));
                rest = &rest[len..];
            }
            out.push((ident, docs));
        }
        pos += size;
    }
    out
}

fn i64_of(v: Option<&Bson>) -> Option<i64> {
    match v {
        Some(Bson::Int64(i)) => Some(*i),
        Some(Bson::Int32(i)) => Some(i64::from(*i)),
        _ => None,
    }
}

/// Documents `{_id}` for `ids`.
fn batch(ids: std::ops::Range<i64>) -> Vec<Document> {
    ids.map(|i| doc! { "_id": i }).collect()
}

/// Reply of the fake server to a find with an `_id` range filter (find101, drain): the
/// whole range when it fits the batch size (or there is a limit), else a cursor.
fn find_range(
    body: &Document,
    mode: Mode,
    cursors: &mut HashMap<i64, std::ops::Range<i64>>,
    next_cursor: &mut i64,
    seen: &Mutex<Seen>,
) -> Document {
    let ns = format!("loadgen.{}", body.get_str("find").unwrap_or_default());
    let range = body
        .get_document("filter")
        .and_then(|f| f.get_document("_id"));
    let Ok(range) = range else {
        return doc! { "ok": 1.0 }; // find by _id: loadgen does not look at the reply
    };
    let lo = i64_of(range.get("$gte")).expect("$gte");
    let hi = i64_of(range.get("$lt")).expect("$lt");
    let hi = if matches!(mode, Mode::ShortRange) {
        hi - 1
    } else {
        hi
    };
    let n = i64::from(body.get_i32("batchSize").unwrap_or(101));
    if let Ok(b) = body.get_i32("batchSize") {
        seen.lock().expect("lock").batch_sizes.insert(b);
    }
    let limited = body.get("limit").is_some();
    if limited || hi - lo <= n {
        return doc! { "cursor": { "id": 0_i64, "ns": ns, "firstBatch": batch(lo..hi) }, "ok": 1.0 };
    }
    let id = *next_cursor;
    *next_cursor += 1;
    cursors.insert(id, lo + n..hi);
    doc! { "cursor": { "id": id, "ns": ns, "firstBatch": batch(lo..lo + n) }, "ok": 1.0 }
}

fn get_more(
    body: &Document,
    mode: Mode,
    cursors: &mut HashMap<i64, std::ops::Range<i64>>,
    seen: &Mutex<Seen>,
) -> Document {
    let id = body.get_i64("getMore").expect("getMore: int64 cursor id");
    let ns = format!(
        "loadgen.{}",
        body.get_str("collection").expect("collection")
    );
    let n = i64::from(body.get_i32("batchSize").expect("batchSize"));
    seen.lock().expect("lock").batch_sizes.insert(n as i32);
    let Some(rest) = cursors.get_mut(&id) else {
        seen.lock().expect("lock").unknown_cursor += 1;
        return doc! { "ok": 0.0, "errmsg": format!("cursor id {id} not found"), "code": 43 };
    };
    let end = (rest.start + n).min(rest.end);
    let docs = batch(rest.start..end);
    rest.start = end;
    let exhausted = rest.is_empty();
    let out_id = match mode {
        Mode::EndlessCursor => id,
        // Full last batch: the cursor stays open until a getMore finds nothing more.
        Mode::LateCursorEnd if exhausted && !docs.is_empty() => id,
        _ if exhausted => {
            cursors.remove(&id);
            0
        }
        _ => id,
    };
    doc! { "cursor": { "id": out_id, "ns": ns, "nextBatch": docs }, "ok": 1.0 }
}

async fn serve(mode: Mode) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(conn(sock, mode, s.clone()));
        }
    });
    (addr, seen)
}

async fn conn(mut sock: TcpStream, mode: Mode, seen: Arc<Mutex<Seen>>) {
    let mut n = 0u32;
    let mut cursors = HashMap::new();
    let mut next_cursor = 1_000_000_007_i64;
    loop {
        let mut h = [0u8; 16];
        if sock.read_exact(&mut h).await.is_err() {
            return;
        }
        let len = i32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let rid = i32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        assert_eq!(i32::from_le_bytes([h[12], h[13], h[14], h[15]]), OP_MSG);
        let mut payload = vec![0u8; len - 16];
        if sock.read_exact(&mut payload).await.is_err() {
            return;
        }
        let body = parse_op_msg_body(&payload).expect("client sent a valid OP_MSG");
        assert!(body.get_str("$db").is_ok(), "every command carries $db");
        let name = body
            .iter()
            .next()
            .and_then(|e| e.ok())
            .map(|(k, _)| k.to_string())
            .unwrap_or_default();
        let mut reply = doc! { "ok": 1.0 };
        let seqs = sequences(&payload);
        let body = Document::try_from(body).expect("body");
        {
            let mut seen = seen.lock().expect("lock");
            *seen.commands.entry(name.clone()).or_default() += 1;
            if name == "insert" {
                let mut docs: Vec<Document> = Vec::new();
                if let Ok(a) = body.get_array("documents") {
                    docs.extend(a.iter().filter_map(|d| d.as_document().cloned()));
                }
                for (ident, seq) in &seqs {
                    assert_eq!(ident, "documents");
                    if body.contains_key("documents") {
                        seen.body_and_sequence += 1;
                    }
                    seen.insert_sequences.push(seq.len());
                    if !body.get_bool("ordered").unwrap_or(true) {
                        seen.unordered += 1;
                    }
                    docs.extend(seq.iter().cloned());
                }
                for d in &docs {
                    let id = d.get_i64("_id").expect("client-generated int64 _id");
                    if !seen.insert_ids.insert(id) {
                        seen.duplicate_ids += 1;
                        reply = doc! { "ok": 1.0, "n": 0, "writeErrors": [{ "code": 11000 }] };
                    }
                }
                if !reply.contains_key("writeErrors") {
                    reply.insert("n", docs.len() as i32);
                }
            }
            if name == "update" {
                for (ident, stmts) in &seqs {
                    assert_eq!(ident, "updates");
                    if body.contains_key("updates") {
                        seen.body_and_sequence += 1;
                    }
                    seen.update_sequences.push(stmts.len());
                    let good = |s: &Document| {
                        let id = s.get_document("q").ok().and_then(|q| q.get_i64("_id").ok());
                        let set = s
                            .get_document("u")
                            .ok()
                            .and_then(|u| u.get_document("$set").ok());
                        id.is_some_and(|i| (0..2500).contains(&i))
                            && set.is_some_and(|d| d.contains_key("v"))
                    };
                    seen.bad_statements += stmts.iter().filter(|s| !good(s)).count() as u64;
                    reply.insert("n", stmts.len() as i32);
                    reply.insert("nModified", stmts.len() as i32);
                }
            }
        }
        if name == "find" {
            reply = find_range(&body, mode, &mut cursors, &mut next_cursor, &seen);
        }
        if name == "getMore" {
            reply = get_more(&body, mode, &mut cursors, &seen);
        }
        if name != "hello" {
            n += 1;
            if let Mode::FailEvery(k) = mode {
                if n.is_multiple_of(k) {
                    reply = doc! { "ok": 0.0, "errmsg": "injected", "code": 8 };
                }
            }
        }
        let encoded = Body::encode(&reply).expect("encode");
        let bytes = encoded.payload();
        let mut out = Vec::new();
        out.extend_from_slice(&((16 + bytes.len()) as i32).to_le_bytes());
        out.extend_from_slice(&7i32.to_le_bytes());
        out.extend_from_slice(&rid.to_le_bytes());
        out.extend_from_slice(&OP_MSG.to_le_bytes());
        out.extend_from_slice(bytes);
        if sock.write_all(&out).await.is_err() {
            return;
        }
        if matches!(mode, Mode::CloseAfterHello) && name == "hello" {
            return;
        }
    }
}

fn settings() -> Settings {
    Settings {
        db: "loadgen".into(),
        coll: "bench".into(),
        docs: 2500,
        // No warm-up: a connection's first request is inside the measured window, so a run
        // on a loaded machine whose first operation outlasts the window (a drain over TLS
        // and zstd in a debug build) still records it when it completes within the grace
        // period, instead of recording nothing.
        warmup: Duration::ZERO,
        duration: Duration::from_millis(300),
        scenario: Scenario::Steady,
        auth: None,
        docs_1k: 0,
        compress: None,
        discover: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mix_against_healthy_server() {
    let (addr, seen) = serve(Mode::Healthy).await;
    let s = settings();
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup");
    let next_id = Arc::new(AtomicI64::new(s.docs));
    let r = workload::run(&Endpoint::plain(&addr), Op::Mix, 4, &s, next_id, None)
        .await
        .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(r.hist.len() > 10);
    let seen = seen.lock().expect("lock");
    for c in ["hello", "drop", "find", "insert", "ping"] {
        assert!(seen.commands.get(c).copied().unwrap_or(0) > 0, "no {c}");
    }
    assert_eq!(seen.duplicate_ids, 0);
    // setup inserted 0..2500; the run's inserts are all above.
    assert!(seen.insert_ids.len() > 2500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_errors_are_counted_not_fatal() {
    let (addr, _) = serve(Mode::FailEvery(5)).await;
    let s = settings();
    // Measures its own process (the fake server runs in it): a CPU time is read.
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Ping,
        2,
        &s,
        Arc::new(AtomicI64::new(0)),
        Some(std::process::id()),
    )
    .await
    .expect("run");
    assert!(r.errors > 0);
    assert!(r.hist.len() > 3 * r.errors, "successes keep going");
    assert!(r.first_error.unwrap_or_default().contains("injected"));
    assert!(r.cpu.is_some(), "the process's CPU time was read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_are_counted_and_run_ends() {
    let (addr, _) = serve(Mode::CloseAfterHello).await;
    let s = settings();
    let started = std::time::Instant::now();
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Find,
        2,
        &s,
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert!(r.errors > 0);
    assert_eq!(r.hist.len(), 0);
    assert!(started.elapsed() < Duration::from_secs(3));
}

// --- against the in-process stand-in, with SCRAM-SHA-256 ---------------------------------

use mongoguard_standin::{StandIn, StandInConfig};

use crate::auth::AuthOptions;

async fn standin_with_user() -> StandIn {
    StandIn::start(StandInConfig {
        users: vec![("app".into(), "apppw".into())],
        ..StandInConfig::default()
    })
    .await
    .expect("stand-in")
}

fn auth(password: &str, speculative: bool, skip_empty_exchange: bool) -> Option<AuthOptions> {
    Some(AuthOptions {
        user: "app".into(),
        password: password.into(),
        db: "admin".into(),
        speculative,
        skip_empty_exchange,
    })
}

fn serverless(auth: Option<AuthOptions>) -> Settings {
    // Unoptimised PBKDF2 (debug builds) takes tens of ms per authentication: a longer window
    // so that every run records operations even with the other tests running alongside.
    Settings {
        docs: 100,
        warmup: Duration::ZERO,
        duration: Duration::from_millis(1500),
        scenario: Scenario::Serverless,
        auth,
        ..settings()
    }
}

/// A run against the plain endpoint `addr` that must have no error; inserts start at
/// `first_id`.
async fn run_ok(addr: &str, op: Op, concurrency: usize, s: &Settings, first_id: i64) -> RunResult {
    let r = workload::run(
        &Endpoint::plain(addr),
        op,
        concurrency,
        s,
        Arc::new(AtomicI64::new(first_id)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_speculative_against_standin() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = serverless(auth("apppw", true, true));
    let r = run_ok(&addr, Op::Ping, 2, &s, 0).await;
    let ops = r.hist.len();
    assert!(ops > 0);
    let scram = r.client_scram.as_ref().expect("client SCRAM timings");
    assert_eq!(scram.len(), ops);
    assert_eq!(r.speculative, ops, "every op authenticated inside hello");
    assert!(r.scram_iterations >= 4096);
    let stats = standin.stats();
    // Warmup ops count too: at least one connection and one authentication per measured op.
    assert!(stats.connections_accepted() >= ops);
    assert!(stats.authentications() >= ops);
    assert_eq!(
        stats.command_count("saslStart"),
        0,
        "speculative: no saslStart"
    );
    standin.shutdown().await;
}

/// --discover: every operation opens a monitoring connection (hello, no authentication)
/// before its application connection, as a driver's server discovery does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_discover_opens_a_monitor_connection_per_operation() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = Settings {
        discover: true,
        ..serverless(auth("apppw", true, true))
    };
    let r = run_ok(&addr, Op::Ping, 1, &s, 0).await;
    let ops = r.completed;
    assert!(ops > 0);
    let stats = standin.stats();
    // No warmup and no errors: every operation started was completed, each with two
    // connections and two hellos, one of them authenticated.
    assert_eq!(stats.connections_accepted(), 2 * ops);
    assert_eq!(stats.command_count("hello"), 2 * ops);
    assert_eq!(stats.authentications(), ops);
    assert_eq!(stats.command_count("ping"), ops);
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_sasl_start_with_empty_exchange() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = serverless(auth("apppw", false, false));
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup with auth");
    let r = run_ok(&addr, Op::Find, 2, &s, 100).await;
    assert!(!r.hist.is_empty());
    assert_eq!(r.speculative, 0);
    let stats = standin.stats();
    let starts = stats.command_count("saslStart");
    assert!(starts > r.hist.len());
    // client-final and the empty exchange: two saslContinue per conversation.
    assert_eq!(stats.command_count("saslContinue"), 2 * starts);
    assert_eq!(stats.authentications(), starts);
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_wrong_password_is_an_error() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = serverless(auth("wrong", true, true));
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Ping,
        1,
        &s,
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.hist.len(), 0);
    assert!(r.errors > 0);
    let e = r.first_error.unwrap_or_default();
    assert!(e.contains("Authentication failed"), "{e}");
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_authenticates_each_connection_once() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    // A window long enough for more operations than connections even on a loaded machine
    // (a debug build's PBKDF2 alone takes tens of ms per connection): the counts below
    // only prove something when connections were reused.
    let s = Settings {
        docs: 100,
        auth: auth("apppw", true, true),
        duration: Duration::from_secs(2),
        ..settings()
    };
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup with auth");
    let r = run_ok(&addr, Op::Mix, 3, &s, 100).await;
    assert!(
        r.completed > 3,
        "{} operations on 3 connections",
        r.completed
    );
    assert!(r.client_scram.is_none());
    let stats = standin.stats();
    // setup's connection + one per worker.
    assert_eq!(stats.connections_accepted(), 4);
    assert_eq!(stats.authentications(), 4);
    standin.shutdown().await;
}

// --- the bulk and cursor workloads --------------------------------------------------------

fn with_1k() -> Settings {
    Settings {
        docs_1k: workload::DEFAULT_DOCS_1K,
        ..settings()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insertmany_sends_1000_unique_documents_as_a_sequence() {
    let (addr, seen) = serve(Mode::Healthy).await;
    let s = settings();
    let next_id = Arc::new(AtomicI64::new(s.docs));
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::InsertMany,
        2,
        &s,
        next_id.clone(),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(!r.hist.is_empty());
    let seen = seen.lock().expect("lock");
    let inserts = seen.commands.get("insert").copied().unwrap_or(0);
    assert!(inserts > 0);
    assert_eq!(
        seen.insert_sequences.len() as u64,
        inserts,
        "every insert has a sequence"
    );
    assert!(
        seen.insert_sequences.iter().all(|&n| n == BULK),
        "{:?}",
        seen.insert_sequences
    );
    assert_eq!(seen.body_and_sequence, 0);
    assert_eq!(seen.unordered, 0);
    assert_eq!(seen.duplicate_ids, 0);
    assert_eq!(seen.insert_ids.len() as u64, inserts * BULK as u64);
    assert!(seen.insert_ids.iter().all(|&id| id >= s.docs));
    // The allocator moved past every id handed out, so a next run starts above them.
    let top = seen.insert_ids.iter().max().copied().unwrap_or(0);
    assert_eq!(next_id.load(std::sync::atomic::Ordering::Relaxed), top + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update1000_sends_1000_filtered_statements_as_a_sequence() {
    let (addr, seen) = serve(Mode::Healthy).await;
    let s = settings();
    let r = run_ok(&addr, Op::Update1000, 2, &s, 0).await;
    assert!(!r.hist.is_empty());
    let seen = seen.lock().expect("lock");
    let updates = seen.commands.get("update").copied().unwrap_or(0);
    assert!(updates > 0);
    assert_eq!(seen.update_sequences.len() as u64, updates);
    assert!(seen.update_sequences.iter().all(|&n| n == BULK));
    assert_eq!(seen.body_and_sequence, 0);
    assert_eq!(seen.bad_statements, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_issues_get_more_until_the_cursor_is_zero() {
    for mode in [Mode::Healthy, Mode::LateCursorEnd] {
        let (addr, seen) = serve(mode).await;
        let s = with_1k();
        let r = workload::run(
            &Endpoint::plain(&addr),
            Op::Drain,
            2,
            &s,
            Arc::new(AtomicI64::new(0)),
            None,
        )
        .await
        .expect("run");
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        let drains = r.hist.len();
        assert!(drains > 0);
        let seen = seen.lock().expect("lock");
        let finds = seen.commands.get("find").copied().unwrap_or(0);
        let get_mores = seen.commands.get("getMore").copied().unwrap_or(0);
        // A full batch per round trip; the late end needs one empty batch more.
        let per_drain = (DRAIN_DOCS / i64::from(DRAIN_BATCH)) as u64
            + u64::from(matches!(mode, Mode::LateCursorEnd));
        assert_eq!(
            get_mores,
            finds * (per_drain - 1),
            "every started drain ran to the end"
        );
        assert_eq!(r.round_trips, drains * per_drain);
        assert_eq!(seen.unknown_cursor, 0);
        assert_eq!(seen.batch_sizes, HashSet::from([DRAIN_BATCH]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_that_never_ends_is_an_error() {
    let (addr, _) = serve(Mode::EndlessCursor).await;
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Drain,
        1,
        &with_1k(),
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert!(r.errors > 0);
    assert_eq!(r.hist.len(), 0);
    assert!(r
        .first_error
        .unwrap_or_default()
        .contains("cursor still open"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find101_counts_the_documents() {
    let (addr, seen) = serve(Mode::Healthy).await;
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Find101,
        2,
        &with_1k(),
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(!r.hist.is_empty());
    assert_eq!(seen.lock().expect("lock").commands.get("getMore"), None);
    let (addr, _) = serve(Mode::ShortRange).await;
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Find101,
        1,
        &with_1k(),
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.hist.len(), 0);
    assert!(r.errors > 0);
    assert!(r.first_error.unwrap_or_default().contains("100 documents"));
}

#[test]
fn documents_of_the_1k_collection_are_1_kib() {
    let mut rng = fastrand::Rng::with_seed(1);
    for id in [0, 1_100, i64::MAX] {
        let bytes = workload::doc_1k(id, &mut rng).to_vec().expect("encode");
        assert_eq!(bytes.len(), workload::DOC_1K_BYTES);
    }
}

// --- compression, against the in-process stand-in ----------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_requests_and_replies_against_standin() {
    let standin = StandIn::start(StandInConfig::default())
        .await
        .expect("stand-in");
    let addr = standin.addr().to_string();
    let s = Settings {
        docs: 100,
        compress: Some(Compressor::Zstd),
        ..with_1k()
    };
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup");
    for op in [Op::Find101, Op::Drain, Op::InsertMany] {
        standin.stats().reset();
        let r = workload::run(
            &Endpoint::plain(&addr),
            op,
            2,
            &s,
            Arc::new(AtomicI64::new(100)),
            None,
        )
        .await
        .expect("run");
        assert_eq!(r.errors, 0, "{op:?}: {:?}", r.first_error);
        assert!(!r.hist.is_empty());
        assert!(r.replies > 0);
        assert_eq!(
            r.compressed_replies, r.replies,
            "{op:?}: every reply compressed"
        );
        let stats = standin.stats();
        // Everything but the two hellos came compressed.
        assert_eq!(stats.compressed_messages() + 2, stats.messages(), "{op:?}");
    }
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_the_server_refuses_is_an_error() {
    let standin = StandIn::start(StandInConfig {
        compressors: vec![],
        ..StandInConfig::default()
    })
    .await
    .expect("stand-in");
    let addr = standin.addr().to_string();
    let s = Settings {
        compress: Some(Compressor::Zstd),
        ..settings()
    };
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Ping,
        1,
        &s,
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.hist.len(), 0);
    assert!(r.errors > 0);
    assert!(r.first_error.unwrap_or_default().contains("did not agree"));
    standin.shutdown().await;
}

/// A TLS terminator in front of `upstream` with a certificate for 127.0.0.1 signed by a fresh
/// CA; returns its address, the CA file and the count of completed TLS handshakes.
async fn tls_front(
    upstream: String,
    dir: &std::path::Path,
) -> (
    String,
    std::path::PathBuf,
    Arc<std::sync::atomic::AtomicU64>,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    use tokio_rustls::rustls;
    std::fs::create_dir_all(dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let handshakes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (acceptor, upstream, count) = (acceptor.clone(), upstream.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut up = TcpStream::connect(&upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    (addr, ca_file, handshakes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_over_tls_does_one_handshake_per_operation() {
    let standin = standin_with_user().await;
    let dir = std::env::temp_dir().join(format!("loadgen-tls-{}", std::process::id()));
    let (addr, ca, handshakes) = tls_front(standin.addr().to_string(), &dir).await;
    let ep = Endpoint {
        addr,
        tls: Some(crate::wire::TlsClient::new(&ca, "127.0.0.1", false).unwrap()),
    };
    let s = serverless(auth("apppw", true, true));
    let r = workload::run(&ep, Op::Ping, 2, &s, Arc::new(AtomicI64::new(0)), None)
        .await
        .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(!r.hist.is_empty());
    // Every completed operation had its own TLS connection (plus at most the ones cut off
    // by the end of the window).
    let n = handshakes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        n >= r.completed && n <= r.completed + 2,
        "{n} handshakes, {} ops",
        r.completed
    );

    // A CA that did not sign the certificate: every connection fails.
    let other = dir.join("other");
    let (_, wrong_ca, _) = tls_front(standin.addr().to_string(), &other).await;
    let bad = Endpoint {
        addr: ep.addr.clone(),
        tls: Some(crate::wire::TlsClient::new(&wrong_ca, "127.0.0.1", false).unwrap()),
    };
    let r = workload::run(&bad, Op::Ping, 1, &s, Arc::new(AtomicI64::new(0)), None)
        .await
        .expect("run");
    assert_eq!(r.hist.len(), 0);
    assert!(r.errors > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_over_tls_steady_and_serverless() {
    let standin = standin_with_user().await;
    let dir = std::env::temp_dir().join(format!("loadgen-tls-zstd-{}", std::process::id()));
    let (addr, ca, handshakes) = tls_front(standin.addr().to_string(), &dir).await;
    let ep = Endpoint {
        addr,
        tls: Some(crate::wire::TlsClient::new(&ca, "127.0.0.1", false).unwrap()),
    };
    // Steady, authenticated: setup and the runs go over TLS, hello agrees to zstd, requests
    // after the handshake are compressed.
    let s = Settings {
        docs: 100,
        compress: Some(Compressor::Zstd),
        auth: auth("apppw", true, true),
        ..with_1k()
    };
    workload::setup(&ep, &s).await.expect("setup over TLS");
    for op in [Op::Find101, Op::Drain] {
        standin.stats().reset();
        let r = workload::run(&ep, op, 2, &s, Arc::new(AtomicI64::new(100)), None)
            .await
            .expect("run");
        assert_eq!(r.errors, 0, "{op:?}: {:?}", r.first_error);
        assert!(!r.hist.is_empty());
        assert!(r.replies > 0);
        assert_eq!(r.compressed_replies, r.replies, "{op:?}");
        let stats = standin.stats();
        // Only the two connections' handshakes (hello, saslContinue) came uncompressed.
        assert_eq!(stats.compressed_messages() + 4, stats.messages(), "{op:?}");
    }
    // Serverless with authentication: TLS, then hello (speculative SCRAM, zstd agreed), then
    // the compressed operation, per operation.
    let s = Settings {
        compress: Some(Compressor::Zstd),
        ..serverless(auth("apppw", true, true))
    };
    let before = handshakes.load(std::sync::atomic::Ordering::Relaxed);
    let r = workload::run(&ep, Op::Ping, 2, &s, Arc::new(AtomicI64::new(0)), None)
        .await
        .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(!r.hist.is_empty());
    assert_eq!(r.speculative, r.hist.len());
    assert!(r.replies >= r.hist.len());
    assert_eq!(r.compressed_replies, r.replies);
    let n = handshakes.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(n >= r.completed, "{n} handshakes, {} ops", r.completed);
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
