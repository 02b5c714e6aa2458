//! Application of individual update operators.

use bson::{Bson, Document};

use super::paths::{get_path, set_path, unset_path};
use super::{bad_value, type_mismatch, uerr, Result, UpdateError};
use crate::bsonutil::{as_f64, as_i64, compare, values_equal};
use crate::projection::Sort;
use crate::query::Filter;

pub(super) fn apply_op(
    doc: &mut Document,
    op: &str,
    path: &str,
    arg: &Bson,
    inserting: bool,
) -> Result<()> {
    let parts: Vec<&str> = path.split('.').collect();
    let cur = get_path(doc, &parts).cloned();
    let new = match op {
        "$set" => arg.clone(),
        "$setOnInsert" => {
            if !inserting {
                return Ok(());
            }
            arg.clone()
        }
        "$unset" => {
            unset_path(doc, &parts);
            return Ok(());
        }
        "$inc" | "$mul" => {
            if as_f64(arg).is_none() {
                return type_mismatch(format!(
                    "Cannot {} with non-numeric argument: {{{path}: {arg}}}",
                    &op[1..]
                ));
            }
            let base = match &cur {
                None => {
                    if op == "$inc" {
                        Bson::Int32(0)
                    } else {
                        zero_like(arg)
                    }
                }
                Some(c) if as_f64(c).is_some() => c.clone(),
                Some(c) => {
                    return type_mismatch(format!(
                        "Cannot apply {op} to a value of non-numeric type. {{_id: ..}} has the field '{path}' of non-numeric type {:?}",
                        c.element_type()
                    ))
                }
            };
            arith(&base, arg, op == "$mul")
        }
        "$min" | "$max" => match &cur {
            None => arg.clone(),
            Some(c) => {
                let o = compare(arg, c);
                let replace = if op == "$min" { o.is_lt() } else { o.is_gt() };
                if replace {
                    arg.clone()
                } else {
                    return Ok(());
                }
            }
        },
        "$push" | "$addToSet" => {
            let mut arr = match cur {
                None => Vec::new(),
                Some(Bson::Array(a)) => a,
                Some(other) => {
                    return bad_value(format!(
                        "The field '{path}' must be an array but is of type {:?}",
                        other.element_type()
                    ))
                }
            };
            if op == "$push" {
                push(&mut arr, arg)?;
            } else {
                let items = match arg {
                    Bson::Document(d) if d.contains_key("$each") => match d.get("$each") {
                        Some(Bson::Array(a)) => a.clone(),
                        _ => {
                            return bad_value("The argument to $each in $addToSet must be an array")
                        }
                    },
                    other => vec![other.clone()],
                };
                for i in items {
                    if !arr.iter().any(|e| values_equal(e, &i)) {
                        arr.push(i);
                    }
                }
            }
            Bson::Array(arr)
        }
        "$pop" | "$pull" | "$pullAll" => {
            let mut arr = match cur {
                None => return Ok(()),
                Some(Bson::Array(a)) => a,
                Some(other) => {
                    return bad_value(format!(
                        "Cannot apply {op} to a non-array value of type {:?}",
                        other.element_type()
                    ))
                }
            };
            match op {
                "$pop" => {
                    if as_f64(arg).is_some_and(|f| f < 0.0) {
                        if !arr.is_empty() {
                            arr.remove(0);
                        }
                    } else {
                        arr.pop();
                    }
                }
                "$pullAll" => {
                    let Bson::Array(vals) = arg else {
                        return bad_value("$pullAll requires an array argument");
                    };
                    arr.retain(|e| !vals.iter().any(|v| values_equal(e, v)));
                }
                _ => pull(&mut arr, arg)?,
            }
            Bson::Array(arr)
        }
        "$rename" => {
            let Some(v) = cur else { return Ok(()) };
            unset_path(doc, &parts);
            let to: Vec<&str> = arg.as_str().unwrap_or_default().split('.').collect();
            return set_path(doc, &to, v);
        }
        "$currentDate" => {
            let ts =
                matches!(arg, Bson::Document(d) if d.get_str("$type").ok() == Some("timestamp"));
            if ts {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                Bson::Timestamp(bson::Timestamp {
                    time: u32::try_from(secs).unwrap_or(u32::MAX),
                    increment: 1,
                })
            } else {
                Bson::DateTime(bson::DateTime::now())
            }
        }
        other => return uerr(9, "FailedToParse", format!("Unknown modifier: {other}")),
    };
    set_path(doc, &parts, new)
}

fn zero_like(arg: &Bson) -> Bson {
    match arg {
        Bson::Int32(_) => Bson::Int32(0),
        Bson::Int64(_) => Bson::Int64(0),
        _ => Bson::Double(0.0),
    }
}

fn arith(a: &Bson, b: &Bson, mul: bool) -> Bson {
    let int = |x: &Bson| matches!(x, Bson::Int32(_) | Bson::Int64(_));
    if int(a) && int(b) {
        let (x, y) = (as_i64(a).unwrap_or(0), as_i64(b).unwrap_or(0));
        let r = if mul {
            x.checked_mul(y)
        } else {
            x.checked_add(y)
        };
        return match r {
            Some(r) if matches!((a, b), (Bson::Int32(_), Bson::Int32(_))) => {
                i32::try_from(r).map(Bson::Int32).unwrap_or(Bson::Int64(r))
            }
            Some(r) => Bson::Int64(r),
            None => {
                let (x, y) = (x as f64, y as f64);
                Bson::Double(if mul { x * y } else { x + y })
            }
        };
    }
    let (x, y) = (as_f64(a).unwrap_or(0.0), as_f64(b).unwrap_or(0.0));
    Bson::Double(if mul { x * y } else { x + y })
}

fn push(arr: &mut Vec<Bson>, arg: &Bson) -> Result<()> {
    let Bson::Document(spec) = arg else {
        arr.push(arg.clone());
        return Ok(());
    };
    if !spec.contains_key("$each") {
        arr.push(arg.clone());
        return Ok(());
    }
    let Some(Bson::Array(each)) = spec.get("$each") else {
        return bad_value("The argument to $each in $push must be an array");
    };
    for k in spec.keys() {
        if !matches!(k.as_str(), "$each" | "$position" | "$slice" | "$sort") {
            return bad_value(format!("Unrecognized clause in $push: {k}"));
        }
    }
    let pos = match spec.get("$position").map(as_i64) {
        None => arr.len(),
        Some(Some(p)) if p >= 0 => usize::try_from(p).unwrap_or(usize::MAX).min(arr.len()),
        Some(Some(p)) => arr
            .len()
            .saturating_sub(usize::try_from(-p).unwrap_or(usize::MAX)),
        Some(None) => return bad_value("$position must be a number"),
    };
    let tail = arr.split_off(pos);
    arr.extend(each.iter().cloned());
    arr.extend(tail);
    match spec.get("$sort") {
        None => {}
        Some(Bson::Document(s)) => {
            let sort = Sort::parse(Some(s)).map_err(|e| UpdateError {
                code: 2,
                code_name: "BadValue",
                msg: e.0,
            })?;
            let mut docs: Vec<Document> = Vec::new();
            let mut others = Vec::new();
            for e in arr.drain(..) {
                match e {
                    Bson::Document(d) => docs.push(d),
                    o => others.push(o),
                }
            }
            sort.sort(&mut docs);
            arr.extend(others);
            arr.extend(docs.into_iter().map(Bson::Document));
        }
        Some(v) => match as_f64(v) {
            Some(f) if f != 0.0 => {
                arr.sort_by(|a, b| {
                    if f > 0.0 {
                        compare(a, b)
                    } else {
                        compare(b, a)
                    }
                });
            }
            _ => return bad_value("The $sort is invalid: use 1/-1 to sort the whole element"),
        },
    }
    if let Some(s) = spec.get("$slice") {
        let Some(n) = as_i64(s) else {
            return bad_value("The value for $slice must be an integer value");
        };
        let n_abs = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
        if n >= 0 {
            arr.truncate(n_abs);
        } else if arr.len() > n_abs {
            arr.drain(..arr.len() - n_abs);
        }
    }
    Ok(())
}

fn pull(arr: &mut Vec<Bson>, arg: &Bson) -> Result<()> {
    let to_qe = |e: crate::query::QueryError| UpdateError {
        code: 2,
        code_name: "BadValue",
        msg: e.0,
    };
    match arg {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            let mut wrapper = Document::new();
            wrapper.insert("v", arg.clone());
            let f = Filter::parse(&wrapper).map_err(to_qe)?;
            arr.retain(|e| {
                let mut w = Document::new();
                w.insert("v", e.clone());
                !f.matches(&w)
            });
        }
        Bson::Document(d) => {
            let f = Filter::parse(d).map_err(to_qe)?;
            arr.retain(|e| !matches!(e, Bson::Document(ed) if f.matches(ed)));
        }
        other => arr.retain(|e| !values_equal(e, other)),
    }
    Ok(())
}
