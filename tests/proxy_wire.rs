//! The proxy against bad input and a failing upstream, at the wire level: raw frames from a
//! hand-written client, the stand-in as upstream. Every malformed message gets a clean close,
//! and the proxy keeps serving other clients.

use std::{sync::Arc, time::Duration};

use bson::{rawdoc, RawDocumentBuf};

use futures::StreamExt;
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
    wire::{
        builder::{encode_insert, encode_query, MsgBuilder, Sequence},
        compression::{compress, Compressor},
        Frame, MessageCodec, MsgFlags, OpMsg, OpReply,
    },
};
use mongoguard_standin::{Fault, StandIn, StandInConfig};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::codec::FramedRead;

/// Upper bound on any single wait in these tests: a safety net against hangs, not a
/// performance assertion.
const BOUND: Duration = Duration::from_secs(20);

async fn stack_with(tweak: impl FnOnce(&mut Config)) -> (StandIn, ProxyHandle) {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    tweak(&mut config);
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    (standin, proxy)
}

async fn stack() -> (StandIn, ProxyHandle) {
    stack_with(|_| {}).await
}

struct Raw {
    read: FramedRead<tokio::net::tcp::OwnedReadHalf, MessageCodec>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Raw {
    async fn connect(proxy: &ProxyHandle) -> Raw {
        let s = TcpStream::connect(proxy.local_addr()).await.unwrap();
        let (r, w) = s.into_split();
        Raw {
            read: FramedRead::new(r, MessageCodec::default()),
            write: w,
        }
    }

    /// Connects from the loopback address `from` (any of 127.0.0.0/8 on Linux).
    async fn connect_from(proxy: &ProxyHandle, from: &str) -> Raw {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let s = socket.connect(proxy.local_addr()).await.unwrap();
        let (r, w) = s.into_split();
        Raw {
            read: FramedRead::new(r, MessageCodec::default()),
            write: w,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.unwrap();
    }

    async fn recv(&mut self) -> Option<Frame> {
        match tokio::time::timeout(BOUND, self.read.next()).await {
            Ok(Some(Ok(f))) => Some(f),
            Ok(_) => None,
            Err(_) => panic!("no reply and no close within {BOUND:?}: the proxy hung"),
        }
    }

    async fn command(&mut self, id: i32, body: RawDocumentBuf) -> RawDocumentBuf {
        self.send(&MsgBuilder::new(body).encode(id, 0)).await;
        let reply = self.recv().await.expect("reply");
        assert_eq!(reply.header().response_to, id);
        OpMsg::parse(reply.bytes()).unwrap().body().to_owned()
    }

    /// Expects the proxy to close the connection (EOF, or a reset).
    async fn expect_closed(&mut self) {
        assert!(
            self.recv().await.is_none(),
            "expected the connection to close"
        );
    }
}

fn ok(doc: &RawDocumentBuf) -> bool {
    match doc.get("ok").unwrap() {
        Some(bson::RawBsonRef::Double(d)) => d == 1.0,
        Some(bson::RawBsonRef::Int32(i)) => i == 1,
        _ => false,
    }
}

async fn assert_still_serving(proxy: &ProxyHandle) {
    let mut c = Raw::connect(proxy).await;
    let reply = c.command(1, rawdoc! {"ping": 1, "$db": "admin"}).await;
    assert!(ok(&reply), "ping through the proxy failed: {reply:?}");
}

fn with_length(mut bytes: Vec<u8>, len: i32) -> Vec<u8> {
    bytes[0..4].copy_from_slice(&len.to_le_bytes());
    bytes
}

fn ping() -> Vec<u8> {
    MsgBuilder::new(rawdoc! {"ping": 1, "$db": "admin"})
        .encode(1, 0)
        .to_vec()
}

/// Runs one malformed input on its own connection, then checks the proxy closed it, counted
/// a client protocol error, never forwarded it, and still serves a new client.
async fn rejects(name: &str, bytes: Vec<u8>, half_close: bool) {
    let (standin, proxy) = stack().await;
    let before = standin.stats().messages();
    let mut c = Raw::connect(&proxy).await;
    c.send(&bytes).await;
    if half_close {
        c.write.shutdown().await.unwrap();
    }
    c.expect_closed().await;
    // The session is torn down asynchronously after the close; wait for the counter.
    for _ in 0..200 {
        if proxy.stats().client_protocol_errors.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        proxy.stats().client_protocol_errors.get(),
        1,
        "{name}: not counted as a client protocol error"
    );
    assert_eq!(
        standin.stats().messages(),
        before,
        "{name}: something reached the upstream"
    );
    assert_still_serving(&proxy).await;
}

#[tokio::test]
async fn length_below_16_closes() {
    rejects("short length", with_length(ping(), 15), false).await;
}

#[tokio::test]
async fn length_above_maximum_closes_before_buffering() {
    // Only the header is sent: the proxy must not wait for 48 MB that will never come.
    rejects(
        "huge length",
        with_length(ping(), 48_000_001)[..16].to_vec(),
        false,
    )
    .await;
}

#[tokio::test]
async fn negative_length_closes() {
    rejects("negative length", with_length(ping(), -20), false).await;
}

#[tokio::test]
async fn truncated_frame_closes() {
    let p = ping();
    rejects("truncated", p[..p.len() - 3].to_vec(), true).await;
}

#[tokio::test]
async fn bad_checksum_closes() {
    let mut p = MsgBuilder::new(rawdoc! {"ping": 1, "$db": "admin"})
        .checksum(true)
        .encode(1, 0)
        .to_vec();
    let last = p.len() - 1;
    p[last] ^= 0x5a;
    rejects("bad checksum", p, false).await;
}

#[tokio::test]
async fn lying_uncompressed_size_closes() {
    let mut z = compress(&ping(), Compressor::Zlib).unwrap().to_vec();
    let real = i32::from_le_bytes(z[20..24].try_into().unwrap());
    z[20..24].copy_from_slice(&(real + 100).to_le_bytes());
    rejects("lying uncompressed size", z, false).await;
}

#[tokio::test]
async fn compression_bomb_closes() {
    // 30 MB of zeros in a few KB, declared as 1 KB.
    let big = MsgBuilder::new(rawdoc! {"insert": "c", "$db": "d", "pad": vec![0u8; 30_000_000].iter().map(|_| 'a').collect::<String>()})
        .encode(1, 0);
    let mut z = compress(&big, Compressor::Zstd).unwrap().to_vec();
    z[20..24].copy_from_slice(&1024i32.to_le_bytes());
    rejects("compression bomb", z, false).await;
}

#[tokio::test]
async fn nested_compression_closes() {
    let once = compress(&ping(), Compressor::Snappy).unwrap();
    let twice = compress(&once, Compressor::Snappy).unwrap();
    rejects("nested compression", twice.to_vec(), false).await;
}

#[tokio::test]
async fn duplicate_keys_close() {
    // {"delete": "c", "$db": "d", "$db": "admin"}: the guard and mongod could disagree.
    let mut doc = Vec::new();
    for (k, v) in [("delete", "c"), ("$db", "d"), ("$db", "admin")] {
        doc.push(0x02);
        doc.extend_from_slice(k.as_bytes());
        doc.push(0);
        doc.extend_from_slice(&((v.len() + 1) as i32).to_le_bytes());
        doc.extend_from_slice(v.as_bytes());
        doc.push(0);
    }
    let mut full = ((doc.len() + 5) as i32).to_le_bytes().to_vec();
    full.extend_from_slice(&doc);
    full.push(0);
    let body = RawDocumentBuf::from_bytes(full).unwrap();
    rejects(
        "duplicate keys",
        MsgBuilder::new(body).encode(1, 0).to_vec(),
        false,
    )
    .await;
}

#[tokio::test]
async fn unknown_opcode_closes() {
    let mut p = ping();
    p[12..16].copy_from_slice(&2010i32.to_le_bytes());
    rejects("unknown opcode", p, false).await;
}

#[tokio::test]
async fn unknown_required_flag_closes() {
    let mut p = ping();
    p[16] = 0x08;
    rejects("unknown required flag", p, false).await;
}

#[tokio::test]
async fn garbage_bytes_close() {
    let mut g = vec![0u8; 64];
    g[0..4].copy_from_slice(&64i32.to_le_bytes());
    g[12..16].copy_from_slice(&2013i32.to_le_bytes());
    for (i, b) in g.iter_mut().enumerate().skip(16) {
        *b = (i * 37) as u8;
    }
    rejects("garbage", g, false).await;
}

#[tokio::test]
async fn op_query_hello_gets_op_reply() {
    let (_s, proxy) = stack().await;
    let mut c = Raw::connect(&proxy).await;
    c.send(&encode_query(
        9,
        0,
        "admin.$cmd",
        0,
        -1,
        &rawdoc! {"isMaster": 1},
        None,
    ))
    .await;
    let reply = c.recv().await.unwrap();
    assert_eq!(reply.header().response_to, 9);
    let r = OpReply::parse(reply.bytes()).unwrap();
    let doc = r.documents().next().unwrap();
    assert!(doc.get_bool("ismaster").unwrap());
}

#[tokio::test]
async fn more_to_come_write_then_read_sees_it() {
    let (_s, proxy) = stack().await;
    let mut c = Raw::connect(&proxy).await;
    let insert = MsgBuilder::new(rawdoc! {"insert": "w0", "$db": "mtc", "writeConcern": {"w": 0}})
        .flags(MsgFlags::MORE_TO_COME)
        .sequence(Sequence::new(
            "documents",
            vec![rawdoc! {"_id": 1}, rawdoc! {"_id": 2}],
        ))
        .encode(1, 0);
    c.send(&insert).await;
    let reply = c.command(2, rawdoc! {"count": "w0", "$db": "mtc"}).await;
    assert_eq!(reply.get_i32("n").unwrap(), 2);
}

#[tokio::test]
async fn compressed_request_is_forwarded_as_received() {
    let (standin, proxy) = stack().await;
    let mut c = Raw::connect(&proxy).await;
    c.send(
        &MsgBuilder::new(rawdoc! {"hello": 1, "compression": ["zstd"], "$db": "admin"})
            .encode(1, 0),
    )
    .await;
    c.recv().await.unwrap();
    let find = MsgBuilder::new(rawdoc! {"find": "c", "$db": "z"}).encode(2, 0);
    c.send(&compress(&find, Compressor::Zstd).unwrap()).await;
    let reply = c.recv().await.unwrap();
    assert_eq!(reply.header().response_to, 2);
    assert_eq!(standin.stats().command_count("find"), 1);
}

#[tokio::test]
async fn exhaust_get_more_relays_every_batch() {
    let (_s, proxy) = stack().await;
    let mut c = Raw::connect(&proxy).await;
    let docs: Vec<RawDocumentBuf> = (0..50).map(|i| rawdoc! {"_id": i}).collect();
    let ins = MsgBuilder::new(rawdoc! {"insert": "ex", "$db": "exh"})
        .sequence(Sequence::new("documents", docs))
        .encode(1, 0);
    c.send(&ins).await;
    c.recv().await.unwrap();
    let first = c
        .command(2, rawdoc! {"find": "ex", "$db": "exh", "batchSize": 10})
        .await;
    let cursor = first.get_document("cursor").unwrap();
    let id = cursor.get_i64("id").unwrap();
    assert_ne!(id, 0);
    let gm =
        MsgBuilder::new(rawdoc! {"getMore": id, "collection": "ex", "batchSize": 10, "$db": "exh"})
            .flags(MsgFlags::EXHAUST_ALLOWED)
            .encode(3, 0);
    c.send(&gm).await;
    let mut seen = 10;
    let mut replies = 0;
    loop {
        let f = c.recv().await.expect("exhaust reply");
        replies += 1;
        let m = OpMsg::parse(f.bytes()).unwrap();
        let batch = m
            .body()
            .get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap();
        seen += batch.into_iter().count();
        if !m.flags().more_to_come() {
            break;
        }
    }
    assert_eq!(seen, 50);
    assert!(replies >= 4, "exhaust stream had {replies} replies");
    // The connection is usable after the stream.
    let r = c.command(9, rawdoc! {"ping": 1, "$db": "admin"}).await;
    assert!(ok(&r));
}

#[tokio::test]
async fn unreachable_upstream_gets_a_clean_error_reply() {
    // A port nothing listens on: bind, learn the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = Config::for_upstream(&format!("mongodb://127.0.0.1:{port}")).unwrap();
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let mut c = Raw::connect(&proxy).await;
    let reply = c.command(4, rawdoc! {"hello": 1, "$db": "admin"}).await;
    assert!(!ok(&reply));
    assert_eq!(reply.get_i32("code").unwrap(), 6);
    assert!(reply.get_str("errmsg").unwrap().contains("mongoguard"));
    c.expect_closed().await;
    assert_eq!(proxy.stats().upstream_errors.get(), 1);
}

#[tokio::test]
async fn upstream_closing_mid_session_closes_the_client() {
    let (standin, proxy) = stack().await;
    let mut c = Raw::connect(&proxy).await;
    assert!(ok(&c.command(1, rawdoc! {"ping": 1, "$db": "admin"}).await));
    standin.set_fault(Fault::CloseAfter(1));
    c.send(&ping()).await;
    c.expect_closed().await;
    standin.set_fault(Fault::None);
    assert_still_serving(&proxy).await;
}

#[tokio::test]
async fn garbage_from_upstream_closes_the_client_not_the_proxy() {
    let (standin, proxy) = stack().await;
    standin.set_fault(Fault::GarbageReply);
    let mut c = Raw::connect(&proxy).await;
    c.send(&ping()).await;
    c.expect_closed().await;
    standin.set_fault(Fault::None);
    assert_still_serving(&proxy).await;
    assert!(proxy.stats().upstream_errors.get() >= 1);
}

#[tokio::test]
async fn stalled_upstream_hits_the_reply_timeout() {
    let (standin, proxy) =
        stack_with(|c| c.upstream.reply_timeout = Duration::from_millis(300)).await;
    standin.set_fault(Fault::Stall);
    let mut c = Raw::connect(&proxy).await;
    c.send(&ping()).await;
    c.expect_closed().await;
    standin.set_fault(Fault::None);
    assert_still_serving(&proxy).await;
}

#[tokio::test]
async fn idle_client_is_disconnected() {
    let (_s, proxy) =
        stack_with(|c| c.proxy.client_idle_timeout = Duration::from_millis(200)).await;
    let mut c = Raw::connect(&proxy).await;
    assert!(ok(&c.command(1, rawdoc! {"ping": 1, "$db": "admin"}).await));
    c.expect_closed().await;
}

/// A client over `max_client_connections` gets a MongoDB error naming the limit, in its own
/// opcode family (OP_MSG hello, legacy OP_QUERY isMaster), then the close — not a bare reset.
#[tokio::test]
async fn connection_cap_answers_the_extra_client_with_an_error() {
    let (_s, proxy) = stack_with(|c| c.proxy.max_client_connections = 1).await;
    let mut first = Raw::connect(&proxy).await;
    assert!(ok(&first
        .command(1, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
    let mut second = Raw::connect(&proxy).await;
    let reply = second
        .command(7, rawdoc! {"hello": 1, "$db": "admin"})
        .await;
    assert_eq!(reply.get_i32("code").unwrap(), 6, "{reply:?}");
    assert_eq!(reply.get_str("codeName").unwrap(), "HostUnreachable");
    let errmsg = reply.get_str("errmsg").unwrap();
    assert!(errmsg.contains("max_client_connections = 1"), "{errmsg}");
    assert!(!ok(&reply));
    second.expect_closed().await;

    let mut legacy = Raw::connect(&proxy).await;
    let query = mongoguard::wire::builder::encode_query(
        9,
        0,
        "admin.$cmd",
        0,
        -1,
        &rawdoc! {"isMaster": 1},
        None,
    );
    legacy.send(&query).await;
    let reply = legacy.recv().await.expect("an OP_REPLY");
    assert_eq!(reply.header().response_to, 9);
    let r = OpReply::parse(reply.bytes()).unwrap();
    let doc = r.documents().next().unwrap();
    assert_eq!(doc.get_i32("code").unwrap(), 6);
    legacy.expect_closed().await;

    assert_eq!(proxy.stats().rejected.get(), 2);
    assert!(proxy
        .metrics()
        .encode()
        .contains("mongoguard_connections_refused_total{limit=\"max_client_connections\"} 2"));
    assert!(ok(&first
        .command(2, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
}

/// `pool.max_connections_per_app`: the connection of an application over its limit gets the
/// error in answer to its hello, then is closed; closing one frees a slot.
#[tokio::test]
async fn connections_per_app_are_limited_with_an_error() {
    let (_s, proxy) = stack_with(|c| c.pool.max_connections_per_app = 2).await;
    let hello = |app: &str| {
        MsgBuilder::new(rawdoc! {
            "hello": 1, "client": {"application": {"name": app}, "driver": {"name": "t", "version": "0"}, "os": {"type": "Linux"}},
            "$db": "admin",
        })
        .encode(1, 0)
        .to_vec()
    };
    let mut a = Raw::connect(&proxy).await;
    a.send(&hello("billing")).await;
    assert!(a.recv().await.is_some());
    let mut b = Raw::connect(&proxy).await;
    b.send(&hello("billing")).await;
    assert!(b.recv().await.is_some());
    // Another application is not affected.
    let mut other = Raw::connect(&proxy).await;
    other.send(&hello("reports")).await;
    let reply = other.recv().await.expect("hello reply");
    let body = OpMsg::parse(reply.bytes()).unwrap().body().to_owned();
    assert!(ok(&body), "{body:?}");
    let mut c = Raw::connect(&proxy).await;
    c.send(&hello("billing")).await;
    let reply = c.recv().await.expect("an error reply");
    let body = OpMsg::parse(reply.bytes()).unwrap().body().to_owned();
    assert_eq!(body.get_i32("code").unwrap(), 6, "{body:?}");
    assert!(body
        .get_str("errmsg")
        .unwrap()
        .contains("max_connections_per_app = 2"));
    c.expect_closed().await;
    assert!(proxy
        .metrics()
        .encode()
        .contains("mongoguard_connections_refused_total{limit=\"max_connections_per_app\"} 1"));
    drop(a);
    // The slot frees once the first session has ended.
    let freed = tokio::time::timeout(BOUND, async {
        loop {
            let mut d = Raw::connect(&proxy).await;
            d.send(&hello("billing")).await;
            let reply = d.recv().await.expect("reply");
            let body = OpMsg::parse(reply.bytes()).unwrap().body().to_owned();
            if ok(&body) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(freed.is_ok(), "the slot was never freed");
}

/// `pool.max_connections_per_network`: clients are grouped by network (here /32: one
/// address each, so 127.0.0.2 is another network than 127.0.0.1); the one over its network's
/// limit gets HostUnreachable naming the network in answer to its first message, then the
/// close; another network is not affected; `mongoguard_connections_refused{limit}` counts it.
#[tokio::test]
async fn connections_per_network_are_limited_with_an_error() {
    let (_s, proxy) = stack_with(|c| {
        c.pool.max_connections_per_network = 2;
        c.pool.network_prefix_v4 = 32;
    })
    .await;
    let mut held = Vec::new();
    for i in 0..2 {
        let mut a = Raw::connect_from(&proxy, "127.0.0.1").await;
        assert!(ok(&a.command(i, rawdoc! {"ping": 1, "$db": "admin"}).await));
        held.push(a);
    }
    let mut over = Raw::connect_from(&proxy, "127.0.0.1").await;
    let reply = over.command(5, rawdoc! {"hello": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_i32("code").unwrap(), 6, "{reply:?}");
    let errmsg = reply.get_str("errmsg").unwrap();
    assert!(
        errmsg.contains("client network 127.0.0.1/32")
            && errmsg.contains("max_connections_per_network = 2"),
        "{errmsg}"
    );
    over.expect_closed().await;
    let mut other = Raw::connect_from(&proxy, "127.0.0.2").await;
    assert!(ok(&other
        .command(1, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
    let text = proxy.metrics().encode();
    assert!(
        text.contains(
            "mongoguard_connections_refused_total{limit=\"max_connections_per_network\"} 1"
        ),
        "{text}"
    );
    // A closed connection frees its network's place.
    drop(held.pop());
    let freed = tokio::time::timeout(BOUND, async {
        loop {
            let mut d = Raw::connect_from(&proxy, "127.0.0.1").await;
            if ok(&d.command(1, rawdoc! {"ping": 1, "$db": "admin"}).await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(freed.is_ok(), "the place was never freed");
}

/// Hostile: hundreds of refused clients that send nothing (or a lying length) cost bounded
/// work: each is closed within the refusal timeout, and the admitted client is served
/// throughout.
#[tokio::test]
async fn a_flood_of_refused_silent_clients_is_bounded() {
    let (_s, proxy) = stack_with(|c| c.proxy.max_client_connections = 1).await;
    let mut first = Raw::connect(&proxy).await;
    assert!(ok(&first
        .command(1, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
    let mut silent = Vec::new();
    for i in 0..300 {
        let mut c = Raw::connect(&proxy).await;
        if i % 2 == 0 {
            // A header that claims 64 MiB.
            c.send(&with_length(ping(), 64 << 20)).await;
        }
        silent.push(c);
    }
    assert!(ok(&first
        .command(2, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
    for c in &mut silent {
        c.expect_closed().await;
    }
    assert_eq!(proxy.stats().rejected.get(), 300);
}

#[tokio::test]
async fn client_leaving_mid_request_does_not_disturb_others() {
    let (standin, proxy) = stack().await;
    standin.set_fault(Fault::Delay(Duration::from_millis(300)));
    let mut c = Raw::connect(&proxy).await;
    c.send(&ping()).await;
    drop(c);
    standin.set_fault(Fault::None);
    assert_still_serving(&proxy).await;
}

#[tokio::test]
async fn drain_finishes_in_flight_requests_and_stops_accepting() {
    let (standin, proxy) = stack().await;
    let addr = proxy.local_addr();
    let mut idle = Raw::connect(&proxy).await;
    assert!(ok(&idle
        .command(1, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
    let mut busy = Raw::connect(&proxy).await;
    assert!(ok(&busy
        .command(1, rawdoc! {"ping": 1, "$db": "admin"})
        .await));
    standin.set_fault(Fault::Delay(Duration::from_millis(500)));
    let pings = standin.stats().command_count("ping");
    busy.send(&ping()).await;
    // Drain only once the request has reached the upstream (which holds its reply 500 ms).
    tokio::time::timeout(BOUND, async {
        while standin.stats().command_count("ping") == pings {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the ping never reached the upstream");
    let shutdown = tokio::spawn(proxy.shutdown());
    // The in-flight request completes; then the connection closes.
    let reply = busy
        .recv()
        .await
        .expect("in-flight reply delivered during drain");
    let body = OpMsg::parse(reply.bytes()).unwrap().body().to_owned();
    assert!(ok(&body), "{body:?}");
    busy.expect_closed().await;
    idle.expect_closed().await;
    tokio::time::timeout(BOUND, shutdown)
        .await
        .unwrap()
        .unwrap();
    // After shutdown nothing accepts on the address.
    let mut buf = [0u8; 1];
    match TcpStream::connect(addr).await {
        Err(_) => {}
        Ok(mut s) => assert_eq!(s.read(&mut buf).await.unwrap_or(0), 0),
    }
}

#[tokio::test]
async fn legacy_insert_is_forwarded_without_waiting_for_a_reply() {
    // An upstream that still serves OP_INSERT: MongoDB 5.0 (wire 13). mongod 6.0+ no longer
    // applies it, and neither does the stand-in at its default wire version.
    let standin = StandIn::start(StandInConfig {
        wire_version: 13,
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let mut c = Raw::connect(&proxy).await;
    c.send(&encode_insert(1, 0, "leg.c", &[&rawdoc! {"_id": 1}]))
        .await;
    let reply = c.command(2, rawdoc! {"count": "c", "$db": "leg"}).await;
    assert_eq!(reply.get_i32("n").unwrap(), 1);
    assert_eq!(standin.stats().command_count("op_insert"), 1);
}

#[tokio::test]
async fn a_blocked_command_in_a_transaction_aborts_it_upstream() {
    let (standin, proxy) = stack().await;
    let mut c = Raw::connect(&proxy).await;
    let lsid = rawdoc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }};
    let blocked = c
        .command(
            1,
            rawdoc! {"update": "t", "$db": "txn", "lsid": lsid.clone(), "txnNumber": 3_i64,
            "autocommit": false, "startTransaction": true,
            "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": true}]},
        )
        .await;
    assert_eq!(blocked.get_i32("code").unwrap(), 65001);
    assert!(blocked.get("errorLabels").unwrap().is_none());
    assert_eq!(standin.stats().command_count("update"), 0);
    assert_eq!(standin.stats().command_count("aborttransaction"), 1);
    // Outside a transaction no abort is sent.
    let blocked = c
        .command(
            2,
            rawdoc! {"update": "t", "$db": "txn", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": true}]},
        )
        .await;
    assert_eq!(blocked.get_i32("code").unwrap(), 65001);
    assert_eq!(standin.stats().command_count("aborttransaction"), 1);
    assert!(ok(&c.command(3, rawdoc! {"ping": 1, "$db": "admin"}).await));
}

/// A client that sends a request and then shuts down its write side (a half-close, as a
/// script signalling the end of its input does) still reads: mongod answers it — it marks an
/// operation to be killed on the client's disconnect (POLLRDHUP) only for an exhaust stream
/// (`markKillOnClientDisconnect`, src/mongo/transport/session_workflow.cpp) — so mongoguard
/// relays the reply too, in both modes, for a read and for a write, with the upstream slower
/// than the client's close.
#[tokio::test]
async fn a_half_closed_client_still_gets_its_reply() {
    for pooled in [false, true] {
        let (standin, proxy) = stack_with(|c| {
            if pooled {
                c.proxy.mode = mongoguard::config::Mode::Pooled;
                c.auth.allow_unauthenticated = true;
            }
        })
        .await;
        for (id, body) in [
            (2, rawdoc! {"find": "c", "filter": {}, "$db": "test"}),
            (
                3,
                rawdoc! {"insert": "c", "documents": [{"_id": 1}], "$db": "test"},
            ),
        ] {
            let mut c = Raw::connect(&proxy).await;
            // The upstream connection is ready before the fault.
            assert!(ok(&c.command(1, rawdoc! {"ping": 1, "$db": "admin"}).await));
            standin.set_fault(Fault::Delay(Duration::from_millis(200)));
            c.send(&MsgBuilder::new(body).encode(id, 0)).await;
            c.write.shutdown().await.unwrap();
            let reply = c.recv().await;
            standin.set_fault(Fault::None);
            let reply = reply.unwrap_or_else(|| {
                panic!("pooled {pooled}: request {id}: closed without the reply")
            });
            assert_eq!(reply.header().response_to, id);
            let body = OpMsg::parse(reply.bytes()).unwrap().body().to_owned();
            assert!(ok(&body), "pooled {pooled}: {body:?}");
            c.expect_closed().await;
        }
        assert_still_serving(&proxy).await;
    }
}

/// A client that pipelines several requests and then shuts down its write side gets every
/// reply, in order, in both modes, with the upstream slower than the client's close; the
/// write among them is applied once; nothing is left holding an upstream connection (the
/// proxy serves the next client). Ports from the 27800-27899 range.
#[tokio::test]
async fn a_half_closed_client_that_pipelined_gets_every_reply() {
    for (pooled, base) in [(false, 27_840u16), (true, 27_850u16)] {
        let standin = StandIn::start(StandInConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], base)),
            ..StandInConfig::default()
        })
        .await
        .unwrap();
        let mut config = Config::for_upstream(&standin.uri()).unwrap();
        config.audit.sink = mongoguard::audit::SinkSpec::None;
        config.proxy.listen = std::net::SocketAddr::from(([127, 0, 0, 1], base + 1));
        config.admin.listen = None;
        if pooled {
            config.proxy.mode = mongoguard::config::Mode::Pooled;
            config.auth.allow_unauthenticated = true;
        }
        let proxy = Proxy::start(Arc::new(config)).await.unwrap();
        let mut c = Raw::connect(&proxy).await;
        assert!(ok(&c.command(1, rawdoc! {"ping": 1, "$db": "admin"}).await));
        standin.set_fault(Fault::Delay(Duration::from_millis(200)));
        let mut pipelined = Vec::new();
        for (id, body) in [
            (
                2,
                rawdoc! {"find": "c", "filter": {"_id": 1}, "$db": "test"},
            ),
            (
                3,
                rawdoc! {"insert": "c", "documents": [{"_id": 7}], "$db": "test"},
            ),
            (
                4,
                rawdoc! {"find": "c", "filter": {"_id": 7}, "$db": "test"},
            ),
        ] {
            pipelined.extend_from_slice(&MsgBuilder::new(body).encode(id, 0));
        }
        c.send(&pipelined).await;
        c.write.shutdown().await.unwrap();
        for id in [2, 3, 4] {
            let reply = c
                .recv()
                .await
                .unwrap_or_else(|| panic!("pooled {pooled}: request {id}: closed without it"));
            assert_eq!(reply.header().response_to, id, "pooled {pooled}");
            let body = OpMsg::parse(reply.bytes()).unwrap().body().to_owned();
            assert!(ok(&body), "pooled {pooled}: {body:?}");
        }
        c.expect_closed().await;
        standin.set_fault(Fault::None);
        assert_eq!(
            standin.stats().command_count("insert"),
            1,
            "pooled {pooled}"
        );
        assert_still_serving(&proxy).await;
    }
}
