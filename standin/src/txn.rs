//! Logical sessions and transaction numbers, checked the way mongod checks them.
//!
//! There are still no transaction *semantics* (writes apply at once, abort undoes nothing),
//! but the state machine a driver and a proxy see is mongod's: what a `txnNumber`,
//! `autocommit` and `startTransaction` may be (src/mongo/db/initialize_operation_session_info.cpp),
//! which transaction a statement may start or continue, commit and abort of unknown,
//! committed or aborted transactions (`TransactionParticipant::beginOrContinue` and friends in
//! src/mongo/db/transaction/transaction_participant.cpp), and a step-down aborting every
//! transaction in progress on the member.

use std::collections::HashMap;

use bson::{Bson, Document};
use parking_lot::Mutex;

use crate::commands::CmdError;

/// Sessions known to one server (transactions live on the member that ran them), keyed as
/// mongod keys them: by `lsid.id` *and* the user (`makeLogicalSessionId` fills `uid` with the
/// digest of the authenticated user, src/mongo/db/session/logical_session_id_helpers.cpp),
/// so two users sending the same `lsid.id` have two sessions.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    inner: Mutex<HashMap<SessionKey, Session>>,
}

/// The user (`None`: unauthenticated) and the `lsid.id` bytes.
type SessionKey = (Option<String>, Vec<u8>);

/// Sessions kept at most (oldest-unused evicted first would need more bookkeeping: the table
/// is simply cleared when full; a test never gets near it).
const MAX_SESSIONS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The active txnNumber is a retryable write (no `autocommit`).
    Retryable,
    InProgress,
    Committed,
    Aborted,
}

#[derive(Debug)]
struct Session {
    txn_number: i64,
    state: State,
    /// The member's topologyVersion counter when the transaction started: a role change
    /// since (a step-down) has aborted it.
    counter: i64,
}

/// The session fields of a command.
#[derive(Debug, Default, Clone)]
pub(crate) struct SessionArgs {
    /// `lsid.id` bytes.
    pub(crate) lsid: Option<Vec<u8>>,
    pub(crate) txn_number: Option<i64>,
    pub(crate) autocommit: Option<bool>,
    pub(crate) start_transaction: Option<bool>,
}

impl SessionArgs {
    /// Inside a multi-document transaction (`autocommit: false`).
    pub(crate) fn in_transaction(&self) -> bool {
        self.autocommit == Some(false)
    }
}

fn invalid_options(msg: impl Into<String>) -> CmdError {
    CmdError::new(72, "InvalidOptions", msg)
}

/// Parses and validates the session fields (initialize_operation_session_info.cpp).
pub(crate) fn parse(cmd: &Document) -> Result<SessionArgs, CmdError> {
    let mut a = SessionArgs::default();
    match cmd.get("lsid") {
        None => {}
        Some(Bson::Document(l)) => match l.get("id") {
            Some(Bson::Binary(b)) if b.subtype == bson::spec::BinarySubtype::Uuid => {
                a.lsid = Some(b.bytes.clone())
            }
            _ => {
                return Err(CmdError::new(
                    40414,
                    "Location40414",
                    "BSON field 'OperationSessionInfo.lsid.id' is missing but a required field",
                ))
            }
        },
        Some(other) => {
            return Err(CmdError::type_mismatch(format!(
                "BSON field 'OperationSessionInfo.lsid' is the wrong type '{:?}', expected type 'object'",
                other.element_type()
            )))
        }
    }
    a.txn_number = match cmd.get("txnNumber") {
        None => None,
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        Some(other) => {
            return Err(CmdError::type_mismatch(format!(
                "BSON field 'OperationSessionInfo.txnNumber' is the wrong type '{:?}', expected type 'long'",
                other.element_type()
            )))
        }
    };
    let flag = |key: &str| -> Result<Option<bool>, CmdError> {
        match cmd.get(key) {
            None => Ok(None),
            Some(Bson::Boolean(b)) => Ok(Some(*b)),
            Some(other) => Err(CmdError::type_mismatch(format!(
                "BSON field 'OperationSessionInfo.{key}' is the wrong type '{:?}', expected type 'bool'",
                other.element_type()
            ))),
        }
    };
    a.autocommit = flag("autocommit")?;
    a.start_transaction = flag("startTransaction")?;
    if a.txn_number.is_some() && a.lsid.is_none() {
        return Err(invalid_options(
            "Transaction number requires a session ID to also be specified",
        ));
    }
    if a.txn_number.is_some_and(|n| n < 0) {
        return Err(CmdError::bad_value("Transaction number cannot be negative"));
    }
    if a.autocommit.is_some() && a.txn_number.is_none() {
        return Err(invalid_options(
            "'autocommit' field requires a transaction number to also be specified",
        ));
    }
    if a.autocommit == Some(true) {
        return Err(invalid_options(
            "Specifying autocommit=true is not allowed.",
        ));
    }
    if a.start_transaction.is_some() && a.autocommit.is_none() {
        return Err(invalid_options(
            "'startTransaction' field requires 'autocommit' field to also be specified",
        ));
    }
    if a.start_transaction == Some(false) {
        return Err(invalid_options(
            "Specifying startTransaction=false is not allowed.",
        ));
    }
    Ok(a)
}

/// NoSuchTransaction, labelled TransientTransactionError as mongod labels it for statements
/// of a transaction and for commit/abort (src/mongo/db/error_labels.cpp).
fn no_such_transaction(msg: String) -> CmdError {
    CmdError::new(251, "NoSuchTransaction", msg).with_label("TransientTransactionError")
}

fn committed(n: i64) -> CmdError {
    CmdError::new(
        256,
        "TransactionCommitted",
        format!("Transaction with {{ txnNumber: {n} }} has been committed."),
    )
}

impl Sessions {
    /// Begins or continues the command's transaction or retryable write. `counter` is the
    /// member's topologyVersion counter, `primary` whether it can accept writes now.
    pub(crate) fn begin_or_continue(
        &self,
        user: Option<&str>,
        name: &str,
        a: &SessionArgs,
        counter: i64,
        primary: bool,
    ) -> Result<(), CmdError> {
        let (Some(lsid), Some(n)) = (&a.lsid, a.txn_number) else {
            if matches!(name, "committransaction" | "aborttransaction") {
                return Err(invalid_options(format!(
                    "{} must be run within a transaction",
                    if name == "committransaction" {
                        "commitTransaction"
                    } else {
                        "abortTransaction"
                    }
                )));
            }
            return Ok(());
        };
        if matches!(name, "committransaction" | "aborttransaction") && !a.in_transaction() {
            return Err(invalid_options(
                "'autocommit' field is required for commitTransaction and abortTransaction",
            ));
        }
        if !primary {
            return Err(CmdError::new(
                10107,
                "NotWritablePrimary",
                "Not primary so we cannot begin or continue a transaction",
            ));
        }
        let key = (user.map(str::to_string), lsid.clone());
        let mut map = self.inner.lock();
        if map.len() >= MAX_SESSIONS && !map.contains_key(&key) {
            map.clear();
        }
        let s = map.entry(key).or_insert(Session {
            txn_number: -1,
            state: State::Retryable,
            counter,
        });
        // A role change since the transaction started aborted it (mongod aborts every
        // transaction in progress at step-down).
        if s.state == State::InProgress && s.counter != counter {
            s.state = State::Aborted;
        }
        if n < s.txn_number {
            let what = if s.state == State::Retryable {
                "retryable write"
            } else {
                "transaction"
            };
            let msg = if a.in_transaction() {
                format!("Cannot start transaction with {{ txnNumber: {n} }} on session because a newer {what} with txnNumber {} has already started on this session.", s.txn_number)
            } else {
                format!("Retryable write with txnNumber {n} is prohibited on session because a newer {what} with txnNumber {} has already started on this session.", s.txn_number)
            };
            return Err(CmdError::new(225, "TransactionTooOld", msg));
        }
        if !a.in_transaction() {
            // A retryable write (mongod: converting an open transaction's number to a
            // retryable write is refused; a new number starts one).
            if n == s.txn_number && s.state != State::Retryable {
                return Err(CmdError::new(
                    50911,
                    "Location50911",
                    format!("Cannot start a retryable write with txnNumber {n} on a session whose transaction with the same number is already started"),
                ));
            }
            s.txn_number = n;
            s.state = State::Retryable;
            return Ok(());
        }
        if a.start_transaction == Some(true) {
            if n == s.txn_number {
                // _verifyCanBeginMultiDocumentTransaction: the same number again.
                return Err(CmdError::new(
                    50911,
                    "Location50911",
                    format!("Cannot start a transaction at given transaction number {n} a transaction with the same number is in state {:?}", s.state),
                ));
            }
            s.txn_number = n;
            s.state = State::InProgress;
            s.counter = counter;
            return Ok(());
        }
        // Continue (a statement, commitTransaction or abortTransaction).
        if n != s.txn_number || s.state == State::Retryable {
            return Err(no_such_transaction(format!(
                "Given transaction number {n} does not match any in-progress transactions. The active transaction number is {}",
                s.txn_number
            )));
        }
        match (s.state, name) {
            (State::Aborted, _) => Err(no_such_transaction(format!(
                "Transaction with {{ txnNumber: {n} }} has been aborted."
            ))),
            // A commit may be retried after it succeeded.
            (State::Committed, "committransaction") => Ok(()),
            (State::Committed, _) => Err(committed(n)),
            (State::InProgress, "committransaction") => {
                s.state = State::Committed;
                Ok(())
            }
            (State::InProgress, "aborttransaction") => {
                s.state = State::Aborted;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// endSessions / killSessions: forget these sessions of `user` (aborting their
    /// transactions); another user's session of the same id is another session.
    pub(crate) fn end(&self, user: Option<&str>, ids: &[Vec<u8>]) {
        let mut map = self.inner.lock();
        for id in ids {
            map.remove(&(user.map(str::to_string), id.clone()));
        }
    }

    /// `killSessions: []`: every session of `user` (mongod: "If you specify an empty array,
    /// killSessions kills all sessions for the current user"; KillSessionsCmd builds a
    /// pattern of the user's uid, src/mongo/db/commands/kill_sessions_command.cpp).
    pub(crate) fn end_all_of(&self, user: Option<&str>) {
        self.inner.lock().retain(|(u, _), _| u.as_deref() != user);
    }
}

/// `lsid.id` bytes of every session in an endSessions/killSessions array, parsed as mongod's
/// IDL does (`array<LogicalSessionFromClient>`, src/mongo/db/session/logical_session_id.idl;
/// generated parser: src/mongo/idl/idl_parser.cpp): the argument must be an array (else
/// TypeMismatch 14), each element an object (14) holding `id`, a UUID (binData subtype 4 of
/// 16 bytes; another subtype is 14), and nothing but an optional `uid` (an unknown field is
/// 40415, a missing `id` 40414). A `uid` names another user's session:
/// mongod refuses it without the impersonate privilege (`makeLogicalSessionId`,
/// src/mongo/db/session/logical_session_id_helpers.cpp: Unauthorized 13), and the stand-in's
/// users hold no such privilege. (The element names of the array are not checked: the bson
/// crate's `Document` drops them.)
pub(crate) fn session_ids(command: &str, v: Option<&Bson>) -> Result<Vec<Vec<u8>>, CmdError> {
    let Some(Bson::Array(a)) = v else {
        let got = v.map_or("missing", |b| crate::bsonutil::type_name(b));
        return Err(CmdError::type_mismatch(format!(
            "BSON field '{command}.{command}' is the wrong type '{got}', expected type 'array'"
        )));
    };
    let mut ids = Vec::with_capacity(a.len());
    for x in a {
        let Bson::Document(d) = x else {
            return Err(CmdError::type_mismatch(format!(
                "BSON field '{command}' is the wrong type '{}', expected type 'object'",
                crate::bsonutil::type_name(x)
            )));
        };
        let mut id = None;
        for (k, v) in d {
            match (k.as_str(), v) {
                ("id", Bson::Binary(b))
                    if b.subtype == bson::spec::BinarySubtype::Uuid && b.bytes.len() == 16 =>
                {
                    id = Some(b.bytes.clone());
                }
                ("id", Bson::Binary(_)) => {
                    return Err(CmdError::type_mismatch(format!(
                        "BSON field '{command}.id' is the wrong binData type, expected type 'UUID'"
                    )))
                }
                ("id", other) => {
                    return Err(CmdError::type_mismatch(format!(
                        "BSON field '{command}.id' is the wrong type '{}', expected type 'binData'",
                        crate::bsonutil::type_name(other)
                    )))
                }
                ("uid", _) => {
                    return Err(CmdError::new(
                        13,
                        "Unauthorized",
                        "Unauthorized to set user digest in LogicalSessionId",
                    ))
                }
                (other, _) => {
                    return Err(CmdError::new(
                        40415,
                        "Location40415",
                        format!("BSON field '{command}.{other}' is an unknown field."),
                    ))
                }
            }
        }
        match id {
            Some(id) => ids.push(id),
            None => {
                return Err(CmdError::new(
                    40414,
                    "Location40414",
                    format!("BSON field '{command}.id' is missing but a required field"),
                ))
            }
        }
    }
    Ok(ids)
}
