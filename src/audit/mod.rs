//! Violation records and events: one JSON object per line, written off the request path.
//!
//! Two streams, each with its own sink, bounded queue and writer task: violation records
//! (`[audit] sink`) and events — connections opened and closed, client handshakes,
//! authentication, policy reloads — (`[audit] events_sink`, off by default; see
//! [`AuditLog::event`]). Sinks: stdout, stderr, a file (rotated by size), syslog (local
//! socket or UDP), none.
//!
//! The proxy builds a [`ViolationRecord`] when the policy reports a violation and hands it to
//! [`AuditLog::record`], which is synchronous and never waits: it counts the violation,
//! applies dedup, and `try_send`s the record to a writer task over a bounded queue. The
//! writer renders batches of lines and writes each batch to the sink in one call. When the
//! queue is full the record is dropped and counted; the request is never slowed down.
//!
//! # What a line contains
//! See [`render`] for the field list. Absent optional fields are omitted (never `null`).
//! Records cannot carry literal values, command bodies, SASL payloads or passwords: there is
//! no field for them, and the only query text, the filter shape, must come from the policy's
//! shape renderer (literals replaced by their types).
//!
//! # Dedup
//! Identical violations — same (rule id, action, database, collection, shape hash, app
//! name) — within `dedup_window` are written once; the rest are counted, and when the window
//! is over one summary line repeats the key's fields with `"suppressed": N` and
//! `"window_seconds"`. The window's end is noticed on the key's next record or by the
//! writer's periodic sweep (at most a second late); at shutdown every pending summary is
//! written.
//!
//! # Shutdown and reopening
//! [`AuditLog::close`] (called by the proxy's graceful shutdown) forces a summary for every
//! open dedup window, closes the queues and waits, for a bounded time, until the writers
//! have written everything they hold: no record or summary is lost at a clean exit, and a
//! sink that cannot keep up (a full disk, a stuck pipe) cannot hold the exit past the bound.
//! [`AuditLog::reopen`] makes file sinks reopen their path (SIGHUP after logrotate renamed
//! the file without `copytruncate`).

mod counters;
mod dedup;
mod error;
mod event;
mod json;
mod record;
mod sink;
#[cfg(test)]
mod tests;
mod time;
mod writer;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::{
    runtime::Handle,
    sync::{
        mpsc::{self, error::TrySendError},
        oneshot,
    },
    task::JoinHandle,
};
use tracing::warn;

// The `[audit]` settings live in the configuration (a leaf); these names stay for the code
// that reached them here.
pub use crate::config::{
    AuditConfig, Facility, SinkSpec, SyslogFormat, MAX_DEDUP_WINDOW, MAX_FILE_KEEP,
    MAX_QUEUE_CAPACITY, MIN_FILE_MAX_SIZE,
};
pub use counters::{AuditCounters, RuleCount};
pub use error::AuditError;
pub use event::{render_event, CloseReason, Event};
pub use record::{render, render_public, Action, Mode, Source, ViolationRecord};
pub(crate) use time::format_time;

use dedup::{Dedup, Verdict, DEFAULT_MAX_KEYS};
use sink::{StreamSettings, Target};
use writer::Msg;

/// The running violation log. Share it behind an `Arc`; [`record`](Self::record) takes
/// `&self`.
#[derive(Debug)]
pub struct AuditLog {
    shared: Arc<Shared>,
    /// `None` for the `none` sink: violations are only counted.
    tx: Option<mpsc::Sender<Msg>>,
    writer: Option<JoinHandle<()>>,
    /// The event stream's counters (only `written`, `dropped` and `write_errors` move).
    events_shared: Arc<Shared>,
    /// `None` when `events_sink` is `none`: events are dropped at once, uncounted.
    events_tx: Option<mpsc::Sender<Msg>>,
    events_writer: Option<JoinHandle<()>>,
}

/// State shared by the record path and the writer task.
#[derive(Debug)]
pub(crate) struct Shared {
    /// What the stream carries, for warnings: "violation records" or "events".
    pub(crate) stream: &'static str,
    pub(crate) counters: AuditCounters,
    /// `None` when `dedup_window` is zero.
    pub(crate) dedup: Option<Mutex<Dedup>>,
    drop_warning: Throttle,
    pub(crate) write_warning: Throttle,
    /// Set by [`AuditLog::reopen`], taken by the writer before its next write.
    pub(crate) reopen: AtomicBool,
}

/// What [`AuditLog::close`] waits at most by default: the proxy's shutdown uses it.
pub const CLOSE_BOUND: Duration = Duration::from_secs(3);

impl AuditLog {
    /// Validates `config`, opens the sink (a file is opened for appending now, so a bad path
    /// is a startup error naming the path) and spawns the writer task on the current tokio
    /// runtime. The `none` sink needs no runtime; every other sink fails with
    /// [`AuditError::NoRuntime`] outside one.
    pub fn start(config: &AuditConfig) -> Result<AuditLog, AuditError> {
        Self::start_with_max_keys(config, DEFAULT_MAX_KEYS)
    }

    fn start_with_max_keys(config: &AuditConfig, max_keys: usize) -> Result<AuditLog, AuditError> {
        config.validate().map_err(AuditError::from)?;
        let runtime = match (&config.sink, &config.events_sink) {
            (SinkSpec::None, SinkSpec::None) => None,
            _ => Some(Handle::try_current().map_err(|_| AuditError::NoRuntime)?),
        };
        let target = Target::open(&StreamSettings::violations(config))?;
        let events_target = Target::open(&StreamSettings::events(config))?;
        let dedup = (!config.dedup_window.is_zero() && target.is_some())
            .then(|| Mutex::new(Dedup::new(config.dedup_window, max_keys)));
        let shared = Arc::new(Shared::new("violation records", dedup));
        let events_shared = Arc::new(Shared::new("events", None));
        let spawn = |target: Option<Target>, shared: &Arc<Shared>| match (target, &runtime) {
            (Some(target), Some(runtime)) => {
                let (tx, rx) = mpsc::channel(config.queue_capacity);
                let writer = runtime.spawn(writer::run(rx, target, shared.clone()));
                (Some(tx), Some(writer))
            }
            _ => (None, None),
        };
        let (tx, writer) = spawn(target, &shared);
        let (events_tx, events_writer) = spawn(events_target, &events_shared);
        Ok(AuditLog {
            shared,
            tx,
            writer,
            events_shared,
            events_tx,
            events_writer,
        })
    }

    /// Records one event (connection, authentication, policy reload) on the event stream.
    /// Synchronous and non-blocking like [`record`](Self::record): the event is timestamped
    /// and `try_send`ed to the event writer; a full queue drops it (counted in
    /// [`event_counters`](Self::event_counters), warned at most once a second). With
    /// `events_sink = "none"` it returns at once.
    pub fn event(&self, event: Event) {
        let Some(tx) = &self.events_tx else {
            return;
        };
        let msg = Msg::Event(event::Stamped {
            time: std::time::SystemTime::now(),
            event,
        });
        enqueue(&self.events_shared, tx, msg);
    }

    /// [`event`](Self::event) with an event built only when events are written somewhere
    /// (for events that copy strings).
    pub fn event_with(&self, make: impl FnOnce() -> Event) {
        if self.events_tx.is_some() {
            self.event(make());
        }
    }

    /// True when events are written somewhere (lets a caller skip building an event).
    pub fn events_enabled(&self) -> bool {
        self.events_tx.is_some()
    }

    /// The event stream's counters: [`written`](AuditCounters::written),
    /// [`dropped`](AuditCounters::dropped), [`write_errors`](AuditCounters::write_errors).
    pub fn event_counters(&self) -> &AuditCounters {
        &self.events_shared.counters
    }

    /// Records one violation. Synchronous and non-blocking (two short mutex sections, no
    /// I/O, no await): counts it, applies dedup, and queues it for the writer. A record that
    /// finds the queue full is dropped and counted in [`AuditCounters::dropped`], with a
    /// warning logged at most once a second.
    pub fn record(&self, rec: ViolationRecord) {
        self.record_with(rec, true);
    }

    /// [`record`](Self::record) without dedup: for records that are already at most one per
    /// (application, rule) per period (the connection standards' reports), which dedup would
    /// otherwise fold into summaries when the period is not longer than `dedup_window`.
    pub fn record_periodic(&self, rec: ViolationRecord) {
        self.record_with(rec, false);
    }

    fn record_with(&self, rec: ViolationRecord, dedup: bool) {
        let shared = &*self.shared;
        shared.counters.count(rec.rule_id, rec.action, rec.mode);
        let Some(tx) = &self.tx else {
            return;
        };
        if let Some(dedup) = shared.dedup.as_ref().filter(|_| dedup) {
            // Vec::new does not allocate; summaries are rare.
            let mut summaries = Vec::new();
            let verdict = lock(dedup).observe(&rec, Instant::now(), &mut summaries);
            for s in summaries {
                self.enqueue(tx, Msg::Summary(s));
            }
            if verdict == Verdict::Suppress {
                shared.counters.add_suppressed();
                return;
            }
        }
        self.enqueue(tx, Msg::Record(rec));
    }

    fn enqueue(&self, tx: &mpsc::Sender<Msg>, msg: Msg) {
        enqueue(&self.shared, tx, msg);
    }

    /// The counters.
    pub fn counters(&self) -> &AuditCounters {
        &self.shared.counters
    }

    /// Waits until everything queued before this call, on both streams, is written to its
    /// sink (for tests). Dedup summaries of windows still open are not forced out (see
    /// [`close`](Self::close) for shutdown). Returns at once after `close`.
    pub async fn flush(&self) {
        for tx in [&self.tx, &self.events_tx].into_iter().flatten() {
            let (ack, done) = oneshot::channel();
            if tx.send(Msg::Flush(ack)).await.is_ok() {
                let _ = done.await;
            }
        }
    }

    /// Ends both streams before the process exits: forces a summary line for every dedup
    /// window that suppressed something (even if the window is not over), closes the queues
    /// (records and events arriving later are dropped and counted), and waits until the
    /// writers have written everything queued and ended — for at most `bound`. A sink that
    /// fails (write errors are counted) or blocks (a full pipe) cannot hold the caller past
    /// `bound`; what is still queued then is lost, and a warning says how much.
    ///
    /// Callable through an `Arc` and more than once (later calls return at once).
    pub async fn close(&self, bound: Duration) {
        let streams = [
            (&self.tx, &*self.shared),
            (&self.events_tx, &*self.events_shared),
        ];
        let closing = streams
            .into_iter()
            .filter_map(|(tx, shared)| tx.as_ref().map(|tx| close_stream(tx, shared)));
        if tokio::time::timeout(bound, futures::future::join_all(closing))
            .await
            .is_err()
        {
            for (tx, shared) in streams {
                let Some(tx) = tx else { continue };
                let queued = tx.max_capacity().saturating_sub(tx.capacity());
                warn!(
                    ?bound,
                    queued,
                    "the audit writer did not finish in time: {} still queued are lost",
                    shared.stream
                );
            }
        }
    }

    /// Makes file sinks (violations and events) reopen their configured path: a file renamed
    /// away (logrotate without `copytruncate`) is left alone and a new one is created at the
    /// path. The writer task does it before its next write, so it never races a write;
    /// stdout, stderr, syslog and `none` have nothing to reopen. Never blocks: call it from a
    /// SIGHUP handler. If the new file cannot be created, lines go on to the old one (a
    /// warning says so) and every later batch tries again.
    pub fn reopen(&self) {
        for (tx, shared) in [
            (&self.tx, &*self.shared),
            (&self.events_tx, &*self.events_shared),
        ] {
            let Some(tx) = tx else { continue };
            shared.reopen.store(true, Ordering::Release);
            // A wake-up only: when the queue is full the writer is busy and sees the flag
            // at its next write anyway.
            let _ = tx.try_send(Msg::Reopen);
        }
    }

    /// Stops the writer after it has written everything queued, plus a summary for every
    /// dedup window that suppressed something (even if the window is not over).
    pub async fn shutdown(self) {
        let AuditLog {
            tx,
            writer,
            events_tx,
            events_writer,
            ..
        } = self;
        drop(tx);
        drop(events_tx);
        for writer in [writer, events_writer].into_iter().flatten() {
            if let Err(error) = writer.await {
                warn!(%error, "audit writer task failed");
            }
        }
    }
}

/// Forces the stream's open dedup windows out as summaries, then closes its queue and waits
/// for its writer to write everything and end (unbounded: the caller bounds it).
async fn close_stream(tx: &mpsc::Sender<Msg>, shared: &Shared) {
    if let Some(dedup) = &shared.dedup {
        let mut summaries = Vec::new();
        lock(dedup).drain(&mut summaries);
        for s in summaries {
            // Waits for room: a summary must not be dropped because the queue is busy.
            if tx.send(Msg::Summary(s)).await.is_err() {
                return;
            }
        }
    }
    let (ack, done) = oneshot::channel();
    if tx.send(Msg::Close(ack)).await.is_ok() {
        let _ = done.await;
    }
}

/// Queues `msg` without waiting; a full queue (or a closed one) drops it and counts it.
fn enqueue(shared: &Shared, tx: &mpsc::Sender<Msg>, msg: Msg) {
    if let Err(e) = tx.try_send(msg) {
        // Either way this line is lost.
        let dropped = shared.counters.add_dropped();
        if shared.drop_warning.allow() {
            match e {
                TrySendError::Full(_) => {
                    warn!(dropped, "audit queue full: {} dropped", shared.stream)
                }
                TrySendError::Closed(_) => {
                    warn!(dropped, "audit log closed: {} dropped", shared.stream)
                }
            }
        }
    }
}

impl Shared {
    fn new(stream: &'static str, dedup: Option<Mutex<Dedup>>) -> Shared {
        Shared {
            stream,
            counters: AuditCounters::default(),
            dedup,
            drop_warning: Throttle::new(),
            write_warning: Throttle::new(),
            reopen: AtomicBool::new(false),
        }
    }
}

/// Locks the dedup map. Its state stays consistent if a holder panicked, so poison is
/// ignored rather than propagated into the request path.
pub(crate) fn lock(dedup: &Mutex<Dedup>) -> MutexGuard<'_, Dedup> {
    dedup.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lets something through at most once a second, across threads.
#[derive(Debug)]
pub(crate) struct Throttle {
    base: Instant,
    /// Milliseconds since `base` before which nothing passes.
    next_ms: AtomicU64,
}

impl Throttle {
    fn new() -> Self {
        Throttle {
            base: Instant::now(),
            next_ms: AtomicU64::new(0),
        }
    }

    /// True at most once per second.
    pub(crate) fn allow(&self) -> bool {
        let now = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1000);
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(next, now + 1000, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
