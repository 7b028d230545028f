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
        let mut cases = vec![
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
        ];
        cases.extend(mcvw_cases());
        cases
    }
}

/// MCVW's cases (pkg/webhooks/networkoperator/networkoperator_test.go) with MCVW's verdicts,
/// but three: a create or delete of the operator's config is denied here (the object every
/// cluster has from its installation; a tenant who deletes it and creates it again with a
/// migration has started one), and a user named `backplane-cluster-admin` is not SRE.
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let net = |op| (op, "operator.openshift.io", "networks", "cluster");
    let obj = |spec: Value| json!({"apiVersion": "operator.openshift.io/v1", "kind": "Network", "metadata": {"name": "cluster"}, "spec": spec});
    let mig = |m: Value| obj(json!({"migration": m}));
    let ovn = || mig(json!({"networkType": "OVNKubernetes"}));
    let sdn = || mig(json!({"networkType": "OpenShiftSDN"}));
    let update = |what, want, new: Value, old: Value| {
        Case::new(what, want, net("UPDATE"))
            .objects(new, old)
            .by("kube:admin", &[])
    };
    let sa = |ns: &'static str, name: &'static str| -> (&'static str, &'static [&'static str]) {
        match (ns, name) {
            ("openshift-network-operator", _) => (
                "system:serviceaccount:openshift-network-operator:cluster-network-operator",
                &["system:serviceaccounts:openshift-network-operator"],
            ),
            ("openshift-managed-upgrade-operator", _) => (
                "system:serviceaccount:openshift-managed-upgrade-operator:managed-upgrade-operator",
                &["system:serviceaccounts:openshift-managed-upgrade-operator"],
            ),
            _ => (
                "system:serviceaccount:openshift-backplane-srep:test-sa",
                &["system:serviceaccounts:openshift-backplane-srep"],
            ),
        }
    };
    let (cno, cno_groups) = sa("openshift-network-operator", "");
    let (muo, muo_groups) = sa("openshift-managed-upgrade-operator", "");
    let (srep, srep_groups) = sa("openshift-backplane-srep", "");
    let mtu = |k: &str, to: u32| {
        mig(json!({"networkType": "OVNKubernetes", "mtu": {k: {"from": 1500, "to": to}}}))
    };
    let features = |on: bool| {
        mig(
            json!({"networkType": "OVNKubernetes", "features": {"egressIP": on, "egressFirewall": on}}),
        )
    };
    vec![
        update("MCVW: kube:admin in system:cluster-admins changes the migration's network type", Deny, ovn(), sdn()).by("kube:admin", &["system:cluster-admins"]),
        update("MCVW: a regular user changes the migration's network type", Deny, ovn(), sdn()).by("test-user", &[]),
        update("MCVW: SRE's backplane account changes the migration's network type", Allow, ovn(), sdn()).by(srep, srep_groups),
        update("MCVW: kube:admin changes the migration's mode", Deny, mig(json!({"mode": "Live"})), obj(json!({}))),
        update("MCVW: kube:admin adds a migration", Deny, ovn(), obj(json!({}))),
        update("MCVW: kube:admin removes the migration", Deny, obj(json!({})), ovn()),
        update("MCVW: kube:admin changes another field", Allow, obj(json!({"serviceNetwork": ["172.30.0.0/16"]})), obj(json!({"serviceNetwork": ["172.30.0.0/16"]}))),
        Case::new("kube:admin creates the config with a migration (MCVW: allowed)", Deny, net("CREATE")).objects(ovn(), Value::Null).by("kube:admin", &[]),
        Case::new("kube:admin deletes the config (MCVW: allowed)", Deny, net("DELETE")).objects(Value::Null, ovn()).by("kube:admin", &[]),
        update("MCVW: kube:admin leaves the migration alone", Allow, ovn(), ovn()),
        update("MCVW: the network operator changes the migration's network type", Allow, ovn(), sdn()).by(cno, cno_groups),
        update("MCVW: the managed upgrade operator changes the migration's network type", Allow, ovn(), sdn()).by(muo, muo_groups),
        update("a user named backplane-cluster-admin changes the migration's network type (MCVW: allowed)", Deny, ovn(), sdn()).by("backplane-cluster-admin", &[]),
        update("MCVW: kube:admin changes the migration's features", Deny, features(true), features(false)),
        update("MCVW: kube:admin adds features to the migration", Deny, mig(json!({"networkType": "OVNKubernetes", "features": {"egressIP": true}})), ovn()),
        update("MCVW: kube:admin changes the migration's network MTU", Deny, mtu("network", 9000), mtu("network", 1500)),
        update("MCVW: kube:admin changes the migration's machine MTU", Deny, mtu("machine", 9000), mtu("machine", 1500)),
        update("MCVW: kube:admin adds an MTU to the migration", Deny, mtu("network", 9000), ovn()),
    ]
}
