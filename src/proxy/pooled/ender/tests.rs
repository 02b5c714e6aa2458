use bson::{rawdoc, spec::BinarySubtype, Binary, RawDocumentBuf};

use super::*;
use crate::wire::{
    builder::{encode_query, MsgBuilder, Sequence},
    DEFAULT_MAX_MESSAGE_SIZE,
};

fn uuid(n: u8) -> Binary {
    Binary {
        subtype: BinarySubtype::Uuid,
        bytes: vec![n; 16],
    }
}

fn msg(body: RawDocumentBuf) -> Frame {
    Frame::from_bytes(MsgBuilder::new(body).encode(7, 0)).unwrap()
}

fn local(body: RawDocumentBuf) -> Option<Vec<[u8; 16]>> {
    local_sessions(&msg(body), DEFAULT_MAX_MESSAGE_SIZE).map(|s| s.ids)
}

/// Sessions `ids` declared without an API version.
fn plain(ids: Vec<[u8; 16]>) -> Sessions {
    Sessions {
        ids,
        api_version: false,
    }
}

/// A body `{endSessions: <array whose bytes are those of doc>, $db: "admin"}`: the array's
/// element names are whatever `doc`'s keys are.
fn with_array_bytes(doc: &RawDocumentBuf) -> RawDocumentBuf {
    let mut out = Vec::new();
    out.extend_from_slice(&[0; 4]);
    out.push(0x04);
    out.extend_from_slice(b"endSessions\0");
    out.extend_from_slice(doc.as_bytes());
    out.push(0x02);
    out.extend_from_slice(b"$db\0");
    out.extend_from_slice(&6i32.to_le_bytes());
    out.extend_from_slice(b"admin\0");
    out.push(0);
    let len = (out.len() as i32).to_le_bytes();
    out.splice(0..4, len);
    RawDocumentBuf::from_bytes(out).unwrap()
}

#[test]
fn what_drivers_send_is_answered_here() {
    // pymongo: $db, $readPreference primaryPreferred, $clusterTime on a replica set.
    let body = rawdoc! {
        "endSessions": [{"id": uuid(1)}, {"id": uuid(2)}],
        "$db": "admin",
        "$readPreference": {"mode": "primaryPreferred"},
        "$clusterTime": {"clusterTime": bson::Timestamp { time: 1, increment: 1 }},
        "apiVersion": "1",
    };
    assert_eq!(local(body), Some(vec![[1; 16], [2; 16]]));
    // The Node.js driver: moreToCome (flags do not matter here); an empty list is valid.
    let frame = Frame::from_bytes(
        MsgBuilder::new(rawdoc! {"endSessions": [], "$db": "admin"})
            .flags(2)
            .encode(8, 0),
    )
    .unwrap();
    assert_eq!(
        local_sessions(&frame, DEFAULT_MAX_MESSAGE_SIZE),
        Some(plain(vec![]))
    );
    // The array's names in order, as a well-formed array has them.
    let named = rawdoc! {"0": {"id": uuid(1)}, "1": {"id": uuid(2)}};
    assert_eq!(
        local(with_array_bytes(&named)),
        Some(vec![[1; 16], [2; 16]])
    );
}

/// Everything mongod might answer otherwise than `{ok: 1}` — or that means more than ending
/// the caller's own sessions — is forwarded, for mongod to answer.
#[test]
fn anything_else_is_forwarded() {
    let id = |n| rawdoc! {"id": uuid(n)};
    let generic = Binary {
        subtype: BinarySubtype::Generic,
        bytes: vec![1; 16],
    };
    let short = Binary {
        subtype: BinarySubtype::Uuid,
        bytes: vec![1; 15],
    };
    let cases = [
        // another user's session (uid), an unknown field, a missing id
        rawdoc! {"endSessions": [{"id": uuid(1), "uid": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 32] }}], "$db": "admin"},
        rawdoc! {"endSessions": [{"id": uuid(1), "x": 1}], "$db": "admin"},
        rawdoc! {"endSessions": [{}], "$db": "admin"},
        rawdoc! {"endSessions": [{"uid": uuid(1)}], "$db": "admin"},
        // not a UUID
        rawdoc! {"endSessions": [{"id": generic}], "$db": "admin"},
        rawdoc! {"endSessions": [{"id": short}], "$db": "admin"},
        rawdoc! {"endSessions": [{"id": "x"}], "$db": "admin"},
        rawdoc! {"endSessions": [1], "$db": "admin"},
        rawdoc! {"endSessions": {"0": id(1)}, "$db": "admin"},
        rawdoc! {"endSessions": 1, "$db": "admin"},
        // a field that is not a generic argument, a session or transaction of its own,
        // a write concern (endSessions does not support one)
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "comment": "x"},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "lsid": id(2)},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "writeConcern": {"w": 0}},
        // another database, no database, the name not first
        rawdoc! {"endSessions": [id(1)], "$db": "test"},
        rawdoc! {"endSessions": [id(1)]},
        rawdoc! {"$db": "admin", "endSessions": [id(1)]},
    ];
    for body in cases {
        assert_eq!(local(body.clone()), None, "{body:?}");
    }
    // Element names out of order, or not numbers.
    let swapped = rawdoc! {"1": {"id": uuid(1)}, "0": {"id": uuid(2)}};
    assert_eq!(local(with_array_bytes(&swapped)), None);
    let named = rawdoc! {"a": {"id": uuid(1)}};
    assert_eq!(local(with_array_bytes(&named)), None);
    // More sessions than one command answered here may hold.
    let mut many = bson::RawArrayBuf::new();
    for _ in 0..=LOCAL_MAX {
        many.push(rawdoc! {"id": uuid(3)});
    }
    assert_eq!(local(rawdoc! {"endSessions": many, "$db": "admin"}), None);
    // A document sequence, OP_QUERY.
    let seq = MsgBuilder::new(rawdoc! {"endSessions": [], "$db": "admin"})
        .sequence(Sequence::new("x", vec![id(1)]))
        .encode(9, 0);
    let frame = Frame::from_bytes(seq).unwrap();
    assert_eq!(local_sessions(&frame, DEFAULT_MAX_MESSAGE_SIZE), None);
    let query = encode_query(
        10,
        0,
        "admin.$cmd",
        0,
        -1,
        &rawdoc! {"endSessions": [id(1)]},
        None,
    );
    let frame = Frame::from_bytes(query).unwrap();
    assert_eq!(local_sessions(&frame, DEFAULT_MAX_MESSAGE_SIZE), None);
}

#[test]
fn the_upstream_command_carries_every_session() {
    let ids = [[1u8; 16], [2; 16], [3; 16]];
    let cmd = end_sessions_command(&ids, false);
    let doc = bson::Document::try_from(cmd.as_ref()).unwrap();
    let sessions = doc.get_array("endSessions").unwrap();
    assert_eq!(sessions.len(), 3);
    for (s, id) in sessions.iter().zip(ids) {
        let s = s.as_document().unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s.get("id"), Some(&bson::Bson::Binary(uuid(id[0]))));
    }
    assert_eq!(doc.get_str("$db").unwrap(), "admin");
    assert!(doc.get("apiVersion").is_none());
}

/// A client that declares the stable API (drivers with `serverApi` set send `apiVersion: "1"`
/// on every command, endSessions included) may be talking to a server started with
/// `requireApiVersion`, which refuses a command without it: the sessions would then never be
/// ended upstream, only expire, and a fleet opening many could reach the server's session
/// limit. The upstream command declares the version its clients declared, and clients that
/// did and did not are never batched into one command.
#[test]
fn the_upstream_command_declares_the_api_version_the_client_did() {
    let id = |n| rawdoc! {"id": uuid(n)};
    let with = local_sessions(
        &msg(
            rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiVersion": "1", "apiStrict": true},
        ),
        DEFAULT_MAX_MESSAGE_SIZE,
    )
    .unwrap();
    assert!(with.api_version);
    let without = local_sessions(
        &msg(rawdoc! {"endSessions": [id(2)], "$db": "admin"}),
        DEFAULT_MAX_MESSAGE_SIZE,
    )
    .unwrap();
    assert!(!without.api_version);

    let cmd = end_sessions_command(&[[1; 16]], true);
    let doc = bson::Document::try_from(cmd.as_ref()).unwrap();
    assert_eq!(doc.get_str("apiVersion").unwrap(), "1");

    let identity = Identity {
        name: "default".into(),
        credentials: None,
    };
    let ending = |sessions| Ending {
        identity: identity.clone(),
        sessions,
    };
    let mut batches = vec![ending(with)];
    join(&mut batches, ending(without));
    join(&mut batches, ending(plain(vec![[3; 16]])));
    assert_eq!(batches.len(), 2, "with and without the API version apart");
    assert!(batches[0].sessions.api_version);
    assert_eq!(batches[0].sessions.ids, vec![[1; 16]]);
    assert_eq!(batches[1].sessions.ids, vec![[2; 16], [3; 16]]);
}

#[tokio::test]
async fn a_full_queue_refuses_and_the_caller_forwards() {
    let (ender, _queue) = Ender::new();
    let identity = Identity {
        name: "default".into(),
        credentials: None,
    };
    for _ in 0..QUEUE {
        assert!(ender.defer(&identity, plain(vec![[1; 16]])));
    }
    assert!(!ender.defer(&identity, plain(vec![[1; 16]])));
    drop(_queue);
    let (ender, queue) = Ender::new();
    drop(queue);
    assert!(
        !ender.defer(&identity, plain(vec![[1; 16]])),
        "the task has stopped"
    );
}

/// The generic arguments are answered here only in the forms mongod accepts. mongod refuses
/// `apiVersion` that is not the string "1", `apiStrict`/`apiDeprecationErrors` that are not
/// booleans or come without `apiVersion` (4886600), and a `$readPreference` whose mode is not
/// one of the five (mongodb/mongo jstests/core/api_version_parameters.js;
/// src/mongo/idl/generic_argument.idl; src/mongo/client/read_preference.cpp); its IDL parser
/// refuses a field given twice (40413). Answering `{ok: 1}` to any of them would tell the
/// client something mongod would not have said, and end sessions mongod would not have ended.
#[test]
fn generic_arguments_mongod_would_refuse_are_forwarded() {
    let id = |n| rawdoc! {"id": uuid(n)};
    let cases = [
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiVersion": "2"},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiVersion": 1},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiStrict": true},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiDeprecationErrors": false},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiVersion": "1", "apiStrict": "true"},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiVersion": "1", "apiDeprecationErrors": 1},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "$readPreference": "primary"},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "$readPreference": {"mode": "bogus"}},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "$readPreference": {}},
        rawdoc! {"endSessions": [id(1)], "$db": "admin", "$clusterTime": 1},
    ];
    for body in cases {
        assert_eq!(local(body.clone()), None, "{body:?}");
    }
    // A generic argument given twice.
    let mut twice = rawdoc! {"endSessions": [id(1)], "$db": "admin", "apiVersion": "1"};
    twice.append(bson::raw::cstr!("apiVersion"), "1");
    assert_eq!(local(twice), None);
    // What drivers send is still answered here.
    let fine = rawdoc! {
        "endSessions": [id(1)], "$db": "admin", "apiVersion": "1", "apiStrict": true,
        "apiDeprecationErrors": false, "$readPreference": {"mode": "primaryPreferred"},
    };
    assert_eq!(local(fine), Some(vec![[1; 16]]));
}
