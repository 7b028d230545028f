//! One reconcile of one HCP (after kube-rs's controller-rs): the phases in order, each gated
//! on the one before, then a report of everything observed, whether or not a phase failed.
//! `error_policy` counts every failure by phase and backs off per HCP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, instrument, warn};

use super::context::Context;
use super::error::{Failure, ReconcileError};
use super::io::watches;
use super::phases::proof::Proof;
use super::phases::{
    admission_service, certificates, hosted_access, hosted_webhooks, internal_registry, probe,
    static_guards, trust,
};
use super::scope::Scope;
use super::{report, rollout};
use crate::metrics::PhaseLabels;
use hcp_fleet_model::crd::HostedControlPlane;
use hcp_fleet_model::crd::hostedcontrolplane::Pause;
use hcp_fleet_render::reporting::record::PauseReason;
use hcp_fleet_render::reporting::{Concern, Observation, Observations};

/// What one pass found: an observation per concern reached, the drift it repaired, and how it
/// ended.
struct Outcome {
    observations: Observations,
    drift_repaired: u64,
    /// Whether the admission Deployment had fully rolled out to its current spec.
    rolled_out: bool,
    /// Who paused the HCP, when it is paused.
    paused: Option<PauseReason>,
    /// The path each guard takes, where the pass installed them.
    paths: Option<Vec<hcp_fleet_model::crd::GuardPath>>,
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
    // Another installation of the agent owns it: hands off, looked at again now and then.
    if super::ownership::owned_elsewhere(&ctx, &ns, &cluster)
        .await
        .is_some()
    {
        return Ok(Action::requeue(super::ownership::RECHECK));
    }
    // What this HCP runs: the revision the rollout gives it (or its pin), its override applied.
    let overrides = ctx.overrides_in(&ns);
    let resolved = ctx.resolve(&ns, &overrides);
    if !overrides.is_empty() || resolved.verdict.is_some() {
        rollout::report_overrides(&ctx, &ns, &cluster, &overrides, &resolved).await;
    }
    let now = jiff::Timestamp::now();
    let by_override = resolved
        .paused
        .then(|| overrides.first().map(|o| o.name_any()).unwrap_or_default());
    let asked = pause_asked(&hcp, by_override, now);
    // A pause past the configured maximum (counted from when the record first said paused)
    // no longer holds: the agent goes back to work; the record keeps the pause's start, so
    // the pause alert goes on until someone removes it.
    let max_hours = ctx.config().max_pause_hours;
    let since = asked.as_ref().and_then(|_| {
        ctx.caches()
            .health
            .and_then(|s| {
                s.get(
                    &ObjectRef::new(hcp_fleet_render::reporting::record::health_name(&cluster))
                        .within(&ns),
                )
            })
            .and_then(|h| h.status.as_ref().and_then(|s| s.paused_since.clone()))
    });
    let expired = asked.is_some()
        && hcp_fleet_render::reporting::record::pause_expired(since.as_deref(), max_hours, now);
    let mut outcome = match &asked {
        Some(pause) if !expired => {
            // Back when the pause ends by itself: its own end, or the maximum's.
            let ends =
                hcp_fleet_render::reporting::record::pause_ends(since.as_deref(), max_hours, now);
            let wake = match (pause.until, ends) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            paused(&ctx, &ns, pause, wake)
        }
        _ => run_phases(&Scope::new(&ctx, &hcp, &ns, &cluster, &resolved)).await,
    };
    if expired {
        warn!(
            max_hours = ctx.config().max_pause_hours,
            "the HCP has been paused longer than maxPauseHours; the agent works on it again"
        );
        // Still asked for, though no longer holding: the record keeps its start and the
        // gauge its age.
        outcome.paused = asked.map(|p| p.reason);
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
        Ok(_) => ctx.with_hcp(&ns, |s| s.pacing.failures = 0),
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
            paths: outcome.paths.as_deref(),
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

/// A pause someone asked for: who (as the report names them), why, and until when (`None`:
/// until it is taken back).
struct PauseAsked {
    by: String,
    reason: PauseReason,
    until: Option<jiff::Timestamp>,
}

/// Who asks for a pause, and until when: the HCP itself (the agent's annotation, or
/// HyperShift's spec.pausedUntil; the annotation named first), else the override named
/// `by_override` (given only when an override pauses the HCP).
fn pause_asked(
    hcp: &HostedControlPlane,
    by_override: Option<String>,
    now: jiff::Timestamp,
) -> Option<PauseAsked> {
    let from_hcp = |until| {
        let reason = if hcp.pauses(now).0.holds() {
            PauseReason::Annotation
        } else {
            PauseReason::HyperShift
        };
        Some(PauseAsked {
            by: hcp.paused_by(now),
            reason,
            until,
        })
    };
    match (hcp.pause(now), by_override) {
        (Pause::Indefinite, _) => from_hcp(None),
        (Pause::Until(t), _) => from_hcp(Some(t)),
        (_, Some(name)) => Some(PauseAsked {
            by: format!("HostedAdmissionOverride {name}"),
            reason: PauseReason::Override,
            until: None,
        }),
        (Pause::Off, None) => None,
        (Pause::Invalid(why), None) => {
            warn!(reason = %why, "pause annotation ignored");
            None
        }
    }
}

/// The longest a healthy HCP goes without a reconcile: a certificate coming due weeks ahead
/// is looked at again daily, so a clock step or a lost timer cannot postpone it for long.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// What the phases have found so far, kept by the orchestrator (`phases`) from what each
/// returns, and kept when a later one fails. No phase writes it: each returns its product
/// and its observations.
#[derive(Default)]
struct Found {
    observations: Observations,
    drift_repaired: u64,
    rolled_out: bool,
    paths: Option<Vec<hcp_fleet_model::crd::GuardPath>>,
}

impl Found {
    fn observe(&mut self, concern: Concern, observation: Observation) {
        self.observations.insert(concern, observation);
    }

    fn observe_all(&mut self, observed: Vec<(Concern, Observation)>) {
        self.observations.extend(observed);
    }

    /// Keeps what phase 4 found, whether or not its Deployment serves: its drift where it
    /// does, `None` while a first install waits for it, or the outage.
    fn admitted(&mut self, a: admission_service::Admitted) -> Result<Option<Vec<String>>, Failure> {
        self.rolled_out = a.rolled_out;
        self.drift_repaired = a.drift.len() as u64;
        self.observe_all(a.observed);
        Ok(a.serving?.then_some(a.drift))
    }
}

async fn run_phases(s: &Scope<'_>) -> Outcome {
    let mut found = Found::default();
    let result = phases(s, &mut found).await.map_err(|f| {
        let e = f.in_namespace(s.ns);
        found.observe(e.concern(), Observation::violation(e.violation()));
        e
    });
    Outcome {
        observations: found.observations,
        drift_repaired: found.drift_repaired,
        rolled_out: found.rolled_out,
        paused: None,
        paths: found.paths,
        result,
    }
}

/// The phases in order (`phases/`), each gated on the one before: each returns its product
/// and its observations, and this keeps them in `found`, which the report consumes whether or
/// not a later phase fails.
async fn phases(s: &Scope<'_>, found: &mut Found) -> Result<Action, Failure> {
    // 1. Discovery: a ready HCP with its kubeconfig published.
    if !s.hcp.is_ready() {
        let waiting = Observation::pending("waiting for the HostedControlPlane to be ready");
        for c in Concern::ALL {
            found.observe(c, waiting.clone());
        }
        return Ok(Action::await_change());
    }
    // 2. Hosted access, and the path the guards take there, which decides whether this HCP
    // needs the admission service at all. A hosted cluster that cannot be reached decides
    // nothing: a service that runs is kept (phase 4 goes on repairing it), none is started,
    // and the failure is reported once phase 4 is done.
    let hosted = hosted_access::connect(s).await;
    let (needed, known) = admission_service::needed(s, &hosted).await;
    // The static guards' files: not gated on the admission service or the hosted cluster,
    // since they guard without either.
    // The registry first: the pod image spec mutation carries its tags, in the files as
    // through the API. A hosted cluster not reached leaves what was read last.
    let registry = match &hosted {
        Ok(h) => internal_registry::current(s, h).await,
        Err(_) => internal_registry::Current::last_read(s),
    };
    let statics = static_guards::Statics::ensure_before(s, registry.registry.as_ref()).await?;
    // 3-4. Certificates and the admission service, where a guard needs it. Trust first: a new
    // certificate reaches the replicas only once the hosted side trusts its CA. The service is
    // gated on its Deployment.
    let mut hosted_drift = Vec::new();
    let service = if needed {
        let certs = certificates::ensure(s).await?;
        if certs.serving_changes {
            hosted_drift = trust::pre_trust(s, &certs.bundle, &statics).await?;
        }
        let Some(drift) = found.admitted(admission_service::admit(s, &certs).await?)? else {
            // The Deployment watch (owns) brings us back when its status changes.
            return Ok(Action::requeue(Duration::from_secs(300)));
        };
        Some((certs, drift))
    } else {
        // Nothing was rolled out, so nothing waits on a rollout.
        found.rolled_out = true;
        // Said now where none is left to retire, so that a hosted cluster that fails later in
        // the pass is reported for what fails.
        if known && !admission_service::exists(s).await {
            found.observe_all(admission_service::not_needed(&[]));
        }
        None
    };
    hosted_drift.extend(statics.note.clone());
    let hosted = match hosted {
        Ok(h) => h,
        Err(f) if service.is_none() && !known => {
            let waiting = "waiting for the hosted cluster: the path its guards take there decides whether the admission service is needed";
            found.observe(Concern::AdmissionService, Observation::pending(waiting));
            return Err(f);
        }
        Err(f) => return Err(f),
    };
    // 5-6. Webhook configurations and policies in the hosted cluster, kept from drifting.
    // Retire last: the previous CA leaves the caBundle once every replica serves the new
    // certificate.
    let (ca_bundle, settled) = match &service {
        Some((certs, _)) => trust::hosted_bundle(s, &hosted, &certs.bundle).await?,
        None => (String::new(), true),
    };
    let proof = Proof {
        key: service
            .as_ref()
            .and_then(|(certs, _)| certs.bundle.probe_key.clone()),
        rolling_out: !found.rolled_out,
    };
    let want = hosted_webhooks::Want {
        ca_bundle: &ca_bundle,
        revision: s.revision,
        proof: &proof,
        statics: &statics,
        registry: registry.registry.as_ref(),
        service: needed,
    };
    let mut installed = hosted_webhooks::ensure(s, &hosted, want).await?;
    hosted_drift.append(&mut installed.drift);
    found.paths = Some(std::mem::take(&mut installed.paths));
    // Kept once the drift watch (and the probe task that looks again later) is there to hold
    // what was written.
    internal_registry::ensure(s, &registry, needed).await?;
    let management_drift = match &service {
        Some((_, drift)) => drift.clone(),
        // No webhook calls the service any more, proven by the install that removed the
        // last: what served it goes.
        None if installed.configurations == 0 => {
            found.observe_all(admission_service::retired(s).await?);
            Vec::new()
        }
        None => Vec::new(),
    };
    found.drift_repaired += hosted_drift.len() as u64;
    let unsettled = trust::unsettled_in_a_row(s, settled);
    let static_waits = s.ctx.with_hcp(s.ns, |h| {
        in_a_row(&mut h.pacing.static_waits, installed.static_waiting)
    });
    found.observe(
        Concern::HostedWebhooks,
        hosted_webhooks::observation(&installed, &hosted_drift, settled, static_waits),
    );
    // 7. Prove it end to end, through the hosted kube-apiserver: after a repair too. A pass
    // that stopped here after drift left the probe "not checked" (Pending, Ready Unknown, a
    // Warning Event) at every repair, and under a burst of drift for as long as it lasted.
    let verdict = probe::prove(s, &hosted, &installed.targets).await?;
    found.observe(Concern::EndToEndProbe, verdict);
    if !hosted_drift.is_empty() || !management_drift.is_empty() {
        // Once more, so the history also records the steady state after the repair.
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    if !settled {
        // Look again until every replica serves the new certificate.
        return Ok(Action::requeue(settle_wait(unsettled)));
    }
    if static_waits > 0 {
        // The files reach the hosted kube-apiserver when its kubelet updates the volume
        // (about a minute on a real node, at once on the test bed) and it reloads them
        // (at once: it watches the directory). Until then the API-side guards stand in.
        return Ok(Action::requeue(static_wait(static_waits)));
    }
    // Between reconciles only the probe task runs; it queues one when its verdict changes.
    // And the certificates come due at a known time, which no event announces.
    let next_change = service.as_ref().and_then(|(certs, _)| certs.next_change);
    Ok(match next_change {
        Some(at) => Action::requeue(at.min(MAX_WAIT)),
        None => Action::await_change(),
    })
}

/// A paused HCP: its drift watch and probe stop, nothing is applied, and the report says so
/// (every concern Pending, so no NonCompliant alert fires for a deliberate pause). Removing
/// the annotation is an HCP change and resumes it; a pause with a time ends by itself.
fn paused(ctx: &Context, ns: &str, pause: &PauseAsked, wake: Option<jiff::Timestamp>) -> Outcome {
    watches::stop(ctx, ns);
    let by = &pause.by;
    let why = match pause.until {
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
        paused: Some(pause.reason),
        paths: None,
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
        s.pacing.failures = s.pacing.failures.saturating_add(1);
        s.pacing.failures
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
pub(crate) fn jittered(cap: Duration, r: f64) -> Duration {
    cap.mul_f64(r.clamp(0.0, 1.0))
        .max(Duration::from_secs(1).min(cap))
}

/// A uniform fraction in `[0, 1)` from the system's random source (1.0, no jitter, if it
/// fails).
fn random_fraction() -> f64 {
    use hcp_fleet_guards::crypto::rand::SecureRandom;
    let mut b = [0u8; 4];
    match hcp_fleet_guards::crypto::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 1.0,
    }
}

/// The pause before the next look for static guards not yet in force: every second for the
/// first ten looks (a kubelet's volume update, then the server's reload), then doubling up to
/// a minute (a server that does not load them: it may be restarted with them later).
pub(crate) fn static_wait(looks: u32) -> Duration {
    steady_then_backoff(looks, 10, Duration::from_secs(1))
}

/// How long to wait before looking again at replicas that do not all serve the new
/// certificate yet. Nothing announces that a replica has reloaded its certificate (it polls
/// its files), so the agent looks every 2 s for the first half minute, the time a rollout or
/// a reload takes, and only then backs off: with plain doubling, a replica that moved on just
/// after the third look kept the previous CA trusted for 16 s more.
pub(crate) fn settle_wait(looks: u32) -> Duration {
    steady_then_backoff(looks, 15, Duration::from_secs(2))
}

/// `every` for the first `steady` looks, then `backoff` from there.
fn steady_then_backoff(looks: u32, steady: u32, every: Duration) -> Duration {
    if looks <= steady {
        every
    } else {
        backoff(looks - steady)
    }
}

/// The orchestrator's part of an HCP's state (`HcpState::pacing`), written only here: what
/// paces the next reconcile.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Failed reconciles in a row (`error_policy`'s backoff); a success resets it.
    failures: u32,
    /// Reconciles in a row that wanted static guards not yet proven in force (`static_wait`).
    static_waits: u32,
}

/// Counts `yes` in a row in `n` (back to 0 at a no); the count.
pub(super) fn in_a_row(n: &mut u32, yes: bool) -> u32 {
    *n = if yes { n.saturating_add(1) } else { 0 };
    *n
}
