//! Helpers shared by the e2e tests.
#![allow(dead_code)]

pub mod acm;
pub mod chart;
pub mod guarded;
pub mod paths;

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use paths::*;

use std::path::Path;
use std::time::{Duration, Instant};

use hcp_fleet_testbed::assets::Feature;

use hcp_fleet_testbed::assets::KubeVersion;
use hcp_fleet_testbed::{Assets, LocalCpError};

/// The test bed binaries. `make test` provides them; a bare `cargo test` finds the cache.
pub fn assets_or_skip_reason() -> Result<Assets, LocalCpError> {
    Assets::resolve(None)
}

/// Whether the test bed's server has `feature`; where it does not, one line says which of
/// `test`'s assertions are skipped, and the rest of the test runs.
pub fn serves(version: &KubeVersion, feature: Feature, test: &str) -> bool {
    let yes = version.serves(feature);
    if !yes {
        let (major, minor) = feature.since();
        // Straight to stderr: the test harness captures print! of a passing test, and this
        // line must show in every run.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped on {version}: {test} ({} needs Kubernetes {major}.{minor}; set KUBEBUILDER_ASSETS to newer binaries to run them)",
            feature.name()
        );
    }
    yes
}

/// PIDs of live processes whose command line mentions `path`.
pub fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.as_os_str().as_encoded_bytes().to_vec();
    let me = std::process::id();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .windows(needle.len())
            .any(|w| w == needle.as_slice())
            && !is_zombie(pid)
        {
            found.push(pid);
        }
    }
    found
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(false)
}

/// True once `pid` no longer exists (or is a zombie awaiting its parent).
pub fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let alive = Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
        if !alive {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP/1.0 GET on loopback; returns (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    status_and_body(&buf)
}

/// An HTTP/1.x answer read whole: (status code, body).
fn status_and_body(buf: &[u8]) -> Result<(u16, String), String> {
    let text = String::from_utf8_lossy(buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// The least an `eventually` waits, whatever bound its caller names. The e2e suite says what
/// happens, the benches how fast (`make bench`): a bound is the time the thing normally
/// takes, and CI's two cores, running two lanes of API servers, controller managers and
/// kubelets beside a release build, sometimes take several times that. A test that claims a
/// speed measures and asserts it itself.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` until it succeeds or `within` (at least `PATIENCE`) passes; panics with the
/// last reason.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    let deadline = start + within.max(PATIENCE);
    let mut last = String::from("never checked");
    while Instant::now() < deadline {
        match check().await {
            Ok(()) => {
                if start.elapsed() > within {
                    eprintln!(
                        "note: {what} took {:?}, beyond the {within:?} it usually takes",
                        start.elapsed()
                    );
                }
                return;
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{what} not reached within {:?}: {last}",
        within.max(PATIENCE)
    );
}

/// A TCP relay that can be cut: the network between one process and its API server. Cut, it
/// forwards nothing and answers nothing (a black hole, not a refusal), as a partition does;
/// healed, it drops what it held and forwards new connections again.
pub struct Relay {
    pub addr: std::net::SocketAddr,
    state: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(upstream: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let (state, _) = tokio::sync::watch::channel(false);
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut a, _)) = listener.accept().await {
                let mut rx = st.subscribe();
                tokio::spawn(async move {
                    if !*rx.borrow() {
                        let Ok(mut b) = tokio::net::TcpStream::connect(upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut a, &mut b) => return,
                            _ = rx.wait_for(|cut| *cut) => {}
                        }
                    }
                    // Cut: hold the connection silent until healed, then drop it.
                    let _ = rx.wait_for(|cut| !*cut).await;
                });
            }
        });
        Relay { addr, state, task }
    }

    pub fn cut(&self) {
        self.state.send_replace(true);
    }

    pub fn heal(&self) {
        self.state.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.heal();
        self.task.abort();
    }
}

/// A child process killed and reaped when the test ends, panicking or not: a spawned agent
/// must not outlive a failed assertion (it would hold the test's output pipe open too).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stand-in kubelet running the real `webhook` command for each admission Deployment.
pub fn real_pods(dir: &std::path::Path) -> hcp_fleet_testbed::kubelet::KubeletOptions {
    hcp_fleet_testbed::kubelet::KubeletOptions {
        binary: Some(env!("CARGO_BIN_EXE_hcp-fleet-dev").into()),
        dir: dir.to_path_buf(),
    }
}

/// The stand-in kubelet and the directory of its pods, kept for the test's length.
pub struct Pods {
    _dir: tempfile::TempDir,
    _kubelet: tokio::task::JoinHandle<()>,
}

/// A fleet of `n` hosted clusters whose admission Deployments run as real `webhook` processes,
/// with an admin client for the management cluster.
pub async fn fleet_with_pods(n: usize) -> (hcp_fleet_testbed::LocalFleet, kube::Client, Pods) {
    let fleet =
        hcp_fleet_testbed::LocalFleet::start(hcp_fleet_testbed::FleetOptions::with_hosted(n))
            .await
            .expect("fleet");
    let mgmt = fleet.management.client().await.expect("mgmt");
    let dir = tempfile::tempdir().expect("tmp");
    let kubelet = hcp_fleet_testbed::kubelet::spawn(mgmt.clone(), real_pods(dir.path()));
    (
        fleet,
        mgmt,
        Pods {
            _dir: dir,
            _kubelet: kubelet,
        },
    )
}

/// A CA named `ca_name` and a serving certificate for 127.0.0.1 it signs (a day each): what a
/// loopback admission service, the agent's own or a stand-in, serves.
pub fn loopback_serving_pair(
    ca_name: &str,
) -> (
    hcp_fleet_render::certificates::KeyedCert,
    hcp_fleet_render::certificates::KeyedCert,
) {
    use hcp_fleet_render::certificates::{Usage, generate_ca, issue};
    let ca = generate_ca(ca_name, time::Duration::days(1)).expect("ca");
    let srv = issue(
        &ca,
        "127.0.0.1",
        &Usage::Server {
            sans: vec!["127.0.0.1".into()],
        },
        time::Duration::days(1),
    )
    .expect("serving certificate");
    (ca, srv)
}

/// A client of hosted cluster `hosted` acting as `user`, impersonated through its admin
/// kubeconfig (so RBAC and the guards judge `user`).
pub async fn hosted_client_as(
    fleet: &hcp_fleet_testbed::LocalFleet,
    hosted: &str,
    user: &str,
) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(
        &fleet
            .hosted(hosted)
            .expect("hosted cluster")
            .kubeconfig_yaml,
    )
    .expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    config.auth_info.impersonate = Some(user.into());
    kube::Client::try_from(config).expect("client")
}

/// An agent process with leader election, as the chart runs it (in local mode for the test
/// bed), as `name` (POD_NAME), with its metrics on a free loopback port. `lease_seconds`
/// `None` keeps the agent's default.
pub fn spawn_elected_agent(
    name: &str,
    kubeconfig: &Path,
    namespace: &str,
    lease_seconds: Option<u64>,
) -> (KillOnDrop, std::net::SocketAddr) {
    spawn_elected_agent_env(name, kubeconfig, namespace, lease_seconds, &[])
}

/// `spawn_elected_agent` with environment variables besides (the chart's Deployment's).
pub fn spawn_elected_agent_env(
    name: &str,
    kubeconfig: &Path,
    namespace: &str,
    lease_seconds: Option<u64>,
    env: &[(String, String)],
) -> (KillOnDrop, std::net::SocketAddr) {
    let yaml = hcp_fleet_testbed::agent_config_yaml();
    spawn_elected_agent_yaml(name, kubeconfig, namespace, lease_seconds, env, &yaml)
}

/// `spawn_elected_agent_env` with the configuration file `yaml` (the test bed's, as
/// `hcp_fleet_testbed::agent_config_yaml` writes it, and more).
pub fn spawn_elected_agent_yaml(
    name: &str,
    kubeconfig: &Path,
    namespace: &str,
    lease_seconds: Option<u64>,
    env: &[(String, String)],
    yaml: &str,
) -> (KillOnDrop, std::net::SocketAddr) {
    let port = hcp_fleet_testbed::free_port().expect("port");
    // Beside the kubeconfig (which outlives the agent).
    let config = kubeconfig.with_file_name(format!("agent-{name}-{port}.yaml"));
    std::fs::write(&config, yaml).expect("config");
    spawn_elected_agent_with(
        name,
        kubeconfig,
        namespace,
        lease_seconds,
        &config,
        port,
        env,
    )
}

/// `spawn_elected_agent` reading its configuration from `config` (which the test may rewrite:
/// the leader re-reads it) with its metrics on `port`, and `env` besides.
pub fn spawn_elected_agent_with(
    name: &str,
    kubeconfig: &Path,
    namespace: &str,
    lease_seconds: Option<u64>,
    config: &Path,
    port: u16,
    env: &[(String, String)],
) -> (KillOnDrop, std::net::SocketAddr) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"));
    cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd.args(["agent", "--local-mode", "--leader-elect"])
        .arg("--config")
        .arg(config)
        .args(["--namespace", namespace])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", name)
        .env(
            "RUST_LOG",
            std::env::var("AGENT_LOG").unwrap_or_else(|_| "warn".into()),
        );
    if let Some(s) = lease_seconds {
        cmd.args(["--lease-duration-seconds", &s.to_string()]);
    }
    // As the test bed's own children: killed with this process even when it is killed by a
    // signal and no destructor runs (KillOnDrop covers every other end).
    hcp_fleet_testbed::process::die_with_parent(&mut cmd);
    let child = cmd.spawn().expect("agent process");
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    (KillOnDrop(child), addr)
}

/// The ServiceMonitor CRDs of both Prometheus Operators the agent writes for: the trimmed
/// `monitoring.coreos.com` one of e2e/crds, and the same under `monitoring.rhobs` (the
/// Observability Operator's fork keeps the kind's schema).
pub async fn install_monitoring_crds(client: &kube::Client) {
    let coreos = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/servicemonitors.yaml"),
    )
    .expect("e2e/crds/servicemonitors.yaml");
    let rhobs = coreos.replace("monitoring.coreos.com", "monitoring.rhobs");
    hcp_fleet_testbed::fixtures::install_crd_manifests(
        client,
        [
            ("servicemonitors.monitoring.coreos.com", coreos.as_str()),
            ("servicemonitors.monitoring.rhobs", rhobs.as_str()),
        ],
    )
    .await
    .expect("ServiceMonitor CRDs");
    for group in ["monitoring.coreos.com", "monitoring.rhobs"] {
        watches_deliver(client, group).await;
    }
}

/// Waits until a watch opened now on `group`'s ServiceMonitors sees an object created after
/// it. On the 1.36 test bed, the agent's watch was often the first request ever made for a
/// just-installed resource; its list took a second and the watch then stayed silent (no event
/// until kube's 290 s watch timeout renews it), in about three runs of four. On a real cluster
/// the Prometheus Operator has long been watching these; here a canary plays that part, so
/// the agent starts against a resource in use, as it would there.
async fn watches_deliver(client: &kube::Client, group: &str) {
    use futures::StreamExt;
    use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
    use kube::runtime::watcher;
    let ar = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(group, "v1", "ServiceMonitor"),
        "servicemonitors",
    );
    let api = kube::Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar);
    let deadline = Instant::now() + Duration::from_secs(60);
    for attempt in 0.. {
        let name = format!("watch-canary-{attempt}");
        let mut events = std::pin::pin!(watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={name}"))
        ));
        // Listed: the watch is open from here.
        while let Some(e) = events.next().await {
            if matches!(e, Ok(watcher::Event::InitDone)) {
                break;
            }
        }
        let canary: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": ar.api_version, "kind": "ServiceMonitor",
            "metadata": {"name": name}, "spec": {"selector": {}},
        }))
        .expect("canary");
        api.create(&PostParams::default(), &canary)
            .await
            .expect("create a canary ServiceMonitor");
        let seen = tokio::time::timeout(Duration::from_secs(3), async {
            while let Some(e) = events.next().await {
                if matches!(e, Ok(watcher::Event::Apply(_))) {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        let _ = api.delete(&name, &DeleteParams::default()).await;
        if seen {
            if attempt > 0 {
                eprintln!("{group}: a watch delivered after {attempt} silent one(s)");
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no watch on {group} ServiceMonitors delivered an event within 60 s"
        );
    }
}

/// Whether `api` has no object `name` (a failed read fails the test).
pub async fn absent<K>(api: &kube::Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.expect("get").is_none()
}

/// How many objects the agent owns in a hosted cluster: webhook configurations (both kinds),
/// admission policies and bindings where the server serves them, and the canaries' RBAC.
pub async fn owned_hosted_objects(hosted: &kube::Client) -> usize {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        ValidatingWebhookConfiguration,
    };
    async fn count<K>(hosted: &kube::Client) -> usize
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let owned = kube::api::ListParams::default()
            .labels(&hcp_fleet_render::hosted::objects::owned_selector());
        match kube::Api::<K>::all(hosted.clone())
            .list_metadata(&owned)
            .await
        {
            Ok(l) => l.items.len(),
            Err(kube::Error::Api(s)) if s.code == 404 => 0,
            Err(e) => panic!("listing: {e}"),
        }
    }
    let owned = kube::api::ListParams::default()
        .labels(&hcp_fleet_render::hosted::objects::owned_selector());
    let mut dynamic = 0;
    for ar in [
        hcp_fleet_render::hosted::admission_policies::mutating_resource(),
        hcp_fleet_render::hosted::admission_policies::mutating_binding_resource(),
    ] {
        dynamic += match kube::Api::<kube::api::DynamicObject>::all_with(hosted.clone(), &ar)
            .list_metadata(&owned)
            .await
        {
            Ok(l) => l.items.len(),
            Err(kube::Error::Api(s)) if s.code == 404 => 0,
            Err(e) => panic!("listing: {e}"),
        };
    }
    dynamic
        + count::<ValidatingWebhookConfiguration>(hosted).await
        + count::<MutatingWebhookConfiguration>(hosted).await
        + count::<ValidatingAdmissionPolicy>(hosted).await
        + count::<ValidatingAdmissionPolicyBinding>(hosted).await
        + count::<k8s_openapi::api::rbac::v1::ClusterRole>(hosted).await
        + count::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(hosted).await
}

/// Does the agent's MutatingWebhookConfiguration in a hosted cluster hold an entry `name`?
pub async fn mutating_webhook_entry(hosted: &kube::Client, name: &str) -> Result<bool, String> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    Ok(
        kube::Api::<MutatingWebhookConfiguration>::all(hosted.clone())
            .get_opt(hcp_fleet_render::hosted::webhooks::MUTATING_NAME)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|m| m.webhooks)
            .unwrap_or_default()
            .iter()
            .any(|w| w.name == name),
    )
}

/// Is there a MutatingAdmissionPolicy `name` in a hosted cluster?
pub async fn mutating_policy_exists(hosted: &kube::Client, name: &str) -> Result<bool, String> {
    kube::Api::<kube::api::DynamicObject>::all_with(
        hosted.clone(),
        &hcp_fleet_render::hosted::admission_policies::mutating_resource(),
    )
    .get_opt(name)
    .await
    .map(|p| p.is_some())
    .map_err(|e| e.to_string())
}

/// A LoadBalancer Service named `name` with these annotations: what the Service tag acts on.
pub fn load_balancer(
    name: &str,
    annotations: serde_json::Value,
) -> k8s_openapi::api::core::v1::Service {
    let mut metadata = serde_json::json!({"name": name});
    if !annotations.is_null() {
        metadata["annotations"] = annotations;
    }
    serde_json::from_value(serde_json::json!({
        "metadata": metadata,
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .expect("a Service")
}

/// How many AdmissionReviews for `webhook` the admission service in `ns` has answered, summed
/// over its replicas (their `/metrics`, as a Prometheus would scrape them); none where the HCP
/// has no admission service. A replica whose port refuses the connection is one the service's
/// retirement stopped before its Service went (guards moved to admission policies): it answers
/// nothing more, and counts nothing; any other failure to scrape one fails the caller.
pub async fn service_requests(mgmt: &kube::Client, ns: &str, webhook: &str) -> f64 {
    use hcp_fleet_testbed::kubelet::LOCAL_REPLICAS_ANNOTATION;
    use kube::ResourceExt;
    let Some(svc) = kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(mgmt.clone(), ns)
        .get_opt("hcp-fleet-admission")
        .await
        .expect("service")
    else {
        return 0.0;
    };
    let ca = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(mgmt.clone(), ns)
        .get("hcp-fleet-admission-tls")
        .await
        .expect("tls secret")
        .data
        .and_then(|d| {
            d.get("ca.crt")
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        })
        .expect("ca.crt");
    let needle = format!("webhook=\"{webhook}\"");
    let mut total = 0.0;
    for addr in svc
        .annotations()
        .get(LOCAL_REPLICAS_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default()
        .split(',')
        .filter_map(|a| a.parse::<std::net::SocketAddr>().ok())
    {
        let body = match hcp_fleet_testbed::kubelet::https_get(addr.port(), &ca, "/metrics").await {
            Ok((_, body)) => body,
            Err(e) if e.contains("Connection refused") => continue,
            Err(e) => panic!("scraping {addr}: {e}"),
        };
        total += body
            .lines()
            .filter(|l| l.starts_with("hcp_fleet_admission_requests_total{") && l.contains(&needle))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    total
}

// The benchmarks' shared measuring helpers.

/// A number from the environment (a benchmark's size), or `default`.
/// Resource names of 250 characters, about `bytes` of them: what makes a tenant's policy large.
pub fn large_resource_names(bytes: usize) -> Vec<String> {
    (0..bytes / 256)
        .map(|i| format!("{i:06}-{}", "x".repeat(243)))
        .collect()
}

/// A tenant's ValidatingAdmissionPolicy named `name`, labelled as the agent labels its own,
/// whose one rule matches nothing and lists `names` (`large_resource_names`): as large as a
/// tenant likes, and of no concern to an agent that reads its own objects by name.
pub fn labelled_tenant_policy(name: &str, names: &[String]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {
            "name": name,
            "labels": {hcp_fleet_render::hosted::objects::OWNED_LABEL: "true"},
        },
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["tenant.example.com"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["nothings"],
                "resourceNames": names,
            }]},
            "validations": [{"expression": "true"}],
        },
    })
}

pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `VmHWM:`), 0 when unreadable.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Clock ticks a second, the unit of `cpu_ticks`: USER_HZ, which `/proc` counts in whatever
/// the kernel's own tick rate, 100 on x86_64 and arm64 Linux (`getconf CLK_TCK`).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// `ticks` of `cpu_ticks` as seconds of CPU.
pub fn cpu_seconds(ticks: u64) -> f64 {
    ticks as f64 / TICKS_PER_SECOND
}

/// `ticks` of `cpu_ticks` spent over `wall`, as a percentage of one core.
pub fn core_percent(ticks: u64, wall: std::time::Duration) -> f64 {
    cpu_seconds(ticks) / wall.as_secs_f64() * 100.0
}

/// utime + stime in clock ticks (`TICKS_PER_SECOND`).
pub fn cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(") ")?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

/// The `p`th percentile of `sorted` (nearest rank).
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    if sorted.is_empty() {
        return std::time::Duration::ZERO;
    }
    let idx = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// `percentile` in milliseconds, for a benchmark's row: NaN where nothing was measured, so the
/// row prints "NaN" rather than a zero that reads as a figure.
pub fn percentile_ms(sorted: &[std::time::Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    percentile(sorted, p).as_secs_f64() * 1000.0
}

/// Shows warnings (the test bed's kubelet among them) when a benchmark run goes wrong, unless
/// RUST_LOG says otherwise. Call first in `main`, before any thread starts.
// std::env::set_var is unsafe once other threads may read the environment.
#[allow(unsafe_code)]
pub fn bench_logs() {
    if std::env::var_os("RUST_LOG").is_none() {
        // SAFETY: single-threaded here, before any runtime or thread starts.
        unsafe { std::env::set_var("RUST_LOG", "warn,kube_client=off") };
    }
    hcp_fleet_cli::telemetry::init(hcp_fleet_cli::telemetry::LogFormat::Text);
}

/// A benchmark's `main`: `run` on a runtime of `workers` threads (the default: one per core),
/// exiting 1 with its error.
pub fn bench_main<F>(workers: Option<usize>, run: impl FnOnce() -> F)
where
    F: std::future::Future<Output = Result<(), String>>,
{
    hcp_fleet_guards::crypto::install_provider();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: no runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}

/// One hosted cluster, the admission services run by the test bed's kubelet (real processes,
/// in `pods`), and the agent in this process with `cfg` (loopback allowed, rollout waves off: a
/// new revision reaches the HCP at once; e2e/rollout.rs tests the waves).
pub struct AgentBed {
    pub fleet: hcp_fleet_testbed::LocalFleet,
    pub mgmt: kube::Client,
    pub agent: hcp_fleet_cli::agent::AgentHandle,
    pub pods: tempfile::TempDir,
    pub kubelet: tokio::task::JoinHandle<()>,
}

impl AgentBed {
    /// The agent's configuration replaced as `agent_bed` gives it: the test bed's loopback API
    /// servers allowed and rollout waves off. A bed's tests change guards, not rollouts: with
    /// waves on, a guard the test takes down on purpose fails the new revision, and the agent
    /// puts the HCP back on the revision before (e2e/rollout.rs tests that).
    pub fn set_config(&self, cfg: hcp_fleet_render::config::AgentConfig) {
        self.agent.set_config(bed_config(cfg));
    }
}

fn bed_config(
    mut cfg: hcp_fleet_render::config::AgentConfig,
) -> hcp_fleet_render::config::AgentConfig {
    cfg.rollout.enabled = false;
    hcp_fleet_testbed::allow_loopback(cfg)
}

pub async fn agent_bed(cfg: hcp_fleet_render::config::AgentConfig) -> Result<AgentBed, String> {
    use hcp_fleet_testbed::kubelet;
    let fleet =
        hcp_fleet_testbed::LocalFleet::start(hcp_fleet_testbed::FleetOptions::with_hosted(1))
            .await
            .map_err(|e| e.to_string())?;
    let mgmt = fleet.management.client().await.map_err(|e| e.to_string())?;
    let pods = tempfile::tempdir().map_err(|e| e.to_string())?;
    let kubelet = kubelet::spawn(
        mgmt.clone(),
        kubelet::KubeletOptions {
            binary: Some(env!("CARGO_BIN_EXE_hcp-fleet-dev").into()),
            dir: pods.path().to_path_buf(),
        },
    );
    let agent = hcp_fleet_cli::agent::start(
        mgmt.clone(),
        bed_config(cfg),
        hcp_fleet_cli::agent::StartOptions {
            agent_namespace: "hcp-fleet-agent".into(),
            endpoints: kubelet::endpoints(),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(AgentBed {
        fleet,
        mgmt,
        agent,
        pods,
        kubelet,
    })
}

/// The agent's drift counter `metric` (`hcp_fleet_webhook_drift_total`,
/// `hcp_fleet_management_drift_total`) for hosted cluster `cluster` of `ns` and `kind`.
pub fn drift_count(
    agent: &hcp_fleet_cli::agent::AgentHandle,
    metric: &str,
    ns: &str,
    cluster: &str,
    kind: &str,
) -> f64 {
    let needle =
        format!("{metric}{{hcp_namespace=\"{ns}\",hosted_cluster=\"{cluster}\",kind=\"{kind}\"}}");
    agent
        .context
        .metrics
        .encode()
        .lines()
        .find(|l| l.starts_with(&needle))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// The namespace the in-process agents run in (their Lease, their fleet template).
pub const AGENT_NS: &str = "hcp-fleet-agent";

/// The agent in this process, on `mgmt`, with `cfg` made to accept the test bed's loopback
/// servers.
pub async fn start_agent(
    mgmt: &kube::Client,
    cfg: hcp_fleet_render::config::AgentConfig,
) -> hcp_fleet_cli::agent::AgentHandle {
    hcp_fleet_cli::agent::start(
        mgmt.clone(),
        hcp_fleet_testbed::allow_loopback(cfg),
        hcp_fleet_cli::agent::StartOptions {
            agent_namespace: AGENT_NS.into(),
            endpoints: hcp_fleet_testbed::kubelet::endpoints(),
        },
    )
    .await
    .expect("agent starts")
}

/// The name of the health record in the test bed's HCP namespace `ns` (`clusters-<cluster>`):
/// the hosted cluster's.
pub fn record_of(ns: &str) -> &str {
    hcp_fleet_render::reporting::record::health_name(ns.strip_prefix("clusters-").unwrap_or(ns))
}

/// The health record of the HCP in `ns`.
pub async fn health(
    client: &kube::Client,
    ns: &str,
) -> Result<hcp_fleet_model::crd::AdmissionHealth, String> {
    let name = record_of(ns);
    kube::Api::<hcp_fleet_model::crd::AdmissionHealth>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| format!("{ns}/{name}: {e}"))
}

/// A health record's overall verdict.
pub fn compliant(h: &hcp_fleet_model::crd::AdmissionHealth) -> Option<&'static str> {
    h.status
        .as_ref()
        .and_then(|s| s.compliant)
        .map(|c| c.as_str())
}

/// Waits until the HCP of each hosted cluster in `names` is Compliant.
pub async fn wait_compliant(mgmt: &kube::Client, names: &[&str]) {
    for name in names {
        let ns = hcp_fleet_testbed::fixtures::hcp_namespace(name);
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

/// An `AdmissionHealthPolicy` template's verdict, its message, and the HCP namespaces of its
/// related objects.
pub async fn template_rows(
    mgmt: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<(String, String, Vec<String>), String> {
    let t = kube::Api::<hcp_fleet_model::crd::AdmissionHealthPolicy>::namespaced(mgmt.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let st = t.status.unwrap_or_default();
    Ok((
        st.compliant
            .map(|c| c.as_str().to_string())
            .unwrap_or_default(),
        st.message.unwrap_or_default(),
        st.related_objects
            .iter()
            .map(|r| r.object.metadata.namespace.clone())
            .collect(),
    ))
}

/// The samples of `metric` in OpenMetrics `text`, summed by the value of `label` (under ""
/// where a sample has none).
pub fn sum_by_label(
    text: &str,
    metric: &str,
    label: &str,
) -> std::collections::BTreeMap<String, f64> {
    let mut m = std::collections::BTreeMap::new();
    let key = format!("{label}=\"");
    for l in text.lines().filter(|l| {
        l.strip_prefix(metric)
            .is_some_and(|r| r.starts_with(['{', ' ']))
    }) {
        let by = l
            .split(key.as_str())
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_string();
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *m.entry(by).or_insert(0.0) += v;
    }
    m
}

/// Runs `cmd` to its end: whether it succeeded, and what it printed (stdout, then stderr).
pub fn run_to_text(cmd: &mut std::process::Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// kubectl (the test bed's) with `kubeconfig`, as an SRE runs it: (success, stdout, stderr).
pub fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let assets = Assets::resolve(None).expect("assets");
    let out = std::process::Command::new(&assets.kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// GET over TLS without verifying the server (the agent's self-signed metrics certificate),
/// with `token` as a bearer token: (status, body).
pub async fn https_get_insecure(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    hcp_fleet_guards::crypto::install_provider();
    let cfg = hcp_fleet_agent::tls::accept_any_server().map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut s = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    // A peer that closes without TLS's close_notify has still said everything.
    let _ = s.read_to_end(&mut buf).await;
    status_and_body(&buf)
}

/// `kubectl wait --for=condition=Ready admissionhealths --all -A` within `timeout`, against the
/// management cluster: (success, stdout, stderr).
pub fn wait_fleet_ready(kubeconfig: &Path, timeout: &str) -> (bool, String, String) {
    kubectl_with(
        kubeconfig,
        &[
            "wait",
            "--for=condition=Ready",
            "admissionhealths",
            "--all",
            "-A",
            &format!("--timeout={timeout}"),
        ],
    )
}
