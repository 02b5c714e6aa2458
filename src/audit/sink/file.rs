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
    /// A failed write (a full disk: ENOSPC after part of a batch went in) left a part of a
    /// line in the file that could not be cut off: the next write starts with a newline, so
    /// the lines after it are whole (else the first one was glued to the fragment).
    torn: bool,
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
            torn: false,
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
        if self.torn {
            self.file.write_all(b"\n")?;
            self.size += 1;
            self.torn = false;
        }
        let mut done = 0;
        while let Some(rest) = bytes.get(done..).filter(|r| !r.is_empty()) {
            match self.file.write(rest) {
                Ok(0) => {
                    self.cut_partial_line(bytes, done);
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => {
                    done += n;
                    self.size += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.cut_partial_line(bytes, done);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// After a write that put only `done` bytes of `bytes` in the file (a full disk): the
    /// part of a line at the end is cut off (the file truncated back to its last whole line)
    /// when the file is a regular one nobody else appended to; otherwise the next write
    /// starts with a newline ([`RotatingFile::torn`]). Either way the lines written once
    /// space returns are whole.
    fn cut_partial_line(&mut self, bytes: &[u8], done: usize) {
        let written = bytes.get(..done).unwrap_or_default();
        let whole = written
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        let partial = (done - whole) as u64;
        if partial == 0 {
            return;
        }
        let cut = self
            .file
            .metadata()
            .ok()
            .filter(|m| m.is_file() && m.len() == self.size);
        if cut.is_some() && self.file.set_len(self.size - partial).is_ok() {
            self.size -= partial;
        } else {
            self.torn = true;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A small tmpfs mounted on a fresh directory for the test's life (unmounted on drop);
    /// `None` when this process may not mount one (not root): the test is skipped then.
    struct SmallFs(PathBuf);

    impl SmallFs {
        fn mount(tag: &str, size: &str) -> Option<SmallFs> {
            let dir = std::env::temp_dir().join(format!("mg-smallfs-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).ok()?;
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !mounted {
                let _ = std::fs::remove_dir(&dir);
                return None;
            }
            Some(SmallFs(dir))
        }
    }

    impl Drop for SmallFs {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    /// `count` JSON lines numbered from `first`, and their marks.
    fn batch(first: usize, count: usize) -> (Vec<u8>, Vec<Mark>) {
        let mut buf = Vec::new();
        let mut marks = Vec::new();
        for n in first..first + count {
            buf.extend_from_slice(
                format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "p".repeat(90)).as_bytes(),
            );
            marks.push(Mark {
                end: buf.len(),
                severity: 4,
            });
        }
        (buf, marks)
    }

    /// The violation log on a full disk: the write of a batch fails with ENOSPC after part
    /// of it went in, ending in the middle of a line. Once space returned, the next batch was
    /// appended right after that fragment, so its first line was glued to it: a line no JSON
    /// reader accepts, and a record lost that was counted as written. The fragment is cut off
    /// now (or, when it cannot be, a newline ends it), and every line after it is whole.
    #[test]
    fn a_full_disk_leaves_no_torn_line_before_the_lines_written_once_space_returns() {
        let Some(fs) = SmallFs::mount("torn", "64k") else {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            return;
        };
        let path = fs.0.join("violations.log");
        let mut file = RotatingFile::open(path.clone(), 0, 0).unwrap();
        let filler = fs.0.join("filler");
        std::fs::write(&filler, vec![b'x'; 40 << 10]).unwrap();
        let (buf, marks) = batch(0, 400);
        let error = file.write(&buf, &marks).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
        std::fs::remove_file(&filler).unwrap();
        let (buf, marks) = batch(1000, 3);
        file.write(&buf, &marks).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            assert!(
                serde_json::from_str::<serde_json::Value>(line).is_ok(),
                "a torn line in the log after a full disk: {line:?}"
            );
        }
        let last: Vec<&str> = text.lines().rev().take(3).collect();
        for (i, n) in [1002, 1001, 1000].iter().enumerate() {
            assert!(
                last[i].starts_with(&format!("{{\"n\":{n},")),
                "{:?}",
                last[i]
            );
        }
        assert!(
            text.lines().count() > 3,
            "nothing of the first batch went in"
        );
    }
}
