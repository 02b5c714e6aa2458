//! Literal-free query shapes for violation records and plan-guard grouping.
//!
//! A violation record must say which query broke a rule without logging the data in it, and
//! the plan guard must recognise "the same query with other values". Both use the *shape*:
//! the filter as JSON with every literal replaced by its type in angle brackets.
//!
//! ```text
//! {age: {$ne: 42}}                        → {"age": {"$ne": "<int>"}}
//! {$or: [{a: 1}, {b: {$in: [1, 2, 3]}}]}  → {"$or": [{"a": "<int>"}, {"b": {"$in": "<array of 3>"}}]}
//! ```
//!
//! Keys (field names and operators) are kept, JSON-escaped; values never are. Documents are
//! rendered key by key at any level (operator documents and embedded-document literals
//! alike). Arrays collapse to `"<array of N>"`, except the branch lists of `$and` / `$or` /
//! `$nor`, and, inside `$expr`, argument lists holding sub-expressions; those are rendered
//! element by element. Rendering stops below [`SHAPE_DEPTH`] levels (`"<…>"`) and after
//! [`MAX_ITEMS`] keys or elements per container, so a hostile filter cannot blow up a log
//! line. This is the only part of the filter module that allocates: it runs for violations.

use std::fmt::Write as _;

use bson::spec::BinarySubtype;
use bson::{RawArray, RawBsonRef, RawDocument};

/// Nesting depth below which a shape shows `"<…>"` instead of the subtree.
pub const SHAPE_DEPTH: usize = 32;
/// Keys per document / elements per rendered array shown before the rest is summarised.
pub const MAX_ITEMS: usize = 256;

/// The literal-free JSON shape of a filter (or of any document: a sort, a projection).
pub fn shape(filter: &RawDocument) -> String {
    let mut out = String::new();
    shape_into(&mut out, filter);
    out
}

/// Appends the shape of `filter` to `out`, for callers composing a larger record.
pub fn shape_into(out: &mut String, filter: &RawDocument) {
    document(out, filter, 0, false);
}

/// The literal-free shape of one value: `"<int>"`, `"<array of 3>"`, or a document's shape.
pub fn shape_value(value: RawBsonRef<'_>) -> String {
    let mut out = String::new();
    any_value(&mut out, "", value, 0, false);
    out
}

/// A stable 64-bit hash of a shape (FNV-1a), identical across builds, platforms and
/// releases, so shape hashes in old violation records still group with new ones.
pub fn shape_hash(shape: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    shape
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

fn document(out: &mut String, doc: &RawDocument, depth: usize, in_expr: bool) {
    if depth >= SHAPE_DEPTH {
        out.push_str("\"<…>\"");
        return;
    }
    // The fast walk renders what it decides; anything else is rendered again, from where
    // this document started, through the bson crate's iteration (the same text: see
    // `tests::fast_walk_renders_what_the_bson_crate_renders`).
    #[cfg(test)]
    if tests::ITER_ONLY.with(std::cell::Cell::get) {
        document_iter(out, doc, depth, in_expr);
        return;
    }
    let mark = out.len();
    if fast::document(out, doc, depth, in_expr) {
        return;
    }
    out.truncate(mark);
    document_iter(out, doc, depth, in_expr);
}

/// [`document`] through the bson crate's iteration: any document.
fn document_iter(out: &mut String, doc: &RawDocument, depth: usize, in_expr: bool) {
    out.push('{');
    let mut elems = doc.iter_elements();
    let mut n = 0usize;
    while let Some(elem) = elems.next() {
        if n > 0 {
            out.push_str(", ");
        }
        if n == MAX_ITEMS {
            let rest = 1 + elems.count();
            let _ = write!(out, "\"…\": \"<{rest} more keys>\"");
            break;
        }
        n += 1;
        let Ok(elem) = elem else {
            out.push_str("\"…\": \"<malformed>\"");
            break;
        };
        let key = elem.key().as_str();
        json_string(out, key);
        out.push_str(": ");
        match elem.value() {
            Ok(v) => any_value(out, key, v, depth + 1, in_expr || key == "$expr"),
            Err(_) => out.push_str("\"<malformed>\""),
        }
    }
    out.push('}');
}

fn any_value(out: &mut String, key: &str, value: RawBsonRef<'_>, depth: usize, in_expr: bool) {
    match value {
        RawBsonRef::Document(d) => document(out, d, depth, in_expr),
        RawBsonRef::Array(a) if renders_elements(key, a, in_expr) => array(out, a, depth, in_expr),
        RawBsonRef::Array(a) => {
            let _ = write!(out, "\"<array of {}>\"", a.into_iter().count());
        }
        scalar => {
            out.push_str("\"<");
            out.push_str(type_name(scalar));
            out.push_str(">\"");
        }
    }
}

/// Logical branch lists keep their structure; so do expression argument lists that hold
/// sub-expressions. Lists of values (`$in`, `$all`, array literals) collapse.
fn renders_elements(key: &str, a: &RawArray, in_expr: bool) -> bool {
    if matches!(key, "$and" | "$or" | "$nor") {
        return true;
    }
    in_expr
        && a.into_iter()
            .any(|v| matches!(v, Ok(RawBsonRef::Document(_) | RawBsonRef::Array(_))))
}

fn array(out: &mut String, a: &RawArray, depth: usize, in_expr: bool) {
    if depth >= SHAPE_DEPTH {
        out.push_str("\"<…>\"");
        return;
    }
    out.push('[');
    let mut items = a.into_iter();
    let mut n = 0usize;
    while let Some(item) = items.next() {
        if n > 0 {
            out.push_str(", ");
        }
        if n == MAX_ITEMS {
            let rest = 1 + items.count();
            let _ = write!(out, "\"<{rest} more>\"");
            break;
        }
        n += 1;
        match item {
            Ok(v) => any_value(out, "", v, depth + 1, in_expr),
            Err(_) => {
                out.push_str("\"<malformed>\"");
                break;
            }
        }
    }
    out.push(']');
}

/// [`document`] and [`any_value`] over `crate::wire::walk_keyed`, which checks each element as
/// the bson crate's iteration does without building it. Each returns `false` when the walk
/// does not decide what it met (a type it leaves to the bson crate, a value the crate would
/// not build, malformed bytes, more than [`MAX_ITEMS`] items): the caller then throws away
/// what was written and renders the document through the bson crate.
mod fast {
    use super::{json_string, type_name_of_tag, MAX_ITEMS, SHAPE_DEPTH};
    use crate::wire::{value_valid, walk_keyed, walk_values};
    use bson::RawDocument;
    use std::fmt::Write as _;

    pub(super) fn document(
        out: &mut String,
        doc: &RawDocument,
        depth: usize,
        in_expr: bool,
    ) -> bool {
        out.push('{');
        let mut n = 0usize;
        let walked = walk_keyed(doc, |key, tag, value| {
            if n == MAX_ITEMS {
                return Some(());
            }
            if n > 0 {
                out.push_str(", ");
            }
            n += 1;
            let Ok(key) = std::str::from_utf8(key) else {
                return Some(());
            };
            json_string(out, key);
            out.push_str(": ");
            let in_expr = in_expr || key == "$expr";
            (!self::value(out, key, tag, value, depth + 1, in_expr)).then_some(())
        });
        out.push('}');
        matches!(walked, Ok(None))
    }

    /// `super::any_value` of an element of type `tag` and value bytes `value`.
    fn value(
        out: &mut String,
        key: &str,
        tag: u8,
        value: &[u8],
        depth: usize,
        in_expr: bool,
    ) -> bool {
        match tag {
            0x03 => match RawDocument::from_bytes(value) {
                Ok(d) => {
                    super::document(out, d, depth, in_expr);
                    true
                }
                Err(_) => false,
            },
            0x04 => {
                let Ok(items) = RawDocument::from_bytes(value) else {
                    return false;
                };
                // Every item's type, when the walk decides the whole array.
                let (mut count, mut nested) = (0usize, false);
                let walked = walk_values(items, |tag, _| {
                    count += 1;
                    nested |= matches!(tag, 0x03 | 0x04);
                    None::<()>
                });
                if walked.is_err() {
                    return false;
                }
                if matches!(key, "$and" | "$or" | "$nor") || (in_expr && nested) {
                    array(out, items, depth, in_expr)
                } else {
                    let _ = write!(out, "\"<array of {count}>\"");
                    true
                }
            }
            _ if value_valid(tag, value) => match type_name_of_tag(tag) {
                Some(name) => {
                    out.push_str("\"<");
                    out.push_str(name);
                    out.push_str(">\"");
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// `super::array` of an array's bytes (a document whose keys are the indexes).
    fn array(out: &mut String, items: &RawDocument, depth: usize, in_expr: bool) -> bool {
        if depth >= SHAPE_DEPTH {
            out.push_str("\"<…>\"");
            return true;
        }
        out.push('[');
        let mut n = 0usize;
        let walked = walk_values(items, |tag, value| {
            if n == MAX_ITEMS {
                return Some(());
            }
            if n > 0 {
                out.push_str(", ");
            }
            n += 1;
            (!self::value(out, "", tag, value, depth + 1, in_expr)).then_some(())
        });
        out.push(']');
        matches!(walked, Ok(None))
    }
}

/// [`type_name`] of a value of element type `tag` that the bson crate builds, for the types
/// whose name the type alone decides; `None` for the others (binary, regex...).
fn type_name_of_tag(tag: u8) -> Option<&'static str> {
    Some(match tag {
        0x01 => "double",
        0x02 => "string",
        0x06 => "undefined",
        0x07 => "objectId",
        0x08 => "bool",
        0x09 => "date",
        0x0A => "null",
        0x0D => "javascript",
        0x0E => "symbol",
        0x10 | 0x12 => "int",
        0x11 => "timestamp",
        0x13 => "decimal",
        0x7F => "maxKey",
        0xFF => "minKey",
        _ => return None,
    })
}

fn type_name(v: RawBsonRef<'_>) -> &'static str {
    match v {
        RawBsonRef::Int32(_) | RawBsonRef::Int64(_) => "int",
        RawBsonRef::Double(_) => "double",
        RawBsonRef::Decimal128(_) => "decimal",
        RawBsonRef::String(_) => "string",
        RawBsonRef::Boolean(_) => "bool",
        RawBsonRef::Null => "null",
        RawBsonRef::Undefined => "undefined",
        RawBsonRef::ObjectId(_) => "objectId",
        RawBsonRef::DateTime(_) => "date",
        RawBsonRef::RegularExpression(_) => "regex",
        RawBsonRef::Binary(b)
            if matches!(b.subtype, BinarySubtype::Uuid | BinarySubtype::UuidOld) =>
        {
            "uuid"
        }
        RawBsonRef::Binary(_) => "binary",
        RawBsonRef::Timestamp(_) => "timestamp",
        RawBsonRef::MinKey => "minKey",
        RawBsonRef::MaxKey => "maxKey",
        RawBsonRef::JavaScriptCode(_) | RawBsonRef::JavaScriptCodeWithScope(_) => "javascript",
        RawBsonRef::Symbol(_) => "symbol",
        RawBsonRef::DbPointer(_) => "dbPointer",
        RawBsonRef::Document(_) => "document",
        RawBsonRef::Array(_) => "array",
    }
}

/// Writes `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    // Most keys need no escape: written whole.
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(s);
        out.push('"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::filter::test_util::doc;
    use bson::{rawdoc, Binary};

    thread_local! {
        /// Renders through the bson crate's iteration only (the reference of the fast walk).
        pub(super) static ITER_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    fn shape_iter_only(doc: &RawDocument) -> String {
        ITER_ONLY.with(|f| f.set(true));
        let s = shape(doc);
        ITER_ONLY.with(|f| f.set(false));
        s
    }

    /// The fast walk renders exactly the text of the bson crate's iteration on every corrupted
    /// or cut copy of a few filters (of every type it names, arrays rendered and counted,
    /// `$expr`, and types it leaves to the crate).
    #[test]
    fn fast_walk_renders_what_the_bson_crate_renders() {
        let uuid = Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![7; 16],
        };
        let filters = [
            rawdoc! {
                "age": {"$ne": 42}, "name": "bob", "$or": [{"a": 1}, {"b": {"$in": [1, 2, "x"]}}],
                "t": true, "n": bson::RawBson::Null, "d": 1.5, "l": 5i64,
            },
            rawdoc! {
                "$expr": {"$gt": [{"$size": "$a"}, 3], "$eq": ["$b", 1]},
                "oid": bson::oid::ObjectId::from_bytes([7; 12]), "dt": bson::DateTime::from_millis(5),
                "ts": bson::Timestamp { time: 1, increment: 2 }, "dec": bson::Decimal128::from_bytes([0; 16]),
                "ünï": {"x": [[1], {"y": "z"}]}, "$and": [], "mx": bson::RawBson::MaxKey, "mn": bson::RawBson::MinKey,
            },
            rawdoc! {
                "u": uuid, "r": bson::Regex { pattern: "a.*".to_owned().try_into().unwrap(), options: "i".to_owned().try_into().unwrap() },
                "x": {"y": [1, {"z": "s"}]}, "js": bson::RawBson::JavaScriptCode("f()".into()),
                "und": bson::RawBson::Undefined, "sym": bson::RawBson::Symbol("s".into()),
            },
        ];
        let mut checked = 0usize;
        for good in filters {
            checked += crate::wire::each_readable_variant(good.as_bytes(), |bytes, doc| {
                assert_eq!(shape(doc), shape_iter_only(doc), "{bytes:?}");
            });
        }
        assert!(checked > 3_000, "{checked}");
    }

    #[test]
    fn renders_examples_from_the_standards() {
        assert_eq!(
            shape(&doc(r#"{"age": {"$ne": 42}}"#)),
            r#"{"age": {"$ne": "<int>"}}"#
        );
        assert_eq!(shape(&doc(r#"{"name": "bob"}"#)), r#"{"name": "<string>"}"#);
        assert_eq!(
            shape(&doc(r#"{"$or": [{"a": 1}, {"b": {"$in": [1, 2, 3]}}]}"#)),
            r#"{"$or": [{"a": "<int>"}, {"b": {"$in": "<array of 3>"}}]}"#
        );
        assert_eq!(shape(&doc("{}")), "{}");
    }

    #[test]
    fn names_every_type() {
        let uuid = Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![7; 16],
        };
        let bin = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![7; 4],
        };
        let f = doc(
            r#"{"b": true, "c": {"$code": "x"}, "d": 1.5, "hi": {"$maxKey": 1}, "i": 1,
                "l": {"$numberLong": "9"}, "lo": {"$minKey": 1},
                "m": {"$numberDecimal": "1.1"}, "n": null,
                "o": {"$oid": "5f0000000000000000000000"},
                "r": {"$regularExpression": {"options": "", "pattern": "p"}}, "s": "x",
                "t": {"$date": "2020-01-01T00:00:00Z"}, "ts": {"$timestamp": {"i": 2, "t": 1}}}"#,
        );
        assert_eq!(
            shape(&f),
            r#"{"b": "<bool>", "c": "<javascript>", "d": "<double>", "hi": "<maxKey>", "i": "<int>", "l": "<int>", "lo": "<minKey>", "m": "<decimal>", "n": "<null>", "o": "<objectId>", "r": "<regex>", "s": "<string>", "t": "<date>", "ts": "<timestamp>"}"#
        );
        let f = rawdoc! { "u": uuid, "g": bin };
        assert_eq!(shape(&f), r#"{"u": "<uuid>", "g": "<binary>"}"#);
    }

    #[test]
    fn embedded_documents_and_expressions_keep_structure() {
        assert_eq!(
            shape(&doc(r#"{"addr": {"city": "Paris", "zip": 75001}}"#)),
            r#"{"addr": {"city": "<string>", "zip": "<int>"}}"#
        );
        assert_eq!(
            shape(&doc(
                r#"{"$expr": {"$and": [{"$gt": ["$a", 5]}, {"$eq": ["$b", "x"]}]}}"#
            )),
            r#"{"$expr": {"$and": [{"$gt": "<array of 2>"}, {"$eq": "<array of 2>"}]}}"#
        );
        assert_eq!(
            shape(&doc(r#"{"$expr": {"$gt": [{"$size": "$a"}, 3]}}"#)),
            r#"{"$expr": {"$gt": [{"$size": "<string>"}, "<int>"]}}"#
        );
    }

    #[test]
    fn keys_are_json_escaped() {
        let f = rawdoc! { "a\"b\\c\n\u{1}": 1 };
        assert_eq!(shape(&f), r#"{"a\"b\\c\n\u0001": "<int>"}"#);
        let f = rawdoc! { "ünï": 1, "a\u{1f}": 2, "\\": 3, "plain": 4 };
        assert_eq!(
            shape(&f),
            r#"{"ünï": "<int>", "a\u001f": "<int>", "\\": "<int>", "plain": "<int>"}"#
        );
    }

    #[test]
    fn no_literal_ever_appears() {
        let f = doc(
            r#"{"user": "SECRET-alice", "pin": 987654321, "ratio": 3.14159,
                "$or": [{"token": {"$regex": "^SECRET-re", "$options": "i"}},
                        {"tags": {"$in": ["SECRET-tag", 13371337]}}],
                "re": {"$regularExpression": {"pattern": "SECRET-lit", "options": "i"}},
                "$where": "SECRET-js", "$comment": "SECRET-comment",
                "$expr": {"$eq": ["$x", {"$literal": "SECRET-expr"}]},
                "nested": {"deep": {"$elemMatch": {"k": "SECRET-deep"}}}}"#,
        );
        let s = shape(&f);
        for secret in ["SECRET", "987654321", "3.14", "13371337"] {
            assert!(!s.contains(secret), "{secret} leaked into {s}");
        }
        assert!(
            serde_json::from_str::<serde_json::Value>(&s).is_ok(),
            "not JSON: {s}"
        );
    }

    #[test]
    fn depth_and_width_are_capped() {
        let mut f = rawdoc! { "x": 1 };
        for _ in 0..(SHAPE_DEPTH + 10) {
            f = rawdoc! { "a": f };
        }
        let s = shape(&f);
        assert!(s.contains("\"<…>\""));
        assert!(serde_json::from_str::<serde_json::Value>(&s).is_ok());

        let mut wide = bson::RawDocumentBuf::new();
        for i in 0..(MAX_ITEMS + 5) {
            wide.append(
                bson::raw::CString::try_from(format!("k{i}")).unwrap(),
                i as i32,
            );
        }
        let s = shape(&wide);
        assert!(s.ends_with(r#""…": "<5 more keys>"}"#), "{s}");
        assert!(serde_json::from_str::<serde_json::Value>(&s).is_ok());
    }

    #[test]
    fn hash_is_stable_fnv1a() {
        // Reference values of FNV-1a 64.
        assert_eq!(shape_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(shape_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shape_hash("foobar"), 0x8594_4171_f739_67e8);
        let a = shape(&doc(r#"{"age": {"$ne": 1}}"#));
        let b = shape(&doc(r#"{"age": {"$ne": 99}}"#));
        assert_eq!(shape_hash(&a), shape_hash(&b));
        assert_ne!(
            shape_hash(&a),
            shape_hash(&shape(&doc(r#"{"age": {"$ne": "x"}}"#)))
        );
    }
}
