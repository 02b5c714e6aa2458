//! A minimal raw wire client for tests (independent of the crate's own codec).
#![allow(dead_code)]

use std::time::Duration;

use bson::Document;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const OP_REPLY: i32 = 1;
pub const OP_MSG: i32 = 2013;
pub const MORE_TO_COME: u32 = 1 << 1;
pub const EXHAUST_ALLOWED: u32 = 1 << 16;
pub const CHECKSUM: u32 = 1;

fn header(buf: &mut Vec<u8>, request_id: i32, op: i32) {
    buf.extend_from_slice(&0i32.to_le_bytes());
    buf.extend_from_slice(&request_id.to_le_bytes());
    buf.extend_from_slice(&0i32.to_le_bytes());
    buf.extend_from_slice(&op.to_le_bytes());
}

fn finish(mut buf: Vec<u8>) -> Vec<u8> {
    let len = buf.len() as i32;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    buf
}

fn cstring(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
}

pub fn op_msg(
    request_id: i32,
    flags: u32,
    body: &Document,
    seq: Option<(&str, &[Document])>,
) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, OP_MSG);
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.push(0);
    buf.extend_from_slice(&body.to_vec().unwrap());
    if let Some((id, docs)) = seq {
        let mut s = Vec::new();
        cstring(&mut s, id);
        for d in docs {
            s.extend_from_slice(&d.to_vec().unwrap());
        }
        buf.push(1);
        buf.extend_from_slice(&((s.len() + 4) as i32).to_le_bytes());
        buf.extend_from_slice(&s);
    }
    if flags & CHECKSUM != 0 {
        buf.extend_from_slice(&[0; 4]);
        let mut buf = finish(buf);
        let n = buf.len();
        let crc = crc32c::crc32c(&buf[..n - 4]);
        buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
        return buf;
    }
    finish(buf)
}

pub fn op_query(request_id: i32, ns: &str, skip: i32, n_return: i32, query: &Document) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, 2004);
    buf.extend_from_slice(&0i32.to_le_bytes());
    cstring(&mut buf, ns);
    buf.extend_from_slice(&skip.to_le_bytes());
    buf.extend_from_slice(&n_return.to_le_bytes());
    buf.extend_from_slice(&query.to_vec().unwrap());
    finish(buf)
}

pub fn op_insert(request_id: i32, ns: &str, docs: &[Document]) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, 2002);
    buf.extend_from_slice(&0i32.to_le_bytes());
    cstring(&mut buf, ns);
    for d in docs {
        buf.extend_from_slice(&d.to_vec().unwrap());
    }
    finish(buf)
}

pub fn op_update(
    request_id: i32,
    ns: &str,
    flags: i32,
    selector: &Document,
    update: &Document,
) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, 2001);
    buf.extend_from_slice(&0i32.to_le_bytes());
    cstring(&mut buf, ns);
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.extend_from_slice(&selector.to_vec().unwrap());
    buf.extend_from_slice(&update.to_vec().unwrap());
    finish(buf)
}

pub fn op_delete(request_id: i32, ns: &str, flags: i32, selector: &Document) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, 2006);
    buf.extend_from_slice(&0i32.to_le_bytes());
    cstring(&mut buf, ns);
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.extend_from_slice(&selector.to_vec().unwrap());
    finish(buf)
}

pub fn op_get_more(request_id: i32, ns: &str, n_return: i32, cursor_id: i64) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, 2005);
    buf.extend_from_slice(&0i32.to_le_bytes());
    cstring(&mut buf, ns);
    buf.extend_from_slice(&n_return.to_le_bytes());
    buf.extend_from_slice(&cursor_id.to_le_bytes());
    finish(buf)
}

pub fn op_kill_cursors(request_id: i32, ids: &[i64]) -> Vec<u8> {
    let mut buf = Vec::new();
    header(&mut buf, request_id, 2007);
    buf.extend_from_slice(&0i32.to_le_bytes());
    buf.extend_from_slice(&(ids.len() as i32).to_le_bytes());
    for id in ids {
        buf.extend_from_slice(&id.to_le_bytes());
    }
    finish(buf)
}

/// A decoded reply frame.
#[derive(Debug)]
pub struct Reply {
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
    /// OP_MSG flagBits or OP_REPLY responseFlags.
    pub flags: u32,
    /// OP_REPLY cursorID.
    pub cursor_id: i64,
    pub docs: Vec<Document>,
}

impl Reply {
    pub fn doc(&self) -> &Document {
        &self.docs[0]
    }
}

pub fn parse_reply(frame: &[u8]) -> Reply {
    let i32_at = |o: usize| i32::from_le_bytes(frame[o..o + 4].try_into().unwrap());
    let (request_id, response_to, op_code) = (i32_at(4), i32_at(8), i32_at(12));
    let read_docs = |mut o: usize, end: usize| {
        let mut docs = Vec::new();
        while o < end {
            let l = i32::from_le_bytes(frame[o..o + 4].try_into().unwrap()) as usize;
            docs.push(Document::from_reader(&frame[o..o + l]).unwrap());
            o += l;
        }
        docs
    };
    match op_code {
        OP_MSG => {
            let flags = i32_at(16) as u32;
            assert_eq!(frame[20], 0, "reply section kind");
            Reply {
                request_id,
                response_to,
                op_code,
                flags,
                cursor_id: 0,
                docs: read_docs(21, frame.len()),
            }
        }
        OP_REPLY => Reply {
            request_id,
            response_to,
            op_code,
            flags: i32_at(16) as u32,
            cursor_id: i64::from_le_bytes(frame[20..28].try_into().unwrap()),
            docs: read_docs(36, frame.len()),
        },
        other => panic!("unexpected reply opcode {other}"),
    }
}

pub struct Raw {
    pub stream: TcpStream,
    next_id: i32,
}

impl Raw {
    pub async fn connect(addr: std::net::SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.unwrap(),
            next_id: 100,
        }
    }

    pub fn next_id(&mut self) -> i32 {
        self.next_id += 1;
        self.next_id
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads one frame (raw bytes, header included).
    pub async fn read_frame(&mut self) -> std::io::Result<Vec<u8>> {
        let mut h = [0u8; 16];
        self.stream.read_exact(&mut h).await?;
        let len = i32::from_le_bytes(h[..4].try_into().unwrap());
        if !(16..=48_000_000).contains(&len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad length {len}"),
            ));
        }
        let mut f = vec![0u8; len as usize];
        f[..16].copy_from_slice(&h);
        self.stream.read_exact(&mut f[16..]).await?;
        Ok(f)
    }

    pub async fn read(&mut self) -> Reply {
        let f = tokio::time::timeout(Duration::from_secs(10), self.read_frame())
            .await
            .expect("reply timed out")
            .expect("read failed");
        parse_reply(&f)
    }

    /// Sends an OP_MSG command and returns the reply body.
    pub async fn command(&mut self, body: Document) -> Document {
        let id = self.next_id();
        self.send(&op_msg(id, 0, &body, None)).await;
        let r = self.read().await;
        assert_eq!(r.response_to, id);
        assert_eq!(r.op_code, OP_MSG);
        r.docs.into_iter().next().unwrap()
    }

    /// True if the peer closed the connection within `within`.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        let mut b = [0u8; 64];
        loop {
            match tokio::time::timeout(within, self.stream.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}
