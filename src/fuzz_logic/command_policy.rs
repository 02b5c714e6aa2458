//! Target `command_policy`: a client message through the proxy's request path, then the policy.
//!
//! bytes → [`Frame`] → the proxy's own inspection (`proxy::inspect::inspect`: parse, decompress
//! OP_COMPRESSED, hello metadata, the command label) → [`CommandView::from_message`] →
//! [`Policy::evaluate`] under the shipped `standard`, `strict` and `audit` profiles, then the
//! query-shape capture and the shape of every filter a violation names (what the guard does
//! next for a record).
//!
//! What is asserted:
//! - the view and every decision are deterministic (built twice, compared field by field);
//! - fail closed: when any part of the view cannot be read (an accessor returns a
//!   [`CommandError`]), the `strict` decision (every rule on) contains G001; under every
//!   profile and mode a G001 violation blocks, and the audit profile blocks nothing else;
//! - a violation is never `Off`, is reported once per (rule, statement), and a statement
//!   index points inside the batch.
//!
//! An input the view refuses outright (`from_message` fails, e.g. an OP_MSG without `$db`) is
//! answered with G001 by `proxy::guard::judge` before `evaluate` runs. That branch needs the
//! proxy's `Context` and is not exercised here; only the determinism of the refusal is.

use std::{net::IpAddr, ops::ControlFlow, sync::OnceLock};

use bson::RawDocument;

use crate::{
    command::{CommandError, CommandView, Statement, UpdateMods},
    metrics::ShapeScratch,
    policy::{filter, Action, Decision, Mode, Policy, RequestContext, RuleId},
    proxy::{guard::Judgement, inspect::inspect},
    wire::{Frame, Message, DEFAULT_MAX_MESSAGE_SIZE},
};

fn profiles() -> &'static [(&'static str, Policy)] {
    static PROFILES: OnceLock<Vec<(&'static str, Policy)>> = OnceLock::new();
    PROFILES.get_or_init(|| {
        ["standard", "strict", "audit"]
            .into_iter()
            .filter_map(|name| Some((name, Policy::profile(name)?)))
            .collect()
    })
}

/// Runs one input.
pub fn run(data: &[u8]) {
    assert_eq!(profiles().len(), 3, "a shipped profile does not compile");
    let Some(bytes) = super::framed(data) else {
        return;
    };
    let Ok(frame) = Frame::from_bytes(bytes) else {
        return;
    };
    // Half the inputs (by requestID) carry the upstream's wire version, which I001 reads.
    let wire_version = (frame.header().request_id & 1 == 1).then_some(17);
    let mut judged = 0;
    let first = inspect(&frame, DEFAULT_MAX_MESSAGE_SIZE, true, |msg| {
        judged += 1;
        check_message(msg, wire_version);
        Judgement::Forward
    });
    if first.is_ok() {
        assert_eq!(judged, 1, "inspect succeeded without judging the request");
    }
    // The inspection itself is deterministic.
    let second = inspect(&frame, DEFAULT_MAX_MESSAGE_SIZE, true, |_| {
        Judgement::Forward
    });
    match (&first, &second) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                (a.op, a.expects_reply, a.is_hello, a.is_write, a.command),
                (b.op, b.expects_reply, b.is_hello, b.is_write, b.command)
            );
            assert_eq!(a.metadata, b.metadata);
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => assert!(
            first.is_ok() == second.is_ok(),
            "inspect is not deterministic"
        ),
    }
}

// Long because it is the list of the target's assertions about one message (see fuzz/README.md).
fn check_message(msg: &Message<'_>, wire_version: Option<i32>) {
    let view = CommandView::from_message(msg);
    let again = CommandView::from_message(msg);
    assert_eq!(
        view.is_ok(),
        again.is_ok(),
        "from_message succeeded once and failed once"
    );
    let view = match (view, again) {
        (Ok(v), Ok(w)) => {
            assert_eq!(summary(&v), summary(&w), "the view is not deterministic");
            v
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "the view's error is not deterministic");
            return;
        }
        _ => return,
    };
    let unreadable = read_everything(&view, 0);
    let statements = count_statements(&view);
    let ctx = RequestContext {
        app: Some("fuzz"),
        user: Some("fuzzer"),
        client_ip: Some(IpAddr::from([10, 0, 0, 1])),
        upstream_wire_version: wire_version,
        plan: None,
        index_count: None,
        shard_key: None,
    };
    for (name, policy) in profiles() {
        let decision = policy.evaluate(&view, &ctx);
        let again = policy.evaluate(&view, &ctx);
        assert_eq!(
            fingerprint(&decision),
            fingerprint(&again),
            "{name}: the decision is not deterministic"
        );
        assert_eq!(
            decision.mode,
            policy.mode(),
            "{name}: no override, same mode"
        );
        check_decision(name, &decision, statements);
        if *name == "strict" {
            if let Some(e) = &unreadable {
                assert!(
                    decision.violations.iter().any(|v| v.rule == RuleId::G001),
                    "strict: the view cannot be read ({e:?}) but no G001: {decision:?}"
                );
                assert!(decision.is_block(), "strict: unreadable command allowed");
            }
        }
        for v in &decision.violations {
            if let Some(f) = v.filter {
                let shape = filter::shape(f);
                assert_eq!(
                    filter::shape_hash(&shape),
                    filter::shape_hash(&filter::shape(f))
                );
            }
        }
    }
    let mut scratch = ShapeScratch::default();
    scratch.capture(&view);
    let was = scratch.active;
    scratch.reset();
    scratch.capture(&view);
    assert_eq!(was, scratch.active, "shape capture is not deterministic");
}

fn check_decision(name: &str, d: &Decision<'_>, statements: Option<usize>) {
    for (i, v) in d.violations.iter().enumerate() {
        assert_ne!(v.action, Action::Off, "{name}: an Off rule fired: {v:?}");
        let repeated = d
            .violations
            .iter()
            .skip(i + 1)
            .any(|w| w.rule == v.rule && w.statement == v.statement);
        assert!(!repeated, "{name}: {v:?} reported twice");
        if let (Some(at), Some(n)) = (v.statement, statements) {
            assert!(at < n, "{name}: {v:?} points past the {n} statements");
        }
        if v.rule == RuleId::G001 {
            assert_eq!(v.action, Action::Block, "{name}: G001 in {:?} mode", d.mode);
            assert!(v.detail.is_some(), "{name}: G001 without a reason");
        } else if d.mode == Mode::Audit {
            assert_ne!(v.action, Action::Block, "{name}: audit mode blocked {v:?}");
        }
    }
}

/// Walks every accessor of the view (and of the explained command, one level down, as
/// `evaluate` does); returns the first error.
fn read_everything(view: &CommandView<'_>, depth: usize) -> Option<CommandError> {
    std::hint::black_box((
        view.kind(),
        view.name(),
        view.display_name(),
        view.db(),
        view.namespace(),
        view.is_write(),
        view.more_to_come(),
        view.body().map(RawDocument::as_bytes),
    ));
    let mut out = None;
    let mut keep = |r: Result<ControlFlow<()>, CommandError>| {
        if let Err(e) = r {
            out.get_or_insert(e);
        }
    };
    keep(view.for_each_statement(|s| {
        std::hint::black_box((
            s.index,
            s.ns,
            s.find_and_modify,
            statement_bytes(&s.statement),
        ));
        ControlFlow::Continue(())
    }));
    keep(view.for_each_filter(|i, f| {
        std::hint::black_box((i, f.as_bytes().len()));
        ControlFlow::Continue(())
    }));
    keep(view.for_each_written_namespace(|ns| {
        std::hint::black_box(ns);
        ControlFlow::Continue(())
    }));
    keep(view.for_each_stage(|s| {
        std::hint::black_box(s.as_bytes().len());
        ControlFlow::Continue(())
    }));
    if let Err(e) = view.write_concern() {
        out.get_or_insert(e);
    }
    if let Err(e) = view.pipeline() {
        out.get_or_insert(e);
    }
    match view.explained() {
        Err(e) => {
            out.get_or_insert(e);
        }
        Ok(Some(inner)) if depth == 0 => {
            if let Some(e) = read_everything(&inner, depth + 1) {
                out.get_or_insert(e);
            }
        }
        Ok(_) => {}
    }
    out
}

fn statement_bytes(s: &Statement<'_>) -> usize {
    match s {
        Statement::Insert { doc } => doc.as_bytes().len(),
        Statement::Update { filter, update, .. } => {
            filter.as_bytes().len()
                + match update {
                    UpdateMods::Replacement(d) | UpdateMods::Operators(d) => d.as_bytes().len(),
                    UpdateMods::Pipeline(p) => p.as_bytes().len(),
                }
        }
        Statement::Delete { filter, .. } => filter.as_bytes().len(),
    }
}

/// The number of statements, when they can all be read.
fn count_statements(view: &CommandView<'_>) -> Option<usize> {
    let mut n = 0usize;
    let mut plain = *view;
    if let Ok(Some(inner)) = view.explained() {
        plain = inner;
    }
    let _ = plain
        .for_each_statement(|s| {
            n = n.max(s.index + 1);
            ControlFlow::Continue(())
        })
        .ok()?;
    // createIndexes numbers its index specs (I001, I003).
    if plain.kind() == crate::command::Kind::CreateIndexes {
        if let Some(body) = plain.body() {
            let _ = plain
                .each_entry(body, "indexes", "createIndexes", &mut |i, _| {
                    n = n.max(i + 1);
                    ControlFlow::Continue(())
                })
                .ok()?;
        }
    }
    // An explained write reports its statements' filters too.
    let _ = plain.for_each_filter(|i, _| {
        if let Some(i) = i {
            n = n.max(i + 1);
        }
        ControlFlow::Continue(())
    });
    Some(n)
}

type Summary<'a> = (
    crate::command::Kind,
    &'a str,
    &'a str,
    crate::command::Namespace<'a>,
    bool,
    bool,
);

fn summary<'a>(v: &CommandView<'a>) -> Summary<'a> {
    (
        v.kind(),
        v.name(),
        v.db(),
        v.namespace(),
        v.more_to_come(),
        v.is_explain(),
    )
}

type Fingerprint<'a> = Vec<(
    RuleId,
    Action,
    Option<usize>,
    Option<&'static str>,
    Option<&'a [u8]>,
)>;

fn fingerprint<'a>(d: &Decision<'a>) -> (Mode, Fingerprint<'a>) {
    (
        d.mode,
        d.violations
            .iter()
            .map(|v| {
                (
                    v.rule,
                    v.action,
                    v.statement,
                    v.detail,
                    v.filter.map(RawDocument::as_bytes),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use crate::policy::{Action, Decision, Mode, RuleId, Violation};

    fn g001(action: Action, mode: Mode) -> Decision<'static> {
        Decision::new(
            vec![Violation {
                rule: RuleId::G001,
                action,
                statement: None,
                filter: None,
                detail: Some("unreadable"),
            }],
            mode,
        )
    }

    #[test]
    fn g001_blocks_in_every_mode() {
        super::check_decision("t", &g001(Action::Block, Mode::Enforce), None);
        super::check_decision("t", &g001(Action::Block, Mode::Audit), None);
    }

    /// The oracle refuses a G001 that lets the command through in audit mode.
    #[test]
    #[should_panic(expected = "G001 in Audit mode")]
    fn an_unreadable_command_warned_in_audit_mode_is_caught() {
        super::check_decision("t", &g001(Action::Warn, Mode::Audit), None);
    }

    /// The oracle refuses a G001 that lets the command through in enforce mode.
    #[test]
    #[should_panic(expected = "G001 in Enforce mode")]
    fn an_unreadable_command_warned_in_enforce_mode_is_caught() {
        super::check_decision("t", &g001(Action::Warn, Mode::Enforce), None);
    }

    /// The oracle refuses a statement index past the batch.
    #[test]
    #[should_panic(expected = "points past")]
    fn a_statement_past_the_batch_is_caught() {
        let mut d = g001(Action::Block, Mode::Enforce);
        if let Some(v) = d.violations.first_mut() {
            v.rule = RuleId::W001;
            v.statement = Some(2);
        }
        super::check_decision("t", &d, Some(2));
    }
}
