//! Target `config_parse`: arbitrary text as the configuration file.
//!
//! text → [`Config::from_toml_str`] (TOML, durations, sizes, the upstream URI, socket
//! addresses, every section's cross-field rules).
//!
//! What is asserted: no panic; a parse is deterministic (same text, same Debug output, or the
//! same error); what parses passes [`Config::validate`] again, keeps `max_message_size` within
//! its bounds, never listens off loopback in clear text without the explicit consent, and in
//! pooled mode has a valid pool; the Debug output (what `--check-config` prints) never depends
//! on the admin token or an identity password, and prints the URI with its password masked.

use crate::{
    config::{Config, Mode},
    upstream::pool::PoolConfig,
};

const ORIGIN: &str = "fuzz.toml";

/// Runs one input.
pub fn run(data: &[u8]) {
    let text = super::text(data);
    let parsed = Config::from_toml_str(&text, ORIGIN);
    let again = Config::from_toml_str(&text, ORIGIN);
    let config = match (parsed, again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "not deterministic");
            a
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "not deterministic");
            return;
        }
        (a, b) => {
            assert!(a.is_ok() == b.is_ok(), "parsed once, refused once");
            return;
        }
    };
    assert!(
        config.validate().is_ok(),
        "a parsed config does not validate"
    );
    let max = config.proxy.max_message_size;
    assert!((crate::wire::HEADER_LEN..=i32::MAX as usize).contains(&max));
    if !config.proxy.listen.ip().is_loopback() {
        assert!(
            config.tls.enabled() || config.proxy.allow_insecure_listener,
            "clear text off loopback without consent"
        );
    }
    if config.proxy.mode == Mode::Pooled {
        assert!(PoolConfig::from(&config.pool).validate().is_ok());
        assert!(config.auth.users_file.is_some() || config.auth.allow_unauthenticated);
    }
    check_secrets(&config);
}

fn check_secrets(config: &Config) {
    let shown = format!("{config:?}");
    let mut other = config.clone();
    other.admin.token = config.admin.token.as_ref().map(|t| format!("{t}-other"));
    for identity in other.upstream.identities.values_mut() {
        identity.password = identity.password.as_ref().map(|p| format!("{p}-other"));
    }
    assert_eq!(
        shown,
        format!("{other:?}"),
        "the Debug output depends on a secret"
    );
    // The URI is printed with its password masked in place: `mongodb://user:***@hosts...`
    // (`mongodb+srv://user:***@name...`).
    // (Its other parts are not secrets: a password written again in the database name, say,
    // is printed there.)
    let uri = &config.upstream.uri;
    if uri.password().is_some() {
        let user = uri.username.as_deref().unwrap_or_default();
        let scheme = if uri.srv.is_some() {
            "mongodb+srv"
        } else {
            "mongodb"
        };
        let masked = format!("UpstreamUri({scheme}://{user}:***@");
        assert!(shown.contains(&masked), "the URI's password is not masked");
    }
}
