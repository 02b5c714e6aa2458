//! Scaffolding for the policy-enforcement ("guard") tests: a proxy started with a policy file
//! and a silent audit sink, assertions on the error a blocked client sees, and a raw wire
//! client that speaks every opcode a bypass attempt may use (OP_MSG with sequences and flags,
//! OP_COMPRESSED, OP_QUERY, legacy OP_INSERT / OP_UPDATE / OP_DELETE) and reads OP_MSG,
//! OP_REPLY and compressed replies.
//!
//! Nothing here changes the behaviour of the helpers in `support/mod.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, Document, RawDocument, RawDocumentBuf};
use futures::StreamExt;
use mongodb::error::{Error as DriverError, ErrorKind};
use mongoguard::app::{Proxy, ProxyHandle};
use mongoguard::config::Config;
use mongoguard::wire::builder::{
    encode_delete, encode_insert, encode_query, encode_update, MsgBuilder,
};
use mongoguard::wire::compression::{compress, Compressor};
use mongoguard::wire::{Message, MessageCodec, MsgFlags, DEFAULT_MAX_MESSAGE_SIZE};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use super::{proxy_upstream_uri, real_upstream, Stack};

/// The code of every error mongoguard answers a blocked command with.
pub const BLOCK_CODE: i32 = 65_001;
/// The codeName paired with [`BLOCK_CODE`].
pub const BLOCK_CODE_NAME: &str = "MongoguardPolicyViolation";
/// How every blocked errmsg starts.
pub const BLOCK_PREFIX: &str = "mongoguard blocked this command: ";

/// Upper bound on one wait for a reply: a safety net against hangs, not a timing assertion.
pub const WIRE_BOUND: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------------------------------
// Policies and stacks
// ------------------------------------------------------------------------------------------

/// A policy file in the temp directory, removed when dropped.
pub struct PolicyFile {
    path: PathBuf,
}

impl PolicyFile {
    /// Writes `toml` to a file name unique to this process and call.
    pub fn write(tag: &str, toml: &str) -> PolicyFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tag: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let path = std::env::temp_dir().join(format!(
            "mongoguard-test-policy-{tag}-{}-{n}.toml",
            std::process::id()
        ));
        std::fs::write(&path, toml)
            .unwrap_or_else(|e| panic!("write policy file {}: {e}", path.display()));
        PolicyFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `extends = "strict"`: W002, W007, W008 and Q002 block.
pub const STRICT: &str = "extends = \"strict\"\n";
/// The standard profile with the global mode set to audit: every block becomes a warning.
pub const STANDARD_AUDIT_MODE: &str = "extends = \"standard\"\nmode = \"audit\"\n";
/// The shipped audit profile.
pub const AUDIT_PROFILE: &str = "extends = \"audit\"\n";

/// A [`Stack`] whose proxy runs a given policy (the built-in `standard` profile when none),
/// with the audit sink set to `none` (violations are only counted).
pub struct GuardStack {
    pub stack: Stack,
    _policy: Option<PolicyFile>,
}

impl std::ops::Deref for GuardStack {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

impl GuardStack {
    /// Shuts the proxy (and stand-in) down, then removes the policy file.
    pub async fn shutdown(self) {
        self.stack.shutdown().await;
    }

    /// Requests the proxy answered or dropped itself because the policy blocked them.
    pub fn blocked(&self) -> u64 {
        self.stack.proxy.stats().blocked.get()
    }

    /// How many commands of this name reached the stand-in (`None` against a real mongod).
    pub fn upstream_count(&self, name: &str) -> Option<u64> {
        self.stack
            .standin
            .as_ref()
            .map(|s| s.stats().command_count(name))
    }

    /// Every message the stand-in received (`None` against a real mongod).
    pub fn upstream_messages(&self) -> Option<u64> {
        self.stack.standin.as_ref().map(|s| s.stats().messages())
    }

    /// Violations of `rule` with this action and mode, as the audit log counted them.
    pub async fn violations(
        &self,
        rule: &str,
        action: mongoguard::audit::Action,
        mode: mongoguard::audit::Mode,
    ) -> u64 {
        let audit = self.stack.proxy.audit();
        audit.flush().await;
        audit.counters().rule_count(rule, action, mode)
    }
}

async fn start_guard_proxy(upstream: &str, policy: Option<&PolicyFile>) -> ProxyHandle {
    let mut cfg = Config::for_upstream(upstream)
        .unwrap_or_else(|e| panic!("mongoguard config for upstream {upstream}: {e:?}"));
    cfg.policy.file = policy.map(|p| p.path().to_path_buf());
    cfg.audit.sink = "none".parse().expect("the none audit sink");
    Proxy::start(Arc::new(cfg))
        .await
        .unwrap_or_else(|e| panic!("start mongoguard in front of {upstream}: {e:?}"))
}

/// A guarded proxy in front of the real mongod named by `MONGOGUARD_TEST_UPSTREAM`, or in front
/// of a fresh stand-in. `policy` is the text of a policy file (`None`: the built-in standard
/// profile).
pub async fn guard_stack(tag: &str, policy: Option<&str>) -> GuardStack {
    match real_upstream() {
        Some(uri) => {
            let file = policy.map(|p| PolicyFile::write(tag, p));
            let proxy = start_guard_proxy(&proxy_upstream_uri(&uri), file.as_ref()).await;
            GuardStack {
                stack: Stack {
                    proxy_uri: format!("mongodb://{}", proxy.local_addr()),
                    proxy,
                    standin: None,
                    direct_uri: uri,
                },
                _policy: file,
            }
        }
        None => guard_standin_stack(tag, policy).await,
    }
}

/// Always a stand-in upstream (the raw bypass tests count what reached it).
pub async fn guard_standin_stack(tag: &str, policy: Option<&str>) -> GuardStack {
    let file = policy.map(|p| PolicyFile::write(tag, p));
    let standin = StandIn::start(StandInConfig::default())
        .await
        .expect("start the mongoguard stand-in");
    let direct_uri = standin.uri();
    let proxy = start_guard_proxy(&direct_uri, file.as_ref()).await;
    GuardStack {
        stack: Stack {
            proxy_uri: format!("mongodb://{}", proxy.local_addr()),
            proxy,
            standin: Some(standin),
            direct_uri,
        },
        _policy: file,
    }
}

// ------------------------------------------------------------------------------------------
// What a blocked client sees
// ------------------------------------------------------------------------------------------

fn field_i64(doc: &Document, key: &str) -> Option<i64> {
    match doc.get(key) {
        Some(Bson::Int32(v)) => Some(i64::from(*v)),
        Some(Bson::Int64(v)) => Some(*v),
        Some(Bson::Double(v)) if v.fract() == 0.0 => Some(*v as i64),
        _ => None,
    }
}

/// Asserts a command reply is mongoguard's block error naming `rule`: `ok: 0`, code 65001,
/// codeName MongoguardPolicyViolation, errmsg naming the rule, no errorLabels.
pub fn assert_block_reply(reply: &Document, rule: &str) {
    assert_eq!(field_i64(reply, "ok"), Some(0), "expected ok: 0 in {reply}");
    assert_eq!(
        field_i64(reply, "code"),
        Some(i64::from(BLOCK_CODE)),
        "expected code {BLOCK_CODE} in {reply}"
    );
    assert_eq!(
        reply.get_str("codeName").ok(),
        Some(BLOCK_CODE_NAME),
        "codeName in {reply}"
    );
    let errmsg = reply
        .get_str("errmsg")
        .unwrap_or_else(|_| panic!("no errmsg in {reply}"));
    assert!(
        errmsg.starts_with(BLOCK_PREFIX),
        "errmsg does not start with {BLOCK_PREFIX:?}: {reply}"
    );
    assert!(
        errmsg.contains(rule),
        "errmsg does not name {rule}: {reply}"
    );
    assert!(
        !reply.contains_key("errorLabels"),
        "a block must carry no errorLabels: {reply}"
    );
}

/// Asserts a reply is a success (`ok: 1`).
pub fn assert_ok_reply(reply: &Document, what: &str) {
    assert_eq!(field_i64(reply, "ok"), Some(1), "{what}: {reply}");
}

/// Asserts a getLastError reply reports the blocked fire-and-forget write of `rule`:
/// `ok: 1`, `err` naming the rule, code 65001.
pub fn assert_last_error_blocked(reply: &Document, rule: &str) {
    assert_eq!(field_i64(reply, "ok"), Some(1), "getLastError: {reply}");
    let err = reply
        .get_str("err")
        .unwrap_or_else(|_| panic!("getLastError has no err string: {reply}"));
    assert!(
        err.starts_with(BLOCK_PREFIX),
        "getLastError err is not mongoguard's: {reply}"
    );
    assert!(
        err.contains(rule),
        "getLastError err does not name {rule}: {reply}"
    );
    assert_eq!(
        field_i64(reply, "code"),
        Some(i64::from(BLOCK_CODE)),
        "getLastError code: {reply}"
    );
}

/// Asserts a driver error is mongoguard's block of `rule` (a command error, code 65001, the
/// rule in the message, no labels) and returns its message.
pub fn assert_driver_blocked(err: &DriverError, rule: &str) -> String {
    match &*err.kind {
        ErrorKind::Command(ce) => {
            assert_eq!(ce.code, BLOCK_CODE, "error code: {err:?}");
            assert_eq!(ce.code_name, BLOCK_CODE_NAME, "codeName: {err:?}");
            assert!(
                ce.message.starts_with(BLOCK_PREFIX),
                "message not mongoguard's: {err:?}"
            );
            assert!(
                ce.message.contains(rule),
                "message does not name {rule}: {err:?}"
            );
            assert!(
                err.labels().is_empty(),
                "a block must carry no error labels: {err:?}"
            );
            ce.message.clone()
        }
        _ => panic!("expected a command error {BLOCK_CODE} naming {rule}, got {err:?}"),
    }
}

// ------------------------------------------------------------------------------------------
// A raw client for every opcode
// ------------------------------------------------------------------------------------------

/// One reply read off the wire (decompressed when it came in OP_COMPRESSED).
#[derive(Debug, Clone)]
pub struct WireReply {
    /// 2013 (OP_MSG) or 1 (OP_REPLY): the opcode inside any compression.
    pub op_code: i32,
    pub response_to: i32,
    /// True when the reply came wrapped in OP_COMPRESSED.
    pub compressed: bool,
    /// OP_MSG flagBits or OP_REPLY responseFlags.
    pub flags: u32,
    /// The OP_MSG body or the OP_REPLY documents.
    pub docs: Vec<Document>,
}

impl WireReply {
    /// The single document of the reply.
    pub fn doc(&self) -> &Document {
        assert_eq!(self.docs.len(), 1, "expected one document: {self:?}");
        &self.docs[0]
    }
}

fn to_doc(raw: &RawDocument) -> Document {
    Document::try_from(raw).expect("reply document decodes")
}

fn decode_reply(bytes: &[u8]) -> WireReply {
    let msg = Message::parse(bytes, DEFAULT_MAX_MESSAGE_SIZE).expect("parse reply");
    let (inner, compressed) = match msg {
        Message::Compressed(c) => (Some(c.decompress().expect("decompress reply")), true),
        _ => (None, false),
    };
    let bytes: &[u8] = match &inner {
        Some(f) => f.bytes(),
        None => bytes,
    };
    let msg = Message::parse(bytes, DEFAULT_MAX_MESSAGE_SIZE).expect("parse inner reply");
    let response_to = i32::from_le_bytes(bytes[8..12].try_into().unwrap());
    match msg {
        Message::Msg(m) => WireReply {
            op_code: 2013,
            response_to,
            compressed,
            flags: m.flags().0,
            docs: vec![to_doc(m.body())],
        },
        Message::Reply(r) => WireReply {
            op_code: 1,
            response_to,
            compressed,
            flags: u32::from_le_bytes(bytes[16..20].try_into().unwrap()),
            docs: r.documents().map(to_doc).collect(),
        },
        other => panic!("the proxy answered with opCode {:?}", other.op_code()),
    }
}

/// A raw connection to the proxy.
pub struct WireConn {
    read: FramedRead<OwnedReadHalf, MessageCodec>,
    write: OwnedWriteHalf,
    next_id: i32,
}

impl WireConn {
    pub async fn connect(addr: std::net::SocketAddr) -> WireConn {
        let s = TcpStream::connect(addr)
            .await
            .expect("TCP connect to the proxy");
        s.set_nodelay(true).expect("nodelay");
        let (r, w) = s.into_split();
        WireConn {
            read: FramedRead::new(r, MessageCodec::default()),
            write: w,
            next_id: 100,
        }
    }

    /// Connects and says hello (OP_MSG), offering `compressors`; returns the hello reply.
    pub async fn connect_hello(
        addr: std::net::SocketAddr,
        compressors: &[&str],
    ) -> (WireConn, Document) {
        let mut c = WireConn::connect(addr).await;
        let mut arr = bson::RawArrayBuf::new();
        for c in compressors {
            arr.push(*c);
        }
        let hello = bson::rawdoc! {
            "hello": 1,
            // mongod requires driver.name, driver.version and os.type (code 183 otherwise).
            "client": { "application": { "name": "mongoguard-guard-test" },
                        "driver": { "name": "mongoguard-tests", "version": "0" },
                        "os": { "type": std::env::consts::OS } },
            "compression": arr,
            "$db": "admin",
        };
        let reply = c.msg(hello).await;
        assert_ok_reply(&reply, "hello through the proxy");
        (c, reply)
    }

    /// A fresh requestID.
    pub fn id(&mut self) -> i32 {
        self.next_id += 1;
        self.next_id
    }

    /// Writes bytes as they are.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.write
            .write_all(bytes)
            .await
            .expect("send to the proxy");
    }

    /// The next message from the proxy, or `None` when it closed the connection.
    pub async fn recv(&mut self) -> Option<WireReply> {
        match tokio::time::timeout(WIRE_BOUND, self.read.next()).await {
            Ok(Some(Ok(frame))) => Some(decode_reply(frame.bytes())),
            Ok(_) => None,
            Err(_) => panic!("no reply and no close within {WIRE_BOUND:?}: the proxy hung"),
        }
    }

    /// Sends `bytes` (a request with this requestID) and returns the reply answering it.
    pub async fn round_trip(&mut self, id: i32, bytes: &[u8]) -> WireReply {
        self.send(bytes).await;
        let reply = self
            .recv()
            .await
            .expect("the proxy closed the connection instead of replying");
        assert_eq!(
            reply.response_to, id,
            "reply answers another request: {reply:?}"
        );
        reply
    }

    /// An OP_MSG round trip; the reply must be an OP_MSG without moreToCome.
    pub async fn msg_with(&mut self, builder: MsgBuilder) -> Document {
        let id = self.id();
        let reply = self.round_trip(id, &builder.encode(id, 0)).await;
        assert_eq!(reply.op_code, 2013, "OP_MSG answered with {reply:?}");
        assert_eq!(reply.flags & MsgFlags::MORE_TO_COME, 0, "{reply:?}");
        reply.doc().clone()
    }

    /// An OP_MSG with a body only.
    pub async fn msg(&mut self, body: RawDocumentBuf) -> Document {
        self.msg_with(MsgBuilder::new(body)).await
    }

    /// An OP_MSG sent inside OP_COMPRESSED; returns the reply (OP_MSG inside any compression).
    pub async fn msg_compressed(&mut self, builder: MsgBuilder, c: Compressor) -> WireReply {
        let id = self.id();
        let plain = builder.encode(id, 0);
        let packed = compress(&plain, c).expect("compress");
        let reply = self.round_trip(id, &packed).await;
        assert_eq!(reply.op_code, 2013, "OP_MSG answered with {reply:?}");
        reply
    }

    /// An OP_MSG with moreToCome: no reply is read.
    pub async fn msg_more_to_come(&mut self, builder: MsgBuilder) {
        let id = self.id();
        let bytes = builder.flags(MsgFlags::MORE_TO_COME).encode(id, 0);
        self.send(&bytes).await;
    }

    /// A command through OP_QUERY on `db.$cmd`; the reply must be an OP_REPLY.
    pub async fn query_cmd(&mut self, db: &str, cmd: &RawDocument) -> Document {
        let id = self.id();
        let bytes = encode_query(id, 0, &format!("{db}.$cmd"), 0, -1, cmd, None);
        let reply = self.round_trip(id, &bytes).await;
        assert_eq!(reply.op_code, 1, "OP_QUERY answered with {reply:?}");
        reply.doc().clone()
    }

    /// Legacy OP_INSERT (no reply).
    pub async fn legacy_insert(&mut self, ns: &str, docs: &[&RawDocument]) {
        let id = self.id();
        self.send(&encode_insert(id, 0, ns, docs)).await;
    }

    /// Legacy OP_UPDATE (no reply).
    pub async fn legacy_update(
        &mut self,
        ns: &str,
        flags: i32,
        selector: &RawDocument,
        update: &RawDocument,
    ) {
        let id = self.id();
        self.send(&encode_update(id, ns, flags, selector, update))
            .await;
    }

    /// Legacy OP_DELETE (no reply).
    pub async fn legacy_delete(&mut self, ns: &str, flags: i32, selector: &RawDocument) {
        let id = self.id();
        self.send(&encode_delete(id, ns, flags, selector)).await;
    }

    /// getLastError through OP_QUERY on `db.$cmd`, as legacy drivers ask it.
    pub async fn get_last_error(&mut self, db: &str) -> Document {
        self.query_cmd(db, &bson::rawdoc! {"getLastError": 1}).await
    }

    /// A ping on this connection must succeed.
    pub async fn ping(&mut self) {
        let reply = self.msg(bson::rawdoc! {"ping": 1, "$db": "admin"}).await;
        assert_ok_reply(&reply, "ping on the same connection");
    }

    /// Expects the proxy to close the connection (EOF or reset) without replying.
    pub async fn expect_closed(&mut self) {
        if let Some(reply) = self.recv().await {
            panic!("expected the connection to close, got {reply:?}");
        }
    }
}
