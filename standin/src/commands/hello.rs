//! `hello` / `isMaster` / `ismaster`.

use std::time::Duration;

use bson::{doc, Bson, Document};

use super::{auth, CmdError, CmdResult, Ctx};
use crate::compression;

/// mongod's refusal of `client` metadata in any hello/isMaster after a connection's first.
///
/// mongod (src/mongo/rpc/metadata/client_metadata.cpp, `ClientMetadata::setFromMetadata`,
/// called for every hello/isMaster from src/mongo/db/service_entry_point_common.cpp before the
/// command runs) refuses the `client` field once the connection's metadata is finalized, and
/// the first hello/isMaster finalizes it whether or not it carried metadata
/// (`ClientMetadata::tryFinalize` in src/mongo/db/repl/replication_info.cpp). Error code 186
/// comes from src/mongo/base/error_codes.yml.
pub(crate) fn metadata_cannot_be_mutated() -> CmdError {
    CmdError::new(
        186,
        "ClientMetadataCannotBeMutated",
        "The client metadata document may only be sent in the first hello",
    )
}

/// The client metadata document as mongod's `ClientMetadata` constructor checks it
/// (src/mongo/rpc/metadata/client_metadata.cpp): at most 512 bytes, `driver` with string
/// `name` and `version`, `os` with a string `type`, an optional `application` document whose
/// `name` is a string of at most 128 bytes. Extra fields are allowed.
fn validate_metadata(client: &Document) -> Result<(), CmdError> {
    let missing = |what: String| {
        CmdError::new(
            183,
            "ClientMetadataMissingField",
            format!("Missing required {what} in the client metadata document"),
        )
    };
    let not_doc = |name: &str| {
        CmdError::type_mismatch(format!(
            "The '{name}' field is required to be a BSON document in the client metadata document"
        ))
    };
    let not_string = |path: &str| {
        CmdError::type_mismatch(format!(
            "The '{path}' field must be a string in the client metadata document"
        ))
    };
    if crate::bsonutil::doc_size(client) > 512 {
        return Err(CmdError::new(
            185,
            "ClientMetadataDocumentTooLarge",
            "The client metadata document must be less then or equal to 512 bytes",
        ));
    }
    let sub = |name: &str| -> Result<Option<&Document>, CmdError> {
        match client.get(name) {
            None => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d)),
            Some(_) => Err(not_doc(name)),
        }
    };
    if let Some(app) = sub("application")? {
        match app.get("name") {
            None => {}
            Some(Bson::String(n)) if n.len() > 128 => {
                return Err(CmdError::new(
                    184,
                    "ClientMetadataAppNameTooLarge",
                    "The 'application.name' field must be less then or equal to 128 bytes in the client metadata document",
                ))
            }
            Some(Bson::String(_)) => {}
            Some(_) => return Err(not_string("application.name")),
        }
    }
    let driver = sub("driver")?.ok_or_else(|| missing("sub-document 'driver'".into()))?;
    for field in ["name", "version"] {
        match driver.get(field) {
            Some(Bson::String(_)) => {}
            Some(_) => return Err(not_string(&format!("driver.{field}"))),
            None => return Err(missing(format!("field 'driver.{field}'"))),
        }
    }
    let os = sub("os")?.ok_or_else(|| missing("sub-document 'os'".into()))?;
    match os.get("type") {
        Some(Bson::String(_)) => Ok(()),
        Some(_) => Err(not_string("os.type")),
        None => Err(missing("field 'os.type'".into())),
    }
}

/// Builds the hello reply. `name` is "hello" or "ismaster" (lower-cased).
pub(crate) fn hello(ctx: &mut Ctx, name: &str, cmd: &Document) -> CmdResult {
    let shared = ctx.shared;
    let cfg = &shared.config;
    // As mongod: the metadata is checked before the command runs (so a refused hello does not
    // finalize it); the hello itself then finalizes it.
    match cmd.get("client") {
        None => {}
        Some(_) if ctx.conn.hello_seen => return Err(metadata_cannot_be_mutated()),
        Some(Bson::Document(client)) => {
            validate_metadata(client)?;
            let keys: Vec<&str> = cmd.keys().map(String::as_str).collect();
            tracing::debug!(conn = ctx.conn.id, ?keys, client = %client, "handshake");
            ctx.conn.client_metadata = Some(client.clone());
        }
        // ClientMetadata::parse (same file): a `client` that is not a document.
        Some(_) => {
            return Err(CmdError::type_mismatch(
                "The client metadata document must be a document",
            ))
        }
    }
    let first_hello = !ctx.conn.hello_seen;
    if shared.config.load_balanced && first_hello {
        // load_balancer_support::handleHello: checked on the connection's first hello only.
        if !cmd.get("loadBalanced").is_some_and(crate::bsonutil::truthy) {
            return Err(CmdError::new(
                354,
                "LoadBalancerSupportMismatch",
                "The server is being accessed through a load balancer, but this driver does \
                 not have load balancing enabled",
            ));
        }
    }
    ctx.conn.hello_seen = true;
    let mut r = Document::new();
    if shared.config.load_balanced && first_hello {
        r.insert("serviceId", shared.process_id);
    }
    if cmd.get("helloOk").is_some_and(crate::bsonutil::truthy) {
        r.insert("helloOk", true);
    }
    let role = shared.role();
    let writable = role.is_none_or(|r| r.primary == Some(shared.member_index()));
    if name == "hello" {
        r.insert("isWritablePrimary", writable);
    } else {
        r.insert("ismaster", writable);
    }
    r.insert(
        "topologyVersion",
        doc! {"processId": shared.process_id, "counter": shared.topology_counter()},
    );
    if let (Some((set, i)), Some(role)) = (&shared.member, role) {
        // A member of a multi-member set.
        r.insert(
            "hosts",
            set.hosts
                .iter()
                .cloned()
                .map(Bson::String)
                .collect::<Vec<_>>(),
        );
        r.insert("setName", set.name.clone());
        r.insert("setVersion", 1);
        r.insert("secondary", !writable);
        if let Some(p) = role.primary {
            r.insert("primary", set.hosts[p].clone());
        }
        r.insert("me", set.hosts[*i].clone());
        if writable {
            // As mongod: only the primary reports its electionId.
            r.insert("electionId", crate::replset::election_id(role.term));
        }
        let (tags, lag) = set.member_facts(*i);
        if !tags.is_empty() {
            r.insert("tags", tags);
        }
        r.insert("lastWrite", last_write(role.term, lag));
    } else if let Some(set) = &cfg.replica_set {
        let me = shared.host_port();
        r.insert("hosts", vec![Bson::String(me.clone())]);
        r.insert("setName", set.clone());
        r.insert("setVersion", 1);
        r.insert("secondary", false);
        r.insert("primary", me.clone());
        r.insert("me", me);
        r.insert("electionId", shared.election_id);
        r.insert("lastWrite", last_write(1, Duration::ZERO));
    }
    r.insert("maxBsonObjectSize", 16_777_216);
    r.insert("maxMessageSizeBytes", 48_000_000);
    r.insert("maxWriteBatchSize", 100_000);
    r.insert("localTime", bson::DateTime::now());
    r.insert("logicalSessionTimeoutMinutes", 30);
    r.insert(
        "connectionId",
        i32::try_from(ctx.conn.id).unwrap_or(i32::MAX),
    );
    r.insert("minWireVersion", 0);
    r.insert("maxWireVersion", cfg.wire_version);
    r.insert("readOnly", false);
    if let Some(Bson::Array(offered)) = cmd.get("compression") {
        let agreed: Vec<Bson> = offered
            .iter()
            .filter_map(Bson::as_str)
            .filter(|c| compression::known(c) && cfg.compressors.iter().any(|s| s == c))
            .map(|c| Bson::String(c.to_string()))
            .collect();
        if !agreed.is_empty() {
            r.insert("compression", agreed);
        }
    }
    if let Some(Bson::String(who)) = cmd.get("saslSupportedMechs") {
        if let Some(("admin", user)) = who.split_once('.') {
            if shared.users.contains(user) {
                r.insert("saslSupportedMechs", vec!["SCRAM-SHA-1", "SCRAM-SHA-256"]);
            }
        }
    }
    if let Some(Bson::Document(spec)) = cmd.get("speculativeAuthenticate") {
        // A failed speculative attempt is not an error: the reply just omits the field and
        // the driver authenticates normally (and fails there if the credentials are bad).
        let db = spec.get_str("db").unwrap_or("admin").to_string();
        if let Ok(mut start) = auth::start_conversation(ctx, &db, spec) {
            start.remove("ok");
            r.insert("speculativeAuthenticate", start);
        }
    }
    r.insert("ok", 1.0);
    Ok(r)
}

/// `lastWrite` as a replica set member reports it (optimes "now", in election term `term`).
fn last_write(term: i64, lag: Duration) -> Document {
    let lag_ms = i64::try_from(lag.as_millis()).unwrap_or(i64::MAX);
    let now = bson::DateTime::from_millis(
        bson::DateTime::now()
            .timestamp_millis()
            .saturating_sub(lag_ms),
    );
    let secs = u32::try_from(now.timestamp_millis() / 1000).unwrap_or(u32::MAX);
    let op_time = doc! {"ts": bson::Timestamp { time: secs, increment: 1 }, "t": term};
    doc! {
        "opTime": op_time.clone(), "lastWriteDate": now,
        "majorityOpTime": op_time, "majorityWriteDate": now,
    }
}
