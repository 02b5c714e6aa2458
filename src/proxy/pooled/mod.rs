//! Pooled mode: mongoguard authenticates clients itself, answers their hello, and runs each
//! request on a pre-authenticated upstream connection checked out for exactly one round
//! trip (the whole stream, for exhaust), then returned.
//!
//! Shared state ([`Pooled`], here): the users file, the upstream identities, the topology,
//! the pools, and the pins ([`super::pins`]) that keep a cursor's getMores and a
//! transaction's statements on the server that holds them. A client session's upstream side
//! ([`strategy::PooledSide`]) holds no upstream connection between requests, except right
//! after a legacy fire-and-forget write, whose getLastError must run on the same connection;
//! [`local`] answers hello and authentication.

mod balanced;
mod ender;
pub(crate) mod killer;
mod local;
pub(crate) mod strategy;

use std::{
    sync::{atomic::AtomicI32, Arc, PoisonError},
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{pins::Pins, ProxyError};
use crate::{
    auth::users::Users,
    config::Config,
    upstream::{
        pool::{Pool, PoolKey, REBALANCE_EVERY},
        topology::{Kind, MongoConnector, MonitorSettings, Topology},
        Identities,
    },
};

/// A full pool: mongoguard's own code, outside every code drivers retry or treat as a
/// network error, so a saturated pool does not turn into a retry storm.
pub const CHECKOUT_TIMEOUT_CODE: i32 = 65_002;
/// The codeName paired with [`CHECKOUT_TIMEOUT_CODE`].
pub const CHECKOUT_TIMEOUT_CODE_NAME: &str = "MongoguardPoolTimeout";

/// The pooled-mode state shared by every session.
pub(crate) struct Pooled {
    /// The users file in force (replaced whole on SIGHUP).
    users: std::sync::RwLock<Option<Arc<Users>>>,
    /// Bumped by every users file swapped in: sessions compare it with the one they
    /// authenticated under, and look their user up again when it moved (see
    /// [`strategy::PooledSide`]'s `recheck_user`).
    users_generation: std::sync::atomic::AtomicU64,
    users_file: Option<std::path::PathBuf>,
    /// Held by a users file reload from reading the file to installing it: SIGHUP and
    /// `ProxyHandle::hangup` / `reload_users` at once must never leave the older file in force.
    users_reloading: std::sync::Mutex<()>,
    #[cfg(test)]
    users_after_read: crate::reload_race::AfterRead,
    pub(crate) identities: Identities,
    pub topology: Arc<Topology>,
    pub pool: Pool<MongoConnector>,
    pub pins: Arc<Pins>,
    /// Load-balanced upstream: connections parked for their cursors and transactions.
    pub(crate) balanced:
        balanced::Parked<crate::upstream::pool::Checkout<crate::upstream::UpstreamConn>>,
    pub(crate) connection_ids: AtomicI32,
    /// Client endSessions answered here, ended upstream by [`ender::run`].
    pub(crate) ender: ender::Ender,
    /// The ender's queue until [`Pooled::start_ender`] starts its task.
    ender_queue: std::sync::Mutex<Option<ender::Queue>>,
    server_selection_timeout: Duration,
    reply_timeout: Duration,
    cancel: CancellationToken,
    /// Permits for [`killer::follow_up`]'s background kills.
    stray_kills: Arc<tokio::sync::Semaphore>,
}

impl Pooled {
    /// Loads the users file and identities, and starts the topology monitors and the pool
    /// maintenance. Every user must map to a configured identity. `shards`: the pool's, one
    /// per session loop (1: sessions share the work-stealing runtime).
    pub(crate) fn start(
        config: &Config,
        upstream_tls: Option<crate::tls::UpstreamTls>,
        shards: usize,
    ) -> Result<Arc<Pooled>, ProxyError> {
        let identities = Identities::from_config(&config.upstream)
            .map_err(|e| ProxyError::Pooled(e.to_string()))?;
        let users = match &config.auth.users_file {
            Some(path) => Some(Arc::new(
                load_users(path, &identities).map_err(ProxyError::Pooled)?,
            )),
            None => None,
        };
        let topology = Topology::from_uri(&config.upstream.uri);
        let connector = MongoConnector::new(
            identities.clone(),
            topology.clone(),
            config.upstream.connect_timeout,
            config.proxy.max_message_size,
            upstream_tls.clone(),
        );
        let pool = Pool::sharded(
            connector,
            crate::upstream::pool::PoolConfig::from(&config.pool),
            shards,
        )
        .map_err(|e| ProxyError::Pooled(e.to_string()))?;
        let cancel = CancellationToken::new();
        topology.spawn_monitors(
            MonitorSettings {
                heartbeat: config.upstream.heartbeat_interval,
                connect_timeout: config.upstream.connect_timeout,
                max_message_size: config.proxy.max_message_size,
                tls: upstream_tls,
            },
            cancel.clone(),
        );
        if *topology.kind() == Kind::Single {
            // Known ahead of the first client, so min_idle connections open at once.
            for host in &config.upstream.uri.hosts {
                pool.register(&PoolKey::new(host.clone(), crate::config::DEFAULT_IDENTITY));
            }
        }
        let (ender, ender_queue) = ender::Ender::new();
        let pooled = Arc::new(Pooled {
            users: std::sync::RwLock::new(users),
            users_generation: std::sync::atomic::AtomicU64::new(0),
            users_file: config.auth.users_file.clone(),
            users_reloading: std::sync::Mutex::new(()),
            #[cfg(test)]
            users_after_read: Default::default(),
            identities,
            topology,
            pool,
            pins: Arc::new(Pins::default()),
            balanced: balanced::Parked::default(),
            connection_ids: AtomicI32::new(1),
            ender,
            ender_queue: std::sync::Mutex::new(Some(ender_queue)),
            server_selection_timeout: config.upstream.server_selection_timeout,
            reply_timeout: config.upstream.reply_timeout,
            cancel,
            stray_kills: Arc::new(tokio::sync::Semaphore::new(killer::CONCURRENT)),
        });
        tokio::spawn(maintain(pooled.clone()));
        Ok(pooled)
    }

    /// Sharded pool (sessions on `loops`, one shard each): starts each loop's maintenance of
    /// its own shard (expired connections, `min_idle` opened on the loop that will use them).
    pub(crate) fn start_loop_maintenance(
        self: &Arc<Self>,
        loops: &crate::proxy::loops::SessionLoops,
    ) {
        if self.pool.shards() == 1 {
            return;
        }
        for index in 0..loops.len() {
            loops.spawn_on(index, maintain_shard(self.clone()));
        }
    }

    /// Starts the task that ends client sessions upstream (see [`ender`]), counting them in
    /// `metrics`; once (later calls do nothing).
    pub(crate) fn start_ender(self: &Arc<Self>, metrics: Arc<crate::metrics::Metrics>) {
        let queue = self
            .ender_queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(queue) = queue {
            tokio::spawn(ender::run(self.clone(), queue, metrics));
        }
    }

    /// The users file in force.
    pub(crate) fn users(&self) -> Option<Arc<Users>> {
        self.users
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The generation of the users file in force: read it *before* [`Pooled::users`], so
    /// that a reload between the two shows as a newer generation next time.
    pub(crate) fn users_generation(&self) -> u64 {
        self.users_generation
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// True when a users file is configured (SIGHUP reloads it).
    pub(crate) fn has_users_file(&self) -> bool {
        self.users_file.is_some()
    }

    /// Reads the users file again and swaps it in if it is valid (every user mapping to a
    /// configured identity); otherwise the users in force stay. A connection authenticated
    /// as a user the new file no longer holds is refused from its next request on (as mongod
    /// drops a removed user from its connections); one whose user now maps to another
    /// identity runs as that one from its next request on. Returns the number of users.
    /// Reloads run one at a time: the last to start reads the file last and its users are
    /// the ones in force.
    pub(crate) fn reload_users(&self) -> Result<usize, String> {
        let Some(path) = &self.users_file else {
            return Err("no auth.users_file configured".into());
        };
        let _one_at_a_time = self
            .users_reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let users = load_users(path, &self.identities)?;
        #[cfg(test)]
        self.users_after_read.run();
        let n = users.len();
        let mut slot = self.users.write().unwrap_or_else(PoisonError::into_inner);
        *slot = Some(Arc::new(users));
        // Under the lock: a session that reads the new generation then finds the new users.
        self.users_generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        drop(slot);
        Ok(n)
    }

    /// The gauges of every pool, summed.
    pub(crate) fn pool_totals(&self) -> crate::upstream::pool::PoolStats {
        let mut sum = crate::upstream::pool::PoolStats::default();
        for key in self.pool.keys() {
            sum.absorb(&self.pool.stats(&key));
        }
        sum
    }

    /// Stops monitors and maintenance and closes the pools.
    pub(crate) fn close(&self) {
        self.cancel.cancel();
        self.pool.close();
    }
}

/// Reads and checks a users file: every user must map to a configured upstream identity.
fn load_users(path: &std::path::Path, identities: &Identities) -> Result<Users, String> {
    let users = Users::load(path).map_err(|e| e.to_string())?;
    for user in users.iter() {
        let id = user
            .upstream
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_IDENTITY);
        if identities.get(id).is_none() {
            return Err(format!(
                "users file: user {:?} maps to upstream identity {id:?}, which is not \
                 configured under [upstream.identities]",
                user.name
            ));
        }
    }
    Ok(users)
}

/// Every second: close expired idle connections, open up to `min_idle` (an unsharded
/// pool: a sharded one's loops do, [`maintain_shard`]), expire pins. A sharded pool is
/// rebalanced every [`REBALANCE_EVERY`] as well.
async fn maintain(pooled: Arc<Pooled>) {
    let sharded = pooled.pool.shards() > 1;
    let period = if sharded {
        REBALANCE_EVERY
    } else {
        Duration::from_secs(1)
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Compared with the ticks' scheduled instants, not with when the task woke for them:
    // a tick woken a little earlier after its deadline than the one before would otherwise
    // read as less than a second later, and the maintenance wait a second more.
    let mut next_second = tokio::time::Instant::now();
    loop {
        let at = tokio::select! {
            _ = pooled.cancel.cancelled() => return,
            at = tick.tick() => at,
        };
        if sharded {
            let moved = pooled.pool.rebalance();
            if moved > 0 {
                debug!(
                    moved,
                    "pool slots moved to the session threads whose clients waited"
                );
            }
        }
        if at < next_second {
            continue;
        }
        next_second = at + Duration::from_secs(1);
        if let Err(e) = pooled.pool.maintain().await {
            debug!(error = %e, "pool maintenance could not open min_idle connections");
        }
        let now = tokio::time::Instant::now();
        pooled.pins.expire(now);
        for conn in pooled.balanced.expire(now, balanced::PARKED_TTL) {
            debug!("closing a load-balanced connection whose cursors went unused");
            conn.discard();
        }
    }
}

/// Every second, on a session loop: its own shard's expired connections closed and
/// `min_idle` opened ([`Pool::maintain`] on the loop's thread).
async fn maintain_shard(pooled: Arc<Pooled>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = pooled.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pooled.pool.maintain().await {
            debug!(error = %e, "pool maintenance could not open min_idle connections");
        }
    }
}

#[cfg(test)]
mod users_reload_tests {

    /// SIGHUP and `ProxyHandle::hangup` (or `reload_users`) at once: each users file reload
    /// read the file and then installed what it read, unserialised, so the one that read the
    /// older file could install it last (a removed user kept logging in, an added one was
    /// refused). The first reload reads v1 and is held; the file becomes v2 and a second
    /// reload runs; then the first goes on. v2 must be in force.
    #[tokio::test]
    async fn concurrent_users_reloads_never_install_the_older_file() {
        let dir = std::env::temp_dir().join(format!("mg-users-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("users.toml");
        crate::auth::users::add(&file, "alice", "pw-alice", "admin").unwrap();
        let config = crate::config::Config::from_toml_str(
            &format!(
                "[proxy]\nmode = \"pooled\"\n[upstream]\nuri = \"mongodb://127.0.0.1:27899\"\n\
                 [auth]\nusers_file = \"{}\"\n",
                file.display()
            ),
            "t",
        )
        .unwrap();
        let pooled = super::Pooled::start(&config, None, 1).unwrap();
        assert_eq!(pooled.users().unwrap().len(), 1);
        let p = pooled.clone();
        let f = file.clone();
        crate::reload_race::two_reloads(
            &pooled.users_after_read,
            move || p.reload_users().map(|_| ()),
            move || crate::auth::users::add(&f, "bob", "pw-bob", "admin").unwrap(),
        );
        assert_eq!(
            pooled.users().unwrap().len(),
            2,
            "an older read of the users file was installed over a newer one"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod maintain_tests {
    use std::time::Duration;

    use crate::proxy::pins::CURSOR_TTL;

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// The maintenance of an unsharded pool runs at every one-second tick, however late the
    /// task wakes for each: a tick a few milliseconds later than the one before it (under
    /// 5 ms, so the interval keeps its schedule) must not be taken for one less than a
    /// second after it. Observed through a cursor pin whose time to live ends at that tick.
    #[tokio::test(start_paused = true)]
    async fn maintenance_runs_at_every_tick_whatever_each_ticks_delay() {
        let config = crate::config::Config::from_toml_str(
            "[proxy]\nmode = \"pooled\"\n[upstream]\nuri = \"mongodb://127.0.0.1:27899\"\n\
             [auth]\nallow_unauthenticated = true\n",
            "t",
        )
        .unwrap();
        let pooled = super::Pooled::start(&config, None, 1).unwrap();
        settle().await;
        let t0 = tokio::time::Instant::now();
        let host = crate::upstream::Host {
            name: "127.0.0.1".into(),
            port: 27899,
        };
        assert!(pooled.pins.pin_cursor(7, &host, t0));
        // Two seconds before the pin's end (a late tick: the next comes a second after it).
        tokio::time::advance(CURSOR_TTL - Duration::from_secs(2)).await;
        settle().await;
        // The next tick, 4 ms late.
        tokio::time::advance(Duration::from_millis(1004)).await;
        settle().await;
        assert_eq!(pooled.pins.counts.cursor.get(), 1, "not expired yet");
        // The tick after it, on time: the pin's time to live is over.
        tokio::time::advance(Duration::from_millis(996)).await;
        settle().await;
        assert_eq!(
            pooled.pins.counts.cursor.get(),
            0,
            "the tick at the pin's end did not run the maintenance"
        );
        pooled.close();
    }
}
