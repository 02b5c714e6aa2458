//! The values of the `[audit]` section that name where lines go and how syslog frames them:
//! [`SinkSpec`], [`Facility`], [`SyslogFormat`].

use std::{fmt, path::PathBuf, str::FromStr};

use serde::{Deserialize, Deserializer};

/// Where a stream of audit lines (violations, or events) goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SinkSpec {
    /// `"stdout"` (the default of the violation stream).
    #[default]
    Stdout,
    /// `"stderr"`.
    Stderr,
    /// `"file:/path/to/violations.log"`: appended to, created if missing, rotated by size when
    /// `file_max_size` is set.
    File(PathBuf),
    /// `"syslog"`: the local syslog socket (`syslog_socket`, `/dev/log` by default), one
    /// datagram per line.
    Syslog,
    /// `"syslog+udp://host:514"`: a remote syslog server over UDP (`host:port`, port 514 when
    /// left out), one datagram per line.
    SyslogUdp(String),
    /// `"none"`: nothing is written (violations are still counted).
    None,
}

const SINKS: &str = "stdout, stderr, file:<path>, syslog, syslog+udp://<host>:<port>, none";

impl FromStr for SinkSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stdout" => Ok(SinkSpec::Stdout),
            "stderr" => Ok(SinkSpec::Stderr),
            "none" => Ok(SinkSpec::None),
            "syslog" => Ok(SinkSpec::Syslog),
            _ => {
                if let Some(path) = s.strip_prefix("file:") {
                    if path.is_empty() {
                        return Err("audit sink \"file:\" needs a path".to_string());
                    }
                    return Ok(SinkSpec::File(PathBuf::from(path)));
                }
                if let Some(addr) = s.strip_prefix("syslog+udp://") {
                    let addr = addr.trim_end_matches('/');
                    if addr.is_empty() || addr.contains('/') {
                        return Err(format!(
                            "audit sink {s:?}: expected syslog+udp://<host>[:<port>]"
                        ));
                    }
                    // "host", "host:514", "[::1]:514", "[::1]".
                    let has_port = match addr.rfind(']') {
                        Some(i) => addr.get(i..).is_some_and(|t| t.contains(':')),
                        None => addr.contains(':'),
                    };
                    let addr = if has_port {
                        addr.to_string()
                    } else {
                        format!("{addr}:514")
                    };
                    return Ok(SinkSpec::SyslogUdp(addr));
                }
                Err(format!("unknown audit sink {s:?} ({SINKS})"))
            }
        }
    }
}

impl fmt::Display for SinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSpec::Stdout => f.write_str("stdout"),
            SinkSpec::Stderr => f.write_str("stderr"),
            SinkSpec::File(path) => write!(f, "file:{}", path.display()),
            SinkSpec::Syslog => f.write_str("syslog"),
            SinkSpec::SyslogUdp(addr) => write!(f, "syslog+udp://{addr}"),
            SinkSpec::None => f.write_str("none"),
        }
    }
}

impl<'de> Deserialize<'de> for SinkSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A syslog facility (`audit.syslog_facility`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facility(u8);

impl Facility {
    const NAMES: [&'static str; 24] = [
        "kern",
        "user",
        "mail",
        "daemon",
        "auth",
        "syslog",
        "lpr",
        "news",
        "uucp",
        "cron",
        "authpriv",
        "ftp",
        "ntp",
        "security",
        "console",
        "solaris-cron",
        "local0",
        "local1",
        "local2",
        "local3",
        "local4",
        "local5",
        "local6",
        "local7",
    ];

    /// `local0`, the default.
    pub const LOCAL0: Facility = Facility(16);

    /// The facility's number (`local0` is 16).
    pub fn code(self) -> u8 {
        self.0
    }
}

impl Default for Facility {
    fn default() -> Self {
        Facility::LOCAL0
    }
}

impl FromStr for Facility {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Facility::NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(s))
            .map(|i| Facility(i as u8))
            .ok_or_else(|| {
                format!(
                    "unknown syslog facility {s:?} (kern, user, mail, daemon, auth, syslog, lpr, \
                     news, uucp, cron, authpriv, ftp, local0 ... local7)"
                )
            })
    }
}

impl fmt::Display for Facility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            Facility::NAMES
                .get(usize::from(self.0))
                .copied()
                .unwrap_or("user"),
        )
    }
}

impl<'de> Deserialize<'de> for Facility {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The syslog message format (`audit.syslog_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum SyslogFormat {
    /// BSD syslog: `<PRI>Mmm dd hh:mm:ss [HOST ]mongoguard[PID]: MSG` (the hostname only over
    /// UDP, as the C library's `syslog()` does on the local socket). Timestamps are UTC.
    #[serde(rename = "rfc3164")]
    Rfc3164,
    /// `<PRI>1 TIMESTAMP HOST mongoguard PID MSGID - MSG`, MSGID `violation` or `event`.
    #[serde(rename = "rfc5424")]
    Rfc5424,
}

/// Serialized as written in the file (`--check-config`): the string [`FromStr`] reads.
macro_rules! serialize_as_display {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}
serialize_as_display!(SinkSpec);
serialize_as_display!(Facility);
serialize_as_display!(super::UpstreamUri);
