//! Operators on one field (`{a: {$exists: true, $ne: 5}}`), and `field: literal`
//! equality, as [`Truth`]s. `bare` here means "matches when the field is missing"; the
//! clause level re-derives it for `_id`, which no stored document lacks.

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{Conj, Invalid, Res, Tri, Truth, ALWAYS, NEEDS_VALUE, NEVER, OPAQUE};
use crate::policy::filter::{decimal_is_nan, is_operator_doc, true_value, MAX_DEPTH};

/// Where an operator applies: `_id` itself (present in every document, never an array), a
/// top-level field (missing or holding one value, possibly an array), or a dotted path.
#[derive(Debug, Clone, Copy)]
pub(super) struct PathKind {
    pub(super) is_id: bool,
    pub(super) top: bool,
}

impl PathKind {
    pub(super) fn of(path: &str) -> PathKind {
        PathKind {
            is_id: path == "_id",
            top: !path.contains('.'),
        }
    }
}

/// One `field: value` clause. `bare` is re-derived for the path: a top-level field is
/// missing from the bare document, `_id` (and `_id.x`) holds an arbitrary value there.
pub(super) fn field_truth(path: &str, value: RawBsonRef<'_>, depth: usize) -> Res {
    let at = PathKind::of(path);
    let mut t = match value {
        RawBsonRef::Document(d) if is_operator_doc(d) => ops_truth(d, at, depth + 1)?,
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
            ("$lt", RawBsonRef::MinKey) | ("$gt", RawBsonRef::MaxKey) => Some(false),
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
fn ops_truth(ops: &RawDocument, at: PathKind, depth: usize) -> Res {
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
                conj.push(op_truth(key, value, at, depth)?);
            }
        }
    }
    if conj.count == 0 || (has_options && !has_regex) {
        return Err(Invalid);
    }
    Ok(conj.finish())
}

pub(super) fn op_truth(op: &str, value: RawBsonRef<'_>, at: PathKind, depth: usize) -> Res {
    let is_id = at.is_id;
    match op {
        "$eq" => equality_op(value),
        "$ne" => Ok(equality_op(value)?.negate()),
        "$gt" | "$gte" | "$lt" | "$lte" => comparison(op, value, at),
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
                Ok(ops_truth(d, at, depth + 1)?.negate())
            }
            _ => Err(Invalid),
        },
        // `_id` is never an array (mongod refuses an array `_id`): array-only operators and
        // `$type: "array"` never match it.
        "$size" | "$elemMatch" if is_id => Ok(NEVER),
        "$type" if is_id && only_array_type(value)? => Ok(NEVER),
        // `_id` may hold any other type, so a `$type` list might cover every one of them.
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

/// Whether a `$type` argument names the array type only (`"array"`, `4`, or a list of those).
fn only_array_type(value: RawBsonRef<'_>) -> Result<bool, Invalid> {
    fn is_array(v: RawBsonRef<'_>) -> bool {
        match v {
            RawBsonRef::String(s) => s == "array",
            RawBsonRef::Int32(n) => n == 4,
            RawBsonRef::Int64(n) => n == 4,
            RawBsonRef::Double(f) => f == 4.0,
            _ => false,
        }
    }
    match value {
        RawBsonRef::Array(list) => {
            let mut any = false;
            for v in list {
                if !is_array(v.map_err(|_| Invalid)?) {
                    return Ok(false);
                }
                any = true;
            }
            Ok(any)
        }
        other => Ok(is_array(other)),
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

/// `$gt` / `$gte` / `$lt` / `$lte`. With MinKey or MaxKey the answer follows mongod's
/// `ComparisonMatchExpression::matchesSingleElement` (src/mongo/db/matcher/
/// expression_leaf.cpp): a value of another canonical type than MinKey / MaxKey, *including
/// the missing field* (EOO), matches `$gt`/`$gte: MinKey` and `$lt`/`$lte: MaxKey`, never the
/// others; MinKey (MaxKey) itself equals itself. jstests/core/min_max_key.js shows the same
/// on a collection. So `$gte: MinKey` and `$lte: MaxKey` match every value and the missing
/// field: every document, on a top-level field (a dotted path through an array of scalars
/// may yield no element at all, so there it is not claimed). `$lt: MinKey` and `$gt: MaxKey`
/// match no element, so nothing on any path.
fn comparison(op: &str, value: RawBsonRef<'_>, at: PathKind) -> Res {
    Ok(match (op, value) {
        (_, RawBsonRef::Undefined) => return Err(Invalid),
        ("$gte", RawBsonRef::MinKey) | ("$lte", RawBsonRef::MaxKey) if at.top => ALWAYS,
        // Dotted: the bare document (no such path) matches, so something matches.
        ("$gte", RawBsonRef::MinKey) | ("$lte", RawBsonRef::MaxKey) => Truth {
            all: Tri::Maybe,
            none: Tri::No,
            bare: Tri::Yes,
        },
        ("$lt", RawBsonRef::MinKey) | ("$gt", RawBsonRef::MaxKey) => NEVER,
        // Everything but MinKey (MaxKey) itself, and the missing field.
        ("$gt", RawBsonRef::MinKey) | ("$lt", RawBsonRef::MaxKey) => Truth {
            all: Tri::No,
            none: Tri::No,
            bare: Tri::Yes,
        },
        // `$lte: MinKey`, `$gte: MaxKey`: MinKey (MaxKey) itself only.
        (_, RawBsonRef::MinKey | RawBsonRef::MaxKey) => Truth {
            all: Tri::No,
            none: Tri::No,
            bare: Tri::No,
        },
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
