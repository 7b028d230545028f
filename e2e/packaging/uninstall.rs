//! helm uninstall: the pre-delete hook stops the agent, removes webhooks then admission services; the CRDs and overrides stay.

use super::*;

/// `helm uninstall`'s pre-delete Job, as the chart renders it: its ServiceAccount and RBAC
/// applied for real, its own arguments, acting as that ServiceAccount. It scales the agent's
/// Deployment to zero and waits for the leader to hand back the Lease (the test plays the
/// kubelet: the agent process gets SIGTERM once its Deployment is at zero), then removes the
/// hosted webhooks and, after them, the admission service and everything beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(unsafe_code)]
async fn the_uninstall_hook_stops_the_agent_then_removes_webhooks_and_admission_services() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::rbac::v1::RoleBinding;
    let (fleet, admin, _pods) = support::fleet_with_pods(1).await;
    support::install_monitoring_crds(&admin).await;
    let objs = render(&[]);
    // The uninstall hook's objects (the helm test's pod is a hook too, of another kind).
    let hooks: Vec<&Value> = objs
        .iter()
        .filter(|o| is_hook(o) && o["metadata"]["annotations"]["helm.sh/hook"] != "test")
        .collect();
    let kinds: Vec<&str> = hooks.iter().filter_map(|o| o["kind"].as_str()).collect();
    for k in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Job",
    ] {
        assert!(kinds.contains(&k), "the hook has a {k}: {kinds:?}");
    }
    let weight = |o: &Value| -> i64 {
        o["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    };
    let job = *hooks.iter().find(|o| o["kind"] == "Job").expect("Job");
    for h in &hooks {
        assert_eq!(h["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
        if h["kind"] != "Job" {
            assert!(
                weight(h) < weight(job),
                "RBAC before the Job: {}",
                h["metadata"]["name"]
            );
        }
    }
    // The agent's Deployment as the chart renders it (the object the hook scales; no kubelet
    // runs it, the agent below is its pod), and the hook's RBAC.
    let deployment = objs
        .iter()
        .find(|o| o["kind"] == "Deployment" && !is_hook(o))
        .expect("the agent's Deployment");
    apply_all(
        &admin,
        hooks
            .iter()
            .filter(|o| o["kind"] != "Job")
            .copied()
            .chain([deployment]),
    )
    .await;
    let agent_name = deployment["metadata"]["name"].as_str().expect("name");

    // The agent, leading, until the fleet is Compliant.
    let dir = tempfile::tempdir().expect("tmp");
    // Every guard on its webhook, so that the hosted cluster calls an admission service for
    // the hook to remove, on every server.
    let (mut agent, _) = support::spawn_elected_agent_yaml(
        "agent-hook",
        &fleet.management.kubeconfig_path,
        AGENT_NAMESPACE,
        None,
        &[],
        &support::through_the_service_yaml(),
    );
    let ns = hcp_namespace("hc-1");
    let records: Api<hcp_fleet_model::crd::AdmissionHealth> = Api::namespaced(admin.clone(), &ns);
    eventually("hc-1 Compliant", Duration::from_secs(90), || {
        let records = records.clone();
        async move {
            let r = records.get("hc-1").await.map_err(|e| e.to_string())?;
            match r.status.and_then(|s| s.compliant).map(|c| c.as_str()) {
                Some("Compliant") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let monitor = hcp_fleet_render::management::service_monitor_resource(
        hcp_fleet_render::config::MonitoringApi::Coreos,
    )
    .expect("group");
    let monitors = Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &monitor);
    monitors
        .get("hcp-fleet-admission")
        .await
        .expect("a ServiceMonitor to remove");

    // The Job's command, as the Job's ServiceAccount; only the configuration file is the
    // test bed's (its loopback API servers).
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, hcp_fleet_testbed::agent_config_yaml()).expect("config");
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("arg");
            if a.starts_with("--config=") {
                format!("--config={}", config.display())
            } else {
                a.to_string()
            }
        })
        .collect();
    let sa = format!(
        "system:serviceaccount:{AGENT_NAMESPACE}:{}",
        job["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName")
    );
    let kubeconfig = dir.path().join("hook.kubeconfig");
    std::fs::write(
        &kubeconfig,
        impersonating(&fleet.management.kubeconfig_yaml, &sa),
    )
    .expect("kubeconfig");
    let hook = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the hook's command");
    let hook = tokio::task::spawn_blocking(move || hook.wait_with_output());

    // The kubelet's part: a Deployment at zero replicas stops its pod (SIGTERM: the leader
    // hands the Lease back as it would in a pod).
    let deployments = Api::<Deployment>::namespaced(admin.clone(), AGENT_NAMESPACE);
    eventually(
        "the hook scales the agent to zero",
        Duration::from_secs(30),
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments
                    .get(agent_name)
                    .await
                    .map_err(|e| e.to_string())?;
                match d.spec.and_then(|s| s.replicas) {
                    Some(0) => Ok(()),
                    other => Err(format!("replicas {other:?}")),
                }
            }
        },
    )
    .await;
    let pid = i32::try_from(agent.0.id()).expect("pid");
    // SAFETY: signalling a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let _ = agent.0.wait();

    let out = tokio::time::timeout(Duration::from_secs(90), hook)
        .await
        .expect("the hook finishes")
        .expect("join")
        .expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("scaled to 0"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{ns}: removed {} hosted object(s)",
            support::hosted_objects(&support::through_the_service(), &fleet.version)
        )),
        "{stdout}"
    );
    let hc1 = fleet
        .hosted("hc-1")
        .expect("hc-1")
        .client()
        .await
        .expect("hc-1");
    assert_eq!(support::owned_hosted_objects(&hc1).await, 0);
    let svc = "hcp-fleet-admission";
    let deployments = Api::<Deployment>::namespaced(admin.clone(), &ns);
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), &ns);
    assert!(
        support::absent(&deployments, svc).await,
        "admission Deployment"
    );
    assert!(support::absent(&monitors, svc).await, "ServiceMonitor");
    assert!(
        support::absent(&bindings, &format!("{svc}-prometheus")).await,
        "RoleBinding"
    );
    assert!(
        support::absent(&records, support::record_of(&ns)).await,
        "health record"
    );
}

/// `helm install` then `helm uninstall` for real against the test bed's API server. A failed
/// pre-delete hook leaves no RBAC behind. The CRDs stay (`helm.sh/resource-policy: keep`),
/// and with them an SRE's override and its reason. (The second uninstall runs `--no-hooks`:
/// the pre-delete Job needs a kubelet that runs Jobs; the hook's command is tested apart,
/// above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_keeps_the_crds_and_the_overrides() {
    use hcp_fleet_model::crd::admission_rollout::HostedAdmissionOverride;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let fleet = hcp_fleet_testbed::LocalFleet::start(hcp_fleet_testbed::FleetOptions {
        install_fixtures: false,
        ..hcp_fleet_testbed::FleetOptions::with_hosted(0)
    })
    .await
    .expect("fleet");
    let admin = fleet.management.client().await.expect("client");
    support::install_monitoring_crds(&admin).await;
    let kubeconfig = fleet
        .management
        .kubeconfig_path
        .to_string_lossy()
        .into_owned();
    run_helm(&[
        "install",
        "hcp-fleet-agent",
        CHART,
        "--namespace",
        AGENT_NAMESPACE,
        "--create-namespace",
        // Only ServiceMonitor's trimmed CRD is served here, not PrometheusRule's: the chart
        // asks the server and leaves the rule out by itself.
        "--kubeconfig",
        &kubeconfig,
    ]);
    let ns = "clusters-hc-1";
    hcp_fleet_testbed::fixtures::ensure_namespace(&admin, ns, Default::default())
        .await
        .expect("namespace");
    let o: HostedAdmissionOverride = serde_json::from_value(json!({
        "apiVersion": "hcp-fleet.openshift.io/v1alpha1",
        "kind": "HostedAdmissionOverride",
        "metadata": {"name": "override"},
        "spec": {"reason": "OHSS-1234: the customer's migration", "paused": true},
    }))
    .expect("override");
    let overrides = Api::<HostedAdmissionOverride>::namespaced(admin.clone(), ns);
    overrides
        .create(&Default::default(), &o)
        .await
        .expect("an override");
    // First with its pre-delete hook, which cannot finish here (no kubelet runs its Job): the
    // uninstall fails, and Helm removes the hook's ServiceAccount and RBAC (hook-succeeded,
    // which Helm 4 applies to the hooks before a failed one), keeping the Job for its logs.
    let failed = Command::new(helm())
        .args([
            "uninstall",
            "hcp-fleet-agent",
            "--namespace",
            AGENT_NAMESPACE,
            "--timeout",
            "5s",
            "--kubeconfig",
            &kubeconfig,
        ])
        .current_dir(repo())
        .output()
        .expect("helm");
    assert!(!failed.status.success(), "the hook could not finish here");
    let hook = "hcp-fleet-agent-uninstall";
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let gone = [
        Api::<ClusterRole>::all(admin.clone())
            .get_opt(hook)
            .await
            .expect("get")
            .is_none(),
        Api::<ClusterRoleBinding>::all(admin.clone())
            .get_opt(hook)
            .await
            .expect("get")
            .is_none(),
        Api::<Role>::namespaced(admin.clone(), AGENT_NAMESPACE)
            .get_opt(hook)
            .await
            .expect("get")
            .is_none(),
        Api::<RoleBinding>::namespaced(admin.clone(), AGENT_NAMESPACE)
            .get_opt(hook)
            .await
            .expect("get")
            .is_none(),
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
            admin.clone(),
            AGENT_NAMESPACE,
        )
        .get_opt(hook)
        .await
        .expect("get")
        .is_none(),
    ];
    assert_eq!(
        gone, [true; 5],
        "the failed hook's ServiceAccount and RBAC are gone"
    );
    assert!(
        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(admin.clone(), AGENT_NAMESPACE)
            .get_opt(hook)
            .await
            .expect("get")
            .is_some(),
        "the failed Job stays, for its logs"
    );
    run_helm(&[
        "uninstall",
        "hcp-fleet-agent",
        "--namespace",
        AGENT_NAMESPACE,
        "--no-hooks",
        "--wait",
        "--kubeconfig",
        &kubeconfig,
    ]);
    // The release is gone (its Deployment with it), the CRDs and the override are not.
    let gone =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(admin.clone(), AGENT_NAMESPACE)
            .get_opt("hcp-fleet-agent")
            .await
            .expect("get");
    assert!(gone.is_none(), "the release was uninstalled");
    for crd in hcp_fleet_model::crd::health::crds() {
        let name = crd["metadata"]["name"].as_str().expect("name");
        let kept = Api::<CustomResourceDefinition>::all(admin.clone())
            .get_opt(name)
            .await
            .expect("get");
        let kept = kept.unwrap_or_else(|| panic!("{name} was deleted"));
        assert!(
            kept.metadata.deletion_timestamp.is_none(),
            "{name} is being deleted"
        );
    }
    let kept = overrides.get("override").await.expect("the override stays");
    assert_eq!(
        kept.spec.reason.as_deref(),
        Some("OHSS-1234: the customer's migration")
    );

    // What the failed hook left (hooks are no part of a release, so --no-hooks leaves them),
    // removed by its label as docs/operations.md says.
    let path = fleet.management.kubeconfig_path.clone();
    let selector = "hcp-fleet.openshift.io/helm-hook=hcp-fleet-agent";
    for args in [
        &[
            "-n",
            AGENT_NAMESPACE,
            "delete",
            "job,pod,serviceaccount,role,rolebinding",
            "-l",
            selector,
        ][..],
        &["delete", "clusterrole,clusterrolebinding", "-l", selector][..],
    ] {
        let (ok, out, err) = support::kubectl_with(&path, args);
        assert!(ok, "{out}{err}");
    }
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(admin.clone(), AGENT_NAMESPACE);
    let left = jobs
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .expect("list");
    assert!(
        left.items
            .iter()
            .all(|j| j.metadata.deletion_timestamp.is_some()),
        "the hook's Job is gone or going"
    );

    // CRDs some other tool made (`make demo`, `kubectl apply`, ACM): no Helm label or
    // annotations. Helm refuses to install over them until the documented commands give them to
    // the release; then a release of another name installs.
    let crd_names: Vec<String> = hcp_fleet_model::crd::health::crds()
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let crds = Api::<CustomResourceDefinition>::all(admin.clone());
    for name in &crd_names {
        crds.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {
                "labels": {"app.kubernetes.io/managed-by": null},
                "annotations": {
                    "meta.helm.sh/release-name": null,
                    "meta.helm.sh/release-namespace": null,
                },
            }})),
        )
        .await
        .expect("as another tool leaves a CRD");
    }
    let install = || {
        Command::new(helm())
            .args([
                "install",
                "fleet-2",
                CHART,
                "--namespace",
                AGENT_NAMESPACE,
                "--kubeconfig",
                &kubeconfig,
            ])
            .current_dir(repo())
            .output()
            .expect("helm")
    };
    let refused = install();
    assert!(
        !refused.status.success(),
        "Helm adopts nothing it was not given"
    );
    let names: Vec<&str> = crd_names.iter().map(String::as_str).collect();
    let mut label = vec!["label", "crd"];
    label.extend(&names);
    label.extend(["--overwrite", "app.kubernetes.io/managed-by=Helm"]);
    let mut annotate = vec!["annotate", "crd"];
    annotate.extend(&names);
    annotate.extend([
        "--overwrite",
        "meta.helm.sh/release-name=fleet-2",
        "meta.helm.sh/release-namespace=hcp-fleet-agent",
    ]);
    for args in [label, annotate] {
        let (ok, out, err) = support::kubectl_with(&path, &args);
        assert!(ok, "{out}{err}");
    }
    let installed = install();
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
}
