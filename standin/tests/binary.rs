//! The `mongoguard-standin` binary: startup line, flags, clean exit on SIGTERM.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::doc;

#[cfg(unix)]
#[test]
fn binary_serves_and_exits_cleanly_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mongoguard-standin"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--wire-version",
            "17",
            "--user",
            "alice:s3cret",
            "--replica-set",
            "rs9",
            "--fault",
            "delay-ms:1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("mongoguard-standin listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&common::op_msg(
        1,
        0,
        &doc! {"hello": 1, "$db": "admin"},
        None,
    ))
    .unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    let len = i32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
    let mut frame = h.to_vec();
    frame.resize(len, 0);
    s.read_exact(&mut frame[16..]).unwrap();
    let reply = common::parse_reply(&frame);
    let hello = reply.doc();
    assert_eq!(hello.get_str("setName").unwrap(), "rs9");
    assert_eq!(hello.get_i32("maxWireVersion").unwrap(), 17);
    assert_eq!(hello.get_str("me").unwrap(), addr.to_string());

    // Unauthenticated data command.
    s.write_all(&common::op_msg(2, 0, &doc! {"find": "c", "$db": "x"}, None))
        .unwrap();
    s.read_exact(&mut h).unwrap();
    let len = i32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
    let mut frame = h.to_vec();
    frame.resize(len, 0);
    s.read_exact(&mut frame[16..]).unwrap();
    assert_eq!(
        common::parse_reply(&frame).doc().get_i32("code").unwrap(),
        13
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "stdout must hold exactly one line, got more: {rest:?}"
    );
}
