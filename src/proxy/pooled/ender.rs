//! Pooled mode's endSessions: answered by mongoguard at once, sent upstream in the background.
//!
//! Drivers end their implicit sessions when a client closes (pymongo waits for the reply,
//! the Node.js driver sends it with moreToCome). For mongod the command is advice: it marks
//! the sessions for its reaper (`LogicalSessionCache::endSessions`, called from
//! src/mongo/db/commands/end_sessions_command.cpp), a session nobody ends expires after
//! `localLogicalSessionTimeoutMinutes` (30), and the driver sessions specification tells
//! drivers to ignore its errors. For a serverless client that opens a connection per
//! invocation, waiting for it is one more upstream round trip per invocation. Pooled mode
//! therefore answers it itself and ends the same sessions upstream from one background task,
//! batched (at most [`MAX_BATCH`] per command, as drivers do), on a pooled connection of the
//! identity the client authenticated as: mongod keys a session by its id and the digest of
//! the user that uses it (`makeLogicalSessionId`,
//! src/mongo/db/session/logical_session_id_helpers.cpp), so another identity would end
//! nothing.
//!
//! Only the plain form is answered here: OP_MSG, no document sequence, `endSessions` an array
//! of at most [`LOCAL_MAX`] elements `{id: UUID}` named `"0"`, `"1"`... in order, and
//! nothing else but `$db` and the generic fields drivers add, each once and in a form mongod
//! accepts ([`generic_accepted`]). Anything else (a `uid`, a
//! malformed element, an unknown field, a full queue) is forwarded and mongod answers it, as
//! before. The queue is bounded ([`QUEUE`] commands of at most [`LOCAL_MAX`] sessions: at most
//! 4 MiB of ids); when it is full the command is forwarded inline. Sessions the task cannot
//! end (no server, no connection, an error reply) are counted as failed and left to the
//! server's timeout, as a driver that cannot reach the server leaves them.

use std::{sync::Arc, time::Duration};

use bson::{spec::BinarySubtype, RawBsonRef, RawDocumentBuf};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::Pooled;
use crate::{
    metrics::{EndSessions, Metrics},
    upstream::{pool::PoolKey, topology::ReadPref, Identity},
    wire::{Frame, Message},
};

/// Sessions per endSessions mongoguard sends (the driver sessions specification's batch).
pub(crate) const MAX_BATCH: usize = 10_000;
/// The most sessions of one client endSessions answered locally; a larger one is forwarded.
pub(crate) const LOCAL_MAX: usize = 1_000;
/// Client endSessions commands queued for the background task.
const QUEUE: usize = 256;
/// The longest one background endSessions may take (selection, checkout and reply), when
/// `upstream.reply_timeout` is 0 (no limit).
const DEFAULT_BOUND: Duration = Duration::from_secs(30);

/// The fields besides `endSessions` and `$db` a locally answered endSessions may carry: the
/// generic arguments drivers attach to every command (src/mongo/idl/generic_argument.idl).
const GENERIC: &[&str] = &[
    "$clusterTime",
    "$readPreference",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
];

/// One client endSessions, queued.
struct Ending {
    identity: Identity,
    sessions: Sessions,
}

/// The sessions of an endSessions answered here.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Sessions {
    pub(crate) ids: Vec<[u8; 16]>,
    /// The client declared `apiVersion: "1"`; the upstream command declares it too (a server
    /// started with `requireApiVersion` refuses a command without it, and its sessions would
    /// then only expire).
    pub(crate) api_version: bool,
}

/// The sending side of the queue, held by [`Pooled`].
pub(crate) struct Ender {
    tx: mpsc::Sender<Ending>,
}

/// The receiving side, handed to [`run`].
pub(crate) struct Queue(mpsc::Receiver<Ending>);

impl Ender {
    pub(crate) fn new() -> (Ender, Queue) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Ender { tx }, Queue(rx))
    }

    /// Queues `sessions` to be ended upstream as `identity`; false when the queue is full or
    /// the task has stopped (the caller then forwards the command).
    pub(crate) fn defer(&self, identity: &Identity, sessions: Sessions) -> bool {
        self.tx
            .try_send(Ending {
                identity: identity.clone(),
                sessions,
            })
            .is_ok()
    }
}

/// The sessions of an endSessions mongoguard may answer itself (see the module's
/// documentation), or `None`: forward it.
pub(crate) fn local_sessions(frame: &Frame, max_message_size: usize) -> Option<Sessions> {
    let Ok(Message::Msg(msg)) = Message::parse(frame.bytes(), max_message_size) else {
        return None;
    };
    if msg.sequences().next().is_some() {
        return None;
    }
    let mut ids = None;
    let mut db = false;
    // Which generic arguments were met (by their place in GENERIC): each at most once.
    let mut seen = [false; GENERIC.len()];
    for (i, element) in msg.body().into_iter().enumerate() {
        let (key, value) = element.ok()?;
        match (i, key.as_str(), value) {
            (0, "endSessions", RawBsonRef::Array(a)) => ids = Some(session_ids(a)?),
            (_, "$db", RawBsonRef::String("admin")) if !db => db = true,
            (i, k, v) if i > 0 => {
                let at = GENERIC.iter().position(|g| *g == k)?;
                let first = !std::mem::replace(seen.get_mut(at)?, true);
                if !first || !generic_accepted(k, v) {
                    return None;
                }
            }
            _ => return None,
        }
    }
    // apiStrict and apiDeprecationErrors only with apiVersion (mongod: 4886600).
    let has = |k: &str| {
        GENERIC
            .iter()
            .position(|g| *g == k)
            .is_some_and(|at| seen.get(at) == Some(&true))
    };
    if (has("apiStrict") || has("apiDeprecationErrors")) && !has("apiVersion") {
        return None;
    }
    Some(Sessions {
        ids: ids.filter(|_| db)?,
        api_version: has("apiVersion"),
    })
}

/// Whether mongod accepts generic argument `key` with `value` on endSessions: `apiVersion`
/// the string "1", `apiStrict` and `apiDeprecationErrors` booleans, `$readPreference` a
/// document of a valid `mode` alone (what drivers send with endSessions), `$clusterTime` a
/// document (its signature is mongod's to check: the background command does not carry it).
/// Anything else is forwarded for mongod to answer (jstests/core/api_version_parameters.js).
fn generic_accepted(key: &str, value: RawBsonRef<'_>) -> bool {
    match (key, value) {
        ("apiVersion", RawBsonRef::String(v)) => v == "1",
        ("apiStrict" | "apiDeprecationErrors", RawBsonRef::Boolean(_)) => true,
        ("$readPreference", RawBsonRef::Document(d)) => {
            let mut fields = d.into_iter();
            matches!(
                (fields.next(), fields.next()),
                (Some(Ok((k, RawBsonRef::String(mode)))), None)
                    if k.as_str() == "mode"
                        && matches!(
                            mode,
                            "primary" | "primaryPreferred" | "secondary"
                                | "secondaryPreferred" | "nearest"
                        )
            )
        }
        ("$clusterTime", RawBsonRef::Document(_)) => true,
        _ => false,
    }
}

/// `[{id: UUID}, ...]` with its elements named "0", "1"... in order, at most [`LOCAL_MAX`].
fn session_ids(array: &bson::RawArray) -> Option<Vec<[u8; 16]>> {
    let mut ids = Vec::new();
    let mut name = String::new();
    // The array's own bytes, read as the document they are, for the element names.
    let doc = bson::RawDocument::from_bytes(array.as_bytes()).ok()?;
    for (i, element) in doc.into_iter().enumerate() {
        let (key, value) = element.ok()?;
        let key = key.as_str();
        name.clear();
        {
            use std::fmt::Write;
            write!(name, "{i}").ok()?;
        }
        if key != name || i >= LOCAL_MAX {
            return None;
        }
        let RawBsonRef::Document(session) = value else {
            return None;
        };
        let mut fields = session.into_iter();
        let (Some(Ok((key, RawBsonRef::Binary(id)))), None) = (fields.next(), fields.next()) else {
            return None;
        };
        if key.as_str() != "id" {
            return None;
        }
        if id.subtype != BinarySubtype::Uuid {
            return None;
        }
        ids.push(<[u8; 16]>::try_from(id.bytes).ok()?);
    }
    Some(ids)
}

/// The background task: ends queued sessions upstream until the pools close.
pub(crate) async fn run(pooled: Arc<Pooled>, Queue(mut rx): Queue, metrics: Arc<Metrics>) {
    loop {
        let first = tokio::select! {
            biased;
            _ = pooled.cancel.cancelled() => break,
            e = rx.recv() => match e {
                Some(e) => e,
                None => return,
            },
        };
        // Whatever else is queued joins its batch.
        let mut batches: Vec<Ending> = vec![first];
        while let Ok(e) = rx.try_recv() {
            join(&mut batches, e);
        }
        for batch in &batches {
            let api_version = batch.sessions.api_version;
            for chunk in batch.sessions.ids.chunks(MAX_BATCH) {
                let outcome = tokio::select! {
                    biased;
                    _ = pooled.cancel.cancelled() => Err("mongoguard is shutting down".to_string()),
                    r = end_upstream(&pooled, &batch.identity, chunk, api_version) => r,
                };
                match outcome {
                    Ok(()) => metrics.end_sessions(EndSessions::Sent, chunk.len()),
                    Err(e) => {
                        debug!(error = %e, sessions = chunk.len(),
                            "endSessions not sent upstream; the server expires the sessions");
                        metrics.end_sessions(EndSessions::Failed, chunk.len());
                    }
                }
            }
        }
    }
    // Shut down: what is still queued is left to the server's session timeout.
    rx.close();
    let mut left = 0;
    while let Ok(e) = rx.try_recv() {
        left += e.sessions.ids.len();
    }
    if left > 0 {
        warn!(
            sessions = left,
            "shutting down with client endSessions not yet sent upstream; the server expires \
             those sessions after its session timeout"
        );
        metrics.end_sessions(EndSessions::Failed, left);
    }
}

/// Adds `e` to the batch of its identity and API version (a command either declares the
/// version or does not), or starts one.
fn join(batches: &mut Vec<Ending>, e: Ending) {
    match batches.iter_mut().find(|b| {
        b.identity.name == e.identity.name && b.sessions.api_version == e.sessions.api_version
    }) {
        Some(b) => b.sessions.ids.extend_from_slice(&e.sessions.ids),
        None => batches.push(e),
    }
}

/// One endSessions of `ids` on a pooled connection of `identity` to the primary (else any
/// member, as drivers send it: primaryPreferred), within the reply timeout.
async fn end_upstream(
    pooled: &Pooled,
    identity: &Identity,
    ids: &[[u8; 16]],
    api_version: bool,
) -> Result<(), String> {
    let bound = match pooled.reply_timeout {
        d if d.is_zero() => DEFAULT_BOUND,
        d => d,
    };
    let work = async {
        let host = pooled
            .topology
            .select(ReadPref::PrimaryPreferred, pooled.server_selection_timeout)
            .await
            .map_err(|e| e.to_string())?;
        let mut conn = pooled
            .pool
            .checkout(&PoolKey::new(host, identity.name.clone()))
            .await
            .map_err(|e| e.to_string())?;
        let command = end_sessions_command(ids, api_version);
        // An error leaves the connection unreleased: dropped, it is closed.
        let reply = conn.command(&command).await.map_err(|e| e.to_string())?;
        conn.release();
        if crate::upstream::reply_ok(&reply) {
            Ok(())
        } else {
            Err(format!("the upstream refused endSessions: {reply:?}"))
        }
    };
    tokio::time::timeout(bound, work)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {bound:?}")))
}

/// `{endSessions: [{id: UUID}, ...], $db: "admin"}`, with `apiVersion: "1"` when asked.
fn end_sessions_command(ids: &[[u8; 16]], api_version: bool) -> RawDocumentBuf {
    let mut array = bson::RawArrayBuf::new();
    for id in ids {
        array.push(bson::rawdoc! {
            "id": bson::Binary { subtype: BinarySubtype::Uuid, bytes: id.to_vec() },
        });
    }
    if api_version {
        bson::rawdoc! {"endSessions": array, "$db": "admin", "apiVersion": "1"}
    } else {
        bson::rawdoc! {"endSessions": array, "$db": "admin"}
    }
}

#[cfg(test)]
mod tests;
