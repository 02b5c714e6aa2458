//! Per (application, driver) client counters for `/clients`.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
};

/// Counters of one (application, driver) pair. Shared by its sessions behind an `Arc`, so a
/// request only touches atomics.
#[derive(Debug, Default)]
pub struct ClientEntry {
    /// Open connections now.
    pub connections: AtomicI64,
    /// Requests since start.
    pub requests: AtomicU64,
    /// Violations since start.
    pub violations: AtomicU64,
}

/// One row of `/clients`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRow {
    /// Application label (capped).
    pub app: String,
    /// Driver label (capped).
    pub driver: String,
    /// Open connections.
    pub connections: i64,
    /// Requests since start.
    pub requests: u64,
    /// Violations since start.
    pub violations: u64,
}

/// (application, driver) labels.
type Key = (Arc<str>, Arc<str>);

/// The table; keys are already-capped labels, so it is bounded by cap × cap.
#[derive(Debug, Default)]
pub struct ClientTable {
    entries: Mutex<HashMap<Key, Arc<ClientEntry>>>,
}

impl ClientTable {
    /// The entry of a (capped) pair, created on first use.
    pub fn entry(&self, app: Arc<str>, driver: Arc<str>) -> Arc<ClientEntry> {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry((app, driver)).or_default().clone()
    }

    /// Every row, sorted by application then driver.
    pub fn rows(&self) -> Vec<ClientRow> {
        let map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let r = Ordering::Relaxed;
        let mut rows: Vec<ClientRow> = map
            .iter()
            .map(|((app, driver), e)| ClientRow {
                app: app.to_string(),
                driver: driver.to_string(),
                connections: e.connections.load(r),
                requests: e.requests.load(r),
                violations: e.violations.load(r),
            })
            .collect();
        rows.sort_by(|a, b| (&a.app, &a.driver).cmp(&(&b.app, &b.driver)));
        rows
    }
}
