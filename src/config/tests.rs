//! Config file parsing and the cross-section rules.

use std::net::SocketAddr;

use super::*;

#[test]
fn example_config_parses() {
    let text = include_str!("../../mongoguard.example.toml");
    let c = Config::from_toml_str(text, "mongoguard.example.toml").unwrap();
    assert_eq!(c.proxy.mode, Mode::Passthrough);
}

#[test]
fn unknown_key_is_an_error_with_a_line_number() {
    let err = Config::from_toml_str(
        "[proxy]\nlisten = \"127.0.0.1:1\"\nlisten_addr = 1\n",
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("t.toml"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("listen_addr"), "{err}");
}

#[test]
fn bad_values_rejected() {
    assert!(Config::from_toml_str("[proxy]\nclient_idle_timeout = \"5 parsecs\"\n", "t").is_err());
    // Pooled mode needs a users file or explicit unauthenticated access on loopback.
    assert!(Config::from_toml_str("[proxy]\nmode = \"pooled\"\n", "t").is_err());
    assert!(Config::from_toml_str(
        "[proxy]\nmode = \"pooled\"\nlisten = \"0.0.0.0:1\"\n[auth]\nallow_unauthenticated = true\n",
        "t"
    )
    .is_err());
    let ok = Config::from_toml_str(
        "[proxy]\nmode = \"pooled\"\n[auth]\nallow_unauthenticated = true\n[pool]\npool_size = 3\n",
        "t",
    )
    .unwrap();
    assert_eq!(ok.pool.pool_size, 3);
    assert!(Config::from_toml_str(
        "[proxy]\nmode = \"pooled\"\n[auth]\nusers_file = \"u\"\n[pool]\npool_size = 2\nmin_idle = 3\n",
        "t"
    )
    .is_err());
    assert!(Config::from_toml_str(
        "[proxy]\nmode = \"pooled\"\n[auth]\nusers_file = \"u\"\n[upstream.identities.default]\nusername = \"x\"\n",
        "t"
    )
    .is_err());
    assert!(Config::from_toml_str("[upstream]\nuri = \"http://x\"\n", "t").is_err());
    assert!(Config::from_toml_str("[proxy]\nmax_client_connections = 0\n", "t").is_err());
    let err = Config::from_toml_str("[proxy]\nthreads = 1025\n", "t").unwrap_err();
    assert!(err.to_string().contains("proxy.threads"), "{err}");
    assert!(Config::from_toml_str("[proxy]\nthreads = -1\n", "t").is_err());
    let c = Config::from_toml_str("[proxy]\nthreads = 3\n", "t").unwrap();
    assert_eq!(c.proxy.threads, 3);
}

#[test]
fn non_loopback_listener_needs_tls_or_explicit_consent() {
    let err = Config::from_toml_str("[proxy]\nlisten = \"0.0.0.0:27017\"\n", "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("allow_insecure_listener"), "{err}");
    Config::from_toml_str(
        "[proxy]\nlisten = \"0.0.0.0:27017\"\nallow_insecure_listener = true\n",
        "t",
    )
    .unwrap();
    Config::from_toml_str(
        "[proxy]\nlisten = \"0.0.0.0:27017\"\n[tls]\ncert_file = \"c\"\nkey_file = \"k\"\n",
        "t",
    )
    .unwrap();
    assert!(Config::from_toml_str("[tls]\ncert_file = \"c\"\n", "t").is_err());
    assert!(Config::from_toml_str("[tls]\nclient_ca_file = \"c\"\n", "t").is_err());
}

#[test]
fn admin_listener_rules() {
    let c = Config::from_toml_str("", "t").unwrap();
    assert_eq!(
        c.admin.listen,
        Some(SocketAddr::from(([127, 0, 0, 1], 9216)))
    );
    let off = Config::from_toml_str("[admin]\nlisten = \"off\"\n", "t").unwrap();
    assert_eq!(off.admin.listen, None);
    let off = Config::from_toml_str("[admin]\nlisten = \"\"\n", "t").unwrap();
    assert_eq!(off.admin.listen, None);
    // A non-loopback admin listener without a token refuses to start.
    let err = Config::from_toml_str("[admin]\nlisten = \"0.0.0.0:9216\"\n", "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("token"), "{err}");
    assert!(Config::from_toml_str(
        "[admin]\nlisten = \"0.0.0.0:9216\"\ntoken = \"s3cret\"\n",
        "t"
    )
    .is_ok());
    assert!(Config::from_toml_str("[admin]\ntoken = \"a\"\ntoken_file = \"/x\"\n", "t").is_err());
    assert!(Config::from_toml_str("[admin]\napp_name_cap = 0\n", "t").is_err());
    let with_token = Config::from_toml_str("[admin]\ntoken = \"s3cret\"\n", "t").unwrap();
    assert!(!format!("{with_token:?}").contains("s3cret"));
    assert!(Config::from_toml_str("[admin]\nlisten = \"nowhere\"\n", "t").is_err());
}

#[test]
fn defaults_are_sane() {
    let c = Config::from_toml_str("", "t").unwrap();
    assert_eq!(c.proxy.listen.port(), 27017);
    assert!(c.proxy.listen.ip().is_loopback());
    assert_eq!(c.proxy.max_message_size, 48_000_000);
}
