//! The exempt Groups are exempt by name, and OpenShift's Group objects (`user.openshift.io`)
//! are what puts a user in one: a hosted cluster-admin who may write them could add themself
//! to `osd-sre-admins` and pass every guard. Only an exempt identity may create, change or
//! delete a Group named in `admission.exemptGroups`, or named as a service-account namespace's
//! group (`system:serviceaccounts:<ns>`), which only the API server gives.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want};
use super::identities::SA_GROUP_PREFIX;
use super::{CelForm, Guard, Scope, cel};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct IdentityGroups;

pub(crate) static ROW: BuiltinRow = BuiltinRow {
    name: "identity-groups.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/identity-groups",
    rules: &[rule(
        &["CREATE", "UPDATE", "DELETE"],
        &["user.openshift.io"],
        &["groups"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// A Group object of this name would put its members in an exempt group, or in a
/// service-account namespace's group (`identities::SA_GROUP_PREFIX`), which some guards trust
/// whether or not an exemption names it (SRE's and CEE's backplane sessions).
fn is_protected(s: &Settings, name: &str) -> bool {
    s.exempt_groups.iter().any(|g| g == name) || name.starts_with(SA_GROUP_PREFIX)
}

fn verb(op: &str) -> &'static str {
    match op {
        "CREATE" => "creating",
        "DELETE" => "deleting",
        _ => "changing",
    }
}

impl Guard for IdentityGroups {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if req.resource.group != "user.openshift.io" || req.resource.resource != "groups" {
            return Decision::allow();
        }
        // The Group as it will be stored: a tenant's mutation may rename it after the name
        // in the request was chosen, and a collection delete names none.
        let Some(name) = req.names().find(|n| is_protected(s, n)) else {
            return Decision::allow();
        };
        Decision::deny(denial::fill(
            denial::IDENTITY_GROUP,
            &[("verb", verb(&req.operation)), ("name", name)],
        ))
    }

    fn cel(&self, a: &Settings) -> Option<CelForm> {
        Some(CelForm {
            expression: format!(
                "!({} && {}) || !({}.exists(n, n in {} || n.startsWith({})))",
                cel::group_is("user.openshift.io"),
                cel::resource_is("groups"),
                cel::NAMES,
                cel::list(&a.exempt_groups),
                cel::string(SA_GROUP_PREFIX),
            ),
            message: cel::message(
                denial::IDENTITY_GROUP,
                &[
                    (
                        "verb",
                        "request.operation == 'CREATE' ? 'creating' : (request.operation == 'DELETE' ? 'deleting' : 'changing')",
                    ),
                    ("name", cel::STORED_NAME),
                ],
            ),
        })
    }

    /// Creating the first exempt group that can name a Group object.
    fn canary(&self, a: &Settings) -> Option<Canary> {
        let name = a
            .exempt_groups
            .iter()
            .find(|g| hcp_fleet_model::names::validate_dns_name(g).is_ok())?;
        Some(Canary::create(
            ("user.openshift.io", "v1", "Group", "groups"),
            name,
            json!({"users": []}),
        ))
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let group = |op, name| (op, "user.openshift.io", "groups", name);
        let obj = |name: &str, users: &[&str]| json!({"apiVersion": "user.openshift.io/v1", "kind": "Group", "metadata": {"name": name}, "users": users});
        vec![
            Case::new(
                "join an exempt Group",
                Deny,
                group("UPDATE", "osd-sre-admins"),
            )
            .objects(
                obj("osd-sre-admins", &["sre", "alice"]),
                obj("osd-sre-admins", &["sre"]),
            ),
            Case::new(
                "create an exempt Group",
                Deny,
                group("CREATE", "osd-sre-cluster-admins"),
            )
            .objects(obj("osd-sre-cluster-admins", &["alice"]), Value::Null),
            Case::new(
                "create a Group named as CEE's backplane sessions' group",
                Deny,
                group("CREATE", "system:serviceaccounts:openshift-backplane-cee"),
            )
            .objects(
                obj("system:serviceaccounts:openshift-backplane-cee", &["alice"]),
                Value::Null,
            ),
            Case::new(
                "create an exempt Group by generateName",
                Deny,
                group("CREATE", ""),
            )
            .objects(obj("osd-sre-admins", &["alice"]), Value::Null),
            Case::new(
                "delete an exempt Group",
                Deny,
                group("DELETE", "osd-sre-admins"),
            )
            .objects(Value::Null, obj("osd-sre-admins", &["sre"])),
            // The tenant's own mutating policy or webhook renamed it after the name in the
            // request was chosen: what will be stored decides.
            Case::new(
                "create an exempt Group renamed by the tenant's mutation",
                Deny,
                group("CREATE", "team-a"),
            )
            .objects(obj("osd-sre-cluster-admins", &["alice"]), Value::Null),
            Case::new(
                "a collection delete reaching an exempt Group",
                Deny,
                group("DELETE", ""),
            )
            .objects(Value::Null, obj("osd-sre-admins", &["sre"])),
            Case::new(
                "a collection delete reaching a Group of one's own",
                Allow,
                group("DELETE", ""),
            )
            .objects(Value::Null, obj("team-a", &["alice"])),
            Case::new(
                "join an exempt Group as a service account",
                Deny,
                group("UPDATE", "osd-sre-admins"),
            )
            .objects(
                obj("osd-sre-admins", &["alice"]),
                obj("osd-sre-admins", &[]),
            )
            .by(
                "system:serviceaccount:team-a:bot",
                &["system:serviceaccounts"],
            ),
            Case::new("a Group of one's own", Allow, group("CREATE", "team-a"))
                .objects(obj("team-a", &["alice"]), Value::Null),
            Case::new(
                "a Group whose name only starts like an exempt one",
                Allow,
                group("UPDATE", "osd-sre-admins-2"),
            )
            .objects(
                obj("osd-sre-admins-2", &["alice"]),
                obj("osd-sre-admins-2", &[]),
            ),
            Case::new(
                "an exempt identity manages the Group",
                Allow,
                group("UPDATE", "osd-sre-admins"),
            )
            .objects(
                obj("osd-sre-admins", &["new-sre"]),
                obj("osd-sre-admins", &[]),
            )
            .by("sre", &["osd-sre-admins"]),
        ]
    }
}
