//! The namespaces a command writes (what W005 checks), as opposed to `$db`: `bulkWrite` runs
//! on admin but writes its `nsInfo` namespaces; renameCollection writes both sides; user and
//! role management writes `admin.system.users` / `admin.system.roles` whatever `$db` it is
//! sent to; applyOps writes what each of its operations names, nested applyOps included.

use std::ops::ControlFlow;

use bson::{RawBsonRef, RawDocument};

use super::{
    error::CommandError,
    kind::Kind,
    value::unique_keys,
    value::{get, get_array, get_doc, get_str},
    view::{CommandView, Namespace},
};

/// What a namespace callback returns.
type Flow = Result<ControlFlow<()>, CommandError>;

impl<'a> CommandView<'a> {
    /// Calls `f` for each namespace the command writes or changes. Reads (and explain) call
    /// nothing.
    pub fn for_each_written_namespace(
        &self,
        mut f: impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    ) -> Flow {
        if self.explain {
            return Ok(ControlFlow::Continue(()));
        }
        let ns = self.namespace();
        let Some(body) = self.body() else {
            // Legacy writes: their namespace.
            return Ok(if self.kind.is_write() {
                f(ns)
            } else {
                ControlFlow::Continue(())
            });
        };
        match self.kind {
            Kind::Insert
            | Kind::Update
            | Kind::Delete
            | Kind::FindAndModify
            | Kind::Create
            | Kind::CreateIndexes
            | Kind::DropIndexes
            | Kind::Drop
            | Kind::CollMod
            | Kind::ConvertToCapped
            | Kind::ShardCollection
            | Kind::DropDatabase => Ok(f(ns)),
            Kind::CloneCollectionAsCapped => self.clone_target(body, &mut f),
            Kind::RenameCollection => {
                if f(ns).is_break() {
                    return Ok(ControlFlow::Break(()));
                }
                let to =
                    get_str(body, "to", "renameCollection")?.ok_or(CommandError::BadField {
                        command: "renameCollection",
                        field: "to",
                    })?;
                Ok(f(Namespace::parse_full(to)))
            }
            Kind::Aggregate => self.aggregate_outputs(&mut f),
            Kind::MapReduce => self.map_reduce_target(body, &mut f),
            Kind::BulkWrite => self.bulk_write_namespaces(body, &mut f),
            Kind::ApplyOps => apply_ops_namespaces(body, &mut f, 0),
            Kind::Sensitive | Kind::Other => Ok(match auth_collection(self.name) {
                Some(coll) => f(Namespace {
                    db: "admin",
                    coll: Some(coll),
                }),
                None => ControlFlow::Continue(()),
            }),
            _ => Ok(ControlFlow::Continue(())),
        }
    }

    /// Calls `f` for each other collection a pipeline reads: `$lookup` and `$graphLookup`
    /// `from`, `$unionWith` (its name, or its `coll`), at any depth (nested pipelines,
    /// `$facet`), in the command's database; a `from` naming a database (`{db, coll}`) is
    /// that namespace. Only pipelines have these (an aggregate, a view's definition); a
    /// `from` that is neither a string nor a document is mongod's to refuse and is skipped.
    pub fn for_each_read_namespace(
        &self,
        mut f: impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    ) -> Flow {
        let db = self.namespace().db;
        self.for_each_stage(|stage| {
            let Some(Ok(elem)) = stage.iter_elements().next() else {
                return ControlFlow::Continue(());
            };
            let from = match (elem.key().as_str(), elem.value()) {
                ("$lookup" | "$graphLookup", Ok(RawBsonRef::Document(spec))) => {
                    get(spec, "from").ok().flatten()
                }
                ("$unionWith", Ok(RawBsonRef::Document(spec))) => get(spec, "coll").ok().flatten(),
                ("$unionWith", Ok(name @ RawBsonRef::String(_))) => Some(name),
                _ => None,
            };
            match from {
                Some(RawBsonRef::String(coll)) => f(Namespace {
                    db,
                    coll: Some(coll),
                }),
                Some(RawBsonRef::Document(d)) => match (get(d, "db"), get(d, "coll")) {
                    (Ok(Some(RawBsonRef::String(db))), Ok(Some(RawBsonRef::String(coll)))) => {
                        f(Namespace {
                            db,
                            coll: Some(coll),
                        })
                    }
                    _ => ControlFlow::Continue(()),
                },
                _ => ControlFlow::Continue(()),
            }
        })
    }

    /// cloneCollectionAsCapped writes `toCollection` in the same database.
    fn clone_target(
        &self,
        body: &'a RawDocument,
        f: &mut impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    ) -> Flow {
        match get_str(body, "toCollection", "cloneCollectionAsCapped")? {
            Some(to) => Ok(f(Namespace {
                db: self.db,
                coll: Some(to),
            })),
            None => Err(CommandError::BadField {
                command: "cloneCollectionAsCapped",
                field: "toCollection",
            }),
        }
    }

    /// mapReduce writes `out`: a collection of this database, or the target its document
    /// names (none for inline results).
    fn map_reduce_target(
        &self,
        body: &'a RawDocument,
        f: &mut impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    ) -> Flow {
        match get(body, "out")? {
            Some(RawBsonRef::String(coll)) => Ok(f(Namespace {
                db: self.db,
                coll: Some(coll),
            })),
            Some(RawBsonRef::Document(out)) => {
                map_reduce_output(self.db, out).map(|t| t.map_or(ControlFlow::Continue(()), f))
            }
            _ => Err(CommandError::BadField {
                command: "mapReduce",
                field: "out",
            }),
        }
    }

    /// The `$out` / `$merge` targets of an aggregate's stages.
    fn aggregate_outputs(&self, f: &mut impl FnMut(Namespace<'a>) -> ControlFlow<()>) -> Flow {
        let db = self.db;
        let mut err = None;
        let flow = self.for_each_stage(|stage| match stage_output(db, stage) {
            Ok(Some(target)) => f(target),
            Ok(None) => ControlFlow::Continue(()),
            Err(e) => {
                err = Some(e);
                ControlFlow::Break(())
            }
        })?;
        err.map_or(Ok(flow), Err)
    }

    /// The `nsInfo` namespaces of a bulkWrite (it runs on admin).
    fn bulk_write_namespaces(
        &self,
        body: &'a RawDocument,
        f: &mut impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    ) -> Flow {
        let mut err = None;
        let flow = self.each_entry(
            body,
            "nsInfo",
            "bulkWrite",
            &mut |_, entry| match unique_keys(entry).and_then(|e| get_str(e, "ns", "bulkWrite")) {
                Ok(Some(full)) => f(Namespace::parse_full(full)),
                Ok(None) => {
                    err = Some(CommandError::BadField {
                        command: "bulkWrite",
                        field: "ns",
                    });
                    ControlFlow::Break(())
                }
                Err(e) => {
                    err = Some(e);
                    ControlFlow::Break(())
                }
            },
        )?;
        err.map_or(Ok(flow), Err)
    }
}

/// The collection of `admin` that a user or role management command writes
/// (src/mongo/db/commands/user_management_commands.idl; `_mergeAuthzCollections` is the
/// internal command that restores both).
pub(crate) fn auth_collection(name: &str) -> Option<&'static str> {
    match name {
        "createUser"
        | "updateUser"
        | "dropUser"
        | "dropAllUsersFromDatabase"
        | "grantRolesToUser"
        | "revokeRolesFromUser"
        | "_mergeAuthzCollections" => Some("system.users"),
        "createRole"
        | "updateRole"
        | "dropRole"
        | "dropAllRolesFromDatabase"
        | "grantPrivilegesToRole"
        | "revokePrivilegesFromRole"
        | "grantRolesToRole"
        | "revokeRolesFromRole" => Some("system.roles"),
        _ => None,
    }
}

/// How deep applyOps inside applyOps is followed before the command is refused.
const MAX_APPLY_OPS_DEPTH: usize = 8;

/// Every namespace each operation of an applyOps touches: its `ns`, and for a command
/// operation (`db.$cmd`) the command's own targets: the collection its first value names
/// (create, drop, collMod, createIndexes, ...), both sides of a renameCollection (full
/// namespaces), the whole database of a dropDatabase, and the operations of a nested applyOps
/// to [`MAX_APPLY_OPS_DEPTH`]. An operation mongoguard cannot read is an error.
fn apply_ops_namespaces<'a>(
    body: &'a RawDocument,
    f: &mut impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    depth: usize,
) -> Flow {
    let bad = |field| CommandError::BadField {
        command: "applyOps",
        field,
    };
    if depth > MAX_APPLY_OPS_DEPTH {
        return Err(CommandError::TooDeep);
    }
    let ops = get_array(body, "applyOps", "applyOps")?.ok_or(bad("applyOps"))?;
    for op in ops {
        let RawBsonRef::Document(op) = op.map_err(|_| CommandError::Malformed)? else {
            return Err(bad("applyOps"));
        };
        let op = unique_keys(op)?;
        let target = Namespace::parse_full(get_str(op, "ns", "applyOps")?.ok_or(bad("ns"))?);
        let flow = if target.coll == Some("$cmd") {
            let o = get_doc(op, "o", "applyOps")?.ok_or(bad("o"))?;
            command_op_namespaces(target.db, unique_keys(o)?, f, depth)?
        } else {
            f(target)
        };
        if flow.is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// The namespaces of one command operation `o` of an applyOps on database `db`.
fn command_op_namespaces<'a>(
    db: &'a str,
    o: &'a RawDocument,
    f: &mut impl FnMut(Namespace<'a>) -> ControlFlow<()>,
    depth: usize,
) -> Flow {
    let bad = |field| CommandError::BadField {
        command: "applyOps",
        field,
    };
    let first = o
        .iter_elements()
        .next()
        .ok_or(bad("o"))?
        .map_err(|_| CommandError::Malformed)?;
    let value = first.value().map_err(|_| CommandError::Malformed)?;
    match (first.key().as_str(), value) {
        ("applyOps", _) => apply_ops_namespaces(o, f, depth + 1),
        ("renameCollection", RawBsonRef::String(from)) => {
            if f(Namespace::parse_full(from)).is_break() {
                return Ok(ControlFlow::Break(()));
            }
            let to = get_str(o, "to", "applyOps")?.ok_or(bad("to"))?;
            Ok(f(Namespace::parse_full(to)))
        }
        ("dropDatabase", _) => Ok(f(Namespace { db, coll: None })),
        (_, RawBsonRef::String(coll)) => Ok(f(Namespace {
            db,
            coll: Some(coll),
        })),
        // A command op whose first value names no collection: the whole database is its target.
        _ => Ok(f(Namespace { db, coll: None })),
    }
}

/// `$out` / `$merge` targets of one stage.
fn stage_output<'a>(
    db: &'a str,
    stage: &'a RawDocument,
) -> Result<Option<Namespace<'a>>, CommandError> {
    let Some(first) = stage.iter_elements().next() else {
        return Ok(None);
    };
    let first = first.map_err(|_| CommandError::Malformed)?;
    let value = first.value().map_err(|_| CommandError::Malformed)?;
    let bad = |field| CommandError::BadField {
        command: "aggregate",
        field,
    };
    match (first.key().as_str(), value) {
        ("$out", RawBsonRef::String(coll)) => Ok(Some(Namespace {
            db,
            coll: Some(coll),
        })),
        ("$out", RawBsonRef::Document(spec)) => db_coll(db, unique_keys(spec)?, "$out").map(Some),
        ("$out", _) => Err(bad("$out")),
        ("$merge", RawBsonRef::String(coll)) => Ok(Some(Namespace {
            db,
            coll: Some(coll),
        })),
        ("$merge", RawBsonRef::Document(spec)) => match get(unique_keys(spec)?, "into")? {
            Some(RawBsonRef::String(coll)) => Ok(Some(Namespace {
                db,
                coll: Some(coll),
            })),
            Some(RawBsonRef::Document(into)) => db_coll(db, unique_keys(into)?, "$merge").map(Some),
            _ => Err(bad("$merge")),
        },
        ("$merge", _) => Err(bad("$merge")),
        _ => Ok(None),
    }
}

/// `{db, coll}` with `db` defaulting to the command's.
fn db_coll<'a>(
    db: &'a str,
    spec: &'a RawDocument,
    field: &'static str,
) -> Result<Namespace<'a>, CommandError> {
    let coll = get_str(spec, "coll", "aggregate")?.ok_or(CommandError::BadField {
        command: "aggregate",
        field,
    })?;
    let db = get_str(spec, "db", "aggregate")?.unwrap_or(db);
    Ok(Namespace {
        db,
        coll: Some(coll),
    })
}

/// mapReduce `out: {normal|replace|merge|reduce: coll, db?: d}` or `{inline: 1}`. mongod 4.2 /
/// 4.4 look for `normal`, `replace`, `merge`, `reduce` and only then `inline`, whatever the
/// order of the keys (src/mongo/db/commands/mr_common.cpp `parseOutputOptions`), so
/// `{inline: 1, merge: "x"}` writes `x` there; 5.0+ refuses `normal` and `inline` with another
/// field (map_reduce_out_options.cpp). The written namespace is read in 4.4's order.
fn map_reduce_output<'a>(
    db: &'a str,
    out: &'a RawDocument,
) -> Result<Option<Namespace<'a>>, CommandError> {
    let out = unique_keys(out)?;
    for action in ["normal", "replace", "merge", "reduce"] {
        if let Some(RawBsonRef::String(coll)) = get(out, action)? {
            let db = get_str(out, "db", "mapReduce")?.unwrap_or(db);
            return Ok(Some(Namespace {
                db,
                coll: Some(coll),
            }));
        }
    }
    if get(out, "inline")?.is_some() {
        return Ok(None);
    }
    Err(CommandError::BadField {
        command: "mapReduce",
        field: "out",
    })
}
