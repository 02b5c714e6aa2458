//! Constant folding of aggregation expressions, for `$expr`.

use bson::RawBsonRef;

use super::Invalid;
use crate::policy::filter::{decimal_is_zero, MAX_DEPTH};

/// The constant truthiness of an aggregation expression (`$expr`), when it has one.
/// Aggregation truthiness: `false`, `null`, `undefined` and numeric zero are false; every
/// other constant (any string, even empty; arrays; documents) is true. A string starting
/// with `$` is a field path or variable, so not a constant.
pub(super) fn expr_truth(expr: RawBsonRef<'_>, depth: usize) -> Result<Option<bool>, Invalid> {
    if depth > MAX_DEPTH {
        return Err(Invalid);
    }
    Ok(match expr {
        // The current document itself: every document is truthy.
        RawBsonRef::String("$$ROOT" | "$$CURRENT") => Some(true),
        RawBsonRef::String(s) if s.starts_with('$') => None,
        RawBsonRef::Document(d) => {
            let mut elems = d.iter_elements();
            let Some(first) = elems.next() else {
                // `{}`: an empty object expression evaluates to `{}`, which is truthy.
                return Ok(Some(true));
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
            match key {
                "$literal" => literal_truth(arg),
                "$and" => fold(arg, depth, true)?,
                "$or" => fold(arg, depth, false)?,
                "$not" => match arg {
                    RawBsonRef::Array(a) => {
                        let mut it = a.into_iter();
                        match (it.next(), it.next()) {
                            (Some(v), None) => expr_truth(v.map_err(|_| Invalid)?, depth + 1)?,
                            _ => return Err(Invalid),
                        }
                    }
                    other => expr_truth(other, depth + 1)?,
                }
                .map(|b| !b),
                "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" => compare(key, arg),
                _ => None,
            }
        }
        // An array expression evaluates to an array, which is truthy, provided evaluating it
        // cannot fail: every element a constant.
        RawBsonRef::Array(items) => {
            let mut all_constant = true;
            for item in items {
                if constant(item.map_err(|_| Invalid)?).is_none() {
                    all_constant = false;
                    break;
                }
            }
            all_constant.then_some(true)
        }
        other => literal_truth(other),
    })
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

/// `$and` / `$or` in an expression: an argument list, or a single argument.
fn fold(arg: RawBsonRef<'_>, depth: usize, is_and: bool) -> Result<Option<bool>, Invalid> {
    let RawBsonRef::Array(args) = arg else {
        return expr_truth(arg, depth + 1);
    };
    // An empty `$and` is true and an empty `$or` false, as in mongod.
    let (mut acc, absorbing) = (Some(is_and), !is_and);
    for a in args {
        match expr_truth(a.map_err(|_| Invalid)?, depth + 1)? {
            Some(b) if b == absorbing => return Ok(Some(absorbing)),
            Some(_) => {}
            None => acc = None,
        }
    }
    Ok(acc)
}

/// A constant operand of a comparison, when it is one of the comparable kinds.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Constant<'a> {
    Number(f64),
    Text(&'a str),
    Bool(bool),
    Null,
}

/// A literal (or `{$literal: x}`) usable in a folded comparison.
fn constant(v: RawBsonRef<'_>) -> Option<Constant<'_>> {
    match v {
        RawBsonRef::Int32(n) => Some(Constant::Number(f64::from(n))),
        RawBsonRef::Int64(n) => Some(Constant::Number(n as f64)),
        RawBsonRef::Double(f) if !f.is_nan() => Some(Constant::Number(f)),
        RawBsonRef::String(s) if !s.starts_with('$') => Some(Constant::Text(s)),
        RawBsonRef::Boolean(b) => Some(Constant::Bool(b)),
        RawBsonRef::Null => Some(Constant::Null),
        RawBsonRef::Document(d) => match d.get("$literal") {
            Ok(Some(RawBsonRef::String(s))) => Some(Constant::Text(s)),
            Ok(Some(inner)) if d.iter_elements().count() == 1 => constant(inner),
            _ => None,
        },
        _ => None,
    }
}

/// `{$eq: [a, b]}` and friends over two constants of the same kind (numbers compare by value,
/// strings by bytes as without a collation); anything else is not folded.
fn compare(op: &str, arg: RawBsonRef<'_>) -> Option<bool> {
    let RawBsonRef::Array(args) = arg else {
        return None;
    };
    let mut it = args.into_iter();
    let (Some(Ok(a)), Some(Ok(b)), None) = (it.next(), it.next(), it.next()) else {
        return None;
    };
    let (a, b) = (constant(a)?, constant(b)?);
    let same_kind = matches!(
        (a, b),
        (Constant::Number(_), Constant::Number(_))
            | (Constant::Text(_), Constant::Text(_))
            | (Constant::Bool(_), Constant::Bool(_))
            | (Constant::Null, Constant::Null)
    );
    if !same_kind {
        return None;
    }
    let ord = a.partial_cmp(&b)?;
    Some(match op {
        "$eq" => ord.is_eq(),
        "$ne" => !ord.is_eq(),
        "$gt" => ord.is_gt(),
        "$gte" => ord.is_ge(),
        "$lt" => ord.is_lt(),
        "$lte" => ord.is_le(),
        _ => return None,
    })
}
