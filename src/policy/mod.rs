//! The policy engine: rules as data, evaluation as a pure, synchronous function.
//!
//! A [`Policy`] is compiled from TOML (`policies/*.toml`; the `standard` profile is built in)
//! into immutable data. [`Policy::evaluate`] reads a [`CommandView`] and returns a
//! [`Decision`]: it never performs I/O, never panics on input, allocates nothing when the
//! command is allowed, and turns any doubt about what a command does into a block (G001).

mod admin_rules;
mod compiled;
pub mod connections;
mod documents;
mod error;
mod evaluate;
mod file;
pub mod filter;
mod holder;
mod indexes;
pub mod measure;
mod plans;
mod queries;
mod rules;
#[cfg(test)]
mod vectors;
mod writes;

use std::net::IpAddr;

use bson::{RawBsonRef, RawDocument};
use serde::Deserialize;

pub use compiled::{MeasureParams, Params, Policy};
pub use error::PolicyError;
pub use file::{MAX_OVERRIDES, PROFILES};
pub use holder::{FileStamp, PolicyHolder, PolicySource};
pub use rules::{RuleId, RuleInfo, Scope, RULES, RULE_COUNT};

use crate::command::{CommandView, Namespace};

/// What a rule does when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Not checked.
    Off,
    /// Forward, and record a violation.
    Warn,
    /// Answer the client with an error, never forward, and record.
    Block,
}

impl Action {
    /// `"off" | "warn" | "block"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Off => "off",
            Action::Warn => "warn",
            Action::Block => "block",
        }
    }
}

/// Global (or per-override) mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Blocks block.
    Enforce,
    /// Every block becomes a warning: see what would break, break nothing.
    Audit,
}

impl Mode {
    /// `"enforce" | "audit"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

/// Who sent the request: what overrides match on, and upstream facts some rules need.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestContext<'a> {
    /// Application name from the handshake.
    pub app: Option<&'a str>,
    /// Authenticated user, when known.
    pub user: Option<&'a str>,
    /// Client address.
    pub client_ip: Option<IpAddr>,
    /// The upstream's maxWireVersion, when known (I001 needs it).
    pub upstream_wire_version: Option<i32>,
    /// The plan guard's verdict for this request's query shape, when known (Q006, Q007).
    pub plan: Option<PlanFacts>,
    /// createIndexes: how many indexes the collection has now, when known (I002).
    pub index_count: Option<usize>,
    /// The shard key fields of the request's collection, when it is sharded (Q008).
    pub shard_key: Option<&'a [String]>,
}

/// What the upstream's winning plan for a query shape does (the plan guard's verdict).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanFacts {
    /// A COLLSCAN stage: the collection is read whole.
    pub collscan: bool,
    /// A SORT stage: no index gives the order, so the server sorts in memory.
    pub in_memory_sort: bool,
}

/// One rule that fired.
#[derive(Clone, Copy)]
pub struct Violation<'a> {
    /// The rule.
    pub rule: RuleId,
    /// What is done about it (after overrides and mode): `Warn` or `Block`.
    pub action: Action,
    /// The statement index in a batch, for statement-level rules.
    pub statement: Option<usize>,
    /// The filter involved, for shape rendering in the record.
    pub filter: Option<&'a RawDocument>,
    /// For G001: what could not be read.
    pub detail: Option<&'static str>,
}

/// A multi-document write whose filter is neither proved to match every document nor proved
/// selective (verdict `unknown`): the proxy measures it against the data before it forwards
/// or blocks the command. Unknown never means allow.
#[derive(Clone, Copy)]
pub struct Measurement<'a> {
    /// The statement's index in the batch.
    pub statement: usize,
    /// The namespace it writes.
    pub ns: Namespace<'a>,
    /// Its filter.
    pub filter: &'a RawDocument,
    /// Its collation.
    pub collation: Option<&'a RawDocument>,
    /// Its hint.
    pub hint: Option<RawBsonRef<'a>>,
    /// For an aggregate that `$merge`s into existing documents: its pipeline. Then what is
    /// measured is how many documents the stages before `$merge` put out (each updates at
    /// most one document of the target), not `filter` (the `$merge` stage, for the record).
    pub pipeline: Option<&'a bson::RawArray>,
    /// W001 (an update) or W003 (a delete): what a filter measured to match every document
    /// of a non-empty collection fires.
    pub rule: RuleId,
    /// For a TTL index (createIndexes, collMod): what the TTL monitor's first pass deletes.
    /// Then what is measured is [`Ttl::filter`] (built when the proxy measures, from its
    /// clock), not `filter` (the index spec, for the record).
    pub ttl: Option<Ttl<'a>>,
}

/// A TTL the TTL monitor applies: each pass deletes, through the index, the documents whose
/// indexed field (the key pattern's first field) holds a date (or an array holding one) at
/// or before `now - expireAfterSeconds`: `{field: {$gte: <dawn of time>, $lte:
/// <expiration>}}` over the index's documents (its `partialFilterExpression`), with `now`
/// the pass's time (src/mongo/db/ttl/ttl.cpp `_deleteExpiredWithIndex`; the passes run every
/// `ttlMonitorSleepSecs`, 60 s by default). A clustered collection's collection-level TTL
/// does the same on `_id`, a time-series collection's on whole buckets of its time field
/// (`_deleteExpiredWithCollscan`): measured on the time field, a superset.
#[derive(Clone, Copy, Debug)]
pub struct Ttl<'a> {
    /// Which field holds the dates.
    pub field: TtlField<'a>,
    /// `expireAfterSeconds` (mongod's `safeNumberLong`: NaN is 0, fractions truncated).
    pub seconds: i64,
    /// The index's `partialFilterExpression` (only its documents are indexed and deleted).
    pub partial: Option<&'a RawDocument>,
}

/// Where a TTL's dates are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlField<'a> {
    /// The index's key pattern names it (createIndexes `key`, collMod `keyPattern`).
    Path(&'a str),
    /// collMod names the index: the proxy looks its key pattern up (`listIndexes`).
    IndexNamed(&'a str),
    /// The collection-level TTL of a clustered (`_id`) or time-series (its time field)
    /// collection: the proxy looks its options up (`listCollections`).
    Collection,
}

impl Ttl<'_> {
    /// How far past `now` the measured expiration reaches: the monitor's first pass runs up
    /// to a minute after the index is built (`ttlMonitorSleepSecs`), and the server's clock
    /// may be ahead of mongoguard's.
    pub const FIRST_PASS: std::time::Duration = std::time::Duration::from_secs(120);

    /// The filter of what the monitor's first pass deletes from the dates in `field`, for a
    /// measurement started at `now`: `{field: {$gte: <dawn of time>, $lte: now + FIRST_PASS -
    /// seconds}}`, and the index's partial filter.
    pub fn filter(
        field: &str,
        seconds: i64,
        partial: Option<&RawDocument>,
        now: std::time::SystemTime,
    ) -> bson::RawDocumentBuf {
        let now = bson::DateTime::from_system_time(now).timestamp_millis();
        let slack = i64::try_from(Self::FIRST_PASS.as_millis()).unwrap_or(i64::MAX);
        let expiration = now
            .saturating_add(slack)
            .saturating_sub(seconds.saturating_mul(1000));
        let mut range = bson::RawDocumentBuf::new();
        range.append(bson::cstr!("$gte"), bson::DateTime::from_millis(i64::MIN));
        range.append(bson::cstr!("$lte"), bson::DateTime::from_millis(expiration));
        let mut expired = bson::RawDocumentBuf::new();
        match <&bson::raw::CStr>::try_from(field) {
            Ok(field) => expired.append(field, range),
            // A field name with a NUL cannot be indexed (mongod refuses the index): nothing.
            Err(_) => expired.append(bson::cstr!("$expr"), false),
        }
        match partial {
            Some(p) => bson::rawdoc! {"$and": [expired, p.to_owned()]},
            None => expired,
        }
    }
}

/// What the measurements of one request decide, resolved for that request (overrides and
/// mode applied): the actions of W001, W003, W012 and of a failed measurement.
#[derive(Clone, Copy, Debug)]
pub struct MeasureActions {
    /// W001's action.
    pub w001: Action,
    /// W003's action.
    pub w003: Action,
    /// W012's action (`Off`: counting past `max_docs` is not needed).
    pub w012: Action,
    /// `measure.on_error` (a block becomes a warning in audit mode).
    pub on_error: Action,
    /// W012's threshold.
    pub max_docs: u64,
    /// `maxTimeMS` of each measuring query.
    pub time_limit: std::time::Duration,
}

impl MeasureActions {
    /// The action of a rule a measurement fires (W001, W003 or W012).
    pub fn action(&self, rule: RuleId) -> Action {
        match rule {
            RuleId::W001 => self.w001,
            RuleId::W003 => self.w003,
            RuleId::W012 => self.w012,
            _ => self.on_error,
        }
    }
}

/// The most statements of one request that are measured; a request with more unknown
/// multi-document writes gets `measure.on_error` for the rest (each measurement is two
/// queries upstream, and the client waits for all of them).
pub const MAX_MEASURED_STATEMENTS: usize = 16;

/// The most violations of one rule (with one action) a [`Decision`] lists one by one; the
/// rest of that rule's statements are counted in [`Decision::unlisted`]. Keeps evaluation,
/// records and the client's errmsg bounded whatever the size of a batch.
pub const MAX_LISTED_PER_RULE: usize = 8;

/// Violations of one rule, with one action, that fired but are not listed in
/// [`Decision::violations`] (past [`MAX_LISTED_PER_RULE`]): "and N more statements".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unlisted {
    /// The rule.
    pub rule: RuleId,
    /// Their action (`Warn` or `Block`); at least [`MAX_LISTED_PER_RULE`] violations of the
    /// same rule and action are listed, so [`Decision::verdict`] is unchanged by the cap.
    pub action: Action,
    /// How many.
    pub count: u64,
}

/// The outcome of evaluating one command.
#[derive(Clone, Debug)]
pub struct Decision<'a> {
    /// Every violation, in rule order of checking. Empty (and unallocated) when allowed.
    /// At most [`MAX_LISTED_PER_RULE`] per rule and action.
    pub violations: Vec<Violation<'a>>,
    /// The violations counted but not listed, by rule and action, in rule order (empty and
    /// unallocated unless some rule fired on more than [`MAX_LISTED_PER_RULE`] statements).
    pub unlisted: Vec<Unlisted>,
    /// The mode in force for this request.
    pub mode: Mode,
    /// The statements to measure before the command may be forwarded (empty and
    /// unallocated unless some multi-document write's filter is `unknown`).
    pub measure: Vec<Measurement<'a>>,
    /// The command's `let` (measuring queries carry it).
    pub let_vars: Option<&'a RawDocument>,
    /// What the measurements decide.
    pub measure_actions: MeasureActions,
}

impl<'a> Decision<'a> {
    /// A decision with these violations and nothing to measure.
    pub fn new(violations: Vec<Violation<'a>>, mode: Mode) -> Decision<'a> {
        Decision {
            violations,
            unlisted: Vec::new(),
            mode,
            measure: Vec::new(),
            let_vars: None,
            measure_actions: MeasureActions {
                w001: Action::Block,
                w003: Action::Block,
                w012: Action::Off,
                on_error: Action::Block,
                max_docs: 0,
                time_limit: std::time::Duration::ZERO,
            },
        }
    }

    /// The strongest action among the violations (`Off` when none fired).
    pub fn verdict(&self) -> Action {
        self.violations
            .iter()
            .map(|v| v.action)
            .max()
            .unwrap_or(Action::Off)
    }

    /// True when the command must not be forwarded.
    pub fn is_block(&self) -> bool {
        self.verdict() == Action::Block
    }

    /// How many more violations of `rule` (any action) fired than are listed: what an
    /// errmsg or a record says as "and N more statements" after the listed ones.
    pub fn unlisted(&self, rule: RuleId) -> u64 {
        self.unlisted
            .iter()
            .filter(|u| u.rule == rule)
            .map(|u| u.count)
            .sum()
    }

    /// How many violations fired in all, listed or not.
    pub fn total(&self) -> u64 {
        let listed = u64::try_from(self.violations.len()).unwrap_or(u64::MAX);
        self.unlisted
            .iter()
            .fold(listed, |n, u| n.saturating_add(u.count))
    }

    /// The violations that block.
    pub fn blocking(&self) -> impl Iterator<Item = &Violation<'_>> {
        self.violations.iter().filter(|v| v.action == Action::Block)
    }
}

impl Policy {
    /// Evaluates a command. Pure and synchronous; see the module docs.
    pub fn evaluate<'a>(&self, view: &CommandView<'a>, ctx: &RequestContext<'_>) -> Decision<'a> {
        evaluate::evaluate(self, view, ctx)
    }
}

crate::wire::debug_fields!(Violation<'a>, "Violation", rule, action, statement, detail);
crate::wire::debug_fields!(Measurement<'a>, "Measurement", statement, ns, rule);
