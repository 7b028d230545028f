//! The agent's Prometheus metrics (prometheus-client, OpenMetrics text). Per hosted cluster
//! series are labelled by HCP namespace and dropped when the HCP goes away.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HcpLabels {
    pub hcp_namespace: String,
    pub hosted_cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    pub hcp_namespace: String,
    pub hosted_cluster: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    pub hcp_namespace: String,
    pub hosted_cluster: String,
    /// `webhook` or `policy`.
    pub engine: String,
}

impl EngineLabels {
    pub fn new(hcp_namespace: &str, hosted_cluster: &str, engine: &str) -> Self {
        Self {
            hcp_namespace: hcp_namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
            engine: engine.to_string(),
        }
    }
}

/// The `engine` label values of `hcp_fleet_guards`.
pub const ENGINES: [&str; 2] = ["webhook", "policy"];

/// The `kind` label values of `hcp_fleet_webhook_drift_total`.
pub const HOSTED_KINDS: [&str; 4] = [
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

fn hist() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

/// A client whose every request increments `counter`.
pub fn counted_client(config: kube::Config, counter: Counter) -> Result<kube::Client, kube::Error> {
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        counter.inc();
        req
    });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

/// The `kind` label values of `hcp_fleet_management_drift_total`.
pub const MANAGEMENT_KINDS: [&str; 6] = [
    "Secret",
    "ServiceAccount",
    "Service",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "Deployment",
];

pub struct Metrics {
    registry: Mutex<Registry>,
    pub compliance: Family<HcpLabels, Gauge>,
    pub drift: Family<DriftLabels, Counter>,
    pub management_drift: Family<DriftLabels, Counter>,
    pub webhooks_desired: Family<HcpLabels, Gauge>,
    pub webhooks_installed: Family<HcpLabels, Gauge>,
    pub guards: Family<EngineLabels, Gauge>,
    pub cert_expiry: Family<HcpLabels, Gauge>,
    pub hosted_latency: Family<HcpLabels, Histogram, fn() -> Histogram>,
    pub hosted_errors: Family<HcpLabels, Counter>,
    pub probe_success: Family<HcpLabels, Gauge>,
    pub hosted_requests: Family<HcpLabels, Counter>,
    pub management_requests: Counter,
    pub reconcile_duration: Histogram,
    pub reconcile_errors: Family<PhaseLabels, Counter>,
    pub hosted_clusters: Gauge,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Self {
            registry: Mutex::new(Registry::with_prefix("hcp_fleet")),
            compliance: Family::default(),
            drift: Family::default(),
            management_drift: Family::default(),
            webhooks_desired: Family::default(),
            webhooks_installed: Family::default(),
            guards: Family::default(),
            cert_expiry: Family::default(),
            hosted_latency: Family::new_with_constructor(hist),
            hosted_errors: Family::default(),
            probe_success: Family::default(),
            hosted_requests: Family::default(),
            management_requests: Counter::default(),
            reconcile_duration: hist(),
            reconcile_errors: Family::default(),
            hosted_clusters: Gauge::default(),
            leader: Gauge::default(),
        };
        if let Ok(mut r) = m.registry.lock() {
            r.register(
                "hosted_cluster_compliance",
                "Per hosted cluster: 0 compliant, 1 non-compliant, -1 pending (like ACM's policy_governance_info)",
                m.compliance.clone(),
            );
            r.register(
                "webhook_drift",
                "The agent's webhook configurations, admission policies and bindings changed or deleted in a hosted cluster by someone else and repaired",
                m.drift.clone(),
            );
            r.register(
                "management_drift",
                "Objects of the admission service in an HCP namespace (Secrets, Service, NetworkPolicy, PodDisruptionBudget, ServiceAccount, Deployment) deleted or changed by someone else and repaired",
                m.management_drift.clone(),
            );
            r.register(
                "webhook_configurations_desired",
                "Webhook configurations the agent wants in the hosted cluster",
                m.webhooks_desired.clone(),
            );
            r.register(
                "webhook_configurations_installed",
                "Webhook configurations installed and current in the hosted cluster",
                m.webhooks_installed.clone(),
            );
            r.register(
                "guards",
                "Guards in force in the hosted cluster (the probe and the Service mutation aside: each validating built-in), by the engine that carries them: webhook or policy",
                m.guards.clone(),
            );
            r.register(
                "certificate_expiry_timestamp_seconds",
                "When the admission service's serving certificate expires (Unix time)",
                m.cert_expiry.clone(),
            );
            r.register(
                "hosted_api_request_duration_seconds",
                "Latency of the agent's calls to a hosted kube-apiserver",
                m.hosted_latency.clone(),
            );
            r.register(
                "hosted_api_errors",
                "Failed calls to a hosted kube-apiserver",
                m.hosted_errors.clone(),
            );
            r.register(
                "hosted_api_requests",
                "Requests the agent sent to a hosted kube-apiserver (watches count once, when opened)",
                m.hosted_requests.clone(),
            );
            r.register(
                "management_api_requests",
                "Requests the agent sent to the management kube-apiserver",
                m.management_requests.clone(),
            );
            r.register(
                "e2e_probe_success",
                "1 if the last end-to-end probe through the hosted kube-apiserver was answered by the admission service",
                m.probe_success.clone(),
            );
            r.register(
                "reconcile_duration_seconds",
                "Duration of one HCP reconcile",
                m.reconcile_duration.clone(),
            );
            r.register(
                "reconcile_errors",
                "Reconciles that failed, by phase",
                m.reconcile_errors.clone(),
            );
            r.register(
                "hosted_clusters",
                "Hosted clusters the agent knows",
                m.hosted_clusters.clone(),
            );
            r.register(
                "leader",
                "1 while this replica holds the leader lease",
                m.leader.clone(),
            );
        }
        m
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            // Writing to a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        }
        out
    }

    /// Drops every per-hosted-cluster series, for a replica that stops leading: its last
    /// verdicts would otherwise linger beside the new leader's and skew `max by` alerts.
    pub fn forget_fleet(&self) {
        self.compliance.clear();
        self.drift.clear();
        self.management_drift.clear();
        self.webhooks_desired.clear();
        self.webhooks_installed.clear();
        self.guards.clear();
        self.cert_expiry.clear();
        self.hosted_latency.clear();
        self.hosted_errors.clear();
        self.probe_success.clear();
        self.hosted_requests.clear();
        self.hosted_clusters.set(0);
    }

    /// Drops every series of a removed HCP.
    pub fn forget(&self, hcp_namespace: &str, hosted_cluster: &str) {
        let l = HcpLabels {
            hcp_namespace: hcp_namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
        };
        self.compliance.remove(&l);
        self.webhooks_desired.remove(&l);
        self.webhooks_installed.remove(&l);
        self.cert_expiry.remove(&l);
        self.hosted_latency.remove(&l);
        self.hosted_errors.remove(&l);
        self.probe_success.remove(&l);
        self.hosted_requests.remove(&l);
        let drift = |kind: &str| DriftLabels {
            hcp_namespace: l.hcp_namespace.clone(),
            hosted_cluster: l.hosted_cluster.clone(),
            kind: kind.to_string(),
        };
        for kind in HOSTED_KINDS {
            self.drift.remove(&drift(kind));
        }
        for engine in ENGINES {
            self.guards
                .remove(&EngineLabels::new(hcp_namespace, hosted_cluster, engine));
        }
        for kind in MANAGEMENT_KINDS {
            self.management_drift.remove(&drift(kind));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_of_a_removed_hcp_are_dropped() {
        let m = Metrics::new();
        let l = HcpLabels {
            hcp_namespace: "clusters-a".into(),
            hosted_cluster: "a".into(),
        };
        m.compliance.get_or_create(&l).set(1);
        m.drift
            .get_or_create(&DriftLabels {
                hcp_namespace: "clusters-a".into(),
                hosted_cluster: "a".into(),
                kind: "ValidatingWebhookConfiguration".into(),
            })
            .inc();
        let text = m.encode();
        assert!(text.contains("hcp_fleet_hosted_cluster_compliance{hcp_namespace=\"clusters-a\",hosted_cluster=\"a\"} 1"), "{text}");
        assert!(text.contains("hcp_fleet_webhook_drift_total{"), "{text}");
        m.forget("clusters-a", "a");
        let text = m.encode();
        assert!(!text.contains("clusters-a"), "{text}");
        assert!(text.ends_with("# EOF\n"), "OpenMetrics text");
    }
}
