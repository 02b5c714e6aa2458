//! One client connection, in either mode: the request pipeline.
//!
//! ```text
//! wait for a request ─► receive (budget, decompress) ─► inspect + judge ─► record
//!     ▲                                                                      │
//!     │        ┌───────── answered locally (strategy: hello, auth; guard: blocked) ◄┤
//!     │        │                                                                     │
//!     └────────┴── relay the reply / exhaust stream ◄── acquire + send ◄─────────────┘
//! ```
//!
//! The upstream side is a [`Strategy`]: passthrough keeps one connection per client,
//! pooled mode checks one out per request. Everything else — the timeouts, the kill and drain
//! tokens, the relay loop, responseTo checks, moreToCome, the abort of a blocked transaction,
//! not-primary handling — is here, once.
//!
//! MongoDB clients do not pipeline: a connection carries one request at a time, except for
//! moreToCome requests (no reply) and exhaust streams (several replies). The session therefore
//! has two states, waiting for a request and waiting for replies, and in each it watches the
//! client, the upstream, the timers and the shutdown tokens, so nothing can hang it.

mod relay;

use std::{
    net::SocketAddr,
    sync::{atomic::Ordering::Relaxed, Arc},
};

use bson::RawDocument;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    client_io::{
        receive, send_own_reply, send_to_client, wait_for_request, Incoming, Limits, Next, Reader,
    },
    error::SessionError,
    guard::{self, Judgement, Who},
    hello::ClientMetadata,
    inspect::{inspect_with, Request},
    measure::{measure, LinkState, MeasurePlan, Measured},
    observe::SessionObs,
    strategy::{Acquired, AfterNotPrimary, Link, Outcome, Strategy},
    Context,
};
use crate::{
    net::{ClientStream, ClientWrite},
    wire::{Frame, Index, Message},
};

pub(crate) use super::client_io::End;
pub(crate) use relay::{primary_moved, reply_more_to_come};

/// The client side of a session: its socket halves, limits, shutdown tokens, and what it
/// sent ahead while a request was in flight.
pub(crate) struct Client {
    pub ctx: Arc<Context>,
    pub input: Reader,
    pub out: ClientWrite,
    pub peer: SocketAddr,
    pub limits: Limits,
    /// The connection's kill and the proxy's drain, as this session task waits on them at
    /// every await (lock-free; see [`super::stop`]).
    pub stop: super::stop::Stop,
    /// The connection's kill token (a child of the proxy's: an operator's kill of this one
    /// connection, or the drain deadline), for waits that take a `CancellationToken`.
    pub kill: CancellationToken,
    /// The idle timeout between requests and the reply timeout, re-armed per request
    /// without a timer registration each (see [`super::timer`]).
    pub idle_timer: super::timer::LazyTimer,
    pub reply_timer: super::timer::LazyTimer,
    /// The connection as the operator sees it (`/connections`).
    pub conn: Arc<crate::proxy::control::Connection>,
    /// A request the client sent while its previous one was still in flight.
    pub pending: Option<Frame>,
    /// The client left with a request in flight (its reply is read, not relayed).
    pub gone: bool,
}

impl Client {
    /// Answers `request` with mongoguard's own `doc`, in the request's opcode family, within
    /// the client write timeout. Nothing is sent for a request that expects no reply.
    pub(crate) async fn reply(
        &mut self,
        request: &Request,
        doc: &RawDocument,
    ) -> Result<(), SessionError> {
        if !request.expects_reply {
            return Ok(());
        }
        let (op, id, limit) = (request.op, request.request_id, self.limits.write);
        send_own_reply(&self.ctx, &mut self.out, op, id, doc, limit, &self.stop).await
    }
}

/// One client connection and its upstream strategy.
pub(crate) struct Session<S: Strategy> {
    ctx: Arc<Context>,
    client: Client,
    strategy: S,
    max: usize,
    metadata: Option<ClientMetadata>,
    /// The upstream's maxWireVersion, from a hello reply relayed to this client.
    wire_version: Option<i32>,
    /// The error of the last fire-and-forget write mongoguard dropped, for the client's next
    /// getLastError (legacy applications learn about write errors only that way).
    last_blocked: Option<String>,
    obs: SessionObs,
    /// Pooled mode: the compressor of the request being served, when the client compressed
    /// it (its reply is compressed the same way; the upstream gets it decompressed).
    reply_compressor: Option<crate::wire::Compressor>,
}

/// The refusal of a connection over `pool.max_connections_per_app`, or `None` when it is
/// counted (or names no application, or there is no limit).
fn app_limit(
    ctx: &Context,
    conn: &crate::proxy::control::Connection,
    app: Option<&str>,
) -> Option<bson::RawDocumentBuf> {
    let app = app?;
    let limit = ctx.config.pool.max_connections_per_app;
    let kind = crate::proxy::control::LimitKind::App;
    if ctx.control.claim(conn, kind, app, limit) {
        return None;
    }
    ctx.metrics.refused(crate::metrics::Limit::App);
    debug!(
        app,
        limit, "max_connections_per_app reached; connection refused"
    );
    Some(crate::proxy::refuse::limit_error(&format!(
        "mongoguard: too many connections of application {app:?} \
         (pool.max_connections_per_app = {limit}); connection refused. Use a connection pool, \
         close idle connections, or raise the limit"
    )))
}

/// The compressor of an OP_COMPRESSED frame (the byte after its original opcode and size).
fn compressor_of(frame: &Frame) -> Option<crate::wire::Compressor> {
    let id = *frame.bytes().get(crate::wire::HEADER_LEN + 8)?;
    crate::wire::Compressor::from_id(id)
        .ok()
        .filter(|c| *c != crate::wire::Compressor::Noop)
}

/// Messages of this size or more (after decompression) are judged on the blocking pool
/// ([`Session::inspect`]): judging a 16 MB message takes milliseconds, during which the
/// session's thread would serve nobody else.
const JUDGE_OFF_THREAD_MIN: usize = 1 << 20;

/// The judgement of a request that could not be judged: refused (fail closed).
fn not_judged() -> Judgement {
    Judgement::Block {
        errmsg: "mongoguard could not judge this request (internal error); it was not sent".into(),
        abort: None,
    }
}

/// What a request held past the pause limit gets: ExceededTimeLimit, in the set of codes
/// drivers retry (the retryable reads and writes specifications).
const PAUSED: (i32, &str) = (262, "ExceededTimeLimit");

/// Runs one client connection to its end with `strategy` as its upstream side.
///
/// Not an `async fn`: an async fn keeps its arguments (the socket, the strategy) in its
/// state for its whole life next to the session built from them, and this future is most of
/// an idle client's memory (docs/memory.md). The session is built here, synchronously, and
/// the future owns only it and the request loop.
///
/// `finish` gets the session's result before the client's socket is closed, so that a client
/// that sees the close also sees it counted (the session runs on its own thread, beside
/// whoever reads the counters).
pub(crate) fn run<S: Strategy>(
    ctx: Arc<Context>,
    socket: ClientStream,
    peer: SocketAddr,
    strategy: S,
    conn: Arc<crate::proxy::control::Connection>,
    finish: impl FnOnce(Result<End, SessionError>) + Send,
) -> impl std::future::Future<Output = ()> + Send {
    let (read, write) = socket.split();
    let max = ctx.config.proxy.max_message_size;
    let mut session = Session {
        client: Client {
            input: crate::wire::codec::framed_read(read, max),
            out: write,
            peer,
            limits: Limits::from_config(&ctx.config.proxy),
            stop: conn.stop.clone(),
            kill: conn.kill.clone(),
            idle_timer: super::timer::LazyTimer::new(),
            reply_timer: super::timer::LazyTimer::new(),
            conn,
            pending: None,
            gone: false,
            ctx: ctx.clone(),
        },
        strategy,
        max,
        reply_compressor: None,
        metadata: None,
        wire_version: None,
        last_blocked: None,
        obs: SessionObs::new(ctx.metrics.clone()),
        ctx,
    };
    async move {
        let result = session.serve().await;
        session.strategy.close();
        let peer_closed = matches!(result, Ok(End::ClientClosed));
        finish(result);
        // The session (the client's socket) is dropped here, after `finish`.
        if peer_closed {
            let Session { client, .. } = session;
            client.out.drop_after_peer_closed();
        }
    }
}

impl<S: Strategy> Session<S> {
    async fn serve(&mut self) -> Result<End, SessionError> {
        loop {
            self.obs.end();
            self.client.conn.active.store(false, Relaxed);
            let incoming = match self.client.pending.take() {
                Some(f) => Incoming::Frame(f, None),
                None => self.next_request().await?,
            };
            let started = self.obs.begin();
            let c = &mut self.client;
            let received = match receive(&self.ctx, &mut c.out, incoming, c.limits, &c.stop).await?
            {
                Next::Request(r) => r,
                Next::Refused => continue,
                Next::End(end) => return Ok(end),
            };
            self.client.conn.requests.fetch_add(1, Relaxed);
            if received.inner.is_some() {
                self.ctx.metrics.compressed_requests.inc();
            }
            self.client.conn.active.store(true, Relaxed);
            let (request, route) = self
                .inspect(&received.frame, received.inner.as_ref())
                .await?;
            if let Some(meta) = &request.metadata {
                self.metadata = Some(record_handshake(&self.ctx, self.client.peer, meta));
                let conn = &self.client.conn;
                conn.set_client(meta.application.as_deref(), meta.driver.as_deref());
                if let Some(refusal) = app_limit(&self.ctx, conn, meta.application.as_deref()) {
                    // Answered, then closed: the connection's own kill ends the session at
                    // its next wait.
                    self.client.reply(&request, &refusal).await?;
                    self.client.conn.kill();
                    continue;
                }
            }
            self.obs
                .inspected(&request, self.metadata.as_ref(), started);
            let last_write_ok = self.last_blocked.is_none();
            self.strategy
                .request_arrived(&request, &route, last_write_ok);
            if self
                .strategy
                .answer_locally(&mut self.client, &received, &request, &route)
                .await?
            {
                continue;
            }
            if self.answer_blocked(&request, &route).await? {
                continue;
            }
            if !self.wait_unpaused(&request).await? {
                continue;
            }
            let limit = self.ctx.config.proxy.request_time_limit;
            let limited =
                super::time_limit::apply(&received.frame, received.inner.as_ref(), limit, self.max);
            if limited.is_some() {
                self.ctx.metrics.time_limited.inc();
            }
            // Pooled mode sends a compressed request upstream decompressed (mongoguard's
            // upstream connections agree no compression, and reads their replies) and
            // compresses the reply itself; passthrough forwards the client's bytes.
            let (original, compressor) = match (&received.inner, S::REUSES_LINKS) {
                (Some(inner), true) => (inner, compressor_of(&received.frame)),
                _ => (&received.frame, None),
            };
            self.reply_compressor = compressor;
            let frame = limited.as_ref().unwrap_or(original);
            if let Some(errmsg) = self.forward(frame, &request, &route).await? {
                // The measurement of a multi-document write blocked it.
                let abort = match &request.judgement {
                    Judgement::Measure(plan) => plan.abort.clone(),
                    _ => None,
                };
                let blocked = Request {
                    judgement: Judgement::Block { errmsg, abort },
                    ..request
                };
                self.answer_blocked(&blocked, &route).await?;
            }
        }
    }

    /// An operator's pause (`POST /pause`) holds the request here, before it takes an
    /// upstream connection, until `POST /resume` or `server_selection_timeout` — then it is
    /// answered with ExceededTimeLimit (262; drivers may retry it) and not sent. False when
    /// answered.
    async fn wait_unpaused(&mut self, request: &Request) -> Result<bool, SessionError> {
        let control = &self.ctx.control;
        // Drivers' monitoring (hello) goes on, so that a pause does not look like a dead
        // server to them.
        if !control.paused() || request.is_hello {
            return Ok(true);
        }
        let limit = self.ctx.config.upstream.server_selection_timeout;
        if control.wait_unpaused(limit, &self.client.kill).await {
            return Ok(true);
        }
        if self.client.kill.is_cancelled() {
            return Err(SessionError::Killed);
        }
        let doc = crate::wire::builder::error_document(
            PAUSED.0,
            PAUSED.1,
            &format!(
                "mongoguard is paused by an operator (POST /resume lets requests go); this \
                 request waited {} s and was not sent",
                limit.as_secs()
            ),
        );
        self.client.reply(request, &doc).await?;
        Ok(false)
    }

    /// Waits for the next client request, while the strategy watches what it holds.
    async fn next_request(&mut self) -> Result<Incoming, SessionError> {
        let c = &mut self.client;
        let watch = self.strategy.idle_watch();
        wait_for_request(
            &mut c.input,
            &c.stop,
            &mut c.idle_timer,
            c.limits,
            &self.ctx.budget,
            watch,
        )
        .await
    }

    /// Parses, validates and judges a client message; the strategy reads its route. A
    /// message of [`JUDGE_OFF_THREAD_MIN`] bytes or more (after decompression) is parsed and
    /// routed here and judged on the blocking pool: judging walks what the message holds
    /// (16 MB for a compression bomb), and this thread serves other clients.
    async fn inspect(
        &mut self,
        frame: &Frame,
        inner: Option<&Frame>,
    ) -> Result<(Request, S::Route), SessionError> {
        let message = inner.unwrap_or(frame).bytes();
        if message.len() < JUDGE_OFF_THREAD_MIN {
            let (request, route, _) = self.inspect_here(frame, inner, false)?;
            return Ok((request, route));
        }
        let (mut request, route, deferred) = self.inspect_here(frame, inner, true)?;
        if deferred {
            request.judgement = self
                .judge_off_thread(message.clone(), request.request_id)
                .await?;
        }
        Ok((request, route))
    }

    /// [`Session::inspect`] on this thread. With `defer`, a message the strategy wants judged
    /// is not: its judgement is a block ("not judged") for the caller to replace, and the
    /// third value is true.
    fn inspect_here(
        &mut self,
        frame: &Frame,
        inner: Option<&Frame>,
        defer: bool,
    ) -> Result<(Request, S::Route, bool), SessionError> {
        let meta = self.metadata.as_ref();
        let strategy = &self.strategy;
        let who = Who {
            peer: self.client.peer,
            app: meta.and_then(|m| m.application.as_deref()),
            driver: meta.and_then(|m| m.driver.as_deref()),
            user: strategy.user(),
            upstream_wire_version: self.wire_version.or_else(|| strategy.wire_version()),
        };
        let request_id = frame.header().request_id;
        let mut route = S::Route::default();
        let mut deferred = false;
        let (ctx, scratch) = (&self.ctx, &mut self.obs.scratch);
        let request = inspect_with(frame, inner, self.max, meta.is_none(), |msg, body| {
            // `body`: the body's top-level keys, indexed once for routing and judging.
            let (r, judge) = strategy.route(msg, body.as_ref());
            route = r;
            match (judge, defer) {
                (true, false) => guard::judge(ctx, msg, body, &who, request_id, scratch),
                (true, true) => {
                    deferred = true;
                    not_judged()
                }
                (false, _) => Judgement::Forward,
            }
        })
        .map_err(SessionError::ClientProtocol)?;
        Ok((request, route, deferred))
    }

    /// Judges `message` (a client message already parsed and validated by
    /// [`Session::inspect_here`], decompressed) on the blocking pool, in one of the slots
    /// that bound CPU-heavy work off the session threads. A judge that panics blocks the
    /// request (fail closed).
    async fn judge_off_thread(
        &mut self,
        message: bytes::Bytes,
        request_id: i32,
    ) -> Result<Judgement, SessionError> {
        let Some(_slot) = self.ctx.budget.off_thread_slot(&self.client.stop).await else {
            return Err(SessionError::Killed);
        };
        let meta = self.metadata.as_ref();
        let owned = |s: Option<&str>| s.map(str::to_owned);
        let app = owned(meta.and_then(|m| m.application.as_deref()));
        let driver = owned(meta.and_then(|m| m.driver.as_deref()));
        let user = owned(self.strategy.user());
        let peer = self.client.peer;
        let wire_version = self.wire_version.or_else(|| self.strategy.wire_version());
        let (ctx, max) = (self.ctx.clone(), self.max);
        let mut scratch = std::mem::take(&mut self.obs.scratch);
        let judged = tokio::task::spawn_blocking(move || {
            let who = Who {
                peer,
                app: app.as_deref(),
                driver: driver.as_deref(),
                user: user.as_deref(),
                upstream_wire_version: wire_version,
            };
            let judgement = match Message::parse(&message, max) {
                Ok(msg) => {
                    let body = match &msg {
                        Message::Msg(m) => Some(Index::new(m.body())),
                        _ => None,
                    };
                    guard::judge(&ctx, &msg, body, &who, request_id, &mut scratch)
                }
                // It parsed on the session thread; the same bytes cannot fail here.
                Err(_) => not_judged(),
            };
            (judgement, scratch)
        })
        .await;
        Ok(match judged {
            Ok((judgement, scratch)) => {
                self.obs.scratch = scratch;
                judgement
            }
            Err(e) => {
                warn!(error = %e, "judging a large request failed; it is refused");
                not_judged()
            }
        })
    }

    /// Answers a blocked command (or drops it when it expects no reply), first aborting its
    /// transaction upstream; and a legacy getLastError that follows a dropped write. True
    /// when the request was handled here.
    async fn answer_blocked(
        &mut self,
        request: &Request,
        route: &S::Route,
    ) -> Result<bool, SessionError> {
        let (answer, abort) = match guard::local_answer(&self.ctx, request, &mut self.last_blocked)
        {
            guard::Local::Forward => return Ok(false),
            guard::Local::Handled { answer, abort } => (answer, abort),
        };
        let blocked = matches!(request.judgement, Judgement::Block { .. });
        self.obs.answered_locally(blocked);
        if let Some(abort) = abort {
            self.abort_transaction(abort, route).await;
        }
        if let Some(doc) = answer {
            self.client.reply(request, &doc).await?;
        }
        Ok(true)
    }

    /// Forwards `frame` on a connection the strategy acquires and relays its reply; a
    /// not-primary reply is re-sent or relayed as the strategy says. A write to measure is
    /// measured on that connection first: `Some(errmsg)` when the measurement blocks it
    /// (nothing was sent for the write).
    async fn forward(
        &mut self,
        frame: &Frame,
        request: &Request,
        route: &S::Route,
    ) -> Result<Option<String>, SessionError> {
        let (mut resent, mut measured) = (false, false);
        loop {
            // The request goes out first thing on the connection acquired (nothing measured
            // on it before), and a reply is awaited: it may be written ahead.
            let measures = matches!(request.judgement, Judgement::Measure(_)) && !measured;
            let ahead = (request.expects_reply && !measures).then(|| frame.bytes());
            let acquired = self
                .strategy
                .acquire(request, route, &mut self.obs, &self.client.stop, ahead)
                .await;
            let mut link = match acquired {
                Acquired::Link(link) => link,
                Acquired::Refused { answer, end } => {
                    if let Some(doc) = answer {
                        let sent = self.client.reply(request, &doc).await;
                        if end.is_none() {
                            sent?;
                        }
                    }
                    return end.map_or(Ok(None), Err);
                }
            };
            if let (Judgement::Measure(plan), false) = (&request.judgement, measured) {
                link = match self.measure(link, plan, route).await? {
                    Ok(link) => link,
                    Err(MeasureEnd::Block(errmsg)) => return Ok(Some(errmsg)),
                    Err(MeasureEnd::Again) => {
                        // Passed (on_error = warn), but on a connection left mid-exchange:
                        // the write goes on a fresh one, unmeasured again.
                        measured = true;
                        continue;
                    }
                    Err(MeasureEnd::NotPrimary(host)) => {
                        let reply = not_writable_primary();
                        match self.after_not_primary(&host, route, &mut resent) {
                            Ok(true) => continue,
                            Ok(false) => {
                                self.client.reply(request, &reply).await?;
                                return Ok(None);
                            }
                            Err(end) => {
                                let _ = self.client.reply(request, &reply).await;
                                return Err(end);
                            }
                        }
                    }
                };
            }
            let (reply, host) = match self.round_trip(link, frame, request, route).await? {
                relay::Trip::Done => return Ok(None),
                relay::Trip::NotPrimary(reply, host) => (reply, host),
            };
            // Not executed: the server is no longer primary.
            let end = match self.after_not_primary(&host, route, &mut resent) {
                Ok(true) => continue,
                Ok(false) => None,
                Err(e) => Some(e),
            };
            if request.expects_reply {
                let c = &mut self.client;
                send_to_client(&mut c.out, reply.bytes(), c.limits.write, &c.stop).await?;
            }
            return end.map_or(Ok(None), Err);
        }
    }

    /// A request was not executed because `host` is not the primary: `Ok(true)` to re-send
    /// it, `Ok(false)` to relay the error, `Err` to relay it and end the session.
    fn after_not_primary(
        &mut self,
        host: &crate::upstream::Host,
        route: &S::Route,
        resent: &mut bool,
    ) -> Result<bool, SessionError> {
        self.ctx.topology.mark_unknown(host);
        let after = self.strategy.not_primary(host, route, *resent);
        debug!(upstream = %host, ?after, "not primary");
        match after {
            AfterNotPrimary::Resend => {
                *resent = true;
                Ok(true)
            }
            AfterNotPrimary::Relay => Ok(false),
            AfterNotPrimary::RelayAndEnd(e) => Err(e),
        }
    }

    /// Measures a write's unknown statements on `link` (the connection it would go on):
    /// `Ok(link)` to send the write on, else the link is handed back and the write is not
    /// sent there.
    async fn measure(
        &mut self,
        mut link: S::Link,
        plan: &MeasurePlan,
        route: &S::Route,
    ) -> Result<Result<S::Link, MeasureEnd>, SessionError> {
        let op_msg = self
            .wire_version
            .or_else(|| self.strategy.wire_version())
            .is_none_or(|v| v >= 6);
        let kill = &self.client.kill;
        let (measured, state) = match measure(&self.ctx, &mut link, plan, op_msg, kill).await {
            Ok(m) => m,
            Err(e) => {
                self.strategy.finished(link, Outcome::Broken, route);
                return Err(e);
            }
        };
        let outcome = match state {
            LinkState::Clean => Outcome::Replied,
            LinkState::Broken => Outcome::Broken,
        };
        let end = match measured {
            Measured::Pass if state == LinkState::Clean => return Ok(Ok(link)),
            Measured::Pass => MeasureEnd::Again,
            Measured::Block(errmsg) => MeasureEnd::Block(errmsg),
            Measured::NotPrimary => MeasureEnd::NotPrimary(link.host().clone()),
        };
        self.strategy.finished(link, outcome, route);
        Ok(Err(end))
    }
}

/// Why a measured write is not sent on the connection it was measured on.
enum MeasureEnd {
    /// The measurement blocks it: answer this errmsg.
    Block(String),
    /// Send it on a fresh connection (the measured one was left mid-exchange).
    Again,
    /// The server is not a writable primary.
    NotPrimary(crate::upstream::Host),
}

/// What the client gets when the server stopped being primary while its write was being
/// measured (the write was never sent): the error its driver retries on the new primary.
fn not_writable_primary() -> bson::RawDocumentBuf {
    crate::wire::builder::error_document(
        10107,
        "NotWritablePrimary",
        "mongoguard: the upstream is not (or no longer) the primary; the write was not sent",
    )
}

/// A client's first hello with metadata: names the connection's log span, writes the
/// handshake event, and returns the metadata for the session to keep.
pub(crate) fn record_handshake(
    ctx: &Context,
    peer: SocketAddr,
    meta: &ClientMetadata,
) -> ClientMetadata {
    let span = tracing::Span::current();
    span.record("app", meta.application.as_deref().unwrap_or("-"));
    span.record("driver", meta.driver.as_deref().unwrap_or("-"));
    debug!("client handshake");
    ctx.audit
        .event_with(|| crate::audit::Event::ClientHandshake {
            client: peer,
            app: meta.application.clone(),
            driver: meta.driver.clone(),
        });
    meta.clone()
}

/// Logs the end of a session at a level that matches whose fault it was.
pub(crate) fn log_end(result: &Result<End, SessionError>) {
    match result {
        Ok(end) => debug!(?end, "client session ended"),
        Err(SessionError::ClientIo(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            // A client closing abruptly is the client's business, not an operator's.
            debug!(error = %e, "client connection reset")
        }
        // Per-connection and expected (a failover closes every session of the old primary;
        // a serverless fleet churns thousands of connections a second): not for `info`.
        Err(
            e @ (SessionError::ClientGone | SessionError::Killed | SessionError::PrimaryChanged(_)),
        ) => debug!(error = %e, "client session closed"),
        Err(e @ (SessionError::ClientWriteTimeout(_) | SessionError::ClientReadTimeout(_))) => {
            info!(error = %e, "client session closed")
        }
        Err(e) => warn!(error = %e, "client session closed"),
    }
}
