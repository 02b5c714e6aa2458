//! Small helpers over borrowed BSON documents.

use std::collections::HashSet;

use bson::RawDocument;

use super::error::WireError;

/// How many keys are compared pairwise on the stack before switching to a hash set.
const INLINE_KEYS: usize = 32;

/// Refuses a document that carries any top-level key twice. mongod and a guard could read
/// different values of a repeated key (`$db`, the command name, `writeConcern`...), so such
/// a command is never forwarded. Allocation-free for documents of up to 32 keys.
pub fn check_duplicate_keys(doc: &RawDocument) -> Result<(), WireError> {
    // The common case, without the bson crate building every element (see bson_scan).
    match super::bson_scan::keys_distinct::<INLINE_KEYS>(doc) {
        Some(Ok(())) => Ok(()),
        Some(Err(key)) => Err(WireError::DuplicateKey(crate::text::client(key))),
        None => check_duplicate_keys_iter(doc),
    }
}

/// [`check_duplicate_keys`] through the bson crate's iteration: any document.
fn check_duplicate_keys_iter(doc: &RawDocument) -> Result<(), WireError> {
    let mut inline: [&str; INLINE_KEYS] = [""; INLINE_KEYS];
    let mut count = 0usize;
    let mut spill: Option<HashSet<&str>> = None;
    for elem in doc.iter_elements() {
        let elem = elem.map_err(|e| WireError::bad_doc("command", e))?;
        let key = elem.key().as_str();
        if let Some(set) = spill.as_mut() {
            if !set.insert(key) {
                return Err(WireError::DuplicateKey(crate::text::client(key)));
            }
            continue;
        }
        if inline.iter().take(count).any(|k| *k == key) {
            return Err(WireError::DuplicateKey(crate::text::client(key)));
        }
        if let Some(slot) = inline.get_mut(count) {
            *slot = key;
            count += 1;
        } else {
            let mut set: HashSet<&str> = inline.iter().copied().collect();
            set.insert(key);
            spill = Some(set);
        }
    }
    Ok(())
}

/// The first key of a document: the command name of a command body.
pub fn first_key(doc: &RawDocument) -> Option<&str> {
    if let Some(k) = super::bson_scan::first_key(doc) {
        return k;
    }
    doc.iter_elements()
        .next()
        .and_then(|e| e.ok())
        .map(|e| e.key().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{rawdoc, RawDocumentBuf};

    fn with_keys(keys: &[&str]) -> RawDocumentBuf {
        // rawdoc! cannot repeat a key, so build the bytes by hand.
        let mut body = Vec::new();
        for k in keys {
            body.push(0x10); // int32
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(&1i32.to_le_bytes());
        }
        let mut doc = ((body.len() + 5) as i32).to_le_bytes().to_vec();
        doc.extend_from_slice(&body);
        doc.push(0);
        RawDocumentBuf::from_bytes(doc).unwrap()
    }

    /// The fast path and the bson crate's iteration agree on corrupted documents: both pass,
    /// or both fail with the same error.
    #[test]
    fn fast_path_agrees_with_the_iteration() {
        let good = bson::rawdoc! {"find": "c", "filter": {"a": 1}, "k1": 1, "k2": "x", "$db": "d"}
            .into_bytes();
        let mut dup = with_keys(&["find", "$db", "x", "$db"]).into_bytes();
        let mut checked = 0;
        for base in [good, std::mem::take(&mut dup)] {
            for i in 4..base.len() {
                for v in [0u8, 1, 2, 3, 0x10, 0x24, 0x64, 0x80, 0xff] {
                    let mut b = base.clone();
                    b[i] = v;
                    let Ok(doc) = RawDocument::from_bytes(&b) else {
                        continue;
                    };
                    let fast = check_duplicate_keys(doc);
                    let slow = check_duplicate_keys_iter(doc);
                    match (&fast, &slow) {
                        (Err(WireError::DuplicateKey(a)), Err(WireError::DuplicateKey(b))) => {
                            assert_eq!(a, b)
                        }
                        (Ok(()), Ok(())) | (Err(_), Err(_)) => {}
                        _ => panic!("{b:?}: {fast:?} vs {slow:?}"),
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 300, "{checked}");
    }

    #[test]
    fn detects_duplicates_inline_and_spilled() {
        assert!(check_duplicate_keys(&with_keys(&["a", "b", "c"])).is_ok());
        assert_eq!(
            check_duplicate_keys(&with_keys(&["find", "$db", "$db"])),
            Err(WireError::DuplicateKey("$db".into()))
        );
        let many: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
        let mut refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(check_duplicate_keys(&with_keys(&refs)).is_ok());
        refs.push("k3");
        assert_eq!(
            check_duplicate_keys(&with_keys(&refs)),
            Err(WireError::DuplicateKey("k3".into()))
        );
        refs.pop();
        refs.push("k90");
        assert!(check_duplicate_keys(&with_keys(&refs)).is_err());
    }

    #[test]
    fn first_key_is_command_name() {
        assert_eq!(first_key(&rawdoc! {"find": "c", "$db": "d"}), Some("find"));
        assert_eq!(first_key(&rawdoc! {}), None);
    }
}
