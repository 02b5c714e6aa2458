//! The handshake: recognising hello, keeping the client's metadata, and rewriting a
//! replica-set member's hello reply so that drivers see one server (the proxy) and never
//! discover the members behind it.

use bson::{RawBsonRef, RawDocument, RawDocumentBuf};
use bytes::Bytes;

use crate::wire::{
    builder::{encode_reply, MsgBuilder},
    Frame, Message, MsgFlags, OpMsg, OpReply, WireError,
};

/// hello and its legacy spellings (the value may be int, bool or double; only the name counts).
pub(crate) fn is_hello_command(name: &str) -> bool {
    matches!(name, "hello" | "isMaster" | "ismaster")
}

/// What a driver says about itself in its first hello, for logs (and later metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientMetadata {
    /// `client.application.name` (appName in the connection string).
    pub application: Option<String>,
    /// `client.driver.name` and `client.driver.version`, space-separated.
    pub driver: Option<String>,
}

/// Keeps metadata strings short: they come from the client and end up in logs.
const MAX_METADATA_LEN: usize = 128;

fn short(s: &str) -> String {
    let mut end = s.len().min(MAX_METADATA_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn get_str<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a str> {
    match doc.get(key) {
        Ok(Some(RawBsonRef::String(s))) => Some(s),
        _ => None,
    }
}

fn get_doc<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a RawDocument> {
    match doc.get(key) {
        Ok(Some(RawBsonRef::Document(d))) => Some(d),
        _ => None,
    }
}

impl ClientMetadata {
    /// Reads `client` out of a hello command; `None` if it carries none.
    pub fn from_hello(cmd: &RawDocument) -> Option<ClientMetadata> {
        let client = get_doc(cmd, "client")?;
        let application = get_doc(client, "application")
            .and_then(|a| get_str(a, "name"))
            .map(short);
        let driver = get_doc(client, "driver").map(|d| {
            let name = get_str(d, "name").unwrap_or("unknown");
            match get_str(d, "version") {
                Some(v) => short(&format!("{name} {v}")),
                None => short(name),
            }
        });
        Some(ClientMetadata {
            application,
            driver,
        })
    }
}

/// Fields of a replica-set member's hello that name other servers or the set. Forwarded as
/// they are, drivers would connect to the members directly, around the proxy and its rules.
const MEMBER_FIELDS: &[&str] = &[
    "hosts",
    "passives",
    "arbiters",
    "setName",
    "setVersion",
    "primary",
    "me",
    "electionId",
    "tags",
    "secondary",
    "arbiterOnly",
    "passive",
    "hidden",
    "lastWrite",
    "isreplicaset",
];

fn needs_rewrite(doc: &RawDocument) -> bool {
    doc.iter_elements()
        .flatten()
        .any(|e| MEMBER_FIELDS.contains(&e.key().as_str()))
}

/// The reply document with member fields removed and `msg: "isdbgrid"` added: the driver
/// then sees a single mongos-like endpoint, keeps sessions, retryable writes and
/// transactions, and does no discovery.
fn rewrite_document(doc: &RawDocument) -> Result<RawDocumentBuf, WireError> {
    let mut out = RawDocumentBuf::new();
    let mut has_msg = false;
    for elem in doc.iter_elements() {
        let elem = elem.map_err(|e| WireError::bad_doc("hello reply", e))?;
        let key = elem.key();
        if MEMBER_FIELDS.contains(&key.as_str()) {
            continue;
        }
        if key.as_str() == "msg" {
            has_msg = true;
        }
        let value = elem
            .value()
            .map_err(|e| WireError::bad_doc("hello reply", e))?;
        out.append(key, value);
    }
    if !has_msg {
        out.append(bson::cstr!("msg"), "isdbgrid");
    }
    Ok(out)
}

/// Rewrites an upstream hello reply if it describes a replica-set member; `Ok(None)` means
/// forward the original bytes. A compressed reply is decompressed and answered uncompressed
/// (always allowed: compression is per message).
pub(crate) fn rewrite_reply(
    reply: &Frame,
    max_message_size: usize,
) -> Result<Option<Bytes>, WireError> {
    let decompressed;
    let frame = match Message::parse(reply.bytes(), max_message_size)? {
        Message::Compressed(c) => {
            decompressed = c.decompress()?;
            &decompressed
        }
        _ => reply,
    };
    let header = frame.header();
    match Message::parse(frame.bytes(), max_message_size)? {
        Message::Msg(m) => rewrite_msg(&m, header.request_id, header.response_to),
        Message::Reply(r) => rewrite_op_reply(&r, header.request_id, header.response_to),
        Message::Compressed(_) => Err(WireError::NestedCompression),
        other => Err(WireError::UnknownOpCode(other.op_code() as i32)),
    }
}

/// Extra fields of an emulated hello that depend on the client's authentication.
#[derive(Debug, Default)]
pub(crate) struct HelloAuth {
    /// `saslSupportedMechs` to list.
    pub mechanisms: Option<Vec<&'static str>>,
    /// The `speculativeAuthenticate` reply.
    pub speculative: Option<RawDocumentBuf>,
}

/// mongoguard's own hello reply (pooled mode): one mongos-like endpoint with the upstream's
/// limits and wire versions, its own `connectionId`, no `hosts`/`setName`/`topologyVersion`
/// (so drivers poll hello on their monitoring connection, and mongoguard answers it), and the
/// compressors agreed with the client (`compression`, omitted when none).
pub(crate) fn emulated_reply(
    cmd: &RawDocument,
    facts: &crate::upstream::HelloFacts,
    connection_id: i32,
    auth: HelloAuth,
    offered: &[String],
) -> RawDocumentBuf {
    let mut r = RawDocumentBuf::new();
    if let Ok(Some(v)) = cmd.get("helloOk") {
        if crate::auth::sasl::truthy(v) {
            r.append(bson::cstr!("helloOk"), true);
        }
    }
    if first_key_is(cmd, "hello") {
        r.append(bson::cstr!("isWritablePrimary"), true);
    } else {
        r.append(bson::cstr!("ismaster"), true);
    }
    r.append(bson::cstr!("msg"), "isdbgrid");
    r.append(bson::cstr!("maxBsonObjectSize"), facts.max_bson_object_size);
    r.append(
        bson::cstr!("maxMessageSizeBytes"),
        facts.max_message_size_bytes,
    );
    r.append(bson::cstr!("maxWriteBatchSize"), facts.max_write_batch_size);
    r.append(bson::cstr!("localTime"), bson::DateTime::now());
    if let Some(m) = facts.logical_session_timeout_minutes {
        r.append(bson::cstr!("logicalSessionTimeoutMinutes"), m);
    }
    r.append(bson::cstr!("connectionId"), connection_id);
    r.append(bson::cstr!("minWireVersion"), facts.min_wire_version);
    r.append(bson::cstr!("maxWireVersion"), facts.max_wire_version);
    r.append(bson::cstr!("readOnly"), false);
    let agreed = agreed_compressors(cmd, offered);
    if !agreed.is_empty() {
        let mut arr = bson::RawArrayBuf::new();
        for c in agreed {
            arr.push(c);
        }
        r.append(bson::cstr!("compression"), arr);
    }
    if let Some(mechs) = auth.mechanisms {
        let mut arr = bson::RawArrayBuf::new();
        for m in mechs {
            arr.push(m);
        }
        r.append(bson::cstr!("saslSupportedMechs"), arr);
    }
    if let Some(spec) = auth.speculative {
        r.append(bson::cstr!("speculativeAuthenticate"), spec);
    }
    r.append(bson::cstr!("ok"), 1.0);
    r
}

/// The compressors of the client's hello (`compression: [names]`) that mongoguard offers,
/// in the client's order (mongod answers the same way: the client's list filtered).
fn agreed_compressors<'a>(cmd: &'a RawDocument, offered: &[String]) -> Vec<&'a str> {
    let Ok(Some(bson::RawBsonRef::Array(asked))) = cmd.get("compression") else {
        return Vec::new();
    };
    let mut agreed: Vec<&str> = Vec::new();
    for name in asked.into_iter().flatten() {
        if let bson::RawBsonRef::String(n) = name {
            if offered.iter().any(|o| o == n) && !agreed.contains(&n) {
                agreed.push(n);
            }
        }
    }
    agreed
}

fn first_key_is(doc: &RawDocument, name: &str) -> bool {
    crate::wire::first_key(doc) == Some(name)
}

/// `maxWireVersion` of an upstream hello reply (OP_MSG or OP_REPLY, uncompressed).
pub(crate) fn max_wire_version(reply: &Frame, max_message_size: usize) -> Option<i32> {
    let doc = match Message::parse(reply.bytes(), max_message_size).ok()? {
        Message::Msg(m) => m.body(),
        Message::Reply(r) => r.documents().next()?,
        _ => return None,
    };
    match doc.get("maxWireVersion").ok()?? {
        RawBsonRef::Int32(v) => Some(v),
        RawBsonRef::Int64(v) => i32::try_from(v).ok(),
        _ => None,
    }
}

fn rewrite_msg(
    m: &OpMsg<'_>,
    request_id: i32,
    response_to: i32,
) -> Result<Option<Bytes>, WireError> {
    if !needs_rewrite(m.body()) {
        return Ok(None);
    }
    let body = rewrite_document(m.body())?;
    // Keep moreToCome (streaming hello); the checksum no longer matches, so drop it.
    let flags = m.flags().0 & !MsgFlags::CHECKSUM_PRESENT;
    Ok(Some(
        MsgBuilder::new(body)
            .flags(flags)
            .encode(request_id, response_to),
    ))
}

fn rewrite_op_reply(
    r: &OpReply<'_>,
    request_id: i32,
    response_to: i32,
) -> Result<Option<Bytes>, WireError> {
    let mut docs = r.documents();
    let (Some(doc), None) = (docs.next(), docs.next()) else {
        // A hello reply is one document. Anything else may carry member fields in a document
        // the rewrite does not look at: refused (found by the hello_rewrite fuzz target).
        return Err(WireError::bad_doc(
            "hello reply",
            format!("OP_REPLY with {} documents", r.number_returned),
        ));
    };
    if !needs_rewrite(doc) {
        return Ok(None);
    }
    let body = rewrite_document(doc)?;
    Ok(Some(encode_reply(
        request_id,
        response_to,
        r.response_flags,
        r.cursor_id,
        r.starting_from,
        &[&body],
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{builder::encode_msg_reply, DEFAULT_MAX_MESSAGE_SIZE};
    use bson::rawdoc;

    #[test]
    fn an_op_reply_hello_with_other_than_one_document_is_refused() {
        let member = member_reply();
        for docs in [vec![], vec![&*member, &*member]] {
            let bytes = encode_reply(1, 1, 0, 0, 0, &docs);
            let frame = Frame::from_bytes(bytes).unwrap();
            assert!(rewrite_reply(&frame, DEFAULT_MAX_MESSAGE_SIZE).is_err());
        }
    }

    fn member_reply() -> RawDocumentBuf {
        rawdoc! {
            "isWritablePrimary": true, "topologyVersion": {"counter": 0_i64},
            "hosts": ["a:1", "b:2"], "setName": "rs0", "setVersion": 3, "primary": "a:1",
            "me": "a:1", "maxWireVersion": 21, "ok": 1.0,
        }
    }

    #[test]
    fn member_fields_removed_from_op_msg_reply() {
        let bytes = encode_msg_reply(5, 9, &member_reply());
        let frame = Frame::from_bytes(bytes).unwrap();
        let out = rewrite_reply(&frame, DEFAULT_MAX_MESSAGE_SIZE)
            .unwrap()
            .unwrap();
        let msg = OpMsg::parse(&out).unwrap();
        let body = msg.body();
        for f in ["hosts", "setName", "primary", "me", "setVersion"] {
            assert!(body.get(f).unwrap().is_none(), "{f} left in");
        }
        assert_eq!(body.get_str("msg").unwrap(), "isdbgrid");
        assert_eq!(body.get_i32("maxWireVersion").unwrap(), 21);
        let h = crate::wire::Header::parse(&out).unwrap();
        assert_eq!((h.request_id, h.response_to), (5, 9));
    }

    #[test]
    fn member_fields_removed_from_op_reply() {
        let doc = member_reply();
        let bytes = encode_reply(5, 9, 8, 0, 0, &[&doc]);
        let frame = Frame::from_bytes(bytes).unwrap();
        let out = rewrite_reply(&frame, DEFAULT_MAX_MESSAGE_SIZE)
            .unwrap()
            .unwrap();
        let r = OpReply::parse(&out).unwrap();
        assert_eq!(r.response_flags, 8);
        let body = r.documents().next().unwrap();
        assert!(body.get("hosts").unwrap().is_none());
    }

    #[test]
    fn standalone_reply_forwarded_untouched() {
        let doc = rawdoc! {"isWritablePrimary": true, "maxWireVersion": 21, "ok": 1.0};
        let frame = Frame::from_bytes(encode_msg_reply(1, 2, &doc)).unwrap();
        assert!(rewrite_reply(&frame, DEFAULT_MAX_MESSAGE_SIZE)
            .unwrap()
            .is_none());
    }

    #[test]
    fn metadata_is_read_and_bounded() {
        let long = "x".repeat(1000);
        let cmd = rawdoc! {"hello": 1, "client": {"application": {"name": long},
        "driver": {"name": "nodejs", "version": "6.8.0"}}};
        let m = ClientMetadata::from_hello(&cmd).unwrap();
        assert_eq!(m.application.unwrap().len(), MAX_METADATA_LEN);
        assert_eq!(m.driver.as_deref(), Some("nodejs 6.8.0"));
        assert!(ClientMetadata::from_hello(&rawdoc! {"hello": 1}).is_none());
    }
}
