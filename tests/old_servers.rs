//! Upstreams without the `hello` command.
//!
//! `hello` exists from MongoDB 4.4.2 (and the 4.2.10, 4.0.21 and 3.6.21 patch releases);
//! older servers answer it with CommandNotFound (59), and drivers therefore open every
//! connection with the legacy `isMaster` unless the server said `helloOk`. mongoguard's own
//! connections (monitors, `/readyz`, pooled connections) sent `hello` only: in front of such
//! a server no monitor ever saw it up, so a replica set had no server to select and
//! `/readyz` stayed 503. The stand-in answers `hello` at every wire version, so nothing
//! noticed; the fake here answers like mongod 4.2.8.

#[path = "support/hostile.rs"]
mod hostile;

use std::{net::SocketAddr, time::Duration};

use bson::doc;
use hostile::{primary_hello, proxy_from_toml, serve_op_msg, RawClient};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const REPLY: Duration = Duration::from_secs(10);

/// A one-member replica-set primary that knows `isMaster` but not `hello`.
async fn start_old_primary(set: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, addr, set));
        }
    });
    (addr, task)
}

async fn serve(stream: TcpStream, me: SocketAddr, set: &'static str) {
    serve_op_msg(stream, 1_000, |name, _| {
        Some(match name {
            "isMaster" | "ismaster" => {
                // A server before hello: isMaster's fields only, at wire version 8 (4.2).
                let mut reply = primary_hello(set, me, 8);
                reply.remove("isWritablePrimary");
                reply.remove("helloOk");
                reply.insert("secondary", false);
                reply
            }
            "hello" => doc! {
                "ok": 0.0, "errmsg": "no such command: 'hello'", "code": 59,
                "codeName": "CommandNotFound",
            },
            _ => doc! {"ok": 1.0},
        })
    })
    .await
}

async fn readyz(admin: SocketAddr) -> (u16, String) {
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(REPLY, s.read_to_end(&mut raw))
        .await
        .expect("readyz in time")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_without_hello_is_monitored_with_is_master() {
    let (addr, task) = start_old_primary("rs_old").await;
    let proxy = proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n\
         [upstream]\nuri = \"mongodb://{addr}/?replicaSet=rs_old\"\nheartbeat_interval = \"200ms\"\n\
         server_selection_timeout = \"3s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n"
    ))
    .await;
    let mut client = RawClient::connect(proxy.local_addr()).await;
    let ping = client.ping(REPLY).await;
    let (status, body) = readyz(proxy.admin_addr().unwrap()).await;
    proxy.shutdown().await;
    task.abort();
    ping.expect("a ping through the proxy to a primary that only knows isMaster");
    assert_eq!(status, 200, "/readyz: {body}");
}
