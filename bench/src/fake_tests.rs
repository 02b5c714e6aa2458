//! End-to-end tests of the request loop against an in-process fake server.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::wire::{parse_op_msg_body, Body, Endpoint, OP_MSG};
use crate::workload::{self, Op, Scenario, Settings};

#[derive(Clone, Copy)]
enum Mode {
    Healthy,
    /// Reply `ok: 0` to every Nth non-hello request of a connection.
    FailEvery(u32),
    /// Close the connection right after answering `hello`.
    CloseAfterHello,
}

#[derive(Default)]
struct Seen {
    commands: HashMap<String, u64>,
    insert_ids: HashSet<i64>,
    duplicate_ids: u64,
}

async fn serve(mode: Mode) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(conn(sock, mode, s.clone()));
        }
    });
    (addr, seen)
}

async fn conn(mut sock: TcpStream, mode: Mode, seen: Arc<Mutex<Seen>>) {
    let mut n = 0u32;
    loop {
        let mut h = [0u8; 16];
        if sock.read_exact(&mut h).await.is_err() {
            return;
        }
        let len = i32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let rid = i32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        assert_eq!(i32::from_le_bytes([h[12], h[13], h[14], h[15]]), OP_MSG);
        let mut payload = vec![0u8; len - 16];
        if sock.read_exact(&mut payload).await.is_err() {
            return;
        }
        let body = parse_op_msg_body(&payload).expect("client sent a valid OP_MSG");
        assert!(body.get_str("$db").is_ok(), "every command carries $db");
        let name = body
            .iter()
            .next()
            .and_then(|e| e.ok())
            .map(|(k, _)| k.to_string())
            .unwrap_or_default();
        let mut reply = doc! { "ok": 1.0 };
        {
            let mut seen = seen.lock().expect("lock");
            *seen.commands.entry(name.clone()).or_default() += 1;
            if name == "insert" {
                let docs = body.get_array("documents").expect("documents");
                for d in docs.into_iter().flatten() {
                    let id = d.as_document().and_then(|d| d.get_i64("_id").ok());
                    let id = id.expect("client-generated int64 _id");
                    if !seen.insert_ids.insert(id) {
                        seen.duplicate_ids += 1;
                        reply = doc! { "ok": 1.0, "n": 0, "writeErrors": [{ "code": 11000 }] };
                    }
                }
            }
        }
        if name != "hello" {
            n += 1;
            if let Mode::FailEvery(k) = mode {
                if n.is_multiple_of(k) {
                    reply = doc! { "ok": 0.0, "errmsg": "injected", "code": 8 };
                }
            }
        }
        let encoded = Body::encode(&reply).expect("encode");
        let bytes = encoded.payload();
        let mut out = Vec::new();
        out.extend_from_slice(&((16 + bytes.len()) as i32).to_le_bytes());
        out.extend_from_slice(&7i32.to_le_bytes());
        out.extend_from_slice(&rid.to_le_bytes());
        out.extend_from_slice(&OP_MSG.to_le_bytes());
        out.extend_from_slice(bytes);
        if sock.write_all(&out).await.is_err() {
            return;
        }
        if matches!(mode, Mode::CloseAfterHello) && name == "hello" {
            return;
        }
    }
}

fn settings() -> Settings {
    Settings {
        db: "loadgen".into(),
        coll: "bench".into(),
        docs: 2500,
        warmup: Duration::from_millis(50),
        duration: Duration::from_millis(300),
        scenario: Scenario::Steady,
        auth: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mix_against_healthy_server() {
    let (addr, seen) = serve(Mode::Healthy).await;
    let s = settings();
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup");
    let next_id = Arc::new(AtomicI64::new(s.docs));
    let r = workload::run(&Endpoint::plain(&addr), Op::Mix, 4, &s, next_id, None)
        .await
        .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(r.hist.len() > 10);
    let seen = seen.lock().expect("lock");
    for c in ["hello", "drop", "find", "insert", "ping"] {
        assert!(seen.commands.get(c).copied().unwrap_or(0) > 0, "no {c}");
    }
    assert_eq!(seen.duplicate_ids, 0);
    // setup inserted 0..2500; the run's inserts are all above.
    assert!(seen.insert_ids.len() > 2500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_errors_are_counted_not_fatal() {
    let (addr, _) = serve(Mode::FailEvery(5)).await;
    let s = settings();
    // Measures its own process (the fake server runs in it): a CPU time is read.
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Ping,
        2,
        &s,
        Arc::new(AtomicI64::new(0)),
        Some(std::process::id()),
    )
    .await
    .expect("run");
    assert!(r.errors > 0);
    assert!(r.hist.len() > 3 * r.errors, "successes keep going");
    assert!(r.first_error.unwrap_or_default().contains("injected"));
    assert!(r.cpu.is_some(), "the process's CPU time was read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_are_counted_and_run_ends() {
    let (addr, _) = serve(Mode::CloseAfterHello).await;
    let s = settings();
    let started = std::time::Instant::now();
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Find,
        2,
        &s,
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert!(r.errors > 0);
    assert_eq!(r.hist.len(), 0);
    assert!(started.elapsed() < Duration::from_secs(3));
}

// --- against the in-process stand-in, with SCRAM-SHA-256 ---------------------------------

use mongoguard_standin::{StandIn, StandInConfig};

use crate::auth::AuthOptions;

async fn standin_with_user() -> StandIn {
    StandIn::start(StandInConfig {
        users: vec![("app".into(), "apppw".into())],
        ..StandInConfig::default()
    })
    .await
    .expect("stand-in")
}

fn auth(password: &str, speculative: bool, skip_empty_exchange: bool) -> Option<AuthOptions> {
    Some(AuthOptions {
        user: "app".into(),
        password: password.into(),
        db: "admin".into(),
        speculative,
        skip_empty_exchange,
    })
}

fn serverless(auth: Option<AuthOptions>) -> Settings {
    // Unoptimised PBKDF2 (debug builds) takes tens of ms per authentication: a longer window
    // so that every run records operations even with the other tests running alongside.
    Settings {
        docs: 100,
        warmup: Duration::ZERO,
        duration: Duration::from_millis(1500),
        scenario: Scenario::Serverless,
        auth,
        ..settings()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_speculative_against_standin() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = serverless(auth("apppw", true, true));
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Ping,
        2,
        &s,
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    let ops = r.hist.len();
    assert!(ops > 0);
    let scram = r.client_scram.as_ref().expect("client SCRAM timings");
    assert_eq!(scram.len(), ops);
    assert_eq!(r.speculative, ops, "every op authenticated inside hello");
    assert!(r.scram_iterations >= 4096);
    let stats = standin.stats();
    // Warmup ops count too: at least one connection and one authentication per measured op.
    assert!(stats.connections_accepted() >= ops);
    assert!(stats.authentications() >= ops);
    assert_eq!(
        stats.command_count("saslStart"),
        0,
        "speculative: no saslStart"
    );
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_sasl_start_with_empty_exchange() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = serverless(auth("apppw", false, false));
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup with auth");
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Find,
        2,
        &s,
        Arc::new(AtomicI64::new(100)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(!r.hist.is_empty());
    assert_eq!(r.speculative, 0);
    let stats = standin.stats();
    let starts = stats.command_count("saslStart");
    assert!(starts > r.hist.len());
    // client-final and the empty exchange: two saslContinue per conversation.
    assert_eq!(stats.command_count("saslContinue"), 2 * starts);
    assert_eq!(stats.authentications(), starts);
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_wrong_password_is_an_error() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = serverless(auth("wrong", true, true));
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Ping,
        1,
        &s,
        Arc::new(AtomicI64::new(0)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.hist.len(), 0);
    assert!(r.errors > 0);
    let e = r.first_error.unwrap_or_default();
    assert!(e.contains("Authentication failed"), "{e}");
    standin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_authenticates_each_connection_once() {
    let standin = standin_with_user().await;
    let addr = standin.addr().to_string();
    let s = Settings {
        docs: 100,
        auth: auth("apppw", true, true),
        ..settings()
    };
    workload::setup(&Endpoint::plain(&addr), &s)
        .await
        .expect("setup with auth");
    let r = workload::run(
        &Endpoint::plain(&addr),
        Op::Mix,
        3,
        &s,
        Arc::new(AtomicI64::new(100)),
        None,
    )
    .await
    .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(r.hist.len() > 10);
    assert!(r.client_scram.is_none());
    let stats = standin.stats();
    // setup's connection + one per worker.
    assert_eq!(stats.connections_accepted(), 4);
    assert_eq!(stats.authentications(), 4);
    standin.shutdown().await;
}

/// A TLS terminator in front of `upstream` with a certificate for 127.0.0.1 signed by a fresh
/// CA; returns its address, the CA file and the count of completed TLS handshakes.
async fn tls_front(
    upstream: String,
    dir: &std::path::Path,
) -> (
    String,
    std::path::PathBuf,
    Arc<std::sync::atomic::AtomicU64>,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    use tokio_rustls::rustls;
    std::fs::create_dir_all(dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let handshakes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (acceptor, upstream, count) = (acceptor.clone(), upstream.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut up = TcpStream::connect(&upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    (addr, ca_file, handshakes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serverless_over_tls_does_one_handshake_per_operation() {
    let standin = standin_with_user().await;
    let dir = std::env::temp_dir().join(format!("loadgen-tls-{}", std::process::id()));
    let (addr, ca, handshakes) = tls_front(standin.addr().to_string(), &dir).await;
    let ep = Endpoint {
        addr,
        tls: Some(crate::wire::TlsClient::new(&ca, "127.0.0.1", false).unwrap()),
    };
    let s = serverless(auth("apppw", true, true));
    let r = workload::run(&ep, Op::Ping, 2, &s, Arc::new(AtomicI64::new(0)), None)
        .await
        .expect("run");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(!r.hist.is_empty());
    // Every completed operation had its own TLS connection (plus at most the ones cut off
    // by the end of the window).
    let n = handshakes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        n >= r.completed && n <= r.completed + 2,
        "{n} handshakes, {} ops",
        r.completed
    );

    // A CA that did not sign the certificate: every connection fails.
    let other = dir.join("other");
    let (_, wrong_ca, _) = tls_front(standin.addr().to_string(), &other).await;
    let bad = Endpoint {
        addr: ep.addr.clone(),
        tls: Some(crate::wire::TlsClient::new(&wrong_ca, "127.0.0.1", false).unwrap()),
    };
    let r = workload::run(&bad, Op::Ping, 1, &s, Arc::new(AtomicI64::new(0)), None)
        .await
        .expect("run");
    assert_eq!(r.hist.len(), 0);
    assert!(r.errors > 0);
    let _ = std::fs::remove_dir_all(&dir);
}
