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
        let res = req.resource.resource.as_str();
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
        vec![
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
        ]
    }
}
