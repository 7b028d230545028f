//! Reporting, ACM-style (docs/reporting.md): one Policy per HCP with a template per
//! concern and bounded history, and a fleet roll-up Policy with a row per hosted cluster.
//!
//! Everything here is pure; the controller reads the current status, calls `next_status` and
//! writes only when the result differs, so a steady fleet causes no writes.

use std::collections::BTreeMap;

use serde_json::json;

use crate::crd::policy::TemplateMeta;
use crate::crd::{
    ClusterCompliance, ComplianceHistory, ComplianceState, Policy, PolicySpec, PolicyStatus,
    TemplateDetails,
};

pub const POLICY_NAME: &str = "hcp-fleet-admission";
pub const ROLLUP_NAME: &str = "hcp-fleet-rollup";
pub const MAX_HISTORY: usize = 10;
/// Policy annotation holding the drift repairs so far (survives agent restarts).
pub const DRIFT_ANNOTATION: &str = "hcp-fleet.openshift.io/drift-repairs";
/// Policy label naming the hosted cluster (the HCP's name).
pub const CLUSTER_LABEL: &str = "hcp-fleet.openshift.io/hosted-cluster";

/// The concerns, in the order they appear in the Policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Concern {
    AdmissionService,
    Certificate,
    HostedWebhooks,
    EndToEndProbe,
}

impl Concern {
    pub const ALL: [Concern; 4] = [
        Concern::AdmissionService,
        Concern::Certificate,
        Concern::HostedWebhooks,
        Concern::EndToEndProbe,
    ];

    pub fn template_name(self) -> &'static str {
        match self {
            Concern::AdmissionService => "admission-service",
            Concern::Certificate => "certificate",
            Concern::HostedWebhooks => "hosted-webhooks",
            Concern::EndToEndProbe => "e2e-probe",
        }
    }
}

/// What one reconcile found for one concern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub state: ComplianceState,
    pub message: String,
}

impl Observation {
    pub fn compliant(msg: impl Into<String>) -> Self {
        Self {
            state: ComplianceState::Compliant,
            message: msg.into(),
        }
    }
    pub fn violation(msg: impl Into<String>) -> Self {
        Self {
            state: ComplianceState::NonCompliant,
            message: msg.into(),
        }
    }
    pub fn pending(msg: impl Into<String>) -> Self {
        Self {
            state: ComplianceState::Pending,
            message: msg.into(),
        }
    }
}

pub type Observations = BTreeMap<Concern, Observation>;

/// Any NonCompliant wins, then Pending, else Compliant; nothing observed is Pending.
pub fn aggregate<'a>(states: impl IntoIterator<Item = &'a ComplianceState>) -> ComplianceState {
    let mut any = false;
    let mut pending = false;
    for s in states {
        any = true;
        match s {
            ComplianceState::NonCompliant => return ComplianceState::NonCompliant,
            ComplianceState::Pending => pending = true,
            ComplianceState::Compliant => {}
        }
    }
    if pending || !any {
        ComplianceState::Pending
    } else {
        ComplianceState::Compliant
    }
}

/// A state as the installed CRD accepts it: older ACM CRDs have no Pending in their enum.
pub fn writable(state: ComplianceState, pending_supported: bool) -> ComplianceState {
    if state == ComplianceState::Pending && !pending_supported {
        ComplianceState::NonCompliant
    } else {
        state
    }
}

/// ACM's history message form.
pub fn acm_message(state: ComplianceState, msg: &str) -> String {
    match state {
        ComplianceState::Compliant => format!("Compliant; notification - {msg}"),
        ComplianceState::Pending => format!("Pending; notification - {msg}"),
        ComplianceState::NonCompliant => format!("NonCompliant; violation - {msg}"),
    }
}

/// The API server refuses an Event whose note exceeds 1 KiB (events.k8s.io/v1); a long
/// violation (a TLS error chain, a list of refused fields) would lose its whole Event.
pub const MAX_EVENT_NOTE: usize = 1024;

/// `message` cut to `MAX_EVENT_NOTE` bytes on a character boundary, marked with an ellipsis
/// when cut. The full message stays in the Policy's history.
pub fn event_note(message: &str) -> String {
    if message.len() <= MAX_EVENT_NOTE {
        return message.to_string();
    }
    const MORE: &str = "…";
    let mut end = MAX_EVENT_NOTE - MORE.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MORE}", &message[..end])
}

/// The per-HCP Policy's spec: one ConfigurationPolicy template per concern.
pub fn render_policy(namespace: &str, cluster: &str) -> Policy {
    let templates = Concern::ALL
        .iter()
        .map(|c| crate::crd::PolicyTemplate {
            object_definition: json!({
                "apiVersion": "policy.open-cluster-management.io/v1",
                "kind": "ConfigurationPolicy",
                "metadata": {"name": c.template_name()},
                "spec": {"remediationAction": "enforce", "severity": "high"},
            }),
        })
        .collect();
    let mut p = Policy::new(
        POLICY_NAME,
        PolicySpec {
            disabled: false,
            remediation_action: Some("enforce".into()),
            policy_templates: templates,
        },
    );
    p.metadata.namespace = Some(namespace.to_string());
    p.metadata.labels = Some(BTreeMap::from([
        (
            crate::management::MANAGED_BY.to_string(),
            crate::management::MANAGED_BY_VALUE.to_string(),
        ),
        (CLUSTER_LABEL.to_string(), cluster.to_string()),
    ]));
    p
}

/// A history entry that `next_status` added: what an Event should announce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub template: String,
    pub compliant: bool,
    pub message: String,
}

/// The entries `next` added on top of `prev`, one per template at most.
pub fn new_entries(prev: Option<&PolicyStatus>, next: &PolicyStatus) -> Vec<NewEntry> {
    next.details
        .iter()
        .filter_map(|d| {
            let newest = d.history.first()?;
            let before = prev
                .and_then(|p| {
                    p.details
                        .iter()
                        .find(|x| x.template_meta.name == d.template_meta.name)
                })
                .and_then(|x| x.history.first());
            (before != Some(newest)).then(|| NewEntry {
                template: d.template_meta.name.clone(),
                compliant: d.compliant.as_deref() == Some("Compliant"),
                message: newest.message.clone(),
            })
        })
        .collect()
}

/// The next status from the previous one and this reconcile's observations. A template's
/// history gains an entry only when its message changes, so repeating the same observation
/// is a no-op (no write, no event).
pub fn next_status(
    namespace: &str,
    prev: Option<&PolicyStatus>,
    obs: &Observations,
    now: &str,
    pending_supported: bool,
) -> PolicyStatus {
    let mut details = Vec::new();
    let mut states = Vec::new();
    for c in Concern::ALL {
        let name = c.template_name();
        let prev_d = prev.and_then(|p| p.details.iter().find(|d| d.template_meta.name == name));
        let Some(o) = obs.get(&c) else {
            if let Some(d) = prev_d {
                details.push(d.clone());
                if let Some(s) = d.compliant.as_deref().and_then(parse_state) {
                    states.push(s);
                }
            }
            continue;
        };
        let state = writable(o.state, pending_supported);
        states.push(state);
        let msg = acm_message(state, &o.message);
        let mut history = prev_d.map(|d| d.history.clone()).unwrap_or_default();
        if history.first().map(|h| h.message.as_str()) != Some(msg.as_str()) {
            history.insert(
                0,
                ComplianceHistory {
                    event_name: format!("{namespace}.{POLICY_NAME}.{name}"),
                    last_timestamp: now.to_string(),
                    message: msg,
                },
            );
            history.truncate(MAX_HISTORY);
        }
        details.push(TemplateDetails {
            compliant: Some(state.as_str().to_string()),
            template_meta: TemplateMeta {
                name: name.to_string(),
            },
            history,
        });
    }
    let overall = writable(aggregate(states.iter()), pending_supported);
    PolicyStatus {
        compliant: Some(overall.as_str().to_string()),
        details,
        status: Vec::new(),
    }
}

pub fn parse_state(s: &str) -> Option<ComplianceState> {
    match s {
        "Compliant" => Some(ComplianceState::Compliant),
        "NonCompliant" => Some(ComplianceState::NonCompliant),
        "Pending" => Some(ComplianceState::Pending),
        _ => None,
    }
}

/// One hosted cluster's row in the roll-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupRow {
    pub cluster_name: String,
    pub state: ComplianceState,
}

/// The roll-up status: a row per hosted cluster (sorted by namespace), aggregated as ACM does.
pub fn rollup_status(rows: &BTreeMap<String, RollupRow>, pending_supported: bool) -> PolicyStatus {
    let status = rows
        .iter()
        .map(|(ns, r)| ClusterCompliance {
            clustername: r.cluster_name.clone(),
            clusternamespace: ns.clone(),
            compliant: Some(writable(r.state, pending_supported).as_str().to_string()),
        })
        .collect();
    let overall = if rows.is_empty() {
        ComplianceState::Compliant
    } else {
        aggregate(rows.values().map(|r| &r.state))
    };
    PolicyStatus {
        compliant: Some(writable(overall, pending_supported).as_str().to_string()),
        details: Vec::new(),
        status,
    }
}

pub fn render_rollup(namespace: &str) -> Policy {
    let mut p = Policy::new(
        ROLLUP_NAME,
        PolicySpec {
            disabled: false,
            remediation_action: Some("inform".into()),
            policy_templates: Vec::new(),
        },
    );
    p.metadata.namespace = Some(namespace.to_string());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_fit_the_apis_limit() {
        assert_eq!(
            event_note("NonCompliant; violation - short"),
            "NonCompliant; violation - short"
        );
        for long in [
            "x".repeat(5000),
            "é".repeat(3000),
            format!("a{}", "€".repeat(600)),
        ] {
            let n = event_note(&long);
            assert!(n.len() <= MAX_EVENT_NOTE, "{}", n.len());
            assert!(n.ends_with('…'));
            assert!(long.starts_with(n.trim_end_matches('…')));
        }
        let exact = "y".repeat(MAX_EVENT_NOTE);
        assert_eq!(event_note(&exact), exact);
    }

    fn all(state: ComplianceState, msg: &str) -> Observations {
        Concern::ALL
            .iter()
            .map(|c| {
                (
                    *c,
                    Observation {
                        state,
                        message: msg.to_string(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn aggregation_is_acm_like() {
        use ComplianceState::*;
        assert_eq!(aggregate(&[Compliant, Pending, NonCompliant]), NonCompliant);
        assert_eq!(aggregate(&[Compliant, Pending]), Pending);
        assert_eq!(aggregate(&[Compliant, Compliant]), Compliant);
        assert_eq!(aggregate(&[]), Pending);
    }

    #[test]
    fn messages_take_acms_form() {
        assert_eq!(
            acm_message(ComplianceState::Compliant, "ok"),
            "Compliant; notification - ok"
        );
        assert_eq!(
            acm_message(ComplianceState::NonCompliant, "x"),
            "NonCompliant; violation - x"
        );
    }

    #[test]
    fn same_observation_twice_is_a_no_op() {
        let o = all(ComplianceState::Compliant, "fine");
        let s1 = next_status("ns", None, &o, "2026-01-01T00:00:00Z", true);
        let s2 = next_status("ns", Some(&s1), &o, "2026-01-01T00:05:00Z", true);
        assert_eq!(s1, s2);
        assert_eq!(s1.compliant.as_deref(), Some("Compliant"));
        assert_eq!(s1.details.len(), 4);
    }

    #[test]
    fn history_is_newest_first_and_bounded() {
        let mut s = None;
        for i in 0..15 {
            let o = all(ComplianceState::NonCompliant, &format!("problem {i}"));
            s = Some(next_status(
                "ns",
                s.as_ref(),
                &o,
                &format!("2026-01-01T00:00:{i:02}Z"),
                true,
            ));
        }
        let s = s.expect("status");
        let h = &s.details[0].history;
        assert_eq!(h.len(), MAX_HISTORY);
        assert_eq!(h[0].message, "NonCompliant; violation - problem 14");
        assert_eq!(h[9].message, "NonCompliant; violation - problem 5");
        assert_eq!(h[0].event_name, "ns.hcp-fleet-admission.admission-service");
    }

    #[test]
    fn pending_maps_to_noncompliant_on_old_crds() {
        let o = all(ComplianceState::Pending, "waiting");
        let s = next_status("ns", None, &o, "t", false);
        assert_eq!(s.compliant.as_deref(), Some("NonCompliant"));
        assert!(
            s.details
                .iter()
                .all(|d| d.compliant.as_deref() == Some("NonCompliant"))
        );
        let s = next_status("ns", None, &o, "t", true);
        assert_eq!(s.compliant.as_deref(), Some("Pending"));
    }

    #[test]
    fn rollup_rows_and_aggregate() {
        let mut rows = BTreeMap::new();
        rows.insert(
            "clusters-a".into(),
            RollupRow {
                cluster_name: "a".into(),
                state: ComplianceState::Compliant,
            },
        );
        rows.insert(
            "clusters-b".into(),
            RollupRow {
                cluster_name: "b".into(),
                state: ComplianceState::NonCompliant,
            },
        );
        let s = rollup_status(&rows, true);
        assert_eq!(s.compliant.as_deref(), Some("NonCompliant"));
        assert_eq!(s.status.len(), 2);
        assert_eq!(s.status[0].clustername, "a");
        assert_eq!(s.status[1].clusternamespace, "clusters-b");
        let json = serde_json::to_value(&s).expect("json");
        assert!(
            json["status"][0].get("clustername").is_some(),
            "lower-case keys: {json}"
        );
        rows.remove("clusters-b");
        assert_eq!(
            rollup_status(&rows, true).compliant.as_deref(),
            Some("Compliant")
        );
    }

    #[test]
    fn new_entries_are_only_the_changes() {
        let a = all(ComplianceState::Compliant, "fine");
        let s1 = next_status("ns", None, &a, "t1", true);
        assert_eq!(new_entries(None, &s1).len(), 4);
        let mut b = a.clone();
        b.insert(Concern::HostedWebhooks, Observation::violation("down"));
        let s2 = next_status("ns", Some(&s1), &b, "t2", true);
        let e = new_entries(Some(&s1), &s2);
        assert_eq!(
            e,
            vec![NewEntry {
                template: "hosted-webhooks".into(),
                compliant: false,
                message: "NonCompliant; violation - down".into(),
            }]
        );
        assert!(new_entries(Some(&s2), &s2).is_empty());
    }

    #[test]
    fn status_never_holds_empty_strings() {
        // The test bed (and some API servers) turn "" into null in status merge patches.
        let o = all(ComplianceState::Compliant, "fine");
        let s = next_status("ns", None, &o, "2026-01-01T00:00:00Z", true);
        let text = serde_json::to_string(&s).expect("json");
        assert!(!text.contains("\"\""), "{text}");
    }
}
