//! Server-side cursors: materialized result sets handed out in batches.
//!
//! Cursors belong to the server (not to a connection): a getMore may arrive on any connection.
//! They expire after [`CURSOR_TIMEOUT`] without use.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bson::Document;
use parking_lot::Mutex;
use rand::Rng;

use crate::bsonutil::doc_size;

/// Idle cursors are removed after this long.
pub(crate) const CURSOR_TIMEOUT: Duration = Duration::from_secs(600);

/// Default size of a first batch (as mongod).
pub(crate) const DEFAULT_FIRST_BATCH: usize = 101;

/// Upper bound of one batch in bytes (as mongod: 16 MiB).
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

const SHARDS: usize = 16;

#[derive(Debug)]
pub(crate) struct Cursor {
    /// "db.coll" the cursor reads (what getMore's `collection` must match).
    pub(crate) ns: String,
    pub(crate) docs: VecDeque<Document>,
    /// Who opened it (getMore checks it as mongod does).
    pub(crate) owner: Owner,
    last_used: Instant,
}

/// What a getMore must match: the user, the session and the transaction of the command that
/// opened the cursor (src/mongo/db/commands/query_cmd/getmore_cmd.cpp).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Owner {
    pub(crate) user: Option<String>,
    /// `lsid.id` bytes.
    pub(crate) lsid: Option<Vec<u8>>,
    /// `txnNumber`, inside a multi-document transaction only.
    pub(crate) txn_number: Option<i64>,
}

/// All open cursors of a server, sharded by id.
#[derive(Debug)]
pub(crate) struct Cursors {
    shards: Vec<Mutex<HashMap<i64, Cursor>>>,
}

impl Default for Cursors {
    fn default() -> Self {
        Cursors {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

/// Takes one batch of at most `n` documents (and at most 16 MiB, but at least one document).
pub(crate) fn take_batch(docs: &mut VecDeque<Document>, n: Option<usize>) -> Vec<Document> {
    let n = n.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut bytes = 0usize;
    while out.len() < n {
        let Some(front) = docs.front() else { break };
        let sz = doc_size(front);
        if !out.is_empty() && bytes + sz > MAX_BATCH_BYTES {
            break;
        }
        bytes += sz;
        if let Some(d) = docs.pop_front() {
            out.push(d);
        }
    }
    out
}

impl Cursors {
    fn shard(&self, id: i64) -> &Mutex<HashMap<i64, Cursor>> {
        &self.shards[(id as u64 % SHARDS as u64) as usize]
    }

    /// Registers the remaining documents of a result set; returns the new cursor id.
    pub(crate) fn open(&self, ns: String, docs: VecDeque<Document>, owner: Owner) -> i64 {
        let cursor = Cursor {
            ns,
            docs,
            owner,
            last_used: Instant::now(),
        };
        loop {
            let id = rand::rng().random_range(1..i64::MAX);
            let mut shard = self.shard(id).lock();
            if let std::collections::hash_map::Entry::Vacant(v) = shard.entry(id) {
                v.insert(cursor);
                return id;
            }
        }
    }

    /// Removes a cursor to serve a getMore from it (put it back with [`Cursors::restore`]).
    pub(crate) fn checkout(&self, id: i64) -> Option<Cursor> {
        self.shard(id).lock().remove(&id)
    }

    pub(crate) fn restore(&self, id: i64, mut cursor: Cursor) {
        cursor.last_used = Instant::now();
        self.shard(id).lock().insert(id, cursor);
    }

    /// The namespace and the user of a cursor, if it exists.
    pub(crate) fn owner(&self, id: i64) -> Option<(String, Option<String>)> {
        self.shard(id)
            .lock()
            .get(&id)
            .map(|c| (c.ns.clone(), c.owner.user.clone()))
    }

    /// Kills a cursor; true if it existed.
    pub(crate) fn kill(&self, id: i64) -> bool {
        self.shard(id).lock().remove(&id).is_some()
    }

    /// Drops cursors idle for longer than `timeout`.
    pub(crate) fn sweep(&self, timeout: Duration) -> usize {
        let now = Instant::now();
        let mut removed = 0;
        for s in &self.shards {
            let mut s = s.lock();
            let before = s.len();
            s.retain(|_, c| now.duration_since(c.last_used) < timeout);
            removed += before - s.len();
        }
        removed
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn batches_and_lifecycle() {
        let cursors = Cursors::default();
        let mut docs: VecDeque<Document> = (0..250).map(|i| doc! {"i": i}).collect();
        let first = take_batch(&mut docs, Some(DEFAULT_FIRST_BATCH));
        assert_eq!(first.len(), 101);
        let id = cursors.open("d.c".into(), docs, Owner::default());
        assert!(id > 0);
        let mut c = cursors.checkout(id).unwrap();
        assert_eq!(c.ns, "d.c");
        assert_eq!(take_batch(&mut c.docs, Some(100)).len(), 100);
        cursors.restore(id, c);
        assert_eq!(cursors.len(), 1);
        assert_eq!(cursors.sweep(Duration::from_secs(600)), 0);
        assert_eq!(cursors.sweep(Duration::ZERO), 1);
        assert!(!cursors.kill(id));
    }
}
