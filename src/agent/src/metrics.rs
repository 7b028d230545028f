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

impl DriftLabels {
    pub(crate) fn new(hcp_namespace: &str, hosted_cluster: &str, kind: &str) -> Self {
        Self {
            hcp_namespace: hcp_namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
            kind: kind.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EngineLabels {
    pub(crate) hcp_namespace: String,
    pub(crate) hosted_cluster: String,
    /// `webhook`, `policy` or `static`.
    pub(crate) engine: String,
}

impl EngineLabels {
    pub(crate) fn new(hcp_namespace: &str, hosted_cluster: &str, engine: &str) -> Self {
        Self {
            hcp_namespace: hcp_namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
            engine: engine.to_string(),
        }
    }
}

/// The `engine` label values of `hcp_fleet_guards`.
pub(crate) const ENGINES: [&str; 3] = ["webhook", "policy", "static"];

/// The `kind` label values of `hcp_fleet_webhook_drift_total`.
pub(crate) const HOSTED_KINDS: [&str; 4] = [
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// An HCP and the revision it runs (an info series: always 1, replaced when it moves).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RevisionLabels {
    pub(crate) hcp_namespace: String,
    pub(crate) hosted_cluster: String,
    pub(crate) revision: String,
}

/// The rollout's revisions and phase (an info series).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub stable: String,
    /// Empty when nothing is rolling out.
    pub target: String,
    /// Complete, Progressing or Halted.
    pub phase: String,
}

/// `state` of `hcp_fleet_rollout_hcps`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutStateLabels {
    /// in_flight, done, failed or waiting.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

fn hist() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

/// A management client: every request counted in `requests` by verb and resource, and, with
/// `limit`, sent no faster than its token bucket allows (a request waits for a token; none is
/// refused).
pub fn counted_client(
    config: kube::Config,
    requests: Family<RequestLabels, Counter>,
    limit: Option<RequestLimit>,
) -> Result<kube::Client, kube::Error> {
    let count = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        requests.get_or_create(&RequestLabels::of(&req)).inc();
        req
    });
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(match limit {
        // kube serves every clone of a Client through one buffer, so this one bucket paces
        // the whole agent: the limiter holds the buffer's next request back, not the ones
        // already sent.
        Some(l) => builder
            .with_layer(&count)
            .with_layer(&RateLimitLayer(l))
            .build(),
        None => builder.with_layer(&count).build(),
    })
}

/// `verb` and `resource` of a request to a kube-apiserver, as its own audit log names them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// get, list, watch, create, update, patch, delete, deletecollection (or the method).
    pub verb: String,
    /// The resource (with `/subresource`), or `discovery` for /api, /apis and /version.
    pub resource: String,
}

impl RequestLabels {
    pub(crate) fn of<B>(req: &http::Request<B>) -> Self {
        let (verb, resource) = request_kind(
            req.method().as_str(),
            req.uri().path(),
            req.uri().query().unwrap_or(""),
        );
        Self {
            verb: verb.into(),
            resource,
        }
    }

    /// Whether the request writes (what the management kube-apiserver must persist).
    #[cfg(test)]
    pub(crate) fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// (verb, resource) of a kube-apiserver request path: `/api/v1/[namespaces/<ns>/]<resource>
/// [/<name>[/<subresource>]]` or the same under `/apis/<group>/<version>`.
pub(crate) fn request_kind(method: &str, path: &str, query: &str) -> (&'static str, String) {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let rest = match parts.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => &[][..],
    };
    let rest = match rest {
        // A namespaced resource; `namespaces/<name>` alone is the Namespace itself.
        ["namespaces", _, r, more @ ..] => {
            let mut v = vec![*r];
            v.extend_from_slice(more);
            v
        }
        other => other.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [] => ("discovery".to_string(), false),
        [r] => (r.to_string(), false),
        [r, _] => (r.to_string(), true),
        [r, _, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

/// A token bucket: `per_second` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLimit {
    pub(crate) per_second: f64,
    pub(crate) burst: f64,
}

impl RequestLimit {
    /// The ceiling the configuration sets on management requests.
    pub fn of(cfg: &hcp_fleet_render::config::ManagementApiConfig) -> Self {
        RequestLimit {
            per_second: f64::from(cfg.requests_per_second),
            burst: f64::from(cfg.burst),
        }
    }
}

/// The bucket's state: tokens left, as of `at`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    limit: RequestLimit,
    tokens: f64,
    at: std::time::Instant,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn new(limit: RequestLimit, now: std::time::Instant) -> Self {
        Self {
            limit,
            tokens: limit.burst.max(1.0),
            at: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    pub(crate) fn take(&mut self, now: std::time::Instant) -> Result<(), std::time::Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        let rate = self.limit.per_second.max(0.001);
        self.tokens = (self.tokens + elapsed * rate).min(self.limit.burst.max(1.0));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64(
                (1.0 - self.tokens) / rate,
            ))
        }
    }
}

struct RateLimitLayer(RequestLimit);

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: Bucket::new(self.0, std::time::Instant::now()),
            wait: None,
            permitted: false,
        }
    }
}

/// Waits for a token in `poll_ready`, so the caller's next request is held back, never one
/// already sent.
struct RateLimited<S> {
    inner: S,
    bucket: Bucket,
    wait: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    permitted: bool,
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        use std::future::Future;
        while !self.permitted {
            if let Some(w) = self.wait.as_mut() {
                if w.as_mut().poll(cx).is_pending() {
                    return std::task::Poll::Pending;
                }
                self.wait = None;
            }
            match self.bucket.take(std::time::Instant::now()) {
                Ok(()) => self.permitted = true,
                Err(d) => self.wait = Some(Box::pin(tokio::time::sleep(d))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.permitted = false;
        self.inner.call(req)
    }
}

/// The `kind` label values of `hcp_fleet_management_drift_total`.
pub(crate) const MANAGEMENT_KINDS: [&str; 7] = [
    "Secret",
    "ServiceAccount",
    "Service",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "Deployment",
    "ConfigMap",
];

pub struct Metrics {
    registry: Mutex<Registry>,
    /// Not a metric: whether the controller is alive, which `/healthz` answers from (kept here
    /// because every part that must say so already holds the metrics).
    pub liveness: crate::liveness::Liveness,
    pub compliance: Family<HcpLabels, Gauge>,
    pub drift: Family<DriftLabels, Counter>,
    pub(crate) management_drift: Family<DriftLabels, Counter>,
    pub webhooks_desired: Family<HcpLabels, Gauge>,
    pub webhooks_installed: Family<HcpLabels, Gauge>,
    pub(crate) guards: Family<EngineLabels, Gauge>,
    pub cert_expiry: Family<HcpLabels, Gauge>,
    pub hosted_latency: Family<HcpLabels, Histogram, fn() -> Histogram>,
    pub hosted_errors: Family<HcpLabels, Counter>,
    pub probe_success: Family<HcpLabels, Gauge>,
    pub hosted_requests: Family<HcpLabels, Counter>,
    pub management_requests: Family<RequestLabels, Counter>,
    pub(crate) reconcile_duration: Histogram,
    pub reconcile_errors: Family<PhaseLabels, Counter>,
    pub(crate) hosted_clusters: Gauge,
    pub leader: Gauge,
    /// 1 if the configuration last read was accepted, 0 while a refused one waits.
    pub(crate) config_reload_successful: Gauge,
    /// When the configuration was last read and accepted (Unix time).
    pub(crate) config_reload_success_time: Gauge,
    pub(crate) revision: Family<RevisionLabels, Gauge>,
    pub rollout: Family<RolloutLabels, Gauge>,
    pub rollout_hcps: Family<RolloutStateLabels, Gauge>,
    pub(crate) rollout_halted: Gauge,
    pub(crate) rollout_halts: Counter,
    pub(crate) overrides: Family<OverrideLabels, Gauge>,
    pub(crate) paused: Family<PausedLabels, Gauge>,
    /// HCPs another installation of the agent owns, by its namespace.
    pub(crate) owned_elsewhere: Family<OwnerLabels, Gauge>,
    /// Which HCP namespace another installation owns, and which (`/readyz` names them).
    elsewhere: Mutex<std::collections::BTreeMap<String, String>>,
    /// Each HCP's revision series, so the next one can replace it.
    revision_of: Mutex<std::collections::HashMap<(String, String), String>>,
}

/// The running build.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabels {
    pub(crate) version: String,
    /// `ring`, or `aws-lc-fips` in the FIPS build.
    pub(crate) crypto: String,
}

/// The installation of the agent (its namespace) that owns HCPs this one leaves alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OwnerLabels {
    pub(crate) owner: String,
}

/// An HCP namespace's override and whether the agent took it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PausedLabels {
    pub(crate) hcp_namespace: String,
    pub(crate) hosted_cluster: String,
    /// Who asked: annotation, hypershift or override.
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OverrideLabels {
    pub(crate) hcp_namespace: String,
    pub(crate) hosted_cluster: String,
    /// "true" or "false".
    pub(crate) accepted: String,
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
            liveness: Default::default(),
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
            management_requests: Family::default(),
            reconcile_duration: hist(),
            reconcile_errors: Family::default(),
            hosted_clusters: Gauge::default(),
            leader: Gauge::default(),
            config_reload_successful: Gauge::default(),
            config_reload_success_time: Gauge::default(),
            revision: Family::default(),
            rollout: Family::default(),
            rollout_hcps: Family::default(),
            rollout_halted: Gauge::default(),
            rollout_halts: Counter::default(),
            overrides: Family::default(),
            paused: Family::default(),
            owned_elsewhere: Family::default(),
            elsewhere: Mutex::default(),
            revision_of: Mutex::default(),
        };
        if let Ok(mut r) = m.registry.lock() {
            m.register_hosted(&mut r);
            m.register_fleet(&mut r);
        }
        m
    }

    /// The per-hosted-cluster series, and the requests sent to the API servers.
    fn register_hosted(&self, r: &mut Registry) {
        r.register(
            "hosted_cluster_compliance",
            "Per hosted cluster: 0 compliant, 1 non-compliant, -1 pending (like ACM's policy_governance_info)",
            self.compliance.clone(),
        );
        r.register(
            "webhook_drift",
            "The agent's webhook configurations, admission policies and bindings changed or deleted in a hosted cluster by someone else and repaired",
            self.drift.clone(),
        );
        r.register(
            "management_drift",
            "Objects of the admission service in an HCP namespace (Secrets, ServiceAccount, Service, NetworkPolicy, PodDisruptionBudget, Deployment, ServiceMonitor, RoleBinding) deleted or changed by someone else and repaired",
            self.management_drift.clone(),
        );
        r.register(
            "webhook_configurations_desired",
            "Webhook configurations the agent wants in the hosted cluster",
            self.webhooks_desired.clone(),
        );
        r.register(
            "webhook_configurations_installed",
            "Webhook configurations installed and current in the hosted cluster",
            self.webhooks_installed.clone(),
        );
        r.register(
            "guards",
            "Guards in force in the hosted cluster (the probe and the Service mutation aside: each validating built-in), by the engine that carries them: webhook, policy or static (loaded from files)",
            self.guards.clone(),
        );
        r.register(
            "certificate_expiry_timestamp_seconds",
            "When the admission service's serving certificate expires (Unix time)",
            self.cert_expiry.clone(),
        );
        r.register(
            "hosted_api_request_duration_seconds",
            "Duration of the install step (the agent's writes and checks) against a hosted kube-apiserver",
            self.hosted_latency.clone(),
        );
        r.register(
            "hosted_api_errors",
            "Failures against a hosted kube-apiserver: an install step failed or timed out, a probe went unanswered, the drift watch's connection was lost, the cluster's identity could not be read",
            self.hosted_errors.clone(),
        );
        r.register(
            "hosted_api_requests",
            "Requests the agent sent to a hosted kube-apiserver (watches count once, when opened)",
            self.hosted_requests.clone(),
        );
        r.register(
            "management_api_requests",
            "Requests the agent sent to the management kube-apiserver, by verb and resource",
            self.management_requests.clone(),
        );
    }

    /// The controller's, the rollout's and the fleet's series.
    fn register_fleet(&self, r: &mut Registry) {
        r.register(
            "e2e_probe_success",
            "1 if the last end-to-end probe through the hosted kube-apiserver was answered by the admission service",
            self.probe_success.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Duration of one HCP reconcile",
            self.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that failed, by phase",
            self.reconcile_errors.clone(),
        );
        r.register(
            "hosted_clusters",
            "Hosted clusters the agent knows",
            self.hosted_clusters.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader Lease (or runs without --leader-elect)",
            self.leader.clone(),
        );
        // Which build runs, as Prometheus's own `prometheus_build_info`: join on it to tell a
        // half-rolled-out upgrade, or which version a regression came with.
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                crypto: hcp_fleet_guards::crypto::PROVIDER_NAME.into(),
            })
            .set(1);
        r.register(
            "build_info",
            "Always 1: the agent's version and its crypto provider as labels",
            build,
        );
        // Named as Prometheus and Alertmanager name theirs.
        r.register(
            "config_last_reload_successful",
            "1 if the configuration file last read was accepted, 0 while a refused one waits (the agent runs the last good one)",
            self.config_reload_successful.clone(),
        );
        r.register(
            "config_last_reload_success_timestamp_seconds",
            "When the configuration file was last read and accepted (Unix time)",
            self.config_reload_success_time.clone(),
        );
        r.register(
            "hcp_revision_info",
            "The revision each hosted cluster was last reconciled to (always 1)",
            self.revision.clone(),
        );
        r.register(
            "rollout_info",
            "The rollout's stable and target revisions and its phase (always 1)",
            self.rollout.clone(),
        );
        r.register(
            "rollout_hcps",
            "HCPs of the rollout in flight, done, failed (back on the stable revision) or waiting for their batch",
            self.rollout_hcps.clone(),
        );
        r.register(
            "rollout_halted",
            "1 while the rollout is halted (a revision failed on an HCP; see the AdmissionRollout's message)",
            self.rollout_halted.clone(),
        );
        r.register(
            "rollout_halts",
            "Rollouts halted by a failing HCP",
            self.rollout_halts.clone(),
        );
        r.register(
            "hcps_owned_elsewhere",
            "HCPs whose record names another installation of the agent (its namespace, label owner) that is alive; this one leaves them alone",
            self.owned_elsewhere.clone(),
        );
        r.register(
            "paused_since_timestamp_seconds",
            "Since when the agent has left a hosted cluster alone, by who asked (annotation, hypershift, override); absent when it does not",
            self.paused.clone(),
        );
        r.register(
            "overrides",
            "HCPs with a HostedAdmissionOverride, by whether the agent accepted it",
            self.overrides.clone(),
        );
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
        self.revision.clear();
        self.revision_of
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        self.overrides.clear();
        self.paused.clear();
        self.rollout.clear();
        self.rollout_hcps.clear();
        self.rollout_halted.set(0);
    }

    /// The one revision series of an HCP: the new one set, the one before removed.
    pub fn set_revision(&self, hcp_namespace: &str, hosted_cluster: &str, revision: Option<&str>) {
        let key = (hcp_namespace.to_string(), hosted_cluster.to_string());
        let mut last = self
            .revision_of
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let labels = |r: String| RevisionLabels {
            hcp_namespace: key.0.clone(),
            hosted_cluster: key.1.clone(),
            revision: r,
        };
        match revision {
            Some(r) => {
                if let Some(old) = last.insert(key.clone(), r.to_string())
                    && old != r
                {
                    self.revision.remove(&labels(old));
                }
                self.revision.get_or_create(&labels(r.to_string())).set(1);
            }
            None => {
                if let Some(old) = last.remove(&key) {
                    self.revision.remove(&labels(old));
                }
            }
        }
    }

    /// Whether an HCP has an override, and whether it was taken.
    pub fn set_override(&self, hcp_namespace: &str, hosted_cluster: &str, accepted: Option<bool>) {
        for a in [true, false] {
            let l = OverrideLabels {
                hcp_namespace: hcp_namespace.into(),
                hosted_cluster: hosted_cluster.into(),
                accepted: a.to_string(),
            };
            if accepted == Some(a) {
                self.overrides.get_or_create(&l).set(1);
            } else {
                self.overrides.remove(&l);
            }
        }
    }

    /// Since when an HCP has been paused, and by whom (`None`: not paused).
    /// The configuration file was read: accepted (`true`, now) or refused.
    pub fn config_read(&self, accepted: bool) {
        self.config_reload_successful.set(i64::from(accepted));
        if accepted {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            self.config_reload_success_time
                .set(i64::try_from(now).unwrap_or(i64::MAX));
        }
    }

    /// Records that `hcp_namespace` is owned by the installation in `owner` (or no longer is),
    /// the gauge counting by owner; `true` when that changed.
    pub(crate) fn set_owned_elsewhere(&self, hcp_namespace: &str, owner: Option<&str>) -> bool {
        let mut e = self
            .elsewhere
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = match owner {
            Some(o) => e.insert(hcp_namespace.to_string(), o.to_string()),
            None => e.remove(hcp_namespace),
        };
        if before.as_deref() == owner {
            return false;
        }
        for o in before.iter().map(String::as_str).chain(owner) {
            let n = e.values().filter(|v| *v == o).count();
            let l = OwnerLabels { owner: o.into() };
            if n == 0 {
                self.owned_elsewhere.remove(&l);
            } else {
                self.owned_elsewhere
                    .get_or_create(&l)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        true
    }

    /// Whether another installation owns the HCP in `hcp_namespace` (or, with `None`, any).
    pub(crate) fn owned_elsewhere(&self, hcp_namespace: Option<&str>) -> bool {
        let e = self
            .elsewhere
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hcp_namespace.map_or(!e.is_empty(), |ns| e.contains_key(ns))
    }

    /// What `/readyz` says while another installation owns HCPs here.
    pub fn owned_elsewhere_text(&self) -> Option<String> {
        let e = self
            .elsewhere
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if e.is_empty() {
            return None;
        }
        let owners: std::collections::BTreeSet<&String> = e.values().collect();
        Some(format!(
            "{} HCP(s) are owned by another installation of the agent (namespace {}); this one leaves them alone: {}",
            e.len(),
            owners.into_iter().cloned().collect::<Vec<_>>().join(", "),
            e.keys().take(5).cloned().collect::<Vec<_>>().join(", ")
        ))
    }

    pub fn set_paused(
        &self,
        hcp_namespace: &str,
        hosted_cluster: &str,
        paused: Option<(
            hcp_fleet_render::reporting::record::PauseReason,
            jiff::Timestamp,
        )>,
    ) {
        for r in hcp_fleet_render::reporting::record::PauseReason::ALL {
            let l = PausedLabels {
                hcp_namespace: hcp_namespace.into(),
                hosted_cluster: hosted_cluster.into(),
                reason: r.as_str().into(),
            };
            match paused {
                Some((by, since)) if by == r => {
                    self.paused.get_or_create(&l).set(since.as_second());
                }
                _ => {
                    self.paused.remove(&l);
                }
            }
        }
    }

    /// The counters of a newly known HCP, at zero: Prometheus's `increase` and `rate` read a
    /// counter's rise between two samples, so a series that first appears at 1 (created by the
    /// first drift repair, the first failed request) would hide that first event from the
    /// alerts (`HcpFleetGuardTampered` fires on the first repair). Five series per HCP.
    pub(crate) fn known(&self, hcp_namespace: &str, hosted_cluster: &str) {
        for kind in HOSTED_KINDS {
            let _ =
                self.drift
                    .get_or_create(&DriftLabels::new(hcp_namespace, hosted_cluster, kind));
        }
        let _ = self.hosted_errors.get_or_create(&HcpLabels {
            hcp_namespace: hcp_namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
        });
    }

    /// Drops every series of a removed HCP.
    pub(crate) fn forget(&self, hcp_namespace: &str, hosted_cluster: &str) {
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
        let drift = |kind: &str| DriftLabels::new(hcp_namespace, hosted_cluster, kind);
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
        self.set_revision(hcp_namespace, hosted_cluster, None);
        self.set_override(hcp_namespace, hosted_cluster, None);
        self.set_paused(hcp_namespace, hosted_cluster, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_the_audit_log_names_them() {
        let k = |m, p, q| {
            let (v, r) = request_kind(m, p, q);
            format!("{v} {r}")
        };
        assert_eq!(
            k("GET", "/api/v1/namespaces/clusters-a/secrets/x", ""),
            "get secrets"
        );
        assert_eq!(
            k("GET", "/api/v1/namespaces/clusters-a", ""),
            "get namespaces"
        );
        assert_eq!(k("GET", "/api/v1/namespaces", ""), "list namespaces");
        assert_eq!(
            k(
                "GET",
                "/apis/apps/v1/deployments",
                "labelSelector=a%3Db&watch=true&timeoutSeconds=290"
            ),
            "watch deployments"
        );
        assert_eq!(
            k("GET", "/apis/apps/v1/deployments", "limit=500"),
            "list deployments"
        );
        assert_eq!(
            k(
                "PATCH",
                "/apis/apps/v1/namespaces/n/deployments/d/status",
                "fieldManager=x"
            ),
            "patch deployments/status"
        );
        assert_eq!(
            k("POST", "/apis/events.k8s.io/v1/namespaces/n/events", ""),
            "create events"
        );
        assert_eq!(
            k(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/n/leases/l",
                ""
            ),
            "update leases"
        );
        assert_eq!(
            k("DELETE", "/api/v1/namespaces/n/secrets/s", ""),
            "delete secrets"
        );
        assert_eq!(
            k("DELETE", "/api/v1/namespaces/n/secrets", ""),
            "deletecollection secrets"
        );
        assert_eq!(k("GET", "/apis", ""), "list discovery");
        assert_eq!(k("GET", "/apis/apps/v1", ""), "list discovery");
        assert_eq!(k("GET", "/version", ""), "list discovery");
        assert!(
            RequestLabels {
                verb: "patch".into(),
                resource: "x".into()
            }
            .is_write()
        );
        assert!(
            !RequestLabels {
                verb: "watch".into(),
                resource: "x".into()
            }
            .is_write()
        );
    }

    #[test]
    fn the_bucket_lets_a_burst_through_then_paces() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut b = Bucket::new(
            RequestLimit {
                per_second: 10.0,
                burst: 3.0,
            },
            t0,
        );
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).expect_err("empty");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // A token a tenth of a second later, and never more saved than the burst.
        assert_eq!(b.take(t0 + Duration::from_millis(100)), Ok(()));
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
    }

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

    type Shape = std::collections::BTreeMap<String, (String, std::collections::BTreeSet<String>)>;

    /// The agent's metric table in docs/metrics.md: name to type and labels.
    fn documented_metrics() -> Shape {
        let doc = include_str!("../../../docs/metrics.md");
        let mut documented = Shape::new();
        let table = doc
            .split("| metric | type | labels | meaning |")
            .nth(1)
            .expect("the agent's metric table");
        for line in table.lines().skip(2) {
            if !line.starts_with("| `hcp_fleet_") {
                break;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let labels = cells[3]
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            documented.insert(
                cells[1].trim_matches('`').to_string(),
                (cells[2].to_string(), labels),
            );
        }
        documented
    }

    /// One series in every family (a family without one is not encoded at all).
    fn one_series_each(m: &Metrics) {
        m.known("clusters-a", "a");
        m.set_revision("clusters-a", "a", Some("r1"));
        m.set_paused(
            "clusters-a",
            "a",
            Some((
                hcp_fleet_render::reporting::record::PauseReason::ALL[0],
                jiff::Timestamp::UNIX_EPOCH,
            )),
        );
        m.set_owned_elsewhere("clusters-a", Some("other"));
        let hcp = HcpLabels {
            hcp_namespace: "clusters-a".into(),
            hosted_cluster: "a".into(),
        };
        for g in [
            &m.compliance,
            &m.webhooks_desired,
            &m.webhooks_installed,
            &m.cert_expiry,
            &m.probe_success,
        ] {
            g.get_or_create(&hcp).set(1);
        }
        m.hosted_latency.get_or_create(&hcp).observe(0.1);
        m.hosted_requests.get_or_create(&hcp).inc();
        m.management_drift
            .get_or_create(&DriftLabels {
                hcp_namespace: "clusters-a".into(),
                hosted_cluster: "a".into(),
                kind: "Deployment".into(),
            })
            .inc();
        m.guards
            .get_or_create(&EngineLabels::new("clusters-a", "a", "policy"))
            .set(1);
        m.management_requests
            .get_or_create(&RequestLabels {
                verb: "get".into(),
                resource: "leases".into(),
            })
            .inc();
        m.reconcile_errors
            .get_or_create(&PhaseLabels {
                phase: "probe".into(),
            })
            .inc();
        m.rollout
            .get_or_create(&RolloutLabels {
                stable: "r1".into(),
                target: String::new(),
                phase: "Complete".into(),
            })
            .set(1);
        m.rollout_hcps
            .get_or_create(&RolloutStateLabels {
                state: "done".into(),
            })
            .set(1);
        m.overrides
            .get_or_create(&OverrideLabels {
                hcp_namespace: "clusters-a".into(),
                hosted_cluster: "a".into(),
                accepted: "true".into(),
            })
            .set(1);
    }

    /// Each family in OpenMetrics text: name (a counter's with `_total`, as its samples and
    /// the docs name it) to type and the labels its samples carry (`le` aside).
    fn registered_metrics(text: &str) -> Shape {
        let mut registered = Shape::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let name = if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_string()
                };
                registered.insert(name, (kind.to_string(), Default::default()));
                continue;
            }
            let Some((series, rest)) = line.split_once('{') else {
                continue;
            };
            let family = registered
                .keys()
                .filter(|f| {
                    series
                        .strip_prefix(f.trim_end_matches("_total"))
                        .is_some_and(|s| ["_total", "_bucket", "_sum", "_count", ""].contains(&s))
                })
                .max_by_key(|f| f.len())
                .cloned();
            let (Some(f), Some((labels, _))) = (family, rest.split_once('}')) else {
                continue;
            };
            for pair in labels.split(',') {
                if let Some((k, _)) = pair.split_once('=')
                    && k != "le"
                {
                    registered
                        .entry(f.clone())
                        .or_default()
                        .1
                        .insert(k.to_string());
                }
            }
        }
        registered
    }

    /// docs/metrics.md is what dashboards and alerts are written from: each metric the agent
    /// registers has its row, with the same type and labels, and each row names a registered
    /// metric.
    #[test]
    fn docs_metrics_md_lists_every_metric_with_its_type_and_labels() {
        let documented = documented_metrics();
        let m = Metrics::new();
        one_series_each(&m);
        let registered = registered_metrics(&m.encode());
        assert_eq!(
            registered.keys().collect::<Vec<_>>(),
            documented.keys().collect::<Vec<_>>(),
            "registered (left) and documented (right) metrics differ"
        );
        for (name, (kind, labels)) in &registered {
            let (doc_kind, doc_labels) = &documented[name];
            assert_eq!(kind, doc_kind, "{name}'s type");
            assert!(
                !labels.is_empty() || doc_labels.is_empty(),
                "{name} has a series"
            );
            assert_eq!(labels, doc_labels, "{name}'s labels");
        }
    }
}
