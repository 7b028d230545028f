//! The ClusterRoleBindings that give the platform's service accounts their rights may not be
//! deleted by a regular user, nor have those subjects taken out: a platform component whose
//! binding goes loses its API access at once (its next request is forbidden), and nothing in a
//! hosted cluster puts an operator's binding back until its next upgrade. MCVW's
//! `clusterrolebindings-validation` webhook guards the same deletes on HyperShift; where this
//! guard decides otherwise, docs/admission.md says why.
//!
//! - Protected: a binding with a subject that is a service account of a platform namespace
//!   (`service_accounts`' protected namespaces, less MCVW's two other exceptions for bindings:
//!   `openshift-gitops`, the customer's GitOps install, and
//!   `openshift-backplane-managed-scripts`, whose bindings live as long as one SRE script),
//!   named as a `ServiceAccount` subject, a `User` (`system:serviceaccount:<ns>:<name>`) or a
//!   `Group` (`system:serviceaccounts:<ns>`): the three spellings grant the same account.
//! - Judged: DELETE (the binding as stored, for a collection delete too) and UPDATE that takes
//!   such a subject out. MCVW judges DELETE only, so an update that empties the subjects and
//!   a delete after it went through; `roleRef` cannot change, so taking a subject out is the
//!   only other way to take the rights away.
//! - Not judged: bindings whose platform accounts are all in customer namespaces (the
//!   `oc adm must-gather` binding of `openshift-must-gather-…`, a Red Hat operator's in
//!   `openshift-logging`), adding subjects, creating bindings.
//! - Who may: the guard's identity classes (the garbage collector deletes a binding whose
//!   owner went, OLM replaces an operator's, platform operators and HyperShift prune their
//!   own, SRE). MCVW lets every `system:` and `kube:` user through, and `cluster-admin` where
//!   the binding carries `oc adm must-gather`'s annotation, which anyone who may update the
//!   binding can add; this guard does not.

use serde_json::{Value, json};

use super::Settings;
use super::case::mcvw::OAUTH;
use super::case::{Case, Want};
use super::identities::{SA_GROUP_PREFIX, sa_user_patterns};
use super::identity_namespaces::reserved_namespaces;
use super::service_accounts::unprotected as unprotected_accounts;
use super::{CelForm, Guard, Scope, cel, matches};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct PlatformBindings;

pub(crate) static ROW: BuiltinRow = BuiltinRow {
    name: "platform-bindings.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/platform-bindings",
    rules: &[rule(
        &["UPDATE", "DELETE"],
        &["rbac.authorization.k8s.io"],
        &["clusterrolebindings"],
    )],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// Platform namespaces whose accounts' bindings MCVW lets customers delete, beyond the
/// namespaces whose service accounts they may delete (`service_accounts`).
pub(crate) const BINDING_EXCEPTIONS: &[&str] =
    &["openshift-backplane-managed-scripts", "openshift-gitops"];

/// The namespace patterns whose service accounts a binding protects, and those it does not:
/// (reserved, excepted), exact names or prefixes ending in '*'.
fn namespaces(s: &Settings) -> (Vec<String>, Vec<String>) {
    let mut except = unprotected_accounts(s);
    except.extend(BINDING_EXCEPTIONS.iter().map(|n| n.to_string()));
    (reserved_namespaces(s), except)
}

/// Namespace patterns as patterns of their service-account groups: `x` is
/// `system:serviceaccounts:x`, `p*` is `system:serviceaccounts:p*`.
fn as_groups(patterns: &[String]) -> Vec<String> {
    patterns
        .iter()
        .map(|p| format!("{SA_GROUP_PREFIX}{p}"))
        .collect()
}

/// The three spellings' patterns: (namespaces, users, groups), each (protected, excepted).
struct Patterns {
    namespaces: (Vec<String>, Vec<String>),
    users: (Vec<String>, Vec<String>),
    groups: (Vec<String>, Vec<String>),
}

impl Patterns {
    fn new(s: &Settings) -> Self {
        let (reserved, except) = namespaces(s);
        Self {
            users: (sa_user_patterns(&reserved), sa_user_patterns(&except)),
            groups: (as_groups(&reserved), as_groups(&except)),
            namespaces: (reserved, except),
        }
    }

    /// How `subject` is shown in a denial, where it names a platform service account.
    fn platform_account(&self, subject: &Value) -> Option<String> {
        let field = |k: &str| subject.get(k).and_then(Value::as_str);
        let name = field("name")?;
        let within =
            |(yes, no): &(Vec<String>, Vec<String>), v: &str| matches(yes, v) && !matches(no, v);
        match field("kind")? {
            "ServiceAccount" => {
                let ns = field("namespace")?;
                within(&self.namespaces, ns).then(|| format!("the service account {ns}/{name}"))
            }
            "User" => within(&self.users, name).then(|| format!("the user {name}")),
            "Group" => within(&self.groups, name).then(|| format!("the group {name}")),
            _ => None,
        }
    }

    /// `platform_account`'s test in CEL, over the subject `s`.
    fn cel(&self, s: &str) -> String {
        let within = |(yes, no): &(Vec<String>, Vec<String>), v: &str| {
            cel::matches_any_except(v, yes, no).unwrap_or_else(|| "false".into())
        };
        format!(
            "(({s}.kind == 'ServiceAccount' && has({s}.namespace) && {}) || ({s}.kind == 'User' && {}) || ({s}.kind == 'Group' && {}))",
            within(&self.namespaces, &format!("{s}.namespace")),
            within(&self.users, &format!("{s}.name")),
            within(&self.groups, &format!("{s}.name")),
        )
    }
}

/// A binding's subjects, where it has any.
fn subjects(o: Option<&Value>) -> &[Value] {
    o.and_then(|o| o.get("subjects"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// One subject is the other: the same kind, name and namespace (absent is empty).
fn same(a: &Value, b: &Value) -> bool {
    ["kind", "name", "namespace"]
        .iter()
        .all(|k| a.get(k).and_then(Value::as_str) == b.get(k).and_then(Value::as_str))
}

/// `same` in CEL, `n` the new subject, `s` the old one.
const SAME: &str = "n.kind == s.kind && n.name == s.name && (has(n.namespace) ? n.namespace : '') == (has(s.namespace) ? s.namespace : '')";

/// The old subject `s` is still there after the request: only an UPDATE keeps anything.
const KEPT: &str = "(request.operation == 'UPDATE' && object != null && has(object.subjects) && object.subjects.exists(n, SAME))";

impl Guard for PlatformBindings {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    /// Its bindings are cluster-scoped: no namespace exemption could apply, and whom it
    /// exempts are its identity classes alone.
    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        let update = req.operation == "UPDATE";
        if !req.is_one_of(
            &["UPDATE", "DELETE"],
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
        ) {
            return Decision::allow();
        }
        let patterns = Patterns::new(s);
        let kept = subjects(req.object());
        let Some(account) = subjects(req.old_object())
            .iter()
            .filter(|old| !(update && kept.iter().any(|new| same(new, old))))
            .find_map(|old| patterns.platform_account(old))
        else {
            return Decision::allow();
        };
        let verb = if update {
            "taking a subject out of"
        } else {
            "deleting"
        };
        Decision::deny(denial::fill(
            denial::PLATFORM_BINDING,
            &[
                ("verb", verb),
                ("name", req.stored_name()),
                ("subject", &account),
            ],
        ))
    }

    fn cel(&self, s: &Settings) -> Option<CelForm> {
        let patterns = Patterns::new(s);
        let kept = KEPT.replace("SAME", SAME);
        let removed = format!("{} && !{kept}", patterns.cel("s"));
        let shown = "s.kind == 'ServiceAccount' ? 'the service account ' + s.namespace + '/' + s.name : (s.kind == 'User' ? 'the user ' : 'the group ') + s.name";
        Some(CelForm {
            expression: format!(
                "!(request.operation in ['UPDATE', 'DELETE']) || !({}) || !({}) \
                 || (has(request.subResource) && request.subResource != '') \
                 || oldObject == null || !has(oldObject.subjects) \
                 || !oldObject.subjects.exists(s, {removed})",
                cel::group_is("rbac.authorization.k8s.io"),
                cel::resource_is("clusterrolebindings"),
            ),
            message: cel::message(
                denial::PLATFORM_BINDING,
                &[
                    ("verb", &cel::verb("deleting", "taking a subject out of")),
                    ("name", cel::STORED_NAME),
                    (
                        "subject",
                        &format!("oldObject.subjects.filter(s, {removed}).map(s, {shown})[0]"),
                    ),
                ],
            ),
        })
    }

    fn cases(&self) -> Vec<Case> {
        let mut cases = mcvw_cases();
        cases.extend(own_cases());
        cases.extend(machinery_cases());
        cases
    }
}

// MCVW's test users (pkg/webhooks/clusterrolebinding/clusterrolebinding_test.go): a regular
// user of the OAuth server, `cluster-admin` running must-gather, SRE, `kube:admin`.
const USER: &str = "user1";
const AUTHENTICATED: &[&str] = &["system:authenticated"];
const SA_GROUPS: &[&str] = &["system:serviceaccounts", "system:authenticated"];
/// `oc adm must-gather`'s namespace in MCVW's test (`generateName: openshift-must-gather-`).
const MUST_GATHER: &str = "openshift-must-gather-mm4tf";

/// MCVW's cases with MCVW's verdicts (the tenth differs: a must-gather namespace is the
/// customer's here).
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let sa = |ns: &str| json!([{"kind": "ServiceAccount", "name": "whatever", "namespace": ns}]);
    let must_gather =
        json!([{"kind": "ServiceAccount", "name": "default", "namespace": MUST_GATHER}]);
    let annotated = json!({"oc.openshift.io/command": "oc adm must-gather"});
    vec![
        delete(
            "MCVW: a user deletes a binding of openshift-ingress-operator's account",
            Deny,
            sa("openshift-ingress-operator"),
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: a user deletes a binding of kube-system's account",
            Deny,
            sa("kube-system"),
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: a user deletes a binding of an account of their own namespace",
            Allow,
            sa("whatever"),
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: a user deletes a binding of a user",
            Allow,
            json!([{"kind": "User", "name": "whatever"}]),
        )
        .by(USER, OAUTH),
        update(
            "MCVW: a user updates a platform binding, its subjects kept",
            Allow,
            sa("openshift-ingress-operator"),
            sa("openshift-ingress-operator"),
        )
        .by(USER, OAUTH),
        update(
            "MCVW: a user updates a binding of openshift-operators' account",
            Allow,
            sa("openshift-operators"),
            sa("openshift-operators"),
        )
        .by(USER, OAUTH),
        delete(
            "MCVW: backplane-cluster-admin deletes a binding of openshift-operators' account",
            Allow,
            sa("openshift-operators"),
        )
        .by("backplane-cluster-admin", OAUTH),
        delete(
            "MCVW: kube:admin deletes a binding of openshift-operators' account",
            Allow,
            sa("openshift-operators"),
        )
        .by("kube:admin", AUTHENTICATED),
        annotate(
            delete(
                "MCVW: cluster-admin cleans up must-gather's binding (annotated)",
                Allow,
                must_gather.clone(),
            ),
            annotated,
        )
        .by("cluster-admin", AUTHENTICATED),
        // MCVW denies this one: only its annotation, which anyone who may update the binding
        // can add, makes the must-gather namespace's account deletable there. The namespace
        // is the customer's here (`admission.customerNamespaces`), annotated or not.
        delete(
            "cluster-admin cleans up must-gather's binding, unannotated (MCVW: denied)",
            Allow,
            must_gather,
        )
        .by("cluster-admin", AUTHENTICATED),
    ]
}

/// The project's own: the identities MCVW lets through by name, the other spellings of an
/// account, the update MCVW does not judge, collection deletes, the exceptions.
fn own_cases() -> Vec<Case> {
    use Want::*;
    let dns = || json!([{"kind": "ServiceAccount", "name": "dns-operator", "namespace": "openshift-dns-operator"}]);
    let user = |n: &'static str| json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": n}]);
    let group = |n: &'static str| json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": n}]);
    let team = json!({"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "team-a"});
    let mut with_team = dns();
    if let Some(a) = with_team.as_array_mut() {
        a.push(team.clone());
    }
    vec![
        delete(
            "a user named backplane-cluster-admin (MCVW: allowed)",
            Deny,
            dns(),
        )
        .by("backplane-cluster-admin", OAUTH),
        delete("a user named kube:admin (MCVW: allowed)", Deny, dns())
            .by("kube:admin", AUTHENTICATED),
        delete(
            "a tenant's service account (MCVW: allowed, as system:)",
            Deny,
            dns(),
        )
        .by("system:serviceaccount:team-a:cleaner", SA_GROUPS),
        delete(
            "a collection delete reaching a platform binding",
            Deny,
            dns(),
        )
        .collection(),
        delete(
            "a platform account named as a User",
            Deny,
            user("system:serviceaccount:openshift-monitoring:prometheus-k8s"),
        ),
        delete(
            "a platform namespace's accounts named as a Group",
            Deny,
            group("system:serviceaccounts:openshift-monitoring"),
        ),
        delete(
            "a customer namespace's account named as a User",
            Allow,
            user("system:serviceaccount:openshift-logging:collector"),
        ),
        delete(
            "an account of a namespace that only starts like kube-system",
            Deny,
            json!([{"kind": "ServiceAccount", "name": "x", "namespace": "kube-system-x"}]),
        ),
        delete(
            "a binding of openshift-gitops' account (MCVW's exception)",
            Allow,
            json!([{"kind": "ServiceAccount", "name": "argocd-application-controller", "namespace": "openshift-gitops"}]),
        ),
        delete("a binding with no subjects", Allow, Value::Null),
        update(
            "a user takes the platform account out of a binding (MCVW: allowed)",
            Deny,
            dns(),
            json!([team.clone()]),
        ),
        update(
            "a user empties a platform binding (MCVW: allowed)",
            Deny,
            dns(),
            json!([]),
        ),
        update(
            "a user adds a group to a platform binding",
            Allow,
            dns(),
            with_team.clone(),
        ),
        update(
            "a user takes their own group out of a platform binding",
            Allow,
            with_team,
            dns(),
        ),
        update(
            "a user moves a platform account to the User spelling",
            Deny,
            dns(),
            user("system:serviceaccount:openshift-dns-operator:dns-operator"),
        ),
    ]
}

/// The cluster's machinery and SRE, with the identities they use.
fn machinery_cases() -> Vec<Case> {
    use Want::*;
    let olm = json!([{"kind": "ServiceAccount", "name": "dns-operator", "namespace": "openshift-dns-operator"}]);
    let kube_system = &[
        "system:serviceaccounts",
        "system:serviceaccounts:kube-system",
        "system:authenticated",
    ];
    vec![
        delete(
            "the garbage collector deletes a platform binding whose owner went",
            Allow,
            olm.clone(),
        )
        .by(
            "system:serviceaccount:kube-system:generic-garbage-collector",
            kube_system,
        ),
        delete(
            "HyperShift's control plane (system:admin) prunes a platform binding",
            Allow,
            olm.clone(),
        )
        .by("system:admin", &["system:masters", "system:authenticated"]),
        delete(
            "a platform operator prunes its own binding",
            Allow,
            olm.clone(),
        )
        .by(
            "system:serviceaccount:openshift-dns-operator:dns-operator",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-dns-operator",
                "system:authenticated",
            ],
        ),
        delete(
            "SRE's backplane group deletes a platform binding",
            Allow,
            olm,
        )
        .by(
            "system:serviceaccount:openshift-backplane-srep:sre-a",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-backplane-srep",
                "system:authenticated",
            ],
        ),
    ]
}

/// A ClusterRoleBinding named `crb` whose subjects are `subjects` (none where null).
fn binding(subjects: Value) -> Value {
    let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "crb"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "x"}});
    if !subjects.is_null() {
        o["subjects"] = subjects;
    }
    o
}

/// A DELETE of the binding `crb` with `subjects`, as the API server sends it (the binding in
/// `oldObject`), by the regular user `alice`.
fn delete(what: &'static str, want: Want, subjects: Value) -> Case {
    Case::new(
        what,
        want,
        (
            "DELETE",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "crb",
        ),
    )
    .objects(Value::Null, binding(subjects))
}

/// An UPDATE of the binding `crb` from `old` subjects to `new`.
fn update(what: &'static str, want: Want, old: Value, new: Value) -> Case {
    Case::new(
        what,
        want,
        (
            "UPDATE",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "crb",
        ),
    )
    .objects(binding(new), binding(old))
}

/// The case's bindings with `annotations`.
fn annotate(mut c: Case, annotations: Value) -> Case {
    for o in [&mut c.object, &mut c.old] {
        if o.is_object() {
            o["metadata"]["annotations"] = annotations.clone();
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Settings {
            exempt_namespaces: v(&["kube-*", "openshift-*", "default"]),
            customer_namespaces: v(&["openshift-logging", "openshift-must-gather-*"]),
            ..Default::default()
        }
    }

    #[test]
    fn the_three_spellings_of_a_platform_account_are_protected_alike() {
        let p = Patterns::new(&settings());
        for (subject, shown) in [
            (
                json!({"kind": "ServiceAccount", "name": "dns", "namespace": "openshift-dns"}),
                "the service account openshift-dns/dns",
            ),
            (
                json!({"kind": "User", "name": "system:serviceaccount:openshift-dns:dns"}),
                "the user system:serviceaccount:openshift-dns:dns",
            ),
            (
                json!({"kind": "Group", "name": "system:serviceaccounts:kube-system"}),
                "the group system:serviceaccounts:kube-system",
            ),
        ] {
            assert_eq!(p.platform_account(&subject).as_deref(), Some(shown));
        }
        for subject in [
            json!({"kind": "ServiceAccount", "name": "c", "namespace": "openshift-logging"}),
            json!({"kind": "ServiceAccount", "name": "d", "namespace": "openshift-must-gather-x"}),
            json!({"kind": "ServiceAccount", "name": "e", "namespace": "openshift-gitops"}),
            json!({"kind": "ServiceAccount", "name": "f", "namespace": "team-a"}),
            json!({"kind": "ServiceAccount", "name": "g"}),
            json!({"kind": "User", "name": "system:serviceaccount:openshift-logging:c"}),
            json!({"kind": "Group", "name": "system:serviceaccounts"}),
            json!({"kind": "Group", "name": "system:serviceaccounts:openshift-operators"}),
            json!({"kind": "User", "name": "system:admin"}),
            json!({"name": "system:serviceaccount:openshift-dns:dns"}),
        ] {
            assert_eq!(p.platform_account(&subject), None, "{subject}");
        }
    }
}
