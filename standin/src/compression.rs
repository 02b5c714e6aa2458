//! OP_COMPRESSED payload codecs: noop (0), snappy (1, raw format), zlib (2), zstd (3).

use std::io::{Read, Write};

use crate::wire::{WireError, MAX_MESSAGE_SIZE};

pub(crate) const NOOP: u8 = 0;
pub(crate) const SNAPPY: u8 = 1;
pub(crate) const ZLIB: u8 = 2;
pub(crate) const ZSTD: u8 = 3;

/// Commands whose replies are never compressed (MongoDB compression spec).
pub(crate) fn never_compressed(command_lower: &str) -> bool {
    matches!(
        command_lower,
        "hello"
            | "ismaster"
            | "saslstart"
            | "saslcontinue"
            | "getnonce"
            | "authenticate"
            | "createuser"
            | "updateuser"
            | "copydbsaslstart"
            | "copydbgetnonce"
    )
}

/// Decompresses a payload whose declared uncompressed size is `size`.
pub(crate) fn decompress(id: u8, size: i32, data: &[u8]) -> Result<Vec<u8>, WireError> {
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s <= MAX_MESSAGE_SIZE)
        .ok_or_else(|| WireError(format!("invalid uncompressedSize {size}")))?;
    let out = match id {
        NOOP => data.to_vec(),
        SNAPPY => {
            let len =
                snap::raw::decompress_len(data).map_err(|e| WireError(format!("snappy: {e}")))?;
            if len != size {
                return Err(WireError(format!(
                    "snappy length {len} != uncompressedSize {size}"
                )));
            }
            snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| WireError(format!("snappy: {e}")))?
        }
        ZLIB => read_capped(flate2::read::ZlibDecoder::new(data), size)?,
        ZSTD => read_capped(
            zstd::stream::read::Decoder::new(data).map_err(|e| WireError(format!("zstd: {e}")))?,
            size,
        )?,
        other => return Err(WireError(format!("unknown compressor id {other}"))),
    };
    if out.len() != size {
        return Err(WireError(format!(
            "decompressed {} bytes, header said {size}",
            out.len()
        )));
    }
    Ok(out)
}

fn read_capped(reader: impl Read, size: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(size.min(1 << 20));
    reader
        .take(size as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| WireError(format!("decompression failed: {e}")))?;
    Ok(out)
}

/// Compresses a payload with the given compressor id.
pub(crate) fn compress(id: u8, data: &[u8]) -> Result<Vec<u8>, String> {
    match id {
        NOOP => Ok(data.to_vec()),
        SNAPPY => snap::raw::Encoder::new()
            .compress_vec(data)
            .map_err(|e| e.to_string()),
        ZLIB => {
            let mut enc = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(data.len() / 2 + 64),
                flate2::Compression::fast(),
            );
            enc.write_all(data).map_err(|e| e.to_string())?;
            enc.finish().map_err(|e| e.to_string())
        }
        ZSTD => zstd::bulk::compress(data, 1).map_err(|e| e.to_string()),
        other => Err(format!("unknown compressor id {other}")),
    }
}

/// Compressor names this implementation understands.
pub(crate) fn known(name: &str) -> bool {
    matches!(name, "snappy" | "zlib" | "zstd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_caps() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        for id in [NOOP, SNAPPY, ZLIB, ZSTD] {
            let c = compress(id, &data).unwrap();
            assert_eq!(decompress(id, data.len() as i32, &c).unwrap(), data);
            // Lying about the size is rejected.
            assert!(decompress(id, data.len() as i32 - 1, &c).is_err());
        }
        assert!(decompress(ZLIB, -1, b"").is_err());
        assert!(decompress(ZLIB, 48_000_001, b"").is_err());
        assert!(decompress(9, 1, b"x").is_err());
        assert!(decompress(ZSTD, 10, b"garbage!").is_err());
    }
}
