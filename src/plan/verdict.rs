//! What an `explain` says: the explain command mongoguard sends for a request, and the
//! verdict read off the reply's winning plan.

use bson::{RawArray, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::command::{CommandView, Kind};

pub use crate::policy::PlanFacts;

/// A verdict: the facts and a short text for `/shapes` and the violation record
/// (`COLLSCAN`, `IXSCAN a_1`, `IXSCAN a_1 + SORT`, `explain failed: ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What the rules read.
    pub facts: PlanFacts,
    /// For people.
    pub summary: std::sync::Arc<str>,
    /// The explain failed: no facts (never fires a rule).
    pub failed: bool,
}

/// The fields of a request body an explain carries over (the rest — session, transaction,
/// read and write concern, `$db` — is the request's own business or refused inside explain).
const FIND_FIELDS: [&str; 8] = [
    "filter",
    "sort",
    "projection",
    "hint",
    "collation",
    "limit",
    "skip",
    "let",
];

/// The `explain` (queryPlanner verbosity) of the query `view` runs, or `None` for a command
/// the plan guard does not explain. Writes and findAndModify are explained as the `find` of
/// their (first) filter: the plan mongod picks to find the documents to change.
pub fn explain_command(view: &CommandView<'_>) -> Option<RawDocumentBuf> {
    let ns = view.namespace();
    let coll = ns.coll?;
    let body = view.body();
    let mut inner = RawDocumentBuf::new();
    match view.kind() {
        Kind::Find => {
            let body = body?;
            inner.append(bson::cstr!("find"), coll);
            copy_fields(body, &mut inner, &FIND_FIELDS);
        }
        Kind::Count => {
            let body = body?;
            inner.append(bson::cstr!("count"), coll);
            copy_fields(
                body,
                &mut inner,
                &["query", "hint", "collation", "limit", "skip"],
            );
        }
        Kind::Distinct => {
            let body = body?;
            inner.append(bson::cstr!("distinct"), coll);
            copy_fields(body, &mut inner, &["key", "query", "hint", "collation"]);
        }
        Kind::Aggregate => {
            let body = body?;
            let Ok(Some(RawBsonRef::Array(pipeline))) = body.get("pipeline") else {
                return None;
            };
            if writes_out(pipeline) {
                return None;
            }
            inner.append(bson::cstr!("aggregate"), coll);
            inner.append(bson::cstr!("pipeline"), pipeline.to_owned());
            copy_fields(body, &mut inner, &["hint", "collation", "let"]);
            inner.append(bson::cstr!("cursor"), RawDocumentBuf::new());
        }
        Kind::FindAndModify => {
            let body = body?;
            inner.append(bson::cstr!("find"), coll);
            if let Ok(Some(q)) = body.get("query") {
                inner.append(bson::cstr!("filter"), q);
            }
            copy_fields(body, &mut inner, &["sort", "hint", "collation"]);
        }
        Kind::Update | Kind::Delete => {
            let mut filter = None;
            let _ = view.for_each_statement(|s| {
                filter = match s.statement {
                    crate::command::Statement::Update { filter, .. }
                    | crate::command::Statement::Delete { filter, .. } => Some(filter),
                    crate::command::Statement::Insert { .. } => None,
                };
                std::ops::ControlFlow::Break(())
            });
            inner.append(bson::cstr!("find"), coll);
            inner.append(bson::cstr!("filter"), filter?.to_owned());
        }
        _ => return None,
    }
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::cstr!("explain"), inner);
    cmd.append(bson::cstr!("verbosity"), "queryPlanner");
    cmd.append(bson::cstr!("$db"), ns.db);
    Some(cmd)
}

fn copy_fields(from: &RawDocument, to: &mut RawDocumentBuf, fields: &[&str]) {
    for f in fields {
        if let Ok(Some(v)) = from.get(f) {
            if let Ok(key) = <&bson::raw::CStr>::try_from(*f) {
                to.append(key, v);
            }
        }
    }
}

fn writes_out(pipeline: &RawArray) -> bool {
    pipeline.into_iter().flatten().any(|stage| match stage {
        RawBsonRef::Document(d) => {
            matches!(crate::wire::first_key(d), Some("$out" | "$merge"))
        }
        _ => false,
    })
}

/// Reads the winning plan of an explain reply (mongod 4.4 to 8.0, classic and slot-based
/// engines, replica set or sharded): `queryPlanner.winningPlan` (its `queryPlan` under the
/// slot-based engine), the shards' winning plans under mongos (`winningPlan.shards[]`), and an
/// aggregation's `stages[0].$cursor.queryPlanner` or `shards.*.stages`. `None` when the reply
/// is an error or holds no plan.
pub fn read_verdict(reply: &RawDocument) -> Option<Verdict> {
    let mut plans = Vec::new();
    collect_plans(reply, &mut plans, 0);
    if plans.is_empty() {
        return None;
    }
    let mut facts = PlanFacts::default();
    let mut stages: Vec<String> = Vec::new();
    for plan in plans {
        walk(plan, &mut facts, &mut stages, 0);
    }
    if stages.is_empty() {
        return None;
    }
    stages.dedup();
    Some(Verdict {
        facts,
        summary: stages.join(" + ").into(),
        failed: false,
    })
}

fn doc<'a>(d: &'a RawDocument, key: &str) -> Option<&'a RawDocument> {
    match d.get(key) {
        Ok(Some(RawBsonRef::Document(v))) => Some(v),
        _ => None,
    }
}

/// The winning plans anywhere in an explain reply.
fn collect_plans<'a>(d: &'a RawDocument, out: &mut Vec<&'a RawDocument>, depth: usize) {
    if depth > 8 {
        return;
    }
    if let Some(qp) = doc(d, "queryPlanner") {
        if let Some(w) = doc(qp, "winningPlan") {
            match w.get("shards") {
                Ok(Some(RawBsonRef::Array(shards))) => {
                    for s in shards.into_iter().flatten() {
                        if let RawBsonRef::Document(s) = s {
                            if let Some(sw) = doc(s, "winningPlan") {
                                out.push(doc(sw, "queryPlan").unwrap_or(sw));
                            }
                        }
                    }
                }
                _ => out.push(doc(w, "queryPlan").unwrap_or(w)),
            }
        }
    }
    // Aggregations: stages[0].$cursor, and per shard (mongos): shards.<name>.
    if let Ok(Some(RawBsonRef::Array(stages))) = d.get("stages") {
        if let Some(Ok(RawBsonRef::Document(first))) = stages.into_iter().next() {
            if let Some(c) = doc(first, "$cursor") {
                collect_plans(c, out, depth + 1);
            }
        }
    }
    if let Some(shards) = doc(d, "shards") {
        for (_, s) in shards.into_iter().flatten() {
            if let RawBsonRef::Document(s) = s {
                collect_plans(s, out, depth + 1);
            }
        }
    }
}

/// Walks a plan tree (`inputStage`, `inputStages`, `outerStage`/`innerStage`).
fn walk(stage: &RawDocument, facts: &mut PlanFacts, names: &mut Vec<String>, depth: usize) {
    if depth > 64 {
        return;
    }
    if let Ok(Some(RawBsonRef::String(name))) = stage.get("stage") {
        match name {
            "COLLSCAN" => {
                facts.collscan = true;
                names.push("COLLSCAN".into());
            }
            "SORT" => {
                facts.in_memory_sort = true;
                names.push("SORT".into());
            }
            "IXSCAN"
            | "COUNT_SCAN"
            | "DISTINCT_SCAN"
            | "IDHACK"
            | "EXPRESS_IXSCAN"
            | "EXPRESS_CLUSTERED_IXSCAN" => {
                let index = match stage.get("indexName") {
                    Ok(Some(RawBsonRef::String(i))) => format!(" {i}"),
                    _ => String::new(),
                };
                names.push(format!("{name}{index}"));
            }
            _ => {}
        }
    }
    for key in ["inputStage", "outerStage", "innerStage"] {
        if let Some(child) = doc(stage, key) {
            walk(child, facts, names, depth + 1);
        }
    }
    if let Ok(Some(RawBsonRef::Array(children))) = stage.get("inputStages") {
        for c in children.into_iter().flatten() {
            if let RawBsonRef::Document(c) = c {
                walk(c, facts, names, depth + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    #[test]
    fn classic_slot_based_sharded_and_aggregate_plans() {
        // Classic engine (explainVersion 1): FETCH over IXSCAN, then an in-memory SORT.
        let classic = rawdoc! {"explainVersion": "1", "queryPlanner": {"namespace": "d.c",
        "winningPlan": {"stage": "SORT", "sortPattern": {"b": 1},
            "inputStage": {"stage": "FETCH", "inputStage": {"stage": "IXSCAN", "indexName": "a_1"}}},
        "rejectedPlans": []}, "ok": 1.0};
        let v = read_verdict(&classic).unwrap();
        assert_eq!(
            v.facts,
            PlanFacts {
                collscan: false,
                in_memory_sort: true
            }
        );
        assert_eq!(&*v.summary, "SORT + IXSCAN a_1");
        // Slot-based engine (explainVersion 2, mongod 7.0): the tree is under queryPlan.
        let sbe = rawdoc! {"explainVersion": "2", "queryPlanner": {"winningPlan": {
        "queryPlan": {"stage": "COLLSCAN", "direction": "forward"},
        "slotBasedPlan": {"slots": "...", "stages": "..."}}}, "ok": 1.0};
        let v = read_verdict(&sbe).unwrap();
        assert!(v.facts.collscan && !v.facts.in_memory_sort);
        // mongos: one shard scans, the other uses an index.
        let sharded = rawdoc! {"queryPlanner": {"winningPlan": {"stage": "SHARD_MERGE",
        "shards": [
            {"shardName": "s0", "winningPlan": {"stage": "SHARDING_FILTER", "inputStage": {"stage": "COLLSCAN"}}},
            {"shardName": "s1", "winningPlan": {"stage": "FETCH", "inputStage": {"stage": "IXSCAN", "indexName": "a_1"}}},
        ]}}, "ok": 1.0};
        let v = read_verdict(&sharded).unwrap();
        assert!(v.facts.collscan);
        // An aggregation whose $match went into the query layer.
        let agg = rawdoc! {"explainVersion": "1", "stages": [
        {"$cursor": {"queryPlanner": {"winningPlan": {"stage": "PROJECTION_SIMPLE",
            "inputStage": {"stage": "COLLSCAN"}}}}},
        {"$group": {"_id": "$a"}}], "ok": 1.0};
        assert!(read_verdict(&agg).unwrap().facts.collscan);
        // The _id lookup of mongod 8.0.
        let express = rawdoc! {"queryPlanner": {"winningPlan": {"stage": "EXPRESS_IXSCAN",
        "indexName": "_id_"}}, "ok": 1.0};
        let v = read_verdict(&express).unwrap();
        assert_eq!(v.facts, PlanFacts::default());
        // An error reply holds no plan.
        assert!(read_verdict(&rawdoc! {"ok": 0.0, "errmsg": "x", "code": 2}).is_none());
    }

    #[test]
    fn explain_commands_carry_the_query_only() {
        let body = rawdoc! {"find": "c", "filter": {"a": 1}, "sort": {"b": 1}, "lsid": {"id": 1},
        "txnNumber": 3i64, "readConcern": {"level": "majority"}, "$db": "d"};
        let view = CommandView::command("d", &body).unwrap();
        let cmd = explain_command(&view).unwrap();
        let inner = cmd.get_document("explain").unwrap();
        assert_eq!(inner.get_str("find").unwrap(), "c");
        assert!(inner.get("sort").unwrap().is_some());
        assert!(inner.get("lsid").unwrap().is_none());
        assert!(inner.get("readConcern").unwrap().is_none());
        assert_eq!(cmd.get_str("verbosity").unwrap(), "queryPlanner");
        assert_eq!(cmd.get_str("$db").unwrap(), "d");
        // A delete: the find of its filter.
        let body = rawdoc! {"delete": "c", "deletes": [{"q": {"x": 1}, "limit": 1}], "$db": "d"};
        let view = CommandView::command("d", &body).unwrap();
        let inner = explain_command(&view).unwrap();
        let inner = inner.get_document("explain").unwrap();
        assert_eq!(inner.get_document("filter").unwrap(), &*rawdoc! {"x": 1});
        // $out is never explained (explain would not run it, but mongoguard stays away).
        let body = rawdoc! {"aggregate": "c", "pipeline": [{"$match": {}}, {"$out": "o"}], "cursor": {}, "$db": "d"};
        let view = CommandView::command("d", &body).unwrap();
        assert!(explain_command(&view).is_none());
        // Inserts and other commands are not queries.
        let body = rawdoc! {"insert": "c", "documents": [{"a": 1}], "$db": "d"};
        assert!(explain_command(&CommandView::command("d", &body).unwrap()).is_none());
    }
}
