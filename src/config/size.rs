//! Byte sizes in configuration files: `"100MB"`, `"512KiB"`, `"1GB"`, `"4096"` (bytes).
//!
//! Decimal units are powers of 1000 (`KB`, `MB`, `GB`), binary units powers of 1024 (`KiB`,
//! `MiB`, `GiB`); `B` or no unit means bytes. Units are case-insensitive, spaces between the
//! number and the unit are allowed. TOML integers are taken as bytes.

use serde::{de, Deserializer};

/// Parses a size; `Err` says what is wrong.
pub fn parse(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "invalid size {text:?}: expected a number of bytes with an optional unit \
             (B, KB, MB, GB, KiB, MiB, GiB), e.g. \"100MB\""
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {text:?}: number too large"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => {
            return Err(format!(
                "invalid size {text:?}: unknown unit {other:?} (B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("invalid size {text:?}: too large"))
}

/// Serde helper: a size string, or an integer number of bytes.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct V;
    impl de::Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a size such as \"100MB\" or an integer number of bytes")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse(v).map_err(E::custom)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("invalid size {v}: negative")))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
    }
    d.deserialize_any(V)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn units() {
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("12B"), Ok(12));
        assert_eq!(parse("100MB"), Ok(100_000_000));
        assert_eq!(parse("100 mb"), Ok(100_000_000));
        assert_eq!(parse("2KB"), Ok(2_000));
        assert_eq!(parse("1GB"), Ok(1_000_000_000));
        assert_eq!(parse("512KiB"), Ok(512 * 1024));
        assert_eq!(parse("100MiB"), Ok(100 * 1024 * 1024));
        assert_eq!(parse("2GiB"), Ok(2 << 30));
    }

    #[test]
    fn errors() {
        for bad in [
            "",
            "MB",
            "-1MB",
            "1.5MB",
            "10TB",
            "10 parsecs",
            "99999999999999999999",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse("18446744073709551615GB").is_err());
        assert!(parse("10TB").unwrap_err().contains("unknown unit"));
    }
}
