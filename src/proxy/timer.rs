//! A session's timeouts without a timer registration per request.
//!
//! The idle timeout (between requests) and the reply timeout (per reply) restart with every
//! request. A fresh `tokio::time::sleep` per wait inserts an entry into the runtime's timer
//! wheel when first polled and removes it when dropped — two lock round trips and the wheel's
//! bookkeeping per wait, on every request, for timeouts that almost never fire. A
//! [`LazyTimer`] keeps one `Sleep` for the session's life and moves only its *due* time (a
//! clock read) when re-armed. The sleep is re-registered only when it fires before the due
//! time (then it is set to the due time) or when a due time earlier than the registered one
//! is armed. So a session that keeps sending requests re-registers its timer once per timeout
//! period, not once per request; and the timer still fires no earlier and no later than a
//! fresh sleep would.
//!
//! Nor is the sleep polled again while it still holds this task's waker: once a poll has
//! registered the task and returned pending, the timer wheel wakes the task when the sleep
//! fires, so a later wait of the same task that finds the sleep neither fired nor moved
//! returns pending without the poll (its coop budget, the waker's registration, the state's
//! load: ~120 instructions, twice per request).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

/// A re-armable timeout (see the module docs). Unarmed, it never fires.
pub(crate) struct LazyTimer {
    /// Registered (when first polled) at or before `due`.
    sleep: Pin<Box<Sleep>>,
    due: Option<Instant>,
    /// The waker the sleep holds: that of the last poll of it that returned pending, since
    /// when it has neither been reset nor fired. `None`: poll it.
    holds: Option<Waker>,
}

/// A deadline far enough to never fire, for a timer not yet armed (`Instant` has no max).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

impl LazyTimer {
    pub(crate) fn new() -> LazyTimer {
        LazyTimer {
            sleep: Box::pin(tokio::time::sleep_until(far_future())),
            due: None,
            holds: None,
        }
    }

    /// Fires `d` from now (zero: never).
    pub(crate) fn arm(&mut self, d: Duration) {
        self.due = (!d.is_zero()).then(|| Instant::now() + d);
    }

    /// Completes once the armed due time has passed; pending forever when unarmed.
    pub(crate) fn expired(&mut self) -> Expired<'_> {
        Expired { timer: self }
    }

    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(due) = self.due else {
            return Poll::Pending;
        };
        if self.sleep.deadline() > due {
            // Armed earlier than registered: move the registration forward.
            self.sleep.as_mut().reset(due);
            self.holds = None;
        } else if self.holds.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
            && !self.sleep.is_elapsed()
        {
            // Registered with this task and not fired: its firing wakes this task.
            return Poll::Pending;
        }
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                if !self.holds.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    self.holds = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            // The registered time passed: the real deadline, or an older one that was moved
            // later since (re-register at the real one).
            self.holds = None;
            if Instant::now() >= due {
                return Poll::Ready(());
            }
            self.sleep.as_mut().reset(due);
        }
    }
}

/// The future of [`LazyTimer::expired`].
pub(crate) struct Expired<'a> {
    timer: &'a mut LazyTimer,
}

impl Future for Expired<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.timer.poll_expired(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_last_armed_due_time_not_before() {
        let mut t = LazyTimer::new();
        t.arm(Duration::from_secs(10));
        let start = Instant::now();
        // Re-armed (later) twice before the first due time, as requests that keep coming do.
        for _ in 0..2 {
            assert!(
                tokio::time::timeout(Duration::from_secs(4), t.expired())
                    .await
                    .is_err(),
                "fired before its due time"
            );
            t.arm(Duration::from_secs(10));
        }
        tokio::time::timeout(Duration::from_secs(3600), t.expired())
            .await
            .expect("the timer never fired");
        let took = start.elapsed();
        // Armed last at 8 s for 10 s: fires at 18 s.
        assert!(
            took >= Duration::from_secs(18) && took < Duration::from_secs(19),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_due_time_moves_the_registration_forward() {
        let mut t = LazyTimer::new();
        t.arm(Duration::from_secs(600));
        assert!(tokio::time::timeout(Duration::from_secs(1), t.expired())
            .await
            .is_err());
        let start = Instant::now();
        t.arm(Duration::from_secs(5));
        t.expired().await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(5) && took < Duration::from_secs(6),
            "{took:?}"
        );
    }

    /// A task that waits on the timer again and again without its firing (woken by something
    /// else each time, as a session is by its requests) returns pending without polling the
    /// sleep, and is still woken by the sleep's firing at the due time.
    #[tokio::test(start_paused = true)]
    async fn a_wait_that_skips_the_poll_is_still_woken_by_the_firing() {
        let nudge = std::sync::Arc::new(tokio::sync::Notify::new());
        let nudged = nudge.clone();
        let start = Instant::now();
        let waiter = tokio::spawn(async move {
            let mut t = LazyTimer::new();
            t.arm(Duration::from_secs(30));
            let mut woken = 0;
            loop {
                tokio::select! {
                    _ = t.expired() => return (woken, start.elapsed()),
                    _ = nudged.notified() => woken += 1,
                }
            }
        });
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            nudge.notify_one();
        }
        let (woken, took) = tokio::time::timeout(Duration::from_secs(3600), waiter)
            .await
            .expect("the firing did not wake the waiter")
            .unwrap();
        assert_eq!(woken, 5, "every nudge reached the waiter");
        assert!(
            took >= Duration::from_secs(30) && took < Duration::from_secs(31),
            "{took:?}"
        );
    }

    /// Waited on from another task after its first waiter left, the timer polls the sleep
    /// again (the sleep holds the first task's waker) and wakes the new task.
    #[tokio::test(start_paused = true)]
    async fn a_wait_from_another_task_registers_that_task() {
        let mut t = LazyTimer::new();
        t.arm(Duration::from_secs(10));
        assert!(tokio::time::timeout(Duration::from_secs(1), t.expired())
            .await
            .is_err());
        let start = Instant::now();
        let other = tokio::spawn(async move {
            t.expired().await;
            start.elapsed()
        });
        let took = tokio::time::timeout(Duration::from_secs(3600), other)
            .await
            .expect("the firing did not wake the other task")
            .unwrap();
        assert!(
            took >= Duration::from_secs(9) && took < Duration::from_secs(10),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unarmed_never_fires() {
        let mut t = LazyTimer::new();
        t.arm(Duration::ZERO);
        assert!(tokio::time::timeout(Duration::from_secs(3600), t.expired())
            .await
            .is_err());
    }
}
