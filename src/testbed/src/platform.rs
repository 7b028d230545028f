//! What an OpenShift hosted cluster runs in its data plane, and a customer's sanctioned work,
//! written into a hosted cluster of the test bed by the identities that write it on a real one,
//! so its controllers make pods, its kubelets ask for their tokens, and every guard in force
//! sees the cluster's own traffic (docs/testbed.md, "The data plane").
//!
//! Who writes what, and where that is said:
//! - HyperShift's control-plane operators run in the HCP namespace and write into the hosted
//!   cluster with the service-network admin kubeconfig, `system:admin` in `system:masters`
//!   (HyperShift's control-plane-operator/controllers/hostedcontrolplane/v2/assets/*/
//!   deployment.yaml: cluster-version-operator, cluster-network-operator,
//!   cluster-node-tuning-operator, cluster-image-registry-operator, ingress-operator,
//!   olm-operator and catalog-operator mount `service-network-admin-kubeconfig`).
//! - Operators the cluster-version operator runs in the data plane act as their service
//!   accounts, with the token their pod's kubelet obtained (here: the DNS operator and the
//!   cluster monitoring operator).
//! - The customer: a user in `cluster-admins` (bound to `cluster-admin`), installing Red Hat's
//!   Logging and Loki operators where OpenShift's documentation says (the namespace, an
//!   OperatorGroup, a Subscription; then OLM, as `system:admin` in HyperShift, writes the
//!   operator's service account, RBAC and Deployment), everyday work in a namespace of
//!   their own (RBAC, a Deployment, a LoadBalancer Service), and `oc adm must-gather` (its
//!   namespace and ClusterRoleBinding, made and deleted).
//! - The kube-controller-manager's garbage collector, with its own service account, deleting a
//!   platform ClusterRoleBinding whose owner went.
//!
//! Every write's outcome is returned; a refusal by any guard is a failure of the guards.

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::{LocalCpError, LocalFleet};

/// The customer administrator of the fixture: in `cluster-admins`, as ROSA and OSD name it.
pub const CUSTOMER: (&str, &[&str]) = ("customer-admin", &["cluster-admins"]);
/// HyperShift's components' identity in the hosted cluster.
pub const SYSTEM_ADMIN: (&str, &[&str]) = ("system:admin", &["system:masters"]);
/// The hosted-cluster-config-operator's (HyperShift's pki/kas.go: `system:hosted-cluster-config`
/// in `kubernetes` and `system:serviceaccounts:openshift`).
pub const HCCO: (&str, &[&str]) = (
    "system:hosted-cluster-config",
    &["kubernetes", "system:serviceaccounts:openshift"],
);
/// The kube-apiserver's bootstrap container's (pki/kas.go), which applies the FeatureGate.
pub const KAS_BOOTSTRAP: (&str, &[&str]) = ("system:kas-bootstrap-container", &["kubernetes"]);

/// One write and its outcome.
#[derive(Debug, Clone)]
pub struct Write {
    /// Who wrote it, and why that identity (the component that does it on a real cluster).
    pub by: String,
    pub what: String,
    pub outcome: Result<(), String>,
}

/// Every write of the fixture.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub writes: Vec<Write>,
}

impl Report {
    /// The writes the API server refused.
    pub fn refused(&self) -> Vec<&Write> {
        self.writes.iter().filter(|w| w.outcome.is_err()).collect()
    }
}

fn resource(api_version: &str, kind: &str) -> (ApiResource, bool) {
    if kind == "SecurityContextConstraints" {
        return (
            ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("security.openshift.io", "v1", kind),
                "securitycontextconstraints",
            ),
            true,
        );
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "CustomResourceDefinition" => "customresourcedefinitions".to_string(),
        "OperatorGroup" => "operatorgroups".to_string(),
        "Subscription" => "subscriptions".to_string(),
        k if k.ends_with('s') => format!("{}es", k.to_lowercase()),
        k => format!("{}s", k.to_lowercase()),
    };
    // The cluster config kinds (FeatureGate, Ingress, Network) are cluster-scoped too.
    let cluster_scoped = matches!(
        kind,
        "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "CustomResourceDefinition"
            | "FeatureGate"
            | "Ingress"
            | "Network"
            | "Config"
            | "ClusterVersion"
    );
    (
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural),
        cluster_scoped,
    )
}

/// Creates `obj` as `client`'s identity, an existing object counting as written (the fixture
/// may run twice); a missing CRD's kind is retried for a while as a controller's create would.
async fn create(report: &mut Report, by: &str, client: &Client, obj: Value) {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
    let (ar, cluster_scoped) = resource(&api_version, &kind);
    let api: Api<DynamicObject> = match (&ns, cluster_scoped) {
        (Some(ns), false) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    let what = match &ns {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    };
    let outcome = match serde_json::from_value::<DynamicObject>(obj) {
        Err(e) => Err(format!("not an object: {e}")),
        Ok(o) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match api.create(&PostParams::default(), &o).await {
                    Ok(_) => break Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => break Ok(()),
                    // A CRD just created is not served at once; a namespace just created may
                    // still lack the service account the ServiceAccount plugin wants.
                    Err(kube::Error::Api(e)) if e.code == 404 && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    Err(e) => break Err(e.to_string()),
                }
            }
        }
    };
    report.writes.push(Write {
        by: by.to_string(),
        what,
        outcome,
    });
}

/// Creates `obj` (or finds it), then changes it by a merge patch of `change`: what an operator's
/// reconcile sends, an UPDATE to every guard.
async fn create_then_update(r: &mut Report, by: &str, client: &Client, obj: Value, change: Value) {
    create(r, by, client, obj.clone()).await;
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (ar, _) = resource(api_version, kind);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let outcome = api
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&change),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    r.writes.push(Write {
        by: by.to_string(),
        what: format!("{kind} {name} changed"),
        outcome,
    });
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn service_account(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}})
}

fn cluster_admin_binding(name: &str, subject: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [subject],
    })
}

fn sa_subject(ns: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": ns})
}

/// A pod template as OpenShift's operators write them: a service account, one container, and
/// a projected service-account token (what every pod of 1.21+ gets from the ServiceAccount
/// plugin as `kube-api-access-*`; written out so a 1.20 server's kubelet asks for it too).
fn template(app: &str, sa: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "serviceAccountName": sa,
            "containers": [{"name": app, "image": format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev:{app}")}],
            "tolerations": [{"operator": "Exists"}],
            "volumes": [{"name": "bound-sa-token", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            ]}}],
        },
    })
}

fn deployment(ns: &str, name: &str, sa: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template(name, sa)},
    })
}

fn daemonset(ns: &str, name: &str, sa: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": template(name, sa)},
    })
}

/// OLM's two kinds the customer writes, as CRDs the cluster-version operator installs.
fn olm_crds() -> Vec<Value> {
    [("operatorgroups", "OperatorGroup", "v1"), ("subscriptions", "Subscription", "v1alpha1")]
        .iter()
        .map(|(plural, kind, version)| json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.operators.coreos.com")},
            "spec": {
                "group": "operators.coreos.com", "scope": "Namespaced",
                "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List")},
                "versions": [{"name": version, "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        }))
        .collect()
}

/// The workloads the fixture runs, as (namespace, DaemonSets, Deployments): what a test waits
/// on before it counts tokens.
pub const WORKLOADS: &[(&str, &[&str], &[&str])] = &[
    ("openshift-dns-operator", &[], &["dns-operator"]),
    ("openshift-dns", &["dns-default", "node-resolver"], &[]),
    (
        "openshift-monitoring",
        &["node-exporter"],
        &["cluster-monitoring-operator", "prometheus-operator"],
    ),
    ("openshift-multus", &["multus"], &[]),
    ("openshift-ovn-kubernetes", &["ovnkube-node"], &[]),
    ("openshift-cluster-node-tuning-operator", &["tuned"], &[]),
    (
        "openshift-image-registry",
        &["node-ca"],
        &["image-registry"],
    ),
    ("openshift-ingress-canary", &["ingress-canary"], &[]),
    ("openshift-logging", &[], &["cluster-logging-operator"]),
    (
        "openshift-operators-redhat",
        &[],
        &["loki-operator-controller-manager"],
    ),
    ("team-a", &[], &["web"]),
];

/// Installs the fixture in hosted cluster `hosted` of `fleet` (which must have its data plane).
pub async fn install(fleet: &LocalFleet, hosted: &str) -> Result<Report, LocalCpError> {
    let mut r = Report::default();
    let admin = fleet
        .hosted_client_for(hosted, SYSTEM_ADMIN.0, SYSTEM_ADMIN.1)
        .await?;
    let customer = fleet
        .hosted_client_for(hosted, CUSTOMER.0, CUSTOMER.1)
        .await?;
    control_plane(&mut r, &admin).await;
    cluster_config(fleet, hosted, &mut r, &admin).await?;
    // The data-plane operators act once their pods run and hold their tokens.
    for (ns, sa, act) in [
        ("openshift-dns-operator", "dns-operator", Operator::Dns),
        (
            "openshift-monitoring",
            "cluster-monitoring-operator",
            Operator::Monitoring,
        ),
    ] {
        let token = wait_token(fleet, hosted, ns, sa).await?;
        let client = fleet.hosted_client_with_token(hosted, &token).await?;
        let by = format!("system:serviceaccount:{ns}:{sa} (its pod's token)");
        act.run(&mut r, &by, &client).await;
    }
    customer_work(&mut r, &customer).await;
    olm_installs(&mut r, &admin).await;
    must_gather(&mut r, &customer).await;
    garbage_collected_binding(&mut r, &admin).await;
    Ok(r)
}

/// HyperShift's control plane (`system:admin`): the operators' namespaces, accounts and
/// workloads the cluster-version operator applies from the release, the network plugin's
/// DaemonSets (the network operator), tuned, the registry, the ingress canary, OLM's CRDs,
/// and the customer administrators' binding.
async fn control_plane(r: &mut Report, admin: &Client) {
    let by = "system:admin (HyperShift's control-plane operators)";
    let mut objs = olm_crds();
    objs.push(cluster_admin_binding(
        "cluster-admins",
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "cluster-admins"}),
    ));
    // The rights of HyperShift's own certificate users (broader here than HyperShift's roles:
    // what they write is what matters to the guards).
    for user in [HCCO.0, KAS_BOOTSTRAP.0] {
        objs.push(cluster_admin_binding(
            &format!("hypershift-{}", user.trim_start_matches("system:")),
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}),
        ));
    }
    for (ns, sa) in [
        ("openshift-dns-operator", "dns-operator"),
        ("openshift-monitoring", "cluster-monitoring-operator"),
    ] {
        objs.push(namespace(
            ns,
            json!({"openshift.io/cluster-monitoring": "true"}),
        ));
        objs.push(service_account(ns, sa));
        objs.push(cluster_admin_binding(
            &format!("{ns}-{sa}"),
            sa_subject(ns, sa),
        ));
        objs.push(deployment(ns, sa, sa));
    }
    for (ns, ds, sa) in [
        ("openshift-multus", "multus", "multus"),
        (
            "openshift-ovn-kubernetes",
            "ovnkube-node",
            "ovn-kubernetes-node",
        ),
        ("openshift-cluster-node-tuning-operator", "tuned", "tuned"),
        ("openshift-image-registry", "node-ca", "node-ca"),
        ("openshift-ingress-canary", "ingress-canary", "default"),
    ] {
        objs.push(namespace(ns, json!({"openshift.io/run-level": "0"})));
        if sa != "default" {
            objs.push(service_account(ns, sa));
        }
        objs.push(daemonset(ns, ds, sa));
    }
    objs.push(service_account("openshift-image-registry", "registry"));
    objs.push(deployment(
        "openshift-image-registry",
        "image-registry",
        "registry",
    ));
    objs.push(namespace("openshift-operator-lifecycle-manager", json!({})));
    // The image registry operator's config (cluster-image-registry-operator, in the HCP
    // namespace with the admin kubeconfig) and the release's ImageStreams the cluster-version
    // operator applies to `openshift` (the release payload's image-references: cli, tools,
    // must-gather, each a tag by digest).
    objs.push(
        json!({"apiVersion": "imageregistry.operator.openshift.io/v1", "kind": "Config",
        "metadata": {"name": "cluster"}, "spec": {"managementState": "Managed"}}),
    );
    objs.push(namespace("openshift", json!({})));
    // The cluster-version operator's own object, which every OpenShift cluster has.
    objs.push(json!({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion",
        "metadata": {"name": "version"}, "spec": {"clusterID": "00000000-0000-0000-0000-000000000001"}}));
    for (name, digest) in RELEASE_IMAGE_STREAMS {
        objs.push(json!({"apiVersion": "image.openshift.io/v1", "kind": "ImageStream",
            "metadata": {"name": name, "namespace": "openshift"},
            "spec": {"tags": [{"name": "latest", "from": {"kind": "DockerImage", "name": release_image(digest)}}]}}));
    }
    for o in objs {
        create(r, by, admin, o).await;
    }
}

/// The `openshift` namespace's ImageStreams the fixture's release carries, and their images'
/// digests (`release_image`).
pub const RELEASE_IMAGE_STREAMS: &[(&str, &str)] = &[
    (
        "cli",
        "1f0b1c7e0b2f3b6f3c4a6c0c5e9f1f7a2b3c4d5e6f708192a3b4c5d6e7f80912",
    ),
    (
        "tools",
        "2a1b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809",
    ),
    (
        "must-gather",
        "3b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a",
    ),
];

/// A release image by digest, as a release's ImageStream tag names it.
pub fn release_image(digest: &str) -> String {
    format!("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{digest}")
}

/// HyperShift's writes of the cluster's configuration, each by the component that makes it:
/// the FeatureGate (the kube-apiserver's bootstrap container), the ingress config and the
/// network operator's config (the hosted-cluster-config-operator), a default SCC (the
/// cluster-version operator, `system:admin`).
async fn cluster_config(
    fleet: &LocalFleet,
    hosted: &str,
    r: &mut Report,
    admin: &Client,
) -> Result<(), LocalCpError> {
    let bootstrap = fleet
        .hosted_client_for(hosted, KAS_BOOTSTRAP.0, KAS_BOOTSTRAP.1)
        .await?;
    let hcco = fleet.hosted_client_for(hosted, HCCO.0, HCCO.1).await?;
    let config = |api: &str, kind: &str, name: &str, spec: Value| json!({"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": spec});
    create_then_update(
        r,
        "system:kas-bootstrap-container (HyperShift's kube-apiserver bootstrap)",
        &bootstrap,
        config(
            "config.openshift.io/v1",
            "FeatureGate",
            "cluster",
            json!({}),
        ),
        // A feature set a HostedCluster may ask for that does not block upgrades.
        json!({"spec": {"featureSet": "LatencySensitive"}}),
    )
    .await;
    let by = "system:hosted-cluster-config (HyperShift's hosted-cluster-config-operator)";
    create_then_update(
        r,
        by,
        &hcco,
        config("config.openshift.io/v1", "Ingress", "cluster", json!({})),
        json!({"spec": {"domain": "apps.hc-1.example.com"}}),
    )
    .await;
    create_then_update(
        r,
        by,
        &hcco,
        config("operator.openshift.io/v1", "Network", "cluster", json!({})),
        json!({"spec": {"defaultNetwork": {"type": "OVNKubernetes"}}}),
    )
    .await;
    create_then_update(
        r,
        "system:admin (HyperShift's cluster-version operator)",
        admin,
        json!({"apiVersion": "security.openshift.io/v1", "kind": "SecurityContextConstraints",
               "metadata": {"name": "restricted-v2"}, "allowPrivilegedContainer": false, "priority": null}),
        json!({"allowPrivilegeEscalation": false}),
    )
    .await;
    Ok(())
}

#[derive(Clone, Copy)]
enum Operator {
    Dns,
    Monitoring,
}

impl Operator {
    async fn run(self, r: &mut Report, by: &str, c: &Client) {
        let objs = match self {
            // cluster-dns-operator: openshift-dns, its accounts and DaemonSets.
            Operator::Dns => vec![
                namespace("openshift-dns", json!({"openshift.io/run-level": "0"})),
                service_account("openshift-dns", "dns"),
                daemonset("openshift-dns", "dns-default", "dns"),
                service_account("openshift-dns", "node-resolver"),
                daemonset("openshift-dns", "node-resolver", "node-resolver"),
            ],
            // cluster-monitoring-operator: node-exporter and the prometheus operator.
            Operator::Monitoring => vec![
                service_account("openshift-monitoring", "node-exporter"),
                daemonset("openshift-monitoring", "node-exporter", "node-exporter"),
                service_account("openshift-monitoring", "prometheus-operator"),
                deployment(
                    "openshift-monitoring",
                    "prometheus-operator",
                    "prometheus-operator",
                ),
            ],
        };
        for o in objs {
            create(r, by, c, o).await;
        }
    }
}

/// The customer: Red Hat's Logging and Loki operators subscribed where OpenShift's
/// documentation has them, and a team namespace with RBAC, a workload and a LoadBalancer.
async fn customer_work(r: &mut Report, c: &Client) {
    let by = "customer-admin (cluster-admins)";
    let subscribe = |ns: &str, package: &str| {
        vec![
            json!({"apiVersion": "operators.coreos.com/v1", "kind": "OperatorGroup",
                   "metadata": {"name": ns, "namespace": ns}, "spec": {"targetNamespaces": [ns]}}),
            json!({"apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
                   "metadata": {"name": package, "namespace": ns},
                   "spec": {"channel": "stable-6.2", "name": package, "source": "redhat-operators", "sourceNamespace": "openshift-marketplace"}}),
        ]
    };
    let mut objs = vec![namespace(
        "openshift-logging",
        json!({"openshift.io/cluster-monitoring": "true"}),
    )];
    objs.extend(subscribe("openshift-logging", "cluster-logging"));
    objs.push(namespace(
        "openshift-operators-redhat",
        json!({"openshift.io/cluster-monitoring": "true"}),
    ));
    objs.extend(subscribe("openshift-operators-redhat", "loki-operator"));
    objs.extend([
        namespace("team-a", json!({})),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "deployer", "namespace": "team-a"},
               "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "deployer", "namespace": "team-a"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a-devs"}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web", "namespace": "team-a"}, "data": {"a": "b"}}),
        deployment("team-a", "web", "default"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "team-a",
               "annotations": {"service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "team=a"}},
               "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
    ]);
    for o in objs {
        create(r, by, c, o).await;
    }
}

/// OLM installing what the customer subscribed to (HyperShift runs OLM in the control plane,
/// as `system:admin`): the operator's account, its RBAC and its Deployment.
async fn olm_installs(r: &mut Report, admin: &Client) {
    let by = "system:admin (OLM in HyperShift's control plane)";
    for (ns, name) in [
        ("openshift-logging", "cluster-logging-operator"),
        (
            "openshift-operators-redhat",
            "loki-operator-controller-manager",
        ),
    ] {
        let objs = vec![
            service_account(ns, name),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": name, "namespace": ns},
                   "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": name, "namespace": ns},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                   "subjects": [sa_subject(ns, name)]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": format!("{ns}-{name}")},
                   "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": format!("{ns}-{name}")},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{ns}-{name}")},
                   "subjects": [sa_subject(ns, name)]}),
            deployment(ns, name, name),
        ];
        for o in objs {
            create(r, by, admin, o).await;
        }
    }
}

/// Deletes the cluster-scoped `kind` named `name` as `client`'s identity, recorded as a write
/// (one already gone counts as deleted).
async fn delete(
    r: &mut Report,
    by: &str,
    client: &Client,
    (api_version, kind): (&str, &str),
    name: &str,
) {
    let (ar, _) = resource(api_version, kind);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let outcome = match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    r.writes.push(Write {
        by: by.to_string(),
        what: format!("{kind} {name} deleted"),
        outcome,
    });
}

/// `oc adm must-gather` as the customer runs it (oc's pkg/cli/admin/mustgather; the binding's
/// shape as MCVW's clusterrolebinding tests have it): a namespace by `generateName`
/// `openshift-must-gather-`, a ClusterRoleBinding of `cluster-admin` to its `default` account,
/// annotated with the command, both deleted when the gathering ends.
async fn must_gather(r: &mut Report, c: &Client) {
    let by = "customer-admin (cluster-admins), running oc adm must-gather";
    let ns = "openshift-must-gather-k2x9q";
    let name = "must-gather-k2x9q";
    create(
        r,
        by,
        c,
        namespace(ns, json!({"openshift.io/run-level": "0"})),
    )
    .await;
    create(
        r,
        by,
        c,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name, "annotations": {"oc.openshift.io/command": "oc adm must-gather"}},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [sa_subject(ns, "default")]}),
    )
    .await;
    delete(
        r,
        by,
        c,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        name,
    )
    .await;
    delete(r, by, c, ("v1", "Namespace"), ns).await;
}

/// The garbage collector deleting a platform binding whose owner went, with its own
/// credentials (`generic-garbage-collector` in `kube-system`): as when an operator's
/// ClusterRole that owns its binding is removed. The binding must be gone within a minute.
async fn garbage_collected_binding(r: &mut Report, admin: &Client) {
    let by = "system:serviceaccount:kube-system:generic-garbage-collector (the owner deleted by system:admin)";
    let name = "hcp-fleet-fixture-owned-binding";
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    let owner = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": name}, "rules": []});
    let outcome = async {
        // What an earlier run of the fixture left (it may run twice on one cluster).
        for gone in [
            roles.delete(name, &DeleteParams::default()).await.map(|_| ()),
            bindings.delete(name, &DeleteParams::default()).await.map(|_| ()),
        ] {
            match gone {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(format!("removing an earlier run's objects: {e}")),
            }
        }
        let owner = match serde_json::from_value(owner) {
            Ok(o) => roles.create(&PostParams::default(), &o).await,
            Err(e) => return Err(format!("not a ClusterRole: {e}")),
        }
        .map_err(|e| format!("creating the owner: {e}"))?;
        let uid = owner.metadata.uid.unwrap_or_default();
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": name, "uid": uid}]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [sa_subject("openshift-dns-operator", "dns-operator")]});
        let binding = serde_json::from_value(binding).map_err(|e| format!("not a binding: {e}"))?;
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .map_err(|e| format!("creating the binding: {e}"))?;
        roles
            .delete(name, &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting the owner: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match bindings.get_opt(name).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(Some(_)) => return Err("still there a minute after its owner went".to_string()),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    .await;
    r.writes.push(Write {
        by: by.to_string(),
        what: format!("ClusterRoleBinding {name} deleted (its owner gone)"),
        outcome,
    });
}

/// The token the kubelet obtained for a pod of `sa` in `ns`, once it has.
async fn wait_token(
    fleet: &LocalFleet,
    hosted: &str,
    ns: &str,
    sa: &str,
) -> Result<String, LocalCpError> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(t) = fleet.data_plane(hosted).and_then(|d| d.token_of(ns, sa)) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = fleet
                .data_plane(hosted)
                .map(|d| d.tokens())
                .unwrap_or_default()
                .iter()
                .map(|t| format!("{}/{}: {:?}", t.namespace, t.pod, t.outcome))
                .collect();
            return Err(LocalCpError::NotReady {
                component: format!("{hosted}'s data plane"),
                timeout: Duration::from_secs(90),
                last_error: format!(
                    "no token for a pod of {ns}/{sa}; token requests so far: {seen:?}"
                ),
                log_tail: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
