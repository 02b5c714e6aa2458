//! Shared scaffolding for the real-driver integration tests.
//!
//! [`stack`] starts a mongoguard proxy (in process) in front of either
//!
//! * a real mongod, when the environment variable `MONGOGUARD_TEST_UPSTREAM` holds its
//!   `mongodb://` URI (see `integration/run.sh`), or
//! * an in-process `mongoguard-standin` otherwise.
//!
//! Every test works in its own database ([`unique_db`]), so the tests run in parallel and can
//! share one real mongod with other runs. Checks of what reached the upstream are made through a
//! *direct* connection ([`Stack::direct_client`]) that bypasses the proxy.
#![allow(dead_code)]

pub mod dns;
pub mod guard;
pub mod identities;
pub mod raw;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bson::{Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::Client;
use mongoguard::app::{Proxy, ProxyHandle};
use mongoguard::config::Config;
use mongoguard_standin::{StandIn, StandInConfig};

/// Name of the variable that points the suite at a real mongod instead of the stand-in.
pub const UPSTREAM_ENV: &str = "MONGOGUARD_TEST_UPSTREAM";

/// A proxy and the upstream it fronts.
pub struct Stack {
    pub proxy: ProxyHandle,
    /// `None` when the upstream is a real mongod (`MONGOGUARD_TEST_UPSTREAM`).
    pub standin: Option<StandIn>,
    /// `mongodb://127.0.0.1:PORT` of the proxy (no options).
    pub proxy_uri: String,
    /// URI of the upstream itself, for verification that bypasses the proxy.
    pub direct_uri: String,
}

/// The real upstream's URI, when the suite runs against a real mongod.
pub fn real_upstream() -> Option<String> {
    std::env::var(UPSTREAM_ENV)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A proxy in front of the real mongod named by `MONGOGUARD_TEST_UPSTREAM`, or in front of a
/// fresh stand-in with the default configuration.
pub async fn stack() -> Stack {
    stack_with(StandInConfig::default()).await
}

/// Like [`stack`], with a specific stand-in configuration (ignored against a real mongod).
pub async fn stack_with(standin_config: StandInConfig) -> Stack {
    match real_upstream() {
        Some(uri) => {
            let proxy = start_proxy(&proxy_upstream_uri(&uri)).await;
            Stack {
                proxy_uri: format!("mongodb://{}", proxy.local_addr()),
                proxy,
                standin: None,
                direct_uri: uri,
            }
        }
        None => standin_stack(standin_config).await,
    }
}

/// Always a stand-in (even when `MONGOGUARD_TEST_UPSTREAM` is set), with the proxy in front.
pub async fn standin_stack(standin_config: StandInConfig) -> Stack {
    let standin = StandIn::start(standin_config)
        .await
        .expect("start the mongoguard stand-in");
    let direct_uri = standin.uri();
    let proxy = start_proxy(&direct_uri).await;
    Stack {
        proxy_uri: format!("mongodb://{}", proxy.local_addr()),
        proxy,
        standin: Some(standin),
        direct_uri,
    }
}

async fn start_proxy(upstream: &str) -> ProxyHandle {
    let mut cfg = Config::for_upstream(upstream)
        .unwrap_or_else(|e| panic!("mongoguard config for upstream {upstream}: {e:?}"));
    // Violation records are counted, not printed over the test output.
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    Proxy::start(Arc::new(cfg))
        .await
        .unwrap_or_else(|e| panic!("start mongoguard in front of {upstream}: {e:?}"))
}

/// `mongodb://[user@]hosts` of a URI: the proxy gets the bare address list, without the
/// client-side options (`directConnection`, `replicaSet`...) meant for the direct connection.
pub fn proxy_upstream_uri(uri: &str) -> String {
    let (scheme, rest) = match uri.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("mongodb", uri),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    format!("{scheme}://{}", &rest[..end])
}

/// A URI with `options` (`a=b&c=d`, may be empty) merged into its query string: an option
/// already present (names compare case-insensitively, as in the connection-string spec) takes
/// the new value, since drivers reject repeated options.
pub fn uri_with(uri: &str, options: &str) -> String {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    let mut merged: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').chain(options.split('&')) {
        if pair.is_empty() {
            continue;
        }
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match merged.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(key)) {
            Some(existing) => existing.1 = value.to_string(),
            None => merged.push((key.to_string(), value.to_string())),
        }
    }
    if merged.is_empty() {
        return base.to_string();
    }
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let slash = if base[authority_start..].contains('/') {
        ""
    } else {
        "/"
    };
    let query: Vec<String> = merged.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{base}{slash}?{}", query.join("&"))
}

impl Stack {
    pub fn is_real_upstream(&self) -> bool {
        self.standin.is_none()
    }

    pub fn standin(&self) -> &StandIn {
        self.standin
            .as_ref()
            .expect("this check needs the stand-in upstream")
    }

    /// The proxy's URI with `directConnection=true` and `extra` options (`a=b&c=d`).
    pub fn proxy_uri_with(&self, extra: &str) -> String {
        let defaults = uri_with(&self.proxy_uri, DEFAULT_OPTIONS);
        uri_with(&uri_with(&defaults, "directConnection=true"), extra)
    }

    /// A client through the proxy (`directConnection=true`).
    pub async fn proxy_client(&self, extra: &str) -> Client {
        client(&self.proxy_uri_with(extra)).await
    }

    /// A client through the proxy with the driver's command and SDAM events recorded.
    pub async fn proxy_probe(&self, extra: &str) -> Probe {
        Probe::connect(&self.proxy_uri_with(extra)).await
    }

    /// The upstream's URI with `directConnection=true` (a replica-set member is used alone).
    pub fn direct_uri_with(&self, extra: &str) -> String {
        // Defaults first, so that options given in MONGOGUARD_TEST_UPSTREAM win.
        let defaults = uri_with(
            &proxy_upstream_uri(&self.direct_uri),
            &format!("{DEFAULT_OPTIONS}&directConnection=true"),
        );
        let given = self.direct_uri.split_once('?').map_or("", |(_, q)| q);
        uri_with(&uri_with(&defaults, given), extra)
    }

    /// A client straight to the upstream, bypassing the proxy.
    pub async fn direct_client(&self) -> Client {
        client(&self.direct_uri_with("")).await
    }

    /// Graceful shutdown of the proxy, then of the stand-in.
    pub async fn shutdown(self) {
        self.proxy.shutdown().await;
        if let Some(standin) = self.standin {
            standin.shutdown().await;
        }
    }
}

const DEFAULT_OPTIONS: &str = "serverSelectionTimeoutMS=30000&connectTimeoutMS=20000";

pub async fn client(uri: &str) -> Client {
    let opts = ClientOptions::parse(uri)
        .await
        .unwrap_or_else(|e| panic!("parse {uri}: {e}"));
    Client::with_options(opts).unwrap_or_else(|e| panic!("client for {uri}: {e}"))
}

/// A database name unique to this test, this process and this moment, at most 63 bytes.
pub fn unique_db(tag: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000)
        .unwrap_or(0);
    let tag: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(30)
        .collect();
    format!("mgt_{tag}_{}_{n}_{nanos}", std::process::id())
}

/// A numeric field of any BSON numeric type, as i64.
pub fn num(doc: &Document, key: &str) -> i64 {
    match doc.get(key) {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Double(v)) if v.fract() == 0.0 => *v as i64,
        other => panic!("field {key:?} is not an integer ({other:?}) in {doc}"),
    }
}

/// Name of the variable naming a file that every [`skipped`] check is appended to (one line
/// each), so a runner can count them (`integration/run.sh` does).
pub const SKIP_LOG_ENV: &str = "MONGOGUARD_SKIP_LOG";

/// Reports a check that cannot run against this upstream, instead of letting it pass
/// silently: prints `SKIPPED: <check>: <why>` on the process's stderr (written directly, past
/// the test harness's output capture, so it shows even when the test passes) and appends the
/// same line to the file named by `MONGOGUARD_SKIP_LOG`, when set. Returns how many checks
/// this test binary has skipped so far.
pub fn skipped(check: &str, why: &str) -> usize {
    use std::io::Write;
    static SKIPPED: AtomicU64 = AtomicU64::new(0);
    let n = SKIPPED.fetch_add(1, Ordering::Relaxed) + 1;
    let line = format!("SKIPPED: {check}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            panic!("{SKIP_LOG_ENV}={}: {e}", path.to_string_lossy());
        }
    }
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Why the stand-in's per-command counters cannot be read: the upstream is a real mongod.
pub const NO_STANDIN_COUNTERS: &str =
    "the upstream is a real mongod (MONGOGUARD_TEST_UPSTREAM): per-command counters are the \
     stand-in's; the data checks through the direct connection still ran";

/// Polls `check` up to `attempts` times, `pause` apart; true as soon as it returns true.
pub async fn eventually<F, Fut>(attempts: usize, pause: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for i in 0..attempts {
        if check().await {
            return true;
        }
        if i + 1 < attempts {
            tokio::time::sleep(pause).await;
        }
    }
    false
}

/// What the driver did, as seen by its monitoring events.
#[derive(Default)]
pub struct Events {
    /// Names of the commands the driver started, in order.
    pub commands: Vec<String>,
    /// Replies to the driver's monitoring `hello`s (the first is the handshake reply).
    pub heartbeat_replies: Vec<Document>,
    /// Every server address the driver's topology learnt about.
    pub server_addresses: Vec<String>,
}

/// A client with its monitoring events recorded.
pub struct Probe {
    pub client: Client,
    pub events: Arc<Mutex<Events>>,
}

impl Probe {
    pub async fn connect(uri: &str) -> Probe {
        let mut opts = ClientOptions::parse(uri)
            .await
            .unwrap_or_else(|e| panic!("parse {uri}: {e}"));
        let events = Arc::new(Mutex::new(Events::default()));
        let ev = events.clone();
        opts.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
            if let CommandEvent::Started(started) = e {
                ev.lock().unwrap().commands.push(started.command_name);
            }
        }));
        let ev = events.clone();
        opts.sdam_event_handler = Some(EventHandler::callback(move |e: SdamEvent| {
            let mut ev = ev.lock().unwrap();
            match e {
                SdamEvent::ServerHeartbeatSucceeded(hb) => ev.heartbeat_replies.push(hb.reply),
                SdamEvent::ServerOpening(o) => ev.server_addresses.push(o.address.to_string()),
                SdamEvent::ServerDescriptionChanged(c) => {
                    ev.server_addresses.push(c.address.to_string())
                }
                _ => {}
            }
        }));
        let client = Client::with_options(opts).unwrap_or_else(|e| panic!("client for {uri}: {e}"));
        Probe { client, events }
    }

    /// How many times the driver started `name`.
    pub fn command_count(&self, name: &str) -> usize {
        let ev = self.events.lock().unwrap();
        ev.commands.iter().filter(|c| c.as_str() == name).count()
    }

    pub fn heartbeat_replies(&self) -> Vec<Document> {
        self.events.lock().unwrap().heartbeat_replies.clone()
    }

    pub fn server_addresses(&self) -> Vec<String> {
        self.events.lock().unwrap().server_addresses.clone()
    }

    /// The handshake reply of the monitoring connection (waits a bounded number of polls).
    pub async fn first_heartbeat_reply(&self) -> Document {
        let ok = eventually(100, Duration::from_millis(100), || async {
            !self.events.lock().unwrap().heartbeat_replies.is_empty()
        })
        .await;
        assert!(ok, "the driver reported no successful heartbeat");
        self.heartbeat_replies().remove(0)
    }
}

/// `GET path` on the admin listener at `addr` (no token); the response body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("admin connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("admin request");
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut text))
        .await
        .expect("admin answered in time")
        .expect("admin response");
    match text.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_owned(),
        None => text,
    }
}
