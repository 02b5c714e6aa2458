//! Target `reply_facts`: an upstream reply through what the proxy reads off it.
//!
//! The first byte chooses the request the reply answers (bit 0: the request allowed exhaust);
//! the rest is the reply → [`Frame`] → `proxy::routing::ReplyFacts::read` (error, code,
//! cursor: what pooled mode pins and retries on) and `proxy::session::reply_more_to_come`
//! (whether the relay waits for another reply).
//!
//! What is asserted, against a reading written out here independently:
//! - `ReplyFacts` of an uncompressed OP_MSG / OP_REPLY: `error` is exactly `ok` being 0 or
//!   false, `code` is the int32 `code` of an error (and only of an error), the cursor is the
//!   header's id for OP_REPLY and `cursor.id` (int32/int64/integral double) for OP_MSG; any
//!   other frame, compressed ones included, reads as "nothing known";
//! - `reply_more_to_come` is never true for a request that did not allow exhaust, is true only
//!   for an OP_MSG (possibly compressed) with moreToCome, accepts an uncompressed reply only
//!   if it parses, and refuses every opcode other than OP_MSG / OP_REPLY / OP_COMPRESSED.

use std::sync::OnceLock;

use bson::{rawdoc, RawBsonRef, RawDocument};

use crate::{
    proxy::{
        guard::Judgement,
        inspect::{inspect, Request},
        routing::{CursorReply, ReplyFacts},
        session::reply_more_to_come,
    },
    wire::{builder::MsgBuilder, Frame, Message, MsgFlags, OpCode, DEFAULT_MAX_MESSAGE_SIZE},
};

/// The request a reply answers: a find, with or without exhaustAllowed, as the proxy's own
/// inspection describes it.
fn request(exhaust: bool) -> Option<&'static Request> {
    static REQUESTS: OnceLock<[Option<Request>; 2]> = OnceLock::new();
    let both = REQUESTS.get_or_init(|| {
        [false, true].map(|exhaust| {
            let flags = if exhaust {
                MsgFlags::EXHAUST_ALLOWED
            } else {
                0
            };
            let bytes = MsgBuilder::new(rawdoc! {"find": "c", "$db": "d"})
                .flags(flags)
                .encode(1, 0);
            let frame = Frame::from_bytes(bytes).ok()?;
            inspect(&frame, DEFAULT_MAX_MESSAGE_SIZE, false, |_| {
                Judgement::Forward
            })
            .ok()
        })
    });
    both.get(usize::from(exhaust))?.as_ref()
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some((&choice, reply)) = data.split_first() else {
        return;
    };
    let exhaust = choice & 1 == 1;
    let req = request(exhaust);
    assert!(req.is_some(), "the fixed request does not inspect");
    let Some(req) = req else {
        return;
    };
    assert_eq!(req.exhaust_allowed, exhaust);
    let Some(bytes) = super::framed(reply) else {
        return;
    };
    let Ok(frame) = Frame::from_bytes(bytes) else {
        return;
    };
    check_facts(&frame);
    check_more_to_come(&frame, req);
}

fn check_facts(frame: &Frame) {
    let facts = ReplyFacts::read(frame);
    assert_eq!(facts, ReplyFacts::read(frame), "not deterministic");
    assert!(
        facts.code.is_none() || facts.error,
        "a code without an error"
    );
    let (doc, legacy_cursor) = match Message::parse(frame.bytes(), DEFAULT_MAX_MESSAGE_SIZE) {
        Ok(Message::Msg(m)) => (Some(m.body()), None),
        Ok(Message::Reply(r)) => match r.documents().next() {
            Some(d) => (Some(d), Some(r.cursor_id)),
            None => (None, None),
        },
        _ => (None, None),
    };
    let Some(doc) = doc else {
        assert_eq!(
            facts,
            ReplyFacts {
                error: false,
                code: None,
                cursor: CursorReply::None
            },
            "facts read off a reply that has no document"
        );
        return;
    };
    let error = match doc.get("ok") {
        Ok(Some(RawBsonRef::Double(v))) => v == 0.0,
        Ok(Some(RawBsonRef::Int32(v))) => v == 0,
        Ok(Some(RawBsonRef::Int64(v))) => v == 0,
        Ok(Some(RawBsonRef::Boolean(v))) => !v,
        _ => false,
    };
    assert_eq!(facts.error, error, "ok misread");
    let code = match doc.get("code") {
        Ok(Some(RawBsonRef::Int32(c))) if error => Some(c),
        _ => None,
    };
    assert_eq!(facts.code, code, "code misread");
    let cursor = match legacy_cursor {
        Some(0) => CursorReply::Closed,
        Some(id) => CursorReply::Open(id),
        None => command_cursor(doc),
    };
    assert_eq!(facts.cursor, cursor, "cursor misread");
}

fn command_cursor(doc: &RawDocument) -> CursorReply {
    let Ok(Some(RawBsonRef::Document(c))) = doc.get("cursor") else {
        return CursorReply::None;
    };
    let id = match c.get("id") {
        Ok(Some(RawBsonRef::Int64(i))) => Some(i),
        Ok(Some(RawBsonRef::Int32(i))) => Some(i64::from(i)),
        // Integral doubles below 2^53 (larger ones are not exact).
        Ok(Some(RawBsonRef::Double(d))) if d.fract() == 0.0 && d.abs() < 9.0e15 => Some(d as i64),
        _ => None,
    };
    match id {
        Some(0) => CursorReply::Closed,
        Some(id) => CursorReply::Open(id),
        None => CursorReply::None,
    }
}

fn check_more_to_come(frame: &Frame, req: &Request) {
    let max = DEFAULT_MAX_MESSAGE_SIZE;
    let more = reply_more_to_come(frame, req, max);
    assert_eq!(
        format!("{more:?}"),
        format!("{:?}", reply_more_to_come(frame, req, max)),
        "not deterministic"
    );
    let parsed = Message::parse(frame.bytes(), max);
    match frame.op_code() {
        Some(OpCode::Msg) | Some(OpCode::Reply) => {
            assert_eq!(
                more.is_ok(),
                matches!(parsed, Ok(Message::Msg(_) | Message::Reply(_))),
                "an uncompressed reply accepted iff it parses: {more:?} {parsed:?}"
            );
        }
        Some(OpCode::Compressed) => {}
        _ => assert!(
            more.is_err(),
            "a reply with opcode {:?} accepted",
            frame.op_code()
        ),
    }
    if more.as_ref().is_ok_and(|m| *m) {
        assert!(
            req.exhaust_allowed,
            "moreToCome honoured without exhaustAllowed"
        );
        let inner = match &parsed {
            Ok(Message::Compressed(c)) => c.decompress().ok(),
            _ => Some(frame.clone()),
        };
        let flags = inner
            .as_ref()
            .filter(|f| f.op_code() == Some(OpCode::Msg))
            .and_then(|f| super::le4(f.bytes(), crate::wire::HEADER_LEN))
            .map(u32::from_le_bytes);
        assert!(
            flags.is_some_and(|f| MsgFlags(f).more_to_come()),
            "more to come without an OP_MSG that says so"
        );
    }
}
