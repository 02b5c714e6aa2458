//! The policy file reloads while the proxy runs: a valid change takes effect on the next
//! request, an invalid one keeps the old policy (and is counted), never falls back to defaults.

use std::{sync::Arc, time::Duration};

use bson::rawdoc;
use futures::StreamExt;
use mongoguard::{
    app::Proxy,
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

#[tokio::test]
async fn policy_file_changes_are_validated_then_swapped() {
    let dir = std::env::temp_dir().join(format!("mg-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, "extends = \"standard\"\n").unwrap();

    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.policy.file = Some(file.clone());
    config.policy.reload_poll = Duration::from_millis(50);
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let addr = proxy.local_addr();
    let stats = proxy.stats();
    assert_eq!(
        delete_all_code(addr, 1).await,
        65001,
        "standard blocks W003"
    );

    // Audit mode: the same command is forwarded.
    std::fs::write(&file, "extends = \"standard\"\nmode = \"audit\"\n").unwrap();
    let mut reloaded = false;
    for _ in 0..400 {
        if stats.policy_reloads.get() >= 1 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reloaded, "the file change was not picked up");
    assert_eq!(delete_all_code(addr, 2).await, 0, "audit mode forwards");

    // An invalid file is refused; the audit policy stays in force.
    std::fs::write(&file, "extends = \"standard\"\n[rules]\nW003 = \"maybe\"\n").unwrap();
    let mut refused = false;
    for _ in 0..400 {
        if stats.policy_reload_failures.get() >= 1 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the invalid file was not noticed");
    assert_eq!(
        delete_all_code(addr, 3).await,
        0,
        "the previous (audit) policy is kept"
    );

    // A valid file again: enforcement is back.
    std::fs::write(&file, "extends = \"strict\"\n").unwrap();
    let mut reloaded = false;
    for _ in 0..400 {
        if stats.policy_reloads.get() >= 2 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reloaded, "the valid file was not picked up");
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
    let dir = std::env::temp_dir().join(format!("mg-reload-once-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.toml");
    std::fs::write(&file, "extends = \"standard\"\n").unwrap();
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut config = Config::for_upstream(&standin.uri()).unwrap();
    config.policy.file = Some(file.clone());
    config.policy.reload_poll = Duration::from_millis(20);
    config.audit.sink = mongoguard::audit::SinkSpec::None;
    let proxy = Proxy::start(Arc::new(config)).await.unwrap();
    let stats = proxy.stats();

    // Written whole at once (a rename), so there is one modification time to see.
    let write = |text: &str| {
        let tmp = dir.join("policy.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    write("extends = \"standard\"\n[rules]\nW003 = \"maybe\"\n");
    let mut refused = false;
    for _ in 0..1000 {
        if stats.policy_reload_failures.get() >= 1 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the invalid file was not noticed");
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
    let mut reloaded = false;
    for _ in 0..1000 {
        if stats.policy_reloads.get() >= 1 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reloaded, "the fixed file was not picked up");
    proxy.shutdown().await;
    standin.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
