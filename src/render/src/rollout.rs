//! Progressive rollout, as pure functions: what a revision is, which revision each HCP runs,
//! and the next state of the rollout from the last one, the configuration and what the HCPs'
//! health records say. `controller::rollout` reads the inputs and writes the result; nothing
//! here touches a cluster or a clock.
//!
//! The rules (docs/operations.md, "Progressive rollout"):
//! - A revision is the content hash of what the agent rolls out to each HCP: the admission
//!   image and settings and the webhook definitions. The rest of the configuration (hosted
//!   access, certificates, the agent's own pacing) is the agent's, applied at once; a
//!   certificate renewal is never a revision.
//! - A new revision goes to the canaries first, then to the rest in batches of at most
//!   `maxUnavailable`; a batch starts only when every HCP of the one before is done: on the
//!   revision, its Deployment fully rolled out, every concern Compliant for the soak time.
//! - An HCP of a batch that reports NonCompliant on the new revision for a reason the revision
//!   can cause (`attributable`), or is not done within the deadline, has failed: it goes back
//!   to the stable revision. Once `failureThreshold` HCPs have failed, the rollout halts: the
//!   rest of the batch goes back too; the HCPs already done keep the new one. A halted revision
//!   stays halted until the configuration changes or an operator resumes it.
//! - What the revision cannot have caused is not held against it: an HCP that was not
//!   Compliant when its batch started, or whose only failures are its hosted cluster's own (a
//!   probe answered by a webhook of the tenant's, or held past the agent's timeout), keeps the
//!   new revision and counts as done. A tenant cannot stall a rollout, security fixes
//!   included, by breaking its own cluster.
//! - HCPs not ready, paused or pinned take no part: they run the stable revision (or their pin)
//!   and follow the fleet once the rollout completes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;

use serde::{Deserialize, Serialize};

use crate::config::{AdmissionConfig, AgentConfig, RolloutConfig};
use hcp_fleet_guards::catalogue::{LabelSelector, WebhookDefinition};
use hcp_fleet_model::crd::ComplianceState;
use hcp_fleet_model::crd::admission_rollout::{
    AdmissionRolloutStatus, FailedHcp, InFlight, RevisionRecord, RolloutPhase,
};

/// On every object the agent renders for an HCP (its Deployment, its hosted webhook
/// configurations and policies): the revision it belongs to.
pub const REVISION_ANNOTATION: &str = "hcp-fleet.openshift.io/revision";

/// Earlier good revisions kept for pins (beyond the ones a pin names).
pub(crate) const HISTORY: usize = 5;

/// What a revision rolls out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Content {
    pub(crate) admission: AdmissionConfig,
    pub(crate) webhooks: Vec<WebhookDefinition>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Revision {
    pub id: String,
    pub(crate) content: Content,
}

/// A revision the rollout's status stores that this agent cannot read back.
#[derive(Debug, thiserror::Error)]
#[error("revision {revision}: stored content unreadable: {source}")]
pub(crate) struct UnreadableRevision {
    revision: String,
    #[source]
    source: serde_json::Error,
}

impl Revision {
    /// The revision a configuration asks for.
    pub fn of(cfg: &AgentConfig) -> Self {
        Self::from_content(Content {
            admission: cfg.admission.clone(),
            webhooks: cfg.webhooks.clone(),
        })
    }

    fn from_content(content: Content) -> Self {
        let json = serde_json::to_vec(&content).unwrap_or_default();
        Self {
            id: hcp_fleet_model::compare::stable_hash(&[&json]),
            content,
        }
    }

    /// A revision as the rollout stored it. `Err`: its content no longer reads as this
    /// version's configuration (an agent downgrade, or an edited status).
    pub(crate) fn from_record(r: &RevisionRecord) -> Result<Self, UnreadableRevision> {
        let content: Content =
            serde_json::from_str(&r.content).map_err(|source| UnreadableRevision {
                revision: r.revision.clone(),
                source,
            })?;
        Ok(Self::from_content(content))
    }

    pub(crate) fn record(&self, now: &str) -> RevisionRecord {
        RevisionRecord {
            revision: self.id.clone(),
            content: serde_json::to_string(&self.content).unwrap_or_default(),
            since: now.to_string(),
        }
    }

    /// `base` (the configuration in force) running this revision.
    pub(crate) fn apply(&self, base: &AgentConfig) -> AgentConfig {
        AgentConfig {
            admission: self.content.admission.clone(),
            webhooks: self.content.webhooks.clone(),
            ..base.clone()
        }
    }
}

/// Whether `sel` selects an object with `labels` (an empty selector selects nothing here: no
/// canaries unless some are named).
pub fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if sel.match_labels.is_empty() && sel.match_expressions.is_empty() {
        return false;
    }
    sel.match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().all(|e| {
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| e.values.contains(v)),
                "NotIn" => !value.is_some_and(|v| e.values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// The revision an HCP runs, unless pinned: the target while it is in flight or done (and the
/// rollout not halted for those in flight), else the stable one.
pub(crate) fn assigned<'a>(st: &'a AdmissionRolloutStatus, ns: &str) -> Option<&'a RevisionRecord> {
    let on_target = st.done.iter().any(|d| d == ns)
        || (st.phase == RolloutPhase::Progressing
            && st.in_flight.iter().any(|f| f.namespace == ns));
    match &st.target {
        Some(t) if on_target => Some(t),
        _ => st.stable.as_ref(),
    }
}

/// Every revision the rollout can still hand out (a pin may name any of them).
pub(crate) fn known(st: &AdmissionRolloutStatus) -> impl Iterator<Item = &RevisionRecord> {
    st.stable
        .iter()
        .chain(st.target.iter())
        .chain(st.history.iter())
}

/// One HCP as the rollout sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Member {
    /// Ready, not paused, not pinned: it takes part in waves.
    pub eligible: bool,
    /// Its labels or its namespace's match the canary selector.
    pub canary: bool,
    /// What its health record says.
    pub health: Health,
}

/// The part of an HCP's health record the rollout reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    pub revision: Option<String>,
    pub verdict: Option<ComplianceState>,
    /// Seconds since the record's `revisionReadySince` (`None`: not ready on its revision).
    pub ready_for: Option<i64>,
    /// Why it is not Compliant (the first concern that is not).
    pub reason: String,
    /// Whether a concern that is not Compliant could be the revision's doing
    /// (`attributable`).
    pub attributable: bool,
}

/// Whether a concern's failure (its name and newest message) could be the revision's doing:
/// the admission service and its certificate are the revision's; the end-to-end probe is,
/// unless the hosted cluster's own webhooks answered or held it; the hosted webhook
/// configurations are the hosted cluster's state (unreachable, or refusing), and a revision
/// that breaks them fails the probe as well.
pub fn attributable(concern: &str, message: &str) -> bool {
    use hcp_fleet_guards::probe::{FOREIGN_ANSWER, FOREIGN_POLICY_ANSWER, NO_ANSWER};
    match concern {
        "admission-service" | "certificate" => true,
        "e2e-probe" => ![FOREIGN_ANSWER, FOREIGN_POLICY_ANSWER, NO_ANSWER]
            .iter()
            .any(|m| message.contains(m)),
        _ => false,
    }
}

/// What the step did, for Events, logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Adopted {
        revision: String,
    },
    Started {
        revision: String,
        canaries: usize,
    },
    Cancelled {
        revision: String,
    },
    Batch {
        wave: String,
        hcps: Vec<String>,
    },
    Done {
        namespace: String,
    },
    /// Kept on the new revision though not Compliant: not the revision's doing.
    Excused {
        namespace: String,
        reason: String,
    },
    Failed {
        namespace: String,
        reason: String,
    },
    Halted {
        revision: String,
        reason: String,
    },
    Resumed {
        revision: String,
    },
    Completed {
        revision: String,
    },
}

/// The clock and settings of one step.
pub struct StepInput<'a> {
    pub desired: &'a Revision,
    pub cfg: &'a RolloutConfig,
    /// Every HCP by namespace.
    pub members: &'a BTreeMap<String, Member>,
    /// The resume annotation's value, if set.
    pub resume: Option<&'a str>,
    /// Revisions a pin names (kept in the history whatever its length).
    pub pinned: &'a BTreeSet<String>,
    /// RFC 3339 now, and seconds since the epoch now.
    pub now: &'a str,
    pub now_secs: i64,
}

/// The next state of the rollout. `None` as `prev`: the rollout object is new, so the
/// configuration in force is adopted as the stable revision (nothing ran anything else).
pub fn step(
    prev: Option<&AdmissionRolloutStatus>,
    inp: &StepInput<'_>,
) -> (AdmissionRolloutStatus, Vec<Transition>) {
    let mut out = Vec::new();
    let desired = inp.desired;
    let Some(prev) = prev.filter(|p| p.stable.is_some()) else {
        out.push(Transition::Adopted {
            revision: desired.id.clone(),
        });
        return (adopted(desired, inp.now), out);
    };
    let st = prev.clone();
    let stable_id = st
        .stable
        .as_ref()
        .map(|s| s.revision.clone())
        .unwrap_or_default();
    let mut st = match follow(st, &stable_id, inp, &mut out) {
        ControlFlow::Continue(st) => st,
        ControlFlow::Break(done) => return (done, out),
    };

    let Some(target) = st.target.clone() else {
        st.message = format!("revision {stable_id} everywhere");
        return (st, out);
    };

    if st.phase == RolloutPhase::Halted {
        if inp.resume == Some(target.revision.as_str()) {
            out.push(Transition::Resumed {
                revision: target.revision.clone(),
            });
            st.phase = RolloutPhase::Progressing;
            st.failed.clear();
        } else {
            return (st, out);
        }
    }

    // The batch in flight: done, failed, or still going.
    let mut failed = Vec::new();
    let mut still = Vec::new();
    for f in std::mem::take(&mut st.in_flight) {
        let Some(m) = inp.members.get(&f.namespace).filter(|m| m.eligible) else {
            // Deleted, paused or pinned meanwhile: no longer part of the rollout.
            continue;
        };
        match judge(&f, m, &target.revision, inp) {
            Judged::Done => {
                out.push(Transition::Done {
                    namespace: f.namespace.clone(),
                });
                st.done.push(f.namespace);
            }
            Judged::Excused(reason) => {
                out.push(Transition::Excused {
                    namespace: f.namespace.clone(),
                    reason,
                });
                st.done.push(f.namespace);
            }
            Judged::Failed(reason) => failed.push(FailedHcp {
                namespace: f.namespace,
                reason,
            }),
            Judged::Going => still.push(f),
        }
    }
    for f in &failed {
        out.push(Transition::Failed {
            namespace: f.namespace.clone(),
            reason: f.reason.clone(),
        });
    }
    st.failed.extend(failed);
    let eligible_count = inp.members.values().filter(|m| m.eligible).count();
    let threshold = inp.cfg.failure_threshold.of(eligible_count).unwrap_or(1);
    if !st.failed.is_empty() && st.failed.len() >= threshold {
        let reason = st
            .failed
            .iter()
            .map(|f| format!("{}: {}", f.namespace, f.reason))
            .collect::<Vec<_>>()
            .join("; ");
        out.push(Transition::Halted {
            revision: target.revision.clone(),
            reason: reason.clone(),
        });
        // The rest of the batch goes back too: nothing unproven keeps the new revision.
        st.phase = RolloutPhase::Halted;
        st.message = format!(
            "revision {} halted in {}: {reason}; {} HCP(s) keep it, the rest run {stable_id}",
            target.revision,
            st.wave.as_deref().unwrap_or("the first batch"),
            st.done.len()
        );
        return (st, out);
    }
    st.in_flight = still;
    if !st.in_flight.is_empty() {
        st.message = progress(&st, &target.revision);
        return (st, out);
    }

    next_batch(st, target, inp, out)
}

/// Where the configuration moved: back to the stable revision (the target cancelled), or
/// on to a new target (started, or completed at once when rollouts are off: `Break`).
fn follow(
    mut st: AdmissionRolloutStatus,
    stable_id: &str,
    inp: &StepInput<'_>,
    out: &mut Vec<Transition>,
) -> ControlFlow<AdmissionRolloutStatus, AdmissionRolloutStatus> {
    let desired = inp.desired;
    let target_id = st.target.as_ref().map(|t| t.revision.clone());

    if desired.id == stable_id {
        if let Some(t) = target_id {
            out.push(Transition::Cancelled { revision: t });
            st = complete_on(st.stable.clone().unwrap_or_default(), st.history.clone());
        }
    } else if target_id.as_deref() != Some(desired.id.as_str()) {
        if !inp.cfg.enabled {
            // All at once: the new revision is the stable one for everyone.
            out.push(Transition::Completed {
                revision: desired.id.clone(),
            });
            return ControlFlow::Break(promote(&st, desired.record(inp.now), inp.pinned));
        }
        let canaries: Vec<String> = inp
            .members
            .iter()
            .filter(|(_, m)| m.canary)
            .map(|(ns, _)| ns.clone())
            .collect();
        out.push(Transition::Started {
            revision: desired.id.clone(),
            canaries: canaries.len(),
        });
        st = AdmissionRolloutStatus {
            phase: RolloutPhase::Progressing,
            stable: st.stable.clone(),
            target: Some(desired.record(inp.now)),
            history: st.history.clone(),
            canaries,
            ..Default::default()
        };
    }
    ControlFlow::Continue(st)
}

/// What became of one HCP of the batch in flight.
enum Judged {
    /// On the target and soaked: it keeps the new revision.
    Done,
    /// Kept on the new revision though not Compliant: not the revision's doing (why).
    Excused(String),
    /// The revision failed it (why): it goes back to the stable one.
    Failed(String),
    /// Still rolling out or soaking, within the deadline.
    Going,
}

fn judge(f: &InFlight, m: &Member, target: &str, inp: &StepInput<'_>) -> Judged {
    let soak = i64::from(inp.cfg.soak_seconds);
    let deadline = i64::from(inp.cfg.deadline_seconds);
    let on_target = m.health.revision.as_deref() == Some(target);
    let age = seconds_since(&f.since, inp.now_secs);
    let non_compliant = on_target && m.health.verdict == Some(ComplianceState::NonCompliant);
    // Not the revision's doing: broken before its batch started, or broken only by the hosted
    // cluster's own parts.
    let excuse = if f.was_compliant == Some(false) {
        Some("it was not Compliant on the stable revision when its batch started")
    } else if non_compliant && !m.health.attributable {
        Some("only its hosted cluster's own parts fail")
    } else {
        None
    };
    if on_target && m.health.ready_for.is_some_and(|s| s >= soak) {
        Judged::Done
    } else if let Some(why) = excuse.filter(|_| non_compliant || age > deadline) {
        Judged::Excused(format!("{why}: {}", m.health.reason))
    } else if non_compliant {
        Judged::Failed(format!(
            "NonCompliant on the new revision: {}",
            m.health.reason
        ))
    } else if age > deadline {
        let why = if !on_target {
            "not reconciled to the new revision".to_string()
        } else if m.health.ready_for.is_none() {
            if m.health.reason.is_empty() {
                "its Deployment did not finish rolling out".to_string()
            } else {
                m.health.reason.clone()
            }
        } else {
            "still soaking".to_string()
        };
        Judged::Failed(format!("not done within {deadline}s: {why}"))
    } else {
        Judged::Going
    }
}

/// Nothing in flight: the next batch (canaries first, then the rest, in namespace order), or
/// the rollout complete when no HCP is left.
fn next_batch(
    mut st: AdmissionRolloutStatus,
    target: RevisionRecord,
    inp: &StepInput<'_>,
    mut out: Vec<Transition>,
) -> (AdmissionRolloutStatus, Vec<Transition>) {
    let done: BTreeSet<&String> = st.done.iter().collect();
    let eligible: Vec<&String> = inp
        .members
        .iter()
        .filter(|(_, m)| m.eligible)
        .map(|(ns, _)| ns)
        .collect();
    // A failed HCP is not tried again in this rollout (it runs the stable revision).
    let failed: BTreeSet<&String> = st.failed.iter().map(|f| &f.namespace).collect();
    let remaining: Vec<&String> = eligible
        .iter()
        .copied()
        .filter(|ns| !done.contains(ns) && !failed.contains(ns))
        .collect();
    if remaining.is_empty() {
        out.push(Transition::Completed {
            revision: target.revision.clone(),
        });
        let next = promote(
            &st,
            RevisionRecord {
                since: inp.now.into(),
                ..target
            },
            inp.pinned,
        );
        return (next, out);
    }
    let width = inp.cfg.max_unavailable.of(eligible.len()).unwrap_or(1);
    let canaries: BTreeSet<&String> = st.canaries.iter().collect();
    let (pool, wave): (Vec<&String>, String) = if remaining.iter().any(|ns| canaries.contains(ns)) {
        (
            remaining
                .iter()
                .copied()
                .filter(|ns| canaries.contains(ns))
                .collect(),
            "canary".into(),
        )
    } else {
        (remaining.clone(), format!("batch {}", st.batches + 1))
    };
    let batch: Vec<String> = pool.into_iter().take(width).cloned().collect();
    st.batches += 1;
    st.wave = Some(wave.clone());
    st.in_flight = batch
        .iter()
        .map(|ns| InFlight {
            namespace: ns.clone(),
            since: inp.now.to_string(),
            // NonCompliant on the stable revision: what it shows on the new one is not news.
            // No verdict yet (a new record) is no evidence either way, and counts.
            was_compliant: Some(
                inp.members
                    .get(ns)
                    .is_none_or(|m| m.health.verdict != Some(ComplianceState::NonCompliant)),
            ),
        })
        .collect();
    out.push(Transition::Batch { wave, hcps: batch });
    st.message = progress(&st, &target.revision);
    (st, out)
}

/// The state of a new rollout object: the configuration in force is the stable revision
/// (nothing ran anything else).
pub fn adopted(desired: &Revision, now: &str) -> AdmissionRolloutStatus {
    complete_on(desired.record(now), Vec::new())
}

fn complete_on(stable: RevisionRecord, history: Vec<RevisionRecord>) -> AdmissionRolloutStatus {
    AdmissionRolloutStatus {
        phase: RolloutPhase::Complete,
        message: format!("revision {} everywhere", stable.revision),
        stable: Some(stable),
        history,
        ..Default::default()
    }
}

/// `st` complete on `stable`, its old stable revision first in the history.
fn promote(
    st: &AdmissionRolloutStatus,
    stable: RevisionRecord,
    pinned: &BTreeSet<String>,
) -> AdmissionRolloutStatus {
    let mut history = st.history.clone();
    history.insert(0, st.stable.clone().unwrap_or_default());
    complete_on(stable, prune(history, pinned))
}

/// The history without the stable revision's duplicates, at most `HISTORY` long, plus any
/// older revision a pin still names.
fn prune(history: Vec<RevisionRecord>, pinned: &BTreeSet<String>) -> Vec<RevisionRecord> {
    let mut seen = BTreeSet::new();
    history
        .into_iter()
        .filter(|r| !r.revision.is_empty() && seen.insert(r.revision.clone()))
        .enumerate()
        .filter(|(i, r)| *i < HISTORY || pinned.contains(&r.revision))
        .map(|(_, r)| r)
        .collect()
}

/// The rollout's condition types, as a Deployment's and an OpenShift ClusterOperator's.
pub(crate) const AVAILABLE: &str = "Available";
pub(crate) const PROGRESSING: &str = "Progressing";
pub(crate) const DEGRADED: &str = "Degraded";
/// False while the agent runs an older configuration because the file's is refused.
pub(crate) const CONFIGURATION_ACCEPTED: &str = "ConfigurationAccepted";

/// `st` with its conditions and `observedGeneration` set from what it says (the phase, the
/// revisions, the failures), each keeping its transition time from `prev` where its status
/// did not change: a step that moved nothing renders the same status and writes nothing.
pub fn with_conditions(
    prev: Option<&AdmissionRolloutStatus>,
    mut st: AdmissionRolloutStatus,
    generation: Option<i64>,
    now: &str,
    config_refused: Option<&str>,
) -> AdmissionRolloutStatus {
    use hcp_fleet_model::crd::conditions;
    use hcp_fleet_model::crd::conditions::{ConditionStatus, Want};
    let halted = st.phase == RolloutPhase::Halted;
    let available = match &st.stable {
        Some(s) => Want {
            type_: AVAILABLE,
            status: ConditionStatus::True,
            reason: "StableRevision",
            message: format!(
                "revision {} is stable: every HCP not given the target runs it",
                s.revision
            ),
        },
        None => Want {
            type_: AVAILABLE,
            status: ConditionStatus::Unknown,
            reason: "NoStableRevision",
            message: "no revision adopted yet: waiting for the leader's first step".into(),
        },
    };
    let progressing = Want {
        type_: PROGRESSING,
        status: ConditionStatus::from_bool(st.phase == RolloutPhase::Progressing),
        reason: st.phase.as_str(),
        message: st.message.clone(),
    };
    let degraded = if halted {
        Want {
            type_: DEGRADED,
            status: ConditionStatus::True,
            reason: "Halted",
            message: format!(
                "{}; fix the configuration, or resume with the {} annotation \
                 (docs/operations.md)",
                st.message,
                hcp_fleet_model::crd::admission_rollout::RESUME_ANNOTATION
            ),
        }
    } else if !st.failed.is_empty() {
        Want {
            type_: DEGRADED,
            status: ConditionStatus::True,
            reason: "HcpsFailed",
            message: format!(
                "{} HCP(s) failed the target and went back to the stable revision: {}",
                st.failed.len(),
                st.failed
                    .iter()
                    .take(5)
                    .map(|f| format!("{}: {}", f.namespace, f.reason))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        }
    } else {
        Want {
            type_: DEGRADED,
            status: ConditionStatus::False,
            reason: "AsExpected",
            message: "no HCP failed the rollout".into(),
        }
    };
    // `helm upgrade` succeeds whatever the agent makes of the file: the object `kubectl get
    // admissionrollout` shows says whether the file in force is the one in the ConfigMap.
    let accepted = match config_refused {
        Some(why) => Want {
            type_: CONFIGURATION_ACCEPTED,
            status: ConditionStatus::False,
            reason: "Refused",
            message: format!("the agent runs its last good configuration: {why}"),
        },
        None => Want {
            type_: CONFIGURATION_ACCEPTED,
            status: ConditionStatus::True,
            reason: "Accepted",
            message: "the configuration file in force is the one last read".into(),
        },
    };
    let prev_conditions = prev.map_or(&[][..], |p| &p.conditions[..]);
    st.observed_generation = generation;
    st.conditions = conditions::set_all(
        prev_conditions,
        [available, progressing, degraded, accepted],
        generation,
        now,
    );
    st
}

fn progress(st: &AdmissionRolloutStatus, target: &str) -> String {
    format!(
        "revision {target}: {} in flight ({}), {} done",
        st.in_flight.len(),
        st.wave.as_deref().unwrap_or("-"),
        st.done.len()
    )
}

fn seconds_since(rfc3339: &str, now_secs: i64) -> i64 {
    rfc3339
        .parse::<jiff::Timestamp>()
        .map(|t| now_secs - t.as_second())
        // Unreadable: as old as can be, so the deadline decides rather than waiting forever.
        .unwrap_or(i64::MAX / 2)
}

/// The rollout as last read or written, with its revisions parsed once: what every
/// reconcile reads its HCP's assignment from (the controller keeps one, `Context::rollout_view`).
#[derive(Debug, Default)]
pub struct RolloutView {
    pub status: Option<AdmissionRolloutStatus>,
    revisions: HashMap<String, Revision>,
}

impl RolloutView {
    pub fn new(status: Option<AdmissionRolloutStatus>) -> Self {
        let revisions = status
            .iter()
            .flat_map(known)
            .filter_map(|r| match Revision::from_record(r) {
                Ok(rev) => Some((r.revision.clone(), rev)),
                Err(e) => {
                    tracing::warn!(error = %e, "a stored revision is unreadable; it cannot be handed out");
                    None
                }
            })
            .collect();
        Self { status, revisions }
    }

    pub fn revision(&self, id: &str) -> Option<Revision> {
        self.revisions.get(id).cloned()
    }

    /// Whether `other` holds the same revisions (an override's verdict can only change with
    /// them, or with the revision its HCP is assigned).
    pub fn holds_the_same(&self, other: &RolloutView) -> bool {
        self.revisions.len() == other.revisions.len()
            && self
                .revisions
                .keys()
                .all(|k| other.revisions.contains_key(k))
    }

    /// The revision the rollout assigns `ns` (`None`: no rollout state: the configuration's).
    pub fn assigned(&self, ns: &str) -> Option<Revision> {
        let st = self.status.as_ref()?;
        assigned(st, ns).and_then(|r| self.revision(&r.revision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MaxUnavailable;

    fn rev(image: &str) -> Revision {
        let mut cfg = AgentConfig::default();
        cfg.admission.image = image.into();
        Revision::of(&cfg)
    }

    fn cfg(max: u32) -> RolloutConfig {
        RolloutConfig {
            max_unavailable: MaxUnavailable::Count(max),
            soak_seconds: 10,
            deadline_seconds: 60,
            ..Default::default()
        }
    }

    fn fleet(n: usize, canaries: &[usize]) -> BTreeMap<String, Member> {
        (0..n)
            .map(|i| {
                (
                    format!("ns-{i}"),
                    Member {
                        eligible: true,
                        canary: canaries.contains(&i),
                        health: Health::default(),
                    },
                )
            })
            .collect()
    }

    fn ts(secs: i64) -> String {
        jiff::Timestamp::from_second(secs).expect("ts").to_string()
    }

    struct Sim {
        st: AdmissionRolloutStatus,
        members: BTreeMap<String, Member>,
        cfg: RolloutConfig,
        now: i64,
    }

    impl Sim {
        fn new(n: usize, canaries: &[usize], max: u32, first: &Revision) -> Self {
            let members = fleet(n, canaries);
            let c = cfg(max);
            let pinned = BTreeSet::new();
            let (st, t) = step(
                None,
                &StepInput {
                    desired: first,
                    cfg: &c,
                    members: &members,
                    resume: None,
                    pinned: &pinned,
                    now: &ts(0),
                    now_secs: 0,
                },
            );
            assert_eq!(
                t,
                vec![Transition::Adopted {
                    revision: first.id.clone()
                }]
            );
            Self {
                st,
                members,
                cfg: c,
                now: 0,
            }
        }

        fn step(&mut self, desired: &Revision, resume: Option<&str>) -> Vec<Transition> {
            let pinned = BTreeSet::new();
            let (st, t) = step(
                Some(&self.st),
                &StepInput {
                    desired,
                    cfg: &self.cfg,
                    members: &self.members,
                    resume,
                    pinned: &pinned,
                    now: &ts(self.now),
                    now_secs: self.now,
                },
            );
            self.st = st;
            t
        }

        /// Every HCP reconciles to what it is assigned; `healthy` decides how that goes.
        fn reconcile(&mut self, healthy: impl Fn(&str, &str) -> bool) {
            for (ns, m) in self.members.iter_mut() {
                let Some(r) = assigned(&self.st, ns) else {
                    continue;
                };
                let ok = healthy(ns, &r.revision);
                let same = m.health.revision.as_deref() == Some(r.revision.as_str());
                m.health = Health {
                    revision: Some(r.revision.clone()),
                    verdict: Some(if ok {
                        ComplianceState::Compliant
                    } else {
                        ComplianceState::NonCompliant
                    }),
                    ready_for: ok.then(|| {
                        if same {
                            m.health.ready_for.unwrap_or(0) + 5
                        } else {
                            0
                        }
                    }),
                    reason: if ok {
                        String::new()
                    } else {
                        "probe: denied".into()
                    },
                    attributable: !ok,
                };
            }
        }

        fn on(&self, rev: &Revision) -> usize {
            self.members
                .keys()
                .filter(|ns| assigned(&self.st, ns).map(|r| &r.revision) == Some(&rev.id))
                .count()
        }
    }

    #[test]
    fn a_good_revision_goes_to_canaries_then_batches_never_wider_than_max_unavailable() {
        let (a, b) = (rev("a"), rev("b"));
        let mut sim = Sim::new(7, &[5], 2, &a);
        let mut batches = Vec::new();
        for _ in 0..100 {
            for t in sim.step(&b, None) {
                if let Transition::Batch { wave, hcps } = t {
                    batches.push((wave, hcps));
                }
            }
            assert!(sim.st.in_flight.len() <= 2);
            if sim.st.phase == RolloutPhase::Complete {
                break;
            }
            sim.now += 5;
            sim.reconcile(|_, _| true);
        }
        assert_eq!(sim.st.phase, RolloutPhase::Complete);
        assert_eq!(sim.st.stable.as_ref().map(|s| &s.revision), Some(&b.id));
        assert_eq!(
            sim.st.history[0].revision, a.id,
            "the old one is kept for pins"
        );
        assert_eq!(batches[0], ("canary".to_string(), vec!["ns-5".to_string()]));
        let rest: Vec<usize> = batches[1..].iter().map(|(_, h)| h.len()).collect();
        assert_eq!(rest, vec![2, 2, 2], "{batches:?}");
        assert_eq!(sim.on(&b), 7);
    }

    /// Runs `sim` to `b` until it completes or halts (at most 100 steps); `healthy` as in
    /// `reconcile`, then `after` adjusts the records (what the tenant or the revision did).
    fn drive(
        sim: &mut Sim,
        b: &Revision,
        healthy: impl Fn(&str, &str) -> bool,
        after: impl Fn(&str, &mut Health),
    ) -> Vec<Transition> {
        let mut all = Vec::new();
        for _ in 0..100 {
            let t = sim.step(b, None);
            all.extend(t);
            if sim.st.phase != RolloutPhase::Progressing {
                break;
            }
            sim.now += 5;
            sim.reconcile(&healthy);
            for (ns, m) in sim.members.iter_mut() {
                after(ns, &mut m.health);
            }
        }
        all
    }

    /// A tenant who breaks their own cluster (a webhook of theirs answering the probe), or a
    /// cluster that was broken before its batch started, never holds a revision back: they
    /// keep it, the Event says why, and the rest of the fleet gets it.
    #[test]
    fn what_the_revision_did_not_cause_is_not_held_against_it() {
        let (a, b) = (rev("a"), rev("b"));
        // ns-1: only its own parts fail (the probe answered by its own webhook).
        let mut sim = Sim::new(3, &[], 1, &a);
        let t = drive(
            &mut sim,
            &b,
            |ns, r| ns != "ns-1" || r != b.id,
            |ns, h| h.attributable = ns != "ns-1" && h.attributable,
        );
        assert_eq!(sim.st.phase, RolloutPhase::Complete, "{t:?}");
        assert!(t.iter().any(|t| matches!(t, Transition::Excused { namespace, reason } if namespace == "ns-1" && reason.contains("hosted cluster's own"))), "{t:?}");
        assert_eq!(sim.on(&b), 3);
        // ns-2 was NonCompliant on the stable revision already, for reasons that would count.
        let mut sim = Sim::new(3, &[], 1, &a);
        sim.reconcile(|ns, _| ns != "ns-2");
        let t = drive(&mut sim, &b, |ns, _| ns != "ns-2", |_, _| {});
        assert_eq!(sim.st.phase, RolloutPhase::Complete, "{t:?}");
        assert!(t.iter().any(|t| matches!(t, Transition::Excused { namespace, reason } if namespace == "ns-2" && reason.contains("when its batch started"))), "{t:?}");
        assert!(
            !t.iter().any(|t| matches!(t, Transition::Failed { .. })),
            "{t:?}"
        );
    }

    /// With a threshold above one, a failed HCP goes back to the stable revision and the
    /// rollout goes on, until the threshold is reached.
    #[test]
    fn failures_halt_at_the_threshold_each_failed_hcp_back_on_stable_at_once() {
        let (a, b) = (rev("a"), rev("b"));
        let mut sim = Sim::new(5, &[], 1, &a);
        sim.cfg.failure_threshold = MaxUnavailable::Count(2);
        let mut saw_ns1_back = false;
        let mut all = Vec::new();
        for _ in 0..100 {
            all.extend(sim.step(&b, None));
            if sim.st.failed.iter().any(|f| f.namespace == "ns-1") {
                saw_ns1_back |= assigned(&sim.st, "ns-1").map(|r| &r.revision) == Some(&a.id);
            }
            if sim.st.phase != RolloutPhase::Progressing {
                break;
            }
            sim.now += 5;
            sim.reconcile(|ns, r| ns != "ns-1" || r != b.id);
        }
        assert_eq!(
            sim.st.phase,
            RolloutPhase::Complete,
            "one failure of two allowed: {all:?}"
        );
        assert!(
            saw_ns1_back,
            "the failed HCP ran the stable revision while the rollout went on"
        );
        assert!(
            all.iter()
                .any(|t| matches!(t, Transition::Failed { namespace, .. } if namespace == "ns-1"))
        );
        // Two failures: halted.
        let mut sim = Sim::new(5, &[], 1, &a);
        sim.cfg.failure_threshold = MaxUnavailable::Count(2);
        let t = drive(
            &mut sim,
            &b,
            |ns, r| !["ns-1", "ns-3"].contains(&ns) || r != b.id,
            |_, _| {},
        );
        assert_eq!(sim.st.phase, RolloutPhase::Halted, "{t:?}");
        assert_eq!(sim.st.failed.len(), 2);
        // A percentage of the fleet.
        assert_eq!(MaxUnavailable::Percent("10%".into()).of(50), Ok(5));
    }

    /// Attribution by concern and message.
    #[test]
    fn failures_are_attributed_to_the_revision_or_to_the_hosted_cluster() {
        use hcp_fleet_guards::probe::{FOREIGN_ANSWER, NO_ANSWER};
        assert!(attributable(
            "admission-service",
            "Deployment not available"
        ));
        assert!(attributable("certificate", "expired"));
        assert!(attributable(
            "e2e-probe",
            "the hosted kube-apiserver did not reach the admission service"
        ));
        assert!(!attributable(
            "e2e-probe",
            &format!(
                "the probe was denied without the admission service's proof: {FOREIGN_ANSWER}"
            )
        ));
        assert!(!attributable(
            "e2e-probe",
            &format!("probe {NO_ANSWER} 10s")
        ));
        assert!(!attributable(
            "hosted-webhooks",
            "hosted kube-apiserver stopped answering"
        ));
    }

    #[test]
    fn a_failing_canary_halts_goes_back_and_nothing_else_moves_until_resumed() {
        let (a, b) = (rev("a"), rev("b"));
        let mut sim = Sim::new(4, &[0], 1, &a);
        sim.step(&b, None);
        assert_eq!(sim.st.in_flight[0].namespace, "ns-0");
        assert_eq!(sim.on(&b), 1);
        sim.reconcile(|_, r| r != b.id);
        let t = sim.step(&b, None);
        assert!(t.iter().any(|t| matches!(t, Transition::Halted { reason, .. } if reason.contains("ns-0") && reason.contains("probe: denied"))), "{t:?}");
        assert_eq!(sim.st.phase, RolloutPhase::Halted);
        assert_eq!(sim.on(&b), 0, "the canary is back on the stable revision");
        // Halted: time passes, nothing moves.
        for _ in 0..5 {
            sim.now += 100;
            sim.reconcile(|_, r| r != b.id);
            assert!(sim.step(&b, None).is_empty());
            assert_eq!(sim.on(&a), 4);
        }
        // The operator resumes: the canary is tried again.
        let t = sim.step(&b, Some(&b.id));
        assert!(
            t.contains(&Transition::Resumed {
                revision: b.id.clone()
            }),
            "{t:?}"
        );
        assert_eq!(sim.st.phase, RolloutPhase::Progressing);
        assert_eq!(sim.on(&b), 1);
    }

    #[test]
    fn a_batch_that_never_finishes_halts_at_the_deadline_and_done_hcps_keep_the_revision() {
        let (a, b) = (rev("a"), rev("b"));
        let mut sim = Sim::new(3, &[], 1, &a);
        // ns-0 fine, ns-1 never ready on b (its Deployment never rolls out).
        let healthy = |ns: &str, r: &str| ns != "ns-1" || r != b.id;
        let mut halted = None;
        for _ in 0..100 {
            for t in sim.step(&b, None) {
                if let Transition::Halted { reason, .. } = t {
                    halted = Some(reason);
                }
            }
            if halted.is_some() {
                break;
            }
            sim.now += 5;
            sim.reconcile(|ns, r| healthy(ns, r));
            // Pending rather than NonCompliant: only the deadline can catch it.
            if let Some(m) = sim.members.get_mut("ns-1")
                && m.health.revision.as_deref() == Some(b.id.as_str())
            {
                m.health.verdict = Some(ComplianceState::Pending);
                m.health.reason = "admission-service: waiting".into();
            }
        }
        let reason = halted.expect("halted");
        assert!(
            reason.contains("ns-1: not done within 60s: admission-service: waiting"),
            "{reason}"
        );
        assert_eq!(sim.st.done, vec!["ns-0".to_string()]);
        assert_eq!(assigned(&sim.st, "ns-0").map(|r| &r.revision), Some(&b.id));
        assert_eq!(assigned(&sim.st, "ns-1").map(|r| &r.revision), Some(&a.id));
        assert_eq!(assigned(&sim.st, "ns-2").map(|r| &r.revision), Some(&a.id));
    }

    #[test]
    fn changing_the_configuration_again_ends_a_halt_and_back_to_stable_cancels() {
        let (a, b, c) = (rev("a"), rev("b"), rev("c"));
        let mut sim = Sim::new(2, &[], 1, &a);
        sim.step(&b, None);
        sim.reconcile(|_, r| r != b.id);
        sim.step(&b, None);
        assert_eq!(sim.st.phase, RolloutPhase::Halted);
        let t = sim.step(&c, None);
        assert!(matches!(t[0], Transition::Started { .. }), "{t:?}");
        assert_eq!(sim.st.target.as_ref().map(|t| &t.revision), Some(&c.id));
        assert!(sim.st.failed.is_empty());
        let t = sim.step(&a, None);
        assert_eq!(
            t,
            vec![Transition::Cancelled {
                revision: c.id.clone()
            }]
        );
        assert_eq!(sim.st.phase, RolloutPhase::Complete);
        assert_eq!(sim.on(&a), 2);
    }

    #[test]
    fn ineligible_hcps_wait_and_a_disabled_rollout_is_all_at_once() {
        let (a, b) = (rev("a"), rev("b"));
        let mut sim = Sim::new(3, &[], 5, &a);
        if let Some(m) = sim.members.get_mut("ns-2") {
            m.eligible = false;
        }
        sim.step(&b, None);
        assert_eq!(
            sim.st.in_flight.len(),
            2,
            "the paused one is not in the batch"
        );
        assert_eq!(assigned(&sim.st, "ns-2").map(|r| &r.revision), Some(&a.id));
        sim.cfg.enabled = false;
        let c = rev("c");
        sim.step(&c, None);
        assert_eq!(sim.st.phase, RolloutPhase::Complete);
        assert_eq!(sim.on(&c), 3);
    }

    #[test]
    fn conditions_follow_the_phase_and_keep_their_times() {
        use hcp_fleet_model::crd::conditions::{ConditionStatus, find};
        let status_of = |st: &AdmissionRolloutStatus, t: &str| {
            find(&st.conditions, t).map(|c| (c.status, c.reason.clone()))
        };
        let complete = with_conditions(None, adopted(&rev("a"), "t0"), Some(1), "t0", None);
        assert_eq!(complete.observed_generation, Some(1));
        assert_eq!(
            status_of(&complete, AVAILABLE),
            Some((ConditionStatus::True, "StableRevision".into()))
        );
        assert_eq!(
            status_of(&complete, PROGRESSING),
            Some((ConditionStatus::False, "Complete".into()))
        );
        assert_eq!(
            status_of(&complete, DEGRADED),
            Some((ConditionStatus::False, "AsExpected".into()))
        );
        let again = with_conditions(
            Some(&complete),
            adopted(&rev("a"), "t0"),
            Some(1),
            "t5",
            None,
        );
        assert_eq!(again, complete, "the same facts render the same status");
        let halted = AdmissionRolloutStatus {
            phase: RolloutPhase::Halted,
            message: "halted: 3 HCPs failed".into(),
            failed: vec![FailedHcp {
                namespace: "ns-1".into(),
                reason: "e2e-probe: no answer".into(),
            }],
            ..complete.clone()
        };
        let halted = with_conditions(Some(&complete), halted, Some(1), "t9", None);
        let degraded = find(&halted.conditions, DEGRADED).expect("Degraded");
        assert_eq!(
            (degraded.status, degraded.reason.as_str()),
            (ConditionStatus::True, "Halted")
        );
        assert!(
            degraded
                .message
                .contains(hcp_fleet_model::crd::admission_rollout::RESUME_ANNOTATION)
        );
        assert_eq!(degraded.last_transition_time, "t9");
        let available = find(&halted.conditions, AVAILABLE).expect("Available");
        assert_eq!(
            available.last_transition_time, "t0",
            "still available since t0"
        );
        // A refused file: the condition says so and why, then goes back when one is accepted.
        assert_eq!(
            status_of(&complete, CONFIGURATION_ACCEPTED),
            Some((ConditionStatus::True, "Accepted".into()))
        );
        let refused = with_conditions(
            Some(&complete),
            adopted(&rev("a"), "t0"),
            Some(1),
            "t7",
            Some("concurrency must be at least 1, got 0"),
        );
        let c = find(&refused.conditions, CONFIGURATION_ACCEPTED).expect("the condition");
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "Refused")
        );
        assert!(
            c.message.contains("concurrency must be at least 1"),
            "{}",
            c.message
        );
        assert_eq!(c.last_transition_time, "t7");
        let back = with_conditions(
            Some(&refused),
            adopted(&rev("a"), "t0"),
            Some(1),
            "t8",
            None,
        );
        assert_eq!(
            status_of(&back, CONFIGURATION_ACCEPTED),
            Some((ConditionStatus::True, "Accepted".into()))
        );
    }

    #[test]
    fn a_revision_is_its_content_and_survives_its_record() {
        let a = rev("a");
        assert_eq!(a, rev("a"));
        assert_ne!(a.id, rev("b").id);
        let mut cfg = AgentConfig::default();
        cfg.certificates.serving_lifetime_days = 7;
        cfg.probe_interval_seconds = 5;
        assert_eq!(
            Revision::of(&cfg).id,
            Revision::of(&AgentConfig::default()).id,
            "agent-side settings are not a revision"
        );
        let back = Revision::from_record(&a.record("now")).expect("reads");
        assert_eq!(back, a);
        assert!(
            Revision::from_record(&RevisionRecord {
                revision: "x".into(),
                content: "{".into(),
                since: String::new()
            })
            .is_err()
        );
    }

    #[test]
    fn selectors_match_labels_and_an_empty_one_selects_nothing() {
        let labels = BTreeMap::from([("wave".to_string(), "canary".to_string())]);
        assert!(!selects(&LabelSelector::default(), &labels));
        let mut sel = LabelSelector::default();
        sel.match_labels.insert("wave".into(), "canary".into());
        assert!(selects(&sel, &labels));
        sel.match_expressions
            .push(hcp_fleet_guards::catalogue::LabelSelectorRequirement {
                key: "tier".into(),
                operator: "DoesNotExist".into(),
                values: vec![],
            });
        assert!(selects(&sel, &labels));
        assert!(!selects(&sel, &BTreeMap::new()));
    }

    #[test]
    fn max_unavailable_counts_and_percentages() {
        assert_eq!(MaxUnavailable::Count(3).of(10), Ok(3));
        assert_eq!(MaxUnavailable::Percent("10%".into()).of(1000), Ok(100));
        assert_eq!(MaxUnavailable::Percent("10%".into()).of(5), Ok(1));
        assert!(MaxUnavailable::Percent("0%".into()).of(5).is_err());
        assert!(MaxUnavailable::Percent("ten".into()).of(5).is_err());
        assert!(MaxUnavailable::Count(0).of(5).is_err());
    }
}
