//! The hosted cluster's own requests this replica denied lately (its nodes, machinery,
//! HyperShift's control plane, its platform operators: `identities::CLUSTER_SENDERS`), which
//! it reports to the agent (`probe::OWN_DENIALS_PATH`). The agent asks every replica: each
//! knows only its own denials, and the hosted kube-apiserver may send all of one webhook's
//! calls to one replica and the probe's to another. So a guard breaking the cluster shows on
//! the health record (docs/admission.md, "When a guard denies the cluster").

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use hcp_fleet_guards::identities::is_the_cluster;
use hcp_fleet_guards::probe::REPORT_WINDOW;

/// When each guard last denied each of the cluster's own senders. Bounded by guards × senders;
/// only the cluster's own denials take the lock, and those are the incident, not the traffic.
#[derive(Default)]
pub struct OwnDenials {
    last: Mutex<BTreeMap<(String, &'static str), Instant>>,
}

impl OwnDenials {
    /// Notes a denial by `webhook` of `sender` (`identities::sender_of`) now; any other
    /// sender than the cluster's own is left out, and the clock is read only for those.
    pub fn note_now(&self, webhook: &str, sender: &'static str) {
        if is_the_cluster(sender) {
            self.note(webhook, sender, Instant::now());
        }
    }

    /// Notes a denial by `webhook` of `sender` at `at`, as `note_now`.
    pub fn note(&self, webhook: &str, sender: &'static str, at: Instant) {
        if !is_the_cluster(sender) {
            return;
        }
        if let Ok(mut last) = self.last.lock() {
            last.insert((webhook.to_string(), sender), at);
        }
    }

    /// "<webhook> denied <sender>" for each pair denied within `REPORT_WINDOW` before `now`,
    /// in order: the same words while the same guards deny the same senders, so a steady
    /// incident does not rewrite the health record at every probe.
    pub fn report(&self, now: Instant) -> Vec<String> {
        let Ok(mut last) = self.last.lock() else {
            return Vec::new();
        };
        last.retain(|_, at| now.saturating_duration_since(*at) < REPORT_WINDOW);
        last.keys()
            .map(|(webhook, sender)| format!("{webhook} denied {sender}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_the_clusters_own_senders_and_only_within_the_window_are_reported() {
        let d = OwnDenials::default();
        let t0 = Instant::now();
        d.note("scc.hcp-fleet.openshift.io", "tenant", t0);
        d.note("scc.hcp-fleet.openshift.io", "customerAdmins", t0);
        d.note("scc.hcp-fleet.openshift.io", "sre", t0);
        assert!(d.report(t0).is_empty(), "people are not the cluster");
        d.note("identity-namespaces.hcp-fleet.openshift.io", "node", t0);
        d.note("scc.hcp-fleet.openshift.io", "platformOperators", t0);
        d.note("identity-namespaces.hcp-fleet.openshift.io", "node", t0);
        let both = vec![
            "identity-namespaces.hcp-fleet.openshift.io denied node".to_string(),
            "scc.hcp-fleet.openshift.io denied platformOperators".to_string(),
        ];
        assert_eq!(d.report(t0), both);
        // A later denial keeps its pair in; the other one ages out at the window's end.
        let later = t0 + Duration::from_secs(300);
        d.note("identity-namespaces.hcp-fleet.openshift.io", "node", later);
        assert_eq!(d.report(t0 + REPORT_WINDOW - Duration::from_secs(1)), both);
        assert_eq!(
            d.report(t0 + REPORT_WINDOW),
            vec![both[0].clone()],
            "the pair denied once only is gone after the window"
        );
        assert!(d.report(later + REPORT_WINDOW).is_empty());
    }
}
