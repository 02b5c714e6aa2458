//! The policy file reloads while the proxy runs: a valid change takes effect on the next
//! request, an invalid one keeps the old policy (and is counted), never falls back to defaults.

use std::{sync::Arc, time::Duration};

use bson::rawdoc;
use futures::StreamExt;
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
    wire::{builder::MsgBuilder, MessageCodec, OpMsg},
};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tokio_util::codec::FramedRead;

/// Sends a delete of everything (W003) and returns the reply's code (0 when forwarded).
async fn delete_all_code(addr: std::net::SocketAddr, id: i32) -> i32 {
    let (r, mut w) = TcpStream::connect(addr).await.unwrap().into_split();
    let mut read = FramedRead::new(r, MessageCodec::default());
    let cmd = rawdoc! {"delete": "t", "$db": "reload", "deletes": [{"q": {}, "limit": 0}]};
    w.write_all(&MsgBuilder::new(cmd).encode(id, 0))
        .await
        .unwrap();
    let frame = tokio::time::timeout(Duration::from_secs(20), read.next())
        .await
        .expect("reply")
        .expect("open")
        .expect("valid");
    let body = OpMsg::parse(frame.bytes()).unwrap().body().to_owned();
    body.get_i32("code").unwrap_or(0)
}

/// Waits (at most 10 s, polling every 10 ms) until `done` holds; panics with `what` otherwise.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}");
}

/// A stand-in and a proxy whose policy file (`standard` at first) is polled every `poll`, in
/// a fresh directory named after `name`: (directory, file, stand-in, proxy).
async fn proxy_with_policy_file(
    name: &str,
    poll: Duration,
) -> (std::path::PathBuf, std::path::PathBuf, StandIn, ProxyHandle) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, "extends = \"standard\"\n").unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.policy.file = Some(file.clone());
    config.policy.reload_poll = poll;
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    (dir, file, standin, proxy)
}

#[tokio::test]
async fn policy_file_changes_are_validated_then_swapped() {
    let (_dir, file, _standin, proxy) =
        proxy_with_policy_file("mg-reload", Duration::from_millis(50)).await;
    let addr = proxy.local_addr();
    let stats = proxy.stats();
    assert_eq!(
        delete_all_code(addr, 1).await,
        65001,
        "standard blocks W003"
    );

    // Audit mode: the same command is forwarded.
    std::fs::write(&file, "extends = \"standard\"\nmode = \"audit\"\n").unwrap();
    until("the file change was not picked up", || {
        stats.policy_reloads.get() >= 1
    })
    .await;
    assert_eq!(delete_all_code(addr, 2).await, 0, "audit mode forwards");

    // An invalid file is refused; the audit policy stays in force.
    std::fs::write(&file, "extends = \"standard\"\n[rules]\nW003 = \"maybe\"\n").unwrap();
    until("the invalid file was not noticed", || {
        stats.policy_reload_failures.get() >= 1
    })
    .await;
    assert_eq!(
        delete_all_code(addr, 3).await,
        0,
        "the previous (audit) policy is kept"
    );

    // A valid file again: enforcement is back.
    std::fs::write(&file, "extends = \"strict\"\n").unwrap();
    until("the valid file was not picked up", || {
        stats.policy_reloads.get() >= 2
    })
    .await;
    assert_eq!(delete_all_code(addr, 4).await, 65001);
    proxy.shutdown().await;
}

/// A policy file that stays invalid is refused once, not again at every other poll: the
/// mtime poll read it, failed, and since the failed file's mtime was never remembered it
/// saw a "change" again two polls later, forever (a warning, a `policy_reload_failed` event
/// and a counted failure every 4 s by default, for a file nobody touched). The next edit is
/// tried, and a SIGHUP still retries at once.
#[tokio::test]
async fn an_invalid_policy_file_is_refused_once_per_change() {
    let (dir, file, standin, proxy) =
        proxy_with_policy_file("mg-reload-once", Duration::from_millis(20)).await;
    let stats = proxy.stats();

    // Written whole at once (a rename), so there is one modification time to see.
    let write = |text: &str| {
        let tmp = dir.join("policy.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    write("extends = \"standard\"\n[rules]\nW003 = \"maybe\"\n");
    until("the invalid file was not noticed", || {
        stats.policy_reload_failures.get() >= 1
    })
    .await;
    // 50 more polls of the unchanged file.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        stats.policy_reload_failures.get(),
        1,
        "the same invalid file refused again and again"
    );
    // A SIGHUP (here its in-process equivalent) still tries it.
    proxy.hangup();
    assert_eq!(stats.policy_reload_failures.get(), 2);
    // And a fixed file is picked up.
    write("extends = \"standard\"\nmode = \"audit\"\n");
    until("the fixed file was not picked up", || {
        stats.policy_reloads.get() >= 1
    })
    .await;
    proxy.shutdown().await;
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
