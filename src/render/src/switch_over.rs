//! The agent's part of a switch-over from OpenShift's managed webhooks (MCVW): where every
//! guard of an HCP is proven in force, its namespace carries a label the fleet's MCVW Policy
//! selects against (docs/operations.md, "Switching over from MCVW"), so ACM removes MCVW's
//! package there and nowhere else. Pure: when, and the patch.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The label. Its one value is `"true"`; the agent never removes it.
pub const GUARDS_PROVEN_LABEL: &str = "hcp-fleet.openshift.io/guards-proven";

/// The field manager of the label alone, so that the agent's apply owns that one field of a
/// namespace HyperShift owns, and never contends with HyperShift's own labels.
pub const FIELD_MANAGER: &str = "hcp-fleet-agent-switch-over";

/// How far an HCP's guards are proven: the probe's verdict, and per guard with a canary
/// whether its last canary was denied by it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The probe found every path (webhook, policy, static) answering as the agent's own.
    pub probe_proven: bool,
    /// Enforced guards with a canary.
    pub canaries: usize,
    /// Of those, the ones whose last canary the guard itself denied.
    pub denied: usize,
    /// Of those, the ones whose last canary found nothing to act on: the cluster does not
    /// serve its kind or lacks its object. Such a guard, and MCVW's for the same kind, has
    /// nothing to keep in that cluster until it does.
    pub absent: usize,
}

impl Evidence {
    /// Whether MCVW's package may go: the probe proven, and every canary denied but those
    /// with nothing to act on. A plan with no canary denied proves no guard, so it never
    /// qualifies.
    pub fn proven(&self) -> bool {
        self.probe_proven && self.denied > 0 && self.denied + self.absent == self.canaries
    }
}

/// Whether `labels` (a namespace's) already say the guards are proven.
pub fn labelled(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(GUARDS_PROVEN_LABEL))
        .is_some_and(|v| v == "true")
}

/// The server-side apply of the label (and nothing else) on namespace `ns`.
pub fn label_patch(ns: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            labels: Some([(GUARDS_PROVEN_LABEL.to_string(), "true".to_string())].into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_proven_probe_and_every_canary_denied_let_mcvw_go() {
        let e = |probe_proven, canaries, denied, absent| Evidence {
            probe_proven,
            canaries,
            denied,
            absent,
        };
        assert!(e(true, 12, 12, 0).proven());
        // Two guards' kinds not served here: nothing of theirs to keep.
        assert!(e(true, 12, 10, 2).proven());
        // One canary not yet denied (not tried, failed, or denied by something else).
        assert!(!e(true, 12, 11, 0).proven());
        assert!(!e(true, 12, 10, 1).proven());
        // Every canary denied, but a path does not answer as the agent's own.
        assert!(!e(false, 12, 12, 0).proven());
        // Nothing enforced with a canary, or nothing to act on anywhere: nothing is proven.
        assert!(!e(true, 0, 0, 0).proven());
        assert!(!e(true, 3, 0, 3).proven());
    }

    #[test]
    fn the_patch_carries_the_label_alone() {
        let ns = label_patch("clusters-a");
        let v = serde_json::to_value(&ns).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "clusters-a", "labels": {GUARDS_PROVEN_LABEL: "true"}}})
        );
        assert!(labelled(ns.metadata.labels.as_ref()));
        let other = [(GUARDS_PROVEN_LABEL.to_string(), "false".to_string())].into();
        assert!(!labelled(Some(&other)));
        assert!(!labelled(None));
    }
}
