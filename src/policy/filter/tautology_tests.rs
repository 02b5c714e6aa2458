//! Unit tests of the "matches every document" detector, each case both ways.

use super::tautology::{coverage, coverage_with, Coverage};
use super::test_util::doc;
use super::verdict::FilterFacts;
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
        // Both branches leave something out, yet together they cover everything: proved by
        // the excluded-middle pass (see `excluded_middle`).
        (
            r#"{"$or": [{"a": {"$exists": true}}, {"a": {"$exists": false}}]}"#,
            All,
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

/// mongod's ComparisonMatchExpression::matchesSingleElement
/// (src/mongo/db/matcher/expression_leaf.cpp): a missing field (EOO) and every value of
/// another type match `$gt`/`$gte: MinKey` and `$lt`/`$lte: MaxKey`.
#[test]
fn min_and_max_key_on_top_level_fields() {
    check(&[
        (r#"{"_id": {"$gte": {"$minKey": 1}}}"#, All),
        (r#"{"_id": {"$lte": {"$maxKey": 1}}}"#, All),
        (r#"{"_id": {"$gt": {"$minKey": 1}}}"#, Conditioned),
        (r#"{"_id": {"$lt": {"$minKey": 1}}}"#, Conditioned),
        (r#"{"_id": {"$not": {"$lt": {"$minKey": 1}}}}"#, All),
        (r#"{"a": {"$gte": {"$minKey": 1}}}"#, All),
        (r#"{"a": {"$lte": {"$maxKey": 1}}}"#, All),
        (r#"{"a": {"$not": {"$gt": {"$maxKey": 1}}}}"#, All),
        (r#"{"a.b": {"$not": {"$lt": {"$minKey": 1}}}}"#, All),
        (r#"{"a": {"$gt": {"$minKey": 1}}}"#, Conditioned),
        (r#"{"a": {"$lt": {"$maxKey": 1}}}"#, Conditioned),
        (r#"{"a": {"$lte": {"$minKey": 1}}}"#, Conditioned),
        (r#"{"a": {"$eq": {"$minKey": 1}}}"#, Conditioned),
        // Through an array of scalars a dotted path may yield no element at all.
        (r#"{"a.b": {"$gte": {"$minKey": 1}}}"#, Unknown),
        (
            r#"{"a.b": {"$not": {"$gte": {"$minKey": 1}}}}"#,
            Conditioned,
        ),
    ]);
}

#[test]
fn excluded_middle() {
    check(&[
        (
            r#"{"$or": [{"a": {"$eq": null}}, {"a": {"$ne": null}}]}"#,
            All,
        ),
        (r#"{"$or": [{"a": 5}, {"a": {"$ne": 5}}]}"#, All),
        (r#"{"$or": [{"a.b": "x"}, {"a.b": {"$ne": "x"}}]}"#, All),
        (
            r#"{"$or": [{"a": {"$in": [1, 2]}}, {"a": {"$nin": [1, 2]}}]}"#,
            All,
        ),
        (
            r#"{"$or": [{"a": {"$gt": 5}}, {"a": {"$not": {"$gt": 5}}}]}"#,
            All,
        ),
        (
            r#"{"$or": [{"a": {"$exists": 1}}, {"a": {"$exists": 0}}]}"#,
            All,
        ),
        (
            r#"{"$or": [{"a": {"$type": "string"}, "b": 1}, {"a": {"$not": {"$type": "string"}}, "b": 1}, {"b": {"$ne": 1}}]}"#,
            All,
        ),
        (
            r#"{"$nor": [{"a": {"$type": "string"}, "b": 1}, {"a": {"$not": {"$type": "string"}}, "b": 1}, {"b": {"$ne": 1}}]}"#,
            Conditioned,
        ),
        (
            r#"{"$or": [{"a": {"$size": 0}}, {"$nor": [{"a": {"$size": 0}}]}]}"#,
            All,
        ),
        (
            r#"{"$or": [{"a": 1, "b": 1}, {"a": {"$ne": 1}}, {"b": {"$ne": 1}}]}"#,
            All,
        ),
        (r#"{"$nor": [{"a": 1}, {"a": {"$ne": 1}}]}"#, Conditioned),
        // Not complements: a string, a missing field, `[]` fail both.
        (
            r#"{"$or": [{"a": {"$gt": 5}}, {"a": {"$lte": 5}}]}"#,
            Conditioned,
        ),
        (
            r#"{"$or": [{"a": {"$gt": 5}}, {"a": {"$lte": 5}}, {"a": {"$exists": false}}]}"#,
            Unknown,
        ),
        // Different operands, different paths, different types of the same number.
        (r#"{"$or": [{"a": 5}, {"a": {"$ne": 6}}]}"#, Unknown),
        (r#"{"$or": [{"a": 5}, {"b": {"$ne": 5}}]}"#, Unknown),
        (r#"{"$or": [{"a": 5}, {"a": {"$ne": 5.0}}]}"#, Unknown),
        // `$sampleRate` draws a new number each time: never its own complement.
        (
            r#"{"$or": [{"$sampleRate": 0.5}, {"$nor": [{"$sampleRate": 0.5}]}]}"#,
            Unknown,
        ),
        (
            r#"{"$or": [{"a": {"$regex": "x", "$options": "i"}}, {"a": {"$not": {"$regex": "x", "$options": "i"}}}]}"#,
            Unknown,
        ),
    ]);
}

#[test]
fn excluded_middle_is_bounded() {
    // Five distinct atoms: more than the pass tries.
    let many = r#"{"$or": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}, {"a": {"$ne": 5}}, {"a": 5}]}"#;
    assert_eq!(cov(many), Unknown);
    let four = r#"{"$or": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": {"$ne": 4}}, {"a": 4}]}"#;
    assert_eq!(cov(four), All);
    // Too large a filter is not tried (each assignment walks it all).
    let big: Vec<i32> = (0..2000).collect();
    let d = bson::doc! {"$or": [{"a": {"$in": big.clone()}}, {"a": {"$nin": big}}]};
    let f = RawDocumentBuf::try_from(&d).unwrap();
    assert_eq!(coverage(&f), Unknown);
}

#[test]
fn id_is_never_an_array() {
    check(&[
        (r#"{"_id": {"$not": {"$type": "array"}}}"#, All),
        (r#"{"_id": {"$not": {"$type": 4}}}"#, All),
        (r#"{"_id": {"$not": {"$size": 0}}}"#, All),
        (r#"{"_id": {"$not": {"$elemMatch": {"$gt": 1}}}}"#, All),
        (r#"{"$nor": [{"_id": {"$type": ["array"]}}]}"#, All),
        (r#"{"_id": {"$type": "array"}}"#, Conditioned),
        (
            r#"{"_id": {"$not": {"$type": ["array", "string"]}}}"#,
            Unknown,
        ),
        (r#"{"a": {"$not": {"$type": "array"}}}"#, Unknown),
        (r#"{"_id.x": {"$not": {"$type": "array"}}}"#, Unknown),
        (r#"{"_id": {"$ne": null}}"#, Conditioned),
    ]);
}

#[test]
fn expr_folding() {
    check(&[
        // BSON cross-type order: numbers < strings < objects < arrays < ... < dates.
        (r#"{"$expr": {"$gt": ["a", 1]}}"#, All),
        (r#"{"$expr": {"$lt": [null, 0]}}"#, All),
        (r#"{"$expr": {"$gt": [{"$maxKey": 1}, "$$NOW"]}}"#, All),
        (r#"{"$expr": {"$eq": [1, "1"]}}"#, Conditioned),
        // Exact numbers: 2^53 + 1 as a long is above 2^53 as a double.
        (
            r#"{"$expr": {"$gt": [{"$numberLong": "9007199254740993"}, 9007199254740992.0]}}"#,
            All,
        ),
        (
            r#"{"$expr": {"$eq": [{"$numberLong": "9007199254740993"}, 9007199254740992.0]}}"#,
            Conditioned,
        ),
        (r#"{"$expr": {"$eq": [{"$numberDecimal": "5.0"}, 5]}}"#, All),
        (r#"{"$expr": {"$gt": [{"$numberDecimal": "0.1"}, 0]}}"#, All),
        (
            r#"{"$expr": {"$eq": [{"$numberDecimal": "0.1"}, 0.1]}}"#,
            Unknown,
        ),
        (
            r#"{"$expr": {"$eq": [{"$numberDouble": "NaN"}, 1]}}"#,
            Unknown,
        ),
        // System variables.
        (r#"{"$expr": "$$NOW"}"#, All),
        (r#"{"$expr": {"$eq": ["$$NOW", "$$NOW"]}}"#, All),
        (r#"{"$expr": {"$lt": ["$$NOW", "$$CLUSTER_TIME"]}}"#, All),
        (
            r#"{"$expr": {"$gt": ["$$NOW", {"$date": "2020-01-01T00:00:00Z"}]}}"#,
            Unknown,
        ),
        (r#"{"$expr": {"$eq": ["$$ROOT", "$$ROOT"]}}"#, Unknown),
        (r#"{"$expr": "$$REMOVE"}"#, Unknown),
        // $cond, $ifNull, $let, type and conversion operators.
        (r#"{"$expr": {"$cond": [true, 1, "$a"]}}"#, All),
        (
            r#"{"$expr": {"$cond": {"if": 0, "then": "$a", "else": "$$ROOT"}}}"#,
            All,
        ),
        (r#"{"$expr": {"$cond": ["$a", 1, 1]}}"#, Unknown),
        (r#"{"$expr": {"$ifNull": [null, 1]}}"#, All),
        (r#"{"$expr": {"$ifNull": [null, null]}}"#, Conditioned),
        (r#"{"$expr": {"$ifNull": ["$a", 1]}}"#, Unknown),
        (
            r#"{"$expr": {"$let": {"vars": {"v": 2}, "in": {"$gt": ["$$v", 1]}}}}"#,
            All,
        ),
        (
            r#"{"$expr": {"$let": {"vars": {"CURRENT": 0}, "in": "$$CURRENT"}}}"#,
            Conditioned,
        ),
        (
            r#"{"$expr": {"$let": {"vars": {"v": "$a"}, "in": "$$v"}}}"#,
            Unknown,
        ),
        (r#"{"$expr": {"$eq": [{"$type": 1.5}, "double"]}}"#, All),
        (r#"{"$expr": {"$isNumber": {"$numberDecimal": "1"}}}"#, All),
        (r#"{"$expr": {"$isNumber": "1"}}"#, Conditioned),
        (r#"{"$expr": {"$toBool": "false"}}"#, All),
        (r#"{"$expr": {"$toBool": null}}"#, Conditioned),
        (r#"{"$expr": {"$eq": [{"$toInt": 2.9}, 2]}}"#, All),
        (r#"{"$expr": {"$toInt": "2"}}"#, Unknown),
        (r#"{"$expr": {"$eq": [{"$toLong": true}, 1]}}"#, All),
        (r#"{"$expr": {"$cmp": [2, 1]}}"#, All),
        // Unbound variables stay unknown.
        (r#"{"$expr": "$$flag"}"#, Unknown),
        (r#"{"$expr": {"$type": [1, 2]}}"#, Unknown),
    ]);
}

fn cov_with(json: &str, let_vars: Option<&str>, collation: Option<&str>) -> Coverage {
    let l = let_vars.map(doc);
    let c = collation.map(doc);
    let facts = FilterFacts {
        collation: c.as_deref(),
        let_vars: l.as_deref(),
    };
    coverage_with(&doc(json), &facts)
}

#[test]
fn let_variables_fold() {
    let l = Some(r#"{"flag": true, "zero": 0, "now": "$$NOW", "loop": "$$loop", "f": "$a"}"#);
    assert_eq!(cov_with(r#"{"$expr": "$$flag"}"#, l, None), All);
    assert_eq!(cov_with(r#"{"$expr": "$$zero"}"#, l, None), Conditioned);
    assert_eq!(
        cov_with(r#"{"$expr": {"$eq": ["$$now", "$$NOW"]}}"#, l, None),
        All
    );
    assert_eq!(cov_with(r#"{"$expr": {"$not": "$$zero"}}"#, l, None), All);
    assert_eq!(cov_with(r#"{"$expr": "$$loop"}"#, l, None), Unknown);
    assert_eq!(cov_with(r#"{"$expr": "$$f"}"#, l, None), Unknown);
    assert_eq!(cov_with(r#"{"$expr": "$$missing"}"#, l, None), Unknown);
    // A `$let` variable shadows the command's.
    assert_eq!(
        cov_with(
            r#"{"$expr": {"$let": {"vars": {"flag": false}, "in": "$$flag"}}}"#,
            l,
            None
        ),
        Conditioned
    );
    assert_eq!(cov_with(r#"{"$expr": "$$flag"}"#, None, None), Unknown);
}

#[test]
fn a_collation_stops_string_comparisons_only() {
    let fr = Some(r#"{"locale": "fr", "strength": 1}"#);
    let simple = Some(r#"{"locale": "simple"}"#);
    assert_eq!(
        cov_with(r#"{"$expr": {"$ne": ["a", "A"]}}"#, None, None),
        All
    );
    assert_eq!(
        cov_with(r#"{"$expr": {"$ne": ["a", "A"]}}"#, None, simple),
        All
    );
    assert_eq!(
        cov_with(r#"{"$expr": {"$ne": ["a", "A"]}}"#, None, fr),
        Unknown
    );
    assert_eq!(
        cov_with(r#"{"$expr": {"$eq": ["a", "A"]}}"#, None, fr),
        Unknown
    );
    // Cross-type order and numbers do not depend on a collation.
    assert_eq!(cov_with(r#"{"$expr": {"$gt": ["a", 1]}}"#, None, fr), All);
    assert_eq!(cov_with(r#"{"$expr": {"$gt": [2, 1]}}"#, None, fr), All);
    // Excluded middle compares no strings.
    assert_eq!(
        cov_with(r#"{"$or": [{"a": "x"}, {"a": {"$ne": "x"}}]}"#, None, fr),
        All
    );
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

/// Cost of a proof, for the closing note: run with
/// `cargo test --release -p mongoguard --lib timing_of_proofs -- --ignored --nocapture`.
#[test]
#[ignore]
fn timing_of_proofs() {
    let big: Vec<i32> = (0..300).collect();
    let cases = [
        ("empty", doc("{}")),
        ("range (conditioned)", doc(r#"{"age": {"$gt": 30}}"#)),
        ("$where (opaque, no atoms)", doc(r#"{"$where": "this.a > 1"}"#)),
        (
            "excluded middle, 1 atom",
            doc(r#"{"$or": [{"a": {"$exists": true}}, {"a": {"$exists": false}}]}"#),
        ),
        (
            "excluded middle, 4 atoms (all 16 assignments tried)",
            doc(r#"{"$or": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": {"$ne": 4}}, {"a": 4}]}"#),
        ),
        (
            "4 atoms, not all, fails on the last assignment only",
            doc(r#"{"$or": [{"a": {"$ne": 1}}, {"a": {"$ne": 2}}, {"a": {"$ne": 3}}, {"a": {"$ne": 4}}, {"$where": "x"}]}"#),
        ),
        (
            "near 4 KiB, 2 lists of 300",
            RawDocumentBuf::try_from(&bson::doc! {"$or": [{"$where": "x"}, {"a": {"$in": big.clone()}}, {"b": {"$in": big}}]}).unwrap(),
        ),
        (
            "$expr folding",
            doc(r#"{"$expr": {"$let": {"vars": {"v": "$$NOW"}, "in": {"$cond": [{"$eq": ["$$v", "$$NOW"]}, {"$gt": [{"$numberLong": "9007199254740993"}, 9007199254740992.0]}, false]}}}}"#),
        ),
    ];
    for (name, f) in &cases {
        let n = 20_000u32;
        let start = std::time::Instant::now();
        let mut all = 0;
        for _ in 0..n {
            all += usize::from(coverage(std::hint::black_box(f)) == All);
        }
        let per = start.elapsed() / n;
        println!(
            "{name}: {} bytes, {per:?} per call, all={}",
            f.as_bytes().len(),
            all > 0
        );
    }
}

#[test]
fn hostile_expression_nesting_is_unknown_not_a_stack_overflow() {
    // Built as raw bytes: a nested `bson::Document` this deep overflows in its own drop.
    let wraps: [fn(RawDocumentBuf) -> RawDocumentBuf; 4] = [
        |e| rawdoc! {"$not": [e]},
        |e| rawdoc! {"$cond": [true, e, false]},
        |e| rawdoc! {"$let": {"vars": {"v": e}, "in": "$$v"}},
        |e| rawdoc! {"$ifNull": [RawBson::Null, e]},
    ];
    for wrap in wraps {
        let mut e = rawdoc! {"$literal": true};
        for _ in 0..(MAX_DEPTH * 3) {
            e = wrap(e);
        }
        assert_eq!(coverage(&rawdoc! {"$expr": e}), Unknown);
    }
    // Nesting that stays within the bound is still folded.
    let mut e = rawdoc! {"$literal": true};
    for _ in 0..10 {
        e = rawdoc! {"$let": {"vars": {"v": e}, "in": "$$v"}};
    }
    assert_eq!(coverage(&rawdoc! {"$expr": e}), All);
}
