//! Reloads: SIGHUP (`systemctl reload`), a change of the policy file, `POST /reload` on the
//! admin API, and [`super::ProxyHandle::hangup`]. A new policy is validated completely before
//! the swap; an invalid one keeps the old policy and says why. Also the shutdown signals.

use std::sync::Arc;

use tracing::{info, warn};

use crate::{
    audit::Event,
    policy::{PolicyError, PolicySource},
    proxy::Context,
};

/// Records a file SIGHUP could not reload (`kind:path` as the event's source).
fn refused(ctx: &Context, kind: &str, path: Option<&std::path::Path>, error: String) {
    let path = path.map(|f| f.display().to_string()).unwrap_or_default();
    ctx.audit.event(Event::PolicyReloadFailed {
        source: format!("{kind}:{path}"),
        error,
        trigger: "signal",
    });
}

/// The reload service of one running mongoguard.
pub(crate) struct Reloader {
    ctx: Arc<Context>,
    admin_token: Arc<crate::admin::AdminToken>,
    config: Arc<super::config_check::ConfigCheck>,
}

impl Reloader {
    pub(crate) fn new(
        ctx: Arc<Context>,
        admin_token: Arc<crate::admin::AdminToken>,
        config: Arc<super::config_check::ConfigCheck>,
    ) -> Reloader {
        Reloader {
            ctx,
            admin_token,
            config,
        }
    }

    /// What SIGHUP does: reload the policy file (a built-in profile has nothing to reload:
    /// said so), the allowlist file (enforce mode), the TLS certificate, the admin token file,
    /// the users file in pooled mode, and reopen the audit file sinks (logrotate without
    /// `copytruncate`). Each part keeps what it had when it fails.
    pub(crate) fn everything(&self) {
        let ctx = &self.ctx;
        if matches!(ctx.policy.source(), PolicySource::File(_)) {
            let _ = self.policy("signal");
        } else {
            info!(policy = %ctx.policy.source(), "SIGHUP: the policy is built in; nothing to reload");
        }
        let _ = self.allowlist("signal");
        ctx.audit.reopen();
        if let Some(tls) = &ctx.server_tls {
            match tls.reload(&ctx.config.tls) {
                Ok(()) => {
                    ctx.stats.tls_reloads.inc();
                    info!("TLS certificate and key reloaded");
                }
                Err(e) => {
                    ctx.stats.tls_reload_failures.inc();
                    refused(
                        ctx,
                        "tls",
                        ctx.config.tls.cert_file.as_deref(),
                        e.to_string(),
                    );
                    warn!(error = %e, "TLS certificate reload failed; keeping the certificate in force");
                }
            }
        }
        if let Some(tls) = &ctx.upstream_tls {
            match tls.reload(&ctx.config.upstream.uri) {
                Ok(false) => {}
                Ok(true) => {
                    ctx.stats.upstream_tls_reloads.inc();
                    info!("upstream TLS files (tlsCAFile, tlsCertificateKeyFile) reloaded");
                }
                Err(e) => {
                    ctx.stats.upstream_tls_reload_failures.inc();
                    let file = ctx
                        .config
                        .upstream
                        .uri
                        .option("tlsCertificateKeyFile")
                        .or_else(|| ctx.config.upstream.uri.option("tlsCAFile"))
                        .map(std::path::Path::new);
                    refused(ctx, "upstream-tls", file, e.to_string());
                    warn!(error = %e, "upstream TLS file reload failed; keeping the files in force");
                }
            }
        }
        match self.admin_token.reload(&ctx.config.admin) {
            Ok(true) => info!("admin token file reloaded"),
            Ok(false) => {}
            Err(e) => {
                refused(
                    ctx,
                    "admin-token",
                    ctx.config.admin.token_file.as_deref(),
                    e.clone(),
                );
                warn!(error = %e, "admin token file reload failed; keeping the token in force");
            }
        }
        if let Some(p) = &ctx.pooled {
            if p.has_users_file() {
                match p.reload_users() {
                    Ok(n) => {
                        ctx.stats.users_reloads.inc();
                        info!(users = n, "users file reloaded");
                    }
                    Err(e) => {
                        ctx.stats.users_reload_failures.inc();
                        refused(
                            ctx,
                            "users",
                            ctx.config.auth.users_file.as_deref(),
                            e.clone(),
                        );
                        warn!(error = %e, "users file reload failed; keeping the previous users")
                    }
                }
            }
        }
        // The configuration file itself is not applied: what changed in it is said.
        self.config.check();
        if self.config.has_source() {
            let pending = self.config.status().changed.len();
            ctx.stats
                .config_restart_pending
                .set(u64::try_from(pending).unwrap_or(u64::MAX));
        }
    }

    /// Reloads the policy file now: validates it completely and swaps it in, or keeps the
    /// old policy; counts, logs and records either outcome. Returns the new policy's hash
    /// (`None` for a built-in profile, which never changes).
    pub(crate) fn policy(&self, trigger: &'static str) -> Result<Option<u64>, PolicyError> {
        let ctx = &self.ctx;
        let source = ctx.policy.source().to_string();
        match ctx.policy.reload() {
            Ok(hash) => {
                ctx.stats.policy_reloads.inc();
                ctx.audit.event(Event::PolicyReloaded {
                    source,
                    hash,
                    trigger,
                });
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
                ctx.audit.event(Event::PolicyReloadFailed {
                    source,
                    error: e.to_string(),
                    trigger,
                });
                warn!(error = %e, trigger, "policy reload failed; keeping the previous policy");
                Err(e)
            }
        }
    }

    /// Enforce mode: reads the allowlist file again and swaps it in, or keeps the allowlist
    /// in force when the file is unreadable or invalid; counted, logged and recorded like a
    /// policy reload (the event's source is `allowlist:PATH`). `None` in other modes.
    pub(crate) fn allowlist(
        &self,
        trigger: &'static str,
    ) -> Option<Result<crate::allowlist::Loaded, crate::allowlist::AllowlistError>> {
        let ctx = &self.ctx;
        let list = &ctx.allowlist;
        if list.mode() != crate::config::AllowlistMode::Enforce {
            return None;
        }
        let source = format!(
            "allowlist:{}",
            list.path()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        let result = list.reload();
        match &result {
            Ok(loaded) => {
                ctx.stats.allowlist_reloads.inc();
                ctx.audit.event(Event::PolicyReloaded {
                    source,
                    hash: None,
                    trigger,
                });
                info!(
                    apps = loaded.apps,
                    shapes = loaded.shapes,
                    left_out = loaded.over_caps,
                    trigger,
                    "allowlist reloaded"
                );
            }
            Err(e) => {
                ctx.stats.allowlist_reload_failures.inc();
                ctx.audit.event(Event::PolicyReloadFailed {
                    source,
                    error: e.to_string(),
                    trigger,
                });
                warn!(error = %e, trigger, "allowlist reload failed; keeping the previous allowlist");
            }
        }
        Some(result)
    }
}

impl crate::admin::PolicyReload for Reloader {
    fn config_status(&self) -> Option<super::config_check::ConfigStatus> {
        self.config.has_source().then(|| self.config.status())
    }

    fn reload_policy(&self, trigger: &'static str) -> Result<Option<u64>, PolicyError> {
        self.policy(trigger)
    }

    fn reload_allowlist(
        &self,
        trigger: &'static str,
    ) -> Option<Result<crate::allowlist::Loaded, crate::allowlist::AllowlistError>> {
        self.allowlist(trigger)
    }
}

/// Learn mode: writes the allowlist file every `save_interval` when shapes were learned
/// (off the runtime's threads). Ends at drain; shutdown writes it a last time.
pub(crate) async fn save_allowlist(ctx: Arc<Context>) {
    if ctx.allowlist.mode() != crate::config::AllowlistMode::Learn {
        return;
    }
    let every = ctx.config.allowlist.save_interval;
    loop {
        tokio::select! {
            _ = ctx.drain.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let list = ctx.allowlist.clone();
        let _ = tokio::task::spawn_blocking(move || list.save()).await;
    }
}

/// The SIGHUP stream. Registering it replaces SIGHUP's default action (terminate) for the
/// whole process, so it is done synchronously at start, whatever the policy source.
#[cfg(unix)]
pub(crate) type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
pub(crate) type Hangup = Option<()>;

pub(crate) fn hangup_signal() -> Hangup {
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

/// SIGHUP reloads everything reloadable ([`Reloader::everything`]); a change of the policy
/// file's modification time reloads the policy. Ends at drain.
pub(crate) async fn on_triggers(reloader: Arc<Reloader>, mut hup: Hangup) {
    let ctx = &reloader.ctx;
    let from_file = matches!(ctx.policy.source(), PolicySource::File(_));
    let poll = ctx.config.policy.reload_poll;
    let mut last_seen = None;
    // The modification time of a file already refused: not read again until it changes
    // (or a SIGHUP asks), else an invalid file nobody touches is refused every other poll.
    let mut refused = None;
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
        if by_signal {
            last_seen = None;
            reloader.everything();
            // Still different from the policy in force: this file was refused.
            refused = ctx.policy.changed_on_disk();
            continue;
        }
        // Reload only once the modification time has been stable for a whole poll interval,
        // so a file caught half-written by a non-atomic editor is never read.
        let seen = ctx.policy.changed_on_disk();
        let stable = seen.is_some() && seen == last_seen && seen != refused;
        last_seen = seen;
        if stable {
            last_seen = None;
            // Errors are logged and counted there; the next change or SIGHUP tries again.
            if reloader.policy("file_change").is_err() {
                refused = seen;
            }
        }
    }
}

/// SIGTERM and SIGINT, caught from the moment this is made: `main` makes it before anything
/// else starts, so a stop asked for during a slow start (an SRV lookup that does not answer, a
/// syslog sink, a large allowlist) ends the process cleanly instead of killing it (or, as PID
/// 1 in a container, being ignored by the kernel until the start is over).
pub struct ShutdownSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    /// SIGHUP registered too, so that its default action (terminate) is gone before the
    /// configuration is read; one received before the proxy's reload handler exists is
    /// ignored (everything it would reload is read by the start).
    #[cfg(unix)]
    _hangup: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Installs the handlers (replacing the default actions for the whole process). Needs a
    /// tokio runtime.
    pub fn install() -> std::io::Result<ShutdownSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(ShutdownSignals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                _hangup: hangup_signal(),
            })
        }
        #[cfg(not(unix))]
        Ok(ShutdownSignals {})
    }

    /// Waits for the next SIGTERM or SIGINT (one received since `install` counts).
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => info!("SIGTERM received"),
            _ = self.int.recv() => info!("SIGINT received"),
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// SIGTERM and SIGINT caught before the Tokio runtime exists (`main` installs this right
/// after parsing its arguments; the runtime's build starts every worker thread: milliseconds,
/// more on a loaded machine, and `systemctl stop` or `docker stop` right after the start
/// lands there). Without a handler
/// such a signal took its default action, and as PID 1 in a container the kernel drops it, so
/// the stop waited for the supervisor's SIGKILL. A handler of `signal_hook::flag` only sets a
/// flag (async-signal-safe); [`EarlyStop::requested`] reads it once [`ShutdownSignals`] is
/// installed, which catches every later signal. SIGHUP is caught too (its default action
/// kills; the start reads everything a reload would).
#[derive(Debug)]
pub struct EarlyStop {
    #[cfg(unix)]
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl EarlyStop {
    /// Installs the handlers (replacing the default actions for the whole process). Needs no
    /// runtime. A handler that cannot be installed is said on standard error (nothing else
    /// exists yet), and the start goes on as before.
    pub fn install() -> EarlyStop {
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let hup = Arc::new(std::sync::atomic::AtomicBool::new(false));
            for (sig, flag) in [(SIGTERM, &stop), (SIGINT, &stop), (SIGHUP, &hup)] {
                if let Err(e) = signal_hook::flag::register(sig, flag.clone()) {
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "mongoguard: cannot install the handler of signal {sig}: {e}"
                    );
                }
            }
            EarlyStop { stop }
        }
        #[cfg(not(unix))]
        EarlyStop {}
    }

    /// Whether a SIGTERM or SIGINT has arrived since [`EarlyStop::install`].
    pub fn requested(&self) -> bool {
        #[cfg(unix)]
        {
            self.stop.load(std::sync::atomic::Ordering::SeqCst)
        }
        #[cfg(not(unix))]
        false
    }
}

/// Waits for SIGTERM or SIGINT (handlers installed now).
pub async fn wait_for_signal() -> std::io::Result<()> {
    ShutdownSignals::install()?.recv().await;
    Ok(())
}
