//! The `[pool]` section (pooled mode): limits of each upstream pool. The pool itself
//! (`upstream::pool::PoolConfig`) converts from [`PoolSettings`].

use std::time::Duration;

use serde::Deserialize;

use super::{duration, ConfigError};

/// The `[pool]` section (pooled mode): limits of each upstream pool, one pool per (upstream
/// server, upstream identity). PgBouncer's meanings.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSettings {
    /// Most upstream connections per pool (in use, idle or being opened).
    pub pool_size: usize,
    /// Idle connections kept open per pool, opened ahead of demand.
    pub min_idle: usize,
    /// How long a request waits for a free upstream connection before it fails with a
    /// non-retryable error (`"0"` is refused: a request must not wait for ever).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub checkout_timeout: Duration,
    /// An idle upstream connection unused this long is closed (`"0"`: never).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub idle_timeout: Duration,
    /// An upstream connection older than this is closed when next idle (`"0"`: never).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub max_lifetime: Duration,
    /// Most client connections of one application (the handshake's `appName`) at once; `0`:
    /// no limit. The one over it gets HostUnreachable (6) naming the limit in answer to its
    /// hello, then is closed. Applies in both modes.
    pub max_connections_per_app: usize,
    /// Most client connections authenticated as one user (`db.name`) at once (pooled mode);
    /// `0`: no limit. The one over it gets the error in answer to the authentication step
    /// that completed, then is closed.
    pub max_connections_per_user: usize,
    /// Most client connections from one client network at once (the client address with
    /// only its first `network_prefix_v4` / `network_prefix_v6` bits kept); `0`: no limit.
    /// The one over it gets HostUnreachable (6) naming the network in answer to its first
    /// message, then is closed. Applies in both modes.
    pub max_connections_per_network: usize,
    /// The IPv4 prefix length that makes a client network (32: one address).
    pub network_prefix_v4: u8,
    /// The IPv6 prefix length that makes a client network (128: one address).
    pub network_prefix_v6: u8,
    /// Wire compressors offered to clients in mongoguard's hello (pooled mode), in order of
    /// preference; the first of the client's list that is here is agreed. A compressed
    /// request is decompressed and sent upstream as it was; its reply is compressed with the
    /// request's compressor (as mongod does). `[]`: no compression.
    pub compressors: Vec<String>,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            pool_size: 20,
            min_idle: 0,
            checkout_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(3600),
            max_connections_per_app: 0,
            max_connections_per_user: 0,
            max_connections_per_network: 0,
            network_prefix_v4: 32,
            network_prefix_v6: 64,
            compressors: vec!["snappy".into(), "zstd".into(), "zlib".into()],
        }
    }
}

impl PoolSettings {
    /// Rules of every mode (the connection limits apply in both).
    pub(super) fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.network_prefix_v4 > 32 || self.network_prefix_v6 > 128 {
            return Err(ConfigError::Invalid(
                "pool: network_prefix_v4 must be at most 32 and network_prefix_v6 at most 128"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The limits are consistent: at least one connection, no more idle ones than that, and a
    /// checkout that cannot wait for ever. (The pool checks the first two again when it is
    /// built: `upstream::pool::PoolConfig::validate`.)
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.pool_size == 0 {
            return Err(ConfigError::Invalid(
                "pool: pool_size must be at least 1".into(),
            ));
        }
        if self.min_idle > self.pool_size {
            return Err(ConfigError::Invalid(format!(
                "pool: min_idle ({}) must not exceed pool_size ({})",
                self.min_idle, self.pool_size
            )));
        }
        for name in &self.compressors {
            if !matches!(name.as_str(), "snappy" | "zstd" | "zlib") {
                return Err(ConfigError::Invalid(format!(
                    "pool.compressors: unknown compressor {name:?} (snappy, zstd, zlib)"
                )));
            }
        }
        if self.checkout_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "pool.checkout_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }
}
