//! The MongoDB wire protocol, sans-IO.
//!
//! Bytes become [`Frame`]s (a whole message as `Bytes`, zero-copy, exactly as received: what
//! gets forwarded), and frames become borrowed views ([`Message`]) that validate every length
//! and section before anything reads them. Nothing here does I/O or allocates per message on
//! the parse path, except decompression of `OP_COMPRESSED`, which must materialise the inner
//! message.

/// `Debug` that prints only the named fields: message views hold documents whose literals and
/// credentials must never reach a log through `{:?}`.
macro_rules! debug_fields {
    ($ty:ident $(<$lt:lifetime>)?, $name:literal $(, $field:ident)*) => {
        impl $(<$lt>)? ::std::fmt::Debug for $ty $(<$lt>)? {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct($name)
                    $(.field(stringify!($field), &self.$field))*
                    .finish_non_exhaustive()
            }
        }
    };
}
pub(crate) use debug_fields;

mod bson_scan;
mod bson_util;
pub mod builder;
pub mod codec;
pub mod compression;
mod error;
mod legacy;
mod message;
mod op_msg;
mod op_query;
mod op_reply;
#[cfg(test)]
mod prop_tests;
mod reader;

#[cfg(test)]
pub(crate) use bson_scan::{corruptions, each_readable_variant};
pub(crate) use bson_scan::{pick, value_valid, walk_keyed, walk_values, GetFast, Index};
pub use bson_util::{check_duplicate_keys, first_key};
pub use codec::MessageCodec;
pub use compression::{Compressor, OpCompressed};
pub use error::WireError;
pub use legacy::{OpDelete, OpGetMore, OpInsert, OpKillCursors, OpUpdate};
pub use message::Message;
pub use op_msg::{DocumentSequence, MsgFlags, OpMsg};
pub use op_query::OpQuery;
pub use op_reply::{OpReply, CURSOR_NOT_FOUND, QUERY_FAILURE};

use bytes::Bytes;

/// Size of the standard message header.
pub const HEADER_LEN: usize = 16;
/// mongod's default `maxMessageSizeBytes` (the configuration's default `max_message_size`).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = crate::config::DEFAULT_MAX_MESSAGE_SIZE;

// The configuration refuses a `max_message_size` below one header; it cannot import this
// module (it is a leaf), so its own constant is checked here.
const _: () = assert!(HEADER_LEN == crate::config::MIN_MAX_MESSAGE_SIZE);

/// Opcodes this proxy understands. Anything else is rejected at parse time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum OpCode {
    /// Reply to OP_QUERY / OP_GET_MORE.
    Reply = 1,
    /// Legacy update.
    Update = 2001,
    /// Legacy insert.
    Insert = 2002,
    /// Legacy query, still used for the first hello and for `db.$cmd` commands.
    Query = 2004,
    /// Legacy getMore.
    GetMore = 2005,
    /// Legacy delete.
    Delete = 2006,
    /// Legacy killCursors.
    KillCursors = 2007,
    /// Compressed wrapper around another message.
    Compressed = 2012,
    /// The modern message.
    Msg = 2013,
}

impl OpCode {
    /// Maps a wire value to an opcode.
    pub fn from_i32(v: i32) -> Option<OpCode> {
        Some(match v {
            1 => OpCode::Reply,
            2001 => OpCode::Update,
            2002 => OpCode::Insert,
            2004 => OpCode::Query,
            2005 => OpCode::GetMore,
            2006 => OpCode::Delete,
            2007 => OpCode::KillCursors,
            2012 => OpCode::Compressed,
            2013 => OpCode::Msg,
            _ => return None,
        })
    }

    /// Lower-case name for logs and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            OpCode::Reply => "op_reply",
            OpCode::Update => "op_update",
            OpCode::Insert => "op_insert",
            OpCode::Query => "op_query",
            OpCode::GetMore => "op_get_more",
            OpCode::Delete => "op_delete",
            OpCode::KillCursors => "op_kill_cursors",
            OpCode::Compressed => "op_compressed",
            OpCode::Msg => "op_msg",
        }
    }
}

/// The 16-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Total message length including the header.
    pub length: i32,
    /// Sender's id for this message.
    pub request_id: i32,
    /// The request this message answers (0 for requests).
    pub response_to: i32,
    /// Raw opcode value.
    pub op_code: i32,
}

/// The little-endian `u32` in the first four bytes of `b` (`None` when shorter).
pub(crate) fn le_u32(b: &[u8]) -> Option<u32> {
    let bytes: [u8; 4] = b.get(..4)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

impl Header {
    /// Reads a header from the first 16 bytes of `buf`, if present.
    pub fn parse(buf: &[u8]) -> Option<Header> {
        let field = |i: usize| -> Option<i32> {
            let bytes: [u8; 4] = buf.get(i..i + 4)?.try_into().ok()?;
            Some(i32::from_le_bytes(bytes))
        };
        Some(Header {
            length: field(0)?,
            request_id: field(4)?,
            response_to: field(8)?,
            op_code: field(12)?,
        })
    }

    /// Encodes the header.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&self.length.to_le_bytes());
        out[4..8].copy_from_slice(&self.request_id.to_le_bytes());
        out[8..12].copy_from_slice(&self.response_to.to_le_bytes());
        out[12..16].copy_from_slice(&self.op_code.to_le_bytes());
        out
    }
}

/// One whole message, header included, as the bytes that arrived. Cloning is a refcount bump.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    bytes: Bytes,
    header: Header,
}

impl Frame {
    /// Wraps bytes that hold exactly one message. The header's length must equal the byte count.
    pub fn from_bytes(bytes: Bytes) -> Result<Frame, WireError> {
        let header = Header::parse(&bytes).ok_or(WireError::LengthTooSmall(bytes.len() as i64))?;
        let declared = usize::try_from(header.length)
            .map_err(|_| WireError::LengthTooSmall(header.length.into()))?;
        if declared < HEADER_LEN {
            return Err(WireError::LengthTooSmall(header.length.into()));
        }
        if declared != bytes.len() {
            return Err(WireError::Truncated {
                buffered: bytes.len(),
                expected: declared,
            });
        }
        Ok(Frame { bytes, header })
    }

    /// The parsed header.
    pub fn header(&self) -> Header {
        self.header
    }

    /// The opcode, if known.
    pub fn op_code(&self) -> Option<OpCode> {
        OpCode::from_i32(self.header.op_code)
    }

    /// The message without its header.
    pub fn payload(&self) -> &[u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or_default()
    }

    /// The whole message as received.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The whole message, consuming the frame.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true for a valid frame; present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

// Debug shows the header only: the payload can hold literals and credentials.
impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Source of request ids for messages mongoguard writes itself.
#[derive(Debug, Default)]
pub struct RequestIds(std::sync::atomic::AtomicI32);

impl RequestIds {
    /// The next id: positive, wrapping back to 1.
    pub fn next(&self) -> i32 {
        use std::sync::atomic::Ordering;
        let id = self.0.fetch_add(1, Ordering::Relaxed);
        (id & 0x7fff_ffff).max(1)
    }
}
