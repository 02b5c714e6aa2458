//! Audit log errors (all of them startup errors: once running, the log never fails a request).

use std::path::PathBuf;

use thiserror::Error;

/// Why the audit log could not start.
#[derive(Debug, Error)]
pub enum AuditError {
    /// The `[audit]` section was refused (a value out of range, a missing directory).
    #[error(transparent)]
    Config(#[from] crate::config::AuditConfigError),
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
