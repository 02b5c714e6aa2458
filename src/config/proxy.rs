//! The `[proxy]` section: the client-facing side.

use std::{net::SocketAddr, time::Duration};

use serde::Deserialize;

use super::{duration, size, ConfigError};

/// mongod's default largest message (`maxMessageSizeBytes`), both directions. The wire layer's
/// `DEFAULT_MAX_MESSAGE_SIZE` is this constant.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 48_000_000;

/// The smallest `max_message_size` accepted: a message header (16 bytes, the wire layer's
/// `HEADER_LEN`; a compile-time assertion there checks they agree).
pub const MIN_MAX_MESSAGE_SIZE: usize = 16;

/// The most session threads `proxy.threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// How clients are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One upstream connection per client; the client's own authentication goes through.
    Passthrough,
    /// Shared, pre-authenticated upstream connections; mongoguard authenticates clients.
    Pooled,
}

/// The client-facing side.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// `passthrough` or `pooled`.
    pub mode: Mode,
    /// Connections beyond this are closed at accept time.
    pub max_client_connections: usize,
    /// A client that sends nothing for this long is disconnected (`"0"`: never).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub client_idle_timeout: Duration,
    /// A client that does not take a reply within this long is closed and its buffers freed
    /// (`"0"`: never; not recommended: a client that never reads then holds its reply).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub client_write_timeout: Duration,
    /// Once the first byte of a message has arrived, the whole message must arrive within
    /// this long (slowloris), else the connection is closed. Separate from the idle timeout,
    /// which runs between messages (`"0"`: never).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub client_read_timeout: Duration,
    /// Process-wide budget of client message bytes in flight: buffered large messages and
    /// their decompressed form. A request that finds it spent waits up to
    /// `memory_budget_wait`, then is refused with code 65003 (MongoguardMemoryBudget); a
    /// message larger than the whole budget is always refused.
    #[serde(deserialize_with = "size::deserialize")]
    pub memory_budget: u64,
    /// How long a request waits for `memory_budget` before it is refused.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub memory_budget_wait: Duration,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub drain_timeout: Duration,
    /// On SIGTERM/SIGINT, how long to go on accepting and serving while `/readyz` already
    /// says 503, before the drain (Kubernetes removes the endpoint only after it sent the
    /// signal). 0: drain at once.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub shutdown_delay: Duration,
    /// Largest accepted message, both directions (mongod's default is 48,000,000).
    pub max_message_size: usize,
    /// Allow a listener on a non-loopback address without TLS (or, in pooled mode, without
    /// client authentication). Off: such a configuration is refused.
    pub allow_insecure_listener: bool,
    /// Bind the client and admin listeners with `SO_REUSEPORT`, so that a new mongoguard can
    /// bind the same ports beside one that is draining (zero-downtime restart; README,
    /// "Zero-downtime restart"). Off by default: a second instance started by mistake then
    /// fails with "address in use" instead of silently sharing the port. Linux allows it only
    /// between processes of the same effective user.
    pub reuse_port: bool,
    /// Reads (`find`, `aggregate` without `$out`/`$merge`, `count`, `distinct`, outside
    /// transactions) are sent with `maxTimeMS` at most this, so the server stops one that runs
    /// longer and answers MaxTimeMSExpired (50), which drivers do not retry. `"0"`: off.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub request_time_limit: Duration,
    /// Passthrough mode: threads serving client sessions, each its own event loop; a session
    /// stays on the thread it was placed on at accept (the one with the fewest sessions).
    /// `0`: one per CPU this process may use (its affinity mask and cgroup CPU quota). Pooled
    /// mode's sessions run on the shared runtime and ignore it.
    pub threads: usize,
    /// Passthrough mode: run sessions on the shared work-stealing runtime instead of
    /// `threads` event loops (how every session ran before the loops; pooled mode always
    /// does). Measured to cost more CPU per request; kept as a fallback for a workload where
    /// one client's heavy requests would hold up the others of its thread.
    pub work_stealing: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 27017)),
            mode: Mode::Passthrough,
            max_client_connections: 10_000,
            client_idle_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(30),
            shutdown_delay: Duration::ZERO,
            client_write_timeout: Duration::from_secs(30),
            client_read_timeout: Duration::from_secs(30),
            memory_budget: 1 << 30,
            memory_budget_wait: Duration::from_secs(1),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            allow_insecure_listener: false,
            reuse_port: false,
            request_time_limit: Duration::ZERO,
            threads: 0,
            work_stealing: false,
        }
    }
}

impl ProxyConfig {
    /// Limits that must leave room to serve anything.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_client_connections == 0 {
            return Err(ConfigError::Invalid(
                "proxy.max_client_connections must be at least 1".into(),
            ));
        }
        if self.memory_budget == 0 {
            return Err(ConfigError::Invalid(
                "proxy.memory_budget must be above 0 (a message larger than the budget is \
                 always refused)"
                    .into(),
            ));
        }
        if self.threads > MAX_THREADS {
            return Err(ConfigError::Invalid(format!(
                "proxy.threads must be at most {MAX_THREADS} (0: one per CPU)"
            )));
        }
        if self.max_message_size < MIN_MAX_MESSAGE_SIZE || self.max_message_size > i32::MAX as usize
        {
            return Err(ConfigError::Invalid(format!(
                "proxy.max_message_size must be between 16 and {}",
                i32::MAX
            )));
        }
        Ok(())
    }
}
