//! Reading command fields the way mongod does: numbers of any BSON type for booleans and
//! limits, and errors (never guesses) for anything else.

use bson::{RawArray, RawBsonRef, RawDocument};

use super::error::CommandError;

/// Refuses a sub-document with a repeated key. The guard reads the first value of a key;
/// a server may read the last: such a document must never be judged (fail closed).
pub(crate) fn unique_keys(doc: &RawDocument) -> Result<&RawDocument, CommandError> {
    crate::wire::check_duplicate_keys(doc).map_err(|e| match e {
        crate::wire::WireError::DuplicateKey(_) => CommandError::DuplicateKey,
        _ => CommandError::Malformed,
    })?;
    Ok(doc)
}

/// A field's value; absent and malformed are told apart.
pub(crate) fn get<'a>(
    doc: &'a RawDocument,
    key: &str,
) -> Result<Option<RawBsonRef<'a>>, CommandError> {
    doc.get(key).map_err(|_| CommandError::Malformed)
}

/// A document field; wrong type is an error.
pub(crate) fn get_doc<'a>(
    doc: &'a RawDocument,
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
    doc: &'a RawDocument,
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
    doc: &'a RawDocument,
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
pub(crate) fn flag(
    doc: &RawDocument,
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

/// A number of any BSON numeric type, as f64.
pub fn number(v: RawBsonRef<'_>) -> Option<f64> {
    match v {
        RawBsonRef::Int32(i) => Some(f64::from(i)),
        RawBsonRef::Int64(i) => Some(i as f64),
        RawBsonRef::Double(d) => Some(d),
        RawBsonRef::Decimal128(d) => Some(if decimal_is_zero(d.bytes()) {
            0.0
        } else {
            f64::NAN
        }),
        _ => None,
    }
}

/// True for a Decimal128 zero of any exponent and sign: the 113-bit coefficient is zero
/// (BID encoding, "11" combination prefix means coefficient >= 2^113 which is non-canonical
/// and treated as zero by the spec).
fn decimal_is_zero(bytes: [u8; 16]) -> bool {
    let high = u64::from_le_bytes([
        bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15],
    ]);
    let low = u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ]);
    if (high >> 61) & 0b11 == 0b11 {
        // Either infinity/NaN (not zero) or a non-canonical coefficient (zero).
        return (high >> 58) & 0b11111 != 0b11110 && (high >> 58) & 0b11111 != 0b11111;
    }
    high & ((1u64 << 49) - 1) == 0 && low == 0
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
}
