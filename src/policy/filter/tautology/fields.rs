//! Operators on one field (`{a: {$exists: true, $ne: 5}}`), and `field: literal`
//! equality, as [`Truth`]s. `bare` here means "matches when the field is missing"; the
//! clause level re-derives it for `_id`, which no stored document lacks.

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{Conj, Invalid, Res, Tri, Truth, ALWAYS, NEEDS_VALUE, NEVER, OPAQUE};
use crate::policy::filter::{decimal_is_nan, is_operator_doc, true_value, MAX_DEPTH};

/// One `field: value` clause. `bare` is re-derived for the path: a top-level field is
/// missing from the bare document, `_id` (and `_id.x`) holds an arbitrary value there.
pub(super) fn field_truth(path: &str, value: RawBsonRef<'_>, depth: usize) -> Res {
    let is_id = path == "_id";
    let mut t = match value {
        RawBsonRef::Document(d) if is_operator_doc(d) => ops_truth(d, is_id, depth + 1)?,
        other => equality(other)?,
    };
    if path == "_id" || path.starts_with("_id.") {
        t.bare = if t.all == Tri::Yes {
            Tri::Yes
        } else if t.none == Tri::Yes {
            Tri::No
        } else {
            Tri::Maybe
        };
    }
    // Array traversal makes most dotted-path reasoning subtle; an operator document whose
    // answer does not depend on the field at all (`$nin: []`) is the exception.
    if path.contains('.') && t.all == Tri::Yes {
        let constant = match value {
            RawBsonRef::Document(d) => value_independent(d, depth + 1) == Some(true),
            _ => false,
        };
        if !constant {
            t = Truth {
                all: Tri::Maybe,
                ..t
            };
        }
    }
    Ok(t)
}

/// Whether the operators on a field match every document (`Some(true)`) or none
/// (`Some(false)`) whatever the field holds and whether it exists at all, so for any path,
/// dotted or not: `$in: []` and `$all: []` match nothing, `$nin: []` everything, `$not`
/// flips a constant, and a conjunction is constant when one operator matches nothing or all
/// of them match everything. `None` when the answer depends on the value (or the operator
/// document is one mongod would reject: [`ops_truth`] has already refused those).
fn value_independent(ops: &RawDocument, depth: usize) -> Option<bool> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut all = true;
    for elem in ops.iter_elements() {
        let elem = elem.ok()?;
        let value = elem.value().ok()?;
        let this = match (elem.key().as_str(), value) {
            ("$in" | "$all", RawBsonRef::Array(a)) if a.is_empty() => Some(false),
            ("$nin", RawBsonRef::Array(a)) if a.is_empty() => Some(true),
            ("$not", RawBsonRef::Document(d)) if is_operator_doc(d) => {
                value_independent(d, depth + 1).map(|b| !b)
            }
            _ => None,
        };
        match this {
            Some(false) => return Some(false),
            Some(true) => {}
            None => all = false,
        }
    }
    all.then_some(true)
}

/// `field: literal`: equality, except that a regex literal is a regex match.
fn equality(value: RawBsonRef<'_>) -> Res {
    match value {
        RawBsonRef::RegularExpression(_) => Ok(NEEDS_VALUE),
        RawBsonRef::Undefined => Err(Invalid), // "cannot compare to undefined"
        RawBsonRef::Null => Ok(Truth {
            all: Tri::No,
            none: Tri::No,
            bare: Tri::Yes,
        }),
        _ => Ok(Truth {
            all: Tri::No,
            none: Tri::No,
            bare: Tri::No,
        }),
    }
}

/// The operators on one field (`{$exists: true, $ne: 5}`): an implicit `$and`. `bare` here
/// means "matches when the field is missing".
fn ops_truth(ops: &RawDocument, is_id: bool, depth: usize) -> Res {
    if depth > MAX_DEPTH {
        return Err(Invalid);
    }
    let mut conj = Conj::new();
    let (mut has_regex, mut has_options) = (false, false);
    for elem in ops.iter_elements() {
        let elem = elem.map_err(|_| Invalid)?;
        let value = elem.value().map_err(|_| Invalid)?;
        match elem.key().as_str() {
            // Modifiers of a sibling operator, not predicates of their own.
            "$options" => has_options = true,
            "$maxDistance" | "$minDistance" => {}
            key => {
                has_regex |= key == "$regex";
                conj.push(op_truth(key, value, is_id, depth)?);
            }
        }
    }
    if conj.count == 0 || (has_options && !has_regex) {
        return Err(Invalid);
    }
    Ok(conj.finish())
}

fn op_truth(op: &str, value: RawBsonRef<'_>, is_id: bool, depth: usize) -> Res {
    match op {
        "$eq" => equality_op(value),
        "$ne" => Ok(equality_op(value)?.negate()),
        "$gt" | "$gte" | "$lt" | "$lte" => comparison(op, value, is_id),
        "$in" => in_list(value),
        "$nin" => Ok(in_list(value)?.negate()),
        "$exists" => Ok(match (true_value(value), is_id) {
            (true, true) => ALWAYS,
            (false, true) => NEVER,
            (true, false) => Truth {
                all: Tri::No,
                none: Tri::No,
                bare: Tri::No,
            },
            (false, false) => Truth {
                all: Tri::No,
                none: Tri::No,
                bare: Tri::Yes,
            },
        }),
        "$all" => {
            let list = array(value)?;
            if list.is_empty() {
                return Ok(NEVER);
            }
            let mut all_null = true;
            for v in list {
                all_null &= matches!(v.map_err(|_| Invalid)?, RawBsonRef::Null);
            }
            // `{$all: [null]}` is `{$eq: null}`, which the missing field matches.
            Ok(Truth {
                bare: Tri::from_bool(all_null),
                ..NEEDS_VALUE
            })
        }
        "$not" => match value {
            RawBsonRef::RegularExpression(_) => Ok(NEEDS_VALUE.negate()),
            RawBsonRef::Document(d) if is_operator_doc(d) => {
                Ok(ops_truth(d, is_id, depth + 1)?.negate())
            }
            _ => Err(Invalid),
        },
        // `_id` may hold any type, so a `$type` list might cover every one of them.
        "$type" if is_id => Ok(Truth {
            all: Tri::Maybe,
            ..NEEDS_VALUE
        }),
        "$type" | "$size" | "$elemMatch" | "$mod" | "$regex" | "$bitsAllSet" | "$bitsAllClear"
        | "$bitsAnySet" | "$bitsAnyClear" | "$geoWithin" | "$geoIntersects" | "$within"
        | "$near" | "$nearSphere" => Ok(NEEDS_VALUE),
        _ => Ok(OPAQUE),
    }
}

fn equality_op(value: RawBsonRef<'_>) -> Res {
    match value {
        // `{$eq: /re/}` compares with the regex as a value; no document lacks a witness.
        RawBsonRef::RegularExpression(_) => Ok(Truth {
            all: Tri::No,
            none: Tri::No,
            bare: Tri::No,
        }),
        other => equality(other),
    }
}

fn comparison(op: &str, value: RawBsonRef<'_>, is_id: bool) -> Res {
    Ok(match (op, value) {
        (_, RawBsonRef::Undefined) => return Err(Invalid),
        // Every value sorts between MinKey and MaxKey, and `_id` always has one.
        ("$gte", RawBsonRef::MinKey) | ("$lte", RawBsonRef::MaxKey) if is_id => ALWAYS,
        ("$lt", RawBsonRef::MinKey) | ("$gt", RawBsonRef::MaxKey) if is_id => NEVER,
        (_, RawBsonRef::MinKey | RawBsonRef::MaxKey) if is_id => Truth {
            all: Tri::No,
            none: Tri::No,
            bare: Tri::Maybe,
        },
        // Off `_id`, how a missing field compares with MinKey / MaxKey is not proven here.
        (_, RawBsonRef::MinKey | RawBsonRef::MaxKey) => OPAQUE,
        (_, RawBsonRef::Double(f)) if f.is_nan() => OPAQUE,
        (_, RawBsonRef::Decimal128(d)) if decimal_is_nan(d) => OPAQUE,
        // A missing field compares equal to null.
        ("$gte" | "$lte", RawBsonRef::Null) => Truth {
            bare: Tri::Yes,
            ..NEEDS_VALUE
        },
        _ => NEEDS_VALUE,
    })
}

fn in_list(value: RawBsonRef<'_>) -> Res {
    let list = array(value)?;
    if list.is_empty() {
        return Ok(NEVER);
    }
    let mut has_null = false;
    for v in list {
        has_null |= matches!(v.map_err(|_| Invalid)?, RawBsonRef::Null);
    }
    Ok(Truth {
        all: Tri::No,
        none: Tri::No,
        bare: Tri::from_bool(has_null),
    })
}

fn array(value: RawBsonRef<'_>) -> Result<&RawArray, Invalid> {
    match value {
        RawBsonRef::Array(a) => Ok(a),
        _ => Err(Invalid),
    }
}
