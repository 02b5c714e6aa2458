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
pub mod shapes;
pub mod violations;

use std::{
    fmt::Write as _,
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::Duration,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::ConstGauge,
        histogram::{exponential_buckets, Histogram},
        MetricType,
    },
    registry::Registry,
};

use crate::{audit::ViolationRecord, config::AdminConfig, upstream::pool::PoolStats};

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
    /// Pooled mode: every pool. `None` in passthrough mode.
    pub pools: Option<Vec<PoolRow>>,
    /// Pinned counts (zeros in passthrough mode).
    pub pinned: Pinned,
    /// Bytes of client messages held from the memory budget now, and the budget.
    pub memory_budget: (u64, u64),
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
    roundtrip: Histogram,
    processing: Histogram,
    tls_handshake_failures: Counter,
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

impl Metrics {
    /// A registry with every metric README "Metrics and admin API" lists; `source` supplies scrape-time values.
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
        let roundtrip = Histogram::new(latency_buckets());
        registry.register(
            "mongoguard_upstream_roundtrip_seconds",
            "Time from sending a request upstream to relaying its last reply",
            roundtrip.clone(),
        );
        let processing = Histogram::new(latency_buckets());
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
        self.processing.observe(d.as_secs_f64());
    }

    /// Records one upstream round trip.
    pub fn observe_roundtrip(&self, d: Duration) {
        self.roundtrip.observe(d.as_secs_f64());
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

    /// Counts a failed TLS handshake.
    pub fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.inc();
    }
}

/// Encodes the scrape-time metrics.
#[derive(Debug)]
struct ScrapeCollector {
    source: Arc<dyn Scrape>,
    live: Arc<Live>,
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &'static str,
    values: &[(&str, i64)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, v) in values {
        ConstGauge::new(*v).encode(m.encode_family(&[(label, *value)])?)?;
    }
    Ok(())
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

fn to_i64(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One metric with a series per pool, labelled by server and identity.
fn per_pool<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    pools: &[PoolRow],
    (name, help, kind): (&str, &str, MetricType),
    value: impl Fn(&PoolStats) -> M,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, kind)?;
    for p in pools {
        let labels = [
            ("server", p.server.as_str()),
            ("identity", p.identity.as_str()),
        ];
        value(&p.stats).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// PgBouncer-style gauges and counters of each pool.
fn pool_metrics(
    encoder: &mut DescriptorEncoder<'_>,
    pools: &[PoolRow],
) -> Result<(), std::fmt::Error> {
    type Get = fn(&PoolStats) -> usize;
    let counts: [(&str, &str, Get); 4] = [
        (
            "mongoguard_pool_clients_active",
            "Client requests holding an upstream connection (cl_active)",
            |s| s.in_use,
        ),
        (
            "mongoguard_pool_clients_waiting",
            "Client requests waiting for an upstream connection (cl_waiting)",
            |s| s.waiting,
        ),
        (
            "mongoguard_pool_servers_active",
            "Upstream connections checked out (sv_active)",
            |s| s.in_use,
        ),
        (
            "mongoguard_pool_servers_idle",
            "Idle upstream connections in the pool (sv_idle)",
            |s| s.idle,
        ),
    ];
    let gauge = MetricType::Gauge;
    for (name, help, get) in counts {
        per_pool(encoder, pools, (name, help, gauge), |s| {
            ConstGauge::new(to_i64(get(s)))
        })?;
    }
    per_pool(
        encoder,
        pools,
        (
            "mongoguard_pool_max_wait_seconds",
            "Longest wait for an upstream connection observed (maxwait)",
            gauge,
        ),
        |s| ConstGauge::new(s.max_wait.as_secs_f64()),
    )?;
    per_pool(
        encoder,
        pools,
        (
            "mongoguard_pool_checkout_timeouts",
            "Requests that waited checkout_timeout for an upstream connection and failed",
            MetricType::Counter,
        ),
        |s| ConstCounter::new(s.timeouts),
    )
}

fn to_i64_u(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self.source.snapshot();
        let r = Ordering::Relaxed;
        let open = i64::try_from(s.open_clients).unwrap_or(i64::MAX);
        let in_flight = self.live.in_flight.load(r).clamp(0, open);
        gauge(
            &mut encoder,
            "mongoguard_client_connections",
            "Client connections by state (active: a request in flight)",
            "state",
            &[("active", in_flight), ("idle", open - in_flight)],
        )?;
        counter(
            &mut encoder,
            "mongoguard_client_connections_accepted",
            "Client connections accepted",
            s.accepted,
        )?;
        counter(
            &mut encoder,
            "mongoguard_client_connections_rejected",
            "Client connections closed at accept (max_client_connections)",
            s.rejected,
        )?;
        let upstream = match &s.pools {
            Some(pools) => {
                let sum =
                    |f: fn(&PoolStats) -> usize| to_i64(pools.iter().map(|p| f(&p.stats)).sum());
                [sum(|s| s.in_use), sum(|s| s.idle), sum(|s| s.connecting)]
            }
            None => {
                let open = self.live.upstream_open.load(r).max(0);
                let active = in_flight.min(open);
                [
                    active,
                    open - active,
                    self.live.upstream_connecting.load(r).max(0),
                ]
            }
        };
        gauge(
            &mut encoder,
            "mongoguard_upstream_connections",
            "Upstream connections by state",
            "state",
            &[
                ("active", upstream[0]),
                ("idle", upstream[1]),
                ("connecting", upstream[2]),
            ],
        )?;
        let (in_use, limit) = s.memory_budget;
        gauge(
            &mut encoder,
            "mongoguard_memory_budget_bytes",
            "Client message bytes held from proxy.memory_budget (in_use) and the budget (limit)",
            "state",
            &[("in_use", to_i64_u(in_use)), ("limit", to_i64_u(limit))],
        )?;
        counter(
            &mut encoder,
            "mongoguard_blocked_requests",
            "Requests blocked by the policy (answered or dropped by mongoguard)",
            s.blocked,
        )?;
        pool_metrics(&mut encoder, s.pools.as_deref().unwrap_or(&[]))?;
        let p = s.pinned;
        let pinned = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "mongoguard_pinned_connections",
            "Pinned upstream state by reason (pooled mode)",
            "reason",
            &[
                ("exhaust", pinned(p.exhaust)),
                ("transaction", pinned(p.transaction)),
                ("cursor", pinned(p.cursor)),
                ("legacy_write", pinned(p.legacy_write)),
            ],
        )?;
        counter(
            &mut encoder,
            "mongoguard_policy_reloads",
            "Successful policy reloads",
            s.policy_reloads,
        )?;
        counter(
            &mut encoder,
            "mongoguard_policy_reload_failures",
            "Policy reloads refused (invalid file; the old policy stayed)",
            s.policy_reload_failures,
        )?;
        counter(
            &mut encoder,
            "mongoguard_log_lines_dropped",
            "Log lines dropped because the queue to standard error was full (a slow or \
             unread standard error); requests never wait for the log",
            crate::logging::dropped_lines(),
        )?;
        Ok(())
    }
}
