//! Raw wire-protocol tests: opcodes, flags, exhaust, legacy ops, errors and faults.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use common::*;
use mongoguard_standin::{Fault, StandIn, StandInConfig};

async fn standin() -> StandIn {
    StandIn::start(StandInConfig::default()).await.unwrap()
}

#[tokio::test]
async fn op_msg_basics_and_errors() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let r = c.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get("ok"), Some(&Bson::Double(1.0)));

    let r = c.command(doc! {"frobnicate": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").unwrap(), 0.0);
    assert_eq!(r.get_i32("code").unwrap(), 59);
    assert_eq!(r.get_str("codeName").unwrap(), "CommandNotFound");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "no such command: 'frobnicate'"
    );

    // Document sequence + checksum.
    let id = c.next_id();
    let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i}).collect();
    c.send(&op_msg(
        id,
        CHECKSUM,
        &doc! {"insert": "c", "$db": "d"},
        Some(("documents", &docs)),
    ))
    .await;
    let r = c.read().await;
    assert_eq!(r.response_to, id);
    assert_eq!(r.doc().get_i32("n").unwrap(), 5);

    // moreToCome: no reply; the write is applied (same connection, so ordered).
    let id = c.next_id();
    c.send(&op_msg(
        id,
        MORE_TO_COME,
        &doc! {"insert": "c", "documents": [{"_id": 99}], "$db": "d", "writeConcern": {"w": 0}},
        None,
    ))
    .await;
    let r = c.command(doc! {"count": "c", "$db": "d"}).await;
    assert_eq!(r.get_i32("n").unwrap(), 6);

    // Duplicate _id.
    let r = c
        .command(doc! {"insert": "c", "documents": [{"_id": 1}, {"_id": 100}], "$db": "d"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 0);
    let we = r.get_array("writeErrors").unwrap();
    assert_eq!(we[0].as_document().unwrap().get_i32("code").unwrap(), 11000);

    // Unsupported filter operator is an error, not a silent mismatch.
    let r = c
        .command(doc! {"find": "c", "filter": {"$where": "true"}, "$db": "d"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 2);

    let stats = s.stats();
    assert_eq!(stats.command_count("insert"), 3);
    assert_eq!(stats.command_count("ping"), 1);
    s.shutdown().await;
}

#[tokio::test]
async fn op_query_hello_and_legacy_ops() {
    // Wire 13 (MongoDB 5.0): mongod 6.0+ no longer serves the legacy opcodes (see
    // tests/strict.rs).
    let s = StandIn::start(StandInConfig {
        wire_version: 13,
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let mut c = Raw::connect(s.addr()).await;
    for name in ["isMaster", "ismaster", "hello"] {
        let id = c.next_id();
        let q =
            doc! {"$query": {name: 1.0, "helloOk": true}, "$readPreference": {"mode": "primary"}};
        c.send(&op_query(id, "admin.$cmd", 0, -1, &q)).await;
        let r = c.read().await;
        assert_eq!((r.op_code, r.response_to), (OP_REPLY, id));
        let d = r.doc();
        assert_eq!(d.get_f64("ok").unwrap(), 1.0);
        assert!(d.get_bool("helloOk").unwrap());
        let primary_key = if name == "hello" {
            "isWritablePrimary"
        } else {
            "ismaster"
        };
        assert!(d.get_bool(primary_key).unwrap());
        assert_eq!(d.get_i32("maxWireVersion").unwrap(), 13);
    }
    // Legacy insert/update/delete: no replies.
    let docs: Vec<Document> = (0..30).map(|i| doc! {"_id": i, "k": i % 2}).collect();
    let id = c.next_id();
    c.send(&op_insert(id, "leg.c", &docs)).await;
    let id = c.next_id();
    c.send(&op_update(
        id,
        "leg.c",
        2,
        &doc! {"k": 1},
        &doc! {"$set": {"odd": true}},
    ))
    .await;
    let id = c.next_id();
    c.send(&op_update(
        id,
        "leg.c",
        1,
        &doc! {"_id": 500},
        &doc! {"$set": {"up": true}},
    ))
    .await;
    let id = c.next_id();
    c.send(&op_delete(id, "leg.c", 1, &doc! {"k": 0})).await;
    let r = c
        .command(doc! {"count": "c", "query": {"odd": true}, "$db": "leg"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 15);
    let r = c.command(doc! {"count": "c", "$db": "leg"}).await;
    assert_eq!(r.get_i32("n").unwrap(), 30);

    // Legacy find + OP_GET_MORE + OP_KILL_CURSORS.
    let id = c.next_id();
    c.send(&op_query(
        id,
        "leg.c",
        0,
        10,
        &doc! {"$query": {}, "$orderby": {"_id": 1}},
    ))
    .await;
    let r = c.read().await;
    assert_eq!(r.docs.len(), 10);
    assert_ne!(r.cursor_id, 0);
    let id = c.next_id();
    c.send(&op_get_more(id, "leg.c", 10, r.cursor_id)).await;
    let r2 = c.read().await;
    assert_eq!(r2.response_to, id);
    assert_eq!(r2.docs.len(), 10);
    assert_eq!(r2.cursor_id, r.cursor_id);
    let id = c.next_id();
    c.send(&op_kill_cursors(id, &[r.cursor_id])).await;
    let id = c.next_id();
    c.send(&op_get_more(id, "leg.c", 10, r.cursor_id)).await;
    let r3 = c.read().await;
    assert_eq!(r3.flags & 1, 1, "CursorNotFound flag");

    // Any command through OP_QUERY on db.$cmd.
    let id = c.next_id();
    c.send(&op_query(id, "leg.$cmd", 0, -1, &doc! {"count": "c"}))
        .await;
    assert_eq!(c.read().await.doc().get_i32("n").unwrap(), 30);

    let st = s.stats();
    assert_eq!(st.command_count("op_insert"), 1);
    assert_eq!(st.command_count("op_update"), 2);
    assert_eq!(st.command_count("op_delete"), 1);
    assert_eq!(st.command_count("op_get_more"), 2);
    assert_eq!(st.command_count("op_kill_cursors"), 1);
    assert_eq!(st.command_count("op_query"), 5);
    assert_eq!(st.command_count("ismaster"), 2);
    s.shutdown().await;
}

#[tokio::test]
async fn cursors_getmore_and_exhaust() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let docs: Vec<Bson> = (0..35).map(|i| Bson::Document(doc! {"_id": i})).collect();
    c.command(doc! {"insert": "c", "documents": docs, "$db": "d"})
        .await;
    let r = c
        .command(doc! {"find": "c", "batchSize": 10, "sort": {"_id": -1}, "$db": "d"})
        .await;
    let cur = r.get_document("cursor").unwrap();
    assert_eq!(cur.get_str("ns").unwrap(), "d.c");
    assert_eq!(cur.get_array("firstBatch").unwrap().len(), 10);
    let id = cur.get_i64("id").unwrap();
    assert_ne!(id, 0);

    // Wrong namespace, unknown cursor.
    let r = c
        .command(doc! {"getMore": id, "collection": "other", "$db": "d"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 13);
    let r = c
        .command(doc! {"getMore": 12345i64, "collection": "c", "$db": "d"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 43);
    assert_eq!(r.get_str("codeName").unwrap(), "CursorNotFound");

    // Exhaust getMore: 25 docs left, batches of 10 -> 3 replies, only the last without moreToCome.
    let rid = c.next_id();
    c.send(&op_msg(
        rid,
        EXHAUST_ALLOWED,
        &doc! {"getMore": id, "collection": "c", "batchSize": 10, "$db": "d"},
        None,
    ))
    .await;
    let mut got = 0;
    let mut prev = rid;
    loop {
        let r = c.read().await;
        assert_eq!(r.response_to, prev);
        prev = r.request_id;
        let cur = r.doc().get_document("cursor").unwrap();
        got += cur.get_array("nextBatch").unwrap().len();
        let more = r.flags & MORE_TO_COME != 0;
        assert_eq!(more, cur.get_i64("id").unwrap() != 0);
        if !more {
            break;
        }
    }
    assert_eq!(got, 25);

    // killCursors reply shape.
    let r = c
        .command(doc! {"find": "c", "batchSize": 1, "$db": "d"})
        .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let r = c
        .command(doc! {"killCursors": "c", "cursors": [id, 777i64], "$db": "d"})
        .await;
    assert_eq!(
        r.get_array("cursorsKilled").unwrap(),
        &vec![Bson::Int64(id)]
    );
    assert_eq!(
        r.get_array("cursorsNotFound").unwrap(),
        &vec![Bson::Int64(777)]
    );
    assert!(r.get_array("cursorsAlive").unwrap().is_empty());
    s.shutdown().await;
}

#[tokio::test]
async fn awaitable_hello_streams_and_stops() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let first = c.command(doc! {"hello": 1, "$db": "admin"}).await;
    let tv = first.get_document("topologyVersion").unwrap().clone();
    let rid = c.next_id();
    let t0 = Instant::now();
    c.send(&op_msg(
        rid,
        EXHAUST_ALLOWED,
        &doc! {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 100, "$db": "admin"},
        None,
    ))
    .await;
    for _ in 0..3 {
        let r = c.read().await;
        assert_ne!(r.flags & MORE_TO_COME, 0);
        assert!(r.doc().get_bool("isWritablePrimary").unwrap());
    }
    assert!(t0.elapsed() >= Duration::from_millis(280));
    // A client that goes away ends its stream (and its connection task).
    let mut other = Raw::connect(s.addr()).await;
    let rid = other.next_id();
    other
        .send(&op_msg(rid, EXHAUST_ALLOWED, &doc! {"hello": 1, "topologyVersion": first.get_document("topologyVersion").unwrap().clone(), "maxAwaitTimeMS": 50, "$db": "admin"}, None))
        .await;
    other.read().await;
    assert_eq!(s.stats().connections_open(), 2);
    drop(other);
    let t2 = Instant::now();
    while s.stats().connections_open() != 1 {
        assert!(
            t2.elapsed() < Duration::from_secs(2),
            "stream did not stop after client close"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Shutdown must end the stream promptly.
    let t1 = Instant::now();
    s.shutdown().await;
    assert!(t1.elapsed() < Duration::from_secs(2));
    assert!(c.closed_within(Duration::from_secs(2)).await);
}

#[tokio::test]
async fn malformed_frames_close_the_connection() {
    let s = standin().await;
    for bad in [
        (8i32).to_le_bytes().to_vec(),
        (48_000_001i32).to_le_bytes().to_vec(),
        (-5i32).to_le_bytes().to_vec(),
    ] {
        let mut c = Raw::connect(s.addr()).await;
        let mut frame = bad;
        frame.extend_from_slice(&[0u8; 12]);
        c.send(&frame).await;
        assert!(c.closed_within(Duration::from_secs(2)).await);
    }
    // Bad checksum.
    let mut c = Raw::connect(s.addr()).await;
    let mut f = op_msg(1, CHECKSUM, &doc! {"ping": 1, "$db": "admin"}, None);
    let n = f.len();
    f[n - 1] ^= 0xff;
    c.send(&f).await;
    assert!(c.closed_within(Duration::from_secs(2)).await);
    // The server survives.
    let mut c = Raw::connect(s.addr()).await;
    assert_eq!(
        c.command(doc! {"ping": 1, "$db": "admin"})
            .await
            .get_f64("ok")
            .unwrap(),
        1.0
    );
    s.shutdown().await;
}

#[tokio::test]
async fn fault_close_after() {
    let s = standin().await;
    s.set_fault(Fault::CloseAfter(2));
    let mut c = Raw::connect(s.addr()).await;
    c.command(doc! {"ping": 1, "$db": "admin"}).await;
    c.command(doc! {"ping": 1, "$db": "admin"}).await;
    let id = c.next_id();
    c.send(&op_msg(id, 0, &doc! {"ping": 1, "$db": "admin"}, None))
        .await;
    assert!(c.closed_within(Duration::from_secs(2)).await);
    s.set_fault(Fault::None);
    let mut c = Raw::connect(s.addr()).await;
    c.command(doc! {"ping": 1, "$db": "admin"}).await;
    s.shutdown().await;
}

#[tokio::test]
async fn fault_stall() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    s.set_fault(Fault::Stall);
    c.send(&op_msg(1, 0, &doc! {"ping": 1, "$db": "admin"}, None))
        .await;
    let r = tokio::time::timeout(Duration::from_millis(300), c.read_frame()).await;
    assert!(r.is_err(), "stalled server must not reply");
    assert!(
        !c.closed_within(Duration::from_millis(100)).await,
        "stall keeps the connection open"
    );
    s.set_fault(Fault::None);
    assert_eq!(
        c.command(doc! {"ping": 1, "$db": "admin"})
            .await
            .get_f64("ok")
            .unwrap(),
        1.0
    );
    s.shutdown().await;
}

#[tokio::test]
async fn fault_delay() {
    let s = standin().await;
    s.set_fault(Fault::Delay(Duration::from_millis(250)));
    let mut c = Raw::connect(s.addr()).await;
    let t0 = Instant::now();
    c.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert!(t0.elapsed() >= Duration::from_millis(250));
    s.shutdown().await;
}

#[tokio::test]
async fn fault_garbage_reply() {
    let s = standin().await;
    s.set_fault(Fault::GarbageReply);
    let mut c = Raw::connect(s.addr()).await;
    c.send(&op_msg(1, 0, &doc! {"ping": 1, "$db": "admin"}, None))
        .await;
    let err = tokio::time::timeout(Duration::from_secs(2), c.read_frame())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    s.shutdown().await;
}

#[tokio::test]
async fn fault_close_immediately() {
    let s = standin().await;
    s.set_fault(Fault::CloseImmediately);
    let mut c = Raw::connect(s.addr()).await;
    assert!(c.closed_within(Duration::from_secs(2)).await);
    assert_eq!(s.stats().connections_accepted(), 1);
    s.set_fault(Fault::None);
    let mut c = Raw::connect(s.addr()).await;
    c.command(doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(s.stats().connections_open(), 1);
    s.shutdown().await;
}

#[tokio::test]
async fn compressed_requests_get_compressed_replies() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    for compressor in [1u8, 2, 3] {
        for (cmd, expect_compressed) in [
            (doc! {"ping": 1, "$db": "admin"}, true),
            (doc! {"hello": 1, "$db": "admin"}, false),
        ] {
            let plain = op_msg(c.next_id(), 0, &cmd, None);
            let body = &plain[16..];
            let packed = match compressor {
                1 => snap::raw::Encoder::new().compress_vec(body).unwrap(),
                2 => {
                    use std::io::Write;
                    let mut e =
                        flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                    e.write_all(body).unwrap();
                    e.finish().unwrap()
                }
                _ => zstd::bulk::compress(body, 3).unwrap(),
            };
            let mut f = plain[..16].to_vec();
            f[12..16].copy_from_slice(&2012i32.to_le_bytes());
            f.extend_from_slice(&2013i32.to_le_bytes());
            f.extend_from_slice(&(body.len() as i32).to_le_bytes());
            f.push(compressor);
            f.extend_from_slice(&packed);
            let n = f.len() as i32;
            f[..4].copy_from_slice(&n.to_le_bytes());
            c.send(&f).await;
            let reply = c.read_frame().await.unwrap();
            let op = i32::from_le_bytes(reply[12..16].try_into().unwrap());
            assert_eq!(
                op == 2012,
                expect_compressed,
                "compressor {compressor}, {cmd}"
            );
            if expect_compressed {
                assert_eq!(reply[24], compressor);
            }
        }
    }
    assert_eq!(s.stats().compressed_messages(), 6);
    s.shutdown().await;
}

/// Rough throughput check (run with `--ignored --nocapture`, ideally in release mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_many_connections() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let docs: Vec<Bson> = (0..1000)
        .map(|i| Bson::Document(doc! {"_id": i, "v": "x"}))
        .collect();
    c.command(doc! {"insert": "t", "documents": docs, "$db": "bench"})
        .await;
    let conns = 200;
    let per_conn = 500;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..conns {
        let addr = s.addr();
        tasks.push(tokio::spawn(async move {
            let mut c = Raw::connect(addr).await;
            for i in 0..per_conn {
                let id = (k * 7 + i) % 1000;
                let r = c
                    .command(doc! {"find": "t", "filter": {"_id": id}, "$db": "bench"})
                    .await;
                assert_eq!(r.get_f64("ok").unwrap(), 1.0);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = conns * per_conn;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{n} finds over {conns} connections in {secs:.2}s = {:.0} ops/s",
        n as f64 / secs
    );
    s.shutdown().await;
}
