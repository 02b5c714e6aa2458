//! Audit log errors (all of them startup errors: once running, the log never fails a request).

use std::path::PathBuf;

use thiserror::Error;

/// Why the audit log could not start.
#[derive(Debug, Error)]
pub enum AuditError {
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
    /// The file sink could not be opened for appending.
    #[error("cannot open audit log {} for appending: {source}", path.display())]
    Open {
        /// The configured file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The syslog socket could not be opened or reached.
    #[error("cannot open syslog sink {dest}: {source}")]
    Syslog {
        /// The socket path or `udp://host:port`.
        dest: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// [`AuditLog::start`](super::AuditLog::start) was called outside a tokio runtime.
    #[error("the audit log writer must be started inside a tokio runtime")]
    NoRuntime,
}

/// The configuration's verdict on an `[audit]` section, as the audit log reports it (same
/// variant, same text).
impl From<crate::config::AuditConfigError> for AuditError {
    fn from(e: crate::config::AuditConfigError) -> Self {
        use crate::config::AuditConfigError as C;
        match e {
            C::Invalid(why) => AuditError::Invalid(why),
            C::MissingDirectory { path, dir } => AuditError::MissingDirectory { path, dir },
        }
    }
}
