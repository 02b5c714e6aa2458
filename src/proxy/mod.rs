//! The proxy: the client listener and the per-client sessions.
//!
//! A session ([`session`]) is one request pipeline; its upstream side is a strategy
//! ([`strategy`]): [`passthrough`] (one upstream connection per client) or [`pooled`]
//! (authentication terminated here, a pooled connection per request, [`pins`]).
//! Everything a session needs travels in one `Arc<Context>`, built by the composition root
//! ([`crate::app`]); there is no global state, so tests run several proxies in one process.

mod budget;
mod client_io;
pub(crate) mod conn_report;
pub mod control;
mod error;
pub mod guard;
pub(crate) mod hello;
pub(crate) mod inspect;
mod listener;
pub(crate) mod loops;
mod measure;
mod observe;
mod passthrough;
mod pins;
mod pooled;
pub(crate) mod refuse;
pub(crate) mod routing;
pub(crate) mod session;
mod stop;
mod strategy;
pub(crate) mod time_limit;
mod timer;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub(crate) use client_io::MemoryBudget;
pub use client_io::{MEMORY_BUDGET_CODE, MEMORY_BUDGET_CODE_NAME};
pub use error::{ProxyError, SessionError};
pub use hello::ClientMetadata;
pub use pins::PinnedCounts;
pub(crate) use pooled::Pooled;
pub use pooled::{CHECKOUT_TIMEOUT_CODE, CHECKOUT_TIMEOUT_CODE_NAME};

use crate::{
    audit::{AuditLog, CloseReason, Event},
    config::Config,
    metrics::Metrics,
    policy::PolicyHolder,
    upstream::topology::Topology,
    wire::RequestIds,
};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Subtracts one (gauges only).
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    /// Sets a gauge.
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Process-wide counters (exported as metrics by a later layer).
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub accepted: Counter,
    /// Client connections open now.
    pub active: Counter,
    /// Client connections closed at accept because `max_client_connections` was reached.
    pub rejected: Counter,
    /// Requests forwarded upstream.
    pub requests: Counter,
    /// Requests blocked by the policy (answered or dropped by mongoguard).
    pub blocked: Counter,
    /// Successful policy reloads.
    pub policy_reloads: Counter,
    /// Policy reloads refused (invalid file): the old policy stayed.
    pub policy_reload_failures: Counter,
    /// Successful allowlist reloads (enforce mode).
    pub allowlist_reloads: Counter,
    /// Allowlist reloads refused (unreadable or invalid file): the old allowlist stayed.
    pub allowlist_reload_failures: Counter,
    /// Successful users file reloads (pooled mode, SIGHUP).
    pub users_reloads: Counter,
    /// Users file reloads refused (unreadable or invalid file): the old users stayed.
    pub users_reload_failures: Counter,
    /// Successful TLS certificate reloads (SIGHUP).
    pub tls_reloads: Counter,
    /// TLS certificate reloads refused (unreadable or invalid files): the old ones stayed.
    pub tls_reload_failures: Counter,
    /// Successful reloads of the upstream URI's TLS files (SIGHUP).
    pub upstream_tls_reloads: Counter,
    /// Upstream TLS file reloads refused (unreadable or invalid files): the old ones stayed.
    pub upstream_tls_reload_failures: Counter,
    /// Gauge: settings changed in the configuration file that are not in force until a
    /// restart (as found at the last SIGHUP).
    pub config_restart_pending: Counter,
    /// Client connections whose TLS handshake failed (plaintext client, untrusted client
    /// certificate, timeout).
    pub tls_handshake_failures: Counter,
    /// Sessions closed because the client sent an invalid message.
    pub client_protocol_errors: Counter,
    /// Sessions closed because of the upstream (unreachable, closed, invalid, timed out).
    pub upstream_errors: Counter,
}

/// Shared state of one running proxy.
pub(crate) struct Context {
    pub config: Arc<Config>,
    pub policy: Arc<PolicyHolder>,
    pub audit: Arc<AuditLog>,
    pub stats: Arc<ProxyStats>,
    pub request_ids: RequestIds,
    /// Cancelled at shutdown: stop accepting, finish in-flight requests.
    pub drain: CancellationToken,
    /// Cancelled when the drain deadline passes: close everything now.
    pub kill: CancellationToken,
    pub limiter: Arc<Semaphore>,
    pub tracker: TaskTracker,
    /// The threads sessions run on (`None`: on the runtime that accepted them, as in tests
    /// that build a context by hand).
    pub loops: Option<loops::SessionLoops>,
    /// TLS on the listener.
    pub server_tls: Option<crate::tls::ServerTls>,
    /// TLS toward the upstream (from the URI).
    pub upstream_tls: Option<crate::tls::UpstreamTls>,
    /// Pooled mode's shared state (`None` in passthrough mode).
    pub pooled: Option<Arc<Pooled>>,
    /// Where the upstream servers are and which is primary (both modes; pooled mode's is
    /// the same as `pooled.topology`).
    pub topology: Arc<Topology>,
    /// The process-wide budget of client message bytes in flight.
    pub budget: Arc<MemoryBudget>,
    /// Metrics and the admin API's tables.
    pub metrics: Arc<Metrics>,
    /// The live connections and the pause gate (the admin API's operator actions).
    pub control: Arc<control::Control>,
    /// The plan guard (Q006, Q007): verdicts of query shapes, explained off the request path.
    pub plan: Arc<crate::plan::PlanGuard>,
    /// The learned allowlist (rule A001); off unless the composition root sets it.
    pub allowlist: Arc<crate::allowlist::Allowlist>,
}

impl Context {
    /// The shared state of a proxy in front of `topology` (and pooled mode's state), with the
    /// policy and audit log the composition root built; the proxy's own counters, memory
    /// budget and metrics registry are made here.
    pub(crate) fn new(
        config: Arc<Config>,
        policy: Arc<PolicyHolder>,
        audit: Arc<AuditLog>,
        topology: Arc<Topology>,
        pooled: Option<Arc<Pooled>>,
        (server_tls, upstream_tls): (
            Option<crate::tls::ServerTls>,
            Option<crate::tls::UpstreamTls>,
        ),
        plan: Arc<crate::plan::PlanGuard>,
    ) -> Context {
        let stats = Arc::new(ProxyStats::default());
        let budget = Arc::new(MemoryBudget::new(config.proxy.memory_budget));
        let scrape = Arc::new(observe::ProxyScrape {
            stats: stats.clone(),
            pooled: pooled.clone(),
            budget: budget.clone(),
            audit: audit.clone(),
        });
        let metrics = Arc::new(Metrics::new(&config.admin, scrape));
        if let Some(p) = &pooled {
            p.start_ender(metrics.clone());
        }
        Context {
            limiter: Arc::new(Semaphore::new(config.proxy.max_client_connections)),
            request_ids: RequestIds::default(),
            drain: CancellationToken::new(),
            kill: CancellationToken::new(),
            tracker: TaskTracker::new(),
            loops: None,
            config,
            policy,
            audit,
            stats,
            metrics,
            topology,
            pooled,
            budget,
            server_tls,
            upstream_tls,
            control: Arc::new(control::Control::default()),
            plan,
            allowlist: Arc::new(crate::allowlist::Allowlist::off()),
        }
    }
}

impl Context {
    /// Starts the drain: the listener stops accepting, idle sessions end, in-flight requests
    /// finish.
    pub(crate) fn start_drain(&self) {
        self.drain.cancel();
        self.control.fire_all(stop::DRAIN);
    }

    /// The drain deadline: every session ends at its next await.
    pub(crate) fn kill_all(&self) {
        self.kill.cancel();
        self.control.fire_all(stop::KILL | stop::DRAIN);
    }
}

/// Accepts clients on `listener` until the drain starts (each client: a session task).
pub(crate) async fn serve(listener: TcpListener, ctx: Arc<Context>) {
    listener::accept_loop(listener, ctx).await
}

/// The event for a client connection that ended (`None`: refused at accept).
fn close_event(
    client: SocketAddr,
    duration: std::time::Duration,
    result: Option<&Result<session::End, SessionError>>,
) -> Event {
    let reason = match result {
        None => CloseReason::Rejected,
        Some(Ok(session::End::ClientClosed)) => CloseReason::ClientClosed,
        Some(Ok(session::End::Idle)) => CloseReason::Idle,
        Some(Ok(session::End::Drained)) | Some(Err(SessionError::Killed)) => CloseReason::Shutdown,
        Some(Err(e)) if e.is_upstream() => CloseReason::UpstreamError,
        Some(Err(_)) => CloseReason::ClientError,
    };
    Event::ConnectionClosed {
        client,
        duration,
        reason,
    }
}
