//! Canaries: for each guard that can be tried without side effects, a dry-run request it must
//! deny when a non-exempt user sends it. The probe proves that the hosted kube-apiserver
//! reaches the admission service (or runs the agent's policies); a canary proves that one
//! guard still denies, through whatever engine carries it. The agent sends one canary per probe
//! round as `CANARY_USER` (impersonated, with a nonce in the user's extra), and a denial
//! counts only if it names the guard and, from the admission service, carries the proof of
//! that nonce (`guards::probe::ProbeKey`).
//!
//! A validating guard's canary is cluster-scoped: a namespaced one would need a namespace that
//! exists and that the guard does not leave alone, which no cluster is sure to have. A delete
//! needs its object: where the cluster has no such object (a plain Kubernetes cluster has no
//! SCCs), the guard is not tried, and says so.
//!
//! A mutation's canary is a dry-run create in `default` (every cluster has it, and the
//! mutations leave no namespace out) that must come back changed (`Effect`) and carrying the
//! admission service's proof of the nonce in an annotation (`PROOF_ANNOTATION`): a dry run
//! returns the object as it would have been stored, every mutation applied, so the proof shows
//! the service's guard ran on it and the effect that it changed what it should.

use serde_json::{Value, json};

use super::service_annotation::pointer_escape;
use crate::review::Request;

/// The identity canaries are sent as: not exempt by any default entry (the configuration
/// refuses an exemption that would cover it: `config::exemption_problem`), and known to no
/// one but the agent's RBAC (`hosted::canary`).
pub const CANARY_USER: &str = "hcp-fleet.openshift.io:canary";
/// The group the canary user is impersonated with (every authenticated user has it).
pub const CANARY_GROUP: &str = "system:authenticated";
/// The key of the user's extra that carries the canary's nonce. The API server lower-cases an
/// `Impersonate-Extra-` header's suffix into this key.
pub const NONCE_EXTRA: &str = "hcp-fleet-canary-nonce";
/// The annotation a mutation's canary object carries, so the proof has a map to go into.
pub const CANARY_ANNOTATION: &str = "hcp-fleet.openshift.io/canary";
/// The annotation the admission service adds, holding the proof of the canary's nonce, to a
/// canary its mutating guard ran on (enforced, the canary user's request).
pub const PROOF_ANNOTATION: &str = "hcp-fleet.openshift.io/canary-proof";
/// The namespace mutations' canaries are created in (dry run).
pub const MUTATION_NAMESPACE: &str = "default";
/// The prefix of a mutation canary's generated name (`generateName`: no name a tenant's object
/// could hold first).
pub const GENERATED_NAME: &str = "hcp-fleet-canary-";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Create,
    Delete,
}

impl Verb {
    /// The RBAC verb.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Delete => "delete",
        }
    }
}

/// One canary request (cluster-scoped).
#[derive(Debug, Clone, PartialEq)]
pub struct Canary {
    pub verb: Verb,
    pub group: &'static str,
    pub(crate) version: &'static str,
    pub resource: &'static str,
    pub name: String,
    /// Where a namespaced canary is sent (a mutation's: `MUTATION_NAMESPACE`).
    pub namespace: Option<&'static str>,
    /// What a create sends.
    pub object: Option<Value>,
    /// A mutation's canary: what the object must come back with.
    pub effect: Option<Effect>,
}

/// What a mutation must have done to its canary: the value at a JSON Pointer of the object
/// returned. `None`: nothing to change in this cluster (the pod image spec mutation where the
/// registry serves); the canary then proves only that the guard ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub pointer: String,
    pub value: String,
}

impl Effect {
    /// Whether `object` (the dry run's answer) shows it.
    pub fn shown_by(&self, object: &Value) -> bool {
        object.pointer(&self.pointer).and_then(Value::as_str) == Some(self.value.as_str())
    }
}

impl Canary {
    /// A dry-run create of `object` (its `apiVersion` and `kind` are filled in).
    pub(crate) fn create(
        (group, version, kind, resource): (&'static str, &'static str, &'static str, &'static str),
        name: &str,
        mut object: Value,
    ) -> Self {
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        object["metadata"]["name"] = json!(name);
        Self {
            verb: Verb::Create,
            group,
            version,
            resource,
            name: name.to_string(),
            namespace: None,
            object: Some(object),
            effect: None,
        }
    }

    /// A mutation's canary: a dry-run create of `object` in `MUTATION_NAMESPACE` under a
    /// generated name, marked with `CANARY_ANNOTATION`, that must come back with `effect`.
    pub(crate) fn mutation(
        kind: (&'static str, &'static str, &'static str, &'static str),
        mut object: Value,
        effect: Option<Effect>,
    ) -> Self {
        object["metadata"]["generateName"] = json!(GENERATED_NAME);
        object["metadata"]["annotations"][CANARY_ANNOTATION] = json!("true");
        let mut c = Self::create(kind, GENERATED_NAME, object);
        if let Some(o) = c
            .object
            .as_mut()
            .and_then(|o| o["metadata"].as_object_mut())
        {
            o.remove("name");
        }
        c.namespace = Some(MUTATION_NAMESPACE);
        c.effect = effect;
        c
    }

    /// Whether this is a mutation's canary (judged by what comes back, not by a denial).
    pub fn mutates(&self) -> bool {
        self.namespace.is_some()
    }

    /// A dry-run delete of the object named `name`.
    pub(crate) fn delete(
        (group, version, resource): (&'static str, &'static str, &'static str),
        name: &str,
    ) -> Self {
        Self {
            verb: Verb::Delete,
            group,
            version,
            resource,
            name: name.to_string(),
            namespace: None,
            object: None,
            effect: None,
        }
    }

    /// The request's path, with `dryRun=All`.
    pub fn path(&self) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        let base = match self.namespace {
            Some(ns) => format!("{base}/namespaces/{ns}"),
            None => base,
        };
        match self.verb {
            Verb::Create => format!("{base}/{}?dryRun=All", self.resource),
            Verb::Delete => format!("{base}/{}/{}?dryRun=All", self.resource, self.name),
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl Canary {
    /// The canary as the admission request the guard sees, for the case tables' engines.
    pub fn case(&self) -> super::Case {
        let op = match self.verb {
            Verb::Create => "CREATE",
            Verb::Delete => "DELETE",
        };
        // Test-only: a case names its object with a static string.
        let name: &'static str = Box::leak(self.name.clone().into_boxed_str());
        let (object, old) = match &self.object {
            Some(o) => (o.clone(), Value::Null),
            None => (Value::Null, json!({"metadata": {"name": name}})),
        };
        // A mutation's canary must be changed where it names an effect, and left alone where
        // there is nothing to change.
        let want = if self.mutates() && self.effect.is_none() {
            super::Want::Allow
        } else {
            super::Want::Deny
        };
        let case = super::Case::new("the canary", want, (op, self.group, self.resource, name))
            .by(CANARY_USER, &[CANARY_GROUP])
            .objects(object, old);
        match self.namespace {
            Some(ns) => case.namespaced(ns),
            None => case,
        }
    }
}

/// The JSON Patch operation the admission service adds to the answer of the mutating guard
/// served on `path` to the agent's canary `req` (carrying `nonce`): the proof of the nonce
/// under `key` in `PROOF_ANNOTATION`. Only for the canary user's requests, and only where the
/// guard enforces (in warn mode it changes nothing); `None` otherwise.
pub fn mutation_proof(
    path: &str,
    req: &Request,
    s: &super::Settings,
    key: &super::probe::ProbeKey,
    nonce: &str,
) -> Option<Value> {
    let mutating = super::for_path(path)
        .is_some_and(|g| g.row().kind == crate::catalogue::WebhookKind::Mutating);
    let enforced = s
        .hook(path)
        .is_some_and(|h| h.mode == hcp_fleet_model::Mode::Enforce);
    if !mutating || !enforced || req.user_info.username != CANARY_USER {
        return None;
    }
    proof_patch(req.object()?, key, nonce)
}

/// The JSON Patch operation that adds the proof of `nonce` under `key` in `PROOF_ANNOTATION`;
/// `None` where the object has no annotations to add it to (a canary always has).
pub fn proof_patch(object: &Value, key: &super::probe::ProbeKey, nonce: &str) -> Option<Value> {
    object["metadata"]["annotations"].as_object()?;
    Some(json!({
        "op": "add",
        "path": format!("/metadata/annotations/{}", pointer_escape(PROOF_ANNOTATION)),
        "value": key.prove(nonce, ""),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeKey;
    use crate::{HookSetting, Settings};
    use hcp_fleet_model::Mode;

    fn settings(path: &str, mode: Mode) -> Settings {
        let mut s = Settings::default();
        s.webhooks.push(HookSetting {
            name: "x".into(),
            path: path.into(),
            mode,
            exempt_users: Vec::new(),
            exempt_groups: Vec::new(),
        });
        s
    }

    /// Only the canary user's request to an enforced mutation gets the proof, and only a
    /// request whose object has annotations to carry it.
    #[test]
    fn the_proof_goes_only_to_an_enforced_mutations_canary() {
        let key = ProbeKey::generate().expect("key");
        let tags = crate::service_tags::ROW.path;
        let canary = crate::for_path(tags)
            .and_then(|g| g.canary(&Settings::default()))
            .expect("a canary");
        let review = |user: &'static str, object: &Value| {
            let mut c = canary.case().by(user, &[CANARY_GROUP]);
            c.object = object.clone();
            crate::review::decode(&c.review())
                .expect("decodes")
                .into_owned()
        };
        let object = canary.object.clone().expect("object");
        let req = review(CANARY_USER, &object);
        let op = mutation_proof(tags, &req, &settings(tags, Mode::Enforce), &key, "ab12")
            .expect("a proof");
        assert_eq!(
            op["path"],
            "/metadata/annotations/hcp-fleet.openshift.io~1canary-proof"
        );
        assert!(key.proves("ab12", op["value"].as_str().unwrap_or_default()));
        assert!(!key.proves("ab13", op["value"].as_str().unwrap_or_default()));
        for (why, path, mode, req) in [
            ("warn mode", tags, Mode::Warn, req.clone()),
            (
                "another user",
                tags,
                Mode::Enforce,
                review("alice", &object),
            ),
            (
                "a validating guard",
                crate::protected_rbac::ROW.path,
                Mode::Enforce,
                req.clone(),
            ),
            (
                "no annotations",
                tags,
                Mode::Enforce,
                review(CANARY_USER, &json!({"metadata": {}})),
            ),
        ] {
            assert_eq!(
                mutation_proof(path, &req, &settings(path, mode), &key, "ab12"),
                None,
                "{why}"
            );
        }
    }
}
