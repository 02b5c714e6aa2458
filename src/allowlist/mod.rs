//! The learned allowlist (rule A001): the query shapes each application sends, learned in
//! staging into a reviewable file, enforced in production.
//!
//! A shape is what `/shapes` groups requests by: the command label, `db.collection` and the
//! literal-free shape of the command's first filter ([`ShapeScratch`]), for find, count,
//! distinct, update, delete, findAndModify and aggregate. The application is the handshake's
//! appName (`-` without one).
//!
//! * `learn`: every new (application, shape) is added in memory and the file is rewritten
//!   every `save_interval` and at shutdown, atomically.
//! * `enforce`: a shape the application never sent while learning is an A001 violation,
//!   with the action the policy gives A001 for that request. A request of a known shape costs
//!   a hash and one lookup under a read lock, and allocates nothing.
//! * `off`: nothing.
//!
//! Bounded: at most `max_apps` applications and `max_shapes_per_app` shapes each. Learning
//! past a cap is logged once and adds nothing; a file with more than the caps is loaded up
//! to them (file order) and the rest is unknown. A reload that fails keeps the allowlist in
//! force: never "empty = allow everything".

mod file;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        RwLock,
    },
};

use tracing::{error, info, warn};

use crate::{
    command::{CommandView, Kind},
    config::{AllowlistConfig, AllowlistMode, UnknownApp},
    metrics::ShapeScratch,
    policy::{Action, Policy, RequestContext, RuleId, Violation},
};

pub use file::{MAX_LINE, VERSION};

/// The application name of a client that sent none.
pub const NO_APP: &str = "-";

/// Why an allowlist file was refused.
#[derive(Debug, thiserror::Error)]
#[error("allowlist {path}: {message}")]
pub struct AllowlistError {
    /// The file.
    pub path: String,
    /// What is wrong (TOML errors carry the line).
    pub message: String,
}

/// What a load found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loaded {
    /// Applications in force.
    pub apps: usize,
    /// Shapes in force, over every application.
    pub shapes: usize,
    /// Applications and shapes of the file left out by the caps (unknown in enforce mode).
    pub over_caps: usize,
}

/// One application's shapes: lines by their hash (collisions are told apart by comparing
/// the line itself).
#[derive(Debug, Default)]
struct AppShapes {
    by_hash: HashMap<u64, Vec<Box<str>>>,
    len: usize,
}

impl AppShapes {
    fn contains(&self, hash: u64, parts: Parts<'_>) -> bool {
        self.by_hash
            .get(&hash)
            .is_some_and(|lines| lines.iter().any(|l| parts.is(l)))
    }

    fn insert(&mut self, hash: u64, line: Box<str>) {
        self.by_hash.entry(hash).or_default().push(line);
        self.len += 1;
    }
}

/// Every application's shapes.
#[derive(Debug, Default)]
struct Table {
    apps: HashMap<Box<str>, AppShapes>,
}

impl Table {
    /// Builds a table from a parsed file, up to the caps.
    fn from_parsed(parsed: file::Parsed, max_apps: usize, max_shapes: usize) -> (Table, Loaded) {
        let mut table = Table::default();
        let mut loaded = Loaded::default();
        for (name, shapes) in parsed {
            if table.apps.len() >= max_apps {
                loaded.over_caps += 1 + shapes.len();
                continue;
            }
            let app = table.apps.entry(name.into_boxed_str()).or_default();
            for line in shapes {
                if app.len >= max_shapes {
                    loaded.over_caps += 1;
                    continue;
                }
                app.insert(fnv(&[line.as_bytes()]), line.into_boxed_str());
                loaded.shapes += 1;
            }
        }
        loaded.apps = table.apps.len();
        (table, loaded)
    }

    fn render(&self) -> String {
        let apps: BTreeMap<&str, BTreeSet<&str>> = self
            .apps
            .iter()
            .map(|(name, shapes)| {
                let lines = shapes.by_hash.values().flatten().map(|l| &**l).collect();
                (&**name, lines)
            })
            .collect();
        file::render(&apps)
    }
}

/// A request's shape: command label, namespace, filter shape; the line is the three joined
/// by single spaces.
#[derive(Clone, Copy)]
struct Parts<'s> {
    command: &'s str,
    ns: &'s str,
    shape: &'s str,
}

impl Parts<'_> {
    fn hash(&self) -> u64 {
        fnv(&[
            self.command.as_bytes(),
            b" ",
            self.ns.as_bytes(),
            b" ",
            self.shape.as_bytes(),
        ])
    }

    /// True when `line` is this shape's line (without building it).
    fn is(&self, line: &str) -> bool {
        let mut rest = line.as_bytes();
        for (i, part) in [self.command, self.ns, self.shape].iter().enumerate() {
            if i > 0 {
                match rest.split_first() {
                    Some((b' ', r)) => rest = r,
                    _ => return false,
                }
            }
            match rest.strip_prefix(part.as_bytes()) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    }

    fn line(&self) -> String {
        format!("{} {} {}", self.command, self.ns, self.shape)
    }
}

/// FNV-1a over the concatenation of `parts`.
fn fnv(parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    parts.iter().fold(OFFSET, |h, part| {
        part.iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
    })
}

/// How a request's shape stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    Known,
    NewShape,
    NewApp,
}

/// The allowlist of one running mongoguard.
#[derive(Debug)]
pub struct Allowlist {
    mode: AllowlistMode,
    path: Option<PathBuf>,
    unknown_app: UnknownApp,
    max_apps: usize,
    max_shapes: usize,
    table: RwLock<Table>,
    /// Learn mode: shapes added since start, and the count last written to the file.
    added: AtomicU64,
    saved: AtomicU64,
    /// A cap was reached while learning (logged once).
    capped: AtomicBool,
    /// Held by a reload from reading the file to installing it: SIGHUP and `POST /reload`
    /// at once otherwise could install the older read last.
    reloading: std::sync::Mutex<()>,
    /// Test hook: runs inside `reload` between reading the file and installing it.
    #[cfg(test)]
    after_read: crate::reload_race::AfterRead,
}

impl Allowlist {
    /// An allowlist that does nothing.
    pub fn off() -> Allowlist {
        Allowlist::empty(&AllowlistConfig::default())
    }

    fn empty(config: &AllowlistConfig) -> Allowlist {
        Allowlist {
            mode: config.mode,
            path: config.file.clone(),
            unknown_app: config.unknown_app,
            max_apps: config.max_apps,
            max_shapes: config.max_shapes_per_app,
            table: RwLock::new(Table::default()),
            added: AtomicU64::new(0),
            saved: AtomicU64::new(0),
            capped: AtomicBool::new(false),
            reloading: std::sync::Mutex::new(()),
            #[cfg(test)]
            after_read: Default::default(),
        }
    }

    /// The allowlist `config` asks for. Enforce mode reads the file (missing or invalid: an
    /// error, never an empty allowlist); learn mode starts from the file when it exists
    /// (learning adds to it) and refuses one it cannot read rather than overwrite it.
    pub fn start(config: &AllowlistConfig) -> Result<Allowlist, AllowlistError> {
        let list = Allowlist::empty(config);
        let Some(path) = list.path.clone() else {
            return Ok(list);
        };
        match list.mode {
            AllowlistMode::Off => {}
            AllowlistMode::Enforce => {
                let loaded = list.reload()?;
                info!(file = %path.display(), apps = loaded.apps, shapes = loaded.shapes,
                    "allowlist enforced");
            }
            AllowlistMode::Learn => {
                if path.exists() {
                    let loaded = list.reload()?;
                    info!(file = %path.display(), apps = loaded.apps, shapes = loaded.shapes,
                        "allowlist learning, starting from the file");
                } else {
                    info!(file = %path.display(), "allowlist learning into a new file");
                }
            }
        }
        Ok(list)
    }

    /// The mode.
    pub fn mode(&self) -> AllowlistMode {
        self.mode
    }

    /// The file.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the file again and swaps it in when it is valid; an invalid or unreadable
    /// file keeps the allowlist in force. (SIGHUP and `POST /reload` in enforce mode.)
    /// Reloads run one at a time, so the last one to start reads the file last.
    pub fn reload(&self) -> Result<Loaded, AllowlistError> {
        let Some(path) = &self.path else {
            return Ok(Loaded::default());
        };
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let err = |message: String| AllowlistError {
            path: path.display().to_string(),
            message,
        };
        // A regular file only, at most MAX_TEXT_FILE_SIZE: a named pipe would block the
        // reload (SIGHUP, POST /reload) until someone writes to it.
        let text = crate::config::read_text_file(path, true).map_err(|e| err(e.to_string()))?;
        let parsed = file::parse(&text).map_err(err)?;
        let (table, loaded) = Table::from_parsed(parsed, self.max_apps, self.max_shapes);
        #[cfg(test)]
        self.after_read.run();
        if loaded.over_caps > 0 {
            warn!(file = %path.display(), left_out = loaded.over_caps,
                max_apps = self.max_apps, max_shapes_per_app = self.max_shapes,
                "the allowlist file has more than the caps: the rest is not loaded (unknown)");
        }
        match self.table.write() {
            Ok(mut g) => *g = table,
            Err(poisoned) => *poisoned.into_inner() = table,
        }
        Ok(loaded)
    }

    /// Applications and shapes held now.
    pub fn counts(&self) -> (usize, usize) {
        let t = self.read();
        (t.apps.len(), t.apps.values().map(|a| a.len).sum())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The one call of the guard, after the policy and the shape capture: learns the
    /// request's shape (learn mode) or returns its A001 violation (enforce mode, an unknown
    /// shape, A001 not off for this request).
    pub fn check<'a>(
        &self,
        policy: &Policy,
        view: &CommandView<'a>,
        rctx: &RequestContext<'_>,
        scratch: &ShapeScratch,
    ) -> Option<Violation<'a>> {
        let app = match rctx.app {
            Some(a) if !a.is_empty() => a,
            _ => NO_APP,
        };
        let parts = scratch
            .captured()
            .map(|(command, ns, shape)| Parts { command, ns, shape });
        match self.mode {
            AllowlistMode::Off => None,
            AllowlistMode::Learn => {
                if let Some(p) = parts {
                    self.learn(app, p);
                }
                None
            }
            AllowlistMode::Enforce => {
                let (found, detail) = match parts {
                    Some(p) => (self.lookup(app, p), None),
                    // A command whose shape is tracked but was not captured (a filter shape
                    // too long to track): it cannot be in the allowlist.
                    None if tracked(view) => (
                        Lookup::NewShape,
                        Some("the filter's shape is longer than mongoguard tracks, so it cannot be in the allowlist"),
                    ),
                    None => return None,
                };
                let detail = match found {
                    Lookup::Known => return None,
                    Lookup::NewApp if self.unknown_app == UnknownApp::Allow => return None,
                    Lookup::NewApp => Some(
                        "this application is not in the allowlist file (allowlist.unknown_app = \"enforce\"): every shape it sends is new",
                    ),
                    Lookup::NewShape => detail,
                };
                let action = policy.effective_for(view, rctx).action(RuleId::A001);
                if action == Action::Off {
                    return None;
                }
                Some(Violation {
                    rule: RuleId::A001,
                    action,
                    statement: None,
                    filter: first_filter(view),
                    detail,
                })
            }
        }
    }

    fn lookup(&self, app: &str, parts: Parts<'_>) -> Lookup {
        let hash = parts.hash();
        match self.read().apps.get(app) {
            None => Lookup::NewApp,
            Some(shapes) if shapes.contains(hash, parts) => Lookup::Known,
            Some(_) => Lookup::NewShape,
        }
    }

    fn learn(&self, app: &str, parts: Parts<'_>) {
        let hash = parts.hash();
        if let Some(shapes) = self.read().apps.get(app) {
            if shapes.contains(hash, parts) {
                return;
            }
        }
        let line = parts.line();
        if line.len() > MAX_LINE {
            return;
        }
        let mut t = self
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !t.apps.contains_key(app) {
            if t.apps.len() >= self.max_apps {
                return self.cap_reached("max_apps", app);
            }
            t.apps.insert(Box::from(app), AppShapes::default());
        }
        let Some(shapes) = t.apps.get_mut(app) else {
            return;
        };
        if shapes.contains(hash, parts) {
            return;
        }
        if shapes.len >= self.max_shapes {
            return self.cap_reached("max_shapes_per_app", app);
        }
        shapes.insert(hash, line.into_boxed_str());
        self.added.fetch_add(1, Ordering::Relaxed);
    }

    fn cap_reached(&self, cap: &'static str, app: &str) {
        if !self.capped.swap(true, Ordering::Relaxed) {
            warn!(cap, app = %crate::text::clip(app, 100),
                "allowlist learning reached allowlist.{cap}: new shapes are not added (logged once)");
        }
    }

    /// Learn mode: writes the file when shapes were learned since the last write (atomic;
    /// a failure leaves the old file and is logged). True when the file was written.
    pub fn save(&self) -> bool {
        let (AllowlistMode::Learn, Some(path)) = (self.mode, &self.path) else {
            return false;
        };
        let added = self.added.load(Ordering::Relaxed);
        if added == self.saved.load(Ordering::Relaxed) && path.exists() {
            return false;
        }
        let text = self.read().render();
        match file::write_atomically(path, &text) {
            Ok(()) => {
                self.saved.store(added, Ordering::Relaxed);
                let (apps, shapes) = self.counts();
                info!(file = %path.display(), apps, shapes, "allowlist written");
                true
            }
            Err(e) => {
                error!(file = %path.display(), error = %e,
                    "cannot write the allowlist file; the previous file is left as it was");
                false
            }
        }
    }

    /// The file's text as it would be written now (tests, tools).
    pub fn render(&self) -> String {
        self.read().render()
    }
}

/// The commands whose shape [`ShapeScratch::capture`] tracks.
fn tracked(view: &CommandView<'_>) -> bool {
    !view.is_explain()
        && matches!(
            view.kind(),
            Kind::Find
                | Kind::Count
                | Kind::Distinct
                | Kind::Update
                | Kind::Delete
                | Kind::FindAndModify
                | Kind::Aggregate
        )
}

/// The command's first filter (the one the shape is of), for the record's `filter_shape`.
fn first_filter<'a>(view: &CommandView<'a>) -> Option<&'a bson::RawDocument> {
    let mut first = None;
    let _ = view.for_each_filter(|_, f| {
        first = Some(f);
        std::ops::ControlFlow::Break(())
    });
    first
}

#[cfg(test)]
mod tests;
