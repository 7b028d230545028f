//! Phase 7: prove it end to end. A dry-run request through the hosted kube-apiserver that only
//! the admission service's probe webhook answers; and the task that repeats it between
//! reconciles, the agent's only periodic request.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use tracing::{Instrument, info};

use super::context::{AbortOnDrop, Context, lock};
use crate::catalogue::{PROBE_ANSWER, PROBE_LABEL};
use crate::crd::{ComplianceState, HostedControlPlane};
use crate::reporting::Observation;

/// A dry-run create of a labelled ConfigMap that only the admission service's probe webhook
/// sees. Its denial (with the service's answer) proves the hosted kube-apiserver reaches the
/// service over TLS; an allowed request means the call failed and failurePolicy Ignore let it
/// through.
pub async fn probe(hosted: &Client, timeout: Duration) -> Observation {
    let api: Api<ConfigMap> = Api::namespaced(hosted.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("hcp-fleet-probe-".into());
    cm.metadata.labels = Some(BTreeMap::from([(
        PROBE_LABEL.to_string(),
        "true".to_string(),
    )]));
    let pp = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    match tokio::time::timeout(timeout, api.create(&pp, &cm)).await {
        // No timing in the message: a steady probe must not add history (and writes) each time.
        Ok(Err(kube::Error::Api(s))) if s.message.contains(PROBE_ANSWER) => {
            tracing::debug!(ms = t0.elapsed().as_millis() as u64, "probe answered");
            Observation::compliant(
                "the admission service answered the probe through the hosted kube-apiserver",
            )
        }
        Ok(Ok(_)) => Observation::violation(
            "the hosted kube-apiserver did not reach the admission service (the probe was let through by failurePolicy Ignore)",
        ),
        Ok(Err(e)) => Observation::violation(format!("probe failed: {e}")),
        Err(_) => {
            Observation::violation(format!("probe got no answer within {}s", timeout.as_secs()))
        }
    }
}

/// Records this reconcile's verdict and makes sure the periodic probe runs. The task queues a
/// full reconcile (which reports) only when the verdict changes, so a steady fleet costs one
/// hosted request per cluster per interval and nothing on the management cluster.
pub fn ensure_task(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    hosted: &Client,
    verdict: ComplianceState,
    timeout: Duration,
    every: Duration,
) {
    ctx.with_hcp(ns, |s| {
        let Some(w) = s.watch.as_mut() else {
            return;
        };
        lock(&w.shared).probe = Some(verdict);
        if w.probe.as_ref().is_some_and(AbortOnDrop::is_running) {
            return;
        }
        let hosted = hosted.clone();
        let shared = Arc::clone(&w.shared);
        let tx = ctx.requeue.clone();
        let hcp_ref = ObjectRef::<HostedControlPlane>::new(cluster).within(ns);
        let span = tracing::info_span!(parent: None, "probe", hcp_namespace = %ns, hosted_cluster = %cluster);
        w.probe = Some(AbortOnDrop(tokio::spawn(
            async move {
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tick.tick().await;
                    let now = probe(&hosted, timeout).await.state;
                    if lock(&shared).probe != Some(now) {
                        info!(verdict = now.as_str(), "end-to-end probe changed");
                        let _ = tx.send(hcp_ref.clone());
                    }
                }
            }
            .instrument(span),
        )));
    });
}
