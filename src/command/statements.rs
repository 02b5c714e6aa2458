//! The statements of a write: inserted documents, update and delete statements, whether they
//! arrive in the command body, in an OP_MSG kind-1 sequence, through `bulkWrite`'s `nsInfo`
//! indirection, as `findAndModify`, or as a legacy opcode.

use std::ops::ControlFlow;

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{
    error::CommandError,
    kind::Kind,
    value::{self, flag, get, get_doc, get_opt_doc, number},
    view::{CommandView, Namespace, Source, Statements},
};

/// What an update does to the documents it matches.
#[derive(Clone, Copy)]
pub enum UpdateMods<'a> {
    /// `$set`, `$inc`, ...: the first key starts with `$`.
    Operators(&'a RawDocument),
    /// A whole replacement document.
    Replacement(&'a RawDocument),
    /// An aggregation pipeline update.
    Pipeline(&'a RawArray),
}

impl<'a> UpdateMods<'a> {
    fn from_value(
        v: RawBsonRef<'a>,
        command: &'static str,
        field: &'static str,
    ) -> Result<Self, CommandError> {
        match v {
            RawBsonRef::Document(d) => {
                let first = crate::wire::first_key(d);
                Ok(if first.is_some_and(|k| k.starts_with('$')) {
                    UpdateMods::Operators(d)
                } else {
                    UpdateMods::Replacement(d)
                })
            }
            RawBsonRef::Array(a) => Ok(UpdateMods::Pipeline(a)),
            _ => Err(CommandError::BadField { command, field }),
        }
    }
}

/// One statement of a write.
#[derive(Clone, Copy)]
pub enum Statement<'a> {
    /// An inserted document.
    Insert {
        /// The document.
        doc: &'a RawDocument,
    },
    /// An update statement.
    Update {
        /// `q` / `filter` / `query`.
        filter: &'a RawDocument,
        /// `u` / `updateMods` / `update`.
        update: UpdateMods<'a>,
        /// `multi` (false for findAndModify and single updates).
        multi: bool,
        /// `upsert`.
        upsert: bool,
        /// The statement's `collation`.
        collation: Option<&'a RawDocument>,
        /// The statement's `hint` (an index name or key pattern).
        hint: Option<RawBsonRef<'a>>,
        /// The document an upsert inserts as it is: `c.new` (bulkWrite `constants.new`) of a
        /// statement with `upsertSupplied` (src/mongo/db/ops/parsed_update.cpp requires it
        /// to be a document; mongod's `$merge` sends these). `None` without the flag.
        supplied: Option<&'a RawDocument>,
    },
    /// A delete statement.
    Delete {
        /// `q` / `filter` / `query`.
        filter: &'a RawDocument,
        /// `limit: 0` (any numeric type), bulkWrite `multi`, legacy without single-remove.
        many: bool,
        /// The statement's `collation`.
        collation: Option<&'a RawDocument>,
        /// The statement's `hint` (an index name or key pattern).
        hint: Option<RawBsonRef<'a>>,
    },
}

impl<'a> Statement<'a> {
    /// The whole document it writes: an inserted document, a replacement, or the document
    /// an upsert supplies (what the document rules judge); `None` for other operator and
    /// pipeline updates and deletes.
    pub fn written_document(&self) -> Option<&'a RawDocument> {
        match *self {
            Statement::Insert { doc }
            | Statement::Update {
                update: UpdateMods::Replacement(doc),
                ..
            } => Some(doc),
            // Constants are refused on any update but a pipeline (mongod: 51198), so a
            // statement writes one whole document at most.
            Statement::Update { supplied, .. } => supplied,
            Statement::Delete { .. } => None,
        }
    }
}

/// A statement with its position and target.
#[derive(Clone, Copy)]
pub struct StatementRef<'a> {
    /// Index in the batch (what the blocked reply names).
    pub index: usize,
    /// The namespace it writes.
    pub ns: Namespace<'a>,
    /// The statement.
    pub statement: Statement<'a>,
    /// True when it comes from findAndModify.
    pub find_and_modify: bool,
}

/// `{}`: the filter of a findAndModify without `query`.
fn empty_doc() -> &'static RawDocument {
    static EMPTY: std::sync::LazyLock<bson::RawDocumentBuf> =
        std::sync::LazyLock::new(bson::RawDocumentBuf::new);
    &EMPTY
}

type Sink<'s, 'a> = &'s mut dyn FnMut(StatementRef<'a>) -> ControlFlow<()>;

impl<'a> CommandView<'a> {
    /// Calls `f` for each statement of a write, in batch order; stops when `f` breaks.
    /// Commands without statements call nothing. A statement mongoguard cannot read is an
    /// error (the caller fails closed).
    pub fn for_each_statement(
        &self,
        mut f: impl FnMut(StatementRef<'a>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, CommandError> {
        if self.explain {
            return Ok(ControlFlow::Continue(()));
        }
        let sink: Sink<'_, 'a> = &mut f;
        let ns = self.namespace();
        match self.source {
            Source::Command { index, .. } => self.command_statements(index.doc(), ns, sink),
            Source::LegacyInsert(_)
            | Source::LegacyUpdate(_)
            | Source::LegacyDelete(_)
            | Source::LegacyQuery { .. }
            | Source::LegacyCursor => self.legacy_statements(ns, sink),
        }
    }

    /// Each statement's filter and, for an update whose `u` is a pipeline, that pipeline, in
    /// batch order: what the query rules read of a write. An update or delete command's
    /// statements are read for `q` and `u` only (their keys still checked distinct), so this
    /// is for statements [`CommandView::for_each_statement`] already read whole without error:
    /// the checks of their other fields are not repeated. Every other write goes through
    /// [`CommandView::for_each_statement`].
    pub fn for_each_statement_filter(
        &self,
        mut f: impl FnMut(usize, &'a RawDocument, Option<&'a RawArray>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, CommandError> {
        type Read = for<'d> fn(&'d RawDocument) -> Result<StatementFilter<'d>, CommandError>;
        let light: Option<(_, _, _, Read)> = match (self.source, self.kind) {
            _ if self.explain => None,
            (Source::Command { index, .. }, Kind::Update) => {
                Some((index.doc(), "updates", "update", update_filter))
            }
            (Source::Command { index, .. }, Kind::Delete) => {
                Some((index.doc(), "deletes", "delete", delete_filter))
            }
            _ => None,
        };
        let Some((body, field, command, read)) = light else {
            return self.for_each_statement(|s| match s.statement {
                Statement::Update { filter, update, .. } => {
                    let pipeline = match update {
                        UpdateMods::Pipeline(p) => Some(p),
                        _ => None,
                    };
                    f(s.index, filter, pipeline)
                }
                Statement::Delete { filter, .. } => f(s.index, filter, None),
                Statement::Insert { .. } => ControlFlow::Continue(()),
            });
        };
        self.each_read(body, field, command, read, |index, (filter, pipeline)| {
            f(index, filter, pipeline)
        })
    }

    /// The statements of a command body (and its kind-1 sequences).
    fn command_statements(
        &self,
        body: &'a RawDocument,
        ns: Namespace<'a>,
        sink: Sink<'_, 'a>,
    ) -> Result<ControlFlow<()>, CommandError> {
        match self.kind {
            Kind::Insert => self.each_entry(body, "documents", "insert", &mut |index, doc| {
                sink(StatementRef {
                    index,
                    ns,
                    statement: Statement::Insert { doc },
                    find_and_modify: false,
                })
            }),
            Kind::Update => self.each_parsed(body, "updates", "update", update_statement, ns, sink),
            Kind::Delete => self.each_parsed(body, "deletes", "delete", delete_statement, ns, sink),
            Kind::FindAndModify => {
                let statement = find_and_modify_statement(body)?;
                Ok(sink(StatementRef {
                    index: 0,
                    ns,
                    statement,
                    find_and_modify: true,
                }))
            }
            Kind::BulkWrite => self.bulk_write(body, sink),
            _ => Ok(ControlFlow::Continue(())),
        }
    }

    /// The statements of a legacy opcode: each document of an OP_INSERT, the one update or
    /// delete of an OP_UPDATE or OP_DELETE. Legacy queries and cursor messages have none.
    fn legacy_statements(
        &self,
        ns: Namespace<'a>,
        sink: Sink<'_, 'a>,
    ) -> Result<ControlFlow<()>, CommandError> {
        let only = |statement| StatementRef {
            index: 0,
            ns,
            statement,
            find_and_modify: false,
        };
        match self.source {
            Source::LegacyInsert(i) => {
                for (index, doc) in i.documents().enumerate() {
                    if sink(StatementRef {
                        index,
                        ..only(Statement::Insert { doc })
                    })
                    .is_break()
                    {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Ok(ControlFlow::Continue(()))
            }
            Source::LegacyUpdate(u) => {
                let update =
                    UpdateMods::from_value(RawBsonRef::Document(u.update), "update", "update")?;
                Ok(sink(only(Statement::Update {
                    filter: u.selector,
                    update,
                    multi: u.is_multi(),
                    upsert: u.is_upsert(),
                    collation: None,
                    hint: None,
                    supplied: None,
                })))
            }
            Source::LegacyDelete(d) => Ok(sink(only(Statement::Delete {
                filter: d.selector,
                many: !d.is_single_remove(),
                collation: None,
                hint: None,
            }))),
            Source::LegacyQuery { .. } | Source::LegacyCursor | Source::Command { .. } => {
                Ok(ControlFlow::Continue(()))
            }
        }
    }

    /// `each_entry` with a parser per entry; a parse error stops the walk and is returned.
    fn each_parsed(
        &self,
        body: &'a RawDocument,
        field: &'static str,
        command: &'static str,
        parse: fn(&'a RawDocument) -> Result<Statement<'a>, CommandError>,
        ns: Namespace<'a>,
        sink: Sink<'_, 'a>,
    ) -> Result<ControlFlow<()>, CommandError> {
        self.each_read(body, field, command, parse, |index, statement| {
            sink(StatementRef {
                index,
                ns,
                statement,
                find_and_modify: false,
            })
        })
    }

    /// `each_entry` with `read` applied to each entry before `f`; a read error stops the walk
    /// and is returned.
    fn each_read<T>(
        &self,
        body: &'a RawDocument,
        field: &'static str,
        command: &'static str,
        read: impl Fn(&'a RawDocument) -> Result<T, CommandError>,
        mut f: impl FnMut(usize, T) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, CommandError> {
        let mut err = None;
        let flow = self.each_entry(
            body,
            field,
            command,
            &mut |index, entry| match read(entry) {
                Ok(t) => f(index, t),
                Err(e) => {
                    err = Some(e);
                    ControlFlow::Break(())
                }
            },
        )?;
        match err {
            Some(e) => Err(e),
            None => Ok(flow),
        }
    }

    /// `get_array(body, field)`, answered by the view when `body` is its own and `field` its
    /// statements (looked up when the view was built).
    fn statement_array(
        &self,
        body: &'a RawDocument,
        field: &'static str,
        command: &'static str,
    ) -> Result<Option<Statements<'a>>, CommandError> {
        if let (Some(cached), Some((own, _))) = (self.own_statements, self.kind.statements_field())
        {
            if own == field && self.body().is_some_and(|b| std::ptr::eq(b, body)) {
                return Ok(cached);
            }
        }
        // The view's own body is read through its index (one walk for every field).
        let array = match self.fields() {
            Some(fields) if std::ptr::eq(fields.doc(), body) => {
                value::get_array(fields, field, command)
            }
            _ => value::get_array(body, field, command),
        };
        array.map(|a| a.map(Statements::Array))
    }

    /// Each document of `field`, from the body array and then from the kind-1 sequence of
    /// the same name, numbered across both.
    pub(crate) fn each_entry(
        &self,
        body: &'a RawDocument,
        field: &'static str,
        command: &'static str,
        f: &mut dyn FnMut(usize, &'a RawDocument) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, CommandError> {
        let mut index = 0usize;
        if let Some(array) = self.statement_array(body, field, command)? {
            for item in array.values() {
                match item.map_err(|_| CommandError::Malformed)? {
                    RawBsonRef::Document(d) => {
                        if f(index, d).is_break() {
                            return Ok(ControlFlow::Break(()));
                        }
                    }
                    _ => return Err(CommandError::BadField { command, field }),
                }
                index += 1;
            }
        }
        if let Some(seq) = self.sequence(field) {
            for d in seq.documents() {
                if f(index, d).is_break() {
                    return Ok(ControlFlow::Break(()));
                }
                index += 1;
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    fn bulk_write(
        &self,
        body: &'a RawDocument,
        sink: Sink<'_, 'a>,
    ) -> Result<ControlFlow<()>, CommandError> {
        let mut err = None;
        let flow = self.each_entry(body, "ops", "bulkWrite", &mut |index, op| match self
            .bulk_op(body, op)
        {
            Ok((ns, statement)) => sink(StatementRef {
                index,
                ns,
                statement,
                find_and_modify: false,
            }),
            Err(e) => {
                err = Some(e);
                ControlFlow::Break(())
            }
        })?;
        match err {
            Some(e) => Err(e),
            None => Ok(flow),
        }
    }

    fn bulk_op(
        &self,
        body: &'a RawDocument,
        op: &'a RawDocument,
    ) -> Result<(Namespace<'a>, Statement<'a>), CommandError> {
        let op = value::unique_keys(op)?;
        let bad = |field| CommandError::BadField {
            command: "bulkWrite",
            field,
        };
        let first = op
            .iter_elements()
            .next()
            .ok_or(bad("ops"))?
            .map_err(|_| CommandError::Malformed)?;
        let key = first.key().as_str();
        let ns_index = first
            .value()
            .ok()
            .and_then(number)
            .filter(|n| n.fract() == 0.0 && *n >= 0.0)
            .ok_or(bad("ops"))? as usize;
        let ns = self.bulk_namespace(body, ns_index)?;
        let filter = || get_doc(op, "filter", "bulkWrite")?.ok_or(bad("filter"));
        let statement = match key {
            "insert" => Statement::Insert {
                doc: get_doc(op, "document", "bulkWrite")?.ok_or(bad("document"))?,
            },
            "update" => Statement::Update {
                filter: filter()?,
                update: UpdateMods::from_value(
                    get(op, "updateMods")?.ok_or(bad("updateMods"))?,
                    "bulkWrite",
                    "updateMods",
                )?,
                multi: flag(op, "multi", "bulkWrite")?,
                upsert: flag(op, "upsert", "bulkWrite")?,
                collation: get_opt_doc(op, "collation", "bulkWrite")?,
                hint: get(op, "hint")?,
                supplied: supplied(op, "constants", "bulkWrite")?,
            },
            "delete" => Statement::Delete {
                filter: filter()?,
                many: flag(op, "multi", "bulkWrite")?,
                collation: get_opt_doc(op, "collation", "bulkWrite")?,
                hint: get(op, "hint")?,
            },
            _ => return Err(bad("ops")),
        };
        Ok((ns, statement))
    }

    /// The namespace at `index` of `nsInfo` (body array or kind-1 sequence).
    pub(crate) fn bulk_namespace(
        &self,
        body: &'a RawDocument,
        index: usize,
    ) -> Result<Namespace<'a>, CommandError> {
        let mut found = None;
        let _ = self.each_entry(body, "nsInfo", "bulkWrite", &mut |i, entry| {
            if i == index {
                found = Some(entry);
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        let entry = value::unique_keys(found.ok_or(CommandError::BadReference(
            "bulkWrite op refers to a missing nsInfo entry",
        ))?)?;
        let full = value::get_str(entry, "ns", "bulkWrite")?.ok_or(CommandError::BadField {
            command: "bulkWrite",
            field: "ns",
        })?;
        Ok(Namespace::parse_full(full))
    }
}

/// The fields of an update statement [`update_statement`] reads.
const UPDATE_FIELDS: [&str; 8] = [
    "q",
    "u",
    "multi",
    "upsert",
    "collation",
    "hint",
    "c",
    "upsertSupplied",
];

/// The fields of a delete statement [`delete_statement`] reads.
const DELETE_FIELDS: [&str; 4] = ["q", "limit", "collation", "hint"];

/// An update statement's `q` and `u`, as [`update_statement`] reads them.
const UPDATE_FILTER_FIELDS: [&str; 2] = ["q", "u"];

/// A delete statement's `q`, as [`delete_statement`] reads it.
const DELETE_FILTER_FIELDS: [&str; 1] = ["q"];

/// What the query rules read of a statement: its filter and an update's pipeline.
type StatementFilter<'a> = (&'a RawDocument, Option<&'a RawArray>);

/// An update statement's `q` and, when `u` is an array, that pipeline, read as
/// [`update_statement`] reads them ([`CommandView::for_each_statement_filter`]).
fn update_filter(stmt: &RawDocument) -> Result<StatementFilter<'_>, CommandError> {
    let picked = value::Picked::new(stmt, &UPDATE_FILTER_FIELDS)?;
    let [q, u] = picked.fields();
    let filter = get_doc(q, "q", "update")?.ok_or(CommandError::BadField {
        command: "update",
        field: "q",
    })?;
    let pipeline = match get(u, "u")? {
        Some(RawBsonRef::Array(p)) => Some(p),
        _ => None,
    };
    Ok((filter, pipeline))
}

/// A delete statement's `q`, read as [`delete_statement`] reads it.
fn delete_filter(stmt: &RawDocument) -> Result<StatementFilter<'_>, CommandError> {
    let picked = value::Picked::new(stmt, &DELETE_FILTER_FIELDS)?;
    let [q] = picked.fields();
    let filter = get_doc(q, "q", "delete")?.ok_or(CommandError::BadField {
        command: "delete",
        field: "q",
    })?;
    Ok((filter, None))
}

fn update_statement(stmt: &RawDocument) -> Result<Statement<'_>, CommandError> {
    // Eight fields are read, in one walk that also checks the keys (a 1,000-statement
    // update is read once per rule family).
    let picked = value::Picked::new(stmt, &UPDATE_FIELDS)?;
    let [q, u, multi, upsert, collation, hint, c, upsert_supplied] = picked.fields();
    Ok(Statement::Update {
        filter: get_doc(q, "q", "update")?.ok_or(CommandError::BadField {
            command: "update",
            field: "q",
        })?,
        update: UpdateMods::from_value(
            get(u, "u")?.ok_or(CommandError::BadField {
                command: "update",
                field: "u",
            })?,
            "update",
            "u",
        )?,
        multi: flag(multi, "multi", "update")?,
        upsert: flag(upsert, "upsert", "update")?,
        collation: get_opt_doc(collation, "collation", "update")?,
        hint: get(hint, "hint")?,
        supplied: if flag(upsert_supplied, "upsertSupplied", "update")? {
            supplied_document(get_opt_doc(c, "c", "update")?)?
        } else {
            None
        },
    })
}

/// `constants.new` of a bulkWrite update op with `upsertSupplied`, or `None`.
fn supplied<'a>(
    op: &'a RawDocument,
    constants: &'static str,
    command: &'static str,
) -> Result<Option<&'a RawDocument>, CommandError> {
    if !flag(op, "upsertSupplied", command)? {
        return Ok(None);
    }
    supplied_document(get_opt_doc(op, constants, command)?)
}

/// The `new` document of a statement's constants (`c` / `constants`), read once its
/// `upsertSupplied` is true; a repeated key refused (mongod would insert one `new` or the
/// other); a missing or non-document `new` is mongod's to refuse (`None`).
fn supplied_document(
    constants: Option<&RawDocument>,
) -> Result<Option<&RawDocument>, CommandError> {
    let Some(constants) = constants else {
        return Ok(None);
    };
    get_opt_doc(value::unique_keys(constants)?, "new", "update")
}

fn delete_statement(stmt: &RawDocument) -> Result<Statement<'_>, CommandError> {
    let picked = value::Picked::new(stmt, &DELETE_FIELDS)?;
    let [q, limit, collation, hint] = picked.fields();
    let bad = |field| CommandError::BadField {
        command: "delete",
        field,
    };
    let filter = get_doc(q, "q", "delete")?.ok_or(bad("q"))?;
    let limit = get(limit, "limit")?.and_then(number).ok_or(bad("limit"))?;
    // mongod accepts 0 (all matching) and 1 (one); anything else is refused upstream, and
    // here it is an error too (never guess towards "one").
    let many = if limit == 0.0 {
        true
    } else if limit == 1.0 {
        false
    } else {
        return Err(bad("limit"));
    };
    Ok(Statement::Delete {
        filter,
        many,
        collation: get_opt_doc(collation, "collation", "delete")?,
        hint: get(hint, "hint")?,
    })
}

fn find_and_modify_statement(body: &RawDocument) -> Result<Statement<'_>, CommandError> {
    // `query` is optional and defaults to {} (find_and_modify.idl); null reads as absent.
    let filter = get_opt_doc(body, "query", "findAndModify")?.unwrap_or(empty_doc());
    if flag(body, "remove", "findAndModify")? {
        return Ok(Statement::Delete {
            filter,
            many: false,
            collation: get_opt_doc(body, "collation", "findAndModify")?,
            hint: get(body, "hint")?,
        });
    }
    let update = get(body, "update")?.ok_or(CommandError::BadField {
        command: "findAndModify",
        field: "update",
    })?;
    Ok(Statement::Update {
        filter,
        update: UpdateMods::from_value(update, "findAndModify", "update")?,
        multi: false,
        upsert: flag(body, "upsert", "findAndModify")?,
        collation: get_opt_doc(body, "collation", "findAndModify")?,
        hint: get(body, "hint")?,
        // mongod builds no supplied-document upsert from findAndModify.
        supplied: None,
    })
}

crate::wire::debug_fields!(StatementRef<'a>, "StatementRef", index, ns, find_and_modify);

// Variant names only: the documents may hold literals.
impl std::fmt::Debug for UpdateMods<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UpdateMods::Operators(_) => "Operators(..)",
            UpdateMods::Replacement(_) => "Replacement(..)",
            UpdateMods::Pipeline(_) => "Pipeline(..)",
        })
    }
}

impl std::fmt::Debug for Statement<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Statement::Insert { .. } => f.write_str("Insert { .. }"),
            Statement::Update {
                update,
                multi,
                upsert,
                ..
            } => f
                .debug_struct("Update")
                .field("update", update)
                .field("multi", multi)
                .field("upsert", upsert)
                .finish_non_exhaustive(),
            Statement::Delete { many, .. } => f
                .debug_struct("Delete")
                .field("many", many)
                .finish_non_exhaustive(),
        }
    }
}
