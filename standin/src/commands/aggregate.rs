//! `aggregate` with a small set of stages, and a token `explain`.
//!
//! Stages: `$match $sort $limit $skip $project $addFields/$set $unset $count $group $unwind
//! $replaceRoot/$replaceWith`. Expressions: field paths, `$$ROOT`, literals, `$literal $add
//! $subtract $multiply $divide $concat $toUpper $toLower $size $ifNull`. Accumulators: `$sum
//! $avg $min $max $first $last $push $addToSet $count`.

use bson::{doc, Bson, Document};

use super::admin::first_batch_reply;
use super::expr::{eval, group};
use super::read::query_docs;
use super::{CmdError, CmdResult, Ctx};
use crate::bsonutil::{as_i64, truthy};
use crate::projection::{Projection, Sort};
use crate::query::Filter;
use crate::update::{set_path, unset_path};

type R<T> = Result<T, CmdError>;

pub(crate) fn aggregate(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = match cmd.values().next() {
        Some(Bson::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            return Err(CmdError::bad_value(
                "database-level aggregation ({aggregate: 1}) is not supported by the mongoguard stand-in",
            ))
        }
    };
    let Some(Bson::Array(pipeline)) = cmd.get("pipeline") else {
        return Err(CmdError::type_mismatch("'pipeline' must be an array"));
    };
    let stages = pipeline
        .iter()
        .map(|s| match s {
            Bson::Document(d) if d.len() == 1 => Ok(d),
            _ => Err(CmdError::new(
                40323,
                "Location40323",
                "A pipeline stage specification object must contain exactly one field.",
            )),
        })
        .collect::<R<Vec<_>>>()?;
    let ns = format!("{}.{coll}", ctx.db);
    if cmd.get("explain").is_some_and(truthy) {
        return Ok(explain_doc(ctx, &ns, &Document::new(), None, &coll));
    }
    if !matches!(cmd.get("cursor"), Some(Bson::Document(_))) {
        return Err(CmdError::failed_to_parse(
            "The 'cursor' option is required, except for aggregate with the explain argument",
        ));
    }
    // Push a leading $match into the collection scan.
    let (initial, rest) = match stages.split_first() {
        Some((first, rest)) if first.contains_key("$match") => {
            let f = match first.get("$match") {
                Some(Bson::Document(d)) => Filter::parse(d)?,
                _ => {
                    return Err(CmdError::bad_value(
                        "the match filter must be an expression in an object",
                    ))
                }
            };
            (f, rest)
        }
        _ => (Filter::all(), stages.as_slice()),
    };
    let mut docs = query_docs(
        ctx.shared,
        &ctx.db,
        &coll,
        &initial,
        &Sort::default(),
        0,
        0,
        &Projection::All,
    );
    for stage in rest {
        docs = run_stage(stage, docs)?;
    }
    first_batch_reply(ctx, ns, docs.into(), cmd)
}

fn run_stage(stage: &Document, mut docs: Vec<Document>) -> R<Vec<Document>> {
    let Some((name, arg)) = stage.iter().next() else {
        return Ok(docs);
    };
    let spec = || match arg {
        Bson::Document(d) => Ok(d),
        _ => Err(CmdError::bad_value(format!(
            "{name} specification must be an object"
        ))),
    };
    match name.as_str() {
        "$match" => {
            let f = Filter::parse(spec()?)?;
            docs.retain(|d| f.matches(d));
        }
        "$sort" => Sort::parse(Some(spec()?))?.sort(&mut docs),
        "$limit" => match as_i64(arg) {
            Some(n) if n > 0 => docs.truncate(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(CmdError::new(
                    15958,
                    "Location15958",
                    "the limit must be positive",
                ))
            }
        },
        "$skip" => match as_i64(arg) {
            Some(n) if n >= 0 => {
                let n = usize::try_from(n).unwrap_or(usize::MAX).min(docs.len());
                docs.drain(..n);
            }
            _ => {
                return Err(CmdError::new(
                    15956,
                    "Location15956",
                    "$skip must be a non-negative number",
                ))
            }
        },
        "$project" => docs = project(spec()?, docs)?,
        "$addFields" | "$set" => {
            let s = spec()?;
            for d in docs.iter_mut() {
                add_fields(s, d)?;
            }
        }
        "$unset" => {
            let fields: Vec<String> = match arg {
                Bson::String(s) => vec![s.clone()],
                Bson::Array(a) => a
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
                _ => {
                    return Err(CmdError::bad_value(
                        "$unset specification must be a string or an array",
                    ))
                }
            };
            for d in docs.iter_mut() {
                for f in &fields {
                    unset_path(d, &f.split('.').collect::<Vec<_>>());
                }
            }
        }
        "$count" => {
            let Bson::String(field) = arg else {
                return Err(CmdError::bad_value(
                    "the count field must be a non-empty string",
                ));
            };
            let n = docs.len();
            docs = if n == 0 {
                Vec::new()
            } else {
                let mut d = Document::new();
                d.insert(field.clone(), i32::try_from(n).unwrap_or(i32::MAX));
                vec![d]
            };
        }
        "$group" => docs = group(spec()?, docs)?,
        "$unwind" => docs = unwind(arg, docs)?,
        "$replaceRoot" | "$replaceWith" => {
            let expr = if name == "$replaceRoot" {
                spec()?.get("newRoot").cloned().unwrap_or(Bson::Null)
            } else {
                arg.clone()
            };
            docs = docs
                .iter()
                .map(|d| match eval(d, &expr)? {
                    Some(Bson::Document(n)) => Ok(n),
                    _ => Err(CmdError::new(
                        40228,
                        "Location40228",
                        "'newRoot' expression must evaluate to an object",
                    )),
                })
                .collect::<R<_>>()?;
        }
        "$lookup" | "$facet" | "$out" | "$merge" | "$bucket" | "$bucketAuto" | "$graphLookup"
        | "$sample" | "$geoNear" | "$sortByCount" | "$redact" | "$densify" | "$fill"
        | "$setWindowFields" | "$unionWith" | "$collStats" | "$indexStats" => {
            return Err(CmdError::bad_value(format!(
                "pipeline stage {name} is not supported by the mongoguard stand-in"
            )))
        }
        other => {
            return Err(CmdError::new(
                40324,
                "Location40324",
                format!("Unrecognized pipeline stage name: '{other}'"),
            ))
        }
    }
    Ok(docs)
}

fn is_flag(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
    )
}

fn project(spec: &Document, docs: Vec<Document>) -> R<Vec<Document>> {
    if spec.values().all(is_flag) {
        let p = Projection::parse(Some(spec))?;
        return Ok(docs.iter().map(|d| p.apply(d)).collect());
    }
    // Inclusions plus computed fields.
    let mut incl = Document::new();
    let mut computed = Vec::new();
    for (k, v) in spec {
        if is_flag(v) {
            if !truthy(v) && k != "_id" {
                return Err(CmdError::new(
                    31254,
                    "Location31254",
                    format!("Cannot do exclusion on field {k} in inclusion projection"),
                ));
            }
            incl.insert(k.clone(), v.clone());
        } else {
            computed.push((k, v));
        }
    }
    let p = Projection::parse(Some(&incl))?;
    docs.iter()
        .map(|d| {
            let mut out = if incl.is_empty() {
                d.get("_id")
                    .map(|id| doc! {"_id": id.clone()})
                    .unwrap_or_default()
            } else {
                p.apply(d)
            };
            for (k, e) in &computed {
                let v = eval(d, e)?.unwrap_or(Bson::Null);
                set_path(&mut out, &k.split('.').collect::<Vec<_>>(), v)?;
            }
            Ok(out)
        })
        .collect()
}

fn add_fields(spec: &Document, d: &mut Document) -> R<()> {
    let src = d.clone();
    for (k, e) in spec {
        let parts: Vec<&str> = k.split('.').collect();
        match eval(&src, e)? {
            Some(v) => set_path(d, &parts, v)?,
            None => unset_path(d, &parts),
        }
    }
    Ok(())
}

fn unwind(arg: &Bson, docs: Vec<Document>) -> R<Vec<Document>> {
    let (path, preserve, index_field) = match arg {
        Bson::String(p) => (p.clone(), false, None),
        Bson::Document(d) => (
            d.get_str("path").unwrap_or_default().to_string(),
            d.get("preserveNullAndEmptyArrays").is_some_and(truthy),
            d.get_str("includeArrayIndex").ok().map(str::to_string),
        ),
        _ => return Err(CmdError::bad_value("$unwind needs a path")),
    };
    let Some(field) = path.strip_prefix('$') else {
        return Err(CmdError::bad_value(
            "$unwind path must be prefixed by a '$'",
        ));
    };
    let parts: Vec<&str> = field.split('.').collect();
    let mut out = Vec::new();
    for d in docs {
        let value = crate::update::get_path(&d, &parts).cloned();
        match value {
            Some(Bson::Array(items)) if !items.is_empty() => {
                for (i, item) in items.into_iter().enumerate() {
                    let mut n = d.clone();
                    set_path(&mut n, &parts, item)?;
                    if let Some(f) = &index_field {
                        n.insert(f.clone(), i as i64);
                    }
                    out.push(n);
                }
            }
            Some(Bson::Array(_)) | Some(Bson::Null) | None => {
                if preserve {
                    let mut n = d;
                    if let Some(f) = &index_field {
                        n.insert(f.clone(), Bson::Null);
                    }
                    out.push(n);
                }
            }
            Some(_) => out.push(d),
        }
    }
    Ok(out)
}

/// The winning plan mongod's planner would pick, simplified: an index whose leading field the
/// filter constrains (equality, `$in`, a range) wins — the one matching the longest prefix of
/// equality fields — else an index whose key order gives the sort, else a collection scan. The
/// sort is in memory (a SORT stage) unless the chosen index gives the order after its
/// equality prefix (in either direction). Stage names and shapes as mongod's classic engine
/// reports them (`explainVersion: "1"`: SORT / FETCH / IXSCAN / COLLSCAN).
pub(crate) fn plan_for(
    indexes: &[Document],
    filter: &Document,
    sort: Option<&Document>,
) -> Document {
    let constrained = |field: &str| -> Option<bool> {
        // Some(true): equality-like; Some(false): a range; None: not constrained.
        let v = filter.get(field)?;
        match v {
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                if d.contains_key("$eq") || d.contains_key("$in") {
                    Some(true)
                } else if ["$gt", "$gte", "$lt", "$lte"]
                    .iter()
                    .any(|k| d.contains_key(*k))
                {
                    Some(false)
                } else {
                    None
                }
            }
            _ => Some(true),
        }
    };
    let mut all = vec![doc! {"key": {"_id": 1}, "name": "_id_"}];
    all.extend(indexes.iter().cloned());
    let key_of = |ix: &Document| ix.get_document("key").cloned().unwrap_or_default();
    let sort_fields: Vec<(String, i64)> = sort
        .map(|s| {
            s.iter()
                .map(|(k, v)| (k.clone(), crate::bsonutil::as_i64(v).unwrap_or(1)))
                .collect()
        })
        .unwrap_or_default();
    // How an index serves: (equality prefix length, first field constrained at all).
    let mut best: Option<(usize, Document)> = None;
    for ix in &all {
        let key = key_of(ix);
        let fields: Vec<&String> = key.keys().collect();
        let Some(first) = fields.first() else {
            continue;
        };
        if constrained(first).is_none() {
            continue;
        }
        let eq_prefix = fields
            .iter()
            .take_while(|f| constrained(f) == Some(true))
            .count()
            .max(1);
        if best.as_ref().is_none_or(|(n, _)| eq_prefix > *n) {
            best = Some((eq_prefix, ix.clone()));
        }
    }
    let gives_sort = |ix: &Document, skip: usize| -> bool {
        if sort_fields.is_empty() {
            return true;
        }
        let key = key_of(ix);
        let rest: Vec<(String, i64)> = key
            .iter()
            .skip(skip)
            .map(|(k, v)| (k.clone(), crate::bsonutil::as_i64(v).unwrap_or(1)))
            .collect();
        if rest.len() < sort_fields.len() {
            return false;
        }
        let forward = sort_fields
            .iter()
            .zip(&rest)
            .all(|(s, r)| s.0 == r.0 && s.1 == r.1);
        let backward = sort_fields
            .iter()
            .zip(&rest)
            .all(|(s, r)| s.0 == r.0 && s.1 == -r.1);
        forward || backward
    };
    if best.is_none() && !sort_fields.is_empty() {
        // No index for the filter: one that gives the order is scanned whole.
        if let Some(ix) = all.iter().find(|ix| gives_sort(ix, 0)) {
            best = Some((0, ix.clone()));
        }
    }
    let ixscan = |ix: &Document| {
        doc! {"stage": "FETCH", "inputStage": {"stage": "IXSCAN",
        "keyPattern": key_of(ix), "indexName": ix.get_str("name").unwrap_or("?"),
        "direction": "forward"}}
    };
    let (access, sorted) = match &best {
        Some((eq, ix)) => (ixscan(ix), gives_sort(ix, *eq)),
        None => (
            doc! {"stage": "COLLSCAN", "filter": filter.clone(), "direction": "forward"},
            sort_fields.is_empty(),
        ),
    };
    if sorted {
        access
    } else {
        doc! {"stage": "SORT", "sortPattern": sort.cloned().unwrap_or_default(),
        "memLimit": 104_857_600i64, "type": "simple", "inputStage": access}
    }
}

fn explain_doc(
    ctx: &Ctx,
    ns: &str,
    filter: &Document,
    sort: Option<&Document>,
    coll: &str,
) -> Document {
    let indexes = ctx
        .shared
        .store
        .get(&ctx.db, coll)
        .map(|c| c.data.read().indexes.clone())
        .unwrap_or_default();
    let plan = plan_for(&indexes, filter, sort);
    doc! {
        "explainVersion": "1",
        "queryPlanner": {
            "namespace": ns, "indexFilterSet": false, "parsedQuery": filter.clone(),
            "winningPlan": plan, "rejectedPlans": [],
        },
        "serverInfo": {"host": ctx.shared.host_port(), "version": crate::version_for_wire(ctx.shared.config.wire_version)},
    }
}

pub(crate) fn explain(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let Some(Bson::Document(inner)) = cmd.get("explain") else {
        return Err(CmdError::type_mismatch("explain needs a command object"));
    };
    // mongod: explain takes only these around the explained command (IDL explain.idl).
    for (k, _) in cmd.iter().skip(1) {
        if !matches!(
            k.as_str(),
            "verbosity"
                | "$db"
                | "lsid"
                | "$clusterTime"
                | "$readPreference"
                | "maxTimeMS"
                | "comment"
                | "apiVersion"
                | "apiStrict"
                | "apiDeprecationErrors"
        ) {
            return Err(CmdError::new(
                40415,
                "Location40415",
                format!("BSON field 'explain.{k}' is an unknown field."),
            ));
        }
    }
    let coll = inner
        .values()
        .next()
        .and_then(Bson::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut filter = match inner
        .get("filter")
        .or_else(|| inner.get("query"))
        .or_else(|| inner.get("q"))
    {
        Some(Bson::Document(f)) => f.clone(),
        _ => Document::new(),
    };
    let mut sort = inner.get_document("sort").ok().cloned();
    if let Some(Bson::Array(pipeline)) = inner.get("pipeline") {
        // The first $match and $sort go into the query layer.
        for stage in pipeline {
            if let Bson::Document(st) = stage {
                if let Ok(m) = st.get_document("$match") {
                    if filter.is_empty() {
                        filter = m.clone();
                    }
                } else if let Ok(s) = st.get_document("$sort") {
                    sort.get_or_insert_with(|| s.clone());
                    break;
                } else {
                    break;
                }
            }
        }
    }
    Filter::parse(&filter)?;
    Ok(explain_doc(
        ctx,
        &format!("{}.{coll}", ctx.db),
        &filter,
        sort.as_ref(),
        &coll,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pipeline: Vec<Document>, docs: Vec<Document>) -> Vec<Document> {
        pipeline.iter().fold(docs, |d, s| run_stage(s, d).unwrap())
    }

    #[test]
    fn stages() {
        let docs: Vec<Document> = (0..10)
            .map(|i| doc! {"_id": i, "g": i % 3, "v": i, "tags": ["a", "b"]})
            .collect();
        let out = run(
            vec![doc! {"$match": {"v": {"$gte": 5}}}, doc! {"$count": "n"}],
            docs.clone(),
        );
        assert_eq!(out, vec![doc! {"n": 5}]);
        let out = run(
            vec![
                doc! {"$group": {"_id": "$g", "total": {"$sum": "$v"}, "n": {"$sum": 1}, "avg": {"$avg": "$v"}, "mx": {"$max": "$v"}}},
                doc! {"$sort": {"_id": 1}},
            ],
            docs.clone(),
        );
        assert_eq!(
            out[0],
            doc! {"_id": 0, "total": 18, "n": 4, "avg": 4.5, "mx": 9}
        );
        let out = run(
            vec![
                doc! {"$sort": {"v": -1}},
                doc! {"$skip": 1},
                doc! {"$limit": 2},
                doc! {"$project": {"v": 1, "_id": 0}},
            ],
            docs.clone(),
        );
        assert_eq!(out, vec![doc! {"v": 8}, doc! {"v": 7}]);
        let out = run(
            vec![doc! {"$limit": 1}, doc! {"$unwind": "$tags"}],
            docs.clone(),
        );
        assert_eq!(out.len(), 2);
        let out = run(
            vec![
                doc! {"$limit": 1},
                doc! {"$project": {"x": {"$add": ["$v", 10]}, "t": {"$size": "$tags"}}},
            ],
            docs.clone(),
        );
        assert_eq!(out, vec![doc! {"_id": 0, "x": 10, "t": 2}]);
        let out = run(
            vec![doc! {"$group": {"_id": null, "s": {"$sum": "$v"}}}],
            docs.clone(),
        );
        assert_eq!(out, vec![doc! {"_id": null, "s": 45}]);
        assert!(run_stage(&doc! {"$lookup": {}}, docs.clone()).is_err());
        assert_eq!(
            run_stage(&doc! {"$bogus": 1}, docs).unwrap_err().code,
            40324
        );
    }
}
