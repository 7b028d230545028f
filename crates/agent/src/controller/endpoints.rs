//! How the hosted kube-apiserver reaches an HCP's admission service: the one seam between the
//! controller and its environment. In a cluster the URL names the Service in the HCP
//! namespace (`InCluster`); the local test bed implements this trait with the loopback
//! address its stand-in kubelet publishes. The controller never names the test bed.

use std::net::SocketAddr;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};

use hcp_fleet_render::config::AgentConfig;

pub trait AdmissionEndpoints: Send + Sync {
    /// Names the serving certificate carries besides the Service's in-cluster names.
    fn extra_sans(&self) -> Vec<String> {
        Vec::new()
    }

    /// The base URL the hosted kube-apiserver calls for the admission service in
    /// `namespace` (each webhook's path is appended). Called after the admission Deployment
    /// is available. `service`: the admission Service as the agent's watch last saw it.
    fn url_base<'a>(
        &'a self,
        management: &'a Client,
        cfg: &'a AgentConfig,
        namespace: &'a str,
        service: Option<&'a Service>,
    ) -> BoxFuture<'a, String>;

    /// Where each ready replica of the admission service in `namespace` listens, to shake
    /// hands with it and see which certificate it serves (asked of the server: it changes
    /// during the rollouts it is asked about, faster than a watch is sure to show).
    /// `service`, `port`: the admission Service's name and port (`admission.serviceName`,
    /// `admission.port`).
    fn replicas<'a>(
        &'a self,
        management: &'a Client,
        service: &'a str,
        port: i32,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SocketAddr>, ReplicasUnknown>>;
}

/// Why the admission service's ready replicas are not known: the management API's answer.
#[derive(Debug, thiserror::Error)]
#[error("the admission service's endpoints in {namespace}: {}", crate::human::KubeError(.source))]
pub struct ReplicasUnknown {
    pub namespace: String,
    #[source]
    pub source: kube::Error,
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
        _service: Option<&'a Service>,
    ) -> BoxFuture<'a, String> {
        let url = hcp_fleet_render::hosted::webhooks::default_url_base(cfg, namespace);
        Box::pin(async move { url })
    }

    /// The ready endpoints of the Service's EndpointSlices (pod IPs).
    fn replicas<'a>(
        &'a self,
        management: &'a Client,
        service: &'a str,
        port: i32,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SocketAddr>, ReplicasUnknown>> {
        Box::pin(async move {
            let slices = Api::<EndpointSlice>::namespaced(management.clone(), namespace)
                .list(
                    &ListParams::default().labels(&format!("kubernetes.io/service-name={service}")),
                )
                .await
                .map_err(|source| ReplicasUnknown {
                    namespace: namespace.to_string(),
                    source,
                })?;
            Ok(slices
                .items
                .iter()
                .flat_map(|s| ready_addresses(s, port))
                .collect())
        })
    }
}

/// The ready addresses of one EndpointSlice, on its `https` port (else `default_port`).
pub(crate) fn ready_addresses(slice: &EndpointSlice, default_port: i32) -> Vec<SocketAddr> {
    let port = slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https"))
        .and_then(|p| p.port)
        .unwrap_or(default_port);
    let Ok(port) = u16::try_from(port) else {
        return Vec::new();
    };
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    #[test]
    fn only_ready_endpoints_on_the_https_port() {
        let ep = |ip: &str, ready: Option<bool>| Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            ..Default::default()
        };
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: vec![
                ep("10.0.0.1", Some(true)),
                ep("10.0.0.2", Some(false)),
                ep("10.0.0.3", None),
                ep("not-an-ip", Some(true)),
            ],
            ports: Some(vec![
                EndpointPort {
                    name: Some("metrics".into()),
                    port: Some(9000),
                    ..Default::default()
                },
                EndpointPort {
                    name: Some("https".into()),
                    port: Some(8443),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let got: Vec<String> = ready_addresses(&slice, 1)
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(got, ["10.0.0.1:8443", "10.0.0.3:8443"]);
    }
}
