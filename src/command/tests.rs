use std::ops::ControlFlow;

use bson::{rawdoc, RawDocumentBuf};

use super::*;
use crate::wire::{
    builder::{encode_delete, encode_insert, encode_query, encode_update, MsgBuilder, Sequence},
    Message, OpUpdate, DEFAULT_MAX_MESSAGE_SIZE,
};

fn with_view<R>(bytes: &[u8], f: impl FnOnce(CommandView<'_>) -> R) -> R {
    let msg = Message::parse(bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    f(CommandView::from_message(&msg).unwrap())
}

fn statements(view: &CommandView<'_>) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let _ = view
        .for_each_statement(|s| {
            let ns = format!("{}.{}", s.ns.db, s.ns.coll.unwrap_or("-"));
            let what = match s.statement {
                Statement::Insert { .. } => "insert".to_string(),
                Statement::Update {
                    multi,
                    upsert,
                    update,
                    ..
                } => format!(
                    "update multi={multi} upsert={upsert} {}",
                    match update {
                        UpdateMods::Operators(_) => "ops",
                        UpdateMods::Replacement(_) => "replace",
                        UpdateMods::Pipeline(_) => "pipeline",
                    }
                ),
                Statement::Delete { many, .. } => format!("delete many={many}"),
            };
            out.push((s.index, ns, what));
            ControlFlow::Continue(())
        })
        .unwrap();
    out
}

fn written(view: &CommandView<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let _ = view
        .for_each_written_namespace(|ns| {
            out.push(format!("{}.{}", ns.db, ns.coll.unwrap_or("*")));
            ControlFlow::Continue(())
        })
        .unwrap();
    out
}

fn filter_count(view: &CommandView<'_>) -> usize {
    let mut n = 0;
    let _ = view
        .for_each_filter(|_, _| {
            n += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
    n
}

fn msg(body: RawDocumentBuf) -> bytes::Bytes {
    MsgBuilder::new(body).encode(1, 0)
}

#[test]
fn statements_from_a_kind_1_sequence_are_numbered() {
    let bytes = MsgBuilder::new(rawdoc! {"update": "c", "$db": "d"})
        .sequence(Sequence::new(
            "updates",
            vec![
                rawdoc! {"q": {"a": 1}, "u": {"$set": {"b": 1}}, "multi": 1},
                rawdoc! {"q": {}, "u": {"b": 2}, "upsert": 1.0},
            ],
        ))
        .encode(1, 0);
    with_view(&bytes, |v| {
        assert_eq!(v.kind(), Kind::Update);
        assert_eq!(
            statements(&v),
            vec![
                (0, "d.c".into(), "update multi=true upsert=false ops".into()),
                (
                    1,
                    "d.c".into(),
                    "update multi=false upsert=true replace".into()
                ),
            ]
        );
        assert_eq!(filter_count(&v), 2);
        assert_eq!(written(&v), vec!["d.c"]);
    });
}

#[test]
fn repeated_keys_inside_statements_are_errors() {
    // {q: {}, limit: 1, limit: 0}: the guard would read 1, a server may read 0.
    let mut stmt = Vec::new();
    stmt.extend_from_slice(&[0x03]);
    stmt.extend_from_slice(b"q\0");
    stmt.extend_from_slice(&[5, 0, 0, 0, 0]);
    for v in [1i32, 0] {
        stmt.push(0x10);
        stmt.extend_from_slice(b"limit\0");
        stmt.extend_from_slice(&v.to_le_bytes());
    }
    let mut doc = ((stmt.len() + 5) as i32).to_le_bytes().to_vec();
    doc.extend_from_slice(&stmt);
    doc.push(0);
    let stmt = RawDocumentBuf::from_bytes(doc).unwrap();
    let bytes = MsgBuilder::new(rawdoc! {"delete": "c", "$db": "d"})
        .sequence(Sequence::new("deletes", vec![stmt]))
        .encode(1, 0);
    let m = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    let v = CommandView::from_message(&m).unwrap();
    assert_eq!(
        v.for_each_statement(|_| ControlFlow::Continue(()))
            .unwrap_err(),
        CommandError::DuplicateKey
    );
}

#[test]
fn delete_limits_of_every_numeric_type() {
    for (limit, many) in [
        (bson::Bson::Int32(0), true),
        (bson::Bson::Int64(0), true),
        (bson::Bson::Double(0.0), true),
        (bson::Bson::Double(1.0), false),
        (bson::Bson::Int64(1), false),
    ] {
        let mut stmt = bson::Document::new();
        stmt.insert("q", bson::doc! {});
        stmt.insert("limit", limit);
        let body =
            RawDocumentBuf::try_from(&bson::doc! {"delete": "c", "$db": "d", "deletes": [stmt]})
                .unwrap();
        with_view(&msg(body), |v| {
            assert_eq!(statements(&v)[0].2, format!("delete many={many}"));
        });
    }
}

#[test]
fn unreadable_statements_are_errors() {
    for body in [
        rawdoc! {"delete": "c", "$db": "d", "deletes": [{"q": {}, "limit": 2}]},
        rawdoc! {"delete": "c", "$db": "d", "deletes": [{"q": {}}]},
        rawdoc! {"delete": "c", "$db": "d", "deletes": [{"q": 1, "limit": 0}]},
        rawdoc! {"update": "c", "$db": "d", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": "yes"}]},
        rawdoc! {"update": "c", "$db": "d", "updates": [1]},
        rawdoc! {"update": "c", "$db": "d", "updates": {"q": {}}},
    ] {
        let bytes = msg(body);
        let m = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
        let v = CommandView::from_message(&m).unwrap();
        assert!(v.for_each_statement(|_| ControlFlow::Continue(())).is_err());
    }
}

#[test]
fn missing_db_is_an_error() {
    let bytes = msg(rawdoc! {"find": "c"});
    let m = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    assert_eq!(
        CommandView::from_message(&m).unwrap_err(),
        CommandError::MissingDb
    );
}

#[test]
fn op_query_commands_and_legacy_queries() {
    let q = encode_query(
        1,
        0,
        "shop.$cmd",
        0,
        -1,
        &rawdoc! {"findandmodify": "orders", "query": {}, "update": {"x": 1}},
        None,
    );
    with_view(&q, |v| {
        assert_eq!(v.kind(), Kind::FindAndModify);
        assert_eq!(v.db(), "shop");
        assert_eq!(
            statements(&v),
            vec![(
                0,
                "shop.orders".into(),
                "update multi=false upsert=false replace".into()
            )]
        );
    });
    let q = encode_query(
        1,
        0,
        "shop.orders",
        0,
        0,
        &rawdoc! {"$query": {"a": {"$ne": 1}}, "$orderby": {"a": 1}},
        None,
    );
    with_view(&q, |v| {
        assert_eq!(v.kind(), Kind::Find);
        assert_eq!(
            v.namespace(),
            Namespace {
                db: "shop",
                coll: Some("orders")
            }
        );
        assert_eq!(filter_count(&v), 1);
    });
}

#[test]
fn legacy_writes_carry_their_flags() {
    let sel = rawdoc! {};
    let up = rawdoc! {"$set": {"a": 1}};
    let u = encode_update(1, "admin.users", OpUpdate::MULTI, &sel, &up);
    with_view(&u, |v| {
        assert!(v.more_to_come());
        assert_eq!(
            statements(&v),
            vec![(
                0,
                "admin.users".into(),
                "update multi=true upsert=false ops".into()
            )]
        );
        assert_eq!(written(&v), vec!["admin.users"]);
    });
    let d = encode_delete(1, "d.c", 0, &sel);
    with_view(&d, |v| assert_eq!(statements(&v)[0].2, "delete many=true"));
    let d = encode_delete(1, "d.c", 1, &sel);
    with_view(&d, |v| assert_eq!(statements(&v)[0].2, "delete many=false"));
    let i = encode_insert(1, 0, "d.c", &[&sel, &sel]);
    with_view(&i, |v| assert_eq!(statements(&v).len(), 2));
}

#[test]
fn bulk_write_resolves_ns_info_from_body_and_sequences() {
    let body = rawdoc! {"bulkWrite": 1, "$db": "admin",
    "ops": [{"insert": 0, "document": {"a": 1}}, {"update": 1, "filter": {}, "updateMods": {"$set": {"a": 1}}, "multi": true}],
    "nsInfo": [{"ns": "app.users"}, {"ns": "config.settings"}]};
    with_view(&msg(body), |v| {
        assert_eq!(
            statements(&v),
            vec![
                (0, "app.users".into(), "insert".into()),
                (
                    1,
                    "config.settings".into(),
                    "update multi=true upsert=false ops".into()
                )
            ]
        );
        assert_eq!(written(&v), vec!["app.users", "config.settings"]);
    });
    let bytes = MsgBuilder::new(rawdoc! {"bulkWrite": 1, "$db": "admin"})
        .sequence(Sequence::new(
            "ops",
            vec![rawdoc! {"delete": 0, "filter": {}, "multi": 1}],
        ))
        .sequence(Sequence::new("nsInfo", vec![rawdoc! {"ns": "local.x"}]))
        .encode(1, 0);
    with_view(&bytes, |v| {
        assert_eq!(
            statements(&v),
            vec![(0, "local.x".into(), "delete many=true".into())]
        );
    });
    let bad = rawdoc! {"bulkWrite": 1, "$db": "admin", "ops": [{"insert": 3, "document": {}}], "nsInfo": [{"ns": "a.b"}]};
    let bytes = msg(bad);
    let m = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    let v = CommandView::from_message(&m).unwrap();
    assert!(v.for_each_statement(|_| ControlFlow::Continue(())).is_err());
}

#[test]
fn pipelines_are_walked_through_lookup_facet_union_with() {
    let body = rawdoc! {"aggregate": "c", "$db": "d", "cursor": {}, "pipeline": [
        {"$match": {"a": 1}},
        {"$lookup": {"from": "o", "as": "x", "pipeline": [{"$match": {"b": {"$ne": 2}}}]}},
        {"$facet": {"f1": [{"$match": {"c": 1}}], "f2": [{"$unionWith": {"coll": "u", "pipeline": [{"$match": {}}]}}]}},
        {"$merge": {"into": {"db": "admin", "coll": "stolen"}}}
    ]};
    with_view(&msg(body), |v| {
        assert_eq!(filter_count(&v), 4);
        assert_eq!(written(&v), vec!["admin.stolen"]);
    });
    let body = rawdoc! {"aggregate": 1, "$db": "d", "pipeline": [{"$out": "x"}]};
    with_view(&msg(body), |v| assert_eq!(written(&v), vec!["d.x"]));
}

#[test]
fn explain_of_a_write_is_a_read() {
    let body = rawdoc! {"explain": {"delete": "c", "deletes": [{"q": {}, "limit": 0}]}, "$db": "d"};
    with_view(&msg(body), |v| {
        let inner = v.explained().unwrap().unwrap();
        assert!(inner.is_explain());
        assert!(!inner.is_write());
        assert!(statements(&inner).is_empty());
        assert!(written(&inner).is_empty());
        assert_eq!(
            filter_count(&inner),
            1,
            "the explained write's filter is still a query"
        );
    });
}

#[test]
fn written_namespaces_of_ddl() {
    let cases = [
        (
            rawdoc! {"renameCollection": "a.b", "to": "admin.c", "$db": "admin"},
            vec!["a.b", "admin.c"],
        ),
        (
            rawdoc! {"dropDatabase": 1, "$db": "config"},
            vec!["config.*"],
        ),
        (
            rawdoc! {"mapReduce": "c", "map": "", "reduce": "", "out": {"merge": "m", "db": "local"}, "$db": "d"},
            vec!["local.m"],
        ),
        (
            rawdoc! {"mapReduce": "c", "map": "", "reduce": "", "out": {"inline": 1}, "$db": "d"},
            vec![],
        ),
        (
            rawdoc! {"applyOps": [{"op": "i", "ns": "admin.system.users", "o": {}}, {"op": "c", "ns": "x.$cmd", "o": {"drop": "y"}}], "$db": "admin"},
            vec!["admin.system.users", "x.y"],
        ),
        (rawdoc! {"find": "c", "$db": "admin"}, vec![]),
        (
            rawdoc! {"createIndexes": "system.profile", "indexes": [], "$db": "d"},
            vec!["d.system.profile"],
        ),
    ];
    for (body, want) in cases {
        with_view(&msg(body), |v| assert_eq!(written(&v), want));
    }
}

/// User and role management writes admin.system.users / roles whatever `$db` it is sent to
/// (src/mongo/db/commands/user_management_commands.idl); their reads write nothing.
#[test]
fn user_and_role_management_writes_the_auth_collections() {
    let cases = [
        (
            rawdoc! {"createUser": "u", "pwd": "p", "roles": [], "$db": "app"},
            vec!["admin.system.users"],
        ),
        (
            rawdoc! {"grantRolesToUser": "u", "roles": ["root"], "$db": "app"},
            vec!["admin.system.users"],
        ),
        (
            rawdoc! {"dropAllUsersFromDatabase": 1, "$db": "app"},
            vec!["admin.system.users"],
        ),
        (
            rawdoc! {"createRole": "r", "privileges": [], "roles": [], "$db": "app"},
            vec!["admin.system.roles"],
        ),
        (
            rawdoc! {"revokePrivilegesFromRole": "r", "privileges": [], "$db": "app"},
            vec!["admin.system.roles"],
        ),
        (rawdoc! {"usersInfo": 1, "$db": "app"}, vec![]),
        (rawdoc! {"rolesInfo": 1, "$db": "admin"}, vec![]),
    ];
    for (body, want) in cases {
        with_view(&msg(body), |v| assert_eq!(written(&v), want));
    }
}

/// applyOps: a rename op writes both full namespaces, dropDatabase the whole database, and a
/// nested applyOps is followed (its ops are as much writes as the outer ones).
#[test]
fn apply_ops_targets_of_command_ops_and_nested_apply_ops() {
    let body = rawdoc! {"applyOps": [
        {"op": "c", "ns": "app.$cmd", "o": {"renameCollection": "app.a", "to": "admin.b"}},
        {"op": "c", "ns": "app.$cmd", "o": {"applyOps": [
            {"op": "c", "ns": "other.$cmd", "o": {"applyOps": [{"op": "i", "ns": "local.x", "o": {"_id": 1}}]}},
            {"op": "c", "ns": "z.$cmd", "o": {"dropDatabase": 1}},
        ]}},
    ], "$db": "admin"};
    with_view(&msg(body), |v| {
        assert_eq!(written(&v), vec!["app.a", "admin.b", "local.x", "z.*"])
    });
}

#[test]
fn apply_ops_nesting_past_the_limit_and_unreadable_ops_are_errors() {
    let mut inner = rawdoc! {"applyOps": [{"op": "i", "ns": "a.b", "o": {}}]};
    for _ in 0..11 {
        inner = rawdoc! {"applyOps": [{"op": "c", "ns": "a.$cmd", "o": inner}]};
    }
    let bytes =
        msg(rawdoc! {"applyOps": [{"op": "c", "ns": "a.$cmd", "o": inner}], "$db": "admin"});
    with_view(&bytes, |v| {
        assert_eq!(
            v.for_each_written_namespace(|_| ControlFlow::Continue(())),
            Err(CommandError::TooDeep)
        )
    });
    let cases = [
        rawdoc! {"applyOps": [{"op": "c", "ns": "a.$cmd"}], "$db": "admin"},
        rawdoc! {"applyOps": [{"op": "c", "ns": "a.$cmd", "o": {"renameCollection": "a.b"}}], "$db": "admin"},
        rawdoc! {"applyOps": [{"op": "i", "o": {}}], "$db": "admin"},
        rawdoc! {"applyOps": [1], "$db": "admin"},
    ];
    for body in cases {
        with_view(&msg(body), |v| {
            assert!(v
                .for_each_written_namespace(|_| ControlFlow::Continue(()))
                .is_err())
        });
    }
}

/// Optional fields mongod's IDL parser skips when null (src/mongo/idl/idl_parser.cpp
/// `checkAndAssertTypeSlowPath`): a null find `filter`, count `query`, `writeConcern`, `let`
/// or statement `collation` is absent, not unreadable.
#[test]
fn null_optional_fields_are_absent() {
    let find = rawdoc! {"find": "c", "filter": null, "let": null, "writeConcern": null, "$db": "d"};
    with_view(&msg(find), |v| {
        assert_eq!(filter_count(&v), 0);
        assert!(v.let_vars().unwrap().is_none());
        assert!(v.write_concern().unwrap().is_none());
    });
    let count = rawdoc! {"count": "c", "query": bson::RawBson::Undefined, "$db": "d"};
    with_view(&msg(count), |v| assert_eq!(filter_count(&v), 0));
    let update = rawdoc! {"update": "c", "updates": [{"q": {"a": 1}, "u": {"$set": {"b": 1}}, "collation": null}], "$db": "d"};
    with_view(&msg(update), |v| assert_eq!(statements(&v).len(), 1));
    // findAndModify's query defaults to {} (find_and_modify.idl): null is that default.
    let fam =
        rawdoc! {"findAndModify": "c", "query": null, "update": {"$inc": {"n": 1}}, "$db": "d"};
    with_view(&msg(fam), |v| {
        let mut empty = false;
        let _ = v
            .for_each_statement(|s| {
                if let Statement::Update { filter, .. } = s.statement {
                    empty = filter.is_empty();
                }
                ControlFlow::Continue(())
            })
            .unwrap();
        assert!(empty);
    });
    // A wrong type is still unreadable.
    let find = rawdoc! {"find": "c", "filter": 5, "$db": "d"};
    with_view(&msg(find), |v| {
        assert!(v.for_each_filter(|_, _| ControlFlow::Continue(())).is_err())
    });
}

/// A Decimal128 limit is a number (mongod reads it with `numberDouble()`).
#[test]
fn decimal128_delete_limit_is_read() {
    let one: bson::Decimal128 = "1.0".parse().unwrap();
    let zero: bson::Decimal128 = "0E+3".parse().unwrap();
    let body = rawdoc! {"delete": "c", "deletes": [{"q": {"a": 1}, "limit": one}, {"q": {"a": 1}, "limit": zero}], "$db": "d"};
    with_view(&msg(body), |v| {
        let got: Vec<String> = statements(&v).into_iter().map(|s| s.2).collect();
        assert_eq!(got, vec!["delete many=false", "delete many=true"]);
    });
}

/// A view built with the body's index reads the same fields as one built without; an index
/// of another document (a caller's mistake) is not used: the view reads its own body.
#[test]
fn an_index_is_used_only_for_its_own_body() {
    let bytes = msg(rawdoc! {"find": "orders", "filter": {"a": 1}, "$db": "shop"});
    let other = rawdoc! {"find": "users", "filter": {"b": 2}, "$db": "admin"};
    let parsed = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    let Message::Msg(m) = parsed else {
        panic!("not an OP_MSG")
    };
    let plain = CommandView::from_message(&parsed).unwrap();
    for index in [
        Some(crate::wire::Index::new(m.body())),
        Some(crate::wire::Index::new(&other)),
        None,
    ] {
        let view = CommandView::from_message_indexed(&parsed, index).unwrap();
        assert_eq!(view.db(), "shop");
        assert_eq!(view.namespace(), plain.namespace());
        assert_eq!(view.namespace().coll, Some("orders"));
        let mut filters = Vec::new();
        let _ = view.for_each_filter(|_, f| {
            filters.push(f.to_owned());
            ControlFlow::Continue(())
        });
        assert_eq!(filters, vec![rawdoc! {"a": 1}]);
    }
}

/// A write's statements array read through the body's index (`Index::array_document`) is
/// read whole wherever it sits among the body's fields (before, at and after the index's 16
/// recorded elements), and a second array of the same name — mongod's IDL parser refuses a
/// duplicate field (40413), the guard must not read one and let mongod see the other — is
/// refused, wherever it sits.
#[test]
fn a_statements_array_is_read_wherever_it_sits_and_a_second_one_refused() {
    let cstr = |s: String| bson::raw::CString::try_from(s).unwrap();
    for pos in 0..24 {
        for second in [None, Some(0usize), Some(3), Some(20)] {
            let mut body = rawdoc! {"delete": "c", "$db": "d"};
            for i in 0..pos {
                body.append(cstr(format!("f{i}")), i);
            }
            let mut first = bson::RawArrayBuf::new();
            first.push(rawdoc! {"q": {"a": 1}, "limit": 1});
            body.append(cstr("deletes".into()), first);
            if let Some(gap) = second {
                for i in 0..gap {
                    body.append(cstr(format!("g{i}")), i as i32);
                }
                let mut dangerous = bson::RawArrayBuf::new();
                dangerous.push(rawdoc! {"q": {}, "limit": 0});
                dangerous.push(rawdoc! {"q": {}, "limit": 0});
                body.append(cstr("deletes".into()), dangerous);
            }
            let bytes = msg(body.clone());
            // A repeated top-level key is refused with the message, before any statement
            // is read.
            let m = match Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE) {
                Ok(m) => m,
                Err(crate::wire::WireError::DuplicateKey(k)) if second.is_some() => {
                    assert_eq!(k, "deletes");
                    continue;
                }
                Err(e) => panic!("pos {pos}, second {second:?}: {e:?}"),
            };
            let v = CommandView::from_message(&m).unwrap();
            assert!(second.is_none(), "a repeated deletes was not refused");
            let mut seen = Vec::new();
            let r = v.for_each_statement(|s| {
                if let Statement::Delete { many, .. } = s.statement {
                    seen.push((s.index, many));
                }
                ControlFlow::Continue(())
            });
            assert!(r.unwrap().is_continue());
            assert_eq!(seen, vec![(0, false)], "pos {pos}");
        }
    }
}

/// What the statement parsers read of one update or delete statement, or the error, next to
/// what mongod's IDL reads of it (src/mongo/db/ops/write_ops.idl: `UpdateOpEntry` is strict,
/// `multi` and `upsert` are `bool`; `DeleteOpEntry.limit` is `multi_delete_bool`, read by
/// `readMultiDeleteProperty` as `numberDouble()` that must be 0 or 1; a repeated field is
/// `throwDuplicateField`). The guard may refuse what mongod accepts (a number for `multi`
/// reads as its truth value, mongod refuses it), never read "one" or "not multi" where mongod
/// reads "many" or "multi".
#[test]
fn statement_fields_read_as_mongod_does_or_refused() {
    fn read(update: bool, stmt: RawDocumentBuf) -> Result<String, CommandError> {
        let body = if update {
            rawdoc! {"update": "c", "$db": "d", "updates": [stmt]}
        } else {
            rawdoc! {"delete": "c", "$db": "d", "deletes": [stmt]}
        };
        let bytes = msg(body);
        let parsed = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
        let view = CommandView::from_message(&parsed).unwrap();
        let mut out = String::new();
        let _ = view.for_each_statement(|s| {
            out = match s.statement {
                Statement::Update { multi, update, .. } => format!(
                    "multi={multi} {}",
                    match update {
                        UpdateMods::Operators(_) => "ops",
                        UpdateMods::Replacement(_) => "replace",
                        UpdateMods::Pipeline(_) => "pipeline",
                    }
                ),
                Statement::Delete { many, .. } => format!("many={many}"),
                Statement::Insert { .. } => "insert".into(),
            };
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }
    let upd = |s| read(true, s);
    let del = |s| read(false, s);
    let dec = |s: &str| bson::Bson::Decimal128(s.parse().unwrap());
    let set = rawdoc! {"$set": {"a": 1}};
    let u = |multi: bson::Bson| {
        let mut d = rawdoc! {"q": {}, "u": set.clone()};
        d.append(
            bson::cstr!("multi"),
            bson::RawBson::try_from(multi).unwrap(),
        );
        upd(d).map_err(|e| e.to_string())
    };
    for (multi, want) in [
        (bson::Bson::Boolean(true), Ok("multi=true ops")),
        (bson::Bson::Int32(1), Ok("multi=true ops")),
        (bson::Bson::Double(1.0), Ok("multi=true ops")),
        (bson::Bson::Double(0.5), Ok("multi=true ops")),
        (bson::Bson::Double(f64::NAN), Ok("multi=true ops")),
        (bson::Bson::Int64(0), Ok("multi=false ops")),
        (dec("0E+10"), Ok("multi=false ops")),
        (dec("1E-6176"), Ok("multi=true ops")),
        (bson::Bson::Null, Ok("multi=false ops")),
        (bson::Bson::String("yes".into()), Err(())),
        (bson::Bson::Document(bson::doc! {}), Err(())),
    ] {
        let got = u(multi.clone());
        assert_eq!(got.is_ok(), want.is_ok(), "multi {multi:?}: {got:?}");
        if let (Ok(g), Ok(w)) = (&got, want) {
            assert_eq!(g, w, "multi {multi:?}");
        }
    }
    // `u`: an array is a pipeline, a document whose first key is an operator, else a
    // replacement (`{}` included); any other type refused.
    assert_eq!(
        upd(rawdoc! {"q": {}, "u": [{"$set": {"a": 1}}]}).unwrap(),
        "multi=false pipeline"
    );
    assert_eq!(
        upd(rawdoc! {"q": {}, "u": {}}).unwrap(),
        "multi=false replace"
    );
    assert_eq!(
        upd(rawdoc! {"q": {}, "u": {"a": 1, "$set": {"b": 1}}}).unwrap(),
        "multi=false replace"
    );
    assert!(upd(rawdoc! {"q": {}, "u": "x"}).is_err());
    // `q` missing, of another type, or only a key it prefixes.
    assert!(upd(rawdoc! {"u": set.clone(), "multi": true}).is_err());
    assert!(upd(rawdoc! {"q": 1, "u": set.clone(), "multi": true}).is_err());
    assert!(upd(rawdoc! {"qq": {}, "u": set.clone(), "multi": true}).is_err());
    // A repeated key, read or not, of any type: mongod's parser refuses it, and a first-value
    // reader and a last-value reader would disagree.
    let mut twice = rawdoc! {"q": {"_id": 1}, "u": set.clone(), "multi": false};
    twice.append(bson::cstr!("multi"), true);
    assert!(matches!(upd(twice), Err(CommandError::DuplicateKey)));
    let mut twice = rawdoc! {"q": {"_id": 1}, "u": set.clone()};
    twice.append(bson::cstr!("q"), bson::rawdoc! {});
    assert!(matches!(upd(twice), Err(CommandError::DuplicateKey)));
    // ... also after more keys than the one walk decides (the slow path's check).
    let mut many = rawdoc! {"q": {"_id": 1}, "u": set.clone(), "multi": false};
    for i in 0..20 {
        many.append(bson::raw::CString::try_from(format!("k{i}")).unwrap(), i);
    }
    many.append(bson::cstr!("multi"), true);
    assert!(matches!(upd(many), Err(CommandError::DuplicateKey)));
    // A key that is not UTF-8 (mongod: an unknown field of a strict struct), before or after
    // the fields read.
    for at_start in [true, false] {
        let mut bytes = Vec::new();
        let mut element = vec![0x10, 0xff, 0xfe, 0x00];
        element.extend_from_slice(&1i32.to_le_bytes());
        let known = rawdoc! {"q": {}, "u": set.clone(), "multi": false};
        let inner = known.as_bytes().get(4..known.as_bytes().len() - 1).unwrap();
        if at_start {
            bytes.extend_from_slice(&element);
            bytes.extend_from_slice(inner);
        } else {
            bytes.extend_from_slice(inner);
            bytes.extend_from_slice(&element);
        }
        let mut doc = ((bytes.len() + 5) as i32).to_le_bytes().to_vec();
        doc.extend_from_slice(&bytes);
        doc.push(0);
        let stmt = RawDocumentBuf::from_bytes(doc).unwrap();
        assert!(upd(stmt).is_err(), "a non-UTF-8 key, first {at_start}");
    }
    // A statement that is not a document.
    let body = rawdoc! {"update": "c", "$db": "d", "updates": [1]};
    let bytes = msg(body);
    let parsed = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    let view = CommandView::from_message(&parsed).unwrap();
    assert!(view
        .for_each_statement(|_| ControlFlow::Continue(()))
        .is_err());

    // Delete `limit`: 0 (any numeric type, -0 too) is many, 1 is one, anything else refused
    // (mongod reads a non-number as 0, "many": refusing it never guesses "one").
    let d = |limit: bson::Bson| {
        let mut s = rawdoc! {"q": {}};
        s.append(
            bson::cstr!("limit"),
            bson::RawBson::try_from(limit).unwrap(),
        );
        del(s).ok()
    };
    for (limit, want) in [
        (bson::Bson::Int32(0), Some("many=true")),
        (bson::Bson::Int64(0), Some("many=true")),
        (bson::Bson::Double(-0.0), Some("many=true")),
        (dec("0.000"), Some("many=true")),
        (bson::Bson::Int32(1), Some("many=false")),
        (bson::Bson::Double(1.0), Some("many=false")),
        (dec("1.000"), Some("many=false")),
        (bson::Bson::Double(0.5), None),
        (bson::Bson::Int32(2), None),
        (bson::Bson::Double(f64::NAN), None),
        (bson::Bson::String("0".into()), None),
        (bson::Bson::Boolean(true), None),
        (bson::Bson::Boolean(false), None),
        (bson::Bson::Null, None),
    ] {
        assert_eq!(d(limit.clone()).as_deref(), want, "limit {limit:?}");
    }
    assert!(del(rawdoc! {"q": {}}).is_err(), "limit is required");
}

/// What the query rules read of a write's statements through `for_each_statement_filter`
/// (each filter's bytes, an update pipeline's bytes).
fn statement_filters(view: &CommandView<'_>, light: bool) -> Result<Vec<String>, CommandError> {
    let mut out = Vec::new();
    let mut push = |i: usize, f: &bson::RawDocument, p: Option<&bson::RawArray>| {
        out.push(format!(
            "{i} {:?} {:?}",
            f.as_bytes(),
            p.map(|p| p.as_bytes())
        ));
        ControlFlow::Continue(())
    };
    if light {
        let _ = view.for_each_statement_filter(&mut push)?;
    } else {
        let _ = view.for_each_statement(|s| match s.statement {
            Statement::Update {
                filter,
                update: UpdateMods::Pipeline(p),
                ..
            } => push(s.index, filter, Some(p)),
            Statement::Update { filter, .. } | Statement::Delete { filter, .. } => {
                push(s.index, filter, None)
            }
            Statement::Insert { .. } => ControlFlow::Continue(()),
        })?;
    }
    Ok(out)
}

/// Wherever the statements of an update or delete read whole without error, reading only
/// their filters and pipelines gives the same filters and pipelines, numbered alike: on every
/// readable corruption of statements in the body array, and of one in a kind-1 sequence.
#[test]
fn statement_filters_read_alone_are_those_read_whole() {
    let updates = [
        rawdoc! {"q": {"status": "A", "n": {"$gt": 1}}, "u": {"$set": {"x": 1}}, "multi": true},
        rawdoc! {"u": [{"$set": {"x": {"$literal": "y"}}}], "q": {}, "upsert": 1_i32, "hint": "a_1"},
        rawdoc! {"q": {"a": "é"}, "u": {"b": "ü"}, "c": {"new": {"z": 1}}, "upsertSupplied": false},
    ];
    let deletes = [
        rawdoc! {"q": {"_id": 1}, "limit": 0_i32, "collation": {"locale": "fr"}},
        rawdoc! {"limit": 1.0, "q": {"a": {"$in": [1, 2]}}, "hint": {"a": 1}},
    ];
    let mut agreed = 0;
    for (command, field, stmts) in [
        ("update", "updates", &updates[..]),
        ("delete", "deletes", &deletes[..]),
    ] {
        for (i, good) in stmts.iter().enumerate() {
            crate::wire::each_readable_variant(good.as_bytes(), |_, doc| {
                let mut others: Vec<RawDocumentBuf> = stmts.to_vec();
                others[i] = doc.to_owned();
                let array: Vec<bson::RawBson> = others
                    .iter()
                    .map(|d| bson::RawBson::Document(d.clone()))
                    .collect();
                let head = || {
                    if command == "update" {
                        rawdoc! {"update": "c", "$db": "d"}
                    } else {
                        rawdoc! {"delete": "c", "$db": "d"}
                    }
                };
                let mut body = head();
                let array = bson::RawArrayBuf::from_iter(array);
                if field == "updates" {
                    body.append(bson::cstr!("updates"), array);
                } else {
                    body.append(bson::cstr!("deletes"), array);
                }
                let in_body = msg(body);
                let in_sequence = MsgBuilder::new(head())
                    .sequence(Sequence::new(field, others.clone()))
                    .encode(1, 0);
                for bytes in [in_body, in_sequence] {
                    let Ok(m) = Message::parse(&bytes, DEFAULT_MAX_MESSAGE_SIZE) else {
                        continue;
                    };
                    let Ok(v) = CommandView::from_message(&m) else {
                        continue;
                    };
                    if let Ok(whole) = statement_filters(&v, false) {
                        assert_eq!(statement_filters(&v, true), Ok(whole));
                        agreed += 1;
                    }
                }
            });
        }
    }
    // Most variants are read whole without error: the comparison is not of nothing.
    assert!(agreed > 500, "{agreed} agreed");
}
