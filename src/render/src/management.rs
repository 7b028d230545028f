//! Management-side objects in each HCP namespace: the admission service's ServiceAccount,
//! certificate Secrets, Deployment, Service, NetworkPolicy and PodDisruptionBudget, and what
//! monitoring needs to scrape it (a ServiceMonitor, and the platform Prometheus's RoleBinding).
//!
//! `render` is pure (HCP + config + certificates in, objects out), built as typed k8s-openapi
//! values so a misspelt field does not compile; the controller applies the result with
//! server-side apply under one field manager.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, HTTPGetAction,
    NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm, PodAffinity, PodAffinityTerm,
    PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, PreferredSchedulingTerm, Probe,
    ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Toleration, Volume, VolumeMount,
    WeightedPodAffinityTerm,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};

use crate::certificates::CertBundle;
use crate::config::{AgentConfig, MonitoringApi};
use hcp_fleet_model::crd::hostedcontrolplane::Scheduling;

pub const FIELD_MANAGER: &str = "hcp-fleet-agent";

/// The part of the admission Deployment the agent owns whole: its pods' spec. A field another
/// field manager adds there (`hostNetwork`, an `initContainer`) is drift like a changed one;
/// the pod template's metadata is not (`kubectl rollout restart` stamps an annotation there,
/// and a restart is SRE's to ask for).
pub const DEPLOYMENT_OWNED_WHOLE: &[&str] = &["spec.template.spec"];

/// Does the live admission Deployment say what was rendered: every rendered field, and
/// nothing another manager added to its pods' spec?
pub(crate) fn deployment_matches(desired: &serde_json::Value, live: &serde_json::Value) -> bool {
    hcp_fleet_model::compare::subset(desired, live)
        && hcp_fleet_model::compare::foreign_to_apply(live, FIELD_MANAGER, DEPLOYMENT_OWNED_WHOLE)
            .is_empty()
}

/// The NetworkPolicy's and the PodDisruptionBudget's spec are the agent's whole: an ingress
/// rule or an egress section added beside the rendered ones opens what the policy closes, and
/// a changed budget blocks or hastens evictions.
pub const SPEC_OWNED_WHOLE: &[&str] = &["spec"];

/// Does a live object owned whole under `spec` say what was rendered, and nothing more there?
pub(crate) fn spec_matches(desired: &serde_json::Value, live: &serde_json::Value) -> bool {
    hcp_fleet_model::compare::subset(desired, live)
        && hcp_fleet_model::compare::foreign_to_apply(live, FIELD_MANAGER, SPEC_OWNED_WHOLE)
            .is_empty()
}

/// How a management-side kind is compared and repaired: the parts owned whole and the
/// comparison that reads them, or `None` where the agent owns only the fields it renders
/// (the Service: the API server and other controllers fill in its spec; the Secrets,
/// ServiceAccount and monitoring objects).
pub fn owned_whole(kind: &str) -> Option<(&'static [&'static str], MatchFn)> {
    match kind {
        "ConfigMap" => Some((CONFIGMAP_OWNED_WHOLE, configmap_matches)),
        "Deployment" => Some((DEPLOYMENT_OWNED_WHOLE, deployment_matches)),
        "NetworkPolicy" | "PodDisruptionBudget" => Some((SPEC_OWNED_WHOLE, spec_matches)),
        _ => None,
    }
}

/// The static guards' ConfigMap (`hosted::static_guards`) is the hosted kube-apiserver's
/// admission configuration: its data is the agent's whole, and no server default fills it.
pub(crate) const CONFIGMAP_OWNED_WHOLE: &[&str] = &["data", "binaryData"];

/// Does the live ConfigMap hold exactly the rendered data (and the rendered metadata)?
pub(crate) fn configmap_matches(desired: &serde_json::Value, live: &serde_json::Value) -> bool {
    hcp_fleet_model::compare::subset(desired, live)
        && desired.get("data") == live.get("data")
        && live.get("binaryData").is_none()
}

/// Kinds compared with the rendering whole, whoever wrote the difference (a writer may use the
/// agent's own field manager name), and replaced where they differ: those without server
/// defaults in the part owned.
pub fn compared_whole(kind: &str) -> bool {
    kind == "ConfigMap"
}

/// A comparison of a rendered object with a live one.
pub type MatchFn = fn(&serde_json::Value, &serde_json::Value) -> bool;
use hcp_fleet_model::names::{COMPONENT_LABEL, MANAGED_BY, MANAGED_BY_VALUE};
/// Without this label HyperShift deletes guest webhook configurations that point at the
/// Service.
pub const ALLOW_GUEST_WEBHOOKS: &str = "hypershift.openshift.io/allow-guest-webhooks";
/// Where the serving certificate is mounted in the admission pods.
pub(crate) const CERT_DIR: &str = "/etc/hcp-fleet/tls";

#[derive(Debug, thiserror::Error)]
#[error("rendering {kind} for {namespace}: {source}")]
pub struct RenderError {
    pub(crate) namespace: String,
    pub(crate) kind: &'static str,
    #[source]
    pub(crate) source: serde_json::Error,
}

/// Which PodDisruptionBudget API the management cluster serves (discovered at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdbApi {
    /// `policy/v1` (Kubernetes 1.21 and later).
    V1,
    /// Only `policy/v1beta1` (1.20): the same spec under the older version.
    V1Beta1,
    /// Neither: no PodDisruptionBudget is rendered.
    None,
}

impl PdbApi {
    fn version(self) -> Option<&'static str> {
        match self {
            PdbApi::V1 => Some("v1"),
            PdbApi::V1Beta1 => Some("v1beta1"),
            PdbApi::None => None,
        }
    }

    /// Where PodDisruptionBudgets of this version live; `None` for `PdbApi::None`.
    pub fn api_resource(self) -> Option<ApiResource> {
        let gvk = GroupVersionKind::gvk("policy", self.version()?, "PodDisruptionBudget");
        Some(ApiResource::from_gvk_with_plural(
            &gvk,
            "poddisruptionbudgets",
        ))
    }
}

/// Everything the agent keeps in one HCP namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagementObjects {
    pub service_account: ServiceAccount,
    pub ca_secret: Secret,
    pub tls_secret: Secret,
    pub deployment: Deployment,
    pub service: Service,
    pub network_policy: NetworkPolicy,
    /// Already in the server's version (`HcpInputs::pdb_api`); `None` where the server serves
    /// no PodDisruptionBudget API.
    pub pdb: Option<DynamicObject>,
    /// In the configured monitoring API group; `None` when that is `none` or not served.
    pub service_monitor: Option<DynamicObject>,
    /// Lets the platform Prometheus discover the admission pods (`platformPrometheusAccess`).
    pub prometheus_binding: Option<RoleBinding>,
}

/// Inputs that vary per HCP.
pub struct HcpInputs<'a> {
    pub namespace: &'a str,
    /// Where the agent runs: its handshake with each replica (which proves what they serve
    /// before an old CA leaves the hosted trust) and its question of what each denied of the
    /// cluster's own requests must pass the NetworkPolicy.
    pub agent_namespace: &'a str,
    pub owner: Option<OwnerReference>,
    pub certs: &'a CertBundle,
    pub pdb_api: PdbApi,
    /// The HCP's own scheduling (node selector, tolerations, availability policy).
    pub scheduling: &'a Scheduling,
    /// The monitoring API group to write the ServiceMonitor in: the configured one if the
    /// management cluster serves it, else `MonitoringApi::None`.
    pub monitoring: MonitoringApi,
    /// The rollout revision the objects belong to (annotated on the Deployment).
    pub revision: Option<&'a str>,
}

/// The ClusterRole (shipped by the chart) that the platform Prometheus is bound to in each HCP
/// namespace: read of what it needs to discover the admission pods.
pub const METRICS_READER_ROLE: &str = "hcp-fleet-admission-metrics-reader";
/// OpenShift's platform Prometheus.
pub const PLATFORM_PROMETHEUS: (&str, &str) = ("openshift-monitoring", "prometheus-k8s");

/// Where ServiceMonitors of `api` live; `None` for `MonitoringApi::None`.
pub fn service_monitor_resource(api: MonitoringApi) -> Option<ApiResource> {
    let gvk = GroupVersionKind::gvk(api.group()?, "v1", "ServiceMonitor");
    Some(ApiResource::from_gvk_with_plural(&gvk, "servicemonitors"))
}

pub fn prometheus_binding_name(cfg: &AgentConfig) -> String {
    format!("{}-prometheus", cfg.admission.service_name)
}

pub fn ca_secret_name(cfg: &AgentConfig) -> String {
    format!("{}-ca", cfg.admission.service_name)
}

pub fn tls_secret_name(cfg: &AgentConfig) -> String {
    format!("{}-tls", cfg.admission.service_name)
}

/// SANs of the serving certificate: the Service's in-cluster names, plus whatever the
/// environment adds (`extra`, e.g. loopback on the local test bed).
pub fn serving_sans(cfg: &AgentConfig, namespace: &str, extra: &[String]) -> Vec<String> {
    let svc = &cfg.admission.service_name;
    let mut sans = vec![
        format!("{svc}.{namespace}.svc"),
        format!("{svc}.{namespace}.svc.cluster.local"),
    ];
    sans.extend(extra.iter().cloned());
    sans
}

fn labels(cfg: &AgentConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (
            COMPONENT_LABEL.to_string(),
            cfg.admission.service_name.clone(),
        ),
    ])
}

fn selector(cfg: &AgentConfig) -> BTreeMap<String, String> {
    BTreeMap::from([(
        COMPONENT_LABEL.to_string(),
        cfg.admission.service_name.clone(),
    )])
}

fn meta(cfg: &AgentConfig, name: &str, inp: &HcpInputs<'_>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(inp.namespace.to_string()),
        labels: Some(labels(cfg)),
        owner_references: inp.owner.clone().map(|o| vec![o]),
        ..Default::default()
    }
}

// `data`, not `stringData`: stringData is write-only, so re-applying it could never be
// recognised as a no-op.
fn secret_data(m: BTreeMap<String, String>) -> BTreeMap<String, ByteString> {
    m.into_iter()
        .map(|(k, v)| (k, ByteString(v.into_bytes())))
        .collect()
}

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

fn match_labels(m: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(m),
        ..Default::default()
    }
}

fn preferred_node(weight: i32, key: &str, value: &str) -> PreferredSchedulingTerm {
    PreferredSchedulingTerm {
        weight,
        preference: NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: "In".into(),
                values: Some(vec![value.into()]),
            }]),
            ..Default::default()
        },
    }
}

fn spread(cfg: &AgentConfig, weight: i32, topology_key: &str) -> WeightedPodAffinityTerm {
    WeightedPodAffinityTerm {
        weight,
        pod_affinity_term: PodAffinityTerm {
            label_selector: Some(match_labels(selector(cfg))),
            topology_key: topology_key.into(),
            ..Default::default()
        },
    }
}

fn toleration(key: &str, value: &str) -> Toleration {
    Toleration {
        key: Some(key.into()),
        operator: Some("Equal".into()),
        value: Some(value.into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }
}

fn https_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("https".into()),
            scheme: Some("HTTPS".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(1),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

const CONTROL_PLANE_TAINT: &str = "hypershift.openshift.io/control-plane";
const CLUSTER_TAINT: &str = "hypershift.openshift.io/cluster";
/// HyperShift labels every control-plane pod of an HCP with this (value: the HCP namespace)
/// and has each prefer the nodes where the others run.
pub(crate) const COLOCATION_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";

/// Replicas as HyperShift sizes its own ordinary components: one for a `SingleReplica`
/// control plane, else the configured number.
pub fn replicas(cfg: &AgentConfig, scheduling: &Scheduling) -> i32 {
    if scheduling.single_replica {
        1
    } else {
        cfg.admission.replicas
    }
}

/// The admission service's container: the `webhook` command with the guards' settings in its
/// environment (a change rolls out like any Deployment change), TLS from the mounted Secret.
fn webhook_container(a: &crate::config::AdmissionConfig, settings: String) -> Container {
    Container {
        name: "webhook".into(),
        image: Some(a.image.clone()),
        args: Some(vec![
            "webhook".into(),
            "--cert-dir".into(),
            CERT_DIR.into(),
            "--port".into(),
            a.port.to_string(),
        ]),
        // Modes and exemptions: a change rolls out like any Deployment change.
        env: Some(vec![
            EnvVar {
                name: hcp_fleet_guards::settings::SETTINGS_ENV.into(),
                value: Some(settings),
                ..Default::default()
            },
            // An environment variable, not an argument: an admission image from before the
            // pod image spec mutation ignores it instead of refusing to start.
            EnvVar {
                name: crate::internal_registry::FILE_ENV.into(),
                value: Some(format!(
                    "{}/{}",
                    crate::internal_registry::MOUNT_DIR,
                    crate::internal_registry::KEY
                )),
                ..Default::default()
            },
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: a.port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // A replica that stops answering leaves the endpoints within about 2 s, and the
        // agent, watching the Deployment, reports the outage (the guard is off meanwhile).
        readiness_probe: Some(https_probe("/readyz", 1, 2)),
        liveness_probe: Some(https_probe("/healthz", 10, 3)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity(a.resources.cpu_request.clone())),
                (
                    "memory".into(),
                    Quantity(a.resources.memory_request.clone()),
                ),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".into(),
                Quantity(a.resources.memory_limit.clone()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(strings(&["ALL"])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "tls".into(),
                mount_path: CERT_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "internal-registry".into(),
                mount_path: crate::internal_registry::MOUNT_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// Near the HCP's control plane (HyperShift's labels and taints), away from each other
/// across zones and nodes.
fn affinity(cfg: &AgentConfig, ns: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                preferred_node(50, CONTROL_PLANE_TAINT, "true"),
                preferred_node(100, CLUSTER_TAINT, ns),
            ]),
            ..Default::default()
        }),
        pod_affinity: Some(PodAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(match_labels(BTreeMap::from([(
                            COLOCATION_LABEL.to_string(),
                            ns.to_string(),
                        )]))),
                        topology_key: "kubernetes.io/hostname".into(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                spread(cfg, 100, "topology.kubernetes.io/zone"),
                spread(cfg, 50, "kubernetes.io/hostname"),
            ]),
            ..Default::default()
        }),
    }
}

fn deployment(cfg: &AgentConfig, inp: &HcpInputs<'_>) -> Result<Deployment, RenderError> {
    let a = &cfg.admission;
    let ns = inp.namespace;
    let settings =
        serde_json::to_string(&hcp_fleet_guards::Settings::from(cfg)).map_err(|source| {
            RenderError {
                namespace: ns.to_string(),
                kind: "Deployment",
                source,
            }
        })?;
    let container = webhook_container(a, settings);
    let pod = PodSpec {
        service_account_name: Some(a.service_name.clone()),
        automount_service_account_token: Some(false),
        priority_class_name: Some("hypershift-control-plane".into()),
        node_selector: (!inp.scheduling.node_selector.is_empty())
            .then(|| inp.scheduling.node_selector.clone()),
        tolerations: Some(
            [
                toleration(CONTROL_PLANE_TAINT, "true"),
                toleration(CLUSTER_TAINT, ns),
            ]
            .into_iter()
            .chain(inp.scheduling.tolerations.iter().cloned())
            .collect(),
        ),
        affinity: Some(affinity(cfg, ns)),
        // Restricted, with no fixed UID: OpenShift assigns one from the namespace range.
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        containers: vec![container],
        volumes: Some(vec![
            Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(tls_secret_name(cfg)),
                    ..Default::default()
                }),
                ..Default::default()
            },
            // The pod image spec mutation's input, which the agent writes once it has read
            // the hosted cluster: optional, so the pods start before it does.
            Volume {
                name: "internal-registry".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: crate::internal_registry::CONFIG_MAP.into(),
                    optional: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let mut metadata = meta(cfg, &a.service_name, inp);
    // On the Deployment, not its pod template: the revision names what the spec already
    // carries, and must not restart pods by itself.
    if let Some(rev) = inp.revision {
        metadata.annotations = Some(BTreeMap::from([(
            crate::rollout::REVISION_ANNOTATION.to_string(),
            rev.to_string(),
        )]));
    }
    Ok(Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas(cfg, inp.scheduling)),
            selector: match_labels(selector(cfg)),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    // Not in the selector, which cannot change once created.
                    labels: Some({
                        let mut l = labels(cfg);
                        l.insert(COLOCATION_LABEL.into(), ns.to_string());
                        l
                    }),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

pub fn render(cfg: &AgentConfig, inp: &HcpInputs<'_>) -> Result<ManagementObjects, RenderError> {
    let a = &cfg.admission;
    let name = &a.service_name;
    let service_account = ServiceAccount {
        metadata: meta(cfg, name, inp),
        // The admission service never calls the API server.
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let ca_secret = Secret {
        metadata: meta(cfg, &ca_secret_name(cfg), inp),
        type_: Some("Opaque".into()),
        data: Some(secret_data(inp.certs.ca_secret_data())),
        ..Default::default()
    };
    let tls_secret = Secret {
        metadata: meta(cfg, &tls_secret_name(cfg), inp),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(secret_data(inp.certs.tls_secret_data())),
        ..Default::default()
    };
    let mut svc_meta = meta(cfg, name, inp);
    svc_meta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(ALLOW_GUEST_WEBHOOKS.into(), "true".into());
    let service = Service {
        metadata: svc_meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector(cfg)),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port: 443,
                target_port: Some(IntOrString::String("https".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let network_policy = NetworkPolicy {
        metadata: meta(cfg, name, inp),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(selector(cfg))),
            policy_types: Some(strings(&["Ingress"])),
            ingress: Some(vec![NetworkPolicyIngressRule {
                // The hosted kube-apiserver calls the webhooks; monitoring scrapes /metrics;
                // the agent shakes hands with each replica to see what it serves, and asks
                // each for its report of the cluster's own requests denied.
                from: Some(vec![
                    NetworkPolicyPeer {
                        pod_selector: Some(match_labels(BTreeMap::from([(
                            "app".into(),
                            "kube-apiserver".into(),
                        )]))),
                        ..Default::default()
                    },
                    NetworkPolicyPeer {
                        namespace_selector: Some(match_labels(BTreeMap::from([(
                            "network.openshift.io/policy-group".into(),
                            "monitoring".into(),
                        )]))),
                        ..Default::default()
                    },
                    NetworkPolicyPeer {
                        namespace_selector: Some(match_labels(BTreeMap::from([(
                            "kubernetes.io/metadata.name".into(),
                            inp.agent_namespace.to_string(),
                        )]))),
                        ..Default::default()
                    },
                ]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(a.port)),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            }]),
            ..Default::default()
        }),
    };
    Ok(ManagementObjects {
        service_account,
        ca_secret,
        tls_secret,
        deployment: deployment(cfg, inp)?,
        service,
        network_policy,
        pdb: pdb(cfg, inp)?,
        service_monitor: service_monitor(cfg, inp)?,
        prometheus_binding: prometheus_binding(cfg, inp),
    })
}

/// The admission Service's scrape, in the HCP namespace and without a namespace selector (so
/// it means the same to a Prometheus that ignores selectors, as OpenShift's user-workload one
/// does). Verified TLS: the CA bundle from the serving Secret (both CAs during a rotation),
/// checked against the Service's DNS name; a Secret reference, not a file, since OpenShift's
/// user-workload monitoring refuses file paths in monitors.
fn service_monitor(
    cfg: &AgentConfig,
    inp: &HcpInputs<'_>,
) -> Result<Option<DynamicObject>, RenderError> {
    let Some(ar) = service_monitor_resource(inp.monitoring) else {
        return Ok(None);
    };
    let sm = &cfg.admission.service_monitor;
    let name = &cfg.admission.service_name;
    let mut metadata = meta(cfg, name, inp);
    let own = metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &sm.labels {
        own.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let v = serde_json::json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": labels(cfg)},
            "endpoints": [{
                "port": "https",
                "scheme": "https",
                "path": "/metrics",
                "interval": sm.interval,
                "tlsConfig": {
                    "ca": {"secret": {"name": tls_secret_name(cfg), "key": crate::certificates::CA_CERT_KEY}},
                    "serverName": format!("{name}.{}.svc", inp.namespace),
                },
            }],
        },
    });
    serde_json::from_value(v)
        .map(Some)
        .map_err(|source| RenderError {
            namespace: inp.namespace.to_string(),
            kind: "ServiceMonitor",
            source,
        })
}

fn prometheus_binding(cfg: &AgentConfig, inp: &HcpInputs<'_>) -> Option<RoleBinding> {
    if inp.monitoring != MonitoringApi::Coreos
        || !cfg.admission.service_monitor.platform_prometheus_access
    {
        return None;
    }
    let (namespace, name) = PLATFORM_PROMETHEUS;
    Some(RoleBinding {
        metadata: meta(cfg, &prometheus_binding_name(cfg), inp),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: METRICS_READER_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
            ..Default::default()
        }]),
    })
}

/// The PDB, typed as `policy/v1` and written under the version the server serves:
/// `policy/v1beta1` takes the same spec (minAvailable and a selector).
fn pdb(cfg: &AgentConfig, inp: &HcpInputs<'_>) -> Result<Option<DynamicObject>, RenderError> {
    let Some(version) = inp.pdb_api.version() else {
        return Ok(None);
    };
    let typed = PodDisruptionBudget {
        metadata: meta(cfg, &cfg.admission.service_name, inp),
        spec: Some(PodDisruptionBudgetSpec {
            // One replica: a PDB that protects it would block every drain of its node.
            min_available: (!inp.scheduling.single_replica).then_some(IntOrString::Int(1)),
            max_unavailable: inp.scheduling.single_replica.then_some(IntOrString::Int(1)),
            selector: Some(match_labels(selector(cfg))),
            // As HyperShift sets on its own control-plane PDBs: a pod that is not ready
            // protects nothing, and must not block a node drain (policy/v1 only; the field
            // is kept from Kubernetes 1.27).
            unhealthy_pod_eviction_policy: (inp.pdb_api == PdbApi::V1)
                .then(|| "AlwaysAllow".to_string()),
        }),
        ..Default::default()
    };
    let failed = |source| RenderError {
        namespace: inp.namespace.to_string(),
        kind: "PodDisruptionBudget",
        source,
    };
    let mut v = serde_json::to_value(&typed).map_err(failed)?;
    v["apiVersion"] = serde_json::Value::String(format!("policy/{version}"));
    v["kind"] = serde_json::Value::String("PodDisruptionBudget".into());
    serde_json::from_value(v).map(Some).map_err(failed)
}

/// Whether HyperShift lets guest webhooks name this Service: it carries the
/// `ALLOW_GUEST_WEBHOOKS` label.
pub fn allows_guest_webhooks(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(ALLOW_GUEST_WEBHOOKS))
}

/// The names of the Services that do not (`allows_guest_webhooks`): the candidates.
pub fn unlabelled_services(services: &[Service]) -> Vec<String> {
    services
        .iter()
        .filter(|s| !allows_guest_webhooks(&s.metadata))
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

/// Of the unlabelled Services of an HCP namespace (their names), those that would make
/// HyperShift delete guest webhooks calling `url`. HyperShift's hosted-cluster-config-operator
/// (its `webhookvalidation` controller, `buildDisallowedURLs` and `isAllowedWebhookURL`)
/// deletes a guest webhook configuration when any webhook's URL *contains* `https://<name>`
/// for a Service in the HCP namespace without the `hypershift.openshift.io/allow-guest-webhooks`
/// label. So an unlabelled Service whose name is a prefix of the admission Service's host
/// condemns it too, not only HyperShift's own. Returns their names, sorted.
pub fn names_condemning(url: &str, unlabelled: &[String]) -> Vec<String> {
    let mut names: Vec<String> = unlabelled
        .iter()
        .filter(|name| url.contains(&format!("https://{name}")))
        .cloned()
        .collect();
    names.sort();
    names
}

/// Available like a package-operator availability probe: the Deployment's controller has
/// seen the current spec and reports the Available condition, or enough ready replicas.
pub fn deployment_available(d: &Deployment) -> bool {
    let Some(status) = &d.status else {
        return false;
    };
    let observed = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    observed && deployment_serving(d)
}

/// Whether the Deployment has finished rolling out its current spec: its controller has seen
/// this generation, and every replica it wants is updated and available (no old one left).
/// What a rollout waits for before an HCP counts as done.
pub fn deployment_rolled_out(d: &Deployment) -> bool {
    let (Some(status), Some(spec)) = (&d.status, &d.spec) else {
        return false;
    };
    let want = spec.replicas.unwrap_or(1);
    status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && status.updated_replicas.unwrap_or(0) >= want
        && status.available_replicas.unwrap_or(0) >= want
        && status.replicas.unwrap_or(0) <= want
}

/// Whether the status says replicas are available, whatever generation it describes: during
/// a rollout (maxUnavailable 0) the old replicas serve until the new ones are ready.
pub fn deployment_serving(d: &Deployment) -> bool {
    let Some(status) = &d.status else {
        return false;
    };
    let cond = status.conditions.as_ref().is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    });
    cond || status.available_replicas.unwrap_or(0) >= 1
}

#[cfg(test)]
mod tests {

    /// The kinds owned whole, and only those: a NetworkPolicy with an egress section another
    /// manager added does not match its rendering; the same addition to a Service (whose spec
    /// the API server fills in) is not compared.
    #[test]
    fn what_another_manager_adds_beside_a_whole_spec_does_not_match() {
        let desired =
            serde_json::json!({"spec": {"policyTypes": ["Ingress"], "ingress": [{"from": []}]}});
        let live = |managers: serde_json::Value| {
            let mut l = desired.clone();
            l["spec"]["egress"] = serde_json::json!([{}]);
            l["metadata"] = serde_json::json!({"managedFields": managers});
            l
        };
        let ours = serde_json::json!({"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {
            "f:spec": {"f:policyTypes": {}, "f:ingress": {}}}});
        let theirs = serde_json::json!({"manager": "someone-else", "operation": "Update", "fieldsV1": {
            "f:spec": {"f:egress": {}}}});
        let (under, same) = owned_whole("NetworkPolicy").expect("owned whole");
        assert_eq!(under, SPEC_OWNED_WHOLE);
        assert!(!same(&desired, &live(serde_json::json!([ours, theirs]))));
        // Set by no manager (a server default) or by the agent: not foreign.
        assert!(same(&desired, &live(serde_json::json!([ours]))));
        assert!(owned_whole("PodDisruptionBudget").is_some());
        assert!(owned_whole("Deployment").is_some_and(|(u, _)| u == DEPLOYMENT_OWNED_WHOLE));
        for kind in ["Service", "Secret", "ServiceAccount", "ServiceMonitor"] {
            assert!(owned_whole(kind).is_none(), "{kind}");
        }
    }
    use super::*;
    use crate::certificates::CertBundle;

    /// #48: a field written into a part owned whole under the agent's own field manager name,
    /// by any operation but its apply (`kubectl patch --field-manager=hcp-fleet-agent`), is
    /// someone else's: each such tampering of each kind owned whole does not match its
    /// rendering. The entries are shaped as kube-apiserver 1.36.2 writes them (an Apply entry
    /// of the agent's, an Update entry of the same manager holding only what the patch set).
    #[test]
    fn a_tampering_under_the_agents_own_name_does_not_match() {
        let managed = |apply: serde_json::Value, update: serde_json::Value| {
            serde_json::json!([
                {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": apply},
                {"manager": FIELD_MANAGER, "operation": "Update", "fieldsV1": update},
            ])
        };
        let objs = objects(PdbApi::V1);
        let deployment = serde_json::to_value(&objs.deployment).expect("json");
        let pod_apply = serde_json::json!({"f:spec": {"f:template": {"f:spec": {
            "f:containers": {}, "f:serviceAccountName": {}, "f:volumes": {}}}}});
        let network_policy = serde_json::to_value(&objs.network_policy).expect("json");
        let spec_apply = serde_json::json!({"f:spec": {"f:podSelector": {}, "f:policyTypes": {}, "f:ingress": {}}});
        let pdb = serde_json::to_value(objs.pdb.as_ref().expect("pdb")).expect("json");
        let pdb_apply = serde_json::json!({"f:spec": {"f:selector": {}, "f:minAvailable": {}}});
        let cases: Vec<(
            &str,
            &serde_json::Value,
            serde_json::Value,
            &str,
            serde_json::Value,
        )> = vec![
            (
                "Deployment",
                &deployment,
                pod_apply.clone(),
                "/spec/template/spec/hostNetwork",
                serde_json::json!(true),
            ),
            (
                "Deployment",
                &deployment,
                pod_apply.clone(),
                "/spec/template/spec/initContainers",
                serde_json::json!([{"name": "sneaky", "image": "registry.example.com/sneaky:1"}]),
            ),
            (
                "Deployment",
                &deployment,
                pod_apply.clone(),
                "/spec/template/spec/nodeName",
                serde_json::json!("a-node-of-theirs"),
            ),
            (
                "NetworkPolicy",
                &network_policy,
                spec_apply.clone(),
                "/spec/egress",
                serde_json::json!([{}]),
            ),
            (
                "PodDisruptionBudget",
                &pdb,
                pdb_apply.clone(),
                "/spec/unhealthyPodEvictionPolicy",
                serde_json::json!("AlwaysAllow"),
            ),
        ];
        for (kind, desired, apply, at, value) in cases {
            let (under, same) = owned_whole(kind).expect("owned whole");
            let field = at.rsplit('/').next().expect("field");
            let mut update = serde_json::json!({});
            let mut node = &mut update;
            for part in at.trim_start_matches('/').split('/') {
                node = &mut node[format!("f:{part}")];
                *node = serde_json::json!({});
            }
            let mut live = desired.clone();
            let (parent, _) = at.rsplit_once('/').expect("parent");
            live.pointer_mut(parent).expect("parent")[field] = value;
            live["metadata"]["managedFields"] = managed(apply.clone(), update);
            assert!(!same(desired, &live), "{kind}: {at} under the agent's name");
            let foreign = hcp_fleet_model::compare::foreign_to_apply(&live, FIELD_MANAGER, under);
            assert_eq!(foreign.len(), 1, "{kind}: {foreign:?}");
            assert!(
                foreign[0].contains(&hcp_fleet_model::compare::not_applied(FIELD_MANAGER)),
                "{foreign:?}"
            );
            // Owned by no entry (a server default), it is not: only the operation decided.
            let mut unowned = live.clone();
            let entries = unowned["metadata"]["managedFields"]
                .as_array_mut()
                .expect("entries");
            entries.truncate(1);
            assert!(same(desired, &unowned), "{kind}: {at} owned by no one");
        }
    }

    fn objects(pdb_api: PdbApi) -> ManagementObjects {
        objects_with(pdb_api, &Scheduling::default())
    }

    fn objects_with(pdb_api: PdbApi, scheduling: &Scheduling) -> ManagementObjects {
        let cfg = AgentConfig::default();
        let certs =
            CertBundle::generate(&cfg, &serving_sans(&cfg, "clusters-hc-1", &[])).expect("certs");
        render(
            &cfg,
            &HcpInputs {
                namespace: "clusters-hc-1",
                agent_namespace: "hcp-fleet-agent",
                owner: None,
                certs: &certs,
                pdb_api,
                scheduling,
                monitoring: MonitoringApi::Coreos,
                revision: None,
            },
        )
        .expect("render")
    }

    #[test]
    fn the_deployment_follows_the_hcps_scheduling_as_hypershifts_own_pods_do() {
        let infra = Toleration {
            key: Some("infra".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        };
        let scheduling = Scheduling {
            node_selector: BTreeMap::from([(
                "node-role.kubernetes.io/infra".into(),
                String::new(),
            )]),
            tolerations: vec![infra.clone()],
            single_replica: false,
            ignored: Vec::new(),
        };
        let o = objects_with(PdbApi::V1, &scheduling);
        let spec = o.deployment.spec.expect("spec");
        assert_eq!(
            spec.replicas,
            Some(2),
            "HighlyAvailable: the configured replicas"
        );
        let template = spec.template;
        let labels = template.metadata.expect("meta").labels.expect("labels");
        assert_eq!(
            labels.get(COLOCATION_LABEL).map(String::as_str),
            Some("clusters-hc-1")
        );
        assert!(
            !spec
                .selector
                .match_labels
                .expect("selector")
                .contains_key(COLOCATION_LABEL),
            "the selector is immutable and stays as it was"
        );
        let pod = template.spec.expect("pod");
        assert_eq!(pod.node_selector, Some(scheduling.node_selector.clone()));
        let tolerations = pod.tolerations.expect("tolerations");
        assert_eq!(tolerations.len(), 3, "HyperShift's two, then the HCP's");
        assert_eq!(tolerations[2], infra);
        let colocate = pod
            .affinity
            .expect("affinity")
            .pod_affinity
            .expect("pod affinity")
            .preferred_during_scheduling_ignored_during_execution
            .expect("preferred");
        assert_eq!(colocate[0].weight, 100);
        assert_eq!(
            colocate[0].pod_affinity_term.topology_key,
            "kubernetes.io/hostname"
        );
        assert_eq!(
            colocate[0]
                .pod_affinity_term
                .label_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .and_then(|m| m.get(COLOCATION_LABEL))
                .map(String::as_str),
            Some("clusters-hc-1")
        );
        let pdb = serde_json::to_value(o.pdb.expect("pdb")).expect("json");
        assert_eq!(pdb["spec"]["minAvailable"], 1);

        // SingleReplica: one replica, and a PDB that never blocks a drain.
        let single = Scheduling {
            single_replica: true,
            ..Default::default()
        };
        let o = objects_with(PdbApi::V1, &single);
        assert_eq!(o.deployment.spec.expect("spec").replicas, Some(1));
        let pdb = serde_json::to_value(o.pdb.expect("pdb")).expect("json");
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
        assert!(pdb["spec"].get("minAvailable").is_none());
        // Nothing asked: no node selector at all.
        let o = objects(PdbApi::V1);
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        assert!(pod.node_selector.is_none());
        assert_eq!(pod.tolerations.expect("tolerations").len(), 2);
    }

    #[test]
    fn service_carries_allow_guest_webhooks() {
        let o = objects(PdbApi::V1);
        let labels = o.service.metadata.labels.expect("labels");
        assert_eq!(
            labels.get(ALLOW_GUEST_WEBHOOKS).map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn deployment_is_restricted_without_a_fixed_uid() {
        let o = objects(PdbApi::V1);
        let spec = o.deployment.spec.expect("spec").template.spec.expect("pod");
        assert_eq!(
            o.deployment.metadata.namespace.as_deref(),
            Some("clusters-hc-1")
        );
        let psc = spec.security_context.expect("psc");
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, None);
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().expect("sc");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.run_as_user, None);
        let tol = spec.tolerations.expect("tolerations");
        assert!(
            tol.iter()
                .any(|t| t.value.as_deref() == Some("clusters-hc-1"))
        );
    }

    #[test]
    fn the_ca_key_is_never_mounted_into_the_pods() {
        let o = objects(PdbApi::V1);
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        let vols = pod.volumes.expect("volumes");
        let secrets: Vec<_> = vols
            .iter()
            .filter_map(|v| v.secret.as_ref().and_then(|s| s.secret_name.clone()))
            .collect();
        assert_eq!(secrets, ["hcp-fleet-admission-tls"]);
        // The one other volume: the internal registry's ConfigMap, optional.
        let others: Vec<_> = vols.iter().filter(|v| v.secret.is_none()).collect();
        assert_eq!(others.len(), 1);
        let cm = others[0].config_map.as_ref().expect("a ConfigMap volume");
        assert_eq!(cm.name, crate::internal_registry::CONFIG_MAP);
        assert_eq!(cm.optional, Some(true));
        // The service finds the file where the volume is mounted, named by an environment
        // variable (an older image ignores it).
        let c = &pod.containers[0];
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == others[0].name)
            .expect("mounted");
        let file = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == crate::internal_registry::FILE_ENV)
            .and_then(|e| e.value.clone());
        assert_eq!(
            file,
            Some(format!(
                "{}/{}",
                mount.mount_path,
                crate::internal_registry::KEY
            ))
        );
        let tls = o.tls_secret.data.expect("data");
        assert!(!tls.contains_key("ca.key"));
        assert!(tls.contains_key("tls.key") && tls.contains_key("ca.crt"));
        assert!(o.ca_secret.data.expect("ca").contains_key("ca.key"));
    }

    #[test]
    fn any_unlabelled_service_whose_name_prefixes_the_url_condemns_the_webhooks() {
        let svc = |name: &str, labelled: bool| Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: labelled.then(|| {
                    BTreeMap::from([(ALLOW_GUEST_WEBHOOKS.to_string(), "true".to_string())])
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let url = "https://hcp-fleet-admission.clusters-hc-1.svc.cluster.local/validate";
        let services = [
            svc("hcp-fleet-admission", true),    // the agent's own, labelled
            svc("kube-apiserver", false),        // HyperShift's: not a prefix
            svc("hcp", false),                   // a prefix: condemns
            svc("hcp-fleet", false),             // likewise
            svc("hcp-fleet-admission-x", false), // longer than the host part: no
            svc("h", true),                      // labelled: allowed
        ];
        let condemning =
            |services: &[Service]| names_condemning(url, &unlabelled_services(services));
        assert_eq!(condemning(&services), ["hcp", "hcp-fleet"]);
        // The agent's own Service without its label condemns its own webhooks.
        assert_eq!(
            condemning(&[svc("hcp-fleet-admission", false)]),
            ["hcp-fleet-admission"]
        );
        assert!(condemning(&[]).is_empty());
    }

    #[test]
    fn pdb_in_the_version_the_server_serves() {
        let wire = |api| serde_json::to_value(objects(api).pdb.expect("pdb")).expect("json");
        let v1 = wire(PdbApi::V1);
        assert_eq!(v1["apiVersion"], "policy/v1");
        // Not-ready admission pods never block a drain of the node they sit on.
        assert_eq!(v1["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
        let old = wire(PdbApi::V1Beta1);
        assert!(
            old["spec"].get("unhealthyPodEvictionPolicy").is_none(),
            "policy/v1beta1 has no such field"
        );
        assert_eq!(old["apiVersion"], "policy/v1beta1");
        assert_eq!(old["kind"], "PodDisruptionBudget");
        assert_eq!(old["spec"]["minAvailable"], 1);
        assert!(objects(PdbApi::None).pdb.is_none());
        assert!(PdbApi::None.api_resource().is_none());
        assert_eq!(
            PdbApi::V1Beta1.api_resource().expect("v1beta1").api_version,
            "policy/v1beta1"
        );
    }

    #[test]
    fn secrets_hold_raw_pem_in_data() {
        let o = objects(PdbApi::V1);
        let tls = o.tls_secret.data.expect("data");
        let crt = String::from_utf8(tls["tls.crt"].0.clone()).expect("utf8");
        assert!(crt.starts_with("-----BEGIN CERTIFICATE-----"), "{crt}");
        let wire = serde_json::to_value(&o.ca_secret).expect("json");
        assert!(
            !wire["data"]["ca.crt"]
                .as_str()
                .expect("base64 on the wire")
                .contains("BEGIN"),
            "the wire form is base64"
        );
    }

    #[test]
    fn render_is_deterministic_for_the_same_inputs() {
        let cfg = AgentConfig::default();
        let certs = CertBundle::generate(&cfg, &serving_sans(&cfg, "ns", &[])).expect("c");
        let inp = HcpInputs {
            namespace: "ns",
            agent_namespace: "hcp-fleet-agent",
            owner: None,
            certs: &certs,
            pdb_api: PdbApi::V1,
            scheduling: &Scheduling::default(),
            monitoring: MonitoringApi::Coreos,
            revision: None,
        };
        assert_eq!(
            render(&cfg, &inp).expect("a"),
            render(&cfg, &inp).expect("b")
        );
    }

    fn render_monitoring(cfg: &AgentConfig, monitoring: MonitoringApi) -> ManagementObjects {
        let certs = CertBundle::generate(cfg, &serving_sans(cfg, "clusters-hc-1", &[])).expect("c");
        render(
            cfg,
            &HcpInputs {
                namespace: "clusters-hc-1",
                agent_namespace: "hcp-fleet-agent",
                owner: None,
                certs: &certs,
                pdb_api: PdbApi::V1,
                scheduling: &Scheduling::default(),
                monitoring,
                revision: None,
            },
        )
        .expect("render")
    }

    #[test]
    fn the_service_monitor_scrapes_its_own_namespace_with_verified_tls() {
        let mut cfg = AgentConfig::default();
        cfg.admission
            .service_monitor
            .labels
            .insert("openshift.io/user-monitoring".into(), "true".into());
        let o = render_monitoring(&cfg, MonitoringApi::Coreos);
        let sm = serde_json::to_value(o.service_monitor.expect("a ServiceMonitor")).expect("json");
        assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(sm["metadata"]["namespace"], "clusters-hc-1");
        assert_eq!(
            sm["metadata"]["labels"]["openshift.io/user-monitoring"],
            "true"
        );
        assert_eq!(sm["metadata"]["labels"][MANAGED_BY], MANAGED_BY_VALUE);
        // No namespace selector: a Prometheus that ignores selectors reads it the same way.
        assert!(sm["spec"].get("namespaceSelector").is_none(), "{sm}");
        // It selects the Service the agent renders, by labels that Service carries.
        let svc_labels = o.service.metadata.labels.expect("labels");
        let wanted = sm["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels");
        for (k, v) in wanted {
            assert_eq!(svc_labels.get(k).map(String::as_str), v.as_str(), "{k}");
        }
        let ep = &sm["spec"]["endpoints"][0];
        let port = o.service.spec.expect("spec").ports.expect("ports")[0]
            .name
            .clone();
        assert_eq!(ep["port"].as_str(), port.as_deref());
        assert_eq!(ep["scheme"], "https");
        assert_eq!(ep["interval"], "30s");
        // Verified against the CA bundle in the serving Secret, under the Service's name
        // (which the serving certificate carries); no file paths, no skipped verification.
        let tls = &ep["tlsConfig"];
        assert_eq!(tls["ca"]["secret"]["name"], tls_secret_name(&cfg));
        assert_eq!(tls["ca"]["secret"]["key"], "ca.crt");
        assert!(o.tls_secret.data.expect("data").contains_key("ca.crt"));
        let server = tls["serverName"].as_str().expect("serverName");
        assert!(
            serving_sans(&cfg, "clusters-hc-1", &[])
                .iter()
                .any(|s| s == server),
            "{server}"
        );
        assert!(tls.get("insecureSkipVerify").is_none() && tls.get("caFile").is_none());
        let rb = o.prometheus_binding.expect("platform Prometheus binding");
        assert_eq!(rb.role_ref.name, METRICS_READER_ROLE);
        let who = &rb.subjects.expect("subjects")[0];
        assert_eq!(
            (who.namespace.as_deref(), who.name.as_str()),
            (Some("openshift-monitoring"), "prometheus-k8s")
        );
    }

    #[test]
    fn monitoring_objects_follow_the_api_group() {
        let cfg = AgentConfig::default();
        let o = render_monitoring(&cfg, MonitoringApi::Rhobs);
        let sm = serde_json::to_value(o.service_monitor.expect("a ServiceMonitor")).expect("json");
        assert_eq!(sm["apiVersion"], "monitoring.rhobs/v1");
        // The platform Prometheus reads only monitoring.coreos.com monitors.
        assert!(o.prometheus_binding.is_none());
        let o = render_monitoring(&cfg, MonitoringApi::None);
        assert!(o.service_monitor.is_none() && o.prometheus_binding.is_none());
        let mut off = cfg.clone();
        off.admission.service_monitor.platform_prometheus_access = false;
        let o = render_monitoring(&off, MonitoringApi::Coreos);
        assert!(o.service_monitor.is_some() && o.prometheus_binding.is_none());
    }
}
