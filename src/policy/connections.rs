//! The connection standards (C001–C003): how an application connects, which only a proxy
//! sees. They are never evaluated per command: each (application, driver) pair of `/clients`
//! keeps a [`Window`] of its recent connections, and a periodic report [`assess`]es every
//! pair against the policy, producing at most one [`Finding`] per (application or driver,
//! rule) per period.
//!
//! - C001 short-lived-connections: per application, over the last minute, more than
//!   `max_connections_per_minute` connections opened AND fewer than
//!   `min_requests_per_connection` requests per closed connection on average. Only
//!   application requests count (not hello, isMaster, ping, authentication); a connection
//!   that sent nothing else (a driver's monitoring connection) counts in neither number.
//! - C002 missing-app-name: connections whose handshake names no application, per driver,
//!   while such connections arrive or stay open.
//! - C003 outdated-driver: a driver whose version is below the configured minimum for its
//!   name (`min_versions`), while such connections arrive or stay open.
//!
//! Time is a parameter everywhere (`now`), so tests drive it without sleeping.

use std::{
    cmp::Ordering,
    time::{Duration, Instant},
};

use super::{Action, Mode, Policy, RuleId};

/// Most entries in `min_versions`.
pub const MAX_MIN_VERSIONS: usize = 64;

/// Components of a dotted version: `"4.0.12-beta+git"` is `[4, 0, 12]`. Equality is
/// numeric like the order (`3.12` equals `3.12.0`).
#[derive(Debug, Clone)]
pub struct Version(Vec<u64>);

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl Version {
    /// Parses the numeric dotted part of a version: a leading `v` is skipped, anything from
    /// the first `-`, `+` or space on is ignored (pre-release and build suffixes), and each
    /// component keeps its leading digits (`"0rc1"` is 0). `None` when the first component
    /// has no digit (nothing to compare).
    pub fn parse(text: &str) -> Option<Version> {
        let text = text.trim();
        let text = text.strip_prefix(['v', 'V']).unwrap_or(text);
        let end = text.find(['-', '+', ' ']).unwrap_or(text.len());
        let mut parts = Vec::new();
        for component in text.get(..end)?.split('.') {
            let digits: &str = component
                .find(|c: char| !c.is_ascii_digit())
                .map_or(component, |i| component.get(..i).unwrap_or(""));
            match digits.parse::<u64>() {
                Ok(n) => parts.push(n),
                // A component without a leading number ends the comparable part.
                Err(_) => break,
            }
            if parts.len() >= 8 {
                break;
            }
        }
        (!parts.is_empty()).then_some(Version(parts))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    /// Component by component; a missing component is 0 (`3.12` equals `3.12.0`).
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.0.len().max(other.0.len());
        for i in 0..n {
            let a = self.0.get(i).copied().unwrap_or(0);
            let b = other.0.get(i).copied().unwrap_or(0);
            match a.cmp(&b) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        Ordering::Equal
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

/// The connection standards' thresholds (rule parameters of C001 and C003).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionParams {
    /// C001: more connections than this opened in a minute...
    pub max_connections_per_minute: u64,
    /// C001: ...with fewer requests than this per closed connection on average.
    pub min_requests_per_connection: u64,
    /// C003: minimum driver version by driver name (`client.driver.name`; names compare
    /// ASCII case-insensitively), as written and parsed.
    pub min_versions: Vec<(String, String, Version)>,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            max_connections_per_minute: 60,
            min_requests_per_connection: 5,
            min_versions: Vec::new(),
        }
    }
}

/// A driver below its configured minimum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outdated {
    /// The driver name component that matched a `min_versions` entry.
    pub name: String,
    /// The version the driver reported for it.
    pub found: String,
    /// The configured minimum.
    pub minimum: String,
}

/// C003's check of a driver label (`"name version"`, as `/clients` shows it). Wrappers
/// report several names and versions joined with `|` ("nodejs|Mongoose", "6.3.0|8.1.0"):
/// every name component is checked against its own version component (the first version
/// when there are fewer versions than names). Unknown names, and versions without a number,
/// never fire.
pub fn outdated(driver: &str, params: &ConnectionParams) -> Option<Outdated> {
    if params.min_versions.is_empty() {
        return None;
    }
    let (names, versions) = driver.split_once(' ')?;
    let versions: Vec<&str> = versions.split('|').collect();
    for (i, name) in names.split('|').enumerate() {
        let name = name.trim();
        let Some((_, minimum, min)) = params
            .min_versions
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
        else {
            continue;
        };
        let Some(found) = versions.get(i).or(versions.first()).map(|v| v.trim()) else {
            continue;
        };
        if Version::parse(found).is_some_and(|v| v < *min) {
            return Some(Outdated {
                name: name.to_owned(),
                found: found.to_owned(),
                minimum: minimum.clone(),
            });
        }
    }
    None
}

/// True for the requests C001 does not count: the handshake, monitoring and SASL
/// authentication (`hello`, `isMaster`/`ismaster`, `ping`, `saslStart`, `saslContinue`).
pub fn is_housekeeping(command: &str) -> bool {
    matches!(
        command,
        "hello" | "isMaster" | "ismaster" | "ping" | "saslStart" | "saslContinue"
    )
}

/// One second of a [`Window`].
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    second: u64,
    opened: u64,
    closed: u64,
    requests: u64,
}

/// The sliding minute.
pub const MINUTE: Duration = Duration::from_secs(60);
const SLOTS: usize = 60;

/// The recent connections of one (application, driver) pair: a sliding minute in one-second
/// slots (bounded whatever the connection rate), and the connections that arrived since
/// the last report.
#[derive(Debug, Clone)]
pub struct Window {
    epoch: Instant,
    slots: [Slot; SLOTS],
    arrived: u64,
}

/// What a [`Window`] holds at a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Application connections opened in the last minute (a connection counts once it sends
    /// its first application request).
    pub opened: u64,
    /// Application connections closed in the last minute.
    pub closed: u64,
    /// Application requests of those closed connections.
    pub requests: u64,
    /// Connections (any) that arrived since the last report.
    pub arrived: u64,
}

impl Window {
    /// An empty window whose clock starts at `epoch`.
    pub fn new(epoch: Instant) -> Window {
        Window {
            epoch,
            slots: [Slot::default(); SLOTS],
            arrived: 0,
        }
    }

    fn slot(&mut self, now: Instant) -> Option<&mut Slot> {
        let second = now.saturating_duration_since(self.epoch).as_secs();
        let slot = self.slots.get_mut((second % SLOTS as u64) as usize)?;
        if slot.second != second {
            *slot = Slot {
                second,
                ..Slot::default()
            };
        }
        Some(slot)
    }

    /// A connection identified itself (its first request).
    pub fn arrived(&mut self) {
        self.arrived = self.arrived.saturating_add(1);
    }

    /// A connection sent its first application request.
    pub fn opened(&mut self, now: Instant) {
        if let Some(s) = self.slot(now) {
            s.opened += 1;
        }
    }

    /// A connection closed after `requests` application requests (none: a monitoring or
    /// handshake-only connection, not counted).
    pub fn closed(&mut self, now: Instant, requests: u64) {
        if requests == 0 {
            return;
        }
        if let Some(s) = self.slot(now) {
            s.closed += 1;
            s.requests = s.requests.saturating_add(requests);
        }
    }

    /// The last minute's counts, and the arrivals since the last call (reset).
    pub fn take(&mut self, now: Instant) -> WindowCounts {
        let second = now.saturating_duration_since(self.epoch).as_secs();
        let mut c = WindowCounts {
            arrived: std::mem::take(&mut self.arrived),
            ..WindowCounts::default()
        };
        for s in &self.slots {
            if s.second <= second && second - s.second < SLOTS as u64 {
                c.opened += s.opened;
                c.closed += s.closed;
                c.requests = c.requests.saturating_add(s.requests);
            }
        }
        c
    }
}

/// One (application, driver) pair at a report.
#[derive(Debug, Clone)]
pub struct PairCounts<'a> {
    /// Application label ("-": none named, "other": beyond the cap).
    pub app: &'a str,
    /// Driver label (`"name version"`, "-" or "other").
    pub driver: &'a str,
    /// Its window.
    pub counts: WindowCounts,
    /// Its connections open now.
    pub open: u64,
}

/// One connection standard that holds for an application (or a driver, for C002).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// C001, C002 or C003.
    pub rule: RuleId,
    /// The application label ("-" for C002).
    pub app: String,
    /// The driver label (C002, C003); `None` for C001, which is per application.
    pub driver: Option<String>,
    /// The evidence, one line.
    pub detail: String,
    /// `Warn` (connection standards never block).
    pub action: Action,
    /// The mode in force for the application.
    pub mode: Mode,
}

/// The findings of one report over every pair, in pair order (C001 once per application).
pub fn assess(pairs: &[PairCounts<'_>], policy: &Policy) -> Vec<Finding> {
    let params = &policy.params().connections;
    let mut out = Vec::new();
    let verdict = |rule: RuleId, app: &str| {
        let app = (app != crate::metrics::labels::NONE && app != crate::metrics::labels::OTHER)
            .then_some(app);
        policy.connection_action(rule, app)
    };
    // C001: per application, summed over its drivers.
    let mut apps: Vec<&str> = pairs.iter().map(|p| p.app).collect();
    apps.sort_unstable();
    apps.dedup();
    for app in apps {
        let Some((action, mode)) = verdict(RuleId::C001, app) else {
            continue;
        };
        let (mut opened, mut closed, mut requests) = (0u64, 0u64, 0u64);
        for p in pairs.iter().filter(|p| p.app == app) {
            opened += p.counts.opened;
            closed += p.counts.closed;
            requests = requests.saturating_add(p.counts.requests);
        }
        let few =
            closed > 0 && requests < params.min_requests_per_connection.saturating_mul(closed);
        if opened > params.max_connections_per_minute && few {
            out.push(Finding {
                rule: RuleId::C001,
                app: app.to_owned(),
                driver: None,
                detail: format!(
                    "{opened} connections opened in the last minute (more than {}), {:.1} \
                     requests per closed connection (fewer than {}; {closed} closed, \
                     monitoring and authentication not counted)",
                    params.max_connections_per_minute,
                    requests as f64 / closed as f64,
                    params.min_requests_per_connection
                ),
                action,
                mode,
            });
        }
    }
    for p in pairs {
        let present = p.counts.arrived > 0 || p.open > 0;
        if p.app == crate::metrics::labels::NONE && present {
            if let Some((action, mode)) = verdict(RuleId::C002, p.app) {
                out.push(Finding {
                    rule: RuleId::C002,
                    app: p.app.to_owned(),
                    driver: Some(p.driver.to_owned()),
                    detail: format!(
                        "connections of driver {:?} name no application ({} open, {} arrived \
                         since the last report)",
                        p.driver, p.open, p.counts.arrived
                    ),
                    action,
                    mode,
                });
            }
        }
        if present {
            let Some((action, mode)) = verdict(RuleId::C003, p.app) else {
                continue;
            };
            if let Some(o) = outdated(p.driver, params) {
                out.push(Finding {
                    rule: RuleId::C003,
                    app: p.app.to_owned(),
                    driver: Some(p.driver.to_owned()),
                    detail: format!(
                        "driver {} {} is below the minimum {} configured for {:?} ({} \
                         connections open, {} arrived since the last report)",
                        o.name, o.found, o.minimum, o.name, p.open, p.counts.arrived
                    ),
                    action,
                    mode,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
