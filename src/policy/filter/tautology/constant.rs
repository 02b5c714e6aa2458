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
        RawBsonRef::String(s) if s.starts_with('$') => None,
        RawBsonRef::Document(d) => {
            let mut elems = d.iter_elements();
            let Some(first) = elems.next() else {
                return Ok(None);
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
                _ => None,
            }
        }
        // `$expr: [..]` is ambiguous between an array literal and an argument list.
        RawBsonRef::Array(_) => None,
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
