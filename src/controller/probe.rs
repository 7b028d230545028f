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

use super::canary;
use super::context::{AbortOnDrop, Context, lock};
use crate::catalogue::{
    POLICY_PROBE_ANSWER, POLICY_PROBE_VALUE, PROBE_ANSWER, PROBE_LABEL, PROBE_REVISION_LABEL,
};
use crate::crd::{ComplianceState, HostedControlPlane};
use crate::guards::probe::{FOREIGN_ANSWER, FOREIGN_POLICY_ANSWER, NO_ANSWER};
use crate::guards::probe::{NONCE_ANNOTATION, PROOF_MARK, ProbeKey};
use crate::hosted::clients::HostedClient;
use crate::hosted::policies::Engine;
use crate::hosted::wanted::Wanted;
use crate::reporting::Observation;

/// What the probe asks for: the revision of each path installed (`None`: that path is not),
/// and what the admission service's answers must prove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeTargets {
    pub webhook: Option<String>,
    pub policy: Option<String>,
    pub proof: Proof,
}

impl ProbeTargets {
    pub fn of(wanted: &Wanted, proof: Proof) -> Self {
        Self {
            webhook: wanted.webhook_revision.clone(),
            policy: wanted.policy_revision.clone(),
            proof,
        }
    }
}

/// What makes a webhook answer to the probe the admission service's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proof {
    /// The HCP's probe key (from its TLS Secret); `None` only in tests, where the words are
    /// all there is to check.
    pub key: Option<ProbeKey>,
    /// The admission Deployment is rolling out: replicas of an agent version from before the
    /// probe key answer without a proof, and an answer in the right words is taken as theirs
    /// until every replica runs the current spec (a tenant's imitation passes only meanwhile).
    pub rolling_out: bool,
}

/// How a denial of the probe reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The agent's own answer, proven.
    Proven,
    /// The right words without the proof, while the Deployment rolls out (see `Proof`).
    Unproven,
    /// Not the agent's answer.
    Imitation,
}

/// Whether a denial of the probe of `engine` is the agent's own answer, and not an imitation
/// by something the hosted cluster's admins installed (see `judge`).
pub fn authentic(engine: Engine, message: &str, proof: &Proof, nonce: &str) -> Answer {
    let words = match engine {
        Engine::Webhook => PROBE_ANSWER,
        Engine::Policy => POLICY_PROBE_ANSWER,
    };
    judge(
        engine,
        crate::guards::probe::ROW.name,
        words,
        message,
        proof,
        nonce,
    )
}

/// Whether a denial came from the agent's guard `name` on `engine`, beginning with `words`. A
/// policy's denial names the policy and its binding (a tenant cannot hold either name while
/// the agent's objects hold it, and a webhook's denial cannot begin so); a webhook's denial
/// names a webhook, which anyone can name alike, so it must end with the proof of this
/// request's nonce under the HCP's probe key.
pub fn judge(
    engine: Engine,
    name: &str,
    words: &str,
    message: &str,
    proof: &Proof,
    nonce: &str,
) -> Answer {
    let said = match engine {
        Engine::Webhook => format!("admission webhook \"{name}\" denied the request: {words}"),
        Engine::Policy => {
            format!(
                "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {words}"
            )
        }
    };
    if !message.starts_with(&said) {
        return Answer::Imitation;
    }
    match (engine, &proof.key) {
        (Engine::Policy, _) | (Engine::Webhook, None) => Answer::Proven,
        (Engine::Webhook, Some(k)) if k.proven(nonce, message) => Answer::Proven,
        (Engine::Webhook, Some(_)) if proof.rolling_out && !message.contains(PROOF_MARK) => {
            Answer::Unproven
        }
        (Engine::Webhook, Some(_)) => Answer::Imitation,
    }
}

/// Why a probe path did not answer as the agent's guards answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeFailure {
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
    #[error("probe failed: {}", crate::human::KubeError(.0))]
    Failed(#[source] kube::Error),
    #[error("probe {NO_ANSWER} {0}s")]
    NoAnswer(u64),
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
    proof: &Proof,
) -> Result<Answer, ProbeFailure> {
    let value = match engine {
        Engine::Webhook => "true",
        Engine::Policy => POLICY_PROBE_VALUE,
    };
    let nonce = crate::guards::probe::nonce().ok_or(ProbeFailure::NoNonce)?;
    let api: Api<ConfigMap> = Api::namespaced(hosted.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("hcp-fleet-probe-".into());
    cm.metadata.labels = Some(BTreeMap::from([
        (PROBE_LABEL.to_string(), value.to_string()),
        (PROBE_REVISION_LABEL.to_string(), revision.to_string()),
    ]));
    cm.metadata.annotations = Some(BTreeMap::from([(
        NONCE_ANNOTATION.to_string(),
        nonce.clone(),
    )]));
    let pp = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    match tokio::time::timeout(timeout, api.create(&pp, &cm)).await {
        Ok(Err(kube::Error::Api(s))) => match authentic(engine, &s.message, proof, &nonce) {
            Answer::Imitation => Err(match engine {
                Engine::Webhook => ProbeFailure::ImitatedService,
                Engine::Policy => {
                    ProbeFailure::ImitatedPolicy(crate::reporting::untrusted(&s.message, 300))
                }
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
        }),
        Ok(Err(e)) => Err(ProbeFailure::Failed(e)),
        Err(_) => Err(ProbeFailure::NoAnswer(timeout.as_secs())),
    }
}

/// The end-to-end probe of every path installed, through the hosted kube-apiserver.
pub async fn probe(hosted: &Client, timeout: Duration, targets: &ProbeTargets) -> Observation {
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    let mut unproven = false;
    for (engine, rev, who) in [
        (Engine::Webhook, &targets.webhook, "the admission service"),
        (Engine::Policy, &targets.policy, "the admission policies"),
    ] {
        let Some(rev) = rev else { continue };
        match probe_path(hosted, timeout, engine, rev, &targets.proof).await {
            Ok(a) => {
                unproven |= a == Answer::Unproven;
                answered.push(who);
            }
            Err(e) => failed.push(e.to_string()),
        }
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
    hosted: &HostedClient,
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
        let ns = ns.to_string();
        let first = first_probe(&ns, every);
        let span = tracing::info_span!(parent: None, "probe", hcp_namespace = %ns, hosted_cluster = %cluster);
        w.probe = Some(AbortOnDrop(tokio::spawn(
            async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
                loop {
                    tick.tick().await;
                    // The revisions the last reconcile installed, and the canary whose turn it is.
                    let (targets, canaries, next) = {
                        let s = lock(&shared);
                        let targets = s
                            .desired
                            .as_ref()
                            .map(|d| ProbeTargets::of(d, s.proof.clone()))
                            .unwrap_or_default();
                        (targets, Arc::clone(&s.canaries), s.canary_next)
                    };
                    // A kube client for this round only (see `HostedClient`).
                    let client = hosted.client();
                    let probed = probe(&client, timeout, &targets).await.state;
                    let mut canary_changed = false;
                    // A path that fails its probe fails every canary on it: they wait for it.
                    let turn = canaries.get(next % canaries.len().max(1));
                    if let Some(p) = turn.filter(|_| probed == ComplianceState::Compliant) {
                        let shown =
                            canary::send(&client, p, &canaries, &targets.proof, &ns, timeout).await;
                        if let canary::Shown::NotTried(why) = &shown {
                            tracing::debug!(guard = %p.guard, %why, "canary not tried");
                        }
                        let mut s = lock(&shared);
                        s.canary_next = next.wrapping_add(1);
                        let before = s.canary_results.insert(p.guard.clone(), shown.clone());
                        canary_changed = before != Some(shown);
                    }
                    let (now, last) = {
                        let s = lock(&shared);
                        (canary::combined(probed, &s.canary_results), s.probe)
                    };
                    if last != Some(now) {
                        info!(verdict = now.as_str(), "end-to-end probe changed");
                        let _ = tx.send(hcp_ref.clone());
                    } else if canary_changed && now == ComplianceState::NonCompliant {
                        // Another guard failing, or failing otherwise: the report names it.
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
    use crate::guards::probe::{answer, nonce};

    #[test]
    fn only_the_agents_own_answer_proves_the_path() {
        let key = ProbeKey::generate().expect("random");
        let n = nonce().expect("random");
        let name = crate::guards::probe::ROW.name;
        let hook =
            |text: String| format!("admission webhook \"{name}\" denied the request: {text}");
        let proof = |rolling_out| Proof {
            key: Some(key.clone()),
            rolling_out,
        };
        let proven = hook(answer(Some(&key), Some(&n)));
        let words = hook(answer(None, None));
        let other = ProbeKey::generate().expect("random");
        let forged = hook(answer(Some(&other), Some(&n)));
        let w = Engine::Webhook;
        assert_eq!(authentic(w, &proven, &proof(false), &n), Answer::Proven);
        assert_eq!(authentic(w, &words, &proof(false), &n), Answer::Imitation);
        assert_eq!(authentic(w, &forged, &proof(false), &n), Answer::Imitation);
        // While the Deployment rolls out, the words alone are taken (an old replica), but
        // never a wrong proof.
        assert_eq!(authentic(w, &words, &proof(true), &n), Answer::Unproven);
        assert_eq!(authentic(w, &forged, &proof(true), &n), Answer::Imitation);
        // Another webhook's name, or the words inside another message.
        let renamed = proven.replace(name, "probe.tenant.example.com");
        assert_eq!(authentic(w, &renamed, &proof(false), &n), Answer::Imitation);
        let inside = format!("admission webhook \"x\" denied the request: {proven}");
        assert_eq!(authentic(w, &inside, &proof(true), &n), Answer::Imitation);
        // A policy's denial names the agent's policy and binding; a webhook cannot say so.
        let p = Engine::Policy;
        let by_policy = format!(
            "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {POLICY_PROBE_ANSWER}"
        );
        assert_eq!(authentic(p, &by_policy, &proof(false), &n), Answer::Proven);
        let by_hook = hook(POLICY_PROBE_ANSWER.into());
        assert_eq!(authentic(p, &by_hook, &proof(false), &n), Answer::Imitation);
        let other_policy = by_policy.replacen(name, "tenant-probe", 2);
        assert_eq!(
            authentic(p, &other_policy, &proof(false), &n),
            Answer::Imitation
        );
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
