//! OP_REPLY (opcode 1): the answer to OP_QUERY and OP_GET_MORE.

use bson::RawDocument;

use super::{error::WireError, reader::Reader, HEADER_LEN};

/// Response flag: the cursor id was not found.
pub const CURSOR_NOT_FOUND: i32 = 1 << 0;
/// Response flag: the query failed; the single document holds `$err`.
pub const QUERY_FAILURE: i32 = 1 << 1;

/// A validated, borrowed view of an OP_REPLY.
#[derive(Clone, Copy)]
pub struct OpReply<'a> {
    /// responseFlags.
    pub response_flags: i32,
    /// Cursor id (0 when exhausted).
    pub cursor_id: i64,
    /// Position of the first document in the cursor.
    pub starting_from: i32,
    /// Number of documents that follow.
    pub number_returned: i32,
    docs: &'a [u8],
}

impl<'a> OpReply<'a> {
    /// Parses a whole message. The document count must equal `numberReturned`.
    pub fn parse(message: &'a [u8]) -> Result<OpReply<'a>, WireError> {
        let payload = message
            .get(HEADER_LEN..)
            .ok_or(WireError::ShortField("OP_REPLY"))?;
        let mut r = Reader::new(payload, "OP_REPLY");
        let response_flags = r.i32()?;
        let cursor_id = r.i64()?;
        let starting_from = r.i32()?;
        let number_returned = r.i32()?;
        let docs = r.remaining();
        let mut count = 0i64;
        while !r.is_empty() {
            r.document()?;
            count += 1;
        }
        if count != i64::from(number_returned) {
            return Err(WireError::bad_doc(
                "OP_REPLY",
                format!("numberReturned {number_returned} but {count} documents"),
            ));
        }
        Ok(OpReply {
            response_flags,
            cursor_id,
            starting_from,
            number_returned,
            docs,
        })
    }

    /// The documents.
    pub fn documents(&self) -> impl Iterator<Item = &'a RawDocument> + 'a {
        let mut r = Reader::new(self.docs, "OP_REPLY");
        std::iter::from_fn(move || {
            if r.is_empty() {
                None
            } else {
                r.document().ok()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::builder::encode_reply;
    use bson::rawdoc;

    #[test]
    fn count_must_match() {
        let d = rawdoc! {"ok": 1};
        let bytes = encode_reply(1, 2, 0, 0, 0, &[&d]);
        let r = OpReply::parse(&bytes).unwrap();
        assert_eq!(r.documents().count(), 1);
        let mut lying = bytes.to_vec();
        lying[16 + 16..16 + 20].copy_from_slice(&3i32.to_le_bytes());
        assert!(OpReply::parse(&lying).is_err());
    }
}

super::debug_fields!(
    OpReply<'a>,
    "OpReply",
    response_flags,
    cursor_id,
    starting_from,
    number_returned
);
