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

/// `--check-config` prints the effective configuration as TOML that mongoguard reads back
/// (defaults filled in, command-line overrides applied), with every secret masked.
#[test]
fn check_config_prints_toml_that_reads_back_with_secrets_masked() {
    let dir = std::env::temp_dir().join(format!("mg-checkcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mongoguard.toml");
    std::fs::write(
        &file,
        r#"
[proxy]
listen = "127.0.0.1:27999"
drain_timeout = "45s"

[upstream]
uri = "mongodb://app:Sup3rSecretUri@db1:27017,db2:27018/?replicaSet=rs0&authSource=admin"

[upstream.identities.reporting]
username = "reporter"
password = "Sup3rSecretIdentity"

[admin]
token = "Sup3rSecretToken"
"#,
    )
    .unwrap();
    let (code, out, err) = mongoguard(&[
        "--check-config",
        "--config",
        file.to_str().unwrap(),
        "--log-level",
        "debug",
    ]);
    assert_eq!(code, 0, "{err}");
    for secret in ["Sup3rSecretUri", "Sup3rSecretIdentity", "Sup3rSecretToken"] {
        assert!(!out.contains(secret), "{secret} printed: {out}");
        assert!(!err.contains(secret), "{secret} printed: {err}");
    }
    assert!(out.contains("app:***@db1:27017,db2:27018"), "{out}");
    assert!(out.contains("drain_timeout = \"45s\""), "{out}");
    assert!(out.contains("level = \"debug\""), "the override: {out}");
    // Defaults are filled in.
    assert!(out.contains("max_client_connections = 10000"), "{out}");
    // It reads back, and prints the same again.
    let again_file = dir.join("again.toml");
    std::fs::write(&again_file, &out).unwrap();
    let reread = mongoguard::config::Config::load(&again_file)
        .unwrap_or_else(|e| panic!("the printed configuration does not read back: {e}\n{out}"));
    assert_eq!(
        reread.proxy.drain_timeout,
        std::time::Duration::from_secs(45)
    );
    let (code, out2, err) =
        mongoguard(&["--check-config", "--config", again_file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, out2, "printing is not stable");
}

/// `--help` names every section the configuration has: the list is checked against the
/// sections the configuration serializes, so the two cannot drift apart.
#[test]
fn help_lists_every_config_section() {
    let (_, long, _) = mongoguard(&["--help"]);
    let text = toml::to_string(&mongoguard::config::Config::default()).unwrap();
    let table: toml::Table = text.parse().unwrap();
    assert!(table.len() >= 9, "{table:?}");
    for section in table.keys() {
        assert!(
            long.contains(&format!("[{section}]")),
            "--help does not list [{section}]"
        );
    }
}
