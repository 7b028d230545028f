//! Every LoadBalancer Service carries the AWS tag `red-hat-managed=true` on the load balancer the
//! cloud provider makes for it (`service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags`),
//! merged into the tags the Service's writer asked for, on create and on every update: MCVW's
//! `service-mutation` on HyperShift, which the service's AWS accounting relies on.
//!
//! - What it writes: the annotation's tags with `red-hat-managed=true` first and any other
//!   `red-hat-managed=` tag dropped (a writer cannot set it to something else), the rest kept in
//!   order; nothing where the tag is there already.
//! - Tags are compared trimmed, as the cloud provider reads them (`a=b, red-hat-managed=true`
//!   has it); MCVW compares them as written and would add it a second time.
//! - Whose Services: everyone's, the platform's router among them (MCVW exempts no one, and the
//!   tag is for every load balancer the cluster's account pays for); it exempts no identity
//!   class and no namespace.
//! - Two engines: the admission service's JSON patch, and where the hosted kube-apiserver
//!   serves `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy (Kubernetes 1.36), the
//!   same merge in CEL (`mutation`), held to the same table of cases.

use serde_json::{Value, json};

use super::Settings;
use super::canary::{Canary, Effect};
use super::case::{Case, Want};
use super::cel;
use super::identities::IdentityClass;
use super::service_annotation::pointer_escape;
use super::{CelForm, Guard, MutationForm, Scope};
use crate::catalogue::{BuiltinRow, WebhookKind, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct ServiceTags;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "service-tags.hcp-fleet.openshift.io",
    kind: WebhookKind::Mutating,
    path: "/mutate/service-tags",
    rules: &[rule(&["CREATE", "UPDATE"], &[""], &["services"])],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// The annotation the AWS cloud provider reads a load balancer's extra tags from.
pub const TAGS_ANNOTATION: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
/// The tag's key, and the tag.
const KEY: &str = "red-hat-managed=";
pub const TAG: &str = "red-hat-managed=true";

/// The annotation's value with the tag merged in, or `None` where it has it already.
pub fn merged(value: Option<&str>) -> Option<String> {
    let tags: Vec<&str> = value
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default();
    if tags.contains(&TAG) {
        return None;
    }
    let mut out = vec![TAG];
    out.extend(
        tags.into_iter()
            .filter(|t| !t.is_empty() && !t.starts_with(KEY)),
    );
    Some(out.join(","))
}

impl Guard for ServiceTags {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    /// No namespace is left out (the router's Service is in `openshift-ingress`).
    fn scope(&self) -> Scope {
        Scope::Identities
    }

    /// No one: every load balancer gets the tag.
    fn exempt_classes(&self) -> &'static [IdentityClass] {
        &[]
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if !req.is_one_of(&["CREATE", "UPDATE"], "", "services") {
            return Decision::allow();
        }
        let Some(obj) = req.object() else {
            return Decision::allow();
        };
        if obj["spec"]["type"].as_str() != Some("LoadBalancer") {
            return Decision::allow();
        }
        let annotations = &obj["metadata"]["annotations"];
        let current = annotations.get(TAGS_ANNOTATION);
        let Some(value) = merged(current.and_then(Value::as_str)) else {
            return Decision::allow();
        };
        let mut d = Decision::allow();
        d.patch = vec![if annotations.is_object() {
            json!({
                "op": if current.is_some() { "replace" } else { "add" },
                "path": format!("/metadata/annotations/{}", pointer_escape(TAGS_ANNOTATION)),
                "value": value,
            })
        } else {
            json!({"op": "add", "path": "/metadata/annotations", "value": {TAGS_ANNOTATION: value}})
        }];
        d
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        None
    }

    /// `merged` in CEL: the tags split at commas and trimmed (cel-go's `trim` and Rust's both
    /// take Unicode's white space), the tag first and every other `red-hat-managed=` tag and
    /// empty one dropped. The annotation is one key of the granular `annotations` map, so the
    /// apply configuration sets it alone and leaves the others as written.
    fn mutation(&self, _: &Settings) -> Option<MutationForm> {
        let key = cel::string(TAGS_ANNOTATION);
        let tag = cel::string(TAG);
        let tags = format!(
            "((has(object.metadata.annotations) && {key} in object.metadata.annotations) ? object.metadata.annotations[{key}].split(',').map(t, t.trim()) : [])"
        );
        Some(MutationForm {
            applies: format!(
                "request.operation in ['CREATE', 'UPDATE'] \
                 && (has(request.subResource) ? request.subResource : '') == '' \
                 && has(object.spec.type) && object.spec.type == 'LoadBalancer' \
                 && !({tag} in {tags})"
            ),
            variables: Vec::new(),
            apply_configuration: format!(
                "Object{{metadata: Object.metadata{{annotations: {{{key}: ([{tag}] + {tags}.filter(t, t != '' && !t.startsWith({prefix}))).join(',')}}}}}}",
                prefix = cel::string(KEY),
            ),
        })
    }

    /// A LoadBalancer Service without tags: it must come back with the tag alone.
    fn canary(&self, _: &Settings) -> Option<Canary> {
        Some(Canary::mutation(
            ("", "v1", "Service", "services"),
            json!({"metadata": {}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}),
            Some(Effect {
                pointer: format!("/metadata/annotations/{}", pointer_escape(TAGS_ANNOTATION)),
                value: TAG.into(),
            }),
        ))
    }

    fn cases(&self) -> Vec<Case> {
        mcvw_cases()
            .into_iter()
            .map(|(c, _)| c)
            .chain(own_cases())
            .collect()
    }
}

/// A Service as MCVW's tests write it (a LoadBalancer), with `annotations` where not null.
fn service(annotations: Value) -> Value {
    let mut o = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "testservice", "uid": "1234"},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "nodePort": 32259, "port": 80, "protocol": "TCP", "targetPort": "http"}],
                 "allocateLoadBalancerNodePorts": true, "clusterIP": "172.30.52.218"}});
    if !annotations.is_null() {
        o["metadata"]["annotations"] = annotations;
    }
    o
}

fn tags(v: &str) -> Value {
    json!({TAGS_ANNOTATION: v})
}

/// One of MCVW's requests on its Service `testservice` in `team-a`: a create of `new`'s
/// annotations, or an update from `old`'s.
fn case(what: &'static str, want: Want, op: &'static str, old: Value, new: Value) -> Case {
    let c = Case::new(what, want, (op, "", "services", "testservice")).namespaced("team-a");
    if op == "UPDATE" {
        c.objects(service(new), service(old))
    } else {
        c.objects(service(new), Value::Null)
    }
}

/// The tags annotation with MCVW's two other annotations.
fn with_others(v: &str) -> Value {
    let mut a = tags(v);
    a["foo"] = json!("bar");
    a["ABC"] = json!("123");
    a
}

/// MCVW's cases (pkg/webhooks/service/service_test.go) and the annotations MCVW's patch leaves:
/// the case, and what the Service's annotations must be after the patch.
pub(crate) fn mcvw_cases() -> Vec<(Case, Value)> {
    let mut cases = mcvw_creates();
    cases.extend(mcvw_updates());
    cases
}

fn mcvw_creates() -> Vec<(Case, Value)> {
    use Want::*;
    let null = || Value::Null;
    vec![
        (
            case(
                "MCVW: a Service without annotations",
                Deny,
                "CREATE",
                null(),
                null(),
            ),
            tags(TAG),
        ),
        (
            case(
                "MCVW: a Service with no annotation",
                Deny,
                "CREATE",
                null(),
                json!({}),
            ),
            tags(TAG),
        ),
        (
            case(
                "MCVW: a Service with another red-hat-managed value",
                Deny,
                "CREATE",
                null(),
                tags("red-hat-managed=foo"),
            ),
            tags(TAG),
        ),
        (
            case(
                "MCVW: a Service with other annotations",
                Deny,
                "CREATE",
                null(),
                json!({"foo": "bar", "ABC": "123"}),
            ),
            with_others(TAG),
        ),
        (
            case(
                "MCVW: a Service with other tags",
                Deny,
                "CREATE",
                null(),
                tags("Foo=Bar,ABC=123"),
            ),
            tags("red-hat-managed=true,Foo=Bar,ABC=123"),
        ),
        (
            case(
                "MCVW: a Service with the tag",
                Allow,
                "CREATE",
                null(),
                tags(TAG),
            ),
            tags(TAG),
        ),
        (
            case("MCVW: malformed tags", Deny, "CREATE", null(), tags("!@#$")),
            tags("red-hat-managed=true,!@#$"),
        ),
    ]
}

fn mcvw_updates() -> Vec<(Case, Value)> {
    use Want::*;
    let all = "red-hat-managed=true,Foo=Bar,ABC=123";
    vec![
        (
            case(
                "MCVW: an update adding another annotation, the tag kept",
                Allow,
                "UPDATE",
                json!({TAGS_ANNOTATION: TAG, "foo": "bar"}),
                with_others(TAG),
            ),
            with_others(TAG),
        ),
        (
            case(
                "MCVW: an update dropping the tag (OSD-21590)",
                Deny,
                "UPDATE",
                tags(all),
                tags("Foo=Bar,ABC=123"),
            ),
            tags(all),
        ),
        (
            case(
                "MCVW: an update changing the tag (OSD-21590)",
                Deny,
                "UPDATE",
                tags(all),
                tags("red-hat-managed=foobar,Foo=Bar,ABC=123"),
            ),
            tags(all),
        ),
        (
            case(
                "MCVW: an update keeping the tags",
                Allow,
                "UPDATE",
                tags(all),
                tags(all),
            ),
            tags(all),
        ),
    ]
}

/// The project's own: other Service types, the platform's router, spaces, subresources.
fn own_cases() -> Vec<Case> {
    use Want::*;
    let create = ("CREATE", "", "services", "s");
    let lb = |annotations: Value| {
        let mut s = service(annotations);
        s["metadata"]["name"] = json!("s");
        s
    };
    let mut cluster_ip = lb(Value::Null);
    cluster_ip["spec"]["type"] = json!("ClusterIP");
    vec![
        Case::new("a ClusterIP Service", Allow, create)
            .namespaced("team-a")
            .objects(cluster_ip, Value::Null),
        Case::new(
            "the ingress operator's router Service (system:admin, openshift-ingress)",
            Deny,
            ("CREATE", "", "services", "router-default"),
        )
        .namespaced("openshift-ingress")
        .objects(lb(Value::Null), Value::Null)
        .by("system:admin", &["system:masters", "system:authenticated"]),
        Case::new("the tag among others, with spaces", Allow, create)
            .namespaced("team-a")
            .objects(lb(tags("a=b, red-hat-managed=true")), Value::Null),
        Case::new("a status update", Allow, ("UPDATE", "", "services", "s"))
            .namespaced("team-a")
            .subresource("status")
            .objects(lb(Value::Null), lb(Value::Null)),
        Case::new("a delete", Allow, ("DELETE", "", "services", "s"))
            .namespaced("team-a")
            .objects(Value::Null, lb(Value::Null)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Service's annotations after `patch` (the ops this guard writes: `add` and `replace`
    /// of the annotations or of one annotation).
    fn annotations_after(object: &Value, patch: &[Value]) -> Value {
        let mut a = object["metadata"]["annotations"].clone();
        for op in patch {
            let path = op["path"].as_str().unwrap_or_default();
            if path == "/metadata/annotations" {
                a = op["value"].clone();
            } else if let Some(key) = path.strip_prefix("/metadata/annotations/") {
                let key = key.replace("~1", "/").replace("~0", "~");
                a[key] = op["value"].clone();
            }
        }
        if a.is_null() { json!({}) } else { a }
    }

    #[test]
    fn the_patched_annotations_are_mcvws() {
        let s = Settings::default();
        for (c, want) in mcvw_cases() {
            let body = c.review();
            let req = crate::review::decode(&body).expect("review");
            let d = ServiceTags.decide(&req, &s);
            assert!(d.allowed, "{}", c.what);
            assert_eq!(!d.patch.is_empty(), c.want == Want::Deny, "{}", c.what);
            assert_eq!(annotations_after(&c.object, &d.patch), want, "{}", c.what);
        }
    }

    #[test]
    fn the_tag_is_merged_once_and_first() {
        assert_eq!(merged(None).as_deref(), Some(TAG));
        assert_eq!(merged(Some("")).as_deref(), Some(TAG));
        assert_eq!(
            merged(Some("a=b,,c=d")).as_deref(),
            Some("red-hat-managed=true,a=b,c=d")
        );
        assert_eq!(
            merged(Some(" red-hat-managed=false , a=b")).as_deref(),
            Some("red-hat-managed=true,a=b")
        );
        assert_eq!(merged(Some("a=b, red-hat-managed=true")), None);
    }
}
