//! In-memory violation counters, for metrics and tests.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, PoisonError,
    },
};

use super::record::{Action, Mode};

/// One per-rule counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleCount {
    /// Rule id, e.g. `"W001"`.
    pub rule_id: &'static str,
    /// What was done.
    pub action: Action,
    /// The mode in force.
    pub mode: Mode,
    /// Violations seen (before dedup: suppressed ones count too).
    pub count: u64,
}

/// Counts of everything the audit log saw. Every violation is counted, whether it was
/// written, suppressed by dedup or dropped on a full queue.
///
/// The per-rule map is keyed by `&'static str` rule ids (a small fixed set), so counting a
/// key already seen allocates nothing; the lock is held for one map lookup.
#[derive(Debug, Default)]
pub struct AuditCounters {
    by_rule: Mutex<HashMap<(&'static str, Action, Mode), u64>>,
    suppressed: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
    write_errors: AtomicU64,
    /// Lines of the batches the sink failed to write.
    lines_not_written: AtomicU64,
}

impl AuditCounters {
    /// Violations of `rule_id` handled with `action` under `mode`.
    pub fn rule_count(&self, rule_id: &str, action: Action, mode: Mode) -> u64 {
        self.lock()
            .iter()
            .find(|((r, a, m), _)| *r == rule_id && *a == action && *m == mode)
            .map_or(0, |(_, n)| *n)
    }

    /// Every per-rule counter, sorted by rule id, action, mode.
    pub fn by_rule(&self) -> Vec<RuleCount> {
        let mut all: Vec<RuleCount> = self
            .lock()
            .iter()
            .map(|(&(rule_id, action, mode), &count)| RuleCount {
                rule_id,
                action,
                mode,
                count,
            })
            .collect();
        all.sort_by_key(|c| (c.rule_id, c.action, c.mode));
        all
    }

    /// All violations seen.
    pub fn total(&self) -> u64 {
        self.lock().values().sum()
    }

    /// Records not written because an identical one was written earlier in the dedup window
    /// (they are reported by the window's summary line).
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }

    /// Lines (records and summaries) lost because the writer's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Lines (records and summaries) written to the sink.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Batches the sink failed to write (their lines are lost and not counted as written).
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn count(&self, rule_id: &'static str, action: Action, mode: Mode) {
        *self.lock().entry((rule_id, action, mode)).or_insert(0) += 1;
    }

    pub(crate) fn add_suppressed(&self) {
        self.suppressed.fetch_add(1, Ordering::Relaxed);
    }

    /// Returns the new total.
    pub(crate) fn add_dropped(&self) -> u64 {
        self.dropped.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn add_written(&self, lines: u64) {
        self.written.fetch_add(lines, Ordering::Relaxed);
    }

    /// Lines lost because the sink failed to write their batch (a full disk, a removed
    /// directory, a syslog socket gone).
    pub fn lines_not_written(&self) -> u64 {
        self.lines_not_written.load(Ordering::Relaxed)
    }

    /// A batch of `lines` lines the sink failed to write.
    pub(crate) fn add_write_error(&self, lines: u64) {
        self.write_errors.fetch_add(1, Ordering::Relaxed);
        self.lines_not_written.fetch_add(lines, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(&'static str, Action, Mode), u64>> {
        // A counter map is still valid after a panic elsewhere; never propagate poison
        // into the request path.
        self.by_rule.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_rule_action_and_mode() {
        let c = AuditCounters::default();
        c.count("W001", Action::Block, Mode::Enforce);
        c.count("W001", Action::Block, Mode::Enforce);
        c.count("W001", Action::Warn, Mode::Audit);
        c.count("Q001", Action::Warn, Mode::Enforce);
        assert_eq!(c.rule_count("W001", Action::Block, Mode::Enforce), 2);
        assert_eq!(c.rule_count("W001", Action::Warn, Mode::Audit), 1);
        assert_eq!(c.rule_count("W001", Action::Warn, Mode::Enforce), 0);
        assert_eq!(c.total(), 4);
        let all = c.by_rule();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].rule_id, "Q001");
        assert_eq!(
            all[1],
            RuleCount {
                rule_id: "W001",
                action: Action::Block,
                mode: Mode::Enforce,
                count: 2
            }
        );
    }

    #[test]
    fn plain_counters() {
        let c = AuditCounters::default();
        c.add_suppressed();
        assert_eq!(c.add_dropped(), 1);
        assert_eq!(c.add_dropped(), 2);
        c.add_written(5);
        c.add_write_error(3);
        assert_eq!(
            (c.suppressed(), c.dropped(), c.written(), c.write_errors()),
            (1, 2, 5, 1)
        );
        assert_eq!(c.lines_not_written(), 3);
    }
}
