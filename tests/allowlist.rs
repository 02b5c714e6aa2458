//! The learned allowlist (rule A001) through the MongoDB Rust driver: learn the shapes of the
//! application "billing" into a file, restart in enforce mode, and see the learned shapes pass
//! while the textbook NoSQL injection (`{password: {$ne: null}}` where `{password: "x"}` was)
//! is blocked with A001 and recorded with its shape; an application the file does not name
//! gets `unknown_app`; the file reloads on SIGHUP and `POST /reload`, and an invalid file
//! keeps the allowlist in force.
//!
//! Always in front of the stand-in (the checks count what reached the upstream).

mod support;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use bson::{doc, Document};
use mongodb::{Client, Collection};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    audit::{Action, Mode},
    config::{AllowlistMode, Config, UnknownApp},
};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use support::guard::{assert_driver_blocked, PolicyFile};

/// A001 blocks; everything else is the standard profile.
const POLICY: &str = "extends = \"standard\"\n[rules]\nA001 = \"block\"\n";

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mg-allowlist-it-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn start(
    standin: &StandIn,
    policy: &PolicyFile,
    mode: AllowlistMode,
    file: &std::path::Path,
    unknown_app: UnknownApp,
) -> ProxyHandle {
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.policy.file = Some(policy.path().to_path_buf());
    cfg.audit.sink = "none".parse().unwrap();
    cfg.allowlist.mode = mode;
    cfg.allowlist.file = Some(file.to_path_buf());
    cfg.allowlist.unknown_app = unknown_app;
    cfg.validate().unwrap();
    Proxy::start(Arc::new(cfg))
        .await
        .unwrap_or_else(|e| panic!("start mongoguard: {e}"))
}

async fn client(proxy: &ProxyHandle, app: &str) -> Client {
    support::client(&format!(
        "mongodb://{}/?directConnection=true&appName={app}&serverSelectionTimeoutMS=20000",
        proxy.local_addr()
    ))
    .await
}

fn users(c: &Client) -> Collection<Document> {
    c.database("shop").collection("users")
}

fn orders(c: &Client) -> Collection<Document> {
    c.database("shop").collection("orders")
}

/// What "billing" sends in staging: two shapes (each twice, with other values).
async fn billing_traffic(c: &Client) {
    for who in ["alice", "bob"] {
        users(c)
            .find_one(doc! {"password": who})
            .await
            .expect("find through mongoguard");
    }
    for id in [1, 2] {
        orders(c)
            .update_one(doc! {"_id": id}, doc! {"$set": {"paid": true}})
            .await
            .expect("update through mongoguard");
    }
}

/// The `shapes` of `app` in the allowlist file.
fn shapes_of(file: &std::path::Path, app: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let apps = doc.get("app")?.as_array()?;
    let entry = apps
        .iter()
        .find(|a| a.get("name").and_then(|n| n.as_str()) == Some(app))?;
    Some(
        entry
            .get("shapes")?
            .as_array()?
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect(),
    )
}

async fn a001_blocks(proxy: &ProxyHandle) -> u64 {
    let audit = proxy.audit();
    audit.flush().await;
    audit
        .counters()
        .rule_count("A001", Action::Block, Mode::Enforce)
}

const FIND_SHAPE: &str = r#"find shop.users {"password": "<string>"}"#;
const UPDATE_SHAPE: &str = r#"update shop.orders {"_id": "<int>"}"#;

#[tokio::test]
async fn learn_in_staging_then_enforce_in_production() {
    let dir = temp_dir("loop");
    let file = dir.join("allowlist.toml");
    let policy = PolicyFile::write("allowlist", POLICY);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();

    // Staging: learn.
    let staging = start(
        &standin,
        &policy,
        AllowlistMode::Learn,
        &file,
        UnknownApp::Enforce,
    )
    .await;
    let c = client(&staging, "billing").await;
    billing_traffic(&c).await;
    c.shutdown().await;
    staging.shutdown().await;
    let learned = shapes_of(&file, "billing").expect("billing in the file");
    assert_eq!(
        learned,
        [FIND_SHAPE, UPDATE_SHAPE],
        "exactly the two shapes, sorted"
    );
    let first = std::fs::read(&file).unwrap();

    // Learning the same traffic again (new values) gives the same file byte for byte.
    std::fs::remove_file(&file).unwrap();
    let again = start(
        &standin,
        &policy,
        AllowlistMode::Learn,
        &file,
        UnknownApp::Enforce,
    )
    .await;
    let c = client(&again, "billing").await;
    billing_traffic(&c).await;
    c.shutdown().await;
    again.shutdown().await;
    assert_eq!(std::fs::read(&file).unwrap(), first);

    // Production: enforce.
    let prod = start(
        &standin,
        &policy,
        AllowlistMode::Enforce,
        &file,
        UnknownApp::Enforce,
    )
    .await;
    let c = client(&prod, "billing").await;
    billing_traffic(&c).await;
    assert_eq!(prod.stats().blocked.get(), 0, "the learned shapes pass");
    let finds = standin.stats().command_count("find");
    let err = users(&c)
        .find_one(doc! {"password": {"$ne": null}})
        .await
        .expect_err("the injection is blocked");
    let msg = assert_driver_blocked(&err, "A001");
    assert!(msg.contains("unknown-query-shape"), "{msg}");
    assert_eq!(
        standin.stats().command_count("find"),
        finds,
        "it never reached the upstream"
    );
    assert_eq!(a001_blocks(&prod).await, 1);
    let rec = prod
        .metrics()
        .violations
        .recent(10)
        .into_iter()
        .find(|r| r.rule_id == "A001")
        .expect("an A001 record");
    assert_eq!(rec.app_name.as_deref(), Some("billing"));
    assert_eq!(rec.command, "find");
    assert_eq!(rec.database, "shop");
    assert_eq!(rec.collection.as_deref(), Some("users"));
    assert_eq!(
        rec.filter_shape.as_deref(),
        Some(r#"{"password": {"$ne": "<null>"}}"#),
        "the new shape, without its literals"
    );
    // The same client goes on with a learned shape.
    users(&c)
        .find_one(doc! {"password": "carol"})
        .await
        .unwrap();

    // Another application, absent from the file: unknown_app = "enforce" (the default) makes
    // every shape new, even one billing may send.
    let other = client(&prod, "reports").await;
    let err = users(&other)
        .find_one(doc! {"password": "x"})
        .await
        .expect_err("an unknown application is enforced");
    assert_driver_blocked(&err, "A001");
    other.shutdown().await;
    c.shutdown().await;
    prod.shutdown().await;

    // unknown_app = "allow": the other application passes, billing is still enforced.
    let lenient = start(
        &standin,
        &policy,
        AllowlistMode::Enforce,
        &file,
        UnknownApp::Allow,
    )
    .await;
    let other = client(&lenient, "reports").await;
    users(&other)
        .find_one(doc! {"password": {"$ne": null}})
        .await
        .expect("an unknown application is let through");
    let c = client(&lenient, "billing").await;
    let err = users(&c)
        .find_one(doc! {"password": {"$ne": null}})
        .await
        .expect_err("billing is still enforced");
    assert_driver_blocked(&err, "A001");
    other.shutdown().await;
    c.shutdown().await;
    lenient.shutdown().await;
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn post_reload(addr: SocketAddr) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"POST /reload HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap())
}

#[tokio::test]
async fn the_allowlist_reloads_and_an_invalid_file_keeps_the_old_one() {
    let dir = temp_dir("reload");
    let file = dir.join("allowlist.toml");
    std::fs::write(
        &file,
        format!("version = 1\n[[app]]\nname = \"billing\"\nshapes = ['{FIND_SHAPE}']\n"),
    )
    .unwrap();
    let policy = PolicyFile::write("allowlist-reload", POLICY);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(
        &standin,
        &policy,
        AllowlistMode::Enforce,
        &file,
        UnknownApp::Enforce,
    )
    .await;
    let admin = proxy.admin_addr().unwrap();
    let c = client(&proxy, "billing").await;
    let (order_coll, user_coll) = (orders(&c), users(&c));
    let update = || order_coll.update_one(doc! {"_id": 1}, doc! {"$set": {"paid": true}});
    let find = || user_coll.find_one(doc! {"password": "x"});
    find().await.expect("learned");
    assert_driver_blocked(&update().await.expect_err("not learned"), "A001");

    // An invalid file (SIGHUP, then POST /reload): refused, counted, the old list stays.
    std::fs::write(&file, "version = 1\n[[app]\n").unwrap();
    proxy.hangup();
    let stats = proxy.stats();
    assert_eq!(stats.allowlist_reload_failures.get(), 1);
    let (status, body) = post_reload(admin).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["allowlist"]["ok"], false, "{body}");
    assert_eq!(stats.allowlist_reload_failures.get(), 2);
    find()
        .await
        .expect("still allowed: the old list, not an empty one");
    assert_driver_blocked(&update().await.expect_err("still unknown"), "A001");
    // A missing file: the same.
    std::fs::remove_file(&file).unwrap();
    proxy.hangup();
    assert_eq!(stats.allowlist_reload_failures.get(), 3);
    find().await.expect("still allowed");

    // A valid file with the update learned: swapped in by POST /reload.
    std::fs::write(
        &file,
        format!(
            "version = 1\n[[app]]\nname = \"billing\"\nshapes = [\n  '{FIND_SHAPE}',\n  '{UPDATE_SHAPE}',\n]\n"
        ),
    )
    .unwrap();
    let (status, body) = post_reload(admin).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["allowlist"]["shapes"], 2, "{body}");
    assert_eq!(stats.allowlist_reloads.get(), 1);
    update().await.expect("learned now");
    find().await.expect("still learned");
    c.shutdown().await;
    proxy.shutdown().await;
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn enforce_refuses_to_start_without_a_valid_file() {
    let dir = temp_dir("start");
    let file = dir.join("missing.toml");
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.audit.sink = "none".parse().unwrap();
    cfg.allowlist.mode = AllowlistMode::Enforce;
    cfg.allowlist.file = Some(file.clone());
    let err = Proxy::start(Arc::new(cfg.clone()))
        .await
        .err()
        .expect("a missing file is fatal");
    assert!(err.to_string().contains("missing.toml"), "{err}");
    std::fs::write(&file, "version = 1\n[[app]\n").unwrap();
    assert!(
        Proxy::start(Arc::new(cfg)).await.is_err(),
        "an invalid file too"
    );
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Learn mode writes the file every `save_interval`, not only at shutdown (a staging
/// mongoguard that is killed keeps what it learned up to its last write).
#[tokio::test]
async fn learn_mode_writes_the_file_periodically() {
    let dir = temp_dir("periodic");
    let file = dir.join("allowlist.toml");
    let policy = PolicyFile::write("allowlist-periodic", POLICY);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.policy.file = Some(policy.path().to_path_buf());
    cfg.audit.sink = "none".parse().unwrap();
    cfg.allowlist.mode = AllowlistMode::Learn;
    cfg.allowlist.file = Some(file.clone());
    cfg.allowlist.save_interval = Duration::from_millis(100);
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let c = client(&proxy, "billing").await;
    billing_traffic(&c).await;
    let mut written = None;
    for _ in 0..200 {
        if file.exists() {
            written = shapes_of(&file, "billing");
            if written.as_ref().is_some_and(|s| s.len() == 2) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        written.expect("written before shutdown"),
        [FIND_SHAPE, UPDATE_SHAPE]
    );
    c.shutdown().await;
    proxy.shutdown().await;
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
