//! The compiled, immutable policy and its matchers.

use std::net::IpAddr;

use super::{rules::RULE_COUNT, Action, Mode, RequestContext};
use crate::command::Namespace;

/// Rule parameters (thresholds), with the rule pack's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Q005: most `$in` / `$nin` values.
    pub max_in: usize,
    /// Q005: most `$or` branches.
    pub max_or: usize,
    /// D001: largest document, bytes.
    pub max_document_bytes: usize,
    /// D002: deepest nesting.
    pub max_depth: usize,
    /// D003: most array elements.
    pub max_array_elements: usize,
    /// Q003: whether a case-insensitive regex counts as unanchored.
    pub regex_case_insensitive: bool,
    /// W012: most documents a multi-document write may match.
    pub max_docs: u64,
    /// How multi-document writes not proved selective are measured.
    pub measure: MeasureParams,
    /// The connection standards' thresholds (C001, C003).
    pub connections: super::connections::ConnectionParams,
}

/// The `[measure]` table: blast-radius measurement of multi-document writes whose filter is
/// neither proved to match everything nor proved selective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeasureParams {
    /// Measure at all. When false, such a write gets `on_error` without any I/O.
    pub enabled: bool,
    /// `maxTimeMS` of each measuring query.
    pub time_limit: std::time::Duration,
    /// What a measurement that fails or times out does: `Block` (default) or `Warn`.
    pub on_error: Action,
}

impl Default for MeasureParams {
    fn default() -> Self {
        MeasureParams {
            enabled: true,
            time_limit: std::time::Duration::from_millis(1000),
            on_error: Action::Block,
        }
    }
}

impl Default for Params {
    fn default() -> Self {
        Params {
            max_in: 200,
            max_or: 10,
            max_document_bytes: 100 * 1024,
            max_depth: 5,
            max_array_elements: 1000,
            regex_case_insensitive: true,
            max_docs: 10_000,
            measure: MeasureParams::default(),
            connections: super::connections::ConnectionParams::default(),
        }
    }
}

/// A `*` / `?` glob over a name; matching does not allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    /// Validates a pattern (non-empty, printable).
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.is_empty() || pattern.chars().any(char::is_control) {
            return Err(format!("bad pattern {pattern:?}"));
        }
        Ok(Glob(pattern.to_owned()))
    }

    /// True when `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let (p, t) = (self.0.as_bytes(), text.as_bytes());
        let (mut pi, mut ti) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some(b'*') => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                Some(&c) if c == b'?' || t.get(ti) == Some(&c) => {
                    pi += 1;
                    ti += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        pi = sp + 1;
                        ti = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        p.iter().skip(pi).all(|&c| c == b'*')
    }
}

/// An address block, `10.0.0.0/8` or `fd00::/8` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses a CIDR block.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (ip, prefix) = match text.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = ip.parse().map_err(|_| format!("bad address in {text:?}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("bad prefix in {text:?}"))?,
        };
        Ok(Cidr { addr, prefix })
    }

    /// True when `ip` is inside the block (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_eq(&net.octets(), &ip.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_eq(&net.octets(), &ip.octets(), self.prefix),
            _ => false,
        }
    }
}

fn mask_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    let rest = prefix % 8;
    if a.get(..full) != b.get(..full) {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    match (a.get(full), b.get(full)) {
        (Some(x), Some(y)) => x & mask == y & mask,
        _ => false,
    }
}

/// One `[[overrides]]` entry: all given matchers must match.
#[derive(Debug, Clone)]
pub struct Override {
    pub(crate) namespace: Option<Glob>,
    pub(crate) app: Option<Glob>,
    pub(crate) user: Option<Glob>,
    pub(crate) client: Option<Cidr>,
    pub(crate) mode: Option<Mode>,
    pub(crate) actions: [Option<Action>; RULE_COUNT],
}

impl Override {
    fn matches(&self, ns: Namespace<'_>, ctx: &RequestContext<'_>) -> bool {
        if let Some(g) = &self.namespace {
            let ok = match ns.coll {
                // Match "db.coll" without building the string: db, '.', coll.
                Some(coll) => glob_match_parts(g, ns.db, coll),
                None => g.matches(ns.db),
            };
            if !ok {
                return false;
            }
        }
        if let Some(g) = &self.app {
            if !ctx.app.is_some_and(|a| g.matches(a)) {
                return false;
            }
        }
        if let Some(g) = &self.user {
            if !ctx.user.is_some_and(|u| g.matches(u)) {
                return false;
            }
        }
        if let Some(c) = &self.client {
            if !ctx.client_ip.is_some_and(|ip| c.contains(ip)) {
                return false;
            }
        }
        true
    }
}

/// Matches "db.coll" against a glob without allocating, using a small stack buffer; names
/// too long for it (MongoDB caps namespaces at 255 bytes) are compared after allocating.
fn glob_match_parts(g: &Glob, db: &str, coll: &str) -> bool {
    let mut buf = [0u8; 256];
    let len = db.len() + 1 + coll.len();
    if len > buf.len() {
        return g.matches(&format!("{db}.{coll}"));
    }
    let (head, tail) = buf.split_at_mut(db.len());
    head.copy_from_slice(db.as_bytes());
    let Some((dot, rest)) = tail.split_first_mut() else {
        return false;
    };
    *dot = b'.';
    let Some(c) = rest.get_mut(..coll.len()) else {
        return false;
    };
    c.copy_from_slice(coll.as_bytes());
    match buf.get(..len).map(std::str::from_utf8) {
        Some(Ok(s)) => g.matches(s),
        _ => false,
    }
}

/// The action of `rule` in a rule-indexed table. Every `RuleId` is below `RULE_COUNT` (the
/// table's length) by construction; were it not, the answer is `block` (fail closed).
pub(crate) fn action_in(actions: &[Action; RULE_COUNT], rule: super::RuleId) -> Action {
    actions.get(rule as usize).copied().unwrap_or(Action::Block)
}

/// Sets the action of `rule` in a rule-indexed table (see [`action_in`]).
pub(crate) fn set_action<T>(table: &mut [T; RULE_COUNT], rule: super::RuleId, value: T) {
    if let Some(slot) = table.get_mut(rule as usize) {
        *slot = value;
    }
}

/// An immutable, validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) mode: Mode,
    pub(crate) actions: [Action; RULE_COUNT],
    pub(crate) params: Params,
    pub(crate) overrides: Vec<Override>,
    pub(crate) hash: u64,
    /// `trust_app_name = true`: overrides keyed on the (client-claimed) application name may
    /// relax rules. Their indexes are in `app_relaxing`.
    pub(crate) trust_app_name: bool,
    /// Overrides keyed on `app` that relax something (only possible when trusted).
    pub(crate) app_relaxing: Vec<usize>,
}

/// The actions in force for one request, after overrides and mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Effective {
    pub actions: [Action; RULE_COUNT],
    pub mode: Mode,
    /// The rules audit mode turned from block into warn (bit = rule index): what enforcement
    /// would do, for decisions audit mode must take as enforcement would (what to measure).
    pub audited_blocks: u64,
}

const _: () = assert!(
    RULE_COUNT <= 64,
    "Effective::audited_blocks holds one bit per rule"
);

impl Effective {
    /// The action in force for `rule`.
    pub fn action(&self, rule: super::RuleId) -> Action {
        action_in(&self.actions, rule)
    }

    /// The action `rule` would have in enforce mode: a block audit mode made a warning is a
    /// block here.
    pub fn enforced_action(&self, rule: super::RuleId) -> Action {
        if self.audited_blocks & (1u64 << (rule as usize)) != 0 {
            Action::Block
        } else {
            self.action(rule)
        }
    }

    /// The stricter of two: each rule's higher action, enforce over audit.
    fn strictest(mut self, other: &Effective) -> Effective {
        for (a, b) in self.actions.iter_mut().zip(other.actions.iter()) {
            *a = (*a).max(*b);
        }
        self.audited_blocks |= other.audited_blocks;
        if other.mode == Mode::Enforce {
            self.mode = Mode::Enforce;
        }
        self
    }
}

impl Policy {
    pub(crate) fn empty() -> Policy {
        let mut actions = [Action::Off; RULE_COUNT];
        set_action(&mut actions, super::RuleId::G001, Action::Block);
        Policy {
            mode: Mode::Enforce,
            actions,
            params: Params::default(),
            overrides: Vec::new(),
            hash: 0,
            trust_app_name: false,
            app_relaxing: Vec::new(),
        }
    }

    /// Every rule blocks: what a policy falls back to when nothing else can be trusted.
    pub(crate) fn all_block() -> Policy {
        Policy {
            mode: Mode::Enforce,
            actions: [Action::Block; RULE_COUNT],
            params: Params::default(),
            overrides: Vec::new(),
            hash: 0,
            trust_app_name: false,
            app_relaxing: Vec::new(),
        }
    }

    /// The global mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The configured action of a rule (before overrides and mode).
    pub fn action(&self, rule: super::RuleId) -> Action {
        action_in(&self.actions, rule)
    }

    /// The thresholds.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// A stable hash of the policy's source text(s).
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Whether the policy trusts the application name (`trust_app_name = true`).
    pub fn trusts_app_name(&self) -> bool {
        self.trust_app_name
    }

    /// What `policy validate` warns about in a policy that loads: overrides that relax rules
    /// on the application name, which any client can claim (only loadable with
    /// `trust_app_name = true`).
    pub fn warnings(&self) -> Vec<String> {
        self.app_relaxing
            .iter()
            .map(|i| {
                format!(
                    "overrides[{i}] relaxes rules on `app`, a name any client can claim in its \
                     handshake (trust_app_name = true): key it on user or client to make it a fact"
                )
            })
            .collect()
    }

    /// The action and mode of a connection standard (C001–C003) for an application (`None`:
    /// the handshake named none), or `None` when it is off. Overrides apply when their only
    /// matcher is `app` (findings are per application, so namespace, user and client
    /// matchers never match them); audit mode turns a block into a warning, though the
    /// policy refuses `block` for these rules.
    pub fn connection_action(
        &self,
        rule: super::RuleId,
        app: Option<&str>,
    ) -> Option<(Action, Mode)> {
        let mut action = self.action(rule);
        let mut mode = self.mode;
        for o in &self.overrides {
            let app_only = o.namespace.is_none() && o.user.is_none() && o.client.is_none();
            let matches = o
                .app
                .as_ref()
                .is_some_and(|g| app.is_some_and(|a| g.matches(a)));
            if !(app_only && matches) {
                continue;
            }
            if let Some(m) = o.mode {
                mode = m;
            }
            if let Some(a) = o.actions.get(rule as usize).copied().flatten() {
                action = a;
            }
        }
        match action {
            Action::Off => None,
            _ => Some((Action::Warn, mode)),
        }
    }

    /// What applies to `view`: [`Policy::effective`] for its namespace and, when an override
    /// names namespaces, for every other namespace it writes (a bulkWrite's `nsInfo`, a
    /// `$merge` / `$out` target, a rename target...) or its pipeline reads (`$lookup`,
    /// `$graphLookup`, `$unionWith`; an explain's, the explained command's), the strictest of
    /// them. An override keyed on a namespace then relaxes a request only when it matches
    /// every namespace the request touches, and tightens it when it matches any: a write
    /// routed through bulkWrite (run on `admin`), an aggregate in another database or one
    /// that reads another collection neither escapes a namespace's tightened rules nor
    /// carries a namespace's relaxed ones elsewhere.
    pub(crate) fn effective_for(
        &self,
        view: &crate::command::CommandView<'_>,
        ctx: &RequestContext<'_>,
    ) -> Effective {
        let own = view.namespace();
        let mut eff = self.effective(own, ctx);
        if self.overrides.iter().any(|o| o.namespace.is_some()) {
            let mut touched = |ns| {
                if ns != own {
                    eff = eff.strictest(&self.effective(ns, ctx));
                }
                std::ops::ControlFlow::Continue(())
            };
            // An unreadable namespace is the rules' to refuse (G001).
            let _ = view.for_each_written_namespace(&mut touched);
            // What an explained command would read is what its explain reads.
            let explained = view.explained().ok().flatten();
            let _ = explained
                .as_ref()
                .unwrap_or(view)
                .for_each_read_namespace(&mut touched);
        }
        eff
    }

    /// Resolves the actions for a request: overrides in order (the last one that sets a rule
    /// wins), then audit mode turns every block into a warning. G001 (unreadable-command)
    /// blocks whatever the mode and the overrides: mongoguard fails closed.
    pub(crate) fn effective(&self, ns: Namespace<'_>, ctx: &RequestContext<'_>) -> Effective {
        let mut eff = Effective {
            actions: self.actions,
            mode: self.mode,
            audited_blocks: 0,
        };
        for o in &self.overrides {
            if !o.matches(ns, ctx) {
                continue;
            }
            if let Some(m) = o.mode {
                eff.mode = m;
            }
            for (slot, a) in eff.actions.iter_mut().zip(o.actions.iter()) {
                if let Some(a) = a {
                    *slot = *a;
                }
            }
        }
        if eff.mode == Mode::Audit {
            for (i, a) in eff.actions.iter_mut().enumerate() {
                if *a == Action::Block {
                    *a = Action::Warn;
                    eff.audited_blocks |= 1u64 << i;
                }
            }
        }
        set_action(&mut eff.actions, super::RuleId::G001, Action::Block);
        eff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let g = Glob::new("analytics.*").unwrap();
        assert!(g.matches("analytics.events"));
        assert!(!g.matches("analytic.events"));
        assert!(Glob::new("*").unwrap().matches(""));
        assert!(Glob::new("a*b*c").unwrap().matches("aXXbYYc"));
        assert!(!Glob::new("a*b*c").unwrap().matches("aXXbYY"));
        assert!(Glob::new("t_?").unwrap().matches("t_1"));
        assert!(glob_match_parts(&g, "analytics", "x"));
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("nope").is_err());
        assert!(Cidr::parse("192.168.1.7")
            .unwrap()
            .contains("192.168.1.7".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
    }
}
