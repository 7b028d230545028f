//! The guards the hosted kube-apiserver loads from files (engine `static`,
//! docs/static-guards.md): the same ValidatingAdmissionPolicies and bindings the API-side
//! engine writes, named with the reserved suffix `.static.k8s.io`, which Kubernetes 1.36 with
//! the feature gate `ManifestBasedAdmissionControlConfig` loads from a directory and refuses
//! to any API request. In HyperShift the hosted kube-apiserver runs in the HCP namespace on the
//! management cluster, so the files come from a ConfigMap there, beside the agent, on the side
//! a hosted cluster's admins cannot reach.
//!
//! Rendered purely from the configuration: the guards whose `engine` is `static`, with their
//! modes, exemptions and overrides as for the API-side policies (`render_set`, the same
//! function), and a probe policy of their revision that proves, through the server itself,
//! which revision it has loaded.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::ObjectMeta;
use serde_json::Value;

use super::admission_policies::{probe_name as api_probe_name, render_set, typed};
use super::objects::WebhookRenderError;
use crate::config::AgentConfig;
use hcp_fleet_guards::Settings;
use hcp_fleet_guards::catalogue::GuardEngine;
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};

/// The suffix Kubernetes reserves for admission objects loaded from files: the API refuses to
/// create, change or delete an object so named (with the feature gate on).
pub const SUFFIX: &str = ".static.k8s.io";
/// The ConfigMap in each HCP namespace that holds the files.
pub const CONFIG_MAP: &str = "hcp-fleet-static-guards";
/// Its key holding the policies and bindings (multi-document YAML; each document JSON).
pub const POLICIES_KEY: &str = "policies.yaml";
/// Its key holding the admission configuration the kube-apiserver's
/// `--admission-control-config-file` names (or whose plugin entry is merged into the one it has).
pub(crate) const ADMISSION_CONFIG_KEY: &str = "admission-config.yaml";
/// Under `staticGuards.mountPath`: where the policies key is mounted (the directory the
/// ValidatingAdmissionPolicy plugin reads; it must hold nothing else, or the server refuses the
/// other files) and where the admission configuration is.
pub const POLICIES_DIR: &str = "policies";
/// The annotation on the ConfigMap naming the revision its policies carry.
pub const REVISION_ANNOTATION: &str = "hcp-fleet.openshift.io/static-revision";

/// The static probe policy's (and binding's) name.
pub fn probe_name() -> String {
    format!("{}{SUFFIX}", api_probe_name())
}

/// The policies and bindings one hosted kube-apiserver should load from files, and their
/// revision (`None`: no guard is static, and no ConfigMap is wanted).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StaticGuards {
    /// Guards first, the probe policy last.
    pub(crate) policies: Vec<ValidatingAdmissionPolicy>,
    pub(crate) bindings: Vec<ValidatingAdmissionPolicyBinding>,
    pub revision: Option<String>,
}

impl StaticGuards {
    /// The guards carried (by their webhook's name; the probe left out).
    pub fn guards(&self) -> BTreeSet<String> {
        guard_names(
            self.policies
                .iter()
                .filter_map(|p| p.metadata.name.as_deref()),
        )
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
pub fn is_static(w: &hcp_fleet_guards::catalogue::WebhookDefinition) -> bool {
    w.engine == GuardEngine::Static
}

pub fn render(
    cfg: &AgentConfig,
    settings: &Settings,
    hcp_namespace: &str,
) -> Result<StaticGuards, WebhookRenderError> {
    let set = typed(
        render_set(cfg, settings, hcp_namespace, is_static, SUFFIX),
        hcp_namespace,
    )?;
    Ok(StaticGuards {
        policies: set.policies,
        bindings: set.bindings,
        revision: set.revision,
    })
}

/// The admission configuration that has the ValidatingAdmissionPolicy plugin load the files in
/// `policies_dir` (absolute; `staticGuards.mountPath` is held to characters that need no
/// quoting in YAML).
pub fn admission_configuration(policies_dir: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\n\
         kind: AdmissionConfiguration\n\
         plugins:\n\
         - name: ValidatingAdmissionPolicy\n\
         \x20 configuration:\n\
         \x20   apiVersion: apiserver.config.k8s.io/v1\n\
         \x20   kind: ValidatingAdmissionPolicyConfiguration\n\
         \x20   staticManifestsDir: {policies_dir}\n"
    )
}

/// The policies file: each policy, then each binding, one JSON document each (JSON is YAML;
/// the server splits the file at `---`).
pub(crate) fn policies_file(g: &StaticGuards) -> Result<String, serde_json::Error> {
    let mut docs = Vec::new();
    for p in &g.policies {
        docs.push(serde_json::to_string(&with_types(
            serde_json::to_value(p)?,
            "ValidatingAdmissionPolicy",
        ))?);
    }
    for b in &g.bindings {
        docs.push(serde_json::to_string(&with_types(
            serde_json::to_value(b)?,
            "ValidatingAdmissionPolicyBinding",
        ))?);
    }
    Ok(docs.join("\n---\n") + "\n")
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
    let policies = policies_file(g).map_err(|e| WebhookRenderError {
        namespace: hcp_namespace.to_string(),
        reason: e.to_string(),
    })?;
    let dir = format!("{}/{POLICIES_DIR}", cfg.static_guards.mount_path);
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            namespace: Some(hcp_namespace.into()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.to_string(),
                MANAGED_BY_VALUE.to_string(),
            )])),
            annotations: g
                .revision
                .as_ref()
                .map(|r| BTreeMap::from([(REVISION_ANNOTATION.to_string(), r.clone())])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (ADMISSION_CONFIG_KEY.into(), admission_configuration(&dir)),
            (POLICIES_KEY.into(), policies),
        ])),
        ..Default::default()
    })
}

/// The guards a live ConfigMap's policies file carries; `None` where it cannot be read as the
/// agent writes it (someone else's edit: what the server loaded from it is then unknown).
pub fn guards_in(cm: &ConfigMap) -> Option<BTreeSet<String>> {
    let text = cm.data.as_ref()?.get(POLICIES_KEY)?;
    let mut names = Vec::new();
    for doc in text.split("\n---\n") {
        let v: Value = serde_json::from_str(doc).ok()?;
        if v.get("kind").and_then(Value::as_str) == Some("ValidatingAdmissionPolicy") {
            names.push(v.pointer("/metadata/name")?.as_str()?.to_string());
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
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a").expect("renders");
        assert_eq!(g, StaticGuards::default());
    }

    /// Every name ends with the reserved suffix, every binding names a policy of the set and
    /// no parameter (the server refuses both otherwise), and the probe's binding selects the
    /// set's revision.
    #[test]
    fn every_object_is_named_for_the_files_and_bound_within_the_set() {
        let cfg = all_static();
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a").expect("renders");
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
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a").expect("renders");
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
        let g = render(&cfg, &settings, "clusters-a").expect("renders");
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
    fn the_admission_configuration_names_the_policies_directory() {
        let cfg = all_static();
        let g = render(&cfg, &Settings::from(&cfg), "clusters-a").expect("renders");
        let cm = config_map(&cfg, "clusters-a", &g, None).expect("configmap");
        let text = &cm.data.as_ref().expect("data")[ADMISSION_CONFIG_KEY];
        let v: Value = serde_saphyr::from_str(text).expect("yaml");
        assert_eq!(v["kind"], "AdmissionConfiguration");
        assert_eq!(v["plugins"][0]["name"], "ValidatingAdmissionPolicy");
        assert_eq!(
            v["plugins"][0]["configuration"]["staticManifestsDir"],
            "/etc/kubernetes/hcp-fleet-guards/policies"
        );
    }

    #[test]
    fn a_configmap_not_written_by_the_agent_carries_unknown_guards() {
        let mut cm = ConfigMap::default();
        assert_eq!(guards_in(&cm), None);
        cm.data = Some(BTreeMap::from([(POLICIES_KEY.into(), "not: json".into())]));
        assert_eq!(guards_in(&cm), None);
    }
}
