//! The command line itself: --version, -h / --help, shell completions, the manual page.

use std::process::Command;

fn mongoguard(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mongoguard"))
        .args(args)
        .output()
        .expect("run mongoguard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_names_the_package_version_and_the_commit() {
    for flag in ["--version", "-V"] {
        let (code, out, _) = mongoguard(&[flag]);
        assert_eq!(code, 0);
        let line = out.trim();
        let expected = format!("mongoguard {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(line.starts_with(&expected), "{line}");
        let commit = &line[expected.len()..line.len() - 1];
        assert!(line.ends_with(')'), "{line}");
        assert!(
            commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
            "{commit:?}"
        );
    }
}

#[test]
fn long_help_has_the_manual_sections_and_short_help_does_not() {
    let (code, long, _) = mongoguard(&["--help"]);
    assert_eq!(code, 0);
    let sections = [
        "DESCRIPTION",
        "MODES",
        "CONFIGURATION",
        "SIGNALS",
        "FILES",
        "EXIT STATUS",
        "EXAMPLES",
    ];
    let mut at = 0;
    for s in sections {
        let pos = long[at..]
            .find(&format!("\n{s}\n"))
            .unwrap_or_else(|| panic!("{s} missing or out of order in:\n{long}"))
            + at;
        at = pos;
    }
    assert!(
        long.contains("SIGHUP") && long.contains("SIGTERM"),
        "{long}"
    );
    assert!(long.contains("drain_timeout"));
    assert!(long.contains("completions"));
    let (code, short, _) = mongoguard(&["-h"]);
    assert_eq!(code, 0);
    assert!(short.len() < long.len() / 2, "-h is not short");
    assert!(!short.contains("EXIT STATUS"));
    assert!(short.contains("--config"));
}

#[test]
fn completions_for_every_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef mongoguard"),
        ("fish", "complete -c mongoguard"),
    ] {
        let (code, out, err) = mongoguard(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.len() > 1000, "{shell}: {} bytes", out.len());
        assert!(out.contains(marker), "{shell}");
        assert!(out.contains("check-config"), "{shell}");
    }
    let (code, _, err) = mongoguard(&["completions", "tcsh"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn man_page_is_roff() {
    let (code, out, _) = mongoguard(&["man"]);
    assert_eq!(code, 0);
    assert!(out.contains(".TH mongoguard 1"), "{out}");
    assert!(out.contains(".SH NAME"));
    assert!(out.contains("SIGHUP"));
}
