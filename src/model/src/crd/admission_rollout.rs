//! The rollout's own resources (derived from these structs, shipped by the chart like
//! `health`'s):
//!
//! - `AdmissionRollout`: one, named `fleet`, in the agent's namespace. Its status is the
//!   rollout's durable state: the last good revision and the one on its way (each with the
//!   content it rolls out, so a rollback or a pin needs nothing from the configuration file), the
//!   canaries, the HCPs in flight and done, the failed ones and why it halted. A new leader reads
//!   it and carries on from there. An operator resumes a halted revision with the
//!   `hcp-fleet.openshift.io/resume` annotation (docs/operations.md).
//! - `HostedAdmissionOverride`: at most one per HCP namespace, an SRE's exception for that
//!   hosted cluster (pause, a guard's mode, extra exempt users or groups, a pinned revision).
//!   The API server checks its shape (OpenAPI, and CEL rules where it runs them); the agent
//!   checks it again against the configuration (the guard names, the revisions it knows, the
//!   guardrails) and says in its status whether it took it and what is in effect.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use crate::Mode;

/// The one rollout object's name.
pub const ROLLOUT_NAME: &str = "fleet";
/// Set to the halted revision on the `AdmissionRollout` to resume it; the agent removes it once
/// it has.
pub const RESUME_ANNOTATION: &str = "hcp-fleet.openshift.io/resume";

/// The fleet's rollout: all of it is status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hcp-fleet.openshift.io",
    version = "v1alpha1",
    kind = "AdmissionRollout",
    plural = "admissionrollouts",
    shortname = "arollout",
    category = "hcp-fleet",
    doc = "The fleet's rollout of admission revisions, one object named fleet in the agent's namespace, all of it status written by hcp-fleet-agent: the stable and target revisions, canaries, waves, the HCPs in flight, done and failed, and Available, Progressing and Degraded conditions.",
    namespaced,
    status = "AdmissionRolloutStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Stable","type":"string","jsonPath":".status.stable.revision"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".status.target.revision"}"#,
    printcolumn = r#"{"name":"Wave","type":"string","jsonPath":".status.wave"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#
)]
pub struct AdmissionRolloutSpec {}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Every HCP in the rollout runs the stable revision (nothing on its way).
    #[default]
    Complete,
    /// A target revision is going out, wave by wave.
    Progressing,
    /// A target failed on some HCP: nothing more gets it until the configuration changes or
    /// an operator resumes it.
    Halted,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Complete => "Complete",
            RolloutPhase::Progressing => "Progressing",
            RolloutPhase::Halted => "Halted",
        }
    }
}

/// The rollout's durable state, written by the leading agent only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRolloutStatus {
    /// The object's `metadata.generation` this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Available` (a stable revision serves every HCP in the rollout), `Progressing` (a
    /// target is going out), `Degraded` (halted, or some HCP failed the target) and
    /// `ConfigurationAccepted` (False while the agent's configuration file is refused and the
    /// last good one runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::list_schema")]
    pub conditions: Vec<Condition>,
    /// `Complete`, `Progressing` or `Halted`.
    #[serde(default)]
    pub phase: RolloutPhase,
    /// The last good revision: what every HCP not yet given the target runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<RevisionRecord>,
    /// The revision on its way (absent when the rollout is complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<RevisionRecord>,
    /// Earlier good revisions, newest first (a pin may name one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RevisionRecord>,
    /// The target's canary HCP namespaces, fixed when it started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canaries: Vec<String>,
    /// `canary`, `batch N`, or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<String>,
    /// Batches started for the target so far (the canary batches included).
    #[serde(default)]
    pub batches: u32,
    /// HCPs given the target in the current batch, not yet done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<InFlight>,
    /// HCPs done with the target (they keep it while the rollout is halted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done: Vec<String>,
    /// HCPs that failed the target, back on the stable revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedHcp>,
    /// What an SRE reads first: where the rollout is, or why it halted.
    #[serde(default)]
    pub message: String,
}

/// One revision and what it rolls out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionRecord {
    /// The content hash.
    pub revision: String,
    /// The admission image and settings and the webhook definitions, as JSON.
    pub content: String,
    /// When it became this record (RFC 3339).
    #[serde(default)]
    pub since: String,
}

/// An HCP given the target revision in the current batch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    /// The HCP namespace.
    pub namespace: String,
    /// When it was given the target (RFC 3339): its deadline runs from here.
    pub since: String,
    /// Whether it was Compliant (on the stable revision) when its batch started; one that was
    /// not is never held against the new revision. Absent in records of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_compliant: Option<bool>,
}

/// An HCP that failed the target revision and went back to the stable one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedHcp {
    /// The HCP namespace.
    pub namespace: String,
    /// What failed: the concern and its message, or the deadline passed.
    pub reason: String,
}

/// An SRE's exception for one hosted cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hcp-fleet.openshift.io",
    version = "v1alpha1",
    kind = "HostedAdmissionOverride",
    plural = "hostedadmissionoverrides",
    shortname = "hao",
    category = "hcp-fleet",
    doc = "An SRE's exception for one hosted cluster, at most one per HCP namespace: pause the agent, set a guard's mode, exempt more users or groups, or pin a revision. The agent checks it against its configuration and says in the Accepted condition whether it took it.",
    namespaced,
    status = "HostedAdmissionOverrideStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HostedAdmissionOverrideSpec {
    /// Why the exception exists (who asked, the ticket): shown by `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub reason: Option<String>,
    /// The agent changes nothing for this HCP (as the pause annotation).
    #[serde(default)]
    pub paused: bool,
    /// Keep this HCP on a revision the agent knows (`hcp-fleet-agent status` lists them),
    /// whatever the fleet rolls out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{16}$"))]
    pub revision: Option<String>,
    /// A guard's mode for this hosted cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(g, self.exists_one(h, h.name == g.name))", "message": "each guard may be named once"}
    ]))]
    pub guards: Vec<GuardOverride>,
    /// Users the guards let through on this hosted cluster, besides the configured ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(u, u != '*' && u != 'system:anonymous')", "message": "exempting every user or anonymous requests turns the guards off: set a guard's mode to off instead"}
    ]))]
    pub exempt_users: Vec<String>,
    /// Groups the guards let through on this hosted cluster, besides the configured ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(g, !(g in ['system:authenticated', 'system:unauthenticated', 'system:serviceaccounts']))", "message": "exempting every authenticated user, every anonymous one or every service account turns the guards off: set a guard's mode to off instead"}
    ]))]
    pub exempt_groups: Vec<String>,
}

/// One guard's mode on one hosted cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.name != 'probe.hcp-fleet.openshift.io'", "message": "the probe proves the admission path works; its mode cannot be overridden"}
]))]
pub struct GuardOverride {
    /// The guard's webhook name, e.g. `featuregate.hcp-fleet.openshift.io`.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
    /// `enforce`, `warn` or `off` on this hosted cluster.
    pub mode: Mode,
}

/// Whether the agent took the override, and what is in effect.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedAdmissionOverrideStatus {
    /// The generation this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: `True` when the agent applies it, `False` (with the reason) when it does
    /// not, and then the HCP runs as if it had no override.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::list_schema")]
    pub conditions: Vec<Condition>,
    /// `True` or `False`, as the `Accepted` condition (kept for readers of earlier releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<String>,
    /// What is in effect, or why it was refused.
    #[serde(default)]
    pub message: String,
    /// The revision this HCP runs because of it (a pin), or the fleet's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}
