//! One pool (one [`PoolKey`]): the idle stack, the slots, the FIFO queue of waiters, and
//! [`Checkout`] — all under one lock.
//!
//! A pool has `pool_size` slots. A checkout holds one from the moment it stops waiting until
//! its [`Checkout`] ends; idle connections hold none. A checkout that finds every slot held
//! queues as a waiter, and a checkout that ends hands its slot to the oldest waiter directly:
//! with the connection itself when it is released in good health (no trip through the idle
//! stack), as a bare slot when the connection is closed. A freed slot therefore goes to a
//! waiter whenever there is one, so a free slot means an empty queue, and the queue is served
//! in arrival order. A waiter whose future is dropped leaves the queue, and gives back
//! whatever it was handed and did not take (the next waiter gets it), so no slot leaks and no
//! release is lost. Connections are counted in `State::total`, which is only raised by a
//! slot holder that found no idle connection (or by a prefill that holds a slot), so `total`
//! never exceeds `pool_size`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::time::Instant;

mod checkout;

pub use checkout::Checkout;
use checkout::Reservation;

use super::stats::Gauges;
use super::{Connector, PoolConfig, PoolError, PoolKey, PoolStats, PooledConn, SentAhead};

/// Which part of a sharded pool a [`KeyPool`] is (see [`super::Pool::sharded`]): shard
/// `index` of `count`, served by the thread whose home shard it is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shard {
    pub(super) index: usize,
    pub(super) count: usize,
}

impl Shard {
    /// This shard's share of `total` (`total / count`, the remainder to the first shards).
    pub(super) fn share(self, total: usize) -> usize {
        total / self.count + usize::from(self.index < total % self.count)
    }

    /// Whether a connection opened on this thread would be foreign to the shard: the pool
    /// is sharded and this is not the shard's thread (its socket would be driven by another
    /// thread's reactor for as long as it lives).
    fn foreign_here(self) -> bool {
        self.count > 1 && super::home_shard(self.count) != Some(self.index)
    }

    /// Whether the pool is sharded and this is the shard's thread.
    fn home_here(self) -> bool {
        self.count > 1 && super::home_shard(self.count) == Some(self.index)
    }
}

/// The pool of one key (or one shard of it).
pub(super) struct KeyPool<T> {
    key: PoolKey,
    /// The whole pool's limits (`pool_size` as configured: what errors report).
    config: PoolConfig,
    shard: Shard,
    /// This shard's share of `min_idle`.
    min_idle: usize,
    /// Slots the shards of this key gave up and no shard has taken yet (shared by them; see
    /// [`KeyPool::give_slot`]).
    spare: Arc<AtomicUsize>,
    state: Mutex<State<T>>,
    gauges: Gauges,
    /// Its server is drained: no idle connection is kept, none is opened ahead.
    drained: AtomicBool,
    /// Closed (set under the state's lock): checkouts fail, released connections close.
    closed: AtomicBool,
}

struct State<T> {
    /// Slots this pool may hold: `pool_size`, or a shard's share of it, which
    /// [`KeyPool::give_slot`] and [`KeyPool::take_slot`] move between shards. `held` is
    /// above it after a deferred give: the slots freed then go to `spare`, not to waiters.
    limit: usize,
    /// Most recently used last (LIFO).
    idle: Vec<Idle<T>>,
    /// Connections idle, checked out or being opened.
    total: usize,
    /// Slots held: by checkouts (in use or connecting), by checkouts between taking a slot and
    /// an idle connection, and by waiters handed one they have not taken yet.
    held: usize,
    /// Checkouts alive (the `in_use` gauge).
    in_use: usize,
    /// Waiters not served yet, oldest first: indices into `cells`, and when each queued.
    queue: VecDeque<(usize, Instant)>,
    /// One cell per waiter that has not finished (reused; `free` lists the unused ones).
    cells: Vec<Cell<T>>,
    free: Vec<usize>,
}

/// What a waiter's cell holds.
enum Cell<T> {
    Free,
    /// Queued; woken through `waker` when served. `request`: what the waiter will write
    /// first, for the checkout that serves it to write ahead (see
    /// [`super::Pool::checkout_sending`]).
    Waiting {
        waker: Waker,
        request: Option<bytes::Bytes>,
    },
    /// Served: the slot, and the connection handed over with it if any.
    Granted(Option<Handed<T>>),
    /// The pool closed while it waited.
    Closed,
}

/// A connection handed from a checkout that ended to the waiter taking its slot.
struct Handed<T> {
    conn: Box<T>,
    life: Life,
    /// What the releasing checkout wrote of the waiter's request (then a request is in
    /// flight on the connection: it is never probed, idled or handed to anyone else).
    ahead: Option<Ahead>,
}

/// The part of a waiter's request written ahead for it, and when.
#[derive(Debug, Clone, Copy)]
pub struct Ahead {
    /// Bytes written (from the start of the request).
    pub bytes: usize,
    /// When they were written.
    pub at: Instant,
}

struct Idle<T> {
    /// Boxed: a connection (a TLS stream's state included) is large, and a checkout is
    /// moved through several futures per request; a box moves as one pointer.
    conn: Box<T>,
    life: Life,
    /// When it expires if still idle: `idle_timeout` after it was released, or the end of
    /// its life if sooner (`None`: never). Computed once, when it goes idle, so that a
    /// checkout compares one instant instead of working out two durations.
    expires: Option<Instant>,
    /// When it went idle (see [`KeyPool::give_slot`]).
    since: Instant,
}

/// When a connection was opened and when `max_lifetime` ends it, computed once when it is
/// opened (a release compares an instant rather than working out the connection's age).
#[derive(Clone, Copy)]
pub(super) struct Life {
    pub(super) created: Instant,
    dies: Option<Instant>,
    /// Opened by a thread other than its shard's (see [`Shard::foreign_here`]): closed when
    /// released rather than kept, so that the shard's idle connections are all its own.
    foreign: bool,
}

impl Life {
    fn over(&self, now: Instant) -> bool {
        self.dies.is_some_and(|d| now >= d)
    }
}

/// Why a counted connection stopped being counted.
#[derive(Clone, Copy)]
enum Closed {
    Discarded,
    Expired,
    Unusable,
    /// A connect attempt that did not produce a connection (failed or cancelled).
    NeverOpened,
    /// Its slot went to another shard (a deferred give, [`KeyPool::give_slot`]).
    Moved,
}

/// What [`KeyPool::give_slot`] gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gave {
    /// A free slot, now in the spare slots.
    Now,
    /// The next slot this shard frees.
    Later,
    /// Nothing (one slot left, closed, or not `later` and every slot held or the free
    /// slot's connection used within [`super::REBALANCE_AFTER`]).
    Nothing,
}

/// A shard's load, as [`super::Pool::rebalance`] reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Load {
    /// How long its oldest waiter has waited (`None`: no one waits).
    pub(super) oldest_wait: Option<std::time::Duration>,
    pub(super) limit: usize,
    /// Deferred gives not yet paid: slots held above the limit.
    pub(super) owed: usize,
    /// A slot is free (then no one waits).
    pub(super) free: bool,
}

/// Wakers to wake once the pool's lock is released.
type Woken = Option<Waker>;

impl<T: PooledConn> KeyPool<T> {
    pub(super) fn new(
        key: PoolKey,
        config: PoolConfig,
        shard: Shard,
        spare: Arc<AtomicUsize>,
    ) -> Self {
        KeyPool {
            key,
            shard,
            spare,
            min_idle: shard.share(config.min_idle),
            state: Mutex::new(State {
                limit: shard.share(config.pool_size),
                idle: Vec::new(),
                total: 0,
                held: 0,
                in_use: 0,
                queue: VecDeque::new(),
                cells: Vec::new(),
                free: Vec::new(),
            }),
            config,
            gauges: Gauges::default(),
            drained: AtomicBool::new(false),
            closed: AtomicBool::new(false),
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

    /// This shard's load now, for [`super::Pool::rebalance`].
    pub(super) fn load(&self, now: Instant) -> Load {
        let state = self.lock();
        Load {
            oldest_wait: state
                .queue
                .front()
                .map(|&(_, since)| now.saturating_duration_since(since)),
            limit: state.limit,
            owed: state.held.saturating_sub(state.limit),
            free: state.held < state.limit,
        }
    }

    /// Gives one slot of this shard's limit up to the key's spare slots, for another shard,
    /// keeping at least one. A free slot goes at once ([`Gave::Now`]; the least recently used
    /// idle connection closes if the shard would otherwise hold more connections than its new
    /// limit). With every slot held and `later`, the limit drops and the next slot freed here
    /// goes to the spare slots instead of this shard's waiters ([`Gave::Later`]; its
    /// connection closes): the key never has more than `pool_size` connections open.
    ///
    /// Unless `later` (asked after an imbalance lasted [`super::REBALANCE_SUSTAIN`]), a free
    /// slot whose idle connection (the least recently used one) went idle less than
    /// [`super::REBALANCE_AFTER`] before `now` is not given: this shard's clients are using
    /// its connections in turns, the slot is free only between two of their requests, and
    /// giving it would close a connection this shard opens (and authenticates) again at its
    /// next busy moment, while the other shard opens one too. Under even load (a PHP-FPM
    /// burst over two threads) slots would move back and forth at every fluctuation.
    pub(super) fn give_slot(&self, later: bool, now: Instant) -> Gave {
        let mut state = self.lock();
        if self.is_closed() || state.limit <= 1 {
            return Gave::Nothing;
        }
        if state.held >= state.limit {
            if !later {
                return Gave::Nothing;
            }
            state.limit -= 1;
            return Gave::Later;
        }
        let mut closed = None;
        if state.total >= state.limit {
            // Connections not idle hold slots (`total <= idle + held`), so with a free slot
            // and `total` at the limit one is idle.
            let Some(lru) = state.idle.first() else {
                return Gave::Nothing;
            };
            if !later && now.saturating_duration_since(lru.since) < super::REBALANCE_AFTER {
                return Gave::Nothing;
            }
            closed = Some(state.idle.remove(0));
            state.total -= 1;
        }
        state.limit -= 1;
        self.spare.fetch_add(1, Ordering::SeqCst);
        self.publish(&state);
        drop(state);
        drop(closed);
        Gave::Now
    }

    /// Takes one of the key's spare slots, if there is one: the oldest waiter gets it, else
    /// it is free. False: none was spare.
    pub(super) fn take_slot(&self) -> bool {
        let taken = self
            .spare
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if taken.is_err() {
            return false;
        }
        let mut state = self.lock();
        state.limit += 1;
        // Held for the moment it is passed on, as a freed slot is.
        state.held += 1;
        let woken = self.free_slot(&mut state);
        self.publish(&state);
        drop(state);
        Gauges::bump(&self.gauges.moves);
        wake(woken);
        true
    }

    /// Whether a slot freed now goes to the spare slots (a deferred give is owed).
    fn owes(state: &State<T>) -> Option<Closed> {
        (state.held > state.limit).then_some(Closed::Moved)
    }

    /// A checkout without waiting or connecting: a free slot and an idle usable connection
    /// at once (`Ok(None)` otherwise, holding nothing).
    // The same error type as the async checkouts return (only the closed case occurs).
    #[allow(clippy::result_large_err)]
    pub(super) fn checkout_ready(self: &Arc<Self>) -> Result<Option<Checkout<T>>, PoolError> {
        {
            let mut state = self.lock();
            if self.is_closed() {
                return Err(self.closed_error());
            }
            if state.held >= state.limit || state.idle.is_empty() {
                return Ok(None);
            }
            state.held += 1;
        }
        Ok(self.take_idle(false).ok())
    }

    pub(super) async fn checkout<C: Connector<Conn = T>>(
        self: &Arc<Self>,
        connector: &C,
    ) -> Result<Checkout<T>, PoolError> {
        let expired = std::pin::pin!(tokio::time::sleep(self.config.checkout_timeout));
        self.checkout_until(connector, expired, None).await
    }

    /// [`KeyPool::checkout`] whose wait for a slot ends when `expired` completes (which the
    /// caller makes `checkout_timeout` from now) instead of on a timer of its own.
    /// `request`: see [`super::Pool::checkout_sending`].
    pub(super) fn checkout_until<'a, C, E>(
        self: &'a Arc<Self>,
        connector: &'a C,
        expired: E,
        request: Option<&'a bytes::Bytes>,
    ) -> CheckoutUntil<'a, C, E>
    where
        C: Connector<Conn = T>,
        E: Future<Output = ()> + Unpin,
    {
        CheckoutUntil {
            pool: self,
            connector,
            expired,
            stage: Stage::Waiting(Wait {
                pool: self,
                cell: None,
                start: None,
                request,
            }),
        }
    }

    /// The end of a wait for a slot: `acquired` is what `wait` completed with, `None` when
    /// its `checkout_timeout` came first. `Ok(None)`: a slot is held, without a connection
    /// (an idle one or a new one is still to be taken).
    fn end_wait(
        self: &Arc<Self>,
        wait: Wait<'_, T>,
        acquired: Option<Result<Option<Handed<T>>, ()>>,
    ) -> Result<Option<Checkout<T>>, PoolError> {
        let start = wait.start;
        // Leaves the queue (giving back whatever it was handed) before the error is built.
        drop(wait);
        let handed = match (start, acquired) {
            // Served at once, without waiting.
            (None, Some(Ok(handed))) => handed,
            (None, _) => return Err(self.closed_error()),
            (Some(start), acquired) => {
                let waited = match &acquired {
                    // Written ahead: its wait ended at the hand-over (its reply woke it later).
                    Some(Ok(Some(Handed { ahead: Some(a), .. }))) => {
                        a.at.saturating_duration_since(start)
                    }
                    _ => start.elapsed(),
                };
                self.gauges.observe_wait(waited);
                match acquired {
                    Some(Ok(handed)) => handed,
                    Some(Err(())) => return Err(self.closed_error()),
                    None => {
                        Gauges::bump(&self.gauges.timeouts);
                        return Err(PoolError::CheckoutTimeout {
                            pool: self.key.clone(),
                            waited,
                            pool_size: self.config.pool_size,
                        });
                    }
                }
            }
        };
        let Some(handed) = handed else {
            return Ok(None);
        };
        if let Some(ahead) = handed.ahead {
            // A request is in flight on it: not probed (the probe would read the reply).
            let checkout = Checkout::new(handed.conn, handed.life, self.clone());
            return Ok(Some(checkout.with_ahead(ahead)));
        }
        let mut conn = handed.conn;
        if conn.is_usable() {
            // Counted in use when it was taken from the queue.
            return Ok(Some(Checkout::new(conn, handed.life, self.clone())));
        }
        drop(conn);
        // Still holding the slot: an idle connection or a new one.
        self.unusable_in_hand();
        Ok(None)
    }

    /// With a slot held (handed to the result, or freed): the most recently used idle
    /// connection that is usable and not expired. `Err` when there is none; with `count`,
    /// the slot is then counted in `total` for a connect and stays held by the returned
    /// [`HeldSlot`].
    fn take_idle(self: &Arc<Self>, count: bool) -> Result<Checkout<T>, HeldSlot<'_, T>> {
        let slot = HeldSlot { pool: self };
        loop {
            let mut state = self.lock();
            let Some(entry) = state.idle.pop() else {
                if count {
                    state.total += 1;
                    self.publish(&state);
                    return Err(slot);
                }
                // Nothing to take: the slot is freed (`slot`'s drop) after the lock is.
                drop(state);
                return Err(slot);
            };
            if self.expired(&entry, Instant::now()) {
                state.total = state.total.saturating_sub(1);
                self.publish(&state);
                drop(state);
                Gauges::bump(&self.gauges.expired);
                drop(entry);
                continue;
            }
            // Counted in use before the lock is released: the checkout is made below.
            state.in_use += 1;
            self.publish(&state);
            drop(state);
            let mut entry = entry;
            if !entry.conn.is_usable() {
                drop(entry);
                self.unusable_in_hand();
                continue;
            }
            slot.keep();
            return Ok(Checkout::new(entry.conn, entry.life, self.clone()));
        }
    }

    /// Opens a connection into a slot already counted in `total`.
    async fn connect_new<C: Connector<Conn = T>>(
        self: &Arc<Self>,
        connector: &C,
        slot: HeldSlot<'_, T>,
    ) -> Result<Checkout<T>, PoolError> {
        let conn = Box::new(self.connect_counted(connector).await?);
        slot.keep();
        let mut state = self.lock();
        state.in_use += 1;
        self.publish(&state);
        drop(state);
        Ok(Checkout::new(conn, self.life(Instant::now()), self.clone()))
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
            // Holding a slot keeps this connect within pool_size like a checkout's.
            let slot = {
                let mut state = self.lock();
                if self.is_closed()
                    || state.held >= state.limit
                    || state.idle.len() >= self.min_idle
                    || state.total >= state.limit
                {
                    return Ok(());
                }
                state.held += 1;
                state.total += 1;
                self.publish(&state);
                HeldSlot { pool: self }
            };
            let conn = Box::new(self.connect_counted(connector).await?);
            slot.keep();
            let now = Instant::now();
            let mut state = self.lock();
            // Drained or closed while it connected (checked under the lock both set): the
            // connection closes rather than idle where no idle connection may stay.
            let life = self.life(now);
            if let Some(why) = self.rejects(life, now).or_else(|| Self::owes(&state)) {
                drop(state);
                drop(conn);
                self.close_slot(why, false);
                return Ok(());
            }
            let woken = self.put_back(&mut state, conn, life, now);
            self.publish(&state);
            drop(state);
            wake(woken);
        }
    }

    /// Fails waiting and future checkouts and drops idle connections.
    pub(super) fn close(&self) {
        let mut state = self.lock();
        self.closed.store(true, Ordering::Relaxed);
        let mut woken = Vec::with_capacity(state.queue.len());
        while let Some((i, _)) = state.queue.pop_front() {
            if let Some(cell) = state.cells.get_mut(i) {
                if let Cell::Waiting { waker, .. } = std::mem::replace(cell, Cell::Closed) {
                    woken.push(waker);
                }
            }
        }
        let idle = std::mem::take(&mut state.idle);
        state.total = state.total.saturating_sub(idle.len());
        self.publish(&state);
        drop(state);
        drop(idle);
        woken.into_iter().for_each(Waker::wake);
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
        entry.expires.is_some_and(|t| now >= t)
    }

    /// The life of a connection opened at `created`, on this thread.
    fn life(&self, created: Instant) -> Life {
        Life {
            created,
            foreign: self.shard.foreign_here(),
            // Too far to represent: never.
            dies: self
                .config
                .max_lifetime
                .and_then(|t| created.checked_add(t)),
        }
    }

    /// One counted connection is gone; its slot stays held by the caller.
    fn uncount_holding(&self, why: Closed) {
        let mut state = self.lock();
        state.total = state.total.saturating_sub(1);
        self.publish(&state);
        drop(state);
        self.count_closed(why);
    }

    /// The connection a slot holder took (counted in use) was unusable and is closed; the
    /// slot stays held.
    fn unusable_in_hand(&self) {
        let mut state = self.lock();
        state.in_use -= 1;
        state.total = state.total.saturating_sub(1);
        self.publish(&state);
        drop(state);
        self.count_closed(Closed::Unusable);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Whether a connection released now (or handed back) is closed instead of kept: the
    /// pool is closed or its server drained, the connection is past `max_lifetime`, or it is
    /// foreign to its shard ([`Life::foreign`]).
    fn rejects(&self, life: Life, now: Instant) -> Option<Closed> {
        if life.over(now) {
            Some(Closed::Expired)
        } else if life.foreign || self.is_closed() || self.drained.load(Ordering::Relaxed) {
            Some(Closed::Discarded)
        } else {
            None
        }
    }

    fn count_closed(&self, why: Closed) {
        let counter = match why {
            Closed::Discarded => &self.gauges.discards,
            Closed::Expired => &self.gauges.expired,
            Closed::Unusable => &self.gauges.unusable,
            Closed::NeverOpened | Closed::Moved => return,
        };
        Gauges::bump(counter);
    }

    /// Ends a checkout whose connection was released in good health: it goes to the oldest
    /// waiter with the slot (`Ok(true)`), or idles (`Ok(false)`). `Err` gives it back,
    /// untouched, when it must close instead (see [`KeyPool::rejects`]): the caller closes
    /// it, then ends the checkout with [`KeyPool::end_discarded`].
    fn end_released(&self, conn: Box<T>, life: Life) -> Result<bool, (Box<T>, Closed)> {
        let now = Instant::now();
        if let Some(why) = self.rejects(life, now) {
            return Err((conn, why));
        }
        let mut state = self.lock();
        if let Some(why) = self.rejects(life, now) {
            // Closed or drained since the check above (both are set before their lock is
            // taken, so either this sees them or they see the connection idle and close it).
            return Err((conn, why));
        }
        if let Some(why) = Self::owes(&state) {
            // Its slot is owed to another shard: the connection closes, so that the key's
            // shards never hold more than `pool_size` together.
            return Err((conn, why));
        }
        state.in_use -= 1;
        let woken = self.put_back(&mut state, conn, life, now);
        self.publish(&state);
        drop(state);
        let handed = woken.is_some();
        wake(woken);
        Ok(handed)
    }

    /// Ends a checkout whose connection was closed: uncounted, and the slot alone goes to the
    /// oldest waiter, or is freed.
    fn end_discarded(&self, why: Closed) {
        self.close_slot(why, true);
    }

    /// A connection was closed (`lent`: it was checked out): it is uncounted, and its slot
    /// alone goes to the oldest waiter, or is freed.
    fn close_slot(&self, why: Closed, lent: bool) {
        let mut state = self.lock();
        if lent {
            state.in_use -= 1;
        }
        state.total = state.total.saturating_sub(1);
        let woken = self.free_slot(&mut state);
        self.publish(&state);
        drop(state);
        self.count_closed(why);
        wake(woken);
    }

    /// A slot holder's connection, released in good health: to the oldest waiter with the
    /// slot, else idle (the slot freed).
    fn put_back(&self, state: &mut State<T>, conn: Box<T>, life: Life, now: Instant) -> Woken {
        let handed = Handed {
            conn,
            life,
            ahead: None,
        };
        match self.serve_next(state, Some(handed), now) {
            Ok(woken) => woken,
            Err(handed) => {
                state.held -= 1;
                if let Some(Handed { conn, life, .. }) = handed {
                    let idle_end = self.config.idle_timeout.and_then(|t| now.checked_add(t));
                    let expires = match (idle_end, life.dies) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    state.idle.push(Idle {
                        conn,
                        life,
                        expires,
                        since: now,
                    });
                }
                None
            }
        }
    }

    /// A slot holder gives its slot up, without a connection: to the oldest waiter, else
    /// free.
    fn free_slot(&self, state: &mut State<T>) -> Woken {
        if Self::owes(state).is_some() {
            // Owed to another shard (a deferred give): to the spare slots.
            state.held -= 1;
            self.spare.fetch_add(1, Ordering::SeqCst);
            return None;
        }
        match self.serve_next(state, None, Instant::now()) {
            Ok(woken) => woken,
            Err(_) => {
                state.held -= 1;
                None
            }
        }
    }

    /// Serves the oldest waiter (taken off the queue) with the slot and `handed`; `Err`
    /// gives `handed` back when no one waits. A connection handed to a waiter that left its
    /// request is written the request first, when this thread is the shard's (see
    /// [`super::Pool::checkout_sending`]); the waker to wake, unless the reply will.
    fn serve_next(
        &self,
        state: &mut State<T>,
        mut handed: Option<Handed<T>>,
        now: Instant,
    ) -> Result<Woken, Option<Handed<T>>> {
        while let Some((i, _)) = state.queue.pop_front() {
            let Some(cell) = state.cells.get_mut(i) else {
                continue;
            };
            // Only waiting cells are queued; anything else is skipped, never overwritten.
            let Cell::Waiting { waker, request } = cell else {
                continue;
            };
            let waker = std::mem::replace(waker, Waker::noop().clone());
            let mut wake = true;
            if let (Some(h), Some(request)) = (handed.as_mut(), request.take()) {
                if self.shard.home_here() {
                    let sent = match h.conn.send_ahead(&request, &waker) {
                        SentAhead::Nothing => None,
                        SentAhead::Part(n) => Some(n),
                        SentAhead::Whole { reply_wakes } => {
                            wake = !reply_wakes;
                            Some(request.len())
                        }
                    };
                    if sent.is_some() {
                        Gauges::bump(&self.gauges.sent_ahead);
                        // In use from now on: its request is in flight (not when the
                        // reply wakes the waiter, which then takes it uncounted).
                        state.in_use += 1;
                    }
                    h.ahead = sent.map(|bytes| Ahead { bytes, at: now });
                }
            }
            *cell = Cell::Granted(handed);
            return Ok(wake.then_some(waker));
        }
        Err(handed)
    }

    fn publish(&self, state: &State<T>) {
        let r = Ordering::Relaxed;
        self.gauges.total.store(state.total, r);
        self.gauges.idle.store(state.idle.len(), r);
        self.gauges.in_use.store(state.in_use, r);
        self.gauges.waiting.store(state.queue.len(), r);
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

fn wake(woken: Woken) {
    if let Some(w) = woken {
        w.wake();
    }
}

/// A slot held between taking it and making a [`Checkout`] (taking an idle connection or
/// connecting): freed — to the next waiter — if dropped before [`HeldSlot::keep`].
struct HeldSlot<'a, T: PooledConn> {
    pool: &'a KeyPool<T>,
}

impl<T: PooledConn> HeldSlot<'_, T> {
    /// The slot goes on with the checkout made from it.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl<T: PooledConn> Drop for HeldSlot<'_, T> {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        let woken = self.pool.free_slot(&mut state);
        self.pool.publish(&state);
        drop(state);
        wake(woken);
    }
}

/// The future of [`KeyPool::checkout_until`]: a slot at once if one is free, else waiting
/// (FIFO) until `expired` completes; then the connection handed over with the slot, else an
/// idle one, else a new one. One hand-written state machine: a waiting checkout is polled
/// twice per request (queued, then served), and the nested `async` functions and `select!`s
/// it replaces cost more at both polls: with server selection's fast path (same commit),
/// 386 instructions per pooled insert went (docs/performance.md, "Fifteenth pass"). Dropped while waiting, it leaves the queue (see [`Wait`]).
pub struct CheckoutUntil<'a, C: Connector, E> {
    pool: &'a Arc<KeyPool<C::Conn>>,
    connector: &'a C,
    expired: E,
    stage: Stage<'a, C::Conn>,
}

/// Where a [`CheckoutUntil`] is.
enum Stage<'a, T: PooledConn> {
    Waiting(Wait<'a, T>),
    /// A slot held, no idle connection: opening one (rare: boxed, so that the connector's
    /// future does not enlarge every checkout's).
    Connecting(Pin<Box<dyn Future<Output = Result<Checkout<T>, PoolError>> + Send + 'a>>),
    /// Completed.
    Done,
}

impl<C: Connector, E: Future<Output = ()> + Unpin> Future for CheckoutUntil<'_, C, E> {
    type Output = Result<Checkout<C::Conn>, PoolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let pool = this.pool;
        let acquired = match &mut this.stage {
            Stage::Connecting(connect) => {
                let done = connect.as_mut().poll(cx);
                if done.is_ready() {
                    this.stage = Stage::Done;
                }
                return done;
            }
            // The wait is polled first: a slot handed over as the timer fires is taken.
            Stage::Waiting(wait) => match Pin::new(wait).poll(cx) {
                Poll::Ready(acquired) => Some(acquired),
                Poll::Pending => match Pin::new(&mut this.expired).poll(cx) {
                    Poll::Ready(()) => None,
                    Poll::Pending => return Poll::Pending,
                },
            },
            Stage::Done => return Poll::Ready(Err(pool.closed_error())),
        };
        let Stage::Waiting(wait) = std::mem::replace(&mut this.stage, Stage::Done) else {
            return Poll::Ready(Err(pool.closed_error()));
        };
        match pool.end_wait(wait, acquired) {
            Ok(Some(checkout)) => Poll::Ready(Ok(checkout)),
            Err(e) => Poll::Ready(Err(e)),
            // With a slot held: an idle connection, else a new one.
            Ok(None) => match pool.take_idle(true) {
                Ok(checkout) => Poll::Ready(Ok(checkout)),
                Err(slot) => {
                    let mut connect = Box::pin(pool.connect_new(this.connector, slot));
                    let done = connect.as_mut().poll(cx);
                    if done.is_pending() {
                        this.stage = Stage::Connecting(connect);
                    }
                    done
                }
            },
        }
    }
}

/// A checkout's wait for a slot: takes a free one at its first poll, else queues; dropped
/// while queued, it leaves the queue, and dropped after being served without taking what it
/// was handed, it passes that on to the next waiter.
struct Wait<'a, T: PooledConn> {
    pool: &'a KeyPool<T>,
    /// Its cell while queued or served but not yet taken.
    cell: Option<usize>,
    /// When it started to wait (it queued).
    start: Option<Instant>,
    /// What it will write first (see [`Cell::Waiting`]).
    request: Option<&'a bytes::Bytes>,
}

impl<T: PooledConn> Future for Wait<'_, T> {
    /// `Err`: the pool is closed.
    type Output = Result<Option<Handed<T>>, ()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let pool = this.pool;
        let mut state = pool.lock();
        let state = &mut *state;
        let Some(i) = this.cell else {
            if pool.is_closed() {
                return Poll::Ready(Err(()));
            }
            if state.held < state.limit {
                state.held += 1;
                return Poll::Ready(Ok(None));
            }
            let i = match state.free.pop() {
                Some(i) => i,
                None => {
                    state.cells.push(Cell::Free);
                    state.cells.len() - 1
                }
            };
            if let Some(cell) = state.cells.get_mut(i) {
                // Written ahead only by a release on this thread, which is the shard's: a
                // waiter elsewhere could be dropped while its request is being written.
                let request = match this.request {
                    Some(r) if pool.shard.home_here() => Some(r.clone()),
                    _ => None,
                };
                *cell = Cell::Waiting {
                    waker: cx.waker().clone(),
                    request,
                };
            }
            let now = Instant::now();
            state.queue.push_back((i, now));
            pool.publish(state);
            this.cell = Some(i);
            this.start = Some(now);
            return Poll::Pending;
        };
        let Some(cell) = state.cells.get_mut(i) else {
            return Poll::Ready(Err(()));
        };
        match cell {
            Cell::Waiting { waker, .. } => {
                if !waker.will_wake(cx.waker()) {
                    *waker = cx.waker().clone();
                }
                Poll::Pending
            }
            Cell::Granted(_) | Cell::Closed | Cell::Free => {
                let taken = std::mem::replace(cell, Cell::Free);
                state.free.push(i);
                this.cell = None;
                match taken {
                    Cell::Granted(handed) => {
                        // (One written ahead was counted when it was handed over.)
                        if handed.as_ref().is_some_and(|h| h.ahead.is_none()) {
                            // Counted in use under the same lock that takes it.
                            state.in_use += 1;
                            pool.publish(state);
                        }
                        Poll::Ready(Ok(handed))
                    }
                    _ => Poll::Ready(Err(())),
                }
            }
        }
    }
}

impl<T: PooledConn> Drop for Wait<'_, T> {
    fn drop(&mut self) {
        let Some(i) = self.cell.take() else {
            return;
        };
        let pool = self.pool;
        let mut state = pool.lock();
        let taken = match state.cells.get_mut(i) {
            Some(cell) => std::mem::replace(cell, Cell::Free),
            None => Cell::Free,
        };
        state.free.push(i);
        let (woken, handed) = match taken {
            Cell::Waiting { .. } => {
                if let Some(at) = state.queue.iter().position(|&(q, _)| q == i) {
                    state.queue.remove(at);
                }
                (None, None)
            }
            // Served, and its request (some of it) written on the connection: the reply
            // would go to whoever used it next. Closed.
            // (Counted in use since it was handed over.)
            Cell::Granted(Some(handed)) if handed.ahead.is_some() => {
                (None, Some((handed.conn, Closed::Discarded, true)))
            }
            // Served but not taken: what it was handed goes on as a release would.
            Cell::Granted(Some(handed)) => {
                let now = Instant::now();
                match pool
                    .rejects(handed.life, now)
                    .or_else(|| KeyPool::owes(&state))
                {
                    None => (
                        pool.put_back(&mut state, handed.conn, handed.life, now),
                        None,
                    ),
                    Some(why) => (None, Some((handed.conn, why, false))),
                }
            }
            Cell::Granted(None) => (pool.free_slot(&mut state), None),
            Cell::Closed | Cell::Free => (None, None),
        };
        pool.publish(&state);
        drop(state);
        wake(woken);
        if let Some((conn, why, lent)) = handed {
            // Closed before its slot is passed on, as a discarded checkout's.
            drop(conn);
            pool.close_slot(why, lent);
        }
    }
}
