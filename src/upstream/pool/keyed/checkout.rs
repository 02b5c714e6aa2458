//! [`Checkout`] and the guards that keep a pool's counts right however a checkout ends.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Ahead, Closed, KeyPool, Life};
use crate::upstream::pool::{PoolKey, PooledConn};

/// A slot counted in `total` for a connect in progress: uncounted on drop unless opened.
pub(super) struct Reservation<'a, T: PooledConn> {
    pool: &'a KeyPool<T>,
    opened: bool,
}

impl<'a, T: PooledConn> Reservation<'a, T> {
    pub(super) fn new(pool: &'a KeyPool<T>) -> Self {
        pool.gauges.connecting.fetch_add(1, Ordering::Relaxed);
        Reservation {
            pool,
            opened: false,
        }
    }

    pub(super) fn opened(mut self) {
        self.opened = true;
    }
}

impl<T: PooledConn> Drop for Reservation<'_, T> {
    fn drop(&mut self) {
        self.pool.gauges.connecting.fetch_sub(1, Ordering::Relaxed);
        if !self.opened {
            self.pool.uncount_holding(Closed::NeverOpened);
        }
    }
}

/// The slot of a checkout: on drop, unless its connection was released, it uncounts the
/// connection (a discard) and passes the slot to the next waiter, or frees it.
struct Slot<T: PooledConn> {
    pool: Arc<KeyPool<T>>,
    released: bool,
}

impl<T: PooledConn> Drop for Slot<T> {
    fn drop(&mut self) {
        if !self.released {
            self.pool.end_discarded(Closed::Discarded);
        }
    }
}

/// A connection checked out of the pool for one round trip (or a pinned sequence). Derefs
/// to the connection.
///
/// End it with [`Checkout::release`] when the exchange completed cleanly and nothing is left
/// to read; anything else — [`Checkout::discard`], or dropping it because of an error, a
/// cancelled future, a client that went away or a panic — closes the connection instead.
pub struct Checkout<T: PooledConn> {
    // Declared before `slot`: the connection is closed before the slot is freed. Boxed (see
    // `Idle::conn`): a checkout moves as a few words.
    conn: Box<T>,
    life: Life,
    slot: Slot<T>,
    /// What the checkout that handed it over wrote of this checkout's request.
    ahead: Option<Ahead>,
}

impl<T: PooledConn> Checkout<T> {
    /// A checkout of `conn` in a slot its caller holds, already counted in the pool's
    /// `in_use` (under the lock that gave it the connection) until the checkout ends.
    pub(super) fn new(conn: Box<T>, life: Life, pool: Arc<KeyPool<T>>) -> Self {
        Checkout {
            conn,
            life,
            slot: Slot {
                pool,
                released: false,
            },
            ahead: None,
        }
    }

    pub(super) fn with_ahead(mut self, ahead: Ahead) -> Self {
        self.ahead = Some(ahead);
        self
    }

    /// How much of the request passed to [`crate::upstream::pool::Pool::checkout_sending`]
    /// was written on the connection before it was handed over, and when (once: `None`
    /// afterwards). The caller writes the rest.
    pub fn sent_ahead(&mut self) -> Option<Ahead> {
        self.ahead.take()
    }

    /// Returns the connection to the pool, unless it is past `max_lifetime` (then it is
    /// closed). Only call this after a complete exchange. True when a waiting checkout got
    /// it (and was woken); false when it idles or closed.
    pub fn release(self) -> bool {
        let Checkout {
            conn,
            life,
            mut slot,
            ..
        } = self;
        slot.released = true;
        match slot.pool.end_released(conn, life) {
            Ok(handed) => handed,
            Err((conn, why)) => {
                // Closed before its slot is passed on.
                drop(conn);
                slot.pool.end_discarded(why);
                false
            }
        }
    }

    /// Closes the connection (it errored or its state is unknown) and frees its slot.
    pub fn discard(self) {
        drop(self);
    }

    /// The pool this connection belongs to.
    pub fn key(&self) -> &PoolKey {
        &self.slot.pool.key
    }

    /// How long ago the connection was opened.
    pub fn age(&self) -> std::time::Duration {
        self.life.created.elapsed()
    }
}

impl<T: PooledConn> Deref for Checkout<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.conn
    }
}

impl<T: PooledConn> DerefMut for Checkout<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.conn
    }
}

impl<T: PooledConn> fmt::Debug for Checkout<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkout")
            .field("pool", &self.slot.pool.key)
            .field("age", &self.age())
            .finish_non_exhaustive()
    }
}
