//! Client-chosen strings (key names, command names, application names,
//! collection names) are truncated in every log line and every error mongoguard makes: a
//! 100 KB string must not come back whole in an errmsg nor reach stderr whole. Today a
//! repeated 100 KB top-level key is copied verbatim into a WARN line ("client session
//! closed ... duplicate top-level key").

#[path = "support/hostile.rs"]
mod hostile;

use std::time::Duration;

use bson::{doc, Bson};
use hostile::{op_msg_raw, proxy_from_toml, raw_body, read_frame, temp_dir, Binary, RawClient};
use mongoguard::app::ProxyHandle;
use mongoguard_standin::{StandIn, StandInConfig};

const REPLY: Duration = Duration::from_secs(10);

async fn standin() -> StandIn {
    StandIn::start(StandInConfig::default())
        .await
        .expect("start the stand-in")
}

async fn passthrough(standin: &StandIn, extra_proxy: &str) -> ProxyHandle {
    proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n{extra_proxy}\n\
         [upstream]\nuri = \"{}\"\n\
         [admin]\nlisten = \"off\"\n",
        standin.uri()
    ))
    .await
}

const LONG: usize = 100 * 1024;

/// The commands carrying a 100 KB client string: a repeated top-level key, a repeated key in
/// a filter, an unknown command name, an application name.
fn long_string_commands() -> Vec<(&'static str, Vec<u8>)> {
    let key = "k".repeat(LONG);
    let top = raw_body(&[
        ("find", Bson::String("c".into())),
        (&key, Bson::Int32(1)),
        (&key, Bson::Int32(2)),
        ("$db", Bson::String("trunc".into())),
    ]);
    // {find: "c", filter: {K: 1, K: 2}, $db: "trunc"}, spliced by hand (a Document cannot
    // hold the repeat).
    let filter = {
        let inner = raw_body(&[(&key, Bson::Int32(1)), (&key, Bson::Int32(2))]);
        let head = raw_body(&[("find", Bson::String("c".into()))]);
        let tail = raw_body(&[("$db", Bson::String("trunc".into()))]);
        let mut elements = Vec::new();
        elements.extend_from_slice(&head[4..head.len() - 1]);
        elements.push(0x03); // embedded document
        elements.extend_from_slice(b"filter\0");
        elements.extend_from_slice(&inner);
        elements.extend_from_slice(&tail[4..tail.len() - 1]);
        let mut doc = ((elements.len() + 5) as i32).to_le_bytes().to_vec();
        doc.extend_from_slice(&elements);
        doc.push(0);
        doc
    };
    let name = format!("cmd{}", "n".repeat(LONG));
    let unknown = raw_body(&[
        (&name, Bson::Int32(1)),
        ("$db", Bson::String("trunc".into())),
    ]);
    let app = raw_body(&[
        ("hello", Bson::Int32(1)),
        (
            "client",
            Bson::Document(doc! {
                "application": {"name": "a".repeat(LONG)},
                "driver": {"name": "hostile", "version": "0"},
                "os": {"type": "linux"},
            }),
        ),
        ("$db", Bson::String("admin".into())),
    ]);
    // A delete of everything (blocked by the standard policy: mongoguard answers it) on a
    // 100 KB collection name.
    let blocked = raw_body(&[
        ("delete", Bson::String("c".repeat(LONG))),
        (
            "deletes",
            Bson::Array(vec![Bson::Document(doc! {"q": {}, "limit": 0})]),
        ),
        ("$db", Bson::String("trunc".into())),
    ]);
    vec![
        ("blocked command on a long collection name", blocked),
        ("repeated top-level key", top),
        ("repeated filter key", filter),
        ("unknown command name", unknown),
        ("application name", app),
    ]
}

/// Sends each command on its own connection; checks that the reply (if any) does not carry
/// the 100 KB string (errmsg under 2 KB, the whole reply under 4 KB).
async fn replies_are_truncated(addr: std::net::SocketAddr, mode: &str) {
    for (what, body) in long_string_commands() {
        if what == "unknown command name" {
            // Answered by the upstream (mongod too echoes the name in "no such command");
            // mongoguard relays upstream replies unchanged. Covered by the log test.
            continue;
        }
        let mut c = RawClient::connect(addr).await;
        c.send_bytes(&op_msg_raw(5, 0, &body))
            .await
            .expect("send the command");
        let frame = match read_frame(&mut c.stream, REPLY).await {
            Ok(f) => f,
            // mongoguard treats a repeated top-level key as a malformed message and closes the
            // connection (nothing is echoed then); the log test covers that path.
            Err(e) if what == "repeated top-level key" && e.contains("closed") => {
                println!("{mode}, {what}: connection closed without a reply");
                continue;
            }
            Err(e) => panic!("{mode}, {what}: {e}"),
        };
        let reply = hostile::body_of(&frame);
        let errmsg = reply.get_str("errmsg").unwrap_or("");
        assert!(
            errmsg.len() < 2048,
            "{mode}, {what}: errmsg of {} bytes",
            errmsg.len()
        );
        assert!(
            frame.len() < 4096,
            "{mode}, {what}: a reply of {} bytes echoes the client string",
            frame.len()
        );
        println!(
            "{mode}, {what}: {} byte reply, errmsg {} bytes",
            frame.len(),
            errmsg.len()
        );
    }
}

/// Fails today if the proxy echoes a client string into its error (the repeated key's name
/// is carried by WireError::DuplicateKey). Both modes, in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_strings_are_truncated_in_error_replies() {
    let standin = standin().await;
    let proxy = passthrough(&standin, "").await;
    replies_are_truncated(proxy.local_addr(), "passthrough").await;
    proxy.shutdown().await;
    let pooled = proxy_from_toml(&format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nmode = \"pooled\"\n\
         [upstream]\nuri = \"{}\"\n\
         [auth]\nallow_unauthenticated = true\n\
         [admin]\nlisten = \"off\"\n",
        standin.uri()
    ))
    .await;
    replies_are_truncated(pooled.local_addr(), "pooled").await;
    pooled.shutdown().await;
}

/// Fails today in passthrough: a 102,727-byte WARN line ("client session closed ... duplicate
/// top-level key \"kkkk...\""). Proves: with the binary at log level debug, no stderr line is
/// over 4 KB and no 100 KB client string appears whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_strings_are_truncated_in_log_lines_passthrough() {
    logs_are_truncated("passthrough").await;
}

/// The same in pooled mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_strings_are_truncated_in_log_lines_pooled() {
    logs_are_truncated("pooled").await;
}

async fn logs_are_truncated(mode: &str) {
    let standin = standin().await;
    {
        let dir = temp_dir("trunc-log");
        let path = dir.join("mongoguard.toml");
        let auth = if mode == "pooled" {
            "[auth]\nallow_unauthenticated = true\n"
        } else {
            ""
        };
        std::fs::write(
            &path,
            format!(
                "[proxy]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n\
                 [upstream]\nuri = \"{}\"\n{auth}\
                 [log]\nlevel = \"debug\"\n\
                 [admin]\nlisten = \"off\"\n\
                 [audit]\nsink = \"none\"\n",
                standin.uri()
            ),
        )
        .unwrap();
        let mut bin = Binary::start(&path);
        for (what, body) in long_string_commands() {
            let mut c = RawClient::connect(bin.addr).await;
            c.send_bytes(&op_msg_raw(5, 0, &body))
                .await
                .expect("send the command");
            // A reply or a close; either way the proxy has handled (and logged) it.
            let _ = read_frame(&mut c.stream, REPLY).await;
            println!("{mode}: sent the {what} case");
        }
        bin.signal("TERM");
        if bin.exited_within(Duration::from_secs(10)).is_none() {
            panic!("{mode}: mongoguard did not exit within 10 s of SIGTERM");
        }
        let lines = bin.all_stderr_lines();
        let longest = lines.iter().map(String::len).max().unwrap_or(0);
        let needles = ["k", "n", "a", "c"].map(|c| c.repeat(4096));
        // Every offending line is listed (its length and start), not only the first.
        let offending: Vec<String> = lines
            .iter()
            .filter(|l| l.len() > 4096 || needles.iter().any(|n| l.contains(n.as_str())))
            .map(|l| {
                let head: String = l.chars().take(200).collect();
                format!("{} bytes: {head}...", l.len())
            })
            .collect();
        println!(
            "{mode}: {} stderr lines, longest {longest} bytes",
            lines.len()
        );
        assert!(
            offending.is_empty(),
            "{mode}: {} stderr lines carry a 100 KB client string or exceed 4 KB:\n{}",
            offending.len(),
            offending.join("\n")
        );
    }
}
