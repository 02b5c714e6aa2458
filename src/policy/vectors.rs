//! Runs the data-driven rule vectors in `policies/tests/*.jsonl`.
//!
//! One JSON object per line (blank lines and lines starting with `//` are skipped):
//!
//! ```text
//! {"name": "...", "db": "app", "command": {...Extended JSON v2...},
//!  "sequences": {"updates": [...]},      optional: OP_MSG kind-1 sequences
//!  "more_to_come": true,                 optional
//!  "legacy": {"op": "update", "ns": "db.c", "flags": 2, "selector": {}, "update": {}},
//!                                        optional, instead of command: "insert" (documents),
//!                                        "update", "delete" (selector, flags), "query"
//!                                        (ns, query: an OP_QUERY; ns ending .$cmd = command)
//!  "profile": "strict",                  optional, default "standard"
//!  "policy": "TOML text",                optional, instead of profile
//!  "context": {"app": "x", "client": "10.0.0.1", "wire_version": 7},   optional
//!  "expect": ["W001"],                   exactly the rules that must fire
//!  "verdict": "block"}                   allow | warn | block
//! ```

use std::{collections::BTreeSet, path::Path};

use bson::{Bson, Document, RawDocumentBuf};
use serde_json::Value;

use super::{Action, Policy, RequestContext};
use crate::{
    command::CommandView,
    wire::{
        builder::{
            encode_delete, encode_insert, encode_query, encode_update, MsgBuilder, Sequence,
        },
        Message, MsgFlags, DEFAULT_MAX_MESSAGE_SIZE,
    },
};

fn doc(v: &Value) -> Result<RawDocumentBuf, String> {
    let bson = Bson::try_from(v.clone()).map_err(|e| format!("extended JSON: {e}"))?;
    let Bson::Document(d) = bson else {
        return Err("expected a document".into());
    };
    RawDocumentBuf::try_from(&d).map_err(|e| e.to_string())
}

fn docs(v: Option<&Value>) -> Result<Vec<RawDocumentBuf>, String> {
    match v {
        Some(Value::Array(items)) => items.iter().map(doc).collect(),
        None => Ok(Vec::new()),
        Some(_) => Err("expected an array of documents".into()),
    }
}

fn str_field<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

fn encode(case: &Value) -> Result<bytes::Bytes, String> {
    if let Some(legacy) = case.get("legacy") {
        let ns = str_field(legacy, "ns").ok_or("legacy.ns")?;
        let flags = legacy.get("flags").and_then(Value::as_i64).unwrap_or(0) as i32;
        let empty = RawDocumentBuf::new();
        let get = |k: &str| {
            legacy
                .get(k)
                .map(doc)
                .transpose()
                .map(|d| d.unwrap_or_else(|| empty.clone()))
        };
        return Ok(match str_field(legacy, "op").ok_or("legacy.op")? {
            "insert" => {
                let d = docs(legacy.get("documents"))?;
                let refs: Vec<&bson::RawDocument> = d.iter().map(|x| x.as_ref()).collect();
                encode_insert(1, flags, ns, &refs)
            }
            "update" => encode_update(1, ns, flags, &get("selector")?, &get("update")?),
            "delete" => encode_delete(1, ns, flags, &get("selector")?),
            "query" => encode_query(1, flags, ns, 0, -1, &get("query")?, None),
            other => return Err(format!("unknown legacy op {other}")),
        });
    }
    let command = case.get("command").ok_or("command")?;
    let mut body: Document = match Bson::try_from(command.clone()).map_err(|e| e.to_string())? {
        Bson::Document(d) => d,
        _ => return Err("command must be a document".into()),
    };
    if !body.contains_key("$db") {
        body.insert("$db", str_field(case, "db").unwrap_or("app"));
    }
    let mut builder = MsgBuilder::new(RawDocumentBuf::try_from(&body).map_err(|e| e.to_string())?);
    if let Some(Value::Object(seqs)) = case.get("sequences") {
        for (name, items) in seqs {
            builder = builder.sequence(Sequence::new(name.clone(), docs(Some(items))?));
        }
    }
    if case.get("more_to_come").and_then(Value::as_bool) == Some(true) {
        builder = builder.flags(MsgFlags::MORE_TO_COME);
    }
    Ok(builder.encode(1, 0))
}

fn policy_for(case: &Value) -> Result<Policy, String> {
    if let Some(text) = str_field(case, "policy") {
        return Policy::from_toml(text, "vector policy").map_err(|e| e.to_string());
    }
    let name = str_field(case, "profile").unwrap_or("standard");
    Policy::profile(name).ok_or_else(|| format!("no profile {name}"))
}

/// Runs one vector; `Err` describes the mismatch.
fn run_case(case: &Value) -> Result<(), String> {
    let bytes = encode(case)?;
    let policy = policy_for(case)?;
    let ctx_v = case.get("context");
    let client = ctx_v
        .and_then(|c| str_field(c, "client"))
        .map(|s| s.parse().map_err(|_| "context.client"));
    let ctx = RequestContext {
        app: ctx_v.and_then(|c| str_field(c, "app")),
        user: ctx_v.and_then(|c| str_field(c, "user")),
        client_ip: client.transpose()?,
        upstream_wire_version: ctx_v
            .and_then(|c| c.get("wire_version"))
            .and_then(Value::as_i64)
            .map(|v| v as i32),
    };
    let msg = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).map_err(|e| format!("wire: {e}"))?;
    let (fired, verdict) = match CommandView::from_message(&msg) {
        Ok(view) => {
            let d = policy.evaluate(&view, &ctx);
            let fired: BTreeSet<String> = d
                .violations
                .iter()
                .map(|v| v.rule.code().to_owned())
                .collect();
            (fired, d.verdict())
        }
        Err(_) => (["G001".to_owned()].into_iter().collect(), Action::Block),
    };
    let want: BTreeSet<String> = match case.get("expect") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => return Err("expect must be an array of rule ids".into()),
    };
    let want_verdict = str_field(case, "verdict").ok_or("verdict")?;
    let got_verdict = match verdict {
        Action::Off => "allow",
        Action::Warn => "warn",
        Action::Block => "block",
    };
    if fired != want || got_verdict != want_verdict {
        return Err(format!(
            "fired {fired:?} ({got_verdict}), expected {want:?} ({want_verdict})"
        ));
    }
    Ok(())
}

/// Every vector file's cases: (file, line, name, result).
pub(crate) fn run_all(dir: &Path) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut count = 0;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with("//") {
                continue;
            }
            count += 1;
            let at = format!("{}:{}", file.display(), i + 1);
            let case: Value = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(e) => {
                    failures.push(format!("{at}: not JSON: {e}"));
                    continue;
                }
            };
            let name = str_field(&case, "name").unwrap_or("?").to_owned();
            if let Err(e) = run_case(&case) {
                failures.push(format!("{at} [{name}]: {e}"));
            }
        }
    }
    (count, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_vectors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/tests");
        let (count, failures) = run_all(&dir);
        assert!(
            count >= 50,
            "only {count} vectors found in {}",
            dir.display()
        );
        assert!(
            failures.is_empty(),
            "{} of {count} vectors failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn every_implemented_rule_has_vectors_that_fire_and_stay_quiet() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/tests");
        let mut text = String::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "jsonl") {
                text.push_str(&std::fs::read_to_string(e.path()).unwrap());
            }
        }
        for rule in super::super::RULES.iter().filter(|r| r.implemented) {
            let quoted = format!("\"{}\"", rule.code);
            let firing = text
                .lines()
                .filter(|l| {
                    l.contains("\"expect\"")
                        && l.split("\"expect\"")
                            .nth(1)
                            .is_some_and(|e| e.contains(&quoted))
                })
                .count();
            let quiet = text
                .lines()
                .filter(|l| l.contains(&format!("\"quiet\": {quoted}")))
                .count();
            assert!(firing > 0, "no vector shows {} firing", rule.code);
            assert!(
                quiet > 0,
                "no vector shows {} staying quiet (mark one with \"quiet\": {quoted})",
                rule.code
            );
        }
    }
}
