//! Management-cluster objects as HyperShift creates them, for the local control plane: the
//! project's CRDs and, per hosted cluster, its HCP namespace, kubeconfig secrets and a ready
//! HostedControlPlane.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::LocalCpError;
use super::assets::KubeVersion;
use hcp_fleet_model::crd::hostedcontrolplane::{HcpCondition, HostedControlPlaneSpec};
use hcp_fleet_model::crd::{
    CRD_MANIFESTS, HCP_NAMESPACE_LABEL, HostedControlPlane, HostedControlPlaneStatus, SecretKeyRef,
};

const FIELD_MANAGER: &str = "hcp-fleet-agent-testbed";
/// The secret the agent reads by default (docs/architecture.md, step 4).
pub const SERVICE_NETWORK_KUBECONFIG: &str = "service-network-admin-kubeconfig";
/// The secret HyperShift publishes in `status.kubeConfig`.
pub(crate) const ADMIN_KUBECONFIG: &str = "admin-kubeconfig";

/// `clusters-<name>`: a HostedCluster `<name>` in namespace `clusters`.
pub fn hcp_namespace(name: &str) -> String {
    format!("clusters-{name}")
}

fn kube_err(context: String) -> impl FnOnce(kube::Error) -> LocalCpError {
    move |source| LocalCpError::Kube { context, source }
}

/// Installs (server-side apply) the project's CRDs and waits until they are served.
/// The CRDs of the management cluster: the HostedControlPlane and Policy CRDs given
/// (HyperShift's and ACM's own, or the trimmed ones; see `LocalFleet::hcp_crd` and
/// `LocalFleet::policy_crd`), then the others the project ships.
pub async fn install_crds(
    client: &Client,
    hcp_crd: &str,
    policy_crd: &str,
) -> Result<(), LocalCpError> {
    let (hcp_name, _) = CRD_MANIFESTS[0];
    let (policy_name, _) = CRD_MANIFESTS[1];
    let rest = CRD_MANIFESTS[2..].iter().map(|(n, y)| (*n, *y));
    // The agent's own CRDs, as the chart ships them; without CEL rules where the server has
    // no CEL (the 1.20 test bed).
    let cel = client
        .apiserver_version()
        .await
        .ok()
        .and_then(|info| KubeVersion::parse(&info.git_version))
        .is_none_or(|v| v.has_cel());
    let own: Vec<(String, String)> = hcp_fleet_model::crd::health::crds()
        .iter_mut()
        .map(|c| {
            if !cel {
                hcp_fleet_model::crd::health::without_cel(c);
            }
            (
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                serde_saphyr::to_string(c).unwrap_or_default(),
            )
        })
        .collect();
    install_crd_manifests(
        client,
        [(hcp_name, hcp_crd), (policy_name, policy_crd)]
            .into_iter()
            .chain(rest)
            .chain(own.iter().map(|(n, y)| (n.as_str(), y.as_str()))),
    )
    .await
}

/// Installs CRD manifests given as (name, YAML) and waits for each to be Established.
pub async fn install_crd_manifests<'a>(
    client: &Client,
    manifests: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), LocalCpError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for (name, yaml) in manifests {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(yaml).map_err(|e| LocalCpError::Crd {
                name: name.to_string(),
                reason: format!("manifest does not parse: {e}"),
            })?;
        api.patch(name, &pp, &Patch::Apply(&crd))
            .await
            .map_err(kube_err(format!("applying CRD {name}")))?;
        names.push(name.to_string());
    }
    for name in names {
        let cond = kube::runtime::conditions::is_crd_established();
        let wait = kube::runtime::wait::await_condition(api.clone(), &name, cond);
        match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(LocalCpError::Crd {
                    name,
                    reason: format!("waiting for Established: {e}"),
                });
            }
            Err(_) => {
                return Err(LocalCpError::Crd {
                    name,
                    reason: "not Established within 30s".into(),
                });
            }
        }
    }
    Ok(())
}

/// The namespace the agent runs in; in a cluster `helm install --create-namespace` (or the
/// ACM Policy) creates it, never the agent.
pub const AGENT_NAMESPACE: &str = "hcp-fleet-agent";

/// Creates the agent's namespace, as installing the chart would.
pub async fn create_agent_namespace(client: &Client) -> Result<(), LocalCpError> {
    ensure_namespace(client, AGENT_NAMESPACE, BTreeMap::new()).await
}

/// Creates (or updates) namespace `name` with `labels`, by server-side apply.
pub async fn ensure_namespace(
    client: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<(), LocalCpError> {
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: (!labels.is_empty()).then_some(labels),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&namespace),
        )
        .await
        .map_err(kube_err(format!("creating namespace {name}")))?;
    Ok(())
}

/// Creates what HyperShift creates for hosted cluster `name`: namespace `clusters-<name>`
/// (labelled), the kubeconfig secrets, and a HostedControlPlane with a ready status.
pub async fn create_hcp(
    client: &Client,
    name: &str,
    hosted_kubeconfig: &str,
) -> Result<(), LocalCpError> {
    let ns = hcp_namespace(name);
    let labels = BTreeMap::from([(HCP_NAMESPACE_LABEL.to_string(), "true".to_string())]);
    ensure_namespace(client, &ns, labels).await?;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    for secret_name in [SERVICE_NETWORK_KUBECONFIG, ADMIN_KUBECONFIG] {
        put_kubeconfig_secret(&secrets, secret_name, "kubeconfig", hosted_kubeconfig).await?;
    }

    let hcps: Api<HostedControlPlane> = Api::namespaced(client.clone(), &ns);
    let extra = aws_hcp_spec(name);
    let mut hcp = HostedControlPlane::new(
        name,
        HostedControlPlaneSpec {
            kubeconfig: None,
            extra,
        },
    );
    hcp.metadata.namespace = Some(ns.clone());
    match hcps.create(&PostParams::default(), &hcp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(kube_err(format!("creating HostedControlPlane {ns}/{name}"))(e)),
    }
    create_hosted_cluster(client, name).await?;
    set_hcp_ready(client, &ns, name, true).await
}

/// The HostedCluster `clusters/<name>` whose control plane is in `clusters-<name>`, as the
/// HyperShift operator keeps it beside the HCP (the agent reads its metadata only).
pub(crate) async fn create_hosted_cluster(client: &Client, name: &str) -> Result<(), LocalCpError> {
    ensure_namespace(client, HOSTED_CLUSTER_NAMESPACE, BTreeMap::new()).await?;
    let mut hc = hcp_fleet_model::crd::HostedCluster::new(name, Default::default());
    hc.metadata.namespace = Some(HOSTED_CLUSTER_NAMESPACE.into());
    hc.spec.extra = BTreeMap::from([(
        "release".to_string(),
        serde_json::json!({"image": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64"}),
    )]);
    match Api::<hcp_fleet_model::crd::HostedCluster>::namespaced(
        client.clone(),
        HOSTED_CLUSTER_NAMESPACE,
    )
    .create(&PostParams::default(), &hc)
    .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!(
            "creating HostedCluster {HOSTED_CLUSTER_NAMESPACE}/{name}"
        ))(e)),
    }
}

/// The namespace of the test bed's HostedClusters (HyperShift's default).
pub(crate) const HOSTED_CLUSTER_NAMESPACE: &str = "clusters";

/// The spec of a HostedControlPlane as HyperShift writes one for an AWS hosted cluster: every
/// field HyperShift's own CRD requires (dns, etcd, infraID, issuerURL, platform with region
/// and IAM roles, pullSecret, releaseImage, the four published services, sshKey), with the
/// values a ROSA-style cluster carries. The agent reads none of it; it is here so the upstream
/// CRD's schema and CEL rules accept the fixtures as they would a real cluster's.
fn aws_hcp_spec(name: &str) -> BTreeMap<String, serde_json::Value> {
    let infra_id = format!("{name}-x7k2p");
    let role = |r: &str| format!("arn:aws:iam::123456789012:role/{infra_id}-{r}");
    let route = |svc: &str, host: &str| {
        serde_json::json!({"service": svc, "servicePublishingStrategy": {
            "type": "Route", "route": {"hostname": format!("{host}.{name}.hypershift.example.com")},
        }})
    };
    let spec = serde_json::json!({
        "releaseImage": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64",
        "infraID": infra_id,
        "issuerURL": format!("https://oidc.example.com/{infra_id}"),
        "dns": {"baseDomain": format!("{name}.hypershift.example.com")},
        "etcd": {"managementType": "Managed", "managed": {"storage": {
            "type": "PersistentVolume", "persistentVolume": {"size": "8Gi"},
        }}},
        "pullSecret": {"name": "pull-secret"},
        "sshKey": {"name": "ssh-key"},
        "networking": {
            "networkType": "OVNKubernetes",
            "clusterNetwork": [{"cidr": "10.132.0.0/14"}],
            "serviceNetwork": [{"cidr": "172.31.0.0/16"}],
            "machineNetwork": [{"cidr": "10.0.0.0/16"}],
        },
        "platform": {
            "type": "AWS",
            "aws": {
                "region": "us-east-1",
                "endpointAccess": "Public",
                "rolesRef": {
                    "ingressARN": role("openshift-ingress"),
                    "imageRegistryARN": role("openshift-image-registry"),
                    "storageARN": role("aws-ebs-csi-driver-controller"),
                    "networkARN": role("cloud-network-config-controller"),
                    "kubeCloudControllerARN": role("kube-controller-manager"),
                    "nodePoolManagementARN": role("node-pool"),
                    "controlPlaneOperatorARN": role("control-plane-operator"),
                },
            },
        },
        "services": [
            {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer"}},
            route("OAuthServer", "oauth"),
            route("Konnectivity", "konnectivity"),
            route("Ignition", "ignition"),
        ],
        "controllerAvailabilityPolicy": "HighlyAvailable",
        "infrastructureAvailabilityPolicy": "SingleReplica",
    });
    match spec {
        serde_json::Value::Object(m) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// Writes `status.ready` (and the published kubeconfig reference) of a HostedControlPlane.
pub async fn set_hcp_ready(
    client: &Client,
    ns: &str,
    name: &str,
    ready: bool,
) -> Result<(), LocalCpError> {
    let hcps: Api<HostedControlPlane> = Api::namespaced(client.clone(), ns);
    let status = HostedControlPlaneStatus {
        ready,
        kube_config: Some(SecretKeyRef {
            name: ADMIN_KUBECONFIG.into(),
            key: "kubeconfig".into(),
        }),
        conditions: vec![HcpCondition {
            type_: "Available".into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: Some("AsExpected".into()),
            // metav1.Condition requires a message (HyperShift's CRD enforces it).
            message: Some(
                if ready {
                    "the control plane is available"
                } else {
                    "the control plane is not available"
                }
                .into(),
            ),
            last_transition_time: Some(super::api_now()),
        }],
        // Required by HyperShift's CRD beside `ready`.
        extra: BTreeMap::from([("initialized".to_string(), serde_json::json!(true))]),
    };
    let patch = serde_json::json!({"status": status});
    hcps.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!(
            "setting status of HostedControlPlane {ns}/{name}"
        )))?;
    Ok(())
}

/// Creates or replaces a secret holding `data` under `key` (tests use it for hostile input).
pub async fn put_kubeconfig_secret(
    secrets: &Api<Secret>,
    name: &str,
    key: &str,
    data: &str,
) -> Result<(), LocalCpError> {
    let ns = secrets.namespace().unwrap_or_default().to_string();
    let mut map = BTreeMap::new();
    map.insert(key.to_string(), ByteString(data.as_bytes().to_vec()));
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        data: Some(map),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    secrets
        .patch(name, &pp, &Patch::Apply(&secret))
        .await
        .map_err(kube_err(format!("writing secret {ns}/{name}")))?;
    Ok(())
}

/// HyperShift's hosted kube-apiserver Deployment in the HCP namespace of `hcp`, with or without
/// the static guards' ConfigMap mounted as HyperShift would mount it (docs/static-guards.md):
/// one optional volume per key, each into the directory its admission plugin reads. The test
/// bed's hosted servers are processes, not this Deployment's pods (its replicas are 0 and the
/// management cluster runs no controller manager); the agent reads only whether its pod
/// template mounts the ConfigMap, which is what `offered` says, and the test bed's kubelet
/// (`static_volumes`) writes both keys either way, as a server started with the volumes
/// would see them.
pub async fn put_kube_apiserver(
    client: &Client,
    hcp: &str,
    mount_path: &str,
    offered: bool,
) -> Result<(), LocalCpError> {
    use hcp_fleet_render::hosted::static_guards::{
        CONFIG_MAP, KUBE_APISERVER, MUTATING_POLICIES_DIR, MUTATING_POLICIES_KEY, POLICIES_DIR,
        POLICIES_KEY,
    };
    let ns = hcp_namespace(hcp);
    let volumes: Vec<serde_json::Value> = [
        ("hcp-fleet-guards", POLICIES_KEY, POLICIES_DIR),
        (
            "hcp-fleet-mutating-guards",
            MUTATING_POLICIES_KEY,
            MUTATING_POLICIES_DIR,
        ),
    ]
    .iter()
    .map(|(name, key, _)| {
        serde_json::json!({"name": name, "configMap": {
            "name": CONFIG_MAP, "optional": true, "items": [{"key": key, "path": key}],
        }})
    })
    .collect();
    let mounts: Vec<serde_json::Value> = [
        ("hcp-fleet-guards", POLICIES_DIR),
        ("hcp-fleet-mutating-guards", MUTATING_POLICIES_DIR),
    ]
    .iter()
    .map(|(name, dir)| {
        serde_json::json!({"name": name, "mountPath": format!("{mount_path}/{dir}"), "readOnly": true})
    })
    .collect();
    let (volumes, mounts) = if offered {
        (volumes, mounts)
    } else {
        (Vec::new(), Vec::new())
    };
    let d = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": KUBE_APISERVER, "namespace": ns},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "kube-apiserver"}},
            "template": {
                "metadata": {"labels": {"app": "kube-apiserver"}},
                "spec": {
                    "containers": [{
                        "name": "kube-apiserver",
                        "image": "quay.io/openshift/origin-hyperkube:4.21",
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &ns)
        .patch(KUBE_APISERVER, &pp, &Patch::Apply(&d))
        .await
        .map_err(kube_err(format!(
            "writing Deployment {ns}/{KUBE_APISERVER}"
        )))?;
    Ok(())
}
