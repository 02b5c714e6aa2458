//! The admin HTTP listener: every endpoint of the contract against a proxy in front of the
//! stand-in, driven by the Rust driver (allowed and blocked traffic), token enforcement,
//! reload through the API, readiness when the upstream is down, bounded labels, and the
//! Grafana dashboard's metric names against a real scrape.

mod support;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use bson::{doc, Document};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
};
use mongoguard_standin::{StandIn, StandInConfig};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// One HTTP/1.1 exchange: (status, content type, body).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr)
        .await
        .expect("connect to the admin listener");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("admin reply in time")
        .unwrap();
    let text = String::from_utf8(raw).expect("utf-8 reply");
    let (head, body) = text.split_once("\r\n\r\n").expect("headers end");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, ct, body) = http(addr, "GET", path, None).await;
    assert_eq!(status, 200, "{path}: {body}");
    assert_eq!(ct, "application/json", "{path}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// The value of one sample line (`name{labels} value`) of a scrape, exact label text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

async fn start(standin: &StandIn, tweak: impl FnOnce(&mut Config)) -> ProxyHandle {
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    tweak(&mut config);
    Proxy::start(Arc::new(config)).await.unwrap()
}

fn client_uri(proxy: &ProxyHandle, app: &str) -> String {
    format!(
        "mongodb://{}/?directConnection=true&appName={app}&serverSelectionTimeoutMS=20000",
        proxy.local_addr()
    )
}

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mg-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[tokio::test]
async fn endpoints_report_the_traffic_they_saw() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().expect("admin listener on by default");
    assert!(admin.ip().is_loopback());

    let client = support::client(&client_uri(&proxy, "billing")).await;
    let coll = client
        .database("db_admin")
        .collection::<Document>("t_orders");
    coll.insert_one(doc! {"_id": 1, "a": 1}).await.unwrap();
    coll.insert_one(doc! {"_id": 2, "a": 5}).await.unwrap();
    for i in 0..3 {
        let found: Vec<Document> = {
            use futures::TryStreamExt;
            coll.find(doc! {"a": {"$gt": i}})
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap()
        };
        assert!(!found.is_empty());
    }
    // W003 blocks; W004 warns and forwards.
    let blocked = coll.delete_many(doc! {}).await.unwrap_err();
    assert!(blocked.to_string().contains("W003"), "{blocked}");
    coll.delete_many(doc! {"a": {"$gt": 100}}).await.unwrap();

    let (status, _, body) = http(admin, "GET", "/healthz", None).await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));

    let ready = get_json(admin, "/readyz").await;
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["upstream"], standin.addr().to_string());

    // /metrics
    let (status, ct, m) = http(admin, "GET", "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(m.trim_end().ends_with("# EOF"));
    assert_eq!(
        sample(&m, r#"mongoguard_requests_total{command="find"}"#),
        Some(3.0)
    );
    assert_eq!(
        sample(&m, r#"mongoguard_requests_total{command="insert"}"#),
        Some(2.0)
    );
    assert_eq!(
        sample(&m, r#"mongoguard_requests_total{command="delete"}"#),
        Some(2.0)
    );
    assert!(sample(&m, r#"mongoguard_requests_total{command="hello"}"#).unwrap() >= 1.0);
    assert_eq!(
        sample(
            &m,
            r#"mongoguard_violations_total{rule="W003",action="block",mode="enforce"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            r#"mongoguard_violations_total{rule="W004",action="warn",mode="enforce"}"#
        ),
        Some(1.0)
    );
    assert_eq!(sample(&m, "mongoguard_blocked_requests_total"), Some(1.0));
    let by_app = sample(&m, r#"mongoguard_requests_by_app_total{app="billing"}"#).unwrap();
    let all: f64 = m
        .lines()
        .filter(|l| l.starts_with("mongoguard_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(by_app, all, "one client, so every request is billing's");
    // Round trips: every forwarded request but hellos (2 inserts, 3 finds, 1 delete; the
    // driver may add endSessions and the like, never more than the non-hello requests).
    let hellos = sample(&m, r#"mongoguard_requests_total{command="hello"}"#).unwrap()
        + sample(&m, r#"mongoguard_requests_total{command="isMaster"}"#).unwrap();
    let forwarded = sample(&m, "mongoguard_upstream_roundtrip_seconds_count").unwrap();
    assert!(
        forwarded >= 6.0 && forwarded < all - hellos,
        "{forwarded} of {all}"
    );
    assert_eq!(sample(&m, "mongoguard_processing_seconds_count"), Some(all));
    // The driver keeps its connections open and idle; its monitoring connection waits in an
    // awaitable hello, which is not activity.
    let active = sample(&m, r#"mongoguard_client_connections{state="active"}"#).unwrap();
    let idle = sample(&m, r#"mongoguard_client_connections{state="idle"}"#).unwrap();
    let open = active + idle;
    assert!(idle >= 1.0 && active == 0.0, "active {active}, idle {idle}");
    assert_eq!(
        sample(&m, "mongoguard_client_connections_accepted_total"),
        Some(open)
    );
    let upstream: f64 = ["active", "idle", "connecting"]
        .iter()
        .map(|s| {
            sample(
                &m,
                &format!("mongoguard_upstream_connections{{state=\"{s}\"}}"),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(
        upstream, open,
        "passthrough: one upstream connection per client"
    );
    assert_eq!(
        sample(&m, "mongoguard_tls_handshake_failures_total"),
        Some(0.0)
    );
    assert_eq!(
        sample(&m, r#"mongoguard_pinned_connections{reason="cursor"}"#),
        Some(0.0)
    );
    assert_eq!(sample(&m, "mongoguard_policy_reloads_total"), Some(0.0));
    assert!(!m.contains("127.0.0.1:"), "no client addresses in labels");

    // /violations: newest first, the audit record's fields without the client address.
    let v = get_json(admin, "/violations").await;
    let list = v["violations"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["rule_id"], "W004");
    assert_eq!(list[1]["rule_id"], "W003");
    let w003 = list[1].as_object().unwrap();
    for field in [
        "time",
        "rule_id",
        "rule_name",
        "reason",
        "action",
        "mode",
        "app_name",
        "driver",
        "database",
        "collection",
        "command",
        "filter_shape",
        "shape_hash",
        "request_id",
        "source",
    ] {
        assert!(w003.contains_key(field), "{field} missing in {w003:?}");
    }
    assert!(!w003.contains_key("client_addr") && !w003.contains_key("client"));
    assert_eq!(w003["action"], "block");
    assert_eq!(w003["app_name"], "billing");
    assert_eq!(w003["database"], "db_admin");
    assert_eq!(w003["collection"], "t_orders");
    assert_eq!(w003["statement_index"], 0);
    assert_eq!(w003["shape_hash"].as_str().unwrap().len(), 16);
    let limited = get_json(admin, "/violations?limit=1").await;
    assert_eq!(limited["violations"].as_array().unwrap().len(), 1);
    assert!(
        !list[0].to_string().contains("100"),
        "no literals: {}",
        list[0]
    );

    // /stats/violations
    let s = get_json(admin, "/stats/violations").await;
    assert_eq!(s["window_seconds"], 3600);
    assert_eq!(s["bucket_seconds"], 60);
    let buckets = s["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 60);
    assert!(buckets[59]["start"].as_str().unwrap().ends_with('Z'));
    let in_buckets: u64 = buckets
        .iter()
        .flat_map(|b| b["by_rule"].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(in_buckets, 2);
    assert_eq!(s["by_rule"]["W003"], 1);
    assert_eq!(s["by_rule"]["W004"], 1);
    assert_eq!(s["by_app"]["billing"], 2);

    // /clients
    let c = get_json(admin, "/clients").await;
    let rows = c["clients"].as_array().unwrap();
    let billing: Vec<&Value> = rows.iter().filter(|r| r["app"] == "billing").collect();
    assert_eq!(billing.len(), 1, "{rows:?}");
    let b = billing[0];
    assert!(
        b["driver"].as_str().unwrap().contains("mongo-rust-driver"),
        "{b}"
    );
    assert_eq!(b["connections"].as_f64(), Some(open));
    assert_eq!(b["requests"].as_f64(), Some(all));
    assert_eq!(b["violations"], 2);

    // /shapes: literals gone, one shape per (namespace, command, shape).
    let sh = get_json(admin, "/shapes?sort=count").await;
    let shapes = sh["shapes"].as_array().unwrap();
    let find = shapes
        .iter()
        .find(|r| r["command"] == "find")
        .expect("the find shape");
    assert_eq!(find["namespace"], "db_admin.t_orders");
    assert_eq!(find["count"], 3);
    assert_eq!(find["errors"], 0);
    assert_eq!(find["violations"], 0);
    assert!(find["filter_shape"].as_str().unwrap().contains("$gt"));
    assert!(find["filter_shape"].as_str().unwrap().contains("<int>"));
    assert_eq!(find["shape_hash"].as_str().unwrap().len(), 16);
    let lat = &find["latency_us"];
    assert!(lat["p50"].as_u64().unwrap() <= lat["p99"].as_u64().unwrap());
    assert!(find["total_time_us"].as_u64().unwrap() > 0);
    let deletes: Vec<&Value> = shapes.iter().filter(|r| r["command"] == "delete").collect();
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    let blocked_shape = deletes.iter().find(|r| r["filter_shape"] == "{}").unwrap();
    assert_eq!(blocked_shape["errors"], 1);
    assert_eq!(blocked_shape["violations"], 1);
    assert_eq!(
        get_json(admin, "/shapes?limit=1").await["shapes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // /pool (passthrough)
    let p = get_json(admin, "/pool").await;
    assert_eq!(p["mode"], "passthrough");
    assert_eq!(p["pools"].as_array().unwrap().len(), 0);
    assert_eq!(p["clients"]["waiting"], 0);
    for reason in ["exhaust", "transaction", "cursor", "legacy_write"] {
        assert_eq!(p["pinned"][reason], 0);
    }

    // /policy, and /reload of a built-in profile
    let pol = get_json(admin, "/policy").await;
    assert_eq!(pol["source"], "builtin:standard");
    assert_eq!(pol["mode"], "enforce");
    assert_eq!(pol["hash"].as_str().unwrap().len(), 16);
    let rules = pol["rules"].as_array().unwrap();
    assert_eq!(rules.len(), mongoguard::policy::RULE_COUNT);
    let w003 = rules.iter().find(|r| r["id"] == "W003").unwrap();
    assert_eq!(w003["name"], "delete-many-without-filter");
    assert_eq!(w003["action"], "block");
    assert_eq!(w003["scope"], "command");
    let c001 = rules.iter().find(|r| r["id"] == "C001").unwrap();
    assert_eq!(c001["scope"], "connection");
    assert_eq!(c001["action"], "warn");
    let (status, _, body) = http(admin, "POST", "/reload", None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["ok"], false);

    // The status page, wrong methods and unknown paths.
    let (status, ct, page) = http(admin, "GET", "/", None).await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(page.contains("<html"));
    assert_eq!(http(admin, "GET", "/reload", None).await.0, 405);
    assert_eq!(http(admin, "GET", "/nope", None).await.0, 404);

    drop(client);
    proxy.shutdown().await;
    standin.shutdown().await;
}

#[tokio::test]
async fn the_token_is_required_except_for_healthz() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| c.admin.token = Some("s3cret".into())).await;
    let admin = proxy.admin_addr().unwrap();
    assert_eq!(http(admin, "GET", "/healthz", None).await.0, 200);
    for path in [
        "/metrics",
        "/policy",
        "/violations",
        "/pool",
        "/",
        "/readyz",
    ] {
        assert_eq!(http(admin, "GET", path, None).await.0, 401, "{path}");
        assert_eq!(
            http(admin, "GET", path, Some("wrong")).await.0,
            401,
            "{path}"
        );
        assert_eq!(
            http(admin, "GET", path, Some("s3cret")).await.0,
            200,
            "{path}"
        );
    }
    assert_eq!(http(admin, "POST", "/reload", None).await.0, 401);
    // The status page's form.
    assert_eq!(http(admin, "GET", "/pool?token=s3cret", None).await.0, 200);
    assert_eq!(http(admin, "GET", "/pool?token=s3cre", None).await.0, 401);
    proxy.shutdown().await;

    // token_file works the same; a non-loopback listener without a token refuses to start.
    let file = temp_file("token");
    std::fs::write(&file, "from-file\n").unwrap();
    let proxy = start(&standin, |c| c.admin.token_file = Some(file.clone())).await;
    let admin = proxy.admin_addr().unwrap();
    assert_eq!(http(admin, "GET", "/pool", Some("from-file")).await.0, 200);
    assert_eq!(http(admin, "GET", "/pool", None).await.0, 401);
    proxy.shutdown().await;
    let mut open = Config::for_upstream(&standin.uri()).unwrap();
    open.admin.listen = Some("0.0.0.0:0".parse().unwrap());
    assert!(open.validate().is_err());
    standin.shutdown().await;
}

#[tokio::test]
async fn reload_through_the_api_validates_then_swaps() {
    let file = temp_file("policy.toml");
    std::fs::write(&file, "extends = \"standard\"\n").unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| {
        c.policy.file = Some(file.clone());
        c.policy.reload_poll = Duration::ZERO;
    })
    .await;
    let admin = proxy.admin_addr().unwrap();
    let before = get_json(admin, "/policy").await;
    assert_eq!(before["source"], format!("file:{}", file.display()));

    std::fs::write(&file, "extends = \"standard\"\nmode = \"audit\"\n").unwrap();
    let (status, _, body) = http(admin, "POST", "/reload", None).await;
    assert_eq!(status, 200, "{body}");
    let ok: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ok["ok"], true);
    let after = get_json(admin, "/policy").await;
    assert_eq!(after["mode"], "audit");
    assert_eq!(after["hash"], ok["hash"]);
    assert_ne!(after["hash"], before["hash"]);

    std::fs::write(&file, "extends = \"standard\"\n[rules]\nW999 = \"block\"\n").unwrap();
    let (status, _, body) = http(admin, "POST", "/reload", None).await;
    assert_eq!(status, 422, "{body}");
    let bad: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(bad["ok"], false);
    assert!(bad["error"].as_str().unwrap().contains("W999"), "{body}");
    assert_eq!(
        get_json(admin, "/policy").await["hash"],
        after["hash"],
        "old policy kept"
    );

    let (_, _, m) = http(admin, "GET", "/metrics", None).await;
    assert_eq!(sample(&m, "mongoguard_policy_reloads_total"), Some(1.0));
    assert_eq!(
        sample(&m, "mongoguard_policy_reload_failures_total"),
        Some(1.0)
    );
    proxy.shutdown().await;
    standin.shutdown().await;
}

#[tokio::test]
async fn readyz_is_503_when_the_upstream_is_down() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().unwrap();
    standin.shutdown().await;
    let (status, ct, body) = http(admin, "GET", "/readyz", None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(ct, "application/json");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "unready");
    assert!(!v["error"].as_str().unwrap().is_empty());
    // The process itself is fine.
    assert_eq!(http(admin, "GET", "/healthz", None).await.0, 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn application_labels_are_capped() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| c.admin.app_name_cap = 2).await;
    let admin = proxy.admin_addr().unwrap();
    for app in ["a1", "a2", "a3", "a4"] {
        let client = support::client(&client_uri(&proxy, app)).await;
        client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .unwrap();
    }
    let (_, _, m) = http(admin, "GET", "/metrics", None).await;
    let apps: Vec<&str> = m
        .lines()
        .filter_map(|l| l.strip_prefix("mongoguard_requests_by_app_total{app=\""))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert_eq!(apps.len(), 3, "two named apps and other: {apps:?}");
    assert!(apps.contains(&"a1") && apps.contains(&"a2") && apps.contains(&"other"));
    let c = get_json(admin, "/clients").await;
    let named: Vec<&str> = c["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["app"].as_str().unwrap())
        .collect();
    assert!(
        named.iter().all(|a| ["a1", "a2", "other"].contains(a)),
        "{named:?}"
    );
    proxy.shutdown().await;
    standin.shutdown().await;
}

#[tokio::test]
async fn pool_state_in_pooled_mode() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| {
        c.proxy.mode = mongoguard::config::Mode::Pooled;
        c.auth.allow_unauthenticated = true;
    })
    .await;
    let admin = proxy.admin_addr().unwrap();
    let client = support::client(&client_uri(&proxy, "pooled")).await;
    let coll = client.database("db_p").collection::<Document>("t_p");
    coll.insert_one(doc! {"a": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {"a": 1}).await.unwrap(), 1);
    assert!(
        coll.delete_many(doc! {}).await.is_err(),
        "W003 blocks in pooled mode too"
    );

    let p = get_json(admin, "/pool").await;
    assert_eq!(p["mode"], "pooled");
    let pools = p["pools"].as_array().unwrap();
    let server = standin.addr().to_string();
    let pool = pools
        .iter()
        .find(|r| r["server"] == server.as_str())
        .unwrap_or_else(|| panic!("{pools:?}"));
    assert_eq!(pool["identity"], "default");
    let total = pool["total"].as_u64().unwrap();
    assert!(total >= 1);
    assert_eq!(pool["in_use"], 0, "no request in flight");
    assert_eq!(pool["idle"].as_u64(), Some(total));
    assert_eq!(pool["waiting"], 0);
    assert!(pool["max_wait_ms"].is_u64());
    assert_eq!(p["clients"]["active"], 0);
    assert_eq!(p["clients"]["waiting"], 0);
    for reason in ["exhaust", "transaction", "cursor", "legacy_write"] {
        assert_eq!(p["pinned"][reason], 0, "{reason}");
    }

    let (_, _, m) = http(admin, "GET", "/metrics", None).await;
    let labels = format!(r#"{{server="{server}",identity="default"}}"#);
    assert_eq!(
        sample(&m, &format!("mongoguard_pool_servers_idle{labels}")),
        Some(total as f64)
    );
    assert_eq!(
        sample(&m, &format!("mongoguard_pool_servers_active{labels}")),
        Some(0.0)
    );
    assert_eq!(
        sample(&m, &format!("mongoguard_pool_clients_waiting{labels}")),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &m,
            &format!("mongoguard_pool_checkout_timeouts_total{labels}")
        ),
        Some(0.0)
    );
    assert!(sample(&m, &format!("mongoguard_pool_max_wait_seconds{labels}")).is_some());
    assert_eq!(
        sample(&m, r#"mongoguard_upstream_connections{state="idle"}"#),
        Some(total as f64)
    );
    assert_eq!(sample(&m, "mongoguard_blocked_requests_total"), Some(1.0));
    assert!(sample(&m, "mongoguard_upstream_roundtrip_seconds_count").unwrap() >= 2.0);
    let sh = get_json(admin, "/shapes").await;
    assert!(
        sh["shapes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["command"] == "aggregate" && r["namespace"] == "db_p.t_p"),
        "count_documents is an aggregate: {sh}"
    );
    drop(client);
    proxy.shutdown().await;
    standin.shutdown().await;
}

#[tokio::test]
async fn readyz_is_503_while_draining_and_the_listener_stops_with_the_proxy() {
    use mongoguard::wire::builder::MsgBuilder;
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| {
        c.proxy.drain_timeout = Duration::from_secs(20)
    })
    .await;
    let admin = proxy.admin_addr().unwrap();
    assert_eq!(get_json(admin, "/readyz").await["status"], "ready");

    // One request in flight, held by the upstream.
    standin.set_fault(mongoguard_standin::Fault::Delay(Duration::from_millis(
        1500,
    )));
    let mut raw = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let ping = MsgBuilder::new(bson::rawdoc! {"ping": 1, "$db": "admin"}).encode(1, 0);
    raw.write_all(&ping).await.unwrap();
    let in_flight = support::eventually(200, Duration::from_millis(10), || async {
        let (_, _, m) = http(admin, "GET", "/metrics", None).await;
        sample(&m, r#"mongoguard_client_connections{state="active"}"#) == Some(1.0)
    })
    .await;
    assert!(in_flight, "the ping is in flight");

    let shutdown = tokio::spawn(proxy.shutdown());
    let draining = support::eventually(200, Duration::from_millis(10), || async {
        let (status, _, body) = http(admin, "GET", "/readyz", None).await;
        status == 503 && body.contains("draining")
    })
    .await;
    assert!(draining, "/readyz says 503 while the proxy drains");
    assert_eq!(http(admin, "GET", "/healthz", None).await.0, 200);

    // The in-flight reply arrives, the drain ends, and the admin listener goes with it.
    let mut buf = vec![0u8; 1024];
    assert!(raw.read(&mut buf).await.unwrap() > 0, "the reply");
    tokio::time::timeout(Duration::from_secs(30), shutdown)
        .await
        .expect("shutdown ends")
        .unwrap();
    match TcpStream::connect(admin).await {
        Err(_) => {}
        Ok(mut s) => assert_eq!(s.read(&mut buf).await.unwrap_or(0), 0),
    }
    standin.shutdown().await;
}

/// Kubernetes removes a terminating pod from the Service's endpoints at the same time as it
/// sends SIGTERM, and kube-proxy / load balancers follow seconds later: mongoguard closed its
/// listener at once, so the clients still sent its way in that window were refused (a
/// network error for every new connection). With `proxy.shutdown_delay`, SIGTERM first makes
/// `/readyz` say 503 and keeps accepting and serving for that long, then drains as before.
#[tokio::test]
async fn shutdown_delay_goes_unready_first_and_keeps_serving_new_connections() {
    use mongoguard::wire::builder::MsgBuilder;
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let delay = Duration::from_secs(5);
    let proxy = start(&standin, |c| {
        c.proxy.drain_timeout = Duration::from_secs(20);
        c.proxy.shutdown_delay = delay;
    })
    .await;
    let admin = proxy.admin_addr().unwrap();
    let addr = proxy.local_addr();
    assert_eq!(get_json(admin, "/readyz").await["status"], "ready");
    let asked = std::time::Instant::now();
    let shutdown = tokio::spawn(proxy.shutdown());
    let unready = support::eventually(200, Duration::from_millis(10), || async {
        let (status, _, body) = http(admin, "GET", "/readyz", None).await;
        status == 503 && body.contains("draining")
    })
    .await;
    assert!(unready, "/readyz says 503 as soon as the shutdown starts");
    // Unready, and still serving a client that connects now.
    let mut raw = TcpStream::connect(addr)
        .await
        .expect("a new connection during shutdown_delay is accepted");
    let ping = MsgBuilder::new(bson::rawdoc! {"ping": 1, "$db": "admin"}).encode(1, 0);
    raw.write_all(&ping).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("a reply in time")
        .unwrap_or(0);
    assert!(
        asked.elapsed() < delay,
        "the check ran past the delay on a slow machine; nothing learned"
    );
    assert!(n > 16, "a new client during shutdown_delay got no reply");
    tokio::time::timeout(Duration::from_secs(40), shutdown)
        .await
        .expect("shutdown ends after the delay and the drain")
        .unwrap();
    assert!(asked.elapsed() >= delay, "the delay was not kept");
    standin.shutdown().await;
}

/// Every metric the Grafana dashboard queries is one a running proxy exposes.
#[tokio::test]
async fn grafana_dashboard_uses_only_exposed_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/integration/grafana/mongoguard-dashboard.json"
    );
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("valid JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");

    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    // Families with labels appear once they have a series: an application and a violation.
    let client = support::client(&client_uri(&proxy, "grafana")).await;
    let coll = client.database("db_g").collection::<Document>("t_g");
    assert!(coll.delete_many(doc! {}).await.is_err());
    let (_, _, m) = http(proxy.admin_addr().unwrap(), "GET", "/metrics", None).await;
    let exposed = exposed_names(&m);
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(exposed.contains(&name), "{name} (in {expr}) is not exposed");
        }
    }
    proxy.shutdown().await;
    standin.shutdown().await;
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// Every `mongoguard_*` identifier in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("mongoguard_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Sample names of a scrape, plus the names implied by each family's type (a counter
/// `x` has samples `x_total`, a histogram `x_bucket`, `x_sum`, `x_count`), so families that
/// have no sample in this mode (pool gauges in passthrough) still count as exposed.
fn exposed_names(scrape: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in scrape.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut it = t.split(' ');
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            match kind {
                "counter" => names.push(format!("{name}_total")),
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        names.push(format!("{name}{s}"));
                    }
                }
                _ => names.push(name.to_owned()),
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next() {
                names.push(name.to_owned());
            }
        }
    }
    names
}

/// The operator's toolbox: `/connections` (one row per client connection, like PgBouncer's
/// SHOW CLIENTS), killing one connection, pause / resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_can_be_listed_and_killed_one_by_one() {
    use support::raw::RawConn;
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().unwrap();
    let (mut a, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let (mut b, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let ping = doc! {"ping": 1, "$db": "admin"};
    assert_eq!(a.command(ping.clone()).await.get_f64("ok").unwrap(), 1.0);

    // A session marks itself idle once it has looped back for the next request, just after
    // the client got its reply: wait (bounded) for both to be back.
    let mut list = get_json(admin, "/connections").await;
    for _ in 0..250 {
        let all_idle = list["connections"]
            .as_array()
            .is_some_and(|rows| rows.iter().all(|r| r["state"] == "idle"));
        if all_idle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        list = get_json(admin, "/connections").await;
    }
    assert_eq!(list["paused"], false);
    let rows = list["connections"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    for r in rows {
        assert_eq!(r["app"], "mongoguard-raw-test", "{r}");
        assert_eq!(r["state"], "idle", "{r}");
    }
    let first = &rows[0];
    assert_eq!(first["requests"], 2, "hello + ping: {list}");
    let id = first["id"].as_u64().unwrap();

    let (status, _, body) = http(admin, "POST", &format!("/connections/{id}/kill"), None).await;
    assert_eq!(status, 200, "{body}");
    // The killed connection is closed; the other one is untouched.
    a.send(0, &ping).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1];
        let s: &mut TcpStream = a.stream_mut();
        s.read(&mut buf).await
    })
    .await
    .expect("the kill closes the connection in time");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    assert_eq!(b.command(ping.clone()).await.get_f64("ok").unwrap(), 1.0);
    let list = get_json(admin, "/connections").await;
    assert_eq!(list["connections"].as_array().unwrap().len(), 1, "{list}");
    let (status, _, _) = http(admin, "POST", &format!("/connections/{id}/kill"), None).await;
    assert_eq!(status, 404);
    let (status, _, _) = http(admin, "GET", "/connections/1/kill", None).await;
    assert_eq!(status, 404, "only POST kills");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_requests_until_resume_or_its_limit() {
    use support::raw::RawConn;
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| {
        c.upstream.server_selection_timeout = Duration::from_millis(800)
    })
    .await;
    let admin = proxy.admin_addr().unwrap();
    let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let ping = doc! {"ping": 1, "$db": "admin"};

    let (status, _, body) = http(admin, "POST", "/pause", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get_json(admin, "/connections").await["paused"], true);
    let pings_before = standin.stats().command_count("ping");
    let id = c.send(0, &ping).await;
    // Held: no answer while paused (a bounded wait shorter than the pause limit).
    let held = tokio::time::timeout(Duration::from_millis(300), c.read()).await;
    assert!(held.is_err(), "answered while paused: {held:?}");
    assert_eq!(
        standin.stats().command_count("ping"),
        pings_before,
        "sent while paused"
    );
    // hello (drivers' monitoring) goes on during the pause.
    let (_, hello) = RawConn::connect_with_hello(proxy.local_addr()).await;
    assert_eq!(hello.get_f64("ok").unwrap_or(1.0), 1.0);
    let (status, _, _) = http(admin, "POST", "/resume", None).await;
    assert_eq!(status, 200);
    let reply = c.read().await;
    assert_eq!(reply.response_to, id);
    assert_eq!(reply.body.get_f64("ok").unwrap(), 1.0);

    // Past the limit: ExceededTimeLimit, not sent, and the connection stays usable.
    http(admin, "POST", "/pause", None).await;
    let reply = c.command(ping.clone()).await;
    assert_eq!(reply.get_i32("code").unwrap(), 262, "{reply}");
    assert!(
        reply.get_str("errmsg").unwrap().contains("paused"),
        "{reply}"
    );
    http(admin, "POST", "/resume", None).await;
    assert_eq!(c.command(ping).await.get_f64("ok").unwrap(), 1.0);
    proxy.shutdown().await;
}

/// `POST /stats/reset` empties the admin views (like PgBouncer's RESET STATS…), never the
/// Prometheus counters, which must stay monotonic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_reset_empties_the_views_not_the_counters() {
    use support::raw::RawConn;
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().unwrap();
    let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    c.command(doc! {"find": "t", "filter": {"a": 1}, "$db": "db_x"})
        .await;
    let blocked = c
        .command(doc! {"update": "t", "updates": [{"q": {}, "u": {"$set": {"x": 1}}, "multi": true}], "$db": "db_x"})
        .await;
    assert_eq!(blocked.get_i32("code").unwrap(), 65001, "{blocked}");
    let series = r#"mongoguard_violations_total{rule="W001",action="block",mode="enforce"}"#;
    let before = {
        let (_, _, m) = http(admin, "GET", "/metrics", None).await;
        sample(&m, series).expect("the W001 counter")
    };
    assert!(!get_json(admin, "/violations").await["violations"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(!get_json(admin, "/shapes").await["shapes"]
        .as_array()
        .unwrap()
        .is_empty());

    let (status, _, body) = http(admin, "POST", "/stats/reset", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(get_json(admin, "/violations").await["violations"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(get_json(admin, "/shapes").await["shapes"]
        .as_array()
        .unwrap()
        .is_empty());
    let stats = get_json(admin, "/stats/violations").await;
    assert_eq!(stats["by_rule"], serde_json::json!({}), "{stats}");
    let (_, _, m) = http(admin, "GET", "/metrics", None).await;
    assert_eq!(
        sample(&m, series),
        Some(before),
        "a Prometheus counter was reset"
    );
    proxy.shutdown().await;
}

/// `mongoguard admin …`: the same actions from the command line (the token from a file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_calls_the_api_with_the_token() {
    use support::raw::RawConn;
    let token_file = temp_file("cli-token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| c.admin.token = Some("s3cret-token".into())).await;
    let admin = proxy.admin_addr().unwrap().to_string();
    let (_conn, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let cli = |args: Vec<String>| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mongoguard"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let with = |action: &[&str]| {
        let mut v: Vec<String> = ["admin", "--admin", &admin, "--token-file"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(token_file.to_str().unwrap().to_owned());
        v.extend(action.iter().map(|s| s.to_string()));
        v
    };
    let (code, out) = tokio::task::spawn_blocking({
        let args = with(&["connections"]);
        move || cli(args)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{out}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["connections"].as_array().unwrap().len(), 1, "{list}");
    let (code, out) = tokio::task::spawn_blocking({
        let args = with(&["pause"]);
        move || cli(args)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        get_json_auth(proxy.admin_addr().unwrap(), "/connections", "s3cret-token").await["paused"],
        true
    );
    let (code, _) = tokio::task::spawn_blocking({
        let args = with(&["resume"]);
        move || cli(args)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0));
    // Without the token: refused, exit 1.
    let (code, _) = tokio::task::spawn_blocking({
        let args: Vec<String> = ["admin", "--admin", &admin, "kill", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        move || cli(args)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(1));
    proxy.shutdown().await;
}

async fn get_json_auth(addr: SocketAddr, path: &str, token: &str) -> Value {
    let (status, _, body) = http(addr, "GET", path, Some(token)).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// `POST /servers/{host:port}/drain` / `enable`: a drained upstream server gets no new
/// sessions; the others take them; enabled, it gets them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upstream_server_can_be_drained_and_enabled() {
    use support::raw::RawConn;
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let b = StandIn::start(StandInConfig::default()).await.unwrap();
    let uri = format!("mongodb://{},{}/", a.addr(), b.addr());
    let mut config = Config::for_upstream(&uri).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let admin = proxy.admin_addr().unwrap();
    let ping = doc! {"ping": 1, "$db": "admin"};
    let pings = |s: &StandIn| s.stats().command_count("ping");
    let round = |n: usize| {
        let addr = proxy.local_addr();
        let ping = ping.clone();
        async move {
            for _ in 0..n {
                let (mut c, _) = RawConn::connect_with_hello(addr).await;
                assert_eq!(c.command(ping.clone()).await.get_f64("ok").unwrap(), 1.0);
            }
        }
    };
    round(6).await;
    assert!(pings(&a) > 0 && pings(&b) > 0, "round robin over both");

    let (status, _, body) =
        http(admin, "POST", &format!("/servers/{}/drain", a.addr()), None).await;
    assert_eq!(status, 200, "{body}");
    let pool = get_json(admin, "/pool").await;
    assert_eq!(
        pool["drained"],
        serde_json::json!([a.addr().to_string()]),
        "{pool}"
    );
    let (before_a, before_b) = (pings(&a), pings(&b));
    round(6).await;
    assert_eq!(pings(&a), before_a, "a drained server got new sessions");
    assert_eq!(pings(&b), before_b + 6);

    let (status, _, _) = http(
        admin,
        "POST",
        &format!("/servers/{}/enable", a.addr()),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let before_a = pings(&a);
    round(6).await;
    assert!(pings(&a) > before_a, "enabled again");
    let (status, _, _) = http(admin, "POST", "/servers/127.0.0.1:1/drain", None).await;
    assert_eq!(status, 404);
    proxy.shutdown().await;
}

/// Pooled mode: draining a server closes its idle pooled connections at once (not after
/// `pool.idle_timeout`), keeps none idle while drained (nor opens any ahead for `min_idle`),
/// and enabling it lets the pool fill again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_server_closes_its_idle_pooled_connections_at_once() {
    use support::raw::RawConn;
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let b = StandIn::start(StandInConfig::default()).await.unwrap();
    let uri = format!("mongodb://{},{}/", a.addr(), b.addr());
    let mut config = Config::for_upstream(&uri).unwrap();
    config.proxy.mode = mongoguard::config::Mode::Pooled;
    config.auth.allow_unauthenticated = true;
    config.pool.min_idle = 1;
    config.upstream.heartbeat_interval = Duration::from_millis(100);
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    config.validate().unwrap();
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let admin = proxy.admin_addr().unwrap();
    let idle_of = |pool: &Value, server: String| -> u64 {
        pool["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["server"] == server.as_str())
            .map(|p| p["idle"].as_u64().unwrap())
            .sum()
    };
    let (mut c, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.command(doc! {"ping": 1, "$db": "admin"}).await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
        let pool = get_json(admin, "/pool").await;
        if idle_of(&pool, a.addr().to_string()) > 0 && idle_of(&pool, b.addr().to_string()) > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no idle connection to both: {pool}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _, body) =
        http(admin, "POST", &format!("/servers/{}/drain", a.addr()), None).await;
    assert_eq!(status, 200, "{body}");
    // At once: the answer to the drain comes after the idle connections are closed.
    let pool = get_json(admin, "/pool").await;
    assert_eq!(idle_of(&pool, a.addr().to_string()), 0, "{pool}");
    assert!(idle_of(&pool, b.addr().to_string()) > 0, "{pool}");
    // Requests go on (to b); min_idle opens nothing toward a while drained.
    for _ in 0..10 {
        let r = c.command(doc! {"ping": 1, "$db": "admin"}).await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pool = get_json(admin, "/pool").await;
    assert_eq!(idle_of(&pool, a.addr().to_string()), 0, "{pool}");
    let (status, _, _) = http(
        admin,
        "POST",
        &format!("/servers/{}/enable", a.addr()),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let filled = support::eventually(200, Duration::from_millis(50), || async {
        let _ = c_ping(proxy.local_addr()).await;
        idle_of(&get_json(admin, "/pool").await, a.addr().to_string()) > 0
    })
    .await;
    assert!(filled, "the enabled server's pool never filled again");
    proxy.shutdown().await;
}

async fn c_ping(addr: SocketAddr) -> Document {
    let (mut c, _) = support::raw::RawConn::connect_with_hello(addr).await;
    c.command(doc! {"ping": 1, "$db": "admin"}).await
}

/// A passthrough session whose connection waits for a primary (the replica set has none for
/// ten minutes; `server_selection_timeout` is as long) ends at once when the operator kills
/// it: only the kill can end the wait within the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_killed_while_waiting_for_a_primary_ends_at_once() {
    use mongoguard_standin::{ReplicaSet, ReplicaSetConfig};
    use support::raw::RawConn;
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rskill".into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    // No primary for ten minutes, before mongoguard first looks at the set (a proxy started
    // earlier could still believe in the old primary for a heartbeat and answer at once).
    rs.step_down(1, Duration::from_secs(600));
    let mut config = Config::for_upstream(&rs.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    config.upstream.server_selection_timeout = Duration::from_secs(600);
    config.upstream.heartbeat_interval = Duration::from_millis(200);
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let admin = proxy.admin_addr().unwrap();
    let mut c = RawConn::connect(proxy.local_addr()).await.unwrap();
    c.send(0, &doc! {"ping": 1, "$db": "admin"}).await;
    // Until the session has read its request (it then waits for a primary).
    let mut id = None;
    for _ in 0..250 {
        let list = get_json(admin, "/connections").await;
        let rows = list["connections"].as_array().cloned().unwrap_or_default();
        if let Some(r) = rows.iter().find(|r| r["requests"].as_u64() >= Some(1)) {
            id = r["id"].as_u64();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id = id.expect("the session never read its request");
    // The precondition: no answer, the session waits for a primary.
    let mut buf = [0u8; 1];
    let early =
        tokio::time::timeout(Duration::from_millis(300), c.stream_mut().read(&mut buf)).await;
    assert!(
        early.is_err(),
        "answered or closed without a primary: {early:?}"
    );
    let (status, _, body) = http(admin, "POST", &format!("/connections/{id}/kill"), None).await;
    assert_eq!(status, 200, "{body}");
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1];
        c.stream_mut().read(&mut buf).await
    })
    .await
    .expect("the kill ends a session that waits for a primary");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    proxy.shutdown().await;
    rs.shutdown().await;
}

/// A replica set whose first seed is down (a member in maintenance, a host gone) while the
/// others, primary among them, serve: the proxy serves, so `/readyz` must say ready. Probing
/// only the URI's first host made every mongoguard of a deployment unready at once (the load
/// balancer or Kubernetes then takes all of them out of service) while a primary was there.
#[tokio::test]
async fn readyz_is_ready_when_the_first_seed_is_down_but_the_set_serves() {
    use mongoguard::wire::builder::MsgBuilder;
    use mongoguard_standin::{ReplicaSet, ReplicaSetConfig};
    let set = ReplicaSet::start(ReplicaSetConfig {
        name: "rs_ready".into(),
        members: 3,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    // A port nobody listens on: connections to it are refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let hosts: Vec<String> = set.members().iter().map(|m| m.addr().to_string()).collect();
    let uri = format!("mongodb://{dead},{}/?replicaSet=rs_ready", hosts.join(","));
    let mut config = Config::for_upstream(&uri).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    config.upstream.heartbeat_interval = Duration::from_millis(200);
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let admin = proxy.admin_addr().unwrap();

    // The proxy serves: a ping goes through to the primary.
    let mut raw = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let ping = MsgBuilder::new(bson::rawdoc! {"ping": 1, "$db": "admin"}).encode(1, 0);
    raw.write_all(&ping).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(20), raw.read(&mut buf))
        .await
        .expect("the ping's reply in time")
        .unwrap();
    assert!(n > 0, "the proxy serves through the replica set");

    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let ready = support::eventually(100, Duration::from_millis(100), || {
        let seen = seen.clone();
        async move {
            let (status, _, body) = http(admin, "GET", "/readyz", None).await;
            *seen.lock().unwrap() = body;
            status == 200
        }
    })
    .await;
    let last = seen.lock().unwrap().clone();
    assert!(ready, "/readyz while a primary serves: {last}");
    let v: Value = serde_json::from_str(&last).unwrap();
    assert!(
        hosts.iter().any(|h| v["upstream"] == h.as_str()),
        "a live member: {last}"
    );
    proxy.shutdown().await;
    set.shutdown().await;
}

/// One GET on a fresh connection; `Err` when the connection is refused, reset or closed
/// before a status line (no panic: the caller reports what it saw).
async fn try_get(addr: SocketAddr, path: &str) -> Result<u16, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    match tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw)).await {
        Err(_) => return Err("no reply within 30 s".into()),
        Ok(Err(e)) if raw.is_empty() => return Err(e.to_string()),
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&raw);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))
}

/// Connections that send nothing (or one request, then nothing) held every admin connection
/// slot: `/healthz` (the liveness probe, Docker's HEALTHCHECK) and `/readyz` were refused until
/// the 10 s header timeout freed them, and an attacker reconnecting every 10 s kept them
/// refused for good, without a token (the token is checked per request). A new connection
/// must get its answer by closing the oldest idle connection.
#[tokio::test]
async fn idle_admin_connections_cannot_lock_out_the_probes() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().unwrap();
    // Silent connections, then keep-alive ones that made one request; more than the cap.
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(TcpStream::connect(admin).await.unwrap());
    }
    for _ in 0..40 {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        // The 41st and later may be refused on main; only the answered ones stay held.
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            if n > 0 {
                held.push(s);
            }
        }
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = try_get(admin, path).await;
        assert_eq!(
            answer,
            Ok(200),
            "{path} with the admin slots held by idle clients"
        );
    }
    drop(held);
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// Violation records that cannot be written (a full disk: `/dev/full`) are lost; the process
/// goes on, as it must, but the operator only had a warning at most once a second in the log.
/// An audit trail losing records must be visible where alerts are: in the metrics, by stream
/// and reason.
#[tokio::test]
async fn lost_audit_lines_are_counted_in_the_metrics() {
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("no /dev/full here; not checked");
        return;
    }
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |c| {
        c.audit.sink = mongoguard::audit::SinkSpec::File("/dev/full".into());
    })
    .await;
    let admin = proxy.admin_addr().unwrap();
    let client = support::client(&client_uri(&proxy, "lossy")).await;
    let coll = client.database("db_lost").collection::<Document>("t");
    // W003 blocks: one violation record, which the sink cannot write.
    let blocked = coll.delete_many(doc! {}).await.unwrap_err();
    assert!(blocked.to_string().contains("W003"), "{blocked}");
    let series = r#"mongoguard_audit_lines_lost_total{stream="violations",reason="write_error"}"#;
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let counted = support::eventually(100, Duration::from_millis(100), || {
        let seen = seen.clone();
        async move {
            let (_, _, m) = http(admin, "GET", "/metrics", None).await;
            let ok = sample(&m, series).is_some_and(|v| v >= 1.0);
            *seen.lock().unwrap() = m;
            ok
        }
    })
    .await;
    let m = seen.lock().unwrap().clone();
    assert!(
        counted,
        "{series} in the scrape:\n{}",
        m.lines()
            .filter(|l| l.contains("audit"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        sample(
            &m,
            r#"mongoguard_audit_lines_lost_total{stream="events",reason="queue_full"}"#
        ),
        Some(0.0)
    );
    drop(client);
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// One request with extra header lines; the status code.
async fn status_with(addr: SocketAddr, method: &str, path: &str, extra: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("admin reply in time")
        .unwrap();
    String::from_utf8_lossy(&raw)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code")
}

/// Without a token (the default on loopback) any web page open in a browser on the host
/// could act on the admin API: a cross-origin `fetch(..., {method: "POST", mode:
/// "no-cors"})` is sent without a preflight, so a page could pause the proxy, kill
/// connections, drain servers or reset the statistics. Browsers name the page's origin in
/// `Origin` on such requests: an action whose `Origin` is not the admin listener itself is
/// refused (403). Tools that send no `Origin` (curl, `mongoguard admin`) are unaffected.
#[tokio::test]
async fn cross_origin_actions_from_a_browser_are_refused() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().unwrap();
    for path in ["/pause", "/stats/reset", "/reload", "/connections/1/kill"] {
        assert_eq!(
            status_with(admin, "POST", path, "Origin: http://evil.example\r\n").await,
            403,
            "{path} from another origin"
        );
    }
    assert_eq!(get_json(admin, "/connections").await["paused"], false);
    // The admin listener's own origin (its status page), and no Origin at all, may act.
    let own = format!("Origin: http://{admin}\r\n");
    assert_eq!(status_with(admin, "POST", "/pause", &own).await, 200);
    assert_eq!(get_json(admin, "/connections").await["paused"], true);
    assert_eq!(status_with(admin, "POST", "/resume", "").await, 200);
    assert_eq!(get_json(admin, "/connections").await["paused"], false);
    // Reading stays open to any origin's GET as before (the token guards reads).
    assert_eq!(
        status_with(admin, "GET", "/healthz", "Origin: http://evil.example\r\n").await,
        200
    );
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// An admin token kept in `admin.token_file` is rotated the way the TLS certificate and the
/// users file are: rewrite the file, send SIGHUP. The new token is in force, the old one is
/// refused; a file that cannot be read or is empty keeps the token in force (an operator
/// locked out of the admin API by a half-written file would have to restart the proxy).
#[tokio::test]
async fn sighup_reloads_the_admin_token_file_and_keeps_it_when_the_new_one_is_broken() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let file = temp_file("rotated-token");
    std::fs::write(&file, "first-token\n").unwrap();
    let proxy = start(&standin, |c| c.admin.token_file = Some(file.clone())).await;
    let admin = proxy.admin_addr().unwrap();
    assert_eq!(
        http(admin, "GET", "/pool", Some("first-token")).await.0,
        200
    );

    std::fs::write(&file, "second-token\n").unwrap();
    proxy.hangup();
    assert_eq!(
        http(admin, "GET", "/pool", Some("second-token")).await.0,
        200
    );
    assert_eq!(
        http(admin, "GET", "/pool", Some("first-token")).await.0,
        401
    );

    for broken in [Some(""), Some("  \n"), None] {
        match broken {
            Some(text) => std::fs::write(&file, text).unwrap(),
            None => std::fs::remove_file(&file).unwrap(),
        }
        proxy.hangup();
        assert_eq!(
            http(admin, "GET", "/pool", Some("second-token")).await.0,
            200,
            "{broken:?}: the token in force stays"
        );
    }
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// A burst of slowloris connections (each sends part of a request's headers and nothing
/// more), hundreds past the cap: every connection past it closed the oldest idle one and then
/// queued for a slot behind all the earlier ones, and a probe arriving right after the burst
/// waited behind that backlog and was closed after 1 s without an answer (`/healthz` failing:
/// a liveness probe restarting a healthy proxy). A probe must be answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_slowloris_connections_cannot_lock_out_the_probes() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = start(&standin, |_| {}).await;
    let admin = proxy.admin_addr().unwrap();
    let mut answers = Vec::new();
    for round in 0..3 {
        let burst = std::thread::spawn(move || {
            use std::io::Write as _;
            let mut held = Vec::new();
            for _ in 0..600 {
                if let Ok(mut s) = std::net::TcpStream::connect(admin) {
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
                    held.push(s);
                }
            }
            held
        });
        let held = tokio::task::spawn_blocking(move || burst.join().unwrap())
            .await
            .unwrap();
        for path in ["/healthz", "/readyz"] {
            answers.push((round, path, try_get(admin, path).await));
        }
        drop(held);
    }
    for (round, path, answer) in answers {
        assert_eq!(
            answer,
            Ok(200),
            "{path} right after burst {round} of slowloris connections"
        );
    }
    proxy.shutdown().await;
    standin.shutdown().await;
}
