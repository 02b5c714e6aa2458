//! The JSON bodies of the admin endpoints (see README, "Metrics and admin API").

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Context;

use hyper::StatusCode;
use serde_json::{json, Map, Value};

use crate::{
    audit::{format_time, render_public},
    config::Mode as ProxyMode,
    metrics::ShapeSort,
    policy::{PolicySource, RULES},
};

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

fn rfc3339(t: SystemTime) -> String {
    let mut s = String::with_capacity(24);
    format_time(t, &mut s);
    s
}

/// `GET /policy`.
pub(super) fn policy(ctx: &Context) -> String {
    let policy = ctx.policy.current();
    let source = match ctx.policy.source() {
        PolicySource::BuiltIn(name) => format!("builtin:{name}"),
        PolicySource::File(path) => format!("file:{}", path.display()),
    };
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            let scope = match r.scope {
                crate::policy::Scope::Command => "command",
                crate::policy::Scope::Connection => "connection",
            };
            json!({"id": r.code, "name": r.name, "action": policy.action(r.id).as_str(), "scope": scope})
        })
        .collect();
    json!({
        "source": source,
        "hash": hex(policy.hash()),
        "mode": policy.mode().as_str(),
        "rules": rules,
    })
    .to_string()
}

/// `GET /config`: whether the configuration file changed since the start in settings that
/// need a restart (as found at the last SIGHUP).
pub(super) fn config(ctx: &Context) -> String {
    match ctx.reload.config_status() {
        None => json!({"file": false, "restart_required": false, "changed": []}).to_string(),
        Some(s) => json!({
            "file": true,
            "restart_required": !s.changed.is_empty(),
            "changed": s.changed,
            "error": s.error,
            "checked_at": s.checked.map(rfc3339),
        })
        .to_string(),
    }
}

/// `POST /reload`: 200 with the new hash, 422 when the file is invalid (the old policy
/// stays), 409 for a built-in profile. In allowlist enforce mode the allowlist file is
/// reloaded too (`"allowlist"` in the answer; 422 when it is refused and the old one stays).
pub(super) fn reload(ctx: &Context) -> (StatusCode, String) {
    let allowlist = ctx.reload.reload_allowlist("admin");
    let allowlist_failed = matches!(allowlist, Some(Err(_)));
    let allowlist_json = allowlist.map(|r| match r {
        Ok(l) => json!({"ok": true, "apps": l.apps, "shapes": l.shapes, "left_out": l.over_caps}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    });
    let status = |ok: bool| {
        if ok && !allowlist_failed {
            StatusCode::OK
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        }
    };
    let with_allowlist = |mut body: serde_json::Value| {
        if let (Some(a), Some(o)) = (&allowlist_json, body.as_object_mut()) {
            o.insert("allowlist".into(), a.clone());
            o.insert(
                "ok".into(),
                json!(o.get("ok") == Some(&json!(true)) && !allowlist_failed),
            );
        }
        body.to_string()
    };
    if let PolicySource::BuiltIn(name) = ctx.policy.source() {
        if allowlist_json.is_none() {
            return (
                StatusCode::CONFLICT,
                json!({"ok": false, "error": format!("the policy is the built-in profile {name}; there is no file to reload")})
                    .to_string(),
            );
        }
        return (
            status(true),
            with_allowlist(json!({"ok": true, "hash": hex(ctx.policy.current().hash())})),
        );
    }
    match ctx.reload.reload_policy("admin") {
        Ok(hash) => (
            status(true),
            with_allowlist(
                json!({"ok": true, "hash": hex(hash.unwrap_or_else(|| ctx.policy.current().hash()))}),
            ),
        ),
        Err(e) => (
            status(false),
            with_allowlist(json!({"ok": false, "error": e.to_string()})),
        ),
    }
}

/// `GET /violations`: the newest `limit` records, newest first.
pub(super) fn violations(ctx: &Context, limit: usize) -> String {
    let records = ctx.metrics.violations.recent(limit);
    let mut out = String::from(r#"{"violations":["#);
    for (i, rec) in records.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&render_public(rec));
    }
    out.push_str("]}");
    out
}

fn counts<K: AsRef<str>>(it: impl IntoIterator<Item = (K, u64)>) -> Value {
    Value::Object(
        it.into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), Value::from(v)))
            .collect::<Map<String, Value>>(),
    )
}

/// `GET /stats/violations`: per-minute counts over the last hour.
pub(super) fn violation_stats(ctx: &Context) -> String {
    let s = ctx.metrics.violations.stats(SystemTime::now());
    let buckets: Vec<Value> = s
        .buckets
        .iter()
        .map(|(start, by_rule)| {
            json!({
                "start": rfc3339(UNIX_EPOCH + Duration::from_secs(*start)),
                "by_rule": counts(by_rule.iter().map(|(k, v)| (*k, *v))),
            })
        })
        .collect();
    json!({
        "window_seconds": crate::metrics::violations::WINDOW_MINUTES * 60,
        "bucket_seconds": 60,
        "buckets": buckets,
        "by_rule": counts(s.by_rule.iter().map(|(k, v)| (*k, *v))),
        "by_app": counts(s.by_app.iter().map(|(k, v)| (k.as_str(), *v))),
    })
    .to_string()
}

/// `GET /clients`.
pub(super) fn clients(ctx: &Context) -> String {
    let rows: Vec<Value> = ctx
        .metrics
        .clients
        .rows()
        .into_iter()
        .map(|r| {
            json!({
                "app": r.app,
                "driver": r.driver,
                "connections": r.connections.max(0),
                "requests": r.requests,
                "violations": r.violations,
                "findings": r.findings,
            })
        })
        .collect();
    json!({ "clients": rows }).to_string()
}

/// `GET /shapes`.
pub(super) fn shapes(ctx: &Context, sort: ShapeSort, limit: usize) -> String {
    let rows: Vec<Value> = ctx
        .metrics
        .shapes
        .rows(sort, limit)
        .into_iter()
        .map(|r| {
            json!({
                "namespace": r.namespace,
                "command": r.command,
                "filter_shape": r.filter_shape,
                "shape_hash": hex(r.shape_hash),
                "count": r.count,
                "errors": r.errors,
                "violations": r.violations,
                "total_time_us": r.total_time_us,
                "latency_us": {"p50": r.latency_us[0], "p95": r.latency_us[1], "p99": r.latency_us[2]},
                "plan": r.plan,
            })
        })
        .collect();
    json!({ "shapes": rows }).to_string()
}

/// `GET /pool`.
pub(super) fn pool(ctx: &Context) -> String {
    let snap = ctx.metrics.snapshot();
    let pools = snap.pools.unwrap_or_default();
    let (active, waiting) = match ctx.config.proxy.mode {
        ProxyMode::Pooled => (
            pools.iter().map(|p| p.stats.in_use).sum::<usize>() as u64,
            pools.iter().map(|p| p.stats.waiting).sum::<usize>() as u64,
        ),
        ProxyMode::Passthrough => {
            let in_flight = ctx
                .metrics
                .live
                .in_flight
                .load(std::sync::atomic::Ordering::Relaxed);
            (u64::try_from(in_flight).unwrap_or(0), 0)
        }
    };
    let rows: Vec<Value> = pools
        .iter()
        .map(|p| {
            json!({
                "server": p.server,
                "identity": p.identity,
                "total": p.stats.total,
                "idle": p.stats.idle,
                "in_use": p.stats.in_use,
                "waiting": p.stats.waiting,
                "max_wait_ms": u64::try_from(p.stats.max_wait.as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect();
    let p = snap.pinned;
    let drained: Vec<String> = ctx
        .topology
        .drained()
        .iter()
        .map(|h| h.to_string())
        .collect();
    let parked = ctx.pooled.as_ref().map(|p| {
        let (connections, cursors, transactions) = p.balanced.counts();
        json!({"connections": connections, "cursors": cursors, "transactions": transactions})
    });
    json!({
        "drained": drained,
        "load_balanced_parked": parked,
        "mode": match ctx.config.proxy.mode {
            ProxyMode::Pooled => "pooled",
            ProxyMode::Passthrough => "passthrough",
        },
        "clients": {"active": active, "waiting": waiting},
        "pools": rows,
        "pinned": {
            "exhaust": p.exhaust,
            "transaction": p.transaction,
            "cursor": p.cursor,
            "legacy_write": p.legacy_write,
        },
    })
    .to_string()
}

/// `GET /connections`: every live client connection (like PgBouncer's SHOW CLIENTS), and
/// whether the proxy is paused.
pub(super) fn connections(ctx: &Context) -> String {
    let rows: Vec<Value> = ctx
        .control
        .rows()
        .into_iter()
        .map(|r| {
            json!({
                "id": r.id,
                "peer": r.peer.to_string(),
                "age_seconds": r.age_secs,
                "app": r.app,
                "driver": r.driver,
                "user": r.user,
                "requests": r.requests,
                "state": r.state,
            })
        })
        .collect();
    json!({"paused": ctx.control.paused(), "connections": rows}).to_string()
}

/// `POST /pause` (`paused = true`) and `POST /resume`: new requests wait while paused (hello
/// goes on), at most `upstream.server_selection_timeout`, then get ExceededTimeLimit.
pub(super) fn pause(ctx: &Context, paused: bool) -> String {
    let was = ctx.control.set_paused(paused);
    if was != paused {
        tracing::warn!(
            paused,
            "operator {} the proxy (admin API)",
            if paused { "paused" } else { "resumed" }
        );
    }
    json!({"ok": true, "paused": paused, "was_paused": was}).to_string()
}

/// The id in `/connections/{id}/kill`.
pub(super) fn kill_target(path: &str) -> Option<u64> {
    path.strip_prefix("/connections/")?
        .strip_suffix("/kill")?
        .parse()
        .ok()
}

/// `POST /connections/{id}/kill`: closes one client connection (404 when there is none).
pub(super) fn kill(ctx: &Context, id: u64) -> (StatusCode, String) {
    if ctx.control.kill(id) {
        tracing::warn!(
            connection = id,
            "operator killed a client connection (admin API)"
        );
        (
            StatusCode::OK,
            json!({"ok": true, "killed": id}).to_string(),
        )
    } else {
        (
            StatusCode::NOT_FOUND,
            json!({"ok": false, "error": format!("no connection {id}")}).to_string(),
        )
    }
}

/// `POST /stats/reset`: forgets what the admin views accumulated — the recent violations and
/// their per-minute counts (`/violations`, `/stats/violations`) and the query shapes
/// (`/shapes`). Prometheus counters (`/metrics`) are never reset: they stay monotonic, as
/// scrapers require.
pub(super) fn reset_stats(ctx: &Context) -> String {
    ctx.metrics.violations.clear();
    ctx.metrics.shapes.clear();
    tracing::warn!("operator reset the admin views' statistics (admin API)");
    json!({"ok": true, "reset": ["violations", "stats/violations", "shapes"]}).to_string()
}

/// `/servers/{host:port}/drain` or `/enable`: the host text and whether to drain.
pub(super) fn server_action(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix("/servers/")?;
    if let Some(host) = rest.strip_suffix("/drain") {
        return Some((host, true));
    }
    rest.strip_suffix("/enable").map(|host| (host, false))
}

/// `POST /servers/{host:port}/drain` and `/enable`: a drained server gets no new sessions
/// (passthrough) or checkouts (pooled); what runs on it finishes. 404 for a server the
/// upstream URI and topology do not know.
pub(super) fn drain(ctx: &Context, path: &str) -> (StatusCode, String) {
    let Some((text, drained)) = server_action(path) else {
        return (StatusCode::NOT_FOUND, json!({"ok": false}).to_string());
    };
    let host = text.rsplit_once(':').and_then(|(name, port)| {
        let name = name.trim_start_matches('[').trim_end_matches(']');
        Some(crate::config::Host {
            name: name.into(),
            port: port.parse().ok()?,
        })
    });
    match host {
        Some(h) if ctx.topology.set_drained(&h, drained) => {
            if let Some(p) = &ctx.pooled {
                p.pool.set_drained(&h, drained);
            }
            tracing::warn!(server = %h, drained, "operator {} an upstream server (admin API)",
                if drained { "drained" } else { "enabled" });
            (
                StatusCode::OK,
                json!({"ok": true, "server": h.to_string(), "drained": drained}).to_string(),
            )
        }
        _ => (
            StatusCode::NOT_FOUND,
            json!({"ok": false, "error": format!("no upstream server {text} (host:port as in /pool)")})
                .to_string(),
        ),
    }
}
