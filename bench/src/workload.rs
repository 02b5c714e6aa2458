//! Workload: the per-connection request loop, the setup phase, and the
//! aggregation of one (target, op, concurrency) run.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bson::doc;
use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::auth::{self, AuthOptions};
use crate::wire::{Body, Conn, Endpoint, WireError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past the end of the measured window an in-flight request may take.
const GRACE: Duration = Duration::from_secs(5);
const FIND_MARKER: i64 = 0x5a5a_5a5a_5a5a_5a5a;
const SETUP_BATCH: i64 = 1000;
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Ping,
    Find,
    Insert,
    Mix,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Find => "find",
            Op::Insert => "insert",
            Op::Mix => "mix",
        }
    }

    pub fn needs_data(self) -> bool {
        self != Op::Ping
    }
}

/// How connections are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Long-lived connections (handshake before the window), one request in flight each.
    #[default]
    Steady,
    /// Every operation opens a connection, does the handshake (hello, authentication),
    /// runs one command and closes: a serverless function without a warm client.
    Serverless,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::Serverless => "serverless",
        }
    }
}

/// Settings shared by every connection of every run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub db: String,
    pub coll: String,
    pub docs: i64,
    pub warmup: Duration,
    pub duration: Duration,
    pub scenario: Scenario,
    /// Authenticate every connection (SCRAM-SHA-256) when set.
    pub auth: Option<AuthOptions>,
}

/// Outcome of one (target, op, concurrency) run.
pub struct RunResult {
    pub hist: Histogram<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub measured: Duration,
    /// Client-side SCRAM computation per measured operation (serverless with auth only).
    pub client_scram: Option<Histogram<u64>>,
    /// Largest SCRAM iteration count a server asked for during the run (0: none).
    pub scram_iterations: u32,
    /// Measured operations whose authentication completed speculatively (inside hello).
    pub speculative: u64,
    /// Successful operations including the warmup's (to relate server-side counters, which
    /// cover the whole run, to operations).
    pub completed: u64,
    /// CPU time (user + system) the measured process spent during the measured window.
    pub cpu: Option<Duration>,
}

/// Clock ticks per second of `/proc/PID/stat` times (USER_HZ: 100 on every mainstream Linux
/// architecture; the kernel ABI fixes it regardless of CONFIG_HZ).
const USER_HZ: u64 = 100;

/// utime + stime of process `pid` so far, from `/proc/PID/stat` (fields 14 and 15, counted
/// after the parenthesised command name, which may hold spaces).
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ")": state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_micros((utime + stime) * 1_000_000 / USER_HZ))
}

/// Open a connection the way the settings say: plain `hello`, or the driver-style
/// handshake with authentication.
async fn connect(ep: &Endpoint, timeout: Duration, s: &Settings) -> Result<Conn, WireError> {
    match &s.auth {
        None => Conn::connect(ep, timeout).await,
        Some(a) => auth::handshake(ep, timeout, Some(a)).await.map(|(c, _)| c),
    }
}

fn new_hist() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits; bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn random_string(rng: &mut fastrand::Rng, len: usize) -> String {
    (0..len).map(|_| rng.alphanumeric()).collect()
}

/// Builds request bodies for one connection.
struct Requests {
    ping: Body,
    find: Body,
    find_off: usize,
    insert: Body,
    db: String,
    coll: String,
    docs: i64,
    next_id: Arc<AtomicI64>,
    rng: fastrand::Rng,
}

impl Requests {
    fn new(s: &Settings, next_id: Arc<AtomicI64>, seed: u64) -> Result<Self, WireError> {
        let ping = Body::encode(&doc! { "ping": 1, "$db": "admin" })?;
        let find_cmd = doc! {
            "find": &s.coll,
            "filter": { "_id": FIND_MARKER },
            "limit": 1,
            "singleBatch": true,
            "$db": &s.db,
        };
        let (find, find_off) = Body::encode_patchable(&find_cmd, FIND_MARKER)?;
        Ok(Requests {
            ping,
            find,
            find_off,
            insert: Body::encode(&doc! {})?,
            db: s.db.clone(),
            coll: s.coll.clone(),
            docs: s.docs.max(1),
            next_id,
            rng: fastrand::Rng::with_seed(seed),
        })
    }

    /// The body for the next request of `op` (mix draws 80/10/10 find/insert/ping).
    fn next(&mut self, op: Op) -> Result<&Body, WireError> {
        let op = match op {
            Op::Mix => match self.rng.u32(0..100) {
                0..80 => Op::Find,
                80..90 => Op::Insert,
                _ => Op::Ping,
            },
            other => other,
        };
        match op {
            Op::Ping | Op::Mix => Ok(&self.ping),
            Op::Find => {
                let id = self.rng.i64(0..self.docs);
                self.find.patch_i64(self.find_off, id);
                Ok(&self.find)
            }
            Op::Insert => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let v = self.rng.i64(..);
                let s = random_string(&mut self.rng, 32);
                self.insert = Body::encode(&doc! {
                    "insert": &self.coll,
                    "documents": [{ "_id": id, "v": v, "s": s }],
                    "$db": &self.db,
                })?;
                Ok(&self.insert)
            }
        }
    }
}

/// Drop the collection and insert `docs` small documents with `_id` 0..docs.
pub async fn setup(ep: &Endpoint, s: &Settings) -> anyhow::Result<()> {
    let mut conn = connect(ep, CONNECT_TIMEOUT, s)
        .await
        .map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    let drop = Body::encode(&doc! { "drop": &s.coll, "$db": &s.db }).map_err(anyhow_wire)?;
    match timed_request(&mut conn, &drop).await {
        // NamespaceNotFound and friends: nothing to drop is fine.
        Ok(()) | Err(WireError::Command(_)) => {}
        Err(e) => bail!("drop: {e}"),
    }
    let mut rng = fastrand::Rng::with_seed(0x6d67);
    let mut start = 0;
    while start < s.docs {
        let end = (start + SETUP_BATCH).min(s.docs);
        let docs: Vec<bson::Document> = (start..end)
            .map(|id| doc! { "_id": id, "v": rng.i64(..), "s": random_string(&mut rng, 32) })
            .collect();
        let cmd = doc! { "insert": &s.coll, "documents": docs, "ordered": true, "$db": &s.db };
        let body = Body::encode(&cmd).map_err(anyhow_wire)?;
        timed_request(&mut conn, &body)
            .await
            .map_err(|e| anyhow::anyhow!("insert _id {start}..{end}: {e}"))?;
        start = end;
    }
    Ok(())
}

/// `{standinStats: 1, reset}` on `admin` (mongoguard-standin only), as relaxed extended JSON.
pub async fn standin_stats(
    ep: &Endpoint,
    reset: bool,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut conn = Conn::connect(ep, CONNECT_TIMEOUT)
        .await
        .map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    let body = Body::encode(&doc! { "standinStats": 1, "reset": reset, "$db": "admin" })
        .map_err(anyhow_wire)?;
    let reply = tokio::time::timeout(SETUP_TIMEOUT, conn.request_doc(&body))
        .await
        .unwrap_or_else(|_| Err(timed_out("standinStats timed out")))
        .map_err(anyhow_wire)?;
    let reply = bson::Document::try_from(reply).context("decoding the reply")?;
    match bson::Bson::Document(reply).into_relaxed_extjson() {
        serde_json::Value::Object(m) => Ok(m),
        other => bail!("unexpected reply {other}"),
    }
}

async fn timed_request(conn: &mut Conn, body: &Body) -> Result<(), WireError> {
    tokio::time::timeout(SETUP_TIMEOUT, conn.request(body))
        .await
        .unwrap_or_else(|_| Err(timed_out("setup request timed out")))
}

fn timed_out(msg: &str) -> WireError {
    WireError::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        msg.to_string(),
    ))
}

fn anyhow_wire(e: WireError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// A run's timeline: requests start at `start`, are recorded from `measure_from`, stop at `end`.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

struct ConnStats {
    hist: Histogram<u64>,
    completed: u64,
    errors: u64,
    first_error: Option<String>,
}

impl ConnStats {
    fn error(&mut self, e: &WireError) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

/// Run `concurrency` connections against `ep` for warmup + duration.
pub async fn run(
    ep: &Endpoint,
    op: Op,
    concurrency: usize,
    s: &Settings,
    next_id: Arc<AtomicI64>,
    cpu_pid: Option<u32>,
) -> anyhow::Result<RunResult> {
    if s.scenario == Scenario::Serverless {
        return run_serverless(ep, op, concurrency, s, next_id).await;
    }
    // Connect everyone first (concurrently), so connection setup is not part of
    // the window. A connection that fails here is counted and retried inside it.
    let pending: Vec<_> = (0..concurrency)
        .map(|_| {
            let ep = ep.clone();
            let s = s.clone();
            tokio::spawn(async move { connect(&ep, CONNECT_TIMEOUT, &s).await })
        })
        .collect();
    let mut conns = Vec::with_capacity(concurrency);
    let mut connect_errors = Vec::new();
    for p in pending {
        match p.await.context("connect task panicked")? {
            Ok(c) => conns.push(Some(c)),
            Err(e) => {
                connect_errors.push(e.to_string());
                conns.push(None);
            }
        }
    }
    let start = Instant::now() + Duration::from_millis(20);
    let measure_from = start + s.warmup;
    let end = measure_from + s.duration;
    // The measured process's CPU over exactly the measured window.
    let cpu = cpu_pid.map(|pid| {
        tokio::spawn(async move {
            tokio::time::sleep_until(measure_from).await;
            let before = process_cpu(pid);
            tokio::time::sleep_until(end).await;
            let after = process_cpu(pid);
            after.zip(before).map(|(a, b)| a.saturating_sub(b))
        })
    });
    let mut tasks = Vec::with_capacity(concurrency);
    for (i, conn) in conns.into_iter().enumerate() {
        let reqs =
            Requests::new(s, next_id.clone(), 0x9e37_79b9 ^ i as u64).map_err(anyhow_wire)?;
        tasks.push(tokio::spawn(conn_loop(
            conn,
            ep.clone(),
            s.clone(),
            reqs,
            op,
            Window {
                start,
                measure_from,
                end,
            },
        )));
    }
    let mut total = RunResult {
        hist: new_hist(),
        errors: connect_errors.len() as u64,
        first_error: connect_errors.into_iter().next(),
        measured: s.duration,
        client_scram: None,
        scram_iterations: 0,
        speculative: 0,
        completed: 0,
        cpu: None,
    };
    for t in tasks {
        let st = t.await.context("connection task panicked")?;
        total.completed += st.completed;
        total.hist.add(&st.hist).context("merging histograms")?;
        total.errors += st.errors;
        if total.first_error.is_none() {
            total.first_error = st.first_error;
        }
    }
    if let Some(cpu) = cpu {
        total.cpu = cpu.await.context("cpu sampler panicked")?;
    }
    Ok(total)
}

async fn conn_loop(
    mut conn: Option<Conn>,
    ep: Endpoint,
    s: Settings,
    mut reqs: Requests,
    op: Op,
    w: Window,
) -> ConnStats {
    let Window {
        start,
        measure_from,
        end,
    } = w;
    let mut st = ConnStats {
        hist: new_hist(),
        completed: 0,
        errors: 0,
        first_error: None,
    };
    tokio::time::sleep_until(start).await;
    loop {
        if Instant::now() >= end {
            break;
        }
        if conn.is_none() {
            // Reconnect after a failure, as long as the window is open.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let remaining = end.saturating_duration_since(Instant::now());
            match connect(&ep, remaining.min(CONNECT_TIMEOUT), &s).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    if Instant::now() >= measure_from {
                        st.error(&e);
                    }
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let body = reqs.next(op);
        let sent = Instant::now();
        let outcome = match body {
            Ok(body) => match tokio::time::timeout_at(end + GRACE, c.request(body)).await {
                Ok(r) => r,
                Err(_) => Err(timed_out("reply not received before the end of the run")),
            },
            Err(e) => Err(e),
        };
        let measured = sent >= measure_from;
        if outcome.is_ok() {
            st.completed += 1;
        }
        match outcome {
            Ok(()) if measured => {
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                st.hist.saturating_record(us.max(1));
            }
            Ok(()) => {}
            Err(e) => {
                if measured {
                    st.error(&e);
                }
                if e.is_fatal() {
                    conn = None;
                }
            }
        }
    }
    st
}

/// Per-task results of a serverless run.
struct ServerlessStats {
    conn: ConnStats,
    client_scram: Histogram<u64>,
    iterations: u32,
    speculative: u64,
}

/// Serverless scenario: `concurrency` tasks, each repeating connect + handshake (hello,
/// authentication) + one command + close. The latency of an operation covers all of it.
async fn run_serverless(
    ep: &Endpoint,
    op: Op,
    concurrency: usize,
    s: &Settings,
    next_id: Arc<AtomicI64>,
) -> anyhow::Result<RunResult> {
    let start = Instant::now() + Duration::from_millis(20);
    let measure_from = start + s.warmup;
    let end = measure_from + s.duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let reqs =
            Requests::new(s, next_id.clone(), 0x9e37_79b9 ^ i as u64).map_err(anyhow_wire)?;
        tasks.push(tokio::spawn(serverless_loop(
            ep.clone(),
            s.auth.clone(),
            reqs,
            op,
            Window {
                start,
                measure_from,
                end,
            },
        )));
    }
    let mut total = RunResult {
        hist: new_hist(),
        errors: 0,
        first_error: None,
        measured: s.duration,
        client_scram: s.auth.as_ref().map(|_| new_hist()),
        scram_iterations: 0,
        speculative: 0,
        completed: 0,
        cpu: None,
    };
    for t in tasks {
        let st = t.await.context("connection task panicked")?;
        total.completed += st.conn.completed;
        total
            .hist
            .add(&st.conn.hist)
            .context("merging histograms")?;
        total.errors += st.conn.errors;
        if total.first_error.is_none() {
            total.first_error = st.conn.first_error;
        }
        if let Some(h) = total.client_scram.as_mut() {
            h.add(&st.client_scram).context("merging histograms")?;
        }
        total.scram_iterations = total.scram_iterations.max(st.iterations);
        total.speculative += st.speculative;
    }
    Ok(total)
}

/// One serverless operation: connect, handshake, one request, close.
async fn serverless_op(
    ep: &Endpoint,
    auth: Option<&AuthOptions>,
    reqs: &mut Requests,
    op: Op,
) -> Result<auth::HandshakeInfo, WireError> {
    let (mut conn, info) = auth::handshake(ep, CONNECT_TIMEOUT, auth).await?;
    let body = reqs.next(op)?;
    conn.request(body).await?;
    drop(conn); // close: a serverless invocation keeps nothing
    Ok(info)
}

async fn serverless_loop(
    ep: Endpoint,
    auth: Option<AuthOptions>,
    mut reqs: Requests,
    op: Op,
    w: Window,
) -> ServerlessStats {
    let Window {
        start,
        measure_from,
        end,
    } = w;
    let mut st = ServerlessStats {
        conn: ConnStats {
            hist: new_hist(),
            completed: 0,
            errors: 0,
            first_error: None,
        },
        client_scram: new_hist(),
        iterations: 0,
        speculative: 0,
    };
    tokio::time::sleep_until(start).await;
    while Instant::now() < end {
        let sent = Instant::now();
        let outcome = match tokio::time::timeout_at(
            end + GRACE,
            serverless_op(&ep, auth.as_ref(), &mut reqs, op),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(timed_out("operation not done before the end of the run")),
        };
        let measured = sent >= measure_from;
        if outcome.is_ok() {
            st.conn.completed += 1;
        }
        match outcome {
            Ok(info) if measured => {
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                st.conn.hist.saturating_record(us.max(1));
                if auth.is_some() {
                    let scram = u64::try_from(info.client_scram.as_micros()).unwrap_or(u64::MAX);
                    st.client_scram.saturating_record(scram.max(1));
                    st.iterations = st.iterations.max(info.iterations);
                    st.speculative += u64::from(info.speculative);
                }
            }
            Ok(_) => {}
            Err(e) => {
                if measured {
                    st.conn.error(&e);
                }
                if e.is_fatal() {
                    // Do not spin on a server that refuses connections.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    st
}
