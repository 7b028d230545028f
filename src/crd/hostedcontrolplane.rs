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

/// Annotation on a HostedControlPlane that stops the agent from changing anything for it:
/// `"true"`, or an RFC 3339 time until which it holds (like HyperShift's `pausedUntil`).
pub const PAUSE_ANNOTATION: &str = "hcp-fleet.openshift.io/paused";

/// Whether the agent leaves an HCP alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pause {
    /// No annotation, or its time has passed.
    Off,
    Indefinite,
    Until(jiff::Timestamp),
    /// A value that is neither; the agent goes on and says why.
    Invalid(String),
}

impl HostedControlPlane {
    /// The pause the annotation asks for, at `now`.
    pub fn pause(&self, now: jiff::Timestamp) -> Pause {
        let Some(v) = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PAUSE_ANNOTATION))
        else {
            return Pause::Off;
        };
        match v.trim() {
            "true" => Pause::Indefinite,
            "false" | "" => Pause::Off,
            t => match t.parse::<jiff::Timestamp>() {
                Ok(until) if until > now => Pause::Until(until),
                Ok(_) => Pause::Off,
                Err(_) => Pause::Invalid(format!(
                    "{PAUSE_ANNOTATION}={t:?} is neither \"true\" nor an RFC 3339 time; not paused"
                )),
            },
        }
    }

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

    fn with_pause(v: &str) -> HostedControlPlane {
        let mut h = HostedControlPlane::new("hc", Default::default());
        h.metadata.annotations = Some([(PAUSE_ANNOTATION.to_string(), v.to_string())].into());
        h
    }

    #[test]
    fn pause_reads_true_a_future_time_or_nothing() {
        let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().expect("ts");
        assert_eq!(
            HostedControlPlane::new("hc", Default::default()).pause(now),
            Pause::Off
        );
        assert_eq!(with_pause("true").pause(now), Pause::Indefinite);
        assert_eq!(with_pause("false").pause(now), Pause::Off);
        assert_eq!(
            with_pause("2026-11-23T00:00:00Z").pause(now),
            Pause::Until("2026-11-23T00:00:00Z".parse().expect("ts"))
        );
        assert_eq!(
            with_pause("2026-11-21T00:00:00Z").pause(now),
            Pause::Off,
            "expired"
        );
        assert!(
            matches!(with_pause("yes please").pause(now), Pause::Invalid(m) if m.contains("yes please"))
        );
    }

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
