//! Typed, validated configuration: a TOML file (`mongoguard.toml`) whose values CLI flags
//! override. Unknown keys are errors, and parse errors carry the file name, line and column.

pub mod duration;
mod error;

use std::{net::SocketAddr, path::Path, time::Duration};

use serde::Deserialize;

pub use error::ConfigError;

use crate::upstream::UpstreamUri;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The client-facing side.
    pub proxy: ProxyConfig,
    /// The upstream mongod / mongos.
    pub upstream: UpstreamConfig,
    /// Logging.
    pub log: LogConfig,
    /// The policy (rule pack) in force.
    pub policy: PolicyConfig,
    /// Violation records.
    pub audit: crate::audit::AuditConfig,
}

/// The `[policy]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A policy file (TOML). Absent: the built-in `standard` profile. A file that is missing
    /// or invalid at startup is an error, never a silent fallback.
    pub file: Option<std::path::PathBuf>,
    /// How often the file's modification time is checked for a reload (SIGHUP reloads at
    /// once). `"0"` disables the check.
    #[serde(deserialize_with = "duration::deserialize")]
    pub reload_poll: Duration,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            file: None,
            reload_poll: Duration::from_secs(2),
        }
    }
}

/// How clients are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One upstream connection per client; the client's own authentication goes through.
    Passthrough,
    /// Shared, pre-authenticated upstream connections (not implemented yet).
    Pooled,
}

/// The client-facing side.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// `passthrough` or `pooled`.
    pub mode: Mode,
    /// Connections beyond this are closed at accept time.
    pub max_client_connections: usize,
    /// A client that sends nothing for this long is disconnected (`"0"`: never).
    #[serde(deserialize_with = "duration::deserialize")]
    pub client_idle_timeout: Duration,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    #[serde(deserialize_with = "duration::deserialize")]
    pub drain_timeout: Duration,
    /// Largest accepted message, both directions (mongod's default is 48,000,000).
    pub max_message_size: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 27017)),
            mode: Mode::Passthrough,
            max_client_connections: 10_000,
            client_idle_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(30),
            max_message_size: crate::wire::DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

/// The upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// `mongodb://host:port[,host:port...][/?options]`.
    pub uri: UpstreamUri,
    /// Budget for one TCP connect to the upstream.
    #[serde(deserialize_with = "duration::deserialize")]
    pub connect_timeout: Duration,
    /// A request whose reply has not started after this long fails and both connections
    /// close (`"0"`: wait for ever). Long enough for awaitable hello (10 s) and slow queries.
    #[serde(deserialize_with = "duration::deserialize")]
    pub reply_timeout: Duration,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            uri: UpstreamUri::default(),
            connect_timeout: Duration::from_secs(5),
            reply_timeout: Duration::from_secs(300),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Logging.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `human` or `json`.
    pub format: LogFormat,
    /// A `tracing` filter directive such as `info` or `mongoguard=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// A passthrough config listening on an ephemeral loopback port, for tests and tools.
    pub fn for_upstream(uri: &str) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        config.proxy.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.upstream.uri = uri.parse()?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.proxy.mode == Mode::Pooled {
            return Err(ConfigError::Invalid(
                "proxy.mode = \"pooled\" is not implemented yet; use \"passthrough\"".into(),
            ));
        }
        if self.proxy.max_client_connections == 0 {
            return Err(ConfigError::Invalid(
                "proxy.max_client_connections must be at least 1".into(),
            ));
        }
        if self.proxy.max_message_size < crate::wire::HEADER_LEN
            || self.proxy.max_message_size > i32::MAX as usize
        {
            return Err(ConfigError::Invalid(format!(
                "proxy.max_message_size must be between 16 and {}",
                i32::MAX
            )));
        }
        self.audit
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.upstream.connect_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "upstream.connect_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let text = include_str!("../../mongoguard.example.toml");
        let c = Config::from_toml_str(text, "mongoguard.example.toml").unwrap();
        assert_eq!(c.proxy.mode, Mode::Passthrough);
    }

    #[test]
    fn unknown_key_is_an_error_with_a_line_number() {
        let err = Config::from_toml_str(
            "[proxy]\nlisten = \"127.0.0.1:1\"\nlisten_addr = 1\n",
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("t.toml"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("listen_addr"), "{err}");
    }

    #[test]
    fn bad_values_rejected() {
        assert!(
            Config::from_toml_str("[proxy]\nclient_idle_timeout = \"5 parsecs\"\n", "t").is_err()
        );
        assert!(Config::from_toml_str("[proxy]\nmode = \"pooled\"\n", "t").is_err());
        assert!(Config::from_toml_str("[upstream]\nuri = \"http://x\"\n", "t").is_err());
        assert!(Config::from_toml_str("[proxy]\nmax_client_connections = 0\n", "t").is_err());
    }

    #[test]
    fn defaults_are_sane() {
        let c = Config::from_toml_str("", "t").unwrap();
        assert_eq!(c.proxy.listen.port(), 27017);
        assert!(c.proxy.listen.ip().is_loopback());
        assert_eq!(c.proxy.max_message_size, 48_000_000);
    }
}
