//! The real binary with a standard error nobody reads (a stuck journald, `| tee` to a full
//! disk): logging must never hold a request or the shutdown. And colour only on a terminal.
//!
//! The proxy runs as a child process, in passthrough mode with the stand-in as upstream, at
//! `--log-level debug` so that every connection produces log lines.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use bson::rawdoc;
use futures::StreamExt;
use mongoguard::wire::{builder::MsgBuilder, MessageCodec, OpMsg};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::{Child, Command},
};
use tokio_util::codec::FramedRead;

/// Upper bound on one wait (a safety net against hangs, not a performance assertion).
const BOUND: Duration = Duration::from_secs(20);
/// `[proxy] drain_timeout` of the child.
const DRAIN: Duration = Duration::from_secs(2);
/// What exit may take beyond the drain: the audit close, the runtime's shutdown and the log
/// flush are each bounded by a few seconds.
const EXIT_MARGIN: Duration = Duration::from_secs(8);

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("mongoguard-logging-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A free loopback port (bound then released; the child binds it next).
fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct Proxy {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
}

/// Starts the binary with `extra` configuration (the [proxy] listen address, the admin
/// listener and the upstream are added here), `stdout` and `stderr`; returns once it accepts.
async fn spawn(dir: &Path, upstream: &str, extra: &str, stdout: Stdio, stderr: Stdio) -> Proxy {
    spawn_at("debug", dir, upstream, extra, stdout, stderr).await
}

/// [`spawn`] at `--log-level level`.
async fn spawn_at(
    level: &str,
    dir: &Path,
    upstream: &str,
    extra: &str,
    stdout: Stdio,
    stderr: Stdio,
) -> Proxy {
    let listen = free_addr();
    let admin = free_addr();
    let config = dir.join("mongoguard.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nlisten = \"{listen}\"\ndrain_timeout = \"{}s\"\n\
             [upstream]\nuri = \"{upstream}\"\n[admin]\nlisten = \"{admin}\"\n{extra}",
            DRAIN.as_secs()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
        .arg("--config")
        .arg(&config)
        .args(["--log-level", level])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + BOUND;
    while TcpStream::connect(listen).await.is_err() {
        assert!(Instant::now() < deadline, "the proxy never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Proxy {
        child,
        listen,
        admin,
    }
}

impl Proxy {
    /// SIGTERM, then the exit status within `drain_timeout` + the margin (`None`: still
    /// running then; it is killed).
    async fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().unwrap().to_string();
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(kill.success());
        let start = Instant::now();
        match tokio::time::timeout(DRAIN + EXIT_MARGIN, self.child.wait()).await {
            Ok(status) => {
                eprintln!("exited {:?} after SIGTERM", start.elapsed());
                Some(status.unwrap())
            }
            Err(_) => {
                let _ = self.child.start_kill();
                None
            }
        }
    }
}

/// One client: connect, ping, read the reply, close.
async fn ping(addr: SocketAddr, id: i32) {
    let (r, mut w) = TcpStream::connect(addr).await.unwrap().into_split();
    let mut read = FramedRead::new(r, MessageCodec::default());
    w.write_all(&MsgBuilder::new(rawdoc! {"ping": 1, "$db": "admin"}).encode(id, 0))
        .await
        .unwrap();
    let frame = read.next().await.expect("a reply").expect("a valid frame");
    let body = OpMsg::parse(frame.bytes()).unwrap().body().to_owned();
    assert_eq!(
        body.get_f64("ok")
            .ok()
            .or(body.get_i32("ok").ok().map(f64::from)),
        Some(1.0)
    );
}

/// `GET /metrics` on the admin listener; the value of the first sample named `name`.
async fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        (series == name).then(|| value.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stderr_never_stalls_clients_or_shutdown() {
    let dir = temp_dir("stuck");
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    // Pipes whose read ends are kept open and never read: once a buffer (64 KiB on Linux)
    // is full, every write to it blocks. stdout too, as under journald, where both go.
    let mut proxy = spawn(
        &dir,
        &standin.uri(),
        "[audit]\nsink = \"none\"\n",
        Stdio::piped(),
        Stdio::piped(),
    )
    .await;
    let unread = (
        proxy.child.stdout.take().unwrap(),
        proxy.child.stderr.take().unwrap(),
    );

    // 50 at a time: at debug level each client logs two lines (about 170 bytes each); in all
    // far more than the pipe buffer (about 400 lines) and the log queue hold together.
    const CLIENTS: i32 = mongoguard::logging::QUEUE_LINES as i32 / 2 + 1000;
    let start = Instant::now();
    let all = futures::stream::iter(0..CLIENTS)
        .map(|i| ping(proxy.listen, i + 1))
        .buffer_unordered(50)
        .collect::<Vec<()>>();
    let completed = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .is_ok();
    if !completed {
        // Still check the other half: does SIGTERM stop it?
        let status = proxy.terminate().await;
        panic!(
            "{CLIENTS} clients did not complete within 60 s: logging blocked the proxy; \
             after SIGTERM: {}",
            status.map_or("still running (killed)".into(), |s| format!("{s}"))
        );
    }
    eprintln!("{CLIENTS} clients in {:?}", start.elapsed());

    let dropped = tokio::time::timeout(
        BOUND,
        metric(proxy.admin, "mongoguard_log_lines_dropped_total"),
    )
    .await
    .expect("the admin listener answers")
    .expect("the metric is exported");
    eprintln!("log lines dropped: {dropped}");
    assert!(
        dropped > 0.0,
        "nothing dropped: the test did not fill the queue"
    );

    let status = proxy.terminate().await;
    assert!(
        status.is_some_and(|s| s.success()),
        "after SIGTERM: {status:?} (None: still running after {:?})",
        DRAIN + EXIT_MARGIN
    );
    drop(unread);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_colour_when_stderr_is_not_a_terminal() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let text = stderr_of_clients("colour", "debug", &standin, 1).await;
    assert!(text.contains("mongoguard stopped"), "{text}");
    assert!(!text.contains('\u{1b}'), "escape codes in a file: {text}");
}

/// Runs the binary at `level` with standard error in a file, `clients` pings, then SIGTERM
/// (it must exit cleanly); returns what it wrote to standard error.
async fn stderr_of_clients(name: &str, level: &str, standin: &StandIn, clients: i32) -> String {
    let dir = temp_dir(name);
    let log = dir.join("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut proxy = spawn_at(
        level,
        &dir,
        &standin.uri(),
        "[audit]\nsink = \"none\"\n",
        Stdio::null(),
        file.into(),
    )
    .await;
    for id in 1..=clients {
        ping(proxy.listen, id).await;
    }
    let status = proxy.terminate().await;
    assert!(status.is_some_and(|s| s.success()), "{level}: {status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

/// The level is honoured by both filters mongoguard uses: a level or `target=level` list
/// (filtered per callsite) and a span directive (filtered by `EnvFilter`). Each run: three
/// clients, then SIGTERM; the lines at DEBUG are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_level_is_honoured_by_either_filter() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut debug_lines = Vec::new();
    for (i, level) in [
        "info",
        "warn,mongoguard::proxy=debug",
        "info,[client]=debug",
    ]
    .into_iter()
    .enumerate()
    {
        let text = stderr_of_clients(&format!("level{i}"), level, &standin, 3).await;
        let count = text.lines().filter(|l| l.contains("DEBUG")).count();
        debug_lines.push((level, count, text));
    }
    let [(_, info, info_text), (_, target, target_text), (_, span, span_text)] = &debug_lines[..]
    else {
        unreachable!()
    };
    assert_eq!(*info, 0, "DEBUG lines at info: {info_text}");
    assert!(
        info_text.contains("INFO"),
        "no INFO line at info: {info_text}"
    );
    assert!(
        *target >= 3,
        "mongoguard::proxy=debug: {target} DEBUG lines: {target_text}"
    );
    assert!(
        !target_text.contains("mongoguard listening"),
        "an INFO line of mongoguard::app under warn: {target_text}"
    );
    assert!(
        *span >= 3,
        "[client]=debug: {span} DEBUG lines: {span_text}"
    );
}
