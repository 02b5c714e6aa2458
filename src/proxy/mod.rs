//! The proxy: listener, per-client sessions, handshake handling, graceful shutdown.
//!
//! [`Proxy::start`] binds and returns a [`ProxyHandle`]; everything a session needs travels in
//! one `Arc<Context>` (no global state, so tests run several proxies in one process).

mod client_io;
mod error;
pub mod guard;
pub(crate) mod hello;
pub(crate) mod inspect;
mod listener;
mod observe;
mod passthrough;
mod pins;
mod pooled;
pub(crate) mod routing;
pub(crate) mod session;
mod strategy;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use tokio::{net::TcpListener, sync::Semaphore, task::JoinHandle};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{info, warn};

pub use client_io::{MEMORY_BUDGET_CODE, MEMORY_BUDGET_CODE_NAME};
pub use error::{ProxyError, SessionError};
pub use hello::ClientMetadata;
pub use pins::PinnedCounts;
pub use pooled::{CHECKOUT_TIMEOUT_CODE, CHECKOUT_TIMEOUT_CODE_NAME};

use crate::{
    audit::{AuditLog, CloseReason, Event},
    config::Config,
    metrics::Metrics,
    policy::{PolicyHolder, PolicySource},
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
    /// TLS on the listener.
    pub server_tls: Option<crate::tls::ServerTls>,
    /// TLS toward the upstream (from the URI).
    pub upstream_tls: Option<crate::tls::UpstreamTls>,
    /// Pooled mode's shared state (`None` in passthrough mode).
    pub pooled: Option<Arc<pooled::Pooled>>,
    /// Where the upstream servers are and which is primary (both modes; pooled mode's is
    /// the same as `pooled.topology`).
    pub topology: Arc<crate::upstream::topology::Topology>,
    /// The process-wide budget of client message bytes in flight.
    pub budget: Arc<client_io::MemoryBudget>,
    /// Stops the background tasks (topology monitors) at the end of shutdown.
    pub background: CancellationToken,
    /// Metrics and the admin API's tables.
    pub metrics: Arc<Metrics>,
}

/// How long shutdown waits for sessions after killing them, and for the admin listener and
/// the audit writer, before it ends anyway.
const KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The entry point.
pub struct Proxy;

impl Proxy {
    /// Binds the listen address and starts accepting clients in the background.
    pub async fn start(config: Arc<Config>) -> Result<ProxyHandle, ProxyError> {
        let policy =
            PolicyHolder::load(config.policy.file.as_deref()).map_err(ProxyError::Policy)?;
        Self::start_with_policy(config, policy).await
    }

    /// Like [`Proxy::start`], with an already loaded policy.
    pub async fn start_with_policy(
        config: Arc<Config>,
        policy: PolicyHolder,
    ) -> Result<ProxyHandle, ProxyError> {
        let audit = Arc::new(AuditLog::start(&config.audit).map_err(ProxyError::Audit)?);
        let policy = Arc::new(policy);
        let addr = config.proxy.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ProxyError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ProxyError::Bind { addr, source })?;
        let server_tls = if config.tls.enabled() {
            Some(crate::tls::ServerTls::load(&config.tls).map_err(ProxyError::Tls)?)
        } else {
            None
        };
        let upstream_tls =
            crate::tls::UpstreamTls::from_uri(&config.upstream.uri).map_err(ProxyError::Tls)?;
        let admin_token = config.admin.load_token().map_err(ProxyError::Admin)?;
        let admin_listener = match config.admin.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| ProxyError::Bind { addr, source })?,
            ),
            None => None,
        };
        let admin_addr = match &admin_listener {
            Some(l) => Some(l.local_addr().map_err(|source| ProxyError::Bind {
                addr: config.admin.listen.unwrap_or(addr),
                source,
            })?),
            None => None,
        };
        let pooled = match config.proxy.mode {
            crate::config::Mode::Pooled => {
                Some(pooled::Pooled::start(&config, upstream_tls.clone())?)
            }
            crate::config::Mode::Passthrough => None,
        };
        let background = CancellationToken::new();
        let topology = match &pooled {
            Some(p) => p.topology.clone(),
            None => {
                let t = crate::upstream::topology::Topology::from_uri(&config.upstream.uri);
                t.spawn_monitors(
                    crate::upstream::topology::MonitorSettings {
                        heartbeat: config.upstream.heartbeat_interval,
                        connect_timeout: config.upstream.connect_timeout,
                        max_message_size: config.proxy.max_message_size,
                        tls: upstream_tls.clone(),
                    },
                    background.clone(),
                );
                t
            }
        };
        let stats = Arc::new(ProxyStats::default());
        let budget = Arc::new(client_io::MemoryBudget::new(config.proxy.memory_budget));
        let metrics = Arc::new(Metrics::new(
            &config.admin,
            Arc::new(observe::ProxyScrape {
                stats: stats.clone(),
                pooled: pooled.clone(),
                budget: budget.clone(),
            }),
        ));
        let ctx = Arc::new(Context {
            pooled,
            topology,
            budget,
            background,
            server_tls,
            upstream_tls,
            metrics,
            stats,
            request_ids: RequestIds::default(),
            drain: CancellationToken::new(),
            kill: CancellationToken::new(),
            limiter: Arc::new(Semaphore::new(config.proxy.max_client_connections)),
            tracker: TaskTracker::new(),
            policy,
            audit,
            config,
        });
        info!(
            listen = %local_addr,
            upstream = %ctx.config.upstream.uri,
            mode = ?ctx.config.proxy.mode,
            policy = %ctx.policy.source(),
            policy_mode = ctx.policy.current().mode().as_str(),
            "mongoguard listening"
        );
        // Installed before anything else can be signalled: SIGHUP's default action kills.
        let reload = tokio::spawn(reload_on_triggers(ctx.clone(), hangup_signal()));
        let accept = tokio::spawn(listener::accept_loop(listener, ctx.clone()));
        let admin_stop = CancellationToken::new();
        let admin = admin_listener.map(|l| {
            info!(listen = ?admin_addr, "admin listener up");
            tokio::spawn(crate::admin::serve(
                l,
                ctx.clone(),
                admin_token,
                admin_stop.clone(),
            ))
        });
        Ok(ProxyHandle {
            local_addr,
            admin_addr,
            ctx,
            accept,
            reload,
            admin,
            admin_stop,
        })
    }
}

/// A running proxy.
pub struct ProxyHandle {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    ctx: Arc<Context>,
    accept: JoinHandle<()>,
    reload: JoinHandle<()>,
    admin: Option<JoinHandle<()>>,
    admin_stop: CancellationToken,
}

impl ProxyHandle {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin listener's bound address (`None` when disabled).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The metrics registry and admin tables.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.ctx.metrics.clone()
    }

    /// The counters.
    pub fn stats(&self) -> Arc<ProxyStats> {
        self.ctx.stats.clone()
    }

    /// The policy in force (and its reload).
    pub fn policy(&self) -> Arc<PolicyHolder> {
        self.ctx.policy.clone()
    }

    /// Pooled mode: the upstream pools' gauges summed over every pool, and the pinned
    /// counts by reason. `None` in passthrough mode.
    pub fn pool_stats(&self) -> Option<(crate::upstream::pool::PoolStats, &PinnedCounts)> {
        let p = self.ctx.pooled.as_ref()?;
        let mut sum = crate::upstream::pool::PoolStats::default();
        for key in p.pool.keys() {
            let s = p.pool.stats(&key);
            sum.total += s.total;
            sum.idle += s.idle;
            sum.in_use += s.in_use;
            sum.connecting += s.connecting;
            sum.waiting += s.waiting;
            sum.max_wait = sum.max_wait.max(s.max_wait);
            sum.connects += s.connects;
            sum.connect_failures += s.connect_failures;
            sum.discards += s.discards;
            sum.expired += s.expired;
            sum.unusable += s.unusable;
            sum.timeouts += s.timeouts;
        }
        Some((sum, &p.pins.counts))
    }

    /// Pooled mode: reads the users file again (as SIGHUP does); the users in force stay if
    /// it is invalid. Returns the number of users.
    pub fn reload_users(&self) -> Result<usize, String> {
        match &self.ctx.pooled {
            Some(p) => p.reload_users(),
            None => Err("not in pooled mode".into()),
        }
    }

    /// Does what SIGHUP does, for this proxy only: reloads the policy file, the users file
    /// (pooled mode) and reopens the audit file sinks. Each part keeps what it had when it
    /// fails. For embedding and tests (a signal reaches every proxy of the process).
    pub fn hangup(&self) {
        reload_everything(&self.ctx);
    }

    /// The violation log (counters, flush).
    pub fn audit(&self) -> Arc<AuditLog> {
        self.ctx.audit.clone()
    }

    /// Graceful shutdown: stop accepting, close idle clients, let in-flight requests finish
    /// for up to `drain_timeout`, then close whatever is left.
    pub async fn shutdown(self) {
        let deadline = self.ctx.config.proxy.drain_timeout;
        info!(active = self.ctx.stats.active.get(), ?deadline, "draining");
        self.ctx.drain.cancel();
        let _ = self.accept.await;
        self.ctx.tracker.close();
        if tokio::time::timeout(deadline, self.ctx.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                left = self.ctx.stats.active.get(),
                "drain deadline passed; closing remaining connections"
            );
            self.ctx.kill.cancel();
            // Every await of a session watches the kill token; the bound is a safety net so
            // that shutdown ends whatever a session is stuck in.
            if tokio::time::timeout(KILL_GRACE, self.ctx.tracker.wait())
                .await
                .is_err()
            {
                warn!(
                    left = self.ctx.stats.active.get(),
                    "sessions still running after the kill; exiting without them"
                );
            }
        }
        self.reload.abort();
        self.ctx.background.cancel();
        // The admin listener outlives the drain, so /readyz can say 503 while it runs.
        self.admin_stop.cancel();
        if let Some(admin) = self.admin {
            let _ = tokio::time::timeout(KILL_GRACE, admin).await;
        }
        if let Some(p) = &self.ctx.pooled {
            p.close();
        }
        self.ctx.audit.close(crate::audit::CLOSE_BOUND).await;
        info!("mongoguard stopped");
    }

    /// Runs until SIGTERM or SIGINT, then shuts down gracefully.
    pub async fn run_until_signal(self) -> std::io::Result<()> {
        wait_for_signal().await?;
        self.shutdown().await;
        Ok(())
    }
}

/// The SIGHUP stream. Registering it replaces SIGHUP's default action (terminate) for the
/// whole process, so it is done synchronously in [`Proxy::start`], whatever the policy source.
#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "cannot install the SIGHUP handler; reload with POST /reload");
                None
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// SIGHUP reloads everything reloadable ([`reload_everything`]); a change of the policy
/// file's modification time reloads the policy. A new policy is validated completely before
/// the swap; an invalid one keeps the old policy and says why.
async fn reload_on_triggers(ctx: Arc<Context>, mut hup: Hangup) {
    let from_file = matches!(ctx.policy.source(), PolicySource::File(_));
    let poll = ctx.config.policy.reload_poll;
    let mut last_seen = None;
    loop {
        let hangup = async {
            #[cfg(unix)]
            if let Some(h) = hup.as_mut() {
                if h.recv().await.is_some() {
                    return;
                }
            }
            #[cfg(not(unix))]
            let _ = &hup;
            std::future::pending::<()>().await
        };
        let tick = async {
            if poll.is_zero() || !from_file {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep(poll).await
            }
        };
        let by_signal = tokio::select! {
            _ = ctx.drain.cancelled() => return,
            _ = hangup => true,
            _ = tick => false,
        };
        if !by_signal {
            // Reload only once the modification time has been stable for a whole poll
            // interval, so a file caught half-written by a non-atomic editor is never read.
            let seen = ctx.policy.changed_on_disk();
            let stable = seen.is_some() && seen == last_seen;
            last_seen = seen;
            if !stable {
                continue;
            }
        }
        last_seen = None;
        if by_signal {
            reload_everything(&ctx);
        } else {
            // Errors are logged and counted there; the next change or SIGHUP tries again.
            let _ = reload_now(&ctx, "file_change");
        }
    }
}

/// What SIGHUP does (`systemctl reload`): reload the policy file (a built-in profile has
/// nothing to reload: said so), the users file in pooled mode, and reopen the audit file
/// sinks (logrotate without `copytruncate`). Each part keeps what it had when it fails.
fn reload_everything(ctx: &Context) {
    if matches!(ctx.policy.source(), PolicySource::File(_)) {
        let _ = reload_now(ctx, "signal");
    } else {
        info!(policy = %ctx.policy.source(), "SIGHUP: the policy is built in; nothing to reload");
    }
    ctx.audit.reopen();
    if let Some(p) = &ctx.pooled {
        if p.has_users_file() {
            match p.reload_users() {
                Ok(n) => info!(users = n, "users file reloaded"),
                Err(e) => {
                    warn!(error = %e, "users file reload failed; keeping the previous users")
                }
            }
        }
    }
}

/// Reloads the policy file now (SIGHUP, a file change, or `POST /reload`): validates it
/// completely and swaps it in, or keeps the old policy; counts and logs either outcome.
/// Returns the new policy's hash (`None` for a built-in profile, which never changes).
pub(crate) fn reload_now(
    ctx: &Context,
    trigger: &'static str,
) -> Result<Option<u64>, crate::policy::PolicyError> {
    match ctx.policy.reload() {
        Ok(hash) => {
            ctx.stats.policy_reloads.inc();
            ctx.audit.event(reload_event(ctx, Ok(hash), trigger));
            info!(
                source = %ctx.policy.source(),
                hash = %hash.map(|h| format!("{h:016x}")).unwrap_or_default(),
                trigger,
                "policy reloaded"
            );
            Ok(hash)
        }
        Err(e) => {
            ctx.stats.policy_reload_failures.inc();
            ctx.audit
                .event(reload_event(ctx, Err(e.to_string()), trigger));
            warn!(error = %e, trigger, "policy reload failed; keeping the previous policy");
            Err(e)
        }
    }
}

/// The event for a policy reload (or a refused one).
fn reload_event(
    ctx: &Context,
    result: Result<Option<u64>, String>,
    trigger: &'static str,
) -> Event {
    let source = ctx.policy.source().to_string();
    match result {
        Ok(hash) => Event::PolicyReloaded {
            source,
            hash,
            trigger,
        },
        Err(error) => Event::PolicyReloadFailed {
            source,
            error,
            trigger,
        },
    }
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

#[cfg(unix)]
async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
