//! Clients for hosted kube-apiservers, built only from validated kubeconfigs. Each remembers
//! a hash of the secret data it was built from, so the controller (which keeps one per HCP in
//! that HCP's state) rebuilds it when the secret rotates and never otherwise.

use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::kubeconfig::{KubeconfigError, validate};
use crate::config::HostedAccessConfig;

#[derive(Debug, thiserror::Error)]
pub enum HostedAccessError {
    #[error("{namespace}: reading kubeconfig secret {secret}: {source}")]
    ReadSecret {
        namespace: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
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
        #[source]
        source: KubeconfigError,
    },
    #[error("{namespace}: building a client for {server}: {reason}")]
    Client {
        namespace: String,
        server: String,
        reason: String,
    },
    #[error(
        "{namespace}: the management cluster's identity (the UID of its namespace kube-system) cannot be read: {source}; nothing is installed in any hosted cluster until it is known"
    )]
    ManagementIdentity {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{namespace}: reading the identity of {server} (the UID of its namespace kube-system): {reason}"
    )]
    HostedIdentity {
        namespace: String,
        server: String,
        reason: String,
    },
    #[error(
        "{namespace}: the kubeconfig names the management cluster itself ({server}, kube-system UID {uid}); nothing is installed there"
    )]
    IsManagementCluster {
        namespace: String,
        server: String,
        uid: String,
    },
    #[error(
        "{namespace}: the hosted cluster at {server} (kube-system UID {uid}) is already claimed by {claimed_by}; nothing is installed there"
    )]
    Claimed {
        namespace: String,
        server: String,
        uid: String,
        claimed_by: String,
    },
}

/// A client for one hosted kube-apiserver and the (rewritten) server URL it talks to.
#[derive(Clone)]
pub struct HostedClient {
    secret_hash: Vec<u8>,
    pub client: Client,
    pub server: String,
}

fn digest(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}

impl HostedClient {
    /// Was this client built from exactly these kubeconfig bytes?
    pub fn is_from(&self, raw: &[u8]) -> bool {
        self.secret_hash == digest(raw)
    }

    /// A client from the secret's kubeconfig bytes, refused unless the kubeconfig is
    /// self-contained (see `kubeconfig::validate`). Every request is counted in `requests`.
    pub async fn build(
        namespace: &str,
        secret_name: &str,
        raw: &[u8],
        access: &HostedAccessConfig,
        requests: prometheus_client::metrics::counter::Counter,
    ) -> Result<Self, HostedAccessError> {
        let valid = validate(
            raw,
            namespace,
            &access.server_rewrites,
            &access.allowed_servers,
        )
        .map_err(|source| HostedAccessError::Invalid {
            namespace: namespace.to_string(),
            secret: secret_name.to_string(),
            source,
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
        Ok(Self {
            secret_hash: digest(raw),
            client,
            server: valid.server,
        })
    }
}
