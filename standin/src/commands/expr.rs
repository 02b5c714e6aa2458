//! Aggregation expressions and `$group` accumulators (a small subset).

use std::collections::{HashMap, HashSet};

use bson::{doc, Bson, Document};

use super::CmdError;
use crate::bsonutil::{as_f64, as_i64, compare, id_key};

type R<T> = Result<T, CmdError>;

/// Evaluates an aggregation expression; `None` = missing.
pub(crate) fn eval(d: &Document, e: &Bson) -> R<Option<Bson>> {
    match e {
        Bson::String(s) if s == "$$ROOT" || s == "$$CURRENT" => Ok(Some(Bson::Document(d.clone()))),
        Bson::String(s) if s.starts_with("$$") => Err(CmdError::bad_value(format!(
            "variable {s} is not supported by the mongoguard stand-in"
        ))),
        Bson::String(s) if s.starts_with('$') => {
            let parts: Vec<String> = s[1..].split('.').map(str::to_string).collect();
            let mut cands = Vec::new();
            crate::query::collect_doc(d, &parts, &mut cands);
            let found: Vec<Bson> = cands.into_iter().flatten().cloned().collect();
            let through_array = parts.len() > 1 && found.len() != 1;
            Ok(match found.len() {
                0 if !through_array => None,
                1 => found.into_iter().next(),
                _ => Some(Bson::Array(found)),
            })
        }
        Bson::Document(op) if op.len() == 1 && op.keys().all(|k| k.starts_with('$')) => {
            let Some((name, arg)) = op.iter().next() else {
                return Ok(None);
            };
            if name == "$literal" {
                return Ok(Some(arg.clone()));
            }
            let args: Vec<Option<Bson>> = match arg {
                Bson::Array(a) => a.iter().map(|x| eval(d, x)).collect::<R<_>>()?,
                other => vec![eval(d, other)?],
            };
            operator(name, args)
        }
        Bson::Document(fields) => {
            let mut out = Document::new();
            for (k, v) in fields {
                if let Some(v) = eval(d, v)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        Bson::Array(items) => Ok(Some(Bson::Array(
            items
                .iter()
                .map(|x| Ok(eval(d, x)?.unwrap_or(Bson::Null)))
                .collect::<R<_>>()?,
        ))),
        other => Ok(Some(other.clone())),
    }
}

fn operator(name: &str, args: Vec<Option<Bson>>) -> R<Option<Bson>> {
    let nums =
        || -> Option<Vec<f64>> { args.iter().map(|a| a.as_ref().and_then(as_f64)).collect() };
    let all_int = args
        .iter()
        .all(|a| matches!(a, Some(Bson::Int32(_) | Bson::Int64(_))));
    let v = match name {
        "$add" | "$multiply" => {
            let Some(ns) = nums() else {
                return Ok(Some(Bson::Null));
            };
            if all_int {
                let mut ints = args.iter().filter_map(|a| a.as_ref().and_then(as_i64));
                let r = if name == "$add" {
                    ints.try_fold(0i64, i64::checked_add)
                } else {
                    ints.try_fold(1i64, i64::checked_mul)
                };
                if let Some(r) = r {
                    return Ok(Some(
                        i32::try_from(r).map(Bson::Int32).unwrap_or(Bson::Int64(r)),
                    ));
                }
            }
            let r = if name == "$add" {
                ns.iter().sum()
            } else {
                ns.iter().product()
            };
            Bson::Double(r)
        }
        "$subtract" | "$divide" => match nums().as_deref() {
            Some([a, b]) if name == "$subtract" => {
                if all_int {
                    let (x, y) = (
                        as_i64(args[0].as_ref().unwrap_or(&Bson::Null)),
                        as_i64(args[1].as_ref().unwrap_or(&Bson::Null)),
                    );
                    match (x, y) {
                        (Some(x), Some(y)) => Bson::Int64(x.wrapping_sub(y)),
                        _ => Bson::Double(a - b),
                    }
                } else {
                    Bson::Double(a - b)
                }
            }
            Some([_, b]) if *b == 0.0 => return Err(CmdError::bad_value("can't $divide by zero")),
            Some([a, b]) => Bson::Double(a / b),
            _ => Bson::Null,
        },
        "$concat" => {
            let mut s = String::new();
            for a in &args {
                match a {
                    Some(Bson::String(p)) => s.push_str(p),
                    _ => return Ok(Some(Bson::Null)),
                }
            }
            Bson::String(s)
        }
        "$toUpper" | "$toLower" => match args.first() {
            Some(Some(Bson::String(s))) if name == "$toUpper" => Bson::String(s.to_uppercase()),
            Some(Some(Bson::String(s))) => Bson::String(s.to_lowercase()),
            _ => Bson::String(String::new()),
        },
        "$size" => match args.first() {
            Some(Some(Bson::Array(a))) => Bson::Int32(i32::try_from(a.len()).unwrap_or(i32::MAX)),
            _ => {
                return Err(CmdError::new(
                    17124,
                    "Location17124",
                    "The argument to $size must be an array",
                ))
            }
        },
        "$ifNull" => args
            .into_iter()
            .find_map(|a| a.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)))
            .unwrap_or(Bson::Null),
        other => {
            return Err(CmdError::bad_value(format!(
                "expression operator {other} is not supported by the mongoguard stand-in"
            )))
        }
    };
    Ok(Some(v))
}

fn min_max(slot: &mut Option<Bson>, v: Option<Bson>, is_min: bool) {
    let Some(x) = v.filter(|x| !matches!(x, Bson::Null | Bson::Undefined)) else {
        return;
    };
    let better = slot.as_ref().is_none_or(|c| {
        let o = compare(&x, c);
        if is_min {
            o.is_lt()
        } else {
            o.is_gt()
        }
    });
    if better {
        *slot = Some(x);
    }
}

#[derive(Debug)]
enum Acc {
    Sum {
        i: Option<i64>,
        f: f64,
        any_double: bool,
        any_long: bool,
    },
    Avg(f64, u64),
    Min(Option<Bson>),
    Max(Option<Bson>),
    First(Option<Bson>),
    Last(Option<Bson>),
    Push(Vec<Bson>),
    AddToSet(Vec<Bson>, HashSet<Vec<u8>>),
}

impl Acc {
    fn new(op: &str) -> R<Acc> {
        Ok(match op {
            "$sum" | "$count" => Acc::Sum {
                i: Some(0),
                f: 0.0,
                any_double: false,
                any_long: false,
            },
            "$avg" => Acc::Avg(0.0, 0),
            "$min" => Acc::Min(None),
            "$max" => Acc::Max(None),
            "$first" => Acc::First(None),
            "$last" => Acc::Last(None),
            "$push" => Acc::Push(Vec::new()),
            "$addToSet" => Acc::AddToSet(Vec::new(), HashSet::new()),
            other => {
                return Err(CmdError::new(
                    15952,
                    "Location15952",
                    format!(
                "unknown group operator '{other}' (or not supported by the mongoguard stand-in)"
            ),
                ))
            }
        })
    }

    fn add(&mut self, v: Option<Bson>, first_seen: bool) {
        match self {
            Acc::Sum {
                i,
                f,
                any_double,
                any_long,
            } => match &v {
                Some(n @ (Bson::Int32(_) | Bson::Int64(_))) => {
                    let x = as_i64(n).unwrap_or(0);
                    *any_long |= matches!(n, Bson::Int64(_));
                    *i = i.and_then(|t| t.checked_add(x));
                    *f += x as f64;
                }
                Some(n @ (Bson::Double(_) | Bson::Decimal128(_))) => {
                    *any_double = true;
                    *f += as_f64(n).unwrap_or(0.0);
                }
                _ => {}
            },
            Acc::Avg(s, n) => {
                if let Some(x) = v.as_ref().and_then(as_f64) {
                    *s += x;
                    *n += 1;
                }
            }
            Acc::Min(slot) => min_max(slot, v, true),
            Acc::Max(slot) => min_max(slot, v, false),
            Acc::First(slot) => {
                if first_seen {
                    *slot = Some(v.unwrap_or(Bson::Null));
                }
            }
            Acc::Last(slot) => *slot = Some(v.unwrap_or(Bson::Null)),
            Acc::Push(items) => items.extend(v),
            Acc::AddToSet(items, seen) => {
                if let Some(x) = v {
                    if seen.insert(id_key(&x)) {
                        items.push(x);
                    }
                }
            }
        }
    }

    fn result(self) -> Bson {
        match self {
            Acc::Sum {
                i,
                f,
                any_double,
                any_long,
            } => match i {
                Some(t) if !any_double => {
                    if !any_long {
                        i32::try_from(t).map(Bson::Int32).unwrap_or(Bson::Int64(t))
                    } else {
                        Bson::Int64(t)
                    }
                }
                _ => Bson::Double(f),
            },
            Acc::Avg(s, n) => {
                if n == 0 {
                    Bson::Null
                } else {
                    Bson::Double(s / n as f64)
                }
            }
            Acc::Min(v) | Acc::Max(v) | Acc::First(v) | Acc::Last(v) => v.unwrap_or(Bson::Null),
            Acc::Push(items) | Acc::AddToSet(items, _) => Bson::Array(items),
        }
    }
}

pub(crate) fn group(spec: &Document, docs: Vec<Document>) -> R<Vec<Document>> {
    let Some(id_expr) = spec.get("_id") else {
        return Err(CmdError::new(
            15955,
            "Location15955",
            "a group specification must include an _id",
        ));
    };
    let mut fields = Vec::new();
    for (k, v) in spec {
        if k == "_id" {
            continue;
        }
        match v {
            Bson::Document(a) if a.len() == 1 => {
                let Some((op, arg)) = a.iter().next() else {
                    continue;
                };
                Acc::new(op)?;
                let arg = if op == "$count" {
                    Bson::Int32(1)
                } else {
                    arg.clone()
                };
                fields.push((k.clone(), op.clone(), arg));
            }
            _ => {
                return Err(CmdError::new(
                    40234,
                    "Location40234",
                    format!("The field '{k}' must be an accumulator object"),
                ))
            }
        }
    }
    let mut order: Vec<(Bson, Vec<Acc>)> = Vec::new();
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    for d in &docs {
        let key = eval(d, id_expr)?.unwrap_or(Bson::Null);
        let k = id_key(&key);
        let (slot, first_seen) = match index.get(&k) {
            Some(&i) => (i, false),
            None => {
                let accs = fields
                    .iter()
                    .map(|(_, op, _)| Acc::new(op))
                    .collect::<R<Vec<_>>>()?;
                order.push((key, accs));
                index.insert(k, order.len() - 1);
                (order.len() - 1, true)
            }
        };
        for ((_, _, arg), acc) in fields.iter().zip(order[slot].1.iter_mut()) {
            acc.add(eval(d, arg)?, first_seen);
        }
    }
    Ok(order
        .into_iter()
        .map(|(key, accs)| {
            let mut out = doc! {"_id": key};
            for ((name, _, _), acc) in fields.iter().zip(accs) {
                out.insert(name.clone(), acc.result());
            }
            out
        })
        .collect())
}
