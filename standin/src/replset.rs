//! Multi-member replica sets: one shared store, per-member listeners, roles and step-downs.
//!
//! Replication is "perfect": every member reads and writes the same [`Store`], so a write
//! acknowledged by the primary is visible on every member at once. Everything else is per
//! member, as with real `mongod`s: listener, connection ids, cursors, [`crate::Stats`],
//! `topologyVersion.processId`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::scram::UserDb;
use crate::server::{present, StandIn};
use crate::store::Store;
use crate::StandInConfig;

/// Configuration of a [`ReplicaSet`].
#[derive(Debug, Clone)]
pub struct ReplicaSetConfig {
    /// The replica set name (`setName` in `hello`, `replicaSet=` in [`ReplicaSet::uri`]).
    pub name: String,
    /// Number of members (at least 1).
    pub members: usize,
    /// Settings shared by every member. `listen` with port 0 gives each member its own free
    /// port; a fixed port `P` makes member `i` listen on `P + i`. `replica_set` is ignored
    /// (every member presents set `name`).
    pub base: StandInConfig,
}

/// A member's view of the set, taken under the lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoleSnapshot {
    pub(crate) primary: Option<usize>,
    pub(crate) term: i64,
    /// `topologyVersion.counter` of the member asked about.
    pub(crate) counter: i64,
}

#[derive(Debug)]
struct Inner {
    primary: Option<usize>,
    /// The current primary, or the member a pending step-down will elect.
    target: usize,
    /// Election term: starts at 1, +1 at every election. `electionId` is derived from it.
    term: i64,
    /// `topologyVersion.counter` of each member: +1 at each role change of that member.
    counters: Vec<i64>,
    /// +1 at every step-down, so that a pending election of an older step-down is dropped.
    epoch: u64,
}

/// State shared by the members of a set.
#[derive(Debug)]
pub(crate) struct SetState {
    pub(crate) name: String,
    /// "host:port" of every member, in member order.
    pub(crate) hosts: Vec<String>,
    inner: Mutex<Inner>,
    /// Bumped at every role change (wakes awaitable `hello`s).
    changed: watch::Sender<u64>,
    runtime: tokio::runtime::Handle,
    cancel: CancellationToken,
    /// Per member: its `tags` (the replica set config's `members[i].tags`) and how far its
    /// replication lags (its `lastWrite.lastWriteDate` is that much in the past).
    member_facts: Mutex<Vec<(bson::Document, Duration)>>,
}

/// `electionId` for a term, in mongod's format (`7fffffff` + 8-byte big-endian term).
pub(crate) fn election_id(term: i64) -> ObjectId {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
    b[4..].copy_from_slice(&term.to_be_bytes());
    ObjectId::from_bytes(b)
}

impl SetState {
    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }

    pub(crate) fn snapshot(&self, member: usize) -> RoleSnapshot {
        let g = self.inner.lock();
        RoleSnapshot {
            primary: g.primary,
            term: g.term,
            counter: g.counters.get(member).copied().unwrap_or(0),
        }
    }

    pub(crate) fn primary(&self) -> Option<usize> {
        self.inner.lock().primary
    }

    /// The member a step-down without an explicit target elects: the one after the current
    /// (or pending) primary.
    pub(crate) fn next_member(&self) -> usize {
        (self.inner.lock().target + 1) % self.len()
    }

    /// Member `i`'s tags and replication lag.
    pub(crate) fn member_facts(&self, i: usize) -> (bson::Document, Duration) {
        self.member_facts.lock().get(i).cloned().unwrap_or_default()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The current primary (if any) becomes a secondary now; `new_primary` is elected after
    /// `gap` (at once if `gap` is zero). A later step-down cancels a pending election.
    pub(crate) fn step_down(self: &Arc<Self>, new_primary: usize, gap: Duration) {
        assert!(
            new_primary < self.len(),
            "step_down: member {new_primary} does not exist (the set has {} members)",
            self.len()
        );
        let epoch = {
            let mut g = self.inner.lock();
            g.epoch += 1;
            if let Some(old) = g.primary.take() {
                g.counters[old] += 1;
                info!(set = %self.name, member = old, "primary stepped down");
            }
            g.target = new_primary;
            g.epoch
        };
        self.notify();
        if gap.is_zero() {
            self.elect(new_primary, epoch);
        } else {
            let me = self.clone();
            self.runtime.spawn(async move {
                tokio::select! {
                    _ = me.cancel.cancelled() => {}
                    _ = tokio::time::sleep(gap) => me.elect(new_primary, epoch),
                }
            });
        }
    }

    fn elect(&self, member: usize, epoch: u64) {
        {
            let mut g = self.inner.lock();
            if g.epoch != epoch || g.primary.is_some() {
                return;
            }
            g.primary = Some(member);
            g.term += 1;
            g.counters[member] += 1;
            info!(set = %self.name, member, term = g.term, "new primary elected");
        }
        self.notify();
    }
}

/// A replica set of [`StandIn`]s sharing one in-memory store (perfect, instantaneous
/// replication). Member 0 is primary at start. Each member is a complete [`StandIn`] with its
/// own listener, connection ids, cursors (a cursor lives on the member that opened it) and
/// [`crate::Stats`].
///
/// On a member that is not primary, write commands fail with `NotWritablePrimary` (10107),
/// reads fail with `NotPrimaryNoSecondaryOk` (13435) unless the request allows secondaries
/// (`$readPreference` with a mode other than `primary`, or the OP_QUERY secondaryOk flag), and
/// fire-and-forget writes (legacy OP_INSERT/OP_UPDATE/OP_DELETE, OP_MSG with `moreToCome`)
/// make the member close the connection, as mongod does.
pub struct ReplicaSet {
    members: Vec<StandIn>,
    set: Arc<SetState>,
}

impl ReplicaSet {
    /// Binds every member's listener and starts serving on the current tokio runtime.
    pub async fn start(cfg: ReplicaSetConfig) -> std::io::Result<ReplicaSet> {
        if cfg.members == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a replica set needs at least one member",
            ));
        }
        let mut listeners = Vec::with_capacity(cfg.members);
        for i in 0..cfg.members {
            let mut addr: SocketAddr = cfg.base.listen;
            if addr.port() != 0 {
                let port = u16::try_from(usize::from(addr.port()) + i).map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("member {i}: port out of range"),
                    )
                })?;
                addr.set_port(port);
            }
            listeners.push(TcpListener::bind(addr).await?);
        }
        let mut hosts = Vec::with_capacity(cfg.members);
        for l in &listeners {
            hosts.push(present(l.local_addr()?));
        }
        let (changed, _) = watch::channel(0u64);
        let set = Arc::new(SetState {
            name: cfg.name.clone(),
            hosts,
            inner: Mutex::new(Inner {
                primary: Some(0),
                target: 0,
                term: 1,
                counters: vec![0; cfg.members],
                epoch: 0,
            }),
            changed,
            runtime: tokio::runtime::Handle::current(),
            cancel: CancellationToken::new(),
            member_facts: Mutex::new(vec![(bson::Document::new(), Duration::ZERO); cfg.members]),
        });
        let user_list = cfg.base.users.clone();
        let users = Arc::new(
            tokio::task::spawn_blocking(move || UserDb::new(&user_list))
                .await
                .map_err(std::io::Error::other)?,
        );
        let store = Arc::new(Store::default());
        let mut member_cfg = cfg.base.clone();
        member_cfg.replica_set = Some(cfg.name.clone());
        let mut members = Vec::with_capacity(cfg.members);
        for (i, listener) in listeners.into_iter().enumerate() {
            members.push(StandIn::start_member(
                member_cfg.clone(),
                listener,
                users.clone(),
                store.clone(),
                Some((set.clone(), i)),
            )?);
        }
        info!(set = %cfg.name, members = cfg.members, "replica set started");
        Ok(ReplicaSet { members, set })
    }

    /// Sets member `i`'s replica-set tags (its hello's `tags`, as `members[i].tags` in a
    /// replica set config does); `{}` removes them.
    pub fn set_tags(&self, i: usize, tags: bson::Document) {
        if let Some(m) = self.set.member_facts.lock().get_mut(i) {
            m.0 = tags;
        }
        self.set.notify();
    }

    /// Makes member `i` lag `lag` behind: its hello's `lastWrite.lastWriteDate` is that far
    /// in the past (replication itself stays perfect: reads see every write).
    pub fn set_lag(&self, i: usize, lag: Duration) {
        if let Some(m) = self.set.member_facts.lock().get_mut(i) {
            m.1 = lag;
        }
    }

    /// Every member, in order.
    pub fn members(&self) -> &[StandIn] {
        &self.members
    }

    /// Member `i`. Panics if there is no such member.
    pub fn member(&self, i: usize) -> &StandIn {
        &self.members[i]
    }

    /// The index of the current primary; `None` during a step-down gap.
    pub fn primary(&self) -> Option<usize> {
        self.set.primary()
    }

    /// The set's name.
    pub fn name(&self) -> &str {
        &self.set.name
    }

    /// A seed list connection string, e.g.
    /// `mongodb://127.0.0.1:5001,127.0.0.1:5002,127.0.0.1:5003/?replicaSet=rs0`.
    pub fn uri(&self) -> String {
        format!(
            "mongodb://{}/?replicaSet={}",
            self.set.hosts.join(","),
            self.set.name
        )
    }

    /// The current primary (if any) becomes a secondary at once; there is no primary for
    /// `gap`; then `new_primary` becomes primary (from a spawned timer; `Duration::ZERO`
    /// elects it before returning). A step-down during a gap cancels the pending election.
    /// Every role change increments that member's `topologyVersion.counter`, and each election
    /// gets a new, larger `electionId`. The timer runs on the runtime that started the set
    /// (this method itself may be called from anywhere).
    ///
    /// Panics if `new_primary` is not a member index.
    pub fn step_down(&self, new_primary: usize, gap: Duration) {
        self.set.step_down(new_primary, gap);
    }

    /// Stops every member and waits for all their tasks to end.
    pub async fn shutdown(mut self) {
        self.set.cancel.cancel();
        for m in std::mem::take(&mut self.members) {
            m.shutdown().await;
        }
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        self.set.cancel.cancel();
    }
}

impl std::fmt::Debug for ReplicaSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSet")
            .field("name", &self.set.name)
            .field("hosts", &self.set.hosts)
            .field("primary", &self.set.primary())
            .finish_non_exhaustive()
    }
}
