//! The API groups of the managed service's own operators are theirs: regular users may not
//! create, change or delete anything in them, wherever it lives (most of it lives in
//! `openshift-*` namespaces, so no namespace is exempt: its writers are, by class).

use serde_json::{Value, json};

use super::Settings;
use super::case::{Case, Want};
use super::{CelForm, Guard, Scope, cel};
use crate::catalogue::{BuiltinRow, MANAGED_API_GROUPS, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct ManagedGroups;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "managed-api-groups.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/managed-api-groups",
    rules: &[rule(
        &["CREATE", "UPDATE", "DELETE"],
        MANAGED_API_GROUPS,
        &["*"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

impl Guard for ManagedGroups {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if !MANAGED_API_GROUPS.contains(&req.resource.group.as_str()) {
            return Decision::allow();
        }
        Decision::deny(denial::fill(
            denial::MANAGED_GROUPS,
            &[
                ("resource", &req.resource.resource),
                ("group", &req.resource.group),
                ("operation", &req.operation.to_lowercase()),
            ],
        ))
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        Some(CelForm {
            expression: format!(
                "!(request.resource.group in {})",
                cel::list(MANAGED_API_GROUPS)
            ),
            message: cel::message(
                denial::MANAGED_GROUPS,
                &[
                    ("resource", "request.resource.resource"),
                    ("group", "request.resource.group"),
                    ("operation", "request.operation.lowerAscii()"),
                ],
            ),
        })
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let managed = MANAGED_API_GROUPS[0];
        vec![
            Case::new(
                "create in a managed group",
                Deny,
                ("CREATE", managed, "things", "x"),
            )
            .namespaced("team-a"),
            Case::new(
                "delete in another managed group",
                Deny,
                ("DELETE", MANAGED_API_GROUPS[1], "upgradeconfigs", "x"),
            )
            .namespaced("team-a"),
            Case::new(
                "update in a managed group",
                Deny,
                ("UPDATE", managed, "things", "x"),
            )
            .namespaced("team-a")
            .objects(
                json!({"metadata": {"name": "x"}, "spec": {"b": 1}}),
                json!({"metadata": {"name": "x"}, "spec": {"a": 1}}),
            ),
            Case::new(
                "a collection delete in a managed group",
                Deny,
                ("DELETE", MANAGED_API_GROUPS[1], "upgradeconfigs", ""),
            )
            .namespaced("team-a")
            .objects(Value::Null, json!({"metadata": {"name": "x"}})),
            Case::new(
                "another group",
                Allow,
                ("CREATE", "apps", "deployments", "x"),
            )
            .namespaced("team-a"),
            Case::new("the core group", Allow, ("CREATE", "", "configmaps", "x"))
                .namespaced("team-a"),
            // A regular user's write of a managed upgrade object where it lives: no namespace
            // exempts it (an exempt namespace used to).
            Case::new(
                "a regular user's UpgradeConfig in openshift-managed-upgrade-operator",
                Deny,
                ("UPDATE", MANAGED_API_GROUPS[1], "upgradeconfigs", "managed-upgrade-config"),
            )
            .namespaced("openshift-managed-upgrade-operator")
            .objects(
                json!({"metadata": {"name": "managed-upgrade-config"}, "spec": {"desired": {"version": "4.99.0"}}}),
                json!({"metadata": {"name": "managed-upgrade-config"}, "spec": {}}),
            ),
            Case::new("in default", Deny, ("CREATE", managed, "things", "x")).namespaced("default"),
            Case::new(
                "the managed upgrade operator writes its UpgradeConfig",
                Allow,
                ("UPDATE", MANAGED_API_GROUPS[1], "upgradeconfigs", "managed-upgrade-config"),
            )
            .namespaced("openshift-managed-upgrade-operator")
            .by(
                "system:serviceaccount:openshift-managed-upgrade-operator:managed-upgrade-operator",
                &["system:serviceaccounts", "system:serviceaccounts:openshift-managed-upgrade-operator", "system:authenticated"],
            ),
            Case::new("SRE", Allow, ("DELETE", managed, "things", "x"))
                .namespaced("openshift-monitoring")
                .by("sre-1", &["osd-sre-admins", "system:authenticated"]),
            Case::new(
                "a namespace that only contains an exempt prefix",
                Deny,
                ("CREATE", managed, "things", "x"),
            )
            .namespaced("my-openshift-x"),
            Case::new("cluster-scoped", Deny, ("CREATE", managed, "things", "x")),
        ]
    }
}
