//! Upstream identities: the credentials mongoguard authenticates its pooled upstream
//! connections with. `default` comes from the upstream URI (`mongodb://user:pw@host/?authSource=`);
//! others are configured under `[upstream.identities.NAME]` and chosen per client user by
//! `upstream = "NAME"` in the users file.

use std::{collections::HashMap, fmt, sync::Arc};

use crate::{
    auth::scram::Mechanism,
    config::{ConfigError, IdentityConfig, UpstreamConfig, UpstreamUri},
};

/// The identity of the URI's credentials (or of no credentials at all): the configuration's
/// constant, which its validation also uses.
pub use crate::config::DEFAULT_IDENTITY;

/// Credentials toward the upstream. The password is never printed.
#[derive(Clone)]
pub struct Credentials {
    /// The upstream user.
    pub username: String,
    password: String,
    /// The authentication database.
    pub source: String,
    /// A fixed mechanism; `None` picks from the upstream's `saslSupportedMechs`.
    pub mechanism: Option<Mechanism>,
}

impl Credentials {
    /// Credentials for `username` in `source`.
    pub fn new(
        username: impl Into<String>,
        password: impl Into<String>,
        source: impl Into<String>,
        mechanism: Option<Mechanism>,
    ) -> Credentials {
        Credentials {
            username: username.into(),
            password: password.into(),
            source: source.into(),
            mechanism,
        }
    }

    /// The password (never log it).
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("source", &self.source)
            .field("mechanism", &self.mechanism)
            .finish_non_exhaustive()
    }
}

/// A named upstream identity; `credentials: None` connects without authenticating.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The name pools are keyed by.
    pub name: String,
    /// What to authenticate with.
    pub credentials: Option<Credentials>,
}

/// Every upstream identity, by name; `default` is always among them.
#[derive(Debug, Clone)]
pub struct Identities {
    map: HashMap<String, Arc<Identity>>,
    default: Arc<Identity>,
}

impl Default for Identities {
    /// Only `default`, without credentials.
    fn default() -> Self {
        let default = Arc::new(Identity {
            name: DEFAULT_IDENTITY.to_owned(),
            credentials: None,
        });
        let map = HashMap::from([(DEFAULT_IDENTITY.to_owned(), default.clone())]);
        Identities { map, default }
    }
}

fn mechanism(value: Option<&str>, what: &str) -> Result<Option<Mechanism>, ConfigError> {
    match value {
        None => Ok(None),
        Some(m) => Mechanism::parse(m).map(Some).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "{what}: mechanism {m:?} is not supported (SCRAM-SHA-256 or SCRAM-SHA-1)"
            ))
        }),
    }
}

/// The URI's credentials: its user and password, authenticated against `authSource`, else
/// the URI's database, else `admin`.
fn uri_credentials(uri: &UpstreamUri) -> Result<Option<Credentials>, ConfigError> {
    let Some(user) = &uri.username else {
        return Ok(None);
    };
    Ok(Some(Credentials::new(
        user.clone(),
        uri.password().unwrap_or_default(),
        uri.option("authSource")
            .map(str::to_owned)
            .or_else(|| uri.database.clone())
            .unwrap_or_else(|| "admin".into()),
        mechanism(uri.option("authMechanism"), "upstream.uri authMechanism")?,
    )))
}

/// An identity's password, from exactly one of `password`, `password_env`, `password_file`
/// (its trailing newline removed).
fn password(ic: &IdentityConfig, what: &str) -> Result<String, ConfigError> {
    let sources = [
        ic.password.is_some(),
        ic.password_env.is_some(),
        ic.password_file.is_some(),
    ];
    let one_of = || {
        ConfigError::Invalid(format!(
            "{what}: set exactly one of password, password_env, password_file"
        ))
    };
    if sources.iter().filter(|s| **s).count() != 1 {
        return Err(one_of());
    }
    if let Some(p) = &ic.password {
        return Ok(p.clone());
    }
    if let Some(var) = &ic.password_env {
        return std::env::var(var).map_err(|_| {
            ConfigError::Invalid(format!("{what}: environment variable {var} is not set"))
        });
    }
    let Some(path) = ic.password_file.as_ref() else {
        return Err(one_of());
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::Invalid(format!("{what}: cannot read {}: {e}", path.display()))
    })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

impl Identities {
    /// Resolves `default` from the URI and the configured identities (reading password
    /// files and environment variables now, so a missing secret stops startup).
    pub fn from_config(cfg: &UpstreamConfig) -> Result<Identities, ConfigError> {
        let mut map = HashMap::new();
        let default = Arc::new(Identity {
            name: DEFAULT_IDENTITY.to_owned(),
            credentials: uri_credentials(&cfg.uri)?,
        });
        map.insert(DEFAULT_IDENTITY.to_owned(), default.clone());
        for (name, ic) in &cfg.identities {
            let what = format!("upstream.identities.{name}");
            let creds = Credentials::new(
                ic.username.clone(),
                password(ic, &what)?,
                ic.source.clone().unwrap_or_else(|| "admin".into()),
                mechanism(ic.mechanism.as_deref(), &what)?,
            );
            map.insert(
                name.clone(),
                Arc::new(Identity {
                    name: name.clone(),
                    credentials: Some(creds),
                }),
            );
        }
        // A configured identity named `default` replaces the URI's.
        let default = map.get(DEFAULT_IDENTITY).cloned().unwrap_or(default);
        Ok(Identities { map, default })
    }

    /// The identity called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Identity>> {
        self.map.get(name)
    }

    /// The `default` identity.
    pub fn default_identity(&self) -> &Arc<Identity> {
        &self.default
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_from_uri_and_named_from_config() {
        let mut cfg = UpstreamConfig {
            uri: "mongodb://app:s%40cret@h:1/appdb?authMechanism=SCRAM-SHA-1"
                .parse()
                .unwrap(),
            ..UpstreamConfig::default()
        };
        cfg.identities.insert(
            "reports".into(),
            toml::from_str("username = \"rep\"\npassword = \"pw\"").unwrap(),
        );
        let ids = Identities::from_config(&cfg).unwrap();
        let d = ids.default_identity().credentials.clone().unwrap();
        assert_eq!(
            (d.username.as_str(), d.password(), d.source.as_str()),
            ("app", "s@cret", "appdb")
        );
        assert_eq!(d.mechanism, Some(Mechanism::ScramSha1));
        let r = ids.get("reports").unwrap().credentials.clone().unwrap();
        assert_eq!((r.username.as_str(), r.source.as_str()), ("rep", "admin"));
        assert!(!format!("{r:?}").contains("pw"));
    }

    #[test]
    fn missing_or_ambiguous_secrets_are_errors() {
        let mut cfg = UpstreamConfig::default();
        cfg.identities.insert(
            "x".into(),
            toml::from_str("username = \"u\"\npassword_env = \"MONGOGUARD_TEST_SURELY_UNSET\"")
                .unwrap(),
        );
        assert!(Identities::from_config(&cfg).is_err());
        cfg.identities.insert(
            "x".into(),
            toml::from_str("username = \"u\"\npassword = \"a\"\npassword_file = \"/f\"").unwrap(),
        );
        assert!(Identities::from_config(&cfg).is_err());
        let ids = Identities::from_config(&UpstreamConfig::default()).unwrap();
        assert!(ids.default_identity().credentials.is_none());
    }
}
