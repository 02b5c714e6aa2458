//! One client connection: read frames, run them, write replies, apply faults.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info, trace};

use crate::bsonutil::{as_i64, command_name};
use crate::commands::{self, CmdError, Ctx};
use crate::compression::never_compressed;
use crate::fault::Fault;
use crate::server::Shared;
use crate::stats::OpenGuard;
use crate::wire::{self, Incoming, OpMsg, OpQuery, Request, HEADER_LEN};

/// Per-connection state visible to commands.
#[derive(Debug)]
pub(crate) struct ConnState {
    pub(crate) id: i64,
    pub(crate) peer: SocketAddr,
    /// The authenticated user, if any.
    pub(crate) user: Option<String>,
    /// An in-progress SASL conversation and its skipEmptyExchange option.
    pub(crate) sasl: Option<(crate::scram::Conversation, bool)>,
    /// `client` metadata from the first hello.
    pub(crate) client_metadata: Option<Document>,
    /// A hello/isMaster already ran on this connection: its client metadata is final (mongod's
    /// `ClientMetadata::tryFinalize`), any later `client` field is refused with code 186.
    pub(crate) hello_seen: bool,
    /// A `failCommand` fail point holds the next reply this long...
    pub(crate) fail_block: Option<std::time::Duration>,
    /// ...or closes the connection instead of sending it.
    pub(crate) fail_close: bool,
    /// What getLastError reports: the outcome of this connection's previous request when it
    /// was a write, else `None` (see `commands::run`).
    pub(crate) last_error: Option<Document>,
}

struct Conn {
    shared: Arc<Shared>,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    state: ConnState,
    received: u64,
    /// Role changes of the replica set this server is a member of (wakes awaitable hellos).
    topology: Option<watch::Receiver<u64>>,
}

enum Waited {
    Elapsed,
    Input,
    Closed,
}

/// Serves one accepted socket until it closes or the server shuts down.
pub(crate) async fn serve(shared: Arc<Shared>, sock: TcpStream, peer: SocketAddr) {
    let _open = OpenGuard(&shared.stats);
    let (r, w) = sock.into_split();
    let mut conn = Conn {
        state: ConnState {
            id: shared.next_connection_id(),
            peer,
            user: None,
            sasl: None,
            client_metadata: None,
            hello_seen: false,
            fail_block: None,
            fail_close: false,
            last_error: None,
        },
        shared: shared.clone(),
        reader: BufReader::with_capacity(32 * 1024, r),
        writer: w,
        received: 0,
        topology: shared.member.as_ref().map(|(set, _)| set.subscribe()),
    };
    debug!(%peer, conn = conn.state.id, "connection opened");
    let res = tokio::select! {
        _ = shared.cancel.cancelled() => Ok(()),
        r = conn.run() => r,
    };
    match res {
        Ok(()) => debug!(%peer, conn = conn.state.id, "connection closed"),
        Err(e) => debug!(%peer, conn = conn.state.id, error = %e, "connection closed"),
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl Conn {
    async fn run(&mut self) -> io::Result<()> {
        loop {
            let Some(frame) = self.read_frame().await? else {
                return Ok(());
            };
            self.shared.stats.on_message();
            self.received += 1;
            match self.shared.fault.get() {
                Fault::CloseAfter(n) if self.received > n => {
                    debug!(conn = self.state.id, "fault: close-after, closing");
                    return Ok(());
                }
                Fault::Stall => {
                    trace!(conn = self.state.id, "fault: stall, request discarded");
                    continue;
                }
                _ => {}
            }
            let incoming = wire::parse_frame(&frame).map_err(invalid)?;
            drop(frame);
            if incoming.compressor.is_some() {
                self.shared.stats.on_compressed();
            }
            self.handle(incoming).await?;
        }
    }

    /// Reads one frame; `None` on a clean EOF between frames.
    async fn read_frame(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut header = [0u8; HEADER_LEN];
        if self.reader.fill_buf().await?.is_empty() {
            return Ok(None);
        }
        self.reader.read_exact(&mut header).await?;
        let len = wire::frame_len(&header).map_err(invalid)?;
        let mut frame = vec![0u8; len];
        frame[..HEADER_LEN].copy_from_slice(&header);
        self.reader.read_exact(&mut frame[HEADER_LEN..]).await?;
        Ok(Some(frame))
    }

    /// Waits `d`, noticing the client closing (or sending something) meanwhile. A role change
    /// in the replica set ends the wait early (as [`Waited::Elapsed`]: time to send a hello).
    async fn wait_or_input(&mut self, d: Duration) -> io::Result<Waited> {
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(Waited::Elapsed),
            _ = topology_changed(&mut self.topology) => Ok(Waited::Elapsed),
            r = self.reader.fill_buf() => match r {
                Ok([]) => Ok(Waited::Closed),
                Ok(_) => Ok(Waited::Input),
                Err(e) => Err(e),
            },
        }
    }

    /// Writes an encoded reply frame, applying reply faults and compression.
    async fn write_frame(&mut self, frame: Vec<u8>, compressor: Option<u8>) -> io::Result<()> {
        if let Some(d) = self.state.fail_block.take() {
            tokio::time::sleep(d).await;
        }
        if std::mem::take(&mut self.state.fail_close) {
            return Err(io::Error::other("failCommand fail point: closeConnection"));
        }
        match self.shared.fault.get() {
            Fault::Delay(d) => tokio::time::sleep(d).await,
            Fault::GarbageReply => {
                let response_to = i32::from_le_bytes([frame[8], frame[9], frame[10], frame[11]]);
                return self.writer.write_all(&wire::garbage(response_to)).await;
            }
            Fault::Stall => return Ok(()),
            _ => {}
        }
        let bytes = match compressor {
            Some(c) => wire::compress_frame(&frame, c).unwrap_or(frame),
            None => frame,
        };
        self.writer.write_all(&bytes).await
    }

    /// Sends an OP_MSG reply; returns its requestID.
    async fn send_msg(
        &mut self,
        body: &Document,
        response_to: i32,
        flags: u32,
        compressor: Option<u8>,
    ) -> io::Result<i32> {
        let rid = wire::next_request_id();
        let frame = match wire::encode_op_msg(rid, response_to, flags, body) {
            Ok(f) => f,
            Err(e) => {
                let err = CmdError::new(10334, "BSONObjectTooLarge", e).to_doc();
                wire::encode_op_msg(rid, response_to, flags, &err).map_err(invalid)?
            }
        };
        self.write_frame(frame, compressor).await?;
        Ok(rid)
    }

    async fn send_reply(
        &mut self,
        response_to: i32,
        flags: i32,
        cursor_id: i64,
        starting_from: i32,
        docs: &[Document],
        compressor: Option<u8>,
    ) -> io::Result<()> {
        let rid = wire::next_request_id();
        let frame =
            match wire::encode_op_reply(rid, response_to, flags, cursor_id, starting_from, docs) {
                Ok(f) => f,
                Err(e) => {
                    let err = doc! {"$err": e, "code": 10334};
                    wire::encode_op_reply(rid, response_to, 2, 0, 0, &[err]).map_err(invalid)?
                }
            };
        self.write_frame(frame, compressor).await
    }

    fn ctx(&mut self, db: &str, secondary_ok: bool) -> Ctx<'_> {
        Ctx {
            shared: &self.shared,
            conn: &mut self.state,
            db: db.to_string(),
            secondary_ok,
        }
    }

    /// Marks the current topology as seen (before building a hello reply).
    fn topology_seen(&mut self) {
        if let Some(rx) = &mut self.topology {
            rx.borrow_and_update();
        }
    }

    async fn handle(&mut self, inc: Incoming) -> io::Result<()> {
        let Incoming {
            request_id,
            compressor,
            request,
        } = inc;
        match request {
            Request::Msg(m) => self.handle_msg(request_id, compressor, m).await,
            Request::Query(q) => self.handle_query(request_id, compressor, q).await,
            Request::GetMore {
                ns,
                n_return,
                cursor_id,
            } => {
                self.shared.stats.on_command("op_get_more");
                let (docs, id, flags, from) = if self.legacy_opcodes_removed() {
                    (vec![legacy_op_removed("OP_GET_MORE")], 0, 2, 0)
                } else if self.authorized() {
                    commands::read::legacy_get_more(&self.shared, &ns, n_return, cursor_id)
                } else {
                    (vec![unauthorized_legacy()], 0, 2, 0)
                };
                self.send_reply(request_id, flags, id, from, &docs, compressor)
                    .await
            }
            Request::KillCursors { ids } => {
                self.shared.stats.on_command("op_kill_cursors");
                if self.legacy_opcodes_removed() {
                    debug!(
                        conn = self.state.id,
                        "OP_KILL_CURSORS is no longer supported"
                    );
                } else if self.authorized() {
                    // As mongod's runOpKillCursors (src/mongo/db/run_op_kill_cursors.cpp):
                    // each cursor the user may kill is killed, another user's is skipped,
                    // silently (the opcode has no reply).
                    for id in ids {
                        match self.shared.cursors.owner(id) {
                            Some((_, owner)) if owner != self.state.user => {}
                            _ => {
                                self.shared.cursors.kill(id);
                            }
                        }
                    }
                }
                Ok(())
            }
            Request::Insert {
                ns,
                continue_on_error,
                docs,
            } => {
                self.shared.stats.on_command("op_insert");
                let (db, coll) = split_ns(&ns);
                let docs: Vec<Bson> = docs.into_iter().map(Bson::Document).collect();
                let cmd = doc! {"insert": coll, "documents": docs, "ordered": !continue_on_error};
                self.legacy_write(db, &cmd)
            }
            Request::Update {
                ns,
                upsert,
                multi,
                selector,
                update,
            } => {
                self.shared.stats.on_command("op_update");
                let (db, coll) = split_ns(&ns);
                let cmd = doc! {"update": coll, "updates": [{"q": selector, "u": update, "upsert": upsert, "multi": multi}]};
                self.legacy_write(db, &cmd)
            }
            Request::Delete {
                ns,
                single,
                selector,
            } => {
                self.shared.stats.on_command("op_delete");
                let (db, coll) = split_ns(&ns);
                let limit = if single { 1 } else { 0 };
                let cmd = doc! {"delete": coll, "deletes": [{"q": selector, "limit": limit}]};
                self.legacy_write(db, &cmd)
            }
        }
    }

    /// mongod 6.0 (wire 17) and later no longer serve the legacy opcodes, nor commands other
    /// than hello/isMaster (and a few deprecated ones) through OP_QUERY: see
    /// src/mongo/db/service_entry_point_common.cpp (`HandleRequest::handleRequest`) and
    /// src/mongo/rpc/check_allowed_op_query_cmd.cpp. A stand-in configured with an older
    /// `wire_version` still serves them, for legacy-opcode tests.
    fn legacy_opcodes_removed(&self) -> bool {
        self.shared.config.wire_version >= 17
    }

    fn authorized(&self) -> bool {
        self.shared.users.is_empty() || self.state.user.is_some()
    }

    /// Runs a legacy write (no reply is ever sent for those). On a replica set member that is
    /// not primary the write is not applied and the connection is closed, as mongod does.
    fn legacy_write(&mut self, db: &str, cmd: &Document) -> io::Result<()> {
        if self.legacy_opcodes_removed() {
            // mongod 6.0+: uasserted (5745704-5745706) in a fire-and-forget op: nothing is
            // applied and no reply is sent.
            debug!(
                conn = self.state.id,
                "legacy write opcode is no longer supported"
            );
            return Ok(());
        }
        if !self.authorized() {
            debug!(conn = self.state.id, "unauthenticated legacy write ignored");
            return Ok(());
        }
        if !self.shared.is_writable_primary() {
            return Err(self.not_primary_close());
        }
        let name = command_name(cmd);
        let reply = commands::run(&mut self.ctx(db, false), &name, cmd);
        trace!(conn = self.state.id, ?reply, "legacy write done");
        Ok(())
    }

    /// A fire-and-forget write reached a member that is not primary: mongod closes the
    /// connection so that the client notices.
    fn not_primary_close(&self) -> io::Error {
        info!(
            conn = self.state.id,
            member = self.shared.member_index(),
            "fire-and-forget write on a member that is not primary: write dropped, closing the connection"
        );
        io::Error::other("not primary: fire-and-forget write dropped")
    }

    async fn handle_msg(
        &mut self,
        request_id: i32,
        compressor: Option<u8>,
        m: OpMsg,
    ) -> io::Result<()> {
        let name = command_name(&m.body);
        self.shared.stats.on_command(&name);
        let more_to_come = m.flags & wire::FLAG_MORE_TO_COME != 0;
        let exhaust = m.flags & wire::FLAG_EXHAUST_ALLOWED != 0;
        let compressor = compressor.filter(|_| !never_compressed(&name));
        let db = match m.body.get("$db") {
            Some(Bson::String(s)) => s.clone(),
            _ => String::new(),
        };
        let secondary_ok = commands::read_pref_allows_secondary(&m.body);
        let reply_for = |this: &mut Conn| -> Document {
            if let Some((code, msg)) = &m.section_error {
                return CmdError::new(*code, "", msg.clone()).to_doc_location();
            }
            if let Some(k) = &m.duplicate_key {
                return CmdError::new(
                    40413,
                    "Location40413",
                    format!("BSON field '{k}' is a duplicate field"),
                )
                .to_doc();
            }
            if db.is_empty() {
                return CmdError::new(
                    40571,
                    "Location40571",
                    "OP_MSG requests require a $db argument",
                )
                .to_doc();
            }
            commands::run(&mut this.ctx(&db, secondary_ok), &name, &m.body)
        };

        if (name == "hello" || name == "ismaster")
            && m.body.contains_key("topologyVersion")
            && m.body.contains_key("maxAwaitTimeMS")
            && !more_to_come
        {
            return self
                .awaitable_hello(request_id, compressor, exhaust, &m.body, reply_for)
                .await;
        }

        let reply = reply_for(self);
        if more_to_come {
            if reply.get("code") == Some(&Bson::Int32(10107)) {
                return Err(self.not_primary_close());
            }
            return Ok(());
        }
        let streaming = exhaust && name == "getmore";
        let mut more = streaming && reply_cursor_id(&reply) != 0;
        let mut rid = self
            .send_msg(
                &reply,
                request_id,
                if more { wire::FLAG_MORE_TO_COME } else { 0 },
                compressor,
            )
            .await?;
        // Exhaust getMore: keep sending batches until the cursor is exhausted.
        if more {
            debug!(conn = self.state.id, "exhaust getMore stream");
        }
        while more {
            let next = reply_for(self);
            more = reply_cursor_id(&next) != 0;
            rid = self
                .send_msg(
                    &next,
                    rid,
                    if more { wire::FLAG_MORE_TO_COME } else { 0 },
                    compressor,
                )
                .await?;
        }
        Ok(())
    }

    async fn awaitable_hello(
        &mut self,
        request_id: i32,
        compressor: Option<u8>,
        exhaust: bool,
        body: &Document,
        reply_for: impl Fn(&mut Conn) -> Document,
    ) -> io::Result<()> {
        let wait = body
            .get("maxAwaitTimeMS")
            .and_then(as_i64)
            .unwrap_or(0)
            .clamp(0, 3_600_000);
        let wait = Duration::from_millis(wait as u64);
        self.topology_seen();
        let current = match body.get("topologyVersion") {
            Some(Bson::Document(tv)) => {
                tv.get("processId") == Some(&Bson::ObjectId(self.shared.process_id))
                    && tv.get("counter").and_then(as_i64) == Some(self.shared.topology_counter())
            }
            _ => false,
        };
        if current {
            match self.wait_or_input(wait).await? {
                Waited::Closed => return Ok(()),
                Waited::Elapsed | Waited::Input => {}
            }
        }
        debug!(
            conn = self.state.id,
            ?wait,
            exhaust,
            current,
            "awaitable hello"
        );
        let mut response_to = request_id;
        loop {
            self.topology_seen();
            let reply = reply_for(self);
            let flags = if exhaust { wire::FLAG_MORE_TO_COME } else { 0 };
            response_to = self
                .send_msg(&reply, response_to, flags, compressor)
                .await?;
            if !exhaust {
                return Ok(());
            }
            match self.wait_or_input(wait).await? {
                Waited::Elapsed => {}
                Waited::Closed => return Ok(()),
                // The client is talking again: the stream is over, serve the new message.
                Waited::Input => return Ok(()),
            }
        }
    }

    async fn handle_query(
        &mut self,
        request_id: i32,
        compressor: Option<u8>,
        q: OpQuery,
    ) -> io::Result<()> {
        self.shared.stats.on_command("op_query");
        let (db, coll) = split_ns(&q.ns);
        let secondary_ok = q.flags & wire::QUERY_SECONDARY_OK != 0
            || commands::read_pref_allows_secondary(&q.query);
        if coll == "$cmd" {
            let cmd = unwrap_query(q.query);
            let name = command_name(&cmd);
            self.shared.stats.on_command(&name);
            let compressor = compressor.filter(|_| !never_compressed(&name));
            let db = db.to_string();
            let original = cmd.keys().next().map(String::as_str).unwrap_or_default();
            let reply = if self.legacy_opcodes_removed() && !OP_QUERY_COMMANDS.contains(&original) {
                CmdError::new(
                    352,
                    "UnsupportedOpQueryCommand",
                    format!("Unsupported OP_QUERY command: {original}. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal"),
                )
                .to_doc()
            } else {
                commands::run(&mut self.ctx(&db, secondary_ok), &name, &cmd)
            };
            // responseFlags: AwaitCapable (bit 3), as mongod sets it.
            return self
                .send_reply(request_id, 8, 0, 0, &[reply], compressor)
                .await;
        }
        let (docs, id, flags) = if self.legacy_opcodes_removed() {
            (vec![legacy_op_removed("OP_QUERY")], 0, 2)
        } else if !self.authorized() {
            (vec![unauthorized_legacy()], 0, 2)
        } else if !secondary_ok && !self.shared.is_writable_primary() {
            let e = doc! {"$err": "not primary and secondaryOk=false", "code": 13435};
            (vec![e], 0, 2)
        } else {
            match commands::read::legacy_query(&self.shared, db, coll, &q) {
                Ok((docs, id)) => (docs, id, 8),
                Err(e) => (vec![doc! {"$err": e.msg.clone(), "code": e.code}], 0, 2),
            }
        };
        self.send_reply(request_id, flags, id, 0, &docs, compressor)
            .await
    }
}

/// The commands mongod 6.0+ still serves through OP_QUERY (`allowed` and
/// `temporarilyAllowed` in src/mongo/rpc/check_allowed_op_query_cmd.cpp; case-sensitive).
const OP_QUERY_COMMANDS: &[&str] = &[
    "hello",
    "isMaster",
    "ismaster",
    "_isSelf",
    "authenticate",
    "buildinfo",
    "buildInfo",
    "saslContinue",
    "saslStart",
];

/// mongod 6.0+'s OP_REPLY to a removed legacy read opcode
/// (`makeErrorResponseToUnsupportedOpQuery` in src/mongo/db/dbmessage.cpp).
fn legacy_op_removed(op: &str) -> Document {
    doc! {
        "$err": format!("{op} is no longer supported. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal"),
        "code": 5739101,
        "ok": 0.0,
    }
}

fn unauthorized_legacy() -> Document {
    doc! {"$err": "not authorized: authentication required", "code": 13}
}

/// Splits "db.coll.name" into ("db", "coll.name").
pub(crate) fn split_ns(ns: &str) -> (&str, &str) {
    ns.split_once('.').unwrap_or((ns, ""))
}

/// OP_QUERY commands may be wrapped as `{$query: {...}, $readPreference: ...}`.
fn unwrap_query(q: Document) -> Document {
    let first = q.keys().next().map(String::as_str);
    if matches!(first, Some("$query") | Some("query")) {
        if let Some(Bson::Document(inner)) = q.values().next() {
            return inner.clone();
        }
    }
    q
}

fn reply_cursor_id(reply: &Document) -> i64 {
    match reply.get("cursor") {
        Some(Bson::Document(c)) => c.get("id").and_then(as_i64).unwrap_or(0),
        _ => 0,
    }
}

/// Resolves when the replica set's roles change; never without a set (or once it is gone).
async fn topology_changed(rx: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}
