//! Multi-member replica sets (shared store, roles, step-downs) and the control commands
//! `standinStats` / `standinStepDown`.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use common::*;
use futures::TryStreamExt;
use mongodb::options::{ClientOptions, ReadPreference, SelectionCriteria};
use mongodb::{Client, Collection};
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};

async fn set3() -> ReplicaSet {
    set3_wire(StandInConfig::default().wire_version).await
}

/// A set claiming `wire_version`: 13 (MongoDB 5.0) for the tests of legacy opcodes, which
/// mongod 6.0+ no longer serves.
async fn set3_wire(wire_version: i32) -> ReplicaSet {
    ReplicaSet::start(ReplicaSetConfig {
        name: "rs0".into(),
        members: 3,
        base: StandInConfig {
            wire_version,
            ..StandInConfig::default()
        },
    })
    .await
    .unwrap()
}

fn ok(d: &Document) -> bool {
    d.get("ok").and_then(Bson::as_f64) == Some(1.0)
}

fn code(d: &Document) -> i32 {
    d.get_i32("code")
        .unwrap_or_else(|_| panic!("no code in {d}"))
}

/// Waits (bounded) for member `i` to be the primary: the end of an election gap.
async fn wait_for_primary(rs: &ReplicaSet, i: usize) {
    let t0 = Instant::now();
    while rs.primary() != Some(i) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "member {i} never became primary (primary: {:?})",
            rs.primary()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn counter(hello: &Document) -> i64 {
    hello
        .get_document("topologyVersion")
        .unwrap()
        .get_i64("counter")
        .unwrap()
}

/// OP_QUERY with flags (the common helper always sends flags 0).
fn op_query_flags(request_id: i32, flags: i32, ns: &str, n_return: i32, q: &Document) -> Vec<u8> {
    let mut f = op_query(request_id, ns, 0, n_return, q);
    f[16..20].copy_from_slice(&flags.to_le_bytes());
    f
}

async fn hello(addr: std::net::SocketAddr) -> Document {
    Raw::connect(addr)
        .await
        .command(doc! {"hello": 1, "$db": "admin"})
        .await
}

#[tokio::test]
async fn roles_shared_data_and_refusals() {
    let rs = set3_wire(13).await;
    assert_eq!(rs.members().len(), 3);
    assert_eq!(rs.primary(), Some(0));
    let hosts: Vec<String> = rs
        .members()
        .iter()
        .map(|m| m.uri().trim_start_matches("mongodb://").to_string())
        .collect();
    assert_eq!(
        rs.uri(),
        format!("mongodb://{}/?replicaSet=rs0", hosts.join(","))
    );

    for (i, m) in rs.members().iter().enumerate() {
        let h = hello(m.addr()).await;
        assert_eq!(h.get_str("setName").unwrap(), "rs0");
        assert_eq!(h.get_i32("setVersion").unwrap(), 1);
        let hs: Vec<&str> = h
            .get_array("hosts")
            .unwrap()
            .iter()
            .filter_map(Bson::as_str)
            .collect();
        assert_eq!(hs, hosts);
        assert_eq!(h.get_str("me").unwrap(), hosts[i]);
        assert_eq!(h.get_str("primary").unwrap(), hosts[0]);
        assert_eq!(h.get_bool("isWritablePrimary").unwrap(), i == 0);
        assert_eq!(h.get_bool("secondary").unwrap(), i != 0);
        assert_eq!(h.contains_key("electionId"), i == 0);
        assert_eq!(counter(&h), 0);
        // Legacy spelling.
        let mut c = Raw::connect(m.addr()).await;
        let im = c.command(doc! {"isMaster": 1, "$db": "admin"}).await;
        assert_eq!(im.get_bool("ismaster").unwrap(), i == 0);
    }

    let mut p = Raw::connect(rs.member(0).addr()).await;
    let mut s = Raw::connect(rs.member(1).addr()).await;
    let r = p
        .command(doc! {"insert": "c", "documents": (0..150).map(|i| doc! {"_id": i}).collect::<Vec<_>>(), "$db": "d"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 150, "{r}");

    // Read on a secondary: refused without secondaryOk, served with a read preference.
    let r = s.command(doc! {"find": "c", "$db": "d"}).await;
    assert_eq!(code(&r), 13435);
    assert_eq!(r.get_str("codeName").unwrap(), "NotPrimaryNoSecondaryOk");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "not primary and secondaryOk=false"
    );
    let r = s
        .command(doc! {"count": "c", "$db": "d", "$readPreference": {"mode": "primary"}})
        .await;
    assert_eq!(code(&r), 13435);
    let r = s
        .command(doc! {"find": "c", "filter": {"_id": 7}, "$db": "d", "$readPreference": {"mode": "secondaryPreferred"}})
        .await;
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1, "{r}");

    // OP_QUERY: the secondaryOk flag (bit 2).
    let id = s.next_id();
    s.send(&op_query_flags(id, 0, "d.$cmd", -1, &doc! {"count": "c"}))
        .await;
    assert_eq!(code(s.read().await.doc()), 13435);
    let id = s.next_id();
    s.send(&op_query_flags(id, 4, "d.$cmd", -1, &doc! {"count": "c"}))
        .await;
    assert_eq!(s.read().await.doc().get_i32("n").unwrap(), 150);
    let id = s.next_id();
    s.send(&op_query_flags(id, 0, "d.c", 0, &doc! {})).await;
    let r = s.read().await;
    assert_eq!(r.flags & 2, 2, "QueryFailure");
    assert_eq!(code(r.doc()), 13435);
    let id = s.next_id();
    s.send(&op_query_flags(id, 4, "d.c", 5, &doc! {})).await;
    assert_eq!(s.read().await.docs.len(), 5);

    // Writes on a secondary.
    for cmd in [
        doc! {"insert": "c", "documents": [{"_id": 1000}], "$db": "d"},
        doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"x": 1}}}], "$db": "d"},
        doc! {"delete": "c", "deletes": [{"q": {}, "limit": 0}], "$db": "d"},
        doc! {"findAndModify": "c", "query": {}, "remove": true, "$db": "d"},
        doc! {"create": "other", "$db": "d"},
        doc! {"drop": "c", "$db": "d"},
        doc! {"createIndexes": "c", "indexes": [{"key": {"x": 1}, "name": "x_1"}], "$db": "d"},
        // Even with a read preference.
        doc! {"insert": "c", "documents": [{"_id": 1001}], "$db": "d", "$readPreference": {"mode": "secondary"}},
    ] {
        let r = s.command(cmd.clone()).await;
        assert_eq!(code(&r), 10107, "{cmd}");
        assert_eq!(r.get_str("codeName").unwrap(), "NotWritablePrimary");
        assert_eq!(r.get_str("errmsg").unwrap(), "not primary");
    }
    let r = p.command(doc! {"count": "c", "$db": "d"}).await;
    assert_eq!(
        r.get_i32("n").unwrap(),
        150,
        "nothing written through a secondary"
    );

    // Commands that work on any member.
    for cmd in [
        doc! {"ping": 1, "$db": "admin"},
        doc! {"buildInfo": 1, "$db": "admin"},
        doc! {"serverStatus": 1, "$db": "admin"},
        doc! {"endSessions": [], "$db": "admin"},
        doc! {"standinStats": 1, "$db": "admin"},
    ] {
        let r = s.command(cmd.clone()).await;
        assert!(ok(&r), "{cmd}: {r}");
    }

    // Cursors are per member: a getMore on another member is CursorNotFound.
    let r = p
        .command(doc! {"find": "c", "batchSize": 10, "$db": "d"})
        .await;
    let cid = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(cid, 0);
    let r = s
        .command(doc! {"getMore": cid, "collection": "c", "$db": "d"})
        .await;
    assert_eq!(code(&r), 43, "{r}");
    let r = p
        .command(doc! {"getMore": cid, "collection": "c", "$db": "d"})
        .await;
    assert!(ok(&r), "{r}");
    // ...and a secondary's own cursor keeps working (getMore needs no read preference).
    let r = s
        .command(doc! {"find": "c", "batchSize": 10, "$db": "d", "$readPreference": {"mode": "secondary"}})
        .await;
    let cid = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    let r = s
        .command(doc! {"getMore": cid, "collection": "c", "batchSize": 5, "$db": "d"})
        .await;
    assert_eq!(
        r.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len(),
        5,
        "{r}"
    );
    rs.shutdown().await;
}

#[tokio::test]
async fn fire_and_forget_writes_on_a_secondary_close_the_connection() {
    let rs = set3_wire(13).await;
    let mut s = Raw::connect(rs.member(2).addr()).await;
    let id = s.next_id();
    s.send(&op_insert(id, "d.c", &[doc! {"_id": 1}])).await;
    assert!(s.closed_within(Duration::from_secs(5)).await);

    let mut s = Raw::connect(rs.member(2).addr()).await;
    let id = s.next_id();
    s.send(&op_msg(
        id,
        MORE_TO_COME,
        &doc! {"insert": "c", "documents": [{"_id": 2}], "$db": "d", "writeConcern": {"w": 0}},
        None,
    ))
    .await;
    assert!(s.closed_within(Duration::from_secs(5)).await);

    // On the primary the same writes are applied (and the connection stays open).
    let mut p = Raw::connect(rs.member(0).addr()).await;
    let id = p.next_id();
    p.send(&op_insert(id, "d.c", &[doc! {"_id": 3}])).await;
    let r = p.command(doc! {"find": "c", "$db": "d"}).await;
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .clone();
    assert_eq!(batch, vec![Bson::Document(doc! {"_id": 3})]);
    rs.shutdown().await;
}

#[tokio::test]
async fn step_down_with_a_gap() {
    let rs = set3().await;
    let e0 = hello(rs.member(0).addr())
        .await
        .get_object_id("electionId")
        .unwrap();
    rs.step_down(1, Duration::from_millis(300));
    assert_eq!(rs.primary(), None);
    for (i, m) in rs.members().iter().enumerate() {
        let h = hello(m.addr()).await;
        assert!(!h.get_bool("isWritablePrimary").unwrap(), "member {i}");
        assert!(h.get_bool("secondary").unwrap(), "member {i}");
        assert!(!h.contains_key("primary"), "member {i}: {h}");
        assert!(!h.contains_key("electionId"), "member {i}");
        assert_eq!(counter(&h), if i == 0 { 1 } else { 0 }, "member {i}");
    }
    let mut c1 = Raw::connect(rs.member(1).addr()).await;
    let r = c1
        .command(doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"})
        .await;
    assert_eq!(code(&r), 10107, "no primary yet");
    let r = Raw::connect(rs.member(0).addr())
        .await
        .command(doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"})
        .await;
    assert_eq!(code(&r), 10107, "old primary");

    let t0 = Instant::now();
    while rs.primary() != Some(1) {
        assert!(t0.elapsed() < Duration::from_secs(5), "no election");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hosts: Vec<String> = rs
        .members()
        .iter()
        .map(|m| m.uri().trim_start_matches("mongodb://").to_string())
        .collect();
    for (i, m) in rs.members().iter().enumerate() {
        let h = hello(m.addr()).await;
        assert_eq!(h.get_bool("isWritablePrimary").unwrap(), i == 1);
        assert_eq!(h.get_str("primary").unwrap(), hosts[1]);
        assert_eq!(counter(&h), if i == 2 { 0 } else { 1 }, "member {i}");
        if i == 1 {
            let e1 = h.get_object_id("electionId").unwrap();
            assert!(e1 > e0, "electionId must grow: {e0} -> {e1}");
        }
    }
    let r = c1
        .command(doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    let r = Raw::connect(rs.member(0).addr())
        .await
        .command(doc! {"count": "c", "$db": "d", "$readPreference": {"mode": "secondary"}})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);

    // Zero gap: immediate; a step-down during a gap cancels the pending election.
    rs.step_down(2, Duration::ZERO);
    assert_eq!(rs.primary(), Some(2));
    rs.step_down(0, Duration::from_millis(200));
    rs.step_down(1, Duration::from_millis(400));
    // Past the first (cancelled) election's 200 ms and before the second's 400 ms: the wait
    // is the behaviour under test (nothing may happen), not a synchronisation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rs.primary(), None, "the first election was cancelled");
    wait_for_primary(&rs, 1).await;
    rs.shutdown().await;
}

#[tokio::test]
async fn awaitable_hello_wakes_on_role_change() {
    let rs = set3().await;
    let mut c = Raw::connect(rs.member(1).addr()).await;
    let h = c.command(doc! {"hello": 1, "$db": "admin"}).await;
    let tv = h.get_document("topologyVersion").unwrap().clone();
    let received = rs.member(1).stats().messages();
    let id = c.next_id();
    c.send(&op_msg(
        id,
        0,
        &doc! {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 10_000i64, "$db": "admin"},
        None,
    ))
    .await;
    // The step-down comes once member 1 has the awaitable hello.
    let t1 = Instant::now();
    while rs.member(1).stats().messages() == received {
        assert!(
            t1.elapsed() < Duration::from_secs(10),
            "the hello never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = Instant::now();
    rs.step_down(1, Duration::ZERO);
    let r = c.read().await;
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(r.doc().get_bool("isWritablePrimary").unwrap());
    assert_eq!(counter(r.doc()), 1);
    rs.shutdown().await;
}

#[tokio::test]
async fn standin_stats_command() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut c = Raw::connect(s.addr()).await;
    let r = c.command(doc! {"standinStats": 1, "$db": "x"}).await;
    assert!(ok(&r), "{r}");
    assert_eq!(r.get_i64("connectionsAccepted").unwrap(), 1);
    assert_eq!(r.get_i64("connectionsOpen").unwrap(), 1);
    assert_eq!(r.get_i64("authentications").unwrap(), 0);
    assert_eq!(r.get_i64("messages").unwrap(), 1);
    assert_eq!(
        r.get_document("commands").unwrap(),
        &doc! {"standinstats": 1i64}
    );
    assert_eq!(r.get_i32("member").unwrap(), 0);
    assert!(r.get_bool("isWritablePrimary").unwrap());

    c.command(doc! {"ping": 1, "$db": "admin"}).await;
    c.command(doc! {"insert": "c", "documents": [{}], "$db": "d"})
        .await;
    let r = c
        .command(doc! {"standinStats": 1, "reset": true, "$db": "admin"})
        .await;
    assert_eq!(r.get_i64("messages").unwrap(), 4);
    assert_eq!(
        r.get_document("commands").unwrap(),
        &doc! {"insert": 1i64, "ping": 1i64, "standinstats": 2i64}
    );
    assert_eq!(s.stats().messages(), 0, "reset");
    assert_eq!(s.stats().connections_open(), 1, "the gauge is not reset");
    let r = c.command(doc! {"standinStats": 1, "$db": "admin"}).await;
    assert_eq!(r.get_i64("connectionsAccepted").unwrap(), 0);
    assert_eq!(r.get_i64("connectionsOpen").unwrap(), 1);
    assert_eq!(r.get_i64("messages").unwrap(), 1);
    assert_eq!(
        r.get_document("commands").unwrap(),
        &doc! {"standinstats": 1i64}
    );

    // Case-sensitive, like every mongod command.
    let r = c.command(doc! {"standinstats": 1, "$db": "admin"}).await;
    assert_eq!(code(&r), 59);

    // Not a replica set.
    let r = c.command(doc! {"standinStepDown": 1, "$db": "admin"}).await;
    assert_eq!(code(&r), 20);
    assert_eq!(r.get_str("codeName").unwrap(), "IllegalOperation");
    assert_eq!(r.get_str("errmsg").unwrap(), "not a replica set");
    s.shutdown().await;

    // The one-member replica_set mode is not a ReplicaSet either.
    let s = StandIn::start(StandInConfig {
        replica_set: Some("solo".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = Raw::connect(s.addr())
        .await
        .command(doc! {"standinStepDown": 1, "$db": "admin"})
        .await;
    assert_eq!(code(&r), 20);
    s.shutdown().await;
}

/// `connectionsOpenMax`: the most connections open at once, kept after they close; a reset
/// sets it to the number open then.
#[tokio::test]
async fn standin_stats_connections_open_max() {
    let s = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut c = Raw::connect(s.addr()).await;
    let mut others = Vec::new();
    for _ in 0..2 {
        let mut o = Raw::connect(s.addr()).await;
        o.command(doc! {"ping": 1, "$db": "admin"}).await;
        others.push(o);
    }
    drop(others);
    let t0 = Instant::now();
    while s.stats().connections_open() != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the two connections never closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.stats().connections_open_max(), 3);
    let r = c
        .command(doc! {"standinStats": 1, "reset": true, "$db": "admin"})
        .await;
    assert_eq!(r.get_i64("connectionsOpen").unwrap(), 1);
    assert_eq!(r.get_i64("connectionsOpenMax").unwrap(), 3);
    let r = c.command(doc! {"standinStats": 1, "$db": "admin"}).await;
    assert_eq!(
        r.get_i64("connectionsOpenMax").unwrap(),
        1,
        "reset to the open count"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standin_stats_without_auth_and_authentication_counts() {
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rsa".into(),
        members: 2,
        base: StandInConfig {
            users: vec![("alice".into(), "s3cret".into())],
            ..Default::default()
        },
    })
    .await
    .unwrap();
    let host0 = rs
        .member(0)
        .uri()
        .trim_start_matches("mongodb://")
        .to_string();
    let stats_of = |i: usize| {
        let addr = rs.member(i).addr();
        async move {
            Raw::connect(addr)
                .await
                .command(doc! {"standinStats": 1, "$db": "anything"})
                .await
        }
    };
    let r = stats_of(1).await;
    assert!(ok(&r), "allowed without authentication: {r}");
    assert_eq!(r.get_i32("member").unwrap(), 1);
    assert!(!r.get_bool("isWritablePrimary").unwrap());
    let r = Raw::connect(rs.member(1).addr())
        .await
        .command(doc! {"find": "c", "$db": "d"})
        .await;
    assert_eq!(code(&r), 13, "other commands still need authentication");

    // Speculative authentication (default mechanism), one pooled connection: counted once.
    let mut opts = ClientOptions::parse(format!(
        "mongodb://alice:s3cret@{host0}/?directConnection=true&maxPoolSize=1"
    ))
    .await
    .unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    let c = Client::with_options(opts).unwrap();
    for _ in 0..3 {
        c.database("d")
            .collection::<Document>("c")
            .insert_one(doc! {})
            .await
            .unwrap();
    }
    let r = stats_of(0).await;
    assert_eq!(r.get_i64("authentications").unwrap(), 1, "{r}");
    assert_eq!(rs.member(0).stats().authentications(), 1);
    assert_eq!(rs.member(1).stats().authentications(), 0, "per member");
    // Explicit SCRAM-SHA-1 (saslStart + saslContinue, no speculative step).
    let c1 = Client::with_uri_str(format!(
        "mongodb://alice:s3cret@{host0}/?directConnection=true&maxPoolSize=1&authMechanism=SCRAM-SHA-1"
    ))
    .await
    .unwrap();
    c1.database("d")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(rs.member(0).stats().authentications(), 2);
    // A failed authentication is not counted.
    let mut bad = ClientOptions::parse(format!(
        "mongodb://alice:wrong@{host0}/?directConnection=true"
    ))
    .await
    .unwrap();
    bad.server_selection_timeout = Some(Duration::from_secs(5));
    let bad = Client::with_options(bad).unwrap();
    assert!(bad
        .database("d")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .is_err());
    assert_eq!(rs.member(0).stats().authentications(), 2);
    c.shutdown().await;
    c1.shutdown().await;
    bad.shutdown().await;
    rs.shutdown().await;
}

#[tokio::test]
async fn standin_step_down_command() {
    let rs = set3().await;
    // Sent to a secondary, explicit target, no gap.
    let r = Raw::connect(rs.member(2).addr())
        .await
        .command(doc! {"standinStepDown": 1, "newPrimary": 2, "gapMs": 0, "$db": "admin"})
        .await;
    assert!(ok(&r), "{r}");
    assert_eq!(rs.primary(), Some(2));
    let h = hello(rs.member(2).addr()).await;
    assert!(h.get_bool("isWritablePrimary").unwrap());

    // Defaults: the next member (2 -> 0), after a gap (here shortened).
    let t0 = Instant::now();
    let r = Raw::connect(rs.member(1).addr())
        .await
        .command(doc! {"standinStepDown": 1, "gapMs": 200i64, "$db": "x"})
        .await;
    assert!(ok(&r), "{r}");
    assert_eq!(r.get_i32("newPrimary").unwrap(), 0);
    assert!(t0.elapsed() < Duration::from_millis(200), "replies at once");
    assert_eq!(rs.primary(), None);
    wait_for_primary(&rs, 0).await;

    // Bad arguments.
    let mut c = Raw::connect(rs.member(0).addr()).await;
    let r = c
        .command(doc! {"standinStepDown": 1, "newPrimary": 3, "$db": "admin"})
        .await;
    assert_eq!(code(&r), 2);
    let r = c
        .command(doc! {"standinStepDown": 1, "gapMs": -1, "$db": "admin"})
        .await;
    assert_eq!(code(&r), 2);
    assert_eq!(rs.primary(), Some(0), "unchanged");
    rs.shutdown().await;
}

#[tokio::test]
async fn fixed_base_port_gives_consecutive_ports() {
    // Find a free range of 3 ports (best effort: retry a few bases).
    for _ in 0..20 {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = probe.local_addr().unwrap().port();
        drop(probe);
        if base > 65000 {
            continue;
        }
        let cfg = ReplicaSetConfig {
            name: "fixed".into(),
            members: 3,
            base: StandInConfig {
                listen: std::net::SocketAddr::from(([127, 0, 0, 1], base)),
                ..Default::default()
            },
        };
        let Ok(rs) = ReplicaSet::start(cfg).await else {
            continue;
        };
        let ports: Vec<u16> = rs.members().iter().map(|m| m.addr().port()).collect();
        assert_eq!(ports, vec![base, base + 1, base + 2]);
        rs.shutdown().await;
        return;
    }
    panic!("no free port range found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_fails_over() {
    let rs = set3().await;
    let mut opts = ClientOptions::parse(rs.uri()).await.unwrap();
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    opts.heartbeat_freq = Some(Duration::from_millis(500));
    let c = Client::with_options(opts).unwrap();
    let coll: Collection<Document> = c.database("app").collection("c");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();

    // Secondary reads see the primary's write at once.
    let found: Vec<Document> = coll
        .find(doc! {})
        .selection_criteria(SelectionCriteria::ReadPreference(
            ReadPreference::Secondary {
                options: Default::default(),
            },
        ))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(found, vec![doc! {"_id": 1}]);

    rs.step_down(1, Duration::from_millis(300));
    let t0 = Instant::now();
    // Retried until a primary is discovered (the first attempt may hit the old primary).
    loop {
        match coll.insert_one(doc! {"_id": 2}).await {
            Ok(_) => break,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(rs.primary(), Some(1));
    assert!(
        rs.member(1).stats().command_count("insert") >= 1,
        "the write went to the new primary"
    );
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
    c.shutdown().await;
    rs.shutdown().await;
}
