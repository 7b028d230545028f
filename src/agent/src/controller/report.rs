//! The per-HCP half of reporting: each HCP's `AdmissionHealth` (status, history, Events, drift
//! total), the metrics that mirror it, and the HCP's row in the fleet's rows, which the hub
//! half (`controller/acm/hub.rs`) turns into ACM's verdicts. What to write is computed by
//! `hcp_fleet_render::reporting::record`; this module only reads, compares and writes.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use tracing::{info, warn};

use super::context::{Context, hcp_labels};
use super::io::apply::apply;
use super::io::cache;
use hcp_fleet_model::crd::{
    AdmissionHealth, AdmissionHealthStatus, ComplianceState, HostedControlPlane,
};
use hcp_fleet_render::reporting;
use hcp_fleet_render::reporting::Observations;
use hcp_fleet_render::reporting::hub::RollupRow;

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Reports one reconcile's observations: the compliance gauge and fleet row at once, then
/// the health record (where its CRD is installed).
/// What one reconcile found, for its report.
pub(crate) struct Pass<'a> {
    pub(crate) obs: &'a Observations,
    pub(crate) drift_repaired: u64,
    /// The revision it reconciled the HCP to.
    pub(crate) revision: &'a str,
    /// Whether the admission Deployment had fully rolled out to its current spec.
    pub(crate) rolled_out: bool,
    /// Who paused the HCP, when it is paused.
    pub(crate) paused: Option<reporting::record::PauseReason>,
    /// The path each guard takes, where this pass installed them; else the record keeps what
    /// it said (what is installed does not change while the agent cannot look).
    pub(crate) paths: Option<&'a [hcp_fleet_model::crd::GuardPath]>,
}

/// The report's part of an HCP's state (`HcpState::report`), written only here.
#[derive(Debug, Default)]
pub(super) struct Reported {
    /// The HCP's row in the fleet's rows, which the hub half reports (`Context::rollup_rows`).
    row: Option<RollupRow>,
    /// When a reconcile first found this HCP Pending with no health record yet
    /// (`NEW_RECORD_GRACE`).
    first_pending: Option<Instant>,
}

impl Reported {
    pub(super) fn row(&self) -> Option<&RollupRow> {
        self.row.as_ref()
    }

    /// When the HCP was first found Pending with no record: now, the first time.
    fn first_pending(&mut self) -> Instant {
        *self.first_pending.get_or_insert_with(Instant::now)
    }
}

/// How long a new HCP's first "Pending" may go unwritten: at a fleet's cold start most
/// HCPs pass from Pending (waiting for the admission Deployment) to a verdict within seconds,
/// and writing the record twice (created Pending, then its verdict) was two more requests
/// per HCP against the management ceiling. The metrics and the fleet row say Pending at once.
pub(crate) const NEW_RECORD_GRACE: Duration = Duration::from_secs(10);

/// Reports one pass. Returns when to come back if a new record's Pending was held back
/// (`NEW_RECORD_GRACE`): the reconcile looks again by then, and writes it if still Pending.
pub(crate) async fn report(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    pass: &Pass<'_>,
) -> Option<Duration> {
    let obs = pass.obs;
    let row = reporting::hub::rollup_row(cluster, obs);
    let pending = row.state == ComplianceState::Pending && pass.paused.is_none();
    let gauge = match row.state {
        ComplianceState::Compliant => 0,
        ComplianceState::NonCompliant => 1,
        ComplianceState::Pending => -1,
    };
    {
        let mut hcps = ctx.hcps();
        // Under the lock `forget` also takes: the deletion watcher records the tombstone
        // before it forgets, so a late report can never resurrect the row or the series.
        if ctx.is_deleted(hcp) {
            return None;
        }
        ctx.metrics
            .compliance
            .get_or_create(&hcp_labels(ns, cluster))
            .set(gauge);
        ctx.metrics.set_revision(ns, cluster, Some(pass.revision));
        let state = hcps.entry(ns.to_string()).or_default();
        if state.report.row.is_none() {
            ctx.metrics.known(ns, cluster);
            ctx.rows_moved(1);
        }
        if state.report.row.as_ref() != Some(&row) {
            state.report.row = Some(row);
            ctx.rollup_changed.notify_one();
        }
    }
    if !ctx.caps.health_crd {
        return None;
    }
    match write_health(ctx, hcp, ns, cluster, pass, pending).await {
        Ok(later) => later,
        Err(e) => {
            warn!(error = %crate::human::KubeError(&e), "writing the AdmissionHealth record failed");
            None
        }
    }
}

async fn write_health(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    pass: &Pass<'_>,
    pending: bool,
) -> Result<Option<Duration>, kube::Error> {
    let api: Api<AdmissionHealth> = Api::namespaced(ctx.client.clone(), ns);
    let store = ctx.caches().health;
    let name = reporting::record::health_name(cluster);
    let live = cache::read(ctx, ns, &api, store.as_ref(), name).await?;
    // An earlier release's record (one name in every namespace), as the watch holds it: its
    // status (history, pause start, drift count) and claim carry over to this one, then it
    // goes.
    let legacy = store.as_ref().and_then(|s| {
        s.get(
            &kube::runtime::reflector::ObjectRef::new(reporting::record::LEGACY_HEALTH_NAME)
                .within(ns),
        )
    });
    if live.is_none() && legacy.is_none() && pending {
        let first = ctx.with_hcp(ns, |s| s.report.first_pending());
        let left = NEW_RECORD_GRACE.saturating_sub(first.elapsed());
        if !left.is_zero() {
            return Ok(Some(left));
        }
    }
    // The claim: the hosted cluster this namespace reached, or the one it is recorded to have
    // reached (a reconcile that has not reached it yet must not erase the record).
    let uid = ctx
        .with_hcp(ns, |s| s.access.identity().map(str::to_string))
        .or_else(|| {
            live.as_ref()
                .and_then(|l| l.spec.claimed_uid().map(str::to_string))
                .or_else(|| Some(legacy.as_ref()?.spec.claimed_uid()?.to_string()))
        });
    let mut desired =
        reporting::record::render_health(ns, cluster, uid.as_deref(), Some(&ctx.agent_namespace));
    if let Some(o) = hcp.controller_owner_ref(&()) {
        // Garbage-collected with its HCP, but never blocking the HCP's deletion.
        desired.metadata.owner_references = Some(vec![OwnerReference {
            controller: Some(false),
            block_owner_deletion: Some(false),
            ..o
        }]);
    }
    let mut current = match live {
        Some(c)
            if c.spec == desired.spec
                && c.labels().get(reporting::record::CLUSTER_LABEL)
                    == Some(&cluster.to_string()) =>
        {
            c
        }
        _ => {
            let c = apply(&api, name, &desired).await?;
            cache::wrote(ctx, ns, &api, name, Some(&c));
            c
        }
    };
    let mut migrating = false;
    if let Some(old) = &legacy {
        if current.status.is_none() && old.status.is_some() {
            current.status.clone_from(&old.status);
            migrating = true;
        } else {
            drop_legacy(&api, ns).await;
        }
    }
    let now = now_rfc3339();
    // The status is written on the record as read: a record read from a store that lags (a
    // pause's start changed by someone since, say) must not be written over with what it
    // held. On a conflict it is read from the server and the status computed again, once.
    let mut reread = false;
    let next = loop {
        let next = next_status(&current, pass, &now);
        ctx.metrics.set_paused(
            ns,
            cluster,
            pass.paused.zip(
                next.paused_since
                    .as_deref()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok()),
            ),
        );
        if current.status.as_ref() == Some(&next) && !migrating {
            return Ok(None);
        }
        let written = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&status_patch(&next, current.resource_version())),
            )
            .await;
        match written {
            Err(kube::Error::Api(s)) if s.code == 409 && !reread => {
                reread = true;
                current = api.get(name).await?;
                cache::wrote(ctx, ns, &api, name, Some(&current));
            }
            written => {
                cache::wrote(ctx, ns, &api, name, written.as_ref().ok());
                written?;
                if migrating {
                    drop_legacy(&api, ns).await;
                }
                break next;
            }
        }
    };
    announce(ctx, &current, &next).await;
    Ok(None)
}

/// The Event a status change deserves, on the record (`current` as it was before `next`).
async fn announce(ctx: &Context, current: &AdmissionHealth, next: &AdmissionHealthStatus) {
    let reference = current.object_ref(&());
    let entries = reporting::record::new_entries(current.status.as_ref(), next);
    let first = current.status.is_none();
    if let Some((state, note)) = reporting::record::health_event(&entries)
        // A new record's first word is "waiting for …" (its history keeps it): an Event for
        // it would be one more write per HCP when a thousand start at once, and says nothing.
        .filter(|(state, _)| !(first && *state == ComplianceState::Pending))
    {
        let ev = Event {
            type_: if state == ComplianceState::Compliant {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: state.as_str().to_string(),
            note: Some(note),
            action: "ComplianceStateUpdated".into(),
            secondary: None,
        };
        if let Err(err) = ctx.publish(&ev, &reference).await {
            warn!(error = %crate::human::KubeError(&err), "publishing a health event failed");
        }
    }
}

/// Deletes the earlier release's record once its status lives on in the new one; a failure is
/// logged and tried again at the next write.
async fn drop_legacy(api: &Api<AdmissionHealth>, ns: &str) {
    match api
        .delete(reporting::record::LEGACY_HEALTH_NAME, &Default::default())
        .await
    {
        Ok(_) => {
            info!(namespace = %ns, "the earlier release's AdmissionHealth {} was carried over to the record named after the hosted cluster, and deleted", reporting::record::LEGACY_HEALTH_NAME)
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            warn!(error = %crate::human::KubeError(&e), "deleting the earlier release's AdmissionHealth {}", reporting::record::LEGACY_HEALTH_NAME)
        }
    }
}

/// The record's next status from `current` and this pass.
fn next_status(current: &AdmissionHealth, pass: &Pass<'_>, now: &str) -> AdmissionHealthStatus {
    let mut next = reporting::record::next_status(
        current.status.as_ref(),
        pass.obs,
        now,
        pass.drift_repaired,
        pass.revision,
        pass.rolled_out,
        current.metadata.generation,
    );
    next.paused_since =
        reporting::record::paused_since(current.status.as_ref(), pass.paused.is_some(), now);
    if let Some(p) = pass.paths {
        next.guards = p.to_vec();
    }
    next
}

/// The merge patch that writes `next` whole, on the record at `resource_version` (a conflict
/// where the record changed since). The status is entirely the agent's; a merge patch
/// replaces its arrays whole, and a field now absent must be sent as null to go.
fn status_patch(
    next: &AdmissionHealthStatus,
    resource_version: Option<String>,
) -> serde_json::Value {
    let mut patch = serde_json::json!({ "status": next });
    if next.revision_ready_since.is_none() {
        patch["status"]["revisionReadySince"] = serde_json::Value::Null;
    }
    if next.paused_since.is_none() {
        patch["status"]["pausedSince"] = serde_json::Value::Null;
    }
    if next.guards.is_empty() {
        patch["status"]["guards"] = serde_json::Value::Null;
    }
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
}
