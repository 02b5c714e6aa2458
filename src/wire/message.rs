//! One enum over every opcode's view.

use super::{
    error::WireError, Header, OpCode, OpCompressed, OpDelete, OpGetMore, OpInsert, OpKillCursors,
    OpMsg, OpQuery, OpReply, OpUpdate,
};

/// A parsed, validated message of any known opcode.
#[derive(Clone, Copy, Debug)]
pub enum Message<'a> {
    /// OP_MSG.
    Msg(OpMsg<'a>),
    /// OP_QUERY.
    Query(OpQuery<'a>),
    /// OP_REPLY.
    Reply(OpReply<'a>),
    /// OP_INSERT.
    Insert(OpInsert<'a>),
    /// OP_UPDATE.
    Update(OpUpdate<'a>),
    /// OP_DELETE.
    Delete(OpDelete<'a>),
    /// OP_GET_MORE.
    GetMore(OpGetMore<'a>),
    /// OP_KILL_CURSORS.
    KillCursors(OpKillCursors<'a>),
    /// OP_COMPRESSED (call `decompress` and parse the result to see inside).
    Compressed(OpCompressed<'a>),
}

impl<'a> Message<'a> {
    /// Parses a whole message (header included). Unknown opcodes are an error.
    pub fn parse(message: &'a [u8], max_message_size: usize) -> Result<Message<'a>, WireError> {
        let header = Header::parse(message).ok_or(WireError::ShortField("header"))?;
        let op =
            OpCode::from_i32(header.op_code).ok_or(WireError::UnknownOpCode(header.op_code))?;
        Ok(match op {
            OpCode::Msg => Message::Msg(OpMsg::parse(message)?),
            OpCode::Query => Message::Query(OpQuery::parse(message)?),
            OpCode::Reply => Message::Reply(OpReply::parse(message)?),
            OpCode::Insert => Message::Insert(OpInsert::parse(message)?),
            OpCode::Update => Message::Update(OpUpdate::parse(message)?),
            OpCode::Delete => Message::Delete(OpDelete::parse(message)?),
            OpCode::GetMore => Message::GetMore(OpGetMore::parse(message)?),
            OpCode::KillCursors => Message::KillCursors(OpKillCursors::parse(message)?),
            OpCode::Compressed => {
                Message::Compressed(OpCompressed::parse(message, max_message_size)?)
            }
        })
    }

    /// The opcode of this view.
    pub fn op_code(&self) -> OpCode {
        match self {
            Message::Msg(_) => OpCode::Msg,
            Message::Query(_) => OpCode::Query,
            Message::Reply(_) => OpCode::Reply,
            Message::Insert(_) => OpCode::Insert,
            Message::Update(_) => OpCode::Update,
            Message::Delete(_) => OpCode::Delete,
            Message::GetMore(_) => OpCode::GetMore,
            Message::KillCursors(_) => OpCode::KillCursors,
            Message::Compressed(_) => OpCode::Compressed,
        }
    }

    /// True when the sender expects no reply to this message: OP_MSG with moreToCome, and the
    /// legacy fire-and-forget writes and OP_KILL_CURSORS.
    pub fn expects_reply(&self) -> bool {
        match self {
            Message::Msg(m) => !m.flags().more_to_come(),
            Message::Insert(_)
            | Message::Update(_)
            | Message::Delete(_)
            | Message::KillCursors(_)
            | Message::Reply(_) => false,
            Message::Query(_) | Message::GetMore(_) | Message::Compressed(_) => true,
        }
    }
}
