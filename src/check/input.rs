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
}

/// Why a line could not be used. The reason never quotes the line (it may hold literals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// Not JSON.
    NotJson,
    /// JSON, but not Extended JSON that converts to BSON.
    BadExtendedJson,
    /// mongod truncated the command in its log (`$truncated`): it cannot be judged.
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

fn to_document(v: &Value) -> Result<Document, LineError> {
    match Bson::try_from(v.clone()) {
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

/// Rebuilds a whole command from the per-statement form mongod uses in slow-query log
/// entries and profiler documents of `update` / `remove` operations: `{q, u, multi, upsert}`
/// or `{q, limit}`.
fn statement_command(op: &str, coll: &str, statement: Document) -> Option<Document> {
    if !statement.contains_key("q") {
        return None;
    }
    let mut cmd = Document::new();
    match op {
        "update" => {
            cmd.insert("update", coll);
            cmd.insert("updates", vec![Bson::Document(statement)]);
        }
        "remove" | "delete" => {
            cmd.insert("delete", coll);
            let mut s = statement;
            if !s.contains_key("limit") {
                s.insert("limit", 0);
            }
            cmd.insert("deletes", vec![Bson::Document(s)]);
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
    // Fields mongod adds to logged commands that are not part of what the client sent.
    for k in ["lsid", "$clusterTime", "$readPreference"] {
        cmd.remove(k);
    }
    if cmd.is_empty() {
        return Ok(None);
    }
    Ok(Some(Captured {
        db,
        command: to_raw(&cmd)?,
        app: app.map(str::to_owned),
    }))
}

/// Parses one line. `Ok(None)`: a valid line that carries no command to judge.
pub fn parse_line(line: &str, default_db: &str) -> Result<Option<Captured>, LineError> {
    let v: Value = serde_json::from_str(line).map_err(|_| LineError::NotJson)?;
    let Value::Object(obj) = &v else {
        return Err(LineError::NotJson);
    };
    // (a) mongod structured log: {"t":..,"c":"COMMAND","msg":"Slow query","attr":{..}}
    if let (Some(attr), Some(_)) = (obj.get("attr"), obj.get("msg")) {
        let Some(command) = attr.get("command") else {
            return Ok(None);
        };
        let ns = attr.get("ns").and_then(Value::as_str).unwrap_or("");
        let (db, coll) = split_ns(ns);
        let app = attr.get("appName").and_then(Value::as_str);
        let doc = to_document(command)?;
        let kind = attr
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("command");
        if kind == "getmore" {
            return Ok(None);
        }
        let doc = match (kind, coll) {
            ("update" | "remove", Some(coll)) => {
                statement_command(kind, coll, doc.clone()).unwrap_or(doc)
            }
            _ => doc,
        };
        return captured(doc, (!db.is_empty()).then_some(db), app);
    }
    // (b) profiler document: {"op": "update", "ns": "db.coll", "command": {..}, "appName": ..}
    if let (Some(op), Some(ns)) = (
        obj.get("op").and_then(Value::as_str),
        obj.get("ns").and_then(Value::as_str),
    ) {
        let Some(command) = obj.get("command") else {
            return Ok(None);
        };
        if op == "getmore" || op == "killcursors" {
            return Ok(None);
        }
        let (db, coll) = split_ns(ns);
        let app = obj.get("appName").and_then(Value::as_str);
        let doc = to_document(command)?;
        let doc = match (op, coll) {
            ("update" | "remove", Some(coll)) => {
                statement_command(op, coll, doc.clone()).unwrap_or(doc)
            }
            _ => doc,
        };
        return captured(doc, Some(db), app);
    }
    // (c) {"db": "app", "command": {...}} or a bare command with $db.
    if let Some(command) = obj.get("command") {
        let db = obj.get("db").and_then(Value::as_str).unwrap_or(default_db);
        let app = obj.get("app").and_then(Value::as_str);
        return captured(to_document(command)?, Some(db), app);
    }
    captured(to_document(&v)?, Some(default_db), None)
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
