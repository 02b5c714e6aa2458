//! The writer task: drains a queue in batches, renders lines, writes each batch to the sink,
//! and runs the dedup sweep on a timer. One writer per stream (violations, events).

use std::{
    io,
    sync::{atomic::Ordering, Arc},
    time::Instant,
};

use tokio::{
    sync::{mpsc, oneshot},
    time::{Interval, MissedTickBehavior},
};
use tracing::warn;

use super::{
    event::{render_event_into, Stamped},
    record::{render_into, render_summary_into, Action, Summary},
    sink::{Mark, Target, BUF_KEEP},
    Shared, ViolationRecord,
};

/// Most messages taken off the queue per batch (one write call per batch).
const BATCH: usize = 256;

/// A message to a writer task.
#[derive(Debug)]
pub(crate) enum Msg {
    Record(ViolationRecord),
    Summary(Summary),
    Event(Stamped),
    /// Answered once everything queued before it is written.
    Flush(oneshot::Sender<()>),
    /// Wakes the writer to reopen a file sink ([`Shared::reopen`] says it is wanted; the
    /// flag, not this message, carries the request, so a full queue cannot lose it).
    Reopen,
    /// Close the queue, write what it holds and every pending dedup summary, then answer
    /// and end the writer.
    Close(oneshot::Sender<()>),
}

/// A writer task. Ends when every sender is gone, after writing what was queued and a
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
        marks: Vec::new(),
    };
    let mut batch = Vec::with_capacity(BATCH);
    let mut acks = Vec::new();
    // Answered once the writer has written everything and ends.
    let mut closed = Vec::new();
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
                        Msg::Event(e) => w.push_event(&e),
                        Msg::Flush(ack) => acks.push(ack),
                        // The flag is read by `write`.
                        Msg::Reopen => {}
                        Msg::Close(ack) => {
                            // No new message gets in; those already queued are still
                            // received, then `recv_many` returns 0.
                            rx.close();
                            closed.push(ack);
                        }
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
    for ack in closed {
        let _ = ack.send(());
    }
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
    /// Where each line of `buf` ends.
    marks: Vec<Mark>,
}

impl Writer {
    fn end_line(&mut self, severity: u8) {
        self.buf.push('\n');
        self.marks.push(Mark {
            end: self.buf.len(),
            severity,
        });
    }

    fn push_record(&mut self, rec: &ViolationRecord) {
        render_into(rec, &mut self.buf);
        // warning for a block, notice for a warn.
        self.end_line(if rec.action == Action::Block { 4 } else { 5 });
    }

    fn push_summary(&mut self, s: &Summary) {
        render_summary_into(s, &mut self.buf);
        self.end_line(5);
    }

    fn push_event(&mut self, e: &Stamped) {
        render_event_into(e.time, &e.event, &mut self.buf);
        self.end_line(e.event.severity());
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

    /// Writes the pending lines on a blocking thread (stdout, files and sockets may block).
    /// A failure is counted and logged at most once a second; its lines are lost.
    ///
    /// A reopen asked for by [`AuditLog::reopen`](super::AuditLog::reopen) happens here,
    /// before the lines are written, so a reopen never races a write.
    async fn write(&mut self) {
        let reopen = self.shared.reopen.swap(false, Ordering::AcqRel);
        if self.buf.is_empty() && !reopen {
            return;
        }
        let target = self.target.clone();
        let buf = std::mem::take(&mut self.buf);
        let marks = std::mem::take(&mut self.marks);
        let lines = marks.len() as u64;
        let (result, mut buf, mut marks) = match tokio::task::spawn_blocking(move || {
            if reopen {
                target.reopen_blocking();
            }
            if buf.is_empty() {
                return (Ok(()), buf, marks);
            }
            let result = target.write_blocking(buf.as_bytes(), &marks);
            (result, buf, marks)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => (Err(io::Error::other(e)), String::new(), Vec::new()),
        };
        let counters = &self.shared.counters;
        match result {
            Ok(()) => counters.add_written(lines),
            Err(error) => {
                counters.add_write_error(lines);
                if self.shared.write_warning.allow() {
                    warn!(
                        sink = %self.target,
                        %error,
                        lines,
                        write_errors = counters.write_errors(),
                        "cannot write {}; they are lost",
                        self.shared.stream
                    );
                }
            }
        }
        buf.clear();
        if buf.capacity() > BUF_KEEP {
            buf.shrink_to(BUF_KEEP / 16);
        }
        marks.clear();
        self.buf = buf;
        self.marks = marks;
    }
}
