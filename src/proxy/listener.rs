//! The accept loop: a connection cap, backoff on accept errors, and a stop on drain.

use std::{sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tracing::{debug, error, info_span, Instrument};

use super::{session, Context};

const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) async fn accept_loop(listener: TcpListener, ctx: Arc<Context>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = ctx.drain.cancelled() => return take_queued(listener, &ctx),
            a = listener.accept() => a,
        };
        let (socket, peer) = match accepted {
            Ok(pair) => {
                backoff = MIN_BACKOFF;
                pair
            }
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS...: transient. Back off instead of spinning or dying.
                error!(error = %e, ?backoff, "accept failed; backing off");
                tokio::select! {
                    _ = ctx.drain.cancelled() => return take_queued(listener, &ctx),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        admit(&ctx, socket, peer);
    }
}

/// At the drain, before the listener closes: the connections the kernel has already
/// completed and queued on it would be reset by the close, so they are accepted (with real
/// `accept` calls until the queue is empty, whatever the runtime's readiness cache says) and
/// served like any other: each gets its request answered, or is closed as idle. With
/// `SO_REUSEPORT` and a new process beside this one, only a connection that completes
/// between the last `accept` and the close can still be reset (the kernel's
/// `net.ipv4.tcp_migrate_req = 1` moves even those to the other listener).
fn take_queued(listener: TcpListener, ctx: &Arc<Context>) {
    let Ok(listener) = listener.into_std() else {
        return;
    };
    for _ in 0..QUEUED_MAX {
        match listener.accept() {
            Ok((socket, peer)) => match socket
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(socket))
            {
                Ok(socket) => admit(ctx, socket, peer),
                Err(e) => debug!(error = %e, "queued connection dropped at the drain"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                debug!(error = %e, "accept at the drain failed; closing the listener");
                return;
            }
        }
    }
}

/// The most queued connections taken at the drain (the kernel's backlog is smaller).
const QUEUED_MAX: usize = 65_536;

/// A new connection: counted, and served in its own task, or refused over the limit.
fn admit(ctx: &Arc<Context>, socket: tokio::net::TcpStream, peer: std::net::SocketAddr) {
    ctx.stats.accepted.inc();
    let Ok(permit) = ctx.limiter.clone().try_acquire_owned() else {
        ctx.stats.rejected.inc();
        ctx.metrics.refused(crate::metrics::Limit::Global);
        ctx.audit
            .event(super::close_event(peer, Duration::ZERO, None));
        let limit = ctx.config.proxy.max_client_connections;
        super::refuse::refuse(
            ctx.server_tls.clone(),
            socket,
            peer,
            format!(
                "mongoguard: too many client connections (max_client_connections = {limit} \
                 reached); connection refused. Use a connection pool, close idle \
                 connections, or raise the limit"
            ),
        );
        return;
    };
    let pool = &ctx.config.pool;
    let network = match ctx.control.claim_network(
        peer.ip(),
        pool.network_prefix_v4,
        pool.network_prefix_v6,
        pool.max_connections_per_network,
    ) {
        Ok(claim) => claim,
        Err(network) => {
            ctx.stats.rejected.inc();
            ctx.metrics.refused(crate::metrics::Limit::Network);
            ctx.audit
                .event(super::close_event(peer, Duration::ZERO, None));
            let limit = pool.max_connections_per_network;
            super::refuse::refuse(
                ctx.server_tls.clone(),
                socket,
                peer,
                format!(
                    "mongoguard: too many connections from client network {network} \
                     (pool.max_connections_per_network = {limit}); connection refused. Use a \
                     connection pool, close idle connections, or raise the limit"
                ),
            );
            return;
        }
    };
    let span = info_span!(
        "client",
        %peer,
        app = tracing::field::Empty,
        driver = tracing::field::Empty
    );
    let opened = std::time::Instant::now();
    // A session loop registers the socket with its own reactor, on its own thread.
    let accepted = match &ctx.loops {
        None => Accepted::Registered(socket),
        Some(_) => match socket.into_std() {
            Ok(socket) => Accepted::Moved(socket),
            Err(e) => {
                error!(error = %e, %peer, "could not hand the connection to a session thread; closed");
                return;
            }
        },
    };
    ctx.audit
        .event(crate::audit::Event::ConnectionOpened { client: peer });
    let task = client_task(ctx.clone(), accepted, peer, opened, (permit, network)).instrument(span);
    match &ctx.loops {
        Some(loops) => loops.spawn(ctx.tracker.track_future(task)),
        None => drop(ctx.tracker.spawn(task)),
    }
}

/// An accepted client socket: registered with the accepting runtime's reactor, or taken out
/// of it for a session loop.
enum Accepted {
    Registered(tokio::net::TcpStream),
    Moved(std::net::TcpStream),
}

/// One client connection: its TLS handshake, then its session, accounted for by a drop
/// guard.
async fn client_task(
    ctx: Arc<Context>,
    accepted: Accepted,
    peer: std::net::SocketAddr,
    opened: std::time::Instant,
    // The global permit and the client network's place, held for the connection's life.
    (permit, _network): (
        tokio::sync::OwnedSemaphorePermit,
        Option<super::control::NetworkClaim>,
    ),
) {
    let closed = |e: std::io::Error| {
        let failed = Err(super::SessionError::ClientIo(e));
        let event = super::close_event(peer, opened.elapsed(), Some(&failed));
        ctx.audit.event(event);
    };
    let socket = match accepted {
        Accepted::Registered(socket) => socket,
        Accepted::Moved(socket) => match tokio::net::TcpStream::from_std(socket) {
            Ok(socket) => socket,
            Err(e) => {
                // The loop's reactor refused the socket (epoll's watch limit).
                error!(error = %e, "could not register the connection on its session thread; closed");
                return closed(e);
            }
        },
    };
    // Linux: inherited from the listening socket (`app::bind`; tested there).
    #[cfg(not(target_os = "linux"))]
    let _ = socket.set_nodelay(true);
    let socket = match &ctx.server_tls {
        None => crate::net::Either::Plain(socket),
        Some(tls) => match tls.accept(socket).await {
            Ok(s) => s,
            Err(e) => {
                ctx.stats.tls_handshake_failures.inc();
                ctx.metrics.tls_handshake_failed();
                tracing::debug!(error = %e, "TLS handshake failed; connection closed");
                return closed(e);
            }
        },
    };
    let accounting = Accounting::open(ctx.clone(), peer, opened, permit);
    let registered = ctx.control.register(peer, &ctx.kill);
    let conn = registered.connection.clone();
    let finish = move |result| {
        drop(registered);
        accounting.finish(result);
    };
    match (ctx.config.proxy.mode, ctx.pooled.clone()) {
        (crate::config::Mode::Pooled, Some(pooled)) => {
            let side = super::pooled::strategy::PooledSide::new(ctx.clone(), pooled);
            session::run(ctx.clone(), socket, peer, side, conn, finish).await
        }
        (crate::config::Mode::Pooled, None) => finish(Err(super::SessionError::UpstreamClosed)),
        (crate::config::Mode::Passthrough, _) => {
            let side = super::passthrough::Passthrough::new(ctx.clone());
            session::run(ctx.clone(), socket, peer, side, conn, finish).await
        }
    }
}

/// A session's accounting: counted active while it lives, and on drop — whatever ended the
/// task, a result, a panic unwinding it or its cancellation — uncounted, its end logged and
/// its close event written.
struct Accounting {
    ctx: Arc<super::Context>,
    peer: std::net::SocketAddr,
    opened: std::time::Instant,
    result: Option<Result<session::End, super::SessionError>>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Accounting {
    fn open(
        ctx: Arc<super::Context>,
        peer: std::net::SocketAddr,
        opened: std::time::Instant,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Accounting {
        ctx.stats.active.inc();
        Accounting {
            ctx,
            peer,
            opened,
            result: None,
            _permit: permit,
        }
    }

    /// The session ended with `result`: counted, logged and its close event written now.
    fn finish(mut self, result: Result<session::End, super::SessionError>) {
        self.result = Some(result);
    }
}

impl Drop for Accounting {
    fn drop(&mut self) {
        let ctx = &self.ctx;
        match &self.result {
            Some(result) => {
                match result {
                    Err(e) if e.is_upstream() => ctx.stats.upstream_errors.inc(),
                    Err(super::SessionError::ClientProtocol(_)) => {
                        ctx.stats.client_protocol_errors.inc()
                    }
                    _ => {}
                }
                session::log_end(result);
                ctx.audit.event(super::close_event(
                    self.peer,
                    self.opened.elapsed(),
                    Some(result),
                ));
            }
            None => {
                error!(peer = %self.peer, "client session ended without a result (internal error); connection closed");
                ctx.audit.event(crate::audit::Event::ConnectionClosed {
                    client: self.peer,
                    duration: self.opened.elapsed(),
                    reason: crate::audit::CloseReason::Internal,
                });
            }
        }
        ctx.stats.active.dec();
    }
}
