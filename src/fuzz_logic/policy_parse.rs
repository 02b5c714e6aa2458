//! Target `policy_parse`: arbitrary text as a policy file.
//!
//! text → [`Policy::from_toml`] (TOML, `extends`, rule actions and parameters, overrides with
//! namespace / app / user globs and client CIDRs).
//!
//! What is asserted: no panic; a refusal names the file; a parse is deterministic (same
//! actions, parameters, mode and hash); and a policy that parses is valid: G001 blocks, no
//! override touches G001 or lacks a matcher, at most [`MAX_OVERRIDES`] overrides, every
//! threshold at least 1, and — the point of G001 — a command that cannot be read is blocked
//! in every context whose effective mode is enforce and warned about in audit mode, whatever
//! the overrides say, while a plain readable find is never reported as unreadable.

use std::net::IpAddr;

use bson::rawdoc;

use crate::{
    command::CommandView,
    policy::{Action, Policy, RequestContext, RuleId, MAX_OVERRIDES, RULES},
};

const ORIGIN: &str = "fuzz-policy.toml";

/// Runs one input.
pub fn run(data: &[u8]) {
    let text = super::text(data);
    let parsed = Policy::from_toml(&text, ORIGIN);
    let policy = match parsed {
        Ok(p) => p,
        Err(e) => {
            assert!(
                e.to_string().contains(ORIGIN),
                "the error does not name the file: {e}"
            );
            return;
        }
    };
    let again = Policy::from_toml(&text, ORIGIN);
    assert!(
        again.as_ref().is_ok_and(|b| b.hash() == policy.hash()
            && b.mode() == policy.mode()
            && b.params() == policy.params()
            && RULES.iter().all(|r| b.action(r.id) == policy.action(r.id))),
        "not deterministic"
    );
    assert_eq!(
        policy.action(RuleId::G001),
        Action::Block,
        "G001 does not block"
    );
    assert!(policy.overrides.len() <= MAX_OVERRIDES);
    for o in &policy.overrides {
        assert!(o
            .actions
            .get(RuleId::G001 as usize)
            .is_some_and(Option::is_none));
        assert!(
            o.namespace.is_some() || o.app.is_some() || o.user.is_some() || o.client.is_some(),
            "an override without a matcher"
        );
    }
    let p = policy.params();
    assert!(
        [
            p.max_in,
            p.max_or,
            p.max_document_bytes,
            p.max_depth,
            p.max_array_elements
        ]
        .iter()
        .all(|v| *v >= 1),
        "a threshold below 1"
    );
    check_fails_closed(&policy);
}

fn check_fails_closed(policy: &Policy) {
    // `explain` whose explained command is not a document: unreadable before any rule runs.
    let unreadable = rawdoc! {"explain": 5, "$db": "db_app"};
    let readable = rawdoc! {"find": "t_users", "filter": {"_id": 1}, "$db": "db_app"};
    let views = (
        CommandView::command("db_app", &unreadable),
        CommandView::command("db_app", &readable),
    );
    assert!(
        views.0.is_ok() && views.1.is_ok(),
        "the fixed commands do not build a view"
    );
    let (Ok(bad), Ok(good)) = views else {
        return;
    };
    // Contexts that overrides may match on: nothing known, and everything known.
    let known = RequestContext {
        app: Some("nightly-etl"),
        user: Some("etl"),
        client_ip: Some(IpAddr::from([10, 1, 2, 3])),
        upstream_wire_version: Some(17),
        plan: None,
        index_count: None,
        shard_key: None,
    };
    for ctx in [RequestContext::default(), known] {
        let d = policy.evaluate(&bad, &ctx);
        let g = d.violations.iter().find(|v| v.rule == RuleId::G001);
        // G001 blocks under every mode and every override (fail closed).
        assert_eq!(
            g.map(|v| v.action),
            Some(Action::Block),
            "unreadable command: {d:?}"
        );
        assert!(d.is_block(), "unreadable command not blocked: {d:?}");
        let d = policy.evaluate(&good, &ctx);
        assert!(
            d.violations.iter().all(|v| v.rule != RuleId::G001),
            "a readable find reported unreadable"
        );
    }
}
