//! Answering a client that a connection limit refuses: with a MongoDB error, not a bare reset.
//!
//! A driver that sees its connection reset reports a network error and retries, and the
//! operator learns nothing from the application's log. Instead the refused connection is
//! accepted, its first message (the driver's handshake `hello` / `isMaster`, OP_MSG or
//! OP_QUERY) is read, answered with `HostUnreachable` (code 6) in the request's own opcode
//! family and an errmsg naming the limit, and the connection is closed. mongod itself just
//! closes a connection past `net.maxIncomingConnections`; code 6 is what mongoguard already
//! answers when it cannot reach its upstream, and from the client's side this is the same
//! fact — this endpoint cannot serve it now.
//!
//! A flood of refused clients must cost bounded work: at most [`REFUSALS_MAX`] are answered at
//! once (the rest are closed at once), each within [`REFUSAL_TIMEOUT`] (TLS handshake, read and
//! write included), reading at most [`FIRST_MESSAGE_MAX`] bytes. The warning is logged at most
//! once per [`WARN_EVERY`], with the number refused since the last one.

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::Semaphore,
};

use crate::wire::{builder, Header, OpCode, HEADER_LEN};

/// Refused connections answered at the same time.
pub(crate) const REFUSALS_MAX: usize = 64;
/// Time to answer one refused connection.
pub(crate) const REFUSAL_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest first message read from a refused client (a handshake is far smaller).
pub(crate) const FIRST_MESSAGE_MAX: usize = 16 * 1024;
/// The least time between two warnings about refused connections.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// The code refused clients get.
pub(crate) const REFUSED_CODE: i32 = 6;
/// Its name.
pub(crate) const REFUSED_CODE_NAME: &str = "HostUnreachable";

/// The error document of a refusal by any connection limit.
pub(crate) fn limit_error(errmsg: &str) -> bson::RawDocumentBuf {
    builder::error_document(REFUSED_CODE, REFUSED_CODE_NAME, errmsg)
}

static ANSWERING: Semaphore = Semaphore::const_new(REFUSALS_MAX);
static REFUSED_SINCE_WARN: AtomicU64 = AtomicU64::new(0);
static LAST_WARN_SECS: AtomicU64 = AtomicU64::new(0);

/// Refuses `socket`: answers its first message with `errmsg` (bounded, in the background) or,
/// when too many refusals are already being answered, closes it at once.
pub(crate) fn refuse(
    tls: Option<crate::tls::ServerTls>,
    socket: TcpStream,
    peer: SocketAddr,
    errmsg: String,
) {
    warn_throttled(peer, &errmsg);
    let Ok(permit) = ANSWERING.try_acquire() else {
        drop(socket);
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let answered = tokio::time::timeout(REFUSAL_TIMEOUT, answer(tls, socket, &errmsg)).await;
        if let Ok(Err(e)) = answered {
            tracing::debug!(%peer, error = %e, "refused connection: no answer sent");
        }
    });
}

fn warn_throttled(peer: SocketAddr, errmsg: &str) {
    let refused = REFUSED_SINCE_WARN.fetch_add(1, Ordering::Relaxed) + 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_WARN_SECS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < WARN_EVERY.as_secs() && last != 0 {
        return;
    }
    if LAST_WARN_SECS
        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    REFUSED_SINCE_WARN.fetch_sub(refused, Ordering::Relaxed);
    tracing::warn!(%peer, refused, "{errmsg} (connections refused since the last warning: {refused})");
}

async fn answer(
    tls: Option<crate::tls::ServerTls>,
    socket: TcpStream,
    errmsg: &str,
) -> std::io::Result<()> {
    let mut stream = match tls {
        None => crate::net::Either::Plain(socket),
        Some(tls) => tls.accept(socket).await?,
    };
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).await?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not a MongoDB message");
    let header = Header::parse(&head).ok_or_else(bad)?;
    let length = usize::try_from(header.length).map_err(|_| bad())?;
    if !(HEADER_LEN..=FIRST_MESSAGE_MAX).contains(&length) {
        return Err(bad());
    }
    // The body is not judged, only consumed: the answer is the same whatever it says.
    let mut rest = vec![0u8; length - HEADER_LEN];
    stream.read_exact(&mut rest).await?;
    let op = OpCode::from_i32(header.op_code).ok_or_else(bad)?;
    let doc = limit_error(errmsg);
    if let Some(reply) = builder::reply_for(op, header.request_id, 0, &doc) {
        stream.write_all(&reply).await?;
        stream.flush().await?;
    }
    stream.shutdown().await
}
