//! The violation record and its one-line JSON rendering.

use std::{
    net::SocketAddr,
    time::{Duration, SystemTime},
};

use super::{json::ObjectWriter, time::format_time};

/// What was done about a violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// The client got an error; nothing was sent upstream.
    Block,
    /// The command was forwarded and the violation recorded.
    Warn,
}

impl Action {
    /// `"block"` or `"warn"`, as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Block => "block",
            Action::Warn => "warn",
        }
    }
}

/// The global policy mode in force when the violation happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Rules act as configured.
    Enforce,
    /// Every `block` was turned into `warn`.
    Audit,
}

impl Mode {
    /// `"enforce"` or `"audit"`, as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

/// Who produced the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The running proxy, on live traffic.
    Proxy,
    /// The offline checker.
    Check,
}

impl Source {
    /// `"proxy"` or `"check"`, as written in records.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Proxy => "proxy",
            Source::Check => "check",
        }
    }
}

/// Everything a violation record says. Built by the proxy (or the offline checker) when the
/// policy reports a violation.
///
/// There is deliberately no field for literal values, command bodies, SASL payloads or
/// passwords (README.md, "Violation records"). The only query text is
/// [`filter_shape`](Self::filter_shape), which must come from the policy's shape renderer
/// (every literal replaced by its type); never put a raw filter there.
#[derive(Debug, Clone, PartialEq)]
pub struct ViolationRecord {
    /// When the violation was seen; rendered RFC 3339 UTC with milliseconds.
    pub time: SystemTime,
    /// Stable rule id, e.g. `"W001"`.
    pub rule_id: &'static str,
    /// Stable rule name, e.g. `"multi-update-without-filter"`.
    pub rule_name: &'static str,
    /// The rule's one-line reason from the rule pack.
    pub reason: &'static str,
    /// What was done.
    pub action: Action,
    /// The mode in force.
    pub mode: Mode,
    /// The client's address.
    pub client_addr: Option<SocketAddr>,
    /// `client.application.name` from the handshake (client-controlled text).
    pub app_name: Option<String>,
    /// Driver name and version from the handshake (client-controlled text).
    pub driver: Option<String>,
    /// The authenticated user, when known.
    pub user: Option<String>,
    /// The command's database (`$db`).
    pub database: String,
    /// The target collection, when the command has one.
    pub collection: Option<String>,
    /// The command name, e.g. `"update"`.
    pub command: String,
    /// Index of the offending statement in a batch.
    pub statement_index: Option<usize>,
    /// JSON text of the filter with every literal replaced by its type, e.g.
    /// `{"age":{"$ne":"<int>"}}`, from the policy's shape renderer. Embedded in the record as
    /// JSON (not as a string); text that is not valid JSON is written as `"<invalid>"`.
    pub filter_shape: Option<String>,
    /// The query-shape hash; rendered as 16 hex digits.
    pub shape_hash: Option<u64>,
    /// The client's request id.
    pub request_id: i32,
    /// Who produced the record.
    pub source: Source,
    /// What this occurrence adds to the rule's reason (a blast-radius measurement's finding,
    /// or why it failed). Never holds literals from the command.
    pub detail: Option<String>,
    /// Documents a blast-radius measurement counted (`max_docs + 1` means "more than").
    pub matched: Option<u64>,
}

/// One JSON line (without the trailing newline) for `rec`.
///
/// Field order: `time, rule, rule_name, reason, detail, matched, action, mode, client, app, driver, user, db,
/// collection, command, statement, filter_shape, shape_hash, request_id, source`. Absent
/// optional fields are left out (never `null`). Every string is JSON-escaped, so the result
/// never contains a raw line break whatever the client sent.
pub fn render(rec: &ViolationRecord) -> String {
    let mut out = String::with_capacity(384);
    render_into(rec, &mut out);
    out
}

/// [`render`] appending to `out`.
pub(crate) fn render_into(rec: &ViolationRecord, out: &mut String) {
    write_record(rec, out, &LINE_KEYS);
}

/// The admin API's form of a record (`GET /violations`): the same fields under the
/// record's field names (`rule_id`, `app_name`, `database`, `statement_index`), without the
/// client's address. Absent optional fields are left out, as in [`render`].
pub fn render_public(rec: &ViolationRecord) -> String {
    let mut out = String::with_capacity(384);
    write_record(rec, &mut out, &PUBLIC_KEYS);
    out
}

/// The keys that differ between the audit line and the admin API's form.
struct Keys {
    rule: &'static str,
    /// `None`: the client's address is left out.
    client: Option<&'static str>,
    app: &'static str,
    db: &'static str,
    statement: &'static str,
}

const LINE_KEYS: Keys = Keys {
    rule: "rule",
    client: Some("client"),
    app: "app",
    db: "db",
    statement: "statement",
};

const PUBLIC_KEYS: Keys = Keys {
    rule: "rule_id",
    client: None,
    app: "app_name",
    db: "database",
    statement: "statement_index",
};

fn write_record(rec: &ViolationRecord, out: &mut String, keys: &Keys) {
    let mut time = String::with_capacity(24);
    format_time(rec.time, &mut time);
    let mut o = ObjectWriter::new(out);
    o.str("time", &time);
    o.str(keys.rule, rec.rule_id);
    o.str("rule_name", rec.rule_name);
    o.str("reason", rec.reason);
    o.opt_str("detail", rec.detail.as_deref());
    if let Some(n) = rec.matched {
        o.num("matched", n);
    }
    o.str("action", rec.action.as_str());
    o.str("mode", rec.mode.as_str());
    if let (Some(key), Some(addr)) = (keys.client, rec.client_addr) {
        o.str(key, &addr.to_string());
    }
    o.opt_str(keys.app, rec.app_name.as_deref());
    o.opt_str("driver", rec.driver.as_deref());
    o.opt_str("user", rec.user.as_deref());
    o.str(keys.db, &rec.database);
    o.opt_str("collection", rec.collection.as_deref());
    o.str("command", &rec.command);
    if let Some(i) = rec.statement_index {
        o.num(keys.statement, i);
    }
    if let Some(shape) = &rec.filter_shape {
        o.json("filter_shape", shape);
    }
    if let Some(h) = rec.shape_hash {
        o.str("shape_hash", &format!("{h:016x}"));
    }
    o.num("request_id", rec.request_id);
    o.str("source", rec.source.as_str());
    o.finish();
}

/// The fields a dedup summary line repeats, plus what it adds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    pub time: SystemTime,
    pub rule_id: &'static str,
    pub rule_name: &'static str,
    pub reason: &'static str,
    pub action: Action,
    pub mode: Mode,
    pub app_name: Option<String>,
    pub database: String,
    pub collection: Option<String>,
    pub filter_shape: Option<String>,
    pub shape_hash: Option<u64>,
    pub source: Source,
    pub suppressed: u64,
    pub window: Duration,
}

/// A summary line: `time, rule, rule_name, reason, action, mode, app, db, collection,
/// filter_shape, shape_hash, source, suppressed, window_seconds`.
pub(crate) fn render_summary_into(s: &Summary, out: &mut String) {
    let mut time = String::with_capacity(24);
    format_time(s.time, &mut time);
    let mut o = ObjectWriter::new(out);
    o.str("time", &time);
    o.str("rule", s.rule_id);
    o.str("rule_name", s.rule_name);
    o.str("reason", s.reason);
    o.str("action", s.action.as_str());
    o.str("mode", s.mode.as_str());
    o.opt_str("app", s.app_name.as_deref());
    o.str("db", &s.database);
    o.opt_str("collection", s.collection.as_deref());
    if let Some(shape) = &s.filter_shape {
        o.json("filter_shape", shape);
    }
    if let Some(h) = s.shape_hash {
        o.str("shape_hash", &format!("{h:016x}"));
    }
    o.str("source", s.source.as_str());
    o.num("suppressed", s.suppressed);
    // f64's Display never uses exponent notation, so this is always a valid JSON number.
    o.num("window_seconds", s.window.as_secs_f64());
    o.finish();
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    /// A fully populated record for tests.
    pub(crate) fn sample() -> ViolationRecord {
        ViolationRecord {
            time: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            rule_id: "W001",
            rule_name: "multi-update-without-filter",
            reason: "a multi-document update must have a filter",
            action: Action::Block,
            mode: Mode::Enforce,
            client_addr: Some(SocketAddr::from(([10, 0, 0, 7], 51234))),
            app_name: Some("billing".into()),
            driver: Some("nodejs 6.3.0".into()),
            user: Some("svc".into()),
            database: "shop".into(),
            collection: Some("orders".into()),
            command: "update".into(),
            statement_index: Some(2),
            filter_shape: Some(r#"{"age":{"$ne":"<int>"}}"#.into()),
            shape_hash: Some(0xab),
            request_id: 42,
            source: Source::Proxy,
            detail: None,
            matched: None,
        }
    }

    #[test]
    fn full_record_renders_every_field_in_order() {
        assert_eq!(
            render(&sample()),
            concat!(
                r#"{"time":"2023-11-14T22:13:20.123Z","rule":"W001","#,
                r#""rule_name":"multi-update-without-filter","#,
                r#""reason":"a multi-document update must have a filter","#,
                r#""action":"block","mode":"enforce","client":"10.0.0.7:51234","#,
                r#""app":"billing","driver":"nodejs 6.3.0","user":"svc","db":"shop","#,
                r#""collection":"orders","command":"update","statement":2,"#,
                r#""filter_shape":{"age":{"$ne":"<int>"}},"shape_hash":"00000000000000ab","#,
                r#""request_id":42,"source":"proxy"}"#
            )
        );
    }

    #[test]
    fn absent_optional_fields_are_omitted() {
        let rec = ViolationRecord {
            client_addr: None,
            app_name: None,
            driver: None,
            user: None,
            collection: None,
            statement_index: None,
            filter_shape: None,
            shape_hash: None,
            action: Action::Warn,
            mode: Mode::Audit,
            source: Source::Check,
            request_id: -5,
            ..sample()
        };
        let line = render(&rec);
        assert_eq!(
            line,
            concat!(
                r#"{"time":"2023-11-14T22:13:20.123Z","rule":"W001","#,
                r#""rule_name":"multi-update-without-filter","#,
                r#""reason":"a multi-document update must have a filter","#,
                r#""action":"warn","mode":"audit","db":"shop","command":"update","#,
                r#""request_id":-5,"source":"check"}"#
            )
        );
        for absent in ["client", "app", "driver", "user", "collection", "statement"] {
            assert!(!line.contains(&format!("\"{absent}\"")), "{absent}");
        }
    }

    #[test]
    fn client_controlled_strings_are_escaped() {
        let evil = "x\"}\n{\"rule\":\"FAKE\"\r\t\u{0}\u{1b}[31m\\\u{2028}";
        let rec = ViolationRecord {
            app_name: Some(evil.into()),
            driver: Some(evil.into()),
            user: Some(evil.into()),
            database: evil.into(),
            collection: Some(evil.into()),
            command: evil.into(),
            client_addr: Some("[::1]:27017".parse().unwrap()),
            ..sample()
        };
        let line = render(&rec);
        assert!(!line.contains('\n') && !line.contains('\r'));
        assert!(!line.chars().any(|c| c < ' '));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for key in ["app", "driver", "user", "db", "collection", "command"] {
            assert_eq!(v[key], evil, "{key}");
        }
        assert_eq!(v["rule"], "W001");
        assert_eq!(v["client"], "[::1]:27017");
        assert_eq!(v["filter_shape"]["age"]["$ne"], "<int>");
    }

    #[test]
    fn invalid_filter_shape_is_never_embedded_raw() {
        let rec = ViolationRecord {
            filter_shape: Some("{\"a\":1}\n{\"rule\":\"FAKE\"}".into()),
            ..sample()
        };
        let line = render(&rec);
        assert!(line.contains(r#""filter_shape":"<invalid>""#), "{line}");
        assert!(!line.contains("FAKE"));
        serde_json::from_str::<serde_json::Value>(&line).unwrap();
    }

    #[test]
    fn pretty_filter_shape_is_compacted_onto_one_line() {
        let rec = ViolationRecord {
            filter_shape: Some("{\n  \"a\": {\"$in\": [\"<string>\"]}\n}".into()),
            ..sample()
        };
        assert!(render(&rec).contains(r#""filter_shape":{"a":{"$in":["<string>"]}},"#));
    }

    #[test]
    fn summary_line_repeats_the_key_and_adds_counts() {
        let rec = sample();
        let s = Summary {
            time: rec.time,
            rule_id: rec.rule_id,
            rule_name: rec.rule_name,
            reason: rec.reason,
            action: rec.action,
            mode: rec.mode,
            app_name: Some("a\"pp".into()),
            database: rec.database,
            collection: None,
            filter_shape: rec.filter_shape,
            shape_hash: rec.shape_hash,
            source: rec.source,
            suppressed: 9,
            window: Duration::from_millis(2500),
        };
        let mut line = String::new();
        render_summary_into(&s, &mut line);
        assert_eq!(
            line,
            concat!(
                r#"{"time":"2023-11-14T22:13:20.123Z","rule":"W001","#,
                r#""rule_name":"multi-update-without-filter","#,
                r#""reason":"a multi-document update must have a filter","#,
                r#""action":"block","mode":"enforce","app":"a\"pp","db":"shop","#,
                r#""filter_shape":{"age":{"$ne":"<int>"}},"shape_hash":"00000000000000ab","#,
                r#""source":"proxy","suppressed":9,"window_seconds":2.5}"#
            )
        );
        let whole = Summary {
            window: Duration::from_secs(60),
            ..s
        };
        line.clear();
        render_summary_into(&whole, &mut line);
        assert!(line.ends_with(r#""window_seconds":60}"#), "{line}");
    }
}
