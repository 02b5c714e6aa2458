//! Q001–Q005: what queries ask the server to do.
//!
//! Two passes, both borrowed and allocation-free:
//!
//! - **Filters.** Every filter [`CommandView::for_each_filter`] yields (find, count, distinct,
//!   mapReduce, geoNear, group and legacy query filters, update / delete / findAndModify /
//!   bulkWrite statement filters, and `$match` / `$geoNear.query` /
//!   `$graphLookup.restrictSearchWithMatch` at any pipeline depth) is walked once with
//!   [`walk_filter`], `$expr` included. All five rules are decided there, with the statement
//!   index and the filter for the record. The statements of a write are read once, for
//!   their filters and (Q002) their update pipelines together.
//! - **Server-side JavaScript elsewhere** (Q002 only): every stage of the aggregate pipeline
//!   and of a view's definition (`create` / `collMod`; nested `$lookup` / `$facet` /
//!   `$unionWith` pipelines, `$group` and `$project` expressions), update pipelines of update /
//!   findAndModify / bulkWrite statements, a find `projection` (and a legacy OP_QUERY's
//!   returnFieldsSelector), a findAndModify `fields`, a command's `let`; and the mapReduce
//!   and group commands themselves. Negations, regexes and lists in non-filter expressions
//!   (a `$project` computing `$ne`) select nothing, so Q001 / Q003 / Q004 / Q005 do not look
//!   there.
//!
//! Edge decisions:
//! - Q001 fires on `$ne`, `$not` (whatever it wraps), and `$nin` with at least one value,
//!   also as `$ne` / `$not` in `$expr`; `$nor` is not listed by the standard and does not
//!   count. `$nin: []` lists nothing to exclude (it matches every document, which W001–W003
//!   judge), so it is not a negation either.
//! - Q003 fires on a pattern [`regex_is_anchored_with`] does not prove anchored; a
//!   run-time pattern (`$regexMatch` on a field) is never proven anchored. Whether `i`
//!   makes a regex unanchored follows `Params::regex_case_insensitive`.
//! - Q005 counts list values and `$or` branches strictly above the limits.
//! - A walk that reports nesting beyond what the walker follows, or an element it cannot
//!   read, is an error: the engine refuses the command (G001).

use crate::wire::GetFast;
use std::ops::ControlFlow;

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{
    evaluate::{each_filter, Emitter},
    filter::{regex_is_anchored_with, walk_expression, walk_filter, walk_pipeline, Event, Visitor},
    RuleId,
};
use crate::command::{CommandError, CommandView, Kind, Statement, UpdateMods};

const RULES: &[RuleId] = &[
    RuleId::Q001,
    RuleId::Q002,
    RuleId::Q003,
    RuleId::Q004,
    RuleId::Q005,
];

/// The thresholds a filter is judged by, copied out of the emitter for the walk.
#[derive(Clone, Copy)]
struct Limits {
    max_in: usize,
    max_or: usize,
    case_insensitive_unanchors: bool,
}

/// Which rules one filter breaks.
#[derive(Default)]
struct Found {
    negation: bool,
    javascript: bool,
    unanchored: bool,
    exists_false: bool,
    large: bool,
}

impl Found {
    fn emit<'a>(&self, em: &mut Emitter<'_, 'a>, at: Option<usize>, f: &'a RawDocument) {
        let hits = [
            (self.negation, RuleId::Q001),
            (self.javascript, RuleId::Q002),
            (self.unanchored, RuleId::Q003),
            (self.exists_false, RuleId::Q004),
            (self.large, RuleId::Q005),
        ];
        for (hit, rule) in hits {
            if hit {
                em.emit(rule, at, Some(f));
            }
        }
    }
}

pub(crate) fn check<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    if em.all_off(RULES) {
        return Ok(());
    }
    let limits = Limits {
        max_in: em.params.max_in,
        max_or: em.params.max_or,
        case_insensitive_unanchors: em.params.regex_case_insensitive,
    };
    match view.kind() {
        // Inserts carry no filter.
        Kind::Insert => {}
        // Writes: their filters are their statements' (what `for_each_filter` yields for
        // them), so one pass over the statements judges filters and update pipelines.
        Kind::Update | Kind::Delete | Kind::FindAndModify | Kind::BulkWrite => {
            statements(view, em, limits)?
        }
        _ => each_filter(view, |at, filter| {
            let found = scan_filter(filter, limits)?;
            found.emit(em, at, filter);
            Ok(())
        })?,
    }
    if em.on(RuleId::Q002) {
        javascript(view, em)?;
    }
    Ok(())
}

/// Walks one filter and records what it breaks.
fn scan_filter(filter: &RawDocument, limits: Limits) -> Result<Found, CommandError> {
    let mut found = Found::default();
    let mut err = None;
    let _ = walk_filter(filter, &mut |event| {
        match event {
            Event::Negation { op, .. } => found.negation |= op == "$ne" || op == "$not",
            Event::InList { op, len, .. } => {
                found.negation |= op == "$nin" && len > 0;
                found.large |= len > limits.max_in;
            }
            Event::OrBranches { len } => found.large |= len > limits.max_or,
            Event::Where | Event::JsFunction { .. } => found.javascript = true,
            Event::Regex {
                pattern, options, ..
            } => {
                found.unanchored |=
                    !regex_is_anchored_with(pattern, options, limits.case_insensitive_unanchors)
            }
            Event::ExistsFalse { .. } => found.exists_false = true,
            Event::TooDeep | Event::Malformed => return stop(&mut err, event),
        }
        ControlFlow::Continue(())
    });
    err.map_or(Ok(found), Err)
}

/// Records the error a walker event stands for and stops the walk.
fn stop(err: &mut Option<CommandError>, event: Event<'_>) -> ControlFlow<()> {
    *err = Some(if event == Event::TooDeep {
        CommandError::TooDeep
    } else {
        CommandError::Malformed
    });
    ControlFlow::Break(())
}

/// A visitor that only looks for server-side JavaScript.
#[derive(Default)]
struct Js {
    hit: bool,
    err: Option<CommandError>,
}

impl<'a> Visitor<'a> for Js {
    fn visit(&mut self, event: Event<'a>) -> ControlFlow<()> {
        match event {
            Event::Where | Event::JsFunction { .. } => {
                self.hit = true;
                ControlFlow::Break(())
            }
            Event::TooDeep | Event::Malformed => stop(&mut self.err, event),
            _ => ControlFlow::Continue(()),
        }
    }
}

/// Runs `walk` with a [`Js`] visitor.
fn has_javascript(walk: impl FnOnce(&mut Js) -> ControlFlow<()>) -> Result<bool, CommandError> {
    let mut js = Js::default();
    let _ = walk(&mut js);
    js.err.map_or(Ok(js.hit), Err)
}

/// Q002 outside filters: see the module docs.
fn javascript<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    // mapReduce, and before 4.2 `group` (its `$reduce` is a JavaScript function:
    // src/mongo/db/commands/group_cmd.cpp): JavaScript whatever they hold.
    if view.kind() == Kind::MapReduce || (view.kind() == Kind::Other && view.name() == "group") {
        em.emit(RuleId::Q002, None, None);
        return Ok(());
    }
    // A legacy OP_QUERY's projection travels beside its query, not in a body.
    if let Some(projection) = view.legacy_projection() {
        if mentions_javascript(projection.as_bytes())
            && projection_has_javascript(RawBsonRef::Document(projection))?
        {
            em.emit(RuleId::Q002, None, None);
        }
        return Ok(());
    }
    let projection = match view.kind() {
        Kind::Find => "projection",
        Kind::FindAndModify => "fields",
        // No projection: only `let` (and an aggregate's or a view's pipeline) is looked at.
        Kind::Aggregate
        | Kind::Update
        | Kind::Delete
        | Kind::BulkWrite
        | Kind::Create
        | Kind::CollMod => "let",
        _ => return Ok(()),
    };
    let Some(body) = view.body() else {
        return Ok(());
    };
    if !mentions_javascript(body.as_bytes()) {
        return Ok(());
    }
    if let Some(pipeline) = view.pipeline()? {
        if has_javascript(|v| walk_pipeline(pipeline, v))? {
            em.emit(RuleId::Q002, None, None);
        }
    }
    // One scan of the body for both fields (the body's keys are unique: checked at parse).
    for elem in body.iter_elements() {
        let elem = elem.map_err(|_| CommandError::Malformed)?;
        let key = elem.key().as_str();
        if key != projection && key != "let" {
            continue;
        }
        let value = elem.value().map_err(|_| CommandError::Malformed)?;
        let hit = if key == "let" {
            has_javascript(|v| walk_expression(value, v))?
        } else {
            projection_has_javascript(value)?
        };
        if hit {
            em.emit(RuleId::Q002, None, None);
        }
    }
    Ok(())
}

/// Whether `$where`, `$function` or `$accumulator` appears as a BSON key (or, harmlessly, as
/// the end of a string) anywhere in `bson`. Operators are keys, and keys are stored as
/// NUL-terminated bytes at any depth, so when none appears no walk can find one: the common
/// case skips the walks. (Those walks also report malformed expressions; outside filters
/// nothing else is judged, so skipping them hides no rule.)
fn mentions_javascript(bson: &[u8]) -> bool {
    let mut rest = bson;
    while let Some(at) = rest.iter().position(|&b| b == b'$') {
        rest = rest.get(at + 1..).unwrap_or_default();
        if rest.starts_with(b"where\0")
            || rest.starts_with(b"function\0")
            || rest.starts_with(b"accumulator\0")
        {
            return true;
        }
    }
    false
}

/// A find projection holds aggregation expressions (4.4+), except `$elemMatch`, whose
/// argument is a query filter.
fn projection_has_javascript(projection: RawBsonRef<'_>) -> Result<bool, CommandError> {
    let RawBsonRef::Document(projection) = projection else {
        return Ok(false);
    };
    for elem in projection.iter_elements() {
        let elem = elem.map_err(|_| CommandError::Malformed)?;
        let value = elem.value().map_err(|_| CommandError::Malformed)?;
        let hit = match value {
            RawBsonRef::Document(spec) => match spec.get_fast("$elemMatch") {
                Ok(Some(RawBsonRef::Document(filter))) => {
                    has_javascript(|v| walk_filter(filter, v))?
                }
                Ok(_) => has_javascript(|v| walk_expression(value, v))?,
                Err(_) => return Err(CommandError::Malformed),
            },
            other => has_javascript(|v| walk_expression(other, v))?,
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The statements of a write, in one pass: each filter as in [`scan_filter`], and (Q002)
/// pipeline-style updates (`u: [...]`). Also for an explained write: explain reads the
/// plan of the write, and the query rules judge what the write would run.
fn statements<'a>(
    view: &CommandView<'a>,
    em: &mut Emitter<'_, 'a>,
    limits: Limits,
) -> Result<(), CommandError> {
    let js = em.on(RuleId::Q002);
    // The write rules read every statement whole without error (so whether the write
    // writes documents is known): what is read again here is each filter and pipeline only.
    let read_whole = em.writes_documents.is_some();
    let mut statements = *view;
    statements.explain = false;
    let mut err = None;
    let mut judge = |index: usize, filter: &'a RawDocument, pipeline: Option<&'a RawArray>| {
        let pipeline = pipeline.filter(|p| js && mentions_javascript(p.as_bytes()));
        let judged = scan_filter(filter, limits).and_then(|mut found| {
            if let Some(p) = pipeline {
                found.javascript |= has_javascript(|v| walk_pipeline(p, v))?;
            }
            Ok(found)
        });
        match judged {
            Ok(found) => {
                found.emit(em, Some(index), filter);
                ControlFlow::Continue(())
            }
            Err(e) => {
                err = Some(e);
                ControlFlow::Break(())
            }
        }
    };
    let _ = if read_whole {
        statements.for_each_statement_filter(&mut judge)?
    } else {
        statements.for_each_statement(|s| match s.statement {
            Statement::Update { filter, update, .. } => match update {
                UpdateMods::Pipeline(p) => judge(s.index, filter, Some(p)),
                _ => judge(s.index, filter, None),
            },
            Statement::Delete { filter, .. } => judge(s.index, filter, None),
            Statement::Insert { .. } => ControlFlow::Continue(()),
        })?
    };
    err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    const LIMITS: Limits = Limits {
        max_in: 2,
        max_or: 2,
        case_insensitive_unanchors: true,
    };

    #[test]
    fn nin_needs_a_value_to_be_a_negation() {
        let f = rawdoc! {"a": {"$nin": []}};
        assert!(!scan_filter(&f, LIMITS).unwrap().negation);
        let f = rawdoc! {"a": {"$nin": [1]}};
        assert!(scan_filter(&f, LIMITS).unwrap().negation);
        let f = rawdoc! {"$nor": [{"a": 1}]};
        assert!(!scan_filter(&f, LIMITS).unwrap().negation);
    }

    #[test]
    fn limits_are_strict() {
        let f = rawdoc! {"a": {"$in": [1, 2]}, "$or": [{"a": 1}, {"b": 1}]};
        assert!(!scan_filter(&f, LIMITS).unwrap().large);
        let f = rawdoc! {"a": {"$in": [1, 2, 3]}};
        assert!(scan_filter(&f, LIMITS).unwrap().large);
        let f = rawdoc! {"$or": [{"a": 1}, {"b": 1}, {"c": 1}]};
        assert!(scan_filter(&f, LIMITS).unwrap().large);
    }

    #[test]
    fn malformed_and_too_deep_are_errors() {
        let f = rawdoc! {"a": {"$in": 5}};
        assert!(matches!(
            scan_filter(&f, LIMITS),
            Err(CommandError::Malformed)
        ));
        let mut deep = rawdoc! {"a": 1};
        for _ in 0..120 {
            deep = rawdoc! {"$and": [deep]};
        }
        assert!(matches!(
            scan_filter(&deep, LIMITS),
            Err(CommandError::TooDeep)
        ));
    }

    #[test]
    fn javascript_markers_are_keys() {
        let with = rawdoc! {"p": [{"$project": {"x": {"$function": {"body": "f"}}}}]};
        assert!(mentions_javascript(with.as_bytes()));
        assert!(mentions_javascript(rawdoc! {"$where": "1"}.as_bytes()));
        let without = rawdoc! {"$whereabouts": 1, "f": "$functional", "a": "$accumulators"};
        assert!(!mentions_javascript(without.as_bytes()));
        assert!(!mentions_javascript(b"$"));
        // A string ending in a marker is a harmless false positive (the walk decides).
        assert!(mentions_javascript(rawdoc! {"s": "$where"}.as_bytes()));
    }

    #[test]
    fn elem_match_projection_is_a_filter() {
        let p = rawdoc! {"tags": {"$elemMatch": {"k": {"$in": ["x"]}}}, "n": 1};
        let found = projection_has_javascript(RawBsonRef::Document(&p));
        assert!(!found.unwrap());
        let p = rawdoc! {"x": {"$function": {"body": "f", "args": [], "lang": "js"}}};
        assert!(projection_has_javascript(RawBsonRef::Document(&p)).unwrap());
    }
}
