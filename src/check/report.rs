//! The report: human text or JSON.

use std::{collections::BTreeMap, fmt::Write as _};

use serde_json::{json, Value};

use super::{Group, UnknownGroup};
use crate::policy::Action;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text for people.
    Text,
    /// One JSON document for machines.
    Json,
}

/// Everything `mongoguard check` found.
#[derive(Debug, Clone)]
pub struct Report {
    /// (rule, namespace) groups.
    pub groups: Vec<Group>,
    /// Multi-document writes whose filter is `unknown`: the proxy measures them against the
    /// data; `check` cannot, so they are neither violations nor passes.
    pub unknown: Vec<UnknownGroup>,
    /// Violations of commands mongod ran on its own behalf (internal threads): reported,
    /// never blocking.
    pub internal: Vec<Group>,
    /// Lines read.
    pub lines: u64,
    /// Client commands evaluated.
    pub evaluated: u64,
    /// Internal commands evaluated.
    pub internal_commands: u64,
    /// Lines without a command.
    pub ignored: u64,
    /// Replication lines, ignored.
    pub replication: u64,
    /// Time-series bucket writes, not judged on their own.
    pub bucket_writes: u64,
    /// Per-statement lines folded into their command.
    pub statements_merged: u64,
    /// Lines read as something; 0 means the input was not readable at all.
    pub readable: u64,
    /// Unparseable lines by reason.
    pub unreadable: BTreeMap<&'static str, u64>,
    /// The first unreadable lines: `file:line` and why.
    pub unreadable_at: Vec<(String, &'static str)>,
}

impl Report {
    /// True when a rule whose action is `block` fired: the process exits non-zero.
    pub fn has_blocking(&self) -> bool {
        self.groups.iter().any(|g| g.action == Action::Block)
    }

    /// The exit status: 2 when no line could be read (a wrong file, a pre-4.4 text log: a
    /// gate must not pass what it could not read), 1 when a blocking rule fired, else 0.
    pub fn exit_code(&self) -> u8 {
        if self.readable == 0 {
            2
        } else if self.has_blocking() {
            1
        } else {
            0
        }
    }

    /// Renders the report.
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Text => self.text(),
            Format::Json => self.json().to_string(),
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "mongoguard check: {} lines, {} commands evaluated, {} without a command, {} unreadable",
            self.lines,
            self.evaluated,
            self.ignored,
            self.unreadable.values().sum::<u64>()
        );
        if self.statements_merged > 0 {
            let _ = writeln!(
                out,
                "  {} per-statement line(s) counted with their command's line",
                self.statements_merged
            );
        }
        if self.replication > 0 {
            let _ = writeln!(
                out,
                "  {} replication line(s) ignored (a secondary applying the oplog)",
                self.replication
            );
        }
        if self.bucket_writes > 0 {
            let _ = writeln!(
                out,
                "  {} time-series bucket write(s) (system.buckets.*) judged through the client's command on the collection",
                self.bucket_writes
            );
        }
        for (reason, n) in &self.unreadable {
            let _ = writeln!(out, "  unreadable: {n} x {reason}");
        }
        for (at, reason) in &self.unreadable_at {
            let _ = writeln!(out, "    {at}: {reason}");
        }
        let listed = self.unreadable_at.len() as u64;
        let total = self.unreadable.values().sum::<u64>();
        if total > listed {
            let _ = writeln!(out, "    ... and {} more", total - listed);
        }
        if self.readable == 0 {
            let _ = writeln!(
                out,
                "\nno line could be read: this is not a mongod 4.4+ JSON log, a profiler export \
                 or a JSON-lines command file (exit status 2)"
            );
            return out;
        }
        if self.groups.is_empty() {
            let _ = writeln!(out, "\nno violations");
        } else {
            let _ = writeln!(out);
            self.text_groups(&mut out);
            let blocking = self.count_where(Action::Block);
            let warning = self.count_where(Action::Warn);
            let _ = writeln!(out, "\n{blocking} blocking, {warning} warning violation(s)");
        }
        self.text_unknown(&mut out);
        self.text_internal(&mut out);
        out
    }

    /// Commands mongod ran on its own behalf, apart and never blocking.
    fn text_internal(&self, out: &mut String) {
        if self.internal_commands == 0 {
            return;
        }
        let _ = writeln!(
            out,
            "\ninternal: {} command(s) mongod ran on its own behalf (threads other than a client \
             connection, e.g. LogicalSessionCacheRefresh); reported, never blocking",
            self.internal_commands
        );
        for g in &self.internal {
            let _ = writeln!(
                out,
                "    {} {} [{} if a client sent it] {:<30} {:>6} x {}",
                g.rule,
                g.name,
                g.action.as_str(),
                g.namespace,
                g.count,
                g.command
            );
        }
    }

    /// The multi-document writes the proxy would measure, after the violations.
    fn text_unknown(&self, out: &mut String) {
        if self.unknown.is_empty() {
            return;
        }
        let total: u64 = self.unknown.iter().map(|u| u.count).sum();
        let _ = writeln!(
            out,
            "\nunknown: {total} multi-document write(s) not proved selective; the proxy measures \
             them against the data before forwarding (W001/W003 if they match every document, \
             W012 past max_docs); check reads no data and decides nothing about them"
        );
        for u in &self.unknown {
            let _ = writeln!(
                out,
                "    {:<40} {:>6} x {} ({})  e.g. {}",
                u.namespace, u.count, u.command, u.rule, u.example_shape
            );
        }
    }

    /// One heading per rule with its total, then one line per namespace and command.
    fn text_groups(&self, out: &mut String) {
        let mut current = "";
        for g in &self.groups {
            if g.rule != current {
                current = g.rule;
                let total: u64 = self
                    .groups
                    .iter()
                    .filter(|x| x.rule == g.rule)
                    .map(|x| x.count)
                    .sum();
                let _ = writeln!(
                    out,
                    "{} {} [{}]: {} occurrence(s)",
                    g.rule,
                    g.name,
                    g.action.as_str(),
                    total
                );
            }
            let _ = write!(
                out,
                "    {:<40} {:>6} x {}",
                g.namespace, g.count, g.command
            );
            if let Some(shape) = &g.example_shape {
                let _ = write!(out, "  e.g. {shape}");
            }
            let _ = writeln!(out);
        }
    }

    /// Violations whose action is `action`.
    fn count_where(&self, action: Action) -> u64 {
        self.groups
            .iter()
            .filter(|g| g.action == action)
            .map(|g| g.count)
            .sum()
    }

    fn json(&self) -> Value {
        let groups: Vec<Value> = self
            .groups
            .iter()
            .map(|g| {
                let shape = g
                    .example_shape
                    .as_deref()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .unwrap_or(Value::Null);
                json!({
                    "rule": g.rule, "name": g.name, "action": g.action.as_str(),
                    "namespace": g.namespace, "count": g.count, "command": g.command,
                    "example_shape": shape,
                })
            })
            .collect();
        let unknown: Vec<Value> = self
            .unknown
            .iter()
            .map(|u| {
                let shape = serde_json::from_str::<Value>(&u.example_shape).unwrap_or(Value::Null);
                json!({
                    "rule": u.rule, "namespace": u.namespace, "count": u.count,
                    "command": u.command, "example_shape": shape,
                })
            })
            .collect();
        let internal: Vec<Value> = self
            .internal
            .iter()
            .map(|g| {
                json!({
                    "rule": g.rule, "name": g.name, "action": g.action.as_str(),
                    "namespace": g.namespace, "count": g.count, "command": g.command,
                })
            })
            .collect();
        let unreadable_at: Vec<Value> = self
            .unreadable_at
            .iter()
            .map(|(at, reason)| json!({"at": at, "reason": reason}))
            .collect();
        json!({
            "lines": self.lines,
            "evaluated": self.evaluated,
            "ignored": self.ignored,
            "readable": self.readable,
            "replication": self.replication,
            "bucket_writes": self.bucket_writes,
            "statements_merged": self.statements_merged,
            "internal_commands": self.internal_commands,
            "unreadable": self.unreadable,
            "unreadable_at": unreadable_at,
            "blocking": self.has_blocking(),
            "exit_code": self.exit_code(),
            "groups": groups,
            "unknown": unknown,
            "internal": internal,
        })
    }
}
