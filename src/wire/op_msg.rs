//! OP_MSG (opcode 2013): flags, one body section, document sequences, optional CRC-32C.

use bson::RawDocument;

use super::{bson_util::check_duplicate_keys, error::WireError, reader::Reader, HEADER_LEN};

/// OP_MSG flag bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MsgFlags(pub u32);

impl MsgFlags {
    /// A CRC-32C of the message follows the last section.
    pub const CHECKSUM_PRESENT: u32 = 1 << 0;
    /// The sender will send another message without waiting for a reply.
    pub const MORE_TO_COME: u32 = 1 << 1;
    /// The client accepts a stream of replies (exhaust).
    pub const EXHAUST_ALLOWED: u32 = 1 << 16;
    /// Bits 0-15 are "required": a receiver must reject the ones it does not know.
    const KNOWN_REQUIRED: u32 = Self::CHECKSUM_PRESENT | Self::MORE_TO_COME;

    /// checksumPresent.
    pub fn checksum_present(self) -> bool {
        self.0 & Self::CHECKSUM_PRESENT != 0
    }
    /// moreToCome.
    pub fn more_to_come(self) -> bool {
        self.0 & Self::MORE_TO_COME != 0
    }
    /// exhaustAllowed.
    pub fn exhaust_allowed(self) -> bool {
        self.0 & Self::EXHAUST_ALLOWED != 0
    }
}

/// A kind-1 section: an identifier (`documents`, `updates`, `deletes`, ...) and its documents.
#[derive(Clone, Copy)]
pub struct DocumentSequence<'a> {
    identifier: &'a str,
    docs: &'a [u8],
}

impl<'a> DocumentSequence<'a> {
    /// The field name the documents belong to.
    pub fn identifier(&self) -> &'a str {
        self.identifier
    }

    /// The documents, validated at parse time (not again here: a write's statements are
    /// walked once per rule family).
    pub fn documents(&self) -> impl Iterator<Item = &'a RawDocument> + 'a {
        let mut r = Reader::new(self.docs, "document sequence");
        std::iter::from_fn(move || {
            if r.is_empty() {
                None
            } else {
                r.document_again().ok()
            }
        })
    }
}

/// A validated, borrowed view of an OP_MSG.
#[derive(Clone, Copy)]
pub struct OpMsg<'a> {
    flags: MsgFlags,
    body: &'a RawDocument,
    /// All section bytes (kind bytes included), checksum excluded.
    sections: &'a [u8],
    checksum: Option<u32>,
}

impl<'a> OpMsg<'a> {
    /// Parses a whole message (header included). Every section is validated here, the CRC is
    /// checked when present, and the body must not repeat a top-level key.
    pub fn parse(message: &'a [u8]) -> Result<OpMsg<'a>, WireError> {
        let payload = message
            .get(HEADER_LEN..)
            .ok_or(WireError::ShortField("OP_MSG header"))?;
        let mut r = Reader::new(payload, "OP_MSG flags");
        let flags = MsgFlags(r.u32()?);
        let unknown = flags.0 & 0xffff & !MsgFlags::KNOWN_REQUIRED;
        if unknown != 0 {
            return Err(WireError::UnknownRequiredFlags(unknown));
        }
        let mut sections = r.remaining();
        let mut checksum = None;
        if flags.checksum_present() {
            let split = sections
                .len()
                .checked_sub(4)
                .ok_or(WireError::ShortField("OP_MSG checksum"))?;
            let (body, crc) = sections.split_at(split);
            let declared = super::le_u32(crc).ok_or(WireError::ShortField("OP_MSG checksum"))?;
            let covered = message.len().saturating_sub(4);
            let computed = crc32c::crc32c(message.get(..covered).unwrap_or_default());
            if declared != computed {
                return Err(WireError::ChecksumMismatch { declared, computed });
            }
            sections = body;
            checksum = Some(declared);
        }
        let (body, distinct) = validate_sections(sections)?;
        if !distinct {
            check_duplicate_keys(body)?;
        }
        Ok(OpMsg {
            flags,
            body,
            sections,
            checksum,
        })
    }

    /// Flag bits.
    pub fn flags(&self) -> MsgFlags {
        self.flags
    }

    /// The kind-0 body: the command document.
    pub fn body(&self) -> &'a RawDocument {
        self.body
    }

    /// The CRC-32C trailer, when present (already verified).
    pub fn checksum(&self) -> Option<u32> {
        self.checksum
    }

    /// The kind-1 document sequences, in wire order.
    pub fn sequences(&self) -> impl Iterator<Item = DocumentSequence<'a>> + 'a {
        let mut r = Reader::new(self.sections, "OP_MSG section");
        std::iter::from_fn(move || loop {
            if r.is_empty() {
                return None;
            }
            match read_section(&mut r, false) {
                Ok(Section::Body(..)) => continue,
                Ok(Section::Sequence(seq)) => return Some(seq),
                Err(_) => return None, // unreachable: validated in parse()
            }
        })
    }

    /// The sequence with the given identifier, if any.
    pub fn sequence(&self, identifier: &str) -> Option<DocumentSequence<'a>> {
        self.sequences().find(|s| s.identifier == identifier)
    }
}

enum Section<'a> {
    /// The body, and whether its top-level keys were found distinct while validating it.
    Body(&'a RawDocument, bool),
    Sequence(DocumentSequence<'a>),
}

/// Reads one section; `validate`: check every document (at parse), else only their framing
/// (sections walked again after a parse validated them: a write's statements are looked up
/// once per rule family, and validating a 1,000-document sequence each time was most of the
/// guard's cost on bulk writes).
fn read_section<'a>(r: &mut Reader<'a>, validate: bool) -> Result<Section<'a>, WireError> {
    match r.u8()? {
        0 if validate => {
            let (doc, distinct) = r.body_document()?;
            Ok(Section::Body(doc, distinct))
        }
        0 => Ok(Section::Body(r.document_again()?, false)),
        1 => {
            let size = r.i32()?;
            // The size counts itself; the identifier and documents follow.
            let rest = usize::try_from(size)
                .ok()
                .and_then(|s| s.checked_sub(4))
                .ok_or(WireError::ShortField("OP_MSG document sequence"))?;
            let mut seq = Reader::new(r.take(rest)?, "OP_MSG document sequence");
            let identifier = seq.cstring()?;
            let docs = seq.remaining();
            let mut check = seq;
            while validate && !check.is_empty() {
                check.document()?;
            }
            Ok(Section::Sequence(DocumentSequence { identifier, docs }))
        }
        kind => Err(WireError::UnknownSectionKind(kind)),
    }
}

/// Most kind-1 sections accepted (drivers send one; mongod 8.0 accepts at most two).
pub const MAX_SEQUENCES: usize = 16;

/// Walks every section; returns the single body. Like mongod, refuses an identifier used
/// twice or also present as a body field: the guard and the server must read the same
/// statements.
fn validate_sections(sections: &[u8]) -> Result<(&RawDocument, bool), WireError> {
    let mut r = Reader::new(sections, "OP_MSG section");
    let mut body = None;
    let mut distinct = false;
    let mut bodies = 0usize;
    let mut ids: [&str; MAX_SEQUENCES] = [""; MAX_SEQUENCES];
    let mut n_ids = 0usize;
    while !r.is_empty() {
        match read_section(&mut r, true)? {
            Section::Body(doc, keys_distinct) => {
                bodies += 1;
                body = Some(doc);
                distinct = keys_distinct;
            }
            Section::Sequence(seq) => {
                if ids.iter().take(n_ids).any(|id| *id == seq.identifier) {
                    return Err(WireError::DuplicateSequence(crate::text::client(
                        seq.identifier,
                    )));
                }
                let Some(slot) = ids.get_mut(n_ids) else {
                    return Err(WireError::TooManySequences(n_ids + 1));
                };
                *slot = seq.identifier;
                n_ids += 1;
            }
        }
    }
    let body = match (bodies, body) {
        (1, Some(doc)) => doc,
        (n, _) => return Err(WireError::BodySectionCount(n)),
    };
    for id in ids.iter().take(n_ids) {
        if super::GetFast::get_fast(body, id).ok().flatten().is_some() {
            return Err(WireError::SequenceShadowsBody(crate::text::client(id)));
        }
    }
    Ok((body, distinct))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::builder::{MsgBuilder, Sequence};
    use bson::rawdoc;

    #[test]
    fn body_and_sequences_round_trip() {
        let d1 = rawdoc! {"_id": 1};
        let d2 = rawdoc! {"_id": 2};
        let bytes = MsgBuilder::new(rawdoc! {"insert": "c", "$db": "d"})
            .sequence(Sequence::new("documents", vec![d1.clone(), d2.clone()]))
            .encode(5, 0);
        let msg = OpMsg::parse(&bytes).unwrap();
        assert_eq!(msg.body().get_str("insert").unwrap(), "c");
        let seq = msg.sequence("documents").unwrap();
        let docs: Vec<_> = seq.documents().collect();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].as_bytes(), d2.as_bytes());
    }

    #[test]
    fn checksum_verified_and_mismatch_rejected() {
        let mut bytes = MsgBuilder::new(rawdoc! {"ping": 1, "$db": "admin"})
            .checksum(true)
            .encode(1, 0)
            .to_vec();
        assert!(OpMsg::parse(&bytes).unwrap().checksum().is_some());
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        assert!(matches!(
            OpMsg::parse(&bytes),
            Err(WireError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn unknown_required_flag_rejected_optional_ignored() {
        let mut bytes = MsgBuilder::new(rawdoc! {"ping": 1}).encode(1, 0).to_vec();
        bytes[16] = 0x04; // bit 2: unknown, required
        assert_eq!(
            OpMsg::parse(&bytes).unwrap_err(),
            WireError::UnknownRequiredFlags(4)
        );
        bytes[16] = 0;
        bytes[18] = 0x02; // bit 17: unknown, optional
        assert!(OpMsg::parse(&bytes).is_ok());
    }

    #[test]
    fn zero_or_two_bodies_rejected() {
        let body = rawdoc! {"ping": 1};
        let mut bytes = MsgBuilder::new(body.clone()).encode(1, 0).to_vec();
        bytes.push(0);
        bytes.extend_from_slice(body.as_bytes());
        let len = bytes.len() as i32;
        bytes[0..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(
            OpMsg::parse(&bytes).unwrap_err(),
            WireError::BodySectionCount(2)
        );
        let mut only_flags = bytes[..20].to_vec();
        only_flags[0..4].copy_from_slice(&20i32.to_le_bytes());
        assert_eq!(
            OpMsg::parse(&only_flags).unwrap_err(),
            WireError::BodySectionCount(0)
        );
    }

    #[test]
    fn sequence_size_lying_is_rejected() {
        let bytes = MsgBuilder::new(rawdoc! {"insert": "c"})
            .sequence(Sequence::new("documents", vec![rawdoc! {"a": 1}]))
            .encode(1, 0)
            .to_vec();
        // Find the kind-1 byte and inflate the sequence size.
        let body_len = rawdoc! {"insert": "c"}.as_bytes().len();
        let pos = 16 + 4 + 1 + body_len;
        assert_eq!(bytes[pos], 1);
        let mut lying = bytes.clone();
        lying[pos + 1..pos + 5].copy_from_slice(&1000i32.to_le_bytes());
        assert!(OpMsg::parse(&lying).is_err());
        let mut tiny = bytes;
        tiny[pos + 1..pos + 5].copy_from_slice(&2i32.to_le_bytes());
        assert!(OpMsg::parse(&tiny).is_err());
    }

    #[test]
    fn duplicate_body_key_rejected() {
        // {"find": "a", "find": "b"} built by hand.
        let mut doc = Vec::new();
        for v in ["a", "b"] {
            doc.push(0x02);
            doc.extend_from_slice(b"find\0");
            doc.extend_from_slice(&2i32.to_le_bytes());
            doc.extend_from_slice(v.as_bytes());
            doc.push(0);
        }
        let mut full = ((doc.len() + 5) as i32).to_le_bytes().to_vec();
        full.extend_from_slice(&doc);
        full.push(0);
        let body = bson::RawDocumentBuf::from_bytes(full).unwrap();
        let bytes = MsgBuilder::new(body).encode(1, 0);
        assert_eq!(
            OpMsg::parse(&bytes).unwrap_err(),
            WireError::DuplicateKey("find".into())
        );
    }
}

super::debug_fields!(DocumentSequence<'a>, "DocumentSequence", identifier);

super::debug_fields!(OpMsg<'a>, "OpMsg", flags);
