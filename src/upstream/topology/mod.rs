//! Where pooled requests go: the upstream servers, their roles, and server selection.
//!
//! - **Single**: one host and no `replicaSet`: every request goes there; its limits come from
//!   the pooled connections' own hello, so no extra monitoring connection is opened.
//! - **Replica set** (`replicaSet=NAME`): every member (seeds, then whatever their `hosts`
//!   lists) is checked with hello every `heartbeat_interval` (every 100 ms while no primary is
//!   known) on a monitoring connection of its own. Writes and primary reads go to the primary;
//!   `$readPreference` picks secondaries. After a failover, requests wait (up to
//!   `server_selection_timeout`) for the new primary and go there as soon as one hello shows it.
//! - **Mongos list** (several hosts, no `replicaSet`; or a `mongodb+srv://` URI without
//!   `replicaSet`, however many hosts its SRV records list): requests are balanced round-robin
//!   over the hosts whose last hello succeeded. An SRV list changes at run time
//!   (`crate::upstream::srv` polls it): [`Topology::add_server`] and
//!   [`Topology::remove_server`].

mod connector;
mod monitor;
mod select;
mod state;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    sync::{atomic::AtomicUsize, Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

pub use connector::MongoConnector;
pub use monitor::MonitorSettings;
pub use select::{parse_read_preference, ReadFilter, ReadPref, ReadPrefError, SelectError};
pub use state::{ServerState, Snapshot};

use super::{HelloFacts, Host, Role, UpstreamUri};

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

/// The upstream topology; shared by every session.
pub struct Topology {
    kind: Kind,
    seeds: Vec<Host>,
    state: watch::Sender<Snapshot>,
    check_now: Notify,
    next: AtomicUsize,
    /// Each monitored server's own token (a child of the monitors' token): cancelled when the
    /// server leaves the topology.
    monitored: Mutex<HashMap<String, CancellationToken>>,
    /// What [`Topology::spawn_monitors`] was given, for the servers added later.
    monitoring: Mutex<Option<(MonitorSettings, CancellationToken)>>,
    /// Servers removed from the topology (they left the SRV records): what a monitor or a
    /// pooled connection still reports of them is ignored, so they are never selected.
    removed: std::sync::RwLock<Vec<Host>>,
    /// Servers an operator drained (`POST /servers/{host}/drain`): never selected for a new
    /// session or checkout until enabled again.
    drained: std::sync::RwLock<Vec<Host>>,
    /// The one server is a load balancer (`loadBalanced=true`).
    load_balanced: bool,
    /// The monitors' heartbeat in milliseconds (for staleness estimates; 500 until the
    /// monitors start).
    heartbeat_ms: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("kind", &self.kind)
            .field("snapshot", &*self.state.borrow())
            .finish()
    }
}

impl Topology {
    /// The topology the URI describes, nothing known yet.
    pub fn from_uri(uri: &UpstreamUri) -> Arc<Topology> {
        let load_balanced = uri
            .option("loadBalanced")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let kind = match uri.option("replicaSet") {
            Some(name) => Kind::ReplicaSet(name.to_owned()),
            None if uri.hosts.len() > 1 => Kind::Mongos,
            // An SRV list may grow at the next poll: monitored and balanced like mongos from
            // the start, even with one host.
            None if uri.srv.is_some() && !load_balanced => Kind::Mongos,
            None => Kind::Single,
        };
        let servers = uri
            .hosts
            .iter()
            // A single server is used without monitoring: treat it as serving.
            .map(|h| {
                ServerState::new(
                    h.clone(),
                    (kind == Kind::Single).then_some(Role::Standalone),
                )
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
            monitored: Mutex::new(HashMap::new()),
            monitoring: Mutex::new(None),
            removed: std::sync::RwLock::new(Vec::new()),
            drained: std::sync::RwLock::new(Vec::new()),
            heartbeat_ms: std::sync::atomic::AtomicU64::new(500),
            load_balanced: uri.load_balanced(),
        })
    }

    /// Drains `host` (`true`) or enables it again (`false`): a drained server is not selected
    /// for new sessions (passthrough) or checkouts (pooled); what runs on it finishes. False
    /// when `host` is not one of the topology's servers.
    pub fn set_drained(&self, host: &Host, drained: bool) -> bool {
        let known = self.state.borrow().servers.iter().any(|s| &s.host == host)
            || self.seeds.contains(host);
        if !known {
            return false;
        }
        {
            let mut d = self
                .drained
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            d.retain(|h| h != host);
            if drained {
                d.push(host.clone());
            }
        }
        // Selections waiting for a server look again.
        self.state.send_modify(|_| {});
        true
    }

    /// The upstream is a load balancer in front of mongos: every first hello says
    /// `loadBalanced: true`, and a client's cursors and transactions stay on the upstream
    /// connection that opened them (another connection may reach another mongos).
    pub fn load_balanced(&self) -> bool {
        self.load_balanced
    }

    /// The monitors' heartbeat interval.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The drained servers.
    pub fn drained(&self) -> Vec<Host> {
        self.drained
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
        if self.is_removed(host) {
            return;
        }
        self.state.send_if_modified(|s| {
            // The last write date changes at every hello and is not a change of the limits.
            let mut changed = s
                .facts
                .as_ref()
                .is_none_or(|old| !old.same_but_freshness(facts));
            s.facts = Some(facts.clone());
            if self.kind != Kind::Single {
                changed |= s.update(host, Some(facts.role), facts.election_id);
                changed |= s.note_hello(host, facts, tokio::time::Instant::now());
            }
            changed
        });
    }

    /// Marks `host` unknown (its monitor failed, or it answered "not primary").
    pub fn mark_unknown(&self, host: &Host) {
        if self.kind == Kind::Single || self.is_removed(host) {
            return;
        }
        self.state.send_if_modified(|s| s.update(host, None, None));
        self.check_now.notify_waiters();
    }
}

impl Topology {
    /// The servers of the topology now (seeds, discovered and added ones, not removed ones).
    pub fn servers(&self) -> Vec<Host> {
        self.state
            .borrow()
            .servers
            .iter()
            .map(|s| s.host.clone())
            .collect()
    }

    /// True when `host` was removed ([`Topology::remove_server`]) and not added back.
    pub fn is_removed(&self, host: &Host) -> bool {
        self.removed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(host)
    }

    /// Adds `host` (a new SRV target of a mongos list), role unknown until its monitor's
    /// first hello; monitored at once when the monitors run. False when it was already there.
    pub fn add_server(self: &Arc<Self>, host: &Host) -> bool {
        self.removed
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|h| h != host);
        let added = self.state.send_if_modified(|s| s.discover(host));
        let monitoring = self
            .monitoring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((settings, cancel)) = monitoring {
            if !cancel.is_cancelled() {
                self.spawn_monitor(host.clone(), settings, cancel);
            }
        }
        added
    }

    /// Removes `host` (it left the SRV records): its monitor stops, and it is never selected
    /// again, whatever a late hello says of it, unless added back. What runs on it finishes.
    /// False when it was not there.
    pub fn remove_server(&self, host: &Host) -> bool {
        {
            let mut removed = self.removed.write().unwrap_or_else(PoisonError::into_inner);
            if !removed.contains(host) {
                removed.push(host.clone());
            }
        }
        if let Some(token) = self
            .monitored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&host.to_string())
        {
            token.cancel();
        }
        self.state.send_if_modified(|s| {
            let before = s.servers.len();
            s.servers.retain(|x| &x.host != host);
            s.servers.len() != before
        })
    }
}
