//! The guards: one file per guard, each one `Guard` that carries everything about it, its
//! catalogue row (name, route, rules, default mode), its decision in Rust (the admission
//! service), its decision in CEL (a ValidatingAdmissionPolicy inside the hosted
//! kube-apiserver), whom it exempts, and the table of cases every engine must decide as the
//! table says (`hosted::cel_cases` runs them through the service's handler and the rendered
//! policy; the e2e suite through the real service over TLS and, where served, real policies).
//!
//! Adding a guard is one file here and one line in `ALL`.
//!
//! Beside the guards: the catalogue's vocabulary (`catalogue`), the AdmissionReview types every
//! engine reads (`review`), and the build's one crypto library (`crypto`: the probe's HMAC, the
//! agent's digests, the rustls provider).

use serde_json::Value;

use crate::review::Decision;

use crate::catalogue::{BuiltinRow, WebhookDefinition};
use crate::review::Request;

pub mod canary;
pub mod case;
pub mod catalogue;
pub mod cel;
pub mod crypto;
pub mod featuregate;
pub mod identities;
pub mod identity_groups;
pub mod identity_namespaces;
pub mod identity_workloads;
pub mod ingress_config;
pub mod managed_groups;
pub mod network_migration;
pub mod platform_bindings;
pub mod platform_config;
pub mod pod_image_spec;
pub mod probe;
pub mod protected_rbac;
pub mod review;
pub mod scc;
pub mod service_accounts;
pub mod service_annotation;
pub mod service_tags;
pub mod settings;
pub mod traffic;

pub use case::{Case, Want};
pub use settings::{HookSetting, Settings};

/// Whom a guard leaves alone, beyond its exempt identities (`exempt_classes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Its exempt identities, the exempt namespaces and the control plane's namespaces (by the
    /// namespace selector): for a guard of the cluster's workloads (the Service mutation),
    /// which has nothing to protect in the platform's own namespaces.
    Workloads,
    /// Its exempt identities only: a guard whose objects live in the platform's namespaces
    /// too (a managed object in `openshift-managed-upgrade-operator`), or that keeps the
    /// exemptions themselves from being minted (creating a service account in `openshift-x` is
    /// how one would mint an exempt identity), and whose namespace selector cannot lean on
    /// labels a cluster-admin can put on a namespace they create.
    Identities,
    /// No one: the probe answers whoever asks.
    Everyone,
}

/// A guard's decision in CEL: `expression` is true where the request is admitted;
/// `message` is a CEL string expression saying what the Rust handler says on a denial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CelForm {
    pub expression: String,
    pub message: String,
}

/// A mutation in CEL, for the MutatingAdmissionPolicy engine: `applies` is true where the
/// request needs the change (the policy's last matchCondition), `apply_configuration` the
/// change as an apply configuration (`Object{…}`, merged by the API server as server-side apply
/// merges). The Rust handler's JSON patch and this change leave the object alike: every
/// case of the guard's table, through both (`hosted::cel_mutation_cases` in render).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MutationForm {
    pub applies: String,
    /// The policy's `variables` (name, expression), in order: what `apply_configuration` reads
    /// as `variables.<name>` (matchConditions cannot read them).
    pub variables: Vec<(String, String)>,
    pub apply_configuration: String,
}

/// One guard. `decide` and `cel` see only requests that the rules, selectors and exemptions
/// let through; `hcp_fleet_webhook::decision::decide` and
/// `hcp_fleet_render::hosted::admission_policies` apply those and the mode.
pub trait Guard: Sync {
    /// Name, route, rules and default mode: what the default definition is made of.
    fn row(&self) -> &'static BuiltinRow;

    /// The decision, before exemptions and the mode.
    fn decide(&self, req: &Request, s: &Settings) -> Decision;

    /// The same decision in CEL, for the ValidatingAdmissionPolicy engine. `None`, whatever
    /// the settings, for a guard CEL cannot carry (it stays a webhook).
    fn cel(&self, s: &Settings) -> Option<CelForm>;

    /// A mutating guard's change in CEL, for the MutatingAdmissionPolicy engine. `None` for a
    /// validating guard and for a mutation CEL cannot carry (it stays a webhook).
    fn mutation(&self, s: &Settings) -> Option<MutationForm> {
        let _ = s;
        None
    }

    /// Whether an engine may give this mutation to a MutatingAdmissionPolicy: its change has a
    /// CEL form, though under some settings there is nothing to change (`mutation` is `None`
    /// there, and no policy is rendered: nothing needs one).
    fn mutates_in_cel(&self) -> bool {
        self.mutation(&Settings::default()).is_some()
    }

    /// Requests this guard must deny and requests it must allow, under the default
    /// configuration. Every engine is held to the same table.
    fn cases(&self) -> Vec<Case>;

    fn scope(&self) -> Scope {
        Scope::Workloads
    }

    /// The identity classes whose work this guard would otherwise block, and so leaves alone
    /// unless the configuration says otherwise (`webhooks[].exemptClasses`).
    fn exempt_classes(&self) -> &'static [identities::IdentityClass] {
        identities::DEFAULT_CLASSES
    }

    /// A dry-run request this guard must deny (a mutation: change, `canary::Effect`) from
    /// `canary::CANARY_USER` under `s` (the agent's canary for it); `None` where none can be
    /// sent without side effects or without a namespace the cluster may lack, or the guard
    /// acts on nothing (the probe).
    fn canary(&self, s: &Settings) -> Option<canary::Canary> {
        let _ = s;
        None
    }
}

/// Every guard, in the order their webhooks appear in the hosted configurations.
pub static ALL: &[&dyn Guard] = &[
    &protected_rbac::ProtectedRbac,
    &featuregate::FeatureGate,
    &scc::Scc,
    &ingress_config::IngressConfig,
    &network_migration::NetworkMigration,
    &managed_groups::ManagedGroups,
    &platform_config::PlatformConfig,
    &identity_groups::IdentityGroups,
    &identity_namespaces::IdentityNamespaces,
    &identity_workloads::IdentityWorkloads,
    &service_accounts::ServiceAccounts,
    &platform_bindings::PlatformBindings,
    &probe::Probe,
    &service_annotation::ServiceAnnotation,
    &service_tags::ServiceTags,
    &pod_image_spec::PodImageSpec,
];

/// The guard served on `path`, if any.
pub fn for_path(path: &str) -> Option<&'static dyn Guard> {
    ALL.iter().copied().find(|g| g.row().path == path)
}

/// Does the guard served on `path` have a CEL form (so it can run as an admission policy)?
pub fn has_cel_form(path: &str) -> bool {
    static FORMS: Forms = std::sync::OnceLock::new();
    per_guard(&FORMS, path, |g| g.cel(&Settings::default()).is_some())
}

/// One settings-free answer per guard, by path, worked out once for the process.
type Forms = std::sync::OnceLock<Vec<(&'static str, bool)>>;

/// The guard on `path`'s answer to `of`, from `forms` (filled at the first question; a path
/// no guard serves: `false`). Whether a guard has a CEL form or a CEL change does not depend on
/// the settings, and writing the CEL out is most of what asking costs. Each HCP's render asks
/// for every guard, and at 3,000 HCPs a restarted agent spent a twentieth of its CPU writing
/// CEL only to throw it away (`cargo bench --bench scale`, perf).
fn per_guard(forms: &'static Forms, path: &str, of: fn(&dyn Guard) -> bool) -> bool {
    forms
        .get_or_init(|| ALL.iter().map(|g| (g.row().path, of(*g))).collect())
        .iter()
        .find(|(p, _)| *p == path)
        .is_some_and(|(_, yes)| *yes)
}

/// Does the guard served on `path` have a mutation in CEL (so it can run as a mutating
/// admission policy)? `Guard::mutates_in_cel`.
pub fn has_mutation_form(path: &str) -> bool {
    static FORMS: Forms = std::sync::OnceLock::new();
    per_guard(&FORMS, path, |g| g.mutates_in_cel())
}

/// Whom the guard served on `path` leaves alone (a path no guard serves: the default).
pub fn scope_of(path: &str) -> Scope {
    for_path(path).map_or(Scope::Workloads, |g| g.scope())
}

/// Every path the admission service serves a guard on.
pub fn paths() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|g| g.row().path)
}

/// The guards' default definitions, in order.
pub fn definitions() -> Vec<WebhookDefinition> {
    ALL.iter().map(|g| g.row().definition()).collect()
}

/// `s` matches one of `patterns`: exact names, or prefixes ending in '*'.
pub fn matches(patterns: &[String], s: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => s.starts_with(prefix),
        None => p == s,
    })
}

/// The part of the object `part` picks is the same before and after the request.
pub(crate) fn unchanged(req: &Request, part: impl Fn(&Value) -> Value) -> bool {
    let pick = |o: Option<&Value>| o.map(&part);
    pick(req.object()) == pick(req.old_object())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_guard_has_a_unique_name_and_path_and_is_found_by_it() {
        let names: BTreeSet<_> = ALL.iter().map(|g| g.row().name).collect();
        let paths: BTreeSet<_> = paths().collect();
        assert_eq!(names.len(), ALL.len());
        assert_eq!(paths.len(), ALL.len());
        for g in ALL {
            let found = for_path(g.row().path).expect("found");
            assert_eq!(found.row().name, g.row().name);
        }
        assert!(for_path("/nope").is_none());
    }

    #[test]
    fn every_guard_has_cases_that_deny_and_allow() {
        for g in ALL {
            let cases = g.cases();
            for want in [Want::Deny, Want::Allow] {
                assert!(
                    cases.iter().any(|c| c.want == want),
                    "{}: no case that expects {want:?}",
                    g.row().name
                );
            }
        }
    }

    /// Every operation a guard's rules send it has a case, and where DELETE is among them, a
    /// collection delete: the API server sends one DELETE per object with no name in the
    /// request, the object in `oldObject`, so a guard that judged the request's name alone
    /// would let every protected object of a collection go.
    #[test]
    fn every_guard_has_a_case_for_each_operation_it_receives_and_for_collection_deletes() {
        for g in ALL {
            let cases = g.cases();
            let ops: BTreeSet<&str> = g
                .row()
                .rules
                .iter()
                .flat_map(|r| r.operations.iter().copied())
                .collect();
            for op in &ops {
                assert!(
                    cases.iter().any(|c| c.op == *op),
                    "{}: no case for {op}",
                    g.row().name
                );
            }
            if ops.contains("DELETE") {
                assert!(
                    cases.iter().any(|c| c.op == "DELETE"
                        && c.name.is_empty()
                        && c.want == Want::Deny
                        && c.old["metadata"]["name"].is_string()),
                    "{}: no collection delete (DELETE, no name, the object in oldObject) it denies",
                    g.row().name
                );
            }
        }
    }
}

#[cfg(test)]
mod docs {
    /// docs/admission.md lists every guard, with its path and name, and no guard that is gone.
    #[test]
    fn the_admission_doc_lists_every_guard() {
        let doc = include_str!("../../../docs/admission.md");
        let rows: Vec<&str> = doc
            .lines()
            .filter(|l| l.starts_with("| `/validate/") || l.starts_with("| `/mutate/"))
            .collect();
        assert_eq!(rows.len(), super::ALL.len(), "{rows:#?}");
        for g in super::ALL {
            let row = g.row();
            assert!(
                rows.iter()
                    .any(|r| r.starts_with(&format!("| `{}` | {} |", row.path, row.name))),
                "docs/admission.md has no row for {} on {}",
                row.name,
                row.path
            );
        }
    }
}
