//! The policy in force, swappable at run time: a reload validates the new file completely
//! and only then swaps it in atomically; an invalid file keeps the old policy.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::SystemTime,
};

use super::{Policy, PolicyError};

/// Where the policy came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// A profile compiled into the binary.
    BuiltIn(&'static str),
    /// A file.
    File(PathBuf),
}

impl PolicySource {
    /// What `--policy NAME`, `[policy] file = "NAME"` and `policy show NAME` mean: a
    /// built-in profile name (`standard`, `strict`, `audit`) or a policy file. A name that is
    /// both a profile and an existing file is refused as ambiguous rather than guessed (write
    /// `./strict` for the file).
    pub fn resolve(name: &Path) -> Result<PolicySource, PolicyError> {
        let profile = name
            .to_str()
            .and_then(|n| super::PROFILES.iter().find(|(p, _)| *p == n))
            .map(|(p, _)| *p);
        match profile {
            Some(p) if name.exists() => Err(PolicyError::Invalid {
                origin: name.display().to_string(),
                message: format!(
                    "both the built-in profile {p} and a file of that name exist; write ./{p} for the file"
                ),
            }),
            Some(p) => Ok(PolicySource::BuiltIn(p)),
            None => Ok(PolicySource::File(name.to_owned())),
        }
    }

    /// Compiles the policy this source names.
    pub fn load(&self) -> Result<Policy, PolicyError> {
        match self {
            PolicySource::BuiltIn(name) => {
                Policy::profile(name).ok_or_else(|| PolicyError::Invalid {
                    origin: (*name).to_owned(),
                    message: "no such built-in profile".to_owned(),
                })
            }
            PolicySource::File(path) => Policy::load(path),
        }
    }
}

impl std::fmt::Display for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicySource::BuiltIn(name) => write!(f, "built-in profile {name}"),
            PolicySource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The current policy and how to reload it.
#[derive(Debug)]
pub struct PolicyHolder {
    current: RwLock<Arc<Policy>>,
    source: PolicySource,
    modified: RwLock<Option<SystemTime>>,
    /// Held by a reload from reading the file to installing it: two reloads at once (SIGHUP,
    /// `POST /reload`, the mtime poll) otherwise could install the older read last.
    reloading: std::sync::Mutex<()>,
    /// Test hook: runs inside `reload` between reading the file and installing it.
    #[cfg(test)]
    after_read: std::sync::Mutex<Option<tests::Hook>>,
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl PolicyHolder {
    /// Loads the initial policy: the file if given (an error is fatal: never fall back to
    /// defaults), else the built-in standard profile.
    pub fn load(file: Option<&Path>) -> Result<PolicyHolder, PolicyError> {
        let source = match file {
            Some(path) => PolicySource::resolve(path)?,
            None => PolicySource::BuiltIn("standard"),
        };
        // Read again at every reload: a regular file from the start (a pipe would read as
        // empty, the standard profile, at the first SIGHUP).
        let policy = match &source {
            PolicySource::File(path) => Policy::load_reloadable(path)?,
            PolicySource::BuiltIn(_) => source.load()?,
        };
        let modified = match &source {
            PolicySource::File(path) => mtime(path),
            PolicySource::BuiltIn(_) => None,
        };
        Ok(PolicyHolder {
            current: RwLock::new(Arc::new(policy)),
            source,
            modified: RwLock::new(modified),
            reloading: std::sync::Mutex::new(()),
            #[cfg(test)]
            after_read: std::sync::Mutex::new(None),
        })
    }

    /// A holder around an already compiled policy (tests, tools).
    pub fn fixed(policy: Policy) -> PolicyHolder {
        PolicyHolder {
            current: RwLock::new(Arc::new(policy)),
            source: PolicySource::BuiltIn("custom"),
            modified: RwLock::new(None),
            reloading: std::sync::Mutex::new(()),
            #[cfg(test)]
            after_read: std::sync::Mutex::new(None),
        }
    }

    /// The policy in force (a reference count bump).
    pub fn current(&self) -> Arc<Policy> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Where it came from.
    pub fn source(&self) -> &PolicySource {
        &self.source
    }

    /// Re-reads the file and swaps it in if it is valid. Built-in profiles never change.
    /// Returns the new policy's hash. Reloads run one at a time, so the last one to start
    /// reads the file last and its policy is the one left in force.
    pub fn reload(&self) -> Result<Option<u64>, PolicyError> {
        let PolicySource::File(path) = &self.source else {
            return Ok(None);
        };
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let modified = mtime(path);
        let policy = Policy::load_reloadable(path)?;
        let hash = policy.hash();
        #[cfg(test)]
        {
            // Not called under the hook's own lock, which would serialise the reloads.
            let hook = self.after_read.lock().unwrap().as_ref().map(|h| h.0.clone());
            if let Some(hook) = hook {
                hook();
            }
        }
        match self.current.write() {
            Ok(mut g) => *g = Arc::new(policy),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(policy),
        }
        if let Ok(mut m) = self.modified.write() {
            *m = modified;
        }
        Ok(Some(hash))
    }

    /// The file's modification time now, when it differs from the one last loaded (`None`
    /// when unchanged or not a file).
    pub fn changed_on_disk(&self) -> Option<Option<SystemTime>> {
        let PolicySource::File(path) = &self.source else {
            return None;
        };
        let now = mtime(path);
        let loaded = self.modified.read().map(|m| *m).unwrap_or(None);
        (now != loaded).then_some(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function `reload` calls between reading the file and installing what it read.
    pub(super) struct Hook(pub(super) Arc<dyn Fn() + Send + Sync>);

    impl std::fmt::Debug for Hook {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Hook")
        }
    }

    /// SIGHUP and `POST /reload` at once (or either with the mtime poll): each reload read
    /// the file and then installed what it read, unserialised, so the reload that read the
    /// *older* file could install last, and the older policy stayed in force (until the
    /// next poll, never with `reload_poll = 0`). Here the first reload reads v1 and is held
    /// before installing; the file becomes v2 and a second reload runs; then the first goes
    /// on. v2 must be in force at the end.
    #[test]
    fn concurrent_reloads_never_install_the_older_file() {
        use std::sync::mpsc;
        let dir = temp_dir("race");
        let path = dir.join("policy.toml");
        std::fs::write(&path, "mode = \"audit\"\n").unwrap();
        let holder = Arc::new(PolicyHolder::load(Some(&path)).unwrap());
        let v1 = holder.current().hash();
        let (read_tx, read_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = std::sync::Mutex::new(go_rx);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let read_tx = std::sync::Mutex::new(read_tx);
        *holder.after_read.lock().unwrap() = Some(Hook(Arc::new(move || {
            let _ = read_tx.lock().unwrap().send(());
            // The first reload waits (bounded) to be let go; later ones go on at once.
            if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                let _ = go_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(std::time::Duration::from_secs(30));
            }
        })));
        let h = holder.clone();
        let first = std::thread::spawn(move || h.reload());
        read_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the first reload read the file");
        std::fs::write(&path, "mode = \"enforce\"\n").unwrap();
        let v2 = Policy::load(&path).unwrap().hash();
        assert_ne!(v1, v2);
        let h = holder.clone();
        let second = std::thread::spawn(move || h.reload());
        // Unserialised, the second reload reads v2 and installs it now; serialised, it waits
        // for the first. Either way the first is let go after this bounded wait.
        let second_read = read_rx
            .recv_timeout(std::time::Duration::from_secs(2))
            .is_ok();
        if second_read {
            // Let it install before the first one does.
            while !second.is_finished() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        go_tx.send(()).unwrap();
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(
            holder.current().hash(),
            v2,
            "an older read of the policy file was installed over a newer one"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mg-holder-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Runs `reload` on a thread of its own: the outcome, or `None` when it did not end in
    /// `bound` (it blocks).
    fn reload_within(
        holder: &Arc<PolicyHolder>,
        bound: std::time::Duration,
    ) -> Option<Result<Option<u64>, PolicyError>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = holder.clone();
        std::thread::spawn(move || {
            let _ = tx.send(h.reload());
        });
        rx.recv_timeout(bound).ok()
    }

    /// SIGHUP (or the mtime poll, or `POST /reload`) with the policy path replaced by a named
    /// pipe (or a `--policy <(...)` process substitution, a device): reading it blocked the
    /// reload until someone wrote to the pipe, on a runtime thread, and every later reload
    /// with it. A reload must refuse what is not a regular file, at once, and keep the old
    /// policy.
    #[test]
    fn reload_refuses_a_fifo_at_once_and_keeps_the_policy() {
        let dir = temp_dir("fifo");
        let path = dir.join("policy.toml");
        std::fs::write(&path, "mode = \"audit\"\n").unwrap();
        let holder = Arc::new(PolicyHolder::load(Some(&path)).unwrap());
        let before = holder.current().hash();
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo");
        let outcome = reload_within(&holder, std::time::Duration::from_secs(10));
        if outcome.is_none() {
            // Release the blocked reader before failing.
            let _ = std::fs::OpenOptions::new().write(true).open(&path);
        }
        let outcome = outcome.expect("a reload of a named pipe ends at once");
        let err = outcome.expect_err("a named pipe is no policy file");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert_eq!(holder.current().hash(), before, "the old policy stays");
        // Nor does a proxy start from one: read once it would be the standard profile (an
        // empty file) at the first SIGHUP.
        let err = PolicyHolder::load(Some(&path)).expect_err("a named pipe at start");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A directory, or a file far larger than any policy (a log file named by mistake), is
    /// refused without reading it whole into memory.
    #[test]
    fn reload_refuses_a_directory_and_a_huge_file() {
        let dir = temp_dir("huge");
        let path = dir.join("policy.toml");
        std::fs::write(&path, "mode = \"audit\"\n").unwrap();
        let holder = Arc::new(PolicyHolder::load(Some(&path)).unwrap());
        let before = holder.current().hash();
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let err = holder.reload().expect_err("a directory");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::remove_dir(&path).unwrap();
        // Sparse: no disk used.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(crate::config::MAX_TEXT_FILE_SIZE + 1).unwrap();
        drop(f);
        let err = holder.reload().expect_err("a huge file");
        assert!(err.to_string().contains("larger than"), "{err}");
        assert_eq!(holder.current().hash(), before, "the old policy stays");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
