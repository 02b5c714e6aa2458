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
                changed
            }
            None => {
                self.servers.push(ServerState {
                    host: host.clone(),
                    role,
                    election_id,
                });
                true
            }
        }
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
