//! The composition root: builds the shared state of a running mongoguard — the policy
//! holder, the audit log, the metrics, the upstream topology (and pooled mode's pools), the
//! reload service — and starts its two listeners as siblings: the proxy ([`crate::proxy`])
//! and the admin API ([`crate::admin`]). Neither listener knows the other; everything they
//! share is built here and handed to each.
//!
//! [`Proxy::start`] is the entry point (`main.rs`, tests, embedding); [`ProxyHandle`] reads
//! the running state, reloads it, and shuts everything down in order.

mod config_check;
mod reload;

use std::{net::SocketAddr, sync::Arc};

use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    admin::AdminState,
    audit::AuditLog,
    config::{Config, Mode},
    metrics::Metrics,
    policy::PolicyHolder,
    proxy::{self, Context, PinnedCounts, ProxyError, ProxyStats},
    upstream::{
        pool::PoolStats,
        topology::{MonitorSettings, Topology},
    },
};

pub use config_check::ConfigSource;
pub(crate) use config_check::ConfigStatus;
pub use reload::{wait_for_signal, EarlyStop, ShutdownSignals};

/// How long shutdown waits for sessions after killing them, and for the admin listener and
/// the audit writer, before it ends anyway.
const KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The entry point.
pub struct Proxy;

impl Proxy {
    /// Binds the listen address and starts accepting clients in the background.
    pub async fn start(config: Arc<Config>) -> Result<ProxyHandle, ProxyError> {
        // First of all: SIGHUP's default action kills, and a start can take seconds (SRV
        // lookups, a syslog sink, a large allowlist) while `systemctl reload` may already
        // come (the unit is Type=simple: active at once).
        let hup = reload::hangup_signal();
        let policy =
            PolicyHolder::load(config.policy.file.as_deref()).map_err(ProxyError::Policy)?;
        Self::start_inner(config, policy, hup, None).await
    }

    /// Like [`Proxy::start`], with the way `config` was read (`main`: the file and the
    /// command line), so that SIGHUP can say which settings changed in the file since and
    /// need a restart (log, `GET /config`).
    pub async fn start_from(
        config: Arc<Config>,
        source: Option<ConfigSource>,
    ) -> Result<ProxyHandle, ProxyError> {
        let hup = reload::hangup_signal();
        let policy =
            PolicyHolder::load(config.policy.file.as_deref()).map_err(ProxyError::Policy)?;
        Self::start_inner(config, policy, hup, source).await
    }

    /// Like [`Proxy::start`], with an already loaded policy.
    pub async fn start_with_policy(
        config: Arc<Config>,
        policy: PolicyHolder,
    ) -> Result<ProxyHandle, ProxyError> {
        let hup = reload::hangup_signal();
        Self::start_inner(config, policy, hup, None).await
    }

    async fn start_inner(
        config: Arc<Config>,
        policy: PolicyHolder,
        hup: reload::Hangup,
        source: Option<ConfigSource>,
    ) -> Result<ProxyHandle, ProxyError> {
        // Compared with the file at SIGHUP: the configuration as read, before SRV resolution.
        let config_check = Arc::new(config_check::ConfigCheck::new(source, config.clone()));
        // A mongodb+srv:// upstream becomes hosts (and TXT options) before anything else:
        // everything below sees the resolved URI; a failed lookup fails the start.
        let srv = crate::upstream::srv::resolve(&config.upstream)
            .await
            .map_err(ProxyError::Srv)?;
        let config = if config.upstream.uri.srv.is_some() {
            let mut resolved = (*config).clone();
            resolved.upstream.uri = srv.uri;
            Arc::new(resolved)
        } else {
            config
        };
        let allowlist = Arc::new(
            crate::allowlist::Allowlist::start(&config.allowlist).map_err(ProxyError::Allowlist)?,
        );
        warn_when_a001_is_off(&allowlist, &policy);
        let audit = Arc::new(AuditLog::start(&config.audit).map_err(ProxyError::Audit)?);
        let policy = Arc::new(policy);
        let listeners = Listeners::bind(&config).await?;
        let server_tls = config
            .tls
            .enabled()
            .then(|| crate::tls::ServerTls::load(&config.tls))
            .transpose()
            .map_err(ProxyError::Tls)?;
        let upstream_tls =
            crate::tls::UpstreamTls::from_uri(&config.upstream.uri).map_err(ProxyError::Tls)?;
        let admin_token = Arc::new(crate::admin::AdminToken::new(
            config.admin.load_token().map_err(ProxyError::Admin)?,
        ));
        let background = CancellationToken::new();
        let ctx = proxy_context(
            &config,
            &policy,
            &audit,
            server_tls,
            upstream_tls.clone(),
            &background,
            allowlist,
        )?;
        if let Some(poller) = srv.poller {
            poller.spawn(ctx.topology.clone(), background.clone());
        }
        info!(listen = %listeners.local_addr, upstream = %config.upstream.uri,
            mode = ?config.proxy.mode, threads = ctx.loops.as_ref().map_or(0, |l| l.len()),
            policy = %policy.source(),
            policy_mode = policy.current().mode().as_str(), "mongoguard listening");
        let reloader = Arc::new(reload::Reloader::new(
            ctx.clone(),
            admin_token.clone(),
            config_check,
        ));
        // The SIGHUP stream was registered first thing in the start.
        let reload = tokio::spawn(reload::on_triggers(reloader.clone(), hup));
        let learn = tokio::spawn(reload::save_allowlist(ctx.clone()));
        let accept = tokio::spawn(proxy::serve(listeners.proxy, ctx.clone()));
        tokio::spawn(proxy::conn_report::run(ctx.clone(), background.clone()));
        let admin_stop = CancellationToken::new();
        let unready = CancellationToken::new();
        let admin = listeners.admin.map(|l| {
            info!(listen = ?listeners.admin_addr, "admin listener up");
            let state = AdminState {
                config,
                policy,
                metrics: ctx.metrics.clone(),
                draining: unready.clone(),
                upstream_tls,
                reload: reloader.clone(),
                control: ctx.control.clone(),
                topology: ctx.topology.clone(),
                pooled: ctx.pooled.clone(),
            };
            let stop = admin_stop.clone();
            tokio::spawn(crate::admin::serve(l, state, admin_token, stop))
        });
        Ok(ProxyHandle {
            local_addr: listeners.local_addr,
            admin_addr: listeners.admin_addr,
            ctx,
            reloader,
            accept,
            reload,
            learn,
            admin,
            admin_stop,
            unready,
            background,
        })
    }
}

/// The two listening sockets, bound before anything starts (a taken port fails the start).
struct Listeners {
    proxy: TcpListener,
    local_addr: SocketAddr,
    admin: Option<TcpListener>,
    admin_addr: Option<SocketAddr>,
}

impl Listeners {
    async fn bind(config: &Config) -> Result<Listeners, ProxyError> {
        let reuse_port = config.proxy.reuse_port;
        let proxy = bind(config.proxy.listen, reuse_port)?;
        let local_addr = bound_addr(&proxy, config.proxy.listen)?;
        let (admin, admin_addr) = match config.admin.listen {
            Some(addr) => {
                let l = bind(addr, reuse_port)?;
                let bound = bound_addr(&l, addr)?;
                (Some(l), Some(bound))
            }
            None => (None, None),
        };
        Ok(Listeners {
            proxy,
            local_addr,
            admin,
            admin_addr,
        })
    }
}

/// The proxy's shared state: the upstream topology (monitored until `background` is
/// cancelled) and pooled mode's state, with the policy and audit log built here.
fn proxy_context(
    config: &Arc<Config>,
    policy: &Arc<PolicyHolder>,
    audit: &Arc<AuditLog>,
    server_tls: Option<crate::tls::ServerTls>,
    upstream_tls: Option<crate::tls::UpstreamTls>,
    background: &CancellationToken,
    allowlist: Arc<crate::allowlist::Allowlist>,
) -> Result<Arc<Context>, ProxyError> {
    let threads = session_threads(config);
    let (topology, pooled) = upstream(config, upstream_tls.clone(), background, threads)?;
    let identity = crate::upstream::Identities::from_config(&config.upstream)
        .map_err(|e| ProxyError::Pooled(e.to_string()))?
        .default_identity()
        .as_ref()
        .clone();
    let plan = crate::plan::PlanGuard::start(
        config,
        topology.clone(),
        identity,
        upstream_tls.clone(),
        background.clone(),
    );
    let mut ctx = Context::new(
        config.clone(),
        policy.clone(),
        audit.clone(),
        topology,
        pooled,
        (server_tls, upstream_tls),
        plan,
    );
    ctx.allowlist = allowlist;
    // Sessions run on event loop threads, each its own; a pooled session checks out of its
    // loop's pool shard (`proxy::loops`).
    if let Some(threads) = threads {
        let loops = proxy::loops::SessionLoops::start(threads).map_err(ProxyError::Threads)?;
        if let Some(pooled) = &ctx.pooled {
            pooled.start_loop_maintenance(&loops);
        }
        ctx.loops = Some(loops);
    } else if config.proxy.threads != 0 {
        warn!(
            threads = config.proxy.threads,
            "proxy.threads is ignored: sessions run on the shared runtime \
             (TOKIO_WORKER_THREADS sizes it) under proxy.work_stealing, and in pooled mode \
             when pool_size is below twice the minimum shard or pool.checkout_timeout is \
             below 500 ms"
        );
    }
    Ok(Arc::new(ctx))
}

/// The session loops to run (see `proxy::loops`): `None` runs sessions on the shared
/// work-stealing runtime (`proxy.work_stealing`, or a pool too small to shard or whose
/// checkout timeout is too short for rebalancing: `loops::pooled_threads`).
fn session_threads(config: &Config) -> Option<usize> {
    if config.proxy.work_stealing {
        return None;
    }
    let threads = proxy::loops::resolve_threads(config.proxy.threads);
    match config.proxy.mode {
        Mode::Passthrough => Some(threads),
        Mode::Pooled => proxy::loops::pooled_threads(
            threads,
            config.pool.pool_size,
            config.pool.checkout_timeout,
        ),
    }
}

/// Enforcing an allowlist while the policy turns A001 off everywhere enforces nothing: said
/// at start (an override may still turn it on for some requests).
fn warn_when_a001_is_off(allowlist: &crate::allowlist::Allowlist, policy: &PolicyHolder) {
    let enforce = allowlist.mode() == crate::config::AllowlistMode::Enforce;
    let off = policy.current().action(crate::policy::RuleId::A001) == crate::policy::Action::Off;
    if enforce && off {
        warn!(
            "allowlist.mode = \"enforce\" but the policy sets A001 (unknown-query-shape) to \
             \"off\": new shapes are not reported; set A001 = \"warn\" or \"block\" in the policy"
        );
    }
}

/// The backlog of the listening sockets (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 1024;

/// A listening socket on `addr`: `SO_REUSEADDR` as every server sets it (a restart binds while
/// old connections sit in TIME_WAIT), and `SO_REUSEPORT` when asked. `TCP_NODELAY` too: Linux
/// copies it to every accepted socket, which then needs no `setsockopt` of its own (one
/// syscall per client connection; see `proxy::listener`).
pub(crate) fn bind(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, ProxyError> {
    let err = |source| ProxyError::Bind { addr, source };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    socket.set_nodelay(true).map_err(err)?;
    if reuse_port {
        socket.set_reuseport(true).map_err(err)?;
    }
    socket.bind(addr).map_err(err)?;
    socket.listen(LISTEN_BACKLOG).map_err(err)
}

fn bound_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, ProxyError> {
    listener
        .local_addr()
        .map_err(|source| ProxyError::Bind { addr, source })
}

/// The upstream topology, monitored until `background` is cancelled, and pooled mode's
/// shared state (whose topology it is).
fn upstream(
    config: &Config,
    tls: Option<crate::tls::UpstreamTls>,
    background: &CancellationToken,
    threads: Option<usize>,
) -> Result<(Arc<Topology>, Option<Arc<proxy::Pooled>>), ProxyError> {
    if config.proxy.mode == Mode::Pooled {
        // One pool shard per session loop.
        let pooled = proxy::Pooled::start(config, tls, threads.unwrap_or(1))?;
        return Ok((pooled.topology.clone(), Some(pooled)));
    }
    let topology = Topology::from_uri(&config.upstream.uri);
    topology.spawn_monitors(
        MonitorSettings {
            heartbeat: config.upstream.heartbeat_interval,
            connect_timeout: config.upstream.connect_timeout,
            max_message_size: config.proxy.max_message_size,
            tls,
        },
        background.clone(),
    );
    Ok((topology, None))
}

/// A running mongoguard.
pub struct ProxyHandle {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    ctx: Arc<Context>,
    reloader: Arc<reload::Reloader>,
    accept: JoinHandle<()>,
    reload: JoinHandle<()>,
    /// Learn mode: writes the allowlist every `save_interval` until the drain.
    learn: JoinHandle<()>,
    admin: Option<JoinHandle<()>>,
    admin_stop: CancellationToken,
    /// Cancelled first at shutdown: `/readyz` says 503 from then on.
    unready: CancellationToken,
    /// Stops the background tasks (topology monitors) at the end of shutdown.
    background: CancellationToken,
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

    /// Bytes of the memory budget held now (large messages in flight, both directions).
    pub fn memory_budget_in_use(&self) -> u64 {
        self.ctx.budget.in_use_bytes()
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
    pub fn pool_stats(&self) -> Option<(PoolStats, &PinnedCounts)> {
        let p = self.ctx.pooled.as_ref()?;
        Some((p.pool_totals(), &p.pins.counts))
    }

    /// Pooled mode: reads the users file again (as SIGHUP does); the users in force stay if
    /// it is invalid. Returns the number of users.
    pub fn reload_users(&self) -> Result<usize, String> {
        match &self.ctx.pooled {
            Some(p) => p.reload_users(),
            None => Err("not in pooled mode".into()),
        }
    }

    /// Does what SIGHUP does, for this mongoguard only: reloads the policy file, the users
    /// file (pooled mode) and reopens the audit file sinks. Each part keeps what it had when
    /// it fails. For embedding and tests (a signal reaches every proxy of the process).
    pub fn hangup(&self) {
        self.reloader.everything();
    }

    /// The learned allowlist.
    pub fn allowlist(&self) -> Arc<crate::allowlist::Allowlist> {
        self.ctx.allowlist.clone()
    }

    /// The violation log (counters, flush).
    pub fn audit(&self) -> Arc<AuditLog> {
        self.ctx.audit.clone()
    }

    /// Graceful shutdown: stop accepting, close idle clients, let in-flight requests finish
    /// for up to `drain_timeout`, then close whatever is left.
    pub async fn shutdown(self) {
        self.shutdown_cut(std::future::pending()).await;
    }

    /// [`ProxyHandle::shutdown`], going unready first: `/readyz` says 503 at once, and for
    /// `proxy.shutdown_delay` (unless `cut` ends first: a second signal) clients are still
    /// accepted and served, so that a load balancer or Kubernetes Service has time to stop
    /// sending new ones; then the drain.
    async fn shutdown_cut(self, cut: impl std::future::Future<Output = ()>) {
        self.unready.cancel();
        let delay = self.ctx.config.proxy.shutdown_delay;
        if !delay.is_zero() {
            info!(
                ?delay,
                "unready (GET /readyz: 503); serving for proxy.shutdown_delay before the drain"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = cut => info!("second stop signal: draining now"),
            }
        }
        let ctx = &self.ctx;
        let deadline = ctx.config.proxy.drain_timeout;
        info!(active = ctx.stats.active.get(), ?deadline, "draining");
        ctx.start_drain();
        let _ = self.accept.await;
        ctx.tracker.close();
        if tokio::time::timeout(deadline, ctx.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                left = ctx.stats.active.get(),
                "drain deadline passed; closing remaining connections"
            );
            ctx.kill_all();
            // Every await of a session watches the kill token; the bound is a safety net so
            // that shutdown ends whatever a session is stuck in.
            if tokio::time::timeout(KILL_GRACE, ctx.tracker.wait())
                .await
                .is_err()
            {
                warn!(
                    left = ctx.stats.active.get(),
                    "sessions still running after the kill; exiting without them"
                );
            }
        }
        if let Some(loops) = &ctx.loops {
            loops.stop(KILL_GRACE).await;
        }
        self.reload.abort();
        let _ = self.learn.await;
        // Learn mode: what the sessions learned up to their last request.
        let allowlist = ctx.allowlist.clone();
        let _ = tokio::task::spawn_blocking(move || allowlist.save()).await;
        self.background.cancel();
        // The admin listener outlives the drain, so /readyz can say 503 while it runs.
        self.admin_stop.cancel();
        if let Some(admin) = self.admin {
            let _ = tokio::time::timeout(KILL_GRACE, admin).await;
        }
        if let Some(p) = &ctx.pooled {
            p.close();
        }
        ctx.audit.close(crate::audit::CLOSE_BOUND).await;
        info!("mongoguard stopped");
    }

    /// Runs until SIGTERM or SIGINT, then shuts down gracefully.
    pub async fn run_until_signal(self) -> std::io::Result<()> {
        wait_for_signal().await?;
        self.shutdown().await;
        Ok(())
    }

    /// Runs until `signals` sees SIGTERM or SIGINT (one received during the start counts),
    /// then shuts down gracefully.
    pub async fn run_until(self, signals: &mut ShutdownSignals) {
        signals.recv().await;
        self.shutdown_cut(signals.recv()).await;
    }
}

#[cfg(test)]
mod tests {
    /// What `proxy::listener` relies on to skip `set_nodelay` per connection on Linux: an
    /// accepted socket inherits `TCP_NODELAY` from the listener `bind` made.
    #[tokio::test]
    async fn accepted_sockets_inherit_nodelay() {
        // IPv4 and IPv6 (when the host has ::1), with SO_REUSEPORT or without.
        for (addr, reuse_port) in [
            ("127.0.0.1:0", false),
            ("127.0.0.1:0", true),
            ("[::1]:0", false),
        ] {
            let listener = match super::bind(addr.parse().unwrap(), reuse_port) {
                Ok(l) => l,
                Err(e) if addr.starts_with('[') => {
                    eprintln!("no IPv6 loopback here ({e}); not checked");
                    continue;
                }
                Err(e) => panic!("{addr}: {e}"),
            };
            let addr = listener.local_addr().unwrap();
            let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            assert!(accepted.nodelay().unwrap(), "{addr}");
        }
    }
}
