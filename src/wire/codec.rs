//! `tokio_util::codec` framing: length-checked, zero-copy.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use super::{error::WireError, Frame, DEFAULT_MAX_MESSAGE_SIZE, HEADER_LEN};

/// Errors out of the codec: the socket's or the bytes'.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid frame.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// The read buffer a connection starts with (client and upstream side). tokio-util's default
/// is 8 KiB per `FramedRead`, allocated at once: with a passthrough client and its upstream
/// connection that was two buffers, most of an idle client's memory (docs/memory.md). Most
/// messages (commands, their replies) fit in 1 KiB; a larger one grows the buffer once, by
/// [`MessageCodec::decode`] reserving the rest of the message as soon as its header is in (up
/// to [`RESERVE_AHEAD_MAX`]).
pub const READ_BUFFER_INITIAL: usize = 1024;

/// How much of a message announced by its header is reserved before it arrives: the size a
/// client message may have without taking the memory budget (`BUDGET_FREE_BELOW`), so a
/// declared length never allocates more than reading a message freely could.
pub const RESERVE_AHEAD_MAX: usize = 64 * 1024;

/// A `FramedRead` of MongoDB messages with a [`READ_BUFFER_INITIAL`] buffer.
pub fn framed_read<R: tokio::io::AsyncRead>(
    io: R,
    max_message_size: usize,
) -> tokio_util::codec::FramedRead<R, MessageCodec> {
    tokio_util::codec::FramedRead::with_capacity(
        io,
        MessageCodec::new(max_message_size),
        READ_BUFFER_INITIAL,
    )
}

/// Splits a byte stream into [`Frame`]s.
///
/// The length is validated (16 ≤ length ≤ `max_message_size`) as soon as its four bytes are
/// buffered, before the rest of the message is awaited, so a lying length costs nothing.
/// Frames are `split_to(n).freeze()` out of the read buffer: no copy.
///
/// # Cancellation safety
/// `decode` keeps no state outside the buffer it is handed, so a `FramedRead::next()` that is
/// dropped inside `select!` loses nothing: the partial frame stays buffered for the next call.
#[derive(Debug, Clone, Copy)]
pub struct MessageCodec {
    max_message_size: usize,
}

impl MessageCodec {
    /// A codec accepting messages up to `max_message_size` bytes.
    pub fn new(max_message_size: usize) -> Self {
        MessageCodec {
            max_message_size: max_message_size.max(HEADER_LEN),
        }
    }

    /// The largest accepted message.
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// Validates a declared length; returns it as usize.
    pub fn check_length(&self, declared: i32) -> Result<usize, WireError> {
        let len =
            usize::try_from(declared).map_err(|_| WireError::LengthTooSmall(declared.into()))?;
        if len < HEADER_LEN {
            return Err(WireError::LengthTooSmall(declared.into()));
        }
        if len > self.max_message_size {
            return Err(WireError::LengthTooLarge {
                length: declared.into(),
                max: self.max_message_size,
            });
        }
        Ok(len)
    }
}

impl Default for MessageCodec {
    fn default() -> Self {
        MessageCodec::new(DEFAULT_MAX_MESSAGE_SIZE)
    }
}

impl Decoder for MessageCodec {
    type Item = Frame;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        let Some(declared) = super::le_u32(src) else {
            return Ok(None);
        };
        let declared = declared as i32;
        let len = self.check_length(declared)?;
        if src.len() < len {
            // The rest of the message in one read, not buffer doublings (bounded: a
            // declared length alone never reserves more than RESERVE_AHEAD_MAX).
            let want = len.min(RESERVE_AHEAD_MAX);
            if want > src.len() {
                src.reserve(want - src.len());
            }
            return Ok(None);
        }
        let bytes = src.split_to(len).freeze();
        Ok(Some(Frame::from_bytes(bytes)?))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        if src.is_empty() {
            // A clean EOF between frames is not an error.
            return Ok(None);
        }
        let expected = super::le_u32(src)
            .and_then(|l| usize::try_from(l as i32).ok())
            .unwrap_or(0);
        let buffered = src.len();
        src.advance(buffered);
        Err(WireError::Truncated { buffered, expected }.into())
    }
}

impl Encoder<Frame> for MessageCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        dst.extend_from_slice(item.bytes());
        Ok(())
    }
}

impl Encoder<Bytes> for MessageCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        let Some(header) = super::Header::parse(&item) else {
            return Err(WireError::LengthTooSmall(item.len() as i64).into());
        };
        let len = self.check_length(header.length)?;
        if len != item.len() {
            return Err(WireError::Truncated {
                buffered: item.len(),
                expected: len,
            }
            .into());
        }
        dst.extend_from_slice(&item);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile client announces a 48 MB message and sends only its header: the codec
    /// reserves at most RESERVE_AHEAD_MAX for it (the budget gate sees the header before
    /// anything larger is read), and a small message gets its whole length at once.
    #[test]
    fn a_declared_length_reserves_at_most_the_budget_free_size() {
        let mut codec = MessageCodec::new(48_000_000);
        let mut buf = BytesMut::with_capacity(READ_BUFFER_INITIAL);
        buf.extend_from_slice(&header(48_000_000, 2013));
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(buf.capacity() >= RESERVE_AHEAD_MAX, "{}", buf.capacity());
        assert!(buf.capacity() < 2 * RESERVE_AHEAD_MAX, "{}", buf.capacity());
        let mut small = BytesMut::with_capacity(READ_BUFFER_INITIAL);
        small.extend_from_slice(&header(3000, 2013));
        assert!(codec.decode(&mut small).unwrap().is_none());
        assert!(small.capacity() >= 3000, "{}", small.capacity());
        assert!(small.capacity() < RESERVE_AHEAD_MAX, "{}", small.capacity());
    }

    fn header(len: i32, op: i32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&7i32.to_le_bytes());
        v.extend_from_slice(&0i32.to_le_bytes());
        v.extend_from_slice(&op.to_le_bytes());
        v
    }

    #[test]
    fn waits_for_whole_frame_then_splits_without_copy() {
        let mut codec = MessageCodec::default();
        let mut msg = header(20, 2013);
        msg.extend_from_slice(&[0, 0, 0, 0]);
        let mut buf = BytesMut::from(&msg[..10]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&msg[10..]);
        buf.extend_from_slice(&[1, 2]); // start of the next frame stays buffered
        let frame = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame.len(), 20);
        assert_eq!(frame.header().request_id, 7);
        assert_eq!(&buf[..], &[1, 2]);
    }

    #[test]
    fn rejects_small_and_large_lengths_before_buffering() {
        let mut codec = MessageCodec::new(1000);
        let mut buf = BytesMut::from(&15i32.to_le_bytes()[..]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::Wire(WireError::LengthTooSmall(15)))
        ));
        let mut buf = BytesMut::from(&1001i32.to_le_bytes()[..]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::Wire(WireError::LengthTooLarge {
                length: 1001,
                ..
            }))
        ));
        let mut buf = BytesMut::from(&(-1i32).to_le_bytes()[..]);
        assert!(codec.decode(&mut buf).is_err());
    }

    #[test]
    fn eof_mid_frame_is_an_error_eof_between_frames_is_not() {
        let mut codec = MessageCodec::default();
        let mut empty = BytesMut::new();
        assert!(codec.decode_eof(&mut empty).unwrap().is_none());
        let mut partial = BytesMut::from(&header(40, 2013)[..]);
        assert!(matches!(
            codec.decode_eof(&mut partial),
            Err(CodecError::Wire(WireError::Truncated {
                buffered: 16,
                expected: 40
            }))
        ));
    }
}
