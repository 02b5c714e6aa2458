//! mongoguard: a MongoDB wire-protocol guard proxy.
//!
//! # Architecture
//! Data flows one way: bytes → frames → views → decision → forward or answer.
//!
//! - [`wire`]: the wire protocol, sans-IO. A length-checked codec producing zero-copy
//!   [`wire::Frame`]s and validated borrowed views of every opcode (OP_MSG, OP_QUERY,
//!   OP_REPLY, the legacy writes, OP_COMPRESSED), plus the encoders for replies mongoguard
//!   sends itself.
//! - [`command`]: [`command::CommandView`], one borrowed model of what a message asks for
//!   (statements, filters, written namespaces), whatever opcode carried it.
//! - [`policy`]: the rule pack compiled from TOML into an immutable policy, and
//!   `evaluate()`: pure, synchronous, allocation-free when allowed, failing closed.
//! - [`audit`]: violation records (JSON lines with literal-free shapes), dedup, sinks.
//! - [`check`]: `mongoguard check`, the rule pack applied to captured traffic.
//! - [`config`]: the typed, validated configuration (TOML file + CLI overrides), the upstream
//!   URI included; a leaf: it imports nothing else of the crate, the runtime layers convert
//!   from its settings types.
//! - [`upstream`]: connecting to the upstream: connections, identities, the pool, the topology.
//! - [`auth`]: authentication terminated by mongoguard, sans-IO: SCRAM (server side toward
//!   clients, client side toward mongod), the saslStart/saslContinue command layer and the
//!   users file.
//! - [`proxy`]: the listener, the per-client session loop, hello handling, enforcement of
//!   the policy, and graceful shutdown.
//! - [`metrics`]: the Prometheus registry (bounded labels) and the tables behind the admin
//!   API (clients, query shapes, recent violations).
//! - [`app`]: the composition root: builds the shared state and starts the proxy and the
//!   admin listener as siblings; [`app::Proxy::start`] is the entry point.
//! - `admin`: the admin HTTP listener (health, readiness, metrics, policy and reload, the
//!   tables, the status page).
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing
    )
)]
#![warn(missing_docs)]

mod admin;
pub mod allowlist;
pub mod app;
pub mod audit;
pub mod auth;
pub mod check;
pub mod command;
pub mod config;
#[doc(hidden)]
pub mod fuzz_logic;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod plan;
pub mod policy;
pub mod proxy;
#[cfg(test)]
mod reload_race;
pub mod text;
pub mod tls;
pub mod upstream;
pub mod wire;
