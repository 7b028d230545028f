//! The agent against real kube-apiservers: HCPs converge to Compliant with admission objects
//! on the management side and webhook configurations in each hosted cluster; a restarted
//! agent changes nothing; drift is repaired and recorded; hostile kubeconfigs are refused.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

#[path = "agent/access.rs"]
mod access;
#[path = "agent/leadership.rs"]
mod leadership;
#[path = "agent/lifecycle.rs"]
mod lifecycle;
#[path = "agent/switch_over.rs"]
mod switch_over;
// Helpers one concern defines and another uses.
#[allow(unused_imports)]
use access::*;
#[allow(unused_imports)]
use leadership::*;
#[allow(unused_imports)]
use lifecycle::*;
mod support;

use support::{
    AGENT_NS, compliant, delete_validating, eventually, health, start_agent, template_rows,
    wait_compliant,
};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hcp_fleet_cli::agent;
use hcp_fleet_model::crd::{AdmissionHealth, AdmissionHealthPolicy, AdmissionHealthPolicySpec};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::hosted::objects::OWNED_LABEL;
use hcp_fleet_render::hosted::webhooks::{MUTATING_NAME, VALIDATING_NAME};
use hcp_fleet_render::management::ALLOW_GUEST_WEBHOOKS;
use hcp_fleet_testbed::assets::Feature;
use hcp_fleet_testbed::fixtures::{
    SERVICE_NETWORK_KUBECONFIG, hcp_namespace, put_kubeconfig_secret,
};
use hcp_fleet_testbed::{FleetOptions, LocalFleet, kubelet};
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
                    && hcp_fleet_render::reporting::hub::summary_total(&message) == Some(total)
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
    // Every guard through the service: its Service, CA and URL are what this test follows.
    let agent = start_agent(&mgmt, support::through_the_service()).await;
    let names = ["hc-1", "hc-2", "hc-3"];
    wait_compliant(&mgmt, &names).await;

    // The tools SREs already use read the records: `kubectl wait` on the Ready condition,
    // every kind of the project under one category.
    let kubeconfig = &fleet.management.kubeconfig_path;
    let (ok, out, err) = support::wait_fleet_ready(kubeconfig, "60s");
    assert!(ok, "kubectl wait on a converged fleet: {out}{err}");
    // Each record is named after its hosted cluster, so `kubectl wait` names each one.
    let mut met: Vec<&str> = out.lines().collect();
    met.sort_unstable();
    assert_eq!(
        met,
        names
            .iter()
            .map(|n| format!("admissionhealth.hcp-fleet.openshift.io/{n} condition met"))
            .collect::<Vec<_>>(),
        "{out}"
    );
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
    // An optional field shows its type (a nullable one was published without it: `<>`).
    for (field, kind) in [
        ("admissionhealths.spec.owner", "<string>"),
        ("admissionhealths.status.revision", "<string>"),
        ("admissionhealths.status.pausedSince", "<string>"),
    ] {
        let (ok, out, err) = support::kubectl_with(kubeconfig, &["explain", field]);
        assert!(
            ok && out.contains(kind) && !out.contains("<>"),
            "{field}: {out}{err}"
        );
    }

    // `status -o json` says what the table says.
    let table = status_table(&fleet);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
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
        env!("CARGO_BIN_EXE_hcp-fleet-dev"),
        plugins.path().join("kubectl-hcp_fleet"),
    )
    .expect("symlink");
    let assets = hcp_fleet_testbed::Assets::resolve(None).expect("assets");
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
    let agent = start_agent(&mgmt, support::through_the_service()).await;
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

    // A burst of drift (the configuration deleted ten times, each time it is back): every
    // pass still proves the path, so no repair leaves the probe "not checked" (Pending, Ready
    // Unknown), and the record is Compliant within seconds of the last.
    let burst_start = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    for _ in 0..10 {
        vapi.delete(VALIDATING_NAME, &DeleteParams::default())
            .await
            .expect("delete");
        eventually("restored", Duration::from_secs(10), || present(&vapi)).await;
    }
    let burst_end = Instant::now();
    eventually("Compliant after the burst", Duration::from_secs(10), || {
        let mgmt = mgmt.clone();
        async move {
            let p = health(&mgmt, "clusters-hc-1").await?;
            let probe = p
                .status
                .iter()
                .flat_map(|s| s.concerns.iter())
                .find(|c| c.name == "e2e-probe")
                .and_then(|c| c.compliant);
            if compliant(&p) == Some("Compliant")
                && probe == Some(hcp_fleet_model::crd::ComplianceState::Compliant)
            {
                Ok(())
            } else {
                Err(format!("{:?}", p.status))
            }
        }
    })
    .await;
    eprintln!(
        "Compliant {:?} after a burst of ten deletions",
        burst_end.elapsed()
    );
    let p = health(&mgmt, "clusters-hc-1").await.expect("record");
    let unproven: Vec<String> = p
        .status
        .iter()
        .flat_map(|s| s.concerns.iter())
        .filter(|c| c.name == "e2e-probe")
        .flat_map(|c| c.history.iter())
        .filter(|h| h.last_timestamp >= burst_start && h.message.contains("not checked"))
        .map(|h| h.message.clone())
        .collect();
    assert!(
        unproven.is_empty(),
        "a repair left the probe unchecked: {unproven:?}"
    );
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .args(["status", "--problems", "-o", "wide", "--kubeconfig"])
        .arg(&fleet.management.kubeconfig_path)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "--problems found one: {text}");
    // Could not look is not the same as found a problem: exit 2, saying why.
    let status = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
            .arg("status")
            .args(args)
            .output()
            .expect("status")
    };
    let kubeconfig_arg = fleet
        .management
        .kubeconfig_path
        .to_string_lossy()
        .into_owned();
    let missing = status(&["-n", "nosuchns", "--kubeconfig", &kubeconfig_arg]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("namespace \"nosuchns\" not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    let unreadable = status(&["--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(unreadable.status.code(), Some(2));
    let one = status(&["-n", "clusters-hc-1", "--kubeconfig", &kubeconfig_arg]);
    assert_eq!(one.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&one.stdout).contains("hc-1 "));
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
    let own = hcp_fleet_model::crd::CRD_MANIFESTS[1].1;
    let old = fleet
        .upstream_crd(hcp_fleet_testbed::assets::UPSTREAM_POLICY_CRD)
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
    hcp_fleet_testbed::fixtures::install_crd_manifests(
        &mgmt,
        [("policies.policy.open-cluster-management.io", old.as_str())],
    )
    .await
    .expect("old CRD");
    // hc-3's kube-apiserver is down; hc-2's HCP is not ready yet (Pending, written as NonCompliant).
    fleet.hosted_mut("hc-3").expect("hc-3").stop();
    hcp_fleet_testbed::fixtures::set_hcp_ready(&mgmt, "clusters-hc-2", "hc-2", false)
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
    let (ok, out, err) = support::wait_fleet_ready(kubeconfig, "3s");
    assert!(!ok, "kubectl wait must time out while hc-3 is down: {out}");
    assert!(err.contains("timed out"), "{err}");
    // Naming the cluster it waited for (records are named after their hosted clusters).
    assert!(err.contains("admissionhealths/hc-3"), "{err}");
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
    hcp_fleet_testbed::fixtures::set_hcp_ready(&mgmt, "clusters-hc-2", "hc-2", true)
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
    // Said where an SRE looks, not only in the log: the metric, and an Event on the
    // agent's rollout object.
    assert!(
        agent
            .context
            .metrics
            .encode()
            .contains("hcp_fleet_config_last_reload_successful 0"),
        "the refusal's metric"
    );
    eventually(
        "the ConfigurationRefused Event",
        Duration::from_secs(10),
        || async {
            let events =
                Api::<k8s_openapi::api::events::v1::Event>::namespaced(mgmt.clone(), AGENT_NS)
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
            events
                .items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("ConfigurationRefused")
                        && e.regarding.as_ref().and_then(|r| r.kind.as_deref())
                            == Some("AdmissionRollout")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains("concurrency must be at least 1"))
                })
                .map(|_| ())
                .ok_or_else(|| format!("{} events", events.items.len()))
        },
    )
    .await;
    // And a condition on that object (`helm upgrade` succeeded whatever the agent made of it).
    let accepted = |want: &'static str, text: &'static str| {
        let mgmt = mgmt.clone();
        async move {
            let r = Api::<hcp_fleet_model::crd::admission_rollout::AdmissionRollout>::namespaced(
                mgmt, AGENT_NS,
            )
            .get("fleet")
            .await
            .map_err(|e| e.to_string())?;
            let c = r
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .find(|c| c.type_ == "ConfigurationAccepted")
                .ok_or("no ConfigurationAccepted condition")?;
            let status = serde_json::to_value(c.status).map_err(|e| e.to_string())?;
            if status == want && c.message.contains(text) {
                Ok(())
            } else {
                Err(format!("{status} {}", c.message))
            }
        }
    };
    eventually(
        "ConfigurationAccepted False, saying why",
        Duration::from_secs(10),
        || accepted("False", "concurrency must be at least 1"),
    )
    .await;
    assert_eq!(
        *agent.context.config(),
        hcp_fleet_testbed::allow_loopback(AgentConfig::default()),
        "last good configuration kept"
    );
    // A file as an operator writes one: a `webhooks:` list naming the one guard it changes,
    // and the mutating guard turned off by name. Every other built-in stays.
    let defaults = hcp_fleet_testbed::allow_loopback(AgentConfig::default());
    let mut file = serde_json::to_value(&defaults).expect("json");
    let mut changed = defaults.webhooks[0].clone();
    changed.timeout_seconds = 3;
    file["webhooks"] = serde_json::json!([changed]);
    let mutating: Vec<String> = defaults
        .webhooks
        .iter()
        .filter(|w| w.kind == hcp_fleet_guards::catalogue::WebhookKind::Mutating)
        .map(|w| w.name.clone())
        .collect();
    file["disabledGuards"] = serde_json::json!(mutating);
    std::fs::write(&path, serde_saphyr::to_string(&file).expect("yaml")).expect("write");
    assert!(
        agent.reload(&args).expect("good config"),
        "a change was applied"
    );
    let running = agent.context.config();
    assert_eq!(
        running.webhooks.len(),
        defaults.webhooks.len(),
        "no built-in dropped"
    );
    assert_eq!(running.webhooks[0], changed);
    assert_eq!(
        running
            .webhooks
            .iter()
            .filter(|w| w.mode != hcp_fleet_model::Mode::Off)
            .count(),
        defaults.webhooks.len() - mutating.len()
    );
    assert!(
        agent
            .context
            .metrics
            .encode()
            .contains("hcp_fleet_config_last_reload_successful 1"),
        "accepted again"
    );
    eventually(
        "ConfigurationAccepted True again",
        Duration::from_secs(10),
        || accepted("True", "in force"),
    )
    .await;
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
    Api::<hcp_fleet_model::crd::HostedControlPlane>::namespaced(mgmt.clone(), "clusters-hc-3")
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
                && hcp_fleet_render::reporting::hub::summary_total(&message) == Some(2)
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
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
