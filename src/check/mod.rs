//! `mongoguard check`: the standards without the proxy.
//!
//! Evaluates commands captured elsewhere against a policy, exactly as the proxy would:
//! mongod's structured JSON log lines (4.4+; slow-query entries carry the command), profiler
//! documents exported from `system.profile` (JSON lines), or a JSON-lines file of commands.
//! The report groups violations by rule and namespace with one example *shape* each (never a
//! literal value).
//!
//! What the proxy measures against the data before deciding (multi-document writes whose
//! filter is neither proved to match every document nor proved selective: verdict `unknown`)
//! cannot be decided offline: `check` reads no data. Those statements are listed in a section
//! of their own, never counted as violations nor as passing.

mod input;
mod report;

use std::collections::BTreeMap;

use bson::{RawBsonRef, RawDocumentBuf};

pub use input::{parse, parse_line, Captured, Line, LineError};
pub use report::{Format, Report};

use crate::{
    command::CommandView,
    policy::{filter, Action, Policy, RequestContext},
};

/// One (rule, namespace) group of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Rule id.
    pub rule: &'static str,
    /// Rule name.
    pub name: &'static str,
    /// Action taken by the policy (after mode).
    pub action: Action,
    /// `db.collection` (or `db`).
    pub namespace: String,
    /// Occurrences.
    pub count: u64,
    /// Command name of the example.
    pub command: String,
    /// Literal-free shape of an example filter, when the rule concerns a filter.
    pub example_shape: Option<String>,
}

/// One (namespace, rule) group of multi-document writes the proxy would measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGroup {
    /// The rule a measurement decides (W001 for an update, W003 for a delete).
    pub rule: &'static str,
    /// `db.collection`.
    pub namespace: String,
    /// Statements.
    pub count: u64,
    /// Command name of the example.
    pub command: String,
    /// Literal-free shape of an example filter.
    pub example_shape: String,
}

/// How many unreadable lines are listed by position (the rest are counted).
pub const UNREADABLE_LISTED: usize = 20;

/// Per-statement lines of one connection held while waiting for their command's line.
const PENDING_MAX: usize = 1000;

/// Accumulates evaluations.
#[derive(Debug, Default)]
pub struct Checker {
    groups: BTreeMap<(&'static str, String, Action), Group>,
    internal: BTreeMap<(&'static str, String, Action), Group>,
    unknown: BTreeMap<(&'static str, String), UnknownGroup>,
    /// Per-statement lines of a connection waiting for their command's line.
    pending: BTreeMap<String, Vec<Captured>>,
    /// Lines read.
    pub lines: u64,
    /// Client commands evaluated.
    pub evaluated: u64,
    /// Commands mongod ran on its own behalf (evaluated into their own section).
    pub internal_commands: u64,
    /// Lines that carry no command (other log messages, getMore entries...).
    pub ignored: u64,
    /// Replication lines (a secondary applying the oplog).
    pub replication: u64,
    /// Time-series bucket writes (judged through the client's command on the collection).
    pub bucket_writes: u64,
    /// Per-statement lines folded into their command's line (each command counted once).
    pub statements_merged: u64,
    /// Lines that could not be parsed, by reason.
    pub unreadable: BTreeMap<&'static str, u64>,
    /// Where the first unreadable lines are: `file:line` and the reason.
    pub unreadable_at: Vec<(String, &'static str)>,
}

impl Checker {
    /// Feeds one input line (no position: see [`Checker::line_at`]).
    pub fn line(&mut self, policy: &Policy, line: &str, default_db: &str) {
        let n = self.lines + 1;
        self.line_at(policy, line, default_db, "-", n);
    }

    /// Feeds line `number` of `source`.
    pub fn line_at(
        &mut self,
        policy: &Policy,
        line: &str,
        default_db: &str,
        source: &str,
        number: u64,
    ) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        self.lines += 1;
        match parse(line, default_db) {
            Ok(Line::Command(captured)) => self.command(policy, captured),
            Ok(Line::NoCommand) => self.ignored += 1,
            Ok(Line::Replication) => self.replication += 1,
            Ok(Line::BucketWrite) => self.bucket_writes += 1,
            Err(e) => {
                *self.unreadable.entry(e.reason()).or_default() += 1;
                if self.unreadable_at.len() < UNREADABLE_LISTED {
                    self.unreadable_at
                        .push((format!("{source}:{number}"), e.reason()));
                }
            }
        }
    }

    /// Lines that were read as something (a command, a line without one, replication...):
    /// zero means the input was not a log mongoguard reads, and `check` must not pass it.
    pub fn readable(&self) -> u64 {
        self.lines - self.unreadable.values().sum::<u64>()
    }

    /// One command of a log, a profiler export or a command file. A per-statement log line
    /// waits for its command's line on the same connection: mongod logs each slow update /
    /// remove statement, then the command (`update` / `delete`) that carried it, and the two
    /// are one command. A command line that carries its statements makes the waiting lines
    /// duplicates; one without (drivers send statements in an OP_MSG document sequence, which
    /// the log leaves out) gets them back.
    fn command(&mut self, policy: &Policy, captured: Captured) {
        let Some(thread) = captured.thread.clone() else {
            return self.evaluate(policy, &captured);
        };
        if captured.statement_of.is_some() {
            let waiting = self.pending.entry(thread).or_default();
            waiting.push(captured);
            // A connection whose command lines never come (sampled out) must not hold the
            // whole log: past the cap the oldest statement is judged on its own.
            if waiting.len() > PENDING_MAX {
                let oldest = waiting.remove(0);
                self.evaluate(policy, &oldest);
            }
            return;
        }
        let waiting = self.pending.remove(&thread).unwrap_or_default();
        let name = crate::wire::first_key(&captured.command);
        let target = captured.command.get_str(name.unwrap_or("")).ok();
        let (mine, others): (Vec<Captured>, Vec<Captured>) =
            waiting.into_iter().partition(|w| match &w.statement_of {
                Some((kind, coll)) => Some(*kind) == name && Some(coll.as_str()) == target,
                None => false,
            });
        for other in &others {
            self.evaluate(policy, other);
        }
        if mine.is_empty() {
            return self.evaluate(policy, &captured);
        }
        let field = if name == Some("update") {
            "updates"
        } else {
            "deletes"
        };
        self.statements_merged += mine.len() as u64;
        if captured.command.get(field).ok().flatten().is_some() {
            return self.evaluate(policy, &captured);
        }
        let mut statements = bson::RawArrayBuf::new();
        for w in &mine {
            if let Ok(Some(RawBsonRef::Array(a))) = w.command.get(field) {
                for s in a.into_iter().flatten() {
                    statements.push(s);
                }
            }
        }
        let mut merged = captured.command.clone();
        if field == "updates" {
            merged.append(bson::cstr!("updates"), statements);
        } else {
            merged.append(bson::cstr!("deletes"), statements);
        }
        let merged = Captured {
            command: merged,
            ..captured
        };
        self.evaluate(policy, &merged);
    }

    /// Evaluates the statement lines still waiting for a command line (the command was not
    /// logged, e.g. under sampling): each on its own. Call once the input is read.
    pub fn finish(&mut self, policy: &Policy) {
        let pending = std::mem::take(&mut self.pending);
        for c in pending.into_values().flatten() {
            self.evaluate(policy, &c);
        }
    }

    /// Evaluates one captured command.
    pub fn evaluate(&mut self, policy: &Policy, captured: &Captured) {
        let internal = captured.internal();
        if internal {
            self.internal_commands += 1;
        } else {
            self.evaluated += 1;
        }
        let body: &RawDocumentBuf = &captured.command;
        let ctx = RequestContext {
            app: captured.app.as_deref(),
            ..RequestContext::default()
        };
        let view = match CommandView::command(&captured.db, body) {
            Ok(v) => v,
            Err(_) => {
                *self.unreadable.entry("empty command").or_default() += 1;
                return;
            }
        };
        let decision = policy.evaluate(&view, &ctx);
        if internal {
            // mongod's own work (session-cache refresh writing config.system.sessions, ...):
            // reported apart, never blocking, never measured.
            for v in &decision.violations {
                let info = v.rule.info();
                self.internal
                    .entry((info.code, view_namespace(&view), v.action))
                    .or_insert_with(|| Group {
                        rule: info.code,
                        name: info.name,
                        action: v.action,
                        namespace: view_namespace(&view),
                        count: 0,
                        command: view.display_name().to_owned(),
                        example_shape: v.filter.map(filter::shape),
                    })
                    .count += 1;
            }
            return;
        }
        for m in &decision.measure {
            let namespace = match m.ns.coll {
                Some(c) => format!("{}.{}", m.ns.db, c),
                None => m.ns.db.to_owned(),
            };
            let code = m.rule.info().code;
            self.unknown
                .entry((code, namespace.clone()))
                .or_insert_with(|| UnknownGroup {
                    rule: code,
                    namespace,
                    count: 0,
                    command: view.display_name().to_owned(),
                    example_shape: filter::shape(m.filter),
                })
                .count += 1;
        }
        let namespace = view_namespace(&view);
        for v in &decision.violations {
            let info = v.rule.info();
            let group = self
                .groups
                .entry((info.code, namespace.clone(), v.action))
                .or_insert_with(|| Group {
                    rule: info.code,
                    name: info.name,
                    action: v.action,
                    namespace: namespace.clone(),
                    count: 0,
                    command: view.display_name().to_owned(),
                    example_shape: v.filter.map(filter::shape),
                });
            group.count += 1;
        }
        for u in &decision.unlisted {
            // Past the listed ones, statements are counted, not listed: their groups exist
            // (at least MAX_LISTED_PER_RULE of the same rule and action are listed).
            let info = u.rule.info();
            if let Some(g) = self
                .groups
                .get_mut(&(info.code, namespace.clone(), u.action))
            {
                g.count = g.count.saturating_add(u.count);
            }
        }
    }

    /// The groups, most frequent first within each rule.
    pub fn report(&self) -> Report {
        let mut groups: Vec<Group> = self.groups.values().cloned().collect();
        groups.sort_by(|a, b| {
            a.rule
                .cmp(b.rule)
                .then(b.count.cmp(&a.count))
                .then(a.namespace.cmp(&b.namespace))
        });
        let mut unknown: Vec<UnknownGroup> = self.unknown.values().cloned().collect();
        unknown.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.namespace.cmp(&b.namespace))
                .then(a.rule.cmp(b.rule))
        });
        let mut internal: Vec<Group> = self.internal.values().cloned().collect();
        internal.sort_by(|a, b| a.rule.cmp(b.rule).then(b.count.cmp(&a.count)));
        Report {
            groups,
            unknown,
            internal,
            lines: self.lines,
            evaluated: self.evaluated,
            internal_commands: self.internal_commands,
            ignored: self.ignored,
            replication: self.replication,
            bucket_writes: self.bucket_writes,
            statements_merged: self.statements_merged,
            readable: self.readable(),
            unreadable: self.unreadable.clone(),
            unreadable_at: self.unreadable_at.clone(),
        }
    }
}

fn view_namespace(view: &CommandView<'_>) -> String {
    let ns = view.namespace();
    match ns.coll {
        Some(c) => format!("{}.{}", ns.db, c),
        None => ns.db.to_owned(),
    }
}
