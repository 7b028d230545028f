//! How the hosted kube-apiserver reaches an HCP's admission service: the one seam between the
//! controller and its environment. In a cluster the URL names the Service in the HCP
//! namespace (`InCluster`); the local test bed implements this trait with the loopback
//! address its stand-in kubelet publishes. The controller never names the test bed.

use futures::future::BoxFuture;
use kube::Client;

use crate::config::AgentConfig;

pub trait AdmissionEndpoints: Send + Sync {
    /// Names the serving certificate carries besides the Service's in-cluster names.
    fn extra_sans(&self) -> Vec<String> {
        Vec::new()
    }

    /// The base URL the hosted kube-apiserver calls for the admission service in
    /// `namespace` (each webhook's path is appended). Called after the admission Deployment
    /// is available.
    fn url_base<'a>(
        &'a self,
        management: &'a Client,
        cfg: &'a AgentConfig,
        namespace: &'a str,
    ) -> BoxFuture<'a, String>;
}

/// A real management cluster: the Service's cluster-local name, which the hosted
/// kube-apiserver (running in the HCP namespace) resolves.
#[derive(Debug, Clone, Copy, Default)]
pub struct InCluster;

impl AdmissionEndpoints for InCluster {
    fn url_base<'a>(
        &'a self,
        _management: &'a Client,
        cfg: &'a AgentConfig,
        namespace: &'a str,
    ) -> BoxFuture<'a, String> {
        let url = crate::hosted::webhooks::default_url_base(cfg, namespace);
        Box::pin(async move { url })
    }
}
