//! Service accounts of some namespaces are exempt (the platform operators' class takes in
//! `system:serviceaccount:openshift-*`): a hosted cluster-admin who creates `openshift-x`, a
//! service account there and a token for it holds an exempt identity. Only an exempt identity
//! may create a namespace whose name is reserved so, or a service account, a token or a
//! service-account-token Secret in one.
//!
//! Two kinds of request in those namespaces are the cluster's own and pass:
//! - A kubelet's token for a pod bound to its node (`system:node:<name>` in `system:nodes`,
//!   `boundObjectRef` of kind Pod): every pod's projected token, at start and before expiry.
//!   The API server's `NodeRestriction` plugin refuses a node a token for any pod not bound to
//!   it, and the Node authorizer one for a service account no pod of its uses.
//! - Anything in a customer namespace (`admission.customerNamespaces`, `openshift-logging`):
//!   its service accounts are no class's, so nothing there is exempt.
//!
//! Running a workload in a reserved namespace under an exempt service account is the
//! `identity-workloads` guard's; a cluster-admin's impersonation no admission control sees
//! (docs/security.md).

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want};
use super::{CelForm, Guard, Scope, cel, matches};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::identities::{NODE_USER_PREFIX, NODES_GROUP, is_node, sa_namespaces};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct IdentityNamespaces;

pub(crate) static ROW: BuiltinRow = BuiltinRow {
    name: "identity-namespaces.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/identity-namespaces",
    rules: &[rule(
        &["CREATE"],
        &[""],
        &[
            "namespaces",
            "serviceaccounts",
            "serviceaccounts/token",
            "secrets",
        ],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

/// The namespaces whose names confer an exemption: the exempt namespaces, and the namespaces
/// of the exempt service-account users and groups, as exact names or prefixes ending in '*'.
/// The customer namespaces are taken out where the names are judged (`is_reserved`).
pub(crate) fn reserved_namespaces(s: &Settings) -> Vec<String> {
    let mut out: Vec<String> = s.exempt_namespaces.to_vec();
    out.extend(sa_namespaces(&s.exempt_users, &s.exempt_groups));
    out.sort();
    out.dedup();
    out
}

pub(crate) fn is_reserved(s: &Settings, reserved: &[String], ns: &str) -> bool {
    matches(reserved, ns) && !matches(&s.customer_namespaces, ns)
}

/// `is_reserved` in CEL over `value`; `None` when nothing is reserved.
pub(crate) fn is_reserved_cel(s: &Settings, reserved: &[String], value: &str) -> Option<String> {
    cel::matches_any_except(value, reserved, &s.customer_namespaces)
}

/// A kubelet's request for the token of a pod bound to it (see the module's comment).
fn is_kubelet_pod_token(req: &Request) -> bool {
    is_node(&req.user_info.username, &req.user_info.groups)
        && req
            .object()
            .is_some_and(|o| o["spec"]["boundObjectRef"]["kind"] == "Pod")
}

/// `is_kubelet_pod_token` in CEL.
fn kubelet_pod_token_cel() -> String {
    format!(
        "(request.userInfo.username.startsWith({}) && has(request.userInfo.groups) && {} in request.userInfo.groups && object != null && has(object.spec) && has(object.spec.boundObjectRef) && has(object.spec.boundObjectRef.kind) && object.spec.boundObjectRef.kind == 'Pod')",
        cel::string(NODE_USER_PREFIX),
        cel::string(NODES_GROUP)
    )
}

impl Guard for IdentityNamespaces {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if req.operation != "CREATE" || !req.resource.group.is_empty() {
            return Decision::allow();
        }
        let reserved = reserved_namespaces(s);
        let sub = req.sub_resource.as_deref().unwrap_or_default();
        let ns = req.namespace.clone().unwrap_or_default();
        let what = match (&*req.resource.resource, sub) {
            ("namespaces", "") => {
                // The namespace as it will be stored (a tenant's mutation may rename it).
                let Some(name) = req.names().find(|n| is_reserved(s, &reserved, n)) else {
                    return Decision::allow();
                };
                return Decision::deny(denial::fill(denial::IDENTITY_NAMESPACE, &[("name", name)]));
            }
            ("serviceaccounts", "") => "creating a service account",
            ("serviceaccounts", "token") if is_kubelet_pod_token(req) => return Decision::allow(),
            ("serviceaccounts", "token") => "requesting a service account token",
            ("secrets", "")
                if req.object().and_then(|o| o["type"].as_str()) == Some(SA_TOKEN_TYPE) =>
            {
                "creating a service account token Secret"
            }
            _ => return Decision::allow(),
        };
        if !is_reserved(s, &reserved, &ns) {
            return Decision::allow();
        }
        Decision::deny(denial::fill(
            denial::IDENTITY_TOKEN,
            &[("what", what), ("namespace", &ns)],
        ))
    }

    fn cel(&self, a: &Settings) -> Option<CelForm> {
        let reserved = reserved_namespaces(a);
        let name_reserved = is_reserved_cel(a, &reserved, "n")
            .map(|m| format!("{}.exists(n, {m})", cel::NAMES))
            .unwrap_or_else(|| "false".into());
        let ns_reserved = is_reserved_cel(a, &reserved, "request.namespace")
            .map(|m| format!("(has(request.namespace) && {m})"))
            .unwrap_or_else(|| "false".into());
        let sub = "(has(request.subResource) ? request.subResource : '')";
        let kubelet_pod_token = kubelet_pod_token_cel();
        let sa_secret = format!(
            "(object != null && has(object.type) && object.type == {})",
            cel::string(SA_TOKEN_TYPE)
        );
        let what = format!(
            "{sub} == 'token' ? 'requesting a service account token' : (request.resource.resource == 'secrets' ? 'creating a service account token Secret' : 'creating a service account')"
        );
        Some(CelForm {
            expression: format!(
                "request.operation != 'CREATE' || request.resource.group != '' \
                 || (request.resource.resource == 'namespaces' && {sub} == '' ? !({name_reserved}) \
                 : (request.resource.resource == 'serviceaccounts' && {sub} == 'token' && {kubelet_pod_token}) ? true \
                 : ((request.resource.resource == 'serviceaccounts' && ({sub} == '' || {sub} == 'token')) \
                    || (request.resource.resource == 'secrets' && {sub} == '' && {sa_secret})) ? !{ns_reserved} : true)"
            ),
            message: format!(
                "request.resource.resource == 'namespaces' ? ({}) : ({})",
                cel::message(denial::IDENTITY_NAMESPACE, &[("name", cel::STORED_NAME)]),
                cel::message(
                    denial::IDENTITY_TOKEN,
                    &[("what", &what), ("namespace", "request.namespace")]
                ),
            ),
        })
    }

    /// Creating a namespace under the first reserved prefix (`openshift-hcp-fleet-canary` by
    /// default).
    fn canary(&self, a: &Settings) -> Option<Canary> {
        let reserved = reserved_namespaces(a);
        let name = reserved.iter().find_map(|p| {
            let n = format!("{}hcp-fleet-canary", p.strip_suffix('*')?);
            (hcp_fleet_model::names::validate_dns_name(&n).is_ok() && !n.contains('.')).then_some(n)
        })?;
        Some(Canary::create(
            ("", "v1", "Namespace", "namespaces"),
            &name,
            json!({}),
        ))
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let ns_obj = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        let create_ns = |name| ("CREATE", "", "namespaces", name);
        let sa = |name| ("CREATE", "", "serviceaccounts", name);
        let secret = |name| ("CREATE", "", "secrets", name);
        let token_secret = json!({"metadata": {"name": "t", "annotations": {"kubernetes.io/service-account.name": "default"}}, "type": SA_TOKEN_TYPE});
        let plain_secret = json!({"metadata": {"name": "t"}, "type": "Opaque"});
        let kubelet_token = |pod: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3607, "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": "0b7d2b1a-1c9e-4d4a-9f3e-7d1f9b2c6a10"}}});
        vec![
            Case::new("create openshift-x", Deny, create_ns("openshift-x")).objects(ns_obj("openshift-x", json!({})), Value::Null),
            Case::new("create openshift-x labelled as a control-plane namespace", Deny, create_ns("openshift-x")).objects(ns_obj("openshift-x", json!({"openshift.io/run-level": "0"})), Value::Null),
            Case::new("create kube-x", Deny, create_ns("kube-x")).objects(ns_obj("kube-x", json!({})), Value::Null),
            Case::new("create hypershift (an exempt service account's namespace)", Deny, create_ns("hypershift")).objects(ns_obj("hypershift", json!({})), Value::Null),
            Case::new("create openshift-… by generateName", Deny, create_ns("")).objects(ns_obj("openshift-k2x9q", json!({})), Value::Null),
            Case::new("create a team namespace", Allow, create_ns("team-a")).objects(ns_obj("team-a", json!({})), Value::Null),
            Case::new("create a namespace the tenant's mutation renamed to openshift-…", Deny, create_ns("team-a")).objects(ns_obj("openshift-evil", json!({})), Value::Null),
            Case::new("create a namespace that only contains a reserved prefix", Allow, create_ns("my-openshift-x")).objects(ns_obj("my-openshift-x", json!({})), Value::Null),
            Case::new("a service account in openshift-x", Deny, sa("bot")).namespaced("openshift-x").objects(json!({"metadata": {"name": "bot"}}), Value::Null),
            Case::new("a service account in kube-system", Deny, sa("bot")).namespaced("kube-system").objects(json!({"metadata": {"name": "bot"}}), Value::Null),
            Case::new("a token for a service account in openshift-monitoring", Deny, sa("prometheus-k8s")).subresource("token").namespaced("openshift-monitoring").objects(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": []}}), Value::Null),
            Case::new("a service-account-token Secret in openshift-x", Deny, secret("t")).namespaced("openshift-x").objects(token_secret.clone(), Value::Null),
            Case::new("a service account in a team namespace", Allow, sa("bot")).namespaced("team-a").objects(json!({"metadata": {"name": "bot"}}), Value::Null),
            Case::new("a token in a team namespace", Allow, sa("bot")).subresource("token").namespaced("team-a").objects(json!({"spec": {}}), Value::Null),
            Case::new("a service-account-token Secret in a team namespace", Allow, secret("t")).namespaced("team-a").objects(token_secret, Value::Null),
            Case::new("an ordinary Secret in openshift-x", Allow, secret("t")).namespaced("openshift-x").objects(plain_secret, Value::Null),
            Case::new("an exempt service account mints one in its own namespaces", Allow, sa("bot")).namespaced("openshift-x").objects(json!({"metadata": {"name": "bot"}}), Value::Null).by("system:serviceaccount:openshift-x:operator", &["system:serviceaccounts"]),
            Case::new("an exempt group creates openshift-x", Allow, create_ns("openshift-x")).objects(ns_obj("openshift-x", json!({})), Value::Null).by("sre", &["osd-sre-admins"]),
            // The kubelet's request for a pod's projected token (pkg/kubelet/token/token_manager.go
            // asks for it when the pod starts and again at 80% of its life; the ServiceAccount
            // admission plugin's projected volume sets expirationSeconds 3607).
            Case::new("a kubelet's token for a pod bound to its node in openshift-dns", Allow, sa("dns")).subresource("token").namespaced("openshift-dns").objects(kubelet_token("dns-default-x2v7q"), Value::Null).by("system:node:worker-0", &["system:nodes", "system:authenticated"]),
            Case::new("a kubelet's token for a pod in kube-system", Allow, sa("kube-proxy")).subresource("token").namespaced("kube-system").objects(kubelet_token("kube-proxy-abcde"), Value::Null).by("system:node:worker-1", &["system:nodes", "system:authenticated"]),
            Case::new("a token bound to a pod, asked by someone not a node", Deny, sa("dns")).subresource("token").namespaced("openshift-dns").objects(kubelet_token("dns-default-x2v7q"), Value::Null).by("alice", &["system:authenticated"]),
            Case::new("a node's name without the nodes group", Deny, sa("dns")).subresource("token").namespaced("openshift-dns").objects(kubelet_token("dns-default-x2v7q"), Value::Null).by("system:node:worker-0", &["system:authenticated"]),
            Case::new("a node's token bound to a Secret, not a pod", Deny, sa("dns")).subresource("token").namespaced("openshift-dns").objects(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": [], "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": "s"}}}), Value::Null).by("system:node:worker-0", &["system:nodes", "system:authenticated"]),
            Case::new("a node's unbound token", Deny, sa("dns")).subresource("token").namespaced("openshift-dns").objects(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": []}}), Value::Null).by("system:node:worker-0", &["system:nodes", "system:authenticated"]),
            // A customer's namespace for Red Hat's layered products (admission.customerNamespaces).
            Case::new("a customer creates openshift-logging for the Logging operator", Allow, create_ns("openshift-logging")).objects(ns_obj("openshift-logging", json!({"openshift.io/cluster-monitoring": "true"})), Value::Null).by("customer", &["cluster-admins", "system:authenticated"]),
            Case::new("a customer creates openshift-operators-redhat", Allow, create_ns("openshift-operators-redhat")).objects(ns_obj("openshift-operators-redhat", json!({})), Value::Null).by("customer", &["dedicated-admins", "system:authenticated"]),
            Case::new("a customer's service account in openshift-logging", Allow, sa("cluster-logging-operator")).namespaced("openshift-logging").objects(json!({"metadata": {"name": "cluster-logging-operator"}}), Value::Null).by("customer", &["system:authenticated"]),
            Case::new("a token in openshift-logging", Allow, sa("collector")).subresource("token").namespaced("openshift-logging").objects(json!({"spec": {}}), Value::Null),
            Case::new("a namespace that only starts like a customer one", Deny, create_ns("openshift-logging-x")).objects(ns_obj("openshift-logging-x", json!({})), Value::Null),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_namespaces_come_from_every_kind_of_exemption() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let s = Settings {
            exempt_namespaces: v(&["kube-*", "default"]),
            exempt_users: v(&[
                "system:admin",
                "system:serviceaccount:hypershift:*",
                "system:serviceaccount:openshift-*",
                "system:serviceaccount:ops:deployer",
            ]),
            exempt_groups: v(&["system:masters", "system:serviceaccounts:ci"]),
            customer_namespaces: v(&["openshift-logging"]),
            ..Default::default()
        };
        let got = reserved_namespaces(&s);
        assert_eq!(
            got,
            v(&[
                "ci",
                "default",
                "hypershift",
                "kube-*",
                "openshift-*",
                "ops"
            ])
        );
        assert!(is_reserved(&s, &got, "openshift-dns"));
        assert!(!is_reserved(&s, &got, "openshift-logging"));
        assert!(is_reserved(&s, &got, "openshift-logging-x"));
    }
}
