//! No kubelet runs in the test bed, so this plays one for the admission Deployments the agent
//! creates. For each it runs the real `hcp-fleet-agent webhook` command with the Deployment's
//! own args and environment (only the listen address and certificate directory are mapped to
//! loopback), waits for `/readyz` over TLS, publishes the address on the Service (annotation
//! `hcp-fleet.openshift.io/local-endpoint`, which the agent reads in local mode), and marks the
//! Deployment available. A new Deployment generation restarts the process; a changed
//! certificate Secret is written to the process's directory, where the service reloads it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use futures::future::BoxFuture;

use super::free_port;
use super::process::ManagedProcess;
use crate::config::AgentConfig;
use crate::controller::AdmissionEndpoints;
use crate::management::{MANAGED_BY, MANAGED_BY_VALUE, deployment_available};

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
    ) -> BoxFuture<'a, String> {
        Box::pin(async move {
            let published = Api::<Service>::namespaced(management.clone(), namespace)
                .get_opt(&cfg.admission.service_name)
                .await
                .ok()
                .flatten()
                .and_then(|svc| svc.annotations().get(LOCAL_ENDPOINT_ANNOTATION).cloned());
            published.unwrap_or_else(|| crate::hosted::webhooks::default_url_base(cfg, namespace))
        })
    }

    /// The published address: behind it, this kubelet's one process per Deployment.
    fn replicas<'a>(
        &'a self,
        management: &'a Client,
        cfg: &'a AgentConfig,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<std::net::SocketAddr>, String>> {
        Box::pin(async move {
            let svc = Api::<Service>::namespaced(management.clone(), namespace)
                .get_opt(&cfg.admission.service_name)
                .await
                .map_err(|e| e.to_string())?;
            Ok(svc
                .and_then(|s| s.annotations().get(LOCAL_ENDPOINT_ANNOTATION).cloned())
                .and_then(|url| url.strip_prefix("https://").and_then(|a| a.parse().ok()))
                .into_iter()
                .collect())
        })
    }
}

struct Pod {
    generation: i64,
    port: u16,
    /// The Deployment's readiness probe: (period, timeout, failure threshold).
    readiness: (Duration, Duration, u32),
    /// Readiness probes failed in a row, and whether the Deployment is marked ready.
    failed: u32,
    ready: bool,
    deployment: Deployment,
    dir: PathBuf,
    secret: String,
    _process: ManagedProcess,
}

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
    tokio::spawn(async move {
        let label = format!("{MANAGED_BY}={MANAGED_BY_VALUE}");
        let deployments = watcher(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default().labels(&label),
        )
        .default_backoff()
        .map(|e| e.map(|ev| Either::Deployment(Box::new(ev))));
        let secrets = watcher(
            Api::<Secret>::all(client.clone()),
            watcher::Config::default().labels(&label),
        )
        .default_backoff()
        .map(|e| e.map(|ev| Either::Secret(Box::new(ev))));
        // A recreated Service gets its address again, as kube-proxy would route it again.
        let services = watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default().labels(&label),
        )
        .default_backoff()
        .map(|e| e.map(|ev| Either::Service(Box::new(ev))));
        let mut events = std::pin::pin!(futures::stream::select(
            futures::stream::select(deployments, secrets),
            services
        ));
        let mut pods: HashMap<String, Pod> = HashMap::new();
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
                        if let Some(pod) = pods.get(&ns) {
                            let url = format!("https://127.0.0.1:{}", pod.port);
                            if svc.annotations().get(LOCAL_ENDPOINT_ANNOTATION) != Some(&url) {
                                let _ = publish(&client, &ns, &svc.name_any(), &url).await;
                            }
                        }
                    }
                }
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

/// Probes every pod whose period has come round; flips its Deployment's availability when
/// the failure threshold is reached, and back on the next success.
async fn probe_readiness(
    client: &Client,
    pods: &mut HashMap<String, Pod>,
    last: &mut HashMap<String, Instant>,
) {
    for (ns, pod) in pods.iter_mut() {
        let (period, timeout, threshold) = pod.readiness;
        if last.get(ns).is_some_and(|t| t.elapsed() < period) {
            continue;
        }
        last.insert(ns.clone(), Instant::now());
        let ca = std::fs::read_to_string(pod.dir.join("ca.crt")).unwrap_or_default();
        let ok = matches!(
            tokio::time::timeout(timeout, https_get(pod.port, &ca, "/readyz")).await,
            Ok(Ok((200, _)))
        );
        pod.failed = if ok { 0 } else { pod.failed.saturating_add(1) };
        let ready = ok || (pod.ready && pod.failed < threshold);
        if ready != pod.ready {
            tracing::info!(namespace = %ns, ready, "test bed kubelet: readiness changed");
            let marked = if ready {
                mark_available(client, &pod.deployment).await
            } else {
                mark_unavailable(client, &pod.deployment).await
            };
            if marked.is_ok() {
                pod.ready = ready;
            }
        }
    }
}

async fn mark_unavailable(client: &Client, d: &Deployment) -> Result<(), String> {
    let ns = d.namespace().unwrap_or_default();
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = serde_json::json!({"status": {
        "observedGeneration": d.metadata.generation.unwrap_or(1),
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": 0,
        "availableReplicas": 0,
        "unavailableReplicas": replicas,
        "conditions": [{
            "type": "Available", "status": "False",
            "reason": "MinimumReplicasUnavailable",
            "message": "readiness probe failing (test bed)",
            "lastUpdateTime": now, "lastTransitionTime": now,
        }],
    }});
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .patch_status(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
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

/// One try at running the Deployment's pod; a failure leaves it waiting for a retry.
async fn attempt(
    client: &Client,
    opts: &KubeletOptions,
    pods: &mut HashMap<String, Pod>,
    waiting: &mut HashMap<String, Deployment>,
    d: Deployment,
) {
    let ns = d.namespace().unwrap_or_default();
    match sync_pod(client, opts, pods, &d).await {
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
}

/// Writes the address of a namespace's admission process on its Service.
async fn publish(client: &Client, ns: &str, svc: &str, url: &str) -> Result<(), String> {
    let patch = serde_json::json!({"metadata": {"annotations": {LOCAL_ENDPOINT_ANNOTATION: url}}});
    Api::<Service>::namespaced(client.clone(), ns)
        .patch(svc, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn write_certs(dir: &Path, s: &Secret) -> Result<(), String> {
    let data = s.data.clone().unwrap_or_default();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        let v = data
            .get(key)
            .ok_or_else(|| format!("secret has no {key}"))?;
        // Write then rename, as the kubelet's atomic writer does: a reader never sees half a file.
        let tmp = dir.join(format!(".{key}.tmp"));
        std::fs::write(&tmp, &v.0).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, dir.join(key)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn sync_pod(
    client: &Client,
    opts: &KubeletOptions,
    pods: &mut HashMap<String, Pod>,
    d: &Deployment,
) -> Result<(), String> {
    let ns = d.namespace().unwrap_or_default();
    let generation = d.metadata.generation.unwrap_or(0);
    let Some(binary) = &opts.binary else {
        if !deployment_available(d) {
            mark_available(client, d).await?;
        }
        return Ok(());
    };
    if let Some(p) = pods.get(&ns).filter(|p| p.generation == generation) {
        // The readiness probes own availability once the pod runs.
        if p.ready && !deployment_available(d) {
            mark_available(client, d).await?;
        }
        return Ok(());
    }
    pods.remove(&ns); // a new generation replaces the old pod
    let pod_spec = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .ok_or("no pod spec")?;
    let container = pod_spec.containers.first().ok_or("no container")?;
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
    let port = free_port().map_err(|e| e.to_string())?;
    // The container's own args, with the listen address and cert dir mapped to this machine.
    let mut args: Vec<String> = Vec::new();
    let mut it = container.args.clone().unwrap_or_default().into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cert-dir" | "--port" | "--bind" => {
                it.next();
            }
            _ => args.push(a),
        }
    }
    args.extend([
        "--cert-dir".into(),
        dir.display().to_string(),
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
    ]);
    let mut cmd_env: Vec<(String, String)> = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    cmd_env.push(("RUST_LOG".into(), "info".into()));
    let process = ManagedProcess::spawn_with_env(
        &format!("webhook {ns}"),
        binary,
        &args,
        &cmd_env,
        &dir.join("webhook.log"),
    )
    .map_err(|e| e.to_string())?;
    let ca = data_str(&secret, "ca.crt")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, _)) = https_get(port, &ca, "/readyz").await {
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
    pods.insert(
        ns.clone(),
        Pod {
            generation,
            port,
            readiness: readiness_of(d),
            failed: 0,
            ready: true,
            deployment: d.clone(),
            dir,
            secret: secret_name,
            _process: process,
        },
    );
    // Publish, then mark available: the agent renders URLs only after the availability gate.
    publish(
        client,
        &ns,
        &d.name_any(),
        &format!("https://127.0.0.1:{port}"),
    )
    .await?;
    mark_available(client, d).await
}

fn data_str(s: &Secret, key: &str) -> Result<String, String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or_else(|| format!("secret has no {key}"))
}

async fn mark_available(client: &Client, d: &Deployment) -> Result<(), String> {
    let ns = d.namespace().unwrap_or_default();
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = serde_json::json!({"status": {
        "observedGeneration": d.metadata.generation.unwrap_or(1),
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "conditions": [{
            "type": "Available", "status": "True",
            "reason": "MinimumReplicasAvailable",
            "message": "marked available by the test bed",
            "lastUpdateTime": now, "lastTransitionTime": now,
        }],
    }});
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .patch_status(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A TLS connector that trusts only `ca_pem` and speaks HTTP/1.1.
pub fn tls_connector(ca_pem: &str) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    crate::tls::install_crypto_provider();
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = tls_connector(ca_pem)?;
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let name =
            rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
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
    let head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    https_request(port, ca_pem, &head, b"").await
}
