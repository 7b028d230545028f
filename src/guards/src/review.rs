//! AdmissionReview v1 on the wire: a strict decoder that turns every malformed input into a
//! clear client error (never a panic), and the response encoder.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a request body is not an AdmissionReview v1 we can answer. Each is a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("body is not valid JSON: {0}")]
    Json(String),
    #[error("apiVersion must be admission.k8s.io/v1, got {0:?}")]
    ApiVersion(String),
    #[error("kind must be AdmissionReview, got {0:?}")]
    Kind(String),
    #[error("AdmissionReview has no request")]
    MissingRequest,
    #[error("request is malformed: {0}")]
    Request(String),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupVersionKind {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) kind: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupVersionResource {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) resource: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// What the authenticator (or an `Impersonate-Extra-` header) added: the agent's canaries
    /// carry their nonce here (`guards::canary::NONCE_EXTRA`).
    #[serde(default)]
    pub(crate) extra: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    pub(crate) kind: GroupVersionKind,
    pub(crate) resource: GroupVersionResource,
    #[serde(default)]
    pub(crate) sub_resource: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub(crate) operation: String,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub(crate) object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub(crate) dry_run: Option<bool>,
}

impl Request {
    /// Every name this request is about: the object's as it will be stored (CREATE and
    /// UPDATE, after every mutating admission, the tenant's own included), the old object's
    /// (UPDATE and DELETE: each object of a collection delete, whose request names none), and
    /// the name the client asked for. A guard that protects names judges all of them: the
    /// name asked for, before mutation, can only add a denial, never take one away.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        fn of(o: Option<&Value>) -> Option<&str> {
            o.and_then(|o| o["metadata"]["name"].as_str())
        }
        [
            of(self.object.as_ref()),
            of(self.old_object.as_ref()),
            self.name.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|n| !n.is_empty())
    }

    /// Whether this is one of `operations` on the resource `group`/`resource` itself (no
    /// subresource): the requests a guard of one kind judges.
    pub(crate) fn is_one_of(&self, operations: &[&str], group: &str, resource: &str) -> bool {
        operations.contains(&self.operation.as_str())
            && self.resource.group == group
            && self.resource.resource == resource
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// The name to show for this request: the stored object's (the new one, else the old
    /// one), else the name asked for.
    pub(crate) fn stored_name(&self) -> &str {
        self.names().next().unwrap_or_default()
    }
}

/// The envelope of a review, decoded straight into types: no `Value` is built for the
/// envelope or the request (only for the objects the guards read).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion", default, borrow)]
    api_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    request: Option<Request>,
}

/// Decodes a request body. A well-formed review is decoded in one typed pass; anything else
/// is decoded again the slow way, which checks the envelope first so the error names what is
/// wrong (the same answer either way: the typed pass only ever accepts what the slow one does).
pub fn decode(body: &[u8]) -> Result<Request, ReviewError> {
    if let Ok(Envelope {
        api_version: Some(v),
        kind: Some(k),
        request: Some(req),
    }) = serde_json::from_slice::<Envelope>(body)
        && v == "admission.k8s.io/v1"
        && k == "AdmissionReview"
    {
        return checked(req);
    }
    decode_checking_the_envelope(body)
}

fn decode_checking_the_envelope(body: &[u8]) -> Result<Request, ReviewError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| ReviewError::Json(e.to_string()))?;
    let Some(env) = v.as_object_mut() else {
        return Err(ReviewError::Json("body is not a JSON object".into()));
    };
    let field = |env: &serde_json::Map<String, Value>, k: &str| {
        env.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let api_version = field(env, "apiVersion");
    if api_version != "admission.k8s.io/v1" {
        return Err(ReviewError::ApiVersion(api_version));
    }
    let kind = field(env, "kind");
    if kind != "AdmissionReview" {
        return Err(ReviewError::Kind(kind));
    }
    let req = env
        .remove("request")
        .filter(|r| !r.is_null())
        .ok_or(ReviewError::MissingRequest)?;
    let req: Request =
        serde_json::from_value(req).map_err(|e| ReviewError::Request(e.to_string()))?;
    checked(req)
}

fn checked(req: Request) -> Result<Request, ReviewError> {
    if req.uid.is_empty() {
        return Err(ReviewError::Request("uid is empty".into()));
    }
    if !["CREATE", "UPDATE", "DELETE", "CONNECT"].contains(&req.operation.as_str()) {
        return Err(ReviewError::Request(format!(
            "unknown operation {:?}",
            req.operation
        )));
    }
    Ok(req)
}

/// What a webhook decided, before encoding.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    pub allowed: bool,
    /// Shown to the user on a denial.
    pub message: Option<String>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    /// JSON Patch operations (mutating webhooks).
    pub patch: Vec<Value>,
}

impl Decision {
    pub fn allow() -> Self {
        Self {
            allowed: true,
            ..Self::default()
        }
    }

    pub(crate) fn deny(message: impl Into<String>) -> Self {
        Self {
            allowed: false,
            message: Some(message.into()),
            ..Self::default()
        }
    }
}

#[derive(Serialize)]
struct Out<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    response: Response<'a>,
}

/// The AdmissionResponse, written straight from the decision: a `json!` tree of it was built
/// and dropped for every review, a few percent of the service's time under load (`make bench`,
/// perf). Its fields in the order the tree's sorted map wrote them, so the bytes are as before.
#[derive(Serialize)]
struct Response<'a> {
    allowed: bool,
    #[serde(
        rename = "auditAnnotations",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    audit_annotations: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(rename = "patchType", skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status<'a>>,
    uid: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Serialize)]
struct Status<'a> {
    code: u16,
    message: &'a str,
    reason: &'a str,
}

/// The AdmissionReview response for `uid`.
pub fn encode(uid: &str, d: &Decision) -> Vec<u8> {
    let patch = (d.allowed && !d.patch.is_empty()).then(|| {
        let patch = serde_json::to_vec(&d.patch).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(patch)
    });
    serde_json::to_vec(&Out {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: Response {
            allowed: d.allowed,
            audit_annotations: &d.audit_annotations,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            status: (!d.allowed).then(|| Status {
                code: 403,
                message: d.message.as_deref().unwrap_or("denied"),
                reason: "Forbidden",
            }),
            uid,
            warnings: &d.warnings,
        },
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn review(op: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Service"},
                "resource": {"group": "", "version": "v1", "resource": "services"},
                "namespace": "default",
                "operation": op,
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": object,
            }
        }))
        .expect("json")
    }

    #[test]
    fn decodes_a_real_shape() {
        let r = decode(&review("CREATE", json!({"metadata": {"name": "x"}}))).expect("ok");
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.user_info.username, "alice");
        assert_eq!(r.resource.resource, "services");
    }

    #[test]
    fn malformed_inputs_have_clear_errors() {
        assert!(matches!(decode(b"{nope"), Err(ReviewError::Json(_))));
        assert!(matches!(decode(b"[]"), Err(ReviewError::Json(_))));
        let wrong =
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#;
        assert_eq!(
            decode(wrong),
            Err(ReviewError::ApiVersion("admission.k8s.io/v1beta1".into()))
        );
        let kind = br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#;
        assert_eq!(decode(kind), Err(ReviewError::Kind("Pod".into())));
        let missing = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert_eq!(decode(missing), Err(ReviewError::MissingRequest));
        let partial = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x"}}"#;
        assert!(matches!(decode(partial), Err(ReviewError::Request(_))));
        let bad_op = review("DESTROY", json!({}));
        assert!(matches!(decode(&bad_op), Err(ReviewError::Request(m)) if m.contains("DESTROY")));
    }

    #[test]
    fn responses_carry_status_warnings_and_patches() {
        let mut d = Decision::deny("no");
        d.warnings.push("w".into());
        let v: Value = serde_json::from_slice(&encode("u", &d)).expect("json");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 403);
        assert_eq!(v["response"]["status"]["message"], "no");
        assert_eq!(v["response"]["warnings"][0], "w");
        let mut a = Decision::allow();
        a.patch
            .push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        let v: Value = serde_json::from_slice(&encode("u", &a)).expect("json");
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v["response"]["patch"].as_str().expect("patch"))
            .expect("b64");
        let ops: Vec<Value> = serde_json::from_slice(&raw).expect("ops");
        assert_eq!(ops[0]["op"], "add");
    }

    #[test]
    fn the_response_is_written_byte_for_byte_as_its_json_tree_was() {
        // The tree `encode` built before it wrote the response straight from the decision.
        let tree = |uid: &str, d: &Decision| {
            let mut r = json!({ "uid": uid, "allowed": d.allowed });
            if !d.allowed {
                r["status"] = json!({"code": 403, "reason": "Forbidden",
                    "message": d.message.clone().unwrap_or_else(|| "denied".into())});
            }
            if !d.warnings.is_empty() {
                r["warnings"] = json!(d.warnings);
            }
            if !d.audit_annotations.is_empty() {
                r["auditAnnotations"] = json!(d.audit_annotations);
            }
            if d.allowed && !d.patch.is_empty() {
                let patch = serde_json::to_vec(&d.patch).expect("patch");
                r["patchType"] = json!("JSONPatch");
                r["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
            }
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview", "response": r}))
            .expect("tree")
        };
        let mut denied = Decision::deny("no \"quotes\" here");
        denied.warnings.push("w".into());
        denied
            .audit_annotations
            .insert("would-deny".into(), "x".into());
        let mut mutated = Decision::allow();
        mutated
            .patch
            .push(json!({"op": "add", "path": "/a", "value": 1}));
        mutated.warnings.push("warned".into());
        let mut no_message = Decision::deny("");
        no_message.message = None;
        for d in [Decision::allow(), denied, mutated, no_message] {
            assert_eq!(
                String::from_utf8_lossy(&encode("u-1", &d)),
                String::from_utf8_lossy(&tree("u-1", &d))
            );
        }
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        fn json_value() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                ".{0,12}".prop_map(serde_json::Value::from),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                    prop::collection::btree_map(
                        prop_oneof![
                            Just("apiVersion".to_string()),
                            Just("kind".to_string()),
                            Just("request".to_string()),
                            Just("uid".to_string()),
                            Just("operation".to_string()),
                            Just("userInfo".to_string()),
                            "[a-z]{1,8}",
                        ],
                        inner,
                        0..6
                    )
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                let _ = decode(&bytes);
            }

            #[test]
            fn arbitrary_json_never_panics_and_ok_means_valid(v in json_value()) {
                let bytes = serde_json::to_vec(&v).unwrap_or_default();
                if let Ok(r) = decode(&bytes) {
                    prop_assert!(!r.uid.is_empty());
                    prop_assert_eq!(&v["apiVersion"], "admission.k8s.io/v1");
                }
            }

            #[test]
            fn envelope_with_arbitrary_request_never_panics(req in json_value()) {
                let body = serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req
                })).unwrap_or_default();
                let _ = decode(&body);
            }

            /// The typed pass and the envelope-first decoder give the same answer, on
            /// reviews whose request is arbitrary and on ones shaped like real requests.
            #[test]
            fn the_typed_pass_agrees_with_the_envelope_first_decoder(
                req in json_value(),
                uid in "[a-z0-9-]{0,8}",
                op in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "X"]),
                object in json_value(),
                api in prop::sample::select(vec!["admission.k8s.io/v1", "v1"]),
            ) {
                let shaped = serde_json::json!({
                    "uid": uid, "operation": op, "object": object,
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "userInfo": {"username": "u", "groups": ["g"]},
                });
                for request in [req, shaped] {
                    let body = serde_json::to_vec(&serde_json::json!({
                        "apiVersion": api, "kind": "AdmissionReview", "request": request
                    })).unwrap_or_default();
                    prop_assert_eq!(decode(&body), decode_checking_the_envelope(&body));
                }
            }
        }
    }
}
