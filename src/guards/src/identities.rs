//! Who may make a guard's change: named classes of identities, each guard exempting the
//! classes whose work it would otherwise block (`Guard::exempt_classes`), which the
//! configuration fills (`admission.identityClasses`) and extends per guard
//! (`webhooks[].exemptClasses`, `exemptUsers`, `exemptGroups`).
//!
//! A service account of a customer namespace (`admission.customerNamespaces`: namespaces under
//! a reserved prefix that a customer creates for Red Hat's layered products, such as
//! `openshift-logging`) is never a member of a class by a prefix: the customer owns that
//! namespace and everything minted in it.

use serde::{Deserialize, Serialize};

use crate::cel;
use crate::matches;

/// A class of identities that a guard may exempt as a whole.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum IdentityClass {
    /// The hosted cluster's own controllers: the kube-controller-manager (its own identity and
    /// its per-controller service accounts in `kube-system`) and the scheduler.
    Machinery,
    /// HyperShift's control-plane components writing into the hosted cluster from the HCP
    /// namespace (the agent itself among them: `system:admin`).
    ControlPlane,
    /// The in-cluster platform operators: service accounts of the platform's namespaces.
    PlatformOperators,
    /// SRE, through backplane.
    Sre,
    /// The customer's own administrators (`dedicated-admins`, `cluster-admins`): exempt from no
    /// built-in guard, for guards that let customers manage something (a definition opts in).
    /// Two guards let them make one kind of change, as MCVW does: `managed-api-groups` their
    /// CustomDomains, `platform-config` MachineConfigs and their namespaces' NetNamespaces.
    CustomerAdmins,
}

impl IdentityClass {
    pub const ALL: [IdentityClass; 5] = [
        IdentityClass::Machinery,
        IdentityClass::ControlPlane,
        IdentityClass::PlatformOperators,
        IdentityClass::Sre,
        IdentityClass::CustomerAdmins,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            IdentityClass::Machinery => "machinery",
            IdentityClass::ControlPlane => "controlPlane",
            IdentityClass::PlatformOperators => "platformOperators",
            IdentityClass::Sre => "sre",
            IdentityClass::CustomerAdmins => "customerAdmins",
        }
    }
}

/// What the validating guards exempt unless a guard says otherwise: the cluster's machinery,
/// HyperShift's control plane, the platform operators and SRE.
pub const DEFAULT_CLASSES: &[IdentityClass] = &[
    IdentityClass::Machinery,
    IdentityClass::ControlPlane,
    IdentityClass::PlatformOperators,
    IdentityClass::Sre,
];

const SA_PREFIX: &str = "system:serviceaccount:";
/// The group of a namespace's service accounts is this and the namespace; only the API server
/// gives it.
pub(crate) const SA_GROUP_PREFIX: &str = "system:serviceaccounts:";

/// The user-name prefix and group of a kubelet's client certificate (`system:node:<name>` in
/// `system:nodes`).
pub const NODE_USER_PREFIX: &str = "system:node:";
pub const NODES_GROUP: &str = "system:nodes";

/// A kubelet's identity.
pub fn is_node(user: &str, groups: &[impl AsRef<str>]) -> bool {
    user.starts_with(NODE_USER_PREFIX) && groups.iter().any(|g| g.as_ref() == NODES_GROUP)
}

/// The namespace of a service-account user name (`system:serviceaccount:<ns>:<name>`).
fn sa_namespace(user: &str) -> Option<&str> {
    user.strip_prefix(SA_PREFIX)?
        .split_once(':')
        .map(|(ns, _)| ns)
}

/// `user` is one of `patterns` (exact names, or prefixes ending in '*'), a service account of a
/// customer namespace never by a prefix: `system:serviceaccount:openshift-*` takes in the
/// platform's accounts, not those of the `openshift-logging` the customer created.
pub fn user_matches(patterns: &[String], user: &str, customer_namespaces: &[String]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        None => p == user,
        Some(prefix) => {
            user.starts_with(prefix)
                && !sa_namespace(user).is_some_and(|ns| matches(customer_namespaces, ns))
        }
    })
}

/// Namespace patterns as patterns of the user names of their service accounts: `x` is
/// `system:serviceaccount:x:*`, `p*` is `system:serviceaccount:p*`.
pub(crate) fn sa_user_patterns(namespaces: &[String]) -> Vec<String> {
    namespaces
        .iter()
        .map(|ns| match ns.strip_suffix('*') {
            Some(prefix) => format!("{SA_PREFIX}{prefix}*"),
            None => format!("{SA_PREFIX}{ns}:*"),
        })
        .collect()
}

/// `user_matches` in CEL, over `value`; `None` when there is no pattern.
pub fn user_matches_cel(
    value: &str,
    patterns: &[String],
    customer_namespaces: &[String],
) -> Option<String> {
    let exact: Vec<String> = patterns
        .iter()
        .filter(|p| !p.ends_with('*'))
        .cloned()
        .collect();
    let prefixes: Vec<String> = patterns
        .iter()
        .filter(|p| p.ends_with('*'))
        .cloned()
        .collect();
    let customer = sa_user_patterns(customer_namespaces);
    let exact = cel::matches_any(value, &exact);
    let prefixed = cel::matches_any_except(value, &prefixes, &customer);
    match (exact, prefixed) {
        (Some(e), Some(p)) => Some(format!("{e} || {p}")),
        (e, p) => e.or(p),
    }
}

/// `user` (with `groups`) is one of `users` or in one of `member_groups` (`user_matches`).
pub fn is_member(
    users: &[String],
    member_groups: &[String],
    user: &str,
    groups: &[impl AsRef<str>],
    customer_namespaces: &[String],
) -> bool {
    user_matches(users, user, customer_namespaces)
        || groups
            .iter()
            .any(|g| member_groups.iter().any(|m| m == g.as_ref()))
}

/// The senders (`sender_of`) that are the hosted cluster itself: a denial of one of them is a
/// guard breaking the cluster (the alert `HcpFleetGuardBreaksTheCluster` and the probe's
/// report name the same four). SRE and the customer's admins are people; a guard may say no
/// to them.
pub const CLUSTER_SENDERS: [&str; 4] = [
    "node",
    IdentityClass::Machinery.name(),
    IdentityClass::ControlPlane.name(),
    IdentityClass::PlatformOperators.name(),
];

/// Whether `sender` (`sender_of`) is the hosted cluster itself (`CLUSTER_SENDERS`).
pub fn is_the_cluster(sender: &str) -> bool {
    CLUSTER_SENDERS.contains(&sender)
}

/// Who sent a request, for counting denials: `node` (a kubelet's certificate), a class's name
/// (`machinery`, `controlPlane`, …), or `tenant`. A denial of a node, the machinery, the
/// control plane or a platform operator is a guard breaking the cluster (docs/runbook.md).
pub fn sender_of(user: &str, groups: &[impl AsRef<str>], s: &crate::Settings) -> &'static str {
    if is_node(user, groups) {
        return "node";
    }
    s.classes
        .iter()
        .find(|c| is_member(&c.users, &c.groups, user, groups, &s.customer_namespaces))
        .map_or("tenant", |c| c.class.name())
}

/// `user` (with `groups`) is a member of `class` as the configuration fills it: for a guard
/// that lets one class make one kind of change (the customer's admins their CustomDomains).
pub fn in_class(
    s: &crate::Settings,
    class: IdentityClass,
    user: &str,
    groups: &[impl AsRef<str>],
) -> bool {
    s.classes
        .iter()
        .filter(|c| c.class == class)
        .any(|c| is_member(&c.users, &c.groups, user, groups, &s.customer_namespaces))
}

/// `in_class` in CEL, over the request's user; `false` for a class without members.
pub fn in_class_cel(s: &crate::Settings, class: IdentityClass) -> String {
    let mut terms = Vec::new();
    for c in s.classes.iter().filter(|c| c.class == class) {
        if let Some(u) = user_matches_cel(
            "request.userInfo.username",
            &c.users,
            &s.customer_namespaces,
        ) {
            terms.push(format!("({u})"));
        }
        if !c.groups.is_empty() {
            terms.push(in_groups_cel(&c.groups));
        }
    }
    if terms.is_empty() {
        "false".into()
    } else {
        format!("({})", terms.join(" || "))
    }
}

/// The request's user is in one of `groups`, in CEL.
pub fn in_groups_cel<S: AsRef<str>>(groups: &[S]) -> String {
    format!(
        "(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {}))",
        cel::list(groups)
    )
}

/// The namespaces whose service accounts are members by `users` and `groups`
/// (`system:serviceaccount:<ns>:…`, a prefix `system:serviceaccount:<prefix>*`,
/// `system:serviceaccounts:<ns>`), as exact names or prefixes ending in '*'.
pub fn sa_namespaces(users: &[String], groups: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for u in users {
        let Some(rest) = u.strip_prefix(SA_PREFIX) else {
            continue;
        };
        match rest.split_once(':') {
            Some((ns, _)) if !ns.is_empty() && !ns.contains('*') => out.push(ns.to_string()),
            Some(_) => {}
            None if rest.ends_with('*') && rest.len() > 1 => out.push(rest.to_string()),
            None => {}
        }
    }
    for g in groups {
        if let Some(ns) = g.strip_prefix(SA_GROUP_PREFIX).filter(|ns| !ns.is_empty()) {
            out.push(ns.to_string());
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_customer_namespace_takes_its_service_accounts_out_of_a_prefix_not_out_of_an_exact_name() {
        let users = v(&[
            "system:serviceaccount:openshift-*",
            "system:serviceaccount:openshift-logging:exact",
        ]);
        let customer = v(&["openshift-logging", "openshift-operators-redhat"]);
        assert!(user_matches(
            &users,
            "system:serviceaccount:openshift-dns:dns",
            &customer
        ));
        assert!(!user_matches(
            &users,
            "system:serviceaccount:openshift-logging:collector",
            &customer
        ));
        assert!(!user_matches(
            &users,
            "system:serviceaccount:openshift-operators-redhat:x",
            &customer
        ));
        assert!(user_matches(
            &users,
            "system:serviceaccount:openshift-logging:exact",
            &customer
        ));
        // A longer namespace that only starts like a customer one stays the platform's.
        assert!(user_matches(
            &users,
            "system:serviceaccount:openshift-logging-x:y",
            &customer
        ));
        assert_eq!(
            user_matches_cel("u", &users, &customer).expect("cel"),
            "u in ['system:serviceaccount:openshift-logging:exact'] || ((u.startsWith('system:serviceaccount:openshift-')) && !(u.startsWith('system:serviceaccount:openshift-logging:') || u.startsWith('system:serviceaccount:openshift-operators-redhat:')))"
        );
        assert_eq!(user_matches_cel("u", &[], &customer), None);
    }

    #[test]
    fn service_account_namespaces_come_from_users_and_groups() {
        let got = sa_namespaces(
            &v(&[
                "system:admin",
                "system:serviceaccount:hypershift:*",
                "system:serviceaccount:openshift-*",
                "system:serviceaccount:ops:deployer",
                "system:serviceaccount:*",
                "system:serviceaccount:odd*:x",
            ]),
            &v(&["system:masters", "system:serviceaccounts:ci"]),
        );
        assert_eq!(got, v(&["ci", "hypershift", "openshift-*", "ops"]));
    }
}
