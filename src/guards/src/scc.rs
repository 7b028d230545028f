//! The SecurityContextConstraints OpenShift ships may be labelled but not changed or deleted:
//! every workload that relies on them would be weakened or broken.

use serde_json::{Value, json};

use super::Settings;
use super::canary::Canary;
use super::case::mcvw::OAUTH;
use super::case::{Case, Want};
use super::{CelForm, Guard, cel, unchanged};
use crate::catalogue::{BuiltinRow, DEFAULT_SCCS, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct Scc;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "scc.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/scc",
    rules: &[rule(
        &["UPDATE", "DELETE"],
        &["security.openshift.io"],
        &["securitycontextconstraints"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

impl Guard for Scc {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if req.resource.group != "security.openshift.io"
            || req.resource.resource != "securitycontextconstraints"
        {
            return Decision::allow();
        }
        let Some(name) = req.names().find(|n| DEFAULT_SCCS.contains(n)) else {
            return Decision::allow();
        };
        // Metadata-only updates (labels, annotations) are harmless.
        let without_metadata = |o: &Value| {
            let mut v = o.clone();
            if let Some(m) = v.as_object_mut() {
                m.remove("metadata");
            }
            v
        };
        if req.operation == "UPDATE" && unchanged(req, without_metadata) {
            return Decision::allow();
        }
        let verb = if req.operation == "DELETE" {
            "deleting"
        } else {
            "changing"
        };
        Decision::deny(denial::fill(denial::SCC, &[("verb", verb), ("name", name)]))
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        // Everything but metadata unchanged. The object is a map at run time; `dyn` lets the
        // type check accept iterating its fields whatever the SCC schema says.
        let unchanged = "object != null && oldObject != null \
            && dyn(object).all(k, k == 'metadata' || (k in dyn(oldObject) && dyn(object)[k] == dyn(oldObject)[k])) \
            && dyn(oldObject).all(k, k == 'metadata' || k in dyn(object))";
        Some(CelForm {
            expression: format!(
                "!({} && {}) || !({NAMES}.exists(n, n in {})) || (request.operation == 'UPDATE' && {unchanged})",
                cel::group_is("security.openshift.io"),
                cel::resource_is("securitycontextconstraints"),
                cel::list(DEFAULT_SCCS),
                NAMES = cel::NAMES,
            ),
            message: cel::message(
                denial::SCC,
                &[
                    ("verb", &cel::verb("deleting", "changing")),
                    ("name", cel::STORED_NAME),
                ],
            ),
        })
    }

    /// Deleting `privileged`, which every OpenShift cluster has.
    fn canary(&self, _: &Settings) -> Option<Canary> {
        Some(Canary::delete(
            ("security.openshift.io", "v1", "securitycontextconstraints"),
            "privileged",
        ))
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let sccr = |op, name| {
            (
                op,
                "security.openshift.io",
                "securitycontextconstraints",
                name,
            )
        };
        let scc = |name: &str, privileged: bool, labels: Value| {
            json!({
                "apiVersion": "security.openshift.io/v1", "kind": "SecurityContextConstraints",
                "metadata": {"name": name, "labels": labels},
                "allowPrivilegedContainer": privileged,
                "users": [],
                "priority": null,
            })
        };
        let d = DEFAULT_SCCS[0];
        let mut cases = vec![
            Case::new("delete a default SCC", Deny, sccr("DELETE", d))
                .objects(Value::Null, scc(d, false, json!({}))),
            Case::new("weaken a default SCC", Deny, sccr("UPDATE", d))
                .objects(scc(d, true, json!({})), scc(d, false, json!({}))),
            Case::new(
                "create a default SCC's name",
                Deny,
                sccr("CREATE", "privileged"),
            )
            .objects(scc("privileged", true, json!({})), Value::Null),
            Case::new("drop a field of a default SCC", Deny, sccr("UPDATE", d)).objects(
                json!({"metadata": {"name": d}, "users": []}),
                scc(d, false, json!({})),
            ),
            Case::new("add a field to a default SCC", Deny, sccr("UPDATE", d)).objects(
                scc(d, false, json!({})),
                json!({"metadata": {"name": d}, "allowPrivilegedContainer": false, "users": []}),
            ),
            Case::new("label a default SCC", Allow, sccr("UPDATE", d)).objects(
                scc(d, false, json!({"team": "a"})),
                scc(d, false, json!({})),
            ),
            Case::new("change a custom SCC", Allow, sccr("UPDATE", "custom")).objects(
                scc("custom", true, json!({})),
                scc("custom", false, json!({})),
            ),
            Case::new("delete a custom SCC", Allow, sccr("DELETE", "custom")),
            // A collection delete names no object in the request: the old object is the one.
            Case::new(
                "a collection delete reaching a default SCC",
                Deny,
                sccr("DELETE", ""),
            )
            .objects(Value::Null, scc(d, false, json!({}))),
            Case::new(
                "a collection delete reaching a custom SCC",
                Allow,
                sccr("DELETE", ""),
            )
            .objects(Value::Null, scc("custom", false, json!({}))),
        ];
        cases.extend(mcvw_cases());
        cases
    }
}

/// MCVW's cases (pkg/webhooks/scc/scc_test.go) with MCVW's verdicts, but two: MCVW sends the
/// same SCC as object and old object, and refuses an update of a default SCC even where
/// nothing changes; this guard judges what changes (metadata alone, or nothing, passes).
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let cmo = "system:serviceaccount:openshift-monitoring:cluster-monitoring-operator";
    let mut cases = vec![
        mcvw(
            "MCVW: a user deletes hostnetwork",
            Deny,
            "DELETE",
            "hostnetwork",
        )
        .by("user1", OAUTH),
        mcvw(
            "MCVW: a user deletes hostaccess",
            Deny,
            "DELETE",
            "hostaccess",
        )
        .by("user2", OAUTH),
        mcvw("MCVW: a user deletes anyuid", Deny, "DELETE", "anyuid").by("user3", OAUTH),
        mcvw(
            "MCVW: a user deletes hostnetwork-v2",
            Deny,
            "DELETE",
            "hostnetwork-v2",
        )
        .by("user1", OAUTH),
        mcvw(
            "MCVW: a user deletes an SCC of their own",
            Allow,
            "DELETE",
            "testscc",
        )
        .by("user1", OAUTH),
        mcvw(
            "MCVW: the monitoring operator deletes hostaccess",
            Allow,
            "DELETE",
            "hostaccess",
        )
        .by(cmo, OAUTH),
    ];
    cases.extend(mcvw_updates());
    cases
}

/// MCVW's updates: its object and old object are one.
fn mcvw_updates() -> Vec<Case> {
    use Want::*;
    let cmo = "system:serviceaccount:openshift-monitoring:cluster-monitoring-operator";
    vec![
        mcvw(
            "a user updates anyuid, nothing changed (MCVW: denied)",
            Allow,
            "UPDATE",
            "anyuid",
        )
        .by("user4", OAUTH),
        mcvw(
            "MCVW: a user updates an SCC of their own",
            Allow,
            "UPDATE",
            "testscc",
        )
        .by("user1", OAUTH),
        mcvw(
            "MCVW: the monitoring operator updates hostaccess",
            Allow,
            "UPDATE",
            "hostaccess",
        )
        .by(cmo, OAUTH),
        mcvw(
            "MCVW: system:admin updates hostaccess",
            Allow,
            "UPDATE",
            "hostaccess",
        )
        .by("system:admin", OAUTH),
        mcvw(
            "a tenant's service account updates privileged, nothing changed (MCVW: denied)",
            Allow,
            "UPDATE",
            "privileged",
        )
        .by(
            "system:serviceaccount:osde2e-abcde:osde2e-runner",
            &[
                "system:authenticated",
                "system:serviceaccounts:osde2e-abcde",
            ],
        ),
        mcvw(
            "MCVW: the kube-apiserver operator updates anyuid",
            Allow,
            "UPDATE",
            "anyuid",
        )
        .by(
            "system:serviceaccount:openshift-kube-apiserver-operator:kube-apiserver-operator",
            &[],
        ),
    ]
}

/// One of MCVW's requests: `op` on the SCC `name`, the same SCC as object and old object.
fn mcvw(what: &'static str, want: Want, op: &'static str, name: &'static str) -> Case {
    let obj = json!({"apiVersion": "security.openshift.io/v1", "kind": "SecurityContextConstraints", "metadata": {"name": name, "uid": "1234"}, "allowPrivilegedContainer": false});
    let c = Case::new(
        what,
        want,
        (
            op,
            "security.openshift.io",
            "securitycontextconstraints",
            name,
        ),
    );
    if op == "DELETE" {
        c.objects(Value::Null, obj)
    } else {
        c.objects(obj.clone(), obj)
    }
}
