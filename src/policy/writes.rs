//! W001–W011: what writes do.

use std::ops::ControlFlow;

use bson::{RawBsonRef, RawDocument};

use super::{
    evaluate::Emitter,
    filter::{coverage, Coverage},
    RuleId,
};
use crate::command::{
    number, truthy, CommandError, CommandView, Kind, Namespace, Statement, UpdateMods,
};

const STATEMENT_RULES: &[RuleId] = &[
    RuleId::W001,
    RuleId::W002,
    RuleId::W003,
    RuleId::W004,
    RuleId::W010,
    RuleId::W011,
];

pub(crate) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if !em.all_off(STATEMENT_RULES) {
        let mut err = None;
        let _ = view.for_each_statement(|s| {
            if let Err(e) = statement(s.index, s.statement, s.find_and_modify, em) {
                err = Some(e);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })?;
        if let Some(e) = err {
            return Err(e);
        }
    }
    if em.on(RuleId::W005) {
        let mut hit = false;
        let _ = view.for_each_written_namespace(|ns| {
            hit = is_system_namespace(ns);
            if hit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if hit {
            em.emit(RuleId::W005, None, None);
        }
    }
    write_concern(view, em)?;
    if view.more_to_come() && view.is_write() {
        em.emit(RuleId::W007, None, None);
    }
    if !view.is_explain() {
        match view.kind() {
            Kind::DropDatabase => em.emit(RuleId::W008, None, None),
            Kind::RenameCollection => em.emit(RuleId::W009, None, None),
            _ => {}
        }
    }
    Ok(())
}

fn statement<'a>(
    index: usize,
    statement: Statement<'a>,
    find_and_modify: bool,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    let at = Some(index);
    match statement {
        Statement::Update {
            filter,
            update,
            multi,
            ..
        } => {
            if em.on(RuleId::W001) || em.on(RuleId::W002) {
                let all = coverage(filter) == Coverage::All;
                if all && multi {
                    em.emit(RuleId::W001, at, Some(filter));
                } else if all {
                    em.emit(RuleId::W002, at, Some(filter));
                }
            }
            match update {
                UpdateMods::Replacement(_) => em.emit(RuleId::W010, at, None),
                UpdateMods::Operators(ops) if em.on(RuleId::W011) && unbounded_push(ops)? => {
                    em.emit(RuleId::W011, at, None)
                }
                _ => {}
            }
        }
        Statement::Delete { filter, many } => {
            let all = coverage(filter) == Coverage::All;
            match (many, all) {
                (true, true) => em.emit(RuleId::W003, at, Some(filter)),
                (true, false) => em.emit(RuleId::W004, at, Some(filter)),
                // findAndModify {remove: true} on everything removes an arbitrary document.
                (false, true) if find_and_modify => em.emit(RuleId::W002, at, Some(filter)),
                (false, _) => {}
            }
        }
        Statement::Insert { .. } => {}
    }
    Ok(())
}

/// `$push: {field: v}` where `v` is not `{$each: [...], $slice: n}`.
fn unbounded_push(ops: &RawDocument) -> Result<bool, CommandError> {
    let push = match ops.get("$push") {
        Ok(Some(RawBsonRef::Document(d))) => d,
        Ok(_) => return Ok(false),
        Err(_) => return Err(CommandError::Malformed),
    };
    for field in push.iter_elements() {
        let field = field.map_err(|_| CommandError::Malformed)?;
        let bounded = match field.value().map_err(|_| CommandError::Malformed)? {
            RawBsonRef::Document(spec) => spec.get("$slice").ok().flatten().is_some(),
            _ => false,
        };
        if !bounded {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `admin`, `local`, `config`, or a `system.*` collection anywhere.
pub(crate) fn is_system_namespace(ns: Namespace<'_>) -> bool {
    matches!(ns.db, "admin" | "local" | "config")
        || ns.coll.is_some_and(|c| c.starts_with("system."))
}

/// W006 (`j` falsy) and W007 (`w: 0`) from `writeConcern`, and from getLastError's own
/// fields for legacy applications.
fn write_concern<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    let wc = if view.kind() == Kind::GetLastError {
        view.body()
    } else {
        view.write_concern()?
    };
    let Some(wc) = wc else { return Ok(()) };
    if let Ok(Some(j)) = wc.get("j") {
        if truthy(j) == Some(false) {
            em.emit(RuleId::W006, None, None);
        }
    }
    if let Ok(Some(w)) = wc.get("w") {
        if number(w) == Some(0.0) {
            em.emit(RuleId::W007, None, None);
        }
    }
    Ok(())
}
