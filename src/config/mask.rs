//! What `--check-config` prints instead of a secret.

/// The mask.
pub const MASK: &str = "***";

/// A secret that may be absent: `"***"` when set (absent stays absent).
pub fn secret<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_str(MASK),
        None => s.serialize_none(),
    }
}
