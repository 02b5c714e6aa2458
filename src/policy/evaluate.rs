//! Running the rule families over a command.

use std::ops::ControlFlow;

use bson::RawDocument;

use super::{
    admin_rules,
    compiled::{Effective, Params},
    documents, indexes, queries, writes, Action, Decision, MeasureActions, Measurement, Mode,
    Policy, RequestContext, RuleId, Violation, MAX_MEASURED_STATEMENTS,
};
use crate::command::{CommandError, CommandView, Kind};

/// What rule code uses to report: knows the actions in force and collects violations.
pub(crate) struct Emitter<'e, 'a> {
    eff: &'e Effective,
    pub params: &'e Params,
    pub ctx: &'e RequestContext<'e>,
    out: &'e mut Vec<Violation<'a>>,
    measure: &'e mut Vec<Measurement<'a>>,
}

impl<'a> Emitter<'_, 'a> {
    /// True when the rule is checked for this request (skip the work otherwise).
    pub fn on(&self, rule: RuleId) -> bool {
        self.eff.action(rule) != Action::Off && rule.info().implemented
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
    /// means allow.
    pub fn measure(&mut self, m: Measurement<'a>) {
        let why = if !self.params.measure.enabled {
            "the filter is not proved selective and measurement is off (measure.enabled = false)"
        } else if self.measure.len() >= MAX_MEASURED_STATEMENTS {
            "the filter is not proved selective and the command has more such statements than \
             mongoguard measures for one request"
        } else {
            self.measure.push(m);
            return;
        };
        let action = on_error(self.params.measure.on_error, self.eff.mode);
        if action == Action::Off || self.out.iter().any(|v| v.rule == m.rule && v.statement == Some(m.statement)) {
            return;
        }
        self.out.push(Violation {
            rule: m.rule,
            action,
            statement: Some(m.statement),
            filter: Some(m.filter),
            detail: Some(why),
        });
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
        if self
            .out
            .iter()
            .any(|v| v.rule == rule && v.statement == statement)
        {
            return;
        }
        self.out.push(Violation {
            rule,
            action: self.eff.action(rule),
            statement,
            filter,
            detail,
        });
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

const FAMILIES: [Family; 5] = [
    writes::check,
    admin_rules::check,
    queries::check,
    indexes::check,
    documents::check,
];

pub(crate) fn evaluate<'a>(
    policy: &Policy,
    view: &CommandView<'a>,
    ctx: &RequestContext<'_>,
) -> Decision<'a> {
    let eff = policy.effective(view.namespace(), ctx);
    let mut violations = Vec::new();
    let mut measure = Vec::new();
    let result = {
        let mut em = Emitter {
            eff: &eff,
            params: &policy.params,
            ctx,
            out: &mut violations,
            measure: &mut measure,
        };
        run(view, &mut em)
    };
    if let Err(e) = result {
        violations.push(Violation {
            rule: RuleId::G001,
            // G001 always blocks in enforce mode (load-time validated); audit mode warns.
            action: eff.action(RuleId::G001),
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
