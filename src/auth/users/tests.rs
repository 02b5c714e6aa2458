use std::path::{Path, PathBuf};

use super::*;
use crate::auth::scram::{ClientConversation, ServerConversation};

fn temp_path(tag: &str) -> PathBuf {
    use rand::RngCore;
    let n = rand::rng().next_u64();
    std::env::temp_dir().join(format!("mongoguard-users-{tag}-{n:x}.toml"))
}

fn parse(text: &str) -> Result<Users, UsersError> {
    Users::parse(text, Path::new("users.toml"))
}

const K20: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAA="; // 20 bytes
const K32: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="; // 32 bytes

fn one_user(name: &str, key256: &str) -> String {
    format!(
        "[[users]]\nname = \"{name}\"\nupstream = \"app\"\n\n[users.mechanisms.SCRAM-SHA-256]\n\
         salt = \"c2FsdA==\"\niterations = 15000\nstored_key = \"{key256}\"\nserver_key = \"{K32}\"\n\n\
         [users.mechanisms.SCRAM-SHA-1]\nsalt = \"c2FsdA==\"\niterations = 10000\n\
         stored_key = \"{K20}\"\nserver_key = \"{K20}\"\n"
    )
}

#[test]
fn parses_a_valid_file() {
    let users = parse(&one_user("alice", K32)).unwrap();
    let alice = users.user("admin", "alice").unwrap();
    assert_eq!(alice.upstream.as_deref(), Some("app"));
    assert_eq!(
        alice.mechanisms(),
        vec![Mechanism::ScramSha256, Mechanism::ScramSha1]
    );
    let c = users
        .lookup("admin", "alice", Mechanism::ScramSha1)
        .unwrap();
    assert_eq!(
        (c.iterations, c.salt.as_slice()),
        (10000, b"salt".as_slice())
    );
    assert!(users
        .lookup("other", "alice", Mechanism::ScramSha1)
        .is_none());
    assert!(parse("").unwrap().is_empty());
}

#[test]
fn errors_name_file_and_line() {
    let bad_key = parse(&one_user("alice", K20)).unwrap_err().to_string();
    assert!(bad_key.starts_with("users.toml:8:"), "{bad_key}");
    assert!(bad_key.contains("stored_key"), "{bad_key}");

    let dup = format!("{}\n{}", one_user("alice", K32), one_user("alice", K32));
    let dup = parse(&dup).unwrap_err().to_string();
    assert!(
        dup.starts_with("users.toml:18:") && dup.contains("duplicate"),
        "{dup}"
    );

    let unknown = parse("[[users]]\nname = \"a\"\npassword = \"x\"\n").unwrap_err();
    let unknown = unknown.to_string();
    assert!(
        unknown.starts_with("users.toml:3:") && unknown.contains("password"),
        "{unknown}"
    );

    let secret_line = one_user("a", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\"x");
    let shown = parse(&secret_line).unwrap_err().to_string();
    assert!(shown.starts_with("users.toml:8:"), "{shown}");
    assert!(
        !shown.contains("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo"),
        "no excerpt: {shown}"
    );

    let mech = one_user("a", K32).replace("SCRAM-SHA-1]", "PLAIN]");
    assert!(parse(&mech).unwrap_err().to_string().contains("PLAIN"));

    let none = parse("[[users]]\nname = \"a\"\n[users.mechanisms]\n").unwrap_err();
    assert!(none.to_string().contains("no mechanism"), "{none}");

    let low = one_user("a", K32).replace("15000", "10");
    assert!(parse(&low).unwrap_err().to_string().contains(":7:"));

    let not_b64 = one_user("a", K32).replace("c2FsdA==", "!!");
    assert!(parse(&not_b64).unwrap_err().to_string().contains("base64"));
}

#[test]
fn add_appends_and_refuses_duplicates() {
    let path = temp_path("add");
    add(&path, "alice", "s3cret", "admin").unwrap();
    add(&path, "bob, \"the\" builder", "pw", "app").unwrap();
    assert!(matches!(
        add(&path, "alice", "other", "admin"),
        Err(UsersError::Duplicate { .. })
    ));
    assert!(matches!(
        add(&path, "carol", "pässword", "admin"),
        Err(UsersError::Derive(_))
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("s3cret"));
    let users = Users::load(&path).unwrap();
    assert_eq!(users.len(), 2);
    assert!(users.user("app", "bob, \"the\" builder").is_some());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "users file must not be readable by others");
    }

    // The stored secrets authenticate the password they came from.
    for mech in Mechanism::ALL {
        let mut client = ClientConversation::new(mech, "alice", "s3cret").unwrap();
        let (conv, sf) = ServerConversation::start(mech, &client.client_first(), |u| {
            users.lookup("admin", u, mech).cloned()
        })
        .unwrap();
        let cf = client.handle_server_first(&sf).unwrap();
        let (fin, who) = conv.finish(&cf).unwrap();
        client.verify_server_final(&fin).unwrap();
        assert_eq!(who, "alice");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn add_refuses_a_broken_file_and_empty_names() {
    let path = temp_path("broken");
    std::fs::write(&path, "this is not toml").unwrap();
    assert!(matches!(
        add(&path, "a", "pw", "admin"),
        Err(UsersError::Syntax { .. })
    ));
    let _ = std::fs::remove_file(&path);
    let path = temp_path("empty");
    assert!(add(&path, "", "pw", "admin").is_err());
    assert!(!path.exists(), "nothing written for an invalid user");
}
