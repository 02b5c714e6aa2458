//! Workload: the per-connection request loop, the setup phase, and the
//! aggregation of one (target, op, concurrency) run.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bson::{doc, Document, RawDocument};
use hdrhistogram::Histogram;
use mongoguard::wire::Compressor;
use tokio::time::Instant;

use crate::auth::{self, AuthOptions};
use crate::wire::{Body, Conn, Endpoint, WireError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past the end of the measured window an in-flight request may take.
const GRACE: Duration = Duration::from_secs(5);
const FIND_MARKER: i64 = 0x5a5a_5a5a_5a5a_5a5a;
const SETUP_BATCH: i64 = 1000;
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Template markers for values rewritten in place per request. Bytes >= 0x80 (not ASCII), so
/// that no alphanumeric padding can contain them; every marker is counted when a template is
/// built.
const LO_MARKER: i64 = 0x71a1_b2c3_d4e5_f6e1_u64 as i64;
const HI_MARKER: i64 = 0x72a1_b2c3_d4e5_f6e2_u64 as i64;
const ID_MARKER: i64 = 0x73a1_b2c3_d4e5_f6e3_u64 as i64;
const V_MARKER: i64 = 0x74a1_b2c3_d4e5_f6e4_u64 as i64;
const CURSOR_MARKER: i64 = 0x75a1_b2c3_d4e5_f6e5_u64 as i64;
/// Size of each document of the `<coll>_1k` collection (find101, drain), BSON bytes.
pub const DOC_1K_BYTES: usize = 1024;
/// Documents one find101 returns.
pub const FIND101_DOCS: i64 = 101;
/// Documents one drain reads (`_id` 0..DRAIN_DOCS of `<coll>_1k`), DRAIN_BATCH per batch.
pub const DRAIN_DOCS: i64 = 1000;
pub const DRAIN_BATCH: i32 = 100;
/// Documents per insertmany, statements per update1000.
pub const BULK: usize = 1000;
/// Default number of 1 KiB documents set up in `<coll>_1k`.
pub const DEFAULT_DOCS_1K: i64 = 1100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Ping,
    Find,
    Insert,
    Mix,
    /// A find returning 101 documents of 1 KiB (`_id` range over `<coll>_1k`), one batch.
    #[value(name = "find101")]
    Find101,
    /// One `insert` of 1,000 documents in a kind-1 document sequence, `ordered: true`.
    #[value(name = "insertmany")]
    InsertMany,
    /// A find with `batchSize: 100` over 1,000 documents of 1 KiB, then getMore until the
    /// cursor id is 0: one request is the whole drain.
    #[value(name = "drain")]
    Drain,
    /// One `update` of 1,000 statements `{q: {_id}, u: {$set: {v}}}` in a kind-1 sequence.
    #[value(name = "update1000")]
    Update1000,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Find => "find",
            Op::Insert => "insert",
            Op::Mix => "mix",
            Op::Find101 => "find101",
            Op::InsertMany => "insertmany",
            Op::Drain => "drain",
            Op::Update1000 => "update1000",
        }
    }

    pub fn needs_data(self) -> bool {
        self != Op::Ping
    }

    /// How many 1 KiB documents (`_id` 0..n of `<coll>_1k`) the op reads at least.
    pub fn needs_1k(self) -> i64 {
        match self {
            Op::Find101 => FIND101_DOCS,
            Op::Drain => DRAIN_DOCS,
            _ => 0,
        }
    }
}

/// The collection of 1 KiB documents that find101 and drain read.
pub fn coll_1k(coll: &str) -> String {
    format!("{coll}_1k")
}

/// A document of exactly [`DOC_1K_BYTES`] BSON bytes: `{_id, v, pad}`.
pub fn doc_1k(id: i64, rng: &mut fastrand::Rng) -> Document {
    // 4 (length) + _id (1 + 4 + 8) + v (1 + 2 + 8) + pad (1 + 4 + 4 + len + 1) + 1 (end).
    const PAD: usize = DOC_1K_BYTES - 39;
    doc! { "_id": id, "v": rng.i64(..), "pad": random_string(rng, PAD) }
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
    /// Documents of 1 KiB (`_id` 0..n) in `<coll>_1k`, which setup creates; 0: no op reads
    /// them and setup leaves that collection alone.
    pub docs_1k: i64,
    /// Negotiate this compressor in hello and send every later request compressed.
    pub compress: Option<Compressor>,
    /// Serverless only: connect as a driver does. The server discovery and monitoring
    /// specification has a new client's monitor connect and answer hello before any
    /// operation may select the server; the application connection opens after that. So
    /// every operation first opens a monitoring connection (TLS when the target has it,
    /// hello, no authentication) and waits for its reply, then the application connection
    /// as without it; both close after the command.
    pub discover: bool,
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
    /// Round trips of the measured successful operations (a drain is several).
    pub round_trips: u64,
    /// Replies to compressed requests over the whole run (warmup included), and how many
    /// of them were OP_COMPRESSED.
    pub replies: u64,
    pub compressed_replies: u64,
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
        None => Conn::connect_with(ep, timeout, s.compress).await,
        Some(a) => auth::handshake(ep, timeout, Some(a), s.compress)
            .await
            .map(|(c, _)| c),
    }
}

fn new_hist() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits; bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn random_string(rng: &mut fastrand::Rng, len: usize) -> String {
    (0..len).map(|_| rng.alphanumeric()).collect()
}

/// A body with int64 slots rewritten per request.
struct Template {
    body: Body,
    /// Offsets of the slots, per marker, in the order the markers were given.
    slots: Vec<Vec<usize>>,
}

impl Template {
    /// `body` must hold each marker exactly `count` times.
    fn new(body: Body, markers: &[i64], count: usize) -> Result<Template, WireError> {
        let mut slots = Vec::with_capacity(markers.len());
        for &m in markers {
            let offs = body.marker_offsets(m);
            if offs.len() != count {
                return Err(WireError::Protocol(format!(
                    "template holds marker {m:#x} {} times, expected {count}",
                    offs.len()
                )));
            }
            slots.push(offs);
        }
        Ok(Template { body, slots })
    }
}

/// The request templates of one connection: only those its op uses are built.
#[derive(Default)]
struct Templates {
    find101: Option<Template>,
    insert_many: Option<Template>,
    drain: Option<(Body, Template)>,
    update: Option<Template>,
}

/// Builds request bodies for one connection.
struct Requests {
    ping: Body,
    find: Body,
    find_off: usize,
    insert: Body,
    t: Templates,
    db: String,
    coll: String,
    docs: i64,
    docs_1k: i64,
    next_id: Arc<AtomicI64>,
    rng: fastrand::Rng,
}

fn command_error(msg: String) -> WireError {
    WireError::Command(msg)
}

/// `cursor.id` and the length of `cursor.<batch>` of a find / getMore reply.
fn cursor_batch(reply: &RawDocument, batch: &str) -> Result<(i64, usize), WireError> {
    let bad = |what: &str| WireError::Protocol(format!("cursor reply: {what}"));
    let cursor = reply
        .get_document("cursor")
        .map_err(|_| bad("no cursor document"))?;
    let id = cursor
        .get_i64("id")
        .map_err(|_| bad("no int64 cursor.id"))?;
    let docs = cursor
        .get_array(batch)
        .map_err(|_| bad(&format!("no cursor.{batch}")))?;
    let mut n = 0;
    for d in docs {
        d.map_err(|e| bad(&e.to_string()))?;
        n += 1;
    }
    Ok((id, n))
}

/// A write reply's `n` must be `want` (every document inserted / every statement matched).
fn expect_n(reply: &RawDocument, want: usize, what: &str) -> Result<(), WireError> {
    let n = match reply.get("n") {
        Ok(Some(v)) => v.as_i32().map(i64::from).or_else(|| v.as_i64()),
        _ => None,
    };
    if n != Some(want as i64) {
        return Err(command_error(format!("{what}: n = {n:?}, expected {want}")));
    }
    Ok(())
}

impl Requests {
    fn new(s: &Settings, op: Op, next_id: Arc<AtomicI64>, seed: u64) -> Result<Self, WireError> {
        let ping = Body::encode(&doc! { "ping": 1, "$db": "admin" })?;
        let find_cmd = doc! {
            "find": &s.coll,
            "filter": { "_id": FIND_MARKER },
            "limit": 1,
            "singleBatch": true,
            "$db": &s.db,
        };
        let (find, find_off) = Body::encode_patchable(&find_cmd, FIND_MARKER)?;
        let mut rng = fastrand::Rng::with_seed(seed);
        let wide = coll_1k(&s.coll);
        let mut t = Templates::default();
        match op {
            Op::Find101 => {
                // As a driver sends find(range).limit(101): the default first batch (101)
                // holds all of it and the server closes the cursor.
                let cmd = doc! {
                    "find": &wide,
                    "filter": { "_id": { "$gte": LO_MARKER, "$lt": HI_MARKER } },
                    "limit": FIND101_DOCS,
                    "$db": &s.db,
                };
                t.find101 = Some(Template::new(
                    Body::encode(&cmd)?,
                    &[LO_MARKER, HI_MARKER],
                    1,
                )?);
            }
            Op::InsertMany => {
                let docs: Vec<Document> = (0..BULK)
                    .map(|_| {
                        doc! { "_id": ID_MARKER, "v": rng.i64(..), "s": random_string(&mut rng, 32) }
                    })
                    .collect();
                let cmd = doc! { "insert": &s.coll, "ordered": true, "$db": &s.db };
                let body = Body::encode_with_sequence(&cmd, "documents", &docs)?;
                t.insert_many = Some(Template::new(body, &[ID_MARKER], BULK)?);
            }
            Op::Drain => {
                let find = Body::encode(&doc! {
                    "find": &wide,
                    "filter": { "_id": { "$gte": 0_i64, "$lt": DRAIN_DOCS } },
                    "batchSize": DRAIN_BATCH,
                    "$db": &s.db,
                })?;
                let get_more = doc! {
                    "getMore": CURSOR_MARKER,
                    "collection": &wide,
                    "batchSize": DRAIN_BATCH,
                    "$db": &s.db,
                };
                let get_more = Template::new(Body::encode(&get_more)?, &[CURSOR_MARKER], 1)?;
                t.drain = Some((find, get_more));
            }
            Op::Update1000 => {
                let stmt = doc! { "q": { "_id": ID_MARKER }, "u": { "$set": { "v": V_MARKER } } };
                let stmts = vec![stmt; BULK];
                let cmd = doc! { "update": &s.coll, "ordered": true, "$db": &s.db };
                let body = Body::encode_with_sequence(&cmd, "updates", &stmts)?;
                t.update = Some(Template::new(body, &[ID_MARKER, V_MARKER], BULK)?);
            }
            Op::Ping | Op::Find | Op::Insert | Op::Mix => {}
        }
        Ok(Requests {
            ping,
            find,
            find_off,
            insert: Body::encode(&doc! {})?,
            t,
            db: s.db.clone(),
            coll: s.coll.clone(),
            docs: s.docs.max(1),
            docs_1k: s.docs_1k,
            next_id,
            rng,
        })
    }

    /// Runs one request of `op` on `conn` (mix draws 80/10/10 find/insert/ping); returns the
    /// round trips it took (a drain: the find and every getMore).
    async fn execute(&mut self, conn: &mut Conn, op: Op) -> Result<u64, WireError> {
        let op = match op {
            Op::Mix => match self.rng.u32(0..100) {
                0..80 => Op::Find,
                80..90 => Op::Insert,
                _ => Op::Ping,
            },
            other => other,
        };
        let missing = || WireError::Protocol(format!("no {} template", op.name()));
        match op {
            Op::Ping | Op::Mix => conn.request(&self.ping).await.map(|_| 1),
            Op::Find => {
                let id = self.rng.i64(0..self.docs);
                self.find.patch_i64(self.find_off, id);
                conn.request(&self.find).await.map(|_| 1)
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
                conn.request(&self.insert).await.map(|_| 1)
            }
            Op::Find101 => {
                let t = self.t.find101.as_mut().ok_or_else(missing)?;
                let lo = self.rng.i64(0..=(self.docs_1k - FIND101_DOCS).max(0));
                t.body.patch_i64(t.slots[0][0], lo);
                t.body.patch_i64(t.slots[1][0], lo + FIND101_DOCS);
                let reply = conn.request_doc(&t.body).await?;
                let (id, n) = cursor_batch(reply, "firstBatch")?;
                if id != 0 || n as i64 != FIND101_DOCS {
                    return Err(command_error(format!(
                        "find101 from _id {lo}: {n} documents, cursor id {id} (expected \
                         {FIND101_DOCS} and 0)"
                    )));
                }
                Ok(1)
            }
            Op::InsertMany => {
                let t = self.t.insert_many.as_mut().ok_or_else(missing)?;
                let first = self.next_id.fetch_add(BULK as i64, Ordering::Relaxed);
                for (i, &off) in t.slots[0].iter().enumerate() {
                    t.body.patch_i64(off, first + i as i64);
                }
                expect_n(conn.request_doc(&t.body).await?, BULK, "insertmany")?;
                Ok(1)
            }
            Op::Update1000 => {
                let t = self.t.update.as_mut().ok_or_else(missing)?;
                for (&id_off, &v_off) in t.slots[0].iter().zip(&t.slots[1]) {
                    t.body.patch_i64(id_off, self.rng.i64(0..self.docs));
                    t.body.patch_i64(v_off, self.rng.i64(..));
                }
                expect_n(conn.request_doc(&t.body).await?, BULK, "update1000")?;
                Ok(1)
            }
            Op::Drain => {
                let (find, get_more) = self.t.drain.as_mut().ok_or_else(missing)?;
                let (mut id, mut total) =
                    cursor_batch(conn.request_doc(find).await?, "firstBatch")?;
                let mut trips = 1u64;
                // Every batch but the last is full; one more getMore is allowed for a server
                // that only notices the end when asked again (an empty last batch).
                let max_trips = (DRAIN_DOCS as u64).div_ceil(DRAIN_BATCH as u64) + 1;
                while id != 0 {
                    if trips >= max_trips {
                        return Err(command_error(format!(
                            "drain: cursor still open after {trips} round trips ({total} documents)"
                        )));
                    }
                    get_more.body.patch_i64(get_more.slots[0][0], id);
                    let (next, n) =
                        cursor_batch(conn.request_doc(&get_more.body).await?, "nextBatch")?;
                    id = next;
                    total += n;
                    trips += 1;
                }
                if total as i64 != DRAIN_DOCS {
                    return Err(command_error(format!(
                        "drain: {total} documents, expected {DRAIN_DOCS}"
                    )));
                }
                Ok(trips)
            }
        }
    }
}

/// Drop the collection and insert `docs` small documents with `_id` 0..docs; with
/// `docs_1k` > 0, the same for `<coll>_1k` with documents of 1 KiB.
pub async fn setup(ep: &Endpoint, s: &Settings) -> anyhow::Result<()> {
    let mut conn = connect(ep, CONNECT_TIMEOUT, s)
        .await
        .map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(0x6d67);
    fill(&mut conn, s, &s.coll, s.docs, |id| {
        doc! { "_id": id, "v": rng.i64(..), "s": random_string(&mut rng, 32) }
    })
    .await?;
    if s.docs_1k > 0 {
        let mut rng = fastrand::Rng::with_seed(0x316b);
        fill(&mut conn, s, &coll_1k(&s.coll), s.docs_1k, |id| {
            doc_1k(id, &mut rng)
        })
        .await?;
    }
    Ok(())
}

/// Drop `coll` and insert `n` documents `make(0..n)` in batches.
async fn fill(
    conn: &mut Conn,
    s: &Settings,
    coll: &str,
    n: i64,
    mut make: impl FnMut(i64) -> Document,
) -> anyhow::Result<()> {
    let drop = Body::encode(&doc! { "drop": coll, "$db": &s.db }).map_err(anyhow_wire)?;
    match timed_request(conn, &drop).await {
        // NamespaceNotFound and friends: nothing to drop is fine.
        Ok(()) | Err(WireError::Command(_)) => {}
        Err(e) => bail!("drop {coll}: {e}"),
    }
    let mut start = 0;
    while start < n {
        let end = (start + SETUP_BATCH).min(n);
        let docs: Vec<Document> = (start..end).map(&mut make).collect();
        let cmd = doc! { "insert": coll, "documents": docs, "ordered": true, "$db": &s.db };
        let body = Body::encode(&cmd).map_err(anyhow_wire)?;
        timed_request(conn, &body)
            .await
            .map_err(|e| anyhow::anyhow!("insert into {coll} _id {start}..{end}: {e}"))?;
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
    /// Round trips of the measured successful operations.
    round_trips: u64,
    /// Replies read on this task's connections (all of them, warmup included).
    replies: u64,
    compressed_replies: u64,
}

impl ConnStats {
    fn new() -> ConnStats {
        ConnStats {
            hist: new_hist(),
            completed: 0,
            errors: 0,
            first_error: None,
            round_trips: 0,
            replies: 0,
            compressed_replies: 0,
        }
    }

    /// Adds the reply counts of a connection that is done.
    fn count_replies(&mut self, conn: &Conn) {
        let (all, compressed) = conn.reply_counts();
        self.replies += all;
        self.compressed_replies += compressed;
    }

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
            Requests::new(s, op, next_id.clone(), 0x9e37_79b9 ^ i as u64).map_err(anyhow_wire)?;
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
        round_trips: 0,
        replies: 0,
        compressed_replies: 0,
    };
    for t in tasks {
        let st = t.await.context("connection task panicked")?;
        total.completed += st.completed;
        total.round_trips += st.round_trips;
        total.replies += st.replies;
        total.compressed_replies += st.compressed_replies;
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
    let mut st = ConnStats::new();
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
        let sent = Instant::now();
        let outcome = match tokio::time::timeout_at(end + GRACE, reqs.execute(c, op)).await {
            Ok(r) => r,
            Err(_) => Err(timed_out("reply not received before the end of the run")),
        };
        let measured = sent >= measure_from;
        if outcome.is_ok() {
            st.completed += 1;
        }
        match outcome {
            Ok(trips) if measured => {
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                st.hist.saturating_record(us.max(1));
                st.round_trips += trips;
            }
            Ok(_) => {}
            Err(e) => {
                if measured {
                    st.error(&e);
                }
                if e.is_fatal() {
                    if let Some(c) = conn.take() {
                        st.count_replies(&c);
                    }
                }
            }
        }
    }
    if let Some(c) = &conn {
        st.count_replies(c);
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
            Requests::new(s, op, next_id.clone(), 0x9e37_79b9 ^ i as u64).map_err(anyhow_wire)?;
        tasks.push(tokio::spawn(serverless_loop(
            ep.clone(),
            s.auth.clone(),
            s.compress,
            reqs,
            op,
            Window {
                start,
                measure_from,
                end,
            },
            s.discover,
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
        round_trips: 0,
        replies: 0,
        compressed_replies: 0,
    };
    for t in tasks {
        let st = t.await.context("connection task panicked")?;
        total.completed += st.conn.completed;
        total.round_trips += st.conn.round_trips;
        total.replies += st.conn.replies;
        total.compressed_replies += st.conn.compressed_replies;
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

/// One serverless operation: connect, handshake, one request (a drain: all of it), close.
/// Returns the handshake's information and the operation's round trips (handshake excluded).
async fn serverless_op(
    ep: &Endpoint,
    auth: Option<&AuthOptions>,
    compress: Option<Compressor>,
    reqs: &mut Requests,
    op: Op,
    st: &mut ConnStats,
    discover: bool,
) -> Result<(auth::HandshakeInfo, u64), WireError> {
    // The monitor's hello: no authentication, no compression (drivers' monitors do not
    // authenticate; what it costs is its connection and one round trip, before the rest).
    let monitor = if discover {
        Some(auth::handshake(ep, CONNECT_TIMEOUT, None, None).await?.0)
    } else {
        None
    };
    let (mut conn, info) = auth::handshake(ep, CONNECT_TIMEOUT, auth, compress).await?;
    let trips = reqs.execute(&mut conn, op).await;
    st.count_replies(&conn);
    drop(conn); // close: a serverless invocation keeps nothing
    drop(monitor);
    Ok((info, trips?))
}

async fn serverless_loop(
    ep: Endpoint,
    auth: Option<AuthOptions>,
    compress: Option<Compressor>,
    mut reqs: Requests,
    op: Op,
    w: Window,
    discover: bool,
) -> ServerlessStats {
    let Window {
        start,
        measure_from,
        end,
    } = w;
    let mut st = ServerlessStats {
        conn: ConnStats::new(),
        client_scram: new_hist(),
        iterations: 0,
        speculative: 0,
    };
    tokio::time::sleep_until(start).await;
    while Instant::now() < end {
        let sent = Instant::now();
        let outcome = match tokio::time::timeout_at(
            end + GRACE,
            serverless_op(
                &ep,
                auth.as_ref(),
                compress,
                &mut reqs,
                op,
                &mut st.conn,
                discover,
            ),
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
            Ok((info, trips)) if measured => {
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                st.conn.hist.saturating_record(us.max(1));
                st.conn.round_trips += trips;
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
