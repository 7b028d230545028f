//! `TechPreviewNoUpgrade` on the cluster's FeatureGate cannot be undone and blocks upgrades.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::{Case, Want, spec_obj};
use super::{CelForm, Guard, cel};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct FeatureGate;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "featuregate.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/featuregate",
    rules: &[rule(
        &["CREATE", "UPDATE"],
        &["config.openshift.io"],
        &["featuregates"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

fn feature_set(o: Option<&Value>) -> Option<&str> {
    o.and_then(|o| o["spec"]["featureSet"].as_str())
}

impl Guard for FeatureGate {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if req.resource.group != "config.openshift.io" || req.resource.resource != "featuregates" {
            return Decision::allow();
        }
        let new = feature_set(req.object());
        // An update that leaves an existing featureSet alone is not the one to block.
        if new == Some("TechPreviewNoUpgrade") && feature_set(req.old_object()) != new {
            Decision::deny(denial::FEATURE_GATE)
        } else {
            Decision::allow()
        }
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        let tpnu = |obj: &str| {
            format!(
                "({obj} != null && {} && {obj}.spec.featureSet == 'TechPreviewNoUpgrade')",
                cel::has_spec(obj, "featureSet")
            )
        };
        Some(CelForm {
            expression: format!(
                "!({} && {}) || !{} || {}",
                cel::group_is("config.openshift.io"),
                cel::resource_is("featuregates"),
                tpnu("object"),
                tpnu("oldObject")
            ),
            message: cel::message(denial::FEATURE_GATE, &[]),
        })
    }

    /// Creating a FeatureGate with the forbidden feature set (any name: the create is what
    /// the guard judges).
    fn canary(&self, _: &Settings) -> Option<Canary> {
        Some(Canary::create(
            ("config.openshift.io", "v1", "FeatureGate", "featuregates"),
            "hcp-fleet-canary",
            json!({"spec": {"featureSet": "TechPreviewNoUpgrade"}}),
        ))
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let fg = |op| (op, "config.openshift.io", "featuregates", "cluster");
        let tpnu = |set: &str| spec_obj(json!({"featureSet": set}), json!({}));
        let none = || spec_obj(Value::Null, json!({}));
        let mut cases = vec![
            Case::new("create with TechPreviewNoUpgrade", Deny, fg("CREATE"))
                .objects(tpnu("TechPreviewNoUpgrade"), Value::Null),
            Case::new("switch on TechPreviewNoUpgrade", Deny, fg("UPDATE"))
                .objects(tpnu("TechPreviewNoUpgrade"), tpnu("")),
            Case::new("from no spec to TechPreviewNoUpgrade", Deny, fg("UPDATE"))
                .objects(tpnu("TechPreviewNoUpgrade"), none()),
            Case::new("leave TechPreviewNoUpgrade on", Allow, fg("UPDATE"))
                .objects(tpnu("TechPreviewNoUpgrade"), tpnu("TechPreviewNoUpgrade")),
            Case::new("switch it off", Allow, fg("UPDATE"))
                .objects(tpnu(""), tpnu("TechPreviewNoUpgrade")),
            Case::new("another feature set", Allow, fg("UPDATE"))
                .objects(tpnu("CustomNoUpgrade"), tpnu("")),
            Case::new("no spec at all", Allow, fg("UPDATE"))
                .objects(none(), spec_obj(Value::Null, json!({"a": "b"}))),
            Case::new("delete", Allow, fg("DELETE"))
                .objects(Value::Null, tpnu("TechPreviewNoUpgrade")),
            Case::new("an exempt group", Allow, fg("CREATE"))
                .objects(tpnu("TechPreviewNoUpgrade"), Value::Null)
                .by("sre", &["osd-sre-admins"]),
        ];
        cases.extend(mcvw_cases());
        cases
    }
}

/// MCVW's cases (pkg/webhooks/techpreviewnoupgrade/techpreviewnoupgrade_test.go), MCVW's
/// verdicts all: a FeatureGate named `test-subject`, with no old object on the update.
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let fg = |op| (op, "config.openshift.io", "featuregates", "test-subject");
    let obj = |set: &str| json!({"apiVersion": "config.openshift.io/v1", "kind": "FeatureGate", "metadata": {"name": "test-subject", "labels": {}}, "spec": {"featureSet": set}});
    let mut cases = Vec::new();
    for op in ["CREATE", "UPDATE"] {
        cases.push(
            Case::new(
                "MCVW: a feature set other than TechPreviewNoUpgrade",
                Allow,
                fg(op),
            )
            .objects(obj("AnythingOtherThanTechPreviewNoUpgrade"), Value::Null),
        );
        cases.push(
            Case::new("MCVW: TechPreviewNoUpgrade", Deny, fg(op))
                .objects(obj("TechPreviewNoUpgrade"), Value::Null),
        );
    }
    cases
}
