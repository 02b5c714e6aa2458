//! One lost monitoring connection must not flap the topology.
//!
//! A monitor whose established connection fails once (reset by a middlebox or a firewall's
//! connection tracking, a DBA's `killOp`, a single slow hello) marked its server Unknown at
//! once. For a replica set's primary that means "the primary changed": every passthrough
//! session attached to it was closed, all clients at once, although the primary never
//! moved and answered the next check 100 ms later. The server monitoring specification
//! marks the server Unknown and checks again at once ("Retry hello calls once": a network
//! error on a long-lived monitoring connection is usually a glitch); a driver's application
//! does not see that Unknown, mongoguard's clients do. So the monitor checks again at once on
//! a new connection first, and only a failed recheck marks the server Unknown.

#[path = "support/hostile.rs"]
mod hostile;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use bson::doc;
use hostile::{
    body_of, op_msg, primary_hello, proxy_from_toml, read_frame, serve_op_msg, temp_dir, Binary,
    RawClient,
};
use tokio::net::{TcpListener, TcpStream};

const REPLY: Duration = Duration::from_secs(10);

/// A one-member replica-set primary that closes, once, the first connection on which it is
/// asked its third hello (the monitor's second heartbeat: an established connection).
struct FlakyPrimary {
    addr: SocketAddr,
    dropped: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl FlakyPrimary {
    async fn start() -> FlakyPrimary {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dropped = Arc::new(tokio::sync::Notify::new());
        let once = Arc::new(AtomicBool::new(false));
        let notify = dropped.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, addr, once.clone(), notify.clone()));
            }
        });
        FlakyPrimary {
            addr,
            dropped,
            task,
        }
    }
}

impl Drop for FlakyPrimary {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    stream: TcpStream,
    me: SocketAddr,
    once: Arc<AtomicBool>,
    dropped: Arc<tokio::sync::Notify>,
) {
    let mut hellos = 0;
    serve_op_msg(stream, 1_000, |name, _| match name {
        "hello" | "isMaster" | "ismaster" => {
            hellos += 1;
            if hellos == 3 && !once.swap(true, Ordering::SeqCst) {
                // The connection is lost: closed without a reply.
                dropped.notify_one();
                return None;
            }
            Some(primary_hello("rs_flap", me, 21))
        }
        _ => Some(doc! {"ok": 1.0}),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lost_monitoring_connection_does_not_close_the_sessions_on_the_primary() {
    let primary = FlakyPrimary::start().await;
    let proxy = proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n\
         [upstream]\nuri = \"mongodb://{}/?replicaSet=rs_flap\"\nheartbeat_interval = \"200ms\"\n\
         [admin]\nlisten = \"off\"\n",
        primary.addr
    ))
    .await;
    // A session attached to the primary (its upstream connection says one hello only).
    let mut client = RawClient::connect(proxy.local_addr()).await;
    client.ping(REPLY).await.expect("a ping through the proxy");
    // The monitor's established connection is lost once.
    tokio::time::timeout(Duration::from_secs(30), primary.dropped.notified())
        .await
        .expect("the monitor's connection was dropped");
    // Several heartbeats later, the session is still there.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    client
        .ping(REPLY)
        .await
        .expect("the session on the primary survives one lost monitoring connection");
    proxy.shutdown().await;
}

/// mongoguard out of file descriptors (a connection storm above `LimitNOFILE`): a new
/// session's upstream connect fails with EMFILE, which says nothing about the server, but
/// it marked the replica set's primary Unknown, and so closed every other session attached
/// to it: a local shortage turned into a disconnect of every client. Only errors that
/// implicate the server (refused, reset, timed out, unreachable) may mark it Unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_file_descriptors_does_not_close_the_sessions_on_the_primary() {
    use mongoguard_standin::{StandIn, StandInConfig};
    let standin = StandIn::start(StandInConfig {
        replica_set: Some("rs_fd".into()),
        ..StandInConfig::default()
    })
    .await
    .unwrap();
    let dir = temp_dir("nofile");
    let config = dir.join("mongoguard.toml");
    std::fs::write(
        &config,
        format!(
            // Two session threads: a machine with many CPUs would otherwise spend the
            // 48 descriptors on event loops before any client.
            "[proxy]\nlisten = \"127.0.0.1:0\"\nthreads = 2\n\
             [upstream]\nuri = \"{}/?replicaSet=rs_fd\"\nheartbeat_interval = \"200ms\"\n\
             [admin]\nlisten = \"off\"\n[audit]\nsink = \"none\"\n",
            standin.uri()
        ),
    )
    .unwrap();
    let Some(mut bin) = Binary::start_with_nofile(&config, 48) else {
        eprintln!("no prlimit(1) here; not checked");
        return;
    };
    let mut client = RawClient::connect(bin.addr).await;
    client.ping(REPLY).await.expect("a ping through the proxy");

    // Idle connections take the descriptors that are left; then each sends a ping, whose
    // upstream connect finds none.
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(RawClient::connect(bin.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, c) in idle.iter_mut().enumerate() {
        let frame = op_msg(i as i32 + 1, 0, &doc! {"ping": 1, "$db": "admin"});
        let _ = c.send_bytes(&frame).await;
    }
    let mut emfile = 0;
    for c in idle.iter_mut() {
        if let Ok(reply) = read_frame(&mut c.stream, Duration::from_millis(200)).await {
            let body = body_of(&reply);
            if body
                .get_str("errmsg")
                .is_ok_and(|m| m.contains("Too many open files"))
            {
                emfile += 1;
            }
        }
    }
    assert!(
        emfile > 0,
        "no upstream connect ran out of descriptors; nothing checked"
    );
    drop(idle);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = client.ping(REPLY).await;
    bin.signal("TERM");
    let _ = bin.exited_within(Duration::from_secs(10));
    after.unwrap_or_else(|e| {
        panic!(
            "the session on the primary survives the descriptor shortage: {e}\n{}",
            bin.stderr_text()
                .lines()
                .filter(|l| !l.contains("DEBUG"))
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    standin.shutdown().await;
}
