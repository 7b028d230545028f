//! Reporting writes: the per-HCP Policy (status, history, Events, drift total), the metrics
//! that mirror it, and the fleet roll-up Policy. What to write is computed by the pure
//! functions in `crate::reporting`; this module only reads, compares and writes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use tracing::warn;

use super::apply::apply;
use super::context::{Context, hcp_labels};
use crate::crd::{ComplianceState, HostedControlPlane, Policy, PolicyStatus};
use crate::reporting::{self, Observations, RollupRow};

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Reports one reconcile's observations: the compliance gauge and roll-up row at once, then
/// the Policy (where the CRD is installed).
pub async fn report(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    obs: &Observations,
    drift_repaired: u64,
) {
    let overall = reporting::aggregate(obs.values().map(|o| &o.state));
    let gauge = match overall {
        ComplianceState::Compliant => 0,
        ComplianceState::NonCompliant => 1,
        ComplianceState::Pending => -1,
    };
    {
        let mut hcps = ctx.hcps();
        // Under the lock `forget` also takes: the deletion watcher records the tombstone
        // before it forgets, so a late report can never resurrect the row or the series.
        if ctx.is_deleted(hcp) {
            return;
        }
        ctx.metrics
            .compliance
            .get_or_create(&hcp_labels(ns, cluster))
            .set(gauge);
        let row = RollupRow {
            cluster_name: cluster.to_string(),
            state: overall,
        };
        let state = hcps.entry(ns.to_string()).or_default();
        if state.rollup.as_ref() != Some(&row) {
            state.rollup = Some(row);
            ctx.rollup_changed.notify_one();
        }
        ctx.count_known(&hcps);
    }
    if !ctx.caps.policy_crd {
        return;
    }
    if let Err(e) = write_policy(ctx, hcp, ns, cluster, obs, drift_repaired).await {
        warn!(error = %e, "writing the Policy failed");
    }
}

async fn write_policy(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    obs: &Observations,
    drift_repaired: u64,
) -> Result<(), kube::Error> {
    let api: Api<Policy> = Api::namespaced(ctx.client.clone(), ns);
    let mut desired = reporting::render_policy(ns, cluster);
    if let Some(o) = hcp.controller_owner_ref(&()) {
        desired.metadata.owner_references = Some(vec![OwnerReference {
            controller: Some(false),
            block_owner_deletion: Some(false),
            ..o
        }]);
    }
    let mut current = match api.get_opt(reporting::POLICY_NAME).await? {
        Some(c)
            if c.spec == desired.spec
                && c.labels().get(reporting::CLUSTER_LABEL) == Some(&cluster.to_string()) =>
        {
            c
        }
        _ => apply(&api, reporting::POLICY_NAME, &desired).await?,
    };
    if drift_repaired > 0 {
        // The running total lives on the Policy, so it survives agent restarts.
        let before: u64 = current
            .annotations()
            .get(reporting::DRIFT_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let patch = serde_json::json!({"metadata": {"annotations": {reporting::DRIFT_ANNOTATION: (before + drift_repaired).to_string()}}});
        current = api
            .patch(
                reporting::POLICY_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    let next = reporting::next_status(
        ns,
        current.status.as_ref(),
        obs,
        &now_rfc3339(),
        ctx.caps.pending_supported,
    );
    if current.status.as_ref() == Some(&next) {
        return Ok(());
    }
    patch_status(&api, reporting::POLICY_NAME, &next).await?;
    // Events on the Policy, as ACM's own controllers emit them.
    let reference = current.object_ref(&());
    for e in reporting::new_entries(current.status.as_ref(), &next) {
        let ev = Event {
            type_: if e.compliant {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: format!("policy: {ns}/{}", e.template),
            note: Some(reporting::event_note(&e.message)),
            action: "ComplianceStateUpdated".into(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            warn!(error = %err, "publishing a Policy event failed");
        }
    }
    Ok(())
}

/// A whole status, by merge patch on the status subresource (the Policy's status is entirely
/// the agent's; arrays are replaced whole).
async fn patch_status(
    api: &Api<Policy>,
    name: &str,
    status: &PolicyStatus,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Writes the roll-up Policy whenever a row changes (debounced, so a fleet converging at once
/// costs a few writes, not one per HCP).
pub async fn rollup_writer(ctx: Arc<Context>) {
    let api: Api<Policy> = Api::namespaced(ctx.client.clone(), &ctx.agent_namespace);
    let mut last: Option<PolicyStatus> = None;
    loop {
        ctx.rollup_changed.notified().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rows: std::collections::BTreeMap<String, RollupRow> = ctx.rollup_rows();
        let status = reporting::rollup_status(&rows, ctx.caps.pending_supported);
        if last.as_ref() == Some(&status) {
            continue;
        }
        let res: Result<(), kube::Error> = async {
            let current = match api.get_opt(reporting::ROLLUP_NAME).await? {
                Some(p) => p,
                None => {
                    apply(
                        &api,
                        reporting::ROLLUP_NAME,
                        &reporting::render_rollup(&ctx.agent_namespace),
                    )
                    .await?
                }
            };
            if current.status.as_ref() != Some(&status) {
                patch_status(&api, reporting::ROLLUP_NAME, &status).await?;
            }
            Ok(())
        }
        .await;
        match res {
            Ok(()) => last = Some(status),
            Err(e) => {
                warn!(error = %e, "writing the roll-up Policy failed; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
                ctx.rollup_changed.notify_one();
            }
        }
    }
}
