//! One pool (one [`PoolKey`]): the idle stack, the slot semaphore, and [`Checkout`].
//!
//! Slots are semaphore permits, `pool_size` of them. A checkout holds one from the moment it
//! stops waiting until its [`Checkout`] ends; idle connections hold none. Tokio's semaphore
//! hands permits to waiters in FIFO order and forgets a waiter whose future is dropped, which
//! gives fairness and cancellation safety. Connections are counted in `State::total`, which is
//! only raised by a permit holder that found no idle connection (or by a prefill that checked
//! it), so `total` never exceeds `pool_size`.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

mod checkout;

pub use checkout::Checkout;
use checkout::Reservation;

use super::stats::{Gauges, WaitingGuard};
use super::{Connector, PoolConfig, PoolError, PoolKey, PoolStats, PooledConn};

/// The pool of one key.
pub(super) struct KeyPool<T> {
    key: PoolKey,
    config: PoolConfig,
    permits: Arc<Semaphore>,
    state: Mutex<State<T>>,
    gauges: Gauges,
    /// Its server is drained: no idle connection is kept, none is opened ahead.
    drained: std::sync::atomic::AtomicBool,
}

struct State<T> {
    /// Most recently used last (LIFO).
    idle: Vec<Idle<T>>,
    /// Connections idle, checked out or being opened.
    total: usize,
}

struct Idle<T> {
    /// Boxed: a connection (a TLS stream's state included) is large, and a checkout is
    /// moved through several futures per request; a box moves as one pointer.
    conn: Box<T>,
    created: Instant,
    idle_since: Instant,
}

/// Why a counted connection stopped being counted.
#[derive(Clone, Copy)]
enum Closed {
    Discarded,
    Expired,
    Unusable,
    /// A connect attempt that did not produce a connection (failed or cancelled).
    NeverOpened,
}

impl<T: PooledConn> KeyPool<T> {
    pub(super) fn new(key: PoolKey, config: PoolConfig) -> Self {
        KeyPool {
            key,
            permits: Arc::new(Semaphore::new(config.pool_size)),
            config,
            state: Mutex::new(State {
                idle: Vec::new(),
                total: 0,
            }),
            gauges: Gauges::default(),
            drained: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Drains (`true`) or enables the pool's server: drained, its idle connections close at
    /// once and a released connection closes instead of waiting idle (checkouts still work:
    /// pinned cursors and transactions finish there).
    pub(super) fn set_drained(&self, drained: bool) {
        self.drained.store(drained, Ordering::SeqCst);
        if !drained {
            return;
        }
        let mut state = self.lock();
        let idle = std::mem::take(&mut state.idle);
        state.total = state.total.saturating_sub(idle.len());
        self.publish(&state);
        drop(state);
        let count = u64::try_from(idle.len()).unwrap_or(u64::MAX);
        self.gauges.discards.fetch_add(count, Ordering::Relaxed);
        drop(idle);
    }

    pub(super) fn key(&self) -> &PoolKey {
        &self.key
    }

    pub(super) fn stats(&self) -> PoolStats {
        self.gauges.snapshot()
    }

    /// A checkout without waiting or connecting: a free slot and an idle usable connection
    /// at once (`Ok(None)` otherwise, holding nothing).
    // The same error type as the async checkouts return (only the closed case occurs).
    #[allow(clippy::result_large_err)]
    pub(super) fn checkout_ready(self: &Arc<Self>) -> Result<Option<Checkout<T>>, PoolError> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(self.closed_error()),
            Err(TryAcquireError::NoPermits) => return Ok(None),
        };
        Ok(self.take_idle(permit, false).ok())
    }

    pub(super) async fn checkout<C: Connector<Conn = T>>(
        self: &Arc<Self>,
        connector: &C,
    ) -> Result<Checkout<T>, PoolError> {
        let permit = match self.try_acquire()? {
            Some(permit) => permit,
            None => {
                let expired = tokio::time::sleep(self.config.checkout_timeout);
                self.wait_for_slot(expired).await?
            }
        };
        self.checkout_with(connector, permit).await
    }

    /// [`KeyPool::checkout`] whose wait for a slot ends when `expired` completes (which the
    /// caller makes `checkout_timeout` from now) instead of on a timer of its own.
    pub(super) async fn checkout_until<C: Connector<Conn = T>>(
        self: &Arc<Self>,
        connector: &C,
        expired: impl Future<Output = ()>,
    ) -> Result<Checkout<T>, PoolError> {
        let permit = match self.try_acquire()? {
            Some(permit) => permit,
            None => self.wait_for_slot(expired).await?,
        };
        self.checkout_with(connector, permit).await
    }

    async fn checkout_with<C: Connector<Conn = T>>(
        self: &Arc<Self>,
        connector: &C,
        permit: OwnedSemaphorePermit,
    ) -> Result<Checkout<T>, PoolError> {
        match self.take_idle(permit, true) {
            Ok(checkout) => Ok(checkout),
            // Rare (the pool grows): boxed, so that the connector's future does not enlarge
            // every checkout's.
            Err(permit) => Box::pin(self.connect_new(connector, permit)).await,
        }
    }

    /// With `permit`: the most recently used idle connection that is usable. `Err(permit)`
    /// when there is none; with `count`, the slot is then counted in `total` for a connect.
    fn take_idle(
        self: &Arc<Self>,
        permit: OwnedSemaphorePermit,
        count: bool,
    ) -> Result<Checkout<T>, OwnedSemaphorePermit> {
        loop {
            let popped = {
                let mut state = self.lock();
                let stale = self.take_expired(&mut state, Instant::now());
                let popped = state.idle.pop();
                if popped.is_none() && count {
                    state.total += 1;
                }
                self.publish(&state);
                drop(state);
                drop(stale);
                popped
            };
            let Some(mut entry) = popped else {
                return Err(permit);
            };
            if !entry.conn.is_usable() {
                self.uncount(Closed::Unusable);
                continue;
            }
            return Ok(Checkout::new(
                entry.conn,
                entry.created,
                self.clone(),
                permit,
            ));
        }
    }

    /// Opens a connection into a slot already counted in `total`.
    async fn connect_new<C: Connector<Conn = T>>(
        self: &Arc<Self>,
        connector: &C,
        permit: OwnedSemaphorePermit,
    ) -> Result<Checkout<T>, PoolError> {
        let conn = Box::new(self.connect_counted(connector).await?);
        Ok(Checkout::new(conn, Instant::now(), self.clone(), permit))
    }

    /// Connects for a slot counted in `total`; uncounts it if the connect fails or is
    /// cancelled.
    async fn connect_counted<C: Connector<Conn = T>>(&self, connector: &C) -> Result<T, PoolError> {
        let reservation = Reservation::new(self);
        match connector.connect(&self.key).await {
            Ok(conn) => {
                reservation.opened();
                Gauges::bump(&self.gauges.connects);
                Ok(conn)
            }
            Err(source) => {
                Gauges::bump(&self.gauges.connect_failures);
                drop(reservation);
                Err(PoolError::Connect {
                    pool: self.key.clone(),
                    source,
                })
            }
        }
    }

    /// A free slot, if there is one (`None`: wait for one).
    // The same error type as the async checkouts return (only the closed case occurs).
    #[allow(clippy::result_large_err)]
    fn try_acquire(&self) -> Result<Option<OwnedSemaphorePermit>, PoolError> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(TryAcquireError::Closed) => Err(self.closed_error()),
            Err(TryAcquireError::NoPermits) => Ok(None),
        }
    }

    /// Waits (FIFO) for a slot until `expired` completes (`checkout_timeout`).
    async fn wait_for_slot(
        &self,
        expired: impl Future<Output = ()>,
    ) -> Result<OwnedSemaphorePermit, PoolError> {
        let _waiting = WaitingGuard::new(&self.gauges.waiting);
        let start = Instant::now();
        let acquired = tokio::select! {
            biased;
            acquired = self.permits.clone().acquire_owned() => Some(acquired),
            () = expired => None,
        };
        let waited = start.elapsed();
        self.gauges.observe_wait(waited);
        match acquired {
            Some(Ok(permit)) => Ok(permit),
            Some(Err(_closed)) => Err(self.closed_error()),
            None => {
                Gauges::bump(&self.gauges.timeouts);
                Err(PoolError::CheckoutTimeout {
                    pool: self.key.clone(),
                    waited,
                    pool_size: self.config.pool_size,
                })
            }
        }
    }

    /// Closes idle connections that expired or are no longer usable.
    pub(super) fn close_stale(&self) {
        let mut state = self.lock();
        let mut stale = self.take_expired(&mut state, Instant::now());
        let before = state.idle.len();
        let mut kept = Vec::with_capacity(before);
        for mut entry in std::mem::take(&mut state.idle) {
            if entry.conn.is_usable() {
                kept.push(entry);
            } else {
                stale.push(entry);
            }
        }
        let unusable = before - kept.len();
        state.idle = kept;
        state.total = state.total.saturating_sub(unusable);
        self.publish(&state);
        drop(state);
        let counter = &self.gauges.unusable;
        counter.fetch_add(
            u64::try_from(unusable).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        drop(stale);
    }

    /// Opens connections until `min_idle` are idle, if slots are free.
    pub(super) async fn prefill<C: Connector<Conn = T>>(
        &self,
        connector: &C,
    ) -> Result<(), PoolError> {
        loop {
            if self.drained.load(Ordering::SeqCst) {
                return Ok(());
            }
            // Holding a permit keeps this connect within pool_size like a checkout's.
            let Ok(_permit) = self.permits.clone().try_acquire_owned() else {
                return Ok(());
            };
            {
                let mut state = self.lock();
                if state.idle.len() >= self.config.min_idle || state.total >= self.config.pool_size
                {
                    return Ok(());
                }
                state.total += 1;
                self.publish(&state);
            }
            let conn = Box::new(self.connect_counted(connector).await?);
            let now = Instant::now();
            let mut state = self.lock();
            state.idle.push(Idle {
                conn,
                created: now,
                idle_since: now,
            });
            self.publish(&state);
        }
    }

    /// Fails waiting and future checkouts and drops idle connections.
    pub(super) fn close(&self) {
        self.permits.close();
        let mut state = self.lock();
        let idle = std::mem::take(&mut state.idle);
        state.total = state.total.saturating_sub(idle.len());
        self.publish(&state);
        drop(state);
        drop(idle);
    }

    /// Removes idle entries past `idle_timeout` or `max_lifetime`; the caller drops them
    /// after releasing the lock.
    fn take_expired(&self, state: &mut State<T>, now: Instant) -> Vec<Idle<T>> {
        if !state.idle.iter().any(|e| self.expired(e, now)) {
            return Vec::new();
        }
        let (stale, kept) = std::mem::take(&mut state.idle)
            .into_iter()
            .partition(|e| self.expired(e, now));
        state.idle = kept;
        let stale: Vec<_> = stale;
        state.total = state.total.saturating_sub(stale.len());
        let count = u64::try_from(stale.len()).unwrap_or(u64::MAX);
        self.gauges.expired.fetch_add(count, Ordering::Relaxed);
        stale
    }

    fn expired(&self, entry: &Idle<T>, now: Instant) -> bool {
        let idle_for = now.saturating_duration_since(entry.idle_since);
        self.config.idle_timeout.is_some_and(|t| idle_for >= t)
            || self.past_lifetime(entry.created, now)
    }

    fn past_lifetime(&self, created: Instant, now: Instant) -> bool {
        let age = now.saturating_duration_since(created);
        self.config.max_lifetime.is_some_and(|t| age >= t)
    }

    /// One counted connection is gone.
    fn uncount(&self, why: Closed) {
        let mut state = self.lock();
        state.total = state.total.saturating_sub(1);
        self.publish(&state);
        drop(state);
        let counter = match why {
            Closed::Discarded => &self.gauges.discards,
            Closed::Expired => &self.gauges.expired,
            Closed::Unusable => &self.gauges.unusable,
            Closed::NeverOpened => return,
        };
        Gauges::bump(counter);
    }

    /// Ends a checkout whose connection was released in good health.
    fn check_in(&self, conn: Box<T>, created: Instant) {
        let now = Instant::now();
        if self.past_lifetime(created, now) {
            return self.uncount(Closed::Expired);
        }
        if self.permits.is_closed() || self.drained.load(Ordering::SeqCst) {
            return self.uncount(Closed::Discarded);
        }
        let mut state = self.lock();
        state.idle.push(Idle {
            conn,
            created,
            idle_since: now,
        });
        self.publish(&state);
    }

    fn publish(&self, state: &State<T>) {
        self.gauges.total.store(state.total, Ordering::Relaxed);
        self.gauges.idle.store(state.idle.len(), Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every critical section is a few field updates that cannot panic halfway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn closed_error(&self) -> PoolError {
        PoolError::Closed {
            pool: self.key.clone(),
        }
    }
}
