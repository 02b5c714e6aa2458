//! The writer task: drains a queue in batches, renders lines, writes each batch to the sink,
//! and runs the dedup sweep on a timer. One writer per stream (violations, events).
//!
//! Sinks: stdout / stderr (one locked `write_all` per batch), a file (see [`super::file`]),
//! syslog (one datagram per line, to the local unix socket or over UDP).

use std::{
    fmt,
    io::{self, Write},
    net::UdpSocket,
    path::PathBuf,
    sync::{atomic::Ordering, Arc, Mutex, PoisonError},
    time::{Instant, SystemTime},
};

use tokio::{
    sync::{mpsc, oneshot},
    time::{Interval, MissedTickBehavior},
};
use tracing::warn;

use super::{
    config::{Facility, StreamSettings, SyslogFormat},
    event::{render_event_into, Stamped},
    file::RotatingFile,
    record::{render_into, render_summary_into, Action, Summary},
    time::{format_time, format_time_3164},
    AuditError, Shared, SinkSpec, ViolationRecord,
};

/// Most messages taken off the queue per batch (one write call per batch).
const BATCH: usize = 256;

/// A render buffer that grew past this is shrunk back after its batch.
const BUF_KEEP: usize = 1 << 20;

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

/// The end of one line in a batch buffer (just past its `\n`) and its syslog severity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) end: usize,
    severity: u8,
}

/// An opened sink.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Stdout,
    Stderr,
    File(Arc<Mutex<RotatingFile>>),
    Syslog(Arc<Mutex<Syslog>>),
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Target {
    /// Opens a stream's sink; `None` for `none`. A file is opened for appending (and created)
    /// and a syslog socket connected now, so a bad path is a startup error.
    pub(crate) fn open(s: &StreamSettings) -> Result<Option<Target>, AuditError> {
        Ok(Some(match &s.spec {
            SinkSpec::Stdout => Target::Stdout,
            SinkSpec::Stderr => Target::Stderr,
            SinkSpec::None => return Ok(None),
            SinkSpec::File(path) => {
                let f = RotatingFile::open(path.clone(), s.max_size, s.keep).map_err(|source| {
                    AuditError::Open {
                        path: path.clone(),
                        source,
                    }
                })?;
                Target::File(Arc::new(Mutex::new(f)))
            }
            SinkSpec::Syslog | SinkSpec::SyslogUdp(_) => {
                let dest = match &s.spec {
                    SinkSpec::SyslogUdp(addr) => Dest::Udp(addr.clone()),
                    _ => Dest::Unix(s.socket.clone()),
                };
                let sock = dest.connect().map_err(|source| AuditError::Syslog {
                    dest: dest.to_string(),
                    source,
                })?;
                Target::Syslog(Arc::new(Mutex::new(Syslog {
                    hostname: hostname(),
                    pid: std::process::id(),
                    facility: s.facility,
                    format: s.format,
                    msgid: s.msgid,
                    dest,
                    sock: Some(sock),
                    packet: Vec::new(),
                })))
            }
        }))
    }

    /// Reopens a file sink at its configured path (after an external rotation renamed it);
    /// other sinks have nothing to reopen. Blocking: call from a blocking thread.
    fn reopen_blocking(&self) {
        if let Target::File(f) = self {
            locked(f).reopen_on_request();
        }
    }

    /// Writes the lines of `buf` (ending at `marks`). Stdout and stderr get one `write_all`
    /// while holding the stream lock, so lines from other writers of the same stream (the
    /// tracing subscriber) never interleave with ours mid-line. Blocking: call from a
    /// blocking thread.
    fn write_blocking(&self, buf: &[u8], marks: &[Mark]) -> io::Result<()> {
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
            Target::File(f) => locked(f).write(buf, marks),
            Target::Syslog(s) => locked(s).send(buf, marks),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Stdout => f.write_str("stdout"),
            Target::Stderr => f.write_str("stderr"),
            Target::File(file) => write!(f, "file:{}", locked(file).path.display()),
            Target::Syslog(s) => write!(f, "syslog {}", locked(s).dest),
        }
    }
}

/// Where syslog datagrams go.
#[derive(Debug, Clone)]
enum Dest {
    Unix(PathBuf),
    Udp(String),
}

#[derive(Debug)]
enum Sock {
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixDatagram),
    Udp(UdpSocket),
}

impl Dest {
    fn connect(&self) -> io::Result<Sock> {
        match self {
            #[cfg(unix)]
            Dest::Unix(path) => {
                let s = std::os::unix::net::UnixDatagram::unbound()?;
                s.connect(path)?;
                Ok(Sock::Unix(s))
            }
            #[cfg(not(unix))]
            Dest::Unix(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the local syslog socket needs a unix system",
            )),
            Dest::Udp(addr) => {
                use std::net::ToSocketAddrs;
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                for a in addr.to_socket_addrs()? {
                    let local: std::net::SocketAddr = if a.is_ipv4() {
                        ([0, 0, 0, 0], 0).into()
                    } else {
                        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                    };
                    match UdpSocket::bind(local).and_then(|s| s.connect(a).map(|()| s)) {
                        Ok(s) => return Ok(Sock::Udp(s)),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }
}

impl fmt::Display for Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dest::Unix(p) => write!(f, "{}", p.display()),
            Dest::Udp(a) => write!(f, "udp://{a}"),
        }
    }
}

impl Sock {
    fn send(&self, packet: &[u8]) -> io::Result<()> {
        let n = match self {
            #[cfg(unix)]
            Sock::Unix(s) => s.send(packet)?,
            Sock::Udp(s) => s.send(packet)?,
        };
        if n == packet.len() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::WriteZero, "short datagram"))
        }
    }
}

/// A syslog sink: one datagram per line.
#[derive(Debug)]
pub(crate) struct Syslog {
    hostname: String,
    pid: u32,
    facility: Facility,
    format: SyslogFormat,
    msgid: &'static str,
    dest: Dest,
    /// `None` after a failed reconnect; the next batch tries again.
    sock: Option<Sock>,
    packet: Vec<u8>,
}

/// The host name for syslog headers (`-` when unknown, as RFC 5424 says).
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(255)
        .collect();
    if name.is_empty() {
        "-".to_string()
    } else {
        name
    }
}

impl Syslog {
    /// Sends each line (without its newline) as one datagram. A failed send reconnects once
    /// (syslogd restarted) and retries that line; a second failure ends the batch with the
    /// error (the remaining lines are lost and counted).
    fn send(&mut self, buf: &[u8], marks: &[Mark]) -> io::Result<()> {
        let now = SystemTime::now();
        let mut header = String::with_capacity(96);
        let mut start = 0;
        for m in marks {
            let line = buf.get(start..m.end.saturating_sub(1)).unwrap_or_default();
            start = m.end;
            header.clear();
            self.header(now, m.severity, &mut header);
            self.packet.clear();
            self.packet.extend_from_slice(header.as_bytes());
            self.packet.extend_from_slice(line);
            let first = match &self.sock {
                Some(s) => s.send(&self.packet),
                None => Err(io::Error::new(io::ErrorKind::NotConnected, "not connected")),
            };
            if first.is_err() {
                self.sock = None;
                let s = self.dest.connect()?;
                s.send(&self.packet)?;
                self.sock = Some(s);
            }
        }
        if self.packet.capacity() > BUF_KEEP {
            self.packet = Vec::new();
        }
        Ok(())
    }

    fn header(&self, now: SystemTime, severity: u8, out: &mut String) {
        use std::fmt::Write as _;
        let pri = u32::from(self.facility.code()) * 8 + u32::from(severity);
        match self.format {
            SyslogFormat::Rfc5424 => {
                let _ = write!(out, "<{pri}>1 ");
                format_time(now, out);
                let _ = write!(
                    out,
                    " {} mongoguard {} {} - ",
                    self.hostname, self.pid, self.msgid
                );
            }
            SyslogFormat::Rfc3164 => {
                let _ = write!(out, "<{pri}>");
                format_time_3164(now, out);
                out.push(' ');
                if matches!(self.dest, Dest::Udp(_)) {
                    out.push_str(&self.hostname);
                    out.push(' ');
                }
                let _ = write!(out, "mongoguard[{}]: ", self.pid);
            }
        }
    }
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
                counters.add_write_error();
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
