//! The test bed itself, against real etcd and kube-apiservers: a management and two hosted
//! API servers come up, serve the project's CRDs and fixtures, and leave nothing behind.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hcp_fleet_model::crd::HCP_NAMESPACE_LABEL;

use hcp_fleet_model::crd::HostedControlPlane;

use hcp_fleet_model::crd::Policy;

use hcp_fleet_model::crd::PolicySpec;
use hcp_fleet_testbed as localcp;
use hcp_fleet_testbed::assets::Feature;
use hcp_fleet_testbed::fixtures::{SERVICE_NETWORK_KUBECONFIG, hcp_namespace};
use hcp_fleet_testbed::{FleetOptions, LocalCpError, LocalFleet};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};

use support::{assets_or_skip_reason, processes_mentioning, wait_gone};

#[tokio::test]
async fn management_and_two_hosted_clusters_serve_crds_and_fixtures() {
    let parent = tempfile::tempdir().expect("tempdir");
    let opts = FleetOptions {
        state_parent: Some(parent.path().to_path_buf()),
        ..FleetOptions::with_hosted(2)
    };
    let fleet = LocalFleet::start(opts).await.expect("fleet starts");
    let state = fleet.state_dir().to_path_buf();
    let pids = fleet.pids();
    assert_eq!(pids.len(), 4, "etcd + management + 2 hosted: {pids:?}");

    let mgmt = fleet.management.client().await.expect("management client");
    let v = mgmt.apiserver_version().await.expect("management /version");
    assert_eq!(
        v.git_version, fleet.version.full,
        "the server serves the version its binary reports"
    );

    // HyperShift's own HCP CRD where the server takes its CEL rules and the asset script
    // provided it (CI, with ../shared beside the clone), the trimmed one otherwise.
    let crd = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(mgmt.clone())
        .get("hostedcontrolplanes.hypershift.openshift.io")
        .await
        .expect("HCP CRD");
    let upstream = kube::ResourceExt::annotations(&crd)
        .contains_key("api.openshift.io/merged-by-featuregates");
    let expect_upstream = support::serves(
        &fleet.version,
        Feature::CrdCel,
        "HyperShift's own HostedControlPlane CRD (the project's trimmed one is installed)",
    ) && fleet
        .upstream_crd(localcp::assets::UPSTREAM_HCP_CRD)
        .is_some();
    assert_eq!(
        upstream, expect_upstream,
        "which HCP CRD the fleet installed"
    );
    eprintln!(
        "HCP CRD on {}: {}",
        fleet.version,
        if upstream {
            "HyperShift's own"
        } else {
            "trimmed"
        }
    );

    // ACM's current Policy CRD where the asset script or HCP_FLEET_UPSTREAM_CRDS provided it
    // (its spec has `hubTemplateOptions`, which the trimmed one leaves out).
    let policy_crd = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(mgmt.clone())
        .get("policies.policy.open-cluster-management.io")
        .await
        .expect("Policy CRD");
    let spec_fields = serde_json::to_value(&policy_crd.spec.versions[0].schema)
        .expect("schema")["openAPIV3Schema"]["properties"]["spec"]["properties"]
        .clone();
    assert_eq!(
        spec_fields.get("hubTemplateOptions").is_some(),
        fleet
            .upstream_crd(localcp::assets::UPSTREAM_POLICY_CRD_CURRENT)
            .is_some(),
        "ACM's current Policy CRD exactly where it was provided"
    );

    // The CRDs are served and the fixtures read back as typed objects.
    let hcps: Api<HostedControlPlane> = Api::all(mgmt.clone());
    let list = hcps.list(&ListParams::default()).await.expect("list HCPs");
    let mut names: Vec<String> = list
        .items
        .iter()
        .map(|h| h.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    assert_eq!(names, vec!["hc-1", "hc-2"]);
    for hcp in &list.items {
        assert!(
            hcp.is_ready(),
            "fixture HCP is ready with a kubeconfig: {hcp:?}"
        );
        assert!(
            hcp.spec.extra.contains_key("platform"),
            "unknown spec fields preserved"
        );
    }
    let policies: Api<Policy> = Api::namespaced(mgmt.clone(), "default");
    let p = Policy::new(
        "probe",
        PolicySpec {
            disabled: false,
            remediation_action: Some("enforce".into()),
            policy_templates: vec![],
        },
    );
    policies
        .create(&PostParams::default(), &p)
        .await
        .expect("Policy CRD served");

    // docs/testbed.md's quirk, checked where it lives: the 1.20 build turns "" into null in a
    // merge patch of a custom resource's status (and the schema then refuses it); 1.21 and later keep
    // the empty string.
    let patch = serde_json::json!({"status": {"status": [
        {"clustername": "a", "clusternamespace": "", "compliant": "Compliant"}
    ]}});
    let written = policies
        .patch_status(
            "probe",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await;
    let kept = written.ok().and_then(|p| {
        let v = serde_json::to_value(p).ok()?;
        v["status"]["status"][0]["clusternamespace"]
            .as_str()
            .map(str::to_string)
    });
    if fleet.version.at_least(1, 21) {
        assert_eq!(
            kept.as_deref(),
            Some(""),
            "{}: an empty string survives a status merge patch",
            fleet.version
        );
    } else {
        assert_ne!(
            kept.as_deref(),
            Some(""),
            "{}: the documented quirk is gone; update docs/testbed.md",
            fleet.version
        );
    }

    for name in ["hc-1", "hc-2"] {
        let ns_name = hcp_namespace(name);
        let ns = Api::<Namespace>::all(mgmt.clone())
            .get(&ns_name)
            .await
            .expect("HCP namespace");
        let labels = ns.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get(HCP_NAMESPACE_LABEL).map(String::as_str),
            Some("true")
        );

        // The secret HyperShift publishes reaches that hosted kube-apiserver, and only it.
        let secret = Api::<Secret>::namespaced(mgmt.clone(), &ns_name)
            .get(SERVICE_NETWORK_KUBECONFIG)
            .await
            .expect("kubeconfig secret");
        let data = secret.data.unwrap_or_default();
        let kubeconfig = data.get("kubeconfig").expect("key kubeconfig");
        let yaml = String::from_utf8(kubeconfig.0.clone()).expect("utf8");
        let hosted = localcp::client_from_kubeconfig(name, &yaml)
            .await
            .expect("client from secret");
        let hv = hosted.apiserver_version().await.expect("hosted /version");
        assert_eq!(hv.git_version, fleet.version.full);
        // Separate etcd prefixes: the hosted cluster has no HCP namespaces of its own.
        let hosted_ns = Api::<Namespace>::all(hosted.clone())
            .list(&ListParams::default())
            .await
            .expect("list");
        assert!(
            hosted_ns
                .items
                .iter()
                .all(|n| n.metadata.name.as_deref() != Some(ns_name.as_str()))
        );
        let expected_port = fleet.hosted(name).expect("known").port;
        assert!(yaml.contains(&format!("https://127.0.0.1:{expected_port}")));
    }

    drop(fleet);
    for pid in pids {
        assert!(
            wait_gone(pid, Duration::from_secs(5)),
            "process {pid} still running after drop"
        );
    }
    assert!(
        processes_mentioning(&state).is_empty(),
        "no process refers to the state dir"
    );
    assert!(!state.exists(), "state dir removed on drop");
}

#[tokio::test]
async fn unusable_assets_dir_is_a_clear_error() {
    let empty = tempfile::tempdir().expect("tempdir");
    let opts = FleetOptions {
        assets_dir: Some(empty.path().to_path_buf()),
        ..FleetOptions::with_hosted(1)
    };
    let err = LocalFleet::start(opts).await.err().expect("must fail");
    let msg = err.to_string();
    assert!(matches!(err, LocalCpError::Assets { .. }), "{msg}");
    assert!(msg.contains("kube-apiserver is missing"), "{msg}");
    assert!(
        msg.contains("hack/testbed-assets.sh"),
        "says how to fix it: {msg}"
    );
}

#[tokio::test]
async fn the_asset_script_rejects_an_unusable_kubebuilder_assets() {
    let empty = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../hack/testbed-assets.sh"
        ))
        .env("KUBEBUILDER_ASSETS", empty.path())
        .output()
        .expect("run script");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing on stdout on failure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is unusable"), "{stderr}");
    assert!(stderr.contains("kube-apiserver"), "{stderr}");
}

#[tokio::test]
async fn the_asset_script_honours_a_usable_kubebuilder_assets() {
    let dir = match assets_or_skip_reason() {
        Ok(a) => a.dir,
        Err(e) => panic!("test bed assets missing: {e}"),
    };
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../hack/testbed-assets.sh"
        ))
        .env("KUBEBUILDER_ASSETS", &dir)
        .output()
        .expect("run script");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        dir.display().to_string()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "no rebuild when assets exist"
    );
}

#[tokio::test]
async fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let parent = tempfile::tempdir().expect("tempdir");
    let opts = FleetOptions {
        management_port: Some(port),
        state_parent: Some(parent.path().to_path_buf()),
        ..FleetOptions::with_hosted(1)
    };
    let started = Instant::now();
    let err = LocalFleet::start(opts).await.err().expect("must fail");
    assert!(
        matches!(&err, LocalCpError::PortInUse { port: p, .. } if *p == port),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("port {port}")), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "fails fast, never hangs"
    );
    assert!(processes_mentioning(parent.path()).is_empty());
}

#[tokio::test]
async fn an_apiserver_that_fails_to_start_shows_its_log_tail() {
    let parent = tempfile::tempdir().expect("tempdir");
    let opts = FleetOptions {
        extra_apiserver_args: vec!["--no-such-flag=1".into()],
        state_parent: Some(parent.path().to_path_buf()),
        ..FleetOptions::with_hosted(1)
    };
    let started = Instant::now();
    let err = LocalFleet::start(opts).await.err().expect("must fail");
    let msg = err.to_string();
    assert!(matches!(err, LocalCpError::Exited { .. }), "{msg}");
    assert!(
        msg.contains("unknown flag: --no-such-flag"),
        "log tail shown: {msg}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "never hangs");
    // etcd, already running when the API server failed, is stopped too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_mentioning(parent.path()).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        processes_mentioning(parent.path()).is_empty(),
        "no orphans after a failed start"
    );
    let leftovers: Vec<_> = std::fs::read_dir(parent.path()).expect("read").collect();
    assert!(
        leftovers.is_empty(),
        "state dir removed after a failed start"
    );
}

/// `dev` (`cmd`) on the test bed's assets, its stdout's lines sent as they come.
fn spawn_dev(
    mut cmd: Command,
    assets: &hcp_fleet_testbed::assets::Assets,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = cmd
        .env("KUBEBUILDER_ASSETS", &assets.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dev");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Ctrl-C to `dev`: it exits, cleanly, within 30 s.
// Sends a signal to a child process (libc::kill).
#[allow(unsafe_code)]
fn ctrl_c(child: &mut std::process::Child) {
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "dev did not exit on Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit on Ctrl-C: {status}");
}

/// `dev` as a user runs it: up, reachable with kubectl, Ctrl-C, nothing left.
#[tokio::test]
async fn dev_runs_until_ctrl_c_and_leaves_no_orphans() {
    let assets = assets_or_skip_reason().expect("test bed assets");
    let parent = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"));
    cmd.args(["dev", "--hosted-clusters", "1", "--state-parent"])
        .arg(parent.path());
    let (mut child, rx) = spawn_dev(cmd, &assets);
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !lines.iter().any(|l: &String| l == "READY") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("dev did not become ready: {lines:?}");
            }
        }
    }
    let pids: Vec<u32> = lines
        .iter()
        .find_map(|l| l.strip_prefix("pids: "))
        .expect("pids line")
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(pids.len(), 3, "etcd, management, one hosted: {lines:?}");
    // The admission services, as the fleet's table is followed by: none on a server where every
    // guard runs inside the hosted kube-apiserver (1.36 with the defaults), pods elsewhere.
    let admission = lines
        .iter()
        .skip_while(|l| !l.starts_with("Admission services"))
        .nth(1)
        .expect("the admission services' lines")
        .trim_start();
    assert!(admission.starts_with("hc-1 "), "{admission}");
    if assets
        .version
        .serves(hcp_fleet_testbed::assets::Feature::MutatingPolicies)
    {
        assert!(
            admission.contains("no admission pods") && !admission.contains("webhook="),
            "{admission}"
        );
    } else {
        assert!(
            admission.contains("2 admission pod(s)") && admission.contains("webhook="),
            "{admission}"
        );
    }

    // A user's kubectl (the one built with the servers) talks to the hosted cluster.
    let hosted_kc = lines
        .iter()
        .find(|l| l.trim_start().starts_with("hc-1 "))
        .and_then(|l| l.split_whitespace().last())
        .expect("hc-1 kubeconfig line")
        .to_string();
    let out = Command::new(&assets.kubectl)
        .args([
            "--kubeconfig",
            &hosted_kc,
            "get",
            "namespaces",
            "-o",
            "name",
        ])
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
    // The agent's /metrics, at the address printed, with the fleet's series.
    let addr: std::net::SocketAddr = lines
        .iter()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix("curl -s http://")?
                .split('/')
                .next()?
                .parse()
                .ok()
        })
        .expect("the agent's /metrics address");
    let (code, body) = support::http_get(addr, "/metrics").await.expect("/metrics");
    assert_eq!(code, 200);
    assert!(
        body.contains("hcp_fleet_hosted_cluster_compliance{hcp_namespace=\"clusters-hc-1\""),
        "{body}"
    );

    // Ctrl-C.
    ctrl_c(&mut child);
    for pid in pids {
        assert!(
            wait_gone(pid, Duration::from_secs(5)),
            "process {pid} survived Ctrl-C"
        );
    }
    assert!(processes_mentioning(parent.path()).is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(parent.path()).expect("read").collect();
    assert!(leftovers.is_empty(), "state dir removed: {leftovers:?}");
}

/// `dev --config FILE --acm`: the agent runs with the file (a guard disabled), takes a change
/// to it while running (the guard back), and refuses a bad one, keeping the last good one, as
/// the agent does with its own file; and the hub's rows are printed as ACM shows them (the
/// fleet's, and the hosted cluster's own).
#[tokio::test]
async fn dev_takes_a_configuration_file_reads_it_again_and_shows_the_hubs_rows() {
    const GUARD: &str = "featuregate.hcp-fleet.openshift.io";
    let assets = assets_or_skip_reason().expect("test bed assets");
    let parent = tempfile::tempdir().expect("tempdir");
    let config = parent.path().join("agent.yaml");
    std::fs::write(&config, format!("disabledGuards: [{GUARD}]\n")).expect("config");
    let state = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"));
    cmd.args(["dev", "--hosted-clusters", "1", "--acm", "--config"])
        .arg(&config)
        .arg("--state-parent")
        .arg(state.path());
    let (mut child, rx) = spawn_dev(cmd, &assets);
    let mut lines: Vec<String> = Vec::new();
    let until = |what: &str, within: Duration, lines: &mut Vec<String>| {
        let deadline = Instant::now() + within;
        while !lines.iter().any(|l| l.contains(what)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => lines.push(l),
                Err(_) => panic!("dev did not print {what:?}: {lines:?}"),
            }
        }
    };
    until("READY", Duration::from_secs(120), &mut lines);
    let mgmt_kc = lines
        .iter()
        .find(|l| l.contains("get hostedcontrolplanes -A"))
        .and_then(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "--kubeconfig")
                .nth(1)
        })
        .expect("the management kubeconfig line")
        .to_string();
    // The guard's path on hc-1's record ("none" when it is not there).
    let path = || {
        let out = Command::new(&assets.kubectl)
            .args(["--kubeconfig", &mgmt_kc, "get", "admissionhealths", "-n"])
            .arg(hcp_namespace("hc-1"))
            .args(["-o", "json"])
            .output()
            .expect("kubectl");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let guards = v["items"][0]["status"]["guards"].as_array().cloned();
        let guards = guards.unwrap_or_default();
        let path = guards
            .iter()
            .find(|g| g["name"] == GUARD)
            .and_then(|g| g["path"].as_str())
            .unwrap_or("none")
            .to_string();
        (guards.len(), path)
    };
    // The hub's rows, before READY: the management cluster's (the fleet) and hc-1's own.
    let hub: Vec<&String> = lines
        .iter()
        .skip_while(|l| !l.starts_with("ACM hub"))
        .skip(1)
        .take(2)
        .collect();
    assert!(
        hub.iter()
            .any(|l| l.trim_start().starts_with("klusterlet-hc-1")
                && l.contains("Compliant")
                && l.contains("hc-1 (HCP clusters-hc-1/hc-1)")),
        "{lines:?}"
    );
    assert!(
        hub.iter()
            .any(|l| l.trim_start().starts_with("local-cluster")
                && l.contains("Compliant")
                && l.contains("1 of 1 hosted cluster(s) compliant")),
        "{lines:?}"
    );
    let (n, started) = path();
    assert!(n > 5, "hc-1's record names {n} guards");
    assert_eq!(started, "none", "{GUARD} is disabled by the file");

    std::fs::write(&config, "disabledGuards: []\n").expect("config");
    until(
        "configuration reloaded from",
        Duration::from_secs(20),
        &mut lines,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while path().1 == "none" {
        assert!(
            Instant::now() < deadline,
            "{GUARD} did not come back: {lines:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let back = path().1;

    std::fs::write(&config, "concurrency: 0\n").expect("config");
    until("configuration refused", Duration::from_secs(20), &mut lines);
    // The problem, on the lines under it.
    until(
        "concurrency must be at least 1",
        Duration::from_secs(5),
        &mut lines,
    );
    assert!(
        child.try_wait().expect("wait").is_none(),
        "dev ended on a bad file"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(path().1, back, "the last good configuration runs on");

    ctrl_c(&mut child);
}

/// `render` as an operator runs it: offline, every object, no private key, and every object
/// accepted by a real kube-apiserver (server-side dry run): the management objects in their
/// namespace, the hosted ones (webhook configurations, and admission policies whose CEL the
/// server compiles) as a hosted kube-apiserver of the same version would take them.
#[tokio::test]
async fn render_prints_objects_a_real_apiserver_accepts() {
    let fleet = LocalFleet::start(FleetOptions::with_hosted(0))
        .await
        .expect("fleet");
    // As the agent would for this server: policy/v1 PDBs from 1.21 on, v1beta1 before.
    let mut args = vec!["render", "--namespace", "clusters-hc-1"];
    if !fleet.version.serves(Feature::PolicyV1) {
        args.push("--no-policy-v1");
    }
    if !fleet.version.serves(Feature::MatchConditions) {
        args.push("--no-match-conditions");
    }
    if !fleet.version.serves(Feature::AdmissionPolicies) {
        args.push("--no-admission-policies");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .args(&args)
        .output()
        .expect("render");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("utf8");
    assert!(!yaml.contains("PRIVATE KEY"));
    let mgmt = fleet.management.client().await.expect("client");
    localcp::fixtures::ensure_namespace(&mgmt, "clusters-hc-1", Default::default())
        .await
        .expect("namespace");
    // The ServiceMonitor is judged against the (trimmed) Prometheus Operator CRD.
    support::install_monitoring_crds(&mgmt).await;
    let mut kinds = Vec::new();
    let mut hosted_kinds = Vec::new();
    for doc in yaml.split("---\n").filter(|d| d.contains("kind:")) {
        let v: serde_json::Value = serde_saphyr::from_str(doc).expect("yaml");
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        let hosted = doc.starts_with("# applied to the hosted cluster");
        let obj: kube::api::DynamicObject = serde_json::from_value(v.clone()).expect("object");
        let (group, version) = match v["apiVersion"].as_str().unwrap_or_default().split_once('/') {
            Some((g, ver)) => (g.to_string(), ver.to_string()),
            None => (
                String::new(),
                v["apiVersion"].as_str().unwrap_or_default().to_string(),
            ),
        };
        let gvk = kube::core::GroupVersionKind::gvk(&group, &version, &kind);
        let (ar, _) = kube::discovery::pinned_kind(&mgmt, &gvk)
            .await
            .expect("served kind");
        let api: Api<kube::api::DynamicObject> = if hosted {
            Api::all_with(mgmt.clone(), &ar)
        } else {
            Api::namespaced_with(mgmt.clone(), "clusters-hc-1", &ar)
        };
        // Strict: a field the server does not know fails (servers before 1.23 ignore the
        // directive; `hcp_fleet_agent`'s typed renderers cannot misspell one).
        let pp = kube::api::PatchParams::apply("render-check")
            .dry_run()
            .validation_strict();
        api.patch(
            &obj.metadata.name.clone().unwrap_or_default(),
            &pp,
            &kube::api::Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("{kind} refused: {e}"));
        if hosted {
            hosted_kinds.push(kind);
        } else {
            kinds.push(kind);
        }
    }
    hosted_kinds.sort();
    hosted_kinds.dedup();
    let mut want_hosted = vec![
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ];
    if fleet.version.serves(Feature::AdmissionPolicies) {
        want_hosted.extend([
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]);
        want_hosted.sort();
    }
    assert_eq!(hosted_kinds, want_hosted);
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            "AdmissionHealth",
            "Deployment",
            "NetworkPolicy",
            // policy/v1, or v1beta1 on 1.20.
            "PodDisruptionBudget",
            "RoleBinding",
            "Secret",
            "Secret",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
    );
}

/// The stand-in kubelet retries a pod whose Secret is missing, as a real kubelet does: the
/// admission service starts (and its Deployment becomes available) once the Secret appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_retries_a_pod_until_its_secret_appears() {
    use hcp_fleet_agent::controller::AdmissionEndpoints;
    use hcp_fleet_render::certificates::CertBundle;
    use hcp_fleet_render::config::AgentConfig;
    use hcp_fleet_render::management;
    use hcp_fleet_render::management::{HcpInputs, PdbApi};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;

    let fleet = LocalFleet::start(FleetOptions::with_hosted(0))
        .await
        .expect("fleet");
    let mgmt = fleet.management.client().await.expect("client");
    let ns = "clusters-retry";
    localcp::fixtures::ensure_namespace(&mgmt, ns, Default::default())
        .await
        .expect("namespace");
    let cfg = AgentConfig::default();
    let sans = management::serving_sans(&cfg, ns, &localcp::kubelet::LocalEndpoints.extra_sans());
    let certs = CertBundle::generate(&cfg, &sans).expect("certs");
    let objs = management::render(
        &cfg,
        &HcpInputs {
            namespace: ns,
            agent_namespace: "hcp-fleet-agent",
            owner: None,
            certs: &certs,
            pdb_api: PdbApi::None,
            scheduling: &Default::default(),
            monitoring: hcp_fleet_render::config::MonitoringApi::None,
            revision: None,
        },
    )
    .expect("render");
    let pp = PostParams::default();
    Api::<Service>::namespaced(mgmt.clone(), ns)
        .create(&pp, &objs.service)
        .await
        .expect("service");
    let deployments = Api::<Deployment>::namespaced(mgmt.clone(), ns);
    deployments
        .create(&pp, &objs.deployment)
        .await
        .expect("deployment");
    let dir = tempfile::tempdir().expect("tmp");
    let kubelet = localcp::kubelet::spawn(
        mgmt.clone(),
        localcp::kubelet::KubeletOptions {
            binary: Some(env!("CARGO_BIN_EXE_hcp-fleet-dev").into()),
            dir: dir.path().to_path_buf(),
        },
    );
    let name = cfg.admission.service_name.clone();
    let available = |d: &Deployment| management::deployment_available(d);
    // No TLS Secret yet: the pod cannot start, however long it waits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let d = deployments.get(&name).await.expect("deployment");
    assert!(
        !available(&d),
        "available without its Secret: {:?}",
        d.status
    );
    // The Secret appears (as the agent would write it): the kubelet starts the pod.
    Api::<Secret>::namespaced(mgmt.clone(), ns)
        .create(&pp, &objs.tls_secret)
        .await
        .expect("secret");
    support::eventually("the Deployment available", Duration::from_secs(30), || {
        let deployments = deployments.clone();
        let name = name.clone();
        async move {
            let d = deployments.get(&name).await.map_err(|e| e.to_string())?;
            if available(&d) {
                Ok(())
            } else {
                Err(format!("{:?}", d.status))
            }
        }
    })
    .await;
    kubelet.abort();
}
