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

use bson::RawDocumentBuf;

pub use input::{parse_line, Captured, LineError};
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

/// Accumulates evaluations.
#[derive(Debug, Default)]
pub struct Checker {
    groups: BTreeMap<(&'static str, String, Action), Group>,
    unknown: BTreeMap<(&'static str, String), UnknownGroup>,
    /// Lines read.
    pub lines: u64,
    /// Commands evaluated.
    pub evaluated: u64,
    /// Lines that carry no command (other log messages, getMore entries...).
    pub ignored: u64,
    /// Lines that could not be parsed, by reason.
    pub unreadable: BTreeMap<&'static str, u64>,
}

impl Checker {
    /// Feeds one input line.
    pub fn line(&mut self, policy: &Policy, line: &str, default_db: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        self.lines += 1;
        match parse_line(line, default_db) {
            Ok(Some(captured)) => self.evaluate(policy, &captured),
            Ok(None) => self.ignored += 1,
            Err(e) => *self.unreadable.entry(e.reason()).or_default() += 1,
        }
    }

    /// Evaluates one captured command.
    pub fn evaluate(&mut self, policy: &Policy, captured: &Captured) {
        self.evaluated += 1;
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
        let ns = view.namespace();
        let namespace = match ns.coll {
            Some(c) => format!("{}.{}", ns.db, c),
            None => ns.db.to_owned(),
        };
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
        Report {
            groups,
            unknown,
            lines: self.lines,
            evaluated: self.evaluated,
            ignored: self.ignored,
            unreadable: self.unreadable.clone(),
        }
    }
}
