//! The `[tls]` section: TLS on the listener (upstream TLS comes from the upstream URI).

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use super::{duration, ConfigError};

/// The `[tls]` section: TLS on the listener (upstream TLS comes from the upstream URI).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain (leaf first). Setting it (with `key_file`) turns TLS on: every
    /// client must then speak TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the certificate.
    pub key_file: Option<PathBuf>,
    /// PEM CA bundle: when set, clients must present a certificate signed by it.
    pub client_ca_file: Option<PathBuf>,
    /// A client that has not finished the TLS handshake after this long is dropped.
    #[serde(
        deserialize_with = "duration::deserialize",
        serialize_with = "duration::serialize"
    )]
    pub handshake_timeout: Duration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl TlsConfig {
    /// True when the listener speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Both halves of the certificate, and a client CA only with a certificate.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled() && (self.cert_file.is_none() || self.key_file.is_none()) {
            return Err(ConfigError::Invalid(
                "tls: set both cert_file and key_file".into(),
            ));
        }
        if self.client_ca_file.is_some() && !self.enabled() {
            return Err(ConfigError::Invalid(
                "tls.client_ca_file needs tls.cert_file and tls.key_file".into(),
            ));
        }
        Ok(())
    }
}
