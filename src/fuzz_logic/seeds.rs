//! The seed corpus of the fuzz targets, written by a program rather than by hand.
//!
//! `cargo test --lib fuzz_logic::seeds -- --ignored` (re)writes `fuzz/seeds/<target>/` for the
//! six targets of this module; the files are committed, and the smoke test in `mod.rs` runs
//! every one of them. Seeds of the TOML targets are the repository's own files plus a few
//! written here.

use std::path::{Path, PathBuf};

use bson::{rawdoc, spec::BinarySubtype, Binary, RawDocumentBuf};
use bytes::Bytes;

use crate::wire::{
    builder::{
        encode_delete, encode_get_more, encode_insert, encode_kill_cursors, encode_msg_reply,
        encode_query, encode_reply, encode_update, MsgBuilder, Sequence,
    },
    compression::{compress, Compressor},
    MsgFlags,
};

fn dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target)
}

fn write(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let d = dir(target);
    std::fs::create_dir_all(&d).unwrap();
    for (name, bytes) in seeds {
        std::fs::write(d.join(name), bytes).unwrap();
    }
}

fn msg(body: RawDocumentBuf) -> Vec<u8> {
    MsgBuilder::new(body).encode(2, 0).to_vec()
}

fn lsid() -> RawDocumentBuf {
    rawdoc! {"id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] }}
}

fn command_policy() -> Vec<(&'static str, Vec<u8>)> {
    let b = |d: Bytes| d.to_vec();
    vec![
        ("find", msg(rawdoc! {"find": "t_users", "filter": {"age": {"$gt": 30}, "name": {"$regex": "^a"}}, "$db": "db_app"})),
        ("find_where_regex_in", msg(rawdoc! {"find": "t_users", "filter": {"$where": "this.a > 1", "name": {"$regex": "x", "$options": "i"}, "k": {"$in": [1, 2, 3]}, "f": {"$exists": false}, "$nor": [{"a": 1}]}, "$db": "db_app"})),
        ("update_multi_no_filter", msg(rawdoc! {"update": "t_users", "updates": [{"q": {}, "u": {"$set": {"a": 1}, "$push": {"log": 1}}, "multi": true}], "$db": "db_app"})),
        ("update_replacement_upsert", msg(rawdoc! {"update": "t_users", "updates": [{"q": {"_id": 1}, "u": {"a": 1}, "upsert": true}, {"q": {"a": 2}, "u": [{"$set": {"b": 1}}]}], "ordered": false, "$db": "db_app"})),
        ("delete_many_empty", msg(rawdoc! {"delete": "t_users", "deletes": [{"q": {}, "limit": 0}], "writeConcern": {"w": 0, "j": false}, "$db": "db_app"})),
        ("insert_sequence", b(MsgBuilder::new(rawdoc! {"insert": "t_users", "$db": "db_app", "lsid": lsid(), "txnNumber": 3_i64, "autocommit": false, "startTransaction": true})
            .sequence(Sequence::new("documents", vec![rawdoc! {"_id": 1, "a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}, rawdoc! {"_id": "x", "arr": [1, 2, 3]}]))
            .encode(3, 0))),
        ("update_sequence_more_to_come", b(MsgBuilder::new(rawdoc! {"update": "t_users", "$db": "db_app"})
            .flags(MsgFlags::MORE_TO_COME)
            .sequence(Sequence::new("updates", vec![rawdoc! {"q": {}, "u": {"$inc": {"n": 1}}, "multi": true}]))
            .checksum(true)
            .encode(4, 0))),
        ("aggregate_lookup_merge", msg(rawdoc! {"aggregate": "t_orders", "pipeline": [{"$match": {"s": {"$ne": "done"}}}, {"$lookup": {"from": "t_users", "pipeline": [{"$match": {"$expr": {"$eq": ["$a", 1]}}}], "as": "u"}}, {"$facet": {"x": [{"$match": {"b": 2}}]}}, {"$merge": {"into": {"db": "admin", "coll": "system.users"}}}], "cursor": {}, "$db": "db_app"})),
        ("explain_update", msg(rawdoc! {"explain": {"update": "t_users", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": true}]}, "verbosity": "queryPlanner", "$db": "db_app"})),
        ("explain_unreadable", msg(rawdoc! {"explain": 5, "$db": "db_app"})),
        ("insert_documents_not_array", msg(rawdoc! {"insert": "t_users", "documents": 5, "$db": "db_app"})),
        ("bulk_write", msg(rawdoc! {"bulkWrite": 1, "ops": [{"insert": 0, "document": {"a": 1}}, {"update": 1, "filter": {}, "updateMods": {"$set": {"a": 1}}, "multi": true}, {"delete": 0, "filter": {}, "multi": true}], "nsInfo": [{"ns": "db_app.t_users"}, {"ns": "admin.system.roles"}], "$db": "admin"})),
        ("find_and_modify", msg(rawdoc! {"findAndModify": "t_users", "query": {}, "update": {"a": 1}, "upsert": true, "$db": "db_app"})),
        ("create_indexes", msg(rawdoc! {"createIndexes": "t_users", "indexes": [{"key": {"a": 1, "b": 1}, "name": "a_b", "expireAfterSeconds": 60, "background": false}], "$db": "db_app"})),
        ("shard_collection", msg(rawdoc! {"shardCollection": "db_app.t_users", "key": {"createdAt": 1}, "$db": "admin"})),
        ("rename_drop", msg(rawdoc! {"renameCollection": "db_app.a", "to": "db_app.system.b", "$db": "admin"})),
        ("drop_database", msg(rawdoc! {"dropDatabase": 1, "$db": "Bad-Name"})),
        ("count_distinct", msg(rawdoc! {"count": "t_users", "query": {"$or": [{"a": 1}, {"b": 2}]}, "$db": "db_app", "$readPreference": {"mode": "secondary"}})),
        ("hello_metadata", msg(rawdoc! {"hello": 1, "client": {"application": {"name": "billing"}, "driver": {"name": "nodejs", "version": "6.8.0"}}, "$db": "admin"})),
        ("query_cmd", b(encode_query(5, 0, "db_app.$cmd", 0, -1, &rawdoc! {"delete": "t_users", "deletes": [{"q": {}, "limit": 0}]}, None))),
        ("query_legacy_find", b(encode_query(6, 4, "db_app.t_users", 0, 10, &rawdoc! {"$query": {"$where": "1"}, "$orderby": {"a": 1}}, Some(&rawdoc! {"a": 1})))),
        ("op_insert", b(encode_insert(7, 0, "db_app.t_users", &[&rawdoc! {"a": 1}, &rawdoc! {"b": [1, 2]}]))),
        ("op_update", b(encode_update(8, "db_app.t_users", 2, &rawdoc! {}, &rawdoc! {"$set": {"a": 1}}))),
        ("op_delete", b(encode_delete(9, "db_app.t_users", 0, &rawdoc! {}))),
        ("op_get_more", b(encode_get_more(10, "db_app.t_users", 0, 77))),
        ("op_kill_cursors", b(encode_kill_cursors(11, &[77, 78]))),
        ("compressed_zlib_update", compress(&msg(rawdoc! {"update": "t_users", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": true}], "$db": "db_app"}), Compressor::Zlib).unwrap().to_vec()),
        ("compressed_snappy_find", compress(&msg(rawdoc! {"find": "t_users", "filter": {"a": {"$not": {"$eq": 1}}}, "$db": "db_app"}), Compressor::Snappy).unwrap().to_vec()),
    ]
}

fn member() -> RawDocumentBuf {
    rawdoc! {
        "isWritablePrimary": true, "topologyVersion": {"processId": bson::oid::ObjectId::from_bytes([1; 12]), "counter": 0_i64},
        "hosts": ["a:27017", "b:27017"], "passives": ["c:27017"], "arbiters": ["d:27017"],
        "setName": "rs0", "setVersion": 3, "primary": "a:27017", "me": "a:27017",
        "electionId": bson::oid::ObjectId::from_bytes([2; 12]), "tags": {"dc": "east"},
        "secondary": false, "lastWrite": {"opTime": {"ts": bson::Timestamp { time: 1, increment: 1 }, "t": 1_i64}},
        "maxBsonObjectSize": 16_777_216, "maxMessageSizeBytes": 48_000_000, "maxWriteBatchSize": 100_000,
        "localTime": bson::DateTime::from_millis(0), "logicalSessionTimeoutMinutes": 30, "connectionId": 12,
        "minWireVersion": 0, "maxWireVersion": 21, "readOnly": false, "ok": 1.0,
    }
}

fn hello_rewrite() -> Vec<(&'static str, Vec<u8>)> {
    let member_msg = encode_msg_reply(5, 9, &member()).to_vec();
    vec![
        ("member_op_msg", member_msg.clone()),
        ("member_op_reply", encode_reply(5, 9, 8, 0, 0, &[&member()]).to_vec()),
        ("member_op_reply_with_msg", encode_reply(5, 9, 0, 0, 0, &[&rawdoc! {"ismaster": true, "msg": "x", "hosts": ["a:1"], "maxWireVersion": 7_i64, "ok": 1}]).to_vec()),
        ("standalone", encode_msg_reply(1, 2, &rawdoc! {"isWritablePrimary": true, "maxWireVersion": 21, "ok": 1.0}).to_vec()),
        ("streaming_checksummed", MsgBuilder::new(member()).flags(MsgFlags::MORE_TO_COME).checksum(true).encode(6, 9).to_vec()),
        ("compressed_snappy", compress(&member_msg, Compressor::Snappy).unwrap().to_vec()),
        ("compressed_zlib", compress(&member_msg, Compressor::Zlib).unwrap().to_vec()),
        ("compressed_zstd", compress(&member_msg, Compressor::Zstd).unwrap().to_vec()),
        ("compressed_noop", compress(&member_msg, Compressor::Noop).unwrap().to_vec()),
        ("hello_with_metadata", encode_msg_reply(1, 2, &rawdoc! {"hello": 1, "client": {"application": {"name": "x".repeat(200)}, "driver": {"name": "PyMongo", "version": "4.8"}}, "maxWireVersion": 2_147_483_648_i64}).to_vec()),
    ]
}

// Long because it is data: one seed per line.
fn reply_facts() -> Vec<(&'static str, Vec<u8>)> {
    let with = |exhaust: u8, bytes: Bytes| {
        let mut v = vec![exhaust];
        v.extend_from_slice(&bytes);
        v
    };
    let stream = MsgBuilder::new(
        rawdoc! {"cursor": {"id": 42_i64, "ns": "d.c", "nextBatch": [{"a": 1}]}, "ok": 1.0},
    )
    .flags(MsgFlags::MORE_TO_COME)
    .encode(3, 1);
    vec![
        (
            "cursor_open",
            with(
                0,
                encode_msg_reply(
                    1,
                    1,
                    &rawdoc! {"cursor": {"id": 42_i64, "ns": "d.c", "firstBatch": []}, "ok": 1.0},
                ),
            ),
        ),
        (
            "cursor_closed_int32",
            with(
                0,
                encode_msg_reply(
                    1,
                    1,
                    &rawdoc! {"cursor": {"id": 0, "ns": "d.c", "nextBatch": []}, "ok": 1},
                ),
            ),
        ),
        (
            "cursor_double",
            with(
                1,
                encode_msg_reply(
                    1,
                    1,
                    &rawdoc! {"cursor": {"id": 7.0, "ns": "d.c"}, "ok": 1.0},
                ),
            ),
        ),
        (
            "not_primary",
            with(
                0,
                encode_msg_reply(
                    1,
                    1,
                    &rawdoc! {"ok": 0.0, "code": 10107, "codeName": "NotWritablePrimary", "errmsg": "not primary", "errorLabels": ["RetryableWriteError"]},
                ),
            ),
        ),
        (
            "ok_false_code_int64",
            with(
                0,
                encode_msg_reply(1, 1, &rawdoc! {"ok": false, "code": 11600_i64}),
            ),
        ),
        (
            "legacy_reply_cursor",
            with(
                0,
                encode_reply(1, 1, 0, 77, 0, &[&rawdoc! {"a": 1}, &rawdoc! {"b": 2}]),
            ),
        ),
        (
            "legacy_reply_error",
            with(
                1,
                encode_reply(
                    1,
                    1,
                    2,
                    0,
                    0,
                    &[&rawdoc! {"$err": "x", "code": 13, "ok": 0}],
                ),
            ),
        ),
        ("stream_exhaust", with(1, stream.clone())),
        ("stream_no_exhaust", with(0, stream.clone())),
        (
            "stream_compressed_exhaust",
            with(1, compress(&stream, Compressor::Zstd).unwrap()),
        ),
        (
            "stream_compressed_no_exhaust",
            with(0, compress(&stream, Compressor::Snappy).unwrap()),
        ),
        (
            "checksummed",
            with(
                0,
                MsgBuilder::new(rawdoc! {"ok": 1.0})
                    .checksum(true)
                    .encode(1, 1),
            ),
        ),
        ("request_opcode", with(1, encode_get_more(1, "d.c", 0, 5))),
    ]
}

fn scram_server() -> Vec<(&'static str, Vec<u8>)> {
    let text = |flags: u8, s: &str| {
        let mut v = vec![flags];
        v.extend(s.bytes().map(|b| if b == b'|' { 0 } else { b }));
        v
    };
    let docs = |docs: &[RawDocumentBuf]| {
        let mut v = vec![0x80];
        for d in docs {
            v.extend_from_slice(d.as_bytes());
        }
        v
    };
    let bin = |s: &str| Binary {
        subtype: BinarySubtype::Generic,
        bytes: s.as_bytes().to_vec(),
    };
    vec![
        ("sha256_wrong_proof", text(0, "n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL|c=biws,r=@NONCE@,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=|")),
        ("sha1_wrong_proof_skip", text(3, "n,,n=alice,r=abc|c=biws,r=@NONCE@,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=")),
        ("unknown_user", text(0, "n,,n=mallory,r=abc|c=biws,r=@NONCE@,p=AAAA|")),
        ("escaped_name_string", text(4, "y,,n=al=2Cice=3D,r=abc,ext=1|c=eSws,r=@NONCE@,p=AA==")),
        ("bad_escape", text(0, "n,,n=al=2ice,r=abc|x")),
        ("channel_binding", text(0, "p=tls-unique,,n=alice,r=abc|c=cD10bHMtdW5pcXVlLCw=,r=@NONCE@,p=AA==")),
        ("extension", text(0, "n,,m=ext,n=alice,r=abc")),
        ("wrong_nonce", text(8, "n,,n=alice,r=abc|c=biws,r=abcdef,p=AA==|")),
        ("speculative", text(16, "n,,n=alice,r=abc|c=biws,r=@NONCE@,p=AAAA")),
        ("control_ok_sha256", vec![0x40, 0, 0, 0]),
        ("control_ok_sha1_skip", vec![0x43, 0, 0, 0]),
        ("control_tampered", vec![0x40, 5, 0, 1]),
        ("control_speculative", vec![0x50, 0, 0, 0]),
        ("documents_start_continue", docs(&[
            rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin("n,,n=alice,r=abc"), "options": {"skipEmptyExchange": 1}, "$db": "admin", "db": "admin"},
            rawdoc! {"saslContinue": 1, "conversationId": 1, "payload": bin("c=biws,r=abc,p=AA=="), "$db": "admin"},
            rawdoc! {"saslContinue": 1, "conversationId": 1.0, "payload": "", "$db": "admin"},
        ])),
        ("documents_bad_mechanism", docs(&[
            rawdoc! {"saslStart": 1, "mechanism": "PLAIN", "payload": bin("\0alice\0pw"), "$db": "admin"},
            rawdoc! {"saslContinue": 1, "payload": 5, "$db": "admin"},
        ])),
    ]
}

fn toml_seeds(target: &str, files: &[&str], extra: &[(&'static str, &str)]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    let names: Vec<String> = files.iter().map(|f| f.replace('/', "_")).collect();
    for (f, name) in files.iter().zip(&names) {
        seeds.push((name, std::fs::read(root.join(f)).unwrap()));
    }
    for (name, text) in extra {
        seeds.push((name, text.as_bytes().to_vec()));
    }
    write(target, &seeds);
}

#[test]
#[ignore = "writes fuzz/seeds/: run by hand after changing the seeds"]
fn write_seeds() {
    write("command_policy", &command_policy());
    write("hello_rewrite", &hello_rewrite());
    write("reply_facts", &reply_facts());
    write("scram_server", &scram_server());
    toml_seeds(
        "policy_parse",
        &["policies/standard.toml", "policies/strict.toml", "policies/audit.toml"],
        &[
            ("overrides.toml", "extends = \"strict\"\nmode = \"enforce\"\n[rules]\nW004 = \"block\"\nQ005 = { action = \"warn\", max_in = 100, max_or = 8 }\nD002 = { action = \"block\", max_depth = 3 }\n[[overrides]]\nnamespace = \"analytics.*\"\napp = \"nightly-*\"\nuser = \"etl\"\nclient = \"10.0.0.0/8\"\nmode = \"audit\"\nrules = { Q001 = \"off\", W004 = \"warn\" }\n[[overrides]]\nclient = \"fd00::/8\"\nrules = { W001 = \"off\" }\n"),
            ("none_audit.toml", "extends = \"none\"\nmode = \"audit\"\n[rules]\nW001 = \"block\"\n"),
            ("g001_warn.toml", "[rules]\nG001 = \"warn\"\n"),
        ],
    );
    toml_seeds(
        "config_parse",
        &["mongoguard.example.toml", "packaging/docker/mongoguard.toml"],
        &[
            ("pooled.toml", "[proxy]\nmode = \"pooled\"\nlisten = \"127.0.0.1:27018\"\nmax_message_size = \"16MiB\"\nclient_idle_timeout = \"10m\"\n[upstream]\nuri = \"mongodb://app:s3cr3t@a:27017,b:27018/admin?replicaSet=rs0&tls=true\"\nheartbeat_interval = \"500ms\"\n[upstream.identities.reporting]\nusername = \"rep\"\npassword = \"hunter2\"\nsource = \"admin\"\nmechanism = \"SCRAM-SHA-256\"\n[auth]\nusers_file = \"users.toml\"\n[pool]\npool_size = 8\nmin_idle = 2\n[admin]\nlisten = \"0.0.0.0:9216\"\ntoken = \"an-admin-token\"\n"),
            ("tls.toml", "[proxy]\nlisten = \"[::]:27017\"\n[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nclient_ca_file = \"ca.pem\"\nhandshake_timeout = \"5s\"\n[log]\nformat = \"json\"\nlevel = \"mongoguard=debug\"\n[policy]\nfile = \"p.toml\"\nreload_poll = \"0\"\n"),
            ("invalid_insecure.toml", "[proxy]\nlisten = \"0.0.0.0:27017\"\n"),
        ],
    );
}
