//! The policy file format (TOML) and its compilation into an immutable [`Policy`].
//!
//! ```toml
//! extends = "standard"          # base profile: standard (the default) | strict | audit | none
//! mode = "enforce"              # or "audit": every block becomes a warning
//! [rules]
//! W004 = "block"                # an action...
//! Q005 = { action = "warn", max_in = 100, max_or = 8 }   # ...or an action with parameters
//! [[overrides]]                 # applied in order; the last one that sets a rule wins
//! namespace = "analytics.*"     # glob on db.collection
//! app = "nightly-*"             # glob on the handshake's application name
//! user = "etl"                  # glob on the authenticated user
//! client = "10.0.0.0/8"         # CIDR of the client address
//! mode = "audit"                # optional: audit mode for matching requests
//! rules = { Q001 = "off", W004 = "warn" }
//! ```
//!
//! An override relaxes rules only on facts: the user and the client address are facts, the
//! application name is a claim any client makes in its handshake. An override keyed on `app`
//! that relaxes anything (an action below the base or an earlier override, or `mode = "audit"`)
//! is refused unless the file sets `trust_app_name = true` at the top level; an `app`
//! override that only tightens is always accepted. G001 is `block` under every mode and
//! override.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{
    compiled::{Cidr, Glob, Override, Params, Policy},
    rules::{RuleId, RULES, RULE_COUNT},
    Action, Mode, PolicyError,
};

/// The shipped profiles, compiled into the binary (the same files as `policies/*.toml`).
pub const PROFILES: [(&str, &str); 3] = [
    ("standard", include_str!("../../policies/standard.toml")),
    ("strict", include_str!("../../policies/strict.toml")),
    ("audit", include_str!("../../policies/audit.toml")),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    extends: Option<String>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    rules: BTreeMap<String, RuleSetting>,
    #[serde(default)]
    overrides: Vec<OverrideFile>,
    #[serde(default)]
    measure: Option<MeasureFile>,
    #[serde(default)]
    trust_app_name: Option<bool>,
}

/// `[measure]`: every key optional; what is left out keeps the base profile's value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MeasureFile {
    enabled: Option<bool>,
    time_limit_ms: Option<u64>,
    on_error: Option<Action>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RuleSetting {
    Action(Action),
    Table(RuleTable),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleTable {
    action: Action,
    max_in: Option<usize>,
    max_or: Option<usize>,
    max_bytes: Option<usize>,
    max_depth: Option<usize>,
    max_elements: Option<usize>,
    case_insensitive: Option<bool>,
    max_docs: Option<u64>,
    max_connections_per_minute: Option<u64>,
    min_requests_per_connection: Option<u64>,
    min_versions: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideFile {
    namespace: Option<String>,
    app: Option<String>,
    user: Option<String>,
    client: Option<String>,
    mode: Option<Mode>,
    #[serde(default)]
    rules: BTreeMap<String, Action>,
}

/// Most overrides a policy may hold (matching overrides are tracked in a 64-bit mask).
pub const MAX_OVERRIDES: usize = 64;

impl Policy {
    /// The default policy: the `standard` profile compiled into the binary.
    pub fn standard() -> Policy {
        // The profile is compiled in and parsed by a unit test; were it ever unreadable, the
        // fallback blocks everything rather than allow anything.
        Policy::profile("standard").unwrap_or_else(Policy::all_block)
    }

    /// A shipped profile by name.
    pub fn profile(name: &str) -> Option<Policy> {
        let (_, text) = PROFILES.iter().find(|(n, _)| *n == name)?;
        Policy::from_toml(text, &format!("{name} (built in)")).ok()
    }

    /// Reads and compiles a policy file (at most [`crate::config::MAX_TEXT_FILE_SIZE`]
    /// bytes; a named pipe or device is read too: `mongoguard policy validate /dev/stdin`).
    pub fn load(path: &std::path::Path) -> Result<Policy, PolicyError> {
        Self::load_from(path, false)
    }

    /// Reads and compiles the policy file of a running proxy: a regular file only, since it
    /// is read again at every reload ([`crate::config::read_text_file`]).
    pub fn load_reloadable(path: &std::path::Path) -> Result<Policy, PolicyError> {
        Self::load_from(path, true)
    }

    fn load_from(path: &std::path::Path, regular_only: bool) -> Result<Policy, PolicyError> {
        let text = crate::config::read_text_file(path, regular_only).map_err(|source| {
            PolicyError::Read {
                path: path.display().to_string(),
                source,
            }
        })?;
        Policy::from_toml(&text, &path.display().to_string())
    }

    /// Parses, validates and compiles TOML text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        Self::compile(text, origin, 0)
    }

    fn compile(text: &str, origin: &str, depth: usize) -> Result<Policy, PolicyError> {
        let invalid = |message: String| PolicyError::Invalid {
            origin: origin.to_owned(),
            message,
        };
        let file: PolicyFile = toml::from_str(text).map_err(|e| PolicyError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        // A file that names no base extends `standard`: an empty (or truncated) file never
        // turns the rules off. Starting from nothing takes an explicit `extends = "none"`.
        let mut policy = match file
            .extends
            .as_deref()
            .or((depth == 0).then_some("standard"))
        {
            None | Some("none") => Policy::empty(),
            Some(base) => {
                let (_, base_text) =
                    PROFILES.iter().find(|(n, _)| *n == base).ok_or_else(|| {
                        invalid(format!(
                            "extends = {base:?}: no such profile (standard, strict, audit, none)"
                        ))
                    })?;
                if depth > 2 {
                    return Err(invalid("profiles extend each other too deeply".into()));
                }
                Self::compile(base_text, base, depth + 1)?
            }
        };
        if let Some(mode) = file.mode {
            policy.mode = mode;
        }
        apply_rules(&mut policy, &file.rules).map_err(invalid)?;
        if let Some(m) = &file.measure {
            apply_measure(&mut policy.params.measure, m).map_err(invalid)?;
        }
        if file.overrides.len() > MAX_OVERRIDES {
            return Err(invalid(format!("at most {MAX_OVERRIDES} overrides")));
        }
        if let Some(trust) = file.trust_app_name {
            policy.trust_app_name = trust;
        }
        for (i, o) in file.overrides.iter().enumerate() {
            let o = compile_override(o).map_err(|m| invalid(format!("overrides[{i}]: {m}")))?;
            if o.app.is_some() && relaxes(&policy, &o) {
                if !policy.trust_app_name {
                    return Err(invalid(format!(
                        "overrides[{i}] relaxes rules on `app`, the application name a client \
                         claims in its handshake (any client can send any name): key it on \
                         user or client, or set trust_app_name = true at the top level to \
                         accept the claim"
                    )));
                }
                policy.app_relaxing.push(i);
            }
            policy.overrides.push(o);
        }
        policy.hash = fnv1a(text.as_bytes()) ^ policy.hash.rotate_left(7);
        Ok(policy)
    }
}

/// Sets the action (and parameters) of each rule the `[rules]` table names. G001 stays
/// `block` whatever the file says: mongoguard fails closed.
fn apply_rules(policy: &mut Policy, rules: &BTreeMap<String, RuleSetting>) -> Result<(), String> {
    for (code, setting) in rules {
        let id = rule_id(code)?;
        let action = match setting {
            RuleSetting::Action(a) => *a,
            RuleSetting::Table(t) => {
                apply_params(&mut policy.params, id, t)
                    .map_err(|m| format!("rules.{code}: {m}"))?;
                t.action
            }
        };
        refuse_connection_block(id, action)?;
        super::compiled::set_action(&mut policy.actions, id, action);
    }
    if super::compiled::action_in(&policy.actions, RuleId::G001) != Action::Block {
        return Err(
            "G001 (unreadable-command) is always \"block\": mongoguard fails closed".into(),
        );
    }
    Ok(())
}

/// The connection standards (C001–C003) are assessed per application from its connections,
/// after the fact: there is no command to refuse, so `block` means nothing for them.
fn refuse_connection_block(id: RuleId, action: Action) -> Result<(), String> {
    if id.is_connection() && action == Action::Block {
        let info = id.info();
        return Err(format!(
            "{} ({}) is a connection standard, reported per application and never per command, so it cannot block: use \"warn\" or \"off\"",
            info.code, info.name
        ));
    }
    Ok(())
}

/// One `[[overrides]]` entry: at least one matcher, and no say over G001.
fn compile_override(o: &OverrideFile) -> Result<Override, String> {
    let mut actions = [None; RULE_COUNT];
    for (code, action) in &o.rules {
        let id = rule_id(code)?;
        if id == RuleId::G001 {
            return Err("G001 cannot be overridden".into());
        }
        refuse_connection_block(id, *action)?;
        super::compiled::set_action(&mut actions, id, Some(*action));
    }
    if o.namespace.is_none() && o.app.is_none() && o.user.is_none() && o.client.is_none() {
        return Err("needs at least one of namespace, app, user, client".into());
    }
    Ok(Override {
        namespace: o.namespace.as_deref().map(Glob::new).transpose()?,
        app: o.app.as_deref().map(Glob::new).transpose()?,
        user: o.user.as_deref().map(Glob::new).transpose()?,
        client: o.client.as_deref().map(Cidr::parse).transpose()?,
        mode: o.mode,
        actions,
    })
}

/// True when the override sets `mode = "audit"`, or a rule to an action below the one it
/// may replace for some request: the policy's own, or any an earlier override sets (an
/// earlier override may have tightened the rule for the same request).
fn relaxes(policy: &Policy, o: &Override) -> bool {
    o.mode == Some(Mode::Audit)
        || RULES.iter().any(|r| {
            let earlier = policy
                .overrides
                .iter()
                .filter_map(|e| e.actions.get(r.id as usize).copied().flatten())
                .fold(policy.action(r.id), Action::max);
            let set = o.actions.get(r.id as usize).copied().flatten();
            set.is_some_and(|a| a < earlier)
        })
}

/// The longest `time_limit_ms`: a measurement holds the client's request, so it stays short.
const MAX_MEASURE_MS: u64 = 60_000;

fn apply_measure(p: &mut super::compiled::MeasureParams, m: &MeasureFile) -> Result<(), String> {
    if let Some(enabled) = m.enabled {
        p.enabled = enabled;
    }
    if let Some(ms) = m.time_limit_ms {
        if ms == 0 || ms > MAX_MEASURE_MS {
            return Err(format!(
                "measure.time_limit_ms must be between 1 and {MAX_MEASURE_MS} (got {ms})"
            ));
        }
        p.time_limit = std::time::Duration::from_millis(ms);
    }
    match m.on_error {
        None => {}
        Some(Action::Off) => {
            return Err(
                "measure.on_error must be \"block\" or \"warn\": a failed measurement \
                        is never let through unrecorded"
                    .into(),
            )
        }
        Some(a) => p.on_error = a,
    }
    Ok(())
}

fn rule_id(code: &str) -> Result<RuleId, String> {
    RuleId::from_code(code).ok_or_else(|| {
        let known: Vec<&str> = RULES.iter().map(|r| r.code).collect();
        format!("unknown rule {code:?} (known: {})", known.join(", "))
    })
}

fn apply_params(p: &mut Params, id: RuleId, t: &RuleTable) -> Result<(), String> {
    let allowed: &[&str] = match id {
        RuleId::Q005 => &["max_in", "max_or"],
        RuleId::D001 => &["max_bytes"],
        RuleId::D002 => &["max_depth"],
        RuleId::D003 => &["max_elements"],
        RuleId::Q003 => &["case_insensitive"],
        RuleId::W012 => &["max_docs"],
        RuleId::C001 => &["max_connections_per_minute", "min_requests_per_connection"],
        RuleId::C003 => &["min_versions"],
        _ => &[],
    };
    let given = [
        ("max_in", t.max_in.is_some()),
        ("max_or", t.max_or.is_some()),
        ("max_bytes", t.max_bytes.is_some()),
        ("max_depth", t.max_depth.is_some()),
        ("max_elements", t.max_elements.is_some()),
        ("case_insensitive", t.case_insensitive.is_some()),
        ("max_docs", t.max_docs.is_some()),
        (
            "max_connections_per_minute",
            t.max_connections_per_minute.is_some(),
        ),
        (
            "min_requests_per_connection",
            t.min_requests_per_connection.is_some(),
        ),
        ("min_versions", t.min_versions.is_some()),
    ];
    for (name, set) in given {
        if set && !allowed.contains(&name) {
            return Err(format!(
                "parameter {name} does not apply to this rule (it takes: {})",
                if allowed.is_empty() {
                    "none".into()
                } else {
                    allowed.join(", ")
                }
            ));
        }
    }
    let positive = |name: &str, v: usize| {
        if v == 0 {
            Err(format!("{name} must be at least 1"))
        } else {
            Ok(v)
        }
    };
    if let Some(v) = t.max_in {
        p.max_in = positive("max_in", v)?;
    }
    if let Some(v) = t.max_or {
        p.max_or = positive("max_or", v)?;
    }
    if let Some(v) = t.max_bytes {
        p.max_document_bytes = positive("max_bytes", v)?;
    }
    if let Some(v) = t.max_depth {
        p.max_depth = positive("max_depth", v)?;
    }
    if let Some(v) = t.max_elements {
        p.max_array_elements = positive("max_elements", v)?;
    }
    if let Some(v) = t.max_docs {
        p.max_docs = positive("max_docs", usize::try_from(v).unwrap_or(usize::MAX))? as u64;
    }
    if let Some(v) = t.case_insensitive {
        p.regex_case_insensitive = v;
    }
    if let Some(v) = t.max_connections_per_minute {
        p.connections.max_connections_per_minute = v;
    }
    if let Some(v) = t.min_requests_per_connection {
        p.connections.min_requests_per_connection = positive(
            "min_requests_per_connection",
            usize::try_from(v).unwrap_or(usize::MAX),
        )? as u64;
    }
    if let Some(versions) = &t.min_versions {
        p.connections.min_versions = min_versions(versions)?;
    }
    Ok(())
}

/// C003's `min_versions`: driver name to minimum version. It replaces the base profile's
/// list as a whole.
fn min_versions(
    versions: &BTreeMap<String, String>,
) -> Result<Vec<(String, String, super::connections::Version)>, String> {
    use super::connections::{Version, MAX_MIN_VERSIONS};
    if versions.len() > MAX_MIN_VERSIONS {
        return Err(format!("min_versions: at most {MAX_MIN_VERSIONS} drivers"));
    }
    let mut out = Vec::with_capacity(versions.len());
    for (name, text) in versions {
        if name.is_empty() || name.contains(['|', ' ']) || name.chars().any(char::is_control) {
            return Err(format!(
                "min_versions: bad driver name {name:?} (one name, as the driver reports it in \
                 client.driver.name; no spaces or '|')"
            ));
        }
        let version = Version::parse(text).ok_or_else(|| {
            format!(
                "min_versions.{name}: {text:?} is not a version (dotted numbers, like \"4.0.0\")"
            )
        })?;
        out.push((name.clone(), text.clone(), version));
    }
    Ok(out)
}

/// FNV-1a 64: a stable content hash for `GET /policy` and logs.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_truncated_file_is_the_standard_profile_not_rules_off() {
        let empty = Policy::from_toml("", "empty.toml").unwrap();
        let standard = Policy::standard();
        for r in RULES.iter() {
            assert_eq!(empty.action(r.id), standard.action(r.id), "{}", r.code);
        }
        let none = Policy::from_toml("extends = \"none\"\n", "none.toml").unwrap();
        assert_eq!(none.action(RuleId::W001), Action::Off);
        assert_eq!(none.action(RuleId::G001), Action::Block);
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let cases = [
            ("[rules]\nW001 = \"maybe\"\n", "W001"),
            ("[rules]\nX123 = \"block\"\n", "unknown rule"),
            (
                "[rules]\nW001 = { action = \"block\", max_in = 3 }\n",
                "does not apply",
            ),
            ("[rules]\nG001 = \"warn\"\n", "G001"),
            (
                "[[overrides]]\nrules = { W001 = \"off\" }\n",
                "at least one of",
            ),
            ("[[overrides]]\nclient = \"10.0.0.0/40\"\n", "bad prefix"),
            ("extends = \"lenient\"\n", "no such profile"),
            ("[measure]\non_error = \"off\"\n", "never let through"),
            ("[measure]\ntime_limit_ms = 0\n", "time_limit_ms"),
            ("[measure]\nlimit = 3\n", "unknown field"),
            (
                "[rules]\nW012 = { action = \"warn\", max_docs = 0 }\n",
                "max_docs",
            ),
            ("mode = \"enforce\"\nmdoe = \"audit\"\n", "line 2"),
        ];
        for (text, want) in cases {
            let err = Policy::from_toml(text, "p.toml").unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(err.contains("p.toml"), "{err}");
        }
    }

    #[test]
    fn an_app_override_that_relaxes_is_refused_unless_the_app_name_is_trusted() {
        // Each relaxes something on the application name alone.
        let relaxing = [
            // an action below the base (W001 is block in standard)
            "[[overrides]]\napp = \"nightly-*\"\nrules = { W001 = \"warn\" }\n",
            // off
            "[[overrides]]\napp = \"etl\"\nrules = { Q001 = \"off\" }\n",
            // audit mode, with no rule named
            "[[overrides]]\napp = \"etl\"\nmode = \"audit\"\n",
            // app together with a namespace still rests on the claim
            "[[overrides]]\nnamespace = \"a.*\"\napp = \"x\"\nrules = { W004 = \"off\" }\n",
            // below what an earlier override tightened the rule to for the same request
            "[[overrides]]\nuser = \"etl\"\nrules = { W004 = \"block\" }\n\
             [[overrides]]\napp = \"x\"\nrules = { W004 = \"warn\" }\n",
            // below the file's own [rules]
            "[rules]\nW010 = \"block\"\n[[overrides]]\napp = \"x\"\nrules = { W010 = \"warn\" }\n",
        ];
        for text in relaxing {
            let err = Policy::from_toml(text, "p.toml").unwrap_err().to_string();
            assert!(err.contains("p.toml"), "{err}");
            assert!(err.contains("relaxes rules on `app`"), "{text:?}: {err}");
            assert!(err.contains("trust_app_name = true"), "{err}");
            let trusted = format!("trust_app_name = true\n{text}");
            let p = Policy::from_toml(&trusted, "p.toml").unwrap();
            assert!(p.trusts_app_name());
            let warnings = p.warnings();
            assert_eq!(warnings.len(), 1, "{text:?}: {warnings:?}");
            assert!(warnings[0].contains("app"), "{warnings:?}");
            // Explicitly untrusted is the default: refused.
            let untrusted = format!("trust_app_name = false\n{text}");
            assert!(Policy::from_toml(&untrusted, "p.toml").is_err(), "{text:?}");
        }
        // Tightening (or restating the base) on the application name is fine, untrusted.
        let tightening = [
            "[[overrides]]\napp = \"x\"\nrules = { W004 = \"block\", Q001 = \"block\" }\n",
            "[[overrides]]\napp = \"x\"\nmode = \"enforce\"\nrules = { W001 = \"block\" }\n",
            // facts may relax
            "[[overrides]]\nuser = \"etl\"\nmode = \"audit\"\nrules = { W001 = \"off\" }\n",
            "[[overrides]]\nclient = \"10.0.0.0/8\"\nrules = { Q001 = \"off\" }\n",
        ];
        for text in tightening {
            let p = Policy::from_toml(text, "p.toml").unwrap();
            assert!(p.warnings().is_empty(), "{text:?}");
            assert!(!p.trusts_app_name());
        }
        assert!(Policy::from_toml("trust_app_name = \"yes\"\n", "p.toml").is_err());
    }

    #[test]
    fn g001_blocks_under_audit_mode_and_every_override() {
        use crate::{command::Namespace, policy::RequestContext};
        let text = "mode = \"audit\"\ntrust_app_name = true\n\
                    [[overrides]]\napp = \"x\"\nmode = \"audit\"\nrules = { W001 = \"off\" }\n\
                    [[overrides]]\nuser = \"u\"\nmode = \"audit\"\n";
        let p = Policy::from_toml(text, "p.toml").unwrap();
        let ns = Namespace {
            db: "app",
            coll: Some("c"),
        };
        let contexts = [
            RequestContext::default(),
            RequestContext {
                app: Some("x"),
                user: Some("u"),
                ..RequestContext::default()
            },
        ];
        for ctx in contexts {
            let eff = p.effective(ns, &ctx);
            assert_eq!(eff.mode, Mode::Audit);
            assert_eq!(eff.action(RuleId::G001), Action::Block);
            assert_eq!(eff.action(RuleId::W003), Action::Warn, "audit still warns");
        }
        for name in ["audit", "standard", "strict"] {
            let p = Policy::profile(name).unwrap();
            let eff = p.effective(ns, &RequestContext::default());
            assert_eq!(eff.action(RuleId::G001), Action::Block, "{name}");
        }
    }
}
