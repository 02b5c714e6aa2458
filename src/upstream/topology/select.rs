//! Server selection: which known server a request goes to, by read preference, waiting for
//! one to qualify during a failover.

use std::{sync::atomic::Ordering, time::Duration};

use bson::{RawBsonRef, RawDocument};

use super::{state::ServerState, Kind, Snapshot, Topology};
use crate::upstream::{Host, Role};

/// The smallest maxStalenessSeconds mongod and mongos accept
/// (`ReadPreferenceSetting::kMinimalMaxStalenessValue`, src/mongo/client/read_preference.cpp).
pub const MIN_MAX_STALENESS: Duration = Duration::from_secs(90);
/// How often an idle primary writes a no-op (the max-staleness spec's idleWritePeriodMS):
/// maxStalenessSeconds below heartbeat + this cannot be told apart from noise.
pub const IDLE_WRITE_PERIOD: Duration = Duration::from_secs(10);

/// A read preference mode (`$readPreference.mode`); its tag sets and maxStalenessSeconds are
/// a [`ReadFilter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadPref {
    /// The primary only (also every write).
    #[default]
    Primary,
    /// The primary, else a secondary.
    PrimaryPreferred,
    /// A secondary only.
    Secondary,
    /// A secondary, else the primary.
    SecondaryPreferred,
    /// Any member.
    Nearest,
}

impl ReadPref {
    /// Parses a `mode` value; unknown modes are `None`.
    pub fn parse(mode: &str) -> Option<ReadPref> {
        Some(match mode {
            "primary" => ReadPref::Primary,
            "primaryPreferred" => ReadPref::PrimaryPreferred,
            "secondary" => ReadPref::Secondary,
            "secondaryPreferred" => ReadPref::SecondaryPreferred,
            "nearest" => ReadPref::Nearest,
            _ => return None,
        })
    }
}

/// The tag sets and maxStalenessSeconds of a read preference (replica sets; a mongos applies
/// them itself from the forwarded `$readPreference`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadFilter {
    /// Tag sets in order: the first that matches a suitable member chooses among the members
    /// it matches (`{}` matches every member). Empty: no tag filter.
    pub tag_sets: Vec<Vec<(String, String)>>,
    /// Secondaries estimated staler than this are not suitable.
    pub max_staleness: Option<Duration>,
}

/// A `$readPreference` mongod and mongos refuse, with their code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ReadPrefError {
    /// mongod's error code.
    pub code: i32,
    /// Its name.
    pub code_name: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ReadPrefError {
    fn new(code: i32, code_name: &'static str, message: impl Into<String>) -> ReadPrefError {
        ReadPrefError {
            code,
            code_name,
            message: message.into(),
        }
    }
}

fn bad_value(message: impl Into<String>) -> ReadPrefError {
    ReadPrefError::new(2, "BadValue", message)
}

fn type_mismatch(message: impl Into<String>) -> ReadPrefError {
    ReadPrefError::new(14, "TypeMismatch", message)
}

/// Reads a `$readPreference` document the way mongod and mongos do
/// (`ReadPreferenceSetting::fromInnerBSON`, src/mongo/client/read_preference.cpp): `mode`
/// a string naming a mode, `tags` an array of documents (`[]` and `[{}]` mean none; other
/// tags with mode primary are BadValue), `maxStalenessSeconds` an integral number, 0 for
/// none, otherwise at least 90 (MaxStalenessOutOfRange) and never with mode primary.
pub fn parse_read_preference(
    rp: &RawDocument,
) -> Result<(ReadPref, Option<Box<ReadFilter>>), ReadPrefError> {
    let mode = match rp.get("mode") {
        Ok(Some(RawBsonRef::String(m))) => m,
        Ok(None) => {
            return Err(ReadPrefError::new(
                4,
                "NoSuchKey",
                "Missing expected field \"mode\"",
            ))
        }
        Ok(Some(_)) => {
            return Err(type_mismatch(
                "\"mode\" had the wrong type, expected string",
            ))
        }
        Err(_) => return Err(bad_value("$readPreference is not valid BSON")),
    };
    let mode_value = ReadPref::parse(mode).ok_or_else(|| {
        bad_value(format!(
            "Could not parse $readPreference mode '{mode}'. Only the modes 'primary', \
             'primaryPreferred', 'secondary', 'secondaryPreferred', and 'nearest' are supported."
        ))
    })?;
    let mut filter = ReadFilter::default();
    match rp.get("tags") {
        Ok(None) => {}
        Ok(Some(RawBsonRef::Array(sets))) => {
            for set in sets {
                let Ok(RawBsonRef::Document(set)) = set else {
                    return Err(type_mismatch(
                        "each tag set of $readPreference.tags must be a document",
                    ));
                };
                let mut pairs = Vec::new();
                for pair in set {
                    let (k, v) =
                        pair.map_err(|_| bad_value("$readPreference.tags is not valid BSON"))?;
                    // Member tags are strings; a tag set asking for another type matches no
                    // member.
                    let v = match v {
                        RawBsonRef::String(v) => v.to_owned(),
                        _ => "\u{0}not a string".to_owned(),
                    };
                    pairs.push((k.as_str().to_owned(), v));
                }
                filter.tag_sets.push(pairs);
            }
            // `[]` and `[{}]` are the default: no filter.
            if filter.tag_sets.len() == 1 && filter.tag_sets.first().is_some_and(Vec::is_empty) {
                filter.tag_sets.clear();
            }
            if mode_value == ReadPref::Primary && !filter.tag_sets.is_empty() {
                return Err(bad_value(
                    "Only empty tags are allowed with primary read preference",
                ));
            }
        }
        Ok(Some(_)) => return Err(type_mismatch("\"tags\" had the wrong type, expected array")),
        Err(_) => return Err(bad_value("$readPreference is not valid BSON")),
    }
    let staleness = match rp.get("maxStalenessSeconds") {
        Ok(None) => 0,
        Ok(Some(v)) => match v {
            RawBsonRef::Int32(i) => i64::from(i),
            RawBsonRef::Int64(i) => i,
            RawBsonRef::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => d as i64,
            RawBsonRef::Double(_) | RawBsonRef::Decimal128(_) => {
                return Err(bad_value(
                    "Expected field \"maxStalenessSeconds\" to have an integral value",
                ))
            }
            _ => {
                return Err(type_mismatch(
                    "\"maxStalenessSeconds\" had the wrong type, expected a number",
                ))
            }
        },
        Err(_) => return Err(bad_value("$readPreference is not valid BSON")),
    };
    if staleness < 0 {
        return Err(bad_value(
            "maxStalenessSeconds must be a non-negative integer",
        ));
    }
    if staleness > 0 {
        let staleness = Duration::from_secs(staleness.unsigned_abs());
        if staleness < MIN_MAX_STALENESS {
            return Err(ReadPrefError::new(
                160,
                "MaxStalenessOutOfRange",
                "maxStalenessSeconds value can not be less than 90",
            ));
        }
        if mode_value == ReadPref::Primary {
            return Err(bad_value(
                "maxStalenessSeconds can not be set for the primary mode",
            ));
        }
        filter.max_staleness = Some(staleness);
    }
    let filter = (filter != ReadFilter::default()).then(|| Box::new(filter));
    Ok((mode_value, filter))
}

/// Why no server could be chosen.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no upstream server matches read preference {pref:?} after {waited:?} ({kind})")]
pub struct SelectError {
    /// The preference asked for.
    pub pref: ReadPref,
    /// How long the request waited.
    pub waited: Duration,
    /// What the topology looked like.
    pub kind: String,
}

impl Topology {
    /// Picks a server for `pref`, waiting up to `timeout` for one to qualify (a failover in
    /// progress).
    pub async fn select(&self, pref: ReadPref, timeout: Duration) -> Result<Host, SelectError> {
        self.select_filtered(pref, None, timeout).await
    }

    /// The server [`Topology::select_filtered`] would return without waiting, if any (a
    /// caller's fast path: no future, no timer).
    pub fn select_now(&self, pref: ReadPref, filter: Option<&ReadFilter>) -> Option<Host> {
        self.pick(&self.state.borrow(), pref, filter)
    }

    /// [`Topology::select`] with tag sets and maxStalenessSeconds (`filter`). Staleness
    /// changes at every heartbeat without waking the snapshot's watchers, so a selection
    /// with a maximum staleness also looks again at every heartbeat.
    pub async fn select_filtered(
        &self,
        pref: ReadPref,
        filter: Option<&ReadFilter>,
        timeout: Duration,
    ) -> Result<Host, SelectError> {
        if let Some(h) = self.select_now(pref, filter) {
            return Ok(h);
        }
        self.check_now.notify_waiters();
        let mut rx = self.state.subscribe();
        let started = tokio::time::Instant::now();
        let poll = filter
            .and_then(|f| f.max_staleness)
            .map(|_| self.heartbeat());
        let found = tokio::time::timeout(timeout, async {
            loop {
                if let Some(h) = self.pick(&rx.borrow_and_update(), pref, filter) {
                    return Some(h);
                }
                match poll {
                    Some(every) => {
                        tokio::select! {
                            r = rx.changed() => if r.is_err() { return None },
                            _ = tokio::time::sleep(every) => {}
                        }
                    }
                    None => {
                        if rx.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            }
        })
        .await;
        match found {
            Ok(Some(h)) => Ok(h),
            _ => Err(SelectError {
                pref,
                waited: started.elapsed(),
                kind: self.describe(),
            }),
        }
    }

    fn describe(&self) -> String {
        let snap = self.state.borrow();
        let servers: Vec<String> = snap
            .servers
            .iter()
            .map(|s| match s.role {
                Some(r) => format!("{} {r:?}", s.host),
                None => format!("{} unknown", s.host),
            })
            .collect();
        match &self.kind {
            Kind::Single => format!("single server {}", servers.join(", ")),
            Kind::ReplicaSet(n) => format!("replica set {n}: {}", servers.join(", ")),
            Kind::Mongos => format!("mongos list: {}", servers.join(", ")),
        }
    }

    /// Refuses a maxStalenessSeconds smaller than the heartbeat plus the idle write period,
    /// as mongos does (the server selection spec's rule): below that a secondary's
    /// staleness cannot be estimated.
    pub fn check_filter(&self, filter: &ReadFilter) -> Result<(), ReadPrefError> {
        let Some(max) = filter.max_staleness else {
            return Ok(());
        };
        let floor = self.heartbeat() + IDLE_WRITE_PERIOD;
        if matches!(self.kind, Kind::ReplicaSet(_)) && max < floor {
            return Err(ReadPrefError::new(
                160,
                "MaxStalenessOutOfRange",
                format!(
                    "maxStalenessSeconds must be at least {} seconds (heartbeat {:?} + idle write period 10s)",
                    floor.as_secs_f64().ceil(),
                    self.heartbeat()
                ),
            ));
        }
        Ok(())
    }

    fn pick(&self, snap: &Snapshot, pref: ReadPref, filter: Option<&ReadFilter>) -> Option<Host> {
        let drained = self
            .drained
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let open = |h: &&Host| !drained.contains(h);
        match self.kind {
            Kind::Single => snap.servers.first().map(|s| &s.host).filter(open).cloned(),
            // A listed server that is a plain mongod (a misconfiguration the monitor warns
            // about, or a test stand-in) is used like a mongos.
            Kind::Mongos => self.round_robin(
                snap.with_role(Role::Mongos)
                    .chain(snap.with_role(Role::Standalone))
                    .filter(open)
                    .collect(),
            ),
            Kind::ReplicaSet(_) => {
                let primary = || snap.primary().filter(open).cloned();
                let members = |roles: &[Role]| {
                    let found: Vec<&ServerState> = snap
                        .servers
                        .iter()
                        .filter(|s| s.role.is_some_and(|r| roles.contains(&r)))
                        .filter(|s| open(&&s.host))
                        .collect();
                    self.round_robin(filtered(snap, found, filter, self.heartbeat()))
                };
                let secondary = || members(&[Role::Secondary]);
                match pref {
                    ReadPref::Primary => primary(),
                    ReadPref::PrimaryPreferred => primary().or_else(secondary),
                    ReadPref::Secondary => secondary(),
                    ReadPref::SecondaryPreferred => secondary().or_else(primary),
                    ReadPref::Nearest => members(&[Role::Primary, Role::Secondary]),
                }
            }
        }
    }

    fn round_robin<H: AsHost>(&self, hosts: Vec<H>) -> Option<Host> {
        if hosts.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % hosts.len();
        hosts.get(i).map(|h| h.host().clone())
    }
}

/// A candidate of [`Topology::round_robin`].
trait AsHost {
    fn host(&self) -> &Host;
}

impl AsHost for &Host {
    fn host(&self) -> &Host {
        self
    }
}

impl AsHost for &ServerState {
    fn host(&self) -> &Host {
        &self.host
    }
}

/// The candidates that satisfy `filter`: secondaries not staler than its maximum (the
/// primary never is), then the members of the first tag set that matches any (the server
/// selection spec's order: staleness first, then tag sets).
fn filtered<'a>(
    snap: &Snapshot,
    mut found: Vec<&'a ServerState>,
    filter: Option<&ReadFilter>,
    heartbeat: Duration,
) -> Vec<&'a ServerState> {
    let Some(filter) = filter else {
        return found;
    };
    if let Some(max) = filter.max_staleness {
        found.retain(|s| {
            s.role == Some(Role::Primary)
                || staleness(snap, s, heartbeat).is_some_and(|st| st <= max)
        });
    }
    if filter.tag_sets.is_empty() {
        return found;
    }
    for set in &filter.tag_sets {
        let matching: Vec<&ServerState> = found
            .iter()
            .copied()
            .filter(|s| set.iter().all(|pair| s.tags.contains(pair)))
            .collect();
        if !matching.is_empty() {
            return matching;
        }
    }
    Vec::new()
}

/// A secondary's estimated staleness (the max-staleness spec): with a primary P,
/// `(S.lastUpdateTime - S.lastWriteDate) - (P.lastUpdateTime - P.lastWriteDate) + heartbeat`;
/// without one, `SMax.lastWriteDate - S.lastWriteDate + heartbeat` where SMax is the
/// secondary with the latest write. `None` when its hello reported no last write.
fn staleness(snap: &Snapshot, s: &ServerState, heartbeat: Duration) -> Option<Duration> {
    let (s_seen, s_write) = s.freshness?;
    let primary = snap
        .primary()
        .and_then(|p| snap.servers.iter().find(|x| &x.host == p))
        .and_then(|p| p.freshness);
    let ms = match primary {
        Some((p_seen, p_write)) => {
            // (S.seen - P.seen) - (S.write - P.write), in signed milliseconds.
            let seen = if s_seen >= p_seen {
                i64::try_from((s_seen - p_seen).as_millis()).unwrap_or(i64::MAX)
            } else {
                -i64::try_from((p_seen - s_seen).as_millis()).unwrap_or(i64::MAX)
            };
            seen.saturating_sub(s_write.saturating_sub(p_write))
        }
        None => {
            let newest = snap
                .servers
                .iter()
                .filter(|x| x.role == Some(Role::Secondary))
                .filter_map(|x| x.freshness.map(|(_, w)| w))
                .max()?;
            newest.saturating_sub(s_write)
        }
    };
    let ms = u64::try_from(ms.max(0)).unwrap_or(0);
    Some(Duration::from_millis(ms) + heartbeat)
}
