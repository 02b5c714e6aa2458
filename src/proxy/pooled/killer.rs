//! A killCursors naming cursors that live in different places upstream.
//!
//! To its clients pooled mode is one server, so a driver may name in one killCursors cursors
//! that mongoguard opened on different servers (a replica set's members, several mongos) or,
//! behind a load balancer, on different parked connections: pymongo, for one, batches the
//! kills of a namespace's abandoned cursors per server address. The command itself goes
//! where its first cursor lives (`PooledSide::choose_server`, the parked connection), and
//! reaches only the cursors there. Once it succeeded, the others are killed here, in the
//! background, each where it lives: mongod's killCursors of a cursor it does not hold reports
//! it in `cursorsNotFound` and does nothing, so without this such cursors stayed open until
//! the server's cursor timeout (10 minutes) and, behind a load balancer, kept their parked
//! connection out of the pool for [`super::balanced::PARKED_TTL`].
//!
//! The client's reply is the forwarded command's, as before (drivers do not read it: the
//! driver specifications tell them to ignore killCursors' outcome). The work is bounded: at
//! most [`MAX_IDS`] cursors per command; one follow-up at a time per client connection and
//! [`CONCURRENT`] in all (a further one is left to the timeouts, as before this existed); a
//! wait for a parked connection another request is using at most `checkout_timeout` (as a
//! session's own wait); and each follow-up at most `reply_timeout`, and never more than
//! [`MAX_BOUND`]. A kill that fails leaves the cursor's pin, so the client's next getMore of
//! it still goes where it lives.
//!
//! A legacy OP_KILL_CURSORS (old drivers batch their kills the same way) names no namespace
//! and has no reply: its follow-up starts once it was sent — or when it could not be (its
//! first cursor's server unreachable, its parked connection busy past the checkout timeout,
//! or, behind a load balancer, that cursor parked nowhere, when the message needs a fresh
//! connection a pool full of the others' parked ones may not give): no error reaches the
//! client either way. It sends each other server (or parked connection) an OP_KILL_CURSORS
//! of the cursors there. Nothing says whether a cursor
//! died (mongod skips another user's silently), so with several servers no pin ends: a
//! getMore of a killed cursor still reaches its server, which answers that it is gone, and
//! the pin expires with its TTL. Behind a load balancer the cursor's parked connection is
//! its identity's, whose cursor it may kill: the connection is settled as for a command.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{RawArrayBuf, RawDocumentBuf};
use tokio::time::Instant;
use tracing::debug;

use super::balanced::{Settle, Take, TxnChange};
use super::Pooled;
use crate::proxy::routing::KillRest;
use crate::upstream::{pool::PoolKey, ConnectError, Host, UpstreamConn};
use crate::wire::builder::encode_kill_cursors;

/// The most cursors after the first one killCursors is followed up for.
pub(crate) const MAX_IDS: usize = 1_000;
/// Follow-ups running at once, over every client.
pub(crate) const CONCURRENT: usize = 64;
/// The longest one follow-up may take (less when `upstream.reply_timeout` is shorter): a
/// killCursors is answered at once; one that is not is left to the server's timeout.
const MAX_BOUND: Duration = Duration::from_secs(30);

/// After a killCursors that succeeded on `reached` (as `identity`): kills `rest`'s cursors
/// where they live, in the background. (`reached` is `None` behind a load balancer, for a
/// legacy OP_KILL_CURSORS whose first cursor is parked nowhere: its follow-up starts before
/// the message is sent.) With several servers, cursors pinned to `reached`
/// were killed by the command itself: only their pins end here.
///
/// `in_flight` is the session's: set while its follow-up runs; a session whose previous one
/// still runs (its cursors' connections busy) gets none, so that one client cannot take every
/// permit.
pub(crate) fn follow_up(
    pooled: &Arc<Pooled>,
    identity: &str,
    reached: Option<&Host>,
    rest: &KillRest,
    in_flight: &Arc<AtomicBool>,
) {
    let balanced = pooled.topology.load_balanced();
    let mut elsewhere: Vec<(Host, Vec<i64>)> = Vec::new();
    if !balanced {
        let now = Instant::now();
        for &id in &rest.ids {
            match pooled.pins.cursor_server(id, now) {
                None => {}
                Some(h) if Some(&h) == reached && rest.ns.is_some() => pooled.pins.unpin_cursor(id),
                // A legacy kill has no reply: the pins of the cursors it reached stay.
                Some(h) if Some(&h) == reached => {}
                Some(h) => match elsewhere.iter_mut().find(|(x, _)| *x == h) {
                    Some((_, ids)) => ids.push(id),
                    None => elsewhere.push((h, vec![id])),
                },
            }
        }
        if elsewhere.is_empty() {
            return;
        }
    }
    if in_flight.swap(true, Ordering::AcqRel) {
        debug!(
            cursors = rest.ids.len(),
            "this client's previous killCursors follow-up still runs: the other cursors are \
             left to the server's timeout"
        );
        return;
    }
    let running = Running(in_flight.clone());
    let Ok(permit) = pooled.stray_kills.clone().try_acquire_owned() else {
        debug!(
            cursors = rest.ids.len(),
            "killCursors follow-ups all busy: the other cursors are left to the server's timeout"
        );
        return;
    };
    let pooled = pooled.clone();
    let identity = identity.to_owned();
    let rest = rest.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let _running = running;
        let bound = match pooled.reply_timeout {
            d if d.is_zero() => MAX_BOUND,
            d => d.min(MAX_BOUND),
        };
        let work = async {
            if balanced {
                for &id in &rest.ids {
                    kill_parked(&pooled, &identity, &rest, id).await;
                }
            } else {
                for (host, ids) in &elsewhere {
                    kill_on(&pooled, &identity, host, &rest, ids).await;
                }
            }
        };
        tokio::select! {
            biased;
            _ = pooled.cancel.cancelled() => {}
            r = tokio::time::timeout(bound, work) => if r.is_err() {
                debug!(?bound, "killCursors follow-up timed out; the rest is left to the server");
            },
        }
    });
}

/// Clears a session's in-flight flag when its follow-up ends (or is never spawned).
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// `{killCursors: coll, cursors: [ids], $db: db}`.
fn command(db: &str, coll: &str, ids: &[i64]) -> RawDocumentBuf {
    let mut cursors = RawArrayBuf::new();
    for &id in ids {
        cursors.push(id);
    }
    bson::rawdoc! {
        "killCursors": coll,
        "cursors": cursors,
        "$db": db,
    }
}

/// Kills `ids` over `conn` as the client asked: a killCursors command in `rest`'s namespace,
/// or a legacy OP_KILL_CURSORS. `Ok(true)`: the server accepted the command; `Ok(false)`:
/// it refused it (another user's cursor: nothing was killed); `Ok(None)`: the legacy
/// message was sent, which has no reply (mongod kills the cursors the user may kill and
/// skips the others silently: `runOpKillCursors`, src/mongo/db/run_op_kill_cursors.cpp).
/// `Err`: the connection failed (drop it).
async fn kill(
    conn: &mut UpstreamConn,
    rest: &KillRest,
    ids: &[i64],
) -> Result<Option<bool>, ConnectError> {
    match &rest.ns {
        Some((db, coll)) => {
            let reply = conn.command(&command(db, coll, ids)).await?;
            let ok = crate::upstream::reply_ok(&reply);
            if !ok {
                debug!(?reply, "killCursors follow-up refused");
            }
            Ok(Some(ok))
        }
        None => {
            let message = encode_kill_cursors(crate::upstream::next_own_request_id(), ids);
            let host = conn.host().to_string();
            conn.send(&message)
                .await
                .map_err(|source| ConnectError::Io { host, source })?;
            Ok(None)
        }
    }
}

/// Kills `ids` on a pooled connection to `host`, then ends their pins.
async fn kill_on(pooled: &Pooled, identity: &str, host: &Host, rest: &KillRest, ids: &[i64]) {
    let key = PoolKey::new(host.clone(), identity);
    let mut conn = match pooled.pool.checkout(&key).await {
        Ok(c) => c,
        Err(e) => {
            debug!(error = %e, "killCursors follow-up: no connection");
            return;
        }
    };
    // An error leaves the connection unreleased: dropped, it is closed.
    match kill(&mut conn, rest, ids).await {
        Ok(accepted) => {
            conn.release();
            // Refused (another user's cursor), or not known (legacy): the pins stay, so
            // that a getMore of these ids still goes where they live (or lived).
            if accepted == Some(true) {
                for &id in ids {
                    pooled.pins.unpin_cursor(id);
                }
            }
        }
        Err(e) => debug!(error = %e, "killCursors follow-up failed"),
    }
}

/// Kills cursor `id` on the parked connection it lives on (waiting while that connection
/// is busy), and settles the connection: back to the pool once nothing lives on it.
async fn kill_parked(pooled: &Pooled, identity: &str, rest: &KillRest, id: i64) {
    let parked = &pooled.balanced;
    // As long as a session waits for its cursor's busy connection (`take_parked`).
    let give_up = tokio::time::sleep(pooled.pool.config().checkout_timeout);
    tokio::pin!(give_up);
    loop {
        let changed = parked.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        match parked.take(Some(id), None, |c| c.key().identity == identity) {
            Take::Unknown => return,
            Take::Busy => tokio::select! {
                () = &mut give_up => {
                    debug!(cursor = id, "killCursors follow-up: the cursor's connection stayed busy");
                    return;
                }
                () = changed => {}
            },
            Take::Got(slot, mut conn) => {
                // Dropped here (the follow-up timed out or was cancelled mid-command), the
                // connection closes: the guard forgets its slot, or it stayed busy forever.
                let mut taken = Taken {
                    parked,
                    slot: Some(slot),
                };
                match kill(&mut conn, rest, &[id]).await {
                    Ok(accepted) => {
                        // Refused (another user's cursor): it stays where it is. A legacy
                        // kill on the cursor's own connection, its identity's, is one the
                        // user may make: the cursor is gone.
                        let closed = (accepted != Some(false)).then_some(id);
                        let settle = Settle {
                            opened: None,
                            closed,
                            txn: TxnChange::None,
                        };
                        taken.slot = None;
                        if let Some(c) = parked.settle(Some(slot), conn, settle, Instant::now()) {
                            c.release();
                        }
                    }
                    Err(e) => {
                        // The connection broke: mongos ended what lived on it.
                        debug!(error = %e, "killCursors follow-up failed");
                        // (`taken` forgets the slot.)
                    }
                }
                return;
            }
        }
    }
}

/// A parked connection's slot a follow-up took: forgotten when the follow-up ends without
/// settling it — its connection broke, or the follow-up was dropped mid-command (its bound
/// passed, or shutdown) and the connection, dropped with it, is closed. Either way mongos
/// ended what lived on it; left in place the slot would stay busy for good (a busy slot
/// never expires), and every getMore of its cursors would wait out the checkout timeout.
struct Taken<'a, C> {
    parked: &'a super::balanced::Parked<C>,
    slot: Option<u64>,
}

impl<C> Drop for Taken<'_, C> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.parked.forget(slot);
        }
    }
}
