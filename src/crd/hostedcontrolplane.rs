//! HyperShift's HostedControlPlane, trimmed to what the agent reads. Unknown fields are kept
//! (flattened into `extra`) so a read-modify-write by any tool never loses HyperShift's data.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "hypershift.openshift.io",
    version = "v1beta1",
    kind = "HostedControlPlane",
    plural = "hostedcontrolplanes",
    namespaced,
    status = "HostedControlPlaneStatus",
    schema = "disabled"
)]
pub struct HostedControlPlaneSpec {
    /// Lower-case `kubeconfig` in the spec (camelCase `kubeConfig` in the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<SecretKeyRef>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HostedControlPlaneStatus {
    #[serde(default)]
    pub ready: bool,
    #[serde(
        rename = "kubeConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub kube_config: Option<SecretKeyRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<HcpCondition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A metav1.Condition, leniently typed: HyperShift versions differ in which fields they set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct HcpCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(
        rename = "lastTransitionTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub last_transition_time: Option<String>,
}

impl HostedControlPlane {
    /// Ready for the agent: `status.ready` and a published `status.kubeConfig`.
    pub fn is_ready(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.ready && s.kube_config.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let raw = serde_json::json!({
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "HostedControlPlane",
            "metadata": {"name": "hc1", "namespace": "clusters-hc1"},
            "spec": {"platform": {"type": "AWS"}, "releaseImage": "x"},
            "status": {"ready": true, "kubeConfig": {"name": "admin-kubeconfig", "key": "kubeconfig"},
                       "version": {"desired": {}}}
        });
        let hcp: HostedControlPlane = serde_json::from_value(raw.clone()).expect("parse");
        assert!(hcp.is_ready());
        let back = serde_json::to_value(&hcp).expect("serialize");
        assert_eq!(back["spec"]["platform"]["type"], "AWS");
        assert_eq!(back["status"]["version"], raw["status"]["version"]);
        assert_eq!(back["status"]["kubeConfig"]["name"], "admin-kubeconfig");
    }

    #[test]
    fn not_ready_without_kubeconfig() {
        let mut hcp = HostedControlPlane::new("hc1", HostedControlPlaneSpec::default());
        assert!(!hcp.is_ready());
        hcp.status = Some(HostedControlPlaneStatus {
            ready: true,
            ..Default::default()
        });
        assert!(!hcp.is_ready());
    }
}
