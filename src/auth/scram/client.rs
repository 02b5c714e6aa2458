//! The client side of a SCRAM conversation: mongoguard authenticating to mongod.

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use subtle::ConstantTimeEq;

use super::{
    attr, check_iterations, encode_name, is_printable_nonce, random_nonce, utf8, xor, Mechanism,
    ScramError,
};

/// The gs2 header we send: no channel binding, no authzid. `biws` is its base64.
const GS2_HEADER: &str = "n,,";

#[derive(Clone, PartialEq, Eq)]
enum Stage {
    /// Waiting for server-first.
    Started,
    /// client-final sent; holds the server signature we expect.
    Sent { server_signature: Vec<u8> },
    /// Server verified (or the conversation failed): nothing more to do.
    Done,
}

/// Entries kept by [`derived_keys`]'s cache.
const KEY_CACHE_CAP: usize = 64;

/// ClientKey and ServerKey for a password, salt and iteration count, cached per process as
/// drivers do (the PBKDF2 step costs milliseconds by design; a server hands out the same salt
/// and count for a user until its password changes). The key is a hash of the prepared
/// password, never the password itself; the cache is cleared when full.
fn derived_keys(
    mech: Mechanism,
    prepared: &[u8],
    salt: &[u8],
    iterations: u32,
) -> (Vec<u8>, Vec<u8>) {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};
    type Key = (Mechanism, Vec<u8>, Vec<u8>, u32);
    type Keys = (Vec<u8>, Vec<u8>);
    static CACHE: OnceLock<Mutex<HashMap<Key, Keys>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key: Key = (
        mech,
        Mechanism::ScramSha256.hash(prepared),
        salt.to_vec(),
        iterations,
    );
    if let Some(hit) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return hit.clone();
    }
    let salted = mech.salted_password(prepared, salt, iterations);
    let keys = (
        mech.hmac(&salted, b"Client Key"),
        mech.hmac(&salted, b"Server Key"),
    );
    let mut map = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if map.len() >= KEY_CACHE_CAP {
        map.clear();
    }
    map.insert(key, keys.clone());
    keys
}

/// One SCRAM conversation toward a server:
/// [`client_first`](Self::client_first) → [`handle_server_first`](Self::handle_server_first)
/// → [`verify_server_final`](Self::verify_server_final).
pub struct ClientConversation {
    mechanism: Mechanism,
    /// The password as prepared for the mechanism (MD5 digest or SASLprep'd): password
    /// equivalent, so never printed.
    prepared: Vec<u8>,
    client_first_bare: String,
    client_nonce: String,
    stage: Stage,
}

impl std::fmt::Debug for ClientConversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConversation")
            .field("mechanism", &self.mechanism)
            .finish_non_exhaustive()
    }
}

impl ClientConversation {
    /// Starts a conversation for `user` with `password`, with a fresh random nonce.
    ///
    /// # Errors
    /// [`ScramError::NonAsciiPassword`] for a SCRAM-SHA-256 password outside printable ASCII.
    pub fn new(
        mechanism: Mechanism,
        user: &str,
        password: &str,
    ) -> Result<ClientConversation, ScramError> {
        let prepared = mechanism.prepare_password(user, password)?;
        Ok(Self::from_prepared(
            mechanism,
            user,
            prepared,
            random_nonce(),
        ))
    }

    /// A conversation with a chosen prepared password and nonce (RFC test vectors).
    pub(crate) fn from_prepared(
        mechanism: Mechanism,
        user: &str,
        prepared: Vec<u8>,
        client_nonce: String,
    ) -> ClientConversation {
        ClientConversation {
            mechanism,
            prepared,
            client_first_bare: format!("n={},r={client_nonce}", encode_name(user)),
            client_nonce,
            stage: Stage::Started,
        }
    }

    /// The mechanism of this conversation.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// client-first: the `saslStart` payload.
    pub fn client_first(&self) -> Vec<u8> {
        format!("{GS2_HEADER}{}", self.client_first_bare).into_bytes()
    }

    /// Handles server-first and returns client-final (the `saslContinue` payload). Runs
    /// PBKDF2 with the server's iteration count (bounded by
    /// [`MAX_ITERATIONS`](super::MAX_ITERATIONS)).
    ///
    /// # Errors
    /// A malformed server-first, a nonce that does not extend ours, an iteration count out of
    /// range, or a call out of order.
    pub fn handle_server_first(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        if self.stage != Stage::Started {
            return Err(ScramError::OutOfOrder);
        }
        self.stage = Stage::Done;
        let msg = utf8(server_first)?;
        let mut parts = msg.split(',');
        let nonce = attr(parts.next(), 'r', "server-first lacks r=")?;
        let salt = attr(parts.next(), 's', "server-first lacks s=")?;
        let iterations = attr(parts.next(), 'i', "server-first lacks i=")?;
        if !is_printable_nonce(nonce) {
            return Err(ScramError::Malformed("bad server nonce"));
        }
        if nonce.len() <= self.client_nonce.len() || !nonce.starts_with(&self.client_nonce) {
            return Err(ScramError::NonceMismatch);
        }
        let salt = B64
            .decode(salt)
            .map_err(|_| ScramError::Malformed("salt is not base64"))?;
        if salt.is_empty() {
            return Err(ScramError::Malformed("empty salt"));
        }
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| ScramError::Malformed("bad iteration count"))?;
        let iterations = check_iterations(iterations)?;

        let mech = self.mechanism;
        let (client_key, server_key) = derived_keys(mech, &self.prepared, &salt, iterations);
        let stored_key = mech.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", B64.encode(GS2_HEADER));
        let auth_message = format!("{},{msg},{without_proof}", self.client_first_bare);
        let client_signature = mech.hmac(&stored_key, auth_message.as_bytes());
        let proof = xor(&client_key, &client_signature);
        self.stage = Stage::Sent {
            server_signature: mech.hmac(&server_key, auth_message.as_bytes()),
        };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks server-final (`v=signature`): proves the server knows our credentials.
    ///
    /// # Errors
    /// [`ScramError::ServerSignatureMismatch`], [`ScramError::ServerError`] for `e=...`, a
    /// malformed message, or a call out of order.
    pub fn verify_server_final(&mut self, server_final: &[u8]) -> Result<(), ScramError> {
        let Stage::Sent { server_signature } = std::mem::replace(&mut self.stage, Stage::Done)
        else {
            return Err(ScramError::OutOfOrder);
        };
        let msg = utf8(server_final)?;
        let first = msg.split(',').next();
        if let Some(err) = first.and_then(|p| p.strip_prefix("e=")) {
            // RFC 5802 server-error-value tokens are short and fixed; cap it anyway.
            return Err(ScramError::ServerError(err.chars().take(64).collect()));
        }
        let v = attr(first, 'v', "server-final lacks v=")?;
        let got = B64
            .decode(v)
            .map_err(|_| ScramError::Malformed("server signature is not base64"))?;
        if bool::from(got.ct_eq(&server_signature)) {
            Ok(())
        } else {
            Err(ScramError::ServerSignatureMismatch)
        }
    }
}
