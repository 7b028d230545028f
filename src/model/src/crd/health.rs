//! The agent's own resources, which nothing else writes:
//!
//! - `AdmissionHealth`: one per HCP namespace, the record of that hosted cluster's health
//!   (verdict, one entry per concern with bounded history, drift repairs, revision). `status`,
//!   metrics and the ACM report are all read from what it says.
//! - `AdmissionHealthPolicy`: an ACM policy template kind (its CRD carries ACM's
//!   `policy-type: template` label). ACM's framework addon creates one in the managed cluster's
//!   namespace from the Policy in `policies/`; the agent evaluates it against every
//!   `AdmissionHealth` and reports the verdict as compliance Events on the parent Policy
//!   (docs/reporting.md).
//!
//! Unlike the HyperShift and ACM types, these CRDs are derived from the structs: the agent
//! owns them, and the chart's `templates/crds.yaml` is generated from here (`make
//! chart-schema`), so the schema the API server enforces is the one the code writes.

use kube::CustomResource;
use kube::core::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ComplianceState;
use super::conditions::Condition;

/// The label ACM's framework addon looks for on a CRD before it syncs templates of that kind
/// (governance-policy-framework-addon, `controllers/templatesync/template_sync.go`,
/// `hasPolicyTemplateLabel`).
pub(crate) const ACM_POLICY_TYPE_LABEL: &str = "policy.open-cluster-management.io/policy-type";

/// One hosted cluster's admission health, in its HCP namespace.
///
/// The spec is the agent's too: nobody else writes this object.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hcp-fleet.openshift.io",
    version = "v1alpha1",
    kind = "AdmissionHealth",
    plural = "admissionhealths",
    shortname = "ahealth",
    category = "hcp-fleet",
    doc = "One hosted cluster's admission health, written by hcp-fleet-agent in its HCP namespace: a verdict per concern (admission service, certificate, hosted webhooks, end-to-end probe) with history, as Ready conditions and in ACM's compliance form.",
    namespaced,
    status = "AdmissionHealthStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Compliant","type":"string","jsonPath":".status.compliant"}"#,
    printcolumn = r#"{"name":"Drift","type":"integer","jsonPath":".status.driftRepairs"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Owner","type":"string","jsonPath":".spec.owner","priority":1}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct AdmissionHealthSpec {
    /// The hosted cluster this record is about (the HostedControlPlane's name).
    pub cluster: String,
    /// The UID of the hosted cluster's `kube-system` namespace, recorded when the agent first
    /// reached it through this HCP's kubeconfig: the claim that no other HCP namespace may
    /// reach the same cluster. Kept here, on the management cluster, where the hosted cluster's
    /// admins cannot write it.
    #[serde(
        rename = "hostedClusterUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub hosted_cluster_uid: Option<String>,
    /// The same claim as earlier releases spelled it (`hosted_cluster_uid`): read, never
    /// written; the agent's next write of the spec replaces it with `hostedClusterUID`.
    #[serde(
        rename = "hosted_cluster_uid",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub legacy_hosted_cluster_uid: Option<String>,
    /// The installation of the agent that owns this HCP: the namespace it runs in. Another
    /// installation on the same management cluster leaves the HCP alone while this one's
    /// Lease is renewed, and says so (docs/operations.md, "One owner per HCP").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl AdmissionHealthSpec {
    /// The hosted cluster this HCP namespace claims, however the record spells it.
    pub fn claimed_uid(&self) -> Option<&str> {
        self.hosted_cluster_uid
            .as_deref()
            .or(self.legacy_hosted_cluster_uid.as_deref())
    }
}

/// What the agent last found on this hosted cluster; written by the agent only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionHealthStatus {
    /// The record's `metadata.generation` this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (every concern Compliant; `Unknown` while any is Pending) and one per concern:
    /// `AdmissionServiceReady`, `CertificateReady`, `HostedWebhooksReady`,
    /// `EndToEndProbeReady`. Each message says what was found, and what is wrong.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::list_schema")]
    pub conditions: Vec<Condition>,
    /// Since when the agent has left this HCP alone (RFC 3339), while it does: a pause
    /// annotation, HyperShift's `spec.pausedUntil`, or an override. Kept across restarts, so
    /// the age of a pause is known (`hcp_fleet_paused_since_timestamp_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_since: Option<String>,
    /// NonCompliant if any concern is, else Pending if any is, else Compliant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<ComplianceState>,
    /// One entry per concern: admission-service, certificate, hosted-webhooks, e2e-probe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concerns: Vec<ConcernStatus>,
    /// Drift repairs on this hosted cluster so far (kept across agent restarts).
    #[serde(default)]
    pub drift_repairs: u64,
    /// The revision this HCP was last reconciled to (the content hash of the admission image
    /// and settings and the webhook definitions; `status` and the rollout read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Since when (RFC 3339) this HCP has been on `revision` with its Deployment fully rolled
    /// out and every concern Compliant; absent while it is not. The rollout's soak time runs
    /// from here, so it survives an agent restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_ready_since: Option<String>,
    /// The path each guard that is on takes in the hosted cluster, as last installed there:
    /// `webhook` (the hosted kube-apiserver calls the admission service), `policy` (an
    /// admission policy it evaluates itself), `static` (a policy it loads from files), `none`
    /// (a mutation with nothing to change there: the pod image spec's while the registry is
    /// Managed). Where no guard takes `webhook`, the HCP has no admission service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guards: Vec<GuardPath>,
}

/// One guard's path in the hosted cluster (`AdmissionHealthStatus::guards`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuardPath {
    /// The guard's name (`protected-rbac.hcp-fleet.openshift.io`).
    pub name: String,
    /// `webhook`, `policy`, `static` or `none`.
    pub path: String,
}

/// One concern's verdict and its recent history.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConcernStatus {
    /// `admission-service`, `certificate`, `hosted-webhooks` or `e2e-probe`.
    pub name: String,
    /// This concern's verdict in ACM's terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<ComplianceState>,
    /// Newest first, at most 10 entries; an entry is added only when the message changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// RFC 3339, seconds.
    pub last_timestamp: String,
    /// In ACM's form: `Compliant; notification - …`, `NonCompliant; violation - …`.
    pub message: String,
}

/// The ACM policy template that reports the fleet's hosted clusters on the hub.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hcp-fleet.openshift.io",
    version = "v1alpha1",
    kind = "AdmissionHealthPolicy",
    plural = "admissionhealthpolicies",
    shortname = "ahpolicy",
    category = "hcp-fleet",
    doc = "An ACM policy template: ACM's framework addon creates it from a Policy, and hcp-fleet-agent reports the hosted clusters' AdmissionHealth through it as compliance on the parent Policy. Its status is in ConfigurationPolicy's shape, which ACM's status sync reads.",
    namespaced,
    status = "AdmissionHealthPolicyStatus",
    printcolumn = r#"{"name":"Compliant","type":"string","jsonPath":".status.compliant"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionHealthPolicySpec {
    /// Set by ACM from the parent Policy. The agent only reports: `enforce` changes nothing
    /// (the agent repairs drift whatever this says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_action: Option<RemediationAction>,
    /// Set by ACM from the parent Policy's template: how much a violation matters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
}

/// What ACM copies from the Policy into its templates: either case, as ACM's own CRDs take it
/// (the Policy's `remediationAction`: `Inform`, `inform`, `Enforce`, `enforce`). A schema
/// with the lowercase values only would make template-sync's create fail on a Policy that
/// says `Enforce`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemediationAction {
    #[serde(rename = "inform", alias = "Inform")]
    Inform,
    #[serde(rename = "enforce", alias = "Enforce")]
    Enforce,
}

/// The severities ConfigurationPolicy takes, in either case.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    #[serde(rename = "low", alias = "Low")]
    Low,
    #[serde(rename = "medium", alias = "Medium")]
    Medium,
    #[serde(rename = "high", alias = "High")]
    High,
    #[serde(rename = "critical", alias = "Critical")]
    Critical,
}

/// A string enum schema with these values.
fn string_enum(values: &[&str]) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": values})
}

impl JsonSchema for RemediationAction {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RemediationAction".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        string_enum(&["Inform", "inform", "Enforce", "enforce"])
    }
}

impl JsonSchema for Severity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Severity".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        string_enum(&[
            "low", "Low", "medium", "Medium", "high", "High", "critical", "Critical",
        ])
    }
}

/// The template's verdict over the hosted clusters it covers, in ConfigurationPolicy's shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionHealthPolicyStatus {
    /// The verdict ACM reads: NonCompliant if any hosted cluster it covers is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<ComplianceState>,
    /// The message of the last compliance Event, so a restarted agent does not repeat it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The hosted clusters the verdict is about, in ConfigurationPolicy's shape: the few worst
    /// (the fleet's summary), or the one (a hosted cluster's own row).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related_objects: Vec<RelatedObject>,
    /// The compliance Events this template's reporter emitted, newest first, at most 10, in
    /// the shape ACM's status sync reads from a template (governance-policy-framework-addon
    /// v0.17.0 on: `getEventsInTemplate`). Each `lastTimestamp` is the instant that also names
    /// its Event, so status-sync counts the two once; an Event lost (expired after an hour,
    /// never written) is still read from here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<TemplateHistoryEntry>,
}

impl AdmissionHealthPolicyStatus {
    /// The same verdict: compliance, message and rows (the history is what reporting them
    /// left behind, not part of the verdict).
    pub fn same_verdict(&self, other: &Self) -> bool {
        self.compliant == other.compliant
            && self.message == other.message
            && self.related_objects == other.related_objects
    }
}

/// One entry of a template's `status.history`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateHistoryEntry {
    /// RFC 3339 with microseconds (Kubernetes' MicroTime): the instant of the Event.
    pub last_timestamp: String,
    /// The Event's message, `Compliant; notification - …` or `NonCompliant; violation - …`.
    pub message: String,
}

/// One hosted cluster's record behind a template's verdict.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct RelatedObject {
    /// The `AdmissionHealth` record.
    pub object: ObjectRef,
    /// Its verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<ComplianceState>,
    /// Why, when it is not Compliant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Which object, in ConfigurationPolicy's `relatedObjects` shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `hcp-fleet.openshift.io/v1alpha1`.
    pub api_version: String,
    /// `AdmissionHealth`.
    pub kind: String,
    /// Its name and namespace.
    pub metadata: ObjectMeta,
}

/// An object's name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ObjectMeta {
    /// The object's name.
    pub name: String,
    /// The object's namespace (the HCP namespace).
    pub namespace: String,
}

/// The agent's CRDs as the chart ships them (`templates/crds.yaml`), the template kind labelled
/// for ACM's framework addon.
/// `schema` without `nullable` anywhere in it (see `crds`).
fn drop_nullable(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(m) => {
            m.remove("nullable");
            m.values_mut().for_each(drop_nullable);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(drop_nullable),
        _ => {}
    }
}

pub fn crds() -> Vec<serde_json::Value> {
    let mut template = serde_json::to_value(AdmissionHealthPolicy::crd()).unwrap_or_default();
    template["metadata"]["labels"] = serde_json::json!({ ACM_POLICY_TYPE_LABEL: "template" });
    let mut crds = vec![
        serde_json::to_value(AdmissionHealth::crd()).unwrap_or_default(),
        template,
        serde_json::to_value(super::admission_rollout::AdmissionRollout::crd()).unwrap_or_default(),
        serde_json::to_value(super::admission_rollout::HostedAdmissionOverride::crd())
            .unwrap_or_default(),
    ];
    for crd in &mut crds {
        normalize_schema(crd);
        // The API server publishes a nullable field to OpenAPI v2 without its type or fields
        // (v2 cannot say "null or object"), so `kubectl explain` showed `<>` for every
        // optional field and could not look inside `status`. The agent never writes a null
        // (an absent field is left out, or removed by a merge patch's null), and since 1.20 a
        // null sent for a field that is not nullable is pruned before validation.
        if let Some(versions) = crd["spec"]["versions"].as_array_mut() {
            for v in versions {
                drop_nullable(&mut v["schema"]["openAPIV3Schema"]);
            }
        }
        // `helm uninstall` keeps them, and with them SREs' overrides (and their reasons) and
        // the rollout's history: deleting a CRD deletes every object of its kind.
        crd["metadata"]["annotations"] = serde_json::json!({ HELM_RESOURCE_POLICY: "keep" });
    }
    crds
}

/// Helm's annotation for resources `helm uninstall` leaves in place.
pub const HELM_RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// What older API servers would refuse or rewrite in schemars' output:
/// - `null` among an optional enum's values (`nullable: true` already says it): Kubernetes 1.20
///   refuses the CRD ("per-version schemas may not all be set to identical values");
/// - a whole-number bound written as a float (`minimum: 0.0`), which 1.20 hands back as `0`,
///   so the applied CRD would never match the chart's;
/// - an empty string as a default (`#[serde(default)]` on a `String`), which 1.20 reads as
///   `null` and refuses ("must be of type string"); an absent field reads as `""` all the same.
fn normalize_schema(v: &mut serde_json::Value) {
    each_object(v, &mut |map| {
        if map.get("default") == Some(&serde_json::json!("")) {
            map.remove("default");
        }
        if let Some(serde_json::Value::Array(values)) = map.get_mut("enum") {
            values.retain(|x| !x.is_null());
        }
        for key in ["minimum", "maximum"] {
            if let Some(n) = map.get(key).and_then(serde_json::Value::as_f64)
                && n.fract() == 0.0
                && n.abs() < 9.0e15
            {
                map.insert(key.to_string(), serde_json::json!(n as i64));
            }
        }
    });
}

/// A CRD as an API server without CEL (before 1.25) takes it: without its
/// `x-kubernetes-validations`, which server-side apply there refuses as an undeclared field (a
/// plain create, as Helm's, drops them silently). The agent checks the same rules itself
/// (`overrides::resolve`), so nothing those rules refuse is ever applied.
pub fn without_cel(v: &mut serde_json::Value) {
    each_object(v, &mut |map| {
        map.remove("x-kubernetes-validations");
    });
}

/// Calls `f` on every JSON object in `v`, outermost first (what `f` leaves is then walked).
fn each_object(
    v: &mut serde_json::Value,
    f: &mut impl FnMut(&mut serde_json::Map<String, serde_json::Value>),
) {
    match v {
        serde_json::Value::Object(map) => {
            f(map);
            map.values_mut().for_each(|x| each_object(x, f));
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|x| each_object(x, f)),
        _ => {}
    }
}

/// `templates/crds.yaml`: the CRDs as YAML documents, with a header saying where they come from.
pub fn crds_yaml() -> String {
    let mut out = String::from(
        "# Generated by `make chart-schema` from src/model/src/crd/health.rs; do not edit by hand.\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        let yaml = serde_saphyr::to_string(&crd).unwrap_or_default();
        if !yaml.contains("x-kubernetes-validations") {
            out.push_str(&yaml);
            continue;
        }
        // Helm picks the variant by the cluster's version, as it does the PDB's apiVersion.
        let mut old = crd.clone();
        without_cel(&mut old);
        out.push_str(CEL_SINCE);
        out.push('\n');
        out.push_str(&yaml);
        out.push_str("{{- else }}\n");
        out.push_str(
            "# Kubernetes before 1.25 has no CEL: the same CRD without its rules, which the \
             agent checks itself.\n",
        );
        out.push_str(&serde_saphyr::to_string(&old).unwrap_or_default());
        out.push_str("{{- end }}\n");
    }
    out
}

/// The Helm condition for a cluster that enforces `x-kubernetes-validations`.
const CEL_SINCE: &str = r#"{{- if semverCompare ">=1.25-0" .Capabilities.KubeVersion.Version }}"#;

#[cfg(test)]
mod tests {

    /// The template's remediationAction and severity take every value ACM's own CRDs take
    /// (the Policy's, which spec-sync copies into each template; ConfigurationPolicy's
    /// severities), read from ../shared/crds/upstream where it is beside the repository.
    #[test]
    fn the_template_takes_what_acm_writes_in_either_case() {
        let crds = crds();
        let template = crds
            .iter()
            .find(|c| c["spec"]["names"]["kind"] == "AdmissionHealthPolicy")
            .expect("template CRD");
        let spec = &template["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        let values = |v: &serde_json::Value| -> std::collections::BTreeSet<String> {
            v["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        };
        let ours_action = values(&spec["remediationAction"]);
        let ours_severity = values(&spec["severity"]);
        for v in ["Inform", "inform", "Enforce", "enforce"] {
            assert!(ours_action.contains(v), "{v}: {ours_action:?}");
        }
        for v in ["High", "high", "Critical", "low"] {
            assert!(ours_severity.contains(v), "{v}: {ours_severity:?}");
        }
        let spec: AdmissionHealthPolicySpec = serde_json::from_value(
            serde_json::json!({"remediationAction": "Enforce", "severity": "High"}),
        )
        .expect("ACM's cases");
        assert_eq!(spec.remediation_action, Some(RemediationAction::Enforce));
        assert_eq!(spec.severity, Some(Severity::High));
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/crds/upstream");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(policy), Some(config)) = (
            read("policy.open-cluster-management.io_policies.yaml"),
            read("policy.open-cluster-management.io_configurationpolicies.yaml"),
        ) else {
            eprintln!("skipped: the comparison with ACM's own CRDs (no {dir})");
            return;
        };
        let doc = |t: &str| -> serde_json::Value { serde_saphyr::from_str(t).expect("CRD YAML") };
        let (policy, config) = (doc(&policy), doc(&config));
        let props = |c: &serde_json::Value| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].clone()
        };
        assert_eq!(ours_action, values(&props(&policy)["remediationAction"]));
        assert_eq!(ours_severity, values(&props(&config)["severity"]));
    }
    use super::*;

    #[test]
    fn the_template_crd_carries_acms_label_and_both_have_status() {
        let crds = crds();
        assert_eq!(crds.len(), 4);
        assert_eq!(
            crds[0]["metadata"]["name"],
            "admissionhealths.hcp-fleet.openshift.io"
        );
        assert_eq!(
            crds[1]["metadata"]["labels"][ACM_POLICY_TYPE_LABEL],
            "template"
        );
        for crd in &crds[..2] {
            let v = &crd["spec"]["versions"][0];
            assert_eq!(v["subresources"]["status"], serde_json::json!({}));
            let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"];
            assert_eq!(
                status["properties"]["compliant"]["enum"],
                serde_json::json!(["Compliant", "Pending", "NonCompliant"]),
                "{status}"
            );
            // Absent, not null (`kubectl explain` on 1.20 shows a nullable field as `<>`).
            assert!(!crd.to_string().contains("nullable"), "{crd}");
        }
    }

    /// `kubectl explain` prints each field's description: every field of every CRD has one,
    /// and no kind says "Auto-generated derived type".
    #[test]
    fn kubectl_explain_explains_every_field() {
        fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
            let Some(props) = schema["properties"].as_object() else {
                if let Some(items) = schema.get("items") {
                    walk(&format!("{path}[]"), items, missing);
                }
                return;
            };
            for (name, p) in props {
                let here = format!("{path}.{name}");
                // The envelope is Kubernetes' own, described by the API server.
                let envelope =
                    path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str());
                if !envelope && p["description"].as_str().is_none_or(str::is_empty) {
                    missing.push(here.clone());
                }
                walk(&here, p, missing);
            }
        }
        let mut missing = Vec::new();
        for crd in crds() {
            let kind = crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            let doc = root["description"].as_str().unwrap_or_default();
            assert!(
                !doc.is_empty() && !doc.contains("Auto-generated"),
                "{kind}: {doc}"
            );
            assert_eq!(
                crd["spec"]["names"]["categories"],
                serde_json::json!(["hcp-fleet"]),
                "{kind}"
            );
            assert!(
                crd["spec"]["names"]["shortNames"].is_array(),
                "{kind} has no short name"
            );
            walk(&kind, root, &mut missing);
        }
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:#?}"
        );
    }

    #[test]
    fn every_status_the_agent_writes_has_conditions_and_an_observed_generation() {
        for crd in crds() {
            let kind = crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if kind == "AdmissionHealthPolicy" {
                continue; // ConfigurationPolicy's shape, which ACM's status sync reads.
            }
            let status =
                &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
            let conditions = &status["properties"]["conditions"];
            assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
            assert_eq!(
                conditions["x-kubernetes-list-map-keys"],
                serde_json::json!(["type"])
            );
            let item = &conditions["items"];
            let required: Vec<&str> = item["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .collect();
            for field in ["type", "status", "lastTransitionTime", "reason"] {
                assert!(required.contains(&field), "{kind}: {field} not required");
            }
            assert_eq!(
                item["properties"]["status"]["enum"],
                serde_json::json!(["True", "False", "Unknown"])
            );
            assert_eq!(
                status["properties"]["observedGeneration"]["type"], "integer",
                "{kind}"
            );
        }
    }

    #[test]
    fn no_schema_defaults_a_string_to_empty_which_kubernetes_1_20_refuses() {
        let empty_default = r#""default":"""#;
        // schemars writes one for the override's status message: the case this guards exists.
        let raw =
            serde_json::to_string(&super::super::admission_rollout::HostedAdmissionOverride::crd())
                .unwrap_or_default();
        assert!(raw.contains(empty_default), "the case this guards is gone");
        for crd in crds() {
            let json = serde_json::to_string(&crd).unwrap_or_default();
            assert!(!json.contains(empty_default), "{}", crd["metadata"]["name"]);
        }
    }

    #[test]
    fn a_crd_for_a_server_without_cel_keeps_everything_but_its_rules() {
        let mut crds = crds();
        let before = serde_json::to_string(&crds).unwrap_or_default();
        assert!(before.contains("x-kubernetes-validations"));
        crds.iter_mut().for_each(without_cel);
        let after = serde_json::to_string(&crds).unwrap_or_default();
        assert!(!after.contains("x-kubernetes-validations"));
        let spec =
            &crds[3]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["revision"]["pattern"], "^[0-9a-f]{16}$");
        assert_eq!(spec["properties"]["guards"]["type"], "array");
    }

    #[test]
    fn the_chart_ships_the_crds_of_this_build() {
        let committed = include_str!("../../../../charts/hcp-fleet-agent/templates/crds.yaml");
        assert_eq!(
            committed,
            crds_yaml(),
            "charts/hcp-fleet-agent/templates/crds.yaml is stale: run `make chart-schema`"
        );
    }
}
