//! `mongodb+srv://` upstreams end to end: mongoguard (passthrough and pooled) resolves its
//! upstream through a DNS stub (`support::dns`) that serves SRV, TXT and A records for
//! stand-ins on 127.0.0.1. SRV targets are names (`s1.<domain>`), resolved through the same
//! stub (`upstream.dns_server`), as they would be in production through the configured
//! name server.
//!
//! Each test uses its own domain: SRV targets known to `upstream.dns_server` are remembered
//! process-wide by name.

mod support;

use std::{
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant},
};

use bson::{doc, Document};
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::{Config, Mode},
};
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};
use support::dns::DnsStub;

const POLL: Duration = Duration::from_millis(200);

fn config(uri: &str, dns: &DnsStub, mode: Mode) -> Config {
    let mut cfg = Config::for_upstream(uri).unwrap();
    cfg.upstream.dns_server = Some(dns.addr());
    cfg.upstream.srv_poll_interval = POLL;
    cfg.upstream.heartbeat_interval = Duration::from_millis(200);
    cfg.upstream.server_selection_timeout = Duration::from_secs(5);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    if mode == Mode::Pooled {
        cfg.proxy.mode = Mode::Pooled;
        cfg.pool.pool_size = 4;
        cfg.auth.allow_unauthenticated = true;
    }
    cfg.validate().unwrap();
    cfg
}

async fn start(uri: &str, dns: &DnsStub, mode: Mode) -> ProxyHandle {
    Proxy::start(Arc::new(config(uri, dns, mode)))
        .await
        .unwrap_or_else(|e| panic!("start mongoguard ({mode:?}) for {uri}: {e}"))
}

async fn start_err(uri: &str, dns: &DnsStub, mode: Mode) -> String {
    match Proxy::start(Arc::new(config(uri, dns, mode))).await {
        Ok(p) => {
            p.shutdown().await;
            panic!("mongoguard started ({mode:?}) for {uri}")
        }
        Err(e) => e.to_string(),
    }
}

/// A fresh client (its own connection, so a passthrough session picks its server anew),
/// retrying reads as drivers do by default.
async fn client(proxy: &ProxyHandle) -> Client {
    client_with(proxy, true).await
}

/// A fresh client; `retry`: retryable reads (a passthrough session whose server left the
/// topology is closed, and the driver retries on a new connection).
async fn client_with(proxy: &ProxyHandle, retry: bool) -> Client {
    let mut opts = ClientOptions::parse(format!(
        "mongodb://{}/?directConnection=true",
        proxy.local_addr()
    ))
    .await
    .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    opts.retry_reads = Some(retry);
    Client::with_options(opts).unwrap()
}

async fn find_one(proxy: &ProxyHandle) -> mongodb::error::Result<Option<Document>> {
    find_one_with(proxy, true).await
}

async fn find_one_with(
    proxy: &ProxyHandle,
    retry: bool,
) -> mongodb::error::Result<Option<Document>> {
    let c = client_with(proxy, retry).await;
    let r = c
        .database("srv")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await;
    c.shutdown().await;
    r
}

/// A plain HTTP GET to the admin listener; the whole response.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn finds(s: &StandIn) -> u64 {
    s.stats().command_count("find")
}

/// A stand-in named `s1.{domain}` by SRV records of `_mongodb._tcp.{name}`.
fn serve(dns: &DnsStub, name: &str, targets: &[(&str, &StandIn)]) {
    let srv: Vec<(&str, u16)> = targets.iter().map(|(t, s)| (*t, s.addr().port())).collect();
    dns.set_srv(&format!("_mongodb._tcp.{name}"), &srv);
    for (t, _) in targets {
        dns.set_a(t, Ipv4Addr::LOCALHOST);
    }
}

async fn find_reaches_the_srv_target(mode: Mode, domain: &str) {
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let dns = DnsStub::start();
    let name = format!("cluster.{domain}");
    let target = format!("s1.{domain}");
    serve(&dns, &name, &[(&target, &a)]);
    let proxy = start(&format!("mongodb+srv://{name}/?tls=false"), &dns, mode).await;
    assert_eq!(dns.srv_queries(&format!("_mongodb._tcp.{name}")), 1);
    assert!(
        dns.queries(&name, 16) >= 1,
        "the TXT record was not asked for"
    );
    assert_eq!(finds(&a), 0);
    find_one(&proxy).await.unwrap();
    find_one(&proxy).await.unwrap();
    assert_eq!(finds(&a), 2, "the finds did not reach the SRV target");
    // The target's name came from the stub, not from the system resolver.
    assert!(
        dns.queries(&target, 1) >= 1,
        "{target} was not resolved through the stub"
    );
    proxy.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_find_reaches_the_srv_target() {
    find_reaches_the_srv_target(Mode::Passthrough, "srv-a-pass.test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_find_reaches_the_srv_target() {
    find_reaches_the_srv_target(Mode::Pooled, "srv-a-pool.test").await;
}

/// TXT `replicaSet=rs0` makes the SRV hosts a replica set: requests go to the primary only.
/// (Taken as a mongos list, the members' Primary / Secondary roles would match no mongos
/// and every request would fail server selection.)
async fn txt_replica_set(mode: Mode, domain: &str) {
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rs0".into(),
        members: 2,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    let dns = DnsStub::start();
    let name = format!("cluster.{domain}");
    let (t0, t1) = (format!("m0.{domain}"), format!("m1.{domain}"));
    serve(&dns, &name, &[(&t0, rs.member(0)), (&t1, rs.member(1))]);
    // One TXT record of two strings, read as one ("replicaSet=rs0").
    dns.set_txt_strings(&name, &[&["replica", "Set=rs0"]]);
    let proxy = start(&format!("mongodb+srv://{name}/?tls=false"), &dns, mode).await;
    for _ in 0..6 {
        find_one(&proxy).await.unwrap();
    }
    assert_eq!(finds(rs.member(0)), 6, "finds must all go to the primary");
    assert_eq!(
        finds(rs.member(1)),
        0,
        "a secondary was used for primary reads"
    );
    // The members are monitored as replica-set members: after a step-down the writes follow
    // the new primary.
    rs.step_down(1, Duration::from_millis(300));
    let stepped = Instant::now();
    loop {
        let c = client(&proxy).await;
        let r = c
            .database("srv")
            .collection::<Document>("w")
            .insert_one(doc! {"x": 1})
            .await;
        c.shutdown().await;
        match r {
            Ok(_) => break,
            Err(e) => assert!(
                stepped.elapsed() < Duration::from_secs(10),
                "writes never reached the new primary: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rs.member(1).stats().command_count("insert"), 1);
    proxy.shutdown().await;
    rs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_txt_replica_set() {
    txt_replica_set(Mode::Passthrough, "srv-b-pass.test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_txt_replica_set() {
    txt_replica_set(Mode::Pooled, "srv-b-pool.test").await;
}

/// A mongos list follows its SRV records: A is replaced by B (and a target outside the
/// domain is skipped); once B serves, A is stopped and never chosen again.
async fn polling_follows_the_srv_records(mode: Mode, domain: &str) {
    if std::env::var("SRV_TEST_LOG").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("mongoguard=debug")
            .with_test_writer()
            .try_init();
    }
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let b = StandIn::start(StandInConfig::default()).await.unwrap();
    let dns = DnsStub::start();
    let name = format!("cluster.{domain}");
    let srv = format!("_mongodb._tcp.{name}");
    let (ta, tb) = (format!("a.{domain}"), format!("b.{domain}"));
    serve(&dns, &name, &[(&ta, &a)]);
    let proxy = start(&format!("mongodb+srv://{name}/?tls=false"), &dns, mode).await;
    for _ in 0..3 {
        find_one(&proxy).await.unwrap();
    }
    assert_eq!((finds(&a), finds(&b)), (3, 0));
    // The records are polled (every 200 ms here).
    let polled = dns.srv_queries(&srv);
    tokio::time::sleep(POLL * 4).await;
    assert!(
        dns.srv_queries(&srv) > polled,
        "the SRV records were not polled"
    );
    // A failed rescan (the name vanishes: NXDOMAIN) keeps the hosts.
    dns.set_srv(&srv, &[]);
    let polled = dns.srv_queries(&srv);
    let emptied = Instant::now();
    while dns.srv_queries(&srv) < polled + 2 {
        // Rescans come every heartbeat_interval (200 ms) after a failed one. (This wait had
        // no bound: a CI run hung here, or elsewhere in this test, for 20 minutes.)
        assert!(
            emptied.elapsed() < Duration::from_secs(10),
            "no SRV rescan for 10 s after the records emptied: {} queries before, {} now",
            polled,
            dns.srv_queries(&srv)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    find_one(&proxy).await.unwrap();
    assert_eq!(finds(&a), 4, "an empty rescan changed the hosts");
    // A leaves, B comes; an out-of-domain target in the same answer is skipped.
    dns.set_srv(
        &srv,
        &[
            (&tb, b.addr().port()),
            ("evil.example.org", a.addr().port()),
        ],
    );
    dns.set_a(&tb, Ipv4Addr::LOCALHOST);
    let changed = Instant::now();
    while finds(&b) == 0 {
        assert!(
            changed.elapsed() < Duration::from_secs(10),
            "requests never reached B after the SRV change"
        );
        find_one(&proxy).await.unwrap();
    }
    println!(
        "{mode:?}: requests reached B {:?} after the SRV change",
        changed.elapsed()
    );
    // A, still running, is no longer chosen: it left the topology.
    let (a_finds, b_finds) = (finds(&a), finds(&b));
    for _ in 0..10 {
        find_one_with(&proxy, false).await.unwrap();
    }
    assert_eq!(
        finds(&a),
        a_finds,
        "A was chosen after it left the SRV records"
    );
    assert_eq!(finds(&b), b_finds + 10);
    a.shutdown().await;
    // No retries now: a find sent to A (stopped) would fail.
    for i in 0..20 {
        find_one_with(&proxy, false)
            .await
            .unwrap_or_else(|e| panic!("find {i} after A stopped: {e}"));
    }
    assert_eq!(
        finds(&b),
        b_finds + 10 + 20,
        "every find after the change goes to B"
    );
    // /readyz probes a server of the topology now, not the URI's first host of the start.
    let ready = http_get(proxy.admin_addr().unwrap(), "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(ready.contains(&tb), "{ready}");
    assert!(a_finds >= 4);
    proxy.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_polling_follows_the_srv_records() {
    bounded(polling_follows_the_srv_records(
        Mode::Passthrough,
        "srv-c-pass.test",
    ))
    .await;
}

/// A whole test within 120 s: a hang fails it instead of holding the suite.
async fn bounded(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the test hung for 120 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_polling_follows_the_srv_records() {
    bounded(polling_follows_the_srv_records(
        Mode::Pooled,
        "srv-c-pool.test",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_failure_fails_the_start() {
    let dns = DnsStub::start();
    for mode in [Mode::Passthrough, Mode::Pooled] {
        let e = start_err("mongodb+srv://missing.srv-d.test/?tls=false", &dns, mode).await;
        assert!(
            e.contains(
                "mongodb+srv://missing.srv-d.test/?tls=false: no SRV records for \
                 _mongodb._tcp.missing.srv-d.test"
            ),
            "{e}"
        );
    }
    // Two TXT records, or a TXT option that is not allowed.
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    serve(&dns, "txt.srv-d.test", &[("s1.srv-d.test", &a)]);
    dns.set_txt("txt.srv-d.test", &["replicaSet=a", "authSource=b"]);
    let e = start_err(
        "mongodb+srv://txt.srv-d.test/?tls=false",
        &dns,
        Mode::Pooled,
    )
    .await;
    assert!(e.contains("2 TXT records"), "{e}");
    dns.set_txt("txt.srv-d.test", &["connectTimeoutMS=1"]);
    let e = start_err(
        "mongodb+srv://txt.srv-d.test/?tls=false",
        &dns,
        Mode::Passthrough,
    )
    .await;
    assert!(e.contains("\"connectTimeoutMS\" is not allowed"), "{e}");
    assert_eq!(finds(&a), 0);
    a.shutdown().await;
}

/// The binary: a failed resolution is a clear error and a non-zero exit; `--check-config`
/// does not resolve at all.
#[test]
fn the_process_does_not_start_without_its_srv_records() {
    let dns = DnsStub::start();
    let dir = std::env::temp_dir().join(format!("mongoguard-srv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mongoguard.toml");
    std::fs::write(
        &file,
        format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\n\n[upstream]\n\
             uri = \"mongodb+srv://gone.srv-d2.test/?tls=false\"\n\
             dns_server = \"{}\"\nsrv_poll_interval = \"1s\"\n",
            dns.addr()
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_mongoguard");
    let out = std::process::Command::new(bin)
        .arg("-c")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mongoguard started: {stderr}");
    assert!(
        stderr.contains("no SRV records for _mongodb._tcp.gone.srv-d2.test"),
        "{stderr}"
    );
    assert_eq!(dns.srv_queries("_mongodb._tcp.gone.srv-d2.test"), 1);
    // --check-config prints the URI as written and asks no name server.
    let out = std::process::Command::new(bin)
        .arg("--check-config")
        .arg("-c")
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("uri = \"mongodb+srv://gone.srv-d2.test/?tls=false\""),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("dns_server = \"{}\"", dns.addr())),
        "{stdout}"
    );
    assert!(stdout.contains("srv_poll_interval = \"1s\""), "{stdout}");
    assert_eq!(dns.srv_queries("_mongodb._tcp.gone.srv-d2.test"), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_outside_the_domain_is_refused() {
    let a = StandIn::start(StandInConfig::default()).await.unwrap();
    let dns = DnsStub::start();
    serve(&dns, "cluster.srv-e.test", &[("s1.elsewhere.test", &a)]);
    for mode in [Mode::Passthrough, Mode::Pooled] {
        let e = start_err("mongodb+srv://cluster.srv-e.test/?tls=false", &dns, mode).await;
        assert!(
            e.contains("SRV target s1.elsewhere.test is not in the domain srv-e.test"),
            "{e}"
        );
    }
    // A short name is its own domain: a target beside it is refused too.
    serve(&dns, "srv-e2.test", &[("s1.test", &a)]);
    let e = start_err("mongodb+srv://srv-e2.test/?tls=false", &dns, Mode::Pooled).await;
    assert!(e.contains("not in the domain srv-e2.test"), "{e}");
    assert_eq!(finds(&a), 0, "a refused target was contacted");
    a.shutdown().await;
}
