//! The stand-in kubelet for the admission Deployments of SIMULATED hosted clusters: no process
//! runs. A Deployment is marked available as soon as it appears (and again for each new
//! generation), and its Service publishes, as the test bed's EndpointSlice, one address per
//! replica on a shared TLS listener (the simulated pods) that serves each namespace's serving
//! certificate from its Secret, chosen by SNI name. So the agent's handshake with each replica
//! (retire last) sees the certificate a replica would serve. The real hosted clusters' pods are
//! run by the test bed's own kubelet (`localcp::kubelet::spawn_for`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};
use hcp_fleet_render::management::deployment_available;
use hcp_fleet_testbed::kubelet;
use hcp_fleet_testbed::kubelet::{LOCAL_ENDPOINT_ANNOTATION, LOCAL_REPLICAS_ANNOTATION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{BySni, ProbeKeys, certified_key, serve_tls};
use hcp_fleet_guards::probe::{KEY_FILE, ProbeKey};

enum Seen {
    Deployment(Box<Deployment>),
    Secret(Box<Secret>),
    Service(Box<Service>),
}

/// The simulated pods' listener and the kubelet task; dropping it stops both.
pub struct SimPods {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for SimPods {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs the Deployments of the namespaces `simulated` accepts. `service` is the admission
/// Service's name (its Secret is `<service>-tls`).
pub async fn spawn(
    client: Client,
    service: String,
    probe_keys: ProbeKeys,
    simulated: impl Fn(&str) -> bool + Send + 'static,
) -> Result<SimPods, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let certs = Arc::new(BySni::default());
    let server = tokio::spawn(serve_tls(listener, certs.clone(), |_| None));
    let label = format!("{MANAGED_BY}={MANAGED_BY_VALUE}");
    let cfg = || watcher::Config::default().labels(&label);
    let deployments = watcher(Api::<Deployment>::all(client.clone()), cfg())
        .default_backoff()
        .applied_objects()
        .map(|r| r.map(|d| Seen::Deployment(Box::new(d))));
    let secrets = watcher(Api::<Secret>::all(client.clone()), cfg())
        .default_backoff()
        .applied_objects()
        .map(|r| r.map(|s| Seen::Secret(Box::new(s))));
    let services = watcher(Api::<Service>::all(client.clone()), cfg())
        .default_backoff()
        .applied_objects()
        .map(|r| r.map(|s| Seen::Service(Box::new(s))));
    let tls_secret = format!("{service}-tls");
    let kubelet = tokio::spawn(async move {
        let mut events = std::pin::pin!(futures::stream::select(
            futures::stream::select(deployments, secrets),
            services
        ));
        // Status writes run beside the loop, a few at a time, as many kubelets would.
        let writes = Arc::new(tokio::sync::Semaphore::new(8));
        let mut replicas: HashMap<String, i32> = HashMap::new();
        let mut published: HashMap<String, String> = HashMap::new();
        while let Some(ev) = events.next().await {
            let Ok(ev) = ev else { continue };
            match ev {
                Seen::Deployment(d) => {
                    let ns = d.namespace().unwrap_or_default();
                    if !simulated(&ns) {
                        continue;
                    }
                    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    replicas.insert(ns.clone(), want);
                    if let Some(have) = published.get(&ns).cloned() {
                        publish(&client, &ns, &service, &have, addr, want, &mut published).await;
                    }
                    let current = d
                        .status
                        .as_ref()
                        .and_then(|s| s.observed_generation)
                        .is_some_and(|g| Some(g) == d.metadata.generation);
                    if deployment_available(&d) && current {
                        continue;
                    }
                    let client = client.clone();
                    let permit = writes.clone().acquire_owned().await;
                    tokio::spawn(async move {
                        let _permit = permit;
                        if let Err(e) = kubelet::mark_available(&client, &d).await {
                            tracing::warn!(namespace = %ns, error = %e, "simulated kubelet: status write failed");
                        }
                    });
                }
                Seen::Secret(s) => {
                    let ns = s.namespace().unwrap_or_default();
                    if !simulated(&ns) || s.name_any() != tls_secret {
                        continue;
                    }
                    let data = s.data.clone().unwrap_or_default();
                    let text = |k: &str| {
                        data.get(k)
                            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                            .unwrap_or_default()
                    };
                    if let (Some(k), Ok(mut m)) =
                        (ProbeKey::from_hex(&text(KEY_FILE)), probe_keys.lock())
                    {
                        m.insert(ns.clone(), k);
                    }
                    match certified_key(&text("tls.crt"), &text("tls.key")) {
                        Ok(key) => {
                            if let Ok(mut m) = certs.0.lock() {
                                m.insert(format!("{service}.{ns}.svc"), key);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(namespace = %ns, error = %e, "simulated pods: unusable serving certificate")
                        }
                    }
                }
                Seen::Service(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    if !simulated(&ns) || svc.name_any() != service {
                        continue;
                    }
                    let a = svc.annotations();
                    let have = format!(
                        "{} {}",
                        a.get(LOCAL_ENDPOINT_ANNOTATION).map_or("", |v| v.as_str()),
                        a.get(LOCAL_REPLICAS_ANNOTATION).map_or("", |v| v.as_str())
                    );
                    let want = replicas.get(&ns).copied().unwrap_or(2);
                    publish(&client, &ns, &service, &have, addr, want, &mut published).await;
                }
            }
        }
    });
    Ok(SimPods {
        tasks: vec![server, kubelet],
    })
}

/// The Service's address and one address per replica (all the same listener), as the test
/// bed's kubelet publishes them, where they differ (`have`: "<endpoint> <replicas>").
async fn publish(
    client: &Client,
    ns: &str,
    service: &str,
    have: &str,
    addr: SocketAddr,
    replicas: i32,
    published: &mut HashMap<String, String>,
) {
    let ready = vec![addr.to_string(); usize::try_from(replicas.max(1)).unwrap_or(1)].join(",");
    let endpoint = format!("https://{addr}");
    let want = format!("{endpoint} {ready}");
    if have != want {
        let patch = serde_json::json!({"metadata": {"annotations": {
            LOCAL_ENDPOINT_ANNOTATION: endpoint,
            LOCAL_REPLICAS_ANNOTATION: ready,
        }}});
        if let Err(e) = Api::<Service>::namespaced(client.clone(), ns)
            .patch(service, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(namespace = %ns, error = %e, "simulated kubelet: publishing replicas failed");
            return;
        }
    }
    published.insert(ns.to_string(), want);
}
