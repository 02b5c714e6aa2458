//! Command dispatch and shared helpers.

pub(crate) mod admin;
pub(crate) mod aggregate;
pub(crate) mod auth;
mod expr;
pub(crate) mod hello;
pub(crate) mod read;
pub(crate) mod standin;
pub(crate) mod write;

use bson::{doc, Bson, Document};

use crate::conn::ConnState;
use crate::query::QueryError;
use crate::server::Shared;
use crate::update::UpdateError;

/// A command failure, rendered like mongod's: `{ok: 0.0, errmsg, code, codeName}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CmdError {
    pub(crate) code: i32,
    pub(crate) code_name: &'static str,
    pub(crate) msg: String,
    /// `errorLabels` of the reply (e.g. TransientTransactionError).
    pub(crate) labels: Vec<String>,
}

impl CmdError {
    pub(crate) fn new(code: i32, code_name: &'static str, msg: impl Into<String>) -> CmdError {
        CmdError {
            code,
            code_name,
            msg: msg.into(),
            labels: Vec::new(),
        }
    }

    /// The error document of a code without a name (mongod's codeName is then
    /// `Location<code>`).
    pub(crate) fn to_doc_location(&self) -> Document {
        let mut d = self.to_doc();
        d.insert("codeName", format!("Location{}", self.code));
        d
    }

    pub(crate) fn with_label(mut self, label: &str) -> CmdError {
        self.labels.push(label.to_string());
        self
    }

    pub(crate) fn bad_value(msg: impl Into<String>) -> CmdError {
        CmdError::new(2, "BadValue", msg)
    }

    pub(crate) fn type_mismatch(msg: impl Into<String>) -> CmdError {
        CmdError::new(14, "TypeMismatch", msg)
    }

    pub(crate) fn failed_to_parse(msg: impl Into<String>) -> CmdError {
        CmdError::new(9, "FailedToParse", msg)
    }

    pub(crate) fn ns_not_found(msg: impl Into<String>) -> CmdError {
        CmdError::new(26, "NamespaceNotFound", msg)
    }

    pub(crate) fn to_doc(&self) -> Document {
        let mut d = doc! {"ok": 0.0, "errmsg": self.msg.clone(), "code": self.code, "codeName": self.code_name};
        if !self.labels.is_empty() {
            d.insert("errorLabels", self.labels.clone());
        }
        d
    }

    /// The entry of a `writeErrors` array.
    pub(crate) fn write_error(&self, index: usize) -> Document {
        doc! {"index": index as i32, "code": self.code, "codeName": self.code_name, "errmsg": self.msg.clone()}
    }
}

impl From<QueryError> for CmdError {
    fn from(e: QueryError) -> Self {
        CmdError::bad_value(e.0)
    }
}

impl From<UpdateError> for CmdError {
    fn from(e: UpdateError) -> Self {
        CmdError::new(e.code, e.code_name, e.msg)
    }
}

pub(crate) type CmdResult = Result<Document, CmdError>;

/// What a command runs against.
pub(crate) struct Ctx<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) conn: &'a mut ConnState,
    pub(crate) db: String,
    /// The request allows a secondary to serve reads (OP_MSG `$readPreference` with a mode
    /// other than `primary`, or the OP_QUERY secondaryOk flag).
    pub(crate) secondary_ok: bool,
}

impl Ctx<'_> {
    /// The owner of a cursor this command opens.
    pub(crate) fn owner(&self, cmd: &Document) -> crate::cursor::Owner {
        let session = crate::txn::parse(cmd).unwrap_or_default();
        crate::cursor::Owner {
            user: self.conn.user.clone(),
            txn_number: session.txn_number.filter(|_| session.in_transaction()),
            lsid: session.lsid,
        }
    }
}

/// Commands an unauthenticated connection may run while users are configured.
const NO_AUTH_NEEDED: &[&str] = &[
    "hello",
    "ismaster",
    "ping",
    "buildinfo",
    "getnonce",
    "saslstart",
    "saslcontinue",
    "endsessions",
    "standinstats",
    "standinstepdown",
];

/// Commands a member that is not primary refuses with NotWritablePrimary (10107).
const WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findandmodify",
    "create",
    "drop",
    "dropdatabase",
    "createindexes",
    "dropindexes",
    "deleteindexes",
    "renamecollection",
    "collmod",
    "committransaction",
    "aborttransaction",
];

/// Commands a secondary serves only when the request allows it (else 13435). `getMore` and
/// `killCursors` are not here: as on mongod, they work on any member (a cursor only exists on
/// the member that opened it, which already accepted the read).
const READS: &[&str] = &[
    "find",
    "aggregate",
    "count",
    "distinct",
    "listcollections",
    "listindexes",
    "listdatabases",
    "dbstats",
    "explain",
];

/// The NotWritablePrimary error.
pub(crate) fn not_writable_primary() -> CmdError {
    CmdError::new(10107, "NotWritablePrimary", "not primary")
}

/// The refusal a member that is not primary gives to this command, if any.
fn role_refusal(ctx: &Ctx, name: &str) -> Option<CmdError> {
    if ctx.shared.is_writable_primary() {
        return None;
    }
    if WRITES.contains(&name) {
        return Some(not_writable_primary());
    }
    if READS.contains(&name) && !ctx.secondary_ok {
        return Some(CmdError::new(
            13435,
            "NotPrimaryNoSecondaryOk",
            "not primary and secondaryOk=false",
        ));
    }
    None
}

/// True if `$readPreference` (in an OP_MSG body or an OP_QUERY wrapper) lets a secondary
/// serve the request.
pub(crate) fn read_pref_allows_secondary(doc: &Document) -> bool {
    match doc.get("$readPreference") {
        Some(Bson::Document(rp)) => {
            matches!(rp.get("mode"), Some(Bson::String(m)) if m != "primary")
        }
        // The legacy string form ({$readPreference: "secondary"}).
        Some(Bson::String(m)) => m != "primary",
        _ => false,
    }
}

/// Runs a command (`name` = lower-cased first key) and returns the reply document.
pub(crate) fn run(ctx: &mut Ctx, name: &str, cmd: &Document) -> Document {
    let original = cmd.keys().next().cloned().unwrap_or_default();
    let res = if !ctx.shared.users.is_empty()
        && ctx.conn.user.is_none()
        && !NO_AUTH_NEEDED.contains(&name)
    {
        Err(CmdError::new(
            13,
            "Unauthorized",
            format!("command {original} requires authentication"),
        ))
    } else if !SPELLINGS.contains(&original.as_str()) {
        Err(CmdError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{original}'"),
        ))
    } else if let Some(e) = fail_point(ctx, &original, cmd) {
        Err(e)
    } else {
        validate(name, cmd).and_then(|session| {
            if let Some(e) = role_refusal(ctx, name) {
                return Err(e);
            }
            ctx.shared.sessions.begin_or_continue(
                ctx.conn.user.as_deref(),
                name,
                &session,
                ctx.shared.topology_counter(),
                ctx.shared.is_writable_primary(),
            )?;
            dispatch(ctx, name, &original, cmd)
        })
    };
    let reply = match res {
        Ok(mut d) => {
            if !d.contains_key("ok") {
                d.insert("ok", 1.0);
            }
            d
        }
        Err(e) => e.to_doc(),
    };
    // getLastError reports the connection's previous request when it was a write: mongod's
    // LastError is per client (connection), recorded by the write paths
    // (src/mongo/db/ops/write_ops_exec.cpp: recordInsert/recordUpdate/recordDelete, and
    // setLastError in handleError), every request starts a new one (startRequest) and
    // getLastError answers `{err: null, n: 0}` unless its previous request recorded one
    // (`getNPrev() != 1`), without counting itself (`disable()`;
    // src/mongo/db/commands/get_last_error.cpp, src/mongo/db/lasterror.cpp).
    match name {
        "getlasterror" | "getlasterr" => {}
        "insert" | "update" | "delete" => ctx.conn.last_error = Some(last_error_of(&reply)),
        _ => ctx.conn.last_error = None,
    }
    reply
}

/// What a write's reply leaves for getLastError: its first write error, else its count.
fn last_error_of(reply: &Document) -> Document {
    let first_error = match reply.get("writeErrors") {
        Some(Bson::Array(errors)) => errors.first().and_then(Bson::as_document),
        _ => None,
    };
    match (first_error, reply.get("errmsg")) {
        (Some(e), _) => doc! {
            "err": e.get("errmsg").cloned().unwrap_or(Bson::Null),
            "code": e.get("code").cloned().unwrap_or(Bson::Null),
            "n": 0,
        },
        (None, Some(msg)) => doc! {
            "err": msg.clone(),
            "code": reply.get("code").cloned().unwrap_or(Bson::Null),
            "n": 0,
        },
        (None, None) => doc! {
            "err": Bson::Null,
            "n": reply.get("n").cloned().unwrap_or(Bson::Int32(0)),
        },
    }
}

/// Applies the fail points to a command: an error to answer instead, or a delay or close
/// of the reply kept on the connection.
fn fail_point(ctx: &mut Ctx, original: &str, cmd: &Document) -> Option<CmdError> {
    let effect = ctx.shared.failpoints.check(original, cmd);
    ctx.conn.fail_block = effect.block;
    ctx.conn.fail_close = effect.close;
    effect.error
}

/// Generic arguments every command accepts (src/mongo/idl/generic_argument.idl, API v1 and
/// unstable lists).
const GENERIC_ARGS: &[&str] = &[
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "$db",
    "maxTimeMS",
    "readConcern",
    "writeConcern",
    "lsid",
    "clientOperationKey",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "stmtId",
    "comment",
    "$readPreference",
    "$clusterTime",
    "$audit",
    "$client",
    "$configServerState",
    "allowImplicitCollectionCreation",
    "$oplogQueryData",
    "$queryOptions",
    "$replData",
    "databaseVersion",
    "shardVersion",
    "tracking_info",
    "coordinator",
    "maxTimeMSOpOnly",
    "$configTime",
    "$topologyTime",
    "txnRetryCounter",
    "mayBypassWriteBlocking",
    "$tenant",
    "expectPrefix",
];

/// Fields of the write commands' common base (`WriteCommandRequestBase` in
/// src/mongo/db/ops/write_ops.idl).
const WRITE_BASE: &[&str] = &[
    "bypassDocumentValidation",
    "ordered",
    "stmtIds",
    "isTimeseriesNamespace",
    "collectionUUID",
    "encryptionInformation",
    "bypassEmptyTsReplacement",
    "rawData",
];

/// The command-specific fields of the commands whose IDL is `strict: true`: an unknown
/// top-level field is refused with 40415 (src/mongo/idl/idl_parser.cpp,
/// `IDLParserContext::throwUnknownField`).
fn strict_fields(name: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match name {
        // src/mongo/db/query/find_command.idl
        "find" => (
            "find",
            &[
                "filter",
                "projection",
                "sort",
                "hint",
                "collation",
                "skip",
                "limit",
                "batchSize",
                "ntoreturn",
                "singleBatch",
                "allowDiskUse",
                "min",
                "max",
                "returnKey",
                "showRecordId",
                "tailable",
                "oplogReplay",
                "noCursorTimeout",
                "awaitData",
                "allowPartialResults",
                "let",
                "options",
                "term",
                "readOnce",
                "allowSpeculativeMajorityRead",
                "$_requestResumeToken",
                "$_resumeAfter",
                "$_startAt",
                "runtimeConstants",
                "collectionUUID",
                "encryptionInformation",
                "includeQueryStatsMetrics",
                "isTimeseriesNamespace",
                "rawData",
            ],
        ),
        // src/mongo/db/ops/write_ops.idl (plus WRITE_BASE)
        "insert" => ("insert", &["documents"]),
        "update" => ("update", &["updates", "let", "runtimeConstants"]),
        "delete" => ("delete", &["deletes", "let", "runtimeConstants"]),
        // src/mongo/db/query/getmore_command.idl
        "getmore" => (
            "getMore",
            &[
                "collection",
                "batchSize",
                "term",
                "lastKnownCommittedOpTime",
                "includeQueryStatsMetrics",
            ],
        ),
        // src/mongo/db/query/kill_cursors.idl
        "killcursors" => ("killCursors", &["cursors"]),
        // src/mongo/db/auth/sasl_commands.idl
        "saslstart" => (
            "saslStart",
            &["mechanism", "autoAuthorize", "options", "payload"],
        ),
        "saslcontinue" => ("saslContinue", &["conversationId", "payload"]),
        _ => return None,
    })
}

fn unknown_field(path: &str) -> CmdError {
    CmdError::new(
        40415,
        "Location40415",
        format!("BSON field '{path}' is an unknown field."),
    )
}

/// What mongod checks before running a command: unknown fields of strict commands, the
/// write concern, and the session fields; returns the session fields.
fn validate(name: &str, cmd: &Document) -> Result<crate::txn::SessionArgs, CmdError> {
    if let Some((idl, own)) = strict_fields(name) {
        let writes = matches!(name, "insert" | "update" | "delete");
        for k in cmd.keys().skip(1) {
            let k = k.as_str();
            let known = own.contains(&k)
                || GENERIC_ARGS.contains(&k)
                || (writes && WRITE_BASE.contains(&k));
            if !known {
                return Err(unknown_field(&format!("{idl}.{k}")));
            }
        }
        // The statements are strict structs too (UpdateOpEntry, DeleteOpEntry).
        let entries: Option<(&str, &[&str], &[&str])> = match name {
            "update" => Some((
                "updates",
                &[
                    "q",
                    "u",
                    "c",
                    "arrayFilters",
                    "hint",
                    "multi",
                    "upsert",
                    "upsertSupplied",
                    "collation",
                    "sampleId",
                    "$_allowShardKeyUpdatesWithoutFullShardKeyInQuery",
                ],
                &["q", "u"],
            )),
            "delete" => Some((
                "deletes",
                &["q", "limit", "hint", "collation", "sampleId"],
                &["q", "limit"],
            )),
            _ => None,
        };
        if let Some((field, allowed, required)) = entries {
            if let Some(Bson::Array(items)) = cmd.get(field) {
                for item in items {
                    let Bson::Document(d) = item else { continue };
                    if let Some(k) = d.keys().find(|k| !allowed.contains(&k.as_str())) {
                        return Err(unknown_field(&format!("{idl}.{field}.{k}")));
                    }
                    if let Some(k) = required.iter().find(|k| !d.contains_key(**k)) {
                        return Err(CmdError::new(
                            40414,
                            "Location40414",
                            format!(
                                "BSON field '{idl}.{field}.{k}' is missing but a required field"
                            ),
                        ));
                    }
                }
            }
        }
    }
    if let Some(wc) = cmd.get("writeConcern") {
        validate_write_concern(wc)?;
    }
    let session = crate::txn::parse(cmd)?;
    if session.in_transaction() {
        // src/mongo/db/transaction_validation.cpp (validateWriteConcernForTransaction).
        if cmd.contains_key("writeConcern")
            && !matches!(name, "committransaction" | "aborttransaction")
        {
            return Err(CmdError::new(
                72,
                "InvalidOptions",
                "writeConcern is not allowed within a multi-statement transaction",
            ));
        }
        // src/mongo/db/service_entry_point_common.cpp.
        if cmd.contains_key("readConcern") && session.start_transaction.is_none() {
            return Err(CmdError::new(
                72,
                "InvalidOptions",
                "Only the first command in a transaction may specify a readConcern",
            ));
        }
    }
    Ok(session)
}

/// `writeConcern` as mongod parses it (src/mongo/db/write_concern_idl.cpp,
/// `deserializeWriteConcernW` and `parseWTimeoutFromBSON`; 50 = ReplSetConfig::kMaxMembers).
fn validate_write_concern(wc: &Bson) -> Result<(), CmdError> {
    let Bson::Document(wc) = wc else {
        return Err(CmdError::type_mismatch(format!(
            "BSON field 'writeConcern' is the wrong type '{}', expected type 'object'",
            crate::bsonutil::type_name(wc)
        )));
    };
    match wc.get("w") {
        None | Some(Bson::Null) | Some(Bson::Undefined) | Some(Bson::String(_)) => {}
        Some(Bson::Double(d)) if d.is_nan() => {
            return Err(CmdError::failed_to_parse("w cannot be NaN"))
        }
        Some(v @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) => {
            let n = crate::bsonutil::as_i64(v).unwrap_or(-1);
            if !(0..=50).contains(&n) {
                return Err(CmdError::failed_to_parse(format!(
                    "w has to be a non-negative number and not greater than 50; found: {n}"
                )));
            }
        }
        Some(Bson::Document(tags)) => {
            if tags.is_empty() {
                return Err(CmdError::failed_to_parse(
                    "tagged write concern requires tags",
                ));
            }
            if let Some((k, v)) = tags
                .iter()
                .find(|(_, v)| crate::bsonutil::as_i64(v).is_none())
            {
                return Err(CmdError::failed_to_parse(format!(
                    "tags must be a single level document with only number values; found: {k}: {v}"
                )));
            }
        }
        Some(other) => {
            return Err(CmdError::failed_to_parse(format!(
                "w has to be a number, string, or object; found: {}",
                crate::bsonutil::type_name(other)
            )))
        }
    }
    if let Some(t) = wc.get("wtimeout") {
        if crate::bsonutil::as_i64(t).is_some_and(|n| n > i64::from(i32::MAX)) {
            return Err(CmdError::failed_to_parse(
                "wtimeout must be a 32-bit integer",
            ));
        }
    }
    Ok(())
}

/// The spellings mongod accepts: command lookup is case-sensitive, with a few historical
/// aliases. `Update` or `FIND` is CommandNotFound there, so it is here too.
const SPELLINGS: &[&str] = &[
    "configureFailPoint",
    "hello",
    "isMaster",
    "ismaster",
    "ping",
    "collMod",
    "commitTransaction",
    "abortTransaction",
    "endSessions",
    "killSessions",
    "killAllSessions",
    "refreshSessions",
    "logout",
    "resetStats",
    "getLastError",
    "getlasterror",
    "buildInfo",
    "buildinfo",
    "getnonce",
    "getParameter",
    "listDatabases",
    "drop",
    "dropDatabase",
    "create",
    "listCollections",
    "createIndexes",
    "listIndexes",
    "dropIndexes",
    "deleteIndexes",
    "renameCollection",
    "serverStatus",
    "connectionStatus",
    "whatsmyuri",
    "dbStats",
    "dbstats",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "find",
    "getMore",
    "killCursors",
    "count",
    "distinct",
    "aggregate",
    "explain",
    "saslStart",
    "saslContinue",
    "authenticate",
    "standinStats",
    "standinStepDown",
];

fn dispatch(ctx: &mut Ctx, name: &str, original: &str, cmd: &Document) -> CmdResult {
    if !SPELLINGS.contains(&original) {
        return Err(CmdError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{original}'"),
        ));
    }
    match name {
        "hello" | "ismaster" => hello::hello(ctx, name, cmd),
        "endsessions" | "killsessions" => {
            let command = if name == "endsessions" { "endSessions" } else { "killSessions" };
            let ids = crate::txn::session_ids(command, cmd.values().next())?;
            let user = ctx.conn.user.as_deref();
            if ids.is_empty() && command == "killSessions" {
                ctx.shared.sessions.end_all_of(user);
            } else {
                ctx.shared.sessions.end(user, &ids);
            }
            Ok(Document::new())
        }
        "ping" | "collmod" | "committransaction" | "aborttransaction" | "killallsessions"
        | "refreshsessions" | "logout"
        | "resetstats" => Ok(Document::new()),
        "getlasterror" | "getlasterr" => Ok(ctx
            .conn
            .last_error
            .clone()
            .unwrap_or_else(|| doc! {"n": 0, "err": Bson::Null})),
        "buildinfo" => Ok(admin::build_info(ctx)),
        // MONGODB-CR's first step, a no-op returning a random 64-bit nonce since 4.0 (kept for
        // old Go drivers: mgo sends it on every new connection), removed in 6.2
        // (SERVER-71007): answered while the stand-in reports a version before that.
        "getnonce" if ctx.shared.config.wire_version < 19 => {
            Ok(doc! {"nonce": format!("{:016x}", rand::random::<u64>())})
        }
        "configurefailpoint" if ctx.db != "admin" => Err(CmdError::new(
            13,
            "Unauthorized",
            "configureFailPoint may only be run against the admin database.",
        )),
        "configurefailpoint" => ctx.shared.failpoints.configure(cmd),
        "getparameter" => admin::get_parameter(ctx, cmd),
        "listdatabases" => admin::list_databases(ctx, cmd),
        "drop" => admin::drop(ctx, cmd),
        "dropdatabase" => admin::drop_database(ctx),
        "create" => admin::create(ctx, cmd),
        "listcollections" => admin::list_collections(ctx, cmd),
        "createindexes" => admin::create_indexes(ctx, cmd),
        "listindexes" => admin::list_indexes(ctx, cmd),
        "dropindexes" | "deleteindexes" => admin::drop_indexes(ctx, cmd),
        "renamecollection" => admin::rename_collection(ctx, cmd),
        "serverstatus" => Ok(admin::server_status(ctx)),
        "connectionstatus" => Ok(admin::connection_status(ctx)),
        "whatsmyuri" => Ok(doc! {"you": ctx.conn.peer.to_string()}),
        "dbstats" => Ok(admin::db_stats(ctx)),
        "insert" => write::insert(ctx, cmd),
        "update" => write::update(ctx, cmd),
        "delete" => write::delete(ctx, cmd),
        "findandmodify" => write::find_and_modify(ctx, cmd),
        "find" => read::find(ctx, cmd),
        "getmore" => read::get_more(ctx, cmd),
        "killcursors" => read::kill_cursors(ctx, cmd),
        "count" => read::count(ctx, cmd),
        "distinct" => read::distinct(ctx, cmd),
        "aggregate" => aggregate::aggregate(ctx, cmd),
        "explain" => aggregate::explain(ctx, cmd),
        "saslstart" => auth::sasl_start(ctx, cmd),
        "saslcontinue" => auth::sasl_continue(ctx, cmd),
        "standinstats" => standin::stats(ctx, cmd),
        "standinstepdown" => standin::step_down(ctx, cmd),
        "authenticate" => Err(CmdError::new(
            334,
            "MechanismUnavailable",
            "only SCRAM-SHA-1 and SCRAM-SHA-256 (saslStart) are supported by the mongoguard stand-in",
        )),
        _ => Err(CmdError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{original}'"),
        )),
    }
}

/// The collection named by the command's first value (must be a non-empty string).
pub(crate) fn coll_name(cmd: &Document) -> Result<String, CmdError> {
    let (k, v) = cmd
        .iter()
        .next()
        .ok_or_else(|| CmdError::bad_value("empty command"))?;
    match v {
        Bson::String(s) if !s.is_empty() && !s.contains('\0') => Ok(s.clone()),
        Bson::String(_) => Err(CmdError::new(
            73,
            "InvalidNamespace",
            format!("Invalid namespace specified for {k}"),
        )),
        _ => Err(CmdError::new(
            73,
            "InvalidNamespace",
            format!("collection name has invalid type {:?}", v.element_type()),
        )),
    }
}

/// An optional document-valued field.
pub(crate) fn opt_doc<'a>(cmd: &'a Document, key: &str) -> Result<Option<&'a Document>, CmdError> {
    match cmd.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d)),
        Some(other) => Err(CmdError::type_mismatch(format!(
            "BSON field '{key}' is the wrong type '{:?}', expected type 'object'",
            other.element_type()
        ))),
    }
}

/// An optional non-negative integer field (any numeric type).
pub(crate) fn opt_count(cmd: &Document, key: &str) -> Result<Option<i64>, CmdError> {
    match cmd.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => match crate::bsonutil::as_i64(v) {
            Some(n) => Ok(Some(n)),
            None => Err(CmdError::type_mismatch(format!(
                "BSON field '{key}' must be a number"
            ))),
        },
    }
}

/// A cursor reply: `{cursor: {firstBatch|nextBatch, id, ns}}`.
pub(crate) fn cursor_reply(ns: &str, batch: Vec<Document>, id: i64, first: bool) -> Document {
    let key = if first { "firstBatch" } else { "nextBatch" };
    let batch: Vec<Bson> = batch.into_iter().map(Bson::Document).collect();
    doc! {"cursor": {key: batch, "id": id, "ns": ns}}
}
