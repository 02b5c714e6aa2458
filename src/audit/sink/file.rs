//! The file sink: appended to, rotated by size at line boundaries (so a record is never split
//! across files), and reopened at its path on request (logrotate without `copytruncate`).

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
};

use tracing::{info, warn};

use super::Mark;

/// An append-only file rotated by size: `PATH` → `PATH.1` → … → `PATH.keep` (deleted past
/// that), by rename, between two lines.
#[derive(Debug)]
pub(crate) struct RotatingFile {
    pub(crate) path: PathBuf,
    file: File,
    /// Bytes in the current file.
    size: u64,
    /// 0: never rotate.
    max_size: u64,
    keep: usize,
    /// The last rotation renamed `PATH` away but could not create a new one: lines still go
    /// to the renamed file (nothing is lost), and every batch tries to open `PATH` again.
    reopen_pending: bool,
}

fn open_append(path: &Path) -> io::Result<File> {
    if is_fifo(path) {
        return open_pipe(path);
    }
    OpenOptions::new().append(true).create(true).open(path)
}

fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

/// A named pipe: opening it for writing waits until a reader opens it, which for a log
/// shipper not started (or dead) is for ever. Asked first without waiting (O_NONBLOCK: ENXIO
/// when nobody reads), then, with a reader there, opened for blocking writes (whole lines,
/// as to a file). A reader leaving between the two opens is the one moment left to wait.
fn open_pipe(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!(
                        "{} is a named pipe that nobody reads (start its reader first)",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })?;
    let file = OpenOptions::new().append(true).open(path);
    drop(probe);
    file
}

fn numbered(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl RotatingFile {
    pub(crate) fn open(path: PathBuf, max_size: u64, keep: usize) -> io::Result<RotatingFile> {
        let file = open_append(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path,
            file,
            size,
            max_size,
            keep,
            reopen_pending: false,
        })
    }

    pub(crate) fn write(&mut self, buf: &[u8], marks: &[Mark]) -> io::Result<()> {
        if self.reopen_pending {
            self.reopen();
        }
        if self.max_size == 0 {
            return self.append(buf);
        }
        // [start, end) is the run of whole lines not written yet.
        let mut start = 0;
        let mut end = 0;
        for m in marks {
            let pending = (end - start) as u64;
            let line = (m.end - end) as u64;
            if self.size + pending + line > self.max_size && self.size + pending > 0 {
                self.append(buf.get(start..end).unwrap_or_default())?;
                self.rotate();
                start = end;
            }
            end = m.end;
        }
        debug_assert_eq!(end, buf.len());
        self.append(buf.get(start..).unwrap_or_default())
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// Renames `PATH.(k-1)` to `PATH.k` down to `PATH` → `PATH.1`, then opens a new `PATH`.
    /// Failures are logged and never lose a line: if `PATH` cannot be renamed, writing goes
    /// on in it (the next attempt is after another `max_size` bytes); if a new `PATH` cannot
    /// be created, writing goes on in the renamed file until it can.
    fn rotate(&mut self) {
        let shifted = if self.keep == 0 {
            std::fs::remove_file(&self.path)
        } else {
            for k in (1..self.keep).rev() {
                let from = numbered(&self.path, k);
                if let Err(error) = std::fs::rename(&from, numbered(&self.path, k + 1)) {
                    if error.kind() != io::ErrorKind::NotFound {
                        warn!(file = %from.display(), %error, "audit log rotation: cannot rename an old file");
                    }
                }
            }
            std::fs::rename(&self.path, numbered(&self.path, 1))
        };
        match shifted {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                warn!(
                    file = %self.path.display(),
                    %error,
                    "audit log rotation failed; still writing to the same file, next attempt \
                     after another file_max_size bytes"
                );
                self.size = 0;
                return;
            }
        }
        self.size = 0;
        self.reopen();
    }

    /// Reopens `PATH` when asked (SIGHUP after logrotate renamed it): a renamed file is left
    /// alone, a new one is created at the path. If it cannot be created, lines go on to the
    /// file already open (nothing is lost) and every batch tries again.
    pub(crate) fn reopen_on_request(&mut self) {
        let was_pending = self.reopen_pending;
        self.reopen_pending = false;
        self.reopen();
        if self.reopen_pending {
            return;
        }
        if !was_pending {
            info!(file = %self.path.display(), "audit log reopened");
        }
    }

    fn reopen(&mut self) {
        match open_append(&self.path).and_then(|f| Ok((f.metadata()?.len(), f))) {
            Ok((size, file)) => {
                self.file = file;
                self.size = size;
                if self.reopen_pending {
                    warn!(file = %self.path.display(), "audit log reopened after a failed attempt");
                }
                self.reopen_pending = false;
            }
            Err(error) => {
                if !self.reopen_pending {
                    warn!(
                        file = %self.path.display(),
                        %error,
                        "audit log: cannot create a new file at its path; lines go to the file \
                         already open until it can be created"
                    );
                }
                self.reopen_pending = true;
            }
        }
    }
}
