//! Errors of the command layer. Any of them means "cannot tell what this command does", and
//! the policy turns that into a block (fail closed).

use thiserror::Error;

/// A command whose shape mongoguard cannot read with confidence.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// An OP_MSG body without `$db`.
    #[error("command has no $db")]
    MissingDb,
    /// A field has a type the command does not allow (mongod would reject it too).
    #[error("field {field:?} of {command} has an unexpected type")]
    BadField {
        /// The command.
        command: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A statement index or namespace reference points nowhere.
    #[error("{0}")]
    BadReference(&'static str),
    /// The BSON inside the command is malformed.
    #[error("malformed BSON in the command")]
    Malformed,
    /// A sub-document the guard reads (a statement, writeConcern, nsInfo entry, `$merge`
    /// target...) repeats a key: mongoguard and the server could read different values.
    #[error("a sub-document of the command repeats a key")]
    DuplicateKey,
    /// Commands nested deeper than mongoguard follows.
    #[error("command nesting too deep")]
    TooDeep,
}
