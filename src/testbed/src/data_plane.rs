//! A hosted cluster's data plane, as its API server sees it: what a real hosted cluster has
//! around its API and the test bed's hosted clusters had not (docs/testbed.md, "The data
//! plane").
//!
//! - The real `kube-controller-manager` of the test bed's version, one per hosted cluster, with
//!   per-controller service-account credentials (`--use-service-account-credentials`, as
//!   HyperShift runs it): the service-account, token, token-cleaner, namespace, garbage
//!   collector, deployment, replicaset, daemonset, job and root-CA publisher controllers make
//!   their requests under their own names (`system:serviceaccount:kube-system:<controller>`).
//! - A stand-in scheduler: binds each pod with no node, as `system:kube-scheduler` does
//!   (`POST pods/<name>/binding`), to the node a DaemonSet pod's affinity names or else in turn.
//! - A stand-in kubelet per node, with a client certificate for `system:node:<name>` in
//!   `system:nodes`, so the API server's Node authorizer and `NodeRestriction` plugin judge it
//!   as on a real cluster. It sends what the kubelet sends (pkg/kubelet): registers its Node
//!   and marks it Ready, renews its Lease in `kube-node-lease` every 10 s, and for each pod
//!   bound to it asks for every projected service-account token
//!   (`POST serviceaccounts/<sa>/token`, the source's audience and `expirationSeconds`,
//!   `boundObjectRef` to the pod, again at 80 % of its life as the token manager does) and then
//!   reports the pod Running. No container runs: there is no runtime here.
//!
//! Every token request's outcome is kept (`TokenRecord`) so a test can say "every pod got its
//! token".

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::process::ManagedProcess;
use super::{AbortOnDrop, LocalCpError, api_now, client_from_kubeconfig, io};
use hcp_fleet_guards::identities::{NODE_USER_PREFIX, NODES_GROUP};

/// The controllers the test bed's controller managers run: those a hosted cluster's pods and
/// identities depend on. Every name is valid for 1.20 and, as an alias, for 1.36.
pub const CONTROLLERS: &[&str] = &[
    "serviceaccount",
    "serviceaccount-token",
    "tokencleaner",
    "namespace",
    "garbagecollector",
    "deployment",
    "replicaset",
    "daemonset",
    "job",
    "root-ca-cert-publisher",
];

/// How many nodes each hosted cluster gets by default.
pub const DEFAULT_NODES: usize = 2;

/// One token request a stand-in kubelet sent, and what came of it.
#[derive(Clone)]
pub struct TokenRecord {
    pub node: String,
    pub namespace: String,
    pub pod: String,
    pub service_account: String,
    /// `Ok(())`, or the API server's refusal (a guard's denial among them).
    pub outcome: Result<(), String>,
    /// The token issued, as the pod would hold it (what an operator of the fixture acts with).
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for TokenRecord {
    // The token itself stays out of every message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRecord")
            .field("node", &self.node)
            .field("namespace", &self.namespace)
            .field("pod", &self.pod)
            .field("service_account", &self.service_account)
            .field("outcome", &self.outcome)
            .finish()
    }
}

/// A hosted cluster's data plane; dropping it stops the controller manager and the stand-ins.
pub struct DataPlane {
    pub nodes: Vec<String>,
    tokens: Arc<Mutex<Vec<TokenRecord>>>,
    _tasks: Vec<AbortOnDrop>,
    kcm: Option<ManagedProcess>,
}

impl DataPlane {
    /// Every token request sent so far.
    pub fn tokens(&self) -> Vec<TokenRecord> {
        self.tokens.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// The newest token a kubelet obtained for a pod of service account `sa` in `namespace`.
    pub fn token_of(&self, namespace: &str, sa: &str) -> Option<String> {
        self.tokens()
            .into_iter()
            .rev()
            .filter(|t| t.namespace == namespace && t.service_account == sa)
            .find_map(|t| t.token)
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut p) = self.kcm.take() {
            p.stop();
        }
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What starting one hosted cluster's data plane needs.
pub(crate) struct Start<'a> {
    pub(crate) name: &'a str,
    pub(crate) server: &'a str,
    pub(crate) dir: &'a Path,
    pub(crate) kcm_binary: &'a Path,
    pub(crate) has_insecure_port_flag: bool,
    pub(crate) pki: &'a super::pki::Pki,
    pub(crate) nodes: usize,
}

/// Starts the controller manager, the scheduler and the kubelets of one hosted cluster.
pub(crate) async fn start(s: Start<'_>) -> Result<DataPlane, LocalCpError> {
    let kubeconfig =
        |user: &str, groups: &[&str]| s.pki.client_kubeconfig(s.name, s.server, user, groups);
    let kcm_config = s.dir.join("kube-controller-manager.kubeconfig");
    std::fs::write(
        &kcm_config,
        kubeconfig("system:kube-controller-manager", &[])?,
    )
    .map_err(io(format!("writing {}", kcm_config.display())))?;
    let mut args = vec![
        format!("--kubeconfig={}", kcm_config.display()),
        "--leader-elect=false".into(),
        "--use-service-account-credentials=true".into(),
        format!(
            "--service-account-private-key-file={}",
            s.pki.sa_key_path.display()
        ),
        format!("--root-ca-file={}", s.pki.ca_path.display()),
        format!("--controllers={}", CONTROLLERS.join(",")),
        // No serving: nothing scrapes it, and N of them would fight over the default port.
        "--secure-port=0".into(),
        "--v=0".into(),
    ];
    if s.has_insecure_port_flag {
        args.push("--port=0".into());
    }
    // At a lower CPU priority (nice 10, through coreutils' `nice`, which execs it in place):
    // HyperShift runs it on the management cluster's nodes, not on the cores that serve the
    // hosted API server and the admission service, which on this two-core machine its
    // discovery and resyncs would otherwise share with the tests' timed paths.
    let mut niced = vec![
        "-n".to_string(),
        "10".to_string(),
        s.kcm_binary.display().to_string(),
    ];
    niced.extend(args);
    let kcm = ManagedProcess::spawn(
        &format!("kube-controller-manager {}", s.name),
        Path::new("nice"),
        &niced,
        &s.dir.join("kube-controller-manager.log"),
    )?;

    let mut tasks = Vec::new();
    let scheduler = client_from_kubeconfig(
        &format!("{} scheduler", s.name),
        &kubeconfig("system:kube-scheduler", &[])?,
    )
    .await?;
    let nodes: Vec<String> = (1..=s.nodes).map(|i| format!("worker-{i}")).collect();
    tasks.push(AbortOnDrop(tokio::spawn(schedule(
        scheduler,
        nodes.clone(),
    ))));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    for node in &nodes {
        let user = format!("{NODE_USER_PREFIX}{node}");
        let client = client_from_kubeconfig(
            &format!("{} kubelet {node}", s.name),
            &kubeconfig(&user, &[NODES_GROUP])?,
        )
        .await?;
        tasks.push(AbortOnDrop(tokio::spawn(kubelet(
            client,
            node.clone(),
            tokens.clone(),
        ))));
    }
    Ok(DataPlane {
        nodes,
        tokens,
        _tasks: tasks,
        kcm: Some(kcm),
    })
}

/// The node a DaemonSet pod must run on: the controller's required node affinity on
/// `metadata.name` (pkg/controller/daemon/util: ReplaceDaemonSetPodNodeNameNodeAffinity).
fn required_node(pod: &Pod) -> Option<String> {
    let v = serde_json::to_value(pod).ok()?;
    let terms = v["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()?
        .clone();
    terms.iter().find_map(|t| {
        t["matchFields"].as_array()?.iter().find_map(|f| {
            (f["key"] == "metadata.name" && f["operator"] == "In")
                .then(|| f["values"][0].as_str().map(str::to_string))
                .flatten()
        })
    })
}

/// The stand-in scheduler: binds every pod without a node. Runs until aborted.
async fn schedule(client: Client, nodes: Vec<String>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let cfg = watcher::Config::default().fields("spec.nodeName=");
    let mut next = 0usize;
    let mut stream = watcher(pods, cfg).applied_objects().boxed();
    while let Some(ev) = stream.next().await {
        let Ok(pod) = ev else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
            || pod.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let node = required_node(&pod).unwrap_or_else(|| {
            next += 1;
            nodes[next % nodes.len().max(1)].clone()
        });
        let (Some(ns), name) = (pod.namespace(), pod.name_any()) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        // A pod gone or bound meanwhile needs nothing more; a server that did not answer is
        // asked again (the watch would not bring this pod back by itself).
        let pp = PostParams::default();
        let _ = retrying(Duration::from_millis(200), Duration::from_secs(16), || {
            api.create_subresource::<Value, Value>("binding", &name, &pp, &binding)
        })
        .await;
    }
}

/// The Node a kubelet registers (pkg/kubelet/kubelet_node_status.go: initialNode), Ready.
fn node_object(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            // Only labels NodeRestriction lets a kubelet set on itself (no node-role.*).
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        }},
    })
}

fn node_status() -> Value {
    let now = api_now();
    json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "250"},
        "allocatable": {"cpu": "7500m", "memory": "30Gi", "pods": "250"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
    }})
}

/// One projected service-account token a pod's volumes ask for: audience, lifetime.
fn projected_tokens(pod: &Pod) -> Vec<(Option<String>, i64)> {
    let Ok(v) = serde_json::to_value(pod) else {
        return Vec::new();
    };
    v["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|vol| {
            vol["projected"]["sources"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|src| {
            let t = src.get("serviceAccountToken")?;
            Some((
                t["audience"].as_str().map(str::to_string),
                t["expirationSeconds"].as_i64().unwrap_or(3600),
            ))
        })
        .collect()
}

/// The kubelet's TokenRequest for one projected source (pkg/kubelet/token/token_manager.go via
/// the projected volume plugin): bound to the pod by name and UID.
fn token_request(pod: &Pod, audience: Option<&str>, seconds: i64) -> Value {
    let audiences: Vec<&str> = audience.into_iter().collect();
    json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {
            "audiences": audiences,
            "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()},
        },
    })
}

/// The stand-in kubelet of `node`. Runs until aborted.
async fn kubelet(client: Client, node: String, tokens: Arc<Mutex<Vec<TokenRecord>>>) {
    let nodes: Api<Node> = Api::all(client.clone());
    // Register, retrying while the server is not ready to take it (RBAC settling).
    let mut tries = 0u32;
    loop {
        let body: Node = match serde_json::from_value(node_object(&node)) {
            Ok(n) => n,
            Err(_) => return,
        };
        match nodes.create(&PostParams::default(), &body).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 => break,
            Err(e) => {
                if tries.is_multiple_of(20) {
                    tracing::warn!(node = %node, error = %e, "the stand-in kubelet cannot register its Node yet");
                }
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let heartbeat = {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            // With a Lease, the kubelet posts its Node's status when it changes and otherwise
            // every nodeStatusReportFrequency (5 min); the Lease every 10 s.
            let mut reported: Option<Instant> = None;
            loop {
                if reported.is_none_or(|t| t.elapsed() >= Duration::from_secs(300)) {
                    let posted = nodes
                        .patch_status(&node, &PatchParams::default(), &Patch::Merge(node_status()))
                        .await;
                    if posted.is_ok() {
                        reported = Some(Instant::now());
                    }
                }
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": node, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                        "renewTime": micro_now()},
                });
                let renewed = leases
                    .patch(&node, &PatchParams::default(), &Patch::Merge(&lease))
                    .await;
                if renewed.is_err()
                    && let Ok(l) = serde_json::from_value::<Lease>(lease)
                {
                    let _ = leases.create(&PostParams::default(), &l).await;
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    };
    let pods = run_pods(client, node, tokens);
    tokio::join!(heartbeat, pods);
}

/// A MicroTime, as a Lease's renewTime wants it.
fn micro_now() -> String {
    format!("{:.6}", jiff::Timestamp::now())
}

/// The kubelet's pod loop: one task per pod bound to `node`, as the kubelet's pod workers are,
/// so a pod whose token waits on the Node authorizer never holds up another pod or the watch.
async fn run_pods(client: Client, node: String, tokens: Arc<Mutex<Vec<TokenRecord>>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut workers: HashMap<String, AbortOnDrop> = HashMap::new();
    // The watcher re-lists by itself after an error; the pause keeps a down server from
    // being hammered while it does.
    let mut stream = watcher(pods, cfg).applied_objects().boxed();
    while let Some(ev) = stream.next().await {
        let Ok(pod) = ev else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let uid = pod.uid().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            workers.remove(&uid);
            continue;
        }
        if workers.contains_key(&uid) {
            continue;
        }
        let worker = pod_worker(client.clone(), node.clone(), pod, tokens.clone());
        workers.insert(uid, AbortOnDrop(tokio::spawn(worker)));
    }
}

/// One pod's worker: its tokens, its status, then each token again at 80 % of its life (the
/// token manager's refresh). Runs until the pod goes (aborted by `run_pods`).
async fn pod_worker(client: Client, node: String, pod: Pod, tokens: Arc<Mutex<Vec<TokenRecord>>>) {
    let sources = projected_tokens(&pod);
    let refresh = |secs: i64| Duration::from_secs(u64::try_from(secs).unwrap_or(3600) * 8 / 10);
    let mut due = Vec::with_capacity(sources.len());
    for (aud, secs) in &sources {
        request_token(&client, &node, &pod, aud.as_deref(), *secs, &tokens).await;
        due.push(Instant::now() + refresh(*secs));
    }
    report_running(&client, &pod).await;
    loop {
        let Some(next) = due.iter().min().copied() else {
            return;
        };
        tokio::time::sleep_until(next.into()).await;
        let now = Instant::now();
        for (i, (aud, secs)) in sources.iter().enumerate() {
            if due[i] <= now {
                request_token(&client, &node, &pod, aud.as_deref(), *secs, &tokens).await;
                due[i] = Instant::now() + refresh(*secs);
            }
        }
    }
}

/// Whether a failed request is one the kubelet simply sends again (its volume manager retries a
/// mount whatever failed): the API server's own caches not yet knowing the pod's binding, or the
/// server not answering (a 429 or 5xx, a connection lost). Each cache learns the binding from its
/// own watch, so a request sent the moment the kubelet sees the pod may come first: the Node
/// authorizer's graph ("no relationship found between node …", node_authorizer.go), and the
/// `NodeRestriction` plugin's pod lister, which then finds no pod (a 404 whose kind is `pod`) or
/// the pod with no node yet ("node requested token bound to a pod scheduled on a different
/// node", noderestriction/admission.go `admitServiceAccount`). Any other refusal (a guard's
/// above all) is final and kept as it came.
fn retried(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            let pod_unknown = s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "pod");
            let binding_unknown = s.code == 403
                && (s.message.contains("no relationship found")
                    || s.message.contains("scheduled on a different node"));
            pod_unknown || binding_unknown || s.code == 429 || s.code >= 500
        }
        kube::Error::Service(_) | kube::Error::HyperError(_) => true,
        _ => false,
    }
}

/// `call`, again after each failure `retried` takes (backoff from `first`, doubling, at most
/// 5 s) until it succeeds, fails otherwise, or `within` has passed: its last outcome.
async fn retrying<T, F, Fut>(first: Duration, within: Duration, mut call: F) -> kube::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let deadline = Instant::now() + within;
    let mut backoff = first;
    loop {
        match call().await {
            Err(e) if retried(&e) && Instant::now() < deadline => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            out => return out,
        }
    }
}

async fn request_token(
    client: &Client,
    node: &str,
    pod: &Pod,
    audience: Option<&str>,
    seconds: i64,
    tokens: &Arc<Mutex<Vec<TokenRecord>>>,
) {
    let ns = pod.namespace().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let body = token_request(pod, audience, seconds);
    // Retried for up to a minute, as the kubelet's volume manager retries a mount; only the
    // last outcome is kept, so a record says what the pod ended up with.
    let pp = PostParams::default();
    let answer = retrying(Duration::from_millis(100), Duration::from_secs(60), || {
        api.create_subresource::<Value, Value>("token", &sa, &pp, &body)
    })
    .await;
    let token = answer
        .as_ref()
        .ok()
        .and_then(|v| v["status"]["token"].as_str().map(str::to_string));
    let outcome = answer.map(|_| ()).map_err(|e| e.to_string());
    if let Ok(mut t) = tokens.lock() {
        t.push(TokenRecord {
            node: node.to_string(),
            namespace: ns,
            pod: pod.name_any(),
            service_account: sa,
            outcome,
            token,
        });
    }
}

/// The pod's status as the kubelet reports a started pod (no container really runs).
async fn report_running(client: &Client, pod: &Pod) {
    let Some(ns) = pod.namespace() else { return };
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let now = api_now();
    let statuses: Vec<Value> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers.iter().map(|c| json!({
            "name": c.name, "image": c.image, "imageID": "", "ready": true, "restartCount": 0,
            "started": true, "state": {"running": {"startedAt": now}},
        })).collect()
        })
        .unwrap_or_default();
    let status = json!({"status": {
        "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": now,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": statuses,
    }});
    let _ = api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(status),
        )
        .await;
}

/// How many pods of the hosted cluster are bound and Running, by namespace (what a test
/// waits on).
pub async fn running_pods(client: &Client) -> Result<BTreeMap<String, usize>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    for p in pods.list(&ListParams::default()).await? {
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            *out.entry(p.namespace().unwrap_or_default()).or_insert(0) += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::retried;

    /// A Status as the API server sends it (its JSON), as kube-client hands it over.
    fn refused(body: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_str(body).expect("a Status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn the_servers_caches_lagging_behind_a_binding_are_retried_and_a_guards_refusal_is_not() {
        // NodeRestriction's pod lister not having seen the binding yet (the CI run that failed
        // on 1.20.2 got this one, at the kubelet's first request for the pod).
        let different_node = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"serviceaccounts \"default\" is forbidden: node requested token bound to a pod scheduled on a different node","reason":"Forbidden","details":{"name":"default","kind":"serviceaccounts"},"code":403}"#;
        // The same lister not having seen the pod at all (lister NotFound: resource "pod").
        let pod_unknown = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pod \"mine\" not found","reason":"NotFound","details":{"name":"mine","kind":"pod"},"code":404}"#;
        // The Node authorizer's graph not having it yet.
        let no_relationship = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"serviceaccounts \"default\" is forbidden: User \"system:node:worker-1\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"team-a\": no relationship found between node 'worker-1' and this object","reason":"Forbidden","details":{"name":"default","kind":"serviceaccounts"},"code":403}"#;
        for lag in [different_node, pod_unknown, no_relationship] {
            assert!(retried(&refused(lag)), "not retried: {lag}");
        }
        // A guard's refusal, and an account that does not exist, are answers the record keeps.
        let guard = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"admission webhook \"identity.hcp-fleet.io\" denied the request: a token for an openshift-* account","reason":"Forbidden","code":403}"#;
        let no_account = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"serviceaccounts \"nobody\" not found","reason":"NotFound","details":{"name":"nobody","kind":"serviceaccounts"},"code":404}"#;
        for answer in [guard, no_account] {
            assert!(!retried(&refused(answer)), "retried: {answer}");
        }
        let unavailable = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server is currently unable to handle the request","reason":"ServiceUnavailable","code":503}"#;
        assert!(retried(&refused(unavailable)));
    }
}
