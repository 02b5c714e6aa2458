//! Filter analysis: what a MongoDB query filter selects, which predicates it uses, and its
//! literal-free shape.
//!
//! Everything here runs on the proxy's hot path for every request, so the analyses share
//! three constraints:
//!
//! - **No allocation while looking.** [`tautology::coverage`] and the [`walk`] visitor read
//!   borrowed [`bson::RawDocument`] views and never build a `String`, `Vec` or `Box`. Only
//!   [`shape::shape`] allocates, and it runs for violations only.
//! - **Bounded depth.** Every recursion carries an explicit depth and stops at
//!   [`MAX_DEPTH`]: hostile nesting yields "unknown" (or a [`walk::Event::TooDeep`]), never a
//!   stack overflow.
//! - **No panics on input.** A malformed element is a value (`Unknown`, `Malformed`,
//!   `"<malformed>"`), never an `unwrap`.
//!
//! Modules:
//! - [`mod@tautology`]: does a filter match every document? (`All` / `Conditioned` / `Unknown`)
//! - [`walk`]: a visitor over every predicate of a filter, an aggregation expression or a
//!   pipeline, to any depth; plus [`walk::regex_is_anchored`].
//! - [`mod@volatile`]: can its matches change with the clock or by chance (not measurable)?
//! - [`mod@shape`]: the filter rendered as JSON with every literal replaced by its type, and a
//!   stable hash of that rendering for grouping query shapes.

mod anchor;
pub mod shape;
pub mod tautology;
pub mod verdict;
pub mod volatile;
pub mod walk;

mod js;

pub use shape::{shape, shape_hash};
pub use tautology::{coverage, coverage_with, Coverage};
pub use verdict::{verdict, FilterFacts, Verdict};
pub use walk::{
    regex_is_anchored, regex_is_anchored_with, walk_expression, walk_filter, walk_pipeline, Event,
    Visitor,
};

use bson::{Decimal128, RawBsonRef, RawDocument};

/// How deep any analysis descends into nested documents and arrays. mongod itself refuses
/// BSON nested deeper than 100 levels (and query trees far shallower), so a filter that goes
/// past this is hostile or broken: it is reported as unknown, never walked further.
pub const MAX_DEPTH: usize = 100;

/// The query-language truthiness of a value (mongod's `BSONElement::trueValue`): `false`,
/// numeric zero, `null` and `undefined` are false, everything else is true. Used by
/// `$exists`, where `{$exists: 0}` means "does not exist".
pub(crate) fn true_value(v: RawBsonRef<'_>) -> bool {
    match v {
        RawBsonRef::Boolean(b) => b,
        RawBsonRef::Int32(n) => n != 0,
        RawBsonRef::Int64(n) => n != 0,
        RawBsonRef::Double(f) => f != 0.0,
        RawBsonRef::Decimal128(d) => decimal_is_zero(d) != Some(true),
        RawBsonRef::Null | RawBsonRef::Undefined => false,
        _ => true,
    }
}

/// Whether a Decimal128 is zero, read from its BID encoding without formatting it. `None`
/// for NaN. A coefficient in the large form is always above 10^34 - 1, which IEEE 754-2008
/// declares non-canonical and reads as zero.
pub(crate) fn decimal_is_zero(d: Decimal128) -> Option<bool> {
    let b = d.bytes();
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&b[..8]);
    hi.copy_from_slice(&b[8..]);
    let (lo, hi) = (u64::from_le_bytes(lo), u64::from_le_bytes(hi));
    match (hi >> 58) & 0x1f {
        0x1f => return None,        // NaN
        0x1e => return Some(false), // ±Infinity
        _ => {}
    }
    if (hi >> 61) & 0b11 == 0b11 {
        return Some(true);
    }
    Some(lo == 0 && hi & ((1u64 << 49) - 1) == 0)
}

/// Whether a Decimal128 is NaN.
pub(crate) fn decimal_is_nan(d: Decimal128) -> bool {
    d.bytes()[15] & 0x7c == 0x7c
}

/// The first key of a document, or `None` when it is empty or its first element is
/// malformed. An embedded document whose first key starts with `$` is an operator
/// expression (`{$gt: 1}`); otherwise it is a literal to compare with (`{a: 1}`). This is
/// exactly how mongod decides.
pub(crate) fn first_key(doc: &RawDocument) -> Option<&str> {
    match doc.iter_elements().next() {
        Some(Ok(e)) => Some(e.key().as_str()),
        _ => None,
    }
}

/// Whether an embedded document under a field is an operator expression (`{$gt: 1}`)
/// rather than an embedded-document literal (`{b: 1}`).
pub(crate) fn is_operator_doc(doc: &RawDocument) -> bool {
    first_key(doc).is_some_and(|k| k.starts_with('$'))
}

#[cfg(test)]
mod alloc_tests;
#[cfg(test)]
mod soundness_tests;
#[cfg(test)]
mod tautology_tests;
#[cfg(test)]
mod test_util;
#[cfg(test)]
mod vectors;
#[cfg(test)]
mod walk_tests;
