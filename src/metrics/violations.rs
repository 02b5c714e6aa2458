//! Recent violations for `/violations` (a ring buffer) and per-minute counts over the last
//! hour for `/stats/violations`. Fed where the proxy produces violation records.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

use crate::audit::ViolationRecord;

/// Minutes kept (the window of `/stats/violations`).
pub const WINDOW_MINUTES: u64 = 60;

#[derive(Debug, Default, Clone)]
struct Bucket {
    /// Minutes since the Unix epoch; a bucket of another minute is stale.
    minute: u64,
    by_rule: BTreeMap<&'static str, u64>,
    by_app: HashMap<Arc<str>, u64>,
}

/// Counts over the last hour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViolationStats {
    /// One entry per minute, oldest first: (minute start, seconds since the epoch; counts
    /// by rule id).
    pub buckets: Vec<(u64, BTreeMap<&'static str, u64>)>,
    /// Totals by rule id.
    pub by_rule: BTreeMap<&'static str, u64>,
    /// Totals by (capped) application label.
    pub by_app: BTreeMap<String, u64>,
}

/// The ring buffer and the minute buckets.
#[derive(Debug)]
pub struct ViolationLog {
    capacity: usize,
    recent: Mutex<VecDeque<ViolationRecord>>,
    minutes: Mutex<Vec<Bucket>>,
}

fn minute_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60)
}

impl ViolationLog {
    /// Keeps the last `capacity` records.
    pub fn new(capacity: usize) -> Self {
        ViolationLog {
            capacity,
            recent: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            minutes: Mutex::new(vec![Bucket::default(); WINDOW_MINUTES as usize]),
        }
    }

    /// Forgets the recent records and the per-minute counts (`POST /stats/reset`).
    pub fn clear(&self) {
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        for b in self
            .minutes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter_mut()
        {
            *b = Bucket::default();
        }
    }

    /// Keeps `rec` and counts it under `app` (an already capped label).
    pub fn push(&self, rec: &ViolationRecord, app: Arc<str>) {
        let minute = minute_of(rec.time);
        {
            let mut minutes = self.minutes.lock().unwrap_or_else(PoisonError::into_inner);
            // The ring has WINDOW_MINUTES buckets, so the slot always exists.
            if let Some(b) = minutes.get_mut((minute % WINDOW_MINUTES) as usize) {
                if b.minute != minute {
                    *b = Bucket {
                        minute,
                        ..Bucket::default()
                    };
                }
                *b.by_rule.entry(rec.rule_id).or_default() += 1;
                *b.by_app.entry(app).or_default() += 1;
            }
        }
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() >= self.capacity {
            recent.pop_front();
        }
        recent.push_back(rec.clone());
    }

    /// The most recent `limit` records, newest first.
    pub fn recent(&self, limit: usize) -> Vec<ViolationRecord> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.iter().rev().take(limit).cloned().collect()
    }

    /// The buffer's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts per minute over the hour ending at `now`.
    pub fn stats(&self, now: SystemTime) -> ViolationStats {
        let now_minute = minute_of(now);
        let minutes = self.minutes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = ViolationStats {
            buckets: Vec::with_capacity(WINDOW_MINUTES as usize),
            by_rule: BTreeMap::new(),
            by_app: BTreeMap::new(),
        };
        let first = now_minute.saturating_sub(WINDOW_MINUTES - 1);
        for m in first..=now_minute {
            let slot = minutes.get((m % WINDOW_MINUTES) as usize);
            let by_rule = if let Some(b) = slot.filter(|b| b.minute == m) {
                for (rule, n) in &b.by_rule {
                    *out.by_rule.entry(rule).or_default() += n;
                }
                for (app, n) in &b.by_app {
                    *out.by_app.entry(app.to_string()).or_default() += n;
                }
                b.by_rule.clone()
            } else {
                BTreeMap::new()
            };
            out.buckets.push((m * 60, by_rule));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Action, Mode, Source};
    use std::time::Duration;

    fn rec(rule: &'static str, at: SystemTime) -> ViolationRecord {
        ViolationRecord {
            time: at,
            rule_id: rule,
            rule_name: "n",
            reason: "r",
            action: Action::Block,
            mode: Mode::Enforce,
            client_addr: None,
            app_name: None,
            driver: None,
            user: None,
            database: "d".into(),
            collection: None,
            command: "delete".into(),
            statement_index: None,
            filter_shape: None,
            shape_hash: None,
            request_id: 1,
            source: Source::Proxy,
            detail: None,
            matched: None,
        }
    }

    #[test]
    fn ring_keeps_newest_and_hour_window_forgets_old_minutes() {
        let log = ViolationLog::new(2);
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000 * 60);
        let app: Arc<str> = Arc::from("billing");
        log.push(
            &rec("W001", now - Duration::from_secs(2 * 3600)),
            app.clone(),
        );
        log.push(&rec("W003", now - Duration::from_secs(120)), app.clone());
        log.push(&rec("W003", now), app);
        let recent = log.recent(10);
        assert_eq!(recent.len(), 2);
        assert_eq!(recent[0].time, now);
        let s = log.stats(now);
        assert_eq!(s.buckets.len(), 60);
        assert_eq!(s.by_rule.get("W003"), Some(&2));
        assert_eq!(s.by_rule.get("W001"), None, "two hours old");
        assert_eq!(s.by_app.get("billing"), Some(&2));
        assert_eq!(s.buckets[59].1.get("W003"), Some(&1));
        assert_eq!(s.buckets[57].1.get("W003"), Some(&1));
    }
}
