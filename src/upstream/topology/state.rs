//! What is known of the servers: a [`Snapshot`] of every [`ServerState`], and how a hello
//! or a failure changes it.

use std::sync::Arc;

use tracing::debug;

use crate::upstream::{HelloFacts, Host, Role};

/// What is known about one server.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// The server.
    pub host: Host,
    /// Its role from the last hello; `None` while unknown (unreachable or not checked yet).
    pub role: Option<Role>,
    /// Its last electionId (primaries).
    election_id: Option<[u8; 12]>,
    /// Its `tags` (replica-set members), for read-preference tag sets.
    pub tags: Vec<(String, String)>,
    /// When its last successful hello arrived, and that hello's `lastWrite.lastWriteDate`
    /// (ms since the epoch): its staleness, for maxStalenessSeconds.
    pub(super) freshness: Option<(tokio::time::Instant, i64)>,
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

    pub(super) fn with_role(&self, role: Role) -> impl Iterator<Item = &Host> {
        self.servers
            .iter()
            .filter(move |s| s.role == Some(role))
            .map(|s| &s.host)
    }
}

impl ServerState {
    /// A server not heard from yet, or one whose role is known without asking.
    pub(super) fn new(host: Host, role: Option<Role>) -> ServerState {
        ServerState {
            host,
            role,
            election_id: None,
            tags: Vec::new(),
            freshness: None,
        }
    }
}

impl Snapshot {
    /// Records what a hello said of `host` (`role` `None`: unknown, unreachable); true when
    /// something changed. A host not listed yet is added.
    pub(super) fn update(
        &mut self,
        host: &Host,
        role: Option<Role>,
        election_id: Option<[u8; 12]>,
    ) -> bool {
        match self.servers.iter_mut().find(|x| &x.host == host) {
            Some(x) => {
                let changed = x.role != role || x.election_id != election_id;
                x.role = role;
                x.election_id = election_id;
                if role.is_none() {
                    x.freshness = None;
                }
                changed
            }
            None => {
                let mut x = ServerState::new(host.clone(), role);
                x.election_id = election_id;
                self.servers.push(x);
                true
            }
        }
    }

    /// Records the tags and the last write date a hello of `host` reported, received `now`;
    /// true when the tags changed. A new last write date alone is no change: every
    /// heartbeat brings one, and every passthrough session watches the snapshot (a
    /// selection waiting for a fresh enough secondary polls instead).
    pub(super) fn note_hello(
        &mut self,
        host: &Host,
        facts: &HelloFacts,
        now: tokio::time::Instant,
    ) -> bool {
        let Some(x) = self.servers.iter_mut().find(|x| &x.host == host) else {
            return false;
        };
        let changed = x.tags != facts.tags;
        if changed {
            x.tags = facts.tags.clone();
        }
        match facts.last_write_date {
            Some(date) => x.freshness = Some((now, date)),
            None => x.freshness = None,
        }
        changed
    }

    /// Adds a member a hello listed, role unknown; true when it was not known.
    pub(super) fn discover(&mut self, host: &Host) -> bool {
        if self.servers.iter().any(|x| &x.host == host) {
            return false;
        }
        debug!(upstream = %host, "discovered replica-set member");
        self.servers.push(ServerState::new(host.clone(), None));
        true
    }
}
