//! A tiny authoritative DNS server on UDP for the `mongodb+srv://` tests: SRV, TXT and A
//! records from a table the test changes while it runs; NXDOMAIN for a name it does not
//! know, an empty NOERROR answer for a known name without records of the asked type.
//! Messages are encoded by hand (RFC 1035 section 4, SRV data per RFC 2782). Answers are
//! kept small, so UDP suffices (nothing is ever truncated).

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

const TYPE_A: u16 = 1;
const TYPE_TXT: u16 = 16;
const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;
const RCODE_NXDOMAIN: u16 = 3;

/// The records served. Names are lowercase, without the trailing dot.
#[derive(Default)]
pub struct Zone {
    /// SRV: name -> (port, target) per record.
    pub srv: HashMap<String, Vec<(u16, String)>>,
    /// TXT: name -> records, each a list of strings.
    pub txt: HashMap<String, Vec<Vec<String>>>,
    /// A: name -> address.
    pub a: HashMap<String, Ipv4Addr>,
    /// The TTL of every answer.
    pub ttl: u32,
}

impl Zone {
    fn knows(&self, name: &str) -> bool {
        self.srv.contains_key(name) || self.txt.contains_key(name) || self.a.contains_key(name)
    }
}

/// A running stub; stops when dropped.
pub struct DnsStub {
    addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    /// (name, type) of every query received, in order.
    log: Arc<Mutex<Vec<(String, u16)>>>,
    stop: Arc<AtomicBool>,
}

impl DnsStub {
    /// Serves an empty zone on 127.0.0.1 (a free port).
    pub fn start() -> DnsStub {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind the DNS stub");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let zone = Arc::new(Mutex::new(Zone::default()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (z, l, s) = (zone.clone(), log.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if let Some((reply, name, qtype)) = answer(&buf[..n], &z.lock().unwrap()) {
                    l.lock().unwrap().push((name, qtype));
                    let _ = socket.send_to(&reply, peer);
                }
            }
        });
        DnsStub {
            addr,
            zone,
            log,
            stop,
        }
    }

    /// Where it listens (`upstream.dns_server`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the SRV records of `name` (`targets` empty: none).
    pub fn set_srv(&self, name: &str, targets: &[(&str, u16)]) {
        let records = targets.iter().map(|(t, p)| (*p, t.to_string())).collect();
        self.zone.lock().unwrap().srv.insert(name.into(), records);
    }

    /// Replaces the TXT records of `name` (one string each).
    pub fn set_txt(&self, name: &str, records: &[&str]) {
        let records = records.iter().map(|r| vec![r.to_string()]).collect();
        self.zone.lock().unwrap().txt.insert(name.into(), records);
    }

    /// Replaces the TXT records of `name`, each made of several strings.
    pub fn set_txt_strings(&self, name: &str, records: &[&[&str]]) {
        let records = records
            .iter()
            .map(|r| r.iter().map(|s| s.to_string()).collect())
            .collect();
        self.zone.lock().unwrap().txt.insert(name.into(), records);
    }

    /// Sets the A record of `name`.
    pub fn set_a(&self, name: &str, ip: Ipv4Addr) {
        self.zone.lock().unwrap().a.insert(name.into(), ip);
    }

    /// How many queries of `qtype` for `name` arrived.
    pub fn queries(&self, name: &str, qtype: u16) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, t)| n == name && *t == qtype)
            .count()
    }

    /// SRV queries for `name` so far.
    pub fn srv_queries(&self, name: &str) -> usize {
        self.queries(name, TYPE_SRV)
    }
}

impl Drop for DnsStub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The reply to one query message, with the queried name and type; `None` for garbage.
fn answer(q: &[u8], zone: &Zone) -> Option<(Vec<u8>, String, u16)> {
    let u16_at = |i: usize| Some(u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]));
    if u16_at(4)? != 1 {
        return None; // exactly one question
    }
    // QNAME: labels up to the root (queries carry no compression).
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let name = labels.join(".");
    let qtype = u16_at(i)?;
    let question_end = i + 4;
    let mut rdatas: Vec<(u16, Vec<u8>)> = Vec::new();
    match qtype {
        TYPE_SRV => {
            for (port, target) in zone.srv.get(&name).into_iter().flatten() {
                let mut d = Vec::new();
                d.extend_from_slice(&0u16.to_be_bytes()); // priority
                d.extend_from_slice(&0u16.to_be_bytes()); // weight
                d.extend_from_slice(&port.to_be_bytes());
                encode_name(&mut d, target);
                rdatas.push((TYPE_SRV, d));
            }
        }
        TYPE_TXT => {
            for strings in zone.txt.get(&name).into_iter().flatten() {
                let mut d = Vec::new();
                for s in strings {
                    d.push(u8::try_from(s.len()).expect("TXT string over 255 bytes"));
                    d.extend_from_slice(s.as_bytes());
                }
                rdatas.push((TYPE_TXT, d));
            }
        }
        TYPE_A => {
            if let Some(ip) = zone.a.get(&name) {
                rdatas.push((TYPE_A, ip.octets().to_vec()));
            }
        }
        _ => {}
    }
    let rcode = if zone.knows(&name) { 0 } else { RCODE_NXDOMAIN };
    let mut r = Vec::with_capacity(512);
    r.extend_from_slice(q.get(0..2)?); // id
                                       // QR, AA, the query's RD, RA; rcode.
    let flags = 0x8000 | 0x0400 | (u16_at(2)? & 0x0100) | 0x0080 | rcode;
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes()); // QDCOUNT
    r.extend_from_slice(&u16::try_from(rdatas.len()).unwrap().to_be_bytes()); // ANCOUNT
    r.extend_from_slice(&0u16.to_be_bytes()); // NSCOUNT
    r.extend_from_slice(&0u16.to_be_bytes()); // ARCOUNT
    r.extend_from_slice(q.get(12..question_end)?); // the question, as asked
    for (rtype, data) in rdatas {
        r.extend_from_slice(&0xC00Cu16.to_be_bytes()); // the name: a pointer to the question's
        r.extend_from_slice(&rtype.to_be_bytes());
        r.extend_from_slice(&CLASS_IN.to_be_bytes());
        r.extend_from_slice(&zone.ttl.to_be_bytes());
        r.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        r.extend_from_slice(&data);
    }
    assert!(r.len() <= 512, "the stub's answers must fit plain UDP");
    Some((r, name, qtype))
}

fn encode_name(out: &mut Vec<u8>, name: &str) {
    for label in name.trim_end_matches('.').split('.') {
        out.push(u8::try_from(label.len()).unwrap());
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
}
