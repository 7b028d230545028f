//! The API groups of the managed service's own operators are theirs: regular users may not
//! create, change or delete anything in them, wherever it lives (most of it lives in
//! `openshift-*` namespaces, so no namespace is exempt: its writers are, by class).
//!
//! Two kinds are others' too, as MCVW's `regular-user-validation` has them: the customer's
//! admins (`admission.identityClasses.customerAdmins`) manage their CustomDomains, the
//! service's way to give their ingress a domain of their own, and Red Hat's support engineers
//! (CEE, through backplane: the group `system:serviceaccounts:openshift-backplane-cee`, which
//! only the API server gives) run MustGathers.

use serde_json::{Value, json};

use super::Settings;
use super::case::mcvw::{CEE, CLUSTER_ADMINS, DEDICATED_ADMINS, OAUTH, SRE, UNAUTHENTICATED};
use super::case::{Case, Want};
use super::identities::{IdentityClass, in_class, in_class_cel, in_groups_cel};
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

/// The API group of the kinds below.
const MANAGED: &str = "managed.openshift.io";
/// CEE's backplane sessions' group.
pub(crate) const CEE_GROUP: &str = "system:serviceaccounts:openshift-backplane-cee";

/// The request is one of the two kinds others may write, by them.
fn others_may(req: &Request, s: &Settings) -> bool {
    let u = &req.user_info;
    req.resource.group == MANAGED
        && match &*req.resource.resource {
            "customdomains" => in_class(s, IdentityClass::CustomerAdmins, &u.username, &u.groups),
            "mustgathers" => u.groups.iter().any(|g| g.as_ref() == CEE_GROUP),
            _ => false,
        }
}

/// `others_may` in CEL.
fn others_may_cel(s: &Settings) -> String {
    format!(
        "({} && ((request.resource.resource == 'customdomains' && {}) || (request.resource.resource == 'mustgathers' && {})))",
        cel::group_is(MANAGED),
        in_class_cel(s, IdentityClass::CustomerAdmins),
        in_groups_cel(&[CEE_GROUP]),
    )
}

impl Guard for ManagedGroups {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if !MANAGED_API_GROUPS.contains(&&*req.resource.group) || others_may(req, s) {
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

    fn cel(&self, s: &Settings) -> Option<CelForm> {
        Some(CelForm {
            expression: format!(
                "!(request.resource.group in {}) || {}",
                cel::list(MANAGED_API_GROUPS),
                others_may_cel(s),
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
        let mut cases = vec![
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
        ];
        cases.extend(mcvw_cases());
        cases.extend(mcvw_must_gather_cases());
        cases
    }
}

/// MCVW's CustomDomain cases (pkg/webhooks/regularuser/common/regularuser_test.go,
/// TestCustomDomains), MCVW's verdicts all.
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let domain = |op| (op, MANAGED, "customdomains", "apps2");
    let obj = json!({"apiVersion": "managed.openshift.io/v1alpha1", "kind": "CustomDomain", "metadata": {"name": "apps2"}, "spec": {"domain": "apps2.example.com"}});
    let with = |c: Case, op: &str| match op {
        "DELETE" => c.objects(Value::Null, obj.clone()),
        "UPDATE" => c.objects(obj.clone(), obj.clone()),
        _ => c.objects(obj.clone(), Value::Null),
    };
    let mut cases = vec![with(
        Case::new(
            "MCVW: an unauthenticated user creates a CustomDomain",
            Deny,
            domain("CREATE"),
        )
        .by("system:unauthenticated", UNAUTHENTICATED),
        "CREATE",
    )];
    for op in ["CREATE", "UPDATE", "DELETE"] {
        cases.push(with(
            Case::new(
                "MCVW: dedicated-admins write a CustomDomain",
                Allow,
                domain(op),
            )
            .by("dedi-admin", DEDICATED_ADMINS),
            op,
        ));
        cases.push(with(
            Case::new(
                "MCVW: cluster-admins write a CustomDomain",
                Allow,
                domain(op),
            )
            .by("clstr-admin", CLUSTER_ADMINS),
            op,
        ));
    }
    cases.extend([with(
        Case::new(
            "a regular user creates a CustomDomain",
            Deny,
            domain("CREATE"),
        )
        .by("my-name", OAUTH),
        "CREATE",
    )]);
    cases
}

/// MCVW's MustGather and SubjectPermission cases (TestMustGathers,
/// TestSubjectPermissionsClusterVersions), and the limits of the two exceptions.
fn mcvw_must_gather_cases() -> Vec<Case> {
    use Want::*;
    let gather = ("CREATE", MANAGED, "mustgathers", "mg");
    let permission = |op| (op, MANAGED, "subjectpermissions", "x");
    vec![
        Case::new(
            "MCVW: an unauthenticated user creates a MustGather",
            Deny,
            gather,
        )
        .namespaced("openshift-must-gather-operator")
        .by("system:unauthenticated", UNAUTHENTICATED),
        Case::new("MCVW: a regular user creates a MustGather", Deny, gather)
            .namespaced("openshift-must-gather-operator")
            .by("my-name", OAUTH),
        Case::new("MCVW: SRE creates a MustGather", Allow, gather)
            .namespaced("openshift-must-gather-operator")
            .by("my-name", SRE),
        Case::new("MCVW: CEE creates a MustGather", Allow, gather)
            .namespaced("openshift-must-gather-operator")
            .by("my-name", CEE),
        Case::new(
            "CEE creates anything else in a managed group",
            Deny,
            permission("CREATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .by("my-name", CEE),
        Case::new(
            "the customer's admins create anything else in a managed group",
            Deny,
            permission("CREATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .by("clstr-admin", CLUSTER_ADMINS),
        Case::new(
            "a user named kube:admin creates a SubjectPermission (MCVW: allowed)",
            Deny,
            permission("CREATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .by("kube:admin", OAUTH),
        Case::new(
            "MCVW: SRE creates a SubjectPermission",
            Allow,
            permission("CREATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .by("my-user", SRE),
        Case::new(
            "a user named backplane-cluster-admin creates a SubjectPermission (MCVW: allowed)",
            Deny,
            permission("CREATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .by("backplane-cluster-admin", OAUTH),
        Case::new(
            "MCVW: a regular user creates a SubjectPermission",
            Deny,
            permission("CREATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .by("my-user", OAUTH),
        Case::new(
            "MCVW: SRE updates a SubjectPermission's status",
            Allow,
            permission("UPDATE"),
        )
        .namespaced("openshift-rbac-permissions")
        .subresource("status")
        .by("my-user", SRE),
    ]
}
