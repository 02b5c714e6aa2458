//! Violation records: one JSON object per line per violation, written off the request path.
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

mod config;
mod counters;
mod dedup;
mod error;
mod json;
mod record;
mod sink;
#[cfg(test)]
mod tests;
mod time;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    time::Instant,
};

use tokio::{
    runtime::Handle,
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tracing::warn;

pub use config::{AuditConfig, SinkSpec, MAX_DEDUP_WINDOW, MAX_QUEUE_CAPACITY};
pub use counters::{AuditCounters, RuleCount};
pub use error::AuditError;
pub use record::{render, render_public, Action, Mode, Source, ViolationRecord};
pub(crate) use time::format_time;

use dedup::{Dedup, Verdict, DEFAULT_MAX_KEYS};
use sink::{Msg, Target};

/// The running violation log. Share it behind an `Arc`; [`record`](Self::record) takes
/// `&self`.
#[derive(Debug)]
pub struct AuditLog {
    shared: Arc<Shared>,
    /// `None` for the `none` sink: violations are only counted.
    tx: Option<mpsc::Sender<Msg>>,
    writer: Option<JoinHandle<()>>,
}

/// State shared by the record path and the writer task.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) counters: AuditCounters,
    /// `None` when `dedup_window` is zero.
    pub(crate) dedup: Option<Mutex<Dedup>>,
    drop_warning: Throttle,
    pub(crate) write_warning: Throttle,
}

impl AuditLog {
    /// Validates `config`, opens the sink (a file is opened for appending now, so a bad path
    /// is a startup error naming the path) and spawns the writer task on the current tokio
    /// runtime. The `none` sink needs no runtime; every other sink fails with
    /// [`AuditError::NoRuntime`] outside one.
    pub fn start(config: &AuditConfig) -> Result<AuditLog, AuditError> {
        Self::start_with_max_keys(config, DEFAULT_MAX_KEYS)
    }

    fn start_with_max_keys(config: &AuditConfig, max_keys: usize) -> Result<AuditLog, AuditError> {
        config.validate()?;
        let runtime = match config.sink {
            SinkSpec::None => None,
            _ => Some(Handle::try_current().map_err(|_| AuditError::NoRuntime)?),
        };
        let target = Target::open(&config.sink)?;
        let dedup = (!config.dedup_window.is_zero() && target.is_some())
            .then(|| Mutex::new(Dedup::new(config.dedup_window, max_keys)));
        let shared = Arc::new(Shared {
            counters: AuditCounters::default(),
            dedup,
            drop_warning: Throttle::new(),
            write_warning: Throttle::new(),
        });
        let (tx, writer) = match (target, runtime) {
            (Some(target), Some(runtime)) => {
                let (tx, rx) = mpsc::channel(config.queue_capacity);
                let writer = runtime.spawn(sink::run(rx, target, shared.clone()));
                (Some(tx), Some(writer))
            }
            _ => (None, None),
        };
        Ok(AuditLog { shared, tx, writer })
    }

    /// Records one violation. Synchronous and non-blocking (two short mutex sections, no
    /// I/O, no await): counts it, applies dedup, and queues it for the writer. A record that
    /// finds the queue full is dropped and counted in [`AuditCounters::dropped`], with a
    /// warning logged at most once a second.
    pub fn record(&self, rec: ViolationRecord) {
        let shared = &*self.shared;
        shared.counters.count(rec.rule_id, rec.action, rec.mode);
        let Some(tx) = &self.tx else {
            return;
        };
        if let Some(dedup) = &shared.dedup {
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
        if tx.try_send(msg).is_err() {
            // Full, or the writer is gone: either way this line is lost.
            let dropped = self.shared.counters.add_dropped();
            if self.shared.drop_warning.allow() {
                warn!(dropped, "audit queue full: violation records dropped");
            }
        }
    }

    /// The counters.
    pub fn counters(&self) -> &AuditCounters {
        &self.shared.counters
    }

    /// Waits until everything queued before this call is written to the sink (for tests
    /// and shutdown). Dedup summaries of windows still open are not forced out.
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else {
            return;
        };
        let (ack, done) = oneshot::channel();
        if tx.send(Msg::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Stops the writer after it has written everything queued, plus a summary for every
    /// dedup window that suppressed something (even if the window is not over).
    pub async fn shutdown(self) {
        let AuditLog { tx, writer, .. } = self;
        drop(tx);
        if let Some(writer) = writer {
            if let Err(error) = writer.await {
                warn!(%error, "audit writer task failed");
            }
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
