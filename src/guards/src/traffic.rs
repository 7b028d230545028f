//! The traffic every guard must let through: a hosted cluster's own machinery with the
//! identities it really uses, and a customer's sanctioned work. Each entry names where its
//! identity and its request's shape come from. `hosted::cel_cases` sends every entry through
//! every guard, by the admission service's decision and by the guard's CEL form: none may deny
//! one (docs/security.md, "What the guards let through"). The e2e suite sends the same kinds of
//! request for real, from the test bed's data plane (`hcp_fleet_testbed::platform`).

use serde_json::{Value, json};

use crate::case::{Case, Want};

/// Who sends a request of the corpus: the classes a denial is counted by too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sender {
    Kubelet,
    ControllerManager,
    Scheduler,
    HyperShift,
    PlatformOperator,
    Olm,
    /// ACM's policy controllers in hosted mode, writing SRE's policies into the hosted cluster.
    Acm,
    Customer,
}

impl Sender {
    pub fn name(self) -> &'static str {
        match self {
            Sender::Kubelet => "kubelet",
            Sender::ControllerManager => "controller-manager",
            Sender::Scheduler => "scheduler",
            Sender::HyperShift => "hypershift",
            Sender::PlatformOperator => "platform-operator",
            Sender::Olm => "olm",
            Sender::Acm => "acm",
            Sender::Customer => "customer",
        }
    }
}

/// One request of the corpus.
#[derive(Debug, Clone)]
pub struct Traffic {
    pub sender: Sender,
    /// Where the identity and the request's shape are taken from.
    pub source: &'static str,
    pub case: Case,
}

const KUBELET: (&str, &[&str]) = (
    "system:node:worker-0",
    &["system:nodes", "system:authenticated"],
);
const KCM: (&str, &[&str]) = ("system:kube-controller-manager", &["system:authenticated"]);
const SCHEDULER: (&str, &[&str]) = ("system:kube-scheduler", &["system:authenticated"]);
const ADMIN: (&str, &[&str]) = ("system:admin", &["system:masters", "system:authenticated"]);
const HCCO: (&str, &[&str]) = (
    "system:hosted-cluster-config",
    &[
        "kubernetes",
        "system:serviceaccounts:openshift",
        "system:authenticated",
    ],
);
const KAS_BOOTSTRAP: (&str, &[&str]) = (
    "system:kas-bootstrap-container",
    &["kubernetes", "system:authenticated"],
);
const CUSTOMER: (&str, &[&str]) = (
    "customer-admin",
    &["cluster-admins", "system:authenticated"],
);
const SA_KUBE_SYSTEM: &[&str] = &[
    "system:serviceaccounts",
    "system:serviceaccounts:kube-system",
    "system:authenticated",
];

fn t(sender: Sender, source: &'static str, case: Case) -> Traffic {
    Traffic {
        sender,
        source,
        case,
    }
}

fn token_request(pod: &str) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
        "audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3607,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": "5f0b6c1e-8d7a-4f39-a1c2-3e4d5f6a7b8c"}}})
}

fn pod(name: &str, sa: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"serviceAccountName": sa, "nodeName": "worker-0", "containers": [{"name": "c", "image": "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:0"}]}})
}

fn running(mut p: Value) -> Value {
    p["status"] = json!({"phase": "Running"});
    p
}

fn workload(kind: &str, name: &str, sa: &str) -> Value {
    json!({"kind": kind, "metadata": {"name": name}, "spec": {"template": {"spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "x"}]}}}})
}

fn ns(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn config(spec: Value) -> Value {
    json!({"metadata": {"name": "cluster"}, "spec": spec})
}

/// The corpus.
pub fn corpus() -> Vec<Traffic> {
    use Sender::*;
    use Want::Allow;
    let kube_src = "kubernetes pkg/kubelet (token manager, node status, node lease)";
    let kcm_src = "kubernetes pkg/controller, with --use-service-account-credentials (HyperShift's kube-controller-manager)";
    let hs_src = "HyperShift control-plane-operator pki/kas.go and hostedclusterconfigoperator (identities); v2/assets/*/deployment.yaml (service-network-admin-kubeconfig)";
    let sa = |c: &str| -> &'static str {
        match c {
            "service-account-controller" => {
                "system:serviceaccount:kube-system:service-account-controller"
            }
            "replicaset-controller" => "system:serviceaccount:kube-system:replicaset-controller",
            "daemon-set-controller" => "system:serviceaccount:kube-system:daemon-set-controller",
            "generic-garbage-collector" => {
                "system:serviceaccount:kube-system:generic-garbage-collector"
            }
            "namespace-controller" => "system:serviceaccount:kube-system:namespace-controller",
            "root-ca-cert-publisher" => "system:serviceaccount:kube-system:root-ca-cert-publisher",
            _ => "system:serviceaccount:kube-system:deployment-controller",
        }
    };
    vec![
        // The kubelet.
        t(Kubelet, kube_src, Case::new("a kubelet's token for a DNS pod", Allow, ("CREATE", "", "serviceaccounts", "dns")).subresource("token").namespaced("openshift-dns").objects(token_request("dns-default-x2v7q"), Value::Null).by(KUBELET.0, KUBELET.1)),
        t(Kubelet, kube_src, Case::new("a kubelet's token for a multus pod", Allow, ("CREATE", "", "serviceaccounts", "multus")).subresource("token").namespaced("openshift-multus").objects(token_request("multus-7xk2p"), Value::Null).by(KUBELET.0, KUBELET.1)),
        t(Kubelet, kube_src, Case::new("a kubelet's token for an ingress canary (the default account)", Allow, ("CREATE", "", "serviceaccounts", "default")).subresource("token").namespaced("openshift-ingress-canary").objects(token_request("ingress-canary-9q8wz"), Value::Null).by(KUBELET.0, KUBELET.1)),
        t(Kubelet, kube_src, Case::new("a kubelet registers its Node", Allow, ("CREATE", "", "nodes", "worker-0")).objects(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-0"}}), Value::Null).by(KUBELET.0, KUBELET.1)),
        t(Kubelet, kube_src, Case::new("a kubelet reports a DNS pod running", Allow, ("UPDATE", "", "pods", "dns-default-x2v7q")).subresource("status").namespaced("openshift-dns").objects(running(pod("dns-default-x2v7q", "dns")), pod("dns-default-x2v7q", "dns")).by(KUBELET.0, KUBELET.1)),
        t(Kubelet, kube_src, Case::new("a kubelet renews its Lease", Allow, ("UPDATE", "coordination.k8s.io", "leases", "worker-0")).namespaced("kube-node-lease").objects(json!({"metadata": {"name": "worker-0"}, "spec": {"holderIdentity": "worker-0"}}), json!({"metadata": {"name": "worker-0"}})).by(KUBELET.0, KUBELET.1)),
        // The kube-controller-manager.
        t(ControllerManager, kcm_src, Case::new("the service-account controller makes openshift-dns's default account", Allow, ("CREATE", "", "serviceaccounts", "default")).namespaced("openshift-dns").objects(json!({"metadata": {"name": "default"}}), Value::Null).by(sa("service-account-controller"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the token controller makes a token Secret in openshift-dns", Allow, ("CREATE", "", "secrets", "")).namespaced("openshift-dns").objects(json!({"metadata": {"generateName": "dns-token-", "name": "dns-token-4kq8x", "annotations": {"kubernetes.io/service-account.name": "dns"}}, "type": "kubernetes.io/service-account-token"}), Value::Null).by(KCM.0, KCM.1)),
        t(ControllerManager, kcm_src, Case::new("the controller manager asks a token for a controller's account", Allow, ("CREATE", "", "serviceaccounts", "replicaset-controller")).subresource("token").namespaced("kube-system").objects(json!({"spec": {"expirationSeconds": 3600}}), Value::Null).by(KCM.0, KCM.1)),
        t(ControllerManager, kcm_src, Case::new("the replicaset controller makes the DNS operator's pod", Allow, ("CREATE", "", "pods", "")).namespaced("openshift-dns-operator").objects(pod("dns-operator-5d9f7-abcde", "dns-operator"), Value::Null).by(sa("replicaset-controller"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the daemonset controller makes a DNS pod", Allow, ("CREATE", "", "pods", "")).namespaced("openshift-dns").objects(pod("dns-default-abcde", "dns"), Value::Null).by(sa("daemon-set-controller"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the deployment controller makes a ReplicaSet in openshift-monitoring", Allow, ("CREATE", "apps", "replicasets", "")).namespaced("openshift-monitoring").objects(workload("ReplicaSet", "prometheus-operator-6c9", "prometheus-operator"), Value::Null).by(sa("deployment-controller"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the garbage collector deletes an old ReplicaSet", Allow, ("DELETE", "apps", "replicasets", "prometheus-operator-5b8")).namespaced("openshift-monitoring").objects(Value::Null, workload("ReplicaSet", "prometheus-operator-5b8", "prometheus-operator")).by(sa("generic-garbage-collector"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the garbage collector deletes a ClusterRoleBinding whose owner went", Allow, ("DELETE", "rbac.authorization.k8s.io", "clusterrolebindings", "system:openshift:operator:dns")).objects(Value::Null, json!({"metadata": {"name": "system:openshift:operator:dns"}, "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"}, "subjects": [{"kind": "ServiceAccount", "name": "dns-operator", "namespace": "openshift-dns-operator"}]})).by(sa("generic-garbage-collector"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the root CA publisher writes kube-root-ca.crt in openshift-dns", Allow, ("CREATE", "", "configmaps", "kube-root-ca.crt")).namespaced("openshift-dns").objects(json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----"}}), Value::Null).by(sa("root-ca-cert-publisher"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the namespace controller empties a deleted namespace", Allow, ("DELETE", "", "serviceaccounts", "")).namespaced("openshift-must-gather-k2x9q").objects(Value::Null, json!({"metadata": {"name": "default"}})).by(sa("namespace-controller"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the namespace controller empties a deleted platform namespace", Allow, ("DELETE", "", "serviceaccounts", "")).namespaced("openshift-ingress-canary").objects(Value::Null, json!({"metadata": {"name": "ingress-canary", "namespace": "openshift-ingress-canary"}})).by(sa("namespace-controller"), SA_KUBE_SYSTEM)),
        t(ControllerManager, kcm_src, Case::new("the garbage collector deletes a service account whose owner went", Allow, ("DELETE", "", "serviceaccounts", "node-exporter")).namespaced("openshift-monitoring").objects(Value::Null, json!({"metadata": {"name": "node-exporter", "namespace": "openshift-monitoring"}})).by(sa("generic-garbage-collector"), SA_KUBE_SYSTEM)),
        // The scheduler.
        t(Scheduler, "kubernetes pkg/scheduler (the binding it posts)", Case::new("the scheduler binds a DNS pod", Allow, ("CREATE", "", "pods", "dns-default-abcde")).subresource("binding").namespaced("openshift-dns").objects(json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "dns-default-abcde"}, "target": {"kind": "Node", "name": "worker-0"}}), Value::Null).by(SCHEDULER.0, SCHEDULER.1)),
        // HyperShift's control plane.
        t(HyperShift, hs_src, Case::new("the KAS bootstrap container writes the FeatureGate", Allow, ("UPDATE", "config.openshift.io", "featuregates", "cluster")).objects(config(json!({"featureSet": ""})), config(json!({}))).by(KAS_BOOTSTRAP.0, KAS_BOOTSTRAP.1)),
        t(HyperShift, hs_src, Case::new("the hosted-cluster-config-operator writes the ingress config", Allow, ("UPDATE", "config.openshift.io", "ingresses", "cluster")).objects(config(json!({"domain": "apps.hc.example.com"})), config(json!({}))).by(HCCO.0, HCCO.1)),
        t(HyperShift, hs_src, Case::new("the hosted-cluster-config-operator writes the network operator config", Allow, ("UPDATE", "operator.openshift.io", "networks", "cluster")).objects(config(json!({"defaultNetwork": {"type": "OVNKubernetes"}})), config(json!({}))).by(HCCO.0, HCCO.1)),
        t(HyperShift, hs_src, Case::new("the hosted-cluster-config-operator writes the ClusterVersion", Allow, ("UPDATE", "config.openshift.io", "clusterversions", "version")).objects(json!({"metadata": {"name": "version"}, "spec": {"clusterID": "x", "channel": "stable-4.19"}}), json!({"metadata": {"name": "version"}, "spec": {"clusterID": "x"}})).by(HCCO.0, HCCO.1)),
        t(HyperShift, "HyperShift hostedclusterconfigoperator/controllers/resources (the proxy's trusted CA, from the HostedCluster's additionalTrustBundle)", Case::new("the hosted-cluster-config-operator writes openshift-config/user-ca-bundle", Allow, ("UPDATE", "", "configmaps", "user-ca-bundle")).namespaced("openshift-config").objects(json!({"metadata": {"name": "user-ca-bundle", "namespace": "openshift-config"}, "data": {"ca-bundle.crt": "-----BEGIN CERTIFICATE-----"}}), json!({"metadata": {"name": "user-ca-bundle", "namespace": "openshift-config"}})).by(HCCO.0, HCCO.1)),
        t(HyperShift, "HyperShift hostedclusterconfigoperator/controllers/resources (globalconfig.ProxyConfig)", Case::new("the hosted-cluster-config-operator writes the Proxy", Allow, ("UPDATE", "config.openshift.io", "proxies", "cluster")).objects(config(json!({"trustedCA": {"name": "user-ca-bundle"}})), config(json!({}))).by(HCCO.0, HCCO.1)),
        t(HyperShift, hs_src, Case::new("the hosted-cluster-config-operator creates openshift-ingress", Allow, ("CREATE", "", "namespaces", "openshift-ingress")).objects(ns("openshift-ingress"), Value::Null).by(HCCO.0, HCCO.1)),
        t(HyperShift, hs_src, Case::new("the cluster-version operator updates the restricted-v2 SCC", Allow, ("UPDATE", "security.openshift.io", "securitycontextconstraints", "restricted-v2")).objects(json!({"metadata": {"name": "restricted-v2"}, "priority": 0}), json!({"metadata": {"name": "restricted-v2"}})).by(ADMIN.0, ADMIN.1)),
        t(HyperShift, hs_src, Case::new("the cluster-version operator creates openshift-dns-operator", Allow, ("CREATE", "", "namespaces", "openshift-dns-operator")).objects(ns("openshift-dns-operator"), Value::Null).by(ADMIN.0, ADMIN.1)),
        t(HyperShift, hs_src, Case::new("the cluster-version operator creates the DNS operator's account", Allow, ("CREATE", "", "serviceaccounts", "dns-operator")).namespaced("openshift-dns-operator").objects(json!({"metadata": {"name": "dns-operator"}}), Value::Null).by(ADMIN.0, ADMIN.1)),
        t(HyperShift, hs_src, Case::new("the cluster-version operator creates the DNS operator's Deployment", Allow, ("CREATE", "apps", "deployments", "dns-operator")).namespaced("openshift-dns-operator").objects(workload("Deployment", "dns-operator", "dns-operator"), Value::Null).by(ADMIN.0, ADMIN.1)),
        t(HyperShift, hs_src, Case::new("the network operator updates the ovnkube-node DaemonSet", Allow, ("UPDATE", "apps", "daemonsets", "ovnkube-node")).namespaced("openshift-ovn-kubernetes").objects(workload("DaemonSet", "ovnkube-node", "ovn-kubernetes-node"), workload("DaemonSet", "ovnkube-node", "old")).by(ADMIN.0, ADMIN.1)),
        // The in-cluster operators.
        t(PlatformOperator, "cluster-dns-operator (runs in openshift-dns-operator as dns-operator)", Case::new("the DNS operator creates openshift-dns", Allow, ("CREATE", "", "namespaces", "openshift-dns")).objects(ns("openshift-dns"), Value::Null).by("system:serviceaccount:openshift-dns-operator:dns-operator", &["system:serviceaccounts", "system:serviceaccounts:openshift-dns-operator", "system:authenticated"])),
        t(PlatformOperator, "cluster-dns-operator", Case::new("the DNS operator writes dns-default", Allow, ("UPDATE", "apps", "daemonsets", "dns-default")).namespaced("openshift-dns").objects(workload("DaemonSet", "dns-default", "dns"), workload("DaemonSet", "dns-default", "old")).by("system:serviceaccount:openshift-dns-operator:dns-operator", &["system:serviceaccounts", "system:serviceaccounts:openshift-dns-operator", "system:authenticated"])),
        t(PlatformOperator, "managed-upgrade-operator (MCVW's clusterVersionUsers)", Case::new("the managed upgrade operator writes an UpgradeConfig", Allow, ("UPDATE", "upgrade.managed.openshift.io", "upgradeconfigs", "managed-upgrade-config")).namespaced("openshift-managed-upgrade-operator").objects(json!({"metadata": {"name": "managed-upgrade-config"}, "spec": {"desired": {"version": "4.19.1"}}}), json!({"metadata": {"name": "managed-upgrade-config"}})).by("system:serviceaccount:openshift-managed-upgrade-operator:managed-upgrade-operator", &["system:serviceaccounts", "system:serviceaccounts:openshift-managed-upgrade-operator", "system:authenticated"])),
        // OLM (in HyperShift's control plane: system:admin).
        t(Olm, hs_src, Case::new("OLM creates the Logging operator's account", Allow, ("CREATE", "", "serviceaccounts", "cluster-logging-operator")).namespaced("openshift-logging").objects(json!({"metadata": {"name": "cluster-logging-operator"}}), Value::Null).by(ADMIN.0, ADMIN.1)),
        t(Olm, hs_src, Case::new("OLM creates the Logging operator's Deployment", Allow, ("CREATE", "apps", "deployments", "cluster-logging-operator")).namespaced("openshift-logging").objects(workload("Deployment", "cluster-logging-operator", "cluster-logging-operator"), Value::Null).by(ADMIN.0, ADMIN.1)),
        t(Olm, hs_src, Case::new("OLM binds the Logging operator's ClusterRole", Allow, ("CREATE", "rbac.authorization.k8s.io", "clusterrolebindings", "cluster-logging-operator")).objects(json!({"metadata": {"name": "cluster-logging-operator"}, "roleRef": {"kind": "ClusterRole", "name": "cluster-logging-operator"}}), Value::Null).by(ADMIN.0, ADMIN.1)),
        t(Olm, hs_src, Case::new("OLM replaces the Logging operator's ClusterRoleBinding on an upgrade", Allow, ("DELETE", "rbac.authorization.k8s.io", "clusterrolebindings", "cluster-logging-operator")).objects(Value::Null, json!({"metadata": {"name": "cluster-logging-operator"}, "roleRef": {"kind": "ClusterRole", "name": "cluster-logging-operator"}, "subjects": [{"kind": "ServiceAccount", "name": "cluster-logging-operator", "namespace": "openshift-logging"}]})).by(ADMIN.0, ADMIN.1)),
        t(Acm, "stolostron/hypershift-addon-operator (external-managed-kubeconfig from the HostedCluster's admin kubeconfig) and the governance addons' hosted mode, which write with it", Case::new("ACM's policy controller prunes a backplane ClusterRole", Allow, ("DELETE", "rbac.authorization.k8s.io", "clusterroles", "backplane-srep-admins-project")).objects(Value::Null, json!({"metadata": {"name": "backplane-srep-admins-project"}})).by(ADMIN.0, ADMIN.1)),
        // The customer.
        t(Customer, "OpenShift's documentation: installing the Logging operator (create openshift-logging, an OperatorGroup, a Subscription)", Case::new("the customer creates openshift-logging", Allow, ("CREATE", "", "namespaces", "openshift-logging")).objects(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "openshift-logging", "labels": {"openshift.io/cluster-monitoring": "true"}}}), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "OpenShift's documentation: installing the Logging operator", Case::new("the customer subscribes to cluster-logging", Allow, ("CREATE", "operators.coreos.com", "subscriptions", "cluster-logging")).namespaced("openshift-logging").objects(json!({"metadata": {"name": "cluster-logging"}, "spec": {"name": "cluster-logging", "channel": "stable-6.2"}}), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "OpenShift's documentation: installing the Loki operator", Case::new("the customer creates openshift-operators-redhat", Allow, ("CREATE", "", "namespaces", "openshift-operators-redhat")).objects(ns("openshift-operators-redhat"), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "oc adm must-gather (generateName openshift-must-gather-, run-level 0)", Case::new("must-gather creates its namespace", Allow, ("CREATE", "", "namespaces", "")).objects(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "openshift-must-gather-k2x9q", "generateName": "openshift-must-gather-", "labels": {"openshift.io/run-level": "0"}}}), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "oc adm must-gather", Case::new("must-gather runs its pod", Allow, ("CREATE", "", "pods", "")).namespaced("openshift-must-gather-k2x9q").objects(pod("must-gather-x7k2p", "default"), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "oc adm must-gather: its ClusterRoleBinding, deleted when it ends (its shape: MCVW's clusterrolebinding tests)", Case::new("must-gather deletes its ClusterRoleBinding", Allow, ("DELETE", "rbac.authorization.k8s.io", "clusterrolebindings", "must-gather-k2x9q")).objects(Value::Null, json!({"metadata": {"name": "must-gather-k2x9q", "annotations": {"oc.openshift.io/command": "oc adm must-gather"}}, "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"}, "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "openshift-must-gather-k2x9q"}]})).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work: uninstalling the Logging operator", Case::new("the customer deletes the collector's ClusterRoleBinding", Allow, ("DELETE", "rbac.authorization.k8s.io", "clusterrolebindings", "logcollector")).objects(Value::Null, json!({"metadata": {"name": "logcollector"}, "roleRef": {"kind": "ClusterRole", "name": "collect-application-logs"}, "subjects": [{"kind": "ServiceAccount", "name": "logcollector", "namespace": "openshift-logging"}]})).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "OpenShift Dedicated's documentation: configuring custom domains for applications (a CustomDomain, by dedicated-admins or cluster-admins)", Case::new("the customer creates a CustomDomain", Allow, ("CREATE", "managed.openshift.io", "customdomains", "acme")).objects(json!({"apiVersion": "managed.openshift.io/v1alpha1", "kind": "CustomDomain", "metadata": {"name": "acme"}, "spec": {"domain": "apps.acme.example.com", "certificate": {"name": "acme-tls", "namespace": "acme-apps"}}}), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work", Case::new("the customer creates a team namespace", Allow, ("CREATE", "", "namespaces", "team-a")).objects(ns("team-a"), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work", Case::new("the customer deploys in it", Allow, ("CREATE", "apps", "deployments", "web")).namespaced("team-a").objects(workload("Deployment", "web", "default"), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work", Case::new("the customer binds a role there", Allow, ("CREATE", "rbac.authorization.k8s.io", "rolebindings", "deployer")).namespaced("team-a").objects(json!({"metadata": {"name": "deployer"}, "roleRef": {"kind": "Role", "name": "deployer"}}), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work", Case::new("the customer creates a LoadBalancer Service", Allow, ("CREATE", "", "services", "web")).namespaced("team-a").objects(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}), Value::Null).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work: uninstalling the Logging operator", Case::new("the customer deletes a service account in openshift-logging", Allow, ("DELETE", "", "serviceaccounts", "logcollector")).namespaced("openshift-logging").objects(Value::Null, json!({"metadata": {"name": "logcollector", "namespace": "openshift-logging"}})).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work", Case::new("the customer deletes a service account of a team namespace", Allow, ("DELETE", "", "serviceaccounts", "ci")).namespaced("team-a").objects(Value::Null, json!({"metadata": {"name": "ci", "namespace": "team-a"}})).by(CUSTOMER.0, CUSTOMER.1)),
        t(Customer, "a customer's everyday work", Case::new("the customer deletes a ClusterRoleBinding of their own", Allow, ("DELETE", "rbac.authorization.k8s.io", "clusterrolebindings", "team-a-viewers")).objects(Value::Null, json!({"metadata": {"name": "team-a-viewers"}})).by(CUSTOMER.0, CUSTOMER.1)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sender_has_traffic_and_every_entry_names_its_source() {
        let c = corpus();
        for s in [
            Sender::Kubelet,
            Sender::ControllerManager,
            Sender::Scheduler,
            Sender::HyperShift,
            Sender::PlatformOperator,
            Sender::Olm,
            Sender::Acm,
            Sender::Customer,
        ] {
            assert!(c.iter().any(|t| t.sender == s), "{s:?}");
        }
        assert!(
            c.iter()
                .all(|t| !t.source.is_empty() && t.case.want == Want::Allow)
        );
    }
}
