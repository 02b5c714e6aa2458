//! The two audit streams end to end: violation records and events (connections, handshakes,
//! authentication, policy reloads) written to files by a running proxy, and nothing
//! sensitive — passwords, SASL payloads, literal filter values — in either of them.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bson::{doc, Document};
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    audit::SinkSpec,
    config::{Config, Mode},
    proxy::Proxy,
};
use mongoguard_standin::{StandIn, StandInConfig};
use serde_json::Value;

const UPSTREAM: (&str, &str) = ("app", "upstream-Secret-7731");
const USER: (&str, &str) = ("alice", "alice-Secret-5150");
const WRONG_PASSWORD: &str = "wrong-Secret-9009";
const LITERAL: &str = "literal-Secret-4242";

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("mongoguard-streams-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

async fn client(addr: std::net::SocketAddr, password: &str) -> Client {
    let uri = format!(
        "mongodb://{}:{password}@{addr}/?authSource=admin&appName=billing",
        USER.0
    );
    let mut opts = ClientOptions::parse(&uri).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(opts).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_violations_carry_who_and_what_but_no_secret() {
    let dir = temp_dir("pooled");
    let violations = dir.join("violations.log");
    let events = dir.join("events.log");
    let users = dir.join("users.toml");
    mongoguard::auth::users::add(&users, USER.0, USER.1, "admin").unwrap();
    let standin = StandIn::start(StandInConfig {
        users: vec![(UPSTREAM.0.into(), UPSTREAM.1.into())],
        ..Default::default()
    })
    .await
    .unwrap();
    let upstream = format!(
        "mongodb://{}:{}@{}/?authSource=admin",
        UPSTREAM.0,
        UPSTREAM.1,
        standin.addr()
    );
    let mut cfg = Config::for_upstream(&upstream).unwrap();
    cfg.proxy.mode = Mode::Pooled;
    cfg.auth.users_file = Some(users);
    cfg.audit.sink = SinkSpec::File(violations.clone());
    cfg.audit.events_sink = SinkSpec::File(events.clone());
    cfg.audit.dedup_window = Duration::ZERO;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let addr = proxy.local_addr();

    // A good client: a warned query and a blocked delete, both with the literal.
    let good = client(addr, USER.1).await;
    let coll = good.database("shop").collection::<Document>("orders");
    coll.insert_one(doc! {"code": LITERAL}).await.unwrap();
    coll.find_one(doc! {"code": {"$ne": LITERAL}})
        .await
        .unwrap();
    let blocked = coll
        .delete_many(doc! {"$or": [{"code": LITERAL}, {"_id": {"$exists": true}}]})
        .await;
    assert!(blocked.is_err(), "W003 blocks");
    good.shutdown().await;

    // A client with a wrong password.
    let bad = client(addr, WRONG_PASSWORD).await;
    let err = bad
        .database("shop")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Authentication failed"), "{err}");
    bad.shutdown().await;

    let audit = proxy.audit();
    proxy.shutdown().await;
    audit.flush().await;

    let v = read_lines(&violations);
    let rules: Vec<&str> = v.iter().map(|r| r["rule"].as_str().unwrap()).collect();
    assert!(
        rules.contains(&"Q001") && rules.contains(&"W003"),
        "{rules:?}"
    );
    let w003 = v.iter().find(|r| r["rule"] == "W003").unwrap();
    assert_eq!(w003["user"], "admin.alice");
    assert_eq!(w003["app"], "billing");

    let e = read_lines(&events);
    let of = |name: &str| -> Vec<&Value> { e.iter().filter(|x| x["event"] == name).collect() };
    assert!(!of("connection_opened").is_empty());
    assert_eq!(
        of("connection_opened").len(),
        of("connection_closed").len(),
        "{e:#?}"
    );
    assert!(of("client_handshake").iter().all(|x| x["app"] == "billing"));
    let ok = of("auth_succeeded");
    assert!(!ok.is_empty(), "{e:#?}");
    assert!(ok.iter().all(|x| x["user"] == "admin.alice"
        && x["identity"] == "default"
        && x["mechanism"] == "SCRAM-SHA-256"));
    let failed = of("auth_failed");
    assert!(!failed.is_empty(), "{e:#?}");
    assert!(
        failed.iter().all(|x| x["user"] == "admin.alice"),
        "{failed:?}"
    );
    let client = ok[0]["client"].as_str().unwrap();
    assert!(client.starts_with("127.0.0.1:"), "{client}");

    // Nothing sensitive in either stream.
    for path in [&violations, &events] {
        let text = std::fs::read_to_string(path).unwrap();
        for secret in [USER.1, UPSTREAM.1, WRONG_PASSWORD, LITERAL, "Secret"] {
            assert!(!text.contains(secret), "{secret:?} in {}", path.display());
        }
        // SCRAM messages: client-first "n,,n=...,r=", client-final "c=biws,r=...,p=" (also
        // base64-encoded as BinData would be rendered), server "r=...,s=...,i=".
        for marker in [
            "n,,n=", "c=biws", ",r=", ",p=", ",s=", ",i=", "payload", "biws",
        ] {
            assert!(!text.contains(marker), "{marker:?} in {}", path.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bounded wait for the reload poller (not a timing assertion).
async fn wait_until(f: impl Fn() -> bool) {
    for _ in 0..800 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out");
}

#[tokio::test]
async fn policy_reloads_are_events() {
    let dir = temp_dir("reload");
    let file = dir.join("policy.toml");
    let events = dir.join("events.log");
    std::fs::write(&file, "extends = \"standard\"\n").unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.policy.file = Some(file.clone());
    config.policy.reload_poll = Duration::from_millis(50);
    config.audit.sink = SinkSpec::None;
    config.audit.events_sink = SinkSpec::File(events.clone());
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let audit = proxy.audit();
    let stats = proxy.stats();

    std::fs::write(&file, "extends = \"standard\"\nmode = \"audit\"\n").unwrap();
    wait_until(|| stats.policy_reloads.get() >= 1).await;
    // A different length changes the file even within one mtime tick.
    std::fs::write(
        &file,
        "extends = \"standard\"\n[rules]\nW003 = \"maybe-not\"\n",
    )
    .unwrap();
    wait_until(|| stats.policy_reload_failures.get() >= 1).await;
    audit.flush().await;
    proxy.shutdown().await;

    let e = read_lines(&events);
    let ok = e
        .iter()
        .find(|x| x["event"] == "policy_reloaded")
        .expect("reload event");
    assert_eq!(ok["trigger"], "file_change");
    assert_eq!(ok["hash"].as_str().unwrap().len(), 16);
    assert!(ok["source"].as_str().unwrap().contains("policy.toml"));
    let bad = e
        .iter()
        .find(|x| x["event"] == "policy_reload_failed")
        .expect("failure event");
    assert!(bad["error"].as_str().unwrap().contains("W003"), "{bad}");
    let _ = std::fs::remove_dir_all(&dir);
}
