//! Phase 5 and 6: the webhook configurations in the hosted cluster, applied where they differ
//! and pruned where no longer wanted, with the drift watch told the new desired state before
//! the write so the agent's own write is never taken for drift.

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::ListParams;
use kube::{Api, Client};

use super::apply::apply_and_prune;
use super::context::{Context, hcp_labels, lock};
use super::error::Failure;
use super::watches;
use crate::config::AgentConfig;
use crate::hosted::clients::HostedClient;
use crate::hosted::webhooks::{self, HostedWebhooks, MUTATING_NAME, VALIDATING_NAME};

/// What the phase found: how many configurations are installed, and the drift repaired since
/// the last reconcile (one note per change by someone else).
pub struct Installed {
    pub configurations: usize,
    pub drift: Vec<String>,
    /// Where the exemptions are applied: by the API server (matchConditions), or by the
    /// admission service after the call.
    pub exemptions_in_api_server: bool,
}

pub async fn ensure(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    cluster: &str,
    hosted: &HostedClient,
    ca_bundle: &str,
) -> Result<Installed, Failure> {
    let url_base = ctx.endpoints.url_base(&ctx.client, cfg, ns).await;
    // Installing what HyperShift deletes at once would be a fight counted as drift forever.
    let services = Api::<Service>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(Failure::ListServices)?;
    let condemning = crate::management::services_condemning(&url_base, &services.items);
    if !condemning.is_empty() {
        return Err(Failure::GuestWebhooksCondemned {
            url: url_base,
            services: condemning,
        });
    }
    let features = hosted.features().await;
    let mut desired = webhooks::render(cfg, ns, &url_base, ca_bundle, features)
        .map_err(Failure::RenderWebhooks)?;
    // Hosted access has confirmed the claim (and read the management identity) first.
    if let Some(uid) = ctx.management_uid() {
        desired = desired.claimed(&webhooks::claim_value(&uid, ns));
    }
    let want = usize::from(desired.validating.is_some()) + usize::from(desired.mutating.is_some());
    let labels = hcp_labels(ns, cluster);
    let m = &ctx.metrics;
    m.webhooks_desired.get_or_create(&labels).set(want as i64);
    let timeout = Duration::from_secs(u64::from(cfg.hosted_access.request_timeout_seconds));
    watches::ensure_drift_watch(ctx, ns, cluster, hosted, desired.clone());
    let t0 = Instant::now();
    let installed = tokio::time::timeout(timeout, install(&hosted.client, &desired)).await;
    m.hosted_latency
        .get_or_create(&labels)
        .observe(t0.elapsed().as_secs_f64());
    let failure = match installed {
        Ok(Ok(())) => None,
        Ok(Err(source)) => Some(Failure::HostedApi {
            server: hosted.server.clone(),
            source,
        }),
        Err(_) => Some(Failure::HostedTimeout {
            server: hosted.server.clone(),
            seconds: timeout.as_secs(),
        }),
    };
    if let Some(f) = failure {
        m.hosted_errors.get_or_create(&labels).inc();
        m.webhooks_installed.get_or_create(&labels).set(0);
        return Err(f);
    }
    m.webhooks_installed.get_or_create(&labels).set(want as i64);
    let drift = ctx.with_hcp(ns, |s| {
        s.watch
            .as_ref()
            .map(|w| std::mem::take(&mut lock(&w.shared).drift_notes))
            .unwrap_or_default()
    });
    Ok(Installed {
        configurations: want,
        drift,
        exemptions_in_api_server: features.match_conditions,
    })
}

/// Both configuration kinds through the one apply-and-prune helper.
pub async fn install(hosted: &Client, desired: &HostedWebhooks) -> Result<(), kube::Error> {
    let owned = webhooks::owned_selector();
    apply_and_prune(
        &Api::<ValidatingWebhookConfiguration>::all(hosted.clone()),
        VALIDATING_NAME,
        desired.validating.as_ref(),
        &owned,
        webhooks::webhooks_match,
    )
    .await?;
    apply_and_prune(
        &Api::<MutatingWebhookConfiguration>::all(hosted.clone()),
        MUTATING_NAME,
        desired.mutating.as_ref(),
        &owned,
        webhooks::webhooks_match,
    )
    .await
}
