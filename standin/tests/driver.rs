//! Tests with the real Rust driver (mongodb 3.x) connecting straight to the stand-in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;
use mongodb::options::{Acknowledgment, ClientOptions, WriteConcern};
use mongodb::{Client, Collection};
use mongoguard_standin::{Fault, StandIn, StandInConfig};

async fn client(uri: &str) -> Client {
    let mut opts = ClientOptions::parse(uri).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    Client::with_options(opts).unwrap()
}

fn with_params(base: &str, params: &str) -> String {
    format!("{base}/?{params}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_with_the_rust_driver() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    let c = client(&with_params(&s.uri(), "directConnection=true")).await;
    let coll: Collection<Document> = c.database("app").collection("items");

    let docs: Vec<Document> = (0..1000)
        .map(|i| doc! {"i": i, "g": i % 4, "tags": ["x"]})
        .collect();
    let r = coll.insert_many(docs).await.unwrap();
    assert_eq!(r.inserted_ids.len(), 1000);
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1000);

    s.stats().reset();
    let all: Vec<Document> = coll
        .find(doc! {})
        .batch_size(100)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 1000);
    assert_eq!(s.stats().command_count("getMore"), 9);

    let sorted: Vec<Document> = coll
        .find(doc! {"i": {"$gte": 10, "$lt": 20}})
        .sort(doc! {"i": -1})
        .projection(doc! {"_id": 0, "i": 1})
        .limit(3)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(sorted, vec![doc! {"i": 19}, doc! {"i": 18}, doc! {"i": 17}]);

    let r = coll
        .update_one(doc! {"i": 1}, doc! {"$set": {"x": 1}})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    let r = coll
        .update_many(doc! {"g": 1}, doc! {"$inc": {"x": 1}})
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (250, 250));
    let r = coll
        .update_one(doc! {"i": 5000}, doc! {"$set": {"new": true}})
        .upsert(true)
        .await
        .unwrap();
    assert!(r.upserted_id.is_some());
    let r = coll
        .replace_one(doc! {"i": 2}, doc! {"i": 2, "replaced": true})
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);

    let r = coll.delete_one(doc! {"g": 3}).await.unwrap();
    assert_eq!(r.deleted_count, 1);
    let r = coll.delete_many(doc! {"g": 3}).await.unwrap();
    assert_eq!(r.deleted_count, 249);

    let groups: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"g": {"$in": [0, 1, 2]}}},
            doc! {"$group": {"_id": "$g", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ])
        .batch_size(1)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        groups,
        // i = 2 was replaced by a document without g.
        vec![
            doc! {"_id": 0, "n": 250},
            doc! {"_id": 1, "n": 250},
            doc! {"_id": 2, "n": 249}
        ]
    );

    let v = coll
        .find_one_and_update(doc! {"i": 5}, doc! {"$set": {"y": 2}})
        .return_document(mongodb::options::ReturnDocument::After)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.get_i32("y").unwrap(), 2);
    let gone = coll
        .find_one_and_delete(doc! {"i": 8})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gone.get_i32("i").unwrap(), 8);

    let distinct = coll.distinct("g", doc! {}).await.unwrap();
    assert_eq!(distinct.len(), 3); // g = 3 was deleted; docs without g add nothing
    let names = c.database("app").list_collection_names().await.unwrap();
    assert_eq!(names, vec!["items".to_string()]);
    assert!(c
        .list_database_names()
        .await
        .unwrap()
        .contains(&"app".to_string()));
    coll.create_index(mongodb::IndexModel::builder().keys(doc! {"i": 1}).build())
        .await
        .unwrap();
    assert_eq!(coll.list_index_names().await.unwrap(), vec!["_id_", "i_1"]);
    coll.drop().await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_write_then_read() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    // One pooled connection, so the w:0 write and the read are ordered on the wire.
    let c = client(&with_params(
        &s.uri(),
        "directConnection=true&maxPoolSize=1",
    ))
    .await;
    let coll: Collection<Document> = c.database("app").collection("w0");
    // The Rust driver refuses w:0 on CRUD helpers ("Unacknowledged write concerns are not
    // supported"), so send the command itself: without moreToCome the server still replies.
    let reply = c
        .database("app")
        .run_command(doc! {
            "insert": "w0", "documents": [{"_id": 1, "v": "fire-and-forget"}],
            "writeConcern": {"w": 0},
        })
        .await
        .unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 1);
    let w0 = WriteConcern::builder().w(Acknowledgment::Nodes(0)).build();
    let refused = coll.insert_one(doc! {"_id": 2}).write_concern(w0).await;
    assert!(
        refused.is_err(),
        "driver behaviour changed: it now sends w:0 writes"
    );
    let got = coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
    assert_eq!(got.get_str("v").unwrap(), "fire-and-forget");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_compressor() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    for comp in ["zlib", "snappy", "zstd"] {
        s.stats().reset();
        let c = client(&with_params(
            &s.uri(),
            &format!("directConnection=true&compressors={comp}"),
        ))
        .await;
        let coll: Collection<Document> = c.database("comp").collection(comp);
        let docs: Vec<Document> = (0..300)
            .map(|i| doc! {"i": i, "pad": "x".repeat(100)})
            .collect();
        coll.insert_many(docs).await.unwrap();
        let n = coll
            .find(doc! {})
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .len();
        assert_eq!(n, 300, "{comp}");
        assert!(
            s.stats().compressed_messages() >= 2,
            "{comp}: driver did not compress"
        );
        c.shutdown().await;
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_authentication() {
    let cfg = StandInConfig {
        users: vec![("alice".into(), "s3cret".into())],
        ..Default::default()
    };
    let s = StandIn::start(cfg).await.unwrap();
    let host = s.uri().trim_start_matches("mongodb://").to_string();
    for mech in ["SCRAM-SHA-256", "SCRAM-SHA-1"] {
        let before = s.stats().authentications();
        let uri =
            format!("mongodb://alice:s3cret@{host}/?directConnection=true&authMechanism={mech}");
        let c = client(&uri).await;
        let coll: Collection<Document> = c.database("sec").collection("c");
        coll.insert_one(doc! {"m": mech}).await.unwrap();
        assert!(coll.find_one(doc! {"m": mech}).await.unwrap().is_some());
        assert!(s.stats().authentications() > before, "{mech}");
        c.shutdown().await;
    }
    // Default mechanism negotiation (saslSupportedMechs + speculative authentication).
    let c = client(&format!(
        "mongodb://alice:s3cret@{host}/?directConnection=true"
    ))
    .await;
    c.database("sec")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    c.database("sec")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap();

    // Wrong password.
    let bad = client(&format!(
        "mongodb://alice:nope@{host}/?directConnection=true"
    ))
    .await;
    let err = bad
        .database("sec")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Authentication failed"), "{err}");

    // No credentials: ping is allowed, data commands are not.
    let anon = client(&format!("mongodb://{host}/?directConnection=true")).await;
    anon.database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    let err = anon
        .database("sec")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap_err();
    match *err.kind {
        mongodb::error::ErrorKind::Command(ref e) => {
            assert_eq!((e.code, e.code_name.as_str()), (13, "Unauthorized"))
        }
        ref other => panic!("unexpected error {other:?}"),
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_clients() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    let uri = with_params(&s.uri(), "directConnection=true&maxPoolSize=2");
    let mut tasks = Vec::new();
    for t in 0..200 {
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            let c = client(&uri).await;
            let coll: Collection<Document> = c.database("load").collection("c");
            let docs: Vec<Document> = (0..10).map(|i| doc! {"t": t, "i": i}).collect();
            coll.insert_many(docs).await.unwrap();
            let n = coll.count_documents(doc! {"t": t}).await.unwrap();
            let found: Vec<Document> = coll
                .find(doc! {"t": t})
                .batch_size(3)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            c.shutdown().await;
            (n, found.len())
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), (10, 10));
    }
    let c = client(&uri).await;
    let total = c
        .database("load")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(total, 2000);
    assert!(s.stats().connections_accepted() >= 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_set_mode_and_transactions() {
    let cfg = StandInConfig {
        replica_set: Some("rs0".into()),
        ..Default::default()
    };
    let s = StandIn::start(cfg).await.unwrap();
    let c = client(&with_params(&s.uri(), "replicaSet=rs0")).await;
    let hello = c
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    assert_eq!(hello.get_str("setName").unwrap(), "rs0");
    let me = s.uri().trim_start_matches("mongodb://").to_string();
    assert_eq!(hello.get_str("primary").unwrap(), me);
    let coll: Collection<Document> = c.database("rs").collection("c");
    let mut session = c.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    coll.insert_one(doc! {"in": "txn"})
        .session(&mut session)
        .await
        .unwrap();
    session.commit_transaction().await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_monitoring_uses_awaitable_hello() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut opts = ClientOptions::parse(with_params(&s.uri(), "directConnection=true"))
        .await
        .unwrap();
    opts.heartbeat_freq = Some(Duration::from_millis(500));
    // Awaited heartbeats the driver saw succeed: its streaming (awaitable) hello reached the
    // stand-in and was answered at least once, and the stream goes on.
    let awaited = Arc::new(AtomicUsize::new(0));
    let seen = awaited.clone();
    opts.sdam_event_handler = Some(EventHandler::callback(move |e: SdamEvent| {
        if let SdamEvent::ServerHeartbeatSucceeded(hb) = e {
            if hb.awaited {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }
    }));
    let c = Client::with_options(opts).unwrap();
    c.database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while awaited.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the driver never got an awaited (streaming) heartbeat");
    let st = s.stats();
    // The monitor's streaming hello keeps producing replies without new requests, so the
    // request count stays low while the connection stays busy.
    assert!(st.command_count("hello") + st.command_count("ismaster") >= 2);
    let t0 = std::time::Instant::now();
    s.shutdown().await;
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "shutdown must not wait for the stream"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_sees_faults() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut opts = ClientOptions::parse(with_params(&s.uri(), "directConnection=true"))
        .await
        .unwrap();
    opts.server_selection_timeout = Some(Duration::from_millis(800));
    opts.connect_timeout = Some(Duration::from_millis(500));
    opts.retry_reads = Some(false);
    opts.retry_writes = Some(false);
    let c = Client::with_options(opts).unwrap();
    let db = c.database("f");
    db.run_command(doc! {"ping": 1}).await.unwrap();

    s.set_fault(Fault::GarbageReply);
    assert!(db.run_command(doc! {"ping": 1}).await.is_err());
    s.set_fault(Fault::CloseAfter(0));
    assert!(db.run_command(doc! {"ping": 1}).await.is_err());
    s.set_fault(Fault::Stall);
    let stalled =
        tokio::time::timeout(Duration::from_millis(500), db.run_command(doc! {"ping": 1})).await;
    assert!(stalled.is_err(), "a stalled server must not answer");
    s.set_fault(Fault::Delay(Duration::from_millis(300)));
    let t0 = std::time::Instant::now();
    db.run_command(doc! {"ping": 1}).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(300));
    s.set_fault(Fault::CloseImmediately);
    let fresh = client(&with_params(
        &s.uri(),
        "directConnection=true&serverSelectionTimeoutMS=800",
    ))
    .await;
    assert!(fresh
        .database("f")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());
    s.set_fault(Fault::None);
    let fresh = client(&with_params(&s.uri(), "directConnection=true")).await;
    fresh
        .database("f")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    s.shutdown().await;
}
