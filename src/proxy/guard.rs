//! Enforcement: evaluate each client command against the policy in force, record every
//! violation, and decide whether the command is forwarded or answered by mongoguard.

use std::{net::SocketAddr, time::SystemTime};

use bson::RawDocumentBuf;

use super::{observe, Context};
use crate::{
    audit::{self, ViolationRecord},
    command::CommandView,
    metrics::ShapeScratch,
    policy::{filter, Action, Decision, Mode, RequestContext, RuleId, Violation},
    wire::{builder::error_document, Message, OpCode},
};

/// The code of every error mongoguard answers a blocked command with. It is outside every
/// code drivers retry or treat as a topology change (docs/protocol.md, "Error codes"), so no retry storms and no
/// pool clears; the reply carries no `errorLabels` and the connection stays open.
pub const BLOCK_CODE: i32 = 65_001;
/// The codeName paired with [`BLOCK_CODE`].
pub const BLOCK_CODE_NAME: &str = "MongoguardPolicyViolation";

/// What to do with a client message.
#[derive(Debug, Clone)]
pub(crate) enum Judgement {
    /// Send it upstream (allowed, or only warnings).
    Forward,
    /// Answer it (or drop it, when it expects no reply) with this message. When the command
    /// belonged to a transaction, `abort` is the abortTransaction to send upstream first:
    /// mongod aborts a transaction whose command fails, so a client that ignores the error
    /// cannot commit the rest.
    Block {
        errmsg: String,
        abort: Option<RawDocumentBuf>,
    },
    /// Measure the statements whose filter is `unknown` on the connection the write will
    /// use, then forward it or block it (see `super::measure`).
    Measure(Box<super::measure::MeasurePlan>),
}

/// What mongoguard does itself with a request, before (or instead of) forwarding it.
pub(crate) enum Local<'r> {
    /// Forward it.
    Forward,
    /// Answer it with this document (none: drop it, it expects no reply). `abort` is the
    /// abortTransaction to send upstream first.
    Handled {
        answer: Option<RawDocumentBuf>,
        abort: Option<&'r RawDocumentBuf>,
    },
}

/// Decides whether mongoguard answers `request` itself: a blocked command (answered, or
/// dropped when it expects no reply, its error kept in `last_blocked` for the connection's
/// next getLastError), or that getLastError. Counts blocked requests.
pub(crate) fn local_answer<'r>(
    ctx: &Context,
    request: &'r super::inspect::Request,
    last_blocked: &mut Option<String>,
) -> Local<'r> {
    match &request.judgement {
        Judgement::Block { errmsg, abort } => {
            ctx.stats.blocked.inc();
            let answer = if request.expects_reply {
                Some(block_document(errmsg, request.op, request.legacy_find))
            } else {
                tracing::debug!("blocked a write that expects no reply; dropped");
                *last_blocked = Some(errmsg.clone());
                None
            };
            Local::Handled {
                answer,
                abort: abort.as_ref(),
            }
        }
        Judgement::Forward if request.is_get_last_error => match last_blocked.take() {
            Some(errmsg) => Local::Handled {
                answer: Some(last_error_document(&errmsg)),
                abort: None,
            },
            None => Local::Forward,
        },
        Judgement::Forward | Judgement::Measure(_) => {
            if request.is_write {
                *last_blocked = None;
            }
            Local::Forward
        }
    }
}

/// Who sent the message, for overrides and records.
pub(crate) struct Who<'s> {
    pub peer: SocketAddr,
    pub app: Option<&'s str>,
    pub driver: Option<&'s str>,
    /// The user the client authenticated as (pooled mode).
    pub user: Option<&'s str>,
    pub upstream_wire_version: Option<i32>,
}

/// Evaluates one (decompressed) client message.
///
/// `scratch` receives the request's query shape (for `/shapes`) and its violation count.
// Long because the unreadable-command branch (G001) and the judged branch share the record,
// metrics and verdict code that follows; split, each would repeat it.
pub(crate) fn judge(
    ctx: &Context,
    msg: &Message<'_>,
    who: &Who<'_>,
    request_id: i32,
    scratch: &mut ShapeScratch,
) -> Judgement {
    let policy = ctx.policy.current();
    let view = match CommandView::from_message(msg) {
        Ok(v) => v,
        Err(e) => {
            // G001 blocks under every mode and every override: mongoguard fails closed.
            let action = Action::Block;
            let v = Violation {
                rule: RuleId::G001,
                action,
                statement: None,
                filter: None,
                detail: None,
            };
            scratch.violations = 1;
            observe::violation(ctx, record(&v, policy.mode(), None, who, request_id));
            return match action {
                Action::Block => Judgement::Block {
                    errmsg: crate::text::clip(
                        &format!("mongoguard blocked this command: G001 unreadable-command: {e}"),
                        ERRMSG_MAX,
                    )
                    .into_owned(),
                    abort: None,
                },
                _ => Judgement::Forward,
            };
        }
    };
    let rctx = RequestContext {
        app: who.app,
        user: who.user,
        client_ip: Some(who.peer.ip()),
        upstream_wire_version: who.upstream_wire_version,
    };
    let decision = policy.evaluate(&view, &rctx);
    scratch.capture(&view);
    if decision.violations.is_empty() && decision.measure.is_empty() {
        return Judgement::Forward;
    }
    scratch.violations = decision.total();
    for v in &decision.violations {
        observe::violation(ctx, record(v, decision.mode, Some(&view), who, request_id));
    }
    if decision.is_block() {
        Judgement::Block {
            errmsg: blocked_message(&decision),
            abort: view.body().and_then(abort_transaction),
        }
    } else if !decision.measure.is_empty() {
        let template = Violation {
            rule: RuleId::W001,
            action: Action::Warn,
            statement: None,
            filter: None,
            detail: None,
        };
        let template = record(&template, decision.mode, Some(&view), who, request_id);
        let abort = view.body().and_then(abort_transaction);
        Judgement::Measure(Box::new(super::measure::MeasurePlan::new(
            &decision, &view, template, abort,
        )))
    } else {
        Judgement::Forward
    }
}

/// `{abortTransaction: 1, lsid, txnNumber, autocommit: false, $db: "admin"}` for a command
/// that is part of a multi-document transaction (`autocommit: false`), else `None`.
fn abort_transaction(body: &bson::RawDocument) -> Option<RawDocumentBuf> {
    use bson::RawBsonRef;
    let in_txn = matches!(body.get("autocommit"), Ok(Some(RawBsonRef::Boolean(false))));
    if !in_txn {
        return None;
    }
    let lsid = body.get("lsid").ok()??;
    let txn = body.get("txnNumber").ok()??;
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::cstr!("abortTransaction"), 1);
    cmd.append(bson::cstr!("lsid"), lsid);
    cmd.append(bson::cstr!("txnNumber"), txn);
    cmd.append(bson::cstr!("autocommit"), false);
    cmd.append(bson::cstr!("$db"), "admin");
    Some(cmd)
}

/// "mongoguard blocked this command: W001 multi-update-without-filter (statement 3): reason;
/// ..." — every blocking rule, with its statement index.
pub(crate) fn blocked_message(decision: &Decision<'_>) -> String {
    let mut out = String::from("mongoguard blocked this command: ");
    let mut previous: Option<RuleId> = None;
    for (i, v) in decision.blocking().enumerate() {
        if previous.is_some_and(|p| p != v.rule) {
            more_statements(&mut out, decision, previous);
        }
        if i > 0 {
            out.push_str("; ");
        }
        let info = v.rule.info();
        out.push_str(info.code);
        out.push(' ');
        out.push_str(info.name);
        if let Some(s) = v.statement {
            out.push_str(&format!(" (statement {s})"));
        }
        out.push_str(": ");
        out.push_str(v.detail.unwrap_or(info.reason));
        previous = Some(v.rule);
        if out.len() > ERRMSG_MAX {
            break;
        }
    }
    more_statements(&mut out, decision, previous);
    match crate::text::clip(&out, ERRMSG_MAX) {
        std::borrow::Cow::Borrowed(_) => out,
        std::borrow::Cow::Owned(short) => short,
    }
}

/// "; and 19992 more statements" after the listed violations of a rule (evaluation lists a
/// few per rule and counts the rest).
fn more_statements(out: &mut String, decision: &Decision<'_>, rule: Option<RuleId>) {
    let n = rule.map_or(0, |r| decision.unlisted(r));
    if n > 0 {
        out.push_str(&format!("; and {n} more statements"));
    }
}

/// The longest errmsg mongoguard sends: client-chosen names it quotes stay short.
pub(crate) const ERRMSG_MAX: usize = 1024;

/// The error document for a blocked command, in the request's family: a command error for
/// OP_MSG and `$cmd` queries, a `$err` document for a legacy OP_QUERY find.
pub(crate) fn block_document(errmsg: &str, op: OpCode, legacy_find: bool) -> RawDocumentBuf {
    if op == OpCode::Query && legacy_find {
        return bson::rawdoc! {"$err": errmsg, "code": BLOCK_CODE, "codeName": BLOCK_CODE_NAME, "ok": 0.0};
    }
    error_document(BLOCK_CODE, BLOCK_CODE_NAME, errmsg)
}

/// What a legacy application's getLastError gets after its fire-and-forget write was
/// blocked: the write's error, as mongod reports write errors there.
pub(crate) fn last_error_document(errmsg: &str) -> RawDocumentBuf {
    bson::rawdoc! {
        "ok": 1.0, "err": errmsg, "code": BLOCK_CODE, "codeName": BLOCK_CODE_NAME, "n": 0,
    }
}

fn record(
    v: &Violation<'_>,
    mode: Mode,
    view: Option<&CommandView<'_>>,
    who: &Who<'_>,
    request_id: i32,
) -> ViolationRecord {
    let info = v.rule.info();
    let shape = v.filter.map(filter::shape);
    let shape_hash = shape.as_deref().map(filter::shape_hash);
    let ns = view.map(|view| view.namespace());
    ViolationRecord {
        time: SystemTime::now(),
        rule_id: info.code,
        rule_name: info.name,
        reason: v.detail.unwrap_or(info.reason),
        action: match v.action {
            Action::Block => audit::Action::Block,
            _ => audit::Action::Warn,
        },
        mode: match mode {
            Mode::Enforce => audit::Mode::Enforce,
            Mode::Audit => audit::Mode::Audit,
        },
        client_addr: Some(who.peer),
        app_name: who.app.map(str::to_owned),
        driver: who.driver.map(str::to_owned),
        user: who.user.map(str::to_owned),
        database: ns.map_or_else(String::new, |ns| ns.db.to_owned()),
        collection: ns.and_then(|ns| ns.coll).map(str::to_owned),
        command: view.map_or_else(|| "unknown".to_owned(), |v| v.display_name().to_owned()),
        statement_index: v.statement,
        filter_shape: shape,
        shape_hash,
        request_id,
        source: audit::Source::Proxy,
        detail: None,
        matched: None,
    }
}
