//! The `[admin]` section: the admin HTTP listener (metrics, health, policy, status page).

use std::{net::SocketAddr, path::PathBuf};

use serde::Deserialize;

use super::ConfigError;

/// The `[admin]` section: the admin HTTP listener (metrics, health, policy, status page).
#[derive(Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Where the admin listener binds; `""` or `"off"` disables it.
    #[serde(
        deserialize_with = "deserialize_admin_listen",
        serialize_with = "serialize_admin_listen"
    )]
    pub listen: Option<SocketAddr>,
    /// Bearer token required on every endpoint except `/healthz`.
    #[serde(serialize_with = "super::mask::secret")]
    pub token: Option<String>,
    /// A file holding the bearer token (trailing whitespace ignored).
    pub token_file: Option<PathBuf>,
    /// Distinct application names kept in metric labels and tables; the rest are "other".
    pub app_name_cap: usize,
    /// Recent violations kept for `/violations`.
    pub violations_buffer: usize,
    /// Query shapes kept (least recently used evicted) for `/shapes`.
    pub shapes_capacity: usize,
}

/// Never prints the token (`--check-config` prints the configuration).
impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("app_name_cap", &self.app_name_cap)
            .field("violations_buffer", &self.violations_buffer)
            .field("shapes_capacity", &self.shapes_capacity)
            .finish()
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9216))),
            token: None,
            token_file: None,
            app_name_cap: 50,
            violations_buffer: 1000,
            shapes_capacity: 1000,
        }
    }
}

impl AdminConfig {
    /// The bearer token: `token`, or the trimmed contents of `token_file`.
    pub fn load_token(&self) -> Result<Option<String>, ConfigError> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), None) => t.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "admin: set token or token_file, not both".into(),
                ))
            }
        };
        if token.is_empty() {
            return Err(ConfigError::Invalid("admin: the token is empty".into()));
        }
        Ok(Some(token))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.token.is_some() && self.token_file.is_some() {
            return Err(ConfigError::Invalid(
                "admin: set token or token_file, not both".into(),
            ));
        }
        if let Some(addr) = self.listen {
            if !addr.ip().is_loopback() && self.token.is_none() && self.token_file.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "admin.listen = {addr} is not a loopback address: set admin.token or \
                     admin.token_file (or listen on 127.0.0.1)"
                )));
            }
        }
        for (name, v) in [
            ("app_name_cap", self.app_name_cap),
            ("violations_buffer", self.violations_buffer),
            ("shapes_capacity", self.shapes_capacity),
        ] {
            if v == 0 || v > 1_000_000 {
                return Err(ConfigError::Invalid(format!(
                    "admin.{name} must be between 1 and 1000000"
                )));
            }
        }
        Ok(())
    }
}

fn serialize_admin_listen<S: serde::Serializer>(
    v: &Option<SocketAddr>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(addr) => s.collect_str(addr),
        None => s.serialize_str("off"),
    }
}

fn deserialize_admin_listen<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    match text.trim() {
        "" | "off" => Ok(None),
        t => t.parse().map(Some).map_err(serde::de::Error::custom),
    }
}
