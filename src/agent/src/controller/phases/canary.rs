//! Phase 7, per guard: the canaries (`guards::canary`). The probe task sends one per round, in
//! turn, so each enforced guard is tried once every `probeIntervalSeconds` times the number of
//! guards, and a steady hosted cluster sees one request more per round. A guard that lets its
//! canary through, or whose canary is denied by something else, makes the `e2e-probe` concern
//! NonCompliant, naming the guard, until a later round sees it deny again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::proof::{Answer, Asked, Proof, judge};
use hcp_fleet_guards::Settings;
use hcp_fleet_guards::canary::{CANARY_USER, Canary, PROOF_ANNOTATION};
use hcp_fleet_guards::pod_image_spec::{self, InternalRegistry};
use hcp_fleet_model::Mode;
use hcp_fleet_model::crd::ComplianceState;
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::hosted::admission_policies::Engine;
use hcp_fleet_render::hosted::canary::{RBAC_NAME, rbac, refused_by_rbac, request};
use hcp_fleet_render::hosted::webhooks::HostedWebhooks;
use hcp_fleet_render::management::FIELD_MANAGER;
use serde_json::Value;

/// One enforced guard's canary, and the engine that carries the guard in this cluster.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    pub(crate) guard: String,
    pub(crate) engine: Engine,
    pub(crate) canary: Canary,
    /// The pod image spec mutation's: its canary is made at each turn from the registry the
    /// agent last wrote for the admission replicas (`canary_now`).
    pub(crate) by_registry: bool,
}

/// What one canary showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shown {
    /// The guard denied it, or a mutation changed it as it should (proven).
    Denied,
    /// Not tried this round, and why (the cluster lacks the kind or the object; no answer).
    /// Neither evidence for the guard nor against it.
    NotTried(String),
    /// The cluster has nothing for it to act on (its kind not served, its object absent):
    /// the guard has nothing to keep there, and neither has MCVW's (`switch_over`).
    Absent(String),
    /// The guard did not deny it: what happened instead.
    Failed(String),
}

/// `plan`, shared: every HCP whose plan is equal holds one copy (a fleet has as many
/// distinct plans as configurations and engines in force, a thousand HCPs one or two).
pub(crate) fn shared_plan(cfg: &AgentConfig, desired: &HostedWebhooks) -> Arc<Vec<Planned>> {
    static PLANS: Mutex<Vec<Weak<Vec<Planned>>>> = Mutex::new(Vec::new());
    let planned = plan(cfg, desired);
    let mut plans = PLANS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(held) = plans
        .iter()
        .filter_map(Weak::upgrade)
        .find(|p| **p == planned)
    {
        return held;
    }
    // Plans no HCP holds any more go as new ones come.
    plans.retain(|w| w.strong_count() > 0);
    let planned = Arc::new(planned);
    plans.push(Arc::downgrade(&planned));
    planned
}

/// The canaries of the guards enforced in `desired` under `cfg` (the HCP's configuration, its
/// override applied), in the order of the configuration.
pub(crate) fn plan(cfg: &AgentConfig, desired: &HostedWebhooks) -> Vec<Planned> {
    let settings = Settings::from(cfg);
    cfg.active_webhooks()
        .filter(|w| w.mode == Mode::Enforce)
        .filter_map(|w| {
            let canary = hcp_fleet_guards::for_path(&w.path)?.canary(&settings)?;
            Some(Planned {
                guard: w.name.clone(),
                engine: desired.carrier(&w.name)?,
                canary,
                by_registry: w.path == pod_image_spec::ROW.path,
            })
        })
        .collect()
}

fn what(c: &Canary) -> String {
    // A mutation's canary is named by the server: only the prefix is known.
    let object = match c.namespace {
        Some(ns) => format!("{}… in {ns}", c.name),
        None => format!("{:?}", c.name),
    };
    format!(
        "a dry-run {} of {} {object} by {CANARY_USER}",
        c.verb.as_str(),
        c.resource
    )
}

/// `p`'s canary for this turn: the pod image spec mutation's names what the registry the
/// agent last wrote for the replicas resolves (`registry`), the others are as planned.
pub(crate) fn canary_now(p: &Planned, registry: Option<&InternalRegistry>) -> Canary {
    if !p.by_registry {
        return p.canary.clone();
    }
    let settings = Settings {
        internal_registry: registry.cloned(),
        ..Settings::default()
    };
    hcp_fleet_guards::for_path(pod_image_spec::ROW.path)
        .and_then(|g| g.canary(&settings))
        .unwrap_or_else(|| p.canary.clone())
}

/// How a mutation's canary came back from its dry run (`body`, the object as it would have
/// been stored): proven when it carries the admission service's proof of `nonce` and the
/// change the guard makes (`Effect`).
fn judged_mutation(p: &Planned, body: &str, seen: &Seen<'_>) -> Shown {
    let (guard, what, proof) = (&p.guard, seen.what, seen.proof);
    let Ok(object) = serde_json::from_str::<Value>(body) else {
        return Shown::NotTried(format!("{what}: the answer was not an object"));
    };
    // A mutating policy runs inside the API server, which names no one for a change: the change
    // itself is what shows it in force, as a validating policy's denial in the server's words
    // does (the drift watch keeps the policy and its binding as rendered).
    if p.engine == Engine::Policy {
        return match &seen.canary.effect {
            Some(e) if !e.shown_by(&object) => Shown::Failed(format!(
                "guard {guard} (a mutating admission policy) did not act on its canary ({what}): it came back without its change ({} is not {:?}): the policy or its binding is not in force, or a later mutation undid it",
                e.pointer, e.value
            )),
            _ => Shown::Denied,
        };
    }
    let carried = object["metadata"]["annotations"][PROOF_ANNOTATION].as_str();
    let proven = match (&proof.key, carried) {
        (Some(k), Some(v)) => k.proves(seen.nonce, v),
        // Only in tests: no key, so the annotation is all there is to check.
        (None, Some(_)) => true,
        (_, None) => false,
    };
    if !proven && proof.rolling_out && carried.is_none() {
        return Shown::NotTried(format!(
            "{what}: came back without the proof while the admission Deployment rolls out (replicas from before mutation canaries add none)"
        ));
    }
    if !proven {
        return Shown::Failed(format!(
            "guard {guard} did not act on its canary ({what}): it came back without the admission service's {}",
            if carried.is_some() {
                "proof (a wrong one in its place)"
            } else {
                "proof: the hosted kube-apiserver did not call the service for it (its failurePolicy Ignore let it through), or the webhook is not in force"
            }
        ));
    }
    match &seen.canary.effect {
        Some(e) if !e.shown_by(&object) && p.by_registry => Shown::NotTried(format!(
            "{what}: the guard ran but did not name the image the registry's tag names: the admission replicas have not read the registry the agent last wrote yet"
        )),
        Some(e) if !e.shown_by(&object) => Shown::Failed(format!(
            "guard {guard} ran on its canary ({what}) but it came back without its change ({} is not {:?}): undone by a later mutation, or the guard is wrong",
            e.pointer, e.value
        )),
        _ => Shown::Denied,
    }
}

/// Writes the canaries' RBAC (forced: the agent's whole), for all of `plan` at once.
async fn ensure_rbac(hosted: &Client, plan: &[Planned], ns: &str) -> Result<(), kube::Error> {
    let canaries: Vec<&Canary> = plan.iter().map(|p| &p.canary).collect();
    let (role, binding) = rbac(&canaries, ns);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<ClusterRole>::all(hosted.clone())
        .patch(RBAC_NAME, &pp, &Patch::Apply(&role))
        .await?;
    Api::<ClusterRoleBinding>::all(hosted.clone())
        .patch(RBAC_NAME, &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// Sends `p`'s canary through the hosted kube-apiserver and judges the answer. RBAC missing
/// (a first run; a tenant deleted or narrowed it) is written for the whole `plan` and the
/// canary sent once more.
pub(crate) async fn send(
    hosted: &Client,
    p: &Planned,
    plan: &[Planned],
    proof: &Proof,
    ns: &str,
    timeout: Duration,
    registry: Option<&InternalRegistry>,
) -> Shown {
    let Some(nonce) = hcp_fleet_guards::probe::nonce() else {
        return Shown::NotTried("the system's random source failed".into());
    };
    let canary = canary_now(p, registry);
    let what = what(&canary);
    for attempt in 0..2 {
        let req = match request(&canary, &nonce) {
            Ok(r) => r,
            Err(e) => return Shown::NotTried(format!("{what} could not be made: {e}")),
        };
        let answer = match tokio::time::timeout(timeout, hosted.request_text(req)).await {
            Err(_) => {
                return Shown::NotTried(format!("{what}: no answer within {}s", timeout.as_secs()));
            }
            Ok(a) => a,
        };
        let seen = Seen {
            canary: &canary,
            proof,
            nonce: &nonce,
            what: &what,
        };
        let status = match answer {
            Ok(body) if canary.mutates() => return judged_mutation(p, &body, &seen),
            Ok(_) => {
                return Shown::Failed(format!(
                    "guard {} did not deny its canary ({what}): it was let through",
                    p.guard
                ));
            }
            Err(kube::Error::Api(s)) => s,
            Err(e) => {
                return Shown::NotTried(format!(
                    "{what} could not be sent: {}",
                    crate::human::KubeError(&e)
                ));
            }
        };
        if refused_by_rbac(&status) {
            if attempt > 0 {
                // Just written: the authorizer's cache may lag a moment; next round.
                return Shown::NotTried(format!(
                    "{what}: refused by RBAC just after it was written"
                ));
            }
            if let Err(e) = ensure_rbac(hosted, plan, ns).await {
                return Shown::NotTried(format!(
                    "{what}: its RBAC could not be written: {}",
                    crate::human::KubeError(&e)
                ));
            }
            continue;
        }
        return refused(p, &status, &seen);
    }
    Shown::NotTried(format!("{what}: refused by RBAC"))
}

/// One canary as sent this turn, and what its answer is judged with.
struct Seen<'a> {
    canary: &'a Canary,
    proof: &'a Proof,
    nonce: &'a str,
    what: &'a str,
}

/// What a canary's refusal (other than RBAC's) shows: the object absent, the guard's own
/// denial, MCVW's, or something else's.
fn refused(p: &Planned, status: &kube::core::Status, seen: &Seen<'_>) -> Shown {
    let (canary, what) = (seen.canary, seen.what);
    if status.code == 404 {
        return Shown::Absent(format!("{what}: not found in this cluster"));
    }
    if canary.mutates() {
        if let Some(incumbent) = mcvw_answered(&status.message) {
            return Shown::NotTried(format!("{what}: refused by {incumbent}, MCVW's"));
        }
        // The text is left out: it is the tenant's to choose.
        return Shown::Failed(format!(
            "guard {} could not show its change: its canary ({what}) was refused (HTTP {} {})",
            p.guard, status.code, status.reason
        ));
    }
    let asked = Asked {
        group: canary.group,
        resource: canary.resource,
        name: &canary.name,
    };
    let name = match p.engine {
        Engine::Static => format!(
            "{}{}",
            p.guard,
            hcp_fleet_render::hosted::static_guards::SUFFIX
        ),
        _ => p.guard.clone(),
    };
    let answer = judge(p.engine, &name, "", status, &asked, seen.proof, seen.nonce);
    if answer == Answer::Imitation
        && let Some(incumbent) = mcvw_answered(&status.message)
    {
        return Shown::NotTried(format!(
            "{what}: answered first by {incumbent}, MCVW's, which runs beside the guard until a switch-over ends"
        ));
    }
    if answer == Answer::Imitation {
        tracing::debug!(guard = %p.guard, code = status.code, message = %status.message, "canary refused by something other than its guard");
    }
    match answer {
        Answer::Proven | Answer::Unproven => Shown::Denied,
        // The text is left out: it is the tenant's to choose.
        Answer::Imitation => Shown::Failed(format!(
            "guard {} did not deny its canary ({what}): something else refused it (HTTP {}), without the guard's {}",
            p.guard,
            status.code,
            match p.engine {
                Engine::Webhook => "name and proof",
                Engine::Policy | Engine::Static => "policy and binding names",
            }
        )),
    }
}

/// The verdict of the probe and the canaries' last results together.
pub(crate) fn combined(
    probe: ComplianceState,
    results: &BTreeMap<String, Shown>,
) -> ComplianceState {
    if results.values().any(|s| matches!(s, Shown::Failed(_))) {
        ComplianceState::NonCompliant
    } else {
        probe
    }
}

/// The MCVW webhook whose denial `message` is, if it is one (`<webhook>.managed.openshift.io`,
/// as MCVW's build names them). While MCVW's package and the agent's guards run side by side
/// (docs/operations.md, "Switching over from MCVW") MCVW denies many canaries too, and on the
/// webhook engine the API server reports whichever webhook answers first: that is neither
/// evidence for the guard nor against it, and no alarm. A tenant's webhook named so gains
/// nothing by it: it can keep a canary from proving its guard, as any webhook denying it can,
/// and lets nothing through.
fn mcvw_answered(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("admission webhook \"")?;
    let name = &rest[..rest.find('"')?];
    name.ends_with(".managed.openshift.io").then_some(name)
}

/// How far `plan`'s guards are proven by their canaries' last `results`, with the probe's
/// verdict (`render::switch_over`).
pub(crate) fn evidence(
    probe_proven: bool,
    plan: &[Planned],
    results: &BTreeMap<String, Shown>,
) -> hcp_fleet_render::switch_over::Evidence {
    hcp_fleet_render::switch_over::Evidence {
        probe_proven,
        canaries: plan.len(),
        denied: plan
            .iter()
            .filter(|p| results.get(&p.guard) == Some(&Shown::Denied))
            .count(),
        absent: plan
            .iter()
            .filter(|p| matches!(results.get(&p.guard), Some(Shown::Absent(_))))
            .count(),
    }
}

/// The failures among the canaries' last results, to name in the report.
pub(crate) fn failures(results: &BTreeMap<String, Shown>) -> Vec<String> {
    results
        .values()
        .filter_map(|s| match s {
            Shown::Failed(why) => Some(why.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_render::hosted::objects::HostedFeatures;
    use hcp_fleet_render::hosted::webhooks::render;

    #[test]
    fn mcvw_answering_first_is_told_apart() {
        let m = "admission webhook \"clusterroles-validation.managed.openshift.io\" denied the request: Deleting ClusterRole cluster-admin is not allowed";
        assert_eq!(
            mcvw_answered(m),
            Some("clusterroles-validation.managed.openshift.io")
        );
        for other in [
            "admission webhook \"tenant.example.com\" denied the request: no",
            "clusterroles.rbac.authorization.k8s.io \"x\" is forbidden: managed.openshift.io",
            "admission webhook \"unterminated.managed.openshift.io",
        ] {
            assert_eq!(mcvw_answered(other), None, "{other}");
        }
    }

    #[test]
    fn only_denials_and_absences_count_as_evidence() {
        let plan: Vec<Planned> = ["a", "b", "c"]
            .iter()
            .map(|g| Planned {
                guard: (*g).to_string(),
                engine: Engine::Policy,
                canary: hcp_fleet_guards::for_path("/validate/protected-rbac")
                    .and_then(|g| g.canary(&Settings::from(&AgentConfig::default())))
                    .expect("a canary"),
                by_registry: false,
            })
            .collect();
        let mut r = BTreeMap::new();
        r.insert("a".to_string(), Shown::Denied);
        r.insert("b".to_string(), Shown::Absent("no SCCs here".into()));
        r.insert(
            "c".to_string(),
            Shown::NotTried("answered first by MCVW".into()),
        );
        assert!(!evidence(true, &plan, &r).proven());
        r.insert("c".to_string(), Shown::Denied);
        let e = evidence(true, &plan, &r);
        assert_eq!((e.denied, e.absent), (2, 1));
        assert!(e.proven());
        assert!(!evidence(false, &plan, &r).proven());
    }

    fn rendered(cfg: &AgentConfig, policies: bool) -> HostedWebhooks {
        let features = HostedFeatures {
            admission_policies: policies,
            mutating_policies: policies,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
            match_conditions: policies,
        };
        render(
            cfg,
            "clusters-a",
            "https://svc.clusters-a.svc:443",
            "CA",
            features,
            None,
        )
        .expect("render")
    }

    /// Equal plans are one copy; a different one is its own, and equal to its own plan.
    #[test]
    fn equal_plans_are_shared() {
        let cfg = AgentConfig::default();
        let (hooks, policies) = (rendered(&cfg, false), rendered(&cfg, true));
        let a = shared_plan(&cfg, &hooks);
        let b = shared_plan(&cfg, &hooks);
        assert!(Arc::ptr_eq(&a, &b));
        let c = shared_plan(&cfg, &policies);
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(*a, plan(&cfg, &hooks));
        assert_eq!(*c, plan(&cfg, &policies));
        // Once nobody holds it, an equal plan is made afresh and equal still.
        drop((a, b));
        assert_eq!(*shared_plan(&cfg, &hooks), plan(&cfg, &hooks));
    }

    #[test]
    fn every_enforced_guard_with_a_canary_is_planned_on_its_engine() {
        let cfg = AgentConfig::default();
        let removed = hcp_fleet_guards::pod_image_spec::case_registry();
        for (policies, registry) in [(false, None), (true, None), (true, Some(&removed))] {
            let desired = render(
                &cfg,
                "clusters-a",
                "https://svc.clusters-a.svc:443",
                "CA",
                HostedFeatures {
                    admission_policies: policies,
                    mutating_policies: policies,
                    static_guards: false,
                    static_mutating: false,
                    static_offered: false,
                    match_conditions: policies,
                },
                registry,
            )
            .expect("render");
            let p = plan(&cfg, &desired);
            let names: Vec<&str> = p.iter().map(|p| p.guard.as_str()).collect();
            // The pod image spec mutation as a policy where the registry has nothing to
            // rewrite: no policy, nothing to prove.
            let want_len = if policies && registry.is_none() { 8 } else { 9 };
            assert_eq!(names.len(), want_len, "{names:?}");
            let want = if policies {
                Engine::Policy
            } else {
                Engine::Webhook
            };
            // A mutation with a CEL form is a policy where served.
            for p in &p {
                let mutation = p.canary.mutates();
                assert_eq!(
                    mutation,
                    p.guard.starts_with("service-tags") || p.guard.starts_with("pod-image-spec"),
                    "{p:?}"
                );
                assert_eq!(p.engine, want, "{p:?}");
                assert_eq!(
                    p.by_registry,
                    p.guard.starts_with("pod-image-spec"),
                    "{p:?}"
                );
            }
        }
        // A guard in warn mode, or off, has no canary: it denies nothing.
        let mut cfg = AgentConfig::default();
        for w in &mut cfg.webhooks {
            if w.name == "protected-rbac.hcp-fleet.openshift.io" {
                w.mode = Mode::Warn;
            }
            if w.name == "scc.hcp-fleet.openshift.io" {
                w.mode = Mode::Off;
            }
        }
        let p = plan(&cfg, &rendered(&cfg, false));
        assert!(
            p.iter()
                .all(|p| !p.guard.starts_with("protected-rbac") && !p.guard.starts_with("scc"))
        );
        assert_eq!(p.len(), 7);
    }

    fn mutation_planned(path: &str) -> Planned {
        let canary = hcp_fleet_guards::for_path(path)
            .and_then(|g| g.canary(&Settings::default()))
            .expect("a canary");
        Planned {
            guard: hcp_fleet_guards::for_path(path)
                .map(|g| g.row().name.to_string())
                .unwrap_or_default(),
            engine: Engine::Webhook,
            canary,
            by_registry: path == pod_image_spec::ROW.path,
        }
    }

    /// What the dry run of `c` would return with `annotations` added and the Service's tags
    /// (or the pod's first image) set to `changed`.
    fn returned(c: &Canary, proof: Option<&str>, changed: Option<&str>) -> String {
        let mut o = c.object.clone().expect("an object");
        o["metadata"]["name"] = serde_json::json!("hcp-fleet-canary-x7k2p");
        if let Some(p) = proof {
            o["metadata"]["annotations"][PROOF_ANNOTATION] = serde_json::json!(p);
        }
        if let (Some(v), Some(e)) = (changed, c.effect.as_ref()) {
            if let Some(slot) = o.pointer_mut(&e.pointer) {
                *slot = serde_json::json!(v);
            } else {
                o["metadata"]["annotations"][hcp_fleet_guards::service_tags::TAGS_ANNOTATION] =
                    serde_json::json!(v);
            }
        }
        o.to_string()
    }

    const NONCE: &str = "00aa11bb";

    /// A key, the proof it gives `NONCE` and the proof of another nonce.
    fn proofs() -> (Proof, String, String) {
        let key = hcp_fleet_guards::probe::ProbeKey::generate().expect("key");
        let of = |nonce: &str| {
            hcp_fleet_guards::canary::proof_patch(
                &serde_json::json!({"metadata": {"annotations": {}}}),
                &key,
                nonce,
            )
            .and_then(|op| op["value"].as_str().map(str::to_string))
            .expect("a proof")
        };
        let (good, other) = (of(NONCE), of("00aa11bc"));
        assert!(key.proves(NONCE, &good));
        let proof = Proof {
            key: Some(key),
            rolling_out: false,
        };
        (proof, good, other)
    }

    /// How a result reads, for the tables below.
    fn read(s: &Shown) -> &'static str {
        match s {
            Shown::Denied => "proven",
            Shown::NotTried(_) => "not tried",
            Shown::Absent(_) => "absent",
            Shown::Failed(_) => "failed",
        }
    }

    /// `p`'s canary `c` judged as coming back as `body`.
    fn judged(p: &Planned, c: &Canary, proof: &Proof, body: &str) -> &'static str {
        let seen = Seen {
            canary: c,
            proof,
            nonce: NONCE,
            what: "w",
        };
        read(&judged_mutation(p, body, &seen))
    }

    /// A mutation's canary is proven by the service's proof of its nonce and the change
    /// together; anything less is a failure, but for replicas from before the proof while
    /// they roll out.
    #[test]
    fn a_mutation_canary_needs_the_proof_and_the_change() {
        let (proof, good, other) = proofs();
        let rolling = Proof {
            rolling_out: true,
            ..proof.clone()
        };
        let tags = mutation_planned(hcp_fleet_guards::service_tags::ROW.path);
        let c = &tags.canary;
        let tag = Some(hcp_fleet_guards::service_tags::TAG);
        for (why, body, proof, want) in [
            (
                "tagged, proven",
                returned(c, Some(&good), tag),
                &proof,
                "proven",
            ),
            // The service was not called (a tenant's webhook may have tagged it).
            ("tagged, no proof", returned(c, None, tag), &proof, "failed"),
            (
                "another nonce's proof",
                returned(c, Some(&other), tag),
                &proof,
                "failed",
            ),
            // Replicas of an agent from before the proof, while they roll out.
            (
                "no proof, rolling out",
                returned(c, None, tag),
                &rolling,
                "not tried",
            ),
            (
                "a wrong proof, rolling out",
                returned(c, Some(&other), tag),
                &rolling,
                "failed",
            ),
            // The guard ran, and its tag was undone (or never made).
            (
                "proven, tag replaced",
                returned(c, Some(&good), Some("team=a")),
                &proof,
                "failed",
            ),
            (
                "proven, untagged",
                returned(c, Some(&good), None),
                &proof,
                "failed",
            ),
            ("not an object", "not json".to_string(), &proof, "not tried"),
        ] {
            assert_eq!(judged(&tags, c, proof, &body), want, "{why}");
        }
    }

    /// On a mutating policy the change is what shows the guard in force (the API server runs
    /// it, and no service is called to add a proof): changed, shown; unchanged, a failure.
    #[test]
    fn a_mutating_policys_canary_needs_the_change_alone() {
        let (proof, good, _) = proofs();
        let tags = Planned {
            engine: Engine::Policy,
            ..mutation_planned(hcp_fleet_guards::service_tags::ROW.path)
        };
        let c = &tags.canary;
        let tag = Some(hcp_fleet_guards::service_tags::TAG);
        for (why, body, want) in [
            ("tagged", returned(c, None, tag), "proven"),
            (
                "tagged, a proof too",
                returned(c, Some(&good), tag),
                "proven",
            ),
            ("untagged", returned(c, None, None), "failed"),
            ("tag replaced", returned(c, None, Some("team=a")), "failed"),
            ("not an object", "not json".to_string(), "not tried"),
        ] {
            assert_eq!(judged(&tags, c, &proof, &body), want, "{why}");
        }
    }

    /// The pod image spec mutation's canary: where the registry serves, the proof alone;
    /// where it does not, the image the tag names, and a table the replicas have not read yet
    /// is no failure.
    #[test]
    fn the_pod_image_canary_follows_the_registry_written() {
        let (proof, good, _) = proofs();
        let pods = mutation_planned(pod_image_spec::ROW.path);
        let served = canary_now(&pods, None);
        assert_eq!(served.effect, None);
        let reg = pod_image_spec::case_registry();
        let removed = canary_now(&pods, Some(&reg));
        let to = removed
            .effect
            .as_ref()
            .map(|e| e.value.clone())
            .expect("an effect");
        assert!(reg.tags.values().any(|v| *v == to));
        for (why, c, body, want) in [
            (
                "served, proven",
                &served,
                returned(&served, Some(&good), None),
                "proven",
            ),
            (
                "served, no proof",
                &served,
                returned(&served, None, None),
                "failed",
            ),
            (
                "removed, rewritten",
                &removed,
                returned(&removed, Some(&good), Some(&to)),
                "proven",
            ),
            // The replicas have not read the table yet.
            (
                "removed, not rewritten",
                &removed,
                returned(&removed, Some(&good), None),
                "not tried",
            ),
            (
                "removed, rewritten without proof",
                &removed,
                returned(&removed, None, Some(&to)),
                "failed",
            ),
        ] {
            assert_eq!(judged(&pods, c, &proof, &body), want, "{why}");
        }
    }

    #[test]
    fn one_failed_canary_makes_the_verdict_noncompliant() {
        use ComplianceState::*;
        let mut r = BTreeMap::new();
        r.insert("a".to_string(), Shown::Denied);
        r.insert("b".to_string(), Shown::NotTried("no SCCs here".into()));
        assert_eq!(combined(Compliant, &r), Compliant);
        assert_eq!(combined(NonCompliant, &r), NonCompliant);
        r.insert(
            "c".to_string(),
            Shown::Failed("guard c did not deny its canary".into()),
        );
        assert_eq!(combined(Compliant, &r), NonCompliant);
        assert_eq!(failures(&r), ["guard c did not deny its canary"]);
    }
}
