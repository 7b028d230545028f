//! New Services get the managed annotation (a mutation; warn mode by default, where it only
//! says what it would add). As a MutatingAdmissionPolicy in enforce mode; in warn mode, where
//! no mutating policy can warn, as a ValidatingAdmissionPolicy that warns where the Service
//! lacks it (`hosted::admission_policies` in render).

use serde_json::{Value, json};

use super::Settings;
use super::case::{Case, Want};
use super::cel;
use super::{CelForm, Guard, MutationForm};
use crate::catalogue::{BuiltinRow, WebhookKind, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct ServiceAnnotation;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "service-annotation.hcp-fleet.openshift.io",
    kind: WebhookKind::Mutating,
    path: "/mutate/service-annotation",
    rules: &[rule(&["CREATE"], &[""], &["services"])],
    mode: Mode::Warn,
    only_labelled: None,
};

/// JSON Pointer escaping (RFC 6901).
pub(crate) fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

impl Guard for ServiceAnnotation {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if req.operation != "CREATE"
            || req.resource.resource != "services"
            || !req.resource.group.is_empty()
        {
            return Decision::allow();
        }
        let Some(obj) = req.object() else {
            return Decision::allow();
        };
        let annotations = &obj["metadata"]["annotations"];
        if annotations[&s.service_annotation_key].as_str()
            == Some(s.service_annotation_value.as_str())
        {
            return Decision::allow();
        }
        let mut d = Decision::allow();
        d.patch = if annotations.is_object() {
            vec![json!({
                "op": "add",
                "path": format!("/metadata/annotations/{}", pointer_escape(&s.service_annotation_key)),
                "value": s.service_annotation_value,
            })]
        } else {
            vec![json!({
                "op": "add",
                "path": "/metadata/annotations",
                "value": {s.service_annotation_key.clone(): s.service_annotation_value.clone()},
            })]
        };
        d
    }

    /// Not a validating guard: its change is `mutation`.
    fn cel(&self, _: &Settings) -> Option<CelForm> {
        None
    }

    /// The annotation set to the configured value where it is missing or differs (the
    /// patch's `add` replaces a different value too), on CREATE of a core Service.
    fn mutation(&self, s: &Settings) -> Option<MutationForm> {
        let key = cel::string(&s.service_annotation_key);
        let value = cel::string(&s.service_annotation_value);
        Some(MutationForm {
            applies: format!(
                "request.operation == 'CREATE' \
                 && !(has(object.metadata.annotations) && {key} in object.metadata.annotations \
                 && object.metadata.annotations[{key}] == {value})"
            ),
            variables: Vec::new(),
            apply_configuration: format!(
                "Object{{metadata: Object.metadata{{annotations: {{{key}: {value}}}}}}}"
            ),
        })
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let svc = |annotations: Value| json!({"metadata": {"name": "s", "annotations": annotations}, "spec": {}});
        let create = ("CREATE", "", "services", "s");
        vec![
            Case::new("a Service without the annotation", Deny, create)
                .namespaced("team-a")
                .objects(svc(json!({"a": "b"})), Value::Null),
            Case::new("a Service without annotations", Deny, create)
                .namespaced("team-a")
                .objects(json!({"metadata": {"name": "s"}}), Value::Null),
            Case::new("a Service that has it", Allow, create)
                .namespaced("team-a")
                .objects(
                    svc(json!({"hcp-fleet.openshift.io/managed": "true"})),
                    Value::Null,
                ),
            Case::new("in an exempt namespace", Allow, create)
                .namespaced("openshift-ingress")
                .objects(svc(json!({})), Value::Null),
        ]
    }
}
