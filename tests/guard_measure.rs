//! Blast-radius measurement on the wire, in passthrough and pooled mode: a multi-document
//! write whose filter the prover cannot decide (`{_id: {$gt: 0}}` depends on the data) is
//! measured on the upstream before it is forwarded.
//!
//! - measured to match every document: W001 / W003, blocked, the errmsg says "measured", the
//!   write never reaches the upstream, the data is unchanged, the client keeps working;
//! - measured to match some: forwarded;
//! - more than `max_docs`: W012; an aggregate that `$merge`s into existing documents is
//!   measured by the output of its stages before `$merge`;
//! - the measurement times out (a `failCommand` fail point holds the measuring `find`) or the
//!   server answers MaxTimeMSExpired (`maxTimeAlwaysTimeOut`): blocked, never a silent allow;
//! - inside a transaction: measured inside it, and a measured block aborts it;
//! - audit mode measures and records a warning;
//! - mongoguard's own requests never reach the client (one reply, answering the client's id).
//!
//! Fail points are mongod's test commands (`configureFailPoint`, which a real mongod accepts
//! only with `enableTestCommands`); the stand-in implements `failCommand` and
//! `maxTimeAlwaysTimeOut`.

#[path = "support/hostile.rs"]
mod hostile;
mod support;

use std::{path::PathBuf, sync::Arc, time::Duration};

use bson::{doc, Document};
use futures::TryStreamExt;
use hostile::{body_of, op_msg, read_frame};
use mongodb::{options::ClientOptions, Client, Collection};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    audit::{Action, Mode as AuditMode},
    config::{Config, Mode},
};
use mongoguard_standin::{StandIn, StandInConfig};
use support::guard::{assert_driver_blocked, PolicyFile, BLOCK_CODE};

/// Safety net against hangs (not a performance assertion).
const BOUND: Duration = Duration::from_secs(60);
const UPSTREAM_USER: (&str, &str) = ("app", "apppw");
const CLIENT_USER: (&str, &str) = ("alice", "alicepw");
const DB: &str = "shop";
const COLL: &str = "orders";

#[derive(Clone, Copy, Debug)]
enum Kind {
    Passthrough,
    Pooled,
}

struct Guard {
    standin: StandIn,
    proxy: ProxyHandle,
    direct: Client,
    client: Client,
    _policy: PolicyFile,
    _users: Option<PathBuf>,
}

impl Guard {
    async fn start(kind: Kind, tag: &str, policy: &str) -> Guard {
        let pooled = matches!(kind, Kind::Pooled);
        let standin = StandIn::start(StandInConfig {
            users: if pooled {
                vec![(UPSTREAM_USER.0.into(), UPSTREAM_USER.1.into())]
            } else {
                Vec::new()
            },
            ..Default::default()
        })
        .await
        .expect("start the stand-in");
        let policy = PolicyFile::write(tag, policy);
        let (upstream, direct_uri) = if pooled {
            let auth = format!("{}:{}@", UPSTREAM_USER.0, UPSTREAM_USER.1);
            (
                format!("mongodb://{auth}{}/?authSource=admin", standin.addr()),
                format!("mongodb://{auth}{}/?authSource=admin", standin.addr()),
            )
        } else {
            (standin.uri(), standin.uri())
        };
        let mut cfg = Config::for_upstream(&upstream).expect("config");
        cfg.policy.file = Some(policy.path().to_path_buf());
        cfg.audit.sink = mongoguard::audit::SinkSpec::None;
        cfg.upstream.reply_timeout = Duration::from_secs(30);
        let mut users = None;
        if pooled {
            let dir = hostile::temp_dir(tag);
            let path = dir.join("users.toml");
            mongoguard::auth::users::add(&path, CLIENT_USER.0, CLIENT_USER.1, "admin")
                .expect("users file");
            cfg.proxy.mode = Mode::Pooled;
            cfg.pool.pool_size = 2;
            cfg.auth.users_file = Some(path);
            users = Some(dir);
        }
        cfg.validate().expect("valid config");
        let proxy = Proxy::start(Arc::new(cfg)).await.expect("start mongoguard");
        let client_uri = if pooled {
            format!(
                "mongodb://{}:{}@{}/?authSource=admin&retryWrites=true",
                CLIENT_USER.0,
                CLIENT_USER.1,
                proxy.local_addr()
            )
        } else {
            format!("mongodb://{}/?retryWrites=true", proxy.local_addr())
        };
        let direct = connect(&direct_uri).await;
        let client = connect(&client_uri).await;
        let seed: Vec<Document> = (1..=5).map(|i| doc! {"_id": i, "v": i}).collect();
        direct
            .database(DB)
            .collection::<Document>(COLL)
            .insert_many(seed)
            .await
            .expect("seed");
        Guard {
            standin,
            proxy,
            direct,
            client,
            _policy: policy,
            _users: users,
        }
    }

    fn coll(&self) -> Collection<Document> {
        self.client.database(DB).collection(COLL)
    }

    async fn stored(&self) -> Vec<Document> {
        self.direct
            .database(DB)
            .collection::<Document>(COLL)
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await
            .expect("direct find")
            .try_collect()
            .await
            .expect("direct cursor")
    }

    fn upstream(&self, command: &str) -> u64 {
        self.standin.stats().command_count(command)
    }

    async fn violations(&self, rule: &str, action: Action, mode: AuditMode) -> u64 {
        let audit = self.proxy.audit();
        audit.flush().await;
        audit.counters().rule_count(rule, action, mode)
    }

    async fn fail_point(&self, cmd: Document) {
        self.direct
            .database("admin")
            .run_command(cmd)
            .await
            .expect("configureFailPoint");
    }

    async fn finish(self) {
        self.client.shutdown().await;
        self.direct.shutdown().await;
        self.proxy.shutdown().await;
    }
}

async fn connect(uri: &str) -> Client {
    let mut opts = ClientOptions::parse(uri).await.expect("parse uri");
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(opts).expect("client")
}

async fn bounded<T>(what: &str, f: impl std::future::IntoFuture<Output = T>) -> T {
    tokio::time::timeout(BOUND, f.into_future())
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {BOUND:?}"))
}

const STANDARD: &str = "extends = \"standard\"\n";

async fn measured_block_and_pass(kind: Kind) {
    let g = Guard::start(kind, &format!("measure-{kind:?}"), STANDARD).await;
    let before = g.stored().await;
    let (updates, finds) = (g.upstream("update"), g.upstream("find"));
    let err = bounded(
        "measured update",
        g.coll()
            .update_many(doc! {"_id": {"$gt": 0}}, doc! {"$set": {"x": 1}}),
    )
    .await
    .expect_err("a filter measured to match every document is blocked");
    let msg = assert_driver_blocked(&err, "W001");
    assert!(msg.contains("measured"), "{kind:?}: {msg}");
    assert_eq!(
        g.upstream("update"),
        updates,
        "the write never reached the upstream"
    );
    assert!(g.upstream("find") >= finds + 2, "two measuring queries ran");
    assert_eq!(g.stored().await, before, "data unchanged");
    assert_eq!(
        g.violations("W001", Action::Block, AuditMode::Enforce)
            .await,
        1
    );

    // The same client keeps working, and a selective filter (measured) is forwarded.
    let r = bounded(
        "selective update",
        g.coll()
            .update_many(doc! {"_id": {"$gt": 3}}, doc! {"$set": {"x": 1}}),
    )
    .await
    .expect("a filter measured to match some documents is forwarded");
    assert_eq!(r.modified_count, 2, "{kind:?}");
    // The same for a delete (W003).
    let err = bounded(
        "measured delete",
        g.coll().delete_many(doc! {"v": {"$gte": 1}}),
    )
    .await
    .expect_err("a delete measured to match everything is blocked");
    assert_driver_blocked(&err, "W003");
    assert_eq!(g.stored().await.len(), 5);
    g.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_measured_block_and_pass() {
    measured_block_and_pass(Kind::Passthrough).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_measured_block_and_pass() {
    measured_block_and_pass(Kind::Pooled).await;
}

async fn budget_exceeded(kind: Kind) {
    let policy = "extends = \"standard\"\n[rules]\nW012 = { action = \"block\", max_docs = 1 }\n";
    let g = Guard::start(kind, &format!("w012-{kind:?}"), policy).await;
    let err = bounded("W012", g.coll().delete_many(doc! {"_id": {"$gt": 3}}))
        .await
        .expect_err("more than max_docs is blocked");
    let msg = assert_driver_blocked(&err, "W012");
    assert!(msg.contains("more than 1 documents"), "{msg}");
    assert_eq!(g.upstream("delete"), 0);
    // One document is within the budget.
    let r = bounded("one", g.coll().delete_many(doc! {"_id": {"$gt": 4}}))
        .await
        .expect("one document is within max_docs");
    assert_eq!(r.deleted_count, 1);
    g.finish().await;
}

/// An aggregate that `$merge`s into existing documents is a multi-document update: the stages
/// before `$merge` are measured (an aggregate with `$limit: max_docs + 1`) and more than
/// `max_docs` output documents fire W012. On main it went to the upstream unmeasured
/// (`[{$set: ...}, {$merge: "orders"}]` rewrites every order). The stand-in refuses `$merge`
/// itself, so what is forwarded fails there; what is blocked never gets that far.
async fn merge_measured(kind: Kind) {
    let policy = "extends = \"standard\"\n[rules]\nW012 = { action = \"block\", max_docs = 1 }\n";
    let g = Guard::start(kind, &format!("merge-{kind:?}"), policy).await;
    let aggregates = g.upstream("aggregate");
    // Into itself, on _id, every document kept: updateMany({}) by another name, W001 at once.
    let pipeline = vec![doc! {"$set": {"x": 1}}, doc! {"$merge": COLL}];
    let err = bounded("merge all", g.coll().aggregate(pipeline))
        .await
        .expect_err("a $merge proved to rewrite every document is blocked");
    assert_driver_blocked(&err, "W001");
    assert_eq!(g.upstream("aggregate"), aggregates, "no I/O for a proof");
    // A filter the prover cannot decide: measured.
    let pipeline = vec![
        doc! {"$match": {"_id": {"$gt": 0}}},
        doc! {"$set": {"x": 1}},
        doc! {"$merge": COLL},
    ];
    let err = bounded("merge", g.coll().aggregate(pipeline))
        .await
        .expect_err("a $merge measured over more than max_docs is blocked");
    let msg = assert_driver_blocked(&err, "W012");
    assert!(msg.contains("more than 1 documents"), "{kind:?}: {msg}");
    assert_eq!(
        g.upstream("aggregate"),
        aggregates + 1,
        "one measuring aggregate, and the write never reached the upstream"
    );
    assert_eq!(
        g.violations("W012", Action::Block, AuditMode::Enforce)
            .await,
        1
    );
    // One output document is within max_docs: forwarded (and refused by the stand-in,
    // which has no $merge, with its own error rather than mongoguard's).
    let pipeline = vec![doc! {"$match": {"_id": {"$gt": 4}}}, doc! {"$merge": COLL}];
    let err = bounded("merge one", g.coll().aggregate(pipeline))
        .await
        .expect_err("the stand-in has no $merge");
    assert!(
        !err.to_string().contains("mongoguard blocked"),
        "{kind:?}: forwarded, not blocked: {err}"
    );
    assert_eq!(
        g.upstream("aggregate"),
        aggregates + 3,
        "measured, then forwarded"
    );
    assert_eq!(g.stored().await.len(), 5);
    g.finish().await;
}

/// A filter whose matches change with the clock: `$$NOW` is bound per command, so a measuring
/// find before the write cannot stand for it (`{$expr: {$gt: ["$$NOW", D]}}` with `D` just
/// ahead is empty when measured and everything when written). Refused at once
/// (`measure.on_error`, W003), with no measuring query; a date literal is measured as before.
#[tokio::test(flavor = "multi_thread")]
async fn clock_dependent_filter_is_refused_unmeasured() {
    let g = Guard::start(Kind::Passthrough, "measure-clock", STANDARD).await;
    let (finds, deletes) = (g.upstream("find"), g.upstream("delete"));
    let soon = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 50);
    let err = bounded(
        "clock",
        g.coll()
            .delete_many(doc! {"$expr": {"$gt": ["$$NOW", soon]}}),
    )
    .await
    .expect_err("a clock-dependent filter is refused");
    let msg = assert_driver_blocked(&err, "W003");
    assert!(msg.contains("clock"), "{msg}");
    assert_eq!(g.upstream("find"), finds, "nothing measured");
    assert_eq!(g.upstream("delete"), deletes, "nothing forwarded");
    assert_eq!(g.stored().await.len(), 5);
    g.finish().await;
}

/// W001 relaxed to a warning (an override for a migration) must not hide a W012 block: on
/// main `updateMany({})` then went through with a W001 warning, unmeasured, while a filter
/// matching all but one document was counted and blocked.
#[tokio::test(flavor = "multi_thread")]
async fn a_relaxed_w001_still_counts_for_w012() {
    let policy = "extends = \"standard\"\n[rules]\nW001 = \"warn\"\n\
                  W012 = { action = \"block\", max_docs = 1 }\n";
    let g = Guard::start(Kind::Passthrough, "measure-relaxed", policy).await;
    let updates = g.upstream("update");
    for filter in [doc! {}, doc! {"_id": {"$gt": 0}}] {
        let err = bounded(
            "relaxed",
            g.coll()
                .update_many(filter.clone(), doc! {"$set": {"x": 1}}),
        )
        .await
        .expect_err("more than max_docs is blocked whatever W001 says");
        let msg = assert_driver_blocked(&err, "W012");
        assert!(msg.contains("more than 1 documents"), "{filter}: {msg}");
    }
    assert_eq!(g.upstream("update"), updates, "nothing forwarded");
    g.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_merge_measured() {
    merge_measured(Kind::Passthrough).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_merge_measured() {
    merge_measured(Kind::Pooled).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_budget_exceeded() {
    budget_exceeded(Kind::Passthrough).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_budget_exceeded() {
    budget_exceeded(Kind::Pooled).await;
}

async fn measurement_timeout(kind: Kind) {
    let policy = "extends = \"standard\"\n[measure]\ntime_limit_ms = 100\n";
    let g = Guard::start(kind, &format!("timeout-{kind:?}"), policy).await;
    // The server never answers the measuring find in time: mongoguard gives up after
    // maxTimeMS plus its network margin and blocks.
    g.fail_point(doc! {
        "configureFailPoint": "failCommand", "mode": {"times": 1},
        "data": {"failCommands": ["find"], "blockConnection": true, "blockTimeMS": 5000},
    })
    .await;
    let err = bounded(
        "held measurement",
        g.coll()
            .update_many(doc! {"_id": {"$gt": 3}}, doc! {"$set": {"x": 1}}),
    )
    .await
    .expect_err("a measurement without an answer blocks");
    let msg = assert_driver_blocked(&err, "W001");
    assert!(msg.contains("no answer within"), "{msg}");
    assert_eq!(g.upstream("update"), 0);
    // The server answers MaxTimeMSExpired.
    g.fail_point(doc! {"configureFailPoint": "maxTimeAlwaysTimeOut", "mode": {"times": 1}})
        .await;
    let err = bounded(
        "timed-out measurement",
        g.coll().delete_many(doc! {"_id": {"$gt": 3}}),
    )
    .await
    .expect_err("a timed-out measurement blocks");
    let msg = assert_driver_blocked(&err, "W003");
    assert!(msg.contains("MaxTimeMSExpired (50)"), "{msg}");
    assert_eq!(g.upstream("delete"), 0);
    // The connection mongoguard gave up on was replaced: the client works on.
    let r = bounded(
        "after",
        g.coll()
            .update_many(doc! {"_id": {"$gt": 3}}, doc! {"$set": {"x": 1}}),
    )
    .await
    .expect("the next measured write passes");
    assert_eq!(r.modified_count, 2);
    g.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_measurement_timeout_blocks() {
    measurement_timeout(Kind::Passthrough).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_measurement_timeout_blocks() {
    measurement_timeout(Kind::Pooled).await;
}

async fn inside_a_transaction(kind: Kind) {
    let g = Guard::start(kind, &format!("txn-{kind:?}"), STANDARD).await;
    let coll = g.coll();
    // A selective measured write inside a transaction passes, and the transaction commits.
    let mut session = g.client.start_session().await.expect("session");
    session.start_transaction().await.expect("start");
    coll.insert_one(doc! {"_id": 10, "v": 10})
        .session(&mut session)
        .await
        .expect("insert in txn");
    let r = bounded(
        "measured in txn",
        coll.update_many(doc! {"_id": {"$gt": 4}}, doc! {"$set": {"x": 1}})
            .session(&mut session),
    )
    .await
    .expect("a selective write inside a transaction passes");
    assert_eq!(
        r.modified_count, 2,
        "{kind:?}: both the stored and the txn's document"
    );
    session.commit_transaction().await.expect("commit");
    assert_eq!(g.stored().await.len(), 6);

    // A measured block inside a transaction aborts it.
    session.start_transaction().await.expect("start 2");
    coll.insert_one(doc! {"_id": 11, "v": 11})
        .session(&mut session)
        .await
        .expect("insert in txn 2");
    let err = bounded(
        "measured block in txn",
        coll.update_many(doc! {"_id": {"$gt": 0}}, doc! {"$set": {"y": 1}})
            .session(&mut session),
    )
    .await
    .expect_err("blocked inside the transaction");
    assert_driver_blocked(&err, "W001");
    // mongoguard aborted the transaction upstream (the stand-in has no transaction semantics,
    // so its data is not checked: its abort undoes nothing), and the commit is refused.
    assert!(
        g.upstream("aborttransaction") >= 1,
        "{kind:?}: no abortTransaction upstream"
    );
    let commit = session.commit_transaction().await;
    let err = commit.expect_err("the blocked transaction must not commit");
    assert!(
        matches!(&*err.kind, mongodb::error::ErrorKind::Command(c) if c.code == 251),
        "{kind:?}: expected NoSuchTransaction, got {err:?}"
    );
    // Client::shutdown waits for every session of the client to be dropped.
    drop(session);
    g.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_measurement_inside_a_transaction() {
    inside_a_transaction(Kind::Passthrough).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_measurement_inside_a_transaction() {
    inside_a_transaction(Kind::Pooled).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_mode_measures_and_records_a_warning() {
    let policy = "extends = \"standard\"\nmode = \"audit\"\n";
    let g = Guard::start(Kind::Passthrough, "measure-audit", policy).await;
    let r = bounded(
        "audit",
        g.coll()
            .update_many(doc! {"_id": {"$gt": 0}}, doc! {"$set": {"x": 1}}),
    )
    .await
    .expect("audit mode forwards");
    assert_eq!(r.modified_count, 5);
    assert_eq!(
        g.violations("W001", Action::Warn, AuditMode::Audit).await,
        1
    );
    assert!(g.upstream("find") >= 2, "audit mode measured");
    g.finish().await;
}

/// On the wire: the client gets exactly one reply, answering its own requestID, and none of
/// mongoguard's measuring replies.
#[tokio::test(flavor = "multi_thread")]
async fn measuring_replies_never_reach_the_client() {
    let g = Guard::start(Kind::Passthrough, "measure-wire", STANDARD).await;
    let mut stream = tokio::net::TcpStream::connect(g.proxy.local_addr())
        .await
        .expect("connect");
    use tokio::io::AsyncWriteExt;
    for (id, filter, blocked) in [
        (7, doc! {"_id": {"$gt": 0}}, true),
        (8, doc! {"_id": {"$gt": 4}}, false),
    ] {
        let body = doc! {
            "update": COLL, "$db": DB,
            "updates": [{"q": filter, "u": {"$set": {"z": 1}}, "multi": true}],
        };
        stream.write_all(&op_msg(id, 0, &body)).await.expect("send");
        let reply = read_frame(&mut stream, BOUND).await.expect("reply");
        let response_to = i32::from_le_bytes([reply[8], reply[9], reply[10], reply[11]]);
        assert_eq!(response_to, id);
        let body = body_of(&reply);
        if blocked {
            assert_eq!(body.get_i32("code").ok(), Some(BLOCK_CODE), "{body}");
        } else {
            assert_eq!(support::num(&body, "nModified"), 1, "{body}");
        }
        let extra = read_frame(&mut stream, Duration::from_millis(300)).await;
        assert!(
            extra.is_err(),
            "a second frame reached the client: {extra:?}"
        );
    }
    g.finish().await;
}

/// A TTL index is a delete with no filter: over documents dated two hours ago,
/// `expireAfterSeconds: 3600` deletes every one of them within a minute (mongod's TTL
/// monitor, src/mongo/db/ttl/ttl.cpp `_deleteExpiredWithIndex`). createIndexes and collMod
/// (by key pattern or by name, looked up with listIndexes) are measured like a delete: every
/// document is W003 (blocked, nothing reaches the upstream), a TTL under which nothing
/// expires yet is forwarded; a collection-level TTL on a collection that is neither
/// clustered nor time-series cannot be measured and is refused (measure.on_error).
async fn ttl_measured(kind: Kind) {
    let g = Guard::start(kind, &format!("measure-ttl-{kind:?}"), STANDARD).await;
    let now = bson::DateTime::now().timestamp_millis();
    let old = bson::DateTime::from_millis(now - 2 * 3600 * 1000);
    let seed: Vec<Document> = (1..=5).map(|i| doc! {"_id": i, "at": old}).collect();
    g.direct
        .database(DB)
        .collection::<Document>("events")
        .insert_many(seed)
        .await
        .expect("seed events");
    let db = g.client.database(DB);
    let ttl = |name: &str, secs: i64| {
        doc! {"createIndexes": "events", "indexes": [
            {"key": {"at": 1}, "name": name, "expireAfterSeconds": secs}
        ]}
    };
    let creates = g.upstream("createIndexes");
    let err = bounded("TTL one hour", db.run_command(ttl("at_hour", 3600)))
        .await
        .expect_err("a TTL that expires every document is blocked");
    let msg = assert_driver_blocked(&err, "W003");
    assert!(msg.contains("measured"), "{kind:?}: {msg}");
    assert!(msg.contains("a TTL deletes"), "{kind:?}: {msg}");
    assert_eq!(g.upstream("createIndexes"), creates, "never forwarded");
    // A week: nothing has expired, the index is created.
    bounded("TTL one week", db.run_command(ttl("at_week", 7 * 86400)))
        .await
        .expect("a TTL under which nothing expires is forwarded");
    assert_eq!(g.upstream("createIndexes"), creates + 1);
    // Lowering it by name: looked up, measured, blocked.
    let lower =
        doc! {"collMod": "events", "index": {"name": "at_week", "expireAfterSeconds": 3600}};
    let lists = g.upstream("listIndexes");
    let err = bounded("collMod by name", db.run_command(lower))
        .await
        .expect_err("lowering a TTL by name over old data is blocked");
    assert_driver_blocked(&err, "W003");
    assert!(g.upstream("listIndexes") > lists, "the index was looked up");
    // By key pattern, to a TTL under which nothing expires: forwarded.
    let raise = doc! {"collMod": "events", "index": {"keyPattern": {"at": 1}, "expireAfterSeconds": 14 * 86400}};
    bounded("collMod by keyPattern", db.run_command(raise))
        .await
        .expect("raising a TTL is forwarded");
    // A collection-level TTL: the stand-in's collections are neither clustered nor
    // time-series, so the lookup finds no field: refused.
    let coll_ttl = doc! {"collMod": "events", "expireAfterSeconds": 3600};
    let err = bounded("collMod collection TTL", db.run_command(coll_ttl))
        .await
        .expect_err("an unmeasurable TTL is refused");
    let msg = assert_driver_blocked(&err, "W003");
    assert!(msg.contains("neither clustered nor time-series"), "{msg}");
    assert_eq!(
        g.direct
            .database(DB)
            .collection::<Document>("events")
            .count_documents(doc! {})
            .await
            .expect("count"),
        5
    );
    g.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn passthrough_ttl_measured() {
    ttl_measured(Kind::Passthrough).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_ttl_measured() {
    ttl_measured(Kind::Pooled).await;
}

/// Audit mode forwards a TTL index that enforcement would block, and records the W003 it
/// measured as a warning.
#[tokio::test(flavor = "multi_thread")]
async fn audit_mode_measures_a_ttl_index() {
    let policy = "extends = \"standard\"\nmode = \"audit\"\n";
    let g = Guard::start(Kind::Passthrough, "measure-ttl-audit", policy).await;
    let old = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 7_200_000);
    g.direct
        .database(DB)
        .collection::<Document>("events")
        .insert_one(doc! {"_id": 1, "at": old})
        .await
        .expect("seed");
    let cmd = doc! {"createIndexes": "events", "indexes": [
        {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 3600}
    ]};
    bounded("audit TTL", g.client.database(DB).run_command(cmd))
        .await
        .expect("audit mode forwards");
    assert_eq!(
        g.violations("W003", Action::Warn, AuditMode::Audit).await,
        1
    );
    g.finish().await;
}

/// The same TTL index over old data, sent on the wire as OP_COMPRESSED (zlib, snappy, zstd)
/// and as a legacy OP_QUERY `$cmd`: measured and blocked whatever the framing, the one reply
/// answers the client's requestID, and the upstream never sees the createIndexes.
#[tokio::test(flavor = "multi_thread")]
async fn a_ttl_index_is_measured_compressed_and_as_op_query() {
    use mongoguard::wire::compression::Compressor;
    use tokio::io::AsyncWriteExt;
    let g = Guard::start(Kind::Passthrough, "measure-ttl-wire", STANDARD).await;
    let old = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 7_200_000);
    let seed: Vec<Document> = (1..=3).map(|i| doc! {"_id": i, "at": old}).collect();
    g.direct
        .database(DB)
        .collection::<Document>("events")
        .insert_many(seed)
        .await
        .expect("seed");
    let mut stream = tokio::net::TcpStream::connect(g.proxy.local_addr())
        .await
        .expect("connect");
    let hello = doc! {"hello": 1, "compression": ["zlib", "snappy", "zstd"], "$db": "admin"};
    stream
        .write_all(&op_msg(1, 0, &hello))
        .await
        .expect("hello");
    read_frame(&mut stream, BOUND).await.expect("hello reply");
    let creates = g.upstream("createIndexes");
    let ttl = doc! {"createIndexes": "events", "indexes": [
        {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 3600}
    ]};
    for (id, compressor) in [
        (2, Compressor::Zlib),
        (3, Compressor::Snappy),
        (4, Compressor::Zstd),
    ] {
        let mut body = ttl.clone();
        body.insert("$db", DB);
        let frame = hostile::compressed(&op_msg(id, 0, &body), compressor);
        stream.write_all(&frame).await.expect("send");
        let reply = read_frame(&mut stream, BOUND).await.expect("reply");
        let response_to = i32::from_le_bytes([reply[8], reply[9], reply[10], reply[11]]);
        assert_eq!(response_to, id, "{compressor:?}");
        let body = body_of(&reply);
        assert_eq!(
            body.get_i32("code").ok(),
            Some(BLOCK_CODE),
            "{compressor:?}: {body}"
        );
        assert!(
            body.get_str("errmsg").unwrap_or_default().contains("W003"),
            "{body}"
        );
    }
    // A legacy OP_QUERY on `db.$cmd`: an OP_REPLY with the block.
    let raw = bson::RawDocumentBuf::try_from(&ttl).expect("raw");
    let query =
        mongoguard::wire::builder::encode_query(5, 0, &format!("{DB}.$cmd"), 0, -1, &raw, None);
    stream.write_all(&query).await.expect("send query");
    let reply = read_frame(&mut stream, BOUND).await.expect("reply");
    let response_to = i32::from_le_bytes([reply[8], reply[9], reply[10], reply[11]]);
    assert_eq!(response_to, 5);
    let parsed = mongoguard::wire::OpReply::parse(&reply).expect("an OP_REPLY");
    let doc = parsed.documents().next().expect("a document");
    let doc = Document::from_reader(doc.as_bytes()).expect("bson");
    assert!(
        doc.get_str("errmsg").unwrap_or_default().contains("W003"),
        "{doc}"
    );
    assert_eq!(g.upstream("createIndexes"), creates, "never forwarded");
    g.finish().await;
}
