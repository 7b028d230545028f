//! Clients for hosted kube-apiservers, built only from validated kubeconfigs and cached by a
//! hash of the secret's data: a rotated secret gets a new client, an unchanged one never
//! rebuilds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::kubeconfig::{KubeconfigError, validate};
use crate::config::HostedAccessConfig;

#[derive(Debug, thiserror::Error)]
pub enum HostedAccessError {
    #[error("{namespace}: kubeconfig secret {secret} not found")]
    SecretMissing { namespace: String, secret: String },
    #[error("{namespace}: kubeconfig secret {secret} has no key {key}")]
    KeyMissing {
        namespace: String,
        secret: String,
        key: String,
    },
    #[error("{namespace}: kubeconfig in secret {secret} refused: {source}")]
    Invalid {
        namespace: String,
        secret: String,
        source: KubeconfigError,
    },
    #[error("{namespace}: building a client for {server}: {reason}")]
    Client {
        namespace: String,
        server: String,
        reason: String,
    },
}

struct Cached {
    secret_hash: Vec<u8>,
    client: Client,
    server: String,
}

#[derive(Default)]
pub struct HostedClients {
    cache: Mutex<HashMap<String, Cached>>,
}

fn digest(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}

impl HostedClients {
    /// The client for `namespace`, from the secret's kubeconfig bytes. Returns the client and
    /// the (rewritten) server URL.
    pub async fn get(
        &self,
        namespace: &str,
        secret_name: &str,
        raw: &[u8],
        access: &HostedAccessConfig,
        requests: prometheus_client::metrics::counter::Counter,
    ) -> Result<(Client, String), HostedAccessError> {
        let hash = digest(raw);
        if let Ok(c) = self.cache.lock()
            && let Some(hit) = c.get(namespace)
            && hit.secret_hash == hash
        {
            return Ok((hit.client.clone(), hit.server.clone()));
        }
        let valid = validate(raw, namespace, &access.server_rewrites).map_err(|source| {
            HostedAccessError::Invalid {
                namespace: namespace.to_string(),
                secret: secret_name.to_string(),
                source,
            }
        })?;
        let client_err = |reason: String| HostedAccessError::Client {
            namespace: namespace.to_string(),
            server: valid.server.clone(),
            reason,
        };
        let kc = Kubeconfig::from_yaml(&valid.yaml).map_err(|e| client_err(e.to_string()))?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| client_err(e.to_string()))?;
        let t = Duration::from_secs(u64::from(access.request_timeout_seconds));
        config.connect_timeout = Some(t);
        config.write_timeout = Some(t);
        // Reads keep kube's default: the drift watches are quiet for minutes between events,
        // and a short read timeout would cut and reopen them every few seconds (polling in
        // disguise, seen in `make bench`). The install step has its own deadline.
        let client = crate::metrics::counted_client(config, requests)
            .map_err(|e| client_err(e.to_string()))?;
        if let Ok(mut c) = self.cache.lock() {
            c.insert(
                namespace.to_string(),
                Cached {
                    secret_hash: hash,
                    client: client.clone(),
                    server: valid.server.clone(),
                },
            );
        }
        Ok((client, valid.server))
    }

    pub fn forget(&self, namespace: &str) {
        if let Ok(mut c) = self.cache.lock() {
            c.remove(namespace);
        }
    }

    pub fn len(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
