//! The cluster's own configuration is the service's: a regular user may not write the kinds
//! MCVW's `regular-user-validation` webhook keeps from customers on HyperShift beyond the
//! managed API groups (`managed_groups`). HyperShift's control plane writes them from the
//! HostedCluster's spec (the hosted-cluster-config operator reconciles ClusterVersion, the
//! Proxy, the APIServer and `openshift-config/user-ca-bundle`: its controllers/resources), so a
//! customer's change is either undone or, where it sticks, a change to what SRE runs.
//!
//! - Never a regular user's: anything in `machine.openshift.io`, `cloudcredential.openshift.io`
//!   and `addons.managed.openshift.io`; ClusterAutoscalers and MachineAutoscalers;
//!   ClusterVersion (its status too), Scheduler, APIServer and Proxy (`config.openshift.io`);
//!   KubeAPIServer and OpenShiftAPIServer (`operator.openshift.io`); the ConfigMap
//!   `user-ca-bundle` in `openshift-config`.
//! - The customer's admins' too (`admission.identityClasses.customerAdmins`), as MCVW has it:
//!   MachineConfigs and MachineConfigPools; a NetNamespace (created or changed, not deleted)
//!   of a namespace whose name is not reserved (`identity_namespaces`) nor one MCVW refuses
//!   (`com`, `io`, `in`).
//! - Names as stored: every name of the request (`Request::names`), for a collection delete
//!   and a tenant's renaming mutation alike.
//! - Who may: the guard's identity classes. MCVW also lets every `kube:` user through, the
//!   user `backplane-cluster-admin` and (for all but ClusterVersion) every `system:` user; a
//!   customer's identity provider can name a user either way and every service account is a
//!   `system:` user, so this guard does not. MCVW refuses SRE's backplane sessions
//!   MachineConfigs; SRE is exempt here as from every guard.
//! - Not judged: `admissionregistration.k8s.io`, which MCVW's rule names too: the API server
//!   sends no webhook and no admission policy a request for a webhook configuration or an
//!   admission policy, so no engine could.

use serde_json::{Value, json};

use super::Settings;
use super::case::mcvw::{CLUSTER_ADMINS, DEDICATED_ADMINS, OAUTH, SRE, UNAUTHENTICATED};
use super::case::{Case, Want};
use super::identities::{IdentityClass, in_class, in_class_cel};
use super::identity_namespaces::{is_reserved, is_reserved_cel, reserved_namespaces};
use super::{CelForm, Guard, Scope, cel};
use crate::catalogue::{BuiltinRow, WebhookKind, denial, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct PlatformConfig;

const WRITES: &[&str] = &["CREATE", "UPDATE", "DELETE"];

/// API groups whose every kind is the service's.
const WHOLE_GROUPS: &[&str] = &[
    "machine.openshift.io",
    "cloudcredential.openshift.io",
    "addons.managed.openshift.io",
];
const AUTOSCALERS: &[&str] = &["clusterautoscalers", "machineautoscalers"];
const CLUSTER_CONFIG: &[&str] = &["clusterversions", "schedulers", "apiservers", "proxies"];
const API_SERVERS: &[&str] = &["kubeapiservers", "openshiftapiservers"];
const MACHINE_CONFIG: &[&str] = &["machineconfigs", "machineconfigpools"];
/// Names MCVW refuses a NetNamespace whatever the user (its namespace webhook's `badNamespace`).
const BAD_NAMES: &[&str] = &["com", "io", "in"];
const CA_BUNDLE: (&str, &str) = ("openshift-config", "user-ca-bundle");

pub(crate) static ROW: BuiltinRow = BuiltinRow {
    name: "platform-config.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/platform-config",
    rules: &[
        // `*/*`: every resource and subresource (the API server takes it alone).
        rule(WRITES, WHOLE_GROUPS, &["*/*"]),
        rule(WRITES, &["autoscaling.openshift.io"], AUTOSCALERS),
        rule(
            WRITES,
            &["config.openshift.io"],
            &[
                "clusterversions",
                "clusterversions/status",
                "schedulers",
                "apiservers",
                "proxies",
            ],
        ),
        rule(WRITES, &["operator.openshift.io"], API_SERVERS),
        rule(
            WRITES,
            &["machineconfiguration.openshift.io"],
            MACHINE_CONFIG,
        ),
        rule(
            WRITES,
            &["network.openshift.io"],
            &["netnamespaces", "netnamespaces/*"],
        ),
        // Every ConfigMap write comes here, as to MCVW, for one name in one namespace: an
        // admission policy (1.30 on) decides it inside the API server.
        rule(WRITES, &[""], &["configmaps"]),
    ],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// Who besides the guard's exempt identities may make a change of the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Others {
    NoOne,
    CustomerAdmins,
    /// The customer's admins, on a create or update of an unreserved, acceptable name.
    CustomerAdminsForTheirNamespaces,
}

/// What the request writes, where it is one of the guard's kinds.
fn kind_of(req: &Request) -> Option<Others> {
    let (g, r) = (&*req.resource.group, &*req.resource.resource);
    let ns = req.namespace.as_deref().unwrap_or_default();
    match g {
        _ if WHOLE_GROUPS.contains(&g) => Some(Others::NoOne),
        "autoscaling.openshift.io" if AUTOSCALERS.contains(&r) => Some(Others::NoOne),
        "config.openshift.io" if CLUSTER_CONFIG.contains(&r) => Some(Others::NoOne),
        "operator.openshift.io" if API_SERVERS.contains(&r) => Some(Others::NoOne),
        "machineconfiguration.openshift.io" if MACHINE_CONFIG.contains(&r) => {
            Some(Others::CustomerAdmins)
        }
        "network.openshift.io" if r == "netnamespaces" => {
            Some(Others::CustomerAdminsForTheirNamespaces)
        }
        "" if r == "configmaps" && ns == CA_BUNDLE.0 && req.names().any(|n| n == CA_BUNDLE.1) => {
            Some(Others::NoOne)
        }
        _ => None,
    }
}

/// Some name of the request is one the customer's admins may not give a NetNamespace.
fn names_a_reserved_namespace(s: &Settings, req: &Request) -> bool {
    let reserved = reserved_namespaces(s);
    req.names()
        .any(|n| is_reserved(s, &reserved, n) || BAD_NAMES.contains(&n))
}

impl Guard for PlatformConfig {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    /// Its objects live in the platform's namespaces (`openshift-config`,
    /// `openshift-machine-api`) or none.
    fn scope(&self) -> Scope {
        Scope::Identities
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        let Some(others) = kind_of(req) else {
            return Decision::allow();
        };
        let u = &req.user_info;
        let customer_admin = || in_class(s, IdentityClass::CustomerAdmins, &u.username, &u.groups);
        let allowed = match others {
            Others::NoOne => false,
            Others::CustomerAdmins => customer_admin(),
            Others::CustomerAdminsForTheirNamespaces => {
                req.operation != "DELETE" && customer_admin() && !names_a_reserved_namespace(s, req)
            }
        };
        if allowed {
            return Decision::allow();
        }
        let group = if req.resource.group.is_empty() {
            "core"
        } else {
            &req.resource.group
        };
        Decision::deny(denial::fill(
            denial::PLATFORM_CONFIG,
            &[
                ("resource", &req.resource.resource),
                ("name", req.stored_name()),
                ("group", group),
                ("operation", &req.operation.to_lowercase()),
            ],
        ))
    }

    fn cel(&self, s: &Settings) -> Option<CelForm> {
        let (group, resource) = ("request.resource.group", "request.resource.resource");
        let customer = in_class_cel(s, IdentityClass::CustomerAdmins);
        let reserved =
            is_reserved_cel(s, &reserved_namespaces(s), "n").unwrap_or_else(|| "false".into());
        let of = |g: &str, rs: &[&str]| {
            format!(
                "({group} == {} && {resource} in {})",
                cel::string(g),
                cel::list(rs)
            )
        };
        let guarded = [
            format!("{group} in {}", cel::list(WHOLE_GROUPS)),
            of("autoscaling.openshift.io", AUTOSCALERS),
            of("config.openshift.io", CLUSTER_CONFIG),
            of("operator.openshift.io", API_SERVERS),
            format!(
                "({} && !{customer})",
                of("machineconfiguration.openshift.io", MACHINE_CONFIG)
            ),
            format!(
                "({} && !(request.operation != 'DELETE' && {customer} && !{}.exists(n, {reserved} || n in {})))",
                of("network.openshift.io", &["netnamespaces"]),
                cel::NAMES,
                cel::list(BAD_NAMES),
            ),
            format!(
                "({group} == '' && {resource} == 'configmaps' && has(request.namespace) && request.namespace == {} && {}.exists(n, n == {}))",
                cel::string(CA_BUNDLE.0),
                cel::NAMES,
                cel::string(CA_BUNDLE.1),
            ),
        ];
        Some(CelForm {
            expression: format!("!({})", guarded.join(" || ")),
            message: cel::message(
                denial::PLATFORM_CONFIG,
                &[
                    ("resource", resource),
                    ("name", cel::STORED_NAME),
                    ("group", &format!("{group} == '' ? 'core' : {group}")),
                    ("operation", "request.operation.lowerAscii()"),
                ],
            ),
        })
    }

    /// Deleting the ClusterVersion `version`, which every OpenShift cluster has (its
    /// cluster-version operator makes it; on HyperShift in the hosted cluster too).
    fn canary(&self, _: &Settings) -> Option<crate::canary::Canary> {
        Some(crate::canary::Canary::delete(
            ("config.openshift.io", "v1", "clusterversions"),
            "version",
        ))
    }

    fn cases(&self) -> Vec<Case> {
        let mut cases = mcvw_machines();
        cases.extend(mcvw_cluster_config());
        cases.extend(mcvw_schedulers());
        cases.extend(mcvw_api_servers());
        cases.extend(mcvw_net_namespaces_and_ca_bundle());
        cases.extend(own_cases());
        cases.extend(own_kinds());
        cases
    }
}

/// `op` of the cluster-scoped `group`/`resource` named `name`, with its object where the API
/// server sends one.
fn write(
    what: &'static str,
    want: Want,
    op: &'static str,
    (group, resource): (&'static str, &'static str),
    name: &'static str,
) -> Case {
    let obj = json!({"metadata": {"name": name}});
    let c = Case::new(what, want, (op, group, resource, name));
    match op {
        "DELETE" => c.objects(Value::Null, obj),
        "UPDATE" => c.objects(obj.clone(), obj),
        _ => c.objects(obj, Value::Null),
    }
}

/// TestFirstBlock, TestAutoScaling, TestMachineConfig, and the last of TestCustomDomains.
fn mcvw_machines() -> Vec<Case> {
    use Want::*;
    let machines = ("machine.openshift.io", "machines");
    let autoscalers = ("autoscaling.openshift.io", "clusterautoscalers");
    let mcp = ("machineconfiguration.openshift.io", "machineconfigpools");
    let mc = ("machineconfiguration.openshift.io", "machineconfigs");
    let sa_groups = |ns: &'static str| -> &'static [&'static str] {
        match ns {
            "openshift-cluster-node-tuning-operator" => &[
                "system:authenticated",
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-cluster-node-tuning-operator",
            ],
            "openshift-machine-config-operator" => &[
                "system:authenticated",
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-machine-config-operator",
            ],
            _ => &[
                "system:authenticated",
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-backplane-srep",
            ],
        }
    };
    // TestCustomDomains' last case: a CustomDomain's resource name in the machine API group.
    let wrong_group = ("machine.openshift.io", "customdomains");
    vec![
        write("a user named kube:system creates a Machine (MCVW: allowed)", Deny, "CREATE", machines, "m").by("kube:system", OAUTH),
        write("MCVW: cluster-admins create a Machine", Deny, "CREATE", machines, "m").by("test-cluster-admin-user", CLUSTER_ADMINS),
        write("MCVW: a regular user creates a Machine", Deny, "CREATE", machines, "m").by("test-user", OAUTH),
        write("a user named kube:system creates a ClusterAutoscaler (MCVW: allowed)", Deny, "CREATE", autoscalers, "default").by("kube:system", OAUTH),
        write("MCVW: a regular user creates a ClusterAutoscaler", Deny, "CREATE", autoscalers, "default").by("test-user", OAUTH),
        write("MCVW: a user named kube:system creates a MachineConfigPool", Deny, "CREATE", mcp, "p").by("kube:system", OAUTH),
        write("MCVW: cluster-admins create a MachineConfigPool", Allow, "CREATE", mcp, "p").by("test-cluster-admin-user", CLUSTER_ADMINS),
        write("MCVW: a regular user creates a MachineConfigPool", Deny, "CREATE", mcp, "p").by("test-user", OAUTH),
        write("a user named backplane-cluster-admin creates a MachineConfig (MCVW: allowed)", Deny, "CREATE", mc, "c").by("backplane-cluster-admin", OAUTH),
        write("MCVW: the node tuning operator creates a MachineConfig", Allow, "CREATE", mc, "c").by("system:serviceaccount:openshift-cluster-node-tuning-operator:cluster-node-tuning-operator", sa_groups("openshift-cluster-node-tuning-operator")),
        write("MCVW: the machine config controller creates a MachineConfig", Allow, "CREATE", mc, "c").by("system:serviceaccount:openshift-machine-config-operator:machine-config-controller", sa_groups("openshift-machine-config-operator")),
        write("MCVW: system:admin creates a MachineConfig", Allow, "CREATE", mc, "c").by("system:admin", &["system:authenticated", "system:masters"]),
        write("SRE's backplane account creates a MachineConfig (MCVW: denied)", Allow, "CREATE", mc, "c").by("system:serviceaccount:openshift-backplane-srep:test-sa", sa_groups("openshift-backplane-srep")),
        write("MCVW: dedicated-admins create customdomains in the machine API group", Deny, "CREATE", wrong_group, "apps2").by("dedi-admin", DEDICATED_ADMINS),
    ]
}

/// TestSubjectPermissionsClusterVersions' ClusterVersion cases.
fn mcvw_cluster_config() -> Vec<Case> {
    use Want::*;
    let cv = ("config.openshift.io", "clusterversions");
    let cvo_groups: &'static [&'static str] = &[
        "system:serviceaccounts",
        "system:serviceaccounts:openshift-cluster-version",
        "system:authenticated",
    ];
    vec![
        write(
            "a user named kube:admin deletes the ClusterVersion (MCVW: allowed)",
            Deny,
            "DELETE",
            cv,
            "version",
        )
        .by("kube:admin", OAUTH),
        write(
            "MCVW: the CVO's default account deletes the ClusterVersion",
            Allow,
            "DELETE",
            cv,
            "version",
        )
        .by(
            "system:serviceaccount:openshift-cluster-version:default",
            cvo_groups,
        ),
        write(
            "MCVW: the CVO updates the ClusterVersion",
            Allow,
            "UPDATE",
            cv,
            "version",
        )
        .by(
            "system:serviceaccount:openshift-cluster-version:cluster-version-operator",
            cvo_groups,
        ),
        write(
            "MCVW: the managed upgrade operator updates the ClusterVersion",
            Allow,
            "UPDATE",
            cv,
            "version",
        )
        .by(
            "system:serviceaccount:openshift-managed-upgrade-operator:managed-upgrade-operator",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-managed-upgrade-operator",
                "system:authenticated",
            ],
        ),
        write(
            "MCVW: a tenant's service account deletes the ClusterVersion",
            Deny,
            "DELETE",
            cv,
            "version",
        )
        .by(
            "system:serviceaccount:hello-world:default",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:hello-world",
                "system:authenticated",
            ],
        ),
        write(
            "MCVW: SRE deletes the ClusterVersion",
            Allow,
            "DELETE",
            cv,
            "version",
        )
        .by("my-user", SRE),
        write(
            "a user named backplane-cluster-admin deletes the ClusterVersion (MCVW: allowed)",
            Deny,
            "DELETE",
            cv,
            "version",
        )
        .by("backplane-cluster-admin", OAUTH),
        write(
            "MCVW: a regular user deletes the ClusterVersion",
            Deny,
            "DELETE",
            cv,
            "version",
        )
        .by("my-user", OAUTH),
    ]
}

/// TestSubjectPermissionsClusterVersions' Scheduler cases.
fn mcvw_schedulers() -> Vec<Case> {
    use Want::*;
    let sched = ("config.openshift.io", "schedulers");
    vec![
        write(
            "a user named kube:admin updates the Scheduler (MCVW: allowed)",
            Deny,
            "UPDATE",
            sched,
            "cluster",
        )
        .by("kube:admin", OAUTH),
        write(
            "MCVW: SRE updates the Scheduler",
            Allow,
            "UPDATE",
            sched,
            "cluster",
        )
        .by("my-user", SRE),
        write(
            "a user named backplane-cluster-admin updates the Scheduler (MCVW: allowed)",
            Deny,
            "UPDATE",
            sched,
            "cluster",
        )
        .by("backplane-cluster-admin", OAUTH),
        write(
            "MCVW: a regular user updates the Scheduler",
            Deny,
            "UPDATE",
            sched,
            "cluster",
        )
        .by("my-user", OAUTH),
    ]
}

/// TestAPIServers' APIServer, KubeAPIServer, OpenShiftAPIServer and Proxy cases.
fn mcvw_api_servers() -> Vec<Case> {
    use Want::*;
    let mut cases = Vec::new();
    for (kind, name) in [
        (("config.openshift.io", "apiservers"), "cluster"),
        (("operator.openshift.io", "kubeapiservers"), "cluster"),
        (("operator.openshift.io", "openshiftapiservers"), "cluster"),
    ] {
        cases.extend([
            write(
                "MCVW: an unauthenticated user updates an API server's config",
                Deny,
                "UPDATE",
                kind,
                name,
            )
            .by("system:unauthenticated", UNAUTHENTICATED),
            write(
                "MCVW: a regular user updates an API server's config",
                Deny,
                "UPDATE",
                kind,
                name,
            )
            .by("my-name", OAUTH),
            write(
                "MCVW: SRE updates an API server's config",
                Allow,
                "UPDATE",
                kind,
                name,
            )
            .by("my-name", SRE),
            write(
                "MCVW: cluster-admins update an API server's config",
                Deny,
                "UPDATE",
                kind,
                name,
            )
            .by("my-name", CLUSTER_ADMINS),
            write(
                "a user named kube:admin updates an API server's config (MCVW: allowed)",
                Deny,
                "UPDATE",
                kind,
                name,
            )
            .by("kube:admin", OAUTH),
        ]);
    }
    let proxy = ("config.openshift.io", "proxies");
    cases.extend([
        write(
            "MCVW: a regular user updates the Proxy",
            Deny,
            "UPDATE",
            proxy,
            "cluster",
        )
        .by("my-name", OAUTH),
        write(
            "MCVW: cluster-admins update the Proxy",
            Deny,
            "UPDATE",
            proxy,
            "cluster",
        )
        .by("my-name", CLUSTER_ADMINS),
        write(
            "MCVW: SRE updates the Proxy",
            Allow,
            "UPDATE",
            proxy,
            "cluster",
        )
        .by("my-name", SRE),
    ]);
    cases
}

/// A ConfigMap write in `ns`.
fn config_map(
    what: &'static str,
    want: Want,
    op: &'static str,
    ns: &'static str,
    name: &'static str,
) -> Case {
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"ca-bundle.crt": "-----BEGIN CERTIFICATE-----"}});
    let c = Case::new(what, want, (op, "", "configmaps", name)).namespaced(ns);
    match op {
        "DELETE" => c.objects(Value::Null, obj),
        "UPDATE" => c.objects(obj.clone(), obj),
        _ => c.objects(obj, Value::Null),
    }
}

/// TestNetNamespacs and TestAPIServers' ConfigMap cases.
fn mcvw_net_namespaces_and_ca_bundle() -> Vec<Case> {
    use Want::*;
    let nn = ("network.openshift.io", "netnamespaces");
    vec![
        write(
            "MCVW: an unauthenticated user updates a NetNamespace",
            Deny,
            "UPDATE",
            nn,
            "openshift-foo",
        )
        .by("system:unauthenticated", UNAUTHENTICATED),
        write(
            "MCVW: a regular user updates a NetNamespace",
            Deny,
            "UPDATE",
            nn,
            "valid-name",
        )
        .by("my-name", OAUTH),
        write(
            "MCVW: dedicated-admins update a NetNamespace of theirs",
            Allow,
            "UPDATE",
            nn,
            "my-name",
        )
        .by("dedi-admin", DEDICATED_ADMINS),
        write(
            "MCVW: dedicated-admins update a platform namespace's NetNamespace",
            Deny,
            "UPDATE",
            nn,
            "openshift-backplane",
        )
        .by("dedi-admin", DEDICATED_ADMINS),
        write(
            "MCVW: SRE updates a platform namespace's NetNamespace",
            Allow,
            "UPDATE",
            nn,
            "openshift-backplane",
        )
        .by("my-name", SRE),
        config_map(
            "MCVW: a regular user creates user-ca-bundle",
            Deny,
            "CREATE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .by("my-name", OAUTH),
        config_map(
            "MCVW: a regular user deletes another ConfigMap of openshift-config",
            Allow,
            "DELETE",
            CA_BUNDLE.0,
            "any-other-config-map",
        )
        .by("my-name", OAUTH),
        config_map(
            "MCVW: cluster-admins update user-ca-bundle",
            Deny,
            "UPDATE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .by("my-name", CLUSTER_ADMINS),
        config_map(
            "MCVW: cluster-admins create a user-ca-bundle of another namespace",
            Allow,
            "CREATE",
            "any-other-namespace",
            CA_BUNDLE.1,
        )
        .by("my-name", CLUSTER_ADMINS),
        config_map(
            "MCVW: SRE creates user-ca-bundle",
            Allow,
            "CREATE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .by("my-name", SRE),
        config_map(
            "MCVW: SRE updates user-ca-bundle",
            Allow,
            "UPDATE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .by("my-name", SRE),
        config_map(
            "MCVW: SRE deletes user-ca-bundle",
            Allow,
            "DELETE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .by("my-name", SRE),
    ]
}

/// The project's own: names as stored, subresources, the customer's admins' limits, the
/// control plane's writes.
fn own_cases() -> Vec<Case> {
    use Want::*;
    let hcco: &'static [&'static str] = &[
        "kubernetes",
        "system:serviceaccounts:openshift",
        "system:authenticated",
    ];
    let mut renamed = config_map(
        "a ConfigMap a tenant's mutation renames to user-ca-bundle",
        Deny,
        "CREATE",
        CA_BUNDLE.0,
        "harmless",
    );
    renamed.object["metadata"]["name"] = json!(CA_BUNDLE.1);
    vec![
        config_map(
            "a collection delete reaching user-ca-bundle",
            Deny,
            "DELETE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .collection(),
        renamed,
        config_map(
            "user-ca-bundle of openshift-config-managed",
            Allow,
            "UPDATE",
            "openshift-config-managed",
            CA_BUNDLE.1,
        ),
        config_map(
            "the hosted-cluster-config operator writes user-ca-bundle",
            Allow,
            "UPDATE",
            CA_BUNDLE.0,
            CA_BUNDLE.1,
        )
        .by("system:hosted-cluster-config", hcco),
        write(
            "the hosted-cluster-config operator writes the ClusterVersion",
            Allow,
            "UPDATE",
            ("config.openshift.io", "clusterversions"),
            "version",
        )
        .by("system:hosted-cluster-config", hcco),
    ]
}

/// The project's own: the other kinds, subresources, the customer's admins' limits.
fn own_kinds() -> Vec<Case> {
    use Want::*;
    let nn = ("network.openshift.io", "netnamespaces");
    vec![
        write(
            "a regular user writes the ClusterVersion's status",
            Deny,
            "UPDATE",
            ("config.openshift.io", "clusterversions"),
            "version",
        )
        .subresource("status"),
        write(
            "a regular user writes a Machine's status",
            Deny,
            "UPDATE",
            ("machine.openshift.io", "machines"),
            "m",
        )
        .subresource("status"),
        write(
            "a regular user creates a CredentialsRequest",
            Deny,
            "CREATE",
            ("cloudcredential.openshift.io", "credentialsrequests"),
            "c",
        ),
        write(
            "a regular user changes an addon",
            Deny,
            "UPDATE",
            ("addons.managed.openshift.io", "addons"),
            "a",
        ),
        write(
            "a regular user creates a MachineAutoscaler",
            Deny,
            "CREATE",
            ("autoscaling.openshift.io", "machineautoscalers"),
            "m",
        ),
        write(
            "the customer's admins delete a NetNamespace (MCVW: denied too)",
            Deny,
            "DELETE",
            nn,
            "my-name",
        )
        .by("dedi-admin", DEDICATED_ADMINS),
        write(
            "the customer's admins name a NetNamespace com",
            Deny,
            "CREATE",
            nn,
            "com",
        )
        .by("dedi-admin", DEDICATED_ADMINS),
        write(
            "the customer's admins update openshift-logging's NetNamespace (a customer namespace)",
            Allow,
            "UPDATE",
            nn,
            "openshift-logging",
        )
        .by("dedi-admin", DEDICATED_ADMINS),
        write(
            "a regular user changes the cluster's Network config (not this guard's)",
            Allow,
            "UPDATE",
            ("config.openshift.io", "networks"),
            "cluster",
        ),
        config_map(
            "a ConfigMap of the customer's",
            Allow,
            "CREATE",
            "team-a",
            "settings",
        ),
    ]
}
