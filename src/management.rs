//! Management-side objects in each HCP namespace: the admission service's ServiceAccount,
//! certificate Secrets, Deployment, Service, NetworkPolicy and PodDisruptionBudget.
//!
//! `render` is pure (HCP + config + certificates in, objects out); the controller applies the
//! result with server-side apply under one field manager.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;

use crate::certificates::CertBundle;
use crate::config::AgentConfig;

pub const FIELD_MANAGER: &str = "hcp-fleet-agent";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "hcp-fleet-agent";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/name";
/// Without this label HyperShift deletes guest webhook configurations that point at the
/// Service.
pub const ALLOW_GUEST_WEBHOOKS: &str = "hypershift.openshift.io/allow-guest-webhooks";
/// Where the serving certificate is mounted in the admission pods.
pub const CERT_DIR: &str = "/etc/hcp-fleet/tls";

#[derive(Debug, thiserror::Error)]
#[error("rendering {kind} for {namespace}: {reason}")]
pub struct RenderError {
    pub namespace: String,
    pub kind: &'static str,
    pub reason: String,
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
    /// `policy/v1` PodDisruptionBudget as JSON; `None` where the server lacks policy/v1.
    pub pdb: Option<serde_json::Value>,
}

/// Inputs that vary per HCP.
pub struct HcpInputs<'a> {
    pub namespace: &'a str,
    pub owner: Option<OwnerReference>,
    pub certs: &'a CertBundle,
    pub has_policy_v1: bool,
}

pub fn ca_secret_name(cfg: &AgentConfig) -> String {
    format!("{}-ca", cfg.admission.service_name)
}

pub fn tls_secret_name(cfg: &AgentConfig) -> String {
    format!("{}-tls", cfg.admission.service_name)
}

/// SANs of the serving certificate (DESIGN.md step 2).
pub fn serving_sans(cfg: &AgentConfig, namespace: &str, local: bool) -> Vec<String> {
    let svc = &cfg.admission.service_name;
    let mut sans = vec![
        format!("{svc}.{namespace}.svc"),
        format!("{svc}.{namespace}.svc.cluster.local"),
    ];
    if local {
        sans.push("127.0.0.1".into());
        sans.push("localhost".into());
    }
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

fn meta(cfg: &AgentConfig, name: &str, inp: &HcpInputs<'_>) -> serde_json::Value {
    let mut m = json!({
        "name": name,
        "namespace": inp.namespace,
        "labels": labels(cfg),
    });
    if let Some(o) = &inp.owner {
        m["ownerReferences"] = json!([o]);
    }
    m
}

// `data`, not `stringData`: stringData is write-only, so re-applying it could never be
// recognised as a no-op.
fn b64_map(m: BTreeMap<String, String>) -> BTreeMap<String, String> {
    use base64::Engine;
    m.into_iter()
        .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(v)))
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(
    ns: &str,
    kind: &'static str,
    v: serde_json::Value,
) -> Result<T, RenderError> {
    serde_json::from_value(v).map_err(|e| RenderError {
        namespace: ns.to_string(),
        kind,
        reason: e.to_string(),
    })
}

pub fn render(cfg: &AgentConfig, inp: &HcpInputs<'_>) -> Result<ManagementObjects, RenderError> {
    let ns = inp.namespace;
    let a = &cfg.admission;
    let name = &a.service_name;
    let sel = json!({ COMPONENT_LABEL: name });

    let service_account = typed(
        ns,
        "ServiceAccount",
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": meta(cfg, name, inp),
            // The admission service never calls the API server.
            "automountServiceAccountToken": false,
        }),
    )?;
    let ca_secret = typed(
        ns,
        "Secret",
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": meta(cfg, &ca_secret_name(cfg), inp),
            "data": b64_map(inp.certs.ca_secret_data()),
        }),
    )?;
    let tls_secret = typed(
        ns,
        "Secret",
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": meta(cfg, &tls_secret_name(cfg), inp),
            "data": b64_map(inp.certs.tls_secret_data()),
        }),
    )?;

    let cluster_toleration_key = "hypershift.openshift.io/cluster";
    let settings_json = serde_json::to_string(&crate::admission::policies::Settings::from_config(
        cfg,
    ))
    .map_err(|e| RenderError {
        namespace: ns.to_string(),
        kind: "Deployment",
        reason: e.to_string(),
    })?;
    let deployment = typed(
        ns,
        "Deployment",
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": meta(cfg, name, inp),
            "spec": {
                "replicas": a.replicas,
                "selector": {"matchLabels": sel},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {
                    "metadata": {"labels": labels(cfg)},
                    "spec": {
                        "serviceAccountName": name,
                        "automountServiceAccountToken": false,
                        "priorityClassName": "hypershift-control-plane",
                        "tolerations": [
                            {"key": "hypershift.openshift.io/control-plane", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                            {"key": cluster_toleration_key, "operator": "Equal", "value": ns, "effect": "NoSchedule"},
                        ],
                        "affinity": {
                            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 50, "preference": {"matchExpressions": [{"key": "hypershift.openshift.io/control-plane", "operator": "In", "values": ["true"]}]}},
                                {"weight": 100, "preference": {"matchExpressions": [{"key": cluster_toleration_key, "operator": "In", "values": [ns]}]}},
                            ]},
                            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": sel}, "topologyKey": "topology.kubernetes.io/zone"}},
                                {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": sel}, "topologyKey": "kubernetes.io/hostname"}},
                            ]},
                        },
                        // Restricted, with no fixed UID: OpenShift assigns one from the namespace range.
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "webhook",
                            "image": a.image,
                            "args": ["webhook", "--cert-dir", CERT_DIR, "--port", a.port.to_string()],
                            // Modes and exemptions: a change rolls out like any Deployment change.
                            "env": [{"name": crate::admission::policies::SETTINGS_ENV, "value": settings_json}],
                            "ports": [{"name": "https", "containerPort": a.port, "protocol": "TCP"}],
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "https", "scheme": "HTTPS"}, "periodSeconds": 5},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "https", "scheme": "HTTPS"}, "periodSeconds": 10},
                            "resources": {
                                "requests": {"cpu": a.resources.cpu_request, "memory": a.resources.memory_request},
                                "limits": {"memory": a.resources.memory_limit},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "tls", "mountPath": CERT_DIR, "readOnly": true}],
                        }],
                        "volumes": [{"name": "tls", "secret": {"secretName": tls_secret_name(cfg)}}],
                    },
                },
            },
        }),
    )?;
    let mut svc_meta = meta(cfg, name, inp);
    svc_meta["labels"][ALLOW_GUEST_WEBHOOKS] = json!("true");
    let service = typed(
        ns,
        "Service",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": svc_meta,
            "spec": {
                "type": "ClusterIP",
                "selector": sel,
                "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}],
            },
        }),
    )?;
    let network_policy = typed(
        ns,
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": meta(cfg, name, inp),
            "spec": {
                "podSelector": {"matchLabels": sel},
                "policyTypes": ["Ingress"],
                "ingress": [{
                    // The hosted kube-apiserver calls the webhooks; monitoring scrapes /metrics.
                    "from": [
                        {"podSelector": {"matchLabels": {"app": "kube-apiserver"}}},
                        {"namespaceSelector": {"matchLabels": {"network.openshift.io/policy-group": "monitoring"}}},
                    ],
                    "ports": [{"port": a.port, "protocol": "TCP"}],
                }],
            },
        }),
    )?;
    let pdb = inp.has_policy_v1.then(|| {
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": meta(cfg, name, inp),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": sel}},
        })
    });
    Ok(ManagementObjects {
        service_account,
        ca_secret,
        tls_secret,
        deployment,
        service,
        network_policy,
        pdb,
    })
}

/// Available like a package-operator availability probe: the Deployment's controller has
/// seen the current spec and reports the Available condition, or enough ready replicas.
pub fn deployment_available(d: &Deployment) -> bool {
    let Some(status) = &d.status else {
        return false;
    };
    let observed = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    let cond = status.conditions.as_ref().is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    });
    observed && (cond || status.available_replicas.unwrap_or(0) >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::CertBundle;

    fn objects(has_v1: bool) -> ManagementObjects {
        let cfg = AgentConfig::default();
        let certs =
            CertBundle::generate(&cfg, &serving_sans(&cfg, "clusters-hc-1", false)).expect("certs");
        render(
            &cfg,
            &HcpInputs {
                namespace: "clusters-hc-1",
                owner: None,
                certs: &certs,
                has_policy_v1: has_v1,
            },
        )
        .expect("render")
    }

    #[test]
    fn service_carries_allow_guest_webhooks() {
        let o = objects(true);
        let labels = o.service.metadata.labels.expect("labels");
        assert_eq!(
            labels.get(ALLOW_GUEST_WEBHOOKS).map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn deployment_is_restricted_without_a_fixed_uid() {
        let o = objects(true);
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
        let o = objects(true);
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        let vols = pod.volumes.expect("volumes");
        assert_eq!(vols.len(), 1);
        let mounted = vols[0].secret.as_ref().and_then(|s| s.secret_name.clone());
        assert_eq!(mounted.as_deref(), Some("hcp-fleet-admission-tls"));
        let tls = o.tls_secret.data.expect("data");
        assert!(!tls.contains_key("ca.key"));
        assert!(tls.contains_key("tls.key") && tls.contains_key("ca.crt"));
        assert!(o.ca_secret.data.expect("ca").contains_key("ca.key"));
    }

    #[test]
    fn pdb_only_where_policy_v1_is_served() {
        assert!(objects(true).pdb.is_some());
        assert!(objects(false).pdb.is_none());
    }

    #[test]
    fn render_is_deterministic_for_the_same_inputs() {
        let cfg = AgentConfig::default();
        let certs = CertBundle::generate(&cfg, &serving_sans(&cfg, "ns", false)).expect("c");
        let inp = HcpInputs {
            namespace: "ns",
            owner: None,
            certs: &certs,
            has_policy_v1: true,
        };
        assert_eq!(
            render(&cfg, &inp).expect("a"),
            render(&cfg, &inp).expect("b")
        );
    }
}
