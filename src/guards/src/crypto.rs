//! The build's one cryptographic library, for rustls and for the few primitives the agent uses
//! itself (SHA-256 fingerprints, the probe's HMAC, random nonces): ring (the default feature
//! `ring`), or AWS-LC's FIPS module (feature `fips`, through aws-lc-rs), never both. A FIPS
//! build's rustls provider offers only FIPS-approved protocol versions, cipher suites, key
//! exchange groups and signature schemes (docs/supply-chain.md says what is and is not
//! validated).

#[cfg(all(feature = "ring", feature = "fips"))]
compile_error!(
    "features `ring` and `fips` exclude each other: build the FIPS variant with `--no-default-features --features fips`"
);
#[cfg(not(any(feature = "ring", feature = "fips")))]
compile_error!("a crypto library is needed: feature `ring` (the default) or `fips`");

#[cfg(feature = "fips")]
pub use aws_lc_rs::{digest, hmac, rand};
#[cfg(all(feature = "ring", not(feature = "fips")))]
pub use ring::{digest, hmac, rand};

/// The library this binary was built with, as `version` prints it.
#[cfg(feature = "fips")]
pub const LIBRARY: &str = "AWS-LC FIPS module (aws-lc-rs), rustls FIPS provider";
/// The provider in one word, for the `build_info` metric.
#[cfg(feature = "fips")]
pub const PROVIDER_NAME: &str = "aws-lc-fips";
#[cfg(all(feature = "ring", not(feature = "fips")))]
pub const PROVIDER_NAME: &str = "ring";
#[cfg(all(feature = "ring", not(feature = "fips")))]
pub const LIBRARY: &str = "ring, rustls ring provider";

/// The rustls provider of this build. For `fips`: AWS-LC's FIPS module with only the
/// FIPS-approved suites (AES-GCM; no ChaCha20-Poly1305), groups (P-256, P-384) and schemes.
pub fn provider() -> rustls::crypto::CryptoProvider {
    #[cfg(feature = "fips")]
    {
        rustls::crypto::default_fips_provider()
    }
    #[cfg(all(feature = "ring", not(feature = "fips")))]
    {
        rustls::crypto::ring::default_provider()
    }
}

static INSTALL: std::sync::Once = std::sync::Once::new();

/// Installs the build's provider (`crypto::provider`: ring, or the FIPS one) as the
/// process-wide rustls provider. Idempotent.
pub fn install_provider() {
    INSTALL.call_once(|| {
        // Err means another provider was installed first; every entry point calls this before
        // any TLS work, so none is, and kube's own attempt (it installs its feature's default)
        // comes later and fails quietly.
        let _ = provider().install_default();
    });
}

/// Whether the process's TLS runs in FIPS mode: the installed provider and every algorithm
/// it offers are FIPS-approved, and the module passed its power-on self-tests.
pub fn fips_mode() -> bool {
    install_provider();
    rustls::crypto::CryptoProvider::get_default().is_some_and(|p| p.fips())
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> Vec<u8> {
    digest::digest(&digest::SHA256, data).as_ref().to_vec()
}

/// `bytes` in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default build is ring's and says so; a FIPS build runs in FIPS mode. (The FIPS
    /// build's own run of this test is `make fips`.)
    #[test]
    fn the_build_reports_its_crypto_library_and_mode() {
        assert_eq!(fips_mode(), cfg!(feature = "fips"), "{LIBRARY}");
        let suites: Vec<String> = provider()
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(
            suites.iter().any(|s| s.contains("CHACHA20")),
            !cfg!(feature = "fips"),
            "{suites:?}"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
