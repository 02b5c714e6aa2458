//! Enforcement: evaluate each client command against the policy in force, record every
//! violation, and decide whether the command is forwarded or answered by mongoguard.

use crate::wire::GetFast;
use std::{net::SocketAddr, time::SystemTime};

use bson::RawDocumentBuf;

use super::{observe, Context};
use crate::{
    audit::{self, ViolationRecord},
    command::CommandView,
    metrics::ShapeScratch,
    policy::{filter, Action, Decision, Mode, RequestContext, RuleId, Violation},
    wire::{builder::error_document, Index, Message, OpCode},
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
///
/// `body`: the index of an OP_MSG's body when the caller built one (see `Strategy::route`).
pub(crate) fn judge<'a>(
    ctx: &Context,
    msg: &Message<'a>,
    body: Option<Index<'a>>,
    who: &Who<'_>,
    request_id: i32,
    scratch: &mut ShapeScratch,
) -> Judgement {
    let policy = ctx.policy.current();
    let view = match CommandView::from_message_indexed(msg, body) {
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
                    errmsg: {
                        let mut text = BlockedText::default();
                        text.push(RuleId::G001, 0, None, &e.to_string());
                        text.finish()
                    },
                    abort: None,
                },
                _ => Judgement::Forward,
            };
        }
    };
    // The plan guard: a known verdict of this shape, or an explain scheduled (never waited
    // for) when the rules that read it are on (the shape's plan key is computed only then).
    let plan_rules = ctx.plan.is_on()
        && (policy.action(RuleId::Q006) != Action::Off
            || policy.action(RuleId::Q007) != Action::Off);
    scratch.capture_for(&view, plan_rules);
    plan_upkeep(ctx, &view);
    let plan = match scratch.plan_key() {
        Some(key) if scratch.active && plan_rules => ctx.plan.verdict(key, &view),
        _ => None,
    };
    let ns = view.namespace();
    let index_count = if view.kind() == crate::command::Kind::CreateIndexes
        && policy.action(RuleId::I002) != Action::Off
    {
        ctx.plan.index_count(ns.db, ns.coll)
    } else {
        None
    };
    let shard_keys = ctx.plan.shard_keys();
    let rctx = RequestContext {
        app: who.app,
        user: who.user,
        client_ip: Some(who.peer.ip()),
        upstream_wire_version: who.upstream_wire_version,
        plan: plan.as_ref().map(|v| v.facts),
        index_count,
        shard_key: shard_keys.as_ref().and_then(|k| k.get(ns.db, ns.coll)),
    };
    scratch.set_plan(plan);
    let mut decision = policy.evaluate(&view, &rctx);
    if let Some(v) = ctx.allowlist.check(&policy, &view, &rctx, scratch) {
        decision.violations.push(v);
    }
    if !decision.is_block() {
        indexes_created(ctx, &view);
    }
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

/// Index changes and drops make the plan guard's verdicts of that namespace stale.
fn plan_upkeep(ctx: &Context, view: &CommandView<'_>) {
    use crate::command::Kind;
    let ns = view.namespace();
    match view.kind() {
        // (Its index count grows once it is judged and forwarded: `indexes_created`.)
        Kind::CreateIndexes => ctx.plan.invalidate_plans(ns.db, ns.coll),
        Kind::DropIndexes | Kind::Drop => ctx.plan.invalidate(ns.db, ns.coll),
        Kind::DropDatabase => ctx.plan.invalidate(ns.db, None),
        _ => {}
    }
}

/// A createIndexes that goes to the server adds its specs to the collection's known count.
fn indexes_created(ctx: &Context, view: &CommandView<'_>) {
    if view.kind() != crate::command::Kind::CreateIndexes || view.is_explain() {
        return;
    }
    let specs = match view.body().map(|b| b.get_fast("indexes")) {
        Some(Ok(Some(bson::RawBsonRef::Array(a)))) => a.into_iter().count(),
        _ => return,
    };
    let ns = view.namespace();
    ctx.plan.note_created(ns.db, ns.coll, specs);
}

/// `{abortTransaction: 1, lsid, txnNumber, autocommit: false, $db: "admin"}` for a command
/// that is part of a multi-document transaction (`autocommit: false`), else `None`.
fn abort_transaction(body: &bson::RawDocument) -> Option<RawDocumentBuf> {
    use bson::RawBsonRef;
    let in_txn = matches!(
        body.get_fast("autocommit"),
        Ok(Some(RawBsonRef::Boolean(false)))
    );
    if !in_txn {
        return None;
    }
    let lsid = body.get_fast("lsid").ok()??;
    let txn = body.get_fast("txnNumber").ok()??;
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::cstr!("abortTransaction"), 1);
    cmd.append(bson::cstr!("lsid"), lsid);
    cmd.append(bson::cstr!("txnNumber"), txn);
    cmd.append(bson::cstr!("autocommit"), false);
    cmd.append(bson::cstr!("$db"), "admin");
    Some(cmd)
}

/// "mongoguard blocked this command: W001 multi-update-without-filter (statement 3): reason.
/// Instead: remedy; ..." — every blocking rule, with its statement indexes.
pub(crate) fn blocked_message(decision: &Decision<'_>) -> String {
    let mut text = BlockedText::default();
    for v in decision.blocking() {
        let detail = v.detail.unwrap_or(v.rule.info().reason);
        text.push(v.rule, decision.unlisted(v.rule), v.statement, detail);
    }
    text.finish()
}

/// The errmsg of a blocked command, rule by rule: `CODE name (statements 0, 2): what is wrong;
/// (statement 5): another detail; and N more statements. Instead: the rule's remedy`, rules
/// joined by "; ". Consecutive statements of a rule with the same text share one clause. The
/// message stays within [`ERRMSG_MAX`] and every rule it names ends with its remedy: clauses
/// that would not fit are counted in "and N more statements" instead of being cut mid-way.
#[derive(Default)]
pub(crate) struct BlockedText {
    out: String,
    /// The rule being collected, the statements it has beyond those pushed (evaluation lists
    /// a few per rule and counts the rest), and its clauses: statement indexes and their text.
    open: Option<(RuleId, u64, Vec<Clause>)>,
    rules_left_out: usize,
}

/// Statement indexes and the text they share.
type Clause = (Vec<usize>, String);

/// The longest text of one clause (a client-chosen name quoted in a detail stays short).
const CLAUSE_MAX: usize = 400;

impl BlockedText {
    const PREFIX: &'static str = "mongoguard blocked this command: ";

    /// One blocking violation. `unlisted`: how many more statements this rule hit than are
    /// pushed (the same number for every push of the rule).
    pub(crate) fn push(
        &mut self,
        rule: RuleId,
        unlisted: u64,
        statement: Option<usize>,
        text: &str,
    ) {
        if self.open.as_ref().is_some_and(|(r, _, _)| *r != rule) {
            self.close();
        }
        let (_, _, clauses) = self
            .open
            .get_or_insert_with(|| (rule, unlisted, Vec::new()));
        match clauses.last_mut() {
            Some((statements, last)) if last == text => statements.extend(statement),
            _ => {
                let text = crate::text::clip(text, CLAUSE_MAX).into_owned();
                clauses.push((statement.into_iter().collect(), text))
            }
        }
    }

    fn close(&mut self) {
        let Some((rule, unlisted, clauses)) = self.open.take() else {
            return;
        };
        let info = rule.info();
        let mut group = String::new();
        group.push_str(info.code);
        group.push(' ');
        group.push_str(info.name);
        let mut left_out = unlisted;
        let tail = |n: u64| {
            let more = if n > 0 {
                format!("; and {n} more statements")
            } else {
                String::new()
            };
            format!("{more}. Instead: {}", info.remedy)
        };
        // Room for the separator, the group's tail and a generous "more statements" count.
        let budget = |group: &str, out: &str| {
            Self::PREFIX.len() + out.len() + 2 + group.len() + tail(u64::MAX).len()
        };
        for (i, (statements, text)) in clauses.iter().enumerate() {
            let mut clause = String::new();
            if i > 0 {
                clause.push(';');
            }
            match statements.as_slice() {
                [] => {}
                [one] => clause.push_str(&format!(" (statement {one})")),
                many => {
                    let list: Vec<String> = many.iter().map(|s| s.to_string()).collect();
                    clause.push_str(&format!(" (statements {})", list.join(", ")));
                }
            }
            clause.push_str(": ");
            clause.push_str(text);
            if budget(&group, &self.out) + clause.len() > ERRMSG_MAX && i > 0 {
                let rest = clauses.iter().skip(i);
                left_out += rest.map(|(s, _)| s.len().max(1) as u64).sum::<u64>();
                break;
            }
            group.push_str(&clause);
        }
        group.push_str(&tail(left_out));
        if !self.out.is_empty() && budget(&group, &self.out) > ERRMSG_MAX {
            self.rules_left_out += 1;
            return;
        }
        if !self.out.is_empty() {
            self.out.push_str("; ");
        }
        self.out.push_str(&group);
    }

    /// The errmsg.
    pub(crate) fn finish(mut self) -> String {
        self.close();
        let mut out = String::from(Self::PREFIX);
        out.push_str(&self.out);
        if self.rules_left_out > 0 {
            out.push_str(&format!("; and {} more rules", self.rules_left_out));
        }
        match crate::text::clip(&out, ERRMSG_MAX) {
            std::borrow::Cow::Borrowed(_) => out,
            std::borrow::Cow::Owned(short) => short,
        }
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

#[cfg(test)]
mod tests {
    use super::{BlockedText, ERRMSG_MAX};
    use crate::policy::RuleId;

    fn remedy(rule: RuleId) -> String {
        format!(". Instead: {}", rule.info().remedy)
    }

    #[test]
    fn every_rule_named_ends_with_its_remedy() {
        let mut t = BlockedText::default();
        t.push(RuleId::W001, 0, Some(0), RuleId::W001.info().reason);
        t.push(RuleId::W001, 0, Some(2), RuleId::W001.info().reason);
        t.push(RuleId::W006, 0, None, RuleId::W006.info().reason);
        let msg = t.finish();
        let w001 = format!(
            "mongoguard blocked this command: W001 multi-update-without-filter (statements 0, 2): {}{}; ",
            RuleId::W001.info().reason,
            remedy(RuleId::W001)
        );
        assert!(msg.starts_with(&w001), "{msg}");
        assert!(msg.ends_with(&remedy(RuleId::W006)), "{msg}");
        assert!(
            msg.contains("W006 journal-disabled: a write concern"),
            "{msg}"
        );
    }

    #[test]
    fn different_details_get_their_own_clause_and_unlisted_are_counted() {
        let mut t = BlockedText::default();
        t.push(RuleId::W012, 7, Some(1), "matched 500 documents");
        t.push(RuleId::W012, 7, Some(3), "matched 900 documents");
        let msg = t.finish();
        assert!(
            msg.ends_with(&format!(
                "W012 large-multi-write (statement 1): matched 500 documents; (statement 3): matched 900 documents; and 7 more statements{}",
                remedy(RuleId::W012)
            )),
            "{msg}"
        );
    }

    /// Hostile: thousands of statements with distinct, long details (client-chosen names)
    /// must not push the remedy past the size limit nor cut it.
    #[test]
    fn long_messages_stay_bounded_and_keep_the_remedy() {
        let mut t = BlockedText::default();
        let long = "x".repeat(5000);
        for i in 0..2000 {
            t.push(RuleId::W005, 10, Some(i), &format!("{i}{long}"));
        }
        for i in 0..50 {
            t.push(
                RuleId::W006,
                0,
                Some(i),
                &format!("detail {i} {}", "y".repeat(100)),
            );
        }
        let msg = t.finish();
        assert!(msg.len() <= ERRMSG_MAX, "{}", msg.len());
        assert!(msg.contains(&remedy(RuleId::W005)), "{msg}");
        assert!(msg.contains("more statements"), "{msg}");
        // The second rule does not fit whole: it is named as left out, not cut mid-way.
        assert!(msg.ends_with("; and 1 more rules"), "{msg}");
    }

    #[test]
    fn every_rule_has_a_remedy_in_its_message() {
        for info in crate::policy::RULES.iter() {
            let mut t = BlockedText::default();
            t.push(info.id, 0, None, info.reason);
            let msg = t.finish();
            assert!(msg.ends_with(&remedy(info.id)), "{msg}");
            assert!(msg.len() <= ERRMSG_MAX);
        }
    }
}
