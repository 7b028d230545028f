//! The tampering table: every way a hosted cluster-admin could switch a guard off by editing
//! the agent's own objects, applied to every guard's rendered object of each kind, and held to
//! one rule: the drift comparison sees it. The e2e suite (`a_tenants_tampering_with_a_guard_…`)
//! and `make bench` (`e2e/bench_guards.rs`) do the same against a real API server for one guard.

use serde_json::{Value, json};

use super::objects::{self, HostedFeatures};
use super::webhooks::{self, HostedWebhooks};
use crate::config::AgentConfig;

/// A tampering: what it is, where it goes (under the object's per-guard part), its value, and
/// the managedFields path the tenant's `Update` then owns.
struct Tampering {
    what: &'static str,
    path: &'static [&'static str],
    value: Value,
}

fn t(what: &'static str, path: &'static [&'static str], value: Value) -> Tampering {
    Tampering { what, path, value }
}

fn selector() -> Value {
    json!({"matchLabels": {"tenant": "off"}})
}

/// Tamperings of one webhook entry of a configuration.
fn webhook_tamperings() -> Vec<Tampering> {
    vec![
        t("objectSelector merged in", &["objectSelector"], selector()),
        t(
            "namespaceSelector replaced",
            &["namespaceSelector"],
            selector(),
        ),
        t(
            "a matchCondition that never holds",
            &["matchConditions"],
            json!([{"name": "tenant", "expression": "false"}]),
        ),
        t("failurePolicy changed", &["failurePolicy"], json!("Fail")),
        t("matchPolicy changed", &["matchPolicy"], json!("Exact")),
        t(
            "rules narrowed to nothing",
            &["rules"],
            json!([{"operations": ["DELETE"], "apiGroups": ["none.example.com"], "apiVersions": ["v1"], "resources": ["nothing"]}]),
        ),
        t(
            "sideEffects changed",
            &["sideEffects"],
            json!("NoneOnDryRun"),
        ),
        t("timeoutSeconds changed", &["timeoutSeconds"], json!(29)),
        t(
            "URL pointed elsewhere",
            &["clientConfig"],
            json!({"url": "https://127.0.0.1:1/nowhere"}),
        ),
        t(
            "admissionReviewVersions changed",
            &["admissionReviewVersions"],
            json!(["v1beta1"]),
        ),
    ]
}

/// Tamperings of a ValidatingAdmissionPolicy's spec.
fn policy_tamperings() -> Vec<Tampering> {
    vec![
        t(
            "objectSelector in matchConstraints",
            &["matchConstraints", "objectSelector"],
            selector(),
        ),
        t(
            "namespaceSelector in matchConstraints",
            &["matchConstraints", "namespaceSelector"],
            selector(),
        ),
        t(
            "resourceRules narrowed",
            &["matchConstraints", "resourceRules"],
            json!([{"operations": ["DELETE"], "apiGroups": ["none.example.com"], "apiVersions": ["v1"], "resources": ["nothing"]}]),
        ),
        t(
            "validations made true",
            &["validations"],
            json!([{"expression": "true"}]),
        ),
        t(
            "a matchCondition that never holds",
            &["matchConditions"],
            json!([{"name": "tenant", "expression": "false"}]),
        ),
        t("failurePolicy Ignore", &["failurePolicy"], json!("Ignore")),
        t(
            "a variable added",
            &["variables"],
            json!([{"name": "x", "expression": "true"}]),
        ),
        t(
            "a paramKind added",
            &["paramKind"],
            json!({"apiVersion": "v1", "kind": "ConfigMap"}),
        ),
        t(
            "an auditAnnotation added",
            &["auditAnnotations"],
            json!([{"key": "x", "valueExpression": "'y'"}]),
        ),
        t(
            "excludeResourceRules added",
            &["matchConstraints", "excludeResourceRules"],
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]),
        ),
    ]
}

/// Tamperings of a binding's spec.
fn binding_tamperings() -> Vec<Tampering> {
    vec![
        t(
            "matchResources added",
            &["matchResources"],
            json!({"objectSelector": selector()}),
        ),
        t(
            "validationActions set to Audit",
            &["validationActions"],
            json!(["Audit"]),
        ),
        t(
            "policyName pointed elsewhere",
            &["policyName"],
            json!("tenant-policy"),
        ),
        t(
            "a paramRef added",
            &["paramRef"],
            json!({"name": "x", "parameterNotFoundAction": "Allow"}),
        ),
    ]
}

/// Tamperings of a MutatingAdmissionPolicy's spec: those of a validating policy's that its
/// spec has too (a mutating policy has no validations, audit annotations or exclusions), and
/// its own.
fn mutating_policy_tamperings() -> Vec<Tampering> {
    const SHARED: &[&str] = &[
        "objectSelector in matchConstraints",
        "a matchCondition that never holds",
        "a variable added",
        "a paramKind added",
    ];
    let mut ts: Vec<Tampering> = policy_tamperings()
        .into_iter()
        .filter(|t| SHARED.contains(&t.what))
        .collect();
    ts.extend([
        t(
            "resourceRules narrowed",
            &["matchConstraints", "resourceRules"],
            json!([{"operations": ["CREATE"], "apiGroups": ["none.example.com"], "apiVersions": ["v1"], "resources": ["nothing"]}]),
        ),
        t(
            "mutations made a no-op",
            &["mutations"],
            json!([{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{}"}}]),
        ),
        t("failurePolicy changed", &["failurePolicy"], json!("Fail")),
        t(
            "reinvocationPolicy changed",
            &["reinvocationPolicy"],
            json!("Never"),
        ),
    ]);
    assert_eq!(ts.len(), 8, "every shared tampering found by name");
    ts
}

/// Tamperings of a MutatingAdmissionPolicyBinding's spec: a validating binding's, but for
/// its validationActions, which a mutating binding has not.
fn mutating_binding_tamperings() -> Vec<Tampering> {
    binding_tamperings()
        .into_iter()
        .filter(|t| t.path != ["validationActions"])
        .collect()
}

/// `fieldsV1` for `path` under `prefix` (a managedFields entry's tree).
fn fields(prefix: Vec<String>, path: &[&str]) -> Value {
    let mut tree = json!({});
    for key in prefix
        .into_iter()
        .chain(path.iter().map(|p| format!("f:{p}")))
        .rev()
    {
        tree = json!({ key: tree });
    }
    tree
}

/// The value at `path`, to tell a tampering that changes nothing (the rendered value written
/// again: drift only by another manager's ownership, which the agent's claimed name hides).
fn get<'a>(obj: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(obj, |at, p| &at[*p])
}

fn set(obj: &mut Value, path: &[&str], value: Value) {
    let mut at = obj;
    for p in &path[..path.len() - 1] {
        at = &mut at[*p];
    }
    at[path[path.len() - 1]] = value;
}

/// Who writes a tampering: a tenant's own manager, or the agent's name claimed by a client
/// (`?fieldManager=hcp-fleet-agent`), by update or by apply. The name proves nothing: each is
/// drift alike.
use crate::management::FIELD_MANAGER;

const WRITERS: &[(&str, &str)] = &[
    ("tenant-admin", "Update"),
    (FIELD_MANAGER, "Update"),
    (FIELD_MANAGER, "Apply"),
];

fn by((manager, operation): (&str, &str), fields_v1: Value) -> Value {
    json!([{"manager": manager, "operation": operation, "fieldsV1": fields_v1}])
}

fn rendered(features: HostedFeatures) -> HostedWebhooks {
    let cfg = AgentConfig::default();
    webhooks::render(
        &cfg,
        "clusters-a",
        &webhooks::default_url_base(&cfg, "clusters-a"),
        "CA-PEM",
        features,
        None,
    )
    .expect("render")
}

#[test]
fn every_tampering_of_every_guards_webhook_is_drift() {
    for features in [
        HostedFeatures::default(),
        HostedFeatures {
            match_conditions: true,
            admission_policies: false,
            mutating_policies: false,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
        },
    ] {
        let desired =
            serde_json::to_value(rendered(features).validating.expect("validating")).expect("json");
        assert!(objects::matches(&desired, &desired), "untouched matches");
        let entries = desired["webhooks"].as_array().expect("webhooks").len();
        assert!(entries >= 9, "every guard and the probe: {entries}");
        for i in 0..entries {
            let name = desired["webhooks"][i]["name"]
                .as_str()
                .expect("name")
                .to_string();
            for tm in webhook_tamperings() {
                let same = *get(&desired["webhooks"][i], tm.path) == tm.value;
                for writer in WRITERS.iter().filter(|w| !same || w.0 != FIELD_MANAGER) {
                    let mut live = desired.clone();
                    set(&mut live["webhooks"][i], tm.path, tm.value.clone());
                    live["metadata"]["managedFields"] = by(
                        *writer,
                        fields(
                            vec!["f:webhooks".into(), format!("k:{{\"name\":\"{name}\"}}")],
                            tm.path,
                        ),
                    );
                    assert!(
                        !objects::matches(&desired, &live),
                        "{name}: {} by {writer:?} ({features:?}) not seen",
                        tm.what
                    );
                }
            }
            // A rule's scope narrowed to namespaced objects: a cluster-scoped guard then
            // matches nothing (the rendering leaves scope to the server's default, "*").
            for writer in WRITERS {
                let mut live = desired.clone();
                live["webhooks"][i]["rules"][0]["scope"] = json!("Namespaced");
                live["metadata"]["managedFields"] = by(*writer, json!({}));
                assert!(
                    !objects::matches(&desired, &live),
                    "{name}: scope by {writer:?} not seen"
                );
            }
        }
    }
}

#[test]
fn every_tampering_of_every_guards_policy_and_binding_is_drift() {
    let features = HostedFeatures {
        match_conditions: true,
        admission_policies: true,
        mutating_policies: true,
        static_guards: false,
        static_mutating: false,
        static_offered: false,
    };
    let r = rendered(features).policies;
    assert!(
        r.policies.len() >= 8,
        "every guard with a CEL form, and the probe"
    );
    assert!(
        r.mutating.len() >= 2,
        "every mutation with a CEL form, and the mutating probe"
    );
    for (objects, tamperings) in [
        (
            r.policies
                .iter()
                .map(|p| serde_json::to_value(p).expect("json"))
                .collect::<Vec<_>>(),
            policy_tamperings(),
        ),
        (
            r.bindings
                .iter()
                .map(|b| serde_json::to_value(b).expect("json"))
                .collect(),
            binding_tamperings(),
        ),
        (
            r.mutating
                .iter()
                .map(|p| serde_json::to_value(p).expect("json"))
                .collect(),
            mutating_policy_tamperings(),
        ),
        (
            r.mutating_bindings
                .iter()
                .map(|b| serde_json::to_value(b).expect("json"))
                .collect(),
            mutating_binding_tamperings(),
        ),
    ] {
        for desired in objects {
            assert!(objects::matches(&desired, &desired), "untouched matches");
            let name = desired["metadata"]["name"]
                .as_str()
                .expect("name")
                .to_string();
            for tm in &tamperings {
                let same = *get(&desired["spec"], tm.path) == tm.value;
                for writer in WRITERS.iter().filter(|w| !same || w.0 != FIELD_MANAGER) {
                    let mut live = desired.clone();
                    set(&mut live["spec"], tm.path, tm.value.clone());
                    live["metadata"]["managedFields"] =
                        by(*writer, fields(vec!["f:spec".into()], tm.path));
                    assert!(
                        !objects::matches(&desired, &live),
                        "{} {name}: {} by {writer:?} not seen",
                        desired["kind"],
                        tm.what
                    );
                }
            }
            if desired["spec"]["matchConstraints"]["resourceRules"].is_array() {
                for writer in WRITERS {
                    let mut live = desired.clone();
                    live["spec"]["matchConstraints"]["resourceRules"][0]["resourceNames"] =
                        json!(["nothing"]);
                    live["metadata"]["managedFields"] = by(*writer, json!({}));
                    assert!(
                        !objects::matches(&desired, &live),
                        "{name}: resourceNames by {writer:?} not seen"
                    );
                }
            }
        }
    }
}

/// The agent's objects as real servers store them (created from the rendering and read back:
/// `testdata/stored-*.json`) are what was rendered, their defaults included; and the same
/// stored objects tampered with under the agent's own manager name are not.
#[test]
fn stored_objects_of_real_servers_match_their_rendering_and_tampering_them_does_not() {
    const STORED: &[&str] = &[
        include_str!("testdata/stored-v1.20.2-webhooks.json"),
        include_str!("testdata/stored-v1.36.2-webhooks.json"),
        include_str!("testdata/stored-v1.36.2-policies.json"),
    ];
    let mut seen = 0;
    for text in STORED {
        let file: Value = serde_json::from_str(text).expect("stored objects parse");
        let server = file["server"].as_str().unwrap_or_default();
        for o in file["objects"].as_array().expect("objects") {
            let (kind, name) = (o["kind"].as_str().unwrap_or_default(), &o["name"]);
            let (rendered, stored) = (&o["rendered"], &o["stored"]);
            assert!(
                objects::matches(rendered, stored),
                "{server} {kind} {name}: stored differs from the rendering: {:?}",
                objects::differences(rendered, stored)
            );
            let mut tampered = stored.clone();
            match kind {
                "ValidatingAdmissionPolicy" => {
                    tampered["spec"]["matchConstraints"]["excludeResourceRules"] = json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]);
                }
                "ValidatingAdmissionPolicyBinding" => {
                    tampered["spec"]["policyName"] = json!("tenant");
                }
                _ => tampered["webhooks"][0]["rules"][0]["scope"] = json!("Namespaced"),
            }
            tampered["metadata"]["managedFields"] = by((FIELD_MANAGER, "Update"), json!({}));
            assert!(
                !objects::matches(rendered, &tampered),
                "{server} {kind} {name}: a tampering under the agent's name not seen"
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 2 + 2 + 20, "every stored object was checked");
}
