//! The admission service's decision: the guard served on the request's path, with the
//! exemptions and the guard's mode applied in one place around the guard's own decision
//! (`hcp_fleet_guards`), and where the service finds its settings (`SETTINGS_ENV`).

use hcp_fleet_guards::catalogue::denial;
use hcp_fleet_guards::review::Decision;

use hcp_fleet_guards::identities::user_matches;
use hcp_fleet_guards::review::Request;
use hcp_fleet_guards::{Guard, HookSetting, Scope, Settings, matches};
use hcp_fleet_model::Mode;

/// Why the guard served by `hook` leaves this request alone, if it does: the identities it
/// exempts (its classes, resolved into the hook's lists) and, for the workload guards, the
/// control plane's namespaces.
fn exempt(req: &Request, s: &Settings, hook: &HookSetting, scope: Scope) -> Option<String> {
    if scope == Scope::Everyone {
        return None;
    }
    let user = &req.user_info.username;
    if user_matches(&hook.exempt_users, user, &s.customer_namespaces) {
        return Some(format!("user {user} is exempt"));
    }
    if let Some(g) = req
        .user_info
        .groups
        .iter()
        .map(AsRef::as_ref)
        .find(|g| hook.exempt_groups.iter().any(|e| e == g))
    {
        return Some(format!("group {g} is exempt"));
    }
    if scope == Scope::Identities {
        return None;
    }
    if let Some(ns) = req
        .namespace
        .as_deref()
        .filter(|ns| matches(&s.exempt_namespaces, ns))
    {
        return Some(format!("namespace {ns} is exempt"));
    }
    None
}

/// Applies the webhook's mode to what its policy decided.
pub(crate) fn apply_mode(hook: &str, mode: Mode, d: Decision) -> Decision {
    match mode {
        Mode::Enforce => d,
        Mode::Off => Decision::allow(),
        Mode::Warn => {
            let mut out = Decision::allow();
            if !d.allowed {
                let msg = d.message.unwrap_or_else(|| "denied".into());
                out.warnings.push(denial::fill(
                    denial::WARN,
                    &[("guard", hook), ("message", &msg)],
                ));
                out.audit_annotations.insert("would-deny".into(), msg);
            }
            if !d.patch.is_empty() {
                out.warnings
                    .push(denial::fill(denial::WOULD_MUTATE, &[("guard", hook)]));
                out.audit_annotations.insert(
                    "would-mutate".into(),
                    serde_json::to_string(&d.patch).unwrap_or_default(),
                );
            }
            out
        }
    }
}

/// Decides one request for the guard served on `path`, under the name of the webhook that
/// serves it. `None`: no such guard.
pub fn decide<'s>(path: &str, req: &Request, s: &'s Settings) -> Option<(&'s str, Decision)> {
    decide_by(hcp_fleet_guards::for_path(path)?, path, req, s)
}

/// `decide` by the guard served on `path`, already found (the service finds each path's
/// guard once, at start).
pub fn decide_by<'s>(
    guard: &'static dyn Guard,
    path: &str,
    req: &Request,
    s: &'s Settings,
) -> Option<(&'s str, Decision)> {
    if guard.scope() == Scope::Everyone {
        // The probe is answered whatever the mode or identity: it proves the path works.
        return Some(("probe", guard.decide(req, s)));
    }
    let hook = s.hook(path)?;
    if hook.mode == Mode::Off || exempt(req, s, hook, guard.scope()).is_some() {
        return Some((&hook.name, Decision::allow()));
    }
    let mut d = apply_mode(&hook.name, hook.mode, guard.decide(req, s));
    // Audit annotations are keyed by the webhook by the API server; keep ours short (a value
    // of at most 1024 bytes is at most 1024 characters already).
    for v in d.audit_annotations.values_mut().filter(|v| v.len() > 1024) {
        *v = v.chars().take(1024).collect();
    }
    Some((&hook.name, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_guards::catalogue::{PROBE_ANSWER, PROBE_LABEL};
    use hcp_fleet_guards::review::decode;
    use hcp_fleet_render::config::AgentConfig;
    use serde_json::{Value, json};

    fn settings(mode: Mode) -> Settings {
        let mut s = Settings::from(&AgentConfig::default());
        for w in &mut s.webhooks {
            w.mode = mode;
        }
        s
    }

    /// The resource is named by its group and plural.
    fn req(
        op: &str,
        (group, resource): (&str, &str),
        name: &str,
        ns: Option<&str>,
        user: &str,
        groups: &[&str],
        object: Value,
    ) -> Request<'static> {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": group, "version": "v1", "kind": "X"},
                "resource": {"group": group, "version": "v1", "resource": resource},
                "name": name, "namespace": ns, "operation": op,
                "userInfo": {"username": user, "groups": groups},
                "object": object, "oldObject": null,
            }
        }))
        .expect("json");
        decode(&body).expect("decode").into_owned()
    }

    fn delete_cr(name: &str, user: &str, groups: &[&str]) -> Request<'static> {
        req(
            "DELETE",
            ("rbac.authorization.k8s.io", "clusterroles"),
            name,
            None,
            user,
            groups,
            Value::Null,
        )
    }

    #[test]
    fn protected_clusterrole_delete_is_denied_for_a_regular_user() {
        let s = settings(Mode::Enforce);
        let (_, d) = decide(
            hcp_fleet_guards::protected_rbac::ROW.path,
            &delete_cr("cluster-admin", "alice", &["system:authenticated"]),
            &s,
        )
        .expect("hook");
        assert!(!d.allowed);
        assert!(
            d.message
                .expect("msg")
                .contains("protected ClusterRole \"cluster-admin\"")
        );
        let (_, d) = decide(
            hcp_fleet_guards::protected_rbac::ROW.path,
            &delete_cr("my-role", "alice", &[]),
            &s,
        )
        .expect("hook");
        assert!(d.allowed, "unprotected roles are fine");
    }

    #[test]
    fn exempt_identities_pass() {
        let s = settings(Mode::Enforce);
        for (user, groups) in [
            ("system:serviceaccount:hypershift:operator", vec![]),
            ("bob", vec!["system:masters"]),
        ] {
            let (_, d) = decide(
                hcp_fleet_guards::protected_rbac::ROW.path,
                &delete_cr("cluster-admin", user, &groups),
                &s,
            )
            .expect("hook");
            assert!(d.allowed, "{user} {groups:?}");
        }
    }

    #[test]
    fn warn_mode_allows_with_a_warning_and_an_audit_annotation() {
        let s = settings(Mode::Warn);
        let (name, d) = decide(
            hcp_fleet_guards::protected_rbac::ROW.path,
            &delete_cr("cluster-admin", "alice", &[]),
            &s,
        )
        .expect("hook");
        assert!(d.allowed);
        assert!(
            d.warnings[0].starts_with(&format!("{name} (warn mode) would deny: hcp-fleet:")),
            "{:?}",
            d.warnings
        );
        assert!(d.audit_annotations.contains_key("would-deny"));
    }

    #[test]
    fn an_audit_annotation_is_cut_to_1024_characters_and_a_short_one_kept_whole() {
        let s = settings(Mode::Warn);
        let path = hcp_fleet_guards::protected_rbac::ROW.path;
        // A name past the protected prefix `system:*`, two bytes a character.
        let long = format!("system:controller:{}", "é".repeat(1500));
        let (_, d) = decide(path, &delete_cr(&long, "alice", &[]), &s).expect("hook");
        let cut = &d.audit_annotations["would-deny"];
        assert_eq!(cut.chars().count(), 1024);
        assert!(cut.len() > 1024, "cut by characters, not bytes");
        let (_, d) = decide(path, &delete_cr("cluster-admin", "alice", &[]), &s).expect("hook");
        let whole = &d.audit_annotations["would-deny"];
        assert!(whole.ends_with("ask SRE if it must go"), "{whole}");
    }

    #[test]
    fn off_mode_allows_silently() {
        let s = settings(Mode::Off);
        let (_, d) = decide(
            hcp_fleet_guards::protected_rbac::ROW.path,
            &delete_cr("cluster-admin", "alice", &[]),
            &s,
        )
        .expect("hook");
        assert_eq!(d, Decision::allow());
    }

    #[test]
    fn services_get_the_annotation_by_json_patch() {
        let s = settings(Mode::Enforce);
        let r = req(
            "CREATE",
            ("", "services"),
            "web",
            Some("app"),
            "alice",
            &[],
            json!({"metadata": {"name": "web"}}),
        );
        let (_, d) = decide(hcp_fleet_guards::service_annotation::ROW.path, &r, &s).expect("hook");
        assert!(d.allowed);
        assert_eq!(d.patch[0]["path"], "/metadata/annotations");
        let r = req(
            "CREATE",
            ("", "services"),
            "web",
            Some("app"),
            "alice",
            &[],
            json!({"metadata": {"name": "web", "annotations": {"a": "b"}}}),
        );
        let (_, d) = decide(hcp_fleet_guards::service_annotation::ROW.path, &r, &s).expect("hook");
        assert!(
            d.patch[0]["path"]
                .as_str()
                .expect("path")
                .starts_with("/metadata/annotations/")
        );
        assert!(
            !d.patch[0]["path"].as_str().expect("path")[22..].contains('/'),
            "key escaped: {}",
            d.patch[0]["path"]
        );
    }

    #[test]
    fn critical_namespaces_are_exempt() {
        let s = settings(Mode::Enforce);
        let r = req(
            "CREATE",
            ("", "services"),
            "x",
            Some("openshift-ingress"),
            "alice",
            &[],
            json!({"metadata": {}}),
        );
        let (_, d) = decide(hcp_fleet_guards::service_annotation::ROW.path, &r, &s).expect("hook");
        assert!(d.patch.is_empty());
    }

    #[test]
    fn the_probe_is_always_answered() {
        let s = settings(Mode::Off);
        let probe = json!({"metadata": {"labels": {PROBE_LABEL: "true"}}});
        let r = req(
            "CREATE",
            ("", "configmaps"),
            "p",
            Some("default"),
            "system:admin",
            &["system:masters"],
            probe,
        );
        let (_, d) = decide(hcp_fleet_guards::probe::ROW.path, &r, &s).expect("probe");
        assert_eq!(d.message.as_deref(), Some(PROBE_ANSWER));
    }

    #[test]
    fn every_builtin_definition_passes_the_guardrails() {
        assert!(AgentConfig::default().problems().is_empty());
        assert_eq!(
            AgentConfig::default().webhooks.len(),
            hcp_fleet_guards::ALL.len()
        );
    }

    #[test]
    fn unknown_paths_have_no_webhook() {
        let s = settings(Mode::Enforce);
        assert!(decide("/nope", &delete_cr("x", "a", &[]), &s).is_none());
    }

    /// The Rust decision of every guard, through the admission service's `decide` (exemptions
    /// and mode included), is what each guard's table says.
    #[test]
    fn every_guard_decides_its_own_cases() {
        let cfg = hcp_fleet_render::config::AgentConfig::default();
        let mut s = Settings::from(&cfg);
        // What the pod image spec mutation's cases are decided under.
        s.internal_registry = Some(hcp_fleet_guards::pod_image_spec::case_registry());
        for g in hcp_fleet_guards::ALL {
            for c in g.cases().into_iter().chain(g.canary(&s).map(|c| c.case())) {
                let body = c.review();
                let req = hcp_fleet_guards::review::decode(&body).expect("decodes");
                let (_, d) = decide(g.row().path, &req, &s).expect("a guard");
                // A mutation in warn mode says so instead of patching.
                let acted = !d.allowed || !d.patch.is_empty() || !d.warnings.is_empty();
                assert_eq!(
                    acted,
                    c.want == hcp_fleet_guards::Want::Deny,
                    "{}: {}: {d:?}",
                    g.row().name,
                    c.what
                );
            }
        }
    }
}
