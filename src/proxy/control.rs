//! What an operator acts on while the proxy runs (the admin API's `/connections`, `/pause`,
//! `/resume`): a registry of the live client connections, each killable on its own, and a
//! pause gate that holds new requests while an upstream is under maintenance.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, SystemTime},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The operator's handles on a running proxy.
pub struct Control {
    next_id: AtomicU64,
    connections: Mutex<BTreeMap<u64, Arc<Connection>>>,
    paused: watch::Sender<bool>,
    /// Connections per application / per user, for their limits.
    per_app: Mutex<HashMap<String, usize>>,
    per_user: Mutex<HashMap<String, usize>>,
    per_network: Mutex<HashMap<String, usize>>,
    /// What [`Control::fire_all`] fired (drain, kill): a connection registered later starts
    /// with it.
    fired: AtomicU8,
}

/// Which limit a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `pool.max_connections_per_app`.
    App,
    /// `pool.max_connections_per_user`.
    User,
}

/// One live client connection.
pub struct Connection {
    /// Stable id, unique for the process's life (`/connections/{id}/kill`).
    pub id: u64,
    /// The client's address.
    pub peer: SocketAddr,
    /// When it was accepted.
    pub opened: SystemTime,
    /// Cancelled to close it (the operator's kill, or the proxy's own at the drain deadline).
    /// Waited on off the session task; the session itself waits on `stop`. Both are set by
    /// [`Connection::kill`] and [`Control::fire_all`].
    pub kill: CancellationToken,
    /// The session task's lock-free view of the kill and of the proxy's drain.
    pub(crate) stop: super::stop::Stop,
    /// Requests read from it.
    pub requests: AtomicU64,
    /// A request of it is being served now.
    pub active: AtomicBool,
    who: Mutex<Who>,
    /// The application and user this connection is counted under (released when it ends).
    claims: Mutex<(Option<String>, Option<String>)>,
}

#[derive(Default, Clone)]
struct Who {
    app: Option<String>,
    driver: Option<String>,
    user: Option<String>,
}

/// A connection as `/connections` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRow {
    /// Id.
    pub id: u64,
    /// Client address.
    pub peer: SocketAddr,
    /// Seconds since it was accepted.
    pub age_secs: u64,
    /// Application name from its handshake.
    pub app: Option<String>,
    /// Driver name and version from its handshake.
    pub driver: Option<String>,
    /// The user it authenticated as (pooled mode).
    pub user: Option<String>,
    /// Requests so far.
    pub requests: u64,
    /// "active" while a request is served, else "idle".
    pub state: &'static str,
}

/// Removes its connection from the registry when the session ends, whatever ended it.
pub struct Registered {
    control: Arc<Control>,
    /// The connection.
    pub connection: Arc<Connection>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.control
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.connection.id);
        let claims = std::mem::take(
            &mut *self
                .connection
                .claims
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if let Some(app) = claims.0 {
            release(&self.control.per_app, &app);
        }
        if let Some(user) = claims.1 {
            release(&self.control.per_user, &user);
        }
    }
}

/// A connection counted under its client network; uncounted when dropped.
pub struct NetworkClaim {
    control: Arc<Control>,
    key: String,
}

impl Drop for NetworkClaim {
    fn drop(&mut self) {
        release(&self.control.per_network, &self.key);
    }
}

/// `peer`'s network as `ADDRESS/PREFIX` (IPv4-mapped IPv6 addresses count as IPv4).
pub fn network_of(peer: std::net::IpAddr, v4_prefix: u8, v6_prefix: u8) -> String {
    use std::net::IpAddr;
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
    match peer {
        IpAddr::V4(a) => {
            let bits = v4_prefix.min(32);
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            let net = std::net::Ipv4Addr::from(u32::from(a) & mask);
            format!("{net}/{bits}")
        }
        IpAddr::V6(a) => {
            let bits = v6_prefix.min(128);
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            let net = std::net::Ipv6Addr::from(u128::from(a) & mask);
            format!("{net}/{bits}")
        }
    }
}

fn release(table: &Mutex<HashMap<String, usize>>, key: &str) {
    let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = t.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            t.remove(key);
        }
    }
}

impl Default for Control {
    fn default() -> Self {
        Control {
            next_id: AtomicU64::new(1),
            connections: Mutex::default(),
            paused: watch::Sender::new(false),
            per_app: Mutex::default(),
            per_user: Mutex::default(),
            per_network: Mutex::default(),
            fired: AtomicU8::new(0),
        }
    }
}

impl Control {
    /// Registers a new connection; its kill token is a child of `parent` (the proxy's own).
    pub fn register(self: &Arc<Self>, peer: SocketAddr, parent: &CancellationToken) -> Registered {
        let connection = Arc::new(Connection {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            opened: SystemTime::now(),
            kill: parent.child_token(),
            stop: super::stop::Stop::default(),
            requests: AtomicU64::new(0),
            active: AtomicBool::new(false),
            who: Mutex::default(),
            claims: Mutex::default(),
        });
        {
            let mut all = self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Under the lock `fire_all` holds: either it sees this connection or this sees
            // what it fired.
            let fired = self.fired.load(Ordering::SeqCst);
            if fired != 0 {
                connection.stop.fire(fired);
            }
            all.insert(connection.id, connection.clone());
        }
        Registered {
            control: self.clone(),
            connection,
        }
    }

    /// Closes connection `id`: its session ends at its next await (a reply being relayed is
    /// not cut mid-message toward the client: the session stops where it stands and closes
    /// the socket). False when there is no such connection.
    pub fn kill(&self, id: u64) -> bool {
        let found = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned();
        match found {
            Some(c) => {
                c.kill();
                true
            }
            None => false,
        }
    }

    /// Fires `bits` ([`super::stop::DRAIN`], [`super::stop::KILL`]) on every live connection
    /// and on every one registered from now on (the proxy's drain and its drain deadline; the
    /// caller cancels the proxy's own tokens too).
    pub(crate) fn fire_all(&self, bits: u8) {
        let all = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.fired.fetch_or(bits, Ordering::SeqCst);
        for c in all.values() {
            c.stop.fire(bits);
        }
    }

    /// Every live connection, oldest first.
    pub fn rows(&self) -> Vec<ConnectionRow> {
        let conns: Vec<Arc<Connection>> = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let now = SystemTime::now();
        conns
            .iter()
            .map(|c| {
                let who = c.who.lock().unwrap_or_else(PoisonError::into_inner).clone();
                ConnectionRow {
                    id: c.id,
                    peer: c.peer,
                    age_secs: now.duration_since(c.opened).map_or(0, |d| d.as_secs()),
                    app: who.app,
                    driver: who.driver,
                    user: who.user,
                    requests: c.requests.load(Ordering::Relaxed),
                    state: if c.active.load(Ordering::Relaxed) {
                        "active"
                    } else {
                        "idle"
                    },
                }
            })
            .collect()
    }

    /// Counts `conn` under `key` for the `kind` limit (`0`: none), once per connection and
    /// kind (a later claim of the same kind replaces nothing). False when `limit` connections
    /// are already counted under `key`: the caller refuses this one.
    pub fn claim(&self, conn: &Connection, kind: LimitKind, key: &str, limit: usize) -> bool {
        if limit == 0 {
            return true;
        }
        let mut claims = conn.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let (slot, table) = match kind {
            LimitKind::App => (&mut claims.0, &self.per_app),
            LimitKind::User => (&mut claims.1, &self.per_user),
        };
        if slot.is_some() {
            return true;
        }
        let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
        let n = t.entry(key.to_owned()).or_insert(0);
        if *n >= limit {
            if *n == 0 {
                t.remove(key);
            }
            return false;
        }
        *n += 1;
        *slot = Some(key.to_owned());
        true
    }

    /// Counts a new connection from `peer` under its network (the address with only its
    /// first `v4_prefix` / `v6_prefix` bits kept) for `pool.max_connections_per_network`.
    /// `Ok(None)`: no limit; `Ok(Some)`: counted until the claim drops; `Err(network)`:
    /// that network already has `limit` connections.
    pub fn claim_network(
        self: &Arc<Self>,
        peer: std::net::IpAddr,
        v4_prefix: u8,
        v6_prefix: u8,
        limit: usize,
    ) -> Result<Option<NetworkClaim>, String> {
        if limit == 0 {
            return Ok(None);
        }
        let key = network_of(peer, v4_prefix, v6_prefix);
        let mut t = self
            .per_network
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = t.entry(key.clone()).or_insert(0);
        if *n >= limit {
            if *n == 0 {
                t.remove(&key);
            }
            return Err(key);
        }
        *n += 1;
        Ok(Some(NetworkClaim {
            control: self.clone(),
            key,
        }))
    }

    /// Holds new requests (`true`) or lets them go (`false`). Returns the previous state.
    pub fn set_paused(&self, paused: bool) -> bool {
        self.paused.send_replace(paused)
    }

    /// True while paused.
    pub fn paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Waits while the proxy is paused, at most `limit`, or until `kill`. True when the
    /// request may go on; false when the pause outlasted `limit`.
    pub async fn wait_unpaused(&self, limit: Duration, kill: &CancellationToken) -> bool {
        let mut rx = self.paused.subscribe();
        if !*rx.borrow_and_update() {
            return true;
        }
        let resumed = async {
            while rx.changed().await.is_ok() {
                if !*rx.borrow_and_update() {
                    return true;
                }
            }
            false
        };
        tokio::select! {
            r = tokio::time::timeout(limit, resumed) => r.unwrap_or(false),
            _ = kill.cancelled() => false,
        }
    }
}

impl Connection {
    /// Closes this connection: its session ends at its next await.
    pub fn kill(&self) {
        self.kill.cancel();
        self.stop.fire(super::stop::KILL);
    }

    /// Records the handshake's application and driver.
    pub fn set_client(&self, app: Option<&str>, driver: Option<&str>) {
        let mut who = self.who.lock().unwrap_or_else(PoisonError::into_inner);
        who.app = app.map(str::to_owned);
        who.driver = driver.map(str::to_owned);
    }

    /// Records the authenticated user (pooled mode).
    pub fn set_user(&self, user: &str) {
        self.who.lock().unwrap_or_else(PoisonError::into_inner).user = Some(user.to_owned());
    }
}

#[cfg(test)]
mod network_tests {
    use super::*;

    /// The session task waits on `Connection::stop`, not on the tokens: every way of ending a
    /// connection must set it, including for a connection accepted after the drain started.
    #[test]
    fn kill_and_drain_reach_the_stop_flag_of_live_and_later_connections() {
        use crate::proxy::stop::{DRAIN, KILL};
        let c = Arc::new(Control::default());
        let root = CancellationToken::new();
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let live = c.register(peer, &root);
        let other = c.register(peer, &root);
        assert!(!live.connection.stop.has(KILL | DRAIN));
        assert!(c.kill(live.connection.id));
        assert!(live.connection.stop.is_killed() && live.connection.kill.is_cancelled());
        assert!(
            !other.connection.stop.has(KILL | DRAIN),
            "a kill is per connection"
        );
        c.fire_all(DRAIN);
        assert!(other.connection.stop.has(DRAIN) && !other.connection.stop.is_killed());
        let later = c.register(peer, &root);
        assert!(
            later.connection.stop.has(DRAIN),
            "accepted after the drain started"
        );
        c.fire_all(KILL);
        assert!(other.connection.stop.is_killed() && later.connection.stop.is_killed());
        assert!(c.register(peer, &root).connection.stop.is_killed());
    }

    #[test]
    fn networks_and_their_limit() {
        let v4: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(network_of(v4, 24, 64), "10.1.2.0/24");
        assert_eq!(network_of(v4, 32, 64), "10.1.2.3/32");
        assert_eq!(network_of(v4, 0, 64), "0.0.0.0/0");
        let mapped: std::net::IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(network_of(mapped, 16, 64), "10.1.0.0/16");
        let v6: std::net::IpAddr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
        assert_eq!(network_of(v6, 24, 64), "2001:db8:1:2::/64");
        let c = Arc::new(Control::default());
        let a = c.claim_network(v4, 24, 64, 2).unwrap().unwrap();
        let b = c
            .claim_network("10.1.2.200".parse().unwrap(), 24, 64, 2)
            .unwrap()
            .unwrap();
        assert_eq!(
            c.claim_network("10.1.2.9".parse().unwrap(), 24, 64, 2)
                .err(),
            Some("10.1.2.0/24".to_owned())
        );
        // Another network is not affected; a closed connection frees its place.
        assert!(c
            .claim_network("10.1.3.1".parse().unwrap(), 24, 64, 2)
            .is_ok());
        drop(a);
        let again = c.claim_network(v4, 24, 64, 2).unwrap();
        assert!(again.is_some());
        drop((b, again));
        assert!(c.per_network.lock().unwrap().is_empty());
        assert!(c.claim_network(v4, 24, 64, 0).unwrap().is_none());
    }
}
