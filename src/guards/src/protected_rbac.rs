//! The cluster's built-in ClusterRoles and ClusterRoleBindings (and the configured ones) may
//! not be deleted: the platform's own access and the dedicated-admin roles hang on them.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want};
use super::{CelForm, Guard, cel, matches};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct ProtectedRbac;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "protected-rbac.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/protected-rbac",
    rules: &[rule(
        &["DELETE"],
        &["rbac.authorization.k8s.io"],
        &["clusterroles", "clusterrolebindings"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

impl Guard for ProtectedRbac {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        let res = &*req.resource.resource;
        if req.operation != "DELETE"
            || req.resource.group != "rbac.authorization.k8s.io"
            || !(res == "clusterroles" || res == "clusterrolebindings")
        {
            return Decision::allow();
        }
        let Some(name) = req.names().find(|n| matches(&s.protected_cluster_roles, n)) else {
            return Decision::allow();
        };
        let kind = if res == "clusterroles" {
            "ClusterRole"
        } else {
            "ClusterRoleBinding"
        };
        Decision::deny(denial::fill(
            denial::PROTECTED_RBAC,
            &[("kind", kind), ("name", name)],
        ))
    }

    fn cel(&self, a: &Settings) -> Option<CelForm> {
        let protected =
            cel::any_name_matches(&a.protected_cluster_roles).unwrap_or_else(|| "false".into());
        Some(CelForm {
            expression: format!(
                "request.operation != 'DELETE' || !({}) || !(request.resource.resource in ['clusterroles', 'clusterrolebindings']) || !({protected})",
                cel::group_is("rbac.authorization.k8s.io")
            ),
            message: cel::message(
                denial::PROTECTED_RBAC,
                &[
                    (
                        "kind",
                        "request.resource.resource == 'clusterroles' ? 'ClusterRole' : 'ClusterRoleBinding'",
                    ),
                    ("name", cel::STORED_NAME),
                ],
            ),
        })
    }

    /// Deleting `cluster-admin` (or the first protected role named exactly), which every
    /// cluster has.
    fn canary(&self, a: &Settings) -> Option<Canary> {
        let name = if matches(&a.protected_cluster_roles, "cluster-admin") {
            "cluster-admin"
        } else {
            a.protected_cluster_roles
                .iter()
                .find(|r| !r.ends_with('*'))?
        };
        Some(Canary::delete(
            ("rbac.authorization.k8s.io", "v1", "clusterroles"),
            name,
        ))
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let rbac = |op, res, name| (op, "rbac.authorization.k8s.io", res, name);
        let mut cases = vec![
            Case::new(
                "delete a protected ClusterRole",
                Deny,
                rbac("DELETE", "clusterroles", "cluster-admin"),
            ),
            Case::new(
                "delete a protected ClusterRoleBinding",
                Deny,
                rbac("DELETE", "clusterrolebindings", "admin"),
            ),
            Case::new(
                "delete a ClusterRole matching a prefix",
                Deny,
                rbac("DELETE", "clusterroles", "system:controller:x"),
            ),
            Case::new(
                "delete an unprotected ClusterRole",
                Allow,
                rbac("DELETE", "clusterroles", "my-role"),
            ),
            // A collection delete reaches admission once per object, with no name in the
            // request: the object deleted is the old object.
            Case::new(
                "a collection delete reaching a protected ClusterRole",
                Deny,
                rbac("DELETE", "clusterroles", ""),
            )
            .objects(Value::Null, json!({"metadata": {"name": "cluster-admin"}})),
            Case::new(
                "a collection delete reaching a protected ClusterRoleBinding",
                Deny,
                rbac("DELETE", "clusterrolebindings", ""),
            )
            .objects(Value::Null, json!({"metadata": {"name": "admin"}})),
            Case::new(
                "a collection delete reaching an unprotected ClusterRole",
                Allow,
                rbac("DELETE", "clusterroles", ""),
            )
            .objects(Value::Null, json!({"metadata": {"name": "my-role"}})),
            Case::new(
                "update a protected ClusterRole",
                Allow,
                rbac("UPDATE", "clusterroles", "cluster-admin"),
            ),
            Case::new(
                "delete a namespaced Role of the same name",
                Allow,
                rbac("DELETE", "roles", "admin"),
            )
            .namespaced("team-a"),
            Case::new(
                "an exempt user",
                Allow,
                rbac("DELETE", "clusterroles", "cluster-admin"),
            )
            .by("system:admin", &[]),
            Case::new(
                "an exempt user by prefix",
                Allow,
                rbac("DELETE", "clusterroles", "cluster-admin"),
            )
            .by("system:serviceaccount:hypershift:operator", &[]),
            Case::new(
                "an exempt group",
                Allow,
                rbac("DELETE", "clusterroles", "cluster-admin"),
            )
            .by("bob", &["system:authenticated", "system:masters"]),
            Case::new(
                "a user with no groups",
                Deny,
                rbac("DELETE", "clusterroles", "cluster-admin"),
            )
            .by("carol", &[]),
        ];
        cases.extend(mcvw_cases());
        cases
    }
}

/// MCVW's cases (pkg/webhooks/clusterrole/clusterrole_test.go) with MCVW's verdicts, and a
/// regular user on a backplane role (MCVW's rule, which its tests do not try), but one:
/// MCVW lets the user `backplane-cluster-admin` through by name, which a customer's identity
/// provider can mint.
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let delete = |what, want, role: &'static str| {
        Case::new(what, want, ("DELETE", "rbac.authorization.k8s.io", "clusterroles", role))
            .objects(Value::Null, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role}}))
    };
    let authenticated: &'static [&'static str] = &["system:authenticated"];
    vec![
        delete(
            "MCVW: a regular user deletes cluster-admin",
            Deny,
            "cluster-admin",
        )
        .by("test-user", authenticated),
        delete(
            "MCVW: a user named cluster-admin deletes cluster-admin",
            Deny,
            "cluster-admin",
        )
        .by("cluster-admin", authenticated),
        delete(
            "MCVW: a customer's admin deletes cluster-admin",
            Deny,
            "cluster-admin",
        )
        .by("customer-user", &["system:authenticated", "customer-admin"]),
        delete(
            "a user named backplane-cluster-admin deletes cluster-admin (MCVW: allowed)",
            Deny,
            "cluster-admin",
        )
        .by("backplane-cluster-admin", authenticated),
        delete(
            "MCVW: SRE's backplane group deletes cluster-admin",
            Allow,
            "cluster-admin",
        )
        .by(
            "test-user",
            &[
                "system:authenticated",
                "system:serviceaccounts:openshift-backplane-srep",
            ],
        ),
        delete(
            "MCVW: a regular user deletes a role of their own",
            Allow,
            "some-custom-role",
        )
        .by("regular-user", authenticated),
        delete(
            "MCVW: the controller manager deletes cluster-admin",
            Allow,
            "cluster-admin",
        )
        .by("system:kube-controller-manager", authenticated),
        delete(
            "MCVW: system:admin deletes a backplane role",
            Allow,
            "backplane-lpsre-admins-project",
        )
        .by("system:admin", &["system:authenticated", "system:masters"]),
        // MCVW protects backplane's roles by their prefix; its tests try no one but
        // system:admin on one.
        delete(
            "a regular user deletes a backplane role",
            Deny,
            "backplane-lpsre-admins-project",
        )
        .by("test-user", authenticated),
        delete(
            "MCVW: system:admin deletes cluster-admin",
            Allow,
            "cluster-admin",
        )
        .by("system:admin", &["system:authenticated", "system:masters"]),
    ]
}
