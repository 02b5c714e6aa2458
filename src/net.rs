//! Byte streams that are plain TCP or TLS over TCP, for both sides of the proxy. An enum
//! rather than a boxed trait object: the plain path stays a direct call into tokio's TCP
//! halves (split without a lock), and TLS adds one match per poll.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpStream,
    },
};

/// Plain or TLS.
#[derive(Debug)]
pub enum Either<A, B> {
    /// Plain TCP (or its half).
    Plain(A),
    /// TLS (or its half).
    Tls(B),
}

impl<A: AsyncRead + Unpin, B: AsyncRead + Unpin> AsyncRead for Either<A, B> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(a) => Pin::new(a).poll_read(cx, buf),
            Either::Tls(b) => Pin::new(b).poll_read(cx, buf),
        }
    }
}

impl<A: AsyncWrite + Unpin, B: AsyncWrite + Unpin> AsyncWrite for Either<A, B> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Either::Plain(a) => Pin::new(a).poll_write(cx, buf),
            Either::Tls(b) => Pin::new(b).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(a) => Pin::new(a).poll_flush(cx),
            Either::Tls(b) => Pin::new(b).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(a) => Pin::new(a).poll_shutdown(cx),
            Either::Tls(b) => Pin::new(b).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Either::Plain(a) => Pin::new(a).poll_write_vectored(cx, bufs),
            Either::Tls(b) => Pin::new(b).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Either::Plain(a) => a.is_write_vectored(),
            Either::Tls(b) => b.is_write_vectored(),
        }
    }
}

/// A client connection.
pub type ClientStream = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;
/// The reading half of a client connection.
pub type ClientRead = Either<OwnedReadHalf, ReadHalf<tokio_rustls::server::TlsStream<TcpStream>>>;
/// The writing half of a client connection.
pub type ClientWrite =
    Either<OwnedWriteHalf, WriteHalf<tokio_rustls::server::TlsStream<TcpStream>>>;

/// An upstream connection.
pub type UpstreamStream = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;
/// The reading half of an upstream connection.
pub type UpstreamRead = Either<OwnedReadHalf, ReadHalf<tokio_rustls::client::TlsStream<TcpStream>>>;
/// The writing half of an upstream connection.
pub type UpstreamWrite =
    Either<OwnedWriteHalf, WriteHalf<tokio_rustls::client::TlsStream<TcpStream>>>;

impl<T> Either<OwnedWriteHalf, T> {
    /// Drops a write half whose peer has already closed its side, without tokio's
    /// `shutdown(2)` on drop: the socket's close (when the read half goes) sends the FIN just
    /// the same, one syscall fewer per connection. A TLS half is dropped as usual.
    pub fn drop_after_peer_closed(self) {
        match self {
            Either::Plain(w) => w.forget(),
            Either::Tls(t) => drop(t),
        }
    }
}

impl<T: AsyncRead + AsyncWrite> Either<TcpStream, T> {
    /// Splits into halves: tokio's lock-free TCP halves for plain connections, tokio's
    /// generic (locking) split for TLS, whose reads and writes share one session state.
    #[allow(clippy::type_complexity)]
    pub fn split(
        self,
    ) -> (
        Either<OwnedReadHalf, ReadHalf<T>>,
        Either<OwnedWriteHalf, WriteHalf<T>>,
    ) {
        match self {
            Either::Plain(s) => {
                let (r, w) = s.into_split();
                (Either::Plain(r), Either::Plain(w))
            }
            Either::Tls(t) => {
                let (r, w) = tokio::io::split(t);
                (Either::Tls(r), Either::Tls(w))
            }
        }
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream
    where
        T: TcpInside,
    {
        match self {
            Either::Plain(s) => s,
            Either::Tls(t) => t.tcp(),
        }
    }
}

/// A TLS stream over TCP.
pub trait TcpInside {
    /// The TCP socket underneath.
    fn tcp(&self) -> &TcpStream;
}

impl TcpInside for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

impl TcpInside for tokio_rustls::client::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// Writes a whole message and flushes it (TLS buffers records until flushed; for plain TCP
/// the flush is free).
pub async fn send<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    w.write_all(bytes).await?;
    w.flush().await
}
