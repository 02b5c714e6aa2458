//! Pooled mode: what decides where a client request goes, read off the (decompressed)
//! message: the command's class, its read preference, its transaction and its cursor.

use crate::command::Fields;
use crate::wire::GetFast;
use bson::{RawBsonRef, RawDocument};

use crate::{
    upstream::topology::{parse_read_preference, ReadFilter, ReadPref, ReadPrefError},
    wire::{Frame, Index, Message, OpCode, OpMsg, OpReply},
};

/// Commands pooled mode treats specially.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// hello / isMaster: answered by mongoguard.
    Hello,
    /// saslStart / saslContinue: mongoguard's own SCRAM.
    SaslStart,
    /// See [`Class::SaslStart`].
    SaslContinue,
    /// authenticate, logout, copydbsaslstart: refused (mongoguard authenticates).
    OtherAuth,
    /// ping: answered by mongoguard before authentication.
    Ping,
    /// getnonce: MONGODB-CR's first step, a no-op since MongoDB 4.0 that returns a random
    /// nonce (removed in 6.2, SERVER-71007); mgo sends it on every new connection, so pooled
    /// mode answers it as mongod up to 6.1 did.
    GetNonce,
    /// buildInfo: allowed before authentication, as mongod allows it (`requiresAuth()` is
    /// false in src/mongo/db/commands/generic.cpp through 7.0); drivers of the 3.x generation
    /// (the Java driver 3.6) send it during the handshake, before authenticating.
    BuildInfo,
    /// endSessions: answered by mongoguard when plain (see `pooled::ender`).
    EndSessions,
    /// A legacy fire-and-forget write (OP_INSERT, OP_UPDATE, OP_DELETE).
    LegacyWrite,
    /// Anything else: forwarded.
    Other,
}

/// A transaction statement: `lsid` + `txnNumber` with `autocommit: false`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TxnKey {
    /// The bytes of `lsid.id` (a UUID).
    pub lsid: Vec<u8>,
    /// `txnNumber`.
    pub txn_number: i64,
}

/// Where a request may go.
#[derive(Debug, Clone, Default)]
pub(crate) struct Routing {
    pub class: Option<Class>,
    pub read_pref: ReadPref,
    /// The read preference's tag sets and maxStalenessSeconds, if any.
    pub read_filter: Option<Box<ReadFilter>>,
    /// A `$readPreference` mongod would refuse: answered with this error, never routed.
    pub read_pref_error: Option<Box<ReadPrefError>>,
    /// The transaction this command belongs to, if any.
    pub txn: Option<TxnKey>,
    /// `startTransaction: true`.
    pub starts_txn: bool,
    /// commitTransaction / abortTransaction.
    pub ends_txn: bool,
    /// getMore / killCursors / OP_GET_MORE / OP_KILL_CURSORS: the id of the cursor it
    /// continues (ids are random 64-bit numbers; the id alone finds the server).
    pub cursor: Option<i64>,
    /// killCursors / OP_KILL_CURSORS: the cursor's pin ends with the reply.
    pub kills_cursor: bool,
    /// A killCursors command naming more cursors than `cursor`: the rest, killed where they
    /// live once the command succeeded (`pooled::killer`).
    pub kill_rest: Option<Box<KillRest>>,
    /// Whether the reply may open a cursor worth remembering (find, aggregate, list*...).
    pub may_open_cursor: bool,
    /// `lsid` is present but its `id` is not a UUID (binary subtype 4, 16 bytes): mongod
    /// refuses such a command, and mongoguard never keys a pin map on it.
    pub bad_lsid: bool,
    /// What this command reaches beyond the client's own requests: every session or
    /// operation of the upstream user it runs as (see [`identity_wide`]), or `None`.
    pub identity_wide: Option<&'static str>,
}

/// The cursors of a killCursors after its first (at most `killer::MAX_IDS`), and its
/// namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KillRest {
    /// The command's database and collection; `None` for a legacy OP_KILL_CURSORS, which
    /// names none (its follow-ups are OP_KILL_CURSORS too).
    pub ns: Option<(String, String)>,
    pub ids: Vec<i64>,
}

/// The ids after the first (`first`'s repeats dropped), at most `killer::MAX_IDS`.
fn kill_rest_ids(ids: impl Iterator<Item = i64>, first: Option<i64>) -> Vec<i64> {
    ids.filter(|id| Some(*id) != first)
        .take(crate::proxy::pooled::killer::MAX_IDS)
        .collect()
}

impl Routing {
    pub(crate) fn class(&self) -> Class {
        self.class.unwrap_or(Class::Other)
    }
}

pub(crate) fn int64(v: RawBsonRef<'_>) -> Option<i64> {
    match v {
        RawBsonRef::Int64(i) => Some(i),
        RawBsonRef::Int32(i) => Some(i64::from(i)),
        RawBsonRef::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => Some(d as i64),
        _ => None,
    }
}

fn classify(name: &str) -> Class {
    match name {
        "hello" | "isMaster" | "ismaster" => Class::Hello,
        "saslStart" => Class::SaslStart,
        "saslContinue" => Class::SaslContinue,
        "getnonce" => Class::GetNonce,
        "authenticate" | "logout" | "copydbsaslstart" | "copydbgetnonce" => Class::OtherAuth,
        "ping" => Class::Ping,
        "buildInfo" | "buildinfo" => Class::BuildInfo,
        "endSessions" => Class::EndSessions,
        _ => Class::Other,
    }
}

type ParsedPref = Result<(ReadPref, Option<Box<ReadFilter>>), ReadPrefError>;

/// The `$readPreference` of `doc`, parsed as mongod does; `None` when absent.
fn read_pref<'a>(doc: impl Fields<'a>) -> Option<ParsedPref> {
    match doc.lookup("$readPreference") {
        Ok(None) => None,
        Ok(Some(RawBsonRef::Document(rp))) => Some(parse_read_preference(rp)),
        Ok(Some(_)) | Err(_) => Some(Err(ReadPrefError {
            code: 14,
            code_name: "TypeMismatch",
            message: "$readPreference has incorrect type: expected object".into(),
        })),
    }
}

/// Reads the routing facts of a command body.
fn of_command(body: &Index<'_>, outer: Option<&RawDocument>) -> Routing {
    let mut r = Routing::default();
    let Some(name) = body.first_key() else {
        return r;
    };
    r.class = Some(classify(name));
    match outer.and_then(read_pref).or_else(|| read_pref(body)) {
        None => {}
        Some(Ok((mode, filter))) => {
            r.read_pref = mode;
            r.read_filter = filter;
        }
        Some(Err(e)) => r.read_pref_error = Some(Box::new(e)),
    }
    let lsid = match body.get("lsid") {
        Ok(None) => None,
        Ok(Some(RawBsonRef::Document(l))) => match l.get_fast("id") {
            Ok(Some(RawBsonRef::Binary(b)))
                if b.subtype == bson::spec::BinarySubtype::Uuid && b.bytes.len() == 16 =>
            {
                Some(b.bytes)
            }
            _ => {
                r.bad_lsid = true;
                None
            }
        },
        _ => {
            r.bad_lsid = true;
            None
        }
    };
    if matches!(body.get("autocommit"), Ok(Some(RawBsonRef::Boolean(false)))) {
        let lsid = lsid.map(<[u8]>::to_vec);
        let txn_number = body.get("txnNumber").ok().flatten().and_then(int64);
        if let (Some(lsid), Some(txn_number)) = (lsid, txn_number) {
            r.txn = Some(TxnKey { lsid, txn_number });
            r.starts_txn = matches!(
                body.get("startTransaction"),
                Ok(Some(RawBsonRef::Boolean(true)))
            );
        }
    }
    r.ends_txn = matches!(name, "commitTransaction" | "abortTransaction");
    r.identity_wide = identity_wide(name, body);
    match name {
        "getMore" => {
            let id = body.get("getMore").ok().flatten().and_then(int64);
            r.cursor = id;
        }
        "killCursors" => {
            let mut ids = match body.get("cursors") {
                Ok(Some(RawBsonRef::Array(a))) => Some(a.into_iter().flatten().filter_map(int64)),
                _ => None,
            };
            let first = ids.as_mut().and_then(Iterator::next);
            r.kills_cursor = true;
            r.cursor = first;
            let rest = kill_rest_ids(ids.into_iter().flatten(), first);
            if let (false, Ok(Some(RawBsonRef::String(coll))), Ok(Some(RawBsonRef::String(db)))) =
                (rest.is_empty(), body.get("killCursors"), body.get("$db"))
            {
                r.kill_rest = Some(Box::new(KillRest {
                    ns: Some((db.to_owned(), coll.to_owned())),
                    ids: rest,
                }));
            }
        }
        "find" | "aggregate" | "listCollections" | "listIndexes" | "listSearchIndexes"
        | "changeStream" => r.may_open_cursor = true,
        _ => {}
    }
    r
}

/// Commands that reach every session or operation of the user they run as, not only the
/// client's own: in pooled mode that user is an upstream identity shared by every client
/// (and every users-file user) mapped to it, where mongod would keep each user's apart
/// (sessions are keyed by id *and* user; currentOp's `$ownOps` and killOp without the
/// `killop` privilege cover the user's own operations). `killSessions: []` kills every
/// session of the user (their transactions and cursors); `killAllSessions` and
/// `killAllSessionsByPattern` those of every user; `currentOp` and the `$currentOp`,
/// `$listLocalSessions` and `$listSessions` stages show other clients' commands, session
/// ids and idle cursor ids; `killOp` kills an operation by id (small sequential numbers);
/// `getPrevError` reports an earlier request's error on the shared upstream connection.
/// A pipeline that cannot be read counts as reaching them (mongod refuses it anyway).
fn identity_wide(name: &str, body: &Index<'_>) -> Option<&'static str> {
    match name {
        "killAllSessions" => Some("killAllSessions"),
        "killAllSessionsByPattern" => Some("killAllSessionsByPattern"),
        "currentOp" => Some("currentOp"),
        "killOp" => Some("killOp"),
        // Before 5.0: the last error of any earlier request on the (shared) upstream
        // connection, not only the immediately previous one (see the pooled getLastError).
        "getPrevError" | "getpreverror" => Some("getPrevError"),
        "killSessions" => match body.get("killSessions") {
            Ok(Some(RawBsonRef::Array(a))) if a.into_iter().next().is_some() => None,
            _ => Some("killSessions of every session"),
        },
        "aggregate" => {
            let Ok(Some(RawBsonRef::Array(pipeline))) = body.get("pipeline") else {
                return None;
            };
            let mut found = None;
            let walked = crate::command::walk_pipeline(pipeline, &mut |stage| {
                found = match stage.iter_elements().next() {
                    Some(Ok(elem)) => match elem.key().as_str() {
                        "$currentOp" => Some("$currentOp"),
                        "$listLocalSessions" => Some("$listLocalSessions"),
                        "$listSessions" => Some("$listSessions"),
                        _ => None,
                    },
                    _ => None,
                };
                if found.is_some() {
                    std::ops::ControlFlow::Break(())
                } else {
                    std::ops::ControlFlow::Continue(())
                }
            });
            match walked {
                Ok(_) => found,
                Err(_) => Some("an unreadable pipeline"),
            }
        }
        _ => None,
    }
}

/// Reads the routing facts of a (decompressed) client message.
/// `index`: the OP_MSG body's index when the caller built one (used only if it is this body's).
pub(crate) fn of_message(msg: &Message<'_>, index: Option<&Index<'_>>) -> Routing {
    match msg {
        Message::Msg(m) => {
            let body = m.body();
            match index {
                Some(index) if std::ptr::eq(index.doc(), body) => of_command(index, None),
                _ => of_command(&Index::new(body), None),
            }
        }
        Message::Query(q) if q.is_command() => {
            let mut r = of_command(&Index::new(q.command()), Some(q.query));
            // secondaryOk (bit 2) without an explicit preference: a secondary is acceptable.
            if q.flags & 4 != 0
                && r.read_pref == ReadPref::Primary
                && r.read_pref_error.is_none()
                && read_pref(q.query).is_none()
                && read_pref(q.command()).is_none()
            {
                r.read_pref = ReadPref::SecondaryPreferred;
            }
            r
        }
        Message::Query(q) => Routing {
            class: Some(Class::Other),
            read_pref: if q.flags & 4 != 0 {
                ReadPref::SecondaryPreferred
            } else {
                ReadPref::Primary
            },
            may_open_cursor: true,
            ..Routing::default()
        },
        Message::Insert(_) | Message::Update(_) | Message::Delete(_) => Routing {
            class: Some(Class::LegacyWrite),
            ..Routing::default()
        },
        Message::GetMore(g) => Routing {
            class: Some(Class::Other),
            cursor: Some(g.cursor_id),
            ..Routing::default()
        },
        Message::KillCursors(k) => {
            let first = k.cursor_ids().next();
            let rest = kill_rest_ids(k.cursor_ids().skip(1), first);
            Routing {
                class: Some(Class::Other),
                cursor: first,
                kills_cursor: true,
                kill_rest: (!rest.is_empty()).then(|| {
                    Box::new(KillRest {
                        ns: None,
                        ids: rest,
                    })
                }),
                ..Routing::default()
            }
        }
        _ => Routing::default(),
    }
}

/// What a reply says about a cursor: the id of an open cursor (`cursor.id != 0`), or that it
/// is finished.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CursorReply {
    Open(i64),
    Closed,
    None,
}

/// What mongoguard reads off an upstream reply, in one parse: whether it is an error
/// (`ok: 0`), its code, and its cursor. Compressed replies are not opened (all unknown).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ReplyFacts {
    pub error: bool,
    pub code: Option<i32>,
    pub cursor: CursorReply,
}

impl ReplyFacts {
    /// Reads an uncompressed OP_MSG or OP_REPLY reply.
    pub(crate) fn read(reply: &Frame) -> ReplyFacts {
        let unknown = ReplyFacts {
            error: false,
            code: None,
            cursor: CursorReply::None,
        };
        let (body, legacy_cursor) = match reply.op_code() {
            Some(OpCode::Msg) => match OpMsg::parse(reply.bytes()) {
                Ok(m) => (m.body(), None),
                Err(_) => return unknown,
            },
            Some(OpCode::Reply) => match OpReply::parse(reply.bytes()) {
                Ok(r) => match r.documents().next() {
                    Some(doc) => (doc, Some(r.cursor_id)),
                    None => return unknown,
                },
                Err(_) => return unknown,
            },
            _ => return unknown,
        };
        ReplyFacts::from_body(body, legacy_cursor)
    }

    /// Only whether the reply whose (first) document is `body` is an error (`ok` is 0): what
    /// the metrics need when neither routing nor the strategy reads the other facts. One
    /// lookup instead of [`ReplyFacts::from_body`]'s index and three.
    pub(crate) fn error_of(body: &RawDocument) -> bool {
        says_not_ok(body.get_fast("ok").ok().flatten())
    }

    /// The facts of a reply whose (first) document is `body`; `legacy_cursor`: an OP_REPLY's
    /// cursor id.
    pub(crate) fn from_body(body: &RawDocument, legacy_cursor: Option<i64>) -> ReplyFacts {
        let body = Index::new(body);
        // A malformed value reads as absent here: these facts only steer routing and pins.
        let field = |key| body.get(key).ok().flatten();
        let (ok, code, cursor) = (field("ok"), field("code"), field("cursor"));
        let error = says_not_ok(ok);
        let code = match code {
            Some(RawBsonRef::Int32(c)) if error => Some(c),
            _ => None,
        };
        let cursor = match legacy_cursor {
            Some(0) => CursorReply::Closed,
            Some(id) => CursorReply::Open(id),
            None => command_cursor(cursor),
        };
        ReplyFacts {
            error,
            code,
            cursor,
        }
    }
}

/// `cursor: {id, ns}` of a command reply.
fn command_cursor(cursor: Option<RawBsonRef<'_>>) -> CursorReply {
    let Some(RawBsonRef::Document(c)) = cursor else {
        return CursorReply::None;
    };
    match c.get_fast("id").ok().flatten().and_then(int64) {
        Some(0) => CursorReply::Closed,
        Some(id) => CursorReply::Open(id),
        None => CursorReply::None,
    }
}

/// `ok` is 0 (or false).
fn says_not_ok(ok: Option<RawBsonRef<'_>>) -> bool {
    match ok {
        Some(RawBsonRef::Double(v)) => v == 0.0,
        Some(RawBsonRef::Int32(v)) => v == 0,
        Some(RawBsonRef::Int64(v)) => v == 0,
        Some(RawBsonRef::Boolean(v)) => !v,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::builder::{encode_msg_reply, MsgBuilder};
    use bson::{rawdoc, spec::BinarySubtype, Binary};
    use bytes::Bytes;

    fn route(body: bson::RawDocumentBuf) -> Routing {
        let bytes: Bytes = MsgBuilder::new(body).encode(1, 0);
        let msg = Message::parse(&bytes, 1 << 20).unwrap();
        of_message(&msg, None)
    }

    /// The metrics-only lookup answers what the full facts say, for every `ok` form.
    /// Odd killCursors shapes: no follow-up where there is nothing (or nowhere) to kill.
    #[test]
    fn kill_cursors_odd_shapes() {
        let r = route(rawdoc! {"killCursors": "c", "cursors": 5i64, "$db": "d"});
        assert!(r.kill_rest.is_none() && r.cursor.is_none() && r.kills_cursor);
        let r = route(rawdoc! {"killCursors": "c", "cursors": {"0": 5i64, "1": 6i64}, "$db": "d"});
        assert!(r.kill_rest.is_none() && r.cursor.is_none());
        let r = route(rawdoc! {"killCursors": "c", "cursors": [], "$db": "d"});
        assert!(r.kill_rest.is_none() && r.cursor.is_none());
        let r = route(rawdoc! {"killCursors": "c", "cursors": [5i64, 6i64]});
        assert!(r.kill_rest.is_none(), "no $db");
        let r = route(rawdoc! {"killCursors": "c", "cursors": [5i64, 6i64], "$db": 1});
        assert!(r.kill_rest.is_none());
        // Non-integers are skipped (mongod refuses the command: its reply is an error).
        let r = route(
            rawdoc! {"killCursors": "c", "cursors": ["x", 5i64, 6.5, 7i32, 0i64, -3i64, 7i64], "$db": "d"},
        );
        assert_eq!(r.cursor, Some(5));
        assert_eq!(r.kill_rest.unwrap().ids, [7, 0, -3, 7]);
    }

    #[test]
    fn error_of_agrees_with_the_full_facts() {
        let bodies = [
            rawdoc! {"ok": 1.0},
            rawdoc! {"ok": 0.0, "code": 13, "errmsg": "x"},
            rawdoc! {"ok": 0},
            rawdoc! {"ok": 0_i64},
            rawdoc! {"ok": false},
            rawdoc! {"ok": true},
            rawdoc! {"ok": "0"},
            rawdoc! {},
            rawdoc! {"cursor": {"id": 0_i64, "ns": "d.c", "firstBatch": []}, "ok": 1.0},
            rawdoc! {"cursor": {"id": 5_i64, "ns": "d.c", "firstBatch": []}, "ok": 0.0},
        ];
        for body in &bodies {
            assert_eq!(
                ReplyFacts::error_of(body),
                ReplyFacts::from_body(body, None).error,
                "{body:?}"
            );
        }
        assert!(ReplyFacts::error_of(&bodies[1]));
        assert!(!ReplyFacts::error_of(&bodies[0]));
    }

    #[test]
    fn classes_read_preference_transactions_and_cursors() {
        assert_eq!(
            route(rawdoc! {"isMaster": 1, "$db": "admin"}).class(),
            Class::Hello
        );
        assert_eq!(
            route(rawdoc! {"saslStart": 1, "$db": "admin"}).class(),
            Class::SaslStart
        );
        let r = route(rawdoc! {"find": "c", "$db": "d",
        "$readPreference": {"mode": "secondaryPreferred"}});
        assert_eq!(r.read_pref, ReadPref::SecondaryPreferred);
        assert!(r.may_open_cursor);
        let lsid = rawdoc! {"id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] }};
        let r = route(
            rawdoc! {"insert": "c", "lsid": lsid.clone(), "txnNumber": 3i64,
            "startTransaction": true, "autocommit": false, "$db": "d"},
        );
        assert_eq!(r.txn.as_ref().unwrap().txn_number, 3);
        assert!(r.starts_txn);
        // A retryable write (txnNumber without autocommit:false) is not a transaction.
        let r = route(rawdoc! {"insert": "c", "lsid": lsid, "txnNumber": 4i64, "$db": "d"});
        assert!(r.txn.is_none());
        let r = route(rawdoc! {"getMore": 99i64, "collection": "c", "$db": "d"});
        assert_eq!(r.cursor, Some(99));
        let r = route(rawdoc! {"killCursors": "c", "cursors": [5i64], "$db": "d"});
        assert_eq!(r.cursor, Some(5));
        assert!(r.kill_rest.is_none(), "one cursor: nothing to follow up");
    }

    /// A killCursors of several cursors: the first routes it, the others (repeats of the
    /// first dropped, at most `killer::MAX_IDS`) are followed up in its namespace.
    #[test]
    fn kill_cursors_of_several_cursors_keeps_the_rest() {
        let r =
            route(rawdoc! {"killCursors": "c", "cursors": [5i64, 6i64, 5i64, 7i64], "$db": "d"});
        assert_eq!(r.cursor, Some(5));
        let rest = r.kill_rest.expect("the rest");
        assert_eq!(rest.ns, Some(("d".into(), "c".into())));
        assert_eq!(rest.ids, [6, 7]);
        let mut many = bson::RawArrayBuf::new();
        (1..=5_000i64).for_each(|id| many.push(id));
        let r = route(rawdoc! {"killCursors": "c", "cursors": many, "$db": "d"});
        assert_eq!(
            r.kill_rest.unwrap().ids.len(),
            crate::proxy::pooled::killer::MAX_IDS
        );
        // No namespace to kill them in (mongod refuses such a command anyway).
        let r = route(rawdoc! {"killCursors": 1, "cursors": [5i64, 6i64], "$db": "d"});
        assert!(r.kill_rest.is_none());
    }

    /// A legacy OP_KILL_CURSORS: the first id routes it, the others (no namespace) are
    /// followed up as OP_KILL_CURSORS.
    #[test]
    fn legacy_kill_cursors_keeps_the_rest() {
        let route = |ids: &[i64]| {
            let bytes = crate::wire::builder::encode_kill_cursors(1, ids);
            of_message(&Message::parse(&bytes, 1 << 20).unwrap(), None)
        };
        let r = route(&[5, 6, 5, 7]);
        assert_eq!((r.cursor, r.kills_cursor), (Some(5), true));
        let rest = r.kill_rest.expect("the rest");
        assert_eq!((rest.ns, rest.ids), (None, vec![6, 7]));
        let r = route(&[5, 5]);
        assert!(r.kill_rest.is_none(), "one cursor: nothing to follow up");
        let many: Vec<i64> = (1..=5_000).collect();
        assert_eq!(
            route(&many).kill_rest.unwrap().ids.len(),
            crate::proxy::pooled::killer::MAX_IDS
        );
    }

    #[test]
    fn reply_cursors_and_error_codes() {
        let open = encode_msg_reply(
            1,
            1,
            &rawdoc! {"cursor": {"id": 42i64, "ns": "d.c", "firstBatch": []}, "ok": 1.0},
        );
        let f = Frame::from_bytes(open).unwrap();
        assert_eq!(ReplyFacts::read(&f).cursor, CursorReply::Open(42));
        let done = encode_msg_reply(
            1,
            1,
            &rawdoc! {"cursor": {"id": 0i64, "ns": "d.c", "nextBatch": []}, "ok": 1.0},
        );
        assert_eq!(
            ReplyFacts::read(&Frame::from_bytes(done).unwrap()).cursor,
            CursorReply::Closed
        );
        let err = encode_msg_reply(
            1,
            1,
            &rawdoc! {"ok": 0.0, "code": 10107, "errmsg": "not primary"},
        );
        let facts = ReplyFacts::read(&Frame::from_bytes(err).unwrap());
        assert!(facts.error);
        assert_eq!(facts.code, Some(10107));
        let ok = ReplyFacts::read(&f);
        assert!(!ok.error);
        assert_eq!(ok.code, None);
        // A legacy OP_REPLY: the cursor comes from the header, the error from the document.
        let legacy = crate::wire::builder::encode_reply(1, 1, 0, 77, 0, &[&rawdoc! {"ok": 0.0}]);
        let facts = ReplyFacts::read(&Frame::from_bytes(legacy).unwrap());
        assert!(facts.error);
        assert_eq!(facts.cursor, CursorReply::Open(77));
    }
}
