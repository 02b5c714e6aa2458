//! The upstream side: where mongod / mongos is, and connecting to it.

mod conn;
mod identity;
pub mod pool;
pub mod srv;
pub mod topology;

pub(crate) use conn::{next_own_request_id, reply_ok};
pub use conn::{HelloFacts, Role, UpstreamConn};
pub use identity::{Credentials, Identities, Identity, DEFAULT_IDENTITY};
// The URI is a settings type (`config::uri`); these names stay for the code that reached
// them here.
pub use crate::config::{Host, UpstreamUri};

use std::time::Duration;

use tokio::net::TcpStream;

/// Why an upstream connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Every address failed; the last error is kept.
    #[error("cannot connect to upstream {host}: {source}")]
    Io {
        /// The host tried.
        host: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// The connect did not finish in time.
    #[error("connecting to upstream {host} timed out after {timeout:?}")]
    Timeout {
        /// The host tried.
        host: String,
        /// The budget.
        timeout: Duration,
    },
    /// The TLS handshake with the upstream failed (certificate, name, protocol).
    #[error("TLS handshake with upstream {host} failed: {source}")]
    Tls {
        /// The host tried.
        host: String,
        /// The TLS error.
        source: std::io::Error,
    },
    /// The upstream answered the handshake (hello) with an error or garbage.
    #[error("upstream {host} handshake failed: {reason}")]
    Handshake {
        /// The host tried.
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// The upstream refused mongoguard's credentials for an identity.
    #[error("upstream {host} refused authentication as identity {identity:?}: {reason}")]
    Auth {
        /// The host tried.
        host: String,
        /// The identity's name.
        identity: String,
        /// The server's message.
        reason: String,
    },
}

impl ConnectError {
    /// False when the failure is mongoguard's own (out of file descriptors, of memory, of
    /// local ports): it says nothing about the server, which must not be marked Unknown for
    /// it (that would close every session attached to a primary that is fine).
    pub fn implicates_server(&self) -> bool {
        match self {
            ConnectError::Io { source, .. } => !is_local_shortage(source),
            _ => true,
        }
    }
}

/// EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL (no local port left).
fn is_local_shortage(e: &std::io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    #[cfg(target_os = "linux")]
    const ENOBUFS: i32 = 105;
    #[cfg(not(target_os = "linux"))]
    const ENOBUFS: i32 = 55;
    matches!(
        e.kind(),
        std::io::ErrorKind::AddrNotAvailable | std::io::ErrorKind::OutOfMemory
    ) || matches!(e.raw_os_error(), Some(ENFILE | EMFILE | ENOBUFS))
}

/// Opens a connection to `host` (TLS when `tls` is given) within `timeout`.
pub async fn connect(
    host: &Host,
    timeout: Duration,
    tls: Option<&crate::tls::UpstreamTls>,
) -> Result<crate::net::UpstreamStream, ConnectError> {
    let started = tokio::time::Instant::now();
    let tcp = connect_tcp(host, timeout).await?;
    let Some(tls) = tls else {
        return Ok(crate::net::Either::Plain(tcp));
    };
    let left = timeout.saturating_sub(started.elapsed());
    match tokio::time::timeout(left, tls.connect(host, tcp)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(ConnectError::Tls {
            host: host.to_string(),
            source,
        }),
        Err(_) => Err(ConnectError::Timeout {
            host: host.to_string(),
            timeout,
        }),
    }
}

/// Opens a TCP connection to `host` with `TCP_NODELAY` (requests are small and latency-bound).
pub async fn connect_tcp(host: &Host, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let connecting = async {
        // An SRV target known to `upstream.dns_server` is resolved there (srv.rs).
        match srv::target_addrs(host).await {
            Some(addrs) => TcpStream::connect(&addrs?[..]).await,
            None => TcpStream::connect((&*host.name, host.port)).await,
        }
    };
    let stream = match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => {
            return Err(ConnectError::Io {
                host: host.to_string(),
                source,
            })
        }
        Err(_) => {
            return Err(ConnectError::Timeout {
                host: host.to_string(),
                timeout,
            })
        }
    };
    stream
        .set_nodelay(true)
        .map_err(|source| ConnectError::Io {
            host: host.to_string(),
            source,
        })?;
    Ok(stream)
}
