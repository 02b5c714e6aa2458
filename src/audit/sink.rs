//! The writer task: drains the queue in batches, renders lines, writes each batch to the
//! sink in one call, and runs the dedup sweep on a timer.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io::{self, Write},
    path::PathBuf,
    sync::Arc,
    time::Instant,
};

use tokio::{
    sync::{mpsc, oneshot},
    time::{Interval, MissedTickBehavior},
};
use tracing::warn;

use super::{
    record::{render_into, render_summary_into, Summary},
    AuditError, Shared, SinkSpec, ViolationRecord,
};

/// Most messages taken off the queue per batch (one write call per batch).
const BATCH: usize = 256;

/// A render buffer that grew past this is shrunk back after its batch.
const BUF_KEEP: usize = 1 << 20;

/// A message to the writer task.
#[derive(Debug)]
pub(crate) enum Msg {
    Record(ViolationRecord),
    Summary(Summary),
    /// Answered once everything queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// An opened sink.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Stdout,
    Stderr,
    File { path: PathBuf, file: Arc<File> },
}

impl Target {
    /// Opens `spec`; `None` for the `none` sink. A file is opened for appending (and
    /// created) now, so a bad path is a startup error.
    pub(crate) fn open(spec: &SinkSpec) -> Result<Option<Target>, AuditError> {
        Ok(Some(match spec {
            SinkSpec::Stdout => Target::Stdout,
            SinkSpec::Stderr => Target::Stderr,
            SinkSpec::None => return Ok(None),
            SinkSpec::File(path) => {
                let file = OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(path)
                    .map_err(|source| AuditError::Open {
                        path: path.clone(),
                        source,
                    })?;
                Target::File {
                    path: path.clone(),
                    file: Arc::new(file),
                }
            }
        }))
    }

    /// Writes `buf` in one `write_all` while holding the stream lock, so lines from other
    /// writers of the same stdout/stderr (the tracing subscriber) never interleave with
    /// ours mid-line. Blocking: call from a blocking thread.
    fn write_blocking(&self, buf: &[u8]) -> io::Result<()> {
        match self {
            Target::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(buf)?;
                out.flush()
            }
            Target::Stderr => {
                let mut out = io::stderr().lock();
                out.write_all(buf)?;
                out.flush()
            }
            Target::File { file, .. } => {
                let mut f: &File = file;
                f.write_all(buf)?;
                f.flush()
            }
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Stdout => f.write_str("stdout"),
            Target::Stderr => f.write_str("stderr"),
            Target::File { path, .. } => write!(f, "file:{}", path.display()),
        }
    }
}

/// The writer task. Ends when every sender is gone, after writing what was queued and a
/// summary for every dedup window that suppressed something.
pub(crate) async fn run(mut rx: mpsc::Receiver<Msg>, target: Target, shared: Arc<Shared>) {
    let mut ticker = shared.dedup.as_ref().map(|d| {
        let mut t = tokio::time::interval(super::lock(d).tick());
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        t
    });
    let mut w = Writer {
        target,
        shared,
        buf: String::new(),
        lines: 0,
    };
    let mut batch = Vec::with_capacity(BATCH);
    let mut acks = Vec::new();
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    break;
                }
                for msg in batch.drain(..) {
                    match msg {
                        Msg::Record(rec) => w.push_record(&rec),
                        Msg::Summary(s) => w.push_summary(&s),
                        Msg::Flush(ack) => acks.push(ack),
                    }
                }
                w.write().await;
                for ack in acks.drain(..) {
                    let _ = ack.send(());
                }
            }
            () = tick(&mut ticker) => {
                w.summaries(|d, out| d.sweep(Instant::now(), out));
                w.write().await;
            }
        }
    }
    w.summaries(|d, out| d.drain(out));
    w.write().await;
}

/// Waits for the next sweep; never completes without dedup.
async fn tick(ticker: &mut Option<Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

struct Writer {
    target: Target,
    shared: Arc<Shared>,
    /// Lines rendered and not yet written.
    buf: String,
    lines: u64,
}

impl Writer {
    fn push_record(&mut self, rec: &ViolationRecord) {
        render_into(rec, &mut self.buf);
        self.buf.push('\n');
        self.lines += 1;
    }

    fn push_summary(&mut self, s: &Summary) {
        render_summary_into(s, &mut self.buf);
        self.buf.push('\n');
        self.lines += 1;
    }

    /// Renders the summaries `collect` takes out of the dedup map (lock released first).
    fn summaries(&mut self, collect: impl FnOnce(&mut super::dedup::Dedup, &mut Vec<Summary>)) {
        let Some(dedup) = &self.shared.dedup else {
            return;
        };
        let mut out = Vec::new();
        collect(&mut super::lock(dedup), &mut out);
        for s in &out {
            self.push_summary(s);
        }
    }

    /// Writes the pending lines on a blocking thread (stdout and files may block). A
    /// failure is counted and logged at most once a second; its lines are lost.
    async fn write(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let target = self.target.clone();
        let buf = std::mem::take(&mut self.buf);
        let (result, mut buf) = match tokio::task::spawn_blocking(move || {
            let result = target.write_blocking(buf.as_bytes());
            (result, buf)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => (Err(io::Error::other(e)), String::new()),
        };
        let counters = &self.shared.counters;
        match result {
            Ok(()) => counters.add_written(self.lines),
            Err(error) => {
                counters.add_write_error();
                if self.shared.write_warning.allow() {
                    warn!(
                        sink = %self.target,
                        %error,
                        lines = self.lines,
                        write_errors = counters.write_errors(),
                        "cannot write violation records; they are lost"
                    );
                }
            }
        }
        buf.clear();
        if buf.capacity() > BUF_KEEP {
            buf.shrink_to(BUF_KEEP / 16);
        }
        self.buf = buf;
        self.lines = 0;
    }
}
