//! Typed, validated configuration: a TOML file (`mongoguard.toml`) whose values CLI flags
//! override. Unknown keys are errors, and parse errors carry the file name, line and column.
//!
//! A leaf: this module imports nothing else of the crate. It owns every settings type (one
//! file per section, each with the rules that concern only it; the rules across sections are
//! in [`Config::validate`]), and the runtime layers convert from them: the upstream pool's
//! limits from [`PoolSettings`], the audit log's streams from [`AuditConfig`], upstream TLS
//! and the topology from [`UpstreamUri`]. Where a runtime layer has the same constant (the
//! default message size, the `default` identity), it is defined here and the runtime refers
//! to it.

mod admin;
mod allowlist;
mod audit;
mod auth;
pub mod duration;
mod error;
mod log;
pub(crate) mod mask;
mod plan;
mod policy;
mod pool;
mod proxy;
mod sink;
pub mod size;
#[cfg(test)]
mod tests;
mod tls;
mod upstream;
mod uri;

use std::{net::SocketAddr, path::Path};

use serde::Deserialize;

pub use admin::AdminConfig;
pub use allowlist::{AllowlistConfig, AllowlistMode, UnknownApp};
pub use audit::{
    AuditConfig, AuditConfigError, MAX_DEDUP_WINDOW, MAX_FILE_KEEP, MAX_QUEUE_CAPACITY,
    MIN_FILE_MAX_SIZE,
};
pub use auth::AuthConfig;
pub use error::ConfigError;
pub use log::{LogConfig, LogFormat};
pub use plan::{PlanConfig, PlanEnabled};
pub use policy::PolicyConfig;
pub use pool::PoolSettings;
pub use proxy::{Mode, ProxyConfig, DEFAULT_MAX_MESSAGE_SIZE, MIN_MAX_MESSAGE_SIZE};
pub use sink::{Facility, SinkSpec, SyslogFormat};
pub use tls::TlsConfig;
pub use upstream::{IdentityConfig, UpstreamConfig, DEFAULT_IDENTITY};
pub use uri::{Host, SrvName, UpstreamUri, DEFAULT_SRV_SERVICE};

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
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
    pub audit: AuditConfig,
    /// Upstream connection pools (pooled mode).
    pub pool: PoolSettings,
    /// Client authentication terminated by mongoguard (pooled mode).
    pub auth: AuthConfig,
    /// TLS on the client-facing listener.
    pub tls: TlsConfig,
    /// The admin HTTP listener: metrics, health, status.
    pub admin: AdminConfig,
    /// The plan guard (Q006, Q007).
    pub plan: PlanConfig,
    /// The learned allowlist of query shapes (rule A001).
    pub allowlist: AllowlistConfig,
}

/// The largest file mongoguard reads as text (configuration, policy, users file, allowlist,
/// admin token): far above any real one, so that a wrong path (a log file, a disk image)
/// fails with an error instead of being read whole into memory.
pub const MAX_TEXT_FILE_SIZE: u64 = 64 * 1024 * 1024;

/// Reads a policy, users or allowlist file: at most [`MAX_TEXT_FILE_SIZE`] bytes (checked
/// before reading and while reading). With `regular_only` (the files that SIGHUP, the mtime
/// poll and `POST /reload` read again while the proxy runs), refuses without opening it what
/// is not a regular file after symlinks: reading a named pipe blocks until someone writes to
/// it, on the thread that reloads, and a `--policy <(...)` process substitution reads as
/// empty the second time (an empty policy file is the `standard` profile: the operator's
/// policy would be silently replaced at the first SIGHUP).
pub fn read_text_file(path: &Path, regular_only: bool) -> std::io::Result<String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path)?;
    if regular_only && !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_TEXT_FILE_SIZE} bytes"),
        )
    };
    if meta.len() > MAX_TEXT_FILE_SIZE {
        return Err(too_large());
    }
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_TEXT_FILE_SIZE + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_TEXT_FILE_SIZE {
        return Err(too_large());
    }
    Ok(text)
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
        config.admin.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.validate()?;
        Ok(config)
    }

    /// Checks every section, then the rules across sections. The first rule broken is
    /// reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.proxy.mode == Mode::Pooled {
            self.pool.validate()?;
            self.upstream.validate_pooled()?;
            self.auth.validate_pooled(self.proxy.listen)?;
        }
        self.pool.validate_limits()?;
        self.plan.validate()?;
        self.tls.validate()?;
        self.validate_listener()?;
        self.proxy.validate()?;
        self.audit
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.admin.validate()?;
        self.upstream.validate()?;
        self.allowlist.validate()?;
        Ok(())
    }

    /// A listener off loopback needs TLS (and, in pooled mode, client authentication), or
    /// the explicit `allow_insecure_listener`.
    fn validate_listener(&self) -> Result<(), ConfigError> {
        let listen = self.proxy.listen;
        if listen.ip().is_loopback() || self.proxy.allow_insecure_listener {
            return Ok(());
        }
        if !self.tls.enabled() {
            return Err(ConfigError::Invalid(format!(
                "proxy.listen = {listen} is not a loopback address and [tls] is not configured: \
                 clients would send credentials and data in clear text. Configure \
                 tls.cert_file and tls.key_file, or set proxy.allow_insecure_listener = true \
                 (for a private network you trust)"
            )));
        }
        if self.proxy.mode == Mode::Pooled && self.auth.users_file.is_none() {
            return Err(ConfigError::Invalid(format!(
                "proxy.listen = {listen} is not a loopback address: pooled mode needs \
                 auth.users_file there (or proxy.allow_insecure_listener = true)"
            )));
        }
        Ok(())
    }
}
