//! Reporting (docs/reporting.md), in two rooms: `record`, each HCP's `AdmissionHealth` (an
//! entry and a condition per concern, bounded history, the one Event a report makes), and `hub`,
//! what ACM's hub is told (the verdict of the `AdmissionHealthPolicy` templates: the fleet's
//! summary and each hosted cluster's own row). Here what both speak: the concerns (`CONCERNS`,
//! one row each), an observation of one, and the text rules (`untrusted`, `cut`, ACM's message
//! form).
//!
//! Everything here is pure; the controller reads the current status, calls
//! `record::next_status` / `hub::evaluate_template` and writes only when the result differs, so
//! a steady fleet causes no writes.

pub mod hub;
pub mod record;

use std::collections::BTreeMap;

use hcp_fleet_model::crd::ComplianceState;

/// The concerns, in the order they appear in the health record (`CONCERNS` has a row for
/// each, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Concern {
    AdmissionService,
    Certificate,
    HostedWebhooks,
    EndToEndProbe,
}

/// Everything the record, the hub and the docs say of one concern. Adding a health condition
/// is a variant of `Concern` and its row here; the tests then ask for it in docs/reporting.md,
/// docs/api.md and the CRD's doc text, and the compiler for the phase that observes it
/// (`agent/controller/error.rs`). The recipe: docs/architecture.md, "Recipes", "A health
/// condition".
#[derive(Debug)]
pub struct ConcernRow {
    pub concern: Concern,
    /// Its entry's name in the record's `concerns`, and its name in the hub's messages and in
    /// a hosted cluster's row (`hosted-webhooks: …`).
    pub name: &'static str,
    /// The type of its condition on the health record.
    pub condition_type: &'static str,
    /// The `Ready` condition's reason when this concern is the first that is not.
    pub not_ready_reason: &'static str,
}

/// One row per concern, in `Concern`'s order.
pub const CONCERNS: [ConcernRow; 4] = [
    ConcernRow {
        concern: Concern::AdmissionService,
        name: "admission-service",
        condition_type: "AdmissionServiceReady",
        not_ready_reason: "AdmissionServiceNotReady",
    },
    ConcernRow {
        concern: Concern::Certificate,
        name: "certificate",
        condition_type: "CertificateReady",
        not_ready_reason: "CertificateNotReady",
    },
    ConcernRow {
        concern: Concern::HostedWebhooks,
        name: "hosted-webhooks",
        condition_type: "HostedWebhooksReady",
        not_ready_reason: "HostedWebhooksNotReady",
    },
    ConcernRow {
        concern: Concern::EndToEndProbe,
        name: "e2e-probe",
        condition_type: "EndToEndProbeReady",
        not_ready_reason: "EndToEndProbeNotReady",
    },
];

impl Concern {
    pub const ALL: [Concern; CONCERNS.len()] = {
        let mut all = [Concern::AdmissionService; CONCERNS.len()];
        let mut i = 0;
        while i < CONCERNS.len() {
            all[i] = CONCERNS[i].concern;
            i += 1;
        }
        all
    };

    /// This concern's row.
    pub fn row(self) -> &'static ConcernRow {
        // `CONCERNS` is in `Concern`'s order (a test holds it to that).
        &CONCERNS[self as usize]
    }

    /// Its name in the record and on the hub (`hosted-webhooks`).
    pub fn template_name(self) -> &'static str {
        self.row().name
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `Concern::row` indexes `CONCERNS` by the variant: the table must be in the enum's order,
    /// one row each, and no two rows may share a name or a condition type.
    #[test]
    fn the_concerns_table_has_one_row_per_concern_in_order() {
        for (i, row) in CONCERNS.iter().enumerate() {
            assert_eq!(row.concern as usize, i, "{row:?}");
            assert_eq!(row.concern.row().name, row.name);
            for other in &CONCERNS[..i] {
                assert_ne!(other.name, row.name);
                assert_ne!(other.condition_type, row.condition_type);
                assert_ne!(other.not_ready_reason, row.not_ready_reason);
            }
        }
    }

    /// Every place that documents the record names every concern and its condition: the
    /// operators' page, the API reference and the CRD's own doc text (which `kubectl explain`
    /// shows).
    #[test]
    fn every_concern_is_documented_wherever_the_record_is() {
        let places = [
            (
                "docs/reporting.md",
                include_str!("../../../../docs/reporting.md"),
            ),
            ("docs/api.md", include_str!("../../../../docs/api.md")),
            (
                "src/model/src/crd/health.rs",
                include_str!("../../../model/src/crd/health.rs"),
            ),
        ];
        for (path, text) in places {
            for row in &CONCERNS {
                for word in [row.name, row.condition_type] {
                    assert!(
                        text.contains(&format!("`{word}`")) || text.contains(&format!(" {word},")),
                        "{path} does not name {word}"
                    );
                }
            }
        }
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

    pub(crate) fn all(state: ComplianceState, msg: &str) -> Observations {
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
}
