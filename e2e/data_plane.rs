//! The guards never break the cluster they guard (#59): a hosted cluster with what a real one
//! has around its API (its controller manager, a scheduler, kubelets with node identities, the
//! Node authorizer and the NodeRestriction and ServiceAccount plugins) runs its platform, a
//! customer installs Red Hat's operators and does everyday work, with every guard enforced on
//! each engine: nothing of it is refused, every pod gets its token through its kubelet, and the
//! tenant's routes to an exempt identity through a pod stay shut.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line limit
// holds the shipped code (clippy.toml).
#![allow(clippy::too_many_lines)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use hcp_fleet_guards::catalogue::GuardEngine;
use hcp_fleet_guards::has_cel_form;
use hcp_fleet_model::Mode;
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_testbed::assets::Feature;
use hcp_fleet_testbed::{data_plane, platform};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use support::eventually;

const HOSTED: &str = "hc-1";

/// Every guard enforced (the Service mutation too), each with a CEL form on `engine`; the
/// probe every 3 s, so the agent looks at the internal registry again (every fifth round)
/// within a test's patience.
fn enforced_on(engine: GuardEngine) -> AgentConfig {
    let mut cfg = AgentConfig::default();
    cfg.probe_interval_seconds = 3;
    for w in &mut cfg.webhooks {
        w.mode = Mode::Enforce;
        if engine == GuardEngine::Webhook || has_cel_form(&w.path) {
            w.engine = engine;
        }
    }
    cfg
}

/// The pods the platform fixture runs, by namespace, once every node runs its DaemonSets.
fn expected_pods(nodes: usize) -> BTreeMap<String, usize> {
    platform::WORKLOADS
        .iter()
        .map(|(ns, daemonsets, deployments)| {
            (ns.to_string(), daemonsets.len() * nodes + deployments.len())
        })
        .collect()
}

/// The fixture's writes some guard (or anything else) refused, one line each.
fn refused_writes(report: &platform::Report) -> Vec<String> {
    report
        .refused()
        .iter()
        .map(|w| format!("{} by {}: {:?}", w.what, w.by, w.outcome))
        .collect()
}

/// The HCP namespace holds none of the admission service's objects, and its record says why.
async fn no_admission_service(mgmt: &Client) {
    let ns = hcp_fleet_testbed::fixtures::hcp_namespace(HOSTED);
    let there = support::admission_objects(mgmt, &ns).await;
    assert!(
        there.is_empty(),
        "admission objects of an HCP that needs none: {there:?}"
    );
    let record = support::health(mgmt, &ns).await.expect("the record");
    let said: Vec<String> = record
        .status
        .iter()
        .flat_map(|s| s.concerns.iter())
        .filter(|c| c.name == "admission-service")
        .flat_map(|c| c.history.iter().map(|h| h.message.clone()))
        .collect();
    assert!(
        said.first().is_some_and(
            |m| m.contains("not deployed: every guard runs inside the hosted kube-apiserver")
        ),
        "{said:?}"
    );
    // The record names each guard's path: none is a webhook.
    let guards = record.status.map(|s| s.guards).unwrap_or_default();
    assert!(
        !guards.is_empty() && guards.iter().all(|g| g.path != "webhook"),
        "{guards:?}"
    );
}

async fn running(hosted: &Client) -> BTreeMap<String, usize> {
    data_plane::running_pods(hosted).await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_runs_under_every_guard_through_webhooks() {
    the_cluster_runs_under_every_guard(GuardEngine::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_runs_under_every_guard_through_admission_policies() {
    the_cluster_runs_under_every_guard(GuardEngine::Policy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_runs_under_every_guard_through_static_guards() {
    the_cluster_runs_under_every_guard(GuardEngine::Static).await;
}

async fn the_cluster_runs_under_every_guard(engine: GuardEngine) {
    let assets = support::assets_or_skip_reason().expect("test bed binaries");
    let served = match engine {
        GuardEngine::Policy => support::serves(
            &assets.version,
            Feature::AdmissionPolicies,
            "the data plane under the guards as admission policies (the webhook test covers this server)",
        ),
        GuardEngine::Static => support::serves(
            &assets.version,
            Feature::StaticManifests,
            "the data plane under the static guards (the webhook test covers this server)",
        ),
        _ => true,
    };
    if !served {
        return;
    }
    let bed = support::agent_bed(enforced_on(engine)).await.expect("bed");
    support::wait_compliant(&bed.mgmt, &[HOSTED]).await;
    // Every guard inside the hosted kube-apiserver where it serves mutating policies too
    // (1.36): the HCP needs no admission service, and none was ever made (#61).
    let in_process =
        engine != GuardEngine::Webhook && assets.version.serves(Feature::MutatingPolicies);
    if in_process {
        no_admission_service(&bed.mgmt).await;
    }
    let fleet = &bed.fleet;
    let admin = fleet
        .hosted(HOSTED)
        .expect("hc-1")
        .client()
        .await
        .expect("admin");
    let dp = fleet.data_plane(HOSTED).expect("the data plane");
    let nodes = dp.nodes.len();

    // The cluster's own and the customer's work, with every guard in force.
    let report = platform::install(fleet, HOSTED)
        .await
        .expect("the platform fixture");
    let refused = refused_writes(&report);
    assert!(
        refused.is_empty(),
        "the guards refused the cluster's own or the customer's work ({} of {} writes):\n{}",
        refused.len(),
        report.writes.len(),
        refused.join("\n")
    );
    // The customer's LoadBalancer carries the service's AWS tag beside their own (MCVW's
    // service mutation), whichever engine judges the rest: a mutation is the service's.
    let web = Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), "team-a")
        .get("web")
        .await
        .expect("the customer's Service");
    let tags = web
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(hcp_fleet_guards::service_tags::TAGS_ANNOTATION);
    assert_eq!(
        tags.as_deref(),
        Some("red-hat-managed=true,team=a"),
        "the LoadBalancer's tags"
    );
    let by_policy =
        engine != GuardEngine::Webhook && assets.version.serves(Feature::MutatingPolicies);
    pod_images_follow_the_registry(fleet, &admin, by_policy).await;
    the_cluster_version_canary_is_denied_by_its_guard(fleet).await;
    let want = expected_pods(nodes);
    eventually(
        "every pod of the platform fixture Running",
        Duration::from_secs(120),
        || {
            let admin = admin.clone();
            let want = want.clone();
            async move {
                let got = running(&admin).await;
                let short: Vec<String> = want
                    .iter()
                    .filter(|(ns, n)| got.get(*ns).copied().unwrap_or(0) < **n)
                    .map(|(ns, n)| format!("{ns}: {} of {n}", got.get(ns).copied().unwrap_or(0)))
                    .collect();
                if short.is_empty() {
                    Ok(())
                } else {
                    Err(short.join(", "))
                }
            }
        },
    )
    .await;

    // Every pod got its token from its kubelet, and no token request was refused.
    let tokens = dp.tokens();
    let denied: Vec<_> = tokens.iter().filter(|t| t.outcome.is_err()).collect();
    assert!(
        denied.is_empty(),
        "kubelets' token requests refused: {denied:#?}"
    );
    let pods: Vec<Pod> = Api::<Pod>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items;
    for p in &pods {
        let (ns, name) = (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        );
        assert!(
            tokens
                .iter()
                .any(|t| t.namespace == ns && t.pod == name && t.outcome.is_ok()),
            "{ns}/{name} never got its token: {tokens:#?}"
        );
    }
    let platform_pods = pods
        .iter()
        .filter(|p| {
            p.metadata
                .namespace
                .as_deref()
                .is_some_and(|n| n.starts_with("openshift-") || n.starts_with("kube-"))
        })
        .count();
    eprintln!(
        "[data plane] {engine:?}: {} writes, {} pods ({platform_pods} in the platform's namespaces) on {nodes} nodes, {} token requests, 0 refused",
        report.writes.len(),
        pods.len(),
        tokens.len()
    );

    // The tenant's routes to an exempt identity through a pod stay shut, on this engine.
    let customer = fleet
        .hosted_client_for(HOSTED, platform::CUSTOMER.0, platform::CUSTOMER.1)
        .await
        .expect("customer");
    let dns_pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "mine", "namespace": "openshift-dns"},
        "spec": {"serviceAccountName": "dns", "containers": [{"name": "c", "image": "evil"}]},
    }))
    .expect("pod");
    let err = Api::<Pod>::namespaced(customer.clone(), "openshift-dns")
        .create(&PostParams::default(), &dns_pod)
        .await
        .expect_err("a tenant's pod running as openshift-dns/dns");
    assert!(
        err.to_string().contains(
            "running a pod as the service account \"dns\" in the namespace \"openshift-dns\" is not allowed"
        ),
        "{err}"
    );
    // Nor can the tenant ask for the token of a DNS pod that runs.
    let dns = pods
        .iter()
        .find(|p| p.metadata.namespace.as_deref() == Some("openshift-dns"))
        .expect("a DNS pod");
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
        "audiences": [], "expirationSeconds": 3607,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": dns.metadata.name, "uid": dns.metadata.uid}}});
    let sa = dns
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    let err = Api::<ServiceAccount>::namespaced(customer.clone(), "openshift-dns")
        .create_subresource::<serde_json::Value, serde_json::Value>(
            "token",
            &sa,
            &PostParams::default(),
            &request,
        )
        .await
        .expect_err("a tenant's token for a DNS pod");
    assert!(
        err.to_string()
            .contains("requesting a service account token in the namespace \"openshift-dns\""),
        "{err}"
    );
    // The same pod in the customer's own namespace runs, and its kubelet gets its token.
    let mut own = dns_pod.clone();
    own.metadata.namespace = Some("team-a".into());
    if let Some(s) = own.spec.as_mut() {
        s.service_account_name = Some("default".into());
        s.volumes = Some(vec![
            serde_json::from_value(json!({"name": "t", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}))
            .expect("volume"),
        ]);
    }
    until_admitted(
        "the customer's own pod created",
        &Api::<Pod>::namespaced(customer.clone(), "team-a"),
        &PostParams::default(),
        &own,
    )
    .await;
    eventually(
        "the customer's own pod's token",
        Duration::from_secs(60),
        || {
            let tokens = dp.tokens();
            async move {
                let mine: Vec<_> = tokens
                    .iter()
                    .filter(|t| t.namespace == "team-a" && t.pod == "mine")
                    .collect();
                mine.iter()
                    .any(|t| t.outcome.is_ok())
                    .then_some(())
                    .ok_or_else(|| format!("its kubelet's token requests so far: {mine:?}"))
            }
        },
    )
    .await;
    // All along, one canary every 3 s (the mutations' too: a LoadBalancer Service and, with
    // the registry removed, a pod naming the `openshift` cli in `default`, beside the data
    // plane's own traffic): none failed, and the record says so.
    let ns = hcp_fleet_testbed::fixtures::hcp_namespace(HOSTED);
    let record = support::health(&bed.mgmt, &ns).await.expect("record");
    assert_eq!(
        support::compliant(&record),
        Some("Compliant"),
        "{engine:?}: {:?}",
        record.status
    );
    // Proven by the canaries and the probe alone, still without a service.
    if in_process {
        no_admission_service(&bed.mgmt).await;
    }
}

/// A guard that denies the cluster's own requests shows on the HCP's health record (#59, item
/// 5): the ingress-config guard configured without HyperShift's control plane among its
/// classes (a misconfiguration an operator could make) denies the hosted-cluster-config
/// operator's write of the ingress config; the replica that denied it says so, under its
/// proof, when the agent next asks every replica (every fifth probe round), so the record's
/// e2e-probe concern turns NonCompliant, naming the guard and the sender. Two replicas, and
/// the hosted kube-apiserver's calls go to either: the agent must not depend on which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_that_denies_the_clusters_own_requests_shows_on_the_health_record() {
    use hcp_fleet_guards::identities::IdentityClass;
    let _ = support::assets_or_skip_reason().expect("test bed binaries");
    let mut cfg = enforced_on(GuardEngine::Webhook);
    for w in &mut cfg.webhooks {
        if w.path == hcp_fleet_guards::ingress_config::ROW.path {
            w.exempt_classes = Some(vec![
                IdentityClass::Machinery,
                IdentityClass::PlatformOperators,
                IdentityClass::Sre,
            ]);
        }
    }
    cfg.probe_interval_seconds = 5;
    let bed = support::agent_bed(cfg).await.expect("bed");
    support::wait_compliant(&bed.mgmt, &[HOSTED]).await;
    let report = platform::install(&bed.fleet, HOSTED)
        .await
        .expect("the platform fixture");
    // The guard refuses exactly the control plane's ingress config write.
    let refused = refused_writes(&report);
    assert!(
        !refused.is_empty()
            && refused.iter().all(|r| {
                r.contains(platform::HCCO.0)
                    && r.contains(hcp_fleet_guards::ingress_config::ROW.name)
            }),
        "only the hosted-cluster-config operator's ingress write is refused: {refused:#?}"
    );
    let ns = hcp_fleet_testbed::fixtures::hcp_namespace(HOSTED);
    let want = format!(
        "{} denied controlPlane",
        hcp_fleet_guards::ingress_config::ROW.name
    );
    eventually(
        "the e2e-probe concern NonCompliant, naming the guard and the sender",
        // Five rounds of 5 s between reports, then a reconcile; the rest is load.
        Duration::from_secs(90),
        || {
            let mgmt = bed.mgmt.clone();
            let ns = ns.clone();
            let want = want.clone();
            async move {
                let h = support::health(&mgmt, &ns).await?;
                let probe = h
                    .status
                    .as_ref()
                    .and_then(|s| s.concerns.iter().find(|c| c.name == "e2e-probe"))
                    .ok_or("no e2e-probe concern")?;
                let newest = probe
                    .history
                    .first()
                    .map(|e| e.message.as_str())
                    .unwrap_or("");
                let nc = probe.compliant.map(|c| c.as_str()) == Some("NonCompliant");
                (nc && newest.contains(&want) && newest.contains("HcpFleetGuardBreaksTheCluster"))
                    .then_some(())
                    .ok_or_else(|| format!("{:?}: {newest}", probe.compliant))
            }
        },
    )
    .await;
}

/// MCVW's pod image spec mutation on the fixture's cluster: while its image registry is
/// Managed, a customer's pod naming the internal registry's `openshift/cli:latest` is left as
/// written; once the customer removes the registry, the agent reads the change from the hosted
/// cluster and writes it to the admission service's ConfigMap, and the same pod (and its init
/// container's must-gather) gets the release's images that the `openshift` ImageStreams name.
/// A tag no ImageStream has leaves the pod as written. Where the server serves mutating
/// policies and the guards are not all asked onto webhooks (`by_policy`), the rewrite is a
/// MutatingAdmissionPolicy carrying the tags the agent read, none while the registry is
/// Managed, and no webhook ever; elsewhere the admission service's webhook.
/// Creates `pod` once the ServiceAccount plugin admits it. The plugin wants the namespace's
/// default account and, on 1.20, its token Secret, which the controller manager makes a moment
/// after the namespace: until then every pod there is refused ("No API token found"), whatever
/// the guards say.
async fn until_admitted(what: &str, pods: &Api<Pod>, params: &PostParams, pod: &Pod) {
    eventually(what, Duration::from_secs(60), || {
        let (pods, params, pod) = (pods.clone(), params.clone(), pod.clone());
        async move {
            pods.create(&params, &pod)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await;
}

async fn pod_images_follow_the_registry(
    fleet: &hcp_fleet_testbed::LocalFleet,
    admin: &Client,
    by_policy: bool,
) {
    use hcp_fleet_guards::pod_image_spec::ROW;
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::core::{ApiResource, GroupVersionKind};
    // (a mutating policy named for the guard, a mutating webhook entry named for it)
    let carriers = || async {
        let policy = by_policy && support::mutating_policy_exists(admin, ROW.name).await?;
        let hooked = support::mutating_webhook_entry(admin, ROW.name).await?;
        Ok::<_, String>((policy, hooked))
    };
    let wanted_while_managed = (false, !by_policy);
    assert_eq!(
        carriers().await.expect("the hosted mutations"),
        wanted_while_managed,
        "(policy, webhook) for the pod image spec mutation while the registry is Managed"
    );
    let customer = fleet
        .hosted_client_for(HOSTED, platform::CUSTOMER.0, platform::CUSTOMER.1)
        .await
        .expect("customer");
    let internal =
        |image: &str| format!("image-registry.openshift-image-registry.svc:5000/openshift/{image}");
    let pod = |name: &str, image: &str, init: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": image}],
                     "initContainers": [{"name": "i", "image": init}]},
        }))
        .expect("pod")
    };
    let images = |p: &Pod| -> (String, String) {
        let spec = p.spec.clone().unwrap_or_default();
        let first = |c: Option<&k8s_openapi::api::core::v1::Container>| {
            c.and_then(|c| c.image.clone()).unwrap_or_default()
        };
        (
            first(spec.containers.first()),
            first(spec.init_containers.as_ref().and_then(|i| i.first())),
        )
    };
    let pods = Api::<Pod>::namespaced(customer.clone(), "team-a");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let written = (internal("cli:latest"), internal("must-gather:latest"));
    let debug = pod("debug", &written.0, &written.1);
    until_admitted("a pod admitted in team-a", &pods, &dry, &debug).await;
    let kept = pods
        .create(&dry, &debug)
        .await
        .expect("a pod, registry Managed");
    assert_eq!(
        images(&kept),
        written,
        "changed while the registry is Managed"
    );

    // The customer removes the registry, as OpenShift's documentation lets them.
    let config = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("imageregistry.operator.openshift.io", "v1", "Config"),
        "configs",
    );
    Api::<DynamicObject>::all_with(customer.clone(), &config)
        .patch(
            "cluster",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"managementState": "Removed"}})),
        )
        .await
        .expect("the customer removes the image registry");
    let release = |name: &str| {
        platform::RELEASE_IMAGE_STREAMS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| platform::release_image(d))
            .expect("a release image")
    };
    let want = (release("cli"), release("must-gather"));
    eventually(
        "a pod's internal-registry images replaced by the release's",
        Duration::from_secs(90),
        || {
            let (pods, debug, want, dry) = (pods.clone(), debug.clone(), want.clone(), dry.clone());
            async move {
                let got = pods.create(&dry, &debug).await.map_err(|e| e.to_string())?;
                (images(&got) == want)
                    .then_some(())
                    .ok_or_else(|| format!("{:?}", images(&got)))
            }
        },
    )
    .await;
    assert_eq!(
        carriers().await.expect("the hosted mutations"),
        (by_policy, !by_policy),
        "(policy, webhook) for the pod image spec mutation once the registry is Removed"
    );
    let unknown = pod("unknown", &internal("cli:4.99"), &written.1);
    let got = pods
        .create(&dry, &unknown)
        .await
        .expect("a pod with an unknown tag");
    assert_eq!(
        images(&got),
        (internal("cli:4.99"), written.1.clone()),
        "a tag no ImageStream has leaves the pod as written"
    );
}

/// platform-config's canary on a cluster that has its object: the canary user's dry-run delete
/// of the ClusterVersion `version` (which the cluster-version operator made) is denied by
/// platform-config, on whichever engine carries it, once the agent has granted the canary user
/// its RBAC (at its first canary refused by RBAC).
async fn the_cluster_version_canary_is_denied_by_its_guard(fleet: &hcp_fleet_testbed::LocalFleet) {
    use hcp_fleet_guards::canary::{CANARY_GROUP, CANARY_USER};
    use kube::api::{DeleteParams, DynamicObject};
    use kube::core::{ApiResource, GroupVersionKind};
    let canary = fleet
        .hosted_client_for(HOSTED, CANARY_USER, &[CANARY_GROUP])
        .await
        .expect("the canary user");
    let versions = Api::<DynamicObject>::all_with(
        canary,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("config.openshift.io", "v1", "ClusterVersion"),
            "clusterversions",
        ),
    );
    let dp = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    eventually(
        "the ClusterVersion canary denied by platform-config",
        Duration::from_secs(90),
        || {
            let (versions, dp) = (versions.clone(), dp.clone());
            async move {
                match versions.delete("version", &dp).await {
                    Err(kube::Error::Api(s))
                        if s.code == 403 && s.message.contains("platform-config") =>
                    {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
}
