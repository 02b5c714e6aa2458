//! Read commands: find, getMore, killCursors, count, distinct, and the legacy
//! OP_QUERY-find / OP_GET_MORE paths.

use std::collections::{HashSet, VecDeque};

use bson::{doc, Bson, Document};

use super::{coll_name, cursor_reply, opt_count, opt_doc, CmdError, CmdResult, Ctx};
use crate::bsonutil::{id_key, truthy, type_name};
use crate::cursor::{take_batch, DEFAULT_FIRST_BATCH};
use crate::projection::{Projection, Sort};
use crate::query::{collect_doc, Filter};
use crate::server::Shared;
use crate::wire::OpQuery;

/// Runs a query: filter, sort, skip, limit (0 = none), projection.
#[allow(clippy::too_many_arguments)]
pub(crate) fn query_docs(
    shared: &Shared,
    db: &str,
    coll: &str,
    filter: &Filter,
    sort: &Sort,
    skip: usize,
    limit: usize,
    projection: &Projection,
) -> Vec<Document> {
    let Some(c) = shared.store.get(db, coll) else {
        return Vec::new();
    };
    let mut docs = if sort.is_empty() {
        let max = if limit == 0 {
            None
        } else {
            Some(skip.saturating_add(limit))
        };
        let mut d = c.data.read().find(filter, max);
        d.drain(..skip.min(d.len()));
        d
    } else {
        let mut d = c.data.read().find(filter, None);
        sort.sort(&mut d);
        d.drain(..skip.min(d.len()));
        if limit > 0 {
            d.truncate(limit);
        }
        d
    };
    if !projection.is_all() {
        for d in docs.iter_mut() {
            *d = projection.apply(d);
        }
    }
    docs
}

fn non_negative(v: Option<i64>, what: &str) -> Result<Option<usize>, CmdError> {
    match v {
        None => Ok(None),
        Some(n) if n < 0 => Err(CmdError::bad_value(format!("{what} must be non-negative"))),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

pub(crate) fn find(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let ns = format!("{}.{coll}", ctx.db);
    let filter = Filter::parse(opt_doc(cmd, "filter")?.unwrap_or(&Document::new()))?;
    let sort = Sort::parse(opt_doc(cmd, "sort")?)?;
    let projection = Projection::parse(opt_doc(cmd, "projection")?)?;
    let skip = non_negative(opt_count(cmd, "skip")?, "skip")?.unwrap_or(0);
    let mut single_batch = cmd.get("singleBatch").is_some_and(truthy);
    let limit = match opt_count(cmd, "limit")? {
        Some(n) if n < 0 => {
            single_batch = true;
            usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX)
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => 0,
    };
    if cmd.get("tailable").is_some_and(truthy) {
        return Err(CmdError::bad_value(
            "tailable cursors are not supported by the mongoguard stand-in",
        ));
    }
    let batch_size = non_negative(opt_count(cmd, "batchSize")?, "batchSize")?;
    let docs = query_docs(
        ctx.shared,
        &ctx.db,
        &coll,
        &filter,
        &sort,
        skip,
        limit,
        &projection,
    );
    let mut docs: VecDeque<Document> = docs.into();
    let batch = take_batch(&mut docs, Some(batch_size.unwrap_or(DEFAULT_FIRST_BATCH)));
    let id = if single_batch || docs.is_empty() {
        0
    } else {
        ctx.shared.cursors.open(ns.clone(), docs, ctx.owner(cmd))
    };
    Ok(cursor_reply(&ns, batch, id, true))
}

pub(crate) fn get_more(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let id = cursor_id(cmd.get("getMore"), "getMore.getMore")?;
    let coll = match cmd.get("collection") {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Err(CmdError::failed_to_parse(
                "BSON field 'getMore.collection' is missing but a required field",
            ))
        }
    };
    let batch_size = non_negative(opt_count(cmd, "batchSize")?, "batchSize")?;
    let ns = format!("{}.{coll}", ctx.db);
    let Some(mut cursor) = ctx.shared.cursors.checkout(id) else {
        return Err(CmdError::new(
            43,
            "CursorNotFound",
            format!("cursor id {id} not found"),
        ));
    };
    if let Err(e) = check_get_more(ctx, cmd, id, &ns, &cursor) {
        ctx.shared.cursors.restore(id, cursor);
        return Err(e);
    }
    let batch = take_batch(&mut cursor.docs, batch_size.filter(|&n| n > 0));
    let out_id = if cursor.docs.is_empty() {
        0
    } else {
        ctx.shared.cursors.restore(id, cursor);
        id
    };
    Ok(cursor_reply(&ns, batch, out_id, false))
}

/// mongod's getMore checks, in its order (src/mongo/db/commands/query_cmd/getmore_cmd.cpp:
/// `validateAuthorization`, `validateNamespace`, `validateLSID`, `validateTxnNumber`).
fn check_get_more(
    ctx: &Ctx,
    cmd: &Document,
    id: i64,
    ns: &str,
    cursor: &crate::cursor::Cursor,
) -> Result<(), CmdError> {
    let unauthorized = |msg: String| CmdError::new(13, "Unauthorized", msg);
    let me = ctx.owner(cmd);
    let owner = &cursor.owner;
    if me.user != owner.user {
        return Err(unauthorized(format!(
            "cursor id {id} was not created by the authenticated user"
        )));
    }
    if cursor.ns != ns {
        return Err(unauthorized(format!(
            "Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}",
            cursor.ns
        )));
    }
    let hex = |b: &Vec<u8>| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    match (&me.lsid, &owner.lsid) {
        (Some(mine), None) => {
            return Err(CmdError::new(50736, "Location50736", format!(
                "Cannot run getMore on cursor {id}, which was not created in a session, in session {}",
                hex(mine)
            )))
        }
        (None, Some(theirs)) => {
            return Err(CmdError::new(50737, "Location50737", format!(
                "Cannot run getMore on cursor {id}, which was created in session {}, without an lsid",
                hex(theirs)
            )))
        }
        (Some(mine), Some(theirs)) if mine != theirs => {
            return Err(CmdError::new(50738, "Location50738", format!(
                "Cannot run getMore on cursor {id}, which was created in session {}, in session {}",
                hex(theirs),
                hex(mine)
            )))
        }
        _ => {}
    }
    match (me.txn_number, owner.txn_number) {
        (Some(mine), None) => Err(CmdError::new(50739, "Location50739", format!(
            "Cannot run getMore on cursor {id}, which was not created in a transaction, in transaction {mine}"
        ))),
        (None, Some(theirs)) => Err(CmdError::new(50740, "Location50740", format!(
            "Cannot run getMore on cursor {id}, which was created in transaction {theirs}, without a txnNumber"
        ))),
        (Some(mine), Some(theirs)) if mine != theirs => Err(CmdError::new(50741, "Location50741", format!(
            "Cannot run getMore on cursor {id}, which was created in transaction {theirs}, in transaction {mine}"
        ))),
        _ => Ok(()),
    }
}

/// A cursor id: a BSON long and nothing else, as mongod's IDL reads one (`getMore` is
/// `type: long` in src/mongo/db/query/getmore_command.idl, killCursors' `cursors` an
/// `array<cursorId>` of `bson_serialization_type: long` in src/mongo/db/query/kill_cursors.idl;
/// unlike `safeInt64`, `long` takes no int or double: src/mongo/idl/basic_types.idl).
fn cursor_id(v: Option<&Bson>, field: &str) -> Result<i64, CmdError> {
    match v {
        Some(Bson::Int64(id)) => Ok(*id),
        other => Err(CmdError::type_mismatch(format!(
            "BSON field '{field}' is the wrong type '{}', expected type 'long'",
            other.map_or("missing", type_name)
        ))),
    }
}

pub(crate) fn kill_cursors(ctx: &Ctx, cmd: &Document) -> CmdResult {
    coll_name(cmd)?;
    let Some(Bson::Array(ids)) = cmd.get("cursors") else {
        return Err(CmdError::failed_to_parse(
            "BSON field 'killCursors.cursors' is missing but a required field",
        ));
    };
    let mut wanted = Vec::with_capacity(ids.len());
    for (i, v) in ids.iter().enumerate() {
        let id = cursor_id(Some(v), &format!("killCursors.cursors.{i}"))?;
        // As mongod (killcursors_cmd.cpp doCheckAuthorization, auth::checkAuthForKillCursors in
        // src/mongo/db/auth/authorization_checks.cpp): another user's cursor fails the whole
        // command, before anything is killed; an unknown one is reported as not found.
        if let Some((ns, user)) = ctx.shared.cursors.owner(id) {
            if user != ctx.conn.user {
                return Err(CmdError::new(
                    13,
                    "Unauthorized",
                    format!("not authorized to kill cursor on {ns}"),
                ));
            }
        }
        wanted.push(id);
    }
    let (mut killed, mut not_found) = (Vec::new(), Vec::new());
    for id in wanted {
        if ctx.shared.cursors.kill(id) {
            killed.push(Bson::Int64(id));
        } else {
            not_found.push(Bson::Int64(id));
        }
    }
    Ok(doc! {
        "cursorsKilled": killed, "cursorsNotFound": not_found,
        "cursorsAlive": [], "cursorsUnknown": [],
    })
}

pub(crate) fn count(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let filter = Filter::parse(opt_doc(cmd, "query")?.unwrap_or(&Document::new()))?;
    let skip = non_negative(opt_count(cmd, "skip")?, "skip")?.unwrap_or(0);
    let limit = opt_count(cmd, "limit")?
        .map(|l| usize::try_from(l.unsigned_abs()).unwrap_or(usize::MAX))
        .unwrap_or(0);
    let n = match ctx.shared.store.get(&ctx.db, &coll) {
        None => 0,
        Some(c) => {
            let max = (limit > 0).then(|| skip.saturating_add(limit));
            c.data
                .read()
                .matching(&filter, max)
                .len()
                .saturating_sub(skip)
        }
    };
    Ok(doc! {"n": i32::try_from(n).unwrap_or(i32::MAX)})
}

pub(crate) fn distinct(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let coll = coll_name(cmd)?;
    let key = match cmd.get("key") {
        Some(Bson::String(k)) if !k.is_empty() => k.clone(),
        _ => return Err(CmdError::failed_to_parse("distinct needs a string 'key'")),
    };
    let filter = Filter::parse(opt_doc(cmd, "query")?.unwrap_or(&Document::new()))?;
    let path: Vec<String> = key.split('.').map(str::to_string).collect();
    let docs = query_docs(
        ctx.shared,
        &ctx.db,
        &coll,
        &filter,
        &Sort::default(),
        0,
        0,
        &Projection::All,
    );
    let mut seen = HashSet::new();
    let mut values = Vec::new();
    let mut add = |v: &Bson| {
        if seen.insert(id_key(v)) {
            values.push(v.clone());
        }
    };
    for d in &docs {
        let mut cands = Vec::new();
        collect_doc(d, &path, &mut cands);
        for v in cands.into_iter().flatten() {
            match v {
                Bson::Array(a) => a.iter().for_each(&mut add),
                other => add(other),
            }
        }
    }
    Ok(doc! {"values": values})
}

/// A legacy OP_QUERY find on a collection: returns (documents, cursor id).
pub(crate) fn legacy_query(
    shared: &Shared,
    db: &str,
    coll: &str,
    q: &OpQuery,
) -> Result<(Vec<Document>, i64), CmdError> {
    let wrapped = matches!(q.query.get("$query"), Some(Bson::Document(_)))
        || matches!(q.query.get("query"), Some(Bson::Document(_)));
    let (filter, sort) = if wrapped {
        let f = match q.query.get("$query").or_else(|| q.query.get("query")) {
            Some(Bson::Document(d)) => d.clone(),
            _ => Document::new(),
        };
        let s = match q.query.get("$orderby").or_else(|| q.query.get("orderby")) {
            Some(Bson::Document(d)) => Some(d.clone()),
            _ => None,
        };
        (f, s)
    } else {
        (q.query.clone(), None)
    };
    let filter = Filter::parse(&filter)?;
    let sort = Sort::parse(sort.as_ref())?;
    let projection = Projection::parse(q.fields.as_ref())?;
    let skip = usize::try_from(q.skip.max(0)).unwrap_or(0);
    // numberToReturn: 0 = default batch, negative = single batch of |n|, 1 behaves as -1.
    let (limit, batch, single) = match q.n_return {
        0 => (0, DEFAULT_FIRST_BATCH, false),
        1 | -1 => (1, 1, true),
        n if n < 0 => {
            let n = n.unsigned_abs() as usize;
            (n, n, true)
        }
        n => (0, n as usize, false),
    };
    let docs = query_docs(shared, db, coll, &filter, &sort, skip, limit, &projection);
    let mut docs: VecDeque<Document> = docs.into();
    let first = take_batch(&mut docs, Some(batch));
    let id = if single || docs.is_empty() {
        0
    } else {
        shared
            .cursors
            .open(format!("{db}.{coll}"), docs, Default::default())
    };
    Ok((first, id))
}

/// A legacy OP_GET_MORE: (documents, cursor id, responseFlags, startingFrom).
pub(crate) fn legacy_get_more(
    shared: &Shared,
    ns: &str,
    n_return: i32,
    cursor_id: i64,
) -> (Vec<Document>, i64, i32, i32) {
    let Some(mut cursor) = shared.cursors.checkout(cursor_id) else {
        // responseFlags bit 0: CursorNotFound.
        return (Vec::new(), 0, 1, 0);
    };
    if cursor.ns != ns {
        shared.cursors.restore(cursor_id, cursor);
        return (Vec::new(), 0, 1, 0);
    }
    let n = match n_return {
        0 => None,
        n => Some(n.unsigned_abs() as usize),
    };
    let batch = take_batch(&mut cursor.docs, n);
    let id = if cursor.docs.is_empty() || n_return < 0 {
        0
    } else {
        shared.cursors.restore(cursor_id, cursor);
        cursor_id
    };
    (batch, id, 0, 0)
}
