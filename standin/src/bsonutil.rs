//! BSON helpers: MongoDB-ish value ordering and equality, sizes, numeric coercions, _id keys.

use std::cmp::Ordering;

use bson::{spec::BinarySubtype, Bson, Document};

/// Canonical type bracket used for ordering (MongoDB's BSON comparison order).
pub(crate) fn type_order(b: &Bson) -> u8 {
    match b {
        Bson::MinKey => 1,
        Bson::Null | Bson::Undefined => 2,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 3,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) => 5,
        Bson::Array(_) => 6,
        Bson::Binary(_) => 7,
        Bson::ObjectId(_) => 8,
        Bson::Boolean(_) => 9,
        Bson::DateTime(_) => 10,
        Bson::Timestamp(_) => 11,
        Bson::RegularExpression(_) => 12,
        Bson::DbPointer(_) => 13,
        Bson::JavaScriptCode(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::MaxKey => 100,
    }
}

/// Any numeric BSON value as f64.
pub(crate) fn as_f64(b: &Bson) -> Option<f64> {
    match b {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        Bson::Decimal128(d) => d.to_string().parse().ok(),
        _ => None,
    }
}

/// Any numeric BSON value as i64 (doubles truncated; must be finite).
pub(crate) fn as_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.is_finite() => Some(*d as i64),
        Bson::Decimal128(_) => as_f64(b).filter(|f| f.is_finite()).map(|f| f as i64),
        _ => None,
    }
}

/// A boolean-ish flag: bool, or a number (non-zero = true). Null/missing = false.
pub(crate) fn truthy(b: &Bson) -> bool {
    match b {
        Bson::Boolean(v) => *v,
        Bson::Null | Bson::Undefined => false,
        other => as_f64(other).map(|f| f != 0.0).unwrap_or(true),
    }
}

fn cmp_numbers(a: &Bson, b: &Bson) -> Ordering {
    match (a, b) {
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            as_i64(a).cmp(&as_i64(b))
        }
        _ => {
            let (x, y) = (as_f64(a).unwrap_or(f64::NAN), as_f64(b).unwrap_or(f64::NAN));
            match (x.is_nan(), y.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Less,
                (false, true) => Ordering::Greater,
                _ => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            }
        }
    }
}

/// Total order over BSON values, following MongoDB's comparison order (best effort).
pub(crate) fn compare(a: &Bson, b: &Bson) -> Ordering {
    let (ta, tb) = (type_order(a), type_order(b));
    if ta != tb {
        return ta.cmp(&tb);
    }
    match (a, b) {
        _ if ta == 3 => cmp_numbers(a, b),
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => x.cmp(y),
        (Bson::Document(x), Bson::Document(y)) => compare_docs(x, y),
        (Bson::Array(x), Bson::Array(y)) => {
            for (p, q) in x.iter().zip(y.iter()) {
                let o = compare(p, q);
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => {
            (x.pattern.as_str(), x.options.as_str()).cmp(&(y.pattern.as_str(), y.options.as_str()))
        }
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.cmp(y),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => x
            .code
            .cmp(&y.code)
            .then_with(|| compare_docs(&x.scope, &y.scope)),
        _ => Ordering::Equal,
    }
}

pub(crate) fn compare_docs(x: &Document, y: &Document) -> Ordering {
    for ((ka, va), (kb, vb)) in x.iter().zip(y.iter()) {
        let o = type_order(va)
            .cmp(&type_order(vb))
            .then_with(|| ka.cmp(kb))
            .then_with(|| compare(va, vb));
        if o != Ordering::Equal {
            return o;
        }
    }
    x.len().cmp(&y.len())
}

/// MongoDB equality: numbers compare by value across types, documents field by field in order.
pub(crate) fn values_equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

fn cstring_size(s: &str) -> usize {
    s.len() + 1
}

fn string_size(s: &str) -> usize {
    4 + s.len() + 1
}

fn digits(mut i: usize) -> usize {
    let mut n = 1;
    while i >= 10 {
        i /= 10;
        n += 1;
    }
    n
}

/// Encoded size of a value (without its element header).
pub(crate) fn bson_size(b: &Bson) -> usize {
    match b {
        Bson::Double(_) | Bson::Int64(_) | Bson::Timestamp(_) | Bson::DateTime(_) => 8,
        Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => string_size(s),
        Bson::Document(d) => doc_size(d),
        Bson::Array(a) => {
            5 + a
                .iter()
                .enumerate()
                .map(|(i, v)| 2 + digits(i) + bson_size(v))
                .sum::<usize>()
        }
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::RegularExpression(r) => {
            cstring_size(r.pattern.as_str()) + cstring_size(r.options.as_str())
        }
        Bson::JavaScriptCodeWithScope(c) => 4 + string_size(&c.code) + doc_size(&c.scope),
        Bson::Int32(_) => 4,
        Bson::Binary(bin) => {
            5 + bin.bytes.len()
                + if bin.subtype == BinarySubtype::BinaryOld {
                    4
                } else {
                    0
                }
        }
        Bson::ObjectId(_) => 12,
        Bson::Decimal128(_) => 16,
        Bson::DbPointer(_) => 64,
    }
}

/// Encoded size of a document.
pub(crate) fn doc_size(d: &Document) -> usize {
    5 + d
        .iter()
        .map(|(k, v)| 2 + k.len() + bson_size(v))
        .sum::<usize>()
}

/// A hashable key identifying an `_id` value (1, 1i64 and 1.0 are the same key).
pub(crate) fn id_key(b: &Bson) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    match b {
        Bson::ObjectId(o) => {
            out.push(b'o');
            out.extend_from_slice(&o.bytes());
        }
        Bson::String(s) => {
            out.push(b's');
            out.extend_from_slice(s.as_bytes());
        }
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            let f = as_f64(b).unwrap_or(f64::NAN);
            match as_i64(b) {
                Some(i) if (i as f64) == f || !matches!(b, Bson::Double(_)) => {
                    out.push(b'n');
                    out.extend_from_slice(&i.to_le_bytes());
                }
                _ => {
                    out.push(b'f');
                    let f = if f == 0.0 { 0.0 } else { f };
                    out.extend_from_slice(&f.to_bits().to_le_bytes());
                }
            }
        }
        other => {
            out.push(type_order(other));
            let mut d = Document::new();
            d.insert("", other.clone());
            if let Ok(bytes) = d.to_vec() {
                out.extend_from_slice(&bytes);
            }
        }
    }
    out
}

/// The lower-cased name of a command (its first key), or "" for an empty document.
pub(crate) fn command_name(doc: &Document) -> String {
    doc.keys()
        .next()
        .map(|k| k.to_ascii_lowercase())
        .unwrap_or_default()
}

/// mongod's name of a value's BSON type (`typeName` in src/mongo/bson/bsontypes.cpp), as
/// its error messages spell it.
pub(crate) fn type_name(b: &Bson) -> &'static str {
    match b {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId};

    #[test]
    fn ordering_and_equality() {
        assert!(values_equal(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(values_equal(&Bson::Int64(5), &Bson::Int32(5)));
        assert_eq!(
            compare(&Bson::Int32(2), &Bson::Double(1.5)),
            Ordering::Greater
        );
        assert_eq!(compare(&Bson::Null, &Bson::Int32(0)), Ordering::Less);
        assert_eq!(
            compare(&Bson::String("a".into()), &Bson::Int32(9)),
            Ordering::Greater
        );
        assert!(values_equal(
            &Bson::Document(doc! {"a": 1, "b": 2.0}),
            &Bson::Document(doc! {"a": 1i64, "b": 2})
        ));
        assert!(!values_equal(
            &Bson::Document(doc! {"a": 1, "b": 2}),
            &Bson::Document(doc! {"b": 2, "a": 1})
        ));
    }

    #[test]
    fn sizes_match_encoder() {
        let d = doc! {
            "a": 1, "b": "xyz", "c": [1, 2.5, "q", {"z": null}], "d": {"e": true},
            "f": ObjectId::new(), "g": bson::DateTime::now(), "h": 7i64,
            "i": bson::Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "j": bson::Regex { pattern: "^a".try_into().unwrap(), options: "i".try_into().unwrap() },
            "k": (0..12).collect::<Vec<i32>>(),
        };
        assert_eq!(doc_size(&d), d.to_vec().unwrap().len());
    }

    #[test]
    fn id_keys() {
        assert_eq!(id_key(&Bson::Int32(1)), id_key(&Bson::Double(1.0)));
        assert_eq!(id_key(&Bson::Int64(1)), id_key(&Bson::Int32(1)));
        assert_ne!(id_key(&Bson::Double(1.5)), id_key(&Bson::Int32(1)));
        assert_ne!(id_key(&Bson::String("1".into())), id_key(&Bson::Int32(1)));
    }
}
