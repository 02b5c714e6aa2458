//! Query filters: a best-effort subset of MongoDB's match language.
//!
//! Supported: implicit and `$eq` equality (dotted paths, array-contains, whole embedded
//! documents), `$ne $gt $gte $lt $lte $in $nin $exists $regex/$options` (and regex literals),
//! `$not $and $or $nor $elemMatch $size $all $type $mod`, `$comment`. Anything else is rejected
//! with a BadValue error rather than silently mismatching.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::bsonutil::{as_f64, as_i64, compare, type_order, values_equal};

/// A filter that cannot be evaluated (reported as BadValue, code 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueryError(pub(crate) String);

type Result<T> = std::result::Result<T, QueryError>;

fn bad<T>(msg: impl Into<String>) -> Result<T> {
    Err(QueryError(msg.into()))
}

/// A compiled filter: all clauses must match.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    clauses: Vec<Clause>,
}

#[derive(Debug, Clone)]
enum Clause {
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Nor(Vec<Filter>),
    Field { path: Vec<String>, conds: Vec<Cond> },
}

#[derive(Debug, Clone)]
enum Cond {
    Eq(Bson),
    Ne(Bson),
    Cmp(CmpOp, Bson),
    In(Vec<InItem>),
    Nin(Vec<InItem>),
    Exists(bool),
    Regex(regex::Regex),
    Not(Vec<Cond>),
    ElemMatchDoc(Filter),
    ElemMatchOps(Vec<Cond>),
    Size(usize),
    All(Vec<Bson>),
    Type(Vec<u8>),
    Mod(i64, i64),
}

#[derive(Debug, Clone, Copy)]
enum CmpOp {
    Gt,
    Gte,
    Lt,
    Lte,
}

#[derive(Debug, Clone)]
enum InItem {
    Value(Bson),
    Regex(regex::Regex),
}

impl Filter {
    /// Compiles a filter document.
    pub(crate) fn parse(doc: &Document) -> Result<Filter> {
        let mut clauses = Vec::with_capacity(doc.len());
        for (k, v) in doc {
            match k.as_str() {
                "$and" | "$or" | "$nor" => {
                    let Bson::Array(items) = v else {
                        return bad(format!("{k} must be an array"));
                    };
                    if items.is_empty() {
                        return bad("$and/$or/$nor must be a nonempty array");
                    }
                    let subs = items
                        .iter()
                        .map(|i| match i {
                            Bson::Document(d) => Filter::parse(d),
                            _ => bad("$or/$and/$nor entries need to be full objects"),
                        })
                        .collect::<Result<Vec<_>>>()?;
                    clauses.push(match k.as_str() {
                        "$and" => Clause::And(subs),
                        "$or" => Clause::Or(subs),
                        _ => Clause::Nor(subs),
                    });
                }
                "$comment" => {}
                op if op.starts_with('$') => {
                    return bad(format!(
                    "unknown top level operator: {op} (not supported by the mongoguard stand-in)"
                ))
                }
                path => clauses.push(Clause::Field {
                    path: path.split('.').map(str::to_string).collect(),
                    conds: parse_value_conds(v)?,
                }),
            }
        }
        Ok(Filter { clauses })
    }

    /// Matches everything.
    pub(crate) fn all() -> Filter {
        Filter {
            clauses: Vec::new(),
        }
    }

    pub(crate) fn matches(&self, doc: &Document) -> bool {
        self.clauses.iter().all(|c| match c {
            Clause::And(fs) => fs.iter().all(|f| f.matches(doc)),
            Clause::Or(fs) => fs.iter().any(|f| f.matches(doc)),
            Clause::Nor(fs) => !fs.iter().any(|f| f.matches(doc)),
            Clause::Field { path, conds } => {
                let mut cands = Vec::new();
                collect_doc(doc, path, &mut cands);
                conds.iter().all(|c| cond_holds(c, &cands))
            }
        })
    }

    /// If this filter is exactly `{_id: <scalar>}`, the value (for an indexed lookup).
    pub(crate) fn id_equality(&self) -> Option<&Bson> {
        match self.clauses.as_slice() {
            [Clause::Field { path, conds }] if path.len() == 1 && path[0] == "_id" => {
                match conds.as_slice() {
                    [Cond::Eq(v)]
                        if !matches!(
                            v,
                            Bson::Document(_) | Bson::Array(_) | Bson::Null | Bson::Undefined
                        ) =>
                    {
                        Some(v)
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// Conditions for one field: an operator document, a regex literal, or an equality value.
fn parse_value_conds(v: &Bson) -> Result<Vec<Cond>> {
    match v {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            parse_operators(d)
        }
        Bson::RegularExpression(r) => Ok(vec![Cond::Regex(compile_regex(
            r.pattern.as_str(),
            r.options.as_str(),
        )?)]),
        other => Ok(vec![Cond::Eq(other.clone())]),
    }
}

fn parse_operators(d: &Document) -> Result<Vec<Cond>> {
    let mut conds = Vec::new();
    for (op, arg) in d {
        let c = match op.as_str() {
            "$eq" => Cond::Eq(arg.clone()),
            "$ne" => Cond::Ne(arg.clone()),
            "$gt" => Cond::Cmp(CmpOp::Gt, arg.clone()),
            "$gte" => Cond::Cmp(CmpOp::Gte, arg.clone()),
            "$lt" => Cond::Cmp(CmpOp::Lt, arg.clone()),
            "$lte" => Cond::Cmp(CmpOp::Lte, arg.clone()),
            "$in" => Cond::In(parse_in_list(arg, "$in")?),
            "$nin" => Cond::Nin(parse_in_list(arg, "$nin")?),
            "$exists" => Cond::Exists(crate::bsonutil::truthy(arg)),
            "$regex" => {
                let opts = match d.get("$options") {
                    Some(Bson::String(s)) => s.clone(),
                    Some(_) => return bad("$options has to be a string"),
                    None => String::new(),
                };
                match arg {
                    Bson::String(p) => Cond::Regex(compile_regex(p, &opts)?),
                    Bson::RegularExpression(r) => {
                        let o = if opts.is_empty() {
                            r.options.as_str().to_string()
                        } else {
                            opts
                        };
                        Cond::Regex(compile_regex(r.pattern.as_str(), &o)?)
                    }
                    _ => return bad("$regex has to be a string"),
                }
            }
            "$options" => {
                if !d.contains_key("$regex") {
                    return bad("$options needs a $regex");
                }
                continue;
            }
            "$not" => match arg {
                Bson::Document(inner) => Cond::Not(parse_operators(inner)?),
                Bson::RegularExpression(r) => Cond::Not(vec![Cond::Regex(compile_regex(
                    r.pattern.as_str(),
                    r.options.as_str(),
                )?)]),
                _ => return bad("$not needs a regex or a document"),
            },
            "$elemMatch" => match arg {
                Bson::Document(inner) => {
                    let first = inner.keys().next().map(String::as_str).unwrap_or("");
                    if first.starts_with('$') && !matches!(first, "$and" | "$or" | "$nor") {
                        Cond::ElemMatchOps(parse_operators(inner)?)
                    } else {
                        Cond::ElemMatchDoc(Filter::parse(inner)?)
                    }
                }
                _ => return bad("$elemMatch needs an Object"),
            },
            "$size" => match as_i64(arg) {
                Some(n) if n >= 0 => Cond::Size(n as usize),
                _ => return bad("$size needs a non-negative number"),
            },
            "$all" => match arg {
                Bson::Array(a) => Cond::All(a.clone()),
                _ => return bad("$all needs an array"),
            },
            "$type" => {
                let items = match arg {
                    Bson::Array(a) => a.iter().collect::<Vec<_>>(),
                    other => vec![other],
                };
                let codes = items
                    .into_iter()
                    .map(type_code)
                    .collect::<Result<Vec<_>>>()?;
                Cond::Type(codes)
            }
            "$mod" => match arg {
                Bson::Array(a) if a.len() == 2 => match (as_i64(&a[0]), as_i64(&a[1])) {
                    (Some(0), _) => return bad("divisor cannot be 0"),
                    (Some(dv), Some(r)) => Cond::Mod(dv, r),
                    _ => return bad("malformed mod, divisor and remainder must be numbers"),
                },
                _ => return bad("malformed mod, needs to be an array of two numbers"),
            },
            other => {
                return bad(format!(
                    "unknown operator: {other} (not supported by the mongoguard stand-in)"
                ))
            }
        };
        conds.push(c);
    }
    Ok(conds)
}

fn parse_in_list(arg: &Bson, op: &str) -> Result<Vec<InItem>> {
    let Bson::Array(a) = arg else {
        return bad(format!("{op} needs an array"));
    };
    a.iter()
        .map(|v| match v {
            Bson::RegularExpression(r) => Ok(InItem::Regex(compile_regex(
                r.pattern.as_str(),
                r.options.as_str(),
            )?)),
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                bad(format!("cannot nest $ under {op}"))
            }
            other => Ok(InItem::Value(other.clone())),
        })
        .collect()
}

fn type_code(b: &Bson) -> Result<u8> {
    if let Some(n) = as_i64(b) {
        return u8::try_from(n)
            .map_err(|_| QueryError(format!("invalid numerical type code: {n}")));
    }
    let code = match b.as_str().unwrap_or("") {
        "double" => 1,
        "string" => 2,
        "object" => 3,
        "array" => 4,
        "binData" => 5,
        "undefined" => 6,
        "objectId" => 7,
        "bool" => 8,
        "date" => 9,
        "null" => 10,
        "regex" => 11,
        "javascript" => 13,
        "int" => 16,
        "timestamp" => 17,
        "long" => 18,
        "decimal" => 19,
        "minKey" => 255,
        "maxKey" => 127,
        "number" => 0,
        other => return bad(format!("unknown type name alias: {other}")),
    };
    Ok(code)
}

fn element_type_code(v: &Bson) -> u8 {
    v.element_type() as u8
}

/// Compiles a MongoDB regex (PCRE-ish) with its option letters using the `regex` crate.
pub(crate) fn compile_regex(pattern: &str, options: &str) -> Result<regex::Regex> {
    let mut b = regex::RegexBuilder::new(pattern);
    for o in options.chars() {
        match o {
            'i' => b.case_insensitive(true),
            'm' => b.multi_line(true),
            's' => b.dot_matches_new_line(true),
            'x' => b.ignore_whitespace(true),
            'u' | 'l' => &mut b,
            other => return bad(format!("invalid flag in regex options: {other}")),
        };
    }
    b.build()
        .map_err(|e| QueryError(format!("Regular expression is invalid: {e}")))
}

/// Collects the values a dotted path reaches in a document (MongoDB array traversal);
/// `None` marks a branch where the path is missing.
pub(crate) fn collect_doc<'a>(d: &'a Document, path: &[String], out: &mut Vec<Option<&'a Bson>>) {
    let Some(first) = path.first() else { return };
    match d.get(first) {
        None => out.push(None),
        Some(v) => collect_val(v, &path[1..], out),
    }
}

fn collect_val<'a>(v: &'a Bson, rest: &[String], out: &mut Vec<Option<&'a Bson>>) {
    if rest.is_empty() {
        out.push(Some(v));
        return;
    }
    match v {
        Bson::Document(d) => collect_doc(d, rest, out),
        Bson::Array(arr) => {
            let before = out.len();
            if let Ok(i) = rest[0].parse::<usize>() {
                if let Some(e) = arr.get(i) {
                    collect_val(e, &rest[1..], out);
                }
            }
            for e in arr {
                if let Bson::Document(d) = e {
                    collect_doc(d, rest, out);
                }
            }
            if out.len() == before {
                out.push(None);
            }
        }
        _ => out.push(None),
    }
}

/// True if `pred` holds for some reached value or some element of a reached array.
fn any_value(cands: &[Option<&Bson>], pred: &dyn Fn(&Bson) -> bool) -> bool {
    cands.iter().flatten().any(|v| {
        pred(v)
            || match v {
                Bson::Array(a) => a.iter().any(pred),
                _ => false,
            }
    })
}

fn eq_holds(x: &Bson, cands: &[Option<&Bson>]) -> bool {
    if matches!(x, Bson::Null)
        && cands
            .iter()
            .any(|c| c.is_none_or(|v| matches!(v, Bson::Null | Bson::Undefined)))
    {
        return true;
    }
    any_value(cands, &|v| values_equal(v, x))
}

fn in_holds(items: &[InItem], cands: &[Option<&Bson>]) -> bool {
    items.iter().any(|i| match i {
        InItem::Value(x) => eq_holds(x, cands),
        InItem::Regex(re) => any_value(cands, &|v| regex_match(re, v)),
    })
}

fn regex_match(re: &regex::Regex, v: &Bson) -> bool {
    match v {
        Bson::String(s) | Bson::Symbol(s) => re.is_match(s),
        _ => false,
    }
}

fn cond_holds(c: &Cond, cands: &[Option<&Bson>]) -> bool {
    match c {
        Cond::Eq(x) => eq_holds(x, cands),
        Cond::Ne(x) => !eq_holds(x, cands),
        Cond::Cmp(op, x) => {
            let inclusive = matches!(op, CmpOp::Gte | CmpOp::Lte);
            if inclusive && matches!(x, Bson::Null) && eq_holds(x, cands) {
                return true;
            }
            any_value(cands, &|v| {
                if type_order(v) != type_order(x) {
                    return false;
                }
                let o = compare(v, x);
                match op {
                    CmpOp::Gt => o == Ordering::Greater,
                    CmpOp::Gte => o != Ordering::Less,
                    CmpOp::Lt => o == Ordering::Less,
                    CmpOp::Lte => o != Ordering::Greater,
                }
            })
        }
        Cond::In(items) => in_holds(items, cands),
        Cond::Nin(items) => !in_holds(items, cands),
        Cond::Exists(want) => cands.iter().any(Option::is_some) == *want,
        Cond::Regex(re) => any_value(cands, &|v| regex_match(re, v)),
        Cond::Not(inner) => !inner.iter().all(|c| cond_holds(c, cands)),
        Cond::ElemMatchDoc(f) => cands.iter().flatten().any(|v| match v {
            Bson::Array(a) => a.iter().any(|e| match e {
                Bson::Document(d) => f.matches(d),
                _ => false,
            }),
            _ => false,
        }),
        Cond::ElemMatchOps(conds) => cands.iter().flatten().any(|v| match v {
            Bson::Array(a) => a.iter().any(|e| {
                let one = [Some(e)];
                conds.iter().all(|c| cond_holds(c, &one))
            }),
            _ => false,
        }),
        Cond::Size(n) => cands
            .iter()
            .flatten()
            .any(|v| matches!(v, Bson::Array(a) if a.len() == *n)),
        Cond::All(xs) => {
            !xs.is_empty()
                && cands.iter().flatten().any(|v| {
                    xs.iter().all(|x| {
                        values_equal(v, x)
                            || matches!(v, Bson::Array(a) if a.iter().any(|e| values_equal(e, x)))
                    })
                })
        }
        Cond::Type(codes) => {
            let check = |v: &Bson| {
                let t = element_type_code(v);
                codes
                    .iter()
                    .any(|&c| c == t || (c == 0 && type_order(v) == 3))
            };
            cands
                .iter()
                .flatten()
                .any(|v| check(v) || matches!(v, Bson::Array(a) if a.iter().any(check)))
        }
        Cond::Mod(dv, r) => any_value(cands, &|v| {
            as_f64(v).is_some() && as_i64(v).is_some_and(|n| n.wrapping_rem(*dv) == *r)
        }),
    }
}

#[cfg(test)]
mod tests;
