//! Metrics and the in-memory tables behind the admin API.
//!
//! [`Metrics`] owns a prometheus-client registry. Labels come only from bounded sets: the
//! fixed command list ([`commands::COMMANDS`]), rule ids, actions and modes, connection
//! states, pin reasons, configured upstream servers and identities, and application names
//! capped at `admin.app_name_cap` (first come; the rest are "other").
//!
//! The request path touches only pre-created handles (atomics, and one histogram lock per
//! observation): a session resolves its application's counter once, at its first request.
//! Everything that already has a counter elsewhere (pool gauges, pinned counts, accepted and
//! rejected connections, blocked requests, policy reloads) is read at scrape time through a
//! [`Scrape`] source instead of being counted twice; so is the process-wide count of log
//! lines dropped ([`crate::logging::dropped_lines`]).

pub mod clients;
pub mod commands;
pub mod labels;
pub mod latency;
mod scrape;
pub mod shapes;
pub mod violations;

use std::{
    fmt::Write as _,
    sync::{atomic::AtomicI64, Arc},
    time::Duration,
};

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

use crate::{audit::ViolationRecord, config::AdminConfig, upstream::pool::PoolStats};
use scrape::ScrapeCollector;

pub use clients::{ClientEntry, ClientRow, ClientTable};
pub use labels::CappedLabels;
pub use shapes::{ShapeRow, ShapeScratch, ShapeSort, ShapeTable};
pub use violations::{ViolationLog, ViolationStats};

/// One upstream pool at scrape time.
#[derive(Debug, Clone)]
pub struct PoolRow {
    /// `host:port`.
    pub server: String,
    /// Upstream identity name.
    pub identity: String,
    /// Its gauges and counters.
    pub stats: PoolStats,
}

/// Pinned upstream state by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pinned {
    /// Exhaust streams holding a connection.
    pub exhaust: u64,
    /// Transactions pinned to a server.
    pub transaction: u64,
    /// Cursors pinned to a server.
    pub cursor: u64,
    /// Connections kept after a legacy write for its getLastError.
    pub legacy_write: u64,
}

/// Counters kept elsewhere, read at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Client connections open now.
    pub open_clients: u64,
    /// Client connections accepted since start.
    pub accepted: u64,
    /// Client connections closed at accept (connection cap).
    pub rejected: u64,
    /// Requests blocked by the policy.
    pub blocked: u64,
    /// Successful policy reloads.
    pub policy_reloads: u64,
    /// Refused policy reloads.
    pub policy_reload_failures: u64,
    /// Successful allowlist reloads.
    pub allowlist_reloads: u64,
    /// Refused allowlist reloads.
    pub allowlist_reload_failures: u64,
    /// Successful users file reloads (pooled mode).
    pub users_reloads: u64,
    /// Refused users file reloads.
    pub users_reload_failures: u64,
    /// Successful TLS certificate reloads.
    pub tls_reloads: u64,
    /// Refused TLS certificate reloads.
    pub tls_reload_failures: u64,
    /// Successful upstream TLS file reloads (tlsCAFile, tlsCertificateKeyFile).
    pub upstream_tls_reloads: u64,
    /// Refused upstream TLS file reloads.
    pub upstream_tls_reload_failures: u64,
    /// Settings changed in the configuration file, not in force until a restart.
    pub config_restart_pending: u64,
    /// Pooled mode: every pool. `None` in passthrough mode.
    pub pools: Option<Vec<PoolRow>>,
    /// Pinned counts (zeros in passthrough mode).
    pub pinned: Pinned,
    /// Bytes of client messages held from the memory budget now, and the budget.
    pub memory_budget: (u64, u64),
    /// Audit lines lost: (violations, events) × (queue full or closed, write failed).
    pub audit_lost: AuditLost,
}

/// Lines of the two audit streams that never reached their sink.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditLost {
    /// Violation records and summaries dropped on a full (or closed) queue.
    pub violations_queue_full: u64,
    /// Violation records and summaries whose write failed.
    pub violations_write_error: u64,
    /// Events dropped on a full (or closed) queue.
    pub events_queue_full: u64,
    /// Events whose write failed.
    pub events_write_error: u64,
}

/// Where scrape-time values come from (the proxy).
pub trait Scrape: std::fmt::Debug + Send + Sync + 'static {
    /// The current values.
    fn snapshot(&self) -> Snapshot;
}

/// Gauges maintained by the sessions themselves.
#[derive(Debug, Default)]
pub struct Live {
    /// Client requests in flight (a client connection is "active" while one is).
    pub in_flight: AtomicI64,
    /// Passthrough: upstream connections being opened.
    pub upstream_connecting: AtomicI64,
    /// Passthrough: upstream connections open.
    pub upstream_open: AtomicI64,
}

type ViolationLabels = [(&'static str, &'static str); 3];
type AppLabel = [(&'static str, String); 1];

/// The metrics registry and the admin tables of one proxy.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Vec<Counter>,
    requests_by_app: Family<AppLabel, Counter>,
    violations_total: Family<ViolationLabels, Counter>,
    roundtrip: latency::LatencyHistogram,
    processing: latency::LatencyHistogram,
    tls_handshake_failures: Counter,
    /// Blast-radius measurements: `[answered, failed]`.
    measurements: [Counter; 2],
    /// Reads sent with `maxTimeMS` set or lowered by `request_time_limit`.
    pub time_limited: Counter,
    /// Pooled mode's endSessions answered by mongoguard: `[answered, sent, failed]` (see
    /// [`EndSessions`]).
    end_sessions: [Counter; 3],
    /// Client connections refused by a connection limit, by [`Limit`].
    refused: [Counter; 4],
    /// Client requests that arrived compressed (OP_COMPRESSED).
    pub compressed_requests: Counter,
    measure_seconds: Histogram,
    /// Session-maintained gauges.
    pub live: Arc<Live>,
    /// Application labels (capped).
    pub apps: CappedLabels,
    /// Driver labels (capped like applications).
    pub drivers: CappedLabels,
    /// `/clients`.
    pub clients: ClientTable,
    /// `/shapes`.
    pub shapes: ShapeTable,
    /// `/violations` and `/stats/violations`.
    pub violations: ViolationLog,
    source: Arc<dyn Scrape>,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 50 µs to ~105 s.
    exponential_buckets(0.000_05, 2.0, 22)
}

/// What became of the sessions of a client's endSessions in pooled mode
/// (`mongoguard_end_sessions{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSessions {
    /// Answered by mongoguard and queued for the upstream.
    Answered,
    /// Ended on the upstream by mongoguard's own endSessions.
    Sent,
    /// Not ended upstream (no server, no connection, an error): the server expires them.
    Failed,
}

/// A connection limit (`mongoguard_connections_refused{limit}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `proxy.max_client_connections`.
    Global = 0,
    /// `pool.max_connections_per_app`.
    App = 1,
    /// `pool.max_connections_per_user`.
    User = 2,
    /// `pool.max_connections_per_network`.
    Network = 3,
}

impl Metrics {
    /// Counts a connection refused by `limit`.
    pub fn refused(&self, limit: Limit) {
        if let Some(c) = self.refused.get(limit as usize) {
            c.inc();
        }
    }

    /// A registry with every metric README "Metrics and admin API" lists; `source` supplies
    /// scrape-time values.
    // Long because it is the list of registered metrics, one registration each, in
    // exposition order; split, the list would be harder to check against the README.
    pub fn new(config: &AdminConfig, source: Arc<dyn Scrape>) -> Metrics {
        let mut registry = Registry::default();
        let by_command = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let requests = commands::COMMANDS
            .iter()
            .map(|c| by_command.get_or_create(&[("command", *c)]).clone())
            .collect();
        registry.register(
            "mongoguard_requests",
            "Client requests by command (a fixed list of names; anything else is \"other\")",
            by_command,
        );
        let requests_by_app = Family::<AppLabel, Counter>::default();
        registry.register(
            "mongoguard_requests_by_app",
            "Client requests by application name (capped by admin.app_name_cap)",
            requests_by_app.clone(),
        );
        let violations_total = Family::<ViolationLabels, Counter>::default();
        registry.register(
            "mongoguard_violations",
            "Policy violations by rule, action and mode",
            violations_total.clone(),
        );
        let roundtrip = latency::LatencyHistogram::default();
        registry.register(
            "mongoguard_upstream_roundtrip_seconds",
            "Time from sending a request upstream to relaying its last reply",
            roundtrip.clone(),
        );
        let processing = latency::LatencyHistogram::default();
        registry.register(
            "mongoguard_processing_seconds",
            "mongoguard's own time per request: parse, policy and bookkeeping",
            processing.clone(),
        );
        let tls_handshake_failures = Counter::default();
        registry.register(
            "mongoguard_tls_handshake_failures",
            "TLS handshakes that failed",
            tls_handshake_failures.clone(),
        );
        let by_result = Family::<[(&'static str, &'static str); 1], Counter>::default();
        // One statement each: a family's read guard lives to the end of its statement, and
        // a second get_or_create in the same statement would wait on it forever.
        let answered = by_result.get_or_create(&[("result", "answered")]).clone();
        let failed = by_result.get_or_create(&[("result", "failed")]).clone();
        let measurements = [answered, failed];
        registry.register(
            "mongoguard_measurements",
            "Blast-radius measurements of multi-document writes not proved selective, by result",
            by_result,
        );
        let time_limited = Counter::default();
        registry.register(
            "mongoguard_request_time_limited",
            "Reads sent with maxTimeMS set or lowered to [proxy] request_time_limit",
            time_limited.clone(),
        );
        let by_outcome = Family::<[(&'static str, &'static str); 1], Counter>::default();
        // One statement each (see mongoguard_measurements).
        let answered = by_outcome.get_or_create(&[("outcome", "answered")]).clone();
        let sent = by_outcome.get_or_create(&[("outcome", "sent")]).clone();
        let failed = by_outcome.get_or_create(&[("outcome", "failed")]).clone();
        let end_sessions = [answered, sent, failed];
        registry.register(
            "mongoguard_end_sessions",
            "Pooled mode: sessions of client endSessions commands mongoguard answered itself \
             (answered), then ended upstream in the background (sent) or could not (failed: \
             the server expires them after its session timeout)",
            by_outcome,
        );
        let by_limit = Family::<[(&'static str, &'static str); 1], Counter>::default();
        // One statement each (see mongoguard_measurements).
        let global = by_limit
            .get_or_create(&[("limit", "max_client_connections")])
            .clone();
        let app = by_limit
            .get_or_create(&[("limit", "max_connections_per_app")])
            .clone();
        let user = by_limit
            .get_or_create(&[("limit", "max_connections_per_user")])
            .clone();
        let network = by_limit
            .get_or_create(&[("limit", "max_connections_per_network")])
            .clone();
        let refused = [global, app, user, network];
        registry.register(
            "mongoguard_connections_refused",
            "Client connections refused with an error by a connection limit, by limit",
            by_limit,
        );
        let compressed_requests = Counter::default();
        registry.register(
            "mongoguard_compressed_requests",
            "Client requests that arrived compressed (OP_COMPRESSED)",
            compressed_requests.clone(),
        );
        let measure_seconds = Histogram::new(latency_buckets());
        registry.register(
            "mongoguard_measure_seconds",
            "Time to measure one statement (its two queries) before forwarding the write",
            measure_seconds.clone(),
        );
        let live = Arc::new(Live::default());
        registry.register_collector(Box::new(ScrapeCollector {
            source: source.clone(),
            live: live.clone(),
        }));
        Metrics {
            registry,
            requests,
            requests_by_app,
            violations_total,
            roundtrip,
            processing,
            tls_handshake_failures,
            measurements,
            time_limited,
            end_sessions,
            refused,
            compressed_requests,
            measure_seconds,
            live,
            apps: CappedLabels::new(config.app_name_cap),
            drivers: CappedLabels::new(config.app_name_cap),
            clients: ClientTable::default(),
            shapes: ShapeTable::new(config.shapes_capacity),
            violations: ViolationLog::new(config.violations_buffer),
            source,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
            let _ = writeln!(out, "# EOF");
        }
        out
    }

    /// The scrape-time values (also used by `/pool`).
    pub fn snapshot(&self) -> Snapshot {
        self.source.snapshot()
    }

    /// The request counter of a command label index ([`commands::index_of`]).
    pub fn request(&self, command: usize) {
        if let Some(c) = self.requests.get(command) {
            c.inc();
        }
    }

    /// The per-application request counter of a (capped) application label.
    pub fn app_counter(&self, app: &str) -> Counter {
        self.requests_by_app
            .get_or_create(&[("app", app.to_owned())])
            .clone()
    }

    /// Records mongoguard's own time for one request.
    pub fn observe_processing(&self, d: Duration) {
        self.processing.observe(d);
    }

    /// Records one upstream round trip.
    pub fn observe_roundtrip(&self, d: Duration) {
        self.roundtrip.observe(d);
    }

    /// Counts a violation and keeps it for `/violations`.
    pub fn violation(&self, rec: &ViolationRecord) {
        self.violations_total
            .get_or_create(&[
                ("rule", rec.rule_id),
                ("action", rec.action.as_str()),
                ("mode", rec.mode.as_str()),
            ])
            .inc();
        let app = self.apps.label(rec.app_name.as_deref());
        self.violations.push(rec, app);
    }

    /// One statement was measured (`failed`: its measurement did not answer).
    pub fn measured(&self, failed: bool, took: Duration) {
        let [answered, fail] = &self.measurements;
        if failed {
            fail.inc();
        } else {
            answered.inc();
        }
        self.measure_seconds.observe(took.as_secs_f64());
    }

    /// Counts `n` sessions of a client's endSessions at `outcome`.
    pub fn end_sessions(&self, outcome: EndSessions, n: usize) {
        let i = match outcome {
            EndSessions::Answered => 0,
            EndSessions::Sent => 1,
            EndSessions::Failed => 2,
        };
        if let Some(c) = self.end_sessions.get(i) {
            c.inc_by(n as u64);
        }
    }

    /// Counts a failed TLS handshake.
    pub fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.inc();
    }
}
