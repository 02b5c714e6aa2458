//! The event loops passthrough sessions run on: `proxy.threads` threads, each driving its
//! own current-thread Tokio runtime (its own epoll instance and timer wheel).
//!
//! A session is placed, at accept, on the loop with the fewest live sessions, and stays there
//! for its life: its sockets are registered with that loop's reactor, its task is polled only
//! by that thread, and its wake-ups never cross to another core. This is how HAProxy's
//! threads and Envoy's workers serve connections (Pingora calls it a "no-steal" runtime).
//! Tokio's work-stealing scheduler, where sessions ran before, moves tasks between workers
//! and wakes idle workers to steal them; on find by `_id` at 64 clients the loops cost about
//! 1 µs (6–8 %) less CPU per request, user and kernel time both (docs/performance.md,
//! "Session threads").
//!
//! Pooled sessions run on them too, each loop with its own shard of the upstream pool
//! (`upstream::pool`, "Shards"): a connection is opened, used and handed from one session to
//! the next on one loop, never across. Sharing one pool across loops cost more: a release on
//! one loop waking a waiter on another goes through that loop's inject queue and an `eventfd`
//! write (22.7 against 18.3 µs per find at 64 clients on the work-stealing runtime, where
//! pooled sessions ran until the shards). A pool too small to give each loop
//! [`MIN_SHARD`] connections runs fewer loops (see [`pooled_threads`]).
//!
//! Everything else — the accept loop, the admin API, topology monitors, the audit writer —
//! stays on the process's multi-threaded runtime. Sessions' futures are `Send`; a loop only
//! changes where they are polled.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::sync::oneshot;

/// How long a loop's runtime waits, when it stops, for blocking work its sessions started
/// (a decompression); sessions still running are dropped at once.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(1);

/// The session loops of one proxy. Dropping it stops them (as [`SessionLoops::stop`] does,
/// without waiting).
pub(crate) struct SessionLoops {
    loops: Box<[Loop]>,
}

struct Loop {
    handle: tokio::runtime::Handle,
    /// Sessions spawned on this loop and not yet ended.
    live: Arc<AtomicUsize>,
    /// Dropped or sent: the loop's thread stops its runtime.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    /// Sent (or dropped) by the loop's thread once its runtime is shut down.
    done: Mutex<Option<oneshot::Receiver<()>>>,
}

impl SessionLoops {
    /// Starts `threads` loops (at least one). A thread or runtime that cannot be created is
    /// an error; the loops already started stop when the partial set is dropped.
    pub(crate) fn start(threads: usize) -> std::io::Result<SessionLoops> {
        let mut loops = Vec::with_capacity(threads.max(1));
        for number in 1..=threads.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name(format!("mg-blocking-{number}"))
                .build()?;
            let handle = runtime.handle().clone();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let (done_tx, done_rx) = oneshot::channel::<()>();
            let (running_tx, running_rx) = std::sync::mpsc::channel::<()>();
            std::thread::Builder::new()
                .name(format!("mg-session-{number}"))
                .spawn(move || {
                    // Pooled mode: this loop's sessions check out of their own pool shard.
                    crate::upstream::pool::set_home_shard(number - 1);
                    let _ = running_tx.send(());
                    // Ends when the sender is used or dropped.
                    let _ = runtime.block_on(stop_rx);
                    runtime.shutdown_timeout(SHUTDOWN_BOUND);
                    let _ = done_tx.send(());
                })?;
            // Started means running (and named): a thread starts in microseconds, once.
            let _ = running_rx.recv();
            loops.push(Loop {
                handle,
                live: Arc::new(AtomicUsize::new(0)),
                stop: Mutex::new(Some(stop_tx)),
                done: Mutex::new(Some(done_rx)),
            });
        }
        Ok(SessionLoops {
            loops: loops.into_boxed_slice(),
        })
    }

    /// How many loops there are.
    pub(crate) fn len(&self) -> usize {
        self.loops.len()
    }

    /// Sessions live on each loop, in loop order.
    #[cfg(test)]
    pub(crate) fn live(&self) -> Vec<usize> {
        self.loops
            .iter()
            .map(|l| l.live.load(Ordering::Relaxed))
            .collect()
    }

    /// Runs `session` on the loop with the fewest live sessions, on that loop's thread (where
    /// it must register its sockets). On a loop that has stopped, `session` is dropped
    /// unpolled.
    pub(crate) fn spawn<F>(&self, session: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(chosen) = self
            .loops
            .iter()
            .min_by_key(|l| l.live.load(Ordering::Relaxed))
        else {
            return;
        };
        let live = Live::count(chosen.live.clone());
        // Boxed on its own: a session's future is ~3.8 KB, and inside a task cell with the
        // task's header and trailer it passed jemalloc's 4 KiB size class — 12.1 KiB per
        // idle passthrough client instead of 8.35 (bench/idle_clients.py, 5,000 clients).
        let session = Box::pin(session);
        chosen.handle.spawn(async move {
            let _live = live;
            session.await
        });
    }

    /// Runs `task` (not a session: not counted) on loop `index`'s thread; on a loop that
    /// has stopped, or an index past the last loop, it is dropped unpolled.
    pub(crate) fn spawn_on<F>(&self, index: usize, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if let Some(chosen) = self.loops.get(index) {
            drop(chosen.handle.spawn(task));
        }
    }

    /// Stops every loop: sessions still on them are dropped (their drop guards account for
    /// them). Waits up to `bound` for the loops' threads to finish.
    pub(crate) async fn stop(&self, bound: Duration) {
        self.signal_stop();
        let done: Vec<_> = self
            .loops
            .iter()
            .filter_map(|l| l.done.lock().ok().and_then(|mut d| d.take()))
            .collect();
        let all = async {
            for d in done {
                let _ = d.await;
            }
        };
        if tokio::time::timeout(bound, all).await.is_err() {
            tracing::warn!(
                ?bound,
                "session threads did not stop in time; exiting without them"
            );
        }
    }

    fn signal_stop(&self) {
        for l in self.loops.iter() {
            if let Ok(mut stop) = l.stop.lock() {
                if let Some(tx) = stop.take() {
                    let _ = tx.send(());
                }
            }
        }
    }
}

impl Drop for SessionLoops {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

/// One live session on a loop: counted from before its spawn until its task ends or is
/// dropped (a loop that stopped drops it unpolled).
struct Live(Arc<AtomicUsize>);

impl Live {
    fn count(live: Arc<AtomicUsize>) -> Live {
        live.fetch_add(1, Ordering::Relaxed);
        Live(live)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The fewest connections a pool shard gets (see [`pooled_threads`]).
pub(crate) const MIN_SHARD: usize = 4;

/// The shortest `pool.checkout_timeout` pooled sessions run on the loops with. A client
/// whose loop's shard has every slot held waits for the pool's rebalancing to move it a
/// slot another loop has free: up to `REBALANCE_AFTER` + `REBALANCE_EVERY` (100 ms), more
/// when the shared runtime is busy. A checkout timeout not well above that would fail
/// clients ("all pool_size connections stayed in use") while the pool has slots free, which
/// one unsharded pool never does.
pub(crate) const MIN_SHARDED_CHECKOUT_TIMEOUT: Duration = Duration::from_millis(500);

/// How many loops pooled sessions run on for `threads` (resolved), `pool_size` and
/// `checkout_timeout`: one per thread as long as each loop's pool shard holds at least
/// [`MIN_SHARD`] connections, fewer otherwise; `None` (the shared work-stealing runtime and
/// one unsharded pool, as before the shards) when that leaves fewer than two loops, or when
/// `checkout_timeout` is below [`MIN_SHARDED_CHECKOUT_TIMEOUT`].
pub(crate) fn pooled_threads(
    threads: usize,
    pool_size: usize,
    checkout_timeout: Duration,
) -> Option<usize> {
    if checkout_timeout < MIN_SHARDED_CHECKOUT_TIMEOUT {
        return None;
    }
    let n = threads.min(pool_size / MIN_SHARD);
    (n >= 2).then_some(n)
}

/// The number of loops `proxy.threads` asks for: itself, or for 0 the CPUs this process may
/// use (affinity mask and cgroup quota, as the standard library reads them).
pub(crate) fn resolve_threads(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pooled sessions go on the loops only when the pool gives each at least `MIN_SHARD`
    /// connections and there are two loops or more.
    #[test]
    fn pooled_loops_follow_the_pool_size() {
        let t = Duration::from_secs(5);
        assert_eq!(pooled_threads(2, 20, t), Some(2));
        assert_eq!(pooled_threads(8, 20, t), Some(5));
        assert_eq!(pooled_threads(16, 8, t), Some(2));
        assert_eq!(pooled_threads(2, 7, t), None);
        assert_eq!(pooled_threads(1, 100, t), None);
        assert_eq!(pooled_threads(0, 100, t), None);
    }

    /// A checkout timeout the pool's rebalancing cannot act within keeps pooled sessions on
    /// the shared runtime and one unsharded pool.
    #[test]
    fn pooled_loops_need_a_checkout_timeout_rebalancing_fits_in() {
        assert_eq!(pooled_threads(2, 20, MIN_SHARDED_CHECKOUT_TIMEOUT), Some(2));
        assert_eq!(pooled_threads(2, 20, Duration::from_millis(60)), None);
        let rebalancing =
            crate::upstream::pool::REBALANCE_AFTER + crate::upstream::pool::REBALANCE_EVERY;
        assert!(MIN_SHARDED_CHECKOUT_TIMEOUT >= 4 * rebalancing);
    }

    /// Sessions go to the least loaded loop, run on its thread (which knows its number),
    /// and are uncounted when they end.
    #[tokio::test]
    async fn sessions_spread_over_loops_and_run_on_their_thread() {
        let loops = SessionLoops::start(2).expect("loops");
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (tx, rx) = oneshot::channel();
            let mut release = release_rx.clone();
            loops.spawn(async move {
                let _ = tx.send(std::thread::current().name().map(String::from));
                let _ = release.wait_for(|r| *r).await;
            });
            seen.push(rx.await.expect("ran").expect("a named thread"));
        }
        assert_eq!(loops.live(), vec![2, 2], "two sessions on each loop");
        seen.sort_unstable();
        assert_eq!(
            seen,
            [
                "mg-session-1",
                "mg-session-1",
                "mg-session-2",
                "mg-session-2"
            ],
            "each session runs on its loop's thread"
        );
        release_tx.send(true).expect("release");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while loops.live() != vec![0, 0] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "sessions never uncounted"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        loops.stop(Duration::from_secs(5)).await;
    }

    /// Stopping drops the sessions still running (a drop guard inside one observes it) and
    /// ends the threads; a session spawned afterwards is dropped unpolled.
    #[tokio::test]
    async fn stop_drops_running_sessions_and_later_spawns() {
        struct Dropped(Option<oneshot::Sender<()>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let loops = SessionLoops::start(1).expect("loops");
        let (dropped_tx, dropped_rx) = oneshot::channel();
        let (started_tx, started_rx) = oneshot::channel();
        loops.spawn(async move {
            let _guard = Dropped(Some(dropped_tx));
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        started_rx.await.expect("started");
        let stopped =
            tokio::time::timeout(Duration::from_secs(5), loops.stop(Duration::from_secs(5)));
        stopped.await.expect("stop is bounded");
        tokio::time::timeout(Duration::from_secs(1), dropped_rx)
            .await
            .expect("the running session was dropped")
            .expect("its guard reported");
        let (polled_tx, mut polled_rx) = oneshot::channel::<()>();
        loops.spawn(async move {
            let _ = polled_tx.send(());
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            polled_rx.try_recv().is_err(),
            "a session spawned after the stop must not run"
        );
        assert_eq!(loops.live(), vec![0], "and must not stay counted");
    }
}
