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

#[cfg(unix)]
#[test]
fn binary_runs_a_replica_set() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mongoguard-standin"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--replica-set",
            "rs3",
            "--members",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..4 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        lines.push(line.trim().to_string());
    }
    let mut addrs: Vec<SocketAddr> = vec![lines[0]
        .strip_prefix("mongoguard-standin listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {:?}", lines[0]))
        .parse()
        .unwrap()];
    for (i, line) in lines[1..3].iter().enumerate() {
        let prefix = format!("mongoguard-standin member {} listening on ", i + 1);
        addrs.push(
            line.strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                .parse()
                .unwrap(),
        );
    }
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines[3],
        format!(
            "mongoguard-standin replica set rs3 uri mongodb://{}/?replicaSet=rs3",
            hosts.join(",")
        )
    );

    let command = |addr: SocketAddr, body: bson::Document| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&common::op_msg(1, 0, &body, None)).unwrap();
        let mut h = [0u8; 16];
        s.read_exact(&mut h).unwrap();
        let len = i32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
        let mut frame = h.to_vec();
        frame.resize(len, 0);
        s.read_exact(&mut frame[16..]).unwrap();
        common::parse_reply(&frame).doc().clone()
    };
    let hello = command(addrs[2], doc! {"hello": 1, "$db": "admin"});
    assert_eq!(hello.get_str("me").unwrap(), hosts[2]);
    assert_eq!(hello.get_str("primary").unwrap(), hosts[0]);
    assert!(hello.get_bool("secondary").unwrap());
    let r = command(
        addrs[1],
        doc! {"standinStepDown": 1, "newPrimary": 2, "gapMs": 0, "$db": "admin"},
    );
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let hello = command(addrs[0], doc! {"hello": 1, "$db": "admin"});
    assert_eq!(hello.get_str("primary").unwrap(), hosts[2]);
    let stats = command(addrs[2], doc! {"standinStats": 1, "$db": "admin"});
    assert_eq!(stats.get_i32("member").unwrap(), 2);
    assert!(stats.get_bool("isWritablePrimary").unwrap());

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
    assert!(rest.is_empty(), "unexpected output {rest:?}");
}

#[test]
fn members_above_one_need_a_replica_set_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard-standin"))
        .args(["--listen", "127.0.0.1:0", "--members", "2"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard-standin"))
        .args(["--listen", "127.0.0.1:0", "--members", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
