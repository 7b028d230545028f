//! Phase 7, per guard: the canaries (`guards::canary`). The probe task sends one per round, in
//! turn, so each enforced guard is tried once every `probeIntervalSeconds` times the number of
//! guards, and a steady hosted cluster sees one request more per round. A guard that lets its
//! canary through, or whose canary is denied by something else, makes the `e2e-probe` concern
//! NonCompliant, naming the guard, until a later round sees it deny again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::proof::{Answer, Asked, Proof, judge};
use hcp_fleet_guards::Settings;
use hcp_fleet_guards::canary::{CANARY_USER, Canary};
use hcp_fleet_model::Mode;
use hcp_fleet_model::crd::ComplianceState;
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::hosted::admission_policies::Engine;
use hcp_fleet_render::hosted::canary::{RBAC_NAME, rbac, refused_by_rbac, request};
use hcp_fleet_render::hosted::webhooks::HostedWebhooks;
use hcp_fleet_render::management::FIELD_MANAGER;

/// One enforced guard's canary, and the engine that carries the guard in this cluster.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    pub(crate) guard: String,
    pub(crate) engine: Engine,
    pub(crate) canary: Canary,
}

/// What one canary showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shown {
    /// The guard denied it (proven).
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
    let hooks: BTreeSet<&str> = desired
        .validating
        .iter()
        .flat_map(|v| v.webhooks.iter().flatten().map(|w| w.name.as_str()))
        .collect();
    let policies: BTreeSet<&str> = desired.policies.guards().collect();
    let settings = Settings::from(cfg);
    cfg.active_webhooks()
        .filter(|w| w.mode == Mode::Enforce)
        .filter_map(|w| {
            let canary = hcp_fleet_guards::for_path(&w.path)?.canary(&settings)?;
            // Static policies are evaluated before API-side ones (kube-apiserver 1.36), so a
            // guard carried both ways is denied in the static one's name.
            let engine = if desired.static_guards.contains(&w.name) {
                Engine::Static
            } else if policies.contains(w.name.as_str()) {
                Engine::Policy
            } else if hooks.contains(w.name.as_str()) {
                Engine::Webhook
            } else {
                return None;
            };
            Some(Planned {
                guard: w.name.clone(),
                engine,
                canary,
            })
        })
        .collect()
}

fn what(c: &Canary) -> String {
    format!(
        "a dry-run {} of {} {:?} by {CANARY_USER}",
        c.verb.as_str(),
        c.resource,
        c.name
    )
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
) -> Shown {
    let Some(nonce) = hcp_fleet_guards::probe::nonce() else {
        return Shown::NotTried("the system's random source failed".into());
    };
    let what = what(&p.canary);
    for attempt in 0..2 {
        let req = match request(&p.canary, &nonce) {
            Ok(r) => r,
            Err(e) => return Shown::NotTried(format!("{what} could not be made: {e}")),
        };
        let answer = match tokio::time::timeout(timeout, hosted.request_text(req)).await {
            Err(_) => {
                return Shown::NotTried(format!("{what}: no answer within {}s", timeout.as_secs()));
            }
            Ok(a) => a,
        };
        let status = match answer {
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
        if status.code == 404 {
            return Shown::Absent(format!("{what}: not found in this cluster"));
        }
        let asked = Asked {
            group: p.canary.group,
            resource: p.canary.resource,
            name: &p.canary.name,
        };
        let name = match p.engine {
            Engine::Static => format!(
                "{}{}",
                p.guard,
                hcp_fleet_render::hosted::static_guards::SUFFIX
            ),
            _ => p.guard.clone(),
        };
        let answer = judge(p.engine, &name, "", &status, &asked, proof, &nonce);
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
        return match answer {
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
        };
    }
    Shown::NotTried(format!("{what}: refused by RBAC"))
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
            static_guards: false,
            match_conditions: policies,
        };
        render(
            cfg,
            "clusters-a",
            "https://svc.clusters-a.svc:443",
            "CA",
            features,
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
        for policies in [false, true] {
            let p = plan(&cfg, &rendered(&cfg, policies));
            let names: Vec<&str> = p.iter().map(|p| p.guard.as_str()).collect();
            assert_eq!(names.len(), 7, "{names:?}");
            let want = if policies {
                Engine::Policy
            } else {
                Engine::Webhook
            };
            assert!(p.iter().all(|p| p.engine == want), "{p:?}");
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
        assert_eq!(p.len(), 5);
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
