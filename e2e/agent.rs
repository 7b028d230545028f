//! The agent against real kube-apiservers: HCPs converge to Compliant with admission objects
//! on the management side and webhook configurations in each hosted cluster; a restarted
//! agent changes nothing; drift is repaired and recorded; hostile kubeconfigs are refused.

mod support;

use support::{
    AGENT_NS, compliant, delete_validating, eventually, health, start_agent, template_rows,
    wait_compliant,
};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hcp_fleet_agent::agent;
use hcp_fleet_agent::config::AgentConfig;
use hcp_fleet_agent::crd::{AdmissionHealth, AdmissionHealthPolicy, AdmissionHealthPolicySpec};
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

fn history_messages(h: &AdmissionHealth, concern: &str) -> Vec<String> {
    h.status
        .iter()
        .flat_map(|s| s.concerns.iter())
        .filter(|d| d.name == concern)
        .flat_map(|d| d.history.iter().map(|h| h.message.clone()))
        .collect()
}

/// An `AdmissionHealthPolicy` template with no parent Policy: the agent still writes its
/// verdict (the fleet's summary) into its status.
async fn create_template(mgmt: &Client, ns: &str, name: &str) {
    let t = AdmissionHealthPolicy::new(name, AdmissionHealthPolicySpec::default());
    Api::<AdmissionHealthPolicy>::namespaced(mgmt.clone(), ns)
        .create(&Default::default(), &t)
        .await
        .expect("create the template");
}

/// Waits until the template `fleet` in the agent's namespace says `state` over `total` hosted
/// clusters, with a related object for each one that is not Compliant.
async fn wait_template(mgmt: &Client, state: &str, total: usize, worst: &[&str]) {
    eventually(
        &format!("the template says {state} over {total} hosted clusters"),
        Duration::from_secs(10),
        || {
            let mgmt = mgmt.clone();
            async move {
                let (have, message, list) = template_rows(&mgmt, AGENT_NS, "fleet").await?;
                if have == state
                    && hcp_fleet_agent::reporting::summary_total(&message) == Some(total)
                    && list == worst
                {
                    Ok(())
                } else {
                    Err(format!("{have} {message} {list:?}"))
                }
            }
        },
    )
    .await;
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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
    let names = ["hc-1", "hc-2", "hc-3"];
    wait_compliant(&mgmt, &names).await;

    // The tools SREs already use read the records: `kubectl wait` on the Ready condition,
    // every kind of the project under one category.
    let kubeconfig = &fleet.management.kubeconfig_path;
    let (ok, out, err) = support::kubectl_with(
        kubeconfig,
        &[
            "wait",
            "--for=condition=Ready",
            "admissionhealths",
            "--all",
            "-A",
            "--timeout=60s",
        ],
    );
    assert!(ok, "kubectl wait on a converged fleet: {out}{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let (ok, out, err) = support::kubectl_with(kubeconfig, &["get", "hcp-fleet", "-A"]);
    assert!(ok, "{err}");
    for needle in ["admissionhealth", "admissionrollout", "READY", "REVISION"] {
        assert!(
            out.to_lowercase().contains(&needle.to_lowercase()),
            "{needle}: {out}"
        );
    }
    // The API server publishes a new CRD's schema to OpenAPI a few seconds after it serves it.
    support::eventually("kubectl explain", Duration::from_secs(30), || async {
        let (ok, out, err) = support::kubectl_with(
            kubeconfig,
            &["explain", "admissionhealths.status.conditions"],
        );
        if ok && out.contains("Ready") && !out.contains("Auto-generated") {
            Ok(())
        } else {
            Err(format!("{out}{err}"))
        }
    })
    .await;

    // `status -o json` says what the table says.
    let table = status_table(&fleet);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-agent"))
        .args(["status", "-o", "json"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("status");
    assert!(out.status.success());
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("status -o json parses");
    let from_json: Vec<String> = doc["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| {
            let concerns = &c["concerns"];
            format!(
                "{} {} {} {} {} {} {}",
                c["cluster"].as_str().unwrap_or_default(),
                c["compliant"].as_str().unwrap_or_default(),
                concerns["admission-service"].as_str().unwrap_or_default(),
                concerns["certificate"].as_str().unwrap_or_default(),
                concerns["hosted-webhooks"].as_str().unwrap_or_default(),
                concerns["e2e-probe"].as_str().unwrap_or_default(),
                c["driftRepairs"],
            )
        })
        .collect();
    let from_table: Vec<String> = table
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("hc-"))
        .map(|l| l.split_whitespace().take(7).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(from_json, from_table, "{table}");
    assert_eq!(doc["summary"]["compliant"], 3, "{doc}");
    // Installed as a kubectl plugin (`make kubectl-plugin`: the binary as kubectl-hcp_fleet on
    // the PATH), `kubectl hcp-fleet status` prints the same table.
    let plugins = tempfile::tempdir().expect("tmp");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_hcp-fleet-agent"),
        plugins.path().join("kubectl-hcp_fleet"),
    )
    .expect("symlink");
    let assets = hcp_fleet_agent::localcp::Assets::resolve(None).expect("assets");
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(&assets.kubectl)
        .args(["hcp-fleet", "status", "--kubeconfig"])
        .arg(kubeconfig)
        .env("PATH", path)
        .output()
        .expect("kubectl hcp-fleet");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), table);

    // An AdmissionHealthPolicy template (ACM's framework addon creates it; here without a
    // parent Policy) gets one row per hosted cluster.
    create_template(&mgmt, AGENT_NS, "fleet").await;
    wait_template(&mgmt, "Compliant", 3, &[]).await;

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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
    // Revoked credentials (the kubeconfig as it was, its user's now a token the server does
    // not know): the real server answers 401, and every place a person reads says which Secret
    // to look at, in words, and `status --problems` fails.
    let good = fleet.hosted("hc-3").expect("hc-3").kubeconfig_yaml.clone();
    let mut revoked: serde_json::Value = serde_saphyr::from_str(&good).expect("kubeconfig");
    revoked["users"][0]["user"] = serde_json::json!({"token": "revoked-token"});
    let revoked = serde_json::to_string(&revoked).expect("json");
    put_kubeconfig_secret(&secrets, SERVICE_NETWORK_KUBECONFIG, "kubeconfig", &revoked)
        .await
        .expect("secret");
    let secret_ref = format!("Secret clusters-hc-3/{SERVICE_NETWORK_KUBECONFIG}");
    wait_verdict(
        &mgmt,
        "clusters-hc-3",
        "hosted-webhooks",
        "NonCompliant",
        &secret_ref,
    )
    .await;
    let record = support::health(&mgmt, "clusters-hc-3")
        .await
        .expect("record");
    for m in history_messages(&record, "hosted-webhooks") {
        assert!(!hcp_fleet_agent::human::shows_debug(&m), "{m}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-agent"))
        .args(["status", "--problems", "-o", "wide", "--kubeconfig"])
        .arg(&fleet.management.kubeconfig_path)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "--problems found one: {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("hc-3 "))
        .expect("hc-3's row");
    assert!(
        line.contains("401 Unauthorized") && line.contains(&secret_ref),
        "{line}"
    );
    assert!(!hcp_fleet_agent::human::shows_debug(&text), "{text}");
    // The Event follows the record's write.
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(mgmt.clone(), "clusters-hc-3");
    support::eventually(
        "the Event naming the Secret",
        Duration::from_secs(10),
        || async {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let notes: Vec<String> = list
                .items
                .iter()
                .filter_map(|e| e.message.clone())
                .collect();
            assert!(
                notes
                    .iter()
                    .all(|n| !hcp_fleet_agent::human::shows_debug(n)),
                "{notes:#?}"
            );
            if notes.iter().any(|n| n.contains(&secret_ref)) {
                Ok(())
            } else {
                Err(format!("{notes:#?}"))
            }
        },
    )
    .await;

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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
    // While hc-3 is down, waiting for the fleet to be Ready times out, and its record says why.
    let kubeconfig = &fleet.management.kubeconfig_path;
    let (ok, out, err) = support::kubectl_with(
        kubeconfig,
        &[
            "wait",
            "--for=condition=Ready",
            "admissionhealths",
            "--all",
            "-A",
            "--timeout=3s",
        ],
    );
    assert!(!ok, "kubectl wait must time out while hc-3 is down: {out}");
    assert!(err.contains("timed out"), "{err}");
    let (ok, out, err) = support::kubectl_with(
        kubeconfig,
        &[
            "get",
            "admissionhealths",
            "-n",
            "clusters-hc-3",
            "-o",
            r#"jsonpath={.items[0].status.conditions[?(@.type=="Ready")].reason}"#,
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "HostedWebhooksNotReady");

    // The fleet verdict for ACM aggregates as ACM does and stays within the old enum (hc-2 is
    // Pending in its own record, which has Pending).
    wait_template(
        &mgmt,
        "NonCompliant",
        3,
        &["clusters-hc-3", "clusters-hc-2"],
    )
    .await;

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
        secure_metrics_addr: None,
        metrics_tls_dir: None,
        metrics_service: "hcp-fleet-agent-metrics".into(),
        health_addr: None,
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
            let (_, message, rows) = template_rows(&mgmt, AGENT_NS, "fleet").await?;
            let (_, body) = support::http_get(addr, "/metrics").await?;
            if !rows.contains(&"clusters-hc-3".to_string())
                && hcp_fleet_agent::reporting::summary_total(&message) == Some(2)
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

/// A leader whose controller dies (the test-only hook ends it as a panic would) does not sit on
/// the Lease: `/healthz` fails at once, the process hands the Lease back and exits non-zero,
/// and the standby leads within the lease duration plus 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_controller_dies_hands_over_and_exits() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    // In this process first: what /healthz says of an ended controller.
    {
        let agent = start_agent(&mgmt, AgentConfig::default()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _server = agent::serve(listener, agent.context.metrics.clone());
        wait_compliant(&mgmt, &["hc-1"]).await;
        assert_eq!(
            support::http_get(addr, "/healthz").await.map(|r| r.0),
            Ok(200)
        );
        agent.kill_controller();
        eventually("/healthz fails", Duration::from_secs(5), || async {
            match support::http_get(addr, "/healthz").await? {
                (503, body) if body.contains("the controller has ended") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    let lease_seconds = 10u64;
    let hook = [("HCP_FLEET_TEST_HOOKS".to_string(), "1".to_string())];
    let mut agents: Vec<_> = ["agent-a", "agent-b"]
        .into_iter()
        .map(|name| {
            let (child, addr) = support::spawn_elected_agent_env(
                name,
                &fleet.management.kubeconfig_path,
                AGENT_NS,
                Some(lease_seconds),
                &hook,
            );
            (name, child, addr)
        })
        .collect();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(mgmt.clone(), AGENT_NS);
    let holder = || async {
        leases
            .get("hcp-fleet-agent")
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    let leading = |h: Option<String>| {
        let h = h?;
        let addr = agents
            .iter()
            .find(|(n, _, _)| *n == h)
            .map(|(_, _, a)| *a)?;
        Some((h, addr))
    };
    eventually("one agent leads", Duration::from_secs(30), || async {
        match leading(holder().await) {
            Some((_, a)) if leader_gauge(a).await == Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (leader, _) = leading(holder().await).expect("the leader");
    let idx = agents
        .iter()
        .position(|(n, _, _)| *n == leader)
        .expect("leader");
    let (_, mut child, _) = agents.remove(idx);
    let (standby, _standby_child, standby_addr) = agents.remove(0);
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-USR2", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exited = tokio::task::spawn_blocking(move || child.0.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(
        exited.code(),
        Some(1),
        "the leader exits non-zero: {exited:?}"
    );
    eventually(
        "the standby leads",
        Duration::from_secs(lease_seconds + 5),
        || async {
            match (holder().await, leader_gauge(standby_addr).await) {
                (Some(h), Some(g)) if h == standby && g == 1.0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    eprintln!(
        "controller ended -> leader exited {exited:?}, {standby} leads {:?} after the hook",
        killed.elapsed()
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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
    wait_compliant(&mgmt, &["hc-1"]).await;
    let ns = hcp_namespace("hc-1");
    let hcps: Api<HostedControlPlane> = Api::namespaced(mgmt.clone(), &ns);
    // Since when, and by whom: the gauge the pause alert reads, and the record's start.
    let paused_series = || {
        agent
            .context
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("hcp_fleet_paused_since_timestamp_seconds{"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
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
            "annotation",
        ),
        (
            serde_json::json!({"spec": {"pausedUntil": "true"}}),
            serde_json::json!({"spec": {"pausedUntil": null}}),
            "paused by spec.pausedUntil",
            "hypershift",
        ),
    ];
    for (pause, resume, reason, by) in ways {
        let before = jiff::Timestamp::now().as_second();
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
        let since = health(&mgmt, &ns)
            .await
            .expect("record")
            .status
            .and_then(|s| s.paused_since)
            .expect("the record says since when");
        let since = since
            .parse::<jiff::Timestamp>()
            .expect("RFC 3339")
            .as_second();
        assert!(since >= before - 1, "{since} {before}");
        assert_eq!(
            paused_series(),
            [format!(
                "hcp_fleet_paused_since_timestamp_seconds{{hcp_namespace=\"{ns}\",hosted_cluster=\"hc-1\",reason=\"{by}\"}} {since}"
            )]
        );
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
        assert!(paused_series().is_empty(), "{:?}", paused_series());
        assert_eq!(
            health(&mgmt, &ns)
                .await
                .expect("record")
                .status
                .and_then(|s| s.paused_since),
            None
        );
    }

    // A pause older than maxPauseHours no longer holds: the agent repairs drift again, and the
    // record and the gauge keep the pause's start, so its alert goes on.
    patch(serde_json::json!({"metadata": {"annotations": {PAUSE_ANNOTATION: "true"}}})).await;
    eventually("paused again", Duration::from_secs(20), || async {
        match health(&mgmt, &ns)
            .await?
            .status
            .and_then(|s| s.paused_since)
        {
            Some(_) => Ok(()),
            None => Err("not yet".to_string()),
        }
    })
    .await;
    let long_ago = jiff::Timestamp::now().as_second() - 2 * 3600;
    let long_ago_text = jiff::Timestamp::from_second(long_ago)
        .expect("t")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    Api::<hcp_fleet_agent::crd::AdmissionHealth>::namespaced(mgmt.clone(), &ns)
        .patch_status(
            HEALTH_NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"pausedSince": long_ago_text}})),
        )
        .await
        .expect("a pause begun two hours ago");
    let mut cfg = hcp_fleet_agent::localcp::allow_loopback(AgentConfig::default());
    cfg.max_pause_hours = 1;
    agent.set_config(cfg);
    let vapi = delete_validating(&fleet, "hc-1").await;
    // The backdated start reaches the agent through its watch of the records, which need not
    // have delivered it by the reconcile the new configuration starts (a loaded machine): the
    // time a real pause takes to pass its maximum is stood in for by touching the HCP until a
    // reconcile reads the start (in a cluster the agent comes back when the maximum is up).
    let nudges = std::sync::atomic::AtomicU32::new(0);
    eventually(
        "a pause past its maximum: drift repaired",
        Duration::from_secs(20),
        || async {
            let found = present(&vapi).await;
            if found.is_err() {
                let n = nudges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n % 10 == 9 {
                    patch(serde_json::json!({"metadata": {"annotations": {"e2e/nudge": n.to_string()}}})).await;
                }
            }
            found
        },
    )
    .await;
    assert!(
        paused_series()
            .iter()
            .any(|l| l.contains("reason=\"annotation\"") && l.ends_with(&format!(" {long_ago}"))),
        "{:?}",
        paused_series()
    );
}

/// Removing the agent cleanly: `uninstall` refuses while an agent leads; then removes the
/// hosted webhooks before the admission services, keeps both for a hosted cluster it cannot
/// reach (and fails, so it can be run again), and removes the roll-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_removes_webhooks_first_and_keeps_what_it_cannot_reach() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::PostParams;
    let (mut fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
/// recorded on the management side (the HCP's AdmissionHealth), so a restarted agent refuses
/// the same namespace again; the annotation in the hosted cluster is only a hint, and a tenant
/// who rewrites it to name another namespace locks nobody out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_cluster_a_claimed_cluster_and_a_foreign_server_are_refused() {
    use hcp_fleet_agent::hosted::webhooks::CLAIM_ANNOTATION;
    use hcp_fleet_agent::localcp::fixtures::create_hcp;
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
    // hc-1's server again, behind user information: its host is what follows the '@'.
    let userinfo = hc1.kubeconfig_yaml.replace(
        "https://127.0.0.1:",
        "https://kube-apiserver:6443@127.0.0.1:",
    );
    assert_ne!(userinfo, hc1.kubeconfig_yaml);
    create_hcp(&mgmt, "userinfo", &userinfo)
        .await
        .expect("userinfo");
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
        (
            "clusters-userinfo",
            "kubeconfig field cluster.server is not allowed: user information (user@host) is not accepted",
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
        Some("5 hosted cluster(s): 1 Compliant, 4 NonCompliant, 0 Pending"),
        "{table}"
    );
    assert_eq!(rows.len(), 5, "{table}");
    assert!(rows.iter().any(|r| r.starts_with(foreign_name)), "{table}");
    for r in &rows {
        assert_eq!(starts(r)[..2], header[..2], "out of line:\n{table}");
    }

    // The record on the management side.
    let record = Api::<AdmissionHealth>::namespaced(mgmt.clone(), "clusters-hc-1")
        .get(HEALTH_NAME)
        .await
        .expect("hc-1's record");
    let uid = record
        .spec
        .hosted_cluster_uid
        .clone()
        .expect("hc-1's claim");
    let hc1_system =
        Api::<k8s_openapi::api::core::v1::Namespace>::all(hc1.client().await.expect("hc-1 client"))
            .get("kube-system")
            .await
            .expect("hc-1's kube-system");
    assert_eq!(
        Some(uid),
        hc1_system.metadata.uid,
        "the claim names hc-1's identity"
    );

    // A restarted agent finds the claim where it left it: the twin is refused again (had it
    // been first in line this time, it would otherwise have taken hc-1). Meanwhile hc-1's
    // admins rewrite the annotation to say the twin's namespace holds their cluster: nothing
    // changes for that, and the annotation is put back.
    drop(agent);
    let hosted = hc1.client().await.expect("hc-1 client");
    let forged = claim.replace("/clusters-hc-1", "/clusters-twin");
    Api::<ValidatingWebhookConfiguration>::all(hosted.clone())
        .patch(
            VALIDATING_NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {CLAIM_ANNOTATION: forged}}}),
            ),
        )
        .await
        .expect("a tenant rewrites the claim annotation");
    for (ns, _) in verdicts {
        Api::<AdmissionHealth>::namespaced(mgmt.clone(), ns)
            .delete(HEALTH_NAME, &DeleteParams::default())
            .await
            .expect("delete the old verdict");
    }
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
    for (ns, why) in verdicts {
        wait_verdict(&mgmt, ns, "hosted-webhooks", "NonCompliant", why).await;
    }
    wait_compliant(&mgmt, &["hc-1"]).await;
    eventually(
        "the annotation put back",
        Duration::from_secs(10),
        || async {
            match claim_of_hc1().await {
                Some(c) if c == claim => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
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
    let agent = start_agent(&mgmt, AgentConfig::default()).await;
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
