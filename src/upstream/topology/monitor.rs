//! The monitors of a replica set or mongos list: one task and one connection per server,
//! a hello every `heartbeat_interval` (sooner while a replica set has no primary, or when a
//! request asks), members discovered from the hellos' `hosts`.

use std::{
    sync::{Arc, PoisonError},
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Kind, Topology};
use crate::config::ConfigError;
use crate::upstream::{ConnectError, HelloFacts, Host, Identity, Role, UpstreamConn, UpstreamUri};

/// Settings of the monitors.
#[derive(Debug, Clone)]
pub struct MonitorSettings {
    /// Interval between checks of one server.
    pub heartbeat: Duration,
    /// Budget of one connect + hello.
    pub connect_timeout: Duration,
    /// Largest reply accepted.
    pub max_message_size: usize,
    /// TLS toward the servers.
    pub tls: Option<crate::tls::UpstreamTls>,
}

impl Topology {
    /// Starts monitoring every seed (replica sets and mongos lists; a single server needs
    /// none). Monitors stop when `cancel` fires.
    pub fn spawn_monitors(self: &Arc<Self>, settings: MonitorSettings, cancel: CancellationToken) {
        if self.kind == Kind::Single {
            return;
        }
        self.heartbeat_ms.store(
            u64::try_from(settings.heartbeat.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        *self
            .monitoring
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((settings.clone(), cancel.clone()));
        for host in self.seeds.clone() {
            self.spawn_monitor(host, settings.clone(), cancel.clone());
        }
    }

    /// Starts monitoring `host` unless it is monitored already; its monitor has its own
    /// child of `cancel`, so that [`Topology::remove_server`] stops it alone.
    pub(super) fn spawn_monitor(
        self: &Arc<Self>,
        host: Host,
        settings: MonitorSettings,
        cancel: CancellationToken,
    ) {
        let key = host.to_string();
        let cancel = {
            let mut monitored = self
                .monitored
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if monitored.contains_key(&key) || self.is_removed(&host) {
                return;
            }
            let own = cancel.child_token();
            monitored.insert(key, own.clone());
            own
        };
        let topo = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = topo.clone().monitor(host, settings, cancel.clone()) => {}
            }
        });
    }

    /// Checks `host` until `cancel` fires.
    async fn monitor(
        self: Arc<Self>,
        host: Host,
        settings: MonitorSettings,
        cancel: CancellationToken,
    ) {
        let mut m = Monitor {
            host,
            settings,
            identity: Identity {
                name: "monitor".into(),
                credentials: None,
            },
            conn: None,
            was_ok: None,
        };
        loop {
            match m.check().await {
                Ok(facts) => self.server_up(&mut m, &facts, &cancel),
                Err(e) => self.server_down(&mut m, &e),
            }
            self.sleep(&m.settings, &cancel).await;
        }
    }

    /// A check succeeded: records the server's role (unless it belongs to another replica
    /// set) and starts monitoring the members its hello lists.
    fn server_up(
        self: &Arc<Self>,
        m: &mut Monitor,
        facts: &Arc<HelloFacts>,
        cancel: &CancellationToken,
    ) {
        let host = &m.host;
        if m.was_ok != Some(true) {
            info!(upstream = %host, role = ?facts.role, "upstream server is up");
            if self.kind == Kind::Mongos && facts.role != Role::Mongos {
                warn!(upstream = %host, role = ?facts.role,
                    "a server of the mongos list is not a mongos; it is used like one");
            }
        }
        m.was_ok = Some(true);
        if let (Kind::ReplicaSet(want), Some(got)) = (&self.kind, &facts.set_name) {
            if want != got {
                warn!(upstream = %host, expected = %want, found = %got,
                    "server belongs to another replica set; ignored");
                self.mark_unknown(host);
                m.conn = None;
                return;
            }
        }
        let before = self.state.borrow().primary().cloned();
        self.observe(host, facts);
        let after = self.state.borrow().primary().cloned();
        if before != after {
            info!(primary = ?after.as_ref().map(ToString::to_string), "upstream primary changed");
        }
        for member in &facts.hosts {
            if let Ok(h) = member.parse::<HostText>() {
                self.state.send_if_modified(|s| s.discover(&h.0));
                self.spawn_monitor(h.0, m.settings.clone(), cancel.clone());
            }
        }
    }

    /// A check failed: the server is unknown until a check succeeds, on a new connection.
    fn server_down(&self, m: &mut Monitor, error: &ConnectError) {
        if m.was_ok != Some(false) {
            warn!(upstream = %m.host, %error, "upstream server is down");
        }
        m.was_ok = Some(false);
        m.conn = None;
        self.mark_unknown(&m.host);
    }

    /// Waits for the next check: the heartbeat, 100 ms while a replica set has no primary,
    /// or at once when a request asks.
    async fn sleep(&self, settings: &MonitorSettings, cancel: &CancellationToken) {
        let no_primary =
            matches!(self.kind, Kind::ReplicaSet(_)) && self.state.borrow().primary().is_none();
        let interval = if no_primary {
            settings.heartbeat.min(Duration::from_millis(100))
        } else {
            settings.heartbeat
        };
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = tokio::time::sleep(interval) => {}
            _ = self.check_now.notified() => {
                // Coalesce a burst of requests for a check.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// One server's monitor: its own connection and the result of its last check.
struct Monitor {
    host: Host,
    settings: MonitorSettings,
    /// Monitors do not authenticate.
    identity: Identity,
    conn: Option<UpstreamConn>,
    /// `None` before the first check (the first result is always logged).
    was_ok: Option<bool>,
}

impl Monitor {
    /// One check: opens the connection (its first hello), or on an open one sends a
    /// heartbeat, a hello without client metadata (mongod refuses metadata after a
    /// connection's first hello). Both are bounded by `connect_timeout`.
    ///
    /// A network error (or a timeout) on an established connection of a server that was up
    /// is checked again at once on a new connection, and only a second failure reports it
    /// down. The server monitoring specification marks the server Unknown first and then
    /// checks again at once ("Retry hello calls once": such an error is usually a glitch);
    /// a driver's application does not see that, but here Unknown closes every passthrough
    /// session attached to a primary, so one lost monitoring connection (a middlebox's
    /// reset, a `killOp`) would disconnect every client: the recheck comes first.
    async fn check(&mut self) -> Result<Arc<HelloFacts>, ConnectError> {
        let timeout = self.settings.connect_timeout;
        if let Some(c) = self.conn.as_mut() {
            let result = match tokio::time::timeout(timeout, c.heartbeat()).await {
                Ok(r) => r,
                Err(_) => Err(ConnectError::Timeout {
                    host: self.host.to_string(),
                    timeout,
                }),
            };
            match result {
                Ok(facts) => return Ok(facts),
                Err(e @ (ConnectError::Io { .. } | ConnectError::Timeout { .. }))
                    if self.was_ok == Some(true) =>
                {
                    debug!(upstream = %self.host, error = %e,
                        "monitoring connection lost; checking again on a new one");
                    self.conn = None;
                }
                Err(e) => return Err(e),
            }
        }
        let c = UpstreamConn::open(
            &self.host,
            &self.identity,
            timeout,
            self.settings.max_message_size,
            self.settings.tls.as_ref(),
            // Monitors never run in front of a load balancer (it has no topology to watch).
            false,
        )
        .await?;
        let facts = c.facts().clone();
        self.conn = Some(c);
        Ok(facts)
    }
}

/// A `host:port` from a hello's `hosts` list.
struct HostText(Host);

impl std::str::FromStr for HostText {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let uri: UpstreamUri = format!("mongodb://{s}").parse()?;
        match uri.hosts.into_iter().next() {
            Some(h) => Ok(HostText(h)),
            None => Err(ConfigError::Uri(format!("no host in {s:?}"))),
        }
    }
}
