//! OP_QUERY (opcode 2004): legacy queries, and still the carrier of many drivers' first
//! `hello` / `isMaster` and of commands sent to `db.$cmd` by old drivers.

use bson::RawDocument;

use super::{bson_util::check_duplicate_keys, error::WireError, reader::Reader, HEADER_LEN};

/// A validated, borrowed view of an OP_QUERY.
#[derive(Clone, Copy)]
pub struct OpQuery<'a> {
    /// Query flags (tailable, slaveOk, exhaust...).
    pub flags: i32,
    /// `db.collection`, or `db.$cmd` for a command.
    pub full_collection_name: &'a str,
    /// Documents to skip.
    pub number_to_skip: i32,
    /// Batch size hint; -1 / 1 for commands.
    pub number_to_return: i32,
    /// The query, or the command document.
    pub query: &'a RawDocument,
    /// Optional projection.
    pub return_fields_selector: Option<&'a RawDocument>,
}

impl<'a> OpQuery<'a> {
    /// Parses a whole message. A command (`*.$cmd`) must not repeat a top-level key, neither
    /// in the outer document nor inside a `$query` / `query` wrapper.
    pub fn parse(message: &'a [u8]) -> Result<OpQuery<'a>, WireError> {
        let payload = message
            .get(HEADER_LEN..)
            .ok_or(WireError::ShortField("OP_QUERY"))?;
        let mut r = Reader::new(payload, "OP_QUERY");
        let flags = r.i32()?;
        let full_collection_name = r.cstring()?;
        let number_to_skip = r.i32()?;
        let number_to_return = r.i32()?;
        let query = r.document()?;
        let return_fields_selector = if r.is_empty() {
            None
        } else {
            Some(r.document()?)
        };
        if !r.is_empty() {
            return Err(WireError::TrailingBytes("OP_QUERY", r.remaining().len()));
        }
        let q = OpQuery {
            flags,
            full_collection_name,
            number_to_skip,
            number_to_return,
            query,
            return_fields_selector,
        };
        if q.is_command() {
            check_duplicate_keys(query)?;
            if let Some(inner) = q.wrapped_command() {
                check_duplicate_keys(inner)?;
            }
        }
        Ok(q)
    }

    /// The database part of the namespace.
    pub fn database(&self) -> &'a str {
        self.full_collection_name
            .split_once('.')
            .map_or(self.full_collection_name, |(db, _)| db)
    }

    /// The collection part of the namespace (`$cmd` for commands).
    pub fn collection(&self) -> &'a str {
        self.full_collection_name
            .split_once('.')
            .map_or("", |(_, coll)| coll)
    }

    /// True when this OP_QUERY runs a command (`db.$cmd`).
    pub fn is_command(&self) -> bool {
        self.collection() == "$cmd"
    }

    fn wrapped_command(&self) -> Option<&'a RawDocument> {
        let first = super::first_key(self.query)?;
        if first != "$query" && first != "query" {
            return None;
        }
        match self.query.get(first) {
            Ok(Some(bson::RawBsonRef::Document(d))) => Some(d),
            _ => None,
        }
    }

    /// The command document: the query itself, or the document inside a `$query` / `query`
    /// wrapper that old drivers add to carry `$readPreference`.
    pub fn command(&self) -> &'a RawDocument {
        self.wrapped_command().unwrap_or(self.query)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::builder::encode_query;
    use bson::rawdoc;

    #[test]
    fn parses_hello_on_admin_cmd() {
        let bytes = encode_query(3, 0, "admin.$cmd", 0, -1, &rawdoc! {"isMaster": 1}, None);
        let q = OpQuery::parse(&bytes).unwrap();
        assert!(q.is_command());
        assert_eq!(q.database(), "admin");
        assert_eq!(crate::wire::first_key(q.command()), Some("isMaster"));
    }

    #[test]
    fn unwraps_dollar_query() {
        let cmd = rawdoc! {"$query": {"count": "c"}, "$readPreference": {"mode": "secondary"}};
        let bytes = encode_query(3, 0, "db.$cmd", 0, -1, &cmd, None);
        let q = OpQuery::parse(&bytes).unwrap();
        assert_eq!(crate::wire::first_key(q.command()), Some("count"));
    }

    #[test]
    fn trailing_bytes_rejected() {
        let mut bytes = encode_query(3, 0, "db.c", 0, 0, &rawdoc! {}, Some(&rawdoc! {})).to_vec();
        bytes.push(9);
        let len = bytes.len() as i32;
        bytes[0..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(
            OpQuery::parse(&bytes),
            Err(WireError::TrailingBytes(_, 1))
        ));
    }
}

super::debug_fields!(
    OpQuery<'a>,
    "OpQuery",
    flags,
    full_collection_name,
    number_to_skip,
    number_to_return
);
