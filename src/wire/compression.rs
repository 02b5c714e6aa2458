//! OP_COMPRESSED (opcode 2012): snappy, zlib and zstd.
//!
//! The declared uncompressed size is checked against the message size limit before a byte is
//! allocated, and the decompressor is stopped one byte past it, so a "compression bomb" costs
//! at most the limit. The output must be exactly the declared size.

use std::io::Read;

use bytes::{BufMut, Bytes, BytesMut};

use super::{error::WireError, reader::Reader, Frame, Header, OpCode, HEADER_LEN};

/// Compressor ids of the wire protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compressor {
    /// id 0: no compression.
    Noop,
    /// id 1: snappy (raw format).
    Snappy,
    /// id 2: zlib.
    Zlib,
    /// id 3: zstd.
    Zstd,
}

impl Compressor {
    /// From the wire id.
    pub fn from_id(id: u8) -> Result<Compressor, WireError> {
        Ok(match id {
            0 => Compressor::Noop,
            1 => Compressor::Snappy,
            2 => Compressor::Zlib,
            3 => Compressor::Zstd,
            other => return Err(WireError::UnknownCompressor(other)),
        })
    }

    /// The wire id.
    pub fn id(self) -> u8 {
        match self {
            Compressor::Noop => 0,
            Compressor::Snappy => 1,
            Compressor::Zlib => 2,
            Compressor::Zstd => 3,
        }
    }

    /// The name used in hello's `compression` array.
    pub fn name(self) -> &'static str {
        match self {
            Compressor::Noop => "noop",
            Compressor::Snappy => "snappy",
            Compressor::Zlib => "zlib",
            Compressor::Zstd => "zstd",
        }
    }

    /// From a hello `compression` name.
    pub fn from_name(name: &str) -> Option<Compressor> {
        Some(match name {
            "noop" => Compressor::Noop,
            "snappy" => Compressor::Snappy,
            "zlib" => Compressor::Zlib,
            "zstd" => Compressor::Zstd,
            _ => return None,
        })
    }
}

/// A validated, borrowed view of an OP_COMPRESSED.
#[derive(Clone, Copy)]
pub struct OpCompressed<'a> {
    header: Header,
    /// The opcode of the wrapped message.
    pub original_op_code: OpCode,
    /// Declared size of the wrapped message without its header.
    pub uncompressed_size: usize,
    /// The compressor.
    pub compressor: Compressor,
    data: &'a [u8],
}

impl<'a> OpCompressed<'a> {
    /// Parses a whole message. `max_message_size` bounds the wrapped message (header included).
    pub fn parse(
        message: &'a [u8],
        max_message_size: usize,
    ) -> Result<OpCompressed<'a>, WireError> {
        let header = Header::parse(message).ok_or(WireError::ShortField("OP_COMPRESSED"))?;
        let payload = message
            .get(HEADER_LEN..)
            .ok_or(WireError::ShortField("OP_COMPRESSED"))?;
        let mut r = Reader::new(payload, "OP_COMPRESSED");
        let original = r.i32()?;
        let size = r.i32()?;
        let compressor = Compressor::from_id(r.u8()?)?;
        let original_op_code =
            OpCode::from_i32(original).ok_or(WireError::UnknownOpCode(original))?;
        if original_op_code == OpCode::Compressed {
            return Err(WireError::NestedCompression);
        }
        let max_payload = max_message_size.saturating_sub(HEADER_LEN);
        let uncompressed_size = usize::try_from(size)
            .ok()
            .filter(|&s| s <= max_payload)
            .ok_or(WireError::UncompressedSizeTooLarge {
                size: size.into(),
                max: max_payload,
            })?;
        Ok(OpCompressed {
            header,
            original_op_code,
            uncompressed_size,
            compressor,
            data: r.remaining(),
        })
    }

    /// Decompresses into a standalone frame of the original opcode, with the outer header's
    /// requestID and responseTo.
    pub fn decompress(&self) -> Result<Frame, WireError> {
        let total = self.uncompressed_size.checked_add(HEADER_LEN).ok_or(
            WireError::UncompressedSizeTooLarge {
                size: self.uncompressed_size as i64,
                max: usize::MAX,
            },
        )?;
        let length = i32::try_from(total).map_err(|_| WireError::UncompressedSizeTooLarge {
            size: self.uncompressed_size as i64,
            max: i32::MAX as usize,
        })?;
        let header = Header {
            length,
            request_id: self.header.request_id,
            response_to: self.header.response_to,
            op_code: self.original_op_code as i32,
        };
        let mut out = Vec::with_capacity(total.min(HEADER_LEN + (1 << 20)));
        out.extend_from_slice(&header.to_bytes());
        decompress_into(self.compressor, self.data, self.uncompressed_size, &mut out)?;
        let produced = out.len() - HEADER_LEN;
        if produced != self.uncompressed_size {
            return Err(WireError::Decompression(format!(
                "declared {} bytes, produced {}{}",
                self.uncompressed_size,
                if produced > self.uncompressed_size {
                    "more than "
                } else {
                    ""
                },
                produced.min(self.uncompressed_size)
            )));
        }
        Frame::from_bytes(Bytes::from(out))
    }
}

/// Appends at most `size + 1` decompressed bytes to `out` (one more than allowed, so that an
/// oversized payload is detected without decompressing all of it).
fn decompress_into(
    compressor: Compressor,
    data: &[u8],
    size: usize,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let limit = (size as u64).saturating_add(1);
    let err = |e: std::io::Error| WireError::Decompression(e.to_string());
    match compressor {
        Compressor::Noop => {
            let take = data.len().min(size.saturating_add(1));
            out.extend_from_slice(data.get(..take).unwrap_or_default());
        }
        Compressor::Snappy => {
            let len = snap::raw::decompress_len(data)
                .map_err(|e| WireError::Decompression(e.to_string()))?;
            if len != size {
                return Err(WireError::Decompression(format!(
                    "snappy payload is {len} bytes, declared {size}"
                )));
            }
            let start = out.len();
            out.resize(start + len, 0);
            let tail = out.get_mut(start..).unwrap_or_default();
            snap::raw::Decoder::new()
                .decompress(data, tail)
                .map_err(|e| WireError::Decompression(e.to_string()))?;
        }
        Compressor::Zlib => {
            flate2::read::ZlibDecoder::new(data)
                .take(limit)
                .read_to_end(out)
                .map_err(err)?;
        }
        Compressor::Zstd => {
            zstd::stream::read::Decoder::with_buffer(data)
                .map_err(err)?
                .take(limit)
                .read_to_end(out)
                .map_err(err)?;
        }
    }
    Ok(())
}

/// Compresses a whole message (header included) into an OP_COMPRESSED with the same
/// requestID and responseTo.
pub fn compress(message: &[u8], compressor: Compressor) -> Result<Bytes, WireError> {
    let header = Header::parse(message).ok_or(WireError::ShortField("message to compress"))?;
    let payload = message.get(HEADER_LEN..).unwrap_or_default();
    let err = |e: std::io::Error| WireError::Decompression(e.to_string());
    let compressed: Vec<u8> = match compressor {
        Compressor::Noop => payload.to_vec(),
        Compressor::Snappy => snap::raw::Encoder::new()
            .compress_vec(payload)
            .map_err(|e| WireError::Decompression(e.to_string()))?,
        Compressor::Zlib => {
            use std::io::Write;
            let mut enc =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(payload).map_err(err)?;
            enc.finish().map_err(err)?
        }
        Compressor::Zstd => zstd::bulk::compress(payload, 1).map_err(err)?,
    };
    let total = HEADER_LEN + 9 + compressed.len();
    let mut out = BytesMut::with_capacity(total);
    out.put_slice(
        &Header {
            length: i32::try_from(total).map_err(|_| WireError::LengthTooLarge {
                length: total as i64,
                max: i32::MAX as usize,
            })?,
            request_id: header.request_id,
            response_to: header.response_to,
            op_code: OpCode::Compressed as i32,
        }
        .to_bytes(),
    );
    out.put_i32_le(header.op_code);
    out.put_i32_le(i32::try_from(payload.len()).unwrap_or(i32::MAX));
    out.put_u8(compressor.id());
    out.put_slice(&compressed);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{builder::MsgBuilder, OpMsg, DEFAULT_MAX_MESSAGE_SIZE};
    use bson::rawdoc;

    fn sample() -> Bytes {
        MsgBuilder::new(rawdoc! {"find": "c", "filter": {"x": "y".repeat(500)}, "$db": "d"})
            .encode(42, 0)
    }

    #[test]
    fn every_compressor_round_trips() {
        let original = sample();
        for c in [
            Compressor::Noop,
            Compressor::Snappy,
            Compressor::Zlib,
            Compressor::Zstd,
        ] {
            let packed = compress(&original, c).unwrap();
            let view = OpCompressed::parse(&packed, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
            assert_eq!(view.compressor, c);
            let frame = view.decompress().unwrap();
            assert_eq!(frame.bytes(), &original, "{c:?}");
            assert!(OpMsg::parse(frame.bytes()).is_ok());
        }
    }

    #[test]
    fn nested_compression_rejected() {
        let once = compress(&sample(), Compressor::Zlib).unwrap();
        let twice = compress(&once, Compressor::Zlib).unwrap();
        assert_eq!(
            OpCompressed::parse(&twice, DEFAULT_MAX_MESSAGE_SIZE).unwrap_err(),
            WireError::NestedCompression
        );
    }

    #[test]
    fn declared_size_above_limit_rejected_before_allocating() {
        let mut packed = compress(&sample(), Compressor::Zlib).unwrap().to_vec();
        packed[20..24].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(matches!(
            OpCompressed::parse(&packed, DEFAULT_MAX_MESSAGE_SIZE),
            Err(WireError::UncompressedSizeTooLarge { .. })
        ));
        packed[20..24].copy_from_slice(&(-5i32).to_le_bytes());
        assert!(OpCompressed::parse(&packed, DEFAULT_MAX_MESSAGE_SIZE).is_err());
    }

    #[test]
    fn lying_uncompressed_size_rejected_for_each_compressor() {
        for c in [
            Compressor::Snappy,
            Compressor::Zlib,
            Compressor::Zstd,
            Compressor::Noop,
        ] {
            let packed = compress(&sample(), c).unwrap().to_vec();
            for delta in [-1i32, 1] {
                let mut lying = packed.clone();
                let real = i32::from_le_bytes(lying[20..24].try_into().unwrap());
                lying[20..24].copy_from_slice(&(real + delta).to_le_bytes());
                let view = OpCompressed::parse(&lying, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
                assert!(view.decompress().is_err(), "{c:?} delta {delta}");
            }
        }
    }

    #[test]
    fn bomb_is_cut_at_the_declared_size() {
        // 40 MB of zeros compresses to a few KB; declare 1 KB.
        let payload = vec![0u8; 40_000_000];
        let mut msg = Header {
            length: (HEADER_LEN + payload.len()) as i32,
            request_id: 1,
            response_to: 0,
            op_code: 2013,
        }
        .to_bytes()
        .to_vec();
        msg.extend_from_slice(&payload);
        for c in [Compressor::Zlib, Compressor::Zstd] {
            let mut packed = compress(&msg, c).unwrap().to_vec();
            packed[20..24].copy_from_slice(&1024i32.to_le_bytes());
            let view = OpCompressed::parse(&packed, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
            assert!(matches!(
                view.decompress(),
                Err(WireError::Decompression(_))
            ));
        }
    }

    #[test]
    fn unknown_compressor_rejected() {
        let mut packed = compress(&sample(), Compressor::Zlib).unwrap().to_vec();
        packed[24] = 9;
        assert_eq!(
            OpCompressed::parse(&packed, DEFAULT_MAX_MESSAGE_SIZE).unwrap_err(),
            WireError::UnknownCompressor(9)
        );
    }
}

super::debug_fields!(
    OpCompressed<'a>,
    "OpCompressed",
    original_op_code,
    uncompressed_size,
    compressor
);
