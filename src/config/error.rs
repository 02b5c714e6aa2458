//! Configuration errors.

use thiserror::Error;

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys or wrong types (the message has the line).
    #[error("{origin}: {message}")]
    Parse {
        /// The file name (or "command line").
        origin: String,
        /// toml's message, with line and column.
        message: String,
    },
    /// The upstream URI is not a supported `mongodb://` URI.
    #[error("invalid upstream URI: {0}")]
    Uri(String),
    /// A value is out of range or a combination is not allowed.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}
