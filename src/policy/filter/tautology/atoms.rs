//! Excluded middle: `{$or: [{a: {$exists: true}}, {a: {$exists: false}}]}`,
//! `{$or: [{a: 5}, {a: {$ne: 5}}]}`, `{$nor: [{a: {$gt: 1}}, {a: {$not: {$gt: 1}}}]}`.
//!
//! Each branch alone leaves documents out, so the structural analysis cannot conclude. Here
//! the filter is read as a propositional formula over *atoms*: one leaf predicate on one
//! path (`a $eq 5`, `a $exists`, `a $gt 1`). mongod itself builds `$ne: v` as NOT(`$eq: v`),
//! `$nin: L` as NOT(`$in: L`), `$exists: false` as NOT(`$exists: true`) and
//! `a: {$not: {...}}` as NOT of the path's conjunction
//! (src/mongo/db/matcher/expression_parser.cpp), so these are real negations on any path,
//! arrays and missing fields included. Two leaves are the same atom only when path,
//! operator and operand are identical (same BSON type and bytes); everything else is a
//! different, *independent* atom. The filter is proved to match every document when it is
//! true under every assignment of truth values to its atoms: a document gives each atom one
//! definite value, so it is one of the assignments tried. Treating atoms as independent only
//! loses proofs (`{$or: [{a: {$gt: 5}}, {a: {$lte: 5}}]}` is rightly not proved: a string, a
//! missing field or an array `[]` fails both), never makes a false one.
//!
//! Leaves the structural analysis already knows to be constant (`{a: {$nin: []}}`,
//! `{_id: {$exists: true}}`, a constant `$expr`) keep their value; opaque ones (JavaScript, a
//! non-constant `$expr`, `$sampleRate` which draws a new random number each time, `$regex`
//! with `$options`) are unknown under every assignment (Kleene logic), so they never help a
//! proof. The pass is bounded: at most [`MAX_ATOMS`] atoms (2^4 assignments),
//! [`MAX_LEAVES`] leaves and [`MAX_BYTES`] of filter, else it gives up.

use bson::{RawBsonRef, RawDocument};

use super::constant::Env;
use super::fields::{op_truth, PathKind};
use super::{clause_truth, Tri, Truth};
use crate::policy::filter::{is_operator_doc, true_value, MAX_DEPTH};

/// Most distinct atoms tried (2^MAX_ATOMS assignments).
const MAX_ATOMS: usize = 4;
/// Most leaves (clauses and field operators) walked per evaluation.
const MAX_LEAVES: usize = 32;
/// Largest filter (in bytes) the pass reads: each of up to 2^MAX_ATOMS evaluations walks the
/// whole filter, operand lists included, so the work stays below 16 × 4 KiB of BSON. A larger
/// filter is left unknown (and measured).
const MAX_BYTES: usize = 4096;

/// The operator key of a literal regex (`{a: /x/}`, `{a: {$not: /x/}}`): a pattern match,
/// unlike `{a: {$eq: /x/}}`.
const REGEX_MATCH: &str = "/";

/// One leaf predicate: a path, an operator and its operand.
#[derive(Clone, Copy, PartialEq)]
struct Atom<'a> {
    path: &'a str,
    op: &'a str,
    value: RawBsonRef<'a>,
}

/// The atoms met so far, and the assignment being tried.
struct Table<'a> {
    atoms: [Option<Atom<'a>>; MAX_ATOMS],
    len: usize,
    leaves: usize,
    /// Collecting atoms (first walk) rather than evaluating an assignment.
    gathering: bool,
    assignment: u32,
}

/// Gave up: too many atoms or leaves, too deep, or malformed.
struct GiveUp;

type Eval = Result<Tri, GiveUp>;

/// Whether the filter is a tautology over its atoms (see the module docs).
pub(super) fn covers_all(filter: &RawDocument, env: &Env<'_>) -> bool {
    if filter.as_bytes().len() > MAX_BYTES {
        return false;
    }
    let mut table = Table {
        atoms: [None; MAX_ATOMS],
        len: 0,
        leaves: 0,
        gathering: true,
        assignment: 0,
    };
    if filter_eval(filter, env, &mut table, 0).is_err() || table.len == 0 {
        return false;
    }
    table.gathering = false;
    for assignment in 0..(1u32 << table.len) {
        table.assignment = assignment;
        table.leaves = 0;
        match filter_eval(filter, env, &mut table, 0) {
            Ok(Tri::Yes) => {}
            _ => return false,
        }
    }
    true
}

impl<'a> Table<'a> {
    fn leaf(&mut self) -> Result<(), GiveUp> {
        self.leaves += 1;
        if self.leaves > MAX_LEAVES {
            return Err(GiveUp);
        }
        Ok(())
    }

    /// The value of an atom under the current assignment (`Maybe` while gathering).
    fn atom(&mut self, a: Atom<'a>) -> Eval {
        self.leaf()?;
        let found = self
            .atoms
            .iter()
            .take(self.len)
            .position(|x| x.as_ref() == Some(&a));
        match (found, self.gathering) {
            (Some(i), false) => Ok(Tri::from_bool(self.assignment & (1 << i) != 0)),
            (None, false) => Err(GiveUp), // cannot happen: every atom was collected
            (Some(_), true) => Ok(Tri::Maybe),
            (None, true) => {
                let slot = self.atoms.get_mut(self.len).ok_or(GiveUp)?;
                *slot = Some(a);
                self.len += 1;
                Ok(Tri::Maybe)
            }
        }
    }
}

fn or(a: Tri, b: Tri) -> Tri {
    a.not().and(b.not()).not()
}

/// What a structural [`Truth`] says for every document: `Yes` / `No` when constant.
fn constant(t: Truth) -> Tri {
    if t.all == Tri::Yes {
        Tri::Yes
    } else if t.none == Tri::Yes {
        Tri::No
    } else {
        Tri::Maybe
    }
}

fn filter_eval<'a>(doc: &'a RawDocument, env: &Env<'_>, t: &mut Table<'a>, depth: usize) -> Eval {
    if depth > MAX_DEPTH {
        return Err(GiveUp);
    }
    let mut acc = Tri::Yes;
    for elem in doc.iter_elements() {
        let elem = elem.map_err(|_| GiveUp)?;
        let value = elem.value().map_err(|_| GiveUp)?;
        let key = elem.key().as_str();
        let this = match key {
            "$comment" => continue,
            "$and" | "$or" | "$nor" => {
                let RawBsonRef::Array(branches) = value else {
                    return Err(GiveUp);
                };
                let is_and = key == "$and";
                let mut any = false;
                // $and: all branches; $or: any branch; $nor: no branch.
                let mut r = if is_and { Tri::Yes } else { Tri::No };
                for b in branches {
                    let RawBsonRef::Document(d) = b.map_err(|_| GiveUp)? else {
                        return Err(GiveUp);
                    };
                    let v = filter_eval(d, env, t, depth + 1)?;
                    r = if is_and { r.and(v) } else { or(r, v) };
                    any = true;
                }
                if !any {
                    return Err(GiveUp);
                }
                if key == "$nor" {
                    r.not()
                } else {
                    r
                }
            }
            k if k.starts_with('$') => {
                t.leaf()?;
                constant(clause_truth(k, value, env, depth).map_err(|_| GiveUp)?)
            }
            path => field_eval(path, value, t, depth)?,
        };
        acc = acc.and(this);
    }
    Ok(acc)
}

fn field_eval<'a>(path: &'a str, value: RawBsonRef<'a>, t: &mut Table<'a>, depth: usize) -> Eval {
    match value {
        RawBsonRef::Document(d) if is_operator_doc(d) => ops_eval(path, d, t, depth + 1),
        RawBsonRef::RegularExpression(_) => t.atom(Atom {
            path,
            op: REGEX_MATCH,
            value,
        }),
        RawBsonRef::Undefined => Err(GiveUp),
        _ => t.atom(Atom {
            path,
            op: "$eq",
            value,
        }),
    }
}

/// The operators on one path: a conjunction.
fn ops_eval<'a>(path: &'a str, ops: &'a RawDocument, t: &mut Table<'a>, depth: usize) -> Eval {
    if depth > MAX_DEPTH {
        return Err(GiveUp);
    }
    let at = PathKind::of(path);
    let mut acc = Tri::Yes;
    for elem in ops.iter_elements() {
        let elem = elem.map_err(|_| GiveUp)?;
        let value = elem.value().map_err(|_| GiveUp)?;
        let op = elem.key().as_str();
        // `$regex` with `$options` is one predicate spread over two keys: opaque here.
        if matches!(op, "$regex" | "$options") {
            t.leaf()?;
            acc = acc.and(Tri::Maybe);
            continue;
        }
        if matches!(op, "$maxDistance" | "$minDistance") {
            continue;
        }
        let known = constant(op_truth(op, value, at, depth).map_err(|_| GiveUp)?);
        let this = if known != Tri::Maybe {
            t.leaf()?;
            known
        } else {
            match (op, value) {
                ("$ne", v) => t
                    .atom(Atom {
                        path,
                        op: "$eq",
                        value: v,
                    })?
                    .not(),
                ("$nin", v) => t
                    .atom(Atom {
                        path,
                        op: "$in",
                        value: v,
                    })?
                    .not(),
                ("$exists", v) => {
                    let a = t.atom(Atom {
                        path,
                        op,
                        value: RawBsonRef::Boolean(true),
                    })?;
                    if true_value(v) {
                        a
                    } else {
                        a.not()
                    }
                }
                ("$not", RawBsonRef::Document(d)) if is_operator_doc(d) => {
                    ops_eval(path, d, t, depth + 1)?.not()
                }
                ("$not", RawBsonRef::RegularExpression(_)) => t
                    .atom(Atom {
                        path,
                        op: REGEX_MATCH,
                        value,
                    })?
                    .not(),
                ("$not", _) => return Err(GiveUp),
                // Known operators whose answer depends on the value only.
                (
                    "$eq" | "$gt" | "$gte" | "$lt" | "$lte" | "$in" | "$all" | "$type" | "$size"
                    | "$mod" | "$elemMatch" | "$bitsAllSet" | "$bitsAllClear" | "$bitsAnySet"
                    | "$bitsAnyClear",
                    v,
                ) => t.atom(Atom { path, op, value: v })?,
                _ => {
                    t.leaf()?;
                    Tri::Maybe
                }
            }
        };
        acc = acc.and(this);
    }
    // Keep the structural checks (mongod would reject an empty operator document).
    if ops.is_empty() {
        return Err(GiveUp);
    }
    Ok(acc)
}
