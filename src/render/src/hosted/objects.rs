//! What every object the agent writes in a hosted cluster has in common, below both of the
//! kinds that render them (`webhooks`: the webhook configurations; `policies`: the admission
//! policies and bindings): the ownership label and the claim, the features a hosted server
//! offers, the selectors and rules of a guard, the metadata, and how a live object is compared
//! with its rendering. A leaf of `hosted`: it names neither kind's module.

use serde_json::{Value, json};

use hcp_fleet_guards::catalogue::FailurePolicy;

use hcp_fleet_guards::catalogue::LabelSelector;

use hcp_fleet_guards::Scope;
use hcp_fleet_guards::catalogue::Rule;
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};

/// Label on everything the agent owns in a hosted cluster (selects what to repair or delete).
pub const OWNED_LABEL: &str = "hcp-fleet.openshift.io/owned";
/// Which management cluster and HCP namespace installed the configurations:
/// `<management kube-system UID>/<HCP namespace>`. The durable record of the claim on a
/// hosted cluster, so two namespaces (or two management clusters) never fight over one.
pub const CLAIM_ANNOTATION: &str = "hcp-fleet.openshift.io/claimed-by";
/// A label-selector string for the agent's own objects, for people and tests to look with: a
/// tenant can put the label on objects of their own, so the agent reads its objects by name.
pub fn owned_selector() -> String {
    format!("{OWNED_LABEL}=true")
}

/// Namespaces whose objects no webhook may see: the cluster's own machinery.
const PROTECTED_NAMESPACE_NAMES: &[&str] = &[
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "openshift-kube-apiserver",
    "openshift-config",
    "openshift-config-managed",
];

/// What a hosted kube-apiserver offers that changes how the guards are installed, found by
/// asking it (`discover_features`), never from its version string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostedFeatures {
    /// It keeps a webhook's `matchConditions` (CEL, beta from Kubernetes 1.28, GA in 1.30):
    /// the exempt users, groups and namespaces are then left out by the API server itself,
    /// so their requests never call the admission service. Without it the service exempts
    /// them, after the call.
    pub match_conditions: bool,
    /// It serves `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicy and its binding
    /// (GA in 1.30): the guards with a CEL form then run inside it (`hosted::admission_policies`).
    pub admission_policies: bool,
    /// It serves `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy and its binding
    /// (GA, and on by default, in 1.36): the mutations with a CEL form then run inside it.
    pub mutating_policies: bool,
    /// The static guards (`hosted::static_guards`, loaded from files) of the revision wanted
    /// now are in force: their probe was answered by the `.static.k8s.io` probe policy, and
    /// no object of that name exists through the API. Not a property of the server's version:
    /// found by the probe at each reconcile.
    pub static_guards: bool,
    /// The same for the mutating policies loaded from files (their own plugin, directory and
    /// probe: a server may load one and not the other).
    pub static_mutating: bool,
    /// The hosted kube-apiserver's pod mounts the static guards' ConfigMap
    /// (`static_guards::offered`): engine `auto` puts the guards it can there. Found on the
    /// management cluster at each reconcile.
    pub static_offered: bool,
}

/// The definition's selector with the agent's guard expressions added (never replaced).
fn guarded_selector(sel: Option<&LabelSelector>, guards: &[Value]) -> Value {
    let mut exprs: Vec<Value> = sel
        .map(|s| {
            s.match_expressions
                .iter()
                .filter_map(|e| serde_json::to_value(e).ok())
                .collect()
        })
        .unwrap_or_default();
    exprs.extend(guards.iter().cloned());
    // An empty list is left out: the API server does not keep one, and a rendered field the
    // live object never shows would read as drift forever.
    let mut v = if exprs.is_empty() {
        json!({})
    } else {
        json!({ "matchExpressions": exprs })
    };
    if let Some(s) = sel.filter(|s| !s.match_labels.is_empty()) {
        v["matchLabels"] = json!(s.match_labels);
    }
    v
}

/// The identity guards take the definition's selector alone: a cluster-admin can put the
/// run-level label on a namespace they create, and what they mint in `kube-system` is as exempt
/// as what they mint in `openshift-x`.
pub(crate) fn guarded_namespace_selector(sel: Option<&LabelSelector>, scope: Scope) -> Value {
    if scope == Scope::Identities {
        return guarded_selector(sel, &[]);
    }
    guarded_selector(
        sel,
        &[
            // OpenShift's run-level 0/1 namespaces carry the control plane: never intercept them.
            json!({"key": "openshift.io/run-level", "operator": "NotIn", "values": ["0", "1"]}),
            // Honoured where the server labels namespaces with their name (1.21+); the
            // admission service exempts the same namespaces by name for older servers.
            json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": PROTECTED_NAMESPACE_NAMES}),
        ],
    )
}

/// The definition's object selector, and nothing more: no label exempts an object from a
/// guard. A selector term on a label any user with `patch` can set (the API server tests it
/// against the old object on UPDATE and DELETE) would let them exempt whatever they like,
/// `kubectl label clusterrole cluster-admin …` then `kubectl delete clusterrole cluster-admin`.
/// The agent's own hosted objects need no such term: webhook configurations and admission
/// policies never reach a webhook or a policy, and the agent's identity (the kubeconfig's
/// `system:admin` in `system:masters`) is exempt by the configured users and groups.
pub(crate) fn guarded_object_selector(sel: Option<&LabelSelector>) -> Value {
    guarded_selector(sel, &[])
}

/// A definition's rules as the API server writes them (webhook `rules`, and an admission
/// policy's `matchConstraints.resourceRules`: the same shape).
pub(crate) fn rules_json(rules: &[Rule]) -> Vec<Value> {
    rules
        .iter()
        .map(|r| {
            let mut rule = json!({
                "operations": r.operations,
                "apiGroups": r.api_groups,
                "apiVersions": r.api_versions,
                "resources": r.resources,
            });
            if let Some(scope) = &r.scope {
                rule["scope"] = json!(scope);
            }
            rule
        })
        .collect()
}

pub(crate) fn failure_policy(f: FailurePolicy) -> &'static str {
    match f {
        FailurePolicy::Ignore => "Ignore",
        FailurePolicy::Fail => "Fail",
    }
}

/// The annotation naming the HCP namespace an object in a hosted cluster was rendered for.
pub(crate) const HCP_NAMESPACE_ANNOTATION: &str = "hcp-fleet.openshift.io/hcp-namespace";

/// Metadata of everything the agent owns in a hosted cluster.
pub(crate) fn owned_metadata(name: &str, hcp_namespace: &str) -> Value {
    json!({
        "name": name,
        "labels": {
            OWNED_LABEL: "true",
            MANAGED_BY: MANAGED_BY_VALUE,
        },
        "annotations": {
            HCP_NAMESPACE_ANNOTATION: hcp_namespace,
        },
    })
}

/// A guard that cannot be rendered for a hosted cluster (a webhook or a policy).
#[derive(Debug, thiserror::Error)]
#[error("rendering hosted webhook configurations for {namespace}: {reason}")]
pub struct WebhookRenderError {
    pub(crate) namespace: String,
    pub(crate) reason: String,
}

/// The labels and annotations rendered are on the live object with the same values.
fn metadata_matches(desired: &Value, live: &Value) -> bool {
    ["labels", "annotations"].iter().all(|field| {
        desired["metadata"][field]
            .as_object()
            .is_none_or(|want| want.iter().all(|(k, v)| live["metadata"][field][k] == *v))
    })
}

/// What an API server fills in on a webhook entry of a configuration that the rendering may
/// leave out, at the value it fills in (admissionregistration.k8s.io/v1's defaults; seen on
/// 1.20 and 1.36: `testdata/stored-*.json`). Any other field the rendering lacks is drift.
pub(crate) static WEBHOOK_DEFAULTS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    let selector = serde_json::json!({});
    serde_json::json!({
        "rules": [{"scope": "*"}],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "namespaceSelector": selector,
        "objectSelector": selector,
        "timeoutSeconds": 10,
        "reinvocationPolicy": "Never",
    })
});

/// The same for a ValidatingAdmissionPolicy's or binding's `spec`: one tree for both kinds
/// (their fields do not overlap but for the selectors' shape).
pub(crate) static SPEC_DEFAULTS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    let matching = serde_json::json!({
        "matchPolicy": "Equivalent",
        "namespaceSelector": {},
        "objectSelector": {},
        "resourceRules": [{"scope": "*"}],
    });
    serde_json::json!({
        "failurePolicy": "Fail",
        "matchConstraints": matching,
        "matchResources": matching,
    })
});

/// Where a live configuration's `webhooks` or a live policy's or binding's `spec` differs
/// from the rendering (`compare::differences`), whoever wrote it.
pub fn differences(desired: &Value, live: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if desired.get("webhooks").is_some() || live.get("webhooks").is_some() {
        out.extend(hcp_fleet_model::compare::differences(
            &desired["webhooks"],
            &live["webhooks"],
            &serde_json::json!([*WEBHOOK_DEFAULTS]),
            "webhooks",
        ));
    }
    if desired.get("spec").is_some() || live.get("spec").is_some() {
        out.extend(hcp_fleet_model::compare::differences(
            &desired["spec"],
            &live["spec"],
            &SPEC_DEFAULTS,
            "spec",
        ));
    }
    out
}

/// Does a live hosted object (a webhook configuration, a policy or a binding) still say
/// exactly what the agent rendered? The part it owns whole (`webhooks` or `spec`) compared
/// whole (`differences`: a field the rendering lacks counts unless it is a server default at
/// its value), whoever wrote the difference; its labels and annotations there; and no field of
/// that part held by another field manager.
pub fn matches(desired: &Value, live: &Value) -> bool {
    differences(desired, live).is_empty()
        && metadata_matches(desired, live)
        && foreign(live).is_empty()
}

/// The part of a hosted object the agent renders whole, where a field it did not render is
/// drift: a configuration's `webhooks`, a policy's or binding's `spec`.
pub(crate) const OWNED_WHOLE: &[&str] = &["webhooks", "spec"];

/// What someone else set in the part of a live hosted object the agent renders whole
/// (`compare::foreign_fields`), each as `path (by manager)`.
pub(crate) fn foreign(live: &Value) -> Vec<String> {
    hcp_fleet_model::compare::foreign_fields(live, crate::management::FIELD_MANAGER, OWNED_WHOLE)
}

/// `foreign(live)` for a drift record (`compare::summary`: paths and manager names are the
/// tenant's own text).
pub fn foreign_summary(live: &Value) -> Option<String> {
    hcp_fleet_model::compare::summary(&foreign(live))
}
