//! What the proxy needs to know about a client message before forwarding it. Every client
//! message is fully parsed and validated here (OP_COMPRESSED is decompressed into a view);
//! the original bytes are what gets forwarded.

use bson::RawDocument;

use super::{
    guard::Judgement,
    hello::{self, ClientMetadata},
};
use crate::wire::{first_key, Frame, Index, Message, OpCode, WireError};

/// The facts the session loop acts on.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// The client's requestID (replies must answer it).
    pub request_id: i32,
    /// The opcode inside any compression: decides the reply family.
    pub op: OpCode,
    /// False for moreToCome and fire-and-forget legacy writes.
    pub expects_reply: bool,
    /// exhaustAllowed: the upstream may stream several replies.
    pub exhaust_allowed: bool,
    /// hello / isMaster / ismaster.
    pub is_hello: bool,
    /// The handshake's client metadata, present on a first hello that carries it.
    pub metadata: Option<ClientMetadata>,
    /// getLastError (legacy applications ask it after fire-and-forget writes).
    pub is_get_last_error: bool,
    /// A legacy OP_QUERY on a collection (a find, answered with `$err` documents).
    pub legacy_find: bool,
    /// True for writes (for getLastError emulation).
    pub is_write: bool,
    /// The policy's verdict.
    pub judgement: Judgement,
    /// The `command` metric label (an index into `metrics::commands::COMMANDS`).
    pub command: usize,
}

/// Parses and validates a client message, and asks `judge` (the policy) about it while the
/// (possibly decompressed) view is alive.
pub(crate) fn inspect(
    frame: &Frame,
    max_message_size: usize,
    want_metadata: bool,
    judge: impl FnOnce(&Message<'_>) -> Judgement,
) -> Result<Request, WireError> {
    inspect_with(frame, None, max_message_size, want_metadata, |msg, _| {
        judge(msg)
    })
}

/// [`inspect`], with the decompressed form of an OP_COMPRESSED `frame` already at hand
/// (see [`decompress_off_thread`]); `judge` also receives the index of an OP_MSG body (built
/// once here, where the command name is read off it, for routing and judging).
pub(crate) fn inspect_with(
    frame: &Frame,
    inner: Option<&Frame>,
    max_message_size: usize,
    want_metadata: bool,
    judge: impl for<'m> FnOnce(&Message<'m>, Option<Index<'m>>) -> Judgement,
) -> Result<Request, WireError> {
    let request_id = frame.header().request_id;
    match Message::parse(frame.bytes(), max_message_size)? {
        Message::Compressed(c) => {
            let owned;
            let inner = match inner {
                Some(f) => f,
                None => {
                    owned = c.decompress()?;
                    &owned
                }
            };
            let msg = Message::parse(inner.bytes(), max_message_size)?;
            if matches!(msg, Message::Compressed(_)) {
                return Err(WireError::NestedCompression);
            }
            describe(&msg, request_id, want_metadata, judge)
        }
        msg => describe(&msg, request_id, want_metadata, judge),
    }
}

/// Decompressed messages above this size are decompressed on the blocking pool, so a burst
/// of compression bombs never stalls the runtime threads that serve everyone else.
const INLINE_DECOMPRESS_MAX: usize = 64 * 1024;

/// What decompressing a client message gave.
pub(crate) enum Decompressed {
    /// Not compressed.
    Plain,
    /// The inner frame, and the memory budget it holds (large ones only).
    Inner(Frame, Option<super::client_io::BudgetPermit>),
    /// The budget for its declared size stayed spent: refuse it (65003).
    OverBudget,
}

/// Decompresses an OP_COMPRESSED client message before inspection: its declared size is
/// taken from the memory budget first, and large ones are decompressed off the runtime
/// threads. Errors are the client's (a bad frame).
pub(crate) async fn decompress_off_thread(
    frame: &Frame,
    max_message_size: usize,
    budget: &super::client_io::MemoryBudget,
    wait: std::time::Duration,
    kill: &super::stop::Stop,
) -> Result<Decompressed, WireError> {
    if frame.op_code() != Some(OpCode::Compressed) {
        return Ok(Decompressed::Plain);
    }
    let size = match Message::parse(frame.bytes(), max_message_size)? {
        Message::Compressed(c) => c.uncompressed_size,
        _ => return Ok(Decompressed::Plain),
    };
    let permit = if size > super::client_io::BUDGET_FREE_BELOW {
        match budget.take(size, wait, kill).await {
            Some(p) => Some(p),
            None => return Ok(Decompressed::OverBudget),
        }
    } else {
        None
    };
    let decompress = move |bytes: bytes::Bytes| match Message::parse(&bytes, max_message_size)? {
        Message::Compressed(c) => c.decompress(),
        other => Err(WireError::UnknownOpCode(other.op_code() as i32)),
    };
    let inner = if size <= INLINE_DECOMPRESS_MAX {
        decompress(frame.bytes().clone())?
    } else {
        let bytes = frame.bytes().clone();
        let Some(_slot) = budget.off_thread_slot(kill).await else {
            return Err(WireError::Decompression(
                "mongoguard is shutting down".into(),
            ));
        };
        match tokio::task::spawn_blocking(move || decompress(bytes)).await {
            Ok(r) => r?,
            Err(e) => return Err(WireError::Decompression(e.to_string())),
        }
    };
    Ok(Decompressed::Inner(inner, permit))
}

fn describe(
    msg: &Message<'_>,
    request_id: i32,
    want_metadata: bool,
    judge: impl for<'m> FnOnce(&Message<'m>, Option<Index<'m>>) -> Judgement,
) -> Result<Request, WireError> {
    let (command, exhaust_allowed): (Option<&RawDocument>, bool) = match msg {
        Message::Msg(m) => (Some(m.body()), m.flags().exhaust_allowed()),
        Message::Query(q) if q.is_command() => (Some(q.command()), false),
        // Clients never send replies; a reply from a client is a protocol error.
        Message::Reply(_) => return Err(WireError::UnknownOpCode(OpCode::Reply as i32)),
        _ => (None, false),
    };
    // An OP_MSG body's top-level keys, indexed once for the command name, routing and
    // judging.
    let body = match msg {
        Message::Msg(m) => Some(Index::new(m.body())),
        _ => None,
    };
    // The command name, read once; an empty command document is refused.
    let name = match (command, &body) {
        (Some(cmd), Some(index)) if std::ptr::eq(index.doc(), cmd) => Some(
            index
                .first_key()
                .ok_or(WireError::EmptyCommand("command"))?,
        ),
        (Some(cmd), _) => Some(first_key(cmd).ok_or(WireError::EmptyCommand("command"))?),
        (None, _) => None,
    };
    let is_hello = name.is_some_and(hello::is_hello_command);
    let metadata = match command {
        Some(cmd) if is_hello && want_metadata => ClientMetadata::from_hello(cmd),
        _ => None,
    };
    let kind = name.map(crate::command::Kind::from_name);
    let is_write = match msg {
        Message::Insert(_) | Message::Update(_) | Message::Delete(_) => true,
        _ => kind.is_some_and(crate::command::Kind::is_write),
    };
    Ok(Request {
        request_id,
        op: msg.op_code(),
        expects_reply: msg.expects_reply(),
        exhaust_allowed,
        is_hello,
        metadata,
        is_get_last_error: kind == Some(crate::command::Kind::GetLastError),
        legacy_find: matches!(msg, Message::Query(q) if !q.is_command()),
        is_write,
        judgement: judge(msg, body),
        command: super::observe::command_label(msg, name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        builder::{encode_insert, encode_query, MsgBuilder},
        compression::{compress, Compressor},
        MsgFlags, DEFAULT_MAX_MESSAGE_SIZE,
    };
    use bson::rawdoc;
    use bytes::Bytes;

    fn fwd(_: &Message<'_>) -> Judgement {
        Judgement::Forward
    }

    fn frame(b: Bytes) -> Frame {
        Frame::from_bytes(b).unwrap()
    }

    #[test]
    fn hello_in_every_carrier_is_recognised() {
        let hello = rawdoc! {"isMaster": 1.0, "client": {"application": {"name": "billing"},
        "driver": {"name": "PyMongo", "version": "4.8"}}};
        let q = frame(encode_query(7, 0, "admin.$cmd", 0, -1, &hello, None));
        let r = inspect(&q, DEFAULT_MAX_MESSAGE_SIZE, true, fwd).unwrap();
        assert!(r.is_hello && r.expects_reply);
        assert_eq!(r.op, OpCode::Query);
        let meta = r.metadata.unwrap();
        assert_eq!(meta.application.as_deref(), Some("billing"));
        assert_eq!(meta.driver.as_deref(), Some("PyMongo 4.8"));

        let m = MsgBuilder::new(rawdoc! {"hello": true, "$db": "admin"}).encode(8, 0);
        let z = frame(compress(&m, Compressor::Zstd).unwrap());
        let r = inspect(&z, DEFAULT_MAX_MESSAGE_SIZE, true, fwd).unwrap();
        assert!(r.is_hello);
        assert_eq!(r.op, OpCode::Msg);
        assert_eq!(r.request_id, 8);
    }

    #[test]
    fn more_to_come_and_legacy_writes_expect_no_reply() {
        let m = MsgBuilder::new(rawdoc! {"insert": "c", "$db": "d"})
            .flags(MsgFlags::MORE_TO_COME)
            .encode(1, 0);
        assert!(
            !inspect(&frame(m), DEFAULT_MAX_MESSAGE_SIZE, false, fwd)
                .unwrap()
                .expects_reply
        );
        let ins = encode_insert(2, 0, "d.c", &[&rawdoc! {"a": 1}]);
        assert!(
            !inspect(&frame(ins), DEFAULT_MAX_MESSAGE_SIZE, false, fwd)
                .unwrap()
                .expects_reply
        );
    }

    #[test]
    fn empty_command_and_client_replies_rejected() {
        let m = MsgBuilder::new(rawdoc! {}).encode(1, 0);
        assert!(inspect(&frame(m), DEFAULT_MAX_MESSAGE_SIZE, false, fwd).is_err());
        let r = crate::wire::builder::encode_reply(1, 0, 0, 0, 0, &[&rawdoc! {}]);
        assert!(inspect(&frame(r), DEFAULT_MAX_MESSAGE_SIZE, false, fwd).is_err());
    }
}
