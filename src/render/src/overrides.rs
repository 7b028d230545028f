//! What one HCP runs: the fleet's revision for it (or the one its override pins), with its
//! `HostedAdmissionOverride` applied, checked again by the agent (the API server may not run
//! the CRD's CEL rules: 1.20 does not) against the revision it would run and the guardrails
//! every configuration must pass. A refused override changes nothing but its status, except a
//! pause: pausing never depends on the rest being right.

use crate::config::AgentConfig;

use crate::config::Exempted;

use crate::config::exemption_problem;
use crate::rollout::Revision;
use hcp_fleet_model::crd::admission_rollout::{
    HostedAdmissionOverrideSpec, HostedAdmissionOverrideStatus,
};
use hcp_fleet_model::crd::conditions;
use hcp_fleet_model::crd::conditions::ConditionStatus;

/// Groups an override may not exempt: each is everyone, every workload, every node, or the
/// identities a tenant can mint (`unexemptable_group` also refuses every
/// `system:serviceaccounts:<namespace>`, a whole namespace's workloads).
pub(crate) const UNEXEMPTABLE_GROUPS: &[&str] = &[
    "system:authenticated",
    "system:unauthenticated",
    "system:serviceaccounts",
    "system:nodes",
    "system:bootstrappers",
];
/// Users an override may not exempt (`unexemptable_user` also refuses every node and
/// bootstrap identity).
pub(crate) const UNEXEMPTABLE_USERS: &[&str] = &["*", "system:anonymous", "system:kube-proxy"];

/// Why an override may not exempt user `u`, if it may not. An override is one SRE's exception
/// for one hosted cluster: it names users exactly, never by pattern.
pub(crate) fn unexemptable_user(u: &str) -> Option<&'static str> {
    if UNEXEMPTABLE_USERS.contains(&u) {
        Some(
            "would turn the guards off for everyone, or for an identity anyone can take: set a guard's mode to off instead",
        )
    } else if u.contains('*') {
        Some("is a pattern; an override names users exactly")
    } else if u.starts_with("system:node:") || u.starts_with("system:bootstrap:") {
        Some("is a node or bootstrap identity, which the hosted cluster's admins can mint")
    } else {
        None
    }
}

/// Why an override may not exempt group `g`, if it may not.
pub(crate) fn unexemptable_group(g: &str) -> Option<&'static str> {
    if UNEXEMPTABLE_GROUPS.contains(&g) {
        Some(
            "would turn the guards off for everyone, or for an identity anyone can take: set a guard's mode to off instead",
        )
    } else if g.starts_with("system:serviceaccounts:") {
        Some("is every service account of a namespace, which the hosted cluster's admins fill")
    } else {
        None
    }
}

/// The configuration one HCP runs, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub config: AgentConfig,
    /// The revision it runs (the fleet's, or the pinned one).
    pub revision: String,
    /// Its override pauses it.
    pub paused: bool,
    /// Its override pins a revision (taken: the HCP stays out of the waves).
    pub pinned: bool,
    /// What its override's status should say (`None`: it has none).
    pub verdict: Option<Verdict>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub accepted: bool,
    pub message: String,
}

/// The reason of the `Accepted` condition of an override that is not the one in effect
/// (another in the same namespace sorts first by name).
pub const DUPLICATE: &str = "Duplicate";

/// What an override's status should say: `verdict`, about the revision the HCP runs, with the
/// `Accepted` condition keeping its transition time from `prev` where it did not flip.
pub fn status(
    prev: Option<&HostedAdmissionOverrideStatus>,
    verdict: &Verdict,
    reason: &str,
    revision: &str,
    generation: Option<i64>,
    now: &str,
) -> HostedAdmissionOverrideStatus {
    let want = conditions::Want {
        type_: ACCEPTED,
        status: ConditionStatus::from_bool(verdict.accepted),
        reason,
        message: verdict.message.clone(),
    };
    let prev_conditions = prev.map_or(&[][..], |p| &p.conditions[..]);
    HostedAdmissionOverrideStatus {
        observed_generation: generation,
        conditions: vec![conditions::set(prev_conditions, want, generation, now)],
        accepted: Some(ConditionStatus::from_bool(verdict.accepted).as_str().into()),
        message: verdict.message.clone(),
        revision: Some(revision.to_string()),
    }
}

/// The override's condition.
pub(crate) const ACCEPTED: &str = "Accepted";

/// `fleet`: the revision the rollout assigns this HCP (the configuration's while the rollout
/// has recorded nothing); `known`: a revision by name, if the rollout still holds it. The
/// revision the HCP runs is always held, whether or not the rollout has recorded it yet: a pin
/// to it must never be refused for the rollout being a step behind.
pub fn resolve(
    base: &AgentConfig,
    fleet: &Revision,
    known: impl Fn(&str) -> Option<Revision>,
    ov: Option<&HostedAdmissionOverrideSpec>,
) -> Resolved {
    let plain = |verdict| Resolved {
        config: fleet.apply(base),
        revision: fleet.id.clone(),
        paused: ov.is_some_and(|o| o.paused),
        pinned: false,
        verdict,
    };
    let Some(ov) = ov else {
        return plain(None);
    };
    match apply(base, fleet, known, ov) {
        Ok(r) => r,
        Err(problems) => {
            let mut message = format!("refused: {}", problems.join("; "));
            if ov.paused {
                message.push_str("; paused all the same");
            }
            plain(Some(Verdict {
                accepted: false,
                message,
            }))
        }
    }
}

fn apply(
    base: &AgentConfig,
    fleet: &Revision,
    known: impl Fn(&str) -> Option<Revision>,
    ov: &HostedAdmissionOverrideSpec,
) -> Result<Resolved, Vec<String>> {
    let mut problems = Vec::new();
    let revision = match &ov.revision {
        Some(pin) if *pin == fleet.id => fleet.clone(),
        Some(pin) => match known(pin) {
            Some(r) => r,
            None => {
                problems.push(format!(
                    "revision {pin} is not one the agent holds (the stable one, the one rolling out, or a recent one: see `hcp-fleet-agent status`)"
                ));
                fleet.clone()
            }
        },
        None => fleet.clone(),
    };
    let mut cfg = revision.apply(base);
    let mut effect = Vec::new();
    if ov.paused {
        effect.push("paused".to_string());
    }
    if ov.revision.is_some() {
        effect.push(format!("pinned to revision {}", revision.id));
    }
    for (i, g) in ov.guards.iter().enumerate() {
        // As the CRD's rule says: with two modes for one guard, which one holds is a guess.
        if ov.guards[..i].iter().any(|h| h.name == g.name) {
            problems.push(format!("guard {} is named more than once", g.name));
            continue;
        }
        if hcp_fleet_guards::probe::ROW.name == g.name {
            problems.push(format!(
                "guard {}: the probe proves the admission path works; its mode cannot be overridden",
                g.name
            ));
            continue;
        }
        match cfg.webhooks.iter_mut().find(|w| w.name == g.name) {
            Some(w) => {
                w.mode = g.mode;
                effect.push(format!("{} {}", g.name, mode_name(g.mode)));
            }
            None => problems.push(format!(
                "guard {} is not in revision {} (its guards: {})",
                g.name,
                revision.id,
                cfg.webhooks
                    .iter()
                    .map(|w| w.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    for u in &ov.exempt_users {
        if let Some(why) = unexemptable_user(u) {
            problems.push(format!("exempt user {u:?} {why}"));
        } else if let Some(p) = exemption_problem("exemptUsers", u, Exempted::User) {
            problems.push(p);
        } else if !cfg.admission.exempt_users.contains(u) {
            cfg.admission.exempt_users.push(u.clone());
        }
    }
    for g in &ov.exempt_groups {
        if let Some(why) = unexemptable_group(g) {
            problems.push(format!("exempt group {g:?} {why}"));
        } else if let Some(p) = exemption_problem("exemptGroups", g, Exempted::Group) {
            problems.push(p);
        } else if !cfg.admission.exempt_groups.contains(g) {
            cfg.admission.exempt_groups.push(g.clone());
        }
    }
    if !ov.exempt_users.is_empty() || !ov.exempt_groups.is_empty() {
        effect.push(format!(
            "{} more exempt user(s), {} more exempt group(s)",
            ov.exempt_users.len(),
            ov.exempt_groups.len()
        ));
    }
    // The guardrails hold for an HCP's own configuration as for the fleet's.
    problems.extend(cfg.problems());
    if !problems.is_empty() {
        return Err(problems);
    }
    if effect.is_empty() {
        effect.push("nothing to change".into());
    }
    Ok(Resolved {
        config: cfg,
        revision: revision.id,
        paused: ov.paused,
        pinned: ov.revision.is_some(),
        verdict: Some(Verdict {
            accepted: true,
            message: format!("in effect: {}", effect.join("; ")),
        }),
    })
}

fn mode_name(m: hcp_fleet_model::Mode) -> &'static str {
    match m {
        hcp_fleet_model::Mode::Enforce => "enforce",
        hcp_fleet_model::Mode::Warn => "warn",
        hcp_fleet_model::Mode::Off => "off",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_model::Mode;
    use hcp_fleet_model::crd::admission_rollout::GuardOverride;

    fn fleet() -> (AgentConfig, Revision, Revision) {
        let base = AgentConfig::default();
        let old = Revision::of(&base);
        let mut next = base.clone();
        next.admission.image = "quay.io/hcp-fleet/hcp-fleet-agent:next".into();
        (base, Revision::of(&next), old)
    }

    #[test]
    fn no_override_runs_the_fleet_revision() {
        let (base, rev, _) = fleet();
        let r = resolve(&base, &rev, |_| None, None);
        assert_eq!(r.revision, rev.id);
        assert_eq!(r.config.admission.image, rev.content.admission.image);
        assert_eq!(r.verdict, None);
        assert!(!r.paused && !r.pinned);
    }

    #[test]
    fn a_pin_modes_and_exemptions_take_effect_and_say_so() {
        let (base, rev, old) = fleet();
        let known = |id: &str| (id == old.id).then(|| old.clone());
        let ov = HostedAdmissionOverrideSpec {
            revision: Some(old.id.clone()),
            guards: vec![GuardOverride {
                name: "featuregate.hcp-fleet.openshift.io".into(),
                mode: Mode::Warn,
            }],
            exempt_users: vec!["alice".into()],
            exempt_groups: vec!["team-a".into()],
            ..Default::default()
        };
        let r = resolve(&base, &rev, known, Some(&ov));
        assert_eq!(r.revision, old.id);
        assert!(r.pinned);
        assert_eq!(r.config.admission.image, old.content.admission.image);
        let fg = r
            .config
            .webhooks
            .iter()
            .find(|w| w.name.starts_with("featuregate"))
            .expect("fg");
        assert_eq!(fg.mode, Mode::Warn);
        assert!(
            r.config
                .admission
                .exempt_users
                .contains(&"alice".to_string())
        );
        assert!(
            r.config
                .admission
                .exempt_groups
                .contains(&"team-a".to_string())
        );
        let v = r.verdict.expect("verdict");
        assert!(v.accepted, "{v:?}");
        assert!(
            v.message
                .contains(&format!("pinned to revision {}", old.id)),
            "{}",
            v.message
        );
        assert!(
            v.message
                .contains("featuregate.hcp-fleet.openshift.io warn"),
            "{}",
            v.message
        );
    }

    /// Before the rollout records anything, an HCP runs the configuration's revision by
    /// fallback: a pin to it is held all the same (`known` knows nothing yet).
    #[test]
    fn a_pin_to_the_revision_the_hcp_runs_is_held_before_the_rollout_records_it() {
        let (base, _, current) = fleet();
        let ov = HostedAdmissionOverrideSpec {
            revision: Some(current.id.clone()),
            ..Default::default()
        };
        let r = resolve(&base, &current, |_| None, Some(&ov));
        let v = r.verdict.expect("verdict");
        assert!(v.accepted, "{v:?}");
        assert!(r.pinned);
        assert_eq!(r.revision, current.id);
        assert_eq!(r.config, current.apply(&base));
    }

    #[test]
    fn a_refused_override_changes_nothing_but_still_pauses() {
        let (base, rev, _) = fleet();
        for (ov, needle) in [
            (
                HostedAdmissionOverrideSpec {
                    revision: Some("0123456789abcdef".into()),
                    ..Default::default()
                },
                "is not one the agent holds",
            ),
            (
                HostedAdmissionOverrideSpec {
                    guards: vec![GuardOverride {
                        name: "nope.example.com".into(),
                        mode: Mode::Off,
                    }],
                    ..Default::default()
                },
                "guard nope.example.com is not in revision",
            ),
            (
                HostedAdmissionOverrideSpec {
                    guards: vec![GuardOverride {
                        name: "probe.hcp-fleet.openshift.io".into(),
                        mode: Mode::Off,
                    }],
                    ..Default::default()
                },
                "its mode cannot be overridden",
            ),
            (
                HostedAdmissionOverrideSpec {
                    exempt_groups: vec!["system:authenticated".into()],
                    paused: true,
                    ..Default::default()
                },
                "would turn the guards off for everyone",
            ),
            (
                HostedAdmissionOverrideSpec {
                    exempt_users: vec!["*".into()],
                    ..Default::default()
                },
                "would turn the guards off for everyone",
            ),
            // Exact names only, and no identity a tenant can take or mint.
            (
                HostedAdmissionOverrideSpec {
                    exempt_users: vec!["system:serviceaccount:openshift-backplane:*".into()],
                    ..Default::default()
                },
                "is a pattern; an override names users exactly",
            ),
            (
                HostedAdmissionOverrideSpec {
                    exempt_users: vec!["system:node:worker-1".into()],
                    ..Default::default()
                },
                "node or bootstrap identity",
            ),
            (
                HostedAdmissionOverrideSpec {
                    exempt_groups: vec!["system:serviceaccounts:tenant-ns".into()],
                    ..Default::default()
                },
                "every service account of a namespace",
            ),
            (
                HostedAdmissionOverrideSpec {
                    exempt_groups: vec!["system:nodes".into()],
                    ..Default::default()
                },
                "for an identity anyone can take",
            ),
        ] {
            let r = resolve(&base, &rev, |_| None, Some(&ov));
            let v = r.verdict.clone().expect("verdict");
            assert!(!v.accepted && v.message.contains(needle), "{needle}: {v:?}");
            assert_eq!(r.config, rev.apply(&base), "nothing of it applies");
            assert_eq!(r.revision, rev.id);
            assert_eq!(r.paused, ov.paused);
            if ov.paused {
                assert!(v.message.ends_with("paused all the same"));
            }
        }
    }

    #[test]
    fn the_guardrails_hold_for_an_hcps_configuration() {
        let (base, rev, _) = fleet();
        // A revision held from before a guardrail (here: one whose guard matches webhook
        // configurations) cannot come back through a pin.
        let mut bad = base.clone();
        bad.webhooks[0].rules[0].resources = vec!["validatingwebhookconfigurations".into()];
        bad.webhooks[0].rules[0].api_groups = vec!["admissionregistration.k8s.io".into()];
        assert!(!bad.problems().is_empty());
        let bad = Revision::of(&bad);
        let ov = HostedAdmissionOverrideSpec {
            revision: Some(bad.id.clone()),
            ..Default::default()
        };
        let r = resolve(
            &base,
            &rev,
            |id| (id == bad.id).then(|| bad.clone()),
            Some(&ov),
        );
        let v = r.verdict.expect("verdict");
        assert!(
            !v.accepted && v.message.contains("webhook configurations"),
            "{v:?}"
        );
        assert_eq!(r.revision, rev.id);
    }
}
