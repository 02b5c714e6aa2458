//! Running the rule families over a command.

use std::ops::ControlFlow;

use bson::RawDocument;

use super::{
    compiled::{Effective, Params},
    documents, indexes, queries, writes, Action, Decision, Policy, RequestContext, RuleId,
    Violation,
};
use crate::command::{CommandError, CommandView, Kind};

/// What rule code uses to report: knows the actions in force and collects violations.
pub(crate) struct Emitter<'e, 'a> {
    eff: &'e Effective,
    pub params: &'e Params,
    pub ctx: &'e RequestContext<'e>,
    out: &'e mut Vec<Violation<'a>>,
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
            detail: None,
        });
    }
}

/// A rule family's entry point.
pub(crate) type Family =
    for<'e, 'a> fn(&CommandView<'a>, &mut Emitter<'e, 'a>) -> Result<(), CommandError>;

const FAMILIES: [Family; 4] = [
    writes::check,
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
    let result = {
        let mut em = Emitter {
            eff: &eff,
            params: &policy.params,
            ctx,
            out: &mut violations,
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
    Decision {
        violations,
        mode: eff.mode,
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
