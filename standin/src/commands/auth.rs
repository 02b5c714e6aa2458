//! `saslStart` / `saslContinue` (SCRAM-SHA-1, SCRAM-SHA-256).

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use tracing::debug;

use super::{CmdError, CmdResult, Ctx};
use crate::bsonutil::truthy;
use crate::scram::{self, Mech};

fn auth_failed() -> CmdError {
    CmdError::new(18, "AuthenticationFailed", "Authentication failed.")
}

fn payload_bytes(cmd: &Document) -> Result<Vec<u8>, CmdError> {
    match cmd.get("payload") {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        Some(Bson::String(s)) => Ok(s.as_bytes().to_vec()),
        None => Ok(Vec::new()),
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
    let mech_name = cmd.get_str("mechanism").unwrap_or("");
    let Some(mech) = Mech::parse(mech_name) else {
        return Err(CmdError::new(
            334,
            "MechanismUnavailable",
            format!("Received authentication for mechanism {mech_name} which is not enabled"),
        ));
    };
    let payload = payload_bytes(cmd)?;
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
    let payload = payload_bytes(cmd)?;
    let Some((mut conv, skip_empty)) = ctx.conn.sasl.take() else {
        return Err(CmdError::new(
            17,
            "ProtocolError",
            "No SASL session state found",
        ));
    };
    match conv.step(&ctx.shared.users, &payload, skip_empty) {
        Ok(step) => {
            if let Some(user) = step.authenticated {
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
