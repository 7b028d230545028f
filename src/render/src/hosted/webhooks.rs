//! The webhook configurations the agent installs in a hosted cluster (docs/architecture.md, step 5):
//! rendered purely from the configuration, the HCP namespace and the CA bundle.
//!
//! One ValidatingWebhookConfiguration and one MutatingWebhookConfiguration per hosted cluster,
//! each holding every active webhook of its kind. A kind with no active webhook renders to
//! nothing, and the controller deletes what it owns but no longer wants.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use serde_json::{Value, json};

use super::admission_policies::{AdmissionPolicies, Engine};
use super::objects::{
    CLAIM_ANNOTATION, HostedFeatures, WebhookRenderError, failure_policy,
    guarded_namespace_selector, guarded_object_selector, owned_metadata, rules_json,
};
use crate::config::AgentConfig;
use hcp_fleet_guards as guards;
use hcp_fleet_guards::catalogue::{PROBE_REVISION_LABEL, WebhookDefinition, WebhookKind};

pub const VALIDATING_NAME: &str = "hcp-fleet-agent-validating";
pub const MUTATING_NAME: &str = "hcp-fleet-agent-mutating";
/// Everything the agent installs in one hosted cluster: the webhook configurations and, where
/// served, the admission policies and bindings.
#[derive(Debug, Clone, PartialEq)]
pub struct HostedWebhooks {
    pub validating: Option<ValidatingWebhookConfiguration>,
    pub mutating: Option<MutatingWebhookConfiguration>,
    pub policies: AdmissionPolicies,
    /// The revision the probe webhook selects (`None`: no probe webhook is installed, as when
    /// every guard runs as a policy and the mutation is off).
    pub webhook_revision: Option<String>,
    /// The guards the static guards (`hosted::static_guards`) carry and have been proven in
    /// force, with their revision; empty where none is. Not written through the API.
    pub static_guards: std::collections::BTreeSet<String>,
    pub static_revision: Option<String>,
    /// The static mutating policies' revision, where proven in force.
    pub static_mutating_revision: Option<String>,
}

/// The claim value for `CLAIM_ANNOTATION`.
pub fn claim_value(management_uid: &str, hcp_namespace: &str) -> String {
    format!("{management_uid}/{hcp_namespace}")
}

impl HostedWebhooks {
    /// Both configurations carrying `claim` (see `CLAIM_ANNOTATION`).
    pub fn claimed(self, claim: &str) -> Self {
        self.annotated(CLAIM_ANNOTATION, claim)
    }

    /// Every object annotated `key: value` (the claim; the rollout revision).
    pub fn annotated(mut self, key: &str, value: &str) -> Self {
        let mark = |m: &mut kube::core::ObjectMeta| {
            m.annotations
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.into());
        };
        if let Some(v) = self.validating.as_mut() {
            mark(&mut v.metadata);
        }
        if let Some(m) = self.mutating.as_mut() {
            mark(&mut m.metadata);
        }
        for p in &mut self.policies.policies {
            mark(&mut p.metadata);
        }
        for b in &mut self.policies.bindings {
            mark(&mut b.metadata);
        }
        for o in self
            .policies
            .mutating
            .iter_mut()
            .chain(&mut self.policies.mutating_bindings)
        {
            mark(&mut o.metadata);
        }
        self
    }

    /// The engine that carries the guard `name` here: `Static` where the static guards carry
    /// it (evaluated before API-side policies by kube-apiserver 1.36, so a guard carried both
    /// ways answers in the static one's name), else `Policy` (validating or mutating), else
    /// `Webhook`; `None` where no object carries it (a mutation with nothing to change here).
    /// Meaningful once `static_guards` is set.
    pub fn carrier(&self, name: &str) -> Option<Engine> {
        let hooked = || {
            let validating = self
                .validating
                .iter()
                .flat_map(|v| v.webhooks.iter().flatten());
            let mutating = self
                .mutating
                .iter()
                .flat_map(|m| m.webhooks.iter().flatten());
            validating
                .map(|w| w.name.as_str())
                .chain(mutating.map(|w| w.name.as_str()))
                .any(|n| n == name)
        };
        if self.static_guards.contains(name) {
            Some(Engine::Static)
        } else if self
            .policies
            .guards()
            .chain(self.policies.mutations())
            .any(|n| n == name)
        {
            Some(Engine::Policy)
        } else if hooked() {
            Some(Engine::Webhook)
        } else {
            None
        }
    }

    /// The path each guard `cfg` has on takes here (`carrier`), in the configuration's order
    /// (the probe aside): `static`, `policy`, `webhook`, or `none`.
    pub fn paths(&self, cfg: &AgentConfig) -> Vec<hcp_fleet_model::crd::GuardPath> {
        cfg.active_webhooks()
            .filter(|w| !is_probe(w))
            .map(|w| hcp_fleet_model::crd::GuardPath {
                name: w.name.clone(),
                path: self.carrier(&w.name).map_or("none", Engine::as_str).into(),
            })
            .collect()
    }

    /// How many guards (the probe and the mutation aside: every validating guard) each engine
    /// carries: (webhook, policy).
    pub fn guards(&self) -> (usize, usize) {
        let hooks = self
            .validating
            .iter()
            .flat_map(|v| v.webhooks.iter().flatten())
            .filter(|w| w.name != guards::probe::ROW.name)
            .count();
        (hooks, self.policies.guards().count())
    }
}

/// The base URL of the admission service as the hosted kube-apiserver must call it. A
/// `service:` reference would be resolved inside the hosted cluster, wrongly; the URL names the
/// Service in the HCP namespace on the management cluster.
pub fn default_url_base(cfg: &AgentConfig, hcp_namespace: &str) -> String {
    format!(
        "https://{}.{hcp_namespace}.svc.cluster.local",
        cfg.admission.service_name
    )
}

fn is_probe(w: &WebhookDefinition) -> bool {
    w.path == guards::probe::ROW.path
}

/// Whether a hosted cluster offering `features` needs the admission service under `cfg`: some
/// guard takes the webhook path, or no guard is carried inside the hosted kube-apiserver
/// either, so that only the probe webhook is left to prove a path. Not otherwise: every
/// guard runs as a policy (API-side or static), and an HCP needs no admission Deployment,
/// Service or certificate. The static guards' state does not change the answer: a guard
/// asking for `static` that is not in force runs where `auto` puts it, a policy wherever
/// the files could be (`admission_policies::api_engine`).
pub fn needs_admission_service(cfg: &AgentConfig, features: HostedFeatures) -> bool {
    let second_layer = cfg.static_guards.second_layer;
    let mut webhook = false;
    let mut elsewhere = false;
    for w in cfg.active_webhooks().filter(|w| !is_probe(w)) {
        match super::admission_policies::api_engine(w, features, second_layer) {
            Some(Engine::Webhook) => webhook = true,
            _ => elsewhere = true,
        }
    }
    webhook || !elsewhere
}

fn webhook_json(
    w: &WebhookDefinition,
    url_base: &str,
    ca_bundle: &ByteString,
    match_conditions: bool,
    settings: &guards::Settings,
) -> Value {
    let mut v = json!({
        "name": w.name,
        "clientConfig": {
            "url": format!("{}{}", url_base.trim_end_matches('/'), w.path),
            "caBundle": ca_bundle,
        },
        "rules": rules_json(&w.rules),
        "failurePolicy": failure_policy(w.failure_policy),
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": w.timeout_seconds,
        "admissionReviewVersions": ["v1"],
        "namespaceSelector": guarded_namespace_selector(w.namespace_selector.as_ref(), guards::scope_of(&w.path)),
        "objectSelector": guarded_object_selector(w.object_selector.as_ref()),
    });
    if w.kind == WebhookKind::Mutating {
        v["reinvocationPolicy"] = json!("Never");
    }
    // The probe answers whoever sends it (scope Everyone: no condition): it proves the path,
    // whatever the identity.
    let conditions = if match_conditions {
        super::exemptions::conditions(settings, &w.path, guards::scope_of(&w.path))
    } else {
        Vec::new()
    };
    if !conditions.is_empty() {
        v["matchConditions"] = json!(conditions);
    }
    v
}

/// What one hosted cluster should hold under `cfg`. `registry` is the hosted cluster's internal
/// registry as last read (`None`: not read), which the pod image spec mutation's policy
/// carries in its CEL.
pub fn render(
    cfg: &AgentConfig,
    hcp_namespace: &str,
    url_base: &str,
    ca_bundle_pem: &str,
    features: HostedFeatures,
    registry: Option<&guards::pod_image_spec::InternalRegistry>,
) -> Result<HostedWebhooks, WebhookRenderError> {
    let ca = ByteString(ca_bundle_pem.as_bytes().to_vec());
    let settings = guards::Settings {
        internal_registry: registry.cloned(),
        ..guards::Settings::from(cfg)
    };
    let policies = super::admission_policies::render(cfg, &settings, hcp_namespace, features)?;
    let hooks: Vec<&WebhookDefinition> = cfg
        .active_webhooks()
        .filter(|w| {
            super::admission_policies::api_engine(w, features, cfg.static_guards.second_layer)
                == Some(Engine::Webhook)
        })
        .collect();
    // The probe webhook proves the admission service's path: wanted while a guard uses it, or
    // while nothing else would be probed.
    let service_in_path = needs_admission_service(cfg, features);
    let hooks: Vec<&WebhookDefinition> = hooks
        .into_iter()
        .filter(|w| service_in_path || !is_probe(w))
        .collect();
    let mut rendered: Vec<(WebhookKind, Value, bool)> = hooks
        .iter()
        .map(|w| {
            (
                w.kind,
                webhook_json(w, url_base, &ca, features.match_conditions, &settings),
                is_probe(w),
            )
        })
        .collect();
    // The probe selects the revision of every webhook rendered (its own selector aside), so
    // its answer proves the API server runs this revision.
    let revision = if rendered.iter().any(|(_, _, p)| *p) {
        super::admission_policies::revision_of(rendered.iter().map(|(_, v, _)| v))
    } else {
        None
    };
    if let Some(rev) = &revision {
        for (_, v, probe) in &mut rendered {
            if *probe {
                v["objectSelector"]["matchLabels"][PROBE_REVISION_LABEL] = json!(rev);
            }
        }
    }
    let of_kind = |kind: WebhookKind| -> Vec<Value> {
        rendered
            .iter()
            .filter(|(k, _, _)| *k == kind)
            .map(|(_, v, _)| v.clone())
            .collect()
    };
    let err = |e: serde_json::Error| WebhookRenderError {
        namespace: hcp_namespace.to_string(),
        reason: e.to_string(),
    };
    // One configuration per kind; a kind with no active webhook renders to nothing.
    let configuration = |kind: WebhookKind, api_kind: &str, name: &str| -> Option<Value> {
        let hooks = of_kind(kind);
        (!hooks.is_empty()).then(|| {
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": api_kind,
                "metadata": owned_metadata(name, hcp_namespace),
                "webhooks": hooks,
            })
        })
    };
    let validating = configuration(
        WebhookKind::Validating,
        "ValidatingWebhookConfiguration",
        VALIDATING_NAME,
    )
    .map(serde_json::from_value)
    .transpose()
    .map_err(err)?;
    let mutating = configuration(
        WebhookKind::Mutating,
        "MutatingWebhookConfiguration",
        MUTATING_NAME,
    )
    .map(serde_json::from_value)
    .transpose()
    .map_err(err)?;
    Ok(HostedWebhooks {
        validating,
        mutating,
        policies,
        webhook_revision: revision,
        static_guards: Default::default(),
        static_revision: None,
        static_mutating_revision: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosted::objects::{OWNED_LABEL, foreign_summary};
    use hcp_fleet_model::Mode;

    fn rendered() -> HostedWebhooks {
        rendered_with(HostedFeatures::default())
    }

    fn rendered_with(features: HostedFeatures) -> HostedWebhooks {
        let cfg = AgentConfig::default();
        render(
            &cfg,
            "clusters-hc-1",
            &default_url_base(&cfg, "clusters-hc-1"),
            "CA-PEM",
            features,
            None,
        )
        .expect("render")
    }

    /// The service is needed exactly where the rendering calls it: across every server a
    /// hosted cluster may be (none of the admission APIs, validating policies only, both, the
    /// static guards in force) and configurations that move guards (one guard on its webhook,
    /// a mutation in enforce mode, every guard static, every guard off but the probe). On 1.36
    /// with the defaults it is not: every guard runs inside the hosted kube-apiserver.
    #[test]
    fn the_service_is_needed_exactly_where_a_webhook_is_rendered() {
        use hcp_fleet_guards::catalogue::GuardEngine;
        let all = HostedFeatures {
            match_conditions: true,
            admission_policies: true,
            mutating_policies: true,
            static_guards: true,
            static_mutating: true,
            static_offered: false,
        };
        let servers = [
            HostedFeatures::default(),
            HostedFeatures {
                mutating_policies: false,
                static_guards: false,
                static_mutating: false,
                static_offered: false,
                ..all
            },
            HostedFeatures {
                static_guards: false,
                static_mutating: false,
                static_offered: false,
                ..all
            },
            all,
        ];
        let mut configs = vec![("defaults", AgentConfig::default())];
        let mut one_hook = AgentConfig::default();
        one_hook.webhooks[0].engine = GuardEngine::Webhook;
        configs.push(("one guard on its webhook", one_hook));
        let mut enforce = AgentConfig::default();
        for w in &mut enforce.webhooks {
            w.mode = Mode::Enforce;
        }
        configs.push(("every guard enforced", enforce));
        let mut statics = AgentConfig::default();
        for w in &mut statics.webhooks {
            if guards::has_cel_form(&w.path) {
                w.engine = GuardEngine::Static;
            }
        }
        configs.push(("every CEL guard static", statics.clone()));
        statics.static_guards.second_layer = true;
        configs.push(("static with a second layer", statics));
        let mut off = AgentConfig::default();
        for w in &mut off.webhooks {
            if !is_probe(w) {
                w.mode = Mode::Off;
            }
        }
        configs.push(("every guard off", off));
        for (what, cfg) in &configs {
            for f in servers {
                let r = render(cfg, "ns", "https://x", "CA", f, None).expect("render");
                let rendered = r.validating.is_some() || r.mutating.is_some();
                assert_eq!(needs_admission_service(cfg, f), rendered, "{what}, {f:?}");
            }
        }
        let defaults = AgentConfig::default();
        assert!(!needs_admission_service(&defaults, servers[2]));
        assert!(
            needs_admission_service(&defaults, servers[1]),
            "the Service tag needs 1.36"
        );
        assert!(needs_admission_service(&defaults, servers[0]));
    }

    /// Each guard's path names the object that carries it: every guard a policy on 1.36 with the
    /// defaults (the pod image spec's `none`: no registry to rewrite for), every one a webhook
    /// where no policy is served, the static guards' where they are in force.
    #[test]
    fn each_guard_is_named_with_the_path_it_takes() {
        let cfg = AgentConfig::default();
        let all = crate::hosted::cel_cases::served();
        let path = |r: &HostedWebhooks, name: &str| {
            r.paths(&cfg)
                .into_iter()
                .find(|p| p.name == name)
                .map(|p| p.path)
        };
        let rbac = guards::protected_rbac::ROW.name;
        let image = guards::pod_image_spec::ROW.name;
        let r = rendered_with(all);
        let paths = r.paths(&cfg);
        assert_eq!(
            paths.len(),
            cfg.active_webhooks().count() - 1,
            "the probe aside"
        );
        assert!(
            paths.iter().all(|p| p.path == "policy" || p.name == image),
            "{paths:?}"
        );
        assert_eq!(path(&r, image).as_deref(), Some("none"));
        let hooks = rendered_with(HostedFeatures::default());
        assert!(hooks.paths(&cfg).iter().all(|p| p.path == "webhook"));
        let mut statics = rendered_with(all);
        statics.static_guards.insert(rbac.to_string());
        assert_eq!(path(&statics, rbac).as_deref(), Some("static"));
    }

    #[test]
    fn exemptions_become_match_conditions_where_served_and_never_on_the_probe() {
        // Webhooks only (no admission policies), to see every guard's conditions.
        let served = rendered_with(HostedFeatures {
            match_conditions: true,
            admission_policies: false,
            mutating_policies: false,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
        });
        let mut hooks = served.validating.expect("v").webhooks.expect("hooks");
        hooks.extend(
            served
                .mutating
                .expect("m")
                .webhooks
                .expect("hooks")
                .into_iter()
                .map(|m| {
                    serde_json::from_value(serde_json::to_value(m).expect("json"))
                        .expect("same shape")
                }),
        );
        for h in &hooks {
            let conditions = h.match_conditions.clone().unwrap_or_default();
            let is_probe = h
                .client_config
                .url
                .as_deref()
                .is_some_and(|u| u.ends_with("/probe"));
            if is_probe {
                assert!(
                    conditions.is_empty(),
                    "{}: the probe answers anyone",
                    h.name
                );
            } else {
                let names: Vec<&str> = conditions.iter().map(|c| c.name.as_str()).collect();
                let guard = hcp_fleet_guards::ALL
                    .iter()
                    .find(|g| g.row().name == h.name);
                // A guard that exempts no identity class (the LoadBalancer tag) has no
                // identity to leave out, by default.
                let mut want = if guard.is_some_and(|g| g.exempt_classes().is_empty()) {
                    vec![]
                } else {
                    vec!["not-an-exempt-user", "not-in-an-exempt-group"]
                };
                // Only the workload guards skip the exempt namespaces: the identity guards and
                // the guards of objects that live there judge every namespace.
                let scope = guard.map(|g| g.scope());
                if scope == Some(hcp_fleet_guards::Scope::Workloads) {
                    want.push("not-in-an-exempt-namespace");
                }
                assert_eq!(names, want, "{}", h.name);
            }
        }
        // Not served: nothing the server would drop (which would read as drift forever).
        let plain = rendered();
        for h in plain.validating.expect("v").webhooks.expect("hooks") {
            assert!(h.match_conditions.is_none(), "{}", h.name);
        }
    }

    #[test]
    fn urls_point_at_the_hcp_namespace_service_never_a_service_ref() {
        let w = rendered();
        let v = w.validating.expect("validating");
        for hook in &v.webhooks.expect("hooks") {
            let cc = &hook.client_config;
            assert!(cc.service.is_none());
            let url = cc.url.as_deref().expect("url");
            assert!(
                url.starts_with("https://hcp-fleet-admission.clusters-hc-1.svc.cluster.local/"),
                "{url}"
            );
            assert_eq!(
                cc.ca_bundle.as_ref().map(|b| b.0.as_slice()),
                Some(&b"CA-PEM"[..])
            );
        }
    }

    #[test]
    fn guardrails_are_on_every_webhook() {
        let w = rendered();
        let mut all = Vec::new();
        for h in w.validating.expect("v").webhooks.expect("hooks") {
            all.push((
                h.side_effects.clone(),
                h.timeout_seconds,
                h.failure_policy.clone(),
                h.object_selector.clone(),
                h.namespace_selector.clone(),
                h.name.clone(),
            ));
        }
        for h in w.mutating.expect("m").webhooks.expect("hooks") {
            all.push((
                h.side_effects.clone(),
                h.timeout_seconds,
                h.failure_policy.clone(),
                h.object_selector.clone(),
                h.namespace_selector.clone(),
                h.name.clone(),
            ));
        }
        assert_eq!(all.len(), AgentConfig::default().webhooks.len());
        for (side, timeout, fp, obj, ns, name) in all {
            assert_eq!(side, "None");
            assert!(matches!(timeout, Some(1..=5)));
            assert_eq!(fp.as_deref(), Some("Ignore"));
            let obj = serde_json::to_value(obj).expect("obj");
            assert!(
                !obj.to_string().contains(OWNED_LABEL),
                "no label exempts an object: {obj}"
            );
            let ns = serde_json::to_value(ns).expect("ns").to_string();
            // The identity guards see every namespace: what a tenant mints in kube-system, or
            // in a namespace they labelled run-level 0, is as exempt as anywhere else.
            let identity = hcp_fleet_guards::ALL
                .iter()
                .any(|g| g.row().name == name && g.scope() == hcp_fleet_guards::Scope::Identities);
            assert_eq!(ns.contains("kube-system"), !identity, "{name}: {ns}");
            assert_eq!(
                ns.contains("openshift.io/run-level"),
                !identity,
                "{name}: {ns}"
            );
        }
    }

    #[test]
    fn a_kind_with_nothing_active_renders_nothing() {
        let mut cfg = AgentConfig::default();
        for w in &mut cfg.webhooks {
            if w.kind == WebhookKind::Mutating {
                w.mode = Mode::Off;
            }
        }
        let r = render(
            &cfg,
            "ns",
            "https://x",
            "CA",
            HostedFeatures::default(),
            None,
        )
        .expect("render");
        assert!(r.mutating.is_none());
        assert!(r.validating.is_some());
    }

    #[test]
    fn match_ignores_server_defaults_but_sees_edits() {
        let w = rendered();
        let desired = serde_json::to_value(w.validating.expect("v")).expect("json");
        let mut live = desired.clone();
        live["metadata"]["resourceVersion"] = json!("42");
        // What a real server adds (the stored objects' test holds the whole of it).
        assert!(desired["webhooks"][0]["rules"][0].get("scope").is_none());
        live["webhooks"][0]["rules"][0]["scope"] = json!("*");
        assert!(crate::hosted::objects::matches(&desired, &live));
        // A field the rendering lacks at a value other than the server's default is drift.
        let mut scoped = live.clone();
        scoped["webhooks"][0]["rules"][0]["scope"] = json!("Namespaced");
        assert!(!crate::hosted::objects::matches(&desired, &scoped));
        let mut edited = live.clone();
        edited["webhooks"][0]["failurePolicy"] = json!("Fail");
        assert!(!crate::hosted::objects::matches(&desired, &edited));
        let mut unlabelled = live.clone();
        unlabelled["metadata"]["labels"] = json!({});
        assert!(!crate::hosted::objects::matches(&desired, &unlabelled));
        // A field the agent does not render, set by someone else, is drift too: the server
        // defaulted `scope` (no manager owns it), a tenant merged a selector in.
        let name = desired["webhooks"][0]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let key = format!("k:{{\"name\":\"{name}\"}}");
        let mut merged = live;
        merged["webhooks"][0]["objectSelector"]["matchLabels"] = json!({"x": "y"});
        merged["metadata"]["managedFields"] = json!([
            {"manager": crate::management::FIELD_MANAGER, "operation": "Apply",
             "fieldsV1": {"f:webhooks": {(key.clone()): {".": {}, "f:name": {}, "f:objectSelector": {}}}}},
            {"manager": "kubectl-patch\u{7}", "operation": "Update",
             "fieldsV1": {"f:webhooks": {(key): {"f:objectSelector": {"f:matchLabels": {".": {}, "f:x": {}}}}}}},
        ]);
        assert!(hcp_fleet_model::compare::subset(
            &desired["webhooks"][0],
            &merged["webhooks"][0]
        ));
        assert!(!crate::hosted::objects::matches(&desired, &merged));
        let summary = foreign_summary(&merged).expect("named");
        assert!(
            summary.starts_with(&format!(
                "webhooks[name={name}].objectSelector.matchLabels (by kubectl-patch)"
            )),
            "{summary}"
        );
        assert!(!summary.chars().any(char::is_control), "{summary}");
        assert!(
            summary.contains(".matchLabels.x (by kubectl-patch)"),
            "{summary}"
        );
    }
}
