//! SCRAM-SHA-256 and SCRAM-SHA-1 (RFC 5802, RFC 7677) as MongoDB uses them.
//!
//! MongoDB specifics (mongodb/specifications, `source/auth/auth.md`):
//! - SCRAM-SHA-1 does not use the password itself but the hex MD5 digest of
//!   `"{user}:mongo:{password}"`.
//! - SCRAM-SHA-256 uses the SASLprep'd password. mongoguard implements SASLprep for ASCII only:
//!   printable ASCII passes unchanged (SASLprep maps it to itself), ASCII control characters
//!   are prohibited by SASLprep and rejected, and any non-ASCII password is rejected with
//!   [`ScramError::NonAsciiPassword`] rather than risk a normalisation that differs from the
//!   driver's. SCRAM-SHA-1 accepts any password (it is hashed before use).
//! - Default iteration counts are 15000 (SHA-256) and 10000 (SHA-1); salts are 28 and 16
//!   random bytes.
//!
//! Only the gs2 headers `n,,` and `y,,` are accepted: no channel binding, no authzid.

mod client;
mod credential;
mod server;
#[cfg(test)]
mod tests;

pub use client::ClientConversation;
pub use credential::StoredCredential;
pub use server::ServerConversation;

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use hmac::{digest::Digest, Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::Sha256;

/// Fewest iterations accepted anywhere (RFC 7677 §4 recommends at least 4096).
pub const MIN_ITERATIONS: u32 = 4096;
/// Most iterations accepted: bounds the CPU a hostile server (or users file) can make us spend.
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// A SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    /// SCRAM-SHA-1 with MongoDB's MD5 password digest.
    ScramSha1,
    /// SCRAM-SHA-256 with a SASLprep'd (ASCII-only) password.
    ScramSha256,
}

impl Mechanism {
    /// Both mechanisms, strongest first (the order of `saslSupportedMechs` replies).
    pub const ALL: [Mechanism; 2] = [Mechanism::ScramSha256, Mechanism::ScramSha1];

    /// The SASL mechanism name, as sent in `saslStart`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::ScramSha1 => "SCRAM-SHA-1",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
        }
    }

    /// Parses a SASL mechanism name (exact, case-sensitive, like mongod).
    pub fn parse(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// mongod's default iteration count for this mechanism.
    pub fn default_iterations(self) -> u32 {
        match self {
            Mechanism::ScramSha1 => 10_000,
            Mechanism::ScramSha256 => 15_000,
        }
    }

    /// Length of a freshly generated salt, in bytes.
    pub fn salt_len(self) -> usize {
        match self {
            Mechanism::ScramSha1 => 16,
            Mechanism::ScramSha256 => 28,
        }
    }

    /// Length of the hash output, hence of the stored and server keys.
    pub fn key_len(self) -> usize {
        match self {
            Mechanism::ScramSha1 => 20,
            Mechanism::ScramSha256 => 32,
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::ScramSha1 => mac::<Hmac<Sha1>>(key, data),
            Mechanism::ScramSha256 => mac::<Hmac<Sha256>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::ScramSha1 => Sha1::digest(data).to_vec(),
            Mechanism::ScramSha256 => Sha256::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, i)`: PBKDF2 with this mechanism's HMAC.
    fn salted_password(self, prepared: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.key_len()];
        match self {
            Mechanism::ScramSha1 => {
                pbkdf2::pbkdf2_hmac::<Sha1>(prepared, salt, iterations, &mut out)
            }
            Mechanism::ScramSha256 => {
                pbkdf2::pbkdf2_hmac::<Sha256>(prepared, salt, iterations, &mut out)
            }
        }
        out
    }

    /// The password as this mechanism feeds it to PBKDF2 (see the module docs).
    fn prepare_password(self, user: &str, password: &str) -> Result<Vec<u8>, ScramError> {
        match self {
            Mechanism::ScramSha1 => {
                let digest = md5::Md5::digest(format!("{user}:mongo:{password}").as_bytes());
                Ok(hex(&digest).into_bytes())
            }
            Mechanism::ScramSha256 => saslprep_ascii(password).map(|p| p.as_bytes().to_vec()),
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a SCRAM step failed. Variants carry no secrets (no password, key, proof or nonce), so
/// they may be logged; none of them is meant to be shown to the client, which only ever sees
/// "Authentication failed.".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// A SCRAM message does not follow the RFC 5802 grammar; says which part.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The gs2 header asks for channel binding or an authzid, which mongoguard does not support.
    #[error("unsupported channel binding or authorization identity")]
    UnsupportedChannelBinding,
    /// The message carries a mandatory extension (`m=`).
    #[error("unsupported mandatory SCRAM extension")]
    UnsupportedExtension,
    /// The nonce echoed by the peer is not the one of this conversation.
    #[error("SCRAM nonce mismatch")]
    NonceMismatch,
    /// The channel-binding attribute of client-final does not repeat the gs2 header.
    #[error("SCRAM channel binding mismatch")]
    ChannelBindingMismatch,
    /// An iteration count outside [`MIN_ITERATIONS`]..=[`MAX_ITERATIONS`].
    #[error("iteration count {0} out of range")]
    Iterations(u32),
    /// Wrong password or unknown user: deliberately one variant, so the two cannot be told
    /// apart.
    #[error("authentication failed")]
    AuthenticationFailed,
    /// The server's signature is wrong: the server does not know our credentials.
    #[error("server signature mismatch")]
    ServerSignatureMismatch,
    /// The server sent `e=` instead of a signature (the value is a fixed RFC token).
    #[error("server reported an error: {0}")]
    ServerError(String),
    /// SCRAM-SHA-256 password outside printable ASCII (mongoguard's SASLprep is ASCII-only).
    #[error(
        "SCRAM-SHA-256 passwords must be printable ASCII (SASLprep is implemented for ASCII only)"
    )]
    NonAsciiPassword,
    /// The conversation was driven out of order.
    #[error("SCRAM conversation step out of order")]
    OutOfOrder,
}

/// SASLprep (RFC 4013) restricted to ASCII: the identity on printable ASCII, an error for
/// control characters (prohibited by RFC 4013 §2.3, table C.2.1) and for anything non-ASCII.
fn saslprep_ascii(password: &str) -> Result<&str, ScramError> {
    if password.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        Ok(password)
    } else {
        Err(ScramError::NonAsciiPassword)
    }
}

fn mac<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so the error branch is unreachable in practice.
    match <M as KeyInit>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// A fresh nonce: 24 bytes from the thread-local CSPRNG, base64 (printable, no ',').
fn random_nonce() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    B64.encode(bytes)
}

/// RFC 5802 `saslname` → name: `=2C` is ',' and `=3D` is '='; any other '=' is an error.
fn decode_name(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3);
        match esc {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in user name")),
        }
        // `get(i..i + 3)` matched, so `i + 3` is a char boundary within `rest`.
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    if out.is_empty() || out.contains('\0') {
        return Err(ScramError::Malformed("invalid user name"));
    }
    Ok(out)
}

/// name → RFC 5802 `saslname`.
fn encode_name(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

/// RFC 5802 `printable`: %x21-2B / %x2D-7E (no ',').
fn is_printable_nonce(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// Splits `k=value` and checks the key.
fn attr<'a>(part: Option<&'a str>, key: char, what: &'static str) -> Result<&'a str, ScramError> {
    let part = part.ok_or(ScramError::Malformed(what))?;
    let mut chars = part.chars();
    if chars.next() == Some(key) && chars.next() == Some('=') {
        // The first two chars are ASCII, so byte 2 is a char boundary.
        Ok(&part[2..])
    } else if part.starts_with("m=") {
        Err(ScramError::UnsupportedExtension)
    } else {
        Err(ScramError::Malformed(what))
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, ScramError> {
    std::str::from_utf8(bytes).map_err(|_| ScramError::Malformed("not UTF-8"))
}

fn check_iterations(i: u32) -> Result<u32, ScramError> {
    if (MIN_ITERATIONS..=MAX_ITERATIONS).contains(&i) {
        Ok(i)
    } else {
        Err(ScramError::Iterations(i))
    }
}
