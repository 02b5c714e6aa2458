//! Wire framing: message header, request decoding, reply encoding.
//!
//! Deliberately independent of the `mongoguard` crate's codec.

use std::sync::atomic::{AtomicI32, Ordering};

use bson::{Document, RawDocument};

use crate::compression;

pub(crate) const OP_REPLY: i32 = 1;
pub(crate) const OP_UPDATE: i32 = 2001;
pub(crate) const OP_INSERT: i32 = 2002;
pub(crate) const OP_QUERY: i32 = 2004;
pub(crate) const OP_GET_MORE: i32 = 2005;
pub(crate) const OP_DELETE: i32 = 2006;
pub(crate) const OP_KILL_CURSORS: i32 = 2007;
pub(crate) const OP_COMPRESSED: i32 = 2012;
pub(crate) const OP_MSG: i32 = 2013;

pub(crate) const HEADER_LEN: usize = 16;
pub(crate) const MAX_MESSAGE_SIZE: usize = 48_000_000;

pub(crate) const FLAG_CHECKSUM: u32 = 1;
pub(crate) const FLAG_MORE_TO_COME: u32 = 1 << 1;
pub(crate) const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;
/// OP_QUERY flag bit 2: reads may be served by a secondary.
pub(crate) const QUERY_SECONDARY_OK: i32 = 1 << 2;

/// A malformed frame: the connection that sent it is closed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct WireError(pub(crate) String);

fn err<T>(msg: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(msg.into()))
}

static NEXT_REQUEST_ID: AtomicI32 = AtomicI32::new(1);

/// A fresh request id for a reply.
pub(crate) fn next_request_id() -> i32 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed) & i32::MAX
}

/// Validates a frame's `messageLength` and returns it as a usize.
pub(crate) fn frame_len(header: &[u8; HEADER_LEN]) -> Result<usize, WireError> {
    let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    match usize::try_from(len) {
        Ok(n) if (HEADER_LEN..=MAX_MESSAGE_SIZE).contains(&n) => Ok(n),
        _ => err(format!("invalid messageLength {len}")),
    }
}

/// A decoded OP_MSG.
#[derive(Debug)]
pub(crate) struct OpMsg {
    pub(crate) flags: u32,
    /// The kind-0 body with the kind-1 sequences merged in as arrays.
    pub(crate) body: Document,
    /// Set when the body repeats a top-level key (the command is then rejected).
    pub(crate) duplicate_key: Option<String>,
    /// A section rule mongod answers with an error (the connection stays open): `(code,
    /// errmsg)`, see [`parse_op_msg`].
    pub(crate) section_error: Option<(i32, String)>,
}

/// A decoded OP_QUERY.
#[derive(Debug)]
pub(crate) struct OpQuery {
    /// The OP_QUERY flags (bit 2 = secondaryOk).
    pub(crate) flags: i32,
    pub(crate) ns: String,
    pub(crate) skip: i32,
    pub(crate) n_return: i32,
    pub(crate) query: Document,
    pub(crate) fields: Option<Document>,
}

#[derive(Debug)]
pub(crate) enum Request {
    Msg(OpMsg),
    Query(OpQuery),
    Insert {
        ns: String,
        continue_on_error: bool,
        docs: Vec<Document>,
    },
    Update {
        ns: String,
        upsert: bool,
        multi: bool,
        selector: Document,
        update: Document,
    },
    Delete {
        ns: String,
        single: bool,
        selector: Document,
    },
    GetMore {
        ns: String,
        n_return: i32,
        cursor_id: i64,
    },
    KillCursors {
        ids: Vec<i64>,
    },
}

/// A decoded request frame.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) request_id: i32,
    /// The compressor id used by the request (replies use the same), if it was compressed.
    pub(crate) compressor: Option<u8>,
    pub(crate) request: Request,
}

/// Little-endian cursor over a byte slice with checked reads.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| WireError("message truncated".into()))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        let b = self.bytes(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(self.i32()? as u32)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn i64(&mut self) -> Result<i64, WireError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    pub(crate) fn cstring(&mut self) -> Result<String, WireError> {
        let rest = &self.buf[self.pos..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| WireError("unterminated cstring".into()))?;
        let s = std::str::from_utf8(&rest[..nul])
            .map_err(|_| WireError("cstring is not UTF-8".into()))?
            .to_string();
        self.pos += nul + 1;
        Ok(s)
    }

    /// Reads one BSON document (length-prefixed) as raw bytes.
    pub(crate) fn raw_doc(&mut self) -> Result<&'a [u8], WireError> {
        let start = self.pos;
        let len = self.i32()?;
        self.pos = start;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l >= 5)
            .ok_or_else(|| WireError(format!("invalid BSON document length {len}")))?;
        self.bytes(len)
    }

    pub(crate) fn doc(&mut self) -> Result<Document, WireError> {
        decode_doc(self.raw_doc()?)
    }
}

/// Documents nested deeper than this are rejected (decoding them recursively could overflow
/// the stack; mongod's own limit is in the same range).
const MAX_DEPTH: usize = 150;

fn depth_ok(doc: &RawDocument, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    // Malformed elements are reported by the full decode that follows.
    doc.iter().flatten().all(|(_, v)| match v {
        bson::RawBsonRef::Document(d) => depth_ok(d, depth + 1),
        bson::RawBsonRef::Array(a) => {
            RawDocument::from_bytes(a.as_bytes()).map_or(true, |d| depth_ok(d, depth + 1))
        }
        _ => true,
    })
}

pub(crate) fn decode_doc(bytes: &[u8]) -> Result<Document, WireError> {
    let raw = RawDocument::from_bytes(bytes).map_err(|e| WireError(format!("bad BSON: {e}")))?;
    if !depth_ok(raw, 1) {
        return err(format!("BSON nesting deeper than {MAX_DEPTH}"));
    }
    Document::try_from(raw).map_err(|e| WireError(format!("bad BSON: {e}")))
}

/// Returns the first key that appears twice at the top level of `bytes`, if any.
fn duplicate_key(bytes: &[u8], doc: &Document) -> Option<String> {
    let raw = RawDocument::from_bytes(bytes).ok()?;
    let count = raw.iter().count();
    if count == doc.len() {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    for (k, _) in raw.iter().flatten() {
        if !seen.insert(k.to_string()) {
            return Some(k.to_string());
        }
    }
    None
}

/// Decodes a complete frame (header included).
pub(crate) fn parse_frame(frame: &[u8]) -> Result<Incoming, WireError> {
    let mut r = Reader::new(frame);
    let _len = r.i32()?;
    let request_id = r.i32()?;
    let _response_to = r.i32()?;
    let op_code = r.i32()?;
    if op_code == OP_COMPRESSED {
        let original = r.i32()?;
        if original == OP_COMPRESSED {
            return err("nested OP_COMPRESSED");
        }
        let size = r.i32()?;
        let id = r.u8()?;
        let body = compression::decompress(id, size, r.bytes(r.remaining())?)?;
        let request = parse_body(original, &body, None)?;
        return Ok(Incoming {
            request_id,
            compressor: Some(id),
            request,
        });
    }
    let request = parse_body(op_code, &frame[HEADER_LEN..], Some(frame))?;
    Ok(Incoming {
        request_id,
        compressor: None,
        request,
    })
}

/// Decodes a message body (after the header). `whole` is the whole uncompressed frame, used
/// to verify an OP_MSG checksum.
fn parse_body(op_code: i32, body: &[u8], whole: Option<&[u8]>) -> Result<Request, WireError> {
    let mut r = Reader::new(body);
    match op_code {
        OP_MSG => parse_op_msg(body, whole),
        OP_QUERY => {
            let flags = r.i32()?;
            let ns = r.cstring()?;
            let skip = r.i32()?;
            let n_return = r.i32()?;
            let query = r.doc()?;
            let fields = if r.remaining() > 0 {
                Some(r.doc()?)
            } else {
                None
            };
            Ok(Request::Query(OpQuery {
                flags,
                ns,
                skip,
                n_return,
                query,
                fields,
            }))
        }
        OP_INSERT => {
            let flags = r.i32()?;
            let ns = r.cstring()?;
            let mut docs = Vec::new();
            while r.remaining() > 0 {
                docs.push(r.doc()?);
            }
            Ok(Request::Insert {
                ns,
                continue_on_error: flags & 1 != 0,
                docs,
            })
        }
        OP_UPDATE => {
            let _zero = r.i32()?;
            let ns = r.cstring()?;
            let flags = r.i32()?;
            let selector = r.doc()?;
            let update = r.doc()?;
            Ok(Request::Update {
                ns,
                upsert: flags & 1 != 0,
                multi: flags & 2 != 0,
                selector,
                update,
            })
        }
        OP_DELETE => {
            let _zero = r.i32()?;
            let ns = r.cstring()?;
            let flags = r.i32()?;
            let selector = r.doc()?;
            Ok(Request::Delete {
                ns,
                single: flags & 1 != 0,
                selector,
            })
        }
        OP_GET_MORE => {
            let _zero = r.i32()?;
            let ns = r.cstring()?;
            let n_return = r.i32()?;
            let cursor_id = r.i64()?;
            Ok(Request::GetMore {
                ns,
                n_return,
                cursor_id,
            })
        }
        OP_KILL_CURSORS => {
            let _zero = r.i32()?;
            let n = r.i32()?;
            let n = usize::try_from(n).map_err(|_| WireError("negative cursor count".into()))?;
            if n > r.remaining() / 8 {
                return err("OP_KILL_CURSORS count exceeds message");
            }
            let ids = (0..n).map(|_| r.i64()).collect::<Result<_, _>>()?;
            Ok(Request::KillCursors { ids })
        }
        other => err(format!("unsupported opCode {other}")),
    }
}

fn parse_op_msg(body: &[u8], whole: Option<&[u8]>) -> Result<Request, WireError> {
    let mut r = Reader::new(body);
    let flags = r.u32()?;
    // Bits 0-15 are "required": unknown ones must make the message fail.
    if flags & 0xFFFF & !(FLAG_CHECKSUM | FLAG_MORE_TO_COME) != 0 {
        return err(format!("unknown required OP_MSG flag bits {flags:#x}"));
    }
    let mut sections_end = body.len();
    if flags & FLAG_CHECKSUM != 0 {
        if body.len() < 8 {
            return err("OP_MSG too short for its checksum");
        }
        sections_end -= 4;
        if let Some(whole) = whole {
            let split = whole.len() - 4;
            let expected = u32::from_le_bytes([
                whole[split],
                whole[split + 1],
                whole[split + 2],
                whole[split + 3],
            ]);
            if crc32c::crc32c(&whole[..split]) != expected {
                return err("OP_MSG checksum mismatch");
            }
        }
    }
    // Section rules as src/mongo/rpc/op_msg.cpp (`OpMsg::parse`): a third document sequence is
    // TooManyDocumentSequences, connection-fatal like unknown required flags (error class
    // ConnectionFatalMessageParseError in src/mongo/base/error_codes.yml); the other rule
    // violations are answered with their error and the connection stays open.
    let mut r = Reader::new(&body[4..sections_end]);
    let mut main: Option<(Document, Option<String>)> = None;
    let mut sequences: Vec<(String, Vec<bson::Bson>)> = Vec::new();
    let mut section_error: Option<(i32, String)> = None;
    while r.remaining() > 0 && section_error.is_none() {
        match r.u8()? {
            0 => {
                if main.is_some() {
                    section_error = Some((40430, "Multiple body sections in message".into()));
                    continue;
                }
                let raw = r.raw_doc()?;
                let doc = decode_doc(raw)?;
                let dup = duplicate_key(raw, &doc);
                main = Some((doc, dup));
            }
            1 => {
                if sequences.len() >= 2 {
                    return err("Too many document sequences in OP_MSG");
                }
                let size = r.i32()?;
                let size = usize::try_from(size)
                    .ok()
                    .filter(|&s| s >= 4)
                    .ok_or_else(|| WireError(format!("bad kind-1 section size {size}")))?;
                let mut s = Reader::new(r.bytes(size - 4)?);
                let id = s.cstring()?;
                if sequences.iter().any(|(n, _)| n == &id) {
                    section_error = Some((40431, format!("Duplicate document sequence: {id}")));
                    continue;
                }
                let mut docs = Vec::new();
                while s.remaining() > 0 {
                    docs.push(bson::Bson::Document(s.doc()?));
                }
                sequences.push((id, docs));
            }
            k => section_error = Some((40432, format!("Unknown section kind {k}"))),
        }
    }
    let (mut body, duplicate_key) = match main {
        Some(m) => m,
        None => {
            if section_error.is_none() {
                section_error = Some((40587, "OP_MSG messages must have a body".into()));
            }
            (Document::new(), None)
        }
    };
    for (id, docs) in sequences {
        if section_error.is_none() && body.contains_key(&id) {
            section_error = Some((
                40433,
                format!("Duplicate field between body and document sequence {id}"),
            ));
        }
        body.insert(id, docs);
    }
    Ok(Request::Msg(OpMsg {
        flags,
        body,
        duplicate_key,
        section_error,
    }))
}

fn header(buf: &mut Vec<u8>, request_id: i32, response_to: i32, op_code: i32) {
    buf.extend_from_slice(&0i32.to_le_bytes());
    buf.extend_from_slice(&request_id.to_le_bytes());
    buf.extend_from_slice(&response_to.to_le_bytes());
    buf.extend_from_slice(&op_code.to_le_bytes());
}

fn finish(mut buf: Vec<u8>) -> Result<Vec<u8>, String> {
    let len = i32::try_from(buf.len())
        .ok()
        .filter(|&l| l as usize <= MAX_MESSAGE_SIZE)
        .ok_or_else(|| format!("reply of {} bytes exceeds maxMessageSizeBytes", buf.len()))?;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    Ok(buf)
}

/// Encodes an OP_MSG reply with one kind-0 section.
pub(crate) fn encode_op_msg(
    request_id: i32,
    response_to: i32,
    flags: u32,
    body: &Document,
) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(256);
    header(&mut buf, request_id, response_to, OP_MSG);
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.push(0);
    body.to_writer(&mut buf).map_err(|e| e.to_string())?;
    finish(buf)
}

/// Encodes an OP_REPLY.
pub(crate) fn encode_op_reply(
    request_id: i32,
    response_to: i32,
    response_flags: i32,
    cursor_id: i64,
    starting_from: i32,
    docs: &[Document],
) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(256);
    header(&mut buf, request_id, response_to, OP_REPLY);
    buf.extend_from_slice(&response_flags.to_le_bytes());
    buf.extend_from_slice(&cursor_id.to_le_bytes());
    buf.extend_from_slice(&starting_from.to_le_bytes());
    let n = i32::try_from(docs.len()).map_err(|_| "too many documents".to_string())?;
    buf.extend_from_slice(&n.to_le_bytes());
    for d in docs {
        d.to_writer(&mut buf).map_err(|e| e.to_string())?;
    }
    finish(buf)
}

/// Bytes that are not a valid message (negative messageLength, then junk).
pub(crate) fn garbage(response_to: i32) -> Vec<u8> {
    let mut buf = Vec::new();
    buf.extend_from_slice(&(-1i32).to_le_bytes());
    buf.extend_from_slice(&next_request_id().to_le_bytes());
    buf.extend_from_slice(&response_to.to_le_bytes());
    buf.extend_from_slice(&0x0BAD_F00Di32.to_le_bytes());
    buf.extend_from_slice(b"\xffthis is not a MongoDB message\x00\xde\xad\xbe\xef");
    buf
}

/// Wraps an encoded frame into OP_COMPRESSED with the given compressor id.
pub(crate) fn compress_frame(frame: &[u8], compressor: u8) -> Result<Vec<u8>, String> {
    let mut r = Reader::new(frame);
    let (_len, request_id, response_to, op_code) = (
        r.i32().map_err(|e| e.0)?,
        r.i32().map_err(|e| e.0)?,
        r.i32().map_err(|e| e.0)?,
        r.i32().map_err(|e| e.0)?,
    );
    let payload = &frame[HEADER_LEN..];
    let compressed = compression::compress(compressor, payload)?;
    let mut buf = Vec::with_capacity(compressed.len() + 25);
    header(&mut buf, request_id, response_to, OP_COMPRESSED);
    buf.extend_from_slice(&op_code.to_le_bytes());
    let size = i32::try_from(payload.len()).map_err(|_| "payload too large".to_string())?;
    buf.extend_from_slice(&size.to_le_bytes());
    buf.push(compressor);
    buf.extend_from_slice(&compressed);
    finish(buf)
}

#[cfg(test)]
mod tests;
