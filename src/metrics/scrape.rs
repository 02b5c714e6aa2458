//! The metrics read at scrape time from their owners (the [`Scrape`] source and the
//! sessions' [`Live`] gauges) rather than counted twice, in exposition order.

use std::sync::{atomic::Ordering, Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
};

use super::{Live, PoolRow, Scrape, Snapshot};
use crate::upstream::pool::PoolStats;

/// Encodes the scrape-time metrics.
#[derive(Debug)]
pub(super) struct ScrapeCollector {
    pub(super) source: Arc<dyn Scrape>,
    pub(super) live: Arc<Live>,
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
    )?;
    per_pool(
        encoder,
        pools,
        (
            "mongoguard_pool_slots_moved",
            "Pool slots one session thread's shard took from another's (pooled sessions on \
             the session threads: load uneven between threads)",
            MetricType::Counter,
        ),
        |s| ConstCounter::new(s.moves),
    )?;
    per_pool(
        encoder,
        pools,
        (
            "mongoguard_pool_requests_sent_ahead",
            "Requests a released upstream connection carried for the client waiting for it, \
             written before the hand-over (pooled sessions on the session threads)",
            MetricType::Counter,
        ),
        |s| ConstCounter::new(s.sent_ahead),
    )
}

fn to_i64_u(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self.source.snapshot();
        let in_flight = self.client_connections(&mut encoder, &s)?;
        self.upstream_connections(&mut encoder, &s, in_flight)?;
        requests_and_pools(&mut encoder, &s)?;
        reloads_and_log(&mut encoder, &s)
    }
}

impl ScrapeCollector {
    /// Client connections by state, accepted and rejected; returns the requests in flight.
    fn client_connections(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        s: &Snapshot,
    ) -> Result<i64, std::fmt::Error> {
        let open = i64::try_from(s.open_clients).unwrap_or(i64::MAX);
        let in_flight = self.live.in_flight.load(Ordering::Relaxed).clamp(0, open);
        gauge(
            encoder,
            "mongoguard_client_connections",
            "Client connections by state (active: a request in flight)",
            "state",
            &[("active", in_flight), ("idle", open - in_flight)],
        )?;
        counter(
            encoder,
            "mongoguard_client_connections_accepted",
            "Client connections accepted",
            s.accepted,
        )?;
        counter(
            encoder,
            "mongoguard_client_connections_rejected",
            "Client connections closed at accept (max_client_connections)",
            s.rejected,
        )?;
        Ok(in_flight)
    }

    /// Upstream connections by state: the pools' in pooled mode, the sessions' own in
    /// passthrough (active while their client has a request in flight).
    fn upstream_connections(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        s: &Snapshot,
        in_flight: i64,
    ) -> Result<(), std::fmt::Error> {
        let r = Ordering::Relaxed;
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
            encoder,
            "mongoguard_upstream_connections",
            "Upstream connections by state",
            "state",
            &[
                ("active", upstream[0]),
                ("idle", upstream[1]),
                ("connecting", upstream[2]),
            ],
        )
    }
}

/// The memory budget, blocked requests, each pool, and pinned upstream state.
fn requests_and_pools(
    encoder: &mut DescriptorEncoder<'_>,
    s: &Snapshot,
) -> Result<(), std::fmt::Error> {
    let (in_use, limit) = s.memory_budget;
    gauge(
        encoder,
        "mongoguard_memory_budget_bytes",
        "Client message bytes held from proxy.memory_budget (in_use) and the budget (limit)",
        "state",
        &[("in_use", to_i64_u(in_use)), ("limit", to_i64_u(limit))],
    )?;
    counter(
        encoder,
        "mongoguard_blocked_requests",
        "Requests blocked by the policy (answered or dropped by mongoguard)",
        s.blocked,
    )?;
    pool_metrics(encoder, s.pools.as_deref().unwrap_or(&[]))?;
    let p = s.pinned;
    gauge(
        encoder,
        "mongoguard_pinned_connections",
        "Pinned upstream state by reason (pooled mode)",
        "reason",
        &[
            ("exhaust", to_i64_u(p.exhaust)),
            ("transaction", to_i64_u(p.transaction)),
            ("cursor", to_i64_u(p.cursor)),
            ("legacy_write", to_i64_u(p.legacy_write)),
        ],
    )
}

/// Policy reloads (done and refused) and log lines dropped.
fn reloads_and_log(
    encoder: &mut DescriptorEncoder<'_>,
    s: &Snapshot,
) -> Result<(), std::fmt::Error> {
    counter(
        encoder,
        "mongoguard_policy_reloads",
        "Successful policy reloads",
        s.policy_reloads,
    )?;
    counter(
        encoder,
        "mongoguard_policy_reload_failures",
        "Policy reloads refused (invalid file; the old policy stayed)",
        s.policy_reload_failures,
    )?;
    counter(
        encoder,
        "mongoguard_allowlist_reloads",
        "Successful allowlist reloads (allowlist enforce mode)",
        s.allowlist_reloads,
    )?;
    counter(
        encoder,
        "mongoguard_allowlist_reload_failures",
        "Allowlist reloads refused (unreadable or invalid file; the old allowlist stayed)",
        s.allowlist_reload_failures,
    )?;
    counter(
        encoder,
        "mongoguard_users_reloads",
        "Successful users file reloads (pooled mode, SIGHUP)",
        s.users_reloads,
    )?;
    counter(
        encoder,
        "mongoguard_users_reload_failures",
        "Users file reloads refused (unreadable or invalid file; the old users stayed)",
        s.users_reload_failures,
    )?;
    counter(
        encoder,
        "mongoguard_tls_reloads",
        "Successful TLS certificate reloads (SIGHUP)",
        s.tls_reloads,
    )?;
    counter(
        encoder,
        "mongoguard_tls_reload_failures",
        "TLS certificate reloads refused (unreadable or invalid files; the old ones stayed)",
        s.tls_reload_failures,
    )?;
    counter(
        encoder,
        "mongoguard_upstream_tls_reloads",
        "Successful reloads of the upstream URI's tlsCAFile and tlsCertificateKeyFile (SIGHUP)",
        s.upstream_tls_reloads,
    )?;
    counter(
        encoder,
        "mongoguard_upstream_tls_reload_failures",
        "Upstream TLS file reloads refused (unreadable or invalid files; the old ones stayed)",
        s.upstream_tls_reload_failures,
    )?;
    let m = encoder.encode_descriptor(
        "mongoguard_config_restart_pending_settings",
        "Settings changed in the configuration file that are not in force until a restart \
         (found at the last SIGHUP; 0 when the file matches the running configuration)",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(to_i64_u(s.config_restart_pending)).encode(m)?;
    counter(
        encoder,
        "mongoguard_log_lines_dropped",
        "Log lines dropped because the queue to standard error was full (a slow or \
         unread standard error) or writing them failed (a full disk); requests never wait \
         for the log",
        crate::logging::dropped_lines(),
    )?;
    let lost = s.audit_lost;
    let mut m = encoder.encode_descriptor(
        "mongoguard_audit_lines_lost",
        "Violation records and events that never reached their sink: dropped on a full \
         queue (a slow sink) or not written (a full disk, a removed directory)",
        None,
        MetricType::Counter,
    )?;
    for (stream, reason, v) in [
        ("violations", "queue_full", lost.violations_queue_full),
        ("violations", "write_error", lost.violations_write_error),
        ("events", "queue_full", lost.events_queue_full),
        ("events", "write_error", lost.events_write_error),
    ] {
        ConstCounter::new(v).encode(m.encode_family(&[("stream", stream), ("reason", reason)])?)?;
    }
    Ok(())
}
