//! Counters exposed to tests and benchmarks.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

/// Live counters of a [`crate::StandIn`]. All methods are cheap and thread-safe.
#[derive(Debug, Default)]
pub struct Stats {
    accepted: AtomicU64,
    open: AtomicU64,
    open_max: AtomicU64,
    messages: AtomicU64,
    compressed: AtomicU64,
    authentications: AtomicU64,
    commands: RwLock<HashMap<String, AtomicU64>>,
}

impl Stats {
    /// TCP connections accepted since start (or the last [`Stats::reset`]).
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// TCP connections currently open (a gauge: not affected by [`Stats::reset`]).
    pub fn connections_open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// The most TCP connections open at once since start (or since the last
    /// [`Stats::reset`], which sets it to the connections open then).
    pub fn connections_open_max(&self) -> u64 {
        self.open_max.load(Ordering::Relaxed)
    }

    /// Wire messages received (every frame, including `moreToCome` ones and legacy opcodes).
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    /// Wire messages received inside OP_COMPRESSED.
    pub fn compressed_messages(&self) -> u64 {
        self.compressed.load(Ordering::Relaxed)
    }

    /// Successful SASL authentications (including speculative ones).
    pub fn authentications(&self) -> u64 {
        self.authentications.load(Ordering::Relaxed)
    }

    /// Number of commands seen with this name: the lower-cased first key of the command
    /// document (`"insert"`, `"find"`, `"hello"`, `"ismaster"`...). Legacy opcodes are counted
    /// as `"op_insert"`, `"op_update"`, `"op_delete"`, `"op_query"`, `"op_get_more"`,
    /// `"op_kill_cursors"`; a command sent through OP_QUERY counts both as `"op_query"` and
    /// under its own name. The lookup is case-insensitive.
    pub fn command_count(&self, name: &str) -> u64 {
        let key = name.to_ascii_lowercase();
        self.commands
            .read()
            .get(&key)
            .map(|c| c.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Every command count seen so far (lower-case names, see [`Stats::command_count`]);
    /// after a [`Stats::reset`] the names seen before remain, with 0.
    pub fn command_counts(&self) -> BTreeMap<String, u64> {
        self.commands
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect()
    }

    /// Reads the counters, zeroing them at the same time if `reset` (nothing counted
    /// in between is lost).
    pub(crate) fn snapshot(&self, reset: bool) -> Snapshot {
        let take = |a: &AtomicU64| {
            if reset {
                a.swap(0, Ordering::Relaxed)
            } else {
                a.load(Ordering::Relaxed)
            }
        };
        Snapshot {
            compressed_messages: take(&self.compressed),
            connections_accepted: take(&self.accepted),
            connections_open_max: if reset {
                self.open_max
                    .swap(self.open.load(Ordering::Relaxed), Ordering::Relaxed)
            } else {
                self.open_max.load(Ordering::Relaxed)
            },
            messages: take(&self.messages),
            authentications: take(&self.authentications),
            commands: self
                .commands
                .read()
                .iter()
                .map(|(k, v)| (k.clone(), take(v)))
                .collect(),
        }
    }

    /// Zeroes every counter except [`Stats::connections_open`]; sets
    /// [`Stats::connections_open_max`] to the connections open now.
    pub fn reset(&self) {
        self.accepted.store(0, Ordering::Relaxed);
        self.open_max
            .store(self.open.load(Ordering::Relaxed), Ordering::Relaxed);
        self.messages.store(0, Ordering::Relaxed);
        self.compressed.store(0, Ordering::Relaxed);
        self.authentications.store(0, Ordering::Relaxed);
        for c in self.commands.read().values() {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn on_accept(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.open_max.fetch_max(open, Ordering::Relaxed);
    }

    pub(crate) fn on_close(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn on_message(&self) {
        self.messages.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn on_compressed(&self) {
        self.compressed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn on_auth(&self) {
        self.authentications.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a command; `name` must already be lower-case.
    pub(crate) fn on_command(&self, name: &str) {
        if let Some(c) = self.commands.read().get(name) {
            c.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.commands
            .write()
            .entry(name.to_string())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Counters read by [`Stats::snapshot`].
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) compressed_messages: u64,
    pub(crate) connections_accepted: u64,
    pub(crate) connections_open_max: u64,
    pub(crate) messages: u64,
    pub(crate) authentications: u64,
    pub(crate) commands: BTreeMap<String, u64>,
}

/// Decrements the open-connection gauge when dropped.
pub(crate) struct OpenGuard<'a>(pub(crate) &'a Stats);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.on_close();
    }
}
