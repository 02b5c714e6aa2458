//! Where pooled requests go: the upstream servers, their roles, and server selection.
//!
//! - **Single**: one host and no `replicaSet`: every request goes there; its limits come from
//!   the pooled connections' own hello, so no extra monitoring connection is opened.
//! - **Replica set** (`replicaSet=NAME`): every member (seeds, then whatever their `hosts`
//!   lists) is checked with hello every `heartbeat_interval` (every 100 ms while no primary is
//!   known) on a monitoring connection of its own. Writes and primary reads go to the primary;
//!   `$readPreference` picks secondaries. After a failover, requests wait (up to
//!   `server_selection_timeout`) for the new primary and go there as soon as one hello shows it.
//! - **Mongos list** (several hosts, no `replicaSet`): requests are balanced round-robin over
//!   the hosts whose last hello succeeded.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    conn::{HelloFacts, Role, UpstreamConn},
    identity::Identity,
    pool::{Connector, PoolKey},
    ConnectError, Host, Identities, UpstreamUri,
};

/// The shape of the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// One server.
    Single,
    /// A replica set with this name.
    ReplicaSet(String),
    /// Several mongos.
    Mongos,
}

/// A read preference mode (`$readPreference.mode`). Tags and maxStalenessSeconds are not
/// applied: any member of the requested kind qualifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadPref {
    /// The primary only (also every write).
    #[default]
    Primary,
    /// The primary, else a secondary.
    PrimaryPreferred,
    /// A secondary only.
    Secondary,
    /// A secondary, else the primary.
    SecondaryPreferred,
    /// Any member.
    Nearest,
}

impl ReadPref {
    /// Parses a `mode` value; unknown modes are `None`.
    pub fn parse(mode: &str) -> Option<ReadPref> {
        Some(match mode {
            "primary" => ReadPref::Primary,
            "primaryPreferred" => ReadPref::PrimaryPreferred,
            "secondary" => ReadPref::Secondary,
            "secondaryPreferred" => ReadPref::SecondaryPreferred,
            "nearest" => ReadPref::Nearest,
            _ => return None,
        })
    }
}

/// What is known about one server.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// The server.
    pub host: Host,
    /// Its role from the last hello; `None` while unknown (unreachable or not checked yet).
    pub role: Option<Role>,
    /// Its last electionId (primaries).
    election_id: Option<[u8; 12]>,
}

/// A snapshot of the topology.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every known server.
    pub servers: Vec<ServerState>,
    /// The limits of the most recent successful hello of any server.
    pub facts: Option<Arc<HelloFacts>>,
}

impl Snapshot {
    /// The current primary: of the servers claiming it, the one with the newest electionId.
    pub fn primary(&self) -> Option<&Host> {
        self.servers
            .iter()
            .filter(|s| s.role == Some(Role::Primary))
            .max_by_key(|s| s.election_id)
            .map(|s| &s.host)
    }

    fn with_role(&self, role: Role) -> impl Iterator<Item = &Host> {
        self.servers
            .iter()
            .filter(move |s| s.role == Some(role))
            .map(|s| &s.host)
    }
}

/// Why no server could be chosen.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no upstream server matches read preference {pref:?} after {waited:?} ({kind})")]
pub struct SelectError {
    /// The preference asked for.
    pub pref: ReadPref,
    /// How long the request waited.
    pub waited: Duration,
    /// What the topology looked like.
    pub kind: String,
}

/// The upstream topology; shared by every session.
pub struct Topology {
    kind: Kind,
    seeds: Vec<Host>,
    state: watch::Sender<Snapshot>,
    check_now: Notify,
    next: AtomicUsize,
    monitored: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("kind", &self.kind)
            .field("snapshot", &*self.state.borrow())
            .finish()
    }
}

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
    /// The topology the URI describes, nothing known yet.
    pub fn from_uri(uri: &UpstreamUri) -> Arc<Topology> {
        let kind = match uri.option("replicaSet") {
            Some(name) => Kind::ReplicaSet(name.to_owned()),
            None if uri.hosts.len() > 1 => Kind::Mongos,
            None => Kind::Single,
        };
        let servers = uri
            .hosts
            .iter()
            .map(|h| ServerState {
                host: h.clone(),
                // A single server is used without monitoring: treat it as serving.
                role: (kind == Kind::Single).then_some(Role::Standalone),
                election_id: None,
            })
            .collect();
        let (state, _) = watch::channel(Snapshot {
            servers,
            facts: None,
        });
        Arc::new(Topology {
            kind,
            seeds: uri.hosts.clone(),
            state,
            check_now: Notify::new(),
            next: AtomicUsize::new(0),
            monitored: Mutex::new(HashSet::new()),
        })
    }

    /// The shape of the upstream.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// More than one server can serve requests (cursors and transactions need pinning).
    pub fn is_multi_server(&self) -> bool {
        self.kind != Kind::Single
    }

    /// Follows the topology's changes.
    pub fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.state.subscribe()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Snapshot {
        self.state.borrow().clone()
    }

    /// The `maxWireVersion` last reported by any server (no waiting, no allocation).
    pub fn max_wire_version(&self) -> Option<i32> {
        self.state
            .borrow()
            .facts
            .as_ref()
            .map(|f| f.max_wire_version)
    }

    /// The limits last reported by any server, waiting up to `timeout` for the first.
    pub async fn facts(&self, timeout: Duration) -> Option<Arc<HelloFacts>> {
        let mut rx = self.state.subscribe();
        let wait = async {
            rx.wait_for(|s| s.facts.is_some())
                .await
                .ok()
                .and_then(|s| s.facts.clone())
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// Records the hello facts of `host` (from a monitor or a new pooled connection).
    pub fn observe(&self, host: &Host, facts: &Arc<HelloFacts>) {
        self.state.send_if_modified(|s| {
            let mut changed = s.facts.as_ref() != Some(facts);
            s.facts = Some(facts.clone());
            if self.kind != Kind::Single {
                changed |= update_server(s, host, Some(facts.role), facts.election_id);
            }
            changed
        });
    }

    /// Marks `host` unknown (its monitor failed, or it answered "not primary").
    pub fn mark_unknown(&self, host: &Host) {
        if self.kind == Kind::Single {
            return;
        }
        self.state
            .send_if_modified(|s| update_server(s, host, None, None));
        self.check_now.notify_waiters();
    }

    /// Picks a server for `pref`, waiting up to `timeout` for one to qualify (a failover in
    /// progress).
    pub async fn select(&self, pref: ReadPref, timeout: Duration) -> Result<Host, SelectError> {
        if let Some(h) = self.pick(&self.state.borrow(), pref) {
            return Ok(h);
        }
        self.check_now.notify_waiters();
        let mut rx = self.state.subscribe();
        let started = tokio::time::Instant::now();
        let found = tokio::time::timeout(timeout, async {
            loop {
                if let Some(h) = self.pick(&rx.borrow_and_update(), pref) {
                    return Some(h);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match found {
            Ok(Some(h)) => Ok(h),
            _ => Err(SelectError {
                pref,
                waited: started.elapsed(),
                kind: self.describe(),
            }),
        }
    }

    fn describe(&self) -> String {
        let snap = self.state.borrow();
        let servers: Vec<String> = snap
            .servers
            .iter()
            .map(|s| match s.role {
                Some(r) => format!("{} {r:?}", s.host),
                None => format!("{} unknown", s.host),
            })
            .collect();
        match &self.kind {
            Kind::Single => format!("single server {}", servers.join(", ")),
            Kind::ReplicaSet(n) => format!("replica set {n}: {}", servers.join(", ")),
            Kind::Mongos => format!("mongos list: {}", servers.join(", ")),
        }
    }

    fn pick(&self, snap: &Snapshot, pref: ReadPref) -> Option<Host> {
        match self.kind {
            Kind::Single => snap.servers.first().map(|s| s.host.clone()),
            // A listed server that is a plain mongod (a misconfiguration the monitor warns
            // about, or a test stand-in) is used like a mongos.
            Kind::Mongos => self.round_robin(
                snap.with_role(Role::Mongos)
                    .chain(snap.with_role(Role::Standalone))
                    .collect(),
            ),
            Kind::ReplicaSet(_) => {
                let primary = || snap.primary().cloned();
                let secondary = || self.round_robin(snap.with_role(Role::Secondary).collect());
                match pref {
                    ReadPref::Primary => primary(),
                    ReadPref::PrimaryPreferred => primary().or_else(secondary),
                    ReadPref::Secondary => secondary(),
                    ReadPref::SecondaryPreferred => secondary().or_else(primary),
                    ReadPref::Nearest => self.round_robin(
                        snap.with_role(Role::Primary)
                            .chain(snap.with_role(Role::Secondary))
                            .collect(),
                    ),
                }
            }
        }
    }

    fn round_robin(&self, hosts: Vec<&Host>) -> Option<Host> {
        if hosts.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % hosts.len();
        hosts.get(i).map(|h| (*h).clone())
    }

    /// Starts monitoring every seed (replica sets and mongos lists; a single server needs
    /// none). Monitors stop when `cancel` fires.
    pub fn spawn_monitors(self: &Arc<Self>, settings: MonitorSettings, cancel: CancellationToken) {
        if self.kind == Kind::Single {
            return;
        }
        for host in self.seeds.clone() {
            self.spawn_monitor(host, settings.clone(), cancel.clone());
        }
    }

    fn spawn_monitor(
        self: &Arc<Self>,
        host: Host,
        settings: MonitorSettings,
        cancel: CancellationToken,
    ) {
        let key = host.to_string();
        {
            let mut monitored = self
                .monitored
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !monitored.insert(key) {
                return;
            }
        }
        let topo = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = topo.clone().monitor(host, settings, cancel.clone()) => {}
            }
        });
    }

    async fn monitor(
        self: Arc<Self>,
        host: Host,
        settings: MonitorSettings,
        cancel: CancellationToken,
    ) {
        let anonymous = Identity {
            name: "monitor".into(),
            credentials: None,
        };
        let mut conn: Option<UpstreamConn> = None;
        let mut was_ok = None;
        loop {
            let result = match conn.as_mut() {
                None => UpstreamConn::open(
                    &host,
                    &anonymous,
                    settings.connect_timeout,
                    settings.max_message_size,
                    settings.tls.as_ref(),
                )
                .await
                .map(|c| {
                    let f = c.facts().clone();
                    conn = Some(c);
                    f
                }),
                // A later check on the same connection: a hello without client metadata
                // (mongod refuses it after a connection's first hello).
                Some(c) => {
                    match tokio::time::timeout(settings.connect_timeout, c.heartbeat()).await {
                        Ok(r) => r,
                        Err(_) => Err(ConnectError::Timeout {
                            host: host.to_string(),
                            timeout: settings.connect_timeout,
                        }),
                    }
                }
            };
            match result {
                Ok(facts) => {
                    if was_ok != Some(true) {
                        info!(upstream = %host, role = ?facts.role, "upstream server is up");
                        if self.kind == Kind::Mongos && facts.role != Role::Mongos {
                            warn!(upstream = %host, role = ?facts.role,
                                "a server of the mongos list is not a mongos; it is used like one");
                        }
                    }
                    was_ok = Some(true);
                    if let (Kind::ReplicaSet(want), Some(got)) = (&self.kind, &facts.set_name) {
                        if want != got {
                            warn!(upstream = %host, expected = %want, found = %got,
                                "server belongs to another replica set; ignored");
                            self.mark_unknown(&host);
                            conn = None;
                            self.sleep(&settings, &cancel).await;
                            continue;
                        }
                    }
                    let before = self.state.borrow().primary().cloned();
                    self.observe(&host, &facts);
                    let after = self.state.borrow().primary().cloned();
                    if before != after {
                        info!(primary = ?after.as_ref().map(ToString::to_string), "upstream primary changed");
                    }
                    for member in &facts.hosts {
                        if let Ok(h) = member.parse::<HostText>() {
                            self.add_server(&h.0);
                            self.spawn_monitor(h.0, settings.clone(), cancel.clone());
                        }
                    }
                }
                Err(e) => {
                    if was_ok != Some(false) {
                        warn!(upstream = %host, error = %e, "upstream server is down");
                    }
                    was_ok = Some(false);
                    conn = None;
                    self.mark_unknown(&host);
                }
            }
            self.sleep(&settings, &cancel).await;
        }
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

    fn add_server(&self, host: &Host) {
        self.state.send_if_modified(|s| {
            if s.servers.iter().any(|x| &x.host == host) {
                return false;
            }
            debug!(upstream = %host, "discovered replica-set member");
            s.servers.push(ServerState {
                host: host.clone(),
                role: None,
                election_id: None,
            });
            true
        });
    }
}

fn update_server(
    s: &mut Snapshot,
    host: &Host,
    role: Option<Role>,
    election_id: Option<[u8; 12]>,
) -> bool {
    match s.servers.iter_mut().find(|x| &x.host == host) {
        Some(x) => {
            let changed = x.role != role || x.election_id != election_id;
            x.role = role;
            x.election_id = election_id;
            changed
        }
        None => {
            s.servers.push(ServerState {
                host: host.clone(),
                role,
                election_id,
            });
            true
        }
    }
}

/// A `host:port` from a hello's `hosts` list.
struct HostText(Host);

impl std::str::FromStr for HostText {
    type Err = crate::config::ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let uri: UpstreamUri = format!("mongodb://{s}").parse()?;
        match uri.hosts.into_iter().next() {
            Some(h) => Ok(HostText(h)),
            None => Err(crate::config::ConfigError::Uri(format!("no host in {s:?}"))),
        }
    }
}

/// The pool's connector: opens, says hello to and authenticates upstream connections as the
/// key's identity, and reports each server's hello to the topology.
pub struct MongoConnector {
    identities: Identities,
    topology: Arc<Topology>,
    connect_timeout: Duration,
    max_message_size: usize,
    tls: Option<crate::tls::UpstreamTls>,
}

impl MongoConnector {
    /// A connector for these identities, reporting to `topology`.
    pub fn new(
        identities: Identities,
        topology: Arc<Topology>,
        connect_timeout: Duration,
        max_message_size: usize,
        tls: Option<crate::tls::UpstreamTls>,
    ) -> MongoConnector {
        MongoConnector {
            identities,
            topology,
            connect_timeout,
            max_message_size,
            tls,
        }
    }
}

impl Connector for MongoConnector {
    type Conn = UpstreamConn;

    async fn connect(&self, key: &PoolKey) -> Result<UpstreamConn, ConnectError> {
        let identity =
            self.identities
                .get(&key.identity)
                .ok_or_else(|| ConnectError::Handshake {
                    host: key.server.to_string(),
                    reason: format!("unknown upstream identity {:?}", key.identity),
                })?;
        let conn = UpstreamConn::open(
            &key.server,
            identity,
            self.connect_timeout,
            self.max_message_size,
            self.tls.as_ref(),
        )
        .await?;
        self.topology.observe(&key.server, conn.facts());
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(role: Role, election: u8) -> Arc<HelloFacts> {
        let mut f = HelloFacts::from_reply(&bson::rawdoc! {"ok": 1, "maxWireVersion": 21}).unwrap();
        f.role = role;
        f.election_id = Some([election; 12]);
        Arc::new(f)
    }

    fn host(p: u16) -> Host {
        Host {
            name: "h".into(),
            port: p,
        }
    }

    #[tokio::test]
    async fn replica_set_selection_follows_roles() {
        let uri: UpstreamUri = "mongodb://h:1,h:2,h:3/?replicaSet=rs".parse().unwrap();
        let t = Topology::from_uri(&uri);
        let short = Duration::from_millis(20);
        assert!(t.select(ReadPref::Primary, short).await.is_err());
        t.observe(&host(1), &facts(Role::Primary, 1));
        t.observe(&host(2), &facts(Role::Secondary, 0));
        assert_eq!(t.select(ReadPref::Primary, short).await.unwrap(), host(1));
        assert_eq!(t.select(ReadPref::Secondary, short).await.unwrap(), host(2));
        assert_eq!(
            t.select(ReadPref::SecondaryPreferred, short).await.unwrap(),
            host(2)
        );
        // Failover: the old primary is demoted, a request waits, the new one is used.
        t.observe(&host(1), &facts(Role::Secondary, 1));
        let t2 = t.clone();
        let waiter =
            tokio::spawn(async move { t2.select(ReadPref::Primary, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        t.observe(&host(3), &facts(Role::Primary, 2));
        assert_eq!(waiter.await.unwrap().unwrap(), host(3));
        // A stale primary claim loses to the newer electionId.
        t.observe(&host(1), &facts(Role::Primary, 1));
        assert_eq!(t.snapshot().primary(), Some(&host(3)));
        assert_eq!(
            t.select(ReadPref::PrimaryPreferred, short).await.unwrap(),
            host(3)
        );
    }

    #[tokio::test]
    async fn mongos_list_balances_and_skips_unknown() {
        let uri: UpstreamUri = "mongodb://h:1,h:2".parse().unwrap();
        let t = Topology::from_uri(&uri);
        assert_eq!(t.kind(), &Kind::Mongos);
        t.observe(&host(1), &facts(Role::Mongos, 0));
        t.observe(&host(2), &facts(Role::Mongos, 0));
        let short = Duration::from_millis(20);
        let a = t.select(ReadPref::Primary, short).await.unwrap();
        let b = t.select(ReadPref::Primary, short).await.unwrap();
        assert_ne!(a, b);
        t.mark_unknown(&host(1));
        for _ in 0..4 {
            assert_eq!(t.select(ReadPref::Primary, short).await.unwrap(), host(2));
        }
    }

    #[tokio::test]
    async fn single_server_needs_no_monitoring() {
        let uri: UpstreamUri = "mongodb://h:1".parse().unwrap();
        let t = Topology::from_uri(&uri);
        assert!(!t.is_multi_server());
        let got = t
            .select(ReadPref::Secondary, Duration::from_millis(1))
            .await;
        assert_eq!(got.unwrap(), host(1));
        assert!(t.facts(Duration::from_millis(1)).await.is_none());
        t.observe(&host(1), &facts(Role::Standalone, 0));
        assert_eq!(
            t.facts(Duration::from_millis(1))
                .await
                .unwrap()
                .max_wire_version,
            21
        );
    }
}
