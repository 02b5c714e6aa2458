//! Instrumentation of the session loops: per-request metrics, client and shape tables, and
//! the scrape-time source of the counters the proxy keeps itself.

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use prometheus_client::metrics::counter::Counter;

use super::{hello::ClientMetadata, inspect::Request, pooled::Pooled, Context, ProxyStats};
use crate::{
    audit::ViolationRecord,
    metrics::{commands, ClientEntry, Metrics, Pinned, PoolRow, Scrape, ShapeScratch, Snapshot},
    wire::Message,
};

/// Reads the proxy's own counters at scrape time.
pub(crate) struct ProxyScrape {
    pub stats: Arc<ProxyStats>,
    pub pooled: Option<Arc<Pooled>>,
    pub budget: Arc<super::client_io::MemoryBudget>,
    pub audit: Arc<crate::audit::AuditLog>,
}

impl std::fmt::Debug for ProxyScrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyScrape")
            .field("pooled", &self.pooled.is_some())
            .finish_non_exhaustive()
    }
}

impl Scrape for ProxyScrape {
    fn snapshot(&self) -> Snapshot {
        let s = &self.stats;
        let (pools, pinned) = match &self.pooled {
            Some(p) => {
                let pools = p
                    .pool
                    .keys()
                    .into_iter()
                    .map(|key| PoolRow {
                        stats: p.pool.stats(&key),
                        server: key.server.to_string(),
                        identity: key.identity,
                    })
                    .collect();
                let pinned = Pinned {
                    exhaust: p.pins.counts.exhaust.get(),
                    transaction: p.pins.counts.transaction.get(),
                    cursor: p.pins.counts.cursor.get(),
                    legacy_write: p.pins.counts.legacy_write.get(),
                };
                (Some(pools), pinned)
            }
            None => (None, Pinned::default()),
        };
        Snapshot {
            open_clients: s.active.get(),
            accepted: s.accepted.get(),
            rejected: s.rejected.get(),
            blocked: s.blocked.get(),
            policy_reloads: s.policy_reloads.get(),
            policy_reload_failures: s.policy_reload_failures.get(),
            allowlist_reloads: s.allowlist_reloads.get(),
            allowlist_reload_failures: s.allowlist_reload_failures.get(),
            users_reloads: s.users_reloads.get(),
            users_reload_failures: s.users_reload_failures.get(),
            tls_reloads: s.tls_reloads.get(),
            tls_reload_failures: s.tls_reload_failures.get(),
            upstream_tls_reloads: s.upstream_tls_reloads.get(),
            upstream_tls_reload_failures: s.upstream_tls_reload_failures.get(),
            config_restart_pending: s.config_restart_pending.get(),
            pools,
            pinned,
            memory_budget: (self.budget.in_use_bytes(), self.budget.limit_bytes()),
            audit_lost: {
                let (v, e) = (self.audit.counters(), self.audit.event_counters());
                crate::metrics::AuditLost {
                    violations_queue_full: v.dropped(),
                    violations_write_error: v.lines_not_written(),
                    events_queue_full: e.dropped(),
                    events_write_error: e.lines_not_written(),
                }
            },
        }
    }
}

/// Every violation record goes through here: metrics, the admin ring buffer, then the
/// audit log.
pub(crate) fn violation(ctx: &Context, rec: ViolationRecord) {
    ctx.metrics.violation(&rec);
    ctx.audit.record(rec);
}

/// One session's instrumentation. Dropping it ends whatever it counted as open.
pub(crate) struct SessionObs {
    metrics: Arc<Metrics>,
    client: Option<Arc<ClientEntry>>,
    app_requests: Option<Counter>,
    in_flight: bool,
    upstream_open: bool,
    /// Filled by the guard for the current request.
    pub scratch: ShapeScratch,
    processing: Duration,
    /// The first reply of the current request said `ok: 0`.
    pub reply_error: bool,
    /// The current request is a hello: monitoring hellos wait upstream on purpose
    /// (awaitable and streaming hello), so they are neither activity nor latency.
    hello: bool,
    /// Application requests of this connection (not hello, ping or authentication), for
    /// the connection standards (C001).
    app_requests_sent: u64,
}

impl SessionObs {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        SessionObs {
            metrics,
            client: None,
            app_requests: None,
            in_flight: false,
            upstream_open: false,
            scratch: ShapeScratch::default(),
            processing: Duration::ZERO,
            reply_error: false,
            hello: false,
            app_requests_sent: 0,
        }
    }

    /// Passthrough: the session's own upstream connection is being opened.
    pub(crate) fn upstream_connecting(&self) -> ConnectingGuard {
        self.metrics
            .live
            .upstream_connecting
            .fetch_add(1, Ordering::Relaxed);
        ConnectingGuard(self.metrics.clone())
    }

    /// Passthrough: the session's upstream connection is open (until the session ends).
    pub(crate) fn upstream_connected(&mut self) {
        if !self.upstream_open {
            self.upstream_open = true;
            self.metrics
                .live
                .upstream_open
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request arrived: the connection is active until [`Self::end`] (or until it turns
    /// out to be a hello).
    pub(crate) fn begin(&mut self) -> Instant {
        if !self.in_flight {
            self.in_flight = true;
            self.metrics.live.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        self.scratch.reset();
        self.reply_error = false;
        Instant::now()
    }

    /// The request was parsed and judged (started at `started`): counts it by command and
    /// client. The first request names the client (its hello's metadata, if any).
    pub(crate) fn inspected(
        &mut self,
        request: &Request,
        metadata: Option<&ClientMetadata>,
        started: Instant,
    ) {
        self.processing = started.elapsed();
        self.metrics.observe_processing(self.processing);
        self.metrics.request(request.command);
        self.hello = request.is_hello;
        if self.hello {
            self.end();
        }
        if self.client.is_none() {
            let app = self
                .metrics
                .apps
                .label(metadata.and_then(|m| m.application.as_deref()));
            let driver = self
                .metrics
                .drivers
                .label(metadata.and_then(|m| m.driver.as_deref()));
            self.app_requests = Some(self.metrics.app_counter(&app));
            let entry = self.metrics.clients.entry(app, driver);
            entry.connections.fetch_add(1, Ordering::Relaxed);
            entry.arrived();
            self.client = Some(entry);
        }
        let housekeeping = request.is_hello
            || commands::COMMANDS
                .get(request.command)
                .is_some_and(|name| crate::policy::connections::is_housekeeping(name));
        if !housekeeping {
            if self.app_requests_sent == 0 {
                if let Some(e) = &self.client {
                    e.app_connection_opened(Instant::now());
                }
            }
            self.app_requests_sent += 1;
        }
        if let Some(c) = &self.app_requests {
            c.inc();
        }
        if let Some(e) = &self.client {
            e.requests.fetch_add(1, Ordering::Relaxed);
            if self.scratch.violations > 0 {
                e.violations
                    .fetch_add(self.scratch.violations, Ordering::Relaxed);
            }
        }
    }

    /// Whether the first reply's error status is wanted (a tracked query shape).
    pub(crate) fn wants_first_reply(&self) -> bool {
        self.scratch.active
    }

    /// The first reply's error status, when the caller already read it.
    pub(crate) fn first_reply_error(&mut self, error: bool) {
        if self.scratch.active {
            self.reply_error = error;
        }
    }

    /// The request was forwarded and its last reply relayed after `round_trip`.
    pub(crate) fn forwarded(&mut self, round_trip: Duration) {
        if self.hello {
            return;
        }
        self.metrics.observe_roundtrip(round_trip);
        let total = self.processing + round_trip;
        self.metrics
            .shapes
            .record(&self.scratch, micros(total), self.reply_error);
    }

    /// mongoguard answered the request itself (`blocked`: by the policy).
    pub(crate) fn answered_locally(&mut self, blocked: bool) {
        self.metrics
            .shapes
            .record(&self.scratch, micros(self.processing), blocked);
    }

    /// The request is over: the connection is idle again.
    pub(crate) fn end(&mut self) {
        if self.in_flight {
            self.in_flight = false;
            self.metrics.live.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for SessionObs {
    fn drop(&mut self) {
        self.end();
        if let Some(e) = &self.client {
            e.connections.fetch_sub(1, Ordering::Relaxed);
            e.connection_closed(Instant::now(), self.app_requests_sent);
        }
        if self.upstream_open {
            self.metrics
                .live
                .upstream_open
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Uncounts a connecting upstream connection when dropped.
pub(crate) struct ConnectingGuard(Arc<Metrics>);

impl Drop for ConnectingGuard {
    fn drop(&mut self) {
        self.0
            .live
            .upstream_connecting
            .fetch_sub(1, Ordering::Relaxed);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The command label index of a client message (see [`commands`]).
pub(crate) fn command_label(msg: &Message<'_>, name: Option<&str>) -> usize {
    match (name, msg) {
        (Some(name), _) => commands::index_of(name),
        (None, m) => commands::legacy(m.op_code()),
    }
}
