//! The webhook catalogue's vocabulary: what a webhook definition is, a guard's row, the labels
//! and answers of the probe, and the words the guards deny with.
//!
//! A leaf module (it names nothing else in the crate). The guards themselves, each with its
//! row, are `crate`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use hcp_fleet_model::Mode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum WebhookKind {
    Validating,
    Mutating,
}

/// Which path carries a guard in the hosted kube-apiserver (docs/configuration.md).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum GuardEngine {
    /// The best path the hosted cluster offers the guard: the static guards where its
    /// kube-apiserver mounts their files and they are proven in force (docs/static-guards.md),
    /// else an admission policy where served and the guard has a CEL form, else the webhook.
    #[default]
    Auto,
    /// Always the webhook (the admission service is called).
    Webhook,
    /// A ValidatingAdmissionPolicy; only for guards with a CEL form. Where the hosted cluster
    /// does not serve them, the webhook guards instead and the health record says so.
    Policy,
    /// A Validating or MutatingAdmissionPolicy the hosted kube-apiserver loads from files
    /// (`.static.k8s.io`, docs/static-guards.md), which no API request can change; only for
    /// guards with a CEL form. Where the static guards are not in force, what `auto` chooses
    /// through the API guards instead and the health record says why.
    Static,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
pub enum FailurePolicy {
    #[default]
    Ignore,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookDefinition {
    /// Fully qualified webhook name, e.g. `protected-rbac.hcp-fleet.openshift.io`.
    pub name: String,
    pub kind: WebhookKind,
    /// The admission service's path for this webhook, e.g. `/validate/protected-rbac`.
    pub path: String,
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    #[serde(default = "default_timeout")]
    pub timeout_seconds: i32,
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    pub object_selector: Option<LabelSelector>,
    #[serde(default)]
    pub mode: Mode,
    /// `auto`, `webhook` or `policy` (a ValidatingAdmissionPolicy evaluated inside the hosted
    /// kube-apiserver, for the built-ins with a CEL form).
    #[serde(default)]
    pub engine: GuardEngine,
    /// The identity classes this guard leaves alone (`admission.identityClasses`); absent: the
    /// guard's own (docs/configuration.md lists them per guard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exempt_classes: Option<Vec<crate::identities::IdentityClass>>,
    /// More users this guard alone leaves alone: exact names, or prefixes ending in '*'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt_users: Vec<String>,
    /// More groups this guard alone leaves alone (exact names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt_groups: Vec<String>,
}

fn default_timeout() -> i32 {
    2
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    pub operations: Vec<String>,
    pub api_groups: Vec<String>,
    pub api_versions: Vec<String>,
    pub resources: Vec<String>,
    #[serde(default)]
    pub scope: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Objects carrying this label are the agent's end-to-end probe: always answered with a
/// denial naming the service, whatever the mode or the user.
pub const PROBE_LABEL: &str = "hcp-fleet.openshift.io/probe";
pub const PROBE_ANSWER: &str = "hcp-fleet-admission answered the end-to-end probe";
/// `PROBE_LABEL` with this value reaches the agent's probe ValidatingAdmissionPolicy instead
/// of the probe webhook (`hosted::admission_policies`).
pub const POLICY_PROBE_VALUE: &str = "policy";
pub const POLICY_PROBE_ANSWER: &str = "hcp-fleet admission policies answered the end-to-end probe";
/// `PROBE_LABEL` with this value reaches the agent's probe MutatingAdmissionPolicy, which
/// answers by writing the revision its binding selects into `MUTATING_PROBE_ANSWER` (the
/// request is a dry run: nothing is stored).
pub const MUTATING_PROBE_VALUE: &str = "mutating-policy";
pub const MUTATING_PROBE_ANSWER: &str = "hcp-fleet.openshift.io/probe-mutated";
/// `PROBE_LABEL` with this value reaches the static mutating probe (`hosted::static_guards`):
/// a MutatingAdmissionPolicy loaded from files whose patch fails on purpose, so the server
/// denies in its own words, naming the policy, which no API object can be named
/// (`controller::proof::judge_static_mutating`).
pub const STATIC_MUTATING_PROBE_VALUE: &str = "static-mutating-policy";
/// The revision of the path a probe request must reach: the probe webhook and the probe
/// policy binding select it, so an answer proves the API server runs that revision.
pub const PROBE_REVISION_LABEL: &str = "hcp-fleet.openshift.io/probe-revision";

/// API groups that belong to the managed service's own operators.
pub const MANAGED_API_GROUPS: &[&str] = &[
    "managed.openshift.io",
    "upgrade.managed.openshift.io",
    "ocmagent.managed.openshift.io",
    "splunkforwarder.managed.openshift.io",
    "cloudingress.managed.openshift.io",
];

/// The SecurityContextConstraints OpenShift ships; changing them weakens every workload.
pub const DEFAULT_SCCS: &[&str] = &[
    "anyuid",
    "hostaccess",
    "hostmount-anyuid",
    "hostnetwork",
    "hostnetwork-v2",
    "machine-api-termination-handler",
    "node-exporter",
    "nonroot",
    "nonroot-v2",
    "privileged",
    "restricted",
    "restricted-v2",
];

/// What the guards say when they deny, as templates with `{placeholders}`: the admission
/// service fills them in Rust (`fill`), an admission policy builds the same text in CEL
/// (`hosted::admission_policies`), so a user reads one message whichever engine answered.
pub mod denial {
    pub(crate) const PROTECTED_RBAC: &str = "hcp-fleet: deleting the protected {kind} \"{name}\" is not allowed on a managed cluster; ask SRE if it must go";
    pub const FEATURE_GATE: &str = "hcp-fleet: featureSet TechPreviewNoUpgrade is not allowed on a managed cluster: it cannot be undone and blocks upgrades";
    pub(crate) const SCC: &str = "hcp-fleet: {verb} the default SecurityContextConstraints \"{name}\" is not allowed on a managed cluster; create your own SCC instead";
    pub(crate) const INGRESS_CONFIG: &str = "hcp-fleet: {verb} the ingress config \"{name}\" is not allowed on a managed cluster; its domain and load balancer are set by the service";
    pub(crate) const NETWORK_MIGRATION: &str = "hcp-fleet: spec.migration of the cluster network operator is not allowed on a managed cluster; network migrations are run by SRE";
    pub(crate) const MANAGED_GROUPS: &str = "hcp-fleet: {resource} in API group {group} is managed by the service; regular users may not {operation} it";
    pub(crate) const IDENTITY_GROUP: &str = "hcp-fleet: {verb} the Group \"{name}\" is not allowed on a managed cluster: its members are exempt from the guards; ask SRE";
    pub(crate) const IDENTITY_NAMESPACE: &str = "hcp-fleet: creating the namespace \"{name}\" is not allowed on a managed cluster: the name is reserved for the platform, whose identities are exempt from the guards";
    pub(crate) const IDENTITY_TOKEN: &str = "hcp-fleet: {what} in the namespace \"{namespace}\" is not allowed on a managed cluster: service accounts there are exempt from the guards";
    pub(crate) const SERVICE_ACCOUNT: &str = "hcp-fleet: deleting the service account \"{name}\" in the namespace \"{namespace}\" is not allowed on a managed cluster: the platform's components run as it; ask SRE";
    pub(crate) const PLATFORM_BINDING: &str = "hcp-fleet: {verb} the ClusterRoleBinding \"{name}\" is not allowed on a managed cluster: it grants {subject} of the platform its rights; ask SRE";
    pub(crate) const PLATFORM_CONFIG: &str = "hcp-fleet: {resource} \"{name}\" in API group {group} is managed by the service on a managed cluster; regular users may not {operation} it; ask SRE";
    pub(crate) const IDENTITY_WORKLOAD: &str = "hcp-fleet: running a pod as the service account \"{sa}\" in the namespace \"{namespace}\" is not allowed on a managed cluster: it is exempt from the guards";
    /// Warn mode: what the guard would have denied.
    pub const WARN: &str = "{guard} (warn mode) would deny: {message}";
    /// Warn mode: a mutation that would have changed the object.
    pub const WOULD_MUTATE: &str = "{guard} (warn mode) would have mutated this object";

    /// The template with each `{key}` replaced by its value (a placeholder without one
    /// stays as written). One pass, so a value that itself holds `{key}` is never replaced.
    pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
        // Written into one buffer sized for the whole: a string per piece, collected, was most
        // of a denial's cost (`make bench`, perf: every denial fills one).
        let room = values.iter().map(|(_, v)| v.len()).sum::<usize>();
        let mut out = String::with_capacity(template.len() + room);
        for p in pieces(template) {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Value(k) => match values.iter().find(|(key, _)| *key == k) {
                    Some((_, v)) => out.push_str(v),
                    None => {
                        out.push('{');
                        out.push_str(k);
                        out.push('}');
                    }
                },
            }
        }
        out
    }

    /// The pieces of a template: literal text and placeholder names, in order.
    pub(crate) fn pieces(template: &str) -> impl Iterator<Item = Piece<'_>> {
        let mut rest = template;
        let mut value = None;
        std::iter::from_fn(move || {
            if let Some(k) = value.take() {
                return Some(Piece::Value(k));
            }
            if rest.is_empty() {
                return None;
            }
            let placeholder = rest.find('{').and_then(|open| {
                let after = &rest[open + 1..];
                after
                    .find('}')
                    .map(|close| (open, &after[..close], &after[close + 1..]))
            });
            match placeholder {
                Some((0, k, after)) => {
                    rest = after;
                    Some(Piece::Value(k))
                }
                Some((open, k, after)) => {
                    let text = &rest[..open];
                    rest = after;
                    value = Some(k);
                    Some(Piece::Text(text))
                }
                None => Some(Piece::Text(std::mem::take(&mut rest))),
            }
        })
    }

    #[derive(Debug, PartialEq, Eq)]
    pub(crate) enum Piece<'a> {
        Text(&'a str),
        Value(&'a str),
    }
}

/// One admission rule, as a guard's row writes it.
pub(crate) struct RuleRow {
    pub(crate) operations: &'static [&'static str],
    pub(crate) api_groups: &'static [&'static str],
    pub(crate) resources: &'static [&'static str],
}

/// One guard's catalogue row (`crate`): its route, and everything its default
/// definition needs.
pub struct BuiltinRow {
    pub name: &'static str,
    pub(crate) kind: WebhookKind,
    /// The admission service's route, and the path in the hosted webhook's URL.
    pub path: &'static str,
    pub(crate) rules: &'static [RuleRow],
    pub(crate) mode: Mode,
    /// Only objects carrying this label (`=true`) reach it.
    pub(crate) only_labelled: Option<&'static str>,
}

pub(crate) const fn rule(
    operations: &'static [&'static str],
    api_groups: &'static [&'static str],
    resources: &'static [&'static str],
) -> RuleRow {
    RuleRow {
        operations,
        api_groups,
        resources,
    }
}

impl BuiltinRow {
    /// The default definition the agent installs in a hosted cluster.
    pub fn definition(&self) -> WebhookDefinition {
        let strings = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        WebhookDefinition {
            name: self.name.into(),
            kind: self.kind,
            path: self.path.into(),
            rules: self
                .rules
                .iter()
                .map(|r| Rule {
                    operations: strings(r.operations),
                    api_groups: strings(r.api_groups),
                    api_versions: vec!["*".into()],
                    resources: strings(r.resources),
                    scope: None,
                })
                .collect(),
            failure_policy: FailurePolicy::Ignore,
            timeout_seconds: default_timeout(),
            namespace_selector: None,
            object_selector: self.only_labelled.map(|label| LabelSelector {
                match_labels: BTreeMap::from([(label.to_string(), "true".to_string())]),
                match_expressions: Vec::new(),
            }),
            mode: self.mode,
            engine: GuardEngine::Auto,
            exempt_classes: None,
            exempt_users: Vec::new(),
            exempt_groups: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_sees_only_labelled_objects() {
        let d = crate::probe::ROW.definition();
        let sel = d.object_selector.expect("selector");
        assert_eq!(
            sel.match_labels.get(PROBE_LABEL).map(String::as_str),
            Some("true")
        );
        assert!(
            crate::protected_rbac::ROW
                .definition()
                .object_selector
                .is_none()
        );
    }

    #[test]
    fn denial_templates_fill_once_and_split_into_text_and_values() {
        use denial::{Piece, fill, pieces};
        assert_eq!(
            fill(denial::SCC, &[("verb", "deleting"), ("name", "{name}")]),
            "hcp-fleet: deleting the default SecurityContextConstraints \"{name}\" is not allowed on a managed cluster; create your own SCC instead"
        );
        assert_eq!(
            pieces("a {x} b {y}").collect::<Vec<_>>(),
            [
                Piece::Text("a "),
                Piece::Value("x"),
                Piece::Text(" b "),
                Piece::Value("y")
            ]
        );
        assert_eq!(
            pieces(denial::FEATURE_GATE).collect::<Vec<_>>(),
            [Piece::Text(denial::FEATURE_GATE)]
        );
        // What is not a placeholder stays text: an unclosed brace, braces back to back.
        assert_eq!(fill("a {x", &[("x", "1")]), "a {x");
        assert_eq!(fill("{x}{y}{z}", &[("x", "1"), ("y", "2")]), "12{z}");
        assert_eq!(
            pieces("{x}} {").collect::<Vec<_>>(),
            [Piece::Value("x"), Piece::Text("} {")]
        );
    }
}
