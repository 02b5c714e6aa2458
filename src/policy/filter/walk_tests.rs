//! Unit tests of the predicate walker and of `regex_is_anchored`.

use std::ops::ControlFlow;

use super::test_util::doc;
use super::walk::{
    regex_is_anchored, regex_is_anchored_with, walk_expression, walk_filter, walk_pipeline, Event,
};
use super::MAX_DEPTH;
use bson::{rawdoc, RawBsonRef, RawDocument};
use Event::*;

// JSON inputs here list keys in sorted order, so event order is the same whether or not
// serde_json preserves key order.

fn events(filter: &RawDocument) -> Vec<Event<'_>> {
    let mut out = Vec::new();
    let flow = walk_filter(filter, &mut |e| {
        out.push(e);
        ControlFlow::Continue(())
    });
    assert_eq!(flow, ControlFlow::Continue(()));
    out
}

#[test]
fn negations_at_any_depth() {
    let f = doc(
        r#"{"$and": [{"$or": [{"b": {"$nin": [1, 2]}}, {"c": {"$not": {"$gt": 1}}}]}],
            "$nor": [{"d": 1}], "a": {"$ne": 1}}"#,
    );
    assert_eq!(
        events(&f),
        vec![
            OrBranches { len: 2 },
            Negation {
                op: "$nin",
                path: "b"
            },
            InList {
                op: "$nin",
                len: 2,
                path: "b"
            },
            Negation {
                op: "$not",
                path: "c"
            },
            Negation {
                op: "$nor",
                path: ""
            },
            Negation {
                op: "$ne",
                path: "a"
            },
        ]
    );
}

#[test]
fn regexes_everywhere() {
    let f = doc(r#"{"a": {"$regex": "^x", "$options": "i"},
            "b": {"$regularExpression": {"pattern": "lit", "options": "m"}},
            "c": {"$in": [1, {"$regularExpression": {"pattern": "inlist", "options": ""}}]},
            "d": {"$not": {"$regularExpression": {"pattern": "neg", "options": ""}}},
            "e": {"$eq": {"$regularExpression": {"pattern": "notamatch", "options": ""}}}}"#);
    assert_eq!(
        events(&f),
        vec![
            Regex {
                pattern: "^x",
                options: "i",
                path: "a"
            },
            Regex {
                pattern: "lit",
                options: "m",
                path: "b"
            },
            InList {
                op: "$in",
                len: 2,
                path: "c"
            },
            Regex {
                pattern: "inlist",
                options: "",
                path: "c"
            },
            Negation {
                op: "$not",
                path: "d"
            },
            Regex {
                pattern: "neg",
                options: "",
                path: "d"
            },
        ]
    );
}

#[test]
fn regex_literal_with_options_on_both_sides_reports_both() {
    let re = bson::Regex {
        pattern: "^a".try_into().unwrap(),
        options: "m".try_into().unwrap(),
    };
    let f = rawdoc! { "a": { "$regex": re, "$options": "i" } };
    assert_eq!(
        events(&f),
        vec![
            Regex {
                pattern: "^a",
                options: "m",
                path: "a"
            },
            Regex {
                pattern: "^a",
                options: "i",
                path: "a"
            },
        ]
    );
}

#[test]
fn exists_false_in_every_falsy_spelling() {
    for falsy in ["false", "0", "0.0", "null", r#"{"$numberLong": "0"}"#] {
        let f = doc(&format!(r#"{{"a": {{"$exists": {falsy}}}}}"#));
        assert_eq!(events(&f), vec![ExistsFalse { path: "a" }], "{falsy}");
    }
    for truthy in ["true", "1", "\"\""] {
        let f = doc(&format!(r#"{{"a": {{"$exists": {truthy}}}}}"#));
        assert_eq!(events(&f), vec![], "{truthy}");
    }
}

#[test]
fn elem_match_both_forms_and_where() {
    let f = doc(r#"{"$where": "this.a > 1",
            "items": {"$elemMatch": {"$or": [{"q": 1}], "sku": {"$exists": false}}},
            "tags": {"$elemMatch": {"$ne": "x"}}}"#);
    assert_eq!(
        events(&f),
        vec![
            Where,
            OrBranches { len: 1 },
            ExistsFalse { path: "sku" },
            Negation {
                op: "$ne",
                path: "tags"
            },
        ]
    );
}

#[test]
fn expr_reports_js_negation_regex_and_in() {
    let f = doc(r#"{"$expr": {"$and": [
            {"$function": {"body": "function() { return true; }", "args": [], "lang": "js"}},
            {"$ne": ["$status", "A"]},
            {"$not": [{"$in": ["$x", [1, 2, 3]]}]},
            {"$regexMatch": {"input": "$name", "regex": "abc", "options": "i"}},
            {"$literal": {"$function": "inert data"}}
        ]}}"#);
    assert_eq!(
        events(&f),
        vec![
            JsFunction { op: "$function" },
            Negation {
                op: "$ne",
                path: "status"
            },
            Negation {
                op: "$not",
                path: ""
            },
            InList {
                op: "$in",
                len: 3,
                path: "x"
            },
            Regex {
                pattern: "abc",
                options: "i",
                path: "name"
            },
        ]
    );
}

#[test]
fn computed_regex_is_reported_as_empty_pattern() {
    let e = doc(r#"{"$regexFind": {"input": "$a", "regex": "$pattern"}}"#);
    let mut seen = Vec::new();
    let _ = walk_expression(RawBsonRef::Document(&e), &mut |ev| {
        seen.push(ev);
        ControlFlow::Continue(())
    });
    assert_eq!(
        seen,
        vec![Regex {
            pattern: "",
            options: "",
            path: "a"
        }]
    );
}

#[test]
fn pipeline_stages_and_sub_pipelines() {
    let p = doc(r#"{"p": [
            {"$match": {"a": {"$ne": 1}}},
            {"$lookup": {"from": "c", "let": {"x": "$x"}, "as": "j",
                         "pipeline": [{"$match": {"$expr": {"$ne": ["$y", "$$x"]}}}]}},
            {"$facet": {"f": [{"$match": {"b": {"$exists": false}}}]}},
            {"$unionWith": {"coll": "d", "pipeline": [{"$match": {"$where": "1"}}]}},
            {"$group": {"_id": null, "t": {"$accumulator": {"init": "function() {}"}}}},
            {"$project": {"m": {"$regexMatch": {"input": "$s", "regex": "^a"}}}}
        ]}"#);
    let Ok(pipeline) = p.get_array("p") else {
        panic!("no pipeline")
    };
    let mut seen = Vec::new();
    let _ = walk_pipeline(pipeline, &mut |ev| {
        seen.push(ev);
        ControlFlow::Continue(())
    });
    assert_eq!(
        seen,
        vec![
            Negation {
                op: "$ne",
                path: "a"
            },
            Negation {
                op: "$ne",
                path: "y"
            },
            ExistsFalse { path: "b" },
            Where,
            JsFunction { op: "$accumulator" },
            Regex {
                pattern: "^a",
                options: "",
                path: "s"
            },
        ]
    );
}

#[test]
fn visitor_can_stop_early() {
    let f = doc(r#"{"a": {"$ne": 1}, "b": {"$ne": 2}, "c": {"$ne": 3}}"#);
    let mut n = 0;
    let flow = walk_filter(&f, &mut |_| {
        n += 1;
        if n == 2 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    assert_eq!((flow, n), (ControlFlow::Break(()), 2));
}

#[test]
fn hostile_nesting_reports_too_deep() {
    let mut f = rawdoc! { "a": { "$ne": 1 } };
    for _ in 0..(MAX_DEPTH * 3) {
        f = rawdoc! { "$or": [f] };
    }
    let ev = events(&f);
    assert!(ev.contains(&TooDeep));
    assert!(!ev.contains(&Negation {
        op: "$ne",
        path: "a"
    }));
    let mut e = rawdoc! { "$ne": [1, 2] };
    for _ in 0..(MAX_DEPTH * 3) {
        e = rawdoc! { "$not": [e] };
    }
    let mut too_deep = false;
    let _ = walk_expression(RawBsonRef::Document(&e), &mut |ev| {
        too_deep |= ev == TooDeep;
        ControlFlow::Continue(())
    });
    assert!(too_deep);
}

#[test]
fn malformed_shapes_are_reported() {
    let f = doc(r#"{"$or": 5, "a": {"$in": 3}, "b": {"$not": 1}, "$and": [7]}"#);
    let ev = events(&f);
    assert_eq!(ev.iter().filter(|e| **e == Malformed).count(), 4, "{ev:?}");
}

#[test]
fn anchoring() {
    for (p, o) in [
        ("^abc", ""),
        ("\\Aabc", ""),
        ("\\Aabc", "m"),
        ("^a|^b", ""),
        ("^(a|b)", ""),
        ("^a[|]b", ""),
        ("^a\\|b", ""),
        ("^a\\Q|\\Eb", ""),
        ("^a", "sx"),
    ] {
        assert!(regex_is_anchored(p, o), "{p} /{o}");
    }
    for (p, o) in [
        ("abc", ""),
        ("^abc", "i"),
        ("^abc", "m"),
        ("^a|b", ""),
        ("^a|", ""),
        ("(^a)", ""),
        ("^(?i)abc", ""),
        ("^a|\\Ab|c", ""),
        ("", ""),
        ("^a", "q"),
        (".*^a", ""),
    ] {
        assert!(!regex_is_anchored(p, o), "{p} /{o}");
    }
}

#[test]
fn anchoring_with_case_insensitivity_allowed() {
    for (p, o) in [
        ("^abc", "i"),
        ("^(?i)abc", ""),
        ("\\Aabc", "im"),
        ("^a", "ix"),
    ] {
        assert!(regex_is_anchored_with(p, o, false), "{p} /{o}");
        assert!(!regex_is_anchored_with(p, o, true), "{p} /{o}");
    }
    for (p, o) in [("abc", "i"), ("^abc", "mi"), ("^(?m)a", ""), ("^a", "iq")] {
        assert!(!regex_is_anchored_with(p, o, false), "{p} /{o}");
    }
}
