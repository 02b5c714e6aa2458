//! A visitor over every predicate of a filter, an aggregation expression or a pipeline.
//!
//! The query rules (Q001 to Q005) look for operators wherever they hide: under `$and` /
//! `$or` / `$nor`, `$not`, both forms of `$elemMatch`, `$expr`, and inside `$lookup`,
//! `$facet` and `$unionWith` sub-pipelines. The walker finds them once and reports each as an
//! [`Event`]; a rule is a [`Visitor`] that decides what an event means and may stop the walk
//! early with [`ControlFlow::Break`].
//!
//! The walk borrows from the document (events carry `&str` slices of it) and never
//! allocates. Nesting is bounded by [`MAX_DEPTH`]: a deeper subtree is reported as
//! [`Event::TooDeep`] and skipped; an unreadable element is reported as [`Event::Malformed`]
//! and ends the walk of its document. A rule should treat both as suspicious.
//!
//! Paths are the keys as written at their level: inside a query-form `$elemMatch` they are
//! relative to the array element (`{a: {$elemMatch: {b: {$ne: 1}}}}` reports `b`), and in
//! aggregation expressions they are the `$field` argument without its `$` when there is one,
//! else `""`.

use crate::wire::{value_valid, walk_keyed, GetFast};
use std::ops::ControlFlow;

use bson::{RawArray, RawBsonRef, RawDocument, RawRegexRef};

use super::{first_key, is_operator_doc, true_value, MAX_DEPTH};

mod expr;

use expr::{expression, stages};

pub use super::anchor::{regex_is_anchored, regex_is_anchored_with};

/// One predicate occurrence worth a rule's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A negation: `$ne`, `$nin`, `$not` on a field, `$nor` (path `""`), or `$ne` / `$not`
    /// in an aggregation expression. Negations cannot use an index well.
    Negation {
        /// `"$ne"`, `"$nin"`, `"$not"` or `"$nor"`.
        op: &'static str,
        /// The field the negation applies to.
        path: &'a str,
    },
    /// A `$where` clause (server-side JavaScript).
    Where,
    /// Server-side JavaScript in an aggregation expression.
    JsFunction {
        /// `"$function"` or `"$accumulator"`.
        op: &'static str,
    },
    /// A regular-expression match: `$regex`, a regex literal as a value (also inside `$in`,
    /// `$nin`, `$all`, `$not`), or `$regexMatch` / `$regexFind` / `$regexFindAll`. A
    /// pattern that is computed at run time is reported as `""` (never provably anchored).
    Regex {
        /// The pattern source.
        pattern: &'a str,
        /// The option letters (`i`, `m`, `s`, `x`, `u`).
        options: &'a str,
        /// The field matched.
        path: &'a str,
    },
    /// `$exists` with a falsy value (`false`, `0`, `0.0`, `null`).
    ExistsFalse {
        /// The field that must be missing.
        path: &'a str,
    },
    /// An `$in` or `$nin` list (in a query or an expression), with its length.
    InList {
        /// `"$in"` or `"$nin"`.
        op: &'static str,
        /// How many values the list holds.
        len: usize,
        /// The field tested.
        path: &'a str,
    },
    /// A query `$or` with its number of branches.
    OrBranches {
        /// How many branches.
        len: usize,
    },
    /// Nesting deeper than [`MAX_DEPTH`]; the subtree was not walked.
    TooDeep,
    /// An element that could not be read, or an operator with an impossible argument; the
    /// rest of that document was not walked.
    Malformed,
}

/// Receives the events of a walk. Return [`ControlFlow::Break`] to stop the walk.
pub trait Visitor<'a> {
    /// Called once per event, in document order.
    fn visit(&mut self, event: Event<'a>) -> ControlFlow<()>;
}

impl<'a, F: FnMut(Event<'a>) -> ControlFlow<()>> Visitor<'a> for F {
    fn visit(&mut self, event: Event<'a>) -> ControlFlow<()> {
        self(event)
    }
}

/// Walks a query filter (`find`, `count`, `delete`/`update` `q`, `$match`...).
pub fn walk_filter<'a>(filter: &'a RawDocument, v: &mut impl Visitor<'a>) -> ControlFlow<()> {
    filter_doc(filter, v, 0)
}

/// Walks an aggregation expression (the value of `$expr`, a `$project` or `$group`
/// specification...), reporting `$function`, `$accumulator`, `$ne`, `$not`, `$in` and the
/// regex operators at any depth. `$literal` contents are not walked: they are data.
pub fn walk_expression<'a>(expr: RawBsonRef<'a>, v: &mut impl Visitor<'a>) -> ControlFlow<()> {
    expression(expr, v, 0)
}

/// Walks an aggregation pipeline: `$match` (and `$geoNear.query`,
/// `$graphLookup.restrictSearchWithMatch`) as filters, the sub-pipelines of `$lookup`,
/// `$unionWith`, `$facet` and `$merge.whenMatched`, every other stage as an expression.
pub fn walk_pipeline<'a>(pipeline: &'a RawArray, v: &mut impl Visitor<'a>) -> ControlFlow<()> {
    stages(pipeline, v, 0)
}

fn filter_doc<'a>(doc: &'a RawDocument, v: &mut impl Visitor<'a>, depth: usize) -> ControlFlow<()> {
    if depth > MAX_DEPTH {
        return v.visit(Event::TooDeep);
    }
    #[cfg(test)]
    let fast = !tests::ITER_ONLY.with(std::cell::Cell::get);
    #[cfg(not(test))]
    let fast = true;
    if fast {
        if let Some(flow) = filter_doc_fast(doc, v, depth) {
            return flow;
        }
    }
    filter_doc_iter(doc, v, depth)
}

/// [`filter_doc`] over `crate::wire::walk_keyed` instead of the bson crate's iteration, for a
/// document the walk decides whole and whose every value the bson crate builds (checked by a
/// first walk, before any event), without `$and` / `$or` / `$nor` / `$expr` (their arrays
/// and expressions are left to the crate). `None`: not decided, nothing visited.
/// `tests::fast_walk_reports_what_the_bson_crate_walk_reports`.
fn filter_doc_fast<'a>(
    doc: &'a RawDocument,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> Option<ControlFlow<()>> {
    let checked = walk_keyed(doc, |key, tag, value| {
        let leave =
            !value_valid(tag, value) || matches!(key, b"$and" | b"$or" | b"$nor" | b"$expr");
        leave.then_some(())
    });
    if !matches!(checked, Ok(None)) {
        return None;
    }
    let walked = walk_keyed(doc, |key, tag, value| {
        let flow = match key {
            b"$where" => v.visit(Event::Where),
            // $comment, $text, $jsonSchema...: no predicates
            [b'$', ..] => ControlFlow::Continue(()),
            // Only an embedded document holds predicates (a regex value is left to the crate).
            _ if tag == 0x03 => match (std::str::from_utf8(key), RawDocument::from_bytes(value)) {
                (Ok(path), Ok(d)) => field(path, RawBsonRef::Document(d), v, depth + 1),
                // Not reached: the first walk checked the key and the document's bytes.
                _ => v.visit(Event::Malformed),
            },
            _ => ControlFlow::Continue(()),
        };
        flow.is_break().then_some(flow)
    });
    Some(match walked {
        Ok(Some(flow)) => flow,
        Ok(None) => ControlFlow::Continue(()),
        // Not reached: the first walk decided these bytes.
        Err(()) => v.visit(Event::Malformed),
    })
}

/// [`filter_doc`] through the bson crate's iteration: any document.
fn filter_doc_iter<'a>(
    doc: &'a RawDocument,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    for elem in doc.iter_elements() {
        let Ok(elem) = elem else {
            return v.visit(Event::Malformed);
        };
        let Ok(value) = elem.value() else {
            return v.visit(Event::Malformed);
        };
        match elem.key().as_str() {
            op @ ("$and" | "$or" | "$nor") => {
                let RawBsonRef::Array(branches) = value else {
                    v.visit(Event::Malformed)?;
                    continue;
                };
                if op == "$or" {
                    v.visit(Event::OrBranches {
                        len: branches.into_iter().count(),
                    })?;
                } else if op == "$nor" {
                    v.visit(Event::Negation {
                        op: "$nor",
                        path: "",
                    })?;
                }
                for branch in branches {
                    match branch {
                        Ok(RawBsonRef::Document(d)) => filter_doc(d, v, depth + 1)?,
                        _ => v.visit(Event::Malformed)?,
                    }
                }
            }
            "$where" => v.visit(Event::Where)?,
            "$expr" => expression(value, v, depth + 1)?,
            key if key.starts_with('$') => {} // $comment, $text, $jsonSchema...: no predicates
            path => field(path, value, v, depth + 1)?,
        }
    }
    ControlFlow::Continue(())
}

fn field<'a>(
    path: &'a str,
    value: RawBsonRef<'a>,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    match value {
        RawBsonRef::RegularExpression(r) => v.visit(regex(r, path)),
        RawBsonRef::Document(d) if is_operator_doc(d) => operators(path, d, v, depth),
        _ => ControlFlow::Continue(()),
    }
}

fn regex<'a>(r: RawRegexRef<'a>, path: &'a str) -> Event<'a> {
    Event::Regex {
        pattern: r.pattern.as_str(),
        options: r.options.as_str(),
        path,
    }
}

/// The operators on one field: `{$ne: 1, $exists: false, $not: {...}, ...}`.
fn operators<'a>(
    path: &'a str,
    ops: &'a RawDocument,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    if depth > MAX_DEPTH {
        return v.visit(Event::TooDeep);
    }
    let options = match ops.get_fast("$options") {
        Ok(Some(RawBsonRef::String(s))) => s,
        Ok(None) => "",
        _ => {
            v.visit(Event::Malformed)?;
            ""
        }
    };
    for elem in ops.iter_elements() {
        let Ok(elem) = elem else {
            return v.visit(Event::Malformed);
        };
        let Ok(value) = elem.value() else {
            return v.visit(Event::Malformed);
        };
        operator(elem.key().as_str(), value, path, options, v, depth)?;
    }
    ControlFlow::Continue(())
}

/// One operator of [`operators`]; `options` is the document's `$options`.
fn operator<'a>(
    op: &str,
    value: RawBsonRef<'a>,
    path: &'a str,
    options: &'a str,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    match (op, value) {
        ("$ne", _) => v.visit(Event::Negation { op: "$ne", path }),
        ("$in", RawBsonRef::Array(list)) => in_list("$in", list, path, v, depth),
        ("$nin", RawBsonRef::Array(list)) => {
            v.visit(Event::Negation { op: "$nin", path })?;
            in_list("$nin", list, path, v, depth)
        }
        ("$all", RawBsonRef::Array(list)) => list_regexes(list, path, v, depth),
        ("$not", not) => {
            v.visit(Event::Negation { op: "$not", path })?;
            match not {
                RawBsonRef::RegularExpression(r) => v.visit(regex(r, path)),
                RawBsonRef::Document(d) if is_operator_doc(d) => operators(path, d, v, depth + 1),
                _ => v.visit(Event::Malformed),
            }
        }
        ("$regex", RawBsonRef::String(pattern)) => v.visit(Event::Regex {
            pattern,
            options,
            path,
        }),
        ("$regex", RawBsonRef::RegularExpression(r)) => {
            let own = r.options.as_str();
            // Options on both the literal and `$options`: report both, the rule keeps
            // the worse.
            v.visit(regex(r, path))?;
            if !options.is_empty() && options != own {
                v.visit(Event::Regex {
                    pattern: r.pattern.as_str(),
                    options,
                    path,
                })?;
            }
            ControlFlow::Continue(())
        }
        ("$exists", e) if !true_value(e) => v.visit(Event::ExistsFalse { path }),
        ("$elemMatch", RawBsonRef::Document(d)) => {
            if elem_match_is_value_form(d) {
                operators(path, d, v, depth + 1)
            } else {
                filter_doc(d, v, depth + 1)
            }
        }
        ("$in" | "$nin" | "$all" | "$regex" | "$elemMatch", _) => v.visit(Event::Malformed),
        _ => ControlFlow::Continue(()),
    }
}

/// `$in` / `$nin`: the list's length, then its regexes.
fn in_list<'a>(
    op: &'static str,
    list: &'a RawArray,
    path: &'a str,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    v.visit(Event::InList {
        op,
        len: list.into_iter().count(),
        path,
    })?;
    list_regexes(list, path, v, depth)
}

/// Regex literals in `$in` / `$nin` / `$all` lists match as regexes; `$all` may also hold
/// `{$elemMatch: ...}` documents.
fn list_regexes<'a>(
    list: &'a RawArray,
    path: &'a str,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    for item in list {
        match item {
            Ok(RawBsonRef::RegularExpression(r)) => v.visit(regex(r, path))?,
            Ok(RawBsonRef::Document(d)) if first_key(d) == Some("$elemMatch") => {
                operators(path, d, v, depth + 1)?
            }
            Ok(_) => {}
            Err(_) => return v.visit(Event::Malformed),
        }
    }
    ControlFlow::Continue(())
}

/// `{$elemMatch: {$gt: 1}}` (value form: operators on the element) versus
/// `{$elemMatch: {b: 1}}` or `{$elemMatch: {$or: [...]}}` (query form: a filter on
/// element documents).
fn elem_match_is_value_form(d: &RawDocument) -> bool {
    match first_key(d) {
        Some(k) if k.starts_with('$') => !matches!(
            k,
            "$and" | "$or" | "$nor" | "$expr" | "$where" | "$text" | "$comment" | "$jsonSchema"
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    thread_local! {
        /// Walks filters through the bson crate's iteration only (the reference of the fast walk).
        pub(super) static ITER_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The events of `walk_filter`, stopping after `stop_after` of them, and its result.
    fn events(filter: &RawDocument, iter_only: bool, stop_after: usize) -> (Vec<String>, bool) {
        ITER_ONLY.with(|f| f.set(iter_only));
        let mut out = Vec::new();
        let flow = walk_filter(filter, &mut |e: Event<'_>| {
            out.push(format!("{e:?}"));
            if out.len() > stop_after {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        ITER_ONLY.with(|f| f.set(false));
        (out, flow.is_break())
    }

    /// The fast walk reports exactly the events of the bson crate's iteration, and stops where
    /// it does, on every corrupted or cut copy of a few filters.
    #[test]
    fn fast_walk_reports_what_the_bson_crate_walk_reports() {
        let re = || bson::Regex {
            pattern: "^a".to_owned().try_into().unwrap(),
            options: "i".to_owned().try_into().unwrap(),
        };
        let filters = [
            rawdoc! {
                "a": {"$ne": 1, "$exists": false}, "b": 5, "$where": "x", "c": {"d": 1},
                "e": {"$in": [1, 2], "$nin": ["x"]}, "$comment": "c", "f": [1, 2],
                "g": {"$elemMatch": {"h": {"$ne": 2}}}, "s": "ünï", "t": true,
            },
            rawdoc! {
                "_id": 5, "a": {"$not": {"$regex": "x", "$options": "m"}},
                "$or": [{"b": {"$ne": 1}}, {"c": 1}], "d": {"$exists": 0},
            },
            rawdoc! { "r": re(), "a": {"$ne": 1}, "$expr": {"$ne": ["$a", 1]}, "b": {"$all": [re()]} },
            rawdoc! { "_id": 5 },
        ];
        let mut checked = 0usize;
        for good in filters {
            checked += crate::wire::each_readable_variant(good.as_bytes(), |bytes, doc| {
                let (all, _) = events(doc, true, usize::MAX);
                for stop_after in [0, 1, 2, usize::MAX] {
                    assert_eq!(
                        events(doc, false, stop_after),
                        events(doc, true, stop_after),
                        "{bytes:?}, stopping after {stop_after} of {all:?}"
                    );
                }
            });
        }
        assert!(checked > 2_000, "{checked}");
    }
}
