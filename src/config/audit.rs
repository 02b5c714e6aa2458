//! The `[audit]` section: where violation records and events go, and how they are throttled.
//! The audit log derives each stream's settings from it.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use thiserror::Error;

use super::{Facility, SinkSpec, SyslogFormat};

/// Largest accepted `queue_capacity` (a full queue holds this many records in memory).
pub const MAX_QUEUE_CAPACITY: usize = 1_000_000;

/// Longest accepted `dedup_window`.
pub const MAX_DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Shortest accepted `connection_report_interval`.
pub const MIN_CONNECTION_REPORT_INTERVAL: Duration = Duration::from_millis(100);

/// Most rotated files kept.
pub const MAX_FILE_KEEP: usize = 1000;

/// Smallest non-zero `file_max_size` (smaller values rotate on nearly every line).
pub const MIN_FILE_MAX_SIZE: u64 = 4096;

/// Why an `[audit]` section was refused. The audit log reports it as its own
/// `AuditError` with the same variant and text.
#[derive(Debug, Error)]
pub enum AuditConfigError {
    /// A value is out of range or malformed.
    #[error("invalid audit configuration: {0}")]
    Invalid(String),
    /// The directory of a file sink does not exist.
    #[error("audit log {}: directory {} does not exist", path.display(), dir.display())]
    MissingDirectory {
        /// The configured file.
        path: PathBuf,
        /// Its parent directory.
        dir: PathBuf,
    },
}

/// The `[audit]` section: where violation records and events go, and how they are throttled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Violation records: `"stdout"` (default), `"stderr"`, `"file:/path/violations.log"`,
    /// `"syslog"`, `"syslog+udp://host:514"` or `"none"`.
    pub sink: SinkSpec,
    /// A file sink is rotated before it would grow past this many bytes (`"100MB"`,
    /// `"64MiB"`; `"0"`, the default, never rotates: for an external logrotate).
    #[serde(deserialize_with = "super::size::deserialize")]
    pub file_max_size: u64,
    /// Rotated files kept: `PATH.1` (newest) ... `PATH.N`; older ones are deleted.
    pub file_keep: usize,
    /// Events (connections, authentication, policy reloads): same values as `sink`;
    /// `"none"` by default.
    pub events_sink: SinkSpec,
    /// `file_max_size` for a file `events_sink`.
    #[serde(deserialize_with = "super::size::deserialize")]
    pub events_file_max_size: u64,
    /// `file_keep` for a file `events_sink`.
    pub events_file_keep: usize,
    /// Syslog facility of both streams (`"local0"` by default).
    pub syslog_facility: Facility,
    /// The local syslog socket (a unix datagram socket) of the `"syslog"` sink.
    pub syslog_socket: PathBuf,
    /// `"rfc3164"` or `"rfc5424"`; by default RFC 3164 on the local socket (what journald and
    /// rsyslog read there) and RFC 5424 over UDP.
    pub syslog_format: Option<SyslogFormat>,
    /// Identical violations within this window are written once, then summarised
    /// (`"60s"` by default; `"0"` disables dedup).
    #[serde(
        deserialize_with = "super::duration::deserialize",
        serialize_with = "super::duration::serialize"
    )]
    pub dedup_window: Duration,
    /// How often the connection standards (C001–C003) are assessed and their findings
    /// written, one record per (application, rule) while a finding holds (`"60s"`).
    #[serde(
        deserialize_with = "super::duration::deserialize",
        serialize_with = "super::duration::serialize"
    )]
    pub connection_report_interval: Duration,
    /// Lines waiting for the writer, per stream; beyond this they are dropped and counted.
    pub queue_capacity: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            sink: SinkSpec::Stdout,
            file_max_size: 0,
            file_keep: 5,
            events_sink: SinkSpec::None,
            events_file_max_size: 0,
            events_file_keep: 5,
            syslog_facility: Facility::LOCAL0,
            syslog_socket: PathBuf::from("/dev/log"),
            syslog_format: None,
            dedup_window: Duration::from_secs(60),
            connection_report_interval: Duration::from_secs(60),
            queue_capacity: 10_000,
        }
    }
}

impl AuditConfig {
    /// Checks ranges and that a file sink's directory exists (without opening the file).
    pub fn validate(&self) -> Result<(), AuditConfigError> {
        if !(1..=MAX_QUEUE_CAPACITY).contains(&self.queue_capacity) {
            return Err(AuditConfigError::Invalid(format!(
                "queue_capacity must be between 1 and {MAX_QUEUE_CAPACITY}, got {}",
                self.queue_capacity
            )));
        }
        if self.dedup_window > MAX_DEDUP_WINDOW {
            return Err(AuditConfigError::Invalid(format!(
                "dedup_window must be at most 24h, got {:?}",
                self.dedup_window
            )));
        }
        if self.connection_report_interval < MIN_CONNECTION_REPORT_INTERVAL
            || self.connection_report_interval > MAX_DEDUP_WINDOW
        {
            return Err(AuditConfigError::Invalid(format!(
                "connection_report_interval must be between 100ms and 24h, got {:?}",
                self.connection_report_interval
            )));
        }
        for (key, size) in [
            ("file_max_size", self.file_max_size),
            ("events_file_max_size", self.events_file_max_size),
        ] {
            if size != 0 && size < MIN_FILE_MAX_SIZE {
                return Err(AuditConfigError::Invalid(format!(
                    "{key} must be 0 (no rotation) or at least {MIN_FILE_MAX_SIZE} bytes, got {size}"
                )));
            }
        }
        for (key, keep) in [
            ("file_keep", self.file_keep),
            ("events_file_keep", self.events_file_keep),
        ] {
            if keep > MAX_FILE_KEEP {
                return Err(AuditConfigError::Invalid(format!(
                    "{key} must be at most {MAX_FILE_KEEP}, got {keep}"
                )));
            }
        }
        if let (SinkSpec::File(a), SinkSpec::File(b)) = (&self.sink, &self.events_sink) {
            if a == b {
                return Err(AuditConfigError::Invalid(format!(
                    "sink and events_sink must not be the same file ({})",
                    a.display()
                )));
            }
        }
        for spec in [&self.sink, &self.events_sink] {
            if let SinkSpec::File(path) = spec {
                // "violations.log" has the empty path as parent: the working directory.
                let dir = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                if !dir.is_dir() {
                    return Err(AuditConfigError::MissingDirectory {
                        path: path.clone(),
                        dir: dir.to_path_buf(),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AuditConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, AuditConfig::default());
        assert_eq!(c.sink, SinkSpec::Stdout);
        assert_eq!(c.dedup_window, Duration::from_secs(60));
        assert_eq!(c.queue_capacity, 10_000);
        c.validate().unwrap();
    }

    #[test]
    fn every_sink_and_field() {
        let c = parse(
            "sink = \"file:/var/log/mg/violations.log\"\ndedup_window = \"250ms\"\nqueue_capacity = 5\n",
        )
        .unwrap();
        assert_eq!(
            c.sink,
            SinkSpec::File(PathBuf::from("/var/log/mg/violations.log"))
        );
        assert_eq!(c.dedup_window, Duration::from_millis(250));
        assert_eq!(c.queue_capacity, 5);
        assert_eq!(parse("sink = \"stderr\"").unwrap().sink, SinkSpec::Stderr);
        assert_eq!(parse("sink = \"none\"").unwrap().sink, SinkSpec::None);
        assert_eq!(
            parse("dedup_window = \"0\"").unwrap().dedup_window,
            Duration::ZERO
        );
        for s in ["stdout", "stderr", "none", "file:/a b/c.log"] {
            assert_eq!(s.parse::<SinkSpec>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse("sink = \"syslog+tcp://x\"")
            .unwrap_err()
            .contains("unknown audit sink"));
        assert!(parse("sink = \"file:\"")
            .unwrap_err()
            .contains("needs a path"));
        assert!(parse("dedup_window = \"60\"").is_err());
        assert!(parse("bogus = 1").unwrap_err().contains("bogus"));
        let zero = AuditConfig {
            queue_capacity: 0,
            ..AuditConfig::default()
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("queue_capacity"));
        let long = AuditConfig {
            dedup_window: Duration::from_secs(25 * 3600),
            ..AuditConfig::default()
        };
        assert!(long.validate().is_err());
        for (text, ok) in [("\"50ms\"", false), ("\"100ms\"", true), ("\"25h\"", false)] {
            let c = parse(&format!("connection_report_interval = {text}")).unwrap();
            assert_eq!(c.validate().is_ok(), ok, "{text}");
            if !ok {
                let err = c.validate().unwrap_err().to_string();
                assert!(err.contains("connection_report_interval"), "{err}");
            }
        }
        assert_eq!(
            parse("").unwrap().connection_report_interval,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn sinks_rotation_syslog_and_events() {
        let c = parse(
            "sink = \"file:/var/log/mg/violations.log\"\nfile_max_size = \"100MB\"\nfile_keep = 3\n\
             events_sink = \"syslog\"\nevents_file_max_size = \"64MiB\"\nevents_file_keep = 2\n\
             syslog_facility = \"local5\"\nsyslog_socket = \"/run/log.sock\"\n\
             syslog_format = \"rfc5424\"\n",
        )
        .unwrap();
        assert_eq!(c.file_max_size, 100_000_000);
        assert_eq!(c.file_keep, 3);
        assert_eq!(c.events_sink, SinkSpec::Syslog);
        assert_eq!(c.events_file_max_size, 64 << 20);
        assert_eq!(c.events_file_keep, 2);
        assert_eq!(c.syslog_facility.code(), 21);
        assert_eq!(c.syslog_facility.to_string(), "local5");
        assert_eq!(c.syslog_socket, PathBuf::from("/run/log.sock"));
        assert_eq!(c.syslog_format, Some(SyslogFormat::Rfc5424));
        assert_eq!(parse("file_max_size = 8192").unwrap().file_max_size, 8192);
        // Defaults: events off, no rotation, local0, /dev/log, the format chosen by the sink.
        let d = AuditConfig::default();
        assert_eq!(d.events_sink, SinkSpec::None);
        assert_eq!((d.file_max_size, d.file_keep), (0, 5));
        assert_eq!(d.syslog_facility, Facility::LOCAL0);
        assert_eq!(d.syslog_socket, PathBuf::from("/dev/log"));
        let udp = parse("sink = \"syslog+udp://logs.example:1514\"").unwrap();
        assert_eq!(udp.sink, SinkSpec::SyslogUdp("logs.example:1514".into()));
        assert_eq!(udp.syslog_format, None);
        assert_eq!(
            "syslog+udp://logs".parse::<SinkSpec>().unwrap(),
            SinkSpec::SyslogUdp("logs:514".into())
        );
        assert_eq!(
            "syslog+udp://[::1]".parse::<SinkSpec>().unwrap(),
            SinkSpec::SyslogUdp("[::1]:514".into())
        );
        for s in ["syslog", "syslog+udp://h:514"] {
            assert_eq!(s.parse::<SinkSpec>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn bad_rotation_and_syslog_values_are_refused() {
        assert!(parse("file_max_size = \"10TB\"").is_err());
        assert!(parse("file_max_size = -1").is_err());
        assert!(parse("syslog_facility = \"local9\"")
            .unwrap_err()
            .contains("unknown syslog facility"));
        assert!(parse("syslog_format = \"json\"").is_err());
        assert!(parse("sink = \"syslog+udp://\"").is_err());
        let tiny = parse("file_max_size = \"1KB\"").unwrap();
        assert!(tiny
            .validate()
            .unwrap_err()
            .to_string()
            .contains("file_max_size"));
        let many = parse("events_file_keep = 5000").unwrap();
        assert!(many
            .validate()
            .unwrap_err()
            .to_string()
            .contains("events_file_keep"));
        let same = parse("sink = \"file:/tmp/a.log\"\nevents_sink = \"file:/tmp/a.log\"").unwrap();
        assert!(same
            .validate()
            .unwrap_err()
            .to_string()
            .contains("same file"));
        let missing = parse("events_sink = \"file:/nonexistent-mongoguard-dir/e.log\"").unwrap();
        assert!(matches!(
            missing.validate(),
            Err(AuditConfigError::MissingDirectory { .. })
        ));
    }

    #[test]
    fn file_sink_directory_must_exist() {
        let c = AuditConfig {
            sink: SinkSpec::File("/nonexistent-mongoguard-dir/v.log".into()),
            ..AuditConfig::default()
        };
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("/nonexistent-mongoguard-dir/v.log"), "{msg}");
        assert!(msg.contains("does not exist"), "{msg}");
        let relative = AuditConfig {
            sink: SinkSpec::File("violations.log".into()),
            ..AuditConfig::default()
        };
        relative.validate().unwrap();
    }
}
