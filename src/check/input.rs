//! Reading captured commands: mongod JSON log lines, profiler documents, command lines.

use bson::{Bson, Document, RawDocumentBuf};
use serde_json::Value;

/// A command recovered from a line.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Database it ran against.
    pub db: String,
    /// The command document (command name first).
    pub command: RawDocumentBuf,
    /// Application name, when the source records it.
    pub app: Option<String>,
    /// The log line's thread (`ctx`): `conn123` for a client connection, a thread name
    /// (`LogicalSessionCacheRefresh`, `TenantMigrationDonorService-0`, ...) for mongod's own work.
    pub thread: Option<String>,
    /// For a per-statement log line (a slow `update` / `remove` operation, logged before the
    /// command that carried it): the command it belongs to and the collection.
    pub statement_of: Option<(&'static str, String)>,
}

impl Captured {
    /// True for a command mongod ran on its own behalf: the log line's thread is not a client
    /// connection (`conn<N>`). Such commands are reported apart and never block.
    pub fn internal(&self) -> bool {
        self.thread
            .as_deref()
            .is_some_and(|t| !t.starts_with("conn"))
    }
}

/// What one input line holds.
#[derive(Debug, Clone)]
pub enum Line {
    /// A command to judge.
    Command(Captured),
    /// A valid line without a command (connection events, getMore entries, ...).
    NoCommand,
    /// A secondary applying the oplog ("applied op", the REPL component): replication of a
    /// write the primary already judged, not a client's command.
    Replication,
    /// A write mongod makes to a time-series collection's buckets (`system.buckets.*`)
    /// while it runs a client's insert / update / delete on the collection: logged per
    /// statement, often without its update document. The client's own command is judged from
    /// its own line, so this one is counted, not judged.
    BucketWrite,
}

/// Why a line could not be used. The reason never quotes the line (it may hold literals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// Not JSON.
    NotJson,
    /// JSON, but not Extended JSON that converts to BSON.
    BadExtendedJson,
    /// mongod truncated the command in its log (`$truncated`, or the line's `truncated`
    /// object naming `command`): it cannot be judged.
    Truncated,
    /// The command has no database and none can be inferred.
    NoDatabase,
}

impl LineError {
    /// A short reason for the report.
    pub fn reason(self) -> &'static str {
        match self {
            LineError::NotJson => "not JSON",
            LineError::BadExtendedJson => "invalid Extended JSON",
            LineError::Truncated => "command truncated by mongod",
            LineError::NoDatabase => "no database",
        }
    }
}

/// Rewrites the Extended JSON forms mongod writes into the ones the Extended JSON
/// specification's parsers are required to accept, in place:
/// - `{"$binary": {"base64": .., "subType": "0"}}`: mongod writes the subtype as hex without
///   padding (one digit for subtypes below 0x10, e.g. in `$clusterTime.signature.hash` and
///   `lsid.uid`); the spec (extended-json.rst, "$binary") says "one- or two-character hex
///   string", and bson's parser wants two: padded.
/// - the legacy `{"$binary": "<base64>", "$type": "<hex>"}`: rewritten to the canonical form.
///
/// Everything else mongod writes in its relaxed v2 format (`$date` as ISO-8601 or
/// `$numberLong`, `$oid`, `$numberDecimal`, `$numberDouble` for NaN/Infinity, `$timestamp`,
/// `$regularExpression`, `$minKey`/`$maxKey`, `$uuid`, plain numbers for Int32/Int64/Double)
/// bson reads as is (tests below).
fn normalize(v: &mut Value, depth: usize) {
    if depth > 200 {
        return;
    }
    match v {
        Value::Array(items) => items.iter_mut().for_each(|i| normalize(i, depth + 1)),
        Value::Object(obj) => {
            if let Some(bin) = obj.get("$binary") {
                let legacy = match (bin, obj.get("$type")) {
                    (Value::String(b64), Some(Value::String(t))) if obj.len() == 2 => {
                        Some((b64.clone(), t.clone()))
                    }
                    _ => None,
                };
                if let Some((base64, subtype)) = legacy {
                    obj.clear();
                    let mut body = serde_json::Map::new();
                    body.insert("base64".into(), Value::String(base64));
                    body.insert("subType".into(), Value::String(pad_hex(&subtype)));
                    obj.insert("$binary".into(), Value::Object(body));
                    return;
                }
                if let Some(Value::Object(body)) = obj.get_mut("$binary") {
                    if let Some(Value::String(t)) = body.get_mut("subType") {
                        *t = pad_hex(t);
                    }
                    return;
                }
            }
            obj.values_mut().for_each(|i| normalize(i, depth + 1));
        }
        _ => {}
    }
}

fn pad_hex(t: &str) -> String {
    if t.len() == 1 {
        format!("0{t}")
    } else {
        t.to_owned()
    }
}

fn to_document(v: &Value) -> Result<Document, LineError> {
    let mut v = v.clone();
    // Fields mongod adds to logged commands that are not part of what the client sent: they
    // hold the binary forms above and are never judged.
    if let Value::Object(obj) = &mut v {
        for k in ["lsid", "$clusterTime", "$readPreference"] {
            obj.remove(k);
        }
    }
    normalize(&mut v, 0);
    match Bson::try_from(v) {
        Ok(Bson::Document(d)) => Ok(d),
        _ => Err(LineError::BadExtendedJson),
    }
}

fn to_raw(d: &Document) -> Result<RawDocumentBuf, LineError> {
    RawDocumentBuf::try_from(d).map_err(|_| LineError::BadExtendedJson)
}

/// `db.coll` → (`db`, `coll`).
fn split_ns(ns: &str) -> (&str, Option<&str>) {
    match ns.split_once('.') {
        Some((db, coll)) => (db, Some(coll)),
        None => (ns, None),
    }
}

/// The command a per-statement line belongs to: mongod logs each slow `update` / `remove`
/// operation of a write command as its own "Slow query" line (type `update` / `remove`, the
/// statement `{q, u, multi, upsert}` or `{q, limit}` as `command`), before the command's line.
fn statement_kind(op: &str) -> Option<&'static str> {
    match op {
        "update" => Some("update"),
        "remove" | "delete" => Some("delete"),
        _ => None,
    }
}

/// Rebuilds a whole command from one per-statement form (slow-query log entries and profiler
/// documents of `update` / `remove` operations).
pub(super) fn statement_command(
    kind: &str,
    coll: &str,
    statements: Vec<Document>,
) -> Option<Document> {
    let mut cmd = Document::new();
    let statements: Vec<Bson> = statements
        .into_iter()
        .map(|mut s| {
            if kind == "delete" && !s.contains_key("limit") {
                s.insert("limit", 0);
            }
            Bson::Document(s)
        })
        .collect();
    match kind {
        "update" => {
            cmd.insert("update", coll);
            cmd.insert("updates", statements);
        }
        "delete" => {
            cmd.insert("delete", coll);
            cmd.insert("deletes", statements);
        }
        _ => return None,
    }
    Some(cmd)
}

/// Finishes a command: drops `$db` from the body (it is carried separately), refuses
/// truncated ones.
fn captured(
    mut cmd: Document,
    db: Option<&str>,
    app: Option<&str>,
) -> Result<Option<Captured>, LineError> {
    if cmd.contains_key("$truncated") {
        return Err(LineError::Truncated);
    }
    let db = match cmd.remove("$db") {
        Some(Bson::String(s)) => s,
        _ => db.ok_or(LineError::NoDatabase)?.to_owned(),
    };
    if cmd.is_empty() {
        return Ok(None);
    }
    Ok(Some(Captured {
        db,
        command: to_raw(&cmd)?,
        app: app.map(str::to_owned),
        thread: None,
        statement_of: None,
    }))
}

fn command_line(c: Option<Captured>) -> Line {
    c.map_or(Line::NoCommand, Line::Command)
}

/// True for the lines of a secondary applying the oplog: the REPL component, or the
/// "applied op" message (id 51801, logged for slow oplog application).
fn replication(obj: &serde_json::Map<String, Value>) -> bool {
    let component = obj.get("c").and_then(Value::as_str);
    let msg = obj.get("msg").and_then(Value::as_str).unwrap_or("");
    component == Some("REPL") || msg.eq_ignore_ascii_case("applied op")
}

/// Parses one line.
pub fn parse(line: &str, default_db: &str) -> Result<Line, LineError> {
    let v: Value = serde_json::from_str(line).map_err(|_| LineError::NotJson)?;
    let Value::Object(obj) = &v else {
        return Err(LineError::NotJson);
    };
    // (a) mongod structured log (4.4+): {"t":..,"s":..,"c":"COMMAND","id":51803,"ctx":"conn7",
    // "msg":"Slow query","attr":{..}}, with `truncated` / `size` beside `attr` when mongod cut
    // an attribute longer than maxLogSizeKB.
    if let (Some(attr), Some(_)) = (obj.get("attr"), obj.get("msg")) {
        if replication(obj) {
            return Ok(Line::Replication);
        }
        let Some(command) = attr.get("command") else {
            return Ok(Line::NoCommand);
        };
        if obj
            .get("truncated")
            .and_then(|t| t.get("command"))
            .is_some()
        {
            return Err(LineError::Truncated);
        }
        let ns = attr.get("ns").and_then(Value::as_str).unwrap_or("");
        let (db, coll) = split_ns(ns);
        let app = attr.get("appName").and_then(Value::as_str);
        let thread = obj.get("ctx").and_then(Value::as_str);
        let kind = attr
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("command");
        if kind == "getmore" || kind == "killcursors" {
            return Ok(Line::NoCommand);
        }
        let statement = statement_kind(kind);
        if matches!(kind, "update" | "remove" | "delete" | "insert")
            && coll.is_some_and(|c| c.starts_with("system.buckets."))
        {
            return Ok(Line::BucketWrite);
        }
        let doc = to_document(command)?;
        let mut statement_of = None;
        let doc = match (statement, coll) {
            (Some(kind), Some(coll)) if doc.contains_key("q") => {
                statement_of = Some((kind, coll.to_owned()));
                statement_command(kind, coll, vec![doc.clone()]).unwrap_or(doc)
            }
            _ => doc,
        };
        let mut c = captured(doc, (!db.is_empty()).then_some(db), app)?;
        if let Some(c) = &mut c {
            c.thread = thread.map(str::to_owned);
            c.statement_of = statement_of;
        }
        return Ok(command_line(c));
    }
    // (b) profiler document: {"op": "update", "ns": "db.coll", "command": {..}, "appName": ..}
    if let (Some(op), Some(ns)) = (
        obj.get("op").and_then(Value::as_str),
        obj.get("ns").and_then(Value::as_str),
    ) {
        let Some(command) = obj.get("command") else {
            return Ok(Line::NoCommand);
        };
        if op == "getmore" || op == "killcursors" {
            return Ok(Line::NoCommand);
        }
        let (db, coll) = split_ns(ns);
        if matches!(op, "update" | "remove" | "insert")
            && coll.is_some_and(|c| c.starts_with("system.buckets."))
        {
            return Ok(Line::BucketWrite);
        }
        let app = obj.get("appName").and_then(Value::as_str);
        let doc = to_document(command)?;
        let doc = match (statement_kind(op), coll) {
            (Some(kind), Some(coll)) if doc.contains_key("q") => {
                statement_command(kind, coll, vec![doc.clone()]).unwrap_or(doc)
            }
            _ => doc,
        };
        return captured(doc, Some(db), app).map(command_line);
    }
    // (c) {"db": "app", "command": {...}} or a bare command with $db.
    if let Some(command) = obj.get("command") {
        let db = obj.get("db").and_then(Value::as_str).unwrap_or(default_db);
        let app = obj.get("app").and_then(Value::as_str);
        return captured(to_document(command)?, Some(db), app).map(command_line);
    }
    captured(to_document(&v)?, Some(default_db), None).map(command_line)
}

/// Parses one line. `Ok(None)`: a valid line that carries no command to judge.
pub fn parse_line(line: &str, default_db: &str) -> Result<Option<Captured>, LineError> {
    Ok(match parse(line, default_db)? {
        Line::Command(c) => Some(c),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mongod_slow_query_update_statement_becomes_a_command() {
        let line = r#"{"t":{"$date":"2026-11-20T10:00:00.000+00:00"},"s":"I","c":"WRITE","id":51803,"ctx":"conn7","msg":"Slow query","attr":{"type":"update","ns":"shop.orders","appName":"billing","command":{"q":{},"u":{"$set":{"x":1}},"multi":true,"upsert":false},"durationMillis":120}}"#;
        let c = parse_line(line, "test").unwrap().unwrap();
        assert_eq!(c.db, "shop");
        assert_eq!(c.app.as_deref(), Some("billing"));
        assert_eq!(crate::wire::first_key(&c.command), Some("update"));
    }

    #[test]
    fn log_lines_without_commands_are_ignored_and_truncated_ones_refused() {
        assert!(parse_line(
            r#"{"t":{"$date":"x"},"msg":"Connection accepted","attr":{"remote":"1.2.3.4"}}"#,
            "t"
        )
        .unwrap()
        .is_none());
        let truncated = r#"{"msg":"Slow query","attr":{"type":"command","ns":"a.b","command":{"insert":"b","$truncated":"..."}}}"#;
        assert_eq!(
            parse_line(truncated, "t").unwrap_err(),
            LineError::Truncated
        );
        assert_eq!(parse_line("not json", "t").unwrap_err(), LineError::NotJson);
    }

    /// mongod writes `$binary.subType` as one hex digit; the Extended JSON spec allows one or
    /// two; bson's parser wants two. Also the legacy `{$binary, $type}` form.
    #[test]
    fn one_digit_binary_subtypes_and_the_legacy_binary_form_are_read() {
        let one = r#"{"find":"files","filter":{"md5":{"$binary":{"base64":"1B2M2Y8AsgTpgAmY7PhCfg==","subType":"5"}}},"$db":"app"}"#;
        let c = parse_line(one, "t").unwrap().unwrap();
        let filter = c.command.get_document("filter").unwrap();
        let bin = filter.get_binary("md5").unwrap();
        assert_eq!(bin.subtype, bson::spec::BinarySubtype::Md5);
        let legacy =
            r#"{"find":"files","filter":{"h":{"$binary":"AAAA","$type":"0"}},"$db":"app"}"#;
        let c = parse_line(legacy, "t").unwrap().unwrap();
        let filter = c.command.get_document("filter").unwrap();
        assert_eq!(filter.get_binary("h").unwrap().bytes, &[0, 0, 0]);
        // Still strict: a subtype that is not hex is invalid.
        let bad =
            r#"{"find":"f","filter":{"h":{"$binary":{"base64":"AAAA","subType":"zz"}}},"$db":"a"}"#;
        assert_eq!(
            parse_line(bad, "t").unwrap_err(),
            LineError::BadExtendedJson
        );
    }

    #[test]
    fn profiler_and_plain_commands() {
        let p = r#"{"op":"remove","ns":"app.sessions","command":{"q":{"expires":{"$lt":{"$date":"2026-01-01T00:00:00Z"}}},"limit":0},"millis":5}"#;
        let c = parse_line(p, "t").unwrap().unwrap();
        assert_eq!(crate::wire::first_key(&c.command), Some("delete"));
        let plain = r#"{"find":"users","filter":{"age":{"$ne":3}},"$db":"app"}"#;
        assert_eq!(parse_line(plain, "t").unwrap().unwrap().db, "app");
        let wrapped = r#"{"db":"app","command":{"dropDatabase":1}}"#;
        assert_eq!(parse_line(wrapped, "t").unwrap().unwrap().db, "app");
    }
}
