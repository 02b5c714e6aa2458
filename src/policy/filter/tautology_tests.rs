//! Unit tests of the "matches every document" detector, each case both ways.

use super::tautology::{coverage, Coverage};
use super::test_util::doc;
use super::MAX_DEPTH;
use bson::{rawdoc, RawBson, RawDocumentBuf, RawJavaScriptCodeWithScope, Regex};
use Coverage::{All, Conditioned, Unknown};

fn cov(json: &str) -> Coverage {
    coverage(&doc(json))
}

fn check(cases: &[(&str, Coverage)]) {
    for (json, want) in cases {
        assert_eq!(cov(json), *want, "{json}");
    }
}

#[test]
fn empty_filter_and_comment_only() {
    check(&[
        ("{}", All),
        (r#"{"$comment": "nightly purge"}"#, All),
        (r#"{"$comment": "x", "a": 1}"#, Conditioned),
    ]);
}

#[test]
fn id_exists_is_all_other_fields_are_not() {
    check(&[
        (r#"{"_id": {"$exists": true}}"#, All),
        (r#"{"_id": {"$exists": 1}}"#, All),
        (r#"{"_id": {"$exists": "yes"}}"#, All),
        (r#"{"a": {"$exists": true}}"#, Conditioned),
        (r#"{"_id": {"$exists": false}}"#, Conditioned),
        (r#"{"_id.x": {"$exists": true}}"#, Conditioned),
        (r#"{"_id": {"$not": {"$exists": false}}}"#, All),
        (r#"{"_id": {"$exists": true, "$nin": []}}"#, All),
        (r#"{"_id": {"$exists": true, "$gt": 5}}"#, Conditioned),
        (
            r#"{"a": {"$exists": true}, "$or": [{"$expr": true}]}"#,
            Conditioned,
        ),
    ]);
}

#[test]
fn expr_of_constants() {
    check(&[
        (r#"{"$expr": true}"#, All),
        (r#"{"$expr": 1}"#, All),
        (r#"{"$expr": -2.5}"#, All),
        (r#"{"$expr": "x"}"#, All),
        (r#"{"$expr": ""}"#, All),
        (r#"{"$expr": {"$literal": true}}"#, All),
        (r#"{"$expr": {"$literal": "$a"}}"#, All),
        (r#"{"$expr": {"$and": [true, 1, {"$literal": "x"}]}}"#, All),
        (r#"{"$expr": {"$or": [false, {"$not": [false]}]}}"#, All),
        (r#"{"$expr": {"$not": 0}}"#, All),
        (r#"{"$expr": {"$numberDecimal": "2"}}"#, All),
        (r#"{"$expr": false}"#, Conditioned),
        (r#"{"$expr": 0}"#, Conditioned),
        (r#"{"$expr": 0.0}"#, Conditioned),
        (r#"{"$expr": null}"#, Conditioned),
        (r#"{"$expr": {"$numberDecimal": "0"}}"#, Conditioned),
        (r#"{"$expr": {"$literal": false}}"#, Conditioned),
        (r#"{"$expr": {"$and": [true, false]}}"#, Conditioned),
        (r#"{"$expr": "$a"}"#, Unknown),
        (r#"{"$expr": {"$eq": ["$a", 1]}}"#, Unknown),
        (r#"{"$expr": {"$and": [true, "$a"]}}"#, Unknown),
        (r#"{"$expr": {"$numberDouble": "NaN"}}"#, Unknown),
        (r#"{"$expr": [true]}"#, All),
        (r#"{"$expr": [false]}"#, All),
        (r#"{"$expr": ["$a"]}"#, Unknown),
        (r#"{"$expr": {"$literal": true, "$eq": [1, 1]}}"#, Unknown),
    ]);
}

#[test]
fn or_and_nor() {
    check(&[
        (r#"{"$or": [{"a": 1}, {}]}"#, All),
        (r#"{"$or": [{"a": 1}, {"$expr": true}]}"#, All),
        (r#"{"$or": [{"a": 1}, {"b": 1}]}"#, Conditioned),
        (r#"{"$and": [{}, {}]}"#, All),
        (r#"{"$and": [{}, {"a": 1}]}"#, Conditioned),
        (r#"{"$and": [{"$or": [{"$expr": true}, {"a": 1}]}]}"#, All),
        (
            r#"{"$or": [{"$and": [{"_id": {"$exists": true}}, {}]}, {"x": 2}]}"#,
            All,
        ),
        (r#"{"$nor": [{"a": 1}]}"#, Conditioned),
        (r#"{"$nor": [{"$expr": false}, {"a": {"$in": []}}]}"#, All),
        (r#"{"$nor": [{}]}"#, Conditioned),
        // Both branches leave something out, yet together they cover everything: not
        // provable here, so unknown rather than wrongly "conditioned".
        (
            r#"{"$or": [{"a": {"$exists": true}}, {"a": {"$exists": false}}]}"#,
            Unknown,
        ),
        (r#"{"$or": []}"#, Unknown),
        (r#"{"$and": []}"#, Unknown),
        (r#"{"$nor": []}"#, Unknown),
        (r#"{"$or": {"a": 1}}"#, Unknown),
        (r#"{"$or": [1, 2]}"#, Unknown),
        (r#"{"$and": [{}, "x"]}"#, Unknown),
    ]);
}

#[test]
fn field_operators() {
    check(&[
        (r#"{"a": {"$nin": []}}"#, All),
        (r#"{"a": {"$not": {"$in": []}}}"#, All),
        (r#"{"a": {"$not": {"$all": []}}}"#, All),
        (r#"{"a": {"$not": {"$nin": []}}}"#, Conditioned),
        (r#"{"a": {"$nin": [1]}}"#, Conditioned),
        (r#"{"a": {"$in": []}}"#, Conditioned),
        (r#"{"a": {"$ne": null}}"#, Conditioned),
        (r#"{"a": {"$ne": 1}}"#, Conditioned),
        (r#"{"a": null}"#, Conditioned),
        (r#"{"a": {"$exists": false}}"#, Conditioned),
        (r#"{"a": {"$exists": true, "$nin": []}}"#, Conditioned),
        (r#"{"a": {"$gt": 5}}"#, Conditioned),
        (r#"{"a": {"$regex": "^x", "$options": "i"}}"#, Conditioned),
        (r#"{"a": {"$not": {"$gt": 5, "$lt": 3}}}"#, Unknown),
        (r#"{"a": {"$foo": 1}}"#, Unknown),
        (r#"{"a": {"$options": "i"}}"#, Unknown),
        (r#"{"a": {"$not": {}}}"#, Unknown),
        (r#"{"a": {"$not": 5}}"#, Unknown),
        (r#"{"a": {"$in": 5}}"#, Unknown),
        (r#"{"a": {"$undefined": true}}"#, Unknown),
    ]);
}

#[test]
fn min_and_max_key_only_on_id() {
    check(&[
        (r#"{"_id": {"$gte": {"$minKey": 1}}}"#, All),
        (r#"{"_id": {"$lte": {"$maxKey": 1}}}"#, All),
        (r#"{"_id": {"$gt": {"$minKey": 1}}}"#, Conditioned),
        (r#"{"_id": {"$lt": {"$minKey": 1}}}"#, Conditioned),
        (r#"{"_id": {"$not": {"$lt": {"$minKey": 1}}}}"#, All),
        (r#"{"a": {"$gte": {"$minKey": 1}}}"#, Unknown),
        (r#"{"a": {"$lte": {"$maxKey": 1}}}"#, Unknown),
    ]);
}

#[test]
fn dotted_paths_are_all_only_for_value_independent_operators() {
    check(&[
        (r#"{"a.b": {"$nin": []}}"#, All),
        (r#"{"a.b": {"$not": {"$in": []}}}"#, All),
        (r#"{"a.b": {"$not": {"$all": []}}}"#, All),
        (r#"{"a.b.c": {"$nin": [], "$not": {"$in": []}}}"#, All),
        (r#"{"_id.x": {"$nin": []}}"#, All),
        (r#"{"a.b": {"$nin": []}, "c": 1}"#, Conditioned),
        (r#"{"a.b": {"$in": []}}"#, Conditioned),
        (r#"{"a.b": {"$not": {"$nin": []}}}"#, Conditioned),
        (r#"{"a.b": 1}"#, Conditioned),
        (r#"{"$or": [{"x": 1}, {"a.b": {"$nin": []}}]}"#, All),
        // Depends on the value (or on array traversal): stays conservative.
        (
            r#"{"a.b": {"$not": {"$exists": false, "$in": [1]}}}"#,
            Unknown,
        ),
        (r#"{"a.b": {"$nin": [], "$exists": true}}"#, Conditioned),
        (r#"{"a.b": {"$nin": [1]}}"#, Conditioned),
    ]);
}

/// Regression: `{"a.b": {$nin: []}}` matches every document, yet was `Unknown`, so a
/// multi-delete with it slipped past W003.
#[test]
fn dotted_nin_empty_is_all_regression() {
    assert_eq!(cov(r#"{"a.b": {"$nin": []}}"#), All);
}

#[test]
fn where_bodies() {
    check(&[
        (r#"{"$where": "true"}"#, All),
        (r#"{"$where": "return true"}"#, All),
        (r#"{"$where": "return true;"}"#, All),
        (r#"{"$where": "function() { return true; }"}"#, All),
        (r#"{"$where": {"$code": "return true"}}"#, All),
        (r#"{"$where": "return false"}"#, Conditioned),
        (r#"{"$where": "this.a == 1"}"#, Unknown),
        (r#"{"$where": "return\ntrue"}"#, Unknown),
        (r#"{"$where": true}"#, Unknown),
    ]);
    let with_scope = RawJavaScriptCodeWithScope {
        code: "return true".into(),
        scope: RawDocumentBuf::new(),
    };
    assert_eq!(coverage(&rawdoc! { "$where": with_scope }), All);
}

#[test]
fn other_top_level_operators() {
    check(&[
        (r#"{"$alwaysTrue": 1}"#, All),
        (r#"{"$alwaysFalse": 1}"#, Conditioned),
        (r#"{"$alwaysTrue": 2}"#, Unknown),
        (r#"{"$sampleRate": 1.0}"#, All),
        (r#"{"$sampleRate": 0.5}"#, Conditioned),
        (r#"{"$sampleRate": 2.0}"#, Unknown),
        (r#"{"$jsonSchema": {}}"#, All),
        (r#"{"$jsonSchema": {"required": ["a"]}}"#, Unknown),
        (r#"{"$text": {"$search": "x"}}"#, Conditioned),
        (r#"{"$hint": {"a": 1}}"#, Unknown),
        (r#"{"$geoWithin": {}}"#, Unknown),
    ]);
}

#[test]
fn regex_literal_and_undefined_values() {
    let re = Regex {
        pattern: "".try_into().unwrap(),
        options: "".try_into().unwrap(),
    };
    assert_eq!(coverage(&rawdoc! { "a": re }), Conditioned);
    assert_eq!(coverage(&rawdoc! { "a": RawBson::Undefined }), Unknown);
}

#[test]
fn hostile_nesting_is_unknown_not_a_stack_overflow() {
    let mut f = rawdoc! {};
    for _ in 0..(MAX_DEPTH * 3) {
        f = rawdoc! { "$and": [f] };
    }
    assert_eq!(coverage(&f), Unknown);
    let mut n = rawdoc! { "$in": [] };
    for _ in 0..(MAX_DEPTH * 3) {
        n = rawdoc! { "$not": n };
    }
    assert_eq!(coverage(&rawdoc! { "a": n }), Unknown);
}

#[test]
fn malformed_bytes_are_unknown() {
    let good = rawdoc! { "a": 1, "b": "xyz" };
    let mut bytes = good.as_bytes().to_vec();
    // Claim a string longer than the document.
    let pos = bytes.len() - 9;
    bytes[pos] = 0x7f;
    if let Ok(bad) = RawDocumentBuf::from_bytes(bytes) {
        assert_eq!(coverage(&bad), Unknown);
    }
}
