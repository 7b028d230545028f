//! The agent's configuration: a YAML file (the chart mounts it from a ConfigMap) with flag and
//! environment overrides. Validated at load against the guardrails (docs/configuration.md): a bad file
//! is refused with every problem listed, and a running agent keeps its last good configuration.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use hcp_fleet_guards::HookSetting;

use hcp_fleet_guards::Settings;
use hcp_fleet_guards::identities::IdentityClass;

// The definition types are the catalogue's (`hcp_fleet_guards::catalogue`): the configuration
// file's schema uses them, every crate names them there.
use hcp_fleet_guards::catalogue::{
    GuardEngine, LabelSelector, LabelSelectorRequirement, Rule, WebhookDefinition,
};
use hcp_fleet_model::Mode;

/// This release's own image (`make image` builds it; the chart's default is the same), which
/// also runs the admission service (`webhook` command).
pub const DEFAULT_IMAGE: &str = concat!(
    "quay.io/hcp-fleet/hcp-fleet-agent:",
    env!("CARGO_PKG_VERSION")
);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid configuration YAML: {reason}")]
    Parse { path: String, reason: String },
    #[error("{path}: {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
    Invalid { path: String, problems: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// The guards: the built-ins, each replaced by an entry of the same name in the file's
    /// `webhooks:` list, then the list's other entries added. A list never drops a built-in
    /// by leaving it out (a two-entry list once silently uninstalled seven); `disabledGuards`
    /// does, by name.
    #[serde(default = "default_webhooks", deserialize_with = "over_builtins")]
    pub webhooks: Vec<WebhookDefinition>,
    /// Built-in (or added) guards not installed anywhere, by name. The probe cannot be
    /// disabled: it is what proves the others reachable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) disabled_guards: Vec<String>,
    #[serde(default)]
    pub admission: AdmissionConfig,
    #[serde(default)]
    pub hosted_access: HostedAccessConfig,
    #[serde(default)]
    pub certificates: CertificateConfig,
    #[serde(default)]
    pub management_api: ManagementApiConfig,
    /// How a new revision reaches the HCPs: canaries, batches, soak, deadline.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// How many HCPs reconcile at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: u16,
    /// Seconds between end-to-end probes of each hosted cluster (a dry-run request through
    /// its kube-apiserver that the admission service must answer).
    #[serde(default = "default_probe_interval")]
    pub probe_interval_seconds: u32,
    /// How the agent reports to ACM (docs/reporting.md).
    #[serde(default)]
    pub reporting: ReportingConfig,
    /// The longest the agent leaves an HCP alone when asked to (the pause annotation, an
    /// override, HyperShift's `spec.pausedUntil`), in hours, counted from when it first saw
    /// the pause; past it the agent goes back to work and the pause alert keeps firing until
    /// the pause is removed. 0: no maximum.
    #[serde(default)]
    pub max_pause_hours: u32,
    /// The guards the hosted kube-apiserver loads from files (`engine: static`,
    /// docs/static-guards.md).
    #[serde(default)]
    pub(crate) static_guards: StaticGuardsConfig,
    /// Taking over from OpenShift's managed webhooks (MCVW) (docs/operations.md, "Switching
    /// over from MCVW").
    #[serde(default)]
    pub switch_over: SwitchOverConfig,
}

/// The agent's part of a switch-over from MCVW's package: it says where its guards are proven
/// in force, for the fleet's MCVW Policy to stop selecting those HCP namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SwitchOverConfig {
    /// Label an HCP's namespace `hcp-fleet.openshift.io/guards-proven: "true"` once its probe
    /// is proven and the last canary of every enforced guard that has one was denied. The
    /// agent never takes the label away: a guard failing later is an alert, not a reason to
    /// bring MCVW back by itself. The chart grants the agent `get` and `patch` on namespaces
    /// only while this is on.
    pub label_proven_namespaces: bool,
}

/// Where the hosted kube-apiserver finds the static guards, and whether the API-side guards
/// stay beside them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub(crate) struct StaticGuardsConfig {
    /// Where the hosted kube-apiserver's pod mounts the ConfigMap `hcp-fleet-static-guards`
    /// (its admission configuration names the directories under it). Absolute.
    pub(crate) mount_path: String,
    /// Keep the API-side guard (policy or webhook) of a guard the static guards carry, as a
    /// second layer. Off: a guard proven in force from files has no API-side object at all.
    pub(crate) second_layer: bool,
}

impl Default for StaticGuardsConfig {
    fn default() -> Self {
        Self {
            mount_path: "/etc/kubernetes/hcp-fleet-guards".into(),
            second_layer: false,
        }
    }
}

/// Reporting to ACM: how an ACM managed cluster is matched to its HCP where ACM runs the
/// governance addons in hosted mode (docs/reporting.md, "What an SRE sees on the hub").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReportingConfig {
    /// The prefix ACM's discovery gives the managed clusters of this management cluster's
    /// hosted clusters (`<prefix>-<hosted cluster name>`). Empty: only the HostedCluster's
    /// `cluster.open-cluster-management.io/managedcluster-name` annotation and its name are
    /// matched.
    pub discovery_prefix: String,
}

fn default_probe_interval() -> u32 {
    60
}

fn default_concurrency() -> u16 {
    16
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            webhooks: default_webhooks(),
            disabled_guards: Vec::new(),
            admission: AdmissionConfig::default(),
            hosted_access: HostedAccessConfig::default(),
            certificates: CertificateConfig::default(),
            management_api: ManagementApiConfig::default(),
            rollout: RolloutConfig::default(),
            concurrency: default_concurrency(),
            probe_interval_seconds: default_probe_interval(),
            reporting: ReportingConfig::default(),
            max_pause_hours: 0,
            static_guards: StaticGuardsConfig::default(),
            switch_over: SwitchOverConfig::default(),
        }
    }
}

/// The agent's own client to the management kube-apiserver: a ceiling on the requests it
/// sends, so a start with a thousand HCPs (or a configuration change that touches all of
/// them) queues in the agent instead of crowding HyperShift's controllers off the API server.
/// Read once, when the controller starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ManagementApiConfig {
    /// Requests per second, sustained.
    pub requests_per_second: u32,
    /// Requests that may go at once after a quiet spell.
    pub burst: u32,
}

impl Default for ManagementApiConfig {
    fn default() -> Self {
        Self {
            requests_per_second: 200,
            burst: 400,
        }
    }
}

/// How a new revision (what the agent rolls out to each HCP: the admission image and
/// settings, the webhook and policy definitions) reaches the fleet: the canaries first, then
/// the rest in batches of at most `maxUnavailable`, each HCP proven (available, carrying the
/// revision, probe Compliant for `soakSeconds`) before the next batch starts. An HCP that
/// fails within `deadlineSeconds` halts the rollout and goes back to the last good revision
/// (docs/operations.md, "Progressive rollout").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// `false`: every HCP gets a new revision at once (the behaviour before waves).
    pub enabled: bool,
    /// The canaries: HCPs whose labels, or whose namespace's labels, match. Empty: no
    /// canary wave (the first batch is the first canary).
    pub canary_selector: LabelSelector,
    /// How many HCPs may be on their way to the new revision at once: a count (`2`) or a
    /// percentage of the HCPs in the rollout (`"10%"`, rounded down, at least 1).
    pub max_unavailable: MaxUnavailable,
    /// How long an HCP must stay Compliant on the new revision before it counts as done.
    pub soak_seconds: u32,
    /// How long an HCP may take to be done before it counts as failed.
    pub deadline_seconds: u32,
    /// How many HCPs may fail on a new revision before the rollout halts: a count (`1`, the
    /// first failure halts) or a percentage of the HCPs in the rollout (`"5%"`, at least 1).
    /// Each HCP that fails goes back to the stable revision at once, whatever the threshold.
    pub(crate) failure_threshold: MaxUnavailable,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            canary_selector: LabelSelector::default(),
            max_unavailable: MaxUnavailable::Count(1),
            soak_seconds: 120,
            deadline_seconds: 900,
            failure_threshold: MaxUnavailable::Count(1),
        }
    }
}

/// A number of HCPs, as a count or a percentage of the HCPs in the rollout, as a Deployment's
/// `maxUnavailable` (`rollout.maxUnavailable`, `rollout.failureThreshold`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum MaxUnavailable {
    Count(u32),
    Percent(String),
}

/// Why a rollout width is no width; the message follows the field's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WidthError {
    #[error("must be at least 1")]
    Zero,
    #[error("{0:?} must be a count or a percentage from 1% to 100%")]
    NotAPercentage(String),
}

impl MaxUnavailable {
    /// How many of `total` HCPs it means (at least 1). `Err`: not a count or a percentage from
    /// 1% to 100%.
    pub(crate) fn of(&self, total: usize) -> Result<usize, WidthError> {
        match self {
            MaxUnavailable::Count(0) => Err(WidthError::Zero),
            MaxUnavailable::Count(n) => Ok(*n as usize),
            MaxUnavailable::Percent(p) => {
                let n: u32 = p
                    .strip_suffix('%')
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| WidthError::NotAPercentage(p.clone()))?;
                Ok((total * n as usize / 100).max(1))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AdmissionConfig {
    pub image: String,
    pub(crate) replicas: i32,
    /// The Service name in each HCP namespace. Must not start with the name of a HyperShift
    /// control-plane Service: HyperShift matches guest webhook URLs by substring.
    pub service_name: String,
    pub port: i32,
    pub(crate) resources: Resources,
    /// Users every guard leaves alone, on top of each guard's identity classes: exact names, or
    /// prefixes ending in '*'. Empty by default: before the classes this was the one list, and
    /// a configuration that still sets it keeps that meaning (docs/configuration.md, "Migrating
    /// to identity classes").
    pub exempt_users: Vec<String>,
    /// Groups every guard leaves alone, on top of each guard's identity classes.
    pub(crate) exempt_groups: Vec<String>,
    /// Namespaces whose requests the workload guards (the Service mutation) never judge
    /// (exact, or prefixes ending in '*'). No guard that protects objects in a namespace reads
    /// it.
    pub(crate) exempt_namespaces: Vec<String>,
    /// Who is in each identity class a guard may exempt (`webhooks[].exemptClasses`).
    pub identity_classes: IdentityClasses,
    /// Namespaces under a reserved prefix that customers create for Red Hat's layered
    /// products: a customer may create them, and their service accounts are in no class by a
    /// prefix (exact, or prefixes ending in '*').
    pub customer_namespaces: Vec<String>,
    /// ClusterRoles and ClusterRoleBindings that regular users may not delete.
    pub(crate) protected_cluster_roles: Vec<String>,
    /// The annotation the Service mutation adds.
    pub(crate) service_annotation: Annotation,
    /// How monitoring finds each admission service's `/metrics` (docs/metrics.md).
    pub service_monitor: ServiceMonitorConfig,
}

/// The ServiceMonitor the agent writes beside each admission Service, in the HCP namespace
/// itself: OpenShift's user-workload Prometheus ignores a monitor's namespace selector (it
/// scrapes only the monitor's own namespace), and its platform Prometheus reads monitors only
/// from namespaces labelled `openshift.io/cluster-monitoring=true`, which HyperShift puts on
/// HCP namespaces when it runs with platform monitoring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceMonitorConfig {
    /// Whose ServiceMonitor: `monitoring.coreos.com` (the Prometheus Operator, which runs
    /// OpenShift's platform and user-workload monitoring), `monitoring.rhobs` (the
    /// Observability Operator, as on managed management clusters with RHOBS monitoring), or
    /// `none`. Written only where the management cluster serves that API.
    pub api_group: MonitoringApi,
    /// Scrape interval (a Prometheus duration, e.g. `30s`).
    pub(crate) interval: String,
    /// Extra labels on each ServiceMonitor, e.g. the ones a Prometheus selects monitors by.
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    /// Let OpenShift's platform Prometheus (`openshift-monitoring/prometheus-k8s`) discover
    /// the admission pods of each HCP namespace: a RoleBinding to the chart's
    /// `hcp-fleet-admission-metrics-reader` ClusterRole (read of services, endpoints,
    /// endpointslices and pods). Only with `monitoring.coreos.com`.
    pub(crate) platform_prometheus_access: bool,
}

impl Default for ServiceMonitorConfig {
    fn default() -> Self {
        Self {
            api_group: MonitoringApi::Coreos,
            interval: "30s".into(),
            labels: Default::default(),
            platform_prometheus_access: true,
        }
    }
}

/// The API group of the Prometheus Operator whose ServiceMonitors the agent writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum MonitoringApi {
    #[serde(rename = "monitoring.coreos.com")]
    Coreos,
    #[serde(rename = "monitoring.rhobs")]
    Rhobs,
    #[serde(rename = "none")]
    None,
}

impl MonitoringApi {
    /// Both groups a ServiceMonitor may live in (uninstall and pruning look in each).
    pub const GROUPS: [MonitoringApi; 2] = [MonitoringApi::Coreos, MonitoringApi::Rhobs];

    pub fn group(self) -> Option<&'static str> {
        match self {
            MonitoringApi::Coreos => Some("monitoring.coreos.com"),
            MonitoringApi::Rhobs => Some("monitoring.rhobs"),
            MonitoringApi::None => None,
        }
    }
}

/// A Prometheus duration: one or more `<number><unit>` in the order y, w, d, h, m, s, ms
/// (what the Prometheus Operator's CRD accepts), or `0`.
pub(crate) fn is_prometheus_duration(s: &str) -> bool {
    const UNITS: [&str; 7] = ["y", "w", "d", "h", "m", "s", "ms"];
    if s == "0" {
        return true;
    }
    let mut rest = s;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        // "ms" before "m": the longest unit that matches.
        let Some(i) = (next_unit..UNITS.len())
            .filter(|&i| rest.starts_with(UNITS[i]))
            .max_by_key(|&i| UNITS[i].len())
        else {
            return false;
        };
        rest = &rest[UNITS[i].len()..];
        next_unit = i + 1;
    }
    !s.is_empty()
}

/// A label key (optional DNS-subdomain prefix and `/`, then a name) and value, as the API
/// server checks them.
pub(crate) fn label_problem(key: &str, value: &str) -> Option<String> {
    fn name_ok(n: &str) -> bool {
        n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && n.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if !name_ok(name) || prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Some(format!("label key {key:?} is not a valid label key"));
    }
    if !value.is_empty() && !name_ok(value) {
        return Some(format!(
            "label {key:?}: value {value:?} is not a valid label value"
        ));
    }
    None
}

/// The members of one identity class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Members {
    /// Exact user names, or prefixes ending in '*'.
    pub users: Vec<String>,
    /// Exact group names.
    pub groups: Vec<String>,
}

/// Who is in each identity class. Each source below is the code that gives the identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IdentityClasses {
    /// The hosted cluster's controllers: the kube-controller-manager's own identity and, with
    /// `--use-service-account-credentials` (as HyperShift runs it), each controller's service
    /// account in `kube-system`; the scheduler. The client certificates' names are HyperShift's
    /// (control-plane-operator/controllers/hostedcontrolplane/pki/kas.go).
    pub machinery: Members,
    /// HyperShift's components writing into the hosted cluster: `system:admin` in
    /// `system:masters` (the service-network admin kubeconfig, which the agent uses too),
    /// the hosted-cluster-config-operator and the kube-apiserver's bootstrap container
    /// (pki/kas.go, support/config/types.go; HyperShift's own admission policies exempt the
    /// same two, hostedclusterconfigoperator/.../kas/admissionpolicies.go).
    pub control_plane: Members,
    /// The platform's operators: service accounts of `openshift-*` namespaces but the customer
    /// namespaces.
    pub platform_operators: Members,
    /// SRE.
    pub sre: Members,
    /// The customer's administrators, in the groups OpenShift Dedicated and ROSA give them.
    pub customer_admins: Members,
}

impl Default for IdentityClasses {
    fn default() -> Self {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Self {
            machinery: Members {
                users: v(&[
                    "system:kube-controller-manager",
                    "system:kube-scheduler",
                    "system:serviceaccount:kube-system:*",
                ]),
                groups: Vec::new(),
            },
            control_plane: Members {
                users: v(&[
                    "system:admin",
                    "system:hosted-cluster-config",
                    "system:kas-bootstrap-container",
                    "system:serviceaccount:hypershift:*",
                ]),
                groups: v(&["system:masters"]),
            },
            platform_operators: Members {
                users: v(&["system:serviceaccount:openshift-*"]),
                groups: Vec::new(),
            },
            sre: Members {
                users: Vec::new(),
                // Backplane's SRE sessions carry the group of their service accounts'
                // namespace (MCVW lets it through on every webhook). A tenant cannot wear it:
                // the API server gives `system:serviceaccounts:` groups to service accounts'
                // tokens, and the identity-groups guard keeps a Group object of that name from
                // being made.
                groups: v(&[
                    "osd-sre-admins",
                    "osd-sre-cluster-admins",
                    "system:serviceaccounts:openshift-backplane-srep",
                ]),
            },
            customer_admins: Members {
                users: Vec::new(),
                groups: v(&["dedicated-admins", "cluster-admins"]),
            },
        }
    }
}

impl IdentityClasses {
    pub fn members(&self, class: IdentityClass) -> &Members {
        match class {
            IdentityClass::Machinery => &self.machinery,
            IdentityClass::ControlPlane => &self.control_plane,
            IdentityClass::PlatformOperators => &self.platform_operators,
            IdentityClass::Sre => &self.sre,
            IdentityClass::CustomerAdmins => &self.customer_admins,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Annotation {
    pub(crate) key: String,
    pub(crate) value: String,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Self {
            image: DEFAULT_IMAGE.into(),
            replicas: 2,
            service_name: "hcp-fleet-admission".into(),
            port: 8443,
            resources: Resources::default(),
            // Who each guard leaves alone is in the identity classes now; these two add to
            // every guard.
            exempt_users: Vec::new(),
            exempt_groups: Vec::new(),
            exempt_namespaces: v(&["kube-*", "openshift-*", "default"]),
            identity_classes: IdentityClasses::default(),
            // The namespaces OpenShift's documentation has the customer create for the Logging
            // operator (`openshift-logging`) and for the Loki and Elasticsearch operators
            // (`openshift-operators-redhat`), and the one `oc adm must-gather` creates for its
            // pod (`generateName: openshift-must-gather-`, oc's pkg/cli/admin/mustgather).
            customer_namespaces: v(&[
                "openshift-logging",
                "openshift-must-gather-*",
                "openshift-operators-redhat",
            ]),
            protected_cluster_roles: v(&[
                "cluster-admin",
                "admin",
                "edit",
                "view",
                "system:*",
                "dedicated-admins*",
                // SRE's backplane roles and bindings (MCVW's clusterroles-validation). ACM's
                // policies put them there and prune them as `system:admin`: hosted-mode addons
                // write with `klusterlet-X/external-managed-kubeconfig`, which hypershift-addon
                // makes from the HostedCluster's admin kubeconfig.
                "backplane-*",
            ]),
            service_annotation: Annotation {
                key: "hcp-fleet.openshift.io/managed".into(),
                value: "true".into(),
            },
            service_monitor: ServiceMonitorConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub(crate) struct Resources {
    pub(crate) cpu_request: String,
    pub(crate) memory_request: String,
    pub(crate) memory_limit: String,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            cpu_request: "10m".into(),
            memory_request: "32Mi".into(),
            memory_limit: "128Mi".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HostedAccessConfig {
    /// The secret in each HCP namespace holding the hosted cluster's kubeconfig.
    pub kubeconfig_secret: String,
    pub kubeconfig_key: String,
    /// Server rewrites, tried in order on the kubeconfig's server (first match wins): `from` a
    /// host replaces the host and keeps scheme, port and path; `from` a whole URL must match
    /// exactly and is replaced by `to`. `{namespace}` in `to` is the HCP namespace.
    pub server_rewrites: Vec<ServerRewrite>,
    /// The API servers a kubeconfig may name, after rewriting: `{namespace}` is the HCP
    /// namespace, `*` any run of characters without `/`. By default only that HCP's own
    /// kube-apiserver Service, so a secret naming the management cluster (or another HCP)
    /// is refused before anything is read or written there.
    pub allowed_servers: Vec<String>,
    /// Timeout of every call to a hosted kube-apiserver.
    pub(crate) request_timeout_seconds: u32,
}

impl HostedAccessConfig {
    /// How long one request to a hosted kube-apiserver may take.
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.request_timeout_seconds))
    }
}

impl Default for HostedAccessConfig {
    fn default() -> Self {
        Self {
            kubeconfig_secret: "service-network-admin-kubeconfig".into(),
            kubeconfig_key: "kubeconfig".into(),
            // The in-namespace name resolves only inside the HCP namespace; the agent runs
            // elsewhere.
            // By host: HyperShift's port differs by platform (6443, 2040 on IBM Cloud).
            server_rewrites: vec![ServerRewrite {
                from: "kube-apiserver".into(),
                to: "kube-apiserver.{namespace}.svc".into(),
            }],
            allowed_servers: vec!["https://kube-apiserver.{namespace}.svc:*".into()],
            request_timeout_seconds: 10,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerRewrite {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CertificateConfig {
    pub(crate) ca_lifetime_days: u32,
    pub(crate) serving_lifetime_days: u32,
    /// Renew the serving certificate when less than this fraction (percent) of its life is
    /// left; the CA likewise.
    pub renew_at_remaining_percent: u32,
}

impl Default for CertificateConfig {
    fn default() -> Self {
        Self {
            ca_lifetime_days: 365,
            serving_lifetime_days: 30,
            renew_at_remaining_percent: 33,
        }
    }
}

/// The built-in webhooks, from the catalogue's table.
pub fn default_webhooks() -> Vec<WebhookDefinition> {
    hcp_fleet_guards::definitions()
}

/// The file's `webhooks:` list laid over the built-ins (see `AgentConfig::webhooks`).
fn over_builtins<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<WebhookDefinition>, D::Error> {
    let listed = Vec::<WebhookDefinition>::deserialize(d)?;
    Ok(merge_guards(default_webhooks(), listed))
}

/// `listed` over `base`: an entry replaces the one of its name in place, the others are
/// appended in their order. Laying a merged list over the built-ins again gives it back, so a
/// configuration written out and read again is the same configuration.
pub(crate) fn merge_guards(
    mut base: Vec<WebhookDefinition>,
    listed: Vec<WebhookDefinition>,
) -> Vec<WebhookDefinition> {
    let builtins = base.len();
    let mut replaced = vec![false; builtins];
    for w in listed {
        // A name the list holds twice is kept twice, for the guardrails to refuse by name.
        match (0..builtins).find(|&i| base[i].name == w.name && !replaced[i]) {
            Some(i) => {
                replaced[i] = true;
                base[i] = w;
            }
            None => base.push(w),
        }
    }
    base
}

/// Which guards a configuration runs, as `render` and the log say it: each name with where it
/// comes from.
pub fn guard_summary(cfg: &AgentConfig) -> Vec<(String, &'static str)> {
    let builtins = default_webhooks();
    cfg.webhooks
        .iter()
        .map(|w| {
            let from = match builtins.iter().find(|b| b.name == w.name) {
                _ if cfg.disabled_guards.contains(&w.name) => "disabled (disabledGuards)",
                Some(b) if b == w && w.mode != Mode::Off => "built-in",
                Some(_) if w.mode == Mode::Off => "built-in, off",
                Some(_) => "built-in, changed",
                None if w.mode == Mode::Off => "added, off",
                None => "added",
            };
            (w.name.clone(), from)
        })
        .collect()
}

/// An integer the agent bounds: where it is in the file, where its schema is (the `$defs`
/// entry of its section, `None` at the top), its bounds and how to read it. The agent's
/// guardrails and the chart's values schema are both made from `BOUNDS`, so helm refuses what
/// the agent would.
pub(crate) struct Bound {
    pub(crate) path: &'static str,
    // Read by `add_guardrails`, for the chart's values schema.
    pub(crate) schema_def: Option<&'static str>,
    pub(crate) field: &'static str,
    pub(crate) min: i64,
    pub(crate) max: Option<i64>,
    get: fn(&AgentConfig) -> i64,
}

impl Bound {
    fn problem(&self, v: i64) -> String {
        match self.max {
            Some(max) => format!("{} must be {} to {max}, got {v}", self.path, self.min),
            None => format!("{} must be at least {}, got {v}", self.path, self.min),
        }
    }
}

/// A hosted webhook's `timeoutSeconds` (the API server allows up to 30; a slow guard stalls
/// every write it sees).
pub(crate) const WEBHOOK_TIMEOUT: std::ops::RangeInclusive<i64> = 1..=5;

pub(crate) const BOUNDS: &[Bound] = &[
    Bound {
        path: "concurrency",
        schema_def: None,
        field: "concurrency",
        min: 1,
        max: None,
        get: |c| i64::from(c.concurrency),
    },
    Bound {
        // Each probe is one dry-run request through each hosted kube-apiserver.
        path: "probeIntervalSeconds",
        schema_def: None,
        field: "probeIntervalSeconds",
        min: 5,
        max: Some(3600),
        get: |c| i64::from(c.probe_interval_seconds),
    },
    Bound {
        path: "managementApi.requestsPerSecond",
        schema_def: Some("ManagementApiConfig"),
        field: "requestsPerSecond",
        min: 1,
        max: Some(10_000),
        get: |c| i64::from(c.management_api.requests_per_second),
    },
    Bound {
        path: "managementApi.burst",
        schema_def: Some("ManagementApiConfig"),
        field: "burst",
        min: 1,
        max: None,
        get: |c| i64::from(c.management_api.burst),
    },
    Bound {
        path: "admission.replicas",
        schema_def: Some("AdmissionConfig"),
        field: "replicas",
        min: 1,
        max: Some(10),
        get: |c| i64::from(c.admission.replicas),
    },
    Bound {
        path: "admission.port",
        schema_def: Some("AdmissionConfig"),
        field: "port",
        min: 1,
        max: Some(65535),
        get: |c| i64::from(c.admission.port),
    },
    Bound {
        path: "hostedAccess.requestTimeoutSeconds",
        schema_def: Some("HostedAccessConfig"),
        field: "requestTimeoutSeconds",
        min: 1,
        max: Some(60),
        get: |c| i64::from(c.hosted_access.request_timeout_seconds),
    },
    Bound {
        path: "certificates.servingLifetimeDays",
        schema_def: Some("CertificateConfig"),
        field: "servingLifetimeDays",
        min: 1,
        max: None,
        get: |c| i64::from(c.certificates.serving_lifetime_days),
    },
    Bound {
        path: "certificates.renewAtRemainingPercent",
        schema_def: Some("CertificateConfig"),
        field: "renewAtRemainingPercent",
        min: 1,
        max: Some(90),
        get: |c| i64::from(c.certificates.renew_at_remaining_percent),
    },
];

/// A parse error in an operator's words: the YAML reader names Rust's types (`invalid u32`),
/// which say nothing to someone writing a ConfigMap.
pub(crate) fn plain_type_words(reason: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("invalid u8", "expected a whole number from 0 to 255"),
        ("invalid u16", "expected a whole number from 0 to 65535"),
        (
            "invalid u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("invalid u64", "expected a whole number, 0 or more"),
        ("invalid i32", "expected a whole number"),
        ("invalid i64", "expected a whole number"),
        ("invalid bool", "expected true or false"),
        ("invalid f64", "expected a number"),
    ];
    let mut out = reason.to_string();
    for (from, to) in WORDS {
        // Whole words only: `invalid u32` must not eat into `invalid u320`.
        let mut at = 0;
        while let Some(i) = out[at..].find(from).map(|i| i + at) {
            let end = i + from.len();
            if out[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                at = end;
                continue;
            }
            out.replace_range(i..end, to);
            at = i + to.len();
        }
    }
    out
}

/// The chart's values schema given the agent's guardrails (`BOUNDS`, `WEBHOOK_TIMEOUT`, the
/// exemption rules), in `AgentConfig`'s schema as schemars makes it (its `$defs` still in
/// place), so `helm install` refuses what the agent would refuse at start.
pub fn add_guardrails(schema: &mut serde_json::Value) {
    use serde_json::json;
    for b in BOUNDS {
        let at = match b.schema_def {
            Some(def) => &mut schema["$defs"][def]["properties"][b.field],
            None => &mut schema["properties"][b.field],
        };
        at["minimum"] = json!(b.min);
        match b.max {
            Some(max) => at["maximum"] = json!(max),
            None => {
                if let Some(o) = at.as_object_mut() {
                    o.remove("maximum");
                }
            }
        }
    }
    let timeout = &mut schema["$defs"]["WebhookDefinition"]["properties"]["timeoutSeconds"];
    timeout["minimum"] = json!(WEBHOOK_TIMEOUT.start());
    timeout["maximum"] = json!(WEBHOOK_TIMEOUT.end());
    // Every list `admission_problems` holds to the exemption guardrails, here as there.
    for (def, field, kind) in [
        ("AdmissionConfig", "exemptUsers", Exempted::User),
        ("AdmissionConfig", "exemptGroups", Exempted::Group),
        ("AdmissionConfig", "exemptNamespaces", Exempted::Namespace),
        ("AdmissionConfig", "customerNamespaces", Exempted::Namespace),
        ("Members", "users", Exempted::User),
        ("Members", "groups", Exempted::Group),
        ("WebhookDefinition", "exemptUsers", Exempted::User),
        ("WebhookDefinition", "exemptGroups", Exempted::Group),
    ] {
        schema["$defs"][def]["properties"][field]["items"] = exemption_schema(kind);
    }
}

/// One exemption entry's schema: `exemption_problem`'s shape as a pattern (no control
/// character, no surrounding space, a `*` only at the end of a prefix long enough, none for
/// groups), and the entries that fit the shape but are refused by name (every service
/// account, the canaries) listed, found by asking `exemption_problem` itself.
pub(crate) fn exemption_schema(kind: Exempted) -> serde_json::Value {
    use hcp_fleet_guards::canary::{CANARY_GROUP, CANARY_USER};
    // RE2 (helm's JSON Schema validator is Go's): `\p{Cc}` is what `char::is_control` is.
    let inner = r"[^*\p{Cc}]";
    let edge = r"[^\s*\p{Cc}]";
    let exact = format!("{edge}(?:{inner}*{edge})?");
    let pattern = match kind {
        Exempted::Group => format!("^{exact}$"),
        _ => format!(
            r"^(?:{exact}|{edge}{inner}{{{},}}\*)$",
            MIN_EXEMPT_PREFIX - 1
        ),
    };
    let named: &[&str] = match kind {
        Exempted::User => &[CANARY_USER, "system:serviceaccount:"],
        Exempted::Group => &[CANARY_GROUP],
        Exempted::Namespace => &[],
    };
    let mut refused: Vec<String> = Vec::new();
    for base in named {
        let mut candidates = vec![base.to_string()];
        candidates.extend(
            base.char_indices()
                .map(|(i, _)| format!("{}*", &base[..i]))
                .chain([format!("{base}*")]),
        );
        for c in candidates {
            if c.chars().count() > MIN_EXEMPT_PREFIX
                && exemption_problem("", &c, kind).is_some()
                && !refused.contains(&c)
            {
                refused.push(c);
            }
        }
    }
    let mut item = serde_json::json!({"type": "string", "pattern": pattern});
    if !refused.is_empty() {
        item["not"] = serde_json::json!({ "enum": refused });
    }
    item
}

/// A label selector expression the API server would accept.
fn selector_expression_ok(e: &LabelSelectorRequirement) -> bool {
    match e.operator.as_str() {
        "In" | "NotIn" => !e.values.is_empty(),
        "Exists" | "DoesNotExist" => e.values.is_empty(),
        _ => false,
    }
}

/// HyperShift control-plane Service names (a guest webhook URL whose host starts with one of
/// these is taken for a control-plane webhook and removed).
const CONTROL_PLANE_SERVICES: &[&str] = &[
    "kube-apiserver",
    "openshift-apiserver",
    "oauth-openshift",
    "openshift-oauth-apiserver",
    "packageserver",
    "etcd",
    "konnectivity",
    "ignition-server",
];

const OPERATIONS: &[&str] = &["*", "CREATE", "UPDATE", "DELETE", "CONNECT"];

/// What the agent installs in a hosted cluster, all in admissionregistration.k8s.io.
const AGENT_HOSTED_RESOURCES: &[&str] = &[
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
];

/// Does this rule reach the objects the agent owns in a hosted cluster (webhook
/// configurations, admission policies and their bindings)?
fn rule_hits_webhook_configs(r: &Rule) -> bool {
    let group = r
        .api_groups
        .iter()
        .any(|g| g == "*" || g == "admissionregistration.k8s.io");
    let resource = r.resources.iter().any(|res| {
        let base = res.split('/').next().unwrap_or(res);
        base == "*" || AGENT_HOSTED_RESOURCES.contains(&base)
    });
    group && resource
}

/// What an exemption entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exempted {
    User,
    Group,
    Namespace,
}

/// The shortest prefix (before a trailing `*`) an exemption may have: anything shorter names
/// no one in particular.
const MIN_EXEMPT_PREFIX: usize = 4;

/// Why one exemption entry (`field`'s `entry`) would exempt more than it can mean, if it
/// would: a control character (it renders into CEL and logs), an empty entry, a bare `*` or a
/// prefix too short to mean anything, a user prefix that covers every service account or
/// every `system:` identity, a group pattern (groups are matched by exact name).
pub(crate) fn exemption_problem(field: &str, entry: &str, kind: Exempted) -> Option<String> {
    let why = if entry.chars().any(char::is_control) {
        "holds a control character".to_string()
    } else if entry.trim().is_empty() || entry.trim() != entry {
        "is empty or has surrounding spaces".to_string()
    } else if kind == Exempted::Group && entry.contains('*') {
        "is a pattern; groups are exempt by exact name only".to_string()
    } else if let Some(prefix) = entry.strip_suffix('*') {
        if prefix.contains('*') {
            "has a '*' before its end; only a trailing '*' makes a prefix".to_string()
        } else if prefix.chars().count() < MIN_EXEMPT_PREFIX {
            format!(
                "is a prefix of fewer than {MIN_EXEMPT_PREFIX} characters, which exempts nearly everyone"
            )
        } else if kind == Exempted::User && "system:serviceaccount:".starts_with(prefix) {
            "exempts every service account (or every system: identity) of the cluster".to_string()
        } else {
            return canary_problem(field, entry, kind);
        }
    } else if entry.contains('*') {
        "has a '*' before its end; only a trailing '*' makes a prefix".to_string()
    } else {
        return canary_problem(field, entry, kind);
    };
    Some(format!("{field}: {entry:?} {why}"))
}

/// An entry that exempts the agent's canaries (their user or group) would make every canary
/// pass through, so no guard could be proven.
fn canary_problem(field: &str, entry: &str, kind: Exempted) -> Option<String> {
    use hcp_fleet_guards::canary::{CANARY_GROUP, CANARY_USER};
    let hit = match kind {
        Exempted::User => hcp_fleet_guards::matches(&[entry.to_string()], CANARY_USER),
        Exempted::Group => entry == CANARY_GROUP,
        Exempted::Namespace => false,
    };
    hit.then(|| {
        format!("{field}: {entry:?} exempts the agent's canaries ({CANARY_USER}, group {CANARY_GROUP}), so no canary could prove a guard")
    })
}

fn is_dns_subdomain(s: &str) -> bool {
    hcp_fleet_model::names::validate_dns_name(s).is_ok()
}

/// The guards' settings are made from the configuration here, above the guards, so the guards
/// never read the configuration's types.
impl From<&AgentConfig> for Settings {
    fn from(cfg: &AgentConfig) -> Self {
        let a = &cfg.admission;
        let webhooks: Vec<HookSetting> = cfg
            .webhooks
            .iter()
            .map(|w| {
                let (exempt_users, exempt_groups) = exemptions_of(a, w);
                HookSetting {
                    name: w.name.clone(),
                    path: w.path.clone(),
                    mode: w.mode,
                    exempt_users,
                    exempt_groups,
                }
            })
            .collect();
        let union = |pick: fn(&HookSetting) -> &Vec<String>| {
            let mut all: Vec<String> = webhooks.iter().flat_map(|h| pick(h).clone()).collect();
            all.sort();
            all.dedup();
            all
        };
        Self {
            exempt_users: union(|h| &h.exempt_users),
            exempt_groups: union(|h| &h.exempt_groups),
            webhooks,
            protected_cluster_roles: a.protected_cluster_roles.clone(),
            exempt_namespaces: a.exempt_namespaces.clone(),
            customer_namespaces: a.customer_namespaces.clone(),
            classes: IdentityClass::ALL
                .iter()
                .map(|c| {
                    let m = a.identity_classes.members(*c);
                    hcp_fleet_guards::settings::ClassSetting {
                        class: *c,
                        users: m.users.clone(),
                        groups: m.groups.clone(),
                    }
                })
                .collect(),
            service_annotation_key: a.service_annotation.key.clone(),
            service_annotation_value: a.service_annotation.value.clone(),
            // The hosted cluster's, not the configuration's: the service reads it from the
            // agent's ConfigMap.
            internal_registry: None,
        }
    }
}

/// The classes `w` exempts: its own list, else its guard's (a definition no guard serves:
/// the default classes).
pub fn classes_of(w: &WebhookDefinition) -> Vec<IdentityClass> {
    w.exempt_classes.clone().unwrap_or_else(|| {
        hcp_fleet_guards::for_path(&w.path)
            .map_or(hcp_fleet_guards::identities::DEFAULT_CLASSES, |g| {
                g.exempt_classes()
            })
            .to_vec()
    })
}

/// Whom `w` leaves alone: its classes' members, its own additions, and the every-guard lists,
/// each list sorted and without repeats.
fn exemptions_of(a: &AdmissionConfig, w: &WebhookDefinition) -> (Vec<String>, Vec<String>) {
    let mut users = a.exempt_users.clone();
    let mut groups = a.exempt_groups.clone();
    for class in classes_of(w) {
        let m = a.identity_classes.members(class);
        users.extend(m.users.iter().cloned());
        groups.extend(m.groups.iter().cloned());
    }
    users.extend(w.exempt_users.iter().cloned());
    groups.extend(w.exempt_groups.iter().cloned());
    users.sort();
    users.dedup();
    groups.sort();
    groups.dedup();
    (users, groups)
}

impl AgentConfig {
    /// Every guardrail violation, as sentences an operator can act on.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        self.rollout_and_limit_problems(&mut p);
        self.admission_problems(&mut p);
        self.hosted_access_problems(&mut p);
        self.monitoring_and_certificate_problems(&mut p);
        self.disabled_guard_problems(&mut p);
        self.webhook_problems(&mut p);
        p
    }

    /// Concurrency, the rollout, the management API's ceiling, the probe interval.
    fn rollout_and_limit_problems(&self, p: &mut Vec<String>) {
        // Every integer with bounds, from the table the chart's values schema is made from.
        for b in BOUNDS {
            let v = (b.get)(self);
            if v < b.min || b.max.is_some_and(|max| v > max) {
                p.push(b.problem(v));
            }
        }
        let r = &self.rollout;
        if let Err(e) = r.failure_threshold.of(1) {
            p.push(format!("rollout.failureThreshold {e}"));
        }
        if let Err(e) = r.max_unavailable.of(1) {
            p.push(format!("rollout.maxUnavailable {e}"));
        }
        if r.deadline_seconds <= r.soak_seconds {
            p.push(format!(
                "rollout.deadlineSeconds ({}) must exceed soakSeconds ({}): an HCP needs the soak time and more to be done",
                r.deadline_seconds, r.soak_seconds
            ));
        }
        for e in &r.canary_selector.match_expressions {
            if !selector_expression_ok(e) {
                p.push(format!(
                    "rollout.canarySelector: operator {:?} on {:?} with {} value(s) is invalid",
                    e.operator,
                    e.key,
                    e.values.len()
                ));
            }
        }
    }

    /// The admission service: image, replicas, port, Service name, exemptions.
    fn admission_problems(&self, p: &mut Vec<String>) {
        let a = &self.admission;
        if a.image.trim().is_empty() {
            p.push("admission.image must be set".into());
        }
        if !is_dns_subdomain(&a.service_name) || a.service_name.contains('.') {
            p.push(format!(
                "admission.serviceName {:?} must be a DNS-1123 label",
                a.service_name
            ));
        }
        for cp in CONTROL_PLANE_SERVICES {
            if a.service_name.starts_with(cp) {
                p.push(format!(
                    "admission.serviceName {:?} starts with the control-plane Service name {cp:?}; HyperShift would treat its webhooks as its own",
                    a.service_name
                ));
            }
        }
        // Every list that exempts someone is held to the same guardrails, whichever field it
        // is in: the every-guard lists, a class's members, a guard's own additions.
        let mut lists: Vec<(String, &Vec<String>, Exempted)> = vec![
            (
                "admission.exemptUsers".into(),
                &a.exempt_users,
                Exempted::User,
            ),
            (
                "admission.exemptGroups".into(),
                &a.exempt_groups,
                Exempted::Group,
            ),
            (
                "admission.exemptNamespaces".into(),
                &a.exempt_namespaces,
                Exempted::Namespace,
            ),
            (
                "admission.customerNamespaces".into(),
                &a.customer_namespaces,
                Exempted::Namespace,
            ),
        ];
        for class in IdentityClass::ALL {
            let m = a.identity_classes.members(class);
            let at = format!("admission.identityClasses.{}", class.name());
            lists.push((format!("{at}.users"), &m.users, Exempted::User));
            lists.push((format!("{at}.groups"), &m.groups, Exempted::Group));
        }
        for w in &self.webhooks {
            let at = format!("webhooks[{}]", w.name);
            lists.push((format!("{at}.exemptUsers"), &w.exempt_users, Exempted::User));
            lists.push((
                format!("{at}.exemptGroups"),
                &w.exempt_groups,
                Exempted::Group,
            ));
        }
        for (field, entries, kind) in lists {
            p.extend(
                entries
                    .iter()
                    .filter_map(|e| exemption_problem(&field, e, kind)),
            );
        }
    }

    /// Hosted access: the kubeconfig Secret, timeouts, server rewrites and allowed servers.
    fn hosted_access_problems(&self, p: &mut Vec<String>) {
        // The admission configuration names directories under it: the hosted kube-apiserver
        // refuses a relative one, and a path a YAML scalar or the ConfigMap's volume cannot
        // carry as written would be a start-up failure there, not here.
        let m = &self.static_guards.mount_path;
        if !m.starts_with('/')
            || m.len() < 2
            || m.ends_with('/')
            || m.split('/').any(|c| c == "." || c == "..")
            || m.contains("//")
            || !m
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
        {
            p.push(format!(
                "staticGuards.mountPath {m:?} must be an absolute path of letters, digits, '-', '_' and '.', without '.' or '..' parts or a trailing '/'"
            ));
        }
        let h = &self.hosted_access;
        if h.kubeconfig_secret.is_empty() || h.kubeconfig_key.is_empty() {
            p.push("hostedAccess.kubeconfigSecret and kubeconfigKey must be set".into());
        }
        for rw in &h.server_rewrites {
            if rw.from.contains("://") {
                if !rw.to.starts_with("https://") {
                    p.push(format!(
                        "hostedAccess.serverRewrites: {:?} must be an https:// URL (its from is a URL)",
                        rw.to
                    ));
                }
            } else if rw.from.is_empty()
                || !is_dns_subdomain(&rw.from)
                || !is_dns_subdomain(&rw.to.replace("{namespace}", "ns"))
            {
                p.push(format!(
                    "hostedAccess.serverRewrites: from {:?} to {:?} must both be host names (or from a whole URL)",
                    rw.from, rw.to
                ));
            }
        }
        if h.allowed_servers.is_empty() {
            p.push("hostedAccess.allowedServers must name at least one server".into());
        }
        for a in &h.allowed_servers {
            if !a.starts_with("https://") {
                p.push(format!(
                    "hostedAccess.allowedServers: {a:?} must be an https:// URL pattern"
                ));
            }
        }
    }

    /// The admission services' ServiceMonitor and the certificates' lifetimes.
    fn monitoring_and_certificate_problems(&self, p: &mut Vec<String>) {
        let sm = &self.admission.service_monitor;
        if !is_prometheus_duration(&sm.interval) || sm.interval == "0" {
            p.push(format!(
                "admission.serviceMonitor.interval {:?} is not a Prometheus duration such as 30s",
                sm.interval
            ));
        }
        for (k, v) in &sm.labels {
            if let Some(why) = label_problem(k, v) {
                p.push(format!("admission.serviceMonitor.labels: {why}"));
            }
            // The agent finds (and prunes) its objects by these.
            if [
                hcp_fleet_model::names::MANAGED_BY,
                hcp_fleet_model::names::COMPONENT_LABEL,
            ]
            .contains(&k.as_str())
            {
                p.push(format!(
                    "admission.serviceMonitor.labels: {k:?} is the agent's own label"
                ));
            }
        }
        let c = &self.certificates;
        if c.serving_lifetime_days > 0 && c.ca_lifetime_days <= c.serving_lifetime_days {
            p.push("certificates: caLifetimeDays must exceed servingLifetimeDays > 0".into());
        }
    }

    /// Names fully qualified and unique; each path one guard's.
    fn webhook_name_and_path_problems(&self, p: &mut Vec<String>) {
        let mut names = BTreeSet::new();
        let mut paths = std::collections::BTreeMap::new();
        for w in &self.webhooks {
            let at = format!("webhook {:?}", w.name);
            if !is_dns_subdomain(&w.name) || w.name.split('.').count() < 3 {
                p.push(format!(
                    "{at}: name must be a fully qualified DNS name with at least three labels"
                ));
            }
            if !names.insert(&w.name) {
                p.push(format!("{at}: duplicate name"));
            }
            if let Some(first) = paths.get(w.path.as_str()) {
                // Each path is one handler; the usual cause is a renamed copy of a built-in
                // laid beside the built-in itself.
                p.push(format!(
                    "{at}: path {:?} is already guard {first:?}'s; to change that guard, give its entry the name {first:?} (an entry replaces the guard of its name), or turn it off with disabledGuards",
                    w.path
                ));
            } else {
                paths.insert(w.path.as_str(), w.name.as_str());
            }
        }
    }

    /// The webhook definitions: names and paths unique, rules, selectors, engines.
    fn webhook_problems(&self, p: &mut Vec<String>) {
        self.webhook_name_and_path_problems(p);
        for w in &self.webhooks {
            let at = format!("webhook {:?}", w.name);
            if !w.path.starts_with('/')
                || w.path.contains("..")
                || w.path
                    .chars()
                    .any(|ch| ch.is_whitespace() || ch == '?' || ch == '#')
            {
                p.push(format!(
                    "{at}: path {:?} must start with '/' and hold no '..', whitespace, '?' or '#'",
                    w.path
                ));
            }
            engine_problems(w, &at, p);
            if hcp_fleet_guards::for_path(&w.path).is_none() {
                p.push(format!(
                    "{at}: path {:?} has no handler in the admission service (one of {})",
                    w.path,
                    hcp_fleet_guards::paths().collect::<Vec<_>>().join(", ")
                ));
            }
            if !WEBHOOK_TIMEOUT.contains(&i64::from(w.timeout_seconds)) {
                p.push(format!(
                    "{at}: timeoutSeconds must be 1 to 5 (a slow webhook stalls every write), got {}",
                    w.timeout_seconds
                ));
            }
            if w.rules.is_empty() {
                p.push(format!("{at}: needs at least one rule"));
            }
            for (i, r) in w.rules.iter().enumerate() {
                if r.operations.is_empty()
                    || r.api_groups.is_empty()
                    || r.api_versions.is_empty()
                    || r.resources.is_empty()
                {
                    p.push(format!(
                        "{at}: rule {i}: operations, apiGroups, apiVersions and resources must all be non-empty"
                    ));
                }
                // The API server's own rule (admissionregistration validation): `*/*` stands
                // alone, and beside `*` only subresources may be named.
                let whole = |x: &str| r.resources.iter().any(|res| res == x);
                if (whole("*/*") && r.resources.len() > 1)
                    || (whole("*")
                        && r.resources
                            .iter()
                            .any(|res| res != "*" && !res.contains('/')))
                {
                    p.push(format!(
                        "{at}: rule {i}: `*/*` must be the only resource, and beside `*` only subresources may be named"
                    ));
                }
                for op in &r.operations {
                    if !OPERATIONS.contains(&op.as_str()) {
                        p.push(format!("{at}: rule {i}: unknown operation {op:?}"));
                    }
                }
                if rule_hits_webhook_configs(r) {
                    p.push(format!(
                        "{at}: rule {i} matches webhook configurations or admission policies (a guard must never be able to block its own repair)"
                    ));
                }
                if let Some(scope) = &r.scope
                    && !["*", "Cluster", "Namespaced"].contains(&scope.as_str())
                {
                    p.push(format!(
                        "{at}: rule {i}: scope must be *, Cluster or Namespaced"
                    ));
                }
            }
            for sel in [&w.namespace_selector, &w.object_selector]
                .into_iter()
                .flatten()
            {
                for e in &sel.match_expressions {
                    if !selector_expression_ok(e) {
                        p.push(format!(
                            "{at}: selector expression on {:?}: operator {:?} with {} value(s) is invalid",
                            e.key,
                            e.operator,
                            e.values.len()
                        ));
                    }
                }
            }
        }
    }

    /// Parses and validates; every problem is reported at once.
    pub fn from_yaml(path: &str, text: &str) -> Result<Self, ConfigError> {
        let mut cfg: AgentConfig =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
                path: path.to_string(),
                reason: plain_type_words(&e.to_string()),
            })?;
        cfg.turn_off_disabled();
        cfg.validated(path)
    }

    /// Turns off the guards `disabledGuards` names (mode `off`: kept in the list, so the
    /// configuration written out and read again is the same). A name that is no guard, or
    /// the probe's, is left for `problems` to refuse.
    fn turn_off_disabled(&mut self) {
        let probe = hcp_fleet_guards::probe::ROW.name;
        for w in &mut self.webhooks {
            if w.name != probe && self.disabled_guards.contains(&w.name) {
                w.mode = Mode::Off;
            }
        }
    }

    /// `disabledGuards`: each name a guard's, once, and never the probe's (a typo would leave
    /// on the guard meant to go).
    fn disabled_guard_problems(&self, p: &mut Vec<String>) {
        for (i, name) in self.disabled_guards.iter().enumerate() {
            if self.disabled_guards[..i].contains(name) {
                p.push(format!("disabledGuards: {name:?} is named more than once"));
            } else if *name == hcp_fleet_guards::probe::ROW.name {
                p.push(format!(
                    "disabledGuards: {name:?} is the probe; it proves the admission path works and cannot be disabled"
                ));
            } else if !self.webhooks.iter().any(|w| w.name == *name) {
                p.push(format!(
                    "disabledGuards: {name:?} is no guard (the guards: {})",
                    self.webhooks
                        .iter()
                        .map(|w| w.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }

    pub fn validated(self, path: &str) -> Result<Self, ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigError::Invalid {
                path: path.to_string(),
                problems,
            })
        }
    }

    /// The webhooks that are installed (mode not `off`).
    pub fn active_webhooks(&self) -> impl Iterator<Item = &WebhookDefinition> {
        self.webhooks.iter().filter(|w| w.mode != Mode::Off)
    }
}

/// `engine: policy` or `static` for a guard with no CEL form: a mutation with one runs as a
/// MutatingAdmissionPolicy, through the API or from files alike.
fn engine_problems(w: &WebhookDefinition, at: &str, p: &mut Vec<String>) {
    let policy_form =
        |p: &str| hcp_fleet_guards::has_cel_form(p) || hcp_fleet_guards::has_mutation_form(p);
    let engine = match w.engine {
        GuardEngine::Policy => "policy",
        GuardEngine::Static => "static",
        GuardEngine::Auto | GuardEngine::Webhook => return,
    };
    if !policy_form(&w.path) {
        p.push(format!(
            "{at}: engine {engine}: the handler on {:?} has no CEL form (only {} can run as an admission policy); use auto or webhook",
            w.path,
            hcp_fleet_guards::paths()
                .filter(|p| policy_form(p))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exemptions_that_mean_everyone_or_carry_control_characters_are_refused_by_name() {
        use Exempted::*;
        for (entry, kind, why) in [
            ("*", User, "fewer than 4"),
            ("*", Namespace, "fewer than 4"),
            ("ab*", Namespace, "fewer than 4"),
            ("system:*", User, "every service account"),
            ("system:serviceaccount:*", User, "every service account"),
            ("system:service*", User, "every service account"),
            ("sys*", User, "fewer than 4"),
            ("osd-*", Group, "exact name only"),
            ("a*b", User, "before its end"),
            ("a**", Namespace, "before its end"),
            ("alice\n", User, "control character"),
            ("al\u{7}ice", User, "control character"),
            ("", Group, "empty"),
            (" alice", User, "surrounding spaces"),
            (
                "hcp-fleet.openshift.io:canary",
                User,
                "the agent's canaries",
            ),
            ("hcp-fleet.openshift.io:*", User, "the agent's canaries"),
            ("system:authenticated", Group, "the agent's canaries"),
        ] {
            let p = exemption_problem("admission.exemptUsers", entry, kind)
                .unwrap_or_else(|| panic!("{entry:?} accepted"));
            assert!(
                p.contains(why) && p.starts_with("admission.exemptUsers: "),
                "{entry:?}: {p}"
            );
            assert!(p.contains(&format!("{entry:?}")), "names the entry: {p}");
        }
        for (entry, kind) in [
            ("system:serviceaccount:hypershift:*", User),
            ("system:serviceaccount:openshift-*", User),
            ("system:admin", User),
            ("kube-*", Namespace),
            ("default", Namespace),
            ("system:masters", Group),
        ] {
            assert_eq!(exemption_problem("f", entry, kind), None, "{entry:?}");
        }
        // The defaults pass; a bad entry makes the configuration refused, naming it.
        assert!(AgentConfig::default().problems().is_empty());
        let mut cfg = AgentConfig::default();
        cfg.admission.exempt_namespaces.push("*".into());
        let problems = cfg.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("admission.exemptNamespaces: \"*\"")),
            "{problems:?}"
        );
    }

    /// docs/configuration.md is the operators' reference: its example must be a valid file,
    /// and it must name every field the types accept.
    #[test]
    fn the_configuration_reference_documents_every_field() {
        let doc = include_str!("../../../docs/configuration.md");
        let block = doc
            .split("## The file")
            .nth(1)
            .and_then(|s| s.split("```yaml\n").nth(1))
            .and_then(|s| s.split("```").next())
            .expect("a yaml block under '## The file'");
        let cfg: AgentConfig = serde_saphyr::from_str(block).expect("the example parses");
        assert_eq!(
            cfg.problems(),
            Vec::<String>::new(),
            "the example passes the guardrails"
        );
        fn names(v: &serde_json::Value, out: &mut BTreeSet<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::Object(p)) = m.get("properties") {
                        out.extend(p.keys().cloned());
                    }
                    m.values().for_each(|x| names(x, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|x| names(x, out)),
                _ => {}
            }
        }
        let schema = serde_json::to_value(schemars::schema_for!(AgentConfig)).expect("schema");
        let mut all = BTreeSet::new();
        names(&schema, &mut all);
        let missing: Vec<_> = all
            .iter()
            .filter(|k| !block.contains(&format!("{k}:")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/configuration.md does not show {missing:?}"
        );
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(AgentConfig::default().problems(), Vec::<String>::new());
    }

    #[test]
    fn wildcard_resources_are_held_to_the_api_servers_rule() {
        for (resources, refused) in [
            (vec!["*", "*/*"], true),
            (vec!["*/*", "pods"], true),
            (vec!["*", "pods"], true),
            (vec!["*/*"], false),
            (vec!["*", "*/status"], false),
            (vec!["pods", "pods/status"], false),
        ] {
            let mut cfg = AgentConfig::default();
            cfg.webhooks[0].rules[0].resources = resources.iter().map(|r| r.to_string()).collect();
            let said = cfg
                .problems()
                .iter()
                .any(|p| p.contains("`*/*` must be the only resource"));
            assert_eq!(said, refused, "{resources:?}");
        }
    }

    #[test]
    fn empty_file_means_defaults() {
        let cfg = AgentConfig::from_yaml("c.yaml", "{}").expect("valid");
        assert_eq!(cfg, AgentConfig::default());
    }

    #[test]
    fn partial_sections_take_defaults_for_the_rest() {
        let cfg =
            AgentConfig::from_yaml("c.yaml", "admission: {image: quay.io/x/y:1}\n").expect("valid");
        assert_eq!(cfg.admission.image, "quay.io/x/y:1");
        assert_eq!(cfg.admission.replicas, 2);
        assert_eq!(cfg.admission.service_name, "hcp-fleet-admission");
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let err = AgentConfig::from_yaml("c.yaml", "concurency: 3\n").expect_err("typo");
        assert!(err.to_string().contains("concurency"), "{err}");
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let yaml = r#"
concurrency: 0
admission:
  image: ""
  replicas: 2
  serviceName: kube-apiserver-hooks
  port: 8443
  resources: {cpuRequest: 10m, memoryRequest: 32Mi, memoryLimit: 64Mi}
webhooks:
- name: grabby.example.com
  kind: Validating
  path: /v
  timeoutSeconds: 30
  rules:
  - operations: ["*"]
    apiGroups: ["*"]
    apiVersions: ["*"]
    resources: ["*"]
- name: grabby.example.com
  kind: Mutating
  path: v2
  rules:
  - operations: [DESTROY]
    apiGroups: [admissionregistration.k8s.io]
    apiVersions: [v1]
    resources: [validatingwebhookconfigurations]
"#;
        let err = AgentConfig::from_yaml("c.yaml", yaml).expect_err("invalid");
        let ConfigError::Invalid { problems, .. } = &err else {
            panic!("expected Invalid, got {err}");
        };
        let all = problems.join("\n");
        for needle in [
            "concurrency must be at least 1",
            "admission.image must be set",
            "starts with the control-plane Service name \"kube-apiserver\"",
            "timeoutSeconds must be 1 to 5",
            "rule 0 matches webhook configurations",
            "duplicate name",
            "path \"v2\" must start with '/'",
            "unknown operation \"DESTROY\"",
            "path \"/v\" has no handler in the admission service",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert_eq!(problems.len(), 11, "{all}");
    }

    #[test]
    fn subresource_rules_on_webhook_configs_are_caught() {
        let r = Rule {
            operations: vec!["UPDATE".into()],
            api_groups: vec!["admissionregistration.k8s.io".into()],
            api_versions: vec!["v1".into()],
            resources: vec!["mutatingwebhookconfigurations/status".into()],
            scope: None,
        };
        assert!(rule_hits_webhook_configs(&r));
        let r2 = Rule {
            resources: vec!["pods".into()],
            api_groups: vec!["".into()],
            ..r
        };
        assert!(!rule_hits_webhook_configs(&r2));
    }

    #[test]
    fn prometheus_durations_follow_the_operators_pattern() {
        for ok in ["30s", "1m30s", "500ms", "1h", "2d12h", "0"] {
            assert!(is_prometheus_duration(ok), "{ok}");
        }
        for bad in ["", "30", "s", "30 s", "1s1m", "1ms5s", "-1s", "1.5s"] {
            assert!(!is_prometheus_duration(bad), "{bad}");
        }
    }

    #[test]
    fn service_monitor_settings_are_checked() {
        let yaml = r#"
admission:
  serviceMonitor:
    apiGroup: monitoring.rhobs
    interval: "30"
    labels: {"app.kubernetes.io/managed-by": me, "bad key": x, team: "no spaces"}
"#;
        let err = AgentConfig::from_yaml("c.yaml", yaml).expect_err("invalid");
        let all = err.to_string();
        for needle in [
            "interval \"30\" is not a Prometheus duration",
            "\"app.kubernetes.io/managed-by\" is the agent's own label",
            "label key \"bad key\" is not a valid label key",
            "value \"no spaces\" is not a valid label value",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        let err = AgentConfig::from_yaml(
            "c.yaml",
            "admission: {serviceMonitor: {apiGroup: monitoring.example.com}}\n",
        )
        .expect_err("unknown group");
        assert!(err.to_string().contains("monitoring.example.com"), "{err}");
        let cfg =
            AgentConfig::from_yaml("c.yaml", "admission: {serviceMonitor: {apiGroup: none}}\n")
                .expect("valid");
        assert_eq!(cfg.admission.service_monitor.api_group, MonitoringApi::None);
    }

    #[test]
    fn off_webhooks_are_not_active() {
        let mut cfg = AgentConfig::default();
        cfg.webhooks[0].mode = Mode::Off;
        assert_eq!(cfg.active_webhooks().count(), cfg.webhooks.len() - 1);
    }

    /// The issue's case: a list naming two built-ins (one changed, one added under another
    /// name before) leaves the other seven installed.
    #[test]
    fn a_webhooks_list_changes_the_guards_it_names_and_keeps_the_others() {
        let builtins = default_webhooks();
        let first = &builtins[1].name;
        let mut changed = builtins[1].clone();
        changed.mode = Mode::Warn;
        changed.timeout_seconds = 4;
        let yaml =
            serde_saphyr::to_string(&serde_json::json!({ "webhooks": [changed] })).expect("yaml");
        let cfg = AgentConfig::from_yaml("f", &yaml).expect("valid");
        assert_eq!(cfg.webhooks.len(), builtins.len());
        assert_eq!(cfg.webhooks[1], changed);
        for (i, (w, b)) in cfg.webhooks.iter().zip(&builtins).enumerate() {
            if i != 1 {
                assert_eq!(w, b, "{} unchanged", b.name);
            }
        }
        let summary = guard_summary(&cfg);
        assert_eq!(summary[1], (first.clone(), "built-in, changed"));
        assert_eq!(summary[0].1, "built-in");
        // A renamed copy of a built-in beside the built-in: refused, saying how to change it.
        let mut renamed = builtins[1].clone();
        renamed.name = "my-copy.example.com".into();
        let copy =
            serde_saphyr::to_string(&serde_json::json!({ "webhooks": [renamed] })).expect("yaml");
        let err = AgentConfig::from_yaml("f", &copy).expect_err("two guards on one path");
        assert!(
            err.to_string()
                .contains(&format!("is already guard {first:?}'s")),
            "{err}"
        );
    }

    #[test]
    fn disabled_guards_are_off_by_name_and_a_wrong_name_is_refused() {
        let builtins = default_webhooks();
        let gone = &builtins[2].name;
        let cfg =
            AgentConfig::from_yaml("f", &format!("disabledGuards: [{gone}]\n")).expect("valid");
        assert_eq!(cfg.webhooks.len(), builtins.len(), "kept, turned off");
        assert!(cfg.active_webhooks().all(|w| &w.name != gone));
        assert_eq!(cfg.active_webhooks().count(), builtins.len() - 1);
        assert!(guard_summary(&cfg).contains(&(gone.clone(), "disabled (disabledGuards)")));
        // Written out and read again: the same configuration.
        let text = serde_saphyr::to_string(&cfg).expect("yaml");
        assert_eq!(AgentConfig::from_yaml("again", &text).expect("valid"), cfg);

        let probe = hcp_fleet_guards::probe::ROW.name;
        let err = AgentConfig::from_yaml(
            "f",
            &format!(
                "disabledGuards: [no-such.guard.io, {probe}, {gone}, {gone}]\nconcurrency: 0\n"
            ),
        )
        .expect_err("refused");
        let text = err.to_string();
        for want in [
            "\"no-such.guard.io\" is no guard",
            "is the probe",
            "is named more than once",
            // Every problem at once: the others' too.
            "concurrency must be at least 1",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
    }

    /// Every list the agent holds to the exemption guardrails is held to them by the chart's
    /// schema as well: "*" (which means everyone) refused by both, in each of them.
    #[test]
    fn every_exemption_list_the_agent_checks_the_values_schema_checks() {
        let mut schema = serde_json::to_value(schemars::schema_for!(AgentConfig)).expect("schema");
        add_guardrails(&mut schema);
        let cases: [(&[&str], &str, &str); 8] = [
            (
                &["admission", "exemptUsers"],
                "AdmissionConfig",
                "exemptUsers",
            ),
            (
                &["admission", "exemptGroups"],
                "AdmissionConfig",
                "exemptGroups",
            ),
            (
                &["admission", "exemptNamespaces"],
                "AdmissionConfig",
                "exemptNamespaces",
            ),
            (
                &["admission", "customerNamespaces"],
                "AdmissionConfig",
                "customerNamespaces",
            ),
            (
                &["admission", "identityClasses", "sre", "users"],
                "Members",
                "users",
            ),
            (
                &["admission", "identityClasses", "machinery", "groups"],
                "Members",
                "groups",
            ),
            (
                &["webhooks", "0", "exemptUsers"],
                "WebhookDefinition",
                "exemptUsers",
            ),
            (
                &["webhooks", "0", "exemptGroups"],
                "WebhookDefinition",
                "exemptGroups",
            ),
        ];
        for (path, def, field) in cases {
            let items = &schema["$defs"][def]["properties"][field]["items"];
            let re = regex::Regex::new(items["pattern"].as_str().expect("a pattern"))
                .expect("the pattern compiles");
            assert!(!re.is_match("*"), "{def}.{field} lets '*' through");
            assert!(re.is_match("osd-sre-admins"), "{def}.{field}");
            let mut c = serde_json::to_value(AgentConfig::default()).expect("json");
            let mut at = &mut c;
            for part in path {
                at = match part.parse::<usize>() {
                    Ok(i) => &mut at[i],
                    Err(_) => &mut at[*part],
                };
            }
            *at = serde_json::json!(["*"]);
            let cfg: AgentConfig = serde_json::from_value(c).expect("typed");
            let last = path.last().copied().unwrap_or_default();
            assert!(
                cfg.problems()
                    .iter()
                    .any(|p| p.contains(last) && p.contains("\"*\"")),
                "the agent refuses '*' in {path:?}: {:?}",
                cfg.problems()
            );
        }
    }

    /// The chart's schema and the agent refuse the same numbers: at each bound's edge, the
    /// schema's `minimum`/`maximum` are the agent's, and one past them the agent refuses.
    #[test]
    fn the_values_schema_bounds_are_the_agents() {
        let mut schema = serde_json::to_value(schemars::schema_for!(AgentConfig)).expect("schema");
        add_guardrails(&mut schema);
        for b in BOUNDS {
            let at = match b.schema_def {
                Some(def) => &schema["$defs"][def]["properties"][b.field],
                None => &schema["properties"][b.field],
            };
            assert_eq!(at["minimum"], serde_json::json!(b.min), "{}", b.path);
            assert_eq!(
                at.get("maximum").and_then(|m| m.as_i64()),
                b.max,
                "{}",
                b.path
            );
            let with = |v: i64| {
                let mut c = serde_json::to_value(AgentConfig::default()).expect("json");
                let mut at = &mut c;
                for part in b.path.split('.') {
                    at = &mut at[part];
                }
                *at = serde_json::json!(v);
                let cfg: AgentConfig = serde_json::from_value(c).expect("typed");
                cfg.problems()
                    .into_iter()
                    .filter(|p| p.starts_with(&format!("{} must be", b.path)))
                    .count()
            };
            assert_eq!(with(b.min), 0, "{} at its minimum", b.path);
            assert_eq!(with(b.min - 1), 1, "{} below its minimum", b.path);
            if let Some(max) = b.max {
                assert_eq!(with(max), 0, "{} at its maximum", b.path);
                assert_eq!(with(max + 1), 1, "{} above its maximum", b.path);
            }
        }
        let t = &schema["$defs"]["WebhookDefinition"]["properties"]["timeoutSeconds"];
        assert_eq!(
            (t["minimum"].as_i64(), t["maximum"].as_i64()),
            (Some(1), Some(5))
        );
    }

    /// An exemption entry passes the chart's schema exactly when it passes the agent: the
    /// issue's `*` and `sre*` among groups, every kind of refusal, and the defaults.
    #[test]
    fn the_values_schema_refuses_the_exemptions_the_agent_refuses_and_no_others() {
        let mut corpus: Vec<String> = [
            "*",
            "sre*",
            "abc*",
            "abcd*",
            "abcde*",
            "a*b",
            "ab**",
            "system:*",
            "syst*",
            "system:serviceaccount:*",
            "system:serviceaccount:kube-system:*",
            "system:serviceaccount:openshift-*",
            " alice",
            "alice ",
            "al\u{7}ice",
            "x\u{85}y",
            "",
            " ",
            "alice",
            "a",
            "ab c",
            "hcp-fleet.openshift.io:canary",
            "hcp-fleet*",
            "hcp-*",
            "hcp-fleet.openshift.io:canary*",
            "system:authenticated",
            "system:authenticated*",
            "osd-sre-admins",
        ]
        .map(String::from)
        .to_vec();
        let d = AdmissionConfig::default();
        for list in [&d.exempt_users, &d.exempt_groups, &d.exempt_namespaces] {
            corpus.extend(list.iter().cloned());
        }
        for kind in [Exempted::User, Exempted::Group, Exempted::Namespace] {
            let schema = exemption_schema(kind);
            let re = regex::Regex::new(schema["pattern"].as_str().expect("pattern"))
                .expect("the pattern compiles");
            let refused_by_name = schema["not"]["enum"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for entry in &corpus {
                let by_schema =
                    re.is_match(entry) && !refused_by_name.contains(&serde_json::json!(entry));
                let by_agent = exemption_problem("f", entry, kind).is_none();
                assert_eq!(by_schema, by_agent, "{kind:?} {entry:?}");
            }
        }
        // The issue's values, refused by both.
        assert!(exemption_problem("f", "*", Exempted::User).is_some());
        assert!(exemption_problem("f", "sre*", Exempted::Group).is_some());
    }

    #[test]
    fn a_wrong_type_is_said_in_words_not_rust_types() {
        let err = AgentConfig::from_yaml("c.yaml", "probeIntervalSeconds: abc\n")
            .expect_err("not a number");
        let text = err.to_string();
        assert!(
            text.contains("expected a whole number from 0 to 4294967295"),
            "{text}"
        );
        assert!(!text.contains("u32"), "{text}");
        let err = AgentConfig::from_yaml("c.yaml", "admission:\n  replicas: x\n")
            .expect_err("not a number");
        assert!(err.to_string().contains("expected a whole number"), "{err}");
        assert_eq!(plain_type_words("invalid u320"), "invalid u320");
    }
}
