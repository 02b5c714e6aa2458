//! Two upstream identities behind one pooled mongoguard, for the isolation tests: `alice`
//! authenticates as the default identity (upstream user `app`), `mallory` as the identity
//! `other` (upstream user `bob`). mongod keys a session by its id and its user's digest, so the
//! two never share a session, a cursor or a transaction even when they send the same `lsid`.

use mongoguard::config::{Config, Mode};

/// The upstream users the stand-ins must know: `app` and `bob`.
pub fn upstream_users() -> Vec<(String, String)> {
    vec![
        ("app".to_string(), "apppw".to_string()),
        ("bob".to_string(), "bobpw".to_string()),
    ]
}

/// A validated pooled-mode config for the upstream `hosts` (`host:port[,host:port]`, with
/// `options` appended to the URI's query) whose users file (under a temporary directory named
/// after `tag`) holds `alice` and `mallory` as above.
pub fn pooled_config(hosts: &str, options: &str, tag: &str, pool_size: usize) -> Config {
    let dir = std::env::temp_dir().join(format!("mg-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let users_file = dir.join("users.toml");
    let _ = std::fs::remove_file(&users_file);
    mongoguard::auth::users::add(&users_file, "alice", "alicepw", "admin").unwrap();
    mongoguard::auth::users::add(&users_file, "mallory", "mallorypw", "admin").unwrap();
    let text = std::fs::read_to_string(&users_file).unwrap();
    let text = text.replace(
        "name = \"mallory\"\n",
        "name = \"mallory\"\nupstream = \"other\"\n",
    );
    std::fs::write(&users_file, text).unwrap();
    let mut cfg = Config::for_upstream(&format!(
        "mongodb://app:apppw@{hosts}/?authSource=admin{options}"
    ))
    .unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.pool.pool_size = pool_size;
    cfg.upstream.identities.insert(
        "other".into(),
        toml::from_str("username = \"bob\"\npassword = \"bobpw\"").unwrap(),
    );
    cfg.auth.users_file = Some(users_file);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg
}

/// `alice` and `mallory` logged in over raw connections to the proxy at `addr`.
pub async fn connect_both(
    addr: std::net::SocketAddr,
) -> (super::raw::RawConn, super::raw::RawConn) {
    (
        super::raw::RawConn::connect_as(addr, "alice", "alicepw").await,
        super::raw::RawConn::connect_as(addr, "mallory", "mallorypw").await,
    )
}

/// A logical session id whose 16 UUID bytes are all `byte`: the same one for both users.
pub fn lsid(byte: u8) -> bson::Document {
    bson::doc! {"id": bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: vec![byte; 16],
    }}
}
