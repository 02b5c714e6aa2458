//! Deduplication of repeated violations within a time window.
//!
//! The key is (rule id, action, database, collection, shape hash, app name). The first record
//! of a key in a window is written; later ones in the same window are only counted. When the
//! window is over (noticed on the key's next record, or by the writer's periodic [`sweep`]),
//! one summary line with the suppressed count is emitted if anything was suppressed.
//!
//! The map is bounded: at most `max_keys` keys; expired keys are evicted by sweeps, and when
//! the map is full of live keys a new key is written without dedup (never lost).
//!
//! [`sweep`]: Dedup::sweep

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    time::{Duration, Instant, SystemTime},
};

use super::record::{Summary, ViolationRecord};

/// Default bound on the number of keys tracked at once.
pub(crate) const DEFAULT_MAX_KEYS: usize = 10_000;

/// What to do with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Write it.
    Write,
    /// Count it only; a later summary line reports it.
    Suppress,
}

/// The dedup state. Callers pass `now` so tests can drive time.
#[derive(Debug)]
pub(crate) struct Dedup {
    window: Duration,
    max_keys: usize,
    /// Seeded per process: the key contains client-controlled text (the app name), so its
    /// hash must not be predictable.
    hasher: RandomState,
    /// Keyed by the hash of the key; the entry holds the key itself, compared on every hit.
    entries: HashMap<u64, Entry>,
    /// When the map is full, the record path sweeps at most once per [`Dedup::tick`].
    next_full_sweep: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    start: Instant,
    suppressed: u64,
    /// The key's fields (and the first record's name, reason, shape) for the summary line.
    template: Summary,
}

impl Entry {
    fn matches(&self, rec: &ViolationRecord) -> bool {
        let t = &self.template;
        t.rule_id == rec.rule_id
            && t.action == rec.action
            && t.database == rec.database
            && t.collection == rec.collection
            && t.shape_hash == rec.shape_hash
            && t.app_name == rec.app_name
    }

    fn expired(&self, now: Instant, window: Duration) -> bool {
        // A window too long to represent never ends.
        self.start.checked_add(window).is_some_and(|end| now >= end)
    }

    fn summary(&self) -> Summary {
        Summary {
            time: SystemTime::now(),
            suppressed: self.suppressed,
            ..self.template.clone()
        }
    }
}

impl Dedup {
    /// A dedup map for a non-zero `window`.
    pub(crate) fn new(window: Duration, max_keys: usize) -> Self {
        Dedup {
            window,
            max_keys,
            hasher: RandomState::new(),
            entries: HashMap::new(),
            next_full_sweep: None,
        }
    }

    /// How often the writer should [`sweep`](Self::sweep): often enough that a summary
    /// follows the end of its window closely, at most once a second.
    pub(crate) fn tick(&self) -> Duration {
        self.window
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(1))
    }

    /// Number of keys tracked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Decides whether `rec` is written; summaries of windows that ended are pushed to
    /// `summaries`, to be written before the record. Allocates only for a new key.
    pub(crate) fn observe(
        &mut self,
        rec: &ViolationRecord,
        now: Instant,
        summaries: &mut Vec<Summary>,
    ) -> Verdict {
        let hash = self.hasher.hash_one((
            rec.rule_id,
            rec.action,
            &rec.database,
            &rec.collection,
            rec.shape_hash,
            &rec.app_name,
        ));
        if let Some(entry) = self.entries.get_mut(&hash) {
            if !entry.matches(rec) {
                // A 64-bit hash collision: write without dedup rather than merge two keys.
                return Verdict::Write;
            }
            if !entry.expired(now, self.window) {
                entry.suppressed += 1;
                return Verdict::Suppress;
            }
            if entry.suppressed > 0 {
                summaries.push(entry.summary());
            }
            entry.start = now;
            entry.suppressed = 0;
            entry.template.mode = rec.mode;
            return Verdict::Write;
        }
        if self.entries.len() >= self.max_keys {
            if self.next_full_sweep.is_none_or(|at| now >= at) {
                self.sweep(now, summaries);
                self.next_full_sweep = now.checked_add(self.tick());
            }
            if self.entries.len() >= self.max_keys {
                return Verdict::Write;
            }
        }
        self.entries.insert(
            hash,
            Entry {
                start: now,
                suppressed: 0,
                template: template(rec, self.window),
            },
        );
        Verdict::Write
    }

    /// Evicts every key whose window is over, pushing a summary for each that suppressed
    /// something.
    pub(crate) fn sweep(&mut self, now: Instant, summaries: &mut Vec<Summary>) {
        let window = self.window;
        self.entries.retain(|_, entry| {
            if !entry.expired(now, window) {
                return true;
            }
            if entry.suppressed > 0 {
                summaries.push(entry.summary());
            }
            false
        });
    }

    /// Ends every window now (shutdown): a summary for each key that suppressed something.
    pub(crate) fn drain(&mut self, summaries: &mut Vec<Summary>) {
        for (_, entry) in self.entries.drain() {
            if entry.suppressed > 0 {
                summaries.push(entry.summary());
            }
        }
    }
}

fn template(rec: &ViolationRecord, window: Duration) -> Summary {
    Summary {
        time: rec.time,
        rule_id: rec.rule_id,
        rule_name: rec.rule_name,
        reason: rec.reason,
        action: rec.action,
        mode: rec.mode,
        app_name: rec.app_name.clone(),
        database: rec.database.clone(),
        collection: rec.collection.clone(),
        filter_shape: rec.filter_shape.clone(),
        shape_hash: rec.shape_hash,
        source: rec.source,
        suppressed: 0,
        window,
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::{tests::sample, Action};
    use super::*;

    const W: Duration = Duration::from_secs(10);

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn identical_records_in_a_window_are_suppressed_then_summarised_lazily() {
        let mut d = Dedup::new(W, 100);
        let t0 = Instant::now();
        let mut out = Vec::new();
        assert_eq!(d.observe(&sample(), t0, &mut out), Verdict::Write);
        for i in 1..5 {
            assert_eq!(
                d.observe(&sample(), secs(t0, i), &mut out),
                Verdict::Suppress
            );
        }
        assert!(out.is_empty());
        // The next record after the window ends it: summary first, then the record is written.
        assert_eq!(d.observe(&sample(), secs(t0, 10), &mut out), Verdict::Write);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].suppressed, 4);
        assert_eq!(out[0].window, W);
        assert_eq!(out[0].rule_id, "W001");
        assert_eq!(out[0].app_name.as_deref(), Some("billing"));
        // A new window started at t0+10.
        out.clear();
        assert_eq!(
            d.observe(&sample(), secs(t0, 19), &mut out),
            Verdict::Suppress
        );
        d.sweep(secs(t0, 19), &mut out);
        assert!(out.is_empty() && d.len() == 1);
    }

    #[test]
    fn no_summary_when_nothing_was_suppressed() {
        let mut d = Dedup::new(W, 100);
        let t0 = Instant::now();
        let mut out = Vec::new();
        d.observe(&sample(), t0, &mut out);
        assert_eq!(d.observe(&sample(), secs(t0, 11), &mut out), Verdict::Write);
        d.sweep(secs(t0, 30), &mut out);
        assert!(out.is_empty());
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn sweep_summarises_and_evicts_expired_keys_only() {
        let mut d = Dedup::new(W, 100);
        let t0 = Instant::now();
        let mut out = Vec::new();
        let other = ViolationRecord {
            collection: Some("other".into()),
            ..sample()
        };
        d.observe(&sample(), t0, &mut out);
        d.observe(&sample(), t0, &mut out);
        d.observe(&other, secs(t0, 5), &mut out);
        d.observe(&other, secs(t0, 6), &mut out);
        d.sweep(secs(t0, 10), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].collection.as_deref(), Some("orders"));
        assert_eq!(d.len(), 1);
        out.clear();
        d.drain(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].collection.as_deref(), Some("other"));
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn every_key_field_separates_keys() {
        let t0 = Instant::now();
        let variants = [
            ViolationRecord {
                rule_id: "W003",
                ..sample()
            },
            ViolationRecord {
                action: Action::Warn,
                ..sample()
            },
            ViolationRecord {
                database: "other".into(),
                ..sample()
            },
            ViolationRecord {
                collection: None,
                ..sample()
            },
            ViolationRecord {
                shape_hash: Some(1),
                ..sample()
            },
            ViolationRecord {
                app_name: None,
                ..sample()
            },
        ];
        for v in variants {
            let mut d = Dedup::new(W, 100);
            let mut out = Vec::new();
            d.observe(&sample(), t0, &mut out);
            assert_eq!(d.observe(&v, t0, &mut out), Verdict::Write, "{v:?}");
        }
        // Fields outside the key do not.
        let mut d = Dedup::new(W, 100);
        let mut out = Vec::new();
        d.observe(&sample(), t0, &mut out);
        let same_key = ViolationRecord {
            request_id: 7,
            user: None,
            client_addr: None,
            statement_index: None,
            ..sample()
        };
        assert_eq!(d.observe(&same_key, t0, &mut out), Verdict::Suppress);
    }

    #[test]
    fn full_map_writes_without_dedup_then_recovers_after_expiry() {
        let mut d = Dedup::new(W, 2);
        let t0 = Instant::now();
        let mut out = Vec::new();
        let rec = |db: &str| ViolationRecord {
            database: db.into(),
            ..sample()
        };
        d.observe(&rec("a"), t0, &mut out);
        d.observe(&rec("a"), t0, &mut out);
        d.observe(&rec("b"), t0, &mut out);
        // Full of live keys: the third key is never suppressed.
        for _ in 0..3 {
            assert_eq!(d.observe(&rec("c"), secs(t0, 1), &mut out), Verdict::Write);
        }
        assert_eq!(d.len(), 2);
        // Once the windows are over, the full-map sweep evicts (and summarises) them.
        assert_eq!(d.observe(&rec("c"), secs(t0, 10), &mut out), Verdict::Write);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].database, "a");
        assert_eq!(out[0].suppressed, 1);
        assert_eq!(d.len(), 1);
        assert_eq!(
            d.observe(&rec("c"), secs(t0, 10), &mut out),
            Verdict::Suppress
        );
    }

    #[test]
    fn huge_window_never_expires_and_never_panics() {
        let mut d = Dedup::new(Duration::from_secs(u64::MAX), 10);
        let t0 = Instant::now();
        let mut out = Vec::new();
        d.observe(&sample(), t0, &mut out);
        assert_eq!(
            d.observe(&sample(), secs(t0, 1_000_000), &mut out),
            Verdict::Suppress
        );
        d.sweep(secs(t0, 1_000_000), &mut out);
        assert!(out.is_empty());
        assert_eq!(d.tick(), Duration::from_secs(1));
    }
}
