//! A minimal OP_MSG client over a plain TCP stream, for what the drivers cannot be made to do:
//! the Rust driver refuses unacknowledged (w:0) writes, so `moreToCome` from a client is sent by
//! hand, and so is an exhaust `getMore` (`exhaustAllowed`).
//!
//! Every read is bounded by [`READ_LIMIT`] so that a proxy that drops a reply fails the test
//! instead of hanging it; no test asserts on how long anything takes.

use std::time::Duration;

use bson::{doc, Document};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};

pub const OP_MSG: i32 = 2013;
pub const CHECKSUM_PRESENT: u32 = 1;
pub const MORE_TO_COME: u32 = 1 << 1;
pub const EXHAUST_ALLOWED: u32 = 1 << 16;

/// Upper bound on a single read, so a lost reply fails instead of hanging.
pub const READ_LIMIT: Duration = Duration::from_secs(30);

/// One OP_MSG received.
#[derive(Debug)]
pub struct Reply {
    pub request_id: i32,
    pub response_to: i32,
    pub flags: u32,
    pub body: Document,
}

impl Reply {
    pub fn more_to_come(&self) -> bool {
        self.flags & MORE_TO_COME != 0
    }
}

pub struct RawConn {
    stream: TcpStream,
    next_request_id: i32,
}

impl RawConn {
    pub async fn connect(addr: impl ToSocketAddrs) -> std::io::Result<RawConn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            next_request_id: 1,
        })
    }

    /// Connects and performs a plain (uncompressed, unauthenticated) `hello` handshake.
    /// The socket, for tests that watch it close.
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    pub async fn connect_with_hello(addr: impl ToSocketAddrs) -> (RawConn, Document) {
        let mut conn = RawConn::connect(addr).await.expect("TCP connect");
        let hello = conn
            .command(doc! {
                "hello": 1,
                "client": { "application": { "name": "mongoguard-raw-test" },
                            "driver": { "name": "mongoguard-tests", "version": "0" },
                            "os": { "type": std::env::consts::OS } },
                "$db": "admin",
            })
            .await;
        assert_eq!(
            super::num(&hello, "ok"),
            1,
            "hello through the proxy: {hello}"
        );
        (conn, hello)
    }

    /// Sends one OP_MSG with a single kind-0 section; returns its requestID.
    pub async fn send(&mut self, flags: u32, body: &Document) -> i32 {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let body = body.to_vec().expect("encode BSON body");
        let len = 16 + 4 + 1 + body.len();
        let mut frame = Vec::with_capacity(len);
        frame.extend_from_slice(&i32::try_from(len).expect("frame size").to_le_bytes());
        frame.extend_from_slice(&request_id.to_le_bytes());
        frame.extend_from_slice(&0i32.to_le_bytes());
        frame.extend_from_slice(&OP_MSG.to_le_bytes());
        frame.extend_from_slice(&flags.to_le_bytes());
        frame.push(0);
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).await.expect("send OP_MSG");
        request_id
    }

    /// Reads one OP_MSG (panics on any other opcode, a malformed frame or [`READ_LIMIT`]).
    pub async fn read(&mut self) -> Reply {
        tokio::time::timeout(READ_LIMIT, self.read_unbounded())
            .await
            .unwrap_or_else(|_| panic!("no reply within {READ_LIMIT:?}"))
    }

    async fn read_unbounded(&mut self) -> Reply {
        let mut header = [0u8; 16];
        self.stream
            .read_exact(&mut header)
            .await
            .expect("read message header");
        let field = |i: usize| i32::from_le_bytes(header[i..i + 4].try_into().unwrap());
        let (len, request_id, response_to, op_code) = (field(0), field(4), field(8), field(12));
        assert_eq!(
            op_code, OP_MSG,
            "expected an OP_MSG reply, got opCode {op_code}"
        );
        assert!(
            (21..=48_000_000).contains(&len),
            "implausible messageLength {len}"
        );
        let mut rest = vec![0u8; len as usize - 16];
        self.stream
            .read_exact(&mut rest)
            .await
            .expect("read message body");
        let flags = u32::from_le_bytes(rest[0..4].try_into().unwrap());
        let end = if flags & CHECKSUM_PRESENT != 0 {
            rest.len() - 4
        } else {
            rest.len()
        };
        let mut pos = 4;
        let mut body = None;
        while pos < end {
            let kind = rest[pos];
            pos += 1;
            let size = i32::from_le_bytes(rest[pos..pos + 4].try_into().unwrap()) as usize;
            match kind {
                0 => {
                    let doc = Document::from_reader(&rest[pos..pos + size]).expect("BSON body");
                    assert!(body.is_none(), "two kind-0 sections in one OP_MSG");
                    body = Some(doc);
                }
                1 => {}
                other => panic!("unknown OP_MSG section kind {other}"),
            }
            pos += size;
        }
        assert_eq!(pos, end, "OP_MSG sections do not add up to the frame");
        Reply {
            request_id,
            response_to,
            flags,
            body: body.expect("OP_MSG without a body section"),
        }
    }

    /// Sends a command (no flags) and returns the body of its reply, checking `responseTo`.
    pub async fn command(&mut self, body: Document) -> Document {
        let request_id = self.send(0, &body).await;
        let reply = self.read().await;
        assert_eq!(
            reply.response_to, request_id,
            "reply answers another request: {:?}",
            reply.body
        );
        assert!(!reply.more_to_come(), "unrequested moreToCome: {reply:?}");
        reply.body
    }
}

impl RawConn {
    /// A connection to mongoguard (pooled mode) authenticated as `user` of its users file,
    /// with SCRAM-SHA-256, after a hello.
    pub async fn connect_as(addr: impl ToSocketAddrs, user: &str, password: &str) -> RawConn {
        use mongoguard::auth::scram::{ClientConversation, Mechanism};
        let bin = |bytes: Vec<u8>| bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes,
        };
        let payload = |reply: &Document| reply.get_binary_generic("payload").unwrap().clone();
        let (mut c, _) = RawConn::connect_with_hello(addr).await;
        let mut scram = ClientConversation::new(Mechanism::ScramSha256, user, password).unwrap();
        let start = c
            .command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
            "payload": bin(scram.client_first()), "$db": "admin"})
            .await;
        let id = start
            .get_i32("conversationId")
            .unwrap_or_else(|_| panic!("{start}"));
        let client_final = scram.handle_server_first(&payload(&start)).unwrap();
        let mut reply = c
            .command(doc! {"saslContinue": 1, "conversationId": id,
            "payload": bin(client_final), "$db": "admin"})
            .await;
        scram.verify_server_final(&payload(&reply)).unwrap();
        while !reply.get_bool("done").unwrap_or_else(|_| panic!("{reply}")) {
            reply = c
                .command(doc! {"saslContinue": 1, "conversationId": id,
                "payload": bin(Vec::new()), "$db": "admin"})
                .await;
        }
        c
    }
}
