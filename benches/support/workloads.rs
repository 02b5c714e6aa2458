//! Request workloads shared by the policy benchmarks (benches/policy.rs) and the
//! zero-allocation test (tests/alloc_free.rs), so both measure the same frames.

use bson::{rawdoc, RawDocumentBuf};
use bytes::Bytes;
use mongoguard::wire::builder::{MsgBuilder, Sequence};

/// A typical driver `find`.
pub fn find() -> Bytes {
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
pub fn update_batch() -> Bytes {
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
pub fn insert_batch() -> Bytes {
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
