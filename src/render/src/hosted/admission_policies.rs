//! The guards that run inside the hosted kube-apiserver: for each built-in whose decision CEL
//! can express, a ValidatingAdmissionPolicy and its binding instead of a webhook entry, where
//! the hosted cluster serves `admissionregistration.k8s.io/v1` policies (docs/architecture.md,
//! "Two engines"). Rendered purely from the configuration and what the server offers.
//!
//! Each policy says what its handler in `hcp_fleet_webhook::decision` says, in CEL: the same
//! conditions (the rules only narrow what reaches it, as for the webhook), the same exemptions
//! (as `matchConditions`), the same message (built from the same `catalogue::denial`
//! template). The mode is the binding's `validationActions`: enforce denies, warn warns and
//! audits, off installs nothing.
//!
//! A mutation with a CEL form (the Service tag and annotation, the pod image spec) becomes a
//! MutatingAdmissionPolicy and its binding in enforce mode where the hosted cluster serves
//! `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy (GA, and on by default, in
//! Kubernetes 1.36; beta and off before): its exemptions and whether the object needs the
//! change as `matchConditions`, the change as an apply configuration. A mutating policy cannot
//! warn that it would have mutated, as the service does in warn mode: in warn mode the mutation
//! is a ValidatingAdmissionPolicy (1.30) whose validation fails where the object needs the
//! change, bound to warn and audit with the service's words.
//!
//! The probe webhook proves the admission service is reachable, which only a call to it can:
//! it is rendered only while a guard uses the service (`webhooks::needs_admission_service`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

use super::exemptions;
use super::objects::{
    HostedFeatures, WebhookRenderError, failure_policy, guarded_namespace_selector,
    guarded_object_selector, owned_metadata, rules_json,
};
use crate::config::AgentConfig;
use hcp_fleet_guards as guards;
use hcp_fleet_guards::catalogue::{GuardEngine, WebhookDefinition};
use hcp_fleet_guards::catalogue::{
    MUTATING_PROBE_ANSWER, MUTATING_PROBE_VALUE, POLICY_PROBE_ANSWER, POLICY_PROBE_VALUE,
    PROBE_LABEL, PROBE_REVISION_LABEL, denial,
};
use hcp_fleet_guards::{CelForm, MutationForm, Settings};
use hcp_fleet_model::Mode;

/// The path a guard takes in one hosted cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Webhook,
    Policy,
    /// A policy loaded by the hosted kube-apiserver from files (`hosted::static_guards`).
    Static,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Webhook => "webhook",
            Engine::Policy => "policy",
            Engine::Static => "static",
        }
    }
}

/// Which engine carries `w` on a server offering `features`, and why not the one asked for.
///
/// `auto` prefers the static guards where the hosted kube-apiserver offers them
/// (`HostedFeatures::static_offered`) and they are proven in force, then admission policies,
/// then the webhook; `static` asks for them whether offered or not.
pub fn engine_of(w: &WebhookDefinition, features: HostedFeatures) -> (Engine, Option<String>) {
    let files = w.engine == GuardEngine::Static
        || (w.engine == GuardEngine::Auto && features.static_offered);
    // The files that would carry it: the mutating ones for a mutation in enforce mode, the
    // validating ones for every other guard (a mutation in warn mode warns as a validating
    // policy).
    let in_force = if super::static_guards::in_mutating_file(w) {
        features.static_mutating
    } else {
        features.static_guards
    };
    let form = guards::has_cel_form(&w.path) || guards::has_mutation_form(&w.path);
    if files && form && in_force {
        return (Engine::Static, None);
    }
    let (engine, why) = engine_as(w, features);
    match w.engine {
        // Refused by the configuration for a guard without a CEL form, like `policy`.
        GuardEngine::Static => (
            engine,
            Some(format!(
                "{} asks for engine static, but the static guards are not in force in this hosted kube-apiserver (docs/static-guards.md); its {} guards instead",
                w.name,
                if engine == Engine::Policy {
                    "admission policy"
                } else {
                    "webhook"
                }
            )),
        ),
        _ => (engine, why),
    }
}

/// `engine_of` through the hosted cluster's API alone (the static guards left out): a policy
/// where served for `auto`, `policy` and `static`, else the webhook.
fn engine_as(w: &WebhookDefinition, features: HostedFeatures) -> (Engine, Option<String>) {
    if guards::has_mutation_form(&w.path) {
        return mutation_engine_of(w, features);
    }
    let cel = guards::has_cel_form(&w.path);
    match w.engine {
        GuardEngine::Webhook => (Engine::Webhook, None),
        GuardEngine::Auto | GuardEngine::Static if cel && features.admission_policies => {
            (Engine::Policy, None)
        }
        GuardEngine::Auto | GuardEngine::Static => (Engine::Webhook, None),
        GuardEngine::Policy if cel && features.admission_policies => (Engine::Policy, None),
        // The configuration refuses `policy` for a guard without a CEL form, so this is a
        // server without admission policies: the webhook guards meanwhile.
        GuardEngine::Policy => (
            Engine::Webhook,
            Some(format!(
                "{} asks for engine policy, but this hosted kube-apiserver does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy; its webhook guards instead",
                w.name
            )),
        ),
    }
}

/// `engine_as` for a mutation with a CEL form: in enforce mode a MutatingAdmissionPolicy where
/// served, in warn mode a ValidatingAdmissionPolicy that warns where served, else the webhook.
fn mutation_engine_of(w: &WebhookDefinition, features: HostedFeatures) -> (Engine, Option<String>) {
    let why_not = match w.mode {
        Mode::Warn if !features.admission_policies => Some(
            "this hosted kube-apiserver does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, which warns for a mutation in warn mode",
        ),
        Mode::Warn => None,
        _ if !features.mutating_policies => Some(
            "this hosted kube-apiserver does not serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy",
        ),
        _ => None,
    };
    match (w.engine, why_not) {
        (GuardEngine::Auto | GuardEngine::Policy | GuardEngine::Static, None) => {
            (Engine::Policy, None)
        }
        (GuardEngine::Policy, Some(why)) => (
            Engine::Webhook,
            Some(format!(
                "{} asks for engine policy, but {why}; its webhook guards instead",
                w.name
            )),
        ),
        (_, _) => (Engine::Webhook, None),
    }
}

/// The engine that carries `w` through the hosted cluster's API: where it is, `None` for a
/// guard the static guards carry alone; the engine `auto` would choose through the API for one
/// they carry with `staticGuards.secondLayer`.
pub(crate) fn api_engine(
    w: &WebhookDefinition,
    features: HostedFeatures,
    second_layer: bool,
) -> Option<Engine> {
    match engine_of(w, features).0 {
        Engine::Static if !second_layer => None,
        Engine::Static => Some(engine_as(w, features).0),
        e => Some(e),
    }
}

/// The policies and bindings one hosted cluster should hold, and the revision the probe asks
/// for (`None`: no policy at all).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdmissionPolicies {
    /// Guards first, the probe policy last (the order they are written in).
    pub policies: Vec<ValidatingAdmissionPolicy>,
    pub bindings: Vec<ValidatingAdmissionPolicyBinding>,
    pub revision: Option<String>,
    /// The mutating policies and their bindings, in the same order. k8s-openapi's types are of
    /// Kubernetes 1.33, which has no v1 MutatingAdmissionPolicy: they are kept dynamic
    /// (`mutating_resource`, `mutating_binding_resource`).
    pub mutating: Vec<DynamicObject>,
    pub mutating_bindings: Vec<DynamicObject>,
    /// The revision the mutating probe asks for (`None`: no mutating policy at all).
    pub mutating_revision: Option<String>,
}

/// `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy, for a dynamic API.
pub fn mutating_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingAdmissionPolicy",
        ),
        "mutatingadmissionpolicies",
    )
}

/// `admissionregistration.k8s.io/v1` MutatingAdmissionPolicyBinding, for a dynamic API.
pub fn mutating_binding_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingAdmissionPolicyBinding",
        ),
        "mutatingadmissionpolicybindings",
    )
}

impl AdmissionPolicies {
    /// The guard policies' names (the probe's left out).
    pub fn guards(&self) -> impl Iterator<Item = &str> {
        self.policies
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .filter(|n| *n != probe_name())
    }

    /// The mutating policies' names: the mutations carried by policies.
    pub fn mutations(&self) -> impl Iterator<Item = &str> {
        self.mutating
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .filter(|n| *n != probe_name())
    }
}

/// The probe policy's (and binding's) name: the probe webhook's.
pub(crate) fn probe_name() -> &'static str {
    guards::probe::ROW.name
}

/// A mutation in warn mode as a validating guard: its validation fails where the object needs
/// the change, with the words the service warns in (`message` in `guard_policy`). `None`
/// for a validating guard, a mutation in another mode, and one without a change in CEL here.
fn warned_mutation(
    w: &WebhookDefinition,
    guard: &dyn guards::Guard,
    settings: &Settings,
) -> Option<CelForm> {
    if w.mode != Mode::Warn || !guard.mutates_in_cel() {
        return None;
    }
    let form = guard.mutation(settings)?;
    Some(CelForm {
        expression: format!("!({})", form.applies),
        message: guards::cel::string(&denial::fill(denial::WOULD_MUTATE, &[("guard", &w.name)])),
    })
}

fn guard_policy(
    w: &WebhookDefinition,
    name: &str,
    form: &CelForm,
    conditions: &[Value],
    hcp_namespace: &str,
) -> Value {
    let mutation = guards::for_path(&w.path).is_some_and(|g| g.mutates_in_cel());
    let message = match w.mode {
        // Its message is already the service's warning.
        Mode::Warn if mutation => form.message.clone(),
        Mode::Warn => guards::cel::message(
            denial::WARN,
            &[
                ("guard", &guards::cel::string(&w.name)),
                ("message", &form.message),
            ],
        ),
        Mode::Enforce | Mode::Off => form.message.clone(),
    };
    let mut spec = json!({
        "failurePolicy": failure_policy(w.failure_policy),
        "matchConstraints": guard_constraints(w),
        "validations": [{
            "expression": form.expression,
            "messageExpression": message,
            // Shown only if the message expression itself fails.
            "message": format!("hcp-fleet: {} denied this request", w.name),
            "reason": "Forbidden",
        }],
    });
    if !conditions.is_empty() {
        spec["matchConditions"] = json!(conditions);
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": owned_metadata(name, hcp_namespace),
        "spec": spec,
    })
}

/// What a guard's policy, validating or mutating, matches: its rules and its guarded
/// selectors, as its webhook entry does.
fn guard_constraints(w: &WebhookDefinition) -> Value {
    json!({
        "resourceRules": rules_json(&w.rules),
        "matchPolicy": "Equivalent",
        "namespaceSelector": guarded_namespace_selector(w.namespace_selector.as_ref(), guards::scope_of(&w.path)),
        "objectSelector": guarded_object_selector(w.object_selector.as_ref()),
    })
}

/// A mutation's policy, named after its guard: the exemptions, then whether the object needs
/// the change, as `matchConditions`; the change as an apply configuration. Reinvoked if a
/// later mutation changes the object, so a webhook or policy that runs after it cannot take
/// the change back.
fn mutating_policy(
    w: &WebhookDefinition,
    name: &str,
    form: &MutationForm,
    mut conditions: Vec<Value>,
    hcp_namespace: &str,
) -> Value {
    conditions.push(json!({"name": NEEDS_CHANGE, "expression": form.applies}));
    let mut policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": owned_metadata(name, hcp_namespace),
        "spec": {
            "failurePolicy": failure_policy(w.failure_policy),
            "matchConstraints": guard_constraints(w),
            "matchConditions": conditions,
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {"expression": form.apply_configuration},
            }],
            "reinvocationPolicy": "IfNeeded",
        },
    });
    // Left out when empty: the API server keeps no empty list, and one rendered would read as
    // drift.
    if !form.variables.is_empty() {
        policy["spec"]["variables"] = form
            .variables
            .iter()
            .map(|(name, expression)| json!({"name": name, "expression": expression}))
            .collect();
    }
    policy
}

/// The name of a mutating policy's last matchCondition: the object needs the change.
pub const NEEDS_CHANGE: &str = "needs-change";

pub(crate) fn mutating_binding(name: &str, hcp_namespace: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": owned_metadata(name, hcp_namespace),
        "spec": {"policyName": name},
    })
}

fn binding(name: &str, actions: &[&str], hcp_namespace: &str, revision: Option<&str>) -> Value {
    let mut spec = json!({"policyName": name, "validationActions": actions});
    if let Some(rev) = revision {
        spec["matchResources"] = json!({
            "objectSelector": {"matchLabels": {PROBE_REVISION_LABEL: rev}},
        });
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": owned_metadata(name, hcp_namespace),
        "spec": spec,
    })
}

/// What a probe policy matches: a ConfigMap created with `PROBE_LABEL: value` and the
/// revision it asks for.
pub(crate) fn probe_constraints(value: &str, revision: &str) -> Value {
    json!({
        "resourceRules": [{
            "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
            "resources": ["configmaps"],
        }],
        "objectSelector": {"matchLabels": {
            PROBE_LABEL: value,
            PROBE_REVISION_LABEL: revision,
        }},
    })
}

/// The probe policy: denies only a labelled ConfigMap carrying `revision`, with
/// `POLICY_PROBE_ANSWER`. Its binding selects the same revision. Both are written after every
/// guard policy and binding, and the API server reads each kind in the order it was written, so
/// an answer for this revision proves it runs all of them (docs/architecture.md).
fn probe_policy(name: &str, hcp_namespace: &str, revision: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": owned_metadata(name, hcp_namespace),
        "spec": {
            // A probe that cannot be evaluated must not pass for an answer.
            "failurePolicy": "Fail",
            "matchConstraints": probe_constraints(POLICY_PROBE_VALUE, revision),
            "validations": [{"expression": "false", "message": POLICY_PROBE_ANSWER, "reason": "Forbidden"}],
        },
    })
}

pub(crate) fn render(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    features: HostedFeatures,
) -> Result<AdmissionPolicies, WebhookRenderError> {
    match super::shared_policies::of(cfg, settings, features) {
        Some(shared) => shared.for_namespace(hcp_namespace),
        None => render_alone(cfg, settings, hcp_namespace, features),
    }
}

/// `render` for one HCP from scratch: what `shared_policies` must give, byte for byte (its
/// tests hold it there), and its way where it cannot (`shared_policies::of`).
pub(crate) fn render_alone(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    features: HostedFeatures,
) -> Result<AdmissionPolicies, WebhookRenderError> {
    let mut set = typed(
        render_json(cfg, settings, hcp_namespace, features),
        hcp_namespace,
    )?;
    let err = |e: serde_json::Error| WebhookRenderError {
        namespace: hcp_namespace.to_string(),
        reason: e.to_string(),
    };
    let (mutating, revision) = render_mutating(cfg, settings, hcp_namespace, features);
    for (policy, binding) in mutating {
        set.mutating
            .push(serde_json::from_value(policy).map_err(err)?);
        set.mutating_bindings
            .push(serde_json::from_value(binding).map_err(err)?);
    }
    set.mutating_revision = revision;
    Ok(set)
}

/// The mutating policies and bindings of the mutations `engine_of` gives to policies, then (if
/// there is any) the mutating probe's of their revision, and that revision.
fn render_mutating(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    features: HostedFeatures,
) -> (Vec<(Value, Value)>, Option<String>) {
    let set = guard_mutations(cfg, settings, hcp_namespace, features);
    with_mutating_probe(set, probe_name(), hcp_namespace, mutating_probe_policy)
}

/// The API-side mutating probe's policy and binding for `revision`.
pub(crate) fn mutating_probe(hcp_namespace: &str, revision: &str) -> (Value, Value) {
    (
        mutating_probe_policy(probe_name(), hcp_namespace, revision),
        mutating_binding(probe_name(), hcp_namespace),
    )
}

/// A set of mutating policies and bindings, then (if there is any) the probe `probe` renders
/// for its revision, named `name`, and bound; and that revision. The API-side set and the
/// static one (`hosted::static_guards`) differ only in the probe.
pub(crate) fn with_mutating_probe(
    mut set: Vec<(Value, Value)>,
    name: &str,
    hcp_namespace: &str,
    probe: fn(&str, &str, &str) -> Value,
) -> (Vec<(Value, Value)>, Option<String>) {
    let revision = revision_of(set.iter().flat_map(|(p, b)| [p, b]));
    if let Some(rev) = &revision {
        set.push((
            probe(name, hcp_namespace, rev),
            mutating_binding(name, hcp_namespace),
        ));
    }
    (set, revision)
}

/// A content hash of a set of rendered objects (guard policies and bindings, or webhooks), the
/// revision its probe selects (`None`: an empty set, nothing to probe).
pub(crate) fn revision_of<'a>(objects: impl Iterator<Item = &'a Value>) -> Option<String> {
    set_text(objects).map(|text| revision_of_text(&text))
}

/// A set of rendered objects as `revision_of` hashes it (`None`: an empty set).
pub(crate) fn set_text<'a>(objects: impl Iterator<Item = &'a Value>) -> Option<Vec<u8>> {
    // Written as the array of them, without copying them into one (the same bytes): the copy
    // was a percent of a restarted agent's CPU at 3,000 HCPs (`make bench`, perf).
    let all: Vec<&Value> = objects.collect();
    if all.is_empty() {
        return None;
    }
    serde_json::to_vec(&all).ok()
}

/// The revision of a set written by `set_text`.
pub(crate) fn revision_of_text(text: &[u8]) -> String {
    hcp_fleet_model::compare::stable_hash(&[text])
}

/// The mutating probe: writes its revision into `MUTATING_PROBE_ANSWER` of a labelled
/// ConfigMap carrying that revision. Written after every mutating policy and binding, and the
/// API server reads each kind in the order it was written, so the answer proves it runs all of
/// them, as the validating probe does for the validating ones.
fn mutating_probe_policy(name: &str, hcp_namespace: &str, revision: &str) -> Value {
    probe_mutating_policy(
        name,
        hcp_namespace,
        probe_constraints(MUTATING_PROBE_VALUE, revision),
        json!({
            "patchType": "ApplyConfiguration",
            "applyConfiguration": {"expression": format!(
                "Object{{metadata: Object.metadata{{annotations: {{{}: {}}}}}}}",
                guards::cel::string(MUTATING_PROBE_ANSWER),
                guards::cel::string(revision),
            )},
        }),
    )
}

/// A probe MutatingAdmissionPolicy: `mutation` on what `constraints` match, never reinvoked.
/// A probe that cannot be evaluated must not pass for an answer: `failurePolicy: Fail`.
pub(crate) fn probe_mutating_policy(
    name: &str,
    hcp_namespace: &str,
    constraints: Value,
    mutation: Value,
) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": owned_metadata(name, hcp_namespace),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": constraints,
            "mutations": [mutation],
            "reinvocationPolicy": "Never",
        },
    })
}

pub(crate) fn guard_mutations(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    features: HostedFeatures,
) -> Vec<(Value, Value)> {
    // A mutation in warn mode is a validating policy (`render_set`); off is not active.
    cfg.active_webhooks()
        .filter(|w| {
            w.mode == Mode::Enforce
                && api_engine(w, features, cfg.static_guards.second_layer) == Some(Engine::Policy)
        })
        .filter_map(|w| guard_mutation(w, &w.name, settings, hcp_namespace))
        .collect()
}

/// The mutating policy and binding of the mutation `w` under `settings`, named `name` (the
/// guard's, with the static suffix in the files), if it has a CEL form there.
pub(crate) fn guard_mutation(
    w: &WebhookDefinition,
    name: &str,
    settings: &Settings,
    hcp_namespace: &str,
) -> Option<(Value, Value)> {
    let guard = guards::for_path(&w.path)?;
    let form = guard.mutation(settings)?;
    let conditions = exemptions::conditions(settings, &w.path, guard.scope());
    Some((
        mutating_policy(w, name, &form, conditions, hcp_namespace),
        mutating_binding(name, hcp_namespace),
    ))
}

/// A rendered set (`render_set`) in k8s-openapi's typed structs.
pub(crate) fn typed(
    (policies, bindings, revision): (Vec<Value>, Vec<Value>, Option<String>),
    hcp_namespace: &str,
) -> Result<AdmissionPolicies, WebhookRenderError> {
    let err = |e: serde_json::Error| WebhookRenderError {
        namespace: hcp_namespace.to_string(),
        reason: e.to_string(),
    };
    Ok(AdmissionPolicies {
        policies: policies
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()
            .map_err(err)?,
        bindings: bindings
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()
            .map_err(err)?,
        revision,
        mutating: Vec::new(),
        mutating_bindings: Vec::new(),
        mutating_revision: None,
    })
}

/// The policies and bindings as JSON, before they are typed (a unit test holds every field of
/// them to what k8s-openapi's structs know, so none is dropped by a misspelling).
fn render_json(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    features: HostedFeatures,
) -> (Vec<Value>, Vec<Value>, Option<String>) {
    render_set(cfg, settings, hcp_namespace, on_policies(cfg, features), "")
}

/// Which guards the API-side set holds: those `api_engine` puts on admission policies.
pub(crate) fn on_policies(
    cfg: &AgentConfig,
    features: HostedFeatures,
) -> impl Fn(&WebhookDefinition) -> bool + '_ {
    move |w| api_engine(w, features, cfg.static_guards.second_layer) == Some(Engine::Policy)
}

/// The policies and bindings of the guards `pick` chooses, each named after its guard with
/// `suffix` added, then (if there is any) the probe's of their revision: the API-side set
/// (no suffix) or the static one (`hosted::static_guards`).
pub(crate) fn render_set(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    pick: impl Fn(&WebhookDefinition) -> bool,
    suffix: &str,
) -> (Vec<Value>, Vec<Value>, Option<String>) {
    let (mut policies, mut bindings) = guard_set(cfg, settings, hcp_namespace, pick, suffix);
    let revision = revision_of(policies.iter().chain(&bindings));
    if let Some(rev) = &revision {
        let (policy, binding) = probe(suffix, hcp_namespace, rev);
        policies.push(policy);
        bindings.push(binding);
    }
    (policies, bindings, revision)
}

/// `render_set` without the probe: the guards' policies and bindings alone.
pub(crate) fn guard_set(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    pick: impl Fn(&WebhookDefinition) -> bool,
    suffix: &str,
) -> (Vec<Value>, Vec<Value>) {
    let mut policies = Vec::new();
    let mut bindings = Vec::new();
    for w in cfg.active_webhooks() {
        if !pick(w) {
            continue;
        }
        let Some(guard) = guards::for_path(&w.path) else {
            continue;
        };
        let Some(form) = guard
            .cel(settings)
            .or_else(|| warned_mutation(w, guard, settings))
        else {
            continue;
        };
        let actions: &[&str] = match w.mode {
            Mode::Enforce => &["Deny"],
            Mode::Warn => &["Warn", "Audit"],
            Mode::Off => continue,
        };
        let name = format!("{}{suffix}", w.name);
        let conditions = exemptions::conditions(settings, &w.path, guard.scope());
        policies.push(guard_policy(w, &name, &form, &conditions, hcp_namespace));
        bindings.push(binding(&name, actions, hcp_namespace, None));
    }
    (policies, bindings)
}

/// The validating probe's policy and binding for `revision`, named after the probe with
/// `suffix` added.
pub(crate) fn probe(suffix: &str, hcp_namespace: &str, revision: &str) -> (Value, Value) {
    let name = format!("{}{suffix}", probe_name());
    (
        probe_policy(&name, hcp_namespace, revision),
        binding(&name, &["Deny"], hcp_namespace, Some(revision)),
    )
}

/// Does the live policy or binding still say what was rendered? Its spec compared on the
/// fields rendered (server defaults are not drift), its labels and annotations likewise.
/// The names the agent gives admission policies and bindings in a hosted cluster: each is
/// named after its guard's webhook, so every built-in guard's and every configured webhook's
/// (a guard that moved to its webhook, or is off, may still have one from before). What the
/// agent lists, prunes and uninstalls is held to these: a tenant can label objects of their own
/// like the agent's.
pub fn names_ours(webhooks: &[WebhookDefinition]) -> std::collections::BTreeSet<String> {
    guards::ALL
        .iter()
        .map(|g| g.row().name.to_string())
        .chain(webhooks.iter().map(|w| w.name.clone()))
        .collect()
}

/// The names the agent may have given mutating admission policies and bindings in a hosted
/// cluster: the probe's, and each guard's (built in or configured) whose change has a CEL form,
/// the only guards `guard_mutations` renders a mutating policy for. A restarted agent reads
/// these by name, not all of `names_ours`: at 3,000 HCPs the mutating kinds' names of the
/// validating guards were a fifth of its requests to each hosted cluster, always absent. A
/// guard that loses its CEL change must keep its name here for as long as an older agent may
/// have written its policy.
pub fn mutating_names_ours(webhooks: &[WebhookDefinition]) -> std::collections::BTreeSet<String> {
    guards::ALL
        .iter()
        .filter(|g| guards::has_mutation_form(g.row().path))
        .map(|g| g.row().name.to_string())
        .chain(
            webhooks
                .iter()
                .filter(|w| guards::has_mutation_form(&w.path))
                .map(|w| w.name.clone()),
        )
        .chain(std::iter::once(probe_name().to_string()))
        .collect()
}

/// What the API server's type check (`status.typeChecking`, written by kube-controller-manager)
/// found wrong in a policy's expressions, one line per warning.
pub fn type_warnings(p: &ValidatingAdmissionPolicy) -> Vec<String> {
    p.status
        .as_ref()
        .and_then(|s| s.type_checking.as_ref())
        .and_then(|t| t.expression_warnings.as_ref())
        .map(|ws| {
            ws.iter()
                .map(|w| format!("{}: {}", w.field_ref, w.warning.trim()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mutating names read by name are the probe's and the guards' with a CEL change, all
    /// of them among the names the agent may use at all, and every name a mutating policy is
    /// rendered under is among them.
    #[test]
    fn mutating_names_are_the_probe_and_the_guards_that_change_in_cel() {
        let cfg = AgentConfig::default();
        let all = names_ours(&cfg.webhooks);
        let mutating = mutating_names_ours(&cfg.webhooks);
        assert!(mutating.is_subset(&all));
        assert!(mutating.contains(probe_name()));
        for g in guards::ALL {
            let row = g.row();
            if row.name == probe_name() {
                continue;
            }
            assert_eq!(
                mutating.contains(row.name),
                guards::has_mutation_form(row.path),
                "{}",
                row.name
            );
        }
        assert!(
            mutating.len() < all.len(),
            "the validating guards are left out"
        );
        let features = HostedFeatures {
            admission_policies: true,
            mutating_policies: true,
            match_conditions: true,
            ..HostedFeatures::default()
        };
        let settings = Settings::from(&cfg);
        let (rendered, _) = render_mutating(&cfg, &settings, "clusters-a", features);
        for (p, b) in &rendered {
            for o in [p, b] {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                assert!(mutating.contains(name), "{name} is rendered but not read");
            }
        }
    }
    use hcp_fleet_guards::review::decode;
    use hcp_fleet_webhook::decision::decide;

    fn served() -> HostedFeatures {
        HostedFeatures {
            match_conditions: true,
            admission_policies: true,
            mutating_policies: true,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
        }
    }

    fn names(p: &AdmissionPolicies) -> Vec<String> {
        p.policies
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect()
    }

    #[test]
    fn every_guard_with_a_cel_form_becomes_a_policy_where_served() {
        let cfg = AgentConfig::default();
        let p = render(&cfg, &Settings::from(&cfg), "clusters-a", served()).expect("render");
        // And each mutation in warn mode (the Service annotation's default), as a policy that
        // warns.
        let s = Settings::from(&cfg);
        let want: Vec<String> = guards::ALL
            .iter()
            .filter(|g| {
                g.cel(&s).is_some()
                    || (g.row().definition().mode == Mode::Warn && g.mutation(&s).is_some())
            })
            .map(|g| g.row().name.to_string())
            .chain([probe_name().to_string()])
            .collect();
        assert_eq!(names(&p), want);
        assert_eq!(p.bindings.len(), p.policies.len());
        for (pol, b) in p.policies.iter().zip(&p.bindings) {
            assert_eq!(pol.metadata.name, b.metadata.name);
            let spec = b.spec.as_ref().expect("spec");
            assert_eq!(spec.policy_name.as_ref(), pol.metadata.name.as_ref());
        }
        // Not served: nothing, and no revision to probe.
        let none = render(
            &cfg,
            &Settings::from(&cfg),
            "clusters-a",
            HostedFeatures::default(),
        )
        .expect("render");
        assert!(none.policies.is_empty() && none.revision.is_none());
    }

    /// A guard asking for engine static: no API-side object where the static guards are in
    /// force, unless `staticGuards.secondLayer` keeps one (then what `auto` chooses); what `auto`
    /// chooses where they are not, with a note saying why.
    #[test]
    fn a_static_guard_has_an_api_side_object_only_as_a_second_layer_or_a_fallback() {
        let rbac = "protected-rbac.hcp-fleet.openshift.io";
        let mut cfg = AgentConfig::default();
        for w in &mut cfg.webhooks {
            if w.name == rbac {
                w.engine = GuardEngine::Static;
            }
        }
        let in_force = HostedFeatures {
            static_guards: true,
            static_mutating: true,
            static_offered: false,
            ..served()
        };
        let has = |cfg: &AgentConfig, f: HostedFeatures| {
            names(&render(cfg, &Settings::from(cfg), "ns", f).expect("render"))
                .contains(&rbac.to_string())
        };
        let w = cfg
            .webhooks
            .iter()
            .find(|w| w.name == rbac)
            .expect("rbac")
            .clone();
        assert_eq!(engine_of(&w, in_force), (Engine::Static, None));
        assert!(!has(&cfg, in_force));
        let mut layered = cfg.clone();
        layered.static_guards.second_layer = true;
        assert!(has(&layered, in_force));
        assert_eq!(api_engine(&w, in_force, true), Some(Engine::Policy));
        assert_eq!(api_engine(&w, in_force, false), None);
        // Not in force: auto's choice, and why.
        let (engine, note) = engine_of(&w, served());
        assert_eq!(engine, Engine::Policy);
        assert!(
            note.as_deref()
                .is_some_and(|n| n.contains("asks for engine static")),
            "{note:?}"
        );
        assert!(has(&cfg, served()));
        // A server without admission policies: the webhook.
        let old = HostedFeatures::default();
        assert_eq!(engine_of(&w, old).0, Engine::Webhook);
        let hooks = crate::hosted::webhooks::render(&cfg, "ns", "https://x", "ca", old, None)
            .expect("render");
        assert!(
            hooks
                .validating
                .iter()
                .flat_map(|v| v.webhooks.iter().flatten())
                .any(|h| h.name == rbac)
        );
    }

    /// `auto` prefers the static guards where the hosted kube-apiserver mounts their files and
    /// the file that would carry the guard is proven in force, then a policy, then the webhook:
    /// a validating guard and a mutation in warn mode go by the validating file, a mutation in
    /// enforce mode by the mutating one; never a guard without a CEL form, never without both
    /// signs, and never a note (nothing was asked that is not done).
    #[test]
    fn auto_prefers_the_static_guards_where_offered_and_in_force() {
        let rbac = guards::protected_rbac::ROW.definition();
        let tags = guards::service_tags::ROW.definition();
        let mut warned_tags = tags.clone();
        warned_tags.mode = Mode::Warn;
        let probe = guards::probe::ROW.definition();
        assert_eq!(tags.mode, Mode::Enforce);
        let offered = |validating: bool, mutating: bool| HostedFeatures {
            static_guards: validating,
            static_mutating: mutating,
            static_offered: true,
            ..served()
        };
        for (w, validating, mutating, want) in [
            (&rbac, true, false, Engine::Static),
            (&rbac, false, true, Engine::Policy),
            (&tags, false, true, Engine::Static),
            (&tags, true, false, Engine::Policy),
            (&warned_tags, true, false, Engine::Static),
            (&warned_tags, false, true, Engine::Policy),
            (&probe, true, true, Engine::Webhook),
        ] {
            assert_eq!(
                engine_of(w, offered(validating, mutating)),
                (want, None),
                "{} with validating {validating}, mutating {mutating}",
                w.name
            );
        }
        // In force (for the guards asking for static) but not offered: auto stays on policies.
        let not_offered = HostedFeatures {
            static_offered: false,
            ..offered(true, true)
        };
        assert_eq!(engine_of(&rbac, not_offered), (Engine::Policy, None));
        assert_eq!(engine_of(&tags, not_offered), (Engine::Policy, None));
        // Offered and in force, a guard asking for policy or webhook keeps it.
        for (engine, want) in [
            (GuardEngine::Policy, Engine::Policy),
            (GuardEngine::Webhook, Engine::Webhook),
        ] {
            let w = WebhookDefinition {
                engine,
                ..rbac.clone()
            };
            assert_eq!(engine_of(&w, offered(true, true)), (want, None));
        }
        // Carried by the files, a guard has no API-side object unless kept as a second layer,
        // which is what auto chooses through the API.
        assert_eq!(api_engine(&tags, offered(true, true), false), None);
        assert_eq!(
            api_engine(&tags, offered(true, true), true),
            Some(Engine::Policy)
        );
        let mut cfg = AgentConfig::default();
        let all = render(&cfg, &Settings::from(&cfg), "ns", offered(true, true)).expect("render");
        assert!(
            all.policies.is_empty() && all.mutating.is_empty(),
            "{:?}",
            names(&all)
        );
        cfg.static_guards.second_layer = true;
        let layered =
            render(&cfg, &Settings::from(&cfg), "ns", offered(true, true)).expect("render");
        assert!(layered.mutations().any(|n| n == tags.name));
        assert!(layered.guards().any(|n| n == rbac.name));
    }

    /// A mutation asking for engine static: loaded from files where its file is in force, else
    /// what auto chooses through the API, with the note saying why.
    #[test]
    fn a_mutation_asking_for_static_falls_back_to_its_policy_with_a_note() {
        let mut tags = guards::service_tags::ROW.definition();
        tags.engine = GuardEngine::Static;
        let mutating = HostedFeatures {
            static_mutating: true,
            ..served()
        };
        assert_eq!(engine_of(&tags, mutating), (Engine::Static, None));
        let (e, note) = engine_of(&tags, served());
        assert_eq!(e, Engine::Policy);
        assert!(
            note.as_deref()
                .is_some_and(|n| n
                    .contains("asks for engine static, but the static guards are not in force")),
            "{note:?}"
        );
        let (e, _) = engine_of(&tags, HostedFeatures::default());
        assert_eq!(e, Engine::Webhook);
    }

    #[test]
    fn the_mode_is_the_bindings_actions_and_off_installs_nothing() {
        let mut cfg = AgentConfig::default();
        let actions = |cfg: &AgentConfig, name: &str| -> Option<Vec<String>> {
            let p = render(cfg, &Settings::from(cfg), "ns", served()).expect("render");
            p.bindings
                .iter()
                .find(|b| b.metadata.name.as_deref() == Some(name))
                .and_then(|b| b.spec.as_ref()?.validation_actions.clone())
        };
        let rbac = "protected-rbac.hcp-fleet.openshift.io";
        assert_eq!(actions(&cfg, rbac), Some(vec!["Deny".to_string()]));
        for w in &mut cfg.webhooks {
            if w.name == rbac {
                w.mode = Mode::Warn;
            }
        }
        assert_eq!(
            actions(&cfg, rbac),
            Some(vec!["Warn".to_string(), "Audit".to_string()])
        );
        for w in &mut cfg.webhooks {
            if w.name == rbac {
                w.mode = Mode::Off;
            }
        }
        assert_eq!(actions(&cfg, rbac), None);
        assert!(
            !names(&render(&cfg, &Settings::from(&cfg), "ns", served()).expect("render"))
                .contains(&rbac.to_string())
        );
    }

    #[test]
    fn engines_follow_the_setting_and_what_the_server_serves() {
        let mut w = guards::protected_rbac::ROW.definition();
        assert_eq!(engine_of(&w, served()).0, Engine::Policy);
        assert_eq!(engine_of(&w, HostedFeatures::default()).0, Engine::Webhook);
        w.engine = GuardEngine::Webhook;
        assert_eq!(engine_of(&w, served()), (Engine::Webhook, None));
        w.engine = GuardEngine::Policy;
        assert_eq!(engine_of(&w, served()), (Engine::Policy, None));
        let (e, note) = engine_of(&w, HostedFeatures::default());
        assert_eq!(e, Engine::Webhook);
        assert!(note.expect("note").contains("does not serve"));
        // The probe is a webhook, whatever auto finds; a mutation in warn mode (the Service
        // annotation's default) a validating policy wherever those are served, mutating
        // policies or not.
        assert_eq!(
            engine_of(&guards::probe::ROW.definition(), served()).0,
            Engine::Webhook
        );
        let annotation = guards::service_annotation::ROW.definition();
        assert_eq!(annotation.mode, Mode::Warn);
        let no_mutating = HostedFeatures {
            mutating_policies: false,
            ..served()
        };
        assert_eq!(engine_of(&annotation, no_mutating), (Engine::Policy, None));
        let (e, note) = engine_of(&annotation, HostedFeatures::default());
        assert_eq!(e, Engine::Webhook);
        assert!(note.is_none(), "auto asked for nothing: {note:?}");
    }

    #[test]
    fn the_revision_follows_the_guards_and_the_probe_selects_it() {
        let cfg = AgentConfig::default();
        let a = render(&cfg, &Settings::from(&cfg), "ns", served()).expect("render");
        let rev = a.revision.clone().expect("revision");
        assert!(rev.len() <= 63 && rev.chars().all(|c| c.is_ascii_alphanumeric()));
        let probe = a.bindings.last().expect("probe binding");
        let sel =
            serde_json::to_value(probe).expect("json")["spec"]["matchResources"]["objectSelector"]
                ["matchLabels"][PROBE_REVISION_LABEL]
                .clone();
        assert_eq!(sel, json!(rev));
        let mut changed = cfg.clone();
        changed
            .admission
            .protected_cluster_roles
            .push("extra".into());
        let b = render(&changed, &Settings::from(&changed), "ns", served()).expect("render");
        assert_ne!(b.revision, a.revision);
        assert_eq!(
            render(&cfg, &Settings::from(&cfg), "ns", served())
                .expect("render")
                .revision,
            a.revision
        );
    }

    #[test]
    fn exemptions_and_guardrail_selectors_are_on_every_guard() {
        let cfg = AgentConfig::default();
        let p = render(&cfg, &Settings::from(&cfg), "ns", served()).expect("render");
        for pol in &p.policies {
            let v = serde_json::to_value(pol).expect("json");
            let name = pol.metadata.name.clone().unwrap_or_default();
            if name == probe_name() {
                assert!(
                    v["spec"]["matchConditions"].is_null(),
                    "the probe answers anyone"
                );
                continue;
            }
            let scope = guards::ALL
                .iter()
                .find(|g| g.row().name == name)
                .expect("a guard")
                .scope();
            // The identity guards judge requests in the exempt namespaces too: that is where
            // an exempt identity would be minted.
            let (conditions, namespaces_left_out) = match scope {
                guards::Scope::Identities => (2, false),
                _ => (3, true),
            };
            assert_eq!(
                v["spec"]["matchConditions"].as_array().map(Vec::len),
                Some(conditions),
                "{name}"
            );
            let c = &v["spec"]["matchConstraints"];
            assert!(
                !c["objectSelector"]
                    .to_string()
                    .contains(super::super::objects::OWNED_LABEL),
                "no label exempts an object: {name}"
            );
            assert_eq!(
                c["namespaceSelector"].to_string().contains("kube-system"),
                namespaces_left_out,
                "{name}"
            );
            assert_eq!(v["spec"]["failurePolicy"], "Ignore", "{name}");
        }
    }

    /// The message a policy builds in CEL is the handler's text: checked by evaluating the
    /// message expression's literal parts around the handler's own values.
    #[test]
    fn policy_messages_are_the_handlers_messages() {
        let cfg = AgentConfig::default();
        let s = Settings::from(&cfg);
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole"},
                "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
                "name": "cluster-admin", "operation": "DELETE",
                "userInfo": {"username": "alice"}, "object": null, "oldObject": {},
            }
        }))
        .expect("json");
        let req = decode(&body).expect("decode");
        let (_, d) = decide(guards::protected_rbac::ROW.path, &req, &s).expect("hook");
        let message = guards::ALL[0].cel(&s).expect("cel").message;
        // Substitute what the API server would: the kind and name expressions' values.
        let evaluated = message
            .replace(
                "(request.resource.resource == 'clusterroles' ? 'ClusterRole' : 'ClusterRoleBinding')",
                "'ClusterRole'",
            )
            .replace(&format!("({})", guards::cel::STORED_NAME), "'cluster-admin'")
            .split(" + ")
            .map(|lit| lit.trim_matches('\'').replace("\\'", "'"))
            .collect::<String>();
        assert_eq!(Some(evaluated), d.message);
    }

    /// Every field rendered is one `admissionregistration.k8s.io/v1`'s typed structs know:
    /// typed and written back, each object is what was rendered (serde drops a misspelt field
    /// silently, which would install a guard without it).
    #[test]
    fn rendered_policies_round_trip_through_the_typed_v1_structs() {
        let mut warn = AgentConfig::default();
        warn.webhooks.iter_mut().for_each(|w| w.mode = Mode::Warn);
        for cfg in [AgentConfig::default(), warn] {
            let (policies, bindings, _) =
                render_json(&cfg, &Settings::from(&cfg), "clusters-a", served());
            assert!(!policies.is_empty() && policies.len() == bindings.len());
            for p in policies {
                let typed: ValidatingAdmissionPolicy =
                    serde_json::from_value(p.clone()).expect("typed");
                assert_eq!(serde_json::to_value(&typed).expect("json"), p);
            }
            for b in bindings {
                let typed: ValidatingAdmissionPolicyBinding =
                    serde_json::from_value(b.clone()).expect("typed");
                assert_eq!(serde_json::to_value(&typed).expect("json"), b);
            }
        }
        // The check is not blind: a misspelt field does not survive the round trip.
        let cfg = AgentConfig::default();
        let mut bad = render_json(&cfg, &Settings::from(&cfg), "ns", served())
            .0
            .remove(0);
        bad["spec"]["matchConstraint"] = json!({});
        let typed: ValidatingAdmissionPolicy = serde_json::from_value(bad.clone()).expect("typed");
        assert_ne!(serde_json::to_value(&typed).expect("json"), bad);
    }

    #[test]
    fn type_warnings_are_read_from_the_status() {
        let p: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "status": {"typeChecking": {"expressionWarnings": [
                {"fieldRef": "spec.validations[0].expression", "warning": "no such key: spec\n"}
            ]}},
        }))
        .expect("vap");
        assert_eq!(
            type_warnings(&p),
            ["spec.validations[0].expression: no such key: spec"]
        );
        assert!(type_warnings(&ValidatingAdmissionPolicy::default()).is_empty());
    }
}
