//! The pool's connector for real upstream servers.

use std::{sync::Arc, time::Duration};

use super::Topology;
use crate::upstream::{
    pool::{Connector, PoolKey},
    ConnectError, Identities, UpstreamConn,
};

/// The pool's connector: opens, says hello to and authenticates upstream connections as the
/// key's identity, and reports each server's hello to the topology.
pub struct MongoConnector {
    identities: Identities,
    topology: Arc<Topology>,
    connect_timeout: Duration,
    max_message_size: usize,
    tls: Option<crate::tls::UpstreamTls>,
}

impl MongoConnector {
    /// A connector for these identities, reporting to `topology`.
    pub fn new(
        identities: Identities,
        topology: Arc<Topology>,
        connect_timeout: Duration,
        max_message_size: usize,
        tls: Option<crate::tls::UpstreamTls>,
    ) -> MongoConnector {
        MongoConnector {
            identities,
            topology,
            connect_timeout,
            max_message_size,
            tls,
        }
    }
}

impl Connector for MongoConnector {
    type Conn = UpstreamConn;

    async fn connect(&self, key: &PoolKey) -> Result<UpstreamConn, ConnectError> {
        let identity =
            self.identities
                .get(&key.identity)
                .ok_or_else(|| ConnectError::Handshake {
                    host: key.server.to_string(),
                    reason: format!("unknown upstream identity {:?}", key.identity),
                })?;
        let conn = UpstreamConn::open(
            &key.server,
            identity,
            self.connect_timeout,
            self.max_message_size,
            self.tls.as_ref(),
            self.topology.load_balanced(),
        )
        .await?;
        self.topology.observe(&key.server, conn.facts());
        Ok(conn)
    }
}
