//! The bounded set of command labels: known command names, the legacy opcodes, and "other".

/// Every value the `command` label can take. Index = position in this list.
pub const COMMANDS: &[&str] = &[
    "find",
    "insert",
    "update",
    "delete",
    "aggregate",
    "getMore",
    "killCursors",
    "count",
    "distinct",
    "findAndModify",
    "hello",
    "isMaster",
    "ping",
    "saslStart",
    "saslContinue",
    "endSessions",
    "commitTransaction",
    "abortTransaction",
    "createIndexes",
    "dropIndexes",
    "listCollections",
    "listIndexes",
    "listDatabases",
    "drop",
    "dropDatabase",
    "create",
    "buildInfo",
    "explain",
    "bulkWrite",
    "getLastError",
    "op_query",
    "op_insert",
    "op_update",
    "op_delete",
    "op_get_more",
    "op_kill_cursors",
    "other",
];

/// Index of "other" in [`COMMANDS`].
pub const OTHER: usize = COMMANDS.len() - 1;

/// The label index of a command name as sent (aliases folded: `ismaster` is `isMaster`,
/// `findandmodify` is `findAndModify`); unknown names are "other". No allocation.
pub fn index_of(name: &str) -> usize {
    let folded = match name {
        "ismaster" => "isMaster",
        "findandmodify" => "findAndModify",
        "getlasterror" => "getLastError",
        "deleteIndexes" => "dropIndexes",
        other => other,
    };
    COMMANDS.iter().position(|c| *c == folded).unwrap_or(OTHER)
}

/// The label index of a legacy opcode message (not an OP_QUERY command).
pub fn legacy(op: crate::wire::OpCode) -> usize {
    use crate::wire::OpCode;
    let name = match op {
        OpCode::Query => "op_query",
        OpCode::Insert => "op_insert",
        OpCode::Update => "op_update",
        OpCode::Delete => "op_delete",
        OpCode::GetMore => "op_get_more",
        OpCode::KillCursors => "op_kill_cursors",
        _ => "other",
    };
    index_of(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fold_and_unknown_is_other() {
        assert_eq!(COMMANDS[index_of("find")], "find");
        assert_eq!(COMMANDS[index_of("ismaster")], "isMaster");
        assert_eq!(COMMANDS[index_of("findandmodify")], "findAndModify");
        assert_eq!(COMMANDS[index_of("serverStatus")], "other");
        assert_eq!(COMMANDS[index_of("op_query")], "op_query");
        assert_eq!(COMMANDS[legacy(crate::wire::OpCode::Insert)], "op_insert");
    }
}
