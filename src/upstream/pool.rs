//! The upstream connection pool (pooled mode): one pool per (upstream server, upstream
//! identity), PgBouncer semantics.
//!
//! - A checkout takes the most recently used idle connection (LIFO, so surplus connections
//!   age out through `idle_timeout`), opens a new one when the pool holds fewer than
//!   `pool_size`, and otherwise waits in a fair FIFO queue for at most `checkout_timeout`.
//! - An idle connection is checked with [`PooledConn::is_usable`] before it is handed out, so a
//!   connection the server closed while it sat idle is never given to a client.
//! - A [`Checkout`] goes back to the pool only through [`Checkout::release`]. Dropping it any
//!   other way (the client disconnected, the request future was cancelled, a panic) discards
//!   the connection: a connection that may be mid-request is never reused.
//! - Connections past `idle_timeout` (idle) or `max_lifetime` (any) are closed lazily at
//!   checkout and by [`Pool::maintain`], which also opens connections up to `min_idle`.
//!
//! The pool is generic over a [`Connector`], so its behaviour is tested with dummy
//! connections; [`TcpConnector`] is the plain-TCP one.
//!
//! # Shards
//! A pool made with [`Pool::sharded`] splits every key's `pool_size` (and `min_idle`)
//! between shards, one per session thread (`proxy::loops`): a thread checks out of its own
//! shard only ([`set_home_shard`]), so a connection is opened, used, released and handed to
//! the next waiter on one thread and its socket stays on that thread's reactor. A shard whose
//! oldest waiter has waited [`REBALANCE_AFTER`] takes a free slot from another shard
//! ([`Pool::rebalance`], called every [`REBALANCE_EVERY`]) — one with no connection, or
//! whose connection has been idle for `REBALANCE_AFTER` (a slot free only between two of its
//! shard's requests stays: moving it would close and reopen connections at every
//! fluctuation of even load) — or, when none is free, the next
//! slot a shard whose clients wait at most half as long (at every look for
//! [`REBALANCE_SUSTAIN`]) frees (that slot's connection closes first): load that stays uneven moves the limits with it, load that evens out moves them
//! back, and no waiter waits long while another shard has a slot free. A connection opened
//! by another thread (a background task's) serves its checkout and closes. The shards'
//! limits, their spare slots and the slots owed add up to `pool_size`: never more
//! connections are open.
//!
//! # Cancellation safety
//! [`Pool::checkout`] is cancellation safe: dropping its future while it waits for a slot
//! leaves the wait queue (no slot is leaked and no later release is lost), and dropping it
//! while it connects frees the reserved slot.

mod keyed;
mod stats;
mod tcp;

pub use keyed::{Ahead, Checkout};
pub use stats::PoolStats;
pub use tcp::TcpConnector;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keyed::{Gave, KeyPool, Load, Shard};

/// How long a shard's oldest waiter waits before [`Pool::rebalance`] gives its shard a slot
/// another shard has free.
pub const REBALANCE_AFTER: Duration = Duration::from_millis(50);

/// How often a sharded pool's owner calls [`Pool::rebalance`].
pub const REBALANCE_EVERY: Duration = Duration::from_millis(50);

/// How long two busy shards' waits must stay apart, at every [`Pool::rebalance`], before one
/// gives the next slot it frees to the other (a connection closes and another opens). Under
/// even load the oldest waiters' ages cross back and forth at every look: one look moved a
/// slot (and a connect and a login upstream) about every second request of a PHP-FPM burst.
pub const REBALANCE_SUSTAIN: Duration = Duration::from_millis(200);

thread_local! {
    /// The shard this thread checks out of, set once by a session thread.
    static HOME_SHARD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Makes this thread check out of shard `index` of every sharded pool (modulo their
/// shard count). Threads that never call it use shard 0.
pub fn set_home_shard(index: usize) {
    HOME_SHARD.set(Some(index));
}

/// This thread's shard of a pool of `count` shards, if it has one.
fn home_shard(count: usize) -> Option<usize> {
    HOME_SHARD.get().map(|i| i % count.max(1))
}

use super::{ConnectError, Host};
use crate::config::PoolSettings;

/// Identifies one pool: the upstream server and the upstream identity the connections are
/// authenticated as. A connection authenticated as one identity never serves another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKey {
    /// The upstream server (`host:port`).
    pub server: Host,
    /// The name of the upstream identity (the user mongoguard authenticates as).
    pub identity: String,
}

impl PoolKey {
    /// A key for `identity` on `server`.
    pub fn new(server: Host, identity: impl Into<String>) -> Self {
        PoolKey {
            server,
            identity: identity.into(),
        }
    }
}

// `Host` does not implement `Hash`; hash the same fields `Eq` compares.
impl Hash for PoolKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.server.name.hash(state);
        self.server.port.hash(state);
        self.identity.hash(state);
    }
}

/// `identity@host:port`.
impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.identity, self.server)
    }
}

/// A connection the pool can hold.
pub trait PooledConn: Send + 'static {
    /// Whether an idle connection can still be handed out. Called without blocking just before
    /// a checkout returns an idle connection; `false` closes it. For a socket: the peer closed
    /// it, it has an error, or it has unsolicited data pending (an idle MongoDB connection
    /// never receives any).
    fn is_usable(&mut self) -> bool;

    /// Writes `request`, the next request of the checkout this connection is being handed
    /// to, on behalf of that checkout's task, which is not running (its `waiter` is what
    /// would wake it), without blocking. Called by the checkout that released the
    /// connection, on the thread whose reactor drives it, after a complete exchange (see
    /// [`Pool::checkout_sending`]). A connection that writes all of `request` also arranges
    /// for `waiter` to be woken when the reply is readable. The default writes nothing.
    fn send_ahead(&mut self, request: &[u8], waiter: &std::task::Waker) -> SentAhead {
        let _ = (request, waiter);
        SentAhead::Nothing
    }
}

/// What [`PooledConn::send_ahead`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentAhead {
    /// Nothing: the waiter writes its request itself.
    Nothing,
    /// The first `n` bytes (`0 < n < len`): the waiter writes the rest.
    Part(usize),
    /// All of it.
    Whole {
        /// The waiter is woken when the reply is readable (and need not be woken now).
        reply_wakes: bool,
    },
}

/// Opens (and, once upstream authentication exists, authenticates) upstream connections.
pub trait Connector: Send + Sync + 'static {
    /// The connection type.
    type Conn: PooledConn;

    /// Opens a connection for `key`. Must bound its own duration (connect timeout).
    fn connect(
        &self,
        key: &PoolKey,
    ) -> impl Future<Output = Result<Self::Conn, ConnectError>> + Send;
}

/// Limits of every per-key pool, with PgBouncer's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Most connections (idle, in use or being opened) per key.
    pub pool_size: usize,
    /// Idle connections [`Pool::maintain`] keeps open per known key.
    pub min_idle: usize,
    /// Longest a checkout waits for a free slot when all `pool_size` are in use. Connecting
    /// is bounded by the connector's own timeout, not by this.
    pub checkout_timeout: Duration,
    /// An idle connection unused for this long is closed. `None`: never.
    pub idle_timeout: Option<Duration>,
    /// A connection older than this is closed when next idle. `None`: never.
    pub max_lifetime: Option<Duration>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            pool_size: 20,
            min_idle: 0,
            checkout_timeout: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            max_lifetime: Some(Duration::from_secs(3600)),
        }
    }
}

/// A [`PoolConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolConfigError {
    /// `pool_size` is 0.
    #[error("pool_size must be at least 1")]
    ZeroPoolSize,
    /// `min_idle` is larger than `pool_size`.
    #[error("min_idle ({min_idle}) must not exceed pool_size ({pool_size})")]
    MinIdleAbovePoolSize {
        /// The configured `min_idle`.
        min_idle: usize,
        /// The configured `pool_size`.
        pool_size: usize,
    },
}

/// The `[pool]` section's limits; `"0"` for `idle_timeout` or `max_lifetime` means never.
impl From<&PoolSettings> for PoolConfig {
    fn from(s: &PoolSettings) -> Self {
        let opt = |d: Duration| (!d.is_zero()).then_some(d);
        PoolConfig {
            pool_size: s.pool_size,
            min_idle: s.min_idle,
            checkout_timeout: s.checkout_timeout,
            idle_timeout: opt(s.idle_timeout),
            max_lifetime: opt(s.max_lifetime),
        }
    }
}

impl PoolConfig {
    /// Checks the limits are consistent.
    pub fn validate(&self) -> Result<(), PoolConfigError> {
        if self.pool_size == 0 {
            return Err(PoolConfigError::ZeroPoolSize);
        }
        if self.min_idle > self.pool_size {
            return Err(PoolConfigError::MinIdleAbovePoolSize {
                min_idle: self.min_idle,
                pool_size: self.pool_size,
            });
        }
        Ok(())
    }
}

/// Why a checkout failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Every connection of the pool stayed in use for the whole `checkout_timeout`. The text is
    /// meant for the client.
    #[error(
        "no upstream connection available for {pool}: all {pool_size} connections (pool_size) \
         stayed in use for {} ms (checkout_timeout); the upstream pool is saturated, retry \
         later or raise pool_size",
        .waited.as_millis()
    )]
    CheckoutTimeout {
        /// The pool (`identity@host:port`).
        pool: PoolKey,
        /// How long the checkout waited.
        waited: Duration,
        /// The pool's limit.
        pool_size: usize,
    },
    /// Opening a new upstream connection failed; the slot was freed.
    #[error("upstream pool {pool}: {source}")]
    Connect {
        /// The pool (`identity@host:port`).
        pool: PoolKey,
        /// The connect error.
        source: ConnectError,
    },
    /// The pool was closed (the proxy is shutting down).
    #[error("upstream pool {pool} is closed")]
    Closed {
        /// The pool (`identity@host:port`).
        pool: PoolKey,
    },
}

/// Upstream connection pools, one per [`PoolKey`], created on first use. Cheap to clone
/// (shared state).
pub struct Pool<C: Connector> {
    shared: Arc<Shared<C>>,
}

/// Every shard of one key's pool, in shard order (never none: the first is apart).
struct Shards<T> {
    first: Arc<KeyPool<T>>,
    rest: Box<[Arc<KeyPool<T>>]>,
    /// What [`Pool::rebalance`] remembers between its calls.
    balance: Arc<Mutex<Balance>>,
}

/// A key's rebalancing memory (see [`Pool::rebalance`], step 3).
#[derive(Default)]
struct Balance {
    /// Per shard: since when every look has seen its oldest waiter wait `REBALANCE_AFTER`
    /// while another shard (any, not always the same one) was less waited on (`None`: the
    /// last look did not).
    starved_since: Vec<Option<tokio::time::Instant>>,
}

impl<T> Clone for Shards<T> {
    fn clone(&self) -> Self {
        Shards {
            first: self.first.clone(),
            rest: self.rest.clone(),
            balance: self.balance.clone(),
        }
    }
}

impl<T> Shards<T> {
    /// Shard `index` (the first past the last).
    fn get(&self, index: usize) -> &Arc<KeyPool<T>> {
        index
            .checked_sub(1)
            .and_then(|i| self.rest.get(i))
            .unwrap_or(&self.first)
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<KeyPool<T>>> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }
}

struct Shared<C: Connector> {
    connector: C,
    config: PoolConfig,
    /// Shards per key (1: unsharded).
    shards: usize,
    pools: Mutex<HashMap<PoolKey, Shards<C::Conn>>>,
    /// Set (under the `pools` lock) by [`Pool::close`]; pools created afterwards start closed.
    closed: AtomicBool,
    /// Drained servers (under the `pools` lock): their pools keep no idle connection.
    drained: Mutex<Vec<Host>>,
}

/// The pool of one [`PoolKey`], looked up once (see [`Pool::handle`]).
pub struct PoolHandle<T: PooledConn>(Arc<KeyPool<T>>);

impl<T: PooledConn> PoolHandle<T> {
    /// The key of the pool.
    pub fn key(&self) -> &PoolKey {
        self.0.key()
    }
}

impl<T: PooledConn> Clone for PoolHandle<T> {
    fn clone(&self) -> Self {
        PoolHandle(self.0.clone())
    }
}

impl<T: PooledConn> fmt::Debug for PoolHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PoolHandle").field(self.key()).finish()
    }
}

impl<C: Connector> Clone for Pool<C> {
    fn clone(&self) -> Self {
        Pool {
            shared: self.shared.clone(),
        }
    }
}

impl<C: Connector> fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<C: Connector> Pool<C> {
    /// A pool set opening connections with `connector`, limited by `config`.
    pub fn new(connector: C, config: PoolConfig) -> Result<Self, PoolConfigError> {
        Pool::sharded(connector, config, 1)
    }

    /// [`Pool::new`] with every key's pool split into `shards` shards (at most `pool_size`;
    /// see the module docs): shard `i` serves the threads whose home shard is `i`.
    pub fn sharded(
        connector: C,
        config: PoolConfig,
        shards: usize,
    ) -> Result<Self, PoolConfigError> {
        config.validate()?;
        Ok(Pool {
            shared: Arc::new(Shared {
                connector,
                shards: shards.clamp(1, config.pool_size),
                config,
                pools: Mutex::new(HashMap::new()),
                closed: AtomicBool::new(false),
                drained: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The limits in force.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// Shards per key (1: unsharded).
    pub fn shards(&self) -> usize {
        self.shared.shards
    }

    /// Checks out a connection for `key`: an idle usable one (most recently used first), else a
    /// new one if the pool holds fewer than `pool_size`, else the next one freed, waiting in
    /// FIFO order for at most `checkout_timeout`. See the module docs for cancellation safety.
    pub async fn checkout(&self, key: &PoolKey) -> Result<Checkout<C::Conn>, PoolError> {
        let pool = self.key_pool(key);
        pool.checkout(&self.shared.connector).await
    }

    /// The pool of `key`, for checkouts that skip looking the key up ([`Pool::checkout_from`],
    /// [`Pool::checkout_ready`]). Pools are never removed or replaced ([`Pool::close`] and
    /// [`Pool::set_drained`] act on the pool itself), so a handle stays the pool of its key
    /// for as long as the `Pool` lives.
    pub fn handle(&self, key: &PoolKey) -> PoolHandle<C::Conn> {
        PoolHandle(self.key_pool(key))
    }

    /// [`Pool::checkout`] from the pool `handle` is for.
    pub async fn checkout_from(
        &self,
        handle: &PoolHandle<C::Conn>,
    ) -> Result<Checkout<C::Conn>, PoolError> {
        handle.0.checkout(&self.shared.connector).await
    }

    /// [`Pool::checkout_from`] whose wait for a slot ends when `expired` completes, which the
    /// caller makes happen `checkout_timeout` after the call (a timer it re-arms per
    /// checkout costs less than a new one each time; see `crate::proxy::timer`). The wait is
    /// the same FIFO queue and ends in the same [`PoolError::CheckoutTimeout`].
    pub async fn checkout_until(
        &self,
        handle: &PoolHandle<C::Conn>,
        expired: impl Future<Output = ()>,
    ) -> Result<Checkout<C::Conn>, PoolError> {
        let expired = std::pin::pin!(expired);
        handle
            .0
            .checkout_until(&self.shared.connector, expired, None)
            .await
    }

    /// [`Pool::checkout_until`] for a checkout that will write `request` (if any) first thing: if it
    /// waits, and the connection it gets is handed over by a checkout released on this
    /// thread, that release writes `request` ahead ([`PooledConn::send_ahead`]), so this
    /// checkout's task is not run in between (it then runs once, when the reply is in, not
    /// also to send). [`Checkout::sent_ahead`] says how much was written. Only on a sharded
    /// pool's home thread (see [`Pool::sharded`]), where the waiter and the releaser are one
    /// thread, so that a waiter whose request was written cannot be dropped concurrently; a
    /// waiter dropped afterwards closes the connection (a request is in flight on it).
    ///
    /// The future is one hand-written state machine (no `async` layers): its caller polls it
    /// in place, beside its own stop conditions.
    pub fn checkout_sending<'a, E: Future<Output = ()> + Unpin + 'a>(
        &'a self,
        handle: &'a PoolHandle<C::Conn>,
        expired: E,
        request: Option<&'a bytes::Bytes>,
    ) -> impl Future<Output = Result<Checkout<C::Conn>, PoolError>> + Unpin + 'a {
        handle
            .0
            .checkout_until(&self.shared.connector, expired, request)
    }

    /// A checkout that neither waits nor connects: a free slot and an idle usable connection
    /// at once, else `Ok(None)` (nothing taken; [`Pool::checkout_from`] does the rest). A
    /// closed pool fails as [`Pool::checkout`] does.
    // The same error type as the async checkouts return (only the closed case occurs).
    #[allow(clippy::result_large_err)]
    pub fn checkout_ready(
        &self,
        handle: &PoolHandle<C::Conn>,
    ) -> Result<Option<Checkout<C::Conn>>, PoolError> {
        handle.0.checkout_ready()
    }

    /// Closes idle connections past `idle_timeout` or `max_lifetime` or no longer usable, and
    /// opens connections up to `min_idle` for every key seen so far. Call it periodically.
    /// Returns the first connect error met while prefilling, if any (the other keys are still
    /// maintained).
    ///
    /// Sharded, it maintains the calling thread's shard only (none on a thread without a
    /// home shard): each session thread maintains its own, so that the connections `min_idle`
    /// opens are its own.
    pub async fn maintain(&self) -> Result<(), PoolError> {
        let count = self.shared.shards;
        let mine = if count == 1 {
            Some(0)
        } else {
            home_shard(count)
        };
        let Some(mine) = mine else {
            return Ok(());
        };
        let pools: Vec<_> = self
            .lock_pools()
            .values()
            .map(|shards| shards.get(mine).clone())
            .collect();
        let mut first_error = None;
        for pool in pools {
            pool.close_stale();
            if let Err(e) = pool.prefill(&self.shared.connector).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sharded: moves slots between the shards of every key, toward clients that wait (see
    /// the module docs). Returns how many slots a shard took. Call it every
    /// [`REBALANCE_EVERY`].
    ///
    /// 1. Spare slots (given up by a shard) go to the shard whose oldest waiter has waited
    ///    longest, else to the shard with the lowest limit.
    /// 2. A shard whose oldest waiter has waited [`REBALANCE_AFTER`] takes the slots other
    ///    shards have free, one per waiter.
    /// 3. If it still has one, and no give is owed yet, the shard whose oldest waiter has
    ///    waited least (none: zero), at most half as long, gives up the next slot it frees,
    ///    once every call for [`REBALANCE_SUSTAIN`] saw that shard wait so while another
    ///    (whichever, at each call) waited at most half as long (then the shard's imbalance
    ///    starts over: one slot per [`REBALANCE_SUSTAIN`]): limits move back toward even
    ///    when load evens out, both shards busy, and stay put while even load fluctuates.
    pub fn rebalance(&self) -> usize {
        if self.shared.shards == 1 {
            return 0;
        }
        let pools: Vec<_> = self.lock_pools().values().cloned().collect();
        let mut taken = 0;
        for shards in pools {
            taken += self.rebalance_key(&shards);
        }
        taken
    }

    fn rebalance_key(&self, key_shards: &Shards<C::Conn>) -> usize {
        let now = tokio::time::Instant::now();
        let mut balance = key_shards
            .balance
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shards: Vec<_> = key_shards.iter().collect();
        let loads = |shards: &[&Arc<KeyPool<C::Conn>>]| -> Vec<Load> {
            shards.iter().map(|s| s.load(now)).collect()
        };
        let waited = |l: &Load| l.oldest_wait.unwrap_or_default();
        // At most half as long as `starved_wait`, and REBALANCE_AFTER less: two busy shards
        // whose clients wait about as long keep their limits.
        let less_waited = |l: &Load, starved_wait: Duration| {
            let w = waited(l);
            w.saturating_mul(2) <= starved_wait && w + REBALANCE_AFTER <= starved_wait
        };
        // Step 3's imbalance as this look sees it, per shard: kept from the last look if it
        // saw it too. A shard is starved whichever other shard is the less waited-on at each
        // look (under load that changes from one look to the next), and while another shard
        // also waits; none while a give is owed (one at a time).
        let first = loads(&shards);
        let owed = first.iter().any(|l| l.owed > 0);
        let mut starved_since: Vec<_> = first
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let starved_wait = waited(l);
                let starved = !owed
                    && starved_wait >= REBALANCE_AFTER
                    && first
                        .iter()
                        .enumerate()
                        .any(|(j, d)| j != i && d.limit > 1 && less_waited(d, starved_wait));
                starved.then(|| {
                    balance
                        .starved_since
                        .get(i)
                        .copied()
                        .flatten()
                        .unwrap_or(now)
                })
            })
            .collect();
        let mut taken = 0;
        // Every move takes or gives one slot: bounded by the slots there are.
        for _ in 0..=self.shared.config.pool_size.saturating_mul(2) {
            let load = loads(&shards);
            let starved = load
                .iter()
                .enumerate()
                .filter(|(_, l)| l.oldest_wait.is_some())
                .max_by_key(|(_, l)| waited(l))
                .map(|(i, _)| i);
            // 1. A spare slot to the longest waiter, else to the lowest limit.
            let to = starved.or_else(|| {
                load.iter()
                    .enumerate()
                    .min_by_key(|(_, l)| l.limit)
                    .map(|(i, _)| i)
            });
            if let Some(s) = to.and_then(|i| shards.get(i)) {
                if s.take_slot() {
                    taken += 1;
                    continue;
                }
            }
            let Some(i) =
                starved.filter(|&i| load.get(i).is_some_and(|l| waited(l) >= REBALANCE_AFTER))
            else {
                break;
            };
            let starved_wait = load.get(i).map(waited).unwrap_or_default();
            // 2. A free slot elsewhere.
            let freed = shards
                .iter()
                .enumerate()
                .any(|(j, donor)| j != i && donor.give_slot(false, now) == Gave::Now);
            if freed {
                continue;
            }
            // 3. The next slot a less waited-on shard frees, one owed at a time.
            if load.iter().any(|l| l.owed > 0) {
                break;
            }
            let Some(donor) = load
                .iter()
                .enumerate()
                .filter(|&(j, l)| j != i && l.limit > 1 && less_waited(l, starved_wait))
                // Of shards as little waited on, one with a slot free gives it now: one with
                // every slot held may not free one for as long as the waiter can wait, and
                // while its give is owed no other is made.
                .min_by_key(|(_, l)| (waited(l), !l.free))
                .and_then(|(j, _)| shards.get(j))
            else {
                break;
            };
            // Only once every look for REBALANCE_SUSTAIN saw the shard starved.
            let sustained = starved_since
                .get(i)
                .copied()
                .flatten()
                .is_some_and(|since| now.saturating_duration_since(since) >= REBALANCE_SUSTAIN);
            if !sustained {
                break;
            }
            // The shard's imbalance starts over: one slot per REBALANCE_SUSTAIN, not every
            // one the donor has free at this look (each closes a connection it uses).
            if let Some(since) = starved_since.get_mut(i) {
                *since = None;
            }
            match donor.give_slot(true, now) {
                // Freed meanwhile: step 1 takes it.
                Gave::Now => continue,
                Gave::Later | Gave::Nothing => break,
            }
        }
        balance.starved_since = starved_since;
        taken
    }

    /// Makes `key` known without checking out, so that [`Pool::maintain`] prefills its pool
    /// up to `min_idle` before the first client needs it.
    pub fn register(&self, key: &PoolKey) {
        self.key_pool(key);
    }

    /// Counters and gauges of the pool for `key`, every shard's summed (all zero if it was
    /// never used).
    pub fn stats(&self, key: &PoolKey) -> PoolStats {
        let mut sum = PoolStats::default();
        if let Some(shards) = self.lock_pools().get(key) {
            for shard in shards.iter() {
                sum.absorb(&shard.stats());
            }
        }
        sum
    }

    /// The keys of every pool created so far.
    pub fn keys(&self) -> Vec<PoolKey> {
        self.lock_pools().keys().cloned().collect()
    }

    /// Closes every pool: idle connections are dropped, waiting and later checkouts fail with
    /// [`PoolError::Closed`], and connections in use are discarded when their checkout ends.
    pub fn close(&self) {
        let pools = self.lock_pools();
        self.shared.closed.store(true, Ordering::SeqCst);
        for pool in pools.values().flat_map(|shards| shards.iter()) {
            pool.close();
        }
    }

    /// Drains (`true`) or enables `server` in every pool of it: drained, its idle
    /// connections close at once and released ones close instead of idling (an operator's
    /// `POST /servers/{host}/drain`).
    pub fn set_drained(&self, server: &Host, drained: bool) {
        let pools = self.lock_pools();
        {
            let mut d = self
                .shared
                .drained
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            d.retain(|h| h != server);
            if drained {
                d.push(server.clone());
            }
        }
        for (key, shards) in pools.iter() {
            if &key.server == server {
                for pool in shards.iter() {
                    pool.set_drained(drained);
                }
            }
        }
    }

    /// The pool of `key` this thread checks out of: its home shard's.
    fn key_pool(&self, key: &PoolKey) -> Arc<KeyPool<C::Conn>> {
        let count = self.shared.shards;
        let home = home_shard(count).unwrap_or(0);
        // Only ever inserted into: [`PoolHandle`]s rely on it.
        let mut pools = self.lock_pools();
        if let Some(shards) = pools.get(key) {
            return shards.get(home).clone();
        }
        let closed = self.shared.closed.load(Ordering::SeqCst);
        let drained = self
            .shared
            .drained
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&key.server);
        let spare = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let make = |index| {
            let shard = Shard { index, count };
            let pool = Arc::new(KeyPool::new(
                key.clone(),
                self.shared.config.clone(),
                shard,
                spare.clone(),
            ));
            if closed {
                pool.close();
            }
            if drained {
                pool.set_drained(true);
            }
            pool
        };
        let shards = Shards {
            first: make(0),
            rest: (1..count).map(make).collect(),
            balance: Arc::default(),
        };
        let pool = shards.get(home).clone();
        pools.insert(key.clone(), shards);
        pool
    }

    fn lock_pools(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Shards<C::Conn>>> {
        // The map is only inserted into; a panic elsewhere cannot leave it inconsistent.
        self.shared
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn settings_convert_with_zero_meaning_never() {
        let settings = PoolSettings {
            pool_size: 7,
            min_idle: 2,
            checkout_timeout: Duration::from_millis(1500),
            idle_timeout: Duration::ZERO,
            max_lifetime: Duration::from_secs(90),
            ..PoolSettings::default()
        };
        assert_eq!(
            PoolConfig::from(&settings),
            PoolConfig {
                pool_size: 7,
                min_idle: 2,
                checkout_timeout: Duration::from_millis(1500),
                idle_timeout: None,
                max_lifetime: Some(Duration::from_secs(90)),
            }
        );
        // The defaults of both sides are the same limits.
        assert_eq!(
            PoolConfig::from(&PoolSettings::default()),
            PoolConfig::default()
        );
    }

    /// The configuration checks the pool's limits itself (it cannot import the pool); it
    /// must accept exactly what the pool accepts.
    #[test]
    fn config_and_pool_agree_on_valid_limits() {
        for pool_size in 0..4 {
            for min_idle in 0..5 {
                let text = format!(
                    "[proxy]\nmode = \"pooled\"\n[auth]\nallow_unauthenticated = true\n\
                     [pool]\npool_size = {pool_size}\nmin_idle = {min_idle}\n"
                );
                let config = Config::from_toml_str(&text, "t");
                let settings = PoolSettings {
                    pool_size,
                    min_idle,
                    ..PoolSettings::default()
                };
                let pool = PoolConfig::from(&settings).validate();
                assert_eq!(
                    config.is_ok(),
                    pool.is_ok(),
                    "pool_size {pool_size}, min_idle {min_idle}: config {config:?}, pool {pool:?}"
                );
                if let (Err(c), Err(p)) = (config, pool) {
                    // Same words, prefixed with the section.
                    assert_eq!(c.to_string(), format!("invalid configuration: pool: {p}"));
                }
            }
        }
    }
}
