//! Control commands of the stand-in for out-of-process tests: `standinStats` and
//! `standinStepDown`. Both run without authentication, against any database, and only with
//! exactly this spelling (like every command of mongod, they are case-sensitive).

use std::time::Duration;

use bson::{doc, Bson, Document};

use super::{opt_count, CmdError, CmdResult, Ctx};
use crate::bsonutil::truthy;

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `{standinStats: 1, reset: <bool>}`: this member's counters (see [`crate::Stats`]).
///
/// The reply is `{connectionsAccepted, connectionsOpen, connectionsOpenMax (the most open at
/// once since start or the last reset), authentications, messages,
/// compressedMessages (OP_COMPRESSED requests), commands: {<lower-case name>: n}, member, isWritablePrimary, ok: 1}` (counts are int64,
/// `member` int32; commands never seen, or not seen since a reset, are left out). The
/// `standinStats` request itself is already counted (in `messages` and
/// `commands.standinstats`), and so is the connection it came on. With `reset: true` the
/// counters are zeroed right after being read.
pub(crate) fn stats(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let reset = cmd.get("reset").is_some_and(truthy);
    let s = &ctx.shared.stats;
    let snap = s.snapshot(reset);
    let mut commands = Document::new();
    for (name, n) in snap.commands {
        if n > 0 {
            commands.insert(name, to_i64(n));
        }
    }
    Ok(doc! {
        "connectionsAccepted": to_i64(snap.connections_accepted),
        "connectionsOpen": to_i64(s.connections_open()),
        "connectionsOpenMax": to_i64(snap.connections_open_max),
        "authentications": to_i64(snap.authentications),
        "messages": to_i64(snap.messages),
        "compressedMessages": to_i64(snap.compressed_messages),
        "commands": commands,
        "member": i32::try_from(ctx.shared.member_index()).unwrap_or(i32::MAX),
        "isWritablePrimary": ctx.shared.is_writable_primary(),
    })
}

/// `{standinStepDown: 1, newPrimary: <int>, gapMs: <int>}`: [`crate::ReplicaSet::step_down`],
/// replying at once with `{ok: 1, newPrimary, gapMs}`. `newPrimary` defaults to the member
/// after the current (or pending) primary, `gapMs` to 1000. On a stand-in that is not a member
/// of a [`crate::ReplicaSet`]: IllegalOperation (20), "not a replica set".
pub(crate) fn step_down(ctx: &Ctx, cmd: &Document) -> CmdResult {
    let Some((set, _)) = &ctx.shared.member else {
        return Err(CmdError::new(20, "IllegalOperation", "not a replica set"));
    };
    let new_primary = match opt_count(cmd, "newPrimary")? {
        None => set.next_member(),
        Some(n) => match usize::try_from(n) {
            Ok(n) if n < set.len() => n,
            _ => {
                return Err(CmdError::bad_value(format!(
                    "newPrimary must be a member index in [0, {}), got {n}",
                    set.len()
                )))
            }
        },
    };
    let gap_ms = match opt_count(cmd, "gapMs")? {
        None => 1000,
        Some(n) if n >= 0 => n,
        Some(n) => {
            return Err(CmdError::bad_value(format!(
                "gapMs must be non-negative, got {n}"
            )))
        }
    };
    set.step_down(new_primary, Duration::from_millis(gap_ms as u64));
    Ok(doc! {
        "newPrimary": Bson::Int32(i32::try_from(new_primary).unwrap_or(i32::MAX)),
        "gapMs": gap_ms,
    })
}
