//! Target `hello_rewrite`: an upstream hello reply through the proxy's rewrite.
//!
//! bytes → [`Frame`] → `proxy::hello::rewrite_reply` (the replica-set member fields removed,
//! `msg: "isdbgrid"` added), `proxy::hello::max_wire_version`, and
//! [`ClientMetadata::from_hello`] on the same document.
//!
//! What is asserted, on what the client receives (the rewritten reply, or the original bytes
//! when the rewrite declines):
//! - the document a driver reads (the OP_MSG body, the first OP_REPLY document, after
//!   decompression) carries none of the fields that name members or the set;
//! - a rewritten reply is one valid OP_MSG / OP_REPLY frame answering the same requestID, with
//!   every other field of the original kept in order, `msg` present, OP_MSG flags kept except
//!   the checksum, OP_REPLY flags, cursor id and startingFrom kept; rewriting it again changes
//!   nothing;
//! - a valid uncompressed OP_MSG or OP_REPLY is never refused (the session would close);
//! - `max_wire_version` reads exactly `maxWireVersion` (int32, or int64 in range);
//! - client metadata is bounded and a prefix of what was sent.

use bson::{RawBsonRef, RawDocument};

use crate::{
    proxy::{
        hello::{max_wire_version, rewrite_reply},
        ClientMetadata,
    },
    wire::{Frame, Message, MsgFlags, OpCode, DEFAULT_MAX_MESSAGE_SIZE},
};

/// Every field of a member's hello that names other servers or the set (written out here
/// again, independently of the list in `proxy::hello`).
const MEMBER_FIELDS: [&str; 15] = [
    "hosts",
    "passives",
    "arbiters",
    "setName",
    "setVersion",
    "primary",
    "me",
    "electionId",
    "tags",
    "secondary",
    "arbiterOnly",
    "passive",
    "hidden",
    "lastWrite",
    "isreplicaset",
];

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some(bytes) = super::framed(data) else {
        return;
    };
    let Ok(frame) = Frame::from_bytes(bytes) else {
        return;
    };
    let max = DEFAULT_MAX_MESSAGE_SIZE;
    check_wire_version(&frame);
    let rewritten = rewrite_reply(&frame, max);
    assert_eq!(
        format!("{rewritten:?}"),
        format!("{:?}", rewrite_reply(&frame, max)),
        "the rewrite is not deterministic"
    );
    match rewritten {
        Ok(Some(out)) => check_rewritten(&frame, &out),
        Ok(None) => {
            // The original is forwarded: what the driver reads must already be clean.
            if let Some(inner) = decompressed(&frame) {
                if let Some(doc) = read_by_driver(inner.bytes()) {
                    assert_clean(doc, "a forwarded reply");
                }
            }
        }
        Err(e) => {
            // A hello reply is one document: an OP_REPLY with another count may be refused.
            let valid = match Message::parse(frame.bytes(), max) {
                Ok(Message::Msg(_)) => true,
                Ok(Message::Reply(r)) => r.documents().count() == 1,
                _ => false,
            };
            assert!(!valid, "a valid reply was refused: {e}");
        }
    }
}

fn check_wire_version(frame: &Frame) {
    let got = max_wire_version(frame, DEFAULT_MAX_MESSAGE_SIZE);
    let doc = match Message::parse(frame.bytes(), DEFAULT_MAX_MESSAGE_SIZE) {
        Ok(Message::Msg(m)) => Some(m.body()),
        Ok(Message::Reply(r)) => r.documents().next(),
        _ => None,
    };
    let want = doc.and_then(|d| match d.get("maxWireVersion") {
        Ok(Some(RawBsonRef::Int32(v))) => Some(v),
        Ok(Some(RawBsonRef::Int64(v))) => i32::try_from(v).ok(),
        _ => None,
    });
    assert_eq!(got, want, "maxWireVersion misread");
    if let Some(doc) = doc {
        check_metadata(doc);
    }
}

fn check_metadata(doc: &RawDocument) {
    let Some(meta) = ClientMetadata::from_hello(doc) else {
        assert!(
            !matches!(doc.get("client"), Ok(Some(RawBsonRef::Document(_)))),
            "client metadata ignored"
        );
        return;
    };
    let client = match doc.get("client") {
        Ok(Some(RawBsonRef::Document(c))) => Some(c),
        _ => None,
    };
    assert!(
        client.is_some(),
        "metadata read from a document without client"
    );
    let Some(client) = client else {
        return;
    };
    let sub = |d: &str, k: &str| match client.get(d) {
        Ok(Some(RawBsonRef::Document(x))) => match x.get(k) {
            Ok(Some(RawBsonRef::String(s))) => Some(s),
            _ => None,
        },
        _ => None,
    };
    if let Some(app) = &meta.application {
        assert!(app.len() <= 128, "application name not bounded");
        let sent = sub("application", "name").unwrap_or_default();
        assert!(sent.starts_with(app.as_str()), "application name altered");
    }
    if let Some(driver) = &meta.driver {
        assert!(driver.len() <= 128, "driver not bounded");
        let name = sub("driver", "name").unwrap_or("unknown");
        let sent = match sub("driver", "version") {
            Some(v) => format!("{name} {v}"),
            None => name.to_owned(),
        };
        assert!(sent.starts_with(driver.as_str()), "driver altered");
    }
}

/// The frame as the driver sees it: decompressed when compressed.
fn decompressed(frame: &Frame) -> Option<Frame> {
    match Message::parse(frame.bytes(), DEFAULT_MAX_MESSAGE_SIZE) {
        Ok(Message::Compressed(c)) => c.decompress().ok(),
        Ok(_) => Some(frame.clone()),
        Err(_) => None,
    }
}

/// The document a driver reads off a hello reply.
fn read_by_driver(bytes: &[u8]) -> Option<&RawDocument> {
    match Message::parse(bytes, DEFAULT_MAX_MESSAGE_SIZE).ok()? {
        Message::Msg(m) => Some(m.body()),
        Message::Reply(r) => r.documents().next(),
        _ => None,
    }
}

fn assert_clean(doc: &RawDocument, what: &str) {
    for elem in doc.iter_elements().flatten() {
        let key = elem.key().as_str();
        assert!(!MEMBER_FIELDS.contains(&key), "{what} carries {key:?}");
    }
}

/// An element as the bytes of a one-element document: compares values bit for bit (a NaN
/// equals itself, unlike `RawBsonRef`'s `==`).
fn element_bytes(e: bson::raw::RawElement<'_>) -> Vec<u8> {
    match e.value() {
        Ok(v) => element_bytes_of(e.key(), v),
        Err(_) => Vec::new(),
    }
}

fn element_bytes_of(key: &bson::raw::CStr, value: RawBsonRef<'_>) -> Vec<u8> {
    let mut d = bson::RawDocumentBuf::new();
    d.append(key, value);
    d.into_bytes()
}

// Long because it is the list of the target's assertions about one rewrite, in the order the
// fuzz README gives them; split, the list would be harder to check against it.
fn check_rewritten(original: &Frame, out: &[u8]) {
    let before = decompressed(original);
    assert!(before.is_some(), "rewrote a reply that does not decompress");
    let Some(before) = before else {
        return;
    };
    let out_frame = Frame::from_bytes(bytes::Bytes::copy_from_slice(out));
    assert!(out_frame.is_ok(), "the rewritten reply is not one frame");
    let (bh, ah) = (before.header(), crate::wire::Header::parse(out));
    assert_eq!(
        ah.map(|h| (h.request_id, h.response_to)),
        Some((bh.request_id, bh.response_to)),
        "the rewritten reply answers another request"
    );
    let old = Message::parse(before.bytes(), DEFAULT_MAX_MESSAGE_SIZE);
    let new = Message::parse(out, DEFAULT_MAX_MESSAGE_SIZE);
    let same_opcode = matches!(
        (&old, &new),
        (Ok(Message::Msg(_)), Ok(Message::Msg(_))) | (Ok(Message::Reply(_)), Ok(Message::Reply(_)))
    );
    assert!(
        same_opcode,
        "the rewritten reply is not a valid reply of the same opcode: {:?} -> {:?}",
        old.as_ref().map(Message::op_code),
        new.as_ref().map(Message::op_code)
    );
    let (old_doc, new_doc) = match (&old, &new) {
        (Ok(Message::Msg(a)), Ok(Message::Msg(b))) => {
            let keep = a.flags().0 & !MsgFlags::CHECKSUM_PRESENT;
            assert_eq!(b.flags().0, keep, "OP_MSG flags changed");
            assert!(b.checksum().is_none());
            assert_eq!(b.sequences().count(), 0);
            (a.body(), b.body())
        }
        (Ok(Message::Reply(a)), Ok(Message::Reply(b))) => {
            assert_eq!(
                (a.response_flags, a.cursor_id, a.starting_from),
                (b.response_flags, b.cursor_id, b.starting_from),
                "OP_REPLY header fields changed"
            );
            assert_eq!(b.number_returned, 1);
            let docs = (a.documents().next(), b.documents().next());
            assert!(
                docs.0.is_some() && docs.1.is_some(),
                "OP_REPLY without a document"
            );
            let (Some(x), Some(y)) = docs else {
                return;
            };
            (x, y)
        }
        _ => return,
    };
    assert_clean(new_doc, "the rewritten reply");
    // Every other field kept, in order, with its value; `msg` added when absent.
    let kept: Vec<_> = old_doc
        .iter_elements()
        .flatten()
        .filter(|e| !MEMBER_FIELDS.contains(&e.key().as_str()))
        .map(element_bytes)
        .collect();
    let had_msg = old_doc
        .iter_elements()
        .flatten()
        .any(|e| e.key().as_str() == "msg");
    let mut now: Vec<_> = new_doc
        .iter_elements()
        .flatten()
        .map(element_bytes)
        .collect();
    if !had_msg {
        let last = now.pop();
        let want = element_bytes_of(bson::cstr!("msg"), RawBsonRef::String("isdbgrid"));
        assert_eq!(last, Some(want), "msg: isdbgrid not added");
    }
    assert_eq!(kept, now, "fields other than the member fields changed");
    // Idempotent.
    let again = Frame::from_bytes(bytes::Bytes::copy_from_slice(out))
        .map(|f| rewrite_reply(&f, DEFAULT_MAX_MESSAGE_SIZE).map(|r| r.is_none()));
    assert!(
        matches!(again, Ok(Ok(true))),
        "rewriting the rewritten reply changed it"
    );
    assert!(before.op_code() != Some(OpCode::Compressed));
}

#[cfg(test)]
mod tests {
    use bson::rawdoc;

    use crate::wire::{
        builder::{encode_msg_reply, encode_reply},
        Frame,
    };

    /// The oracle sees a member field in what a driver reads.
    #[test]
    #[should_panic(expected = "carries \"setName\"")]
    fn a_member_field_is_caught() {
        super::assert_clean(&rawdoc! {"ok": 1, "setName": "rs0"}, "a reply");
    }

    /// A member's reply is rewritten and the rewrite passes every check; the same checks
    /// refuse the original as if it had been forwarded.
    #[test]
    fn a_member_reply_passes_rewritten_and_fails_as_forwarded() {
        let doc = rawdoc! {"isWritablePrimary": true, "hosts": ["a:1"], "me": "a:1", "ok": 1.0};
        let bytes = encode_msg_reply(1, 2, &doc);
        super::run(&bytes);
        let frame = Frame::from_bytes(bytes).unwrap();
        let forwarded = std::panic::catch_unwind(|| {
            super::assert_clean(super::read_by_driver(frame.bytes()).unwrap(), "forwarded")
        });
        assert!(forwarded.is_err());
        super::run(&encode_reply(1, 2, 0, 0, 0, &[&doc]));
    }
}
