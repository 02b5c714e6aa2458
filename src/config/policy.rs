//! The `[policy]` section: which rule pack is in force and how it is reloaded.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use super::duration;

/// The `[policy]` section.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A policy file (TOML). Absent: the built-in `standard` profile. A file that is missing
    /// or invalid at startup is an error, never a silent fallback.
    pub file: Option<PathBuf>,
    /// How often the file's modification time is checked for a reload (SIGHUP reloads at
    /// once). `"0"` disables the check.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub reload_poll: Duration,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            file: None,
            reload_poll: Duration::from_secs(2),
        }
    }
}
