//! What a session waits on at every await for its own end: its connection's kill (an
//! operator's `/connections/{id}/kill`, the drain deadline, a refused handshake) and the
//! proxy's drain.
//!
//! A `CancellationToken` would do, but every poll of its `cancelled()` future takes two
//! mutexes (the token tree's, to read the flag, and its `Notify`'s, to store the waker), and
//! every new future takes them again to register and to unregister. A session builds such a
//! future in every select of every request (waiting for the request, writing it upstream,
//! waiting for the reply, writing the reply): about twenty lock round trips per request, a
//! measurable part of the proxy's CPU per request (docs/performance.md). A [`Stop`] is an
//! atomic flag word and one [`AtomicWaker`]: polling it is an atomic load and, when not yet
//! fired, a compare-and-swap that keeps the stored waker when it is the same task's.
//!
//! One waker slot means one waiting task: only the connection's own session task waits on
//! its `Stop` (its futures, however many, share that task's waker). Anything else that must
//! wait for a connection's end uses the connection's `CancellationToken`, which
//! [`Connection::kill`](super::control::Connection::kill) cancels together with the flag.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use futures::task::AtomicWaker;

/// Close the connection now.
pub(crate) const KILL: u8 = 1;
/// The proxy is draining: finish what is in flight, take nothing new.
pub(crate) const DRAIN: u8 = 2;

/// A connection's kill and drain flags, waited on by its session task.
#[derive(Clone, Default)]
pub(crate) struct Stop(Arc<Inner>);

#[derive(Default)]
struct Inner {
    fired: AtomicU8,
    waker: AtomicWaker,
}

impl Stop {
    /// Sets `bits` ([`KILL`], [`DRAIN`]) and wakes the session task.
    pub(crate) fn fire(&self, bits: u8) {
        self.0.fired.fetch_or(bits, Ordering::SeqCst);
        self.0.waker.wake();
    }

    /// Whether any of `bits` has been fired.
    pub(crate) fn has(&self, bits: u8) -> bool {
        self.0.fired.load(Ordering::SeqCst) & bits != 0
    }

    /// Whether the connection was killed.
    pub(crate) fn is_killed(&self) -> bool {
        self.has(KILL)
    }

    /// Completes when the connection is killed.
    pub(crate) fn killed(&self) -> Fired<'_> {
        Fired {
            stop: self,
            bits: KILL,
        }
    }

    /// Completes when the proxy drains (or the connection is killed, which ends a drain's
    /// waiting as well).
    pub(crate) fn draining(&self) -> Fired<'_> {
        Fired {
            stop: self,
            bits: KILL | DRAIN,
        }
    }

    /// Ready once the connection is killed; else registers the task's waker (as polling
    /// [`Stop::killed`] does, for a caller polling it beside other futures by hand).
    pub(crate) fn poll_killed(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_bits(KILL, cx)
    }

    fn poll_bits(&self, bits: u8, cx: &mut Context<'_>) -> Poll<()> {
        if self.has(bits) {
            return Poll::Ready(());
        }
        self.0.waker.register(cx.waker());
        // Fired between the first look and the registration: its wake may have found no
        // waker stored.
        if self.has(bits) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The future of [`Stop::killed`] and [`Stop::draining`].
pub(crate) struct Fired<'a> {
    stop: &'a Stop,
    bits: u8,
}

impl Future for Fired<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.stop.poll_bits(self.bits, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_kill_wakes_the_waiting_task_and_stays_fired() {
        let stop = Stop::default();
        let waiter = {
            let stop = stop.clone();
            tokio::spawn(async move {
                // Two futures of the same task, as a session's select has.
                tokio::select! {
                    _ = stop.killed() => "killed",
                    _ = tokio::time::sleep(Duration::from_secs(30)) => "timer",
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "nothing fired yet");
        stop.fire(KILL);
        let woke = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(woke.expect("woken").expect("task"), "killed");
        assert!(stop.is_killed());
        // A later wait completes at once.
        tokio::time::timeout(Duration::from_millis(100), stop.killed())
            .await
            .expect("already fired");
    }

    #[tokio::test]
    async fn a_drain_does_not_kill_and_a_kill_ends_a_drain_wait() {
        let stop = Stop::default();
        stop.fire(DRAIN);
        tokio::time::timeout(Duration::from_millis(100), stop.draining())
            .await
            .expect("draining");
        assert!(!stop.is_killed());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), stop.killed())
                .await
                .is_err(),
            "a drain is not a kill"
        );
        let other = Stop::default();
        other.fire(KILL);
        tokio::time::timeout(Duration::from_millis(100), other.draining())
            .await
            .expect("a kill ends a drain wait");
    }
}
