//! Micro-benchmarks of the wire layer's hot path: framing, parsing, decompression and the
//! duplicate-key check that every command body goes through.
//!
//! Run with `cargo bench --bench codec` (add `-- --warm-up-time 1 --measurement-time 3` for a
//! quick pass). Inputs are built once; only the operation named by each benchmark is timed.

use std::hint::black_box;

use bson::{rawdoc, spec::BinarySubtype, Binary, RawDocumentBuf};
use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mongoguard::wire::{
    builder::{encode_query, MsgBuilder, Sequence},
    check_duplicate_keys,
    compression::compress,
    Compressor, Message, MessageCodec, OpCompressed, OpMsg, DEFAULT_MAX_MESSAGE_SIZE,
};
use tokio_util::codec::Decoder;

fn lsid() -> Binary {
    Binary {
        subtype: BinarySubtype::Uuid,
        bytes: (0u8..16).collect(),
    }
}

/// A typical driver `find` (about 150 bytes on the wire).
fn small_find() -> Bytes {
    MsgBuilder::new(rawdoc! {
        "find": "orders",
        "filter": {"status": "A", "qty": {"$lt": 30}},
        "limit": 10,
        "$db": "shop",
        "lsid": {"id": lsid()},
    })
    .encode(1, 0)
}

/// A product-like document of roughly `target` bytes; `i` varies the values so that the
/// payload is not trivially compressible.
fn item(i: i32, target: usize) -> RawDocumentBuf {
    let build = |note: String| {
        rawdoc! {
            "_id": i,
            "sku": format!("SKU-{:06}", i.wrapping_mul(7919) % 1_000_000),
            "qty": i % 97,
            "price": f64::from(i) * 1.25,
            "tags": ["blue", "cotton", format!("batch-{}", i % 13)],
            "note": note,
        }
    };
    let pad = target.saturating_sub(build(String::new()).as_bytes().len());
    let seed = i.unsigned_abs() as usize;
    let note = (0..pad)
        .map(|k| char::from(b'a' + ((k * 31 + seed * 17) % 26) as u8))
        .collect();
    build(note)
}

/// An insert of 100 documents in a kind-1 sequence, about 16 KiB.
fn big_insert() -> Bytes {
    let docs = (0..100).map(|i| item(i, 162)).collect();
    MsgBuilder::new(rawdoc! {
        "insert": "items",
        "ordered": true,
        "$db": "shop",
        "lsid": {"id": lsid()},
    })
    .sequence(Sequence::new("documents", docs))
    .encode(2, 0)
}

/// An insert of about 4 KiB, the message the compressors are measured on.
fn four_kib_message() -> Bytes {
    let docs = (0..25).map(|i| item(i, 158)).collect();
    MsgBuilder::new(rawdoc! {"insert": "items", "$db": "shop"})
        .sequence(Sequence::new("documents", docs))
        .encode(3, 0)
}

fn hello_query() -> Bytes {
    encode_query(
        4,
        0,
        "admin.$cmd",
        0,
        -1,
        &rawdoc! {
            "isMaster": 1,
            "helloOk": true,
            "client": {
                "driver": {"name": "nodejs", "version": "6.9.0"},
                "os": {"type": "Linux", "name": "linux", "architecture": "x64", "version": "6.1"},
                "platform": "Node.js v20.11.0, LE",
                "application": {"name": "shop-api"},
            },
            "compression": ["zstd", "snappy", "zlib"],
        },
        None,
    )
}

fn ten_key_body() -> RawDocumentBuf {
    rawdoc! {
        "update": "orders",
        "updates": [{"q": {"_id": 1}, "u": {"$set": {"status": "B"}}}],
        "ordered": true,
        "bypassDocumentValidation": false,
        "writeConcern": {"w": "majority", "j": true},
        "comment": "bench",
        "let": {"x": 1},
        "lsid": {"id": lsid()},
        "txnNumber": 7i64,
        "$db": "shop",
    }
}

fn bench_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec_decode");
    for (name, msg) in [("find_small", small_find()), ("insert_16k", big_insert())] {
        group.throughput(Throughput::Bytes(msg.len() as u64));
        group.bench_function(name, |b| {
            let mut codec = MessageCodec::default();
            b.iter_batched_ref(
                || BytesMut::from(&msg[..]),
                |buf| black_box(codec.decode(buf).expect("valid").expect("whole frame")),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

fn bench_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    for (name, msg) in [
        ("op_msg_find_small", small_find()),
        ("op_msg_insert_16k", big_insert()),
    ] {
        group.throughput(Throughput::Bytes(msg.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| OpMsg::parse(black_box(&msg)).expect("valid"));
        });
    }
    let hello = hello_query();
    group.throughput(Throughput::Bytes(hello.len() as u64));
    group.bench_function("message_op_query_hello", |b| {
        b.iter(|| Message::parse(black_box(&hello), DEFAULT_MAX_MESSAGE_SIZE).expect("valid"));
    });
    group.finish();
}

fn bench_decompress(c: &mut Criterion) {
    let original = four_kib_message();
    let mut group = c.benchmark_group("decompress_4k");
    group.throughput(Throughput::Bytes(original.len() as u64));
    for compressor in [
        Compressor::Noop,
        Compressor::Snappy,
        Compressor::Zlib,
        Compressor::Zstd,
    ] {
        let packed = compress(&original, compressor).expect("compresses");
        let view = OpCompressed::parse(&packed, DEFAULT_MAX_MESSAGE_SIZE).expect("valid");
        assert_eq!(view.decompress().expect("decompresses").bytes(), &original);
        group.bench_function(compressor.name(), |b| {
            b.iter(|| black_box(&view).decompress().expect("decompresses"));
        });
    }
    group.finish();
}

fn bench_duplicate_keys(c: &mut Criterion) {
    let body = ten_key_body();
    c.bench_function("check_duplicate_keys_10", |b| {
        b.iter(|| check_duplicate_keys(black_box(&body)).expect("unique"));
    });
}

criterion_group!(
    benches,
    bench_decode,
    bench_parse,
    bench_decompress,
    bench_duplicate_keys
);
criterion_main!(benches);
