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
    /// Digests of the secrets read from files named by the running configuration (an
    /// identity's `password_file`), as they were at start: their content is not in `running`.
    running_files: SecretFiles,
    status: Mutex<ConfigStatus>,
    /// Held by a check from reading the file to storing what it found: two SIGHUP checks at
    /// once (a signal and `ProxyHandle::hangup`) must never leave the older file's status.
    checking: Mutex<()>,
    #[cfg(test)]
    after_read: crate::reload_race::AfterRead,
}

impl ConfigCheck {
    pub(crate) fn new(source: Option<ConfigSource>, running: Arc<Config>) -> ConfigCheck {
        let running_files = if source.is_some() {
            secret_files(&running)
        } else {
            SecretFiles::new()
        };
        ConfigCheck {
            source,
            running,
            running_files,
            status: Mutex::new(ConfigStatus::default()),
            checking: Mutex::new(()),
            #[cfg(test)]
            after_read: Default::default(),
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
        let _one_at_a_time = self
            .checking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut status = ConfigStatus {
            checked: Some(SystemTime::now()),
            ..ConfigStatus::default()
        };
        let read = source();
        #[cfg(test)]
        self.after_read.run();
        match read {
            Ok(fresh) => {
                status.changed = differences(&self.running, &fresh);
                // A secret file's content (same path, new password) is not in the
                // configuration: compared by digest, named without its value.
                let files = secret_files(&fresh);
                for (key, digest) in &files {
                    if self.running_files.get(key) != Some(digest) && !status.changed.contains(key)
                    {
                        status.changed.push(format!("{key} (content)"));
                    }
                }
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
/// `--check-config`), secrets included: those print masked, so they are compared by value
/// here and named, never shown. (A changed secret alone used to be missed: SIGHUP said "the
/// configuration file matches" while the old token or password stayed in force.)
pub(crate) fn differences(a: &Config, b: &Config) -> Vec<String> {
    let (Ok(ta), Ok(tb)) = (toml::Value::try_from(a), toml::Value::try_from(b)) else {
        return vec!["(the configuration cannot be compared)".to_owned()];
    };
    let mut out = Vec::new();
    walk("", &ta, &tb, &mut out);
    fn secret(out: &mut Vec<String>, key: String, x: Option<&str>, y: Option<&str>) {
        if x != y && !out.contains(&key) {
            out.push(key);
        }
    }
    secret(
        &mut out,
        "admin.token".into(),
        a.admin.token.as_deref(),
        b.admin.token.as_deref(),
    );
    // The URI prints with its password and secret options masked: when nothing else in it
    // changed, compare those.
    if !out.iter().any(|k| k == "upstream.uri") {
        secret(
            &mut out,
            "upstream.uri (password)".into(),
            a.upstream.uri.password(),
            b.upstream.uri.password(),
        );
        if a.upstream.uri.options != b.upstream.uri.options {
            secret(
                &mut out,
                "upstream.uri (options)".into(),
                Some("a"),
                Some("b"),
            );
        }
    }
    for (name, ia) in &a.upstream.identities {
        if let Some(ib) = b.upstream.identities.get(name) {
            secret(
                &mut out,
                format!("upstream.identities.{name}.password"),
                ia.password.as_deref(),
                ib.password.as_deref(),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Digests (SHA-256) of the secret files a configuration names, by dotted key: an identity's
/// `password_file` (regular files only, bounded, as every file read at SIGHUP; unreadable
/// gives a digest of nothing, which differs from any readable content).
type SecretFiles = std::collections::BTreeMap<String, Vec<u8>>;

fn secret_files(config: &Config) -> SecretFiles {
    use sha2::Digest as _;
    let mut out = SecretFiles::new();
    for (name, ic) in &config.upstream.identities {
        if let Some(path) = &ic.password_file {
            let digest = match crate::config::read_text_file(path, true) {
                Ok(text) => sha2::Sha256::digest(text.trim_end_matches(['\n', '\r'])).to_vec(),
                Err(_) => Vec::new(),
            };
            out.insert(format!("upstream.identities.{name}.password_file"), digest);
        }
    }
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

    /// A secret alone changed in the file (the admin token, the URI's password, an
    /// identity's inline password): these print masked, so the comparison of the printed
    /// configurations saw nothing, and SIGHUP said "the configuration file matches the
    /// running configuration" while the old secret stayed in force. Named, never shown.
    #[test]
    fn a_changed_secret_alone_is_named_without_its_value() {
        let text = |token: &str, pw: &str, ipw: &str| {
            format!(
                "[admin]\ntoken = \"{token}\"\n[upstream]\nuri = \"mongodb://u:{pw}@h:1\"\n\
                 [upstream.identities.app]\nusername = \"a\"\npassword = \"{ipw}\"\n"
            )
        };
        let a = Config::from_toml_str(&text("t1", "p1", "i1"), "t").unwrap();
        let same = Config::from_toml_str(&text("t1", "p1", "i1"), "t").unwrap();
        assert!(differences(&a, &same).is_empty());
        let b = Config::from_toml_str(&text("t2", "p2", "i2"), "t").unwrap();
        let changed = differences(&a, &b);
        assert_eq!(
            changed,
            vec![
                "admin.token",
                "upstream.identities.app.password",
                "upstream.uri (password)"
            ]
        );
        for secret in ["t1", "t2", "p1", "p2", "i1", "i2"] {
            assert!(!changed.iter().any(|k| k.contains(secret)), "{changed:?}");
        }
    }

    /// An identity's `password_file` whose content alone changed: the same path in the file,
    /// so nothing differed, and the old password stayed in force unnoticed. SIGHUP now names
    /// it as needing a restart.
    #[test]
    fn a_password_file_whose_content_changed_is_named() {
        let dir = std::env::temp_dir().join(format!("mg-cfgcheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pw = dir.join("pw");
        std::fs::write(&pw, "old\n").unwrap();
        let text = format!(
            "[upstream.identities.app]\nusername = \"a\"\npassword_file = \"{}\"\n",
            pw.display()
        );
        let running = Arc::new(Config::from_toml_str(&text, "t").unwrap());
        let again = text.clone();
        let source: ConfigSource =
            Arc::new(move || Config::from_toml_str(&again, "t").map_err(|e| e.to_string()));
        let check = ConfigCheck::new(Some(source), running);
        check.check();
        assert!(check.status().changed.is_empty(), "{:?}", check.status());
        std::fs::write(&pw, "new\n").unwrap();
        check.check();
        assert_eq!(
            check.status().changed,
            vec!["upstream.identities.app.password_file (content)"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// SIGHUP and `ProxyHandle::hangup` at once: each check read the configuration file and
    /// then stored what it found, unserialised, so the check that read the older file could
    /// store last: `GET /config` and the restart-pending gauge then described a file no
    /// longer on disk (a change reported as none, or a reverted one still reported).
    #[test]
    fn concurrent_checks_never_store_the_older_file() {
        let text = Arc::new(Mutex::new(String::new()));
        let t = text.clone();
        let source: ConfigSource = Arc::new(move || {
            let now = t.lock().unwrap().clone();
            Config::from_toml_str(&now, "t").map_err(|e| e.to_string())
        });
        let check = Arc::new(ConfigCheck::new(Some(source), Arc::new(Config::default())));
        let c = check.clone();
        crate::reload_race::two_reloads(
            &check.after_read,
            move || {
                c.check();
                Ok::<(), ()>(())
            },
            || *text.lock().unwrap() = "[proxy]\ndrain_timeout = \"5s\"\n".to_owned(),
        );
        assert_eq!(
            check.status().changed,
            vec!["proxy.drain_timeout"],
            "an older read of the configuration file was stored over a newer one"
        );
    }
}
