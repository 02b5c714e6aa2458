//! Why a client session ended. Each variant says which side failed: the client, the upstream,
//! or mongoguard's own shutdown.

use std::time::Duration;

use thiserror::Error;

use crate::{upstream::ConnectError, wire::WireError};

/// Why a proxy could not start.
#[derive(Debug, Error)]
pub enum ProxyError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The session threads (`proxy.threads`) could not be started.
    #[error("cannot start the session threads (proxy.threads): {0}")]
    Threads(std::io::Error),
    /// The policy file could not be loaded (never replaced by defaults).
    #[error("policy: {0}")]
    Policy(crate::policy::PolicyError),
    /// A TLS certificate, key or option could not be used.
    #[error("tls: {0}")]
    Tls(crate::tls::TlsError),
    /// Pooled mode could not start (users file, identities, pool limits).
    #[error("pooled mode: {0}")]
    Pooled(String),
    /// The allowlist file could not be loaded (enforce mode), or cannot be learned into.
    #[error("{0}")]
    Allowlist(crate::allowlist::AllowlistError),
    /// The violation log could not be started (e.g. its file cannot be opened).
    #[error("audit log: {0}")]
    Audit(crate::audit::AuditError),
    /// A `mongodb+srv://` upstream could not be resolved into hosts.
    #[error("upstream.uri {0}")]
    Srv(crate::upstream::srv::SrvError),
    /// The admin listener's configuration (its token file) is unusable.
    #[error("admin listener: {0}")]
    Admin(crate::config::ConfigError),
}

/// An abnormal end of a client session.
#[derive(Debug, Error)]
pub enum SessionError {
    /// The client sent bytes that are not a valid message.
    #[error("client sent an invalid message: {0}")]
    ClientProtocol(WireError),
    /// The client's socket failed.
    #[error("client connection failed: {0}")]
    ClientIo(std::io::Error),
    /// The client did not take its reply within `client_write_timeout`.
    #[error("client did not read its reply within {0:?}")]
    ClientWriteTimeout(Duration),
    /// A message the client started did not arrive whole within `client_read_timeout`.
    #[error("client did not finish sending its message within {0:?}")]
    ClientReadTimeout(Duration),
    /// The upstream server this session is attached to stopped being the primary (or went
    /// down): the client reconnects and lands on the new primary.
    #[error("the upstream server {0} is no longer the primary")]
    PrimaryChanged(String),
    /// The client left while its request was in flight.
    #[error("client disconnected with a request in flight")]
    ClientGone,
    /// The upstream could not be reached.
    #[error(transparent)]
    UpstreamConnect(#[from] ConnectError),
    /// The upstream's socket failed.
    #[error("upstream connection failed: {0}")]
    UpstreamIo(std::io::Error),
    /// The upstream sent bytes that are not a valid reply.
    #[error("upstream sent an invalid reply: {0}")]
    UpstreamProtocol(WireError),
    /// The upstream closed its connection.
    #[error("upstream closed the connection")]
    UpstreamClosed,
    /// The upstream did not answer in time.
    #[error("upstream did not reply within {0:?}")]
    ReplyTimeout(Duration),
    /// A large reply found the memory budget spent: it was not read, the session ends.
    #[error("memory budget spent: a {0}-byte reply was not relayed")]
    ReplyOverBudget(usize),
    /// mongoguard's drain deadline passed with this request still in flight.
    #[error("closed at the end of the shutdown drain period")]
    Killed,
}

impl SessionError {
    /// True when the upstream side is at fault (for counters).
    pub fn is_upstream(&self) -> bool {
        matches!(
            self,
            SessionError::UpstreamConnect(_)
                | SessionError::UpstreamIo(_)
                | SessionError::UpstreamProtocol(_)
                | SessionError::UpstreamClosed
                | SessionError::ReplyTimeout(_)
                | SessionError::PrimaryChanged(_)
        )
    }
}

/// A client socket's read error, as a session error.
pub(crate) fn client_error(e: crate::wire::codec::CodecError) -> SessionError {
    match e {
        crate::wire::codec::CodecError::Io(e) => SessionError::ClientIo(e),
        crate::wire::codec::CodecError::Wire(e) => SessionError::ClientProtocol(e),
    }
}

/// An upstream socket's read error, as a session error.
pub(crate) fn upstream_error(e: crate::wire::codec::CodecError) -> SessionError {
    match e {
        crate::wire::codec::CodecError::Io(e) => SessionError::UpstreamIo(e),
        crate::wire::codec::CodecError::Wire(e) => SessionError::UpstreamProtocol(e),
    }
}
