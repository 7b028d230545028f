//! Phase 7: prove it end to end. A dry-run request through the hosted kube-apiserver that only
//! the installed path answers (the admission service's probe webhook, the probe admission
//! policy, or each in turn where both are installed); and the task that repeats it between
//! reconciles, the agent's only periodic request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use tracing::{Instrument, info};

use super::canary;
use super::internal_registry::changed as registry_changed;
use super::proof::{self, Answer, Asked, Proof, authentic};
use crate::controller::AdmissionEndpoints;
use crate::controller::context::{AbortOnDrop, WatchShared, lock};
use crate::controller::error::Failure;
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use hcp_fleet_guards::catalogue::{
    MUTATING_PROBE_ANSWER, MUTATING_PROBE_VALUE, POLICY_PROBE_VALUE, PROBE_LABEL,
    PROBE_REVISION_LABEL, STATIC_MUTATING_PROBE_VALUE,
};
use hcp_fleet_guards::probe::{
    FOREIGN_ANSWER, FOREIGN_POLICY_ANSWER, NO_ANSWER, NONCE_ANNOTATION, OWN_DENIALS_PATH, ProbeKey,
};
use hcp_fleet_model::crd::{ComplianceState, HostedControlPlane};
use hcp_fleet_render::hosted::admission_policies::Engine;
use hcp_fleet_render::hosted::wanted::Wanted;
use hcp_fleet_render::reporting::Observation;

/// What the probe asks for: the revision of each path installed (`None`: that path is not),
/// and what the admission service's answers must prove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProbeTargets {
    pub(crate) webhook: Option<String>,
    pub(crate) policy: Option<String>,
    /// The static guards' revision, where they are in force (`hosted::static_guards`).
    pub(crate) static_guards: Option<String>,
    /// The static mutating policies' revision, likewise.
    pub(crate) static_mutating: Option<String>,
    pub(crate) proof: Proof,
}

impl ProbeTargets {
    pub(crate) fn of(wanted: &Wanted, proof: Proof) -> Self {
        Self {
            webhook: wanted.webhook_revision.clone(),
            policy: wanted.policy_revision.clone(),
            static_guards: None,
            static_mutating: None,
            proof,
        }
    }
}

/// Why a probe path did not answer as the agent's guards answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeFailure {
    #[error("the system's random source failed, so no probe nonce could be made")]
    NoNonce,
    /// Denied by something that could not prove it is the admission service. The text is
    /// left out: it is the tenant's to choose.
    #[error(
        "the probe was denied without the admission service's proof: {FOREIGN_ANSWER} (a webhook of the hosted cluster's own, named like the probe?), or the service does not hold this HCP's probe key"
    )]
    ImitatedService,
    /// The policy probe denied with another message (cut and cleaned: the tenant's text).
    #[error("the policy probe {FOREIGN_POLICY_ANSWER}: {0}")]
    ImitatedPolicy(String),
    // No timing in these messages: a steady probe must not add history (and writes) each time.
    #[error(
        "the hosted kube-apiserver did not reach the admission service (the probe was let through by failurePolicy Ignore)"
    )]
    ServiceNotReached,
    #[error(
        "the hosted kube-apiserver does not run the agent's admission policies (the policy probe was let through)"
    )]
    PoliciesNotRun,
    #[error(
        "the hosted kube-apiserver does not run this revision of the static guards (the static probe was let through): the ConfigMap hcp-fleet-static-guards is not mounted, not loaded yet, or the feature gate ManifestBasedAdmissionControlConfig is off"
    )]
    StaticNotRun,
    #[error(
        "the hosted kube-apiserver does not run this revision of the static mutating policies (the static mutating probe was let through): the ConfigMap hcp-fleet-static-guards's mutating-policies.yaml is not mounted, not loaded yet, or the MutatingAdmissionPolicy plugin has no staticManifestsDir"
    )]
    StaticMutatingNotRun,
    #[error("probe failed: {}", crate::human::KubeError(.0))]
    Failed(#[source] kube::Error),
    #[error("probe {NO_ANSWER} {0}s")]
    NoAnswer(u64),
}

impl ProbeFailure {
    /// No answer came back at all (none in time, or the connection failed): unlike a wrong
    /// answer, this may be the hosted kube-apiserver's silence rather than the path's.
    fn unanswered(&self) -> bool {
        match self {
            ProbeFailure::NoAnswer(_) => true,
            ProbeFailure::Failed(e) => crate::hosted::clients::unanswered(e),
            _ => false,
        }
    }
}

/// One probe of every path: the verdict, and the first path's failure that was no answer at
/// all.
pub(crate) struct Probed {
    pub(crate) verdict: Observation,
    pub(crate) unanswered: Option<ProbeFailure>,
}

/// A dry-run create of a labelled ConfigMap that only the probe of `engine` at `revision` sees:
/// the probe webhook (answered by the admission service) or the probe admission policy
/// (answered by the hosted kube-apiserver itself). `Ok` when it answered; otherwise what
/// happened instead. An allowed request means nothing at that revision saw it: the service's
/// call failed (failurePolicy Ignore let it through), or the server does not run it yet.
pub(crate) async fn probe_path(
    hosted: &Client,
    timeout: Duration,
    engine: Engine,
    revision: &str,
    proof: &Proof,
) -> Result<Answer, ProbeFailure> {
    let value = match engine {
        Engine::Webhook => "true",
        Engine::Policy | Engine::Static => POLICY_PROBE_VALUE,
    };
    let nonce = hcp_fleet_guards::probe::nonce().ok_or(ProbeFailure::NoNonce)?;
    let cm = probe_object(value, revision, &nonce);
    let name = probe_name(&nonce);
    let t0 = Instant::now();
    match tokio::time::timeout(timeout, dry_run_create(hosted, &cm)).await {
        Ok(Err(kube::Error::Api(s))) => match authentic(engine, &s, &asked(&name), proof, &nonce) {
            Answer::Imitation => Err(match engine {
                Engine::Webhook => ProbeFailure::ImitatedService,
                Engine::Policy | Engine::Static => ProbeFailure::ImitatedPolicy(
                    hcp_fleet_render::reporting::untrusted(&s.message, 300),
                ),
            }),
            answer => {
                tracing::debug!(
                    engine = engine.as_str(),
                    ms = t0.elapsed().as_millis() as u64,
                    ?answer,
                    "probe answered"
                );
                Ok(answer)
            }
        },
        Ok(Ok(_)) => Err(match engine {
            Engine::Webhook => ProbeFailure::ServiceNotReached,
            Engine::Policy => ProbeFailure::PoliciesNotRun,
            Engine::Static => ProbeFailure::StaticNotRun,
        }),
        Ok(Err(e)) => Err(ProbeFailure::Failed(e)),
        Err(_) => Err(ProbeFailure::NoAnswer(timeout.as_secs())),
    }
}

/// Does the hosted kube-apiserver run the static mutating policies of `revision`
/// (`hosted::static_guards`)? Their probe denies a dry-run create of a ConfigMap labelled for
/// it in the server's own words, naming the probe policy loaded from files
/// (`proof::judge_static_mutating`); anything else is not an answer.
pub(crate) async fn probe_static_mutating(
    hosted: &Client,
    timeout: Duration,
    revision: &str,
) -> Result<(), ProbeFailure> {
    let nonce = hcp_fleet_guards::probe::nonce().ok_or(ProbeFailure::NoNonce)?;
    let cm = probe_object(STATIC_MUTATING_PROBE_VALUE, revision, &nonce);
    let name = probe_name(&nonce);
    match tokio::time::timeout(timeout, dry_run_create(hosted, &cm)).await {
        Ok(Err(kube::Error::Api(s))) => match proof::judge_static_mutating(&s, &asked(&name)) {
            Answer::Proven => Ok(()),
            _ => Err(ProbeFailure::ImitatedPolicy(
                hcp_fleet_render::reporting::untrusted(&s.message, 300),
            )),
        },
        Ok(Ok(_)) => Err(ProbeFailure::StaticMutatingNotRun),
        Ok(Err(e)) => Err(ProbeFailure::Failed(e)),
        Err(_) => Err(ProbeFailure::NoAnswer(timeout.as_secs())),
    }
}

/// Does the hosted kube-apiserver run the mutating policies of `revision`? A dry-run create
/// of a ConfigMap labelled for the mutating probe policy comes back with the revision written
/// in where it does (`hosted::admission_policies`: the probe is written after every mutating
/// policy and binding). `Err` says what came back instead.
pub(crate) async fn probe_mutating(
    hosted: &Client,
    timeout: Duration,
    revision: &str,
) -> Result<(), String> {
    let nonce = hcp_fleet_guards::probe::nonce().ok_or("the system's random source failed")?;
    let cm = probe_object(MUTATING_PROBE_VALUE, revision, &nonce);
    match tokio::time::timeout(timeout, dry_run_create(hosted, &cm)).await {
        Ok(Ok(answer)) => {
            let written = answer
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(MUTATING_PROBE_ANSWER))
                .cloned();
            match written {
                Some(r) if r == revision => Ok(()),
                Some(_) => Err(format!(
                    "the mutating probe came back with another revision than {revision}"
                )),
                None => Err(format!(
                    "the mutating admission policies of revision {revision} have not run yet"
                )),
            }
        }
        Ok(Err(e)) => Err(crate::human::KubeError(&e).to_string()),
        Err(_) => Err(format!("no answer within {}s", timeout.as_secs())),
    }
}

/// A probe request's ConfigMap: labelled for the path `value` names at `revision`, carrying
/// `nonce`. Named by the client, not generated: a policy's denial names the object, and the
/// judge takes it only for the object this probe asked about.
fn probe_object(value: &str, revision: &str, nonce: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(probe_name(nonce));
    cm.metadata.labels = Some(BTreeMap::from([
        (PROBE_LABEL.to_string(), value.to_string()),
        (PROBE_REVISION_LABEL.to_string(), revision.to_string()),
    ]));
    cm.metadata.annotations = Some(BTreeMap::from([(
        NONCE_ANNOTATION.to_string(),
        nonce.to_string(),
    )]));
    cm
}

/// Sends a probe request as a dry run in `default`, so nothing is stored.
async fn dry_run_create(hosted: &Client, cm: &ConfigMap) -> Result<ConfigMap, kube::Error> {
    let pp = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(hosted.clone(), "default")
        .create(&pp, cm)
        .await
}

/// The probe ConfigMap's name for `nonce` (hex): fresh per request, so no stored ConfigMap
/// can answer for it.
fn probe_name(nonce: &str) -> String {
    format!("hcp-fleet-probe-{}", nonce.get(..16).unwrap_or(nonce))
}

/// The probe's object, as a denial names it.
fn asked(name: &str) -> Asked<'_> {
    Asked {
        group: "",
        resource: "configmaps",
        name,
    }
}

/// The end-to-end probe of every path installed, through the hosted kube-apiserver.
/// `reported`: the cluster's own requests the admission replicas last said they denied
/// (`own_denials`), which fail the verdict.
pub(crate) async fn probe(
    hosted: &Client,
    timeout: Duration,
    targets: &ProbeTargets,
    reported: Option<&str>,
) -> Probed {
    let mut results = Vec::new();
    for (engine, rev, who) in [
        (Engine::Webhook, &targets.webhook, "the admission service"),
        (Engine::Policy, &targets.policy, "the admission policies"),
        (Engine::Static, &targets.static_guards, "the static guards"),
    ] {
        if let Some(rev) = rev {
            let r = probe_path(hosted, timeout, engine, rev, &targets.proof).await;
            results.push((who, r));
        }
    }
    if let Some(rev) = &targets.static_mutating {
        let r = probe_static_mutating(hosted, timeout, rev).await;
        results.push(("the static mutating policies", r.map(|()| Answer::Proven)));
    }
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    let mut unanswered = None;
    let mut unproven = false;
    for (who, r) in results {
        match r {
            Ok(a) => {
                unproven |= a == Answer::Unproven;
                answered.push(who);
            }
            Err(e) => {
                failed.push(e.to_string());
                if e.unanswered() && unanswered.is_none() {
                    unanswered = Some(e);
                }
            }
        }
    }
    let verdict = verdict(&answered, &failed, unproven, reported);
    Probed {
        verdict,
        unanswered,
    }
}

/// In the probe's verdict: the admission service answered, and reported that a guard denies
/// the hosted cluster's own requests (`runbook.md`, HcpFleetGuardBreaksTheCluster).
pub(crate) const BREAKS_THE_CLUSTER: &str = "a guard is breaking the hosted cluster: the admission service denied the cluster's own requests in the last 10 minutes";

fn verdict(
    answered: &[&str],
    failed: &[String],
    unproven: bool,
    reported: Option<&str>,
) -> Observation {
    let mut failed = failed.to_vec();
    if let Some(r) = reported {
        // The service's own words, proven by its key; cut as any text on the record is.
        failed.push(format!(
            "{BREAKS_THE_CLUSTER} ({}); see the runbook's HcpFleetGuardBreaksTheCluster",
            hcp_fleet_render::reporting::untrusted(r, 600)
        ));
    }
    if !failed.is_empty() {
        return Observation::violation(failed.join("; "));
    }
    if answered.is_empty() {
        return Observation::compliant("no guard is installed, so there is nothing to probe");
    }
    Observation::compliant(format!(
        "{} answered the probe through the hosted kube-apiserver{}",
        answered.join(" and "),
        if unproven {
            " (without the probe key's proof, taken while the admission Deployment rolls out)"
        } else {
            ""
        }
    ))
}

/// Every how many probe rounds the agent asks each admission replica what it denied of the
/// cluster's own requests: once in five minutes at the default interval, well within the
/// report's ten, and at a thousand HCPs a request per replica every five rounds, not every
/// round.
const REPORT_ROUNDS: u64 = 5;
/// The longest report the agent reads: guards × senders pairs are a few hundred bytes.
const REPORT_LIMIT: usize = 16 * 1024;

/// Where an HCP's admission replicas are found, to ask each for its report.
pub(crate) struct Replicas {
    pub(crate) management: Client,
    pub(crate) endpoints: Arc<dyn AdmissionEndpoints>,
    pub(crate) service: String,
    pub(crate) port: i32,
    pub(crate) namespace: String,
    /// The agent's watches of the admission Services and of their ready replicas, which
    /// answer where they can (`endpoints::Seen`): the report asks every few rounds.
    pub(crate) services:
        Option<crate::controller::io::text_store::TextStore<k8s_openapi::api::core::v1::Service>>,
    pub(crate) ready: Option<Arc<crate::controller::endpoints::ReadyEndpoints>>,
}

impl Replicas {
    /// Where `service` on `port` in `ns` is found, with what the agent's watches hold.
    fn of(ctx: &crate::controller::context::Context, service: &str, port: i32, ns: &str) -> Self {
        let caches = ctx.caches();
        Replicas {
            management: ctx.client.clone(),
            endpoints: Arc::clone(&ctx.endpoints),
            service: service.to_string(),
            port,
            namespace: ns.to_string(),
            services: caches.services,
            ready: caches.ready_endpoints,
        }
    }

    /// What the watches hold of the service now.
    fn seen(&self) -> crate::controller::Seen {
        crate::controller::Seen {
            service: self
                .services
                .as_ref()
                .and_then(|s| s.get(&self.namespace, &self.service))
                .and_then(Result::ok),
            ready: self
                .ready
                .as_ref()
                .and_then(|r| r.get(&self.service, &self.namespace, self.port)),
        }
    }
}

/// What the admission replicas report of the hosted cluster's own requests they denied in the
/// last 10 minutes ("<webhook> denied <sender>", each pair once, in order), each replica's
/// report proven under the probe key. `Ok(None)`: none reported one. A replica that does not
/// answer, answers without the proof, or predates the report adds nothing: only a proven
/// report is put on the record. `Err`: where the replicas are is not known.
pub(crate) async fn own_denials(
    at: &Replicas,
    key: &ProbeKey,
    timeout: Duration,
) -> Result<Option<String>, crate::controller::ReplicasUnknown> {
    let addrs = at
        .endpoints
        .replicas(
            &at.management,
            &at.service,
            at.port,
            &at.namespace,
            at.seen(),
        )
        .await?;
    let name = format!("{}.{}.svc", at.service, at.namespace);
    let mut pairs = std::collections::BTreeSet::new();
    for addr in addrs {
        let Some(nonce) = hcp_fleet_guards::probe::nonce() else {
            continue;
        };
        let path = format!("{OWN_DENIALS_PATH}?nonce={nonce}");
        match crate::tls::get(addr, &name, &path, timeout, REPORT_LIMIT).await {
            Ok((200, text)) => match key.report(&nonce, &text) {
                Some(r) => {
                    pairs.extend(r.split(", ").filter(|p| !p.is_empty()).map(str::to_string))
                }
                None => info!(%addr, "a replica's report carries no proof; ignored"),
            },
            Ok((status, _)) => tracing::debug!(%addr, status, "a replica made no report"),
            Err(e) => tracing::debug!(%addr, error = %e, "a replica was not asked"),
        }
    }
    Ok((!pairs.is_empty()).then(|| pairs.into_iter().collect::<Vec<_>>().join(", ")))
}

/// Asks the replicas for their report (`own_denials`) and keeps it in `shared` for the
/// verdicts; whether it changed. Where the replicas cannot be found the last report stands;
/// with no webhook installed there is nothing to report.
async fn refresh_report(
    at: &Replicas,
    targets: &ProbeTargets,
    shared: &Mutex<WatchShared>,
    timeout: Duration,
) -> bool {
    let read = match (&targets.webhook, &targets.proof.key) {
        (Some(_), Some(key)) => match own_denials(at, key, timeout).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "the replicas' report not read");
                return false;
            }
        },
        _ => None,
    };
    let mut s = lock(shared);
    if s.own_denials == read {
        return false;
    }
    info!(reported = ?read, "the admission replicas' report of the cluster's own requests denied changed");
    s.own_denials = read;
    true
}

/// The grid the probe rounds start on (`crate::grid`): the interval is whole seconds, so every
/// round of an HCP stays on it.
const PROBE_GRAIN: Duration = Duration::from_secs(1);

/// When an HCP's first periodic probe goes: between half and one and a half intervals,
/// placed by a hash of its namespace. A restarted agent converges a thousand HCPs within
/// seconds; without the spread their probes would all go in the same second of every minute.
pub(crate) fn first_probe(ns: &str, every: Duration) -> Duration {
    let h = ns.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    every.mul_f64(0.5 + (h % 1000) as f64 / 1000.0)
}

/// What one probe round works from: the revisions the last reconcile installed, the canaries
/// and whose turn it is, and the internal registry the last reconcile wrote for the replicas.
struct Turn {
    targets: ProbeTargets,
    canaries: Arc<Vec<canary::Planned>>,
    next: usize,
    written: Option<hcp_fleet_guards::pod_image_spec::InternalRegistry>,
}

impl Turn {
    fn of(s: &WatchShared) -> Self {
        Self {
            targets: s
                .desired
                .as_ref()
                .map(|d| ProbeTargets::of(d, s.proof.clone()))
                .unwrap_or_default(),
            canaries: Arc::clone(&s.canaries),
            next: s.canary_next,
            written: s.internal_registry.clone(),
        }
    }
}

/// Keeps a canary's result and moves the turn on: whether the result changed, and whether it
/// completed the proof the switch-over waits for (when that is on).
fn record_canary(
    shared: &Mutex<WatchShared>,
    next: usize,
    guard: &str,
    shown: canary::Shown,
    plan: &[canary::Planned],
) -> (bool, bool) {
    let mut s = lock(shared);
    s.canary_next = next.wrapping_add(1);
    let before = s.canary_results.insert(guard.to_string(), shown.clone());
    let all_proven = s.label_proven
        && super::switch_over::completes_proof(plan, before.as_ref(), &shown, &s.canary_results);
    (before != Some(shown), all_proven)
}

/// What the probe must prove and which canaries it sends (the hosted webhooks phase's plan,
/// before its install); the last results of guards no longer planned go.
pub(in crate::controller) fn plan(
    ctx: &crate::controller::context::Context,
    ns: &str,
    proof: &Proof,
    canaries: Arc<Vec<canary::Planned>>,
) {
    ctx.with_hcp(ns, |s| {
        let Some(w) = s.watch.as_ref() else {
            return;
        };
        let mut shared = lock(&w.shared);
        shared.proof = proof.clone();
        shared
            .canary_results
            .retain(|g, _| canaries.iter().any(|p| &p.guard == g));
        shared.canaries = canaries;
    });
}

/// Records this reconcile's verdict and makes sure the periodic probe runs. The task queues a
/// full reconcile (which reports) only when the verdict changes, so a steady fleet costs one
/// hosted request per cluster per interval and, every `REPORT_ROUNDS` rounds, a look at the
/// admission replicas (`own_denials`).
pub(crate) fn ensure_task(s: &Scope<'_>, hosted: &HostedClient, verdict: ComplianceState) {
    let (ctx, ns, cluster) = (s.ctx, s.ns, s.cluster);
    let timeout = s.cfg.hosted_access.request_timeout();
    let every = Duration::from_secs(u64::from(s.cfg.probe_interval_seconds));
    let (service, port) = (&s.cfg.admission.service_name, s.cfg.admission.port);
    let label_proven = s.cfg.switch_over.label_proven_namespaces;
    let registry = super::internal_registry::wanted(s);
    ctx.with_hcp(ns, |s| {
        let Some(w) = s.watch.as_mut() else {
            return;
        };
        {
            let mut shared = lock(&w.shared);
            shared.probe = Some(verdict);
            shared.label_proven = label_proven;
        }
        if w.probe.as_ref().is_some_and(AbortOnDrop::is_running) {
            return;
        }
        let hosted = hosted.clone();
        let shared = Arc::clone(&w.shared);
        let tx = ctx.requeue.clone();
        let hcp_ref = ObjectRef::<HostedControlPlane>::new(cluster).within(ns);
        let ns = ns.to_string();
        let replicas = Replicas::of(ctx, service, port, &ns);
        let first = first_probe(&ns, every);
        let span = tracing::info_span!(parent: None, "probe", hcp_namespace = %ns, hosted_cluster = %cluster);
        w.probe = Some(AbortOnDrop(tokio::spawn(
            async move {
                // On the agent's grid of whole seconds: the rounds of every HCP whose turn falls
                // in the same second go with one wake-up (`crate::grid`).
                let start = crate::grid::on_grid(std::time::Instant::now() + first, PROBE_GRAIN);
                let mut tick = tokio::time::interval_at(tokio::time::Instant::from_std(start), every);
                for round in 0_u64.. {
                    tick.tick().await;
                    let Turn {
                        targets,
                        canaries,
                        next,
                        written,
                    } = Turn::of(&lock(&shared));
                    // A kube client for this round only (see `HostedClient`). The round's
                    // futures are boxed: held inline they would size the task for its whole
                    // life, a thousand of them asleep between rounds.
                    let client = hosted.client();
                    // Every few rounds: the replicas' report, and the registry (below).
                    let few = round % REPORT_ROUNDS == 0;
                    let report_changed = few
                        && Box::pin(refresh_report(&replicas, &targets, &shared, timeout)).await;
                    // The path's own verdict gates the canaries and the registry's look (a
                    // cluster that does not answer is not asked more); the replicas' report is
                    // the guards' doing, not the path's.
                    let probed = Box::pin(probe(&client, timeout, &targets, None))
                        .await
                        .verdict
                        .state;
                    let look = registry && few && probed == ComplianceState::Compliant;
                    if look && Box::pin(registry_changed(&client, timeout, &shared)).await {
                        let _ = tx.send(hcp_ref.clone());
                    }
                    let mut canary_changed = false;
                    let mut all_proven = false;
                    // A path that fails its probe fails every canary on it: they wait for it.
                    let turn = canaries.get(next % canaries.len().max(1));
                    if let Some(p) = turn.filter(|_| probed == ComplianceState::Compliant) {
                        let shown = Box::pin(canary::send(
                            &client,
                            p,
                            &canaries,
                            &targets.proof,
                            &ns,
                            timeout,
                            written.as_ref(),
                        ))
                        .await;
                        if let canary::Shown::NotTried(why) | canary::Shown::Absent(why) = &shown {
                            tracing::debug!(guard = %p.guard, %why, "canary not tried");
                        }
                        (canary_changed, all_proven) =
                            record_canary(&shared, next, &p.guard, shown, &canaries);
                    }
                    let (now, last) = {
                        let s = lock(&shared);
                        let now = match s.own_denials {
                            Some(_) => ComplianceState::NonCompliant,
                            None => canary::combined(probed, &s.canary_results),
                        };
                        (now, s.probe)
                    };
                    if last != Some(now) {
                        info!(verdict = now.as_str(), "end-to-end probe changed");
                        let _ = tx.send(hcp_ref.clone());
                    } else if ((canary_changed || report_changed)
                        && now == ComplianceState::NonCompliant)
                        || (all_proven && now == ComplianceState::Compliant)
                    {
                        // Another guard failing, or failing otherwise: the report names it.
                        // Or the last canary has just proven every guard: the reconcile
                        // labels the namespace for the switch-over.
                        let _ = tx.send(hcp_ref.clone());
                    }
                }
            }
            .instrument(span),
        )));
    });
}

/// Phase 7: the end-to-end probe through the hosted kube-apiserver, with what the guards'
/// canaries showed in their last rounds (the probe task sends them); the periodic probe is
/// started if it does not run. A probe that got no answer, from a server that does not answer
/// its version either, is the hosted kube-apiserver's silence (hung, before the keepalive has
/// dropped the connection): reported as the hosted cluster's, naming its server, not as a
/// fault of the admission path.
pub(in crate::controller) async fn prove(
    s: &Scope<'_>,
    hosted: &HostedClient,
    targets: &ProbeTargets,
) -> Result<Observation, Failure> {
    let timeout = s.cfg.hosted_access.request_timeout();
    let reported = s.ctx.with_hcp(s.ns, |h| {
        h.watch
            .as_ref()
            .and_then(|w| lock(&w.shared).own_denials.clone())
    });
    let probed = probe(&hosted.client(), timeout, targets, reported.as_deref()).await;
    let mut verdict = probed.verdict;
    let silent = match probed.unanswered {
        Some(why) if !hosted.answers(SILENCE_CHECK).await => Some(why),
        _ => None,
    };
    let failed = s.ctx.with_hcp(s.ns, |h| {
        h.watch
            .as_ref()
            .map(|w| canary::failures(&lock(&w.shared).canary_results))
            .unwrap_or_default()
    });
    if !failed.is_empty() {
        verdict = Observation::violation(format!("{}; {}", failed.join("; "), verdict.message));
    }
    let ok = verdict.state == ComplianceState::Compliant;
    let m = &s.ctx.metrics;
    m.probe_success
        .get_or_create(&s.labels())
        .set(i64::from(ok));
    ensure_task(s, hosted, verdict.state);
    let Some(why) = silent else {
        if let Some(note) = super::switch_over::mark(s, ok).await {
            verdict.message = format!("{}; {note}", verdict.message);
        }
        return Ok(verdict);
    };
    m.hosted_errors.get_or_create(&s.labels()).inc();
    // As for a dropped connection (`hosted_access::reachable`): nothing is known to be current
    // in a cluster that does not answer.
    m.webhooks_installed.get_or_create(&s.labels()).set(0);
    Err(match why {
        ProbeFailure::Failed(source) => Failure::HostedApi {
            server: hosted.server.clone(),
            secret: hosted.secret.clone(),
            source,
        },
        _ => Failure::HostedTimeout {
            server: hosted.server.clone(),
            seconds: timeout.as_secs(),
        },
    })
}

/// How long a hosted kube-apiserver whose probe went unanswered has to answer its version.
const SILENCE_CHECK: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_answer_may_be_the_servers_silence() {
        let refused = kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        let closed = kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "keep-alive timed out",
        )));
        let cases = [
            (ProbeFailure::NoAnswer(10), true),
            (ProbeFailure::Failed(closed), true),
            (ProbeFailure::Failed(refused), false),
            (ProbeFailure::ServiceNotReached, false),
            (ProbeFailure::PoliciesNotRun, false),
            (ProbeFailure::ImitatedService, false),
            (ProbeFailure::ImitatedPolicy("x".into()), false),
            (ProbeFailure::NoNonce, false),
        ];
        for (failure, unanswered) in cases {
            assert_eq!(failure.unanswered(), unanswered, "{failure}");
        }
    }

    #[test]
    fn a_report_of_the_clusters_own_requests_denied_fails_the_probe() {
        let ok = verdict(&["the admission service"], &[], false, None);
        assert_eq!(ok.state, ComplianceState::Compliant);
        let report = "identity-namespaces.hcp-fleet.openshift.io denied node";
        let broken = verdict(&["the admission service"], &[], false, Some(report));
        assert_eq!(broken.state, ComplianceState::NonCompliant);
        assert!(
            broken.message.contains(BREAKS_THE_CLUSTER),
            "{}",
            broken.message
        );
        assert!(broken.message.contains(report), "{}", broken.message);
        // With another path failing as well, both are said.
        let both = verdict(
            &[],
            &["the policy probe failed".into()],
            false,
            Some(report),
        );
        assert!(
            both.message.starts_with("the policy probe failed; "),
            "{}",
            both.message
        );
        assert!(both.message.contains(report));
    }

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
