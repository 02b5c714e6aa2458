//! mongoguard: a MongoDB wire-protocol guard proxy.
//!
//! # Architecture
//! Data flows one way: bytes → frames → views → decision → forward or answer.
//!
//! - [`wire`]: the wire protocol, sans-IO. A length-checked codec producing zero-copy
//!   [`wire::Frame`]s and validated borrowed views of every opcode (OP_MSG, OP_QUERY,
//!   OP_REPLY, the legacy writes, OP_COMPRESSED), plus the encoders for replies mongoguard
//!   sends itself.
//! - [`config`]: the typed, validated configuration (TOML file + CLI overrides).
//! - [`upstream`]: where the upstream is (URI parsing) and how to connect to it.
//! - [`proxy`]: the listener, the per-client session loop, hello handling and graceful
//!   shutdown.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod audit;
pub mod check;
pub mod command;
pub mod config;
pub mod policy;
pub mod proxy;
pub mod upstream;
pub mod wire;
