//! TLS for both sides, with rustls.
//!
//! - Client side ([`ServerTls`]): mongoguard terminates TLS with a PEM certificate chain and
//!   key; with `client_ca_file`, clients must present a certificate signed by that CA.
//! - Upstream side ([`UpstreamTls`]): from the upstream URI's options, as drivers read them:
//!   `tls=true` (or `ssl=true`), `tlsCAFile` (else the Mozilla roots of webpki-roots),
//!   `tlsCertificateKeyFile` (a PEM with the client certificate and its key),
//!   `tlsAllowInvalidHostnames=true` (certificate still verified, name not) and
//!   `tlsAllowInvalidCertificates=true` / `tlsInsecure=true` (nothing verified). Both
//!   weakenings are logged as warnings at startup.

use std::{path::Path, sync::Arc, time::Duration};

use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        WantsClientCert,
    },
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    server::WebPkiClientVerifier,
    CertificateError, ClientConfig, ConfigBuilder, DigitallySignedStruct, RootCertStore,
    ServerConfig, SignatureScheme, WantsVerifier,
};
use tokio::net::TcpStream;
use tracing::warn;

use crate::{
    config::{Host, UpstreamUri},
    net::{ClientStream, Either, UpstreamStream},
};

/// A TLS setting that cannot be used. Names the file or option.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    // A regular file (read again at SIGHUP: a named pipe would block the reload) of PEM text.
    let pem = crate::config::read_text_file(path, true)
        .map_err(|e| TlsError(format!("{what} {}: {e}", path.display())))?;
    let pem = pem.as_bytes();
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    // A regular file (read again at SIGHUP: a named pipe would block the reload) of PEM text.
    let pem = crate::config::read_text_file(path, true)
        .map_err(|e| TlsError(format!("{what} {}: {e}", path.display())))?;
    let pem = pem.as_bytes();
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        TlsError(format!(
            "{what} {}: no usable private key: {e}",
            path.display()
        ))
    })
}

fn roots(certs: Vec<CertificateDer<'static>>, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs {
        store
            .add(c)
            .map_err(|e| TlsError(format!("CA file {}: {e}", path.display())))?;
    }
    Ok(store)
}

/// The client-facing TLS acceptor; every clone shares it, and [`ServerTls::reload`] swaps it
/// for all of them (connections already open keep their session).
#[derive(Clone)]
pub struct ServerTls {
    acceptor: Arc<std::sync::RwLock<tokio_rustls::TlsAcceptor>>,
    /// Held by a reload from reading the files to installing them: SIGHUP and
    /// `ProxyHandle::hangup` at once must never leave the older certificate in force.
    reloading: Arc<std::sync::Mutex<()>>,
    #[cfg(test)]
    after_read: Arc<crate::reload_race::AfterRead>,
    timeout: Duration,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the certificate chain and key (and the client CA, which makes client
    /// certificates mandatory).
    pub fn load(cfg: &crate::config::TlsConfig) -> Result<ServerTls, TlsError> {
        let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) else {
            return Err(TlsError(
                "tls: cert_file and key_file are both required".into(),
            ));
        };
        let chain = read_certs(cert, "tls.cert_file")?;
        let key = read_key(key, "tls.key_file")?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?;
        let builder = match &cfg.client_ca_file {
            Some(ca) => {
                let store = roots(read_certs(ca, "tls.client_ca_file")?, ca)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
                        .build()
                        .map_err(|e| TlsError(format!("tls.client_ca_file: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError(format!("tls: certificate and key do not fit: {e}")))?;
        Ok(ServerTls {
            acceptor: Arc::new(std::sync::RwLock::new(tokio_rustls::TlsAcceptor::from(
                Arc::new(config),
            ))),
            reloading: Arc::default(),
            #[cfg(test)]
            after_read: Arc::default(),
            timeout: cfg.handshake_timeout,
        })
    }

    /// Reads the certificate chain, key and client CA again (SIGHUP: a rotation on disk)
    /// and serves them to the next handshakes; an unreadable or invalid set is refused and
    /// the one in force stays.
    /// Reloads run one at a time: the last to start reads the files last and wins.
    pub fn reload(&self, cfg: &crate::config::TlsConfig) -> Result<(), TlsError> {
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh = ServerTls::load(cfg)?;
        #[cfg(test)]
        self.after_read.run();
        let acceptor = fresh
            .acceptor
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        *self
            .acceptor
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = acceptor;
        Ok(())
    }

    /// Runs the server handshake on an accepted socket, within the handshake timeout.
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<ClientStream> {
        let acceptor = self
            .acceptor
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match tokio::time::timeout(self.timeout, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Ok(Either::Tls(s)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }
}

/// TLS toward the upstream; every clone (the monitors, the pools, the sessions, the plan
/// guard) shares it, and [`UpstreamTls::reload`] swaps it for all of them (connections
/// already open keep their session).
#[derive(Clone)]
pub struct UpstreamTls {
    connector: Arc<std::sync::RwLock<tokio_rustls::TlsConnector>>,
    /// Held by a reload from reading the files to installing them (as [`ServerTls`]'s).
    reloading: Arc<std::sync::Mutex<()>>,
    #[cfg(test)]
    after_read: Arc<crate::reload_race::AfterRead>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls").finish_non_exhaustive()
    }
}

fn truthy_option(uri: &UpstreamUri, key: &str) -> bool {
    uri.option(key)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// How the upstream's certificate is checked: against `store`, unless the URI weakens it
/// (`tlsInsecure` / `tlsAllowInvalidCertificates`: nothing checked; `tlsAllowInvalidHostnames`:
/// the name not checked). Each weakening is logged.
fn verification(
    builder: ConfigBuilder<ClientConfig, WantsVerifier>,
    uri: &UpstreamUri,
    store: RootCertStore,
) -> Result<ConfigBuilder<ClientConfig, WantsClientCert>, TlsError> {
    let insecure =
        truthy_option(uri, "tlsInsecure") || truthy_option(uri, "tlsAllowInvalidCertificates");
    let any_name = truthy_option(uri, "tlsAllowInvalidHostnames");
    Ok(if insecure {
        warn!("upstream TLS: tlsInsecure/tlsAllowInvalidCertificates is set: the upstream's certificate is NOT verified; anyone on the path can impersonate it");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient::any(provider())))
    } else if any_name {
        warn!("upstream TLS: tlsAllowInvalidHostnames is set: the upstream's certificate is verified but its host name is NOT checked");
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(store),
            provider(),
        )
        .build()
        .map_err(|e| TlsError(format!("tlsCAFile: {e}")))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient::names(inner, provider())))
    } else {
        builder.with_root_certificates(store)
    })
}

impl UpstreamTls {
    /// The upstream TLS the URI asks for; `None` for plain TCP.
    pub fn from_uri(uri: &UpstreamUri) -> Result<Option<UpstreamTls>, TlsError> {
        // `tls=true`/`ssl=true`, or a mongodb+srv:// URI that does not say `tls=false`.
        let wanted = uri.tls_wanted();
        let any_tls_option = uri.options.iter().any(|(k, _)| {
            let k = k.to_ascii_lowercase();
            k.starts_with("tls") && k != "tls"
        });
        if !wanted {
            if any_tls_option {
                return Err(TlsError(
                    "upstream.uri has tls* options but TLS is off; add tls=true".into(),
                ));
            }
            return Ok(None);
        }
        let store = match uri.option("tlsCAFile") {
            Some(ca) => {
                let path = Path::new(ca);
                roots(read_certs(path, "tlsCAFile")?, path)?
            }
            None => RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?;
        let builder = verification(builder, uri, store)?;
        let config = match uri.option("tlsCertificateKeyFile") {
            Some(file) => {
                let path = Path::new(file);
                let chain = read_certs(path, "tlsCertificateKeyFile")?;
                let key = read_key(path, "tlsCertificateKeyFile")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| TlsError(format!("tlsCertificateKeyFile: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Some(UpstreamTls {
            connector: Arc::new(std::sync::RwLock::new(tokio_rustls::TlsConnector::from(
                Arc::new(config),
            ))),
            reloading: Arc::default(),
            #[cfg(test)]
            after_read: Arc::default(),
        }))
    }

    /// Reads the URI's `tlsCAFile` and `tlsCertificateKeyFile` again (SIGHUP: a rotation on
    /// disk of the upstream's CA or of mongoguard's client certificate) and uses them for the
    /// next upstream handshakes; an unreadable or invalid set is refused and the one in force
    /// stays. Returns whether anything was reloaded (`false`: no upstream TLS files).
    pub fn reload(&self, uri: &UpstreamUri) -> Result<bool, TlsError> {
        if uri.option("tlsCAFile").is_none() && uri.option("tlsCertificateKeyFile").is_none() {
            return Ok(false);
        }
        let _one_at_a_time = self
            .reloading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(fresh) = UpstreamTls::from_uri(uri)? else {
            return Ok(false);
        };
        #[cfg(test)]
        self.after_read.run();
        let connector = fresh
            .connector
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        *self
            .connector
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = connector;
        Ok(true)
    }

    /// Runs the client handshake toward `host` over `tcp`.
    pub async fn connect(&self, host: &Host, tcp: TcpStream) -> std::io::Result<UpstreamStream> {
        let name = ServerName::try_from(host.name.to_string()).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host}: {e}"))
        })?;
        let connector = self
            .connector
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(Either::Tls(connector.connect(name, tcp).await?))
    }
}

/// A verifier that accepts wrong host names (still checking the chain) or anything.
#[derive(Debug)]
struct Lenient {
    inner: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl Lenient {
    fn any(provider: Arc<rustls::crypto::CryptoProvider>) -> Lenient {
        Lenient {
            inner: None,
            provider,
        }
    }

    fn names(
        inner: Arc<rustls::client::WebPkiServerVerifier>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Lenient {
        Lenient {
            inner: Some(inner),
            provider,
        }
    }
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(inner) = &self.inner else {
            return Ok(ServerCertVerified::assertion());
        };
        match inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(uri: &str) -> Result<Option<UpstreamTls>, TlsError> {
        UpstreamTls::from_uri(&uri.parse::<UpstreamUri>().unwrap())
    }

    #[test]
    fn srv_uris_default_to_tls() {
        assert!(tls("mongodb+srv://c.example.com").unwrap().is_some());
        assert!(tls("mongodb+srv://c.example.com/?tls=false")
            .unwrap()
            .is_none());
        assert!(tls("mongodb+srv://c.example.com/?ssl=false")
            .unwrap()
            .is_none());
        assert!(tls("mongodb://h").unwrap().is_none());
        assert!(tls("mongodb://h/?tls=true").unwrap().is_some());
        // TLS options with TLS turned off are a mistake, SRV or not.
        let e = tls("mongodb+srv://c.example.com/?tls=false&tlsAllowInvalidHostnames=true")
            .unwrap_err();
        assert!(e.to_string().contains("TLS is off"), "{e}");
    }

    /// A new self-signed certificate for `localhost` written over `dir/server.crt` and
    /// `dir/server.key`; returns the certificate.
    fn self_signed(dir: &Path) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        cert.der().clone()
    }

    /// SIGHUP and `ProxyHandle::hangup` at once: each TLS reload read the certificate and
    /// key and then installed them, unserialised, so the one that read the older pair could
    /// install it last and a rotated-out (say, compromised) certificate stayed in service.
    /// The first reload reads v1 and is held; the files become v2 and a second reload runs;
    /// then the first goes on. A client trusting only v2 must complete a handshake.
    #[tokio::test]
    async fn concurrent_server_reloads_never_install_the_older_certificate() {
        let dir = std::env::temp_dir().join(format!("mg-tls-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        self_signed(&dir);
        let cfg = crate::config::TlsConfig {
            cert_file: Some(dir.join("server.crt")),
            key_file: Some(dir.join("server.key")),
            ..Default::default()
        };
        let tls = ServerTls::load(&cfg).unwrap();
        let mut v2 = None;
        let (t, c) = (tls.clone(), cfg.clone());
        crate::reload_race::two_reloads(
            &tls.after_read,
            move || t.reload(&c),
            || v2 = Some(self_signed(&dir)),
        );
        let mut roots = RootCertStore::empty();
        roots.add(v2.unwrap()).unwrap();
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let acceptor = tls.acceptor.read().unwrap().clone();
        let (a, b) = tokio::io::duplex(64 << 10);
        let name = ServerName::try_from("localhost").unwrap();
        let (client, _server) = tokio::join!(connector.connect(name, a), acceptor.accept(b));
        assert!(
            client.is_ok(),
            "an older read of the certificate was installed over a newer one: {client:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The same race for the upstream side: two reloads of the URI's `tlsCAFile` across a
    /// rotation of the CA; the connector must trust the newer one.
    #[tokio::test]
    async fn concurrent_upstream_reloads_never_install_the_older_ca() {
        let dir = std::env::temp_dir().join(format!("mg-utls-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        self_signed(&dir);
        let uri: UpstreamUri = format!(
            "mongodb://localhost:1/?tls=true&tlsCAFile={}",
            dir.join("server.crt").display()
        )
        .parse()
        .unwrap();
        let tls = UpstreamTls::from_uri(&uri).unwrap().unwrap();
        let (t, u) = (tls.clone(), uri.clone());
        crate::reload_race::two_reloads(
            &tls.after_read,
            move || t.reload(&u).map(|_| ()),
            || {
                self_signed(&dir);
            },
        );
        // The server presents v2, the CA file's content now.
        let server = ServerTls::load(&crate::config::TlsConfig {
            cert_file: Some(dir.join("server.crt")),
            key_file: Some(dir.join("server.key")),
            ..Default::default()
        })
        .unwrap();
        let acceptor = server.acceptor.read().unwrap().clone();
        let connector = tls.connector.read().unwrap().clone();
        let (a, b) = tokio::io::duplex(64 << 10);
        let name = ServerName::try_from("localhost").unwrap();
        let (client, _server) = tokio::join!(connector.connect(name, a), acceptor.accept(b));
        assert!(
            client.is_ok(),
            "an older read of the upstream CA file was installed over a newer one: {client:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
