//! The admin HTTP listener: health and readiness, Prometheus metrics, the policy and its
//! reload, recent violations, client and query-shape tables, pool state, and the status page.
//!
//! HTTP/1.1 on hyper. Every endpoint except `/healthz` requires the bearer token when one is
//! configured (`Authorization: Bearer <token>`, or `?token=` for the status page). JSON
//! bodies never carry literals from queries, only shapes. The listener stops when the proxy
//! has finished draining, so `/readyz` answers 503 during the drain.

mod api;
mod ready;

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming,
    header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

use crate::{config::Config, metrics::Metrics, policy::PolicyHolder};

/// What the admin API reads and acts on, built by the composition root ([`crate::app`]).
pub(crate) struct AdminState {
    pub config: Arc<Config>,
    pub policy: Arc<PolicyHolder>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the shutdown starts, before `shutdown_delay` and the drain (`/readyz`
    /// then says 503).
    pub draining: CancellationToken,
    /// TLS toward the upstream, for the readiness probe.
    pub upstream_tls: Option<crate::tls::UpstreamTls>,
    /// `POST /reload`.
    pub reload: Arc<dyn PolicyReload>,
    /// The live connections and the pause gate (`/connections`, `/pause`, `/resume`).
    pub control: Arc<crate::proxy::control::Control>,
    /// The upstream servers (`/servers/{host}/drain`, `/enable`).
    pub topology: Arc<crate::upstream::topology::Topology>,
    /// Pooled mode's pools (a drained server's idle connections close at once).
    pub pooled: Option<Arc<crate::proxy::Pooled>>,
}

/// Reloads the policy file (validated completely; the old policy stays when it is invalid),
/// counted and recorded like every other reload. Returns the new hash.
pub(crate) trait PolicyReload: Send + Sync {
    /// What the last SIGHUP found in the configuration file (`None`: not started from one).
    fn config_status(&self) -> Option<crate::app::ConfigStatus>;

    fn reload_policy(
        &self,
        trigger: &'static str,
    ) -> Result<Option<u64>, crate::policy::PolicyError>;

    /// Reloads the allowlist file in enforce mode (`None` in other modes); an unreadable or
    /// invalid file keeps the allowlist in force.
    fn reload_allowlist(
        &self,
        trigger: &'static str,
    ) -> Option<Result<crate::allowlist::Loaded, crate::allowlist::AllowlistError>>;
}

type Context = AdminState;

/// The status page (served at `GET /`).
const STATUS_HTML: &str = include_str!("status.html");

/// A request's headers must arrive within this long (slow clients cannot hold sockets).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin connections open at once (scrapers and a status page need a handful). A connection
/// beyond it closes the oldest one that is idle (no request being answered) and takes its
/// slot at once, so clients that connect and send nothing cannot keep the probes out; when
/// every one is busy, it is closed.
const MAX_CONNECTIONS: usize = 64;

/// The open admin connections, oldest first: whether each is answering a request, and how
/// to close it.
#[derive(Default)]
struct Open {
    next: std::sync::atomic::AtomicU64,
    list: std::sync::Mutex<Vec<OpenConn>>,
}

struct OpenConn {
    id: u64,
    busy: Arc<std::sync::atomic::AtomicBool>,
    close: CancellationToken,
    /// The connection's slot, held here (not by its task) so that evicting it hands the slot
    /// to the new connection directly. (Given back to the semaphore instead, it went to the
    /// oldest connection queued for one: after a burst of slowloris connections a probe
    /// waited behind the attacker's backlog and was closed unanswered.)
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Open {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<OpenConn>> {
        self.list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new connection holding `slot`, registered when accepted (before its task runs, so
    /// it can be evicted from the start).
    fn register(
        &self,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> (u64, Arc<std::sync::atomic::AtomicBool>, CancellationToken) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let close = CancellationToken::new();
        self.list().push(OpenConn {
            id,
            busy: busy.clone(),
            close: close.clone(),
            _slot: slot,
        });
        (id, busy, close)
    }

    fn remove(&self, id: u64) {
        self.list().retain(|c| c.id != id);
    }

    /// Closes the oldest connection not answering a request (taking it off the list) and
    /// returns its slot; `None` when every one is busy.
    fn evict_oldest_idle(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let mut list = self.list();
        let idle = list
            .iter()
            .position(|c| !c.busy.load(std::sync::atomic::Ordering::Acquire))?;
        let c = list.remove(idle);
        c.close.cancel();
        Some(c._slot)
    }
}

/// Marks a connection busy while its request is answered (also when the answer is dropped).
struct BusyGuard(Arc<std::sync::atomic::AtomicBool>);

impl BusyGuard {
    fn new(flag: &Arc<std::sync::atomic::AtomicBool>) -> BusyGuard {
        flag.store(true, std::sync::atomic::Ordering::Release);
        BusyGuard(flag.clone())
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

struct Admin {
    ctx: AdminState,
    token: Arc<AdminToken>,
    ready: ready::Readiness,
}

/// The admin API's bearer token: read at start, replaced when SIGHUP reloads
/// `admin.token_file` ([`AdminToken::reload`]).
#[derive(Debug, Default)]
pub(crate) struct AdminToken {
    token: std::sync::RwLock<Option<String>>,
    /// Held by a reload from reading the file to installing it: SIGHUP and
    /// `ProxyHandle::hangup` at once must never leave the older file's token in force.
    reloading: std::sync::Mutex<()>,
    #[cfg(test)]
    after_read: crate::reload_race::AfterRead,
}

impl AdminToken {
    pub(crate) fn new(token: Option<String>) -> AdminToken {
        AdminToken {
            token: std::sync::RwLock::new(token),
            ..AdminToken::default()
        }
    }

    /// Reads `admin.token_file` again (nothing to do without one): `Ok(true)` when the file's
    /// token is now in force; an unreadable or empty file keeps the token in force (`Err`).
    /// Reloads run one at a time: the last to start reads the file last and wins.
    pub(crate) fn reload(&self, config: &crate::config::AdminConfig) -> Result<bool, String> {
        if config.token_file.is_none() {
            return Ok(false);
        }
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let loaded = config.load_token();
        #[cfg(test)]
        self.after_read.run();
        match loaded {
            Ok(Some(token)) => {
                match self.token.write() {
                    Ok(mut g) => *g = Some(token),
                    Err(poisoned) => *poisoned.into_inner() = Some(token),
                }
                Ok(true)
            }
            Ok(None) => Err("no token".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

type Reply = Response<Full<Bytes>>;

/// Serves the admin API on `listener` until `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    ctx: AdminState,
    token: Arc<AdminToken>,
    stop: CancellationToken,
) {
    let admin = Arc::new(Admin {
        ctx,
        token,
        ready: ready::Readiness::default(),
    });
    let tracker = TaskTracker::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let open = Arc::new(Open::default());
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "admin accept failed; backing off");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let slot = match slots
            .clone()
            .try_acquire_owned()
            .ok()
            .or_else(|| open.evict_oldest_idle())
        {
            Some(slot) => slot,
            None => {
                warn!(
                    limit = MAX_CONNECTIONS,
                    "too many admin connections, every one answering a request; closing a new one"
                );
                drop(stream);
                continue;
            }
        };
        let registered = open.register(slot);
        let (admin, open, stop) = (admin.clone(), open.clone(), stop.clone());
        tracker.spawn(async move {
            connection(admin, stream, registered, &open, stop).await;
        });
    }
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), tracker.wait()).await;
}

/// One admin connection (HTTP/1.1, headers within [`HEADER_READ_TIMEOUT`]), shut down
/// gracefully when the listener stops, closed at once when a new connection needs its slot
/// while it is idle.
async fn connection(
    admin: Arc<Admin>,
    stream: tokio::net::TcpStream,
    (id, busy, evicted): (u64, Arc<std::sync::atomic::AtomicBool>, CancellationToken),
    open: &Open,
    stop: CancellationToken,
) {
    let service = service_fn(move |req| {
        let admin = admin.clone();
        let busy = busy.clone();
        async move {
            let _busy = BusyGuard::new(&busy);
            Ok::<_, Infallible>(admin.handle(req).await)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!(error = %e, "admin connection ended");
            }
        }
        _ = evicted.cancelled() => {
            debug!("idle admin connection closed: its slot went to a new connection");
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
        }
    }
    open.remove(id);
}

impl Admin {
    /// Long because it is the routing table: one arm per endpoint, read best whole.
    async fn handle(&self, req: Request<Incoming>) -> Reply {
        let path = req.uri().path().to_owned();
        let query = Query::parse(req.uri().query().unwrap_or(""));
        if path != "/healthz" && !self.authorized(&req, &query) {
            let mut r = json(
                StatusCode::UNAUTHORIZED,
                r#"{"error":"missing or wrong bearer token"}"#.to_owned(),
            );
            r.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
            return r;
        }
        if cross_origin_action(&req) {
            return json(
                StatusCode::FORBIDDEN,
                r#"{"error":"cross-origin request refused: a web page cannot act on the admin API"}"#
                    .to_owned(),
            );
        }
        let ctx = &self.ctx;
        match (req.method(), path.as_str()) {
            (&Method::GET, "/healthz") => json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned()),
            (&Method::GET, "/readyz") => {
                let (status, body) = self.ready.check(ctx).await;
                json(status, body)
            }
            (&Method::GET, "/metrics") => {
                let mut r = Response::new(Full::new(Bytes::from(ctx.metrics.encode())));
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                r
            }
            (&Method::GET, "/policy") => json(StatusCode::OK, api::policy(ctx)),
            (&Method::GET, "/config") => json(StatusCode::OK, api::config(ctx)),
            (&Method::POST, "/reload") => {
                let (status, body) = api::reload(ctx);
                json(status, body)
            }
            (&Method::GET, "/violations") => {
                let cap = ctx.metrics.violations.capacity();
                let limit = query.number("limit").unwrap_or(100).min(cap);
                json(StatusCode::OK, api::violations(ctx, limit))
            }
            (&Method::GET, "/stats/violations") => json(StatusCode::OK, api::violation_stats(ctx)),
            (&Method::GET, "/clients") => json(StatusCode::OK, api::clients(ctx)),
            (&Method::GET, "/shapes") => {
                let limit = query.number("limit").unwrap_or(50);
                let sort = match query.get("sort") {
                    Some("count") => crate::metrics::ShapeSort::Count,
                    _ => crate::metrics::ShapeSort::Time,
                };
                json(StatusCode::OK, api::shapes(ctx, sort, limit))
            }
            (&Method::GET, "/pool") => json(StatusCode::OK, api::pool(ctx)),
            (&Method::GET, "/connections") => json(StatusCode::OK, api::connections(ctx)),
            (&Method::POST, "/stats/reset") => json(StatusCode::OK, api::reset_stats(ctx)),
            (&Method::POST, "/pause") => json(StatusCode::OK, api::pause(ctx, true)),
            (&Method::POST, "/resume") => json(StatusCode::OK, api::pause(ctx, false)),
            (&Method::POST, p) if api::server_action(p).is_some() => {
                let (status, body) = api::drain(ctx, p);
                json(status, body)
            }
            (&Method::POST, p) if api::kill_target(p).is_some() => {
                let (status, body) = api::kill(ctx, api::kill_target(p).unwrap_or(0));
                json(status, body)
            }
            (&Method::GET, "/") => {
                let mut r = Response::new(Full::new(Bytes::from_static(STATUS_HTML.as_bytes())));
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                );
                r
            }
            (
                _,
                "/healthz" | "/readyz" | "/metrics" | "/policy" | "/config" | "/reload"
                | "/violations" | "/stats/violations" | "/clients" | "/shapes" | "/pool"
                | "/connections" | "/pause" | "/resume" | "/stats/reset" | "/",
            ) => json(
                StatusCode::METHOD_NOT_ALLOWED,
                r#"{"error":"method not allowed"}"#.to_owned(),
            ),
            _ => json(StatusCode::NOT_FOUND, r#"{"error":"not found"}"#.to_owned()),
        }
    }

    /// The bearer token from the Authorization header or `?token=`, compared in constant
    /// time. Always true when no token is configured.
    fn authorized(&self, req: &Request<Incoming>, query: &Query<'_>) -> bool {
        use subtle::ConstantTimeEq;
        let token = match self.token.token.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(token) = token.as_ref() else {
            return true;
        };
        let header = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let given = header.or_else(|| query.get("token"));
        given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())))
    }
}

/// A request that changes something (any method but GET and HEAD) sent by a web page of
/// another origin: browsers send such a POST without a preflight (`mode: "no-cors"`), so
/// without a token any page open on the host could pause the proxy or kill connections.
/// They name the page in `Origin`; tools (curl, `mongoguard admin`) send none.
fn cross_origin_action(req: &Request<Incoming>) -> bool {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return false;
    }
    let Some(origin) = req.headers().get(hyper::header::ORIGIN) else {
        return false;
    };
    let origin = origin.to_str().unwrap_or("");
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok());
    match (authority, host) {
        (Some(a), Some(h)) => !a.eq_ignore_ascii_case(h),
        _ => true,
    }
}

fn json(status: StatusCode, body: String) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `a=1&b=2` (no percent-decoding: every parameter is a number, a word or a token).
struct Query<'q>(Vec<(&'q str, &'q str)>);

impl<'q> Query<'q> {
    fn parse(q: &'q str) -> Self {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once('=').unwrap_or((p, "")))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&'q str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn number(&self, key: &str) -> Option<usize> {
        self.get(key).and_then(|v| v.parse().ok())
    }
}

#[cfg(test)]
mod token_tests {
    use super::AdminToken;
    use std::sync::Arc;

    /// SIGHUP and `ProxyHandle::hangup` at once: each reload of the token file read the file
    /// and then installed what it read, unserialised, so the one that read the older token
    /// could install it last, and a revoked token stayed valid. The first reload reads v1
    /// and is held; the file becomes v2 and a second reload runs; then the first goes on.
    #[test]
    fn concurrent_token_reloads_never_install_the_older_file() {
        let dir = std::env::temp_dir().join(format!("mg-token-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "old-token\n").unwrap();
        let config = crate::config::AdminConfig {
            token_file: Some(file.clone()),
            ..Default::default()
        };
        let token = Arc::new(AdminToken::new(config.load_token().unwrap()));
        let (t, c) = (token.clone(), config.clone());
        crate::reload_race::two_reloads(
            &token.after_read,
            move || t.reload(&c).map(|_| ()),
            || std::fs::write(&file, "new-token\n").unwrap(),
        );
        assert_eq!(
            token.token.read().unwrap().as_deref(),
            Some("new-token"),
            "an older read of the token file was installed over a newer one"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
