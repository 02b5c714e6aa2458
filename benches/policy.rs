//! Micro-benchmarks of the policy engine on the request path: for each workload, the whole
//! per-request work (parse the frame, build the command view, evaluate the standard policy)
//! and `evaluate` alone on a prepared view.
//!
//! Run with `cargo bench --bench policy` (add `-- --warm-up-time 1 --measurement-time 3`
//! for a quick pass). Frames are built once, outside the timed code.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mongoguard::{
    command::CommandView,
    policy::{Policy, RequestContext},
    wire::{
        builder::{MsgBuilder, Sequence},
        Message, DEFAULT_MAX_MESSAGE_SIZE,
    },
};

#[path = "support/workloads.rs"]
mod workloads;
use workloads::{find, insert_batch, update_batch};

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

/// 100,000 documents with string `_id`s: every statement warns D004 (random-id), so the
/// decision has one violation per statement before the per-rule cap.
fn insert_string_ids(n: usize) -> bytes::Bytes {
    let docs: Vec<bson::RawDocumentBuf> = (0..n)
        .map(|i| bson::rawdoc! {"_id": format!("u-{i:08}"), "n": i as i64})
        .collect();
    MsgBuilder::new(bson::rawdoc! {"insert": "users", "ordered": false, "$db": "app"})
        .sequence(Sequence::new("documents", docs))
        .encode(4, 0)
}

/// 100,000 update statements, alternately a narrow multi-document update (an equality on a
/// selective literal) and a single-document update: nothing to measure, nothing fires.
fn update_mixed(n: usize) -> bytes::Bytes {
    let updates: Vec<bson::RawDocumentBuf> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                bson::rawdoc! {
                    "q": {"tenant": format!("t-{i}"), "status": "open"},
                    "u": {"$set": {"seen": true}},
                    "multi": true,
                }
            } else {
                bson::rawdoc! {"q": {"_id": i as i64}, "u": {"$set": {"seen": true}}}
            }
        })
        .collect();
    MsgBuilder::new(bson::rawdoc! {"update": "users", "ordered": false, "$db": "app"})
        .sequence(Sequence::new("updates", updates))
        .encode(5, 0)
}

/// Large batches: evaluation must stay linear in the statements of a batch (issue 11).
fn large_batches(c: &mut Criterion) {
    let policy = Policy::standard();
    let ctx = RequestContext::default();
    const N: usize = 100_000;
    for (name, frame) in [
        ("insert_100k_string_ids", insert_string_ids(N)),
        ("update_100k_narrow_or_single", update_mixed(N)),
    ] {
        let mut group = c.benchmark_group(format!("policy/{name}"));
        group.throughput(Throughput::Elements(N as u64));
        group.sample_size(10);
        let msg = Message::parse(&frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
        let view = CommandView::from_message(&msg).expect("a readable command");
        let d = policy.evaluate(&view, &ctx);
        assert!(!d.is_block(), "{name}: {:?}", d.violations.first());
        assert!(d.measure.is_empty(), "{name}: nothing to measure");
        group.bench_function("evaluate", |b| {
            b.iter(|| black_box(policy.evaluate(black_box(&view), &ctx).violations.len()))
        });
        group.finish();
    }
}

/// The plan guard on the request path (the find workload): capturing the query shape (done
/// for `/shapes` anyway) and the verdict lookup of a known shape, against the capture alone.
fn plan_guard(c: &mut Criterion) {
    use mongoguard::metrics::ShapeScratch;
    use mongoguard::plan::{PlanFacts, PlanGuard, Verdict};
    let frame = find();
    let msg = Message::parse(&frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
    let view = CommandView::from_message(&msg).expect("a readable command");
    let mut scratch = ShapeScratch::default();
    scratch.capture(&view);
    let verdict = Verdict {
        facts: PlanFacts::default(),
        summary: "FETCH + IXSCAN email_1".into(),
        failed: false,
    };
    let key = scratch.plan_key().expect("capture computes the plan key");
    let guard = PlanGuard::seeded(&[(key, "app.users", verdict)]);
    assert!(guard.verdict(key, &view).is_some());
    let mut group = c.benchmark_group("plan_guard/find");
    group.bench_function("capture", |b| {
        b.iter(|| {
            scratch.capture(black_box(&view));
            black_box(scratch.plan_key())
        })
    });
    group.bench_function("capture_and_verdict", |b| {
        b.iter(|| {
            scratch.capture(black_box(&view));
            let key = scratch.plan_key().unwrap_or_default();
            black_box(guard.verdict(key, &view).is_some())
        })
    });
    group.finish();
}

criterion_group!(benches, workloads, large_batches, plan_guard);
criterion_main!(benches);
