//! `saslStart` / `saslContinue` (SCRAM-SHA-1, SCRAM-SHA-256).

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use tracing::debug;

use super::{CmdError, CmdResult, Ctx};
use crate::bsonutil::truthy;
use crate::scram::{self, Mech};

fn auth_failed() -> CmdError {
    CmdError::new(18, "AuthenticationFailed", "Authentication failed.")
}

/// A field the IDL requires (src/mongo/idl/idl_parser.cpp, `throwMissingField`).
fn missing(path: &str) -> CmdError {
    CmdError::new(
        40414,
        "Location40414",
        format!("BSON field '{path}' is missing but a required field"),
    )
}

/// `payload` (required by saslStart and saslContinue, src/mongo/db/auth/sasl_commands.idl).
fn payload_bytes(cmd: &Document, command: &str) -> Result<Vec<u8>, CmdError> {
    match cmd.get("payload") {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        Some(Bson::String(s)) => Ok(s.as_bytes().to_vec()),
        None => Err(missing(&format!("{command}.payload"))),
        Some(_) => Err(CmdError::type_mismatch(
            "payload must be BinData or a string",
        )),
    }
}

fn binary(bytes: Vec<u8>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    })
}

/// Starts a conversation (shared by saslStart and hello's speculativeAuthenticate).
pub(crate) fn start_conversation(ctx: &mut Ctx, db: &str, cmd: &Document) -> CmdResult {
    let mech_name = match cmd.get("mechanism") {
        Some(Bson::String(m)) => m.as_str(),
        None => return Err(missing("saslStart.mechanism")),
        Some(other) => {
            return Err(CmdError::type_mismatch(format!(
                "BSON field 'saslStart.mechanism' is the wrong type '{}', expected type 'string'",
                crate::bsonutil::type_name(other)
            )))
        }
    };
    let Some(mech) = Mech::parse(mech_name) else {
        return Err(CmdError::new(
            334,
            "MechanismUnavailable",
            format!("Received authentication for mechanism {mech_name} which is not enabled"),
        ));
    };
    let payload = payload_bytes(cmd, "saslStart")?;
    if db != "admin" {
        debug!(db, "authentication against a database other than admin");
        return Err(auth_failed());
    }
    let skip_empty = match cmd.get("options") {
        Some(Bson::Document(o)) => o.get("skipEmptyExchange").is_some_and(truthy),
        _ => false,
    };
    match scram::start(&ctx.shared.users, mech, &payload) {
        Ok((conv, server_first)) => {
            ctx.conn.sasl = Some((conv, skip_empty));
            Ok(
                doc! {"conversationId": 1, "done": false, "payload": binary(server_first), "ok": 1.0},
            )
        }
        Err(e) => {
            debug!(reason = %e.0, "saslStart failed");
            ctx.conn.sasl = None;
            Err(auth_failed())
        }
    }
}

pub(crate) fn sasl_start(ctx: &mut Ctx, cmd: &Document) -> CmdResult {
    let db = ctx.db.clone();
    start_conversation(ctx, &db, cmd)
}

pub(crate) fn sasl_continue(ctx: &mut Ctx, cmd: &Document) -> CmdResult {
    // The IDL's checks come first, then the conversation's (runSaslContinue).
    let id = match cmd.get("conversationId") {
        Some(Bson::Int32(id)) => *id,
        None => return Err(missing("saslContinue.conversationId")),
        Some(other) => {
            return Err(CmdError::type_mismatch(format!(
                "BSON field 'saslContinue.conversationId' is the wrong type '{}', expected \
                 type 'int'",
                crate::bsonutil::type_name(other)
            )))
        }
    };
    let payload = payload_bytes(cmd, "saslContinue")?;
    let Some((mut conv, skip_empty)) = ctx.conn.sasl.take() else {
        return Err(CmdError::new(
            17,
            "ProtocolError",
            "No SASL session state found",
        ));
    };
    if id != 1 {
        return Err(CmdError::new(
            17,
            "ProtocolError",
            "sasl: Mismatched conversation id",
        ));
    }
    match conv.step(&ctx.shared.users, &payload, skip_empty) {
        Ok(step) => {
            if let Some(user) = step.authenticated {
                // As mongod (AuthorizationSessionImpl::addAndAuthorizeUser): a connection
                // authenticates as one user; the same user again is allowed. Every user here
                // is in admin, so the refusal is 5626701 (5626702 is another database's).
                if let Some(prev) = ctx.conn.user.as_ref().filter(|prev| **prev != user) {
                    return Err(CmdError::new(
                        5626701,
                        "Location5626701",
                        format!(
                            "Each client connection may only be authenticated once. \
                             Previously authenticated as: {prev}@admin"
                        ),
                    ));
                }
                debug!(conn = ctx.conn.id, %user, "authenticated");
                ctx.conn.user = Some(user);
                ctx.shared.stats.on_auth();
            }
            if !step.done {
                ctx.conn.sasl = Some((conv, skip_empty));
            }
            Ok(
                doc! {"conversationId": 1, "done": step.done, "payload": binary(step.payload), "ok": 1.0},
            )
        }
        Err(e) => {
            debug!(reason = %e.0, "saslContinue failed");
            Err(auth_failed())
        }
    }
}
