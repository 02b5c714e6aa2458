//! What pooled mode answers itself: hello (emulated from the topology), the SCRAM
//! conversation against the users file, and the refusals before authentication.

use std::{sync::Arc, time::Duration};

use bson::{RawDocument, RawDocumentBuf};
use tracing::{debug, warn};

use super::strategy::{PooledSide, HOST_UNREACHABLE, UNAUTHORIZED};
use crate::{
    auth::sasl,
    metrics::EndSessions,
    proxy::{
        client_io::Received,
        error::SessionError,
        guard::Judgement,
        hello::{self, HelloAuth},
        inspect::Request,
        routing::{Class, Routing},
        session::Client,
    },
    upstream::{
        pool::PoolKey,
        topology::{Kind, ReadPref},
        HelloFacts,
    },
    wire::{builder::error_document, Message, WireError},
};

/// mongod's code for a malformed argument (an `lsid.id` that is not a UUID).
const BAD_VALUE: (i32, &str) = (2, "BadValue");

impl PooledSide {
    /// Answers hello, authentication, a ping before authentication, a malformed `lsid`, and
    /// anything else before authentication (refused). True when answered.
    pub(super) async fn answer(
        &mut self,
        client: &mut Client,
        received: &Received,
        request: &Request,
        routing: &Routing,
    ) -> Result<bool, SessionError> {
        let doc = match routing.class() {
            Class::Hello => self.hello(client, received).await?,
            class @ (Class::SaslStart | Class::SaslContinue | Class::OtherAuth) => {
                let mut doc = self.auth_step(client, received, class)?;
                let refused = self.user_limit(client);
                if let Some(refusal) = &refused {
                    doc = refusal.clone();
                }
                client.reply(request, &doc).await?;
                if refused.is_some() {
                    // Answered, then closed at the session's next wait; never bound.
                    client.conn.kill();
                    return Ok(true);
                }
                self.after_auth_step(client, &doc, class);
                return Ok(true);
            }
            Class::Ping if self.identity.is_none() => bson::rawdoc! {"ok": 1.0},
            Class::GetNonce => {
                let nonce = format!("{:016x}", rand::random::<u64>());
                bson::rawdoc! {"nonce": nonce, "ok": 1.0}
            }
            // Forwarded before authentication, as the default identity (acquire()).
            Class::BuildInfo if !routing.bad_lsid => return Ok(false),
            // Answered at once, ended upstream in the background (see `ender`) — only when
            // the policy lets it through.
            Class::EndSessions if matches!(request.judgement, Judgement::Forward) => {
                match self.end_sessions_here(client, received) {
                    Some(n) => {
                        self.ctx.metrics.end_sessions(EndSessions::Answered, n);
                        bson::rawdoc! {"ok": 1.0}
                    }
                    None => return Ok(false),
                }
            }
            _ if routing.bad_lsid => error_document(
                BAD_VALUE.0,
                BAD_VALUE.1,
                "lsid.id must be a UUID (BSON binary subtype 4, 16 bytes)",
            ),
            _ if self.identity.is_none() && self.user.is_some() => error_document(
                UNAUTHORIZED.0,
                UNAUTHORIZED.1,
                "mongoguard: the user this connection authenticated as is no longer in the \
                 users file (removed by a reload); open a new connection",
            ),
            _ if self.identity.is_none() => error_document(
                UNAUTHORIZED.0,
                UNAUTHORIZED.1,
                "command requires authentication (mongoguard pooled mode: authenticate \
                 with the credentials of the mongoguard users file)",
            ),
            // A policy block is answered as one (with its event) by the session.
            _ if routing.identity_wide.is_some()
                && !matches!(request.judgement, Judgement::Block { .. }) =>
            {
                let what = routing.identity_wide.unwrap_or_default();
                let identity = self.identity.as_ref().map_or("", |i| i.name.as_str());
                error_document(
                    UNAUTHORIZED.0,
                    UNAUTHORIZED.1,
                    &format!(
                        "mongoguard pooled mode refuses {what}: it would reach the sessions, \
                         operations or errors of every client sharing the upstream identity \
                         {identity:?}, not only this connection's"
                    ),
                )
            }
            _ => return Ok(false),
        };
        client.reply(request, &doc).await?;
        Ok(true)
    }

    /// Queues the sessions of a plain endSessions of an authenticated client for the
    /// background task; the number of sessions, or `None` (forward it).
    fn end_sessions_here(&self, client: &Client, received: &Received) -> Option<usize> {
        let identity = self.identity.as_ref()?;
        let frame = received.inner.as_ref().unwrap_or(&received.frame);
        let sessions =
            super::ender::local_sessions(frame, client.ctx.config.proxy.max_message_size)?;
        let n = sessions.ids.len();
        self.pooled.ender.defer(identity, sessions).then_some(n)
    }

    /// The emulated hello reply: the topology's facts, this connection's id, and the
    /// mechanisms and speculative authentication of the users file.
    async fn hello(
        &mut self,
        client: &Client,
        received: &Received,
    ) -> Result<RawDocumentBuf, SessionError> {
        let cmd = body(received, client.ctx.config.proxy.max_message_size)?;
        let timeout = self.ctx.config.upstream.connect_timeout;
        let facts = match self.pooled.topology.facts(Duration::ZERO).await {
            Some(f) => Some(f),
            None => {
                tokio::select! {
                    biased;
                    _ = client.kill.cancelled() => return Err(SessionError::Killed),
                    f = self.learn_facts(timeout) => f,
                }
            }
        };
        let Some(facts) = facts else {
            return Ok(error_document(
                HOST_UNREACHABLE.0,
                HOST_UNREACHABLE.1,
                "mongoguard: no upstream server has answered hello yet",
            ));
        };
        let mut auth = HelloAuth::default();
        if let Some(users) = self.pooled.users().as_deref() {
            if let Ok(Some(bson::RawBsonRef::String(who))) = cmd.get("saslSupportedMechs") {
                auth.mechanisms = Some(sasl::supported_mechs(users, who));
            }
            if self.user.is_none() {
                if let Ok(Some(bson::RawBsonRef::Document(spec))) =
                    cmd.get("speculativeAuthenticate")
                {
                    auth.speculative = self.sasl.speculative_authenticate(users, spec);
                }
            }
        }
        Ok(hello::emulated_reply(
            &cmd,
            &facts,
            self.connection_id,
            auth,
            &self.ctx.config.pool.compressors,
        ))
    }

    /// A single upstream server is not monitored: its limits come from a pooled connection.
    async fn learn_facts(&self, timeout: Duration) -> Option<Arc<HelloFacts>> {
        let topo = &self.pooled.topology;
        if *topo.kind() != Kind::Single {
            return topo.facts(timeout).await;
        }
        let host = topo.select(ReadPref::Primary, timeout).await.ok()?;
        let identity = self.pooled.identities.default_identity().name.clone();
        match self
            .pooled
            .pool
            .checkout(&PoolKey::new(host, identity))
            .await
        {
            Ok(c) => {
                let facts = c.facts().clone();
                c.release();
                Some(facts)
            }
            Err(e) => {
                warn!(error = %e, "cannot reach the upstream for its hello");
                None
            }
        }
    }

    /// One step of the SCRAM conversation (or its refusal).
    fn auth_step(
        &mut self,
        client: &Client,
        received: &Received,
        class: Class,
    ) -> Result<RawDocumentBuf, SessionError> {
        let refuse = |msg: &str| error_document(UNAUTHORIZED.0, UNAUTHORIZED.1, msg);
        if self.user.is_some() {
            return Ok(refuse(
                "mongoguard: this connection is already authenticated; authentication commands \
                 after the handshake are refused (open a new connection to change users)",
            ));
        }
        if class == Class::OtherAuth {
            return Ok(refuse(
                "mongoguard pooled mode supports SCRAM-SHA-256 and SCRAM-SHA-1 (saslStart) only",
            ));
        }
        let Some(users) = self.pooled.users() else {
            return Ok(sasl::auth_failed());
        };
        let cmd = body(received, client.ctx.config.proxy.max_message_size)?;
        if class == Class::SaslStart {
            return Ok(self.sasl.sasl_start(&users, &cmd));
        }
        let reply = self.sasl.sasl_continue(&cmd);
        // The credential was fixed at saslStart; a reload since may have removed the user
        // (`users` is the file in force now): his conversation then fails like a wrong
        // password, rather than authenticate someone the users file no longer holds.
        if let Some(user) = self.sasl.authenticated() {
            if users.user(&user.db, &user.name).is_none() {
                debug!(user = %user.name, db = %user.db, "user removed during his conversation");
                self.sasl.forget_user();
                return Ok(sasl::auth_failed());
            }
        }
        Ok(reply)
    }

    /// The refusal of a conversation that just authenticated a user who already has
    /// `pool.max_connections_per_user` connections, or `None`.
    fn user_limit(&self, client: &Client) -> Option<RawDocumentBuf> {
        if self.user.is_some() {
            return None;
        }
        let user = self.sasl.authenticated()?;
        let key = format!("{}.{}", user.db, user.name);
        let limit = self.ctx.config.pool.max_connections_per_user;
        let kind = crate::proxy::control::LimitKind::User;
        if self.ctx.control.claim(&client.conn, kind, &key, limit) {
            return None;
        }
        self.ctx.metrics.refused(crate::metrics::Limit::User);
        debug!(user = %key, limit, "max_connections_per_user reached; connection refused");
        Some(crate::proxy::refuse::limit_error(&format!(
            "mongoguard: too many connections of user {key} (pool.max_connections_per_user = \
             {limit}); connection refused. Close idle connections, or raise the limit"
        )))
    }

    /// Records a failed step; binds the session to the user's upstream identity once a
    /// conversation completed.
    fn after_auth_step(&mut self, client: &Client, reply: &RawDocument, class: Class) {
        if sasl::is_failure(reply) {
            let user = self
                .sasl
                .attempted_user()
                .filter(|_| class != Class::OtherAuth);
            let event = crate::audit::Event::AuthFailed {
                client: client.peer,
                user,
            };
            self.ctx.audit.event(event);
        }
        if self.user.is_some() {
            return;
        }
        let Some(user) = self.sasl.authenticated() else {
            return;
        };
        client.conn.set_user(&format!("{}.{}", user.db, user.name));
        // Read before the users, so that a reload after this shows at the next request.
        let generation = self.pooled.users_generation();
        let Some(users) = self.pooled.users() else {
            return;
        };
        // A user the file in force no longer holds (a reload while his last step was
        // answered) is bound to no identity: his requests are refused.
        let Some(entry) = users.user(&user.db, &user.name) else {
            self.sasl.forget_user();
            return;
        };
        let mapped = entry
            .upstream
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_IDENTITY);
        let Some(identity) = self.pooled.identities.get(mapped) else {
            return;
        };
        self.users_generation = generation;
        debug!(user = %user.name, db = %user.db, identity = %identity.name, "client authenticated");
        self.ctx
            .audit
            .event_with(|| crate::audit::Event::AuthSucceeded {
                client: client.peer,
                user: format!("{}.{}", user.db, user.name),
                mechanism: user.mechanism.name(),
                identity: identity.name.to_string(),
            });
        self.user = Some(format!("{}.{}", user.db, user.name));
        self.identity = Some(identity.clone());
    }
}

/// The command body of a hello or authentication message (decompressed, unwrapped).
fn body(received: &Received, max: usize) -> Result<RawDocumentBuf, SessionError> {
    let frame = received.inner.as_ref().unwrap_or(&received.frame);
    let result = match Message::parse(frame.bytes(), max) {
        Ok(Message::Msg(m)) => Ok(m.body().to_owned()),
        // An OP_QUERY command names its database in the namespace (`admin.$cmd`), not in
        // `$db` (the Java driver 3.x authenticates this way): carried over as `$db`, as
        // mongod reads it.
        Ok(Message::Query(q)) => {
            let mut cmd = q.command().to_owned();
            if !matches!(cmd.get("$db"), Ok(Some(_))) {
                cmd.append(bson::cstr!("$db"), q.database());
            }
            Ok(cmd)
        }
        Ok(other) => Err(WireError::UnknownOpCode(other.op_code() as i32)),
        Err(e) => Err(e),
    };
    result.map_err(SessionError::ClientProtocol)
}
