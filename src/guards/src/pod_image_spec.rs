//! A pod that names an `openshift` image of the cluster's internal registry
//! (`image-registry.openshift-image-registry.svc:5000/openshift/<image>:<tag>`) still starts when
//! the registry is not there: where the image registry operator's config does not say
//! `managementState: Managed`, each such image is replaced on CREATE by the pull spec its
//! ImageStream tag names (a release image by digest, for `cli`, `tools`, `must-gather`). MCVW's
//! `podimagespec-mutation` on HyperShift, which OpenShift's debugging tools and a customer's
//! `oc` CronJobs rely on once the registry is removed.
//!
//! - What it knows comes from the agent, never from the API per request: the registry's state
//!   and the `openshift` namespace's ImageStream tags, kept in a ConfigMap the admission
//!   service mounts (`InternalRegistry`, `Settings::internal_registry`). Until the service has
//!   read one, it changes nothing, as MCVW changes nothing when its lookups fail.
//! - All or nothing, as MCVW: where one image of the internal registry cannot be resolved (a tag
//!   the agent does not know, another namespace's image), the pod is left as written.
//! - Where it differs from MCVW, and why (docs/admission.md): image names with `-` or `.`
//!   (`must-gather`, `network-tools`) are rewritten too (MCVW's pattern stops at them); a tag
//!   that points at another tag is followed to its image (MCVW would write the other tag's
//!   name as the image); another namespace's ImageStreams are not read (they are a tenant's,
//!   unbounded, and an image of theirs cannot be pulled with the registry gone either way).
//! - Whose pods: everyone's, in every namespace (MCVW exempts no one); it only ever replaces an
//!   image that cannot be pulled with the one the cluster's own ImageStream names.
//! - Either engine: the admission service reads the table from a ConfigMap; a
//!   MutatingAdmissionPolicy has it written into its CEL (`mutation`), so the policy is
//!   rendered anew when the table changes, and not at all where there is nothing to rewrite
//!   (the registry Managed, or nothing read yet): no engine has work to do then.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Settings;
use super::canary::{Canary, Effect};
use super::case::{Case, Want};
use super::cel;
use super::identities::IdentityClass;
use super::{CelForm, Guard, MutationForm, Scope};
use crate::catalogue::{BuiltinRow, WebhookKind, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct PodImageSpec;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "pod-image-spec.hcp-fleet.openshift.io",
    kind: WebhookKind::Mutating,
    path: "/mutate/pod-image-spec",
    rules: &[rule(&["CREATE"], &[""], &["pods"])],
    mode: Mode::Enforce,
    only_labelled: None,
};

/// The internal registry's address as pods name it.
pub const REGISTRY: &str = "image-registry.openshift-image-registry.svc:5000/";
/// The namespace whose images are rewritten: the platform's ImageStreams.
pub const NAMESPACE: &str = "openshift";
/// The environment variable that names the admission service's internal registry file.
pub const FILE_ENV: &str = "HCP_FLEET_INTERNAL_REGISTRY";
/// The tag a canary names where the table knows none: no ImageStream has it.
const CANARY_TAG: &str = "hcp-fleet-canary:latest";
/// The registry operator's state that means the registry serves.
pub const MANAGED: &str = "Managed";

/// What the admission service knows of the hosted cluster's internal registry, as the agent
/// keeps it (`hcp_fleet_render::internal_registry`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InternalRegistry {
    /// The image registry operator's `spec.managementState` (`Managed`, `Removed`,
    /// `Unmanaged`, …); `None` where the cluster has no such config (the capability off).
    #[serde(default)]
    pub management_state: Option<String>,
    /// Where it is not Managed: the pull spec each `<image>:<tag>` of the `openshift`
    /// namespace's ImageStreams names.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

impl InternalRegistry {
    /// Whether pods' internal-registry images are rewritten: the state is known and is not
    /// Managed (MCVW's test: anything but Managed).
    pub fn rewrites(&self) -> bool {
        self.management_state
            .as_deref()
            .is_some_and(|s| s != MANAGED)
    }
}

/// Go's `\s` (MCVW's pattern is Go's): what ends a run of `\S`.
fn go_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\x0c' | '\r' | ' ')
}

/// An image name of an ImageStream as this guard reads it: MCVW's `\w` (ASCII letters, digits,
/// `_`) and also `-` and `.`, which ImageStream names may hold.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// `(namespace, image, tag)` of an internal-registry image, as MCVW's pattern
/// `^(registry/)(?P<namespace>\S*)(/)(?P<image>\w*)(:)(?P<tag>\S*)` reads it: the namespace
/// is the longest that leaves `image:tag` after a `/` (Go's greedy `\S*`), and a digest
/// reference (`name@sha256:…`) is none.
pub fn registry_ref(image: &str) -> Option<(&str, &str, &str)> {
    let rest = image.strip_prefix(REGISTRY)?;
    // Every part is `\S`: the match lies within the first run of non-space.
    let rest = &rest[..rest.find(go_space).unwrap_or(rest.len())];
    rest.match_indices('/').rev().find_map(|(i, _)| {
        let after = &rest[i + 1..];
        let end = after.find(|c| !name_char(c)).unwrap_or(after.len());
        let tag = after[end..].strip_prefix(':')?;
        Some((&rest[..i], &after[..end], tag))
    })
}

/// Every container and init container image: (JSON Pointer to it, the image).
fn images(pod: &Value) -> Vec<(String, &str)> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|field| {
            pod["spec"][field]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .filter_map(move |(i, c)| {
                    c["image"]
                        .as_str()
                        .map(|img| (format!("/spec/{field}/{i}/image"), img))
                })
        })
        .collect()
}

/// The replace operations that point every internal-registry image of `pod` at what `reg`
/// resolves it to; none unless every one resolves (MCVW: one failed lookup leaves the pod as
/// written).
pub fn rewrite(pod: &Value, reg: &InternalRegistry) -> Vec<Value> {
    let found: Vec<(String, Option<&str>)> = images(pod)
        .into_iter()
        .filter_map(|(path, img)| {
            let (ns, name, tag) = registry_ref(img)?;
            let to = (ns == NAMESPACE)
                .then(|| reg.tags.get(&format!("{name}:{tag}")).map(String::as_str))
                .flatten();
            Some((path, to))
        })
        .collect();
    if found.iter().any(|(_, to)| to.is_none()) {
        return Vec::new();
    }
    found
        .into_iter()
        .filter_map(|(path, to)| to.map(|v| json!({"op": "replace", "path": path, "value": v})))
        .collect()
}

/// MCVW's trigger: some container or init container names an `openshift` image of the
/// internal registry.
fn names_a_platform_image(pod: &Value) -> bool {
    images(pod)
        .iter()
        .any(|(_, img)| registry_ref(img).is_some_and(|(ns, _, _)| ns == NAMESPACE))
}

impl Guard for PodImageSpec {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    /// No namespace is left out: a platform pod naming the registry cannot pull either.
    fn scope(&self) -> Scope {
        Scope::Identities
    }

    /// No one: it only makes an image that cannot be pulled one that can.
    fn exempt_classes(&self) -> &'static [IdentityClass] {
        &[]
    }

    fn decide(&self, req: &Request, s: &Settings) -> Decision {
        if !req.is_one_of(&["CREATE"], "", "pods") {
            return Decision::allow();
        }
        let Some(pod) = req.object() else {
            return Decision::allow();
        };
        if !names_a_platform_image(pod) {
            return Decision::allow();
        }
        let Some(reg) = s.internal_registry.as_ref().filter(|r| r.rewrites()) else {
            return Decision::allow();
        };
        let mut d = Decision::allow();
        d.patch = rewrite(pod, reg);
        d
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        None
    }

    fn mutates_in_cel(&self) -> bool {
        true
    }

    /// `rewrite` in CEL, for the registry `s` knows (none known, or Managed: no form, and no
    /// policy: there is nothing to rewrite). The tag table is written into the policy (a variable, and
    /// the last matchCondition), so the policy changes when the table does. Where
    /// `registry_ref` reads an image (`is_ref`: the registry, then some `/` followed by
    /// `name_char*:` before any white space), the pod is rewritten only if every such image is
    /// `openshift/<known tag>` exactly (up to white space, where MCVW's `\S*` stops): an
    /// ImageStream tag holds no `/`, `:` or white space, so for a known tag that is
    /// `registry_ref`'s reading too.
    fn mutation(&self, s: &Settings) -> Option<MutationForm> {
        let reg = s.internal_registry.as_ref().filter(|r| r.rewrites())?;
        let table = format!(
            "{{{}}}",
            reg.tags
                .iter()
                .map(|(k, v)| format!("{}: {}", cel::string(k), cel::string(v)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let prefix = cel::string(&format!("{REGISTRY}{NAMESPACE}/"));
        // `img` is the tag `k` of the platform's namespace, up to Go's white space.
        let is_tag = |img: &str, k: &str| {
            format!(
                "({img} == {prefix} + {k} || ({img}.startsWith({prefix} + {k}) && {img}.substring(size({prefix} + {k}), size({prefix} + {k}) + 1) in ['\\t', '\\n', '\\f', '\\r', ' ']))"
            )
        };
        let resolved_in = |tags: &str, img: &str| format!("{tags}.exists(k, {})", is_tag(img, "k"));
        let is_ref = |img: &str| {
            format!(
                "{img}.matches({})",
                cel::string(&format!(
                    "^{}[^\\t\\n\\f\\r ]*/[A-Za-z0-9_.-]*:",
                    REGISTRY.replace('.', "\\.")
                ))
            )
        };
        let lists = ["containers", "initContainers"];
        let images = lists
            .iter()
            .map(|l| format!("(has(object.spec.{l}) ? object.spec.{l}.map(c, c.image) : [])"))
            .collect::<Vec<_>>()
            .join(" + ");
        let applies = format!(
            "request.operation == 'CREATE' \
             && (has(request.subResource) ? request.subResource : '') == '' \
             && ({images}).exists(i, {}) \
             && ({images}).all(i, !{} || {})",
            is_ref("i"),
            is_ref("i"),
            resolved_in(&table, "i")
        );
        // Each list of named containers, the rewritten ones alone: merged by name.
        let rewritten = |l: &str| {
            format!(
                "object.spec.{l}.filter(c, {}).map(c, Object.spec.{l}{{name: c.name, image: variables.tags[variables.tags.filter(k, {})[0]]}})",
                resolved_in("variables.tags", "c.image"),
                is_tag("c.image", "k")
            )
        };
        let spec = |with: &[&str]| {
            format!(
                "Object{{spec: Object.spec{{{}}}}}",
                with.iter()
                    .map(|l| format!("{l}: {}", rewritten(l)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let apply_configuration = format!(
            "has(object.spec.initContainers) ? (has(object.spec.containers) ? {} : {}) : {}",
            spec(&lists),
            spec(&["initContainers"]),
            spec(&["containers"])
        );
        Some(MutationForm {
            applies,
            variables: vec![("tags".into(), table)],
            apply_configuration,
        })
    }

    /// A pod naming the first `openshift` tag the registry table resolves, which must come back
    /// naming what the tag names; where the registry serves (or no tag is known) a pod naming
    /// a tag no cluster has, which must come back unchanged, with the proof that the guard ran.
    fn canary(&self, s: &Settings) -> Option<Canary> {
        let known = s
            .internal_registry
            .as_ref()
            .filter(|r| r.rewrites())
            .and_then(|r| r.tags.iter().next());
        let (image, effect) = match known {
            Some((tag, to)) => (
                format!("{REGISTRY}{NAMESPACE}/{tag}"),
                Some(Effect {
                    pointer: "/spec/containers/0/image".into(),
                    value: to.clone(),
                }),
            ),
            None => (format!("{REGISTRY}{NAMESPACE}/{CANARY_TAG}"), None),
        };
        // Within the restricted Pod Security profile, with no token to mount: a dry run that
        // nothing but a guard has reason to refuse.
        Some(Canary::mutation(
            ("", "v1", "Pod", "pods"),
            json!({"metadata": {}, "spec": {
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "canary", "image": image,
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
            }}),
            effect,
        ))
    }

    fn cases(&self) -> Vec<Case> {
        mcvw_cases().into_iter().chain(own_cases()).collect()
    }
}

/// The cli image's pull spec in `case_registry` (a release image by digest, as the
/// cluster-version operator writes the `openshift/cli` ImageStream).
pub const CASE_CLI: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:4dbe2a75a516a947eab036ef6a1d086f1b1610f6bd21c6ab5f95db68ec177ea2";
/// must-gather's, likewise.
pub const CASE_MUST_GATHER: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:0c4d2d1e40b2b5b5d7ce6e2a9e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b";

/// The registry the cases are decided under: removed, with the `openshift` namespace's `cli`
/// and `must-gather` tags. Every engine that runs the cases gives the guard this (the unit
/// tests in its settings, the e2e service in its file).
pub fn case_registry() -> InternalRegistry {
    InternalRegistry {
        management_state: Some("Removed".into()),
        tags: BTreeMap::from([
            ("cli:latest".into(), CASE_CLI.into()),
            ("must-gather:latest".into(), CASE_MUST_GATHER.into()),
        ]),
    }
}

/// A pod with these containers and init containers (images), as MCVW's tests build them.
pub(crate) fn pod(containers: &[&str], init: &[&str]) -> Value {
    let list = |imgs: &[&str]| -> Value {
        imgs.iter()
            .enumerate()
            .map(|(i, img)| json!({"name": format!("c{i}"), "image": img}))
            .collect()
    };
    let mut spec = json!({});
    if !containers.is_empty() {
        spec["containers"] = list(containers);
    }
    if !init.is_empty() {
        spec["initContainers"] = list(init);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "test", "namespace": "team-a"}, "spec": spec})
}

fn create(what: &'static str, want: Want, pod: Value) -> Case {
    Case::new(what, want, ("CREATE", "", "pods", "test"))
        .namespaced("team-a")
        .objects(pod, Value::Null)
}

const CLI: &str = "image-registry.openshift-image-registry.svc:5000/openshift/cli:latest";

/// MCVW's cases (pkg/webhooks/podimagespec/podimagespec_test.go: its image patterns and its
/// pods), each as the pod CREATE that carries it, under a removed registry.
fn mcvw_cases() -> Vec<Case> {
    use Want::*;
    let one = |what, want, img: &str| create(what, want, pod(&[img], &[]));
    vec![
        one("MCVW: a short image", Allow, "ubuntu"),
        one("MCVW: a short tagged image", Allow, "ubuntu:latest"),
        one(
            "MCVW: a fully qualified tagged image",
            Allow,
            "docker.io/library/ubuntu:latest",
        ),
        one(
            "MCVW: a fully qualified image by digest",
            Allow,
            "quay.io/openshift-release-dev/ocp-release@sha256:4dbe2a75a516a947eab036ef6a1d086f1b1610f6bd21c6ab5f95db68ec177ea2",
        ),
        one(
            "MCVW: the internal registry's cli by digest",
            Allow,
            "image-registry.openshift-image-registry.svc:5000/openshift/cli@sha256:4dbe2a75a516a947eab036ef6a1d086f1b1610f6bd21c6ab5f95db68ec177ea2",
        ),
        one("MCVW: the internal registry's cli:latest", Deny, CLI),
        create("MCVW: an empty pod", Allow, pod(&[], &[])),
        create("MCVW: cli in the init containers", Deny, pod(&[], &[CLI])),
        create(
            "MCVW: an uninteresting image in the init containers",
            Allow,
            pod(&[], &["ubuntu"]),
        ),
        create(
            "MCVW: cli in the init containers, an uninteresting one in the containers",
            Deny,
            pod(&["ubuntu"], &[CLI]),
        ),
        create(
            "MCVW: cli in the containers, an uninteresting one in the init containers",
            Deny,
            pod(&[CLI], &["ubuntu"]),
        ),
        create(
            "MCVW: cli in the containers and the init containers",
            Deny,
            pod(&[CLI], &[CLI]),
        ),
    ]
}

/// The project's own: names MCVW's pattern misses, unknown tags, other namespaces, other
/// requests.
fn own_cases() -> Vec<Case> {
    use Want::*;
    let reg = |path: &str| format!("{REGISTRY}{path}");
    let one = |what, want, img: String| create(what, want, pod(&[&img], &[]));
    vec![
        one(
            "must-gather (MCVW: allowed, its pattern stops at '-')",
            Deny,
            reg("openshift/must-gather:latest"),
        ),
        one(
            "a tag the agent does not know",
            Allow,
            reg("openshift/cli:4.99"),
        ),
        one(
            "a customer namespace's image",
            Allow,
            reg("team-a/app:latest"),
        ),
        create(
            "cli beside another namespace's image: left as written, as MCVW's failed lookup",
            Allow,
            pod(&[CLI, &reg("team-a/app:latest")], &[]),
        ),
        one("an image without a tag", Allow, reg("openshift/cli")),
        one(
            "another registry's openshift/cli",
            Allow,
            "quay.io/openshift/cli:latest".into(),
        ),
        create(
            "the platform's own pod (system:admin, openshift-monitoring)",
            Deny,
            pod(&[CLI], &[]),
        )
        .by("system:admin", &["system:masters", "system:authenticated"]),
        Case::new(
            "a pod's status update",
            Allow,
            ("UPDATE", "", "pods", "test"),
        )
        .namespaced("team-a")
        .subresource("status")
        .objects(pod(&[CLI], &[]), pod(&[CLI], &[])),
        Case::new(
            "an ephemeral container",
            Allow,
            ("UPDATE", "", "pods", "test"),
        )
        .namespaced("team-a")
        .subresource("ephemeralcontainers")
        .objects(pod(&[CLI], &[]), pod(&[CLI], &[])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MCVW's `TestCheckContainerImageSpecByRegex`, and what its Go pattern makes of harder
    /// names (worked out by hand from RE2's leftmost-first, greedy matching).
    #[test]
    fn registry_refs_are_read_as_mcvws_pattern_reads_them() {
        let r = |s: &str| format!("{REGISTRY}{s}");
        for (img, want) in [
            ("ubuntu".to_string(), None),
            ("ubuntu:latest".into(), None),
            ("docker.io/library/ubuntu:latest".into(), None),
            (r("openshift/cli@sha256:4dbe"), None),
            (
                r("openshift/cli:latest"),
                Some(("openshift", "cli", "latest")),
            ),
            // Greedy namespace: up to the last '/' that leaves name:tag.
            (r("a/b/cli:1"), Some(("a/b", "cli", "1"))),
            (r("a/cli:1/x"), Some(("a", "cli", "1/x"))),
            // Not anchored at the end: the tag stops at the first space.
            (
                r("openshift/cli:latest extra"),
                Some(("openshift", "cli", "latest")),
            ),
            (r("openshift/cli:"), Some(("openshift", "cli", ""))),
            (r("openshift/cli"), None),
            (
                r("openshift/must-gather:latest"),
                Some(("openshift", "must-gather", "latest")),
            ),
            (
                r("openshift/cli:lat\test"),
                Some(("openshift", "cli", "lat")),
            ),
        ] {
            assert_eq!(registry_ref(&img), want, "{img}");
        }
    }

    /// The guard's patch, applied to each pod of its table, gives the pull specs MCVW's
    /// lookup would (the ImageStream tag's `from.name`), and touches nothing else.
    #[test]
    fn the_patch_points_every_platform_image_at_its_tag() {
        let reg = case_registry();
        let pod = pod(&["ubuntu", CLI], &[CLI]);
        let ops = rewrite(&pod, &reg);
        assert_eq!(
            ops,
            vec![
                json!({"op": "replace", "path": "/spec/containers/1/image", "value": CASE_CLI}),
                json!({"op": "replace", "path": "/spec/initContainers/0/image", "value": CASE_CLI}),
            ]
        );
    }

    #[test]
    fn nothing_changes_unless_the_registry_is_known_and_not_managed() {
        let req = |pod: Value| -> Request<'static> {
            serde::Deserialize::deserialize(json!({
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE", "userInfo": {"username": "alice"}, "object": pod,
            }))
            .expect("request")
        };
        let r = req(pod(&[CLI], &[]));
        let with = |reg: Option<InternalRegistry>| Settings {
            internal_registry: reg,
            ..Settings::default()
        };
        let managed = InternalRegistry {
            management_state: Some(MANAGED.into()),
            ..case_registry()
        };
        let absent = InternalRegistry {
            management_state: None,
            ..case_registry()
        };
        for (what, s) in [
            ("no file read yet", with(None)),
            ("Managed", with(Some(managed))),
            ("no registry config", with(Some(absent))),
        ] {
            let d = PodImageSpec.decide(&r, &s);
            assert!(d.allowed && d.patch.is_empty(), "{what}: {d:?}");
        }
        for state in ["Removed", "Unmanaged"] {
            let reg = InternalRegistry {
                management_state: Some(state.into()),
                ..case_registry()
            };
            let d = PodImageSpec.decide(&r, &with(Some(reg)));
            assert_eq!(d.patch.len(), 1, "{state}: {d:?}");
        }
    }
}
