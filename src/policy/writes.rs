//! W001–W012: what writes do.

use crate::wire::GetFast;
use std::ops::ControlFlow;

use bson::{RawBsonRef, RawDocument};

use super::{
    evaluate::Emitter,
    filter::{self, verdict, FilterFacts, Verdict},
    Measurement, RuleId,
};
use crate::command::{
    number, truthy, CommandError, CommandView, Kind, Namespace, Statement, StatementRef, UpdateMods,
};

const STATEMENT_RULES: &[RuleId] = &[
    RuleId::W001,
    RuleId::W002,
    RuleId::W003,
    RuleId::W004,
    RuleId::W010,
    RuleId::W011,
    RuleId::W012,
];

pub(crate) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    // An insert's statements are documents, which no rule here looks into: read only to know
    // that they are readable. When the document rules read every one of them anyway, they are
    // not read twice (an unreadable one is refused by that read all the same: G001).
    let read_by_documents =
        view.kind() == Kind::Insert && super::documents::reads_every_statement(view, em);
    if !em.all_off(STATEMENT_RULES) && !read_by_documents {
        let mut err = None;
        let let_vars = view.let_vars()?;
        // Only updates and deletes (bulkWrite's included) have statement filters to measure.
        let unmeasurable = match view.kind() {
            Kind::Update | Kind::Delete | Kind::BulkWrite => command_unmeasurable(view, let_vars)?,
            _ => None,
        };
        let mut documents = false;
        let read = view.for_each_statement(|s| {
            documents |= s.statement.written_document().is_some();
            if let Err(e) = statement(s, let_vars, unmeasurable, em) {
                err = Some(e);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        // Every statement read (an explain yields none: nothing is known of them).
        if read.is_continue() && !view.is_explain() {
            em.writes_documents = Some(documents);
        }
    }
    if view.kind() == Kind::Aggregate
        && !view.is_explain()
        && (em.on(RuleId::W001) || em.on(RuleId::W012))
    {
        merge_into_existing(view, em)?;
    }
    if view.kind() == Kind::MapReduce
        && !view.is_explain()
        && (em.on(RuleId::W001) || em.on(RuleId::W012))
    {
        map_reduce_into_itself(view, em)?;
    }
    if em.on(RuleId::W005) {
        let mut hit = false;
        let _ = view.for_each_written_namespace(|ns| {
            hit = is_system_namespace(ns);
            if hit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if hit {
            em.emit(RuleId::W005, None, None);
        }
    }
    write_concern(view, em)?;
    if view.more_to_come() && view.is_write() {
        em.emit(RuleId::W007, None, None);
    }
    if !view.is_explain() {
        match view.kind() {
            Kind::DropDatabase => em.emit(RuleId::W008, None, None),
            Kind::RenameCollection => em.emit(RuleId::W009, None, None),
            _ => {}
        }
    }
    Ok(())
}

/// W001–W004 from the filter's verdict, W010 and W011 from the update. A multi-document
/// write whose filter is `unknown` is handed to the proxy to measure (W001 / W003 / W012).
fn statement<'a>(
    s: StatementRef<'a>,
    let_vars: Option<&'a RawDocument>,
    unmeasurable: Option<&'static str>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    let at = Some(s.index);
    let judge = |filter, collation, em: &mut Emitter<'_, 'a>, rule| {
        let facts = FilterFacts {
            collation,
            let_vars,
        };
        verdict_of(s, filter, &facts, rule, unmeasurable, em)
    };
    match s.statement {
        Statement::Update {
            filter,
            update,
            multi,
            collation,
            ..
        } => {
            if multi {
                judge(filter, collation, em, RuleId::W001);
            } else if em.on(RuleId::W002) {
                let facts = FilterFacts {
                    collation,
                    let_vars,
                };
                if verdict(filter, &facts) == Verdict::All {
                    em.emit(RuleId::W002, at, Some(filter));
                }
            }
            match update {
                UpdateMods::Replacement(_) => em.emit(RuleId::W010, at, None),
                UpdateMods::Operators(ops) if em.on(RuleId::W011) && unbounded_push(ops)? => {
                    em.emit(RuleId::W011, at, None)
                }
                _ => {}
            }
        }
        Statement::Delete {
            filter,
            many: true,
            collation,
            ..
        } => {
            if judge(filter, collation, em, RuleId::W003) != Verdict::All {
                em.emit(RuleId::W004, at, Some(filter));
            }
        }
        Statement::Delete {
            filter, collation, ..
        } => {
            // findAndModify {remove: true} on everything removes an arbitrary document.
            let facts = FilterFacts {
                collation,
                let_vars,
            };
            if s.find_and_modify && em.on(RuleId::W002) && verdict(filter, &facts) == Verdict::All {
                em.emit(RuleId::W002, at, Some(filter));
            }
        }
        Statement::Insert { .. } => {}
    }
    Ok(())
}

/// The verdict on a multi-document write's filter, acted on: `All` fires `rule` (W001 or
/// W003) with no I/O, `Narrow` is forwarded, `Unknown` is measured. Skipped (as `Narrow`)
/// when neither `rule` nor W012 is checked. `unmeasurable`: why no measurement can stand for
/// any statement of the command ([`command_unmeasurable`]).
fn verdict_of<'a>(
    s: StatementRef<'a>,
    filter: &'a RawDocument,
    facts: &FilterFacts<'a>,
    rule: RuleId,
    unmeasurable: Option<&'static str>,
    em: &mut Emitter<'_, 'a>,
) -> Verdict {
    if !em.on(rule) && !em.on(RuleId::W012) {
        return Verdict::Narrow;
    }
    let v = verdict(filter, facts);
    let measure = match v {
        Verdict::All if em.on(rule) => {
            em.emit(rule, Some(s.index), Some(filter));
            // A warning lets it through (an override for a migration): W012 still counts it
            // when it would act more strictly (measure::finding keeps the stricter). Decided
            // as enforcement would, so that audit mode records W012 where enforcement blocks.
            em.enforced_action(RuleId::W012) > em.enforced_action(rule)
        }
        Verdict::All | Verdict::Unknown => true,
        Verdict::Narrow => false,
    };
    if measure {
        let hint = match s.statement {
            Statement::Update { hint, .. } | Statement::Delete { hint, .. } => hint,
            Statement::Insert { .. } => None,
        };
        // The clock, chance or JavaScript: what a measuring find counts is not what the
        // write will match (filter::volatile).
        let unmeasurable =
            unmeasurable.or_else(|| filter::volatile::volatile(filter).then_some(UNMEASURABLE));
        em.measure(
            Measurement {
                statement: s.index,
                ns: s.ns,
                filter,
                collation: facts.collation,
                hint,
                pipeline: None,
                rule,
                ttl: None,
            },
            unmeasurable,
        );
    }
    v
}

/// Why no measurement can stand for any statement of `view`, if one cannot:
///
/// - Queryable Encryption: a write with `encryptionInformation` (on the command, or on a
///   bulkWrite `nsInfo` entry) has its encrypted predicates rewritten by mongod before it
///   runs (src/mongo/db/commands/write_commands.cpp hands it to `processFLEUpdate` /
///   `processFLEDelete`, src/mongo/db/fle_crud.cpp); a measuring find without it compares
///   the encrypted payloads as they are and counts something else (often nothing);
/// - a `let` that depends on the clock or on chance (filter::volatile).
fn command_unmeasurable(
    view: &CommandView<'_>,
    let_vars: Option<&RawDocument>,
) -> Result<Option<&'static str>, CommandError> {
    let present = |d: &RawDocument| {
        !matches!(
            d.get_fast("encryptionInformation"),
            Ok(None | Some(RawBsonRef::Null | RawBsonRef::Undefined))
        )
    };
    let (Some(body), Some(fields)) = (view.body(), view.fields()) else {
        return Ok(None);
    };
    // The body through its index (the same answer as get_fast, without a walk from its start).
    let mut encrypted = !matches!(
        crate::command::Fields::lookup(fields, "encryptionInformation"),
        Ok(None | Some(RawBsonRef::Null | RawBsonRef::Undefined))
    );
    if !encrypted && view.kind() == Kind::BulkWrite {
        let _ = view.each_entry(body, "nsInfo", "bulkWrite", &mut |_, entry| {
            encrypted = present(entry);
            if encrypted {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
    }
    if encrypted {
        return Ok(Some(ENCRYPTED));
    }
    Ok(let_vars
        .is_some_and(filter::volatile::volatile)
        .then_some(UNMEASURABLE))
}

/// Why a write with `encryptionInformation` is not measured.
const ENCRYPTED: &str = "the filter is not proved selective and the write is encrypted \
     (encryptionInformation): mongod rewrites its encrypted predicates, so a measuring find \
     would count something else; mongoguard does not forward it (measure.on_error)";

/// An aggregate whose `$merge` updates the documents it matches (`whenMatched` absent,
/// `"merge"`, `"replace"` or a pipeline) is a multi-document update of its target with no
/// filter to prove: `db.users.aggregate([{$set: {plan: "free"}}, {$merge: "users"}])` is
/// `updateMany({}, {$set: {plan: "free"}})`. Each document the stages before `$merge` put
/// out updates at most one target document (mongod matches it on the `on` fields, which a
/// unique index must back: src/mongo/db/pipeline/document_source_merge.cpp), so that count,
/// measured like an unknown filter, bounds the write (W012; a failed measurement blocks).
/// `"keepExisting"` and `"fail"` change no existing document.
fn merge_into_existing<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    let Some(pipeline) = view.pipeline()? else {
        return Ok(());
    };
    let bad = CommandError::BadField {
        command: "aggregate",
        field: "$merge",
    };
    for stage in pipeline {
        let RawBsonRef::Document(stage) = stage.map_err(|_| CommandError::Malformed)? else {
            continue;
        };
        let Some(first) = stage.iter_elements().next() else {
            continue;
        };
        let first = first.map_err(|_| CommandError::Malformed)?;
        if first.key().as_str() != "$merge" {
            continue;
        }
        let merge = first.value().map_err(|_| CommandError::Malformed)?;
        let updates = match merge {
            // `$merge: "coll"`: the defaults (merge, insert).
            RawBsonRef::String(_) => true,
            RawBsonRef::Document(spec) => {
                crate::wire::check_duplicate_keys(spec).map_err(|_| CommandError::DuplicateKey)?;
                match spec
                    .get_fast("whenMatched")
                    .map_err(|_| CommandError::Malformed)?
                {
                    None | Some(RawBsonRef::Null | RawBsonRef::Undefined) => true,
                    Some(RawBsonRef::String(mode)) => mode == "merge" || mode == "replace",
                    Some(RawBsonRef::Array(_)) => true,
                    Some(_) => return Err(bad),
                }
            }
            _ => return Err(bad),
        };
        if !updates {
            continue;
        }
        let body = view.body();
        let collation = match body.map(|b| b.get_fast("collation")).transpose() {
            Ok(Some(Some(RawBsonRef::Document(c)))) => Some(c),
            Ok(None | Some(None | Some(RawBsonRef::Null | RawBsonRef::Undefined))) => None,
            Ok(Some(Some(_))) => {
                return Err(CommandError::BadField {
                    command: "aggregate",
                    field: "collation",
                })
            }
            Err(_) => return Err(CommandError::Malformed),
        };
        let let_vars = view.let_vars()?;
        let facts = FilterFacts {
            collation,
            let_vars,
        };
        if em.on(RuleId::W001) && merges_every_document(view, pipeline, merge, &facts)? {
            em.emit(RuleId::W001, Some(0), Some(stage));
            // Counted as well only when W012 would act more strictly (as in verdict_of).
            if em.enforced_action(RuleId::W012) <= em.enforced_action(RuleId::W001) {
                break;
            }
        }
        // Only a count can fire anything more (W012); a failed count is `measure.on_error`.
        if !em.on(RuleId::W012) {
            break;
        }
        let hint = body.and_then(|b| b.get_fast("hint").ok().flatten());
        let unmeasurable = command_unmeasurable(view, let_vars)?.or_else(|| {
            filter::volatile::volatile_value(RawBsonRef::Array(pipeline)).then_some(UNMEASURABLE)
        });
        em.measure(
            Measurement {
                statement: 0,
                ns: view.namespace(),
                filter: stage,
                collation,
                hint,
                pipeline: Some(pipeline),
                rule: RuleId::W001,
                ttl: None,
            },
            unmeasurable,
        );
        break;
    }
    Ok(())
}

/// A mapReduce whose `out` is `{merge: C}` or `{reduce: C}` with `C` the collection it reads
/// overwrites (merge) or re-reduces (reduce) each source document whose `_id` it emits: with
/// `emit(this._id, ...)`, every one of them, as `updateMany({}, ...)` would (mongod runs it
/// as a `$merge` on `_id` with whenMatched replace / a pipeline: src/mongo/db/commands/
/// mr_common.cpp `translateOutMerge`, `translateOutReduce`). Which keys the
/// JavaScript emits cannot be measured (filter::volatile: JavaScript), so it gets
/// `measure.on_error` under W001. Into another collection it is left to Q002 / W015.
fn map_reduce_into_itself<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    let ns = view.namespace();
    let (Some(body), Some(coll)) = (view.body(), ns.coll) else {
        return Ok(());
    };
    let Ok(Some(RawBsonRef::Document(out))) = body.get_fast("out") else {
        return Ok(());
    };
    crate::wire::check_duplicate_keys(out).map_err(|_| CommandError::DuplicateKey)?;
    // mongod 4.4's order (namespaces::map_reduce_output): a normal or replace wins.
    let target = ["normal", "replace", "merge", "reduce"]
        .into_iter()
        .find_map(|mode| match out.get_fast(mode) {
            Ok(Some(RawBsonRef::String(target))) => Some((mode, target)),
            _ => None,
        })
        .and_then(|(mode, target)| matches!(mode, "merge" | "reduce").then_some(target));
    let same_db = match out.get_fast("db") {
        Ok(None | Some(RawBsonRef::Null | RawBsonRef::Undefined)) => true,
        Ok(Some(RawBsonRef::String(db))) => db == ns.db,
        _ => false,
    };
    if target == Some(coll) && same_db {
        em.measure(
            Measurement {
                statement: 0,
                ns,
                filter: out,
                collation: None,
                hint: None,
                pipeline: None,
                rule: RuleId::W001,
                ttl: None,
            },
            Some(MAP_REDUCE_INTO_ITSELF),
        );
    }
    Ok(())
}

/// Why a mapReduce into its own collection is not measured.
const MAP_REDUCE_INTO_ITSELF: &str = "a mapReduce that merges or reduces into the collection \
     it reads rewrites each document whose _id its JavaScript emits, which no measurement can \
     tell; mongoguard does not forward it (measure.on_error): write to another collection";

/// True when an aggregate's `$merge` (which updates what it matches) is proved to rewrite
/// every document of the collection the aggregate reads, as `updateMany({}, ...)` would
/// (W001, no I/O): it merges into that same collection on `_id` (`on` left out, `"_id"` or
/// `["_id"]`), and every stage before it keeps every document and its `_id`: `$match` of a
/// filter proved to match every document, `$set` / `$addFields` that set no `_id`, `$unset`
/// of fields other than `_id`. Each source document then meets itself in the target
/// (src/mongo/db/pipeline/document_source_merge.cpp matches on the `on` fields).
fn merges_every_document(
    view: &CommandView<'_>,
    pipeline: &bson::RawArray,
    merge: RawBsonRef<'_>,
    facts: &FilterFacts<'_>,
) -> Result<bool, CommandError> {
    let ns = view.namespace();
    let Some(coll) = ns.coll else {
        return Ok(false);
    };
    let same_target = match merge {
        RawBsonRef::String(into) => into == coll,
        RawBsonRef::Document(spec) => {
            let into = match spec.get_fast("into") {
                Ok(Some(RawBsonRef::String(into))) => into == coll,
                Ok(Some(RawBsonRef::Document(into))) => {
                    let db_same = match into.get_fast("db") {
                        Ok(None) => true,
                        Ok(Some(RawBsonRef::String(db))) => db == ns.db,
                        _ => false,
                    };
                    db_same
                        && matches!(into.get_fast("coll"), Ok(Some(RawBsonRef::String(c))) if c == coll)
                }
                _ => false,
            };
            let on_id = match spec.get_fast("on") {
                Ok(None | Some(RawBsonRef::Null | RawBsonRef::Undefined)) => true,
                Ok(Some(RawBsonRef::String(on))) => on == "_id",
                Ok(Some(RawBsonRef::Array(on))) => {
                    let mut fields = on.into_iter();
                    matches!(fields.next(), Some(Ok(RawBsonRef::String("_id"))))
                        && fields.next().is_none()
                }
                _ => false,
            };
            into && on_id
        }
        _ => false,
    };
    if !same_target {
        return Ok(false);
    }
    let touches_id = |field: &str| field == "_id" || field.starts_with("_id.");
    for stage in pipeline {
        let RawBsonRef::Document(stage) = stage.map_err(|_| CommandError::Malformed)? else {
            return Ok(false);
        };
        let Some(Ok(first)) = stage.iter_elements().next() else {
            return Ok(false);
        };
        let keeps = match (first.key().as_str(), first.value()) {
            ("$merge", _) => return Ok(true),
            ("$match", Ok(RawBsonRef::Document(f))) => verdict(f, facts) == Verdict::All,
            ("$set" | "$addFields", Ok(RawBsonRef::Document(spec))) => spec
                .iter_elements()
                .all(|e| e.is_ok_and(|e| !touches_id(e.key().as_str()))),
            ("$unset", Ok(RawBsonRef::String(field))) => !touches_id(field),
            ("$unset", Ok(RawBsonRef::Array(fields))) => fields
                .into_iter()
                .all(|f| matches!(f, Ok(RawBsonRef::String(f)) if !touches_id(f))),
            _ => false,
        };
        if !keeps {
            return Ok(false);
        }
    }
    Ok(false)
}

/// Why a filter that depends on the clock or on chance is not measured.
const UNMEASURABLE: &str = "the filter is not proved selective and depends on the clock or on \
     chance ($$NOW, $$CLUSTER_TIME, $rand, $sampleRate, $meta or JavaScript), so no \
     measurement can tell what the write will match; mongoguard does not forward it \
     (measure.on_error): compare with a date computed by the application instead";

/// `$push: {field: v}` where `v` is not `{$each: [...], $slice: n}`.
fn unbounded_push(ops: &RawDocument) -> Result<bool, CommandError> {
    let push = match ops.get_fast("$push") {
        Ok(Some(RawBsonRef::Document(d))) => d,
        Ok(_) => return Ok(false),
        Err(_) => return Err(CommandError::Malformed),
    };
    for field in push.iter_elements() {
        let field = field.map_err(|_| CommandError::Malformed)?;
        let bounded = match field.value().map_err(|_| CommandError::Malformed)? {
            RawBsonRef::Document(spec) => spec.get_fast("$slice").ok().flatten().is_some(),
            _ => false,
        };
        if !bounded {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `admin`, `local`, `config`, or a `system.*` collection anywhere.
pub(crate) fn is_system_namespace(ns: Namespace<'_>) -> bool {
    matches!(ns.db, "admin" | "local" | "config")
        || ns.coll.is_some_and(|c| c.starts_with("system."))
}

/// W006 (`j` falsy) and W007 (`w: 0`) from `writeConcern`, and from getLastError's own
/// fields for legacy applications; W006 also from the default write concern that
/// setDefaultRWConcern installs for every client.
///
/// `j: null` (or undefined) is absent, not false: `j` is an optional `safeBool` of
/// `WriteConcernIdl` (src/mongo/db/write_concern_options.idl) and the IDL parser skips a null
/// optional field (src/mongo/idl/idl_parser.cpp `checkAndAssertTypeSlowPath`), so the
/// server's default journaling applies. `w: 0` on `endSessions` is how drivers close their
/// sessions without waiting (Node.js, mongosh): it writes no application data and is not W007.
fn write_concern<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    if view.name() == "setDefaultRWConcern" {
        if let Some(body) = view.body() {
            if let Some(default) = value_doc(body, "defaultWriteConcern")? {
                if journal_off(default)? {
                    em.emit(RuleId::W006, None, None);
                }
            }
        }
    }
    let wc = if view.kind() == Kind::GetLastError {
        view.body()
    } else {
        view.write_concern()?
    };
    let Some(wc) = wc else { return Ok(()) };
    if journal_off(wc)? {
        em.emit(RuleId::W006, None, None);
    }
    if let Ok(Some(w)) = wc.get_fast("w") {
        if number(w) == Some(0.0) && !NO_USER_DATA.contains(&view.name()) {
            em.emit(RuleId::W007, None, None);
        }
    }
    Ok(())
}

/// Commands whose `w: 0` loses no application write: drivers end their sessions with it.
const NO_USER_DATA: &[&str] = &["endSessions"];

/// `j` given and falsy (false, any numeric zero); null and undefined are absent.
fn journal_off(wc: &RawDocument) -> Result<bool, CommandError> {
    match wc.get_fast("j") {
        Ok(Some(RawBsonRef::Null | RawBsonRef::Undefined)) | Ok(None) => Ok(false),
        Ok(Some(j)) => Ok(truthy(j) == Some(false)),
        Err(_) => Err(CommandError::Malformed),
    }
}

/// An optional document field of a command body (null is absent); another type is an error.
fn value_doc<'a>(
    body: &'a RawDocument,
    key: &'static str,
) -> Result<Option<&'a RawDocument>, CommandError> {
    match body.get_fast(key) {
        Ok(None | Some(RawBsonRef::Null | RawBsonRef::Undefined)) => Ok(None),
        Ok(Some(RawBsonRef::Document(d))) => {
            // A repeated `j` could hide a false one from a first-key reader.
            crate::wire::check_duplicate_keys(d).map_err(|_| CommandError::DuplicateKey)?;
            Ok(Some(d))
        }
        Ok(Some(_)) => Err(CommandError::BadField {
            command: "setDefaultRWConcern",
            field: "defaultWriteConcern",
        }),
        Err(_) => Err(CommandError::Malformed),
    }
}
