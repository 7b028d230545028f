//! The guards the hosted kube-apiserver loads from files (docs/static-guards.md): the same
//! ValidatingAdmissionPolicies, MutatingAdmissionPolicies and bindings the API-side engine
//! writes, named with the reserved suffix `.static.k8s.io`, which Kubernetes 1.36 with the
//! feature gate `ManifestBasedAdmissionControlConfig` (alpha; beta and on by default in 1.37)
//! loads from a directory per admission plugin and refuses to any API request. In HyperShift
//! the hosted kube-apiserver runs in the HCP namespace on the management cluster, so the files
//! come from a ConfigMap there, beside the agent, on the side a hosted cluster's admins cannot
//! reach.
//!
//! Rendered purely from the configuration and whether the hosted kube-apiserver's pod mounts
//! that ConfigMap (`offered`): the guards whose `engine` is `static`, and where offered those
//! on `auto` too, with their modes, exemptions and overrides as for the API-side policies
//! (`render_set` and `guard_mutation`, the same functions); and for each file a probe of its
//! revision that proves, through the server itself, which revision it has loaded.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::ObjectMeta;
use serde_json::{Value, json};

use super::admission_policies::{
    guard_mutation, probe_constraints, probe_mutating_policy, probe_name as api_probe_name,
    render_set, typed, with_mutating_probe,
};
use super::objects::WebhookRenderError;
use crate::config::AgentConfig;
use hcp_fleet_guards::Settings;
use hcp_fleet_guards::catalogue::{GuardEngine, STATIC_MUTATING_PROBE_VALUE, WebhookDefinition};
use hcp_fleet_model::Mode;
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};

/// The suffix Kubernetes reserves for admission objects loaded from files: the API refuses to
/// create, change or delete an object so named (with the feature gate on).
pub const SUFFIX: &str = ".static.k8s.io";
/// The ConfigMap in each HCP namespace that holds the files.
pub const CONFIG_MAP: &str = "hcp-fleet-static-guards";
/// Its key holding the validating policies and bindings (multi-document YAML; each document
/// JSON).
pub const POLICIES_KEY: &str = "policies.yaml";
/// Its key holding the mutating policies and bindings, likewise.
pub const MUTATING_POLICIES_KEY: &str = "mutating-policies.yaml";
/// Its key holding the admission configuration the kube-apiserver's
/// `--admission-control-config-file` names (or whose plugin entries are merged into the one it
/// has).
pub(crate) const ADMISSION_CONFIG_KEY: &str = "admission-config.yaml";
/// Under `staticGuards.mountPath`: where the policies key is mounted, the directory the
/// ValidatingAdmissionPolicy plugin reads. Each plugin's directory must hold nothing but its
/// own kinds, or the server refuses the whole directory.
pub const POLICIES_DIR: &str = "policies";
/// Under `staticGuards.mountPath`: where the mutating policies key is mounted, the directory
/// the MutatingAdmissionPolicy plugin reads.
pub const MUTATING_POLICIES_DIR: &str = "mutating-policies";
/// The annotation on the ConfigMap naming the revision its validating policies carry.
pub const REVISION_ANNOTATION: &str = "hcp-fleet.openshift.io/static-revision";
/// The annotation on the ConfigMap naming the revision its mutating policies carry.
pub const MUTATING_REVISION_ANNOTATION: &str = "hcp-fleet.openshift.io/static-mutating-revision";
/// HyperShift's hosted kube-apiserver Deployment in each HCP namespace (the
/// control-plane-operator's `kube-apiserver`): where its pod mounts the ConfigMap, the static
/// guards are offered to engine `auto`.
pub const KUBE_APISERVER: &str = "kube-apiserver";

/// The static probe policy's (and binding's) name; the static mutating probe's too (another
/// kind, so another name space).
pub fn probe_name() -> String {
    format!("{}{SUFFIX}", api_probe_name())
}

/// The policies and bindings one hosted kube-apiserver should load from files, and the
/// revision of each file (`None`: nothing in it; no ConfigMap where both are `None`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StaticGuards {
    /// Guards first, the probe policy last.
    pub(crate) policies: Vec<ValidatingAdmissionPolicy>,
    pub(crate) bindings: Vec<ValidatingAdmissionPolicyBinding>,
    pub revision: Option<String>,
    /// The mutating policies, then their bindings (guards first, the probe last), as JSON:
    /// k8s-openapi 1.33 has no v1 MutatingAdmissionPolicy.
    pub(crate) mutating: Vec<Value>,
    pub mutating_revision: Option<String>,
}

impl StaticGuards {
    /// The guards carried, validating and mutating (by their webhook's name; the probes left
    /// out).
    pub fn guards(&self) -> BTreeSet<String> {
        let mut all = self.validating_guards();
        all.extend(self.mutating_guards());
        all
    }

    /// The guards the validating file carries.
    pub fn validating_guards(&self) -> BTreeSet<String> {
        guard_names(
            self.policies
                .iter()
                .filter_map(|p| p.metadata.name.as_deref()),
        )
    }

    /// The mutations the mutating file carries.
    pub fn mutating_guards(&self) -> BTreeSet<String> {
        guard_names(
            self.mutating
                .iter()
                .filter(|v| v["kind"] == "MutatingAdmissionPolicy")
                .filter_map(|v| v.pointer("/metadata/name").and_then(Value::as_str)),
        )
    }

    /// Nothing to load: no ConfigMap is wanted.
    pub fn is_empty(&self) -> bool {
        self.revision.is_none() && self.mutating_revision.is_none()
    }
}

fn guard_names<'a>(names: impl Iterator<Item = &'a str>) -> BTreeSet<String> {
    let probe = probe_name();
    names
        .filter(|n| *n != probe)
        .filter_map(|n| n.strip_suffix(SUFFIX))
        .map(str::to_string)
        .collect()
}

/// Does `w` ask to be carried by the static guards?
pub fn is_static(w: &WebhookDefinition) -> bool {
    w.engine == GuardEngine::Static
}

/// Do the files carry `w`: asked for (`static`), or offered to `auto` (`offered`: the hosted
/// kube-apiserver's pod mounts the ConfigMap). A guard without a CEL form is left out by the
/// renderers (nothing to load).
pub fn carried(w: &WebhookDefinition, offered: bool) -> bool {
    is_static(w) || (offered && w.engine == GuardEngine::Auto)
}

/// Which file would carry `w`: the mutating one for a mutation in enforce mode; the validating
/// one for every other guard (a mutation in warn mode warns as a validating policy there, as
/// through the API).
pub fn in_mutating_file(w: &WebhookDefinition) -> bool {
    w.mode == Mode::Enforce && hcp_fleet_guards::has_mutation_form(&w.path)
}

/// Whether the hosted kube-apiserver's Deployment mounts the static guards' ConfigMap, as
/// HyperShift would once it wires the files (docs/static-guards.md): the sign that engine
/// `auto` may put guards there. Only the proof through the server says they are in force.
pub fn offered(kube_apiserver: &Deployment) -> bool {
    kube_apiserver
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.volumes.as_ref())
        .is_some_and(|vs| {
            vs.iter()
                .any(|v| v.config_map.as_ref().is_some_and(|c| c.name == CONFIG_MAP))
        })
}

pub fn render(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    offered: bool,
) -> Result<StaticGuards, WebhookRenderError> {
    let pick = |w: &WebhookDefinition| carried(w, offered);
    let set = typed(
        render_set(cfg, settings, hcp_namespace, pick, SUFFIX),
        hcp_namespace,
    )?;
    let (mutating, mutating_revision) = render_mutating(cfg, settings, hcp_namespace, offered);
    Ok(StaticGuards {
        policies: set.policies,
        bindings: set.bindings,
        revision: set.revision,
        mutating,
        mutating_revision,
    })
}

/// The mutating file: each carried mutation in enforce mode (in warn mode it warns from the
/// validating file), then the probe of their revision; policies first, then bindings.
fn render_mutating(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
    offered: bool,
) -> (Vec<Value>, Option<String>) {
    let pairs: Vec<(Value, Value)> = cfg
        .active_webhooks()
        .filter(|w| in_mutating_file(w) && carried(w, offered))
        .filter_map(|w| guard_mutation(w, &format!("{}{SUFFIX}", w.name), settings, hcp_namespace))
        .collect();
    let (pairs, revision) =
        with_mutating_probe(pairs, &probe_name(), hcp_namespace, mutating_probe_policy);
    let (policies, bindings): (Vec<Value>, Vec<Value>) = pairs.into_iter().unzip();
    (policies.into_iter().chain(bindings).collect(), revision)
}

/// The label the static mutating probe removes, which no probe request carries.
pub const STATIC_MUTATING_PROBE_LABEL: &str = "hcp-fleet-static-mutating-probe";

/// The static mutating probe: for a labelled ConfigMap carrying `revision`, a JSON patch that
/// removes a label the request does not carry, with `failurePolicy: Fail`, so the server
/// denies the request in its own words, naming this policy and its binding (`policy '<name>'
/// with binding '<name>' denied request: JSON Patch: …`; a failed `test` would not do: the
/// server skips a patch whose test fails). A mutation cannot be told apart by what it writes
/// (whatever a policy loaded from files writes, a tenant's webhook or policy running after it
/// can write too), but no object a tenant makes through the API can hold the reserved name.
/// Written after every mutating policy and binding of the file.
fn mutating_probe_policy(name: &str, hcp_namespace: &str, revision: &str) -> Value {
    probe_mutating_policy(
        name,
        hcp_namespace,
        probe_constraints(STATIC_MUTATING_PROBE_VALUE, revision),
        json!({
            "patchType": "JSONPatch",
            "jsonPatch": {"expression": format!(
                "[JSONPatch{{op: \"remove\", path: {}}}]",
                hcp_fleet_guards::cel::string(&format!("/metadata/labels/{STATIC_MUTATING_PROBE_LABEL}"))
            )},
        }),
    )
}

/// The admission configuration that has the ValidatingAdmissionPolicy and
/// MutatingAdmissionPolicy plugins load the files under `mount_path` (absolute;
/// `staticGuards.mountPath` is held to characters that need no quoting in YAML). The same
/// fields in 1.36 and 1.37 (`k8s.io/apiserver`, `policy/config/apis/policyconfig/v1`).
pub fn admission_configuration(mount_path: &str) -> String {
    let mut text = String::from(
        "apiVersion: apiserver.config.k8s.io/v1\n\
         kind: AdmissionConfiguration\n\
         plugins:\n",
    );
    for (plugin, dir) in [
        ("ValidatingAdmissionPolicy", POLICIES_DIR),
        ("MutatingAdmissionPolicy", MUTATING_POLICIES_DIR),
    ] {
        text.push_str(&format!(
            "- name: {plugin}\n\
             \x20 configuration:\n\
             \x20   apiVersion: apiserver.config.k8s.io/v1\n\
             \x20   kind: {plugin}Configuration\n\
             \x20   staticManifestsDir: {mount_path}/{dir}\n"
        ));
    }
    text
}

/// The validating policies file: each policy, then each binding, one JSON document each (JSON
/// is YAML; the server splits the file at `---`).
pub(crate) fn policies_file(g: &StaticGuards) -> Result<String, serde_json::Error> {
    let mut docs = Vec::new();
    for p in &g.policies {
        docs.push(with_types(
            serde_json::to_value(p)?,
            "ValidatingAdmissionPolicy",
        ));
    }
    for b in &g.bindings {
        docs.push(with_types(
            serde_json::to_value(b)?,
            "ValidatingAdmissionPolicyBinding",
        ));
    }
    documents(&docs)
}

/// The mutating policies file, likewise (empty where no mutation is carried: the server
/// reads an empty file as none).
pub(crate) fn mutating_policies_file(g: &StaticGuards) -> Result<String, serde_json::Error> {
    documents(&g.mutating)
}

fn documents(docs: &[Value]) -> Result<String, serde_json::Error> {
    if docs.is_empty() {
        return Ok(String::new());
    }
    let texts = docs
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n---\n") + "\n")
}

// k8s-openapi's structs serialize without apiVersion and kind; the server's strict decoder
// needs both.
fn with_types(mut v: Value, kind: &str) -> Value {
    if let Value::Object(m) = &mut v {
        m.insert(
            "apiVersion".into(),
            Value::String("admissionregistration.k8s.io/v1".into()),
        );
        m.insert("kind".into(), Value::String(kind.into()));
    }
    v
}

/// The ConfigMap that carries the files for one HCP namespace.
pub fn config_map(
    cfg: &AgentConfig,
    hcp_namespace: &str,
    g: &StaticGuards,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> Result<ConfigMap, WebhookRenderError> {
    let err = |e: serde_json::Error| WebhookRenderError {
        namespace: hcp_namespace.to_string(),
        reason: e.to_string(),
    };
    let policies = policies_file(g).map_err(err)?;
    let mutating = mutating_policies_file(g).map_err(err)?;
    let annotations: BTreeMap<String, String> = [
        (REVISION_ANNOTATION, &g.revision),
        (MUTATING_REVISION_ANNOTATION, &g.mutating_revision),
    ]
    .into_iter()
    .filter_map(|(k, r)| Some((k.to_string(), r.clone()?)))
    .collect();
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            namespace: Some(hcp_namespace.into()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.to_string(),
                MANAGED_BY_VALUE.to_string(),
            )])),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                ADMISSION_CONFIG_KEY.into(),
                admission_configuration(&cfg.static_guards.mount_path),
            ),
            (POLICIES_KEY.into(), policies),
            (MUTATING_POLICIES_KEY.into(), mutating),
        ])),
        ..Default::default()
    })
}

/// The guards a live ConfigMap's files carry; `None` where they cannot be read as the agent
/// writes them (someone else's edit: what the server loaded from them is then unknown). A
/// ConfigMap of an agent before the mutating file has no such key: none carried there.
pub fn guards_in(cm: &ConfigMap) -> Option<BTreeSet<String>> {
    let data = cm.data.as_ref()?;
    let mut names = Vec::new();
    for (key, kind) in [
        (POLICIES_KEY, "ValidatingAdmissionPolicy"),
        (MUTATING_POLICIES_KEY, "MutatingAdmissionPolicy"),
    ] {
        let text = match data.get(key) {
            Some(t) => t,
            None if key == MUTATING_POLICIES_KEY => continue,
            None => return None,
        };
        for doc in text.split("\n---\n").filter(|d| !d.trim().is_empty()) {
            let v: Value = serde_json::from_str(doc).ok()?;
            if v.get("kind").and_then(Value::as_str) == Some(kind) {
                names.push(v.pointer("/metadata/name")?.as_str()?.to_string());
            }
        }
    }
    Some(guard_names(names.iter().map(String::as_str)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_model::Mode;

    fn all_static() -> AgentConfig {
        let mut cfg = AgentConfig::default();
        for w in &mut cfg.webhooks {
            if hcp_fleet_guards::has_cel_form(&w.path) {
                w.engine = GuardEngine::Static;
            }
        }
        cfg
    }

    #[test]
    fn no_static_guard_renders_nothing() {
        let cfg = AgentConfig::default();
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a", false).expect("renders");
        assert_eq!(g, StaticGuards::default());
    }

    /// Every name ends with the reserved suffix, every binding names a policy of the set and
    /// no parameter (the server refuses both otherwise), and the probe's binding selects the
    /// set's revision.
    #[test]
    fn every_object_is_named_for_the_files_and_bound_within_the_set() {
        let cfg = all_static();
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a", false).expect("renders");
        let guards: Vec<_> = cfg
            .webhooks
            .iter()
            .filter(|w| w.engine == GuardEngine::Static)
            .map(|w| w.name.clone())
            .collect();
        assert_eq!(g.guards(), guards.iter().cloned().collect());
        assert_eq!(g.policies.len(), guards.len() + 1);
        let names: BTreeSet<String> = g
            .policies
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        for p in &g.policies {
            assert!(p.metadata.name.as_deref().unwrap_or("").ends_with(SUFFIX));
            assert!(p.spec.as_ref().is_some_and(|s| s.param_kind.is_none()));
        }
        for b in &g.bindings {
            let spec = b.spec.as_ref().expect("spec");
            assert!(b.metadata.name.as_deref().unwrap_or("").ends_with(SUFFIX));
            assert!(names.contains(spec.policy_name.as_deref().unwrap_or("")));
            assert!(spec.param_ref.is_none());
        }
        let probe = g
            .bindings
            .iter()
            .find(|b| b.metadata.name.as_deref() == Some(probe_name().as_str()))
            .expect("the probe's binding");
        let rev = g.revision.clone().expect("a revision");
        let selected = serde_json::to_value(probe).expect("json");
        assert_eq!(
            selected.pointer(&format!(
                "/spec/matchResources/objectSelector/matchLabels/{}",
                hcp_fleet_guards::catalogue::PROBE_REVISION_LABEL.replace('/', "~1")
            )),
            Some(&Value::String(rev))
        );
    }

    /// The file is what the server's strict decoder reads: each document round-trips through
    /// k8s-openapi's typed structs to the same JSON (no field the structs do not know), and says
    /// its apiVersion and kind.
    #[test]
    fn the_policies_file_round_trips_through_the_typed_structs() {
        let cfg = all_static();
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a", false).expect("renders");
        let text = policies_file(&g).expect("file");
        let docs: Vec<&str> = text.trim_end().split("\n---\n").collect();
        assert_eq!(docs.len(), g.policies.len() + g.bindings.len());
        for doc in docs {
            let v: Value = serde_json::from_str(doc).expect("each document is JSON");
            assert_eq!(v["apiVersion"], "admissionregistration.k8s.io/v1");
            let back = match v["kind"].as_str() {
                Some("ValidatingAdmissionPolicy") => serde_json::to_value(
                    serde_json::from_value::<ValidatingAdmissionPolicy>(v.clone()).expect("typed"),
                ),
                Some("ValidatingAdmissionPolicyBinding") => serde_json::to_value(
                    serde_json::from_value::<ValidatingAdmissionPolicyBinding>(v.clone())
                        .expect("typed"),
                ),
                other => panic!("unexpected kind {other:?}"),
            }
            .expect("json");
            assert_eq!(back, v);
        }
        let cm = config_map(&cfg, "clusters-a", &g, None).expect("configmap");
        assert_eq!(guards_in(&cm), Some(g.guards()));
    }

    /// A guard is static with the same decision as on the API side: the same expression,
    /// conditions, failure policy and actions; only the names differ. (The CEL parity tables
    /// in `cel_cases` therefore hold for it: they evaluate these same expressions.)
    #[test]
    fn a_static_guard_says_what_its_api_side_policy_says() {
        let mut cfg = all_static();
        if let Some(w) = cfg
            .webhooks
            .iter_mut()
            .find(|w| w.engine == GuardEngine::Static)
        {
            w.mode = Mode::Warn;
        }
        let settings = Settings::from(&cfg);
        let g = render(&cfg, &settings, "clusters-a", false).expect("renders");
        let mut api_cfg = cfg.clone();
        for w in &mut api_cfg.webhooks {
            if w.engine == GuardEngine::Static {
                w.engine = GuardEngine::Policy;
            }
        }
        let features = crate::hosted::objects::HostedFeatures {
            match_conditions: true,
            admission_policies: true,
            mutating_policies: true,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
        };
        let mut api = super::super::admission_policies::render(&api_cfg, &settings, "ns", features)
            .expect("renders");
        // The API side also warns for the Service annotation (a mutation, which no static
        // guard carries).
        let annotation = Some(hcp_fleet_guards::service_annotation::ROW.name);
        api.policies
            .retain(|p| p.metadata.name.as_deref() != annotation);
        assert_eq!(api.policies.len(), g.policies.len());
        for (s, a) in g.policies.iter().zip(&api.policies) {
            let (s, a) = (s.spec.clone(), a.spec.clone());
            let (mut s, a) = (s.expect("spec"), a.expect("spec"));
            // The probe's own selector names its own set's revision.
            if s.validations
                .as_ref()
                .is_some_and(|v| v[0].expression == "false")
            {
                continue;
            }
            s.match_constraints = a.match_constraints.clone();
            assert_eq!(s, a);
        }
        for (s, a) in g.bindings.iter().zip(&api.bindings) {
            let (s, a) = (s.spec.clone().expect("spec"), a.spec.clone().expect("spec"));
            if s.match_resources.is_some() {
                continue;
            }
            assert_eq!(s.validation_actions, a.validation_actions);
            assert_eq!(s.policy_name, a.policy_name.map(|n| format!("{n}{SUFFIX}")));
        }
    }

    #[test]
    fn the_admission_configuration_names_each_plugins_directory() {
        let cfg = all_static();
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a", false).expect("renders");
        let cm = config_map(&cfg, "clusters-a", &g, None).expect("configmap");
        let text = &cm.data.as_ref().expect("data")[ADMISSION_CONFIG_KEY];
        let v: Value = serde_saphyr::from_str(text).expect("yaml");
        assert_eq!(v["kind"], "AdmissionConfiguration");
        for (i, plugin, dir) in [
            (0, "ValidatingAdmissionPolicy", "policies"),
            (1, "MutatingAdmissionPolicy", "mutating-policies"),
        ] {
            assert_eq!(v["plugins"][i]["name"], plugin);
            let c = &v["plugins"][i]["configuration"];
            assert_eq!(c["kind"], format!("{plugin}Configuration"));
            assert_eq!(c["apiVersion"], "apiserver.config.k8s.io/v1");
            assert_eq!(
                c["staticManifestsDir"],
                format!("/etc/kubernetes/hcp-fleet-guards/{dir}")
            );
        }
    }

    /// Offered (HyperShift's kube-apiserver mounts the ConfigMap), the files carry every guard
    /// on `auto` with a CEL form as well: the validating ones (and a mutation in warn mode) in
    /// the validating file, a mutation in enforce mode in the mutating one with a probe of its
    /// own revision; a guard asking for policy or webhook stays out. Not offered, only those
    /// asking for static.
    #[test]
    fn offered_the_files_carry_the_guards_on_auto_and_the_mutations() {
        use hcp_fleet_guards::{has_cel_form, has_mutation_form};
        let mut cfg = AgentConfig::default();
        let rbac = hcp_fleet_guards::protected_rbac::ROW.name;
        let scc = hcp_fleet_guards::scc::ROW.name;
        for w in &mut cfg.webhooks {
            if w.name == scc {
                w.engine = GuardEngine::Policy;
            }
        }
        let settings = Settings::from(&cfg);
        assert!(
            render(&cfg, &settings, "ns", false)
                .expect("render")
                .is_empty()
        );
        let g = render(&cfg, &settings, "ns", true).expect("render");
        let want_validating: BTreeSet<String> = cfg
            .active_webhooks()
            .filter(|w| w.engine == GuardEngine::Auto)
            .filter(|w| {
                has_cel_form(&w.path) || (has_mutation_form(&w.path) && w.mode == Mode::Warn)
            })
            .map(|w| w.name.clone())
            .collect();
        assert!(want_validating.contains(rbac));
        assert!(!g.guards().contains(scc));
        assert_eq!(g.validating_guards(), want_validating);
        let tags = hcp_fleet_guards::service_tags::ROW.name;
        // The pod image spec has no change to make without a registry read: in no file.
        assert_eq!(g.mutating_guards(), BTreeSet::from([tags.to_string()]));
        let rev = g.mutating_revision.clone().expect("a mutating revision");
        let probe = g
            .mutating
            .iter()
            .find(|v| {
                v["kind"] == "MutatingAdmissionPolicy"
                    && v["metadata"]["name"] == probe_name().as_str()
            })
            .expect("the static mutating probe");
        assert_eq!(
            probe["spec"]["matchConstraints"]["objectSelector"]["matchLabels"]
                [hcp_fleet_guards::catalogue::PROBE_REVISION_LABEL],
            rev.as_str()
        );
        assert_eq!(probe["spec"]["failurePolicy"], "Fail");
        // The mutating file is policies then bindings, every binding naming a policy of it,
        // each name with the reserved suffix.
        let text = mutating_policies_file(&g).expect("file");
        let kinds: Vec<String> = text
            .trim_end()
            .split("\n---\n")
            .map(|d| {
                let v: Value = serde_json::from_str(d).expect("JSON");
                assert!(
                    v["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with(SUFFIX))
                );
                v["kind"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "MutatingAdmissionPolicy",
                "MutatingAdmissionPolicy",
                "MutatingAdmissionPolicyBinding",
                "MutatingAdmissionPolicyBinding"
            ]
        );
        let cm = config_map(&cfg, "ns", &g, None).expect("configmap");
        assert_eq!(guards_in(&cm), Some(g.guards()));
        assert_eq!(
            cm.metadata.annotations.as_ref().expect("annotations")[MUTATING_REVISION_ANNOTATION],
            rev
        );
        // The mutation in the file is the one the API side writes, renamed.
        let (api, _) = super::super::admission_policies::guard_mutation(
            cfg.webhooks.iter().find(|w| w.name == tags).expect("tags"),
            tags,
            &settings,
            "ns",
        )
        .expect("a CEL form");
        let mut file = g
            .mutating
            .iter()
            .find(|v| v["metadata"]["name"] == format!("{tags}{SUFFIX}").as_str())
            .expect("in the file")
            .clone();
        file["metadata"]["name"] = Value::String(tags.into());
        assert_eq!(file, api);
    }

    /// Every mutation, the pod image spec with a registry read, is loaded from files as the
    /// same MutatingAdmissionPolicy and binding the API side writes, but for the name: the
    /// case tables the API-side policies are held to (`cel_mutation_cases`) hold for the files.
    #[test]
    fn each_mutation_in_the_files_is_its_api_side_policy_renamed() {
        use hcp_fleet_guards::{has_mutation_form, pod_image_spec};
        let mut cfg = AgentConfig::default();
        for w in &mut cfg.webhooks {
            if has_mutation_form(&w.path) {
                w.engine = GuardEngine::Static;
                w.mode = Mode::Enforce;
            }
        }
        let settings = Settings {
            internal_registry: Some(pod_image_spec::case_registry()),
            ..Settings::from(&cfg)
        };
        let g = render(&cfg, &settings, "ns", false).expect("render");
        let mutations: Vec<_> = cfg
            .active_webhooks()
            .filter(|w| has_mutation_form(&w.path))
            .collect();
        assert!(
            mutations.len() >= 3,
            "the Service tag and annotation, the pod image spec"
        );
        assert_eq!(
            g.mutating_guards(),
            mutations.iter().map(|w| w.name.clone()).collect()
        );
        for w in mutations {
            let (api_policy, api_binding) =
                super::super::admission_policies::guard_mutation(w, &w.name, &settings, "ns")
                    .expect("a CEL form");
            let named = |kind: &str| {
                let mut v = g
                    .mutating
                    .iter()
                    .find(|v| {
                        v["kind"] == kind
                            && v["metadata"]["name"] == format!("{}{SUFFIX}", w.name).as_str()
                    })
                    .unwrap_or_else(|| panic!("{} {kind} in the file", w.name))
                    .clone();
                v["metadata"]["name"] = Value::String(w.name.clone());
                v
            };
            assert_eq!(named("MutatingAdmissionPolicy"), api_policy, "{}", w.name);
            let mut binding = named("MutatingAdmissionPolicyBinding");
            binding["spec"]["policyName"] = Value::String(w.name.clone());
            assert_eq!(binding, api_binding, "{}", w.name);
        }
    }

    /// HyperShift's kube-apiserver offers the files where its pod template mounts the
    /// ConfigMap, by any volume name; not where it mounts others.
    #[test]
    fn the_kube_apiserver_offers_the_files_where_it_mounts_the_configmap() {
        let with = |cm: &str| -> Deployment {
            serde_json::from_value(json!({
                "metadata": {"name": KUBE_APISERVER},
                "spec": {"selector": {}, "template": {"spec": {
                    "containers": [{"name": "kube-apiserver"}],
                    "volumes": [
                        {"name": "kas-config", "configMap": {"name": "kas-config"}},
                        {"name": "anything", "configMap": {"name": cm, "optional": true}},
                    ],
                }}},
            }))
            .expect("a Deployment")
        };
        assert!(offered(&with(CONFIG_MAP)));
        assert!(!offered(&with("another")));
        assert!(!offered(&Deployment::default()));
    }

    #[test]
    fn a_configmap_not_written_by_the_agent_carries_unknown_guards() {
        let mut cm = ConfigMap::default();
        assert_eq!(guards_in(&cm), None);
        cm.data = Some(BTreeMap::from([(POLICIES_KEY.into(), "not: json".into())]));
        assert_eq!(guards_in(&cm), None);
        cm.data = Some(BTreeMap::from([
            (POLICIES_KEY.into(), String::new()),
            (MUTATING_POLICIES_KEY.into(), "{".into()),
        ]));
        assert_eq!(guards_in(&cm), None);
        // An agent's ConfigMap from before the mutating file: its validating guards.
        cm.data = Some(BTreeMap::from([(POLICIES_KEY.into(), String::new())]));
        assert_eq!(guards_in(&cm), Some(BTreeSet::new()));
    }
}
