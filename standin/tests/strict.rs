//! The stand-in refuses what mongod refuses: each test names the mongod source it follows
//! (paths in github.com/mongodb/mongo). A test peer more lenient than mongod hides bugs.

mod common;

use std::time::Duration;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use common::*;
use mongodb::Client;
use mongoguard_standin::{ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};

async fn standin() -> StandIn {
    StandIn::start(StandInConfig::default()).await.unwrap()
}

fn code(r: &Document) -> i32 {
    assert_eq!(r.get("ok").and_then(Bson::as_f64), Some(0.0), "{r}");
    r.get_i32("code").unwrap()
}

fn ok(r: &Document) {
    assert_eq!(r.get("ok").and_then(Bson::as_f64), Some(1.0), "{r}");
}

fn metadata() -> Document {
    doc! {"driver": {"name": "t", "version": "1"}, "os": {"type": "linux"}}
}

/// src/mongo/rpc/metadata/client_metadata.cpp (`ClientMetadata::setFromMetadata`): once a
/// connection's first hello/isMaster has run (`ClientMetadata::tryFinalize` in
/// src/mongo/db/repl/replication_info.cpp), `client` is refused with 186 in any later one,
/// on OP_MSG and OP_QUERY alike; a hello without `client` is still fine.
#[tokio::test]
async fn client_metadata_only_in_the_first_hello() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    ok(&c
        .command(doc! {"hello": 1, "helloOk": true, "client": metadata(), "$db": "admin"})
        .await);
    for name in ["hello", "isMaster", "ismaster"] {
        let r = c
            .command(doc! {name: 1, "client": metadata(), "$db": "admin"})
            .await;
        assert_eq!(code(&r), 186, "{name}");
        assert_eq!(
            r.get_str("codeName").unwrap(),
            "ClientMetadataCannotBeMutated"
        );
        assert_eq!(
            r.get_str("errmsg").unwrap(),
            "The client metadata document may only be sent in the first hello"
        );
    }
    // A plain heartbeat is fine, and the connection stays usable.
    let r = c
        .command(doc! {"hello": 1, "helloOk": true, "$db": "admin"})
        .await;
    ok(&r);
    assert!(r.get_bool("isWritablePrimary").unwrap());

    // The first hello finalizes the metadata even without `client`.
    let mut c = Raw::connect(s.addr()).await;
    ok(&c.command(doc! {"hello": 1, "$db": "admin"}).await);
    let r = c
        .command(doc! {"hello": 1, "client": metadata(), "$db": "admin"})
        .await;
    assert_eq!(code(&r), 186);

    // OP_QUERY isMaster: the same rule.
    let mut c = Raw::connect(s.addr()).await;
    for expect in [None, Some(186)] {
        let id = c.next_id();
        c.send(&op_query(
            id,
            "admin.$cmd",
            0,
            -1,
            &doc! {"isMaster": 1, "client": metadata()},
        ))
        .await;
        let r = c.read().await;
        match expect {
            None => ok(r.doc()),
            Some(e) => assert_eq!(code(r.doc()), e),
        }
    }

    // A `client` that is not a document: TypeMismatch (ClientMetadata::parse), and the hello
    // did not run, so a good first hello can still follow.
    let mut c = Raw::connect(s.addr()).await;
    let r = c
        .command(doc! {"hello": 1, "client": "me", "$db": "admin"})
        .await;
    assert_eq!(code(&r), 14);
    ok(&c
        .command(doc! {"hello": 1, "client": metadata(), "$db": "admin"})
        .await);
    s.shutdown().await;
}

fn lsid(n: u8) -> Document {
    doc! {"id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![n; 16] }}
}

fn labels(r: &Document) -> Vec<String> {
    r.get_array("errorLabels")
        .map(|a| {
            a.iter()
                .filter_map(|l| l.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// endSessions and killSessions take `array<LogicalSessionFromClient>` (IDL:
/// src/mongo/db/session/logical_session_id.idl, generated parser rules in
/// src/mongo/idl/idl_parser.cpp; run in src/mongo/db/commands/end_sessions_command.cpp and
/// `makeLogicalSessionId` in src/mongo/db/session/logical_session_id_helpers.cpp): a
/// non-array argument or element is TypeMismatch, `id` must be a UUID, an unknown field is
/// 40415, a missing `id` 40414, and a `uid` (someone else's session) Unauthorized without the
/// impersonate privilege. Nothing is ended when the command is refused.
#[tokio::test]
async fn end_sessions_parses_its_sessions_as_mongod_does() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let generic = Binary {
        subtype: BinarySubtype::Generic,
        bytes: vec![1; 16],
    };
    let short = Binary {
        subtype: BinarySubtype::Uuid,
        bytes: vec![1; 15],
    };
    let cases = [
        (Bson::Int32(1), 14),
        (Bson::Array(vec![Bson::Int32(1)]), 14),
        (bson::bson!([{"id": generic}]), 14),
        (bson::bson!([{"id": short}]), 14),
        (bson::bson!([{"id": "x"}]), 14),
        (bson::bson!([{}]), 40414),
        (
            bson::bson!([lsid(1), {"id": lsid(2).get("id").unwrap().clone(), "x": 1}]),
            40415,
        ),
        (
            bson::bson!([{"id": lsid(2).get("id").unwrap().clone(), "uid": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 32] }}]),
            13,
        ),
    ];
    for name in ["endSessions", "killSessions"] {
        for (arg, want) in &cases {
            let r = c.command(doc! {name: arg.clone(), "$db": "admin"}).await;
            assert_eq!(code(&r), *want, "{name}: {arg} -> {r}");
        }
        ok(&c
            .command(doc! {name: [lsid(1), lsid(2)], "$db": "admin"})
            .await);
        ok(&c.command(doc! {name: [], "$db": "admin"}).await);
    }
    s.shutdown().await;
}

/// mongod 6.0+ (wire 17+): OP_QUERY serves only hello/isMaster and a few deprecated commands
/// (src/mongo/rpc/check_allowed_op_query_cmd.cpp: 352 UnsupportedOpQueryCommand); OP_QUERY
/// finds and OP_GET_MORE get an OP_REPLY `$err` with 5739101, the legacy writes are not
/// applied (src/mongo/db/service_entry_point_common.cpp, src/mongo/db/dbmessage.cpp). A
/// stand-in claiming an older wire version still serves them.
#[tokio::test]
async fn legacy_opcodes_follow_the_wire_version() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let query = |c: &mut Raw, ns: &'static str, q: Document| {
        let id = c.next_id();
        (id, op_query(id, ns, 0, -1, &q))
    };
    let (_, m) = query(&mut c, "admin.$cmd", doc! {"ping": 1});
    c.send(&m).await;
    let r = c.read().await;
    assert_eq!(code(r.doc()), 352);
    assert_eq!(
        r.doc().get_str("codeName").unwrap(),
        "UnsupportedOpQueryCommand"
    );
    assert!(r.doc().get_str("errmsg").unwrap().starts_with(
        "Unsupported OP_QUERY command: ping. The client driver may require an upgrade."
    ));
    for allowed in ["isMaster", "buildInfo"] {
        let (_, m) = query(&mut c, "admin.$cmd", doc! {allowed: 1});
        c.send(&m).await;
        ok(c.read().await.doc());
    }
    // The lower-case spelling is not on mongod's list.
    let (_, m) = query(&mut c, "admin.$cmd", doc! {"buildinfo": 1});
    c.send(&m).await;
    ok(c.read().await.doc());
    let (_, m) = query(&mut c, "admin.$cmd", doc! {"BuildInfo": 1});
    c.send(&m).await;
    assert_eq!(code(c.read().await.doc()), 352);

    ok(&c
        .command(doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"})
        .await);
    let (_, m) = query(&mut c, "d.c", doc! {});
    c.send(&m).await;
    let r = c.read().await;
    assert_eq!(r.flags & 2, 2, "QueryFailure");
    assert_eq!(r.doc().get_i32("code").unwrap(), 5739101);
    assert!(r
        .doc()
        .get_str("$err")
        .unwrap()
        .starts_with("OP_QUERY is no longer supported."));
    let id = c.next_id();
    c.send(&op_get_more(id, "d.c", 0, 1234)).await;
    let r = c.read().await;
    assert_eq!(r.doc().get_i32("code").unwrap(), 5739101);
    assert!(r
        .doc()
        .get_str("$err")
        .unwrap()
        .starts_with("OP_GET_MORE is no longer supported."));
    let id = c.next_id();
    c.send(&op_insert(id, "d.c", &[doc! {"_id": 2}])).await;
    let r = c.command(doc! {"count": "c", "$db": "d"}).await;
    assert_eq!(r.get_i32("n").unwrap(), 1, "OP_INSERT was applied");
    s.shutdown().await;

    // wire 13 (MongoDB 5.0): all served.
    let s = StandIn::start(StandInConfig {
        wire_version: 13,
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let mut c = Raw::connect(s.addr()).await;
    let (_, m) = query(&mut c, "admin.$cmd", doc! {"ping": 1});
    c.send(&m).await;
    ok(c.read().await.doc());
    let id = c.next_id();
    c.send(&op_insert(id, "d.c", &[doc! {"_id": 2}])).await;
    let (_, m) = query(&mut c, "d.c", doc! {});
    c.send(&m).await;
    let r = c.read().await;
    assert_eq!(r.docs.len(), 1);
    s.shutdown().await;
}

/// find/insert/update/delete/getMore/killCursors are `strict: true` IDL commands: an unknown
/// top-level field is IDLUnknownField 40415 (src/mongo/idl/idl_parser.cpp); generic
/// arguments (src/mongo/idl/generic_argument.idl) are accepted. The update and delete
/// statements are strict too, and a delete statement needs `limit`
/// (src/mongo/db/ops/write_ops.idl).
#[tokio::test]
async fn strict_commands_refuse_unknown_fields() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let cases = [
        (doc! {"find": "c", "filtr": {}, "$db": "d"}, "find.filtr"),
        (
            doc! {"insert": "c", "documents": [{}], "bypass": true, "$db": "d"},
            "insert.bypass",
        ),
        (
            doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}}], "multi": true, "$db": "d"},
            "update.multi",
        ),
        (
            doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "mutli": true}], "$db": "d"},
            "update.updates.mutli",
        ),
        (
            doc! {"delete": "c", "deletes": [{"q": {}, "limit": 0, "justOne": true}], "$db": "d"},
            "delete.deletes.justOne",
        ),
        (
            doc! {"getMore": 5i64, "collection": "c", "maxAwaitTimeMS": 5, "$db": "d"},
            "getMore.maxAwaitTimeMS",
        ),
        (
            doc! {"killCursors": "c", "cursors": [5i64], "ids": [], "$db": "d"},
            "killCursors.ids",
        ),
    ];
    for (cmd, path) in cases {
        let r = c.command(cmd).await;
        assert_eq!(code(&r), 40415, "{path}");
        assert_eq!(
            r.get_str("errmsg").unwrap(),
            format!("BSON field '{path}' is an unknown field.")
        );
    }
    let r = c
        .command(doc! {"delete": "c", "deletes": [{"q": {}}], "$db": "d"})
        .await;
    assert_eq!(code(&r), 40414);
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "BSON field 'delete.deletes.limit' is missing but a required field"
    );
    // Generic arguments and the commands' own fields are fine.
    ok(&c
        .command(doc! {
            "insert": "c", "documents": [{"_id": 1}], "ordered": true,
            "bypassDocumentValidation": false, "writeConcern": {"w": "majority", "wtimeout": 100},
            "lsid": lsid(1), "txnNumber": 1i64, "comment": "x", "maxTimeMS": 1000,
            "$readPreference": {"mode": "primary"}, "apiVersion": "1", "$db": "d",
        })
        .await);
    ok(&c
        .command(doc! {
            "find": "c", "filter": {}, "projection": {"_id": 1}, "sort": {"_id": 1},
            "limit": 5, "batchSize": 1, "singleBatch": false, "hint": {"_id": 1},
            "readConcern": {"level": "local"}, "$db": "d",
        })
        .await);
    s.shutdown().await;
}

/// `writeConcern.w` as src/mongo/db/write_concern_idl.cpp parses it (FailedToParse, 9).
#[tokio::test]
async fn write_concern_is_validated() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let bad = [
        (
            Bson::Boolean(true),
            "w has to be a number, string, or object; found: bool",
        ),
        (
            Bson::Int32(-1),
            "w has to be a non-negative number and not greater than 50; found: -1",
        ),
        (
            Bson::Int32(51),
            "w has to be a non-negative number and not greater than 50; found: 51",
        ),
        (
            Bson::Document(doc! {}),
            "tagged write concern requires tags",
        ),
        (
            Bson::Array(vec![]),
            "w has to be a number, string, or object; found: array",
        ),
    ];
    for (w, msg) in bad {
        let r = c
            .command(doc! {"insert": "c", "documents": [{}], "writeConcern": {"w": w.clone()}, "$db": "d"})
            .await;
        assert_eq!(code(&r), 9, "{w}");
        assert_eq!(r.get_str("errmsg").unwrap(), msg);
    }
    let r = c
        .command(doc! {"insert": "c", "documents": [{}], "writeConcern": 1, "$db": "d"})
        .await;
    assert_eq!(code(&r), 14);
    for w in [
        Bson::Int32(0),
        Bson::Int32(1),
        Bson::String("majority".into()),
        Bson::Document(doc! {"dc": 1}),
    ] {
        let r = c
            .command(doc! {"insert": "c", "documents": [{}], "writeConcern": {"w": w}, "$db": "d"})
            .await;
        ok(&r);
    }
    let r = c.command(doc! {"count": "c", "$db": "d"}).await;
    assert_eq!(r.get_i32("n").unwrap(), 4, "a refused write was applied");
    s.shutdown().await;
}

/// getMore is checked as src/mongo/db/commands/query_cmd/getmore_cmd.cpp checks it: the
/// user that opened the cursor, the namespace (Unauthorized, 13), the session (50736-50738)
/// and the transaction (50739-50741).
#[tokio::test]
async fn get_more_checks_the_cursor_owner() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i}).collect();
    ok(&c
        .command(doc! {"insert": "c", "documents": docs, "$db": "d"})
        .await);
    let open = |c: &mut Raw, session: Option<u8>| {
        let mut cmd = doc! {"find": "c", "batchSize": 1, "$db": "d"};
        if let Some(n) = session {
            cmd.insert("lsid", lsid(n));
        }
        let id = c.next_id();
        (id, op_msg(id, 0, &cmd, None))
    };
    let cursor_of = |r: &Document| r.get_document("cursor").unwrap().get_i64("id").unwrap();

    let (_, m) = open(&mut c, None);
    c.send(&m).await;
    let id = cursor_of(c.read().await.doc());
    let r = c
        .command(doc! {"getMore": id, "collection": "other", "$db": "d"})
        .await;
    assert_eq!(code(&r), 13);
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "Requested getMore on namespace 'd.other', but cursor belongs to a different namespace d.c"
    );
    let r = c
        .command(doc! {"getMore": id, "collection": "c", "lsid": lsid(7), "$db": "d"})
        .await;
    assert_eq!(code(&r), 50736);
    ok(&c
        .command(doc! {"getMore": id, "collection": "c", "$db": "d"})
        .await);

    let (_, m) = open(&mut c, Some(1));
    c.send(&m).await;
    let id = cursor_of(c.read().await.doc());
    let r = c
        .command(doc! {"getMore": id, "collection": "c", "$db": "d"})
        .await;
    assert_eq!(code(&r), 50737);
    let r = c
        .command(doc! {"getMore": id, "collection": "c", "lsid": lsid(2), "$db": "d"})
        .await;
    assert_eq!(code(&r), 50738);
    let r = c
        .command(doc! {"getMore": id, "collection": "c", "lsid": lsid(1), "txnNumber": 1i64, "autocommit": false, "$db": "d"})
        .await;
    // The transaction check runs first here (no transaction 1 on that session).
    assert_eq!(code(&r), 251);
    ok(&c
        .command(doc! {"getMore": id, "collection": "c", "lsid": lsid(1), "$db": "d"})
        .await);
    s.shutdown().await;

    // Another user's cursor (the Rust driver authenticates; each runs its own session).
    let s = StandIn::start(StandInConfig {
        users: vec![("alice".into(), "a".into()), ("bob".into(), "b".into())],
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let host = s.addr();
    let alice = Client::with_uri_str(format!("mongodb://alice:a@{host}/?directConnection=true"))
        .await
        .unwrap();
    let bob = Client::with_uri_str(format!("mongodb://bob:b@{host}/?directConnection=true"))
        .await
        .unwrap();
    let db = alice.database("d");
    let id = open_cursor(&db).await;
    let err = bob
        .database("d")
        .run_command(doc! {"getMore": id, "collection": "c"})
        .await
        .unwrap_err();
    match *err.kind {
        mongodb::error::ErrorKind::Command(ref e) => {
            assert_eq!(e.code, 13);
            assert_eq!(
                e.message,
                format!("cursor id {id} was not created by the authenticated user")
            );
        }
        ref other => panic!("unexpected error {other:?}"),
    }
    s.shutdown().await;
}

/// Session and transaction rules: initialize_operation_session_info.cpp (InvalidOptions 72),
/// transaction_participant.cpp (TransactionTooOld 225, NoSuchTransaction 251 labelled
/// TransientTransactionError by error_labels.cpp, TransactionCommitted 256),
/// transaction_validation.cpp and service_entry_point_common.cpp (writeConcern and late
/// readConcern in a transaction, 72).
#[tokio::test]
async fn transactions_follow_mongods_state_machine() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let cmd = |body: Document| {
        let mut body = body;
        body.insert("$db", "d");
        body
    };
    let invalid = [
        (
            doc! {"find": "c", "txnNumber": 1i64},
            "Transaction number requires a session ID to also be specified",
        ),
        (
            doc! {"find": "c", "lsid": lsid(1), "autocommit": false},
            "'autocommit' field requires a transaction number to also be specified",
        ),
        (
            doc! {"find": "c", "lsid": lsid(1), "txnNumber": 1i64, "autocommit": true},
            "Specifying autocommit=true is not allowed.",
        ),
        (
            doc! {"find": "c", "lsid": lsid(1), "txnNumber": 1i64, "startTransaction": true},
            "'startTransaction' field requires 'autocommit' field to also be specified",
        ),
        (
            doc! {"find": "c", "lsid": lsid(1), "txnNumber": 1i64, "autocommit": false, "startTransaction": false},
            "Specifying startTransaction=false is not allowed.",
        ),
    ];
    for (body, msg) in invalid {
        let r = c.command(cmd(body)).await;
        assert_eq!(code(&r), 72, "{msg}");
        assert_eq!(r.get_str("errmsg").unwrap(), msg);
    }
    let stmt = |n: i64, start: bool| {
        let mut d = doc! {"insert": "c", "documents": [{}], "lsid": lsid(3), "txnNumber": n, "autocommit": false};
        if start {
            d.insert("startTransaction", true);
        }
        d
    };
    // A statement of a transaction that never started.
    let r = c.command(cmd(stmt(1, false))).await;
    assert_eq!(code(&r), 251);
    assert_eq!(labels(&r), ["TransientTransactionError"]);
    ok(&c.command(cmd(stmt(1, true))).await);
    ok(&c.command(cmd(stmt(1, false))).await);
    // writeConcern in a statement, readConcern after the first.
    let mut w = stmt(1, false);
    w.insert("writeConcern", doc! {"w": 1});
    let r = c.command(cmd(w)).await;
    assert_eq!(code(&r), 72);
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "writeConcern is not allowed within a multi-statement transaction"
    );
    let mut rc = stmt(1, false);
    rc.insert("readConcern", doc! {"level": "snapshot"});
    let r = c.command(cmd(rc)).await;
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "Only the first command in a transaction may specify a readConcern"
    );
    let commit = |n: i64| doc! {"commitTransaction": 1, "lsid": lsid(3), "txnNumber": n, "autocommit": false, "$db": "admin"};
    let abort = |n: i64| doc! {"abortTransaction": 1, "lsid": lsid(3), "txnNumber": n, "autocommit": false, "$db": "admin"};
    ok(&c.command(commit(1)).await);
    ok(&c.command(commit(1)).await); // a retried commit
    let r = c.command(abort(1)).await;
    assert_eq!(code(&r), 256);
    let r = c.command(cmd(stmt(1, false))).await;
    assert_eq!(code(&r), 256);
    // An older transaction number.
    let r = c.command(cmd(stmt(0, true))).await;
    assert_eq!(code(&r), 225);
    assert_eq!(r.get_str("codeName").unwrap(), "TransactionTooOld");
    // Commit of a transaction that does not exist.
    let r = c.command(commit(9)).await;
    assert_eq!(code(&r), 251);
    assert_eq!(labels(&r), ["TransientTransactionError"]);
    // Abort, then the aborted transaction cannot go on.
    ok(&c.command(cmd(stmt(2, true))).await);
    ok(&c.command(abort(2)).await);
    let r = c.command(commit(2)).await;
    assert_eq!(code(&r), 251);
    // commitTransaction outside a transaction.
    let r = c
        .command(doc! {"commitTransaction": 1, "$db": "admin"})
        .await;
    assert_eq!(code(&r), 72);
    // endSessions forgets the session: its numbers start over.
    ok(&c
        .command(doc! {"endSessions": [lsid(3)], "$db": "admin"})
        .await);
    ok(&c.command(cmd(stmt(0, true))).await);
    s.shutdown().await;
}

/// A step-down (src/mongo/db/repl/replication_coordinator_impl.cpp, stepDown; mongod 4.2+
/// keeps client connections open) aborts the transactions in progress on the old primary;
/// a transaction statement on a secondary is NotWritablePrimary ("Not primary so we cannot
/// begin or continue a transaction", transaction_participant.cpp) even with a secondary read
/// preference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_down_aborts_transactions_and_keeps_connections() {
    let rs = ReplicaSet::start(ReplicaSetConfig {
        name: "rsx".into(),
        members: 2,
        base: StandInConfig::default(),
    })
    .await
    .unwrap();
    let mut c = Raw::connect(rs.member(0).addr()).await;
    let stmt = |start: bool| {
        let mut d = doc! {"insert": "c", "documents": [{}], "lsid": lsid(4), "txnNumber": 1i64, "autocommit": false, "$db": "d"};
        if start {
            d.insert("startTransaction", true);
        }
        d
    };
    ok(&c.command(stmt(true)).await);
    rs.step_down(1, Duration::ZERO);
    // The connection stays open; writes are refused.
    let r = c.command(stmt(false)).await;
    assert_eq!(code(&r), 10107);
    let r = c
        .command(doc! {"find": "c", "lsid": lsid(5), "txnNumber": 1i64, "autocommit": false, "startTransaction": true, "$readPreference": {"mode": "secondary"}, "$db": "d"})
        .await;
    assert_eq!(code(&r), 10107);
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "Not primary so we cannot begin or continue a transaction"
    );
    rs.step_down(0, Duration::ZERO);
    assert_eq!(rs.primary(), Some(0));
    // Back to primary: the transaction was aborted by the step-down.
    let r = c
        .command(doc! {"commitTransaction": 1, "lsid": lsid(4), "txnNumber": 1i64, "autocommit": false, "$db": "admin"})
        .await;
    assert_eq!(code(&r), 251);
    assert_eq!(labels(&r), ["TransientTransactionError"]);
    rs.shutdown().await;
}

/// One OP_MSG section: `(kind, bytes after the kind byte)`.
type Section = (u8, Vec<u8>);

/// An OP_MSG from raw sections.
fn msg_sections(request_id: i32, sections: &[Section]) -> Vec<u8> {
    let mut buf = Vec::new();
    buf.extend_from_slice(&0i32.to_le_bytes());
    buf.extend_from_slice(&request_id.to_le_bytes());
    buf.extend_from_slice(&0i32.to_le_bytes());
    buf.extend_from_slice(&2013i32.to_le_bytes());
    buf.extend_from_slice(&0u32.to_le_bytes());
    for (kind, bytes) in sections {
        buf.push(*kind);
        buf.extend_from_slice(bytes);
    }
    let len = buf.len() as i32;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    buf
}

fn sequence(name: &str, docs: &[Document]) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(name.as_bytes());
    s.push(0);
    for d in docs {
        s.extend_from_slice(&d.to_vec().unwrap());
    }
    let mut out = ((s.len() + 4) as i32).to_le_bytes().to_vec();
    out.extend_from_slice(&s);
    out
}

/// OP_MSG section rules (src/mongo/rpc/op_msg.cpp, `OpMsg::parse`): errors 40430-40433 and
/// 40587 are answered and the connection stays open; a third document sequence is
/// TooManyDocumentSequences, which closes it (ConnectionFatalMessageParseError in
/// src/mongo/base/error_codes.yml).
#[tokio::test]
async fn op_msg_section_rules() {
    let s = standin().await;
    let mut c = Raw::connect(s.addr()).await;
    let body = doc! {"insert": "c", "$db": "d"}.to_vec().unwrap();
    let one = sequence("documents", &[doc! {"_id": 1}]);
    let cases: Vec<(Vec<Section>, i32)> = vec![
        (vec![(0, body.clone()), (0, body.clone())], 40430),
        (
            vec![(0, body.clone()), (1, one.clone()), (1, one.clone())],
            40431,
        ),
        (vec![(0, body.clone()), (7, vec![0; 8])], 40432),
        (
            vec![
                (
                    0,
                    doc! {"insert": "c", "documents": [], "$db": "d"}
                        .to_vec()
                        .unwrap(),
                ),
                (1, one.clone()),
            ],
            40433,
        ),
        (vec![(1, one.clone())], 40587),
    ];
    for (sections, expected) in cases {
        let id = c.next_id();
        c.send(&msg_sections(id, &sections)).await;
        let r = c.read().await;
        assert_eq!(r.response_to, id);
        assert_eq!(code(r.doc()), expected);
        assert_eq!(
            r.doc().get_str("codeName").unwrap(),
            format!("Location{expected}")
        );
    }
    let r = c.command(doc! {"count": "c", "$db": "d"}).await;
    assert_eq!(r.get_i32("n").unwrap(), 0, "a refused insert was applied");
    // Three sequences: the connection is closed.
    let id = c.next_id();
    let a = sequence("documents", &[doc! {"_id": 2}]);
    let b = sequence("x", &[]);
    let z = sequence("y", &[]);
    c.send(&msg_sections(id, &[(0, body), (1, a), (1, b), (1, z)]))
        .await;
    assert!(c.closed_within(Duration::from_secs(5)).await);
    s.shutdown().await;
}

/// Five documents in `db.c` and a cursor over them (batches of one): its id.
async fn open_cursor(db: &mongodb::Database) -> i64 {
    db.collection::<Document>("c")
        .insert_many((0..5).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    let r = db
        .run_command(doc! {"find": "c", "batchSize": 1})
        .await
        .unwrap();
    r.get_document("cursor").unwrap().get_i64("id").unwrap()
}

/// killCursors on another user's cursor fails the whole command with Unauthorized
/// (src/mongo/db/auth/authorization_checks.cpp, checkAuthForKillCursors, called for every id
/// by src/mongo/db/commands/killcursors_common.h before anything is killed).
#[tokio::test]
async fn kill_cursors_checks_the_owner() {
    let s = StandIn::start(StandInConfig {
        users: vec![("alice".into(), "a".into()), ("bob".into(), "b".into())],
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let host = s.addr();
    let alice = Client::with_uri_str(format!("mongodb://alice:a@{host}/?directConnection=true"))
        .await
        .unwrap();
    let bob = Client::with_uri_str(format!("mongodb://bob:b@{host}/?directConnection=true"))
        .await
        .unwrap();
    let db = alice.database("d");
    let id = open_cursor(&db).await;
    let err = bob
        .database("d")
        .run_command(doc! {"killCursors": "c", "cursors": [id, 12345i64]})
        .await
        .unwrap_err();
    match *err.kind {
        mongodb::error::ErrorKind::Command(ref e) => {
            assert_eq!(e.code, 13);
            assert_eq!(e.message, "not authorized to kill cursor on d.c");
        }
        ref other => panic!("unexpected error {other:?}"),
    }
    let r = db
        .run_command(doc! {"killCursors": "c", "cursors": [id, 12345i64]})
        .await
        .unwrap();
    assert_eq!(
        r.get_array("cursorsKilled").unwrap(),
        &vec![Bson::Int64(id)]
    );
    assert_eq!(
        r.get_array("cursorsNotFound").unwrap(),
        &vec![Bson::Int64(12345)]
    );
    s.shutdown().await;
}

/// The client metadata document is validated as mongod's `ClientMetadata` constructor does
/// (src/mongo/rpc/metadata/client_metadata.cpp): `driver.name`, `driver.version` and
/// `os.type` are required strings (183 ClientMetadataMissingField, 14 TypeMismatch), at most
/// 512 bytes (185), `application.name` at most 128 bytes (184). A refused hello does not
/// finalize the metadata.
#[tokio::test]
async fn client_metadata_is_validated() {
    let s = standin().await;
    let cases = [
        (doc! {"os": {"type": "linux"}}, 183, "Missing required sub-document 'driver' in the client metadata document"),
        (doc! {"driver": {"name": "d"}, "os": {"type": "linux"}}, 183, "Missing required field 'driver.version' in the client metadata document"),
        (doc! {"driver": {"name": "d", "version": "1"}}, 183, "Missing required sub-document 'os' in the client metadata document"),
        (doc! {"driver": {"name": "d", "version": "1"}, "os": {}}, 183, "Missing required field 'os.type' in the client metadata document"),
        (doc! {"driver": {"name": "d", "version": 1}, "os": {"type": "linux"}}, 14, "The 'driver.version' field must be a string in the client metadata document"),
        (doc! {"driver": "d", "os": {"type": "linux"}}, 14, "The 'driver' field is required to be a BSON document in the client metadata document"),
        (doc! {"application": {"name": "a".repeat(129)}, "driver": {"name": "d", "version": "1"}, "os": {"type": "linux"}}, 184, "The 'application.name' field must be less then or equal to 128 bytes in the client metadata document"),
        (doc! {"driver": {"name": "d", "version": "1"}, "os": {"type": "linux"}, "platform": "p".repeat(500)}, 185, "The client metadata document must be less then or equal to 512 bytes"),
    ];
    for (client, expected, msg) in cases {
        let mut c = Raw::connect(s.addr()).await;
        let r = c
            .command(doc! {"hello": 1, "client": client, "$db": "admin"})
            .await;
        assert_eq!(code(&r), expected, "{msg}");
        assert_eq!(r.get_str("errmsg").unwrap(), msg);
        // Not finalized: a good first hello still goes through.
        ok(&c
            .command(doc! {"hello": 1, "client": metadata(), "$db": "admin"})
            .await);
    }
    let mut c = Raw::connect(s.addr()).await;
    ok(&c
        .command(doc! {"hello": 1, "client": {"application": {"name": "app"}, "driver": {"name": "d", "version": "1"}, "os": {"type": "linux", "name": "x"}, "platform": "rust", "extra": 1}, "$db": "admin"})
        .await);
    s.shutdown().await;
}

/// src/mongo/db/auth/sasl_commands.idl: saslStart and saslContinue are `strict: true`
/// (an unknown field is 40415); `mechanism` and `payload` of saslStart and
/// `conversationId` (type `int`: a 32-bit integer only, src/mongo/db/basic_types.idl) and
/// `payload` of saslContinue are required (40414, or 14 for the wrong type); a conversation id
/// other than 1 is ProtocolError 17 ("sasl: Mismatched conversation id", runSaslContinue in
/// src/mongo/db/auth/sasl_commands.cpp).
#[tokio::test]
async fn sasl_commands_are_strict() {
    let s = StandIn::start(StandInConfig {
        users: vec![("alice".into(), "a".into())],
        ..Default::default()
    })
    .await
    .unwrap();
    let first = || Binary {
        subtype: BinarySubtype::Generic,
        bytes: b"n,,n=alice,r=0123456789abcdefghijklmn".to_vec(),
    };
    let mut c = Raw::connect(s.addr()).await;
    let r = c
        .command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": first(), "extra": 1, "$db": "admin"})
        .await;
    assert_eq!(code(&r), 40415, "{r}");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "BSON field 'saslStart.extra' is an unknown field."
    );
    let r = c
        .command(doc! {"saslStart": 1, "payload": first(), "$db": "admin"})
        .await;
    assert_eq!(code(&r), 40414, "{r}");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "BSON field 'saslStart.mechanism' is missing but a required field"
    );
    let r = c
        .command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "$db": "admin"})
        .await;
    assert_eq!(code(&r), 40414, "{r}");
    let start = doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": first(), "options": {"skipEmptyExchange": true}, "autoAuthorize": 1, "$db": "admin"};
    let r = c.command(start.clone()).await;
    ok(&r);
    assert_eq!(r.get_i32("conversationId").unwrap(), 1);
    let payload = Binary {
        subtype: BinarySubtype::Generic,
        bytes: b"c=biws,r=x,p=AAAA".to_vec(),
    };
    for (cont, expected) in [
        (
            doc! {"saslContinue": 1, "payload": payload.clone(), "$db": "admin"},
            40414,
        ),
        (
            doc! {"saslContinue": 1, "conversationId": 1, "$db": "admin"},
            40414,
        ),
        (
            doc! {"saslContinue": 1, "conversationId": 1_i64, "payload": payload.clone(), "$db": "admin"},
            14,
        ),
        (
            doc! {"saslContinue": 1, "conversationId": 1.0, "payload": payload.clone(), "$db": "admin"},
            14,
        ),
        (
            doc! {"saslContinue": 1, "conversationId": 1, "payload": payload.clone(), "extra": 1, "$db": "admin"},
            40415,
        ),
        (
            doc! {"saslContinue": 1, "conversationId": 2, "payload": payload.clone(), "$db": "admin"},
            17,
        ),
    ] {
        let r = c.command(cont.clone()).await;
        assert_eq!(code(&r), expected, "{cont}: {r}");
        // A refusal ends the conversation: start it again for the next case.
        ok(&c.command(start.clone()).await);
    }
    let r = c
        .command(doc! {"saslContinue": 1, "conversationId": 1_i64, "payload": payload.clone(), "$db": "admin"})
        .await;
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "BSON field 'saslContinue.conversationId' is the wrong type 'long', expected type 'int'"
    );
    s.shutdown().await;
}

/// Cursor ids are BSON longs only, as mongod's IDL parses them: `getMore`'s command parameter
/// is `type: long` (src/mongo/db/query/getmore_command.idl) and killCursors' `cursors` is
/// `array<cursorId>`, `cursorId` being `bson_serialization_type: long`
/// (src/mongo/db/query/kill_cursors.idl); `long` takes no int or double
/// (src/mongo/idl/basic_types.idl, unlike `safeInt64`). An int or a double id is refused
/// with 14 TypeMismatch before any cursor is looked up, and the cursor stays open.
#[tokio::test]
async fn cursor_ids_are_longs() {
    let s = standin().await;
    let client = Client::with_uri_str(format!("mongodb://{}/?directConnection=true", s.addr()))
        .await
        .unwrap();
    let db = client.database("d");
    let id = open_cursor(&db).await;
    let wrong = [
        Bson::Int32(i32::try_from(id).unwrap_or(1)),
        Bson::Double(id as f64),
    ];
    for w in &wrong {
        for cmd in [
            doc! {"getMore": w.clone(), "collection": "c", "batchSize": 1},
            doc! {"killCursors": "c", "cursors": [w.clone()]},
            doc! {"killCursors": "c", "cursors": [id, w.clone()]},
        ] {
            let err = db.run_command(cmd.clone()).await.unwrap_err();
            match *err.kind {
                mongodb::error::ErrorKind::Command(ref e) => {
                    assert_eq!(
                        (e.code, e.code_name.as_str()),
                        (14, "TypeMismatch"),
                        "{cmd}"
                    );
                    assert!(e.message.contains("expected type 'long'"), "{}", e.message);
                }
                ref other => panic!("{cmd}: unexpected error {other:?}"),
            }
        }
    }
    // Nothing was killed: the cursor still serves a long id.
    let r = db
        .run_command(doc! {"getMore": id, "collection": "c", "batchSize": 1})
        .await
        .unwrap();
    assert_eq!(r.get_document("cursor").unwrap().get_i64("id").unwrap(), id);
    s.shutdown().await;
}
