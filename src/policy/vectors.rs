//! Runs the data-driven rule vectors in `policies/tests/**/*.jsonl`.
//!
//! One JSON object per line (blank lines and lines starting with `//` are skipped), read
//! through the strict structs below: a misspelt or unknown key, a value of the wrong type, an
//! unknown rule id or verdict fails the run with `file:line`, and so do a file that cannot be
//! read, a file without a single vector and a directory without vector files. A vector the
//! runner cannot read never counts as a pass.
//!
//! ```text
//! {"name": "...", "db": "app", "command": {...Extended JSON v2...},
//!  "sequences": {"updates": [...]},      optional: OP_MSG kind-1 sequences
//!  "more_to_come": true,                 optional
//!  "legacy": {"op": "update", "ns": "db.c", "flags": 2, "selector": {}, "update": {}},
//!                                        instead of command (then no db, sequences,
//!                                        more_to_come): "insert" (ns, documents), "update"
//!                                        (ns, selector, update), "delete" (ns, selector),
//!                                        "query" (ns, query, optional projection: an
//!                                        OP_QUERY; ns ending .$cmd = command); flags
//!                                        optional everywhere
//!  "profile": "strict",                  optional, default "standard"
//!  "policy": "TOML text",                optional, instead of profile
//!  "context": {"app": "x", "user": "u", "client": "10.0.0.1", "wire_version": 7},   optional
//!  "expect": ["W001"],                   exactly the rules that must fire
//!  "verdict": "block",                   allow | warn | block
//!  "quiet": "W004",                     optional: a rule this vector shows staying quiet
//!                                        (must not be in expect)
//!  "measure": [0],                       exactly the statements whose filter is `unknown`
//!                                        and is measured (default: none)
//!  "measured": "all"}                    with measure: what the measurement finds for each
//!                                        of them: "all" (every document, 5 of them),
//!                                        "many" (more than max_docs, not all), "few" (3, not
//!                                        all), "empty" (an empty collection), "failed";
//!                                        expect and verdict then include its finding
//! ```

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use bson::{Bson, Document, RawDocumentBuf};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{
    measure::{finding, Outcome},
    Action, Policy, RequestContext, RULES,
};
use crate::{
    command::CommandView,
    wire::{
        builder::{
            encode_delete, encode_insert, encode_query, encode_update, MsgBuilder, Sequence,
        },
        Message, MsgFlags, DEFAULT_MAX_MESSAGE_SIZE,
    },
};

/// One vector line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    name: String,
    db: Option<String>,
    command: Option<Map<String, Value>>,
    /// Kind-1 sequences by identifier, in file order: each an array of documents.
    sequences: Option<Map<String, Value>>,
    #[serde(default)]
    more_to_come: bool,
    legacy: Option<Legacy>,
    profile: Option<String>,
    policy: Option<String>,
    context: Option<Context>,
    expect: Vec<String>,
    verdict: Verdict,
    quiet: Option<String>,
    #[serde(default)]
    measure: Vec<usize>,
    measured: Option<Measured>,
}

/// A simulated measurement result.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Measured {
    All,
    Many,
    Few,
    Empty,
    Failed,
}

impl Measured {
    fn outcome(self, max_docs: u64) -> Outcome {
        let counted = |matched, everything| Outcome::Counted {
            matched,
            everything,
        };
        match self {
            Measured::All => counted(5, true),
            Measured::Many => counted(max_docs + 1, false),
            Measured::Few => counted(3, false),
            Measured::Empty => counted(0, true),
            Measured::Failed => Outcome::Failed("simulated failure".into()),
        }
    }
}

/// A legacy opcode instead of an OP_MSG command.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Legacy {
    Insert {
        ns: String,
        #[serde(default)]
        flags: i32,
        documents: Vec<Value>,
    },
    Update {
        ns: String,
        #[serde(default)]
        flags: i32,
        selector: Value,
        update: Value,
    },
    Delete {
        ns: String,
        #[serde(default)]
        flags: i32,
        selector: Value,
    },
    Query {
        ns: String,
        #[serde(default)]
        flags: i32,
        query: Value,
        /// The returnFieldsSelector (projection), optional.
        projection: Option<Value>,
    },
}

/// What the proxy knows about the request besides the message.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Context {
    app: Option<String>,
    user: Option<String>,
    client: Option<String>,
    wire_version: Option<i32>,
    /// The plan guard's verdict for the shape: stage names joined by `+` (`COLLSCAN`,
    /// `IXSCAN+SORT`, ...); absent: not known yet.
    plan: Option<String>,
    /// createIndexes: the collection's index count now (I002); absent: unknown.
    index_count: Option<usize>,
    /// The collection's shard key fields (Q008); absent: not sharded.
    shard_key: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Allow,
    Warn,
    Block,
}

impl From<Action> for Verdict {
    fn from(a: Action) -> Verdict {
        match a {
            Action::Off => Verdict::Allow,
            Action::Warn => Verdict::Warn,
            Action::Block => Verdict::Block,
        }
    }
}

fn known_rule(code: &str) -> bool {
    RULES.iter().any(|r| r.code == code)
}

impl Vector {
    /// What serde cannot say: exclusive keys, keys that would be ignored, rule ids.
    fn check(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("empty name".into());
        }
        match (&self.command, &self.legacy) {
            (Some(_), Some(_)) => return Err("both command and legacy".into()),
            (None, None) => return Err("neither command nor legacy".into()),
            (None, Some(_)) => {
                if self.db.is_some() || self.sequences.is_some() || self.more_to_come {
                    return Err("db, sequences and more_to_come go with command, not legacy".into());
                }
            }
            (Some(_), None) => {}
        }
        if self.policy.is_some() && self.profile.is_some() {
            return Err("both policy and profile".into());
        }
        let mut seen = BTreeSet::new();
        for code in &self.expect {
            if !known_rule(code) {
                return Err(format!("expect: unknown rule id {code:?}"));
            }
            if !seen.insert(code.as_str()) {
                return Err(format!("expect: {code} listed twice"));
            }
        }
        if self.measured.is_some() && self.measure.is_empty() {
            return Err("measured without measure: nothing would be measured".into());
        }
        if let Some(quiet) = &self.quiet {
            if !known_rule(quiet) {
                return Err(format!("quiet: unknown rule id {quiet:?}"));
            }
            if seen.contains(quiet.as_str()) {
                return Err(format!("quiet: {quiet} is also expected to fire"));
            }
        }
        Ok(())
    }
}

/// Reads one vector line strictly.
fn parse_line(line: &str) -> Result<Vector, String> {
    let v: Vector = serde_json::from_str(line).map_err(|e| e.to_string())?;
    v.check()?;
    Ok(v)
}

fn doc(v: &Value) -> Result<RawDocumentBuf, String> {
    let bson = Bson::try_from(v.clone()).map_err(|e| format!("extended JSON: {e}"))?;
    let Bson::Document(d) = bson else {
        return Err("expected a document".into());
    };
    RawDocumentBuf::try_from(&d).map_err(|e| e.to_string())
}

fn docs(items: &[Value]) -> Result<Vec<RawDocumentBuf>, String> {
    items.iter().map(doc).collect()
}

fn encode(case: &Vector) -> Result<bytes::Bytes, String> {
    if let Some(legacy) = &case.legacy {
        return Ok(match legacy {
            Legacy::Insert {
                ns,
                flags,
                documents,
            } => {
                let d = docs(documents)?;
                let refs: Vec<&bson::RawDocument> = d.iter().map(|x| x.as_ref()).collect();
                encode_insert(1, *flags, ns, &refs)
            }
            Legacy::Update {
                ns,
                flags,
                selector,
                update,
            } => encode_update(1, ns, *flags, &doc(selector)?, &doc(update)?),
            Legacy::Delete {
                ns,
                flags,
                selector,
            } => encode_delete(1, ns, *flags, &doc(selector)?),
            Legacy::Query {
                ns,
                flags,
                query,
                projection,
            } => {
                let projection = projection.as_ref().map(doc).transpose()?;
                encode_query(1, *flags, ns, 0, -1, &doc(query)?, projection.as_deref())
            }
        });
    }
    let command = case.command.as_ref().ok_or("command")?;
    let mut body: Document =
        match Bson::try_from(Value::Object(command.clone())).map_err(|e| e.to_string())? {
            Bson::Document(d) => d,
            _ => return Err("command must be a document".into()),
        };
    if !body.contains_key("$db") {
        body.insert("$db", case.db.as_deref().unwrap_or("app"));
    }
    let mut builder = MsgBuilder::new(RawDocumentBuf::try_from(&body).map_err(|e| e.to_string())?);
    for (name, items) in case.sequences.iter().flatten() {
        let Value::Array(items) = items else {
            return Err(format!("sequences.{name} must be an array of documents"));
        };
        builder = builder.sequence(Sequence::new(name.clone(), docs(items)?));
    }
    if case.more_to_come {
        builder = builder.flags(MsgFlags::MORE_TO_COME);
    }
    Ok(builder.encode(1, 0))
}

fn policy_for(case: &Vector) -> Result<Policy, String> {
    if let Some(text) = &case.policy {
        return Policy::from_toml(text, "vector policy").map_err(|e| e.to_string());
    }
    let name = case.profile.as_deref().unwrap_or("standard");
    Policy::profile(name).ok_or_else(|| format!("no profile {name}"))
}

/// What a vector's request gets from a policy: the rules that fire (with the simulated
/// measurement's findings), the verdict, the statements measured.
struct Judged {
    fired: BTreeSet<String>,
    verdict: Verdict,
    measured: Vec<usize>,
}

/// Runs one vector; `Err` describes the mismatch.
fn run_case(case: &Vector) -> Result<(), String> {
    let Judged {
        fired,
        verdict,
        measured,
    } = judge(case, &policy_for(case)?)?;
    if measured != case.measure {
        return Err(format!(
            "measured statements {measured:?}, expected {:?}",
            case.measure
        ));
    }
    let want: BTreeSet<String> = case.expect.iter().cloned().collect();
    if fired != want || verdict != case.verdict {
        return Err(format!(
            "fired {fired:?} ({verdict:?}), expected {want:?} ({:?})",
            case.verdict
        ));
    }
    Ok(())
}

/// Judges a vector's request under `policy`.
fn judge(case: &Vector, policy: &Policy) -> Result<Judged, String> {
    let bytes = encode(case)?;
    let context = case.context.as_ref();
    let client_ip = match context.and_then(|c| c.client.as_deref()) {
        Some(s) => Some(s.parse().map_err(|_| format!("context.client {s:?}"))?),
        None => None,
    };
    let ctx = RequestContext {
        app: context.and_then(|c| c.app.as_deref()),
        user: context.and_then(|c| c.user.as_deref()),
        client_ip,
        upstream_wire_version: context.and_then(|c| c.wire_version),
        plan: context
            .and_then(|c| c.plan.as_deref())
            .map(|p| crate::policy::PlanFacts {
                collscan: p.split('+').any(|s| s.trim() == "COLLSCAN"),
                in_memory_sort: p.split('+').any(|s| s.trim() == "SORT"),
            }),
        index_count: context.and_then(|c| c.index_count),
        shard_key: context.and_then(|c| c.shard_key.as_deref()),
    };
    let msg = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).map_err(|e| format!("wire: {e}"))?;
    let (fired, verdict, measured) = match CommandView::from_message(&msg) {
        Ok(view) => {
            let d = policy.evaluate(&view, &ctx);
            let mut fired: BTreeSet<String> = d
                .violations
                .iter()
                .map(|v| v.rule.code().to_owned())
                .collect();
            let mut verdict = d.verdict();
            let measured: Vec<usize> = d.measure.iter().map(|m| m.statement).collect();
            if let (Some(sim), false) = (case.measured, d.is_block()) {
                let outcome = sim.outcome(d.measure_actions.max_docs);
                for m in &d.measure {
                    if let Some(f) = finding(&d.measure_actions, m.rule, &outcome) {
                        fired.insert(f.rule.code().to_owned());
                        verdict = verdict.max(f.action);
                    }
                }
            }
            (fired, Verdict::from(verdict), measured)
        }
        Err(_) => (
            ["G001".to_owned()].into_iter().collect(),
            Verdict::Block,
            Vec::new(),
        ),
    };
    Ok(Judged {
        fired,
        verdict,
        measured,
    })
}

/// Every `*.jsonl` file under `dir`, at any depth, sorted. A directory that cannot be listed
/// is an error.
fn vector_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| format!("{}: cannot list: {e}", d.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("{}: cannot list: {e}", d.display()))?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The vectors of one file with their line numbers; `Err` lists every unreadable line (as
/// `file:line: why`), or says why the file as a whole is unusable.
fn read_file(path: &Path) -> Result<Vec<(usize, Vector)>, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("{}: cannot read: {e}", path.display())])?;
    let mut vectors = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        match parse_line(line) {
            Ok(v) => vectors.push((i + 1, v)),
            Err(e) => errors.push(format!(
                "{}:{}: unreadable vector: {e}",
                path.display(),
                i + 1
            )),
        }
    }
    if vectors.is_empty() && errors.is_empty() {
        errors.push(format!("{}: no vectors in the file", path.display()));
    }
    if errors.is_empty() {
        Ok(vectors)
    } else {
        Err(errors)
    }
}

/// Every vector under `dir`, as (`file:line`, vector); `Err` lists everything unreadable.
fn load_all(dir: &Path) -> Result<Vec<(String, Vector)>, Vec<String>> {
    let files = vector_files(dir).map_err(|e| vec![e])?;
    if files.is_empty() {
        return Err(vec![format!("{}: no .jsonl vector files", dir.display())]);
    }
    let mut all = Vec::new();
    let mut errors = Vec::new();
    for file in files {
        match read_file(&file) {
            Ok(vectors) => all.extend(
                vectors
                    .into_iter()
                    .map(|(line, v)| (format!("{}:{line}", file.display()), v)),
            ),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok(all)
    } else {
        Err(errors)
    }
}

/// Reads every vector under `dir` and runs it: (vectors run, failures). Anything unreadable
/// is a failure.
pub(crate) fn run_all(dir: &Path) -> (usize, Vec<String>) {
    check_all(dir, "", run_case)
}

/// Runs every vector under `dir` a second time with its policy in audit mode (every
/// override's mode too) and checks that audit mode records what enforcement finds: the same
/// rules fire, the same statements are measured, and nothing blocks but an unreadable command
/// (G001; a failed measurement is a warning too, see `evaluate::on_error`). Where enforcement
/// blocks before the measurement, audit mode forwards and so also records what the
/// measurement finds. `(vectors run, failures)`.
pub(crate) fn run_all_in_audit_mode(dir: &Path) -> (usize, Vec<String>) {
    check_all(dir, " in audit mode", audit_parity)
}

/// `check` on every vector under `dir`: (vectors read, failures as `file:line [name]{how}:
/// why`). Anything unreadable is a failure.
fn check_all(
    dir: &Path,
    how: &str,
    check: impl Fn(&Vector) -> Result<(), String>,
) -> (usize, Vec<String>) {
    let vectors = match load_all(dir) {
        Ok(v) => v,
        Err(errors) => return (0, errors),
    };
    let failures = vectors
        .iter()
        .filter_map(|(at, v)| {
            check(v)
                .err()
                .map(|e| format!("{at} [{}]{how}: {e}", v.name))
        })
        .collect();
    (vectors.len(), failures)
}

fn audit_parity(case: &Vector) -> Result<(), String> {
    let policy = policy_for(case)?;
    let mut audit = policy.clone();
    audit.mode = super::Mode::Audit;
    for o in &mut audit.overrides {
        o.mode = None;
    }
    let enforced = judge(case, &policy)?;
    let audited = judge(case, &audit)?;
    if audited.measured != enforced.measured {
        return Err(format!(
            "measured statements {:?}, enforcement measures {:?}",
            audited.measured, enforced.measured
        ));
    }
    let measured_after_a_block = enforced.verdict == Verdict::Block && case.measured.is_some();
    let same = if measured_after_a_block {
        enforced.fired.is_subset(&audited.fired)
    } else {
        enforced.fired == audited.fired
    };
    if !same {
        return Err(format!(
            "fired {:?}, enforcement fires {:?}",
            audited.fired, enforced.fired
        ));
    }
    let expected = match enforced.verdict {
        Verdict::Block if audited.fired.contains("G001") => Verdict::Block,
        Verdict::Block => Verdict::Warn,
        v => v,
    };
    if audited.verdict != expected {
        return Err(format!(
            "verdict {:?}, expected {expected:?} (enforcement: {:?})",
            audited.verdict, enforced.verdict
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
