//! `mongoguard check`: the standards without the proxy.
//!
//! Evaluates commands captured elsewhere against a policy, exactly as the proxy would:
//! mongod's structured JSON log lines (4.4+; slow-query entries carry the command), profiler
//! documents exported from `system.profile` (JSON lines), or a JSON-lines file of commands.
//! The report groups violations by rule and namespace with one example *shape* each (never a
//! literal value).

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

/// Accumulates evaluations.
#[derive(Debug, Default)]
pub struct Checker {
    groups: BTreeMap<(&'static str, String, Action), Group>,
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
        for v in &decision.violations {
            let ns = view.namespace();
            let namespace = match ns.coll {
                Some(c) => format!("{}.{}", ns.db, c),
                None => ns.db.to_owned(),
            };
            let info = v.rule.info();
            let group = self
                .groups
                .entry((info.code, namespace.clone(), v.action))
                .or_insert_with(|| Group {
                    rule: info.code,
                    name: info.name,
                    action: v.action,
                    namespace,
                    count: 0,
                    command: view.display_name().to_owned(),
                    example_shape: v.filter.map(filter::shape),
                });
            group.count += 1;
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
        Report {
            groups,
            lines: self.lines,
            evaluated: self.evaluated,
            ignored: self.ignored,
            unreadable: self.unreadable.clone(),
        }
    }
}
