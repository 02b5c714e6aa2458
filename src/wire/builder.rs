//! Encoders: the replies mongoguard sends itself, and every request shape for tests.

use bson::{RawDocument, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};

use super::{op_msg::MsgFlags, Header, OpCode, HEADER_LEN};

/// A kind-1 section to encode.
#[derive(Clone, Debug)]
pub struct Sequence {
    identifier: String,
    docs: Vec<RawDocumentBuf>,
}

impl Sequence {
    /// A sequence of `docs` under `identifier`.
    pub fn new(identifier: impl Into<String>, docs: Vec<RawDocumentBuf>) -> Self {
        Sequence {
            identifier: identifier.into(),
            docs,
        }
    }
}

/// Builds an OP_MSG.
#[derive(Clone, Debug)]
pub struct MsgBuilder {
    flags: u32,
    body: RawDocumentBuf,
    sequences: Vec<Sequence>,
    checksum: bool,
}

impl MsgBuilder {
    /// A message with this body and no flags.
    pub fn new(body: RawDocumentBuf) -> Self {
        MsgBuilder {
            flags: 0,
            body,
            sequences: Vec::new(),
            checksum: false,
        }
    }

    /// Sets flag bits (checksumPresent is managed by [`MsgBuilder::checksum`]).
    pub fn flags(mut self, flags: u32) -> Self {
        self.flags = flags & !MsgFlags::CHECKSUM_PRESENT;
        self
    }

    /// Appends a kind-1 section.
    pub fn sequence(mut self, seq: Sequence) -> Self {
        self.sequences.push(seq);
        self
    }

    /// Adds a CRC-32C trailer.
    pub fn checksum(mut self, on: bool) -> Self {
        self.checksum = on;
        self
    }

    /// Encodes with the given ids.
    pub fn encode(&self, request_id: i32, response_to: i32) -> Bytes {
        let mut out = BytesMut::with_capacity(HEADER_LEN + 5 + self.body.as_bytes().len());
        out.put_slice(&[0u8; HEADER_LEN]);
        let flags = self.flags
            | if self.checksum {
                MsgFlags::CHECKSUM_PRESENT
            } else {
                0
            };
        out.put_u32_le(flags);
        out.put_u8(0);
        out.put_slice(self.body.as_bytes());
        for seq in &self.sequences {
            out.put_u8(1);
            let size: usize = 4
                + seq.identifier.len()
                + 1
                + seq.docs.iter().map(|d| d.as_bytes().len()).sum::<usize>();
            out.put_i32_le(size as i32);
            out.put_slice(seq.identifier.as_bytes());
            out.put_u8(0);
            for d in &seq.docs {
                out.put_slice(d.as_bytes());
            }
        }
        let total = out.len() + if self.checksum { 4 } else { 0 };
        write_header(&mut out, total, request_id, response_to, OpCode::Msg);
        if self.checksum {
            let crc = crc32c::crc32c(&out);
            out.put_u32_le(crc);
        }
        out.freeze()
    }
}

fn write_header(out: &mut BytesMut, total: usize, request_id: i32, response_to: i32, op: OpCode) {
    let header = Header {
        length: i32::try_from(total).unwrap_or(i32::MAX),
        request_id,
        response_to,
        op_code: op as i32,
    };
    // Every caller reserved the header first; a shorter buffer would be a bug caught by tests.
    if let Some(h) = out.get_mut(..HEADER_LEN) {
        h.copy_from_slice(&header.to_bytes());
    }
}

fn start() -> BytesMut {
    let mut out = BytesMut::with_capacity(256);
    out.put_slice(&[0u8; HEADER_LEN]);
    out
}

fn cstring(out: &mut BytesMut, s: &str) {
    out.put_slice(s.as_bytes());
    out.put_u8(0);
}

fn finish(mut out: BytesMut, request_id: i32, response_to: i32, op: OpCode) -> Bytes {
    let total = out.len();
    write_header(&mut out, total, request_id, response_to, op);
    out.freeze()
}

/// An OP_MSG reply with one body and no flags.
pub fn encode_msg_reply(request_id: i32, response_to: i32, body: &RawDocument) -> Bytes {
    let mut out = start();
    out.put_u32_le(0);
    out.put_u8(0);
    out.put_slice(body.as_bytes());
    finish(out, request_id, response_to, OpCode::Msg)
}

/// An OP_QUERY.
pub fn encode_query(
    request_id: i32,
    flags: i32,
    full_collection_name: &str,
    number_to_skip: i32,
    number_to_return: i32,
    query: &RawDocument,
    fields: Option<&RawDocument>,
) -> Bytes {
    let mut out = start();
    out.put_i32_le(flags);
    cstring(&mut out, full_collection_name);
    out.put_i32_le(number_to_skip);
    out.put_i32_le(number_to_return);
    out.put_slice(query.as_bytes());
    if let Some(f) = fields {
        out.put_slice(f.as_bytes());
    }
    finish(out, request_id, 0, OpCode::Query)
}

/// An OP_REPLY.
pub fn encode_reply(
    request_id: i32,
    response_to: i32,
    response_flags: i32,
    cursor_id: i64,
    starting_from: i32,
    docs: &[&RawDocument],
) -> Bytes {
    let mut out = start();
    out.put_i32_le(response_flags);
    out.put_i64_le(cursor_id);
    out.put_i32_le(starting_from);
    out.put_i32_le(docs.len() as i32);
    for d in docs {
        out.put_slice(d.as_bytes());
    }
    finish(out, request_id, response_to, OpCode::Reply)
}

/// A legacy OP_INSERT.
pub fn encode_insert(request_id: i32, flags: i32, ns: &str, docs: &[&RawDocument]) -> Bytes {
    let mut out = start();
    out.put_i32_le(flags);
    cstring(&mut out, ns);
    for d in docs {
        out.put_slice(d.as_bytes());
    }
    finish(out, request_id, 0, OpCode::Insert)
}

/// A legacy OP_UPDATE.
pub fn encode_update(
    request_id: i32,
    ns: &str,
    flags: i32,
    selector: &RawDocument,
    update: &RawDocument,
) -> Bytes {
    let mut out = start();
    out.put_i32_le(0);
    cstring(&mut out, ns);
    out.put_i32_le(flags);
    out.put_slice(selector.as_bytes());
    out.put_slice(update.as_bytes());
    finish(out, request_id, 0, OpCode::Update)
}

/// A legacy OP_DELETE.
pub fn encode_delete(request_id: i32, ns: &str, flags: i32, selector: &RawDocument) -> Bytes {
    let mut out = start();
    out.put_i32_le(0);
    cstring(&mut out, ns);
    out.put_i32_le(flags);
    out.put_slice(selector.as_bytes());
    finish(out, request_id, 0, OpCode::Delete)
}

/// A legacy OP_GET_MORE.
pub fn encode_get_more(request_id: i32, ns: &str, number_to_return: i32, cursor_id: i64) -> Bytes {
    let mut out = start();
    out.put_i32_le(0);
    cstring(&mut out, ns);
    out.put_i32_le(number_to_return);
    out.put_i64_le(cursor_id);
    finish(out, request_id, 0, OpCode::GetMore)
}

/// A legacy OP_KILL_CURSORS.
pub fn encode_kill_cursors(request_id: i32, ids: &[i64]) -> Bytes {
    let mut out = start();
    out.put_i32_le(0);
    out.put_i32_le(ids.len() as i32);
    for id in ids {
        out.put_i64_le(*id);
    }
    finish(out, request_id, 0, OpCode::KillCursors)
}

/// `{ok: 0, errmsg, code, codeName}` as mongod shapes command errors.
pub fn error_document(code: i32, code_name: &str, errmsg: &str) -> RawDocumentBuf {
    bson::rawdoc! {
        "ok": 0.0,
        "errmsg": errmsg,
        "code": code,
        "codeName": code_name,
    }
}

/// A reply to a request of opcode `request_op`, in that opcode family: OP_MSG for OP_MSG,
/// OP_REPLY for OP_QUERY and OP_GET_MORE (answering an OP_MSG with an OP_REPLY breaks
/// drivers). `None` for opcodes that have no reply channel.
pub fn reply_for(
    request_op: OpCode,
    client_request_id: i32,
    our_request_id: i32,
    doc: &RawDocument,
) -> Option<Bytes> {
    match request_op {
        OpCode::Msg => Some(encode_msg_reply(our_request_id, client_request_id, doc)),
        OpCode::Query | OpCode::GetMore => {
            let flags = if doc.get("$err").ok().flatten().is_some() {
                super::op_reply::QUERY_FAILURE
            } else {
                0
            };
            Some(encode_reply(
                our_request_id,
                client_request_id,
                flags,
                0,
                0,
                &[doc],
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Message, OpMsg, OpReply, DEFAULT_MAX_MESSAGE_SIZE};

    #[test]
    fn replies_follow_the_request_family() {
        let err = error_document(50_000, "Guard", "no");
        let msg = reply_for(OpCode::Msg, 9, 100, &err).unwrap();
        let view = OpMsg::parse(&msg).unwrap();
        assert_eq!(Header::parse(&msg).unwrap().response_to, 9);
        assert_eq!(view.body().get_i32("code").unwrap(), 50_000);
        let rep = reply_for(OpCode::Query, 9, 100, &err).unwrap();
        let view = OpReply::parse(&rep).unwrap();
        assert_eq!(view.number_returned, 1);
        assert!(matches!(
            Message::parse(&rep, DEFAULT_MAX_MESSAGE_SIZE).unwrap(),
            Message::Reply(_)
        ));
        assert!(reply_for(OpCode::Insert, 9, 100, &err).is_none());
    }
}
