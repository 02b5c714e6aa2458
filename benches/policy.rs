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
    wire::{Message, DEFAULT_MAX_MESSAGE_SIZE},
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

criterion_group!(benches, workloads);
criterion_main!(benches);
