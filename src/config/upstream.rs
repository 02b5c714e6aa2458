//! The `[upstream]` section: where mongod / mongos is, and the identities mongoguard
//! authenticates as toward it.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use super::{duration, ConfigError, UpstreamUri};

/// The identity of the URI's credentials (or of no credentials at all); the upstream layer's
/// `DEFAULT_IDENTITY` is this constant.
pub const DEFAULT_IDENTITY: &str = "default";

/// The upstream.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// `mongodb://host:port[,host:port...][/?options]`, or `mongodb+srv://NAME[/?options]`
    /// (hosts from NAME's SRV records, options from its TXT record).
    pub uri: UpstreamUri,
    /// `mongodb+srv://`: the name server (`IP:PORT`) asked for the SRV and TXT records and
    /// for the SRV targets' addresses. Default: the system's resolver configuration
    /// (`/etc/resolv.conf`), with the targets resolved like any host name.
    pub dns_server: Option<SocketAddr>,
    /// `mongodb+srv://` without `replicaSet` (a mongos list): the shortest time between two
    /// lookups of the SRV records, which otherwise follow the records' smallest TTL.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub srv_poll_interval: Duration,
    /// Budget for one TCP connect to the upstream.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub connect_timeout: Duration,
    /// A request whose reply has not started after this long fails and both connections
    /// close (`"0"`: wait for ever). Long enough for awaitable hello (10 s) and slow queries.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub reply_timeout: Duration,
    /// Pooled mode with several upstream hosts: how often each is checked with hello.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub heartbeat_interval: Duration,
    /// Pooled mode: how long a request waits for a suitable upstream server (a primary
    /// during a failover) before it fails.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub server_selection_timeout: Duration,
    /// Upstream identities besides `default` (the URI's credentials), by name.
    pub identities: BTreeMap<String, IdentityConfig>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            uri: UpstreamUri::default(),
            dns_server: None,
            // The polling specification's floor for rescanSRVIntervalMS.
            srv_poll_interval: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            reply_timeout: Duration::from_secs(300),
            heartbeat_interval: Duration::from_millis(500),
            server_selection_timeout: Duration::from_secs(15),
            identities: Default::default(),
        }
    }
}

impl UpstreamConfig {
    /// Rules of every mode.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "upstream.connect_timeout must be above zero".into(),
            ));
        }
        if let Some(v) = self.uri.option("loadBalanced") {
            if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                return Err(ConfigError::Invalid(format!(
                    "upstream.uri: loadBalanced must be true or false, not {v:?}"
                )));
            }
        }
        if self.uri.load_balanced() {
            // The load balancer specification's URI rules.
            let conflict = if self.uri.hosts.len() > 1 {
                Some("more than one host")
            } else if self.uri.option("replicaSet").is_some() {
                Some("replicaSet")
            } else if self
                .uri
                .option("directConnection")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
            {
                Some("directConnection=true")
            } else {
                None
            };
            if let Some(what) = conflict {
                return Err(ConfigError::Invalid(format!(
                    "upstream.uri: loadBalanced=true cannot be combined with {what} \
                     (the load balancer is the one host)"
                )));
            }
        }
        if self.srv_poll_interval < Duration::from_millis(10) {
            return Err(ConfigError::Invalid(
                "upstream.srv_poll_interval must be at least 10ms".into(),
            ));
        }
        Ok(())
    }

    /// Rules of pooled mode: the monitors and server selection need sane timings, and
    /// `default` stays the URI's identity.
    pub(super) fn validate_pooled(&self) -> Result<(), ConfigError> {
        if self.heartbeat_interval < Duration::from_millis(50) {
            return Err(ConfigError::Invalid(
                "upstream.heartbeat_interval must be at least 50ms".into(),
            ));
        }
        if self.server_selection_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "upstream.server_selection_timeout must be above zero".into(),
            ));
        }
        if self.identities.contains_key(DEFAULT_IDENTITY) {
            return Err(ConfigError::Invalid(format!(
                "upstream.identities.{0}: \"{0}\" is the URI's credentials and cannot be redefined",
                DEFAULT_IDENTITY
            )));
        }
        Ok(())
    }
}

/// One upstream identity: the credentials mongoguard uses toward the upstream for the
/// client users mapped to it (`upstream = "NAME"` in the users file).
#[derive(Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// The upstream user name.
    pub username: String,
    /// The password, inline (prefer `password_env` or `password_file`).
    #[serde(default, serialize_with = "super::mask::secret")]
    pub password: Option<String>,
    /// An environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// A file holding the password (trailing newline ignored).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
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
