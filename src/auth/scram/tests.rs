use base64::{engine::general_purpose::STANDARD as B64, Engine};
use proptest::prelude::*;

use super::*;

struct Vector {
    mech: Mechanism,
    /// MongoDB's SCRAM-SHA-1 password digest (false: the RFC's plain password).
    mongo_digest: bool,
    iterations: u32,
    client_nonce: &'static str,
    server_nonce: &'static str,
    salt: &'static str,
    client_first: &'static str,
    server_first: &'static str,
    client_final: &'static str,
    server_final: &'static str,
}

/// RFC 5802 §5 (SCRAM-SHA-1, plain password "pencil", not MongoDB's digest).
const RFC5802: Vector = Vector {
    mech: Mechanism::ScramSha1,
    mongo_digest: false,
    iterations: 4096,
    client_nonce: "fyko+d2lbbFgONRv9qkxdawL",
    server_nonce: "3rfcNHYJY1ZVvWVs7j",
    salt: "QSXCR+Q6sek8bf92",
    client_first: "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
    server_first: "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
    client_final:
        "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
    server_final: "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
};

/// RFC 7677 §3 (SCRAM-SHA-256, password "pencil").
const RFC7677: Vector = Vector {
    mech: Mechanism::ScramSha256,
    mongo_digest: false,
    iterations: 4096,
    client_nonce: "rOprNGfwEbeRWgbNEkqO",
    server_nonce: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    salt: "W22ZaJ0SNY7soEsUEjb6gQ==",
    client_first: "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    server_first: "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    client_final: "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    server_final: "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
};

fn check_vector(v: &Vector) {
    let salt = B64.decode(v.salt).unwrap();
    let prepared = if v.mongo_digest {
        v.mech.prepare_password("user", "pencil").unwrap()
    } else {
        b"pencil".to_vec()
    };
    let cred = StoredCredential::from_prepared(v.mech, &prepared, salt, v.iterations);
    // Client side.
    let mut client =
        ClientConversation::from_prepared(v.mech, "user", prepared.clone(), v.client_nonce.into());
    assert_eq!(client.client_first(), v.client_first.as_bytes());
    let client_final = client
        .handle_server_first(v.server_first.as_bytes())
        .unwrap();
    assert_eq!(String::from_utf8(client_final).unwrap(), v.client_final);
    client
        .verify_server_final(v.server_final.as_bytes())
        .unwrap();
    // Server side.
    let lookup = |u: &str| (u == "user").then(|| cred.clone());
    let (conv, server_first) = ServerConversation::start_with_nonce(
        v.mech,
        v.client_first.as_bytes(),
        lookup,
        v.server_nonce,
    )
    .unwrap();
    assert_eq!(String::from_utf8(server_first).unwrap(), v.server_first);
    let (server_final, user) = conv.finish(v.client_final.as_bytes()).unwrap();
    assert_eq!(String::from_utf8(server_final).unwrap(), v.server_final);
    assert_eq!(user, "user");
}

/// mongodb/specifications `source/auth/auth.md`, SCRAM-SHA-1 with MongoDB's MD5 digest.
const MONGODB_SHA1: Vector = Vector {
    mech: Mechanism::ScramSha1,
    mongo_digest: true,
    iterations: 10000,
    client_nonce: "fyko+d2lbbFgONRv9qkxdawL",
    server_nonce: "Ho+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE",
    salt: "rQ9ZY3MntBeuP3E1TDVC4w==",
    client_first: "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
    server_first: "r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,s=rQ9ZY3MntBeuP3E1TDVC4w==,i=10000",
    client_final: "c=biws,r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,p=MC2T8BvbmWRckDw8oWl5IVghwCY=",
    server_final: "v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0=",
};

#[test]
fn mongodb_spec_sha1_vector() {
    check_vector(&MONGODB_SHA1);
}

#[test]
fn rfc5802_sha1_vector() {
    check_vector(&RFC5802);
}

#[test]
fn rfc7677_sha256_vector() {
    check_vector(&RFC7677);
}

/// Runs a whole conversation; `tamper` may alter client-final before the server sees it.
fn run(
    mech: Mechanism,
    stored: &StoredCredential,
    user: &str,
    password: &str,
    tamper: impl FnOnce(Vec<u8>) -> Vec<u8>,
) -> Result<String, ScramError> {
    let mut client = ClientConversation::new(mech, user, password)?;
    let (conv, server_first) = ServerConversation::start(mech, &client.client_first(), |u| {
        (u == "alice").then(|| stored.clone())
    })?;
    let client_final = tamper(client.handle_server_first(&server_first)?);
    let (server_final, who) = conv.finish(&client_final)?;
    client.verify_server_final(&server_final)?;
    Ok(who)
}

#[test]
fn round_trips_wrong_password_unknown_user_tampering() {
    for mech in Mechanism::ALL {
        let stored = StoredCredential::derive(mech, "alice", "s3cret", MIN_ITERATIONS).unwrap();
        assert_eq!(stored.salt.len(), mech.salt_len());
        assert_eq!(
            run(mech, &stored, "alice", "s3cret", |c| c).unwrap(),
            "alice"
        );
        let wrong = run(mech, &stored, "alice", "nope", |c| c).unwrap_err();
        let unknown = run(mech, &stored, "bob", "s3cret", |c| c).unwrap_err();
        assert_eq!(wrong, ScramError::AuthenticationFailed);
        assert_eq!(
            unknown, wrong,
            "unknown user must look like a wrong password"
        );
        let flipped = run(mech, &stored, "alice", "s3cret", |mut c| {
            let n = c.len() - 3;
            c[n] = if c[n] == b'A' { b'B' } else { b'A' };
            c
        });
        assert!(flipped.is_err());
        let short = run(mech, &stored, "alice", "s3cret", |c| {
            let s = String::from_utf8(c).unwrap();
            let (head, _) = s.rsplit_once(",p=").unwrap();
            format!("{head},p=AAAA").into_bytes()
        });
        assert_eq!(short.unwrap_err(), ScramError::AuthenticationFailed);
        let other_nonce = run(mech, &stored, "alice", "s3cret", |c| {
            String::from_utf8(c)
                .unwrap()
                .replacen(",r=", ",r=x", 1)
                .into_bytes()
        });
        assert_eq!(other_nonce.unwrap_err(), ScramError::NonceMismatch);
    }
}

#[test]
fn fake_credentials_are_stable_and_plausible() {
    let start = |u: &str| {
        let first = format!("n,,n={u},r=abc");
        let (_, sf) =
            ServerConversation::start(Mechanism::ScramSha256, first.as_bytes(), |_| None).unwrap();
        let sf = String::from_utf8(sf).unwrap();
        sf.split_once(",s=").unwrap().1.to_string()
    };
    assert_eq!(start("ghost"), start("ghost"));
    assert_ne!(start("ghost"), start("spook"));
    assert!(start("ghost").ends_with(",i=15000"));
}

#[test]
fn bad_formats_are_rejected() {
    let start = |m: &[u8]| ServerConversation::start(Mechanism::ScramSha256, m, |_| None).err();
    assert_eq!(
        start(b"p=tls-unique,,n=a,r=b"),
        Some(ScramError::UnsupportedChannelBinding)
    );
    assert_eq!(
        start(b"n,a=admin,n=a,r=b"),
        Some(ScramError::UnsupportedChannelBinding)
    );
    assert_eq!(
        start(b"n,,m=ext,n=a,r=b"),
        Some(ScramError::UnsupportedExtension)
    );
    assert!(start(b"garbage").is_some());
    assert!(start(b"n,,n=a").is_some());
    assert!(start(b"n,,n=a=2,r=b").is_some());
    assert!(start(b"n,,n=,r=b").is_some());
    assert!(start(&[0xff, 0xfe]).is_some());
    assert!(start(b"y,,n=a=2Cb=3D,r=nonce").is_none());

    let mut c = ClientConversation::new(Mechanism::ScramSha1, "a", "b").unwrap();
    assert!(c.verify_server_final(b"v=AAAA").is_err(), "out of order");
    let mut c = ClientConversation::new(Mechanism::ScramSha1, "a", "b").unwrap();
    assert!(
        c.handle_server_first(b"r=evil,s=AAAA,i=4096").is_err(),
        "foreign nonce"
    );
    let mut c = ClientConversation::new(Mechanism::ScramSha1, "a", "b").unwrap();
    let nonce = String::from_utf8(c.client_first()).unwrap();
    let nonce = nonce.rsplit_once("r=").unwrap().1.to_string();
    let huge = format!("r={nonce}x,s=AAAA,i=4000000000");
    assert_eq!(
        c.handle_server_first(huge.as_bytes()),
        Err(ScramError::Iterations(4_000_000_000))
    );
}

#[test]
fn sha256_passwords_must_be_ascii() {
    let e = ClientConversation::new(Mechanism::ScramSha256, "a", "pässword").unwrap_err();
    assert_eq!(e, ScramError::NonAsciiPassword);
    assert!(StoredCredential::derive(Mechanism::ScramSha256, "a", "tab\there", 5000).is_err());
    // SCRAM-SHA-1 hashes the password first, so any password works.
    assert!(StoredCredential::derive(Mechanism::ScramSha1, "a", "pässword", 5000).is_ok());
}

#[test]
fn debug_output_has_no_secrets() {
    let cred = StoredCredential::derive(Mechanism::ScramSha1, "a", "pw", MIN_ITERATIONS).unwrap();
    let shown = format!("{cred:?}");
    assert!(!shown.contains(&format!("{:?}", cred.stored_key)));
    assert!(!shown.contains(&format!("{:?}", cred.server_key)));
    let c = ClientConversation::new(Mechanism::ScramSha256, "a", "hunter2").unwrap();
    assert!(!format!("{c:?}").contains("hunter2"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(first in proptest::collection::vec(any::<u8>(), 0..80),
                                   last in proptest::collection::vec(any::<u8>(), 0..120)) {
        let cred = StoredCredential::from_prepared(Mechanism::ScramSha256, b"x", vec![1; 4], 4096);
        if let Ok((conv, _)) =
            ServerConversation::start(Mechanism::ScramSha256, &first, |_| Some(cred.clone()))
        {
            let _ = conv.finish(&last);
        }
        let mut client = ClientConversation::from_prepared(
            Mechanism::ScramSha1, "u", b"x".to_vec(), "n".into());
        let _ = client.handle_server_first(&first);
        let _ = client.verify_server_final(&last);
    }

    #[test]
    fn structured_client_first_never_panics(s in "[nyp],[a-z=]{0,3},(n=[a-zA-Z=,0-9]{0,6})?,?(r=[!-~]{0,6})?") {
        let _ = ServerConversation::start(Mechanism::ScramSha1, s.as_bytes(), |_| None);
    }
}
