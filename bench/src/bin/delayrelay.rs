//! `delayrelay`: a TCP relay that makes a local upstream cost what a remote one costs.
//!
//! Every chunk read from one side is written to the other `--delay-ms` later (one-way delay:
//! a round trip costs twice that). Each direction has a queue of (due time, chunk): the reader
//! stamps a chunk when it arrives and goes on reading, the writer waits for the head's due time,
//! so order is kept and chunks do not wait behind each other's delays. A new connection costs
//! one extra round trip before its first byte reaches the upstream (the TCP handshake of a
//! remote server: the client's connect() returns at once here, so its first bytes are held
//! for that round trip). With `--tls-cert/--tls-key` or `--tls-self-signed DIR` the relay
//! terminates TLS *behind* the delay (the raw TCP bytes are delayed before TLS sees them), so
//! the TLS handshake pays its real round trips; the upstream side is plaintext.
//!
//! Delays are timed by one timer thread (a heap of due times, condition-variable waits with
//! the kernel's sub-millisecond precision) rather than tokio's timer, whose 1 ms wheel would
//! round a 1 ms delay up to 1-2 ms.
//!
//! Bounds: at most `--max-connections` at once (more are closed on accept); at most
//! `QUEUE_CHUNKS` chunks of at most `CHUNK` bytes queued per direction (the reader waits);
//! upstream connect and TLS handshake time out; an error on either side closes both; after
//! one direction ends (EOF), the other gets `HALF_CLOSE_GRACE` to finish.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
};

/// Largest chunk read at once.
const CHUNK: usize = 16 * 1024;
/// Chunks queued per direction before the reader waits (bounds memory: 1 MiB a direction).
const QUEUE_CHUNKS: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HALF_CLOSE_GRACE: Duration = Duration::from_secs(10);
/// Buffer of the in-process pipe between the delay stage and the TLS terminator.
const PIPE_BUF: usize = 64 * 1024;

/// TCP relay adding a fixed one-way delay (and optionally terminating TLS behind it).
#[derive(Parser, Debug)]
#[command(name = "delayrelay", version)]
struct Cli {
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,

    /// Where to forward to (plaintext TCP), HOST:PORT.
    #[arg(long)]
    upstream: String,

    /// One-way delay in milliseconds, applied in each direction (a round trip costs twice).
    #[arg(long, default_value_t = 1.0)]
    delay_ms: f64,

    /// Extra round trips a new connection costs before its first byte is forwarded (the
    /// TCP handshake: 1).
    #[arg(long, default_value_t = 1)]
    handshake_rtts: u32,

    /// Terminate TLS with this PEM certificate chain (needs --tls-key).
    #[arg(long, requires = "tls_key", conflicts_with = "tls_self_signed")]
    tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Terminate TLS with a certificate minted at start (ECDSA P-256, for 127.0.0.1 and
    /// localhost) signed by a fresh CA; writes DIR/ca.pem (for clients' tlsCAFile),
    /// DIR/cert.pem and DIR/key.pem.
    #[arg(long, value_name = "DIR")]
    tls_self_signed: Option<PathBuf>,

    /// Connections open at once; more are closed as soon as they are accepted.
    #[arg(long, default_value_t = 20_000)]
    max_connections: usize,
}

// --- timer ------------------------------------------------------------------------------

struct Entry {
    due: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap, the earliest due time must come out first.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

#[derive(Default)]
struct Heap {
    entries: BinaryHeap<Entry>,
    seq: u64,
}

/// Wakes async waiters at their due time, from one OS thread.
struct Timer {
    heap: Mutex<Heap>,
    cv: Condvar,
}

impl Timer {
    fn start() -> Arc<Timer> {
        let t = Arc::new(Timer {
            heap: Mutex::new(Heap::default()),
            cv: Condvar::new(),
        });
        let t2 = t.clone();
        std::thread::Builder::new()
            .name("delay-timer".into())
            .spawn(move || t2.run())
            .expect("spawning the timer thread");
        t
    }

    fn run(&self) {
        let mut g = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            while g.entries.peek().is_some_and(|e| e.due <= now) {
                if let Some(e) = g.entries.pop() {
                    let _ = e.wake.send(()); // the waiter may be gone (connection closed)
                }
            }
            g = match g.entries.peek().map(|e| e.due - now) {
                Some(wait) => {
                    self.cv
                        .wait_timeout(g, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    async fn sleep_until(&self, due: Instant) {
        if due <= Instant::now() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut g = self.heap.lock().unwrap_or_else(|p| p.into_inner());
            g.seq += 1;
            let seq = g.seq;
            g.entries.push(Entry { due, seq, wake: tx });
        }
        self.cv.notify_one();
        let _ = rx.await;
    }
}

// --- relay ------------------------------------------------------------------------------

struct Relay {
    upstream: String,
    delay: Duration,
    handshake: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
    timer: Arc<Timer>,
}

/// One direction: read chunks from `r`, write each to `w` `delay` after it arrived (and not
/// before `open_at` + `delay`). EOF is forwarded as a shutdown, in order.
async fn pump<R, W>(
    mut r: R,
    mut w: W,
    delay: Duration,
    open_at: Instant,
    timer: &Timer,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(QUEUE_CHUNKS);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = r.read(&mut buf).await?;
            let due = Instant::now().max(open_at) + delay;
            let chunk = (n > 0).then(|| buf[..n].to_vec());
            // A send error means the writer stopped on an error, which ends the join.
            if tx.send((due, chunk)).await.is_err() || n == 0 {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            timer.sleep_until(due).await;
            match chunk {
                Some(c) => w.write_all(&c).await?,
                None => {
                    w.shutdown().await?;
                    break;
                }
            }
        }
        Ok::<_, io::Error>(())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

/// Both directions between the client and `inner`; an error in either ends both, and after
/// one direction's EOF the other has HALF_CLOSE_GRACE.
async fn delayed_pair<I>(
    client: TcpStream,
    inner: I,
    relay: &Relay,
    accepted: Instant,
) -> io::Result<()>
where
    I: AsyncRead + AsyncWrite,
{
    let (cr, cw) = client.into_split();
    let (ir, iw) = tokio::io::split(inner);
    let open_at = accepted + relay.handshake;
    let up = pump(cr, iw, relay.delay, open_at, &relay.timer);
    let down = pump(ir, cw, relay.delay, accepted, &relay.timer);
    tokio::pin!(up, down);
    let rest = tokio::select! {
        r = &mut up => { r?; tokio::time::timeout(HALF_CLOSE_GRACE, down).await }
        r = &mut down => { r?; tokio::time::timeout(HALF_CLOSE_GRACE, up).await }
    };
    rest.map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "half-closed too long"))?
}

async fn serve(client: TcpStream, relay: Arc<Relay>) -> io::Result<()> {
    let accepted = Instant::now();
    client.set_nodelay(true)?;
    let upstream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&relay.upstream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))??;
    upstream.set_nodelay(true)?;
    let Some(acceptor) = &relay.tls else {
        return delayed_pair(client, upstream, &relay, accepted).await;
    };
    // client <-delay-> near | far <-TLS server-> plaintext <-> upstream
    let (near, far) = tokio::io::duplex(PIPE_BUF);
    let terminated = async move {
        let mut tls = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(far))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        let mut upstream = upstream;
        tokio::io::copy_bidirectional(&mut tls, &mut upstream)
            .await
            .map(|_| ())
    };
    tokio::try_join!(delayed_pair(client, near, &relay, accepted), terminated).map(|_| ())
}

// --- TLS --------------------------------------------------------------------------------

fn read_chain(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

/// Mints a CA and a leaf for 127.0.0.1 / localhost signed by it; writes ca.pem, cert.pem and
/// key.pem into `dir`; returns the leaf's chain and key.
fn self_signed(
    dir: &Path,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "delayrelay bench CA");
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let mut leaf_params = CertificateParams::new(vec!["localhost".to_string()])?;
    leaf_params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "delayrelay");
    let leaf_key = KeyPair::generate()?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key)?;
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("cert.pem", leaf.pem()),
        ("key.pem", leaf_key.serialize_pem()),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, pem).with_context(|| format!("writing {}", p.display()))?;
    }
    let key = PrivateKeyDer::try_from(leaf_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("leaf key: {e}"))?;
    Ok((vec![leaf.der().clone()], key))
}

fn tls_acceptor(cli: &Cli) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    let (chain, key) = match (&cli.tls_cert, &cli.tls_key, &cli.tls_self_signed) {
        (Some(cert), Some(key), _) => {
            let pem = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
            let k = PrivateKeyDer::from_pem_slice(&pem)
                .with_context(|| format!("no private key in {}", key.display()))?;
            (read_chain(cert)?, k)
        }
        (_, _, Some(dir)) => self_signed(dir)?,
        _ => return Ok(None),
    };
    acceptor(chain, key).map(Some)
}

fn acceptor(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("certificate and key do not fit")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections for ever, each served by its own task.
async fn accept_loop(listener: TcpListener, relay: Arc<Relay>, max_connections: usize) -> ! {
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let (sock, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: wait instead of spinning.
                eprintln!("delayrelay: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.fetch_add(1, Ordering::AcqRel) >= max_connections {
            open.fetch_sub(1, Ordering::AcqRel);
            drop(sock);
            continue;
        }
        let relay = relay.clone();
        let open = open.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(sock, relay).await {
                // Resets and unclean TLS ends are how clients close; only say the rest.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::UnexpectedEof
                ) {
                    eprintln!("delayrelay: connection: {e}");
                }
            }
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

// --- main -------------------------------------------------------------------------------

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.delay_ms.is_finite() && cli.delay_ms >= 0.0,
        "--delay-ms must be >= 0"
    );
    let delay = Duration::from_secs_f64(cli.delay_ms / 1000.0);
    let relay = Arc::new(Relay {
        upstream: cli.upstream.clone(),
        delay,
        handshake: 2 * delay * cli.handshake_rtts,
        tls: tls_acceptor(&cli)?,
        timer: Timer::start(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building tokio runtime")?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&cli.listen)
            .await
            .with_context(|| format!("binding {}", cli.listen))?;
        // The first line alone (scripts wait for it), the settings on the next.
        println!("delayrelay listening on {}", listener.local_addr()?);
        println!(
            "delayrelay: upstream {}, delay {} ms each way, {} handshake round trip(s), tls {}",
            relay.upstream,
            cli.delay_ms,
            cli.handshake_rtts,
            if relay.tls.is_some() { "on" } else { "off" }
        );
        accept_loop(listener, relay, cli.max_connections).await
    })
}

#[cfg(test)]
#[path = "../echo_for_tests.rs"]
mod echo_for_tests;

#[cfg(test)]
mod tests {
    use super::*;

    use super::echo_for_tests::echo;

    /// A relay toward `upstream` with `delay_ms` each way; returns its address.
    async fn relay(
        upstream: &str,
        delay_ms: u64,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> String {
        let delay = Duration::from_millis(delay_ms);
        let relay = Arc::new(Relay {
            upstream: upstream.to_string(),
            delay,
            handshake: 2 * delay,
            tls,
            timer: Timer::start(),
        });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(accept_loop(l, relay, 100));
        addr
    }

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[tokio::test]
    async fn first_byte_pays_the_handshake_then_each_exchange_a_round_trip() {
        let addr = relay(&echo().await, 20, None).await;
        let mut c = TcpStream::connect(&addr).await.unwrap();
        let t0 = Instant::now();
        c.write_all(b"a").await.unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await.unwrap();
        let first = t0.elapsed();
        // Handshake round trip (40 ms) + the exchange (40 ms).
        assert!(ms(first) >= 80, "first exchange took {first:?}");
        assert!(ms(first) < 300, "first exchange took {first:?}");
        let t1 = Instant::now();
        c.write_all(b"b").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        let second = t1.elapsed();
        assert_eq!(&b, b"b");
        assert!(ms(second) >= 40, "second exchange took {second:?}");
        assert!(ms(second) < 200, "second exchange took {second:?}");
    }

    #[tokio::test]
    async fn chunks_keep_their_order_and_do_not_wait_behind_each_other() {
        let addr = relay(&echo().await, 50, None).await;
        let mut c = TcpStream::connect(&addr).await.unwrap();
        c.set_nodelay(true).unwrap();
        let mut b = [0u8; 1];
        c.write_all(b"x").await.unwrap();
        c.read_exact(&mut b).await.unwrap(); // past the handshake
        let t0 = Instant::now();
        let (mut r, mut w) = c.into_split();
        let writer = tokio::spawn(async move {
            for i in 0..5u8 {
                w.write_all(&[b'0' + i]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            w
        });
        let mut got = [0u8; 5];
        r.read_exact(&mut got).await.unwrap();
        let took = t0.elapsed();
        let _w = writer.await.unwrap();
        assert_eq!(&got, b"01234");
        // The last chunk leaves at ~40 ms and comes back 100 ms later. Chunks serialized
        // behind each other's delays would take at least 5 x 50 ms.
        assert!(ms(took) >= 140, "took {took:?}");
        assert!(ms(took) < 250, "took {took:?}");
    }

    #[tokio::test]
    async fn tls_is_terminated_behind_the_delay() {
        let dir = std::env::temp_dir().join(format!("delayrelay-test-{}", std::process::id()));
        let (chain, key) = self_signed(&dir).unwrap();
        let addr = relay(&echo().await, 20, Some(acceptor(chain, key).unwrap())).await;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let t0 = Instant::now();
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let handshake = t0.elapsed();
        // TCP handshake round trip + TLS 1.3's one.
        assert!(ms(handshake) >= 80, "handshake took {handshake:?}");
        tls.write_all(b"hello").await.unwrap();
        tls.flush().await.unwrap();
        let mut b = [0u8; 5];
        tls.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");
        assert!(ms(t0.elapsed()) >= 120, "took {:?}", t0.elapsed());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_closed_upstream_closes_the_client() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        });
        let addr = relay(&up, 5, None).await;
        let mut c = TcpStream::connect(&addr).await.unwrap();
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
            .await
            .expect("the client side was not closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
}
