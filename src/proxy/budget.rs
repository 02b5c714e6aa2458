//! The process-wide memory budget: client message bytes in flight (buffered large messages
//! and decompressed messages), in KiB permits, and the slots for decompressing off the
//! runtime threads.

use std::{sync::Arc, time::Duration};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The process-wide budget of client message bytes in flight (buffered large messages and
/// decompressed messages), in KiB permits.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    permits: Arc<Semaphore>,
    total_kib: usize,
    /// Decompressions running on the blocking pool at once: one per core, so a burst of
    /// compression bombs cannot crowd the runtime threads out of the CPU.
    off_thread: Semaphore,
}

/// Bytes held from the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct BudgetPermit(#[allow(dead_code)] OwnedSemaphorePermit);

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024).max(1)
}

impl MemoryBudget {
    /// A budget of `bytes`.
    pub(crate) fn new(bytes: u64) -> MemoryBudget {
        let total_kib = usize::try_from(bytes / 1024)
            .unwrap_or(usize::MAX)
            .clamp(1, Semaphore::MAX_PERMITS);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        MemoryBudget {
            permits: Arc::new(Semaphore::new(total_kib)),
            total_kib,
            off_thread: Semaphore::new(cores),
        }
    }

    /// Takes `bytes` from the budget, waiting up to `wait` (and never past `kill`). `None`:
    /// the budget stayed spent, or `bytes` is more than the whole budget.
    pub(crate) async fn take(
        &self,
        bytes: usize,
        wait: Duration,
        kill: &super::stop::Stop,
    ) -> Option<BudgetPermit> {
        let n = kib(bytes);
        if n > self.total_kib {
            return None;
        }
        let n = u32::try_from(n).ok()?;
        if let Ok(p) = self.permits.clone().try_acquire_many_owned(n) {
            return Some(BudgetPermit(p));
        }
        tokio::select! {
            biased;
            _ = kill.killed() => None,
            p = self.permits.clone().acquire_many_owned(n) => p.ok().map(BudgetPermit),
            _ = tokio::time::sleep(wait) => None,
        }
    }

    /// A slot for CPU-heavy work on the blocking pool — decompressing a large message,
    /// judging one — one per core (`None`: shutting down).
    pub(crate) async fn off_thread_slot(
        &self,
        kill: &super::stop::Stop,
    ) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::select! {
            biased;
            _ = kill.killed() => None,
            p = self.off_thread.acquire() => p.ok(),
        }
    }

    /// The budget, in bytes.
    pub(crate) fn limit_bytes(&self) -> u64 {
        self.total_kib as u64 * 1024
    }

    /// Bytes currently taken (for metrics).
    pub(crate) fn in_use_bytes(&self) -> u64 {
        let free = self.permits.available_permits();
        (self.total_kib.saturating_sub(free) as u64) * 1024
    }
}
