//! Watches that run beside the controller's own: one drift watch per hosted cluster on the
//! agent's webhook configurations there, and the deletion watch on HostedControlPlanes.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::Value;
use tracing::{Instrument, info, warn};

use super::context::{AbortOnDrop, Context, HostedWatch, WatchShared, lock};
use crate::crd::HostedControlPlane;
use crate::hosted::clients::HostedClient;
use crate::hosted::webhooks::{self, HostedWebhooks};
use crate::metrics::DriftLabels;

/// Starts (or updates) the drift watch of one hosted cluster. A change that does not match
/// what the agent applied, or a deletion, is drift: counted, noted for the Policy, and the
/// HCP queued for repair at once. A new server (rotated kubeconfig) restarts the watch.
pub fn ensure_drift_watch(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    hosted: &HostedClient,
    desired: HostedWebhooks,
) {
    ctx.with_hcp(ns, |s| {
        if let Some(w) = &s.watch
            && w.server == hosted.server
            && w.drift.is_running()
        {
            lock(&w.shared).desired = Some(desired);
            return;
        }
        // Notes and the last probe verdict outlive a restarted watch.
        let carried = s.watch.take().map(|w| std::mem::take(&mut *lock(&w.shared)));
        let shared = Arc::new(Mutex::new(WatchShared {
            desired: Some(desired),
            ..carried.unwrap_or_default()
        }));
        let span = tracing::info_span!(parent: None, "drift_watch", hcp_namespace = %ns, hosted_cluster = %cluster);
        let task = drift_task(ctx, ns, cluster, hosted, Arc::clone(&shared)).instrument(span);
        s.watch = Some(HostedWatch {
            server: hosted.server.clone(),
            shared,
            drift: AbortOnDrop(tokio::spawn(task)),
            probe: None,
        });
    });
}

fn drift_task(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    hosted: &HostedClient,
    shared: Arc<Mutex<WatchShared>>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let tx = ctx.requeue.clone();
    let metrics = ctx.metrics.clone();
    let hcp_ref = ObjectRef::<HostedControlPlane>::new(cluster).within(ns);
    let ns = ns.to_string();
    let cluster = cluster.to_string();
    let client = hosted.client.clone();
    async move {
        let cfg = watcher::Config::default().labels(&webhooks::owned_selector());
        let v = watcher(
            Api::<ValidatingWebhookConfiguration>::all(client.clone()),
            cfg.clone(),
        )
        .default_backoff()
        .map(|e| {
            e.ok()
                .and_then(|ev| classify("ValidatingWebhookConfiguration", ev))
        });
        let m = watcher(Api::<MutatingWebhookConfiguration>::all(client), cfg)
            .default_backoff()
            .map(|e| {
                e.ok()
                    .and_then(|ev| classify("MutatingWebhookConfiguration", ev))
            });
        let mut events = std::pin::pin!(futures::stream::select(v, m));
        while let Some(ev) = events.next().await {
            let Some((kind, what, live)) = ev else {
                continue;
            };
            let want = {
                let s = lock(&shared);
                let d = s.desired.as_ref();
                match kind {
                    "ValidatingWebhookConfiguration" => d
                        .and_then(|d| d.validating.as_ref())
                        .and_then(|x| serde_json::to_value(x).ok()),
                    _ => d
                        .and_then(|d| d.mutating.as_ref())
                        .and_then(|x| serde_json::to_value(x).ok()),
                }
            };
            let Some(want) = want else { continue };
            let drifted = match &live {
                Some(l) => !webhooks::webhooks_match(&want, l),
                None => true,
            };
            if !drifted {
                continue;
            }
            let name = want["metadata"]["name"].as_str().unwrap_or("?").to_string();
            warn!(kind, name = %name, what, "webhook configuration drifted; repairing");
            metrics
                .drift
                .get_or_create(&DriftLabels {
                    hcp_namespace: ns.clone(),
                    hosted_cluster: cluster.clone(),
                    kind: kind.to_string(),
                })
                .inc();
            lock(&shared)
                .drift_notes
                .push(format!("{kind} {name} was {what} by someone else"));
            let _ = tx.send(hcp_ref.clone());
        }
    }
}

/// A live change to one of the agent's configurations: (kind, what happened, the live
/// object). Initial listings are not changes: the reconcile that started the watch applied
/// them.
fn classify<K: serde::Serialize>(
    kind: &'static str,
    ev: watcher::Event<K>,
) -> Option<(&'static str, &'static str, Option<Value>)> {
    match ev {
        watcher::Event::Apply(o) => Some((kind, "changed", serde_json::to_value(o).ok())),
        watcher::Event::Delete(_) => Some((kind, "deleted", None)),
        _ => None,
    }
}

/// HCP deletions: a controller never reconciles a deleted object, so a metadata watch tells
/// the context to forget it (state, tasks, client, series, roll-up row).
pub async fn deletion_watcher(ctx: Arc<Context>) {
    let api: Api<PartialObjectMeta<HostedControlPlane>> = Api::all(ctx.client.clone());
    let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(ev) = s.next().await {
        if let Ok(watcher::Event::Delete(m)) = ev {
            let ns = m.namespace().unwrap_or_default();
            info!(hcp_namespace = %ns, "HostedControlPlane deleted; forgetting it");
            if let Some(uid) = m.uid() {
                ctx.tombstone(uid);
            }
            ctx.forget(&ns, &m.name_any());
        }
    }
}
