//! Target `scram_server`: a client's side of a SCRAM conversation, chosen by the fuzzer,
//! against mongoguard's server side (`auth::sasl::SaslSession` over `auth::scram`).
//!
//! The server knows one user, `alice` in `admin`, with a fixed password (both mechanisms).
//! Input layout: byte 0 is a set of switches, the rest the messages.
//!
//! | bit | meaning |
//! |---|---|
//! | 7 | documents mode: the rest is a sequence of BSON documents, the first sent as the `saslStart` body, the others as `saslContinue` bodies (with `payload` and `conversationId` as the fuzzer wrote them) |
//! | 6 | control mode: a real client that knows the password talks to the server; the rest is `[index lo, index hi, xor]`: the proof byte at `index` is XORed with `xor` |
//! | 0 | SCRAM-SHA-1 instead of SCRAM-SHA-256 |
//! | 1 | `options: {skipEmptyExchange: true}` |
//! | 2 | payloads as strings instead of BinData |
//! | 3 | `conversationId` left out of `saslContinue` (refused with mongod's 40414) |
//! | 4 | through hello's `speculativeAuthenticate` instead of `saslStart` |
//!
//! Text mode (bits 6 and 7 clear): the rest is split at NUL bytes into client-first,
//! client-final and a third payload (the empty exchange). In client-final, `@NONCE@` is
//! replaced by the nonce the server sent in server-first, so that the fuzzer gets past the
//! nonce check to the proof check.
//!
//! What is asserted:
//! - nothing the fuzzer writes authenticates: a proof is an HMAC keyed by a secret derived
//!   from the password, over a message holding the server's random nonce;
//! - in control mode, the real client authenticates exactly when the proof is left intact
//!   (so the check above can see a success), as `alice` in `admin`;
//! - every reply is either a step (`conversationId`, `done`, BinData `payload`, `ok: 1`) or
//!   one of the fixed failures (18 AuthenticationFailed, 334 MechanismUnavailable, 17
//!   ProtocolError, 40414 for a saslContinue without conversationId), which carry nothing
//!   else: an unknown user and a wrong password look the same.

use std::{path::Path, sync::OnceLock};

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use bson::{spec::BinarySubtype, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::auth::{
    sasl::{
        SaslSession, AUTHENTICATION_FAILED, MECHANISM_UNAVAILABLE, MISSING_REQUIRED_FIELD,
        PROTOCOL_ERROR,
    },
    scram::{ClientConversation, Mechanism, StoredCredential},
    users::Users,
};

const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery staple";

/// The users file: `alice` with both mechanisms, at the lowest iteration count (the work is
/// done once per process).
fn users() -> Option<&'static Users> {
    static USERS: OnceLock<Option<Users>> = OnceLock::new();
    USERS
        .get_or_init(|| {
            let mut text = format!("[[users]]\nname = \"{USER}\"\ndb = \"admin\"\n");
            for m in Mechanism::ALL {
                let c = StoredCredential::derive(m, USER, PASSWORD, 4096).ok()?;
                text.push_str(&format!(
                    "[users.mechanisms.{}]\nsalt = \"{}\"\niterations = {}\n\
                     stored_key = \"{}\"\nserver_key = \"{}\"\n",
                    m.name(),
                    B64.encode(&c.salt),
                    c.iterations,
                    B64.encode(&c.stored_key),
                    B64.encode(&c.server_key)
                ));
            }
            Users::parse(&text, Path::new("fuzz-users.toml")).ok()
        })
        .as_ref()
}

#[derive(Clone, Copy)]
struct Switches {
    sha1: bool,
    skip_empty: bool,
    as_string: bool,
    no_conversation_id: bool,
    speculative: bool,
}

impl Switches {
    fn from(b: u8) -> Switches {
        Switches {
            sha1: b & 1 != 0,
            skip_empty: b & 2 != 0,
            as_string: b & 4 != 0,
            no_conversation_id: b & 8 != 0,
            speculative: b & 16 != 0,
        }
    }

    fn mechanism(self) -> Mechanism {
        if self.sha1 {
            Mechanism::ScramSha1
        } else {
            Mechanism::ScramSha256
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let users = users();
    assert!(users.is_some(), "the fixed users file does not load");
    let Some(users) = users else {
        return;
    };
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let sw = Switches::from(first);
    if first & 0x80 != 0 {
        documents(users, rest);
    } else if first & 0x40 != 0 {
        control(users, sw, rest);
    } else {
        text(users, sw, rest);
    }
}

fn payload(sw: Switches, bytes: &[u8]) -> RawBsonRef<'_> {
    match std::str::from_utf8(bytes) {
        Ok(s) if sw.as_string => RawBsonRef::String(s),
        _ => RawBsonRef::Binary(bson::RawBinaryRef {
            subtype: BinarySubtype::Generic,
            bytes,
        }),
    }
}

/// Starts a conversation; returns the server's reply document (from `saslStart`, or what the
/// hello reply would carry under `speculativeAuthenticate`).
fn start(
    users: &Users,
    session: &mut SaslSession,
    sw: Switches,
    client_first: &[u8],
) -> Option<RawDocumentBuf> {
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::cstr!("saslStart"), 1);
    cmd.append(bson::cstr!("mechanism"), sw.mechanism().name());
    cmd.append(bson::cstr!("payload"), payload(sw, client_first));
    if sw.skip_empty {
        cmd.append(
            bson::cstr!("options"),
            bson::rawdoc! {"skipEmptyExchange": true},
        );
    }
    if sw.speculative {
        cmd.append(bson::cstr!("db"), "admin");
        let reply = session.speculative_authenticate(users, &cmd);
        if let Some(r) = &reply {
            check_step(r, false);
        }
        reply
    } else {
        cmd.append(bson::cstr!("$db"), "admin");
        let reply = session.sasl_start(users, &cmd);
        check_reply(&reply);
        Some(reply)
    }
}

fn continue_cmd(sw: Switches, id: Option<i32>, bytes: &[u8]) -> RawDocumentBuf {
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::cstr!("saslContinue"), 1);
    if let (Some(id), false) = (id, sw.no_conversation_id) {
        cmd.append(bson::cstr!("conversationId"), id);
    }
    cmd.append(bson::cstr!("payload"), payload(sw, bytes));
    cmd.append(bson::cstr!("$db"), "admin");
    cmd
}

fn text(users: &Users, sw: Switches, rest: &[u8]) {
    let mut parts = rest.splitn(3, |b| *b == 0);
    let client_first = parts.next().unwrap_or_default();
    let client_final = parts.next();
    let third = parts.next();
    let mut session = SaslSession::new();
    let reply = start(users, &mut session, sw, client_first);
    assert!(
        session.authenticated().is_none(),
        "authenticated by client-first"
    );
    let Some(client_final) = client_final else {
        return;
    };
    let (id, server_first) = match reply.as_deref().and_then(step_of) {
        Some((id, _, payload)) => (Some(id), payload.to_vec()),
        None => (None, Vec::new()),
    };
    let nonce = server_nonce(&server_first).unwrap_or_default();
    let client_final = replace(client_final, b"@NONCE@", nonce.as_bytes());
    for payload in [Some(client_final.as_slice()), third].into_iter().flatten() {
        let reply = session.sasl_continue(&continue_cmd(sw, id, payload));
        check_reply(&reply);
        assert!(
            session.authenticated().is_none(),
            "a client that does not know the password authenticated"
        );
    }
}

fn documents(users: &Users, rest: &[u8]) {
    let mut session = SaslSession::new();
    let mut docs = Vec::new();
    let mut at = rest;
    while let Some(len) = super::le4(at, 0).map(i32::from_le_bytes) {
        let Some(bytes) = usize::try_from(len).ok().and_then(|l| at.get(..l)) else {
            break;
        };
        let Ok(doc) = RawDocument::from_bytes(bytes) else {
            break;
        };
        docs.push(doc);
        at = at.get(bytes.len()..).unwrap_or_default();
        if docs.len() == 4 {
            break;
        }
    }
    let Some((first, others)) = docs.split_first() else {
        return;
    };
    check_reply(&session.sasl_start(users, first));
    if let Some(spec) = session.speculative_authenticate(users, first) {
        check_step(&spec, false);
    }
    for doc in others {
        check_reply(&session.sasl_continue(doc));
        assert!(
            session.authenticated().is_none(),
            "arbitrary documents authenticated"
        );
    }
}

/// A client that knows the password; the proof byte at `index` is XORed with `xor`.
fn control(users: &Users, sw: Switches, rest: &[u8]) {
    let (index, xor) = match rest {
        [lo, hi, x, ..] => (usize::from(u16::from_le_bytes([*lo, *hi])), *x),
        _ => (0, 0),
    };
    let client = ClientConversation::new(sw.mechanism(), USER, PASSWORD);
    assert!(client.is_ok(), "the fixed password is refused");
    let Ok(mut client) = client else {
        return;
    };
    let mut session = SaslSession::new();
    let reply = start(users, &mut session, sw, &client.client_first());
    let step = reply.as_deref().and_then(step_of);
    assert!(
        step.is_some(),
        "saslStart of a well-formed client-first failed: {reply:?}"
    );
    let Some((id, _, server_first)) = step else {
        return;
    };
    let client_final = client.handle_server_first(server_first);
    assert!(client_final.is_ok(), "the client refused server-first");
    let Ok(client_final) = client_final else {
        return;
    };
    let tampered = tamper(&client_final, index, xor);
    let reply = session.sasl_continue(&continue_cmd(sw, Some(id), &tampered));
    check_reply(&reply);
    if sw.no_conversation_id {
        // Refused whatever the proof (mongod's IDL requires the field), and over.
        assert!(
            session.authenticated().is_none() && !session.in_progress(),
            "a saslContinue without conversationId was taken: {reply:?}"
        );
        return;
    }
    if tampered != client_final {
        assert!(
            session.authenticated().is_none() && crate::auth::sasl::is_failure(&reply),
            "a tampered proof authenticated"
        );
        return;
    }
    let step = step_of(&reply);
    assert!(step.is_some(), "the right proof was refused: {reply:?}");
    let Some((_, done, server_final)) = step else {
        return;
    };
    assert!(
        client.verify_server_final(server_final).is_ok(),
        "the server's signature does not verify"
    );
    assert_eq!(done, sw.skip_empty);
    if !done {
        assert!(
            session.authenticated().is_none(),
            "authenticated before the last step"
        );
        let reply = session.sasl_continue(&continue_cmd(sw, Some(id), b""));
        check_reply(&reply);
    }
    let who = session.authenticated();
    assert!(
        who.is_some_and(|u| u.name == USER && u.db == "admin" && u.mechanism == sw.mechanism()),
        "the right proof did not authenticate alice: {who:?}"
    );
}

/// Flips bits of the proof (the base64 after `p=`): decode, XOR one byte, encode.
fn tamper(client_final: &[u8], index: usize, xor: u8) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(client_final) else {
        return client_final.to_vec();
    };
    let Some((head, proof)) = text.rsplit_once(",p=") else {
        return client_final.to_vec();
    };
    let Ok(mut proof) = B64.decode(proof) else {
        return client_final.to_vec();
    };
    let len = proof.len().max(1);
    if let Some(b) = proof.get_mut(index % len) {
        *b ^= xor;
    }
    format!("{head},p={}", B64.encode(proof)).into_bytes()
}

/// `(conversationId, done, payload)` of a successful step.
fn step_of(reply: &RawDocument) -> Option<(i32, bool, &[u8])> {
    let id = match reply.get("conversationId").ok()?? {
        RawBsonRef::Int32(i) => i,
        _ => return None,
    };
    let done = match reply.get("done").ok()?? {
        RawBsonRef::Boolean(b) => b,
        _ => return None,
    };
    let payload = match reply.get("payload").ok()?? {
        RawBsonRef::Binary(b) => b.bytes,
        _ => return None,
    };
    Some((id, done, payload))
}

/// The combined nonce of server-first (`r=...,s=...,i=...`).
fn server_nonce(server_first: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(server_first).ok()?;
    let r = text.split(',').next()?.strip_prefix("r=")?;
    Some(r.to_owned())
}

fn replace(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while !rest.is_empty() {
        if rest.starts_with(needle) {
            out.extend_from_slice(with);
            rest = rest.get(needle.len()..).unwrap_or_default();
        } else if let Some((b, tail)) = rest.split_first() {
            out.push(*b);
            rest = tail;
        }
    }
    out
}

/// A step reply: exactly `conversationId`, `done`, `payload` (and `ok: 1` from saslStart /
/// saslContinue).
fn check_step(reply: &RawDocument, with_ok: bool) {
    let keys: Vec<&str> = reply
        .iter_elements()
        .flatten()
        .map(|e| e.key().as_str())
        .collect();
    let want: &[&str] = if with_ok {
        &["conversationId", "done", "payload", "ok"]
    } else {
        &["conversationId", "done", "payload"]
    };
    assert_eq!(keys, want, "unexpected step reply shape");
    assert!(step_of(reply).is_some_and(|(id, _, _)| id >= 1));
    if with_ok {
        assert!(matches!(reply.get("ok"), Ok(Some(RawBsonRef::Double(v))) if v == 1.0));
    }
}

/// Any reply of `sasl_start` / `sasl_continue`: a step, or one of the fixed failures.
fn check_reply(reply: &RawDocument) {
    if !crate::auth::sasl::is_failure(reply) {
        check_step(reply, true);
        return;
    }
    let code = match reply.get("code") {
        Ok(Some(RawBsonRef::Int32(c))) => c,
        _ => -1,
    };
    assert!(
        [
            AUTHENTICATION_FAILED,
            MECHANISM_UNAVAILABLE,
            PROTOCOL_ERROR,
            MISSING_REQUIRED_FIELD
        ]
        .contains(&code),
        "unexpected failure code {code}: {reply:?}"
    );
    let want = match code {
        AUTHENTICATION_FAILED => crate::auth::sasl::auth_failed(),
        MECHANISM_UNAVAILABLE => crate::wire::builder::error_document(
            MECHANISM_UNAVAILABLE,
            "MechanismUnavailable",
            "Unsupported authentication mechanism (mongoguard offers SCRAM-SHA-256 and SCRAM-SHA-1)",
        ),
        PROTOCOL_ERROR => crate::wire::builder::error_document(
            PROTOCOL_ERROR,
            "ProtocolError",
            "No SASL session state found",
        ),
        MISSING_REQUIRED_FIELD => crate::auth::sasl::missing_conversation_id(),
        _ => return,
    };
    assert_eq!(
        reply.as_bytes(),
        want.as_bytes(),
        "a failure says more than the fixed text"
    );
}
