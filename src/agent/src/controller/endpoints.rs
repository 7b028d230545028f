//! How the hosted kube-apiserver reaches an HCP's admission service: the one seam between the
//! controller and its environment. In a cluster the URL names the Service in the HCP
//! namespace (`InCluster`); the local test bed implements this trait with the loopback
//! address its stand-in kubelet publishes. The controller never names the test bed.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, PoisonError, RwLock};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use hcp_fleet_render::config::AgentConfig;

use super::io::cache::Relisted;

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
    /// `admission.port`). `watched`: what the agent's watches hold of them, answered from
    /// where it can be (`Seen::default()`: asked of the server).
    fn replicas<'a>(
        &'a self,
        management: &'a Client,
        service: &'a str,
        port: i32,
        namespace: &'a str,
        watched: Seen,
    ) -> BoxFuture<'a, Result<Vec<SocketAddr>, ReplicasUnknown>>;
}

/// What the agent's watches hold of an HCP's admission service, for `replicas` to answer from
/// instead of the server: the probe's report rounds ask where the replicas are every few
/// minutes for every HCP with a service, a list request each (ten a second at 3,000 HCPs)
/// for an answer that changes only with a rollout.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The admission Service as the agent's watch last saw it.
    pub service: Option<Service>,
    /// Its ready replicas as the agent's watch of EndpointSlices holds them (`None`: not
    /// known from the watch; asked of the server).
    pub ready: Option<Vec<SocketAddr>>,
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

    /// The ready endpoints of the Service's EndpointSlices (pod IPs): the watch's where it
    /// has them, else listed.
    fn replicas<'a>(
        &'a self,
        management: &'a Client,
        service: &'a str,
        port: i32,
        namespace: &'a str,
        watched: Seen,
    ) -> BoxFuture<'a, Result<Vec<SocketAddr>, ReplicasUnknown>> {
        Box::pin(async move {
            if let Some(ready) = watched.ready {
                return Ok(ready);
            }
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
    Ready::of(slice).addresses(default_port)
}

/// What `ready_addresses` needs of one EndpointSlice: its `https` port if it names one, and
/// the addresses of its endpoints not marked unready.
#[derive(Debug, Clone, PartialEq)]
struct Ready {
    port: Option<i32>,
    ips: Vec<IpAddr>,
}

impl Ready {
    fn of(slice: &EndpointSlice) -> Self {
        Ready {
            port: slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some("https"))
                .and_then(|p| p.port),
            ips: slice
                .endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                .flat_map(|e| e.addresses.iter())
                .filter_map(|a| a.parse::<IpAddr>().ok())
                .collect(),
        }
    }

    fn addresses(&self, default_port: i32) -> Vec<SocketAddr> {
        let Ok(port) = u16::try_from(self.port.unwrap_or(default_port)) else {
            return Vec::new();
        };
        self.ips
            .iter()
            .map(|ip| SocketAddr::new(*ip, port))
            .collect()
    }
}

/// The ready replicas of every HCP's admission service, kept by one watch of the
/// EndpointSlices labelled with its name (`kubernetes.io/service-name`): per slice its port and
/// addresses, nothing else of it. Answers for the service name it watches only: a
/// configuration that renames the service is answered by the server until the agent restarts.
pub(crate) struct ReadyEndpoints {
    service: String,
    /// (namespace, slice name) → what the slice says.
    state: RwLock<Relisted<(String, String), Ready>>,
}

impl ReadyEndpoints {
    pub(crate) fn new(service: &str) -> Self {
        Self {
            service: service.to_string(),
            state: Default::default(),
        }
    }

    /// The ready replicas of `service` in `namespace` on `default_port` where the slice names
    /// no `https` port; `None` before the first complete listing or for another service.
    pub(crate) fn get(
        &self,
        service: &str,
        namespace: &str,
        default_port: i32,
    ) -> Option<Vec<SocketAddr>> {
        if service != self.service {
            return None;
        }
        let s = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let from = (namespace.to_string(), String::new());
        Some(
            s.held()?
                .range(from..)
                .take_while(|((ns, _), _)| ns == namespace)
                .flat_map(|(_, r)| r.addresses(default_port))
                .collect(),
        )
    }

    /// Takes one event of the watch.
    pub(crate) fn apply(&self, event: watcher::Event<EndpointSlice>) {
        let mut s = self.state.write().unwrap_or_else(PoisonError::into_inner);
        s.apply(&event, |e| {
            let key = (
                e.metadata.namespace.clone().unwrap_or_default(),
                e.metadata.name.clone().unwrap_or_default(),
            );
            (key, Ready::of(e))
        });
    }

    /// The watch that keeps `index` (to be polled to the end; it never ends).
    pub(crate) fn watch(
        index: Arc<Self>,
        management: Client,
    ) -> impl std::future::Future<Output = ()> + Send {
        let selector = format!("kubernetes.io/service-name={}", index.service);
        let api = Api::<EndpointSlice>::all(management);
        watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .for_each(move |ev| {
                if let Ok(ev) = ev {
                    index.apply(ev);
                }
                futures::future::ready(())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn slice(ns: &str, name: &str, ips: &[(&str, bool)]) -> EndpointSlice {
        EndpointSlice {
            metadata: kube::api::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: ips
                .iter()
                .map(|(ip, ready)| Endpoint {
                    addresses: vec![(*ip).into()],
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn addrs(v: Option<Vec<SocketAddr>>) -> Option<Vec<String>> {
        v.map(|v| v.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn the_watch_keeps_each_namespaces_ready_replicas_and_drops_what_a_relist_lacks() {
        use watcher::Event;
        let r = ReadyEndpoints::new("admission");
        // Not known before the first complete listing: the caller asks the server.
        assert_eq!(r.get("admission", "a", 9443), None);
        r.apply(Event::Init);
        r.apply(Event::InitApply(slice("a", "s1", &[("10.0.0.1", true)])));
        r.apply(Event::InitApply(slice(
            "a",
            "s2",
            &[("10.0.0.2", true), ("10.0.0.3", false)],
        )));
        r.apply(Event::InitApply(slice("ab", "s1", &[("10.0.1.1", true)])));
        assert_eq!(r.get("admission", "a", 9443), None, "listing not done");
        r.apply(Event::InitDone);
        assert_eq!(
            addrs(r.get("admission", "a", 9443)),
            Some(vec!["10.0.0.1:9443".into(), "10.0.0.2:9443".into()]),
            "both slices of the namespace, only the ready endpoints, not the next namespace's"
        );
        assert_eq!(addrs(r.get("admission", "none", 9443)), Some(vec![]));
        // Another service's name: the watch does not select its slices.
        assert_eq!(r.get("other", "a", 9443), None);
        r.apply(Event::Apply(slice("a", "s1", &[("10.0.0.9", true)])));
        r.apply(Event::Delete(slice("a", "s2", &[])));
        assert_eq!(
            addrs(r.get("admission", "a", 9443)),
            Some(vec!["10.0.0.9:9443".into()])
        );
        // A relist (the watch restarted) without `ab`'s slice: gone.
        r.apply(Event::Init);
        r.apply(Event::InitApply(slice("a", "s1", &[("10.0.0.9", true)])));
        r.apply(Event::InitDone);
        assert_eq!(addrs(r.get("admission", "ab", 9443)), Some(vec![]));
    }

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
