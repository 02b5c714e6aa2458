//! The `[allowlist]` section: the learned allowlist of query shapes per application (rule
//! A001, README "Learned allowlist").

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use super::{duration, ConfigError};

/// What the allowlist does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AllowlistMode {
    /// Nothing.
    #[default]
    Off,
    /// Records the shapes each application sends into `file`.
    Learn,
    /// A shape the application did not send while learning fires A001.
    Enforce,
}

/// An application the allowlist file does not name, in enforce mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownApp {
    /// Its requests are not checked.
    Allow,
    /// Every shape it sends is new (fail closed).
    #[default]
    Enforce,
}

/// The `[allowlist]` section.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AllowlistConfig {
    /// `"off"` (the default), `"learn"` or `"enforce"`.
    pub mode: AllowlistMode,
    /// The allowlist file (TOML): written in learn mode, read in enforce mode.
    pub file: Option<PathBuf>,
    /// Enforce mode: what an application absent from the file gets.
    pub unknown_app: UnknownApp,
    /// Applications kept; beyond, learn mode stops adding (logged once) and enforce mode
    /// does not load the rest of the file (their shapes are unknown).
    pub max_apps: usize,
    /// Shapes kept per application, with the same overflow rule as `max_apps`.
    pub max_shapes_per_app: usize,
    /// Learn mode: how often new shapes are written to the file (and at shutdown).
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub save_interval: Duration,
}

impl Default for AllowlistConfig {
    fn default() -> Self {
        AllowlistConfig {
            mode: AllowlistMode::Off,
            file: None,
            unknown_app: UnknownApp::Enforce,
            max_apps: 200,
            max_shapes_per_app: 1000,
            save_interval: Duration::from_secs(30),
        }
    }
}

impl AllowlistConfig {
    /// `file` is needed unless the allowlist is off; the caps and the interval are positive.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.mode != AllowlistMode::Off && self.file.is_none() {
            return Err(ConfigError::Invalid(
                "allowlist.mode is learn or enforce but allowlist.file is not set".into(),
            ));
        }
        if self.max_apps == 0 || self.max_shapes_per_app == 0 {
            return Err(ConfigError::Invalid(
                "allowlist.max_apps and allowlist.max_shapes_per_app must be at least 1".into(),
            ));
        }
        if self.save_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "allowlist.save_interval must be more than 0".into(),
            ));
        }
        Ok(())
    }
}
