//! A pod runs with its service account's token, so whoever writes a pod (or a workload whose
//! pod template the controllers turn into pods) names the identity it runs as. A hosted
//! cluster-admin who creates a pod in `openshift-dns` under `dns`, or changes the image of a
//! platform DaemonSet there, holds an identity the guards exempt. Only an identity this guard
//! exempts (the controllers that make pods from templates, the control plane, the platform
//! operators, SRE) may create a pod or a pod template that runs as an exempt service account,
//! or change the pod spec of one; anyone may change what is not the pod spec (labels,
//! annotations, replicas).
//!
//! Left open, and said in docs/security.md: `exec` into a running platform pod and reading a
//! legacy token Secret, which no admission control sees as a write.

use serde_json::{Value, json};

use super::Settings;
use super::case::{Case, Want};
use super::{CelForm, Guard, Scope, cel};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::identities::user_matches_cel;
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct IdentityWorkloads;

pub(crate) static ROW: BuiltinRow = BuiltinRow {
    name: "identity-workloads.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/identity-workloads",
    rules: &[
        rule(
            &["CREATE", "UPDATE"],
            &[""],
            &["pods", "pods/ephemeralcontainers", "replicationcontrollers"],
        ),
        rule(
            &["CREATE", "UPDATE"],
            &["apps"],
            &["deployments", "daemonsets", "statefulsets", "replicasets"],
        ),
        rule(&["CREATE", "UPDATE"], &["batch"], &["jobs", "cronjobs"]),
        rule(
            &["CREATE", "UPDATE"],
            &["apps.openshift.io"],
            &["deploymentconfigs"],
        ),
    ],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// Where a resource keeps its pod spec, as a path of fields.
fn spec_path(resource: &str) -> &'static [&'static str] {
    match resource {
        "pods" => &["spec"],
        "cronjobs" => &["spec", "jobTemplate", "spec", "template", "spec"],
        _ => &["spec", "template", "spec"],
    }
}

fn pod_spec<'a>(obj: Option<&'a Value>, resource: &str) -> Option<&'a Value> {
    spec_path(resource).iter().try_fold(obj?, |v, f| v.get(*f))
}

/// The service account a pod spec runs as (`serviceAccountName`, the deprecated
/// `serviceAccount`, else `default`), as the ServiceAccount admission plugin reads it.
fn service_account(spec: Option<&Value>) -> String {
    ["serviceAccountName", "serviceAccount"]
        .iter()
        .find_map(|f| spec?.get(*f)?.as_str().filter(|s| !s.is_empty()))
        .unwrap_or("default")
        .to_string()
}

/// The user name and groups a token of `sa` in `ns` carries.
fn sa_identity(ns: &str, sa: &str) -> (String, Vec<String>) {
    (
        format!("system:serviceaccount:{ns}:{sa}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
    )
}

/// `obj.<path>.<field>` in CEL, with every step asked for first.
fn cel_has_chain(obj: &str, path: &[&str]) -> String {
    let mut out = Vec::new();
    let mut at = obj.to_string();
    for f in path {
        out.push(format!("has({at}.{f})"));
        at = format!("{at}.{f}");
    }
    out.join(" && ")
}

fn cel_path(obj: &str, path: &[&str]) -> String {
    std::iter::once(obj.to_string())
        .chain(path.iter().map(|f| f.to_string()))
        .collect::<Vec<_>>()
        .join(".")
}

/// For each resource kind's spec path, `f(path)`, chosen by `request.resource.resource`.
fn by_resource(f: impl Fn(&[&str]) -> String) -> String {
    format!(
        "(request.resource.resource == 'pods' ? ({}) : (request.resource.resource == 'cronjobs' ? ({}) : ({})))",
        f(spec_path("pods")),
        f(spec_path("cronjobs")),
        f(spec_path("deployments")),
    )
}

/// The service account's name in CEL (`service_account`).
fn cel_service_account() -> String {
    by_resource(|p| {
        let pick = |field: &str| {
            let mut path = p.to_vec();
            path.push(field);
            (cel_has_chain("object", &path), cel_path("object", &path))
        };
        let (has_name, name) = pick("serviceAccountName");
        let (has_old, old) = pick("serviceAccount");
        format!(
            "({has_name} && {name} != '') ? {name} : (({has_old} && {old} != '') ? {old} : 'default')"
        )
    })
}

/// The pod spec is the same before and after, in CEL (false on CREATE).
fn cel_spec_unchanged() -> String {
    by_resource(|p| {
        format!(
            "oldObject != null && ({}) && ({}) && {} == {}",
            cel_has_chain("object", p),
            cel_has_chain("oldObject", p),
            cel_path("object", p),
            cel_path("oldObject", p)
        )
    })
}

impl Guard for IdentityWorkloads {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if !matches!(&*req.operation, "CREATE" | "UPDATE") {
            return Decision::allow();
        }
        // The pod's status, its binding and the like change no pod spec.
        if !matches!(
            req.sub_resource.as_deref().unwrap_or_default(),
            "" | "ephemeralcontainers"
        ) {
            return Decision::allow();
        }
        let Some(ns) = req.namespace.as_deref().filter(|ns| !ns.is_empty()) else {
            return Decision::allow();
        };
        let resource = &*req.resource.resource;
        let spec = pod_spec(req.object(), resource);
        if req.operation == "UPDATE" && spec == pod_spec(req.old_object(), resource) {
            return Decision::allow();
        }
        let sa = service_account(spec);
        let (user, groups) = sa_identity(ns, &sa);
        if !s.exempts_anywhere(&user, &groups) {
            return Decision::allow();
        }
        Decision::deny(denial::fill(
            denial::IDENTITY_WORKLOAD,
            &[("sa", &sa), ("namespace", ns)],
        ))
    }

    fn cel(&self, s: &Settings) -> Option<CelForm> {
        let sa = cel_service_account();
        let user = format!("('system:serviceaccount:' + request.namespace + ':' + ({sa}))");
        let by_user = user_matches_cel(&user, &s.exempt_users, &s.customer_namespaces);
        let sa_groups = "['system:serviceaccounts', 'system:serviceaccounts:' + request.namespace, 'system:authenticated']";
        let by_group = (!s.exempt_groups.is_empty()).then(|| {
            format!(
                "{sa_groups}.exists(g, g in {})",
                cel::list(&s.exempt_groups)
            )
        });
        let exempt = match (by_user, by_group) {
            (Some(u), Some(g)) => format!("({u}) || ({g})"),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => "false".into(),
        };
        Some(CelForm {
            expression: format!(
                "!(request.operation in ['CREATE', 'UPDATE']) || !has(request.namespace) || request.namespace == '' \
                 || !((has(request.subResource) ? request.subResource : '') in ['', 'ephemeralcontainers']) \
                 || (request.operation == 'UPDATE' && ({})) || !({exempt})",
                cel_spec_unchanged()
            ),
            message: cel::message(
                denial::IDENTITY_WORKLOAD,
                &[("sa", &sa), ("namespace", "request.namespace")],
            ),
        })
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let pod = |name: &str, sa: Option<&str>, image: &str| {
            let mut spec = json!({"containers": [{"name": "c", "image": image}]});
            if let Some(sa) = sa {
                spec["serviceAccountName"] = json!(sa);
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
        };
        let templated = |kind: &str, name: &str, sa: &str, image: &str| json!({"kind": kind, "metadata": {"name": name}, "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": image}]}}}});
        let cronjob = |sa: &str| json!({"kind": "CronJob", "metadata": {"name": "cj"}, "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "x"}], "restartPolicy": "Never"}}}}}});
        let dns_image = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:dns";
        let mut relabelled = templated("DaemonSet", "dns-default", "dns", dns_image);
        relabelled["metadata"]["labels"] = json!({"team": "a"});
        let pods = |op, name| (op, "", "pods", name);
        let apps = |op, resource, name| (op, "apps", resource, name);
        // The controllers' identities with --use-service-account-credentials
        // (pkg/controller/*: each controller's client is named for its service account).
        let rs_controller = "system:serviceaccount:kube-system:replicaset-controller";
        let ds_controller = "system:serviceaccount:kube-system:daemon-set-controller";
        let sa_groups: &'static [&'static str] = &[
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated",
        ];
        vec![
            Case::new("a tenant's pod in openshift-dns as dns", Deny, pods("CREATE", "p")).namespaced("openshift-dns").objects(pod("p", Some("dns"), "evil"), Value::Null),
            Case::new("a tenant's pod in openshift-dns as default (no service account named)", Deny, pods("CREATE", "p")).namespaced("openshift-dns").objects(pod("p", None, "evil"), Value::Null),
            Case::new("a tenant's pod in kube-system", Deny, pods("CREATE", "p")).namespaced("kube-system").objects(pod("p", Some("kube-proxy"), "evil"), Value::Null),
            Case::new("a tenant's Deployment in openshift-monitoring", Deny, apps("CREATE", "deployments", "d")).namespaced("openshift-monitoring").objects(templated("Deployment", "d", "prometheus-k8s", "evil"), Value::Null),
            Case::new("a tenant's CronJob in openshift-monitoring", Deny, ("CREATE", "batch", "cronjobs", "cj")).namespaced("openshift-monitoring").objects(cronjob("prometheus-k8s"), Value::Null),
            Case::new("a tenant changes the image of the DNS DaemonSet", Deny, apps("UPDATE", "daemonsets", "dns-default")).namespaced("openshift-dns").objects(templated("DaemonSet", "dns-default", "dns", "evil"), templated("DaemonSet", "dns-default", "dns", dns_image)),
            Case::new("a tenant adds an ephemeral container to a DNS pod", Deny, pods("UPDATE", "dns-default-x")).subresource("ephemeralcontainers").namespaced("openshift-dns").objects(
                json!({"kind": "Pod", "metadata": {"name": "dns-default-x"}, "spec": {"serviceAccountName": "dns", "containers": [{"name": "dns", "image": dns_image}], "ephemeralContainers": [{"name": "e", "image": "evil"}]}}),
                json!({"kind": "Pod", "metadata": {"name": "dns-default-x"}, "spec": {"serviceAccountName": "dns", "containers": [{"name": "dns", "image": dns_image}]}})),
            Case::new("a tenant labels the DNS DaemonSet (its pod spec unchanged)", Allow, apps("UPDATE", "daemonsets", "dns-default")).namespaced("openshift-dns").objects(relabelled, templated("DaemonSet", "dns-default", "dns", dns_image)),
            Case::new("a tenant's Deployment in a team namespace", Allow, apps("CREATE", "deployments", "web")).namespaced("team-a").objects(templated("Deployment", "web", "default", "nginx"), Value::Null),
            Case::new("a tenant's pod in default as default (not an exempt identity)", Allow, pods("CREATE", "p")).namespaced("default").objects(pod("p", None, "busybox"), Value::Null),
            Case::new("OLM's Deployment of the Logging operator in openshift-logging (a customer namespace)", Allow, apps("CREATE", "deployments", "cluster-logging-operator")).namespaced("openshift-logging").objects(templated("Deployment", "cluster-logging-operator", "cluster-logging-operator", "registry.redhat.io/openshift-logging/cluster-logging-rhel9-operator"), Value::Null),
            Case::new("the must-gather pod in its openshift-must-gather-… namespace", Allow, pods("CREATE", "")).namespaced("openshift-must-gather-k2x9q").objects(pod("must-gather-abcde", None, "quay.io/openshift/must-gather"), Value::Null),
            Case::new("the replicaset controller makes a pod in openshift-dns-operator", Allow, pods("CREATE", "")).namespaced("openshift-dns-operator").objects(pod("dns-operator-5d9f-abcde", Some("dns-operator"), dns_image), Value::Null).by(rs_controller, sa_groups),
            Case::new("the daemonset controller makes a DNS pod", Allow, pods("CREATE", "")).namespaced("openshift-dns").objects(pod("dns-default-abcde", Some("dns"), dns_image), Value::Null).by(ds_controller, sa_groups),
            Case::new("the DNS operator writes its DaemonSet", Allow, apps("UPDATE", "daemonsets", "dns-default")).namespaced("openshift-dns").objects(templated("DaemonSet", "dns-default", "dns", "new"), templated("DaemonSet", "dns-default", "dns", dns_image)).by("system:serviceaccount:openshift-dns-operator:dns-operator", &["system:serviceaccounts", "system:serviceaccounts:openshift-dns-operator", "system:authenticated"]),
            Case::new("the cluster-version operator (system:admin) creates an operator's Deployment", Allow, apps("CREATE", "deployments", "dns-operator")).namespaced("openshift-dns-operator").objects(templated("Deployment", "dns-operator", "dns-operator", dns_image), Value::Null).by("system:admin", &["system:masters", "system:authenticated"]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_account_is_read_where_each_kind_keeps_its_pod_spec() {
        let o = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"serviceAccount": "old"}}}}}});
        assert_eq!(service_account(pod_spec(Some(&o), "cronjobs")), "old");
        let o = json!({"spec": {"serviceAccountName": "a", "serviceAccount": "b"}});
        assert_eq!(service_account(pod_spec(Some(&o), "pods")), "a");
        assert_eq!(
            service_account(pod_spec(Some(&o), "deployments")),
            "default"
        );
        assert_eq!(service_account(None), "default");
    }
}
