//! The codec on an arbitrary byte stream, then every frame through `Message::parse` and every
//! accessor (including decompression and a parse of the decompressed frame).
//!
//! The stream is decoded twice, whole and in small chunks; both must yield the same frames and
//! end the same way (the codec keeps no state outside the buffer, see its cancellation-safety
//! note).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mongoguard::wire::{Frame, MessageCodec, DEFAULT_MAX_MESSAGE_SIZE};
use mongoguard_fuzz::walk_frame;
use tokio_util::codec::Decoder;

/// Decodes `data` fed `chunk` bytes at a time; returns the frames and whether it ended in error.
fn decode_all(data: &[u8], chunk: usize) -> (Vec<Frame>, bool) {
    let mut codec = MessageCodec::default();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    match codec.decode_eof(&mut buf) {
        // decode already declined the rest: a frame now would mean it had left a whole one.
        Ok(Some(_)) => panic!("decode_eof produced a frame that decode left behind"),
        Ok(None) => {
            assert!(buf.is_empty(), "clean EOF with {} bytes left", buf.len());
            (frames, false)
        }
        Err(_) => (frames, true),
    }
}

fuzz_target!(|data: &[u8]| {
    let (whole, whole_err) = decode_all(data, data.len());
    let (chunked, chunked_err) = decode_all(data, 1 + data.len() % 13);
    assert_eq!(whole, chunked, "chunking changed the frames");
    assert_eq!(
        whole_err, chunked_err,
        "chunking changed how the stream ended"
    );
    for frame in &whole {
        walk_frame(frame, DEFAULT_MAX_MESSAGE_SIZE, 0);
    }
});
