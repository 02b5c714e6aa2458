//! An authenticated upstream connection for the pool: TCP connect, hello (which also tells
//! the server's limits and role), then SCRAM as the pool's upstream identity.

use std::{io::ErrorKind, sync::Arc, time::Duration};

use bson::{spec::BinarySubtype, Binary, RawBsonRef, RawDocument, RawDocumentBuf};
use futures::StreamExt;
use tokio_util::codec::FramedRead;

use super::{
    connect,
    identity::{Credentials, Identity},
    ConnectError, Host,
};
use crate::{
    auth::scram::{ClientConversation, Mechanism},
    wire::{builder::MsgBuilder, codec::CodecError, Frame, MessageCodec, OpMsg},
};

/// What a server's hello says: limits to copy into mongoguard's own hello, and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloFacts {
    /// `minWireVersion`.
    pub min_wire_version: i32,
    /// `maxWireVersion`.
    pub max_wire_version: i32,
    /// `maxBsonObjectSize`.
    pub max_bson_object_size: i32,
    /// `maxMessageSizeBytes`.
    pub max_message_size_bytes: i32,
    /// `maxWriteBatchSize`.
    pub max_write_batch_size: i32,
    /// `logicalSessionTimeoutMinutes` (absent: sessions unsupported).
    pub logical_session_timeout_minutes: Option<i32>,
    /// The server's role.
    pub role: Role,
    /// `setName`.
    pub set_name: Option<String>,
    /// `hosts` and `passives` (replica-set members).
    pub hosts: Vec<String>,
    /// `electionId` bytes (the newest primary has the largest).
    pub election_id: Option<[u8; 12]>,
    /// `tags` of a replica-set member (string values only, as mongod requires), for read
    /// preference tag sets.
    pub tags: Vec<(String, String)>,
    /// `lastWrite.lastWriteDate` in milliseconds since the epoch, for maxStalenessSeconds.
    pub last_write_date: Option<i64>,
}

/// A server's role, from its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A standalone mongod.
    Standalone,
    /// A replica-set primary.
    Primary,
    /// A replica-set secondary.
    Secondary,
    /// A mongos (`msg: "isdbgrid"`).
    Mongos,
    /// Arbiter, hidden, recovering, or anything that serves no requests.
    Other,
}

fn int(doc: &RawDocument, key: &str) -> Option<i32> {
    match doc.get(key) {
        Ok(Some(RawBsonRef::Int32(i))) => Some(i),
        Ok(Some(RawBsonRef::Int64(i))) => i32::try_from(i).ok(),
        Ok(Some(RawBsonRef::Double(d))) if d.fract() == 0.0 && d.abs() < 2e9 => Some(d as i32),
        _ => None,
    }
}

/// Whether a reply to one of mongoguard's own commands says `ok: 1` (as a double, an integer
/// or `true`, the forms servers send).
pub(crate) fn reply_ok(doc: &RawDocument) -> bool {
    match doc.get("ok") {
        Ok(Some(RawBsonRef::Double(d))) => d == 1.0,
        Ok(Some(RawBsonRef::Int32(i))) => i == 1,
        Ok(Some(RawBsonRef::Int64(i))) => i == 1,
        Ok(Some(RawBsonRef::Boolean(b))) => b,
        _ => false,
    }
}

fn flag(doc: &RawDocument, key: &str) -> bool {
    matches!(doc.get(key), Ok(Some(RawBsonRef::Boolean(true))))
}

impl HelloFacts {
    /// Reads a hello reply; `None` if it is not a successful hello.
    pub fn from_reply(doc: &RawDocument) -> Option<HelloFacts> {
        if !reply_ok(doc) {
            return None;
        }
        let set_name = match doc.get("setName") {
            Ok(Some(RawBsonRef::String(s))) => Some(s.to_owned()),
            _ => None,
        };
        let writable = flag(doc, "isWritablePrimary") || flag(doc, "ismaster");
        let is_mongos = matches!(doc.get("msg"), Ok(Some(RawBsonRef::String("isdbgrid"))));
        let role = if is_mongos {
            Role::Mongos
        } else if set_name.is_some() {
            if writable {
                Role::Primary
            } else if flag(doc, "secondary") && !flag(doc, "hidden") {
                Role::Secondary
            } else {
                Role::Other
            }
        } else if writable {
            Role::Standalone
        } else {
            Role::Other
        };
        let mut hosts = Vec::new();
        for key in ["hosts", "passives"] {
            if let Ok(Some(RawBsonRef::Array(a))) = doc.get(key) {
                hosts.extend(a.into_iter().flatten().filter_map(|v| match v {
                    RawBsonRef::String(s) => Some(s.to_owned()),
                    _ => None,
                }));
            }
        }
        let election_id = match doc.get("electionId") {
            Ok(Some(RawBsonRef::ObjectId(o))) => Some(o.bytes()),
            _ => None,
        };
        let tags = match doc.get("tags") {
            Ok(Some(RawBsonRef::Document(t))) => t
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| match v {
                    RawBsonRef::String(v) => Some((k.as_str().to_owned(), v.to_owned())),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let last_write_date = match doc.get("lastWrite") {
            Ok(Some(RawBsonRef::Document(w))) => match w.get("lastWriteDate") {
                Ok(Some(RawBsonRef::DateTime(d))) => Some(d.timestamp_millis()),
                _ => None,
            },
            _ => None,
        };
        Some(HelloFacts {
            min_wire_version: int(doc, "minWireVersion").unwrap_or(0),
            max_wire_version: int(doc, "maxWireVersion").unwrap_or(0),
            max_bson_object_size: int(doc, "maxBsonObjectSize").unwrap_or(16 * 1024 * 1024),
            max_message_size_bytes: int(doc, "maxMessageSizeBytes").unwrap_or(48_000_000),
            max_write_batch_size: int(doc, "maxWriteBatchSize").unwrap_or(100_000),
            logical_session_timeout_minutes: int(doc, "logicalSessionTimeoutMinutes"),
            role,
            set_name,
            hosts,
            election_id,
            tags,
            last_write_date,
        })
    }
}

impl HelloFacts {
    /// Equal in everything but `last_write_date` (which every hello renews).
    pub fn same_but_freshness(&self, other: &HelloFacts) -> bool {
        let HelloFacts {
            min_wire_version,
            max_wire_version,
            max_bson_object_size,
            max_message_size_bytes,
            max_write_batch_size,
            logical_session_timeout_minutes,
            role,
            set_name,
            hosts,
            election_id,
            tags,
            last_write_date: _,
        } = self;
        *min_wire_version == other.min_wire_version
            && *max_wire_version == other.max_wire_version
            && *max_bson_object_size == other.max_bson_object_size
            && *max_message_size_bytes == other.max_message_size_bytes
            && *max_write_batch_size == other.max_write_batch_size
            && *logical_session_timeout_minutes == other.logical_session_timeout_minutes
            && *role == other.role
            && *set_name == other.set_name
            && *hosts == other.hosts
            && *election_id == other.election_id
            && *tags == other.tags
    }

    /// A server that has not said hello yet: mongod's default limits, serving nothing.
    fn not_yet_known() -> HelloFacts {
        HelloFacts {
            min_wire_version: 0,
            max_wire_version: 0,
            max_bson_object_size: 16 * 1024 * 1024,
            max_message_size_bytes: 48_000_000,
            max_write_batch_size: 100_000,
            logical_session_timeout_minutes: None,
            role: Role::Other,
            set_name: None,
            hosts: Vec::new(),
            election_id: None,
            tags: Vec::new(),
            last_write_date: None,
        }
    }
}

/// One upstream connection: the socket, framed for reading, and what its hello said.
pub struct UpstreamConn {
    io: FramedRead<crate::net::UpstreamStream, MessageCodec>,
    facts: Arc<HelloFacts>,
    host: Host,
    /// The server has no `hello` (older than 4.4.2): heartbeats say `isMaster`.
    legacy_hello: bool,
}

impl std::fmt::Debug for UpstreamConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConn")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

/// The hello of a connection's later checks (the topology monitor's heartbeats): no `client`
/// metadata, which mongod accepts only in a connection's first hello and refuses afterwards
/// with ClientMetadataCannotBeMutated (186).
fn heartbeat_hello(legacy: bool) -> RawDocumentBuf {
    if legacy {
        bson::rawdoc! {"isMaster": 1, "helloOk": true, "$db": "admin"}
    } else {
        bson::rawdoc! {"hello": 1, "helloOk": true, "$db": "admin"}
    }
}

/// A reply saying the server has no such command (CommandNotFound, 59): `hello` on a server
/// older than 4.4.2 (4.2.10, 4.0.21, 3.6.21), which knows only the legacy `isMaster`.
fn command_not_found(reply: &RawDocument) -> bool {
    matches!(reply.get("code"), Ok(Some(RawBsonRef::Int32(59))))
}

/// [`own_hello`] as the legacy `isMaster`, for a server without `hello`.
fn own_is_master(sasl_user: Option<&Credentials>, load_balanced: bool) -> RawDocumentBuf {
    let hello = own_hello(sasl_user, load_balanced);
    let mut legacy = bson::rawdoc! {"isMaster": 1};
    for (k, v) in hello.iter().flatten() {
        if k.as_str() != "hello" {
            legacy.append(k, v);
        }
    }
    legacy
}

/// The first hello mongoguard sends on each of its own upstream connections (with `client`
/// metadata: only ever once per connection, see [`UpstreamConn::heartbeat`]).
pub(crate) fn own_hello(sasl_user: Option<&Credentials>, load_balanced: bool) -> RawDocumentBuf {
    let mut hello = bson::rawdoc! {
        "hello": 1,
        "helloOk": true,
        "client": {
            "application": {"name": "mongoguard"},
            "driver": {"name": "mongoguard", "version": env!("CARGO_PKG_VERSION")},
            "os": {"type": std::env::consts::OS, "architecture": std::env::consts::ARCH},
        },
    };
    if load_balanced {
        // A mongos behind a load balancer refuses a first hello without it
        // (LoadBalancerSupportMismatch, src/mongo/s/load_balancer_support.cpp).
        hello.append(bson::cstr!("loadBalanced"), true);
    }
    if let Some(c) = sasl_user {
        hello.append(
            bson::cstr!("saslSupportedMechs"),
            format!("{}.{}", c.source, c.username),
        );
    }
    hello.append(bson::cstr!("$db"), "admin");
    hello
}

/// Runs `work` (connecting to `host`) within `timeout`.
async fn within<T>(
    host: &Host,
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout {
            host: host.to_string(),
            timeout,
        }),
    }
}

impl UpstreamConn {
    /// Connects to `host`, says hello and authenticates as `identity`, all within `timeout`.
    pub async fn open(
        host: &Host,
        identity: &Identity,
        timeout: Duration,
        max_message_size: usize,
        tls: Option<&crate::tls::UpstreamTls>,
        load_balanced: bool,
    ) -> Result<UpstreamConn, ConnectError> {
        let work = async {
            let creds = identity.credentials.as_ref();
            let (mut conn, reply) =
                Self::connect_and_hello(host, creds, timeout, max_message_size, tls, load_balanced)
                    .await?;
            if let Some(creds) = creds {
                let offered = match reply.get("saslSupportedMechs") {
                    Ok(Some(RawBsonRef::Array(a))) => a
                        .into_iter()
                        .flatten()
                        .filter_map(|v| match v {
                            RawBsonRef::String(s) => Mechanism::parse(s),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                let mechanism = creds.mechanism.unwrap_or(
                    if offered.is_empty() || offered.contains(&Mechanism::ScramSha256) {
                        Mechanism::ScramSha256
                    } else {
                        Mechanism::ScramSha1
                    },
                );
                conn.authenticate(creds, mechanism)
                    .await
                    .map_err(|reason| ConnectError::Auth {
                        host: host.to_string(),
                        identity: identity.name.clone(),
                        reason,
                    })?;
            }
            Ok(conn)
        };
        within(host, timeout, work).await
    }

    /// Connects to `host` and says hello (no authentication), within `timeout`: the
    /// readiness check of the admin API. Returns what the hello said.
    pub async fn probe(
        host: &Host,
        timeout: Duration,
        max_message_size: usize,
        tls: Option<&crate::tls::UpstreamTls>,
        load_balanced: bool,
    ) -> Result<Arc<HelloFacts>, ConnectError> {
        let work =
            Self::connect_and_hello(host, None, timeout, max_message_size, tls, load_balanced);
        within(host, timeout, work)
            .await
            .map(|(conn, _)| conn.facts)
    }

    /// Connects and says hello (asking for the SASL mechanisms of `creds`): the connection
    /// with its hello facts, and the hello reply.
    async fn connect_and_hello(
        host: &Host,
        creds: Option<&Credentials>,
        timeout: Duration,
        max_message_size: usize,
        tls: Option<&crate::tls::UpstreamTls>,
        load_balanced: bool,
    ) -> Result<(UpstreamConn, RawDocumentBuf), ConnectError> {
        let stream = connect(host, timeout, tls).await?;
        let mut conn = UpstreamConn {
            io: crate::wire::codec::framed_read(stream, max_message_size),
            // Replaced by the hello's below, before the connection is handed out.
            facts: Arc::new(HelloFacts::not_yet_known()),
            host: host.clone(),
            legacy_hello: false,
        };
        let mut reply = conn.command(&own_hello(creds, load_balanced)).await?;
        if command_not_found(&reply) {
            // As drivers do for a server without `hello`: the legacy handshake.
            conn.legacy_hello = true;
            reply = conn.command(&own_is_master(creds, load_balanced)).await?;
        }
        let facts = HelloFacts::from_reply(&reply).ok_or_else(|| ConnectError::Handshake {
            host: host.to_string(),
            reason: "hello failed".into(),
        })?;
        conn.facts = Arc::new(facts);
        Ok((conn, reply))
    }

    /// Says hello again on this connection (whose first hello, with the client metadata, was
    /// sent when it opened) and records what the server says now. A failed hello (`ok: 0`) is
    /// an error.
    pub(crate) async fn heartbeat(&mut self) -> Result<Arc<HelloFacts>, ConnectError> {
        let reply = self.command(&heartbeat_hello(self.legacy_hello)).await?;
        let facts = HelloFacts::from_reply(&reply).ok_or_else(|| ConnectError::Handshake {
            host: self.host.to_string(),
            reason: format!("hello failed: {}", error_text(&reply)),
        })?;
        self.facts = Arc::new(facts);
        Ok(self.facts.clone())
    }

    /// The hello facts of this connection's server.
    pub fn facts(&self) -> &Arc<HelloFacts> {
        &self.facts
    }

    /// The server this connection goes to.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Writes a whole message.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        crate::net::send(self.io.get_mut(), bytes).await
    }

    /// The next message from the server (`None`: it closed the connection).
    pub async fn next(&mut self) -> Option<Result<Frame, CodecError>> {
        self.io.next().await
    }

    /// Polls for the next message from the server (`None`: it closed the connection).
    pub fn poll_next_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame, CodecError>>> {
        self.io.poll_next_unpin(cx)
    }

    /// The bytes of the next message read so far.
    pub fn buffered(&self) -> &[u8] {
        self.io.read_buffer()
    }

    /// One OP_MSG round trip of mongoguard's own (handshake, authentication, monitoring).
    pub(crate) async fn command(
        &mut self,
        body: &RawDocument,
    ) -> Result<RawDocumentBuf, ConnectError> {
        let host = self.host.to_string();
        let io_err = |source: std::io::Error| ConnectError::Io {
            host: host.clone(),
            source,
        };
        let id = next_own_request_id();
        let bytes = MsgBuilder::new(body.to_owned()).encode(id, 0);
        self.send(&bytes).await.map_err(io_err)?;
        let frame = match self.next().await {
            Some(Ok(f)) => f,
            Some(Err(CodecError::Io(e))) => return Err(io_err(e)),
            Some(Err(CodecError::Wire(e))) => {
                return Err(ConnectError::Handshake {
                    host: host.clone(),
                    reason: e.to_string(),
                })
            }
            None => return Err(io_err(ErrorKind::UnexpectedEof.into())),
        };
        let bad = |reason: String| ConnectError::Handshake {
            host: host.clone(),
            reason,
        };
        if frame.header().response_to != id {
            return Err(bad("reply does not answer the request".into()));
        }
        let msg = OpMsg::parse(frame.bytes()).map_err(|e| bad(e.to_string()))?;
        Ok(msg.body().to_owned())
    }

    async fn authenticate(
        &mut self,
        creds: &Credentials,
        mechanism: Mechanism,
    ) -> Result<(), String> {
        let mut conv = ClientConversation::new(mechanism, &creds.username, creds.password())
            .map_err(|e| e.to_string())?;
        let start = bson::rawdoc! {
            "saslStart": 1,
            "mechanism": mechanism.name(),
            "payload": Binary { subtype: BinarySubtype::Generic, bytes: conv.client_first() },
            "options": {"skipEmptyExchange": true},
            "$db": creds.source.as_str(),
        };
        let reply = self.command(&start).await.map_err(|e| e.to_string())?;
        let (id, server_first, _) = sasl_reply(&reply)?;
        let client_final = conv
            .handle_server_first(&server_first)
            .map_err(|e| e.to_string())?;
        let cont = bson::rawdoc! {
            "saslContinue": 1,
            "conversationId": id,
            "payload": Binary { subtype: BinarySubtype::Generic, bytes: client_final },
            "$db": creds.source.as_str(),
        };
        let reply = self.command(&cont).await.map_err(|e| e.to_string())?;
        let (id, server_final, mut done) = sasl_reply(&reply)?;
        conv.verify_server_final(&server_final)
            .map_err(|e| e.to_string())?;
        // Servers that ignore skipEmptyExchange want one more, empty, step.
        let mut steps = 0;
        while !done {
            steps += 1;
            if steps > 2 {
                return Err("SASL conversation does not finish".into());
            }
            let empty = bson::rawdoc! {
                "saslContinue": 1,
                "conversationId": id,
                "payload": Binary { subtype: BinarySubtype::Generic, bytes: Vec::new() },
                "$db": creds.source.as_str(),
            };
            let reply = self.command(&empty).await.map_err(|e| e.to_string())?;
            done = sasl_reply(&reply)?.2;
        }
        Ok(())
    }
}

/// `codeName: errmsg` of a failed reply, for logs (the server's own words, bounded).
fn error_text(reply: &RawDocument) -> String {
    let text = |key: &str| match reply.get(key) {
        Ok(Some(RawBsonRef::String(s))) => s.chars().take(200).collect::<String>(),
        _ => String::new(),
    };
    format!("{}: {}", text("codeName"), text("errmsg"))
}

/// `(conversationId, payload, done)` of a SASL reply, or its error message.
fn sasl_reply(reply: &RawDocument) -> Result<(i32, Vec<u8>, bool), String> {
    if HelloFacts::from_reply(reply).is_none() {
        let msg = match reply.get("errmsg") {
            Ok(Some(RawBsonRef::String(s))) => s.to_owned(),
            _ => "authentication failed".to_owned(),
        };
        return Err(msg);
    }
    let id = int(reply, "conversationId").ok_or("SASL reply without conversationId")?;
    let payload = match reply.get("payload") {
        Ok(Some(RawBsonRef::Binary(b))) => b.bytes.to_vec(),
        _ => return Err("SASL reply without payload".into()),
    };
    Ok((id, payload, flag(reply, "done")))
}

/// Whether an idle TLS connection can be reused: one read poll that must find nothing. rustls
/// consumes what is not application data (TLS 1.3 session tickets) and a close_notify or EOF
/// reads as 0 bytes; any application byte on an idle connection means it is out of sync.
fn poll_idle(stream: &mut crate::net::UpstreamStream) -> bool {
    use std::task::{Context, Poll};
    use tokio::io::{AsyncRead, ReadBuf};
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    matches!(
        std::pin::Pin::new(stream).poll_read(&mut cx, &mut buf),
        Poll::Pending
    )
}

/// Request ids of mongoguard's own upstream messages: a separate range from clients' (any
/// value works, a connection carries one request at a time).
pub(crate) fn next_own_request_id() -> i32 {
    use std::sync::atomic::{AtomicI32, Ordering};
    static NEXT: AtomicI32 = AtomicI32::new(0x4d47_0000);
    NEXT.fetch_add(1, Ordering::Relaxed) & i32::MAX
}

impl super::pool::PooledConn for UpstreamConn {
    fn is_usable(&mut self) -> bool {
        // Leftover bytes after a complete reply mean the connection is out of sync.
        if !self.io.read_buffer().is_empty() {
            return false;
        }
        match self.io.get_mut() {
            crate::net::Either::Plain(tcp) => tcp.is_usable(),
            tls @ crate::net::Either::Tls(_) => poll_idle(tls),
        }
    }

    /// Plain TCP only (a TLS stream may keep written bytes in its buffers, to be flushed by
    /// its own task): one non-blocking write; a whole write registers `waiter` for the
    /// socket's read readiness, as the waiter's own poll for the reply would.
    fn send_ahead(&mut self, request: &[u8], waiter: &std::task::Waker) -> super::pool::SentAhead {
        use super::pool::SentAhead;
        if !self.io.read_buffer().is_empty() {
            return SentAhead::Nothing;
        }
        let crate::net::Either::Plain(tcp) = self.io.get_mut() else {
            return SentAhead::Nothing;
        };
        match tcp.try_write(request) {
            Ok(n) if n == request.len() => {
                let mut cx = std::task::Context::from_waker(waiter);
                SentAhead::Whole {
                    reply_wakes: tcp.poll_read_ready(&mut cx).is_pending(),
                }
            }
            Ok(n) if n > 0 => SentAhead::Part(n),
            // Would block, or an error the waiter's own write meets again and reports.
            Ok(_) | Err(_) => SentAhead::Nothing,
        }
    }
}
