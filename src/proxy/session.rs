//! One client connection in passthrough mode: read a request, inspect it, forward the
//! original bytes, relay the reply (or the whole exhaust stream), repeat.
//!
//! The upstream connection is opened on the first request that needs one, on the server that
//! is primary then (replica sets) or the next mongos, and the session closes between requests
//! when that server stops being the primary, so drivers reconnect and retry retryable writes
//! on the new primary instead of failing with NotWritablePrimary until they give up.
//!
//! MongoDB clients do not pipeline: a connection carries one request at a time, except for
//! moreToCome requests (no reply) and exhaust streams (several replies). The loop therefore
//! has two states, waiting for a request and waiting for replies, and in each it watches both
//! sockets, the idle/reply timers and the shutdown tokens, so nothing can hang it.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;

use tokio_util::{codec::FramedRead, sync::CancellationToken};
use tracing::{debug, info, warn};

use super::{
    client_io::{
        receive, send_to_client, send_to_upstream, wait_for_request, watch_client, Incoming,
        Limits, Next,
    },
    error::SessionError,
    guard::{self, Judgement, Who},
    hello::{self, ClientMetadata},
    inspect::{inspect_with, Request},
    observe::SessionObs,
    Context,
};
use crate::{
    net::{ClientRead, ClientStream, ClientWrite, UpstreamRead, UpstreamWrite},
    upstream::{
        self,
        topology::{Kind, ReadPref, Topology},
        Host,
    },
    wire::{
        builder::{error_document, reply_for},
        codec::CodecError,
        Frame, Message, MessageCodec, MsgFlags, OpCode, WireError, HEADER_LEN,
    },
};

pub(crate) type Reader = FramedRead<ClientRead, MessageCodec>;
type UpReader = FramedRead<UpstreamRead, MessageCodec>;

pub(crate) use super::client_io::End;

/// Code mongod uses for an unreachable host. Used only when the upstream cannot be reached
/// at all: drivers then mark the server unknown and retry server selection, which is right.
const HOST_UNREACHABLE: (i32, &str) = (6, "HostUnreachable");

/// Replies meaning "this server is not (or no longer) the primary".
pub(crate) const NOT_PRIMARY_CODES: [i32; 3] = [10107, 13435, 13436];

/// The upstream connection of a passthrough session, opened on the first request that needs
/// it, on the server that is primary then.
struct Upstream {
    host: Host,
    read: UpReader,
    write: UpstreamWrite,
}

struct Session {
    ctx: Arc<Context>,
    client_in: Reader,
    client_out: ClientWrite,
    peer: SocketAddr,
    max: usize,
    limits: Limits,
    metadata: Option<ClientMetadata>,
    /// The upstream's maxWireVersion, from its hello reply.
    upstream_wire_version: Option<i32>,
    upstream: Option<Upstream>,
    /// A request the client sent while its previous one was still in flight.
    pending: Option<Frame>,
    /// The error of the last fire-and-forget write mongoguard dropped, for the client's next
    /// getLastError (legacy applications learn about write errors only that way).
    last_blocked: Option<String>,
    /// Per-session children of the proxy's shutdown tokens: waiting on the shared tokens
    /// would take their one mutex twice per request in every session.
    drain: CancellationToken,
    kill: CancellationToken,
    obs: SessionObs,
}

/// Runs one client connection to its end.
pub(crate) async fn run(
    ctx: Arc<Context>,
    socket: ClientStream,
    peer: SocketAddr,
) -> Result<End, SessionError> {
    let (read, write) = socket.split();
    let max = ctx.config.proxy.max_message_size;
    let mut session = Session {
        client_in: FramedRead::new(read, MessageCodec::new(max)),
        client_out: write,
        max,
        limits: Limits::from_config(&ctx.config.proxy),
        metadata: None,
        upstream_wire_version: None,
        upstream: None,
        pending: None,
        last_blocked: None,
        drain: ctx.drain.child_token(),
        kill: ctx.kill.child_token(),
        obs: SessionObs::new(ctx.metrics.clone()),
        peer,
        ctx,
    };
    session.serve().await
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
            let request = self.inspect(frame, received.inner.as_ref())?;
            if let Some(meta) = &request.metadata {
                self.metadata = Some(record_handshake(&self.ctx, self.peer, meta));
            }
            self.obs
                .inspected(&request, self.metadata.as_ref(), started);
            if self.answer_locally(&request).await? {
                let blocked = matches!(request.judgement, Judgement::Block { .. });
                self.obs.answered_locally(blocked);
                continue;
            }
            if self.upstream.is_none() {
                if let Err(e) = self.attach().await {
                    self.refuse(&request, &e.to_string()).await;
                    return Err(e);
                }
            }
            let Some(up) = self.upstream.as_mut() else {
                return Err(SessionError::UpstreamClosed);
            };
            let sent = Instant::now();
            let reply_timeout = self.ctx.config.upstream.reply_timeout;
            send_to_upstream(&mut up.write, frame.bytes(), reply_timeout, &self.kill).await?;
            self.ctx.stats.requests.inc();
            if request.expects_reply {
                self.relay_replies(&request).await?;
                self.obs.forwarded(sent.elapsed());
            }
        }
    }

    /// Opens the session's upstream connection on the server that is primary now (a replica
    /// set: waiting up to `server_selection_timeout` during an election), or the next mongos.
    async fn attach(&mut self) -> Result<(), SessionError> {
        let topology = self.ctx.topology.clone();
        let Some(topology) = topology else {
            return Err(SessionError::UpstreamClosed);
        };
        let selection = self.ctx.config.upstream.server_selection_timeout;
        let host = tokio::select! {
            biased;
            _ = self.kill.cancelled() => return Err(SessionError::Killed),
            h = topology.select(ReadPref::Primary, selection) => h.map_err(|e| {
                SessionError::UpstreamConnect(crate::upstream::ConnectError::Handshake {
                    host: "upstream".into(),
                    reason: e.to_string(),
                })
            })?,
        };
        let timeout = self.ctx.config.upstream.connect_timeout;
        let connecting = self.obs.upstream_connecting();
        let stream = tokio::select! {
            biased;
            _ = self.kill.cancelled() => return Err(SessionError::Killed),
            s = upstream::connect(&host, timeout, self.ctx.upstream_tls.as_ref()) => s,
        };
        drop(connecting);
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                topology.mark_unknown(&host);
                return Err(e.into());
            }
        };
        self.obs.upstream_connected();
        debug!(peer = %self.peer, upstream = %host, "upstream connected");
        let (read, write) = stream.split();
        self.upstream = Some(Upstream {
            host,
            read: FramedRead::new(read, MessageCodec::new(self.max)),
            write,
        });
        Ok(())
    }

    /// Parses, validates and judges a client message.
    fn inspect(&mut self, frame: &Frame, inner: Option<&Frame>) -> Result<Request, SessionError> {
        let meta = self.metadata.as_ref();
        let who = Who {
            peer: self.peer,
            app: meta.and_then(|m| m.application.as_deref()),
            driver: meta.and_then(|m| m.driver.as_deref()),
            user: None,
            upstream_wire_version: self.upstream_wire_version,
        };
        let request_id = frame.header().request_id;
        inspect_with(frame, inner, self.max, self.metadata.is_none(), |msg| {
            guard::judge(&self.ctx, msg, &who, request_id, &mut self.obs.scratch)
        })
        .map_err(SessionError::ClientProtocol)
    }

    /// Answers a blocked command (or drops it when it expects no reply), and a legacy
    /// getLastError that follows a dropped write. True when the request was handled here.
    async fn answer_locally(&mut self, request: &Request) -> Result<bool, SessionError> {
        let (answer, abort) = match guard::local_answer(&self.ctx, request, &mut self.last_blocked)
        {
            guard::Local::Forward => return Ok(false),
            guard::Local::Handled { answer, abort } => (answer, abort),
        };
        if let Some(abort) = abort {
            // A transaction lives on the server, keyed by its session, whichever connection
            // started it: abort it even if this client connection has no upstream yet.
            if self.upstream.is_none() {
                if let Err(e) = self.attach().await {
                    debug!(error = %e, "cannot reach the upstream to abort a transaction");
                }
            }
            if self.upstream.is_some() {
                self.abort_transaction(abort).await?;
            }
        }
        if let Some(doc) = answer {
            self.send_document(request, &doc).await?;
        }
        Ok(true)
    }

    /// Sends abortTransaction upstream for a blocked command of a transaction and waits for
    /// its reply (whatever it says: a transaction that never started is already gone).
    async fn abort_transaction(&mut self, abort: &bson::RawDocument) -> Result<(), SessionError> {
        let Some(up) = self.upstream.as_mut() else {
            return Ok(());
        };
        let id = self.ctx.request_ids.next();
        let bytes = crate::wire::builder::encode_msg_reply(id, 0, abort);
        let timeout = abort_timeout(self.ctx.config.upstream.reply_timeout);
        send_to_upstream(&mut up.write, &bytes, timeout, &self.kill).await?;
        let reply = tokio::select! {
            biased;
            _ = self.kill.cancelled() => return Err(SessionError::Killed),
            r = up.read.next() => r,
            _ = tokio::time::sleep(timeout) => return Err(SessionError::ReplyTimeout(timeout)),
        };
        match reply {
            Some(Ok(frame)) if frame.header().response_to == id => {
                debug!("aborted the transaction of a blocked command");
                Ok(())
            }
            Some(Ok(_)) => Err(SessionError::UpstreamProtocol(WireError::bad_doc(
                "upstream reply",
                "abortTransaction reply does not answer it",
            ))),
            Some(Err(e)) => Err(upstream_error(e)),
            None => Err(SessionError::UpstreamClosed),
        }
    }

    /// Waits for the next client request. Between requests the upstream has nothing to say:
    /// data or EOF there means it closed or misbehaved, and a change of primary means this
    /// session's server no longer takes writes; either ends the session, so the driver
    /// reconnects (and lands on the new primary) instead of failing on the next request.
    async fn next_request(&mut self) -> Result<Incoming, SessionError> {
        let Session {
            client_in,
            upstream,
            drain,
            kill,
            limits,
            ctx,
            ..
        } = self;
        let watch = async {
            let Some(up) = upstream.as_mut() else {
                return std::future::pending().await;
            };
            let failure = async {
                match up.read.next().await {
                    None => SessionError::UpstreamClosed,
                    Some(Err(e)) => upstream_error(e),
                    Some(Ok(_)) => SessionError::UpstreamProtocol(WireError::bad_doc(
                        "upstream",
                        "unsolicited message between requests",
                    )),
                }
            };
            tokio::select! {
                e = failure => e,
                e = primary_moved(ctx.topology.as_deref(), &up.host) => e,
            }
        };
        wait_for_request(client_in, drain, kill, *limits, &ctx.budget, watch).await
    }

    /// Relays the reply, or every reply of an exhaust stream, to the client.
    async fn relay_replies(&mut self, request: &Request) -> Result<(), SessionError> {
        let reply_timeout = self.ctx.config.upstream.reply_timeout;
        let check_primary = matches!(
            self.ctx.topology.as_deref().map(Topology::kind),
            Some(Kind::ReplicaSet(_))
        ) && !request.is_hello;
        let Session {
            upstream,
            client_in,
            client_out,
            pending,
            kill,
            drain,
            ctx,
            obs,
            upstream_wire_version,
            max,
            limits,
            ..
        } = self;
        let Some(up) = upstream.as_mut() else {
            return Err(SessionError::UpstreamClosed);
        };
        let streaming_hello = request.is_hello && request.exhaust_allowed;
        let mut expected_response_to = request.request_id;
        let mut client_paused = false;
        loop {
            let timer = sleep_unless_zero(reply_timeout);
            tokio::pin!(timer);
            let reply = tokio::select! {
                biased;
                _ = kill.cancelled() => return Err(SessionError::Killed),
                // A streaming hello (monitoring) never ends by itself: cut it at drain, and
                // when its server stops being the primary.
                _ = drain.cancelled(), if streaming_hello => {
                    return Err(SessionError::Killed);
                }
                e = primary_moved(ctx.topology.as_deref(), &up.host), if streaming_hello => {
                    return Err(e);
                }
                next = up.read.next() => match next {
                    None => return Err(SessionError::UpstreamClosed),
                    Some(Err(e)) => return Err(upstream_error(e)),
                    Some(Ok(f)) => f,
                },
                next = watch_client(client_in), if pending.is_none() && !client_paused => {
                    match next? {
                        Some(f) => *pending = Some(f),
                        None => client_paused = true,
                    }
                    continue;
                }
                _ = &mut timer => return Err(SessionError::ReplyTimeout(reply_timeout)),
            };
            let header = reply.header();
            if header.response_to != expected_response_to {
                return Err(SessionError::UpstreamProtocol(WireError::bad_doc(
                    "upstream reply",
                    format!(
                        "responseTo {} does not answer request {}",
                        header.response_to, expected_response_to
                    ),
                )));
            }
            let first = expected_response_to == request.request_id;
            if first {
                obs.first_reply(&reply);
            }
            expected_response_to = header.request_id;
            let more = reply_more_to_come(&reply, request, *max)
                .map_err(SessionError::UpstreamProtocol)?;
            if request.is_hello {
                if let Some(v) = hello::max_wire_version(&reply, *max) {
                    *upstream_wire_version = Some(v);
                }
            }
            // A not-primary reply: relayed as it is (the driver retries a retryable write),
            // and this session closes after it so the retry lands on a new connection, on
            // the new primary.
            let stale = check_primary
                && first
                && !more
                && super::routing::ReplyFacts::read(&reply)
                    .code
                    .is_some_and(|c| NOT_PRIMARY_CODES.contains(&c));
            let out = if request.is_hello {
                hello::rewrite_reply(&reply, *max)
                    .map_err(SessionError::UpstreamProtocol)?
                    .unwrap_or_else(|| reply.into_bytes())
            } else {
                reply.into_bytes()
            };
            send_to_client(client_out, &out, limits.write, kill).await?;
            if stale {
                if let Some(t) = ctx.topology.as_deref() {
                    t.mark_unknown(&up.host);
                }
                return Err(SessionError::PrimaryChanged(up.host.to_string()));
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// The upstream is unreachable: answer the request with a clear error in its opcode
    /// family (the session then closes).
    async fn refuse(&mut self, request: &Request, reason: &str) {
        if !request.expects_reply {
            return;
        }
        let doc = error_document(
            HOST_UNREACHABLE.0,
            HOST_UNREACHABLE.1,
            &format!("mongoguard: {}", crate::text::clip(reason, 1024)),
        );
        let _ = self.send_document(request, &doc).await;
    }

    async fn send_document(
        &mut self,
        request: &Request,
        doc: &bson::RawDocument,
    ) -> Result<(), SessionError> {
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
}

/// Resolves when `host` stops being the server a passthrough session may stay attached to:
/// a replica set's primary changed (or is unknown), a mongos of the list went down. Never
/// for a single server.
async fn primary_moved(topology: Option<&Topology>, host: &Host) -> SessionError {
    let Some(topology) = topology else {
        return std::future::pending().await;
    };
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

/// Writes mongoguard's own reply `doc` to request `request_id`, in the `op` family, within
/// the client write timeout.
pub(crate) async fn send_reply(
    ctx: &Context,
    out: &mut ClientWrite,
    op: OpCode,
    request_id: i32,
    doc: &bson::RawDocument,
    limit: Duration,
    kill: &CancellationToken,
) -> Result<(), SessionError> {
    let our_id = ctx.request_ids.next();
    if let Some(bytes) = reply_for(op, request_id, our_id, doc) {
        send_to_client(out, &bytes, limit, kill).await?;
    }
    Ok(())
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
                match Message::parse(reply.bytes(), max)? {
                    Message::Compressed(c)
                        if c.original_op_code == OpCode::Msg
                            || c.original_op_code == OpCode::Reply =>
                    {
                        return Ok(false)
                    }
                    _ => return Err(WireError::UnknownOpCode(reply.header().op_code)),
                }
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

pub(crate) fn client_error(e: CodecError) -> SessionError {
    match e {
        CodecError::Io(e) => SessionError::ClientIo(e),
        CodecError::Wire(e) => SessionError::ClientProtocol(e),
    }
}

pub(crate) fn upstream_error(e: CodecError) -> SessionError {
    match e {
        CodecError::Io(e) => SessionError::UpstreamIo(e),
        CodecError::Wire(e) => SessionError::UpstreamProtocol(e),
    }
}

/// A timer for `d`, or one that never fires when `d` is zero (disabled).
pub(crate) async fn sleep_unless_zero(d: Duration) {
    if d.is_zero() {
        std::future::pending::<()>().await;
    } else {
        tokio::time::sleep(d).await;
    }
}

/// Logs the end of a session at a level that matches whose fault it was.
/// A client's first hello with metadata, in both modes: names the connection's log span,
/// writes the handshake event, and returns the metadata for the session to keep.
pub(crate) fn record_handshake(
    ctx: &Context,
    peer: SocketAddr,
    meta: &ClientMetadata,
) -> ClientMetadata {
    let span = tracing::Span::current();
    span.record("app", meta.application.as_deref().unwrap_or("-"));
    span.record("driver", meta.driver.as_deref().unwrap_or("-"));
    debug!("client handshake");
    ctx.audit.event_with(|| handshake_event(peer, meta));
    meta.clone()
}

/// The event for a client's first hello.
pub(crate) fn handshake_event(client: SocketAddr, meta: &ClientMetadata) -> crate::audit::Event {
    crate::audit::Event::ClientHandshake {
        client,
        app: meta.application.clone(),
        driver: meta.driver.clone(),
    }
}

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
