//! The `[plan]` section: the plan guard (rules Q006 collection-scan and Q007 in-memory-sort),
//! which explains each new query shape once, off the request path.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::{duration, ConfigError};

/// When the plan guard runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlanEnabled {
    /// Pooled mode: on. Passthrough: on when the upstream URI holds credentials (the explain
    /// runs as that identity), else off with a warning at startup.
    #[default]
    Auto,
    /// On, even in passthrough without credentials (an upstream that needs none).
    On,
    /// Off: Q006 and Q007 never fire.
    Off,
}

/// The `[plan]` section.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanConfig {
    /// `auto`, `on` or `off`.
    pub enabled: PlanEnabled,
    /// Most explains started per second (new shapes beyond wait for a later request).
    pub explains_per_second: u32,
    /// Most explains running at once (each on its own upstream connection).
    pub max_in_flight: usize,
    /// How long a verdict is trusted before the shape is explained again (index changes
    /// mongoguard forwards invalidate it at once).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub ttl: Duration,
    /// Most shapes with a verdict kept (least recently explained dropped first).
    pub max_shapes: usize,
    /// Budget of one explain (connect included).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub explain_timeout: Duration,
    /// Shard keys declared for Q008, `"db.coll" = ["field", ...]` (key order). Behind mongos
    /// they are also read from `config.collections` (declared ones win).
    pub shard_keys: BTreeMap<String, Vec<String>>,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            enabled: PlanEnabled::Auto,
            explains_per_second: 10,
            max_in_flight: 2,
            ttl: Duration::from_secs(600),
            max_shapes: 10_000,
            explain_timeout: Duration::from_secs(5),
            shard_keys: BTreeMap::new(),
        }
    }
}

impl PlanConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.explains_per_second == 0 || self.max_in_flight == 0 || self.max_shapes == 0 {
            return Err(ConfigError::Invalid(
                "plan: explains_per_second, max_in_flight and max_shapes must be at least 1 \
                 (enabled = \"off\" turns the plan guard off)"
                    .into(),
            ));
        }
        for (ns, key) in &self.shard_keys {
            let valid_ns = ns
                .split_once('.')
                .is_some_and(|(db, coll)| !db.is_empty() && !coll.is_empty());
            if !valid_ns || key.is_empty() || key.iter().any(String::is_empty) {
                return Err(ConfigError::Invalid(format!(
                    "plan.shard_keys: {ns:?} must be \"db.collection\" = [\"field\", ...]"
                )));
            }
        }
        if self.ttl.is_zero() || self.explain_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "plan: ttl and explain_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }
}
