//! `mongodb://` and `mongodb+srv://` connection strings for the upstream.
//!
//! A `mongodb+srv://NAME` URI names a DNS seed list (MongoDB's "Initial DNS Seedlist
//! Discovery" specification): it parses here with its `hosts` empty, and
//! `crate::upstream::srv` fills them in from the SRV records of `_{srvServiceName}._tcp.NAME`
//! (and merges the options of NAME's TXT record) before anything connects.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// One `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Name or address (IPv6 without brackets).
    pub name: std::sync::Arc<str>,
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

/// The host name of a `mongodb+srv://` URI, validated (see [`SrvName::parse`]), without a
/// trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvName(String);

/// Longest DNS name (RFC 1035 section 2.3.4, without the trailing dot).
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label (RFC 1035 section 2.3.4).
const MAX_LABEL_LEN: usize = 63;

impl SrvName {
    /// A host name for SRV lookups: dot-separated labels of letters, digits, `-` and `_`
    /// (the specification's own examples use `_`), each 1..=63 bytes, 253 at most in all, not
    /// starting or ending with `-`; not an IP address. One label (`localhost`) is allowed:
    /// since the 2024 revision of the seedlist specification a name of one or two labels is
    /// its own `{domainname}` and the SRV targets must then lie below it.
    pub fn parse(text: &str) -> Result<SrvName, ConfigError> {
        let bad = |why: &str| ConfigError::Uri(format!("mongodb+srv:// host {text:?}: {why}"));
        if text.is_empty() {
            return Err(bad("empty"));
        }
        if text.len() > MAX_NAME_LEN {
            return Err(bad("longer than 253 characters"));
        }
        if text.parse::<std::net::IpAddr>().is_ok() {
            return Err(bad("an IP address has no SRV records; use mongodb://"));
        }
        for label in text.split('.') {
            if label.is_empty() {
                return Err(bad("empty label"));
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(bad("a label is longer than 63 characters"));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(bad("a label starts or ends with '-'"));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(bad("only letters, digits, '-', '_' and '.' are allowed"));
            }
        }
        Ok(SrvName(text.to_ascii_lowercase()))
    }

    /// The name as given (lowercase, no trailing dot).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The number of labels.
    pub fn labels(&self) -> usize {
        self.0.split('.').count()
    }

    /// The specification's `{domainname}`: with three labels or more, the name without its
    /// first label; with one or two, the name itself.
    pub fn domain(&self) -> &str {
        if self.labels() >= 3 {
            self.0.split_once('.').map_or(self.0.as_str(), |(_, d)| d)
        } else {
            &self.0
        }
    }

    /// The SRV query name, `_{service}._tcp.{name}.` (fully qualified: no search domains).
    pub fn srv_query(&self, service: &str) -> String {
        format!("_{service}._tcp.{}.", self.0)
    }
}

impl fmt::Display for SrvName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `srvServiceName` when the URI does not set it.
pub const DEFAULT_SRV_SERVICE: &str = "mongodb";

/// A parsed `mongodb://[user:password@]host[:port][,host[:port]...][/[db]][?k=v&...]` or
/// `mongodb+srv://[user:password@]name[/[db]][?k=v&...]`.
/// Credentials are kept for the upstream identity but never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamUri {
    /// Seed hosts, in order. Empty for a `mongodb+srv://` URI until its name is resolved
    /// (`crate::upstream::srv::resolve`).
    pub hosts: Vec<Host>,
    /// `mongodb+srv://`: the name whose SRV records list the hosts.
    pub srv: Option<SrvName>,
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

    /// The first seed (`None` for a hand-built URI without hosts, and for a `mongodb+srv://`
    /// URI not resolved yet).
    pub fn primary_seed(&self) -> Option<&Host> {
        self.hosts.first()
    }

    /// `srvServiceName` (default `mongodb`).
    pub fn srv_service_name(&self) -> &str {
        self.option("srvServiceName").unwrap_or(DEFAULT_SRV_SERVICE)
    }

    /// `srvMaxHosts` (0, the default: no limit). Checked at parse time.
    pub fn srv_max_hosts(&self) -> usize {
        self.option("srvMaxHosts")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// TLS toward the upstream: `tls` / `ssl` set to `true`, or a `mongodb+srv://` URI that
    /// does not turn it off with `tls=false` / `ssl=false` (the seedlist specification makes
    /// TLS the default there; a TXT record cannot change it).
    pub fn tls_wanted(&self) -> bool {
        let flag = |key: &str| self.option(key).map(|v| v.eq_ignore_ascii_case("true"));
        match (flag("tls"), flag("ssl")) {
            (Some(true), _) | (_, Some(true)) => true,
            (Some(false), _) | (_, Some(false)) => false,
            (None, None) => self.srv.is_some(),
        }
    }

    /// The rules that need every option at hand: checked at parse time, and again once the
    /// TXT record's options are merged in (the specification validates after the lookups).
    pub fn validate_options(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError::Uri(m));
        let is_true = |key: &str| {
            self.option(key)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        };
        if self.srv.is_none() {
            // Seedlist specification, "URI Validation": the SRV options need an SRV URI.
            for key in ["srvServiceName", "srvMaxHosts"] {
                if self.option(key).is_some() {
                    return err(format!("{key} needs a mongodb+srv:// URI"));
                }
            }
            return Ok(());
        }
        if is_true("directConnection") {
            return err("directConnection=true cannot be used with mongodb+srv://".into());
        }
        if let Some(v) = self.option("loadBalanced") {
            if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                return err(format!("loadBalanced={v:?}: must be true or false"));
            }
        }
        // Connection-string rules for load balancing, reachable here through a TXT record.
        if is_true("loadBalanced") && self.option("replicaSet").is_some() {
            return err("loadBalanced=true cannot be combined with replicaSet".into());
        }
        if let Some(v) = self.option("srvMaxHosts") {
            if v.parse::<u32>().is_err() {
                return err(format!("srvMaxHosts={v:?}: must be a non-negative integer"));
            }
        }
        if let Some(service) = self.option("srvServiceName") {
            valid_service_name(service)?;
        }
        // "URI Validation": a positive srvMaxHosts excludes replicaSet and loadBalanced=true.
        if self.srv_max_hosts() > 0 {
            if self.option("replicaSet").is_some() {
                return err("srvMaxHosts cannot be combined with replicaSet".into());
            }
            if is_true("loadBalanced") {
                return err("srvMaxHosts cannot be combined with loadBalanced=true".into());
            }
        }
        Ok(())
    }
}

/// An SRV service name (RFC 6335 section 5.1: letters, digits and `-`, at least one letter,
/// no leading, trailing or doubled `-`), allowed past 15 characters up to the 62 that fit a
/// DNS label with the leading `_`, as the seedlist specification says of `srvServiceName`.
fn valid_service_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() < MAX_LABEL_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_alphabetic())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Uri(format!(
            "srvServiceName={name:?} is not a valid SRV service name"
        )))
    }
}

impl Default for UpstreamUri {
    fn default() -> Self {
        UpstreamUri {
            hosts: vec![Host {
                name: "127.0.0.1".into(),
                port: 27018,
            }],
            srv: None,
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
        name: name.into(),
        port,
    })
}

impl FromStr for UpstreamUri {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (rest, is_srv) = match (
            s.strip_prefix("mongodb://"),
            s.strip_prefix("mongodb+srv://"),
        ) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            (None, None) => {
                return Err(ConfigError::Uri(
                    "must start with mongodb:// or mongodb+srv://".into(),
                ))
            }
        };
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
        let (hosts, srv) = if is_srv {
            // Seedlist specification, "Validation Before Querying DNS": exactly one host
            // name and no port, refused before any lookup.
            if hostlist.contains(',') {
                return Err(ConfigError::Uri(
                    "mongodb+srv:// takes exactly one host name".into(),
                ));
            }
            if hostlist.contains(':') || hostlist.contains('[') {
                return Err(ConfigError::Uri(
                    "mongodb+srv:// takes no port (the SRV records give the ports)".into(),
                ));
            }
            (Vec::new(), Some(SrvName::parse(hostlist)?))
        } else {
            let hosts = hostlist
                .split(',')
                .map(parse_host)
                .collect::<Result<Vec<_>, _>>()?;
            (hosts, None)
        };
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
        let uri = UpstreamUri {
            hosts,
            srv,
            username,
            password,
            database: (!db.is_empty()).then(|| db.to_owned()),
            options,
        };
        uri.validate_options()?;
        Ok(uri)
    }
}

impl<'de> Deserialize<'de> for UpstreamUri {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Displays the URI with the password replaced by `***`; a `mongodb+srv://` URI shows its
/// name (resolved or not), not the hosts it resolved to.
impl fmt::Display for UpstreamUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.srv.is_some() {
            "mongodb+srv://"
        } else {
            "mongodb://"
        })?;
        if let Some(u) = &self.username {
            write!(f, "{u}")?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        if let Some(name) = &self.srv {
            write!(f, "{name}")?;
        } else {
            for (i, h) in self.hosts.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{h}")?;
            }
        }
        f.write_str("/")?;
        if let Some(db) = &self.database {
            f.write_str(db)?;
        }
        for (i, (k, v)) in self.options.iter().enumerate() {
            write!(f, "{}{k}=", if i == 0 { "?" } else { "&" })?;
            write_option_value(f, k, v)?;
        }
        Ok(())
    }
}

/// Options whose whole value is a secret (key file passwords).
const SECRET_OPTIONS: [&str; 2] = ["tlsCertificateKeyFilePassword", "sslPEMKeyPassword"];

/// An option's value as printed: secrets masked (a key file password; in
/// `authMechanismProperties`, the `AWS_SESSION_TOKEN`), the rest as given.
fn write_option_value(f: &mut fmt::Formatter<'_>, key: &str, value: &str) -> fmt::Result {
    if SECRET_OPTIONS.iter().any(|s| s.eq_ignore_ascii_case(key)) {
        return f.write_str(super::mask::MASK);
    }
    if !key.eq_ignore_ascii_case("authMechanismProperties") {
        return f.write_str(value);
    }
    for (i, prop) in value.split(',').enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        match prop.split_once(':') {
            Some((k, _)) if k.eq_ignore_ascii_case("AWS_SESSION_TOKEN") => {
                write!(f, "{k}:{}", super::mask::MASK)?;
            }
            _ => f.write_str(prop)?,
        }
    }
    Ok(())
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
        assert_eq!(&*u.hosts[2].name, "::1");
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
            "mongodb://h/?a",
            // The SRV options need an SRV URI.
            "mongodb://h/?srvServiceName=customname",
            "mongodb://h/?srvMaxHosts=1",
        ] {
            assert!(bad.parse::<UpstreamUri>().is_err(), "{bad}");
        }
    }

    fn srv_err(uri: &str) -> String {
        match uri.parse::<UpstreamUri>() {
            Ok(u) => panic!("{uri} parsed: {u:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_srv_uris() {
        let u: UpstreamUri =
            "mongodb+srv://us%40r:secret@Cluster0.Example.COM/app?authSource=admin"
                .parse()
                .unwrap();
        assert!(u.hosts.is_empty(), "hosts come from DNS");
        assert_eq!(u.primary_seed(), None);
        let name = u.srv.as_ref().unwrap();
        assert_eq!(name.as_str(), "cluster0.example.com");
        assert_eq!(name.domain(), "example.com");
        assert_eq!(
            name.srv_query(u.srv_service_name()),
            "_mongodb._tcp.cluster0.example.com."
        );
        assert_eq!(u.username.as_deref(), Some("us@r"));
        assert_eq!(u.database.as_deref(), Some("app"));
        assert_eq!(u.srv_max_hosts(), 0);
        // Display keeps the scheme and the name, masks the password, and parses back.
        let shown = u.to_string();
        assert_eq!(
            shown,
            "mongodb+srv://us@r:***@cluster0.example.com/app?authSource=admin"
        );
        assert!(!format!("{u:?}").contains("secret"));
        let again: UpstreamUri =
            "mongodb+srv://h.example.com/?srvServiceName=custom-db&srvMaxHosts=2"
                .parse()
                .unwrap();
        assert_eq!(again.srv_service_name(), "custom-db");
        assert_eq!(again.srv_max_hosts(), 2);
        assert_eq!(
            again.to_string().parse::<UpstreamUri>().unwrap(),
            again,
            "Display round-trips"
        );
        // One or two labels: the name is its own domain.
        for (name, domain) in [("localhost", "localhost"), ("mongo.local", "mongo.local")] {
            let u: UpstreamUri = format!("mongodb+srv://{name}").parse().unwrap();
            assert_eq!(u.srv.unwrap().domain(), domain);
        }
    }

    #[test]
    fn srv_defaults_to_tls() {
        let tls = |s: &str| s.parse::<UpstreamUri>().unwrap().tls_wanted();
        assert!(tls("mongodb+srv://a.b.c"));
        assert!(!tls("mongodb+srv://a.b.c/?tls=false"));
        assert!(!tls("mongodb+srv://a.b.c/?ssl=false"));
        assert!(tls("mongodb+srv://a.b.c/?tls=true"));
        assert!(!tls("mongodb://h"));
        assert!(tls("mongodb://h/?ssl=true"));
    }

    #[test]
    fn refuses_bad_srv_uris() {
        for (uri, why) in [
            ("mongodb+srv://a.b.c:27017", "no port"),
            ("mongodb+srv://a.b.c,d.b.c", "exactly one host"),
            ("mongodb+srv://[::1]", "no port"),
            ("mongodb+srv://127.0.0.1", "IP address"),
            ("mongodb+srv://", "empty"),
            ("mongodb+srv://a..c", "empty label"),
            ("mongodb+srv://-a.b.c", "'-'"),
            ("mongodb+srv://a.b$.c", "only letters"),
            (
                &format!("mongodb+srv://{}.b.c", "x".repeat(64)),
                "longer than 63",
            ),
            (
                &format!("mongodb+srv://{}", ["abcdefghi"; 26].join(".")),
                "longer than 253",
            ),
            (
                "mongodb+srv://a.b.c/?directConnection=true",
                "directConnection",
            ),
            ("mongodb+srv://a.b.c/?srvMaxHosts=-1", "non-negative"),
            ("mongodb+srv://a.b.c/?srvMaxHosts=x", "non-negative"),
            (
                "mongodb+srv://a.b.c/?srvMaxHosts=1&replicaSet=rs",
                "replicaSet",
            ),
            (
                "mongodb+srv://a.b.c/?srvMaxHosts=1&loadBalanced=true",
                "loadBalanced",
            ),
            ("mongodb+srv://a.b.c/?loadBalanced=yes", "true or false"),
            (
                "mongodb+srv://a.b.c/?loadBalanced=true&replicaSet=rs",
                "cannot be combined with replicaSet",
            ),
            ("mongodb+srv://a.b.c/?srvServiceName=a_b", "service name"),
            ("mongodb+srv://a.b.c/?srvServiceName=-ab", "service name"),
            ("mongodb+srv://a.b.c/?srvServiceName=123", "service name"),
        ] {
            let e = srv_err(uri);
            assert!(e.contains(why), "{uri}: {e}");
        }
        // What the rules allow.
        for ok in [
            "mongodb+srv://a.b.c/?directConnection=false",
            "mongodb+srv://a.b.c/?srvMaxHosts=0&replicaSet=rs",
            "mongodb+srv://a.b.c/?srvMaxHosts=3&loadBalanced=false",
            "mongodb+srv://cluster_1.tests.mongodb.co.uk",
        ] {
            ok.parse::<UpstreamUri>()
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    /// The URI is printed in the startup log line and by `--check-config` ("secrets
    /// masked"): the password was masked, but URI options that carry secrets were printed
    /// as given (a driver URI copied with MONGODB-AWS session token or a key file password).
    #[test]
    fn secret_options_are_masked_when_printed() {
        let u: UpstreamUri = "mongodb://u:pw@h:1/?authMechanism=MONGODB-AWS\
            &authMechanismProperties=AWS_SESSION_TOKEN:SECRETTOKEN\
            &tlsCertificateKeyFilePassword=KEYPASS&sslPEMKeyPassword=PEMPASS&replicaSet=rs0"
            .parse()
            .unwrap();
        let shown = u.to_string();
        for secret in ["pw", "SECRETTOKEN", "KEYPASS", "PEMPASS"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("replicaSet=rs0"), "{shown}");
        assert!(
            shown.contains("tlsCertificateKeyFilePassword=***"),
            "{shown}"
        );
        assert!(format!("{u:?}").contains("***"));
        // The options themselves are kept for whoever reads them.
        assert_eq!(
            u.option("authMechanismProperties"),
            Some("AWS_SESSION_TOKEN:SECRETTOKEN")
        );
    }
}
