//! `mongodb://` connection strings for the upstream.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// One `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Name or address (IPv6 without brackets).
    pub name: String,
    /// Port (27017 when omitted).
    pub port: u16,
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.contains(':') {
            write!(f, "[{}]:{}", self.name, self.port)
        } else {
            write!(f, "{}:{}", self.name, self.port)
        }
    }
}

/// A parsed `mongodb://[user:password@]host[:port][,host[:port]...][/[db]][?k=v&...]`.
/// Credentials are kept for the upstream identity but never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamUri {
    /// Seed hosts, in order.
    pub hosts: Vec<Host>,
    /// User name, percent-decoded.
    pub username: Option<String>,
    password: Option<String>,
    /// Default database / auth database from the path.
    pub database: Option<String>,
    /// Options, keys as written.
    pub options: Vec<(String, String)>,
}

impl UpstreamUri {
    /// The password, if any (never logged).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The first value of option `key` (case-insensitive, as drivers treat them).
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    /// `loadBalanced=true`: the one host is a load balancer in front of mongos (the load
    /// balancer specification): no monitoring, `loadBalanced: true` in every first hello.
    pub fn load_balanced(&self) -> bool {
        self.option("loadBalanced")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// The first seed (`None` only for a hand-built URI without hosts: parse() refuses one).
    pub fn primary_seed(&self) -> Option<&Host> {
        self.hosts.first()
    }
}

impl Default for UpstreamUri {
    fn default() -> Self {
        UpstreamUri {
            hosts: vec![Host {
                name: "127.0.0.1".into(),
                port: 27018,
            }],
            username: None,
            password: None,
            database: None,
            options: Vec::new(),
        }
    }
}

fn percent_decode(s: &str) -> Result<String, ConfigError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ConfigError::Uri("bad percent-escape".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConfigError::Uri("percent-escapes are not UTF-8".into()))
}

fn parse_host(text: &str) -> Result<Host, ConfigError> {
    let bad = || ConfigError::Uri(format!("bad host {text:?}"));
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (name, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        (name, port)
    } else {
        match text.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (text, None),
        }
    };
    if name.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?,
        None => 27017,
    };
    Ok(Host {
        name: name.to_owned(),
        port,
    })
}

impl FromStr for UpstreamUri {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        if s.starts_with("mongodb+srv://") {
            return Err(ConfigError::Uri(
                "mongodb+srv:// (DNS seed lists) is not supported; list the hosts".into(),
            ));
        }
        let rest = s
            .strip_prefix("mongodb://")
            .ok_or_else(|| ConfigError::Uri("must start with mongodb://".into()))?;
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((n, p)) => (Some(percent_decode(n)?), Some(percent_decode(p)?)),
                None => (Some(percent_decode(u)?), None),
            },
        };
        let hosts = hostlist
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>, _>>()?;
        let tail = tail.strip_prefix('/').unwrap_or(tail);
        let (db, query) = match tail.split_once('?') {
            Some((d, q)) => (d, q),
            None => (tail.trim_start_matches('?'), ""),
        };
        let db = if tail.starts_with('?') { "" } else { db };
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| ConfigError::Uri(format!("option {pair:?} has no value")))?;
            options.push((percent_decode(k)?, percent_decode(v)?));
        }
        Ok(UpstreamUri {
            hosts,
            username,
            password,
            database: (!db.is_empty()).then(|| db.to_owned()),
            options,
        })
    }
}

impl<'de> Deserialize<'de> for UpstreamUri {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Displays the URI with the password replaced by `***`.
impl fmt::Display for UpstreamUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mongodb://")?;
        if let Some(u) = &self.username {
            write!(f, "{u}")?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{h}")?;
        }
        f.write_str("/")?;
        if let Some(db) = &self.database {
            f.write_str(db)?;
        }
        for (i, (k, v)) in self.options.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { "?" } else { "&" })?;
        }
        Ok(())
    }
}

impl fmt::Debug for UpstreamUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UpstreamUri({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_shapes() {
        let u: UpstreamUri = "mongodb://127.0.0.1:27018".parse().unwrap();
        assert_eq!(
            u.hosts,
            vec![Host {
                name: "127.0.0.1".into(),
                port: 27018
            }]
        );
        let u: UpstreamUri = "mongodb://a,b:1,[::1]:2/?replicaSet=rs0&tls=true"
            .parse()
            .unwrap();
        assert_eq!(u.hosts.len(), 3);
        assert_eq!(u.hosts[0].port, 27017);
        assert_eq!(u.hosts[2].name, "::1");
        assert_eq!(u.option("replicaset"), Some("rs0"));
        let u: UpstreamUri = "mongodb://us%40r:p%3Ass@h/admin?authSource=admin"
            .parse()
            .unwrap();
        assert_eq!(u.username.as_deref(), Some("us@r"));
        assert_eq!(u.password(), Some("p:ss"));
        assert_eq!(u.database.as_deref(), Some("admin"));
    }

    #[test]
    fn password_never_displayed() {
        let u: UpstreamUri = "mongodb://u:secret@h:1".parse().unwrap();
        assert!(!u.to_string().contains("secret"));
        assert!(!format!("{u:?}").contains("secret"));
    }

    #[test]
    fn rejects_bad_uris() {
        for bad in [
            "http://h",
            "mongodb://",
            "mongodb://h:0",
            "mongodb://h:x",
            "mongodb+srv://c",
            "mongodb://h/?a",
        ] {
            assert!(bad.parse::<UpstreamUri>().is_err(), "{bad}");
        }
    }
}
