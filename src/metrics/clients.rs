//! Per (application, driver) client counters for `/clients`.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Instant,
};

use crate::policy::connections::{PairCounts, Window, WindowCounts};

/// Counters of one (application, driver) pair. Shared by its sessions behind an `Arc`, so a
/// request only touches atomics (the connection window is locked only when a connection
/// identifies itself, sends its first application request, and closes).
#[derive(Debug)]
pub struct ClientEntry {
    /// Open connections now.
    pub connections: AtomicI64,
    /// Requests since start.
    pub requests: AtomicU64,
    /// Violations since start.
    pub violations: AtomicU64,
    /// Its recent connections, for the connection standards.
    window: Mutex<Window>,
    /// The connection standards that held at the last report ("C001 short-lived-...: ...").
    findings: Mutex<Vec<String>>,
}

impl ClientEntry {
    fn new(now: Instant) -> ClientEntry {
        ClientEntry {
            connections: AtomicI64::new(0),
            requests: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            window: Mutex::new(Window::new(now)),
            findings: Mutex::new(Vec::new()),
        }
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection of this pair identified itself (its first request).
    pub fn arrived(&self) {
        self.window().arrived();
    }

    /// A connection of this pair sent its first application request at `now`.
    pub fn app_connection_opened(&self, now: Instant) {
        self.window().opened(now);
    }

    /// A connection of this pair closed at `now` after `requests` application requests.
    pub fn connection_closed(&self, now: Instant, requests: u64) {
        self.window().closed(now, requests);
    }

    /// The findings of the last report.
    pub fn findings(&self) -> Vec<String> {
        self.findings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
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
    /// Connection standards that held at the last report.
    pub findings: Vec<String>,
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
        map.entry((app, driver))
            .or_insert_with(|| Arc::new(ClientEntry::new(Instant::now())))
            .clone()
    }

    /// The connection report: every pair's window at `now` (its arrivals since the last
    /// report reset), handed to `assess`, whose findings (`(app, driver, text)`; a `None`
    /// driver applies to every driver of the application) replace every pair's list.
    pub fn report<T>(
        &self,
        now: Instant,
        assess: impl FnOnce(&[PairCounts<'_>]) -> (T, Vec<(String, Option<String>, String)>),
    ) -> T {
        let map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<(&Key, &Arc<ClientEntry>)> = map.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        let counts: Vec<WindowCounts> = keys.iter().map(|(_, e)| e.window().take(now)).collect();
        let pairs: Vec<PairCounts<'_>> = keys
            .iter()
            .zip(counts)
            .map(|(((app, driver), e), counts)| PairCounts {
                app,
                driver,
                counts,
                open: u64::try_from(e.connections.load(Ordering::Relaxed)).unwrap_or(0),
            })
            .collect();
        let (out, findings) = assess(&pairs);
        for ((app, driver), e) in keys {
            let mine: Vec<String> = findings
                .iter()
                .filter(|(a, d, _)| **a == **app && d.as_deref().is_none_or(|d| d == &**driver))
                .map(|(_, _, text)| text.clone())
                .collect();
            *e.findings.lock().unwrap_or_else(PoisonError::into_inner) = mine;
        }
        out
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
                findings: e.findings(),
            })
            .collect();
        rows.sort_by(|a, b| (&a.app, &a.driver).cmp(&(&b.app, &b.driver)));
        rows
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::{connections::assess, Policy, RuleId};

    fn text(f: &crate::policy::connections::Finding) -> (String, Option<String>, String) {
        (f.app.clone(), f.driver.clone(), f.rule.code().to_owned())
    }

    /// What a session does: identify itself, send `requests` application requests, close.
    fn connection(e: &ClientEntry, now: Instant, requests: u64) {
        e.connections.fetch_add(1, Ordering::Relaxed);
        e.arrived();
        if requests > 0 {
            e.app_connection_opened(now);
        }
        e.connections.fetch_sub(1, Ordering::Relaxed);
        e.connection_closed(now, requests);
    }

    #[test]
    fn a_report_sets_findings_on_the_rows_they_concern_and_clears_them_later() {
        let policy = Policy::from_toml(
            "extends = \"strict\"\n[rules]\n\
             C001 = { action = \"warn\", max_connections_per_minute = 3, min_requests_per_connection = 2 }\n",
            "p.toml",
        )
        .unwrap();
        let table = ClientTable::default();
        let t0 = Instant::now();
        let label = |s: &str| Arc::<str>::from(s);
        let php_a = table.entry(label("php"), label("a 1"));
        let php_b = table.entry(label("php"), label("b 1"));
        let steady = table.entry(label("steady"), label("a 1"));
        let anon = table.entry(label("-"), label("a 1"));
        for _ in 0..4 {
            connection(&php_a, t0, 1);
        }
        connection(&php_b, t0, 1);
        // steady: one connection open with work, and many monitoring connections.
        steady.connections.fetch_add(1, Ordering::Relaxed);
        steady.arrived();
        steady.app_connection_opened(t0);
        for _ in 0..10 {
            connection(&steady, t0, 0);
        }
        anon.connections.fetch_add(1, Ordering::Relaxed);
        anon.arrived();
        let report = |now| {
            table.report(now, |pairs| {
                let f = assess(pairs, &policy);
                let shown = f.iter().map(text).collect();
                (f, shown)
            })
        };
        let found = report(t0 + Duration::from_secs(1));
        let got: Vec<(RuleId, &str)> = found.iter().map(|f| (f.rule, f.app.as_str())).collect();
        assert_eq!(got, [(RuleId::C001, "php"), (RuleId::C002, "-")]);
        let rows = table.rows();
        let findings = |app: &str, driver: &str| {
            rows.iter()
                .find(|r| r.app == app && r.driver == driver)
                .map(|r| r.findings.clone())
                .unwrap()
        };
        // C001 is per application: on both of php's rows.
        assert_eq!(findings("php", "a 1"), ["C001"]);
        assert_eq!(findings("php", "b 1"), ["C001"]);
        assert!(findings("steady", "a 1").is_empty());
        assert_eq!(findings("-", "a 1"), ["C002"]);
        // Two minutes later, php's connections are out of the window and the unnamed one
        // closed: nothing holds, every list is cleared.
        anon.connections.fetch_sub(1, Ordering::Relaxed);
        assert!(report(t0 + Duration::from_secs(121)).is_empty());
        assert!(table.rows().iter().all(|r| r.findings.is_empty()));
    }
}
