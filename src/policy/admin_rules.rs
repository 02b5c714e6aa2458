//! W013–W016: server administration and destructive DDL.
//!
//! Edge decisions (docs/rules.md has the user-facing account):
//! - W013 fires on the commands of [`SERVER_ADMINISTRATION`] by name (mongod looks commands
//!   up case-sensitively), on `applyOps` always (see below), on `fsync` with `lock` truthy, and
//!   on `profile` unless it only reads: level `-1` with none of `slowms`, `sampleRate`,
//!   `filter` (mongod applies those even at level -1: src/mongo/db/commands/profile_common.cpp).
//!   A level or lock that is not a number or boolean is unreadable (G001).
//! - applyOps is refused by W013 whatever it holds: its operations are oplog entries
//!   (inserts, updates, deletes and commands of every kind) that would need every other rule
//!   re-applied to each of them; W005 still judges every namespace they touch.
//! - W014 fires on `drop` of a collection outside MongoDB's own namespaces (those are W005).
//! - W015 fires on an aggregate with `$out` (it replaces its target whole), `$merge` whose
//!   `whenMatched` is `"replace"` or a pipeline, mapReduce `out: "name"` or
//!   `out: {replace: ...}`, renameCollection with `dropTarget` truthy (a boolean, a number, or
//!   the UUID form that drops a target with that UUID), convertToCapped, `emptycapped` and
//!   `captrunc` (test commands that truncate a capped collection), and collMod `cappedSize` /
//!   `cappedMax` above 0 (6.0+: a lower limit deletes the oldest documents).
//!   cloneCollectionAsCapped is not W015: mongod refuses a target that exists
//!   (src/mongo/db/catalog/capped_utils.cpp, NamespaceExists).
//! - W016 fires when an index spec of createIndexes, a collMod `index`, or the collection-level
//!   `expireAfterSeconds` of create / collMod (clustered and time-series collections) sets a
//!   TTL that is not a number of at least 60 seconds: any numeric type (Decimal128 included),
//!   NaN, negative numbers and non-numbers included (old servers read them as 0); null is
//!   absent, and collMod's `"off"` turns expiry off.
//! - A TTL (each createIndexes spec with `expireAfterSeconds`, a collMod `index` with it, a
//!   collMod collection-level `expireAfterSeconds` that is not `"off"`) is a multi-document
//!   delete with no filter: handed to the proxy to measure under W003 (and W012) with the TTL
//!   monitor's predicate ([`Ttl`]); whatever its value (W016 judges short ones on its own).
//!   `create` is not: a new collection is empty.
//! - Nothing fires on an explained command.

use crate::wire::GetFast;
use std::ops::ControlFlow;

use bson::{RawBsonRef, RawDocument};

use super::{evaluate::Emitter, writes::is_system_namespace, Measurement, RuleId, Ttl, TtlField};
use crate::command::{number, truthy, CommandError, CommandView, Kind};

const RULES: &[RuleId] = &[
    RuleId::W013,
    RuleId::W014,
    RuleId::W015,
    RuleId::W016,
    RuleId::W003,
    RuleId::W012,
];

/// The shortest TTL W016 lets through, in seconds.
const MIN_TTL_SECONDS: f64 = 60.0;

/// Commands that change the server for every client, by mongod's command name: defaults,
/// parameters and versions; shutdown and user-write blocking; replica-set administration;
/// the balancer and sharding administration; connection, log and certificate administration.
/// The lowercase names are the aliases mongos registers for the same commands.
pub(crate) const SERVER_ADMINISTRATION: &[&str] = &[
    "setDefaultRWConcern",
    "setFeatureCompatibilityVersion",
    "setParameter",
    "setClusterParameter",
    "setUserWriteBlockMode",
    "setProfilingFilterGlobally",
    "setQuerySettings",
    "removeQuerySettings",
    "shutdown",
    "fsyncUnlock",
    "replSetReconfig",
    "replSetInitiate",
    "replSetStepDown",
    "replSetStepUp",
    "replSetFreeze",
    "replSetMaintenance",
    "replSetSyncFrom",
    "replSetResizeOplog",
    "replSetAbortPrimaryCatchUp",
    "balancerStart",
    "balancerStop",
    "configureCollectionBalancing",
    "addShard",
    "removeShard",
    "addShardToZone",
    "removeShardFromZone",
    "updateZoneKeyRange",
    "enableSharding",
    "moveChunk",
    "moveRange",
    "split",
    "mergeChunks",
    "mergeAllChunksOnShard",
    "clearJumboFlag",
    "movePrimary",
    "moveCollection",
    "unshardCollection",
    "setAllowMigrations",
    "transitionToDedicatedConfigServer",
    "transitionFromDedicatedConfigServer",
    "configureQueryAnalyzer",
    "dropConnections",
    "killAllSessions",
    "killAllSessionsByPattern",
    "logRotate",
    "rotateCertificates",
    // Before 4.2: arbitrary server-side JavaScript, writes and drops included, on behalf of
    // a user granted anyAction on anyResource (src/mongo/db/commands/dbeval.cpp).
    "eval",
    "$eval",
    // Before 4.2: a database or collection copied whole from another host, into any
    // database (admin included), documents no rule can see (src/mongo/db/commands/copydb.cpp,
    // clone.cpp, clone_collection.cpp).
    "copydb",
    "clone",
    "cloneCollection",
    // Maintenance that rewrites a database, a collection or its indexes, or the server's
    // users, for every client of it: repairDatabase (before 4.2), compact
    // (src/mongo/db/commands/compact.cpp), reIndex (CmdReIndex in
    // src/mongo/db/commands/drop_indexes.cpp), authSchemaUpgrade (before 4.2,
    // CmdAuthSchemaUpgrade in src/mongo/db/commands/user_management_commands.cpp), resync (a
    // member drops its data and syncs from scratch; src/mongo/db/repl/resync.cpp).
    "repairDatabase",
    "compact",
    "reIndex",
    "authSchemaUpgrade",
    "resync",
    "addshard",
    "removeshard",
    "addshardtozone",
    "removeshardfromzone",
    "updatezonekeyrange",
    "enablesharding",
    "movechunk",
    "moveprimary",
];

pub(crate) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if view.is_explain() || em.all_off(RULES) {
        return Ok(());
    }
    let Some(body) = view.body() else {
        return Ok(());
    };
    if em.on(RuleId::W013) && server_administration(view, body)? {
        em.emit(RuleId::W013, None, None);
    }
    match view.kind() {
        Kind::Drop if em.on(RuleId::W014) && !is_system_namespace(view.namespace()) => {
            em.emit(RuleId::W014, None, None)
        }
        Kind::Aggregate if em.on(RuleId::W015) && aggregate_overwrites(view)? => {
            em.emit(RuleId::W015, None, None)
        }
        Kind::MapReduce if em.on(RuleId::W015) && map_reduce_replaces(body)? => {
            em.emit(RuleId::W015, None, None)
        }
        Kind::RenameCollection if em.on(RuleId::W015) && drops_target(body)? => {
            em.emit(RuleId::W015, None, None)
        }
        Kind::ConvertToCapped => em.emit(RuleId::W015, None, None),
        // Truncate a capped collection (test commands: emptycapped in
        // src/mongo/db/catalog/capped_utils.cpp, captrunc in src/mongo/db/commands/test_commands.cpp
        // deletes its newest `n` documents).
        Kind::Other if matches!(view.name(), "emptycapped" | "captrunc") => {
            em.emit(RuleId::W015, None, None)
        }
        Kind::CreateIndexes => create_indexes_ttl(view, body, em)?,
        Kind::CollMod => {
            if em.on(RuleId::W016) && coll_mod_ttl(body)? {
                em.emit(RuleId::W016, None, None)
            }
            if em.on(RuleId::W015) && capped_resize(body)? {
                em.emit(RuleId::W015, None, None)
            }
            coll_mod_measure(view, body, em)?;
        }
        Kind::Create if em.on(RuleId::W016) && collection_ttl(body)? => {
            em.emit(RuleId::W016, None, None)
        }
        _ => {}
    }
    Ok(())
}

fn bad(command: &'static str, field: &'static str) -> CommandError {
    CommandError::BadField { command, field }
}

fn get<'a>(doc: &'a RawDocument, key: &str) -> Result<Option<RawBsonRef<'a>>, CommandError> {
    doc.get_fast(key).map_err(|_| CommandError::Malformed)
}

/// A field with null and undefined read as absent (mongod's IDL parser skips them).
fn present<'a>(doc: &'a RawDocument, key: &str) -> Result<Option<RawBsonRef<'a>>, CommandError> {
    Ok(get(doc, key)?.filter(|v| !matches!(v, RawBsonRef::Null | RawBsonRef::Undefined)))
}

/// A sub-document whose first key is what a first-key reader sees: refuse repeated keys.
fn unique(doc: &RawDocument) -> Result<&RawDocument, CommandError> {
    crate::wire::check_duplicate_keys(doc).map_err(|_| CommandError::DuplicateKey)?;
    Ok(doc)
}

/// W013: see the module docs.
fn server_administration(view: &CommandView<'_>, body: &RawDocument) -> Result<bool, CommandError> {
    let name = view.name();
    // Every listed name is a command `Kind::from_name` does not know (a unit test checks
    // it), so the list is only searched for those: a find or an insert skips ~60 compares.
    if view.kind() == Kind::ApplyOps
        || (view.kind() == Kind::Other && SERVER_ADMINISTRATION.contains(&name))
    {
        return Ok(true);
    }
    match name {
        // src/mongo/db/commands/fsync.cpp: `lock` holds every write until fsyncUnlock.
        "fsync" => match present(body, "lock")? {
            None => Ok(false),
            Some(v) => truthy(v).ok_or(bad("fsync", "lock")),
        },
        "profile" => {
            let level = present(body, "profile")?
                .and_then(number)
                .ok_or(bad("profile", "profile"))?;
            let mut settings = false;
            for field in ["slowms", "sampleRate", "filter"] {
                settings |= present(body, field)?.is_some();
            }
            Ok(level != -1.0 || settings)
        }
        _ => Ok(false),
    }
}

/// W015 for an aggregate: a `$out` stage, or a `$merge` whose `whenMatched` rewrites
/// matched documents (`"replace"` or a pipeline). Other values keep or merge them;
/// an unreadable one is an error.
fn aggregate_overwrites(view: &CommandView<'_>) -> Result<bool, CommandError> {
    let mut found = Ok(false);
    let _ = view.for_each_stage(|stage| {
        let verdict = stage_overwrites(stage);
        let stop = !matches!(verdict, Ok(false));
        found = verdict;
        if stop {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    found
}

fn stage_overwrites(stage: &RawDocument) -> Result<bool, CommandError> {
    let Some(first) = stage.iter_elements().next() else {
        return Ok(false);
    };
    let first = first.map_err(|_| CommandError::Malformed)?;
    match (
        first.key().as_str(),
        first.value().map_err(|_| CommandError::Malformed)?,
    ) {
        ("$out", _) => Ok(true),
        ("$merge", RawBsonRef::Document(spec)) => match present(unique(spec)?, "whenMatched")? {
            None => Ok(false),
            Some(RawBsonRef::String(mode)) => Ok(mode == "replace"),
            Some(RawBsonRef::Array(_)) => Ok(true),
            Some(_) => Err(bad("aggregate", "$merge")),
        },
        // `$merge: "coll"`: the defaults (merge, insert).
        ("$merge", _) => Ok(false),
        _ => Ok(false),
    }
}

/// mapReduce `out: "name"` replaces `name`; `out: {replace: ...}` says so, and so does
/// `out: {normal: ...}` on mongod 4.2 / 4.4, which reads `normal` first, before `replace`,
/// `merge` and `reduce`, whatever the order of the keys (src/mongo/db/commands/mr_common.cpp
/// `parseOutputOptions`; 5.0+ refuses it).
fn map_reduce_replaces(body: &RawDocument) -> Result<bool, CommandError> {
    match get(body, "out")? {
        Some(RawBsonRef::String(_)) => Ok(true),
        Some(RawBsonRef::Document(out)) => {
            let out = unique(out)?;
            Ok(present(out, "replace")?.is_some() || present(out, "normal")?.is_some())
        }
        _ => Err(bad("mapReduce", "out")),
    }
}

/// renameCollection `dropTarget`: truthy, or a UUID (drop the target if it has that UUID).
fn drops_target(body: &RawDocument) -> Result<bool, CommandError> {
    match present(body, "dropTarget")? {
        None => Ok(false),
        Some(RawBsonRef::Binary(_)) => Ok(true),
        Some(v) => truthy(v).ok_or(bad("renameCollection", "dropTarget")),
    }
}

/// collMod `cappedSize`, or `cappedMax` above 0 (0 or less removes the limit), on mongod
/// 6.0+: lowered below what the capped collection holds, the oldest documents are deleted to
/// fit (jstests/core/capped/capped_resize.js: "Decrease the size parameter of the capped
/// collection and see that documents are removed"), like convertToCapped's truncation. The
/// command does not say whether it lowers the limit, so any value fires. Both are
/// `safeInt64` for mongod: another type is unreadable.
fn capped_resize(body: &RawDocument) -> Result<bool, CommandError> {
    if present(body, "cappedSize")?.is_some() {
        return Ok(true);
    }
    match present(body, "cappedMax")? {
        None => Ok(false),
        Some(v) => number(v)
            .map(|n| n > 0.0 || n.is_nan())
            .ok_or(bad("collMod", "cappedMax")),
    }
}

/// A TTL value that W016 fires on: anything but a number of at least 60 seconds.
fn expires_too_soon(v: RawBsonRef<'_>) -> bool {
    !number(v).is_some_and(|n| n >= MIN_TTL_SECONDS)
}

/// W016 for each createIndexes spec, with the spec's position as the statement index; and
/// each TTL spec measured as the delete the TTL monitor's first pass is ([`measure_ttl`]).
fn create_indexes_ttl<'a>(
    view: &CommandView<'a>,
    body: &'a RawDocument,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if !em.on(RuleId::W016) && !measures_ttl(em) {
        return Ok(());
    }
    let mut err = None;
    let ns = view.namespace();
    // MongoDB 3.0 (wire version 3) ignores dropDups; before it, a unique index built with it
    // deletes every document but one of each duplicated key. Unknown: assume the old server.
    let drop_dups_deletes = em.ctx.upstream_wire_version.is_none_or(|v| v < 3);
    let _ = view.each_entry(body, "indexes", "createIndexes", &mut |index, spec| {
        if drop_dups_deletes {
            if let Err(e) = drop_dups(ns, index, spec, em) {
                err = Some(e);
                return ControlFlow::Break(());
            }
        }
        let ttl = unique(spec).and_then(|s| present(s, "expireAfterSeconds"));
        let result = match ttl {
            Ok(Some(ttl)) => {
                if expires_too_soon(ttl) {
                    em.emit(RuleId::W016, Some(index), None);
                }
                index_ttl(spec, "key", ttl)
                    .map(|t| measure_ttl(ns, index, spec, t, em, TTL_FIELD_UNKNOWN))
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            err = Some(e);
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })?;
    err.map_or(Ok(()), Err)
}

/// True when a TTL index is measured: W003 or W012 is checked.
fn measures_ttl(em: &Emitter<'_, '_>) -> bool {
    em.on(RuleId::W003) || em.on(RuleId::W012)
}

/// The TTL of an index spec (createIndexes `key`, collMod `keyPattern` or `name`) whose
/// `expireAfterSeconds` is `ttl`: its key pattern's first field, or its name; `None` when
/// the spec names neither (mongod refuses it; the measurement cannot stand for it:
/// `measure.on_error`).
fn index_ttl<'a>(
    spec: &'a RawDocument,
    key: &str,
    ttl: RawBsonRef<'a>,
) -> Result<Option<Ttl<'a>>, CommandError> {
    let field = match present(spec, key)? {
        Some(RawBsonRef::Document(pattern)) => match pattern.iter_elements().next() {
            Some(first) => {
                TtlField::Path(first.map_err(|_| CommandError::Malformed)?.key().as_str())
            }
            None => return Ok(None),
        },
        None if key == "keyPattern" => match present(spec, "name")? {
            Some(RawBsonRef::String(name)) => TtlField::IndexNamed(name),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let partial = match present(spec, "partialFilterExpression")? {
        Some(RawBsonRef::Document(p)) => Some(p),
        _ => None,
    };
    Ok(Some(Ttl {
        field,
        seconds: ttl_seconds(ttl),
        partial,
    }))
}

/// `expireAfterSeconds` as mongod's `safeNumberLong` reads it (NaN is 0, fractions
/// truncated, out of range saturates); a non-number is 0 (old servers).
fn ttl_seconds(v: RawBsonRef<'_>) -> i64 {
    match v {
        RawBsonRef::Int32(n) => i64::from(n),
        RawBsonRef::Int64(n) => n,
        // `as` saturates and maps NaN to 0.
        _ => number(v).map_or(0, |n| n as i64),
    }
}

/// Why a dropDups index build is refused.
const DROP_DUPS: &str = "a unique index built with dropDups deletes every document but one \
     of each duplicated key (MongoDB before 3.0), a delete with no filter whose extent cannot \
     be measured; mongoguard does not forward it (measure.on_error)";

/// A createIndexes spec with `unique` and `dropDups` truthy, for a server before 3.0: a
/// delete of every duplicate, which no measurement stands for (`measure.on_error` under
/// W003). The MongoDB 2.6 manual (ensureIndex `dropDups`: "delete all documents that
/// contain a duplicate value" but the first); the 3.0 compatibility notes removed it. Legacy
/// code still sends it (mgo `Index.DropDups`, Mongoose and Spring Data `dropDups`).
fn drop_dups<'a>(
    ns: crate::command::Namespace<'a>,
    index: usize,
    spec: &'a RawDocument,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if !measures_ttl(em) {
        return Ok(());
    }
    let spec = unique(spec)?;
    let flag = |key| -> Result<bool, CommandError> {
        match present(spec, key)? {
            None => Ok(false),
            Some(v) => truthy(v).ok_or(bad("createIndexes", "dropDups")),
        }
    };
    if flag("dropDups")? && flag("unique")? {
        measure_ttl(ns, index, spec, None, em, DROP_DUPS);
    }
    Ok(())
}

/// Why a TTL is not measured when the command names no index for it.
const TTL_FIELD_UNKNOWN: &str = "the TTL deletes the documents whose date is older than \
     expireAfterSeconds, and the command names no index key (neither a key pattern nor a \
     name), so what it deletes cannot be measured; mongoguard does not forward it \
     (measure.on_error)";

/// A TTL is a multi-document delete the TTL monitor runs with no filter from the client:
/// measured for W003 (it would delete every document of the collection) and W012 (more
/// than `max_docs`), like a delete whose filter is `unknown`. `ttl: None`: the field is not
/// known, so `measure.on_error`, `unmeasurable` saying why.
fn measure_ttl<'a>(
    ns: crate::command::Namespace<'a>,
    index: usize,
    spec: &'a RawDocument,
    ttl: Option<Ttl<'a>>,
    em: &mut Emitter<'_, 'a>,
    unmeasurable: &'static str,
) {
    if !measures_ttl(em) {
        return;
    }
    // Measured for W003 even when W003 is off (as a delete's filter is, writes::verdict_of):
    // then only W012 can fire on what is counted (`measure::finding`), and a failure is
    // `measure.on_error`.
    let rule = RuleId::W003;
    em.measure(
        Measurement {
            statement: index,
            ns,
            filter: spec,
            collation: None,
            hint: None,
            pipeline: None,
            rule,
            ttl,
        },
        ttl.is_none().then_some(unmeasurable),
    );
}

/// collMod making an index a TTL index or changing its `expireAfterSeconds` (by
/// `keyPattern`, or by `name`: the proxy looks the key up), or setting the collection-level
/// `expireAfterSeconds` of a clustered or time-series collection (the proxy looks up which
/// field, `_id` or the time field): see [`measure_ttl`]. `"off"` and null turn expiry off.
/// Measured with the new value whether it lowers the TTL or raises it: the count is what the
/// monitor deletes under it.
fn coll_mod_measure<'a>(
    view: &CommandView<'a>,
    body: &'a RawDocument,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if !measures_ttl(em) {
        return Ok(());
    }
    let ns = view.namespace();
    if let Some(RawBsonRef::Document(index)) = present(body, "index")? {
        if let Some(ttl) = present(unique(index)?, "expireAfterSeconds")? {
            let t = index_ttl(index, "keyPattern", ttl)?;
            measure_ttl(ns, 0, index, t, em, TTL_FIELD_UNKNOWN);
        }
    }
    match present(body, "expireAfterSeconds")? {
        None | Some(RawBsonRef::String("off")) => {}
        Some(ttl) => {
            let t = Ttl {
                field: TtlField::Collection,
                seconds: ttl_seconds(ttl),
                partial: None,
            };
            measure_ttl(ns, 0, body, Some(t), em, TTL_FIELD_UNKNOWN)
        }
    }
    Ok(())
}

/// collMod `index: {expireAfterSeconds}` (by keyPattern or name), or the collection-level
/// `expireAfterSeconds` of a clustered or time-series collection.
fn coll_mod_ttl(body: &RawDocument) -> Result<bool, CommandError> {
    if let Some(index) = present(body, "index")? {
        let RawBsonRef::Document(index) = index else {
            return Err(bad("collMod", "index"));
        };
        if present(unique(index)?, "expireAfterSeconds")?.is_some_and(expires_too_soon) {
            return Ok(true);
        }
    }
    collection_ttl(body)
}

/// The collection-level `expireAfterSeconds` of create or collMod; `"off"` disables expiry.
fn collection_ttl(body: &RawDocument) -> Result<bool, CommandError> {
    Ok(match present(body, "expireAfterSeconds")? {
        None | Some(RawBsonRef::String("off")) => false,
        Some(ttl) => expires_too_soon(ttl),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    /// `server_administration` searches the list only for commands of `Kind::Other`.
    #[test]
    fn server_administration_names_are_all_other_commands() {
        for name in SERVER_ADMINISTRATION {
            assert_eq!(Kind::from_name(name), Kind::Other, "{name}");
        }
    }

    /// A TTL index is a multi-delete the TTL monitor runs in the background: each pass removes
    /// the documents whose indexed date is older than `expireAfterSeconds`
    /// (src/mongo/db/ttl/ttl.cpp), so `{key: {createdAt: 1}, expireAfterSeconds: 3600}` on a
    /// collection whose documents are all older than an hour deletes every one of them, as
    /// `deleteMany({createdAt: {$lt: <now - 1 h>}})` would. That delete is measured (W003 when
    /// it matches every document, W012 past max_docs); the index is not, and W016 only looks
    /// for less than 60 s.
    #[test]
    fn a_ttl_index_over_old_data_is_measured_like_the_delete_it_is() {
        let policy = crate::policy::Policy::standard();
        let body = rawdoc! {
            "createIndexes": "events",
            "indexes": [{"key": {"createdAt": 1}, "name": "ttl", "expireAfterSeconds": 3600}],
            "$db": "app",
        };
        let view = CommandView::command("app", &body).unwrap();
        let d = policy.evaluate(&view, &crate::policy::RequestContext::default());
        assert_eq!(
            d.measure.len(),
            1,
            "the TTL monitor's first pass is measured"
        );
        assert_eq!(d.measure[0].rule, RuleId::W003);
    }

    /// The measured filter is mongod's TTL predicate (src/mongo/db/ttl/ttl.cpp
    /// `_deleteExpiredWithIndex`: `{key: {$gte: kDawnOfTime, $lte: expirationDate}}`), with
    /// the first pass's slack, and the index's partial filter.
    #[test]
    fn ttl_filter_is_the_monitors_predicate() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let f = Ttl::filter("createdAt", 3600, None, now);
        let want_ms = (1_000_000 + 120 - 3600) * 1000;
        assert_eq!(
            f,
            rawdoc! {"createdAt": {
                "$gte": bson::DateTime::from_millis(i64::MIN),
                "$lte": bson::DateTime::from_millis(want_ms),
            }}
        );
        let partial = rawdoc! {"kind": "session"};
        let f = Ttl::filter("a.b", 0, Some(&partial), now);
        let first = f
            .get_array("$and")
            .unwrap()
            .into_iter()
            .next()
            .unwrap()
            .unwrap();
        assert!(first.as_document().unwrap().get("a.b").unwrap().is_some());
        // Read as mongod's safeNumberLong: NaN is 0, fractions truncate, huge values saturate.
        assert_eq!(ttl_seconds(RawBsonRef::Double(f64::NAN)), 0);
        assert_eq!(ttl_seconds(RawBsonRef::Double(3600.9)), 3600);
        assert_eq!(ttl_seconds(RawBsonRef::Double(1e300)), i64::MAX);
        assert_eq!(ttl_seconds(RawBsonRef::String("3600")), 0);
        let far = Ttl::filter("at", i64::MAX, None, now);
        assert!(far.get_document("at").is_ok(), "no overflow");
    }

    #[test]
    fn ttl_boundaries() {
        let d = |s: &str| RawBsonRef::Decimal128(s.parse().unwrap());
        assert!(expires_too_soon(RawBsonRef::Int32(0)));
        assert!(expires_too_soon(RawBsonRef::Int32(59)));
        assert!(!expires_too_soon(RawBsonRef::Int32(60)));
        assert!(expires_too_soon(RawBsonRef::Double(59.5)));
        assert!(expires_too_soon(RawBsonRef::Double(f64::NAN)));
        assert!(expires_too_soon(RawBsonRef::Int64(-1)));
        assert!(expires_too_soon(d("0")));
        assert!(expires_too_soon(d("59.999")));
        assert!(!expires_too_soon(d("60.0")));
        assert!(!expires_too_soon(d("86400")));
        assert!(expires_too_soon(RawBsonRef::String("3600")));
    }

    #[test]
    fn merge_modes() {
        assert!(!stage_overwrites(&rawdoc! {"$merge": "x"}).unwrap());
        assert!(!stage_overwrites(&rawdoc! {"$merge": {"into": "x"}}).unwrap());
        assert!(
            !stage_overwrites(&rawdoc! {"$merge": {"into": "x", "whenMatched": "merge"}}).unwrap()
        );
        assert!(
            !stage_overwrites(&rawdoc! {"$merge": {"into": "x", "whenMatched": null}}).unwrap()
        );
        assert!(
            stage_overwrites(&rawdoc! {"$merge": {"into": "x", "whenMatched": "replace"}}).unwrap()
        );
        assert!(stage_overwrites(
            &rawdoc! {"$merge": {"into": "x", "whenMatched": [{"$set": {"a": 1}}]}}
        )
        .unwrap());
        assert!(stage_overwrites(&rawdoc! {"$merge": {"into": "x", "whenMatched": 1}}).is_err());
        assert!(stage_overwrites(&rawdoc! {"$out": "x"}).unwrap());
    }
}
