//! The connection standards' periodic report (C001–C003): every
//! `audit.connection_report_interval`, each (application, driver) pair's recent connections
//! are assessed against the policy in force; each finding becomes one violation record
//! (counted in `mongoguard_violations_total`, kept for `/violations`, written to the audit
//! log without dedup) and is shown on the pair's `/clients` row until a report no longer
//! finds it.

use std::{
    sync::Arc,
    time::{Instant, SystemTime},
};

use tokio_util::sync::CancellationToken;

use super::Context;
use crate::{
    audit::{self, Source, ViolationRecord},
    metrics::labels,
    policy::{self, connections::Finding},
};

/// Reports every `ctx.config.audit.connection_report_interval` until `stop`.
pub(crate) async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let every = ctx.config.audit.connection_report_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        report(&ctx, Instant::now());
    }
}

/// One report at `now`: the findings, recorded and set on `/clients`.
pub(crate) fn report(ctx: &Context, now: Instant) -> Vec<Finding> {
    let policy = ctx.policy.current();
    let findings = ctx.metrics.clients.report(now, |pairs| {
        let findings = policy::connections::assess(pairs, &policy);
        let shown = findings
            .iter()
            .map(|f| {
                let info = f.rule.info();
                let text = format!("{} {}: {}", info.code, info.name, f.detail);
                (f.app.clone(), f.driver.clone(), text)
            })
            .collect();
        (findings, shown)
    });
    for f in &findings {
        let rec = record(f, SystemTime::now());
        ctx.metrics.violation(&rec);
        ctx.audit.record_periodic(rec);
    }
    findings
}

/// The violation record of a finding: no client address, database or request (it is about
/// an application's connections); `command` is `"(connections)"`, the evidence is in
/// `detail`.
pub(crate) fn record(f: &Finding, time: SystemTime) -> ViolationRecord {
    let info = f.rule.info();
    let named = |s: &str| (s != labels::NONE).then(|| s.to_owned());
    ViolationRecord {
        time,
        rule_id: info.code,
        rule_name: info.name,
        reason: info.reason,
        action: match f.action {
            policy::Action::Block => audit::Action::Block,
            _ => audit::Action::Warn,
        },
        mode: match f.mode {
            policy::Mode::Enforce => audit::Mode::Enforce,
            policy::Mode::Audit => audit::Mode::Audit,
        },
        client_addr: None,
        app_name: named(&f.app),
        driver: f.driver.as_deref().and_then(named),
        user: None,
        database: String::new(),
        collection: None,
        command: "(connections)".to_owned(),
        statement_index: None,
        filter_shape: None,
        shape_hash: None,
        request_id: 0,
        source: Source::Proxy,
        detail: Some(f.detail.clone()),
        matched: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Action, Mode, RuleId};

    #[test]
    fn a_finding_record_names_the_application_and_its_evidence_not_a_request() {
        let f = Finding {
            rule: RuleId::C002,
            app: "-".into(),
            driver: Some("nodejs 6.0.0".into()),
            detail: "connections of driver \"nodejs 6.0.0\" name no application".into(),
            action: Action::Warn,
            mode: Mode::Audit,
        };
        let line = audit::render(&record(&f, SystemTime::UNIX_EPOCH));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["rule"], "C002");
        assert_eq!(v["rule_name"], "missing-app-name");
        assert_eq!(v["action"], "warn");
        assert_eq!(v["mode"], "audit");
        assert_eq!(v["driver"], "nodejs 6.0.0");
        assert_eq!(v["command"], "(connections)");
        assert_eq!(v["db"], "");
        assert!(v["detail"]
            .as_str()
            .unwrap()
            .contains("name no application"));
        for absent in [
            "app",
            "client",
            "user",
            "collection",
            "statement",
            "filter_shape",
        ] {
            assert!(v.get(absent).is_none(), "{absent} in {line}");
        }
        let c001 = Finding {
            rule: RuleId::C001,
            app: "php-fpm".into(),
            driver: None,
            ..f
        };
        let v: serde_json::Value =
            serde_json::from_str(&audit::render(&record(&c001, SystemTime::UNIX_EPOCH))).unwrap();
        assert_eq!(v["app"], "php-fpm");
        assert!(v.get("driver").is_none());
    }
}
