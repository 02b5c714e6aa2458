//! The allowlist file: TOML, one `[[app]]` table per application, one shape per line,
//! everything sorted, so that learning the same traffic again writes the same bytes and a
//! pull request shows exactly which application gained which shape.
//!
//! ```toml
//! version = 1
//!
//! [[app]]
//! name = "billing"
//! shapes = [
//!     'find shop.users {"email": "<string>", "password": "<string>"}',
//!     'update shop.orders {"_id": "<objectId>"}',
//! ]
//! ```
//!
//! A shape line is `<command> <db.collection> <filter shape>`: the command label and the
//! namespace of `/shapes`, and the literal-free filter shape of violation records. A line is
//! written as a TOML literal string (no escapes: the JSON shape reads as is) unless it holds
//! a `'` or a control character; then it is a basic string with escapes.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    path::Path,
};

use serde::Deserialize;

/// The format version written and accepted.
pub const VERSION: u32 = 1;

/// The longest shape line accepted from a file (longer shapes are never learned).
pub const MAX_LINE: usize = 8192;

const HEADER: &str = "\
# mongoguard learned allowlist: the query shapes each application (its handshake appName,
# \"-\" without one) sent while [allowlist] mode = \"learn\". One shape per line:
# \"<command> <db.collection> <filter shape>\", every literal replaced by its type.
# Review changes to this file like code. With [allowlist] mode = \"enforce\", a shape the
# application sends that is not listed here fires rule A001 (unknown-query-shape).
# Written by mongoguard, sorted: learning the same traffic again gives the same file.
";

/// The comment every written file starts with.
#[cfg(test)]
pub(crate) const HEADER_FOR_TESTS: &str = HEADER;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    version: u32,
    #[serde(default)]
    app: Vec<AppDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppDoc {
    name: String,
    #[serde(default)]
    shapes: Vec<String>,
}

/// The parsed file: applications in file order, each with its shape lines (deduplicated, in
/// file order).
pub(crate) type Parsed = Vec<(String, Vec<String>)>;

/// Parses and validates the text of an allowlist file. `Err` is a message (with the line
/// for TOML errors).
pub(crate) fn parse(text: &str) -> Result<Parsed, String> {
    let doc: FileDoc = toml::from_str(text).map_err(|e| e.to_string())?;
    if doc.version != VERSION {
        return Err(format!(
            "version = {} is not supported (this mongoguard reads version = {VERSION})",
            doc.version
        ));
    }
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(doc.app.len());
    for app in doc.app {
        if app.name.is_empty() {
            return Err("an [[app]] has an empty name (\"-\" is the name of no appName)".into());
        }
        if !names.insert(app.name.clone()) {
            return Err(format!("[[app]] name = {:?} appears twice", app.name));
        }
        let mut seen = BTreeSet::new();
        let mut shapes = Vec::with_capacity(app.shapes.len());
        for line in app.shapes {
            check_line(&line).map_err(|why| format!("app {:?}: {why}: {line:?}", app.name))?;
            if seen.insert(line.clone()) {
                shapes.push(line);
            }
        }
        out.push((app.name, shapes));
    }
    Ok(out)
}

/// A line is `<command> <namespace> {<shape>}` with a command label mongoguard produces.
fn check_line(line: &str) -> Result<(), &'static str> {
    if line.len() > MAX_LINE {
        return Err("a shape line longer than mongoguard learns");
    }
    let Some((command, rest)) = line.split_once(' ') else {
        return Err("a shape line is \"<command> <db.collection> <filter shape>\"");
    };
    if !crate::metrics::commands::COMMANDS.contains(&command) {
        return Err("not a command label mongoguard records");
    }
    if !rest.ends_with('}') || !rest.contains(" {") {
        return Err("a shape line ends with the filter shape, a JSON document");
    }
    Ok(())
}

/// Renders applications and their shapes (both sorted by `BTreeMap`/`BTreeSet`).
pub(crate) fn render(apps: &BTreeMap<&str, BTreeSet<&str>>) -> String {
    let mut out = String::with_capacity(256 + apps.len() * 128);
    out.push_str(HEADER);
    out.push_str(&format!("version = {VERSION}\n"));
    for (name, shapes) in apps {
        out.push_str("\n[[app]]\nname = ");
        push_string(&mut out, name);
        if shapes.is_empty() {
            out.push_str("\nshapes = []\n");
            continue;
        }
        out.push_str("\nshapes = [\n");
        for s in shapes {
            out.push_str("    ");
            push_string(&mut out, s);
            out.push_str(",\n");
        }
        out.push_str("]\n");
    }
    out
}

/// A TOML string: a literal string when that needs no escape, else a basic string.
fn push_string(out: &mut String, s: &str) {
    let literal_ok = !s.contains('\'') && !s.chars().any(|c| c.is_control());
    if literal_ok {
        out.push('\'');
        out.push_str(s);
        out.push('\'');
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Replaces `path` with `text` atomically: a temporary file in the same directory, written
/// and synced, then renamed over `path`. On any error (a full disk) the temporary file is
/// removed and `path` is left as it was: never a truncated file.
pub(crate) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "allowlist".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // The rename itself reaches the disk with the directory (best effort).
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_then_parse_gives_the_same_lines() {
        let mut apps = BTreeMap::new();
        apps.insert(
            "billing",
            BTreeSet::from([
                r#"find db.c {"a": "<string>"}"#,
                r#"update db.c {"it's": "<int>"}"#,
                "count db.we\tird {\"x\\ny\": \"<int>\"}",
            ]),
        );
        apps.insert("-", BTreeSet::new());
        let text = render(&apps);
        assert!(
            text.contains("    'find db.c {\"a\": \"<string>\"}',\n"),
            "a literal string: {text}"
        );
        let parsed = parse(&text).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].0, "-");
        assert!(parsed[0].1.is_empty());
        let lines: BTreeSet<&str> = parsed[1].1.iter().map(String::as_str).collect();
        assert_eq!(lines, apps["billing"]);
    }

    #[test]
    fn bad_files_are_refused() {
        for (text, why) in [
            ("version = 2\n", "version"),
            ("[[app]]\nname = \"x\"\n", "version"),
            (
                "version = 1\n[[app]]\nname = \"x\"\nshapes = ['find db.c']\n",
                "ends with",
            ),
            (
                "version = 1\n[[app]]\nname = \"x\"\nshapes = ['frob db.c {}']\n",
                "label",
            ),
            (
                "version = 1\n[[app]]\nname = \"x\"\n[[app]]\nname = \"x\"\n",
                "twice",
            ),
            ("version = 1\n[[app]]\nname = \"\"\n", "empty"),
            ("version = 1\nextra = 3\n", "unknown field"),
            ("version = 1\n[[app]\n", "invalid"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let dir = std::env::temp_dir().join(format!("mg-allow-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("allow.toml");
        write_atomically(&path, "old\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
        // The temporary file cannot be created (a directory is in its place): as a full disk,
        // the write fails and the old file stays whole.
        let tmp = dir.join(format!(".allow.toml.tmp-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        assert!(write_atomically(&path, "new\n").is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
        std::fs::remove_dir(&tmp).unwrap();
        write_atomically(&path, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        assert!(!tmp.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
