//! Phase 7: prove it end to end. A dry-run request through the hosted kube-apiserver that only
//! the installed path answers (the admission service's probe webhook, the probe admission
//! policy, or each in turn where both are installed); and the task that repeats it between
//! reconciles, the agent's only periodic request.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use tracing::{Instrument, info};

use super::context::{AbortOnDrop, Context, lock};
use crate::catalogue::{
    POLICY_PROBE_ANSWER, POLICY_PROBE_VALUE, PROBE_ANSWER, PROBE_LABEL, PROBE_REVISION_LABEL,
};
use crate::crd::{ComplianceState, HostedControlPlane};
use crate::hosted::policies::Engine;
use crate::hosted::webhooks::HostedWebhooks;
use crate::reporting::Observation;

/// What the probe asks for: the revision of each path installed (`None`: that path is not).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeTargets {
    pub webhook: Option<String>,
    pub policy: Option<String>,
}

impl ProbeTargets {
    pub fn of(desired: &HostedWebhooks) -> Self {
        Self {
            webhook: desired.webhook_revision.clone(),
            policy: desired.policies.revision.clone(),
        }
    }
}

/// A dry-run create of a labelled ConfigMap that only the probe of `engine` at `revision` sees:
/// the probe webhook (answered by the admission service) or the probe admission policy
/// (answered by the hosted kube-apiserver itself). `Ok` when it answered; otherwise what
/// happened instead. An allowed request means nothing at that revision saw it: the service's
/// call failed (failurePolicy Ignore let it through), or the server does not run it yet.
pub async fn probe_path(
    hosted: &Client,
    timeout: Duration,
    engine: Engine,
    revision: &str,
) -> Result<(), String> {
    let (value, answer) = match engine {
        Engine::Webhook => ("true", PROBE_ANSWER),
        Engine::Policy => (POLICY_PROBE_VALUE, POLICY_PROBE_ANSWER),
    };
    let api: Api<ConfigMap> = Api::namespaced(hosted.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("hcp-fleet-probe-".into());
    cm.metadata.labels = Some(BTreeMap::from([
        (PROBE_LABEL.to_string(), value.to_string()),
        (PROBE_REVISION_LABEL.to_string(), revision.to_string()),
    ]));
    let pp = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    match tokio::time::timeout(timeout, api.create(&pp, &cm)).await {
        Ok(Err(kube::Error::Api(s))) if s.message.contains(answer) => {
            tracing::debug!(engine = engine.as_str(), ms = t0.elapsed().as_millis() as u64, "probe answered");
            Ok(())
        }
        // No timing in the message: a steady probe must not add history (and writes) each time.
        Ok(Ok(_)) => Err(match engine {
            Engine::Webhook => "the hosted kube-apiserver did not reach the admission service (the probe was let through by failurePolicy Ignore)".into(),
            Engine::Policy => "the hosted kube-apiserver does not run the agent's admission policies (the policy probe was let through)".into(),
        }),
        Ok(Err(e)) => Err(format!("probe failed: {e}")),
        Err(_) => Err(format!("probe got no answer within {}s", timeout.as_secs())),
    }
}

/// The end-to-end probe of every path installed, through the hosted kube-apiserver.
pub async fn probe(hosted: &Client, timeout: Duration, targets: &ProbeTargets) -> Observation {
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    for (engine, rev, who) in [
        (Engine::Webhook, &targets.webhook, "the admission service"),
        (Engine::Policy, &targets.policy, "the admission policies"),
    ] {
        let Some(rev) = rev else { continue };
        match probe_path(hosted, timeout, engine, rev).await {
            Ok(()) => answered.push(who),
            Err(e) => failed.push(e),
        }
    }
    if !failed.is_empty() {
        return Observation::violation(failed.join("; "));
    }
    if answered.is_empty() {
        return Observation::compliant("no guard is installed, so there is nothing to probe");
    }
    Observation::compliant(format!(
        "{} answered the probe through the hosted kube-apiserver",
        answered.join(" and ")
    ))
}

/// When an HCP's first periodic probe goes: between half and one and a half intervals,
/// placed by a hash of its namespace. A restarted agent converges a thousand HCPs within
/// seconds; without the spread their probes would all go in the same second of every minute.
pub fn first_probe(ns: &str, every: Duration) -> Duration {
    let h = ns.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    every.mul_f64(0.5 + (h % 1000) as f64 / 1000.0)
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
        let first = first_probe(ns, every);
        let span = tracing::info_span!(parent: None, "probe", hcp_namespace = %ns, hosted_cluster = %cluster);
        w.probe = Some(AbortOnDrop(tokio::spawn(
            async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
                loop {
                    tick.tick().await;
                    // The revisions the last reconcile installed.
                    let targets = lock(&shared)
                        .desired
                        .as_ref()
                        .map(ProbeTargets::of)
                        .unwrap_or_default();
                    let now = probe(&hosted, timeout, &targets).await.state;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_probes_spread_over_the_interval() {
        let every = Duration::from_secs(60);
        let firsts: Vec<Duration> = (0..1000)
            .map(|i| first_probe(&format!("clusters-hc-{i}"), every))
            .collect();
        assert!(firsts.iter().all(|f| *f >= every / 2 && *f < every * 3 / 2));
        // Spread: no ten-second window of the minute holds more than a quarter of them.
        for w in 0..6u64 {
            let lo = every / 2 + Duration::from_secs(10 * w);
            let n = firsts
                .iter()
                .filter(|f| **f >= lo && **f < lo + Duration::from_secs(10))
                .count();
            assert!(n < 250, "{n} in window {w}");
        }
        assert_eq!(
            first_probe("clusters-a", every),
            first_probe("clusters-a", every)
        );
    }
}
