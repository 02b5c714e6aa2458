//! Pooled mode: mongoguard authenticates clients itself, answers their hello, and runs each
//! request on a pre-authenticated upstream connection checked out for exactly one round
//! trip (the whole stream, for exhaust), then returned.
//!
//! Shared state ([`Pooled`]): the users file, the upstream identities, the topology, the
//! pools, and the pin maps (cursor → server, transaction → server) that keep a cursor's
//! getMores and a transaction's statements on the server that holds them. A client session
//! ([`run`]) holds no upstream connection between requests, except right after a legacy
//! fire-and-forget write, whose getLastError must run on the same connection.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicI32, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use bson::{RawDocument, RawDocumentBuf};
use tokio::time::Instant;
use tokio_util::{codec::FramedRead, sync::CancellationToken};
use tracing::{debug, warn};

use super::{
    client_io::{
        bounded_write, receive, send_to_client, wait_for_request, watch_client, Incoming, Limits,
        Next, Side,
    },
    error::SessionError,
    guard::{self, Who},
    hello::{self, ClientMetadata, HelloAuth},
    inspect::{inspect_with, Request},
    observe::SessionObs,
    routing::{self, Class, CursorReply, Routing},
    session::{
        abort_timeout, reply_more_to_come, send_reply, sleep_unless_zero, upstream_error, End,
        Reader, NOT_PRIMARY_CODES,
    },
    Context, Counter, ProxyError,
};
use crate::{
    auth::{
        sasl::{self, SaslSession},
        users::Users,
    },
    config::Config,
    upstream::{
        pool::{Checkout, Pool, PoolError, PoolKey},
        topology::{Kind, MongoConnector, MonitorSettings, ReadPref, Topology},
        Host, Identities, Identity, UpstreamConn,
    },
    wire::{builder::error_document, Frame, Message, MessageCodec, WireError},
};

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

/// Entries in the cursor map beyond this are not recorded (their getMores then follow the
/// read preference); mongod's own default cursor timeout bounds their useful life.
const CURSOR_MAP_CAP: usize = 100_000;
const CURSOR_TTL: Duration = Duration::from_secs(30 * 60);
/// Longer than mongod's transactionLifetimeLimitSeconds (60 s) default.
const TXN_TTL: Duration = Duration::from_secs(5 * 60);

/// How long the reply of a client that left mid-request is still awaited, so that its
/// upstream connection can be reused; past it the connection is discarded.
const ABANDONED_REPLY_BUDGET: Duration = Duration::from_secs(1);

/// mongod's codes used by pooled mode.
const UNAUTHORIZED: (i32, &str) = (13, "Unauthorized");
const HOST_UNREACHABLE: (i32, &str) = (6, "HostUnreachable");
const FAILED_TO_SATISFY_READ_PREFERENCE: (i32, &str) = (133, "FailedToSatisfyReadPreference");
/// A full pool: mongoguard's own code, outside every code drivers retry (PROTOCOL.md), so
/// a saturated pool does not turn into a retry storm.
pub const CHECKOUT_TIMEOUT_CODE: i32 = 65_002;
/// The codeName paired with [`CHECKOUT_TIMEOUT_CODE`].
pub const CHECKOUT_TIMEOUT_CODE_NAME: &str = "MongoguardPoolTimeout";

/// Transactions pinned beyond this are refused a pin (their statements then follow the
/// primary); mongod's transactionLifetimeLimitSeconds bounds their useful life anyway.
const TXN_MAP_CAP: usize = 100_000;
/// mongod's code for a malformed argument (an `lsid.id` that is not a UUID).
const BAD_VALUE: (i32, &str) = (2, "BadValue");

/// The pooled-mode state shared by every session.
pub(crate) struct Pooled {
    /// The users file in force (replaced whole on SIGHUP).
    users: std::sync::RwLock<Option<Arc<Users>>>,
    users_file: Option<std::path::PathBuf>,
    identities: Identities,
    pub topology: Arc<Topology>,
    pub pool: Pool<MongoConnector>,
    cursors: Mutex<HashMap<i64, (Host, Instant)>>,
    txns: Mutex<HashMap<Vec<u8>, (i64, Host, Instant)>>,
    pub pinned: PinnedCounts,
    connection_ids: AtomicI32,
    cancel: CancellationToken,
}

impl Pooled {
    /// Loads the users file and identities, and starts the topology monitors and the pool
    /// maintenance. Every user must map to a configured identity.
    pub(crate) fn start(
        config: &Config,
        upstream_tls: Option<crate::tls::UpstreamTls>,
    ) -> Result<Arc<Pooled>, ProxyError> {
        let identities = Identities::from_config(&config.upstream)
            .map_err(|e| ProxyError::Pooled(e.to_string()))?;
        let users = match &config.auth.users_file {
            Some(path) => Some(Arc::new(
                load_users(path, &identities).map_err(ProxyError::Pooled)?,
            )),
            None => None,
        };
        let topology = Topology::from_uri(&config.upstream.uri);
        let connector = MongoConnector::new(
            identities.clone(),
            topology.clone(),
            config.upstream.connect_timeout,
            config.proxy.max_message_size,
            upstream_tls.clone(),
        );
        let pool = Pool::new(connector, config.pool.pool_config())
            .map_err(|e| ProxyError::Pooled(e.to_string()))?;
        let cancel = CancellationToken::new();
        topology.spawn_monitors(
            MonitorSettings {
                heartbeat: config.upstream.heartbeat_interval,
                connect_timeout: config.upstream.connect_timeout,
                max_message_size: config.proxy.max_message_size,
                tls: upstream_tls,
            },
            cancel.clone(),
        );
        if *topology.kind() == Kind::Single {
            // Known ahead of the first client, so min_idle connections open at once.
            for host in &config.upstream.uri.hosts {
                pool.register(&PoolKey::new(
                    host.clone(),
                    crate::upstream::DEFAULT_IDENTITY,
                ));
            }
        }
        let pooled = Arc::new(Pooled {
            users: std::sync::RwLock::new(users),
            users_file: config.auth.users_file.clone(),
            identities,
            topology,
            pool,
            cursors: Mutex::new(HashMap::new()),
            txns: Mutex::new(HashMap::new()),
            pinned: PinnedCounts::default(),
            connection_ids: AtomicI32::new(1),
            cancel,
        });
        tokio::spawn(maintain(pooled.clone()));
        Ok(pooled)
    }

    /// The users file in force.
    fn users(&self) -> Option<Arc<Users>> {
        self.users
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// True when a users file is configured (SIGHUP reloads it).
    pub(crate) fn has_users_file(&self) -> bool {
        self.users_file.is_some()
    }

    /// Reads the users file again and swaps it in if it is valid (every user mapping to a
    /// configured identity); otherwise the users in force stay. Connections already
    /// authenticated keep their user. Returns the number of users.
    pub(crate) fn reload_users(&self) -> Result<usize, String> {
        let Some(path) = &self.users_file else {
            return Err("no auth.users_file configured".into());
        };
        let users = load_users(path, &self.identities)?;
        let n = users.len();
        *self.users.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(users));
        Ok(n)
    }

    /// Stops monitors and maintenance and closes the pools.
    pub(crate) fn close(&self) {
        self.cancel.cancel();
        self.pool.close();
    }

    fn cursor_server(&self, id: i64) -> Option<Host> {
        let mut map = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        map.get_mut(&id).map(|(h, seen)| {
            *seen = Instant::now();
            h.clone()
        })
    }

    fn pin_cursor(&self, id: i64, host: &Host) {
        let mut map = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= CURSOR_MAP_CAP && !map.contains_key(&id) {
            warn!(
                cap = CURSOR_MAP_CAP,
                "cursor map full; this cursor is not pinned"
            );
            return;
        }
        map.insert(id, (host.clone(), Instant::now()));
        self.pinned.cursor.set(map.len() as u64);
    }

    fn unpin_cursor(&self, id: i64) {
        let mut map = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(&id);
        self.pinned.cursor.set(map.len() as u64);
    }

    fn txn_server(&self, key: &routing::TxnKey) -> Option<Host> {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(&key.lsid) {
            Some((n, h, seen)) if *n == key.txn_number => {
                *seen = Instant::now();
                Some(h.clone())
            }
            _ => None,
        }
    }

    fn pin_txn(&self, key: &routing::TxnKey, host: &Host) {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= TXN_MAP_CAP && !map.contains_key(&key.lsid) {
            warn!(
                cap = TXN_MAP_CAP,
                "transaction map full; this transaction is not pinned"
            );
            return;
        }
        map.insert(
            key.lsid.clone(),
            (key.txn_number, host.clone(), Instant::now()),
        );
        self.pinned.transaction.set(map.len() as u64);
    }

    fn unpin_txn(&self, key: &routing::TxnKey) {
        let mut map = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        if map
            .get(&key.lsid)
            .is_some_and(|(n, _, _)| *n == key.txn_number)
        {
            map.remove(&key.lsid);
        }
        self.pinned.transaction.set(map.len() as u64);
    }

    fn expire_pins(&self) {
        let now = Instant::now();
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors.retain(|_, (_, seen)| now.duration_since(*seen) < CURSOR_TTL);
        self.pinned.cursor.set(cursors.len() as u64);
        drop(cursors);
        let mut txns = self.txns.lock().unwrap_or_else(PoisonError::into_inner);
        txns.retain(|_, (_, _, seen)| now.duration_since(*seen) < TXN_TTL);
        self.pinned.transaction.set(txns.len() as u64);
    }
}

/// Reads and checks a users file: every user must map to a configured upstream identity.
fn load_users(path: &std::path::Path, identities: &Identities) -> Result<Users, String> {
    let users = Users::load(path).map_err(|e| e.to_string())?;
    for user in users.iter() {
        let id = user
            .upstream
            .as_deref()
            .unwrap_or(crate::upstream::DEFAULT_IDENTITY);
        if identities.get(id).is_none() {
            return Err(format!(
                "users file: user {:?} maps to upstream identity {id:?}, which is not \
                 configured under [upstream.identities]",
                user.name
            ));
        }
    }
    Ok(users)
}

/// Every second: close expired idle connections, open up to `min_idle`, expire pins.
async fn maintain(pooled: Arc<Pooled>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = pooled.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pooled.pool.maintain().await {
            debug!(error = %e, "pool maintenance could not open min_idle connections");
        }
        pooled.expire_pins();
    }
}

struct Session {
    ctx: Arc<Context>,
    pooled: Arc<Pooled>,
    client_in: Reader,
    client_out: crate::net::ClientWrite,
    peer: SocketAddr,
    max: usize,
    limits: Limits,
    metadata: Option<ClientMetadata>,
    connection_id: i32,
    sasl: SaslSession,
    /// The upstream identity requests run as: set by authentication (or at once when
    /// unauthenticated access is allowed).
    identity: Option<Arc<Identity>>,
    /// `db.user` the client authenticated as, for the policy and records.
    user: Option<String>,
    pending: Option<Frame>,
    last_blocked: Option<String>,
    /// The connection of a legacy fire-and-forget write, kept for its getLastError.
    sticky: Option<Checkout<UpstreamConn>>,
    drain: CancellationToken,
    kill: CancellationToken,
    obs: SessionObs,
}

/// Runs one client connection in pooled mode.
pub(crate) async fn run(
    ctx: Arc<Context>,
    socket: crate::net::ClientStream,
    peer: SocketAddr,
) -> Result<End, SessionError> {
    let Some(pooled) = ctx.pooled.clone() else {
        return Err(SessionError::UpstreamClosed);
    };
    let (read, write) = socket.split();
    let max = ctx.config.proxy.max_message_size;
    let identity = ctx
        .config
        .auth
        .allow_unauthenticated
        .then(|| pooled.identities.default_identity().clone());
    let mut s = Session {
        client_in: FramedRead::new(read, MessageCodec::new(max)),
        client_out: write,
        peer,
        max,
        limits: Limits::from_config(&ctx.config.proxy),
        metadata: None,
        connection_id: pooled.connection_ids.fetch_add(1, Ordering::Relaxed),
        sasl: SaslSession::new(),
        identity,
        user: None,
        pending: None,
        last_blocked: None,
        sticky: None,
        drain: ctx.drain.child_token(),
        kill: ctx.kill.child_token(),
        obs: SessionObs::new(ctx.metrics.clone()),
        pooled,
        ctx,
    };
    let result = s.serve().await;
    if let Some(sticky) = s.take_sticky() {
        s.release(sticky);
    }
    result
}

impl Session {
    async fn serve(&mut self) -> Result<End, SessionError> {
        loop {
            self.obs.end();
            let incoming = match self.pending.take() {
                Some(f) => Incoming::Frame(f, None),
                None => self.next_request().await?,
            };
            let started = self.obs.begin();
            let received = match receive(
                &self.ctx,
                &mut self.client_out,
                incoming,
                self.limits,
                &self.kill,
            )
            .await?
            {
                Next::Request(r) => r,
                Next::Refused => continue,
                Next::End(end) => return Ok(end),
            };
            let frame = &received.frame;
            let mut routing = Routing::default();
            let request = self.inspect(frame, received.inner.as_ref(), &mut routing)?;
            if let Some(meta) = &request.metadata {
                self.metadata = Some(super::session::record_handshake(&self.ctx, self.peer, meta));
            }
            self.obs
                .inspected(&request, self.metadata.as_ref(), started);
            // A kept legacy-write connection serves only that write's getLastError.
            if let Some(sticky) = self.take_sticky() {
                if request.is_get_last_error && self.last_blocked.is_none() {
                    self.round_trip_on(sticky, frame, &request, &routing)
                        .await?;
                    continue;
                }
                self.release(sticky);
            }
            match routing.class() {
                Class::Hello => {
                    self.answer_hello(&received, &request).await?;
                    continue;
                }
                Class::SaslStart | Class::SaslContinue | Class::OtherAuth => {
                    self.answer_auth(&received, &request, routing.class())
                        .await?;
                    continue;
                }
                Class::Ping if self.identity.is_none() => {
                    let ok = bson::rawdoc! {"ok": 1.0};
                    self.reply(&request, &ok).await?;
                    continue;
                }
                _ => {}
            }
            if routing.bad_lsid {
                let doc = error_document(
                    BAD_VALUE.0,
                    BAD_VALUE.1,
                    "lsid.id must be a UUID (BSON binary subtype 4, 16 bytes)",
                );
                self.reply(&request, &doc).await?;
                continue;
            }
            let Some(identity) = self.identity.clone() else {
                let doc = error_document(
                    UNAUTHORIZED.0,
                    UNAUTHORIZED.1,
                    "command requires authentication (mongoguard pooled mode: authenticate \
                     with the credentials of the mongoguard users file)",
                );
                self.reply(&request, &doc).await?;
                continue;
            };
            match guard::local_answer(&self.ctx, &request, &mut self.last_blocked) {
                guard::Local::Forward => {}
                guard::Local::Handled { answer, abort } => {
                    let blocked = matches!(request.judgement, guard::Judgement::Block { .. });
                    self.obs.answered_locally(blocked);
                    if let Some(abort) = abort {
                        self.abort_transaction(abort, &identity, &routing).await;
                    }
                    if let Some(doc) = answer {
                        self.reply(&request, &doc).await?;
                    }
                    continue;
                }
            }
            self.forward(frame, &request, &routing, &identity).await?;
        }
    }

    fn inspect(
        &mut self,
        frame: &Frame,
        inner: Option<&Frame>,
        routing: &mut Routing,
    ) -> Result<Request, SessionError> {
        let meta = self.metadata.as_ref();
        let who = Who {
            peer: self.peer,
            app: meta.and_then(|m| m.application.as_deref()),
            driver: meta.and_then(|m| m.driver.as_deref()),
            user: self.user.as_deref(),
            upstream_wire_version: self.pooled.topology.max_wire_version(),
        };
        let request_id = frame.header().request_id;
        inspect_with(frame, inner, self.max, self.metadata.is_none(), |msg| {
            *routing = routing::of_message(msg);
            match routing.class() {
                // mongoguard answers these itself; nothing to judge.
                Class::Hello | Class::SaslStart | Class::SaslContinue | Class::OtherAuth => {
                    guard::Judgement::Forward
                }
                _ => guard::judge(&self.ctx, msg, &who, request_id, &mut self.obs.scratch),
            }
        })
        .map_err(SessionError::ClientProtocol)
    }

    async fn reply(&mut self, request: &Request, doc: &RawDocument) -> Result<(), SessionError> {
        if !request.expects_reply {
            return Ok(());
        }
        send_reply(
            &self.ctx,
            &mut self.client_out,
            request.op,
            request.request_id,
            doc,
            self.limits.write,
            &self.kill,
        )
        .await
    }

    /// The command body of a hello or authentication message (decompressed, unwrapped).
    fn body(&self, received: &super::client_io::Received) -> Result<RawDocumentBuf, SessionError> {
        let frame = received.inner.as_ref().unwrap_or(&received.frame);
        let result = match Message::parse(frame.bytes(), self.max) {
            Ok(Message::Msg(m)) => Ok(m.body().to_owned()),
            Ok(Message::Query(q)) => Ok(q.command().to_owned()),
            Ok(other) => Err(WireError::UnknownOpCode(other.op_code() as i32)),
            Err(e) => Err(e),
        };
        result.map_err(SessionError::ClientProtocol)
    }

    async fn answer_hello(
        &mut self,
        received: &super::client_io::Received,
        request: &Request,
    ) -> Result<(), SessionError> {
        let cmd = self.body(received)?;
        let timeout = self.ctx.config.upstream.connect_timeout;
        let facts = match self.pooled.topology.facts(Duration::ZERO).await {
            Some(f) => Some(f),
            None => self.learn_facts(timeout).await,
        };
        let Some(facts) = facts else {
            let doc = error_document(
                HOST_UNREACHABLE.0,
                HOST_UNREACHABLE.1,
                "mongoguard: no upstream server has answered hello yet",
            );
            return self.reply(request, &doc).await;
        };
        let mut auth = HelloAuth::default();
        if let Some(users) = self.pooled.users().as_deref() {
            if let Ok(Some(bson::RawBsonRef::String(who))) = cmd.get("saslSupportedMechs") {
                auth.mechanisms = Some(sasl::supported_mechs(users, who));
            }
            if self.user.is_none() {
                if let Ok(Some(bson::RawBsonRef::Document(spec))) =
                    cmd.get("speculativeAuthenticate")
                {
                    auth.speculative = self.sasl.speculative_authenticate(users, spec);
                }
            }
        }
        let doc = hello::emulated_reply(&cmd, &facts, self.connection_id, auth);
        self.reply(request, &doc).await
    }

    /// A single upstream server is not monitored: its limits come from a pooled connection.
    async fn learn_facts(&mut self, timeout: Duration) -> Option<Arc<crate::upstream::HelloFacts>> {
        let topo = &self.pooled.topology;
        if *topo.kind() != Kind::Single {
            return topo.facts(timeout).await;
        }
        let host = topo.select(ReadPref::Primary, timeout).await.ok()?;
        let identity = self.pooled.identities.default_identity().name.clone();
        match self
            .pooled
            .pool
            .checkout(&PoolKey::new(host, identity))
            .await
        {
            Ok(c) => {
                let facts = c.facts().clone();
                c.release();
                Some(facts)
            }
            Err(e) => {
                warn!(error = %e, "cannot reach the upstream for its hello");
                None
            }
        }
    }

    async fn answer_auth(
        &mut self,
        received: &super::client_io::Received,
        request: &Request,
        class: Class,
    ) -> Result<(), SessionError> {
        let refuse = |msg: &str| error_document(UNAUTHORIZED.0, UNAUTHORIZED.1, msg);
        let doc = if self.user.is_some() {
            refuse(
                "mongoguard: this connection is already authenticated; authentication commands \
                 after the handshake are refused (open a new connection to change users)",
            )
        } else if class == Class::OtherAuth {
            refuse("mongoguard pooled mode supports SCRAM-SHA-256 and SCRAM-SHA-1 (saslStart) only")
        } else if let Some(users) = self.pooled.users() {
            let users = &*users;
            let cmd = self.body(received)?;
            if class == Class::SaslStart {
                self.sasl.sasl_start(users, &cmd)
            } else {
                self.sasl.sasl_continue(&cmd)
            }
        } else {
            sasl::auth_failed()
        };
        self.reply(request, &doc).await?;
        if sasl::is_failure(&doc) {
            let user = self
                .sasl
                .attempted_user()
                .filter(|_| class != Class::OtherAuth);
            let client = self.peer;
            let event = crate::audit::Event::AuthFailed { client, user };
            self.ctx.audit.event(event);
        }
        self.after_auth_step();
        Ok(())
    }

    /// Binds the session to the user's upstream identity once a conversation completed.
    fn after_auth_step(&mut self) {
        if self.user.is_some() {
            return;
        }
        let Some(user) = self.sasl.authenticated() else {
            return;
        };
        let Some(users) = self.pooled.users() else {
            return;
        };
        let mapped = users
            .user(&user.db, &user.name)
            .and_then(|u| u.upstream.as_deref())
            .unwrap_or(crate::upstream::DEFAULT_IDENTITY);
        let Some(identity) = self.pooled.identities.get(mapped) else {
            return;
        };
        debug!(user = %user.name, db = %user.db, identity = %identity.name, "client authenticated");
        self.ctx
            .audit
            .event_with(|| crate::audit::Event::AuthSucceeded {
                client: self.peer,
                user: format!("{}.{}", user.db, user.name),
                mechanism: user.mechanism.name(),
                identity: identity.name.to_string(),
            });
        self.user = Some(format!("{}.{}", user.db, user.name));
        self.identity = Some(identity.clone());
    }

    /// Where the request goes: the server of its cursor or transaction, else by read
    /// preference (writes and transactions: the primary).
    async fn choose_server(&self, request: &Request, routing: &Routing) -> Result<Host, String> {
        let p = &self.pooled;
        if p.topology.is_multi_server() {
            if let Some(id) = routing.cursor {
                if let Some(h) = p.cursor_server(id) {
                    return Ok(h);
                }
            }
            if let Some(t) = &routing.txn {
                if let Some(h) = p.txn_server(t) {
                    return Ok(h);
                }
            }
        }
        let pref = if request.is_write || routing.txn.is_some() {
            ReadPref::Primary
        } else {
            routing.read_pref
        };
        let timeout = self.ctx.config.upstream.server_selection_timeout;
        let host = tokio::select! {
            biased;
            _ = self.kill.cancelled() => return Err("mongoguard is shutting down".into()),
            h = p.topology.select(pref, timeout) => h.map_err(|e| e.to_string())?,
        };
        if let Some(t) = &routing.txn {
            if routing.starts_txn {
                p.pin_txn(t, &host);
            }
        }
        Ok(host)
    }

    async fn forward(
        &mut self,
        frame: &Frame,
        request: &Request,
        routing: &Routing,
        identity: &Arc<Identity>,
    ) -> Result<(), SessionError> {
        let mut resent = false;
        loop {
            let host = match self.choose_server(request, routing).await {
                Ok(h) => h,
                Err(e) => {
                    let doc = error_document(
                        FAILED_TO_SATISFY_READ_PREFERENCE.0,
                        FAILED_TO_SATISFY_READ_PREFERENCE.1,
                        &format!("mongoguard: {e}"),
                    );
                    return self.reply(request, &doc).await;
                }
            };
            let key = PoolKey::new(host.clone(), identity.name.clone());
            let checkout = tokio::select! {
                biased;
                _ = self.kill.cancelled() => return Err(SessionError::Killed),
                c = self.pooled.pool.checkout(&key) => c,
            };
            let checkout = match checkout {
                Ok(c) => c,
                Err(e) => return self.checkout_failed(request, &host, e).await,
            };
            let reply = match self
                .round_trip_on(checkout, frame, request, routing)
                .await?
            {
                Trip::Done => return Ok(()),
                Trip::NotPrimary(reply) => reply,
            };
            // Not executed: the server is no longer primary.
            self.pooled.topology.mark_unknown(&host);
            if let Some(txn) = &routing.txn {
                // A transaction lives on one node: a resend would go back to the pinned, stale
                // server. Drop the pin and relay the error (mongod labels it
                // TransientTransactionError, so the driver retries the whole transaction).
                self.pooled.unpin_txn(txn);
            }
            if resent || routing.txn.is_some() {
                debug!(upstream = %host, "not primary; relaying the error");
                return self.relay_stale(request, reply).await;
            }
            // Wait for the new primary and send it there, once.
            debug!(upstream = %host, "not primary; re-sending to the new primary");
            resent = true;
        }
    }

    /// Relays a not-primary reply that will not be retried.
    async fn relay_stale(&mut self, request: &Request, reply: Frame) -> Result<(), SessionError> {
        if !request.expects_reply {
            return Ok(());
        }
        send_to_client(
            &mut self.client_out,
            reply.bytes(),
            self.limits.write,
            &self.kill,
        )
        .await
    }

    async fn checkout_failed(
        &mut self,
        request: &Request,
        host: &Host,
        e: PoolError,
    ) -> Result<(), SessionError> {
        let doc = match &e {
            PoolError::CheckoutTimeout { .. } => {
                warn!(error = %e, "checkout timeout");
                error_document(
                    CHECKOUT_TIMEOUT_CODE,
                    CHECKOUT_TIMEOUT_CODE_NAME,
                    &format!("mongoguard: {e}"),
                )
            }
            PoolError::Connect { .. } => {
                warn!(error = %e, "cannot open an upstream connection");
                self.pooled.topology.mark_unknown(host);
                error_document(
                    HOST_UNREACHABLE.0,
                    HOST_UNREACHABLE.1,
                    &format!("mongoguard: {e}"),
                )
            }
            PoolError::Closed { .. } => return Err(SessionError::Killed),
        };
        self.reply(request, &doc).await
    }

    /// Sends the request on `checkout` and relays its reply (or exhaust stream). The
    /// connection goes back to the pool only after a complete exchange; any error, timeout,
    /// or a client that leaves mid-request discards it.
    async fn round_trip_on(
        &mut self,
        mut checkout: Checkout<UpstreamConn>,
        frame: &Frame,
        request: &Request,
        routing: &Routing,
    ) -> Result<Trip, SessionError> {
        let sent = std::time::Instant::now();
        let reply_timeout = self.ctx.config.upstream.reply_timeout;
        let send = checkout.send(frame.bytes());
        let written = bounded_write(send, reply_timeout, &self.kill, Side::Upstream).await;
        if let Err(e) = written {
            checkout.discard();
            return Err(e);
        }
        self.ctx.stats.requests.inc();
        if !request.expects_reply {
            if routing.class() == Class::LegacyWrite {
                self.pooled.pinned.legacy_write.inc();
                self.sticky = Some(checkout);
            } else {
                self.release(checkout);
            }
            return Ok(Trip::Done);
        }
        let multi = self.pooled.topology.is_multi_server();
        let retry_not_primary = matches!(self.pooled.topology.kind(), Kind::ReplicaSet(_));
        let host = checkout.host().clone();
        let mut expected = request.request_id;
        let mut first = true;
        let mut streaming = false;
        // Set when the client left before its reply: the reply is still read (within
        // ABANDONED_REPLY_BUDGET) so the connection can go back to the pool clean. Drivers do
        // this on close: the Node driver sends endSessions and closes without waiting.
        let mut client_gone = false;
        // A large message the client started meanwhile is not read on (see watch_client).
        let mut client_paused = false;
        let result = loop {
            let budget = if client_gone {
                match reply_timeout.is_zero() {
                    true => ABANDONED_REPLY_BUDGET,
                    false => reply_timeout.min(ABANDONED_REPLY_BUDGET),
                }
            } else {
                reply_timeout
            };
            let timer = sleep_unless_zero(budget);
            tokio::pin!(timer);
            let reply = tokio::select! {
                biased;
                _ = self.kill.cancelled() => break Err(SessionError::Killed),
                next = checkout.next() => match next {
                    None => break Err(SessionError::UpstreamClosed),
                    Some(Err(e)) => break Err(upstream_error(e)),
                    Some(Ok(f)) => f,
                },
                next = watch_client(&mut self.client_in),
                    if self.pending.is_none() && !client_gone && !client_paused =>
                {
                    match next {
                        Err(SessionError::ClientGone) if streaming => {
                            break Err(SessionError::ClientGone)
                        }
                        Err(SessionError::ClientGone) => client_gone = true,
                        Err(e) => break Err(e),
                        Ok(Some(f)) => self.pending = Some(f),
                        Ok(None) => client_paused = true,
                    }
                    continue;
                }
                _ = &mut timer => break Err(if client_gone {
                    SessionError::ClientGone
                } else {
                    SessionError::ReplyTimeout(reply_timeout)
                }),
            };
            if reply.header().response_to != expected {
                break Err(SessionError::UpstreamProtocol(WireError::bad_doc(
                    "upstream reply",
                    format!(
                        "responseTo {} does not answer request {expected}",
                        reply.header().response_to
                    ),
                )));
            }
            expected = reply.header().request_id;
            let more = match reply_more_to_come(&reply, request, self.max) {
                Ok(m) => m,
                Err(e) => break Err(SessionError::UpstreamProtocol(e)),
            };
            // One parse of the reply serves every reader: the not-primary retry (first
            // reply of a replica-set request), the metrics and the cursor pins.
            let check_primary = first && !more && retry_not_primary && !request.is_hello;
            let facts = (check_primary || multi || (first && self.obs.wants_first_reply()))
                .then(|| routing::ReplyFacts::read(&reply));
            if let Some(facts) = &facts {
                if check_primary && facts.code.is_some_and(|c| NOT_PRIMARY_CODES.contains(&c)) {
                    break Ok(Trip::NotPrimary(reply));
                }
                if first {
                    self.obs.first_reply_error(facts.error);
                }
            }
            first = false;
            if more && !streaming {
                streaming = true;
                self.pooled.pinned.exhaust.inc();
            }
            if let (true, Some(facts)) = (multi, &facts) {
                match &facts.cursor {
                    CursorReply::Open(id) if routing.may_open_cursor => {
                        self.pooled.pin_cursor(*id, &host)
                    }
                    CursorReply::Closed => {
                        if let Some(id) = routing.cursor {
                            self.pooled.unpin_cursor(id);
                        }
                    }
                    _ => {}
                }
            }
            if client_gone {
                // Nobody to relay to; an exhaust stream cannot be cut short cleanly.
                if more {
                    break Err(SessionError::ClientGone);
                }
                break Ok(Trip::Done);
            }
            let limit = self.limits.write;
            if let Err(e) =
                send_to_client(&mut self.client_out, reply.bytes(), limit, &self.kill).await
            {
                break Err(e);
            }
            if !more {
                break Ok(Trip::Done);
            }
        };
        if streaming {
            self.pooled.pinned.exhaust.dec();
        }
        match result {
            Ok(trip) => {
                // Killing a cursor ends its pin even when the reply lists it as killed.
                if multi && routing.kills_cursor {
                    if let Some(id) = routing.cursor {
                        self.pooled.unpin_cursor(id);
                    }
                }
                if routing.ends_txn {
                    if let Some(t) = &routing.txn {
                        self.pooled.unpin_txn(t);
                    }
                }
                self.release(checkout);
                if client_gone {
                    return Err(SessionError::ClientGone);
                }
                if matches!(trip, Trip::Done) {
                    self.obs.forwarded(sent.elapsed());
                }
                Ok(trip)
            }
            Err(e) => {
                // Mid-exchange: the connection's state is unknown. Dropping the checkout
                // discards it; the pool never hands it out again.
                checkout.discard();
                Err(e)
            }
        }
    }

    fn release(&self, checkout: Checkout<UpstreamConn>) {
        checkout.release();
    }

    /// Takes the connection kept after a legacy write (and stops counting it as pinned).
    fn take_sticky(&mut self) -> Option<Checkout<UpstreamConn>> {
        let sticky = self.sticky.take()?;
        self.pooled.pinned.legacy_write.dec();
        Some(sticky)
    }

    /// Sends abortTransaction for a blocked statement of a transaction to the transaction's
    /// server, best effort (a transaction that never started is already gone).
    async fn abort_transaction(
        &mut self,
        abort: &RawDocumentBuf,
        identity: &Arc<Identity>,
        routing: &Routing,
    ) {
        let Some(txn) = &routing.txn else { return };
        let Some(host) = self.pooled.txn_server(txn) else {
            return;
        };
        let key = PoolKey::new(host, identity.name.clone());
        let checkout = tokio::select! {
            biased;
            _ = self.kill.cancelled() => return,
            c = self.pooled.pool.checkout(&key) => c,
        };
        let Ok(mut checkout) = checkout else {
            return;
        };
        let reply_timeout = self.ctx.config.upstream.reply_timeout;
        let id = self.ctx.request_ids.next();
        let bytes = crate::wire::builder::encode_msg_reply(id, 0, abort);
        let done = async {
            checkout.send(&bytes).await.ok()?;
            match checkout.next().await {
                Some(Ok(f)) if f.header().response_to == id => Some(()),
                _ => None,
            }
        };
        let ok = tokio::select! {
            biased;
            _ = self.kill.cancelled() => Ok(None),
            r = tokio::time::timeout(abort_timeout(reply_timeout), done) => r,
        };
        self.pooled.unpin_txn(txn);
        match ok {
            Ok(Some(())) => {
                debug!("aborted the transaction of a blocked command");
                checkout.release();
            }
            _ => checkout.discard(),
        }
    }

    async fn next_request(&mut self) -> Result<Incoming, SessionError> {
        // Between requests a pooled session holds no upstream connection to watch.
        wait_for_request(
            &mut self.client_in,
            &self.drain,
            &self.kill,
            self.limits,
            &self.ctx.budget,
            std::future::pending(),
        )
        .await
    }
}

/// How a round trip ended.
enum Trip {
    /// The reply was relayed.
    Done,
    /// The server answered "not primary" (nothing relayed yet): the reply, to re-send the
    /// request to the new primary or relay it.
    NotPrimary(Frame),
}
