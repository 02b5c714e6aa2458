//! One client connection in passthrough mode: read a request, inspect it, forward the
//! original bytes, relay the reply (or the whole exhaust stream), repeat.
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

use tokio_util::codec::FramedRead;
use tracing::{debug, warn};

use super::{
    error::SessionError,
    guard::{self, Judgement, Who},
    hello::{self, ClientMetadata},
    inspect::{inspect, Request},
    observe::SessionObs,
    Context,
};
use crate::{
    net::{ClientRead, ClientStream, ClientWrite, UpstreamRead, UpstreamWrite},
    upstream,
    wire::{
        builder::{error_document, reply_for},
        codec::CodecError,
        Frame, Message, MessageCodec, MsgFlags, OpCode, WireError, HEADER_LEN,
    },
};

pub(crate) type Reader = FramedRead<ClientRead, MessageCodec>;
type UpReader = FramedRead<UpstreamRead, MessageCodec>;

/// How a session ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The client closed between requests.
    ClientClosed,
    /// The client sent nothing for `client_idle_timeout`.
    Idle,
    /// Shutdown: the session was idle or finished its in-flight request.
    Drained,
}

/// Code mongod uses for an unreachable host. Used only when the upstream cannot be reached
/// at all: drivers then mark the server unknown and retry server selection, which is right.
const HOST_UNREACHABLE: (i32, &str) = (6, "HostUnreachable");

struct Session {
    ctx: Arc<Context>,
    client_in: Reader,
    client_out: ClientWrite,
    peer: SocketAddr,
    max: usize,
    metadata: Option<ClientMetadata>,
    /// The upstream's maxWireVersion, from its hello reply.
    upstream_wire_version: Option<i32>,
    /// A request the client sent while its previous one was still in flight.
    pending: Option<Frame>,
    /// The error of the last fire-and-forget write mongoguard dropped, for the client's next
    /// getLastError (legacy applications learn about write errors only that way).
    last_blocked: Option<String>,
    /// Per-session children of the proxy's shutdown tokens: waiting on the shared tokens
    /// would take their one mutex twice per request in every session.
    drain: tokio_util::sync::CancellationToken,
    kill: tokio_util::sync::CancellationToken,
    obs: SessionObs,
}

/// Runs one client connection to its end.
pub(crate) async fn run(
    ctx: Arc<Context>,
    socket: ClientStream,
    peer: SocketAddr,
) -> Result<End, SessionError> {
    // Small request/response messages: Nagle would add up to 40 ms per round trip.
    let (read, write) = socket.split();
    let max = ctx.config.proxy.max_message_size;
    let mut session = Session {
        client_in: FramedRead::new(read, MessageCodec::new(max)),
        client_out: write,
        max,
        metadata: None,
        upstream_wire_version: None,
        pending: None,
        last_blocked: None,
        drain: ctx.drain.child_token(),
        kill: ctx.kill.child_token(),
        obs: SessionObs::new(ctx.metrics.clone()),
        peer,
        ctx,
    };
    let host = session.ctx.config.upstream.uri.primary_seed().clone();
    let timeout = session.ctx.config.upstream.connect_timeout;
    let connecting = session.obs.upstream_connecting();
    let upstream = match upstream::connect(&host, timeout, session.ctx.upstream_tls.as_ref()).await
    {
        Ok(s) => s,
        Err(e) => {
            drop(connecting);
            session.refuse_first_request(&e.to_string()).await;
            return Err(e.into());
        }
    };
    drop(connecting);
    session.obs.upstream_connected();
    debug!(%peer, upstream = %host, "upstream connected");
    let (up_read, mut up_write) = upstream.split();
    let mut upstream_in = FramedRead::new(up_read, MessageCodec::new(max));
    loop {
        session.obs.end();
        let frame = match session.pending.take() {
            Some(f) => f,
            None => match session.next_request(&mut upstream_in).await? {
                Ok(f) => f,
                Err(end) => return Ok(end),
            },
        };
        let started = session.obs.begin();
        let request = session.inspect(&frame)?;
        if let Some(meta) = &request.metadata {
            let span = tracing::Span::current();
            span.record("app", meta.application.as_deref().unwrap_or("-"));
            span.record("driver", meta.driver.as_deref().unwrap_or("-"));
            debug!("client handshake");
            session
                .ctx
                .audit
                .event_with(|| handshake_event(session.peer, meta));
            session.metadata = Some(meta.clone());
        }
        session
            .obs
            .inspected(&request, session.metadata.as_ref(), started);
        if session
            .answer_locally(&request, &mut up_write, &mut upstream_in)
            .await?
        {
            let blocked = matches!(request.judgement, Judgement::Block { .. });
            session.obs.answered_locally(blocked);
            continue;
        }
        let sent = Instant::now();
        crate::net::send(&mut up_write, frame.bytes())
            .await
            .map_err(SessionError::UpstreamIo)?;
        session.ctx.stats.requests.inc();
        if request.expects_reply {
            session.relay_replies(&request, &mut upstream_in).await?;
            session.obs.forwarded(sent.elapsed());
        }
    }
}

impl Session {
    /// Parses, validates and judges a client message.
    fn inspect(&mut self, frame: &Frame) -> Result<Request, SessionError> {
        let meta = self.metadata.as_ref();
        let who = Who {
            peer: self.peer,
            app: meta.and_then(|m| m.application.as_deref()),
            driver: meta.and_then(|m| m.driver.as_deref()),
            user: None,
            upstream_wire_version: self.upstream_wire_version,
        };
        let request_id = frame.header().request_id;
        inspect(frame, self.max, self.metadata.is_none(), |msg| {
            guard::judge(&self.ctx, msg, &who, request_id, &mut self.obs.scratch)
        })
        .map_err(SessionError::ClientProtocol)
    }

    /// Answers a blocked command (or drops it when it expects no reply), and a legacy
    /// getLastError that follows a dropped write. True when the request was handled here.
    async fn answer_locally(
        &mut self,
        request: &Request,
        up_write: &mut UpstreamWrite,
        upstream_in: &mut UpReader,
    ) -> Result<bool, SessionError> {
        let (answer, abort) = match guard::local_answer(&self.ctx, request, &mut self.last_blocked)
        {
            guard::Local::Forward => return Ok(false),
            guard::Local::Handled { answer, abort } => (answer, abort),
        };
        if let Some(abort) = abort {
            self.abort_transaction(abort, up_write, upstream_in).await?;
        }
        if let Some(doc) = answer {
            send_document(&self.ctx, &mut self.client_out, request, &doc).await?;
        }
        Ok(true)
    }

    /// Sends abortTransaction upstream for a blocked command of a transaction and waits for
    /// its reply (whatever it says: a transaction that never started is already gone).
    async fn abort_transaction(
        &mut self,
        abort: &bson::RawDocument,
        up_write: &mut UpstreamWrite,
        upstream_in: &mut UpReader,
    ) -> Result<(), SessionError> {
        let id = self.ctx.request_ids.next();
        let bytes = crate::wire::builder::encode_msg_reply(id, 0, abort);
        crate::net::send(up_write, &bytes)
            .await
            .map_err(SessionError::UpstreamIo)?;
        let timeout = self.ctx.config.upstream.reply_timeout;
        let reply = tokio::select! {
            r = upstream_in.next() => r,
            _ = sleep_unless_zero(timeout) => return Err(SessionError::ReplyTimeout(timeout)),
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

    /// Waits for the next client request. `Ok(Err(end))` is a normal end of the session.
    async fn next_request(
        &mut self,
        upstream_in: &mut UpReader,
    ) -> Result<Result<Frame, End>, SessionError> {
        // Between requests the upstream has nothing to say: data or EOF here means it
        // closed or misbehaved; end the session rather than let the next request fail.
        let upstream_failure = async {
            match upstream_in.next().await {
                None => SessionError::UpstreamClosed,
                Some(Err(e)) => upstream_error(e),
                Some(Ok(_)) => SessionError::UpstreamProtocol(WireError::bad_doc(
                    "upstream",
                    "unsolicited message between requests",
                )),
            }
        };
        let idle = self.ctx.config.proxy.client_idle_timeout;
        wait_for_request(&mut self.client_in, &self.drain, idle, upstream_failure).await
    }

    /// Relays the reply, or every reply of an exhaust stream, to the client.
    async fn relay_replies(
        &mut self,
        request: &Request,
        upstream_in: &mut UpReader,
    ) -> Result<(), SessionError> {
        let reply_timeout = self.ctx.config.upstream.reply_timeout;
        let mut expected_response_to = request.request_id;
        loop {
            let timer = sleep_unless_zero(reply_timeout);
            tokio::pin!(timer);
            let reply = tokio::select! {
                biased;
                _ = self.kill.cancelled() => return Err(SessionError::Killed),
                // A streaming hello (monitoring) never ends by itself: cut it at drain.
                _ = self.drain.cancelled(), if request.is_hello && request.exhaust_allowed => {
                    return Err(SessionError::Killed);
                }
                next = upstream_in.next() => match next {
                    None => return Err(SessionError::UpstreamClosed),
                    Some(Err(e)) => return Err(upstream_error(e)),
                    Some(Ok(f)) => f,
                },
                next = self.client_in.next(), if self.pending.is_none() => match next {
                    None => return Err(SessionError::ClientGone),
                    Some(Err(e)) => return Err(client_error(e)),
                    Some(Ok(f)) => {
                        self.pending = Some(f);
                        continue;
                    }
                },
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
            if expected_response_to == request.request_id {
                self.obs.first_reply(&reply);
            }
            expected_response_to = header.request_id;
            let more = reply_more_to_come(&reply, request, self.max)
                .map_err(SessionError::UpstreamProtocol)?;
            if request.is_hello {
                if let Some(v) = hello::max_wire_version(&reply, self.max) {
                    self.upstream_wire_version = Some(v);
                }
            }
            let out = if request.is_hello {
                hello::rewrite_reply(&reply, self.max)
                    .map_err(SessionError::UpstreamProtocol)?
                    .unwrap_or_else(|| reply.into_bytes())
            } else {
                reply.into_bytes()
            };
            crate::net::send(&mut self.client_out, &out)
                .await
                .map_err(SessionError::ClientIo)?;
            if !more {
                return Ok(());
            }
        }
    }

    /// The upstream is unreachable: answer the client's first request with a clear error in
    /// its opcode family, then close.
    async fn refuse_first_request(&mut self, reason: &str) {
        let first = tokio::time::timeout(Duration::from_secs(10), self.client_in.next()).await;
        let Ok(Some(Ok(frame))) = first else { return };
        let Ok(request) = inspect(&frame, self.max, false, |_| Judgement::Forward) else {
            return;
        };
        if !request.expects_reply {
            return;
        }
        let doc = error_document(
            HOST_UNREACHABLE.0,
            HOST_UNREACHABLE.1,
            &format!("mongoguard: {reason}"),
        );
        let our_id = self.ctx.request_ids.next();
        if let Some(bytes) = reply_for(request.op, request.request_id, our_id, &doc) {
            let _ = crate::net::send(&mut self.client_out, &bytes).await;
        }
    }
}

/// Waits for a client's next request, in both modes: `Ok(Err(end))` when the session ends
/// normally (client closed, idle for `idle`, drain), an error when the client sends garbage
/// or `failure` (something the session also watches, e.g. its upstream) completes first.
pub(crate) async fn wait_for_request(
    client_in: &mut Reader,
    drain: &tokio_util::sync::CancellationToken,
    idle: Duration,
    failure: impl std::future::Future<Output = SessionError>,
) -> Result<Result<Frame, End>, SessionError> {
    let idle_timer = sleep_unless_zero(idle);
    tokio::pin!(idle_timer);
    tokio::select! {
        biased;
        _ = drain.cancelled() => Ok(Err(End::Drained)),
        next = client_in.next() => match next {
            None => Ok(Err(End::ClientClosed)),
            Some(Ok(frame)) => Ok(Ok(frame)),
            Some(Err(e)) => Err(client_error(e)),
        },
        e = failure => Err(e),
        _ = &mut idle_timer => {
            debug!(timeout = ?idle, "closing idle client connection");
            Ok(Err(End::Idle))
        }
    }
}

/// Writes mongoguard's own reply `doc` to `request`, in the request's opcode family.
pub(crate) async fn send_document(
    ctx: &Context,
    out: &mut ClientWrite,
    request: &Request,
    doc: &bson::RawDocument,
) -> Result<(), SessionError> {
    let our_id = ctx.request_ids.next();
    if let Some(bytes) = reply_for(request.op, request.request_id, our_id, doc) {
        crate::net::send(out, &bytes)
            .await
            .map_err(SessionError::ClientIo)?;
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
                .get(HEADER_LEN..HEADER_LEN + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
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
        Err(SessionError::ClientGone) | Err(SessionError::Killed) => {
            debug!(error = %result.as_ref().err().map(ToString::to_string).unwrap_or_default(), "client session closed")
        }
        Err(e) => warn!(error = %e, "client session closed"),
    }
}
