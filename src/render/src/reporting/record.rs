//! Each HCP's health record (`AdmissionHealth`): its status from the last one and this
//! reconcile's observations (`next_status`: an entry and a condition per concern, `Ready` over
//! them), the one Event a report makes, and the pause's bookkeeping.

use std::collections::BTreeMap;

use hcp_fleet_model::crd::conditions;
use hcp_fleet_model::crd::conditions::{Condition, ConditionStatus};
use hcp_fleet_model::crd::{
    AdmissionHealth, AdmissionHealthSpec, AdmissionHealthStatus, ComplianceState, ConcernStatus,
    HistoryEntry,
};

use super::{Concern, Observation, Observations, acm_message, aggregate, event_note};

/// The health record's name in its HCP namespace: the hosted cluster's (the HCP's), so what
/// prints only names (`kubectl wait … --all -A`, its timeout, Events' `regarding`) says which
/// hosted cluster. HyperShift keeps one HCP per namespace.
pub fn health_name(cluster: &str) -> &str {
    cluster
}
/// The name every record had before it was named after its hosted cluster: read once to carry
/// its status over, then deleted (`controller/report.rs`).
pub const LEGACY_HEALTH_NAME: &str = "hcp-fleet-admission";

/// Whether `h` is an HCP's health record (named after its cluster, or by an earlier release),
/// and not some other object of the kind someone made.
pub fn is_health_record(h: &AdmissionHealth) -> bool {
    let name = h.metadata.name.as_deref().unwrap_or_default();
    name == health_name(&h.spec.cluster) || name == LEGACY_HEALTH_NAME
}

pub(crate) const MAX_HISTORY: usize = 10;
/// Label naming the hosted cluster (the HCP's name).
pub const CLUSTER_LABEL: &str = "hcp-fleet.openshift.io/hosted-cluster";

/// The per-HCP health record, without status.
pub fn render_health(
    namespace: &str,
    cluster: &str,
    hosted_uid: Option<&str>,
    owner: Option<&str>,
) -> AdmissionHealth {
    let mut h = AdmissionHealth::new(
        health_name(cluster),
        AdmissionHealthSpec {
            cluster: cluster.to_string(),
            hosted_cluster_uid: hosted_uid.map(str::to_string),
            legacy_hosted_cluster_uid: None,
            owner: owner.map(str::to_string),
        },
    );
    h.metadata.namespace = Some(namespace.to_string());
    h.metadata.labels = Some(BTreeMap::from([
        (
            hcp_fleet_model::names::MANAGED_BY.to_string(),
            hcp_fleet_model::names::MANAGED_BY_VALUE.to_string(),
        ),
        (CLUSTER_LABEL.to_string(), cluster.to_string()),
    ]));
    h
}

/// A history entry that `next_status` added: what an Event should announce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub(crate) concern: String,
    pub(crate) state: ComplianceState,
    pub(crate) message: String,
}

/// The one Event a report of `entries` makes: its state (the worst of them) and note (each
/// `<concern>: <message>`, joined by ` | `, cut to the API's limit). One per report, not one
/// per concern: a thousand HCPs starting at once must not mean thousands of Event writes.
pub fn health_event(entries: &[NewEntry]) -> Option<(ComplianceState, String)> {
    if entries.is_empty() {
        return None;
    }
    let state = aggregate(entries.iter().map(|e| &e.state));
    let note = entries
        .iter()
        .map(|e| format!("{}: {}", e.concern, e.message))
        .collect::<Vec<_>>()
        .join(" | ");
    Some((state, event_note(&note)))
}

/// The entries `next` added on top of `prev`, one per concern at most.
pub fn new_entries(
    prev: Option<&AdmissionHealthStatus>,
    next: &AdmissionHealthStatus,
) -> Vec<NewEntry> {
    next.concerns
        .iter()
        .filter_map(|c| {
            let newest = c.history.first()?;
            let before = prev
                .and_then(|p| p.concerns.iter().find(|x| x.name == c.name))
                .and_then(|x| x.history.first());
            (before != Some(newest)).then(|| NewEntry {
                concern: c.name.clone(),
                state: c.compliant.unwrap_or(ComplianceState::Pending),
                message: newest.message.clone(),
            })
        })
        .collect()
}

/// The next status from the previous one, this reconcile's observations and the drift
/// repairs it made. A concern's history gains an entry only when its message changes, so
/// repeating the same observation is a no-op (no write, no event).
/// The `generation` is the record's own (`metadata.generation`), for `observedGeneration`.
pub fn next_status(
    prev: Option<&AdmissionHealthStatus>,
    obs: &Observations,
    now: &str,
    drift_repaired: u64,
    revision: &str,
    rolled_out: bool,
    generation: Option<i64>,
) -> AdmissionHealthStatus {
    let mut concerns = Vec::new();
    let mut states = Vec::new();
    let prev_conditions = prev.map_or(&[][..], |p| &p.conditions[..]);
    let mut conditions = vec![Condition::default()];
    let mut failing = Vec::new();
    for c in Concern::ALL {
        let name = c.template_name();
        let prev_c = prev.and_then(|p| p.concerns.iter().find(|d| d.name == name));
        let Some(o) = obs.get(&c) else {
            if let Some(d) = prev_c {
                concerns.push(d.clone());
                states.extend(d.compliant);
            }
            // Not looked at in this pass: what was last said about it stands.
            if let Some(kept) = conditions::find(prev_conditions, c.row().condition_type) {
                conditions.push(kept.clone());
                if kept.status != ConditionStatus::True {
                    failing.push((c, kept.message.clone(), kept.status));
                }
            }
            continue;
        };
        conditions.push(conditions::set(
            prev_conditions,
            concern_condition(c, o),
            generation,
            now,
        ));
        if o.state != ComplianceState::Compliant {
            failing.push((c, o.message.clone(), condition_status(o.state)));
        }
        states.push(o.state);
        let msg = acm_message(o.state, &o.message);
        let mut history = prev_c.map(|d| d.history.clone()).unwrap_or_default();
        if history.first().map(|h| h.message.as_str()) != Some(msg.as_str()) {
            history.insert(
                0,
                HistoryEntry {
                    last_timestamp: now.to_string(),
                    message: msg,
                },
            );
            history.truncate(MAX_HISTORY);
        }
        concerns.push(ConcernStatus {
            name: name.to_string(),
            compliant: Some(o.state),
            history,
        });
    }
    let compliant = aggregate(states.iter());
    // Ready on this revision since the first report that found it so; the rollout's soak
    // time runs from here.
    let revision_ready_since = (compliant == ComplianceState::Compliant && rolled_out).then(|| {
        prev.filter(|p| p.revision.as_deref() == Some(revision))
            .and_then(|p| p.revision_ready_since.clone())
            .unwrap_or_else(|| now.to_string())
    });
    conditions[0] = conditions::set(
        prev_conditions,
        ready_condition(compliant, &failing, revision),
        generation,
        now,
    );
    AdmissionHealthStatus {
        observed_generation: generation,
        conditions,
        compliant: Some(compliant),
        concerns,
        drift_repairs: prev.map_or(0, |p| p.drift_repairs) + drift_repaired,
        revision: Some(revision.to_string()),
        revision_ready_since,
        paused_since: None,
        // The agent's report sets what this pass installed, or keeps what the record said.
        guards: prev.map(|p| p.guards.clone()).unwrap_or_default(),
    }
}

/// A compliance state as a condition's status: Pending is not yet known.
pub(crate) fn condition_status(state: ComplianceState) -> ConditionStatus {
    match state {
        ComplianceState::Compliant => ConditionStatus::True,
        ComplianceState::NonCompliant => ConditionStatus::False,
        ComplianceState::Pending => ConditionStatus::Unknown,
    }
}

fn concern_condition(c: Concern, o: &Observation) -> conditions::Want<'static> {
    conditions::Want {
        type_: c.row().condition_type,
        status: condition_status(o.state),
        reason: o.state.as_str(),
        message: o.message.clone(),
    }
}

/// `Ready`: why not names each concern that is not, the first NonCompliant one (else the first)
/// in the reason (`HostedWebhooksNotReady`), so `kubectl get` shows what to look at, not a
/// concern left unchecked because of it.
fn ready_condition(
    compliant: ComplianceState,
    failing: &[(Concern, String, ConditionStatus)],
    revision: &str,
) -> conditions::Want<'static> {
    let first = failing
        .iter()
        .find(|(_, _, s)| *s == ConditionStatus::False)
        .or(failing.first());
    let reason = match (compliant, first) {
        (ComplianceState::Compliant, _) => "Compliant",
        (ComplianceState::NonCompliant, Some((c, ..))) => c.row().not_ready_reason,
        (ComplianceState::NonCompliant, None) => "NonCompliant",
        (ComplianceState::Pending, _) => "Pending",
    };
    let message = if compliant == ComplianceState::Compliant {
        format!("every concern is Compliant on revision {revision}")
    } else if failing.is_empty() {
        "nothing observed yet".to_string()
    } else {
        // NonCompliant concerns first: they are why it is not Ready.
        let mut parts: Vec<_> = failing.iter().collect();
        parts.sort_by_key(|(_, _, s)| *s != ConditionStatus::False);
        parts
            .iter()
            .map(|(c, m, _)| format!("{}: {m}", c.template_name()))
            .collect::<Vec<_>>()
            .join("; ")
    };
    conditions::Want {
        type_: READY,
        status: condition_status(compliant),
        reason,
        message,
    }
}

/// The health record's summary condition.
pub const READY: &str = "Ready";

/// Since when an HCP paused now has been paused: the recorded start, or now for a new pause;
/// `None` once it is not.
pub fn paused_since(
    prev: Option<&AdmissionHealthStatus>,
    paused: bool,
    now: &str,
) -> Option<String> {
    paused.then(|| {
        prev.and_then(|p| p.paused_since.clone())
            .unwrap_or_else(|| now.to_string())
    })
}

/// Whether a pause that began at `since` (RFC 3339, as recorded) has outlived `max_hours`
/// (0: no maximum) at `now`.
pub fn pause_expired(since: Option<&str>, max_hours: u32, now: jiff::Timestamp) -> bool {
    let Some(since) = since.and_then(|s| s.parse::<jiff::Timestamp>().ok()) else {
        return false;
    };
    max_hours > 0 && now.as_second() - since.as_second() > i64::from(max_hours) * 3600
}

/// When a pause that began at `since` (RFC 3339, as recorded; `None`: it begins `now`) stops
/// holding under `max_hours` (0: never). A paused HCP waits for no event (its drift watch is
/// dropped), so the reconcile comes back by then, or the pause would hold for ever.
pub fn pause_ends(
    since: Option<&str>,
    max_hours: u32,
    now: jiff::Timestamp,
) -> Option<jiff::Timestamp> {
    if max_hours == 0 {
        return None;
    }
    let start = since
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .unwrap_or(now);
    start
        .checked_add(jiff::SignedDuration::from_hours(i64::from(max_hours)))
        .ok()
}

/// The `reason` label of a pause: who asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseReason {
    /// The agent's annotation on the HCP.
    Annotation,
    /// HyperShift's own `spec.pausedUntil`.
    HyperShift,
    /// A `HostedAdmissionOverride` with `paused: true`.
    Override,
}

impl PauseReason {
    pub const ALL: [PauseReason; 3] = [
        PauseReason::Annotation,
        PauseReason::HyperShift,
        PauseReason::Override,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::Annotation => "annotation",
            PauseReason::HyperShift => "hypershift",
            PauseReason::Override => "override",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reporting::tests::all;
    use crate::reporting::*;

    #[test]
    fn a_record_is_named_after_its_cluster_and_an_earlier_name_is_still_known() {
        let h = render_health("clusters-hc-1", "hc-1", None, None);
        assert_eq!(h.metadata.name.as_deref(), Some("hc-1"));
        assert!(is_health_record(&h));
        let mut old = h.clone();
        old.metadata.name = Some(LEGACY_HEALTH_NAME.into());
        assert!(is_health_record(&old));
        // Another object of the kind, named after nothing the agent writes: not a record.
        let mut other = h;
        other.metadata.name = Some("notes".into());
        assert!(!is_health_record(&other));
    }

    #[test]
    fn same_observation_twice_is_a_no_op() {
        let o = all(ComplianceState::Compliant, "fine");
        let s1 = next_status(None, &o, "2026-01-01T00:00:00Z", 0, "r1", true, None);
        let s2 = next_status(Some(&s1), &o, "2026-01-01T00:05:00Z", 0, "r1", true, None);
        assert_eq!(s1, s2);
        assert_eq!(s1.compliant, Some(ComplianceState::Compliant));
        assert_eq!(s1.concerns.len(), 4);
        assert_eq!(s1.revision.as_deref(), Some("r1"));
    }

    #[test]
    fn ready_on_a_revision_since_the_first_report_that_found_it_so() {
        let ok = all(ComplianceState::Compliant, "fine");
        let s1 = next_status(None, &ok, "t1", 0, "r1", false, None);
        assert_eq!(
            s1.revision_ready_since, None,
            "its Deployment has not rolled out"
        );
        let s2 = next_status(Some(&s1), &ok, "t2", 0, "r1", true, None);
        let s3 = next_status(Some(&s2), &ok, "t3", 0, "r1", true, None);
        assert_eq!(s3.revision_ready_since.as_deref(), Some("t2"));
        let s4 = next_status(Some(&s3), &ok, "t4", 0, "r2", true, None);
        assert_eq!(
            s4.revision_ready_since.as_deref(),
            Some("t4"),
            "a new revision starts again"
        );
        let bad = all(ComplianceState::NonCompliant, "down");
        let s5 = next_status(Some(&s4), &bad, "t5", 0, "r2", true, None);
        assert_eq!(s5.revision_ready_since, None);
    }

    #[test]
    fn conditions_say_ready_and_which_concern_is_not() {
        let ok = all(ComplianceState::Compliant, "fine");
        let s1 = next_status(None, &ok, "t1", 0, "r1", true, Some(1));
        let ready = conditions::find(&s1.conditions, READY).expect("Ready");
        assert_eq!(
            (
                ready.status,
                ready.reason.as_str(),
                ready.observed_generation
            ),
            (ConditionStatus::True, "Compliant", Some(1))
        );
        assert_eq!(s1.conditions.len(), 5, "Ready and one per concern");
        assert_eq!(s1.observed_generation, Some(1));
        for c in Concern::ALL {
            let cond = conditions::find(&s1.conditions, c.row().condition_type).expect("concern");
            assert_eq!(
                (cond.status, cond.message.as_str()),
                (ConditionStatus::True, "fine")
            );
        }
        let mut broken = ok.clone();
        broken.insert(Concern::EndToEndProbe, Observation::pending("probing"));
        // Pending before it in the order: the reason still names what is NonCompliant.
        broken.insert(Concern::AdmissionService, Observation::pending("waiting"));
        broken.insert(
            Concern::HostedWebhooks,
            Observation::violation("webhook missing"),
        );
        let s2 = next_status(Some(&s1), &broken, "t2", 0, "r1", true, Some(1));
        let ready = conditions::find(&s2.conditions, READY).expect("Ready");
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!(ready.reason, "HostedWebhooksNotReady");
        assert_eq!(
            ready.message,
            "hosted-webhooks: webhook missing; admission-service: waiting; e2e-probe: probing"
        );
        assert_eq!(ready.last_transition_time, "t2");
        let probe = conditions::find(&s2.conditions, "EndToEndProbeReady").expect("probe");
        assert_eq!(
            (probe.status, probe.reason.as_str()),
            (ConditionStatus::Unknown, "Pending")
        );
        let cert = conditions::find(&s2.conditions, "CertificateReady").expect("cert");
        assert_eq!(
            cert.last_transition_time, "t1",
            "unchanged since the first pass"
        );
        // A pass that looks at one concern only keeps what the others last said.
        let only = BTreeMap::from([(Concern::Certificate, Observation::compliant("fine"))]);
        let s3 = next_status(Some(&s2), &only, "t3", 0, "r1", true, Some(1));
        assert_eq!(s3.conditions, s2.conditions, "nothing new was seen");
    }

    #[test]
    fn a_pause_with_a_maximum_ends_by_itself() {
        let now: jiff::Timestamp = "2026-11-25T12:00:00Z".parse().expect("t");
        assert_eq!(
            pause_ends(Some("2026-11-25T10:00:00Z"), 0, now),
            None,
            "no maximum"
        );
        assert_eq!(
            pause_ends(Some("2026-11-25T10:00:00Z"), 3, now).map(|t| t.to_string()),
            Some("2026-11-25T13:00:00Z".into())
        );
        assert_eq!(
            pause_ends(None, 1, now).map(|t| t.to_string()),
            Some("2026-11-25T13:00:00Z".into()),
            "a pause not yet recorded begins now"
        );
    }

    #[test]
    fn drift_repairs_add_up_across_reconciles() {
        let o = all(ComplianceState::Compliant, "fine");
        let s1 = next_status(None, &o, "t1", 2, "r", true, None);
        let s2 = next_status(Some(&s1), &o, "t2", 3, "r", true, None);
        assert_eq!((s1.drift_repairs, s2.drift_repairs), (2, 5));
    }

    #[test]
    fn history_is_newest_first_and_bounded() {
        let mut s = None;
        for i in 0..15 {
            let o = all(ComplianceState::NonCompliant, &format!("problem {i}"));
            s = Some(next_status(
                s.as_ref(),
                &o,
                &format!("2026-01-01T00:00:{i:02}Z"),
                0,
                "r",
                true,
                None,
            ));
        }
        let s = s.expect("status");
        let h = &s.concerns[0].history;
        assert_eq!(h.len(), MAX_HISTORY);
        assert_eq!(h[0].message, "NonCompliant; violation - problem 14");
        assert_eq!(h[0].last_timestamp, "2026-01-01T00:00:14Z");
        assert_eq!(h[9].message, "NonCompliant; violation - problem 5");
    }

    #[test]
    fn the_record_keeps_pending_whatever_acms_crd_says() {
        let o = all(ComplianceState::Pending, "waiting");
        let s = next_status(None, &o, "t", 0, "r", true, None);
        assert_eq!(s.compliant, Some(ComplianceState::Pending));
    }

    #[test]
    fn one_report_makes_one_event_with_its_worst_state() {
        let e = |c: &str, state, m: &str| NewEntry {
            concern: c.into(),
            state,
            message: m.into(),
        };
        assert_eq!(health_event(&[]), None);
        let (state, note) = health_event(&[
            e(
                "certificate",
                ComplianceState::Compliant,
                "Compliant; notification - ok",
            ),
            e(
                "e2e-probe",
                ComplianceState::NonCompliant,
                "NonCompliant; violation - no answer",
            ),
        ])
        .expect("event");
        assert_eq!(state, ComplianceState::NonCompliant);
        assert_eq!(
            note,
            "certificate: Compliant; notification - ok | e2e-probe: NonCompliant; violation - no answer"
        );
        let long = "x".repeat(2000);
        let (_, note) =
            health_event(&[e("e2e-probe", ComplianceState::Pending, &long)]).expect("event");
        assert!(note.len() <= MAX_EVENT_NOTE);
    }

    #[test]
    fn a_pause_expires_only_past_its_maximum() {
        let now: jiff::Timestamp = "2026-01-03T00:00:00Z".parse().expect("t");
        let since = Some("2026-01-01T00:00:00Z");
        assert!(!pause_expired(since, 0, now), "no maximum");
        assert!(
            !pause_expired(since, 48, now),
            "exactly 48 h is not past 48 h"
        );
        assert!(pause_expired(since, 47, now));
        assert!(
            !pause_expired(None, 1, now),
            "a pause not yet recorded is new"
        );
        assert!(!pause_expired(Some("garbage"), 1, now));
    }

    /// A pause's start is kept while it lasts (across reports and restarts: it is in the
    /// record), and dropped when it ends.
    #[test]
    fn a_pause_keeps_its_start_until_it_ends() {
        let prev = |since: Option<&str>| AdmissionHealthStatus {
            paused_since: since.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(paused_since(None, true, "t1").as_deref(), Some("t1"));
        assert_eq!(
            paused_since(Some(&prev(Some("t0"))), true, "t1").as_deref(),
            Some("t0")
        );
        assert_eq!(paused_since(Some(&prev(Some("t0"))), false, "t1"), None);
        assert_eq!(
            paused_since(Some(&prev(None)), true, "t2").as_deref(),
            Some("t2")
        );
    }

    #[test]
    fn new_entries_are_only_the_changes() {
        let a = all(ComplianceState::Compliant, "fine");
        let s1 = next_status(None, &a, "t1", 0, "r", true, None);
        assert_eq!(new_entries(None, &s1).len(), 4);
        let mut b = a.clone();
        b.insert(Concern::HostedWebhooks, Observation::violation("down"));
        let s2 = next_status(Some(&s1), &b, "t2", 0, "r", true, None);
        let e = new_entries(Some(&s1), &s2);
        assert_eq!(
            e,
            vec![NewEntry {
                concern: "hosted-webhooks".into(),
                state: ComplianceState::NonCompliant,
                message: "NonCompliant; violation - down".into(),
            }]
        );
        assert!(new_entries(Some(&s2), &s2).is_empty());
    }

    #[test]
    fn status_never_holds_empty_strings() {
        // The test bed (and some API servers) turn "" into null in status merge patches.
        let o = all(ComplianceState::Compliant, "fine");
        let s = next_status(None, &o, "2026-01-01T00:00:00Z", 0, "r", true, None);
        let text = serde_json::to_string(&s).expect("json");
        assert!(!text.contains("\"\""), "{text}");
    }
}
