//! Running the rule families over a command.

use std::ops::ControlFlow;

use bson::RawDocument;

use super::{
    admin_rules,
    compiled::{Effective, Params},
    documents, indexes, plans, queries,
    rules::{RULES, RULE_COUNT},
    writes, Action, Decision, MeasureActions, Measurement, Mode, Policy, RequestContext, RuleId,
    Unlisted, Violation, MAX_LISTED_PER_RULE, MAX_MEASURED_STATEMENTS,
};
use crate::command::{CommandError, CommandView, Kind};

/// What rule code uses to report: knows the actions in force and collects violations.
///
/// Bounded: recording a violation costs O(1) whatever the batch size (no scan of the earlier
/// ones), and at most [`MAX_LISTED_PER_RULE`] violations of one rule and action are listed one
/// by one; the rest are counted (`Decision::unlisted`).
pub(crate) struct Emitter<'e, 'a> {
    eff: &'e Effective,
    pub params: &'e Params,
    pub ctx: &'e RequestContext<'e>,
    out: &'e mut Vec<Violation<'a>>,
    measure: &'e mut Vec<Measurement<'a>>,
    seen: &'e mut Seen,
    /// Whether the request writes a whole document (an insert, a replacement), the only
    /// statements the document rules judge, as found by a family that read every one of its
    /// statements without error; `None` until one has. A 1,000-statement update of
    /// operators is then not read a third time for nothing.
    pub writes_documents: Option<bool>,
}

/// Which (rule, statement) pairs already fired in this request, and how many violations of
/// each rule were listed. Empty (unallocated) until the first violation.
#[derive(Default)]
pub(crate) struct Seen {
    /// Indexed by rule (`RULE_COUNT` entries once anything fired).
    rules: Vec<RuleSeen>,
}

#[derive(Default, Clone)]
struct RuleSeen {
    /// Fired without a statement.
    whole: bool,
    /// Bit `i`: fired for statement `i` (grows to the highest statement that fired).
    statements: Vec<u64>,
    /// Violations listed, by action: `[warn, block]`.
    listed: [usize; 2],
    /// Violations counted but not listed, by action: `[warn, block]`.
    unlisted: [u64; 2],
}

/// What [`Seen::first`] found.
enum First<'s> {
    /// The first time for this (rule, statement): the rule's entry.
    New(&'s mut RuleSeen),
    /// Already fired for this statement.
    Again,
    /// A rule outside the table (cannot happen).
    Untracked,
}

impl Seen {
    /// Marks (rule, statement) as fired.
    fn first(&mut self, rule: RuleId, statement: Option<usize>) -> First<'_> {
        if self.rules.is_empty() {
            self.rules.resize(RULE_COUNT, RuleSeen::default());
        }
        // Every RuleId is below RULE_COUNT; were it not, the violation is listed (never
        // dropped).
        let Some(r) = self.rules.get_mut(rule as usize) else {
            return First::Untracked;
        };
        let fresh = match statement {
            None => !std::mem::replace(&mut r.whole, true),
            Some(i) => {
                let (word, bit) = (i / 64, 1u64 << (i % 64));
                if r.statements.len() <= word {
                    r.statements.resize(word + 1, 0);
                }
                match r.statements.get_mut(word) {
                    Some(w) => {
                        let fresh = *w & bit == 0;
                        *w |= bit;
                        fresh
                    }
                    None => true,
                }
            }
        };
        if fresh {
            First::New(r)
        } else {
            First::Again
        }
    }

    /// The violations counted but not listed, in rule order.
    fn unlisted(&self) -> Vec<Unlisted> {
        let mut out = Vec::new();
        // Nothing fired (the common case): no table to scan.
        if self.rules.is_empty() {
            return out;
        }
        for info in RULES.iter() {
            let Some(r) = self.rules.get(info.id as usize) else {
                continue;
            };
            for (count, action) in r.unlisted.iter().zip([Action::Warn, Action::Block]) {
                if *count > 0 {
                    out.push(Unlisted {
                        rule: info.id,
                        action,
                        count: *count,
                    });
                }
            }
        }
        out
    }
}

impl<'a> Emitter<'_, 'a> {
    /// True when the rule is checked for this request (skip the work otherwise).
    pub fn on(&self, rule: RuleId) -> bool {
        self.eff.action(rule) != Action::Off && rule.info().implemented
    }

    /// The action `rule` would have in enforce mode (see [`Effective::enforced_action`]):
    /// what to measure is decided as enforcement would, so that audit mode records what
    /// enforcement would find.
    pub fn enforced_action(&self, rule: RuleId) -> Action {
        self.eff.enforced_action(rule)
    }

    /// True when every given rule is off (skip a whole walk).
    pub fn all_off(&self, rules: &[RuleId]) -> bool {
        rules.iter().all(|r| !self.on(*r))
    }

    /// Reports a violation, once per (rule, statement).
    pub fn emit(
        &mut self,
        rule: RuleId,
        statement: Option<usize>,
        filter: Option<&'a RawDocument>,
    ) {
        self.emit_detail(rule, statement, filter, None);
    }

    /// A multi-document write whose filter is `unknown`: measured by the proxy before the
    /// command goes anywhere. With measurement off, or past [`MAX_MEASURED_STATEMENTS`], it
    /// gets `measure.on_error` at once (under the rule it is measured for): unknown never
    /// means allow. So does a filter no measurement can stand for: `unmeasurable` says why.
    pub fn measure(&mut self, m: Measurement<'a>, unmeasurable: Option<&'static str>) {
        let why = if let Some(why) = unmeasurable {
            why
        } else if !self.params.measure.enabled {
            "the filter is not proved selective and measurement is off (measure.enabled = false)"
        } else if self.measure.len() >= MAX_MEASURED_STATEMENTS {
            "the filter is not proved selective and the command has more such statements than \
             mongoguard measures for one request"
        } else {
            self.measure.push(m);
            return;
        };
        let action = on_error(self.params.measure.on_error, self.eff.mode);
        self.record(m.rule, action, Some(m.statement), Some(m.filter), Some(why));
    }

    /// [`Emitter::emit`] with a reason of its own instead of the rule's.
    pub fn emit_detail(
        &mut self,
        rule: RuleId,
        statement: Option<usize>,
        filter: Option<&'a RawDocument>,
        detail: Option<&'static str>,
    ) {
        if !self.on(rule) {
            return;
        }
        self.record(rule, self.eff.action(rule), statement, filter, detail);
    }

    /// [`Emitter::emit_detail`] with the action in force capped at `cap`: a rule with two
    /// thresholds (I002 warns past the first and blocks past the second, never beyond the
    /// action the policy sets).
    pub fn emit_capped(
        &mut self,
        rule: RuleId,
        cap: Action,
        filter: Option<&'a RawDocument>,
        detail: Option<&'static str>,
    ) {
        if !self.on(rule) {
            return;
        }
        let action = self.eff.action(rule).min(cap);
        self.record(rule, action, None, filter, detail);
    }

    /// Records a violation once per (rule, statement): listed while fewer than
    /// [`MAX_LISTED_PER_RULE`] of that rule and action are, counted after that.
    fn record(
        &mut self,
        rule: RuleId,
        action: Action,
        statement: Option<usize>,
        filter: Option<&'a RawDocument>,
        detail: Option<&'static str>,
    ) {
        let slot = match action {
            Action::Off => return,
            Action::Warn => 0,
            Action::Block => 1,
        };
        let listed = match self.seen.first(rule, statement) {
            First::New(r) => match (r.listed.get_mut(slot), r.unlisted.get_mut(slot)) {
                (Some(l), _) if *l < MAX_LISTED_PER_RULE => {
                    *l += 1;
                    true
                }
                (_, Some(u)) => {
                    *u += 1;
                    false
                }
                _ => true,
            },
            First::Again => return,
            First::Untracked => true,
        };
        if listed {
            self.out.push(Violation {
                rule,
                action,
                statement,
                filter,
                detail,
            });
        }
    }
}

/// `measure.on_error` for a request in `mode`: audit mode turns a block into a warning.
fn on_error(action: Action, mode: Mode) -> Action {
    if mode == Mode::Audit && action == Action::Block {
        Action::Warn
    } else {
        action
    }
}

/// A rule family's entry point.
pub(crate) type Family =
    for<'e, 'a> fn(&CommandView<'a>, &mut Emitter<'e, 'a>) -> Result<(), CommandError>;

const FAMILIES: [Family; 6] = [
    writes::check,
    admin_rules::check,
    queries::check,
    plans::check,
    indexes::check,
    documents::check,
];

pub(crate) fn evaluate<'a>(
    policy: &Policy,
    view: &CommandView<'a>,
    ctx: &RequestContext<'_>,
) -> Decision<'a> {
    let eff = policy.effective_for(view, ctx);
    let mut violations = Vec::new();
    let mut measure = Vec::new();
    let mut seen = Seen::default();
    let result = {
        let mut em = Emitter {
            eff: &eff,
            params: &policy.params,
            ctx,
            out: &mut violations,
            measure: &mut measure,
            seen: &mut seen,
            writes_documents: None,
        };
        run(view, &mut em)
    };
    if let Err(e) = result {
        violations.push(Violation {
            rule: RuleId::G001,
            // G001 blocks under every mode and override (see `Policy::effective`).
            action: Action::Block,
            statement: None,
            filter: None,
            detail: Some(error_detail(&e)),
        });
    }
    let let_vars = if measure.is_empty() {
        None
    } else {
        view.let_vars().ok().flatten()
    };
    Decision {
        violations,
        unlisted: seen.unlisted(),
        mode: eff.mode,
        measure,
        let_vars,
        measure_actions: MeasureActions {
            w001: eff.action(RuleId::W001),
            w003: eff.action(RuleId::W003),
            w012: eff.action(RuleId::W012),
            on_error: on_error(policy.params.measure.on_error, eff.mode),
            max_docs: policy.params.max_docs,
            time_limit: policy.params.measure.time_limit,
        },
    }
}

fn run<'a>(view: &CommandView<'a>, em: &mut Emitter<'_, 'a>) -> Result<(), CommandError> {
    // explain of a command is a read of its plan: query rules apply to the inner command,
    // write rules see no statements and no written namespaces there.
    let inner;
    let target = if view.kind() == Kind::Explain {
        match view.explained()? {
            Some(v) => {
                inner = v;
                &inner
            }
            None => view,
        }
    } else {
        view
    };
    for family in FAMILIES {
        family(target, em)?;
    }
    Ok(())
}

fn error_detail(e: &CommandError) -> &'static str {
    match e {
        CommandError::MissingDb => "the command has no $db",
        CommandError::BadField { .. } => "a field has a type mongoguard cannot interpret",
        CommandError::BadReference(r) => r,
        CommandError::Malformed => "malformed BSON inside the command",
        CommandError::TooDeep => "nesting deeper than mongoguard follows",
        CommandError::DuplicateKey => {
            "a statement, writeConcern or namespace document repeats a key"
        }
    }
}

/// Helper for families: runs `f` over each filter, stopping on the first error.
pub(crate) fn each_filter<'a>(
    view: &CommandView<'a>,
    mut f: impl FnMut(Option<usize>, &'a RawDocument) -> Result<(), CommandError>,
) -> Result<(), CommandError> {
    let mut err = None;
    let _ = view.for_each_filter(|index, filter| match f(index, filter) {
        Ok(()) => ControlFlow::Continue(()),
        Err(e) => {
            err = Some(e);
            ControlFlow::Break(())
        }
    })?;
    err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use bson::{rawdoc, RawArrayBuf, RawDocumentBuf};

    type Outcome = (
        Action,
        Vec<(RuleId, Action, Option<usize>)>,
        Vec<Unlisted>,
        u64,
    );

    use super::*;

    fn insert(n: usize, id: impl Fn(usize) -> bson::RawBson) -> RawDocumentBuf {
        let mut docs = RawArrayBuf::new();
        for i in 0..n {
            docs.push(rawdoc! {"_id": id(i)});
        }
        rawdoc! {"insert": "users", "documents": docs, "$db": "app"}
    }

    fn run(policy: &Policy, body: &RawDocumentBuf) -> Outcome {
        let view = CommandView::command("app", body).unwrap();
        let d = policy.evaluate(&view, &RequestContext::default());
        let listed = d
            .violations
            .iter()
            .map(|v| (v.rule, v.action, v.statement))
            .collect();
        (d.verdict(), listed, d.unlisted.clone(), d.total())
    }

    #[test]
    fn a_rule_lists_at_most_eight_statements_and_counts_the_rest() {
        let n = 20_000;
        let body = insert(n, |i| bson::RawBson::String(format!("id-{i}")));
        let (verdict, listed, unlisted, total) = run(&Policy::standard(), &body);
        assert_eq!(verdict, Action::Warn);
        let want: Vec<_> = (0..MAX_LISTED_PER_RULE)
            .map(|i| (RuleId::D004, Action::Warn, Some(i)))
            .collect();
        assert_eq!(listed, want);
        assert_eq!(
            unlisted,
            vec![Unlisted {
                rule: RuleId::D004,
                action: Action::Warn,
                count: (n - MAX_LISTED_PER_RULE) as u64,
            }]
        );
        assert_eq!(total, n as u64);
    }

    /// A 1,000-statement multi-update of unknown filters (`ordered: false` or not): the first
    /// [`MAX_MEASURED_STATEMENTS`] are measured (two queries each), every other one gets
    /// `measure.on_error` at once (W001, block in standard), so the work is bounded and no
    /// statement goes unjudged; audit mode records the same as warnings.
    #[test]
    fn a_thousand_unknown_filters_are_measured_up_to_the_cap_and_refused_past_it() {
        let mut updates = RawArrayBuf::new();
        for i in 0..1000 {
            updates.push(rawdoc! {"q": {"n": {"$gt": i}}, "u": {"$set": {"a": 1}}, "multi": true});
        }
        let body = rawdoc! {"update": "users", "updates": updates, "ordered": false, "$db": "app"};
        let view = CommandView::command("app", &body).unwrap();
        let d = Policy::standard().evaluate(&view, &RequestContext::default());
        let measured: Vec<usize> = d.measure.iter().map(|m| m.statement).collect();
        assert_eq!(measured, (0..MAX_MEASURED_STATEMENTS).collect::<Vec<_>>());
        assert_eq!(d.verdict(), Action::Block);
        assert_eq!(d.total(), (1000 - MAX_MEASURED_STATEMENTS) as u64);
        assert!(d
            .violations
            .iter()
            .all(|v| v.rule == RuleId::W001 && v.action == Action::Block));
        let audit = Policy::from_toml("mode = \"audit\"\n", "p.toml").unwrap();
        let d = audit.evaluate(&view, &RequestContext::default());
        assert_eq!(d.measure.len(), MAX_MEASURED_STATEMENTS);
        assert_eq!(d.verdict(), Action::Warn);
    }

    #[test]
    fn the_cap_never_hides_a_block() {
        let policy = Policy::from_toml("[rules]\nD004 = \"block\"\n", "p.toml").unwrap();
        let body = insert(100, |i| bson::RawBson::String(format!("id-{i}")));
        let (verdict, listed, unlisted, total) = run(&policy, &body);
        assert_eq!(verdict, Action::Block);
        assert_eq!(listed.len(), MAX_LISTED_PER_RULE);
        assert!(listed.iter().all(|l| l.1 == Action::Block));
        assert_eq!(unlisted.len(), 1);
        assert_eq!(unlisted[0].action, Action::Block);
        assert_eq!(total, 100);
    }

    #[test]
    fn under_the_cap_nothing_is_counted_and_an_allowed_batch_allocates_no_list() {
        let body = insert(MAX_LISTED_PER_RULE, |i| {
            bson::RawBson::String(format!("id-{i}"))
        });
        let (_, listed, unlisted, total) = run(&Policy::standard(), &body);
        assert_eq!(listed.len(), MAX_LISTED_PER_RULE);
        assert!(unlisted.is_empty());
        assert_eq!(total, MAX_LISTED_PER_RULE as u64);
        let body = insert(1000, |i| bson::RawBson::Int64(i as i64));
        let view = CommandView::command("app", &body).unwrap();
        let d = Policy::standard().evaluate(&view, &RequestContext::default());
        assert!(d.violations.is_empty() && d.unlisted.is_empty());
        assert_eq!(d.unlisted.capacity(), 0);
    }

    #[test]
    fn once_per_rule_and_statement_in_any_order() {
        let policy = Policy::standard();
        let eff = policy.effective(
            crate::command::Namespace {
                db: "app",
                coll: Some("c"),
            },
            &RequestContext::default(),
        );
        let ctx = RequestContext::default();
        let (mut out, mut measure, mut seen) = (Vec::new(), Vec::new(), Seen::default());
        let mut em = Emitter {
            eff: &eff,
            params: &policy.params,
            ctx: &ctx,
            out: &mut out,
            measure: &mut measure,
            seen: &mut seen,
            writes_documents: None,
        };
        for s in [3, 1, 3, 200, 1, 0, 200, 3] {
            em.emit(RuleId::W002, Some(s), None);
        }
        em.emit(RuleId::W002, None, None);
        em.emit(RuleId::W002, None, None);
        em.emit(RuleId::W004, Some(3), None);
        let got: Vec<_> = out.iter().map(|v| (v.rule, v.statement)).collect();
        assert_eq!(
            got,
            vec![
                (RuleId::W002, Some(3)),
                (RuleId::W002, Some(1)),
                (RuleId::W002, Some(200)),
                (RuleId::W002, Some(0)),
                (RuleId::W002, None),
                (RuleId::W004, Some(3)),
            ]
        );
        assert!(seen.unlisted().is_empty());
    }
}
