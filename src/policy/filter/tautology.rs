//! "Matches every document", decided semantically.
//!
//! Several rules (W001 to W003) hinge on a filter that selects everything, and a client can
//! spell "everything" in endless ways: `{}`, `{_id: {$exists: true}}`, `{$expr: 1}`,
//! `{$or: [{a: 1}, {}]}`, `{a: {$not: {$in: []}}}`, `{$where: "return true"}`... A list of
//! patterns would always miss one, so this module evaluates the filter instead.
//!
//! # The model
//!
//! Every predicate (a whole filter, one clause, or one operator on one field) gets a
//! `Truth`: three Kleene answers (`Tri`: yes, no, maybe) to three questions.
//!
//! - `all`: does it match every possible document?
//! - `none`: does it match no document at all?
//! - `bare`: does it match a *bare* document, one whose only field is `_id` (whatever its
//!   value)? On a field this is "does it match when the field is missing".
//!
//! `all` and `none` compose the obvious way through `$and`, `$or`, `$nor` and `$not`. `bare`
//! supplies the witness that lets a disjunction be proven restrictive: `{$or: [{a: 1},
//! {b: 1}]}` rejects the bare document in every branch, so it certainly does not match
//! everything, while `{$or: [{a: {$exists: true}}, {a: {$exists: false}}]}` (which does
//! match everything) stays `Unknown` rather than being called restrictive. A `Yes` or `No`
//! is a proof; `Maybe` is "not proven", and is where anything opaque lands (unknown
//! operators, JavaScript, aggregation expressions that are not constants).
//!
//! # What is proven `All`
//!
//! `{}`; an `$and` (or implicit and) of `All` clauses; an `$or` with an `All` branch; a
//! `$nor` whose branches all match nothing; `$expr` of a constant truthy value (`constant.rs`
//! folds literals, `$literal`, the command's `let`, `$let`, `$$NOW` / `$$CLUSTER_TIME` /
//! `$$ROOT` / `$$CURRENT`, `$cond`, `$ifNull`, `$and` / `$or` / `$not`, comparisons in BSON's
//! cross-type order with numbers compared exactly, `$type`, `$isNumber`, `$isArray`,
//! `$toBool`, `$toInt`, `$toLong`, `$toDouble`); `$where` whose body only returns a truthy
//! constant; `$comment` (ignored); `$alwaysTrue: 1`; `$sampleRate: 1`; `$jsonSchema: {}`; on
//! any path: `$nin: []`, `$not` of anything that matches nothing (`$in: []`, `$all: []`,
//! `$lt: MinKey`, `$gt: MaxKey`); on a top-level field: `$gte: MinKey`, `$lte: MaxKey` (the
//! missing field included, see `fields::comparison`); on `_id` (in every stored document,
//! never an array): `$exists: true`, `$not` of `$size`, `$elemMatch` or `$type: "array"`;
//! and, in a second pass (`atoms.rs`), any filter that is a propositional tautology over its
//! leaf predicates (excluded middle: `{$or: [{a: 5}, {a: {$ne: 5}}]}`).
//!
//! # Deliberately left unknown
//!
//! Dotted paths are never `All` from a value-dependent operator (array traversal may yield no
//! element at all); comparisons of values of the same type in the match language (only
//! their negations and complements, through the second pass); `NaN` comparands; unknown
//! operators; non-constant `$expr`; string comparisons in `$expr` under a non-simple
//! collation; real JavaScript; anything malformed (mongod would reject it) or nested deeper
//! than [`MAX_DEPTH`]. docs/verdicts.md is the user-facing list.

use bson::{RawBsonRef, RawDocument};

use super::{js, MAX_DEPTH};

mod atoms;
mod constant;
mod fields;
mod number;

use constant::{expr_truth, Env};
use fields::field_truth;

/// Whether a filter matches every document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Proven to match every document of any collection.
    All,
    /// Proven to leave out some document: a real filter.
    Conditioned,
    /// Not decidable here (opaque JavaScript, non-constant `$expr`, unknown operators,
    /// malformed or too deep). Rules treat it as conditioned: no false blocks.
    Unknown,
}

/// [`coverage`] of a statement's filter, knowing its collation and the command's `let`.
/// The `let` variables fold into `$expr` (`{$expr: "$$flag"}`); under a collation other than
/// the simple one no string comparison is folded, so nothing is claimed from one.
pub fn coverage_with(filter: &RawDocument, facts: &super::verdict::FilterFacts<'_>) -> Coverage {
    let env = Env {
        let_vars: facts.let_vars,
        simple_collation: facts.simple_collation(),
    };
    match analyse(filter, &env) {
        Ok(t) => match t.all {
            Tri::Yes => Coverage::All,
            Tri::No => Coverage::Conditioned,
            Tri::Maybe => Coverage::Unknown,
        },
        Err(Invalid) => Coverage::Unknown,
    }
}

/// Decides whether `filter` matches every document, for a statement with no collation and
/// no `let`. Allocation-free; never panics.
pub fn coverage(filter: &RawDocument) -> Coverage {
    coverage_with(filter, &super::verdict::FilterFacts::default())
}

/// The structural analysis, then, when it cannot decide, the excluded-middle pass.
fn analyse(filter: &RawDocument, env: &Env<'_>) -> Res {
    let t = filter_truth(filter, env, 0)?;
    if t.all == Tri::Maybe && atoms::covers_all(filter, env) {
        return Ok(Truth {
            all: Tri::Yes,
            none: Tri::No,
            bare: Tri::Yes,
        });
    }
    Ok(t)
}

/// What the prover claims about `filter`, for the soundness property test: `(all, none,
/// bare)` as `Some(true)` (proved), `Some(false)` (disproved) or `None`.
#[cfg(test)]
pub(crate) fn claims(
    filter: &RawDocument,
    facts: &super::verdict::FilterFacts<'_>,
) -> Option<[Option<bool>; 3]> {
    let env = Env {
        let_vars: facts.let_vars,
        simple_collation: facts.simple_collation(),
    };
    let t = analyse(filter, &env).ok()?;
    let b = |t: Tri| match t {
        Tri::Yes => Some(true),
        Tri::No => Some(false),
        Tri::Maybe => None,
    };
    Some([b(t.all), b(t.none), b(t.bare)])
}

/// A shape mongod would reject, or nesting past [`MAX_DEPTH`]: the whole filter is unknown.
#[derive(Debug)]
struct Invalid;

type Res = Result<Truth, Invalid>;

/// A three-valued (Kleene) answer: proven yes, proven no, or not proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tri {
    Yes,
    No,
    Maybe,
}

impl Tri {
    fn from_bool(b: bool) -> Tri {
        if b {
            Tri::Yes
        } else {
            Tri::No
        }
    }
    fn not(self) -> Tri {
        match self {
            Tri::Yes => Tri::No,
            Tri::No => Tri::Yes,
            Tri::Maybe => Tri::Maybe,
        }
    }
    fn and(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::No, _) | (_, Tri::No) => Tri::No,
            (Tri::Yes, Tri::Yes) => Tri::Yes,
            _ => Tri::Maybe,
        }
    }
}

/// What is known about one predicate; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Truth {
    all: Tri,
    none: Tri,
    bare: Tri,
}

const ALWAYS: Truth = Truth {
    all: Tri::Yes,
    none: Tri::No,
    bare: Tri::Yes,
};
const NEVER: Truth = Truth {
    all: Tri::No,
    none: Tri::Yes,
    bare: Tri::No,
};
const OPAQUE: Truth = Truth {
    all: Tri::Maybe,
    none: Tri::Maybe,
    bare: Tri::Maybe,
};
/// A real restriction that the missing field fails (`$gt: 5`, `$regex`, `$size`...).
const NEEDS_VALUE: Truth = Truth {
    all: Tri::No,
    none: Tri::Maybe,
    bare: Tri::No,
};

impl Truth {
    fn negate(self) -> Truth {
        Truth {
            all: self.none,
            none: self.all,
            bare: self.bare.not(),
        }
    }
}

/// Accumulates a conjunction (an implicit `$and`, the operators on one field, `$and`).
/// A disjunction is the negated conjunction of the negated branches.
struct Conj {
    all: Tri,
    bare: Tri,
    any_none: bool,
    count: usize,
    single_none: Tri,
}

impl Conj {
    fn new() -> Conj {
        Conj {
            all: Tri::Yes,
            bare: Tri::Yes,
            any_none: false,
            count: 0,
            single_none: Tri::No,
        }
    }
    fn push(&mut self, t: Truth) {
        self.all = self.all.and(t.all);
        self.bare = self.bare.and(t.bare);
        self.any_none |= t.none == Tri::Yes;
        self.single_none = t.none;
        self.count += 1;
    }
    fn finish(self) -> Truth {
        let none = if self.any_none {
            Tri::Yes
        } else if self.bare == Tri::Yes || self.count == 0 {
            Tri::No // the bare document (or any document) is a witness
        } else if self.count == 1 {
            self.single_none
        } else {
            Tri::Maybe // `$gt: 5, $lt: 3` may match nothing
        };
        let all = if self.bare == Tri::No || none == Tri::Yes {
            Tri::No
        } else {
            self.all
        };
        Truth {
            all,
            none,
            bare: self.bare,
        }
    }
}

fn filter_truth(doc: &RawDocument, env: &Env<'_>, depth: usize) -> Res {
    if depth > MAX_DEPTH {
        return Err(Invalid);
    }
    let mut conj = Conj::new();
    for elem in doc.iter_elements() {
        let elem = elem.map_err(|_| Invalid)?;
        let value = elem.value().map_err(|_| Invalid)?;
        match elem.key().as_str() {
            "$comment" => {}
            key => conj.push(clause_truth(key, value, env, depth)?),
        }
    }
    Ok(conj.finish())
}

fn clause_truth(key: &str, value: RawBsonRef<'_>, env: &Env<'_>, depth: usize) -> Res {
    let Some(op) = key.strip_prefix('$') else {
        return field_truth(key, value, depth);
    };
    match op {
        "and" => logical(value, env, depth, false),
        "or" => Ok(logical(value, env, depth, true)?.negate()),
        "nor" => logical(value, env, depth, true),
        "expr" => Ok(match expr_truth(value, env, depth + 1)? {
            Some(true) => ALWAYS,
            Some(false) => NEVER,
            None => OPAQUE,
        }),
        "where" => {
            let code = match value {
                RawBsonRef::String(s) | RawBsonRef::JavaScriptCode(s) => s,
                RawBsonRef::JavaScriptCodeWithScope(c) => c.code,
                _ => return Err(Invalid),
            };
            Ok(match js::constant_result(code) {
                Some(true) => ALWAYS,
                Some(false) => NEVER,
                None => OPAQUE,
            })
        }
        "alwaysTrue" | "alwaysFalse" => match number(value) {
            Some(1.0) if op == "alwaysTrue" => Ok(ALWAYS),
            Some(1.0) => Ok(NEVER),
            _ => Err(Invalid),
        },
        // Implemented by mongod as `$rand < rate`, and `$rand` is in [0, 1).
        "sampleRate" => match number(value) {
            Some(1.0) => Ok(ALWAYS),
            Some(0.0) => Ok(NEVER),
            Some(r) if r > 0.0 && r < 1.0 => Ok(Truth {
                all: Tri::No,
                ..OPAQUE
            }),
            _ => Err(Invalid),
        },
        "jsonSchema" => match value {
            RawBsonRef::Document(d) if d.is_empty() => Ok(ALWAYS),
            RawBsonRef::Document(_) => Ok(OPAQUE),
            _ => Err(Invalid),
        },
        "text" => match value {
            RawBsonRef::Document(_) => Ok(NEEDS_VALUE),
            _ => Err(Invalid),
        },
        _ => Ok(OPAQUE),
    }
}

fn number(v: RawBsonRef<'_>) -> Option<f64> {
    match v {
        RawBsonRef::Double(f) => Some(f),
        RawBsonRef::Int32(n) => Some(f64::from(n)),
        RawBsonRef::Int64(n) => Some(n as f64),
        _ => None,
    }
}

/// The conjunction of `$and` branches, or (with `negated`) of the negated branches, which
/// is `$nor` as is, and `$or` once the caller negates it back. mongod rejects an empty or
/// non-array list.
fn logical(value: RawBsonRef<'_>, env: &Env<'_>, depth: usize, negated: bool) -> Res {
    let RawBsonRef::Array(branches) = value else {
        return Err(Invalid);
    };
    let mut conj = Conj::new();
    for branch in branches {
        let RawBsonRef::Document(d) = branch.map_err(|_| Invalid)? else {
            return Err(Invalid);
        };
        let t = filter_truth(d, env, depth + 1)?;
        conj.push(if negated { t.negate() } else { t });
    }
    if conj.count == 0 {
        return Err(Invalid);
    }
    Ok(conj.finish())
}
