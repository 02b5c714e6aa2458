//! The server-side secret of one user for one mechanism, and the fake one used for unknown
//! users.

use std::sync::OnceLock;

use rand::RngCore;

use super::{check_iterations, Mechanism, ScramError};

/// What the server keeps per user and mechanism (RFC 5802 §3): enough to verify a client
/// proof and to sign the server-final message, not enough to log in as the user. The password
/// is never stored.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCredential {
    /// The mechanism these keys belong to.
    pub mechanism: Mechanism,
    /// The PBKDF2 salt (sent to clients in server-first).
    pub salt: Vec<u8>,
    /// The PBKDF2 iteration count (sent to clients in server-first).
    pub iterations: u32,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are password-equivalent for offline attacks: never print them.
        f.debug_struct("StoredCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .field("salt_len", &self.salt.len())
            .finish_non_exhaustive()
    }
}

impl StoredCredential {
    /// Derives the credential of `user` from `password` with a fresh random salt.
    ///
    /// # Errors
    /// [`ScramError::NonAsciiPassword`] for a SCRAM-SHA-256 password outside printable ASCII,
    /// [`ScramError::Iterations`] for an iteration count out of range.
    pub fn derive(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        iterations: u32,
    ) -> Result<StoredCredential, ScramError> {
        let iterations = check_iterations(iterations)?;
        let prepared = mechanism.prepare_password(user, password)?;
        let mut salt = vec![0u8; mechanism.salt_len()];
        rand::rng().fill_bytes(&mut salt);
        Ok(StoredCredential::from_prepared(
            mechanism, &prepared, salt, iterations,
        ))
    }

    /// Derives from an already prepared password (MD5 digest or SASLprep'd).
    pub(crate) fn from_prepared(
        mechanism: Mechanism,
        prepared: &[u8],
        salt: Vec<u8>,
        iterations: u32,
    ) -> StoredCredential {
        let salted = mechanism.salted_password(prepared, &salt, iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        StoredCredential {
            mechanism,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
            salt,
            iterations,
        }
    }

    /// Checks the invariants a credential read from a file must hold.
    ///
    /// # Errors
    /// A static description of the first problem found.
    pub fn validate(&self) -> Result<(), &'static str> {
        if check_iterations(self.iterations).is_err() {
            return Err("iterations out of range (4096..=10000000)");
        }
        if self.salt.is_empty() {
            return Err("empty salt");
        }
        if self.stored_key.len() != self.mechanism.key_len() {
            return Err("stored_key has the wrong length for the mechanism");
        }
        if self.server_key.len() != self.mechanism.key_len() {
            return Err("server_key has the wrong length for the mechanism");
        }
        Ok(())
    }

    /// A credential for a user that does not exist, indistinguishable from a real one from the
    /// outside: the salt is stable per (mechanism, user) within this process (a second attempt
    /// sees the same salt, as for a real user) and the iteration count is the default. Nobody
    /// can produce a valid proof for it, since the keys come from a per-process secret.
    pub(crate) fn fake(mechanism: Mechanism, user: &str) -> StoredCredential {
        let secret = process_secret();
        let derive = |label: &str, len: usize| {
            let mut out =
                mechanism.hmac(secret, format!("{label}\0{mechanism}\0{user}").as_bytes());
            out.resize(len, 0);
            out
        };
        StoredCredential {
            mechanism,
            salt: derive("salt", mechanism.salt_len()),
            iterations: mechanism.default_iterations(),
            stored_key: derive("stored", mechanism.key_len()),
            server_key: derive("server", mechanism.key_len()),
        }
    }
}

/// 32 random bytes drawn once per process. Immutable after first use, so it is not shared
/// mutable state; it only needs to be unpredictable, not persistent.
fn process_secret() -> &'static [u8; 32] {
    static SECRET: OnceLock<[u8; 32]> = OnceLock::new();
    SECRET.get_or_init(|| {
        let mut s = [0u8; 32];
        rand::rng().fill_bytes(&mut s);
        s
    })
}
