//! Pooled mode's upstream side of one client session: a server chosen per request (read
//! preference, cursor and transaction pins), a pooled connection checked out for the round
//! trip, cursor pins read off the replies, one re-send after a "not primary" reply.

use std::{future::Future, pin::Pin, sync::Arc, task::Poll, time::Duration};

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{balanced, Pooled, CHECKOUT_TIMEOUT_CODE, CHECKOUT_TIMEOUT_CODE_NAME};
use crate::{
    auth::sasl::SaslSession,
    proxy::{
        client_io::Received,
        error::SessionError,
        inspect::Request,
        observe::SessionObs,
        pins::{ExhaustHeld, Sticky},
        routing::{self, Class, CursorReply, KillRest, ReplyFacts, Routing, TxnKey},
        session::Client,
        stop::Stop,
        strategy::{Acquired, AfterNotPrimary, Link, Outcome, Strategy},
        timer::LazyTimer,
        Context,
    },
    upstream::{
        pool::{Checkout, PoolError, PoolHandle, PoolKey},
        topology::ReadPref,
        Host, Identity, UpstreamConn,
    },
    wire::{builder::error_document, codec::CodecError, Frame, Index, Message},
};

/// How long a legacy write's connection waits for the client's next request (its
/// getLastError) before it goes back to the pool.
pub(crate) const KEPT_FOR_LAST_ERROR: Duration = Duration::from_secs(1);

/// mongod's codes used by pooled mode.
pub(super) const UNAUTHORIZED: (i32, &str) = (13, "Unauthorized");
pub(super) const HOST_UNREACHABLE: (i32, &str) = (6, "HostUnreachable");
const FAILED_TO_SATISFY_READ_PREFERENCE: (i32, &str) = (133, "FailedToSatisfyReadPreference");
const CURSOR_NOT_FOUND: (i32, &str) = (43, "CursorNotFound");

type Conn = Checkout<UpstreamConn>;

impl Link for Conn {
    fn host(&self) -> &Host {
        let conn: &UpstreamConn = self;
        conn.host()
    }

    fn send<'a>(
        &'a mut self,
        bytes: &'a [u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a {
        let conn: &mut UpstreamConn = self;
        conn.send(bytes)
    }

    fn poll_next_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Frame, CodecError>>> {
        let conn: &mut UpstreamConn = self;
        conn.poll_next_frame(cx)
    }

    fn buffered(&self) -> &[u8] {
        let conn: &UpstreamConn = self;
        conn.buffered()
    }

    fn sent_ahead(&mut self) -> Option<(usize, std::time::Instant)> {
        let ahead = crate::upstream::pool::Checkout::sent_ahead(self)?;
        Some((ahead.bytes, ahead.at.into_std()))
    }
}

/// The upstream side of one pooled client session.
pub(crate) struct PooledSide {
    pub(super) ctx: Arc<Context>,
    pub(super) pooled: Arc<Pooled>,
    /// The connection id this client's hello reports.
    pub(super) connection_id: i32,
    pub(super) sasl: SaslSession,
    /// The upstream identity requests run as: set by authentication (or at once when
    /// unauthenticated access is allowed).
    pub(super) identity: Option<Arc<Identity>>,
    /// `db.user` the client authenticated as, for the policy and records.
    pub(super) user: Option<String>,
    /// The users-file generation `identity` was resolved under (authenticated clients).
    pub(super) users_generation: u64,
    /// The connection of a legacy fire-and-forget write, kept for its getLastError.
    sticky: Sticky<Conn>,
    /// That connection, taken for the getLastError that arrived (acquired next).
    for_last_error: Option<Conn>,
    /// The current round trip runs on the kept legacy-write connection: never re-sent.
    on_kept: bool,
    /// The kept legacy-write connection went back to the pool before a request followed.
    last_error_lost: bool,
    /// The current request is a getLastError whose write's connection went back so.
    last_error_unknown: bool,
    /// Behind a load balancer: the parked slot of the current request's connection (taken
    /// from it, or made when its reply opened a cursor; see [`super::balanced`]).
    balanced_slot: Option<u64>,
    /// The cursor the current request's reply finished (a last getMore: id 0).
    closed_cursor: Option<i64>,
    /// The session's checkouts (apart, so that a checkout borrows the identity in place).
    checkouts: Checkouts,
    /// The last round trip's connection went straight to a session waiting for one.
    handed_over: bool,
    /// This session's killCursors follow-up is running (one at a time per session: see
    /// [`super::killer`]).
    kill_follow_up: Arc<std::sync::atomic::AtomicBool>,
}

/// A session's checkouts.
#[derive(Default)]
struct Checkouts {
    /// The pool of the last (server, identity) checked out from, so that the next checkout
    /// there does not look it up again (a session's requests mostly go to one server).
    last_pool: Option<PoolHandle<UpstreamConn>>,
    /// Bounds waits for a pooled connection (`checkout_timeout`): one timer re-armed per
    /// wait, made at the first wait (see [`LazyTimer`]).
    timer: Option<LazyTimer>,
}

impl Checkouts {
    /// Load-balanced upstream: the parked connection of cursor `cursor` (else of the
    /// transaction of session `lsid`), waiting while a request runs on it — never past the
    /// checkout timeout or the kill.
    async fn take_parked(
        &mut self,
        pooled: &Pooled,
        cursor: Option<i64>,
        lsid: Option<&[u8]>,
        identity: &str,
        kill: &Stop,
    ) -> ParkedTake {
        let parked = &pooled.balanced;
        let txn = lsid.map(|l| balanced::txn_key(identity, l));
        let lsid = txn.as_deref();
        let mut waited = false;
        loop {
            let changed = parked.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match parked.take(cursor, lsid, |c: &Conn| c.key().identity == identity) {
                balanced::Take::Got(slot, conn) => return ParkedTake::Got(slot, conn),
                balanced::Take::Unknown => return ParkedTake::Unknown,
                balanced::Take::Busy => {}
            }
            let timer = self.timer.get_or_insert_with(LazyTimer::new);
            if !waited {
                waited = true;
                timer.arm(
                    pooled
                        .pool
                        .config()
                        .checkout_timeout
                        .max(Duration::from_nanos(1)),
                );
            }
            tokio::select! {
                biased;
                _ = kill.killed() => return ParkedTake::Killed,
                _ = changed => {}
                _ = timer.expired() => return ParkedTake::StayedBusy,
            }
        }
    }

    /// Checks out a connection to `host` as `identity`, never waiting past the kill: an
    /// idle one at once when a slot is free, else (waiting for a slot, or connecting) until
    /// the connection is killed.
    async fn checkout(
        &mut self,
        pool: &crate::upstream::pool::Pool<crate::upstream::topology::MongoConnector>,
        host: &Host,
        identity: &str,
        kill: &Stop,
        ahead: Option<&bytes::Bytes>,
    ) -> Result<Conn, PoolError> {
        let handle = match &mut self.last_pool {
            Some(h) if &h.key().server == host && h.key().identity == identity => &*h,
            slot => &*slot.insert(pool.handle(&PoolKey::new(host.clone(), identity))),
        };
        if kill.is_killed() {
            return Err(PoolError::Closed {
                pool: handle.key().clone(),
            });
        }
        if let Some(c) = pool.checkout_ready(handle)? {
            return Ok(c);
        }
        let timer = self.timer.get_or_insert_with(LazyTimer::new);
        // A zero duration leaves a LazyTimer unarmed; a zero checkout_timeout means no wait.
        timer.arm(pool.config().checkout_timeout.max(Duration::from_nanos(1)));
        let mut checkout = pool.checkout_sending(handle, timer.expired(), ahead);
        // Polled in place (no select!: see `KeyPool::checkout_until`'s future). The kill is
        // polled first: a kill after this checkout's request was written ahead drops the
        // wait, which closes the connection (the request's reply is in flight).
        std::future::poll_fn(|cx| {
            if kill.poll_killed(cx).is_ready() {
                return Poll::Ready(Err(PoolError::Closed {
                    pool: handle.key().clone(),
                }));
            }
            Pin::new(&mut checkout).poll(cx)
        })
        .await
    }
}

impl PooledSide {
    pub(crate) fn new(ctx: Arc<Context>, pooled: Arc<Pooled>) -> PooledSide {
        let identity = ctx
            .config
            .auth
            .allow_unauthenticated
            .then(|| pooled.identities.default_identity().clone());
        PooledSide {
            connection_id: pooled
                .connection_ids
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            sasl: SaslSession::new(),
            identity,
            user: None,
            users_generation: 0,
            sticky: Sticky::default(),
            for_last_error: None,
            on_kept: false,
            last_error_lost: false,
            last_error_unknown: false,
            balanced_slot: None,
            closed_cursor: None,
            checkouts: Checkouts::default(),
            handed_over: false,
            kill_follow_up: Arc::default(),
            pooled,
            ctx,
        }
    }

    /// Where the request goes: the server of its cursor or transaction, else by read
    /// preference (writes and transactions: the primary).
    async fn choose_server(
        &self,
        request: &Request,
        routing: &Routing,
        kill: &Stop,
    ) -> Result<Host, Option<(i32, &'static str, String)>> {
        if let Some(e) = &routing.read_pref_error {
            // mongod and mongos refuse it before running anything; so does mongoguard,
            // rather than route it by a guess.
            return Err(Some((e.code, e.code_name, e.message.clone())));
        }
        let p = &self.pooled;
        if p.topology.is_multi_server() {
            let now = Instant::now();
            if let Some(h) = routing.cursor.and_then(|id| p.pins.cursor_server(id, now)) {
                return Ok(h);
            }
            let txn = routing.txn.as_ref().map(|t| self.pin_key(t));
            if let Some(h) = txn.as_ref().and_then(|t| p.pins.txn_server(t, now)) {
                return Ok(h);
            }
        }
        let pref = if request.is_write || routing.txn.is_some() {
            ReadPref::Primary
        } else {
            routing.read_pref
        };
        // Writes and transactions go to the primary whatever the preference says.
        let filter = (pref == routing.read_pref)
            .then_some(routing.read_filter.as_deref())
            .flatten();
        if let Some(f) = filter {
            p.topology
                .check_filter(f)
                .map_err(|e| Some((e.code, e.code_name, e.message)))?;
        }
        if kill.is_killed() {
            return Err(None);
        }
        let host = match p.topology.select_now(pref, filter) {
            // A server qualifies now (nearly always): no wait to set up.
            Some(h) => h,
            None => {
                let timeout = self.ctx.config.upstream.server_selection_timeout;
                tokio::select! {
                    biased;
                    _ = kill.killed() => return Err(None),
                    h = p.topology.select_filtered(pref, filter, timeout) => h.map_err(|e| {
                        let (code, name) = FAILED_TO_SATISFY_READ_PREFERENCE;
                        Some((code, name, format!("mongoguard: {e}")))
                    })?,
                }
            }
        };
        if let (Some(t), true) = (&routing.txn, routing.starts_txn) {
            p.pins.pin_txn(&self.pin_key(t), &host, Instant::now());
        }
        Ok(host)
    }

    /// The answer to a request whose checkout failed.
    fn checkout_failed(&self, host: &Host, e: PoolError) -> Acquired<Conn> {
        let (code, name) = match &e {
            PoolError::CheckoutTimeout { .. } => {
                warn!(error = %e, "checkout timeout");
                (CHECKOUT_TIMEOUT_CODE, CHECKOUT_TIMEOUT_CODE_NAME)
            }
            PoolError::Connect { source, .. } => {
                warn!(error = %e, "cannot open an upstream connection");
                if source.implicates_server() {
                    self.pooled.topology.mark_unknown(host);
                }
                HOST_UNREACHABLE
            }
            PoolError::Closed { .. } => return refused_end(SessionError::Killed),
        };
        Acquired::Refused {
            answer: Some(error_document(code, name, &format!("mongoguard: {e}"))),
            end: None,
        }
    }

    /// After a users-file reload, looks the authenticated user up again: one the file no
    /// longer holds is bound to no identity (his requests are refused, as mongod refuses a
    /// removed user's connections), one now mapped to another identity runs as that one.
    /// One atomic load per request when nothing was reloaded.
    fn recheck_user(&mut self) {
        if self.user.is_none() {
            return;
        }
        let generation = self.pooled.users_generation();
        if generation == self.users_generation {
            return;
        }
        self.users_generation = generation;
        let Some(user) = self.sasl.authenticated() else {
            self.identity = None;
            return;
        };
        let users = self.pooled.users();
        let entry = users.as_deref().and_then(|u| u.user(&user.db, &user.name));
        let identity = entry.and_then(|e| {
            let mapped = e
                .upstream
                .as_deref()
                .unwrap_or(crate::config::DEFAULT_IDENTITY);
            self.pooled.identities.get(mapped)
        });
        match identity {
            Some(i) => {
                if self.identity.as_ref().is_some_and(|old| old.name != i.name) {
                    info!(user = %user.name, db = %user.db, identity = %i.name,
                        "users file reloaded: user now runs as another upstream identity");
                }
                if self.identity.is_some() {
                    self.identity = Some(i.clone());
                }
            }
            None => {
                if self.identity.is_some() {
                    info!(user = %user.name, db = %user.db,
                        "users file reloaded without this user: his connection is refused");
                }
                self.identity = None;
            }
        }
    }

    fn release_kept(&mut self) {
        if let Some(c) = self.for_last_error.take() {
            c.release();
        }
        if let Some(c) = self.sticky.take(&self.pooled.pins.counts) {
            c.release();
        }
    }
}

impl PooledSide {
    /// The identity requests of this session run as (`acquire`'s choice).
    fn identity_name(&self) -> &str {
        match &self.identity {
            Some(i) => i.name.as_str(),
            None => self.pooled.identities.default_identity().name.as_str(),
        }
    }

    /// A killCursors that `host` accepted (or, legacy, was sent) and that named cursors
    /// living elsewhere: they are killed where they live ([`super::killer`]).
    fn follow_up_kills(&self, host: Option<&Host>, route: &Routing) {
        if let (true, Some(rest)) = (route.kills_cursor, &route.kill_rest) {
            let identity = self.identity_name();
            super::killer::follow_up(&self.pooled, identity, host, rest, &self.kill_follow_up);
        }
    }

    /// A legacy OP_KILL_CURSORS naming other cursors after its first.
    fn legacy_kill(route: &Routing) -> bool {
        route.kills_cursor && matches!(route.kill_rest.as_deref(), Some(KillRest { ns: None, .. }))
    }

    /// Transaction `t` as the shared pins know it: under the upstream identity the request
    /// runs as (`acquire`'s choice), since the same `lsid.id` sent by another user is another
    /// session upstream (see [`balanced::txn_key`]) and must not move or drop this pin.
    fn pin_key(&self, t: &TxnKey) -> TxnKey {
        let identity = self.identity_name();
        TxnKey {
            lsid: balanced::txn_key(identity, &t.lsid),
            txn_number: t.txn_number,
        }
    }

    /// Load-balanced upstream: parks `link` while a cursor or transaction lives on it, or
    /// hands it back (`Some`) for the pool; a broken one is discarded with its slot.
    fn settle_balanced(
        &mut self,
        link: Conn,
        outcome: &Outcome,
        route: &Routing,
        txn_aborted: bool,
    ) -> Option<Conn> {
        let slot = self.balanced_slot.take();
        if matches!(outcome, Outcome::Broken) {
            if let Some(slot) = slot {
                self.pooled.balanced.forget(slot);
            }
            link.discard();
            return None;
        }
        let closed = self.closed_cursor.take();
        let killed = route.cursor.filter(|_| route.kills_cursor);
        let txn = match &route.txn {
            _ if txn_aborted || route.ends_txn => balanced::TxnChange::Ended,
            Some(t) => {
                balanced::TxnChange::Continues(balanced::txn_key(&link.key().identity, &t.lsid))
            }
            None => balanced::TxnChange::None,
        };
        let settle = balanced::Settle {
            // Recorded while the reply was read (observe_reply), before the client had it.
            opened: None,
            // A last getMore's reply reports its cursor finished (id 0); killCursors ends it.
            closed: killed.or(closed),
            txn,
        };
        self.pooled
            .balanced
            .settle(slot, link, settle, Instant::now())
    }
}

/// What a request for a parked cursor or transaction got.
enum ParkedTake {
    Got(u64, Conn),
    Unknown,
    /// Its connection stayed busy for the whole checkout timeout.
    StayedBusy,
    Killed,
}

fn refused_end(e: SessionError) -> Acquired<Conn> {
    Acquired::Refused {
        answer: None,
        end: Some(e),
    }
}

impl Strategy for PooledSide {
    type Link = Conn;
    type Route = Routing;
    type Exhaust = Option<ExhaustHeld>;
    const REUSES_LINKS: bool = true;

    fn route(&self, msg: &Message<'_>, body: Option<&Index<'_>>) -> (Routing, bool) {
        let routing = routing::of_message(msg, body);
        // mongoguard answers these itself; nothing to judge.
        let judge = !matches!(
            routing.class(),
            Class::Hello | Class::SaslStart | Class::SaslContinue | Class::OtherAuth
        );
        (routing, judge)
    }

    fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    fn wire_version(&self) -> Option<i32> {
        self.pooled.topology.max_wire_version()
    }

    /// Between requests a pooled session holds no upstream connection to watch (a kept
    /// legacy-write connection is checked when it is used).
    ///
    /// A kept legacy-write connection waits [`KEPT_FOR_LAST_ERROR`] for the client's next
    /// request (a getLastError follows its write at once, often in the same packet), then
    /// goes back to the pool: a client that wrote and went idle would otherwise hold it for
    /// as long as it stays connected, and starve the pool's other clients.
    async fn idle_watch(&mut self) -> SessionError {
        if self.sticky.is_held() {
            tokio::time::sleep(KEPT_FOR_LAST_ERROR).await;
            if let Some(c) = self.sticky.take(&self.pooled.pins.counts) {
                debug!("no request followed a legacy write: its connection goes back");
                c.release();
                self.last_error_lost = true;
            }
        }
        std::future::pending().await
    }

    /// A kept legacy-write connection serves only that write's getLastError.
    fn request_arrived(&mut self, request: &Request, _route: &Routing, last_write_ok: bool) {
        self.recheck_user();
        let lost = std::mem::take(&mut self.last_error_lost);
        self.last_error_unknown = lost && request.is_get_last_error;
        if let Some(c) = self.for_last_error.take() {
            c.release();
        }
        if let Some(kept) = self.sticky.take(&self.pooled.pins.counts) {
            if request.is_get_last_error && last_write_ok {
                self.for_last_error = Some(kept);
            } else {
                kept.release();
            }
        }
    }

    async fn answer_locally(
        &mut self,
        client: &mut Client,
        received: &Received,
        request: &Request,
        route: &Routing,
    ) -> Result<bool, SessionError> {
        self.answer(client, received, request, route).await
    }

    async fn acquire(
        &mut self,
        request: &Request,
        route: &Routing,
        _obs: &mut SessionObs,
        kill: &Stop,
        ahead: Option<&bytes::Bytes>,
    ) -> Acquired<Conn> {
        self.on_kept = false;
        if let Some(kept) = self.for_last_error.take() {
            self.on_kept = true;
            return Acquired::Link(kept);
        }
        if request.is_get_last_error && self.last_error_unknown {
            // Its write's connection went back to the pool (KEPT_FOR_LAST_ERROR): the write's
            // outcome is unknown here, not "no error".
            return Acquired::Refused {
                answer: Some(bson::rawdoc! {
                    "n": 0,
                    "err": format!(
                        "mongoguard: this getLastError came more than {KEPT_FOR_LAST_ERROR:?} \
                         after its legacy write, whose upstream connection had gone back to \
                         the pool: the write's outcome is unknown"
                    ),
                    "ok": 1.0,
                }),
                end: None,
            };
        }
        if request.is_get_last_error {
            // No legacy write of this client's kept its connection: getLastError reports a
            // connection's previous request, which on any pooled connection is another
            // client's (its write errors, duplicate key values included). Answered as mongod
            // answers one whose previous request was no write.
            return Acquired::Refused {
                answer: Some(bson::rawdoc! {"n": 0, "err": bson::RawBson::Null, "ok": 1.0}),
                end: None,
            };
        }
        self.balanced_slot = None;
        self.closed_cursor = None;
        let identity: Option<&Identity> = match (&self.identity, route.class()) {
            (Some(identity), _) => Some(identity),
            // buildInfo before authentication (mongod allows it; 3.x drivers send it in
            // their handshake): read-only server facts, run as the default identity.
            (None, Class::BuildInfo) => Some(self.pooled.identities.default_identity()),
            (None, _) => None,
        };
        let Some(identity) = identity else {
            return Acquired::Refused {
                answer: Some(error_document(
                    UNAUTHORIZED.0,
                    UNAUTHORIZED.1,
                    "command requires authentication",
                )),
                end: None,
            };
        };
        if self.pooled.topology.load_balanced() {
            let lsid = route.txn.as_ref().map(|t| t.lsid.as_slice());
            let take =
                self.checkouts
                    .take_parked(&self.pooled, route.cursor, lsid, &identity.name, kill);
            match take.await {
                ParkedTake::Got(slot, conn) => {
                    self.balanced_slot = Some(slot);
                    return Acquired::Link(conn);
                }
                ParkedTake::Killed => return refused_end(SessionError::Killed),
                ParkedTake::StayedBusy => {
                    // A legacy OP_KILL_CURSORS is dropped here (no reply to carry the
                    // error): its other cursors are still killed where they are parked.
                    if Self::legacy_kill(route) {
                        self.follow_up_kills(None, route);
                    }
                    let (code, name) = (CHECKOUT_TIMEOUT_CODE, CHECKOUT_TIMEOUT_CODE_NAME);
                    let message = format!(
                        "mongoguard: the upstream connection of this cursor or transaction \
                         stayed busy for {:?} (checkout_timeout)",
                        self.pooled.pool.config().checkout_timeout
                    );
                    warn!(
                        cursor = route.cursor,
                        "load-balanced: the connection of a cursor or transaction stayed busy"
                    );
                    return Acquired::Refused {
                        answer: Some(error_document(code, name, &message)),
                        end: None,
                    };
                }
                // A getMore's cursor lives on one connection, to one mongos: one not parked
                // here (finished, killed, or its connection closed) exists on no
                // connection mongoguard can reach. Another connection may reach another
                // mongos, so it is not sent anywhere.
                ParkedTake::Unknown if route.cursor.is_some() && !route.kills_cursor => {
                    let (code, name) = CURSOR_NOT_FOUND;
                    let message = format!(
                        "mongoguard: cursor id {} is open on no connection to the \
                         load-balanced upstream",
                        route.cursor.unwrap_or(0)
                    );
                    return Acquired::Refused {
                        answer: Some(error_document(code, name, &message)),
                        end: None,
                    };
                }
                // A legacy OP_KILL_CURSORS (no reply) whose first cursor is parked nowhere
                // goes out on a fresh connection, which a pool full of parked connections —
                // the very ones this message would free — cannot give before the checkout
                // timeout (the message is then dropped, and its follow-up never starts). Its
                // other cursors are killed where they are parked now: their follow-up needs
                // no reply of the message. (Once it is sent, `finished` tries again; one
                // still running, or nothing left parked, makes that a no-op.)
                ParkedTake::Unknown => {
                    if Self::legacy_kill(route) {
                        self.follow_up_kills(None, route);
                    }
                }
            }
        }
        let host = match self.choose_server(request, route, kill).await {
            Ok(h) => h,
            Err(None) => return refused_end(SessionError::Killed),
            Err(Some((code, name, message))) => {
                return Acquired::Refused {
                    answer: Some(error_document(code, name, &message)),
                    end: None,
                };
            }
        };
        // A request written ahead is run again by its reply or, at the latest, by its
        // checkout timer: its reply_timeout, counted from the write, must not end before.
        let (reply, wait) = (
            self.pooled.reply_timeout,
            self.pooled.pool.config().checkout_timeout,
        );
        let ahead = ahead.filter(|_| reply.is_zero() || reply >= wait);
        let checkout = self
            .checkouts
            .checkout(&self.pooled.pool, &host, &identity.name, kill, ahead)
            .await;
        match checkout {
            Ok(c) => Acquired::Link(c),
            Err(e) => {
                // A legacy OP_KILL_CURSORS is dropped here (no reply to carry the error):
                // its cursors on other servers are still killed there.
                if Self::legacy_kill(route) && self.wants_reply_facts() {
                    self.follow_up_kills(Some(&host), route);
                }
                self.checkout_failed(&host, e)
            }
        }
    }

    /// The transaction's server, if it is pinned (a transaction that never reached a server
    /// has nothing to abort).
    async fn acquire_for_abort(
        &mut self,
        route: &Routing,
        _obs: &mut SessionObs,
        kill: &Stop,
    ) -> Option<Conn> {
        let txn = route.txn.as_ref()?;
        let identity = self.identity.as_ref()?;
        if self.pooled.topology.load_balanced() {
            let take = self.checkouts.take_parked(
                &self.pooled,
                None,
                Some(&txn.lsid),
                &identity.name,
                kill,
            );
            let ParkedTake::Got(slot, conn) = take.await else {
                return None;
            };
            self.balanced_slot = Some(slot);
            return Some(conn);
        }
        let host = self
            .pooled
            .pins
            .txn_server(&self.pin_key(txn), Instant::now())?;
        self.checkouts
            .checkout(&self.pooled.pool, &host, &identity.name, kill, None)
            .await
            .ok()
    }

    fn wants_reply_facts(&self) -> bool {
        self.pooled.topology.is_multi_server() || self.pooled.topology.load_balanced()
    }

    /// Cursor pins (several servers only): an open cursor is pinned to the server that
    /// answered, a finished one forgotten. Behind a load balancer: the cursor and the
    /// transaction are recorded on the connection's slot before the reply is relayed.
    fn observe_reply(&mut self, host: &Host, route: &Routing, facts: &ReplyFacts) {
        if !facts.error {
            self.follow_up_kills(Some(host), route);
        }
        if self.pooled.topology.load_balanced() {
            // Any reply that opens a cursor, not only those of the commands may_open_cursor
            // lists: `acquire` refuses a getMore of a cursor recorded nowhere.
            let opened = match facts.cursor {
                CursorReply::Open(id) if route.may_open_cursor || route.cursor.is_none() => {
                    Some(id)
                }
                CursorReply::Closed => {
                    self.closed_cursor = route.cursor;
                    None
                }
                _ => None,
            };
            // Recorded now, before the reply is relayed: the client may send the next
            // getMore (or statement) on another of its connections as soon as it has this
            // reply, before this round trip is settled; it must find the slot (busy) and
            // wait for this connection, not take another.
            // Under the identity the request runs as (`acquire`'s choice).
            let identity = self.identity_name();
            let txn = route
                .txn
                .as_ref()
                .filter(|_| !route.ends_txn)
                .map(|t| balanced::txn_key(identity, &t.lsid));
            self.balanced_slot = self.pooled.balanced.reserve(
                self.balanced_slot,
                opened,
                txn.as_deref(),
                Instant::now(),
            );
            return;
        }
        if !self.pooled.topology.is_multi_server() {
            return;
        }
        let pins = &self.pooled.pins;
        match &facts.cursor {
            CursorReply::Open(id) if route.may_open_cursor => {
                pins.pin_cursor(*id, host, Instant::now());
            }
            CursorReply::Closed => {
                if let Some(id) = route.cursor {
                    pins.unpin_cursor(id);
                }
            }
            _ => {}
        }
        // A killCursors the server accepted ends the pin (its cursor was killed, or is not
        // there). One it refused leaves it: another user's killCursors of this cursor
        // (mongod: Unauthorized) must not move its owner's next getMore elsewhere.
        if route.kills_cursor && !facts.error {
            if let Some(id) = route.cursor {
                pins.unpin_cursor(id);
            }
        }
    }

    fn exhaust_started(&self) -> Option<ExhaustHeld> {
        Some(self.pooled.pins.exhaust())
    }

    /// The connection goes back to the pool only after a complete exchange; a legacy write's
    /// connection is kept for its getLastError; a broken one is discarded.
    fn finished(&mut self, link: Conn, outcome: Outcome, route: &Routing) {
        // Set again below when this release hands the connection over.
        self.handed_over = false;
        // A legacy OP_KILL_CURSORS has no reply: its follow-up starts once it was sent (or
        // its connection broke on the way: the client gets no error either way).
        if matches!(outcome, Outcome::Sent | Outcome::Broken)
            && Self::legacy_kill(route)
            && self.wants_reply_facts()
        {
            self.follow_up_kills(Some(&link.key().server), route);
        }
        if self.pooled.topology.load_balanced() {
            let Some(link) = self.settle_balanced(link, &outcome, route, false) else {
                return;
            };
            if !matches!(outcome, Outcome::Sent) || route.class() != Class::LegacyWrite {
                self.handed_over = link.release();
                return;
            }
            // A legacy write's connection waits for its getLastError as usual.
            if let Some(old) = self.sticky.hold(link, &self.pooled.pins.counts) {
                old.release();
            }
            return;
        }
        match outcome {
            Outcome::Broken => link.discard(),
            // A legacy write (OP_INSERT/UPDATE/DELETE): its connection waits for the
            // client's next request, a getLastError that must run where the write ran. (An
            // OP_MSG moreToCome write goes back at once: a w:0 client that then idles — a
            // PHP-FPM worker between requests — would hold a pooled connection.)
            Outcome::Sent if route.class() == Class::LegacyWrite && !self.on_kept => {
                if let Some(old) = self.sticky.hold(link, &self.pooled.pins.counts) {
                    old.release();
                }
            }
            Outcome::Sent => {
                link.release();
            }
            Outcome::Replied => {
                let pins = &self.pooled.pins;
                // (A killCursors's pin ends in observe_reply, when the server accepted it.)
                if route.ends_txn {
                    if let Some(t) = &route.txn {
                        pins.unpin_txn(&self.pin_key(t));
                    }
                }
                self.handed_over = link.release();
            }
        }
    }

    fn handed_over(&mut self) -> bool {
        std::mem::take(&mut self.handed_over)
    }

    fn aborted(&mut self, link: Conn, ok: bool, route: &Routing) {
        if let Some(t) = &route.txn {
            self.pooled.pins.unpin_txn(&self.pin_key(t));
        }
        if self.pooled.topology.load_balanced() {
            let outcome = if ok {
                Outcome::Replied
            } else {
                Outcome::Broken
            };
            if let Some(link) = self.settle_balanced(link, &outcome, route, true) {
                link.release();
            }
            return;
        }
        if ok {
            link.release();
        } else {
            link.discard();
        }
    }

    fn not_primary(&mut self, host: &Host, route: &Routing, resent: bool) -> AfterNotPrimary {
        if let Some(txn) = &route.txn {
            // A transaction lives on one node: a re-send would go back to the pinned, stale
            // server. Drop the pin and relay the error (mongod labels it
            // TransientTransactionError, so the driver retries the whole transaction).
            self.pooled.pins.unpin_txn(&self.pin_key(txn));
            return AfterNotPrimary::Relay;
        }
        if resent || self.on_kept {
            // A getLastError answers for its own connection: never elsewhere.
            return AfterNotPrimary::Relay;
        }
        debug!(upstream = %host, "not primary; re-sending to the new primary");
        AfterNotPrimary::Resend
    }

    fn close(&mut self) {
        self.release_kept();
    }
}
