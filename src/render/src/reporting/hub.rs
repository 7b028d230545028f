//! What ACM's hub is told: the verdict of each `AdmissionHealthPolicy` template, the fleet's
//! summary on the management cluster's own and each hosted cluster's row on its hosted-mode one
//! (docs/reporting.md, "What an SRE sees on the hub"), and the bookkeeping of the compliance
//! Events status-sync turns into the hub's history.

use std::collections::BTreeMap;

use kube::Resource;

use hcp_fleet_model::crd::health::{ObjectMeta, ObjectRef, RelatedObject};
use hcp_fleet_model::crd::{AdmissionHealth, AdmissionHealthPolicyStatus, ComplianceState};

use super::record::health_name;
use super::{Observations, acm_message, aggregate, cut, event_note};

/// What earlier releases wrote outside ACM's flow, removed once at start: a Policy of this
/// name in every HCP namespace, and the roll-up Policy in the agent's namespace.
pub const LEGACY_POLICY_NAME: &str = "hcp-fleet-admission";
pub const LEGACY_ROLLUP_NAME: &str = "hcp-fleet-rollup";

/// A state as the installed CRD accepts it: older ACM CRDs have no Pending in their enum.
pub(crate) fn writable(state: ComplianceState, pending_supported: bool) -> ComplianceState {
    if state == ComplianceState::Pending && !pending_supported {
        ComplianceState::NonCompliant
    } else {
        state
    }
}

/// The longest reason one hosted cluster's row carries in a template's status: a thousand rows
/// of whole TLS error chains would near etcd's 1.5 MiB object limit, and the full text is in
/// that cluster's health record, which the row names.
pub(crate) const MAX_ROW_REASON: usize = 300;

/// One hosted cluster's row in the fleet report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupRow {
    pub cluster_name: String,
    pub state: ComplianceState,
    /// Why, when not Compliant: each such concern and its message.
    pub(crate) reason: String,
}

/// The row of one hosted cluster from its observations: NonCompliant concerns first (the row's
/// reason is cut at a length, and they are why), then the others not Compliant.
pub fn rollup_row(cluster: &str, obs: &Observations) -> RollupRow {
    let state = aggregate(obs.values().map(|o| &o.state));
    let mut failing: Vec<_> = obs
        .iter()
        .filter(|(_, o)| o.state != ComplianceState::Compliant)
        .collect();
    failing.sort_by_key(|(_, o)| o.state != ComplianceState::NonCompliant);
    let reason = failing
        .iter()
        .map(|(c, o)| format!("{}: {}", c.template_name(), o.message))
        .collect::<Vec<_>>()
        .join("; ");
    RollupRow {
        cluster_name: cluster.to_string(),
        state,
        reason,
    }
}

/// ACM's label on the templates its framework addon syncs: the managed cluster they are for.
pub(crate) const ACM_CLUSTER_NAME_LABEL: &str = "policy.open-cluster-management.io/cluster-name";

/// The ACM managed cluster a template reports, when it is a hosted-mode one: with hosted-mode
/// addons, ACM's framework addon for hosted cluster X runs on the management cluster in
/// `klusterlet-X`, and template-sync creates the template there labelled with X. Any other
/// template (the management cluster's own) reports the fleet.
pub fn hosted_cluster_of<'a>(
    namespace: &str,
    labels: &'a BTreeMap<String, String>,
) -> Option<&'a str> {
    let x = labels.get(ACM_CLUSTER_NAME_LABEL)?;
    (namespace.strip_prefix("klusterlet-") == Some(x.as_str()) && !x.is_empty()).then_some(x)
}

/// How the hub's rows name one hosted cluster: as the hub knows it (the managed cluster, where
/// it has one) and the HCP it maps to, `spoke-a (HCP clusters-hc-1/hc-1)`; without a managed
/// cluster, `HCP clusters-hc-1/hc-1`. The same in a hosted cluster's own row and in the
/// fleet's summary, so one cluster reads the same everywhere on the hub.
pub(crate) fn row_name(managed: Option<&str>, hcp_namespace: &str, hcp: &str) -> String {
    match managed {
        Some(m) => format!("{m} (HCP {hcp_namespace}/{hcp})"),
        None => format!("HCP {hcp_namespace}/{hcp}"),
    }
}

/// A hosted-mode template's verdict: the one hosted cluster it is for, as its own row on the
/// hub. `hcp` is the HCP namespace managed cluster `cluster` maps to
/// (`managed_clusters::resolve`), or why it maps to none (its `Unmapped`, unnamed here:
/// `managed_clusters` cuts its texts with this module's `cut`): a row that silently read
/// Compliant for a cluster the agent does not guard would be a lie, so that is NonCompliant and
/// says so.
/// A HostedCluster whose HCP the agent has not reported yet is Pending.
pub fn evaluate_cluster_template(
    rows: &BTreeMap<String, RollupRow>,
    cluster: &str,
    hcp: Result<&str, &dyn std::fmt::Display>,
    pending_supported: bool,
) -> AdmissionHealthPolicyStatus {
    let (state, summary, related) = match hcp.map(|ns| (ns, rows.get(ns))) {
        Ok((ns, Some(r))) => {
            let name = row_name(Some(cluster), ns, &r.cluster_name);
            let summary = if r.state == ComplianceState::Compliant {
                format!("{name}: the admission guards are installed, current and proven")
            } else {
                format!("{name} {}: {}", r.state.as_str(), r.reason)
            };
            let related = RelatedObject {
                object: ObjectRef {
                    api_version: AdmissionHealth::api_version(&()).into_owned(),
                    kind: AdmissionHealth::kind(&()).into_owned(),
                    metadata: ObjectMeta {
                        name: health_name(&r.cluster_name).into(),
                        namespace: ns.to_string(),
                    },
                },
                compliant: Some(r.state),
                reason: Some(cut(&summary, MAX_ROW_REASON)),
            };
            (r.state, summary, vec![related])
        }
        Ok((ns, None)) => (
            ComplianceState::Pending,
            format!(
                "managed cluster {cluster} is the HostedCluster whose control plane is in {ns}; no hosted control plane there is reported yet"
            ),
            Vec::new(),
        ),
        Err(why) => (ComplianceState::NonCompliant, why.to_string(), Vec::new()),
    };
    let state = writable(state, pending_supported);
    AdmissionHealthPolicyStatus {
        compliant: Some(state),
        message: Some(event_note(&acm_message(state, &summary))),
        related_objects: related,
        history: Vec::new(),
    }
}

/// How many hosted clusters the fleet summary names: the worst, each with a related object.
/// The summary counts the rest; each hosted cluster's detail is its own AdmissionHealth and,
/// with hosted-mode addons, its own row on the hub.
pub(crate) const SUMMARY_WORST: usize = 5;

/// The management cluster's `AdmissionHealthPolicy` template: a summary of the fleet (counts,
/// and the few worst hosted clusters, each with a related object and its reason), its status
/// and the message of its compliance Event. It used to carry one related object per hosted
/// cluster, a status the size of the fleet rewritten at every change; the per-cluster detail
/// now lives in each hosted cluster's own row (`evaluate_cluster_template`).
///
/// `halt`: why the progressive rollout is halted, while it is. The hub must hear of it: the
/// verdict is NonCompliant and the message begins with it, even when every hosted cluster is
/// back on the last good revision and Compliant.
pub fn evaluate_template(
    rows: &BTreeMap<String, RollupRow>,
    managed: &BTreeMap<String, String>,
    pending_supported: bool,
    halt: Option<&str>,
) -> AdmissionHealthPolicyStatus {
    // Worst first: NonCompliant, then Pending, each in namespace order.
    let rank = |s: ComplianceState| match s {
        ComplianceState::NonCompliant => 0,
        ComplianceState::Pending => 1,
        ComplianceState::Compliant => 2,
    };
    let mut bad: Vec<(&String, &RollupRow)> = rows
        .iter()
        .filter(|(_, r)| r.state != ComplianceState::Compliant)
        .collect();
    bad.sort_by_key(|(ns, r)| (rank(r.state), ns.as_str()));
    let worst = &bad[..bad.len().min(SUMMARY_WORST)];
    let related_objects = worst
        .iter()
        .map(|(ns, r)| RelatedObject {
            object: ObjectRef {
                api_version: AdmissionHealth::api_version(&()).into_owned(),
                kind: AdmissionHealth::kind(&()).into_owned(),
                metadata: ObjectMeta {
                    name: health_name(&r.cluster_name).into(),
                    namespace: (*ns).clone(),
                },
            },
            compliant: Some(r.state),
            reason: Some(cut(
                &format!(
                    "{}: {}",
                    row_name(managed.get(*ns).map(String::as_str), ns, &r.cluster_name),
                    r.reason
                ),
                MAX_ROW_REASON,
            )),
        })
        .collect();
    // No hosted cluster yet is nothing wrong: a management cluster may be empty.
    let state = if rows.is_empty() {
        ComplianceState::Compliant
    } else {
        aggregate(rows.values().map(|r| &r.state))
    };
    let count = |s: ComplianceState| rows.values().filter(|r| r.state == s).count();
    let total = rows.len();
    let summary = match state {
        ComplianceState::Compliant => {
            format!("{total} of {total} hosted cluster(s) compliant")
        }
        _ => {
            let named: Vec<String> = worst
                .iter()
                .map(|(ns, r)| {
                    format!(
                        "{} {}: {}",
                        row_name(managed.get(*ns).map(String::as_str), ns, &r.cluster_name),
                        r.state.as_str(),
                        cut(&r.reason, MAX_ROW_REASON)
                    )
                })
                .collect();
            let more = match bad.len() - worst.len() {
                0 => String::new(),
                n => format!("; and {n} more"),
            };
            format!(
                "{} non-compliant, {} pending, {} of {total} hosted cluster(s) compliant: {}{more}",
                count(ComplianceState::NonCompliant),
                count(ComplianceState::Pending),
                count(ComplianceState::Compliant),
                named.join("; ")
            )
        }
    };
    let (state, summary) = match halt {
        Some(why) => (
            ComplianceState::NonCompliant,
            format!("rollout halted: {}; {summary}", cut(why, MAX_ROW_REASON)),
        ),
        None => (state, summary),
    };
    let state = writable(state, pending_supported);
    AdmissionHealthPolicyStatus {
        compliant: Some(state),
        message: Some(event_note(&acm_message(state, &summary))),
        related_objects,
        history: Vec::new(),
    }
}

/// How many hosted clusters a fleet summary says it counts (`N of M hosted cluster(s)`), for
/// readers of the template (the `status` command, the tests).
pub fn summary_total(message: &str) -> Option<usize> {
    let at = message.find(" hosted cluster(s) compliant")?;
    message[..at].rsplit(' ').next()?.parse().ok()
}

/// The most entries a template's `status.history` keeps (status-sync keeps as many per
/// template).
pub(crate) const TEMPLATE_HISTORY: usize = 10;

/// A compliance Event's instant, to the microsecond: its name (`<policy>.<hex nanoseconds>`,
/// client-go's convention, which status-sync parses for the time) and the `lastTimestamp` of
/// its history entry (MicroTime) must say the same instant, or status-sync would count an
/// Event and its entry twice.
pub fn event_instant(now: jiff::Timestamp) -> (i128, String) {
    let micros = now.as_microsecond();
    let at = jiff::Timestamp::from_microsecond(micros).unwrap_or(now);
    let text = at.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string();
    (i128::from(micros) * 1000, text)
}

/// The newest entry the hub shows for a template (the replicated Policy's status, as
/// status-sync wrote it), if it is someone else's: neither this reporter's verdict nor any
/// message it reported before (status-sync may not have read its newest Event yet), and not
/// one it has already answered. Template-sync's error and pending events land there and stay
/// newest, since it never reports a third-party kind as recovered; the reporter answers with
/// its verdict once per such entry, so a template error that persists (template-sync says it
/// again, after the answer) stays newest, as it should.
pub fn foreign_newest<'a>(
    newest: Option<&'a str>,
    ours: &AdmissionHealthPolicyStatus,
    answered: Option<&str>,
) -> Option<&'a str> {
    let n = newest?.trim();
    let mine = |m: &str| m.trim() == n;
    let known =
        ours.message.as_deref().is_some_and(mine) || ours.history.iter().any(|h| mine(&h.message));
    (!n.is_empty() && !known && answered != Some(n)).then_some(n)
}

/// `history` with `entry` in front, at most `TEMPLATE_HISTORY`.
pub fn with_entry(
    history: &[hcp_fleet_model::crd::health::TemplateHistoryEntry],
    entry: hcp_fleet_model::crd::health::TemplateHistoryEntry,
) -> Vec<hcp_fleet_model::crd::health::TemplateHistoryEntry> {
    std::iter::once(entry)
        .chain(history.iter().cloned())
        .take(TEMPLATE_HISTORY)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reporting::tests::all;
    use crate::reporting::*;

    /// A hosted-mode template reports its own hosted cluster only: its row, its verdict; a
    /// name that maps to no HCP, or to two, says so.
    #[test]
    fn a_hosted_mode_template_reports_its_own_cluster() {
        let row = |c: &str, state| RollupRow {
            cluster_name: c.into(),
            state,
            reason: if state == ComplianceState::Compliant {
                String::new()
            } else {
                "hosted-webhooks: drift".into()
            },
        };
        let mut rows = BTreeMap::new();
        rows.insert(
            "clusters-a".to_string(),
            row("a", ComplianceState::Compliant),
        );
        rows.insert(
            "clusters-b".to_string(),
            row("b", ComplianceState::NonCompliant),
        );
        let a = evaluate_cluster_template(&rows, "a", Ok("clusters-a"), true);
        assert_eq!(a.compliant, Some(ComplianceState::Compliant));
        assert_eq!(a.related_objects.len(), 1);
        assert_eq!(a.related_objects[0].object.metadata.namespace, "clusters-a");
        assert!(
            a.message
                .as_deref()
                .is_some_and(|m| m.starts_with("Compliant; notification - a (HCP clusters-a/a):"))
        );
        let b = evaluate_cluster_template(&rows, "b", Ok("clusters-b"), true);
        assert_eq!(b.compliant, Some(ComplianceState::NonCompliant));
        assert!(b.message.as_deref().is_some_and(|m| {
            m.contains("b (HCP clusters-b/b) NonCompliant: hosted-webhooks: drift")
        }));
        // A managed cluster that maps to no HCP says why.
        let none = evaluate_cluster_template(&rows, "c", Err(&"no HostedCluster is c"), true);
        assert_eq!(none.compliant, Some(ComplianceState::NonCompliant));
        assert_eq!(
            none.message.as_deref(),
            Some("NonCompliant; violation - no HostedCluster is c")
        );
        assert!(none.related_objects.is_empty());
        // One whose HCP is not reported yet waits (NonCompliant where the hub has no Pending).
        let early = evaluate_cluster_template(&rows, "d", Ok("clusters-d"), true);
        assert_eq!(early.compliant, Some(ComplianceState::Pending));
        let early = evaluate_cluster_template(&rows, "d", Ok("clusters-d"), false);
        assert_eq!(early.compliant, Some(ComplianceState::NonCompliant));
        // Which templates are hosted-mode ones.
        let labels =
            |x: &str| BTreeMap::from([(ACM_CLUSTER_NAME_LABEL.to_string(), x.to_string())]);
        assert_eq!(hosted_cluster_of("klusterlet-a", &labels("a")), Some("a"));
        assert_eq!(hosted_cluster_of("klusterlet-a", &labels("b")), None);
        assert_eq!(
            hosted_cluster_of("local-cluster", &labels("local-cluster")),
            None
        );
        assert_eq!(hosted_cluster_of("klusterlet-a", &BTreeMap::new()), None);
    }

    /// Template-sync's error stays the hub's newest entry until the reporter says its verdict
    /// again, once; status-sync's lag behind the reporter's own Events is no reason to.
    #[test]
    fn the_reporter_answers_someone_elses_newest_entry_once() {
        let entry = |m: &str| hcp_fleet_model::crd::health::TemplateHistoryEntry {
            last_timestamp: "2026-11-25T10:00:00.000001Z".into(),
            message: m.into(),
        };
        let ours = AdmissionHealthPolicyStatus {
            message: Some("Compliant; notification - 2 of 2 hosted cluster(s) compliant".into()),
            history: vec![
                entry("Compliant; notification - 2 of 2 hosted cluster(s) compliant"),
                entry("NonCompliant; violation - 1 non-compliant"),
            ],
            ..Default::default()
        };
        let error = "NonCompliant; template-error; Mapping not found";
        assert_eq!(foreign_newest(Some(error), &ours, None), Some(error));
        assert_eq!(foreign_newest(Some(error), &ours, Some(error)), None);
        assert_eq!(
            foreign_newest(
                Some("NonCompliant; violation - 1 non-compliant"),
                &ours,
                None
            ),
            None,
            "an older verdict of ours: status-sync has not caught up"
        );
        assert_eq!(foreign_newest(ours.message.as_deref(), &ours, None), None);
        assert_eq!(foreign_newest(None, &ours, None), None);
        assert_eq!(foreign_newest(Some("  "), &ours, None), None);
    }

    /// The instant names the Event and stamps its history entry alike, as status-sync parses
    /// each (`parseTimestampFromEventName`: hex nanoseconds; MicroTime: RFC 3339, six digits).
    #[test]
    fn an_events_name_and_its_history_entry_say_the_same_instant() {
        let now: jiff::Timestamp = "2026-11-25T10:00:00.123456789Z".parse().expect("time");
        let (nanos, text) = event_instant(now);
        assert_eq!(text, "2026-11-25T10:00:00.123456Z");
        let back: jiff::Timestamp = text.parse().expect("parses");
        assert_eq!(back.as_nanosecond(), nanos);
        assert_eq!(nanos % 1000, 0);
        let e = |m: &str| hcp_fleet_model::crd::health::TemplateHistoryEntry {
            last_timestamp: text.clone(),
            message: m.into(),
        };
        let full: Vec<_> = (0..TEMPLATE_HISTORY).map(|i| e(&format!("m{i}"))).collect();
        let next = with_entry(&full, e("new"));
        assert_eq!(next.len(), TEMPLATE_HISTORY);
        assert_eq!(next[0].message, "new");
        assert_eq!(next[1].message, "m0");
    }

    fn row(cluster: &str, state: ComplianceState, reason: &str) -> RollupRow {
        RollupRow {
            cluster_name: cluster.into(),
            state,
            reason: reason.into(),
        }
    }

    #[test]
    fn the_fleet_template_counts_every_cluster_and_names_the_worst() {
        let mut rows = BTreeMap::new();
        rows.insert(
            "clusters-a".into(),
            row("a", ComplianceState::Compliant, ""),
        );
        rows.insert(
            "clusters-b".into(),
            row("b", ComplianceState::NonCompliant, "hosted-webhooks: down"),
        );
        rows.insert(
            "clusters-c".into(),
            row("c", ComplianceState::Pending, "admission-service: waiting"),
        );
        // The hub knows b as spoke-b (a hosted-mode managed cluster); c it does not.
        let managed = BTreeMap::from([("clusters-b".to_string(), "spoke-b".to_string())]);
        let s = evaluate_template(&rows, &managed, true, None);
        assert_eq!(s.compliant, Some(ComplianceState::NonCompliant));
        assert_eq!(
            s.message.as_deref(),
            Some(
                "NonCompliant; violation - 1 non-compliant, 1 pending, 1 of 3 hosted cluster(s) compliant: \
                 spoke-b (HCP clusters-b/b) NonCompliant: hosted-webhooks: down; HCP clusters-c/c Pending: admission-service: waiting"
            )
        );
        // The summary's related objects are the worst, NonCompliant first; the compliant
        // cluster is counted, not listed.
        assert_eq!(s.related_objects.len(), 2);
        assert_eq!(s.related_objects[0].object.metadata.namespace, "clusters-b");
        assert_eq!(s.related_objects[0].object.kind, "AdmissionHealth");
        assert_eq!(
            s.related_objects[0].reason.as_deref(),
            Some("spoke-b (HCP clusters-b/b): hosted-webhooks: down")
        );
        assert_eq!(s.related_objects[1].object.metadata.namespace, "clusters-c");
        assert_eq!(
            summary_total(s.message.as_deref().unwrap_or_default()),
            Some(3)
        );
        let json = serde_json::to_value(&s).expect("json");
        assert!(
            json["relatedObjects"][0]["object"]
                .get("apiVersion")
                .is_some(),
            "{json}"
        );

        rows.remove("clusters-b");
        let s = evaluate_template(&rows, &managed, true, None);
        assert_eq!(s.compliant, Some(ComplianceState::Pending));
        assert!(
            s.message
                .as_deref()
                .is_some_and(|m| m.starts_with("Pending; notification - "))
        );
        // A hub whose Policy CRD predates Pending gets NonCompliant.
        let s = evaluate_template(&rows, &managed, false, None);
        assert_eq!(s.compliant, Some(ComplianceState::NonCompliant));
        assert!(
            s.message
                .as_deref()
                .is_some_and(|m| m.starts_with("NonCompliant; violation - "))
        );

        rows.remove("clusters-c");
        let s = evaluate_template(&rows, &managed, true, None);
        assert_eq!(
            s.message.as_deref(),
            Some("Compliant; notification - 1 of 1 hosted cluster(s) compliant")
        );
        assert!(s.related_objects.is_empty());
        let s = evaluate_template(&BTreeMap::new(), &managed, true, None);
        assert_eq!(s.compliant, Some(ComplianceState::Compliant));
        // A halted rollout reaches the hub even when every cluster is back and Compliant.
        let s = evaluate_template(
            &rows,
            &managed,
            true,
            Some("revision abc halted in canary: clusters-a: probe denied"),
        );
        assert_eq!(s.compliant, Some(ComplianceState::NonCompliant));
        assert_eq!(
            s.message.as_deref(),
            Some(
                "NonCompliant; violation - rollout halted: revision abc halted in canary: clusters-a: probe denied; 1 of 1 hosted cluster(s) compliant"
            )
        );
    }

    #[test]
    fn a_row_names_each_failing_concern() {
        let mut o = all(ComplianceState::Compliant, "fine");
        o.insert(Concern::HostedWebhooks, Observation::violation("down"));
        o.insert(Concern::EndToEndProbe, Observation::pending("not checked"));
        let r = rollup_row("hc-1", &o);
        assert_eq!(r.state, ComplianceState::NonCompliant);
        assert_eq!(r.reason, "hosted-webhooks: down; e2e-probe: not checked");
        assert_eq!(
            rollup_row("hc-1", &all(ComplianceState::Compliant, "ok")).reason,
            ""
        );
        // What is NonCompliant leads, before a concern left unchecked because of it.
        o.insert(Concern::AdmissionService, Observation::pending("waiting"));
        assert_eq!(
            rollup_row("hc-1", &o).reason,
            "hosted-webhooks: down; admission-service: waiting; e2e-probe: not checked"
        );
    }

    #[test]
    fn a_thousand_violations_still_make_one_event() {
        let rows: BTreeMap<String, RollupRow> = (0..1000)
            .map(|i| {
                (
                    format!("clusters-hc-{i}"),
                    row(
                        &format!("hc-{i}"),
                        ComplianceState::NonCompliant,
                        "e2e-probe: no answer",
                    ),
                )
            })
            .collect();
        let s = evaluate_template(&rows, &BTreeMap::new(), true, None);
        // One object still, with room to spare under etcd's 1.5 MiB, even with every row
        // failing at length (the row reasons are cut; the records keep them whole).
        let long: BTreeMap<String, RollupRow> = (0..1000)
            .map(|i| {
                let r = row(
                    &format!("hosted-cluster-with-a-long-name-{i:04}"),
                    ComplianceState::NonCompliant,
                    &"hosted-webhooks: tls: certificate signed by unknown authority; ".repeat(40),
                );
                (
                    format!("clusters-hosted-cluster-with-a-long-name-{i:04}"),
                    r,
                )
            })
            .collect();
        let size = serde_json::to_vec(&evaluate_template(&long, &BTreeMap::new(), true, None))
            .expect("json")
            .len();
        assert!(size < 600 * 1024, "{size} bytes");
        let fine: BTreeMap<String, RollupRow> = (0..1000)
            .map(|i| {
                let name = format!("hosted-cluster-with-a-long-name-{i:04}");
                let r = row(&name, ComplianceState::Compliant, "");
                (format!("clusters-{name}"), r)
            })
            .collect();
        let size = serde_json::to_vec(&evaluate_template(&fine, &BTreeMap::new(), true, None))
            .expect("json")
            .len();
        assert!(size < 300 * 1024, "{size} bytes");
        let m = s.message.expect("message");
        assert!(m.len() <= MAX_EVENT_NOTE, "{}", m.len());
        assert!(
            m.starts_with("NonCompliant; violation - 1000 non-compliant"),
            "{m}"
        );
        // The few worst are named and carried; the rest are counted.
        assert_eq!(s.related_objects.len(), SUMMARY_WORST);
        assert!(m.contains("; and 995 more"), "{m}");
        assert_eq!(summary_total(&m), Some(1000));
        // Worst first: one NonCompliant cluster among a thousand Pending ones leads.
        let mut mixed: BTreeMap<String, RollupRow> = (0..1000)
            .map(|i| {
                let r = row(&format!("hc-{i}"), ComplianceState::Pending, "waiting");
                (format!("clusters-hc-{i:04}"), r)
            })
            .collect();
        mixed.insert(
            "clusters-zz".into(),
            row("zz", ComplianceState::NonCompliant, "e2e-probe: no answer"),
        );
        let s = evaluate_template(&mixed, &BTreeMap::new(), true, None);
        assert_eq!(
            s.related_objects[0].object.metadata.namespace,
            "clusters-zz"
        );
        assert_eq!(
            s.related_objects[1].object.metadata.namespace,
            "clusters-hc-0000"
        );
    }
}
