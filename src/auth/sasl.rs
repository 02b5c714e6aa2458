//! The MongoDB command layer of SCRAM, sans-IO: `saslStart`, `saslContinue`, hello's
//! `speculativeAuthenticate` and `saslSupportedMechs`.
//!
//! The proxy owns one [`SaslSession`] per client connection, hands it the command bodies and
//! sends back the documents it returns. Every failure the client sees is the same
//! `{ok: 0, code: 18, codeName: "AuthenticationFailed", errmsg: "Authentication failed."}`
//! (except an unknown mechanism, 334, and a `saslContinue` with no conversation, 17), so a
//! client cannot tell an unknown user from a wrong password.

use bson::{spec::BinarySubtype, Binary, RawBsonRef, RawDocument, RawDocumentBuf};
use tracing::debug;

use super::{
    scram::{Mechanism, ScramError, ServerConversation},
    users::Users,
};
use crate::wire::builder::error_document;

/// mongod's AuthenticationFailed code.
pub const AUTHENTICATION_FAILED: i32 = 18;
/// mongod's MechanismUnavailable code.
pub const MECHANISM_UNAVAILABLE: i32 = 334;
/// mongod's ProtocolError code (saslContinue without a conversation).
pub const PROTOCOL_ERROR: i32 = 17;
/// mongod's IDL error for a required field left out (here: saslContinue's conversationId).
pub const MISSING_REQUIRED_FIELD: i32 = 40414;

/// Who a connection authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedUser {
    /// The database the user is defined in.
    pub db: String,
    /// The user name.
    pub name: String,
    /// The mechanism used.
    pub mechanism: Mechanism,
}

enum Pending {
    /// saslStart answered; waiting for client-final.
    ClientFinal {
        id: i32,
        db: String,
        skip_empty: bool,
        conv: ServerConversation,
    },
    /// Proof accepted, server-final sent with `done: false`; waiting for the empty exchange
    /// (clients that did not ask for `skipEmptyExchange`).
    EmptyExchange { id: i32, user: AuthenticatedUser },
}

/// The SASL state of one client connection.
#[derive(Default)]
pub struct SaslSession {
    pending: Option<Pending>,
    last_conversation_id: i32,
    authenticated: Option<AuthenticatedUser>,
    /// `db.name` of the last `saslStart`, for the event log (bounded, no other part of the
    /// exchange is kept).
    attempted: Option<String>,
}

/// Longest user name kept for [`SaslSession::attempted_user`].
const MAX_ATTEMPTED_LEN: usize = 128;

impl std::fmt::Debug for SaslSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslSession")
            .field("in_progress", &self.in_progress())
            .field("authenticated", &self.authenticated)
            .finish()
    }
}

/// True when `reply` (a document this module returned) reports a failure (`ok: 0`).
pub fn is_failure(reply: &RawDocument) -> bool {
    matches!(reply.get("ok"), Ok(Some(RawBsonRef::Double(ok))) if ok == 0.0)
}

/// The reply to a saslContinue without conversationId, mongod's.
pub fn missing_conversation_id() -> RawDocumentBuf {
    error_document(
        MISSING_REQUIRED_FIELD,
        "Location40414",
        "BSON field 'saslContinue.conversationId' is missing but a required field",
    )
}

/// The reply to any failed authentication step.
pub fn auth_failed() -> RawDocumentBuf {
    error_document(
        AUTHENTICATION_FAILED,
        "AuthenticationFailed",
        "Authentication failed.",
    )
}

impl SaslSession {
    /// A connection that has not authenticated.
    pub fn new() -> SaslSession {
        SaslSession::default()
    }

    /// The user this connection authenticated as, once a conversation completed. A later
    /// failed attempt leaves it unchanged (as in mongod); a later successful one replaces it.
    pub fn authenticated(&self) -> Option<&AuthenticatedUser> {
        self.authenticated.as_ref()
    }

    /// Forgets the conversation in progress and the user this connection authenticated as:
    /// that user is no longer one (a users-file reload removed him).
    pub fn forget_user(&mut self) {
        self.pending = None;
        self.authenticated = None;
    }

    /// `db.name` the last `saslStart` asked for, when its first message named a user (the
    /// client's claim, for logging failed attempts; never part of a secret).
    pub fn attempted_user(&self) -> Option<String> {
        self.attempted.clone()
    }

    /// True between `saslStart` and the step that completes or fails the conversation.
    pub fn in_progress(&self) -> bool {
        self.pending.is_some()
    }

    /// Answers a `saslStart` command body (`mechanism`, `payload`, `options`, `$db`).
    pub fn sasl_start(&mut self, users: &Users, cmd: &RawDocument) -> RawDocumentBuf {
        let db = match cmd.get("$db") {
            Ok(Some(RawBsonRef::String(db))) => db.to_string(),
            _ => return self.fail("saslStart without $db"),
        };
        match self.start(users, &db, cmd) {
            Ok(mut reply) => {
                reply.append(bson::cstr!("ok"), 1.0);
                reply
            }
            Err(reply) => reply,
        }
    }

    /// Answers the `speculativeAuthenticate` document of a hello (`{saslStart: 1, mechanism,
    /// payload, db, options}`): the document to put under `speculativeAuthenticate` in the
    /// hello reply, or `None` to omit the field (the driver then authenticates with
    /// `saslStart`, and fails there if its credentials are bad).
    pub fn speculative_authenticate(
        &mut self,
        users: &Users,
        spec: &RawDocument,
    ) -> Option<RawDocumentBuf> {
        let db = match spec.get("db") {
            Ok(Some(RawBsonRef::String(db))) => db.to_string(),
            _ => return None,
        };
        self.start(users, &db, spec).ok()
    }

    /// Answers a `saslContinue` command body (`conversationId`, `payload`).
    /// The credential was fixed at `saslStart`, so no users are needed here.
    pub fn sasl_continue(&mut self, cmd: &RawDocument) -> RawDocumentBuf {
        match self.step(cmd) {
            Ok(mut reply) => {
                reply.append(bson::cstr!("ok"), 1.0);
                reply
            }
            Err(reply) => reply,
        }
    }

    /// The saslContinue step; returns the reply without `ok`.
    fn step(&mut self, cmd: &RawDocument) -> Result<RawDocumentBuf, RawDocumentBuf> {
        let Some(pending) = self.pending.take() else {
            return Err(error_document(
                PROTOCOL_ERROR,
                "ProtocolError",
                "No SASL session state found",
            ));
        };
        let id = match &pending {
            Pending::ClientFinal { id, .. } | Pending::EmptyExchange { id, .. } => *id,
        };
        match cmd.get("conversationId") {
            // mongod's IDL requires it (sasl_commands.idl) and refuses the command before
            // any SASL step; the conversation ends here as well.
            Ok(None) => {
                self.pending = None;
                return Err(missing_conversation_id());
            }
            Ok(Some(v)) if as_i64(v) == Some(i64::from(id)) => {}
            _ => return Err(self.fail("conversationId mismatch")),
        }
        let Some(payload) = payload(cmd) else {
            return Err(self.fail("payload is not BinData"));
        };
        match pending {
            Pending::ClientFinal {
                id,
                db,
                skip_empty,
                conv,
            } => {
                let mechanism = conv.mechanism();
                match conv.finish(payload) {
                    Ok((server_final, name)) => {
                        let user = AuthenticatedUser {
                            db,
                            name,
                            mechanism,
                        };
                        if skip_empty {
                            self.authenticated = Some(user);
                        } else {
                            self.pending = Some(Pending::EmptyExchange { id, user });
                        }
                        Ok(reply(id, skip_empty, server_final))
                    }
                    Err(e) => Err(self.fail_scram(e)),
                }
            }
            Pending::EmptyExchange { id, user } => {
                self.authenticated = Some(user);
                Ok(reply(id, true, Vec::new()))
            }
        }
    }

    /// Starts a conversation; returns the reply without `ok`.
    fn start(
        &mut self,
        users: &Users,
        db: &str,
        cmd: &RawDocument,
    ) -> Result<RawDocumentBuf, RawDocumentBuf> {
        // A new saslStart abandons any conversation in progress.
        self.pending = None;
        self.attempted = None;
        let mechanism = match cmd.get("mechanism") {
            Ok(Some(RawBsonRef::String(m))) => Mechanism::parse(m),
            _ => None,
        };
        let Some(mechanism) = mechanism else {
            return Err(error_document(
                MECHANISM_UNAVAILABLE,
                "MechanismUnavailable",
                "Unsupported authentication mechanism (mongoguard offers SCRAM-SHA-256 and SCRAM-SHA-1)",
            ));
        };
        let Some(client_first) = payload(cmd) else {
            return Err(self.fail("payload is not BinData"));
        };
        let skip_empty = match cmd.get("options") {
            Ok(Some(RawBsonRef::Document(o))) => o
                .get("skipEmptyExchange")
                .ok()
                .flatten()
                .is_some_and(truthy),
            _ => false,
        };
        let attempted = std::cell::RefCell::new(None);
        let lookup = |name: &str| {
            let mut shown: String = name.chars().take(MAX_ATTEMPTED_LEN).collect();
            shown.insert(0, '.');
            shown.insert_str(0, db);
            *attempted.borrow_mut() = Some(shown);
            users.lookup(db, name, mechanism).cloned()
        };
        let started = ServerConversation::start(mechanism, client_first, lookup);
        self.attempted = attempted.into_inner();
        match started {
            Ok((conv, server_first)) => {
                self.last_conversation_id = self.last_conversation_id.wrapping_add(1).max(1);
                let id = self.last_conversation_id;
                self.pending = Some(Pending::ClientFinal {
                    id,
                    db: db.to_string(),
                    skip_empty,
                    conv,
                });
                Ok(reply(id, false, server_first))
            }
            Err(e) => Err(self.fail_scram(e)),
        }
    }

    fn fail_scram(&mut self, e: ScramError) -> RawDocumentBuf {
        // ScramError carries no secrets; the user name is left out of logs on purpose.
        debug!(reason = %e, "SCRAM authentication failed");
        self.pending = None;
        auth_failed()
    }

    fn fail(&mut self, reason: &'static str) -> RawDocumentBuf {
        debug!(reason, "SASL command rejected");
        self.pending = None;
        auth_failed()
    }
}

/// The mechanisms to list under `saslSupportedMechs` for a hello carrying
/// `saslSupportedMechs: "db.user"`. An unknown user (or a malformed value) gets both
/// mechanisms rather than no field, so the reply does not reveal which users exist; the
/// driver then picks SCRAM-SHA-256 and fails at `saslStart` like for a wrong password.
pub fn supported_mechs(users: &Users, db_user: &str) -> Vec<&'static str> {
    let known = db_user
        .split_once('.')
        .and_then(|(db, name)| users.user(db, name));
    match known {
        Some(u) => u.mechanisms().into_iter().map(Mechanism::name).collect(),
        None => Mechanism::ALL.into_iter().map(Mechanism::name).collect(),
    }
}

fn reply(id: i32, done: bool, payload: Vec<u8>) -> RawDocumentBuf {
    bson::rawdoc! {
        "conversationId": id,
        "done": done,
        "payload": Binary { subtype: BinarySubtype::Generic, bytes: payload },
    }
}

/// The SASL payload: BinData (what drivers send) or a string (some shells).
fn payload(cmd: &RawDocument) -> Option<&[u8]> {
    match cmd.get("payload") {
        Ok(Some(RawBsonRef::Binary(b))) => Some(b.bytes),
        Ok(Some(RawBsonRef::String(s))) => Some(s.as_bytes()),
        _ => None,
    }
}

fn as_i64(v: RawBsonRef<'_>) -> Option<i64> {
    match v {
        RawBsonRef::Int32(i) => Some(i64::from(i)),
        RawBsonRef::Int64(i) => Some(i),
        // Exact integral doubles only; `as` saturates, and the round trip rejects fractions.
        RawBsonRef::Double(d) if d.fract() == 0.0 => Some(d as i64),
        _ => None,
    }
}

/// A BSON flag as mongod reads one: true, or a non-zero number.
pub(crate) fn truthy(v: RawBsonRef<'_>) -> bool {
    match v {
        RawBsonRef::Boolean(b) => b,
        RawBsonRef::Int32(i) => i != 0,
        RawBsonRef::Int64(i) => i != 0,
        RawBsonRef::Double(d) => d != 0.0,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
