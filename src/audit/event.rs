//! The event stream: connections, authentication and policy reloads, one JSON object per
//! line, written by its own writer task (see [`AuditLog::event`](super::AuditLog::event)).
//!
//! Like violation records, events have no field for literal values, command bodies, SASL
//! payloads or passwords. They carry the client address (as violation records do), the
//! handshake's application and driver names, user names, and fixed reason words.

use std::{
    net::SocketAddr,
    time::{Duration, SystemTime},
};

use super::{json::ObjectWriter, time::format_time};

/// Why a client connection ended (a fixed word, never free text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client closed it.
    ClientClosed,
    /// `client_idle_timeout` passed.
    Idle,
    /// Shutdown (drain or the drain deadline).
    Shutdown,
    /// The client sent an invalid message, or its socket failed.
    ClientError,
    /// The upstream failed (unreachable, closed, invalid, timed out).
    UpstreamError,
    /// The connection was refused at accept (`max_client_connections`).
    Rejected,
    /// The session's task ended without a result (a bug in mongoguard): it is still
    /// accounted for and closed.
    Internal,
}

impl CloseReason {
    /// The word written in the event.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::ClientClosed => "client_closed",
            CloseReason::Idle => "idle_timeout",
            CloseReason::Shutdown => "shutdown",
            CloseReason::ClientError => "client_error",
            CloseReason::UpstreamError => "upstream_error",
            CloseReason::Rejected => "rejected",
            CloseReason::Internal => "internal_error",
        }
    }
}

/// Something that happened, for the event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A client connection was accepted.
    ConnectionOpened {
        /// The client's address.
        client: SocketAddr,
    },
    /// The client's first hello: who it says it is (client-controlled text, bounded).
    ClientHandshake {
        /// The client's address.
        client: SocketAddr,
        /// `client.application.name`.
        app: Option<String>,
        /// Driver name and version.
        driver: Option<String>,
    },
    /// A client connection ended.
    ConnectionClosed {
        /// The client's address.
        client: SocketAddr,
        /// How long it was open.
        duration: Duration,
        /// Why it ended.
        reason: CloseReason,
    },
    /// A client authenticated to mongoguard (pooled mode).
    AuthSucceeded {
        /// The client's address.
        client: SocketAddr,
        /// `db.name`.
        user: String,
        /// `SCRAM-SHA-256` or `SCRAM-SHA-1`.
        mechanism: &'static str,
        /// The upstream identity the user's requests run as.
        identity: String,
    },
    /// An authentication attempt failed (pooled mode). The user name is the one the client
    /// asked for, when its first message named one; nothing else of the exchange is kept.
    AuthFailed {
        /// The client's address.
        client: SocketAddr,
        /// `db.name` the client tried, when known.
        user: Option<String>,
    },
    /// The policy was reloaded.
    PolicyReloaded {
        /// `file:/path`.
        source: String,
        /// The new policy's hash.
        hash: Option<u64>,
        /// `"signal"`, `"file_change"` or `"admin"`.
        trigger: &'static str,
    },
    /// A reload was refused: the previous policy stays.
    PolicyReloadFailed {
        /// `file:/path`.
        source: String,
        /// Why (the policy loader's message: file, line, rule).
        error: String,
        /// `"signal"`, `"file_change"` or `"admin"`.
        trigger: &'static str,
    },
}

impl Event {
    /// The `event` field.
    pub fn name(&self) -> &'static str {
        match self {
            Event::ConnectionOpened { .. } => "connection_opened",
            Event::ClientHandshake { .. } => "client_handshake",
            Event::ConnectionClosed { .. } => "connection_closed",
            Event::AuthSucceeded { .. } => "auth_succeeded",
            Event::AuthFailed { .. } => "auth_failed",
            Event::PolicyReloaded { .. } => "policy_reloaded",
            Event::PolicyReloadFailed { .. } => "policy_reload_failed",
        }
    }

    /// The syslog severity: 3 err, 4 warning, 5 notice, 6 info.
    pub(crate) fn severity(&self) -> u8 {
        match self {
            Event::PolicyReloadFailed { .. } => 3,
            Event::AuthFailed { .. } => 4,
            Event::PolicyReloaded { .. } => 5,
            _ => 6,
        }
    }
}

/// An event with its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamped {
    pub time: SystemTime,
    pub event: Event,
}

/// One JSON line (without the newline): `time, event`, then the event's fields.
pub fn render_event(time: SystemTime, event: &Event) -> String {
    let mut out = String::with_capacity(160);
    render_event_into(time, event, &mut out);
    out
}

// Long because it is one arm per event kind, each the field list of that event's line;
// split, the line format of an event would be read in two places.
pub(crate) fn render_event_into(time: SystemTime, event: &Event, out: &mut String) {
    let mut t = String::with_capacity(24);
    format_time(time, &mut t);
    let mut o = ObjectWriter::new(out);
    o.str("time", &t);
    o.str("event", event.name());
    match event {
        Event::ConnectionOpened { client } => o.str("client", &client.to_string()),
        Event::ClientHandshake {
            client,
            app,
            driver,
        } => {
            o.str("client", &client.to_string());
            o.opt_str("app", app.as_deref());
            o.opt_str("driver", driver.as_deref());
        }
        Event::ConnectionClosed {
            client,
            duration,
            reason,
        } => {
            o.str("client", &client.to_string());
            o.num("duration_ms", duration.as_millis());
            o.str("reason", reason.as_str());
        }
        Event::AuthSucceeded {
            client,
            user,
            mechanism,
            identity,
        } => {
            o.str("client", &client.to_string());
            o.str("user", user);
            o.str("mechanism", mechanism);
            o.str("identity", identity);
        }
        Event::AuthFailed { client, user } => {
            o.str("client", &client.to_string());
            o.opt_str("user", user.as_deref());
        }
        Event::PolicyReloaded {
            source,
            hash,
            trigger,
        } => {
            o.str("source", source);
            if let Some(h) = hash {
                o.str("hash", &format!("{h:016x}"));
            }
            o.str("trigger", trigger);
        }
        Event::PolicyReloadFailed {
            source,
            error,
            trigger,
        } => {
            o.str("source", source);
            o.str("error", error);
            o.str("trigger", trigger);
        }
    }
    o.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_renders_as_one_json_object() {
        let client: SocketAddr = "10.1.2.3:40000".parse().unwrap();
        let events = [
            Event::ConnectionOpened { client },
            Event::ClientHandshake {
                client,
                app: Some("billing\n\"x".into()),
                driver: None,
            },
            Event::ConnectionClosed {
                client,
                duration: Duration::from_millis(1500),
                reason: CloseReason::Idle,
            },
            Event::AuthSucceeded {
                client,
                user: "admin.app".into(),
                mechanism: "SCRAM-SHA-256",
                identity: "default".into(),
            },
            Event::AuthFailed { client, user: None },
            Event::PolicyReloaded {
                source: "file:/etc/p.toml".into(),
                hash: Some(0xab),
                trigger: "signal",
            },
            Event::PolicyReloadFailed {
                source: "file:/etc/p.toml".into(),
                error: "bad".into(),
                trigger: "file_change",
            },
        ];
        for e in &events {
            let line = render_event(SystemTime::UNIX_EPOCH, e);
            assert!(!line.contains('\n'), "{line}");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["event"], e.name());
            assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        }
        let v: serde_json::Value =
            serde_json::from_str(&render_event(SystemTime::UNIX_EPOCH, &events[2])).unwrap();
        assert_eq!(v["duration_ms"], 1500);
        assert_eq!(v["reason"], "idle_timeout");
        assert_eq!(v["client"], "10.1.2.3:40000");
        let v: serde_json::Value =
            serde_json::from_str(&render_event(SystemTime::UNIX_EPOCH, &events[1])).unwrap();
        assert_eq!(v["app"], "billing\n\"x");
        assert!(v.get("driver").is_none());
        let v: serde_json::Value =
            serde_json::from_str(&render_event(SystemTime::UNIX_EPOCH, &events[5])).unwrap();
        assert_eq!(v["hash"], "00000000000000ab");
    }
}
