//! # mongoguard-standin: a MongoDB wire-protocol **test stand-in**
//!
//! **This is not a database.** It is an in-memory fake of a standalone `mongod` (optionally
//! presenting itself as a one-member replica set, or as the members of a [`ReplicaSet`]) that
//! exists only so that mongoguard's integration tests, benchmarks and demo can run without a
//! real MongoDB server. Nothing is
//! persisted, there are no real transactions, no journaling, no secondary indexes (index specs
//! are stored and listed, `unique` is not enforced), and query semantics are a best-effort subset
//! of MongoDB's. Never put data you care about in it.
//!
//! It speaks the wire protocol the way `mongod` does, with its own framing code (deliberately
//! independent of the `mongoguard` crate, so that it is an honest peer for testing mongoguard's
//! codec): OP_MSG (checksums, document sequences, `moreToCome`, `exhaustAllowed`), OP_QUERY
//! commands and legacy finds answered with OP_REPLY, OP_COMPRESSED (snappy, zlib, zstd), and the
//! legacy OP_INSERT / OP_UPDATE / OP_DELETE / OP_GET_MORE / OP_KILL_CURSORS opcodes.
//!
//! Unmodified drivers (the Rust `mongodb` crate 3.x, pymongo 4.x) connect, authenticate with
//! SCRAM-SHA-1 / SCRAM-SHA-256, run CRUD, aggregate, cursors (including exhaust getMore) and
//! streaming (awaitable, exhaust) `hello` monitoring against it.
//!
//! Faults can be injected at run time with [`StandIn::set_fault`] to test how a proxy behaves
//! when its upstream misbehaves.
//!
//! [`ReplicaSet`] runs several stand-ins as the members of one replica set sharing a single
//! store (perfect replication), with real roles in `hello`, `NotWritablePrimary` /
//! `NotPrimaryNoSecondaryOk` refusals on secondaries, and [`ReplicaSet::step_down`] (with a
//! configurable gap without primary) for failover tests.
//!
//! Two control commands serve out-of-process tests; they need no authentication and work
//! against any database:
//!
//! * `{standinStats: 1, reset: <bool>}` replies `{connectionsAccepted, connectionsOpen,
//!   connectionsOpenMax (the most open at once since start or the last reset: then the number
//!   open), authentications, messages, compressedMessages, commands: {<lower-case name>: n}, member, isWritablePrimary,
//!   ok: 1}` (counts int64, `member` int32) for the member that receives it; `reset: true` zeroes
//!   the counters (see [`Stats::reset`]) right after reading them. The request is counted
//!   honestly: its connection is in `connectionsAccepted` / `connectionsOpen` (asking through a
//!   fresh connection adds 1 to both, which a test should subtract) and the request itself in
//!   `messages` and `commands.standinstats`.
//! * `{standinStepDown: 1, newPrimary: <int, default: the next member>, gapMs: <int, default
//!   1000>}` runs [`ReplicaSet::step_down`] and replies `{ok: 1, newPrimary, gapMs}` at once; on a
//!   stand-in that is not a member of a [`ReplicaSet`] it fails with
//!   `{ok: 0, code: 20, codeName: "IllegalOperation", errmsg: "not a replica set"}`.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use mongoguard_standin::{StandIn, StandInConfig};
//! let standin = StandIn::start(StandInConfig::default()).await?;
//! println!("connect to {}", standin.uri());
//! standin.shutdown().await;
//! # Ok(()) }
//! ```

mod bsonutil;
mod commands;
mod compression;
mod conn;
mod cursor;
mod failpoint;
mod fault;
mod projection;
mod query;
mod replset;
mod scram;
mod server;
mod stats;
mod store;
mod txn;
mod update;
mod wire;

pub use fault::Fault;
pub use replset::{ReplicaSet, ReplicaSetConfig};
pub use server::StandIn;
pub use stats::Stats;

use std::net::SocketAddr;

/// Configuration of a [`StandIn`].
#[derive(Debug, Clone)]
pub struct StandInConfig {
    /// Address to listen on; port 0 picks a free port (see [`StandIn::addr`]).
    pub listen: SocketAddr,
    /// `maxWireVersion` reported in `hello` (21 = MongoDB 7.0). The `buildInfo` version is
    /// derived from it (8 -> 4.2.0, 13 -> 5.0.0, 17 -> 6.0.0, 21 -> 7.0.0, 25 -> 8.0.0). From 17
    /// up the legacy opcodes are refused as mongod 6.0+ refuses them (OP_QUERY only for
    /// hello/isMaster and a few deprecated commands); use 13 to test legacy opcodes.
    pub wire_version: i32,
    /// `(user, password)` pairs, all defined in database `admin`. Empty = no auth required.
    pub users: Vec<(String, String)>,
    /// `Some(name)`: `hello` presents a one-member replica set primary named `name` (for
    /// several members sharing one store, with step-downs, see [`ReplicaSet`]).
    pub replica_set: Option<String>,
    /// Compressors offered in `hello` negotiation (subset of "snappy", "zlib", "zstd").
    pub compressors: Vec<String>,
    /// Behave like a mongos reached through a load balancer: every connection's first hello
    /// must say `loadBalanced: true` (else LoadBalancerSupportMismatch, 354) and its reply
    /// carries this process's `serviceId`, as src/mongo/s/load_balancer_support.cpp does.
    pub load_balanced: bool,
}

impl Default for StandInConfig {
    fn default() -> Self {
        StandInConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            wire_version: 21,
            users: Vec::new(),
            replica_set: None,
            compressors: vec!["snappy".into(), "zlib".into(), "zstd".into()],
            load_balanced: false,
        }
    }
}

/// The server version string reported for a wire version.
pub(crate) fn version_for_wire(wire_version: i32) -> &'static str {
    match wire_version {
        i32::MIN..=7 => "4.0.0",
        8..=8 => "4.2.0",
        9..=12 => "4.4.0",
        13..=16 => "5.0.0",
        17..=20 => "6.0.0",
        21..=24 => "7.0.0",
        _ => "8.0.0",
    }
}
