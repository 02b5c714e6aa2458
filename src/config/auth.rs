//! The `[auth]` section (pooled mode): client authentication terminated by mongoguard.

use std::{net::SocketAddr, path::PathBuf};

use serde::Deserialize;

use super::ConfigError;

/// The `[auth]` section (pooled mode).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The users file: SCRAM secrets of the users clients authenticate as
    /// (`mongoguard users add`). Required in pooled mode unless `allow_unauthenticated`.
    pub users_file: Option<PathBuf>,
    /// Serve clients that do not authenticate, as the `default` upstream identity. Only
    /// allowed when the listener is on a loopback address.
    pub allow_unauthenticated: bool,
}

impl AuthConfig {
    /// Pooled mode serves only authenticated clients, unless unauthenticated access was asked
    /// for on a loopback `listen` address.
    pub(super) fn validate_pooled(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        if self.users_file.is_none() && !self.allow_unauthenticated {
            return Err(ConfigError::Invalid(
                "proxy.mode = \"pooled\" terminates client authentication: set auth.users_file \
                 (see `mongoguard users add`), or auth.allow_unauthenticated = true on a \
                 loopback listener"
                    .into(),
            ));
        }
        if self.allow_unauthenticated && !listen.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "auth.allow_unauthenticated is only allowed on a loopback listener, not {listen}"
            )));
        }
        Ok(())
    }
}
