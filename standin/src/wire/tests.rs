//! Unit tests for wire.

use super::*;
use bson::doc;

fn msg_frame(flags: u32, body: &Document, seq: Option<(&str, Vec<Document>)>) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, 7, 0, OP_MSG);
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.push(0);
    body.to_writer(&mut buf).unwrap();
    if let Some((id, docs)) = seq {
        let mut s = Vec::new();
        s.extend_from_slice(id.as_bytes());
        s.push(0);
        for d in docs {
            d.to_writer(&mut s).unwrap();
        }
        buf.push(1);
        buf.extend_from_slice(&((s.len() + 4) as i32).to_le_bytes());
        buf.extend_from_slice(&s);
    }
    if flags & FLAG_CHECKSUM != 0 {
        buf.extend_from_slice(&[0; 4]);
        let l = buf.len();
        buf[..4].copy_from_slice(&(l as i32).to_le_bytes());
        let crc = crc32c::crc32c(&buf[..l - 4]);
        buf[l - 4..].copy_from_slice(&crc.to_le_bytes());
        return buf;
    }
    finish(buf).unwrap()
}

#[test]
fn op_msg_sequences_merge_and_checksum() {
    let frame = msg_frame(
        FLAG_CHECKSUM,
        &doc! {"insert": "c", "$db": "d"},
        Some(("documents", vec![doc! {"a": 1}, doc! {"a": 2}])),
    );
    let inc = parse_frame(&frame).unwrap();
    assert_eq!(inc.request_id, 7);
    let Request::Msg(m) = inc.request else {
        panic!()
    };
    assert_eq!(m.body.get_array("documents").unwrap().len(), 2);
    let mut bad = frame.clone();
    let n = bad.len();
    bad[n - 1] ^= 0xff;
    assert!(parse_frame(&bad).is_err());
}

#[test]
fn rejects_bad_frames() {
    assert!(frame_len(&[8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&(48_000_001i32).to_le_bytes());
    assert!(frame_len(&h).is_err());
    let frame = msg_frame(1 << 5, &doc! {"ping": 1}, None);
    assert!(parse_frame(&frame).is_err());
    let mut trunc = msg_frame(0, &doc! {"ping": 1}, None);
    trunc.truncate(trunc.len() - 3);
    assert!(parse_frame(&trunc).is_err());
}

#[test]
fn duplicate_keys_flagged() {
    // {"a":1,"a":2} built by hand
    let mut d = vec![0u8; 4];
    for v in [1i32, 2] {
        d.push(0x10);
        d.extend_from_slice(b"a\0");
        d.extend_from_slice(&v.to_le_bytes());
    }
    d.push(0);
    let l = d.len() as i32;
    d[..4].copy_from_slice(&l.to_le_bytes());
    let doc = decode_doc(&d).unwrap();
    assert_eq!(duplicate_key(&d, &doc).as_deref(), Some("a"));
}

#[test]
fn compressed_roundtrip() {
    for id in [0u8, 1, 2, 3] {
        let frame = encode_op_msg(3, 9, 0, &doc! {"ping": 1, "$db": "admin"}).unwrap();
        let c = compress_frame(&frame, id).unwrap();
        let inc = parse_frame(&c).unwrap();
        assert_eq!(inc.compressor, Some(id));
        assert!(matches!(inc.request, Request::Msg(_)));
    }
}

#[test]
fn deep_nesting_is_rejected_not_a_stack_overflow() {
    // {"a":{"a":{...}}} built by hand, `levels` deep.
    fn nested(levels: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for i in 0..levels {
            let len = (levels - i) * 8 + 5;
            bytes.extend_from_slice(&(len as i32).to_le_bytes());
            bytes.extend_from_slice(&[0x03, b'a', 0]);
        }
        bytes.extend_from_slice(&5i32.to_le_bytes());
        bytes.push(0);
        bytes.extend(std::iter::repeat_n(0u8, levels));
        bytes
    }
    assert!(decode_doc(&nested(100)).is_ok());
    let err = decode_doc(&nested(100_000)).unwrap_err();
    assert!(err.0.contains("nesting"), "{err}");
}
