//! The plan guard (rules Q006 collection-scan and Q007 in-memory-sort): each new query shape
//! (namespace, command, filter shape, sort and projection) is explained once, with
//! `queryPlanner` verbosity, on mongoguard's own upstream connections, off the request path:
//! the request that meets an unknown shape schedules the explain and goes on at once (it is
//! never delayed, and never blocked by Q006/Q007: a shape can be blocked only once its verdict
//! is known). Explains are rate limited (per second and in flight), verdicts cached for
//! `plan.ttl` and dropped at once when mongoguard forwards createIndexes, dropIndexes, drop or
//! dropDatabase on their namespace.
//!
//! The same worker keeps two more upstream facts: each collection's index count (for I002,
//! from `listIndexes`, fetched when a collection is first queried and again after the index
//! DDL mongoguard forwards) and, behind mongos, the shard keys of `config.collections` (for
//! Q008, refreshed every minute; `[plan] shard_keys` declares more, and wins).
//!
//! The explain runs as the upstream URI's identity: in pooled mode the pools' own; in
//! passthrough mode only when the URI holds credentials (`plan.enabled = "auto"`), else the
//! plan guard is off and says so at startup.

pub mod verdict;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use bson::RawDocumentBuf;
use dashmap::DashMap;
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use verdict::{PlanFacts, Verdict};

use crate::{
    command::CommandView,
    config::{Config, Mode, PlanConfig, PlanEnabled},
    metrics::shapes::KeyHasher,
    upstream::{
        topology::{ReadPref, Topology},
        Identity, UpstreamConn,
    },
};

/// A pending explain older than this is scheduled again (its job was lost: a full queue, an
/// explain that never answered).
const PENDING_RETRY: Duration = Duration::from_secs(30);
/// A failed explain is retried after this long (not at every request).
const FAILED_TTL: Duration = Duration::from_secs(60);
/// Jobs waiting for their turn; beyond, new shapes wait for a later request.
const QUEUE: usize = 256;

enum Slot {
    Pending(Instant),
    Known {
        verdict: Verdict,
        at: Instant,
        /// `db.coll`, for invalidation.
        ns: Arc<str>,
    },
}

enum Job {
    Explain {
        key: u64,
        ns: Arc<str>,
        command: RawDocumentBuf,
    },
    /// `listIndexes` of `db.coll`, not before the instant (after DDL, once it has run).
    CountIndexes {
        db: String,
        coll: String,
        not_before: Instant,
    },
}

/// Index counts are fetched again after this long.
const INDEX_COUNT_TTL: Duration = Duration::from_secs(60);
/// After index DDL, the count is fetched again this much later (once the DDL ran).
const RECOUNT_DELAY: Duration = Duration::from_millis(500);
/// Shard keys are read from mongos this often.
const SHARD_KEY_REFRESH: Duration = Duration::from_secs(60);

/// Shard keys by database, then collection (looked up without building a `db.coll` string).
type ShardKeys = std::collections::HashMap<String, std::collections::HashMap<String, Vec<String>>>;

fn shard_keys_from(declared: &std::collections::BTreeMap<String, Vec<String>>) -> ShardKeys {
    let mut out = ShardKeys::new();
    for (ns, key) in declared {
        if let Some((db, coll)) = ns.split_once('.') {
            out.entry(db.to_owned())
                .or_default()
                .insert(coll.to_owned(), key.clone());
        }
    }
    out
}

/// A read view of the shard keys for one request.
pub struct ShardKeysRead<'a>(std::sync::RwLockReadGuard<'a, ShardKeys>);

impl ShardKeysRead<'_> {
    /// The shard key of `db.coll`, if it is sharded.
    pub fn get(&self, db: &str, coll: Option<&str>) -> Option<&[String]> {
        self.0.get(db)?.get(coll?).map(Vec::as_slice)
    }
}

/// Counters of the plan guard (`/metrics`).
#[derive(Debug, Default)]
pub struct PlanCounters {
    /// Explains answered with a plan.
    pub explained: AtomicU64,
    /// Explains that failed (error reply, connection, timeout).
    pub failed: AtomicU64,
    /// New shapes not scheduled because the queue was full.
    pub dropped: AtomicU64,
}

/// The plan guard.
pub struct PlanGuard {
    on: bool,
    ttl: Duration,
    max_shapes: usize,
    /// By plan key, an FNV-1a hash of the shape: hashed again only to spread it (one
    /// lookup per request).
    verdicts: DashMap<u64, Slot, KeyHasher>,
    tx: Option<mpsc::Sender<Job>>,
    /// Index counts by `db.coll`, with when they were read (`None`: being fetched).
    index_counts: DashMap<String, (Option<usize>, Instant)>,
    /// Shard keys (declared, and discovered behind mongos).
    shard_keys: std::sync::RwLock<ShardKeys>,
    declared_keys: ShardKeys,
    any_shard_key: std::sync::atomic::AtomicBool,
    /// Counters.
    pub counters: PlanCounters,
}

impl std::fmt::Debug for PlanGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanGuard")
            .field("on", &self.on)
            .field("shapes", &self.verdicts.len())
            .finish_non_exhaustive()
    }
}

impl PlanGuard {
    /// A plan guard that is off: no verdict, ever.
    pub fn off() -> Arc<PlanGuard> {
        Arc::new(PlanGuard::new(false, &PlanConfig::default(), None))
    }

    fn new(on: bool, cfg: &PlanConfig, tx: Option<mpsc::Sender<Job>>) -> PlanGuard {
        let declared = shard_keys_from(&cfg.shard_keys);
        PlanGuard {
            on,
            ttl: cfg.ttl,
            max_shapes: cfg.max_shapes,
            verdicts: DashMap::with_hasher(KeyHasher::default()),
            tx,
            index_counts: DashMap::new(),
            any_shard_key: std::sync::atomic::AtomicBool::new(!declared.is_empty()),
            shard_keys: std::sync::RwLock::new(declared.clone()),
            declared_keys: declared,
            counters: PlanCounters::default(),
        }
    }

    /// A plan guard holding these verdicts and running no explain (benchmarks, tests).
    #[doc(hidden)]
    pub fn seeded(verdicts: &[(u64, &str, Verdict)]) -> PlanGuard {
        let g = PlanGuard::new(true, &PlanConfig::default(), None);
        for (key, ns, v) in verdicts {
            g.verdicts.insert(
                *key,
                Slot::Known {
                    verdict: v.clone(),
                    at: Instant::now(),
                    ns: (*ns).into(),
                },
            );
        }
        g
    }

    /// The shard keys, for one request's lookups; `None` when none is known (no lock taken).
    pub fn shard_keys(&self) -> Option<ShardKeysRead<'_>> {
        if !self.any_shard_key.load(Ordering::Relaxed) {
            return None;
        }
        Some(ShardKeysRead(
            self.shard_keys
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        ))
    }

    /// Replaces the discovered shard keys (the declared ones win).
    fn set_discovered(&self, mut keys: ShardKeys) {
        for (db, colls) in &self.declared_keys {
            let entry = keys.entry(db.clone()).or_default();
            for (c, k) in colls {
                entry.insert(c.clone(), k.clone());
            }
        }
        self.any_shard_key
            .store(!keys.is_empty(), Ordering::Relaxed);
        *self
            .shard_keys
            .write()
            .unwrap_or_else(PoisonError::into_inner) = keys;
    }

    /// createIndexes: the collection's index count now (the `_id` index included), when
    /// known; an unknown or old count is fetched in the background.
    pub fn index_count(&self, db: &str, coll: Option<&str>) -> Option<usize> {
        let coll = coll?;
        if !self.on {
            return None;
        }
        let ns = format!("{db}.{coll}");
        let now = Instant::now();
        let known = self.index_counts.get(&ns).map(|e| *e.value());
        match known {
            Some((count, at)) if now.saturating_duration_since(at) < INDEX_COUNT_TTL => count,
            Some((count, _)) => {
                self.count_indexes(db, coll, now);
                count
            }
            None => {
                self.count_indexes(db, coll, now);
                None
            }
        }
    }

    /// Schedules a `listIndexes` of `db.coll` (not before `not_before`).
    fn count_indexes(&self, db: &str, coll: &str, not_before: Instant) {
        let Some(tx) = &self.tx else {
            return;
        };
        let ns = format!("{db}.{coll}");
        let keep = self.index_counts.get(&ns).and_then(|e| e.value().0);
        self.make_room_for_count(&ns);
        self.index_counts.insert(ns.clone(), (keep, Instant::now()));
        let job = Job::CountIndexes {
            db: db.to_owned(),
            coll: coll.to_owned(),
            not_before,
        };
        if tx.try_send(job).is_err() {
            self.index_counts.remove(&ns);
        }
    }

    /// A createIndexes of `specs` indexes on `db.coll` was forwarded: a known count grows at
    /// once (the next createIndexes of a migration is judged on it) and is read again from
    /// the server shortly after (an index that already existed added nothing).
    pub fn note_created(&self, db: &str, coll: Option<&str>, specs: usize) {
        let Some(coll) = coll.filter(|_| self.on) else {
            return;
        };
        let ns = format!("{db}.{coll}");
        if let Some(mut e) = self.index_counts.get_mut(&ns) {
            if let Some(n) = e.value_mut().0.as_mut() {
                *n += specs;
            }
        }
        self.count_indexes(db, coll, Instant::now() + RECOUNT_DELAY);
    }

    /// A new collection's count when the table holds `max_shapes` already: the oldest goes
    /// (collection names come from clients; O(table), only for a collection not held).
    fn make_room_for_count(&self, ns: &str) {
        if self.index_counts.len() < self.max_shapes || self.index_counts.contains_key(ns) {
            return;
        }
        let oldest = self
            .index_counts
            .iter()
            .min_by_key(|e| e.value().1)
            .map(|e| e.key().clone());
        if let Some(k) = oldest {
            self.index_counts.remove(&k);
        }
    }

    fn set_index_count(&self, ns: String, count: usize) {
        self.make_room_for_count(&ns);
        self.index_counts.insert(ns, (Some(count), Instant::now()));
    }

    /// Starts the plan guard for `config` (explaining on `topology`'s primary as `identity`),
    /// or returns it off, logging why.
    pub fn start(
        config: &Config,
        topology: Arc<Topology>,
        identity: Identity,
        tls: Option<crate::tls::UpstreamTls>,
        cancel: CancellationToken,
    ) -> Arc<PlanGuard> {
        let cfg = &config.plan;
        let has_credentials = identity.credentials.is_some();
        match (cfg.enabled, config.proxy.mode, has_credentials) {
            (PlanEnabled::Off, _, _) => {
                info!("plan guard off (plan.enabled = \"off\"): Q006, Q007 and I002 never fire");
                return Arc::new(PlanGuard::new(false, cfg, None));
            }
            (PlanEnabled::Auto, Mode::Passthrough, false) => {
                warn!(
                    "PLAN GUARD OFF: passthrough mode without upstream credentials, so \
                     mongoguard cannot run explain as anyone; Q006 (collection-scan) and Q007 \
                     (in-memory-sort) will never fire. Put credentials in upstream.uri, or set \
                     plan.enabled = \"on\" for an upstream that needs none"
                );
                return Arc::new(PlanGuard::new(false, cfg, None));
            }
            _ => {}
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let guard = Arc::new(PlanGuard::new(true, cfg, Some(tx)));
        let worker = Worker {
            guard: Arc::downgrade(&guard),
            topology,
            identity,
            tls,
            cfg: cfg.clone(),
            max_message_size: config.proxy.max_message_size,
            idle: Arc::new(Mutex::new(Vec::new())),
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = worker.run(rx) => {}
            }
        });
        info!(
            per_second = cfg.explains_per_second,
            in_flight = cfg.max_in_flight,
            "plan guard on: each new query shape is explained once, off the request path"
        );
        guard
    }

    /// True when verdicts can exist.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The request path: the verdict of shape `key` (`None` while unknown). An unknown or
    /// expired shape gets an explain scheduled (built from `view`), without waiting for it.
    /// A known shape costs one map lookup and a reference-count increment.
    pub fn verdict(&self, key: u64, view: &CommandView<'_>) -> Option<Verdict> {
        if !self.on {
            return None;
        }
        let now = Instant::now();
        let stale = match self.verdicts.get(&key).as_deref() {
            Some(Slot::Known { verdict, at, .. }) => {
                let ttl = if verdict.failed { FAILED_TTL } else { self.ttl };
                if now.saturating_duration_since(*at) < ttl {
                    return (!verdict.failed).then(|| verdict.clone());
                }
                // Expired: the old verdict serves until the new one arrives.
                Some(verdict.clone())
            }
            Some(Slot::Pending(since)) if now.saturating_duration_since(*since) < PENDING_RETRY => {
                return None;
            }
            _ => None,
        };
        self.schedule(key, view, now, stale.is_some());
        stale.filter(|v| !v.failed)
    }

    fn schedule(&self, key: u64, view: &CommandView<'_>, now: Instant, refresh: bool) {
        let Some(tx) = &self.tx else {
            return;
        };
        let Some(command) = verdict::explain_command(view) else {
            return;
        };
        if !refresh && self.verdicts.len() >= self.max_shapes {
            self.evict_one();
        }
        let ns = view.namespace();
        let ns: Arc<str> = match ns.coll {
            Some(c) => format!("{}.{c}", ns.db).into(),
            None => ns.db.into(),
        };
        if !refresh {
            self.verdicts.insert(key, Slot::Pending(now));
        } else if let Some(mut slot) = self.verdicts.get_mut(&key) {
            // Keep the old verdict, but do not schedule again for a while.
            if let Slot::Known { at, .. } = &mut *slot {
                *at = now
                    .checked_sub(self.ttl.saturating_sub(PENDING_RETRY))
                    .unwrap_or(now);
            }
        }
        // A collection seen for the first time: its index count too (I002).
        if let (false, Some(coll)) = (refresh, view.namespace().coll) {
            let db = view.namespace().db;
            if !self.index_counts.contains_key(ns.as_ref()) {
                self.count_indexes(db, coll, now);
            }
        }
        if tx.try_send(Job::Explain { key, ns, command }).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            if !refresh {
                self.verdicts.remove(&key);
            }
        }
    }

    /// Drops the oldest verdict (a full table; O(shapes), only when a new shape arrives).
    fn evict_one(&self) {
        let oldest = self
            .verdicts
            .iter()
            .min_by_key(|e| match e.value() {
                Slot::Pending(t) => *t,
                Slot::Known { at, .. } => *at,
            })
            .map(|e| *e.key());
        if let Some(k) = oldest {
            self.verdicts.remove(&k);
        }
    }

    /// Forgets the verdicts of `db.coll` (or of every collection of `db` when `coll` is
    /// `None`): mongoguard forwarded an index change or a drop there.
    pub fn invalidate(&self, db: &str, coll: Option<&str>) {
        self.invalidate_plans(db, coll);
        if !self.on {
            return;
        }
        // Index counts: fetched again once the DDL has run.
        match coll {
            Some(c) => {
                self.index_counts.remove(&format!("{db}.{c}"));
                self.count_indexes(db, c, Instant::now() + RECOUNT_DELAY);
            }
            None => self
                .index_counts
                .retain(|ns, _| ns.split_once('.').is_none_or(|(d, _)| d != db)),
        }
    }

    /// Forgets the plan verdicts of `db.coll` (or of all of `db`): its indexes changed.
    pub fn invalidate_plans(&self, db: &str, coll: Option<&str>) {
        if !self.on {
            return;
        }
        self.verdicts.retain(|_, slot| match slot {
            Slot::Pending(_) => true,
            Slot::Known { ns, .. } => {
                let Some(rest) = ns.strip_prefix(db).and_then(|r| r.strip_prefix('.')) else {
                    return true;
                };
                coll.is_some_and(|c| rest != c)
            }
        });
    }

    /// Verdicts and pending explains held now.
    pub fn len(&self) -> usize {
        self.verdicts.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.verdicts.is_empty()
    }

    fn settle(&self, key: u64, ns: Arc<str>, verdict: Verdict) {
        let counter = if verdict.failed {
            &self.counters.failed
        } else {
            &self.counters.explained
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // A shape invalidated (or evicted) while its explain ran is not resurrected with a
        // verdict that may predate the index change: only a pending or known slot is settled.
        if let Some(mut slot) = self.verdicts.get_mut(&key) {
            *slot = Slot::Known {
                verdict,
                at: Instant::now(),
                ns,
            };
        }
    }
}

/// Runs the explains: one job at a time off the queue, at most `explains_per_second` started
/// per second and `max_in_flight` at once, each on an idle connection of its own (opened as
/// needed, kept for the next).
struct Worker {
    guard: std::sync::Weak<PlanGuard>,
    topology: Arc<Topology>,
    identity: Identity,
    tls: Option<crate::tls::UpstreamTls>,
    cfg: PlanConfig,
    max_message_size: usize,
    idle: Arc<Mutex<Vec<UpstreamConn>>>,
}

impl Worker {
    async fn run(self, mut rx: mpsc::Receiver<Job>) {
        let this = Arc::new(self);
        let in_flight = Arc::new(tokio::sync::Semaphore::new(this.cfg.max_in_flight));
        let period = Duration::from_secs(1) / this.cfg.explains_per_second.max(1);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let discover = this.clone();
        tokio::spawn(async move { discover.discover_shard_keys().await });
        while let Some(job) = rx.recv().await {
            tick.tick().await;
            let w = this.clone();
            let (key, ns, command) = match job {
                Job::Explain { key, ns, command } => (key, ns, command),
                Job::CountIndexes {
                    db,
                    coll,
                    not_before,
                } => {
                    // The wait for the DDL to run holds no in-flight place.
                    let in_flight = in_flight.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(not_before).await;
                        let Ok(_permit) = in_flight.acquire_owned().await else {
                            return;
                        };
                        w.count(db, coll).await;
                    });
                    continue;
                }
            };
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let job = Explained { key, ns, command };
            tokio::spawn(async move {
                let _permit = permit;
                let verdict = tokio::time::timeout(w.cfg.explain_timeout, w.explain(&job.command))
                    .await
                    .unwrap_or_else(|_| Err("explain timed out".into()));
                let verdict = match verdict {
                    Ok(v) => v,
                    Err(e) => {
                        debug!(ns = %job.ns, error = %e, "explain failed");
                        Verdict {
                            facts: PlanFacts::default(),
                            summary: format!("explain failed: {e}").into(),
                            failed: true,
                        }
                    }
                };
                if let Some(g) = w.guard.upgrade() {
                    g.settle(job.key, job.ns, verdict);
                }
            });
        }
    }

    /// `listIndexes` of `db.coll`: its index count (a collection that does not exist yet
    /// counts its future `_id` index).
    async fn count(&self, db: String, coll: String) {
        let mut cmd = RawDocumentBuf::new();
        cmd.append(bson::cstr!("listIndexes"), coll.as_str());
        cmd.append(bson::cstr!("cursor"), bson::rawdoc! {"batchSize": 1000});
        cmd.append(bson::cstr!("$db"), db.as_str());
        let reply = tokio::time::timeout(self.cfg.explain_timeout, self.command(&cmd)).await;
        let count = match reply {
            Ok(Ok(r)) => index_count_of(&r),
            _ => None,
        };
        let ns = format!("{db}.{coll}");
        if let Some(g) = self.guard.upgrade() {
            match count {
                Some(n) => g.set_index_count(ns, n),
                None => {
                    g.index_counts.remove(&ns);
                }
            }
        }
    }

    /// Behind mongos: reads the shard keys of `config.collections` every minute.
    async fn discover_shard_keys(&self) {
        let mut tick = tokio::time::interval(SHARD_KEY_REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(g) = self.guard.upgrade() else {
                return;
            };
            let behind_mongos = self
                .topology
                .facts(Duration::from_secs(10))
                .await
                .is_some_and(|f| f.role == crate::upstream::Role::Mongos);
            if !behind_mongos {
                continue;
            }
            let cmd = bson::rawdoc! {"find": "collections", "filter": {"dropped": {"$ne": true}},
            "projection": {"key": 1, "unsplittable": 1}, "batchSize": 100_000, "$db": "config"};
            match tokio::time::timeout(self.cfg.explain_timeout, self.command(&cmd)).await {
                Ok(Ok(reply)) => g.set_discovered(shard_keys_of(&reply)),
                Ok(Err(e)) => {
                    debug!(error = %e, "reading shard keys from config.collections failed")
                }
                Err(_) => debug!("reading shard keys from config.collections timed out"),
            }
        }
    }

    async fn explain(&self, command: &RawDocumentBuf) -> Result<Verdict, String> {
        let reply = self.command(command).await?;
        verdict::read_verdict(&reply).ok_or_else(|| match reply.get("errmsg") {
            Ok(Some(bson::RawBsonRef::String(m))) => crate::text::clip(m, 200).into_owned(),
            _ => "no winning plan in the reply".into(),
        })
    }

    /// One command on an idle connection of the plan guard (opened as needed).
    async fn command(&self, command: &RawDocumentBuf) -> Result<RawDocumentBuf, String> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match idle {
            Some(c) => c,
            None => {
                let host = self
                    .topology
                    .select(ReadPref::Primary, self.cfg.explain_timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                UpstreamConn::open(
                    &host,
                    &self.identity,
                    self.cfg.explain_timeout,
                    self.max_message_size,
                    self.tls.as_ref(),
                    self.topology.load_balanced(),
                )
                .await
                .map_err(|e| e.to_string())?
            }
        };
        let reply = conn.command(command).await.map_err(|e| e.to_string())?;
        // The connection answered: keep it for the next command (a broken one is dropped).
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
        Ok(reply)
    }
}

/// An explain job taken off the queue.
struct Explained {
    key: u64,
    ns: Arc<str>,
    command: RawDocumentBuf,
}

/// The index count of a `listIndexes` reply (`NamespaceNotFound`: the `_id` index to be).
fn index_count_of(reply: &bson::RawDocument) -> Option<usize> {
    use bson::RawBsonRef;
    if let Ok(Some(RawBsonRef::Int32(26))) = reply.get("code") {
        return Some(1);
    }
    let Ok(Some(RawBsonRef::Document(cursor))) = reply.get("cursor") else {
        return None;
    };
    match cursor.get("firstBatch") {
        Ok(Some(RawBsonRef::Array(batch))) => Some(batch.into_iter().count()),
        _ => None,
    }
}

/// The shard keys in a `find` of `config.collections` (unsplittable collections of 8.0 are
/// not sharded).
fn shard_keys_of(reply: &bson::RawDocument) -> ShardKeys {
    use bson::RawBsonRef;
    let mut out = ShardKeys::new();
    let Ok(Some(RawBsonRef::Document(cursor))) = reply.get("cursor") else {
        return out;
    };
    let Ok(Some(RawBsonRef::Array(batch))) = cursor.get("firstBatch") else {
        return out;
    };
    for entry in batch.into_iter().flatten() {
        let RawBsonRef::Document(e) = entry else {
            continue;
        };
        if matches!(e.get("unsplittable"), Ok(Some(RawBsonRef::Boolean(true)))) {
            continue;
        }
        let (Ok(Some(RawBsonRef::String(ns))), Ok(Some(RawBsonRef::Document(key)))) =
            (e.get("_id"), e.get("key"))
        else {
            continue;
        };
        let Some((db, coll)) = ns.split_once('.') else {
            continue;
        };
        let fields: Vec<String> = key
            .into_iter()
            .flatten()
            .map(|(k, _)| k.as_str().to_owned())
            .collect();
        if !fields.is_empty() {
            out.entry(db.to_owned())
                .or_default()
                .insert(coll.to_owned(), fields);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    fn guard() -> PlanGuard {
        let (tx, rx) = mpsc::channel(64);
        std::mem::forget(rx);
        let cfg = PlanConfig {
            max_shapes: 3,
            ..PlanConfig::default()
        };
        PlanGuard::new(true, &cfg, Some(tx))
    }

    fn known(collscan: bool) -> Verdict {
        Verdict {
            facts: PlanFacts {
                collscan,
                in_memory_sort: false,
            },
            summary: "COLLSCAN".into(),
            failed: false,
        }
    }

    /// Every collection name a client sends in a find or a createIndexes left an index count
    /// behind for good: a client naming a new collection in each request grew the table
    /// without bound (10 a second, the explain rate: about 860,000 entries a day). It is
    /// capped like the verdicts, at `max_shapes`, the oldest going first.
    #[tokio::test]
    async fn index_counts_are_capped_at_max_shapes() {
        let g = guard();
        for i in 0..50 {
            let coll = format!("c{i}");
            assert_eq!(g.index_count("d", Some(&coll)), None);
            g.set_index_count(format!("d.{coll}"), 1);
        }
        assert!(g.index_counts.len() <= 3, "{} counts", g.index_counts.len());
        // The newest are kept.
        assert_eq!(g.index_count("d", Some("c49")), Some(1));
    }

    #[tokio::test]
    async fn unknown_then_known_then_invalidated() {
        let g = guard();
        let body = rawdoc! {"find": "c", "filter": {"a": 1}, "$db": "d"};
        let view = CommandView::command("d", &body).unwrap();
        // First sight: unknown, scheduled (pending), not scheduled twice.
        assert!(g.verdict(1, &view).is_none());
        assert_eq!(g.len(), 1);
        assert!(g.verdict(1, &view).is_none());
        g.settle(1, "d.c".into(), known(true));
        assert!(g.verdict(1, &view).unwrap().facts.collscan);
        // Another collection's index change leaves it; its own drops it.
        g.invalidate("d", Some("other"));
        assert!(g.verdict(1, &view).is_some());
        g.invalidate("d", Some("c"));
        assert!(
            g.verdict(1, &view).is_none(),
            "invalidated, scheduled again"
        );
        // A verdict arriving for a shape invalidated meanwhile is dropped.
        g.invalidate("d", None);
        g.verdicts.remove(&1);
        g.settle(1, "d.c".into(), known(true));
        assert!(g.verdicts.get(&1).is_none());
        // A failed explain never fires a rule.
        g.verdicts.insert(2, Slot::Pending(Instant::now()));
        g.settle(
            2,
            "d.c".into(),
            Verdict {
                facts: PlanFacts::default(),
                summary: "explain failed".into(),
                failed: true,
            },
        );
        assert!(g.verdict(2, &view).is_none());
        assert_eq!(g.counters.failed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn index_counts_and_shard_keys_from_replies() {
        let reply = rawdoc! {"cursor": {"id": 0i64, "ns": "d.c", "firstBatch": [
        {"v": 2, "key": {"_id": 1}, "name": "_id_"}, {"v": 2, "key": {"a": 1}, "name": "a_1"}]}, "ok": 1.0};
        assert_eq!(index_count_of(&reply), Some(2));
        let missing = rawdoc! {"ok": 0.0, "code": 26, "codeName": "NamespaceNotFound", "errmsg": "ns does not exist"};
        assert_eq!(index_count_of(&missing), Some(1));
        assert_eq!(index_count_of(&rawdoc! {"ok": 0.0, "code": 13}), None);
        let reply = rawdoc! {"cursor": {"id": 0i64, "ns": "config.collections", "firstBatch": [
        {"_id": "shop.orders", "key": {"customer": 1, "at": 1}},
        {"_id": "shop.events", "key": {"_id": "hashed"}},
        {"_id": "shop.small", "key": {"_id": 1}, "unsplittable": true}]}, "ok": 1.0};
        let keys = shard_keys_of(&reply);
        assert_eq!(keys["shop"]["orders"], vec!["customer", "at"]);
        assert_eq!(keys["shop"]["events"], vec!["_id"]);
        assert!(!keys["shop"].contains_key("small"));
        // Declared keys win over discovered ones.
        let cfg = PlanConfig {
            shard_keys: [("shop.orders".to_owned(), vec!["region".to_owned()])].into(),
            ..PlanConfig::default()
        };
        let g = PlanGuard::new(true, &cfg, None);
        assert_eq!(
            g.shard_keys().unwrap().get("shop", Some("orders")).unwrap(),
            ["region"]
        );
        g.set_discovered(keys);
        let read = g.shard_keys().unwrap();
        assert_eq!(read.get("shop", Some("orders")).unwrap(), ["region"]);
        assert_eq!(read.get("shop", Some("events")).unwrap(), ["_id"]);
        assert!(read.get("shop", None).is_none());
    }

    #[test]
    fn off_knows_nothing() {
        let g = PlanGuard::off();
        let body = rawdoc! {"find": "c", "filter": {"a": 1}, "$db": "d"};
        let view = CommandView::command("d", &body).unwrap();
        assert!(g.verdict(1, &view).is_none());
        assert!(g.is_empty());
    }
}
