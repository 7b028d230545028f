//! The agent's configuration: a YAML file (the chart mounts it from a ConfigMap) with flag and
//! environment overrides. Validated at load against the guardrails (docs/configuration.md): a bad file
//! is refused with every problem listed, and a running agent keeps its last good configuration.
//!
//! Three rooms: here the types, their defaults and the parse (`AgentConfig::from_yaml`; the
//! commands read the file, `cli::config_file`); `validate`, every guardrail (`problems`, the
//! numeric `BOUNDS`, the exemption rules); `schema`, the same guardrails written into the
//! chart's values schema, so helm refuses what the agent would.

mod schema;
mod validate;

pub use schema::add_guardrails;
pub(crate) use validate::{Exempted, exemption_problem};

use serde::{Deserialize, Serialize};

use hcp_fleet_guards::HookSetting;

use hcp_fleet_guards::Settings;
use hcp_fleet_guards::identities::IdentityClass;

// The definition types are the catalogue's (`hcp_fleet_guards::catalogue`): the configuration
// file's schema uses them, every crate names them there.
use hcp_fleet_guards::catalogue::{LabelSelector, WebhookDefinition};
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// docs/configuration.md is the operators' reference: its example must be a valid file,
    /// and it must name every field the types accept.
    #[test]
    fn the_configuration_reference_documents_every_field() {
        let doc = include_str!("../../../../docs/configuration.md");
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
