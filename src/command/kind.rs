//! Command names, normalised.

/// What a command is, with aliases folded (`findandmodify`, `isMaster`/`ismaster`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Kind {
    Hello,
    Find,
    Insert,
    Update,
    Delete,
    FindAndModify,
    Aggregate,
    Count,
    Distinct,
    GetMore,
    KillCursors,
    Create,
    CreateIndexes,
    DropIndexes,
    Drop,
    DropDatabase,
    CollMod,
    RenameCollection,
    ConvertToCapped,
    CloneCollectionAsCapped,
    MapReduce,
    ApplyOps,
    BulkWrite,
    Explain,
    ShardCollection,
    CommitTransaction,
    AbortTransaction,
    GetLastError,
    /// saslStart, saslContinue, authenticate, getnonce, createUser, updateUser,
    /// copydbsaslstart: never logged with their payloads.
    Sensitive,
    /// Anything else (ping, listCollections, serverStatus, ...).
    Other,
}

impl Kind {
    /// Classifies a command name as mongod does (case-sensitive, with its aliases).
    pub fn from_name(name: &str) -> Kind {
        match name {
            "hello" | "isMaster" | "ismaster" => Kind::Hello,
            "find" => Kind::Find,
            "insert" => Kind::Insert,
            "update" => Kind::Update,
            "delete" => Kind::Delete,
            "findAndModify" | "findandmodify" => Kind::FindAndModify,
            "aggregate" => Kind::Aggregate,
            "count" => Kind::Count,
            "distinct" => Kind::Distinct,
            "getMore" => Kind::GetMore,
            "killCursors" => Kind::KillCursors,
            "create" => Kind::Create,
            "createIndexes" => Kind::CreateIndexes,
            "dropIndexes" | "deleteIndexes" => Kind::DropIndexes,
            "drop" => Kind::Drop,
            "dropDatabase" => Kind::DropDatabase,
            "collMod" => Kind::CollMod,
            "renameCollection" => Kind::RenameCollection,
            "convertToCapped" => Kind::ConvertToCapped,
            "cloneCollectionAsCapped" => Kind::CloneCollectionAsCapped,
            "mapReduce" | "mapreduce" => Kind::MapReduce,
            "applyOps" => Kind::ApplyOps,
            "bulkWrite" => Kind::BulkWrite,
            "explain" => Kind::Explain,
            "shardCollection" | "shardcollection" => Kind::ShardCollection,
            "commitTransaction" => Kind::CommitTransaction,
            "abortTransaction" => Kind::AbortTransaction,
            "getLastError" | "getlasterror" => Kind::GetLastError,
            "saslStart" | "saslContinue" | "authenticate" | "getnonce" | "createUser"
            | "updateUser" | "copydbsaslstart" | "copydbgetnonce" => Kind::Sensitive,
            _ => Kind::Other,
        }
    }

    /// The canonical name, for logs and records (`Other` has none: use the name as sent).
    pub fn canonical(self) -> Option<&'static str> {
        Some(match self {
            Kind::Hello => "hello",
            Kind::Find => "find",
            Kind::Insert => "insert",
            Kind::Update => "update",
            Kind::Delete => "delete",
            Kind::FindAndModify => "findAndModify",
            Kind::Aggregate => "aggregate",
            Kind::Count => "count",
            Kind::Distinct => "distinct",
            Kind::GetMore => "getMore",
            Kind::KillCursors => "killCursors",
            Kind::Create => "create",
            Kind::CreateIndexes => "createIndexes",
            Kind::DropIndexes => "dropIndexes",
            Kind::Drop => "drop",
            Kind::DropDatabase => "dropDatabase",
            Kind::CollMod => "collMod",
            Kind::RenameCollection => "renameCollection",
            Kind::ConvertToCapped => "convertToCapped",
            Kind::CloneCollectionAsCapped => "cloneCollectionAsCapped",
            Kind::MapReduce => "mapReduce",
            Kind::ApplyOps => "applyOps",
            Kind::BulkWrite => "bulkWrite",
            Kind::Explain => "explain",
            Kind::ShardCollection => "shardCollection",
            Kind::CommitTransaction => "commitTransaction",
            Kind::AbortTransaction => "abortTransaction",
            Kind::GetLastError => "getLastError",
            Kind::Sensitive | Kind::Other => return None,
        })
    }

    /// The field of a command body holding the command's own filter: find `filter`; count,
    /// distinct and mapReduce `query`.
    pub(crate) fn own_filter_field(self) -> Option<&'static str> {
        match self {
            Kind::Find => Some("filter"),
            Kind::Count | Kind::Distinct | Kind::MapReduce => Some("query"),
            _ => None,
        }
    }

    /// The array of statements of a write command and the command's name: insert
    /// `documents`, update `updates`, delete `deletes`.
    pub(crate) fn statements_field(self) -> Option<(&'static str, &'static str)> {
        match self {
            Kind::Insert => Some(("documents", "insert")),
            Kind::Update => Some(("updates", "update")),
            Kind::Delete => Some(("deletes", "delete")),
            _ => None,
        }
    }

    /// Commands that change data or schema (explain of them is not).
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Kind::Insert
                | Kind::Update
                | Kind::Delete
                | Kind::FindAndModify
                | Kind::Create
                | Kind::CreateIndexes
                | Kind::DropIndexes
                | Kind::Drop
                | Kind::DropDatabase
                | Kind::CollMod
                | Kind::RenameCollection
                | Kind::ConvertToCapped
                | Kind::CloneCollectionAsCapped
                | Kind::MapReduce
                | Kind::ApplyOps
                | Kind::BulkWrite
                | Kind::ShardCollection
        )
    }
}
