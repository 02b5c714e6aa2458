//! The round trip of a forwarded request: send it, relay its reply or exhaust stream, and
//! mongoguard's own abortTransaction for a blocked statement of a transaction.

use std::time::{Duration, Instant};

use bson::RawDocumentBuf;

use super::Session;
use crate::{
    proxy::{
        client_io::{
            bounded_write, send_own_reply, send_to_client, watch_client, BudgetPermit, Side,
            BUDGET_FREE_BELOW,
        },
        error::{upstream_error, SessionError},
        hello,
        inspect::Request,
        routing::ReplyFacts,
        strategy::{Link, Outcome, Strategy},
    },
    upstream::{
        topology::{Kind, Topology},
        Host,
    },
    wire::{Frame, Message, MsgFlags, OpCode, WireError, HEADER_LEN},
};

/// Replies meaning "this server is not (or no longer) the primary".
pub(crate) const NOT_PRIMARY_CODES: [i32; 3] = [10107, 13435, 13436];

/// How long the reply of a client that left mid-request is still awaited, so that its
/// upstream connection can be reused; past it the connection is discarded.
const ABANDONED_REPLY_BUDGET: Duration = Duration::from_secs(1);

/// Where a relay stands.
struct Stream<E> {
    /// The requestID the next reply must answer (the request's, then the previous reply's).
    expected: i32,
    first: bool,
    /// When the request was written ahead (see [`Strategy::acquire`]): its first reply's
    /// `reply_timeout` counts from then.
    written_ahead: Option<Instant>,
    /// Held while an exhaust stream runs (see [`Strategy::exhaust_started`]).
    exhaust: Option<E>,
    /// The client started a large message: not read on until the request is done.
    client_paused: bool,
    /// A large reply's header is in and it holds no budget yet: its declared length.
    needs_budget: Option<usize>,
    /// The memory budget the reply being relayed holds (a large one), until it is sent.
    permit: Option<BudgetPermit>,
}

/// What `relay` leaves to its caller.
enum Relayed {
    /// Everything was relayed (an exhaust stream's end, or a client that left).
    Done,
    /// The last reply, read whole and checked but not yet written to the client: the
    /// connection goes back first, so that it is not held while the client is written to.
    Last {
        out: bytes::Bytes,
        /// The memory budget a large reply holds, until it is written.
        permit: Option<BudgetPermit>,
    },
    NotPrimary(Frame, Host),
}

/// How a round trip ended.
pub(super) enum Trip {
    /// The reply was relayed (or the request expects none).
    Done,
    /// The server answered "not primary" (nothing relayed yet): the reply, to re-send the
    /// request to the new primary or relay it, and that server.
    NotPrimary(Frame, Host),
}

impl<S: Strategy> Session<S> {
    /// Sends the request on `link` and relays its reply (or exhaust stream). The strategy
    /// gets the connection back after a complete exchange, or as broken after any error, a
    /// timeout, or a client that left mid-stream.
    pub(super) async fn round_trip(
        &mut self,
        mut link: S::Link,
        frame: &Frame,
        request: &Request,
        route: &S::Route,
    ) -> Result<Trip, SessionError> {
        let reply_timeout = self.ctx.config.upstream.reply_timeout;
        let kill = &self.client.stop;
        // Some or all of it may have been written while this session waited for the
        // connection (see `Strategy::acquire`).
        let (sent, rest, ahead) = match link.sent_ahead() {
            Some((n, at)) => (at, frame.bytes().get(n..).unwrap_or_default(), Some(at)),
            None => (Instant::now(), &frame.bytes()[..], None),
        };
        if !rest.is_empty() {
            let written = bounded_write(link.send(rest), reply_timeout, kill, Side::Upstream);
            if let Err(e) = written.await {
                self.strategy.finished(link, Outcome::Broken, route);
                return Err(e);
            }
        }
        self.ctx.stats.requests.inc();
        if !request.expects_reply {
            self.strategy.finished(link, Outcome::Sent, route);
            return Ok(Trip::Done);
        }
        // Its reply timed from the write ahead when all of it went then (the session ran
        // only at the reply, or its checkout timer); a part: from the rest's write, as ever.
        let ahead = ahead.filter(|_| rest.is_empty());
        let relayed = self.relay(&mut link, request, route, ahead).await;
        // The exchange on the connection is complete, or failed: it goes back (or is
        // discarded) before the last reply is written to the client.
        let last = match relayed {
            Ok(Relayed::Done) => None,
            Ok(Relayed::Last { out, permit }) => Some((out, permit)),
            Ok(Relayed::NotPrimary(reply, host)) => {
                self.strategy.finished(link, Outcome::Replied, route);
                if self.client.gone {
                    return Err(SessionError::ClientGone);
                }
                return Ok(Trip::NotPrimary(reply, host));
            }
            Err(e) => {
                self.strategy.finished(link, Outcome::Broken, route);
                return Err(e);
            }
        };
        self.strategy.finished(link, Outcome::Replied, route);
        if last.is_some() && self.strategy.handed_over() {
            // The connection went to a session waiting for one (pooled mode, more clients
            // than connections): that session runs next and sends its request before this
            // one writes its reply, so the upstream connection does not sit idle behind a
            // client write. Measured: the upstream's context switches per request fell from
            // ~0.13 to ~0.11 at 64 clients on 20 connections (docs/performance.md).
            tokio::task::yield_now().await;
        }
        if let Some((out, permit)) = last {
            let gone = self.client.gone;
            let c = &mut self.client;
            match send_to_client(&mut c.out, &out, c.limits.write, &c.stop).await {
                // See `relay`: a client that left cannot take its reply; one that only
                // half-closed does.
                Err(_) if gone => {}
                sent => sent?,
            }
            drop(permit);
        }
        if self.client.gone {
            return Err(SessionError::ClientGone);
        }
        self.obs.forwarded(sent.elapsed());
        Ok(Trip::Done)
    }

    /// Reads the replies to `request` on `link` and relays them to the client, until the
    /// last one (no moreToCome). While waiting it keeps reading the client: a request sent
    /// ahead is kept for later, a client that leaves is noticed.
    async fn relay(
        &mut self,
        link: &mut S::Link,
        request: &Request,
        route: &S::Route,
        written_ahead: Option<Instant>,
    ) -> Result<Relayed, SessionError> {
        let mut stream = Stream {
            expected: request.request_id,
            first: true,
            written_ahead,
            exhaust: None,
            client_paused: false,
            needs_budget: None,
            permit: None,
        };
        loop {
            let Some(reply) = self.next_reply(link, request, &mut stream).await? else {
                if let Some(len) = stream.needs_budget.take() {
                    stream.permit = Some(self.reply_budget(len, request, stream.first).await?);
                }
                continue;
            };
            // A large reply that arrived whole in one read takes its size now.
            if stream.permit.is_none() && reply.bytes().len() > BUDGET_FREE_BELOW {
                let len = reply.bytes().len();
                stream.permit = Some(self.reply_budget(len, request, stream.first).await?);
            }
            let Some(more) = self.take_reply(&reply, link.host(), request, route, &mut stream)?
            else {
                return Ok(Relayed::NotPrimary(reply, link.host().clone()));
            };
            let gone = self.client.gone;
            if gone && more {
                // An exhaust stream cannot be cut short cleanly.
                return Err(SessionError::ClientGone);
            }
            let out = if request.is_hello {
                if let Some(v) = hello::max_wire_version(&reply, self.max) {
                    self.wire_version = Some(v);
                }
                hello::rewrite_reply(&reply, self.max)
                    .map_err(SessionError::UpstreamProtocol)?
                    .unwrap_or_else(|| reply.into_bytes())
            } else {
                reply.into_bytes()
            };
            let out = match self.reply_compressor {
                Some(c) => compress_reply(out, c).await?,
                None => out,
            };
            if !more {
                // Written by `round_trip`, once the connection is back.
                return Ok(Relayed::Last {
                    out,
                    permit: stream.permit.take(),
                });
            }
            let c = &mut self.client;
            let sent = send_to_client(&mut c.out, &out, c.limits.write, &c.stop).await;
            match sent {
                // The client's side was closed while it waited. One that only shut down its
                // write side (a half-close) still reads, and mongod answers it: it gets its
                // reply. One that left cannot take it; the upstream exchange is complete all
                // the same.
                Err(_) if gone => return Ok(Relayed::Done),
                sent => sent?,
            }
            stream.permit = None;
        }
    }

    /// Waits for the next reply on `link`, watching the shutdown tokens, the reply timer and
    /// the client. `None`: the client sent something (kept) or left; wait again.
    async fn next_reply(
        &mut self,
        link: &mut S::Link,
        request: &Request,
        stream: &mut Stream<S::Exhaust>,
    ) -> Result<Option<Frame>, SessionError> {
        let reply_timeout = self.ctx.config.upstream.reply_timeout;
        let streaming_hello = request.is_hello && request.exhaust_allowed;
        let client = &mut self.client;
        // A client that left gets its reply read only briefly (pooled mode: so the
        // connection goes back clean; drivers do this on close — the Node driver sends
        // endSessions and closes without waiting).
        let budget = match (client.gone, reply_timeout.is_zero()) {
            (true, true) => ABANDONED_REPLY_BUDGET,
            (true, false) => reply_timeout.min(ABANDONED_REPLY_BUDGET),
            (false, false) => match stream.written_ahead.filter(|_| stream.first) {
                Some(at) => reply_timeout
                    .saturating_sub(at.elapsed())
                    .max(Duration::from_nanos(1)),
                None => reply_timeout,
            },
            (false, true) => reply_timeout,
        };
        client.reply_timer.arm(budget);
        let watch_client_now = client.pending.is_none() && !client.gone && !stream.client_paused;
        // Only a streaming hello watches its server (and pays for a copy of its name).
        let host = streaming_hello.then(|| link.host().clone());
        let topology = &self.ctx.topology;
        let server_moved = async {
            match &host {
                Some(h) => primary_moved(topology, h).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = client.stop.killed() => Err(SessionError::Killed),
            // A streaming hello (monitoring) never ends by itself: cut it at drain, and when
            // its server stops being the primary.
            _ = client.stop.draining(), if streaming_hello => Err(SessionError::Killed),
            e = server_moved, if streaming_hello => Err(e),
            step = poll_reply(link, stream.permit.is_some()) => match step {
                ReplyStep::Next(None) => Err(SessionError::UpstreamClosed),
                ReplyStep::Next(Some(Err(e))) => Err(upstream_error(e)),
                ReplyStep::Next(Some(Ok(f))) => Ok(Some(f)),
                ReplyStep::NeedsBudget(len) => {
                    stream.needs_budget = Some(len);
                    Ok(None)
                }
            },
            next = watch_client(&mut client.input), if watch_client_now => {
                match next {
                    // The client closed its side: perhaps only its write side, and it waits
                    // for this reply (mongod answers a half-closed client's command; it kills
                    // only an exhaust stream, on POLLRDHUP). Awaited briefly, then relayed.
                    Err(SessionError::ClientGone) if stream.exhaust.is_none() => {
                        client.gone = true;
                    }
                    Err(e) => return Err(e),
                    Ok(Some(f)) => client.pending = Some(f),
                    // A large message the client started is not read on (see watch_client).
                    Ok(None) => stream.client_paused = true,
                }
                Ok(None)
            }
            _ = client.reply_timer.expired() => Err(if client.gone {
                SessionError::ClientGone
            } else {
                SessionError::ReplyTimeout(reply_timeout)
            }),
        }
    }

    /// Takes a large reply's size (`len`, declared in its header) from the memory budget before
    /// it is buffered, waiting up to `memory_budget_wait` — a write's reply also the
    /// `client_write_timeout` within which every reply holding budget now is sent or cut off,
    /// so that a write's outcome is not dropped while the budget only waits for slow readers.
    /// When the budget stays spent the reply is not read: the client gets error 65003 (for
    /// the first reply of a request, `first`: the command ran, its outcome is unknown to the
    /// client) and the session ends, its upstream connection discarded with the reply unread.
    async fn reply_budget(
        &mut self,
        len: usize,
        request: &Request,
        first: bool,
    ) -> Result<BudgetPermit, SessionError> {
        let c = &mut self.client;
        let wait = match request.is_write {
            true => c.limits.budget_wait.saturating_add(c.limits.write),
            false => c.limits.budget_wait,
        };
        if let Some(p) = self.ctx.budget.take(len, wait, &c.stop).await {
            return Ok(p);
        }
        if c.stop.is_killed() {
            return Err(SessionError::Killed);
        }
        tracing::info!(
            bytes = len,
            "memory budget spent: a large reply was not relayed (65003); closing the session"
        );
        if first && !c.gone {
            let doc = crate::proxy::client_io::reply_over_budget_document(len);
            send_own_reply(
                &self.ctx,
                &mut c.out,
                request.op,
                request.request_id,
                &doc,
                c.limits.write,
                &c.stop,
            )
            .await?;
        }
        Err(SessionError::ReplyOverBudget(len))
    }

    /// Checks a reply (it answers the request or the previous reply of the stream; a valid
    /// opcode) and lets the metrics and the strategy read it. `Some(more)`: whether more
    /// replies follow; `None`: a not-primary reply to a replica-set request (not relayed).
    fn take_reply(
        &mut self,
        reply: &Frame,
        host: &Host,
        request: &Request,
        route: &S::Route,
        stream: &mut Stream<S::Exhaust>,
    ) -> Result<Option<bool>, SessionError> {
        let header = reply.header();
        if header.response_to != stream.expected {
            return Err(SessionError::UpstreamProtocol(WireError::bad_doc(
                "upstream reply",
                format!(
                    "responseTo {} does not answer request {}",
                    header.response_to, stream.expected
                ),
            )));
        }
        stream.expected = header.request_id;
        // An OP_MSG reply (nearly all) is parsed once, for moreToCome and for its facts.
        let msg = match reply.op_code() {
            Some(OpCode::Msg) => Some(
                crate::wire::OpMsg::parse(reply.bytes()).map_err(SessionError::UpstreamProtocol)?,
            ),
            _ => None,
        };
        let more = match &msg {
            Some(m) => request.exhaust_allowed && m.flags().more_to_come(),
            None => reply_more_to_come(reply, request, self.max)
                .map_err(SessionError::UpstreamProtocol)?,
        };
        let first = std::mem::replace(&mut stream.first, false);
        // One parse of the reply serves every reader: the not-primary check (first and only
        // reply of a replica-set request), the metrics and the strategy.
        let replica_set = matches!(self.ctx.topology.kind(), Kind::ReplicaSet(_));
        let check_primary = first && !more && replica_set && !request.is_hello;
        if check_primary || self.strategy.wants_reply_facts() {
            let facts = match &msg {
                Some(m) => ReplyFacts::from_body(m.body(), None),
                None => ReplyFacts::read(reply),
            };
            if check_primary && facts.code.is_some_and(|c| NOT_PRIMARY_CODES.contains(&c)) {
                return Ok(None);
            }
            if first {
                self.obs.first_reply_error(facts.error);
            }
            self.strategy.observe_reply(host, route, &facts);
        } else if first && self.obs.wants_first_reply() {
            // Only the metrics read this reply: whether it is an error.
            let error = match &msg {
                Some(m) => ReplyFacts::error_of(m.body()),
                None => ReplyFacts::read(reply).error,
            };
            self.obs.first_reply_error(error);
        }
        if more && stream.exhaust.is_none() {
            stream.exhaust = Some(self.strategy.exhaust_started());
        }
        Ok(Some(more))
    }

    /// Sends abortTransaction for a blocked statement of a transaction and waits for its
    /// reply (whatever it says: a transaction that never started is already gone). Best
    /// effort, in both modes: the client gets its error whatever happens here; a connection
    /// whose abort failed is not reused.
    pub(super) async fn abort_transaction(&mut self, abort: &RawDocumentBuf, route: &S::Route) {
        let kill = &self.client.stop;
        let Some(mut link) = self
            .strategy
            .acquire_for_abort(route, &mut self.obs, kill)
            .await
        else {
            return;
        };
        let id = self.ctx.request_ids.next();
        let bytes = crate::wire::builder::encode_msg_reply(id, 0, abort);
        let timeout = abort_timeout(self.ctx.config.upstream.reply_timeout);
        let exchange = async {
            link.send(&bytes).await.ok()?;
            match link.next().await {
                Some(Ok(f)) if f.header().response_to == id => Some(()),
                _ => None,
            }
        };
        let ok = tokio::select! {
            biased;
            _ = kill.killed() => None,
            r = tokio::time::timeout(timeout, exchange) => r.ok().flatten(),
        };
        match ok {
            Some(()) => debug_aborted(),
            None => tracing::debug!("abortTransaction for a blocked command did not complete"),
        }
        self.strategy.aborted(link, ok.is_some(), route);
    }
}

/// Replies above this are compressed on the blocking pool, not on a runtime thread.
const COMPRESS_INLINE_MAX: usize = 64 * 1024;

/// Compresses a reply for a client that compressed its request (pooled mode).
/// What one poll of the upstream connection produced.
enum ReplyStep {
    Next(Option<Result<Frame, crate::wire::codec::CodecError>>),
    /// A large reply's header is in and it holds no budget yet: its declared length.
    NeedsBudget(usize),
}

/// Polls `link` for its next message; stops early when a large one (over
/// [`BUDGET_FREE_BELOW`]) has its header in and `paid` is false, so that it takes its size
/// from the memory budget before it is buffered (as a large client message does).
async fn poll_reply<L: Link>(link: &mut L, paid: bool) -> ReplyStep {
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(next) = link.poll_next_frame(cx) {
            return std::task::Poll::Ready(ReplyStep::Next(next));
        }
        if !paid {
            let buffered = link.buffered();
            if buffered.len() >= HEADER_LEN {
                if let Some(len) =
                    crate::wire::le_u32(buffered).and_then(|l| usize::try_from(l).ok())
                {
                    if len > BUDGET_FREE_BELOW {
                        return std::task::Poll::Ready(ReplyStep::NeedsBudget(len));
                    }
                }
            }
        }
        std::task::Poll::Pending
    })
    .await
}

async fn compress_reply(
    out: bytes::Bytes,
    compressor: crate::wire::Compressor,
) -> Result<bytes::Bytes, SessionError> {
    let compressed = if out.len() <= COMPRESS_INLINE_MAX {
        crate::wire::compression::compress(&out, compressor)
    } else {
        tokio::task::spawn_blocking(move || crate::wire::compression::compress(&out, compressor))
            .await
            .map_err(|_| SessionError::Killed)?
    };
    compressed.map_err(SessionError::UpstreamProtocol)
}

fn debug_aborted() {
    tracing::debug!("aborted the transaction of a blocked command");
}

/// Resolves when `host` stops being the server a session may stay attached to: a replica
/// set's primary changed (or is unknown), a mongos of the list went down. Never for a single
/// server.
pub(crate) async fn primary_moved(topology: &Topology, host: &Host) -> SessionError {
    if *topology.kind() == Kind::Single {
        return std::future::pending().await;
    }
    let mut rx = topology.subscribe();
    loop {
        let serves = {
            let snap = rx.borrow_and_update();
            match topology.kind() {
                Kind::ReplicaSet(_) => snap.primary() == Some(host),
                _ => snap
                    .servers
                    .iter()
                    .any(|s| &s.host == host && s.role.is_some()),
            }
        };
        if !serves {
            return SessionError::PrimaryChanged(host.to_string());
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// How long mongoguard's own abortTransaction may take: the reply timeout, or 30 s when that
/// is disabled (a wait is always bounded).
pub(crate) fn abort_timeout(reply_timeout: Duration) -> Duration {
    if reply_timeout.is_zero() {
        Duration::from_secs(30)
    } else {
        reply_timeout
    }
}

/// Whether the upstream will send another reply after this one (exhaust). Validates the
/// reply's opcode; an OP_MSG reply is parsed in full so garbage is caught here.
pub(crate) fn reply_more_to_come(
    reply: &Frame,
    request: &Request,
    max: usize,
) -> Result<bool, WireError> {
    match reply.op_code() {
        Some(OpCode::Msg) => {
            let msg = crate::wire::OpMsg::parse(reply.bytes())?;
            Ok(request.exhaust_allowed && msg.flags().more_to_come())
        }
        Some(OpCode::Reply) => {
            crate::wire::OpReply::parse(reply.bytes())?;
            Ok(false)
        }
        Some(OpCode::Compressed) => {
            // Only an exhaust stream needs to look inside: decompress only then.
            if !request.exhaust_allowed {
                return match Message::parse(reply.bytes(), max)? {
                    Message::Compressed(c)
                        if c.original_op_code == OpCode::Msg
                            || c.original_op_code == OpCode::Reply =>
                    {
                        Ok(false)
                    }
                    _ => Err(WireError::UnknownOpCode(reply.header().op_code)),
                };
            }
            let inner = match Message::parse(reply.bytes(), max)? {
                Message::Compressed(c) => c.decompress()?,
                _ => return Err(WireError::UnknownOpCode(reply.header().op_code)),
            };
            let flags = inner
                .bytes()
                .get(HEADER_LEN..)
                .and_then(crate::wire::le_u32)
                .unwrap_or(0);
            Ok(inner.op_code() == Some(OpCode::Msg) && MsgFlags(flags).more_to_come())
        }
        _ => Err(WireError::UnknownOpCode(reply.header().op_code)),
    }
}
