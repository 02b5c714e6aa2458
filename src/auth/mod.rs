//! Authentication terminated by mongoguard (pooled mode).
//!
//! Everything here is sans-IO: byte strings and BSON documents in, byte strings and BSON
//! documents out. The proxy owns the sockets and one [`sasl::SaslSession`] per client.
//!
//! - [`scram`]: SCRAM-SHA-256 and SCRAM-SHA-1 (RFC 5802 / RFC 7677, MongoDB flavour): stored
//!   credentials, the server-side conversation (toward clients) and the client-side
//!   conversation (toward mongod).
//! - [`sasl`]: the MongoDB command layer: `saslStart`, `saslContinue`, hello's
//!   `speculativeAuthenticate` and `saslSupportedMechs`.
//! - [`users`]: the users file holding SCRAM secrets (never passwords): load, validate,
//!   look up, and append a new user.

pub mod sasl;
pub mod scram;
pub mod users;
