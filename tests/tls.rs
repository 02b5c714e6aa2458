//! TLS on both sides with throwaway certificates (rcgen): the Rust driver through a TLS
//! listener (with and without client certificates), mongoguard's upstream TLS (toward a
//! second, TLS-listening mongoguard in front of the stand-in), and the failure cases: a
//! plaintext client, a wrong CA, an expired certificate, a wrong host name, a missing client
//! certificate. Every failure must be a clean refusal, and the proxy keeps serving.

mod support;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bson::{doc, Document};
use mongodb::{options::ClientOptions, Client};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
};
use mongoguard_standin::{StandIn, StandInConfig};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Pki {
    dir: PathBuf,
}

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Pki {
    fn new() -> Pki {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "mongoguard-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Pki { dir }
    }

    fn write(&self, name: &str, pem: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    }

    fn ca(&self, name: &str) -> (Ca, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("mongoguard test CA {name}"),
        );
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let path = self.write(&format!("{name}.pem"), &cert.pem());
        (Ca { cert, key }, path)
    }

    /// A leaf for `dns` names (and 127.0.0.1 when `ip`), signed by `ca`; writes cert.pem,
    /// key.pem and a combined PEM; returns (cert, key, combined).
    fn leaf(
        &self,
        ca: &Ca,
        name: &str,
        dns: &[&str],
        ip: bool,
        expired: bool,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        if ip {
            params
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
        }
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
        let c = self.write(&format!("{name}.crt"), &cert.pem());
        let k = self.write(&format!("{name}.key"), &key.serialize_pem());
        let both = self.write(
            &format!("{name}-combined.pem"),
            &format!("{}{}", cert.pem(), key.serialize_pem()),
        );
        (c, k, both)
    }
}

async fn tls_proxy(
    upstream: &str,
    cert: &Path,
    key: &Path,
    client_ca: Option<&PathBuf>,
) -> ProxyHandle {
    let mut cfg = Config::for_upstream(upstream).unwrap();
    cfg.tls.cert_file = Some(cert.to_path_buf());
    cfg.tls.key_file = Some(key.to_path_buf());
    cfg.tls.client_ca_file = client_ca.cloned();
    cfg.tls.handshake_timeout = Duration::from_secs(5);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    Proxy::start(Arc::new(cfg)).await.expect("start TLS proxy")
}

async fn driver(uri: &str) -> Client {
    let mut opts = ClientOptions::parse(uri).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(3));
    opts.connect_timeout = Some(Duration::from_secs(3));
    Client::with_options(opts).unwrap()
}

async fn works(uri: &str) -> Result<(), mongodb::error::Error> {
    let c = driver(uri).await;
    let coll = c.database("tls").collection::<Document>("c");
    coll.insert_one(doc! {"x": 1}).await?;
    let got = coll.find_one(doc! {"x": 1}).await?;
    assert!(got.is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_over_tls_and_every_failure_is_clean() {
    let pki = Pki::new();
    let (ca, ca_path) = pki.ca("ca");
    let (_other, other_ca_path) = pki.ca("other");
    let (cert, key, _) = pki.leaf(&ca, "server", &["localhost"], true, false);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = tls_proxy(&standin.uri(), &cert, &key, None).await;
    let port = proxy.local_addr().port();

    // The driver verifies mongoguard's certificate with the CA.
    works(&format!(
        "mongodb://localhost:{port}/?tls=true&tlsCAFile={}",
        ca_path.display()
    ))
    .await
    .expect("TLS through mongoguard");

    // Wrong CA: the driver refuses the server.
    let err = works(&format!(
        "mongodb://localhost:{port}/?tls=true&tlsCAFile={}",
        other_ca_path.display()
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(
            err.kind.as_ref(),
            mongodb::error::ErrorKind::ServerSelection { .. }
        ),
        "{err}"
    );

    // A plaintext client: its bytes are not a TLS ClientHello; mongoguard closes the
    // connection without answering and counts the failure.
    let before = proxy.stats().tls_handshake_failures.get();
    let mut raw = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    let hello =
        mongoguard::wire::builder::MsgBuilder::new(bson::rawdoc! {"hello": 1, "$db": "admin"})
            .encode(1, 0);
    raw.write_all(&hello).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(20), raw.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    // rustls may answer with a TLS alert record (content type 21), never a MongoDB reply.
    assert!(
        n == 0 || buf[0] == 21,
        "plaintext client got {n} bytes: {:?}",
        &buf[..n.min(16)]
    );
    // The proxy counts the failure once its handshake future ends, which may be just after the
    // client read the alert: wait for it (bounded).
    let counted = tokio::time::timeout(Duration::from_secs(20), async {
        while proxy.stats().tls_handshake_failures.get() <= before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "the failed handshake was never counted");

    // The proxy still serves TLS clients afterwards.
    works(&format!(
        "mongodb://localhost:{port}/?tls=true&tlsCAFile={}",
        ca_path.display()
    ))
    .await
    .unwrap();
    proxy.shutdown().await;

    // An expired server certificate is refused by the driver.
    let (old_cert, old_key, _) = pki.leaf(&ca, "expired", &["localhost"], true, true);
    let expired = tls_proxy(&standin.uri(), &old_cert, &old_key, None).await;
    let err = works(&format!(
        "mongodb://localhost:{}/?tls=true&tlsCAFile={}",
        expired.local_addr().port(),
        ca_path.display()
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(
            err.kind.as_ref(),
            mongodb::error::ErrorKind::ServerSelection { .. }
        ),
        "{err}"
    );
    assert!(expired.stats().tls_handshake_failures.get() >= 1);
    expired.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_when_required() {
    let pki = Pki::new();
    let (ca, ca_path) = pki.ca("ca");
    let (cert, key, _) = pki.leaf(&ca, "server", &["localhost"], true, false);
    let (_, _, client_pem) = pki.leaf(&ca, "client", &["app-client"], false, false);
    let (rogue_ca, _) = pki.ca("rogue");
    let (_, _, rogue_pem) = pki.leaf(&rogue_ca, "rogue", &["app-client"], false, false);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let proxy = tls_proxy(&standin.uri(), &cert, &key, Some(&ca_path)).await;
    let port = proxy.local_addr().port();
    let base = format!(
        "mongodb://localhost:{port}/?tls=true&tlsCAFile={}",
        ca_path.display()
    );
    assert!(
        works(&base).await.is_err(),
        "no client certificate was accepted"
    );
    assert!(
        works(&format!(
            "{base}&tlsCertificateKeyFile={}",
            rogue_pem.display()
        ))
        .await
        .is_err(),
        "a certificate from another CA was accepted"
    );
    works(&format!(
        "{base}&tlsCertificateKeyFile={}",
        client_pem.display()
    ))
    .await
    .expect("a client certificate from the CA");
    assert!(proxy.stats().tls_handshake_failures.get() >= 2);
    proxy.shutdown().await;
}

/// Whether a client's CRUD works through a passthrough mongoguard whose upstream URI is `uri`.
async fn through_front(uri: &str) -> bool {
    let mut cfg = Config::for_upstream(uri).unwrap();
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    let front = Proxy::start(Arc::new(cfg)).await.unwrap();
    let ok = works(&format!("mongodb://{}", front.local_addr()))
        .await
        .is_ok();
    front.shutdown().await;
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_verifies_the_server() {
    let pki = Pki::new();
    let (ca, ca_path) = pki.ca("ca");
    let (_other, other_ca_path) = pki.ca("other");
    // The TLS upstream: a mongoguard with a TLS listener whose certificate names only
    // "localhost" (no IP), in front of the stand-in.
    let (cert, key, _) = pki.leaf(&ca, "upstream", &["localhost"], false, false);
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let upstream = tls_proxy(&standin.uri(), &cert, &key, None).await;
    let up_port = upstream.local_addr().port();

    let ca = ca_path.display();
    // Verified chain and name: works, end to end.
    let base = format!("tls=true&tlsCAFile={ca}");
    assert!(through_front(&format!("mongodb://localhost:{up_port}/?{base}")).await);
    // Wrong CA: mongoguard refuses the upstream; the client gets HostUnreachable.
    let other = format!("tls=true&tlsCAFile={}", other_ca_path.display());
    assert!(!through_front(&format!("mongodb://localhost:{up_port}/?{other}")).await);
    // The certificate names "localhost", not 127.0.0.1: refused by default...
    assert!(!through_front(&format!("mongodb://127.0.0.1:{up_port}/?{base}")).await);
    // ...and accepted only with the explicit (logged) tlsAllowInvalidHostnames.
    let lax = format!("mongodb://127.0.0.1:{up_port}/?{base}&tlsAllowInvalidHostnames=true");
    assert!(through_front(&lax).await);

    // Pooled mode over upstream TLS.
    let mut cfg = Config::for_upstream(&format!(
        "mongodb://localhost:{up_port}/?tls=true&tlsCAFile={}",
        ca_path.display()
    ))
    .unwrap();
    cfg.proxy.mode = mongoguard::config::Mode::Pooled;
    cfg.auth.allow_unauthenticated = true;
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    cfg.validate().unwrap();
    let pooled = Proxy::start(Arc::new(cfg)).await.unwrap();
    works(&format!("mongodb://{}", pooled.local_addr()))
        .await
        .unwrap();
    pooled.shutdown().await;

    // tls* options without tls=true are a startup error, not a silent plaintext link.
    let cfg = Config::for_upstream(&format!(
        "mongodb://localhost:{up_port}/?tlsCAFile={}",
        ca_path.display()
    ))
    .unwrap();
    assert!(Proxy::start(Arc::new(cfg)).await.is_err());
    upstream.shutdown().await;
}

/// A TLS handshake with the proxy by a client trusting only `ca`: Ok when it completes.
async fn handshake_trusting(addr: std::net::SocketAddr, ca: &Ca) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Certificates are rotated on disk (cert-manager, an ACME client) and `systemctl reload`
/// follows: SIGHUP left the certificate loaded at start in use until it expired and every
/// client refused it; only a restart, which drains every connection, took the new one. SIGHUP
/// reloads the certificate, the key and the client CA; an invalid set is refused, counted and
/// the one in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_keeps_it_when_the_new_one_is_broken() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let pki = Pki::new();
    let (ca1, _) = pki.ca("ca1");
    let (ca2, _) = pki.ca("ca2");
    let (cert1, key1, _) = pki.leaf(&ca1, "leaf1", &["localhost"], true, false);
    let (cert2, key2, _) = pki.leaf(&ca2, "leaf2", &["localhost"], true, false);
    // The paths the configuration names, holding leaf1 at start.
    let cert = pki.dir.join("server.crt");
    let key = pki.dir.join("server.key");
    std::fs::copy(&cert1, &cert).unwrap();
    std::fs::copy(&key1, &key).unwrap();
    let proxy = tls_proxy(&standin.uri(), &cert, &key, None).await;
    let addr = proxy.local_addr();
    assert_eq!(handshake_trusting(addr, &ca1).await, Ok(()));
    assert!(handshake_trusting(addr, &ca2).await.is_err());

    // Rotated on disk, then SIGHUP (here for this proxy only).
    std::fs::copy(&cert2, &cert).unwrap();
    std::fs::copy(&key2, &key).unwrap();
    proxy.hangup();
    assert_eq!(
        handshake_trusting(addr, &ca2).await,
        Ok(()),
        "the rotated certificate is served after SIGHUP"
    );
    assert!(handshake_trusting(addr, &ca1).await.is_err());

    // A broken certificate file: refused, counted, the rotated one stays.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    proxy.hangup();
    assert_eq!(handshake_trusting(addr, &ca2).await, Ok(()));
    let scrape = proxy.metrics().encode();
    let value = |name: &str| {
        scrape.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    assert_eq!(value("mongoguard_tls_reloads_total"), Some(1.0));
    assert_eq!(value("mongoguard_tls_reload_failures_total"), Some(1.0));
    proxy.shutdown().await;
    standin.shutdown().await;
}

/// `works`, tried up to 5 times: the upstream was marked unknown by the failed handshakes,
/// and a session waits for the monitor's next heartbeat before it connects.
async fn works_soon(uri: &str) -> Result<(), mongodb::error::Error> {
    let mut last = None;
    for _ in 0..5 {
        match works(uri).await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap())
}

/// The upstream's CA (the URI's `tlsCAFile`) or mongoguard's client certificate toward it
/// (`tlsCertificateKeyFile`) is rotated on disk and `systemctl reload` follows: SIGHUP
/// reloaded the listener's certificate but not these, so once the upstream served a
/// certificate from the new CA every new upstream connection (sessions, monitors, pools)
/// failed until a restart. SIGHUP reloads them like the listener's: the rotated CA is trusted
/// for the next connections, a broken file is refused, counted and the set in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_upstream_ca_and_keeps_it_when_the_new_one_is_broken() {
    let pki = Pki::new();
    let (ca1, ca1_path) = pki.ca("up-ca1");
    let (ca2, ca2_path) = pki.ca("up-ca2");
    let (cert1, key1, _) = pki.leaf(&ca1, "up-leaf1", &["localhost"], false, false);
    let (cert2, key2, _) = pki.leaf(&ca2, "up-leaf2", &["localhost"], false, false);
    // The TLS upstream: a mongoguard with a TLS listener in front of the stand-in.
    let up_cert = pki.dir.join("up.crt");
    let up_key = pki.dir.join("up.key");
    std::fs::copy(&cert1, &up_cert).unwrap();
    std::fs::copy(&key1, &up_key).unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let upstream = tls_proxy(&standin.uri(), &up_cert, &up_key, None).await;
    // The front's tlsCAFile, holding ca1 at start.
    let front_ca = pki.dir.join("front-ca.pem");
    std::fs::copy(&ca1_path, &front_ca).unwrap();
    let mut cfg = Config::for_upstream(&format!(
        "mongodb://localhost:{}/?tls=true&tlsCAFile={}",
        upstream.local_addr().port(),
        front_ca.display()
    ))
    .unwrap();
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    let front = Proxy::start(Arc::new(cfg)).await.unwrap();
    let through = format!("mongodb://{}", front.local_addr());
    works(&through).await.expect("through the front, ca1");

    // The upstream rotates to a certificate from ca2: the front no longer trusts it.
    std::fs::copy(&cert2, &up_cert).unwrap();
    std::fs::copy(&key2, &up_key).unwrap();
    upstream.hangup();
    assert!(
        works(&through).await.is_err(),
        "the front trusted a certificate its CA file does not name"
    );
    // The operator puts ca2 in the front's CA file and reloads it.
    std::fs::copy(&ca2_path, &front_ca).unwrap();
    front.hangup();
    works_soon(&through)
        .await
        .expect("the rotated upstream CA is trusted after SIGHUP");

    // A broken CA file: refused, counted, the rotated CA stays in force.
    std::fs::write(&front_ca, "not a certificate\n").unwrap();
    front.hangup();
    works_soon(&through)
        .await
        .expect("a broken CA file keeps the CA in force");
    let scrape = front.metrics().encode();
    let value = |name: &str| {
        scrape.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    assert_eq!(value("mongoguard_upstream_tls_reloads_total"), Some(1.0));
    assert_eq!(
        value("mongoguard_upstream_tls_reload_failures_total"),
        Some(1.0)
    );
    // The listener's own TLS counters are not touched by the upstream's files.
    assert_eq!(value("mongoguard_tls_reload_failures_total"), Some(0.0));
    let _ = (&ca1, &ca2);
    front.shutdown().await;
    upstream.shutdown().await;
    standin.shutdown().await;
}

/// The same for mongoguard's client certificate toward an upstream that requires one
/// (`tlsCertificateKeyFile`): the upstream starts trusting only a new client CA, the new
/// certificate is written over the file, and SIGHUP makes the next upstream connections
/// present it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_upstream_client_certificate() {
    let pki = Pki::new();
    let (server_ca, server_ca_path) = pki.ca("srv-ca");
    let (cert, key, _) = pki.leaf(&server_ca, "srv", &["localhost"], false, false);
    let (client_ca1, client_ca1_path) = pki.ca("cli-ca1");
    let (client_ca2, client_ca2_path) = pki.ca("cli-ca2");
    let (_, _, client1) = pki.leaf(&client_ca1, "cli1", &["mongoguard"], false, false);
    let (_, _, client2) = pki.leaf(&client_ca2, "cli2", &["mongoguard"], false, false);
    // The upstream requires client certificates from the CA in up-client-ca.pem (ca1).
    let up_client_ca = pki.dir.join("up-client-ca.pem");
    std::fs::copy(&client_ca1_path, &up_client_ca).unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let upstream = tls_proxy(&standin.uri(), &cert, &key, Some(&up_client_ca)).await;
    // The front presents front-client.pem (signed by ca1 at start).
    let front_pem = pki.dir.join("front-client.pem");
    std::fs::copy(&client1, &front_pem).unwrap();
    let mut cfg = Config::for_upstream(&format!(
        "mongodb://localhost:{}/?tls=true&tlsCAFile={}&tlsCertificateKeyFile={}",
        upstream.local_addr().port(),
        server_ca_path.display(),
        front_pem.display()
    ))
    .unwrap();
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    let front = Proxy::start(Arc::new(cfg)).await.unwrap();
    let through = format!("mongodb://{}", front.local_addr());
    works(&through)
        .await
        .expect("through the front, client certificate 1");
    // The upstream now trusts only ca2 for clients.
    std::fs::copy(&client_ca2_path, &up_client_ca).unwrap();
    upstream.hangup();
    assert!(
        works(&through).await.is_err(),
        "the upstream accepted a client certificate from a CA it no longer trusts"
    );
    std::fs::copy(&client2, &front_pem).unwrap();
    front.hangup();
    works_soon(&through)
        .await
        .expect("the rotated client certificate is presented after SIGHUP");
    front.shutdown().await;
    upstream.shutdown().await;
    standin.shutdown().await;
}
