//! Service accounts of some namespaces are exempt (`system:serviceaccount:openshift-*` and
//! the like in `admission.exemptUsers`), and requests in the exempt namespaces are not judged:
//! a hosted cluster-admin who creates `openshift-x`, a service account there and a token for
//! it holds an exempt identity. Only an exempt identity may create a namespace whose name is
//! reserved so, or a service account, a token or a service-account-token Secret in one.
//!
//! Left open, and said in docs/security.md: running a pod in an existing reserved namespace
//! under a service account that is already there, and a cluster-admin's impersonation, which
//! no admission control sees.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want};
use super::{CelForm, Guard, Scope, cel, matches};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
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
/// of the exempt service-account users and groups (`system:serviceaccount:<ns>:…`, a prefix
/// `system:serviceaccount:<prefix>*`, `system:serviceaccounts:<ns>`), as exact names or
/// prefixes ending in '*'.
pub(crate) fn reserved_namespaces(
    exempt_namespaces: &[String],
    exempt_users: &[String],
    exempt_groups: &[String],
) -> Vec<String> {
    let mut out: Vec<String> = exempt_namespaces.to_vec();
    for u in exempt_users {
        let Some(rest) = u.strip_prefix("system:serviceaccount:") else {
            continue;
        };
        match rest.split_once(':') {
            Some((ns, _)) if !ns.is_empty() && !ns.contains('*') => out.push(ns.to_string()),
            Some(_) => {}
            None if rest.ends_with('*') && rest.len() > 1 => out.push(rest.to_string()),
            None => {}
        }
    }
    for g in exempt_groups {
        if let Some(ns) = g
            .strip_prefix("system:serviceaccounts:")
            .filter(|ns| !ns.is_empty())
        {
            out.push(ns.to_string());
        }
    }
    out.sort();
    out.dedup();
    out
}

fn reserved(a: &Settings) -> Vec<String> {
    reserved_namespaces(&a.exempt_namespaces, &a.exempt_users, &a.exempt_groups)
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
        let reserved = reserved(s);
        let sub = req.sub_resource.as_deref().unwrap_or_default();
        let ns = req.namespace.clone().unwrap_or_default();
        let what = match (req.resource.resource.as_str(), sub) {
            ("namespaces", "") => {
                // The namespace as it will be stored (a tenant's mutation may rename it).
                let Some(name) = req.names().find(|n| matches(&reserved, n)) else {
                    return Decision::allow();
                };
                return Decision::deny(denial::fill(denial::IDENTITY_NAMESPACE, &[("name", name)]));
            }
            ("serviceaccounts", "") => "creating a service account",
            ("serviceaccounts", "token") => "requesting a service account token",
            ("secrets", "")
                if req.object.as_ref().and_then(|o| o["type"].as_str()) == Some(SA_TOKEN_TYPE) =>
            {
                "creating a service account token Secret"
            }
            _ => return Decision::allow(),
        };
        if !matches(&reserved, &ns) {
            return Decision::allow();
        }
        Decision::deny(denial::fill(
            denial::IDENTITY_TOKEN,
            &[("what", what), ("namespace", &ns)],
        ))
    }

    fn cel(&self, a: &Settings) -> Option<CelForm> {
        let reserved = reserved_namespaces(&a.exempt_namespaces, &a.exempt_users, &a.exempt_groups);
        let name_reserved = cel::any_name_matches(&reserved).unwrap_or_else(|| "false".into());
        let ns_reserved = cel::matches_any("request.namespace", &reserved)
            .map(|m| format!("(has(request.namespace) && ({m}))"))
            .unwrap_or_else(|| "false".into());
        let sub = "(has(request.subResource) ? request.subResource : '')";
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
        let reserved = reserved_namespaces(&a.exempt_namespaces, &a.exempt_users, &a.exempt_groups);
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
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_namespaces_come_from_every_kind_of_exemption() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = reserved_namespaces(
            &v(&["kube-*", "default"]),
            &v(&[
                "system:admin",
                "system:serviceaccount:hypershift:*",
                "system:serviceaccount:openshift-*",
                "system:serviceaccount:ops:deployer",
                "system:serviceaccount:*",
                "system:serviceaccount:odd*:x",
            ]),
            &v(&["system:masters", "system:serviceaccounts:ci"]),
        );
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
    }
}
