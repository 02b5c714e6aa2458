//! Aggregation pipelines (recursively through `$lookup`, `$facet`, `$unionWith`) and every
//! filter a command carries.

use std::ops::ControlFlow;

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{
    error::CommandError,
    kind::Kind,
    statements::Statement,
    value::{get, get_doc, get_opt_doc},
    view::{CommandView, Source},
};

/// How deep `$lookup` / `$facet` / `$unionWith` nesting is followed before the command is
/// refused as unreadable (mongod's own limit on nesting is far lower in practice).
pub const MAX_PIPELINE_DEPTH: usize = 20;

type StageSink<'s, 'a> = &'s mut dyn FnMut(&'a RawDocument) -> ControlFlow<()>;

/// Calls `f` for every stage of `pipeline` and of the pipelines nested in it.
pub fn walk_pipeline<'a>(
    pipeline: &'a RawArray,
    f: &mut dyn FnMut(&'a RawDocument) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, CommandError> {
    walk(pipeline, f, 0)
}

fn walk<'a>(
    pipeline: &'a RawArray,
    f: StageSink<'_, 'a>,
    depth: usize,
) -> Result<ControlFlow<()>, CommandError> {
    if depth > MAX_PIPELINE_DEPTH {
        return Err(CommandError::TooDeep);
    }
    for stage in pipeline {
        let RawBsonRef::Document(stage) = stage.map_err(|_| CommandError::Malformed)? else {
            return Err(CommandError::BadField {
                command: "aggregate",
                field: "pipeline",
            });
        };
        if f(stage).is_break() {
            return Ok(ControlFlow::Break(()));
        }
        for elem in stage.iter_elements() {
            let elem = elem.map_err(|_| CommandError::Malformed)?;
            let nested = match (
                elem.key().as_str(),
                elem.value().map_err(|_| CommandError::Malformed)?,
            ) {
                ("$lookup" | "$unionWith", RawBsonRef::Document(spec)) => {
                    match get(spec, "pipeline")? {
                        Some(RawBsonRef::Array(p)) => walk(p, f, depth + 1)?,
                        _ => ControlFlow::Continue(()),
                    }
                }
                ("$facet", RawBsonRef::Document(facets)) => {
                    let mut flow = ControlFlow::Continue(());
                    for facet in facets.iter_elements() {
                        let facet = facet.map_err(|_| CommandError::Malformed)?;
                        if let Ok(RawBsonRef::Array(p)) = facet.value() {
                            flow = walk(p, f, depth + 1)?;
                            if flow.is_break() {
                                break;
                            }
                        }
                    }
                    flow
                }
                _ => ControlFlow::Continue(()),
            };
            if nested.is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// The filter a pipeline stage applies, if it is a filtering stage: `$match`, `$geoNear.query`,
/// `$graphLookup.restrictSearchWithMatch`.
pub fn stage_filter(stage: &RawDocument) -> Option<&RawDocument> {
    let elem = stage.iter_elements().next()?.ok()?;
    match (elem.key().as_str(), elem.value().ok()?) {
        ("$match", RawBsonRef::Document(d)) => Some(d),
        ("$geoNear", RawBsonRef::Document(spec)) => {
            get_doc(spec, "query", "aggregate").ok().flatten()
        }
        ("$graphLookup", RawBsonRef::Document(spec)) => {
            get_doc(spec, "restrictSearchWithMatch", "aggregate")
                .ok()
                .flatten()
        }
        _ => None,
    }
}

impl<'a> CommandView<'a> {
    /// The top-level `pipeline` of an aggregate (also inside explain), or of a view's
    /// definition (`create` / `collMod` with `viewOn`): mongod runs a view's pipeline on every
    /// read of the view, and refuses only `$out` and `$merge` in it.
    pub fn pipeline(&self) -> Result<Option<&'a RawArray>, CommandError> {
        match (self.kind, self.fields()) {
            (Kind::Aggregate, Some(body)) => super::value::get_array(body, "pipeline", "aggregate"),
            (Kind::Create, Some(body)) => super::value::get_array(body, "pipeline", "create"),
            (Kind::CollMod, Some(body)) => super::value::get_array(body, "pipeline", "collMod"),
            _ => Ok(None),
        }
    }

    /// Every stage of the aggregate pipeline, nested ones included.
    pub fn for_each_stage(
        &self,
        mut f: impl FnMut(&'a RawDocument) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, CommandError> {
        match self.pipeline()? {
            Some(p) => walk_pipeline(p, &mut f),
            None => Ok(ControlFlow::Continue(())),
        }
    }

    /// Every filter the command applies, with the statement index for write statements:
    /// find / count / distinct / mapReduce / geoNear / group filters, legacy query
    /// selectors, update and delete `q`s (body, sequence, bulkWrite, legacy), findAndModify
    /// `query`, and each filtering pipeline stage at any depth. For an `explain` view, the
    /// explained command's filters.
    pub fn for_each_filter(
        &self,
        mut f: impl FnMut(Option<usize>, &'a RawDocument) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, CommandError> {
        if let Source::LegacyQuery { filter, .. } = self.source {
            return Ok(f(None, filter));
        }
        if let Some(body) = self.fields() {
            if let Some(field) = self.kind.own_filter_field() {
                // An optional field: null is absent (find_command.idl `filter`, count and
                // distinct `query`), and absent is no filter at all. Usually read when the
                // view was built.
                let filter = match self.own_filter {
                    Some(filter) => filter,
                    None => get_opt_doc(body, field, "command")?,
                };
                if let Some(filter) = filter {
                    if f(None, filter).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
            }
            // group (servers before 4.2) filters with the first of `cond`, `condition`,
            // `query` and `q` of its spec that is a document (src/mongo/db/commands/
            // group_cmd.cpp, `GroupCommand::parseRequest`).
            if self.kind == Kind::Other && self.name() == "group" {
                if let Some(RawBsonRef::Document(spec)) = get(body, "group")? {
                    for field in ["cond", "condition", "query", "q"] {
                        if let Some(RawBsonRef::Document(filter)) = get(spec, field)? {
                            if f(None, filter).is_break() {
                                return Ok(ControlFlow::Break(()));
                            }
                            break;
                        }
                    }
                }
            }
            // geoNear (servers before 4.2) appends its `query` to the $near query it runs
            // when that is a document or an array, and ignores another type
            // (src/mongo/db/commands/geo_near_cmd.cpp). An array (read as the document of its
            // elements) is refused.
            if self.kind == Kind::Other && self.name() == "geoNear" {
                let filter = match get(body, "query")? {
                    Some(RawBsonRef::Document(filter)) => Some(filter),
                    Some(RawBsonRef::Array(_)) => {
                        return Err(CommandError::BadField {
                            command: "geoNear",
                            field: "query",
                        })
                    }
                    _ => None,
                };
                if filter.is_some_and(|filter| f(None, filter).is_break()) {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
        if self
            .for_each_stage(|stage| match stage_filter(stage) {
                Some(filter) => f(None, filter),
                None => ControlFlow::Continue(()),
            })?
            .is_break()
        {
            return Ok(ControlFlow::Break(()));
        }
        // Write statements' filters; an explained write is read here too (its plan is a read).
        let mut view = *self;
        view.explain = false;
        view.for_each_statement(|s| match s.statement {
            Statement::Update { filter, .. } | Statement::Delete { filter, .. } => {
                f(Some(s.index), filter)
            }
            Statement::Insert { .. } => ControlFlow::Continue(()),
        })
    }
}
