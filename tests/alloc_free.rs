//! The request path allocates nothing when a command is allowed: parsing the frame, building
//! the command view and evaluating the standard policy, counted by a global allocator.
//!
//! The lib crate forbids `unsafe`; implementing [`GlobalAlloc`] needs it, and an integration
//! test is its own crate, so the (minimal, forwarding) `unsafe` lives here only. Counting is
//! switched on per thread, so the test harness's own threads never pollute a count.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

use bson::rawdoc;
use bytes::Bytes;
use mongoguard::{
    command::CommandView,
    policy::{Policy, RequestContext},
    wire::{builder::MsgBuilder, Message, DEFAULT_MAX_MESSAGE_SIZE},
};

/// Forwards to the system allocator, counting allocations made while the current thread has
/// counting switched on.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator can run while thread-locals are being torn down.
    let on = COUNTING.try_with(Cell::get).unwrap_or(false);
    if on {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counting touches only const-initialised thread-locals that
// never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `alloc` is passed through unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: `ptr` and `layout` came from this allocator, i.e. from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` came from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Parses, views and evaluates `frame` once to warm up, then again while counting; returns
/// the number of allocations of the counted run. Panics unless the command is allowed.
fn allocations(policy: &Policy, frame: &Bytes) -> usize {
    let run = || {
        let msg = Message::parse(frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
        let view = CommandView::from_message(&msg).expect("a readable command");
        let decision = policy.evaluate(&view, &RequestContext::default());
        assert!(decision.violations.is_empty(), "{:?}", decision.violations);
    };
    run();
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    run();
    COUNTING.with(|c| c.set(false));
    COUNT.with(Cell::get)
}

#[path = "../benches/support/workloads.rs"]
mod workloads;
use workloads::{find, insert_batch, update_batch};

#[test]
fn typical_find_allocates_nothing() {
    let policy = Policy::standard();
    assert_eq!(allocations(&policy, &find()), 0);
}

#[test]
fn hundred_statement_update_allocates_nothing() {
    let policy = Policy::standard();
    assert_eq!(allocations(&policy, &update_batch()), 0);
}

#[test]
fn thousand_document_insert_allocates_nothing() {
    let policy = Policy::standard();
    assert_eq!(allocations(&policy, &insert_batch()), 0);
}

#[test]
fn strict_profile_allocates_nothing_on_conventional_names() {
    let policy = Policy::profile("strict").expect("a shipped profile");
    let frame = MsgBuilder::new(rawdoc! {
        "find": "t_users",
        "filter": {"status": "active"},
        "$db": "db_app",
    })
    .encode(4, 0);
    assert_eq!(allocations(&policy, &frame), 0);
}

#[test]
fn aggregate_with_nested_pipelines_allocates_nothing() {
    let policy = Policy::standard();
    let frame = MsgBuilder::new(rawdoc! {
        "aggregate": "orders",
        "pipeline": [
            {"$match": {"status": "paid", "total": {"$gt": 100}}},
            {"$lookup": {"from": "items", "as": "items", "let": {"o": "$_id"},
                "pipeline": [{"$match": {"$expr": {"$eq": ["$order", "$$o"]}}}]}},
            {"$facet": {"byDay": [{"$group": {"_id": "$day", "n": {"$sum": 1}}}]}},
        ],
        "cursor": {},
        "$db": "app",
    })
    .encode(6, 0);
    assert_eq!(allocations(&policy, &frame), 0);
}

/// The counter itself works: a violation allocates the decision's list.
#[test]
fn the_counter_sees_allocations() {
    let policy = Policy::standard();
    let frame = MsgBuilder::new(rawdoc! {
        "find": "users",
        "filter": {"a": {"$ne": 1}},
        "$db": "app",
    })
    .encode(5, 0);
    let msg = Message::parse(&frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
    let view = CommandView::from_message(&msg).expect("a readable command");
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    let decision = policy.evaluate(&view, &RequestContext::default());
    COUNTING.with(|c| c.set(false));
    assert_eq!(decision.violations.len(), 1);
    assert!(COUNT.with(Cell::get) > 0);
}

/// The admin API's query-shape bookkeeping on the request path (the shape rendered into the
/// session's reused scratch buffer, the table entry of a known shape updated) allocates
/// nothing once the shape has been seen.
#[test]
fn known_query_shape_bookkeeping_allocates_nothing() {
    use mongoguard::metrics::{ShapeScratch, ShapeTable};
    let table = ShapeTable::new(16);
    let mut scratch = ShapeScratch::default();
    for frame in [find(), update_batch()] {
        let mut run = || {
            let msg = Message::parse(&frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
            let view = CommandView::from_message(&msg).expect("a readable command");
            scratch.reset();
            scratch.capture(&view);
            assert!(scratch.active);
            table.record(&scratch, 42, false);
        };
        run();
        COUNT.with(|c| c.set(0));
        COUNTING.with(|c| c.set(true));
        run();
        COUNTING.with(|c| c.set(false));
        assert_eq!(COUNT.with(Cell::get), 0);
    }
    assert_eq!(table.len(), 2);
}

/// The learned allowlist on the request path: a shape already learned (learn mode) or listed
/// (enforce mode) costs a hash lookup and allocates nothing.
#[test]
fn known_allowlisted_shape_allocates_nothing() {
    use mongoguard::allowlist::Allowlist;
    use mongoguard::config::{AllowlistConfig, AllowlistMode};
    use mongoguard::metrics::ShapeScratch;
    let dir = std::env::temp_dir().join(format!("mg-alloc-allowlist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("allowlist.toml");
    let _ = std::fs::remove_file(&file);
    let config = |mode| AllowlistConfig {
        mode,
        file: Some(file.clone()),
        ..AllowlistConfig::default()
    };
    let policy = Policy::from_toml("[rules]\nA001 = \"block\"\n", "test").unwrap();
    let rctx = RequestContext {
        app: Some("billing"),
        ..RequestContext::default()
    };
    let mut scratch = ShapeScratch::default();
    let mut count = |list: &Allowlist, frame: &Bytes| {
        let mut run = || {
            let msg = Message::parse(frame, DEFAULT_MAX_MESSAGE_SIZE).expect("a valid frame");
            let view = CommandView::from_message(&msg).expect("a readable command");
            scratch.reset();
            scratch.capture(&view);
            assert!(scratch.active);
            assert!(list.check(&policy, &view, &rctx, &scratch).is_none());
        };
        run();
        COUNT.with(|c| c.set(0));
        COUNTING.with(|c| c.set(true));
        run();
        COUNTING.with(|c| c.set(false));
        COUNT.with(Cell::get)
    };
    let learner = Allowlist::start(&config(AllowlistMode::Learn)).unwrap();
    for frame in [find(), update_batch()] {
        assert_eq!(count(&learner, &frame), 0, "learn mode, a known shape");
    }
    assert_eq!(learner.counts(), (1, 2));
    assert!(learner.save());
    let enforcer = Allowlist::start(&config(AllowlistMode::Enforce)).unwrap();
    for frame in [find(), update_batch()] {
        assert_eq!(count(&enforcer, &frame), 0, "enforce mode, a listed shape");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
