//! The diagnostic log (`tracing` to standard error), written off the request path.
//!
//! A log line is formatted on the thread that emits it and handed to a bounded queue; one
//! dedicated thread drains the queue into standard error. When standard error is slow or
//! never read (a stuck journald, `| tee` to a full disk, a container log driver under
//! pressure), the queue fills and further lines are dropped and counted
//! ([`dropped_lines`], exported as `mongoguard_log_lines_dropped_total`): a request never
//! waits for the log. Colour is used only when standard error is a terminal.
//!
//! [`init`] installs the process-wide subscriber and returns a [`LogGuard`]; keep it alive
//! in `main` and [`flush`](LogGuard::flush) it at exit, which waits a bounded time for the
//! queued lines to be written, so a stuck standard error never holds the process.

use std::{
    io::{IsTerminal as _, Write},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc, OnceLock,
    },
    time::Duration,
};

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::{
    filter::Targets, layer::SubscriberExt as _, util::SubscriberInitExt as _, EnvFilter,
};

use crate::config::LogFormat;

/// Lines queued for standard error before new lines are dropped. A line is typically
/// 150–400 bytes, so a full queue holds about a megabyte.
pub const QUEUE_LINES: usize = 4096;

/// How long [`LogGuard`]'s drop waits for queued lines when [`LogGuard::flush`] was not
/// called (an error path).
pub const DEFAULT_FLUSH_BOUND: Duration = Duration::from_secs(2);

/// The drop counter of the installed writer (set once, by [`init`]).
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Lines the installed writer could not write (set once, by [`init`]).
static FAILED: OnceLock<Arc<AtomicU64>> = OnceLock::new();

/// Log lines dropped since start: the queue to standard error was full, or writing a line to
/// it failed (a full disk under `2>>file`). Zero before [`init`] (and in processes that never
/// call it).
pub fn dropped_lines() -> u64 {
    let queue = DROPPED
        .get()
        .map_or(0, |c| u64::try_from(c.dropped_lines()).unwrap_or(u64::MAX));
    let failed = FAILED.get().map_or(0, |f| f.load(Ordering::Relaxed));
    queue.saturating_add(failed)
}

/// The log writer thread's output (standard error). The writer thread of `tracing-appender`
/// ignores a failed write without a trace (its own TODO says so), so lines lost to a full
/// disk were counted nowhere; here each failed line is counted in `failed` (and reported as
/// written, so the thread goes on). A line cut short (part of it went in) makes the next one
/// start with a newline, so the lines written once space returns are whole.
struct Counted<W> {
    inner: W,
    failed: Arc<AtomicU64>,
    /// The last write call put only part of its buffer in (`write_all` calls again with the
    /// rest).
    partial: bool,
    /// A line was cut short: a newline goes first.
    torn: bool,
}

impl<W: Write> Counted<W> {
    fn new(inner: W, failed: Arc<AtomicU64>) -> Counted<W> {
        Counted {
            inner,
            failed,
            partial: false,
            torn: false,
        }
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.torn && !self.partial {
            if !matches!(self.inner.write(b"\n"), Ok(1)) {
                self.failed.fetch_add(1, Ordering::Relaxed);
                return Ok(buf.len());
            }
            self.torn = false;
        }
        match self.inner.write(buf) {
            Ok(n) => {
                self.partial = n > 0 && n < buf.len();
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(e),
            Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.torn |= self.partial;
                self.partial = false;
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Errors from [`init`].
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The filter does not parse.
    #[error("invalid log level {level:?}: {source}")]
    Filter {
        /// The filter as given.
        level: String,
        /// Why.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was installed already.
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// Keeps the log's writer thread; flush it at exit (or let it drop: the same, with
/// [`DEFAULT_FLUSH_BOUND`]).
#[derive(Debug)]
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    worker: Option<WorkerGuard>,
}

impl LogGuard {
    /// Waits up to `bound` for the queued lines to reach standard error, then returns even
    /// if they did not (standard error never read): the rest are lost.
    pub fn flush(mut self, bound: Duration) {
        self.flush_within(bound);
    }

    fn flush_within(&mut self, bound: Duration) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        // The worker guard's drop asks the writer thread to finish and waits for it (about
        // a second at most); it may also print to stdout if the queue is full, which can
        // block too. Do it on a helper thread and wait for that with our own bound.
        let (done, finished) = mpsc::channel::<()>();
        let helper = std::thread::Builder::new()
            .name("mongoguard-log-flush".into())
            .spawn(move || {
                drop(worker);
                let _ = done.send(());
            });
        if helper.is_ok() {
            let _ = finished.recv_timeout(bound);
        }
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.flush_within(DEFAULT_FLUSH_BOUND);
    }
}

/// Installs the process-wide `tracing` subscriber: `level` as an `EnvFilter` directive,
/// `format` human or JSON, to standard error through the bounded, lossy queue (see the
/// module documentation). Also routes `log` records (from dependencies) to it.
pub fn init(level: &str, format: LogFormat) -> Result<LogGuard, LogError> {
    let filter = EnvFilter::try_new(level).map_err(|source| LogError::Filter {
        level: level.to_owned(),
        source,
    })?;
    // A level or `target=level` list (what operators write) is filtered by `Targets`, which
    // decides once per callsite. `EnvFilter`, needed only for span and field directives, also
    // takes a lock each time a span is entered or left: every poll of every session, since a
    // session runs inside its client's span (about 700 instructions per request on a find).
    // `Targets` would read a span directive (`[client]=debug`) as a target name: those go to
    // `EnvFilter`.
    let targets = (!level.contains(['[', ']', '{', '}']))
        .then(|| level.parse::<Targets>().ok())
        .flatten();
    let ansi = std::io::stderr().is_terminal();
    let failed = Arc::new(AtomicU64::new(0));
    let (writer, worker) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUE_LINES)
        .thread_name("mongoguard-log")
        .finish(Counted::new(std::io::stderr(), failed.clone()));
    let counter = writer.error_counter();
    let builder = tracing_subscriber::fmt()
        .with_ansi(ansi)
        .with_writer(writer);
    // The builder alone filters at INFO; under `Targets` it passes everything on to it.
    // Four arms rather than both filters as `Option` layers: two more layers cost ~260
    // instructions per request on a find (callgrind), every span enter and exit crossing them.
    let open = tracing_subscriber::filter::LevelFilter::TRACE;
    let installed = match (format, targets) {
        (LogFormat::Human, Some(t)) => builder
            .with_max_level(open)
            .finish()
            .with(t)
            .try_init()
            .map_err(|e| e.to_string()),
        (LogFormat::Json, Some(t)) => builder
            .with_max_level(open)
            .json()
            .flatten_event(true)
            .finish()
            .with(t)
            .try_init()
            .map_err(|e| e.to_string()),
        (LogFormat::Human, None) => builder
            .with_env_filter(filter)
            .try_init()
            .map_err(|e| e.to_string()),
        (LogFormat::Json, None) => builder
            .json()
            .flatten_event(true)
            .with_env_filter(filter)
            .try_init()
            .map_err(|e| e.to_string()),
    };
    installed.map_err(LogError::Install)?;
    // Only the first successful init gets here (a second try_init fails above).
    let _ = DROPPED.set(counter);
    let _ = FAILED.set(failed);
    Ok(LogGuard {
        worker: Some(worker),
    })
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write,
        sync::{Arc, Condvar, Mutex},
        time::Instant,
    };

    use super::*;

    /// A writer that blocks every write until released: standard error nobody reads.
    #[derive(Clone, Default)]
    struct Stuck(Arc<(Mutex<bool>, Condvar)>);

    impl Stuck {
        fn release(&self) {
            let (lock, cv) = &*self.0;
            *lock.lock().unwrap() = true;
            cv.notify_all();
        }
    }

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (lock, cv) = &*self.0;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_writer_drops_and_counts_and_never_blocks_the_caller() {
        let stuck = Stuck::default();
        let (writer, worker) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(16)
            .finish(stuck.clone());
        let counter = writer.error_counter();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        let start = Instant::now();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..1000 {
                tracing::info!(i, "a line nobody reads");
            }
        });
        // 1000 lines into a queue of 16 with a stuck reader: almost all are dropped, and
        // the emitting thread was never held (generous bound: a loaded machine).
        assert!(
            counter.dropped_lines() >= 900,
            "{}",
            counter.dropped_lines()
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        // The flush gives up after its bound while the writer is still stuck.
        let guard = LogGuard {
            worker: Some(worker),
        };
        let start = Instant::now();
        guard.flush(Duration::from_millis(200));
        let took = start.elapsed();
        assert!(took < Duration::from_secs(2), "{took:?}");
        stuck.release();
    }

    /// Standard error on a full disk (`2>>/var/log/mongoguard.log`): every write fails with
    /// ENOSPC, some after part of a line went in. tracing-appender's writer thread ignores
    /// the error, so the lines were lost without a count (mongoguard_log_lines_dropped_total
    /// stayed 0), and the first line after space returned was glued to a fragment. Each lost
    /// line is counted now, and the lines written once space returns are whole.
    #[test]
    fn a_full_disk_under_standard_error_counts_the_lost_lines() {
        /// Takes `room` bytes, then fails with ENOSPC until `room` is raised again.
        #[derive(Clone, Default)]
        struct Disk(Arc<Mutex<(Vec<u8>, usize)>>);
        impl Write for Disk {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let mut d = self.0.lock().unwrap();
                let room = d.1.saturating_sub(d.0.len());
                if room == 0 {
                    return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
                }
                let n = room.min(buf.len());
                d.0.extend_from_slice(&buf[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let disk = Disk::default();
        disk.0.lock().unwrap().1 = 250;
        let failed = Arc::new(AtomicU64::new(0));
        let (writer, worker) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(QUEUE_LINES)
            .finish(Counted::new(disk.clone(), failed.clone()));
        let counter = writer.error_counter();
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_writer(writer)
                .with_ansi(false)
                .finish(),
        );
        tracing::dispatcher::with_default(&dispatch, || {
            for i in 0..20 {
                tracing::info!(i, "a line on a full disk");
            }
        });
        // Every line has reached the writer thread before space returns (bounded wait).
        let whole_lines = || {
            disk.0
                .lock()
                .unwrap()
                .0
                .iter()
                .filter(|b| **b == b'\n')
                .count()
        };
        let start = Instant::now();
        while failed.load(Ordering::Relaxed) + (whole_lines() as u64) < 20
            && start.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let kept = disk.0.lock().unwrap().0.len();
        disk.0.lock().unwrap().1 = usize::MAX;
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info!("space is back");
        });
        drop(dispatch);
        LogGuard {
            worker: Some(worker),
        }
        .flush(Duration::from_secs(10));
        let text = String::from_utf8_lossy(&disk.0.lock().unwrap().0).into_owned();
        let whole = text.get(..kept).unwrap_or_default().matches('\n').count() as u64;
        assert_eq!(counter.dropped_lines(), 0, "the queue never filled");
        assert_eq!(
            failed.load(Ordering::Relaxed),
            20 - whole,
            "lines lost to the full disk, not counted: {text}"
        );
        let last = text.lines().last().unwrap_or_default();
        assert!(
            last.contains("space is back") && !last.contains("a line on a full disk"),
            "the first line after space returned is not whole: {last:?}"
        );
    }

    #[test]
    fn flush_writes_what_was_queued() {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let (writer, worker) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(QUEUE_LINES)
            .finish(sink.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..100 {
                tracing::info!(i, "queued line");
            }
        });
        LogGuard {
            worker: Some(worker),
        }
        .flush(Duration::from_secs(10));
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 100, "{text}");
    }
}
