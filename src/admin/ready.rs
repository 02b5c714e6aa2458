//! `/readyz`: can mongoguard reach its upstream? A TCP connect and a hello to a server of
//! the topology (the primary the monitors see first, then the others in turn), at most every
//! second (the result is cached), within 2 seconds in all.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::json;
use tokio::sync::Mutex;

use super::Context;
use crate::upstream::UpstreamConn;

const BUDGET: Duration = Duration::from_secs(2);
const CACHE_FOR: Duration = Duration::from_secs(1);

/// The last check's outcome.
#[derive(Default)]
pub(super) struct Readiness {
    // An async mutex: concurrent probes wait for the one in progress instead of piling up.
    last: Mutex<Option<(Instant, Result<String, String>)>>,
}

impl Readiness {
    pub(super) async fn check(&self, ctx: &Context) -> (StatusCode, String) {
        if ctx.draining.is_cancelled() {
            return unready("draining");
        }
        let mut last = self.last.lock().await;
        let fresh = last
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < CACHE_FOR);
        if !fresh {
            let candidates = candidates(ctx);
            if candidates.is_empty() {
                return unready("no upstream host configured");
            }
            // Each candidate in turn within the one budget: the first that answers a hello
            // makes the proxy ready.
            let deadline = Instant::now() + BUDGET;
            let mut outcome = Err("no upstream server answered".to_owned());
            for host in candidates {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                outcome = UpstreamConn::probe(
                    &host,
                    left,
                    ctx.config.proxy.max_message_size,
                    ctx.upstream_tls.as_ref(),
                    ctx.config.upstream.uri.load_balanced(),
                )
                .await
                .map(|_| host.to_string())
                .map_err(|e| e.to_string());
                if outcome.is_ok() {
                    break;
                }
            }
            *last = Some((Instant::now(), outcome));
        }
        match last.as_ref().map(|(_, o)| o) {
            Some(Ok(host)) => (
                StatusCode::OK,
                json!({"status": "ready", "upstream": host}).to_string(),
            ),
            Some(Err(e)) => unready(e),
            None => unready("not checked"),
        }
    }
}

/// The servers to probe, best first: the primary the monitors see, then the other servers
/// they see serving, then the rest (the URI's seeds, or what a `mongodb+srv://` rescan
/// replaced them with); drained servers last. Probing only the first seed made a replica set
/// whose first member is down (maintenance, a lost host) unready while its primary served.
fn candidates(ctx: &Context) -> Vec<crate::config::Host> {
    let snapshot = ctx.topology.snapshot();
    let drained = ctx.topology.drained();
    let mut order: Vec<crate::config::Host> = Vec::new();
    let mut push = |h: &crate::config::Host| {
        if !order.contains(h) {
            order.push(h.clone());
        }
    };
    if let Some(p) = snapshot.primary().filter(|p| !drained.contains(p)) {
        push(p);
    }
    for s in &snapshot.servers {
        if s.role.is_some() && !drained.contains(&s.host) {
            push(&s.host);
        }
    }
    for s in &snapshot.servers {
        if !drained.contains(&s.host) {
            push(&s.host);
        }
    }
    for s in &snapshot.servers {
        push(&s.host);
    }
    if snapshot.servers.is_empty() {
        if let Some(seed) = ctx.config.upstream.uri.primary_seed() {
            push(seed);
        }
    }
    order
}

fn unready(error: &str) -> (StatusCode, String) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"status": "unready", "error": error}).to_string(),
    )
}
