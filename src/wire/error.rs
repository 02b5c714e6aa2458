//! Errors of the wire layer. Every variant says what was wrong with the bytes; none carries
//! message contents (they may hold literals or credentials).

use thiserror::Error;

/// A frame or section that does not follow the MongoDB wire protocol.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The header's messageLength is below the 16-byte header.
    #[error("message length {0} is below the 16-byte minimum")]
    LengthTooSmall(i64),
    /// The header's messageLength is above the configured maximum.
    #[error("message length {length} exceeds the maximum of {max} bytes")]
    LengthTooLarge {
        /// Declared length.
        length: i64,
        /// Configured maximum.
        max: usize,
    },
    /// The connection ended in the middle of a frame.
    #[error("connection closed in the middle of a message ({buffered} of {expected} bytes)")]
    Truncated {
        /// Bytes received of the frame.
        buffered: usize,
        /// Bytes the header declared.
        expected: usize,
    },
    /// An opcode this proxy does not know.
    #[error("unknown opcode {0}")]
    UnknownOpCode(i32),
    /// A field ended before its declared or minimum size.
    #[error("{0}: field runs past the end of the message")]
    ShortField(&'static str),
    /// A cstring without its terminating NUL, or not UTF-8.
    #[error("{0}: invalid or unterminated cstring")]
    BadCString(&'static str),
    /// A BSON document whose length prefix is wrong or whose bytes are invalid.
    #[error("{context}: malformed BSON document: {reason}")]
    BadDocument {
        /// Where the document was.
        context: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// Bytes left over after the last field of a message.
    #[error("{0}: {1} trailing bytes after the last field")]
    TrailingBytes(&'static str, usize),
    /// OP_MSG flag bits 0-15 that are required but unknown.
    #[error("OP_MSG sets unknown required flag bits {0:#06x}")]
    UnknownRequiredFlags(u32),
    /// OP_MSG without a kind-0 body section, or with more than one.
    #[error("OP_MSG must have exactly one body section, found {0}")]
    BodySectionCount(usize),
    /// An OP_MSG section kind other than 0 and 1.
    #[error("OP_MSG section kind {0} is not defined")]
    UnknownSectionKind(u8),
    /// The CRC-32C trailer does not match.
    #[error("OP_MSG checksum mismatch (declared {declared:#010x}, computed {computed:#010x})")]
    ChecksumMismatch {
        /// Trailer value.
        declared: u32,
        /// Value computed over the frame.
        computed: u32,
    },
    /// A document appears twice under the same top-level key.
    #[error("duplicate top-level key {0:?} in a command document")]
    DuplicateKey(String),
    /// Two kind-1 sections with the same identifier (mongod: 40431).
    #[error("OP_MSG repeats document sequence {0:?}")]
    DuplicateSequence(String),
    /// A kind-1 identifier that is also a body field (mongod: 40433).
    #[error("OP_MSG document sequence {0:?} duplicates a body field")]
    SequenceShadowsBody(String),
    /// More kind-1 sections than any driver sends.
    #[error("OP_MSG has {0} document sequences (at most {max})", max = super::op_msg::MAX_SEQUENCES)]
    TooManySequences(usize),
    /// OP_COMPRESSED names a compressor this build does not know.
    #[error("unknown compressor id {0}")]
    UnknownCompressor(u8),
    /// OP_COMPRESSED wraps another OP_COMPRESSED.
    #[error("nested OP_COMPRESSED is not allowed")]
    NestedCompression,
    /// The declared uncompressed size is negative or above the maximum.
    #[error("declared uncompressed size {size} is outside 0..={max}")]
    UncompressedSizeTooLarge {
        /// Declared size.
        size: i64,
        /// Largest accepted size.
        max: usize,
    },
    /// The decompressed payload is not the declared size, or did not decompress.
    #[error("decompression failed: {0}")]
    Decompression(String),
    /// An OP_MSG body section or a legacy query must be a command document but is not.
    #[error("{0}: empty command document")]
    EmptyCommand(&'static str),
}

impl WireError {
    pub(crate) fn bad_doc(context: &'static str, err: impl std::fmt::Display) -> Self {
        // The reason may quote client-chosen keys or values: keep it short for logs and
        // error replies.
        let reason = err.to_string();
        let reason = match crate::text::clip(&reason, 4 * crate::text::CLIENT_TEXT_MAX) {
            std::borrow::Cow::Borrowed(_) => reason,
            std::borrow::Cow::Owned(short) => short,
        };
        WireError::BadDocument { context, reason }
    }
}
