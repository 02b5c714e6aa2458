//! Client-controlled text turned into a bounded label set: the first `cap` distinct values
//! are kept, every later one becomes "other".

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, PoisonError},
};

/// The label for values beyond the cap.
pub const OTHER: &str = "other";
/// The label for a connection whose handshake named no application (or driver).
pub const NONE: &str = "-";

/// A capped set of label values (first come, first kept).
#[derive(Debug)]
pub struct CappedLabels {
    cap: usize,
    seen: Mutex<HashSet<Arc<str>>>,
}

impl CappedLabels {
    /// Keeps at most `cap` distinct values.
    pub fn new(cap: usize) -> Self {
        CappedLabels {
            cap,
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// The label for `value`: itself while the cap allows, else "other"; no value is "-".
    pub fn label(&self, value: Option<&str>) -> Arc<str> {
        let value = match value {
            None | Some("") => NONE,
            Some(v) => v,
        };
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = seen.get(value) {
            return v.clone();
        }
        if value == OTHER || seen.len() >= self.cap {
            return Arc::from(OTHER);
        }
        let v: Arc<str> = Arc::from(value);
        seen.insert(v.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_come_then_other() {
        let l = CappedLabels::new(2);
        assert_eq!(&*l.label(Some("a")), "a");
        assert_eq!(&*l.label(None), "-");
        assert_eq!(&*l.label(Some("b")), "other");
        assert_eq!(&*l.label(Some("a")), "a");
        assert_eq!(&*l.label(Some("")), "-");
    }
}
