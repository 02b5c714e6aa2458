//! Raw-wire attempts to get a blocked write past mongoguard. None may reach the upstream.
//!
//! Every test runs the built-in `standard` profile in front of a stand-in, speaks the wire
//! protocol by hand (`support::guard::WireConn`), and sends one blocked write in a disguise:
//! compressed, in a kind-1 document sequence, through OP_QUERY (plain and `$query`-wrapped),
//! as a legacy opcode, through `bulkWrite`'s `nsInfo`, as an aggregation output stage, with
//! numbers of other BSON types, with duplicate keys, with tautological filters, or fire-and-forget
//! (moreToCome). It then checks:
//!
//! * the reply is mongoguard's block (`ok: 0`, code 65001, the rule in errmsg, no labels), in
//!   the request's opcode family; or, for carriers without a reply, that the next getLastError
//!   on the same connection reports the block;
//! * the stand-in received no message at all for it (its message counter did not move);
//! * the same connection still serves a ping, and the seeded data is unchanged.

mod support;

use bson::{rawdoc, Bson, Document, RawDocumentBuf};
use mongoguard::wire::builder::{encode_query, encode_update, MsgBuilder, Sequence};
use mongoguard::wire::compression::{compress, Compressor};

use support::guard::{
    assert_block_reply, assert_last_error_blocked, assert_ok_reply, guard_standin_stack,
    GuardStack, WireConn,
};
use support::unique_db;

const COLL: &str = "c";

/// A guarded stand-in stack with one raw connection (after hello) and a seeded collection.
struct Bypass {
    gs: GuardStack,
    c: WireConn,
    db: String,
}

impl Bypass {
    async fn start(tag: &str) -> Bypass {
        Bypass::with_compressors(tag, &[]).await
    }

    async fn with_compressors(tag: &str, compressors: &[&str]) -> Bypass {
        let gs = guard_standin_stack(tag, None).await;
        let (mut c, hello) = WireConn::connect_hello(gs.proxy.local_addr(), compressors).await;
        for name in compressors {
            let offered = hello
                .get_array("compression")
                .map(|a| a.iter().any(|v| v.as_str() == Some(name)))
                .unwrap_or(false);
            assert!(offered, "compression {name} not negotiated: {hello}");
        }
        let db = unique_db(tag);
        let reply = c
            .msg(rawdoc! {
                "insert": COLL,
                "documents": [
                    {"_id": 1, "a": 1, "g": "a"},
                    {"_id": 2, "a": 2, "g": "a"},
                    {"_id": 3, "a": 3, "g": "b"},
                ],
                "$db": db.as_str(),
            })
            .await;
        assert_ok_reply(&reply, "seed insert");
        Bypass { gs, c, db }
    }

    fn messages(&self) -> u64 {
        self.gs.upstream_messages().expect("stand-in upstream")
    }

    fn count(&self, name: &str) -> u64 {
        self.gs.upstream_count(name).expect("stand-in upstream")
    }

    fn db(&self) -> &str {
        &self.db
    }

    /// The current documents of the seeded collection, read on the same connection.
    async fn docs(&mut self) -> Vec<Document> {
        let db = self.db.clone();
        let r = self
            .c
            .msg(rawdoc! {"find": COLL, "filter": {}, "sort": {"_id": 1}, "$db": db})
            .await;
        assert_ok_reply(&r, "find");
        r.get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .unwrap_or_else(|e| panic!("find reply {r}: {e}"))
            .iter()
            .map(|d| d.as_document().expect("document").clone())
            .collect()
    }

    /// The seeded documents are exactly as inserted (nothing was updated or deleted).
    async fn assert_seed_intact(&mut self) {
        let docs = self.docs().await;
        let expected: Vec<Document> = vec![
            bson::doc! {"_id": 1, "a": 1, "g": "a"},
            bson::doc! {"_id": 2, "a": 2, "g": "a"},
            bson::doc! {"_id": 3, "a": 3, "g": "b"},
        ];
        assert_eq!(docs, expected, "the seeded data changed upstream");
    }

    /// Sends an OP_MSG that must be blocked with `rule`: the block reply, one block counted,
    /// nothing reached the stand-in, and the connection still serves a ping.
    async fn blocked_msg(&mut self, builder: MsgBuilder, rule: &str) -> Document {
        let messages = self.messages();
        let blocked = self.gs.blocked();
        let reply = self.c.msg_with(builder).await;
        assert_block_reply(&reply, rule);
        self.after_block(messages, blocked).await;
        reply
    }

    /// Same as [`blocked_msg`] for an OP_MSG body without sequences.
    async fn blocked(&mut self, body: RawDocumentBuf, rule: &str) -> Document {
        self.blocked_msg(MsgBuilder::new(body), rule).await
    }

    /// An OP_QUERY `db.$cmd` command that must be blocked: the reply is an OP_REPLY.
    async fn blocked_query(&mut self, db: &str, cmd: RawDocumentBuf, rule: &str) -> Document {
        let messages = self.messages();
        let blocked = self.gs.blocked();
        let reply = self.c.query_cmd(db, &cmd).await;
        assert_block_reply(&reply, rule);
        self.after_block(messages, blocked).await;
        reply
    }

    /// Checks after one blocked request (answered, or dropped and then asked about with an
    /// answered-locally getLastError): one block, no message upstream, and a ping works.
    async fn after_block(&mut self, messages_before: u64, blocked_before: u64) {
        assert_eq!(
            self.messages(),
            messages_before,
            "a message reached the upstream"
        );
        assert_eq!(self.gs.blocked(), blocked_before + 1, "blocks counted");
        self.c.ping().await;
        assert_eq!(
            self.messages(),
            messages_before + 1,
            "only the ping reached the upstream"
        );
    }

    /// A request with no reply channel was sent just before: a ping on the same connection
    /// (answered in order, so the dropped request was judged first) is the only message that
    /// reaches the upstream, and one block was counted.
    async fn after_dropped(&mut self, messages_before: u64, blocked_before: u64) {
        self.c.ping().await;
        assert_eq!(
            self.messages(),
            messages_before + 1,
            "only the ping reached the upstream"
        );
        assert_eq!(self.gs.blocked(), blocked_before + 1, "blocks counted");
    }

    /// A request with no reply channel was sent just before: the next getLastError (OP_QUERY)
    /// on the same connection must report `rule`, and nothing must have reached upstream.
    async fn dropped_then_gle(&mut self, messages_before: u64, blocked_before: u64, rule: &str) {
        let db = self.db.clone();
        let gle = self.c.get_last_error(&db).await;
        assert_last_error_blocked(&gle, rule);
        self.after_block(messages_before, blocked_before).await;
    }

    async fn finish(mut self) {
        self.c.ping().await;
        self.gs.shutdown().await;
    }
}

fn update_multi_all() -> RawDocumentBuf {
    rawdoc! {"q": {}, "u": {"$set": {"x": 1}}, "multi": true}
}

// ------------------------------------------------------------------------------------------
// OP_COMPRESSED
// ------------------------------------------------------------------------------------------

async fn compressed(name: &str, compressor: Compressor) {
    let mut b = Bypass::with_compressors(&format!("cmp_{name}"), &[name]).await;
    let db = b.db().to_string();
    let compressed_before = b.gs.standin().stats().compressed_messages();
    let messages = b.messages();
    let blocked = b.gs.blocked();
    let update = MsgBuilder::new(rawdoc! {
        "update": COLL, "updates": [update_multi_all()], "$db": db.as_str(),
    });
    let reply = b.c.msg_compressed(update, compressor).await;
    assert_block_reply(reply.doc(), "W001");
    b.after_block(messages, blocked).await;
    assert_eq!(
        b.gs.standin().stats().compressed_messages(),
        compressed_before,
        "a compressed message reached the upstream"
    );
    assert_eq!(b.count("update"), 0);

    // The same, as a delete of everything, and with the statement in a document sequence.
    let messages = b.messages();
    let blocked = b.gs.blocked();
    let delete = MsgBuilder::new(rawdoc! {"delete": COLL, "$db": db.as_str()}).sequence(
        Sequence::new("deletes", vec![rawdoc! {"q": {}, "limit": 0}]),
    );
    let reply = b.c.msg_compressed(delete, compressor).await;
    assert_block_reply(reply.doc(), "W003");
    b.after_block(messages, blocked).await;

    // A `$cmd` OP_QUERY inside OP_COMPRESSED: answered with an OP_REPLY.
    let messages = b.messages();
    let blocked = b.gs.blocked();
    let id = b.c.id();
    let query = encode_query(
        id,
        0,
        &format!("{db}.$cmd"),
        0,
        -1,
        &rawdoc! {"update": COLL, "updates": [update_multi_all()]},
        None,
    );
    let reply =
        b.c.round_trip(id, &compress(&query, compressor).unwrap())
            .await;
    assert_eq!(
        reply.op_code, 1,
        "compressed OP_QUERY answered with {reply:?}"
    );
    assert_block_reply(reply.doc(), "W001");
    b.after_block(messages, blocked).await;

    // A legacy OP_UPDATE inside OP_COMPRESSED: dropped, reported by getLastError.
    let messages = b.messages();
    let blocked = b.gs.blocked();
    let id = b.c.id();
    let legacy = encode_update(
        id,
        &format!("{db}.{COLL}"),
        OP_UPDATE_MULTI,
        &rawdoc! {},
        &rawdoc! {"$set": {"x": 1}},
    );
    b.c.send(&compress(&legacy, compressor).unwrap()).await;
    b.dropped_then_gle(messages, blocked, "W001").await;
    assert_eq!(b.count("op_update"), 0);
    assert_eq!(b.count("op_query"), 0);

    // An allowed compressed command still goes through (compression was really negotiated).
    let find = MsgBuilder::new(rawdoc! {"find": COLL, "filter": {"_id": 1}, "$db": db.as_str()});
    let reply = b.c.msg_compressed(find, compressor).await;
    assert_ok_reply(reply.doc(), "compressed find");
    assert_eq!(
        b.gs.standin().stats().compressed_messages(),
        compressed_before + 1,
        "the allowed compressed find reached the upstream compressed"
    );
    assert_eq!(b.count("delete"), 0);
    b.assert_seed_intact().await;
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compressed_snappy_update_is_blocked() {
    compressed("snappy", Compressor::Snappy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compressed_zlib_update_is_blocked() {
    compressed("zlib", Compressor::Zlib).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compressed_zstd_update_is_blocked() {
    compressed("zstd", Compressor::Zstd).await;
}

// ------------------------------------------------------------------------------------------
// kind-1 document sequences
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn updates_in_a_document_sequence_are_checked() {
    let mut b = Bypass::start("seq").await;
    let db = b.db().to_string();
    let reply = b
        .blocked_msg(
            MsgBuilder::new(rawdoc! {"update": COLL, "$db": db.as_str()})
                .sequence(Sequence::new("updates", vec![update_multi_all()])),
            "W001",
        )
        .await;
    assert!(
        reply.get_str("errmsg").unwrap().contains("(statement 0)"),
        "{reply}"
    );

    // A harmless first statement and an offending second one: the whole batch is blocked and
    // the reply names statement 1.
    let reply = b
        .blocked_msg(
            MsgBuilder::new(rawdoc! {"update": COLL, "ordered": true, "$db": db.as_str()})
                .sequence(Sequence::new(
                    "updates",
                    vec![
                        rawdoc! {"q": {"_id": 1}, "u": {"$set": {"x": 1}}},
                        update_multi_all(),
                    ],
                )),
            "W001",
        )
        .await;
    let errmsg = reply.get_str("errmsg").unwrap();
    assert!(
        errmsg.contains("W001 multi-update-without-filter (statement 1)"),
        "{reply}"
    );
    assert!(!errmsg.contains("(statement 0)"), "{reply}");

    // Deletes in a sequence, the offending one second.
    let reply = b
        .blocked_msg(
            MsgBuilder::new(rawdoc! {"delete": COLL, "$db": db.as_str()}).sequence(Sequence::new(
                "deletes",
                vec![
                    rawdoc! {"q": {"_id": 3}, "limit": 1},
                    rawdoc! {"q": {}, "limit": 0},
                ],
            )),
            "W003",
        )
        .await;
    assert!(
        reply.get_str("errmsg").unwrap().contains("(statement 1)"),
        "{reply}"
    );

    // Inserts into admin in a sequence.
    b.blocked_msg(
        MsgBuilder::new(rawdoc! {"insert": "seqx", "$db": "admin"})
            .sequence(Sequence::new("documents", vec![rawdoc! {"_id": 1}])),
        "W005",
    )
    .await;

    assert_eq!(b.count("update"), 0);
    assert_eq!(b.count("delete"), 0);
    assert_eq!(
        b.count("insert"),
        1,
        "only the seed insert reached the upstream"
    );
    b.assert_seed_intact().await;
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// OP_QUERY on $cmd
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn op_query_cmd_update_and_delete_are_blocked_with_op_reply() {
    let mut b = Bypass::start("opq").await;
    let db = b.db().to_string();
    b.blocked_query(
        &db,
        rawdoc! {"update": COLL, "updates": [update_multi_all()]},
        "W001",
    )
    .await;
    b.blocked_query(
        &db,
        rawdoc! {"delete": COLL, "deletes": [{"q": {}, "limit": 0}]},
        "W003",
    )
    .await;
    b.blocked_query(
        "admin",
        rawdoc! {"insert": "opqx", "documents": [{"_id": 1}]},
        "W005",
    )
    .await;
    assert_eq!(b.count("op_query"), 0, "an OP_QUERY reached the upstream");
    assert_eq!(b.count("update"), 0);
    assert_eq!(b.count("delete"), 0);
    b.assert_seed_intact().await;
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn op_query_cmd_wrapped_in_query_is_blocked() {
    let mut b = Bypass::start("opqwrap").await;
    let db = b.db().to_string();
    b.blocked_query(
        &db,
        rawdoc! {
            "$query": {"update": COLL, "updates": [update_multi_all()]},
            "$readPreference": {"mode": "primary"},
        },
        "W001",
    )
    .await;
    b.blocked_query(
        &db,
        rawdoc! {
            "query": {"delete": COLL, "deletes": [{"q": {}, "limit": 0}]},
            "$readPreference": {"mode": "primary"},
        },
        "W003",
    )
    .await;
    assert_eq!(b.count("op_query"), 0, "an OP_QUERY reached the upstream");
    b.assert_seed_intact().await;
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// Legacy opcodes: dropped, reported by the next getLastError
// ------------------------------------------------------------------------------------------

const OP_UPDATE_MULTI: i32 = 1 << 1;
const OP_DELETE_SINGLE_REMOVE: i32 = 1;

#[tokio::test(flavor = "multi_thread")]
async fn legacy_op_update_multi_with_empty_selector_is_dropped() {
    let mut b = Bypass::start("legupd").await;
    let ns = format!("{}.{COLL}", b.db());
    let (m, k) = (b.messages(), b.gs.blocked());
    b.c.legacy_update(
        &ns,
        OP_UPDATE_MULTI,
        &rawdoc! {},
        &rawdoc! {"$set": {"x": 1}},
    )
    .await;
    b.dropped_then_gle(m, k, "W001").await;
    assert_eq!(
        b.count("op_update"),
        0,
        "the OP_UPDATE reached the upstream"
    );
    b.assert_seed_intact().await;
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_op_delete_without_single_remove_is_dropped() {
    let mut b = Bypass::start("legdel").await;
    let ns = format!("{}.{COLL}", b.db());
    let (m, k) = (b.messages(), b.gs.blocked());
    b.c.legacy_delete(&ns, 0, &rawdoc! {}).await;
    b.dropped_then_gle(m, k, "W003").await;
    assert_eq!(
        b.count("op_delete"),
        0,
        "the OP_DELETE reached the upstream"
    );
    b.assert_seed_intact().await;

    // Control: a single-remove legacy delete with a filter is forwarded.
    b.c.legacy_delete(&ns, OP_DELETE_SINGLE_REMOVE, &rawdoc! {"_id": 3})
        .await;
    b.c.ping().await;
    assert_eq!(
        b.count("op_delete"),
        1,
        "the allowed OP_DELETE was not forwarded"
    );
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_op_insert_into_admin_is_dropped() {
    let mut b = Bypass::start("legins").await;
    let (m, k) = (b.messages(), b.gs.blocked());
    b.c.legacy_insert("admin.legacyx", &[&rawdoc! {"_id": 1}])
        .await;
    b.dropped_then_gle(m, k, "W005").await;
    assert_eq!(
        b.count("op_insert"),
        0,
        "the OP_INSERT reached the upstream"
    );
    // The next getLastError (nothing blocked since) is the upstream's again.
    let db = b.db().to_string();
    let gle = b.c.get_last_error(&db).await;
    assert!(
        !gle.get_str("err").is_ok_and(|e| e.contains("W005")),
        "a block is reported only once: {gle}"
    );
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// bulkWrite, aggregation output stages, other W005 carriers
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn bulk_write_is_checked_through_ns_info() {
    let mut b = Bypass::start("bulk").await;
    let ns = format!("{}.{COLL}", b.db());
    b.blocked(
        rawdoc! {
            "bulkWrite": 1,
            "ops": [{"insert": 0, "document": {"_id": 1}}],
            "nsInfo": [{"ns": "config.x"}],
            "$db": "admin",
        },
        "W005",
    )
    .await;
    b.blocked(
        rawdoc! {
            "bulkWrite": 1,
            "ops": [
                {"update": 0, "filter": {"_id": 1}, "updateMods": {"$set": {"y": 1}}},
                {"update": 0, "filter": {}, "updateMods": {"$set": {"x": 1}}, "multi": true},
            ],
            "nsInfo": [{"ns": ns.as_str()}],
            "$db": "admin",
        },
        "W001",
    )
    .await;
    b.blocked(
        rawdoc! {
            "bulkWrite": 1,
            "ops": [{"delete": 0, "filter": {}, "multi": true}],
            "nsInfo": [{"ns": ns.as_str()}],
            "$db": "admin",
        },
        "W003",
    )
    .await;
    // Drivers send ops and nsInfo as document sequences; the second namespace is the bad one.
    b.blocked_msg(
        MsgBuilder::new(rawdoc! {"bulkWrite": 1, "$db": "admin"})
            .sequence(Sequence::new(
                "ops",
                vec![
                    rawdoc! {"insert": 0, "document": {"_id": 9}},
                    rawdoc! {"insert": 1, "document": {"_id": 9}},
                ],
            ))
            .sequence(Sequence::new(
                "nsInfo",
                vec![rawdoc! {"ns": ns.as_str()}, rawdoc! {"ns": "local.x"}],
            )),
        "W005",
    )
    .await;
    b.blocked_msg(
        MsgBuilder::new(rawdoc! {"bulkWrite": 1, "$db": "admin"})
            .sequence(Sequence::new(
                "ops",
                vec![rawdoc! {"update": 0, "filter": {}, "updateMods": {"$set": {"x": 1}}, "multi": 1}],
            ))
            .sequence(Sequence::new("nsInfo", vec![rawdoc! {"ns": ns.as_str()}])),
        "W001",
    )
    .await;
    assert_eq!(b.count("bulkwrite"), 0);
    b.assert_seed_intact().await;
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregate_merge_and_out_into_admin_are_blocked() {
    let mut b = Bypass::start("aggout").await;
    let db = b.db().to_string();
    for stage in [
        rawdoc! {"$merge": {"into": {"db": "admin", "coll": "x"}}},
        rawdoc! {"$merge": {"into": {"db": "config", "coll": "x"}, "whenMatched": "replace"}},
        rawdoc! {"$out": {"db": "admin", "coll": "x"}},
        rawdoc! {"$out": {"db": "local", "coll": "x"}},
        rawdoc! {"$out": "system.js"},
        rawdoc! {"$merge": {"into": "system.views"}},
        rawdoc! {"$merge": "system.profile"},
    ] {
        b.blocked(
            rawdoc! {
                "aggregate": COLL,
                "pipeline": [{"$match": {"g": "a"}}, stage],
                "cursor": {},
                "$db": db.as_str(),
            },
            "W005",
        )
        .await;
    }
    // `$out: "x"` from an aggregate running on admin writes admin.x.
    b.blocked(
        rawdoc! {
            "aggregate": 1,
            "pipeline": [{"$documents": [{"a": 1}]}, {"$out": "x"}],
            "cursor": {},
            "$db": "admin",
        },
        "W005",
    )
    .await;
    assert_eq!(b.count("aggregate"), 0);
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn other_system_namespace_writes_are_blocked() {
    let mut b = Bypass::start("sysns").await;
    let db = b.db().to_string();
    let from = format!("{db}.{COLL}");
    for (body, what) in [
        (
            rawdoc! {"renameCollection": from.as_str(), "to": "admin.stolen", "$db": "admin"},
            "rename into admin",
        ),
        (rawdoc! {"create": "x", "$db": "config"}, "create in config"),
        (
            rawdoc! {"insert": "system.users", "documents": [{"_id": "u"}], "$db": db.as_str()},
            "system.users",
        ),
        (
            rawdoc! {"update": "x", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 1}}}], "$db": "local"},
            "update in local",
        ),
        (
            rawdoc! {"findAndModify": "x", "query": {"_id": 1}, "update": {"$set": {"a": 1}}, "$db": "admin"},
            "findAndModify in admin",
        ),
        (
            rawdoc! {"drop": "system.js", "$db": db.as_str()},
            "drop system.js",
        ),
        (
            rawdoc! {"createIndexes": "x", "indexes": [{"key": {"a": 1}, "name": "a_1"}], "$db": "admin"},
            "createIndexes in admin",
        ),
        (
            rawdoc! {"applyOps": [{"op": "i", "ns": "admin.x", "o": {"_id": 1}}], "$db": "admin"},
            "applyOps into admin",
        ),
        (
            rawdoc! {"applyOps": [{"op": "c", "ns": format!("{db}.$cmd"), "o": {"drop": "system.js"}}], "$db": "admin"},
            "applyOps command on system.js",
        ),
        (
            rawdoc! {
                "mapReduce": COLL,
                "map": "function() { emit(this.g, 1); }",
                "reduce": "function(k, v) { return Array.sum(v); }",
                "out": {"replace": "x", "db": "admin"},
                "$db": db.as_str(),
            },
            "mapReduce output into admin",
        ),
        (
            rawdoc! {"dropDatabase": 1, "$db": "config"},
            "dropDatabase config",
        ),
    ] {
        let reply = b.blocked(body, "W005").await;
        assert!(
            reply
                .get_str("errmsg")
                .unwrap()
                .contains("system-namespace-write"),
            "{what}: {reply}"
        );
    }
    b.assert_seed_intact().await;
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// Numbers of every BSON type
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn numeric_variants_of_multi_limit_and_j_are_blocked() {
    let mut b = Bypass::start("numeric").await;
    let db = b.db().to_string();
    let one_dec: bson::Decimal128 = "1".parse().unwrap();
    let zero_dec: bson::Decimal128 = "0.00".parse().unwrap();
    for multi in [
        Bson::Int32(1),
        Bson::Double(1.0),
        Bson::Int64(1),
        Bson::Int32(-1),
        Bson::Double(0.5),
        Bson::Decimal128(one_dec),
    ] {
        let mut d = bson::doc! {"q": {}, "u": {"$set": {"x": 1}}};
        d.insert("multi", multi.clone());
        let stmt = RawDocumentBuf::try_from(&d).unwrap();
        let reply = b
            .blocked(
                rawdoc! {"update": COLL, "updates": [stmt], "$db": db.as_str()},
                "W001",
            )
            .await;
        assert!(reply.get_str("errmsg").is_ok(), "multi: {multi:?}");
    }
    for limit in [
        Bson::Int32(0),
        Bson::Double(0.0),
        Bson::Double(-0.0),
        Bson::Int64(0),
        Bson::Decimal128(zero_dec),
    ] {
        let mut d = bson::doc! {"q": {}};
        d.insert("limit", limit.clone());
        let stmt = RawDocumentBuf::try_from(&d).unwrap();
        b.blocked(
            rawdoc! {"delete": COLL, "deletes": [stmt], "$db": db.as_str()},
            "W003",
        )
        .await;
    }
    for j in [
        Bson::Boolean(false),
        Bson::Int32(0),
        Bson::Double(0.0),
        Bson::Int64(0),
    ] {
        let mut wc = bson::doc! {"w": 1};
        wc.insert("j", j.clone());
        let wc = RawDocumentBuf::try_from(&wc).unwrap();
        b.blocked(
            rawdoc! {
                "insert": COLL,
                "documents": [{"_id": 100, "a": 100}],
                "writeConcern": wc,
                "$db": db.as_str(),
            },
            "W006",
        )
        .await;
    }
    // j: 0 on a non-write command counts too ("any command").
    b.blocked(
        rawdoc! {"commitTransaction": 1, "writeConcern": {"j": 0}, "$db": "admin"},
        "W006",
    )
    .await;
    assert_eq!(b.count("update"), 0);
    assert_eq!(b.count("delete"), 0);
    assert_eq!(
        b.count("insert"),
        1,
        "only the seed insert reached the upstream"
    );
    b.assert_seed_intact().await;
    b.finish().await;
}

/// Values mongod refuses (or that mongoguard cannot read) are not guessed towards "one":
/// the command is blocked as unreadable (G001) and never reaches the upstream.
#[tokio::test(flavor = "multi_thread")]
async fn unreadable_multi_and_limit_fail_closed() {
    let mut b = Bypass::start("unreadable").await;
    let db = b.db().to_string();
    b.blocked(
        rawdoc! {"update": COLL, "updates": [{"q": {}, "u": {"$set": {"x": 1}}, "multi": "yes"}], "$db": db.as_str()},
        "G001",
    )
    .await;
    b.blocked(
        rawdoc! {"delete": COLL, "deletes": [{"q": {}, "limit": "0"}], "$db": db.as_str()},
        "G001",
    )
    .await;
    b.blocked(
        rawdoc! {"delete": COLL, "deletes": [{"q": {}, "limit": true}], "$db": db.as_str()},
        "G001",
    )
    .await;
    b.blocked(
        rawdoc! {"delete": COLL, "deletes": [{"q": {}}], "$db": db.as_str()},
        "G001",
    )
    .await;
    b.assert_seed_intact().await;
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// Duplicate keys
// ------------------------------------------------------------------------------------------

/// Encodes a document with the given (possibly repeated) keys, values taken from single-key
/// documents.
fn dup_doc(fields: &[(&str, Bson)]) -> RawDocumentBuf {
    let mut body = Vec::new();
    for (k, v) in fields {
        let mut d = Document::new();
        d.insert(*k, v.clone());
        let one = RawDocumentBuf::try_from(&d).unwrap();
        let bytes = one.as_bytes();
        body.extend_from_slice(&bytes[4..bytes.len() - 1]);
    }
    let mut full = ((body.len() + 5) as i32).to_le_bytes().to_vec();
    full.extend_from_slice(&body);
    full.push(0);
    RawDocumentBuf::from_bytes(full).expect("a document with repeated keys")
}

fn harmless_updates() -> Bson {
    Bson::Array(vec![Bson::Document(
        bson::doc! {"q": {"_id": 1}, "u": {"$set": {"y": 1}}},
    )])
}

fn offending_updates() -> Bson {
    Bson::Array(vec![Bson::Document(
        bson::doc! {"q": {}, "u": {"$set": {"x": 1}}, "multi": true},
    )])
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicate_top_level_keys_close_the_connection() {
    let gs = guard_standin_stack("dupkeys", None).await;
    let db = unique_db("dupkeys");
    let addr = gs.proxy.local_addr();
    let bodies = [
        // The guard would read the harmless first `updates`, a last-wins server the second.
        dup_doc(&[
            ("update", Bson::String(COLL.into())),
            ("updates", harmless_updates()),
            ("updates", offending_updates()),
            ("$db", Bson::String(db.clone())),
        ]),
        // Two databases: the guard must not pick one.
        dup_doc(&[
            ("insert", Bson::String("x".into())),
            (
                "documents",
                Bson::Array(vec![Bson::Document(bson::doc! {"_id": 1})]),
            ),
            ("$db", Bson::String(db.clone())),
            ("$db", Bson::String("admin".into())),
        ]),
        // Two write concerns.
        dup_doc(&[
            ("insert", Bson::String(COLL.into())),
            (
                "documents",
                Bson::Array(vec![Bson::Document(bson::doc! {"_id": 50})]),
            ),
            ("writeConcern", Bson::Document(bson::doc! {"j": true})),
            ("writeConcern", Bson::Document(bson::doc! {"j": false})),
            ("$db", Bson::String(db.clone())),
        ]),
    ];
    for (i, body) in bodies.into_iter().enumerate() {
        let (mut c, _) = WireConn::connect_hello(addr, &[]).await;
        let messages = gs.upstream_messages().unwrap();
        let id = c.id();
        c.send(&MsgBuilder::new(body).encode(id, 0)).await;
        c.expect_closed().await;
        assert_eq!(
            gs.upstream_messages().unwrap(),
            messages,
            "body {i}: the stand-in saw the duplicate-key command"
        );
    }
    // Through OP_QUERY, plain and inside a $query wrapper.
    let dup_query = dup_doc(&[
        ("delete", Bson::String(COLL.into())),
        (
            "deletes",
            Bson::Array(vec![Bson::Document(
                bson::doc! {"q": {"_id": 1}, "limit": 1},
            )]),
        ),
        (
            "deletes",
            Bson::Array(vec![Bson::Document(bson::doc! {"q": {}, "limit": 0})]),
        ),
    ]);
    let wrapped = {
        let mut d = Vec::new();
        // {$query: <dup_query>, $readPreference: {mode: primary}}
        let mut body = Vec::new();
        body.push(0x03u8);
        body.extend_from_slice(b"$query\0");
        body.extend_from_slice(dup_query.as_bytes());
        let rp =
            RawDocumentBuf::try_from(&bson::doc! {"$readPreference": {"mode": "primary"}}).unwrap();
        body.extend_from_slice(&rp.as_bytes()[4..rp.as_bytes().len() - 1]);
        d.extend_from_slice(&((body.len() + 5) as i32).to_le_bytes());
        d.extend_from_slice(&body);
        d.push(0);
        RawDocumentBuf::from_bytes(d).unwrap()
    };
    for (i, q) in [dup_query, wrapped].into_iter().enumerate() {
        let (mut c, _) = WireConn::connect_hello(addr, &[]).await;
        let messages = gs.upstream_messages().unwrap();
        let id = c.id();
        let bytes = encode_query(id, 0, &format!("{db}.$cmd"), 0, -1, &q, None);
        c.send(&bytes).await;
        c.expect_closed().await;
        assert_eq!(
            gs.upstream_messages().unwrap(),
            messages,
            "OP_QUERY {i}: the stand-in saw the duplicate-key command"
        );
    }
    assert_eq!(gs.upstream_count("update"), Some(0));
    assert_eq!(gs.upstream_count("delete"), Some(0));
    assert_eq!(gs.upstream_count("insert"), Some(0));
    // The proxy still serves a new connection.
    let (mut c, _) = WireConn::connect_hello(addr, &[]).await;
    c.ping().await;
    gs.shutdown().await;
}

// ------------------------------------------------------------------------------------------
// Tautologies
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn tautological_filters_are_treated_as_empty() {
    let mut b = Bypass::start("taut").await;
    let db = b.db().to_string();
    let filters = [
        rawdoc! {"$or": [{"a": 1}, {"_id": {"$exists": true}}]},
        rawdoc! {"$and": [{}, {"$expr": true}]},
        rawdoc! {"x": {"$nin": []}},
        rawdoc! {"_id": {"$exists": true}},
        rawdoc! {"$expr": 1},
        rawdoc! {"$or": [{"a": 1}, {}]},
        rawdoc! {"a": {"$not": {"$in": []}}},
        rawdoc! {"$comment": "everything"},
        rawdoc! {"$nor": [{"a": {"$in": []}}]},
        rawdoc! {"$where": "return true"},
        rawdoc! {"$where": "function() { return true; }"},
        rawdoc! {"$and": [{"_id": {"$exists": true}}, {"$or": [{"a": 5}, {"$expr": {"$literal": true}}]}]},
    ];
    for f in filters {
        let reply = b
            .blocked(
                rawdoc! {
                    "update": COLL,
                    "updates": [{"q": f.clone(), "u": {"$set": {"x": 1}}, "multi": true}],
                    "$db": db.as_str(),
                },
                "W001",
            )
            .await;
        assert!(reply.get_str("errmsg").is_ok(), "update filter {f:?}");
        b.blocked(
            rawdoc! {"delete": COLL, "deletes": [{"q": f.clone(), "limit": 0}], "$db": db.as_str()},
            "W003",
        )
        .await;
    }
    // A pipeline-style update of everything.
    b.blocked(
        rawdoc! {
            "update": COLL,
            "updates": [{"q": {}, "u": [{"$set": {"x": 1}}], "multi": true}],
            "$db": db.as_str(),
        },
        "W001",
    )
    .await;
    assert_eq!(b.count("update"), 0);
    assert_eq!(b.count("delete"), 0);
    b.assert_seed_intact().await;

    // Control: a real condition is forwarded (W004 only warns) and deletes just that.
    let r = b
        .c
        .msg(rawdoc! {"delete": COLL, "deletes": [{"q": {"g": "b"}, "limit": 0}], "$db": db.as_str()})
        .await;
    assert_ok_reply(&r, "filtered delete");
    assert_eq!(b.count("delete"), 1);
    assert_eq!(b.docs().await.len(), 2);
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// moreToCome
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn more_to_come_multi_update_is_dropped() {
    let mut b = Bypass::start("mtc").await;
    let db = b.db().to_string();
    let (m, k) = (b.messages(), b.gs.blocked());
    b.c.msg_more_to_come(MsgBuilder::new(rawdoc! {
        "update": COLL,
        "updates": [update_multi_all()],
        "writeConcern": {"w": 0},
        "$db": db.as_str(),
    }))
    .await;
    // A ping on the same connection gets its own reply (nothing stale, nothing lost).
    b.after_dropped(m, k).await;
    assert_eq!(
        b.count("update"),
        0,
        "the moreToCome update reached the upstream"
    );

    // A second one, then getLastError over OP_MSG reports it.
    let (m, k) = (b.messages(), b.gs.blocked());
    b.c.msg_more_to_come(
        MsgBuilder::new(rawdoc! {"delete": COLL, "writeConcern": {"w": 0}, "$db": db.as_str()})
            .sequence(Sequence::new(
                "deletes",
                vec![rawdoc! {"q": {}, "limit": 0}],
            )),
    )
    .await;
    let gle =
        b.c.msg(rawdoc! {"getLastError": 1, "$db": db.as_str()})
            .await;
    assert_last_error_blocked(&gle, "W003");
    b.after_block(m, k).await;
    assert_eq!(
        b.count("delete"),
        0,
        "the moreToCome delete reached the upstream"
    );
    b.assert_seed_intact().await;
    b.finish().await;
}

// ------------------------------------------------------------------------------------------
// explain is a read
// ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn explain_of_a_multi_update_is_forwarded() {
    let mut b = Bypass::start("explain").await;
    let db = b.db().to_string();
    let before = b.count("explain");
    let blocked = b.gs.blocked();
    let reply =
        b.c.msg(rawdoc! {
            "explain": {"update": COLL, "updates": [update_multi_all()]},
            "verbosity": "queryPlanner",
            "$db": db.as_str(),
        })
        .await;
    assert_ok_reply(&reply, "explain of a multi update");
    let reply =
        b.c.msg(rawdoc! {
            "explain": {"delete": COLL, "deletes": [{"q": {}, "limit": 0}]},
            "verbosity": "queryPlanner",
            "$db": db.as_str(),
        })
        .await;
    assert_ok_reply(&reply, "explain of a delete-many");
    assert_eq!(b.count("explain"), before + 2, "explain was not forwarded");
    assert_eq!(b.gs.blocked(), blocked, "explain was blocked");
    assert_eq!(b.count("update"), 0);
    b.assert_seed_intact().await;
    b.finish().await;
}

/// Two kind-1 sequences with one identifier, or a sequence that shadows a body field: the
/// guard and a server could read different statements, so the connection is closed.
#[tokio::test(flavor = "multi_thread")]
async fn duplicate_sequences_close_the_connection() {
    let gs = guard_standin_stack("dupseq", None).await;
    let db = unique_db("dupseq");
    let addr = gs.proxy.local_addr();
    let harmless = rawdoc! {"q": {"_id": 1}, "u": {"$set": {"y": 1}}};
    let builders = [
        MsgBuilder::new(rawdoc! {"update": COLL, "$db": db.as_str()})
            .sequence(Sequence::new("updates", vec![harmless.clone()]))
            .sequence(Sequence::new("updates", vec![update_multi_all()])),
        MsgBuilder::new(
            rawdoc! {"update": COLL, "updates": [harmless.clone()], "$db": db.as_str()},
        )
        .sequence(Sequence::new("updates", vec![update_multi_all()])),
    ];
    for (i, builder) in builders.into_iter().enumerate() {
        let (mut c, _) = WireConn::connect_hello(addr, &[]).await;
        let messages = gs.upstream_messages().unwrap();
        let id = c.id();
        c.send(&builder.encode(id, 0)).await;
        c.expect_closed().await;
        assert_eq!(
            gs.upstream_messages().unwrap(),
            messages,
            "case {i}: the stand-in saw the ambiguous command"
        );
    }
    assert_eq!(gs.upstream_count("update"), Some(0));
    let (mut c, _) = WireConn::connect_hello(addr, &[]).await;
    c.ping().await;
    gs.shutdown().await;
}

/// Repeated keys *inside* a statement, a writeConcern or an nsInfo entry. The guard reads the
/// first occurrence; a server that reads the last one (the stand-in does, as do parsers that
/// fill a map) would run a different write than the one the guard judged. Recent mongod
/// refuses such sub-documents (IDL duplicate-field error 40413); other upstreams may not.
/// Whatever mongoguard does with them (block, or close the connection), none may reach the
/// upstream.
#[tokio::test(flavor = "multi_thread")]
async fn nested_duplicate_keys_never_reach_the_upstream() {
    let gs = guard_standin_stack("nesteddup", None).await;
    let db = unique_db("nesteddup");
    let addr = gs.proxy.local_addr();
    let ns = format!("{db}.{COLL}");
    let empty = || Bson::Document(Document::new());
    let set_x = || Bson::Document(bson::doc! {"$set": {"x": 1}});
    let cases: Vec<(&str, RawDocumentBuf)> = vec![
        (
            "update multi: false, multi: true",
            rawdoc! {"update": COLL, "$db": db.as_str(), "updates": [dup_doc(&[
                ("q", empty()), ("u", set_x()),
                ("multi", Bson::Boolean(false)), ("multi", Bson::Boolean(true)),
            ])]},
        ),
        (
            "update q: {_id: 1}, q: {} (multi)",
            rawdoc! {"update": COLL, "$db": db.as_str(), "updates": [dup_doc(&[
                ("q", Bson::Document(bson::doc! {"_id": 1})), ("q", empty()),
                ("u", set_x()), ("multi", Bson::Boolean(true)),
            ])]},
        ),
        (
            "delete limit: 1, limit: 0",
            rawdoc! {"delete": COLL, "$db": db.as_str(), "deletes": [dup_doc(&[
                ("q", empty()), ("limit", Bson::Int32(1)), ("limit", Bson::Int32(0)),
            ])]},
        ),
        (
            "delete q: {_id: 1}, q: {} (limit 0)",
            rawdoc! {"delete": COLL, "$db": db.as_str(), "deletes": [dup_doc(&[
                ("q", Bson::Document(bson::doc! {"_id": 1})), ("q", empty()), ("limit", Bson::Int32(0)),
            ])]},
        ),
        (
            "writeConcern j: true, j: false",
            rawdoc! {"insert": COLL, "$db": db.as_str(), "documents": [{"_id": 9}],
            "writeConcern": dup_doc(&[("w", Bson::Int32(1)), ("j", Bson::Boolean(true)), ("j", Bson::Boolean(false))])},
        ),
        (
            "bulkWrite nsInfo ns: user, ns: admin",
            rawdoc! {"bulkWrite": 1, "$db": "admin", "ops": [{"insert": 0, "document": {"_id": 1}}],
            "nsInfo": [dup_doc(&[("ns", Bson::String(ns.clone())), ("ns", Bson::String("admin.x".into()))])]},
        ),
        (
            "$merge into {db: user, coll, db: admin}",
            rawdoc! {"aggregate": COLL, "$db": db.as_str(), "cursor": {}, "pipeline": [
                {"$merge": {"into": dup_doc(&[
                    ("db", Bson::String(db.clone())), ("coll", Bson::String("x".into())),
                    ("db", Bson::String("admin".into())),
                ])}},
            ]},
        ),
    ];
    let mut reached = Vec::new();
    for (what, body) in cases {
        let (mut c, _) = WireConn::connect_hello(addr, &[]).await;
        let messages = gs.upstream_messages().unwrap();
        let id = c.id();
        c.send(&MsgBuilder::new(body).encode(id, 0)).await;
        let outcome = match c.recv().await {
            None => "closed".to_string(),
            Some(r) => format!("{}", r.doc()),
        };
        if gs.upstream_messages().unwrap() != messages {
            reached.push(format!("{what}: reached the upstream, reply {outcome}"));
        }
    }
    assert!(reached.is_empty(), "forwarded:\n{}", reached.join("\n"));
    gs.shutdown().await;
}

/// Constant aggregation expressions that are always truthy: `$expr` of a constant comparison,
/// of an object or array literal, or of `$$ROOT` (always a document). mongod matches every
/// document with each of them; mongoguard currently calls them "unknown" and forwards the
/// multi update / delete-many as conditioned.
#[tokio::test(flavor = "multi_thread")]
async fn constant_expression_tautologies_are_treated_as_empty() {
    let mut b = Bypass::start("exprtaut").await;
    let db = b.db().to_string();
    let filters = [
        rawdoc! {"$expr": {"$eq": [1, 1]}},
        rawdoc! {"$expr": {"$gt": [2, 1]}},
        rawdoc! {"$expr": {}},
        rawdoc! {"$expr": [1]},
        rawdoc! {"$expr": "$$ROOT"},
    ];
    let mut forwarded = Vec::new();
    for f in filters {
        let before = b.gs.blocked();
        let r =
            b.c.msg(rawdoc! {
                "update": COLL,
                "updates": [{"q": f.clone(), "u": {"$set": {"x": 1}}, "multi": true}],
                "$db": db.as_str(),
            })
            .await;
        if b.gs.blocked() == before {
            forwarded.push(format!("{} -> {r}", Document::try_from(&*f).unwrap()));
        }
    }
    assert!(forwarded.is_empty(), "forwarded:\n{}", forwarded.join("\n"));
    b.finish().await;
}
