//! The syslog sink: one datagram per line, to the local unix socket or over UDP, framed as
//! RFC 3164 or RFC 5424.

use std::{fmt, io, net::UdpSocket, path::PathBuf, time::SystemTime};

use super::{Mark, StreamSettings, BUF_KEEP};
use crate::audit::{
    time::{format_time, format_time_3164},
    AuditError, Facility, SinkSpec, SyslogFormat,
};

/// Where syslog datagrams go.
#[derive(Debug, Clone)]
enum Dest {
    Unix(PathBuf),
    Udp(String),
}

#[derive(Debug)]
enum Sock {
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixDatagram),
    Udp(UdpSocket),
}

impl Dest {
    fn connect(&self) -> io::Result<Sock> {
        match self {
            #[cfg(unix)]
            Dest::Unix(path) => {
                let s = std::os::unix::net::UnixDatagram::unbound()?;
                s.connect(path)?;
                Ok(Sock::Unix(s))
            }
            #[cfg(not(unix))]
            Dest::Unix(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the local syslog socket needs a unix system",
            )),
            Dest::Udp(addr) => {
                use std::net::ToSocketAddrs;
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                for a in addr.to_socket_addrs()? {
                    let local: std::net::SocketAddr = if a.is_ipv4() {
                        ([0, 0, 0, 0], 0).into()
                    } else {
                        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                    };
                    match UdpSocket::bind(local).and_then(|s| s.connect(a).map(|()| s)) {
                        Ok(s) => return Ok(Sock::Udp(s)),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }
}

impl fmt::Display for Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dest::Unix(p) => write!(f, "{}", p.display()),
            Dest::Udp(a) => write!(f, "udp://{a}"),
        }
    }
}

impl Sock {
    fn send(&self, packet: &[u8]) -> io::Result<()> {
        let n = match self {
            #[cfg(unix)]
            Sock::Unix(s) => s.send(packet)?,
            Sock::Udp(s) => s.send(packet)?,
        };
        if n == packet.len() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::WriteZero, "short datagram"))
        }
    }
}

/// A syslog sink: one datagram per line.
#[derive(Debug)]
pub(crate) struct Syslog {
    hostname: String,
    pid: u32,
    facility: Facility,
    format: SyslogFormat,
    msgid: &'static str,
    dest: Dest,
    /// `None` after a failed reconnect; the next batch tries again.
    sock: Option<Sock>,
    packet: Vec<u8>,
}

/// The host name for syslog headers (`-` when unknown, as RFC 5424 says).
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(255)
        .collect();
    if name.is_empty() {
        "-".to_string()
    } else {
        name
    }
}

impl Syslog {
    /// Connects the socket now, so a bad path or address is a startup error.
    pub(super) fn open(s: &StreamSettings) -> Result<Syslog, AuditError> {
        let dest = match &s.spec {
            SinkSpec::SyslogUdp(addr) => Dest::Udp(addr.clone()),
            _ => Dest::Unix(s.socket.clone()),
        };
        let sock = dest.connect().map_err(|source| AuditError::Syslog {
            dest: dest.to_string(),
            source,
        })?;
        Ok(Syslog {
            hostname: hostname(),
            pid: std::process::id(),
            facility: s.facility,
            format: s.format,
            msgid: s.msgid,
            dest,
            sock: Some(sock),
            packet: Vec::new(),
        })
    }

    /// Where the datagrams go (for messages).
    pub(super) fn dest(&self) -> &impl fmt::Display {
        &self.dest
    }

    /// Sends each line (without its newline) as one datagram. A failed send reconnects once
    /// (syslogd restarted) and retries that line; a second failure ends the batch with the
    /// error (the remaining lines are lost and counted).
    pub(super) fn send(&mut self, buf: &[u8], marks: &[Mark]) -> io::Result<()> {
        let now = SystemTime::now();
        let mut header = String::with_capacity(96);
        let mut start = 0;
        for m in marks {
            let line = buf.get(start..m.end.saturating_sub(1)).unwrap_or_default();
            start = m.end;
            header.clear();
            self.header(now, m.severity, &mut header);
            self.packet.clear();
            self.packet.extend_from_slice(header.as_bytes());
            self.packet.extend_from_slice(line);
            let first = match &self.sock {
                Some(s) => s.send(&self.packet),
                None => Err(io::Error::new(io::ErrorKind::NotConnected, "not connected")),
            };
            if first.is_err() {
                self.sock = None;
                let s = self.dest.connect()?;
                s.send(&self.packet)?;
                self.sock = Some(s);
            }
        }
        if self.packet.capacity() > BUF_KEEP {
            self.packet = Vec::new();
        }
        Ok(())
    }

    fn header(&self, now: SystemTime, severity: u8, out: &mut String) {
        use std::fmt::Write as _;
        let pri = u32::from(self.facility.code()) * 8 + u32::from(severity);
        match self.format {
            SyslogFormat::Rfc5424 => {
                let _ = write!(out, "<{pri}>1 ");
                format_time(now, out);
                let _ = write!(
                    out,
                    " {} mongoguard {} {} - ",
                    self.hostname, self.pid, self.msgid
                );
            }
            SyslogFormat::Rfc3164 => {
                let _ = write!(out, "<{pri}>");
                format_time_3164(now, out);
                out.push(' ');
                if matches!(self.dest, Dest::Udp(_)) {
                    out.push_str(&self.hostname);
                    out.push(' ');
                }
                let _ = write!(out, "mongoguard[{}]: ", self.pid);
            }
        }
    }
}
