//! One reconcile of one HCP (after kube-rs's controller-rs): the phases in order, each gated
//! on the one before, then a report of everything observed, whether or not a phase failed.
//! `error_policy` counts every failure by phase and backs off per HCP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::context::{Context, hcp_labels, lock};
use super::error::{Failure, ReconcileError};
use super::{
    admission_service, canary, certificates, hosted_access, hosted_webhooks, probe, report,
    rollout, trust,
};
use crate::crd::hostedcontrolplane::Pause;
use crate::crd::{ComplianceState, HostedControlPlane};
use crate::management::deployment_available;
use crate::metrics::PhaseLabels;
use crate::overrides::Resolved;
use crate::reporting::{Concern, Observation, Observations, PauseReason};

/// What one pass found: an observation per concern reached, the drift it repaired, and how it
/// ended.
struct Outcome {
    observations: Observations,
    drift_repaired: u64,
    /// Whether the admission Deployment had fully rolled out to its current spec.
    rolled_out: bool,
    /// Who paused the HCP, when it is paused.
    paused: Option<PauseReason>,
    result: Result<Action, ReconcileError>,
}

#[instrument(skip_all, fields(hcp_namespace = %hcp.namespace().unwrap_or_default(), hosted_cluster = %hcp.name_any()))]
pub async fn reconcile(
    hcp: Arc<HostedControlPlane>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let ns = hcp.namespace().unwrap_or_default();
    // HyperShift names the HCP after its HostedCluster.
    let cluster = hcp.name_any();
    let started = Instant::now();
    // What this HCP runs: the revision the rollout gives it (or its pin), its override applied.
    let overrides = ctx.overrides_in(&ns);
    let resolved = ctx.resolve(&ns, &overrides);
    if !overrides.is_empty() || resolved.verdict.is_some() {
        rollout::report_overrides(&ctx, &ns, &cluster, &overrides, &resolved).await;
    }
    let now = jiff::Timestamp::now();
    let by_override = || {
        format!(
            "HostedAdmissionOverride {}",
            overrides.first().map(|o| o.name_any()).unwrap_or_default()
        )
    };
    // Who asks for a pause, and until when: the HCP itself (the agent's annotation, or
    // HyperShift's spec.pausedUntil; the annotation named first), else an override.
    let from_hcp = |until| {
        let reason = if hcp.pauses(now).0.holds() {
            PauseReason::Annotation
        } else {
            PauseReason::HyperShift
        };
        Some((hcp.paused_by(now), reason, until))
    };
    let asked = match hcp.pause(now) {
        Pause::Indefinite => from_hcp(None),
        Pause::Until(t) => from_hcp(Some(t)),
        _ if resolved.paused => Some((by_override(), PauseReason::Override, None)),
        Pause::Off => None,
        Pause::Invalid(why) => {
            warn!(reason = %why, "pause annotation ignored");
            None
        }
    };
    // A pause past the configured maximum (counted from when the record first said paused)
    // no longer holds: the agent goes back to work; the record keeps the pause's start, so
    // the pause alert goes on until someone removes it.
    let max_hours = ctx.config().max_pause_hours;
    let since = asked.as_ref().and_then(|_| {
        ctx.caches()
            .health
            .and_then(|s| s.get(&ObjectRef::new(crate::reporting::HEALTH_NAME).within(&ns)))
            .and_then(|h| h.status.as_ref().and_then(|s| s.paused_since.clone()))
    });
    let expired =
        asked.is_some() && crate::reporting::pause_expired(since.as_deref(), max_hours, now);
    let mut outcome = match &asked {
        Some((by, reason, until)) if !expired => {
            // Back when the pause ends by itself: its own end, or the maximum's.
            let ends = crate::reporting::pause_ends(since.as_deref(), max_hours, now);
            let wake = match (*until, ends) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            paused(&ctx, &ns, by.clone(), *reason, *until, wake)
        }
        _ => run_phases(&ctx, &hcp, &ns, &cluster, &resolved).await,
    };
    if expired {
        warn!(
            max_hours = ctx.config().max_pause_hours,
            "the HCP has been paused longer than maxPauseHours; the agent works on it again"
        );
        // Still asked for, though no longer holding: the record keeps its start and the
        // gauge its age.
        outcome.paused = asked.map(|(_, reason, _)| reason);
    }
    // Phases are gated: what a pass did not reach is unknown now, never its old verdict.
    for c in Concern::ALL {
        outcome.observations.entry(c).or_insert_with(|| {
            Observation::pending("not checked: an earlier phase did not complete")
        });
    }
    // A reconcile that was in flight when its HCP was deleted must not bring the row, the
    // series or the client back: it repeats the cleanup instead of reporting.
    if ctx.is_deleted(&hcp) {
        ctx.forget(&ns, &cluster);
        return Ok(Action::await_change());
    }
    match &outcome.result {
        Err(e) => warn!(error = %e, "reconcile failed"),
        Ok(_) => ctx.with_hcp(&ns, |s| s.failures = 0),
    }
    let held_back = report::report(
        &ctx,
        &hcp,
        &ns,
        &cluster,
        &report::Pass {
            obs: &outcome.observations,
            drift_repaired: outcome.drift_repaired,
            revision: &resolved.revision,
            rolled_out: outcome.rolled_out,
            paused: outcome.paused,
        },
    )
    .await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    match (outcome.result, held_back) {
        // A new record's Pending held back: look again by the end of its grace (a pass that
        // wanted to come back sooner does so before it anyway, through its watches).
        (Ok(_), Some(at)) => Ok(Action::requeue(at)),
        (result, _) => result,
    }
}

/// Owned for garbage collection, but never blocking HyperShift's deletion of the HCP.
fn owner(hcp: &HostedControlPlane) -> Option<OwnerReference> {
    hcp.controller_owner_ref(&()).map(|o| OwnerReference {
        block_owner_deletion: Some(false),
        controller: Some(false),
        ..o
    })
}

/// The longest a healthy HCP goes without a reconcile: a certificate coming due weeks ahead
/// is looked at again daily, so a clock step or a lost timer cannot postpone it for long.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

// Over 100 lines until the per-HCP scope type splits it (issue 32).
#[allow(clippy::too_many_lines)]
async fn run_phases(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    resolved: &Resolved,
) -> Outcome {
    let cfg = &resolved.config;
    let revision = resolved.revision.as_str();
    let mut seen = Observations::new();
    let mut drift_repaired = 0;
    let mut rolled_out = false;
    let result: Result<Action, Failure> = async {
        // 1. Discovery: a ready HCP with its kubeconfig published.
        if !hcp.is_ready() {
            let waiting = Observation::pending("waiting for the HostedControlPlane to be ready");
            seen.extend(Concern::ALL.map(|c| (c, waiting.clone())));
            return Ok(Action::await_change());
        }
        // 2. Certificates. 3. The admission service, gated on its Deployment.
        let certs = certificates::ensure(ctx, cfg, ns, cluster).await?;
        // Trust first: a new certificate reaches the replicas only once the hosted side
        // trusts its CA.
        let mut hosted_drift = if certs.serving_changes {
            trust::pre_trust(ctx, cfg, ns, cluster, &certs.bundle, revision).await?
        } else {
            Vec::new()
        };
        let scheduling = hcp.scheduling();
        if !scheduling.ignored.is_empty() {
            warn!(ignored = ?scheduling.ignored, "malformed HCP scheduling fields not followed");
        }
        let service = admission_service::ensure(
            ctx,
            cfg,
            ns,
            cluster,
            owner(hcp),
            &certs.bundle,
            &scheduling,
            revision,
        )
        .await?;
        let deployment = service.deployment;
        rolled_out = crate::management::deployment_rolled_out(&deployment);
        let management_drift = service.drift;
        drift_repaired = management_drift.len() as u64;
        let valid_until = format!("serving certificate valid until {}", certs.expires);
        seen.insert(Concern::Certificate, Observation::compliant(valid_until));
        // Once available, every later unavailability (in this agent's life) is an outage: the
        // Deployment rolls with maxUnavailable 0, so a rollout never makes it unavailable.
        // A generation its controller has not yet looked at (the spec just applied) is still
        // served by the replicas its status counts; only the first install waits for it.
        let was_available = ctx.with_hcp(ns, |s| s.served);
        let available = deployment_available(&deployment)
            || (was_available && crate::management::deployment_serving(&deployment));
        ctx.with_hcp(ns, |s| s.served |= available);
        if !available && was_available {
            // An outage, not a rollout that has yet to finish: the guard is off.
            let status = deployment.status.as_ref();
            return Err(Failure::AdmissionDown {
                ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
                want: crate::management::replicas(cfg, &scheduling),
            });
        }
        if !available {
            let waiting = "waiting for the admission Deployment to become available";
            seen.insert(Concern::AdmissionService, Observation::pending(waiting));
            let waiting = Observation::pending("waiting for the admission service");
            seen.insert(Concern::HostedWebhooks, waiting);
            // The Deployment watch (owns) brings us back when its status changes.
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        let ready = deployment
            .status
            .as_ref()
            .and_then(|s| s.available_replicas);
        let mut available = format!(
            "Deployment available ({}/{} replicas)",
            ready.unwrap_or(0),
            crate::management::replicas(cfg, &scheduling)
        );
        if !scheduling.ignored.is_empty() {
            available.push_str(&format!(
                "; not followed (malformed): {}",
                scheduling.ignored.join("; ")
            ));
        }
        if !management_drift.is_empty() {
            available.push_str(&format!("; drift repaired: {}", management_drift.join("; ")));
        }
        seen.insert(Concern::AdmissionService, Observation::compliant(available));
        // 4. Hosted access. 5-6. Webhook configurations there, kept from drifting.
        let hosted = hosted_access::connect(ctx, cfg, ns, cluster).await?;
        // Retire last: the previous CA leaves the caBundle once every replica serves the new
        // certificate.
        let (bundle, settled) =
            trust::hosted_bundle(ctx, cfg, ns, &hosted, &certs.bundle).await?;
        let installed =
            hosted_webhooks::ensure(
                ctx,
                cfg,
                ns,
                cluster,
                &hosted,
                hosted_webhooks::Want {
                    ca_bundle: &bundle,
                    revision,
                    proof: &probe::Proof {
                        key: certs.bundle.probe_key.clone(),
                        rolling_out: !rolled_out,
                    },
                },
            )
            .await?;
        hosted_drift.extend(installed.drift);
        drift_repaired += hosted_drift.len() as u64;
        let mut webhooks = if hosted_drift.is_empty() {
            let n = installed.configurations;
            let exemptions = if installed.exemptions_in_api_server {
                "exemptions applied by the API server (matchConditions)"
            } else {
                "exemptions applied by the admission service"
            };
            let (by_webhook, by_policy) = installed.guards;
            let mut text =
                format!("{n} webhook configuration(s) installed and current; {exemptions}");
            if by_policy > 0 {
                text.push_str(&format!(
                    "; {by_policy} guard(s) run as ValidatingAdmissionPolicy in the hosted kube-apiserver (exemptions as matchConditions), {by_webhook} as webhooks"
                ));
            }
            text
        } else {
            format!("drift repaired: {}", hosted_drift.join("; "))
        };
        let unsettled = ctx.with_hcp(ns, |s| {
            s.unsettled = if settled { 0 } else { s.unsettled.saturating_add(1) };
            s.unsettled
        });
        if !settled {
            webhooks.push_str(
                "; the previous CA stays in the caBundle until every replica serves the new certificate",
            );
        }
        // A policy the API server cannot type-check, or a guard not on the engine asked
        // for, is for an operator to fix: the guards keep running meanwhile.
        let problems: Vec<String> = installed
            .type_warnings
            .iter()
            .map(|w| format!("type check: {w}"))
            .chain(installed.notes.iter().cloned())
            .collect();
        seen.insert(
            Concern::HostedWebhooks,
            if problems.is_empty() {
                Observation::compliant(webhooks)
            } else {
                Observation::violation(format!("{}; {webhooks}", problems.join("; ")))
            },
        );
        if !hosted_drift.is_empty() || !management_drift.is_empty() {
            // Once more, so the history also records the steady state after the repair.
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        // 7. Prove it end to end, through the hosted kube-apiserver.
        let timeout = Duration::from_secs(u64::from(cfg.hosted_access.request_timeout_seconds));
        let mut verdict = probe::probe(&hosted.client(), timeout, &installed.targets).await;
        // And what the guards' canaries showed in their last rounds (the probe task sends them).
        let failed = ctx.with_hcp(ns, |s| {
            s.watch
                .as_ref()
                .map(|w| canary::failures(&lock(&w.shared).canary_results))
                .unwrap_or_default()
        });
        if !failed.is_empty() {
            verdict = Observation::violation(format!("{}; {}", failed.join("; "), verdict.message));
        }
        let ok = verdict.state == ComplianceState::Compliant;
        let labels = hcp_labels(ns, cluster);
        ctx.metrics
            .probe_success
            .get_or_create(&labels)
            .set(i64::from(ok));
        let every = Duration::from_secs(u64::from(cfg.probe_interval_seconds));
        probe::ensure_task(
            ctx,
            ns,
            cluster,
            &hosted,
            verdict.state,
            timeout,
            every,
        );
        seen.insert(Concern::EndToEndProbe, verdict);
        if !settled {
            // Look again until every replica serves the new certificate.
            return Ok(Action::requeue(settle_wait(unsettled)));
        }
        // Between reconciles only the probe task runs; it queues one when its verdict changes.
        // And the certificates come due at a known time, which no event announces.
        Ok(match certs.next_change {
            Some(at) => Action::requeue(at.min(MAX_WAIT)),
            None => Action::await_change(),
        })
    }
    .await;
    let result = result.map_err(|f| {
        let e = f.in_namespace(ns);
        seen.insert(e.concern(), Observation::violation(e.violation()));
        e
    });
    Outcome {
        observations: seen,
        drift_repaired,
        rolled_out,
        paused: None,
        result,
    }
}

/// A paused HCP: its drift watch and probe stop, nothing is applied, and the report says so
/// (every concern Pending, so no NonCompliant alert fires for a deliberate pause). Removing
/// the annotation is an HCP change and resumes it; a pause with a time ends by itself.
fn paused(
    ctx: &Context,
    ns: &str,
    by: String,
    reason: PauseReason,
    until: Option<jiff::Timestamp>,
    wake: Option<jiff::Timestamp>,
) -> Outcome {
    ctx.with_hcp(ns, |s| s.watch = None);
    let why = match until {
        Some(t) => format!(
            "paused by {by} until {}; the agent changes nothing for this HCP",
            t.strftime("%Y-%m-%dT%H:%M:%SZ")
        ),
        None => format!("paused by {by}; the agent changes nothing for this HCP"),
    };
    info!(%why, "paused");
    let action = match wake {
        Some(t) => {
            let left = jiff::Timestamp::now().duration_until(t);
            Action::requeue(Duration::try_from(left).unwrap_or_default())
        }
        None => Action::await_change(),
    };
    Outcome {
        observations: Concern::ALL
            .map(|c| (c, Observation::pending(why.clone())))
            .into_iter()
            .collect(),
        drift_repaired: 0,
        rolled_out: false,
        paused: Some(reason),
        result: Ok(action),
    }
}

/// Counts the failure by phase and retries the HCP on its own schedule (`backoff`), so one
/// broken hosted cluster never holds up the others.
pub fn error_policy(
    hcp: Arc<HostedControlPlane>,
    err: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&PhaseLabels {
            phase: err.phase().as_str().into(),
        })
        .inc();
    if ctx.is_deleted(&hcp) {
        return Action::await_change();
    }
    let ns = hcp.namespace().unwrap_or_default();
    let failures = ctx.with_hcp(&ns, |s| {
        s.failures = s.failures.saturating_add(1);
        s.failures
    });
    Action::requeue(jittered(backoff(failures), random_fraction()))
}

/// Per-HCP exponential backoff: 2 s, 4 s, … capped at 60 s; a success resets it.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(failures.min(6)).min(60))
}

/// Full jitter: a retry at a uniform point of `[0, cap]` (`r` in `[0, 1)`), at least a second
/// later. A thousand HCPs failing together (a management API server restarting, a shared
/// dependency down) must not come back in step, each wave as large as the last.
pub fn jittered(cap: Duration, r: f64) -> Duration {
    cap.mul_f64(r.clamp(0.0, 1.0))
        .max(Duration::from_secs(1).min(cap))
}

/// A uniform fraction in `[0, 1)` from the system's random source (1.0, no jitter, if it
/// fails).
fn random_fraction() -> f64 {
    use crate::crypto::rand::SecureRandom;
    let mut b = [0u8; 4];
    match crate::crypto::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 1.0,
    }
}

/// How long to wait before looking again at replicas that do not all serve the new
/// certificate yet. Nothing announces that a replica has reloaded its certificate (it polls
/// its files), so the agent looks every 2 s for the first half minute, the time a rollout or
/// a reload takes, and only then backs off: with plain doubling, a replica that moved on just
/// after the third look kept the previous CA trusted for 16 s more.
pub fn settle_wait(looks: u32) -> Duration {
    const STEADY_LOOKS: u32 = 15;
    if looks <= STEADY_LOOKS {
        Duration::from_secs(2)
    } else {
        backoff(looks - STEADY_LOOKS)
    }
}
