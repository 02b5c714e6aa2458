//! I001, I002, I003, I004: index builds and shard keys.
//!
//! - I002 reads the collection's index count the plan guard keeps (from `listIndexes`, kept
//!   current from the DDL mongoguard forwards): a createIndexes that would leave more than
//!   10 indexes (the `_id` index included) warns, more than 20 gets the action in force
//!   (block in both profiles). An unknown count (never fetched yet) does not fire.
//!
//! Edge decisions:
//! - I001 fires per `createIndexes` spec without a truthy `background` (a boolean or any
//!   number, as mongod reads it; another type is refused as unreadable) only when the
//!   upstream's wire version is known and below 8 (MongoDB 4.2 made every build
//!   non-blocking). An unknown version never fires: no false warnings or blocks before the
//!   handshake with the upstream has told us.
//! - I003 fires per index spec that has `expireAfterSeconds` (any value) and a `key` with
//!   more than one field; also for `collMod` turning an index given by `keyPattern` into a
//!   TTL index. A `collMod` naming the index by `name` cannot be judged here (quiet).
//! - I004 fires when `shardCollection` (or `reshardCollection`) has `_id` as the first
//!   field of its `key` with a numeric value (1 or -1, any numeric type); `"hashed"` and any
//!   other value (which mongod rejects) stay quiet.
//! - Index specs are reported with their position in `indexes` as the statement index. A
//!   spec (or `collMod` `index`) that repeats a key is refused as unreadable.
//! - Explain of these commands is not a change: nothing fires.

use crate::wire::GetFast;
use std::ops::ControlFlow;

use bson::{RawBsonRef, RawDocument};

use super::{evaluate::Emitter, RuleId};
use crate::{
    command::{number, truthy, CommandError, CommandView, Kind},
    wire::{check_duplicate_keys, WireError},
};

const RULES: &[RuleId] = &[RuleId::I001, RuleId::I002, RuleId::I003, RuleId::I004];

/// I002's thresholds: more indexes than this warn...
const MANY_INDEXES: usize = 10;
/// ...and more than this get the action in force.
const TOO_MANY_INDEXES: usize = 20;

/// The wire version of MongoDB 4.2: from it on, index builds no longer block.
const NON_BLOCKING_BUILDS: i32 = 8;

pub(crate) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if view.is_explain() || em.all_off(RULES) {
        return Ok(());
    }
    let Some(body) = view.body() else {
        return Ok(());
    };
    match view.kind() {
        Kind::CreateIndexes => create_indexes(view, body, em),
        Kind::CollMod if em.on(RuleId::I003) => coll_mod(body, em),
        Kind::ShardCollection if em.on(RuleId::I004) => shard_key(body, em),
        Kind::Other if view.name() == "reshardCollection" && em.on(RuleId::I004) => {
            shard_key(body, em)
        }
        _ => Ok(()),
    }
}

fn bad(command: &'static str, field: &'static str) -> CommandError {
    CommandError::BadField { command, field }
}

fn get<'a>(doc: &'a RawDocument, key: &str) -> Result<Option<RawBsonRef<'a>>, CommandError> {
    doc.get_fast(key).map_err(|_| CommandError::Malformed)
}

/// Refuses a spec that repeats a key: the guard reads the first `background`, a server may
/// read the last (the command layer does the same for statements).
fn unique_keys(doc: &RawDocument) -> Result<&RawDocument, CommandError> {
    check_duplicate_keys(doc).map_err(|e| match e {
        WireError::DuplicateKey(_) => CommandError::DuplicateKey,
        _ => CommandError::Malformed,
    })?;
    Ok(doc)
}

fn create_indexes<'a>(
    view: &CommandView<'a>,
    body: &'a RawDocument,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    let old_upstream = em
        .ctx
        .upstream_wire_version
        .is_some_and(|v| v < NON_BLOCKING_BUILDS);
    if let Some(existing) = em.ctx.index_count.filter(|_| em.on(RuleId::I002)) {
        let mut specs = 0usize;
        let _ = view.each_entry(body, "indexes", "createIndexes", &mut |_, _| {
            specs += 1;
            ControlFlow::Continue(())
        })?;
        let total = existing + specs;
        if total > TOO_MANY_INDEXES {
            em.emit_capped(
                RuleId::I002,
                super::Action::Block,
                None,
                Some("this createIndexes would leave more than 20 indexes on the namespace; every index slows every write"),
            );
        } else if total > MANY_INDEXES {
            em.emit_capped(
                RuleId::I002,
                super::Action::Warn,
                None,
                Some("this createIndexes would leave more than 10 indexes on the namespace; every index slows every write"),
            );
        }
    }
    let foreground = em.on(RuleId::I001) && old_upstream;
    let ttl = em.on(RuleId::I003);
    if !foreground && !ttl {
        return Ok(());
    }
    let mut err = None;
    let mut each = |index: usize, spec: &'a RawDocument| {
        match index_spec(spec, foreground, ttl) {
            Ok((blocking, ttl_compound)) => {
                if blocking {
                    em.emit(RuleId::I001, Some(index), None);
                }
                if ttl_compound {
                    em.emit(RuleId::I003, Some(index), None);
                }
            }
            Err(e) => {
                err = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    };
    let _ = view.each_entry(body, "indexes", "createIndexes", &mut each)?;
    err.map_or(Ok(()), Err)
}

/// (built in the foreground, TTL on a compound key) for one index spec.
fn index_spec(
    spec: &RawDocument,
    foreground: bool,
    ttl: bool,
) -> Result<(bool, bool), CommandError> {
    let spec = unique_keys(spec)?;
    let blocking = foreground
        && match get(spec, "background")? {
            None => true,
            Some(v) => !truthy(v).ok_or(bad("createIndexes", "background"))?,
        };
    let ttl_compound = ttl
        && get(spec, "expireAfterSeconds")?.is_some()
        && match get(spec, "key")? {
            Some(RawBsonRef::Document(key)) => is_compound(key)?,
            _ => return Err(bad("createIndexes", "key")),
        };
    Ok((blocking, ttl_compound))
}

/// More than one field.
fn is_compound(key: &RawDocument) -> Result<bool, CommandError> {
    let mut fields = 0usize;
    for elem in key.iter_elements() {
        elem.map_err(|_| CommandError::Malformed)?;
        fields += 1;
        if fields > 1 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `collMod: c, index: {keyPattern: {...}, expireAfterSeconds: n}`.
fn coll_mod<'a>(body: &'a RawDocument, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    let index = match get(body, "index")? {
        None => return Ok(()),
        Some(RawBsonRef::Document(index)) => unique_keys(index)?,
        Some(_) => return Err(bad("collMod", "index")),
    };
    if get(index, "expireAfterSeconds")?.is_none() {
        return Ok(());
    }
    if let Some(RawBsonRef::Document(key)) = get(index, "keyPattern")? {
        if is_compound(key)? {
            em.emit(RuleId::I003, None, None);
        }
    }
    Ok(())
}

/// `shardCollection: "db.c", key: {_id: 1}`.
fn shard_key<'a>(body: &'a RawDocument, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    let key = match get(body, "key")? {
        Some(RawBsonRef::Document(key)) => key,
        _ => return Err(bad("shardCollection", "key")),
    };
    let Some(first) = key.iter_elements().next() else {
        return Ok(());
    };
    let first = first.map_err(|_| CommandError::Malformed)?;
    let value = first.value().map_err(|_| CommandError::Malformed)?;
    if first.key().as_str() == "_id" && number(value).is_some() {
        em.emit(RuleId::I004, None, None);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{rawdoc, RawDocumentBuf};

    /// `{key: {a: 1}, background: true, background: false}`: rawdoc! cannot repeat a key.
    fn repeated_background() -> RawDocumentBuf {
        let mut body = vec![0x03];
        body.extend_from_slice(b"key\0");
        body.extend_from_slice(rawdoc! {"a": 1}.as_bytes());
        for v in [1u8, 0] {
            body.push(0x08);
            body.extend_from_slice(b"background\0");
            body.push(v);
        }
        let mut doc = ((body.len() + 5) as i32).to_le_bytes().to_vec();
        doc.extend_from_slice(&body);
        doc.push(0);
        RawDocumentBuf::from_bytes(doc).unwrap()
    }

    #[test]
    fn a_repeated_background_is_refused() {
        let spec = repeated_background();
        assert_eq!(
            index_spec(&spec, true, true).unwrap_err(),
            CommandError::DuplicateKey
        );
    }

    #[test]
    fn specs() {
        let spec = rawdoc! {"key": {"a": 1, "b": 1}, "expireAfterSeconds": 5};
        assert_eq!(index_spec(&spec, true, true).unwrap(), (true, true));
        assert_eq!(index_spec(&spec, false, false).unwrap(), (false, false));
        let spec = rawdoc! {"key": {"a": 1}, "expireAfterSeconds": 5, "background": 1i64};
        assert_eq!(index_spec(&spec, true, true).unwrap(), (false, false));
        let spec = rawdoc! {"expireAfterSeconds": 5};
        assert!(index_spec(&spec, false, true).is_err());
    }
}
