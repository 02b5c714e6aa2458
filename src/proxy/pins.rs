//! Pins: what keeps a pooled request on a particular upstream server or connection.
//!
//! - a cursor's getMore / killCursors go to the server that opened it (several servers only);
//! - a transaction's statements go to the server of its first statement;
//! - an exhaust stream holds its connection until the stream ends;
//! - a legacy fire-and-forget write holds its connection for the getLastError that follows.
//!
//! The maps are bounded (a full map refuses a new pin: the request then follows the read
//! preference) and expire entries nobody used for longer than the server itself keeps them.
//! Everything here is synchronous and opens no socket; time is passed in, so the unit tests
//! drive it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;
use tracing::warn;

use super::{routing::TxnKey, Counter};
use crate::upstream::Host;

/// Pinned upstream state, by reason (gauges).
#[derive(Debug, Default)]
pub struct PinnedCounts {
    /// Connections held by an exhaust stream (exhaust cursors, streaming hello).
    pub exhaust: Counter,
    /// Connections held after a legacy fire-and-forget write, for its getLastError.
    pub legacy_write: Counter,
    /// Transactions pinned to a server.
    pub transaction: Counter,
    /// Cursors pinned to a server (several upstream servers only).
    pub cursor: Counter,
}

/// Cursor pins beyond this are refused (their getMores then follow the read preference);
/// mongod's own cursor timeout bounds their useful life.
pub(crate) const CURSOR_MAP_CAP: usize = 100_000;
/// A cursor pin nobody used for this long is dropped (mongod's default cursor timeout is
/// 10 minutes).
pub(crate) const CURSOR_TTL: Duration = Duration::from_secs(30 * 60);
/// Transaction pins beyond this are refused (their statements then follow the primary);
/// mongod's transactionLifetimeLimitSeconds bounds their useful life anyway.
pub(crate) const TXN_MAP_CAP: usize = 100_000;
/// Longer than mongod's transactionLifetimeLimitSeconds (60 s) default.
pub(crate) const TXN_TTL: Duration = Duration::from_secs(5 * 60);

/// The cursor and transaction maps, and the gauges of every pin.
#[derive(Debug)]
pub(crate) struct Pins {
    cursors: Mutex<HashMap<i64, (Host, Instant)>>,
    txns: Mutex<HashMap<Vec<u8>, (i64, Host, Instant)>>,
    cursor_cap: usize,
    txn_cap: usize,
    pub counts: PinnedCounts,
}

impl Default for Pins {
    fn default() -> Self {
        Pins::with_caps(CURSOR_MAP_CAP, TXN_MAP_CAP)
    }
}

impl Pins {
    /// Pin maps holding at most `cursor_cap` cursors and `txn_cap` transactions.
    pub(crate) fn with_caps(cursor_cap: usize, txn_cap: usize) -> Pins {
        Pins {
            cursors: Mutex::new(HashMap::new()),
            txns: Mutex::new(HashMap::new()),
            cursor_cap,
            txn_cap,
            counts: PinnedCounts::default(),
        }
    }

    /// The server of cursor `id`, if pinned (and marks it used).
    pub(crate) fn cursor_server(&self, id: i64, now: Instant) -> Option<Host> {
        let mut map = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        map.get_mut(&id).map(|(h, seen)| {
            *seen = now;
            h.clone()
        })
    }

    /// Pins cursor `id` to `host` (refused when the map is full).
    pub(crate) fn pin_cursor(&self, id: i64, host: &Host, now: Instant) -> bool {
        let mut map = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.cursor_cap && !map.contains_key(&id) {
            warn!(
                cap = self.cursor_cap,
                "cursor map full; this cursor is not pinned"
            );
            return false;
        }
        map.insert(id, (host.clone(), now));
        self.counts.cursor.set(map.len() as u64);
        true
    }

    /// Forgets cursor `id`.
    pub(crate) fn unpin_cursor(&self, id: i64) {
        let mut map = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(&id);
        self.counts.cursor.set(map.len() as u64);
    }

    /// The server of transaction `key` (same session, same txnNumber), if pinned.
    pub(crate) fn txn_server(&self, key: &TxnKey, now: Instant) -> Option<Host> {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(&key.lsid) {
            Some((n, h, seen)) if *n == key.txn_number => {
                *seen = now;
                Some(h.clone())
            }
            _ => None,
        }
    }

    /// Pins transaction `key` to `host`; a new txnNumber of the same session replaces the
    /// old pin. Refused when the map is full.
    pub(crate) fn pin_txn(&self, key: &TxnKey, host: &Host, now: Instant) -> bool {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.txn_cap && !map.contains_key(&key.lsid) {
            warn!(
                cap = self.txn_cap,
                "transaction map full; this transaction is not pinned"
            );
            return false;
        }
        map.insert(key.lsid.clone(), (key.txn_number, host.clone(), now));
        self.counts.transaction.set(map.len() as u64);
        true
    }

    /// Forgets transaction `key` (not a newer transaction of the same session).
    pub(crate) fn unpin_txn(&self, key: &TxnKey) {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        if map
            .get(&key.lsid)
            .is_some_and(|(n, _, _)| *n == key.txn_number)
        {
            map.remove(&key.lsid);
        }
        self.counts.transaction.set(map.len() as u64);
    }

    /// Drops the pins nobody used within their time to live.
    pub(crate) fn expire(&self, now: Instant) {
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors.retain(|_, (_, seen)| now.saturating_duration_since(*seen) < CURSOR_TTL);
        self.counts.cursor.set(cursors.len() as u64);
        drop(cursors);
        let mut txns = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        txns.retain(|_, (_, _, seen)| now.saturating_duration_since(*seen) < TXN_TTL);
        self.counts.transaction.set(txns.len() as u64);
    }

    /// Counts an exhaust stream for as long as the returned guard lives.
    pub(crate) fn exhaust(self: &Arc<Self>) -> ExhaustHeld {
        self.counts.exhaust.inc();
        ExhaustHeld(self.clone())
    }
}

/// One exhaust stream counted; uncounted when dropped (so no error path can leak it).
#[derive(Debug)]
pub(crate) struct ExhaustHeld(Arc<Pins>);

impl Drop for ExhaustHeld {
    fn drop(&mut self) {
        self.0.counts.exhaust.dec();
    }
}

/// The connection of a legacy fire-and-forget write, kept (and counted) until the next
/// request: only that write's getLastError may run on it.
#[derive(Debug)]
pub(crate) struct Sticky<C> {
    conn: Option<C>,
}

impl<C> Default for Sticky<C> {
    fn default() -> Self {
        Sticky { conn: None }
    }
}

impl<C> Sticky<C> {
    /// Keeps `conn` (releasing any connection kept before through the returned value).
    pub(crate) fn hold(&mut self, conn: C, counts: &PinnedCounts) -> Option<C> {
        let old = self.take(counts);
        counts.legacy_write.inc();
        self.conn = Some(conn);
        old
    }

    /// True while a connection is kept.
    pub(crate) fn is_held(&self) -> bool {
        self.conn.is_some()
    }

    /// Takes the kept connection and stops counting it.
    pub(crate) fn take(&mut self, counts: &PinnedCounts) -> Option<C> {
        let conn = self.conn.take()?;
        counts.legacy_write.dec();
        Some(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(port: u16) -> Host {
        Host {
            name: format!("h{port}").into(),
            port,
        }
    }

    fn txn(lsid: u8, n: i64) -> TxnKey {
        TxnKey {
            lsid: vec![lsid; 16],
            txn_number: n,
        }
    }

    #[test]
    fn cursors_pin_unpin_and_cap() {
        let pins = Pins::with_caps(2, 2);
        let now = Instant::now();
        assert!(pins.pin_cursor(1, &host(1), now));
        assert!(pins.pin_cursor(2, &host(2), now));
        // Full: a third cursor is refused, an existing one may be re-pinned.
        assert!(!pins.pin_cursor(3, &host(3), now));
        assert!(pins.pin_cursor(2, &host(3), now));
        assert_eq!(pins.cursor_server(2, now), Some(host(3)));
        assert_eq!(pins.cursor_server(3, now), None);
        assert_eq!(pins.counts.cursor.get(), 2);
        pins.unpin_cursor(1);
        assert_eq!(pins.cursor_server(1, now), None);
        assert_eq!(pins.counts.cursor.get(), 1);
        assert!(pins.pin_cursor(3, &host(3), now));
    }

    #[test]
    fn transactions_match_on_txn_number_and_cap() {
        let pins = Pins::with_caps(2, 2);
        let now = Instant::now();
        assert!(pins.pin_txn(&txn(1, 5), &host(1), now));
        assert_eq!(pins.txn_server(&txn(1, 5), now), Some(host(1)));
        // Another transaction of the same session is not pinned by the first one's pin.
        assert_eq!(pins.txn_server(&txn(1, 6), now), None);
        // Unpinning an older txnNumber leaves the newer pin alone.
        assert!(pins.pin_txn(&txn(1, 6), &host(2), now));
        pins.unpin_txn(&txn(1, 5));
        assert_eq!(pins.txn_server(&txn(1, 6), now), Some(host(2)));
        assert!(pins.pin_txn(&txn(2, 1), &host(1), now));
        assert!(!pins.pin_txn(&txn(3, 1), &host(1), now), "the cap holds");
        assert_eq!(pins.counts.transaction.get(), 2);
        pins.unpin_txn(&txn(1, 6));
        assert_eq!(pins.counts.transaction.get(), 1);
        assert!(pins.pin_txn(&txn(3, 1), &host(1), now));
    }

    #[test]
    fn unused_pins_expire_used_ones_stay() {
        let pins = Pins::default();
        let t0 = Instant::now();
        pins.pin_txn(&txn(1, 1), &host(1), t0);
        pins.pin_txn(&txn(2, 1), &host(1), t0);
        // Used just before its deadline: kept; the other expires.
        let late = t0 + TXN_TTL - Duration::from_secs(1);
        assert!(pins.txn_server(&txn(2, 1), late).is_some());
        pins.expire(t0 + TXN_TTL);
        assert_eq!(pins.txn_server(&txn(1, 1), t0 + TXN_TTL), None);
        assert!(pins.txn_server(&txn(2, 1), t0 + TXN_TTL).is_some());
        assert_eq!(pins.counts.transaction.get(), 1);

        pins.pin_cursor(1, &host(1), t0);
        pins.pin_cursor(2, &host(1), t0);
        let late = t0 + CURSOR_TTL - Duration::from_secs(1);
        assert!(pins.cursor_server(2, late).is_some());
        pins.expire(t0 + CURSOR_TTL);
        assert_eq!(pins.cursor_server(1, t0 + CURSOR_TTL), None);
        assert!(pins.cursor_server(2, t0 + CURSOR_TTL).is_some());
        assert_eq!(pins.counts.cursor.get(), 1);
    }

    #[test]
    fn exhaust_and_sticky_counts_never_leak() {
        let pins = Arc::new(Pins::default());
        {
            let _a = pins.exhaust();
            let _b = pins.exhaust();
            assert_eq!(pins.counts.exhaust.get(), 2);
        }
        assert_eq!(pins.counts.exhaust.get(), 0);
        let mut sticky = Sticky::default();
        assert_eq!(sticky.hold("a", &pins.counts), None);
        assert_eq!(pins.counts.legacy_write.get(), 1);
        // A second write replaces the first: the old connection comes back, one count.
        assert_eq!(sticky.hold("b", &pins.counts), Some("a"));
        assert_eq!(pins.counts.legacy_write.get(), 1);
        assert_eq!(sticky.take(&pins.counts), Some("b"));
        assert_eq!(sticky.take(&pins.counts), None);
        assert_eq!(pins.counts.legacy_write.get(), 0);
    }
}
