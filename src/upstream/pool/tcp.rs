//! Plain TCP upstream connections for the pool. Upstream authentication and TLS will wrap
//! this connector; the usability check stays the same.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::net::TcpStream;

use super::{Connector, PoolKey, PooledConn};
use crate::upstream::{connect_tcp, ConnectError};

/// An idle upstream TCP connection is usable if reading from it would block: a read of 0
/// bytes means the server closed it, an error means it is broken, and data means the server
/// sent something unsolicited on an idle connection (out of sync, so unusable too).
///
/// Relies on the readiness tokio's reactor has already observed: a close that happened a
/// moment before the check may not be noticed yet, and the request's own error handling must
/// still discard the connection then.
impl PooledConn for TcpStream {
    fn is_usable(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self.try_read(&mut probe) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => true,
            Ok(_) | Err(_) => false,
        }
    }
}

/// Opens plain TCP connections (with `TCP_NODELAY`) to the key's server.
#[derive(Debug, Clone)]
pub struct TcpConnector {
    /// Budget for one TCP connect.
    pub connect_timeout: Duration,
}

impl TcpConnector {
    /// A connector giving each connect `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        TcpConnector { connect_timeout }
    }
}

impl Connector for TcpConnector {
    type Conn = TcpStream;

    async fn connect(&self, key: &PoolKey) -> Result<TcpStream, ConnectError> {
        connect_tcp(&key.server, self.connect_timeout).await
    }
}
