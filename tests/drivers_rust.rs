//! The MongoDB Rust driver through mongoguard (passthrough mode).
//!
//! Every test starts its own proxy, works in its own database and, after going through the
//! proxy, checks through a direct connection to the upstream that the data is exactly what was
//! written. By default the upstream is an in-process `mongoguard-standin`; with
//! `MONGOGUARD_TEST_UPSTREAM=mongodb://HOST:PORT` set, the same tests run unchanged against a
//! real mongod (see `integration/run.sh`). A check that needs the stand-in's counters is then
//! reported on stderr as `SKIPPED: <check>: <why>` (and appended to `$MONGOGUARD_SKIP_LOG`,
//! which `integration/run.sh` counts), never passed silently; the replica-set test always
//! starts its own stand-in.
//!
//! Two things the driver cannot be made to do are sent by hand over raw OP_MSG
//! (`support::raw`): the Rust driver refuses unacknowledged writes ("Unacknowledged write
//! concerns are not supported"), so the w:0 / `moreToCome` write is hand-made, and it never
//! requests exhaust cursors, so the `exhaustAllowed` getMore stream is hand-made too.

mod support;

use std::time::Duration;

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::Collection;
use mongoguard_standin::StandInConfig;

use support::raw::{RawConn, EXHAUST_ALLOWED, MORE_TO_COME};
use support::{eventually, num, stack, unique_db, Probe, Stack};

const N: i32 = 1_000;
const BATCH: u32 = 100;

/// The document `i` as first inserted.
fn original_doc(i: i32) -> Document {
    doc! {
        "_id": i,
        "n": i,
        "group": i % 10,
        "tag": format!("doc-{i:04}"),
        "nested": { "sq": i64::from(i) * i64::from(i), "list": [i, i + 1, i + 2] },
    }
}

/// What the collection must hold after [`crud_scenario`], sorted by `_id`.
fn expected_after_crud() -> Vec<Document> {
    (0..N)
        .filter(|i| i % 10 != 7)
        .map(|i| {
            let mut d = original_doc(i);
            if i == 5 {
                d.insert("updated", true);
            }
            if i % 10 == 3 {
                d.insert("flag", "g3");
            }
            d
        })
        .collect()
}

async fn all_sorted(coll: &Collection<Document>) -> Vec<Document> {
    coll.find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("iterate cursor")
}

/// The whole CRUD scenario through the proxy, checked afterwards through a direct connection.
async fn crud_scenario(stack: &Stack, probe: &Probe, db_name: &str) {
    let coll = probe
        .client
        .database(db_name)
        .collection::<Document>("docs");

    // insert_many: 1,000 documents (the driver splits by maxWriteBatchSize / message size).
    let docs: Vec<Document> = (0..N).map(original_doc).collect();
    let inserted = coll.insert_many(&docs).await.expect("insert_many");
    assert_eq!(inserted.inserted_ids.len(), N as usize);

    // A find with batchSize 100 crosses several getMore batches and returns everything, intact.
    let get_mores_before = probe.command_count("getMore");
    let found: Vec<Document> = coll
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .batch_size(BATCH)
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("iterate find cursor");
    assert_eq!(found.len(), N as usize);
    assert!(found == docs, "find returned other documents than inserted");
    let get_mores = probe.command_count("getMore") - get_mores_before;
    assert!(
        get_mores >= (N as usize / BATCH as usize) - 1,
        "expected at least 9 getMore batches, the driver sent {get_mores}"
    );

    // update_one / update_many: matched and modified counts.
    let r = coll
        .update_one(doc! { "_id": 5 }, doc! { "$set": { "updated": true } })
        .await
        .expect("update_one");
    assert_eq!(
        (r.matched_count, r.modified_count),
        (1, 1),
        "update_one {r:?}"
    );
    let r = coll
        .update_one(doc! { "_id": -1 }, doc! { "$set": { "updated": true } })
        .await
        .expect("update_one no match");
    assert_eq!(
        (r.matched_count, r.modified_count),
        (0, 0),
        "update_one none {r:?}"
    );
    assert!(r.upserted_id.is_none());
    let r = coll
        .update_many(doc! { "group": 3 }, doc! { "$set": { "flag": "g3" } })
        .await
        .expect("update_many");
    assert_eq!(
        (r.matched_count, r.modified_count),
        (100, 100),
        "update_many {r:?}"
    );
    // The same update again matches the same documents and modifies none.
    let r = coll
        .update_many(doc! { "group": 3 }, doc! { "$set": { "flag": "g3" } })
        .await
        .expect("update_many no-op");
    assert_eq!(
        (r.matched_count, r.modified_count),
        (100, 0),
        "no-op update_many {r:?}"
    );

    // delete_one / delete_many.
    let r = coll
        .delete_one(doc! { "_id": 7 })
        .await
        .expect("delete_one");
    assert_eq!(r.deleted_count, 1);
    let r = coll
        .delete_many(doc! { "group": 7 })
        .await
        .expect("delete_many");
    assert_eq!(r.deleted_count, 99);
    let r = coll
        .delete_one(doc! { "_id": 7 })
        .await
        .expect("delete_one gone");
    assert_eq!(r.deleted_count, 0);
    let count = coll.count_documents(doc! {}).await.expect("count");
    assert_eq!(count, 900);

    // aggregate: $match / $sort / $limit / $project.
    let pipeline = vec![
        doc! { "$match": { "group": { "$in": [1, 2] } } },
        doc! { "$sort": { "n": -1 } },
        doc! { "$limit": 5 },
        doc! { "$project": { "_id": 0, "n": 1, "group": 1 } },
    ];
    let agg: Vec<Document> = coll
        .aggregate(pipeline)
        .await
        .expect("aggregate")
        .try_collect()
        .await
        .expect("iterate aggregate");
    let want: Vec<Document> = [992, 991, 982, 981, 972]
        .into_iter()
        .map(|n| doc! { "n": n, "group": n % 10 })
        .collect();
    assert_eq!(agg, want, "aggregate result");

    // With the stand-in, its counters show the traffic really went upstream.
    match &stack.standin {
        Some(standin) => {
            let stats = standin.stats();
            assert!(
                stats.command_count("insert") >= 1,
                "no insert reached the stand-in"
            );
            assert!(
                stats.command_count("getMore") as usize >= get_mores,
                "the stand-in saw fewer getMores than the driver sent"
            );
            assert!(stats.command_count("aggregate") >= 1);
        }
        None => {
            support::skipped(
                "crud: insert, getMore and aggregate counted upstream",
                support::NO_STANDIN_COUNTERS,
            );
        }
    }

    // The upstream, seen without the proxy, holds exactly what was written.
    let direct = stack.direct_client().await;
    let direct_coll = direct.database(db_name).collection::<Document>("docs");
    let stored = all_sorted(&direct_coll).await;
    let expected = expected_after_crud();
    assert_eq!(stored.len(), expected.len(), "document count upstream");
    for (got, want) in stored.iter().zip(&expected) {
        assert_eq!(got, want, "document upstream");
    }
    direct.database(db_name).drop().await.expect("drop test db");
    direct.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hello_through_proxy_is_accepted_by_the_driver() {
    let stack = stack().await;
    let probe = stack.proxy_probe("appName=mongoguard-hello-test").await;
    let admin = probe.client.database("admin");
    let hello = admin
        .run_command(doc! { "hello": 1 })
        .await
        .expect("hello through the proxy");
    assert_eq!(num(&hello, "ok"), 1, "{hello}");
    assert!(num(&hello, "maxWireVersion") >= 6, "{hello}");
    for field in [
        "maxBsonObjectSize",
        "maxMessageSizeBytes",
        "maxWriteBatchSize",
    ] {
        assert!(num(&hello, field) > 0, "{field} missing in {hello}");
    }
    let ping = admin.run_command(doc! { "ping": 1 }).await.expect("ping");
    assert_eq!(num(&ping, "ok"), 1);
    // Legacy spellings of hello are answered too.
    for legacy in ["isMaster", "ismaster"] {
        let r = admin
            .run_command(doc! { legacy: 1 })
            .await
            .unwrap_or_else(|e| panic!("{legacy}: {e}"));
        assert_eq!(num(&r, "ok"), 1, "{legacy}: {r}");
    }
    // The driver's own handshake succeeded and no monitoring check failed.
    let handshake = probe.first_heartbeat_reply().await;
    assert_eq!(num(&handshake, "ok"), 1, "{handshake}");
    let names = probe.server_addresses();
    let proxy_addr = stack.proxy.local_addr().to_string();
    assert!(
        names.iter().all(|a| *a == proxy_addr),
        "the driver learnt of servers other than the proxy: {names:?}"
    );
    probe.client.shutdown().await;
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crud_through_proxy() {
    let stack = stack().await;
    let probe = stack.proxy_probe("").await;
    crud_scenario(&stack, &probe, &unique_db("crud")).await;
    probe.client.shutdown().await;
    stack.shutdown().await;
}

async fn compressed_crud(compressor: &str) {
    let stack = stack().await;
    let probe = stack
        .proxy_probe(&format!("compressors={compressor}"))
        .await;
    crud_scenario(&stack, &probe, &unique_db(&format!("crud_{compressor}"))).await;
    // The handshake reply the driver got through the proxy must have accepted the compressor,
    // or every message above went uncompressed and the scenario proved nothing about it.
    let handshake = probe.first_heartbeat_reply().await;
    let negotiated: Vec<&str> = match handshake.get("compression") {
        Some(Bson::Array(a)) => a.iter().filter_map(Bson::as_str).collect(),
        _ => Vec::new(),
    };
    assert_eq!(
        negotiated,
        vec![compressor],
        "handshake reply through the proxy does not negotiate {compressor}: {handshake}"
    );
    probe.client.shutdown().await;
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crud_through_proxy_zlib() {
    compressed_crud("zlib").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crud_through_proxy_snappy() {
    compressed_crud("snappy").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crud_through_proxy_zstd() {
    compressed_crud("zstd").await;
}

/// w:0 writes are sent with moreToCome and get no reply; the proxy must neither wait for one
/// nor hand the next reply to the wrong request. The driver refuses w:0, so this is raw OP_MSG.
#[tokio::test(flavor = "multi_thread")]
async fn unacknowledged_writes_then_read_sees_them() {
    let stack = stack().await;
    let db_name = unique_db("w0");
    let (mut raw, _) = RawConn::connect_with_hello(stack.proxy.local_addr()).await;

    for i in 1..=10 {
        raw.send(
            MORE_TO_COME,
            &doc! {
                "insert": "w0",
                "documents": [ { "_id": format!("w0-{i}"), "v": 1 } ],
                "ordered": true,
                "writeConcern": { "w": 0 },
                "$db": &db_name,
            },
        )
        .await;
    }
    // The connection is still in step: the next command gets its own reply, not a stale one.
    let ping = raw.command(doc! { "ping": 1, "$db": "admin" }).await;
    assert_eq!(num(&ping, "ok"), 1, "{ping}");
    raw.send(
        MORE_TO_COME,
        &doc! {
            "update": "w0",
            "updates": [ { "q": { "_id": "w0-1" }, "u": { "$set": { "v": 2 } } } ],
            "writeConcern": { "w": 0 },
            "$db": &db_name,
        },
    )
    .await;
    raw.send(
        MORE_TO_COME,
        &doc! {
            "delete": "w0",
            "deletes": [ { "q": { "_id": "w0-10" }, "limit": 1 } ],
            "writeConcern": { "w": 0 },
            "$db": &db_name,
        },
    )
    .await;
    let ping = raw.command(doc! { "ping": 1, "$db": "admin" }).await;
    assert_eq!(num(&ping, "ok"), 1, "{ping}");

    match &stack.standin {
        Some(standin) => {
            let stats = standin.stats();
            let ok = eventually(100, Duration::from_millis(100), || async {
                stats.command_count("insert") >= 10
                    && stats.command_count("update") >= 1
                    && stats.command_count("delete") >= 1
            })
            .await;
            assert!(ok, "the w:0 writes did not all reach the stand-in");
        }
        None => {
            support::skipped(
                "w:0: 10 inserts, an update and a delete counted upstream",
                support::NO_STANDIN_COUNTERS,
            );
        }
    }

    let mut expected: Vec<Document> = (1..=9)
        .map(|i| doc! { "_id": format!("w0-{i}"), "v": if i == 1 { 2 } else { 1 } })
        .collect();
    expected.sort_by(|a, b| a.get_str("_id").unwrap().cmp(b.get_str("_id").unwrap()));

    // A read through the proxy (the driver, another connection) sees them, after a bounded
    // number of polls: w:0 gives no ordering guarantee across connections.
    let client = stack.proxy_client("").await;
    let coll = client.database(&db_name).collection::<Document>("w0");
    let seen = eventually(100, Duration::from_millis(100), || async {
        all_sorted(&coll).await == expected
    })
    .await;
    assert!(
        seen,
        "w:0 writes not visible through the proxy: {:?}",
        all_sorted(&coll).await
    );
    // The same read on the raw connection that wrote them.
    let r = raw
        .command(doc! { "find": "w0", "filter": {}, "sort": { "_id": 1 }, "$db": &db_name })
        .await;
    let batch = r
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|e| panic!("find reply {r}: {e}"));
    assert_eq!(batch.len(), 9, "{r}");

    let direct = stack.direct_client().await;
    let stored = all_sorted(&direct.database(&db_name).collection("w0")).await;
    assert_eq!(stored, expected, "w:0 writes upstream");
    direct
        .database(&db_name)
        .drop()
        .await
        .expect("drop test db");
    direct.shutdown().await;
    client.shutdown().await;
    stack.shutdown().await;
}

/// A getMore with exhaustAllowed: the upstream may stream replies flagged moreToCome; the proxy
/// must relay every one of them, then the connection serves the next command.
#[tokio::test(flavor = "multi_thread")]
async fn exhaust_getmore_stream_is_relayed() {
    let stack = stack().await;
    let db_name = unique_db("exhaust");
    let client = stack.proxy_client("").await;
    let docs: Vec<Document> = (0..N).map(original_doc).collect();
    client
        .database(&db_name)
        .collection::<Document>("docs")
        .insert_many(&docs)
        .await
        .expect("insert_many");

    let (mut raw, _) = RawConn::connect_with_hello(stack.proxy.local_addr()).await;
    let first = raw
        .command(doc! {
            "find": "docs", "filter": {}, "sort": { "_id": 1 },
            "batchSize": BATCH as i32, "$db": &db_name,
        })
        .await;
    let cursor = first
        .get_document("cursor")
        .unwrap_or_else(|e| panic!("find reply {first}: {e}"));
    let mut got: Vec<Document> = cursor
        .get_array("firstBatch")
        .expect("firstBatch")
        .iter()
        .map(|b| b.as_document().expect("document").clone())
        .collect();
    assert_eq!(got.len(), BATCH as usize);
    let cursor_id = cursor.get_i64("id").expect("cursor id");
    assert_ne!(cursor_id, 0, "cursor closed after the first batch");

    let request_id = raw
        .send(
            EXHAUST_ALLOWED,
            &doc! {
                "getMore": cursor_id, "collection": "docs",
                "batchSize": BATCH as i32, "$db": &db_name,
            },
        )
        .await;
    let mut replies = 0;
    loop {
        let reply = raw.read().await;
        replies += 1;
        if replies == 1 {
            assert_eq!(reply.response_to, request_id, "first exhaust reply");
        }
        assert_eq!(num(&reply.body, "ok"), 1, "getMore reply {}", reply.body);
        let cursor = reply.body.get_document("cursor").expect("cursor");
        got.extend(
            cursor
                .get_array("nextBatch")
                .expect("nextBatch")
                .iter()
                .map(|b| b.as_document().expect("document").clone()),
        );
        if !reply.more_to_come() {
            assert_eq!(cursor.get_i64("id").expect("id"), 0, "stream ended early");
            break;
        }
        assert!(replies < 100, "exhaust stream does not end");
    }
    assert!(got == docs, "exhaust stream returned other documents");
    assert!(
        replies > 1,
        "the getMore with exhaustAllowed was answered by a single reply: nothing streamed"
    );
    // The connection serves the next command once the stream is over.
    let ping = raw.command(doc! { "ping": 1, "$db": "admin" }).await;
    assert_eq!(num(&ping, "ok"), 1, "{ping}");

    let direct = stack.direct_client().await;
    let n = direct
        .database(&db_name)
        .collection::<Document>("docs")
        .count_documents(doc! {})
        .await
        .expect("count upstream");
    assert_eq!(n, N as u64);
    direct
        .database(&db_name)
        .drop()
        .await
        .expect("drop test db");
    direct.shutdown().await;
    client.shutdown().await;
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_clients() {
    const CLIENTS: i32 = 200;
    let stack = stack().await;
    let db_name = unique_db("concurrent");
    let uri = stack.proxy_uri_with("maxPoolSize=2&serverSelectionTimeoutMS=120000");
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let uri = uri.clone();
        let db_name = db_name.clone();
        tasks.push(tokio::spawn(async move {
            let client = support::client(&uri).await;
            let coll = client.database(&db_name).collection::<Document>("c");
            let doc = doc! { "_id": i, "client": format!("client-{i}") };
            let outcome = async {
                coll.insert_one(&doc).await?;
                coll.find_one(doc! { "_id": i }).await
            }
            .await;
            client.shutdown().await;
            match outcome {
                Ok(Some(found)) if found == doc => Ok(()),
                Ok(other) => Err(format!("client {i}: read back {other:?}")),
                Err(e) => Err(format!("client {i}: {e}")),
            }
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.expect("client task panicked") {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CLIENTS} clients failed: {failures:#?}",
        failures.len()
    );

    let direct = stack.direct_client().await;
    let stored = all_sorted(&direct.database(&db_name).collection("c")).await;
    let expected: Vec<Document> = (0..CLIENTS)
        .map(|i| doc! { "_id": i, "client": format!("client-{i}") })
        .collect();
    assert_eq!(stored, expected);
    direct
        .database(&db_name)
        .drop()
        .await
        .expect("drop test db");
    direct.shutdown().await;
    stack.shutdown().await;
}

/// In front of a replica-set member, the hello a client gets must present the proxy as the only
/// server: no `hosts`, `setName`, `primary` or `me`, or drivers connect around the proxy.
#[tokio::test(flavor = "multi_thread")]
async fn replica_set_hello_is_rewritten() {
    // Always a stand-in in replica-set mode, also when MONGOGUARD_TEST_UPSTREAM names a real
    // mongod (which need not be a replica-set member): this test runs everywhere.
    let stack = support::standin_stack(StandInConfig {
        replica_set: Some("rs0".into()),
        ..Default::default()
    })
    .await;

    // The stand-in really is a replica-set member, seen directly.
    let direct = stack.direct_client().await;
    let direct_hello = direct
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .expect("direct hello");
    assert_eq!(
        direct_hello.get_str("setName").ok(),
        Some("rs0"),
        "the stand-in is not in replica-set mode: {direct_hello}"
    );

    // A client through the proxy with no directConnection (the default discovery mode).
    let uri = support::uri_with(&stack.proxy_uri, "serverSelectionTimeoutMS=30000");
    let probe = Probe::connect(&uri).await;
    let db_name = unique_db("rs");
    let coll = probe.client.database(&db_name).collection::<Document>("c");
    coll.insert_one(doc! { "_id": 1, "v": "rs" })
        .await
        .expect("insert through the proxy without directConnection");
    let back = coll.find_one(doc! { "_id": 1 }).await.expect("find");
    assert_eq!(back, Some(doc! { "_id": 1, "v": "rs" }));

    let hello = probe
        .client
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .expect("hello through the proxy");
    let mut replies = probe.heartbeat_replies();
    assert!(!replies.is_empty(), "no heartbeat recorded");
    replies.push(hello);
    for reply in &replies {
        for field in ["hosts", "setName", "primary", "me", "passives", "arbiters"] {
            assert!(
                !reply.contains_key(field),
                "hello through the proxy carries {field:?}: {reply}"
            );
        }
    }
    let proxy_addr = stack.proxy.local_addr().to_string();
    let servers = probe.server_addresses();
    assert!(
        servers.iter().all(|a| *a == proxy_addr),
        "the driver discovered servers other than the proxy {proxy_addr}: {servers:?}"
    );

    let stored = all_sorted(&direct.database(&db_name).collection("c")).await;
    assert_eq!(stored, vec![doc! { "_id": 1, "v": "rs" }]);
    direct.shutdown().await;
    probe.client.shutdown().await;
    stack.shutdown().await;
}
