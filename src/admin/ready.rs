//! `/readyz`: can mongoguard reach its upstream? A TCP connect and a hello to the first
//! upstream host, at most every second (the result is cached), within 2 seconds.

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
            // The topology's first server: the URI's first seed, unless a mongodb+srv://
            // rescan has replaced it.
            let first = ctx.topology.servers().into_iter().next();
            let Some(host) = first.or_else(|| ctx.config.upstream.uri.primary_seed().cloned())
            else {
                return unready("no upstream host configured");
            };
            let outcome = UpstreamConn::probe(
                &host,
                BUDGET,
                ctx.config.proxy.max_message_size,
                ctx.upstream_tls.as_ref(),
                ctx.config.upstream.uri.load_balanced(),
            )
            .await
            .map(|_| host.to_string())
            .map_err(|e| e.to_string());
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

fn unready(error: &str) -> (StatusCode, String) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"status": "unready", "error": error}).to_string(),
    )
}
