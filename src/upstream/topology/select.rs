//! Server selection: which known server a request goes to, by read preference, waiting for
//! one to qualify during a failover.

use std::{sync::atomic::Ordering, time::Duration};

use super::{Kind, Snapshot, Topology};
use crate::upstream::{Host, Role};

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

impl Topology {
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
        let drained = self
            .drained
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let open = |h: &&Host| !drained.contains(h);
        match self.kind {
            Kind::Single => snap.servers.first().map(|s| &s.host).filter(open).cloned(),
            // A listed server that is a plain mongod (a misconfiguration the monitor warns
            // about, or a test stand-in) is used like a mongos.
            Kind::Mongos => self.round_robin(
                snap.with_role(Role::Mongos)
                    .chain(snap.with_role(Role::Standalone))
                    .filter(open)
                    .collect(),
            ),
            Kind::ReplicaSet(_) => {
                let primary = || snap.primary().filter(open).cloned();
                let secondary =
                    || self.round_robin(snap.with_role(Role::Secondary).filter(open).collect());
                match pref {
                    ReadPref::Primary => primary(),
                    ReadPref::PrimaryPreferred => primary().or_else(secondary),
                    ReadPref::Secondary => secondary(),
                    ReadPref::SecondaryPreferred => secondary().or_else(primary),
                    ReadPref::Nearest => self.round_robin(
                        snap.with_role(Role::Primary)
                            .chain(snap.with_role(Role::Secondary))
                            .filter(open)
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
}
