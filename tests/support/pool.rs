//! What the upstream pool's tests share (included with `#[path]`, without the rest of
//! `support`): the key they check out under and a pool configuration.

use std::time::Duration;

use mongoguard::upstream::pool::{PoolConfig, PoolKey};
use mongoguard::upstream::Host;

/// The key of `identity` on the tests' one (fake) server.
pub fn key_of(identity: &str) -> PoolKey {
    PoolKey::new(
        Host {
            name: "db.example".into(),
            port: 27017,
        },
        identity,
    )
}

/// `pool_size` and `min_idle`, waits bounded by `checkout_timeout`, nothing expiring.
pub fn config(pool_size: usize, min_idle: usize, checkout_timeout: Duration) -> PoolConfig {
    PoolConfig {
        pool_size,
        min_idle,
        checkout_timeout,
        idle_timeout: None,
        max_lifetime: None,
    }
}
