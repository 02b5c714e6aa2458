//! The plan guard (Q006 collection-scan, Q007 in-memory-sort) end to end: the Rust driver
//! through mongoguard in front of the stand-in, which answers `explain` with the plan mongod's
//! planner would pick from its indexes (COLLSCAN, IXSCAN, SORT). The first request of a shape
//! is never delayed nor blocked; once the verdict is known the shape is judged by it; an index
//! created through mongoguard makes the verdict stale at once.

mod support;

use std::{sync::Arc, time::Duration};

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::{options::FindOptions, Client, IndexModel};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::{Config, Mode, PlanEnabled, SinkSpec},
};
use mongoguard_standin::{StandIn, StandInConfig};

struct Setup {
    proxy: ProxyHandle,
    standin: StandIn,
    records: std::path::PathBuf,
    _policy: tempfile_path::Guard,
}

mod tempfile_path {
    pub struct Guard(pub std::path::PathBuf);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

async fn setup(tag: &str, mode: Mode, policy: &str) -> Setup {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let policy_path = dir.join(format!("mg-plan-{tag}-{pid}.toml"));
    std::fs::write(&policy_path, policy).unwrap();
    let records = dir.join(format!("mg-plan-{tag}-{pid}.jsonl"));
    let _ = std::fs::remove_file(&records);
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.proxy.mode = mode;
    cfg.auth.allow_unauthenticated = true;
    cfg.plan.enabled = PlanEnabled::On;
    cfg.policy.file = Some(policy_path.clone());
    cfg.audit.sink = SinkSpec::File(records.clone());
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    Setup {
        proxy,
        standin,
        records,
        _policy: tempfile_path::Guard(policy_path),
    }
}

async fn records(s: &Setup, rule: &str) -> Vec<serde_json::Value> {
    s.proxy.audit().flush().await;
    std::fs::read_to_string(&s.records)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["rule"] == rule)
        .collect()
}

/// Retries `f` until it returns true (the explain runs in the background), bounded.
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_scans_are_blocked_once_known_and_an_index_clears_them() {
    let s = setup(
        "block",
        Mode::Passthrough,
        "extends = \"standard\"\n[rules]\nQ006 = \"block\"\nQ007 = \"warn\"\n",
    )
    .await;
    let client = Client::with_uri_str(format!("mongodb://{}", s.proxy.local_addr()))
        .await
        .unwrap();
    let coll = client.database("plans").collection::<Document>("orders");
    coll.insert_many((0..20).map(|i| doc! {"customer": i % 5, "total": i}))
        .await
        .unwrap();
    // The first request of the shape: allowed at once (nothing is known yet).
    let first: Vec<Document> = coll
        .find(doc! {"customer": 3})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(first.len(), 4);
    // Once the explain answered (COLLSCAN: no index on customer), the shape is blocked.
    until("the COLLSCAN verdict never arrived", || {
        let coll = coll.clone();
        async move {
            match coll.find(doc! {"customer": 1}).await {
                Err(e) => code(&e) == Some(65_001),
                Ok(_) => false,
            }
        }
    })
    .await;
    let err = coll.find(doc! {"customer": 2}).await.unwrap_err();
    assert!(err.to_string().contains("Q006"), "{err}");
    let recs = records(&s, "Q006").await;
    let last = recs.last().expect("a Q006 record");
    assert!(
        last.to_string().contains("COLLSCAN"),
        "the record names the plan: {last}"
    );
    // /shapes shows the verdict.
    let admin = s.proxy.admin_addr().unwrap();
    let shapes = support::http_get(admin, "/shapes").await;
    assert!(shapes.contains("COLLSCAN"), "{shapes}");
    // An index created through mongoguard makes the verdict stale at once; the next explain
    // finds the IXSCAN and the shape is allowed again.
    coll.create_index(IndexModel::builder().keys(doc! {"customer": 1}).build())
        .await
        .unwrap();
    until("the shape stayed blocked after createIndexes", || {
        let coll = coll.clone();
        async move { coll.find(doc! {"customer": 4}).await.is_ok() }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for c in 0..5 {
        let got: Vec<Document> = coll
            .find(doc! {"customer": c})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(got.len(), 4);
    }
    let shapes = support::http_get(admin, "/shapes").await;
    assert!(shapes.contains("IXSCAN customer_1"), "{shapes}");
    // The explains ran on mongoguard's own connection, not on the clients'.
    assert!(s.standin.stats().command_count("explain") >= 2);
    client.shutdown().await;
    s.proxy.shutdown().await;
}

/// Pooled mode, the standard profile (warn): a sort no index gives is Q007, recorded, never
/// blocked; the same sort after an index with that order is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_sorts_are_recorded_in_pooled_mode() {
    let s = setup("sort", Mode::Pooled, "extends = \"standard\"\n").await;
    let client = Client::with_uri_str(format!("mongodb://{}", s.proxy.local_addr()))
        .await
        .unwrap();
    let coll = client.database("plans").collection::<Document>("events");
    coll.create_index(IndexModel::builder().keys(doc! {"kind": 1}).build())
        .await
        .unwrap();
    coll.insert_many((0..10).map(|i| doc! {"kind": i % 2, "at": i}))
        .await
        .unwrap();
    let sorted = |c: mongodb::Collection<Document>| async move {
        let opts = FindOptions::builder().sort(doc! {"at": -1}).build();
        c.find(doc! {"kind": 1})
            .with_options(opts)
            .await
            .unwrap()
            .try_collect::<Vec<Document>>()
            .await
            .unwrap()
    };
    assert_eq!(sorted(coll.clone()).await.len(), 5);
    let s_ref = &s;
    until("no Q007 record", || {
        let coll = coll.clone();
        async move {
            assert_eq!(sorted(coll).await.len(), 5, "warn never blocks");
            !records(s_ref, "Q007").await.is_empty()
        }
    })
    .await;
    assert!(
        records(&s, "Q006").await.is_empty(),
        "an IXSCAN is no collection scan"
    );
    let q007 = records(&s, "Q007").await;
    assert!(q007[0].to_string().contains("SORT"), "{}", q007[0]);
    // An index with the equality field then the sort field gives the order.
    coll.create_index(
        IndexModel::builder()
            .keys(doc! {"kind": 1, "at": -1})
            .build(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        sorted(coll.clone()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = records(&s, "Q007").await.len();
    for _ in 0..3 {
        sorted(coll.clone()).await;
    }
    assert_eq!(
        records(&s, "Q007").await.len(),
        before,
        "the new index gives the order: no more Q007"
    );
    client.shutdown().await;
    s.proxy.shutdown().await;
}

/// `plan.enabled = "auto"` in passthrough without credentials: off (said at startup), and
/// no explain is ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_without_credentials_keeps_the_plan_guard_off() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.audit.sink = SinkSpec::None;
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let client = Client::with_uri_str(format!("mongodb://{}", proxy.local_addr()))
        .await
        .unwrap();
    let coll = client.database("plans").collection::<Document>("c");
    for i in 0..5 {
        coll.find(doc! {"x": i}).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(standin.stats().command_count("explain"), 0);
    client.shutdown().await;
    proxy.shutdown().await;
}

/// I002: the collection's index count is read with listIndexes when it is first queried and
/// kept current from the createIndexes mongoguard forwards: the 11th index warns (recorded,
/// created), the 21st is blocked (standard profile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_indexes_warn_then_block() {
    let s = setup("indexes", Mode::Pooled, "extends = \"standard\"\n").await;
    let client = Client::with_uri_str(format!("mongodb://{}", s.proxy.local_addr()))
        .await
        .unwrap();
    let coll = client.database("plans").collection::<Document>("wide");
    coll.insert_one(doc! {"f0": 0}).await.unwrap();
    coll.find(doc! {"f0": 0}).await.unwrap();
    // The count (1: _id) is fetched off the request path.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut blocked_at = None;
    for i in 1..=21 {
        let r = coll
            .create_index(
                IndexModel::builder()
                    .keys(doc! {format!("f{i}"): 1})
                    .build(),
            )
            .await;
        match r {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(code(&e), Some(65_001), "{e}");
                assert!(e.to_string().contains("I002"), "{e}");
                blocked_at = Some(i + 1);
                break;
            }
        }
    }
    assert_eq!(blocked_at, Some(21), "the 21st index (with _id) is blocked");
    let recs = records(&s, "I002").await;
    assert!(recs.iter().any(|r| r["action"] == "warn"), "{recs:?}");
    assert!(recs.iter().any(|r| r["action"] == "block"), "{recs:?}");
    // Every warning is counted (the records of identical ones are deduplicated).
    let counted = s.proxy.audit().counters().rule_count(
        "I002",
        mongoguard::audit::Action::Warn,
        mongoguard::audit::Mode::Enforce,
    );
    assert_eq!(counted, 10, "the 11th to the 20th index warned");
    assert_eq!(s.standin.stats().command_count("createindexes"), 19);
    client.shutdown().await;
    s.proxy.shutdown().await;
}

/// Q008 with a shard key declared in `[plan] shard_keys`: a filter without the key's first
/// field (or with only a range on it) is blocked by this policy; equality or $in passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_without_the_shard_key() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut cfg = Config::for_upstream(&standin.uri()).unwrap();
    cfg.plan.shard_keys = [("shop.orders".to_owned(), vec!["customer".to_owned()])].into();
    let policy = std::env::temp_dir().join(format!("mg-plan-q008-{}.toml", std::process::id()));
    std::fs::write(
        &policy,
        "extends = \"standard\"\n[rules]\nQ008 = \"block\"\n",
    )
    .unwrap();
    let _guard = tempfile_path::Guard(policy.clone());
    cfg.policy.file = Some(policy);
    cfg.audit.sink = SinkSpec::None;
    cfg.validate().unwrap();
    let proxy = Proxy::start(Arc::new(cfg)).await.unwrap();
    let client = Client::with_uri_str(format!("mongodb://{}", proxy.local_addr()))
        .await
        .unwrap();
    let orders = client.database("shop").collection::<Document>("orders");
    orders
        .insert_one(doc! {"customer": 1, "total": 5})
        .await
        .unwrap();
    orders.find(doc! {"customer": 1}).await.unwrap();
    orders
        .find(doc! {"customer": {"$in": [1, 2]}, "total": {"$gt": 1}})
        .await
        .unwrap();
    for filter in [doc! {"total": 5}, doc! {"customer": {"$gt": 0}}] {
        let err = orders.find(filter.clone()).await.unwrap_err();
        assert!(err.to_string().contains("Q008"), "{filter}: {err}");
    }
    let err = orders
        .update_many(doc! {"total": 5}, doc! {"$set": {"x": 1}})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Q008"), "{err}");
    // Another collection is not sharded.
    client
        .database("shop")
        .collection::<Document>("carts")
        .find(doc! {"total": 5})
        .await
        .unwrap();
    client.shutdown().await;
    proxy.shutdown().await;
}
