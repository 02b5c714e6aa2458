//! Passthrough mode's upstream side: each client has its own upstream connection, opened on
//! the first request that needs one, on the server that is primary then (replica sets) or the
//! next mongos; the client authenticates with the server itself.
//!
//! The session closes between requests when that server stops being the primary (or its
//! connection fails), and after relaying a "not primary" reply, so drivers reconnect and
//! retry retryable writes on the new primary instead of failing with NotWritablePrimary until
//! they give up.

use std::{future::Future, sync::Arc};

use futures::StreamExt;
use tokio_util::codec::FramedRead;
use tracing::debug;

use super::{
    client_io::Received,
    error::{upstream_error, SessionError},
    inspect::Request,
    observe::SessionObs,
    routing::ReplyFacts,
    session::{primary_moved, Client},
    stop::Stop,
    strategy::{Acquired, AfterNotPrimary, Link, Outcome, Strategy},
    Context,
};
use crate::{
    net::{UpstreamRead, UpstreamWrite},
    upstream::{self, topology::ReadPref, Host},
    wire::{
        builder::error_document, codec::CodecError, Frame, Index, Message, MessageCodec, WireError,
    },
};

/// Code mongod uses for an unreachable host. Used only when the upstream cannot be reached
/// at all: drivers then mark the server unknown and retry server selection, which is right.
const HOST_UNREACHABLE: (i32, &str) = (6, "HostUnreachable");

/// The upstream connection of a passthrough session.
pub(crate) struct Upstream {
    host: Host,
    read: FramedRead<UpstreamRead, MessageCodec>,
    write: UpstreamWrite,
}

impl Link for Upstream {
    fn host(&self) -> &Host {
        &self.host
    }

    fn send<'a>(
        &'a mut self,
        bytes: &'a [u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a {
        crate::net::send(&mut self.write, bytes)
    }

    fn poll_next_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame, CodecError>>> {
        self.read.poll_next_unpin(cx)
    }

    fn buffered(&self) -> &[u8] {
        self.read.read_buffer()
    }
}

/// The upstream side of a passthrough session.
pub(crate) struct Passthrough {
    ctx: Arc<Context>,
    /// The connection, between requests (taken while a request uses it).
    upstream: Option<Upstream>,
}

impl Passthrough {
    pub(crate) fn new(ctx: Arc<Context>) -> Passthrough {
        Passthrough {
            ctx,
            upstream: None,
        }
    }

    /// The session's connection, opened now if it has none: on the server that is primary
    /// (a replica set: waiting up to `server_selection_timeout` during an election), or the
    /// next mongos.
    async fn attach(
        &mut self,
        obs: &mut SessionObs,
        kill: &Stop,
    ) -> Result<Upstream, SessionError> {
        if let Some(up) = self.upstream.take() {
            return Ok(up);
        }
        let topology = &self.ctx.topology;
        let selection = self.ctx.config.upstream.server_selection_timeout;
        let host = tokio::select! {
            biased;
            _ = kill.killed() => return Err(SessionError::Killed),
            h = topology.select(ReadPref::Primary, selection) => h.map_err(|e| {
                SessionError::UpstreamConnect(upstream::ConnectError::Handshake {
                    host: "upstream".into(),
                    reason: e.to_string(),
                })
            })?,
        };
        let timeout = self.ctx.config.upstream.connect_timeout;
        let connecting = obs.upstream_connecting();
        let stream = tokio::select! {
            biased;
            _ = kill.killed() => return Err(SessionError::Killed),
            s = upstream::connect(&host, timeout, self.ctx.upstream_tls.as_ref()) => s,
        };
        drop(connecting);
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                if e.implicates_server() {
                    topology.mark_unknown(&host);
                }
                return Err(e.into());
            }
        };
        obs.upstream_connected();
        debug!(upstream = %host, "upstream connected");
        let (read, write) = stream.split();
        let max = self.ctx.config.proxy.max_message_size;
        Ok(Upstream {
            host,
            read: crate::wire::codec::framed_read(read, max),
            write,
        })
    }
}

impl Strategy for Passthrough {
    type Link = Upstream;
    type Route = ();
    type Exhaust = ();
    /// The connection is the client's own: a client that leaves takes it along.
    const REUSES_LINKS: bool = false;

    fn route(&self, _msg: &Message<'_>, _body: Option<&Index<'_>>) -> ((), bool) {
        ((), true)
    }

    fn user(&self) -> Option<&str> {
        None
    }

    fn wire_version(&self) -> Option<i32> {
        None
    }

    /// Between requests the upstream has nothing to say: data or EOF there means it closed
    /// or misbehaved, and a change of primary means this session's server no longer takes
    /// writes; either ends the session, so the driver reconnects (and lands on the new
    /// primary) instead of failing on the next request.
    fn idle_watch(&mut self) -> impl Future<Output = SessionError> + Send + '_ {
        let Passthrough { ctx, upstream } = self;
        async move {
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
                e = primary_moved(&ctx.topology, &up.host) => e,
            }
        }
    }

    fn request_arrived(&mut self, _request: &Request, _route: &(), _last_write_ok: bool) {}

    async fn answer_locally(
        &mut self,
        _client: &mut Client,
        _received: &Received,
        _request: &Request,
        _route: &(),
    ) -> Result<bool, SessionError> {
        Ok(false)
    }

    /// The session's connection; when the upstream cannot be reached the request is answered
    /// with HostUnreachable and the session closes.
    async fn acquire(
        &mut self,
        _request: &Request,
        _route: &(),
        obs: &mut SessionObs,
        kill: &Stop,
        _ahead: Option<&bytes::Bytes>,
    ) -> Acquired<Upstream> {
        match self.attach(obs, kill).await {
            Ok(up) => Acquired::Link(up),
            Err(SessionError::Killed) => Acquired::Refused {
                answer: None,
                end: Some(SessionError::Killed),
            },
            Err(e) => Acquired::Refused {
                answer: Some(error_document(
                    HOST_UNREACHABLE.0,
                    HOST_UNREACHABLE.1,
                    &format!("mongoguard: {}", crate::text::clip(&e.to_string(), 1024)),
                )),
                end: Some(e),
            },
        }
    }

    /// A transaction lives on the server, keyed by its session, whichever connection started
    /// it: it is aborted even if this client connection has no upstream yet.
    async fn acquire_for_abort(
        &mut self,
        _route: &(),
        obs: &mut SessionObs,
        kill: &Stop,
    ) -> Option<Upstream> {
        match self.attach(obs, kill).await {
            Ok(up) => Some(up),
            Err(e) => {
                debug!(error = %e, "cannot reach the upstream to abort a transaction");
                None
            }
        }
    }

    fn wants_reply_facts(&self) -> bool {
        false
    }

    fn observe_reply(&mut self, _host: &Host, _route: &(), _facts: &ReplyFacts) {}

    fn exhaust_started(&self) {}

    fn finished(&mut self, link: Upstream, outcome: Outcome, _route: &()) {
        // A broken connection is dropped; the session ends with the error anyway.
        if outcome != Outcome::Broken {
            self.upstream = Some(link);
        }
    }

    fn aborted(&mut self, link: Upstream, ok: bool, _route: &()) {
        // A connection whose abort did not complete is closed; the next request opens a new
        // one.
        if ok {
            self.upstream = Some(link);
        }
    }

    /// Relayed as it is (the driver retries a retryable write), and the session closes after
    /// it so the retry lands on a new connection, on the new primary.
    fn not_primary(&mut self, host: &Host, _route: &(), _resent: bool) -> AfterNotPrimary {
        AfterNotPrimary::RelayAndEnd(SessionError::PrimaryChanged(host.to_string()))
    }

    fn close(&mut self) {}
}
