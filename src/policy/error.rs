//! Policy loading errors. A policy that fails to load is never replaced by defaults.

use thiserror::Error;

/// Why a policy file was refused.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, unknown keys, wrong types (toml's message carries line and column).
    #[error("{origin}: {message}")]
    Parse {
        /// File name.
        origin: String,
        /// toml's message.
        message: String,
    },
    /// A semantic problem: unknown rule id, parameter on the wrong rule, bad pattern or CIDR.
    #[error("{origin}: {message}")]
    Invalid {
        /// File name.
        origin: String,
        /// What is wrong.
        message: String,
    },
}
