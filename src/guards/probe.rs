//! The end-to-end probe: a ConfigMap carrying the probe label is always denied, whatever the
//! mode or the identity, so the agent's dry-run create proves that the hosted kube-apiserver
//! reaches the admission service. It stays a webhook: only a call to the service proves that.

use serde_json::{Value, json};

use super::case::{Case, Want};
use super::{CelForm, Guard, Scope};
use crate::admission::policies::Settings;
use crate::admission::review::{Decision, Request};
use crate::catalogue::{BuiltinRow, Mode, PROBE_ANSWER, PROBE_LABEL, WebhookKind, rule};
use crate::config::AdmissionConfig;

pub struct Probe;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "probe.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/probe",
    rules: &[rule(&["CREATE"], &[""], &["configmaps"])],
    mode: Mode::Enforce,
    only_labelled: Some(PROBE_LABEL),
};

pub(crate) fn is_probe(req: &Request) -> bool {
    req.object
        .as_ref()
        .and_then(|o| o["metadata"]["labels"][PROBE_LABEL].as_str())
        == Some("true")
}

impl Guard for Probe {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if is_probe(req) {
            Decision::deny(PROBE_ANSWER)
        } else {
            Decision::allow()
        }
    }

    fn cel(&self, _: &AdmissionConfig) -> Option<CelForm> {
        None
    }

    fn scope(&self) -> Scope {
        Scope::Everyone
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let cm = |labels: Value| json!({"metadata": {"name": "p", "labels": labels}});
        let create = ("CREATE", "", "configmaps", "p");
        vec![
            Case::new("a labelled ConfigMap", Deny, create)
                .namespaced("default")
                .objects(cm(json!({PROBE_LABEL: "true"})), Value::Null),
            Case::new("a labelled ConfigMap by an exempt user", Deny, create)
                .namespaced("default")
                .objects(cm(json!({PROBE_LABEL: "true"})), Value::Null)
                .by("system:admin", &["system:masters"]),
            Case::new("another label value", Allow, create)
                .namespaced("team-a")
                .objects(cm(json!({PROBE_LABEL: "yes"})), Value::Null),
            Case::new("no label", Allow, create)
                .namespaced("team-a")
                .objects(cm(json!({})), Value::Null),
        ]
    }
}
