//! The platform's service accounts may not be deleted by a regular user: the components of the
//! platform's namespaces run as them, and a deleted one takes its pods' API access with it
//! (new pods cannot start; running ones lose their tokens when they expire). MCVW's
//! `serviceaccount-validation` webhook guards the same deletes on HyperShift; where this guard
//! decides otherwise, docs/admission.md says why.
//!
//! - Protected: service accounts in the platform's namespaces (`identity_namespaces`'
//!   reserved names: `openshift-*`, `kube-*` and the exempt accounts' namespaces),
//!   except a customer namespace (`admission.customerNamespaces`, such as `openshift-logging`)
//!   and the platform namespaces a customer works in (`CUSTOMER_WORK_NAMESPACES`, MCVW's own
//!   exceptions).
//! - Always deletable: `builder`, `default` and `deployer`, which OpenShift's controllers put
//!   back in every namespace.
//! - Who may: the guard's identity classes (the namespace controller and the garbage collector
//!   delete a namespace's accounts with it; platform operators prune their own; SRE). MCVW lets
//!   every `system:` and `kube:` user through, which takes in any service account a tenant
//!   makes; this guard does not.

use serde_json::{Value, json};

use super::Settings;
use super::case::mcvw::OAUTH;
use super::case::{Case, Want};
use super::identity_namespaces::reserved_namespaces;
use super::{CelForm, Guard, Scope, cel, matches};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct ServiceAccounts;

pub(crate) static ROW: BuiltinRow = BuiltinRow {
    name: "service-accounts.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/service-accounts",
    rules: &[rule(&["DELETE"], &[""], &["serviceaccounts"])],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// Reserved namespaces whose service accounts a customer's own work creates and removes:
/// `default`, where customers do run workloads, the user-workload monitoring stack the customer
/// configures, and the namespace OLM installs a customer's cluster-wide operators into (MCVW's
/// `exceptionNamespaces`, less `openshift-logging`, a customer namespace by
/// `admission.customerNamespaces`).
pub(crate) const CUSTOMER_WORK_NAMESPACES: &[&str] = &[
    "default",
    "openshift-user-workload-monitoring",
    "openshift-operators",
];

/// The accounts OpenShift's controllers create again in every namespace (MCVW's
/// `allowedServiceAccounts`): deleting one is harmless.
pub(crate) const RECREATED_ACCOUNTS: &[&str] = &["builder", "default", "deployer"];

/// Namespaces that are not protected although their names are reserved: the customer
/// namespaces and `CUSTOMER_WORK_NAMESPACES`.
pub(crate) fn unprotected(s: &Settings) -> Vec<String> {
    let mut out = s.customer_namespaces.clone();
    out.extend(CUSTOMER_WORK_NAMESPACES.iter().map(|n| n.to_string()));
    out
}

fn is_protected_namespace(s: &Settings, ns: &str) -> bool {
    matches(&reserved_namespaces(s), ns) && !matches(&unprotected(s), ns)
}

impl Guard for ServiceAccounts {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    /// Its objects live in the platform's namespaces.
    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if !req.is_one_of(&["DELETE"], "", "serviceaccounts") {
            return Decision::allow();
        }
        let ns = req.namespace.as_deref().unwrap_or_default();
        if !is_protected_namespace(s, ns) {
            return Decision::allow();
        }
        // The account as stored: a collection delete names none in the request.
        let name = req.stored_name();
        if RECREATED_ACCOUNTS.contains(&name) {
            return Decision::allow();
        }
        Decision::deny(denial::fill(
            denial::SERVICE_ACCOUNT,
            &[("name", name), ("namespace", ns)],
        ))
    }

    fn cel(&self, s: &Settings) -> Option<CelForm> {
        let protected = cel::matches_any_except(
            "request.namespace",
            &reserved_namespaces(s),
            &unprotected(s),
        )
        .map(|m| format!("(has(request.namespace) && {m})"))
        .unwrap_or_else(|| "false".into());
        Some(CelForm {
            expression: format!(
                "request.operation != 'DELETE' || request.resource.group != '' \
                 || request.resource.resource != 'serviceaccounts' \
                 || (has(request.subResource) && request.subResource != '') \
                 || !{protected} || ({}) in {}",
                cel::STORED_NAME,
                cel::list(RECREATED_ACCOUNTS),
            ),
            message: cel::message(
                denial::SERVICE_ACCOUNT,
                &[
                    ("name", cel::STORED_NAME),
                    ("namespace", "request.namespace"),
                ],
            ),
        })
    }

    fn cases(&self) -> Vec<Case> {
        let mut cases = mcvw_cases();
        cases.extend(own_cases());
        cases
    }
}

// MCVW's test users (pkg/webhooks/serviceaccount/serviceaccount_test.go): a regular user of the
// OAuth server, SRE through backplane.
const USER: &str = "user1";
const SA_GROUPS: &[&str] = &["system:serviceaccounts", "system:authenticated"];
const INGRESS: &str = "openshift-ingress-operator";

/// MCVW's cases with MCVW's verdicts, then the names MCVW lets through that this guard does not.
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    vec![
        delete(
            "MCVW: a user deletes a platform account",
            Deny,
            "whatever",
            INGRESS,
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: a user deletes default there (recreated)",
            Allow,
            "default",
            INGRESS,
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: a user deletes one in their namespace",
            Allow,
            "whatever",
            "whatever",
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: a user deletes one in openshift-operators",
            Allow,
            "whatever",
            "openshift-operators",
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: SRE's backplane group deletes a platform account",
            Allow,
            "whatever",
            INGRESS,
        )
        .by(USER, &["system:serviceaccounts:openshift-backplane-srep"]),
        // MCVW lets `backplane-cluster-admin` and every `kube:` user through by name; a
        // customer's identity provider can mint either name (docs/admission.md).
        delete(
            "a user named backplane-cluster-admin (MCVW: allowed)",
            Deny,
            "whatever",
            INGRESS,
        )
        .by("backplane-cluster-admin", OAUTH),
        delete(
            "a user named kube:admin (MCVW: allowed)",
            Deny,
            "whatever",
            INGRESS,
        )
        .by("kube:admin", &["system:authenticated"]),
    ]
}

/// The project's own: a tenant's service account, collection deletes, the namespaces a
/// customer works in, the cluster's machinery.
fn own_cases() -> Vec<Case> {
    use Want::*;
    vec![
        delete(
            "a tenant's service account (MCVW: allowed, as system:)",
            Deny,
            "dns",
            "openshift-dns",
        )
        .by("system:serviceaccount:team-a:cleaner", SA_GROUPS),
        delete(
            "a collection delete reaching a platform account",
            Deny,
            "dns",
            "openshift-dns",
        )
        .collection(),
        delete(
            "a collection delete reaching a recreated account",
            Allow,
            "deployer",
            "openshift-dns",
        )
        .collection(),
        delete(
            "an account in kube-system",
            Deny,
            "namespace-controller",
            "kube-system",
        ),
        delete("a customer's account in default", Allow, "web", "default"),
        delete(
            "a customer's account in openshift-logging",
            Allow,
            "collector",
            "openshift-logging",
        )
        .by("customer", &["cluster-admins", "system:authenticated"]),
        delete(
            "an account of user-workload monitoring",
            Allow,
            "prometheus-user-workload",
            "openshift-user-workload-monitoring",
        ),
        delete(
            "a namespace that only starts like a customer one",
            Deny,
            "x",
            "openshift-logging-x",
        ),
        delete(
            "the namespace controller empties a platform namespace",
            Allow,
            "dns",
            "openshift-dns",
        )
        .by(
            "system:serviceaccount:kube-system:namespace-controller",
            SA_GROUPS,
        ),
        delete(
            "a platform operator prunes its own account",
            Allow,
            "old",
            "openshift-monitoring",
        )
        .by(
            "system:serviceaccount:openshift-monitoring:cluster-monitoring-operator",
            SA_GROUPS,
        ),
    ]
}

/// A DELETE of the service account `name` in `ns` by the regular user `alice`, the account in
/// `oldObject` as the API server sends it.
fn delete(what: &'static str, want: Want, name: &'static str, ns: &'static str) -> Case {
    Case::new(what, want, ("DELETE", "", "serviceaccounts", name))
        .namespaced(ns)
        .objects(
            Value::Null,
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protected_namespaces_are_the_reserved_ones_less_the_customers() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let s = Settings {
            exempt_namespaces: v(&["kube-*", "openshift-*", "default"]),
            customer_namespaces: v(&["openshift-logging", "openshift-must-gather-*"]),
            ..Default::default()
        };
        for ns in ["openshift-dns", "kube-system", "openshift-logging-x"] {
            assert!(is_protected_namespace(&s, ns), "{ns}");
        }
        for ns in [
            "default",
            "openshift-logging",
            "openshift-must-gather-abc",
            "openshift-operators",
            "openshift-user-workload-monitoring",
            "team-a",
        ] {
            assert!(!is_protected_namespace(&s, ns), "{ns}");
        }
    }
}
