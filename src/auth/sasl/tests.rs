use std::sync::OnceLock;

use bson::{rawdoc, RawDocumentBuf};

use super::*;
use crate::auth::{scram::ClientConversation, users};

/// alice/s3cret in admin, derived once (PBKDF2 is slow in debug builds).
fn users() -> &'static Users {
    static USERS: OnceLock<Users> = OnceLock::new();
    USERS.get_or_init(|| {
        use rand::RngCore;
        let path =
            std::env::temp_dir().join(format!("mongoguard-sasl-{:x}.toml", rand::rng().next_u64()));
        users::add(&path, "alice", "s3cret", "admin").unwrap();
        let loaded = Users::load(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        loaded
    })
}

fn bin(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn payload_of(reply: &RawDocumentBuf) -> Vec<u8> {
    match reply.get("payload").unwrap() {
        Some(RawBsonRef::Binary(b)) => b.bytes.to_vec(),
        other => panic!("no payload in {reply:?}: {other:?}"),
    }
}

fn code(reply: &RawDocumentBuf) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn done(reply: &RawDocumentBuf) -> bool {
    reply.get_bool("done").unwrap()
}

/// Runs saslStart + saslContinue(s); returns the session and the last reply.
fn authenticate(
    mech: Mechanism,
    user: &str,
    password: &str,
    skip_empty: bool,
) -> (SaslSession, RawDocumentBuf) {
    let mut session = SaslSession::new();
    let mut client = ClientConversation::new(mech, user, password).unwrap();
    let start = session.sasl_start(
        users(),
        &rawdoc! {
            "saslStart": 1, "mechanism": mech.name(), "payload": bin(client.client_first()),
            "options": {"skipEmptyExchange": skip_empty}, "$db": "admin",
        },
    );
    if code(&start).is_some() {
        return (session, start);
    }
    assert!(!done(&start));
    let id = start.get_i32("conversationId").unwrap();
    let client_final = client.handle_server_first(&payload_of(&start)).unwrap();
    let cont = session.sasl_continue(&rawdoc! {
        "saslContinue": 1, "conversationId": id, "payload": bin(client_final), "$db": "admin",
    });
    if code(&cont).is_some() {
        return (session, cont);
    }
    client.verify_server_final(&payload_of(&cont)).unwrap();
    if skip_empty {
        assert!(done(&cont));
        return (session, cont);
    }
    assert!(!done(&cont));
    assert!(
        session.authenticated().is_none(),
        "not before the empty exchange"
    );
    let last = session.sasl_continue(&rawdoc! {
        "saslContinue": 1, "conversationId": id, "payload": bin(Vec::new()), "$db": "admin",
    });
    assert!(done(&last));
    (session, last)
}

#[test]
fn both_mechanisms_with_and_without_empty_exchange() {
    for mech in Mechanism::ALL {
        for skip in [true, false] {
            let (session, last) = authenticate(mech, "alice", "s3cret", skip);
            assert_eq!(last.get_f64("ok").unwrap(), 1.0);
            let who = session.authenticated().unwrap();
            assert_eq!((who.db.as_str(), who.name.as_str()), ("admin", "alice"));
            assert_eq!(who.mechanism, mech);
            assert!(!session.in_progress());
        }
    }
}

#[test]
fn wrong_password_and_unknown_user_get_the_same_reply() {
    for mech in Mechanism::ALL {
        let (session, wrong) = authenticate(mech, "alice", "nope", true);
        assert!(session.authenticated().is_none());
        let (_, unknown) = authenticate(mech, "mallory", "s3cret", true);
        assert_eq!(code(&wrong), Some(AUTHENTICATION_FAILED));
        assert_eq!(wrong.as_bytes(), unknown.as_bytes());
        assert_eq!(wrong.as_bytes(), auth_failed().as_bytes());
    }
}

#[test]
fn speculative_authenticate_then_continue() {
    let mut session = SaslSession::new();
    let mut client = ClientConversation::new(Mechanism::ScramSha256, "alice", "s3cret").unwrap();
    let spec = rawdoc! {
        "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(client.client_first()),
        "db": "admin", "options": {"skipEmptyExchange": true},
    };
    let reply = session.speculative_authenticate(users(), &spec).unwrap();
    assert!(reply.get("ok").unwrap().is_none(), "no ok inside hello");
    let client_final = client.handle_server_first(&payload_of(&reply)).unwrap();
    let cont = session.sasl_continue(&rawdoc! {
        "saslContinue": 1, "conversationId": reply.get_i32("conversationId").unwrap(),
        "payload": bin(client_final), "$db": "admin",
    });
    assert!(done(&cont));
    assert_eq!(session.authenticated().unwrap().name, "alice");

    let no_db = rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(vec![])};
    assert!(SaslSession::new()
        .speculative_authenticate(users(), &no_db)
        .is_none());
    let x509 = rawdoc! {"authenticate": 1, "mechanism": "MONGODB-X509", "db": "$external"};
    assert!(SaslSession::new()
        .speculative_authenticate(users(), &x509)
        .is_none());
}

#[test]
fn protocol_errors() {
    let mut s = SaslSession::new();
    let cont =
        s.sasl_continue(&rawdoc! {"saslContinue": 1, "conversationId": 1, "payload": bin(vec![])});
    assert_eq!(code(&cont), Some(PROTOCOL_ERROR));

    let plain =
        rawdoc! {"saslStart": 1, "mechanism": "PLAIN", "payload": bin(vec![]), "$db": "admin"};
    assert_eq!(
        code(&s.sasl_start(users(), &plain)),
        Some(MECHANISM_UNAVAILABLE)
    );

    let no_db = rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": bin(vec![])};
    assert_eq!(
        code(&s.sasl_start(users(), &no_db)),
        Some(AUTHENTICATION_FAILED)
    );

    let bad_payload =
        rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": 5, "$db": "admin"};
    assert_eq!(
        code(&s.sasl_start(users(), &bad_payload)),
        Some(AUTHENTICATION_FAILED)
    );

    // Started fine, then a foreign conversationId: failed, and the conversation is gone.
    let client = ClientConversation::new(Mechanism::ScramSha1, "alice", "s3cret").unwrap();
    let start = s.sasl_start(
        users(),
        &rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": bin(client.client_first()), "$db": "admin"},
    );
    assert_eq!(start.get_f64("ok").unwrap(), 1.0);
    assert!(s.in_progress());
    let cont =
        s.sasl_continue(&rawdoc! {"saslContinue": 1, "conversationId": 99, "payload": bin(vec![])});
    assert_eq!(code(&cont), Some(AUTHENTICATION_FAILED));
    assert!(!s.in_progress());

    // Started fine, then a saslContinue without conversationId: mongod's IDL
    // (src/mongo/db/auth/sasl_commands.idl: saslContinue's conversationId is a required
    // int, the command strict) refuses it with 40414 before any SASL step. Refused here
    // too, and the conversation is gone: even with the right proof (which the old code took
    // and authenticated), nobody is authenticated.
    let mut client = ClientConversation::new(Mechanism::ScramSha1, "alice", "s3cret").unwrap();
    let start = s.sasl_start(
        users(),
        &rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": bin(client.client_first()), "$db": "admin"},
    );
    assert_eq!(start.get_f64("ok").unwrap(), 1.0);
    let client_final = client.handle_server_first(&payload_of(&start)).unwrap();
    let cont = s.sasl_continue(&rawdoc! {"saslContinue": 1, "payload": bin(client_final)});
    assert_eq!(code(&cont), Some(40414), "{cont:?}");
    assert!(s.authenticated().is_none());
    assert!(cont
        .get_str("errmsg")
        .unwrap()
        .contains("saslContinue.conversationId"));
    assert!(!s.in_progress());

    // alice lives in admin, not in test.
    let client = ClientConversation::new(Mechanism::ScramSha1, "alice", "s3cret").unwrap();
    let other_db = rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": bin(client.client_first()), "$db": "test"};
    assert_eq!(
        s.sasl_start(users(), &other_db).get_f64("ok").unwrap(),
        1.0,
        "fake, not refused"
    );
}

#[test]
fn supported_mechs_do_not_reveal_users() {
    assert_eq!(
        supported_mechs(users(), "admin.alice"),
        vec!["SCRAM-SHA-256", "SCRAM-SHA-1"]
    );
    assert_eq!(
        supported_mechs(users(), "admin.nobody"),
        supported_mechs(users(), "nodot")
    );
    assert_eq!(supported_mechs(users(), "admin.nobody").len(), 2);
}
