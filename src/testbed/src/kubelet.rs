//! No kubelet runs in the test bed, so this plays one (and kube-proxy) for the admission
//! Deployments the agent creates. For each it runs `replicas` copies of the real
//! `hcp-fleet-agent webhook` command with the Deployment's own args and environment (only the
//! listen address and certificate directory are mapped to loopback), probes each one's
//! `/readyz` as the Deployment's readiness probe says, and routes the Service's one loopback
//! address (annotation `hcp-fleet.openshift.io/local-endpoint`, read by the agent in local
//! mode) to the ready ones (`proxy.rs`). The ready replicas' own addresses are published too
//! (`hcp-fleet.openshift.io/local-replicas`, the test bed's EndpointSlice). A new Deployment
//! generation rolls out as a Deployment with maxSurge 1 and maxUnavailable 0 does: one new
//! replica, ready, in the routes, then one old one out of the routes and stopped with SIGTERM
//! (it drains). A changed certificate Secret is written to the pods' directory, where the
//! service reloads it; each ConfigMap volume (optional ones too) is written to a directory of
//! its own as a kubelet's atomic writer does, kept current, and the args and environment
//! values naming its mount path are mapped to it. There is no registry: an image other than
//! the agent's own cannot be pulled, so its replicas never start and the old ones keep serving
//! (`pullable`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use futures::future::BoxFuture;

use super::free_port;
use super::process::ManagedProcess;
use super::proxy::ServiceProxy;
use hcp_fleet_agent::controller::{AdmissionEndpoints, ReplicasUnknown, Seen};
use hcp_fleet_model::names::{MANAGED_BY, MANAGED_BY_VALUE};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::management::deployment_available;

pub const LOCAL_ENDPOINT_ANNOTATION: &str = "hcp-fleet.openshift.io/local-endpoint";

/// The test bed's answer to "how does the hosted kube-apiserver reach the admission
/// service": the loopback address this kubelet published on the Service, and loopback names
/// on the serving certificate.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalEndpoints;

pub fn endpoints() -> Arc<dyn AdmissionEndpoints> {
    Arc::new(LocalEndpoints)
}

impl AdmissionEndpoints for LocalEndpoints {
    fn extra_sans(&self) -> Vec<String> {
        vec!["127.0.0.1".into(), "localhost".into()]
    }

    fn url_base<'a>(
        &'a self,
        management: &'a Client,
        cfg: &'a AgentConfig,
        namespace: &'a str,
        service: Option<&'a Service>,
    ) -> BoxFuture<'a, String> {
        Box::pin(async move {
            let published = published(
                management,
                &cfg.admission.service_name,
                namespace,
                service,
                LOCAL_ENDPOINT_ANNOTATION,
            )
            .await
            .ok()
            .flatten();
            published.unwrap_or_else(|| {
                hcp_fleet_render::hosted::webhooks::default_url_base(cfg, namespace)
            })
        })
    }

    /// The ready replicas' addresses this kubelet publishes (its EndpointSlice).
    fn replicas<'a>(
        &'a self,
        management: &'a Client,
        service: &'a str,
        _port: i32,
        namespace: &'a str,
        seen: Seen,
    ) -> BoxFuture<'a, Result<Vec<std::net::SocketAddr>, ReplicasUnknown>> {
        Box::pin(async move {
            Ok(published(
                management,
                service,
                namespace,
                seen.service.as_ref(),
                LOCAL_REPLICAS_ANNOTATION,
            )
            .await
            .map_err(|source| ReplicasUnknown {
                namespace: namespace.to_string(),
                source,
            })?
            .unwrap_or_default()
            .split(',')
            .filter_map(|a| a.parse().ok())
            .collect())
        })
    }
}

/// What this kubelet published on the admission Service under `annotation`: from the Service
/// as the agent's watch saw it where that carries the annotation, else read from the server
/// (the watch may not have brought the kubelet's annotation yet).
async fn published(
    management: &Client,
    service_name: &str,
    namespace: &str,
    service: Option<&Service>,
    annotation: &str,
) -> Result<Option<String>, kube::Error> {
    if let Some(v) = service.and_then(|s| s.annotations().get(annotation)) {
        return Ok(Some(v.clone()));
    }
    let svc = Api::<Service>::namespaced(management.clone(), namespace)
        .get_opt(service_name)
        .await?;
    Ok(svc.and_then(|s| s.annotations().get(annotation).cloned()))
}

/// One running replica: its process, address and readiness.
struct Replica {
    generation: i64,
    port: u16,
    process: ManagedProcess,
    /// Readiness probes failed in a row, and whether it is in the routes.
    failed: u32,
    ready: bool,
}

/// One admission Deployment as this kubelet runs it.
struct Workload {
    proxy: ServiceProxy,
    /// The pods' certificate directory (one Secret, the same files for every replica).
    dir: PathBuf,
    secret: String,
    /// Its ConfigMap volumes: (ConfigMap, where the container mounts it, its directory here).
    config_maps: Vec<(String, String, PathBuf)>,
    deployment: Deployment,
    /// The readiness probe: (period, timeout, failure threshold).
    readiness: (Duration, Duration, u32),
    replicas: Vec<Replica>,
    /// The generation whose image cannot be pulled, once its status says so.
    unpullable: Option<i64>,
}

/// Published on the Service: the ready replicas' addresses, comma-separated (the test bed's
/// EndpointSlice; the agent shakes hands with each to see which certificate it serves).
pub const LOCAL_REPLICAS_ANNOTATION: &str = "hcp-fleet.openshift.io/local-replicas";

/// How long a stopped replica may drain before it is killed.
const TERMINATION_GRACE: Duration = Duration::from_secs(10);

/// How the stand-in kubelet runs admission pods.
#[derive(Clone)]
pub struct KubeletOptions {
    /// The `hcp-fleet-agent` binary (`None`: only mark Deployments available, run nothing).
    pub binary: Option<PathBuf>,
    /// Where pod directories (certificates, logs) go.
    pub dir: PathBuf,
}

/// Runs until the handle is aborted; dropping the task stops every pod it started.
pub fn spawn(client: Client, opts: KubeletOptions) -> JoinHandle<()> {
    spawn_for(client, opts, |_| true)
}

/// `spawn` for the Deployments of the namespaces `runs` accepts only (a node's share of the
/// fleet); another kubelet may run the rest.
pub fn spawn_for(
    client: Client,
    opts: KubeletOptions,
    runs: impl Fn(&str) -> bool + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watched(&client));
        let mut pods: HashMap<String, Workload> = HashMap::new();
        // Deployments whose pod could not start (its Secret missing, say), by namespace. A
        // real kubelet keeps retrying such a pod; so does this one: when a Secret appears in
        // the namespace, and every second while any wait.
        let mut waiting: HashMap<String, Deployment> = HashMap::new();
        // Readiness, as a kubelet probes it: each pod's /readyz on its own period; after the
        // failure threshold the Deployment is marked unavailable, and available again on
        // the first success.
        let mut readiness = tokio::time::interval(Duration::from_millis(250));
        readiness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_probe: HashMap<String, Instant> = HashMap::new();
        let mut retry = tokio::time::interval(Duration::from_secs(1));
        // The tick is polled only while something waits; after a quiet spell it must fire
        // once, not once per second missed (tokio's default bursts to catch up).
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ev = tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(ev)) => ev,
                    Some(Err(_)) => continue,
                    None => break,
                },
                _ = readiness.tick(), if !pods.is_empty() => {
                    probe_readiness(&client, &mut pods, &mut last_probe).await;
                    continue;
                }
                _ = retry.tick(), if !waiting.is_empty() => {
                    let due: Vec<Deployment> = waiting.drain().map(|(_, d)| d).collect();
                    for d in due {
                        attempt(&client, &opts, &mut pods, &mut waiting, d).await;
                    }
                    continue;
                }
            };
            if !ev.namespace().is_some_and(|ns| runs(&ns)) {
                continue;
            }
            match ev {
                Either::Deployment(ev) => match *ev {
                    watcher::Event::Apply(d) | watcher::Event::InitApply(d) => {
                        attempt(&client, &opts, &mut pods, &mut waiting, d).await;
                    }
                    watcher::Event::Delete(d) => {
                        let ns = d.namespace().unwrap_or_default();
                        pods.remove(&ns);
                        waiting.remove(&ns);
                    }
                    _ => {}
                },
                Either::Service(ev) => {
                    if let watcher::Event::Apply(svc) = *ev {
                        let ns = svc.namespace().unwrap_or_default();
                        if let Some(w) = pods.get(&ns) {
                            let (url, ready) = w.addresses();
                            let a = svc.annotations();
                            if a.get(LOCAL_ENDPOINT_ANNOTATION) != Some(&url)
                                || a.get(LOCAL_REPLICAS_ANNOTATION) != Some(&ready)
                            {
                                let _ = publish(&client, &ns, &svc.name_any(), &url, &ready).await;
                            }
                        }
                    }
                }
                Either::ConfigMap(ev) => config_map_changed(&pods, *ev),
                Either::Secret(ev) => {
                    if let watcher::Event::Apply(s) | watcher::Event::InitApply(s) = *ev {
                        let ns = s.namespace().unwrap_or_default();
                        if let Some(pod) = pods.get(&ns).filter(|p| p.secret == s.name_any()) {
                            let _ = write_certs(&pod.dir, &s);
                        }
                        if let Some(d) = waiting.remove(&ns) {
                            attempt(&client, &opts, &mut pods, &mut waiting, d).await;
                        }
                    }
                }
            }
        }
    })
}

/// Probes every replica whose period has come round. A replica leaves the routes when its
/// failure threshold is reached and comes back on its next success; the Deployment's status
/// and the published addresses follow.
async fn probe_readiness(
    client: &Client,
    pods: &mut HashMap<String, Workload>,
    last: &mut HashMap<String, Instant>,
) {
    for (ns, w) in pods.iter_mut() {
        let (period, timeout, threshold) = w.readiness;
        if last.get(ns).is_some_and(|t| t.elapsed() < period) {
            continue;
        }
        last.insert(ns.clone(), Instant::now());
        let mut changed = false;
        // All replicas at once, as a kubelet probes each pod on its own; like a kubelet's
        // HTTPS probe, without judging the certificate (a replica mid-reload is not unready).
        let results = futures::future::join_all(w.replicas.iter().map(|r| async move {
            matches!(
                tokio::time::timeout(timeout, probe_get(r.port, "/readyz")).await,
                Ok(Ok(200))
            )
        }))
        .await;
        for (r, ok) in w.replicas.iter_mut().zip(results) {
            r.failed = if ok { 0 } else { r.failed.saturating_add(1) };
            let ready = ok || (r.ready && r.failed < threshold);
            if ready != r.ready {
                tracing::info!(namespace = %ns, port = r.port, ready, "test bed kubelet: readiness changed");
                r.ready = ready;
                changed = true;
            }
        }
        if changed {
            let _ = w.publish(client).await;
        }
    }
}

impl Workload {
    /// The Service's address and the ready replicas' addresses, as published.
    fn addresses(&self) -> (String, String) {
        let ready: Vec<String> = self
            .replicas
            .iter()
            .filter(|r| r.ready)
            .map(|r| format!("127.0.0.1:{}", r.port))
            .collect();
        (
            format!("https://127.0.0.1:{}", self.proxy.port),
            ready.join(","),
        )
    }

    /// Routes, published addresses and the Deployment's status, from the replicas' state.
    async fn publish(&self, client: &Client) -> Result<(), String> {
        self.proxy.set_backends(
            self.replicas
                .iter()
                .filter(|r| r.ready)
                .map(|r| r.port)
                .collect(),
        );
        // The status first: it is what tells the agent about an outage.
        self.mark_status(client).await?;
        let ns = self.deployment.namespace().unwrap_or_default();
        let (url, ready) = self.addresses();
        publish(client, &ns, &self.deployment.name_any(), &url, &ready).await
    }

    async fn mark_status(&self, client: &Client) -> Result<(), String> {
        let d = &self.deployment;
        let generation = d.metadata.generation.unwrap_or(1);
        let count = |f: &dyn Fn(&Replica) -> bool| {
            i32::try_from(self.replicas.iter().filter(|r| f(r)).count()).unwrap_or(i32::MAX)
        };
        write_status(
            client,
            d,
            count(&|_| true),
            count(&|r| r.generation == generation),
            count(&|r| r.ready),
        )
        .await
    }
}

/// The container's readiness probe as (period, timeout, failure threshold), with a
/// kubelet's defaults for what it leaves out.
fn readiness_of(d: &Deployment) -> (Duration, Duration, u32) {
    let probe = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.readiness_probe.as_ref());
    let secs = |v: Option<i32>, default: u64| {
        Duration::from_secs(
            v.and_then(|v| u64::try_from(v).ok())
                .unwrap_or(default)
                .max(1),
        )
    };
    (
        secs(probe.and_then(|p| p.period_seconds), 10),
        secs(probe.and_then(|p| p.timeout_seconds), 1),
        probe
            .and_then(|p| p.failure_threshold)
            .and_then(|f| u32::try_from(f).ok())
            .unwrap_or(3)
            .max(1),
    )
}

/// One try at running the Deployment; a failure leaves it waiting for a retry.
async fn attempt(
    client: &Client,
    opts: &KubeletOptions,
    pods: &mut HashMap<String, Workload>,
    waiting: &mut HashMap<String, Deployment>,
    d: Deployment,
) {
    let ns = d.namespace().unwrap_or_default();
    match sync(client, opts, pods, &d).await {
        Ok(()) => {
            waiting.remove(&ns);
        }
        Err(e) => {
            tracing::warn!(namespace = %ns, error = %e, "test bed kubelet; retrying");
            waiting.insert(ns, d);
        }
    }
}

/// Both watches in one stream (boxed: the events differ a lot in size).
enum Either {
    Deployment(Box<watcher::Event<Deployment>>),
    Secret(Box<watcher::Event<Secret>>),
    Service(Box<watcher::Event<Service>>),
    ConfigMap(Box<watcher::Event<ConfigMap>>),
}

impl Either {
    /// The namespace of the event's object (`None` for the watch's own markers).
    fn namespace(&self) -> Option<String> {
        fn of<K: ResourceExt>(ev: &watcher::Event<K>) -> Option<String> {
            match ev {
                watcher::Event::Apply(o)
                | watcher::Event::InitApply(o)
                | watcher::Event::Delete(o) => o.namespace(),
                _ => None,
            }
        }
        match self {
            Either::Deployment(ev) => of(ev),
            Either::Secret(ev) => of(ev),
            Either::Service(ev) => of(ev),
            Either::ConfigMap(ev) => of(ev),
        }
    }
}

/// Writes the Service's address and its ready replicas' on the Service.
async fn publish(
    client: &Client,
    ns: &str,
    svc: &str,
    url: &str,
    ready: &str,
) -> Result<(), String> {
    let patch = serde_json::json!({"metadata": {"annotations": {
        LOCAL_ENDPOINT_ANNOTATION: url,
        LOCAL_REPLICAS_ANNOTATION: ready,
    }}});
    Api::<Service>::namespaced(client.clone(), ns)
        .patch(svc, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn write_certs(dir: &Path, s: &Secret) -> Result<(), String> {
    let data = s.data.clone().unwrap_or_default();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        if !data.contains_key(key) {
            return Err(format!("secret has no {key}"));
        }
    }
    // Every key, as a kubelet mounts a Secret volume without `items` (the probe key too).
    for (key, v) in &data {
        // The API server allows only [-._a-zA-Z0-9] in keys; "." and ".." are still names.
        if key.starts_with('.') || key.contains('/') {
            continue;
        }
        // Write then rename, as the kubelet's atomic writer does: a reader never sees half a file.
        let tmp = dir.join(format!(".{key}.tmp"));
        std::fs::write(&tmp, &v.0).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, dir.join(key)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The agent's Deployments, Secrets, Services and ConfigMaps (by its label), in one stream.
fn watched(
    client: &Client,
) -> impl futures::Stream<Item = Result<Either, watcher::Error>> + Send + use<> {
    fn of<K>(
        client: &Client,
        wrap: fn(Box<watcher::Event<K>>) -> Either,
    ) -> impl futures::Stream<Item = Result<Either, watcher::Error>> + Send + use<K>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let label = format!("{MANAGED_BY}={MANAGED_BY_VALUE}");
        watcher(
            Api::<K>::all(client.clone()),
            watcher::Config::default().labels(&label),
        )
        .default_backoff()
        .map(move |e| e.map(|ev| wrap(Box::new(ev))))
    }
    // A recreated Service gets its address again, as kube-proxy would route it again.
    futures::stream::select(
        futures::stream::select(of(client, Either::Deployment), of(client, Either::Secret)),
        futures::stream::select(of(client, Either::Service), of(client, Either::ConfigMap)),
    )
}

/// A ConfigMap changed or went: the volumes of the pods that mount it follow.
fn config_map_changed(pods: &HashMap<String, Workload>, ev: watcher::Event<ConfigMap>) {
    let (cm, present) = match ev {
        watcher::Event::Apply(cm) | watcher::Event::InitApply(cm) => (cm, true),
        watcher::Event::Delete(cm) => (cm, false),
        _ => return,
    };
    let Some(w) = pods.get(&cm.namespace().unwrap_or_default()) else {
        return;
    };
    let name = cm.name_any();
    for (_, _, dir) in w.config_maps.iter().filter(|(n, _, _)| *n == name) {
        let _ = write_config_map(dir, present.then_some(&cm));
    }
}

/// Writes a ConfigMap volume's files (`None`: the ConfigMap is gone, and the optional volume
/// is emptied), each as a kubelet's atomic writer leaves it: a reader never sees half a file.
fn write_config_map(dir: &Path, cm: Option<&ConfigMap>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let data = cm.and_then(|c| c.data.clone()).unwrap_or_default();
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !data.contains_key(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    for (key, v) in &data {
        if key.starts_with('.') || key.contains('/') {
            continue;
        }
        let tmp = dir.join(format!(".{key}.tmp"));
        std::fs::write(&tmp, v).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, dir.join(key)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The pod's ConfigMap volumes its first container mounts: (ConfigMap, mount path, the
/// directory here under `dir`).
fn config_map_volumes(
    pod: &k8s_openapi::api::core::v1::PodSpec,
    dir: &Path,
) -> Vec<(String, String, PathBuf)> {
    let mounts = pod
        .containers
        .first()
        .and_then(|c| c.volume_mounts.clone())
        .unwrap_or_default();
    pod.volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let cm = v.config_map.as_ref()?;
            let mount = mounts.iter().find(|m| m.name == v.name)?;
            Some((
                cm.name.clone(),
                mount.mount_path.clone(),
                dir.join("volumes").join(&v.name),
            ))
        })
        .collect()
}

/// Brings the Deployment's replicas to its spec: the first start, a rolling update of a new
/// generation (one replica at a time: start one, wait until ready, route to it, then take an
/// old one out of the routes and stop it), or just its status.
async fn sync(
    client: &Client,
    opts: &KubeletOptions,
    pods: &mut HashMap<String, Workload>,
    d: &Deployment,
) -> Result<(), String> {
    let ns = d.namespace().unwrap_or_default();
    let generation = d.metadata.generation.unwrap_or(0);
    let want = usize::try_from(d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)).unwrap_or(1);
    let Some(binary) = &opts.binary else {
        if !deployment_available(d) {
            mark_available(client, d).await?;
        }
        return Ok(());
    };
    if !pods.contains_key(&ns) {
        let pod_spec = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .ok_or("no pod spec")?;
        let secret_name = pod_spec
            .volumes
            .iter()
            .flatten()
            .find_map(|v| v.secret.as_ref().and_then(|s| s.secret_name.clone()))
            .ok_or("no secret volume")?;
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get(&secret_name)
            .await
            .map_err(|e| e.to_string())?;
        let dir = opts.dir.join(&ns);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        write_certs(&dir, &secret)?;
        let config_maps = config_map_volumes(&pod_spec, &dir);
        for (name, _, local) in &config_maps {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?;
            write_config_map(local, cm.as_ref())?;
        }
        let proxy = ServiceProxy::start().await.map_err(|e| e.to_string())?;
        pods.insert(
            ns.clone(),
            Workload {
                proxy,
                dir,
                secret: secret_name,
                config_maps,
                deployment: d.clone(),
                readiness: readiness_of(d),
                replicas: Vec::new(),
                unpullable: None,
            },
        );
    }
    let w = pods.get_mut(&ns).ok_or("workload")?;
    w.deployment = d.clone();
    w.readiness = readiness_of(d);
    let image = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    if !pullable(&image) {
        // As a kubelet whose pull fails: no new replica starts, the old ones keep serving, and
        // the status says none is updated.
        if w.unpullable != Some(generation) {
            w.unpullable = Some(generation);
            w.publish(client).await?;
        }
        return Err(format!(
            "image {image:?} cannot be pulled (the test bed runs only the agent's own image)"
        ));
    }
    w.unpullable = None;
    // Old replicas out, one at a time, each only once its replacement is ready.
    while let Some(old) = w.replicas.iter().position(|r| r.generation != generation) {
        let fresh = start_replica(binary, w, d).await?;
        w.replicas.push(fresh);
        w.publish(client).await?;
        let gone = w.replicas.remove(old);
        w.publish(client).await?;
        gone.process.terminate(TERMINATION_GRACE);
    }
    while w.replicas.len() < want {
        let fresh = start_replica(binary, w, d).await?;
        w.replicas.push(fresh);
        w.publish(client).await?;
    }
    while w.replicas.len() > want {
        let gone = w.replicas.remove(0);
        w.publish(client).await?;
        gone.process.terminate(TERMINATION_GRACE);
    }
    // The status follows the readiness probes; make sure it names this generation.
    if !deployment_available(d)
        || d.status.as_ref().and_then(|s| s.observed_generation) != Some(generation)
    {
        w.publish(client).await?;
    }
    Ok(())
}

/// The test bed has no registry: it runs the agent's own image (whatever its registry or tag:
/// the binary is the one built here) and can pull nothing else.
pub(crate) fn pullable(image: &str) -> bool {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split([':', '@']).next() == Some("hcp-fleet-agent")
}

/// An argument or environment value naming a path in a ConfigMap volume: the same file in
/// its directory here; anything else as it is.
fn mapped(w: &Workload, a: String) -> String {
    w.config_maps
        .iter()
        .find_map(|(_, mount, local)| {
            a.strip_prefix(mount.as_str())
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
                .map(|rest| format!("{}{rest}", local.display()))
        })
        .unwrap_or(a)
}

/// Starts one replica of `d` and waits until it answers `/readyz` over TLS.
async fn start_replica(binary: &Path, w: &Workload, d: &Deployment) -> Result<Replica, String> {
    let ns = d.namespace().unwrap_or_default();
    let container = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .ok_or("no container")?;
    let port = free_port().map_err(|e| e.to_string())?;
    // The container's own args, with the listen address and cert dir mapped to this machine.
    let mut args: Vec<String> = Vec::new();
    let mut it = container.args.clone().unwrap_or_default().into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cert-dir" | "--port" | "--bind" => {
                it.next();
            }
            _ => args.push(mapped(w, a)),
        }
    }
    args.extend([
        "--cert-dir".into(),
        w.dir.display().to_string(),
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
    ]);
    let mut cmd_env: Vec<(String, String)> = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), mapped(w, v))))
        .collect();
    cmd_env.push(("RUST_LOG".into(), "info".into()));
    let process = ManagedProcess::spawn_with_env(
        &format!("webhook {ns}:{port}"),
        binary,
        &args,
        &cmd_env,
        &w.dir.join("webhook.log"),
    )
    .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(200) = probe_get(port, "/readyz").await {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "webhook for {ns} not ready: {}",
                process.log_tail(10)
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Replica {
        generation: d.metadata.generation.unwrap_or(0),
        port,
        process,
        failed: 0,
        ready: true,
    })
}

/// Without processes (`KubeletOptions::binary` unset): every replica ready at once.
/// Writes the status of `d` as available with every replica it asks for (no process runs).
pub async fn mark_available(client: &Client, d: &Deployment) -> Result<(), String> {
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    write_status(client, d, replicas, replicas, replicas).await
}

/// The Deployment's status as its controller would write it for `total` replicas, `updated`
/// of the current generation and `ready` of them ready (maxUnavailable 0: available while
/// at least the wanted number are ready).
async fn write_status(
    client: &Client,
    d: &Deployment,
    total: i32,
    updated: i32,
    ready: i32,
) -> Result<(), String> {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available = ready >= want;
    let now = super::api_now();
    let status = serde_json::json!({"status": {
        "observedGeneration": d.metadata.generation.unwrap_or(1),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": (want - ready).max(0),
        "conditions": [{
            "type": "Available",
            "status": if available { "True" } else { "False" },
            "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
            "message": "set by the test bed kubelet",
            "lastUpdateTime": now, "lastTransitionTime": now,
        }],
    }});
    Api::<Deployment>::namespaced(client.clone(), &d.namespace().unwrap_or_default())
        .patch_status(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A kubelet's HTTPS probe: GET `path` on 127.0.0.1:`port`, any certificate accepted;
/// returns the status code.
async fn probe_get(port: u16, path: &str) -> Result<u16, String> {
    let mut cfg = hcp_fleet_agent::tls::accept_any_server().map_err(|e| e.to_string())?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    exchange(&connector, port, LOOPBACK, &get_head(path), b"")
        .await
        .map(|(code, _)| code)
}

fn get_head(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
}

/// A TLS connector that trusts only `ca_pem` and speaks HTTP/1.1.
pub fn tls_connector(ca_pem: &str) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    hcp_fleet_guards::crypto::install_provider();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let mut cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

/// One HTTP/1.1 exchange with 127.0.0.1:`port` over a fresh TLS connection trusting `ca_pem`:
/// `head` (request line and headers, ending in a blank line), then `body`. Returns (status,
/// body). A failed body write is tolerated: a server may answer (413) before reading it all.
pub async fn https_request(
    port: u16,
    ca_pem: &str,
    head: &str,
    body: &[u8],
) -> Result<(u16, String), String> {
    exchange(&tls_connector(ca_pem)?, port, LOOPBACK, head, body).await
}

/// GET `path` from 127.0.0.1:`port` as a scraper that verifies the certificate against
/// `ca_pem` under `server_name` (a Service's DNS name, as a ServiceMonitor's `serverName`
/// says) rather than the loopback address it dials.
pub async fn https_get_as(
    port: u16,
    ca_pem: &str,
    server_name: &str,
    path: &str,
) -> Result<(u16, String), String> {
    exchange(
        &tls_connector(ca_pem)?,
        port,
        server_name,
        &get_head(path),
        b"",
    )
    .await
}

const LOOPBACK: &str = "127.0.0.1";

/// One HTTP/1.1 exchange with 127.0.0.1:`port` over a fresh TLS connection made by
/// `connector` (verifying `server_name`), within 3 s.
async fn exchange(
    connector: &tokio_rustls::TlsConnector,
    port: u16,
    server_name: &str,
    head: &str,
    body: &[u8],
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
            .map_err(|e| e.to_string())?;
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let _ = tls.write_all(body).await;
        let mut buf = Vec::new();
        let _ = tls.read_to_end(&mut buf).await;
        let text = String::from_utf8_lossy(&buf).to_string();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no status in {text:?}"))?;
        Ok((
            code,
            text.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default(),
        ))
    };
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// GET `path` on 127.0.0.1:`port` over TLS, trusting `ca_pem`; returns (status, body).
pub async fn https_get(port: u16, ca_pem: &str, path: &str) -> Result<(u16, String), String> {
    https_request(port, ca_pem, &get_head(path), b"").await
}
