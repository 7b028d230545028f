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

impl Pause {
    /// Whether it keeps the agent's hands off now (an invalid value does not).
    pub fn holds(&self) -> bool {
        matches!(self, Pause::Indefinite | Pause::Until(_))
    }
}

/// One pause value (`"true"`, an RFC 3339 time, or nothing), from `what`, at `now`.
fn read_pause(what: &str, value: Option<&str>, now: jiff::Timestamp) -> Pause {
    let Some(v) = value else {
        return Pause::Off;
    };
    match v.trim() {
        "true" => Pause::Indefinite,
        "false" | "" => Pause::Off,
        t => match t.parse::<jiff::Timestamp>() {
            Ok(until) if until > now => Pause::Until(until),
            Ok(_) => Pause::Off,
            Err(_) => Pause::Invalid(format!(
                "{what}={t:?} is neither \"true\" nor an RFC 3339 time; not paused"
            )),
        },
    }
}

/// The HCP's `controllerAvailabilityPolicy` is `SingleReplica` (the CRD's default is
/// `HighlyAvailable`).
pub(crate) const SINGLE_REPLICA: &str = "SingleReplica";

/// Where and how many: what the HCP's spec says about scheduling its control plane, which
/// the admission service follows like HyperShift's own components.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scheduling {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    pub single_replica: bool,
    /// Fields present but malformed: not applied, and said so.
    pub ignored: Vec<String>,
}

impl HostedControlPlane {
    /// Each pause source at `now`: the agent's annotation, then HyperShift's
    /// `spec.pausedUntil`.
    pub fn pauses(&self, now: jiff::Timestamp) -> (Pause, Pause) {
        let annotation = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PAUSE_ANNOTATION))
            .map(String::as_str);
        let spec = self.spec.extra.get("pausedUntil").and_then(|v| v.as_str());
        (
            read_pause(PAUSE_ANNOTATION, annotation, now),
            read_pause("spec.pausedUntil", spec, now),
        )
    }

    /// The pause asked for at `now`, by the agent's annotation or by HyperShift's own
    /// `spec.pausedUntil` (whichever holds longer): while HyperShift leaves the control plane
    /// alone, the agent leaves its admission service alone too.
    pub fn pause(&self, now: jiff::Timestamp) -> Pause {
        match self.pauses(now) {
            (Pause::Indefinite, _) | (_, Pause::Indefinite) => Pause::Indefinite,
            (Pause::Until(a), Pause::Until(b)) => Pause::Until(a.max(b)),
            (p @ Pause::Until(_), _) | (_, p @ Pause::Until(_)) => p,
            (p @ Pause::Invalid(_), _) | (_, p @ Pause::Invalid(_)) => p,
            (Pause::Off, Pause::Off) => Pause::Off,
        }
    }

    /// What pauses the HCP at `now`: the agent's annotation, HyperShift's `spec.pausedUntil`,
    /// or both (for the report).
    pub fn paused_by(&self, now: jiff::Timestamp) -> String {
        let (annotation, spec) = self.pauses(now);
        match (annotation.holds(), spec.holds()) {
            (true, true) => format!("{PAUSE_ANNOTATION} and spec.pausedUntil"),
            (false, true) => "spec.pausedUntil".into(),
            _ => PAUSE_ANNOTATION.into(),
        }
    }

    /// `spec.nodeSelector`, `spec.tolerations` and `spec.controllerAvailabilityPolicy`, read
    /// leniently: a malformed field is left out (and named), never a reason to drop the HCP.
    pub fn scheduling(&self) -> Scheduling {
        let mut out = Scheduling::default();
        let extra = &self.spec.extra;
        if let Some(v) = extra.get("nodeSelector").filter(|v| !v.is_null()) {
            match serde_json::from_value(v.clone()) {
                Ok(m) => out.node_selector = m,
                Err(e) => out.ignored.push(format!("spec.nodeSelector: {e}")),
            }
        }
        if let Some(v) = extra.get("tolerations").filter(|v| !v.is_null()) {
            match serde_json::from_value(v.clone()) {
                Ok(t) => out.tolerations = t,
                Err(e) => out.ignored.push(format!("spec.tolerations: {e}")),
            }
        }
        out.single_replica = extra
            .get("controllerAvailabilityPolicy")
            .and_then(|v| v.as_str())
            == Some(SINGLE_REPLICA);
        out
    }

    /// The fields of HyperShift's spec the agent reads (`pauses`, `scheduling`); the rest of
    /// an HCP is HyperShift's own, and large.
    pub const SPEC_READ: [&'static str; 4] = [
        "pausedUntil",
        "nodeSelector",
        "tolerations",
        "controllerAvailabilityPolicy",
    ];

    /// This HCP as the controller's store keeps it: only what the agent reads (the metadata,
    /// `SPEC_READ`, `status.ready` and `status.kubeConfig`). An HCP carries HyperShift's whole
    /// spec and status (its platform, networking, services, release, conditions), which at a
    /// thousand HCPs was about 20 KiB of the agent's memory per HCP (`make bench`, heaptrack),
    /// read by nothing here. The agent never writes an HCP, so nothing is lost.
    pub fn keep_only_what_is_read(&mut self) {
        self.spec
            .extra
            .retain(|k, _| Self::SPEC_READ.contains(&k.as_str()));
        if let Some(s) = &mut self.status {
            s.extra.clear();
            s.conditions.clear();
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
    fn hypershifts_paused_until_pauses_too_and_the_longer_pause_wins() {
        let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().expect("ts");
        let spec = |v: &str| HostedControlPlaneSpec {
            extra: [("pausedUntil".to_string(), serde_json::json!(v))].into(),
            ..Default::default()
        };
        let hcp = HostedControlPlane::new("hc", spec("true"));
        assert_eq!(hcp.pause(now), Pause::Indefinite);
        let hcp = HostedControlPlane::new("hc", spec("2026-11-23T00:00:00Z"));
        assert_eq!(
            hcp.pause(now),
            Pause::Until("2026-11-23T00:00:00Z".parse().expect("ts"))
        );
        // Both: the later time holds.
        let mut both = with_pause("2026-11-24T00:00:00Z");
        both.spec = spec("2026-11-23T00:00:00Z");
        assert_eq!(
            both.pause(now),
            Pause::Until("2026-11-24T00:00:00Z".parse().expect("ts"))
        );
        // A malformed spec value is reported, an expired one ignored.
        assert_eq!(hcp.paused_by(now), "spec.pausedUntil");
        assert_eq!(
            both.paused_by(now),
            format!("{PAUSE_ANNOTATION} and spec.pausedUntil")
        );
        let bad = HostedControlPlane::new("hc", spec("soon"));
        assert!(matches!(bad.pause(now), Pause::Invalid(m) if m.contains("spec.pausedUntil")));
        let old = HostedControlPlane::new("hc", spec("2026-11-21T00:00:00Z"));
        assert_eq!(old.pause(now), Pause::Off);
    }

    #[test]
    fn scheduling_is_read_leniently_from_the_spec() {
        let raw = serde_json::json!({
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "HostedControlPlane",
            "metadata": {"name": "hc1", "namespace": "clusters-hc1"},
            "spec": {
                "nodeSelector": {"node-role.kubernetes.io/infra": ""},
                "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
                "controllerAvailabilityPolicy": "SingleReplica"
            }
        });
        let hcp: HostedControlPlane = serde_json::from_value(raw).expect("parse");
        let s = hcp.scheduling();
        assert_eq!(
            s.node_selector
                .get("node-role.kubernetes.io/infra")
                .map(String::as_str),
            Some("")
        );
        assert_eq!(s.tolerations.len(), 1);
        assert_eq!(s.tolerations[0].key.as_deref(), Some("infra"));
        assert!(s.single_replica);
        assert!(s.ignored.is_empty());
        // Malformed: named and left out; the HCP itself still parses.
        let raw = serde_json::json!({
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "HostedControlPlane",
            "metadata": {"name": "hc1", "namespace": "clusters-hc1"},
            "spec": {"nodeSelector": ["not", "a", "map"], "tolerations": "none"}
        });
        let hcp: HostedControlPlane = serde_json::from_value(raw).expect("parse");
        let s = hcp.scheduling();
        assert!(s.node_selector.is_empty() && s.tolerations.is_empty());
        assert!(!s.single_replica, "HighlyAvailable is the CRD's default");
        assert_eq!(s.ignored.len(), 2, "{:?}", s.ignored);
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

    /// The store's copy answers every question the agent asks of an HCP as the whole object
    /// does, and holds nothing else of HyperShift's spec and status.
    #[test]
    fn what_the_store_keeps_answers_as_the_whole_hcp() {
        let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().expect("ts");
        let raw = serde_json::json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane",
            "metadata": {"name": "hc", "namespace": "clusters-hc", "annotations": {PAUSE_ANNOTATION: "false"}},
            "spec": {"kubeconfig": {"name": "kc", "key": "kubeconfig"},
                     "pausedUntil": "2026-11-23T00:00:00Z",
                     "nodeSelector": {"role": "cp"},
                     "tolerations": [{"key": "cp", "operator": "Exists"}],
                     "controllerAvailabilityPolicy": "SingleReplica",
                     "platform": {"type": "AWS", "aws": {"region": "us-east-1"}},
                     "networking": {"clusterNetwork": [{"cidr": "10.132.0.0/14"}]},
                     "services": [{"service": "APIServer"}]},
            "status": {"ready": true, "kubeConfig": {"name": "admin-kubeconfig", "key": "kubeconfig"},
                       "conditions": [{"type": "Available", "status": "True"}],
                       "version": {"desired": {"image": "x"}}}
        });
        let whole: HostedControlPlane = serde_json::from_value(raw).expect("parse");
        let mut kept = whole.clone();
        kept.keep_only_what_is_read();
        assert_eq!(kept.pause(now), whole.pause(now));
        assert_eq!(kept.scheduling(), whole.scheduling());
        assert!(kept.scheduling().single_replica);
        assert_eq!(kept.is_ready(), whole.is_ready());
        assert_eq!(kept.spec.kubeconfig, whole.spec.kubeconfig);
        assert_eq!(kept.metadata, whole.metadata);
        let mut spec: Vec<&str> = kept.spec.extra.keys().map(String::as_str).collect();
        spec.sort_unstable();
        let mut read = HostedControlPlane::SPEC_READ.to_vec();
        read.sort_unstable();
        assert_eq!(spec, read);
        let status = kept.status.expect("status");
        assert!(status.extra.is_empty() && status.conditions.is_empty());
    }
}
