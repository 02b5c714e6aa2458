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
    modified: RwLock<Option<FileStamp>>,
    /// Held by a reload from reading the file to installing it: two reloads at once (SIGHUP,
    /// `POST /reload`, the mtime poll) otherwise could install the older read last.
    reloading: std::sync::Mutex<()>,
    /// Test hook: runs inside `reload` between reading the file and installing it.
    #[cfg(test)]
    after_read: crate::reload_race::AfterRead,
}

/// What the poll compares to tell that the policy file changed: its modification time, and
/// which file it is (device, inode) and its size, so that a file renamed over it (an atomic
/// `mv`, a Kubernetes ConfigMap's `..data` symlink swap) is a change even when it kept the old
/// file's modification time (`cp -p`, `rsync -t`, `tar`, two writes within the file system's
/// timestamp granularity). Read through symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    dev: u64,
    ino: u64,
}

fn mtime(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let (dev, ino) = {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    };
    #[cfg(not(unix))]
    let (dev, ino) = (0, 0);
    Some(FileStamp {
        modified: m.modified().ok(),
        len: m.len(),
        dev,
        ino,
    })
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
            after_read: Default::default(),
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
            after_read: Default::default(),
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
        self.after_read.run();
        match self.current.write() {
            Ok(mut g) => *g = Arc::new(policy),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(policy),
        }
        if let Ok(mut m) = self.modified.write() {
            *m = modified;
        }
        Ok(Some(hash))
    }

    /// The file's stamp (modification time, identity, size) now, when it differs from the
    /// one last loaded (`None` when unchanged or not a file).
    pub fn changed_on_disk(&self) -> Option<Option<FileStamp>> {
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

    /// A policy file replaced by a rename (an atomic `mv`, or a Kubernetes ConfigMap's
    /// `..data` symlink swap) is a change on disk for the poll even when the new file has the
    /// same modification time as the old one (`cp -p`, `rsync -t`, `tar`, an image layer, two
    /// writes within the file system's timestamp granularity): the poll compared the
    /// modification time alone and never reloaded such a file.
    #[test]
    fn a_renamed_or_swapped_file_is_a_change_even_with_the_same_mtime() {
        let dir = temp_dir("rename");
        // Same length, different rules.
        let v1 = "mode = \"audit\"  \n";
        let v2 = "mode = \"enforce\"\n";
        assert_eq!(v1.len(), v2.len());
        // A plain file replaced by rename.
        let path = dir.join("policy.toml");
        std::fs::write(&path, v1).unwrap();
        let holder = PolicyHolder::load(Some(&path)).unwrap();
        assert!(holder.changed_on_disk().is_none());
        let then = std::fs::metadata(&path).unwrap().modified().unwrap();
        let tmp = dir.join("policy.toml.tmp");
        std::fs::write(&tmp, v2).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(then)
            .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert!(
            holder.changed_on_disk().is_some(),
            "a file renamed over the policy file is not seen as a change"
        );
        holder.reload().unwrap();
        assert!(holder.changed_on_disk().is_none(), "loaded: no change left");
        // The ConfigMap layout: policy.toml -> ..data/policy.toml, ..data -> ..v1.
        use std::os::unix::fs::symlink;
        let cm = dir.join("configmap");
        std::fs::create_dir_all(cm.join("..v1")).unwrap();
        std::fs::create_dir_all(cm.join("..v2")).unwrap();
        std::fs::write(cm.join("..v1/policy.toml"), v1).unwrap();
        std::fs::write(cm.join("..v2/policy.toml"), v2).unwrap();
        let then = std::fs::metadata(cm.join("..v1/policy.toml"))
            .unwrap()
            .modified()
            .unwrap();
        std::fs::File::options()
            .write(true)
            .open(cm.join("..v2/policy.toml"))
            .unwrap()
            .set_modified(then)
            .unwrap();
        symlink("..v1", cm.join("..data")).unwrap();
        symlink("..data/policy.toml", cm.join("policy.toml")).unwrap();
        let holder = PolicyHolder::load(Some(&cm.join("policy.toml"))).unwrap();
        let before = holder.current().hash();
        assert!(holder.changed_on_disk().is_none());
        // The swap: a new symlink renamed over ..data.
        symlink("..v2", cm.join("..data_tmp")).unwrap();
        std::fs::rename(cm.join("..data_tmp"), cm.join("..data")).unwrap();
        assert!(
            holder.changed_on_disk().is_some(),
            "a ConfigMap symlink swap is not seen as a change"
        );
        assert_ne!(holder.reload().unwrap(), Some(before));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// SIGHUP and `POST /reload` at once (or either with the mtime poll): each reload read
    /// the file and then installed what it read, unserialised, so the reload that read the
    /// *older* file could install last, and the older policy stayed in force (until the
    /// next poll, never with `reload_poll = 0`). Here the first reload reads v1 and is held
    /// before installing; the file becomes v2 and a second reload runs; then the first goes
    /// on. v2 must be in force at the end.
    #[test]
    fn concurrent_reloads_never_install_the_older_file() {
        let dir = temp_dir("race");
        let path = dir.join("policy.toml");
        std::fs::write(&path, "mode = \"audit\"\n").unwrap();
        let holder = Arc::new(PolicyHolder::load(Some(&path)).unwrap());
        let v1 = holder.current().hash();
        let mut v2 = 0;
        let h = holder.clone();
        crate::reload_race::two_reloads(
            &holder.after_read,
            move || h.reload().map(|_| ()),
            || {
                std::fs::write(&path, "mode = \"enforce\"\n").unwrap();
                v2 = Policy::load(&path).unwrap().hash();
            },
        );
        assert_ne!(v1, v2);
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
