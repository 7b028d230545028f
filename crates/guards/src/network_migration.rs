//! Starting, changing or ending an SDN to OVN-Kubernetes migration on the network operator is
//! SRE's to run; everything else in the Network config passes.

use serde_json::{Value, json};

use super::Settings;
use super::case::{Case, Want, spec_obj};
use super::{CelForm, Guard, cel, unchanged};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct NetworkMigration;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "network-migration.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/network-migration",
    rules: &[rule(&["UPDATE"], &["operator.openshift.io"], &["networks"])],
    mode: Mode::Enforce,
    only_labelled: None,
};

impl Guard for NetworkMigration {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if req.resource.group != "operator.openshift.io" || req.resource.resource != "networks" {
            return Decision::allow();
        }
        if unchanged(req, |o| o["spec"]["migration"].clone()) {
            return Decision::allow();
        }
        Decision::deny(denial::NETWORK_MIGRATION)
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        let (new, old) = (
            cel::has_spec("object", "migration"),
            cel::has_spec("oldObject", "migration"),
        );
        Some(CelForm {
            expression: format!(
                "!({} && {}) || (object != null && oldObject != null && {new} == {old} \
                 && (!{new} || object.spec.migration == oldObject.spec.migration))",
                cel::group_is("operator.openshift.io"),
                cel::resource_is("networks")
            ),
            message: cel::message(denial::NETWORK_MIGRATION, &[]),
        })
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let net = |op| (op, "operator.openshift.io", "networks", "cluster");
        let mig = |t: &str| spec_obj(json!({"migration": {"networkType": t}}), json!({}));
        let empty = || spec_obj(json!({}), json!({}));
        vec![
            Case::new("start a migration", Deny, net("UPDATE"))
                .objects(mig("OVNKubernetes"), empty()),
            Case::new("change a migration", Deny, net("UPDATE")).objects(mig("A"), mig("B")),
            Case::new("end a migration", Deny, net("UPDATE")).objects(empty(), mig("B")),
            Case::new("delete", Deny, net("DELETE")).objects(Value::Null, empty()),
            Case::new("change something else", Allow, net("UPDATE")).objects(
                spec_obj(
                    json!({"mtu": 1400, "migration": {"networkType": "A"}}),
                    json!({}),
                ),
                spec_obj(
                    json!({"mtu": 1500, "migration": {"networkType": "A"}}),
                    json!({}),
                ),
            ),
            Case::new("no spec before or after", Allow, net("UPDATE")).objects(
                spec_obj(Value::Null, json!({"x": "y"})),
                spec_obj(Value::Null, json!({})),
            ),
        ]
    }
}
