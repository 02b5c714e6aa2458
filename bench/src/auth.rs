//! A driver-style connection handshake: `hello` with client metadata, then SCRAM-SHA-256
//! (`speculativeAuthenticate` in the hello, or `saslStart`, then `saslContinue`), using
//! mongoguard's own SCRAM client ([`mongoguard::auth::scram::ClientConversation`]).
//!
//! Drivers cache the PBKDF2 output per (password, salt, iterations). `ClientConversation`
//! derives it afresh in every conversation and offers no way to reuse it, so every
//! authentication here pays the full client-side PBKDF2. That cost is measured separately
//! ([`HandshakeInfo::client_scram`]) so that it is not mistaken for server time.

use std::time::{Duration, Instant};

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document, RawBsonRef, RawDocument};
use mongoguard::auth::scram::{ClientConversation, Mechanism};

use mongoguard::wire::Compressor;

use crate::wire::{hello_agrees, not_agreed, Body, Conn, Endpoint, WireError};

/// Who to authenticate as, and how.
#[derive(Clone)]
pub struct AuthOptions {
    pub user: String,
    pub password: String,
    /// Authentication database (`authSource`).
    pub db: String,
    /// Start the conversation inside `hello` (`speculativeAuthenticate`), as drivers do.
    pub speculative: bool,
    /// Send `options: {skipEmptyExchange: true}` (drivers do). Without it the server answers
    /// client-final with `done: false` and wants one more, empty, `saslContinue`.
    pub skip_empty_exchange: bool,
}

impl std::fmt::Debug for AuthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthOptions")
            .field("user", &self.user)
            .field("db", &self.db)
            .field("speculative", &self.speculative)
            .field("skip_empty_exchange", &self.skip_empty_exchange)
            .finish_non_exhaustive()
    }
}

/// What one handshake did and cost on the client side.
#[derive(Clone, Copy, Debug, Default)]
pub struct HandshakeInfo {
    /// Wall time spent in client-side SCRAM computation (PBKDF2 and HMACs): CPU-bound work
    /// in this process, not waiting for the server.
    pub client_scram: Duration,
    /// The iteration count the server asked for (0 without authentication).
    pub iterations: u32,
    /// Requests sent, `hello` included.
    pub round_trips: u32,
    /// The server answered the speculative attempt (no `saslStart` was needed).
    pub speculative: bool,
}

/// The `client` metadata document of the handshake `hello`.
fn client_metadata() -> Document {
    doc! {
        "driver": { "name": "loadgen", "version": "1" },
        "os": { "type": "linux" },
    }
}

fn binary(bytes: Vec<u8>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    })
}

fn proto(msg: impl Into<String>) -> WireError {
    WireError::Protocol(msg.into())
}

fn scram_err(e: mongoguard::auth::scram::ScramError) -> WireError {
    WireError::Command(format!("SCRAM: {e}"))
}

/// The parts of a SASL reply the client needs.
struct SaslReply {
    conversation_id: Bson,
    payload: Vec<u8>,
    done: bool,
}

fn sasl_reply(doc: &RawDocument) -> Result<SaslReply, WireError> {
    let conversation_id = match doc.get("conversationId") {
        Ok(Some(RawBsonRef::Int32(v))) => Bson::Int32(v),
        Ok(Some(RawBsonRef::Int64(v))) => Bson::Int64(v),
        Ok(Some(RawBsonRef::Double(v))) => Bson::Double(v),
        _ => return Err(proto("SASL reply without a numeric conversationId")),
    };
    let payload = match doc.get("payload") {
        Ok(Some(RawBsonRef::Binary(b))) => b.bytes.to_vec(),
        Ok(Some(RawBsonRef::String(s))) => s.as_bytes().to_vec(),
        _ => return Err(proto("SASL reply without a payload")),
    };
    let done = match doc.get("done") {
        Ok(Some(RawBsonRef::Boolean(b))) => b,
        _ => return Err(proto("SASL reply without done")),
    };
    Ok(SaslReply {
        conversation_id,
        payload,
        done,
    })
}

/// The `i=` attribute of a SCRAM server-first message (0 if absent or malformed).
fn iterations(server_first: &[u8]) -> u32 {
    std::str::from_utf8(server_first)
        .ok()
        .and_then(|s| s.split(',').find_map(|a| a.strip_prefix("i=")))
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

fn timed_out(what: &str) -> WireError {
    WireError::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

/// Connect, send the handshake `hello` and, with `auth`, authenticate with SCRAM-SHA-256.
/// With `compress`, hello offers that compressor, its reply must agree, and the connection
/// compresses every request after the handshake (hello and SASL are never compressed).
/// Every request is bounded by `timeout`.
pub async fn handshake(
    ep: &Endpoint,
    timeout: Duration,
    auth: Option<&AuthOptions>,
    compress: Option<Compressor>,
) -> Result<(Conn, HandshakeInfo), WireError> {
    let mut conn = Conn::open(ep, timeout).await?;
    let mut info = HandshakeInfo::default();
    let mut hello = doc! { "hello": 1, "helloOk": true, "client": client_metadata() };
    if let Some(c) = compress {
        hello.insert("compression", vec![c.name()]);
    }
    let agreed = |reply: &RawDocument| match compress {
        Some(c) if !hello_agrees(reply, c) => Err(not_agreed(c)),
        _ => Ok(()),
    };
    let Some(auth) = auth else {
        hello.insert("$db", "admin");
        agreed(request(&mut conn, &hello, timeout, &mut info).await?)?;
        conn.set_compressor(compress);
        return Ok((conn, info));
    };
    let started = Instant::now();
    let mut conv = ClientConversation::new(Mechanism::ScramSha256, &auth.user, &auth.password)
        .map_err(scram_err)?;
    let client_first = conv.client_first();
    info.client_scram += started.elapsed();
    let options = doc! { "skipEmptyExchange": auth.skip_empty_exchange };
    if auth.speculative {
        hello.insert(
            "speculativeAuthenticate",
            doc! {
                "saslStart": 1,
                "mechanism": Mechanism::ScramSha256.name(),
                "payload": binary(client_first.clone()),
                "db": &auth.db,
                "options": options.clone(),
            },
        );
    }
    hello.insert("$db", "admin");
    let reply = request(&mut conn, &hello, timeout, &mut info).await?;
    agreed(reply)?;
    let first = match reply.get("speculativeAuthenticate") {
        Ok(Some(RawBsonRef::Document(d))) if auth.speculative => Some(sasl_reply(d)?),
        _ => None,
    };
    let first = match first {
        Some(r) => {
            info.speculative = true;
            r
        }
        None => {
            // No speculative attempt, or the server declined it: authenticate normally.
            let start = doc! {
                "saslStart": 1,
                "mechanism": Mechanism::ScramSha256.name(),
                "payload": binary(client_first),
                "options": options,
                "$db": &auth.db,
            };
            sasl_reply(request(&mut conn, &start, timeout, &mut info).await?)?
        }
    };
    if first.done {
        return Err(proto("server said done after server-first"));
    }
    info.iterations = iterations(&first.payload);
    let started = Instant::now();
    let client_final = conv.handle_server_first(&first.payload).map_err(scram_err);
    info.client_scram += started.elapsed();
    let cont = doc! {
        "saslContinue": 1,
        "conversationId": first.conversation_id.clone(),
        "payload": binary(client_final?),
        "$db": &auth.db,
    };
    let last = sasl_reply(request(&mut conn, &cont, timeout, &mut info).await?)?;
    let started = Instant::now();
    let verified = conv.verify_server_final(&last.payload).map_err(scram_err);
    info.client_scram += started.elapsed();
    verified?;
    if !last.done {
        // The empty exchange: the server has proven itself; one more round trip ends it.
        let empty = doc! {
            "saslContinue": 1,
            "conversationId": first.conversation_id,
            "payload": binary(Vec::new()),
            "$db": &auth.db,
        };
        let end = sasl_reply(request(&mut conn, &empty, timeout, &mut info).await?)?;
        if !end.done {
            return Err(proto("SASL conversation not done after the empty exchange"));
        }
    }
    conn.set_compressor(compress);
    Ok((conn, info))
}

async fn request<'c>(
    conn: &'c mut Conn,
    cmd: &Document,
    timeout: Duration,
    info: &mut HandshakeInfo,
) -> Result<&'c RawDocument, WireError> {
    let body = Body::encode(cmd)?;
    info.round_trips += 1;
    let name = cmd.keys().next().map(String::as_str).unwrap_or("?");
    match tokio::time::timeout(timeout, conn.request_doc(&body)).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::iterations;

    #[test]
    fn iterations_from_server_first() {
        assert_eq!(iterations(b"r=abc,s=c2FsdA==,i=15000"), 15000);
        assert_eq!(iterations(b"r=abc,s=c2FsdA=="), 0);
        assert_eq!(iterations(b"\xff"), 0);
    }
}
