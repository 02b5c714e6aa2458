//! The three verdicts on the filter of a multi-document write: `All`, `Narrow`, `Unknown`.
//!
//! - `All`: [`super::tautology`] proved the filter matches every document (W001 / W003,
//!   no I/O).
//! - `Narrow`: proved selective by a deliberately conservative, syntactic definition: some
//!   top-level conjunct (of the filter itself, or of a top-level `$and`, to any depth of
//!   `$and`) is an equality on a field path with a *selective literal*, or a `$in` of at most
//!   [`NARROW_IN_MAX`] selective literals. A selective literal is any value but `null`,
//!   `undefined`, MinKey, MaxKey and a regular expression (a regex literal is a pattern match,
//!   and `/.*/` matches every string). A conjunction is at most as wide as any of its
//!   conjuncts, so one such conjunct bounds the whole filter whatever the others say. The
//!   collation does not matter: a case-insensitive equality still names one value.
//! - `Unknown`: everything else. Unknown never means allow: the proxy measures the filter
//!   against the data before forwarding the write (see `proxy::measure`).

use bson::{RawBsonRef, RawDocument};

use super::{is_operator_doc, tautology, MAX_DEPTH};

/// Most values a `$in` may list and still count as narrow.
pub const NARROW_IN_MAX: usize = 100;

/// What the filter of a multi-document write is proved to select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Proved to match every document.
    All,
    /// Proved selective (see the module docs).
    Narrow,
    /// Neither: measure it.
    Unknown,
}

impl Verdict {
    /// `"all" | "narrow" | "unknown"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::All => "all",
            Verdict::Narrow => "narrow",
            Verdict::Unknown => "unknown",
        }
    }
}

/// What the statement around a filter says that changes what it matches.
#[derive(Debug, Clone, Copy, Default)]
pub struct FilterFacts<'a> {
    /// The statement's collation, when it has one (`None`: simple binary comparison).
    pub collation: Option<&'a RawDocument>,
    /// The command's `let` variables (`$$name` in `$expr`).
    pub let_vars: Option<&'a RawDocument>,
}

impl FilterFacts<'_> {
    /// True when strings compare by their bytes: no collation, or `{locale: "simple"}`.
    pub fn simple_collation(&self) -> bool {
        match self.collation {
            None => true,
            Some(c) => {
                let mut locale = None;
                for e in c.iter_elements() {
                    let Ok(e) = e else { return false };
                    if e.key().as_str() == "locale" {
                        locale = e.value().ok();
                    }
                }
                matches!(locale, Some(RawBsonRef::String("simple")))
            }
        }
    }
}

/// The verdict on `filter`. Allocation-free; never panics.
pub fn verdict(filter: &RawDocument, facts: &FilterFacts<'_>) -> Verdict {
    if tautology::coverage_with(filter, facts) == tautology::Coverage::All {
        Verdict::All
    } else if is_narrow(filter, 0) {
        Verdict::Narrow
    } else {
        Verdict::Unknown
    }
}

/// Some top-level conjunct is a selective equality or short `$in` (module docs).
fn is_narrow(filter: &RawDocument, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    for elem in filter.iter_elements() {
        let Ok(elem) = elem else { return false };
        let Ok(value) = elem.value() else {
            return false;
        };
        let key = elem.key().as_str();
        let narrow = match key {
            "$and" => match value {
                RawBsonRef::Array(branches) => branches.into_iter().any(|b| match b {
                    Ok(RawBsonRef::Document(d)) => is_narrow(d, depth + 1),
                    _ => false,
                }),
                _ => false,
            },
            k if k.starts_with('$') => false,
            _ => selective_condition(value),
        };
        if narrow {
            return true;
        }
    }
    false
}

/// `field: literal`, `field: {$eq: literal}` or `field: {$in: [literals]}` (short), with
/// selective literals only. Any other operator in the same document is a further conjunct on
/// the field and cannot widen it.
fn selective_condition(value: RawBsonRef<'_>) -> bool {
    match value {
        RawBsonRef::Document(ops) if is_operator_doc(ops) => ops.iter_elements().any(|op| {
            let Ok(op) = op else { return false };
            match (op.key().as_str(), op.value()) {
                ("$eq", Ok(v)) => selective_literal(v),
                ("$in", Ok(RawBsonRef::Array(list))) => {
                    let mut n = 0usize;
                    for v in list {
                        match v {
                            Ok(v) if selective_literal(v) => n += 1,
                            _ => return false,
                        }
                        if n > NARROW_IN_MAX {
                            return false;
                        }
                    }
                    n > 0
                }
                _ => false,
            }
        }),
        other => selective_literal(other),
    }
}

fn selective_literal(v: RawBsonRef<'_>) -> bool {
    !matches!(
        v,
        RawBsonRef::Null
            | RawBsonRef::Undefined
            | RawBsonRef::MinKey
            | RawBsonRef::MaxKey
            | RawBsonRef::RegularExpression(_)
    )
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Regex};

    use super::*;

    fn v(d: bson::Document) -> Verdict {
        let buf = bson::RawDocumentBuf::try_from(&d).unwrap();
        verdict(&buf, &FilterFacts::default())
    }

    #[test]
    fn the_three_verdicts() {
        assert_eq!(v(doc! {}), Verdict::All);
        assert_eq!(v(doc! {"_id": {"$exists": true}}), Verdict::All);
        assert_eq!(v(doc! {"status": "old"}), Verdict::Narrow);
        assert_eq!(v(doc! {"a.b": 5, "$where": "sleep(1)"}), Verdict::Narrow);
        assert_eq!(v(doc! {"a": {"$gt": 1, "$eq": 3}}), Verdict::Narrow);
        assert_eq!(
            v(doc! {"$and": [{"x": {"$gt": 1}}, {"$and": [{"id": {"$in": [1, 2]}}]}]}),
            Verdict::Narrow
        );
        // Not narrow: ranges, null, MinKey, regex, long $in, a disjunction.
        assert_eq!(v(doc! {"a": {"$gt": 1}}), Verdict::Unknown);
        assert_eq!(v(doc! {"a": Bson::Null}), Verdict::Unknown);
        assert_eq!(v(doc! {"a": {"$eq": Bson::MinKey}}), Verdict::Unknown);
        assert_eq!(
            v(doc! {"a": Bson::RegularExpression(Regex {
                pattern: bson::cstr!(".*").into(),
                options: bson::cstr!("").into(),
            })}),
            Verdict::Unknown
        );
        let long: Vec<i32> = (0..=NARROW_IN_MAX as i32).collect();
        assert_eq!(v(doc! {"a": {"$in": long}}), Verdict::Unknown);
        assert_eq!(v(doc! {"a": {"$in": [1, Bson::Null]}}), Verdict::Unknown);
        assert_eq!(v(doc! {"a": {"$in": []}}), Verdict::Unknown);
        assert_eq!(v(doc! {"$or": [{"a": 1}, {"b": 2}]}), Verdict::Unknown);
        assert_eq!(v(doc! {"a": {"$ne": 1}}), Verdict::Unknown);
    }

    #[test]
    fn simple_collation() {
        let simple = bson::rawdoc! {"locale": "simple"};
        let fr = bson::rawdoc! {"locale": "fr", "strength": 1};
        assert!(FilterFacts::default().simple_collation());
        assert!(FilterFacts {
            collation: Some(&simple),
            let_vars: None
        }
        .simple_collation());
        assert!(!FilterFacts {
            collation: Some(&fr),
            let_vars: None
        }
        .simple_collation());
    }
}
