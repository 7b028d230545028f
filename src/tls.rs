//! One rustls crypto provider for the whole binary.
//!
//! kube's TLS stack and rustls can each pick a provider; two providers in one process make
//! rustls panic at the first handshake. Every entry point calls this before any TLS work.

/// Installs the build's rustls provider process-wide (`crypto::install_provider`).
pub use crate::crypto::install_provider as install_crypto_provider;

/// What a TLS server presents: the end-entity certificate (DER) from one handshake with
/// `addr`. The chain is not judged (the caller compares the certificate with the one it
/// expects), but the handshake signature is verified, so the server holds the key.
pub(crate) async fn served_certificate(
    addr: std::net::SocketAddr,
    server_name: &str,
    timeout: std::time::Duration,
) -> Result<Vec<u8>, String> {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(None));
    let cfg = capturing_client(seen.clone())?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| format!("{server_name}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("{addr}: TLS: {e}"))
    };
    let _stream = tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| format!("{addr}: no TLS handshake within {timeout:?}"))??;
    let der = seen
        .lock()
        .map_err(|_| "poisoned".to_string())?
        .take()
        .ok_or_else(|| format!("{addr}: no certificate presented"))?;
    Ok(der)
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
pub fn accept_any_server() -> Result<rustls::ClientConfig, String> {
    capturing_client(std::sync::Arc::default())
}

/// A client configuration whose verifier accepts any chain and puts the end-entity
/// certificate in `seen`.
fn capturing_client(
    seen: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
) -> Result<rustls::ClientConfig, String> {
    install_crypto_provider();
    let provider = crate::crypto::provider();
    let verifier = std::sync::Arc::new(Capture {
        seen,
        algorithms: provider.signature_verification_algorithms,
    });
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    )
}
