//! A guard's cases: one request as every engine receives it, and what the guard must make of
//! it. Plain data, so the unit tests (the service's handler, the CEL interpreter on the
//! rendered policy) and the e2e suite (the real service over TLS) run the same table.

use serde_json::{Value, json};

/// What the guard must do with a request: deny it (or, for the mutation, change it), or let
/// it pass untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Allow,
    Deny,
}

/// One request as both engines receive it: the AdmissionReview's request (the webhook's body,
/// and the `request` variable of a policy, whose `object` and `oldObject` are variables of
/// their own). Fields left out are absent, as the API server's JSON omits empty ones.
#[derive(Debug, Clone)]
pub struct Case {
    pub what: &'static str,
    pub want: Want,
    pub(crate) op: &'static str,
    pub(crate) group: &'static str,
    pub(crate) resource: &'static str,
    pub(crate) sub_resource: Option<&'static str>,
    pub(crate) name: &'static str,
    pub(crate) namespace: Option<&'static str>,
    pub(crate) user: &'static str,
    pub(crate) groups: &'static [&'static str],
    pub object: Value,
    pub old: Value,
}

impl Case {
    /// `op` on `group`/`resource` named `name`, by the regular user `alice`.
    pub(crate) fn new(
        what: &'static str,
        want: Want,
        (op, group, resource, name): (&'static str, &'static str, &'static str, &'static str),
    ) -> Self {
        Self {
            what,
            want,
            op,
            group,
            resource,
            sub_resource: None,
            name,
            namespace: None,
            user: "alice",
            groups: &["system:authenticated"],
            object: Value::Null,
            old: Value::Null,
        }
    }
    pub(crate) fn by(mut self, user: &'static str, groups: &'static [&'static str]) -> Self {
        self.user = user;
        self.groups = groups;
        self
    }
    pub(crate) fn namespaced(mut self, ns: &'static str) -> Self {
        self.namespace = Some(ns);
        self
    }
    pub(crate) fn subresource(mut self, sub_resource: &'static str) -> Self {
        self.sub_resource = Some(sub_resource);
        self
    }
    /// The same request as one object of a collection delete: the API server sends no name.
    pub(crate) fn collection(mut self) -> Self {
        self.name = "";
        self
    }
    pub(crate) fn objects(mut self, object: Value, old: Value) -> Self {
        self.object = object;
        self.old = old;
        self
    }

    /// The `request` as a policy's CEL sees it (without the objects).
    pub fn request(&self) -> Value {
        let mut user = json!({"username": self.user});
        if !self.groups.is_empty() {
            user["groups"] = json!(self.groups);
        }
        let mut r = json!({
            "uid": "u",
            "kind": {"group": self.group, "version": "v1", "kind": "X"},
            "resource": {"group": self.group, "version": "v1", "resource": self.resource},
            "operation": self.op,
            "userInfo": user,
        });
        // The API server leaves out what is empty: a collection delete's or a `generateName`
        // create's request has no `name` key, and a policy's CEL that reads it unasked fails.
        if !self.name.is_empty() {
            r["name"] = json!(self.name);
        }
        if let Some(ns) = self.namespace {
            r["namespace"] = json!(ns);
        }
        if let Some(sub) = self.sub_resource {
            r["subResource"] = json!(sub);
        }
        r
    }

    /// The AdmissionReview the API server would post to the guard's webhook.
    pub fn review(&self) -> Vec<u8> {
        let mut r = self.request();
        r["object"] = self.object.clone();
        r["oldObject"] = self.old.clone();
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r,
        }))
        .unwrap_or_default()
    }
}

/// An object of a cluster config kind: `metadata.name` "cluster", `spec` unless null.
pub(crate) fn spec_obj(spec: Value, labels: Value) -> Value {
    let mut o = json!({"metadata": {"name": "cluster", "labels": labels}});
    if !spec.is_null() {
        o["spec"] = spec;
    }
    o
}

/// The groups MCVW's tests give their users (its pkg/testutils requests), for the guards'
/// cases taken from MCVW's tests.
pub(crate) mod mcvw {
    /// A user of the OAuth server.
    pub(crate) const OAUTH: &[&str] = &["system:authenticated", "system:authenticated:oauth"];
    pub(crate) const DEDICATED_ADMINS: &[&str] = &[
        "system:authenticated",
        "system:authenticated:oauth",
        "dedicated-admins",
    ];
    pub(crate) const CLUSTER_ADMINS: &[&str] = &[
        "system:authenticated",
        "system:authenticated:oauth",
        "cluster-admins",
    ];
    pub(crate) const UNAUTHENTICATED: &[&str] = &["system:unauthenticated"];
    /// SRE's backplane sessions.
    pub(crate) const SRE: &[&str] = &[
        "system:serviceaccounts:openshift-backplane-srep",
        "system:authenticated",
        "system:authenticated:oauth",
    ];
    /// CEE's backplane sessions.
    pub(crate) const CEE: &[&str] = &[
        "system:serviceaccounts:openshift-backplane-cee",
        "system:authenticated",
        "system:authenticated:oauth",
    ];
}
