//! Reading command fields the way mongod does: numbers of any BSON type for booleans and
//! limits, and errors (never guesses) for anything else.

use bson::{RawArray, RawBsonRef, RawDocument};

use super::error::CommandError;
use crate::wire::Index;

/// Refuses a sub-document with a repeated key. The guard reads the first value of a key;
/// a server may read the last: such a document must never be judged (fail closed).
pub(crate) fn unique_keys(doc: &RawDocument) -> Result<&RawDocument, CommandError> {
    crate::wire::check_duplicate_keys(doc).map_err(|e| match e {
        crate::wire::WireError::DuplicateKey(_) => CommandError::DuplicateKey,
        _ => CommandError::Malformed,
    })?;
    Ok(doc)
}

/// Where a command's fields are looked up: a document, or the [`Index`] of one (a request's
/// command body, indexed once when its view is built). Both give `RawDocument::get`'s answer.
pub(crate) trait Fields<'a>: Copy {
    /// The value of `key`; `Err` when the document is malformed up to it.
    fn lookup(self, key: &str) -> bson::error::Result<Option<RawBsonRef<'a>>>;
}

impl<'a> Fields<'a> for &'a RawDocument {
    fn lookup(self, key: &str) -> bson::error::Result<Option<RawBsonRef<'a>>> {
        crate::wire::GetFast::get_fast(self, key)
    }
}

impl<'a> Fields<'a> for &Index<'a> {
    fn lookup(self, key: &str) -> bson::error::Result<Option<RawBsonRef<'a>>> {
        self.get(key)
    }
}

/// The fields of a write statement, read once: [`unique_keys`] and then lookups give the
/// same answers. Every statement of a batch is read again by each rule family that looks at
/// statements; one walk that checks the keys and keeps the `N` values asked for costs about
/// a third of checking the keys, indexing the statement and looking each field up
/// (`tests::picked_statements_read_as_indexed_ones` checks that both read the same).
pub(crate) enum Picked<'a, const N: usize> {
    /// Every key distinct and each value of `keys` built by the walk.
    Read {
        keys: &'static [&'static str; N],
        values: [Option<RawBsonRef<'a>>; N],
    },
    /// What the walk did not decide: keys checked by [`unique_keys`], fields looked up.
    Indexed(Index<'a>),
}

impl<'a, const N: usize> Picked<'a, N> {
    /// `doc`'s fields `keys`; the error [`unique_keys`] gives.
    pub(crate) fn new(
        doc: &'a RawDocument,
        keys: &'static [&'static str; N],
    ) -> Result<Self, CommandError> {
        Ok(match crate::wire::pick(doc, keys) {
            Some(values) => Picked::Read { keys, values },
            None => Picked::Indexed(Index::new(unique_keys(doc)?)),
        })
    }

    /// The fields, in the order of the keys given to [`Picked::new`], each a source the
    /// value helpers ([`get`], [`get_doc`], [`flag`]...) read with its key.
    pub(crate) fn fields(&self) -> [Field<'_, 'a, N>; N] {
        std::array::from_fn(|i| Field { picked: self, i })
    }
}

/// One field of a [`Picked`] statement.
#[derive(Clone, Copy)]
pub(crate) struct Field<'p, 'a, const N: usize> {
    picked: &'p Picked<'a, N>,
    i: usize,
}

impl<'a, const N: usize> Fields<'a> for Field<'_, 'a, N> {
    /// The value read for this field; `key` must be its key (it is what an indexed
    /// statement looks up).
    fn lookup(self, key: &str) -> bson::error::Result<Option<RawBsonRef<'a>>> {
        match self.picked {
            Picked::Read { keys, values } => {
                debug_assert_eq!(
                    keys.get(self.i).copied(),
                    Some(key),
                    "field read by another key"
                );
                Ok(values.get(self.i).copied().flatten())
            }
            Picked::Indexed(index) => index.get(key),
        }
    }
}

/// A field's value; absent and malformed are told apart.
pub(crate) fn get<'a>(
    doc: impl Fields<'a>,
    key: &str,
) -> Result<Option<RawBsonRef<'a>>, CommandError> {
    doc.lookup(key).map_err(|_| CommandError::Malformed)
}

/// A document field; wrong type is an error.
pub(crate) fn get_doc<'a>(
    doc: impl Fields<'a>,
    key: &'static str,
    command: &'static str,
) -> Result<Option<&'a RawDocument>, CommandError> {
    match get(doc, key)? {
        None => Ok(None),
        Some(RawBsonRef::Document(d)) => Ok(Some(d)),
        Some(_) => Err(CommandError::BadField {
            command,
            field: key,
        }),
    }
}

/// An array field; wrong type is an error.
pub(crate) fn get_array<'a>(
    doc: impl Fields<'a>,
    key: &'static str,
    command: &'static str,
) -> Result<Option<&'a RawArray>, CommandError> {
    match get(doc, key)? {
        None => Ok(None),
        Some(RawBsonRef::Array(a)) => Ok(Some(a)),
        Some(_) => Err(CommandError::BadField {
            command,
            field: key,
        }),
    }
}

/// A string field; wrong type is an error.
pub(crate) fn get_str<'a>(
    doc: impl Fields<'a>,
    key: &'static str,
    command: &'static str,
) -> Result<Option<&'a str>, CommandError> {
    match get(doc, key)? {
        None => Ok(None),
        Some(RawBsonRef::String(s)) => Ok(Some(s)),
        Some(_) => Err(CommandError::BadField {
            command,
            field: key,
        }),
    }
}

/// mongod's boolean coercion for flags such as `multi`, `upsert`, `j`: bool, or any number
/// (non-zero is true); null/undefined are false. Other types are an error.
pub fn truthy(v: RawBsonRef<'_>) -> Option<bool> {
    match v {
        RawBsonRef::Boolean(b) => Some(b),
        RawBsonRef::Int32(i) => Some(i != 0),
        RawBsonRef::Int64(i) => Some(i != 0),
        RawBsonRef::Double(d) => Some(d != 0.0),
        RawBsonRef::Decimal128(d) => Some(!decimal_is_zero(d.bytes())),
        RawBsonRef::Null | RawBsonRef::Undefined => Some(false),
        _ => None,
    }
}

/// A boolean flag, default false when absent.
pub(crate) fn flag<'a>(
    doc: impl Fields<'a>,
    key: &'static str,
    command: &'static str,
) -> Result<bool, CommandError> {
    match get(doc, key)? {
        None => Ok(false),
        Some(v) => truthy(v).ok_or(CommandError::BadField {
            command,
            field: key,
        }),
    }
}

/// A number of any BSON numeric type, as f64, the way mongod's `BSONElement::numberDouble`
/// reads it: a Decimal128 is rounded to the nearest double (`Decimal128::toDouble`), so
/// `limit: NumberDecimal("1.000")` is 1 and `expireAfterSeconds: NumberDecimal("30")` is 30.
pub fn number(v: RawBsonRef<'_>) -> Option<f64> {
    match v {
        RawBsonRef::Int32(i) => Some(f64::from(i)),
        RawBsonRef::Int64(i) => Some(i as f64),
        RawBsonRef::Double(d) => Some(d),
        RawBsonRef::Decimal128(d) => Some(decimal_to_f64(d.bytes())),
        _ => None,
    }
}

/// The two 64-bit halves of a Decimal128 (little-endian in BSON): (high, low).
fn halves(bytes: [u8; 16]) -> (u64, u64) {
    let [l0, l1, l2, l3, l4, l5, l6, l7, h0, h1, h2, h3, h4, h5, h6, h7] = bytes;
    (
        u64::from_le_bytes([h0, h1, h2, h3, h4, h5, h6, h7]),
        u64::from_le_bytes([l0, l1, l2, l3, l4, l5, l6, l7]),
    )
}

/// The largest canonical Decimal128 coefficient, 10^34 - 1: a larger one is non-canonical
/// and reads as zero (IEEE 754-2008, BID encoding).
const MAX_COEFFICIENT: u128 = 9_999_999_999_999_999_999_999_999_999_999_999;

/// Exponent bias of Decimal128.
const EXPONENT_BIAS: i32 = 6176;

/// What a Decimal128 (BID encoding) holds.
enum Decimal {
    /// Infinity of either sign, or NaN (`f64` carries both).
    Special(f64),
    /// (negative, coefficient, unbiased exponent); a non-canonical coefficient is zero.
    Finite(bool, u128, i32),
}

fn decode(bytes: [u8; 16]) -> Decimal {
    let (high, low) = halves(bytes);
    let negative = high >> 63 == 1;
    if (high >> 61) & 0b11 == 0b11 {
        return match (high >> 58) & 0b11111 {
            0b11110 if negative => Decimal::Special(f64::NEG_INFINITY),
            0b11110 => Decimal::Special(f64::INFINITY),
            0b11111 => Decimal::Special(f64::NAN),
            // "11" combination: the coefficient is at least 2^113, never canonical: zero.
            _ => Decimal::Finite(negative, 0, 0),
        };
    }
    let exponent = ((high >> 49) & 0x3FFF) as i32 - EXPONENT_BIAS;
    let coefficient = (u128::from(high & ((1u64 << 49) - 1)) << 64) | u128::from(low);
    let coefficient = if coefficient > MAX_COEFFICIENT {
        0
    } else {
        coefficient
    };
    Decimal::Finite(negative, coefficient, exponent)
}

/// A Decimal128 as the nearest double: infinities and NaN as such, a non-canonical
/// coefficient as zero, anything else correctly rounded (the decimal string
/// `coefficient`e`exponent` is parsed by the standard library, which rounds to nearest).
fn decimal_to_f64(bytes: [u8; 16]) -> f64 {
    let (negative, coefficient, exponent) = match decode(bytes) {
        Decimal::Special(x) => return x,
        Decimal::Finite(n, c, e) => (n, c, e),
    };
    let signed = |x: f64| if negative { -x } else { x };
    if coefficient == 0 {
        return signed(0.0);
    }
    // At most 34 digits, "e", a sign and 4 digits: a stack buffer, no allocation.
    let mut buf = [0u8; 48];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    if std::io::Write::write_fmt(&mut cursor, format_args!("{coefficient}e{exponent}")).is_err() {
        return f64::NAN;
    }
    let len = usize::try_from(cursor.position()).unwrap_or(0);
    buf.get(..len)
        .and_then(|text| std::str::from_utf8(text).ok())
        .and_then(|text| text.parse::<f64>().ok())
        .map_or(f64::NAN, signed)
}

/// True for a Decimal128 zero of any exponent and sign (a non-canonical coefficient is
/// zero); a tiny non-zero value that rounds to a zero double is not zero (mongod's
/// `trueValue` asks `Decimal128::isZero`).
fn decimal_is_zero(bytes: [u8; 16]) -> bool {
    matches!(decode(bytes), Decimal::Finite(_, 0, _))
}

/// A document field where mongod's IDL parser reads `null` and `undefined` as absent
/// (`IDLParserContext::checkAndAssertType` returns false for them, so the generated parser
/// skips the field: src/mongo/idl/idl_parser.cpp, buildscripts/idl/idl/generator.py
/// `gen_field_deserializer`). Any other type than a document is an error.
pub(crate) fn get_opt_doc<'a>(
    doc: impl Fields<'a>,
    key: &'static str,
    command: &'static str,
) -> Result<Option<&'a RawDocument>, CommandError> {
    match get(doc, key)? {
        None | Some(RawBsonRef::Null | RawBsonRef::Undefined) => Ok(None),
        Some(RawBsonRef::Document(d)) => Ok(Some(d)),
        Some(_) => Err(CommandError::BadField {
            command,
            field: key,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{rawdoc, Decimal128};

    /// What the statement parsers read of a statement through `fields`: each field's value
    /// or the error, in key order.
    fn read_all<const N: usize>(
        fields: [Field<'_, '_, N>; N],
        keys: &[&str; N],
    ) -> Vec<Result<Option<String>, CommandError>> {
        fields
            .iter()
            .zip(keys)
            .map(|(f, k)| get(*f, k).map(|v| v.map(|v| format!("{v:?}"))))
            .collect()
    }

    /// A statement read by the one walk gives what checking its keys and looking each field
    /// up in its index gives (the way every statement was read before), on every corrupted
    /// and cut copy of update and delete statements: the same error, or the same values.
    #[test]
    fn picked_statements_read_as_indexed_ones() {
        const KEYS: [&str; 6] = ["q", "u", "multi", "upsert", "collation", "hint"];
        let statements = [
            rawdoc! {"q": {"status": "A", "n": {"$gt": 1}}, "u": {"$set": {"x": 1}}, "multi": true},
            rawdoc! {"u": [{"$set": {"x": 1}}], "q": {}, "upsert": 1_i32, "hint": "a_1"},
            rawdoc! {"q": {"_id": 1}, "limit": 0_i32, "collation": {"locale": "fr"}, "hint": {"a": 1}},
            rawdoc! {"q": {"a": "é"}, "u": {"b": "ü"}, "multi": bson::Decimal128::from_bytes([0; 16]), "c": null},
        ];
        let mut fast = 0;
        for good in &statements {
            let n = crate::wire::each_readable_variant(good.as_bytes(), |_, doc| {
                let slow = unique_keys(doc).map(|d| Picked::<6>::Indexed(Index::new(d)));
                let picked = Picked::new(doc, &KEYS);
                match (&picked, &slow) {
                    (Err(a), Err(b)) => assert_eq!(a, b),
                    (Ok(p), Ok(s)) => {
                        fast += usize::from(matches!(p, Picked::Read { .. }));
                        assert_eq!(read_all(p.fields(), &KEYS), read_all(s.fields(), &KEYS));
                    }
                    _ => panic!(
                        "picked {:?} against indexed {:?}",
                        picked.is_ok(),
                        slow.is_ok()
                    ),
                }
            });
            assert!(n > 100, "{n} variants");
        }
        // The walk decided most of them itself: the comparison is not of the slow path
        // with itself.
        assert!(fast > 1_000, "{fast} read by the walk");
    }

    #[test]
    fn a_repeated_key_is_refused_as_before() {
        let doc = rawdoc! {"q": {}, "u": {"$set": {"a": 1}}, "q": {"a": 1}};
        assert!(matches!(
            Picked::new(&doc, &["q", "u"]),
            Err(CommandError::DuplicateKey)
        ));
        // And a repeated key that is not one of those read.
        let doc = rawdoc! {"q": {}, "x": 1_i32, "x": 2_i32};
        assert!(matches!(
            Picked::new(&doc, &["q", "u"]),
            Err(CommandError::DuplicateKey)
        ));
    }

    #[test]
    fn truthiness_follows_mongod() {
        assert_eq!(truthy(RawBsonRef::Int32(1)), Some(true));
        assert_eq!(truthy(RawBsonRef::Double(0.0)), Some(false));
        assert_eq!(truthy(RawBsonRef::Int64(0)), Some(false));
        assert_eq!(truthy(RawBsonRef::Null), Some(false));
        assert_eq!(truthy(RawBsonRef::String("yes")), None);
        let zero: Decimal128 = "0".parse().unwrap();
        let neg_zero: Decimal128 = "-0.000".parse().unwrap();
        let one: Decimal128 = "1".parse().unwrap();
        assert_eq!(truthy(RawBsonRef::Decimal128(zero)), Some(false));
        assert_eq!(truthy(RawBsonRef::Decimal128(neg_zero)), Some(false));
        assert_eq!(truthy(RawBsonRef::Decimal128(one)), Some(true));
    }

    fn dec(s: &str) -> f64 {
        number(RawBsonRef::Decimal128(s.parse().unwrap())).unwrap()
    }

    /// mongod reads a Decimal128 where it takes a number through `numberDouble()` (delete
    /// `limit`: src/mongo/db/ops/write_ops.cpp `readMultiDeleteProperty`), which rounds it to
    /// the nearest double: every spelling of one is 1.
    #[test]
    fn decimal128_is_a_number() {
        assert_eq!(dec("1"), 1.0);
        assert_eq!(dec("1.000"), 1.0);
        assert_eq!(dec("1000E-3"), 1.0);
        assert_eq!(dec("0.5"), 0.5);
        assert_eq!(dec("30"), 30.0);
        assert_eq!(dec("-59.9"), -59.9);
        assert_eq!(dec("59.99999999999999999999999999999999"), 60.0);
        assert_eq!(dec("1E+6144"), f64::INFINITY);
        assert_eq!(dec("1E-6176"), 0.0);
        let tiny = RawBsonRef::Decimal128("1E-6176".parse().unwrap());
        assert_eq!(truthy(tiny), Some(true));
        assert_eq!(dec("-0"), 0.0);
        assert_eq!(dec("Infinity"), f64::INFINITY);
        assert_eq!(dec("-Infinity"), f64::NEG_INFINITY);
        assert!(dec("NaN").is_nan());
        assert_eq!(
            dec("9999999999999999999999999999999999E+6111"),
            f64::INFINITY
        );
    }

    #[test]
    fn a_non_canonical_decimal_reads_as_zero() {
        // "11" combination with a coefficient of 2^113 and more.
        let mut bytes = [0u8; 16];
        bytes[15] = 0x60;
        bytes[14] = 0x00;
        let v = RawBsonRef::Decimal128(bson::Decimal128::from_bytes(bytes));
        assert_eq!(number(v), Some(0.0));
        assert_eq!(truthy(v), Some(false));
        // A coefficient past 10^34 - 1 in the ordinary form.
        let mut bytes = [0xFFu8; 16];
        bytes[15] = 0x30;
        bytes[14] = 0x41;
        let v = RawBsonRef::Decimal128(bson::Decimal128::from_bytes(bytes));
        assert_eq!(number(v), Some(0.0));
    }

    #[test]
    fn null_and_undefined_are_absent_where_mongod_reads_them_so() {
        let d = bson::rawdoc! {"n": null, "u": bson::RawBson::Undefined, "d": {"a": 1}, "s": "x"};
        assert!(get_opt_doc(&*d, "n", "t").unwrap().is_none());
        assert!(get_opt_doc(&*d, "u", "t").unwrap().is_none());
        assert!(get_opt_doc(&*d, "missing", "t").unwrap().is_none());
        assert!(get_opt_doc(&*d, "d", "t").unwrap().is_some());
        assert!(get_opt_doc(&*d, "s", "t").is_err());
    }
}
