//! Typed, validated configuration: a TOML file (`mongoguard.toml`) whose values CLI flags
//! override. Unknown keys are errors, and parse errors carry the file name, line and column.

pub mod duration;
mod error;
pub mod size;

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
    /// Upstream connection pools (pooled mode).
    pub pool: PoolSettings,
    /// Client authentication terminated by mongoguard (pooled mode).
    pub auth: AuthConfig,
    /// TLS on the client-facing listener.
    pub tls: TlsConfig,
    /// The admin HTTP listener: metrics, health, status.
    pub admin: AdminConfig,
}

/// The `[tls]` section: TLS on the listener (upstream TLS comes from the upstream URI).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain (leaf first). Setting it (with `key_file`) turns TLS on: every
    /// client must then speak TLS.
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key of the certificate.
    pub key_file: Option<std::path::PathBuf>,
    /// PEM CA bundle: when set, clients must present a certificate signed by it.
    pub client_ca_file: Option<std::path::PathBuf>,
    /// A client that has not finished the TLS handshake after this long is dropped.
    #[serde(deserialize_with = "duration::deserialize")]
    pub handshake_timeout: Duration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// The `[admin]` section: the admin HTTP listener (metrics, health, policy, status page).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Where the admin listener binds; `""` or `"off"` disables it.
    #[serde(deserialize_with = "deserialize_admin_listen")]
    pub listen: Option<SocketAddr>,
    /// Bearer token required on every endpoint except `/healthz`.
    pub token: Option<String>,
    /// A file holding the bearer token (trailing whitespace ignored).
    pub token_file: Option<std::path::PathBuf>,
    /// Distinct application names kept in metric labels and tables; the rest are "other".
    pub app_name_cap: usize,
    /// Recent violations kept for `/violations`.
    pub violations_buffer: usize,
    /// Query shapes kept (least recently used evicted) for `/shapes`.
    pub shapes_capacity: usize,
}

/// Never prints the token (`--check-config` prints the configuration).
impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("app_name_cap", &self.app_name_cap)
            .field("violations_buffer", &self.violations_buffer)
            .field("shapes_capacity", &self.shapes_capacity)
            .finish()
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9216))),
            token: None,
            token_file: None,
            app_name_cap: 50,
            violations_buffer: 1000,
            shapes_capacity: 1000,
        }
    }
}

impl TlsConfig {
    /// True when the listener speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }
}

impl AdminConfig {
    /// The bearer token: `token`, or the trimmed contents of `token_file`.
    pub fn load_token(&self) -> Result<Option<String>, ConfigError> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), None) => t.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "admin: set token or token_file, not both".into(),
                ))
            }
        };
        if token.is_empty() {
            return Err(ConfigError::Invalid("admin: the token is empty".into()));
        }
        Ok(Some(token))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.token.is_some() && self.token_file.is_some() {
            return Err(ConfigError::Invalid(
                "admin: set token or token_file, not both".into(),
            ));
        }
        if let Some(addr) = self.listen {
            if !addr.ip().is_loopback() && self.token.is_none() && self.token_file.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "admin.listen = {addr} is not a loopback address: set admin.token or \
                     admin.token_file (or listen on 127.0.0.1)"
                )));
            }
        }
        for (name, v) in [
            ("app_name_cap", self.app_name_cap),
            ("violations_buffer", self.violations_buffer),
            ("shapes_capacity", self.shapes_capacity),
        ] {
            if v == 0 || v > 1_000_000 {
                return Err(ConfigError::Invalid(format!(
                    "admin.{name} must be between 1 and 1000000"
                )));
            }
        }
        Ok(())
    }
}

fn deserialize_admin_listen<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    match text.trim() {
        "" | "off" => Ok(None),
        t => t.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// The `[pool]` section (pooled mode): limits of each upstream pool, one pool per (upstream
/// server, upstream identity). PgBouncer's meanings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSettings {
    /// Most upstream connections per pool (in use, idle or being opened).
    pub pool_size: usize,
    /// Idle connections kept open per pool, opened ahead of demand.
    pub min_idle: usize,
    /// How long a request waits for a free upstream connection before it fails with a
    /// non-retryable error (`"0"` is refused: a request must not wait for ever).
    #[serde(deserialize_with = "duration::deserialize")]
    pub checkout_timeout: Duration,
    /// An idle upstream connection unused this long is closed (`"0"`: never).
    #[serde(deserialize_with = "duration::deserialize")]
    pub idle_timeout: Duration,
    /// An upstream connection older than this is closed when next idle (`"0"`: never).
    #[serde(deserialize_with = "duration::deserialize")]
    pub max_lifetime: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            pool_size: 20,
            min_idle: 0,
            checkout_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(3600),
        }
    }
}

impl PoolSettings {
    /// The pool's own form of these limits.
    pub fn pool_config(&self) -> crate::upstream::pool::PoolConfig {
        let opt = |d: Duration| (!d.is_zero()).then_some(d);
        crate::upstream::pool::PoolConfig {
            pool_size: self.pool_size,
            min_idle: self.min_idle,
            checkout_timeout: self.checkout_timeout,
            idle_timeout: opt(self.idle_timeout),
            max_lifetime: opt(self.max_lifetime),
        }
    }
}

/// The `[auth]` section (pooled mode).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The users file: SCRAM secrets of the users clients authenticate as
    /// (`mongoguard users add`). Required in pooled mode unless `allow_unauthenticated`.
    pub users_file: Option<std::path::PathBuf>,
    /// Serve clients that do not authenticate, as the `default` upstream identity. Only
    /// allowed when the listener is on a loopback address.
    pub allow_unauthenticated: bool,
}

/// One upstream identity: the credentials mongoguard uses toward the upstream for the
/// client users mapped to it (`upstream = "NAME"` in the users file).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// The upstream user name.
    pub username: String,
    /// The password, inline (prefer `password_env` or `password_file`).
    #[serde(default)]
    pub password: Option<String>,
    /// An environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// A file holding the password (trailing newline ignored).
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// The authentication database (default `admin`).
    #[serde(default)]
    pub source: Option<String>,
    /// `SCRAM-SHA-256` or `SCRAM-SHA-1` (default: what the upstream offers, SHA-256 first).
    #[serde(default)]
    pub mechanism: Option<String>,
}

impl std::fmt::Debug for IdentityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityConfig")
            .field("username", &self.username)
            .field("source", &self.source)
            .field("mechanism", &self.mechanism)
            .finish_non_exhaustive()
    }
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
    /// Shared, pre-authenticated upstream connections; mongoguard authenticates clients.
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
    /// A client that does not take a reply within this long is closed and its buffers freed
    /// (`"0"`: never; not recommended: a client that never reads then holds its reply).
    #[serde(deserialize_with = "duration::deserialize")]
    pub client_write_timeout: Duration,
    /// Once the first byte of a message has arrived, the whole message must arrive within
    /// this long (slowloris), else the connection is closed. Separate from the idle timeout,
    /// which runs between messages (`"0"`: never).
    #[serde(deserialize_with = "duration::deserialize")]
    pub client_read_timeout: Duration,
    /// Process-wide budget of client message bytes in flight: buffered large messages and
    /// their decompressed form. A request that finds it spent waits up to
    /// `memory_budget_wait`, then is refused with code 65003 (MongoguardMemoryBudget); a
    /// message larger than the whole budget is always refused.
    #[serde(deserialize_with = "size::deserialize")]
    pub memory_budget: u64,
    /// How long a request waits for `memory_budget` before it is refused.
    #[serde(deserialize_with = "duration::deserialize")]
    pub memory_budget_wait: Duration,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    #[serde(deserialize_with = "duration::deserialize")]
    pub drain_timeout: Duration,
    /// Largest accepted message, both directions (mongod's default is 48,000,000).
    pub max_message_size: usize,
    /// Allow a listener on a non-loopback address without TLS (or, in pooled mode, without
    /// client authentication). Off: such a configuration is refused.
    pub allow_insecure_listener: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 27017)),
            mode: Mode::Passthrough,
            max_client_connections: 10_000,
            client_idle_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(30),
            client_write_timeout: Duration::from_secs(30),
            client_read_timeout: Duration::from_secs(30),
            memory_budget: 1 << 30,
            memory_budget_wait: Duration::from_secs(1),
            max_message_size: crate::wire::DEFAULT_MAX_MESSAGE_SIZE,
            allow_insecure_listener: false,
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
    /// Pooled mode with several upstream hosts: how often each is checked with hello.
    #[serde(deserialize_with = "duration::deserialize")]
    pub heartbeat_interval: Duration,
    /// Pooled mode: how long a request waits for a suitable upstream server (a primary
    /// during a failover) before it fails.
    #[serde(deserialize_with = "duration::deserialize")]
    pub server_selection_timeout: Duration,
    /// Upstream identities besides `default` (the URI's credentials), by name.
    pub identities: std::collections::BTreeMap<String, IdentityConfig>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            uri: UpstreamUri::default(),
            connect_timeout: Duration::from_secs(5),
            reply_timeout: Duration::from_secs(300),
            heartbeat_interval: Duration::from_millis(500),
            server_selection_timeout: Duration::from_secs(15),
            identities: Default::default(),
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
        config.admin.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.validate()?;
        Ok(config)
    }

    /// Checks the cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.proxy.mode == Mode::Pooled {
            self.validate_pooled()?;
        }
        if self.tls.enabled() && (self.tls.cert_file.is_none() || self.tls.key_file.is_none()) {
            return Err(ConfigError::Invalid(
                "tls: set both cert_file and key_file".into(),
            ));
        }
        if self.tls.client_ca_file.is_some() && !self.tls.enabled() {
            return Err(ConfigError::Invalid(
                "tls.client_ca_file needs tls.cert_file and tls.key_file".into(),
            ));
        }
        if !self.proxy.listen.ip().is_loopback() && !self.proxy.allow_insecure_listener {
            if !self.tls.enabled() {
                return Err(ConfigError::Invalid(format!(
                    "proxy.listen = {} is not a loopback address and [tls] is not configured: \
                     clients would send credentials and data in clear text. Configure \
                     tls.cert_file and tls.key_file, or set proxy.allow_insecure_listener = true \
                     (for a private network you trust)",
                    self.proxy.listen
                )));
            }
            if self.proxy.mode == Mode::Pooled && self.auth.users_file.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "proxy.listen = {} is not a loopback address: pooled mode needs \
                     auth.users_file there (or proxy.allow_insecure_listener = true)",
                    self.proxy.listen
                )));
            }
        }
        if self.proxy.max_client_connections == 0 {
            return Err(ConfigError::Invalid(
                "proxy.max_client_connections must be at least 1".into(),
            ));
        }
        if self.proxy.memory_budget == 0 {
            return Err(ConfigError::Invalid(
                "proxy.memory_budget must be above 0 (a message larger than the budget is \
                 always refused)"
                    .into(),
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
        self.admin.validate()?;
        if self.upstream.connect_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "upstream.connect_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }

    fn validate_pooled(&self) -> Result<(), ConfigError> {
        self.pool
            .pool_config()
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("pool: {e}")))?;
        if self.pool.checkout_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "pool.checkout_timeout must be above zero".into(),
            ));
        }
        if self.upstream.heartbeat_interval < Duration::from_millis(50) {
            return Err(ConfigError::Invalid(
                "upstream.heartbeat_interval must be at least 50ms".into(),
            ));
        }
        if self.upstream.server_selection_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "upstream.server_selection_timeout must be above zero".into(),
            ));
        }
        if self
            .upstream
            .identities
            .contains_key(crate::upstream::DEFAULT_IDENTITY)
        {
            return Err(ConfigError::Invalid(format!(
                "upstream.identities.{0}: \"{0}\" is the URI's credentials and cannot be redefined",
                crate::upstream::DEFAULT_IDENTITY
            )));
        }
        if self.auth.users_file.is_none() && !self.auth.allow_unauthenticated {
            return Err(ConfigError::Invalid(
                "proxy.mode = \"pooled\" terminates client authentication: set auth.users_file \
                 (see `mongoguard users add`), or auth.allow_unauthenticated = true on a \
                 loopback listener"
                    .into(),
            ));
        }
        if self.auth.allow_unauthenticated && !self.proxy.listen.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "auth.allow_unauthenticated is only allowed on a loopback listener, not {}",
                self.proxy.listen
            )));
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
        // Pooled mode needs a users file or explicit unauthenticated access on loopback.
        assert!(Config::from_toml_str("[proxy]\nmode = \"pooled\"\n", "t").is_err());
        assert!(Config::from_toml_str(
            "[proxy]\nmode = \"pooled\"\nlisten = \"0.0.0.0:1\"\n[auth]\nallow_unauthenticated = true\n",
            "t"
        )
        .is_err());
        let ok = Config::from_toml_str(
            "[proxy]\nmode = \"pooled\"\n[auth]\nallow_unauthenticated = true\n[pool]\npool_size = 3\n",
            "t",
        )
        .unwrap();
        assert_eq!(ok.pool.pool_config().pool_size, 3);
        assert!(Config::from_toml_str(
            "[proxy]\nmode = \"pooled\"\n[auth]\nusers_file = \"u\"\n[pool]\npool_size = 2\nmin_idle = 3\n",
            "t"
        )
        .is_err());
        assert!(Config::from_toml_str(
            "[proxy]\nmode = \"pooled\"\n[auth]\nusers_file = \"u\"\n[upstream.identities.default]\nusername = \"x\"\n",
            "t"
        )
        .is_err());
        assert!(Config::from_toml_str("[upstream]\nuri = \"http://x\"\n", "t").is_err());
        assert!(Config::from_toml_str("[proxy]\nmax_client_connections = 0\n", "t").is_err());
    }

    #[test]
    fn non_loopback_listener_needs_tls_or_explicit_consent() {
        let err = Config::from_toml_str("[proxy]\nlisten = \"0.0.0.0:27017\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("allow_insecure_listener"), "{err}");
        Config::from_toml_str(
            "[proxy]\nlisten = \"0.0.0.0:27017\"\nallow_insecure_listener = true\n",
            "t",
        )
        .unwrap();
        Config::from_toml_str(
            "[proxy]\nlisten = \"0.0.0.0:27017\"\n[tls]\ncert_file = \"c\"\nkey_file = \"k\"\n",
            "t",
        )
        .unwrap();
        assert!(Config::from_toml_str("[tls]\ncert_file = \"c\"\n", "t").is_err());
        assert!(Config::from_toml_str("[tls]\nclient_ca_file = \"c\"\n", "t").is_err());
    }

    #[test]
    fn admin_listener_rules() {
        let c = Config::from_toml_str("", "t").unwrap();
        assert_eq!(
            c.admin.listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 9216)))
        );
        let off = Config::from_toml_str("[admin]\nlisten = \"off\"\n", "t").unwrap();
        assert_eq!(off.admin.listen, None);
        let off = Config::from_toml_str("[admin]\nlisten = \"\"\n", "t").unwrap();
        assert_eq!(off.admin.listen, None);
        // A non-loopback admin listener without a token refuses to start.
        let err = Config::from_toml_str("[admin]\nlisten = \"0.0.0.0:9216\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("token"), "{err}");
        assert!(Config::from_toml_str(
            "[admin]\nlisten = \"0.0.0.0:9216\"\ntoken = \"s3cret\"\n",
            "t"
        )
        .is_ok());
        assert!(
            Config::from_toml_str("[admin]\ntoken = \"a\"\ntoken_file = \"/x\"\n", "t").is_err()
        );
        assert!(Config::from_toml_str("[admin]\napp_name_cap = 0\n", "t").is_err());
        let with_token = Config::from_toml_str("[admin]\ntoken = \"s3cret\"\n", "t").unwrap();
        assert!(!format!("{with_token:?}").contains("s3cret"));
        assert!(Config::from_toml_str("[admin]\nlisten = \"nowhere\"\n", "t").is_err());
    }

    #[test]
    fn defaults_are_sane() {
        let c = Config::from_toml_str("", "t").unwrap();
        assert_eq!(c.proxy.listen.port(), 27017);
        assert!(c.proxy.listen.ip().is_loopback());
        assert_eq!(c.proxy.max_message_size, 48_000_000);
    }
}
