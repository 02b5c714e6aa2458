//! The aggregation side of the walk: expressions (`$expr`, stage specifications) and
//! pipelines with their sub-pipelines.

use std::ops::ControlFlow;

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{filter_doc, regex, Event, Visitor};
use crate::policy::filter::MAX_DEPTH;

pub(super) fn expression<'a>(
    expr: RawBsonRef<'a>,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    if depth > MAX_DEPTH {
        return v.visit(Event::TooDeep);
    }
    match expr {
        RawBsonRef::Array(items) => {
            for item in items {
                let Ok(item) = item else {
                    return v.visit(Event::Malformed);
                };
                expression(item, v, depth + 1)?;
            }
        }
        RawBsonRef::Document(d) => {
            for elem in d.iter_elements() {
                let Ok(elem) = elem else {
                    return v.visit(Event::Malformed);
                };
                let Ok(arg) = elem.value() else {
                    return v.visit(Event::Malformed);
                };
                match elem.key().as_str() {
                    "$literal" => continue,
                    "$function" => v.visit(Event::JsFunction { op: "$function" })?,
                    "$accumulator" => v.visit(Event::JsFunction { op: "$accumulator" })?,
                    "$where" => v.visit(Event::Where)?,
                    "$ne" => v.visit(Event::Negation {
                        op: "$ne",
                        path: first_arg_path(arg),
                    })?,
                    "$not" => v.visit(Event::Negation {
                        op: "$not",
                        path: first_arg_path(arg),
                    })?,
                    "$regexMatch" | "$regexFind" | "$regexFindAll" => regex_operator(arg, v)?,
                    "$in" => expr_in(arg, v)?,
                    _ => {}
                }
                expression(arg, v, depth + 1)?;
            }
        }
        _ => {}
    }
    ControlFlow::Continue(())
}

/// `"$field"` → `field`; anything else (a constant, a `$$variable`, a sub-expression) → `""`.
fn expr_path(v: RawBsonRef<'_>) -> &str {
    match v {
        RawBsonRef::String(s) if !s.starts_with("$$") => s.strip_prefix('$').unwrap_or(""),
        _ => "",
    }
}

fn first_arg_path(arg: RawBsonRef<'_>) -> &str {
    match arg {
        RawBsonRef::Array(a) => match a.into_iter().next() {
            Some(Ok(first)) => expr_path(first),
            _ => "",
        },
        other => expr_path(other),
    }
}

/// `{$in: [<expr>, [<values>]]}`: the list length when it is a literal array.
fn expr_in<'a>(arg: RawBsonRef<'a>, v: &mut impl Visitor<'a>) -> ControlFlow<()> {
    let RawBsonRef::Array(args) = arg else {
        return v.visit(Event::Malformed);
    };
    let mut it = args.into_iter();
    match (it.next(), it.next()) {
        (Some(Ok(x)), Some(Ok(RawBsonRef::Array(list)))) => {
            let len = list.into_iter().count();
            v.visit(Event::InList {
                op: "$in",
                len,
                path: expr_path(x),
            })
        }
        (Some(Ok(_)), Some(Ok(_))) => ControlFlow::Continue(()), // a computed list
        _ => v.visit(Event::Malformed),
    }
}

/// `{$regexMatch: {input, regex, options}}`.
fn regex_operator<'a>(arg: RawBsonRef<'a>, v: &mut impl Visitor<'a>) -> ControlFlow<()> {
    let RawBsonRef::Document(spec) = arg else {
        return v.visit(Event::Malformed);
    };
    let (Ok(input), Ok(re), Ok(opts)) = (spec.get("input"), spec.get("regex"), spec.get("options"))
    else {
        return v.visit(Event::Malformed);
    };
    let path = input.map_or("", expr_path);
    let options = match opts {
        Some(RawBsonRef::String(s)) if !s.starts_with('$') => s,
        None => "",
        Some(_) => "i", // computed options: assume the worst
    };
    match re {
        Some(RawBsonRef::String(p)) if !p.starts_with('$') => v.visit(Event::Regex {
            pattern: p,
            options,
            path,
        }),
        Some(RawBsonRef::RegularExpression(r)) => {
            v.visit(regex(r, path))?;
            if !options.is_empty() && options != r.options.as_str() {
                v.visit(Event::Regex {
                    pattern: r.pattern.as_str(),
                    options,
                    path,
                })?;
            }
            ControlFlow::Continue(())
        }
        _ => v.visit(Event::Regex {
            pattern: "",
            options,
            path,
        }),
    }
}

pub(super) fn stages<'a>(
    pipeline: &'a RawArray,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    if depth > MAX_DEPTH {
        return v.visit(Event::TooDeep);
    }
    for stage in pipeline {
        let Ok(RawBsonRef::Document(stage)) = stage else {
            return v.visit(Event::Malformed);
        };
        for elem in stage.iter_elements() {
            let Ok(elem) = elem else {
                return v.visit(Event::Malformed);
            };
            let Ok(spec) = elem.value() else {
                return v.visit(Event::Malformed);
            };
            match (elem.key().as_str(), spec) {
                ("$match", RawBsonRef::Document(f)) => filter_doc(f, v, depth + 1)?,
                ("$match", _) => v.visit(Event::Malformed)?,
                ("$facet", RawBsonRef::Document(facets)) => {
                    for facet in facets {
                        match facet {
                            Ok((_, RawBsonRef::Array(p))) => stages(p, v, depth + 1)?,
                            _ => v.visit(Event::Malformed)?,
                        }
                    }
                }
                (
                    "$lookup" | "$unionWith" | "$graphLookup" | "$geoNear" | "$merge",
                    RawBsonRef::Document(spec),
                ) => stage_spec(spec, v, depth + 1)?,
                // Atlas Search stages have their own operator language.
                ("$search" | "$searchMeta" | "$vectorSearch", _) => {}
                (_, spec) => expression(spec, v, depth + 1)?,
            }
        }
    }
    ControlFlow::Continue(())
}

/// The fields of a stage that embeds filters or pipelines.
fn stage_spec<'a>(
    spec: &'a RawDocument,
    v: &mut impl Visitor<'a>,
    depth: usize,
) -> ControlFlow<()> {
    if depth > MAX_DEPTH {
        return v.visit(Event::TooDeep);
    }
    for field in spec {
        let Ok((key, value)) = field else {
            return v.visit(Event::Malformed);
        };
        match (key.as_str(), value) {
            ("pipeline" | "whenMatched", RawBsonRef::Array(p)) => stages(p, v, depth + 1)?,
            ("query" | "restrictSearchWithMatch", RawBsonRef::Document(f)) => {
                filter_doc(f, v, depth + 1)?
            }
            (_, value) => expression(value, v, depth + 1)?,
        }
    }
    ControlFlow::Continue(())
}
