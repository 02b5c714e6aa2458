//! Test-only: a hook a reload runs between reading its file and installing what it read, and
//! the race the policy's and the allowlist's reloads are tested against with it (SIGHUP and
//! `POST /reload` at once must never leave the older file in force).

use std::{
    fmt::Debug,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    time::Duration,
};

type Hook = Arc<dyn Fn() + Send + Sync>;

/// The hook a reload calls after its read (none set: nothing happens).
#[derive(Default)]
pub(crate) struct AfterRead(Mutex<Option<Hook>>);

impl Debug for AfterRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AfterRead")
    }
}

impl AfterRead {
    /// Runs the hook, if one is set, outside the hook's own lock (holding it would serialise
    /// the reloads under test by accident).
    pub(crate) fn run(&self) {
        let hook = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// The race: a first `reload` (on a thread) reads the file and is held after its read;
/// `change` rewrites the file; a second `reload` runs and, when it does not wait for the
/// first, installs what it read; then the first goes on. Both must succeed. The caller then
/// checks that the newer file is in force.
pub(crate) fn two_reloads<E: Debug + Send + 'static>(
    hook: &AfterRead,
    reload: impl Fn() -> Result<(), E> + Send + Sync + 'static,
    change: impl FnOnce(),
) {
    let (read_tx, read_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (read_tx, go_rx) = (Mutex::new(read_tx), Mutex::new(go_rx));
    let calls = AtomicUsize::new(0);
    *hook.0.lock().unwrap() = Some(Arc::new(move || {
        let _ = read_tx.lock().unwrap().send(());
        // The first reload waits (bounded) to be let go; later ones go on at once.
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(30));
        }
    }));
    let reload = Arc::new(reload);
    let r = reload.clone();
    let first = std::thread::spawn(move || r());
    read_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the first reload read the file");
    change();
    let second = std::thread::spawn(move || reload());
    // Unserialised, the second reload reads the new file and installs it now; serialised, it
    // waits for the first. Either way the first is let go after this bounded wait.
    if read_rx.recv_timeout(Duration::from_secs(2)).is_ok() {
        while !second.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    go_tx.send(()).unwrap();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
}
