//! A bounds-checked little-endian reader over a borrowed byte slice. Every read checks the
//! remaining length first; no arithmetic on wire values can overflow or index out of range.

use bson::RawDocument;

use super::error::WireError;

/// Cursor over message bytes. `ctx` names the field family for error messages.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    ctx: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], ctx: &'static str) -> Self {
        Reader { buf, ctx }
    }

    pub(crate) fn remaining(&self) -> &'a [u8] {
        self.buf
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::ShortField(self.ctx));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A NUL-terminated UTF-8 string (the NUL is consumed, not returned).
    pub(crate) fn cstring(&mut self) -> Result<&'a str, WireError> {
        let nul = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::BadCString(self.ctx))?;
        let bytes = self.take(nul)?;
        self.take(1)?;
        std::str::from_utf8(bytes).map_err(|_| WireError::BadCString(self.ctx))
    }

    /// A length-prefixed BSON document. The prefix is validated against the remaining bytes
    /// before slicing, and the document's elements are walked once so that a later reader
    /// cannot meet a malformed element.
    /// The next document of bytes that were already read with [`Reader::document`] (a
    /// document sequence walked again after its parse): its length is checked, its elements
    /// are not validated a second time.
    pub(crate) fn document_again(&mut self) -> Result<&'a RawDocument, WireError> {
        let len = peek_doc_len(self.buf, self.ctx)?;
        let bytes = self.take(len)?;
        RawDocument::from_bytes(bytes).map_err(|e| WireError::bad_doc(self.ctx, e))
    }

    /// [`Reader::document`] for a command body, also telling whether its top-level keys were
    /// found distinct by the same walk (`false`: not checked; the caller checks them).
    pub(crate) fn body_document(&mut self) -> Result<(&'a RawDocument, bool), WireError> {
        let len = peek_doc_len(self.buf, self.ctx)?;
        let bytes = self.take(len)?;
        let doc = RawDocument::from_bytes(bytes).map_err(|e| WireError::bad_doc(self.ctx, e))?;
        if super::bson_scan::elements_valid_and_distinct(doc) {
            return Ok((doc, true));
        }
        if !super::bson_scan::elements_valid(doc) {
            validate_elements(doc, self.ctx)?;
        }
        Ok((doc, false))
    }

    pub(crate) fn document(&mut self) -> Result<&'a RawDocument, WireError> {
        let len = peek_doc_len(self.buf, self.ctx)?;
        let bytes = self.take(len)?;
        let doc = RawDocument::from_bytes(bytes).map_err(|e| WireError::bad_doc(self.ctx, e))?;
        // One cheap walk decides the common case; anything it does not decide, the bson
        // crate's iteration decides (and explains).
        if !super::bson_scan::elements_valid(doc) {
            validate_elements(doc, self.ctx)?;
        }
        Ok(doc)
    }
}

/// Length of the BSON document at the start of `buf`, checked against `buf`.
pub(crate) fn peek_doc_len(buf: &[u8], ctx: &'static str) -> Result<usize, WireError> {
    let prefix: [u8; 4] = buf
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or(WireError::ShortField(ctx))?;
    let declared = i32::from_le_bytes(prefix);
    let len = usize::try_from(declared)
        .ok()
        .filter(|&l| l >= 5)
        .ok_or_else(|| WireError::bad_doc(ctx, format!("length prefix {declared}")))?;
    if len > buf.len() {
        return Err(WireError::ShortField(ctx));
    }
    Ok(len)
}

/// Walks the top-level elements once: each element's type and length must be valid.
/// Nested documents are checked lazily by whoever descends into them (bson's raw iterator
/// returns errors, never panics), so this stays O(top-level keys).
fn validate_elements(doc: &RawDocument, ctx: &'static str) -> Result<(), WireError> {
    for elem in doc.iter_elements() {
        let elem = elem.map_err(|e| WireError::bad_doc(ctx, e))?;
        elem.value().map_err(|e| WireError::bad_doc(ctx, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_reads_are_errors_not_panics() {
        let mut r = Reader::new(&[1, 2, 3], "t");
        assert_eq!(r.i32(), Err(WireError::ShortField("t")));
        assert_eq!(r.u8(), Ok(1));
    }

    #[test]
    fn cstring_requires_nul() {
        let mut r = Reader::new(b"abc", "t");
        assert_eq!(r.cstring(), Err(WireError::BadCString("t")));
        let mut r = Reader::new(b"db.$cmd\0rest", "t");
        assert_eq!(r.cstring(), Ok("db.$cmd"));
        assert_eq!(r.remaining(), b"rest");
    }

    #[test]
    fn document_prefix_lying_about_length() {
        // Declares 200 bytes, has 5.
        let mut r = Reader::new(&[200, 0, 0, 0, 0], "t");
        assert_eq!(r.document().unwrap_err(), WireError::ShortField("t"));
        // Negative length.
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 0], "t");
        assert!(matches!(r.document(), Err(WireError::BadDocument { .. })));
    }
}
