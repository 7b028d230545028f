//! What the management cluster offers, discovered once when the controller starts: which
//! PodDisruptionBudget API it serves, which Prometheus Operator APIs (ServiceMonitors), whether the agent's own CRDs are installed (the chart
//! ships them), whether ACM's Policy CRD is, and whether that CRD's compliance enum has
//! `Pending` (older ACM CRDs do not).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use serde_json::Value;
use tracing::warn;

use hcp_fleet_render::config::MonitoringApi;
use hcp_fleet_render::management::PdbApi;

const POLICY_CRD: &str = "policies.policy.open-cluster-management.io";
/// HyperShift's HostedCluster: where served, the ACM managed cluster of each is read from it.
pub(crate) const HOSTED_CLUSTER_CRD: &str = "hostedclusters.hypershift.openshift.io";
pub(crate) const HEALTH_CRD: &str = "admissionhealths.hcp-fleet.openshift.io";
pub(crate) const TEMPLATE_CRD: &str = "admissionhealthpolicies.hcp-fleet.openshift.io";
pub(crate) const ROLLOUT_CRD: &str = "admissionrollouts.hcp-fleet.openshift.io";
pub(crate) const OVERRIDE_CRD: &str = "hostedadmissionoverrides.hcp-fleet.openshift.io";

#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    pub pdb_api: PdbApi,
    pub(crate) policy_crd: bool,
    pub pending_supported: bool,
    /// `admissionhealths.hcp-fleet.openshift.io`: without it, metrics only.
    pub(crate) health_crd: bool,
    /// `admissionhealthpolicies.hcp-fleet.openshift.io`: without it, no ACM reporting.
    pub(crate) template_crd: bool,
    /// Which monitoring API groups (`MonitoringApi::GROUPS`) serve ServiceMonitors.
    pub(crate) monitoring_served: [bool; 2],
    /// `admissionrollouts.hcp-fleet.openshift.io`: without it, a new revision reaches every
    /// HCP at once (nowhere to keep the rollout's state).
    pub(crate) rollout_crd: bool,
    /// `hostedadmissionoverrides.hcp-fleet.openshift.io`: without it, no overrides.
    pub(crate) override_crd: bool,
    /// `hostedclusters.hypershift.openshift.io`: without it, each HCP's HostedCluster is
    /// inferred from the HCP (its name and namespace), with no managed-cluster annotation.
    pub(crate) hosted_cluster_crd: bool,
}

impl Capabilities {
    /// The configured monitoring API if the management cluster serves it, else `None`.
    pub(crate) fn monitoring(&self, wanted: MonitoringApi) -> MonitoringApi {
        let served = MonitoringApi::GROUPS
            .iter()
            .zip(self.monitoring_served)
            .any(|(g, s)| *g == wanted && s);
        if served { wanted } else { MonitoringApi::None }
    }

    /// Every monitoring API served here (watched, and pruned when no longer configured).
    pub(crate) fn monitoring_apis(&self) -> impl Iterator<Item = MonitoringApi> + '_ {
        MonitoringApi::GROUPS
            .into_iter()
            .zip(self.monitoring_served)
            .filter_map(|(g, s)| s.then_some(g))
    }
}

/// How long one discovery read may take: a management API server that accepts the connection
/// and never answers must not hold the controller's start (and with it every HCP) forever.
pub(crate) const DISCOVERY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

pub async fn discover(client: &Client) -> Capabilities {
    let groups = tokio::time::timeout(DISCOVERY_DEADLINE, client.list_api_groups())
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                format!("no answer within {}s", DISCOVERY_DEADLINE.as_secs()).into(),
            ))
        });
    let (pdb_api, monitoring_served) = match groups {
        Ok(groups) => {
            let served = |group: &str, v: &str| {
                groups
                    .groups
                    .iter()
                    .any(|g| g.name == group && g.versions.iter().any(|x| x.version == v))
            };
            let pdb = if served("policy", "v1") {
                PdbApi::V1
            } else if served("policy", "v1beta1") {
                PdbApi::V1Beta1
            } else {
                PdbApi::None
            };
            let monitoring =
                MonitoringApi::GROUPS.map(|m| m.group().is_some_and(|g| served(g, "v1")));
            (pdb, monitoring)
        }
        Err(e) => {
            warn!(error = %crate::human::KubeError(&e), "API discovery failed; rendering no PodDisruptionBudget and no ServiceMonitor");
            (PdbApi::None, [false; 2])
        }
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // A CRD that cannot be read is taken as absent: the agent then does without it.
    let read = |name: &'static str| {
        let crds = crds.clone();
        async move {
            match tokio::time::timeout(DISCOVERY_DEADLINE, crds.get_opt(name)).await {
                Ok(Ok(crd)) => crd,
                Ok(Err(e)) => {
                    warn!(error = %crate::human::KubeError(&e), crd = name, "cannot read a CRD; taking it as absent");
                    None
                }
                Err(_) => {
                    warn!(
                        crd = name,
                        seconds = DISCOVERY_DEADLINE.as_secs(),
                        "no answer reading a CRD; taking it as absent"
                    );
                    None
                }
            }
        }
    };
    let policy = read(POLICY_CRD).await;
    Capabilities {
        pdb_api,
        policy_crd: policy.is_some(),
        pending_supported: policy.as_ref().is_some_and(pending_in_enum),
        health_crd: read(HEALTH_CRD).await.is_some(),
        template_crd: read(TEMPLATE_CRD).await.is_some(),
        monitoring_served,
        rollout_crd: read(ROLLOUT_CRD).await.is_some(),
        override_crd: read(OVERRIDE_CRD).await.is_some(),
        hosted_cluster_crd: read(HOSTED_CLUSTER_CRD).await.is_some(),
    }
}

/// Does the v1 schema's `status.compliant` accept `Pending` (or leave the value open)?
pub(crate) fn pending_in_enum(crd: &CustomResourceDefinition) -> bool {
    let v = serde_json::to_value(crd).unwrap_or(Value::Null);
    v["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|ver| ver["name"] == "v1")
        .any(|ver| {
            ver["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["compliant"]
                ["enum"]
                .as_array()
                .is_none_or(|e| e.iter().any(|x| x == "Pending"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(values: Value) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": POLICY_CRD},
            "spec": {
                "group": "policy.open-cluster-management.io",
                "names": {"kind": "Policy", "plural": "policies"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"status": {"type": "object", "properties": {"compliant": values}}}
                }}}]
            }
        }))
        .expect("crd")
    }

    #[test]
    fn pending_is_read_from_the_enum() {
        let with = crd(
            serde_json::json!({"type": "string", "enum": ["Compliant", "Pending", "NonCompliant"]}),
        );
        let without =
            crd(serde_json::json!({"type": "string", "enum": ["Compliant", "NonCompliant"]}));
        let open = crd(serde_json::json!({"type": "string"}));
        assert!(pending_in_enum(&with));
        assert!(!pending_in_enum(&without));
        assert!(pending_in_enum(&open));
    }
}
