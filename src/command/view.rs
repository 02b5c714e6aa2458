//! The view itself.

use bson::{RawArray, RawBsonRef, RawDocument};

use super::{error::CommandError, kind::Kind, value};
use crate::wire::{DocumentSequence, Index, Message, OpMsg, OpQuery};

/// A database and, for collection-level commands, a collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namespace<'a> {
    /// Database name.
    pub db: &'a str,
    /// Collection name; `None` for database-level targets (dropDatabase, `aggregate: 1`).
    pub coll: Option<&'a str>,
}

impl<'a> Namespace<'a> {
    /// Splits `db.collection` (the first dot separates them).
    pub fn parse_full(full: &'a str) -> Namespace<'a> {
        match full.split_once('.') {
            Some((db, coll)) => Namespace {
                db,
                coll: Some(coll),
            },
            None => Namespace {
                db: full,
                coll: None,
            },
        }
    }
}

/// Where the command came from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// An OP_MSG or OP_QUERY command document, indexed once for the lookups every rule
    /// family makes (and, for OP_MSG, its sequences).
    Command {
        index: Index<'a>,
        msg: Option<OpMsg<'a>>,
    },
    /// A legacy OP_QUERY on a collection (not `$cmd`): a find, and its projection (the
    /// message's returnFieldsSelector).
    LegacyQuery {
        filter: &'a RawDocument,
        projection: Option<&'a RawDocument>,
    },
    /// Legacy OP_INSERT.
    LegacyInsert(crate::wire::OpInsert<'a>),
    /// Legacy OP_UPDATE.
    LegacyUpdate(crate::wire::OpUpdate<'a>),
    /// Legacy OP_DELETE.
    LegacyDelete(crate::wire::OpDelete<'a>),
    /// OP_GET_MORE / OP_KILL_CURSORS: no filter, no statements.
    LegacyCursor,
}

/// A write's array of statements, as the bson crate gives it or as the document its bytes
/// are (elements named "0", "1"...: the same values, in the same order, with the same errors).
#[derive(Clone, Copy)]
pub(crate) enum Statements<'a> {
    Array(&'a RawArray),
    Elements(&'a RawDocument),
}

impl<'a> Statements<'a> {
    /// The values, in order; an `Err` for an element that cannot be read.
    pub(crate) fn values(self) -> StatementValues<'a> {
        match self {
            Statements::Array(a) => StatementValues::Array(a.into_iter()),
            Statements::Elements(d) => StatementValues::Elements(d.iter_elements()),
        }
    }
}

/// [`Statements::values`].
pub(crate) enum StatementValues<'a> {
    Array(bson::raw::RawArrayIter<'a>),
    Elements(bson::raw::RawIter<'a>),
}

impl<'a> Iterator for StatementValues<'a> {
    type Item = Result<RawBsonRef<'a>, ()>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            StatementValues::Array(i) => i.next().map(|r| r.map_err(|_| ())),
            // What `RawArrayIter` does with the same walk.
            StatementValues::Elements(i) => {
                i.next().map(|r| r.and_then(|e| e.value()).map_err(|_| ()))
            }
        }
    }
}

/// A borrowed model of one command.
#[derive(Clone, Copy)]
pub struct CommandView<'a> {
    pub(crate) kind: Kind,
    pub(crate) name: &'a str,
    pub(crate) db: &'a str,
    /// The collection: named by a legacy opcode's namespace, or the command's first value
    /// when it is a non-empty string (read once, when the view is built).
    coll: Option<&'a str>,
    pub(crate) source: Source<'a>,
    pub(crate) more_to_come: bool,
    pub(crate) explain: bool,
    /// The command's own filter (find `filter`; count, distinct, mapReduce `query`), looked
    /// up once when the view is built: the shape capture and the query rules both read it.
    /// `None`: not looked up (other commands) or unreadable (then it is looked up again
    /// where it is read, and the error given there).
    pub(crate) own_filter: Option<Option<&'a RawDocument>>,
    /// The body's array of statements (insert `documents`, update `updates`, delete
    /// `deletes`), looked up once when the view is built: the write and document rules both
    /// walk the statements. `None` as for `own_filter`.
    pub(crate) own_statements: Option<Option<Statements<'a>>>,
}

impl<'a> CommandView<'a> {
    /// Builds the view of a parsed (already decompressed) message. Replies and OP_COMPRESSED
    /// are not commands.
    pub fn from_message(msg: &Message<'a>) -> Result<CommandView<'a>, CommandError> {
        match *msg {
            Message::Msg(m) => Self::op_msg(m),
            Message::Query(q) if q.is_command() => Self::command(q.database(), q.command()),
            Message::Query(q) => Self::legacy_query(q),
            Message::Insert(i) => Ok(Self::legacy(
                Kind::Insert,
                "insert",
                i.full_collection_name,
                Source::LegacyInsert(i),
            )),
            Message::Update(u) => Ok(Self::legacy(
                Kind::Update,
                "update",
                u.full_collection_name,
                Source::LegacyUpdate(u),
            )),
            Message::Delete(d) => Ok(Self::legacy(
                Kind::Delete,
                "delete",
                d.full_collection_name,
                Source::LegacyDelete(d),
            )),
            Message::GetMore(g) => Ok(Self::legacy(
                Kind::GetMore,
                "getMore",
                g.full_collection_name,
                Source::LegacyCursor,
            )),
            Message::KillCursors(_) => Ok(Self::legacy(
                Kind::KillCursors,
                "killCursors",
                "",
                Source::LegacyCursor,
            )),
            Message::Reply(_) | Message::Compressed(_) => {
                Err(CommandError::BadReference("not a command message"))
            }
        }
    }

    /// [`CommandView::from_message`] with the OP_MSG body's index already built (a session
    /// builds it once for routing and judging); an index of another document is ignored.
    pub(crate) fn from_message_indexed(
        msg: &Message<'a>,
        body: Option<Index<'a>>,
    ) -> Result<CommandView<'a>, CommandError> {
        match (*msg, body) {
            (Message::Msg(m), Some(index)) if std::ptr::eq(index.doc(), m.body()) => {
                Self::op_msg_indexed(m, index)
            }
            _ => Self::from_message(msg),
        }
    }

    /// An OP_MSG command: its body names the database (`$db`).
    fn op_msg(m: OpMsg<'a>) -> Result<CommandView<'a>, CommandError> {
        Self::op_msg_indexed(m, Index::new(m.body()))
    }

    fn op_msg_indexed(m: OpMsg<'a>, index: Index<'a>) -> Result<CommandView<'a>, CommandError> {
        let db = match value::get(&index, "$db")? {
            Some(RawBsonRef::String(db)) => db,
            _ => return Err(CommandError::MissingDb),
        };
        let mut view = Self::indexed(db, index)?;
        view.source = Source::Command {
            index,
            msg: Some(m),
        };
        view.more_to_come = m.flags().more_to_come();
        Ok(view)
    }

    /// A legacy OP_QUERY on a collection: a find whose filter is the one mongod runs. mongod
    /// reads a `query` field first, then `$query`, each where it sits in the query, and takes
    /// the first that is a document or an array; with neither, the whole query is the filter
    /// (`initFindCommand`, src/mongo/db/query/query_request_helper.cpp; `QueryRequest::init`
    /// before 5.0: `queryObj["query"]`, then `queryObj["$query"]`, `isABSONObj()`). A wrapper
    /// that is an array (mongod reads it as the document of its elements, keyed "0", "1"...)
    /// and a `$query` of another type are refused.
    fn legacy_query(q: OpQuery<'a>) -> Result<CommandView<'a>, CommandError> {
        // Not a query: before 4.2, mongod runs an OP_QUERY on `<db>.$cmd.sys.inprog`,
        // `.killop` and `.unlock` as currentOp, killOp and fsyncUnlock with the query's fields
        // as arguments (`assembleResponse` -> `receivedPseudoCommand`,
        // src/mongo/db/assemble_response.cpp). Never judged as a find.
        if q.collection().starts_with("$cmd.") {
            return Err(CommandError::BadReference(
                "a legacy pseudo-command ($cmd.sys.*): send the command itself",
            ));
        }
        let bad = |field| CommandError::BadField {
            command: "find",
            field,
        };
        let filter = match value::get(q.query, "query")? {
            Some(RawBsonRef::Document(d)) => d,
            Some(RawBsonRef::Array(_)) => return Err(bad("query")),
            // Not a wrapper: a filter on a field named `query`, unless `$query` is one.
            Some(_) | None => match value::get(q.query, "$query")? {
                Some(RawBsonRef::Document(d)) => d,
                Some(_) => return Err(bad("$query")),
                None => q.query,
            },
        };
        Ok(Self::legacy(
            Kind::Find,
            "find",
            q.full_collection_name,
            Source::LegacyQuery {
                filter,
                projection: q.return_fields_selector,
            },
        ))
    }

    /// A view of a bare command document run against `db` (the offline checker, explain).
    pub fn command(db: &'a str, body: &'a RawDocument) -> Result<CommandView<'a>, CommandError> {
        Self::indexed(db, Index::new(body))
    }

    fn indexed(db: &'a str, index: Index<'a>) -> Result<CommandView<'a>, CommandError> {
        let name = index.first_key().ok_or(CommandError::Malformed)?;
        let coll = match index.get(name) {
            Ok(Some(RawBsonRef::String(s))) if !s.is_empty() => Some(s),
            _ => None,
        };
        let kind = Kind::from_name(name);
        let own_filter = match kind.own_filter_field() {
            Some(field) => value::get_opt_doc(&index, field, "command").ok(),
            None => None,
        };
        let own_statements = match kind.statements_field() {
            // The body's index finds the array's bytes; the bson crate builds a `&RawArray`
            // only by walking the body from its start.
            Some((field, command)) => match index.array_document(field) {
                Some(found) => Some(found.map(Statements::Elements)),
                None => value::get_array(&index, field, command)
                    .ok()
                    .map(|a| a.map(Statements::Array)),
            },
            None => None,
        };
        Ok(CommandView {
            kind,
            name,
            db,
            coll,
            source: Source::Command { index, msg: None },
            more_to_come: false,
            explain: false,
            own_filter,
            own_statements,
        })
    }

    fn legacy(
        kind: Kind,
        name: &'static str,
        full: &'a str,
        source: Source<'a>,
    ) -> CommandView<'a> {
        let ns = Namespace::parse_full(full);
        // Legacy writes are fire-and-forget: unacknowledged unless followed by getLastError.
        let more_to_come = matches!(kind, Kind::Insert | Kind::Update | Kind::Delete);
        CommandView {
            kind,
            name,
            db: ns.db,
            coll: ns.coll,
            source,
            more_to_come,
            explain: false,
            own_filter: None,
            own_statements: None,
        }
    }

    /// The normalised command.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The command name as sent (first key), or the legacy opcode's equivalent.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The name for records: canonical for known commands, as sent otherwise.
    pub fn display_name(&self) -> &'a str {
        self.kind.canonical().unwrap_or(self.name)
    }

    /// The database the command runs against (`$db`).
    pub fn db(&self) -> &'a str {
        self.db
    }

    /// The command document, when there is one (not for legacy opcodes).
    pub fn body(&self) -> Option<&'a RawDocument> {
        match self.source {
            Source::Command { index, .. } => Some(index.doc()),
            _ => None,
        }
    }

    /// The projection of a legacy OP_QUERY on a collection (its returnFieldsSelector): mongod
    /// reads it as a find's `projection` (aggregation expressions included, 4.4+).
    pub fn legacy_projection(&self) -> Option<&'a RawDocument> {
        match self.source {
            Source::LegacyQuery { projection, .. } => projection,
            _ => None,
        }
    }

    /// The command document's fields, looked up through its index (not for legacy opcodes).
    pub(crate) fn fields(&self) -> Option<&Index<'a>> {
        match &self.source {
            Source::Command { index, .. } => Some(index),
            _ => None,
        }
    }

    /// True when no reply is expected (moreToCome, legacy writes): an unacknowledged write.
    pub fn more_to_come(&self) -> bool {
        self.more_to_come
    }

    /// True when this view is the command inside an `explain`: a read of that command's plan.
    pub fn is_explain(&self) -> bool {
        self.explain
    }

    /// True when the command changes data or schema (false for explain).
    pub fn is_write(&self) -> bool {
        !self.explain && self.kind.is_write()
    }

    /// `writeConcern`, if given.
    pub fn write_concern(&self) -> Result<Option<&'a RawDocument>, CommandError> {
        match self.fields() {
            // null is absent (mongod: no write concern given, the default applies).
            Some(body) => value::get_opt_doc(body, "writeConcern", "command")?
                .map(value::unique_keys)
                .transpose(),
            None => Ok(None),
        }
    }

    /// The command's `let` variables, if given.
    pub fn let_vars(&self) -> Result<Option<&'a RawDocument>, CommandError> {
        match self.fields() {
            Some(body) => value::get_opt_doc(body, "let", "command"),
            None => Ok(None),
        }
    }

    /// The command inside `explain`, as a view flagged [`CommandView::is_explain`].
    pub fn explained(&self) -> Result<Option<CommandView<'a>>, CommandError> {
        if self.kind != Kind::Explain {
            return Ok(None);
        }
        let Some(body) = self.fields() else {
            return Ok(None);
        };
        let inner = value::get_doc(body, "explain", "explain")?.ok_or(CommandError::BadField {
            command: "explain",
            field: "explain",
        })?;
        crate::wire::check_duplicate_keys(inner).map_err(|_| CommandError::Malformed)?;
        let mut view = Self::command(self.db, inner)?;
        view.explain = true;
        Ok(Some(view))
    }

    /// The namespace the command is about: `db` plus the collection named by the command
    /// (its first value), or the legacy opcode's namespace.
    pub fn namespace(&self) -> Namespace<'a> {
        // Legacy opcodes are never the kinds below: their collection is the namespace's.
        match (self.kind, self.coll) {
            // These name a full "db.coll" namespace and run on admin.
            (Kind::RenameCollection | Kind::ShardCollection, Some(full)) => {
                Namespace::parse_full(full)
            }
            (Kind::DropDatabase, _) => Namespace {
                db: self.db,
                coll: None,
            },
            (_, coll) => Namespace { db: self.db, coll },
        }
    }

    /// A kind-1 sequence of the OP_MSG, if the command came with one.
    pub(crate) fn sequence(&self, identifier: &str) -> Option<DocumentSequence<'a>> {
        match self.source {
            Source::Command { msg: Some(m), .. } => m.sequence(identifier),
            _ => None,
        }
    }
}

crate::wire::debug_fields!(
    CommandView<'a>,
    "CommandView",
    kind,
    db,
    more_to_come,
    explain
);
