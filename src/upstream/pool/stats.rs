//! Per-pool gauges and counters (lock-free reads for the metrics endpoint).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// A snapshot of one pool's gauges and counters. PgBouncer names in brackets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections open or being opened: `idle + in_use + connecting`.
    pub total: usize,
    /// Idle connections in the pool (`sv_idle`).
    pub idle: usize,
    /// Connections checked out (`sv_active`, and `cl_active` since one client request holds
    /// one connection).
    pub in_use: usize,
    /// Connections being opened for a checkout or a prefill (`sv_login`).
    pub connecting: usize,
    /// Checkouts waiting for a free slot (`cl_waiting`).
    pub waiting: usize,
    /// Longest wait for a slot observed, including waits that timed out (`maxwait`).
    pub max_wait: Duration,
    /// Connections opened successfully.
    pub connects: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// Checked-out connections discarded instead of returned (explicitly, or dropped
    /// without release).
    pub discards: u64,
    /// Connections closed because of `idle_timeout` or `max_lifetime`.
    pub expired: u64,
    /// Idle connections closed because they were no longer usable (server closed them).
    pub unusable: u64,
    /// Checkouts that failed with `checkout_timeout`.
    pub timeouts: u64,
    /// Slots a shard took from another shard (sharded pools: pooled sessions on the session
    /// threads, see `Pool::rebalance`).
    pub moves: u64,
    /// Requests a released checkout wrote for the waiter it handed its connection to
    /// (wholly or in part; see `Pool::checkout_sending`).
    pub sent_ahead: u64,
}

impl PoolStats {
    /// Adds `other`'s gauges and counters to these (the longest wait is the longer one).
    pub fn absorb(&mut self, other: &PoolStats) {
        self.total += other.total;
        self.idle += other.idle;
        self.in_use += other.in_use;
        self.connecting += other.connecting;
        self.waiting += other.waiting;
        self.max_wait = self.max_wait.max(other.max_wait);
        self.connects += other.connects;
        self.connect_failures += other.connect_failures;
        self.discards += other.discards;
        self.expired += other.expired;
        self.unusable += other.unusable;
        self.timeouts += other.timeouts;
        self.moves += other.moves;
        self.sent_ahead += other.sent_ahead;
    }
}

/// The live values behind [`PoolStats`]. `total` and `idle` are written under the pool's
/// state lock (they mirror it); the rest are independent counters.
#[derive(Debug, Default)]
pub(super) struct Gauges {
    pub(super) total: AtomicUsize,
    pub(super) idle: AtomicUsize,
    pub(super) in_use: AtomicUsize,
    pub(super) connecting: AtomicUsize,
    pub(super) waiting: AtomicUsize,
    pub(super) max_wait_micros: AtomicU64,
    pub(super) connects: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) discards: AtomicU64,
    pub(super) expired: AtomicU64,
    pub(super) unusable: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) moves: AtomicU64,
    pub(super) sent_ahead: AtomicU64,
}

impl Gauges {
    pub(super) fn snapshot(&self) -> PoolStats {
        let r = Ordering::Relaxed;
        PoolStats {
            total: self.total.load(r),
            idle: self.idle.load(r),
            in_use: self.in_use.load(r),
            connecting: self.connecting.load(r),
            waiting: self.waiting.load(r),
            max_wait: Duration::from_micros(self.max_wait_micros.load(r)),
            connects: self.connects.load(r),
            connect_failures: self.connect_failures.load(r),
            discards: self.discards.load(r),
            expired: self.expired.load(r),
            unusable: self.unusable.load(r),
            timeouts: self.timeouts.load(r),
            moves: self.moves.load(r),
            sent_ahead: self.sent_ahead.load(r),
        }
    }

    pub(super) fn observe_wait(&self, waited: Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.max_wait_micros.fetch_max(micros, Ordering::Relaxed);
    }

    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
