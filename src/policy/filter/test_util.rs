//! Test helpers: filters written as MongoDB Extended JSON v2.
//!
//! bson's own Extended JSON parser (`TryFrom<serde_json::Value> for Bson`) needs both the
//! `serde` and `serde_json-1` features of bson; the lib enables only the latter, so this
//! converter covers the subset the tests use (canonical and relaxed): `$oid`, `$numberInt`,
//! `$numberLong`, `$numberDouble`, `$numberDecimal`, `$date`, `$regularExpression`,
//! `$timestamp`, `$code` (with `$scope`), `$symbol`, `$minKey`, `$maxKey`, `$undefined`.
//! serde_json sorts object keys unless its `preserve_order` feature is on (feature
//! unification may turn it on), so tests that depend on key order write keys sorted or use
//! `rawdoc!`.

use bson::oid::ObjectId;
use bson::raw::CString;
use bson::{
    Bson, DateTime, Decimal128, Document, JavaScriptCodeWithScope, RawDocumentBuf, Regex, Timestamp,
};
use serde_json::{Map, Value};

/// Parses an Extended JSON document into a raw document; panics on bad test input.
pub(super) fn doc(json: &str) -> RawDocumentBuf {
    let value: Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("bad JSON {json}: {e}"));
    let Value::Object(map) = value else {
        panic!("not a JSON object: {json}");
    };
    RawDocumentBuf::try_from(&document(map)).expect("encodable document")
}

fn document(map: Map<String, Value>) -> Document {
    map.into_iter().map(|(k, v)| (k, bson(v))).collect()
}

fn bson(v: Value) -> Bson {
    match v {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i32::try_from(i).map_or(Bson::Int64(i), Bson::Int32),
            None => Bson::Double(n.as_f64().expect("a JSON number")),
        },
        Value::String(s) => Bson::String(s),
        Value::Array(a) => Bson::Array(a.into_iter().map(bson).collect()),
        Value::Object(m) => special(&m).unwrap_or_else(|| Bson::Document(document(m))),
    }
}

fn text(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

/// The Extended JSON wrappers: `{"$oid": "..."}` and friends.
fn special(m: &Map<String, Value>) -> Option<Bson> {
    let mut keys = m.keys();
    let (first, second) = (keys.next()?.as_str(), keys.next().map(String::as_str));
    let v = &m[first];
    Some(match (first, second) {
        ("$code", Some("$scope")) => {
            let Value::Object(scope) = m["$scope"].clone() else {
                panic!("bad $scope")
            };
            Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope {
                code: text(v).to_owned(),
                scope: document(scope),
            })
        }
        (_, Some(_)) => return None,
        ("$oid", _) => Bson::ObjectId(ObjectId::parse_str(text(v)).expect("$oid")),
        ("$numberInt", _) => Bson::Int32(text(v).parse().expect("$numberInt")),
        ("$numberLong", _) => Bson::Int64(text(v).parse().expect("$numberLong")),
        ("$numberDouble", _) => Bson::Double(text(v).parse().expect("$numberDouble")),
        ("$numberDecimal", _) => {
            Bson::Decimal128(text(v).parse::<Decimal128>().expect("$numberDecimal"))
        }
        ("$date", _) => Bson::DateTime(match v {
            Value::String(s) => DateTime::parse_rfc3339_str(s).expect("$date"),
            Value::Number(n) => DateTime::from_millis(n.as_i64().expect("$date millis")),
            other => match bson(other.clone()) {
                Bson::Int64(ms) => DateTime::from_millis(ms),
                _ => panic!("bad $date {other}"),
            },
        }),
        ("$regularExpression", _) => Bson::RegularExpression(Regex {
            pattern: CString::try_from(text(&v["pattern"])).expect("pattern"),
            options: CString::try_from(text(&v["options"])).expect("options"),
        }),
        ("$timestamp", _) => Bson::Timestamp(Timestamp {
            time: v["t"]
                .as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .expect("$timestamp.t"),
            increment: v["i"]
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .expect("$timestamp.i"),
        }),
        ("$code", _) => Bson::JavaScriptCode(text(v).to_owned()),
        ("$symbol", _) => Bson::Symbol(text(v).to_owned()),
        ("$minKey", _) => Bson::MinKey,
        ("$maxKey", _) => Bson::MaxKey,
        ("$undefined", _) => Bson::Undefined,
        _ => return None,
    })
}

#[test]
fn parses_the_extended_json_subset() {
    let d = doc(
        r#"{"o": {"$oid": "5f0000000000000000000000"}, "l": {"$numberLong": "5"},
            "n": {"$numberDouble": "NaN"}, "t": {"$date": {"$numberLong": "1"}},
            "c": {"$code": "x", "$scope": {"a": 1}}, "e": {"$gt": 1}}"#,
    );
    assert!(matches!(
        d.get("o"),
        Ok(Some(bson::RawBsonRef::ObjectId(_)))
    ));
    assert!(matches!(d.get("l"), Ok(Some(bson::RawBsonRef::Int64(5)))));
    assert!(matches!(d.get("n"), Ok(Some(bson::RawBsonRef::Double(f))) if f.is_nan()));
    assert!(matches!(
        d.get("t"),
        Ok(Some(bson::RawBsonRef::DateTime(_)))
    ));
    assert!(matches!(
        d.get("c"),
        Ok(Some(bson::RawBsonRef::JavaScriptCodeWithScope(_)))
    ));
    assert!(matches!(
        d.get("e"),
        Ok(Some(bson::RawBsonRef::Document(_)))
    ));
}
