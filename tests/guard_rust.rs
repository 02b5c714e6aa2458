//! Policy enforcement through the MongoDB Rust driver.
//!
//! Every blocking rule of the `standard` profile the driver can reach (W001, W003, W005, W006)
//! and, with a `strict` policy file, W002, W008 and Q002. For each blocked operation:
//!
//! * the driver gets a command error with code 65001 (`MongoguardPolicyViolation`), the rule id
//!   in its message, and no error labels;
//! * it made exactly one attempt (command monitoring), and the proxy counted exactly one block;
//! * the command never reached the upstream (the stand-in's counter for it did not move; against
//!   a real mongod the data is checked unchanged through a direct connection, and the counter
//!   check is reported as `SKIPPED: ...` on stderr, see `support::skipped`);
//! * the violation was recorded as a block;
//! * the same `Client` serves a normal find afterwards, and its pool was never cleared.
//!
//! Plus a warn-only rule (W004) that is forwarded and recorded, and audit mode (the standard
//! profile with `mode = "audit"`, and the shipped `audit` profile), which forwards W001 and
//! records it as a warning.
//!
//! By default the upstream is an in-process stand-in; `MONGOGUARD_TEST_UPSTREAM` points the same
//! tests at a real mongod.

mod support;

use std::sync::{Arc, Mutex};

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::event::cmap::CmapEvent;
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, WriteConcern};
use mongodb::{Client, Collection};
use mongoguard::audit::{Action, Mode};

use support::guard::{
    assert_driver_blocked, guard_stack, GuardStack, AUDIT_PROFILE, STANDARD_AUDIT_MODE, STRICT,
};
use support::unique_db;

// ------------------------------------------------------------------------------------------
// A client that records what the driver did
// ------------------------------------------------------------------------------------------

#[derive(Default)]
struct Seen {
    /// Every command the driver started: (name, command document).
    started: Vec<(String, Document)>,
    /// Pools the driver cleared (a block must never look like a network or topology error).
    pool_clears: usize,
}

struct Watched {
    client: Client,
    seen: Arc<Mutex<Seen>>,
}

impl Watched {
    async fn connect(gs: &GuardStack) -> Watched {
        let uri = gs.proxy_uri_with("");
        let mut opts = ClientOptions::parse(&uri)
            .await
            .unwrap_or_else(|e| panic!("parse {uri}: {e}"));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        opts.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
            if let CommandEvent::Started(ev) = e {
                s.lock()
                    .unwrap()
                    .started
                    .push((ev.command_name, ev.command));
            }
        }));
        let s = seen.clone();
        opts.cmap_event_handler = Some(EventHandler::callback(move |e: CmapEvent| {
            if let CmapEvent::PoolCleared(_) = e {
                s.lock().unwrap().pool_clears += 1;
            }
        }));
        let client = Client::with_options(opts).unwrap_or_else(|e| panic!("client: {e}"));
        Watched { client, seen }
    }

    fn started(&self, name: &str) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.started.iter().filter(|(n, _)| n == name).count()
    }

    fn last_started(&self, name: &str) -> Document {
        let seen = self.seen.lock().unwrap();
        seen.started
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("the driver never started {name}"))
    }

    fn pool_clears(&self) -> usize {
        self.seen.lock().unwrap().pool_clears
    }

    fn coll(&self, db: &str, name: &str) -> Collection<Document> {
        self.client.database(db).collection(name)
    }
}

// ------------------------------------------------------------------------------------------
// A scenario: a guarded stack, a seeded collection, a watched client
// ------------------------------------------------------------------------------------------

const COLL: &str = "c";

fn seed() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "v": 1, "g": "a"},
        doc! {"_id": 2, "v": 2, "g": "a"},
        doc! {"_id": 3, "v": 3, "g": "b"},
    ]
}

struct Scenario {
    gs: GuardStack,
    db: String,
    direct: Client,
    w: Watched,
}

impl Scenario {
    async fn start(tag: &str, policy: Option<&str>) -> Scenario {
        let gs = guard_stack(tag, policy).await;
        let db = unique_db(tag);
        let direct = gs.direct_client().await;
        direct
            .database(&db)
            .collection::<Document>(COLL)
            .insert_many(seed())
            .await
            .expect("seed the collection through the direct connection");
        let w = Watched::connect(&gs).await;
        // Establish the connection (handshake) before anything is counted.
        w.client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .expect("ping through the proxy");
        Scenario { gs, db, direct, w }
    }

    fn coll(&self) -> Collection<Document> {
        self.w.coll(&self.db, COLL)
    }

    async fn stored(&self) -> Vec<Document> {
        self.direct
            .database(&self.db)
            .collection::<Document>(COLL)
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await
            .expect("direct find")
            .try_collect()
            .await
            .expect("direct cursor")
    }

    /// Runs `op` through the proxy and checks everything a block implies.
    async fn expect_blocked<T: std::fmt::Debug>(
        &self,
        rule: &str,
        command: &str,
        op: impl std::future::IntoFuture<Output = mongodb::error::Result<T>>,
    ) -> String {
        let started_before = self.w.started(command);
        let blocked_before = self.gs.blocked();
        let upstream_before = self.gs.upstream_count(command);
        let recorded_before = self.gs.violations(rule, Action::Block, Mode::Enforce).await;

        let err = match op.await {
            Ok(v) => panic!("{rule}: expected a block, the operation succeeded: {v:?}"),
            Err(e) => e,
        };
        let message = assert_driver_blocked(&err, rule);

        assert_eq!(
            self.w.started(command) - started_before,
            1,
            "{rule}: the driver must make exactly one attempt (no retry)"
        );
        assert_eq!(
            self.gs.blocked() - blocked_before,
            1,
            "{rule}: the proxy must block exactly once"
        );
        self.assert_reached_upstream(rule, command, upstream_before, 0);
        assert_eq!(
            self.gs.violations(rule, Action::Block, Mode::Enforce).await - recorded_before,
            1,
            "{rule}: one block violation recorded"
        );
        message
    }

    /// `command` reached the stand-in `times` more times since `before` (a reading of
    /// [`GuardStack::upstream_count`]). A real mongod has no such counter: the check is then
    /// reported as skipped (never passed silently), and the callers' data checks through the
    /// direct connection stand in for it.
    fn assert_reached_upstream(&self, what: &str, command: &str, before: Option<u64>, times: u64) {
        match (before, self.gs.upstream_count(command)) {
            (Some(before), Some(after)) => assert_eq!(
                after - before,
                times,
                "{what}: the {command} command reached the upstream {} times, expected {times}",
                after - before
            ),
            (None, None) => {
                support::skipped(
                    &format!("{what}: {command} reached the upstream exactly {times} times"),
                    support::NO_STANDIN_COUNTERS,
                );
            }
            (before, after) => {
                panic!("the upstream counter appeared or vanished: {before:?} -> {after:?}")
            }
        }
    }

    /// The same client still serves a normal find, and never cleared its pool.
    async fn still_serves(&self) {
        let docs: Vec<Document> = self
            .coll()
            .find(doc! {"g": "a"})
            .sort(doc! {"_id": 1})
            .await
            .expect("find through the proxy after the block")
            .try_collect()
            .await
            .expect("cursor after the block");
        assert_eq!(docs.len(), 2, "find after the block: {docs:?}");
        assert_eq!(self.w.pool_clears(), 0, "the driver cleared its pool");
    }

    async fn finish(self) {
        let _ = self.direct.database(&self.db).drop().await;
        self.direct.shutdown().await;
        self.w.client.shutdown().await;
        self.gs.shutdown().await;
    }
}

/// The upstream really holds what the seed put there.
async fn assert_unchanged(s: &Scenario) {
    assert_eq!(s.stored().await, seed(), "data changed upstream");
}

/// Drops a collection in `admin` that a faulty proxy might have let through (real mongod only).
async fn drop_admin_leftover(s: &Scenario, coll: &str) -> u64 {
    let c = s.direct.database("admin").collection::<Document>(coll);
    let n = c.count_documents(doc! {}).await.unwrap_or(0);
    if n > 0 {
        let _ = c.drop().await;
    }
    n
}

fn admin_coll_name(tag: &str) -> String {
    // unique_db gives a name unique to this process, test and moment.
    unique_db(tag)
}

// ------------------------------------------------------------------------------------------
// standard profile: blocks
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn w001_update_many_without_filter_is_blocked() {
    let s = Scenario::start("w001", None).await;
    let msg = s
        .expect_blocked(
            "W001",
            "update",
            s.coll().update_many(doc! {}, doc! {"$set": {"x": 1}}),
        )
        .await;
    assert!(
        msg.contains("multi-update-without-filter") && msg.contains("(statement 0)"),
        "{msg}"
    );
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w001_update_many_with_tautology_is_blocked() {
    let s = Scenario::start("w001taut", None).await;
    s.expect_blocked(
        "W001",
        "update",
        s.coll().update_many(
            doc! {"$or": [{"v": 1}, {"_id": {"$exists": true}}]},
            doc! {"$set": {"x": 1}},
        ),
    )
    .await;
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w003_delete_many_without_filter_is_blocked() {
    let s = Scenario::start("w003", None).await;
    let msg = s
        .expect_blocked("W003", "delete", s.coll().delete_many(doc! {}))
        .await;
    assert!(msg.contains("delete-many-without-filter"), "{msg}");
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w005_insert_into_admin_is_blocked() {
    let s = Scenario::start("w005admin", None).await;
    let target = admin_coll_name("w005");
    s.expect_blocked(
        "W005",
        "insert",
        s.w.coll("admin", &target)
            .insert_one(doc! {"_id": 1, "x": 1}),
    )
    .await;
    assert_eq!(
        drop_admin_leftover(&s, &target).await,
        0,
        "the insert reached admin"
    );
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w005_insert_into_system_js_is_blocked() {
    let s = Scenario::start("w005sysjs", None).await;
    s.expect_blocked(
        "W005",
        "insert",
        s.w.coll(&s.db, "system.js")
            .insert_one(doc! {"_id": "f", "value": "function() { return 1; }"}),
    )
    .await;
    let n = s
        .direct
        .database(&s.db)
        .collection::<Document>("system.js")
        .count_documents(doc! {})
        .await
        .unwrap_or(0);
    assert_eq!(n, 0, "the insert reached system.js");
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w005_aggregate_merge_into_admin_is_blocked() {
    let s = Scenario::start("w005merge", None).await;
    let target = admin_coll_name("w005m");
    s.expect_blocked(
        "W005",
        "aggregate",
        s.coll().aggregate(vec![
            doc! {"$match": {"g": "a"}},
            doc! {"$merge": {"into": {"db": "admin", "coll": &target}}},
        ]),
    )
    .await;
    assert_eq!(
        drop_admin_leftover(&s, &target).await,
        0,
        "$merge reached admin"
    );
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w005_aggregate_out_into_admin_is_blocked() {
    let s = Scenario::start("w005out", None).await;
    let target = admin_coll_name("w005o");
    s.expect_blocked(
        "W005",
        "aggregate",
        s.coll().aggregate(vec![
            doc! {"$match": {"g": "a"}},
            doc! {"$out": {"db": "admin", "coll": &target}},
        ]),
    )
    .await;
    assert_eq!(
        drop_admin_leftover(&s, &target).await,
        0,
        "$out reached admin"
    );
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w006_journal_disabled_write_concern_is_blocked() {
    let s = Scenario::start("w006", None).await;
    let wc = WriteConcern::builder().journal(false).build();
    s.expect_blocked(
        "W006",
        "insert",
        s.coll()
            .insert_one(doc! {"_id": 10, "v": 10, "g": "c"})
            .write_concern(wc),
    )
    .await;
    // What the driver sent really carried j: false.
    let sent = s.w.last_started("insert");
    let j = sent
        .get_document("writeConcern")
        .ok()
        .and_then(|wc| wc.get("j").cloned());
    assert_eq!(j, Some(Bson::Boolean(false)), "the driver sent {sent}");
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

/// Several blocks in a row on one client: each is one attempt, one block, and the pool stays.
#[tokio::test(flavor = "multi_thread")]
async fn repeated_blocks_never_retry_nor_clear_the_pool() {
    let s = Scenario::start("repeat", None).await;
    for _ in 0..5 {
        s.expect_blocked(
            "W001",
            "update",
            s.coll().update_many(doc! {}, doc! {"$set": {"x": 1}}),
        )
        .await;
        s.expect_blocked("W003", "delete", s.coll().delete_many(doc! {}))
            .await;
    }
    assert_eq!(s.w.started("update"), 5);
    assert_eq!(s.w.started("delete"), 5);
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

// ------------------------------------------------------------------------------------------
// strict policy file: more blocks
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn strict_w002_update_one_without_filter_is_blocked() {
    let s = Scenario::start("w002", Some(STRICT)).await;
    let msg = s
        .expect_blocked(
            "W002",
            "update",
            s.coll().update_one(doc! {}, doc! {"$set": {"x": 1}}),
        )
        .await;
    assert!(msg.contains("update-without-filter"), "{msg}");
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn standard_w002_update_one_without_filter_only_warns() {
    let s = Scenario::start("w002std", None).await;
    let before = s.gs.upstream_count("update");
    let r = s
        .coll()
        .update_one(doc! {}, doc! {"$set": {"x": 1}})
        .await
        .expect("update_one({}) is only a warning in the standard profile");
    assert_eq!(r.matched_count, 1);
    s.assert_reached_upstream("W002 (standard)", "update", before, 1);
    assert_eq!(s.gs.blocked(), 0);
    assert_eq!(
        s.gs.violations("W002", Action::Warn, Mode::Enforce).await,
        1,
        "W002 warning recorded"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn strict_w008_drop_database_is_blocked() {
    let s = Scenario::start("w008", Some(STRICT)).await;
    let msg = s
        .expect_blocked("W008", "dropDatabase", s.w.client.database(&s.db).drop())
        .await;
    assert!(msg.contains("drop-database"), "{msg}");
    assert_unchanged(&s).await;
    s.still_serves().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn strict_q002_where_find_is_blocked() {
    let s = Scenario::start("q002", Some(STRICT)).await;
    let coll = s.coll();
    let msg = s
        .expect_blocked("Q002", "find", async move {
            let cursor = coll.find(doc! {"$where": "this.v == 1"}).await?;
            cursor.try_collect::<Vec<Document>>().await
        })
        .await;
    assert!(msg.contains("server-side-javascript"), "{msg}");
    s.still_serves().await;
    s.finish().await;
}

// ------------------------------------------------------------------------------------------
// warn-only rules and audit mode: forwarded and recorded
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn w004_delete_many_with_filter_is_forwarded_and_recorded() {
    let s = Scenario::start("w004", None).await;
    let before = s.gs.upstream_count("delete");
    let r = s
        .coll()
        .delete_many(doc! {"g": "b"})
        .await
        .expect("delete_many with a real filter is allowed");
    assert_eq!(r.deleted_count, 1);
    s.assert_reached_upstream("W004", "delete", before, 1);
    assert_eq!(s.w.started("delete"), 1);
    assert_eq!(s.gs.blocked(), 0, "nothing was blocked");
    assert_eq!(
        s.gs.violations("W004", Action::Warn, Mode::Enforce).await,
        1,
        "W004 warning recorded"
    );
    assert_eq!(
        s.gs.violations("W004", Action::Block, Mode::Enforce).await,
        0
    );
    let stored = s.stored().await;
    assert_eq!(stored, seed()[..2].to_vec(), "the delete happened upstream");
    s.finish().await;
}

async fn audit_mode_forwards_w001(tag: &str, policy: &str) {
    let s = Scenario::start(tag, Some(policy)).await;
    let before = s.gs.upstream_count("update");
    let r = s
        .coll()
        .update_many(doc! {}, doc! {"$set": {"x": 1}})
        .await
        .expect("in audit mode W001 only warns");
    assert_eq!(r.matched_count, 3);
    s.assert_reached_upstream(&format!("W001 in audit mode ({tag})"), "update", before, 1);
    assert_eq!(s.gs.blocked(), 0, "audit mode blocked");
    assert_eq!(
        s.gs.violations("W001", Action::Warn, Mode::Audit).await,
        1,
        "W001 recorded as a warning in audit mode"
    );
    assert_eq!(s.gs.violations("W001", Action::Block, Mode::Audit).await, 0);
    assert_eq!(
        s.gs.violations("W001", Action::Block, Mode::Enforce).await,
        0
    );
    let stored = s.stored().await;
    assert!(
        stored.iter().all(|d| d.get_i32("x").ok() == Some(1)),
        "the update did not happen upstream: {stored:?}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_mode_on_standard_forwards_w001_as_a_warning() {
    audit_mode_forwards_w001("auditmode", STANDARD_AUDIT_MODE).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_profile_forwards_w001_as_a_warning() {
    audit_mode_forwards_w001("auditprof", AUDIT_PROFILE).await;
}

/// Allowed traffic passes untouched: a filtered update_many and a normal insert are forwarded
/// and record no block.
#[tokio::test(flavor = "multi_thread")]
async fn conditioned_writes_pass() {
    let s = Scenario::start("pass", None).await;
    let r = s
        .coll()
        .update_many(doc! {"g": "a"}, doc! {"$set": {"x": 1}})
        .await
        .expect("filtered update_many is allowed");
    assert_eq!(r.modified_count, 2);
    s.coll()
        .insert_one(doc! {"_id": 4, "v": 4, "g": "b"})
        .await
        .expect("insert is allowed");
    assert_eq!(s.gs.blocked(), 0);
    assert_eq!(s.stored().await.len(), 4);
    s.finish().await;
}
