//! The query-shape table for `/shapes`: per (namespace, command, filter shape), counts,
//! errors, violations, time and a latency histogram; least recently used shapes are evicted
//! beyond `shapes_capacity`.
//!
//! The shape is computed by the guard while the command view is alive, into a per-session
//! [`ShapeScratch`] whose buffers are reused, so a request of a known shape allocates
//! nothing here. Only the commands whose filter is at hand are tracked (find, count,
//! distinct, update, delete, findAndModify, aggregate's first filtering stage), and only
//! their first filter.

use crate::wire::GetFast;
use std::{
    collections::HashMap,
    ops::ControlFlow,
    sync::{Mutex, PoisonError},
};

use hdrhistogram::Histogram;

use crate::{
    command::{CommandView, Kind},
    policy::filter,
};

/// Latency histograms cover 1 µs to 10 minutes with ~3 % precision (about 2 KiB each).
const HIST_MAX_US: u64 = 600_000_000;
const HIST_SIGFIG: u8 = 1;
/// Shapes rendered longer than this are not tracked (bounded work and memory per entry).
const MAX_SHAPE_LEN: usize = 4096;

/// What the guard learned about one request, for the shape table and the client counters.
/// Owned by a session and reused for every request.
#[derive(Debug, Default)]
pub struct ShapeScratch {
    /// A shape was captured for the current request.
    pub active: bool,
    /// Violations the policy reported for the current request.
    pub violations: u64,
    command: &'static str,
    ns: String,
    shape: String,
    key: u64,
    /// `key` with the sort and projection: what the plan guard explains once (computed only
    /// when the capture asked for it).
    plan_key: Option<u64>,
    /// The plan guard's verdict for it, when known.
    plan: Option<crate::plan::Verdict>,
}

impl ShapeScratch {
    /// Forgets the previous request.
    pub fn reset(&mut self) {
        self.active = false;
        self.violations = 0;
        self.plan = None;
    }

    /// The plan guard's key of the captured shape: namespace, command, filter shape, sort and
    /// projection; `None` when the capture did not compute it ([`ShapeScratch::capture_for`]).
    pub fn plan_key(&self) -> Option<u64> {
        self.plan_key
    }

    /// Keeps the plan guard's verdict of the captured shape (for `/shapes`).
    pub fn set_plan(&mut self, plan: Option<crate::plan::Verdict>) {
        self.plan = plan;
    }

    /// The current request's command label, namespace and filter shape, when one was
    /// captured (the learned allowlist reads them).
    pub fn captured(&self) -> Option<(&'static str, &str, &str)> {
        self.active
            .then_some((self.command, self.ns.as_str(), self.shape.as_str()))
    }

    /// Captures the namespace, command and first filter's shape of `view`, when it is one of
    /// the tracked commands, and its plan key.
    pub fn capture(&mut self, view: &CommandView<'_>) {
        self.capture_for(view, true);
    }

    /// [`ShapeScratch::capture`]; `plan_key`: also compute the plan guard's key (its sort and
    /// projection are looked up only then: the guard asks for it when the plan rules are on).
    pub fn capture_for(&mut self, view: &CommandView<'_>, plan_key: bool) {
        self.active = false;
        self.plan_key = None;
        if view.is_explain() {
            return;
        }
        match view.kind() {
            Kind::Find
            | Kind::Count
            | Kind::Distinct
            | Kind::Update
            | Kind::Delete
            | Kind::FindAndModify
            | Kind::Aggregate => {}
            _ => return,
        }
        let mut first = None;
        let walked = view.for_each_filter(|_, f| {
            first = Some(f);
            ControlFlow::Break(())
        });
        if walked.is_err() {
            return;
        }
        self.shape.clear();
        match first {
            Some(f) => filter::shape::shape_into(&mut self.shape, f),
            None => self.shape.push_str("{}"),
        }
        if self.shape.len() > MAX_SHAPE_LEN {
            return;
        }
        let ns = view.namespace();
        self.ns.clear();
        self.ns.push_str(ns.db);
        if let Some(c) = ns.coll {
            self.ns.push('.');
            self.ns.push_str(c);
        }
        self.command = super::commands::COMMANDS
            .get(super::commands::index_of(view.name()))
            .copied()
            .unwrap_or("other");
        self.key = fnv(&[
            self.ns.as_bytes(),
            self.command.as_bytes(),
            self.shape.as_bytes(),
        ]);
        if plan_key {
            let (sort, projection) = sort_and_projection(view);
            self.plan_key = Some(fnv(&[
                &self.key.to_le_bytes(),
                sort.map_or(&[][..], |d| d.as_bytes()),
                projection.map_or(&[][..], |d| d.as_bytes()),
            ]));
        }
        self.plan = None;
        self.active = true;
    }
}

/// The sort and projection that make a plan (their values are structure: 1, -1, names).
/// Aggregations: the first `$sort` and `$project` stages.
fn sort_and_projection<'a>(
    view: &CommandView<'a>,
) -> (Option<&'a bson::RawDocument>, Option<&'a bson::RawDocument>) {
    use bson::RawBsonRef;
    let Some(body) = view.fields() else {
        return (None, None);
    };
    let doc = |key: &str| match body.get(key) {
        Ok(Some(RawBsonRef::Document(d))) => Some(d),
        _ => None,
    };
    match view.kind() {
        Kind::Find => (doc("sort"), doc("projection")),
        Kind::FindAndModify => (doc("sort"), doc("fields")),
        Kind::Aggregate => {
            let (mut sort, mut project) = (None, None);
            if let Ok(Some(RawBsonRef::Array(stages))) = body.get("pipeline") {
                for stage in stages.into_iter().flatten() {
                    if let RawBsonRef::Document(st) = stage {
                        match st.get_fast("$sort") {
                            Ok(Some(RawBsonRef::Document(d))) if sort.is_none() => sort = Some(d),
                            _ => {}
                        }
                        match st.get_fast("$project") {
                            Ok(Some(RawBsonRef::Document(d))) if project.is_none() => {
                                project = Some(d)
                            }
                            _ => {}
                        }
                    }
                }
            }
            (sort, project)
        }
        _ => (None, None),
    }
}

fn fnv(parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    parts.iter().fold(OFFSET, |h, part| {
        let h = part
            .iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME));
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        (h ^ 0xff).wrapping_mul(PRIME)
    })
}

#[derive(Debug)]
struct Entry {
    namespace: String,
    command: &'static str,
    shape: String,
    shape_hash: u64,
    count: u64,
    errors: u64,
    violations: u64,
    total_time_us: u64,
    latency: Option<Histogram<u32>>,
    last_used: u64,
    /// The plan guard's last verdict for this shape.
    plan: Option<std::sync::Arc<str>>,
}

impl Entry {
    /// Counts one request of this shape (`tick`: the shard's clock, for the LRU).
    fn count_one(&mut self, s: &ShapeScratch, tick: u64, micros: u64, error: bool) {
        if let Some(v) = &s.plan {
            if self.plan.as_ref() != Some(&v.summary) {
                self.plan = Some(v.summary.clone());
            }
        }
        self.last_used = tick;
        self.count += 1;
        self.errors += u64::from(error);
        self.violations += s.violations;
        self.total_time_us = self.total_time_us.saturating_add(micros);
        if let Some(h) = &mut self.latency {
            h.saturating_record(micros.clamp(1, HIST_MAX_US));
        }
    }
}

/// One row of `/shapes`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeRow {
    /// `db.coll`.
    pub namespace: String,
    /// Command label.
    pub command: &'static str,
    /// The literal-free filter shape (JSON text).
    pub filter_shape: String,
    /// [`filter::shape_hash`] of the shape.
    pub shape_hash: u64,
    /// Requests.
    pub count: u64,
    /// Requests answered with `ok: 0` (or blocked).
    pub errors: u64,
    /// Violations reported.
    pub violations: u64,
    /// Total time in mongoguard and upstream, microseconds.
    pub total_time_us: u64,
    /// p50, p95, p99 in microseconds.
    pub latency_us: [u64; 3],
    /// The plan guard's verdict (`COLLSCAN`, `IXSCAN a_1 + SORT`, ...), when known.
    pub plan: Option<String>,
}

/// How `/shapes` orders rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeSort {
    /// Total time, descending.
    Time,
    /// Count, descending.
    Count,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<u64, Entry, KeyHasher>,
    tick: u64,
}

/// The table's keys are already 64-bit hashes (FNV-1a of namespace, command and shape), so
/// SipHash over them again was most of what a lookup cost (two per request). A keyed
/// folded multiply spreads them over the table instead: clients choose shapes, so the key
/// is mixed with a per-process random seed, and a shard holds at most its capacity anyway
/// (a full shard is already scanned whole to evict). The plan guard's verdicts, keyed by
/// the same kind of hash, use it too.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyHasher {
    seed: u64,
}

impl Default for KeyHasher {
    fn default() -> Self {
        KeyHasher {
            seed: rand::random(),
        }
    }
}

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = KeyHash;

    fn build_hasher(&self) -> KeyHash {
        KeyHash {
            seed: self.seed,
            hash: 0,
        }
    }
}

/// See [`KeyHasher`]; `u64` keys only (any other input is folded in byte by byte).
pub(crate) struct KeyHash {
    seed: u64,
    hash: u64,
}

impl std::hash::Hasher for KeyHash {
    fn write_u64(&mut self, key: u64) {
        // Folded multiply (high and low halves of the 128-bit product XORed): every key bit
        // reaches the low bits that pick the bucket and the high bits hashbrown tags with.
        let m = u128::from(key ^ self.seed) * 0x9E37_79B9_7F4A_7C15_u128;
        self.hash ^= (m as u64) ^ ((m >> 64) as u64);
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(self.hash ^ u64::from(*b));
        }
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

/// The LRU-capped table, in shards: every forwarded request records into it, and one mutex
/// for the whole table was taken by every request of every session (contended across the
/// runtime's worker threads), with a full scan of the table to evict. A request takes only
/// its shape's shard, and an eviction scans one shard. The LRU is per shard (an
/// approximation of a global one: a shard evicts its least recently used shape while
/// another may hold an older one); the total stays within the capacity.
#[derive(Debug)]
pub struct ShapeTable {
    /// Shapes per shard (the capacity divided among the shards).
    shard_capacity: usize,
    shards: Box<[Mutex<Inner>]>,
}

/// Shards of a table of at least [`SHARD_FROM`] shapes (a power of two).
const SHARDS: usize = 16;
/// Smaller tables keep one shard (an exact LRU).
const SHARD_FROM: usize = 16 * SHARDS;

impl ShapeTable {
    /// Keeps at most `capacity` shapes.
    pub fn new(capacity: usize) -> Self {
        let n = if capacity >= SHARD_FROM { SHARDS } else { 1 };
        ShapeTable {
            shard_capacity: capacity / n,
            shards: (0..n).map(|_| Mutex::new(Inner::default())).collect(),
        }
    }

    /// The shard of `key` (always `Some`: the index is masked below the power-of-two count).
    fn shard(&self, key: u64) -> Option<&Mutex<Inner>> {
        // FNV's low bits are weak alone: fold the high ones in.
        let i = ((key ^ (key >> 29) ^ (key >> 47)) as usize) & (self.shards.len() - 1);
        self.shards.get(i)
    }

    fn locked(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets every shape (`POST /stats/reset`).
    pub fn clear(&self) {
        for m in self.shards.iter() {
            Self::locked(m).map.clear();
        }
    }

    /// Counts one request of the shape captured in `s` (nothing when none was captured).
    pub fn record(&self, s: &ShapeScratch, micros: u64, error: bool) {
        if !s.active {
            return;
        }
        let Some(shard) = self.shard(s.key) else {
            return;
        };
        let mut inner = Self::locked(shard);
        inner.tick += 1;
        let tick = inner.tick;
        // A known shape (the common case): one lookup.
        if let Some(e) = inner.map.get_mut(&s.key) {
            e.count_one(s, tick, micros, error);
            return;
        }
        if inner.map.len() >= self.shard_capacity {
            // O(shard capacity), only when a new shape arrives at a full shard.
            if let Some(old) = inner
                .map
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| *k)
            {
                inner.map.remove(&old);
            }
        }
        if self.shard_capacity == 0 {
            return;
        }
        let e = inner.map.entry(s.key).or_insert_with(|| Entry {
            namespace: s.ns.clone(),
            command: s.command,
            shape: s.shape.clone(),
            shape_hash: filter::shape_hash(&s.shape),
            count: 0,
            errors: 0,
            violations: 0,
            total_time_us: 0,
            latency: Histogram::new_with_bounds(1, HIST_MAX_US, HIST_SIGFIG).ok(),
            last_used: 0,
            plan: None,
        });
        e.count_one(s, tick, micros, error);
    }

    /// The top `limit` rows by `sort`.
    pub fn rows(&self, sort: ShapeSort, limit: usize) -> Vec<ShapeRow> {
        // All shards at once, as the single table was: a consistent view, and only the
        // rows returned are built.
        let guards: Vec<_> = self.shards.iter().map(|m| Self::locked(m)).collect();
        let mut entries: Vec<&Entry> = guards.iter().flat_map(|g| g.map.values()).collect();
        match sort {
            ShapeSort::Time => entries.sort_by_key(|e| std::cmp::Reverse(e.total_time_us)),
            ShapeSort::Count => entries.sort_by_key(|e| std::cmp::Reverse(e.count)),
        }
        entries
            .into_iter()
            .take(limit)
            .map(|e| ShapeRow {
                namespace: e.namespace.clone(),
                command: e.command,
                filter_shape: e.shape.clone(),
                shape_hash: e.shape_hash,
                count: e.count,
                errors: e.errors,
                violations: e.violations,
                total_time_us: e.total_time_us,
                plan: e.plan.as_deref().map(str::to_owned),
                latency_us: e.latency.as_ref().map_or([0; 3], |h| {
                    [
                        h.value_at_quantile(0.50),
                        h.value_at_quantile(0.95),
                        h.value_at_quantile(0.99),
                    ]
                }),
            })
            .collect()
    }

    /// Shapes held now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|m| Self::locked(m).map.len()).sum()
    }

    /// True when no shape is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    fn scratch(coll: &str, filter: bson::RawDocumentBuf) -> ShapeScratch {
        let body = rawdoc! {"find": coll, "filter": filter, "$db": "db"};
        let view = CommandView::command("db", &body).unwrap();
        let mut s = ShapeScratch::default();
        s.capture(&view);
        s
    }

    #[test]
    fn literals_do_not_split_shapes_and_lru_evicts() {
        let t = ShapeTable::new(2);
        let a1 = scratch("a", rawdoc! {"x": 1});
        let a2 = scratch("a", rawdoc! {"x": 2});
        assert!(a1.active);
        t.record(&a1, 10, false);
        t.record(&a2, 30, true);
        let rows = t.rows(ShapeSort::Count, 10);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].count, 2);
        assert_eq!(rows[0].errors, 1);
        assert_eq!(rows[0].namespace, "db.a");
        assert_eq!(rows[0].command, "find");
        assert!(!rows[0].filter_shape.contains('1'));
        t.record(&scratch("b", rawdoc! {}), 5, false);
        t.record(&a1, 5, false);
        t.record(&scratch("c", rawdoc! {}), 5, false);
        let names: Vec<String> = t
            .rows(ShapeSort::Time, 10)
            .into_iter()
            .map(|r| r.namespace)
            .collect();
        assert_eq!(names, ["db.a", "db.c"], "b was least recently used");
    }

    #[test]
    fn a_sharded_table_stays_within_its_capacity_and_keeps_hot_shapes() {
        let t = ShapeTable::new(SHARD_FROM);
        assert_eq!(t.shards.len(), SHARDS);
        let hot = scratch("hot", rawdoc! {});
        for i in 0..(SHARD_FROM * 4) {
            t.record(&scratch(&format!("c{i}"), rawdoc! {}), 1, false);
            // Recorded between every new shape: never its shard's least recently used.
            t.record(&hot, 1, false);
        }
        assert!(t.len() <= SHARD_FROM, "{} shapes", t.len());
        assert!(
            t.len() >= SHARD_FROM / 2,
            "shards fill up: {} shapes",
            t.len()
        );
        let rows = t.rows(ShapeSort::Count, 1);
        assert_eq!(rows[0].namespace, "db.hot");
        assert_eq!(rows[0].count, (SHARD_FROM * 4) as u64);
        t.clear();
        assert!(t.is_empty());
    }

    #[test]
    fn histogram_is_small() {
        let h = Histogram::<u32>::new_with_bounds(1, HIST_MAX_US, HIST_SIGFIG).unwrap();
        assert!(h.distinct_values() < 1024, "{}", h.distinct_values());
    }
}
