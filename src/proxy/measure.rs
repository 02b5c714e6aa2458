//! Blast-radius measurement: a multi-document update or delete whose filter the policy could
//! neither prove to match everything nor prove selective (verdict `unknown`) is measured
//! against the data before it is forwarded. Unknown never means allow.
//!
//! For each such statement mongoguard sends, on the upstream connection (and so with the
//! identity) the write would use, before the write:
//!
//! 1. `find {$nor: [F]}`, `limit: 1`, projection `{_id: 1}`: the negation. No document back
//!    means every document matches F (exact; no approximate metadata count). When F really is
//!    selective the first non-matching document ends it; when F matches everything on a large
//!    collection the scan runs into `maxTimeMS`, which blocks.
//! 2. `find F`, `limit: max_docs + 1` (1 when W012 is off), projection `{_id: 1}`: how many
//!    match, up to the threshold, following the cursor with `getMore` if a batch falls short
//!    of the limit, and killing it if it is left open.
//!
//! Both carry the statement's collation and hint, the command's `let`, and `maxTimeMS`
//! (`[measure] time_limit_ms`); inside a running transaction they carry its `lsid` and
//! `txnNumber` (`autocommit: false`, never `startTransaction`), so they read what the write
//! would see. The first statement of a transaction (the one with `startTransaction`) is
//! measured outside it, just before it starts. Every request has a fresh requestID of
//! mongoguard's own, and no reply of these ever reaches the client.
//!
//! An aggregate that `$merge`s into existing documents is measured by one `aggregate` of its
//! stages before `$merge`, then `{$limit: max_docs + 1}` and `{$project: {_id: 1}}`, with its
//! collation, hint, `let` and `allowDiskUse`: its output is counted.
//!
//! A TTL (createIndexes, collMod) is measured with the TTL monitor's predicate, built from
//! mongoguard's clock when the plan is made (`policy::Ttl::filter`); when collMod names only
//! the index, or sets a collection-level TTL, its field is first looked up with `listIndexes`
//! or `listCollections` (a lookup that fails or finds nothing fails the measurement).
//!
//! [`policy::measure::finding`](crate::policy::measure::finding) turns the answers into a
//! violation (W001 / W003 measured, W012, or `on_error` for a failure).

use std::time::{Duration, SystemTime};

use bson::{RawBson, RawBsonRef, RawDocument, RawDocumentBuf};
use tokio_util::sync::CancellationToken;

use super::{error::upstream_error, error::SessionError, strategy::Link, Context};
use crate::{
    audit::{self, ViolationRecord},
    command::CommandView,
    policy::{
        filter,
        measure::{finding, Finding, Outcome},
        Decision, MeasureActions, RuleId, Ttl, TtlField,
    },
    wire::{
        builder::{encode_msg_reply, encode_query},
        Frame, Message, OpCode, OpMsg, OpReply,
    },
};

/// How much longer than `maxTimeMS` mongoguard waits for a measuring reply before it gives
/// up on the connection (the server's own limit should always answer first).
const NETWORK_MARGIN: Duration = Duration::from_secs(2);

/// Error codes meaning the server stopped being (or is not) a writable primary: the write
/// was never sent, and the client is told to retry elsewhere.
const STATE_CHANGE_CODES: [i32; 8] = [10107, 13435, 13436, 11602, 11600, 91, 189, 10058];

/// Everything needed to measure a request's statements after its message is gone.
#[derive(Debug, Clone)]
pub(crate) struct MeasurePlan {
    items: Vec<Item>,
    let_vars: Option<RawDocumentBuf>,
    pub(crate) actions: MeasureActions,
    /// `lsid` and `txnNumber` of the running transaction the write belongs to.
    txn: Option<(RawBson, RawBson)>,
    /// An aggregate's `allowDiskUse`, for the measuring aggregate of a `$merge` (its blocking
    /// stages need the same room as the aggregate's own).
    allow_disk_use: Option<RawBson>,
    /// The abortTransaction to send when the measurement blocks a transaction's statement.
    pub(crate) abort: Option<RawDocumentBuf>,
    /// The request's violation record, without the rule: what findings are recorded from.
    template: ViolationRecord,
}

#[derive(Debug, Clone)]
struct Item {
    statement: usize,
    db: String,
    coll: Option<String>,
    filter: RawDocumentBuf,
    collation: Option<RawDocumentBuf>,
    hint: Option<RawBson>,
    /// An aggregate's pipeline (it `$merge`s into existing documents): its output is counted.
    pipeline: Option<bson::RawArrayBuf>,
    rule: RuleId,
    shape: String,
    shape_hash: u64,
    /// A TTL whose field the command does not name: looked up before it is measured.
    ttl: Option<TtlLookup>,
    /// A TTL (what is measured is what the TTL monitor deletes): said in the finding.
    expires: bool,
}

/// A TTL (collMod) whose dates' field is looked up on the server before measuring.
#[derive(Debug, Clone)]
struct TtlLookup {
    /// `expireAfterSeconds`.
    seconds: i64,
    /// The index named by collMod (`listIndexes`), or `None`: the collection-level TTL of a
    /// clustered or time-series collection (`listCollections`).
    index: Option<String>,
}

impl MeasurePlan {
    /// The plan for `decision`'s statements to measure. `template` is the request's record.
    pub(crate) fn new(
        decision: &Decision<'_>,
        view: &CommandView<'_>,
        template: ViolationRecord,
        abort: Option<RawDocumentBuf>,
    ) -> MeasurePlan {
        let now = SystemTime::now();
        let items = decision
            .measure
            .iter()
            .map(|m| {
                // A TTL index: what the monitor's first pass deletes, from mongoguard's clock
                // (its field looked up first when the command names only the index).
                let (filter, ttl) = match m.ttl {
                    Some(Ttl {
                        field: TtlField::Path(field),
                        seconds,
                        partial,
                    }) => (Ttl::filter(field, seconds, partial, now), None),
                    Some(Ttl { field, seconds, .. }) => {
                        let index = match field {
                            TtlField::IndexNamed(name) => Some(name.to_owned()),
                            _ => None,
                        };
                        (m.filter.to_owned(), Some(TtlLookup { seconds, index }))
                    }
                    None => (m.filter.to_owned(), None),
                };
                let shape = filter::shape(&filter);
                let shape_hash = filter::shape_hash(&shape);
                Item {
                    statement: m.statement,
                    db: m.ns.db.to_owned(),
                    coll: m.ns.coll.map(str::to_owned),
                    filter,
                    collation: m.collation.map(ToOwned::to_owned),
                    hint: m.hint.map(RawBson::from),
                    pipeline: m.pipeline.map(ToOwned::to_owned),
                    rule: m.rule,
                    shape,
                    shape_hash,
                    ttl,
                    expires: m.ttl.is_some(),
                }
            })
            .collect();
        MeasurePlan {
            items,
            let_vars: decision.let_vars.map(ToOwned::to_owned),
            actions: decision.measure_actions,
            txn: view.body().and_then(running_transaction),
            allow_disk_use: view
                .body()
                .and_then(|b| b.get("allowDiskUse").ok().flatten())
                .map(RawBson::from),
            abort,
            template,
        }
    }
}

/// `lsid` and `txnNumber` of a statement inside a running transaction (`autocommit: false`
/// without `startTransaction`).
fn running_transaction(body: &RawDocument) -> Option<(RawBson, RawBson)> {
    let in_txn = matches!(body.get("autocommit"), Ok(Some(RawBsonRef::Boolean(false))));
    let starts = matches!(
        body.get("startTransaction"),
        Ok(Some(RawBsonRef::Boolean(true)))
    );
    if !in_txn || starts {
        return None;
    }
    let lsid = body.get("lsid").ok()??;
    let txn = body.get("txnNumber").ok()??;
    Some((RawBson::from(lsid), RawBson::from(txn)))
}

/// What a measurement decided.
#[derive(Debug)]
pub(crate) enum Measured {
    /// Forward the write (any findings were warnings, already recorded).
    Pass,
    /// Answer the client with this error instead (findings recorded).
    Block(String),
    /// The server is not (or no longer) the writable primary: the write was not sent.
    NotPrimary,
}

/// How a measurement left its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// Every reply was read: reuse it.
    Clean,
    /// A reply is still outstanding (mongoguard stopped waiting): never reuse it.
    Broken,
}

/// Why an exchange stopped short.
enum Abort {
    /// No reply within the time limit plus [`NETWORK_MARGIN`].
    Timeout(Duration),
    /// The server said it is not a writable primary.
    NotPrimary,
    /// The connection failed, or the shutdown deadline passed.
    Session(SessionError),
}

/// Measures every statement of `plan` on `link` and records what it finds. `op_msg`: the
/// upstream speaks OP_MSG (wire version 6 or later); otherwise OP_QUERY commands are sent.
pub(crate) async fn measure<L: Link>(
    ctx: &Context,
    link: &mut L,
    plan: &MeasurePlan,
    op_msg: bool,
    kill: &CancellationToken,
) -> Result<(Measured, LinkState), SessionError> {
    let mut state = LinkState::Clean;
    let mut findings: Vec<(&Item, Finding)> = Vec::new();
    for item in &plan.items {
        let outcome = if state == LinkState::Broken {
            Outcome::Failed("an earlier measuring query of this command got no answer".into())
        } else {
            let mut q = Queries {
                ctx,
                link: &mut *link,
                plan,
                item,
                op_msg,
                kill,
            };
            let started = std::time::Instant::now();
            let outcome = q.outcome().await;
            if let Ok(o) = &outcome {
                let failed = matches!(o, Outcome::Failed(_));
                ctx.metrics.measured(failed, started.elapsed());
            }
            match outcome {
                Ok(o) => o,
                Err(Abort::NotPrimary) => return Ok((Measured::NotPrimary, state)),
                Err(Abort::Session(e)) => return Err(e),
                Err(Abort::Timeout(after)) => {
                    ctx.metrics.measured(true, started.elapsed());
                    state = LinkState::Broken;
                    Outcome::Failed(format!("no answer within {} ms", after.as_millis()))
                }
            }
        };
        if let Some(mut f) = finding(&plan.actions, item.rule, &outcome) {
            if item.expires {
                f.detail = format!(
                    "a TTL deletes, within a minute, the documents older than its \
                     expireAfterSeconds; its filter is that age: {}",
                    f.detail
                );
            }
            findings.push((item, f));
        }
    }
    for (item, f) in &findings {
        super::observe::violation(ctx, record(plan, item, f));
    }
    let blocking: Vec<&(&Item, Finding)> = findings
        .iter()
        .filter(|(_, f)| f.action == crate::policy::Action::Block)
        .collect();
    if blocking.is_empty() {
        return Ok((Measured::Pass, state));
    }
    let mut text = super::guard::BlockedText::default();
    for (item, f) in &blocking {
        text.push(f.rule, 0, Some(item.statement), &f.detail);
    }
    let errmsg = text.finish();
    Ok((Measured::Block(errmsg), state))
}

fn record(plan: &MeasurePlan, item: &Item, f: &Finding) -> ViolationRecord {
    let info = f.rule.info();
    ViolationRecord {
        time: SystemTime::now(),
        rule_id: info.code,
        rule_name: info.name,
        reason: info.reason,
        action: match f.action {
            crate::policy::Action::Block => audit::Action::Block,
            _ => audit::Action::Warn,
        },
        statement_index: Some(item.statement),
        filter_shape: Some(item.shape.clone()),
        shape_hash: Some(item.shape_hash),
        detail: Some(f.detail.clone()),
        matched: f.matched,
        ..plan.template.clone()
    }
}

/// The two measuring queries of one statement.
struct Queries<'q, L> {
    ctx: &'q Context,
    link: &'q mut L,
    plan: &'q MeasurePlan,
    item: &'q Item,
    op_msg: bool,
    kill: &'q CancellationToken,
}

impl<L: Link> Queries<'_, L> {
    async fn outcome(&mut self) -> Result<Outcome, Abort> {
        if let Some(pipeline) = &self.item.pipeline {
            return self.merged(pipeline).await;
        }
        let Some(coll) = self.item.coll.as_deref() else {
            return Ok(Outcome::Failed("the write names no collection".into()));
        };
        let looked_up;
        let filter: &RawDocument = match &self.item.ttl {
            Some(ttl) => match self.ttl_filter(coll, ttl).await? {
                Ok(f) => {
                    looked_up = f;
                    &looked_up
                }
                Err(why) => return Ok(Outcome::Failed(why)),
            },
            None => &self.item.filter,
        };
        let negation = bson::rawdoc! {"$nor": [filter.to_owned()]};
        let reply = self.exchange(&self.find(coll, &negation, 1)).await?;
        let everything = match Batch::read(&reply) {
            Ok(b) => {
                self.close(coll, b.cursor).await?;
                b.docs == 0
            }
            Err(why) => return Ok(Outcome::Failed(why)),
        };
        let limit = if self.plan.actions.w012 == crate::policy::Action::Off {
            1
        } else {
            self.plan.actions.max_docs.saturating_add(1)
        };
        if !everything && limit == 1 {
            // Not everything, and W012 is off: nothing left to ask.
            return Ok(Outcome::Counted {
                matched: 1,
                everything,
            });
        }
        let find = self.find(coll, filter, limit);
        self.count(&find, coll, limit, everything).await
    }

    /// The filter of what a TTL named only by its index (or a collection-level TTL) deletes:
    /// its field from `listIndexes` (the index's key pattern and partial filter) or
    /// `listCollections` (a clustered collection's `_id`, a time-series collection's time
    /// field). `Err`: why it could not be looked up (the measurement fails).
    async fn ttl_filter(
        &mut self,
        coll: &str,
        ttl: &TtlLookup,
    ) -> Result<Result<RawDocumentBuf, String>, Abort> {
        let now = SystemTime::now();
        let (cmd, cursor_coll) = match &ttl.index {
            Some(_) => (bson::rawdoc! {"listIndexes": coll}, coll.to_owned()),
            None => (
                bson::rawdoc! {"listCollections": 1, "filter": {"name": coll}},
                "$cmd.listCollections".to_owned(),
            ),
        };
        let mut cmd = cmd;
        cmd.append(bson::cstr!("maxTimeMS"), self.time_limit_ms());
        let cmd = self.finish_lookup(cmd);
        let reply = self.exchange(&cmd).await?;
        let (docs, cursor) = match first_batch(&reply) {
            Ok(b) => b,
            Err(why) => return Ok(Err(why)),
        };
        self.close(&cursor_coll, cursor).await?;
        let found = docs
            .into_iter()
            .find_map(|d| ttl_filter_from(d.ok()?.as_document()?, ttl, now));
        Ok(found.ok_or_else(|| match ttl.index {
            Some(_) => "the TTL's index is not on the collection".to_owned(),
            None => "the collection is neither clustered nor time-series".to_owned(),
        }))
    }

    /// `$db` for a catalog lookup (never inside a transaction: collMod cannot run in one).
    fn finish_lookup(&self, mut cmd: RawDocumentBuf) -> RawDocumentBuf {
        if self.op_msg {
            cmd.append(bson::cstr!("$db"), self.item.db.as_str());
        }
        cmd
    }

    /// Runs `cmd` (a find or aggregate opening a cursor on `coll`) and counts what it returns,
    /// following the cursor with getMore up to `limit`, then closes it.
    async fn count(
        &mut self,
        cmd: &RawDocument,
        coll: &str,
        limit: u64,
        everything: bool,
    ) -> Result<Outcome, Abort> {
        let reply = self.exchange(cmd).await?;
        let mut batch = match Batch::read(&reply) {
            Ok(b) => b,
            Err(why) => return Ok(Outcome::Failed(why)),
        };
        let mut matched = batch.docs;
        while batch.cursor != 0 && matched < limit {
            let reply = self.exchange(&self.get_more(coll, batch.cursor)).await?;
            batch = match Batch::read(&reply) {
                Ok(b) => b,
                Err(why) => return Ok(Outcome::Failed(why)),
            };
            matched += batch.docs;
        }
        self.close(coll, batch.cursor).await?;
        Ok(Outcome::Counted {
            matched: matched.min(limit),
            everything,
        })
    }

    /// An aggregate that `$merge`s into existing documents: its stages before `$merge`, then
    /// `{$limit: max_docs + 1}` and `{$project: {_id: 1}}`, counted as a find's matches
    /// (never "every document": what `$merge` matches in its target is not known here).
    async fn merged(&mut self, pipeline: &bson::RawArray) -> Result<Outcome, Abort> {
        let limit = self.plan.actions.max_docs.saturating_add(1);
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stages = bson::RawArrayBuf::new();
        for stage in pipeline {
            let Ok(RawBsonRef::Document(stage)) = stage else {
                return Ok(Outcome::Failed("the pipeline cannot be read".into()));
            };
            if matches!(stage.iter_elements().next(), Some(Ok(e)) if e.key().as_str() == "$merge") {
                break;
            }
            stages.push(stage.to_owned());
        }
        stages.push(bson::rawdoc! {"$limit": limit_i64});
        stages.push(bson::rawdoc! {"$project": {"_id": 1}});
        let mut cmd = match self.item.coll.as_deref() {
            Some(coll) => bson::rawdoc! {"aggregate": coll},
            None => bson::rawdoc! {"aggregate": 1},
        };
        cmd.append(bson::cstr!("pipeline"), stages);
        cmd.append(
            bson::cstr!("cursor"),
            bson::rawdoc! {"batchSize": limit_i64},
        );
        cmd.append(bson::cstr!("maxTimeMS"), self.time_limit_ms());
        self.write_options(&mut cmd);
        if let Some(a) = &self.plan.allow_disk_use {
            cmd.append(bson::cstr!("allowDiskUse"), a.clone());
        }
        let cmd = self.finish(cmd);
        // getMore and killCursors name the collection; a database-level aggregate's cursor
        // is on `$cmd.aggregate`.
        let coll = self.item.coll.clone();
        let coll = coll.as_deref().unwrap_or("$cmd.aggregate");
        self.count(&cmd, coll, limit, false).await
    }

    /// What the measured write carries that decides what its filter matches: its collation,
    /// hint and `let` variables.
    fn write_options(&self, cmd: &mut RawDocumentBuf) {
        if let Some(c) = &self.item.collation {
            cmd.append(bson::cstr!("collation"), c.clone());
        }
        if let Some(h) = &self.item.hint {
            cmd.append(bson::cstr!("hint"), h.clone());
        }
        if let Some(l) = &self.plan.let_vars {
            cmd.append(bson::cstr!("let"), l.clone());
        }
    }

    /// `{find: coll, filter, projection: {_id: 1}, limit, batchSize: limit, maxTimeMS, ...}`.
    fn find(&self, coll: &str, filter: &RawDocument, limit: u64) -> RawDocumentBuf {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut cmd = bson::rawdoc! {
            "find": coll,
            "filter": filter.to_owned(),
            "projection": {"_id": 1},
            "limit": limit,
            "batchSize": limit,
            "singleBatch": limit == 1,
            "maxTimeMS": self.time_limit_ms(),
        };
        self.write_options(&mut cmd);
        self.finish(cmd)
    }

    fn get_more(&self, coll: &str, cursor: i64) -> RawDocumentBuf {
        let cmd = bson::rawdoc! {
            "getMore": cursor,
            "collection": coll,
            "maxTimeMS": self.time_limit_ms(),
        };
        self.finish(cmd)
    }

    /// Kills a cursor a measuring query left open (its reply is read and ignored).
    async fn close(&mut self, coll: &str, cursor: i64) -> Result<(), Abort> {
        if cursor == 0 {
            return Ok(());
        }
        let cmd = self.finish(bson::rawdoc! {"killCursors": coll, "cursors": [cursor]});
        self.exchange(&cmd).await.map(drop)
    }

    /// Adds the transaction fields and `$db`.
    fn finish(&self, mut cmd: RawDocumentBuf) -> RawDocumentBuf {
        if let Some((lsid, txn)) = &self.plan.txn {
            cmd.append(bson::cstr!("lsid"), lsid.clone());
            cmd.append(bson::cstr!("txnNumber"), txn.clone());
            cmd.append(bson::cstr!("autocommit"), false);
        }
        if self.op_msg {
            cmd.append(bson::cstr!("$db"), self.item.db.as_str());
        }
        cmd
    }

    fn time_limit_ms(&self) -> i64 {
        i64::try_from(self.plan.actions.time_limit.as_millis()).unwrap_or(i64::MAX)
    }

    /// Sends one command with a fresh requestID and reads its reply. A server error is a
    /// reply (read by [`Batch::read`]), except "not primary", which aborts the measurement.
    async fn exchange(&mut self, cmd: &RawDocument) -> Result<RawDocumentBuf, Abort> {
        let id = self.ctx.request_ids.next();
        let bytes = if self.op_msg {
            encode_msg_reply(id, 0, cmd)
        } else {
            let ns = format!("{}.$cmd", self.item.db);
            encode_query(id, 0, &ns, 0, -1, cmd, None)
        };
        let limit = self.plan.actions.time_limit + NETWORK_MARGIN;
        let link = &mut *self.link;
        let max = self.ctx.config.proxy.max_message_size;
        let exchange = async {
            link.send(&bytes).await.map_err(SessionError::UpstreamIo)?;
            match link.next().await {
                None => Err(SessionError::UpstreamClosed),
                Some(Err(e)) => Err(upstream_error(e)),
                Some(Ok(f)) if f.header().response_to == id => {
                    reply_body(&f, max).map_err(SessionError::UpstreamProtocol)
                }
                Some(Ok(f)) => Err(SessionError::UpstreamProtocol(
                    crate::wire::WireError::bad_doc(
                        "upstream reply",
                        format!(
                            "responseTo {} does not answer mongoguard's request {id}",
                            f.header().response_to
                        ),
                    ),
                )),
            }
        };
        let body = tokio::select! {
            biased;
            _ = self.kill.cancelled() => return Err(Abort::Session(SessionError::Killed)),
            r = tokio::time::timeout(limit, exchange) => match r {
                Err(_) => return Err(Abort::Timeout(limit)),
                Ok(r) => r.map_err(Abort::Session)?,
            },
        };
        if let Ok(Some(RawBsonRef::Int32(code))) = body.get("code") {
            if STATE_CHANGE_CODES.contains(&code) && !says_ok(&body) {
                return Err(Abort::NotPrimary);
            }
        }
        Ok(body)
    }
}

/// The body of an OP_MSG or OP_REPLY reply (decompressed when compressed).
fn reply_body(f: &Frame, max: usize) -> Result<RawDocumentBuf, crate::wire::WireError> {
    let inner;
    let frame = match f.op_code() {
        Some(OpCode::Compressed) => match Message::parse(f.bytes(), max)? {
            Message::Compressed(c) => {
                inner = c.decompress()?;
                &inner
            }
            _ => return Err(crate::wire::WireError::UnknownOpCode(f.header().op_code)),
        },
        _ => f,
    };
    let no_doc = || crate::wire::WireError::bad_doc("upstream reply", "no document".to_owned());
    match frame.op_code() {
        Some(OpCode::Msg) => Ok(OpMsg::parse(frame.bytes())?.body().to_owned()),
        Some(OpCode::Reply) => OpReply::parse(frame.bytes())?
            .documents()
            .next()
            .map(ToOwned::to_owned)
            .ok_or_else(no_doc),
        _ => Err(crate::wire::WireError::UnknownOpCode(
            frame.header().op_code,
        )),
    }
}

fn says_ok(body: &RawDocument) -> bool {
    match body.get("ok") {
        Ok(Some(RawBsonRef::Double(f))) => f == 1.0,
        Ok(Some(RawBsonRef::Int32(n))) => n == 1,
        Ok(Some(RawBsonRef::Int64(n))) => n == 1,
        Ok(Some(RawBsonRef::Boolean(b))) => b,
        _ => false,
    }
}

/// The TTL filter from one document of a catalog lookup, if it is the one looked for: the
/// `listIndexes` spec named `ttl.index` (its key pattern's first field, its partial filter),
/// or the `listCollections` entry of a clustered (`_id`) or time-series (its `timeField`)
/// collection.
fn ttl_filter_from(d: &RawDocument, ttl: &TtlLookup, now: SystemTime) -> Option<RawDocumentBuf> {
    match &ttl.index {
        Some(name) => {
            (d.get_str("name").ok()? == name.as_str()).then_some(())?;
            let key = d.get_document("key").ok()?;
            let field = key.iter_elements().next()?.ok()?.key().as_str();
            let partial = d.get_document("partialFilterExpression").ok();
            Some(Ttl::filter(field, ttl.seconds, partial, now))
        }
        None => {
            let options = d.get_document("options").ok()?;
            // The time field first: a time-series collection's buckets are clustered too,
            // but its documents' `_id`s are not its dates.
            let field = match options.get_document("timeseries") {
                Ok(ts) => ts.get_str("timeField").ok()?,
                Err(_) => {
                    options.get("clusteredIndex").ok()??;
                    "_id"
                }
            };
            Some(Ttl::filter(field, ttl.seconds, None, now))
        }
    }
}

/// The documents of a catalog lookup's first batch and its cursor id (or why they cannot be
/// read, as [`Batch::read`] says it).
fn first_batch(body: &RawDocument) -> Result<(bson::RawArrayBuf, i64), String> {
    let batch = Batch::read(body)?;
    let docs = body
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .ok_or_else(|| "the upstream's answer has no first batch".to_owned())?;
    Ok((docs.to_owned(), batch.cursor))
}

/// One batch of a measuring query's cursor.
struct Batch {
    docs: u64,
    cursor: i64,
}

impl Batch {
    /// Reads `{ok: 1, cursor: {id, firstBatch | nextBatch}}`; an error reply, or a reply of
    /// another shape, is the failure's reason (its code name, never its errmsg: that can
    /// quote the filter's literals).
    fn read(body: &RawDocument) -> Result<Batch, String> {
        if !says_ok(body) {
            let code = match body.get("code") {
                Ok(Some(RawBsonRef::Int32(c))) => c.to_string(),
                _ => "no code".into(),
            };
            let name = match body.get("codeName") {
                Ok(Some(RawBsonRef::String(n))) => n,
                _ => "an error",
            };
            return Err(format!("the upstream answered {name} ({code})"));
        }
        let shape = || "the upstream's answer has no cursor".to_owned();
        let Ok(Some(RawBsonRef::Document(cursor))) = body.get("cursor") else {
            return Err(shape());
        };
        let id = match cursor.get("id") {
            Ok(Some(RawBsonRef::Int64(id))) => id,
            Ok(Some(RawBsonRef::Int32(id))) => i64::from(id),
            _ => return Err(shape()),
        };
        let batch = match (cursor.get("firstBatch"), cursor.get("nextBatch")) {
            (Ok(Some(RawBsonRef::Array(a))), _) | (_, Ok(Some(RawBsonRef::Array(a)))) => a,
            _ => return Err(shape()),
        };
        let mut docs = 0u64;
        for d in batch {
            d.map_err(|_| "the upstream's answer is malformed".to_owned())?;
            docs += 1;
        }
        Ok(Batch { docs, cursor: id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a collMod TTL that names only its index, or the collection, is measured on: found
    /// in mongod's listIndexes / listCollections answers.
    #[test]
    fn ttl_lookups_find_the_field() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let by_name = TtlLookup {
            seconds: 3600,
            index: Some("at_1".into()),
        };
        let spec = bson::rawdoc! {
            "v": 2, "key": {"at": 1}, "name": "at_1",
            "partialFilterExpression": {"kind": "session"},
        };
        let want = Ttl::filter("at", 3600, Some(&bson::rawdoc! {"kind": "session"}), now);
        assert_eq!(ttl_filter_from(&spec, &by_name, now), Some(want));
        let other = bson::rawdoc! {"v": 2, "key": {"_id": 1}, "name": "_id_"};
        assert_eq!(ttl_filter_from(&other, &by_name, now), None);

        let collection = TtlLookup {
            seconds: 60,
            index: None,
        };
        let clustered = bson::rawdoc! {
            "name": "events", "type": "collection",
            "options": {"clusteredIndex": {"key": {"_id": 1}, "unique": true}, "expireAfterSeconds": 60},
        };
        assert_eq!(
            ttl_filter_from(&clustered, &collection, now),
            Some(Ttl::filter("_id", 60, None, now))
        );
        let timeseries = bson::rawdoc! {
            "name": "metrics", "type": "timeseries",
            "options": {"timeseries": {"timeField": "ts", "metaField": "m", "granularity": "seconds"}},
        };
        assert_eq!(
            ttl_filter_from(&timeseries, &collection, now),
            Some(Ttl::filter("ts", 60, None, now))
        );
        let both = bson::rawdoc! {
            "name": "metrics", "type": "timeseries",
            "options": {"clusteredIndex": true, "timeseries": {"timeField": "ts"}},
        };
        assert_eq!(
            ttl_filter_from(&both, &collection, now),
            Some(Ttl::filter("ts", 60, None, now))
        );
        let plain = bson::rawdoc! {"name": "orders", "type": "collection", "options": {}};
        assert_eq!(ttl_filter_from(&plain, &collection, now), None);
    }
}
