//! Helpers shared by the fuzz targets: walk a parsed message through every accessor, and
//! assert what a successful parse promises (the views account for every payload byte).
//! A panic here is a finding, so the assertions are the oracle, not just the parsers' own.

#![forbid(unsafe_code)]

use bson::{RawBsonRef, RawDocument};
use mongoguard::wire::{check_duplicate_keys, first_key, Frame, Message, HEADER_LEN};

/// Nesting beyond this is not descended into: deeper levels add no new code paths.
const MAX_DEPTH: usize = 256;

/// Walks a document and everything nested in it (documents, arrays, code-with-scope).
pub fn walk_doc(doc: &RawDocument, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let _ = check_duplicate_keys(doc);
    let _ = first_key(doc);
    for item in doc {
        match item {
            Ok((key, value)) => {
                std::hint::black_box(key.as_str());
                walk_value(value, depth + 1);
            }
            Err(_) => break,
        }
    }
}

fn walk_value(value: RawBsonRef<'_>, depth: usize) {
    match value {
        RawBsonRef::Document(d) => walk_doc(d, depth),
        RawBsonRef::Array(a) => {
            if depth > MAX_DEPTH {
                return;
            }
            for item in a {
                match item {
                    Ok(v) => walk_value(v, depth + 1),
                    Err(_) => break,
                }
            }
        }
        RawBsonRef::JavaScriptCodeWithScope(js) => walk_doc(js.scope, depth),
        other => {
            std::hint::black_box(format!("{other:?}"));
        }
    }
}

/// Walks every accessor of a parsed message. `message` is the whole frame it came from.
pub fn walk_message(message: &[u8], m: &Message<'_>, max_message_size: usize, depth: usize) {
    std::hint::black_box((m.op_code(), m.expects_reply(), format!("{m:?}")));
    let payload = message.len().saturating_sub(HEADER_LEN);
    match m {
        Message::Msg(msg) => {
            walk_doc(msg.body(), 0);
            let mut covered = 4 + 1 + msg.body().as_bytes().len();
            for seq in msg.sequences() {
                covered += 1 + 4 + seq.identifier().len() + 1;
                for d in seq.documents() {
                    covered += d.as_bytes().len();
                    walk_doc(d, 0);
                }
                assert!(msg.sequence(seq.identifier()).is_some());
            }
            if msg.checksum().is_some() {
                covered += 4;
            }
            assert_eq!(msg.checksum().is_some(), msg.flags().checksum_present());
            assert_eq!(covered, payload, "OP_MSG views do not cover the payload");
        }
        Message::Query(q) => {
            walk_doc(q.query, 0);
            if let Some(f) = q.return_fields_selector {
                walk_doc(f, 0);
            }
            walk_doc(q.command(), 0);
            std::hint::black_box((q.database(), q.collection(), q.is_command()));
        }
        Message::Reply(r) => {
            let mut count = 0i64;
            let mut covered = 20;
            for d in r.documents() {
                covered += d.as_bytes().len();
                count += 1;
                walk_doc(d, 0);
            }
            assert_eq!(count, i64::from(r.number_returned));
            assert_eq!(covered, payload, "OP_REPLY views do not cover the payload");
        }
        Message::Insert(i) => {
            let mut covered = 4 + i.full_collection_name.len() + 1;
            for d in i.documents() {
                covered += d.as_bytes().len();
                walk_doc(d, 0);
            }
            assert_eq!(covered, payload, "OP_INSERT views do not cover the payload");
        }
        Message::Update(u) => {
            walk_doc(u.selector, 0);
            walk_doc(u.update, 0);
            std::hint::black_box((u.is_multi(), u.is_upsert()));
        }
        Message::Delete(d) => {
            walk_doc(d.selector, 0);
            std::hint::black_box(d.is_single_remove());
        }
        Message::GetMore(g) => {
            std::hint::black_box((g.full_collection_name, g.number_to_return, g.cursor_id));
        }
        Message::KillCursors(k) => {
            assert_eq!(8 + 8 * k.cursor_ids().count(), payload);
        }
        Message::Compressed(c) => {
            if let Ok(frame) = c.decompress() {
                assert_eq!(frame.len(), c.uncompressed_size + HEADER_LEN);
                assert_eq!(frame.op_code(), Some(c.original_op_code));
                if depth < 2 {
                    walk_frame(&frame, max_message_size, depth + 1);
                }
            }
        }
    }
}

/// Parses a frame as any message and walks it.
pub fn walk_frame(frame: &Frame, max_message_size: usize, depth: usize) {
    std::hint::black_box((frame.header(), frame.op_code(), format!("{frame:?}")));
    assert_eq!(frame.len(), frame.payload().len() + HEADER_LEN);
    if let Ok(m) = Message::parse(frame.bytes(), max_message_size) {
        walk_message(frame.bytes(), &m, max_message_size, depth);
    }
}
