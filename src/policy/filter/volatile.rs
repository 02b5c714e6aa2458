//! Whether a filter's matches can change with nothing in the data changing: the clock, chance
//! or JavaScript. Such a filter cannot be measured: the measuring `find` and the write run
//! at different moments (and draw different random numbers), so what the one counts says
//! nothing about what the other will match.
//!
//! - `$$NOW` and `$$CLUSTER_TIME` are bound once per command, when it starts
//!   (src/mongo/db/pipeline/variables.cpp `Variables::getValue` reads them from the
//!   command's runtime constants, src/mongo/db/pipeline/legacy_runtime_constants.idl): the
//!   measuring find and the write each get their own. `{$expr: {$gt: ["$$NOW", D]}}` with
//!   `D` a few milliseconds ahead matches nothing when measured and everything when written.
//! - `$rand` and `$sampleRate` draw a new number for each document of each command
//!   (src/mongo/db/pipeline/expression.cpp `ExpressionRandom`; src/mongo/db/matcher/
//!   expression_parser.cpp reads `$sampleRate` as a `$rand` comparison), and
//!   `{$meta: "randVal"}` is one too.
//! - `$where`, `$function` and `$accumulator` run JavaScript, which can read the clock
//!   (`Date.now()`) and draw (`Math.random()`).
//!
//! The scan is syntactic and deliberately wide: any key `$sample`, `$where`, `$function`,
//! `$accumulator`, `$rand`, `$sampleRate` or `$meta`, and any string `$$NOW` or
//! `$$CLUSTER_TIME` (or a path below them), anywhere in the document, including inside
//! `$literal` (a literal string is data, but treating it as the variable only costs a
//! measurement). Nesting past [`MAX_DEPTH`] and an unreadable element count as volatile.

use bson::{RawBsonRef, RawDocument};

use super::MAX_DEPTH;

/// Keys whose operator draws anew or runs JavaScript.
const VOLATILE_KEYS: [&str; 7] = [
    "$sample",
    "$where",
    "$function",
    "$accumulator",
    "$rand",
    "$sampleRate",
    "$meta",
];

/// Variables bound per command from the clock.
const CLOCK_VARIABLES: [&str; 2] = ["$$NOW", "$$CLUSTER_TIME"];

/// True when `doc` (a filter, or a command's `let`) may match differently from one command
/// to the next with the same data (module docs). Allocation-free; never panics.
pub fn volatile(doc: &RawDocument) -> bool {
    document(doc, 0)
}

/// [`volatile`] of any value (an aggregation pipeline, a `$sample` stage included).
pub fn volatile_value(v: RawBsonRef<'_>) -> bool {
    value(v, 0)
}

fn document(doc: &RawDocument, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    for elem in doc.iter_elements() {
        let Ok(elem) = elem else { return true };
        if VOLATILE_KEYS.contains(&elem.key().as_str()) {
            return true;
        }
        let Ok(v) = elem.value() else { return true };
        if value(v, depth) {
            return true;
        }
    }
    false
}

fn value(v: RawBsonRef<'_>, depth: usize) -> bool {
    match v {
        RawBsonRef::String(s) => CLOCK_VARIABLES.iter().any(|var| {
            s.strip_prefix(var)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        }),
        RawBsonRef::Document(d) => document(d, depth + 1),
        RawBsonRef::Array(a) => {
            if depth + 1 > MAX_DEPTH {
                return true;
            }
            for item in a {
                let Ok(item) = item else { return true };
                if value(item, depth + 1) {
                    return true;
                }
            }
            false
        }
        // JavaScript as a value: `$where` is caught by its key; code elsewhere is data.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::doc;
    use super::volatile;

    #[test]
    fn clock_chance_and_javascript() {
        for f in [
            r#"{"$expr": {"$gt": ["$$NOW", {"$date": "2030-01-01T00:00:00Z"}]}}"#,
            r#"{"$expr": {"$gt": ["$$CLUSTER_TIME", 1]}}"#,
            r#"{"$expr": {"$eq": ["$$NOW.x", 1]}}"#,
            r#"{"$and": [{"a": 1}, {"$expr": {"$in": ["$$NOW", ["$a"]]}}]}"#,
            r#"{"$expr": {"$lt": [{"$rand": {}}, 0.5]}}"#,
            r#"{"$sampleRate": 0.5}"#,
            r#"{"$where": "return Date.now() > 0"}"#,
            r#"{"$expr": {"$function": {"body": "f", "args": [], "lang": "js"}}}"#,
            r#"{"$expr": {"$lt": [{"$meta": "randVal"}, 0.5]}}"#,
            r#"{"t": "$$NOW"}"#,
        ] {
            assert!(volatile(&doc(f)), "{f}");
        }
        for f in [
            r#"{"a": 1}"#,
            r#"{"a": "$NOW"}"#,
            r#"{"a": "$$NOWHERE"}"#,
            r#"{"$expr": {"$eq": ["$$x", "$a"]}}"#,
            r#"{"a": {"$lt": {"$date": "2030-01-01T00:00:00Z"}}}"#,
        ] {
            assert!(!volatile(&doc(f)), "{f}");
        }
    }

    #[test]
    fn nesting_past_the_limit_is_volatile() {
        let mut d = bson::rawdoc! {"a": 1};
        for _ in 0..=super::MAX_DEPTH + 1 {
            d = bson::rawdoc! {"a": d};
        }
        assert!(volatile(&d));
    }
}
