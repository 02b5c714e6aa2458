//! The upstream side of a session: what differs between passthrough and pooled mode.
//!
//! The session ([`super::session`]) owns the request pipeline — wait for a request, inspect
//! and judge it, record it, answer it locally or forward it, relay the reply or exhaust
//! stream, and the bookkeeping after — and asks its [`Strategy`] only these questions:
//!
//! | step | passthrough | pooled |
//! |---|---|---|
//! | [`Strategy::route`] | nothing to read | cursor, transaction, read preference, auth class |
//! | [`Strategy::answer_locally`] | never | hello, SCRAM, refusals before authentication |
//! | [`Strategy::acquire`] | its own connection (opened on the primary) | select a server, honour pins, check out |
//! | [`Strategy::observe_reply`] | nothing | cursor pins |
//! | [`Strategy::finished`] | keep the connection | release, discard, keep for getLastError |
//! | [`Strategy::not_primary`] | relay, then close the session | re-send once, or relay |
//! | [`Strategy::idle_watch`] | its connection closing, the primary moving | nothing |
//!
//! An acquired connection is a [`Link`]: send a message, read the next one.

use std::future::Future;

use bson::RawDocumentBuf;

use super::{
    client_io::Received, error::SessionError, inspect::Request, observe::SessionObs,
    routing::ReplyFacts, session::Client, stop::Stop,
};
use crate::{
    upstream::Host,
    wire::{codec::CodecError, Frame, Index, Message},
};

/// One upstream connection acquired for a request.
pub(crate) trait Link: Send {
    /// The server it goes to.
    fn host(&self) -> &Host;
    /// Writes a whole message (the session bounds it in time).
    fn send<'a>(
        &'a mut self,
        bytes: &'a [u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a;
    /// Polls for the next message from the server (`None`: it closed the connection).
    fn poll_next_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame, CodecError>>>;
    /// The bytes of the next message read so far (its header, once 16 bytes are in).
    fn buffered(&self) -> &[u8];
    /// How much of the request passed to [`Strategy::acquire`] as `ahead` was already
    /// written on this link, and when (`None`: nothing; asked once).
    fn sent_ahead(&mut self) -> Option<(usize, std::time::Instant)> {
        None
    }
    /// The next message from the server (`None`: it closed the connection).
    fn next(&mut self) -> impl Future<Output = Option<Result<Frame, CodecError>>> + Send + '_
    where
        Self: Sized,
    {
        std::future::poll_fn(move |cx| self.poll_next_frame(cx))
    }
}

/// What [`Strategy::acquire`] produced.
pub(crate) enum Acquired<L> {
    /// A connection to send the request on.
    Link(L),
    /// No connection: answer the request with `answer` (when it expects a reply), then go
    /// on with the next request, or end the session with `end`.
    Refused {
        answer: Option<RawDocumentBuf>,
        end: Option<SessionError>,
    },
}

/// How a round trip left its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The reply (or the whole exhaust stream) was read: the connection is clean.
    Replied,
    /// The request expects no reply and was written.
    Sent,
    /// Mid-exchange failure: the connection's state is unknown; never reuse it.
    Broken,
}

/// What to do with a "not primary" reply (the request was not executed).
#[derive(Debug)]
pub(crate) enum AfterNotPrimary {
    /// Acquire again (on the new primary) and re-send the request.
    Resend,
    /// Relay the error to the client (its driver retries).
    Relay,
    /// Relay the error, then end the session with this error.
    RelayAndEnd(SessionError),
}

/// The upstream side of a session.
pub(crate) trait Strategy: Send {
    /// An acquired upstream connection.
    type Link: Link;
    /// What the strategy reads off a request while it is inspected.
    type Route: Default + Send + Sync;
    /// Whether a connection outlives a client that left mid-request: then the reply is
    /// still read (briefly) so the connection goes back clean.
    const REUSES_LINKS: bool;

    /// Reads `msg` during inspection; false when the policy must not judge it (mongoguard
    /// answers it itself).
    /// `body`: the index of an OP_MSG's body, built once for routing and judging.
    fn route(&self, msg: &Message<'_>, body: Option<&Index<'_>>) -> (Self::Route, bool);

    /// The user the client authenticated as, for the policy and records.
    fn user(&self) -> Option<&str>;

    /// The upstream's maxWireVersion when the strategy knows it (pooled: from monitoring).
    fn wire_version(&self) -> Option<i32>;

    /// Resolves when something the session holds between requests fails (passthrough: its
    /// connection closed, or its server stopped being the primary).
    fn idle_watch(&mut self) -> impl Future<Output = SessionError> + Send + '_;

    /// Called for every inspected request, before anything answers it.
    /// `last_write_ok`: no dropped write is waiting for its getLastError.
    fn request_arrived(&mut self, request: &Request, route: &Self::Route, last_write_ok: bool);

    /// Answers the request without the upstream, if this strategy does (true: answered).
    fn answer_locally(
        &mut self,
        client: &mut Client,
        received: &Received,
        request: &Request,
        route: &Self::Route,
    ) -> impl Future<Output = Result<bool, SessionError>> + Send;

    /// A connection for `request`. `ahead`: the request's bytes, when the connection
    /// acquired is sent them first thing (its reply awaited, nothing measured on it first):
    /// a strategy may have them written ahead while it waits for a connection, the link's
    /// [`Link::sent_ahead`] then says how much.
    fn acquire(
        &mut self,
        request: &Request,
        route: &Self::Route,
        obs: &mut SessionObs,
        kill: &Stop,
        ahead: Option<&bytes::Bytes>,
    ) -> impl Future<Output = Acquired<Self::Link>> + Send;

    /// A connection to abort the transaction of a blocked statement on, if there is one.
    fn acquire_for_abort(
        &mut self,
        route: &Self::Route,
        obs: &mut SessionObs,
        kill: &Stop,
    ) -> impl Future<Output = Option<Self::Link>> + Send;

    /// Whether [`Strategy::observe_reply`] wants the facts of every reply.
    fn wants_reply_facts(&self) -> bool;

    /// Looks at a reply's facts (pooled: cursor pins).
    fn observe_reply(&mut self, host: &Host, route: &Self::Route, facts: &ReplyFacts);

    /// Held while an exhaust stream runs (pooled: counts the pinned connection).
    type Exhaust: Send;

    /// An exhaust stream started on the current connection; the value lives as long as it.
    fn exhaust_started(&self) -> Self::Exhaust;

    /// The round trip on `link` is over.
    fn finished(&mut self, link: Self::Link, outcome: Outcome, route: &Self::Route);

    /// The last [`Strategy::finished`] handed its connection to another session waiting for
    /// one (pooled mode); reading it clears it.
    fn handed_over(&mut self) -> bool {
        false
    }

    /// Mongoguard's own abortTransaction ran on `link` (`ok`: its reply came back).
    fn aborted(&mut self, link: Self::Link, ok: bool, route: &Self::Route);

    /// The server answered "not primary" (`resent`: already after one re-send).
    fn not_primary(&mut self, host: &Host, route: &Self::Route, resent: bool) -> AfterNotPrimary;

    /// The session ends: give back whatever is held.
    fn close(&mut self);
}
