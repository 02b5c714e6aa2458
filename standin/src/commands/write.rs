//! Write commands: insert, update, delete, findAndModify.

use bson::{doc, oid::ObjectId, Bson, Document};

use super::{coll_name, opt_doc, CmdError, CmdResult, Ctx};
use crate::bsonutil::{as_i64, truthy};
use crate::projection::{Projection, Sort};
use crate::query::Filter;
use crate::store::{CollData, DuplicateKey};
use crate::update::{seed_from_query, Update};

/// Puts `_id` first, generating an ObjectId if missing.
fn with_id_first(doc: Document) -> Result<Document, CmdError> {
    if let Some(Bson::Array(_)) = doc.get("_id") {
        return Err(CmdError::new(
            53,
            "InvalidIdField",
            "The '_id' value cannot be of type array",
        ));
    }
    if doc.keys().next().map(String::as_str) == Some("_id") {
        return Ok(doc);
    }
    let mut out = Document::new();
    out.insert(
        "_id",
        doc.get("_id")
            .cloned()
            .unwrap_or_else(|| Bson::ObjectId(ObjectId::new())),
    );
    for (k, v) in doc {
        if k != "_id" {
            out.insert(k, v);
        }
    }
    Ok(out)
}

fn dup_error(ns: &str, DuplicateKey(id): DuplicateKey) -> CmdError {
    CmdError::new(
        11000,
        "DuplicateKey",
        format!("E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {id} }}"),
    )
}

fn statements<'a>(cmd: &'a Document, key: &str) -> Result<Vec<&'a Document>, CmdError> {
    match cmd.get(key) {
        Some(Bson::Array(a)) => a
            .iter()
            .map(|v| match v {
                Bson::Document(d) => Ok(d),
                _ => Err(CmdError::type_mismatch(format!(
                    "'{key}' entries must be objects"
                ))),
            })
            .collect(),
        None => Err(CmdError::failed_to_parse(format!(
            "BSON field '{key}' is missing but a required field"
        ))),
        Some(_) => Err(CmdError::type_mismatch(format!("'{key}' must be an array"))),
    }
}

fn finish(mut reply: Document, write_errors: Vec<Bson>) -> Document {
    if !write_errors.is_empty() {
        reply.insert("writeErrors", write_errors);
    }
    reply
}

pub(crate) fn insert(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    let docs = statements(cmd, "documents")?;
    let ordered = cmd.get("ordered").is_none_or(truthy);
    let (c, _) = ctx.shared.store.get_or_create(&ctx.db, &coll);
    let mut data = c.data.write();
    let mut n = 0i32;
    let mut errors = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        let res = with_id_first(d.clone())
            .and_then(|d| data.insert(d).map_err(|dup| dup_error(&ns, dup)));
        match res {
            Ok(()) => n += 1,
            Err(e) => {
                errors.push(Bson::Document(write_error_doc(e, i)));
                if ordered {
                    break;
                }
            }
        }
    }
    Ok(finish(doc! {"n": n}, errors))
}

/// A `writeErrors` entry.
fn write_error_doc(e: CmdError, index: usize) -> Document {
    let mut d = e.write_error(index);
    if e.code == 11000 {
        d.insert("keyPattern", doc! {"_id": 1});
    }
    d
}

/// Result of one update statement.
pub(crate) struct UpdateOutcome {
    pub(crate) matched: i64,
    pub(crate) modified: i64,
    pub(crate) upserted: Option<Bson>,
}

/// Applies one update statement to a collection.
pub(crate) fn apply_update(
    data: &mut CollData,
    ns: &str,
    q: &Document,
    update: &Update,
    multi: bool,
    upsert: bool,
) -> Result<UpdateOutcome, CmdError> {
    let filter = Filter::parse(q)?;
    let seqs = data.matching(&filter, if multi { None } else { Some(1) });
    let mut out = UpdateOutcome {
        matched: 0,
        modified: 0,
        upserted: None,
    };
    if seqs.is_empty() {
        if upsert {
            let doc = upsert_doc(q, update)?;
            let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
            data.insert(doc).map_err(|d| dup_error(ns, d))?;
            out.upserted = Some(id);
        }
        return Ok(out);
    }
    for seq in seqs {
        let Some(old) = data.get(seq).cloned() else {
            continue;
        };
        let mut new = old.clone();
        update.apply(&mut new, false)?;
        out.matched += 1;
        if new != old {
            data.replace(seq, new).map_err(|d| dup_error(ns, d))?;
            out.modified += 1;
        }
    }
    Ok(out)
}

/// The document an upsert inserts.
fn upsert_doc(q: &Document, update: &Update) -> Result<Document, CmdError> {
    let seed = seed_from_query(q);
    let mut doc = match update {
        Update::Replace(_) => match seed.get("_id") {
            Some(id) => doc! {"_id": id.clone()},
            None => Document::new(),
        },
        Update::Ops(_) => seed,
    };
    update.apply(&mut doc, true)?;
    with_id_first(doc)
}

pub(crate) fn update(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    let stmts = statements(cmd, "updates")?;
    let ordered = cmd.get("ordered").is_none_or(truthy);
    let any_upsert = stmts.iter().any(|s| s.get("upsert").is_some_and(truthy));
    let c = if any_upsert {
        Some(ctx.shared.store.get_or_create(&ctx.db, &coll).0)
    } else {
        ctx.shared.store.get(&ctx.db, &coll)
    };
    let (mut n, mut modified) = (0i64, 0i64);
    let mut upserted = Vec::new();
    let mut errors = Vec::new();
    if let Some(c) = c {
        let mut data = c.data.write();
        for (i, s) in stmts.into_iter().enumerate() {
            let res = (|| {
                let q = opt_doc(s, "q")?.cloned().unwrap_or_default();
                let u = s
                    .get("u")
                    .ok_or_else(|| CmdError::failed_to_parse("update statement lacks 'u'"))?;
                let multi = s.get("multi").is_some_and(truthy);
                let upsert = s.get("upsert").is_some_and(truthy);
                if matches!(s.get("arrayFilters"), Some(Bson::Array(a)) if !a.is_empty()) {
                    return Err(CmdError::bad_value(
                        "arrayFilters are not supported by the mongoguard stand-in",
                    ));
                }
                let update = Update::parse(u)?;
                if multi && matches!(update, Update::Replace(_)) {
                    return Err(CmdError::failed_to_parse(
                        "multi update is not supported for replacement-style update",
                    ));
                }
                apply_update(&mut data, &ns, &q, &update, multi, upsert)
            })();
            match res {
                Ok(o) => {
                    n += o.matched;
                    modified += o.modified;
                    if let Some(id) = o.upserted {
                        n += 1;
                        upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id}));
                    }
                }
                Err(e) => {
                    errors.push(Bson::Document(write_error_doc(e, i)));
                    if ordered {
                        break;
                    }
                }
            }
        }
    }
    let mut reply = doc! {"n": n as i32, "nModified": modified as i32};
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    Ok(finish(reply, errors))
}

pub(crate) fn delete(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let stmts = statements(cmd, "deletes")?;
    let ordered = cmd.get("ordered").is_none_or(truthy);
    let mut n = 0i64;
    let mut errors = Vec::new();
    if let Some(c) = ctx.shared.store.get(&ctx.db, &coll) {
        let mut data = c.data.write();
        for (i, s) in stmts.into_iter().enumerate() {
            let res = (|| {
                let q = opt_doc(s, "q")?.cloned().unwrap_or_default();
                let limit = match s.get("limit") {
                    None => 0,
                    Some(v) => as_i64(v).ok_or_else(|| {
                        CmdError::type_mismatch(
                            "The limit field in delete objects must be a number",
                        )
                    })?,
                };
                if limit != 0 && limit != 1 {
                    return Err(CmdError::failed_to_parse(format!(
                        "The limit field in delete objects must be 0 or 1. Got {limit}"
                    )));
                }
                let filter = Filter::parse(&q)?;
                let seqs = data.matching(&filter, if limit == 1 { Some(1) } else { None });
                let count = seqs.len() as i64;
                for seq in seqs {
                    data.remove(seq);
                }
                Ok(count)
            })();
            match res {
                Ok(c) => n += c,
                Err(e) => {
                    errors.push(Bson::Document(write_error_doc(e, i)));
                    if ordered {
                        break;
                    }
                }
            }
        }
    } else if let Err(e) = stmts.iter().try_for_each(|s| {
        opt_doc(s, "q").and_then(|q| {
            Filter::parse(q.unwrap_or(&Document::new()))
                .map(|_| ())
                .map_err(Into::into)
        })
    }) {
        errors.push(Bson::Document(write_error_doc(e, 0)));
    }
    Ok(finish(doc! {"n": n as i32}, errors))
}

pub(crate) fn find_and_modify(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    let q = opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let filter = Filter::parse(&q)?;
    let sort = Sort::parse(opt_doc(cmd, "sort")?)?;
    let projection = Projection::parse(opt_doc(cmd, "fields")?)?;
    let remove = cmd.get("remove").is_some_and(truthy);
    let return_new = cmd.get("new").is_some_and(truthy);
    let upsert = cmd.get("upsert").is_some_and(truthy);
    let update = match cmd.get("update") {
        None | Some(Bson::Null) => None,
        Some(u) => Some(Update::parse(u)?),
    };
    match (&update, remove) {
        (Some(_), true) => {
            return Err(CmdError::failed_to_parse(
                "Cannot specify both an update and remove=true",
            ))
        }
        (None, false) => {
            return Err(CmdError::failed_to_parse(
                "Either an update or remove=true must be specified",
            ))
        }
        (None, true) if upsert || return_new => {
            return Err(CmdError::failed_to_parse(
                "Cannot specify both upsert=true and remove=true, or new=true and remove=true",
            ))
        }
        _ => {}
    }
    let c = if upsert {
        Some(ctx.shared.store.get_or_create(&ctx.db, &coll).0)
    } else {
        ctx.shared.store.get(&ctx.db, &coll)
    };
    let Some(c) = c else {
        return Ok(
            doc! {"lastErrorObject": {"n": 0, "updatedExisting": false}, "value": Bson::Null},
        );
    };
    let mut data = c.data.write();
    let limit = if sort.is_empty() { Some(1) } else { None };
    let mut found: Vec<(u64, Document)> = data
        .matching(&filter, limit)
        .into_iter()
        .filter_map(|s| data.get(s).cloned().map(|d| (s, d)))
        .collect();
    sort.sort_pairs(&mut found);
    let target = found.into_iter().next();
    let project = |d: &Document| Bson::Document(projection.apply(d));
    match (target, update) {
        (Some((seq, old)), None) => {
            data.remove(seq);
            Ok(doc! {"lastErrorObject": {"n": 1}, "value": project(&old)})
        }
        (None, None) => Ok(doc! {"lastErrorObject": {"n": 0}, "value": Bson::Null}),
        (Some((seq, old)), Some(u)) => {
            let mut new = old.clone();
            u.apply(&mut new, false)?;
            if new != old {
                data.replace(seq, new.clone())
                    .map_err(|d| dup_error(&ns, d))?;
            }
            let value = project(if return_new { &new } else { &old });
            Ok(doc! {"lastErrorObject": {"n": 1, "updatedExisting": true}, "value": value})
        }
        (None, Some(u)) if upsert => {
            let doc = upsert_doc(&q, &u)?;
            let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
            data.insert(doc.clone()).map_err(|d| dup_error(&ns, d))?;
            let value = if return_new {
                project(&doc)
            } else {
                Bson::Null
            };
            Ok(doc! {
                "lastErrorObject": {"n": 1, "updatedExisting": false, "upserted": id},
                "value": value,
            })
        }
        (None, Some(_)) => {
            Ok(doc! {"lastErrorObject": {"n": 0, "updatedExisting": false}, "value": Bson::Null})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_goes_first() {
        let d = with_id_first(doc! {"a": 1, "_id": 5}).unwrap();
        assert_eq!(d.keys().next().map(String::as_str), Some("_id"));
        let d = with_id_first(doc! {"a": 1}).unwrap();
        assert!(matches!(d.get("_id"), Some(Bson::ObjectId(_))));
        assert!(with_id_first(doc! {"_id": [1]}).is_err());
    }

    #[test]
    fn update_and_upsert() {
        let mut data = CollData::default();
        data.insert(doc! {"_id": 1, "a": 1}).unwrap();
        data.insert(doc! {"_id": 2, "a": 1}).unwrap();
        let u = Update::parse(&Bson::Document(doc! {"$set": {"b": 2}})).unwrap();
        let o = apply_update(&mut data, "d.c", &doc! {"a": 1}, &u, true, false).unwrap();
        assert_eq!((o.matched, o.modified), (2, 2));
        let o = apply_update(&mut data, "d.c", &doc! {"a": 1}, &u, true, false).unwrap();
        assert_eq!((o.matched, o.modified), (2, 0));
        let o = apply_update(&mut data, "d.c", &doc! {"a": 9}, &u, false, true).unwrap();
        assert!(o.upserted.is_some());
        assert_eq!(data.len(), 3);
        let r = Update::parse(&Bson::Document(doc! {"z": 1})).unwrap();
        let o = apply_update(&mut data, "d.c", &doc! {"_id": 7}, &r, false, true).unwrap();
        assert_eq!(o.upserted, Some(Bson::Int32(7)));
    }
}
