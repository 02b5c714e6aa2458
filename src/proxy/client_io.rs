//! Bounded I/O with a client, for both modes: every read and write has a deadline, every wait
//! watches the kill token, and large messages are paid for from the process-wide memory
//! budget before they are buffered.
//!
//! - A message whose first byte has arrived must arrive whole within `client_read_timeout`
//!   (slowloris), independently of `client_idle_timeout`, which runs between messages.
//! - A reply the client does not take within `client_write_timeout` closes the connection
//!   (and frees the buffered reply).
//! - A message larger than [`BUDGET_FREE_BELOW`] takes its size from [`MemoryBudget`] as soon
//!   as its header is in; when the budget stays spent for `memory_budget_wait`, the rest of the
//!   message is read and thrown away (never buffered) and the client gets error 65003.

use std::{
    future::Future,
    pin::Pin,
    task::Poll,
    time::{Duration, Instant},
};

use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tracing::{debug, info};

pub(crate) use super::budget::{BudgetPermit, MemoryBudget};
use super::error::{client_error, SessionError};
use crate::wire::{codec::CodecError, le_u32, Frame, MessageCodec, OpCode, HEADER_LEN};

/// A client's socket, read as messages.
pub(crate) type Reader = tokio_util::codec::FramedRead<crate::net::ClientRead, MessageCodec>;

/// Messages up to this size are not counted against the budget: every connection may hold
/// one (the connection cap bounds them), and counting them would cost a semaphore operation
/// on every small request.
pub(crate) const BUDGET_FREE_BELOW: usize = 64 * 1024;

/// mongoguard's code for a request refused because the memory budget is spent. Outside
/// every code drivers retry or treat as a network error.
pub const MEMORY_BUDGET_CODE: i32 = 65_003;
/// The codeName paired with [`MEMORY_BUDGET_CODE`].
pub const MEMORY_BUDGET_CODE_NAME: &str = "MongoguardMemoryBudget";

/// The client-side timeouts and budget of a session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub idle: Duration,
    pub read: Duration,
    pub write: Duration,
    pub budget_wait: Duration,
}

impl Limits {
    pub(crate) fn from_config(c: &crate::config::ProxyConfig) -> Limits {
        Limits {
            idle: c.client_idle_timeout,
            read: c.client_read_timeout,
            write: c.client_write_timeout,
            budget_wait: c.memory_budget_wait,
        }
    }
}

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

/// What waiting for a request produced.
pub(crate) enum Incoming {
    /// A whole message, with the budget it holds (large messages only).
    Frame(Frame, Option<BudgetPermit>),
    /// A large message that found the budget spent: it was read and thrown away; the client
    /// is owed error 65003 for `request_id` in the `op` family (when `expects_reply`).
    OverBudget {
        request_id: i32,
        op: OpCode,
        expects_reply: bool,
    },
    /// The session ends normally.
    End(End),
}

/// Runs a write within `limit` (zero: no limit), never past `kill`; `side` says whose socket
/// it is, for the error.
pub(crate) async fn bounded_write(
    write: impl Future<Output = std::io::Result<()>>,
    limit: Duration,
    kill: &super::stop::Stop,
    side: Side,
) -> Result<(), SessionError> {
    tokio::select! {
        biased;
        _ = kill.killed() => Err(SessionError::Killed),
        r = write => r.map_err(|e| match side {
            Side::Client => SessionError::ClientIo(e),
            Side::Upstream => SessionError::UpstreamIo(e),
        }),
        _ = sleep_unless_zero(limit) => Err(match side {
            Side::Client => SessionError::ClientWriteTimeout(limit),
            // An upstream that does not read is as dead as one that does not answer.
            Side::Upstream => SessionError::ReplyTimeout(limit),
        }),
    }
}

/// Whose socket a write goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Client,
    Upstream,
}

/// Writes a whole message to the client within `limit` (`client_write_timeout`).
pub(crate) async fn send_to_client<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    bytes: &[u8],
    limit: Duration,
    kill: &super::stop::Stop,
) -> Result<(), SessionError> {
    bounded_write(crate::net::send(out, bytes), limit, kill, Side::Client).await
}

/// What one poll of the client socket produced.
enum Step {
    Next(Option<Result<Frame, CodecError>>),
    /// A large message's header is in and it holds no budget yet: `(declared length)`.
    NeedsBudget(usize),
    ReadTimeout,
}

/// Polls `reader` for its next message; arms the `client_read_timeout` timer as soon as any
/// byte of a message is buffered, and stops early when a large message needs budget.
async fn poll_message(reader: &mut Reader, read: Duration, paid: bool) -> Step {
    // Built only when a message is partly in (a sleep costs a runtime handle lookup even
    // unpolled, and most messages arrive whole).
    let mut started: Option<Pin<Box<tokio::time::Sleep>>> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(next) = reader.poll_next_unpin(cx) {
            return Poll::Ready(Step::Next(next));
        }
        let buffered = reader.read_buffer();
        if !paid {
            if let Some(len) = le_u32(buffered).and_then(|l| usize::try_from(l).ok()) {
                if len > BUDGET_FREE_BELOW && buffered.len() >= HEADER_LEN + 4 {
                    return Poll::Ready(Step::NeedsBudget(len));
                }
            }
        }
        if started.is_none() && !read.is_zero() && !buffered.is_empty() {
            started = Some(Box::pin(tokio::time::sleep(read)));
        }
        if let Some(timer) = started.as_mut() {
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Step::ReadTimeout);
            }
        }
        Poll::Pending
    })
    .await
}

/// How long a connection with nothing read yet is still listened to once the drain starts: a
/// request the client sent just before may be in the socket while the runtime has not yet
/// seen it readable, and cutting it off unread would leave the client unable to tell whether
/// it ran.
pub(crate) const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// Completes [`DRAIN_GRACE`] after the drain started (`grace` keeps the deadline across the
/// loop's turns).
async fn drain_grace(stop: &super::stop::Stop, grace: &mut Option<tokio::time::Instant>) {
    stop.draining().await;
    let deadline = *grace.get_or_insert_with(|| tokio::time::Instant::now() + DRAIN_GRACE);
    tokio::time::sleep_until(deadline).await;
}

/// Waits for a client's next request, in both modes: a whole message; a large message that
/// found the budget spent (already thrown away); or the normal end of the session (client
/// closed, idle for `limits.idle`, drain). An error when the client sends garbage, is too
/// slow to finish a message, or `failure` (something the session also watches, e.g. its
/// upstream) completes first.
pub(crate) async fn wait_for_request(
    client_in: &mut Reader,
    kill: &super::stop::Stop,
    idle_timer: &mut super::timer::LazyTimer,
    limits: Limits,
    budget: &MemoryBudget,
    failure: impl Future<Output = SessionError>,
) -> Result<Incoming, SessionError> {
    tokio::pin!(failure);
    idle_timer.arm(limits.idle);
    let mut permit = None;
    let mut grace = None;
    loop {
        let message_started = !client_in.read_buffer().is_empty();
        // The client's bytes are read before the drain is looked at: a request that has
        // reached the socket when the drain starts is served, not cut off unread (the client
        // could not tell whether it ran). Only a connection with nothing sent ends here.
        let step = tokio::select! {
            biased;
            _ = kill.killed() => return Err(SessionError::Killed),
            step = poll_message(client_in, limits.read, permit.is_some()) => step,
            _ = drain_grace(kill, &mut grace), if !message_started => {
                if client_in.read_buffer().is_empty() {
                    return Ok(Incoming::End(End::Drained));
                }
                // Part of a message arrived in this very poll: finish reading it.
                continue;
            }
            e = &mut failure => return Err(e),
            _ = idle_timer.expired(), if !message_started => {
                debug!(timeout = ?limits.idle, "closing idle client connection");
                return Ok(Incoming::End(End::Idle));
            }
        };
        match step {
            Step::Next(None) => return Ok(Incoming::End(End::ClientClosed)),
            Step::Next(Some(Ok(frame))) => return Ok(Incoming::Frame(frame, permit)),
            Step::Next(Some(Err(e))) => return Err(client_error(e)),
            Step::ReadTimeout => {
                info!(timeout = ?limits.read, "client did not finish its message; closing");
                return Err(SessionError::ClientReadTimeout(limits.read));
            }
            Step::NeedsBudget(len) => match budget.take(len, limits.budget_wait, kill).await {
                Some(p) => permit = Some(p),
                None if kill.is_killed() => return Err(SessionError::Killed),
                None => return discard_over_budget(client_in, len, limits.read).await,
            },
        }
    }
}

/// Reads and throws away the rest of a `len`-byte message whose header is buffered, without
/// ever holding more than a small scratch buffer, within `read` (the message's read
/// deadline); then says whom to answer.
async fn discard_over_budget(
    client_in: &mut Reader,
    len: usize,
    read: Duration,
) -> Result<Incoming, SessionError> {
    let head = client_in.read_buffer();
    let request_id = crate::wire::Header::parse(head).map_or(0, |h| h.request_id);
    let op_code = head.get(12..).and_then(le_u32).map_or(0, |v| v as i32);
    let word = head.get(HEADER_LEN..).and_then(le_u32).unwrap_or(0);
    // OP_MSG: flagBits; OP_COMPRESSED: the original opcode (its flags are compressed: a
    // compressed OP_MSG is assumed to expect a reply, which nearly all do).
    let (op, expects_reply) = match OpCode::from_i32(op_code) {
        Some(OpCode::Msg) => (OpCode::Msg, !crate::wire::MsgFlags(word).more_to_come()),
        Some(OpCode::Query) => (OpCode::Query, true),
        Some(OpCode::Compressed) => match OpCode::from_i32(word as i32) {
            Some(OpCode::Query) => (OpCode::Query, true),
            Some(OpCode::Msg) => (OpCode::Msg, true),
            Some(other) => (other, false),
            None => return Err(over_budget_garbage(op_code)),
        },
        Some(other) => (other, false),
        None => return Err(over_budget_garbage(op_code)),
    };
    let mut left = len.saturating_sub(head.len());
    client_in.read_buffer_mut().clear();
    let deadline = Instant::now()
        + if read.is_zero() {
            Duration::MAX / 4
        } else {
            read
        };
    let mut scratch = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = left.min(scratch.len());
        let Some(buf) = scratch.get_mut(..want) else {
            break;
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let n = match tokio::time::timeout(remaining, client_in.get_mut().read(buf)).await {
            Err(_) => return Err(SessionError::ClientReadTimeout(read)),
            Ok(Err(e)) => return Err(SessionError::ClientIo(e)),
            Ok(Ok(0)) => return Err(SessionError::ClientGone),
            Ok(Ok(n)) => n,
        };
        left = left.saturating_sub(n);
    }
    info!(
        bytes = len,
        "memory budget spent: a large client message was refused (65003)"
    );
    Ok(Incoming::OverBudget {
        request_id,
        op,
        expects_reply,
    })
}

fn over_budget_garbage(op_code: i32) -> SessionError {
    SessionError::ClientProtocol(crate::wire::WireError::UnknownOpCode(op_code))
}

/// The error document of a request refused for memory.
pub(crate) fn over_budget_document() -> bson::RawDocumentBuf {
    crate::wire::builder::error_document(
        MEMORY_BUDGET_CODE,
        MEMORY_BUDGET_CODE_NAME,
        "mongoguard: memory budget for messages in flight is spent (proxy.memory_budget); \
         the request was not run: retry later or send smaller batches",
    )
}

/// The error document of a request whose large reply found the memory budget spent: the
/// server ran the command, the reply was not relayed.
pub(crate) fn reply_over_budget_document(len: usize) -> bson::RawDocumentBuf {
    crate::wire::builder::error_document(
        MEMORY_BUDGET_CODE,
        MEMORY_BUDGET_CODE_NAME,
        &format!(
            "mongoguard: memory budget for messages in flight is spent (proxy.memory_budget): \
             the server's {len}-byte reply was not relayed. The command was run by the \
             server; this connection is closed"
        ),
    )
}

/// A client request ready for inspection, with the memory budget it holds until it is done.
pub(crate) struct Received {
    /// The message as the client sent it (what is forwarded).
    pub frame: Frame,
    /// Its decompressed form, for an OP_COMPRESSED message.
    pub inner: Option<Frame>,
    _budget: (Option<BudgetPermit>, Option<BudgetPermit>),
}

/// What the session loop does next.
pub(crate) enum Next {
    /// Inspect and serve this request.
    Request(Received),
    /// The request was refused for memory (answered here); wait for the next one.
    Refused,
    /// The session ends normally.
    End(End),
}

/// The part of every session loop between "something arrived" and "inspect it": answers a
/// message refused for memory, and decompresses (budgeted, off the runtime threads) a
/// compressed one.
pub(crate) async fn receive(
    ctx: &super::Context,
    out: &mut crate::net::ClientWrite,
    incoming: Incoming,
    limits: Limits,
    kill: &super::stop::Stop,
) -> Result<Next, SessionError> {
    let (frame, permit) = match incoming {
        // A large message that arrived whole in one read (or was pipelined during a relay)
        // was never gated: it pays now, or is refused and freed at once.
        Incoming::Frame(f, None) if f.bytes().len() > BUDGET_FREE_BELOW => {
            match ctx
                .budget
                .take(f.bytes().len(), limits.budget_wait, kill)
                .await
            {
                Some(p) => (f, Some(p)),
                None if kill.is_killed() => return Err(SessionError::Killed),
                None => {
                    refuse_unpaid(ctx, out, &f, limits, kill).await?;
                    return Ok(Next::Refused);
                }
            }
        }
        Incoming::Frame(f, p) => (f, p),
        Incoming::End(end) => return Ok(Next::End(end)),
        Incoming::OverBudget {
            request_id,
            op,
            expects_reply,
        } => {
            if expects_reply {
                refuse_over_budget(ctx, out, op, request_id, limits, kill).await?;
            }
            return Ok(Next::Refused);
        }
    };
    let max = ctx.config.proxy.max_message_size;
    use super::inspect::{decompress_off_thread, Decompressed};
    let decompressed = decompress_off_thread(&frame, max, &ctx.budget, limits.budget_wait, kill)
        .await
        .map_err(SessionError::ClientProtocol)?;
    let (inner, inner_permit) = match decompressed {
        Decompressed::Plain => (None, None),
        Decompressed::Inner(f, p) => (Some(f), p),
        Decompressed::OverBudget => {
            let op = compressed_original_op(&frame);
            let id = frame.header().request_id;
            refuse_over_budget(ctx, out, op, id, limits, kill).await?;
            return Ok(Next::Refused);
        }
    };
    Ok(Next::Request(Received {
        frame,
        inner,
        _budget: (permit, inner_permit),
    }))
}

/// Answers a whole message that found the budget spent with 65003 (when it expects a
/// reply).
async fn refuse_unpaid(
    ctx: &super::Context,
    out: &mut crate::net::ClientWrite,
    f: &Frame,
    limits: Limits,
    kill: &super::stop::Stop,
) -> Result<(), SessionError> {
    let header = f.header();
    let op = OpCode::from_i32(header.op_code).unwrap_or(OpCode::Msg);
    let more_to_come = op == OpCode::Msg
        && f.bytes()
            .get(HEADER_LEN..)
            .and_then(le_u32)
            .is_some_and(|w| crate::wire::MsgFlags(w).more_to_come());
    let expects_reply =
        matches!(op, OpCode::Msg | OpCode::Query | OpCode::Compressed) && !more_to_come;
    if !expects_reply {
        return Ok(());
    }
    let op = if op == OpCode::Compressed {
        compressed_original_op(f)
    } else {
        op
    };
    refuse_over_budget(ctx, out, op, header.request_id, limits, kill).await
}

/// The opcode family of the reply to an OP_COMPRESSED message (its original opcode).
fn compressed_original_op(frame: &Frame) -> OpCode {
    frame
        .bytes()
        .get(HEADER_LEN..)
        .and_then(le_u32)
        .and_then(|v| OpCode::from_i32(v as i32))
        .unwrap_or(OpCode::Msg)
}

/// While a request is in flight, watches the client for what it sends next: a whole small
/// message (pipelined; kept for later), its departure or garbage. A large message is not
/// read on: `Ok(None)` says stop watching until the request is done, so the next wait for a
/// request gates it on the memory budget before it is buffered.
pub(crate) async fn watch_client(client_in: &mut Reader) -> Result<Option<Frame>, SessionError> {
    match poll_message(client_in, Duration::ZERO, false).await {
        Step::Next(Some(Ok(f))) => Ok(Some(f)),
        Step::Next(Some(Err(e))) => Err(client_error(e)),
        Step::Next(None) => Err(SessionError::ClientGone),
        Step::NeedsBudget(_) | Step::ReadTimeout => Ok(None),
    }
}

async fn refuse_over_budget(
    ctx: &super::Context,
    out: &mut crate::net::ClientWrite,
    op: OpCode,
    request_id: i32,
    limits: Limits,
    kill: &super::stop::Stop,
) -> Result<(), SessionError> {
    let doc = over_budget_document();
    send_own_reply(ctx, out, op, request_id, &doc, limits.write, kill).await
}

/// Writes mongoguard's own reply `doc` to request `request_id`, in the `op` family (with a
/// requestID of mongoguard's), within `limit`.
pub(crate) async fn send_own_reply(
    ctx: &super::Context,
    out: &mut crate::net::ClientWrite,
    op: OpCode,
    request_id: i32,
    doc: &bson::RawDocument,
    limit: Duration,
    kill: &super::stop::Stop,
) -> Result<(), SessionError> {
    let our_id = ctx.request_ids.next();
    match crate::wire::builder::reply_for(op, request_id, our_id, doc) {
        Some(bytes) => send_to_client(out, &bytes, limit, kill).await,
        None => Ok(()),
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
