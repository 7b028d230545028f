//! The exempt Groups are exempt by name, and OpenShift's Group objects (`user.openshift.io`)
//! are what puts a user in one: a hosted cluster-admin who may write them could add themself
//! to `osd-sre-admins` and pass every guard. Only an exempt identity may create, change or
//! delete a Group named in `admission.exemptGroups`.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want};
use super::{CelForm, Guard, Scope, cel};
use crate::admission::review::{Decision, Request};
use crate::catalogue::{BuiltinRow, Mode, WebhookKind, denial, rule};

pub(crate) struct IdentityGroups;

pub static ROW: BuiltinRow = BuiltinRow {
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

/// The name of the object a request is about: on a create with `generateName` the request's
/// name is empty and the object's carries the generated one.
pub(crate) fn object_name(req: &Request) -> String {
    match req.name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => req
            .object
            .as_ref()
            .and_then(|o| o["metadata"]["name"].as_str())
            .unwrap_or_default()
            .to_string(),
    }
}

/// `object_name` in CEL.
pub(crate) const CEL_OBJECT_NAME: &str = "(request.name != '' ? request.name : (object != null && has(object.metadata) && has(object.metadata.name) ? object.metadata.name : ''))";

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
        let name = object_name(req);
        if !s.exempt_groups.contains(&name) {
            return Decision::allow();
        }
        Decision::deny(denial::fill(
            denial::IDENTITY_GROUP,
            &[("verb", verb(&req.operation)), ("name", &name)],
        ))
    }

    fn cel(&self, a: &Settings) -> Option<CelForm> {
        Some(CelForm {
            expression: format!(
                "!({} && {}) || !({CEL_OBJECT_NAME} in {})",
                cel::group_is("user.openshift.io"),
                cel::resource_is("groups"),
                cel::list(&a.exempt_groups)
            ),
            message: cel::message(
                denial::IDENTITY_GROUP,
                &[
                    (
                        "verb",
                        "request.operation == 'CREATE' ? 'creating' : (request.operation == 'DELETE' ? 'deleting' : 'changing')",
                    ),
                    ("name", CEL_OBJECT_NAME),
                ],
            ),
        })
    }

    /// Creating the first exempt group that can name a Group object.
    fn canary(&self, a: &Settings) -> Option<Canary> {
        let name = a
            .exempt_groups
            .iter()
            .find(|g| crate::names::validate_dns_name(g).is_ok())?;
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
