//! The `[audit]` configuration.

use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use serde::{Deserialize, Deserializer};

use super::AuditError;

/// Largest accepted `queue_capacity` (a full queue holds this many records in memory).
pub const MAX_QUEUE_CAPACITY: usize = 1_000_000;

/// Longest accepted `dedup_window`.
pub const MAX_DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Where violation records go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SinkSpec {
    /// `"stdout"` (the default).
    #[default]
    Stdout,
    /// `"stderr"`.
    Stderr,
    /// `"file:/path/to/violations.log"`: appended to, created if missing.
    File(PathBuf),
    /// `"none"`: violations are only counted.
    None,
}

impl FromStr for SinkSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stdout" => Ok(SinkSpec::Stdout),
            "stderr" => Ok(SinkSpec::Stderr),
            "none" => Ok(SinkSpec::None),
            _ => match s.strip_prefix("file:") {
                Some("") => Err("audit sink \"file:\" needs a path".to_string()),
                Some(path) => Ok(SinkSpec::File(PathBuf::from(path))),
                None => Err(format!(
                    "unknown audit sink {s:?} (stdout, stderr, file:<path>, none)"
                )),
            },
        }
    }
}

impl fmt::Display for SinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSpec::Stdout => f.write_str("stdout"),
            SinkSpec::Stderr => f.write_str("stderr"),
            SinkSpec::File(path) => write!(f, "file:{}", path.display()),
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

/// The `[audit]` section: where violation records go and how they are throttled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// `"stdout"` (default), `"stderr"`, `"file:/path/to/violations.log"` or `"none"`.
    pub sink: SinkSpec,
    /// Identical violations within this window are written once, then summarised
    /// (`"60s"` by default; `"0"` disables dedup).
    #[serde(deserialize_with = "crate::config::duration::deserialize")]
    pub dedup_window: Duration,
    /// Records waiting for the writer; beyond this they are dropped and counted.
    pub queue_capacity: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            sink: SinkSpec::Stdout,
            dedup_window: Duration::from_secs(60),
            queue_capacity: 10_000,
        }
    }
}

impl AuditConfig {
    /// Checks ranges and that a file sink's directory exists (without opening the file).
    pub fn validate(&self) -> Result<(), AuditError> {
        if !(1..=MAX_QUEUE_CAPACITY).contains(&self.queue_capacity) {
            return Err(AuditError::Invalid(format!(
                "queue_capacity must be between 1 and {MAX_QUEUE_CAPACITY}, got {}",
                self.queue_capacity
            )));
        }
        if self.dedup_window > MAX_DEDUP_WINDOW {
            return Err(AuditError::Invalid(format!(
                "dedup_window must be at most 24h, got {:?}",
                self.dedup_window
            )));
        }
        if let SinkSpec::File(path) = &self.sink {
            // "violations.log" has the empty path as parent: the working directory.
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(AuditError::MissingDirectory {
                    path: path.clone(),
                    dir: dir.to_path_buf(),
                });
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
        assert!(parse("sink = \"syslog\"")
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
