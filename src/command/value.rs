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
    use bson::Decimal128;

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
