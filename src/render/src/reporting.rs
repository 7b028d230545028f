//! Reporting (docs/reporting.md): one `AdmissionHealth` record per HCP with an entry per
//! concern and bounded history, and the verdict of ACM's `AdmissionHealthPolicy` templates over
//! the whole fleet, with a row per hosted cluster.
//!
//! Everything here is pure; the controller reads the current status, calls `next_status` /
//! `evaluate_template` and writes only when the result differs, so a steady fleet causes no
//! writes.

use std::collections::BTreeMap;

use kube::Resource;

use hcp_fleet_model::crd::conditions;

use hcp_fleet_model::crd::conditions::Condition;

use hcp_fleet_model::crd::conditions::ConditionStatus;
use hcp_fleet_model::crd::health::{ObjectMeta, ObjectRef, RelatedObject};
use hcp_fleet_model::crd::{
    AdmissionHealth, AdmissionHealthPolicyStatus, AdmissionHealthSpec, AdmissionHealthStatus,
    ComplianceState, ConcernStatus, HistoryEntry,
};

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
/// What earlier releases wrote outside ACM's flow, removed once at start: a Policy of this
/// name in every HCP namespace, and the roll-up Policy in the agent's namespace.
pub const LEGACY_POLICY_NAME: &str = "hcp-fleet-admission";
pub const LEGACY_ROLLUP_NAME: &str = "hcp-fleet-rollup";
pub(crate) const MAX_HISTORY: usize = 10;
/// Label naming the hosted cluster (the HCP's name).
pub const CLUSTER_LABEL: &str = "hcp-fleet.openshift.io/hosted-cluster";

/// The concerns, in the order they appear in the health record.
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

    /// The type of this concern's condition on the health record.
    pub(crate) fn condition_type(self) -> &'static str {
        match self {
            Concern::AdmissionService => "AdmissionServiceReady",
            Concern::Certificate => "CertificateReady",
            Concern::HostedWebhooks => "HostedWebhooksReady",
            Concern::EndToEndProbe => "EndToEndProbeReady",
        }
    }

    /// The `Ready` condition's reason when this concern is the first that is not.
    pub(crate) fn not_ready_reason(self) -> &'static str {
        match self {
            Concern::AdmissionService => "AdmissionServiceNotReady",
            Concern::Certificate => "CertificateNotReady",
            Concern::HostedWebhooks => "HostedWebhooksNotReady",
            Concern::EndToEndProbe => "EndToEndProbeNotReady",
        }
    }

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
        Self::new(ComplianceState::Compliant, msg.into())
    }
    pub fn violation(msg: impl Into<String>) -> Self {
        Self::new(ComplianceState::NonCompliant, msg.into())
    }
    pub fn pending(msg: impl Into<String>) -> Self {
        Self::new(ComplianceState::Pending, msg.into())
    }
    /// Every message is bounded and clean before it is stored (the health record), forwarded
    /// (Events, the hub) or logged: it may carry what a hosted cluster's admins wrote (a
    /// webhook's denial, a server's error text).
    fn new(state: ComplianceState, message: String) -> Self {
        Self {
            state,
            message: untrusted(&message, MAX_OBSERVATION),
        }
    }
}

/// The longest message one observation keeps.
pub(crate) const MAX_OBSERVATION: usize = 1024;

/// Text a hosted cluster's admins may have written (a webhook's denial, an API server's error
/// message), made safe to store and forward: control characters (line breaks, escape
/// sequences that would rewrite a terminal or forge a log line) become spaces, and it is cut
/// to `max` bytes.
pub fn untrusted(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    cut(&clean, max)
}

pub type Observations = BTreeMap<Concern, Observation>;

/// Any NonCompliant wins, then Pending, else Compliant; nothing observed is Pending.
pub(crate) fn aggregate<'a>(
    states: impl IntoIterator<Item = &'a ComplianceState>,
) -> ComplianceState {
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
pub(crate) fn writable(state: ComplianceState, pending_supported: bool) -> ComplianceState {
    if state == ComplianceState::Pending && !pending_supported {
        ComplianceState::NonCompliant
    } else {
        state
    }
}

/// ACM's history message form.
pub(crate) fn acm_message(state: ComplianceState, msg: &str) -> String {
    match state {
        ComplianceState::Compliant => format!("Compliant; notification - {msg}"),
        ComplianceState::Pending => format!("Pending; notification - {msg}"),
        ComplianceState::NonCompliant => format!("NonCompliant; violation - {msg}"),
    }
}

/// The API server refuses an Event whose note exceeds 1 KiB (events.k8s.io/v1); a long
/// violation (a TLS error chain, a list of refused fields) would lose its whole Event.
pub(crate) const MAX_EVENT_NOTE: usize = 1024;

/// `message` cut to `MAX_EVENT_NOTE` bytes on a character boundary, marked with an ellipsis
/// when cut. The full message stays in the health record's history.
pub fn event_note(message: &str) -> String {
    cut(message, MAX_EVENT_NOTE)
}

/// `message` cut to `max` bytes on a character boundary, ending in an ellipsis when cut.
pub fn cut(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    const MORE: &str = "…";
    let mut end = max.saturating_sub(MORE.len());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MORE}", &message[..end])
}

/// The longest reason one hosted cluster's row carries in a template's status: a thousand rows
/// of whole TLS error chains would near etcd's 1.5 MiB object limit, and the full text is in
/// that cluster's health record, which the row names.
pub(crate) const MAX_ROW_REASON: usize = 300;

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
            if let Some(kept) = conditions::find(prev_conditions, c.condition_type()) {
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
        type_: c.condition_type(),
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
        (ComplianceState::NonCompliant, Some((c, ..))) => c.not_ready_reason(),
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
            let cond = conditions::find(&s1.conditions, c.condition_type()).expect("concern");
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

    /// A tenant's text reaches the record at most 1 KiB long, with no control characters.
    #[test]
    fn tenant_text_is_cut_and_cleaned_before_it_is_kept() {
        let hostile = format!("denied\n\u{1b}[2Jfake log line\r{}", "x".repeat(5000));
        let o = Observation::violation(format!("probe failed: {hostile}"));
        assert!(o.message.len() <= MAX_OBSERVATION, "{}", o.message.len());
        assert!(!o.message.chars().any(char::is_control), "{:?}", o.message);
        assert!(
            o.message
                .starts_with("probe failed: denied  [2Jfake log line ")
        );
        assert!(o.message.ends_with('…'));
        assert_eq!(untrusted("fine", 10), "fine");
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
