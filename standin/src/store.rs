//! In-memory storage: databases -> collections, each collection behind its own RwLock.
//!
//! Locks are never held across an await point: every command runs synchronously against
//! the store and releases its locks before the reply is written.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bson::{Bson, Document};
use parking_lot::RwLock;

use crate::bsonutil::{doc_size, id_key};
use crate::query::Filter;

/// Documents of one collection in natural (insertion) order, with an `_id` index.
#[derive(Debug, Default)]
pub(crate) struct CollData {
    docs: BTreeMap<u64, Document>,
    ids: HashMap<Vec<u8>, u64>,
    next: u64,
    /// Index specs created with createIndexes (the implicit `_id_` index is not stored).
    pub(crate) indexes: Vec<Document>,
}

/// A duplicate `_id` on insert.
#[derive(Debug)]
pub(crate) struct DuplicateKey(pub(crate) Bson);

impl CollData {
    pub(crate) fn len(&self) -> usize {
        self.docs.len()
    }

    /// Inserts a document that already has an `_id`.
    pub(crate) fn insert(&mut self, doc: Document) -> Result<(), DuplicateKey> {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let key = id_key(&id);
        if self.ids.contains_key(&key) {
            return Err(DuplicateKey(id));
        }
        let seq = self.next;
        self.next += 1;
        self.ids.insert(key, seq);
        self.docs.insert(seq, doc);
        Ok(())
    }

    /// Sequence numbers of matching documents in natural order, at most `max`.
    pub(crate) fn matching(&self, filter: &Filter, max: Option<usize>) -> Vec<u64> {
        let max = max.unwrap_or(usize::MAX);
        if max == 0 {
            return Vec::new();
        }
        if let Some(id) = filter.id_equality() {
            return self
                .ids
                .get(&id_key(id))
                .filter(|seq| self.docs.get(seq).is_some_and(|d| filter.matches(d)))
                .map(|s| vec![*s])
                .unwrap_or_default();
        }
        self.docs
            .iter()
            .filter(|(_, d)| filter.matches(d))
            .map(|(s, _)| *s)
            .take(max)
            .collect()
    }

    /// Clones of the matching documents, in natural order, at most `max`.
    pub(crate) fn find(&self, filter: &Filter, max: Option<usize>) -> Vec<Document> {
        self.matching(filter, max)
            .into_iter()
            .filter_map(|s| self.docs.get(&s).cloned())
            .collect()
    }

    pub(crate) fn get(&self, seq: u64) -> Option<&Document> {
        self.docs.get(&seq)
    }

    /// Replaces the document at `seq` (its `_id` may change only if the new one is unique).
    pub(crate) fn replace(&mut self, seq: u64, doc: Document) -> Result<(), DuplicateKey> {
        let new_key = id_key(doc.get("_id").unwrap_or(&Bson::Null));
        let old_key = self
            .docs
            .get(&seq)
            .map(|d| id_key(d.get("_id").unwrap_or(&Bson::Null)));
        if old_key.as_ref() != Some(&new_key) {
            if self.ids.contains_key(&new_key) {
                return Err(DuplicateKey(doc.get("_id").cloned().unwrap_or(Bson::Null)));
            }
            if let Some(k) = old_key {
                self.ids.remove(&k);
            }
            self.ids.insert(new_key, seq);
        }
        self.docs.insert(seq, doc);
        Ok(())
    }

    pub(crate) fn remove(&mut self, seq: u64) -> Option<Document> {
        let doc = self.docs.remove(&seq)?;
        self.ids
            .remove(&id_key(doc.get("_id").unwrap_or(&Bson::Null)));
        Some(doc)
    }

    pub(crate) fn size_bytes(&self) -> usize {
        self.docs.values().map(doc_size).sum()
    }
}

/// One collection.
#[derive(Debug, Default)]
pub(crate) struct Collection {
    pub(crate) data: RwLock<CollData>,
}

type Db = BTreeMap<String, Arc<Collection>>;

/// All databases.
#[derive(Debug, Default)]
pub(crate) struct Store {
    dbs: RwLock<BTreeMap<String, Db>>,
}

impl Store {
    pub(crate) fn get(&self, db: &str, coll: &str) -> Option<Arc<Collection>> {
        self.dbs.read().get(db)?.get(coll).cloned()
    }

    /// Returns the collection, creating it if needed (`true` = created now).
    pub(crate) fn get_or_create(&self, db: &str, coll: &str) -> (Arc<Collection>, bool) {
        if let Some(c) = self.get(db, coll) {
            return (c, false);
        }
        let mut dbs = self.dbs.write();
        let d = dbs.entry(db.to_string()).or_default();
        if let Some(c) = d.get(coll) {
            return (c.clone(), false);
        }
        let c = Arc::new(Collection::default());
        d.insert(coll.to_string(), c.clone());
        (c, true)
    }

    pub(crate) fn drop_collection(&self, db: &str, coll: &str) -> Option<Arc<Collection>> {
        let mut dbs = self.dbs.write();
        let d = dbs.get_mut(db)?;
        let c = d.remove(coll);
        if d.is_empty() {
            dbs.remove(db);
        }
        c
    }

    pub(crate) fn drop_database(&self, db: &str) -> bool {
        self.dbs.write().remove(db).is_some()
    }

    /// Database names with their approximate size in bytes.
    pub(crate) fn databases(&self) -> Vec<(String, usize)> {
        let snapshot: Vec<(String, Vec<Arc<Collection>>)> = self
            .dbs
            .read()
            .iter()
            .map(|(n, d)| (n.clone(), d.values().cloned().collect()))
            .collect();
        snapshot
            .into_iter()
            .map(|(n, cs)| (n, cs.iter().map(|c| c.data.read().size_bytes()).sum()))
            .collect()
    }

    pub(crate) fn collections(&self, db: &str) -> Vec<(String, Arc<Collection>)> {
        self.dbs
            .read()
            .get(db)
            .map(|d| d.iter().map(|(n, c)| (n.clone(), c.clone())).collect())
            .unwrap_or_default()
    }

    /// Renames `from` to `to` (both `(db, coll)`); errors are (code, codeName, message).
    pub(crate) fn rename(
        &self,
        from: (&str, &str),
        to: (&str, &str),
        drop_target: bool,
    ) -> Result<(), (i32, &'static str, String)> {
        let mut dbs = self.dbs.write();
        let exists = |dbs: &BTreeMap<String, Db>, (d, c): (&str, &str)| {
            dbs.get(d).is_some_and(|m| m.contains_key(c))
        };
        if !exists(&dbs, from) {
            return Err((
                26,
                "NamespaceNotFound",
                "Source collection does not exist".into(),
            ));
        }
        if from == to {
            return Err((
                20,
                "IllegalOperation",
                "Can't rename a collection to itself".into(),
            ));
        }
        if exists(&dbs, to) && !drop_target {
            return Err((48, "NamespaceExists", "target namespace exists".into()));
        }
        let coll = dbs.get_mut(from.0).and_then(|m| m.remove(from.1)).ok_or((
            26,
            "NamespaceNotFound",
            "Source collection does not exist".to_string(),
        ))?;
        if dbs.get(from.0).is_some_and(|m| m.is_empty()) {
            dbs.remove(from.0);
        }
        dbs.entry(to.0.to_string())
            .or_default()
            .insert(to.1.to_string(), coll);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn insert_find_replace_remove() {
        let store = Store::default();
        let (c, created) = store.get_or_create("d", "c");
        assert!(created);
        let mut data = c.data.write();
        data.insert(doc! {"_id": 1, "a": 1}).unwrap();
        data.insert(doc! {"_id": 2, "a": 2}).unwrap();
        assert!(data.insert(doc! {"_id": 1.0, "a": 3}).is_err());
        let f = Filter::parse(&doc! {"_id": 2}).unwrap();
        let seqs = data.matching(&f, None);
        assert_eq!(seqs.len(), 1);
        data.replace(seqs[0], doc! {"_id": 2, "a": 20}).unwrap();
        assert_eq!(data.find(&Filter::all(), None).len(), 2);
        assert_eq!(data.find(&Filter::all(), Some(1)).len(), 1);
        data.remove(seqs[0]);
        assert_eq!(data.len(), 1);
        drop(data);
        store.rename(("d", "c"), ("d", "e"), false).unwrap();
        assert!(store.get("d", "c").is_none());
        assert!(store.get("d", "e").is_some());
        assert_eq!(store.databases().len(), 1);
    }
}
