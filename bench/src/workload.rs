//! Workload: the per-connection request loop, the setup phase, and the
//! aggregation of one (target, op, concurrency) run.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bson::doc;
use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::wire::{Body, Conn, WireError};

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

/// Settings shared by every connection of every run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub db: String,
    pub coll: String,
    pub docs: i64,
    pub warmup: Duration,
    pub duration: Duration,
}

/// Outcome of one (target, op, concurrency) run.
pub struct RunResult {
    pub hist: Histogram<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub measured: Duration,
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
pub async fn setup(addr: &str, s: &Settings) -> anyhow::Result<()> {
    let mut conn = Conn::connect(addr, CONNECT_TIMEOUT)
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

struct ConnStats {
    hist: Histogram<u64>,
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

/// Run `concurrency` connections against `addr` for warmup + duration.
pub async fn run(
    addr: &str,
    op: Op,
    concurrency: usize,
    s: &Settings,
    next_id: Arc<AtomicI64>,
) -> anyhow::Result<RunResult> {
    // Connect everyone first, so connection setup is not part of the window.
    // Connect everyone first (concurrently), so connection setup is not part of
    // the window. A connection that fails here is counted and retried inside it.
    let pending: Vec<_> = (0..concurrency)
        .map(|_| {
            let addr = addr.to_string();
            tokio::spawn(async move { Conn::connect(&addr, CONNECT_TIMEOUT).await })
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
    let mut tasks = Vec::with_capacity(concurrency);
    for (i, conn) in conns.into_iter().enumerate() {
        let reqs =
            Requests::new(s, next_id.clone(), 0x9e37_79b9 ^ i as u64).map_err(anyhow_wire)?;
        let addr = addr.to_string();
        tasks.push(tokio::spawn(conn_loop(
            conn,
            addr,
            reqs,
            op,
            start,
            measure_from,
            end,
        )));
    }
    let mut total = RunResult {
        hist: new_hist(),
        errors: connect_errors.len() as u64,
        first_error: connect_errors.into_iter().next(),
        measured: s.duration,
    };
    for t in tasks {
        let st = t.await.context("connection task panicked")?;
        total.hist.add(&st.hist).context("merging histograms")?;
        total.errors += st.errors;
        if total.first_error.is_none() {
            total.first_error = st.first_error;
        }
    }
    Ok(total)
}

async fn conn_loop(
    mut conn: Option<Conn>,
    addr: String,
    mut reqs: Requests,
    op: Op,
    start: Instant,
    measure_from: Instant,
    end: Instant,
) -> ConnStats {
    let mut st = ConnStats {
        hist: new_hist(),
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
            match Conn::connect(&addr, remaining.min(CONNECT_TIMEOUT)).await {
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
