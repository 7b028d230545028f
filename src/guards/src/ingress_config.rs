//! The cluster ingress config carries the cluster's apps domain and load balancer choice; the
//! managed service sets them. Its spec may not change and it may not be deleted.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want, spec_obj};
use super::{CelForm, Guard, cel, unchanged};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct IngressConfig;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "ingress-config.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/ingress-config",
    rules: &[rule(
        &["UPDATE", "DELETE"],
        &["config.openshift.io"],
        &["ingresses"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

impl Guard for IngressConfig {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if req.resource.group != "config.openshift.io" || req.resource.resource != "ingresses" {
            return Decision::allow();
        }
        let name = req.stored_name();
        if req.operation == "UPDATE" && unchanged(req, |o| o["spec"].clone()) {
            return Decision::allow();
        }
        let verb = if req.operation == "DELETE" {
            "deleting"
        } else {
            "changing the spec of"
        };
        Decision::deny(denial::fill(
            denial::INGRESS_CONFIG,
            &[("verb", verb), ("name", name)],
        ))
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        Some(CelForm {
            expression: format!(
                "!({} && {}) || (request.operation == 'UPDATE' && object != null && oldObject != null \
                 && has(object.spec) == has(oldObject.spec) && (!has(object.spec) || object.spec == oldObject.spec))",
                cel::group_is("config.openshift.io"),
                cel::resource_is("ingresses")
            ),
            message: cel::message(
                denial::INGRESS_CONFIG,
                &[
                    ("verb", &cel::verb("deleting", "changing the spec of")),
                    ("name", cel::STORED_NAME),
                ],
            ),
        })
    }

    /// Deleting the cluster's ingress configuration, `cluster`.
    fn canary(&self, _: &Settings) -> Option<Canary> {
        Some(Canary::delete(
            ("config.openshift.io", "v1", "ingresses"),
            "cluster",
        ))
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let ing = |op| (op, "config.openshift.io", "ingresses", "cluster");
        let domain = |d: &str| spec_obj(json!({"domain": d}), json!({}));
        vec![
            Case::new("change the spec", Deny, ing("UPDATE")).objects(domain("b"), domain("a")),
            Case::new("add a spec", Deny, ing("UPDATE"))
                .objects(domain("b"), spec_obj(Value::Null, json!({}))),
            Case::new("delete", Deny, ing("DELETE")).objects(Value::Null, domain("a")),
            Case::new(
                "a collection delete",
                Deny,
                ("DELETE", "config.openshift.io", "ingresses", ""),
            )
            .objects(Value::Null, domain("a")),
            Case::new("create", Deny, ing("CREATE")).objects(domain("a"), Value::Null),
            Case::new("relabel, spec unchanged", Allow, ing("UPDATE")).objects(
                spec_obj(json!({"domain": "a"}), json!({"x": "y"})),
                domain("a"),
            ),
            Case::new("the status changes, the spec does not", Allow, ing("UPDATE")).objects(
                json!({"metadata": {"name": "cluster"}, "spec": {"domain": "a"}, "status": {"defaultPlacement": "Workers"}}),
                json!({"metadata": {"name": "cluster"}, "spec": {"domain": "a"}, "status": {}}),
            ),
            Case::new("no spec before or after", Allow, ing("UPDATE")).objects(
                spec_obj(Value::Null, json!({"x": "y"})),
                spec_obj(Value::Null, json!({})),
            ),
            Case::new("an exempt user by prefix", Allow, ing("DELETE"))
                .objects(Value::Null, domain("a"))
                .by("system:serviceaccount:openshift-ingress:router", &[]),
            // MCVW's cases (pkg/webhooks/ingressconfig/ingressconfig_test.go judge the user
            // alone, MCVW denying any write by the unprivileged): a change of the domain here.
            Case::new("MCVW: SRE's backplane group", Allow, ing("UPDATE"))
                .objects(domain("b"), domain("a"))
                .by("", &["system:serviceaccounts:openshift-backplane-srep"]),
            Case::new("MCVW: system:admin", Allow, ing("UPDATE"))
                .objects(domain("b"), domain("a"))
                .by("system:admin", &[]),
            Case::new("MCVW: an unprivileged user", Deny, ing("UPDATE"))
                .objects(domain("b"), domain("a"))
                .by("", &[]),
        ]
    }
}
