//! Micro-benchmarks of the policy engine on the request path: for each workload, the whole
//! per-request work (parse the frame, build the command view, evaluate the standard policy)
//! and `evaluate` alone on a prepared view.
//!
//! Run with `cargo bench --bench policy` (add `-- --warm-up-time 1 --measurement-time 3`
//! for a quick pass). Frames are built once, outside the timed code.

use std::hint::black_box;

use bson::{rawdoc, RawDocumentBuf};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mongoguard::{
    command::CommandView,
    policy::{Policy, RequestContext},
    wire::{
        builder::{MsgBuilder, Sequence},
        Message, DEFAULT_MAX_MESSAGE_SIZE,
    },
};

/// A typical driver `find`.
fn find() -> Bytes {
    MsgBuilder::new(rawdoc! {
        "find": "users",
        "filter": {"status": "active", "age": {"$gte": 21}},
        "projection": {"name": 1},
        "limit": 20,
        "$db": "app",
    })
    .encode(1, 0)
}

/// 100 single-document updates with real filters and `$set`, in a kind-1 sequence.
fn update_batch() -> Bytes {
    let updates: Vec<RawDocumentBuf> = (0..100i64)
        .map(|i| {
            rawdoc! {
                "q": {"_id": i, "status": {"$in": ["active", "trial"]}},
                "u": {"$set": {"seen": true, "visits": i}},
            }
        })
        .collect();
    MsgBuilder::new(rawdoc! {"update": "users", "ordered": true, "$db": "app"})
        .sequence(Sequence::new("updates", updates))
        .encode(2, 0)
}

/// 1,000 small documents with increasing integer `_id`s, in a kind-1 sequence.
fn insert_batch() -> Bytes {
    let docs: Vec<RawDocumentBuf> = (0..1000i64)
        .map(|i| {
            rawdoc! {
                "_id": 1_700_000_000_000 + i,
                "name": format!("user-{i}"),
                "tags": ["a", "b"],
                "address": {"city": "Lyon", "zip": "69001"},
            }
        })
        .collect();
    MsgBuilder::new(rawdoc! {"insert": "users", "ordered": true, "$db": "app"})
        .sequence(Sequence::new("documents", docs))
        .encode(3, 0)
}

fn workloads(c: &mut Criterion) {
    let policy = Policy::standard();
    let ctx = RequestContext::default();
    for (name, frame, elements) in [
        ("find", find(), 1u64),
        ("update_100", update_batch(), 100),
        ("insert_1000", insert_batch(), 1000),
    ] {
        let mut group = c.benchmark_group(format!("policy/{name}"));
        group.throughput(Throughput::Elements(elements));
        group.bench_function("parse_view_evaluate", |b| {
            b.iter(|| {
                let msg = Message::parse(black_box(&frame), DEFAULT_MAX_MESSAGE_SIZE)
                    .expect("a valid frame");
                let view = CommandView::from_message(&msg).expect("a readable command");
                let decision = policy.evaluate(&view, &ctx);
                black_box(decision.violations.len())
            })
        });
        let msg = Message::parse(&frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
        let view = CommandView::from_message(&msg).expect("a readable command");
        assert!(policy.evaluate(&view, &ctx).violations.is_empty());
        group.bench_function("evaluate", |b| {
            b.iter(|| black_box(policy.evaluate(black_box(&view), &ctx).violations.len()))
        });
        group.finish();
    }
}

criterion_group!(benches, workloads);
criterion_main!(benches);
