//! The server side of a SCRAM conversation: mongoguard authenticating a client.

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use subtle::ConstantTimeEq;

use super::{
    attr, decode_name, is_printable_nonce, random_nonce, utf8, xor, Mechanism, ScramError,
    StoredCredential,
};

/// A conversation between `saslStart` (client-first) and `saslContinue` (client-final).
///
/// Created by [`ServerConversation::start`], consumed by [`ServerConversation::finish`], so a
/// conversation cannot be finished twice.
pub struct ServerConversation {
    credential: StoredCredential,
    /// False when the user does not exist: the conversation runs to the end all the same and
    /// fails exactly like a wrong password.
    known: bool,
    user: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl std::fmt::Debug for ServerConversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the keys nor whether the user exists.
        f.debug_struct("ServerConversation")
            .field("mechanism", &self.credential.mechanism)
            .finish_non_exhaustive()
    }
}

impl ServerConversation {
    /// Handles client-first (`n,,n=user,r=nonce`) and returns server-first
    /// (`r=nonce,s=salt,i=iterations`).
    ///
    /// `lookup` maps a user name to its credential for `mechanism`. An unknown user (or a
    /// credential for another mechanism) gets a fake credential derived from the user name and
    /// a per-process secret, so server-first looks the same as for a real user and the
    /// conversation ends in [`ScramError::AuthenticationFailed`] in
    /// [`finish`](Self::finish), exactly like a wrong password.
    ///
    /// # Errors
    /// A malformed client-first, channel binding other than `n,,`/`y,,`, an `m=` extension.
    pub fn start(
        mechanism: Mechanism,
        client_first: &[u8],
        lookup: impl Fn(&str) -> Option<StoredCredential>,
    ) -> Result<(ServerConversation, Vec<u8>), ScramError> {
        Self::start_with_nonce(mechanism, client_first, lookup, &random_nonce())
    }

    /// [`start`](Self::start) with a chosen server nonce part (RFC test vectors).
    pub(crate) fn start_with_nonce(
        mechanism: Mechanism,
        client_first: &[u8],
        lookup: impl Fn(&str) -> Option<StoredCredential>,
        server_nonce: &str,
    ) -> Result<(ServerConversation, Vec<u8>), ScramError> {
        let msg = utf8(client_first)?;
        let (gs2_header, bare) = split_gs2_header(msg)?;
        let mut parts = bare.split(',');
        let user = decode_name(attr(parts.next(), 'n', "client-first lacks n=")?)?;
        let client_nonce = attr(parts.next(), 'r', "client-first lacks r=")?;
        if !is_printable_nonce(client_nonce) {
            return Err(ScramError::Malformed("bad client nonce"));
        }
        // Further attributes are extensions, which RFC 5802 says to ignore.
        let (credential, known) = match lookup(&user) {
            Some(c) if c.mechanism == mechanism && c.validate().is_ok() => (c, true),
            _ => (StoredCredential::fake(mechanism, &user), false),
        };
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        let conv = ServerConversation {
            credential,
            known,
            user,
            gs2_header: gs2_header.to_string(),
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok((conv, server_first.into_bytes()))
    }

    /// The mechanism of this conversation.
    pub fn mechanism(&self) -> Mechanism {
        self.credential.mechanism
    }

    /// Handles client-final (`c=biws,r=nonce,p=proof`); on success returns server-final
    /// (`v=signature`) and the authenticated user name.
    ///
    /// # Errors
    /// [`ScramError::AuthenticationFailed`] for a wrong proof or an unknown user (the same
    /// error, after the same work); other variants for malformed messages.
    pub fn finish(self, client_final: &[u8]) -> Result<(Vec<u8>, String), ScramError> {
        let msg = utf8(client_final)?;
        let (without_proof, proof_b64) = msg
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("client-final lacks p="))?;
        let mut parts = without_proof.split(',');
        let cbind = attr(parts.next(), 'c', "client-final lacks c=")?;
        let nonce = attr(parts.next(), 'r', "client-final lacks r=")?;
        if cbind != B64.encode(self.gs2_header.as_bytes()) {
            return Err(ScramError::ChannelBindingMismatch);
        }
        if !bool::from(nonce.as_bytes().ct_eq(self.nonce.as_bytes())) {
            return Err(ScramError::NonceMismatch);
        }
        let proof = B64
            .decode(proof_b64)
            .map_err(|_| ScramError::Malformed("proof is not base64"))?;
        let mech = self.credential.mechanism;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let client_signature = mech.hmac(&self.credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(ScramError::AuthenticationFailed);
        }
        let client_key = xor(&proof, &client_signature);
        let matches: bool = mech
            .hash(&client_key)
            .ct_eq(&self.credential.stored_key)
            .into();
        // `known` is checked after the comparison so unknown users cost the same work.
        if !(matches && self.known) {
            return Err(ScramError::AuthenticationFailed);
        }
        let server_signature = mech.hmac(&self.credential.server_key, auth_message.as_bytes());
        let server_final = format!("v={}", B64.encode(server_signature)).into_bytes();
        Ok((server_final, self.user))
    }
}

/// Splits `gs2-header` from `client-first-message-bare`; accepts only `n,,` and `y,,`.
fn split_gs2_header(msg: &str) -> Result<(&str, &str), ScramError> {
    let mut it = msg.splitn(3, ',');
    match (it.next(), it.next(), it.next()) {
        // The match proves `msg` starts with the three ASCII bytes `n,,` or `y,,`.
        (Some("n" | "y"), Some(""), Some(bare)) => Ok((&msg[..3], bare)),
        (Some(_), Some(_), Some(_)) => Err(ScramError::UnsupportedChannelBinding),
        _ => Err(ScramError::Malformed("client-first lacks a gs2 header")),
    }
}
