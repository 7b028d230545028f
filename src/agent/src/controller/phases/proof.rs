//! What makes an answer to the probe, or to a canary, the admission service's own and not an
//! imitation by something the hosted cluster's admins installed: pure, shared by the probe,
//! the canaries and the state they keep between rounds.
//!
//! The texts are the API server's, not ours: a webhook's denial reaches the client as
//! `admission webhook "<webhook>" denied the request: <message>` (the apiserver's
//! `webhookerrors.ToStatusErr`), a policy's as a Forbidden status for the object,
//! `<resource>[.<group>] "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with
//! binding '<binding>' denied request: <message>` (`admission.NewForbidden` around the
//! validating policy dispatcher's words), with the resource and name in `details`. The unit
//! tests hold texts taken from real servers' answers (docs/testbed.md, "Server texts").

use kube::core::Status;

use hcp_fleet_guards::catalogue::POLICY_PROBE_ANSWER;

use hcp_fleet_guards::catalogue::PROBE_ANSWER;
use hcp_fleet_guards::probe::{PROOF_MARK, ProbeKey};
use hcp_fleet_render::hosted::admission_policies::Engine;

/// What makes a webhook answer to the probe the admission service's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Proof {
    /// The HCP's probe key (from its TLS Secret); `None` only in tests, where the words are
    /// all there is to check.
    pub(crate) key: Option<ProbeKey>,
    /// The admission Deployment is rolling out: replicas of an agent version from before the
    /// probe key answer without a proof, and an answer in the right words is taken as theirs
    /// until every replica runs the current spec (a tenant's imitation passes only meanwhile).
    pub(crate) rolling_out: bool,
}

/// How a denial of the probe reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The agent's own answer, proven.
    Proven,
    /// The right words without the proof, while the Deployment rolls out (see `Proof`).
    Unproven,
    /// Not the agent's answer.
    Imitation,
}

/// The object a probe or canary asked about, as the API server names it in a denial: the
/// resource (plural), its API group (empty for the core group) and the object's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asked<'a> {
    pub(crate) group: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) name: &'a str,
}

impl Asked<'_> {
    /// How the API server begins a Forbidden status for this object (apimachinery's
    /// `NewForbidden`: the group-qualified resource, the name quoted).
    fn forbidden(&self) -> String {
        let qualified = if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        format!("{qualified} \"{}\" is forbidden: ", self.name)
    }

    /// Whether `status`'s details, where it carries them, name this object.
    fn named_by(&self, status: &Status) -> bool {
        status
            .details
            .as_ref()
            .is_none_or(|d| d.name == self.name && d.kind == self.resource && d.group == self.group)
    }
}

/// Whether a denial of the probe of `engine` (a dry-run create of the ConfigMap `asked`) is
/// the agent's own answer, and not an imitation by something the hosted cluster's admins
/// installed (see `judge`).
pub(crate) fn authentic(
    engine: Engine,
    status: &Status,
    asked: &Asked<'_>,
    proof: &Proof,
    nonce: &str,
) -> Answer {
    let (words, name) = match engine {
        Engine::Webhook => (PROBE_ANSWER, hcp_fleet_guards::probe::ROW.name.to_string()),
        Engine::Policy => (
            POLICY_PROBE_ANSWER,
            hcp_fleet_guards::probe::ROW.name.to_string(),
        ),
        Engine::Static => (
            POLICY_PROBE_ANSWER,
            hcp_fleet_render::hosted::static_guards::probe_name(),
        ),
    };
    judge(engine, &name, words, status, asked, proof, nonce)
}

/// Whether a denial came from the agent's guard `name` on `engine`, beginning with `words`.
///
/// A policy's denial is taken only in the exact form a real server gives it: HTTP 403, reason
/// Forbidden (the agent's policies set it), the message beginning with the Forbidden prefix
/// for the object asked about, then the agent's policy and binding names, then `words`; and
/// details, where present, naming that object. A tenant cannot hold the policy's or the
/// binding's name while the agent's objects hold it, and no webhook's denial can begin so (the
/// server puts `admission webhook "…"` in front of whatever a webhook says). Nothing is taken
/// from the middle of a message.
///
/// A webhook's denial names a webhook, which anyone can name alike, so it must end with the
/// proof of this request's nonce under the HCP's probe key.
pub(crate) fn judge(
    engine: Engine,
    name: &str,
    words: &str,
    status: &Status,
    asked: &Asked<'_>,
    proof: &Proof,
    nonce: &str,
) -> Answer {
    let message = status.message.as_str();
    let said = match engine {
        Engine::Webhook => format!("admission webhook \"{name}\" denied the request: {words}"),
        // A policy loaded from files is named in the same words (kube-apiserver 1.36.2).
        Engine::Policy | Engine::Static => format!(
            "{}ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {words}",
            asked.forbidden()
        ),
    };
    if !message.starts_with(&said) {
        return Answer::Imitation;
    }
    if engine != Engine::Webhook
        && (status.code != 403 || status.reason != "Forbidden" || !asked.named_by(status))
    {
        return Answer::Imitation;
    }
    match (engine, &proof.key) {
        (Engine::Policy | Engine::Static, _) | (Engine::Webhook, None) => Answer::Proven,
        (Engine::Webhook, Some(k)) if k.proven(nonce, message) => Answer::Proven,
        (Engine::Webhook, Some(_)) if proof.rolling_out && !message.contains(PROOF_MARK) => {
            Answer::Unproven
        }
        (Engine::Webhook, Some(_)) => Answer::Imitation,
    }
}

/// Whether a denial of the static mutating probe (`hosted::static_guards`, a dry-run create of
/// the ConfigMap `asked`) is the answer of the probe MutatingAdmissionPolicy loaded from files.
/// Taken only in the exact form kube-apiserver 1.36.2 gives it (testdata): HTTP 403, reason
/// Invalid (a policy that fails to apply, k8s.io/apiserver's `generic.PolicyError`), the
/// message beginning `policy '<probe>' with binding '<probe>' denied request: ` (the
/// dispatcher puts its own words in place of the Forbidden status's), and details, where
/// present, naming that object. A tenant's webhook is quoted after `admission webhook`, a
/// tenant's validating policy after the Forbidden prefix, and a tenant's mutating policy is
/// named otherwise: with the feature gate on no API object can hold the reserved name, and
/// where one does `Statics::in_force` refuses the answer.
pub(crate) fn judge_static_mutating(status: &Status, asked: &Asked<'_>) -> Answer {
    let name = hcp_fleet_render::hosted::static_guards::probe_name();
    let said = format!("policy '{name}' with binding '{name}' denied request: ");
    if status.code == 403
        && status.reason == "Invalid"
        && status.message.starts_with(&said)
        && asked.named_by(status)
    {
        Answer::Proven
    } else {
        Answer::Imitation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_guards::probe::{answer, nonce};

    fn denial(message: String, code: u16) -> Status {
        Status {
            message,
            code,
            reason: "BadRequest".into(),
            ..Status::default()
        }
    }

    /// The probe's ConfigMap as the texts below name it.
    const PROBE_NAME: &str = "hcp-fleet-probe-0123456789abcdef";

    fn probe_asked(name: &str) -> Asked<'_> {
        Asked {
            group: "",
            resource: "configmaps",
            name,
        }
    }

    #[test]
    fn only_the_agents_own_answer_proves_the_path() {
        let key = ProbeKey::generate().expect("random");
        let n = nonce().expect("random");
        let name = hcp_fleet_guards::probe::ROW.name;
        // A webhook's denial as the API server relays it (webhookerrors.ToStatusErr, the same
        // form as the tenant's webhook in the real texts below).
        let hook = |text: String| {
            denial(
                format!("admission webhook \"{name}\" denied the request: {text}"),
                400,
            )
        };
        let proof = |rolling_out| Proof {
            key: Some(key.clone()),
            rolling_out,
        };
        let asked = probe_asked(PROBE_NAME);
        let proven = hook(answer(Some(&key), Some(&n)));
        let words = hook(answer(None, None));
        let other = ProbeKey::generate().expect("random");
        let forged = hook(answer(Some(&other), Some(&n)));
        let w = Engine::Webhook;
        let judged = |s: &Status, rolling| authentic(w, s, &asked, &proof(rolling), &n);
        assert_eq!(judged(&proven, false), Answer::Proven);
        assert_eq!(judged(&words, false), Answer::Imitation);
        assert_eq!(judged(&forged, false), Answer::Imitation);
        // While the Deployment rolls out, the words alone are taken (an old replica), but
        // never a wrong proof.
        assert_eq!(judged(&words, true), Answer::Unproven);
        assert_eq!(judged(&forged, true), Answer::Imitation);
        // Another webhook's name, or the words inside another message.
        let renamed = denial(
            proven.message.replace(name, "probe.tenant.example.com"),
            400,
        );
        assert_eq!(judged(&renamed, false), Answer::Imitation);
        let inside = denial(
            format!(
                "admission webhook \"x\" denied the request: {}",
                proven.message
            ),
            400,
        );
        assert_eq!(judged(&inside, true), Answer::Imitation);
        // A webhook's denial never proves the policy path, whatever it says.
        let by_hook = hook(POLICY_PROBE_ANSWER.into());
        assert_eq!(
            authentic(Engine::Policy, &by_hook, &asked, &proof(false), &n),
            Answer::Imitation
        );
    }

    /// A real server's answers (captured from a run: `testdata/server-texts-*.json`), judged:
    /// the policy's own denial of the probe and of a canary is taken; every imitation,
    /// including one a tenant's webhook words to the letter, is refused.
    mod real_server {
        use super::*;

        const TEXTS: &[(&str, &str)] = &[
            (
                "v1.30.1",
                include_str!("testdata/server-texts-v1.30.1.json"),
            ),
            (
                "v1.32.13",
                include_str!("testdata/server-texts-v1.32.13.json"),
            ),
            (
                "v1.36.2",
                include_str!("testdata/server-texts-v1.36.2.json"),
            ),
        ];

        fn texts() -> Vec<(&'static str, serde_json::Value)> {
            TEXTS
                .iter()
                .map(|(v, t)| (*v, serde_json::from_str(t).expect("server texts parse")))
                .collect()
        }

        fn status(texts: &serde_json::Value, case: &str) -> Status {
            serde_json::from_value(texts[case].clone()).expect("a Status")
        }

        fn policy_probe(s: &Status, asked: &Asked<'_>) -> Answer {
            authentic(Engine::Policy, s, asked, &Proof::default(), "n")
        }

        #[test]
        fn the_probe_policys_denial_is_taken_as_the_server_words_it() {
            for (version, texts) in texts() {
                let s = status(&texts, "probe");
                assert!(
                    s.message.starts_with("configmaps \""),
                    "{version}: the real form has the Forbidden prefix: {}",
                    s.message
                );
                assert_eq!(
                    policy_probe(&s, &probe_asked(PROBE_NAME)),
                    Answer::Proven,
                    "{version}: {}",
                    s.message
                );
            }
        }

        #[test]
        fn the_words_without_the_prefix_or_for_another_object_are_refused() {
            for (version, texts) in texts() {
                let s = status(&texts, "probe");
                let asked = probe_asked(PROBE_NAME);
                // What the old judge took: the policy's words at the start, no prefix.
                let bare = Status {
                    message: s
                        .message
                        .split_once("is forbidden: ")
                        .map(|(_, m)| m.to_string())
                        .expect("prefix"),
                    ..s.clone()
                };
                assert_eq!(policy_probe(&bare, &asked), Answer::Imitation, "{version}");
                // Another probe's object: this request's denial names this request's name.
                assert_eq!(
                    policy_probe(&s, &probe_asked("hcp-fleet-probe-ffffffffffffffff")),
                    Answer::Imitation,
                    "{version}"
                );
                // A generated name is not the name this probe sent.
                let generated = status(&texts, "probe_generate_name");
                assert_eq!(
                    policy_probe(&generated, &asked),
                    Answer::Imitation,
                    "{version}"
                );
                // Details that name another object, another code or reason.
                let mut other = s.clone();
                if let Some(d) = other.details.as_mut() {
                    d.name = "something-else".into();
                }
                assert_eq!(policy_probe(&other, &asked), Answer::Imitation, "{version}");
                for (code, reason) in [(400, "Forbidden"), (403, "Invalid")] {
                    let changed = Status {
                        code,
                        reason: reason.into(),
                        ..s.clone()
                    };
                    assert_eq!(
                        policy_probe(&changed, &asked),
                        Answer::Imitation,
                        "{version}"
                    );
                }
                // Another policy or binding.
                let renamed = Status {
                    message: s.message.replacen(
                        "'probe.hcp-fleet.openshift.io'",
                        "'probe.tenant.example.com'",
                        1,
                    ),
                    ..s.clone()
                };
                assert_eq!(
                    policy_probe(&renamed, &asked),
                    Answer::Imitation,
                    "{version}"
                );
            }
        }

        /// A tenant's webhook that denies with the policy's whole text, its code, reason and
        /// details: the server puts its own words in front, so it never reads as the policy.
        #[test]
        fn a_tenants_webhook_quoting_the_policy_is_refused() {
            for (version, texts) in texts() {
                let s = status(&texts, "tenant_webhook_quoting_the_policy");
                assert!(
                    s.message.contains("ValidatingAdmissionPolicy 'probe.hcp-fleet.openshift.io' with binding 'probe.hcp-fleet.openshift.io' denied request: "),
                    "{version}: the imitation quotes the words"
                );
                assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{version}");
                assert_eq!(
                    policy_probe(&s, &probe_asked(PROBE_NAME)),
                    Answer::Imitation,
                    "{version}: {}",
                    s.message
                );
            }
        }

        #[test]
        fn a_canarys_denial_names_its_group_resource_and_object() {
            for (version, texts) in texts() {
                let s = status(&texts, "canary_delete_cluster_admin");
                let guard = "protected-rbac.hcp-fleet.openshift.io";
                let asked = Asked {
                    group: "rbac.authorization.k8s.io",
                    resource: "clusterroles",
                    name: "cluster-admin",
                };
                let judged = |s: &Status, a: &Asked<'_>| {
                    judge(Engine::Policy, guard, "", s, a, &Proof::default(), "n")
                };
                assert_eq!(
                    judged(&s, &asked),
                    Answer::Proven,
                    "{version}: {}",
                    s.message
                );
                // Another guard's policy, another group or resource, another object.
                assert_eq!(
                    judge(
                        Engine::Policy,
                        "scc.hcp-fleet.openshift.io",
                        "",
                        &s,
                        &asked,
                        &Proof::default(),
                        "n"
                    ),
                    Answer::Imitation
                );
                for a in [
                    Asked { group: "", ..asked },
                    Asked {
                        resource: "roles",
                        ..asked
                    },
                    Asked {
                        name: "admin",
                        ..asked
                    },
                ] {
                    assert_eq!(judged(&s, &a), Answer::Imitation, "{version}: {a:?}");
                }
                // A collection delete's denial names no object ("Unknown"): not a canary's.
                let collection = status(&texts, "collection_delete");
                assert_eq!(judged(&collection, &asked), Answer::Imitation, "{version}");
            }
        }

        /// The texts of 1.36.2 with the static guards loaded from files (docs/testbed.md,
        /// "Server texts").
        fn static_texts() -> serde_json::Value {
            serde_json::from_str(include_str!("testdata/server-texts-v1.36.2.json"))
                .expect("server texts parse")
        }

        /// The static probe policy's denial is taken for the static engine only: the API-side
        /// probe's name is another, and either engine's answer read as the other's is refused.
        #[test]
        fn the_static_probes_denial_is_taken_for_the_static_engine_only() {
            let texts = static_texts();
            let asked = probe_asked(PROBE_NAME);
            let by_files = status(&texts, "static_probe");
            let by_api = status(&texts, "probe");
            let judged = |e: Engine, s: &Status| authentic(e, s, &asked, &Proof::default(), "n");
            assert_eq!(judged(Engine::Static, &by_files), Answer::Proven);
            assert_eq!(judged(Engine::Policy, &by_files), Answer::Imitation);
            assert_eq!(judged(Engine::Static, &by_api), Answer::Imitation);
            // A tenant's webhook quoting it is refused as for the API-side policy.
            let quoted = Status {
                message: format!(
                    "admission webhook \"x.tenant.example.com\" denied the request: {}",
                    by_files.message
                ),
                ..by_files.clone()
            };
            assert_eq!(judged(Engine::Static, &quoted), Answer::Imitation);
        }

        /// With the feature gate off the API accepts the reserved names, and a policy created
        /// under them answers the probe in exactly the words of one loaded from files: the
        /// judge cannot tell them apart, which is why the agent also asks the API whether an
        /// object of that name exists (`controller::static_guards::Statics::in_force`).
        #[test]
        fn a_forged_static_probe_reads_as_the_real_one() {
            let texts = static_texts();
            let asked = probe_asked(PROBE_NAME);
            let forged = status(
                &texts,
                "static_probe_forged_through_the_api_with_the_gate_off",
            );
            let real = status(&texts, "static_probe");
            assert_eq!(forged.message, real.message);
            assert_eq!(
                authentic(Engine::Static, &forged, &asked, &Proof::default(), "n"),
                Answer::Proven
            );
        }

        /// A canary denied by a guard loaded from files names the guard with the suffix; a
        /// collection delete is denied by it too (the name judged as stored).
        /// The static mutating probe's denial, as 1.36.2 words it, is its answer; the same
        /// words from a tenant's mutating policy of another name, for another object, quoted
        /// by a webhook or with another code are not. With the gate off a policy created under
        /// the reserved name answers in the same words (why `Statics::in_force` asks the API
        /// whether one exists), and with it on the API refuses to create one.
        #[test]
        fn the_static_mutating_probes_denial_is_taken_in_the_servers_words_only() {
            let texts = static_texts();
            let asked = probe_asked(PROBE_NAME);
            let real = status(&texts, "static_mutating_probe");
            assert_eq!(judge_static_mutating(&real, &asked), Answer::Proven);
            let tenant = status(&texts, "static_mutating_probe_by_a_tenant_policy");
            assert_eq!(judge_static_mutating(&tenant, &asked), Answer::Imitation);
            assert_eq!(
                judge_static_mutating(&real, &probe_asked("hcp-fleet-probe-other")),
                Answer::Imitation
            );
            let quoted = Status {
                message: format!(
                    "admission webhook \"x.tenant.example.com\" denied the request: {}",
                    real.message
                ),
                ..real.clone()
            };
            assert_eq!(judge_static_mutating(&quoted, &asked), Answer::Imitation);
            let other_code = Status {
                code: 400,
                ..real.clone()
            };
            assert_eq!(
                judge_static_mutating(&other_code, &asked),
                Answer::Imitation
            );
            let forged = status(
                &texts,
                "static_mutating_probe_forged_through_the_api_with_the_gate_off",
            );
            assert_eq!(judge_static_mutating(&forged, &asked), Answer::Proven);
            let created = status(&texts, "static_mutating_name_created_through_the_api");
            assert_eq!(created.code, 422);
            assert!(
                created
                    .message
                    .contains("are reserved for static manifest-based configurations"),
                "{}",
                created.message
            );
        }

        #[test]
        fn a_static_guards_canary_denial_names_the_guard_with_the_suffix() {
            let texts = static_texts();
            let s = status(&texts, "static_canary_delete_cluster_admin");
            let asked = Asked {
                group: "rbac.authorization.k8s.io",
                resource: "clusterroles",
                name: "cluster-admin",
            };
            let judged =
                |e: Engine, guard: &str| judge(e, guard, "", &s, &asked, &Proof::default(), "n");
            let guard = "protected-rbac.hcp-fleet.openshift.io";
            let with_suffix = format!("{guard}{}", hcp_fleet_render::hosted::static_guards::SUFFIX);
            assert_eq!(judged(Engine::Static, &with_suffix), Answer::Proven);
            assert_eq!(judged(Engine::Policy, guard), Answer::Imitation);
            let collection = status(&texts, "static_collection_delete");
            assert_eq!(collection.code, 403);
            assert!(collection.message.contains(&format!("'{with_suffix}'")));
            assert!(collection.message.contains("cluster-admin"));
        }

        /// What a hosted cluster's admin (alice, bound to cluster-admin) gets from the API for
        /// the static guards: creating one of their names is refused, and there is nothing to
        /// delete or change.
        #[test]
        fn no_api_request_reaches_a_static_guard() {
            let texts = static_texts();
            let created = status(&texts, "static_name_created_through_the_api");
            assert_eq!((created.code, created.reason.as_str()), (422, "Invalid"));
            assert!(
                created
                    .message
                    .contains("are reserved for static manifest-based configurations")
            );
            for case in [
                "static_policy_deleted_through_the_api",
                "static_binding_patched_through_the_api",
            ] {
                let s = status(&texts, case);
                assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"), "{case}");
            }
        }
    }
}
