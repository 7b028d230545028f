//! Conditions in Kubernetes' own shape (`metav1.Condition`) on every status the agent writes,
//! so the tools SREs already use read them without being told about this project:
//! `kubectl wait --for=condition=Ready`, kstatus (Argo CD and Flux health checks), OLM.
//!
//! The time is kept as the RFC 3339 text the API server stores, like every other timestamp in
//! these statuses: the renderers stay pure (the caller passes "now") and comparing a status
//! with the one just rendered never differs on a time's formatting alone.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One aspect of an object's state (`metav1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The aspect, in CamelCase: `Ready`, `Accepted`, `Progressing`, …
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    /// `True`, `False` or `Unknown` (not yet known, as while an HCP is Pending).
    pub status: ConditionStatus,
    /// The object's `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// When `status` last changed (RFC 3339); a new reason or message alone keeps it.
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// Why, as one CamelCase word a program can match on.
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    )]
    pub reason: String,
    /// Why, for a person: what is wrong and what to do next, or what is in effect.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub message: String,
}

/// A condition's status.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    #[default]
    Unknown,
}

impl ConditionStatus {
    pub fn from_bool(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// What a condition should say now; `set` adds the transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want<'a> {
    pub type_: &'a str,
    pub status: ConditionStatus,
    pub reason: &'a str,
    pub message: String,
}

/// The condition `want` describes, keeping the previous transition time where its status has
/// not changed (as apimachinery's `meta.SetStatusCondition`), so a status rendered again from
/// the same facts is the same status and costs no write.
pub fn set(prev: &[Condition], want: Want<'_>, generation: Option<i64>, now: &str) -> Condition {
    let since = prev
        .iter()
        .find(|c| c.type_ == want.type_ && c.status == want.status)
        .map_or_else(|| now.to_string(), |c| c.last_transition_time.clone());
    Condition {
        type_: want.type_.to_string(),
        status: want.status,
        observed_generation: generation,
        last_transition_time: since,
        reason: want.reason.to_string(),
        message: want.message,
    }
}

/// The conditions `wants` describe, in that order, each keeping its transition time from
/// `prev` where its status is unchanged.
pub fn set_all<'a>(
    prev: &[Condition],
    wants: impl IntoIterator<Item = Want<'a>>,
    generation: Option<i64>,
    now: &str,
) -> Vec<Condition> {
    wants
        .into_iter()
        .map(|w| set(prev, w, generation, now))
        .collect()
}

/// The condition of this type, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `x-kubernetes-list-type: map` keyed by `type`: server-side apply and strategic merge treat
/// each condition as its own entry, as they do for the built-in kinds.
pub(crate) fn list_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = <Vec<Condition>>::json_schema(g);
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(status: ConditionStatus, reason: &str) -> Want<'_> {
        Want {
            type_: "Ready",
            status,
            reason,
            message: format!("{reason} message"),
        }
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let first = set(&[], want(ConditionStatus::False, "Broken"), Some(1), "t1");
        assert_eq!(first.last_transition_time, "t1");
        // Another reason, same status: the time stays, the rest follows.
        let same = set(
            std::slice::from_ref(&first),
            want(ConditionStatus::False, "Other"),
            Some(2),
            "t2",
        );
        assert_eq!(same.last_transition_time, "t1");
        assert_eq!(same.reason, "Other");
        assert_eq!(same.observed_generation, Some(2));
        let flipped = set(&[same], want(ConditionStatus::True, "Fine"), Some(2), "t3");
        assert_eq!(flipped.last_transition_time, "t3");
        assert_eq!(flipped.status, ConditionStatus::True);
    }

    #[test]
    fn rendering_again_from_the_same_facts_is_the_same_list() {
        let wants = || {
            [
                want(ConditionStatus::True, "Fine"),
                Want {
                    type_: "Other",
                    ..want(ConditionStatus::Unknown, "Waiting")
                },
            ]
        };
        let once = set_all(&[], wants(), Some(3), "t1");
        let again = set_all(&once, wants(), Some(3), "t9");
        assert_eq!(once, again);
        assert_eq!(
            find(&again, "Other").map(|c| c.status),
            Some(ConditionStatus::Unknown)
        );
    }

    #[test]
    fn it_serializes_as_metav1_condition() {
        let c = set(
            &[],
            want(ConditionStatus::True, "Fine"),
            Some(4),
            "2026-01-02T03:04:05Z",
        );
        let v = serde_json::to_value(&c).expect("serialize");
        assert_eq!(
            v,
            serde_json::json!({
                "type": "Ready", "status": "True", "observedGeneration": 4,
                "lastTransitionTime": "2026-01-02T03:04:05Z", "reason": "Fine",
                "message": "Fine message"
            })
        );
        // And k8s-openapi's own type reads it back.
        let theirs: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition =
            serde_json::from_value(v).expect("metav1.Condition");
        assert_eq!(theirs.type_, "Ready");
        assert_eq!(theirs.observed_generation, Some(4));
    }
}
