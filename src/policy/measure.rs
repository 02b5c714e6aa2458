//! What a blast-radius measurement decides. The proxy runs the queries (`proxy::measure`);
//! this is the pure rule that turns their answers into a violation, so that the rule
//! vectors can state it as data.

use super::{Action, MeasureActions, RuleId};

/// What the measuring queries found for one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Both queries answered.
    Counted {
        /// Documents the filter matched, counted up to `max_docs + 1` (or 1 when W012 is
        /// off: only "any at all" is asked then).
        matched: u64,
        /// The negation of the filter (`{$nor: [F]}`) found no document: every document of
        /// the collection matches.
        everything: bool,
    },
    /// A query failed, timed out, or its answer could not be read: why, for the errmsg.
    Failed(String),
}

/// A violation a measurement found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// W001 / W003 (everything matched, or the measurement failed) or W012.
    pub rule: RuleId,
    /// Its action for this request (`Warn` or `Block`).
    pub action: Action,
    /// The reason given to the client and the record, with the measured facts.
    pub detail: String,
    /// The measured count (`max_docs + 1` means "more than `max_docs`").
    pub matched: Option<u64>,
}

/// The violation `outcome` fires for a statement measured for `rule` (W001 or W003), if any.
///
/// - every document of a non-empty collection matches: `rule`;
/// - more than `max_docs` match: W012 (when both hold, the one with the stricter action);
/// - the measurement failed: `rule` with `measure.on_error`'s action;
/// - otherwise nothing (an empty collection matches "everything" harmlessly).
pub fn finding(actions: &MeasureActions, rule: RuleId, outcome: &Outcome) -> Option<Finding> {
    match outcome {
        Outcome::Failed(why) => Some(Finding {
            rule,
            action: actions.on_error,
            detail: format!(
                "the filter is not proved selective and measuring it against the data failed \
                 ({why}); mongoguard does not forward a multi-document write it could not \
                 measure (measure.on_error)"
            ),
            matched: None,
        })
        .filter(|f| f.action != Action::Off),
        Outcome::Counted {
            matched,
            everything,
        } => {
            let all =
                (*everything && *matched > 0 && actions.action(rule) != Action::Off).then(|| {
                    Finding {
                        rule,
                        action: actions.action(rule),
                        detail: format!(
                            "measured against the data: the filter matches every document of the \
                         collection ({} documents or more)",
                            matched
                        ),
                        matched: Some(*matched),
                    }
                });
            let many =
                (*matched > actions.max_docs && actions.w012 != Action::Off).then(|| Finding {
                    rule: RuleId::W012,
                    action: actions.w012,
                    detail: format!(
                        "measured against the data: the filter matches more than {} documents \
                         (W012 max_docs); write in batches, use a TTL index, or drop",
                        actions.max_docs
                    ),
                    matched: Some(*matched),
                });
            // Both can hold: the stricter action decides (W001 relaxed to a warning must not
            // hide a W012 block); on a tie the rule measured for names it.
            match (all, many) {
                (Some(a), Some(m)) if m.action > a.action => Some(m),
                (Some(a), _) => Some(a),
                (None, m) => m,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn actions() -> MeasureActions {
        MeasureActions {
            w001: Action::Block,
            w003: Action::Block,
            w012: Action::Warn,
            on_error: Action::Block,
            max_docs: 10,
            time_limit: Duration::from_secs(1),
        }
    }

    #[test]
    fn outcomes() {
        let a = actions();
        let all = Outcome::Counted {
            matched: 3,
            everything: true,
        };
        let f = finding(&a, RuleId::W003, &all).unwrap();
        assert_eq!((f.rule, f.action), (RuleId::W003, Action::Block));
        assert!(f.detail.contains("every document"), "{}", f.detail);
        // An empty collection: the negation finds nothing, and nothing matches either.
        let empty = Outcome::Counted {
            matched: 0,
            everything: true,
        };
        assert_eq!(finding(&a, RuleId::W001, &empty), None);
        let many = Outcome::Counted {
            matched: 11,
            everything: false,
        };
        let f = finding(&a, RuleId::W001, &many).unwrap();
        assert_eq!(
            (f.rule, f.action, f.matched),
            (RuleId::W012, Action::Warn, Some(11))
        );
        let few = Outcome::Counted {
            matched: 10,
            everything: false,
        };
        assert_eq!(finding(&a, RuleId::W001, &few), None);
        let failed = Outcome::Failed("timed out after 1000 ms".into());
        let f = finding(&a, RuleId::W001, &failed).unwrap();
        assert_eq!((f.rule, f.action), (RuleId::W001, Action::Block));
        assert!(f.detail.contains("timed out"), "{}", f.detail);
        // W001 off: an all-matching large filter still fires W012.
        let off = MeasureActions {
            w001: Action::Off,
            ..a
        };
        let big_all = Outcome::Counted {
            matched: 11,
            everything: true,
        };
        assert_eq!(
            finding(&off, RuleId::W001, &big_all).unwrap().rule,
            RuleId::W012
        );
    }

    /// W001 relaxed to a warning (an override for a migration) must not hide a W012 block:
    /// a filter measured to match every document of a collection larger than `max_docs`
    /// breaks both, and the stricter action decides.
    #[test]
    fn the_stricter_finding_wins() {
        let a = MeasureActions {
            w001: Action::Warn,
            w012: Action::Block,
            ..actions()
        };
        let big_all = Outcome::Counted {
            matched: 11,
            everything: true,
        };
        let f = finding(&a, RuleId::W001, &big_all).unwrap();
        assert_eq!((f.rule, f.action), (RuleId::W012, Action::Block));
        // A small collection: only W001, as a warning.
        let small_all = Outcome::Counted {
            matched: 3,
            everything: true,
        };
        let f = finding(&a, RuleId::W001, &small_all).unwrap();
        assert_eq!((f.rule, f.action), (RuleId::W001, Action::Warn));
        // Equal actions: the rule measured for names it.
        let both_block = MeasureActions {
            w001: Action::Block,
            ..a
        };
        let f = finding(&both_block, RuleId::W001, &big_all).unwrap();
        assert_eq!((f.rule, f.action), (RuleId::W001, Action::Block));
    }
}
