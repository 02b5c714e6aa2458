//! SIGHUP and the configuration file. Nothing in the configuration file is applied while
//! mongoguard runs (the files it names are: policy, allowlist, users, TLS, admin token), but
//! an operator who edits it and runs `systemctl reload` expects the change to take, and a
//! silently ignored `listen` or `mode` is found out much later. At every SIGHUP the file is
//! read again (as at start: the file, then the command line's overrides) and compared with
//! the running configuration: every setting that differs is logged at `warn` as needing a
//! restart, and listed by `GET /config` on the admin API.

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use tracing::{info, warn};

use crate::config::Config;

/// Reads the configuration again the way the running one was read (`main`: the file, then the
/// command line's overrides, then validation).
pub type ConfigSource = Arc<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// What the last check found.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConfigStatus {
    /// Dotted keys (`proxy.listen`) whose value in the file differs from the running one.
    pub changed: Vec<String>,
    /// The file could not be read or is invalid now (a restart would fail).
    pub error: Option<String>,
    /// When the file was last checked (`None`: never, or not started from a file).
    pub checked: Option<SystemTime>,
}

/// The check: the configuration mongoguard started with (before a `mongodb+srv://` URI was
/// resolved) and how to read it again.
pub(crate) struct ConfigCheck {
    source: Option<ConfigSource>,
    running: Arc<Config>,
    status: Mutex<ConfigStatus>,
}

impl ConfigCheck {
    pub(crate) fn new(source: Option<ConfigSource>, running: Arc<Config>) -> ConfigCheck {
        ConfigCheck {
            source,
            running,
            status: Mutex::new(ConfigStatus::default()),
        }
    }

    /// Whether there is a file to check (`false`: started without `--config`, or embedded).
    pub(crate) fn has_source(&self) -> bool {
        self.source.is_some()
    }

    /// The last check's outcome.
    pub(crate) fn status(&self) -> ConfigStatus {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the file again and says (log, status) what differs from the running
    /// configuration. Applies nothing.
    pub(crate) fn check(&self) {
        let Some(source) = &self.source else {
            return;
        };
        let mut status = ConfigStatus {
            checked: Some(SystemTime::now()),
            ..ConfigStatus::default()
        };
        match source() {
            Ok(fresh) => {
                status.changed = differences(&self.running, &fresh);
                if status.changed.is_empty() {
                    info!("SIGHUP: the configuration file matches the running configuration");
                } else {
                    warn!(
                        changed = %status.changed.join(", "),
                        "SIGHUP: the configuration file changed, and these settings are NOT in \
                         force: they need a restart (the running values stay)"
                    );
                }
            }
            Err(e) => {
                warn!(error = %e, "SIGHUP: the configuration file is invalid now; a restart \
                    would fail; the running configuration stays");
                status.error = Some(e);
            }
        }
        *self
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = status;
    }
}

/// The dotted keys whose values differ between `a` and `b` (as the configuration prints with
/// `--check-config`; a secret is printed masked, so a changed secret alone is not seen).
pub(crate) fn differences(a: &Config, b: &Config) -> Vec<String> {
    let (Ok(a), Ok(b)) = (toml::Value::try_from(a), toml::Value::try_from(b)) else {
        return vec!["(the configuration cannot be compared)".to_owned()];
    };
    let mut out = Vec::new();
    walk("", &a, &b, &mut out);
    out
}

fn walk(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    match (a, b) {
        (toml::Value::Table(ta), toml::Value::Table(tb)) => {
            let mut keys: Vec<&String> = ta.keys().chain(tb.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (ta.get(k), tb.get(k)) {
                    (Some(x), Some(y)) => walk(&path, x, y, out),
                    _ => out.push(path),
                }
            }
        }
        _ if a != b => out.push(prefix.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_changed_keys() {
        let a = Config::default();
        let mut b = Config::default();
        assert!(differences(&a, &b).is_empty());
        b.proxy.listen = "127.0.0.1:27999".parse().unwrap();
        b.proxy.mode = crate::config::Mode::Pooled;
        b.proxy.drain_timeout = std::time::Duration::from_secs(5);
        assert_eq!(
            differences(&a, &b),
            vec!["proxy.drain_timeout", "proxy.listen", "proxy.mode"]
        );
    }
}
