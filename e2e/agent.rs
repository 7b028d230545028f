//! The agent against real kube-apiservers: HCPs converge to Compliant with admission objects
//! on the management side and webhook configurations in each hosted cluster; a restarted
//! agent changes nothing; drift is repaired and recorded; hostile kubeconfigs are refused.

mod support;

use support::eventually;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hcp_fleet_agent::agent::{self, StartOptions};
use hcp_fleet_agent::config::AgentConfig;
use hcp_fleet_agent::crd::{
    AdmissionHealth, AdmissionHealthPolicy, AdmissionHealthPolicySpec, Policy,
};
use hcp_fleet_agent::hosted::webhooks::{MUTATING_NAME, OWNED_LABEL, VALIDATING_NAME};
use hcp_fleet_agent::localcp::assets::Feature;
use hcp_fleet_agent::localcp::fixtures::{
    SERVICE_NETWORK_KUBECONFIG, hcp_namespace, put_kubeconfig_secret,
};
use hcp_fleet_agent::localcp::{FleetOptions, LocalFleet, kubelet};
use hcp_fleet_agent::management::ALLOW_GUEST_WEBHOOKS;
use hcp_fleet_agent::reporting::HEALTH_NAME;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};

const AGENT_NS: &str = "hcp-fleet-agent";

async fn health(client: &Client, ns: &str) -> Result<AdmissionHealth, String> {
    Api::<AdmissionHealth>::namespaced(client.clone(), ns)
        .get(HEALTH_NAME)
        .await
        .map_err(|e| format!("{ns}/{HEALTH_NAME}: {e}"))
}

fn compliant(h: &AdmissionHealth) -> Option<&'static str> {
    h.status
        .as_ref()
        .and_then(|s| s.compliant)
        .map(|c| c.as_str())
}

fn history_messages(h: &AdmissionHealth, concern: &str) -> Vec<String> {
    h.status
        .iter()
        .flat_map(|s| s.concerns.iter())
        .filter(|d| d.name == concern)
        .flat_map(|d| d.history.iter().map(|h| h.message.clone()))
        .collect()
}

/// An `AdmissionHealthPolicy` template with no parent Policy: the agent still writes its
/// verdict (one row per hosted cluster) into its status.
async fn create_template(mgmt: &Client, ns: &str, name: &str) {
    let t = AdmissionHealthPolicy::new(name, AdmissionHealthPolicySpec::default());
    Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), ns)
        .create(&Default::default(), &t)
        .await
        .expect("create the template");
}

/// Waits until the template `fleet` in the agent's namespace says `state` over `rows` hosted
/// clusters.
async fn wait_template(mgmt: &Client, state: &str, rows: usize) {
    eventually(
        &format!("the template says {state} over {rows} rows"),
        Duration::from_secs(10),
        || {
            let mgmt = mgmt.clone();
            async move {
                let (have, list) = template_rows(&mgmt, AGENT_NS, "fleet").await?;
                if have == state && list.len() == rows {
                    Ok(())
                } else {
                    Err(format!("{have} {list:?}"))
                }
            }
        },
    )
    .await;
}

/// The template's verdict and the HCP namespaces of its rows.
async fn template_rows(
    mgmt: &Client,
    ns: &str,
    name: &str,
) -> Result<(String, Vec<String>), String> {
    let t = Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let st = t.status.unwrap_or_default();
    Ok((
        st.compliant
            .map(|c| c.as_str().to_string())
            .unwrap_or_default(),
        st.related_objects
            .iter()
            .map(|r| r.object.metadata.namespace.clone())
            .collect(),
    ))
}

async fn start_agent(mgmt: &Client) -> agent::AgentHandle {
    agent::start(
        mgmt.clone(),
        hcp_fleet_agent::localcp::allow_loopback(AgentConfig::default()),
        StartOptions {
            agent_namespace: AGENT_NS.into(),
            endpoints: kubelet::endpoints(),
        },
    )
    .await
    .expect("agent starts")
}

async fn wait_compliant(mgmt: &Client, names: &[&str]) {
    for name in names {
        let ns = hcp_namespace(name);
        eventually(&format!("{ns} Compliant"), Duration::from_secs(60), || {
            let mgmt = mgmt.clone();
            let ns = ns.clone();
            async move {
                let p = health(&mgmt, &ns).await?;
                match compliant(&p) {
                    Some("Compliant") => Ok(()),
                    other => Err(format!("{other:?}: {:?}", p.status)),
                }
            }
        })
        .await;
    }
}

/// Waits until the health record in `ns` says `overall` and the newest history entry of
/// `template` (a concern) is in ACM's form for that verdict and mentions `needle`.
async fn wait_verdict(mgmt: &Client, ns: &str, template: &str, overall: &str, needle: &str) {
    let prefix = match overall {
        "Compliant" => "Compliant; notification - ",
        "Pending" => "Pending; notification - ",
        _ => "NonCompliant; violation - ",
    };
    eventually(
        &format!("{ns} {template}: {overall} mentioning {needle:?}"),
        Duration::from_secs(30),
        || {
            let mgmt = mgmt.clone();
            async move {
                let p = health(&mgmt, ns).await?;
                let h = history_messages(&p, template);
                match h.first() {
                    Some(m)
                        if compliant(&p) == Some(overall)
                            && m.starts_with(prefix)
                            && m.contains(needle) =>
                    {
                        Ok(())
                    }
                    _ => Err(format!("{:?} {h:?}", compliant(&p))),
                }
            }
        },
    )
    .await;
}

/// The agent's validating configuration exists (again).
/// Drift, as someone in the hosted cluster makes it: deletes the agent's validating
/// configuration in `cluster`, and returns the API to see whether it comes back.
async fn delete_validating(
    fleet: &LocalFleet,
    cluster: &str,
) -> Api<ValidatingWebhookConfiguration> {
    let hosted = fleet
        .hosted(cluster)
        .expect("hosted cluster")
        .client()
        .await
        .expect("client");
    let vapi = Api::<ValidatingWebhookConfiguration>::all(hosted);
    vapi.delete(VALIDATING_NAME, &DeleteParams::default())
        .await
        .expect("delete");
    vapi
}

fn present(
    vapi: &Api<ValidatingWebhookConfiguration>,
) -> impl std::future::Future<Output = Result<(), String>> + use<> {
    let vapi = vapi.clone();
    async move {
        vapi.get(VALIDATING_NAME)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// resourceVersions of everything the agent writes for one hosted cluster.
async fn versions(mgmt: &Client, hosted: &Client, ns: &str) -> BTreeMap<String, String> {
    let mut v = BTreeMap::new();
    let rv = |o: Option<String>| o.unwrap_or_default();
    for s in ["hcp-fleet-admission-ca", "hcp-fleet-admission-tls"] {
        let o = Api::<Secret>::namespaced(mgmt.clone(), ns)
            .get(s)
            .await
            .expect("secret");
        v.insert(format!("secret/{s}"), rv(o.metadata.resource_version));
    }
    let d = Api::<Deployment>::namespaced(mgmt.clone(), ns)
        .get("hcp-fleet-admission")
        .await
        .expect("deploy");
    v.insert("deployment".into(), rv(d.metadata.resource_version));
    let s = Api::<Service>::namespaced(mgmt.clone(), ns)
        .get("hcp-fleet-admission")
        .await
        .expect("svc");
    v.insert("service".into(), rv(s.metadata.resource_version));
    let p = health(mgmt, ns).await.expect("health");
    v.insert("health".into(), rv(p.metadata.resource_version));
    let vw = Api::<ValidatingWebhookConfiguration>::all(hosted.clone())
        .get(VALIDATING_NAME)
        .await
        .expect("vwc");
    v.insert("vwc".into(), rv(vw.metadata.resource_version));
    let mw = Api::<MutatingWebhookConfiguration>::all(hosted.clone())
        .get(MUTATING_NAME)
        .await
        .expect("mwc");
    v.insert("mwc".into(), rv(mw.metadata.resource_version));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosted_clusters_converge_stay_put_and_repair_drift() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(3).await;
    let agent = start_agent(&mgmt).await;
    let names = ["hc-1", "hc-2", "hc-3"];
    wait_compliant(&mgmt, &names).await;

    // An AdmissionHealthPolicy template (ACM's framework addon creates it; here without a
    // parent Policy) gets one row per hosted cluster.
    create_template(&mgmt, AGENT_NS, "fleet").await;
    wait_template(&mgmt, "Compliant", 3).await;

    for name in names {
        let ns = hcp_namespace(name);
        let svc = Api::<Service>::namespaced(mgmt.clone(), &ns)
            .get("hcp-fleet-admission")
            .await
            .expect("svc");
        let labels = svc.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get(ALLOW_GUEST_WEBHOOKS).map(String::as_str),
            Some("true")
        );
        let ca = Api::<Secret>::namespaced(mgmt.clone(), &ns)
            .get("hcp-fleet-admission-ca")
            .await
            .expect("ca");
        let ca_pem = ca
            .data
            .unwrap_or_default()
            .get("ca.crt")
            .expect("ca.crt")
            .0
            .clone();
        let hosted = fleet
            .hosted(name)
            .expect("hosted")
            .client()
            .await
            .expect("client");
        let vwc = Api::<ValidatingWebhookConfiguration>::all(hosted.clone())
            .get(VALIDATING_NAME)
            .await
            .expect("vwc");
        assert_eq!(
            vwc.labels().get(OWNED_LABEL).map(String::as_str),
            Some("true")
        );
        // In the test bed the URL is the address the stand-in kubelet published for this HCP's
        // service (in a cluster: https://<svc>.<ns>.svc.cluster.local, see the unit tests).
        let published = svc
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get(kubelet::LOCAL_ENDPOINT_ANNOTATION)
            .cloned()
            .expect("published endpoint");
        for w in vwc.webhooks.unwrap_or_default() {
            let url = w.client_config.url.unwrap_or_default();
            assert!(url.starts_with(&format!("{published}/")), "{url}");
            assert_eq!(
                w.client_config.ca_bundle.map(|b| b.0),
                Some(ca_pem.clone()),
                "caBundle is the HCP's CA"
            );
            assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
        }
        Api::<MutatingWebhookConfiguration>::all(hosted)
            .get(MUTATING_NAME)
            .await
            .expect("mwc");
    }

    // A second agent run changes nothing.
    let hc1 = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("client");
    let before = versions(&mgmt, &hc1, "clusters-hc-1").await;
    drop(agent);
    let agent = start_agent(&mgmt).await;
    eventually(
        "the new agent reconciled every HCP",
        Duration::from_secs(30),
        || {
            let text = agent.context.metrics.encode();
            async move {
                let count = text
                    .lines()
                    .find_map(|l| l.strip_prefix("hcp_fleet_reconcile_duration_seconds_count "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                if count >= 3 {
                    Ok(())
                } else {
                    Err(format!("{count} reconciles"))
                }
            }
        },
    )
    .await;
    let after = versions(&mgmt, &hc1, "clusters-hc-1").await;
    assert_eq!(before, after, "a restarted agent must not rewrite anything");

    // Drift: deleted, then edited, in the hosted cluster; both repaired and recorded.
    let vapi = Api::<ValidatingWebhookConfiguration>::all(hc1.clone());
    vapi.delete(VALIDATING_NAME, &DeleteParams::default())
        .await
        .expect("delete");
    let repaired_at = Instant::now();
    eventually(
        "deleted configuration restored",
        Duration::from_secs(10),
        || present(&vapi),
    )
    .await;
    let repair_time = repaired_at.elapsed();
    let mut edited = vapi.get(VALIDATING_NAME).await.expect("get");
    if let Some(ws) = edited.webhooks.as_mut() {
        ws[0].failure_policy = Some("Fail".into());
    }
    edited.metadata.managed_fields = None;
    vapi.replace(VALIDATING_NAME, &Default::default(), &edited)
        .await
        .expect("edit");
    eventually(
        "edited configuration restored",
        Duration::from_secs(10),
        || {
            let vapi = vapi.clone();
            async move {
                let v = vapi.get(VALIDATING_NAME).await.map_err(|e| e.to_string())?;
                let fp = v
                    .webhooks
                    .unwrap_or_default()
                    .first()
                    .and_then(|w| w.failure_policy.clone());
                if fp.as_deref() == Some("Ignore") {
                    Ok(())
                } else {
                    Err(format!("{fp:?}"))
                }
            }
        },
    )
    .await;
    eventually(
        "drift counted and in the health record's history",
        Duration::from_secs(10),
        || {
            let text = agent.context.metrics.encode();
            let mgmt = mgmt.clone();
            async move {
                let drift: u64 = text
                    .lines()
                    .filter(|l| {
                        l.starts_with("hcp_fleet_webhook_drift_total{")
                            && l.contains("clusters-hc-1")
                    })
                    .filter_map(|l| l.rsplit(" ").next().and_then(|n| n.parse::<u64>().ok()))
                    .sum();
                let p = health(&mgmt, "clusters-hc-1").await?;
                let hist = history_messages(&p, "hosted-webhooks");
                // Both repairs recorded, in one history entry or two (the two changes can
                // land in one reconcile).
                let recorded: usize = hist
                    .iter()
                    .filter(|m| m.contains("drift repaired"))
                    .map(|m| m.matches("by someone else").count())
                    .sum();
                if drift >= 2 && recorded >= 2 && compliant(&p) == Some("Compliant") {
                    Ok(())
                } else {
                    Err(format!("drift={drift} recorded={recorded} {hist:?}"))
                }
            }
        },
    )
    .await;
    eprintln!("drift repair (delete to restored, as seen by the test): {repair_time:?}");
    // Events on the health record.
    eventually("health events", Duration::from_secs(10), || {
        let events =
            Api::<k8s_openapi::api::core::v1::Event>::namespaced(mgmt.clone(), "clusters-hc-1");
        async move {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let ours: Vec<_> = list
                .items
                .iter()
                .filter(|e| e.reason.as_deref() == Some("Compliant"))
                .filter(|e| e.involved_object.kind.as_deref() == Some("AdmissionHealth"))
                .collect();
            let normal = ours.iter().any(|e| {
                e.type_.as_deref() == Some("Normal")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("hosted-webhooks: Compliant; notification - "))
            });
            if normal {
                Ok(())
            } else {
                Err(format!("{} matching events", ours.len()))
            }
        }
    })
    .await;

    // Hostile kubeconfigs are refused with a reason, and the exec plugin never runs.
    let marker = tempfile::tempdir().expect("tmp");
    let marker_file = marker.path().join("exec-ran");
    let secrets = Api::<Secret>::namespaced(mgmt.clone(), "clusters-hc-3");
    let hostile = [
        (
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: /bin/sh\n      args: [\"-c\", \"touch {}\"]\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
                marker_file.display()
            ),
            "users[0].user.exec",
        ),
        ("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n".to_string(), "tokenFile"),
        ("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    client-certificate-data: Zm9v\n    client-key: /etc/ssl/private/key.pem\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n".to_string(), "client-key"),
        ("not: [valid".to_string(), "not valid YAML"),
    ];
    for (doc, reason) in hostile {
        put_kubeconfig_secret(&secrets, SERVICE_NETWORK_KUBECONFIG, "kubeconfig", &doc)
            .await
            .expect("secret");
        wait_verdict(
            &mgmt,
            "clusters-hc-3",
            "hosted-webhooks",
            "NonCompliant",
            reason,
        )
        .await;
    }
    // A secret without the key.
    put_kubeconfig_secret(&secrets, SERVICE_NETWORK_KUBECONFIG, "other-key", "x")
        .await
        .expect("secret");
    wait_verdict(
        &mgmt,
        "clusters-hc-3",
        "hosted-webhooks",
        "NonCompliant",
        "has no key kubeconfig",
    )
    .await;
    assert!(!marker_file.exists(), "the exec plugin must never run");

    // The other two stayed Compliant throughout.
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    // Repairing the secret brings hc-3 back.
    let good = fleet.hosted("hc-3").expect("hc-3").kubeconfig_yaml.clone();
    let fresh = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(SERVICE_NETWORK_KUBECONFIG.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = secrets
        .delete(SERVICE_NETWORK_KUBECONFIG, &DeleteParams::default())
        .await;
    drop(fresh);
    put_kubeconfig_secret(&secrets, SERVICE_NETWORK_KUBECONFIG, "kubeconfig", &good)
        .await
        .expect("secret");
    wait_compliant(&mgmt, &["hc-3"]).await;
    drop(agent);
}

/// One hosted cluster down never delays the others; with an older Policy CRD without Pending
/// the fleet verdict for ACM stays within its enum; metrics and `status` show the fleet; a deleted HCP leaves no trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_cluster_old_policy_crd_metrics_status_and_deletion() {
    let mut fleet = LocalFleet::start(FleetOptions::with_hosted(3))
        .await
        .expect("fleet");
    let mgmt = fleet.management.client().await.expect("mgmt");
    // An ACM hub whose Policy CRD predates Pending: ACM's own CRD of such a release where the
    // asset script provided it, else the repository's schema minus that enum value.
    let own = hcp_fleet_agent::crd::CRD_MANIFESTS[1].1;
    let old = fleet
        .upstream_crd(hcp_fleet_agent::localcp::assets::UPSTREAM_POLICY_CRD)
        .unwrap_or_else(|| {
            own.replace(
                "enum: [Compliant, Pending, NonCompliant]",
                "enum: [Compliant, NonCompliant]",
            )
        });
    let crd: serde_json::Value = serde_saphyr::from_str(&old).expect("CRD parses");
    let states = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        ["compliant"]["enum"];
    assert_eq!(
        states,
        &serde_json::json!(["Compliant", "NonCompliant"]),
        "the variant really lacks Pending"
    );
    hcp_fleet_agent::localcp::fixtures::install_crd_manifests(
        &mgmt,
        [("policies.policy.open-cluster-management.io", old.as_str())],
    )
    .await
    .expect("old CRD");
    // hc-3's kube-apiserver is down; hc-2's HCP is not ready yet (Pending, written as NonCompliant).
    fleet.hosted_mut("hc-3").expect("hc-3").stop();
    hcp_fleet_agent::localcp::fixtures::set_hcp_ready(&mgmt, "clusters-hc-2", "hc-2", false)
        .await
        .expect("unready");
    let pods = tempfile::tempdir().expect("tmp");
    let _kubelet = kubelet::spawn(mgmt.clone(), support::real_pods(pods.path()));
    let agent = start_agent(&mgmt).await;
    assert!(
        !agent.context.caps.pending_supported,
        "detected the CRD without Pending"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let _server = agent::serve(listener, agent.context.metrics.clone());
    create_template(&mgmt, AGENT_NS, "fleet").await;

    let started = Instant::now();
    wait_compliant(&mgmt, &["hc-1"]).await;
    let hc1_time = started.elapsed();
    wait_verdict(
        &mgmt,
        "clusters-hc-3",
        "hosted-webhooks",
        "NonCompliant",
        "hosted kube-apiserver https://127.0.0.1:",
    )
    .await;
    wait_verdict(
        &mgmt,
        "clusters-hc-2",
        "admission-service",
        "Pending",
        "waiting for the HostedControlPlane to be ready",
    )
    .await;
    assert!(
        hc1_time < Duration::from_secs(20),
        "hc-1 was not held up by hc-3: {hc1_time:?}"
    );

    // The fleet verdict for ACM aggregates as ACM does and stays within the old enum (hc-2 is
    // Pending in its own record, which has Pending).
    wait_template(&mgmt, "NonCompliant", 3).await;

    // Metrics over HTTP, OpenMetrics text.
    let (code, body) = support::http_get(addr, "/metrics").await.expect("metrics");
    assert_eq!(code, 200);
    assert!(body.contains("hcp_fleet_hosted_cluster_compliance{hcp_namespace=\"clusters-hc-1\",hosted_cluster=\"hc-1\"} 0"), "{body}");
    assert!(body.contains("hcp_fleet_hosted_cluster_compliance{hcp_namespace=\"clusters-hc-3\",hosted_cluster=\"hc-3\"} 1"), "{body}");
    assert!(
        body.contains("hcp_fleet_hosted_api_errors_total{hcp_namespace=\"clusters-hc-3\""),
        "{body}"
    );
    assert!(body.contains("hcp_fleet_hosted_clusters 3"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"));
    assert_eq!(
        support::http_get(addr, "/healthz")
            .await
            .expect("healthz")
            .0,
        200
    );
    assert_eq!(
        support::http_get(addr, "/readyz").await.expect("readyz").0,
        200
    );

    // `status`, as an SRE runs it.
    let table = status_table(&fleet);
    let line = |c: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{c} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("hc-1").contains("Compliant") && !line("hc-1").contains("NonCompliant"),
        "{table}"
    );
    assert!(line("hc-3").contains("NonCompliant"), "{table}");

    // hc-3 comes back and converges; hc-2 becomes ready and converges.
    fleet
        .hosted_mut("hc-3")
        .expect("hc-3")
        .start()
        .await
        .expect("restart hc-3");
    hcp_fleet_agent::localcp::fixtures::set_hcp_ready(&mgmt, "clusters-hc-2", "hc-2", true)
        .await
        .expect("ready");
    wait_compliant(&mgmt, &["hc-1", "hc-2", "hc-3"]).await;

    // A bad configuration is refused and the running one kept; a good one takes effect, and
    // the owned configuration it no longer wants is deleted from the hosted clusters.
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("config.yaml");
    let args = agent::AgentArgs {
        config: Some(path.clone()),
        namespace: AGENT_NS.into(),
        concurrency: None,
        admission_image: None,
        local_mode: true,
        leader_elect: false,
        lease_duration_seconds: 15,
        metrics_addr: "127.0.0.1:0".parse().expect("addr"),
        template_sync_binding: None,
        framework_service_account: "governance-policy-framework-sa".into(),
        framework_namespace: None,
    };
    std::fs::write(
        &path,
        "concurrency: 0\nwebhooks: []\nadmission: {image: ''}\n",
    )
    .expect("write");
    let err = agent.reload(&args).expect_err("bad config refused");
    assert!(
        err.to_string().contains("concurrency must be at least 1"),
        "{err}"
    );
    assert_eq!(
        *agent.context.config(),
        hcp_fleet_agent::localcp::allow_loopback(AgentConfig::default()),
        "last good configuration kept"
    );
    let mut cfg = hcp_fleet_agent::localcp::allow_loopback(AgentConfig::default());
    for w in &mut cfg.webhooks {
        if w.kind == hcp_fleet_agent::config::WebhookKind::Mutating {
            w.mode = hcp_fleet_agent::config::Mode::Off;
        }
    }
    std::fs::write(&path, serde_saphyr::to_string(&cfg).expect("yaml")).expect("write");
    assert!(
        agent.reload(&args).expect("good config"),
        "a change was applied"
    );
    let hc1 = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("client");
    eventually(
        "mutating configuration removed",
        Duration::from_secs(15),
        || {
            let mapi = Api::<MutatingWebhookConfiguration>::all(hc1.clone());
            async move {
                match mapi
                    .get_opt(MUTATING_NAME)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    None => Ok(()),
                    Some(_) => Err("still there".into()),
                }
            }
        },
    )
    .await;

    // hc-3's HCP is deleted: its row, its series and its cached client go.
    let clients_before = agent.context.hosted_clients();
    Api::<hcp_fleet_agent::crd::HostedControlPlane>::namespaced(mgmt.clone(), "clusters-hc-3")
        .delete("hc-3", &DeleteParams::default())
        .await
        .expect("delete HCP");
    eventually("hc-3 forgotten", Duration::from_secs(15), || {
        let mgmt = mgmt.clone();
        let ctx = agent.context.clone();
        async move {
            let (_, rows) = template_rows(&mgmt, AGENT_NS, "fleet").await?;
            let (_, body) = support::http_get(addr, "/metrics").await?;
            if !rows.contains(&"clusters-hc-3".to_string())
                && rows.len() == 2
                && !body.contains("clusters-hc-3")
                && body.contains("hcp_fleet_hosted_clusters 2")
                && ctx.hosted_clients() + 1 == clients_before
            {
                Ok(())
            } else {
                Err(format!(
                    "rows={rows:?} clients={} metrics mention hc-3: {}",
                    ctx.hosted_clients(),
                    body.contains("clusters-hc-3")
                ))
            }
        }
    })
    .await;
    // Its health record lingers (no garbage collector runs here), but `status` lists only
    // HCPs that exist.
    health(&mgmt, "clusters-hc-3")
        .await
        .expect("hc-3's record is still there");
    let table = status_table(&fleet);
    assert!(!table.lines().any(|l| l.starts_with("hc-3 ")), "{table}");
    assert!(table.lines().any(|l| l.starts_with("hc-1 ")), "{table}");
}

/// The `status` command's table, run as an SRE runs it against the management cluster.
fn status_table(fleet: &LocalFleet) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-agent"))
        .arg("status")
        .env("KUBECONFIG", &fleet.management.kubeconfig_path)
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Two agent processes with leader election: exactly one reconciles; kill it and the other
/// takes over within the lease duration and repairs drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader_and_a_takeover() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    let lease_seconds = 10u64;
    let mut agents = Vec::new();
    for name in ["agent-a", "agent-b"] {
        let (child, addr) = support::spawn_elected_agent(
            name,
            &fleet.management.kubeconfig_path,
            AGENT_NS,
            Some(lease_seconds),
        );
        agents.push((name, child, addr));
    }
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;

    // Exactly one holds the lease and reconciles; the other only waits. Three processes cannot
    // be read at one instant, so a snapshot counts only when the Lease is the same (holder and
    // renewal count) before and after the agents' gauges are read.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(mgmt.clone(), AGENT_NS);
    let lease_state = || async {
        let spec = leases.get("hcp-fleet-agent").await.ok()?.spec?;
        Some((spec.holder_identity?, spec.lease_transitions.unwrap_or(0)))
    };
    let mut snapshot = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while snapshot.is_none() && Instant::now() < deadline {
        let before = lease_state().await;
        let mut gauges = Vec::new();
        for (name, _, addr) in &agents {
            let (_, body) = support::http_get(*addr, "/metrics").await.expect("metrics");
            let leader = metric(&body, "hcp_fleet_leader").unwrap_or(-1.0);
            let count = metric(&body, "hcp_fleet_reconcile_duration_seconds_count").unwrap_or(0.0);
            gauges.push((*name, leader, count));
        }
        let after = lease_state().await;
        last = format!("lease {before:?} then {after:?}, gauges {gauges:?}");
        match (before, after) {
            (Some(b), Some(a)) if a == b => snapshot = Some((a.0, a.1, gauges)),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let Some((holder, transitions, gauges)) = snapshot else {
        panic!("no consistent snapshot of the Lease and the agents: {last}");
    };
    for (name, leader, _) in &gauges {
        assert_eq!(
            *leader == 1.0,
            *name == holder,
            "{name}: leader={leader} holder={holder} ({last})"
        );
    }
    let (standby_name, _, standby_count) = *gauges
        .iter()
        .find(|(name, _, _)| *name != holder)
        .expect("a standby");
    assert!(
        gauges.iter().any(|(n, _, c)| *n == holder && *c > 0.0),
        "the leader reconciled: {gauges:?}"
    );
    if transitions == 0 {
        // The lease never changed hands, so the standby never led.
        assert_eq!(standby_count, 0.0, "the standby wrote nothing: {gauges:?}");
    }
    // And whatever it once did, a standby does nothing while it stands by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let standby_addr = agents
        .iter()
        .find(|(n, _, _)| *n == standby_name)
        .map(|(_, _, a)| *a)
        .expect("standby");
    let (_, body) = support::http_get(standby_addr, "/metrics")
        .await
        .expect("metrics");
    if lease_state().await.map(|l| l.0).as_deref() == Some(holder.as_str()) {
        assert_eq!(
            metric(&body, "hcp_fleet_reconcile_duration_seconds_count").unwrap_or(0.0),
            standby_count,
            "{standby_name} reconciled while standing by"
        );
    }

    // Kill the leader without letting it release the lease, then drift a hosted cluster.
    let idx = agents
        .iter()
        .position(|(n, _, _)| *n == holder)
        .expect("leader");
    let (_, leader, _) = agents.remove(idx);
    drop(leader);
    let killed = Instant::now();
    let vapi = delete_validating(&fleet, "hc-1").await;
    let bound = Duration::from_secs(lease_seconds + 10);
    eventually(
        "the standby took over and repaired the drift",
        bound,
        || present(&vapi),
    )
    .await;
    let takeover = killed.elapsed();
    let (standby, _child, addr) = agents.remove(0);
    let (_, body) = support::http_get(addr, "/metrics").await.expect("metrics");
    assert_eq!(
        metric(&body, "hcp_fleet_leader"),
        Some(1.0),
        "{standby} leads now"
    );
    let holder = leases
        .get("hcp-fleet-agent")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(standby));
    eprintln!(
        "leader killed -> drift repaired by the standby in {takeover:?} (lease {lease_seconds}s)"
    );
}

async fn leader_gauge(addr: std::net::SocketAddr) -> Option<f64> {
    let (_, body) = support::http_get(addr, "/metrics").await.ok()?;
    metric(&body, "hcp_fleet_leader")
}

/// Replicas that start at the same instant on a free Lease never both lead: the API server
/// refuses the later of two takes (each replica is its own field manager) instead of applying
/// it over the first, which would leave both leading until the loser's next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_never_both_lead() {
    use k8s_openapi::api::coordination::v1::Lease;
    let fleet = LocalFleet::start(FleetOptions::with_hosted(0))
        .await
        .expect("fleet");
    let mgmt = fleet.management.client().await.expect("client");
    let leases: Api<Lease> = Api::namespaced(mgmt.clone(), "default");
    let names = ["replica-a", "replica-b", "replica-c"];
    for round in 0..6 {
        let managers = futures::future::join_all(
            names.map(|n| agent::lease_manager(mgmt.clone(), "default", n, 10)),
        )
        .await;
        let watches = futures::future::join_all(
            managers
                .into_iter()
                .map(|m| m.expect("lease manager").watch()),
        )
        .await;
        // Long enough for every first take and its read-back; well short of the renewal
        // (half the 10 s lease) at which a replica leading by mistake would find out.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let holder = leases
            .get(agent::LEASE_NAME)
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity);
        let leading: Vec<&str> = names
            .iter()
            .zip(&watches)
            .filter(|(_, (rx, _))| *rx.borrow())
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(
            leading,
            holder.as_deref().into_iter().collect::<Vec<_>>(),
            "round {round}: who believes it leads, and the Lease's holder"
        );
        // Dropping a receiver releases the lease; then start again from no Lease at all.
        let tasks: Vec<_> = watches.into_iter().map(|(_, task)| task).collect();
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        leases
            .delete(agent::LEASE_NAME, &DeleteParams::default())
            .await
            .expect("delete the lease");
    }
}

/// A leader cut off from the API server (a black hole, not a refusal) hears nothing from
/// its lease manager; it must stop writing on its own before its lease can expire, so the
/// standby that takes over never writes beside it. Healed, it stays a standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_the_standby_takes_over() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let upstream: std::net::SocketAddr = fleet
        .management
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("management address");
    let relay = support::Relay::start(upstream).await;
    let dir = tempfile::tempdir().expect("tmp");
    let relayed = dir.path().join("relayed.kubeconfig");
    std::fs::write(
        &relayed,
        fleet
            .management
            .kubeconfig_yaml
            .replace(&fleet.management.url(), &format!("https://{}", relay.addr)),
    )
    .expect("kubeconfig");
    let lease_seconds = 10u64;
    let spawn = |name: &str, kubeconfig: &std::path::Path| {
        support::spawn_elected_agent(name, kubeconfig, AGENT_NS, Some(lease_seconds))
    };
    // A leads, through the relay; B waits, directly connected.
    let (_a, a_addr) = spawn("agent-a", &relayed);
    eventually("agent-a leads", Duration::from_secs(30), || async move {
        match leader_gauge(a_addr).await {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (_b, b_addr) = spawn("agent-b", &fleet.management.kubeconfig_path);
    wait_compliant(&mgmt, &["hc-1"]).await;
    assert_eq!(leader_gauge(b_addr).await, Some(0.0), "agent-b waits");

    let cut = Instant::now();
    relay.cut();
    let (mut a_stopped, mut b_leads) = (None, None);
    while (a_stopped.is_none() || b_leads.is_none())
        && cut.elapsed() < Duration::from_secs(lease_seconds * 3)
    {
        if a_stopped.is_none() && leader_gauge(a_addr).await == Some(0.0) {
            a_stopped = Some(cut.elapsed());
        }
        if b_leads.is_none() && leader_gauge(b_addr).await == Some(1.0) {
            b_leads = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a_stopped = a_stopped.expect("the partitioned leader stopped writing");
    let b_leads = b_leads.expect("the standby took over");
    eprintln!(
        "partition: leader stopped after {a_stopped:?}, standby led after {b_leads:?} (lease {lease_seconds}s)"
    );
    assert!(
        a_stopped < Duration::from_secs(lease_seconds),
        "stopped within the lease duration: {a_stopped:?}"
    );
    assert!(
        a_stopped < b_leads,
        "the old leader stopped ({a_stopped:?}) before the standby led ({b_leads:?})"
    );
    let (_, body) = support::http_get(a_addr, "/metrics")
        .await
        .expect("metrics");
    assert!(
        !body.contains("hcp_fleet_hosted_cluster_compliance{"),
        "a replica that stopped leading reports no stale verdicts:\n{body}"
    );

    // The new leader repairs drift; the old one, healed, stays a standby.
    let vapi = delete_validating(&fleet, "hc-1").await;
    eventually(
        "agent-b repaired the drift",
        Duration::from_secs(20),
        || present(&vapi),
    )
    .await;
    relay.heal();
    tokio::time::sleep(Duration::from_secs(lease_seconds)).await;
    assert_eq!(
        leader_gauge(a_addr).await,
        Some(0.0),
        "agent-a stays a standby"
    );
    assert_eq!(leader_gauge(b_addr).await, Some(1.0), "agent-b leads");
    let holder =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(mgmt.clone(), AGENT_NS)
            .get("hcp-fleet-agent")
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("agent-b"));
}

/// Pausing one HCP: the agent leaves it alone (drift stays unrepaired) and its health record
/// says Pending with the reason; removing the annotation resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_hcp_is_left_alone_and_resumes() {
    use hcp_fleet_agent::crd::HostedControlPlane;
    use hcp_fleet_agent::crd::hostedcontrolplane::PAUSE_ANNOTATION;
    use kube::api::{Patch, PatchParams};
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let _agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let ns = hcp_namespace("hc-1");
    let hcps: Api<HostedControlPlane> = Api::namespaced(mgmt.clone(), &ns);
    let patch = |body: serde_json::Value| {
        let hcps = hcps.clone();
        async move {
            hcps.patch("hc-1", &PatchParams::default(), &Patch::Merge(body))
                .await
                .expect("patch the HCP")
        }
    };
    // The agent's annotation, then HyperShift's own spec.pausedUntil: each pauses it alike.
    let ways = [
        (
            serde_json::json!({"metadata": {"annotations": {PAUSE_ANNOTATION: "true"}}}),
            serde_json::json!({"metadata": {"annotations": {PAUSE_ANNOTATION: null}}}),
            "paused by hcp-fleet.openshift.io/paused",
        ),
        (
            serde_json::json!({"spec": {"pausedUntil": "true"}}),
            serde_json::json!({"spec": {"pausedUntil": null}}),
            "paused by spec.pausedUntil",
        ),
    ];
    for (pause, resume, reason) in ways {
        patch(pause).await;
        eventually(reason, Duration::from_secs(20), || {
            let mgmt = mgmt.clone();
            let ns = ns.clone();
            async move {
                let p = health(&mgmt, &ns).await?;
                let h = history_messages(&p, "hosted-webhooks");
                match (compliant(&p), h.first()) {
                    (Some("Pending"), Some(m)) if m.contains(reason) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await;
        let vapi = delete_validating(&fleet, "hc-1").await;
        // A repair takes well under a second when not paused (drift test above); give it
        // ten times that and see nothing come back.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            vapi.get_opt(VALIDATING_NAME).await.expect("get").is_none(),
            "{reason}: a paused HCP's drift is left alone"
        );
        patch(resume).await;
        eventually(
            "resumed: the webhook is back",
            Duration::from_secs(30),
            || present(&vapi),
        )
        .await;
        wait_compliant(&mgmt, &["hc-1"]).await;
    }
}

/// Removing the agent cleanly: `uninstall` refuses while an agent leads; then removes the
/// hosted webhooks before the admission services, keeps both for a hosted cluster it cannot
/// reach (and fails, so it can be run again), and removes the roll-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_removes_webhooks_first_and_keeps_what_it_cannot_reach() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::PostParams;
    let (mut fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    let agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    let kubeconfig = fleet.management.kubeconfig_path.clone();
    // The test bed's configuration: uninstall talks only to the API servers it allows.
    let config = kubeconfig.with_file_name("uninstall-config.yaml");
    std::fs::write(&config, hcp_fleet_agent::localcp::agent_config_yaml()).expect("config");
    let uninstall = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-agent"))
            .args(["uninstall", "--namespace", AGENT_NS, "--config"])
            .arg(&config)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("uninstall")
    };

    // An agent that still leads would put everything back: refused, nothing touched.
    let leases: Api<Lease> = Api::namespaced(mgmt.clone(), AGENT_NS);
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hcp-fleet-agent"},
        "spec": {
            "holderIdentity": "agent-x",
            "leaseDurationSeconds": 60,
            "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string(),
        },
    }))
    .expect("lease");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease");
    let out = uninstall();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent-x still holds the Lease"));
    let hc1 = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("hc-1");
    let vapi = Api::<ValidatingWebhookConfiguration>::all(hc1.clone());
    assert!(vapi.get_opt(VALIDATING_NAME).await.expect("get").is_some());
    leases
        .delete("hcp-fleet-agent", &DeleteParams::default())
        .await
        .expect("lease gone");

    // The agent is gone, and hc-2's API server is down.
    drop(agent);
    fleet.hosted_mut("hc-2").expect("hc-2").stop();
    let out = uninstall();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "clusters-hc-1: removed {} hosted object(s)",
            support::default_hosted_objects(fleet.version.serves(Feature::AdmissionPolicies))
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("error: clusters-hc-2: hosted cluster"),
        "{stdout}"
    );
    assert_eq!(support::owned_hosted_objects(&hc1).await, 0);
    let ns1 = hcp_namespace("hc-1");
    let ns2 = hcp_namespace("hc-2");
    let deployments = |ns: &str| Api::<Deployment>::namespaced(mgmt.clone(), ns);
    assert!(
        deployments(&ns1)
            .get_opt("hcp-fleet-admission")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        Api::<Secret>::namespaced(mgmt.clone(), &ns1)
            .get_opt("hcp-fleet-admission-tls")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        Api::<AdmissionHealth>::namespaced(mgmt.clone(), &ns1)
            .get_opt(HEALTH_NAME)
            .await
            .expect("get")
            .is_none()
    );
    // The unreachable cluster's webhooks still point at its admission service: kept.
    assert!(
        deployments(&ns2)
            .get_opt("hcp-fleet-admission")
            .await
            .expect("get")
            .is_some()
    );
}

/// Every object of the admission service on the management side is watched: deleted or
/// edited by someone else, it is back as rendered within a second, and counted as drift on
/// the metric and in the health record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_objects_deleted_or_edited_come_back_within_a_second() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
    let (_fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let ns = "clusters-hc-1";
    let svc = "hcp-fleet-admission";
    let caps = hcp_fleet_agent::controller::discover(&mgmt).await;
    let mut objects: Vec<(&str, ApiResource, String)> = vec![
        (
            "Secret",
            ApiResource::erase::<Secret>(&()),
            format!("{svc}-ca"),
        ),
        (
            "Secret",
            ApiResource::erase::<Secret>(&()),
            format!("{svc}-tls"),
        ),
        ("Service", ApiResource::erase::<Service>(&()), svc.into()),
        (
            "NetworkPolicy",
            ApiResource::erase::<NetworkPolicy>(&()),
            svc.into(),
        ),
        (
            "ServiceAccount",
            ApiResource::erase::<ServiceAccount>(&()),
            svc.into(),
        ),
    ];
    let pdb = caps
        .pdb_api
        .api_resource()
        .expect("both versions serve a PDB API");
    objects.push(("PodDisruptionBudget", pdb, svc.into()));
    let drift_of = |kind: &str| {
        let needle = format!(
            "hcp_fleet_management_drift_total{{hcp_namespace=\"{ns}\",hosted_cluster=\"hc-1\",kind=\"{kind}\"}}"
        );
        metric(&agent.context.metrics.encode(), &needle).unwrap_or(0.0)
    };
    // Counted by the reconcile that repaired it, just after its write: the repaired object
    // can be seen a moment before the counter moves.
    let drift_counted = |what: &str, kind: &'static str, counted: f64| {
        let what = what.to_string();
        let drift_of = &drift_of;
        async move {
            eventually(&what, Duration::from_secs(5), || {
                let now = drift_of(kind);
                async move {
                    if now > counted {
                        Ok(())
                    } else {
                        Err(format!("{now}"))
                    }
                }
            })
            .await
        }
    };
    let mut took = Vec::new();
    for (kind, ar, name) in &objects {
        let api = Api::<DynamicObject>::namespaced_with(mgmt.clone(), ns, ar);
        let before = api.get(name).await.expect("in place").uid();
        let counted = drift_of(kind);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        let t0 = Instant::now();
        eventually(
            &format!("{kind} {name} recreated"),
            Duration::from_secs(10),
            || {
                let api = api.clone();
                let before = before.clone();
                async move {
                    match api.get_opt(name).await {
                        Ok(Some(o)) if o.uid() != before => Ok(()),
                        other => Err(format!("{:?}", other.map(|o| o.map(|o| o.uid())))),
                    }
                }
            },
        )
        .await;
        let back = t0.elapsed();
        assert!(
            back < Duration::from_secs(1),
            "{kind} {name} back after {back:?}"
        );
        drift_counted(&format!("{kind} drift counted"), kind, counted).await;
        took.push(format!("{kind}/{name} {back:?}"));
    }
    // An edit, not a deletion: the NetworkPolicy opened to everyone is closed again.
    let np = Api::<NetworkPolicy>::namespaced(mgmt.clone(), ns);
    let counted = drift_of("NetworkPolicy");
    let open = serde_json::json!({"spec": {"ingress": [{}]}});
    np.patch(svc, &PatchParams::default(), &Patch::Merge(&open))
        .await
        .expect("edit");
    let t0 = Instant::now();
    eventually("NetworkPolicy restored", Duration::from_secs(10), || {
        let np = np.clone();
        async move {
            let p = np.get(svc).await.map_err(|e| e.to_string())?;
            let from = p
                .spec
                .and_then(|s| s.ingress)
                .and_then(|i| i.first().and_then(|r| r.from.clone()));
            if from.is_some_and(|f| !f.is_empty()) {
                Ok(())
            } else {
                Err("still open".into())
            }
        }
    })
    .await;
    let back = t0.elapsed();
    assert!(
        back < Duration::from_secs(1),
        "NetworkPolicy restored after {back:?}"
    );
    took.push(format!("NetworkPolicy edit {back:?}"));
    drift_counted("the edit counts as drift", "NetworkPolicy", counted).await;
    // Its spec is the agent's whole: an egress section another manager adds beside the
    // rendered ingress is removed as fast as a changed rule.
    let counted = drift_of("NetworkPolicy");
    let beside =
        serde_json::json!({"spec": {"egress": [{}], "policyTypes": ["Ingress", "Egress"]}});
    let pp = PatchParams {
        field_manager: Some("someone-else".into()),
        ..Default::default()
    };
    np.patch(svc, &pp, &Patch::Merge(&beside))
        .await
        .expect("add egress");
    let t0 = Instant::now();
    eventually(
        "the egress section removed",
        Duration::from_secs(10),
        || {
            let np = np.clone();
            async move {
                let p = np.get(svc).await.map_err(|e| e.to_string())?;
                match p.spec.and_then(|s| s.egress) {
                    None => Ok(()),
                    Some(e) => Err(format!("egress still there: {e:?}")),
                }
            }
        },
    )
    .await;
    let back = t0.elapsed();
    assert!(
        back < Duration::from_secs(1),
        "an egress section removed after {back:?}"
    );
    took.push(format!("NetworkPolicy egress added {back:?}"));
    drift_counted(
        "the egress section counts as drift",
        "NetworkPolicy",
        counted,
    )
    .await;
    // The Deployment's pods' spec is the agent's whole: a field it does not render, added by
    // someone else, is removed as fast as a changed one.
    let deployments = Api::<Deployment>::namespaced(mgmt.clone(), ns);
    for (what, patch) in [
        (
            "hostNetwork",
            serde_json::json!({"spec": {"template": {"spec": {"hostNetwork": true}}}}),
        ),
        (
            "an initContainer",
            serde_json::json!({"spec": {"template": {"spec": {"initContainers": [
                {"name": "sneaky", "image": "registry.example.com/sneaky:1"}
            ]}}}}),
        ),
    ] {
        let counted = drift_of("Deployment");
        let pp = PatchParams {
            field_manager: Some("someone-else".into()),
            ..Default::default()
        };
        deployments
            .patch(svc, &pp, &Patch::Strategic(&patch))
            .await
            .expect(what);
        let t0 = Instant::now();
        eventually(
            &format!("{what} removed from the Deployment"),
            Duration::from_secs(10),
            || {
                let deployments = deployments.clone();
                async move {
                    let d = deployments.get(svc).await.map_err(|e| e.to_string())?;
                    let pod = d.spec.and_then(|s| s.template.spec).unwrap_or_default();
                    if pod.host_network != Some(true)
                        && pod.init_containers.as_ref().is_none_or(|c| c.is_empty())
                    {
                        Ok(())
                    } else {
                        Err(format!(
                            "hostNetwork {:?}, initContainers {:?}",
                            pod.host_network,
                            pod.init_containers.map(|c| c.len())
                        ))
                    }
                }
            },
        )
        .await;
        let back = t0.elapsed();
        assert!(
            back < Duration::from_secs(1),
            "{what} removed after {back:?}"
        );
        took.push(format!("Deployment {what} {back:?}"));
        drift_counted(&format!("{what} counts as drift"), "Deployment", counted).await;
    }
    // The HCP ends Compliant with its (new) certificate in the hosted cluster.
    wait_compliant(&mgmt, &["hc-1"]).await;
    eprintln!("management drift repaired: {}", took.join(", "));
}

/// Admission metrics reach the monitoring OpenShift runs on a management cluster. The test
/// plays a Prometheus that, like OpenShift's user-workload one, reads a ServiceMonitor only in
/// its own namespace and refuses file references: from the monitor alone it finds the Service,
/// its pods, the CA and the name to verify, and scrapes each replica over verified TLS. The
/// platform Prometheus's RoleBinding is there; both objects are repaired when deleted; moving
/// to the Observability Operator's API group moves the monitor, and `none` removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_admission_service_is_scraped_from_its_own_namespace_over_verified_tls() {
    use hcp_fleet_agent::config::MonitoringApi;
    use hcp_fleet_agent::localcp::kubelet::LOCAL_REPLICAS_ANNOTATION;
    use hcp_fleet_agent::management::{
        METRICS_READER_ROLE, PLATFORM_PROMETHEUS, service_monitor_resource,
    };
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::api::{DynamicObject, ListParams};
    let (_fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    support::install_monitoring_crds(&mgmt).await;
    let agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let ns = "clusters-hc-1";
    let svc = "hcp-fleet-admission";
    let monitors = |api: MonitoringApi| {
        let ar = service_monitor_resource(api).expect("a group");
        Api::<DynamicObject>::namespaced_with(mgmt.clone(), ns, &ar)
    };
    let coreos = monitors(MonitoringApi::Coreos);
    let rhobs = monitors(MonitoringApi::Rhobs);
    let bindings = Api::<RoleBinding>::namespaced(mgmt.clone(), ns);

    // Prometheus's view: the monitor, and nothing but what it names.
    let sm = coreos.get(svc).await.expect("the ServiceMonitor");
    let spec = &sm.data["spec"];
    assert!(spec.get("namespaceSelector").is_none(), "{spec}");
    let selector = spec["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    let found = Api::<Service>::namespaced(mgmt.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("services");
    assert_eq!(found.items.len(), 1, "the selector names one Service");
    let service = &found.items[0];
    let ep = &spec["endpoints"][0];
    let port_name = ep["port"].as_str().expect("port");
    assert!(
        service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .is_some_and(|ps| ps.iter().any(|p| p.name.as_deref() == Some(port_name))),
        "the Service has the port {port_name}"
    );
    assert_eq!(ep["scheme"], "https");
    let tls = &ep["tlsConfig"];
    assert!(tls.get("insecureSkipVerify").is_none(), "{tls}");
    let secret_name = tls["ca"]["secret"]["name"].as_str().expect("CA secret");
    let key = tls["ca"]["secret"]["key"].as_str().expect("CA key");
    let server_name = tls["serverName"].as_str().expect("serverName");
    let ca = Api::<Secret>::namespaced(mgmt.clone(), ns)
        .get(secret_name)
        .await
        .expect("the CA Secret")
        .data
        .and_then(|d| {
            d.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        })
        .expect("the CA key");
    // The pods behind the Service (the test bed's EndpointSlice).
    let replicas: Vec<std::net::SocketAddr> = service
        .annotations()
        .get(LOCAL_REPLICAS_ANNOTATION)
        .expect("ready replicas")
        .split(',')
        .filter_map(|a| a.parse().ok())
        .collect();
    assert!(!replicas.is_empty());
    let path = ep["path"].as_str().expect("path");
    let mut scraped = String::new();
    for addr in &replicas {
        let (code, body) = kubelet::https_get_as(addr.port(), &ca, server_name, path)
            .await
            .unwrap_or_else(|e| panic!("scraping {addr} as {server_name}: {e}"));
        assert_eq!(code, 200, "{body}");
        assert!(body.trim_end().ends_with("# EOF"), "{addr}: {body}");
        scraped.push_str(&body);
    }
    // The probe that made the HCP Compliant went through one of them.
    assert!(
        scraped.contains("hcp_fleet_admission_requests_total{"),
        "{scraped}"
    );
    // Verification is real: the same pods under another name are refused.
    let wrong = format!("{svc}.clusters-other.svc");
    assert!(
        kubelet::https_get_as(replicas[0].port(), &ca, &wrong, path)
            .await
            .is_err(),
        "a certificate for {server_name} must not pass as {wrong}"
    );

    let rb = bindings
        .get(&format!("{svc}-prometheus"))
        .await
        .expect("the platform Prometheus's RoleBinding");
    assert_eq!(rb.role_ref.name, METRICS_READER_ROLE);
    let subject = &rb.subjects.expect("subjects")[0];
    assert_eq!(
        (subject.namespace.as_deref(), subject.name.as_str()),
        (Some(PLATFORM_PROMETHEUS.0), PLATFORM_PROMETHEUS.1)
    );

    // Deleted by someone else: back, and counted.
    let recreated = |what: &'static str, api: Api<DynamicObject>, name: String| async move {
        let before = api.get(&name).await.expect("in place").uid();
        api.delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        eventually(what, Duration::from_secs(10), || {
            let api = api.clone();
            let (name, before) = (name.clone(), before.clone());
            async move {
                match api.get_opt(&name).await {
                    Ok(Some(o)) if o.uid() != before => Ok(()),
                    other => Err(format!("{:?}", other.map(|o| o.map(|o| o.uid())))),
                }
            }
        })
        .await;
    };
    let rb_ar = kube::api::ApiResource::erase::<RoleBinding>(&());
    recreated(
        "RoleBinding recreated",
        Api::<DynamicObject>::namespaced_with(mgmt.clone(), ns, &rb_ar),
        format!("{svc}-prometheus"),
    )
    .await;
    recreated("ServiceMonitor recreated", coreos.clone(), svc.into()).await;
    for kind in ["ServiceMonitor", "RoleBinding"] {
        let needle = format!(
            "hcp_fleet_management_drift_total{{hcp_namespace=\"{ns}\",hosted_cluster=\"hc-1\",kind=\"{kind}\"}}"
        );
        eventually(
            &format!("{kind} drift counted"),
            Duration::from_secs(5),
            || {
                let n = metric(&agent.context.metrics.encode(), &needle).unwrap_or(0.0);
                async move {
                    if n >= 1.0 {
                        Ok(())
                    } else {
                        Err(format!("{n}"))
                    }
                }
            },
        )
        .await;
    }

    // The Observability Operator's group instead: the monitor moves; the platform
    // Prometheus (which reads only monitoring.coreos.com) loses its binding.
    let mut cfg = hcp_fleet_agent::localcp::allow_loopback(AgentConfig::default());
    cfg.admission.service_monitor.api_group = MonitoringApi::Rhobs;
    agent.set_config(cfg.clone());
    eventually(
        "the monitor moved to monitoring.rhobs",
        Duration::from_secs(30),
        || {
            let (coreos, rhobs, bindings) = (coreos.clone(), rhobs.clone(), bindings.clone());
            async move {
                let old = coreos.get_opt(svc).await.map_err(|e| e.to_string())?;
                let new = rhobs.get_opt(svc).await.map_err(|e| e.to_string())?;
                let rb = bindings
                    .get_opt(&format!("{svc}-prometheus"))
                    .await
                    .map_err(|e| e.to_string())?;
                match (old, new, rb) {
                    (None, Some(n), None)
                        if n.data["spec"]["endpoints"][0]["tlsConfig"]["serverName"]
                            == server_name =>
                    {
                        Ok(())
                    }
                    (o, n, rb) => Err(format!(
                        "coreos {} rhobs {} binding {}",
                        o.is_some(),
                        n.is_some(),
                        rb.is_some()
                    )),
                }
            }
        },
    )
    .await;
    cfg.admission.service_monitor.api_group = MonitoringApi::None;
    agent.set_config(cfg);
    eventually(
        "no monitor with apiGroup none",
        Duration::from_secs(30),
        || {
            let (coreos, rhobs) = (coreos.clone(), rhobs.clone());
            async move {
                let a = coreos.get_opt(svc).await.map_err(|e| e.to_string())?;
                let b = rhobs.get_opt(svc).await.map_err(|e| e.to_string())?;
                if a.is_none() && b.is_none() {
                    Ok(())
                } else {
                    Err(format!("{} {}", a.is_some(), b.is_some()))
                }
            }
        },
    )
    .await;
    wait_compliant(&mgmt, &["hc-1"]).await;
}

/// No confused deputy: a kubeconfig naming the management cluster itself, one naming a hosted
/// cluster another HCP namespace already holds, and one naming a server outside the allow-list
/// are each refused with the reason, and nothing is written where they point. The claim is
/// recorded in the hosted cluster, so a restarted agent refuses the same namespace again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_cluster_a_claimed_cluster_and_a_foreign_server_are_refused() {
    use hcp_fleet_agent::hosted::webhooks::CLAIM_ANNOTATION;
    use hcp_fleet_agent::localcp::fixtures::create_hcp;
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let hc1 = fleet.hosted("hc-1").expect("hc-1");
    // The management cluster's own kubeconfig (admin credentials, a loopback server the test
    // bed allows: only its identity gives it away).
    create_hcp(&mgmt, "deputy", &fleet.management.kubeconfig_yaml)
        .await
        .expect("deputy");
    // hc-1's kubeconfig again, in a second namespace.
    create_hcp(&mgmt, "twin", &hc1.kubeconfig_yaml)
        .await
        .expect("twin");
    // The same cluster under a name the allow-list does not hold.
    let foreign = hc1
        .kubeconfig_yaml
        .replace("https://127.0.0.1:", "https://localhost:");
    assert_ne!(foreign, hc1.kubeconfig_yaml);
    // (A long name, too: `status` must keep its columns in line.)
    let foreign_name = "foreign-hosted-cluster-with-a-long-name-of-46";
    create_hcp(&mgmt, foreign_name, &foreign)
        .await
        .expect("foreign");
    let verdicts = [
        ("clusters-deputy", "names the management cluster itself"),
        (
            "clusters-twin",
            "already claimed by HCP namespace clusters-hc-1",
        ),
        (
            "clusters-foreign-hosted-cluster-with-a-long-name-of-46",
            "is not allowed (hostedAccess.allowedServers",
        ),
    ];
    for (ns, why) in verdicts {
        wait_verdict(&mgmt, ns, "hosted-webhooks", "NonCompliant", why).await;
    }
    let claim_of_hc1 = || async {
        let hosted = hc1.client().await.expect("hc-1 client");
        Api::<ValidatingWebhookConfiguration>::all(hosted)
            .get(VALIDATING_NAME)
            .await
            .expect("hc-1's configuration")
            .annotations()
            .get(CLAIM_ANNOTATION)
            .cloned()
    };
    let claim = claim_of_hc1().await.expect("claimed");
    assert!(claim.ends_with("/clusters-hc-1"), "{claim}");
    let assert_management_untouched = || async {
        let v = Api::<ValidatingWebhookConfiguration>::all(mgmt.clone())
            .list(&Default::default())
            .await
            .expect("list");
        let m = Api::<MutatingWebhookConfiguration>::all(mgmt.clone())
            .list(&Default::default())
            .await
            .expect("list");
        let names: Vec<String> = v
            .items
            .iter()
            .map(|o| o.name_any())
            .chain(m.items.iter().map(|o| o.name_any()))
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with("hcp-fleet")),
            "the management cluster got the fleet's webhooks: {names:?}"
        );
    };
    assert_management_untouched().await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    // `status` at this size: every row's columns start where the header's do.
    let table = status_table(&fleet);
    let starts = |l: &str| -> Vec<usize> {
        let b = l.as_bytes();
        (0..b.len())
            .filter(|&i| b[i] != b' ' && (i == 0 || (i >= 2 && &b[i - 2..i] == b"  ")))
            .collect()
    };
    let mut lines = table.lines().filter(|l| !l.trim().is_empty());
    let header = starts(lines.next().expect("header"));
    let mut rows: Vec<&str> = lines.collect();
    // The last line counts the fleet.
    assert_eq!(
        rows.pop(),
        Some("4 hosted cluster(s): 1 Compliant, 3 NonCompliant, 0 Pending"),
        "{table}"
    );
    assert_eq!(rows.len(), 4, "{table}");
    assert!(rows.iter().any(|r| r.starts_with(foreign_name)), "{table}");
    for r in &rows {
        assert_eq!(starts(r)[..2], header[..2], "out of line:\n{table}");
    }

    // A restarted agent finds the claim where it left it: the twin is refused again (had it
    // been first in line this time, it would otherwise have taken hc-1).
    drop(agent);
    for (ns, _) in verdicts {
        Api::<AdmissionHealth>::namespaced(mgmt.clone(), ns)
            .delete(HEALTH_NAME, &DeleteParams::default())
            .await
            .expect("delete the old verdict");
    }
    let agent = start_agent(&mgmt).await;
    for (ns, why) in verdicts {
        wait_verdict(&mgmt, ns, "hosted-webhooks", "NonCompliant", why).await;
    }
    wait_compliant(&mgmt, &["hc-1"]).await;
    assert_eq!(claim_of_hc1().await, Some(claim));
    assert_management_untouched().await;
    drop(agent);
}

/// A hosted kube-apiserver that hangs (SIGSTOP: connections stay open, nothing answers) is
/// reported NonCompliant within 20 s, from the HTTP/2 keepalive on the connection the agent
/// already holds, while another cluster's drift is still repaired at its usual speed; after
/// SIGCONT it is Compliant again within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_hosted_api_server_is_reported_within_twenty_seconds() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    let agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    let pid = fleet.hosted("hc-2").expect("hc-2").pid().expect("pid");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    // Resumed whatever happens below, so a failed assertion leaves no frozen process.
    struct Resume(u32);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.0.to_string()])
                .status();
        }
    }
    let requests_before = metric(
        &agent.context.metrics.encode(),
        "hcp_fleet_hosted_api_requests_total{hcp_namespace=\"clusters-hc-2\",hosted_cluster=\"hc-2\"}",
    );
    signal("-STOP");
    let _resume = Resume(pid);
    let stopped = Instant::now();

    // Meanwhile hc-1 is repaired as fast as ever.
    let vapi = delete_validating(&fleet, "hc-1").await;
    let t0 = Instant::now();
    eventually(
        "hc-1 repaired during the hang",
        Duration::from_secs(10),
        || present(&vapi),
    )
    .await;
    let hc1_repair = t0.elapsed();
    assert!(
        hc1_repair < Duration::from_secs(2),
        "hc-1 repaired in {hc1_repair:?}"
    );

    eventually("hc-2 NonCompliant", Duration::from_secs(30), || {
        let mgmt = mgmt.clone();
        async move {
            let p = health(&mgmt, "clusters-hc-2").await?;
            match compliant(&p) {
                Some("NonCompliant") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let detected = stopped.elapsed();
    assert!(
        detected <= Duration::from_secs(20),
        "a hung hosted API server reported after {detected:?}"
    );
    let p = health(&mgmt, "clusters-hc-2").await.expect("health");
    let h = history_messages(&p, "hosted-webhooks");
    // Said of hc-2's server: at once from the dropped connection ("stopped answering"), or,
    // when a request was already on its way, that request's failure.
    let server = fleet.hosted("hc-2").expect("hc-2").url();
    assert!(
        h.first()
            .is_some_and(|m| m.starts_with("NonCompliant") && m.contains(&server)),
        "{h:?}"
    );
    let requests_during = metric(
        &agent.context.metrics.encode(),
        "hcp_fleet_hosted_api_requests_total{hcp_namespace=\"clusters-hc-2\",hosted_cluster=\"hc-2\"}",
    );

    // Seen from the connection the agent already held: at most the watch's own retry and a
    // recovery check went out meanwhile, not a poll.
    let (Some(before), Some(during)) = (requests_before, requests_during) else {
        panic!("hc-2's request counter: {requests_before:?} {requests_during:?}");
    };
    assert!(during - before <= 3.0, "{before} -> {during} requests");

    signal("-CONT");
    let resumed = Instant::now();
    wait_compliant(&mgmt, &["hc-2"]).await;
    let recovered = resumed.elapsed();
    assert!(
        recovered <= Duration::from_secs(10),
        "recovered {recovered:?} after SIGCONT"
    );
    wait_compliant(&mgmt, &["hc-1"]).await;
    eprintln!(
        "hung hosted kube-apiserver: NonCompliant after {detected:?}, Compliant {recovered:?} after SIGCONT; hc-1 repaired in {hc1_repair:?} meanwhile; hc-2 requests {requests_before:?} -> {requests_during:?} during the hang"
    );
}

/// Two hosted clusters with real admission services, and ACM's own Policy CRD where the asset
/// script provided it (else the repository's).
async fn fleet_with_acm() -> (hcp_fleet_agent::localcp::LocalFleet, Client, support::Pods) {
    let (fleet, mgmt, pods) = support::fleet_with_pods(2).await;
    if let Some(acm) = fleet.upstream_crd(hcp_fleet_agent::localcp::assets::UPSTREAM_POLICY_CRD) {
        hcp_fleet_agent::localcp::fixtures::install_crd_manifests(
            &mgmt,
            [("policies.policy.open-cluster-management.io", acm.as_str())],
        )
        .await
        .expect("ACM's Policy CRD");
    }
    (fleet, mgmt, pods)
}

/// The hub objects `make policies` writes (policies/policy.yaml).
fn hub_objects() -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/policies/policy.yaml"))
            .expect("policies/policy.yaml");
    serde_saphyr::from_str_multiple(&text).expect("yaml")
}

/// The metadata of the propagator's replica of root Policy `root_name` (`<namespace>.<name>`)
/// in namespace `ns`, for managed cluster `cluster`.
fn replica_metadata(root_name: &str, ns: &str, cluster: &str) -> serde_json::Value {
    serde_json::json!({
        "name": root_name,
        "namespace": ns,
        "labels": {
            "policy.open-cluster-management.io/root-policy": root_name,
            "policy.open-cluster-management.io/cluster-name": cluster,
            "policy.open-cluster-management.io/cluster-namespace": cluster,
        },
    })
}

/// The owner references template-sync gives a template: its replicated Policy.
fn owned_by(policy: &str, uid: &str) -> serde_json::Value {
    serde_json::json!([{
        "apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
        "name": policy, "uid": uid, "controller": true, "blockOwnerDeletion": true,
    }])
}

/// What ACM's framework addon does on the managed cluster, step by step, on ACM's own Policy
/// CRD (where the asset script provided it): the fleet Policy of `policies/` replicated into
/// the cluster's namespace, its `AdmissionHealthPolicy` template created next to it
/// (template-sync), and the Policy's status computed from the compliance Events found there
/// (status-sync: governance-policy-framework-addon, `controllers/statussync/
/// policy_status_sync.go`, `getEventsInCluster`, `mergeDetails`, `parseComplianceFromMessage`).
/// The agent writes no Policy of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acm_reads_the_fleet_verdict_from_events_on_the_replicated_policy() {
    let (mut fleet, mgmt, _pods) = fleet_with_acm().await;
    // Template-sync syncs only kinds whose CRD carries this label (hasPolicyTemplateLabel).
    let crd = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(mgmt.clone())
        .get("admissionhealthpolicies.hcp-fleet.openshift.io")
        .await
        .expect("template CRD");
    assert_eq!(
        crd.labels()
            .get("policy.open-cluster-management.io/policy-type")
            .map(String::as_str),
        Some("template")
    );
    // What an earlier release wrote outside ACM's flow: removed when the agent starts.
    for (ns, name) in [
        ("clusters-hc-1", "hcp-fleet-admission"),
        (AGENT_NS, "hcp-fleet-rollup"),
    ] {
        let legacy: Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"app.kubernetes.io/managed-by": "hcp-fleet-agent"}},
            "spec": {"disabled": false, "policy-templates": []},
        }))
        .expect("legacy Policy");
        Api::<Policy>::namespaced(mgmt.clone(), ns)
            .create(&Default::default(), &legacy)
            .await
            .expect("create legacy Policy");
    }
    let _agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;

    // The propagator's replica of the fleet Policy, in the managed cluster's namespace.
    let cluster_ns = "local-cluster";
    hcp_fleet_agent::localcp::fixtures::ensure_namespace(&mgmt, cluster_ns, Default::default())
        .await
        .expect("cluster namespace");
    let docs = hub_objects();
    let root = docs
        .iter()
        .find(|d| d["kind"] == "Policy")
        .expect("the fleet Policy");
    let root_name = format!(
        "{}.{}",
        root["metadata"]["namespace"].as_str().expect("ns"),
        root["metadata"]["name"].as_str().expect("name")
    );
    let mut replica = root.clone();
    replica["metadata"] = replica_metadata(&root_name, cluster_ns, cluster_ns);
    let policies: Api<Policy> = Api::namespaced(mgmt.clone(), cluster_ns);
    let replica: Policy = policies
        .create(
            &Default::default(),
            &serde_json::from_value(replica).expect("typed Policy"),
        )
        .await
        .expect("replicated Policy");
    let uid = replica.uid().expect("uid");

    // Template-sync: the template of the agent's kind, owned by the replicated Policy.
    let mut template = replica.spec.policy_templates[1].object_definition.clone();
    assert_eq!(template["kind"], "AdmissionHealthPolicy");
    let template_name = template["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    template["metadata"]["namespace"] = cluster_ns.into();
    template["metadata"]["ownerReferences"] = owned_by(&root_name, &uid);
    // The Policy leaves each template its own remediationAction (ACM would copy a Policy-level
    // one onto the agent's report-only template). A Policy written by hand may say `Enforce`
    // and `High`, in ACM's capitalised forms, which its CRDs take: so must the template's (D4).
    assert!(
        root["spec"].get("remediationAction").is_none(),
        "{}",
        root["spec"]
    );
    assert_eq!(template["spec"]["remediationAction"], "inform");
    template["spec"]["remediationAction"] = "Enforce".into();
    template["spec"]["severity"] = "High".into();
    let templates = Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), cluster_ns);
    templates
        .create(
            &Default::default(),
            &serde_json::from_value(template.clone()).expect("typed template"),
        )
        .await
        .expect("a template saying Enforce and High");

    let reason = format!("policy: {cluster_ns}/{template_name}");
    let synced = |want: &'static str, needle: &'static str| {
        let mgmt = mgmt.clone();
        let policies = policies.clone();
        let root_name = root_name.clone();
        let template_name = template_name.clone();
        let reason = reason.clone();
        let uid = uid.clone();
        async move {
            eventually(
                &format!("status sync says {want}"),
                Duration::from_secs(20),
                || {
                    let mgmt = mgmt.clone();
                    let policies = policies.clone();
                    let root_name = root_name.clone();
                    let template_name = template_name.clone();
                    let reason = reason.clone();
                    let uid = uid.clone();
                    async move {
                        let p = policies.get(&root_name).await.map_err(|e| e.to_string())?;
                        let status = status_sync(&mgmt, &p).await?;
                        // Written through the status subresource: ACM's schema must take it.
                        policies
                            .patch_status(
                                &root_name,
                                &Default::default(),
                                &kube::api::Patch::Merge(serde_json::json!({"status": status})),
                            )
                            .await
                            .map_err(|e| format!("ACM's schema refused the status: {e}"))?;
                        let d = status
                            .details
                            .iter()
                            .find(|d| d.template_meta.name == template_name)
                            .ok_or("no details for the template")?;
                        let newest = d
                            .history
                            .first()
                            .map(|h| h.message.clone())
                            .unwrap_or_default();
                        let ok = d.compliant.as_deref() == Some(want) && newest.contains(needle);
                        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(
                            mgmt.clone(),
                            "local-cluster",
                        )
                        .list(&Default::default())
                        .await
                        .map_err(|e| e.to_string())?;
                        let ours = events
                            .items
                            .iter()
                            .filter(|e| {
                                e.reason.as_deref() == Some(reason.as_str())
                                    && e.involved_object.uid.as_deref() == Some(uid.as_str())
                            })
                            .count();
                        if ok {
                            Ok(())
                        } else {
                            Err(format!(
                                "{:?} {newest:?} ({ours} compliance events)",
                                d.compliant
                            ))
                        }
                    }
                },
            )
            .await;
            let p = policies.get(&root_name).await.expect("Policy");
            let status = status_sync(&mgmt, &p).await.expect("status sync");
            status
                .details
                .into_iter()
                .find(|d| d.template_meta.name == template_name)
                .map(|d| d.history)
                .unwrap_or_default()
        }
    };
    let history = synced("Compliant", "2 of 2 hosted cluster(s) compliant").await;
    assert!(
        history[0].message.starts_with("Compliant; notification - "),
        "{history:?}"
    );

    // Template-sync reports an error on the template (emitTemplateError: a compliance Event on
    // the Policy, `NonCompliant; template-error; …`), then recovers without a word: it never
    // reports a third-party kind as recovered. Its error is the hub's newest entry until the
    // agent, seeing that in the Policy's status, says its verdict again (D2).
    let now = jiff::Timestamp::now();
    let nanos = now.as_nanosecond();
    let seconds = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let error: k8s_openapi::api::core::v1::Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{root_name}.{nanos:x}"), "namespace": cluster_ns},
        "firstTimestamp": seconds, "lastTimestamp": seconds, "count": 1,
        "involvedObject": {"apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
            "name": root_name, "namespace": cluster_ns, "uid": uid},
        "reason": reason,
        "message": "NonCompliant; template-error; Failed to create the template: the server is busy",
        "type": "Warning",
    }))
    .expect("event");
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(mgmt.clone(), cluster_ns)
        .create(&Default::default(), &error)
        .await
        .expect("template-sync's error");
    let history = synced("Compliant", "2 of 2 hosted cluster(s) compliant").await;
    assert!(
        history.iter().any(|h| h.message.contains("template-error")),
        "the error stays in the history, below the verdict said again: {history:?}"
    );

    // hc-2's kube-apiserver goes away: the verdict names it, newest first, the old one kept.
    fleet.hosted_mut("hc-2").expect("hc-2").stop();
    let history = synced(
        "NonCompliant",
        "clusters-hc-2/hc-2 NonCompliant: hosted-webhooks",
    )
    .await;
    assert!(
        history[0]
            .message
            .starts_with("NonCompliant; violation - 1 non-compliant"),
        "{history:?}"
    );
    assert!(
        history
            .iter()
            .any(|h| h.message.starts_with("Compliant; notification - 2 of 2")),
        "{history:?}"
    );
    // Events expire (an hour, by default) or are lost; the template's own history keeps
    // what they said, each entry named after its Event so status-sync counts them once (D6).
    let p = policies.get(&root_name).await.expect("Policy");
    let both = status_sync(&mgmt, &p).await.expect("status sync");
    let with_events = both
        .details
        .iter()
        .find(|d| d.template_meta.name == template_name)
        .map(|d| d.history.clone())
        .unwrap_or_default();
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(mgmt.clone(), cluster_ns);
    for e in events
        .list(&Default::default())
        .await
        .expect("events")
        .items
    {
        if e.reason.as_deref() == Some(reason.as_str()) {
            events
                .delete(&e.name_any(), &Default::default())
                .await
                .expect("expire the event");
        }
    }
    let without = status_sync(&mgmt, &p).await.expect("status sync");
    let from_template = without
        .details
        .iter()
        .find(|d| d.template_meta.name == template_name)
        .map(|d| d.history.clone())
        .unwrap_or_default();
    // The agent's own entries (template-sync's error above was only ever an Event).
    let names = |h: &[hcp_fleet_agent::crd::ComplianceHistory]| {
        h.iter()
            .filter(|e| !e.message.contains("template-error"))
            .map(|e| (e.event_name.clone(), e.message.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&from_template),
        names(&with_events),
        "the template's history says what the Events said, once each"
    );
    assert!(
        from_template[0]
            .message
            .starts_with("NonCompliant; violation - 1 non-compliant")
    );

    // The template's own status: a row per hosted cluster.
    let (state, rows) = template_rows(&mgmt, cluster_ns, &template_name)
        .await
        .expect("rows");
    assert_eq!(state, "NonCompliant");
    assert_eq!(rows, ["clusters-hc-1", "clusters-hc-2"]);

    // The hub Policy deleted and created again (D1): the replica and its template come back
    // with the same names and new UIDs, and the verdict is reported to the new ones at once,
    // though it has not changed.
    policies
        .delete(&root_name, &Default::default())
        .await
        .expect("delete the replica");
    templates
        .delete(&template_name, &Default::default())
        .await
        .expect("delete the template");
    eventually("the old template gone", Duration::from_secs(10), || async {
        match templates.get_opt(&template_name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let mut again = serde_json::to_value(&replica).expect("json");
    again["metadata"] = serde_json::json!({
        "name": root_name, "namespace": cluster_ns, "labels": replica.labels(),
    });
    again["status"] = serde_json::Value::Null;
    let again: Policy = policies
        .create(
            &Default::default(),
            &serde_json::from_value(again).expect("typed Policy"),
        )
        .await
        .expect("the replica again");
    let new_uid = again.uid().expect("uid");
    assert_ne!(new_uid, uid);
    template["metadata"]["ownerReferences"][0]["uid"] = new_uid.clone().into();
    templates
        .create(
            &Default::default(),
            &serde_json::from_value(template).expect("typed template"),
        )
        .await
        .expect("the template again");
    eventually(
        "the re-created Policy gets the verdict",
        Duration::from_secs(20),
        || async {
            let p = policies.get(&root_name).await.map_err(|e| e.to_string())?;
            let status = status_sync(&mgmt, &p).await?;
            let d = status
                .details
                .iter()
                .find(|d| d.template_meta.name == template_name)
                .ok_or("no details for the template")?;
            match (d.compliant.as_deref(), d.history.first()) {
                (Some("NonCompliant"), Some(h))
                    if h.message.contains("clusters-hc-2/hc-2 NonCompliant") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // No Policy but ACM's own replica: the agent writes none, and removed the old ones.
    let all = Api::<Policy>::all(mgmt.clone())
        .list(&Default::default())
        .await
        .expect("list");
    assert_eq!(
        all.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        [root_name]
    );
}

/// ACM's status sync for one replicated Policy, as its source reads (see above): core/v1 Events
/// in the Policy's namespace with the Policy's UID and a `policy: [ns/]template` reason, per
/// template newest first (the client-go name suffix gives the precise time), at most 10, the
/// compliance from the newest message's prefix.
async fn status_sync(
    mgmt: &Client,
    p: &Policy,
) -> Result<hcp_fleet_agent::crd::PolicyStatus, String> {
    use hcp_fleet_agent::crd::policy::TemplateMeta;
    use hcp_fleet_agent::crd::{ComplianceHistory, PolicyStatus, TemplateDetails};
    let ns = p.namespace().unwrap_or_default();
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(mgmt.clone(), &ns)
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut details = Vec::new();
    let mut overall: Option<&str> = Some("Compliant");
    for t in &p.spec.policy_templates {
        let name = t.object_definition["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let mut hist: Vec<(i128, ComplianceHistory)> = events
            .items
            .iter()
            .filter(|e| e.involved_object.uid == p.uid())
            .filter(|e| {
                e.reason
                    .as_deref()
                    .and_then(|r| r.strip_prefix("policy:"))
                    .map(|r| r.trim().rsplit_once('/').map_or(r.trim(), |(_, t)| t))
                    == Some(name)
            })
            .map(|e| {
                let event_name = e.metadata.name.clone().unwrap_or_default();
                let nanos = event_name
                    .rsplit('.')
                    .next()
                    .and_then(|h| i128::from_str_radix(h, 16).ok())
                    .unwrap_or_default();
                let ts = e
                    .last_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default();
                (
                    nanos,
                    ComplianceHistory {
                        event_name,
                        last_timestamp: ts,
                        message: e.message.clone().unwrap_or_default(),
                    },
                )
            })
            .collect();
        // getEventsInTemplate: the template's own `status.history` (MicroTime, message), each
        // entry named `<policy>.<hex nanoseconds>` after its timestamp.
        if t.object_definition["kind"] == "AdmissionHealthPolicy" {
            let tmpl = Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), &ns)
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?;
            for h in tmpl
                .and_then(|t| t.status)
                .map(|s| s.history)
                .unwrap_or_default()
            {
                let Ok(at) = h.last_timestamp.parse::<jiff::Timestamp>() else {
                    continue;
                };
                if h.message.is_empty() {
                    continue;
                }
                let nanos = at.as_nanosecond();
                hist.push((
                    nanos,
                    ComplianceHistory {
                        event_name: format!("{}.{nanos:x}", p.name_any()),
                        last_timestamp: h.last_timestamp.clone(),
                        message: h.message.trim().to_string(),
                    },
                ));
            }
        }
        // mergeDetails: newest first; an entry with the previous one's message within 5 µs of
        // it is the same event (an Event and its history entry); at most 10.
        hist.sort_by_key(|h| std::cmp::Reverse(h.0));
        let mut deduped: Vec<(i128, ComplianceHistory)> = Vec::new();
        for (i, (at, h)) in hist.iter().enumerate() {
            if deduped.len() == 10 {
                break;
            }
            let too_similar =
                i > 0 && (hist[i - 1].0 - at).abs() < 5_000 && hist[i - 1].1.message == h.message;
            if !too_similar {
                deduped.push((*at, h.clone()));
            }
        }
        let history: Vec<ComplianceHistory> = deduped.into_iter().map(|(_, h)| h).collect();
        let compliant = history.first().map(|h| {
            let m = h.message.trim().to_lowercase();
            if m.starts_with("compliant") {
                "Compliant"
            } else if m.starts_with("pending") {
                "Pending"
            } else {
                "NonCompliant"
            }
        });
        match compliant {
            Some("NonCompliant") => overall = Some("NonCompliant"),
            Some("Pending") if overall != Some("NonCompliant") => overall = Some("Pending"),
            Some(_) => {}
            None if overall == Some("Compliant") => overall = None,
            None => {}
        }
        details.push(TemplateDetails {
            compliant: compliant.map(str::to_string),
            template_meta: TemplateMeta {
                name: name.to_string(),
            },
            history,
        });
    }
    Ok(PolicyStatus {
        compliant: overall.map(str::to_string),
        details,
        status: Vec::new(),
    })
}

/// Hosted-mode addons (item 1 of #28): ACM's framework addon for hosted cluster X runs on the
/// management cluster in `klusterlet-X`; spec-sync copies the hosted clusters' Policy there and
/// template-sync creates the agent's template labelled `policy.open-cluster-management.io/
/// cluster-name: X` (this test plays both, as `acm_reads_the_fleet_verdict_…` does). Each such
/// template is its hosted cluster's own row: its own verdict and history, and only its own;
/// breaking one hosted cluster turns only its row NonCompliant. A name that maps to no HCP is
/// NonCompliant, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hosted_cluster_is_its_own_row_with_hosted_mode_addons() {
    let (mut fleet, mgmt, _pods) = fleet_with_acm().await;
    let _agent = start_agent(&mgmt).await;
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    // The hosted clusters' Policy as `make policies` writes it.
    let docs = hub_objects();
    let hosted = docs
        .iter()
        .find(|d| {
            d["kind"] == "Policy" && d["metadata"]["name"] == "hcp-fleet-agent-hosted-clusters"
        })
        .expect("the hosted clusters' Policy");
    let root_name = "hcp-fleet-policies.hcp-fleet-agent-hosted-clusters";
    let template_name = hcp_fleet_agent::packaging::HOSTED_CLUSTER_TEMPLATE_NAME;
    let template_def = hosted["spec"]["policy-templates"][0]["objectDefinition"].clone();
    assert_eq!(template_def["metadata"]["name"], template_name);
    // One replica and one template per hosted cluster, in its klusterlet namespace.
    let mut rows = Vec::new();
    for x in ["hc-1", "hc-2", "hc-9"] {
        let ns = format!("klusterlet-{x}");
        hcp_fleet_agent::localcp::fixtures::ensure_namespace(&mgmt, &ns, Default::default())
            .await
            .expect("klusterlet namespace");
        let replica: Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
            "metadata": replica_metadata(root_name, &ns, x),
            "spec": hosted["spec"],
        }))
        .expect("replica");
        let policies: Api<Policy> = Api::namespaced(mgmt.clone(), &ns);
        let replica = policies
            .create(&Default::default(), &replica)
            .await
            .expect("replicated Policy");
        // Template-sync: the template as the Policy defines it, labelled for its cluster and
        // owned by the replica.
        let mut template = template_def.clone();
        template["metadata"] = serde_json::json!({"name": template_name, "namespace": ns,
            "labels": {"policy.open-cluster-management.io/cluster-name": x},
            "ownerReferences": owned_by(root_name, &replica.uid().unwrap_or_default())});
        let template: AdmissionHealthPolicy = serde_json::from_value(template).expect("template");
        Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), &ns)
            .create(&Default::default(), &template)
            .await
            .expect("template");
        rows.push((x, policies));
    }
    // What the hub shows for each hosted cluster (status-sync, as the other test plays it).
    let row = |x: &'static str| {
        let mgmt = mgmt.clone();
        let policies = rows
            .iter()
            .find(|(n, _)| *n == x)
            .map(|(_, p)| p.clone())
            .expect("row");
        async move {
            let p = policies.get(root_name).await.map_err(|e| e.to_string())?;
            let status = status_sync(&mgmt, &p).await?;
            let d = status.details.first().ok_or("no details")?;
            Ok::<_, String>((
                d.compliant.clone().unwrap_or_default(),
                d.history
                    .first()
                    .map(|h| h.message.clone())
                    .unwrap_or_default(),
                d.history.len(),
            ))
        }
    };
    let expect = |x: &'static str, want: &'static str, needle: &'static str| async move {
        eventually(
            &format!("{x}'s row says {want}"),
            Duration::from_secs(20),
            || async {
                match row(x).await? {
                    (c, m, _) if c == want && m.contains(needle) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    };
    expect(
        "hc-1",
        "Compliant",
        "clusters-hc-1/hc-1: the admission guards",
    )
    .await;
    expect(
        "hc-2",
        "Compliant",
        "clusters-hc-2/hc-2: the admission guards",
    )
    .await;
    expect(
        "hc-9",
        "NonCompliant",
        "no hosted control plane on this management cluster is for hosted cluster hc-9",
    )
    .await;

    // hc-2's kube-apiserver goes away: only hc-2's row turns NonCompliant, and says why.
    fleet.hosted_mut("hc-2").expect("hc-2").stop();
    expect("hc-2", "NonCompliant", "clusters-hc-2/hc-2 NonCompliant").await;
    let (c, m, n) = row("hc-1").await.expect("hc-1's row");
    assert_eq!(
        (c.as_str(), n),
        ("Compliant", 1),
        "hc-1's row is untouched: {m}"
    );
    // Each template holds its own hosted cluster only.
    for (x, ns) in [("hc-1", "clusters-hc-1"), ("hc-2", "clusters-hc-2")] {
        let (_, related) = template_rows(&mgmt, &format!("klusterlet-{x}"), template_name)
            .await
            .expect("rows");
        assert_eq!(related, [ns]);
    }
}
