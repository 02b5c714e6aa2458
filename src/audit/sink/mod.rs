//! The sinks of the audit streams, behind one [`Target`]: stdout / stderr (one locked
//! `write_all` per batch), a file ([`file`]: rotated by size, reopened on request), syslog
//! ([`syslog`]: one datagram per line, to the local unix socket or over UDP). Each stream's
//! [`StreamSettings`] come from the `[audit]` section.

pub(crate) mod file;
mod syslog;

use std::{
    fmt,
    io::{self, Write},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use self::{file::RotatingFile, syslog::Syslog};
use super::{AuditConfig, AuditError, Facility, SinkSpec, SyslogFormat};

/// A render or packet buffer that grew past this is shrunk back after its batch.
pub(crate) const BUF_KEEP: usize = 1 << 20;

/// Everything one stream's sink needs to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamSettings {
    pub spec: SinkSpec,
    pub max_size: u64,
    pub keep: usize,
    pub facility: Facility,
    pub socket: PathBuf,
    pub format: SyslogFormat,
    /// `"violation"` or `"event"`: the RFC 5424 MSGID.
    pub msgid: &'static str,
}

impl StreamSettings {
    fn new(
        config: &AuditConfig,
        spec: &SinkSpec,
        max_size: u64,
        keep: usize,
        msgid: &'static str,
    ) -> StreamSettings {
        // RFC 3164 on the local socket (what journald and rsyslog read there), RFC 5424 over
        // UDP, unless `syslog_format` says otherwise.
        let format = config.syslog_format.unwrap_or(match spec {
            SinkSpec::SyslogUdp(_) => SyslogFormat::Rfc5424,
            _ => SyslogFormat::Rfc3164,
        });
        StreamSettings {
            spec: spec.clone(),
            max_size,
            keep,
            facility: config.syslog_facility,
            socket: config.syslog_socket.clone(),
            format,
            msgid,
        }
    }

    /// The violation stream's settings.
    pub(crate) fn violations(config: &AuditConfig) -> StreamSettings {
        let c = config;
        StreamSettings::new(c, &c.sink, c.file_max_size, c.file_keep, "violation")
    }

    /// The event stream's settings.
    pub(crate) fn events(config: &AuditConfig) -> StreamSettings {
        let c = config;
        StreamSettings::new(
            c,
            &c.events_sink,
            c.events_file_max_size,
            c.events_file_keep,
            "event",
        )
    }
}

/// The end of one line in a batch buffer (just past its `\n`) and its syslog severity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) end: usize,
    pub(crate) severity: u8,
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
                Target::Syslog(Arc::new(Mutex::new(Syslog::open(s)?)))
            }
        }))
    }

    /// Reopens a file sink at its configured path (after an external rotation renamed it);
    /// other sinks have nothing to reopen. Blocking: call from a blocking thread.
    pub(crate) fn reopen_blocking(&self) {
        if let Target::File(f) = self {
            locked(f).reopen_on_request();
        }
    }

    /// Writes the lines of `buf` (ending at `marks`). Stdout and stderr get one `write_all`
    /// while holding the stream lock, so lines from other writers of the same stream (the
    /// tracing subscriber) never interleave with ours mid-line. Blocking: call from a
    /// blocking thread.
    pub(crate) fn write_blocking(&self, buf: &[u8], marks: &[Mark]) -> io::Result<()> {
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
            Target::Syslog(s) => write!(f, "syslog {}", locked(s).dest()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit(text: &str) -> AuditConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn each_stream_takes_its_own_fields() {
        let c = audit(
            "sink = \"file:/var/log/mg/violations.log\"\nfile_max_size = \"100MB\"\nfile_keep = 3\n\
             events_sink = \"syslog\"\nevents_file_max_size = \"64MiB\"\nevents_file_keep = 2\n\
             syslog_facility = \"local5\"\nsyslog_socket = \"/run/log.sock\"\n",
        );
        let v = StreamSettings::violations(&c);
        assert_eq!(v.spec, SinkSpec::File("/var/log/mg/violations.log".into()));
        assert_eq!((v.max_size, v.keep, v.msgid), (100_000_000, 3, "violation"));
        let e = StreamSettings::events(&c);
        assert_eq!(e.spec, SinkSpec::Syslog);
        assert_eq!((e.max_size, e.keep, e.msgid), (64 << 20, 2, "event"));
        for s in [&v, &e] {
            assert_eq!(s.facility.code(), 21);
            assert_eq!(s.socket, PathBuf::from("/run/log.sock"));
        }
    }

    #[test]
    fn syslog_format_follows_the_sink_unless_set() {
        let d = AuditConfig::default();
        assert_eq!(StreamSettings::violations(&d).format, SyslogFormat::Rfc3164);
        assert_eq!(
            StreamSettings::violations(&d).socket,
            PathBuf::from("/dev/log")
        );
        let udp = audit("sink = \"syslog+udp://logs.example:1514\"");
        assert_eq!(
            StreamSettings::violations(&udp).format,
            SyslogFormat::Rfc5424
        );
        assert_eq!(StreamSettings::events(&udp).format, SyslogFormat::Rfc3164);
        let fixed = audit("sink = \"syslog+udp://h\"\nsyslog_format = \"rfc3164\"");
        assert_eq!(
            StreamSettings::violations(&fixed).format,
            SyslogFormat::Rfc3164
        );
    }
}
