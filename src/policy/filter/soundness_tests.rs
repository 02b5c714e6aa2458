//! Soundness of the prover, as a property: every claim it makes holds on every generated
//! document, judged by a small reference matcher written for this test.
//!
//! - `all` proved: the filter matches every document;
//! - `none` proved: it matches no document;
//! - `bare` decided: it matches (or not) every document holding only an `_id`;
//! - verdict `narrow`: some document is rejected (the document `{_id: MinKey}`, which lacks
//!   every field and whose `_id` equals no selective literal).
//!
//! The reference matcher follows mongod's match semantics as far as the generated grammar
//! reaches: implicit array traversal on a path (an array value is tested as a whole and
//! element by element), a missing field compared as mongod's EOO (equal to `null` for
//! `$eq` / `$lte` / `$gte`; above MinKey and below MaxKey, from
//! `ComparisonMatchExpression::matchesSingleElement` in
//! src/mongo/db/matcher/expression_leaf.cpp), type bracketing (a comparison across
//! canonical types matches nothing except the MinKey / MaxKey cases), NaN equal only to NaN,
//! `$ne` / `$nin` / `$not` / `$exists: false` as negations
//! (src/mongo/db/matcher/expression_parser.cpp), numbers compared exactly by value, and the
//! aggregation expressions `$expr` may hold (src/mongo/db/pipeline/expression.cpp). Through
//! an array of non-documents a dotted path yields no element at all, the least favourable
//! reading for a prover. A string comparison under the generated non-simple collation is
//! case-insensitive. An expression that fails (an undefined variable, a failed conversion)
//! makes the whole match fail, as mongod fails the write; such documents are skipped.

use std::cmp::Ordering;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Decimal128, Document, RawDocumentBuf, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::tautology::claims;
use super::verdict::{verdict, FilterFacts, Verdict};

// ------------------------------------------------------------------------------------------
// Exact numbers: every number as an exact decimal, compared digit by digit.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Exact {
    NaN,
    NegInf,
    /// `(-1)^neg * 0.digits * 10^exp`; `digits` has no leading or trailing zero (empty: 0).
    Finite {
        neg: bool,
        digits: String,
        exp: i64,
    },
    PosInf,
}

/// A decimal written `[-]d[.ddd][E±x]` as an exact value.
fn from_sci(text: &str) -> Exact {
    let (neg, t) = match text.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    match t {
        "NaN" => return Exact::NaN,
        "Infinity" | "inf" => return if neg { Exact::NegInf } else { Exact::PosInf },
        _ => {}
    }
    let (mant, e10) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i64>().unwrap()),
        None => (t, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let all = format!("{int}{frac}");
    // value = all * 10^(e10 - frac.len()) = 0.all * 10^(all.len() + e10 - frac.len())
    let mut exp = all.len() as i64 + e10 - frac.len() as i64;
    let trimmed = all.trim_start_matches('0');
    exp -= (all.len() - trimmed.len()) as i64;
    let digits = trimmed.trim_end_matches('0').to_string();
    if digits.is_empty() {
        exp = 0;
    }
    Exact::Finite { neg, digits, exp }
}

fn exact(b: &Bson) -> Option<Exact> {
    Some(match b {
        Bson::Int32(n) => from_sci(&n.to_string()),
        Bson::Int64(n) => from_sci(&n.to_string()),
        Bson::Double(f) if f.is_nan() => Exact::NaN,
        Bson::Double(f) if f.is_infinite() => {
            if *f < 0.0 {
                Exact::NegInf
            } else {
                Exact::PosInf
            }
        }
        // Rust formats a double with a given precision exactly (800 digits is more than any
        // double's exact expansion needs).
        Bson::Double(f) => from_sci(&format!("{f:.800e}")),
        Bson::Decimal128(d) => from_sci(&d.to_string()),
        _ => return None,
    })
}

fn sign(e: &Exact) -> i32 {
    match e {
        Exact::Finite { digits, .. } if digits.is_empty() => 0,
        Exact::Finite { neg: true, .. } | Exact::NegInf => -1,
        _ => 1,
    }
}

/// The order of two non-NaN numbers.
fn cmp_exact(a: &Exact, b: &Exact) -> Ordering {
    let rank = |e: &Exact| match e {
        Exact::NegInf => 0,
        Exact::PosInf => 2,
        _ => 1,
    };
    if rank(a) != 1 || rank(b) != 1 {
        return rank(a).cmp(&rank(b));
    }
    let (sa, sb) = (sign(a), sign(b));
    if sa != sb || sa == 0 {
        return sa.cmp(&sb);
    }
    let (
        Exact::Finite {
            digits: da,
            exp: ea,
            ..
        },
        Exact::Finite {
            digits: db,
            exp: eb,
            ..
        },
    ) = (a, b)
    else {
        unreachable!()
    };
    let magnitude = ea.cmp(eb).then_with(|| da.as_str().cmp(db.as_str()));
    if sa < 0 {
        magnitude.reverse()
    } else {
        magnitude
    }
}

// ------------------------------------------------------------------------------------------
// BSON order.

/// mongod's `canonicalizeBSONType` (the missing field, EOO, is 0 like undefined).
fn canon(b: &Bson) -> i32 {
    match b {
        Bson::MinKey => -1,
        Bson::Undefined => 0,
        Bson::Null => 5,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 10,
        Bson::String(_) | Bson::Symbol(_) => 15,
        Bson::Document(_) => 20,
        Bson::Array(_) => 25,
        Bson::Binary(_) => 30,
        Bson::ObjectId(_) => 35,
        Bson::Boolean(_) => 40,
        Bson::DateTime(_) => 45,
        Bson::Timestamp(_) => 47,
        Bson::RegularExpression(_) => 50,
        Bson::DbPointer(_) => 55,
        Bson::JavaScriptCode(_) => 60,
        Bson::JavaScriptCodeWithScope(_) => 65,
        Bson::MaxKey => 127,
    }
}

fn is_nan(b: &Bson) -> bool {
    exact(b) == Some(Exact::NaN)
}

/// A total BSON order (sort order: NaN below every other number).
fn bson_cmp(a: &Bson, b: &Bson, ci: bool) -> Ordering {
    let (ca, cb) = (canon(a), canon(b));
    if ca != cb {
        return ca.cmp(&cb);
    }
    match (a, b) {
        _ if ca == 10 => match (exact(a).unwrap(), exact(b).unwrap()) {
            (Exact::NaN, Exact::NaN) => Ordering::Equal,
            (Exact::NaN, _) => Ordering::Less,
            (_, Exact::NaN) => Ordering::Greater,
            (x, y) => cmp_exact(&x, &y),
        },
        (Bson::String(x), Bson::String(y)) => {
            if ci {
                x.to_lowercase().cmp(&y.to_lowercase())
            } else {
                x.as_bytes().cmp(y.as_bytes())
            }
        }
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.cmp(y),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Array(x), Bson::Array(y)) => {
            for (p, q) in x.iter().zip(y) {
                let o = bson_cmp(p, q, ci);
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Document(x), Bson::Document(y)) => {
            for ((kx, vx), (ky, vy)) in x.iter().zip(y) {
                let o = canon(vx)
                    .cmp(&canon(vy))
                    .then_with(|| kx.cmp(ky))
                    .then_with(|| bson_cmp(vx, vy, ci));
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        _ => Ordering::Equal, // null, MinKey, MaxKey
    }
}

// ------------------------------------------------------------------------------------------
// The match language.

#[derive(Debug)]
struct Failed;

type R<T> = Result<T, Failed>;

#[derive(Clone, Copy)]
struct Ctx<'a> {
    let_vars: &'a Document,
    /// A case-insensitive (non-simple) collation.
    ci: bool,
}

/// One element a path yields: the missing field, or a value (`whole`: the field's value
/// itself, not an element of a leaf array).
#[derive(Clone, Copy, Debug)]
enum Cand<'a> {
    Missing,
    Val(&'a Bson, bool),
}

fn candidates<'a>(v: Option<&'a Bson>, rest: &[&str], out: &mut Vec<Cand<'a>>) {
    let Some((first, tail)) = rest.split_first() else {
        match v {
            None => out.push(Cand::Missing),
            Some(Bson::Array(items)) => {
                out.push(Cand::Val(v.unwrap(), true));
                out.extend(items.iter().map(|e| Cand::Val(e, false)));
            }
            Some(x) => out.push(Cand::Val(x, true)),
        }
        return;
    };
    match v {
        None => out.push(Cand::Missing),
        Some(Bson::Document(d)) => candidates(d.get(*first), tail, out),
        Some(Bson::Array(items)) => {
            if let Ok(i) = first.parse::<usize>() {
                if let Some(e) = items.get(i) {
                    candidates(Some(e), tail, out);
                }
            }
            for e in items {
                if let Bson::Document(d) = e {
                    candidates(d.get(*first), tail, out);
                }
            }
        }
        Some(_) => out.push(Cand::Missing),
    }
}

fn path_candidates<'a>(doc: &'a Document, path: &str) -> Vec<Cand<'a>> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    candidates(doc.get(parts[0]), &parts[1..], &mut out);
    out
}

/// `$eq` / `$lt` / ... of one candidate, after mongod's ComparisonMatchExpression.
fn compare_leaf(op: &str, rhs: &Bson, c: Cand<'_>, ci: bool) -> bool {
    let (lc, lhs) = match c {
        Cand::Missing => (0, None),
        Cand::Val(v, _) => (canon(v), Some(v)),
    };
    let rc = canon(rhs);
    if lc != rc {
        if lc + rc == 5 {
            return lhs.is_none() && matches!(op, "$eq" | "$lte" | "$gte");
        }
        return matches!(
            (op, rhs),
            ("$lt" | "$lte", Bson::MaxKey) | ("$gt" | "$gte", Bson::MinKey)
        );
    }
    let Some(lhs) = lhs else { return false };
    if is_nan(lhs) || is_nan(rhs) {
        let both = is_nan(lhs) && is_nan(rhs);
        return both && matches!(op, "$eq" | "$lte" | "$gte");
    }
    let o = bson_cmp(lhs, rhs, ci);
    match op {
        "$eq" => o.is_eq(),
        "$lt" => o.is_lt(),
        "$lte" => o.is_le(),
        "$gt" => o.is_gt(),
        _ => o.is_ge(),
    }
}

fn type_matches(alias: &Bson, v: &Bson) -> bool {
    let name = match alias {
        Bson::String(s) => s.as_str(),
        Bson::Int32(4) => "array",
        Bson::Int32(2) => "string",
        Bson::Int32(10) => "null",
        other => panic!("type alias {other}"),
    };
    match name {
        "number" => canon(v) == 10,
        "array" => matches!(v, Bson::Array(_)),
        "string" => matches!(v, Bson::String(_)),
        "null" => matches!(v, Bson::Null),
        "minKey" => matches!(v, Bson::MinKey),
        "object" => matches!(v, Bson::Document(_)),
        "bool" => matches!(v, Bson::Boolean(_)),
        "double" => matches!(v, Bson::Double(_)),
        "long" => matches!(v, Bson::Int64(_)),
        "decimal" => matches!(v, Bson::Decimal128(_)),
        other => panic!("type {other}"),
    }
}

/// One operator (never `$not`, `$ne`, `$nin`, `$exists`) on one candidate.
fn leaf(op: &str, arg: &Bson, c: Cand<'_>, ctx: Ctx<'_>) -> bool {
    match op {
        "$eq" | "$gt" | "$gte" | "$lt" | "$lte" => compare_leaf(op, arg, c, ctx.ci),
        "$in" => arg
            .as_array()
            .unwrap()
            .iter()
            .any(|v| compare_leaf("$eq", v, c, ctx.ci)),
        "$type" => match c {
            Cand::Val(v, _) => match arg {
                Bson::Array(list) => list.iter().any(|a| type_matches(a, v)),
                a => type_matches(a, v),
            },
            Cand::Missing => false,
        },
        "$size" => matches!(c, Cand::Val(Bson::Array(a), true)
            if Some(a.len() as i64) == arg.as_i32().map(i64::from)),
        "$all" => false, // only `$all: []` is generated: it matches nothing
        other => panic!("operator {other}"),
    }
}

/// Some candidate of the path satisfies `op`.
fn path_match(doc: &Document, path: &str, op: &str, arg: &Bson, ctx: Ctx<'_>) -> bool {
    path_candidates(doc, path)
        .into_iter()
        .any(|c| leaf(op, arg, c, ctx))
}

fn truthy_query(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Null => false,
        other => exact(other).is_none_or(|e| sign(&e) != 0 || e == Exact::NaN),
    }
}

/// The operators on one path: a conjunction.
fn ops_match(doc: &Document, path: &str, ops: &Document, ctx: Ctx<'_>) -> bool {
    ops.iter().all(|(op, arg)| match op.as_str() {
        "$ne" => !path_match(doc, path, "$eq", arg, ctx),
        "$nin" => !path_match(doc, path, "$in", arg, ctx),
        "$exists" => {
            let exists = path_candidates(doc, path)
                .into_iter()
                .any(|c| matches!(c, Cand::Val(..)));
            exists == truthy_query(arg)
        }
        "$not" => !ops_match(doc, path, arg.as_document().unwrap(), ctx),
        op => path_match(doc, path, op, arg, ctx),
    })
}

fn matches(filter: &Document, doc: &Document, ctx: Ctx<'_>) -> R<bool> {
    for (k, v) in filter {
        let ok = match k.as_str() {
            "$comment" => true,
            "$and" | "$or" | "$nor" => {
                let mut results = Vec::new();
                for b in v.as_array().unwrap() {
                    results.push(matches(b.as_document().unwrap(), doc, ctx)?);
                }
                match k.as_str() {
                    "$and" => results.iter().all(|r| *r),
                    "$or" => results.iter().any(|r| *r),
                    _ => !results.iter().any(|r| *r),
                }
            }
            "$expr" => truthy(&eval(v, doc, &[], ctx)?),
            path => match v {
                Bson::Document(ops) if ops.keys().next().is_some_and(|k| k.starts_with('$')) => {
                    ops_match(doc, path, ops, ctx)
                }
                literal => path_match(doc, path, "$eq", literal, ctx),
            },
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

// ------------------------------------------------------------------------------------------
// Aggregation expressions.

/// A value, or missing.
#[derive(Debug, Clone)]
enum V {
    Missing,
    B(Bson),
}

const NOW: i64 = 1_764_000_000_000;

fn truthy(v: &V) -> bool {
    match v {
        V::Missing => false,
        V::B(b) => truthy_query(b) && !matches!(b, Bson::Undefined),
    }
}

fn nullish(v: &V) -> bool {
    matches!(v, V::Missing | V::B(Bson::Null | Bson::Undefined))
}

fn agg_cmp(a: &V, b: &V, ci: bool) -> Ordering {
    match (a, b) {
        (V::Missing, V::Missing) => Ordering::Equal,
        (V::Missing, V::B(y)) => 0.cmp(&canon(y)).then(Ordering::Less),
        (V::B(x), V::Missing) => canon(x).cmp(&0).then(Ordering::Greater),
        (V::B(x), V::B(y)) => bson_cmp(x, y, ci),
    }
}

fn field(doc: &Document, path: &str) -> V {
    let mut cur = Bson::Document(doc.clone());
    for part in path.split('.') {
        cur = match cur {
            Bson::Document(d) => match d.get(part) {
                Some(v) => v.clone(),
                None => return V::Missing,
            },
            Bson::Array(items) => Bson::Array(
                items
                    .iter()
                    .filter_map(|e| e.as_document().and_then(|d| d.get(part)).cloned())
                    .collect(),
            ),
            _ => return V::Missing,
        };
    }
    V::B(cur)
}

fn args(arg: &Bson) -> Vec<&Bson> {
    match arg {
        Bson::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

fn one(arg: &Bson) -> R<&Bson> {
    let a = args(arg);
    if a.len() == 1 {
        Ok(a[0])
    } else {
        Err(Failed)
    }
}

fn eval(e: &Bson, doc: &Document, scope: &[(String, V)], ctx: Ctx<'_>) -> R<V> {
    match e {
        Bson::String(s) if s.starts_with("$$") => {
            let name = &s[2..];
            if let Some((_, v)) = scope.iter().rev().find(|(n, _)| n == name) {
                return Ok(v.clone());
            }
            match name {
                "NOW" => Ok(V::B(Bson::DateTime(DateTime::from_millis(NOW)))),
                "CLUSTER_TIME" => Ok(V::B(Bson::Timestamp(Timestamp {
                    time: 1_764_000_000,
                    increment: 1,
                }))),
                "ROOT" | "CURRENT" => Ok(V::B(Bson::Document(doc.clone()))),
                // The command's `let` is evaluated with no document and, here, no other
                // variable of the `let` (a reference to one fails).
                _ => match ctx.let_vars.get(name) {
                    Some(v) => {
                        let empty = Document::new();
                        let outer = Ctx {
                            let_vars: &empty,
                            ..ctx
                        };
                        eval(v, &Document::new(), &[], outer)
                    }
                    None => Err(Failed),
                },
            }
        }
        Bson::String(s) if s.starts_with('$') => Ok(field(doc, &s[1..])),
        Bson::Array(items) => {
            let mut out = Vec::new();
            for i in items {
                match eval(i, doc, scope, ctx)? {
                    V::B(b) => out.push(b),
                    V::Missing => out.push(Bson::Null),
                }
            }
            Ok(V::B(Bson::Array(out)))
        }
        Bson::Document(d) => {
            let Some((op, arg)) = d.iter().next() else {
                return Ok(V::B(Bson::Document(Document::new())));
            };
            if !op.starts_with('$') {
                let mut out = Document::new();
                for (k, v) in d {
                    if let V::B(b) = eval(v, doc, scope, ctx)? {
                        out.insert(k.clone(), b);
                    }
                }
                return Ok(V::B(Bson::Document(out)));
            }
            operator(op, arg, doc, scope, ctx)
        }
        other => Ok(V::B(other.clone())),
    }
}

fn boolean(b: bool) -> R<V> {
    Ok(V::B(Bson::Boolean(b)))
}

fn operator(op: &str, arg: &Bson, doc: &Document, scope: &[(String, V)], ctx: Ctx<'_>) -> R<V> {
    let ev = |e: &Bson| eval(e, doc, scope, ctx);
    match op {
        "$literal" => Ok(V::B(arg.clone())),
        "$and" => {
            for a in args(arg) {
                if !truthy(&ev(a)?) {
                    return boolean(false);
                }
            }
            boolean(true)
        }
        "$or" => {
            for a in args(arg) {
                if truthy(&ev(a)?) {
                    return boolean(true);
                }
            }
            boolean(false)
        }
        "$not" => boolean(!truthy(&ev(one(arg)?)?)),
        "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" => {
            let a = args(arg);
            if a.len() != 2 {
                return Err(Failed);
            }
            let o = agg_cmp(&ev(a[0])?, &ev(a[1])?, ctx.ci);
            match op {
                "$cmp" => Ok(V::B(Bson::Int32(o as i32))),
                "$eq" => boolean(o.is_eq()),
                "$ne" => boolean(!o.is_eq()),
                "$gt" => boolean(o.is_gt()),
                "$gte" => boolean(o.is_ge()),
                "$lt" => boolean(o.is_lt()),
                _ => boolean(o.is_le()),
            }
        }
        "$cond" => {
            let (i, t, e) = match arg {
                Bson::Array(a) if a.len() == 3 => (&a[0], &a[1], &a[2]),
                Bson::Document(d) => (
                    d.get("if").ok_or(Failed)?,
                    d.get("then").ok_or(Failed)?,
                    d.get("else").ok_or(Failed)?,
                ),
                _ => return Err(Failed),
            };
            if truthy(&ev(i)?) {
                ev(t)
            } else {
                ev(e)
            }
        }
        "$ifNull" => {
            let a = args(arg);
            let (last, first) = a.split_last().ok_or(Failed)?;
            for e in first {
                let v = ev(e)?;
                if !nullish(&v) {
                    return Ok(v);
                }
            }
            ev(last)
        }
        "$let" => {
            let spec = arg.as_document().ok_or(Failed)?;
            let vars = spec.get_document("vars").map_err(|_| Failed)?;
            let body = spec.get("in").ok_or(Failed)?;
            let mut inner = scope.to_vec();
            for (k, v) in vars {
                inner.push((k.clone(), ev(v)?));
            }
            eval(body, doc, &inner, ctx)
        }
        "$type" => {
            let name = match ev(one(arg)?)? {
                V::Missing => "missing",
                V::B(b) => match b {
                    Bson::Double(_) => "double",
                    Bson::String(_) => "string",
                    Bson::Document(_) => "object",
                    Bson::Array(_) => "array",
                    Bson::ObjectId(_) => "objectId",
                    Bson::Boolean(_) => "bool",
                    Bson::DateTime(_) => "date",
                    Bson::Null => "null",
                    Bson::Int32(_) => "int",
                    Bson::Timestamp(_) => "timestamp",
                    Bson::Int64(_) => "long",
                    Bson::Decimal128(_) => "decimal",
                    Bson::MinKey => "minKey",
                    Bson::MaxKey => "maxKey",
                    other => panic!("$type of {other}"),
                },
            };
            Ok(V::B(Bson::String(name.into())))
        }
        "$isNumber" => boolean(matches!(ev(one(arg)?)?, V::B(b) if canon(&b) == 10)),
        "$isArray" => boolean(matches!(ev(one(arg)?)?, V::B(Bson::Array(_)))),
        "$toBool" => match ev(one(arg)?)? {
            v if nullish(&v) => Ok(V::B(Bson::Null)),
            V::B(Bson::Double(f)) if f.is_nan() => boolean(true),
            v => boolean(truthy(&v)),
        },
        "$toInt" | "$toLong" | "$toDouble" => {
            let v = ev(one(arg)?)?;
            if nullish(&v) {
                return Ok(V::B(Bson::Null));
            }
            let V::B(b) = v else { unreachable!() };
            let n: f64 = match b {
                Bson::Boolean(x) => f64::from(u8::from(x)),
                Bson::Int32(x) => f64::from(x),
                Bson::Int64(x) if op == "$toDouble" => x as f64,
                Bson::Int64(x) if op == "$toLong" => return Ok(V::B(Bson::Int64(x))),
                Bson::Int64(x) => {
                    return i32::try_from(x)
                        .map(|x| V::B(Bson::Int32(x)))
                        .map_err(|_| Failed)
                }
                Bson::Double(x) if op == "$toDouble" => x,
                Bson::Double(x) if x.is_finite() => x.trunc(),
                _ => return Err(Failed), // strings, decimals, dates...: not generated as folded
            };
            match op {
                "$toDouble" => Ok(V::B(Bson::Double(n))),
                "$toLong" if n.abs() < 9.2e18 => Ok(V::B(Bson::Int64(n as i64))),
                "$toInt" if n.abs() < 2.1e9 => Ok(V::B(Bson::Int32(n as i32))),
                _ => Err(Failed),
            }
        }
        other => panic!("operator {other}"),
    }
}

// ------------------------------------------------------------------------------------------
// Generators.

fn dec(s: &str) -> Bson {
    Bson::Decimal128(s.parse::<Decimal128>().unwrap())
}

/// Values of many BSON types: null, numbers of every type around 2^53, NaN, decimals,
/// strings differing only in case, MinKey / MaxKey, arrays, documents.
fn values() -> Vec<Bson> {
    let two53 = 9_007_199_254_740_992i64;
    vec![
        Bson::Null,
        Bson::Int32(0),
        Bson::Int32(1),
        Bson::Int32(5),
        Bson::Int32(-1),
        Bson::Int64(5),
        Bson::Int64(two53),
        Bson::Int64(two53 + 1),
        Bson::Int64(i64::MAX),
        Bson::Double(0.0),
        Bson::Double(-0.0),
        Bson::Double(1.5),
        Bson::Double(5.0),
        Bson::Double(two53 as f64),
        Bson::Double(f64::NAN),
        Bson::Double(f64::INFINITY),
        Bson::Double(0.1),
        dec("1"),
        dec("5.0"),
        dec("0.1"),
        dec("9007199254740993"),
        dec("-0"),
        dec("NaN"),
        dec("1E+3"),
        Bson::String(String::new()),
        Bson::String("a".into()),
        Bson::String("A".into()),
        Bson::String("b".into()),
        Bson::Boolean(true),
        Bson::Boolean(false),
        Bson::MinKey,
        Bson::MaxKey,
        Bson::Document(doc! {}),
        Bson::Document(doc! {"b": 1}),
        Bson::Document(doc! {"b": Bson::Null}),
        Bson::Array(vec![]),
        Bson::Array(vec![Bson::Int32(1)]),
        Bson::Array(vec![Bson::Null]),
        Bson::Array(vec![Bson::Int32(1), Bson::String("a".into())]),
        Bson::Array(vec![Bson::Array(vec![Bson::Int32(1)])]),
        Bson::Array(vec![Bson::Document(doc! {"b": 5}), Bson::Int32(5)]),
        Bson::Array(vec![Bson::MinKey]),
        Bson::DateTime(DateTime::from_millis(NOW)),
        Bson::ObjectId(ObjectId::from_bytes([7; 12])),
    ]
}

/// Values whose comparisons are easy to get wrong: around 2^53 in every numeric type, the
/// same number as int, double and decimal, a decimal fraction against the nearest double,
/// strings equal under a case-insensitive collation, a number against a string.
fn edge_values() -> Vec<Bson> {
    let two53 = 9_007_199_254_740_992i64;
    vec![
        Bson::Int64(two53 + 1),
        Bson::Int64(two53),
        Bson::Double(two53 as f64),
        dec("9007199254740993"),
        Bson::Int32(5),
        Bson::Double(5.0),
        dec("5.0"),
        dec("0.1"),
        Bson::Double(0.1),
        Bson::String("a".into()),
        Bson::String("A".into()),
        Bson::Int32(1),
    ]
}

fn value() -> impl Strategy<Value = Bson> {
    prop::sample::select(values())
}

/// `_id`: any value but an array.
fn id_value() -> impl Strategy<Value = Bson> {
    prop::sample::select(
        values()
            .into_iter()
            .filter(|v| !matches!(v, Bson::Array(_)))
            .collect::<Vec<_>>(),
    )
}

fn path() -> impl Strategy<Value = &'static str> {
    prop_oneof![3 => Just("a"), 1 => Just("b"), 3 => Just("a.b"), 2 => Just("_id")]
}

fn type_alias() -> impl Strategy<Value = Bson> {
    prop::sample::select(vec![
        Bson::String("array".into()),
        Bson::Int32(4),
        Bson::String("number".into()),
        Bson::String("string".into()),
        Bson::String("null".into()),
        Bson::String("minKey".into()),
        Bson::String("object".into()),
        Bson::String("bool".into()),
        Bson::Array(vec![Bson::String("array".into())]),
        Bson::Array(vec![
            Bson::String("double".into()),
            Bson::String("long".into()),
        ]),
    ])
}

/// One operator document on a field, `$not` nesting included.
fn ops() -> impl Strategy<Value = Document> {
    let single = prop_oneof![
        3 => (
            prop::sample::select(vec!["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]),
            prop_oneof![
                1 => value(),
                1 => prop::sample::select(vec![Bson::MinKey, Bson::MaxKey, Bson::Null]),
            ]
        )
            .prop_map(|(op, v)| doc! {op: v}),
        1 => (
            prop::sample::select(vec!["$in", "$nin"]),
            prop::collection::vec(value(), 0..3)
        )
            .prop_map(|(op, v)| doc! {op: v}),
        1 => prop::sample::select(vec![
            Bson::Boolean(true),
            Bson::Boolean(false),
            Bson::Int32(1),
            Bson::Int32(0)
        ])
        .prop_map(|v| doc! {"$exists": v}),
        1 => type_alias().prop_map(|t| doc! {"$type": t}),
        1 => (0..3i32).prop_map(|n| doc! {"$size": n}),
        1 => Just(doc! {"$all": []}),
    ];
    single.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|d| doc! {"$not": d}),
            (inner.clone(), inner).prop_map(|(mut a, b)| {
                for (k, v) in b {
                    a.entry(k).or_insert(v);
                }
                a
            }),
        ]
    })
}

/// A `$expr` argument: constants, variables, field paths and the folded operators.
fn expr() -> impl Strategy<Value = Bson> {
    let leaf = prop_oneof![
        4 => prop::sample::select(edge_values()),
        4 => value().prop_filter("not an operator document", |v| !matches!(v, Bson::Document(d) if !d.is_empty())),
        1 => prop::sample::select(vec![
            "$$NOW", "$$CLUSTER_TIME", "$$ROOT", "$$CURRENT", "$a", "$b", "$a.b", "$$x", "$$y", "$$v",
        ])
        .prop_map(|s| Bson::String(s.into())),
        1 => value().prop_map(|v| Bson::Document(doc! {"$literal": v})),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        let cmp_op = prop::sample::select(vec!["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$cmp"]);
        let unary = prop::sample::select(vec![
            "$not",
            "$type",
            "$isNumber",
            "$toBool",
            "$toInt",
            "$toLong",
            "$toDouble",
            "$isArray",
        ]);
        prop_oneof![
            (cmp_op, inner.clone(), inner.clone())
                .prop_map(|(op, a, b)| Bson::Document(doc! {op: [a, b]})),
            (
                prop::sample::select(vec!["$and", "$or"]),
                prop::collection::vec(inner.clone(), 0..3)
            )
                .prop_map(|(op, a)| Bson::Document(doc! {op: a})),
            (unary, inner.clone(), any::<bool>()).prop_map(|(op, a, wrap)| {
                // A bare array argument would be read as the argument list.
                if wrap || matches!(a, Bson::Array(_)) {
                    Bson::Document(doc! {op: [a]})
                } else {
                    Bson::Document(doc! {op: a})
                }
            }),
            (inner.clone(), inner.clone(), inner.clone(), any::<bool>()).prop_map(
                |(i, t, e, as_doc)| if as_doc {
                    Bson::Document(doc! {"$cond": {"if": i, "then": t, "else": e}})
                } else {
                    Bson::Document(doc! {"$cond": [i, t, e]})
                }
            ),
            (inner.clone(), inner.clone())
                .prop_map(|(a, b)| Bson::Document(doc! {"$ifNull": [a, b]})),
            (inner.clone(), inner).prop_map(|(v, body)| Bson::Document(
                doc! {"$let": {"vars": {"v": v}, "in": body}}
            )),
        ]
    })
}

/// One clause of a filter.
fn clause() -> impl Strategy<Value = (String, Bson)> {
    prop_oneof![
        // field: literal
        1 => (path(), value()).prop_map(|(p, v)| (p.to_string(), v)),
        // field: {ops}
        2 => (path(), ops()).prop_map(|(p, o)| (p.to_string(), Bson::Document(o))),
        // excluded middle, and near misses of it
        3 => (path(), ops(), prop::sample::select(vec!["$or", "$nor"])).prop_map(|(p, o, op)| {
            (
                op.to_string(),
                Bson::Array(vec![
                    Bson::Document(doc! {p: o.clone()}),
                    Bson::Document(doc! {p: {"$not": o}}),
                ]),
            )
        }),
        1 => (path(), value()).prop_map(|(p, v)| {
            (
                "$or".to_string(),
                Bson::Array(vec![
                    Bson::Document(doc! {p: v.clone()}),
                    Bson::Document(doc! {p: {"$ne": v}}),
                ]),
            )
        }),
        2 => (path(), ops(), ops()).prop_map(|(p, x, y)| {
            (
                "$or".to_string(),
                Bson::Array(vec![Bson::Document(doc! {p: x}), Bson::Document(doc! {p: y})]),
            )
        }),
        2 => expr().prop_map(|e| ("$expr".to_string(), e)),
        // a comparison of two edge values, directly
        2 => (
            prop::sample::select(vec!["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]),
            prop::sample::select(edge_values()),
            prop::sample::select(edge_values()),
        )
            .prop_map(|(op, a, b)| ("$expr".to_string(), Bson::Document(doc! {op: [a, b]}))),
        // strings that a case-insensitive collation makes equal
        1 => (
            prop::sample::select(vec!["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]),
            prop::sample::select(vec!["a", "A", "b"]),
            prop::sample::select(vec!["a", "A", "b"]),
        )
            .prop_map(|(op, a, b)| ("$expr".to_string(), Bson::Document(doc! {op: [a, b]}))),
    ]
}

fn filter() -> impl Strategy<Value = Document> {
    let base = prop::collection::vec(clause(), 1..3).prop_map(|cs| cs.into_iter().collect());
    base.prop_recursive(2, 8, 3, |inner| {
        (
            prop::sample::select(vec!["$and", "$or", "$nor"]),
            prop::collection::vec(inner, 1..3),
            prop::option::of(clause()),
        )
            .prop_map(|(op, branches, extra)| {
                let mut d = doc! {op: branches};
                if let Some((k, v)) = extra {
                    d.entry(k).or_insert(v);
                }
                d
            })
    })
}

/// A stored document: `_id` always present and never an array; `a` and `b` present,
/// missing, null, arrays, nested documents (`a.b`) or scalars of mixed types.
fn document() -> impl Strategy<Value = Document> {
    let field = prop::option::of(prop_oneof![
        3 => value(),
        1 => value().prop_map(|v| Bson::Document(doc! {"b": v})),
        1 => (value(), value()).prop_map(|(v, w)| Bson::Array(vec![Bson::Document(doc! {"b": v}), w])),
    ]);
    (id_value(), field.clone(), field).prop_map(|(id, a, b)| {
        let mut d = doc! {"_id": id};
        if let Some(a) = a {
            d.insert("a", a);
        }
        if let Some(b) = b {
            d.insert("b", b);
        }
        d
    })
}

fn let_vars() -> impl Strategy<Value = Document> {
    (expr(), expr()).prop_map(|(x, y)| doc! {"x": x, "y": y})
}

// ------------------------------------------------------------------------------------------
// The property.

#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    all: usize,
    none: usize,
    narrow: usize,
    checked_docs: usize,
}

fn check(
    filter: &Document,
    let_vars: &Document,
    ci: bool,
    docs: &[Document],
    tally: &mut Tally,
) -> Result<(), TestCaseError> {
    let raw = RawDocumentBuf::try_from(filter).unwrap();
    let raw_let = RawDocumentBuf::try_from(let_vars).unwrap();
    let collation = bson::rawdoc! {"locale": "en", "strength": 2};
    let facts = FilterFacts {
        collation: ci.then_some(collation.as_ref()),
        let_vars: Some(&raw_let),
    };
    let ctx = Ctx { let_vars, ci };
    tally.cases += 1;
    let Some([all, none, bare]) = claims(&raw, &facts) else {
        return Ok(());
    };
    let v = verdict(&raw, &facts);
    tally.all += usize::from(all == Some(true));
    tally.none += usize::from(none == Some(true));
    tally.narrow += usize::from(v == Verdict::Narrow);
    let bare_docs: Vec<Document> = values()
        .into_iter()
        .step_by(3)
        .filter(|v| !matches!(v, Bson::Array(_)))
        .map(|id| doc! {"_id": id})
        .collect();
    for (d, is_bare) in docs
        .iter()
        .map(|d| (d, false))
        .chain(bare_docs.iter().map(|d| (d, true)))
    {
        let Ok(m) = matches(filter, d, ctx) else {
            continue; // mongod would fail the write: no claim to check
        };
        tally.checked_docs += 1;
        let c = if ci {
            "case-insensitive collation"
        } else {
            "simple collation"
        };
        if all == Some(true) {
            prop_assert!(
                m,
                "claimed all, but {filter} rejects {d} (let {let_vars}, {c})"
            );
        }
        if none == Some(true) {
            prop_assert!(
                !m,
                "claimed none, but {filter} matches {d} (let {let_vars}, {c})"
            );
        }
        if is_bare {
            if let Some(b) = bare {
                prop_assert_eq!(
                    m,
                    b,
                    "bare claim on {} for {} (let {}, {})",
                    filter,
                    d,
                    let_vars,
                    c
                );
            }
        }
        if v == Verdict::All {
            prop_assert!(m, "verdict all, but {filter} rejects {d}");
        }
    }
    if v == Verdict::Narrow {
        let witness = doc! {"_id": Bson::MinKey};
        // (An expression that fails makes mongod fail the write: nothing selected either.)
        prop_assert!(
            !matches!(matches(filter, &witness, ctx), Ok(true)),
            "narrow, yet {} does not reject {}",
            filter,
            witness
        );
    }
    Ok(())
}

#[test]
fn every_claim_holds_on_every_generated_document() {
    let mut runner = TestRunner::new(Config {
        cases: 1500,
        failure_persistence: None,
        ..Config::default()
    });
    let tally = std::cell::RefCell::new(Tally::default());
    let strategy = (
        filter(),
        let_vars(),
        any::<bool>(),
        prop::collection::vec(document(), 16),
    );
    let result = runner.run(&strategy, |(f, l, ci, docs)| {
        check(&f, &l, ci, &docs, &mut tally.borrow_mut())
    });
    let tally = tally.into_inner();
    if let Err(e) = result {
        panic!("{e}\n{tally:?}");
    }
    println!("{tally:?}");
    // The generator must reach the proofs, or the property proves nothing.
    assert!(
        tally.all * 20 >= tally.cases,
        "too few `all` claims: {tally:?}"
    );
    assert!(
        tally.none * 50 >= tally.cases,
        "too few `none` claims: {tally:?}"
    );
    assert!(
        tally.narrow * 50 >= tally.cases,
        "too few `narrow` verdicts: {tally:?}"
    );
}

/// Each rule the prover has, on a hand-written filter, against the reference: a proved
/// filter matches every generated document (a guard that the generator and the matcher see
/// the same thing as the unit tests).
#[test]
fn hand_written_proofs_hold_on_generated_documents() {
    let cases = [
        doc! {"$or": [{"a": {"$exists": true}}, {"a": {"$exists": false}}]},
        doc! {"$or": [{"a": {"$eq": Bson::Null}}, {"a": {"$ne": Bson::Null}}]},
        doc! {"$or": [{"a.b": 5}, {"a.b": {"$ne": 5}}]},
        doc! {"$or": [{"a": {"$in": [1, 2]}}, {"$nor": [{"a": {"$in": [1, 2]}}, {"b": 1}]}, {"b": 1}], "$comment": "x"},
        doc! {"a": {"$gte": Bson::MinKey}},
        doc! {"b": {"$lte": Bson::MaxKey}},
        doc! {"_id": {"$not": {"$type": "array"}}},
        doc! {"_id": {"$not": {"$size": 0}}},
        doc! {"$expr": {"$gt": ["a", 1]}},
        doc! {"$expr": {"$gt": [9_007_199_254_740_993i64, 9_007_199_254_740_992.0f64]}},
        doc! {"$expr": {"$eq": [dec("5.0"), 5]}},
        doc! {"$expr": {"$eq": ["$$NOW", "$$NOW"]}},
        doc! {"$expr": {"$lt": ["$$NOW", "$$CLUSTER_TIME"]}},
        doc! {"$expr": {"$cond": [{"$isNumber": dec("1")}, "$$ROOT", false]}},
        doc! {"$expr": {"$ifNull": [Bson::Null, "$$x"]}},
        doc! {"$expr": {"$let": {"vars": {"v": 1}, "in": {"$eq": ["$$v", {"$toInt": true}]}}}},
        doc! {"$expr": {"$eq": [{"$type": "$$NOW"}, "date"]}},
    ];
    let let_vars = doc! {"x": {"$toBool": 1}};
    let raw_let = RawDocumentBuf::try_from(&let_vars).unwrap();
    let facts = FilterFacts {
        collation: None,
        let_vars: Some(&raw_let),
    };
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    for f in cases {
        let raw = RawDocumentBuf::try_from(&f).unwrap();
        assert_eq!(claims(&raw, &facts).map(|c| c[0]), Some(Some(true)), "{f}");
        runner
            .run(&prop::collection::vec(document(), 16), |docs| {
                for d in &docs {
                    let ctx = Ctx {
                        let_vars: &let_vars,
                        ci: false,
                    };
                    prop_assert_eq!(matches(&f, d, ctx).ok(), Some(true), "{} on {}", f, d);
                }
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn reference_numbers_are_exact() {
    let two53 = 9_007_199_254_740_992i64;
    let e = |b: Bson| exact(&b).unwrap();
    assert_eq!(
        cmp_exact(&e(Bson::Int64(two53 + 1)), &e(Bson::Double(two53 as f64))),
        Ordering::Greater
    );
    assert_eq!(
        cmp_exact(&e(dec("0.1")), &e(Bson::Double(0.1))),
        Ordering::Less
    );
    assert_eq!(
        cmp_exact(&e(dec("1E+3")), &e(Bson::Int32(1000))),
        Ordering::Equal
    );
    assert_eq!(
        cmp_exact(&e(dec("-0")), &e(Bson::Double(0.0))),
        Ordering::Equal
    );
    assert_eq!(
        cmp_exact(&e(Bson::Int32(-1)), &e(dec("-0.1"))),
        Ordering::Less
    );
}
