//! The legacy opcodes that old drivers behind legacy applications still send:
//! OP_INSERT, OP_UPDATE, OP_DELETE, OP_GET_MORE, OP_KILL_CURSORS. They are decoded so the
//! guard can see them like any command.

use bson::RawDocument;

use super::{error::WireError, reader::Reader, HEADER_LEN};

fn payload<'a>(message: &'a [u8], ctx: &'static str) -> Result<Reader<'a>, WireError> {
    let p = message
        .get(HEADER_LEN..)
        .ok_or(WireError::ShortField(ctx))?;
    Ok(Reader::new(p, ctx))
}

fn finish(r: &Reader<'_>, ctx: &'static str) -> Result<(), WireError> {
    if r.is_empty() {
        Ok(())
    } else {
        Err(WireError::TrailingBytes(ctx, r.remaining().len()))
    }
}

/// OP_INSERT (2002).
#[derive(Clone, Copy)]
pub struct OpInsert<'a> {
    /// Bit 0: continueOnError.
    pub flags: i32,
    /// `db.collection`.
    pub full_collection_name: &'a str,
    docs: &'a [u8],
}

impl<'a> OpInsert<'a> {
    /// Parses a whole message; at least one document is required.
    pub fn parse(message: &'a [u8]) -> Result<OpInsert<'a>, WireError> {
        let mut r = payload(message, "OP_INSERT")?;
        let flags = r.i32()?;
        let full_collection_name = r.cstring()?;
        let docs = r.remaining();
        if r.is_empty() {
            return Err(WireError::ShortField("OP_INSERT documents"));
        }
        while !r.is_empty() {
            r.document()?;
        }
        Ok(OpInsert {
            flags,
            full_collection_name,
            docs,
        })
    }

    /// The inserted documents.
    pub fn documents(&self) -> impl Iterator<Item = &'a RawDocument> + 'a {
        let mut r = Reader::new(self.docs, "OP_INSERT");
        std::iter::from_fn(move || {
            if r.is_empty() {
                None
            } else {
                r.document().ok()
            }
        })
    }
}

/// OP_UPDATE (2001).
#[derive(Clone, Copy)]
pub struct OpUpdate<'a> {
    /// `db.collection`.
    pub full_collection_name: &'a str,
    /// Bit 0 upsert, bit 1 multi.
    pub flags: i32,
    /// The filter.
    pub selector: &'a RawDocument,
    /// The update or replacement.
    pub update: &'a RawDocument,
}

impl<'a> OpUpdate<'a> {
    /// Upsert flag bit.
    pub const UPSERT: i32 = 1 << 0;
    /// Multi-update flag bit.
    pub const MULTI: i32 = 1 << 1;

    /// Parses a whole message.
    pub fn parse(message: &'a [u8]) -> Result<OpUpdate<'a>, WireError> {
        let mut r = payload(message, "OP_UPDATE")?;
        let _zero = r.i32()?;
        let full_collection_name = r.cstring()?;
        let flags = r.i32()?;
        let selector = r.document()?;
        let update = r.document()?;
        finish(&r, "OP_UPDATE")?;
        Ok(OpUpdate {
            full_collection_name,
            flags,
            selector,
            update,
        })
    }

    /// True when the multi flag is set.
    pub fn is_multi(&self) -> bool {
        self.flags & Self::MULTI != 0
    }

    /// True when the upsert flag is set.
    pub fn is_upsert(&self) -> bool {
        self.flags & Self::UPSERT != 0
    }
}

/// OP_DELETE (2006).
#[derive(Clone, Copy)]
pub struct OpDelete<'a> {
    /// `db.collection`.
    pub full_collection_name: &'a str,
    /// Bit 0: single remove.
    pub flags: i32,
    /// The filter.
    pub selector: &'a RawDocument,
}

impl<'a> OpDelete<'a> {
    /// Single-remove flag bit.
    pub const SINGLE_REMOVE: i32 = 1 << 0;

    /// Parses a whole message.
    pub fn parse(message: &'a [u8]) -> Result<OpDelete<'a>, WireError> {
        let mut r = payload(message, "OP_DELETE")?;
        let _zero = r.i32()?;
        let full_collection_name = r.cstring()?;
        let flags = r.i32()?;
        let selector = r.document()?;
        finish(&r, "OP_DELETE")?;
        Ok(OpDelete {
            full_collection_name,
            flags,
            selector,
        })
    }

    /// True when only one document is removed.
    pub fn is_single_remove(&self) -> bool {
        self.flags & Self::SINGLE_REMOVE != 0
    }
}

/// OP_GET_MORE (2005).
#[derive(Clone, Copy, Debug)]
pub struct OpGetMore<'a> {
    /// `db.collection`.
    pub full_collection_name: &'a str,
    /// Batch size.
    pub number_to_return: i32,
    /// The cursor.
    pub cursor_id: i64,
}

impl<'a> OpGetMore<'a> {
    /// Parses a whole message.
    pub fn parse(message: &'a [u8]) -> Result<OpGetMore<'a>, WireError> {
        let mut r = payload(message, "OP_GET_MORE")?;
        let _zero = r.i32()?;
        let full_collection_name = r.cstring()?;
        let number_to_return = r.i32()?;
        let cursor_id = r.i64()?;
        finish(&r, "OP_GET_MORE")?;
        Ok(OpGetMore {
            full_collection_name,
            number_to_return,
            cursor_id,
        })
    }
}

/// OP_KILL_CURSORS (2007).
#[derive(Clone, Copy)]
pub struct OpKillCursors<'a> {
    ids: &'a [u8],
}

impl<'a> OpKillCursors<'a> {
    /// Parses a whole message; the id count must match the bytes exactly.
    pub fn parse(message: &'a [u8]) -> Result<OpKillCursors<'a>, WireError> {
        let mut r = payload(message, "OP_KILL_CURSORS")?;
        let _zero = r.i32()?;
        let n = r.i32()?;
        let bytes = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(8))
            .ok_or(WireError::ShortField("OP_KILL_CURSORS ids"))?;
        let ids = r.take(bytes)?;
        finish(&r, "OP_KILL_CURSORS")?;
        Ok(OpKillCursors { ids })
    }

    /// The cursor ids.
    pub fn cursor_ids(&self) -> impl Iterator<Item = i64> + 'a {
        self.ids.chunks_exact(8).map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            i64::from_le_bytes(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::builder;
    use bson::rawdoc;

    #[test]
    fn legacy_round_trips() {
        let a = rawdoc! {"a": 1};
        let b = rawdoc! {"$set": {"b": 2}};
        let ins = builder::encode_insert(1, 0, "db.c", &[&a, &a]);
        assert_eq!(OpInsert::parse(&ins).unwrap().documents().count(), 2);
        let up = builder::encode_update(1, "db.c", OpUpdate::MULTI, &a, &b);
        let u = OpUpdate::parse(&up).unwrap();
        assert!(u.is_multi() && !u.is_upsert());
        assert_eq!(u.update.as_bytes(), b.as_bytes());
        let del = builder::encode_delete(1, "db.c", 0, &a);
        assert!(!OpDelete::parse(&del).unwrap().is_single_remove());
        let gm = builder::encode_get_more(1, "db.c", 10, 77);
        assert_eq!(OpGetMore::parse(&gm).unwrap().cursor_id, 77);
        let kc = builder::encode_kill_cursors(1, &[5, 6]);
        let ids: Vec<i64> = OpKillCursors::parse(&kc).unwrap().cursor_ids().collect();
        assert_eq!(ids, vec![5, 6]);
    }

    #[test]
    fn kill_cursors_count_lying() {
        let mut kc = builder::encode_kill_cursors(1, &[5]).to_vec();
        kc[20..24].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(OpKillCursors::parse(&kc).is_err());
        kc[20..24].copy_from_slice(&(-1i32).to_le_bytes());
        assert!(OpKillCursors::parse(&kc).is_err());
    }

    #[test]
    fn empty_insert_rejected() {
        let mut ins = builder::encode_insert(1, 0, "db.c", &[&rawdoc! {}]).to_vec();
        ins.truncate(16 + 4 + 5);
        let len = ins.len() as i32;
        ins[0..4].copy_from_slice(&len.to_le_bytes());
        assert!(OpInsert::parse(&ins).is_err());
    }
}

super::debug_fields!(OpInsert<'a>, "OpInsert", flags, full_collection_name);

super::debug_fields!(OpUpdate<'a>, "OpUpdate", full_collection_name, flags);

super::debug_fields!(OpDelete<'a>, "OpDelete", full_collection_name, flags);

super::debug_fields!(OpKillCursors<'a>, "OpKillCursors");
