//! What the pod image spec mutation knows of a hosted cluster's internal registry
//! (`hcp_fleet_guards::pod_image_spec`), made from what the hosted cluster says (the image
//! registry operator's config, the `openshift` namespace's ImageStreams), and the ConfigMap
//! that carries it to the admission service's replicas (mounted, optional, read when it
//! changes). Pure: the agent reads the inputs and applies the output.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::ObjectMeta;
use serde_json::Value;

use hcp_fleet_guards::pod_image_spec::{InternalRegistry, MANAGED, NAMESPACE};
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};

/// The ConfigMap in each HCP namespace.
pub const CONFIG_MAP: &str = "hcp-fleet-internal-registry";
/// Its one key, the file the service reads.
pub const KEY: &str = "internal-registry.json";
/// Where the replicas mount it.
pub const MOUNT_DIR: &str = "/etc/hcp-fleet/internal-registry";
/// The environment variable that tells the admission service the file's path
/// (`webhook --internal-registry`).
pub const FILE_ENV: &str = hcp_fleet_guards::pod_image_spec::FILE_ENV;

/// The image registry operator's config: `configs.imageregistry.operator.openshift.io/cluster`.
pub const CONFIG_PATH: &str = "/apis/imageregistry.operator.openshift.io/v1/configs/cluster";
/// The `openshift` namespace's ImageStreams.
pub const IMAGE_STREAMS_PATH: &str =
    "/apis/image.openshift.io/v1/namespaces/openshift/imagestreams";

/// At most this many tags are kept, and no pull spec longer than `MAX_SPEC`: the namespace is
/// the platform's, but a cluster-admin can write there, and the ConfigMap holds 1 MiB.
pub const MAX_TAGS: usize = 2000;
const MAX_SPEC: usize = 512;
/// How many tag-to-tag references are followed before one is given up as a loop.
const MAX_HOPS: usize = 5;

/// Whether the agent reads the ImageStreams for `config`: only where the registry is known and
/// not Managed (the usual cluster reads one object, not a namespace of them).
pub fn wants_image_streams(config: Option<&Value>) -> bool {
    InternalRegistry {
        management_state: state_of(config),
        tags: BTreeMap::new(),
    }
    .rewrites()
}

fn state_of(config: Option<&Value>) -> Option<String> {
    let c = config?;
    // A config without the field: the operator's default, Managed.
    Some(
        c["spec"]["managementState"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or(MANAGED)
            .to_string(),
    )
}

/// The registry as the mutation needs it: the config's state (`None` where the cluster has no
/// config: the capability off, or the kind not served), and, where not Managed, the pull spec
/// of every `<image>:<tag>` of `streams` (the `openshift` namespace's), a tag that names
/// another tag followed to its image. Tags whose image cannot be told are left out: the
/// mutation then leaves a pod naming them as written.
pub fn observed(config: Option<&Value>, streams: &[Value]) -> InternalRegistry {
    let mut reg = InternalRegistry {
        management_state: state_of(config),
        tags: BTreeMap::new(),
    };
    if !reg.rewrites() {
        return reg;
    }
    // Every spec tag's reference: (stream, tag) -> (kind, name).
    let mut refs: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for s in streams {
        if s["metadata"]["namespace"]
            .as_str()
            .is_some_and(|ns| ns != NAMESPACE)
        {
            continue;
        }
        let Some(stream) = s["metadata"]["name"].as_str() else {
            continue;
        };
        for t in s["spec"]["tags"].as_array().into_iter().flatten() {
            let (Some(tag), Some(kind), Some(name)) = (
                t["name"].as_str(),
                t["from"]["kind"].as_str(),
                t["from"]["name"].as_str(),
            ) else {
                continue;
            };
            // A reference to another namespace's stream is the tenant's, not the platform's.
            if t["from"]["namespace"]
                .as_str()
                .is_some_and(|ns| !ns.is_empty() && ns != NAMESPACE)
            {
                continue;
            }
            refs.insert(
                (stream.to_string(), tag.to_string()),
                (kind.to_string(), name.to_string()),
            );
        }
    }
    reg.tags = refs
        .keys()
        .filter_map(|(stream, tag)| {
            let spec = resolve(&refs, stream, tag)?;
            (spec.len() <= MAX_SPEC).then(|| (format!("{stream}:{tag}"), spec))
        })
        .take(MAX_TAGS)
        .collect();
    reg
}

/// The image `stream:tag` names: a DockerImage's name, or where it names another tag
/// (`ImageStreamTag` `tag` in the same stream, or `stream:tag`), that tag's image.
fn resolve(
    refs: &BTreeMap<(String, String), (String, String)>,
    stream: &str,
    tag: &str,
) -> Option<String> {
    let (mut stream, mut tag) = (stream.to_string(), tag.to_string());
    for _ in 0..=MAX_HOPS {
        let (kind, name) = refs.get(&(stream.clone(), tag.clone()))?;
        match kind.as_str() {
            "DockerImage" => return Some(name.clone()),
            "ImageStreamTag" => {
                (stream, tag) = match name.split_once(':') {
                    Some((s, t)) => (s.to_string(), t.to_string()),
                    None => (stream, name.clone()),
                };
            }
            // An ImageStreamImage names an image by the stream's status: not kept here.
            _ => return None,
        }
    }
    None
}

/// The ConfigMap carrying `reg` to the admission service in `hcp_namespace`.
pub fn config_map(
    hcp_namespace: &str,
    reg: &InternalRegistry,
) -> Result<ConfigMap, serde_json::Error> {
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            namespace: Some(hcp_namespace.into()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.to_string(),
                MANAGED_BY_VALUE.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            KEY.to_string(),
            serde_json::to_string(reg)?,
        )])),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(name: &str, tags: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "openshift"}, "spec": {"tags": tags}})
    }

    /// As the cluster-version operator writes the release's ImageStreams (a tag by digest),
    /// and as the samples operator writes a tag naming another.
    #[test]
    fn the_tags_of_a_removed_registry_are_resolved_to_images() {
        let config =
            json!({"metadata": {"name": "cluster"}, "spec": {"managementState": "Removed"}});
        let cli = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aa";
        let streams = vec![
            stream(
                "cli",
                json!([{"name": "latest", "from": {"kind": "DockerImage", "name": cli}}]),
            ),
            stream(
                "ruby",
                json!([
                    {"name": "3.3-ubi9", "from": {"kind": "DockerImage", "name": "registry.redhat.io/ubi9/ruby-33:latest"}},
                    {"name": "latest", "from": {"kind": "ImageStreamTag", "name": "3.3-ubi9"}},
                    {"name": "other", "from": {"kind": "ImageStreamTag", "name": "cli:latest"}},
                    {"name": "loop", "from": {"kind": "ImageStreamTag", "name": "loop"}},
                    {"name": "image", "from": {"kind": "ImageStreamImage", "name": "ruby@sha256:bb"}},
                    {"name": "theirs", "from": {"kind": "DockerImage", "name": "x", "namespace": "team-a"}},
                    {"name": "bare"},
                ]),
            ),
            json!({"metadata": {"name": "app", "namespace": "team-a"}, "spec": {"tags": [
                {"name": "latest", "from": {"kind": "DockerImage", "name": "evil"}}]}}),
        ];
        let reg = observed(Some(&config), &streams);
        assert_eq!(reg.management_state.as_deref(), Some("Removed"));
        assert_eq!(
            reg.tags,
            BTreeMap::from([
                ("cli:latest".to_string(), cli.to_string()),
                (
                    "ruby:3.3-ubi9".into(),
                    "registry.redhat.io/ubi9/ruby-33:latest".into()
                ),
                (
                    "ruby:latest".into(),
                    "registry.redhat.io/ubi9/ruby-33:latest".into()
                ),
                ("ruby:other".into(), cli.into()),
            ])
        );
    }

    #[test]
    fn a_managed_or_absent_registry_keeps_no_tags() {
        let streams = vec![stream(
            "cli",
            json!([{"name": "latest", "from": {"kind": "DockerImage", "name": "x"}}]),
        )];
        for (config, state) in [
            (
                Some(json!({"spec": {"managementState": "Managed"}})),
                Some("Managed"),
            ),
            (Some(json!({"spec": {}})), Some("Managed")),
            (None, None),
        ] {
            let reg = observed(config.as_ref(), &streams);
            assert_eq!(reg.management_state.as_deref(), state);
            assert!(reg.tags.is_empty());
            assert!(!wants_image_streams(config.as_ref()));
        }
        let removed = json!({"spec": {"managementState": "Removed"}});
        assert!(wants_image_streams(Some(&removed)));
    }

    /// A namespace full of ImageStreams (a cluster-admin can write there) makes a ConfigMap
    /// that fits: at most MAX_TAGS tags, no long pull spec.
    #[test]
    fn the_table_is_bounded() {
        let config = json!({"spec": {"managementState": "Removed"}});
        let long = "q".repeat(MAX_SPEC + 1);
        let streams: Vec<Value> = (0..MAX_TAGS + 10)
            .map(|i| stream(&format!("s{i}"), json!([
                {"name": "t", "from": {"kind": "DockerImage", "name": format!("quay.io/x/{i}@sha256:{}", "a".repeat(64))}},
                {"name": "long", "from": {"kind": "DockerImage", "name": long}},
            ])))
            .collect();
        let reg = observed(Some(&config), &streams);
        assert_eq!(reg.tags.len(), MAX_TAGS);
        assert!(reg.tags.values().all(|v| v.len() <= MAX_SPEC));
        let cm = config_map("clusters-a", &reg).expect("render");
        let size: usize = cm
            .data
            .iter()
            .flatten()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        assert!(size < 1 << 20, "{size} bytes");
    }
}
