//! No kubelet runs in the test bed, so this plays one for the admission Deployments the agent
//! creates: it marks each available (as a kubelet and the deployment controller would).
//! Issue 4 replaces the pretence with the real `webhook` command.

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::management::{MANAGED_BY, MANAGED_BY_VALUE, deployment_available};

/// Runs until the handle is aborted or dropped with its runtime.
pub fn spawn(client: Client) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Deployment> = Api::all(client.clone());
        let cfg = watcher::Config::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}"));
        let mut s = std::pin::pin!(watcher(api, cfg).default_backoff().applied_objects());
        while let Some(ev) = s.next().await {
            let Ok(d) = ev else { continue };
            if deployment_available(&d) {
                continue;
            }
            let ns = d.namespace().unwrap_or_default();
            let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let now = jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let status = serde_json::json!({"status": {
                "observedGeneration": d.metadata.generation.unwrap_or(1),
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "conditions": [{
                    "type": "Available", "status": "True",
                    "reason": "MinimumReplicasAvailable",
                    "message": "marked available by the test bed",
                    "lastUpdateTime": now, "lastTransitionTime": now,
                }],
            }});
            let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            if let Err(e) = api
                .patch_status(
                    &d.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
            {
                tracing::warn!(namespace = %ns, error = %e, "test bed could not mark the Deployment available");
            }
        }
    })
}
