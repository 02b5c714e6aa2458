//! Build script: records the git commit for `mongoguard --version`.
//!
//! `MONGOGUARD_GIT_COMMIT` in the build environment wins (container builds, where the
//! context has no `.git`); otherwise `git rev-parse --short HEAD`; otherwise "unknown".
//! Never fails the build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=MONGOGUARD_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = std::env::var("MONGOGUARD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            // Rebuild when HEAD moves: HEAD itself, the branch it points to, packed refs.
            for path in [
                git(&["rev-parse", "--git-path", "HEAD"]),
                git(&["symbolic-ref", "-q", "HEAD"])
                    .and_then(|r| git(&["rev-parse", "--git-path", &r])),
                git(&["rev-parse", "--git-path", "packed-refs"]),
            ]
            .into_iter()
            .flatten()
            {
                println!("cargo:rerun-if-changed={path}");
            }
            git(&["rev-parse", "--short", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".to_string());
    let commit: String = commit
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .take(40)
        .collect();
    println!("cargo:rustc-env=MONGOGUARD_GIT_COMMIT={commit}");
}
