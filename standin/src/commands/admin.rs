//! Administrative commands: buildInfo, getParameter, databases, collections, indexes, status.

use std::collections::VecDeque;

use bson::{doc, Bson, Document};

use super::{coll_name, cursor_reply, opt_doc, CmdError, CmdResult, Ctx};
use crate::bsonutil::truthy;
use crate::cursor::{take_batch, DEFAULT_FIRST_BATCH};
use crate::query::Filter;

pub(crate) fn build_info(ctx: &Ctx) -> Document {
    let version = crate::version_for_wire(ctx.shared.config.wire_version);
    let parts: Vec<i32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
    let mut array: Vec<i32> = parts.clone();
    array.push(0);
    doc! {
        "version": version,
        "gitVersion": "0000000000000000000000000000000000000000",
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": array,
        "bits": 64,
        "debug": false,
        "maxBsonObjectSize": 16_777_216,
        "storageEngines": ["inMemory"],
        "mongoguardStandIn": true,
    }
}

pub(crate) fn get_parameter(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let version = crate::version_for_wire(ctx.shared.config.wire_version);
    let fcv = version.rsplit_once('.').map(|(a, _)| a).unwrap_or(version);
    let all = doc! {
        "featureCompatibilityVersion": {"version": fcv},
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"],
        "maxBSONDepth": 100,
        "internalQueryMaxAllowedDensifyDocs": 500000,
    };
    let star = cmd.get_str("getParameter").ok() == Some("*")
        || matches!(cmd.get("getParameter"), Some(Bson::Document(d)) if d.get("allParameters").is_some_and(truthy));
    if star {
        return Ok(all);
    }
    let mut out = Document::new();
    for k in cmd.keys().skip(1) {
        if let Some(v) = all.get(k) {
            out.insert(k.clone(), v.clone());
        }
    }
    if out.is_empty() {
        return Err(CmdError::new(
            72,
            "InvalidOptions",
            "no option found to get",
        ));
    }
    Ok(out)
}

pub(crate) fn list_databases(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let filter = Filter::parse(opt_doc(cmd, "filter")?.unwrap_or(&Document::new()))?;
    let name_only = cmd.get("nameOnly").is_some_and(truthy);
    let mut total = 0i64;
    let mut dbs = Vec::new();
    for (name, size) in ctx.shared.store.databases() {
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        let entry = if name_only {
            doc! {"name": name}
        } else {
            doc! {"name": name, "sizeOnDisk": size, "empty": size == 0}
        };
        if filter.matches(&entry) {
            total += size;
            dbs.push(Bson::Document(entry));
        }
    }
    if name_only {
        Ok(doc! {"databases": dbs})
    } else {
        Ok(doc! {"databases": dbs, "totalSize": total, "totalSizeMb": total / (1024 * 1024)})
    }
}

pub(crate) fn drop(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    match ctx.shared.store.drop_collection(&ctx.db, &coll) {
        Some(c) => {
            let n = 1 + c.data.read().indexes.len() as i32;
            Ok(doc! {"nIndexesWas": n, "ns": ns})
        }
        // MongoDB 7.0: dropping a missing collection succeeds.
        None => Ok(Document::new()),
    }
}

pub(crate) fn drop_database(ctx: &Ctx) -> CmdResult {
    ctx.shared.store.drop_database(&ctx.db);
    Ok(doc! {"dropped": ctx.db.clone()})
}

pub(crate) fn create(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    if cmd.get("viewOn").is_some() {
        return Err(CmdError::bad_value(
            "views are not supported by the mongoguard stand-in",
        ));
    }
    ctx.shared.store.get_or_create(&ctx.db, &coll);
    Ok(Document::new())
}

fn collection_info(name: &str) -> Document {
    doc! {
        "name": name, "type": "collection", "options": {},
        "info": {"readOnly": false},
        "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
    }
}

pub(crate) fn list_collections(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let filter = Filter::parse(opt_doc(cmd, "filter")?.unwrap_or(&Document::new()))?;
    let name_only = cmd.get("nameOnly").is_some_and(truthy);
    let docs: VecDeque<Document> = ctx
        .shared
        .store
        .collections(&ctx.db)
        .into_iter()
        .map(|(n, _)| collection_info(&n))
        .filter(|d| filter.matches(d))
        .map(|d| {
            if name_only {
                doc! {"name": d.get("name").cloned().unwrap_or(Bson::Null), "type": "collection"}
            } else {
                d
            }
        })
        .collect();
    let ns = format!("{}.$cmd.listCollections", ctx.db);
    first_batch_reply(ctx, ns, docs, cmd)
}

/// Replies with a first batch, opening a cursor for the rest (used by list commands).
pub(crate) fn first_batch_reply(
    ctx: &Ctx,
    ns: String,
    mut docs: VecDeque<Document>,
    cmd: &Document,
) -> CmdResult {
    let batch_size = match cmd.get("cursor") {
        Some(Bson::Document(c)) => super::opt_count(c, "batchSize")?,
        _ => None,
    };
    let batch_size = match batch_size {
        Some(n) if n < 0 => return Err(CmdError::bad_value("batchSize must be non-negative")),
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_FIRST_BATCH,
    };
    let batch = take_batch(&mut docs, Some(batch_size));
    let id = if docs.is_empty() {
        0
    } else {
        ctx.shared.cursors.open(ns.clone(), docs, ctx.owner(cmd))
    };
    Ok(cursor_reply(&ns, batch, id, true))
}

fn id_index() -> Document {
    doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"}
}

pub(crate) fn create_indexes(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let Some(Bson::Array(specs)) = cmd.get("indexes") else {
        return Err(CmdError::failed_to_parse(
            "BSON field 'createIndexes.indexes' is missing but a required field",
        ));
    };
    let mut parsed = Vec::new();
    for s in specs {
        let Bson::Document(spec) = s else {
            return Err(CmdError::type_mismatch(
                "index specification must be an object",
            ));
        };
        let Some(Bson::Document(key)) = spec.get("key") else {
            return Err(CmdError::failed_to_parse("index specification lacks 'key'"));
        };
        if key.is_empty() {
            return Err(CmdError::new(
                67,
                "CannotCreateIndex",
                "index keys cannot be empty",
            ));
        }
        let name = match spec.get("name") {
            Some(Bson::String(n)) => n.clone(),
            _ => key
                .iter()
                .map(|(k, v)| format!("{k}_{v}"))
                .collect::<Vec<_>>()
                .join("_"),
        };
        let mut full = doc! {"v": 2, "key": key.clone(), "name": name};
        for (k, v) in spec {
            if !matches!(k.as_str(), "key" | "name" | "v") {
                full.insert(k.clone(), v.clone());
            }
        }
        parsed.push(full);
    }
    let (c, created) = ctx.shared.store.get_or_create(&ctx.db, &coll);
    let mut data = c.data.write();
    let before = 1 + data.indexes.len() as i32;
    for spec in parsed {
        let name = spec.get_str("name").unwrap_or_default().to_string();
        if name == "_id_" {
            continue;
        }
        match data
            .indexes
            .iter()
            .find(|i| i.get_str("name").ok() == Some(name.as_str()))
        {
            Some(existing) if existing.get("key") != spec.get("key") => {
                return Err(CmdError::new(
                    86,
                    "IndexKeySpecsConflict",
                    format!("An existing index has the same name as the requested index: {name}"),
                ))
            }
            Some(_) => {}
            None => data.indexes.push(spec),
        }
    }
    let after = 1 + data.indexes.len() as i32;
    Ok(doc! {
        "numIndexesBefore": before, "numIndexesAfter": after,
        "createdCollectionAutomatically": created,
    })
}

pub(crate) fn list_indexes(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    let Some(c) = ctx.shared.store.get(&ctx.db, &coll) else {
        return Err(CmdError::ns_not_found(format!("ns does not exist: {ns}")));
    };
    let mut docs: VecDeque<Document> = VecDeque::new();
    docs.push_back(id_index());
    docs.extend(c.data.read().indexes.iter().cloned());
    first_batch_reply(ctx, ns, docs, cmd)
}

pub(crate) fn drop_indexes(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    let Some(c) = ctx.shared.store.get(&ctx.db, &coll) else {
        return Err(CmdError::ns_not_found(format!("ns not found {ns}")));
    };
    let mut data = c.data.write();
    let was = 1 + data.indexes.len() as i32;
    let not_found = |what: String| {
        CmdError::new(
            27,
            "IndexNotFound",
            format!("index not found with name [{what}]"),
        )
    };
    match cmd.get("index") {
        Some(Bson::String(s)) if s == "*" => data.indexes.clear(),
        Some(Bson::String(s)) => {
            if s == "_id_" {
                return Err(CmdError::new(72, "InvalidOptions", "cannot drop _id index"));
            }
            let before = data.indexes.len();
            data.indexes
                .retain(|i| i.get_str("name").ok() != Some(s.as_ref()));
            if data.indexes.len() == before {
                return Err(not_found(s.clone()));
            }
        }
        Some(Bson::Array(names)) => {
            for n in names {
                let n = n.as_str().unwrap_or_default();
                let before = data.indexes.len();
                data.indexes.retain(|i| i.get_str("name").ok() != Some(n));
                if data.indexes.len() == before {
                    return Err(not_found(n.to_string()));
                }
            }
        }
        Some(Bson::Document(key)) => {
            let before = data.indexes.len();
            data.indexes
                .retain(|i| i.get("key") != Some(&Bson::Document(key.clone())));
            if data.indexes.len() == before {
                return Err(CmdError::new(
                    27,
                    "IndexNotFound",
                    format!("can't find index with key: {key}"),
                ));
            }
        }
        _ => {
            return Err(CmdError::failed_to_parse(
                "dropIndexes needs an 'index' field",
            ))
        }
    }
    Ok(doc! {"nIndexesWas": was})
}

pub(crate) fn rename_collection(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let from = coll_name(cmd)?;
    let to = match cmd.get("to") {
        Some(Bson::String(s)) => s.clone(),
        _ => return Err(CmdError::type_mismatch("'to' must be a string")),
    };
    let split = |ns: &str| -> Result<(String, String), CmdError> {
        match ns.split_once('.') {
            Some((d, c)) if !d.is_empty() && !c.is_empty() => Ok((d.to_string(), c.to_string())),
            _ => Err(CmdError::new(
                73,
                "InvalidNamespace",
                format!("Invalid namespace specified '{ns}'"),
            )),
        }
    };
    let (fd, fc) = split(&from)?;
    let (td, tc) = split(&to)?;
    let drop_target = cmd.get("dropTarget").is_some_and(truthy);
    ctx.shared
        .store
        .rename((&fd, &fc), (&td, &tc), drop_target)
        .map_err(|(code, name, msg)| CmdError::new(code, name, msg))?;
    Ok(Document::new())
}

pub(crate) fn server_status(ctx: &Ctx) -> Document {
    let s = &ctx.shared.stats;
    let open = i64::try_from(s.connections_open()).unwrap_or(i64::MAX);
    let total = i64::try_from(s.connections_accepted()).unwrap_or(i64::MAX);
    doc! {
        "host": ctx.shared.host_port(),
        "version": crate::version_for_wire(ctx.shared.config.wire_version),
        "process": "mongoguard-standin",
        "pid": i64::from(std::process::id()),
        "uptime": ctx.shared.started.elapsed().as_secs_f64(),
        "uptimeMillis": i64::try_from(ctx.shared.started.elapsed().as_millis()).unwrap_or(i64::MAX),
        "localTime": bson::DateTime::now(),
        "connections": {"current": open, "available": 1_000_000i64, "totalCreated": total},
        "opcounters": {"command": i64::try_from(s.messages()).unwrap_or(i64::MAX)},
        "metrics": {"cursor": {"open": {"total": ctx.shared.cursors.len() as i64}}},
    }
}

pub(crate) fn connection_status(ctx: &Ctx) -> Document {
    let users: Vec<Bson> = ctx
        .conn
        .user
        .iter()
        .map(|u| Bson::Document(doc! {"user": u.clone(), "db": "admin"}))
        .collect();
    let roles: Vec<Bson> = if users.is_empty() {
        Vec::new()
    } else {
        vec![Bson::Document(doc! {"role": "root", "db": "admin"})]
    };
    doc! {"authInfo": {"authenticatedUsers": users, "authenticatedUserRoles": roles}}
}

pub(crate) fn db_stats(ctx: &Ctx) -> Document {
    let colls = ctx.shared.store.collections(&ctx.db);
    let (mut objects, mut size, mut indexes) = (0i64, 0i64, 0i64);
    for (_, c) in &colls {
        let d = c.data.read();
        objects += d.len() as i64;
        size += d.size_bytes() as i64;
        indexes += 1 + d.indexes.len() as i64;
    }
    doc! {
        "db": ctx.db.clone(), "collections": colls.len() as i64, "views": 0i64,
        "objects": objects, "dataSize": size as f64, "storageSize": size as f64,
        "indexes": indexes, "indexSize": 0.0, "totalSize": size as f64, "scaleFactor": 1i64,
    }
}
