//! Load-balanced upstreams (`loadBalanced=true`): a cursor and a transaction live on the one
//! upstream connection that opened them, since another connection through the load balancer
//! may reach another mongos, which knows neither. Drivers talking to a load balancer pin
//! their own connections (the load balancer specification); mongoguard's clients see one
//! mongos and send a getMore on any of their connections, so the pin is mongoguard's: the
//! connection is parked here, keyed by its open cursors and its transaction's session, and
//! whichever client session continues one of them takes it, then parks it again or gives it
//! back to the pool once nothing lives on it.
//!
//! A cursor (or transaction) is recorded on its connection's slot while its reply is read,
//! before that reply reaches the client ([`Parked::reserve`]): the client may send the next
//! getMore on another of its connections as soon as it has the batch, before the round trip
//! that answered it is settled. Such a getMore finds the slot busy and waits for the
//! connection ([`Parked::changed`]); it never runs on another one.
//!
//! A parked connection stays checked out of its pool (it counts against `pool_size`, as a
//! driver's pinned connection counts against its maxPoolSize). One unused for
//! [`PARKED_TTL`] — longer than mongos keeps an idle cursor (10 minutes) — is closed, which
//! ends whatever was left on it.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use tokio::{
    sync::{futures::Notified, Notify},
    time::Instant,
};

/// A parked connection unused this long is closed (mongos's cursorTimeoutMillis is 10 min).
pub(crate) const PARKED_TTL: Duration = Duration::from_secs(11 * 60);

/// What a round trip did to the transaction of its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TxnChange {
    /// Not a transaction statement.
    None,
    /// A statement of the transaction of this session (`lsid.id` bytes).
    Continues(Vec<u8>),
    /// commitTransaction / abortTransaction.
    Ended,
}

/// The outcome of a round trip on a connection, for [`Parked::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settle {
    /// A cursor the reply opened.
    pub opened: Option<i64>,
    /// A cursor the reply finished or the request killed.
    pub closed: Option<i64>,
    pub txn: TxnChange,
}

struct Slot<C> {
    /// `None` while a request runs on it.
    conn: Option<C>,
    cursors: Vec<i64>,
    txn: Option<Vec<u8>>,
    used: Instant,
}

struct Inner<C> {
    next: u64,
    slots: HashMap<u64, Slot<C>>,
    by_cursor: HashMap<i64, u64>,
    by_txn: HashMap<Vec<u8>, u64>,
}

/// What [`Parked::take`] found for a cursor or transaction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take<C> {
    /// Its connection (out of the slot until [`Parked::settle`]).
    Got(u64, C),
    /// It lives on a connection a request is using now: wait for [`Parked::changed`], then
    /// take again.
    Busy,
    /// Neither the cursor nor the transaction is on any connection here.
    Unknown,
}

/// The key a transaction is parked under: its session's `lsid.id` and the upstream identity
/// it runs as. mongod keys a session by its id and the digest of its user
/// (`makeLogicalSessionId`, src/mongo/db/session/logical_session_id_helpers.cpp): the same id
/// sent by another user is another session, and must not reach (or replace) this record.
pub(crate) fn txn_key(identity: &str, lsid: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + lsid.len() + identity.len());
    // Length-prefixed: no (identity, lsid) pair reads as another.
    key.extend_from_slice(&u32::try_from(lsid.len()).unwrap_or(u32::MAX).to_le_bytes());
    key.extend_from_slice(lsid);
    key.extend_from_slice(identity.as_bytes());
    key
}

/// The slot `slot`, or a new one (numbered from `next`) when `None`; created empty if absent.
fn open_slot<'s, C>(
    next: &mut u64,
    slots: &'s mut HashMap<u64, Slot<C>>,
    slot: Option<u64>,
    now: Instant,
) -> (u64, &'s mut Slot<C>) {
    let id = slot.unwrap_or_else(|| {
        let id = *next;
        *next += 1;
        id
    });
    let entry = slots.entry(id).or_insert_with(|| Slot {
        conn: None,
        cursors: Vec::new(),
        txn: None,
        used: now,
    });
    (id, entry)
}

/// The parked connections of a load-balanced upstream.
pub(crate) struct Parked<C> {
    inner: Mutex<Inner<C>>,
    /// Woken whenever a slot's connection comes back or a slot goes away.
    changed: Notify,
}

impl<C> Default for Parked<C> {
    fn default() -> Self {
        Parked {
            inner: Mutex::new(Inner {
                next: 1,
                slots: HashMap::new(),
                by_cursor: HashMap::new(),
                by_txn: HashMap::new(),
            }),
            changed: Notify::new(),
        }
    }
}

impl<C> Parked<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<C>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the connection cursor `cursor` (else the transaction of session `lsid`) lives
    /// on. [`Take::Busy`] while a request runs on it — the previous getMore of the same
    /// cursor, whose reply may already be with the client, or another request of the same
    /// transaction: the caller waits ([`Parked::changed`], enabled before this call) rather
    /// than run it on another connection, which may reach another mongos.
    ///
    /// Only a connection `mine` accepts is taken (the asking client's upstream identity: a
    /// parked connection is authenticated as the identity that opened its cursor or
    /// transaction, and another identity's request on it would run as that user). Any other
    /// is [`Take::Unknown`] to the caller, as a cursor open on no connection it may use.
    pub(crate) fn take(
        &self,
        cursor: Option<i64>,
        lsid: Option<&[u8]>,
        mine: impl Fn(&C) -> bool,
    ) -> Take<C> {
        let mut g = self.lock();
        let slot = cursor
            .and_then(|id| g.by_cursor.get(&id).copied())
            .or_else(|| lsid.and_then(|l| g.by_txn.get(l).copied()));
        let Some(slot) = slot else {
            return Take::Unknown;
        };
        match g.slots.get_mut(&slot) {
            Some(s) => match &s.conn {
                Some(conn) if !mine(conn) => Take::Unknown,
                Some(_) => match s.conn.take() {
                    Some(conn) => Take::Got(slot, conn),
                    None => Take::Busy,
                },
                None => Take::Busy,
            },
            None => Take::Unknown,
        }
    }

    /// Resolves at the next change a [`Take::Busy`] waits for (a connection settled back
    /// into its slot, a slot gone). Enable it before [`Parked::take`] so that no change
    /// between the two is missed.
    pub(crate) fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// While the reply of a request on a connection (from `slot`, or fresh when `None`) is
    /// read, before it is relayed: records the cursor it `opened` and the transaction of
    /// session `txn` it continues on the connection's slot (a new one, busy, for a fresh
    /// connection). Returns the slot, for [`Parked::settle`].
    pub(crate) fn reserve(
        &self,
        slot: Option<u64>,
        opened: Option<i64>,
        txn: Option<&[u8]>,
        now: Instant,
    ) -> Option<u64> {
        if opened.is_none() && txn.is_none() {
            return slot;
        }
        let mut g = self.lock();
        let g = &mut *g;
        let (id, entry) = open_slot(&mut g.next, &mut g.slots, slot, now);
        if let Some(c) = opened {
            if !entry.cursors.contains(&c) {
                entry.cursors.push(c);
            }
            g.by_cursor.insert(c, id);
        }
        if let Some(lsid) = txn {
            if entry.txn.as_deref() != Some(lsid) {
                if let Some(old) = entry.txn.replace(lsid.to_vec()) {
                    g.by_txn.remove(&old);
                }
                g.by_txn.insert(lsid.to_vec(), id);
            }
        }
        Some(id)
    }

    /// After a complete round trip on `conn` (taken from `slot`, or fresh when `None`):
    /// records what it opened and ended, and parks the connection while a cursor or the
    /// transaction lives on it. Returns it when nothing does (back to the pool).
    pub(crate) fn settle(&self, slot: Option<u64>, conn: C, s: Settle, now: Instant) -> Option<C> {
        let starts = s.opened.is_some() || matches!(s.txn, TxnChange::Continues(_));
        if slot.is_none() && !starts {
            return Some(conn);
        }
        let mut g = self.lock();
        let g = &mut *g;
        let (id, entry) = open_slot(&mut g.next, &mut g.slots, slot, now);
        if let Some(c) = s.opened {
            if !entry.cursors.contains(&c) {
                entry.cursors.push(c);
            }
            g.by_cursor.insert(c, id);
        }
        if let Some(c) = s.closed {
            if let Some(pos) = entry.cursors.iter().position(|x| *x == c) {
                entry.cursors.swap_remove(pos);
                g.by_cursor.remove(&c);
            }
        }
        match s.txn {
            TxnChange::None => {}
            TxnChange::Continues(lsid) => {
                if entry.txn.as_ref() != Some(&lsid) {
                    if let Some(old) = entry.txn.replace(lsid.clone()) {
                        g.by_txn.remove(&old);
                    }
                    g.by_txn.insert(lsid, id);
                }
            }
            TxnChange::Ended => {
                if let Some(old) = entry.txn.take() {
                    g.by_txn.remove(&old);
                }
            }
        }
        let back = if entry.cursors.is_empty() && entry.txn.is_none() {
            g.slots.remove(&id);
            Some(conn)
        } else {
            entry.conn = Some(conn);
            entry.used = now;
            None
        };
        self.changed.notify_waiters();
        back
    }

    /// Forgets `slot` and everything on it (its connection broke: mongos ended them).
    pub(crate) fn forget(&self, slot: u64) {
        let mut g = self.lock();
        let g = &mut *g;
        if let Some(entry) = g.slots.remove(&slot) {
            for c in entry.cursors {
                g.by_cursor.remove(&c);
            }
            if let Some(l) = entry.txn {
                g.by_txn.remove(&l);
            }
        }
        self.changed.notify_waiters();
    }

    /// Removes the parked connections unused for `ttl`; the caller closes them.
    pub(crate) fn expire(&self, now: Instant, ttl: Duration) -> Vec<C> {
        let mut g = self.lock();
        let stale: Vec<u64> = g
            .slots
            .iter()
            .filter(|(_, s)| s.conn.is_some() && now.saturating_duration_since(s.used) >= ttl)
            .map(|(id, _)| *id)
            .collect();
        let mut out = Vec::new();
        for id in stale {
            if let Some(conn) = g.slots.get_mut(&id).and_then(|s| s.conn.take()) {
                out.push(conn);
            }
            drop(g);
            self.forget(id);
            g = self.lock();
        }
        out
    }

    /// Parked connections and the cursors and transactions on them (`GET /pool`).
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let g = self.lock();
        (g.slots.len(), g.by_cursor.len(), g.by_txn.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn got<C>(t: Take<C>) -> (u64, C) {
        match t {
            Take::Got(slot, conn) => (slot, conn),
            _ => panic!("not parked"),
        }
    }

    fn any(_: &&str) -> bool {
        true
    }

    fn settle(opened: Option<i64>, closed: Option<i64>, txn: TxnChange) -> Settle {
        Settle {
            opened,
            closed,
            txn,
        }
    }

    /// A parked connection is taken only by a request of its own identity; to any other it
    /// is unknown, and it stays parked for its owner.
    #[test]
    fn only_its_identity_takes_a_parked_connection() {
        let p: Parked<&str> = Parked::default();
        let now = Instant::now();
        assert_eq!(
            p.settle(None, "alice", settle(Some(7), None, TxnChange::None), now),
            None
        );
        assert_eq!(p.take(Some(7), None, |c| *c == "bob"), Take::Unknown);
        let (_, conn) = got(p.take(Some(7), None, |c| *c == "alice"));
        assert_eq!(conn, "alice");
    }

    #[test]
    fn cursors_and_transactions_keep_their_connection() {
        let p: Parked<&str> = Parked::default();
        let now = Instant::now();
        // Nothing opened: straight back to the pool.
        assert_eq!(
            p.settle(None, "a", settle(None, None, TxnChange::None), now),
            Some("a")
        );
        // A find opens cursor 7 on connection "b": parked.
        assert_eq!(
            p.settle(None, "b", settle(Some(7), None, TxnChange::None), now),
            None
        );
        assert_eq!(p.counts(), (1, 1, 0));
        // Another cursor's getMore finds nothing; cursor 7's finds "b".
        assert_eq!(p.take(Some(8), None, any), Take::Unknown);
        let (slot, conn) = got(p.take(Some(7), None, any));
        assert_eq!(conn, "b");
        // While it runs, a concurrent getMore of 7 finds it busy (and waits).
        assert_eq!(p.take(Some(7), None, any), Take::Busy);
        // A middle batch: parked again.
        assert_eq!(
            p.settle(Some(slot), conn, settle(None, None, TxnChange::None), now),
            None
        );
        // The last batch closes the cursor: back to the pool, nothing left.
        let (slot, conn) = got(p.take(Some(7), None, any));
        assert_eq!(
            p.settle(
                Some(slot),
                conn,
                settle(None, Some(7), TxnChange::None),
                now
            ),
            Some("b")
        );
        assert_eq!(p.counts(), (0, 0, 0));

        // A transaction (and a cursor inside it) on "c" until commit and the last getMore.
        let lsid = vec![1u8; 16];
        assert_eq!(
            p.settle(
                None,
                "c",
                settle(None, None, TxnChange::Continues(lsid.clone())),
                now
            ),
            None
        );
        let (slot, conn) = got(p.take(None, Some(&lsid), any));
        assert_eq!(
            p.settle(
                Some(slot),
                conn,
                settle(Some(9), None, TxnChange::Continues(lsid.clone())),
                now
            ),
            None
        );
        let (slot, conn) = got(p.take(None, Some(&lsid), any));
        assert_eq!(
            p.settle(Some(slot), conn, settle(None, None, TxnChange::Ended), now),
            None
        );
        assert_eq!(p.counts(), (1, 1, 0));
        let (slot, conn) = got(p.take(Some(9), None, any));
        assert_eq!(
            p.settle(
                Some(slot),
                conn,
                settle(None, Some(9), TxnChange::None),
                now
            ),
            Some("c")
        );

        // A broken connection forgets its cursors; an abandoned one expires.
        p.settle(None, "d", settle(Some(11), None, TxnChange::None), now);
        let (slot, _) = got(p.take(Some(11), None, any));
        p.forget(slot);
        assert_eq!(p.take(Some(11), None, any), Take::Unknown);
        assert_eq!(p.counts(), (0, 0, 0));
        p.settle(None, "e", settle(Some(12), None, TxnChange::None), now);
        assert!(p.expire(now, PARKED_TTL).is_empty());
        assert_eq!(p.expire(now + PARKED_TTL, PARKED_TTL), vec!["e"]);
        assert_eq!(p.counts(), (0, 0, 0));
    }

    /// A cursor is recorded while its reply is read: a getMore that comes before the round
    /// trip is settled finds it busy, and is woken when the connection is parked.
    #[tokio::test]
    async fn a_cursor_is_known_before_its_round_trip_settles() {
        let p: Parked<&str> = Parked::default();
        let now = Instant::now();
        // The find's reply on a fresh connection opened cursor 5: recorded, busy.
        let slot = p.reserve(None, Some(5), None, now);
        assert!(slot.is_some());
        assert_eq!(p.reserve(slot, Some(5), None, now), slot, "idempotent");
        let changed = p.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        assert_eq!(p.take(Some(5), None, any), Take::Busy);
        assert_eq!(p.counts(), (1, 1, 0));
        // The round trip settles: the waiter is woken and gets the connection.
        assert_eq!(
            p.settle(slot, "a", settle(None, None, TxnChange::None), now),
            None
        );
        tokio::time::timeout(Duration::from_secs(1), changed)
            .await
            .expect("woken");
        let (s, conn) = got(p.take(Some(5), None, any));
        assert_eq!((Some(s), conn), (slot, "a"));
        // Its last getMore: recorded nothing new, then settled closed: gone, and a
        // waiter is woken to find it unknown.
        assert_eq!(p.reserve(Some(s), None, None, now), Some(s));
        let changed = p.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        assert_eq!(
            p.settle(Some(s), conn, settle(None, Some(5), TxnChange::None), now),
            Some("a")
        );
        tokio::time::timeout(Duration::from_secs(1), changed)
            .await
            .expect("woken");
        assert_eq!(p.take(Some(5), None, any), Take::Unknown);
        // A transaction statement is recorded the same way.
        let lsid = vec![2u8; 16];
        let slot = p.reserve(None, None, Some(&lsid), now);
        assert_eq!(p.take(None, Some(&lsid), any), Take::Busy);
        // A broken connection: forgotten, waiters find nothing.
        p.forget(slot.unwrap());
        assert_eq!(p.take(None, Some(&lsid), any), Take::Unknown);
        assert_eq!(p.counts(), (0, 0, 0));
    }
}
