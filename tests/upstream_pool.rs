//! The upstream connection pool, one concern per test: dummy connections whose connects,
//! failures and liveness the test controls, plus one test with real TCP against the stand-in.
//!
//! tokio's `test-util` (paused time) is not enabled for this crate, so time-dependent tests
//! use small real durations and only assert on ordering and counts, never on speed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongoguard::upstream::pool::{
    Connector, Pool, PoolConfig, PoolError, PoolKey, PoolStats, PooledConn, TcpConnector,
};
use mongoguard::upstream::{ConnectError, Host};
use mongoguard_standin::{StandIn, StandInConfig};

/// Safety net against hangs, not a performance assertion.
const BOUND: Duration = Duration::from_secs(10);

/// What the dummy connector does, shared with the test.
#[derive(Default)]
struct Control {
    connects: AtomicUsize,
    closed: AtomicUsize,
    fail: AtomicBool,
    connect_delay_ms: AtomicU64,
    alive: Mutex<Vec<Arc<AtomicBool>>>,
}

impl Control {
    fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }

    /// Simulates the server closing every connection opened so far.
    fn kill_all(&self) {
        for flag in self.alive.lock().unwrap().iter() {
            flag.store(false, Ordering::SeqCst);
        }
    }
}

struct Dummy(Arc<Control>);

struct DummyConn {
    id: usize,
    alive: Arc<AtomicBool>,
    control: Arc<Control>,
}

impl PooledConn for DummyConn {
    fn is_usable(&mut self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

impl Drop for DummyConn {
    fn drop(&mut self) {
        self.control.closed.fetch_add(1, Ordering::SeqCst);
    }
}

impl Connector for Dummy {
    type Conn = DummyConn;

    async fn connect(&self, key: &PoolKey) -> Result<DummyConn, ConnectError> {
        let delay = self.0.connect_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            // A slow server is the behaviour under test, not a synchronisation.
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.0.fail.load(Ordering::SeqCst) {
            return Err(ConnectError::Io {
                host: key.server.to_string(),
                source: std::io::ErrorKind::ConnectionRefused.into(),
            });
        }
        let id = self.0.connects.fetch_add(1, Ordering::SeqCst) + 1;
        let alive = Arc::new(AtomicBool::new(true));
        self.0.alive.lock().unwrap().push(alive.clone());
        Ok(DummyConn {
            id,
            alive,
            control: self.0.clone(),
        })
    }
}

#[path = "support/pool.rs"]
mod pool_support;

fn key(identity: &str) -> PoolKey {
    pool_support::key_of(identity)
}

fn config(pool_size: usize) -> PoolConfig {
    pool_support::config(pool_size, 0, BOUND)
}

fn pool(config: PoolConfig) -> (Pool<Dummy>, Arc<Control>) {
    let control = Arc::new(Control::default());
    let pool = Pool::new(Dummy(control.clone()), config).unwrap();
    (pool, control)
}

/// Polls `cond` until it holds; panics after [`BOUND`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + BOUND;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn stats(pool: &Pool<Dummy>) -> PoolStats {
    pool.stats(&key("app"))
}

#[tokio::test]
async fn sequential_checkouts_reuse_one_connection() {
    let (pool, control) = pool(config(4));
    for _ in 0..20 {
        let conn = pool.checkout(&key("app")).await.unwrap();
        assert_eq!(conn.id, 1);
        conn.release();
    }
    assert_eq!(control.connects(), 1);
    let s = stats(&pool);
    assert_eq!((s.total, s.idle, s.in_use, s.connects), (1, 1, 0, 1));
}

#[tokio::test]
async fn idle_connections_are_reused_most_recent_first() {
    let (pool, _control) = pool(config(4));
    let a = pool.checkout(&key("app")).await.unwrap();
    let b = pool.checkout(&key("app")).await.unwrap();
    let (a_id, b_id) = (a.id, b.id);
    a.release();
    b.release();
    assert_eq!(pool.checkout(&key("app")).await.unwrap().id, b_id);
    assert_ne!(a_id, b_id);
}

#[tokio::test]
async fn checkout_beyond_pool_size_waits_for_a_release() {
    let (pool, control) = pool(config(2));
    let first = pool.checkout(&key("app")).await.unwrap();
    let _second = pool.checkout(&key("app")).await.unwrap();
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move {
            let conn = pool.checkout(&key("app")).await?;
            let id = conn.id;
            conn.release();
            Ok::<_, PoolError>(id)
        }
    });
    until("the third checkout to wait", || stats(&pool).waiting == 1).await;
    assert!(!waiter.is_finished());
    assert_eq!(stats(&pool).total, 2);

    let first_id = first.id;
    first.release();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert_eq!(
        got.unwrap(),
        first_id,
        "the waiter gets the released connection"
    );
    assert_eq!(control.connects(), 2);
    assert!(stats(&pool).max_wait > Duration::ZERO);
}

/// `release` says whether a waiting checkout got the connection: the session that released
/// it then lets that waiter send its request before writing its own reply to its client
/// (src/proxy/session/relay.rs), so that the upstream connection does not sit idle behind a
/// client write. With nobody waiting it idles and `release` says so.
#[tokio::test]
async fn release_reports_whether_a_waiter_got_the_connection() {
    let (pool, _control) = pool(config(1));
    let held = pool.checkout(&key("app")).await.unwrap();
    assert!(!held.release(), "nobody waits: the connection idles");
    assert_eq!(stats(&pool).idle, 1);

    let held = pool.checkout(&key("app")).await.unwrap();
    let waiter = waiter(&pool);
    until("the second checkout to wait", || stats(&pool).waiting == 1).await;
    assert!(held.release(), "the waiter is served with it");
    tokio::time::timeout(BOUND, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stats(&pool).idle, 1);
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    let (pool, _control) = pool(config(1));
    let held = pool.checkout(&key("app")).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..3 {
        let (task_pool, order) = (pool.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let conn = task_pool.checkout(&key("app")).await.unwrap();
            order.lock().unwrap().push(n);
            conn.release();
        }));
        until("the waiter to queue", || stats(&pool).waiting == n + 1).await;
    }
    held.release();
    for task in tasks {
        tokio::time::timeout(BOUND, task).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
}

#[tokio::test]
async fn checkout_timeout_gives_a_clear_error() {
    let mut cfg = config(1);
    cfg.checkout_timeout = Duration::from_millis(50);
    let (pool, _control) = pool(cfg);
    let _held = pool.checkout(&key("app")).await.unwrap();
    let err = pool.checkout(&key("app")).await.unwrap_err();
    let PoolError::CheckoutTimeout {
        waited, pool_size, ..
    } = &err
    else {
        panic!("expected a checkout timeout, got {err}");
    };
    assert!(*waited >= Duration::from_millis(50));
    assert_eq!(*pool_size, 1);
    let text = err.to_string();
    for part in [
        "app@db.example:27017",
        "all 1 connections",
        "pool_size",
        "checkout_timeout",
    ] {
        assert!(text.contains(part), "{part:?} missing from {text:?}");
    }
    let s = stats(&pool);
    assert_eq!((s.timeouts, s.waiting, s.total), (1, 0, 1));
    assert!(s.max_wait >= Duration::from_millis(50));
}

#[tokio::test]
async fn dropped_checkout_is_discarded_not_reused() {
    let (pool, control) = pool(config(2));
    let conn = pool.checkout(&key("app")).await.unwrap();
    drop(conn);
    assert_eq!(
        control.closed.load(Ordering::SeqCst),
        1,
        "connection closed"
    );
    let s = stats(&pool);
    assert_eq!((s.discards, s.total, s.idle, s.in_use), (1, 0, 0, 0));
    assert_eq!(pool.checkout(&key("app")).await.unwrap().id, 2);
}

#[tokio::test]
async fn request_cancelled_mid_flight_discards_its_connection() {
    let (pool, control) = pool(config(1));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let request = tokio::spawn({
        let pool = pool.clone();
        async move {
            let _conn = pool.checkout(&key("app")).await.unwrap();
            let _ = started_tx.send(());
            // The upstream never answers; the client goes away.
            std::future::pending::<()>().await;
        }
    });
    started_rx.await.unwrap();
    request.abort();
    let _ = request.await;
    let s = stats(&pool);
    assert_eq!((s.discards, s.total, s.in_use), (1, 0, 0));
    assert_eq!(pool.checkout(&key("app")).await.unwrap().id, 2);
    assert_eq!(control.connects(), 2);
}

#[tokio::test]
async fn discard_frees_a_slot_for_a_waiter() {
    let (pool, control) = pool(config(1));
    let held = pool.checkout(&key("app")).await.unwrap();
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move {
            let conn = pool.checkout(&key("app")).await?;
            let id = conn.id;
            conn.release();
            Ok::<_, PoolError>(id)
        }
    });
    until("the waiter to queue", || stats(&pool).waiting == 1).await;
    held.discard();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert_eq!(got.unwrap(), 2, "a fresh connection, not the discarded one");
    assert_eq!(control.connects(), 2);
    assert_eq!(stats(&pool).discards, 1);
}

/// A waiter checking out a connection and releasing it, returning the connection's id.
fn waiter(pool: &Pool<Dummy>) -> tokio::task::JoinHandle<Result<usize, PoolError>> {
    let pool = pool.clone();
    tokio::spawn(async move {
        let conn = pool.checkout(&key("app")).await?;
        let id = conn.id;
        conn.release();
        Ok(id)
    })
}

/// A released connection goes straight to the oldest waiter; if that waiter is gone before
/// it runs (its future dropped after it was served), the connection passes on to the next
/// waiter: nothing leaks and nothing is lost. The same for the bare slot of a discarded
/// connection.
#[tokio::test]
async fn a_waiter_dropped_after_being_served_passes_it_on() {
    for release in [true, false] {
        let (pool, control) = pool(config(1));
        let held = pool.checkout(&key("app")).await.unwrap();
        let first = waiter(&pool);
        until("the first waiter to queue", || stats(&pool).waiting == 1).await;
        let second = waiter(&pool);
        until("the second waiter to queue", || stats(&pool).waiting == 2).await;
        let held_id = held.id;
        // This test's runtime has one thread and this task does not yield between the two
        // calls: the first waiter is served, then dropped before it runs.
        if release {
            held.release();
        } else {
            held.discard();
        }
        assert_eq!(stats(&pool).waiting, 1, "the first waiter was served");
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        let got = tokio::time::timeout(BOUND, second).await.unwrap().unwrap();
        let s = stats(&pool);
        if release {
            assert_eq!(got.unwrap(), held_id, "the released connection, passed on");
            assert_eq!((control.connects(), s.discards), (1, 0));
        } else {
            assert_eq!(got.unwrap(), 2, "a new connection in the slot passed on");
            assert_eq!((control.connects(), s.discards), (2, 1));
        }
        assert_eq!(
            (s.in_use, s.waiting, s.total, s.idle),
            (0, 0, 1, 1),
            "{s:?}"
        );
    }
}

/// A connection released to a waiter is checked before the waiter uses it: one the server
/// closed meanwhile is closed, and the waiter opens another in its slot.
#[tokio::test]
async fn a_released_connection_the_server_closed_is_not_handed_to_a_waiter() {
    let (pool, control) = pool(config(1));
    let held = pool.checkout(&key("app")).await.unwrap();
    let next = waiter(&pool);
    until("the waiter to queue", || stats(&pool).waiting == 1).await;
    held.release();
    control.kill_all();
    let got = tokio::time::timeout(BOUND, next).await.unwrap().unwrap();
    assert_eq!(got.unwrap(), 2);
    let s = stats(&pool);
    assert_eq!(
        (s.unusable, s.total, s.idle, s.in_use),
        (1, 1, 1, 0),
        "{s:?}"
    );
    assert_eq!(control.closed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn idle_connection_closed_by_server_is_not_handed_out() {
    let (pool, control) = pool(config(2));
    pool.checkout(&key("app")).await.unwrap().release();
    control.kill_all();
    let conn = pool.checkout(&key("app")).await.unwrap();
    assert_eq!(conn.id, 2);
    assert!(conn.alive.load(Ordering::SeqCst));
    let s = stats(&pool);
    assert_eq!((s.unusable, s.total, s.in_use), (1, 1, 1));
}

#[tokio::test]
async fn maintain_closes_idle_connections_the_server_closed() {
    let (pool, control) = pool(config(2));
    pool.checkout(&key("app")).await.unwrap().release();
    control.kill_all();
    pool.maintain().await.unwrap();
    let s = stats(&pool);
    assert_eq!((s.unusable, s.total, s.idle), (1, 0, 0));
}

#[tokio::test]
async fn idle_timeout_closes_idle_connections() {
    let mut cfg = config(2);
    cfg.idle_timeout = Some(Duration::from_millis(40));
    let (pool, control) = pool(cfg);
    pool.checkout(&key("app")).await.unwrap().release();
    // Waiting past idle_timeout is the behaviour under test, not a synchronisation.
    tokio::time::sleep(Duration::from_millis(60)).await;
    pool.maintain().await.unwrap();
    assert_eq!((stats(&pool).expired, stats(&pool).total), (1, 0));

    // Lazily, at checkout, without maintain.
    pool.checkout(&key("app")).await.unwrap().release();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(pool.checkout(&key("app")).await.unwrap().id, 3);
    assert_eq!(control.connects(), 3);
    assert_eq!(stats(&pool).expired, 2);
}

#[tokio::test]
async fn max_lifetime_closes_connections_in_use_and_idle() {
    let mut cfg = config(2);
    cfg.max_lifetime = Some(Duration::from_millis(40));
    let (pool, control) = pool(cfg);

    // Expires while in use: not returned at release. (Outliving max_lifetime is the
    // behaviour under test, not a synchronisation.)
    let conn = pool.checkout(&key("app")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    conn.release();
    let s = stats(&pool);
    assert_eq!((s.expired, s.total, s.idle), (1, 0, 0));

    // Expires while idle: not handed out.
    pool.checkout(&key("app")).await.unwrap().release();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(pool.checkout(&key("app")).await.unwrap().id, 3);
    assert_eq!(control.connects(), 3);
    assert_eq!(stats(&pool).expired, 2);
}

/// With both limits set, an idle connection expires at whichever comes first (the pool
/// works the deadline out once, when the connection goes idle).
#[tokio::test]
async fn an_idle_connection_expires_at_the_sooner_of_its_two_limits() {
    let short = Duration::from_millis(40);
    for (idle_timeout, max_lifetime) in [(short, BOUND), (BOUND, short)] {
        let mut cfg = config(2);
        cfg.idle_timeout = Some(idle_timeout);
        cfg.max_lifetime = Some(max_lifetime);
        let (pool, control) = pool(cfg);
        pool.checkout(&key("app")).await.unwrap().release();
        let again = pool.checkout(&key("app")).await.unwrap();
        assert_eq!(again.id, 1, "reused at once");
        again.release();
        // Outliving the shorter limit is the behaviour under test.
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(
            pool.checkout(&key("app")).await.unwrap().id,
            2,
            "idle_timeout {idle_timeout:?}, max_lifetime {max_lifetime:?}: expired"
        );
        assert_eq!(control.connects(), 2);
        assert_eq!(stats(&pool).expired, 1);
    }
}

#[tokio::test]
async fn maintain_prefills_min_idle_per_known_key() {
    let mut cfg = config(5);
    cfg.min_idle = 3;
    let (pool, control) = pool(cfg);
    pool.maintain().await.unwrap();
    assert_eq!(control.connects(), 0, "no key known yet");

    pool.register(&key("app"));
    pool.maintain().await.unwrap();
    let s = stats(&pool);
    assert_eq!((s.idle, s.total, s.connects), (3, 3, 3));

    // Connections in use do not count as idle; prefill stays within pool_size.
    let held: Vec<_> = hold(&pool, 3).await;
    pool.maintain().await.unwrap();
    let s = stats(&pool);
    assert_eq!((s.in_use, s.idle, s.total), (3, 2, 5));
    drop(held);
}

async fn hold(
    pool: &Pool<Dummy>,
    n: usize,
) -> Vec<mongoguard::upstream::pool::Checkout<DummyConn>> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(pool.checkout(&key("app")).await.unwrap());
    }
    held
}

#[tokio::test]
async fn connect_failure_frees_the_slot() {
    let (pool, control) = pool(config(1));
    control.fail.store(true, Ordering::SeqCst);
    let err = pool.checkout(&key("app")).await.unwrap_err();
    assert!(matches!(err, PoolError::Connect { .. }), "{err}");
    assert!(err.to_string().contains("app@db.example:27017"), "{err}");
    let s = stats(&pool);
    assert_eq!((s.total, s.connecting, s.connect_failures), (0, 0, 1));

    control.fail.store(false, Ordering::SeqCst);
    let conn = tokio::time::timeout(BOUND, pool.checkout(&key("app"))).await;
    assert_eq!(conn.unwrap().unwrap().id, 1);
}

#[tokio::test]
async fn cancelled_waiters_leave_no_leak() {
    let (pool, _control) = pool(config(2));
    let a = pool.checkout(&key("app")).await.unwrap();
    let b = pool.checkout(&key("app")).await.unwrap();

    let app = key("app");
    let timed_out = tokio::time::timeout(Duration::from_millis(20), pool.checkout(&app));
    assert!(timed_out.await.is_err());
    // A waiter dropped while waiting (the select gives up on it after 20 ms: how long it
    // waited does not matter, only that it was waiting when dropped).
    tokio::select! {
        _ = pool.checkout(&app) => panic!("no slot is free"),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    assert_eq!(stats(&pool).waiting, 0);

    a.release();
    b.release();
    let all = tokio::time::timeout(BOUND, hold(&pool, 2)).await.unwrap();
    assert_eq!(all.len(), 2);
    let s = stats(&pool);
    assert_eq!((s.in_use, s.total, s.waiting), (2, 2, 0));
}

#[tokio::test]
async fn checkout_cancelled_while_connecting_frees_the_slot() {
    let (pool, control) = pool(config(1));
    control.connect_delay_ms.store(5_000, Ordering::SeqCst);
    let app = key("app");
    let attempt = tokio::time::timeout(Duration::from_millis(20), pool.checkout(&app));
    assert!(attempt.await.is_err());
    let s = stats(&pool);
    assert_eq!((s.total, s.connecting, s.in_use), (0, 0, 0));

    control.connect_delay_ms.store(0, Ordering::SeqCst);
    let conn = tokio::time::timeout(BOUND, pool.checkout(&key("app"))).await;
    assert!(conn.unwrap().is_ok());
}

#[tokio::test]
async fn separate_keys_have_separate_pools() {
    let (pool, control) = pool(config(1));
    let alice = pool.checkout(&key("alice")).await.unwrap();
    let bob = tokio::time::timeout(BOUND, pool.checkout(&key("bob"))).await;
    let bob = bob.unwrap().unwrap();
    assert_ne!(alice.id, bob.id);
    assert_eq!(control.connects(), 2);
    assert_eq!(pool.stats(&key("alice")).in_use, 1);
    assert_eq!(pool.stats(&key("bob")).in_use, 1);
    alice.release();
    // Alice's idle connection is never given to bob.
    bob.release();
    let bob_again = pool.checkout(&key("bob")).await.unwrap();
    assert_eq!(bob_again.key(), &key("bob"));
    assert_eq!(control.connects(), 2);
}

#[tokio::test]
async fn invalid_config_is_refused() {
    let control = Arc::new(Control::default());
    assert!(Pool::new(Dummy(control.clone()), config(0)).is_err());
    let mut cfg = config(2);
    cfg.min_idle = 3;
    assert!(Pool::new(Dummy(control), cfg).is_err());
}

#[tokio::test]
async fn close_fails_waiters_and_later_checkouts() {
    let (pool, _control) = pool(config(1));
    let held = pool.checkout(&key("app")).await.unwrap();
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move { pool.checkout(&key("app")).await.map(|_| ()) }
    });
    until("the waiter to queue", || stats(&pool).waiting == 1).await;
    pool.close();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert!(matches!(got, Err(PoolError::Closed { .. })));
    held.release();
    assert_eq!(stats(&pool).total, 0, "released into a closed pool: closed");
    assert!(matches!(
        pool.checkout(&key("other")).await,
        Err(PoolError::Closed { .. })
    ));
}

/// A handle is the pool of its key for good: a second lookup gives the same pool, and a
/// handle taken before a drain or a close sees them (they act on the pool, never replace it).
#[tokio::test]
async fn a_handle_stays_its_keys_pool_through_drain_and_close() {
    let (pool, control) = pool(config(2));
    let handle = pool.handle(&key("app"));
    assert_eq!(handle.key(), &key("app"));
    let conn = pool.checkout_from(&handle).await.unwrap();
    conn.release();
    // The same pool through the key and through the handle.
    assert_eq!(stats(&pool).idle, 1);
    let again = pool.handle(&key("app"));
    let conn = pool.checkout_from(&again).await.unwrap();
    assert_eq!((conn.id, control.connects()), (1, 1));
    conn.release();

    let server = key("app").server;
    pool.set_drained(&server, true);
    assert_eq!(stats(&pool).idle, 0, "drained: idle connections closed");
    let conn = pool.checkout_from(&handle).await.unwrap();
    conn.release();
    assert_eq!(
        stats(&pool).idle,
        0,
        "drained: a released connection closes"
    );
    pool.set_drained(&server, false);

    pool.close();
    assert!(matches!(
        pool.checkout_from(&handle).await,
        Err(PoolError::Closed { .. })
    ));
    assert!(matches!(
        pool.checkout_ready(&handle),
        Err(PoolError::Closed { .. })
    ));
}

/// The ready path hands out an idle usable connection when a slot is free, and otherwise
/// takes nothing: no slot, no count, no connect.
#[tokio::test]
async fn checkout_ready_takes_only_an_idle_connection_and_a_free_slot() {
    let (pool, control) = pool(config(1));
    let handle = pool.handle(&key("app"));
    // Nothing idle yet: nothing taken.
    assert!(pool.checkout_ready(&handle).unwrap().is_none());
    assert_eq!((stats(&pool).total, control.connects()), (0, 0));
    let conn = pool.checkout_from(&handle).await.unwrap();
    // The only slot is in use.
    assert!(pool.checkout_ready(&handle).unwrap().is_none());
    conn.release();
    let conn = pool
        .checkout_ready(&handle)
        .unwrap()
        .expect("idle and free");
    assert_eq!(conn.id, 1);
    assert_eq!(stats(&pool).in_use, 1);
    conn.release();
    // An idle connection the server closed is not handed out, and is closed.
    control.kill_all();
    assert!(pool.checkout_ready(&handle).unwrap().is_none());
    let s = stats(&pool);
    assert_eq!(
        (s.idle, s.total, s.unusable, s.in_use),
        (0, 0, 1, 0),
        "{s:?}"
    );
    // And the slot it briefly held is free again.
    let conn = pool.checkout_from(&handle).await.unwrap();
    assert_eq!(conn.id, 2);
}

/// `checkout_until` waits in the same FIFO queue, and its caller's expiry ends the wait with
/// the same timeout error (counted), leaving no waiter behind.
#[tokio::test]
async fn checkout_until_ends_its_wait_when_the_callers_expiry_fires() {
    let (pool, _control) = pool(config(1));
    let handle = pool.handle(&key("app"));
    let held = pool.checkout_from(&handle).await.unwrap();
    let (fire, fired) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn({
        let (pool, handle) = (pool.clone(), handle.clone());
        async move {
            let expired = async {
                let _ = fired.await;
            };
            pool.checkout_until(&handle, expired).await.map(|c| c.id)
        }
    });
    until("the waiter to queue", || stats(&pool).waiting == 1).await;
    fire.send(()).unwrap();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert!(
        matches!(got, Err(PoolError::CheckoutTimeout { pool_size: 1, .. })),
        "{got:?}"
    );
    let s = stats(&pool);
    assert_eq!((s.waiting, s.timeouts), (0, 1), "{s:?}");
    // Without the expiry firing, a release hands the slot over.
    let waiter = tokio::spawn({
        let (pool, handle) = (pool.clone(), handle.clone());
        async move {
            pool.checkout_until(&handle, std::future::pending())
                .await
                .map(|c| c.id)
        }
    });
    until("the waiter to queue", || stats(&pool).waiting == 1).await;
    held.release();
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    assert_eq!(got.unwrap(), 1);
}

#[tokio::test]
async fn tcp_pool_opens_one_upstream_connection_and_skips_closed_ones() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let addr = standin.addr();
    let key = PoolKey::new(
        Host {
            name: addr.ip().to_string().into(),
            port: addr.port(),
        },
        "app",
    );
    let pool = Pool::new(TcpConnector::new(BOUND), config(4)).unwrap();
    for _ in 0..50 {
        pool.checkout(&key).await.unwrap().release();
    }
    let upstream = standin.stats();
    until("the stand-in to run the connection", || {
        upstream.connections_open() == 1
    })
    .await;
    assert_eq!(upstream.connections_accepted(), 1);

    // The server goes away: the idle connection is noticed closed, not handed out.
    standin.shutdown().await;
    let stats = pool.stats(&key);
    assert_eq!((stats.idle, stats.unusable), (1, 0));
    // shutdown() returned once every connection task of the stand-in had ended, so its side
    // is closed and loopback has delivered the FIN. The pool sees it through the readiness
    // tokio's I/O driver recorded: yield_now() resumes this task only after the scheduler has
    // polled the driver (tokio's task/yield_now.rs: deferred wakers are woken after the
    // driver poll), which is exactly the event to wait for.
    tokio::task::yield_now().await;
    let gone = pool.checkout(&key).await;
    assert!(matches!(gone, Err(PoolError::Connect { .. })), "{gone:?}");
    let stats = pool.stats(&key);
    assert_eq!((stats.unusable, stats.total, stats.idle), (1, 0, 0));

    // The server comes back on the same address: a fresh connection is opened.
    let standin = StandIn::start(StandInConfig {
        listen: addr,
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    for _ in 0..50 {
        pool.checkout(&key).await.unwrap().release();
    }
    let upstream = standin.stats();
    until("the stand-in to run the connection", || {
        upstream.connections_open() == 1
    })
    .await;
    assert_eq!(upstream.connections_accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_churn_keeps_counts_consistent() {
    let mut cfg = config(3);
    cfg.checkout_timeout = BOUND;
    let (pool, control) = pool(cfg);
    let mut tasks = Vec::new();
    for task in 0..12usize {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..50usize {
                let conn = pool.checkout(&key("app")).await.unwrap();
                let s = stats(&pool);
                assert!(s.total <= 3 && s.in_use <= 3, "{s:?}");
                tokio::task::yield_now().await;
                match (task + round) % 5 {
                    0 => conn.discard(),
                    1 => drop(conn),
                    _ => {
                        conn.release();
                    }
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(BOUND, task).await.unwrap().unwrap();
    }
    let s = stats(&pool);
    assert_eq!((s.in_use, s.waiting, s.connecting), (0, 0, 0));
    assert_eq!(s.total, s.idle);
    assert!(s.total <= 3);
    let opened = control.connects();
    let closed = control.closed.load(Ordering::SeqCst);
    assert_eq!(
        opened - closed,
        s.total,
        "every uncounted connection was closed"
    );
    assert_eq!(s.discards, 12 * 50 * 2 / 5);
}

/// A prefill whose connect is still in flight when its server is drained, or its pool
/// closed, does not park the connection it then gets: a drained pool keeps no idle
/// connection (an operator drains a server to have its connections go) and a closed pool
/// none at all (pools are never removed, so one parked there would stay open for good).
#[tokio::test]
async fn a_prefill_in_flight_at_a_drain_or_a_close_keeps_no_idle_connection() {
    for close in [false, true] {
        let mut cfg = config(2);
        cfg.min_idle = 1;
        let (pool, control) = pool(cfg);
        pool.register(&key("app"));
        // A slow server is the behaviour under test, not a synchronisation.
        control.connect_delay_ms.store(300, Ordering::SeqCst);
        let pool = Arc::new(pool);
        let maintaining = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.maintain().await })
        };
        until("the prefill's connect started", || {
            stats(&pool).connecting == 1
        })
        .await;
        if close {
            pool.close();
        } else {
            pool.set_drained(&key("app").server, true);
        }
        tokio::time::timeout(BOUND, maintaining)
            .await
            .expect("maintain hung")
            .unwrap()
            .unwrap();
        let s = stats(&pool);
        assert_eq!(
            (s.idle, s.total, s.in_use),
            (0, 0, 0),
            "close: {close}: {s:?}"
        );
        assert_eq!(
            control.closed.load(Ordering::SeqCst),
            control.connects(),
            "close: {close}: the prefilled connection is still open"
        );
        // A drained pool still serves checkouts (and keeps within its size).
        if !close {
            let c = pool.checkout(&key("app")).await.unwrap();
            c.release();
            assert_eq!(stats(&pool).idle, 0);
        }
    }
}

/// Churn with everything that can end a checkout early, on two threads and many seeds:
/// waits cut by their own expiry or by a cancelled future (at any moment, also just as a
/// connection is handed over), connections the server closed, discards, drops, the ready
/// path, and — in half of the runs — the pool closed in the middle. Afterwards no gauge has
/// leaked or gone negative (wrapped), the pool never exceeded its size, and every connection
/// not counted is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_with_timeouts_cancellations_and_a_close_keeps_counts_consistent() {
    let mut timeouts = 0;
    for seed in 0..24u64 {
        let close = seed % 2 == 1;
        let mut cfg = config(2);
        cfg.checkout_timeout = Duration::from_millis(3);
        let (pool, control) = pool(cfg);
        let handle = pool.handle(&key("app"));
        let mut tasks = Vec::new();
        for task in 0..10u64 {
            let (pool, handle, control) = (pool.clone(), handle.clone(), control.clone());
            tasks.push(tokio::spawn(async move {
                let mut x = seed * 1_000 + task + 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                for _ in 0..60 {
                    let r = next();
                    let got = match r % 4 {
                        0 => match pool.checkout_ready(&handle) {
                            Ok(Some(c)) => Some(c),
                            _ => None,
                        },
                        // Cancelled after a few microseconds to a few milliseconds.
                        1 => {
                            let cut = Duration::from_micros(next() % 3_000);
                            tokio::time::timeout(cut, pool.checkout(&key("app")))
                                .await
                                .ok()
                                .and_then(Result::ok)
                        }
                        2 => pool
                            .checkout_until(
                                &handle,
                                tokio::time::sleep(Duration::from_micros(next() % 2_000)),
                            )
                            .await
                            .ok(),
                        _ => pool.checkout(&key("app")).await.ok(),
                    };
                    let s = stats(&pool);
                    assert!(s.total <= 2 && s.in_use <= 2, "{s:?}");
                    assert!(s.waiting < 1_000 && s.idle <= 2, "wrapped: {s:?}");
                    if let Some(conn) = got {
                        // Held a while, so that others wait, time out and are cancelled.
                        match next() % 3 {
                            0 => tokio::task::yield_now().await,
                            1 => tokio::time::sleep(Duration::from_micros(next() % 2_000)).await,
                            _ => {}
                        }
                        match next() % 6 {
                            0 => conn.discard(),
                            1 => drop(conn),
                            2 => {
                                // The server closes it (and everything else) while in use.
                                control.kill_all();
                                conn.release();
                            }
                            _ => {
                                conn.release();
                            }
                        }
                    }
                }
            }));
        }
        if close {
            tokio::time::sleep(Duration::from_millis(5)).await;
            pool.close();
        }
        for task in tasks {
            tokio::time::timeout(BOUND, task).await.unwrap().unwrap();
        }
        pool.maintain().await.ok();
        let s = stats(&pool);
        assert_eq!(
            (s.in_use, s.waiting, s.connecting),
            (0, 0, 0),
            "seed {seed}: {s:?}"
        );
        assert_eq!(s.total, s.idle, "seed {seed}: {s:?}");
        assert!(s.total <= 2, "seed {seed}: {s:?}");
        if close {
            assert_eq!(
                s.total, 0,
                "seed {seed}: a closed pool keeps nothing: {s:?}"
            );
        }
        let opened = control.connects();
        let closed = control.closed.load(Ordering::SeqCst);
        assert_eq!(opened - closed, s.total, "seed {seed}: {s:?}");
        timeouts += s.timeouts;
        // Nothing is stuck: a new checkout is served at once unless the pool is closed.
        let last = tokio::time::timeout(BOUND, pool.checkout(&key("app")))
            .await
            .unwrap();
        assert_eq!(last.is_err(), close, "seed {seed}");
    }
    assert!(
        timeouts > 0,
        "no wait ever timed out: the churn did not contend"
    );
}
