//! Phase 7's last step where `switchOver.labelProvenNamespaces` is on: once the probe and every
//! canary have proven an HCP's guards in force, its namespace gets the label the fleet's MCVW
//! Policy selects against (`render::switch_over`), once: a namespace seen labelled is not
//! looked at again in this agent's life, and a restarted agent reads it before it writes.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tracing::info;

use super::canary::{self, Shown};
use crate::controller::context::lock;
use crate::controller::scope::Scope;
use hcp_fleet_render::switch_over::{
    Evidence, FIELD_MANAGER, GUARDS_PROVEN_LABEL, label_patch, labelled,
};

/// What the switch-over adds to the probe's message: the label (once set), or why it could
/// not be set. `None` while the guards are not yet proven, or with the switch-over off: the
/// record says nothing that changes from one canary to the next.
pub(in crate::controller) async fn mark(s: &Scope<'_>, probe_proven: bool) -> Option<String> {
    if !s.cfg.switch_over.label_proven_namespaces {
        return None;
    }
    let done = format!("every guard proven in force: namespace labelled {GUARDS_PROVEN_LABEL}");
    if s.ctx.with_hcp(s.ns, |h| h.switch_over.0) {
        return Some(done);
    }
    if !evidence(s, probe_proven).proven() {
        return None;
    }
    let api = Api::<Namespace>::all(s.ctx.client.clone());
    let result = async {
        let live = api.get(s.ns).await?;
        if !labelled(live.metadata.labels.as_ref()) {
            let pp = PatchParams::apply(FIELD_MANAGER);
            api.patch(s.ns, &pp, &Patch::Apply(&label_patch(s.ns)))
                .await?;
            info!(
                label = GUARDS_PROVEN_LABEL,
                "every guard proven in force by the probe and its canary: namespace labelled for MCVW's package to go"
            );
        }
        Ok::<_, kube::Error>(())
    }
    .await;
    match result {
        Ok(()) => {
            s.ctx.with_hcp(s.ns, |h| h.switch_over.0 = true);
            Some(done)
        }
        Err(e) => {
            tracing::warn!(error = %e, "every guard proven in force, but the namespace cannot be labelled");
            Some(format!(
                "every guard proven in force, but namespace {} cannot be labelled {GUARDS_PROVEN_LABEL} (the chart grants get and patch on namespaces with switchOver.labelProvenNamespaces): {e}",
                s.ns
            ))
        }
    }
}

/// This step's part of an HCP's state (`HcpState::switch_over`), written only here: the
/// namespace was seen to carry the label (`mark`).
#[derive(Debug, Default)]
pub(in crate::controller) struct Labelled(bool);

/// The probe's verdict with the canaries' last results.
fn evidence(s: &Scope<'_>, probe_proven: bool) -> Evidence {
    s.ctx.with_hcp(s.ns, |h| {
        let Some(w) = h.watch.as_ref() else {
            return Evidence {
                probe_proven,
                ..Evidence::default()
            };
        };
        let shared = lock(&w.shared);
        canary::evidence(probe_proven, &shared.canaries, &shared.canary_results)
    })
}

/// Whether the canary result that just replaced `before` completes the proof of `plan`'s
/// guards (the probe task asks for a reconcile then, which labels the namespace: nothing else
/// would, the probe's verdict being unchanged).
pub(in crate::controller) fn completes_proof(
    plan: &[canary::Planned],
    before: Option<&Shown>,
    now: &Shown,
    results: &std::collections::BTreeMap<String, Shown>,
) -> bool {
    before != Some(now) && canary::evidence(true, plan, results).proven()
}
