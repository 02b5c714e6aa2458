//! Constant folding of aggregation expressions, for `$expr`.
//!
//! An expression is folded to a [`Val`] when its value does not depend on the document:
//! literals, `$literal`, the command's `let` variables, `$let`, the system variables that are
//! constant for one command (`$$NOW`, `$$CLUSTER_TIME`) or truthy for every document
//! (`$$ROOT`, `$$CURRENT`), `$cond`, `$ifNull`, `$and` / `$or` / `$not`, the comparisons (in
//! BSON's cross-type order, numbers compared exactly), and the type and conversion operators
//! on constants. Anything else (a field path, an unknown operator, an object expression) is
//! `None`: not folded. Folding never allocates; the `$let` scopes live on the stack.

use std::cmp::Ordering;

use bson::{RawBsonRef, RawDocument};

use super::number::{compare as compare_numbers, Num};
use super::Invalid;
use crate::policy::filter::{decimal_is_zero, MAX_DEPTH};

/// What folding knows about the command around the filter.
#[derive(Clone, Copy)]
pub(super) struct Env<'a> {
    /// The command's `let` variables.
    pub(super) let_vars: Option<&'a RawDocument>,
    /// Strings compare by their bytes (no collation, or the simple one). Otherwise no string
    /// comparison is folded: a collation may make `"a"` equal `"A"`.
    pub(super) simple_collation: bool,
}

/// The variables a `$let` binds, and the scope its variable expressions are evaluated in.
#[derive(Clone, Copy)]
struct Scope<'s, 'a> {
    vars: &'a RawDocument,
    parent: Option<&'s Scope<'s, 'a>>,
}

/// A folded value.
#[derive(Debug, Clone, Copy)]
enum Val<'a> {
    /// A constant written in the filter or the `let` (never a `$` path: those are not folded).
    Raw(RawBsonRef<'a>),
    /// `$$NOW`: one date for the whole command.
    Now,
    /// `$$CLUSTER_TIME`: one timestamp for the whole command.
    ClusterTime,
    /// `$$ROOT` / `$$CURRENT`: the document, whose content is unknown.
    Document,
    /// An array expression whose elements are all constants.
    Array,
}

/// The constant truthiness of `$expr`'s argument, when it has one. Aggregation truthiness:
/// `false`, `null`, `undefined`, missing and numeric zero are false; every other value (any
/// string, even empty; arrays; documents; dates) is true.
pub(super) fn expr_truth(
    expr: RawBsonRef<'_>,
    env: &Env<'_>,
    depth: usize,
) -> Result<Option<bool>, Invalid> {
    Ok(eval(expr, env, None, depth)?.and_then(truthy))
}

fn truthy(v: Val<'_>) -> Option<bool> {
    match v {
        Val::Raw(r) => literal_truth(r),
        Val::Now | Val::ClusterTime | Val::Document | Val::Array => Some(true),
    }
}

/// The truthiness of a constant value.
fn literal_truth(v: RawBsonRef<'_>) -> Option<bool> {
    match v {
        RawBsonRef::Boolean(b) => Some(b),
        RawBsonRef::Int32(n) => Some(n != 0),
        RawBsonRef::Int64(n) => Some(n != 0),
        RawBsonRef::Double(f) if f.is_nan() => None,
        RawBsonRef::Double(f) => Some(f != 0.0),
        RawBsonRef::Decimal128(d) => decimal_is_zero(d).map(|z| !z),
        RawBsonRef::Null | RawBsonRef::Undefined => Some(false),
        RawBsonRef::String(_)
        | RawBsonRef::Document(_)
        | RawBsonRef::Array(_)
        | RawBsonRef::ObjectId(_)
        | RawBsonRef::DateTime(_)
        | RawBsonRef::Timestamp(_)
        | RawBsonRef::Binary(_)
        | RawBsonRef::RegularExpression(_)
        | RawBsonRef::MinKey
        | RawBsonRef::MaxKey => Some(true),
        _ => None,
    }
}

type Folded<'a> = Result<Option<Val<'a>>, Invalid>;

/// Folds an expression. `Err` for a shape mongod rejects; `Ok(None)` when not constant.
fn eval<'a>(
    expr: RawBsonRef<'a>,
    env: &Env<'a>,
    scope: Option<&Scope<'_, 'a>>,
    depth: usize,
) -> Folded<'a> {
    if depth > MAX_DEPTH {
        return Err(Invalid);
    }
    match expr {
        RawBsonRef::String(s) if s.starts_with("$$") => variable(s, env, scope, depth),
        RawBsonRef::String(s) if s.starts_with('$') => Ok(None), // a field path
        RawBsonRef::Document(d) => operator(d, env, scope, depth),
        // An array expression evaluates to an array, provided evaluating it cannot fail:
        // every element a constant.
        RawBsonRef::Array(items) => {
            for item in items {
                if eval(item.map_err(|_| Invalid)?, env, scope, depth + 1)?.is_none() {
                    return Ok(None);
                }
            }
            Ok(Some(Val::Array))
        }
        other => Ok(Some(Val::Raw(other))),
    }
}

/// `$$name`: a `$let` variable (innermost first; `$let` may rebind `CURRENT`), a system
/// variable, or a variable of the command's `let`. `$$name.path` is not folded.
fn variable<'a>(
    s: &'a str,
    env: &Env<'a>,
    scope: Option<&Scope<'_, 'a>>,
    depth: usize,
) -> Folded<'a> {
    let name = s.get(2..).unwrap_or("");
    if name.contains('.') || name.is_empty() {
        return Ok(None);
    }
    let mut at = scope;
    while let Some(sc) = at {
        if let Ok(Some(value)) = sc.vars.get(name) {
            // A `$let` variable is evaluated in the scope around that `$let`.
            return eval(value, env, sc.parent, depth + 1);
        }
        at = sc.parent;
    }
    match name {
        "NOW" => return Ok(Some(Val::Now)),
        "CLUSTER_TIME" => return Ok(Some(Val::ClusterTime)),
        "ROOT" | "CURRENT" => return Ok(Some(Val::Document)),
        _ => {}
    }
    match env.let_vars.map(|l| l.get(name)) {
        // The command's `let` is evaluated once, with no document; a reference from one of
        // its variables to another is not folded (nor can it loop).
        Some(Ok(Some(value))) => {
            let outer = Env {
                let_vars: None,
                ..*env
            };
            eval(value, &outer, None, depth + 1)
        }
        _ => Ok(None),
    }
}

/// The single argument of a one-argument operator: `{$op: x}` or `{$op: [x]}`.
fn single(arg: RawBsonRef<'_>) -> Result<RawBsonRef<'_>, Invalid> {
    match arg {
        RawBsonRef::Array(a) => {
            let mut it = a.into_iter();
            match (it.next(), it.next()) {
                (Some(v), None) => v.map_err(|_| Invalid),
                _ => Err(Invalid),
            }
        }
        other => Ok(other),
    }
}

/// The two arguments of a comparison.
fn pair(arg: RawBsonRef<'_>) -> Result<(RawBsonRef<'_>, RawBsonRef<'_>), Invalid> {
    let RawBsonRef::Array(a) = arg else {
        return Err(Invalid);
    };
    let mut it = a.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(x), Some(y), None) => Ok((x.map_err(|_| Invalid)?, y.map_err(|_| Invalid)?)),
        _ => Err(Invalid),
    }
}

fn boolean<'a>(b: Option<bool>) -> Option<Val<'a>> {
    b.map(|b| Val::Raw(RawBsonRef::Boolean(b)))
}

fn operator<'a>(
    d: &'a RawDocument,
    env: &Env<'a>,
    scope: Option<&Scope<'_, 'a>>,
    depth: usize,
) -> Folded<'a> {
    let mut elems = d.iter_elements();
    let Some(first) = elems.next() else {
        // `{}`: an empty object expression evaluates to `{}`.
        return Ok(Some(Val::Raw(RawBsonRef::Document(d))));
    };
    let first = first.map_err(|_| Invalid)?;
    let key = first.key().as_str();
    if !key.starts_with('$') {
        return Ok(None); // an object expression; not folded
    }
    if elems.next().is_some() {
        return Err(Invalid); // an expression object has exactly one operator
    }
    let arg = first.value().map_err(|_| Invalid)?;
    let next = depth + 1;
    let truth_of = |e: RawBsonRef<'a>| -> Result<Option<bool>, Invalid> {
        Ok(eval(e, env, scope, next)?.and_then(truthy))
    };
    Ok(match key {
        "$literal" => Some(Val::Raw(arg)),
        "$and" | "$or" => {
            let is_and = key == "$and";
            let RawBsonRef::Array(args) = arg else {
                return Ok(boolean(truth_of(arg)?));
            };
            // An empty `$and` is true and an empty `$or` false, as in mongod.
            let (mut acc, absorbing) = (Some(is_and), !is_and);
            for a in args {
                match truth_of(a.map_err(|_| Invalid)?)? {
                    Some(b) if b == absorbing => return Ok(boolean(Some(absorbing))),
                    Some(_) => {}
                    None => acc = None,
                }
            }
            boolean(acc)
        }
        "$not" => boolean(truth_of(single(arg)?)?.map(|b| !b)),
        "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" => {
            let (a, b) = pair(arg)?;
            let (Some(a), Some(b)) = (eval(a, env, scope, next)?, eval(b, env, scope, next)?)
            else {
                return Ok(None);
            };
            let Some(ord) = compare(a, b, env.simple_collation) else {
                return Ok(None);
            };
            match key {
                "$cmp" => Some(Val::Raw(RawBsonRef::Int32(match ord {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                }))),
                "$eq" => boolean(Some(ord.is_eq())),
                "$ne" => boolean(Some(!ord.is_eq())),
                "$gt" => boolean(Some(ord.is_gt())),
                "$gte" => boolean(Some(ord.is_ge())),
                "$lt" => boolean(Some(ord.is_lt())),
                _ => boolean(Some(ord.is_le())),
            }
        }
        "$cond" => cond(arg, env, scope, next)?,
        "$ifNull" => {
            let RawBsonRef::Array(args) = arg else {
                return Err(Invalid);
            };
            let mut last = None;
            let mut count = 0usize;
            for a in args {
                count += 1;
                let v = eval(a.map_err(|_| Invalid)?, env, scope, next)?;
                match v {
                    None => return Ok(None),
                    Some(v) if !is_nullish(v) => return Ok(Some(v)),
                    Some(v) => last = Some(v),
                }
            }
            if count < 2 {
                return Err(Invalid);
            }
            // Every input null: the replacement (the last argument) as it is.
            last
        }
        "$let" => {
            let RawBsonRef::Document(spec) = arg else {
                return Err(Invalid);
            };
            let (Ok(Some(RawBsonRef::Document(vars))), Ok(Some(body))) =
                (spec.get("vars"), spec.get("in"))
            else {
                return Err(Invalid);
            };
            let inner = Scope {
                vars,
                parent: scope,
            };
            eval(body, env, Some(&inner), next)?
        }
        "$type" => eval(single(arg)?, env, scope, next)?
            .and_then(type_name)
            .map(|n| Val::Raw(RawBsonRef::String(n))),
        "$isNumber" => eval(single(arg)?, env, scope, next)?
            .map(|v| matches!(v, Val::Raw(r) if Num::of(r).is_some()))
            .map(|b| Val::Raw(RawBsonRef::Boolean(b))),
        "$isArray" => eval(single(arg)?, env, scope, next)?
            .map(|v| matches!(v, Val::Array | Val::Raw(RawBsonRef::Array(_))))
            .map(|b| Val::Raw(RawBsonRef::Boolean(b))),
        "$toBool" => match eval(single(arg)?, env, scope, next)? {
            Some(v) if is_nullish(v) => Some(Val::Raw(RawBsonRef::Null)),
            Some(v) => boolean(truthy(v)),
            None => None,
        },
        "$toInt" | "$toLong" | "$toDouble" => match eval(single(arg)?, env, scope, next)? {
            Some(Val::Raw(r)) => convert(key, r).map(Val::Raw),
            _ => None,
        },
        _ => None,
    })
}

/// `{$cond: [if, then, else]}` or `{$cond: {if, then, else}}`.
fn cond<'a>(
    arg: RawBsonRef<'a>,
    env: &Env<'a>,
    scope: Option<&Scope<'_, 'a>>,
    depth: usize,
) -> Folded<'a> {
    let (test, then, otherwise) = match arg {
        RawBsonRef::Array(a) => {
            let mut it = a.into_iter();
            match (it.next(), it.next(), it.next(), it.next()) {
                (Some(i), Some(t), Some(e), None) => (
                    i.map_err(|_| Invalid)?,
                    t.map_err(|_| Invalid)?,
                    e.map_err(|_| Invalid)?,
                ),
                _ => return Err(Invalid),
            }
        }
        RawBsonRef::Document(d) => {
            let mut parts = (None, None, None);
            for e in d.iter_elements() {
                let e = e.map_err(|_| Invalid)?;
                let v = e.value().map_err(|_| Invalid)?;
                match e.key().as_str() {
                    "if" => parts.0 = Some(v),
                    "then" => parts.1 = Some(v),
                    "else" => parts.2 = Some(v),
                    _ => return Err(Invalid),
                }
            }
            match parts {
                (Some(i), Some(t), Some(e)) => (i, t, e),
                _ => return Err(Invalid),
            }
        }
        _ => return Err(Invalid),
    };
    match eval(test, env, scope, depth)?.and_then(truthy) {
        Some(true) => eval(then, env, scope, depth),
        Some(false) => eval(otherwise, env, scope, depth),
        None => Ok(None),
    }
}

fn is_nullish(v: Val<'_>) -> bool {
    matches!(v, Val::Raw(RawBsonRef::Null | RawBsonRef::Undefined))
}

/// `$toInt` / `$toLong` / `$toDouble` of a number, a bool or null, when the result is exact
/// or well defined (a double truncates toward zero for the integer targets). Out of range,
/// strings, dates and the rest are not folded.
fn convert<'a>(op: &str, v: RawBsonRef<'a>) -> Option<RawBsonRef<'a>> {
    let int = match v {
        RawBsonRef::Null => return Some(RawBsonRef::Null),
        RawBsonRef::Boolean(b) => i64::from(b),
        RawBsonRef::Int32(n) => i64::from(n),
        RawBsonRef::Int64(n) => n,
        RawBsonRef::Double(f) if op == "$toDouble" => return Some(RawBsonRef::Double(f)),
        RawBsonRef::Double(f) if f.is_finite() && f.abs() < 9.0e15 => f.trunc() as i64,
        _ => return None,
    };
    match op {
        "$toInt" => i32::try_from(int).ok().map(RawBsonRef::Int32),
        "$toLong" => Some(RawBsonRef::Int64(int)),
        _ => Some(RawBsonRef::Double(int as f64)),
    }
}

/// `$type`'s answer for a folded value.
fn type_name(v: Val<'_>) -> Option<&'static str> {
    Some(match v {
        Val::Now => "date",
        Val::ClusterTime => "timestamp",
        Val::Document => "object",
        Val::Array => "array",
        Val::Raw(r) => match r {
            RawBsonRef::Double(_) => "double",
            RawBsonRef::String(_) => "string",
            RawBsonRef::Document(_) => "object",
            RawBsonRef::Array(_) => "array",
            RawBsonRef::Binary(_) => "binData",
            RawBsonRef::Undefined => "undefined",
            RawBsonRef::ObjectId(_) => "objectId",
            RawBsonRef::Boolean(_) => "bool",
            RawBsonRef::DateTime(_) => "date",
            RawBsonRef::Null => "null",
            RawBsonRef::RegularExpression(_) => "regex",
            RawBsonRef::JavaScriptCode(_) => "javascript",
            RawBsonRef::Int32(_) => "int",
            RawBsonRef::Timestamp(_) => "timestamp",
            RawBsonRef::Int64(_) => "long",
            RawBsonRef::Decimal128(_) => "decimal",
            RawBsonRef::MinKey => "minKey",
            RawBsonRef::MaxKey => "maxKey",
            _ => return None,
        },
    })
}

/// The place of a value's type in BSON's cross-type order (mongod's `canonicalizeBSONType`):
/// MinKey < null < numbers < strings < objects < arrays < binary < ObjectId < bool < date
/// < timestamp < regex < MaxKey. `None` for the types left out (undefined, symbol, code,
/// DBPointer).
fn rank(v: Val<'_>) -> Option<u8> {
    Some(match v {
        Val::Now => 45,
        Val::ClusterTime => 47,
        Val::Document => 20,
        Val::Array => 25,
        Val::Raw(r) => match r {
            RawBsonRef::MinKey => 0,
            RawBsonRef::Null => 5,
            RawBsonRef::Int32(_)
            | RawBsonRef::Int64(_)
            | RawBsonRef::Double(_)
            | RawBsonRef::Decimal128(_) => 10,
            RawBsonRef::String(_) => 15,
            RawBsonRef::Document(_) => 20,
            RawBsonRef::Array(_) => 25,
            RawBsonRef::Binary(_) => 30,
            RawBsonRef::ObjectId(_) => 35,
            RawBsonRef::Boolean(_) => 40,
            RawBsonRef::DateTime(_) => 45,
            RawBsonRef::Timestamp(_) => 47,
            RawBsonRef::RegularExpression(_) => 50,
            RawBsonRef::MaxKey => 127,
            _ => return None,
        },
    })
}

/// How two folded values compare in `$expr`: first by type (cross-type order, which no
/// collation changes), then by value for the kinds modelled here. Strings only under the
/// simple collation.
fn compare(a: Val<'_>, b: Val<'_>, simple_collation: bool) -> Option<Ordering> {
    let (ra, rb) = (rank(a)?, rank(b)?);
    if ra != rb {
        return Some(ra.cmp(&rb));
    }
    match (a, b) {
        (Val::Now, Val::Now) | (Val::ClusterTime, Val::ClusterTime) => Some(Ordering::Equal),
        (Val::Raw(x), Val::Raw(y)) => match (x, y) {
            (RawBsonRef::Null, RawBsonRef::Null)
            | (RawBsonRef::MinKey, RawBsonRef::MinKey)
            | (RawBsonRef::MaxKey, RawBsonRef::MaxKey) => Some(Ordering::Equal),
            (RawBsonRef::String(s), RawBsonRef::String(t)) if simple_collation => {
                Some(s.as_bytes().cmp(t.as_bytes()))
            }
            (RawBsonRef::Boolean(s), RawBsonRef::Boolean(t)) => Some(s.cmp(&t)),
            (RawBsonRef::DateTime(s), RawBsonRef::DateTime(t)) => {
                Some(s.timestamp_millis().cmp(&t.timestamp_millis()))
            }
            _ => compare_numbers(Num::of(x)?, Num::of(y)?),
        },
        _ => None,
    }
}
