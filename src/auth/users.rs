//! The users file: SCRAM secrets of the users mongoguard authenticates itself (pooled mode).
//!
//! TOML, unknown keys rejected, one `[[users]]` table per user, secrets in base64:
//!
//! ```toml
//! [[users]]
//! name = "alice"
//! db = "admin"            # optional, default "admin"
//! upstream = "app"        # optional: the upstream identity this user maps to
//!
//! [users.mechanisms.SCRAM-SHA-256]
//! salt = "…"              # base64
//! iterations = 15000
//! stored_key = "…"        # base64, 32 bytes
//! server_key = "…"        # base64, 32 bytes
//!
//! [users.mechanisms.SCRAM-SHA-1]
//! salt = "…"
//! iterations = 10000
//! stored_key = "…"        # base64, 20 bytes
//! server_key = "…"        # base64, 20 bytes
//! ```
//!
//! A user is identified by `(db, name)`; a second entry for the same pair is an error.

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use serde::Deserialize;
use toml::Spanned;

use super::scram::{Mechanism, ScramError, StoredCredential};

/// Why the users file could not be loaded or extended. Messages name the file and, where
/// known, the line; they never contain secrets.
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// The file could not be read or written.
    #[error("{file}: {source}")]
    Io {
        /// The users file.
        file: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, an unknown key, or a wrong type. toml's message without its excerpt of
    /// the file, which could show a secret.
    #[error("{file}:{line}: {message}")]
    Syntax {
        /// The users file.
        file: PathBuf,
        /// 1-based line (1 when toml does not say).
        line: usize,
        /// toml's message.
        message: String,
    },
    /// Well-formed TOML with an invalid value.
    #[error("{file}:{line}: {message}")]
    Invalid {
        /// The users file.
        file: PathBuf,
        /// 1-based line of the offending value.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// `add` was asked for a user that is already in the file.
    #[error("{file}: user {name:?} in database {db:?} already exists")]
    Duplicate {
        /// The users file.
        file: PathBuf,
        /// The user name.
        name: String,
        /// The user's database.
        db: String,
    },
    /// The password cannot be used (e.g. non-ASCII for SCRAM-SHA-256).
    #[error("cannot derive credentials: {0}")]
    Derive(#[from] ScramError),
}

/// One user of the users file.
#[derive(Debug, Clone)]
pub struct User {
    /// The user name.
    pub name: String,
    /// The database the user is defined in (the authentication source).
    pub db: String,
    /// The upstream identity this user maps to, if any (resolved by the caller).
    pub upstream: Option<String>,
    /// One credential per mechanism, strongest first.
    pub credentials: Vec<StoredCredential>,
}

impl User {
    /// The mechanisms this user can authenticate with, strongest first.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        self.credentials.iter().map(|c| c.mechanism).collect()
    }
}

/// The validated users file.
#[derive(Debug, Clone, Default)]
pub struct Users {
    users: HashMap<(String, String), User>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    #[serde(default)]
    users: Vec<UserRepr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserRepr {
    name: Spanned<String>,
    #[serde(default)]
    db: Option<Spanned<String>>,
    #[serde(default)]
    upstream: Option<Spanned<String>>,
    mechanisms: MechanismsRepr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MechanismsRepr {
    #[serde(rename = "SCRAM-SHA-256")]
    sha256: Option<SecretRepr>,
    #[serde(rename = "SCRAM-SHA-1")]
    sha1: Option<SecretRepr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretRepr {
    salt: Spanned<String>,
    iterations: Spanned<u32>,
    stored_key: Spanned<String>,
    server_key: Spanned<String>,
}

impl Users {
    /// Reads and validates a users file.
    ///
    /// # Errors
    /// I/O errors, TOML errors and invalid values, each naming the file (and line).
    pub fn load(path: &Path) -> Result<Users, UsersError> {
        // Read again at every SIGHUP: a regular file only, at most MAX_TEXT_FILE_SIZE.
        let text = crate::config::read_text_file(path, true).map_err(|source| UsersError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        Users::parse(&text, path)
    }

    /// Parses and validates users-file text; `file` is only used in error messages.
    ///
    /// # Errors
    /// TOML errors and invalid values, naming `file` and the line.
    pub fn parse(text: &str, file: &Path) -> Result<Users, UsersError> {
        let repr: FileRepr = toml::from_str(text).map_err(|e| UsersError::Syntax {
            file: file.to_path_buf(),
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            message: e.message().trim_end().to_string(),
        })?;
        let invalid = |span: std::ops::Range<usize>, message: String| UsersError::Invalid {
            file: file.to_path_buf(),
            line: line_of(text, span.start),
            message,
        };
        let mut users = HashMap::new();
        for u in repr.users {
            let name_span = u.name.span();
            let user = user(u).map_err(|(span, msg)| invalid(span, msg))?;
            let key = (user.db.clone(), user.name.clone());
            if users.contains_key(&key) {
                let msg = format!("duplicate user {:?} in database {:?}", user.name, user.db);
                return Err(invalid(name_span, msg));
            }
            users.insert(key, user);
        }
        Ok(Users { users })
    }

    /// The credential of user `name` in database `db` for `mechanism`, if any.
    pub fn lookup(&self, db: &str, name: &str, mechanism: Mechanism) -> Option<&StoredCredential> {
        self.user(db, name)?
            .credentials
            .iter()
            .find(|c| c.mechanism == mechanism)
    }

    /// User `name` of database `db`, if any.
    pub fn user(&self, db: &str, name: &str) -> Option<&User> {
        self.users.get(&(db.to_string(), name.to_string()))
    }

    /// Every user, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.users.values()
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// True when the file defines no user.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

type Spanned2<T> = Result<T, (std::ops::Range<usize>, String)>;

/// One `[[users]]` entry, checked; an error carries the span of the value at fault.
fn user(u: UserRepr) -> Spanned2<User> {
    let name_span = u.name.span();
    let name = u.name.into_inner();
    if name.is_empty() || name.contains('\0') {
        return Err((name_span, "user name must be non-empty".into()));
    }
    let db = match u.db {
        Some(db) if db.get_ref().is_empty() || db.get_ref().contains('\0') => {
            return Err((db.span(), "db must be non-empty".into()));
        }
        Some(db) => db.into_inner(),
        None => "admin".to_string(),
    };
    let upstream = match u.upstream {
        Some(up) if up.get_ref().is_empty() => {
            return Err((up.span(), "upstream must be non-empty".into()));
        }
        other => other.map(Spanned::into_inner),
    };
    let m = u.mechanisms;
    let mut credentials = Vec::new();
    for (mech, secret) in [
        (Mechanism::ScramSha256, m.sha256),
        (Mechanism::ScramSha1, m.sha1),
    ] {
        if let Some(s) = secret {
            credentials.push(credential(mech, s)?);
        }
    }
    if credentials.is_empty() {
        return Err((name_span, format!("user {name:?} has no mechanism")));
    }
    Ok(User {
        name,
        db,
        upstream,
        credentials,
    })
}

fn credential(mechanism: Mechanism, s: SecretRepr) -> Spanned2<StoredCredential> {
    let b64 = |v: Spanned<String>, what: &str| {
        B64.decode(v.get_ref())
            .map_err(|_| (v.span(), format!("{mechanism} {what} is not valid base64")))
    };
    let iterations_span = s.iterations.span();
    let stored_span = s.stored_key.span();
    let server_span = s.server_key.span();
    let salt_span = s.salt.span();
    let cred = StoredCredential {
        mechanism,
        salt: b64(s.salt, "salt")?,
        iterations: s.iterations.into_inner(),
        stored_key: b64(s.stored_key, "stored_key")?,
        server_key: b64(s.server_key, "server_key")?,
    };
    cred.validate().map_err(|why| {
        let span = match why {
            w if w.starts_with("iterations") => iterations_span,
            w if w.starts_with("stored_key") => stored_span,
            w if w.starts_with("server_key") => server_span,
            _ => salt_span,
        };
        (span, format!("{mechanism}: {why}"))
    })?;
    Ok(cred)
}

/// 1-based line of byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()
        .iter()
        .take(at)
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Derives SCRAM-SHA-256 and SCRAM-SHA-1 secrets for `name` in database `db` from `password`
/// (default iteration counts, fresh salts) and appends them to the users file at `path`,
/// creating it (mode 0600 on Unix) if needed. The password is not written anywhere.
///
/// # Errors
/// An existing file that does not load, a user already present, a password SCRAM-SHA-256
/// cannot use (non-ASCII), an empty name or db, or an I/O error.
pub fn add(path: &Path, name: &str, password: &str, db: &str) -> Result<(), UsersError> {
    let file = || path.to_path_buf();
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(UsersError::Io {
                file: file(),
                source,
            })
        }
    };
    if let Some(text) = &existing {
        if Users::parse(text, path)?.user(db, name).is_some() {
            return Err(UsersError::Duplicate {
                file: file(),
                name: name.into(),
                db: db.into(),
            });
        }
    }
    // The leading newline also ends a last line that lacks one.
    let mut block = format!(
        "\n[[users]]\nname = {}\ndb = {}\n",
        toml_string(name),
        toml_string(db)
    );
    for mech in Mechanism::ALL {
        let c = StoredCredential::derive(mech, name, password, mech.default_iterations())?;
        block.push_str(&format!(
            "\n[users.mechanisms.{mech}]\nsalt = \"{}\"\niterations = {}\nstored_key = \"{}\"\nserver_key = \"{}\"\n",
            B64.encode(&c.salt),
            c.iterations,
            B64.encode(&c.stored_key),
            B64.encode(&c.server_key),
        ));
    }
    // Validate the result before touching the file (empty names, odd characters).
    let combined = format!("{}{block}", existing.as_deref().unwrap_or(""));
    Users::parse(&combined, path)?;
    let mut options = std::fs::OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let io = |source| UsersError::Io {
        file: file(),
        source,
    };
    let mut f = options.open(path).map_err(io)?;
    f.write_all(block.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

/// A TOML basic string with escapes.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests;
