//! `[proxy] request_time_limit`: a read that runs longer is stopped by the server itself.
//!
//! mongoguard injects `maxTimeMS` (or lowers the client's) into the reads that accept it —
//! `find`, `aggregate` without `$out` / `$merge`, `count`, `distinct` — so mongod interrupts the
//! operation at the limit and answers MaxTimeMSExpired (50) itself: the work stops on the
//! server, and drivers do not retry that code (unlike the network error `reply_timeout`
//! causes by closing the connection, which makes a driver run the read a second time).
//! `maxTimeMS` is a generic argument of every command (src/mongo/idl/generic_argument.idl);
//! it is left alone on writes (an interrupted multi-document write is partly applied), on
//! `getMore` (mongod accepts it only on awaitData cursors), inside transactions (the
//! transaction's own limits apply) and on messages with document sequences. A rewritten
//! request is sent uncompressed (mongod accepts an uncompressed message on a connection that
//! negotiated compression, and answers it uncompressed) and without a checksum.

use std::time::Duration;

use bson::{RawBsonRef, RawDocument, RawDocumentBuf};

use crate::wire::{builder::MsgBuilder, Frame, Message, MsgFlags};

/// The request to send instead of the client's, with `maxTimeMS` set to at most `limit`; or
/// `None` when the request is sent as it came (no limit, not an eligible read, or the
/// client's own `maxTimeMS` is already within the limit).
pub(crate) fn apply(
    frame: &Frame,
    inner: Option<&Frame>,
    limit: Duration,
    max_message_size: usize,
) -> Option<Frame> {
    if limit.is_zero() {
        return None;
    }
    let limit_ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX).max(1);
    let logical = inner.unwrap_or(frame);
    let Ok(Message::Msg(msg)) = Message::parse(logical.bytes(), max_message_size) else {
        return None;
    };
    if msg.sequences().next().is_some() {
        return None;
    }
    let body = msg.body();
    if !eligible(body) || within(body, limit_ms) {
        return None;
    }
    let mut out = RawDocumentBuf::new();
    for (key, value) in body.iter().flatten() {
        if key.as_str() != "maxTimeMS" {
            out.append(key, value);
        }
    }
    out.append(bson::cstr!("maxTimeMS"), limit_ms);
    let flags = msg.flags().0 & !MsgFlags::CHECKSUM_PRESENT;
    let bytes = MsgBuilder::new(out)
        .flags(flags)
        .encode(logical.header().request_id, 0);
    Frame::from_bytes(bytes).ok()
}

/// A read that accepts `maxTimeMS` and is not part of a transaction.
fn eligible(body: &RawDocument) -> bool {
    if matches!(body.get("autocommit"), Ok(Some(_))) {
        return false;
    }
    match crate::wire::first_key(body) {
        Some("find" | "count" | "distinct") => true,
        Some("aggregate") => !writes(body),
        _ => false,
    }
}

/// An aggregation with `$out` or `$merge` (a write: left alone).
fn writes(body: &RawDocument) -> bool {
    let Ok(Some(RawBsonRef::Array(pipeline))) = body.get("pipeline") else {
        return true;
    };
    pipeline.into_iter().flatten().any(|stage| match stage {
        RawBsonRef::Document(d) => matches!(crate::wire::first_key(d), Some("$out" | "$merge")),
        _ => true,
    })
}

/// True when the request is to be sent as it came: the client's own `maxTimeMS` is already
/// within the limit (a positive whole number no larger than it), or is a value mongod refuses
/// (negative, fractional, not a number) — mongod's own error is then the answer, rather than
/// mongoguard quietly turning an invalid request into a valid one. Absent or `0` (no limit):
/// the limit is applied.
fn within(body: &RawDocument, limit_ms: i64) -> bool {
    let ms = match body.get("maxTimeMS") {
        Ok(None) => return false,
        Ok(Some(RawBsonRef::Int32(n))) => i64::from(n),
        Ok(Some(RawBsonRef::Int64(n))) => n,
        Ok(Some(RawBsonRef::Double(d))) if d.fract() == 0.0 && d.is_finite() => d as i64,
        _ => return true,
    };
    ms < 0 || (ms > 0 && ms <= limit_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    fn frame(body: RawDocumentBuf, flags: u32) -> Frame {
        Frame::from_bytes(MsgBuilder::new(body).flags(flags).encode(42, 0)).unwrap()
    }

    fn body_of(f: &Frame) -> RawDocumentBuf {
        match Message::parse(f.bytes(), 1 << 24).unwrap() {
            Message::Msg(m) => m.body().to_owned(),
            _ => panic!("not OP_MSG"),
        }
    }

    const LIMIT: Duration = Duration::from_millis(1500);

    #[test]
    fn reads_get_the_limit_and_keep_everything_else() {
        let f = frame(rawdoc! {"find": "t", "filter": {"a": 1}, "$db": "x"}, 0);
        let out = apply(&f, None, LIMIT, 1 << 24).expect("rewritten");
        assert_eq!(out.header().request_id, 42);
        let b = body_of(&out);
        assert_eq!(crate::wire::first_key(&b), Some("find"));
        assert_eq!(b.get_i64("maxTimeMS").unwrap(), 1500);
        assert_eq!(b.get_str("$db").unwrap(), "x");
        assert_eq!(b.get_document("filter").unwrap().get_i32("a").unwrap(), 1);
        // A larger or zero (= unlimited) client limit is lowered; a smaller one is kept.
        for (given, rewritten) in [(5000, true), (0, true), (200, false)] {
            let f = frame(rawdoc! {"count": "t", "maxTimeMS": given, "$db": "x"}, 0);
            let out = apply(&f, None, LIMIT, 1 << 24);
            assert_eq!(out.is_some(), rewritten, "{given}");
            if let Some(out) = out {
                let b = body_of(&out);
                assert_eq!(b.get_i64("maxTimeMS").unwrap(), 1500);
                let n = b
                    .iter()
                    .filter(|e| e.as_ref().unwrap().0.as_str() == "maxTimeMS");
                assert_eq!(n.count(), 1);
            }
        }
    }

    #[test]
    fn writes_transactions_getmore_and_off_are_left_alone() {
        for body in [
            rawdoc! {"update": "t", "updates": [], "$db": "x"},
            rawdoc! {"getMore": 5_i64, "collection": "t", "$db": "x"},
            rawdoc! {"find": "t", "autocommit": false, "txnNumber": 1_i64, "$db": "x"},
            rawdoc! {"aggregate": "t", "pipeline": [{"$match": {}}, {"$out": "u"}], "cursor": {}, "$db": "x"},
            rawdoc! {"aggregate": "t", "pipeline": [{"$merge": {"into": "u"}}], "cursor": {}, "$db": "x"},
        ] {
            assert!(
                apply(&frame(body.clone(), 0), None, LIMIT, 1 << 24).is_none(),
                "{body:?}"
            );
        }
        let f = frame(rawdoc! {"find": "t", "$db": "x"}, 0);
        assert!(apply(&f, None, Duration::ZERO, 1 << 24).is_none());
        let agg = frame(
            rawdoc! {"aggregate": "t", "pipeline": [{"$match": {}}], "cursor": {}, "$db": "x"},
            0,
        );
        assert!(apply(&agg, None, LIMIT, 1 << 24).is_some());
    }

    /// Strict as mongod: an invalid `maxTimeMS` reaches the server as written (and is
    /// refused there), never replaced by a valid one.
    #[test]
    fn invalid_client_values_are_left_for_the_server_to_refuse() {
        for bad in [
            bson::Bson::Int32(-5),
            bson::Bson::Double(1.5),
            bson::Bson::String("10".into()),
        ] {
            let mut body = rawdoc! {"find": "t", "$db": "x"};
            body.append(
                bson::cstr!("maxTimeMS"),
                bson::RawBson::try_from(bad.clone()).unwrap(),
            );
            assert!(
                apply(&frame(body, 0), None, LIMIT, 1 << 24).is_none(),
                "{bad:?}"
            );
        }
        let whole = rawdoc! {"find": "t", "maxTimeMS": 9000.0, "$db": "x"};
        assert!(apply(&frame(whole, 0), None, LIMIT, 1 << 24).is_some());
    }

    #[test]
    fn a_checksummed_request_is_resent_without_the_checksum() {
        let f = Frame::from_bytes(
            MsgBuilder::new(rawdoc! {"find": "t", "$db": "x"})
                .checksum(true)
                .encode(7, 0),
        )
        .unwrap();
        let out = apply(&f, None, LIMIT, 1 << 24).unwrap();
        match Message::parse(out.bytes(), 1 << 24).unwrap() {
            Message::Msg(m) => assert_eq!(m.flags().0 & MsgFlags::CHECKSUM_PRESENT, 0),
            _ => panic!(),
        }
    }
}
