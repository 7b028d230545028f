//! The fleet packaging against real parts: helm (from hack/helm.sh), the chart, the generated
//! policies/, and real kube-apiservers that judge the rendered objects and enforce the chart's
//! RBAC on a running agent.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

#[path = "packaging/monitoring.rs"]
mod monitoring;
#[path = "packaging/policy.rs"]
mod policy;
#[path = "packaging/supply_chain.rs"]
mod supply_chain;
mod support;
#[path = "packaging/uninstall.rs"]
mod uninstall;
// Helpers one concern defines and another uses.
#[allow(unused_imports)]
use monitoring::*;
#[allow(unused_imports)]
use policy::*;
#[allow(unused_imports)]
use uninstall::*;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use hcp_fleet_agent::metrics::Metrics;
use hcp_fleet_cli::packaging;
use hcp_fleet_testbed::assets::Feature;
use hcp_fleet_testbed::fixtures::{AGENT_NAMESPACE, hcp_namespace};
use hcp_fleet_testbed::{FleetOptions, LocalFleet};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::chart::{CHART, MONITORING_API, helm, render, repo, run_helm};
use support::eventually;

const SA: &str = "system:serviceaccount:hcp-fleet-agent:hcp-fleet-agent";

/// Without the Prometheus Operator's API the chart renders no ServiceMonitor or PrometheusRule
/// (`helm install` would fail on a kind the server does not know); with it, both; and neither
/// where the values turn them off.
#[test]
fn monitoring_objects_only_where_the_prometheus_operator_api_is_served() {
    let kinds = |objs: Vec<Value>| -> Vec<String> {
        objs.iter()
            .filter_map(|o| o["kind"].as_str())
            .filter(|k| ["ServiceMonitor", "PrometheusRule"].contains(k))
            .map(String::from)
            .collect()
    };
    assert!(kinds(render(&[])).is_empty());
    let mut both = kinds(render(MONITORING_API));
    both.sort();
    assert_eq!(both, ["PrometheusRule", "ServiceMonitor"]);
    let mut off = MONITORING_API.to_vec();
    off.extend([
        "--set",
        "serviceMonitor.enabled=false",
        "--set",
        "prometheusRule.enabled=false",
    ]);
    assert!(kinds(render(&off)).is_empty());
}

#[test]
fn helm_lint_passes_and_the_schema_refuses_bad_values() {
    let out = run_helm(&["lint", "--strict", CHART]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    // The values schema carries the config types: a misspelled key is refused by name.
    let out = Command::new(helm())
        .args(["template", "x", CHART, "--set", "config.concurency=4"])
        .current_dir(repo())
        .output()
        .expect("helm");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("concurency"), "{err}");
    // And the agent's guardrails (made from the same table): what would crash-loop a fresh
    // install is refused by helm, naming the value. `--set-json` so a `*` is a string.
    for (value, named) in [
        ("config.probeIntervalSeconds=2", "probeIntervalSeconds"),
        ("config.concurrency=0", "concurrency"),
        (r#"config.admission.exemptUsers=["*"]"#, "exemptUsers"),
        (
            r#"config.admission.exemptUsers=["system:serviceaccount:*"]"#,
            "exemptUsers",
        ),
        (r#"config.admission.exemptGroups=["sre*"]"#, "exemptGroups"),
        (
            r#"config.admission.exemptGroups=["system:authenticated"]"#,
            "exemptGroups",
        ),
        (
            r#"config.webhooks=[{"name":"a.b.c","kind":"Validating","path":"/validate/scc","rules":[],"timeoutSeconds":30}]"#,
            "timeoutSeconds",
        ),
    ] {
        let out = Command::new(helm())
            .args(["template", "x", CHART, "--set-json", value])
            .current_dir(repo())
            .output()
            .expect("helm");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "helm accepted {value}");
        assert!(err.contains(named), "{value}: {err}");
    }
    // What the agent accepts, helm does too.
    render(&[
        "--set-json",
        r#"config.admission.exemptUsers=["alice","system:serviceaccount:team-a:*"]"#,
        "--set-json",
        r#"config.disabledGuards=["scc.hcp-fleet.openshift.io"]"#,
    ]);
    // Two replicas without leader election would both write.
    let out = Command::new(helm())
        .args([
            "template",
            "x",
            CHART,
            "--set",
            "leaderElection.enabled=false",
        ])
        .current_dir(repo())
        .output()
        .expect("helm");
    assert!(!out.status.success(), "replicas 2 without leader election");
    let ok = render(&[
        "--set",
        "replicas=1",
        "--set",
        "leaderElection.enabled=false",
    ]);
    assert!(!ok.iter().any(|o| o["kind"] == "PodDisruptionBudget"));
    // Renaming what the agent manages renames the RBAC grants with it.
    let renamed = render(&[
        "--set",
        "config.admission.serviceName=fleet-webhooks",
        "--set",
        "config.hostedAccess.kubeconfigSecret=admin-kubeconfig",
    ]);
    // The agent's ClusterRole, and the uninstall hook's.
    for (role_name, wanted) in [
        (
            "hcp-fleet-agent",
            &[
                "admin-kubeconfig",
                "fleet-webhooks",
                "fleet-webhooks-ca",
                "fleet-webhooks-tls",
                "fleet-webhooks-prometheus",
            ][..],
        ),
        (
            "hcp-fleet-agent-uninstall",
            &[
                "admin-kubeconfig",
                "fleet-webhooks",
                "fleet-webhooks-ca",
                "fleet-webhooks-tls",
                "fleet-webhooks-prometheus",
            ][..],
        ),
    ] {
        let role = renamed
            .iter()
            .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == role_name)
            .unwrap_or_else(|| panic!("ClusterRole {role_name}"));
        let named: Vec<&str> = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .flat_map(|r| r["resourceNames"].as_array().into_iter().flatten())
            .filter_map(|n| n.as_str())
            .collect();
        for want in wanted {
            assert!(named.contains(want), "{role_name}: {want} in {named:?}");
        }
        assert!(
            !named.iter().any(|n| (n.starts_with("hcp-fleet-admission-")
                && *n != hcp_fleet_render::management::METRICS_READER_ROLE)
                || *n == "service-network-admin-kubeconfig"),
            "{role_name}: the default names are gone: {named:?}"
        );
    }
}

#[test]
fn committed_packaging_files_are_fresh() {
    let schema = std::fs::read_to_string(repo().join(CHART).join("values.schema.json"))
        .expect("values.schema.json");
    assert!(
        schema == packaging::values_schema_text(),
        "charts/hcp-fleet-agent/values.schema.json is stale: run `make chart-schema`"
    );
    let out = tempfile::tempdir().expect("tmp");
    let status = Command::new("bash")
        .arg(repo().join("hack/policies.sh"))
        .arg(out.path())
        .env("HCP_FLEET_AGENT_BIN", env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .env("HELM", helm())
        .status()
        .expect("hack/policies.sh");
    assert!(status.success());
    let mut generated: Vec<String> = std::fs::read_dir(out.path())
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    generated.sort();
    let mut committed: Vec<String> = std::fs::read_dir(repo().join("policies"))
        .expect("policies/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    committed.sort();
    assert_eq!(
        generated, committed,
        "policies/ holds exactly the generated files"
    );
    for name in generated {
        let want = std::fs::read_to_string(out.path().join(&name)).expect("generated");
        let have = std::fs::read_to_string(repo().join("policies").join(&name)).expect("committed");
        assert!(
            want == have,
            "policies/{name} is stale: run `make policies`"
        );
    }
}

/// Every leaf of `sent` is in `got`: the API server pruned nothing, so no field of ours is
/// unknown to the schema (1.20 has no strict field validation to ask for).
fn pruned_fields(sent: &Value, got: &Value, path: &str, out: &mut Vec<String>) {
    match (sent, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => pruned_fields(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                pruned_fields(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: sent {a}, got {b}")),
    }
}

async fn api_for(client: &Client, obj: &Value) -> Api<DynamicObject> {
    let (group, version) = match obj["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .split_once('/')
    {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (
            String::new(),
            obj["apiVersion"].as_str().unwrap_or_default().to_string(),
        ),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, obj["kind"].as_str().expect("kind"));
    let (ar, caps): (ApiResource, _) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("the API server does not serve {gvk:?}: {e}"));
    match (caps.scope, obj["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        (Scope::Namespaced, None) => panic!("{gvk:?} is namespaced but has no namespace"),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
    }
}

/// Server-side dry-run apply of each object; panics with every refusal or unknown field. Where
/// the server has strict field validation (1.25 and later) it refuses unknown fields itself;
/// before that, what the server dropped (pruned) is compared with what was sent.
async fn dry_run_all(fleet: &LocalFleet, client: &Client, objs: &[Value]) {
    let strict = fleet.version.serves(Feature::CrdCel);
    let mut problems = Vec::new();
    for obj in objs {
        let name = obj["metadata"]["name"].as_str().expect("name");
        let what = format!("{} {}", obj["kind"], name);
        let api = api_for(client, obj).await;
        let dynamic: DynamicObject = serde_json::from_value(obj.clone()).expect("object");
        let mut pp = PatchParams::apply("packaging-test").dry_run();
        if strict {
            pp = pp.validation_strict();
        }
        match api.patch(name, &pp, &Patch::Apply(&dynamic)).await {
            Ok(_) if strict => {}
            Ok(got) => {
                let got = serde_json::to_value(&got).expect("json");
                let mut pruned = Vec::new();
                pruned_fields(obj, &got, "", &mut pruned);
                if !pruned.is_empty() {
                    problems.push(format!("{what}: dropped or changed {pruned:?}"));
                }
            }
            Err(e) => problems.push(format!("{what}: {e}")),
        }
    }
    assert!(problems.is_empty(), "refused:\n{}", problems.join("\n"));
}

async fn install_test_crds(client: &Client) {
    let dir = repo().join("e2e/crds");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("e2e/crds")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("crd");
            let v: Value = serde_saphyr::from_str(&text).expect("crd yaml");
            (
                v["metadata"]["name"].as_str().expect("name").to_string(),
                text,
            )
        })
        .collect();
    files.sort();
    hcp_fleet_testbed::fixtures::install_crd_manifests(
        client,
        files.iter().map(|(n, t)| (n.as_str(), t.as_str())),
    )
    .await
    .expect("test CRDs");
}

fn read_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read");
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).expect("yaml");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_chart_and_policies_pass_server_side_dry_run() {
    let fleet = LocalFleet::start(FleetOptions::with_hosted(0))
        .await
        .expect("fleet");
    let client = fleet.management.client().await.expect("client");
    install_test_crds(&client).await;
    // As helm would render for this server (policy/v1beta1 for the PDB on 1.20) with the
    // Prometheus Operator's API, whose CRDs `install_test_crds` served.
    let mut args = vec!["--kube-version", fleet.version.full.as_str()];
    args.extend(MONITORING_API);
    let objs = render(&args);
    let kinds: Vec<&str> = objs.iter().filter_map(|o| o["kind"].as_str()).collect();
    // Every kind the Policy orders, but the Namespace it adds itself.
    for k in packaging::INSTALL_ORDER
        .iter()
        .filter(|k| **k != "Namespace")
    {
        assert!(kinds.contains(k), "the chart renders a {k}: {kinds:?}");
    }
    dry_run_all(&fleet, &client, &objs).await;

    // The hub objects go into their namespace; the SelectorSyncSet is cluster-scoped.
    let hub = read_docs(&repo().join("policies/policy.yaml"));
    hcp_fleet_testbed::fixtures::ensure_namespace(
        &client,
        "hcp-fleet-policies",
        Default::default(),
    )
    .await
    .expect("namespace");
    dry_run_all(&fleet, &client, &hub).await;
    let sss = read_docs(&repo().join("policies/selectorsyncset.yaml"));
    assert_eq!(sss.len(), 1);
    dry_run_all(&fleet, &client, &sss).await;
    // The objects the SelectorSyncSet carries are exactly the hub objects, behind their
    // namespace.
    let carried = sss[0]["spec"]["resources"].as_array().expect("resources");
    assert_eq!(carried[0]["kind"], "Namespace");
    assert_eq!(&carried[1..], hub.as_slice());
}

/// Server-side applies each object, as an administrator installing it would.
async fn apply_all<'a>(admin: &Client, objs: impl IntoIterator<Item = &'a Value>) {
    for obj in objs {
        let api = api_for(admin, obj).await;
        let d: DynamicObject = serde_json::from_value(obj.clone()).expect("object");
        api.patch(
            obj["metadata"]["name"].as_str().expect("name"),
            &PatchParams::apply("packaging-test"),
            &Patch::Apply(&d),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {} {}: {e}", obj["kind"], obj["metadata"]["name"]));
    }
}

fn impersonating_kubeconfig(admin: &str) -> String {
    impersonating(admin, SA)
}

/// A kubeconfig that acts as the ServiceAccount `sa` of the agent's namespace.
fn impersonating(admin: &str, sa: &str) -> String {
    let mut v: Value = serde_saphyr::from_str(admin).expect("kubeconfig");
    let user = &mut v["users"][0]["user"];
    user["as"] = json!(sa);
    user["as-groups"] = json!([
        "system:serviceaccounts",
        "system:serviceaccounts:hcp-fleet-agent",
        "system:authenticated"
    ]);
    serde_json::to_string(&v).expect("json")
}

/// A Helm hook: not part of the release, run by `helm` at one moment (here: pre-delete).
fn is_hook(o: &Value) -> bool {
    o["metadata"]["annotations"]["helm.sh/hook"].is_string()
}

fn status_code(r: Result<impl Sized, kube::Error>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The chart's RBAC, applied for real, with the agent process acting as the chart's
/// ServiceAccount: it converges the fleet (admission services, certificates, health
/// records, events, an ACM template's verdict, the Lease), and the same identity is refused what it need not do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_lets_the_agent_do_its_job_and_nothing_else() {
    let (fleet, admin, _pods) = support::fleet_with_pods(2).await;
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let rbac: Vec<Value> = render(&[])
        .into_iter()
        .filter(|o| rbac_kinds.contains(&o["kind"].as_str().unwrap_or_default()) && !is_hook(o))
        .collect();
    // ... the role and binding that let ACM's framework addon create the agent's templates, the
    // metrics-reader role the agent binds the platform Prometheus to, and the role and binding
    // of who may scrape the agent's own /metrics.
    assert_eq!(rbac.len(), rbac_kinds.len() + 5);
    assert!(
        rbac.iter().any(|o| o["kind"] == "ClusterRole"
            && o["metadata"]["name"] == hcp_fleet_render::management::METRICS_READER_ROLE),
        "the chart ships the ClusterRole the agent binds"
    );
    // With a Prometheus Operator on the cluster, the agent writes monitors and bindings too.
    support::install_monitoring_crds(&admin).await;
    apply_all(&admin, &rbac).await;

    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("agent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        impersonating_kubeconfig(&fleet.management.kubeconfig_yaml),
    )
    .expect("write kubeconfig");
    // As the chart's Deployment runs it: its environment, the chart's values.
    let deployment = render(&[])
        .into_iter()
        .find(|o| o["kind"] == "Deployment" && !is_hook(o))
        .expect("the agent's Deployment");
    let env: Vec<(String, String)> = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("HCP_FLEET_"))
                && e["value"].is_string()
        })
        .filter(|e| e["name"] != "HCP_FLEET_ADMISSION_IMAGE")
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    // /metrics over HTTPS as the chart serves it, on loopback here.
    let secure_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut env = env;
    env.push((
        "HCP_FLEET_SECURE_METRICS_ADDR".into(),
        format!("127.0.0.1:{secure_port}"),
    ));
    let binding = env
        .iter()
        .find(|(k, _)| k == "HCP_FLEET_TEMPLATE_SYNC_BINDING")
        .map(|(_, v)| v.clone())
        .expect("the chart names the template-sync binding to the agent");
    // ACM's framework addon in hosted mode: one account per hosted cluster, in klusterlet-<name>,
    // besides the default-mode one. Each must be able to list the agent's template kind in its
    // own namespace (template-sync's cleanUpExcessTemplates does, for every labelled kind);
    // one that cannot fails every Policy reconcile of its cluster (D3).
    for ns in ["klusterlet-hc-a", "klusterlet-hc-b"] {
        addon_account(&admin, ns).await;
    }
    // Every guard on its webhook: the admission service's objects are among what the chart's
    // RBAC must let the agent write, on every server.
    let (_agent, metrics_addr) = support::spawn_elected_agent_yaml(
        "agent-rbac",
        &kubeconfig,
        AGENT_NAMESPACE,
        None,
        &env,
        &support::through_the_service_yaml(),
    );
    let as_addon = |ns: &str| {
        let user = format!("system:serviceaccount:{ns}:{ADDON_ACCOUNT}");
        let yaml = fleet.management.kubeconfig_yaml.clone();
        async move {
            let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
            let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .expect("config");
            config.auth_info.impersonate = Some(user);
            Client::try_from(config).expect("client")
        }
    };
    for ns in ["klusterlet-hc-a", "klusterlet-hc-b"] {
        let client = as_addon(ns).await;
        eventually(
            &format!("{ns}'s framework addon may list the template kind there"),
            Duration::from_secs(30),
            || {
                let api: Api<hcp_fleet_model::crd::AdmissionHealthPolicy> =
                    Api::namespaced(client.clone(), ns);
                async move {
                    api.list(&ListParams::default())
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await;
    }
    // An account of another name in such a namespace gains nothing.
    let other = {
        let kc = kube::config::Kubeconfig::from_yaml(&fleet.management.kubeconfig_yaml)
            .expect("kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        config.auth_info.impersonate = Some("system:serviceaccount:klusterlet-hc-a:someone".into());
        Client::try_from(config).expect("client")
    };
    assert_eq!(
        status_code(
            Api::<hcp_fleet_model::crd::AdmissionHealthPolicy>::namespaced(
                other,
                "klusterlet-hc-a"
            )
            .list(&ListParams::default())
            .await
        ),
        Some(403)
    );
    let subjects = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
        .get(&binding)
        .await
        .expect("binding")
        .subjects
        .unwrap_or_default();
    assert!(
        subjects.iter().all(|s| s.name == ADDON_ACCOUNT),
        "only the addon's accounts: {subjects:?}"
    );
    // The chart's own subject stays, so the chart (and ACM's ConfigurationPolicy) never
    // has to put it back.
    assert!(
        subjects
            .iter()
            .any(|s| s.namespace.as_deref() == Some("open-cluster-management-agent-addon")),
        "{subjects:?}"
    );

    acm_enforcing_the_generated_policy_undoes_nothing(&admin, &binding, &as_addon).await;

    // An ACM template of the agent's kind, owned by a Policy as ACM's framework addon leaves
    // it: the agent must write its status and the compliance Event on that Policy.
    let parent: hcp_fleet_model::crd::Policy = serde_json::from_value(json!({
        "apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
        "metadata": {"name": "fleet", "namespace": AGENT_NAMESPACE},
        "spec": {"disabled": false, "policy-templates": []},
    }))
    .expect("Policy");
    let parent = Api::<hcp_fleet_model::crd::Policy>::namespaced(admin.clone(), AGENT_NAMESPACE)
        .create(&PostParams::default(), &parent)
        .await
        .expect("create Policy");
    let template: hcp_fleet_model::crd::AdmissionHealthPolicy = serde_json::from_value(json!({
        "apiVersion": "hcp-fleet.openshift.io/v1alpha1", "kind": "AdmissionHealthPolicy",
        "metadata": {"name": "fleet-report", "namespace": AGENT_NAMESPACE, "ownerReferences": [{
            "apiVersion": "policy.open-cluster-management.io/v1", "kind": "Policy",
            "name": "fleet", "uid": parent.metadata.uid, "controller": true,
        }]},
        "spec": {"remediationAction": "inform"},
    }))
    .expect("template");
    let templates: Api<hcp_fleet_model::crd::AdmissionHealthPolicy> =
        Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("create template");

    // The whole job: both hosted clusters Compliant (admission service deployed, certificate
    // issued, webhooks installed, probe answered) in their health records, the template's
    // verdict written, events recorded.
    let records: Api<hcp_fleet_model::crd::AdmissionHealth> = Api::all(admin.clone());
    eventually(
        "the fleet is Compliant under the chart's RBAC",
        Duration::from_secs(90),
        || {
            let records = records.clone();
            let templates = templates.clone();
            async move {
                let list = records
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let state = |ns: &str| {
                    list.items
                        .iter()
                        .find(|p| {
                            p.metadata.namespace.as_deref() == Some(ns)
                                && hcp_fleet_render::reporting::record::is_health_record(p)
                        })
                        .and_then(|p| p.status.as_ref()?.compliant)
                        .map(|c| c.as_str())
                };
                for hc in ["hc-1", "hc-2"] {
                    if state(&hcp_namespace(hc)) != Some("Compliant") {
                        return Err(format!("{hc}: {:?}", state(&hcp_namespace(hc))));
                    }
                }
                let t = templates
                    .get("fleet-report")
                    .await
                    .map_err(|e| e.to_string())?;
                let st = t.status.unwrap_or_default();
                let total = st
                    .message
                    .as_deref()
                    .and_then(hcp_fleet_render::reporting::hub::summary_total);
                if st.compliant.map(|c| c.as_str()) != Some("Compliant") || total != Some(2) {
                    return Err(format!("template: {:?} {:?}", st.compliant, st.message));
                }
                Ok(())
            }
        },
    )
    .await;
    let health_events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), &hcp_namespace("hc-1"));
    let acm_events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    let parent_uid = parent.metadata.uid.clone();
    eventually(
        "events on the health record and on the template's Policy",
        Duration::from_secs(30),
        || {
            let health_events = health_events.clone();
            let acm_events = acm_events.clone();
            let parent_uid = parent_uid.clone();
            async move {
                let health = health_events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .iter()
                    .filter(|e| e.reason.as_deref() == Some("Compliant"))
                    .count();
                let acm = acm_events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .iter()
                    .filter(|e| {
                        e.reason.as_deref() == Some("policy: hcp-fleet-agent/fleet-report")
                            && e.involved_object.uid == parent_uid
                            && e.message
                                .as_deref()
                                .is_some_and(|m| m.starts_with("Compliant; "))
                    })
                    .count();
                if health > 0 && acm > 0 {
                    Ok(())
                } else {
                    Err(format!(
                        "{health} health event(s), {acm} compliance event(s)"
                    ))
                }
            }
        },
    )
    .await;
    let monitor = hcp_fleet_render::management::service_monitor_resource(
        hcp_fleet_render::config::MonitoringApi::Coreos,
    )
    .expect("group");
    for hc in ["hc-1", "hc-2"] {
        let ns = hcp_namespace(hc);
        Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &monitor)
            .get("hcp-fleet-admission")
            .await
            .expect("the agent wrote the ServiceMonitor");
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), &ns)
            .get("hcp-fleet-admission-prometheus")
            .await
            .expect("the agent bound the platform Prometheus");
    }
    let (_, body) = support::http_get(metrics_addr, "/metrics")
        .await
        .expect("metrics");
    assert!(
        body.contains("hcp_fleet_leader 1"),
        "it holds the Lease:\n{body}"
    );
    // Each phase's counter is there from the start, at zero; none may have risen.
    assert!(
        body.lines()
            .filter(|l| l.starts_with("hcp_fleet_reconcile_errors_total{"))
            .all(|l| l.ends_with(" 0")),
        "no reconcile failed for want of a right:\n{body}"
    );

    // Over HTTPS, /metrics answers only a token the chart's metrics.readers bind: none is 401,
    // another account's 403, the platform Prometheus's (openshift-monitoring/prometheus-k8s by
    // default) the metrics. The agent asks with the chart's RBAC (TokenReview, SAR).
    let token_of = |ns: &'static str, name: &'static str| {
        let admin = admin.clone();
        async move {
            hcp_fleet_testbed::fixtures::ensure_namespace(&admin, ns, Default::default())
                .await
                .expect("namespace");
            let sas = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin, ns);
            let sa: k8s_openapi::api::core::v1::ServiceAccount =
                serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
            let _ = sas.create(&PostParams::default(), &sa).await;
            let tr = sas
                .create_token_request(name, &PostParams::default(), &Default::default())
                .await
                .expect("token");
            tr.status.map(|s| s.token).expect("a token")
        }
    };
    let secure: std::net::SocketAddr = format!("127.0.0.1:{secure_port}").parse().expect("addr");
    let (code, _) = support::https_get_insecure(secure, "/metrics", None)
        .await
        .expect("https");
    assert_eq!(code, 401, "no token");
    let (code, _) = support::https_get_insecure(secure, "/metrics", Some("not-a-token"))
        .await
        .expect("https");
    assert_eq!(code, 401, "a token the API server does not know");
    let other = token_of("someone", "curious").await;
    let (code, body) = support::https_get_insecure(secure, "/metrics", Some(&other))
        .await
        .expect("https");
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:someone:curious"),
        "{body}"
    );
    let prometheus = token_of("openshift-monitoring", "prometheus-k8s").await;
    let (code, body) = support::https_get_insecure(secure, "/metrics", Some(&prometheus))
        .await
        .expect("https");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("hcp_fleet_leader 1"), "{body}");
    let (code, _) = support::https_get_insecure(secure, "/healthz", Some(&prometheus))
        .await
        .expect("https");
    assert_eq!(code, 404, "only /metrics is served over HTTPS");

    // The same identity, asked to do what the agent never does.
    let sa = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&impersonating_kubeconfig(
                &fleet.management.kubeconfig_yaml,
            ))
            .expect("kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("config"),
    )
    .expect("client");
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let hc1 = hcp_namespace("hc-1");
    let forbidden: Vec<(&str, Option<u16>)> = vec![
        (
            "list secrets in kube-system",
            status_code(Api::<Secret>::namespaced(sa.clone(), "kube-system").list(&ListParams::default()).await),
        ),
        (
            "list secrets in an HCP namespace",
            status_code(Api::<Secret>::namespaced(sa.clone(), &hc1).list(&ListParams::default()).await),
        ),
        (
            "list secrets cluster-wide",
            status_code(Api::<Secret>::all(sa.clone()).list(&ListParams::default()).await),
        ),
        (
            "read another secret in an HCP namespace (admin-kubeconfig)",
            status_code(Api::<Secret>::namespaced(sa.clone(), &hc1).get("admin-kubeconfig").await),
        ),
        (
            "create a ClusterRole",
            status_code(
                Api::<ClusterRole>::all(sa.clone())
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({"metadata": {"name": "escalate"}, "rules": []}))
                            .expect("cr"),
                    )
                    .await,
            ),
        ),
        (
            "patch its own ClusterRole",
            status_code(
                Api::<ClusterRole>::all(sa.clone())
                    .patch(
                        "hcp-fleet-agent",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})),
                    )
                    .await,
            ),
        ),
        (
            "bind cluster-admin under the name of its Prometheus binding",
            status_code(
                Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(sa.clone(), "kube-system")
                    .patch(
                        "hcp-fleet-admission-prometheus",
                        &PatchParams::apply("x"),
                        &Patch::Apply(json!({
                            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "hcp-fleet-admission-prometheus"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                            "subjects": [{"kind": "ServiceAccount", "name": "hcp-fleet-agent", "namespace": AGENT_NAMESPACE}],
                        })),
                    )
                    .await,
            ),
        ),
        (
            "create a webhook configuration on the management cluster",
            status_code(
                Api::<ValidatingWebhookConfiguration>::all(sa.clone())
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("vwc"),
                    )
                    .await,
            ),
        ),
        (
            "label a namespace",
            status_code(
                Api::<Namespace>::all(sa.clone())
                    .patch(
                        "kube-system",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
                    )
                    .await,
            ),
        ),
        (
            "apply a Deployment of another name in kube-system",
            status_code(
                Api::<Deployment>::namespaced(sa.clone(), "kube-system")
                    .patch(
                        "miner",
                        &PatchParams::apply("x"),
                        &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "miner"}})),
                    )
                    .await,
            ),
        ),
        (
            "create a pod",
            status_code(
                Api::<Pod>::namespaced(sa.clone(), &hc1)
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}))
                            .expect("pod"),
                    )
                    .await,
            ),
        ),
        (
            "delete a HostedControlPlane",
            status_code(
                Api::<hcp_fleet_model::crd::HostedControlPlane>::namespaced(sa.clone(), &hc1)
                    .delete("hc-1", &Default::default())
                    .await,
            ),
        ),
        (
            "write a ConfigMap (its own configuration)",
            status_code(
                Api::<ConfigMap>::namespaced(sa.clone(), AGENT_NAMESPACE)
                    .patch(
                        "hcp-fleet-agent-config",
                        &PatchParams::apply("x"),
                        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hcp-fleet-agent-config"}})),
                    )
                    .await,
            ),
        ),
    ];
    let allowed: Vec<_> = forbidden.iter().filter(|(_, c)| *c != Some(403)).collect();
    assert!(allowed.is_empty(), "not forbidden: {allowed:?}");
    // And what it must do is still allowed for that identity (the refusals above are about
    // the requests, not a broken identity).
    Api::<Secret>::namespaced(sa.clone(), &hc1)
        .get("service-network-admin-kubeconfig")
        .await
        .expect("the kubeconfig secret, by name");
    Api::<hcp_fleet_model::crd::HostedControlPlane>::all(sa.clone())
        .list(&ListParams::default())
        .await
        .expect("list HCPs");
    // Where the API server runs admission policies, the chart's management policy holds the
    // same identity to HCP namespaces, whatever RBAC allows it by name.
    if support::serves(
        &fleet.version,
        Feature::AdmissionPolicies,
        "the management ValidatingAdmissionPolicy refusing the agent's ServiceAccount a write outside an HCP namespace (its CEL is checked by the_management_policy_holds_… everywhere)",
    ) {
        let policy: Vec<Value> = render(&[
            "--api-versions",
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
        ])
        .into_iter()
        .filter(|o| {
            o["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
        })
        .collect();
        assert_eq!(policy.len(), 2);
        apply_all(&admin, &policy).await;
        // The agent writes by server-side apply, a PATCH by name, which RBAC grants it by
        // name in every namespace (a create names no object when RBAC is asked, so RBAC
        // refuses a create outside the names before admission runs: it would prove nothing
        // of the policy). The policy sees the apply as the CREATE it is.
        let secret = |ns: &str| {
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "hcp-fleet-admission-ca", "namespace": ns},
                "data": {},
            })
        };
        let dry = PatchParams::apply("e2e-dry-run").dry_run();
        let apply = |ns: String| {
            let sa = sa.clone();
            let body = secret(&ns);
            let dry = dry.clone();
            async move {
                Api::<Secret>::namespaced(sa, &ns)
                    .patch("hcp-fleet-admission-ca", &dry, &Patch::Apply(&body))
                    .await
            }
        };
        eventually(
            "the policy refuses a write outside an HCP namespace",
            Duration::from_secs(20),
            || async {
                match apply("default".to_string()).await {
                    Err(kube::Error::Api(s)) if s.message.contains("only in HCP namespaces") => {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        let in_hcp = apply(hc1.clone()).await;
        assert!(
            in_hcp.is_ok(),
            "the same write in an HCP namespace: {in_hcp:?}"
        );
    }
    // The HostedClusters' metadata and the klusterlets' kubeconfigs, by name: which HCP an
    // ACM managed cluster is (docs/reporting.md).
    Api::<kube::api::PartialObjectMeta<hcp_fleet_model::crd::HostedCluster>>::all(sa.clone())
        .list_metadata(&ListParams::default())
        .await
        .expect("list HostedClusters");
    Api::<Secret>::all(sa.clone())
        .list(&ListParams::default().fields("metadata.name=external-managed-kubeconfig"))
        .await
        .expect("list the klusterlets' kubeconfigs, by name");
    assert_eq!(
        status_code(
            Api::<Secret>::all(sa.clone())
                .list(&ListParams::default().fields("metadata.name=hub-kubeconfig-secret"))
                .await
        ),
        Some(403),
        "any other secret of a klusterlet"
    );
}

/// The account of ACM's governance framework addon, in every namespace it runs in.
const ADDON_ACCOUNT: &str = "governance-policy-framework-sa";

/// A framework addon's account in `ns` (made first), as ACM's hosted mode creates one per
/// hosted cluster in `klusterlet-<name>`.
async fn addon_account(admin: &Client, ns: &str) {
    hcp_fleet_testbed::fixtures::ensure_namespace(admin, ns, Default::default())
        .await
        .expect("namespace");
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": ADDON_ACCOUNT}})).expect("sa");
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap_or_else(|e| panic!("the addon's account in {ns}: {e}"));
}

/// ACM's config-policy-controller enforcing the generated Policy (policies/policy.yaml, fresh
/// by `committed_packaging_files_are_fresh`) on the template-sync binding while the agent runs,
/// as `support::acm::enforce` plays it: the binding is placed `musthave`, so ACM never strips
/// the subjects the agent adds. An older release's `mustonlyhave` (which did) is undone by the
/// agent within seconds. Then 60 s of enforcement once a second of every cluster-scoped RBAC
/// object the generated Policy places and the chart installed (the binding among them), with
/// one new addon account half-way: ACM writes none of them, the binding is written once (for
/// the new account), and no addon account is ever refused its template kind.
async fn acm_enforcing_the_generated_policy_undoes_nothing<F, Fut>(
    admin: &Client,
    binding: &str,
    as_addon: &F,
) where
    F: Fn(&str) -> Fut,
    Fut: std::future::Future<Output = Client>,
{
    use futures::StreamExt;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    use kube::runtime::watcher;
    let templates = support::acm::object_templates(&support::acm::hub_objects());
    let (ctype, template) = templates
        .iter()
        .find(|(_, o)| o["kind"] == "ClusterRoleBinding" && o["metadata"]["name"] == binding)
        .expect("the generated Policy places the template-sync binding");
    assert_eq!(ctype, "musthave", "{template}");
    let crb = ApiResource::erase::<ClusterRoleBinding>(&());
    let may_list = |ns: String| async move {
        let client = as_addon(&ns).await;
        Api::<hcp_fleet_model::crd::AdmissionHealthPolicy>::namespaced(client, &ns)
            .list(&ListParams::default())
            .await
            .is_ok()
    };

    // What an older release's Policy did: the chart's one subject, every other one gone.
    assert!(
        support::acm::enforce(admin, &crb, "mustonlyhave", template)
            .await
            .expect("enforce"),
        "mustonlyhave strips the agent's subjects"
    );
    for ns in ["klusterlet-hc-a", "klusterlet-hc-b"] {
        eventually(
            &format!("{ns}'s subject put back after mustonlyhave"),
            Duration::from_secs(10),
            || async move {
                if may_list(ns.to_string()).await {
                    Ok(())
                } else {
                    Err("forbidden".to_string())
                }
            },
        )
        .await;
    }

    // The binding's writes from here on, counted by a watch.
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = {
        let writes = writes.clone();
        let api = Api::<ClusterRoleBinding>::all(admin.clone());
        let cfg = watcher::Config::default().fields(&format!("metadata.name={binding}"));
        tokio::spawn(async move {
            let mut listed = false;
            let mut events = std::pin::pin!(watcher(api, cfg));
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => listed = true,
                    Ok(watcher::Event::Apply(_)) if listed => {
                        writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every cluster-scoped RBAC object the Policy places that the chart installed here.
    let mut placed = Vec::new();
    for (ct, t) in &templates {
        let resource = match t["kind"].as_str() {
            Some("ClusterRole") => {
                ApiResource::erase::<k8s_openapi::api::rbac::v1::ClusterRole>(&())
            }
            Some("ClusterRoleBinding") => ApiResource::erase::<ClusterRoleBinding>(&()),
            _ => continue,
        };
        let name = t["metadata"]["name"].as_str().unwrap_or_default();
        let there = Api::<DynamicObject>::all_with(admin.clone(), &resource)
            .get_opt(name)
            .await
            .expect("read")
            .is_some();
        if there {
            placed.push((resource, ct.as_str(), t));
        }
    }
    assert!(
        placed.len() >= 3,
        "the chart's cluster RBAC under the Policy: {}",
        placed.len()
    );
    let mut acm_writes = Vec::new();
    let mut refused = Vec::new();
    let t0 = std::time::Instant::now();
    let mut added = false;
    while t0.elapsed() < Duration::from_secs(60) {
        for (resource, ct, t) in &placed {
            if support::acm::enforce(admin, resource, ct, t)
                .await
                .expect("enforce")
            {
                acm_writes.push(format!("{} {}", t["kind"], t["metadata"]["name"]));
            }
        }
        for ns in ["klusterlet-hc-a", "klusterlet-hc-b"] {
            if !may_list(ns.to_string()).await {
                refused.push(format!("{ns} at {:?}", t0.elapsed()));
            }
        }
        if !added && t0.elapsed() > Duration::from_secs(30) {
            addon_account(admin, "klusterlet-hc-c").await;
            added = true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    counter.abort();
    assert!(
        may_list("klusterlet-hc-c".to_string()).await,
        "the new account's subject"
    );
    assert!(
        acm_writes.is_empty(),
        "ACM found every object as its Policy says, every time: it wrote {acm_writes:?}"
    );
    assert!(refused.is_empty(), "addon accounts refused: {refused:?}");
    let n = writes.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        n, 1,
        "the binding written once, for the one new account: {n}"
    );
}
