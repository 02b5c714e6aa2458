//! `tokiorelay`: the cheapest TCP relay Tokio makes, as a floor for `bench/run.sh`.
//!
//! It inspects nothing: each accepted connection gets an upstream connection and
//! `tokio::io::copy_bidirectional` between them. Its threads are laid out as mongoguard's
//! passthrough sessions are (`src/proxy/loops.rs`): `--threads` current-thread runtimes, a
//! connection placed on one for its life with both its sockets, TCP_NODELAY on both sides.
//! Beside HAProxy it separates what Rust and Tokio cost per request from what mongoguard's
//! own work costs (docs/performance.md, "Where the rest goes").
//!
//! Bounds: at most `--max-connections` at once (more are closed on accept); the upstream
//! connect times out; an error on either side closes both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio::net::{TcpListener, TcpStream};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A plain TCP relay on per-thread Tokio runtimes (a benchmark floor).
#[derive(Parser, Debug)]
#[command(name = "tokiorelay", version)]
struct Cli {
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,

    /// Where to forward to, HOST:PORT.
    #[arg(long)]
    upstream: String,

    /// Event-loop threads (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    threads: usize,

    /// Connections relayed at once; more are closed on accept.
    #[arg(long, default_value_t = 20_000)]
    max_connections: usize,
}

/// The loops connections run on; each its own thread and current-thread runtime.
struct Loops {
    handles: Vec<tokio::runtime::Handle>,
    next: AtomicUsize,
}

impl Loops {
    fn start(threads: usize) -> anyhow::Result<Loops> {
        let mut handles = Vec::with_capacity(threads.max(1));
        for n in 1..=threads.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("building a loop's runtime")?;
            handles.push(rt.handle().clone());
            std::thread::Builder::new()
                .name(format!("relay-{n}"))
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .context("starting a loop thread")?;
        }
        Ok(Loops {
            handles,
            next: AtomicUsize::new(0),
        })
    }

    /// Round robin: the benchmark's connections all live as long as each other.
    fn handle(&self) -> &tokio::runtime::Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.handles.len();
        // `handles` is never empty (`start` makes at least one).
        self.handles.get(i % n).unwrap_or_else(|| unreachable!())
    }
}

/// Relays one client connection until either side ends or fails.
async fn relay(client: std::net::TcpStream, upstream: Arc<str>) {
    let Ok(mut client) = TcpStream::from_std(client) else {
        return;
    };
    let mut server =
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&*upstream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return eprintln!("tokiorelay: connect to {upstream}: {e}"),
            Err(_) => return eprintln!("tokiorelay: connect to {upstream}: timed out"),
        };
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

async fn accept_loop(
    listener: TcpListener,
    loops: Arc<Loops>,
    upstream: Arc<str>,
    max: usize,
) -> anyhow::Result<()> {
    let live = Arc::new(AtomicUsize::new(0));
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait a little, keep serving.
                eprintln!("tokiorelay: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if live.load(Ordering::Relaxed) >= max {
            continue; // dropped: closed
        }
        let _ = socket.set_nodelay(true);
        // Registered again on the chosen loop's reactor.
        let Ok(socket) = socket.into_std() else {
            continue;
        };
        live.fetch_add(1, Ordering::Relaxed);
        let (live, upstream) = (live.clone(), upstream.clone());
        loops.handle().spawn(async move {
            relay(socket, upstream).await;
            live.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let threads = match cli.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let loops = Arc::new(Loops::start(threads)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the accept runtime")?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&cli.listen)
            .await
            .with_context(|| format!("binding {}", cli.listen))?;
        // The first line alone (scripts wait for it).
        println!("tokiorelay listening on {}", listener.local_addr()?);
        println!(
            "tokiorelay: upstream {}, {threads} loop thread(s)",
            cli.upstream
        );
        accept_loop(listener, loops, cli.upstream.into(), cli.max_connections).await
    })
}

#[cfg(test)]
#[path = "../echo_for_tests.rs"]
mod echo_for_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::echo_for_tests::echo;

    async fn start_relay(upstream: &str, threads: usize, max: usize) -> String {
        let loops = Arc::new(Loops::start(threads).unwrap());
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(accept_loop(l, loops, upstream.into(), max));
        addr
    }

    #[tokio::test]
    async fn relays_both_ways_on_every_loop_and_closes_with_the_upstream() {
        let addr = start_relay(&echo().await, 2, 100).await;
        // Three connections: round robin puts them on both loops.
        for i in 0..3u8 {
            let mut c = TcpStream::connect(&addr).await.unwrap();
            let msg = vec![b'a' + i; 100_000];
            c.write_all(&msg).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut back))
                .await
                .expect("echoed in time")
                .unwrap();
            assert_eq!(back, msg);
            // The client's EOF reaches the echo server, whose EOF comes back.
            c.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let n = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest))
                .await
                .expect("closed in time")
                .unwrap();
            assert_eq!(n, 0);
        }
    }

    #[tokio::test]
    async fn a_dead_upstream_closes_the_client_and_the_limit_refuses_extra_clients() {
        // Nothing listens on the upstream port: the client is closed.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let addr = start_relay(&dead, 1, 100).await;
        let mut c = TcpStream::connect(&addr).await.unwrap();
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0);

        // With room for one connection, the second is closed at once.
        let addr = start_relay(&echo().await, 1, 1).await;
        let mut first = TcpStream::connect(&addr).await.unwrap();
        first.write_all(b"x").await.unwrap();
        first.read_exact(&mut b).await.unwrap();
        let mut second = TcpStream::connect(&addr).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), second.read(&mut b))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "over the limit: closed");
        first.write_all(b"y").await.unwrap();
        first.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"y", "the first still relays");
    }
}
