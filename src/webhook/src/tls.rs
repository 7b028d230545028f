//! The admission service's serving certificate, reloaded when its files change.
//!
//! rustls asks the resolver for a certificate at each handshake; swapping the `Arc` behind it
//! means new connections get the new certificate while established ones carry on untouched, so
//! a rotation drops nothing. A file that does not parse, or a certificate with another one's key
//! (an update half written), is ignored and the previous certificate kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

pub(crate) fn load(cert: &Path, key: &Path) -> Result<(CertifiedKey, Vec<u8>), TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.to_path_buf(),
            source,
        })
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Parse {
            path: cert.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Parse {
            path: cert.to_path_buf(),
            reason: "no certificate".into(),
        });
    }
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Parse {
        path: key.to_path_buf(),
        reason: e.to_string(),
    })?;
    let signing = hcp_fleet_guards::crypto::provider()
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::Parse {
            path: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    let ck = CertifiedKey::new(certs, signing);
    // The files are replaced one after the other; between the two, a certificate with the
    // other one's key would fail every handshake. Such a pair is not loaded.
    ck.keys_match().map_err(|e| TlsError::Parse {
        path: key.to_path_buf(),
        reason: format!("the key does not belong to {}: {e}", cert.display()),
    })?;
    let mut fingerprint = cert_pem;
    fingerprint.extend_from_slice(&key_pem);
    Ok((ck, fingerprint))
}

#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
    cert_path: PathBuf,
    key_path: PathBuf,
    fingerprint: RwLock<Vec<u8>>,
}

impl ReloadingCert {
    pub fn new(cert_path: PathBuf, key_path: PathBuf) -> Result<Arc<Self>, TlsError> {
        let (ck, fp) = load(&cert_path, &key_path)?;
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(ck)),
            cert_path,
            key_path,
            fingerprint: RwLock::new(fp),
        }))
    }

    /// Re-reads the files; `Ok(true)` when a new certificate was installed.
    pub(crate) fn reload(&self) -> Result<bool, TlsError> {
        let (ck, fp) = load(&self.cert_path, &self.key_path)?;
        if self.fingerprint.read().is_ok_and(|f| *f == fp) {
            return Ok(false);
        }
        if let Ok(mut c) = self.current.write() {
            *c = Arc::new(ck);
        }
        if let Ok(mut f) = self.fingerprint.write() {
            *f = fp;
        }
        Ok(true)
    }

    /// Checks the files every `every` (Secret volumes are updated by an atomic symlink swap,
    /// which inotify on the file itself would miss).
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match me.reload() {
                    Ok(true) => tracing::info!("serving certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "new serving certificate unusable; keeping the current one")
                    }
                }
            }
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_render::certificates::{Usage, generate_ca, issue};

    fn pair(dir: &Path, cert: &str, key: &str) -> (PathBuf, PathBuf) {
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert).expect("write cert");
        std::fs::write(&k, key).expect("write key");
        (c, k)
    }

    #[test]
    fn a_certificate_with_another_ones_key_is_not_loaded_and_the_current_one_stays() {
        let dir = std::env::temp_dir().join(format!("hcp-fleet-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = generate_ca("test CA", time::Duration::days(1)).expect("ca");
        let usage = Usage::Server {
            sans: vec!["svc".into()],
        };
        let first = issue(&ca, "svc", &usage, time::Duration::days(1)).expect("first");
        let second = issue(&ca, "svc", &usage, time::Duration::days(1)).expect("second");
        let (c, k) = pair(&dir, &first.cert_pem, &first.key_pem);
        let cert = ReloadingCert::new(c, k).expect("a matching pair loads");
        let served = || {
            cert.current
                .read()
                .map(|c| c.end_entity_cert().map(|d| d.to_vec()).unwrap_or_default())
                .unwrap_or_default()
        };
        let before = served();
        // Half an update: the new certificate, the old key.
        pair(&dir, &second.cert_pem, &first.key_pem);
        let err = cert.reload().expect_err("a mismatched pair is refused");
        assert!(err.to_string().contains("does not belong to"), "{err}");
        assert_eq!(served(), before, "the current certificate stays");
        // The update completed: loaded.
        pair(&dir, &second.cert_pem, &second.key_pem);
        assert!(cert.reload().expect("complete pair"));
        assert_ne!(served(), before);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
