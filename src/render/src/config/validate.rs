//! The guardrails: every problem of a configuration, as sentences an operator can act on
//! (`AgentConfig::problems`, all of them at once), and the bounds the chart's schema shares
//! (`BOUNDS`, `WEBHOOK_TIMEOUT`, `exemption_problem`).

use std::collections::BTreeSet;

use hcp_fleet_guards::catalogue::{GuardEngine, LabelSelectorRequirement, Rule, WebhookDefinition};
use hcp_fleet_guards::identities::IdentityClass;

use super::AgentConfig;

/// A Prometheus duration: one or more `<number><unit>` in the order y, w, d, h, m, s, ms
/// (what the Prometheus Operator's CRD accepts), or `0`.
pub(crate) fn is_prometheus_duration(s: &str) -> bool {
    const UNITS: [&str; 7] = ["y", "w", "d", "h", "m", "s", "ms"];
    if s == "0" {
        return true;
    }
    let mut rest = s;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        // "ms" before "m": the longest unit that matches.
        let Some(i) = (next_unit..UNITS.len())
            .filter(|&i| rest.starts_with(UNITS[i]))
            .max_by_key(|&i| UNITS[i].len())
        else {
            return false;
        };
        rest = &rest[UNITS[i].len()..];
        next_unit = i + 1;
    }
    !s.is_empty()
}

/// A label key (optional DNS-subdomain prefix and `/`, then a name) and value, as the API
/// server checks them.
pub(crate) fn label_problem(key: &str, value: &str) -> Option<String> {
    fn name_ok(n: &str) -> bool {
        n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && n.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    }
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if !name_ok(name) || prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Some(format!("label key {key:?} is not a valid label key"));
    }
    if !value.is_empty() && !name_ok(value) {
        return Some(format!(
            "label {key:?}: value {value:?} is not a valid label value"
        ));
    }
    None
}

/// An integer the agent bounds: where it is in the file, where its schema is (the `$defs`
/// entry of its section, `None` at the top), its bounds and how to read it. The agent's
/// guardrails and the chart's values schema are both made from `BOUNDS`, so helm refuses what
/// the agent would.
pub(crate) struct Bound {
    pub(crate) path: &'static str,
    // Read by `add_guardrails`, for the chart's values schema.
    pub(crate) schema_def: Option<&'static str>,
    pub(crate) field: &'static str,
    pub(crate) min: i64,
    pub(crate) max: Option<i64>,
    get: fn(&AgentConfig) -> i64,
}

impl Bound {
    fn problem(&self, v: i64) -> String {
        match self.max {
            Some(max) => format!("{} must be {} to {max}, got {v}", self.path, self.min),
            None => format!("{} must be at least {}, got {v}", self.path, self.min),
        }
    }
}

/// A hosted webhook's `timeoutSeconds` (the API server allows up to 30; a slow guard stalls
/// every write it sees).
pub(crate) const WEBHOOK_TIMEOUT: std::ops::RangeInclusive<i64> = 1..=5;

pub(crate) const BOUNDS: &[Bound] = &[
    Bound {
        path: "concurrency",
        schema_def: None,
        field: "concurrency",
        min: 1,
        max: None,
        get: |c| i64::from(c.concurrency),
    },
    Bound {
        // Each probe is one dry-run request through each hosted kube-apiserver.
        path: "probeIntervalSeconds",
        schema_def: None,
        field: "probeIntervalSeconds",
        min: 5,
        max: Some(3600),
        get: |c| i64::from(c.probe_interval_seconds),
    },
    Bound {
        path: "managementApi.requestsPerSecond",
        schema_def: Some("ManagementApiConfig"),
        field: "requestsPerSecond",
        min: 1,
        max: Some(10_000),
        get: |c| i64::from(c.management_api.requests_per_second),
    },
    Bound {
        path: "managementApi.burst",
        schema_def: Some("ManagementApiConfig"),
        field: "burst",
        min: 1,
        max: None,
        get: |c| i64::from(c.management_api.burst),
    },
    Bound {
        path: "admission.replicas",
        schema_def: Some("AdmissionConfig"),
        field: "replicas",
        min: 1,
        max: Some(10),
        get: |c| i64::from(c.admission.replicas),
    },
    Bound {
        path: "admission.port",
        schema_def: Some("AdmissionConfig"),
        field: "port",
        min: 1,
        max: Some(65535),
        get: |c| i64::from(c.admission.port),
    },
    Bound {
        path: "hostedAccess.requestTimeoutSeconds",
        schema_def: Some("HostedAccessConfig"),
        field: "requestTimeoutSeconds",
        min: 1,
        max: Some(60),
        get: |c| i64::from(c.hosted_access.request_timeout_seconds),
    },
    Bound {
        path: "certificates.servingLifetimeDays",
        schema_def: Some("CertificateConfig"),
        field: "servingLifetimeDays",
        min: 1,
        max: None,
        get: |c| i64::from(c.certificates.serving_lifetime_days),
    },
    Bound {
        path: "certificates.renewAtRemainingPercent",
        schema_def: Some("CertificateConfig"),
        field: "renewAtRemainingPercent",
        min: 1,
        max: Some(90),
        get: |c| i64::from(c.certificates.renew_at_remaining_percent),
    },
];

/// A label selector expression the API server would accept.
fn selector_expression_ok(e: &LabelSelectorRequirement) -> bool {
    match e.operator.as_str() {
        "In" | "NotIn" => !e.values.is_empty(),
        "Exists" | "DoesNotExist" => e.values.is_empty(),
        _ => false,
    }
}

/// HyperShift control-plane Service names (a guest webhook URL whose host starts with one of
/// these is taken for a control-plane webhook and removed).
const CONTROL_PLANE_SERVICES: &[&str] = &[
    "kube-apiserver",
    "openshift-apiserver",
    "oauth-openshift",
    "openshift-oauth-apiserver",
    "packageserver",
    "etcd",
    "konnectivity",
    "ignition-server",
];

const OPERATIONS: &[&str] = &["*", "CREATE", "UPDATE", "DELETE", "CONNECT"];

/// What the agent installs in a hosted cluster, all in admissionregistration.k8s.io.
const AGENT_HOSTED_RESOURCES: &[&str] = &[
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
];

/// Does this rule reach the objects the agent owns in a hosted cluster (webhook
/// configurations, admission policies and their bindings)?
fn rule_hits_webhook_configs(r: &Rule) -> bool {
    let group = r
        .api_groups
        .iter()
        .any(|g| g == "*" || g == "admissionregistration.k8s.io");
    let resource = r.resources.iter().any(|res| {
        let base = res.split('/').next().unwrap_or(res);
        base == "*" || AGENT_HOSTED_RESOURCES.contains(&base)
    });
    group && resource
}

/// What an exemption entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exempted {
    User,
    Group,
    Namespace,
}

/// The shortest prefix (before a trailing `*`) an exemption may have: anything shorter names
/// no one in particular.
pub(super) const MIN_EXEMPT_PREFIX: usize = 4;

/// Why one exemption entry (`field`'s `entry`) would exempt more than it can mean, if it
/// would: a control character (it renders into CEL and logs), an empty entry, a bare `*` or a
/// prefix too short to mean anything, a user prefix that covers every service account or
/// every `system:` identity, a group pattern (groups are matched by exact name).
pub(crate) fn exemption_problem(field: &str, entry: &str, kind: Exempted) -> Option<String> {
    let why = if entry.chars().any(char::is_control) {
        "holds a control character".to_string()
    } else if entry.trim().is_empty() || entry.trim() != entry {
        "is empty or has surrounding spaces".to_string()
    } else if kind == Exempted::Group && entry.contains('*') {
        "is a pattern; groups are exempt by exact name only".to_string()
    } else if let Some(prefix) = entry.strip_suffix('*') {
        if prefix.contains('*') {
            "has a '*' before its end; only a trailing '*' makes a prefix".to_string()
        } else if prefix.chars().count() < MIN_EXEMPT_PREFIX {
            format!(
                "is a prefix of fewer than {MIN_EXEMPT_PREFIX} characters, which exempts nearly everyone"
            )
        } else if kind == Exempted::User && "system:serviceaccount:".starts_with(prefix) {
            "exempts every service account (or every system: identity) of the cluster".to_string()
        } else {
            return canary_problem(field, entry, kind);
        }
    } else if entry.contains('*') {
        "has a '*' before its end; only a trailing '*' makes a prefix".to_string()
    } else {
        return canary_problem(field, entry, kind);
    };
    Some(format!("{field}: {entry:?} {why}"))
}

/// An entry that exempts the agent's canaries (their user or group) would make every canary
/// pass through, so no guard could be proven.
fn canary_problem(field: &str, entry: &str, kind: Exempted) -> Option<String> {
    use hcp_fleet_guards::canary::{CANARY_GROUP, CANARY_USER};
    let hit = match kind {
        Exempted::User => hcp_fleet_guards::matches(&[entry.to_string()], CANARY_USER),
        Exempted::Group => entry == CANARY_GROUP,
        Exempted::Namespace => false,
    };
    hit.then(|| {
        format!("{field}: {entry:?} exempts the agent's canaries ({CANARY_USER}, group {CANARY_GROUP}), so no canary could prove a guard")
    })
}

fn is_dns_subdomain(s: &str) -> bool {
    hcp_fleet_model::names::validate_dns_name(s).is_ok()
}

impl AgentConfig {
    /// Every guardrail violation, as sentences an operator can act on.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        self.rollout_and_limit_problems(&mut p);
        self.admission_problems(&mut p);
        self.hosted_access_problems(&mut p);
        self.monitoring_and_certificate_problems(&mut p);
        self.disabled_guard_problems(&mut p);
        self.webhook_problems(&mut p);
        p
    }

    /// Concurrency, the rollout, the management API's ceiling, the probe interval.
    fn rollout_and_limit_problems(&self, p: &mut Vec<String>) {
        // Every integer with bounds, from the table the chart's values schema is made from.
        for b in BOUNDS {
            let v = (b.get)(self);
            if v < b.min || b.max.is_some_and(|max| v > max) {
                p.push(b.problem(v));
            }
        }
        let r = &self.rollout;
        if let Err(e) = r.failure_threshold.of(1) {
            p.push(format!("rollout.failureThreshold {e}"));
        }
        if let Err(e) = r.max_unavailable.of(1) {
            p.push(format!("rollout.maxUnavailable {e}"));
        }
        if r.deadline_seconds <= r.soak_seconds {
            p.push(format!(
                "rollout.deadlineSeconds ({}) must exceed soakSeconds ({}): an HCP needs the soak time and more to be done",
                r.deadline_seconds, r.soak_seconds
            ));
        }
        for e in &r.canary_selector.match_expressions {
            if !selector_expression_ok(e) {
                p.push(format!(
                    "rollout.canarySelector: operator {:?} on {:?} with {} value(s) is invalid",
                    e.operator,
                    e.key,
                    e.values.len()
                ));
            }
        }
    }

    /// The admission service: image, replicas, port, Service name, exemptions.
    fn admission_problems(&self, p: &mut Vec<String>) {
        let a = &self.admission;
        if a.image.trim().is_empty() {
            p.push("admission.image must be set".into());
        }
        if !is_dns_subdomain(&a.service_name) || a.service_name.contains('.') {
            p.push(format!(
                "admission.serviceName {:?} must be a DNS-1123 label",
                a.service_name
            ));
        }
        for cp in CONTROL_PLANE_SERVICES {
            if a.service_name.starts_with(cp) {
                p.push(format!(
                    "admission.serviceName {:?} starts with the control-plane Service name {cp:?}; HyperShift would treat its webhooks as its own",
                    a.service_name
                ));
            }
        }
        // Every list that exempts someone is held to the same guardrails, whichever field it
        // is in: the every-guard lists, a class's members, a guard's own additions.
        let mut lists: Vec<(String, &Vec<String>, Exempted)> = vec![
            (
                "admission.exemptUsers".into(),
                &a.exempt_users,
                Exempted::User,
            ),
            (
                "admission.exemptGroups".into(),
                &a.exempt_groups,
                Exempted::Group,
            ),
            (
                "admission.exemptNamespaces".into(),
                &a.exempt_namespaces,
                Exempted::Namespace,
            ),
            (
                "admission.customerNamespaces".into(),
                &a.customer_namespaces,
                Exempted::Namespace,
            ),
        ];
        for class in IdentityClass::ALL {
            let m = a.identity_classes.members(class);
            let at = format!("admission.identityClasses.{}", class.name());
            lists.push((format!("{at}.users"), &m.users, Exempted::User));
            lists.push((format!("{at}.groups"), &m.groups, Exempted::Group));
        }
        for w in &self.webhooks {
            let at = format!("webhooks[{}]", w.name);
            lists.push((format!("{at}.exemptUsers"), &w.exempt_users, Exempted::User));
            lists.push((
                format!("{at}.exemptGroups"),
                &w.exempt_groups,
                Exempted::Group,
            ));
        }
        for (field, entries, kind) in lists {
            p.extend(
                entries
                    .iter()
                    .filter_map(|e| exemption_problem(&field, e, kind)),
            );
        }
    }

    /// Hosted access: the kubeconfig Secret, timeouts, server rewrites and allowed servers.
    fn hosted_access_problems(&self, p: &mut Vec<String>) {
        // The admission configuration names directories under it: the hosted kube-apiserver
        // refuses a relative one, and a path a YAML scalar or the ConfigMap's volume cannot
        // carry as written would be a start-up failure there, not here.
        let m = &self.static_guards.mount_path;
        if !m.starts_with('/')
            || m.len() < 2
            || m.ends_with('/')
            || m.split('/').any(|c| c == "." || c == "..")
            || m.contains("//")
            || !m
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
        {
            p.push(format!(
                "staticGuards.mountPath {m:?} must be an absolute path of letters, digits, '-', '_' and '.', without '.' or '..' parts or a trailing '/'"
            ));
        }
        let h = &self.hosted_access;
        if h.kubeconfig_secret.is_empty() || h.kubeconfig_key.is_empty() {
            p.push("hostedAccess.kubeconfigSecret and kubeconfigKey must be set".into());
        }
        for rw in &h.server_rewrites {
            if rw.from.contains("://") {
                if !rw.to.starts_with("https://") {
                    p.push(format!(
                        "hostedAccess.serverRewrites: {:?} must be an https:// URL (its from is a URL)",
                        rw.to
                    ));
                }
            } else if rw.from.is_empty()
                || !is_dns_subdomain(&rw.from)
                || !is_dns_subdomain(&rw.to.replace("{namespace}", "ns"))
            {
                p.push(format!(
                    "hostedAccess.serverRewrites: from {:?} to {:?} must both be host names (or from a whole URL)",
                    rw.from, rw.to
                ));
            }
        }
        if h.allowed_servers.is_empty() {
            p.push("hostedAccess.allowedServers must name at least one server".into());
        }
        for a in &h.allowed_servers {
            if !a.starts_with("https://") {
                p.push(format!(
                    "hostedAccess.allowedServers: {a:?} must be an https:// URL pattern"
                ));
            }
        }
    }

    /// The admission services' ServiceMonitor and the certificates' lifetimes.
    fn monitoring_and_certificate_problems(&self, p: &mut Vec<String>) {
        let sm = &self.admission.service_monitor;
        if !is_prometheus_duration(&sm.interval) || sm.interval == "0" {
            p.push(format!(
                "admission.serviceMonitor.interval {:?} is not a Prometheus duration such as 30s",
                sm.interval
            ));
        }
        for (k, v) in &sm.labels {
            if let Some(why) = label_problem(k, v) {
                p.push(format!("admission.serviceMonitor.labels: {why}"));
            }
            // The agent finds (and prunes) its objects by these.
            if [
                hcp_fleet_model::names::MANAGED_BY,
                hcp_fleet_model::names::COMPONENT_LABEL,
            ]
            .contains(&k.as_str())
            {
                p.push(format!(
                    "admission.serviceMonitor.labels: {k:?} is the agent's own label"
                ));
            }
        }
        let c = &self.certificates;
        if c.serving_lifetime_days > 0 && c.ca_lifetime_days <= c.serving_lifetime_days {
            p.push("certificates: caLifetimeDays must exceed servingLifetimeDays > 0".into());
        }
    }

    /// Names fully qualified and unique; each path one guard's.
    fn webhook_name_and_path_problems(&self, p: &mut Vec<String>) {
        let mut names = BTreeSet::new();
        let mut paths = std::collections::BTreeMap::new();
        for w in &self.webhooks {
            let at = format!("webhook {:?}", w.name);
            if !is_dns_subdomain(&w.name) || w.name.split('.').count() < 3 {
                p.push(format!(
                    "{at}: name must be a fully qualified DNS name with at least three labels"
                ));
            }
            if !names.insert(&w.name) {
                p.push(format!("{at}: duplicate name"));
            }
            if let Some(first) = paths.get(w.path.as_str()) {
                // Each path is one handler; the usual cause is a renamed copy of a built-in
                // laid beside the built-in itself.
                p.push(format!(
                    "{at}: path {:?} is already guard {first:?}'s; to change that guard, give its entry the name {first:?} (an entry replaces the guard of its name), or turn it off with disabledGuards",
                    w.path
                ));
            } else {
                paths.insert(w.path.as_str(), w.name.as_str());
            }
        }
    }

    /// The webhook definitions: names and paths unique, rules, selectors, engines.
    fn webhook_problems(&self, p: &mut Vec<String>) {
        self.webhook_name_and_path_problems(p);
        for w in &self.webhooks {
            let at = format!("webhook {:?}", w.name);
            if !w.path.starts_with('/')
                || w.path.contains("..")
                || w.path
                    .chars()
                    .any(|ch| ch.is_whitespace() || ch == '?' || ch == '#')
            {
                p.push(format!(
                    "{at}: path {:?} must start with '/' and hold no '..', whitespace, '?' or '#'",
                    w.path
                ));
            }
            engine_problems(w, &at, p);
            if hcp_fleet_guards::for_path(&w.path).is_none() {
                p.push(format!(
                    "{at}: path {:?} has no handler in the admission service (one of {})",
                    w.path,
                    hcp_fleet_guards::paths().collect::<Vec<_>>().join(", ")
                ));
            }
            if !WEBHOOK_TIMEOUT.contains(&i64::from(w.timeout_seconds)) {
                p.push(format!(
                    "{at}: timeoutSeconds must be 1 to 5 (a slow webhook stalls every write), got {}",
                    w.timeout_seconds
                ));
            }
            if w.rules.is_empty() {
                p.push(format!("{at}: needs at least one rule"));
            }
            for (i, r) in w.rules.iter().enumerate() {
                if r.operations.is_empty()
                    || r.api_groups.is_empty()
                    || r.api_versions.is_empty()
                    || r.resources.is_empty()
                {
                    p.push(format!(
                        "{at}: rule {i}: operations, apiGroups, apiVersions and resources must all be non-empty"
                    ));
                }
                // The API server's own rule (admissionregistration validation): `*/*` stands
                // alone, and beside `*` only subresources may be named.
                let whole = |x: &str| r.resources.iter().any(|res| res == x);
                if (whole("*/*") && r.resources.len() > 1)
                    || (whole("*")
                        && r.resources
                            .iter()
                            .any(|res| res != "*" && !res.contains('/')))
                {
                    p.push(format!(
                        "{at}: rule {i}: `*/*` must be the only resource, and beside `*` only subresources may be named"
                    ));
                }
                for op in &r.operations {
                    if !OPERATIONS.contains(&op.as_str()) {
                        p.push(format!("{at}: rule {i}: unknown operation {op:?}"));
                    }
                }
                if rule_hits_webhook_configs(r) {
                    p.push(format!(
                        "{at}: rule {i} matches webhook configurations or admission policies (a guard must never be able to block its own repair)"
                    ));
                }
                if let Some(scope) = &r.scope
                    && !["*", "Cluster", "Namespaced"].contains(&scope.as_str())
                {
                    p.push(format!(
                        "{at}: rule {i}: scope must be *, Cluster or Namespaced"
                    ));
                }
            }
            for sel in [&w.namespace_selector, &w.object_selector]
                .into_iter()
                .flatten()
            {
                for e in &sel.match_expressions {
                    if !selector_expression_ok(e) {
                        p.push(format!(
                            "{at}: selector expression on {:?}: operator {:?} with {} value(s) is invalid",
                            e.key,
                            e.operator,
                            e.values.len()
                        ));
                    }
                }
            }
        }
    }

    /// `disabledGuards`: each name a guard's, once, and never the probe's (a typo would leave
    /// on the guard meant to go).
    fn disabled_guard_problems(&self, p: &mut Vec<String>) {
        for (i, name) in self.disabled_guards.iter().enumerate() {
            if self.disabled_guards[..i].contains(name) {
                p.push(format!("disabledGuards: {name:?} is named more than once"));
            } else if *name == hcp_fleet_guards::probe::ROW.name {
                p.push(format!(
                    "disabledGuards: {name:?} is the probe; it proves the admission path works and cannot be disabled"
                ));
            } else if !self.webhooks.iter().any(|w| w.name == *name) {
                p.push(format!(
                    "disabledGuards: {name:?} is no guard (the guards: {})",
                    self.webhooks
                        .iter()
                        .map(|w| w.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
}

/// `engine: policy` or `static` for a guard with no CEL form: a mutation with one runs as a
/// MutatingAdmissionPolicy, through the API or from files alike.
fn engine_problems(w: &WebhookDefinition, at: &str, p: &mut Vec<String>) {
    let policy_form =
        |p: &str| hcp_fleet_guards::has_cel_form(p) || hcp_fleet_guards::has_mutation_form(p);
    let engine = match w.engine {
        GuardEngine::Policy => "policy",
        GuardEngine::Static => "static",
        GuardEngine::Auto | GuardEngine::Webhook => return,
    };
    if !policy_form(&w.path) {
        p.push(format!(
            "{at}: engine {engine}: the handler on {:?} has no CEL form (only {} can run as an admission policy); use auto or webhook",
            w.path,
            hcp_fleet_guards::paths()
                .filter(|p| policy_form(p))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;

    #[test]
    fn exemptions_that_mean_everyone_or_carry_control_characters_are_refused_by_name() {
        use Exempted::*;
        for (entry, kind, why) in [
            ("*", User, "fewer than 4"),
            ("*", Namespace, "fewer than 4"),
            ("ab*", Namespace, "fewer than 4"),
            ("system:*", User, "every service account"),
            ("system:serviceaccount:*", User, "every service account"),
            ("system:service*", User, "every service account"),
            ("sys*", User, "fewer than 4"),
            ("osd-*", Group, "exact name only"),
            ("a*b", User, "before its end"),
            ("a**", Namespace, "before its end"),
            ("alice\n", User, "control character"),
            ("al\u{7}ice", User, "control character"),
            ("", Group, "empty"),
            (" alice", User, "surrounding spaces"),
            (
                "hcp-fleet.openshift.io:canary",
                User,
                "the agent's canaries",
            ),
            ("hcp-fleet.openshift.io:*", User, "the agent's canaries"),
            ("system:authenticated", Group, "the agent's canaries"),
        ] {
            let p = exemption_problem("admission.exemptUsers", entry, kind)
                .unwrap_or_else(|| panic!("{entry:?} accepted"));
            assert!(
                p.contains(why) && p.starts_with("admission.exemptUsers: "),
                "{entry:?}: {p}"
            );
            assert!(p.contains(&format!("{entry:?}")), "names the entry: {p}");
        }
        for (entry, kind) in [
            ("system:serviceaccount:hypershift:*", User),
            ("system:serviceaccount:openshift-*", User),
            ("system:admin", User),
            ("kube-*", Namespace),
            ("default", Namespace),
            ("system:masters", Group),
        ] {
            assert_eq!(exemption_problem("f", entry, kind), None, "{entry:?}");
        }
        // The defaults pass; a bad entry makes the configuration refused, naming it.
        assert!(AgentConfig::default().problems().is_empty());
        let mut cfg = AgentConfig::default();
        cfg.admission.exempt_namespaces.push("*".into());
        let problems = cfg.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("admission.exemptNamespaces: \"*\"")),
            "{problems:?}"
        );
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(AgentConfig::default().problems(), Vec::<String>::new());
    }

    #[test]
    fn wildcard_resources_are_held_to_the_api_servers_rule() {
        for (resources, refused) in [
            (vec!["*", "*/*"], true),
            (vec!["*/*", "pods"], true),
            (vec!["*", "pods"], true),
            (vec!["*/*"], false),
            (vec!["*", "*/status"], false),
            (vec!["pods", "pods/status"], false),
        ] {
            let mut cfg = AgentConfig::default();
            cfg.webhooks[0].rules[0].resources = resources.iter().map(|r| r.to_string()).collect();
            let said = cfg
                .problems()
                .iter()
                .any(|p| p.contains("`*/*` must be the only resource"));
            assert_eq!(said, refused, "{resources:?}");
        }
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let yaml = r#"
concurrency: 0
admission:
  image: ""
  replicas: 2
  serviceName: kube-apiserver-hooks
  port: 8443
  resources: {cpuRequest: 10m, memoryRequest: 32Mi, memoryLimit: 64Mi}
webhooks:
- name: grabby.example.com
  kind: Validating
  path: /v
  timeoutSeconds: 30
  rules:
  - operations: ["*"]
    apiGroups: ["*"]
    apiVersions: ["*"]
    resources: ["*"]
- name: grabby.example.com
  kind: Mutating
  path: v2
  rules:
  - operations: [DESTROY]
    apiGroups: [admissionregistration.k8s.io]
    apiVersions: [v1]
    resources: [validatingwebhookconfigurations]
"#;
        let err = AgentConfig::from_yaml("c.yaml", yaml).expect_err("invalid");
        let ConfigError::Invalid { problems, .. } = &err else {
            panic!("expected Invalid, got {err}");
        };
        let all = problems.join("\n");
        for needle in [
            "concurrency must be at least 1",
            "admission.image must be set",
            "starts with the control-plane Service name \"kube-apiserver\"",
            "timeoutSeconds must be 1 to 5",
            "rule 0 matches webhook configurations",
            "duplicate name",
            "path \"v2\" must start with '/'",
            "unknown operation \"DESTROY\"",
            "path \"/v\" has no handler in the admission service",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert_eq!(problems.len(), 11, "{all}");
    }

    #[test]
    fn subresource_rules_on_webhook_configs_are_caught() {
        let r = Rule {
            operations: vec!["UPDATE".into()],
            api_groups: vec!["admissionregistration.k8s.io".into()],
            api_versions: vec!["v1".into()],
            resources: vec!["mutatingwebhookconfigurations/status".into()],
            scope: None,
        };
        assert!(rule_hits_webhook_configs(&r));
        let r2 = Rule {
            resources: vec!["pods".into()],
            api_groups: vec!["".into()],
            ..r
        };
        assert!(!rule_hits_webhook_configs(&r2));
    }

    #[test]
    fn prometheus_durations_follow_the_operators_pattern() {
        for ok in ["30s", "1m30s", "500ms", "1h", "2d12h", "0"] {
            assert!(is_prometheus_duration(ok), "{ok}");
        }
        for bad in ["", "30", "s", "30 s", "1s1m", "1ms5s", "-1s", "1.5s"] {
            assert!(!is_prometheus_duration(bad), "{bad}");
        }
    }

    #[test]
    fn service_monitor_settings_are_checked() {
        let yaml = r#"
admission:
  serviceMonitor:
    apiGroup: monitoring.rhobs
    interval: "30"
    labels: {"app.kubernetes.io/managed-by": me, "bad key": x, team: "no spaces"}
"#;
        let err = AgentConfig::from_yaml("c.yaml", yaml).expect_err("invalid");
        let all = err.to_string();
        for needle in [
            "interval \"30\" is not a Prometheus duration",
            "\"app.kubernetes.io/managed-by\" is the agent's own label",
            "label key \"bad key\" is not a valid label key",
            "value \"no spaces\" is not a valid label value",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        let err = AgentConfig::from_yaml(
            "c.yaml",
            "admission: {serviceMonitor: {apiGroup: monitoring.example.com}}\n",
        )
        .expect_err("unknown group");
        assert!(err.to_string().contains("monitoring.example.com"), "{err}");
        let cfg =
            AgentConfig::from_yaml("c.yaml", "admission: {serviceMonitor: {apiGroup: none}}\n")
                .expect("valid");
        assert_eq!(cfg.admission.service_monitor.api_group, MonitoringApi::None);
    }

    #[test]
    fn disabled_guards_are_off_by_name_and_a_wrong_name_is_refused() {
        let builtins = default_webhooks();
        let gone = &builtins[2].name;
        let cfg =
            AgentConfig::from_yaml("f", &format!("disabledGuards: [{gone}]\n")).expect("valid");
        assert_eq!(cfg.webhooks.len(), builtins.len(), "kept, turned off");
        assert!(cfg.active_webhooks().all(|w| &w.name != gone));
        assert_eq!(cfg.active_webhooks().count(), builtins.len() - 1);
        assert!(guard_summary(&cfg).contains(&(gone.clone(), "disabled (disabledGuards)")));
        // Written out and read again: the same configuration.
        let text = serde_saphyr::to_string(&cfg).expect("yaml");
        assert_eq!(AgentConfig::from_yaml("again", &text).expect("valid"), cfg);

        let probe = hcp_fleet_guards::probe::ROW.name;
        let err = AgentConfig::from_yaml(
            "f",
            &format!(
                "disabledGuards: [no-such.guard.io, {probe}, {gone}, {gone}]\nconcurrency: 0\n"
            ),
        )
        .expect_err("refused");
        let text = err.to_string();
        for want in [
            "\"no-such.guard.io\" is no guard",
            "is the probe",
            "is named more than once",
            // Every problem at once: the others' too.
            "concurrency must be at least 1",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
    }
}
