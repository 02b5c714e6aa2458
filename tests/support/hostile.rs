//! Helpers for the resilience tests (tests/resilience_*.rs): raw clients that misbehave
//! (never read, send half a header, trickle bytes, send compression bombs), a proxy
//! configured from TOML text (so that the configuration keys these tests introduced are set
//! by name, and the tests compiled before the keys existed), the mongoguard binary as a child
//! process with its stderr captured, and a tiny fake upstream that answers what a test tells
//! it to.
//!
//! Included with `#[path = "support/hostile.rs"] mod hostile;` (tests/support/mod.rs is shared
//! with other suites and is left alone).
//!
//! Every wait is bounded: a proxy that hangs fails the test instead of hanging it.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bson::{doc, Bson, Document};
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
    wire::{compression::compress, Compressor, OpMsg},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
};

pub const OP_MSG: i32 = 2013;
pub const OP_COMPRESSED: i32 = 2012;

/// mongoguard's memory-budget refusal: not a code drivers retry (docs/protocol.md).
pub const MEMORY_BUDGET_CODE: i32 = 65003;
pub const MEMORY_BUDGET_CODE_NAME: &str = "MongoguardMemoryBudget";
/// BadValue, as mongod answers a malformed `lsid` (src/mongo/db/logical_session_id.idl: `id`
/// is a `uuid`; a non-UUID is refused while parsing the command's generic arguments).
pub const BAD_VALUE: i32 = 2;
/// NotWritablePrimary (src/mongo/base/error_codes.yml).
pub const NOT_WRITABLE_PRIMARY: i32 = 10107;

/// The `[proxy]` keys these tests introduced. With `RESILIENCE_STRIP_NEW_KEYS=1` in the
/// environment, [`config_from_toml`] drops lines setting them, to observe how the current code
/// behaves without them (a diagnostic: the tests are meant to run without it).
pub const NEW_KEYS: [&str; 4] = [
    "client_write_timeout",
    "client_read_timeout",
    "memory_budget",
    "memory_budget_wait",
];

/// Parses a whole mongoguard configuration from TOML text. Fails the test (with the parser's
/// message, e.g. "unknown field `client_write_timeout`") when a key does not exist.
pub fn config_from_toml(text: &str) -> Config {
    let text = if std::env::var_os("RESILIENCE_STRIP_NEW_KEYS").is_some() {
        text.lines()
            .filter(|l| {
                let key = l.split('=').next().unwrap_or("").trim();
                !NEW_KEYS.contains(&key)
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        text.to_owned()
    };
    Config::from_toml_str(&text, "resilience test")
        .unwrap_or_else(|e| panic!("configuration refused: {e}\n--- config ---\n{text}"))
}

/// A proxy started from TOML text; violation records are counted, not printed.
pub async fn proxy_from_toml(text: &str) -> ProxyHandle {
    let mut cfg = config_from_toml(text);
    cfg.audit.sink = mongoguard::audit::SinkSpec::None;
    Proxy::start(Arc::new(cfg))
        .await
        .unwrap_or_else(|e| panic!("start mongoguard: {e:?}"))
}

/// Polls `check` every 20 ms until it holds or `bound` passes; true if it held.
pub async fn within(bound: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One OP_MSG frame with a single body section.
pub fn op_msg(request_id: i32, flags: u32, body: &Document) -> Vec<u8> {
    op_msg_raw(request_id, flags, &body.to_vec().expect("encode BSON body"))
}

/// One OP_MSG frame whose body is the given BSON bytes, unchecked (repeated keys allowed).
pub fn op_msg_raw(request_id: i32, flags: u32, body: &[u8]) -> Vec<u8> {
    let len = 16 + 4 + 1 + body.len();
    let mut frame = Vec::with_capacity(len);
    frame.extend_from_slice(&i32::try_from(len).expect("frame size").to_le_bytes());
    frame.extend_from_slice(&request_id.to_le_bytes());
    frame.extend_from_slice(&0i32.to_le_bytes());
    frame.extend_from_slice(&OP_MSG.to_le_bytes());
    frame.extend_from_slice(&flags.to_le_bytes());
    frame.push(0);
    frame.extend_from_slice(body);
    frame
}

/// BSON bytes of a document with these fields in this order, repeats included (a `Document`
/// cannot hold a repeated key; mongod's parser sees every one).
pub fn raw_body(fields: &[(&str, Bson)]) -> Vec<u8> {
    let mut elements = Vec::new();
    for (key, value) in fields {
        let mut one = Document::new();
        one.insert(*key, value.clone());
        let bytes = one.to_vec().expect("encode one field");
        // Strip the 4-byte length and the trailing NUL: what is left is the element.
        elements.extend_from_slice(&bytes[4..bytes.len() - 1]);
    }
    let len = i32::try_from(4 + elements.len() + 1).expect("document size");
    let mut out = Vec::with_capacity(elements.len() + 5);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&elements);
    out.push(0);
    out
}

/// Sets the requestID of a frame (any opcode: it is in the standard header).
pub fn set_request_id(frame: &mut [u8], request_id: i32) {
    frame[4..8].copy_from_slice(&request_id.to_le_bytes());
}

/// An OP_MSG reply frame (for the fake upstream).
pub fn op_msg_reply(request_id: i32, response_to: i32, body: &Document) -> Vec<u8> {
    let mut frame = op_msg(request_id, 0, body);
    frame[8..12].copy_from_slice(&response_to.to_le_bytes());
    frame
}

/// `frame` wrapped in OP_COMPRESSED. zlib is done here at the fastest level (mongoguard's
/// `compress` uses the default level, which takes seconds on 16 MB in a debug build).
pub fn compressed(frame: &[u8], compressor: Compressor) -> Vec<u8> {
    if compressor != Compressor::Zlib {
        return compress(frame, compressor)
            .expect("compress a test frame")
            .to_vec();
    }
    use std::io::Write;
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&frame[16..]).expect("zlib");
    let data = enc.finish().expect("zlib");
    let total = 16 + 9 + data.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&i32::try_from(total).expect("size").to_le_bytes());
    out.extend_from_slice(&frame[4..12]); // requestID, responseTo
    out.extend_from_slice(&OP_COMPRESSED.to_le_bytes());
    out.extend_from_slice(&frame[12..16]); // originalOpcode
    out.extend_from_slice(&i32::try_from(frame.len() - 16).expect("size").to_le_bytes());
    out.push(Compressor::Zlib.id());
    out.extend_from_slice(&data);
    out
}

/// A compression bomb: an OP_COMPRESSED whose decompressed form is a valid OP_MSG `ping` of
/// `size` bytes (one long run of 'a' in a padding field), so the compressed form is tiny.
pub fn bomb(request_id: i32, size: usize, compressor: Compressor) -> Vec<u8> {
    bomb_of(
        doc! { "ping": 1, "$db": "admin" },
        request_id,
        size,
        compressor,
    )
}

/// Like [`bomb`] with another command: `base` plus a `pad` field of 'a's, `size` bytes of
/// frame in all.
pub fn bomb_of(base: Document, request_id: i32, size: usize, compressor: Compressor) -> Vec<u8> {
    let fixed = op_msg(request_id, 0, &base).len() + 16;
    let mut body = base;
    body.insert("pad", "a".repeat(size.saturating_sub(fixed)));
    compressed(&op_msg(request_id, 0, &body), compressor)
}

/// The body of an OP_MSG frame (header included), decompressed first if it is an
/// OP_COMPRESSED (replies use the request's compressor).
pub fn body_of(frame: &[u8]) -> Document {
    let op = i32::from_le_bytes([frame[12], frame[13], frame[14], frame[15]]);
    if op == OP_COMPRESSED {
        let inner = mongoguard::wire::OpCompressed::parse(frame, 48_000_000)
            .and_then(|c| c.decompress())
            .unwrap_or_else(|e| panic!("reply is a bad OP_COMPRESSED: {e}"));
        return body_of(inner.bytes());
    }
    let msg = OpMsg::parse(frame).unwrap_or_else(|e| panic!("reply is not an OP_MSG: {e}"));
    Document::from_reader(msg.body().as_bytes()).expect("reply body BSON")
}

/// A numeric field of any BSON numeric type, as i64 (`None` when absent or not a number).
pub fn num(doc: &Document, key: &str) -> Option<i64> {
    match doc.get(key) {
        Some(Bson::Int32(v)) => Some(i64::from(*v)),
        Some(Bson::Int64(v)) => Some(*v),
        Some(Bson::Double(v)) if v.fract() == 0.0 => Some(*v as i64),
        _ => None,
    }
}

/// Reads one whole frame (header included) within `bound`.
pub async fn read_frame(stream: &mut TcpStream, bound: Duration) -> Result<Vec<u8>, String> {
    let work = async {
        let mut header = [0u8; 16];
        stream
            .read_exact(&mut header)
            .await
            .map_err(|e| format!("connection closed before a reply header: {e}"))?;
        let len = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if !(16..=48_000_000).contains(&len) {
            return Err(format!("implausible messageLength {len}"));
        }
        let mut frame = vec![0u8; len as usize];
        frame[..16].copy_from_slice(&header);
        stream
            .read_exact(&mut frame[16..])
            .await
            .map_err(|e| format!("connection closed inside a reply: {e}"))?;
        Ok(frame)
    };
    tokio::time::timeout(bound, work)
        .await
        .map_err(|_| format!("no reply within {bound:?}"))?
}

/// Reads and discards until the peer closes (EOF or reset) within `bound`. Returns the bytes
/// read, or an error saying the connection was still open at the bound.
pub async fn closed_within(stream: &mut TcpStream, bound: Duration) -> Result<u64, String> {
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let work = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n as u64,
            }
        }
    };
    tokio::time::timeout(bound, work)
        .await
        .map_err(|_| format!("the connection was still open after {bound:?}"))
}

/// A raw client: one TCP connection, frames written by hand.
pub struct RawClient {
    pub stream: TcpStream,
    next_id: i32,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> RawClient {
        let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
            .await
            .expect("TCP connect within 10 s")
            .expect("TCP connect");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        RawClient { stream, next_id: 1 }
    }

    /// A connection with a tiny receive buffer, for clients that do not read: the proxy's
    /// send then blocks after a few kilobytes instead of the kernel's autotuned megabytes.
    pub async fn connect_small_window(addr: SocketAddr) -> RawClient {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let stream = tokio::time::timeout(Duration::from_secs(10), socket.connect(addr))
            .await
            .expect("TCP connect within 10 s")
            .expect("TCP connect");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        RawClient { stream, next_id: 1 }
    }

    pub fn next_id(&mut self) -> i32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Sends one command; returns its requestID.
    pub async fn send(&mut self, body: &Document) -> i32 {
        let id = self.next_id();
        let frame = op_msg(id, 0, body);
        self.stream.write_all(&frame).await.expect("send a command");
        id
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Sends a command and reads its reply body within `bound`.
    pub async fn command(&mut self, body: Document, bound: Duration) -> Result<Document, String> {
        let id = self.next_id();
        let frame = op_msg(id, 0, &body);
        tokio::time::timeout(bound, self.stream.write_all(&frame))
            .await
            .map_err(|_| format!("could not send within {bound:?}"))?
            .map_err(|e| format!("send failed: {e}"))?;
        let reply = read_frame(&mut self.stream, bound).await?;
        let response_to = i32::from_le_bytes([reply[8], reply[9], reply[10], reply[11]]);
        if response_to != id {
            return Err(format!("reply answers {response_to}, not {id}"));
        }
        let op = i32::from_le_bytes([reply[12], reply[13], reply[14], reply[15]]);
        if op != OP_MSG {
            return Err(format!("reply opCode {op}"));
        }
        Ok(body_of(&reply))
    }

    /// A `ping` answered `ok: 1` within `bound`.
    pub async fn ping(&mut self, bound: Duration) -> Result<(), String> {
        let reply = self
            .command(doc! {"ping": 1, "$db": "admin"}, bound)
            .await?;
        match num(&reply, "ok") {
            Some(1) => Ok(()),
            _ => Err(format!("ping answered {reply}")),
        }
    }

    /// A `hello` answered `ok: 1` within `bound` (allowed before authentication).
    pub async fn hello(&mut self, bound: Duration) -> Result<Document, String> {
        let reply = self
            .command(doc! {"hello": 1, "$db": "admin"}, bound)
            .await?;
        match num(&reply, "ok") {
            Some(1) => Ok(reply),
            _ => Err(format!("hello answered {reply}")),
        }
    }
}

/// A UUID-shaped `lsid` (binary subtype 4, 16 bytes) from a number.
pub fn lsid(n: u64) -> Document {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    bytes[8..].copy_from_slice(&0x6d67_6174_7461_636bu64.to_le_bytes());
    doc! { "id": Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: bytes.to_vec(),
    }) }
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mongoguard-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// The mongoguard binary running as a child, its stderr captured line by line.
pub struct Binary {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Binary {
    /// Starts `mongoguard --config FILE --log-format json` and waits (up to 20 s) for its
    /// "mongoguard listening" line to learn the port.
    pub fn start(config_file: &Path) -> Binary {
        Binary::start_from(Command::new(env!("CARGO_BIN_EXE_mongoguard")), config_file)
    }

    /// [`Binary::start`] with at most `nofile` file descriptors (through prlimit(1), which
    /// execs it: the child is mongoguard itself). `None` when prlimit is not installed.
    pub fn start_with_nofile(config_file: &Path, nofile: u32) -> Option<Binary> {
        let found = Command::new("prlimit")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return None;
        }
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={nofile}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_mongoguard"));
        Some(Binary::start_from(cmd, config_file))
    }

    fn start_from(mut command: Command, config_file: &Path) -> Binary {
        let mut child = command
            .arg("--config")
            .arg(config_file)
            .args(["--log-format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mongoguard");
        let stderr = child.stderr.take().expect("stderr pipe");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut sent = false;
            loop {
                // Lines are read as bytes: a client string in a log line need not be UTF-8.
                let mut raw = Vec::new();
                match reader.read_until(b'\n', &mut raw) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let line = String::from_utf8_lossy(&raw).into_owned();
                if !sent {
                    if let Some(addr) = listen_addr(&line) {
                        let _ = tx.send(addr);
                        sent = true;
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "mongoguard did not say where it listens; stderr:\n{}",
                    lines.lock().unwrap().join("")
                );
            }
        };
        Binary {
            child,
            addr,
            stderr: lines,
            reader: Some(reader),
        }
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends `signal` (e.g. "HUP", "TERM") with kill(1).
    pub fn signal(&self, signal: &str) {
        send_signal(&self.child, signal);
    }

    /// The exit status if the process ends within `bound`.
    pub fn exited_within(&mut self, bound: Duration) -> Option<ExitStatus> {
        exit_within(&mut self.child, bound)
    }

    /// SIGTERM, then the process must end within 10 s with status 0 (`after`: what came
    /// before, for the message).
    pub fn stops_cleanly_on_sigterm(&mut self, after: &str) {
        self.signal("TERM");
        let status = self
            .exited_within(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{after}: mongoguard did not exit within 10 s of SIGTERM"));
        assert!(
            status.success(),
            "{after}: exit status after SIGTERM: {status}"
        );
    }

    /// Every stderr line, once the process has exited and its stderr reached EOF.
    pub fn all_stderr_lines(&mut self) -> Vec<String> {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.stderr.lock().unwrap().clone()
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("")
    }
}

/// Sends `signal` (e.g. "HUP", "TERM") to `child` with kill(1).
pub fn send_signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} failed");
}

/// The exit status if `child` ends within `bound`.
pub fn exit_within(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listen_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("mongoguard listening") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    v.get("listen")?.as_str()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// A fake upstream.

/// What the fake upstream answers to a command other than hello/isMaster. An answer holding
/// `{CLOSE_INSTEAD: true}` makes it close the connection without replying (a dying upstream).
pub type Answer = Arc<dyn Fn(&str, &Document) -> Document + Send + Sync>;

/// The key of an [`Answer`] that closes the connection instead of replying.
pub const CLOSE_INSTEAD: &str = "$fakeCloseInstead";

/// A one-member replica-set "primary" on a loopback port: hello/isMaster say it is the
/// writable primary of `set_name`; every other command is answered by `answer(name, body)`.
/// OP_MSG only (mongoguard speaks OP_MSG to its upstreams).
pub struct FakeUpstream {
    pub addr: SocketAddr,
    /// TCP connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    /// Commands other than hello answered so far.
    pub commands: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeUpstream {
    pub async fn start(set_name: &str, answer: Answer) -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake");
        let addr = listener.local_addr().expect("fake addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let commands = Arc::new(AtomicUsize::new(0));
        let (acc, cmds) = (accepted.clone(), commands.clone());
        let set_name = set_name.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                acc.fetch_add(1, Ordering::Relaxed);
                let (answer, cmds, set_name) = (answer.clone(), cmds.clone(), set_name.clone());
                tokio::spawn(serve_fake(stream, addr, set_name, answer, cmds));
            }
        });
        FakeUpstream {
            addr,
            accepted,
            commands,
            task,
        }
    }

    pub fn uri(&self, set_name: &str) -> String {
        format!("mongodb://{}/?replicaSet={set_name}", self.addr)
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The fake primary's electionId (mongod's form: 0x7fffffff, then the term).
const ELECTION_ID: [u8; 12] = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1];

async fn serve_fake(
    stream: TcpStream,
    me: SocketAddr,
    set_name: String,
    answer: Answer,
    commands: Arc<AtomicUsize>,
) {
    serve_op_msg(stream, 1_000_000, |name, body| {
        let reply = match name {
            "hello" | "isMaster" | "ismaster" => primary_hello(&set_name, me, 21),
            _ => {
                commands.fetch_add(1, Ordering::Relaxed);
                answer(name, body)
            }
        };
        (!reply.contains_key(CLOSE_INSTEAD)).then_some(reply)
    })
    .await
}

/// Serves OP_MSG commands on `stream` until it closes: `answer(name, body)` is each reply
/// (`None`: close the connection instead of replying). Another opcode or an unreadable
/// message closes it too. Reply ids count up from `first_reply_id`.
pub async fn serve_op_msg(
    mut stream: TcpStream,
    first_reply_id: i32,
    mut answer: impl FnMut(&str, &Document) -> Option<Document>,
) {
    let mut reply_id = first_reply_id;
    loop {
        let Ok(frame) = read_frame(&mut stream, Duration::from_secs(3600)).await else {
            return;
        };
        let request_id = i32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let op = i32::from_le_bytes([frame[12], frame[13], frame[14], frame[15]]);
        if op != OP_MSG {
            return;
        }
        let Ok(msg) = OpMsg::parse(&frame) else {
            return;
        };
        let Ok(body) = Document::from_reader(msg.body().as_bytes()) else {
            return;
        };
        let name = body.keys().next().cloned().unwrap_or_default();
        let Some(reply) = answer(&name, &body) else {
            return;
        };
        reply_id += 1;
        if stream
            .write_all(&op_msg_reply(reply_id, request_id, &reply))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The hello reply of the primary `me` of a one-member replica set `set` at wire version
/// `max_wire` (mongod's fields; the electionId is mongod's form: 0x7fffffff, then the term).
pub fn primary_hello(set: &str, me: SocketAddr, max_wire: i32) -> Document {
    doc! {
        "isWritablePrimary": true,
        "ismaster": true,
        "helloOk": true,
        "setName": set,
        "setVersion": 1,
        "hosts": [me.to_string()],
        "primary": me.to_string(),
        "me": me.to_string(),
        "electionId": bson::oid::ObjectId::from_bytes(ELECTION_ID),
        "maxBsonObjectSize": 16 * 1024 * 1024,
        "maxMessageSizeBytes": 48_000_000,
        "maxWriteBatchSize": 100_000,
        "localTime": bson::DateTime::now(),
        "logicalSessionTimeoutMinutes": 30,
        "connectionId": 1,
        "minWireVersion": 0,
        "maxWireVersion": max_wire,
        "readOnly": false,
        "ok": 1.0,
    }
}
