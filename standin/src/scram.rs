//! Server side of SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 5802 / 7677, MongoDB flavour).
//!
//! SCRAM-SHA-1 uses the MongoDB-specific password digest (hex MD5 of `user:mongo:password`)
//! and 10000 iterations; SCRAM-SHA-256 uses the password as is (no SASLprep: use ASCII
//! passwords with the stand-in) and 4096 iterations. Salts are random per user at startup.

use std::collections::HashMap;

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use hmac::{digest::Digest, Hmac, KeyInit, Mac};
use md5::Md5;
use rand::RngCore;
use sha1::Sha1;
use sha2::Sha256;

/// Authentication failed (reported as code 18 AuthenticationFailed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScramError(pub(crate) String);

type Result<T> = std::result::Result<T, ScramError>;

fn fail<T>(why: &str) -> Result<T> {
    Err(ScramError(why.to_string()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mech {
    Sha1,
    Sha256,
}

impl Mech {
    pub(crate) fn parse(name: &str) -> Option<Mech> {
        match name {
            "SCRAM-SHA-1" => Some(Mech::Sha1),
            "SCRAM-SHA-256" => Some(Mech::Sha256),
            _ => None,
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mech::Sha1 => mac::<Hmac<Sha1>>(key, data),
            Mech::Sha256 => mac::<Hmac<Sha256>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mech::Sha1 => Sha1::digest(data).to_vec(),
            Mech::Sha256 => Sha256::digest(data).to_vec(),
        }
    }
}

fn mac<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so this never fails.
    match <M as KeyInit>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

#[derive(Debug, Clone)]
struct Creds {
    salt: Vec<u8>,
    iterations: u32,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl Creds {
    fn derive(mech: Mech, user: &str, password: &str) -> Creds {
        let mut salt = vec![0u8; if mech == Mech::Sha1 { 16 } else { 28 }];
        rand::rng().fill_bytes(&mut salt);
        let (iterations, salted) = match mech {
            Mech::Sha1 => {
                let digest = hex(&Md5::digest(format!("{user}:mongo:{password}").as_bytes()));
                let mut out = vec![0u8; 20];
                pbkdf2::pbkdf2_hmac::<Sha1>(digest.as_bytes(), &salt, 10_000, &mut out);
                (10_000, out)
            }
            Mech::Sha256 => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), &salt, 4096, &mut out);
                (4096, out)
            }
        };
        let client_key = mech.hmac(&salted, b"Client Key");
        Creds {
            salt,
            iterations,
            stored_key: mech.hash(&client_key),
            server_key: mech.hmac(&salted, b"Server Key"),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Users (all in database `admin`) with precomputed SCRAM credentials.
#[derive(Debug, Default)]
pub(crate) struct UserDb {
    users: HashMap<String, (Creds, Creds)>,
}

impl UserDb {
    pub(crate) fn new(users: &[(String, String)]) -> UserDb {
        let users = users
            .iter()
            .map(|(u, p)| {
                (
                    u.clone(),
                    (
                        Creds::derive(Mech::Sha1, u, p),
                        Creds::derive(Mech::Sha256, u, p),
                    ),
                )
            })
            .collect();
        UserDb { users }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub(crate) fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    fn creds(&self, user: &str, mech: Mech) -> Option<&Creds> {
        self.users.get(user).map(|(a, b)| match mech {
            Mech::Sha1 => a,
            Mech::Sha256 => b,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    ClientFinal,
    EmptyExchange,
    Done,
}

/// One SASL conversation on a connection.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    mech: Mech,
    user: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    stage: Stage,
}

/// Result of a conversation step.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) payload: Vec<u8>,
    pub(crate) done: bool,
    /// Set once, on the step that proves the client knows the password.
    pub(crate) authenticated: Option<String>,
}

fn decode_name(s: &str) -> Result<String> {
    // RFC 5802: ',' is sent as "=2C" and '=' as "=3D".
    let out = s.replace("=2C", ",").replace("=3D", "=");
    if out.contains('\0') {
        return fail("invalid username");
    }
    Ok(out)
}

/// Handles `saslStart`: parses client-first, returns the conversation and server-first.
pub(crate) fn start(db: &UserDb, mech: Mech, payload: &[u8]) -> Result<(Conversation, Vec<u8>)> {
    let msg =
        std::str::from_utf8(payload).map_err(|_| ScramError("payload is not UTF-8".into()))?;
    // gs2-header: "n,," or "y,," (no channel binding support); authzid must be empty.
    let mut parts = msg.splitn(3, ',');
    let (cb, authz, bare) = match (parts.next(), parts.next(), parts.next()) {
        (Some(cb), Some(a), Some(b)) => (cb, a, b),
        _ => return fail("malformed client-first message"),
    };
    if !(cb == "n" || cb == "y") || !authz.is_empty() {
        return fail("unsupported channel binding or authzid");
    }
    let mut user = None;
    let mut cnonce = None;
    for attr in bare.split(',') {
        if let Some(v) = attr.strip_prefix("n=") {
            user = Some(decode_name(v)?);
        } else if let Some(v) = attr.strip_prefix("r=") {
            cnonce = Some(v.to_string());
        } else if attr.starts_with("m=") {
            return fail("mandatory extension not supported");
        }
    }
    let (Some(user), Some(cnonce)) = (user, cnonce) else {
        return fail("client-first message lacks n= or r=");
    };
    if cnonce.is_empty() {
        return fail("empty client nonce");
    }
    let creds = db
        .creds(&user, mech)
        .ok_or_else(|| ScramError("no such user".into()))?;
    let mut rnd = [0u8; 24];
    rand::rng().fill_bytes(&mut rnd);
    let nonce = format!("{cnonce}{}", B64.encode(rnd));
    let server_first = format!(
        "r={nonce},s={},i={}",
        B64.encode(&creds.salt),
        creds.iterations
    );
    let conv = Conversation {
        mech,
        user,
        gs2_header: format!("{cb},{authz},"),
        client_first_bare: bare.to_string(),
        server_first: server_first.clone(),
        nonce,
        stage: Stage::ClientFinal,
    };
    Ok((conv, server_first.into_bytes()))
}

impl Conversation {
    /// Handles `saslContinue`.
    pub(crate) fn step(&mut self, db: &UserDb, payload: &[u8], skip_empty: bool) -> Result<Step> {
        match self.stage {
            Stage::ClientFinal => {}
            Stage::EmptyExchange => {
                self.stage = Stage::Done;
                return Ok(Step {
                    payload: Vec::new(),
                    done: true,
                    authenticated: None,
                });
            }
            Stage::Done => return fail("conversation already finished"),
        }
        let msg =
            std::str::from_utf8(payload).map_err(|_| ScramError("payload is not UTF-8".into()))?;
        let Some((without_proof, proof_b64)) = msg.rsplit_once(",p=") else {
            return fail("client-final message lacks a proof");
        };
        let mut cbind = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            if let Some(v) = attr.strip_prefix("c=") {
                cbind = Some(v);
            } else if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v);
            }
        }
        if cbind != Some(B64.encode(self.gs2_header.as_bytes()).as_str()) {
            return fail("channel binding mismatch");
        }
        if nonce != Some(self.nonce.as_str()) {
            return fail("nonce mismatch");
        }
        let proof = B64
            .decode(proof_b64)
            .map_err(|_| ScramError("proof is not base64".into()))?;
        let creds = db
            .creds(&self.user, self.mech)
            .ok_or_else(|| ScramError("no such user".into()))?;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let client_signature = self.mech.hmac(&creds.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return fail("bad proof length");
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(client_signature.iter())
            .map(|(a, b)| a ^ b)
            .collect();
        if self.mech.hash(&client_key) != creds.stored_key {
            return fail("bad proof");
        }
        let server_signature = self.mech.hmac(&creds.server_key, auth_message.as_bytes());
        self.stage = if skip_empty {
            Stage::Done
        } else {
            Stage::EmptyExchange
        };
        Ok(Step {
            payload: format!("v={}", B64.encode(server_signature)).into_bytes(),
            done: skip_empty,
            authenticated: Some(self.user.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the client side of SCRAM against our server side.
    fn client(db: &UserDb, mech: Mech, user: &str, password: &str) -> Result<Step> {
        let cnonce = "fyko+d2lbbFgONRv9qkxdawL";
        let bare = format!("n={user},r={cnonce}");
        let (mut conv, sf) = start(db, mech, format!("n,,{bare}").as_bytes())?;
        let sf = String::from_utf8(sf).unwrap();
        let mut it = sf.split(',');
        let nonce = it.next().unwrap().strip_prefix("r=").unwrap().to_string();
        let salt = B64
            .decode(it.next().unwrap().strip_prefix("s=").unwrap())
            .unwrap();
        let iters: u32 = it
            .next()
            .unwrap()
            .strip_prefix("i=")
            .unwrap()
            .parse()
            .unwrap();
        let (pw, len) = match mech {
            Mech::Sha1 => (
                hex(&Md5::digest(format!("{user}:mongo:{password}").as_bytes())),
                20,
            ),
            Mech::Sha256 => (password.to_string(), 32),
        };
        let mut salted = vec![0u8; len];
        match mech {
            Mech::Sha1 => pbkdf2::pbkdf2_hmac::<Sha1>(pw.as_bytes(), &salt, iters, &mut salted),
            Mech::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(pw.as_bytes(), &salt, iters, &mut salted),
        }
        let ck = mech.hmac(&salted, b"Client Key");
        let sk = mech.hash(&ck);
        let wp = format!("c=biws,r={nonce}");
        let am = format!("{bare},{sf},{wp}");
        let sig = mech.hmac(&sk, am.as_bytes());
        let proof: Vec<u8> = ck.iter().zip(sig.iter()).map(|(a, b)| a ^ b).collect();
        let step = conv.step(
            db,
            format!("{wp},p={}", B64.encode(proof)).as_bytes(),
            false,
        )?;
        assert!(!step.done);
        let last = conv.step(db, b"", false)?;
        assert!(last.done);
        Ok(step)
    }

    #[test]
    fn scram_roundtrips() {
        let db = UserDb::new(&[("alice".into(), "s3cret".into())]);
        for mech in [Mech::Sha1, Mech::Sha256] {
            let ok = client(&db, mech, "alice", "s3cret").unwrap();
            assert_eq!(ok.authenticated.as_deref(), Some("alice"));
            assert!(client(&db, mech, "alice", "wrong").is_err());
            assert!(client(&db, mech, "bob", "s3cret").is_err());
        }
        assert!(start(&db, Mech::Sha256, b"p=tls-unique,,n=alice,r=x").is_err());
        assert!(start(&db, Mech::Sha256, b"garbage").is_err());
    }
}
