//! ACM's Policy (`policy.open-cluster-management.io/v1`), the parts the agent writes.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "policy.open-cluster-management.io",
    version = "v1",
    kind = "Policy",
    plural = "policies",
    namespaced,
    status = "PolicyStatus",
    schema = "disabled"
)]
pub struct PolicySpec {
    pub disabled: bool,
    #[serde(
        rename = "remediationAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub remediation_action: Option<String>,
    #[serde(rename = "policy-templates", default)]
    pub policy_templates: Vec<PolicyTemplate>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PolicyTemplate {
    #[serde(rename = "objectDefinition")]
    pub object_definition: serde_json::Value,
}

/// ACM's compliance states. `Pending` exists only in newer CRDs.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum ComplianceState {
    Compliant,
    Pending,
    NonCompliant,
}

impl ComplianceState {
    pub fn as_str(self) -> &'static str {
        match self {
            ComplianceState::Compliant => "Compliant",
            ComplianceState::Pending => "Pending",
            ComplianceState::NonCompliant => "NonCompliant",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<TemplateDetails>,
    /// A root Policy's per-cluster rows (keys all lower-case, as ACM writes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status: Vec<ClusterCompliance>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<String>,
    #[serde(rename = "templateMeta", default)]
    pub template_meta: TemplateMeta,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ComplianceHistory>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateMeta {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ComplianceHistory {
    #[serde(rename = "eventName", default)]
    pub event_name: String,
    #[serde(rename = "lastTimestamp", default)]
    pub last_timestamp: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterCompliance {
    pub clustername: String,
    pub clusternamespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compliant: Option<String>,
}
