//! `mongodb+srv://` upstreams: the hosts from DNS SRV records, default options from a TXT
//! record, and the periodic rescan of a mongos list.
//!
//! Rules implemented, from MongoDB's specifications (cited by section, not quoted):
//!
//! - *Initial DNS Seedlist Discovery*, "Querying DNS": SRV records of
//!   `_{srvServiceName}._tcp.{hostname}`; priority and weight ignored; no records or a DNS
//!   error is an error naming the reason; every target must lie in the name's
//!   `{domainname}`, and below the name itself when it has fewer than three labels
//!   ([`verify_target`]); `srvMaxHosts` takes a random subset (Fisher–Yates, [`choose`]).
//! - Same, "Default Connection String Options": at most one TXT record on `{hostname}`, its
//!   strings concatenated; only `authSource`, `replicaSet` and `loadBalanced` in it; the URI's
//!   own options win ([`parse_txt`], [`merge_txt`]); the URI rules are checked again after the
//!   merge ("URI Validation").
//! - *Polling SRV Records for mongos Discovery*: only without `replicaSet` (and not
//!   load-balanced); rescan every `rescanSRVIntervalMS` = the smallest TTL of the last answer,
//!   never below the floor (`upstream.srv_poll_interval`, 60 s by default, the specification's
//!   floor); targets outside the domain are skipped with a warning, not an error; a failed or
//!   empty rescan changes nothing and the next one comes after `heartbeat_interval`; hosts
//!   still listed are left alone, vanished ones removed, new ones added up to `srvMaxHosts`
//!   ([`plan`]).
//!
//! SRV targets are host names. With the system resolver configuration they are connected to
//! like any host name (the OS resolves them, as it would for a `mongodb://` URI). With
//! `upstream.dns_server`, the operator has named the server that knows these names, so the
//! targets' addresses are looked up there too at each connect ([`register_targets`], used
//! by `crate::upstream::connect_tcp`), and the name stays the TLS server name.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, LazyLock, PoisonError, RwLock},
    time::Duration,
};

use hickory_resolver::{
    config::{ConnectionConfig, NameServerConfig, ResolverConfig},
    net::runtime::TokioRuntimeProvider,
    proto::rr::RData,
    TokioResolver,
};
use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{ConfigError, Host, SrvName, UpstreamConfig, UpstreamUri};

use super::topology::Topology;

/// Why a `mongodb+srv://` URI could not be turned into hosts.
#[derive(Debug, thiserror::Error)]
#[error("{uri}: {reason}")]
pub struct SrvError {
    /// The URI (password masked).
    pub uri: String,
    /// What went wrong.
    pub reason: String,
}

/// A resolver for `dns_server` (`None`: the system configuration).
pub fn resolver(dns_server: Option<SocketAddr>) -> Result<TokioResolver, String> {
    let builder = match dns_server {
        Some(addr) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = addr.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = addr.port();
            let server = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![server]),
                TokioRuntimeProvider::default(),
            )
        }
        None => TokioResolver::builder_tokio()
            .map_err(|e| format!("cannot read the system resolver configuration: {e}"))?,
    };
    builder
        .build()
        .map_err(|e| format!("cannot build the DNS resolver: {e}"))
}

/// The outcome of one SRV lookup: the targets (unverified) and the smallest TTL.
#[derive(Debug, Clone)]
pub struct SrvAnswer {
    /// `target:port` of every record, in the order received, target without trailing dot.
    pub targets: Vec<Host>,
    /// The smallest TTL of the records.
    pub min_ttl: Option<Duration>,
}

/// Looks up the SRV records of `_{service}._tcp.{name}`.
pub async fn lookup_srv(
    resolver: &TokioResolver,
    name: &SrvName,
    service: &str,
) -> Result<SrvAnswer, String> {
    let query = name.srv_query(service);
    let shown = query.trim_end_matches('.');
    let lookup = match resolver.srv_lookup(query.as_str()).await {
        Ok(l) => l,
        Err(e) if e.is_no_records_found() => return Err(format!("no SRV records for {shown}")),
        Err(e) => return Err(format!("SRV lookup of {shown} failed: {e}")),
    };
    let mut targets = Vec::new();
    let mut min_ttl: Option<u32> = None;
    for record in lookup.answers() {
        // Priority and weight are ignored ("Querying DNS").
        if let RData::SRV(srv) = &record.data {
            let target = srv.target.to_ascii();
            targets.push(Host {
                name: target.trim_end_matches('.').to_ascii_lowercase().into(),
                port: srv.port,
            });
            min_ttl = Some(min_ttl.map_or(record.ttl, |t| t.min(record.ttl)));
        }
    }
    if targets.is_empty() {
        return Err(format!("no SRV records for {shown}"));
    }
    Ok(SrvAnswer {
        targets,
        min_ttl: min_ttl.map(|t| Duration::from_secs(u64::from(t))),
    })
}

/// Looks up the TXT records of `name`: each record's strings concatenated ("Default
/// Connection String Options"); none is not an error.
pub async fn lookup_txt(resolver: &TokioResolver, name: &SrvName) -> Result<Vec<String>, String> {
    let query = format!("{name}.");
    let lookup = match resolver.txt_lookup(query.as_str()).await {
        Ok(l) => l,
        Err(e) if e.is_no_records_found() => return Ok(Vec::new()),
        Err(e) => return Err(format!("TXT lookup of {name} failed: {e}")),
    };
    Ok(lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(txt) => Some(
                txt.txt_data
                    .iter()
                    .map(|s| String::from_utf8_lossy(s))
                    .collect::<String>(),
            ),
            _ => None,
        })
        .collect())
}

/// The options allowed in a TXT record ("Default Connection String Options").
const TXT_OPTIONS: [&str; 3] = ["authSource", "replicaSet", "loadBalanced"];

/// The options of the TXT records of a name: at most one record, `k=v&k=v` (percent-escapes
/// decoded), only [`TXT_OPTIONS`].
pub fn parse_txt(records: &[String]) -> Result<Vec<(String, String)>, String> {
    let record = match records {
        [] => return Ok(Vec::new()),
        [one] => one,
        _ => {
            return Err(format!(
                "{} TXT records; at most one is allowed",
                records.len()
            ))
        }
    };
    // Parsed as a URI's query, with the URI parser's own escape and format rules.
    let probe: UpstreamUri = format!("mongodb://txt/?{record}")
        .parse()
        .map_err(|e: ConfigError| format!("TXT record {record:?}: {e}"))?;
    for (k, _) in &probe.options {
        if !TXT_OPTIONS.iter().any(|o| o.eq_ignore_ascii_case(k)) {
            return Err(format!(
                "TXT record option {k:?} is not allowed (only authSource, replicaSet, \
                 loadBalanced)"
            ));
        }
    }
    Ok(probe.options)
}

/// `uri` with the TXT options it does not set itself (the URI wins).
pub fn merge_txt(uri: &UpstreamUri, txt: Vec<(String, String)>) -> UpstreamUri {
    let mut out = uri.clone();
    for (k, v) in txt {
        if out.option(&k).is_none() {
            out.options.push((k, v));
        }
    }
    out
}

/// Checks an SRV target against the name ("Querying DNS"): it must end with `.{domainname}`;
/// for a name of fewer than three labels (its own domain) that also means at least one label
/// more than the name, so the name itself is refused as a target.
pub fn verify_target(name: &SrvName, target: &str) -> Result<(), String> {
    let domain = name.domain();
    let target = target.trim_end_matches('.').to_ascii_lowercase();
    let inside = target
        .strip_suffix(domain)
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'));
    if inside {
        Ok(())
    } else {
        Err(format!(
            "SRV target {target} is not in the domain {domain} of {name}"
        ))
    }
}

/// `hosts`, or `max` of them picked at random (Fisher–Yates) when `max` is above zero and
/// below their number.
pub fn choose(mut hosts: Vec<Host>, max: usize) -> Vec<Host> {
    if max == 0 || max >= hosts.len() {
        return hosts;
    }
    hosts.shuffle(&mut rand::rng());
    hosts.truncate(max);
    hosts
}

/// One rescan's changes: the current hosts no longer listed go, the listed new ones come,
/// up to `max` hosts in all (0: no limit), picked at random; the hosts that stay are left
/// alone.
pub fn plan(current: &[Host], valid: &[Host], max: usize) -> (Vec<Host>, Vec<Host>) {
    let remove: Vec<Host> = current
        .iter()
        .filter(|h| !valid.contains(h))
        .cloned()
        .collect();
    let kept = current.len() - remove.len();
    let mut new: Vec<Host> = Vec::new();
    for h in valid {
        if !current.contains(h) && !new.contains(h) {
            new.push(h.clone());
        }
    }
    let add = match max.saturating_sub(kept) {
        _ if max == 0 => new,
        0 => Vec::new(),
        room => choose(new, room),
    };
    (remove, add)
}

/// `rescanSRVIntervalMS` (polling specification): the smallest TTL of the last answer, but
/// never below `floor`; `floor` when the TTLs are unknown.
pub fn rescan_interval(min_ttl: Option<Duration>, floor: Duration) -> Duration {
    min_ttl.map_or(floor, |ttl| ttl.max(floor))
}

/// A resolved upstream: the URI with its hosts and merged options, and the rescans to run
/// (mongos lists only).
#[derive(Debug)]
pub struct Resolved {
    /// The URI the rest of mongoguard uses.
    pub uri: UpstreamUri,
    /// `Some` for a mongos list from SRV records.
    pub poller: Option<Poller>,
}

/// Resolves a `mongodb+srv://` URI (other URIs come back as they are): SRV and TXT records,
/// every rule of the seedlist specification, an error naming the reason otherwise.
pub async fn resolve(cfg: &UpstreamConfig) -> Result<Resolved, SrvError> {
    let uri = &cfg.uri;
    let Some(name) = uri.srv.clone() else {
        return Ok(Resolved {
            uri: uri.clone(),
            poller: None,
        });
    };
    let fail = |reason: String| SrvError {
        uri: uri.to_string(),
        reason,
    };
    let resolver = Arc::new(resolver(cfg.dns_server).map_err(fail)?);
    let service = uri.srv_service_name().to_owned();
    // Both lookups before any connection ("Default Connection String Options").
    let (srv, txt) = tokio::join!(
        lookup_srv(&resolver, &name, &service),
        lookup_txt(&resolver, &name)
    );
    let srv = srv.map_err(fail)?;
    let txt = parse_txt(&txt.map_err(fail)?).map_err(fail)?;
    for target in &srv.targets {
        verify_target(&name, &target.name).map_err(fail)?;
    }
    let mut resolved = merge_txt(uri, txt);
    resolved
        .validate_options()
        .map_err(|e| fail(e.to_string()))?;
    let load_balanced = resolved
        .option("loadBalanced")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let mut targets: Vec<Host> = Vec::with_capacity(srv.targets.len());
    for t in srv.targets {
        if !targets.contains(&t) {
            targets.push(t);
        }
    }
    if load_balanced && targets.len() > 1 {
        return Err(fail(format!(
            "loadBalanced=true needs exactly one SRV record, found {}",
            targets.len()
        )));
    }
    resolved.hosts = choose(targets, uri.srv_max_hosts());
    if cfg.dns_server.is_some() {
        register_targets(&resolved.hosts, &resolver);
    }
    info!(uri = %resolved, hosts = ?resolved.hosts.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "resolved the upstream's SRV records");
    let poller = (resolved.option("replicaSet").is_none() && !load_balanced).then(|| Poller {
        resolver,
        name,
        service,
        max_hosts: uri.srv_max_hosts(),
        floor: cfg.srv_poll_interval,
        retry: cfg.heartbeat_interval,
        first: rescan_interval(srv.min_ttl, cfg.srv_poll_interval),
        own_targets: cfg.dns_server.is_some(),
    });
    Ok(Resolved {
        uri: resolved,
        poller,
    })
}

/// The rescans of a mongos list's SRV records.
pub struct Poller {
    resolver: Arc<TokioResolver>,
    name: SrvName,
    service: String,
    max_hosts: usize,
    /// The smallest interval between rescans.
    floor: Duration,
    /// The interval after a failed or empty rescan (`heartbeat_interval`).
    retry: Duration,
    /// The interval before the first rescan.
    first: Duration,
    /// The targets' addresses come from this resolver too (`upstream.dns_server`).
    own_targets: bool,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("name", &self.name)
            .field("service", &self.service)
            .field("floor", &self.floor)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// Rescans until `cancel` fires, adding and removing `topology`'s servers.
    pub fn spawn(self, topology: Arc<Topology>, cancel: CancellationToken) {
        tokio::spawn(async move {
            let mut wait = self.first;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = self.rescan(&topology).await;
            }
        });
    }

    /// One rescan; returns the time to the next one (counted from the end of this one).
    async fn rescan(&self, topology: &Arc<Topology>) -> Duration {
        let answer = match lookup_srv(&self.resolver, &self.name, &self.service).await {
            Ok(a) => a,
            Err(reason) => {
                warn!(srv = %self.name, %reason, "SRV rescan failed; the upstream hosts stay as they are");
                return self.retry;
            }
        };
        let valid: Vec<Host> = answer
            .targets
            .into_iter()
            .filter(|t| match verify_target(&self.name, &t.name) {
                Ok(()) => true,
                Err(reason) => {
                    warn!(srv = %self.name, %reason, "SRV rescan: target skipped");
                    false
                }
            })
            .collect();
        if valid.is_empty() {
            warn!(srv = %self.name, "SRV rescan found no valid target; the upstream hosts stay as they are");
            return self.retry;
        }
        let (remove, add) = plan(&topology.servers(), &valid, self.max_hosts);
        if self.own_targets {
            register_targets(&add, &self.resolver);
        }
        for host in &remove {
            info!(upstream = %host, srv = %self.name, "upstream server left the SRV records; removed");
            topology.remove_server(host);
        }
        for host in &add {
            info!(upstream = %host, srv = %self.name, "upstream server added from the SRV records");
            topology.add_server(host);
        }
        let next = rescan_interval(answer.min_ttl, self.floor);
        debug!(srv = %self.name, ?next, "SRV rescan done");
        next
    }
}

/// SRV target names whose addresses come from a configured name server.
type Targets = HashMap<String, Arc<TokioResolver>>;

static TARGETS: LazyLock<RwLock<Targets>> = LazyLock::new(Default::default);

/// Has the addresses of `hosts` looked up through `resolver` when connecting (the name
/// server of `upstream.dns_server`). Process-wide, by name.
pub fn register_targets(hosts: &[Host], resolver: &Arc<TokioResolver>) {
    let mut map = TARGETS.write().unwrap_or_else(PoisonError::into_inner);
    for h in hosts {
        map.insert(h.name.to_ascii_lowercase(), resolver.clone());
    }
}

/// The addresses of `host` when it is an SRV target known to a configured name server
/// (`None`: resolve it the usual way).
pub(crate) async fn target_addrs(host: &Host) -> Option<std::io::Result<Vec<SocketAddr>>> {
    let resolver = TARGETS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&host.name.to_ascii_lowercase())
        .cloned()?;
    let fqdn = format!("{}.", host.name);
    Some(match resolver.lookup_ip(fqdn.as_str()).await {
        Ok(ips) => Ok(ips
            .iter()
            .map(|ip| SocketAddr::new(ip, host.port))
            .collect()),
        Err(e) => Err(std::io::Error::other(format!(
            "cannot resolve {} through upstream.dns_server: {e}",
            host.name
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> SrvName {
        SrvName::parse(s).unwrap()
    }

    fn h(n: &str, port: u16) -> Host {
        Host {
            name: n.into(),
            port,
        }
    }

    #[test]
    fn targets_must_share_the_domain() {
        let three = name("cluster0.example.com");
        for ok in [
            "s1.example.com",
            "s1.example.com.",
            "S1.Example.COM",
            "a.b.example.com",
            // Three labels or more: the subdomain is not part of the check.
            "cluster0.example.com",
        ] {
            verify_target(&three, ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "s1.example.org",
            "s1.badexample.com",
            "example.com",
            "s1.evil.com",
            "com",
        ] {
            let e = verify_target(&three, bad).unwrap_err();
            assert!(e.contains("not in the domain example.com"), "{bad}: {e}");
        }
        // One or two labels: targets must be below the name itself (2024 revision).
        let two = name("mongo.local");
        verify_target(&two, "s1.mongo.local").unwrap();
        for bad in ["mongo.local", "s1.local", "s1.othermongo.local"] {
            assert!(verify_target(&two, bad).is_err(), "{bad}");
        }
        let one = name("localhost");
        verify_target(&one, "test.localhost").unwrap();
        assert!(verify_target(&one, "localhost").is_err());
        assert!(verify_target(&one, "test.otherhost").is_err());
    }

    #[test]
    fn txt_options() {
        assert!(parse_txt(&[]).unwrap().is_empty());
        let opts = parse_txt(&["replicaSet=rs0&authSource=thisDB".into()]).unwrap();
        assert_eq!(
            opts,
            vec![
                ("replicaSet".to_string(), "rs0".to_string()),
                ("authSource".to_string(), "thisDB".to_string())
            ]
        );
        assert_eq!(
            parse_txt(&["loadBalanced=true".into()]).unwrap(),
            vec![("loadBalanced".to_string(), "true".to_string())]
        );
        let two = parse_txt(&["replicaSet=a".into(), "authSource=b".into()]).unwrap_err();
        assert!(two.contains("2 TXT records"), "{two}");
        for bad in [
            "ssl=true",
            "tls=false",
            "connectTimeoutMS=300000",
            "replicaSet=a&w=1",
        ] {
            let e = parse_txt(&[bad.into()]).unwrap_err();
            assert!(e.contains("not allowed"), "{bad}: {e}");
        }
        let e = parse_txt(&["replicaSet".into()]).unwrap_err();
        assert!(e.contains("no value"), "{e}");
    }

    #[test]
    fn uri_options_override_txt() {
        let uri: UpstreamUri = "mongodb+srv://a.b.c/?authSource=otherDB".parse().unwrap();
        let merged = merge_txt(
            &uri,
            vec![
                ("replicaSet".into(), "repl0".into()),
                ("authSource".into(), "thisDB".into()),
            ],
        );
        assert_eq!(merged.option("authSource"), Some("otherDB"));
        assert_eq!(merged.option("replicaSet"), Some("repl0"));
        // A TXT loadBalanced=true beside the URI's replicaSet is refused once merged.
        let uri: UpstreamUri = "mongodb+srv://a.b.c/?replicaSet=rs".parse().unwrap();
        let merged = merge_txt(&uri, vec![("loadBalanced".into(), "true".into())]);
        assert!(merged.validate_options().is_err());
        // srvMaxHosts with a replicaSet from TXT is refused once merged.
        let uri: UpstreamUri = "mongodb+srv://a.b.c/?srvMaxHosts=1".parse().unwrap();
        let merged = merge_txt(&uri, vec![("replicaSet".into(), "repl0".into())]);
        assert!(merged.validate_options().is_err());
    }

    #[test]
    fn srv_max_hosts_picks_a_random_subset() {
        let all: Vec<Host> = (1..=5).map(|p| h("s.b.c", p)).collect();
        assert_eq!(choose(all.clone(), 0), all);
        assert_eq!(choose(all.clone(), 5), all);
        assert_eq!(choose(all.clone(), 9), all);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let two = choose(all.clone(), 2);
            assert_eq!(two.len(), 2);
            assert_ne!(two[0], two[1]);
            assert!(two.iter().all(|x| all.contains(x)));
            seen.insert(two[0].port);
        }
        assert!(seen.len() > 1, "always the same first host: not random");
    }

    #[test]
    fn rescan_plan() {
        let (a, b, c, d) = (h("a.x.y", 1), h("b.x.y", 2), h("c.x.y", 3), h("d.x.y", 4));
        // Same set: nothing changes.
        let (rm, add) = plan(&[a.clone(), b.clone()], &[b.clone(), a.clone()], 0);
        assert!(rm.is_empty() && add.is_empty());
        // A moves to C: A goes, C comes, B stays.
        let (rm, add) = plan(&[a.clone(), b.clone()], &[b.clone(), c.clone()], 0);
        assert_eq!(rm, vec![a.clone()]);
        assert_eq!(add, vec![c.clone()]);
        // srvMaxHosts=2: B stays, one of the three new ones is added.
        let (rm, add) = plan(
            &[a.clone(), b.clone()],
            &[b.clone(), c.clone(), d.clone(), h("e.x.y", 5)],
            2,
        );
        assert_eq!(rm, vec![a.clone()]);
        assert_eq!(add.len(), 1);
        assert_ne!(add[0], b);
        // Already at srvMaxHosts: nothing added.
        let (rm, add) = plan(
            &[a.clone(), b.clone()],
            &[a.clone(), b.clone(), c.clone()],
            2,
        );
        assert!(rm.is_empty() && add.is_empty());
    }

    #[test]
    fn rescan_interval_follows_the_ttl_above_the_floor() {
        let s = Duration::from_secs;
        assert_eq!(rescan_interval(Some(s(300)), s(60)), s(300));
        assert_eq!(rescan_interval(Some(s(5)), s(60)), s(60));
        assert_eq!(rescan_interval(Some(s(0)), s(60)), s(60));
        assert_eq!(rescan_interval(None, s(60)), s(60));
        assert_eq!(
            rescan_interval(Some(s(1)), Duration::from_millis(200)),
            s(1)
        );
    }

    #[tokio::test]
    async fn plain_uris_resolve_to_themselves() {
        let cfg = UpstreamConfig {
            uri: "mongodb://h:1,h:2".parse().unwrap(),
            ..Default::default()
        };
        let r = resolve(&cfg).await.unwrap();
        assert_eq!(r.uri, cfg.uri);
        assert!(r.poller.is_none());
    }
}
