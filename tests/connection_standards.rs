//! The connection standards (C001–C003) through a running mongoguard in front of the
//! stand-in: raw wire clients connect the way applications do (many short connections, a
//! pool with monitoring connections, no appName, an old driver), and the findings are read
//! from the audit sink (a file), `/clients` and `/metrics`.

mod support;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use bson::rawdoc;
use mongoguard::{
    app::{Proxy, ProxyHandle},
    audit::SinkSpec,
    config::Config,
};
use mongoguard_standin::{StandIn, StandInConfig};
use serde_json::Value;
use support::guard::{PolicyFile, WireConn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reports every 300 ms: a few reports within a test, each at most one record per
/// (application, rule).
const INTERVAL: Duration = Duration::from_millis(300);

struct Guarded {
    proxy: ProxyHandle,
    _standin: StandIn,
    _policy: PolicyFile,
    audit: PathBuf,
}

async fn start(tag: &str, policy: &str) -> Guarded {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let policy = PolicyFile::write(tag, policy);
    let audit = std::env::temp_dir().join(format!(
        "mg-conn-standards-{tag}-{}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&audit);
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.policy.file = Some(policy.path().to_path_buf());
    cfg.audit.sink = SinkSpec::File(audit.clone());
    cfg.audit.connection_report_interval = INTERVAL;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    Guarded {
        proxy,
        _standin: standin,
        _policy: policy,
        audit,
    }
}

impl Guarded {
    /// Every record written so far with this rule id.
    async fn records(&self, rule: &str) -> Vec<Value> {
        self.proxy.audit().flush().await;
        let text = std::fs::read_to_string(&self.audit).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|r| r["rule"] == rule)
            .collect()
    }

    /// Waits (up to 15 s) until `rule` has a record for which `pick` holds.
    async fn wait_for(&self, rule: &str, pick: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..150 {
            if let Some(r) = self.records(rule).await.into_iter().find(|r| pick(r)) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "no {rule} record as expected within 15 s; {rule} records: {:?}",
            self.records(rule).await
        );
    }

    fn addr(&self) -> SocketAddr {
        self.proxy.local_addr()
    }

    fn admin(&self) -> SocketAddr {
        self.proxy.admin_addr().expect("admin listener")
    }

    async fn shutdown(self) {
        self.proxy.shutdown().await;
        let _ = std::fs::remove_file(&self.audit);
    }
}

/// A connection that says hello as a driver would: `app` (none: no `application` at all,
/// `Some("")`: an empty name), driver name and version.
async fn hello(addr: SocketAddr, app: Option<&str>, driver: (&str, &str)) -> WireConn {
    let mut c = WireConn::connect(addr).await;
    let client = match app {
        Some(name) => rawdoc! {
            "application": { "name": name },
            "driver": { "name": driver.0, "version": driver.1 },
            "os": { "type": std::env::consts::OS },
        },
        None => rawdoc! {
            "driver": { "name": driver.0, "version": driver.1 },
            "os": { "type": std::env::consts::OS },
        },
    };
    let reply = c
        .msg(rawdoc! { "hello": 1, "client": client, "$db": "admin" })
        .await;
    support::guard::assert_ok_reply(&reply, "hello");
    c
}

/// One application request (a find; its answer does not matter).
async fn find(c: &mut WireConn) {
    c.msg(rawdoc! { "find": "t_items", "filter": {}, "$db": "db_app" })
        .await;
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("admin reply in time")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    body.to_owned()
}

/// `/clients` rows of an application.
async fn client_rows(admin: SocketAddr, app: &str) -> Vec<Value> {
    let body = http_get(admin, "/clients").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    v["clients"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["app"] == app)
        .cloned()
        .collect()
}

fn findings(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .flat_map(|r| r["findings"].as_array().cloned().unwrap_or_default())
        .map(|f| f.as_str().unwrap().to_owned())
        .collect()
}

fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

const DRIVER: (&str, &str) = ("mongoguard-tests", "1.0");
/// Below the shipped profiles' minimum for "nodejs" (3.3.0).
const OLD_NODE: (&str, &str) = ("nodejs", "3.2.1");

#[tokio::test]
async fn short_connections_missing_app_names_and_the_standard_profile() {
    let g = start(
        "standard",
        "extends = \"standard\"\n[rules]\n\
         C001 = { action = \"warn\", max_connections_per_minute = 10, min_requests_per_connection = 5 }\n",
    )
    .await;
    let addr = g.addr();
    // php-fpm: a connection per request, 20 of them.
    for _ in 0..20 {
        let mut c = hello(addr, Some("php-fpm"), DRIVER).await;
        find(&mut c).await;
        drop(c);
    }
    // steady: one pooled connection doing 40 requests, and its driver's monitoring
    // connections, 20 of them, opened and closed with a hello only (they must not count).
    let mut pooled = hello(addr, Some("steady"), DRIVER).await;
    for _ in 0..40 {
        find(&mut pooled).await;
    }
    for _ in 0..20 {
        let monitor = hello(addr, Some("steady"), DRIVER).await;
        drop(monitor);
    }
    // No application name: none at all, and an empty one.
    let mut anonymous = hello(addr, None, DRIVER).await;
    find(&mut anonymous).await;
    let _empty = hello(addr, Some(""), ("other-driver", "2.0")).await;
    // An old driver: C003 is off in standard.
    let _legacy = hello(addr, Some("legacy"), OLD_NODE).await;

    // A report may come while the 20 are still connecting: wait for one that saw them all.
    let c001 = g
        .wait_for("C001", |r| {
            r["app"] == "php-fpm"
                && r["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("20 closed"))
        })
        .await;
    assert_eq!(c001["action"], "warn");
    assert_eq!(c001["mode"], "enforce");
    assert_eq!(c001["rule_name"], "short-lived-connections");
    assert_eq!(c001["command"], "(connections)");
    let detail = c001["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("20 connections opened in the last minute (more than 10), 1.0 requests per closed connection"),
        "{detail}"
    );
    let c002 = g
        .wait_for("C002", |r| r["driver"] == "mongoguard-tests 1.0")
        .await;
    assert!(c002.get("app").is_none(), "no application to name: {c002}");
    assert!(
        c002["detail"]
            .as_str()
            .unwrap()
            .contains("name no application"),
        "{c002}"
    );
    g.wait_for("C002", |r| r["driver"] == "other-driver 2.0")
        .await;
    // A few more reports.
    tokio::time::sleep(INTERVAL * 4).await;

    let c001s = g.records("C001").await;
    assert!(
        c001s.iter().all(|r| r["app"] == "php-fpm"),
        "only php-fpm is short-lived (steady's monitoring connections do not count): {c001s:?}"
    );
    // Periodic, not per connection: 20 connections, at most one record per report.
    let reports = c001s.len();
    assert!(
        (1..20).contains(&reports),
        "{reports} C001 records for 20 connections"
    );
    assert!(
        g.records("C003").await.is_empty(),
        "C003 is off in the standard profile"
    );

    let admin = g.admin();
    let php = findings(&client_rows(admin, "php-fpm").await);
    assert_eq!(php.len(), 1, "{php:?}");
    assert!(
        php[0].starts_with("C001 short-lived-connections: 20 connections"),
        "{php:?}"
    );
    let steady = client_rows(admin, "steady").await;
    assert_eq!(steady.len(), 1, "{steady:?}");
    assert_eq!(
        steady[0]["requests"], 61,
        "40 finds and 21 hellos: {steady:?}"
    );
    assert!(findings(&steady).is_empty(), "{steady:?}");
    let unnamed = findings(&client_rows(admin, "-").await);
    assert_eq!(unnamed.len(), 2, "one C002 per driver: {unnamed:?}");
    assert!(
        unnamed
            .iter()
            .all(|f| f.starts_with("C002 missing-app-name")),
        "{unnamed:?}"
    );
    assert!(findings(&client_rows(admin, "legacy").await).is_empty());

    let metrics = http_get(admin, "/metrics").await;
    let counted = metric(
        &metrics,
        r#"mongoguard_violations_total{rule="C001",action="warn",mode="enforce"}"#,
    );
    assert!(
        counted >= reports as f64,
        "mongoguard_violations_total counts every C001 record ({reports}): {counted}"
    );
    drop(pooled);
    g.shutdown().await;
}

#[tokio::test]
async fn an_old_driver_is_reported_in_the_strict_profile() {
    let g = start("strict", "extends = \"strict\"\n").await;
    let addr = g.addr();
    let _legacy = hello(addr, Some("legacy"), OLD_NODE).await;
    // A wrapper whose nodejs part is current; and a driver mongoguard has no minimum for.
    let _wrapped = hello(addr, Some("modern"), ("nodejs|Mongoose", "6.9.0|8.0.0")).await;
    let _unknown = hello(addr, Some("modern"), ("mongoguard-tests", "0.0.1")).await;
    let c003 = g.wait_for("C003", |r| r["app"] == "legacy").await;
    assert_eq!(c003["driver"], "nodejs 3.2.1");
    assert_eq!(c003["rule_name"], "outdated-driver");
    let detail = c003["detail"].as_str().unwrap();
    assert!(
        detail.contains("3.2.1") && detail.contains("minimum 3.3.0"),
        "{detail}"
    );
    tokio::time::sleep(INTERVAL * 3).await;
    let all = g.records("C003").await;
    assert!(all.iter().all(|r| r["app"] == "legacy"), "{all:?}");
    let rows = client_rows(g.admin(), "legacy").await;
    let f = findings(&rows);
    assert_eq!(f.len(), 1, "{rows:?}");
    assert!(
        f[0].starts_with("C003 outdated-driver: driver nodejs 3.2.1"),
        "{f:?}"
    );
    assert!(findings(&client_rows(g.admin(), "modern").await).is_empty());
    g.shutdown().await;
}

#[tokio::test]
async fn an_override_turns_a_connection_standard_off_for_an_application() {
    let g = start(
        "override",
        "extends = \"strict\"\ntrust_app_name = true\n\
         [[overrides]]\napp = \"legacy-*\"\nrules = { C003 = \"off\" }\n",
    )
    .await;
    let addr = g.addr();
    let _excused = hello(addr, Some("legacy-batch"), OLD_NODE).await;
    let _reported = hello(addr, Some("web"), OLD_NODE).await;
    g.wait_for("C003", |r| r["app"] == "web").await;
    tokio::time::sleep(INTERVAL * 3).await;
    let all = g.records("C003").await;
    assert!(all.iter().all(|r| r["app"] == "web"), "{all:?}");
    g.shutdown().await;
}

/// The Rust driver: a client created per request (what C001 is about) against a client kept
/// for the process, whose monitoring connection and pool must not look short-lived.
#[tokio::test]
async fn the_rust_driver_short_lived_clients_against_a_kept_client() {
    let g = start(
        "rust",
        "extends = \"standard\"\n[rules]\n\
         C001 = { action = \"warn\", max_connections_per_minute = 5, min_requests_per_connection = 5 }\n",
    )
    .await;
    let uri = |app: &str| {
        format!(
            "mongodb://{}/?directConnection=true&appName={app}&serverSelectionTimeoutMS=20000",
            g.addr()
        )
    };
    let kept = support::client(&uri("kept")).await;
    let coll = kept
        .database("db_app")
        .collection::<bson::Document>("t_items");
    for _ in 0..30 {
        coll.find_one(bson::doc! {}).await.unwrap();
    }
    for _ in 0..8 {
        let c = support::client(&uri("per-request")).await;
        c.database("db_app")
            .collection::<bson::Document>("t_items")
            .find_one(bson::doc! {})
            .await
            .unwrap();
        c.shutdown().await;
    }
    let r = g
        .wait_for("C001", |r| {
            r["app"] == "per-request"
                && r["detail"].as_str().is_some_and(|d| d.contains("8 closed"))
        })
        .await;
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .starts_with("8 connections opened"),
        "one application connection per client (monitoring not counted): {r}"
    );
    let kept_rows = client_rows(g.admin(), "kept").await;
    assert!(!kept_rows.is_empty());
    assert!(findings(&kept_rows).is_empty(), "{kept_rows:?}");
    let driver = kept_rows[0]["driver"].as_str().unwrap().to_owned();
    assert!(driver.starts_with("mongo-rust-driver "), "{driver}");
    tokio::time::sleep(INTERVAL * 3).await;
    let all = g.records("C001").await;
    assert!(all.iter().all(|r| r["app"] == "per-request"), "{all:?}");
    kept.shutdown().await;
    g.shutdown().await;
}
