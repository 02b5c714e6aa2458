//! A key lookup over a borrowed BSON document that costs what it must.
//!
//! `RawDocument::get` walks the document from its start through `RawIter`, which checks every
//! key it passes as UTF-8 and builds each element; a command is looked up a dozen times per
//! request (the command name, `$db`, `writeConcern`, the filter, `ok` and `cursor` of the
//! reply...), so that walk was the largest part of mongoguard's own CPU per request
//! (docs/performance.md). [`get`] walks the same bytes comparing key bytes, checks a key it
//! passes as UTF-8 only when it is not ASCII, and builds only the value it returns.
//!
//! It answers exactly what `RawDocument::get` answers. Whatever it does not handle itself —
//! a malformed document, a non-UTF-8 key, a value type other than the common ones below — it
//! hands to `RawDocument::get`, which then gives its own answer (the value or the error).
//! `tests::agrees_with_the_bson_crate` checks this on generated and corrupted documents.

use bson::{RawBsonRef, RawDocument};

/// The length of the value of element type `tag` that starts at `v`; `None` when it does not
/// fit or the type is not one this scan skips (then the caller falls back).
fn value_len(tag: u8, v: &[u8]) -> Option<usize> {
    let i32_at = |b: &[u8]| -> Option<usize> {
        let n = i32::from_le_bytes(b.get(..4)?.try_into().ok()?);
        usize::try_from(n).ok()
    };
    let len = match tag {
        0x01 | 0x09 | 0x11 | 0x12 => 8, // double, datetime, timestamp, int64
        0x02 | 0x0D | 0x0E => 4 + i32_at(v)?, // string, code, symbol
        0x03 | 0x04 => i32_at(v)?,      // document, array
        0x05 => 4 + 1 + i32_at(v)?,     // binary
        0x06 | 0x0A | 0x7F | 0xFF => 0, // undefined, null, maxkey, minkey
        0x07 => 12,                     // ObjectId
        0x08 => 1,                      // bool
        0x10 => 4,                      // int32
        0x13 => 16,                     // decimal128
        _ => return None,               // regex, dbpointer, code with scope, unknown
    };
    if len > v.len() {
        return None;
    }
    // A string-like value is checked for its terminating NUL even when only crossed, as
    // the bson crate's walk does.
    if matches!(tag, 0x02 | 0x0D | 0x0E) && (len < 5 || v.get(len - 1) != Some(&0)) {
        return None;
    }
    // So is an embedded document's or array's length and terminator.
    if matches!(tag, 0x03 | 0x04) && (len < 5 || v.get(len - 1) != Some(&0)) {
        return None;
    }
    Some(len)
}

/// The value of an element the fast path builds itself; `None` for anything else.
fn decode(tag: u8, v: &[u8]) -> Option<RawBsonRef<'_>> {
    Some(match tag {
        0x01 => RawBsonRef::Double(f64::from_le_bytes(v.try_into().ok()?)),
        0x02 => {
            // int32 length (counting the NUL), the bytes, NUL.
            let (nul, body) = v.get(4..)?.split_last()?;
            if *nul != 0 || v.len() < 5 {
                return None;
            }
            RawBsonRef::String(std::str::from_utf8(body).ok()?)
        }
        0x03 => RawBsonRef::Document(RawDocument::from_bytes(v).ok()?),
        0x08 => match v {
            [0] => RawBsonRef::Boolean(false),
            [1] => RawBsonRef::Boolean(true),
            _ => return None,
        },
        0x0A => RawBsonRef::Null,
        0x10 => RawBsonRef::Int32(i32::from_le_bytes(v.try_into().ok()?)),
        0x12 => RawBsonRef::Int64(i64::from_le_bytes(v.try_into().ok()?)),
        _ => return None,
    })
}

/// Where the fast walk ended.
enum Found<'a> {
    Value(RawBsonRef<'a>),
    Absent,
    /// Not decided here: ask the bson crate.
    Defer,
}

/// One element met by [`walk`]: its type, key bytes and value bytes.
struct Element<'a> {
    tag: u8,
    key: &'a [u8],
    value: &'a [u8],
}

/// Walks the elements of `doc` in order, checking what the bson crate's iteration checks
/// (each value's length, string and document terminators; a key that is not ASCII is checked
/// as UTF-8), until `visit` says stop (`Some`). `Err(())`: something the walk does not decide
/// (malformed, or a type it does not skip): the caller asks the bson crate.
fn walk<'a, T>(
    doc: &'a RawDocument,
    mut visit: impl FnMut(Element<'a>) -> Option<T>,
) -> Result<Option<T>, ()> {
    let bytes = doc.as_bytes();
    // A RawDocument is at least 5 bytes with its length prefix checked.
    let end = bytes.len() - 1;
    let mut at = 4;
    while at < end {
        let tag = *bytes.get(at).ok_or(())?;
        let rest = bytes.get(at + 1..end).ok_or(())?;
        // The key's terminator and whether the key is ASCII, in one pass over its bytes.
        let (mut nul, mut high) = (0usize, 0u8);
        loop {
            match *rest.get(nul).ok_or(())? {
                0 => break,
                b => high |= b,
            }
            nul += 1;
        }
        let (key, v) = (rest.get(..nul).ok_or(())?, rest.get(nul + 1..).ok_or(())?);
        let len = value_len(tag, v).ok_or(())?;
        if high >= 0x80 && std::str::from_utf8(key).is_err() {
            return Err(());
        }
        if let Some(t) = visit(Element {
            tag,
            key,
            value: v.get(..len).ok_or(())?,
        }) {
            return Ok(Some(t));
        }
        at += 1 + nul + 1 + len;
    }
    if at == end && bytes.get(end) == Some(&0) {
        Ok(None)
    } else {
        Err(())
    }
}

fn scan<'a>(doc: &'a RawDocument, key: &str) -> Found<'a> {
    let want = key.as_bytes();
    let found = walk(doc, |e| {
        (e.key == want).then(|| match decode(e.tag, e.value) {
            Some(value) => Found::Value(value),
            None => Found::Defer,
        })
    });
    match found {
        Ok(Some(f)) => f,
        Ok(None) => Found::Absent,
        Err(()) => Found::Defer,
    }
}

/// The values of `keys` in `doc`, read by one walk that also finds the keys distinct: what
/// `check_duplicate_keys` followed by `doc.get(key)` for each key answers, when that is
/// `Ok` and every value is one [`decode`] builds. `None`: not decided here (malformed, a
/// repeated key, more than [`PICK_KEYS`] keys, a key or value type the walk does not take);
/// the caller asks the slow way.
pub(crate) fn pick<'a, const N: usize>(
    doc: &'a RawDocument,
    keys: &[&str; N],
) -> Option<[Option<RawBsonRef<'a>>; N]> {
    let mut seen = SeenKeys::<PICK_KEYS>::new();
    let mut found = [None; N];
    let stopped = walk(doc, |e| {
        if seen.first_time(e.key) != Some(true) {
            return Some(());
        }
        // Not a key asked for: walk on (`None`).
        let slot = keys
            .iter()
            .position(|k| same_key(k.as_bytes(), e.key))
            .and_then(|i| found.get_mut(i))?;
        match decode(e.tag, e.value) {
            Some(v) => {
                *slot = Some(v);
                None
            }
            None => Some(()),
        }
    });
    matches!(stopped, Ok(None)).then_some(found)
}

/// `a == b` for the short keys of a command, without a call to `memcmp`.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// How many keys a document [`pick`] decides may have.
const PICK_KEYS: usize = 16;

/// The first key of `doc` when the walk decides it (`None`: ask the bson crate).
pub(crate) fn first_key(doc: &RawDocument) -> Option<Option<&str>> {
    match walk(doc, |e| Some(e.key)) {
        // Keys met by the walk are valid UTF-8.
        Ok(Some(k)) => std::str::from_utf8(k).ok().map(Some),
        Ok(None) => Some(None),
        Err(()) => None,
    }
}

/// The keys a walk has met, up to `N` of them.
struct SeenKeys<'a, const N: usize> {
    keys: [&'a [u8]; N],
    count: usize,
}

impl<'a, const N: usize> SeenKeys<'a, N> {
    fn new() -> Self {
        SeenKeys {
            keys: [&[]; N],
            count: 0,
        }
    }

    /// `Some(true)`: `key` is new (and now seen); `Some(false)`: met before; `None`: more
    /// than `N` keys (not decided).
    fn first_time(&mut self, key: &'a [u8]) -> Option<bool> {
        if self.keys.iter().take(self.count).any(|k| *k == key) {
            return Some(false);
        }
        *self.keys.get_mut(self.count)? = key;
        self.count += 1;
        Some(true)
    }
}

/// Whether every top-level key of `doc` is distinct, for a document of at most `N` keys
/// that the walk decides; `None` otherwise (then the caller uses the bson crate's iteration).
pub(crate) fn keys_distinct<const N: usize>(doc: &RawDocument) -> Option<Result<(), &str>> {
    let mut seen = SeenKeys::<N>::new();
    // Stops with `Some(key)` at a repeated key, `None` when there are too many to tell.
    let stopped = walk(doc, |e| match seen.first_time(e.key) {
        Some(true) => None,
        Some(false) => Some(Some(e.key)),
        None => Some(None),
    })
    .ok()?;
    Some(match stopped {
        None => Ok(()),
        // Keys met by the walk are valid UTF-8.
        Some(Some(k)) => Err(std::str::from_utf8(k).ok()?),
        Some(None) => return None,
    })
}

/// `doc.get(key)`, the same answer at a fraction of the cost (see the module docs).
pub(crate) fn get<'a>(
    doc: &'a RawDocument,
    key: &str,
) -> bson::error::Result<Option<RawBsonRef<'a>>> {
    match scan(doc, key) {
        Found::Value(v) => Ok(Some(v)),
        Found::Absent => Ok(None),
        Found::Defer => doc.get(key),
    }
}

/// Walks the elements of `doc` as [`walk`] does, handing `visit` each element's type and
/// value bytes (an embedded document's or array's bytes are a document: length, elements,
/// terminator, checked as the bson crate checks them). `Err(())`: something the walk does not
/// decide (a type it does not skip, or malformed bytes); the caller asks the bson crate.
pub(crate) fn walk_values<'a, T>(
    doc: &'a RawDocument,
    mut visit: impl FnMut(u8, &'a [u8]) -> Option<T>,
) -> Result<Option<T>, ()> {
    walk(doc, |e| visit(e.tag, e.value))
}

/// Walks the elements of `doc` as [`walk`] does, handing `visit` each element's key bytes
/// (valid UTF-8: an ASCII key, or one the walk checked), type and value bytes. `Err(())`:
/// something the walk does not decide; the caller asks the bson crate. A caller that acts on
/// elements before the walk has decided the whole document must be able to undo that (or
/// check the document first: [`elements_valid`]).
pub(crate) fn walk_keyed<'a, T>(
    doc: &'a RawDocument,
    mut visit: impl FnMut(&'a [u8], u8, &'a [u8]) -> Option<T>,
) -> Result<Option<T>, ()> {
    walk(doc, |e| visit(e.key, e.tag, e.value))
}

/// True when every top-level element of `doc` is one the bson crate's iteration accepts and
/// whose value it builds without error (what `Reader::document` requires of a message's
/// documents), decided by one walk: lengths and terminators as the walk checks them, string
/// values as UTF-8, booleans 0 or 1. `false` means "not decided here" (a type it does not
/// check, such as binary or regex, or something malformed): the caller then asks the bson
/// crate, which gives the verdict and the error. `tests::valid_elements_only_when_the_bson_crate_agrees`.
pub(crate) fn elements_valid(doc: &RawDocument) -> bool {
    matches!(walk(doc, |e| (!element_valid(&e)).then_some(())), Ok(None))
}

/// [`elements_valid`] and, in the same walk, [`keys_distinct`] for a document of at most
/// [`INDEX_CAP`] keys: `true` when both hold. `false` decides nothing (ask them apart).
pub(crate) fn elements_valid_and_distinct(doc: &RawDocument) -> bool {
    let mut seen = SeenKeys::<INDEX_CAP>::new();
    let stopped = walk(doc, |e| {
        (!element_valid(&e) || seen.first_time(e.key) != Some(true)).then_some(())
    });
    matches!(stopped, Ok(None))
}

/// One element of [`elements_valid`].
fn element_valid(e: &Element<'_>) -> bool {
    value_valid(e.tag, e.value)
}

/// Whether the bson crate builds the value of an element of type `tag` whose value bytes,
/// as [`walk_keyed`] hands them, are `value` without error (the check of [`elements_valid`]
/// for one element). `false`: not decided here.
pub(crate) fn value_valid(tag: u8, value: &[u8]) -> bool {
    match tag {
        // Fixed sizes the walk checked; null, undefined, min and max key have no value.
        0x01 | 0x06 | 0x07 | 0x09 | 0x0A | 0x10 | 0x11 | 0x12 | 0x13 | 0x7F | 0xFF => true,
        // Length prefix and terminator checked by the walk; the bytes between must be UTF-8.
        0x02 | 0x0D | 0x0E => match value.get(4..value.len().saturating_sub(1)) {
            Some(text) => text.is_ascii() || std::str::from_utf8(text).is_ok(),
            None => false,
        },
        // Length prefix and terminator checked by the walk: what `from_bytes` checks.
        0x03 | 0x04 => true,
        0x08 => matches!(value, [0] | [1]),
        _ => false,
    }
}

/// How many top-level elements an [`Index`] records; lookups of later keys walk as [`get`] does.
const INDEX_CAP: usize = 16;

/// [`Index::key_lens`] of a key of this length or longer (compared the long way).
const LONG_KEY: u8 = u8::MAX;

/// Whether an [`Index`] decided the whole document.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coverage {
    /// Every element is recorded: a key not among them is absent.
    Complete,
    /// The first [`INDEX_CAP`] elements are recorded; there are more.
    Partial,
    /// The walk did not decide the document: every lookup asks [`get`].
    Undecided,
}

/// What an [`Index`] knows of a key.
enum Located<'a> {
    /// The first element with that key: its type byte and value bytes.
    Element(u8, &'a [u8]),
    /// No element has that key.
    Absent,
    /// Not decided here: ask the walk from the start ([`get`]).
    Ask,
}

/// Where the top-level elements of a document start, found by one walk, so that the dozen
/// lookups a request makes of its command (`$db`, the collection, `filter`, `let`,
/// `writeConcern`, `lsid`...) compare a key at each element instead of walking the document
/// again. [`Index::get`] answers exactly what [`get`] (and so `RawDocument::get`) answers:
/// whatever it does not decide itself it hands to them (`tests::index_agrees_with_the_bson_crate`).
#[derive(Clone, Copy)]
pub(crate) struct Index<'a> {
    doc: &'a RawDocument,
    /// Offset of each recorded element's type byte; element `i` ends where `i + 1` starts.
    starts: [u32; INDEX_CAP],
    /// Length of each recorded element's key, [`LONG_KEY`] for a key that long or longer: a
    /// lookup compares key bytes only where the length is the wanted key's.
    key_lens: [u8; INDEX_CAP],
    /// Where the last recorded element ends.
    end_of_last: u32,
    len: u8,
    coverage: Coverage,
}

impl<'a> Index<'a> {
    /// Walks `doc` once (and no further than its first [`INDEX_CAP`] elements and the one after).
    pub(crate) fn new(doc: &'a RawDocument) -> Index<'a> {
        let base = doc.as_bytes().as_ptr() as usize;
        let mut starts = [0u32; INDEX_CAP];
        let mut key_lens = [0u8; INDEX_CAP];
        let mut len = 0usize;
        let mut end_of_last = 0u32;
        let mut fits = true;
        let walked = walk(doc, |e| {
            let Some(slot) = starts.get_mut(len) else {
                return Some(());
            };
            // An element starts one byte (its type) before its key; offsets are within `doc`.
            let start = (e.key.as_ptr() as usize).wrapping_sub(base).wrapping_sub(1);
            let end = (e.value.as_ptr() as usize).wrapping_sub(base) + e.value.len();
            let key_len = u8::try_from(e.key.len()).unwrap_or(LONG_KEY);
            match (u32::try_from(start), u32::try_from(end)) {
                (Ok(s), Ok(e)) => {
                    *slot = s;
                    if let Some(k) = key_lens.get_mut(len) {
                        *k = key_len;
                    }
                    end_of_last = e;
                    len += 1;
                    None
                }
                _ => {
                    fits = false;
                    Some(())
                }
            }
        });
        let coverage = match walked {
            Ok(None) if fits => Coverage::Complete,
            Ok(Some(())) if fits => Coverage::Partial,
            _ => Coverage::Undecided,
        };
        Index {
            doc,
            starts,
            key_lens,
            end_of_last,
            len: u8::try_from(len).unwrap_or(0),
            coverage,
        }
    }

    /// The indexed document.
    pub(crate) fn doc(&self) -> &'a RawDocument {
        self.doc
    }

    /// `self.doc().get(key)`, comparing `key` at each recorded element of its length.
    pub(crate) fn get(&self, key: &str) -> bson::error::Result<Option<RawBsonRef<'a>>> {
        match self.find(key) {
            Located::Element(tag, value) => match decode(tag, value) {
                Some(v) => Ok(Some(v)),
                None => self.doc.get(key),
            },
            Located::Absent => Ok(None),
            Located::Ask => get(self.doc, key),
        }
    }

    /// The array at `key`, as the document an array's bytes are (its elements named "0",
    /// "1"...): what `self.doc().get(key)` gives as `RawBsonRef::Array`, without the bson
    /// crate's walk from the start of the document (the only safe way to a `&RawArray`).
    /// `Some(None)`: `key` is absent. `None`: not decided here (the value is not an array, or
    /// the index does not know): ask [`Index::get`].
    pub(crate) fn array_document(&self, key: &str) -> Option<Option<&'a RawDocument>> {
        match self.find(key) {
            Located::Element(0x04, value) => RawDocument::from_bytes(value).ok().map(Some),
            Located::Absent => Some(None),
            Located::Element(..) | Located::Ask => None,
        }
    }

    /// Where `key`'s element is, as far as the index decides it.
    fn find(&self, key: &str) -> Located<'a> {
        let want = key.as_bytes();
        if self.coverage == Coverage::Undecided {
            return Located::Ask;
        }
        let bytes = self.doc.as_bytes();
        let len = usize::from(self.len);
        let want_len = u8::try_from(want.len()).unwrap_or(LONG_KEY);
        let key_lens = self.key_lens.get(..len).unwrap_or_default();
        for (i, &key_len) in key_lens.iter().enumerate() {
            // Most keys are ruled out by their length alone.
            if key_len != want_len {
                continue;
            }
            let Some(&start) = self.starts.get(i) else {
                break;
            };
            let start = start as usize;
            let key_at = start + 1;
            let terminator = key_at + want.len();
            let value_at = terminator + 1;
            if bytes.get(key_at..terminator) != Some(want) {
                continue;
            }
            // Of the same length, the recorded key (NUL-free) equals `want`, so `want` holds
            // no NUL either. A long key's length is not recorded whole: the key must end
            // where `want` does, and a `want` holding NUL "matched" a shorter key and the
            // bytes after it (no BSON key holds NUL, so the walk says absent: checked only
            // here, off the common path).
            if key_len == LONG_KEY {
                if bytes.get(terminator) != Some(&0) {
                    continue;
                }
                if want.contains(&0) {
                    return Located::Ask;
                }
            }
            let end = match self.starts.get(i + 1) {
                Some(&next) if i + 1 < len => next,
                _ => self.end_of_last,
            } as usize;
            return match (bytes.get(start), bytes.get(value_at..end)) {
                (Some(&tag), Some(value)) => Located::Element(tag, value),
                _ => Located::Ask,
            };
        }
        match self.coverage {
            Coverage::Complete => Located::Absent,
            _ => Located::Ask,
        }
    }

    /// The first key of the indexed document: `crate::wire::first_key(self.doc())`, read
    /// off the index when it decided the document.
    pub(crate) fn first_key(&self) -> Option<&'a str> {
        let recorded = match (self.coverage, self.starts.first(), self.key_lens.first()) {
            (Coverage::Undecided, ..) => None,
            // Decided, and nothing recorded: an empty document.
            _ if self.len == 0 => return None,
            (_, Some(&start), Some(&key_len)) if key_len != LONG_KEY => {
                let start = start as usize;
                self.doc
                    .as_bytes()
                    .get(start + 1..start + 1 + usize::from(key_len))
            }
            _ => None,
        };
        // Keys met by the walk are valid UTF-8.
        match recorded.map(std::str::from_utf8) {
            Some(Ok(key)) => Some(key),
            _ => super::bson_util::first_key(self.doc),
        }
    }
}

/// [`get`] as a method of borrowed documents (and, through `Deref`, of owned ones).
pub(crate) trait GetFast {
    /// `self.get(key)`, the same answer at a fraction of the cost.
    fn get_fast(&self, key: &str) -> bson::error::Result<Option<RawBsonRef<'_>>>;
}

impl GetFast for RawDocument {
    fn get_fast(&self, key: &str) -> bson::error::Result<Option<RawBsonRef<'_>>> {
        get(self, key)
    }
}

/// Calls `f` with `good` and each of its [`corruptions`] that still reads as a document
/// (`RawDocument::from_bytes` accepts it), with its bytes; returns how many it called `f` on.
#[cfg(test)]
pub(crate) fn each_readable_variant(good: &[u8], mut f: impl FnMut(&[u8], &RawDocument)) -> usize {
    let mut n = 0;
    for bytes in std::iter::once(good.to_vec()).chain(corruptions(good)) {
        if let Ok(doc) = RawDocument::from_bytes(&bytes) {
            f(&bytes, doc);
            n += 1;
        }
    }
    n
}

/// Every single-byte corruption (a few telling values at each byte after the length prefix)
/// and every truncation (length prefix and terminator fixed up) of the document `good`: what
/// the tests comparing a fast walk with the bson crate run on.
#[cfg(test)]
pub(crate) fn corruptions(good: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    const VALUES: [u8; 11] = [0, 1, 2, 3, 4, 5, 0x10, 0x7f, 0x80, 0xc3, 0xff];
    let changed = (4..good.len()).flat_map(move |i| {
        VALUES.into_iter().map(move |v| {
            let mut b = good.to_vec();
            if let Some(byte) = b.get_mut(i) {
                *byte = v;
            }
            b
        })
    });
    let cut = (5..good.len()).map(move |cut| {
        let mut b = good.get(..cut).unwrap_or_default().to_vec();
        if let Some(last) = b.last_mut() {
            *last = 0;
        }
        let len = i32::try_from(cut).unwrap_or(i32::MAX).to_le_bytes();
        if let Some(prefix) = b.get_mut(..4) {
            prefix.copy_from_slice(&len);
        }
        b
    });
    changed.chain(cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{rawdoc, RawDocumentBuf};

    fn same(
        a: &bson::error::Result<Option<RawBsonRef<'_>>>,
        b: &bson::error::Result<Option<RawBsonRef<'_>>>,
    ) -> bool {
        match (a, b) {
            (Ok(x), Ok(y)) => x == y,
            (Err(_), Err(_)) => true,
            _ => false,
        }
    }

    fn sample() -> RawDocumentBuf {
        rawdoc! {
            "find": "coll", "filter": {"_id": 5, "a": {"$gt": 1.5}}, "limit": 1i64,
            "singleBatch": true, "comment": bson::RawBson::Null, "arr": [1, "x"],
            "oid": bson::oid::ObjectId::from_bytes([7; 12]), "ts": bson::Timestamp { time: 1, increment: 2 },
            "bin": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "re": bson::Regex { pattern: "a.*".to_owned().try_into().unwrap(), options: "i".to_owned().try_into().unwrap() },
            "dec": bson::Decimal128::from_bytes([0; 16]), "dt": bson::DateTime::from_millis(5),
            "ünï": "ok", "$db": "test", "lsid": {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![0; 16] }},
        }
    }

    const KEYS: [&str; 19] = [
        "find",
        "filter",
        "limit",
        "singleBatch",
        "comment",
        "arr",
        "oid",
        "ts",
        "bin",
        "re",
        "dec",
        "dt",
        "ünï",
        "$db",
        "lsid",
        "absent",
        "",
        "fin",
        "finds",
    ];

    #[test]
    fn finds_every_type_as_the_bson_crate_does() {
        let doc = sample();
        for k in KEYS {
            let (ours, theirs) = (get(&doc, k), doc.get(k));
            assert!(same(&ours, &theirs), "{k}: {ours:?} vs {theirs:?}");
        }
        assert_eq!(get(&doc, "find").unwrap(), Some(RawBsonRef::String("coll")));
        assert_eq!(get(&doc, "absent").unwrap(), None);
    }

    /// Corrupted copies of the sample (every single byte set to a few values, and every
    /// truncation with a fixed-up length prefix): the same answer as `RawDocument::get` for
    /// every key, or both an error.
    #[test]
    fn agrees_with_the_bson_crate() {
        let good = sample().into_bytes();
        let mut checked = 0usize;
        let mut try_bytes = |bytes: Vec<u8>| {
            let Ok(doc) = RawDocument::from_bytes(&bytes) else {
                return;
            };
            for k in KEYS {
                let (ours, theirs) = (get(doc, k), doc.get(k));
                assert!(
                    same(&ours, &theirs),
                    "{k} in {bytes:?}: {ours:?} vs {theirs:?}"
                );
                checked += 1;
            }
        };
        for b in corruptions(&good) {
            try_bytes(b);
        }
        assert!(checked > 10_000, "{checked}");
    }

    /// The index gives `RawDocument::get`'s answer for every key of every corrupted or cut
    /// copy of the sample (17 keys: more than the index records), and of each prefix of it
    /// (fewer keys than it records: absent keys are decided by the index alone).
    #[test]
    fn index_agrees_with_the_bson_crate() {
        // The sample holds a regex, which the walk leaves to the bson crate; without it, 14
        // keys (all indexed); with three more, 17 (the last one past the index).
        let mut plain = bson::RawDocumentBuf::new();
        for (k, v) in sample().iter().map(Result::unwrap) {
            if k != "re" {
                plain.append(k, v.to_owned());
            }
        }
        let mut more = plain.clone();
        for k in ["x", "y", "z"] {
            more.append(bson::raw::CString::try_from(k).unwrap(), 1);
        }
        assert_eq!(Index::new(&plain).coverage, Coverage::Complete);
        assert_eq!(Index::new(&more).coverage, Coverage::Partial);
        let keys: Vec<&str> = KEYS
            .iter()
            .copied()
            .chain(["fi\0lter", "$d", "lsid\0", "x", "z"])
            .collect();
        let mut checked = 0usize;
        for good in [sample().into_bytes(), plain.into_bytes(), more.into_bytes()] {
            let mut try_bytes = |bytes: Vec<u8>| {
                let Ok(doc) = RawDocument::from_bytes(&bytes) else {
                    return;
                };
                let index = Index::new(doc);
                assert_eq!(
                    index.first_key(),
                    crate::wire::first_key(doc),
                    "first key of {bytes:?}"
                );
                for k in &keys {
                    let (ours, theirs) = (index.get(k), doc.get(k));
                    assert!(
                        same(&ours, &theirs),
                        "{k:?} in {bytes:?}: {ours:?} vs {theirs:?}"
                    );
                    match (index.array_document(k), &theirs) {
                        (None, _) => {}
                        (Some(None), Ok(None)) => {}
                        (Some(Some(d)), Ok(Some(RawBsonRef::Array(a)))) => {
                            assert_eq!(d.as_bytes(), a.as_bytes(), "{k:?} in {bytes:?}");
                            let ours: Vec<_> = d.into_iter().map(|e| e.map(|(_, v)| v)).collect();
                            let theirs: Vec<_> = a.into_iter().collect();
                            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{k:?}");
                        }
                        (ours, theirs) => panic!("{k:?} in {bytes:?}: {ours:?} vs {theirs:?}"),
                    }
                    checked += 1;
                }
            };
            for b in corruptions(&good) {
                try_bytes(b);
            }
        }
        assert!(checked > 30_000, "{checked}");
    }

    /// `elements_valid` says "valid" only where iterating and building every top-level value
    /// with the bson crate succeeds, on every corrupted or cut copy of a document without the
    /// types it leaves to the crate (so that "valid" is said often) and of the full sample.
    #[test]
    fn valid_elements_only_when_the_bson_crate_agrees() {
        fn crate_ok(doc: &RawDocument) -> bool {
            doc.iter_elements()
                .all(|e| e.is_ok_and(|e| e.value().is_ok()))
        }
        let plain = rawdoc! {
            "insert": "coll", "s": "ünï", "d": {"a": 1}, "a": [1, "x"], "t": true, "f": false,
            "n": bson::RawBson::Null, "i": 5, "l": 6i64, "x": 1.5,
            "oid": bson::oid::ObjectId::from_bytes([7; 12]), "$db": "test",
        };
        let (mut fast, mut checked) = (0usize, 0usize);
        for good in [plain.into_bytes(), sample().into_bytes()] {
            let mut try_bytes = |bytes: Vec<u8>| {
                let Ok(doc) = RawDocument::from_bytes(&bytes) else {
                    return;
                };
                checked += 1;
                if elements_valid(doc) {
                    fast += 1;
                    assert!(crate_ok(doc), "said valid: {bytes:?}");
                }
                if elements_valid_and_distinct(doc) {
                    assert!(crate_ok(doc), "said valid and distinct: {bytes:?}");
                    let keys: Vec<&str> = doc.iter().map(|e| e.unwrap().0.as_str()).collect();
                    let unique: std::collections::HashSet<&str> = keys.iter().copied().collect();
                    assert_eq!(keys.len(), unique.len(), "said distinct: {bytes:?}");
                }
            };
            try_bytes(good.clone());
            for b in corruptions(&good) {
                try_bytes(b);
            }
        }
        assert!(
            checked > 1_000 && fast > 100,
            "{checked} checked, {fast} decided"
        );
        let find = rawdoc! { "find": "c", "filter": {"_id": 1}, "$db": "d" };
        assert!(elements_valid(&find) && elements_valid_and_distinct(&find));
        // A repeated key: valid elements, not distinct.
        let mut dup = find.clone();
        dup.append(bson::cstr!("find"), "other");
        assert!(elements_valid(&dup) && !elements_valid_and_distinct(&dup));
    }

    #[test]
    fn index_covers_what_it_can_and_defers_the_rest() {
        // A regex is a type the walk leaves to the bson crate: every lookup goes there.
        let doc = sample();
        let index = Index::new(&doc);
        assert_eq!(index.coverage, Coverage::Undecided);
        assert_eq!(index.get("lsid").unwrap(), doc.get("lsid").unwrap());
        // More keys than the index records: the first ones are indexed, the rest still found.
        let mut many = bson::RawDocumentBuf::new();
        for i in 0..=INDEX_CAP + 2 {
            many.append(
                bson::raw::CString::try_from(format!("k{i}")).unwrap(),
                i as i32,
            );
        }
        let index = Index::new(&many);
        assert_eq!(index.coverage, Coverage::Partial);
        assert_eq!(usize::from(index.len), INDEX_CAP);
        for i in 0..=INDEX_CAP + 2 {
            assert_eq!(
                index.get(&format!("k{i}")).unwrap(),
                Some(RawBsonRef::Int32(i as i32))
            );
        }
        assert_eq!(index.get("k99").unwrap(), None);
        let small = rawdoc! { "find": "c", "filter": {"_id": 1}, "$db": "d" };
        let index = Index::new(&small);
        assert_eq!(index.coverage, Coverage::Complete);
        assert_eq!(index.get("$db").unwrap(), Some(RawBsonRef::String("d")));
        assert_eq!(index.get("$d").unwrap(), None);
        assert_eq!(index.get("filte").unwrap(), None);
        // Keys of 255 bytes and more are compared to their end (their length is not kept
        // whole), and a wanted key holding NUL never matches a shorter key.
        let long = "k".repeat(300);
        let entries = [
            (&long[..255], 1),
            (&long[..], 2),
            (&long[..256], 3),
            ("k", 4),
        ];
        let mut doc = bson::RawDocumentBuf::new();
        for (k, v) in entries {
            doc.append(bson::raw::CString::try_from(k).unwrap(), v);
        }
        let index = Index::new(&doc);
        assert_eq!(index.coverage, Coverage::Complete);
        assert_eq!(index.first_key(), Some(&long[..255]));
        for (k, v) in entries {
            let found = index.get(k).unwrap();
            assert_eq!(found, Some(RawBsonRef::Int32(v)), "{}", k.len());
        }
        for k in [&long[..254], &long[..257], &long[..299]] {
            assert_eq!(index.get(k).unwrap(), None, "{}", k.len());
        }
        let with_nul = format!("{}\0", &long[..255]);
        assert_eq!(index.get(&with_nul).unwrap(), doc.get(&with_nul).unwrap());
        assert_eq!(index.get("k\0").unwrap(), doc.get("k\0").unwrap());
        assert_eq!(Index::new(&rawdoc! {}).first_key(), None);
        // A regex is not decoded by the index: the bson crate answers.
        let re = rawdoc! { "a": 1, "re": bson::Regex { pattern: "x".to_owned().try_into().unwrap(), options: String::new().try_into().unwrap() } };
        let index = Index::new(&re);
        assert_eq!(index.get("re").unwrap(), re.get("re").unwrap());
    }
}
