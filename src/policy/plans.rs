//! Q006 collection-scan, Q007 in-memory-sort and Q008 query-without-shard-key: what the
//! upstream makes of a query. Q006 and Q007: what the upstream's winning plan for the
//! request's query shape does, as the plan guard found it with `explain` (off the request
//! path; see `crate::plan`). Without a verdict yet — the shape is new, or the plan guard is
//! off — neither fires: the first request of a shape is never delayed, and a shape is blocked
//! only once its verdict is known.
//!
//! Q008: on a collection whose shard key is known (discovered from mongos's
//! `config.collections`, or declared in `[plan] shard_keys`), a read or write whose filter
//! does not pin the shard key's first field with equality or `$in` (mongos then asks every
//! shard). Each statement of a write is judged; an aggregation by its first `$match`.

use crate::wire::GetFast;
use bson::{RawBsonRef, RawDocument};

use super::{
    evaluate::{each_filter, Emitter},
    RuleId,
};
use crate::command::{CommandError, CommandView, Kind};

pub(super) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    shard_key(view, em)?;
    let Some(plan) = em.ctx.plan else {
        return Ok(());
    };
    if !(plan.collscan || plan.in_memory_sort) || em.all_off(&[RuleId::Q006, RuleId::Q007]) {
        return Ok(());
    }
    // The record shows the shape's (first) filter.
    let mut first = None;
    each_filter(view, |_, f| {
        first.get_or_insert(f);
        Ok(())
    })?;
    if plan.collscan {
        em.emit_detail(
            RuleId::Q006,
            None,
            first,
            Some("the upstream's winning plan for this query shape is a COLLSCAN: it reads every document of the collection"),
        );
    }
    if plan.in_memory_sort {
        em.emit_detail(
            RuleId::Q007,
            None,
            first,
            Some("the upstream's winning plan for this query shape has a SORT stage: no index gives the order, so the server sorts in memory"),
        );
    }
    Ok(())
}

/// Q008.
fn shard_key<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    let Some(field) = em.ctx.shard_key.and_then(|k| k.first()) else {
        return Ok(());
    };
    if !em.on(RuleId::Q008) || view.is_explain() {
        return Ok(());
    }
    match view.kind() {
        Kind::Find
        | Kind::Count
        | Kind::Distinct
        | Kind::Update
        | Kind::Delete
        | Kind::FindAndModify => {
            let field = field.as_str();
            let mut missing: Vec<(Option<usize>, &'a RawDocument)> = Vec::new();
            each_filter(view, |index, filter| {
                if !targets(filter, field, 0) {
                    missing.push((index, filter));
                }
                Ok(())
            })?;
            for (index, filter) in missing {
                em.emit(RuleId::Q008, index, Some(filter));
            }
        }
        Kind::Aggregate => {
            let mut first = None;
            each_filter(view, |_, f| {
                first.get_or_insert(f);
                Ok(())
            })?;
            // No $match at all reads every shard too.
            if !first.is_some_and(|f| targets(f, field, 0)) {
                em.emit(RuleId::Q008, None, first);
            }
        }
        _ => {}
    }
    Ok(())
}

/// `filter` pins `field` with equality or `$in` (at the top level, or in a branch of a
/// top-level `$and`).
fn targets(filter: &RawDocument, field: &str, depth: usize) -> bool {
    if depth > 4 {
        return false;
    }
    match filter.get_fast(field) {
        Ok(Some(RawBsonRef::Document(d))) => {
            let operators = crate::wire::first_key(d).is_some_and(|k| k.starts_with('$'));
            if !operators {
                return true;
            }
            matches!(d.get_fast("$eq"), Ok(Some(_)))
                || matches!(d.get_fast("$in"), Ok(Some(RawBsonRef::Array(_))))
        }
        Ok(Some(RawBsonRef::RegularExpression(_))) => false,
        Ok(Some(_)) => true,
        _ => match filter.get_fast("$and") {
            Ok(Some(RawBsonRef::Array(branches))) => branches
                .into_iter()
                .flatten()
                .any(|b| matches!(b, RawBsonRef::Document(d) if targets(d, field, depth + 1))),
            _ => false,
        },
    }
}
