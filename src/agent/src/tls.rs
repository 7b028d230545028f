//! The TLS the agent speaks as a client: what certificate a server presents.
//!
//! kube's TLS stack and rustls can each pick a provider; two providers in one process make
//! rustls panic at the first handshake, so every entry point installs the build's one provider
//! (`hcp_fleet_guards::crypto::install_provider`) before any TLS work.

use hcp_fleet_guards::crypto::install_provider;

use std::net::SocketAddr;

/// What a TLS server presents: the end-entity certificate (DER) from one handshake with
/// `addr`. The chain is not judged (the caller compares the certificate with the one it
/// expects), but the handshake signature is verified, so the server holds the key.
pub(crate) async fn served_certificate(
    addr: SocketAddr,
    server_name: &str,
    timeout: std::time::Duration,
) -> Result<Vec<u8>, HandshakeError> {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(None));
    let cfg = capturing_client(seen.clone()).map_err(HandshakeError::Client)?;
    let _stream = tokio::time::timeout(timeout, connect(addr, server_name, cfg))
        .await
        .map_err(|_| HandshakeError::Timeout { addr, timeout })??;
    // A verifier that panicked while holding the lock saw no certificate worth trusting.
    let der = seen.lock().ok().and_then(|mut s| s.take());
    der.ok_or(HandshakeError::NoCertificate(addr))
}

/// A TLS connection to `addr`, for `server_name`, as `cfg` says.
async fn connect(
    addr: SocketAddr,
    server_name: &str,
    cfg: rustls::ClientConfig,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, HandshakeError> {
    let name =
        rustls::pki_types::ServerName::try_from(server_name.to_string()).map_err(|source| {
            HandshakeError::Name {
                name: server_name.to_string(),
                source,
            }
        })?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| HandshakeError::Connect { addr, source })?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await
        .map_err(|source| HandshakeError::Tls { addr, source })
}

/// One HTTP/1.1 `GET path` to `addr` over a fresh TLS connection: the status and the body
/// (at most `limit` bytes). The certificate is not judged: what the answer says must carry
/// its own proof (`probe::own_denials`).
pub(crate) async fn get(
    addr: SocketAddr,
    server_name: &str,
    path: &str,
    timeout: std::time::Duration,
    limit: usize,
) -> Result<(u16, String), FetchError> {
    use http_body_util::BodyExt;
    let mut cfg = accept_any_server().map_err(HandshakeError::Client)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let exchange = async {
        let tls = connect(addr, server_name, cfg).await?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|source| FetchError::Http { addr, source })?;
        // The connection is driven beside the request, and dropped with it.
        let conn = async move {
            let _ = conn.await;
        };
        let req = http::Request::get(path)
            .header(http::header::HOST, server_name)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| FetchError::Request(e.to_string()))?;
        let answer = async {
            let resp = send
                .send_request(req)
                .await
                .map_err(|source| FetchError::Http { addr, source })?;
            let status = resp.status().as_u16();
            let body = http_body_util::Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| FetchError::Body {
                    addr,
                    why: e.to_string(),
                })?
                .to_bytes();
            Ok::<_, FetchError>((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::select! {
            a = answer => a,
            () = conn => Err(FetchError::Body { addr, why: "the connection closed".into() }),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| FetchError::Timeout { addr, timeout })?
}

/// Why a GET over TLS got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("{addr}: HTTP: {source}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
    #[error("not a request: {0}")]
    Request(String),
    #[error("{addr}: the answer's body: {why}")]
    Body { addr: SocketAddr, why: String },
    #[error("{addr}: no answer within {timeout:?}")]
    Timeout {
        addr: SocketAddr,
        timeout: std::time::Duration,
    },
}

/// Why no certificate was read from a TLS server.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("no TLS client: {0}")]
    Client(#[source] rustls::Error),
    #[error("{name}: not a server name: {source}")]
    Name {
        name: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("{addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr}: TLS: {source}")]
    Tls {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr}: no TLS handshake within {timeout:?}")]
    Timeout {
        addr: SocketAddr,
        timeout: std::time::Duration,
    },
    #[error("{0}: no certificate presented")]
    NoCertificate(SocketAddr),
}

/// Accepts any chain but remembers the end-entity certificate; checks handshake signatures.
#[derive(Debug)]
struct Capture {
    seen: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if let Ok(mut s) = self.seen.lock() {
            *s = Some(end_entity.to_vec());
        }
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A client configuration that accepts any server certificate (handshake signatures still
/// checked): what a kubelet's HTTPS probe does, which never verifies the pod's certificate.
pub fn accept_any_server() -> Result<rustls::ClientConfig, rustls::Error> {
    capturing_client(std::sync::Arc::default())
}

/// A client configuration whose verifier accepts any chain and puts the end-entity
/// certificate in `seen`.
fn capturing_client(
    seen: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    install_provider();
    let provider = hcp_fleet_guards::crypto::provider();
    let verifier = std::sync::Arc::new(Capture {
        seen,
        algorithms: provider.signature_verification_algorithms,
    });
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    )
}
