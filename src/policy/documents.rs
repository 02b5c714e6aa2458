//! D001–D005: the documents written, and the names they are written under.
//!
//! D001–D004 look at every inserted document (insert body or kind-1 sequence, legacy
//! OP_INSERT, bulkWrite `insert`), every replacement document (update `u`, findAndModify
//! `update`, bulkWrite `updateMods` without operators) and the document an upsert with
//! `upsertSupplied` inserts as it is (`c.new`, bulkWrite `constants.new`). Pipeline and
//! operator updates are not documents and are not judged here. An explained write writes
//! nothing: its statements are not seen, so D001–D005 never fire on explain.
//!
//! Edge decisions:
//! - D001: the document's BSON length in bytes, strictly above `max_document_bytes`.
//! - D002: a document's depth counts containers: the written document is level 1, a
//!   document or array held by one of its fields is level 2, and so on (`{a: 1}` is 1,
//!   `{a: {b: 1}}` and `{a: [1]}` are 2, `{a: [{b: 1}]}` is 3, an empty `{a: {}}` is 2).
//!   It fires above `max_depth`. The walk stops descending once that is known, unless D003
//!   still needs to look deeper; it never follows more than `MAX_DEPTH` + 1 levels (mongod
//!   stores at most 100), and a document deeper than that is refused as unreadable.
//! - D003: an array, at any depth, with more than `max_array_elements` elements.
//! - D004: a top-level `_id` that is a string, or binary of subtype 3 or 4 (UUID).
//! - D001–D004 skip documents written into `admin`, `local`, `config` or a `system.*`
//!   collection: those have shapes MongoDB prescribes (`system.js` keys functions by name)
//!   and W005 already judges the write itself.
//! - D005: a database must be `db_` followed by `[a-z0-9_]*`, at most 64 bytes; a
//!   collection `t_` followed by the same, at most 120 bytes (so a dot, as in `t_a.b`,
//!   breaks it). Checked on the namespace of commands that name one (CRUD, aggregate, count,
//!   distinct, mapReduce, and DDL: create, createIndexes, dropIndexes, drop, dropDatabase,
//!   collMod, renameCollection, convertToCapped, cloneCollectionAsCapped, shardCollection;
//!   also as legacy opcodes) and on every namespace a command writes (`$out` / `$merge`
//!   targets, bulkWrite `nsInfo`, applyOps, rename targets). Every other command (hello,
//!   ping, listCollections, user management, ...) targets no namespace here. `admin`,
//!   `local`, `config` and `system.*` are skipped; a database-level target is judged on the
//!   database name alone.

use crate::wire::GetFast;
use std::ops::ControlFlow;

use bson::{
    raw::RawIter,
    spec::{BinarySubtype, ElementType},
    RawBsonRef, RawDocument,
};

use super::{evaluate::Emitter, filter::MAX_DEPTH, writes::is_system_namespace, RuleId};
use crate::command::{CommandError, CommandView, Kind, Namespace};

const DOCUMENT_RULES: &[RuleId] = &[RuleId::D001, RuleId::D002, RuleId::D003, RuleId::D004];

/// The deepest level the document walk follows.
const MAX_LEVEL: usize = MAX_DEPTH + 1;

pub(crate) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if reads_every_statement(view, em) {
        documents(view, em)?;
    }
    if em.on(RuleId::D005) && !view.is_explain() {
        naming(view, em)?;
    }
    Ok(())
}

/// Whether [`check`] reads every statement of `view`: a command that writes documents, a
/// document rule on, and no family that read every statement found none written.
pub(super) fn reads_every_statement(view: &CommandView<'_>, em: &Emitter<'_, '_>) -> bool {
    let writes_documents = matches!(
        view.kind(),
        Kind::Insert | Kind::Update | Kind::FindAndModify | Kind::BulkWrite
    );
    let none_written = em.writes_documents == Some(false);
    writes_documents && !none_written && !em.all_off(DOCUMENT_RULES)
}

/// What D001–D004 look for; `None` for a rule that is off.
#[derive(Clone, Copy)]
struct Limits {
    max_bytes: Option<usize>,
    max_depth: Option<usize>,
    max_elements: Option<usize>,
    random_id: bool,
}

fn documents<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    let on = |rule, v: usize| em.on(rule).then_some(v);
    let limits = Limits {
        max_bytes: on(RuleId::D001, em.params.max_document_bytes),
        max_depth: on(RuleId::D002, em.params.max_depth),
        max_elements: on(RuleId::D003, em.params.max_array_elements),
        random_id: em.on(RuleId::D004),
    };
    let mut err = None;
    let _ = view.for_each_statement(|s| {
        let Some(doc) = s.statement.written_document() else {
            return ControlFlow::Continue(());
        };
        if is_system_namespace(s.ns) {
            return ControlFlow::Continue(());
        }
        match judge(doc, limits) {
            Ok(found) => {
                let at = Some(s.index);
                for (hit, rule) in [
                    (found.large, RuleId::D001),
                    (found.deep, RuleId::D002),
                    (found.long_array, RuleId::D003),
                    (found.random_id, RuleId::D004),
                ] {
                    if hit {
                        em.emit(rule, at, None);
                    }
                }
                ControlFlow::Continue(())
            }
            Err(e) => {
                err = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    err.map_or(Ok(()), Err)
}

/// What one document breaks.
#[derive(Default, Debug, PartialEq)]
struct Found {
    large: bool,
    deep: bool,
    long_array: bool,
    random_id: bool,
}

fn judge(doc: &RawDocument, limits: Limits) -> Result<Found, CommandError> {
    let mut found = Found {
        large: limits
            .max_bytes
            .is_some_and(|max| doc.as_bytes().len() > max),
        ..Found::default()
    };
    // The D002 / D003 walk reads the top-level `_id` on its way when it can decide it; what it
    // does not decide is looked up as before (and a lookup's error comes before the walk's).
    let (walked, top_id) = if limits.max_depth.is_some() || limits.max_elements.is_some() {
        let mut walk = Walk {
            limits,
            found: &mut found,
            top_id: None,
        };
        let walked = walk.container(doc, 1, false);
        (walked, walk.top_id)
    } else {
        (Ok(()), None)
    };
    if limits.random_id {
        found.random_id = match top_id {
            Some(random) => random,
            None => match doc.get_fast("_id").map_err(|_| CommandError::Malformed)? {
                Some(RawBsonRef::String(_)) => true,
                Some(RawBsonRef::Binary(b)) => {
                    matches!(b.subtype, BinarySubtype::Uuid | BinarySubtype::UuidOld)
                }
                _ => false,
            },
        };
    }
    walked?;
    Ok(found)
}

/// The D002 / D003 walk over one document.
struct Walk<'f> {
    limits: Limits,
    found: &'f mut Found,
    /// D004's finding for the top-level `_id` when the fast walk of the top level decided it
    /// (a string: random; any other type it checks: not; no `_id`: not); `None`: ask the
    /// lookup (a binary, a value the walk does not check, a top level it did not decide).
    top_id: Option<bool>,
}

impl Walk<'_> {
    /// True when nothing below `level` can change the answer.
    fn done_below(&self, level: usize) -> bool {
        let depth_known = match self.limits.max_depth {
            Some(max) => self.found.deep || level > max,
            None => true,
        };
        let arrays_known = self.limits.max_elements.is_none() || self.found.long_array;
        depth_known && arrays_known
    }

    /// Called for a container found at `level` (the top document is level 1).
    fn enter(&mut self, level: usize) -> Result<bool, CommandError> {
        if self.limits.max_depth.is_some_and(|max| level > max) {
            self.found.deep = true;
        }
        if self.done_below(level) {
            return Ok(false);
        }
        if level > MAX_LEVEL {
            return Err(CommandError::TooDeep);
        }
        Ok(true)
    }

    /// A document or an array (its bytes are a document's) at `level`: its elements are at
    /// `level + 1`. Only containers are decoded (scalars are skipped unread: no UTF-8 check of
    /// strings). The walk of `bson_scan` decides the common case; a container it does not
    /// decide is walked again with the bson crate's iterator, which gives the verdict (what
    /// the first walk found is found again: the findings only ever turn true).
    fn container(
        &mut self,
        doc: &RawDocument,
        level: usize,
        array: bool,
    ) -> Result<(), CommandError> {
        if !self.enter(level)? {
            return Ok(());
        }
        let mut len = 0usize;
        let mut failed = None;
        // The first `_id` of the top level: Some(its finding, or None when not decided here).
        let mut id: Option<Option<bool>> = None;
        let top = level == 1 && !array && self.limits.random_id;
        let walked = crate::wire::walk_keyed(doc, |key, tag, value| {
            len += 1;
            if top && id.is_none() && key == b"_id" {
                id = Some(crate::wire::value_valid(tag, value).then_some(tag == 0x02));
            }
            if !matches!(tag, 0x03 | 0x04) {
                return None;
            }
            let nested = RawDocument::from_bytes(value)
                .map_err(|_| CommandError::Malformed)
                .and_then(|child| self.container(child, level + 1, tag == 0x04));
            nested.err().map(|e| failed = Some(e))
        });
        match (walked, failed) {
            (_, Some(e)) => Err(e),
            (Ok(_), None) => {
                if array && self.limits.max_elements.is_some_and(|max| len > max) {
                    self.found.long_array = true;
                }
                if top {
                    self.top_id = id.unwrap_or(Some(false));
                }
                Ok(())
            }
            (Err(()), None) => self.container_by_iter(doc.iter_elements(), level, array),
        }
    }

    /// [`Walk::container`] through the bson crate's iterator: any document.
    fn container_by_iter(
        &mut self,
        elements: RawIter<'_>,
        level: usize,
        array: bool,
    ) -> Result<(), CommandError> {
        let mut len = 0usize;
        for elem in elements {
            let elem = elem.map_err(|_| CommandError::Malformed)?;
            len += 1;
            match elem.element_type() {
                ElementType::EmbeddedDocument | ElementType::Array => {
                    match elem.value().map_err(|_| CommandError::Malformed)? {
                        RawBsonRef::Document(d) => self.container(d, level + 1, false)?,
                        RawBsonRef::Array(a) => {
                            let items = RawDocument::from_bytes(a.as_bytes())
                                .map_err(|_| CommandError::Malformed)?;
                            self.container(items, level + 1, true)?
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        if array && self.limits.max_elements.is_some_and(|max| len > max) {
            self.found.long_array = true;
        }
        Ok(())
    }
}

/// Commands whose [`CommandView::namespace`] is a database or collection they act on.
fn names_a_namespace(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Find
            | Kind::Insert
            | Kind::Update
            | Kind::Delete
            | Kind::FindAndModify
            | Kind::Aggregate
            | Kind::Count
            | Kind::Distinct
            | Kind::MapReduce
            | Kind::Create
            | Kind::CreateIndexes
            | Kind::DropIndexes
            | Kind::Drop
            | Kind::DropDatabase
            | Kind::CollMod
            | Kind::RenameCollection
            | Kind::ConvertToCapped
            | Kind::CloneCollectionAsCapped
            | Kind::ShardCollection
    )
}

fn naming<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    let mut bad = names_a_namespace(view.kind()) && !well_named(view.namespace());
    if !bad {
        let _ = view.for_each_written_namespace(|ns| {
            bad = !well_named(ns);
            if bad {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
    }
    if bad {
        em.emit(RuleId::D005, None, None);
    }
    Ok(())
}

/// D005's convention; MongoDB's own namespaces are exempt.
fn well_named(ns: Namespace<'_>) -> bool {
    is_system_namespace(ns)
        || (conventional(ns.db, "db_", 64) && ns.coll.is_none_or(|c| conventional(c, "t_", 120)))
}

/// `prefix` + `[a-z0-9_]*`, at most `max` bytes.
fn conventional(name: &str, prefix: &str, max: usize) -> bool {
    name.len() <= max
        && name.strip_prefix(prefix).is_some_and(|rest| {
            rest.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    const ALL: Limits = Limits {
        max_bytes: Some(100),
        max_depth: Some(3),
        max_elements: Some(2),
        random_id: true,
    };

    #[test]
    fn depth_counts_containers() {
        let at = |d: &RawDocument| judge(d, ALL).unwrap().deep;
        assert!(!at(&rawdoc! {"a": {"b": {"c": 1}}}));
        assert!(!at(&rawdoc! {"a": [[1]]}));
        assert!(at(&rawdoc! {"a": {"b": {"c": {}}}}));
        assert!(at(&rawdoc! {"a": [{"b": [1]}]}));
    }

    #[test]
    fn arrays_below_the_depth_limit_are_still_counted() {
        let d = rawdoc! {"a": {"b": {"c": {"d": {"e": [1, 2, 3]}}}}};
        let found = judge(&d, ALL).unwrap();
        assert!(found.deep && found.long_array);
        let found = judge(&rawdoc! {"a": [1, 2]}, ALL).unwrap();
        assert!(!found.long_array);
    }

    #[test]
    fn hostile_depth_is_refused_only_when_it_matters() {
        let mut d = rawdoc! {"x": 1};
        for _ in 0..150 {
            d = rawdoc! {"a": d};
        }
        assert!(matches!(judge(&d, ALL), Err(CommandError::TooDeep)));
        let depth_only = Limits {
            max_elements: None,
            ..ALL
        };
        assert!(judge(&d, depth_only).unwrap().deep);
    }

    /// The walk before `bson_scan` decided the common case: the bson crate's iterator all
    /// the way down. The oracle of the test below.
    fn judge_by_iter(doc: &RawDocument, limits: Limits) -> Result<(bool, bool), CommandError> {
        fn go(
            w: &mut Walk<'_>,
            elements: RawIter<'_>,
            level: usize,
            array: bool,
        ) -> Result<(), CommandError> {
            if !w.enter(level)? {
                return Ok(());
            }
            let mut len = 0usize;
            for elem in elements {
                let elem = elem.map_err(|_| CommandError::Malformed)?;
                len += 1;
                if matches!(
                    elem.element_type(),
                    ElementType::EmbeddedDocument | ElementType::Array
                ) {
                    match elem.value().map_err(|_| CommandError::Malformed)? {
                        RawBsonRef::Document(d) => go(w, d.iter_elements(), level + 1, false)?,
                        RawBsonRef::Array(a) => go(w, a.iter_elements(), level + 1, true)?,
                        _ => {}
                    }
                }
            }
            if array && w.limits.max_elements.is_some_and(|max| len > max) {
                w.found.long_array = true;
            }
            Ok(())
        }
        let mut found = Found::default();
        let mut w = Walk {
            limits,
            found: &mut found,
            top_id: None,
        };
        go(&mut w, doc.iter_elements(), 1, false)?;
        Ok((found.deep, found.long_array))
    }

    /// D004's oracle: the bson crate's lookup of `_id`, looked up before the walk (its error
    /// first), then the iterator's walk.
    fn oracle(doc: &RawDocument, limits: Limits) -> Result<(bool, bool, bool), CommandError> {
        let random_id = limits.random_id
            && match doc.get("_id").map_err(|_| CommandError::Malformed)? {
                Some(RawBsonRef::String(_)) => true,
                Some(RawBsonRef::Binary(b)) => {
                    matches!(b.subtype, BinarySubtype::Uuid | BinarySubtype::UuidOld)
                }
                _ => false,
            };
        let (deep, long_array) = judge_by_iter(doc, limits)?;
        Ok((deep, long_array, random_id))
    }

    /// Every corrupted and cut copy of nested documents (containers in documents and arrays,
    /// a regex the fast walk leaves to the bson crate; an `_id` that is a number, a string, a
    /// UUID, found first, last, twice): the same findings (D004's too, which the walk reads
    /// on its way) and the same error as the bson crate's lookup and iterator, under limits
    /// that stop early, limits that walk everything, and D004 alone.
    #[test]
    fn the_fast_walk_agrees_with_the_iterator() {
        let regex = bson::Regex {
            pattern: "a".to_owned().try_into().unwrap(),
            options: String::new().try_into().unwrap(),
        };
        let uuid = bson::Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![7; 16],
        };
        let goods = [
            rawdoc! {
                "_id": 1, "a": {"b": [1, {"c": [1, 2, 3]}], "s": "x"}, "r": regex.clone(),
                "d": [[[{"e": {"f": 1}}]]], "t": true,
            },
            rawdoc! {"a": {"_id": "inner"}, "b": [1, 2, 3], "_id": "outer", "t": false},
            rawdoc! {"_id": uuid, "a": [{"b": 1}], "s": "x"},
            rawdoc! {"_id": 1.5, "_id": "second", "a": {"b": {"c": {"d": 1}}}},
        ];
        let loose = Limits {
            max_bytes: None,
            max_depth: Some(64),
            max_elements: Some(1000),
            random_id: false,
        };
        let id_only = Limits {
            max_bytes: None,
            max_depth: None,
            max_elements: None,
            random_id: true,
        };
        let mut checked = 0usize;
        let mut try_bytes = |bytes: Vec<u8>| {
            let Ok(doc) = RawDocument::from_bytes(&bytes) else {
                return;
            };
            for limits in [
                ALL,
                loose,
                Limits {
                    random_id: true,
                    ..loose
                },
                id_only,
            ] {
                let ours = judge(doc, limits).map(|f| (f.deep, f.long_array, f.random_id));
                let theirs = oracle(doc, limits);
                let same = match (&ours, &theirs) {
                    (Ok(a), Ok(b)) => a == b,
                    (Err(a), Err(b)) => std::mem::discriminant(a) == std::mem::discriminant(b),
                    _ => false,
                };
                assert!(same, "{bytes:?}: {ours:?} vs {theirs:?}");
                checked += 1;
            }
        };
        for good in &goods {
            for b in crate::wire::corruptions(good.as_bytes()) {
                try_bytes(b);
            }
        }
        assert!(checked > 4_000, "{checked}");
    }

    #[test]
    fn names() {
        assert!(conventional("db_sales_2024", "db_", 64));
        assert!(conventional("db_", "db_", 64));
        assert!(!conventional("db_Sales", "db_", 64));
        assert!(!conventional("sales", "db_", 64));
        assert!(!conventional("t_a.b", "t_", 120));
        assert!(!conventional(&format!("db_{}", "a".repeat(62)), "db_", 64));
        assert!(conventional(&format!("db_{}", "a".repeat(61)), "db_", 64));
        let ns = |db, coll| Namespace { db, coll };
        assert!(well_named(ns("admin", Some("Anything"))));
        assert!(well_named(ns("db_x", Some("system.views"))));
        assert!(well_named(ns("db_x", None)));
        assert!(!well_named(ns("db_x", Some("orders"))));
    }
}
