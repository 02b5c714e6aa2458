//! Minimal MongoDB wire protocol client: OP_MSG framing over one TCP stream.
//!
//! Only what the load generator needs: encode a command as an OP_MSG with a
//! kind-0 section (and at most one kind-1 document sequence, as drivers send
//! bulk writes), optionally wrap it in OP_COMPRESSED, read exactly one reply
//! frame (OP_MSG or OP_COMPRESSED), and inspect `ok`. A target can be reached
//! over TLS ([`Endpoint`] with a [`TlsClient`]).

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bson::{Document, RawDocument};
use mongoguard::wire::compression::{self, Compressor, OpCompressed};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::{
    self,
    client::Resumption,
    pki_types::{pem::PemObject, CertificateDer, ServerName},
    RootCertStore,
};

pub const OP_MSG: i32 = 2013;
pub const OP_COMPRESSED: i32 = 2012;
const HEADER_LEN: usize = 16;
/// The server's default maxMessageSizeBytes; larger frames are rejected.
const MAX_MESSAGE_LEN: usize = 48_000_000;
const FLAG_CHECKSUM_PRESENT: u32 = 1;

/// Why a request failed.
#[derive(Debug)]
pub enum WireError {
    /// Transport failure (connect, read, write, timeout): the connection is dead.
    Io(std::io::Error),
    /// Malformed reply frame: the connection can no longer be trusted.
    Protocol(String),
    /// A well-formed reply that reports a failure (`ok` != 1 or write errors).
    Command(String),
}

impl WireError {
    /// True when the connection must be dropped and re-established.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, WireError::Command(_))
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Io(e) => write!(f, "i/o: {e}"),
            WireError::Protocol(m) => write!(f, "protocol: {m}"),
            WireError::Command(m) => write!(f, "command failed: {m}"),
        }
    }
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        WireError::Io(e)
    }
}

/// A pre-encoded OP_MSG body (flagBits + kind-0 section), ready to be framed.
#[derive(Clone)]
pub struct Body(Vec<u8>);

impl Body {
    /// Encode a command document as an OP_MSG payload (flags 0, one kind-0 section).
    pub fn encode(cmd: &Document) -> Result<Body, WireError> {
        let doc = cmd
            .to_vec()
            .map_err(|e| WireError::Protocol(format!("encode: {e}")))?;
        let mut out = Vec::with_capacity(5 + doc.len());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.push(0);
        out.extend_from_slice(&doc);
        Ok(Body(out))
    }

    /// Encode a command with one kind-1 document sequence `ident` holding `docs` (as drivers
    /// send `insert` / `update` / `delete` batches): flags 0, the kind-0 body, then the
    /// sequence. The command must not hold a field named `ident` itself.
    pub fn encode_with_sequence(
        cmd: &Document,
        ident: &str,
        docs: &[Document],
    ) -> Result<Body, WireError> {
        let mut out = Body::encode(cmd)?.0;
        out.push(1);
        let size_at = out.len();
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(ident.as_bytes());
        out.push(0);
        for d in docs {
            d.to_writer(&mut out)
                .map_err(|e| WireError::Protocol(format!("encode: {e}")))?;
        }
        let size = i32::try_from(out.len() - size_at)
            .map_err(|_| WireError::Protocol("document sequence too large".into()))?;
        out[size_at..size_at + 4].copy_from_slice(&size.to_le_bytes());
        Ok(Body(out))
    }

    /// Offsets of every occurrence of the int64 `marker` (little endian) in the payload,
    /// for [`Body::patch_i64`].
    pub fn marker_offsets(&self, marker: i64) -> Vec<usize> {
        let needle = marker.to_le_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i + needle.len() <= self.0.len() {
            if self.0[i..i + needle.len()] == needle {
                out.push(i);
                i += needle.len();
            } else {
                i += 1;
            }
        }
        out
    }

    /// A body whose command has an int64 field holding `marker`, which can be
    /// overwritten in place later (see [`Body::patch_i64`]). Returns the offset.
    pub fn encode_patchable(cmd: &Document, marker: i64) -> Result<(Body, usize), WireError> {
        let body = Body::encode(cmd)?;
        let needle = marker.to_le_bytes();
        let pos = body
            .0
            .windows(needle.len())
            .position(|w| w == needle)
            .ok_or_else(|| WireError::Protocol("marker not found in template".into()))?;
        Ok((body, pos))
    }

    /// The encoded payload: everything after the 16-byte message header.
    pub fn payload(&self) -> &[u8] {
        &self.0
    }

    pub fn patch_i64(&mut self, offset: usize, value: i64) {
        self.0[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    }
}

/// TLS toward a target: the CA that signs its certificate and the name to check.
#[derive(Clone)]
pub struct TlsClient {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl TlsClient {
    /// Trust the PEM certificates in `ca_file`; check the certificate against `host` (a DNS
    /// name or an IP address, which then needs an IP SAN). Session resumption is off unless
    /// `resume`: every connection then pays a full handshake (see bench/README.md).
    pub fn new(ca_file: &Path, host: &str, resume: bool) -> anyhow::Result<TlsClient> {
        let pem = std::fs::read(ca_file)
            .map_err(|e| anyhow::anyhow!("--tls-ca {}: {e}", ca_file.display()))?;
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&pem) {
            let c = c.map_err(|e| anyhow::anyhow!("--tls-ca {}: {e}", ca_file.display()))?;
            roots.add(c)?;
        }
        anyhow::ensure!(
            !roots.is_empty(),
            "--tls-ca {}: no certificate in it",
            ca_file.display()
        );
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        if !resume {
            config.resumption = Resumption::disabled();
        }
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| anyhow::anyhow!("TLS server name {host:?}: {e}"))?;
        Ok(TlsClient {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        })
    }
}

/// Where to connect: HOST:PORT, plain TCP or TLS.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: String,
    pub tls: Option<TlsClient>,
}

impl Endpoint {
    pub fn plain(addr: &str) -> Endpoint {
        Endpoint {
            addr: addr.to_string(),
            tls: None,
        }
    }
}

/// The byte stream of a connection: plain TCP or TLS over TCP (mongoguard's own `Either`).
type Stream = mongoguard::net::Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// One client connection to a MongoDB-speaking peer.
pub struct Conn {
    stream: BufReader<Stream>,
    next_id: i32,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    /// Requests go out as OP_COMPRESSED with this compressor (set once hello agreed to it).
    compressor: Option<Compressor>,
    /// Replies to compressed requests, and how many of them came as OP_COMPRESSED.
    replies: u64,
    compressed_replies: u64,
}

/// Whether a hello reply's `compression` array agrees to `c`.
pub fn hello_agrees(reply: &RawDocument, c: Compressor) -> bool {
    match reply.get_array("compression") {
        Ok(a) => a
            .into_iter()
            .flatten()
            .any(|v| v.as_str() == Some(c.name())),
        Err(_) => false,
    }
}

/// The error of a server whose hello did not agree to the requested compressor.
pub fn not_agreed(c: Compressor) -> WireError {
    WireError::Protocol(format!(
        "--compress {}: the server's hello did not agree to it",
        c.name()
    ))
}

impl Conn {
    /// Connect with TCP_NODELAY and send `hello` (whose reply must be ok).
    pub async fn connect(ep: &Endpoint, timeout: Duration) -> Result<Conn, WireError> {
        Conn::connect_with(ep, timeout, None).await
    }

    /// Like [`Conn::connect`]; with `compress`, hello offers `compression: [name]`, the reply
    /// must agree, and every later request is sent compressed (over TCP or TLS alike).
    pub async fn connect_with(
        ep: &Endpoint,
        timeout: Duration,
        compress: Option<Compressor>,
    ) -> Result<Conn, WireError> {
        let mut conn = Conn::open(ep, timeout).await?;
        let mut hello = bson::doc! { "hello": 1 };
        if let Some(c) = compress {
            hello.insert("compression", vec![c.name()]);
        }
        hello.insert("$db", "admin");
        let hello = Body::encode(&hello)?;
        let reply = tokio::time::timeout(timeout, conn.request_doc(&hello))
            .await
            .map_err(|_| {
                WireError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "hello timed out",
                ))
            })??;
        if let Some(c) = compress {
            if !hello_agrees(reply, c) {
                return Err(not_agreed(c));
            }
            conn.set_compressor(Some(c));
        }
        Ok(conn)
    }

    /// Compress every later request with `c` (after hello agreed to it; hello and the SASL
    /// commands themselves are never compressed).
    pub fn set_compressor(&mut self, c: Option<Compressor>) {
        self.compressor = c;
    }

    /// (replies to compressed requests, those of them that came as OP_COMPRESSED) so far.
    pub fn reply_counts(&self) -> (u64, u64) {
        (self.replies, self.compressed_replies)
    }

    /// Open the TCP connection (TCP_NODELAY) and, for a TLS endpoint, run the TLS
    /// handshake (both within `timeout` each), without sending anything else.
    pub async fn open(ep: &Endpoint, timeout: Duration) -> Result<Conn, WireError> {
        let addr = &ep.addr;
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                WireError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connect to {addr} timed out"),
                ))
            })??;
        stream.set_nodelay(true)?;
        let stream = match &ep.tls {
            None => Stream::Plain(stream),
            Some(t) => {
                let tls =
                    tokio::time::timeout(timeout, t.connector.connect(t.name.clone(), stream))
                        .await
                        .map_err(|_| {
                            WireError::Io(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!("TLS handshake with {addr} timed out"),
                            ))
                        })??;
                Stream::Tls(Box::new(tls))
            }
        };
        Ok(Conn {
            stream: BufReader::with_capacity(64 * 1024, stream),
            next_id: 1,
            out: Vec::with_capacity(4096),
            inbuf: Vec::with_capacity(64 * 1024),
            compressor: None,
            replies: 0,
            compressed_replies: 0,
        })
    }

    /// Send one request and wait for its reply. Ok means the reply said `ok: 1`
    /// and carried no `writeErrors` / `writeConcernError`.
    pub async fn request(&mut self, body: &Body) -> Result<(), WireError> {
        self.send(body).await.map(|_| ())
    }

    /// Like [`Conn::request`], and returns the reply's command document.
    pub async fn request_doc(&mut self, body: &Body) -> Result<&RawDocument, WireError> {
        self.send(body).await
    }

    async fn send(&mut self, body: &Body) -> Result<&RawDocument, WireError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let len = i32::try_from(HEADER_LEN + body.payload().len())
            .map_err(|_| WireError::Protocol("request too large".into()))?;
        self.out.clear();
        self.out.extend_from_slice(&len.to_le_bytes());
        self.out.extend_from_slice(&id.to_le_bytes());
        self.out.extend_from_slice(&0i32.to_le_bytes());
        self.out.extend_from_slice(&OP_MSG.to_le_bytes());
        self.out.extend_from_slice(body.payload());
        match self.compressor {
            None => self.stream.get_mut().write_all(&self.out).await?,
            Some(c) => {
                let packed = compression::compress(&self.out, c)
                    .map_err(|e| WireError::Protocol(format!("compress: {e}")))?;
                self.stream.get_mut().write_all(&packed).await?;
            }
        }
        // TLS: push the records out (a no-op on plain TCP).
        self.stream.get_mut().flush().await?;
        self.read_reply(id).await
    }

    async fn read_reply(&mut self, request_id: i32) -> Result<&RawDocument, WireError> {
        let mut header = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut header).await?;
        let le =
            |i: usize| i32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (msg_len, response_to, op_code) = (le(0), le(8), le(12));
        let msg_len = usize::try_from(msg_len).unwrap_or(0);
        if !(HEADER_LEN + 5..=MAX_MESSAGE_LEN).contains(&msg_len) {
            return Err(WireError::Protocol(format!("bad messageLength {msg_len}")));
        }
        // The whole message (header included) in `inbuf`: OP_COMPRESSED is parsed whole.
        self.inbuf.clear();
        self.inbuf.extend_from_slice(&header);
        self.inbuf.resize(msg_len, 0);
        self.stream
            .read_exact(&mut self.inbuf[HEADER_LEN..])
            .await?;
        if self.compressor.is_some() {
            // Only replies to compressed requests are counted.
            self.replies += 1;
        }
        if op_code == OP_COMPRESSED {
            let frame = OpCompressed::parse(&self.inbuf, MAX_MESSAGE_LEN)
                .and_then(|c| c.decompress())
                .map_err(|e| WireError::Protocol(format!("OP_COMPRESSED reply: {e}")))?;
            if frame.header().op_code != OP_MSG {
                return Err(WireError::Protocol(format!(
                    "compressed reply wraps opCode {}",
                    frame.header().op_code
                )));
            }
            self.compressed_replies += 1;
            self.inbuf.clear();
            self.inbuf.extend_from_slice(frame.bytes());
        } else if op_code != OP_MSG {
            return Err(WireError::Protocol(format!("unexpected opCode {op_code}")));
        }
        if response_to != request_id {
            return Err(WireError::Protocol(format!(
                "responseTo {response_to} != requestID {request_id}"
            )));
        }
        let body = parse_op_msg_body(&self.inbuf[HEADER_LEN..])?;
        check_ok(body)?;
        Ok(body)
    }
}

/// Find the kind-0 section document in an OP_MSG payload (after the header).
pub fn parse_op_msg_body(payload: &[u8]) -> Result<&RawDocument, WireError> {
    let proto = |m: &str| WireError::Protocol(m.to_string());
    let flags_bytes: [u8; 4] = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| proto("short OP_MSG"))?;
    let flags = u32::from_le_bytes(flags_bytes);
    let mut end = payload.len();
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        end = end.checked_sub(4).ok_or_else(|| proto("short checksum"))?;
    }
    let mut pos = 4;
    let mut body = None;
    while pos < end {
        let kind = payload[pos];
        pos += 1;
        let size_bytes: [u8; 4] = payload
            .get(pos..pos + 4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| proto("truncated section"))?;
        let size = usize::try_from(i32::from_le_bytes(size_bytes)).unwrap_or(0);
        if size < 5 || pos + size > end {
            return Err(proto("bad section size"));
        }
        let section = &payload[pos..pos + size];
        match kind {
            0 if body.is_none() => {
                let doc = RawDocument::from_bytes(section)
                    .map_err(|e| WireError::Protocol(format!("bad body: {e}")))?;
                body = Some(doc);
            }
            0 => return Err(proto("two kind-0 sections")),
            1 => {}
            k => return Err(WireError::Protocol(format!("unknown section kind {k}"))),
        }
        pos += size;
    }
    body.ok_or_else(|| proto("no kind-0 section"))
}

/// `ok` must be numerically 1; `writeErrors` / `writeConcernError` count as failures.
pub fn check_ok(body: &RawDocument) -> Result<(), WireError> {
    let ok = match body.get("ok") {
        Ok(Some(v)) => v
            .as_f64()
            .or_else(|| v.as_i32().map(f64::from))
            .or_else(|| v.as_i64().map(|i| i as f64))
            .or_else(|| v.as_bool().map(|b| if b { 1.0 } else { 0.0 })),
        _ => None,
    };
    if ok != Some(1.0) {
        let msg = body.get_str("errmsg").unwrap_or("no errmsg");
        let code = match body.get("code") {
            Ok(Some(v)) => v
                .as_i32()
                .map(i64::from)
                .or_else(|| v.as_i64())
                .map(|c| c.to_string())
                .unwrap_or_default(),
            _ => String::new(),
        };
        return Err(WireError::Command(format!("ok={ok:?} code={code} {msg}")));
    }
    if matches!(body.get("writeErrors"), Ok(Some(_))) {
        return Err(WireError::Command("writeErrors".into()));
    }
    if matches!(body.get("writeConcernError"), Ok(Some(_))) {
        return Err(WireError::Command("writeConcernError".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_payload(doc: &Document) -> Vec<u8> {
        Body::encode(doc).map(|b| b.0).unwrap_or_default()
    }

    #[test]
    fn ok_reply_parses() {
        let p = frame_payload(&bson::doc! { "ok": 1.0 });
        let body = parse_op_msg_body(&p).expect("parse");
        assert!(check_ok(body).is_ok());
    }

    #[test]
    fn not_ok_and_write_errors_are_errors() {
        let p = frame_payload(&bson::doc! { "ok": 0.0, "errmsg": "nope", "code": 8 });
        let e = check_ok(parse_op_msg_body(&p).expect("parse")).unwrap_err();
        assert!(!e.is_fatal());
        let p = frame_payload(&bson::doc! { "ok": 1, "n": 0, "writeErrors": [{"code": 11000}] });
        assert!(check_ok(parse_op_msg_body(&p).expect("parse")).is_err());
    }

    #[test]
    fn truncated_payload_is_protocol_error() {
        let p = frame_payload(&bson::doc! { "ok": 1.0 });
        assert!(parse_op_msg_body(&p[..p.len() - 2]).is_err());
        assert!(parse_op_msg_body(&[1, 0]).is_err());
    }

    #[test]
    fn patchable_template_rewrites_value() {
        let marker = 0x5a5a_5a5a_5a5a_5a5a_i64;
        let (mut body, off) = Body::encode_patchable(
            &bson::doc! { "find": "c", "filter": {"_id": marker} },
            marker,
        )
        .expect("encode");
        body.patch_i64(off, 42);
        let doc = RawDocument::from_bytes(&body.0[5..]).expect("doc");
        let filter = doc.get_document("filter").expect("filter");
        assert_eq!(filter.get_i64("_id").expect("_id"), 42);
    }

    #[test]
    fn sequence_body_layout() {
        let marker = 0x73a1_b2c3_d4e5_f6e3_u64 as i64;
        let docs: Vec<Document> = (0..3).map(|_| bson::doc! { "_id": marker }).collect();
        let body = Body::encode_with_sequence(
            &bson::doc! { "insert": "c", "$db": "d" },
            "documents",
            &docs,
        )
        .expect("encode");
        let p = &body.0;
        let cmd_len = i32::from_le_bytes(p[5..9].try_into().expect("len")) as usize;
        assert_eq!(p[4], 0);
        let seq = 5 + cmd_len;
        assert_eq!(p[seq], 1, "a kind-1 section follows the body");
        let size = i32::from_le_bytes(p[seq + 1..seq + 5].try_into().expect("size")) as usize;
        assert_eq!(seq + 1 + size, p.len(), "the section size covers the rest");
        assert_eq!(&p[seq + 5..seq + 15], b"documents\0");
        let one = docs[0].to_vec().expect("doc").len();
        assert_eq!(size, 4 + 10 + 3 * one);
        let offs = body.marker_offsets(marker);
        assert_eq!(offs.len(), 3);
        let mut body = body;
        body.patch_i64(offs[2], 7);
        assert_eq!(body.marker_offsets(marker).len(), 2);
        // The reply parser skips the sequence and finds the body.
        let doc = parse_op_msg_body(&body.0).expect("parse");
        assert_eq!(doc.get_str("insert").expect("insert"), "c");
    }
}
