//! mongoguard's SCRAM client (`auth::scram::ClientConversation`) against the stand-in's
//! server, over a raw socket: the client side that pooled mode will use toward mongod.

use std::time::Duration;

use bson::{rawdoc, spec::BinarySubtype, Binary, RawBsonRef, RawDocumentBuf};
use futures::StreamExt;
use mongoguard::{
    auth::scram::{ClientConversation, Mechanism},
    wire::{builder::MsgBuilder, MessageCodec, OpMsg},
};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tokio_util::codec::FramedRead;

/// Upper bound on any single wait: a safety net against hangs, not a performance assertion.
const BOUND: Duration = Duration::from_secs(20);

struct Raw {
    read: FramedRead<tokio::net::tcp::OwnedReadHalf, MessageCodec>,
    write: tokio::net::tcp::OwnedWriteHalf,
    next_id: i32,
}

impl Raw {
    async fn connect(standin: &StandIn) -> Raw {
        let (r, w) = TcpStream::connect(standin.addr())
            .await
            .unwrap()
            .into_split();
        Raw {
            read: FramedRead::new(r, MessageCodec::default()),
            write: w,
            next_id: 0,
        }
    }

    async fn command(&mut self, body: RawDocumentBuf) -> RawDocumentBuf {
        self.next_id += 1;
        let id = self.next_id;
        let bytes = MsgBuilder::new(body).encode(id, 0);
        self.write.write_all(&bytes).await.unwrap();
        let reply = tokio::time::timeout(BOUND, self.read.next())
            .await
            .expect("no reply in time")
            .expect("connection closed")
            .expect("bad frame");
        assert_eq!(reply.header().response_to, id);
        OpMsg::parse(reply.bytes()).unwrap().body().to_owned()
    }
}

async fn standin() -> StandIn {
    StandIn::start(StandInConfig {
        users: vec![("alice".into(), "secret".into())],
        ..Default::default()
    })
    .await
    .unwrap()
}

fn bin(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn payload(reply: &RawDocumentBuf) -> Vec<u8> {
    match reply.get("payload").unwrap() {
        Some(RawBsonRef::Binary(b)) => b.bytes.to_vec(),
        _ => panic!("no payload in {reply:?}"),
    }
}

fn ok(reply: &RawDocumentBuf) -> bool {
    matches!(reply.get("ok"), Ok(Some(RawBsonRef::Double(d))) if d == 1.0)
}

fn code(reply: &RawDocumentBuf) -> Option<i32> {
    reply.get_i32("code").ok()
}

/// saslStart + saslContinue(s). `Err(reply)` is the failing reply.
async fn authenticate(
    c: &mut Raw,
    mech: Mechanism,
    password: &str,
    skip_empty: bool,
) -> Result<(), RawDocumentBuf> {
    authenticate_as(c, "alice", mech, password, skip_empty).await
}

/// [`authenticate`] as `user`.
async fn authenticate_as(
    c: &mut Raw,
    user: &str,
    mech: Mechanism,
    password: &str,
    skip_empty: bool,
) -> Result<(), RawDocumentBuf> {
    let mut scram = ClientConversation::new(mech, user, password).unwrap();
    let start = c
        .command(rawdoc! {
            "saslStart": 1, "mechanism": mech.name(), "payload": bin(scram.client_first()),
            "options": {"skipEmptyExchange": skip_empty}, "$db": "admin",
        })
        .await;
    if !ok(&start) {
        return Err(start);
    }
    let id = start.get_i32("conversationId").unwrap();
    let client_final = scram.handle_server_first(&payload(&start)).unwrap();
    let cont = c
        .command(rawdoc! {
            "saslContinue": 1, "conversationId": id, "payload": bin(client_final), "$db": "admin",
        })
        .await;
    if !ok(&cont) {
        return Err(cont);
    }
    scram
        .verify_server_final(&payload(&cont))
        .expect("the stand-in proves it knows alice's credentials");
    let mut done = cont.get_bool("done").unwrap();
    if !skip_empty {
        assert!(!done, "the empty exchange was not skipped");
        let last = c
            .command(rawdoc! {
                "saslContinue": 1, "conversationId": id, "payload": bin(Vec::new()), "$db": "admin",
            })
            .await;
        if !ok(&last) {
            return Err(last);
        }
        done = last.get_bool("done").unwrap();
    }
    assert!(done);
    Ok(())
}

async fn needs_auth(c: &mut Raw) -> RawDocumentBuf {
    c.command(rawdoc! {"find": "things", "filter": {}, "$db": "test"})
        .await
}

#[tokio::test]
async fn client_authenticates_against_the_standin_with_both_mechanisms() {
    let standin = standin().await;
    for mech in Mechanism::ALL {
        for skip_empty in [true, false] {
            let before = standin.stats().authentications();
            let mut c = Raw::connect(&standin).await;
            assert_eq!(
                code(&needs_auth(&mut c).await),
                Some(13),
                "auth is enforced"
            );
            authenticate(&mut c, mech, "secret", skip_empty)
                .await
                .unwrap_or_else(|r| panic!("{mech} failed: {r:?}"));
            let found = needs_auth(&mut c).await;
            assert!(ok(&found), "{mech}: {found:?}");
            assert_eq!(standin.stats().authentications(), before + 1);
        }
    }
}

/// mongod lets a connection authenticate once: a second successful conversation as another
/// user is refused and the first user stays (AuthorizationSessionImpl::addAndAuthorizeUser in
/// mongodb/mongo src/mongo/db/auth/authorization_session_impl.cpp: uassert 5626701 "Each client
/// connection may only be authenticated once. Previously authenticated as: ...", called from
/// doSaslStep in src/mongo/db/auth/sasl_commands.cpp once the mechanism succeeds); the same
/// user again is allowed (with a warning in mongod's log).
#[tokio::test]
async fn a_connection_authenticates_as_one_user_only() {
    let standin = StandIn::start(StandInConfig {
        users: vec![
            ("alice".into(), "secret".into()),
            ("bob".into(), "hunter2".into()),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    for skip_empty in [true, false] {
        let mut c = Raw::connect(&standin).await;
        authenticate_as(
            &mut c,
            "alice",
            Mechanism::ScramSha256,
            "secret",
            skip_empty,
        )
        .await
        .unwrap_or_else(|r| panic!("alice: {r:?}"));
        let refused = authenticate_as(&mut c, "bob", Mechanism::ScramSha256, "hunter2", skip_empty)
            .await
            .expect_err("a second user on one connection");
        assert_eq!(code(&refused), Some(5626701), "{refused:?}");
        assert!(
            refused
                .get_str("errmsg")
                .unwrap()
                .contains("Previously authenticated as: alice@admin"),
            "{refused:?}"
        );
        // Still alice, and alice again is fine.
        assert!(ok(&needs_auth(&mut c).await));
        authenticate_as(&mut c, "alice", Mechanism::ScramSha1, "secret", skip_empty)
            .await
            .unwrap_or_else(|r| panic!("alice again: {r:?}"));
        assert!(ok(&needs_auth(&mut c).await));
    }
}

#[tokio::test]
async fn wrong_password_fails_with_code_18() {
    let standin = standin().await;
    for mech in Mechanism::ALL {
        let mut c = Raw::connect(&standin).await;
        let reply = authenticate(&mut c, mech, "not-the-secret", true)
            .await
            .expect_err("a wrong password must not authenticate");
        assert_eq!(code(&reply), Some(18), "{reply:?}");
        assert_eq!(reply.get_str("codeName").unwrap(), "AuthenticationFailed");
        assert_eq!(code(&needs_auth(&mut c).await), Some(13));
    }
    assert_eq!(standin.stats().authentications(), 0);
}

#[tokio::test]
async fn speculative_authenticate_in_hello() {
    let standin = standin().await;
    let mut c = Raw::connect(&standin).await;
    let mut scram = ClientConversation::new(Mechanism::ScramSha256, "alice", "secret").unwrap();
    let hello = c
        .command(rawdoc! {
            "hello": 1, "saslSupportedMechs": "admin.alice", "$db": "admin",
            "speculativeAuthenticate": {
                "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(scram.client_first()),
                "options": {"skipEmptyExchange": true}, "db": "admin",
            },
        })
        .await;
    assert!(ok(&hello));
    let spec = hello
        .get_document("speculativeAuthenticate")
        .unwrap()
        .to_owned();
    let client_final = scram.handle_server_first(&payload(&spec)).unwrap();
    let cont = c
        .command(rawdoc! {
            "saslContinue": 1, "conversationId": spec.get_i32("conversationId").unwrap(),
            "payload": bin(client_final), "$db": "admin",
        })
        .await;
    assert!(ok(&cont), "{cont:?}");
    scram.verify_server_final(&payload(&cont)).unwrap();
    assert!(ok(&needs_auth(&mut c).await));
}
