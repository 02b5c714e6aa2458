//! The listener, shared server state and the public [`StandIn`] handle.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::cursor::{Cursors, CURSOR_TIMEOUT};
use crate::fault::{Fault, FaultCell};
use crate::replset::{RoleSnapshot, SetState};
use crate::scram::UserDb;
use crate::stats::Stats;
use crate::store::Store;
use crate::StandInConfig;

/// State shared by every connection of one stand-in.
pub(crate) struct Shared {
    pub(crate) config: StandInConfig,
    /// The actual listening address.
    pub(crate) addr: SocketAddr,
    pub(crate) stats: Arc<Stats>,
    pub(crate) fault: FaultCell,
    /// mongod's test fail points (`configureFailPoint`).
    pub(crate) failpoints: crate::failpoint::FailPoints,
    /// The data; shared by every member of a [`crate::ReplicaSet`].
    pub(crate) store: Arc<Store>,
    pub(crate) cursors: Cursors,
    /// Sessions and their transaction numbers (per member, as on mongod).
    pub(crate) sessions: crate::txn::Sessions,
    pub(crate) users: Arc<UserDb>,
    /// `topologyVersion.processId`, fixed for the life of the server.
    pub(crate) process_id: ObjectId,
    /// `electionId` in (one-member) replica-set mode.
    pub(crate) election_id: ObjectId,
    /// `Some((set, index))` for a member of a multi-member [`crate::ReplicaSet`].
    pub(crate) member: Option<(Arc<SetState>, usize)>,
    next_connection_id: AtomicI64,
    pub(crate) cancel: CancellationToken,
    pub(crate) started: Instant,
}

impl Shared {
    pub(crate) fn next_connection_id(&self) -> i64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    /// "host:port" as presented to clients (an unspecified listen address becomes loopback).
    pub(crate) fn host_port(&self) -> String {
        present(self.addr)
    }

    /// This member's role, for a member of a multi-member set.
    pub(crate) fn role(&self) -> Option<RoleSnapshot> {
        self.member.as_ref().map(|(set, i)| set.snapshot(*i))
    }

    /// Index in its replica set (0 for a plain stand-in).
    pub(crate) fn member_index(&self) -> usize {
        self.member.as_ref().map(|(_, i)| *i).unwrap_or(0)
    }

    /// False only on a set member that is not the primary right now.
    pub(crate) fn is_writable_primary(&self) -> bool {
        match &self.member {
            Some((set, i)) => set.primary() == Some(*i),
            None => true,
        }
    }

    /// This member's `topologyVersion.counter` (always 0 for a plain stand-in).
    pub(crate) fn topology_counter(&self) -> i64 {
        self.role().map(|r| r.counter).unwrap_or(0)
    }
}

/// "host:port" as presented to clients (an unspecified address becomes loopback).
pub(crate) fn present(mut a: SocketAddr) -> String {
    if a.ip().is_unspecified() {
        a.set_ip(if a.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    a.to_string()
}

/// A running stand-in server. Dropping it stops the listener and closes all connections
/// (without waiting); [`StandIn::shutdown`] does the same and waits for every task to finish.
pub struct StandIn {
    shared: Arc<Shared>,
    tracker: TaskTracker,
}

impl StandIn {
    /// Binds the listener and starts serving on the current tokio runtime.
    pub async fn start(config: StandInConfig) -> std::io::Result<StandIn> {
        let listener = TcpListener::bind(config.listen).await?;
        let user_list = config.users.clone();
        // Key derivation (10000 PBKDF2 rounds for SCRAM-SHA-1) is CPU work: keep it off
        // the async threads.
        let users = tokio::task::spawn_blocking(move || UserDb::new(&user_list))
            .await
            .map_err(std::io::Error::other)?;
        Self::start_member(
            config,
            listener,
            Arc::new(users),
            Arc::new(Store::default()),
            None,
        )
    }

    /// Starts serving on a bound listener (a plain stand-in, or one member of a set).
    pub(crate) fn start_member(
        config: StandInConfig,
        listener: TcpListener,
        users: Arc<UserDb>,
        store: Arc<Store>,
        member: Option<(Arc<SetState>, usize)>,
    ) -> std::io::Result<StandIn> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            addr,
            stats: Arc::new(Stats::default()),
            fault: FaultCell::default(),
            failpoints: Default::default(),
            store,
            cursors: Cursors::default(),
            sessions: crate::txn::Sessions::default(),
            users,
            process_id: ObjectId::new(),
            election_id: crate::replset::election_id(1),
            member,
            next_connection_id: AtomicI64::new(1),
            cancel: CancellationToken::new(),
            started: Instant::now(),
        });
        let tracker = TaskTracker::new();
        tracker.spawn(accept_loop(listener, shared.clone(), tracker.clone()));
        tracker.spawn(sweep_cursors(shared.clone()));
        info!(
            %addr,
            wire_version = shared.config.wire_version,
            member = ?shared.member.as_ref().map(|(_, i)| *i),
            "mongoguard-standin started"
        );
        Ok(StandIn { shared, tracker })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A connection string for this server, e.g. `mongodb://127.0.0.1:27018`.
    pub fn uri(&self) -> String {
        format!("mongodb://{}", self.shared.host_port())
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// Changes the injected fault; it applies to messages received from now on, on every
    /// connection ([`Fault::CloseImmediately`] applies to connections accepted from now on).
    pub fn set_fault(&self, fault: Fault) {
        info!(?fault, "fault set");
        self.shared.fault.set(fault);
    }

    /// Stops accepting, closes every connection and waits for all tasks to end.
    pub async fn shutdown(self) {
        self.shared.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        info!(addr = %self.shared.addr, "mongoguard-standin stopped");
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

impl std::fmt::Debug for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandIn")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, tracker: TaskTracker) {
    loop {
        let accepted = tokio::select! {
            _ = shared.cancel.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((sock, peer)) => {
                shared.stats.on_accept();
                if shared.fault.get() == Fault::CloseImmediately {
                    debug!(%peer, "fault: closing connection on accept");
                    drop(sock);
                    shared.stats.on_close();
                    continue;
                }
                if let Err(e) = sock.set_nodelay(true) {
                    debug!(%peer, error = %e, "set_nodelay failed");
                }
                tracker.spawn(crate::conn::serve(shared.clone(), sock, peer));
            }
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::select! {
                    _ = shared.cancel.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        }
    }
}

async fn sweep_cursors(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = shared.cancel.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                let n = shared.cursors.sweep(CURSOR_TIMEOUT);
                if n > 0 {
                    debug!(expired = n, "idle cursors removed");
                }
            }
        }
    }
}
