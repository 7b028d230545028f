//! Canaries: for each guard that can be tried without side effects, a dry-run request it must
//! deny when a non-exempt user sends it. The probe proves that the hosted kube-apiserver
//! reaches the admission service (or runs the agent's policies); a canary proves that one
//! guard still denies, through whatever engine carries it. The agent sends one canary per probe
//! round as `CANARY_USER` (impersonated, with a nonce in the user's extra), and a denial
//! counts only if it names the guard and, from the admission service, carries the proof of
//! that nonce (`guards::probe::ProbeKey`).
//!
//! Only cluster-scoped requests: a namespaced one needs a namespace that exists and is not
//! exempt, which no cluster is sure to have. A delete needs its object: where the cluster has
//! no such object (a plain Kubernetes cluster has no SCCs), the guard is not tried, and says so.

use serde_json::{Value, json};

/// The identity canaries are sent as: not exempt by any default entry (the configuration
/// refuses an exemption that would cover it: `config::exemption_problem`), and known to no
/// one but the agent's RBAC (`hosted::canary`).
pub const CANARY_USER: &str = "hcp-fleet.openshift.io:canary";
/// The group the canary user is impersonated with (every authenticated user has it).
pub const CANARY_GROUP: &str = "system:authenticated";
/// The key of the user's extra that carries the canary's nonce. The API server lower-cases an
/// `Impersonate-Extra-` header's suffix into this key.
pub const NONCE_EXTRA: &str = "hcp-fleet-canary-nonce";

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
    /// What a create sends.
    pub object: Option<Value>,
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
            object: Some(object),
        }
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
            object: None,
        }
    }

    /// The request's path, with `dryRun=All`.
    pub fn path(&self) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
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
        super::Case::new(
            "the canary",
            super::Want::Deny,
            (op, self.group, self.resource, name),
        )
        .by(CANARY_USER, &[CANARY_GROUP])
        .objects(object, old)
    }
}
