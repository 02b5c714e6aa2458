//! Writing a waiter's request ahead (`Pool::checkout_sending`): a checkout released while
//! another waits for its slot writes that waiter's request on the connection before
//! handing it over, on a sharded pool's own thread, so that the waiter's task runs once,
//! when the reply is in, instead of also to send.
//!
//! What must hold: the waiter learns how much was written (it writes the rest); a
//! connection with a request written on it is never probed (the probe would read the
//! reply), idled or handed to anyone else — a waiter dropped after its request was written
//! (killed, timed out) closes it; nothing is written ahead off the shard's thread or on an
//! unsharded pool, where the waiter could be dropped while its request is being written.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use mongoguard::upstream::pool::{set_home_shard, Connector, Pool, PoolKey, PooledConn, SentAhead};
use mongoguard::upstream::ConnectError;

/// Safety net against hangs, not a performance assertion.
const BOUND: Duration = Duration::from_secs(10);

/// What the fake connections do and saw.
#[derive(Default)]
struct Wire {
    connects: AtomicUsize,
    closed: AtomicUsize,
    /// `is_usable` calls.
    probes: AtomicUsize,
    /// Requests written ahead, by connection id.
    written: Mutex<Vec<(usize, Vec<u8>)>>,
    /// The waker a whole write registered for the reply.
    reply_waker: Mutex<Option<Waker>>,
    /// How much a write ahead writes: `usize::MAX` all, `0` nothing.
    writes: AtomicUsize,
}

struct Fake(Arc<Wire>);

struct FakeConn {
    id: usize,
    wire: Arc<Wire>,
}

impl PooledConn for FakeConn {
    fn is_usable(&mut self) -> bool {
        self.wire.probes.fetch_add(1, Ordering::SeqCst);
        true
    }

    fn send_ahead(&mut self, request: &[u8], waiter: &Waker) -> SentAhead {
        let n = self.wire.writes.load(Ordering::SeqCst).min(request.len());
        if n == 0 {
            return SentAhead::Nothing;
        }
        let part = request.get(..n).unwrap().to_vec();
        self.wire.written.lock().unwrap().push((self.id, part));
        if n < request.len() {
            return SentAhead::Part(n);
        }
        *self.wire.reply_waker.lock().unwrap() = Some(waiter.clone());
        SentAhead::Whole { reply_wakes: true }
    }
}

impl Drop for FakeConn {
    fn drop(&mut self) {
        self.wire.closed.fetch_add(1, Ordering::SeqCst);
    }
}

impl Connector for Fake {
    type Conn = FakeConn;

    async fn connect(&self, _key: &PoolKey) -> Result<FakeConn, ConnectError> {
        let id = self.0.connects.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(FakeConn {
            id,
            wire: self.0.clone(),
        })
    }
}

#[path = "support/pool.rs"]
mod pool_support;

fn key() -> PoolKey {
    pool_support::key_of("app")
}

/// A pool of `pool_size` in `shards` shards (1: unsharded) whose connections write
/// `writes` bytes ahead.
fn pool(pool_size: usize, shards: usize, writes: usize) -> (Arc<Pool<Fake>>, Arc<Wire>) {
    let wire = Arc::new(Wire::default());
    wire.writes.store(writes, Ordering::SeqCst);
    let config = pool_support::config(pool_size, 0, BOUND);
    let pool = if shards > 1 {
        Pool::sharded(Fake(wire.clone()), config, shards).unwrap()
    } else {
        Pool::new(Fake(wire.clone()), config).unwrap()
    };
    (Arc::new(pool), wire)
}

const REQUEST: &[u8] = b"the waiter's request";

type Waiter = tokio::task::JoinHandle<mongoguard::upstream::pool::Checkout<FakeConn>>;

/// A task on this thread waiting to check out with `REQUEST` (queued before it returns),
/// and how many times it was polled.
async fn waiter(pool: &Arc<Pool<Fake>>) -> (Waiter, Arc<AtomicUsize>) {
    let before = pool.stats(&key()).waiting;
    let polls = Arc::new(AtomicUsize::new(0));
    let (p, n) = (pool.clone(), polls.clone());
    let task = tokio::spawn(async move {
        let handle = p.handle(&key());
        let request = bytes::Bytes::from_static(REQUEST);
        let checkout = p.checkout_sending(&handle, std::future::pending(), Some(&request));
        tokio::pin!(checkout);
        std::future::poll_fn(|cx| {
            n.fetch_add(1, Ordering::SeqCst);
            checkout.as_mut().poll(cx)
        })
        .await
        .expect("checkout")
    });
    tokio::time::timeout(BOUND, async {
        while pool.stats(&key()).waiting == before {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiter queued");
    (task, polls)
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// A connection checked out on shard 0's thread (of a pool of `pool_size` in `shards`
/// shards writing `writes` bytes ahead), a waiter queued for it, and its release from the
/// thread whose home shard is `release_on`.
struct Scene {
    pool: Arc<Pool<Fake>>,
    wire: Arc<Wire>,
    /// The released connection's id.
    released: usize,
    /// What `release` returned: the waiter was woken.
    woke: bool,
    task: Waiter,
    /// The waiter's polls before the release, and the counter.
    polled: usize,
    polls: Arc<AtomicUsize>,
}

async fn released_to_a_waiter(
    pool_size: usize,
    shards: usize,
    writes: usize,
    release_on: usize,
) -> Scene {
    set_home_shard(0);
    let (pool, wire) = pool(pool_size, shards, writes);
    let held = pool.checkout(&key()).await.unwrap();
    let released = held.id;
    let (task, polls) = waiter(&pool).await;
    let polled = polls.load(Ordering::SeqCst);
    set_home_shard(release_on);
    let woke = held.release();
    set_home_shard(0);
    Scene {
        pool,
        wire,
        released,
        woke,
        task,
        polled,
        polls,
    }
}

/// The waiter's checkout, taken within [`BOUND`].
async fn taken(task: Waiter) -> mongoguard::upstream::pool::Checkout<FakeConn> {
    tokio::time::timeout(BOUND, task).await.unwrap().unwrap()
}

/// Nothing was written ahead: the waiter was woken, got no `sent_ahead`, and its connection
/// was probed as a handed one is.
async fn served_without_writing_ahead(scene: Scene) {
    assert!(scene.woke, "the waiter is woken to send");
    let mut got = taken(scene.task).await;
    assert!(got.sent_ahead().is_none());
    assert!(scene.wire.written.lock().unwrap().is_empty());
    assert_eq!(
        scene.wire.probes.load(Ordering::SeqCst),
        1,
        "a handed connection is probed"
    );
    got.release();
    assert_eq!(scene.pool.stats(&key()).sent_ahead, 0);
}

/// On the shard's thread, the release writes the waiter's request and does not wake it:
/// the reply does, and the waiter takes the connection without probing it, told that all
/// of its request was written.
#[tokio::test]
async fn the_release_writes_the_waiters_request_and_the_reply_wakes_it() {
    let scene = released_to_a_waiter(2, 2, usize::MAX, 0).await;
    assert!(
        !scene.woke,
        "the waiter need not run now: its request is written and the reply wakes it"
    );
    assert_eq!(
        *scene.wire.written.lock().unwrap(),
        [(scene.released, REQUEST.to_vec())],
        "the request written ahead, on the connection handed over"
    );
    settle().await;
    assert_eq!(
        scene.polls.load(Ordering::SeqCst),
        scene.polled,
        "the waiter ran before its reply came"
    );
    // The reply is in.
    let reply = scene.wire.reply_waker.lock().unwrap().take();
    reply.expect("registered for the reply").wake();
    let mut got = taken(scene.task).await;
    assert_eq!(got.id, scene.released);
    let ahead = got.sent_ahead().expect("written ahead");
    assert_eq!(ahead.bytes, REQUEST.len());
    assert!(got.sent_ahead().is_none(), "told once");
    assert_eq!(
        scene.wire.probes.load(Ordering::SeqCst),
        0,
        "a connection with a request in flight was probed"
    );
    got.release();
    let stats = scene.pool.stats(&key());
    assert_eq!((stats.in_use, stats.sent_ahead), (0, 1), "{stats:?}");
}

/// A part written: the waiter is woken at once to write the rest, and told how much.
#[tokio::test]
async fn a_part_written_ahead_wakes_the_waiter_to_write_the_rest() {
    let scene = released_to_a_waiter(2, 2, 5, 0).await;
    assert!(scene.woke, "the waiter has a rest to write: woken");
    let mut got = taken(scene.task).await;
    assert_eq!(got.sent_ahead().map(|a| a.bytes), Some(5));
    assert_eq!(scene.wire.written.lock().unwrap().len(), 1);
    got.release();
}

/// A waiter dropped (killed, timed out) after its request was written: the connection it
/// was handed has a reply in flight and closes; it is neither idled nor handed on, and the
/// slot is free again.
#[tokio::test]
async fn a_waiter_dropped_after_its_request_was_written_closes_the_connection() {
    let scene = released_to_a_waiter(2, 2, usize::MAX, 0).await;
    let (pool, wire) = (scene.pool, scene.wire);
    assert!(!scene.woke);
    assert_eq!(wire.written.lock().unwrap().len(), 1);
    scene.task.abort();
    assert!(scene.task.await.unwrap_err().is_cancelled());
    assert_eq!(
        wire.closed.load(Ordering::SeqCst),
        1,
        "the connection with the dropped waiter's request in flight stayed open"
    );
    let stats = pool.stats(&key());
    assert_eq!(
        (stats.idle, stats.in_use, stats.total),
        (0, 0, 0),
        "{stats:?}"
    );
    // The next checkout opens a new connection in the freed slot.
    let next = tokio::time::timeout(BOUND, pool.checkout(&key()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(wire.connects.load(Ordering::SeqCst), 2);
    next.release();
}

/// Released from another thread than the shard's: nothing written ahead (the waiter could
/// be dropped on its own thread meanwhile); the waiter is woken to write its request.
#[tokio::test]
async fn nothing_is_written_ahead_off_the_shards_thread() {
    served_without_writing_ahead(released_to_a_waiter(2, 2, usize::MAX, 1).await).await;
}

/// An unsharded pool (the shared runtime's) writes nothing ahead.
#[tokio::test]
async fn an_unsharded_pool_writes_nothing_ahead() {
    served_without_writing_ahead(released_to_a_waiter(1, 1, usize::MAX, 0).await).await;
}

/// A connection that writes nothing ahead (would block, TLS): the waiter is woken and
/// writes its request itself, as without `checkout_sending`.
#[tokio::test]
async fn a_connection_that_writes_nothing_wakes_the_waiter() {
    served_without_writing_ahead(released_to_a_waiter(2, 2, 0, 0).await).await;
}

/// The pool's wait of a waiter whose request was written ahead (`max_wait`, the
/// `mongoguard_pool_max_wait_seconds` gauge) ends when the connection was handed over to
/// it, not when its reply came in and woke it: the server's time for its request is no
/// wait for a connection.
#[tokio::test]
async fn a_waiter_written_ahead_waited_until_the_hand_over_not_until_its_reply() {
    let scene = released_to_a_waiter(2, 2, usize::MAX, 0).await;
    assert!(!scene.woke, "written ahead, not woken");
    // The server takes 300 ms to answer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = scene.wire.reply_waker.lock().unwrap().take();
    reply.expect("registered").wake();
    let got = taken(scene.task).await;
    let stats = scene.pool.stats(&key());
    assert!(
        stats.max_wait < Duration::from_millis(150),
        "the reply's 300 ms counted as a wait for a connection: {stats:?}"
    );
    got.release();
}

/// A connection whose waiter's request was written ahead is in use from the hand-over on
/// (`in_use`: the `mongoguard_pool_servers_active` and `_clients_active` gauges, `/pool`),
/// while the server runs the request, not only once the reply woke the waiter; a waiter
/// dropped then leaves nothing counted.
#[tokio::test]
async fn a_connection_written_ahead_is_in_use_while_its_reply_is_awaited() {
    let scene = released_to_a_waiter(2, 2, usize::MAX, 0).await;
    let (pool, wire) = (scene.pool, scene.wire);
    assert!(!scene.woke, "written ahead, not woken");
    let stats = pool.stats(&key());
    assert_eq!(
        (stats.in_use, stats.idle, stats.waiting, stats.total),
        (1, 0, 0, 1),
        "a request in flight on a connection counted in no gauge: {stats:?}"
    );
    let reply = wire.reply_waker.lock().unwrap().take();
    reply.expect("registered").wake();
    let got = taken(scene.task).await;
    assert_eq!(pool.stats(&key()).in_use, 1);
    got.release();
    assert_eq!(pool.stats(&key()).in_use, 0);
    // Dropped while its request is in flight.
    let held = pool.checkout(&key()).await.unwrap();
    let (task, _) = waiter(&pool).await;
    assert!(!held.release());
    assert_eq!(pool.stats(&key()).in_use, 1);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let stats = pool.stats(&key());
    assert_eq!((stats.in_use, stats.total), (0, 0), "{stats:?}");
}
