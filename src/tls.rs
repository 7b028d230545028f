//! One rustls crypto provider for the whole binary.
//!
//! kube's TLS stack and rustls can each pick a provider; two providers in one process make
//! rustls panic at the first handshake. Every entry point calls this before any TLS work.

use std::sync::Once;

static INSTALL: Once = Once::new();

/// Installs ring as the process-wide rustls provider. Idempotent.
pub fn install_crypto_provider() {
    INSTALL.call_once(|| {
        // Err means another provider was installed first; by construction there is none in
        // this binary (ring is the only provider feature enabled), so there is nothing to do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
