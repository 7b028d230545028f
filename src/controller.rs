//! The HCP controller (kube-runtime, after kube-rs's controller-rs): reconcile + context +
//! error policy. One reconcile walks DESIGN.md's phases for one HCP, each gated on the one
//! before, and always ends by reporting what it found. Reconciles are stateless between runs:
//! certificates live in Secrets, history in the Policy; the context holds only caches.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tracing::{info, warn};

use crate::certificates::{self, CertBundle};
use crate::config::AgentConfig;
use crate::crd::hostedcontrolplane::{PAUSE_ANNOTATION, Pause};
use crate::crd::{ComplianceState, HostedControlPlane, Policy};
use crate::hosted::clients::HostedClients;
use crate::hosted::webhooks::{self, HostedWebhooks, MUTATING_NAME, VALIDATING_NAME};
use crate::management::{self, FIELD_MANAGER, HcpInputs};
use crate::metrics::{DriftLabels, HcpLabels, Metrics};
use crate::reporting::{self, Concern, Observation, Observations, RollupRow};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{namespace}: {phase}: {reason}")]
    Phase {
        namespace: String,
        phase: &'static str,
        reason: String,
    },
}

/// How the agent builds the URL the hosted kube-apiserver calls (the test bed overrides it).
pub type UrlBase = Arc<dyn Fn(&AgentConfig, &str) -> String + Send + Sync>;

/// What the management cluster offers, discovered once at start.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    pub has_policy_v1: bool,
    pub policy_crd: bool,
    pub pending_supported: bool,
}

pub struct Context {
    pub client: Client,
    pub config: Arc<std::sync::RwLock<Arc<AgentConfig>>>,
    pub metrics: Arc<Metrics>,
    pub clients: HostedClients,
    pub caps: Capabilities,
    pub agent_namespace: String,
    pub local_mode: bool,
    pub url_base: UrlBase,
    drift_tx: mpsc::UnboundedSender<ObjectRef<HostedControlPlane>>,
    drift: Mutex<HashMap<String, DriftWatch>>,
    /// Drift seen since the last reconcile of that namespace (reported, then cleared). Shared
    /// with the drift watch tasks.
    drift_notes: Arc<Mutex<HashMap<String, Vec<String>>>>,
    rollup: Mutex<BTreeMap<String, RollupRow>>,
    rollup_changed: Notify,
    policy_crd_warned: std::sync::atomic::AtomicBool,
    recorder: kube::runtime::events::Recorder,
    failures: Mutex<HashMap<String, u32>>,
    /// The last probe verdict per HCP namespace (shared with the probe tasks).
    probe_states: Arc<Mutex<HashMap<String, ComplianceState>>>,
    /// UIDs of deleted HCPs (a UID is never reused, so a recreated HCP is not affected).
    tombstones: Mutex<std::collections::HashSet<String>>,
}

/// What runs between reconciles for one hosted cluster: the drift watch and the probe.
struct DriftWatch {
    server: String,
    desired: Arc<Mutex<HostedWebhooks>>,
    task: tokio::task::JoinHandle<()>,
    probe_task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for DriftWatch {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(p) = &self.probe_task {
            p.abort();
        }
    }
}

impl Context {
    pub fn config(&self) -> Arc<AgentConfig> {
        match self.config.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn labels(ns: &str, cluster: &str) -> HcpLabels {
        HcpLabels {
            hcp_namespace: ns.to_string(),
            hosted_cluster: cluster.to_string(),
        }
    }

    /// This HCP (by UID, never reused) was seen deleted.
    fn is_deleted(&self, hcp: &HostedControlPlane) -> bool {
        hcp.uid()
            .is_some_and(|uid| self.tombstones.lock().is_ok_and(|t| t.contains(&uid)))
    }

    /// Everything the agent holds for an HCP that went away.
    /// `cluster` is the HCP's name (which names its metric series).
    pub fn forget(&self, ns: &str, cluster: &str) {
        if let Ok(mut r) = self.rollup.lock() {
            r.remove(ns);
        }
        self.metrics.forget(ns, cluster);
        self.clients.forget(ns);
        if let Ok(mut d) = self.drift.lock() {
            d.remove(ns);
        }
        if let Ok(mut n) = self.drift_notes.lock() {
            n.remove(ns);
        }
        if let Ok(mut f) = self.failures.lock() {
            f.remove(ns);
        }
        if let Ok(mut p) = self.probe_states.lock() {
            p.remove(ns);
        }
        self.update_known();
        self.rollup_changed.notify_one();
    }

    fn update_known(&self) {
        let n = self.rollup.lock().map(|r| r.len()).unwrap_or(0);
        self.metrics.hosted_clusters.set(n as i64);
    }
}

fn phase_err<'a>(ns: &'a str, phase: &'static str) -> impl Fn(kube::Error) -> ReconcileError + 'a {
    move |e| ReconcileError::Phase {
        namespace: ns.to_string(),
        phase,
        reason: e.to_string(),
    }
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The hosted cluster's name: HyperShift names the HCP after its HostedCluster.
fn cluster_name(hcp: &HostedControlPlane) -> String {
    hcp.name_any()
}

async fn apply<K>(api: &Api<K>, name: &str, obj: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
}

fn secret_bytes(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .as_ref()
        .map(|d| d.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

pub async fn reconcile(
    hcp: Arc<HostedControlPlane>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let ns = hcp.namespace().unwrap_or_default();
    let cluster = cluster_name(&hcp);
    let span = tracing::info_span!("reconcile", hcp_namespace = %ns, hosted_cluster = %cluster);
    let _enter = span.enter();
    let started = Instant::now();
    let mut obs = Observations::new();
    let mut drift_repaired = 0;
    match hcp.pause(jiff::Timestamp::now()) {
        Pause::Off => {}
        Pause::Invalid(why) => warn!(reason = %why, "pause annotation ignored"),
        Pause::Indefinite => return paused(&hcp, &ns, &cluster, &ctx, None).await,
        Pause::Until(t) => return paused(&hcp, &ns, &cluster, &ctx, Some(t)).await,
    }
    let result = run_phases(&hcp, &ns, &cluster, &ctx, &mut obs, &mut drift_repaired).await;
    // Phases are gated: what a reconcile did not reach is unknown now, never its old verdict.
    for c in Concern::ALL {
        obs.entry(c).or_insert_with(|| {
            Observation::pending("not checked: an earlier phase did not complete")
        });
    }
    match &result {
        Err(e) => warn!(error = %e, "reconcile failed"),
        Ok(_) => {
            if let Ok(mut f) = ctx.failures.lock() {
                f.remove(&ns);
            }
        }
    }
    // A reconcile that was in flight when its HCP was deleted must not bring the row, the
    // series or the client back: it repeats the cleanup instead of reporting.
    if ctx.is_deleted(&hcp) {
        ctx.forget(&ns, &cluster);
        return Ok(Action::await_change());
    }
    report(&ctx, &hcp, &ns, &cluster, &obs, drift_repaired).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    result
}

/// A paused HCP: its drift watch and probe stop, nothing is applied, and the Policy says so
/// (every concern Pending, so no NonCompliant alert fires for a deliberate pause). Removing
/// the annotation is an HCP change and resumes it; a pause with a time ends by itself.
async fn paused(
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    ctx: &Context,
    until: Option<jiff::Timestamp>,
) -> Result<Action, ReconcileError> {
    if let Ok(mut d) = ctx.drift.lock() {
        d.remove(ns);
    }
    if let Ok(mut p) = ctx.probe_states.lock() {
        p.remove(ns);
    }
    let why = match until {
        Some(t) => format!(
            "paused by {PAUSE_ANNOTATION} until {}; the agent changes nothing for this HCP",
            t.strftime("%Y-%m-%dT%H:%M:%SZ")
        ),
        None => format!("paused by {PAUSE_ANNOTATION}; the agent changes nothing for this HCP"),
    };
    info!(%why, "paused");
    let obs: Observations = Concern::ALL
        .into_iter()
        .map(|c| (c, Observation::pending(why.clone())))
        .collect();
    if ctx.is_deleted(hcp) {
        ctx.forget(ns, cluster);
        return Ok(Action::await_change());
    }
    report(ctx, hcp, ns, cluster, &obs, 0).await;
    Ok(match until {
        Some(t) => {
            let left = jiff::Timestamp::now().duration_until(t);
            Action::requeue(std::time::Duration::try_from(left).unwrap_or_default())
        }
        None => Action::await_change(),
    })
}

async fn run_phases(
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    ctx: &Context,
    obs: &mut Observations,
    drift_repaired: &mut u64,
) -> Result<Action, ReconcileError> {
    let cfg = ctx.config();
    // Phase 1: discovery.
    if !hcp.is_ready() {
        for c in Concern::ALL {
            obs.insert(
                c,
                Observation::pending("waiting for the HostedControlPlane to be ready"),
            );
        }
        return Ok(Action::await_change());
    }
    let owner = hcp.controller_owner_ref(&()).map(|mut o: OwnerReference| {
        // Owned for garbage collection, but not blocking HyperShift's deletion.
        o.block_owner_deletion = Some(false);
        o.controller = Some(false);
        o
    });

    // Phase 2: certificates.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let ca_name = management::ca_secret_name(&cfg);
    let tls_name = management::tls_secret_name(&cfg);
    let ca_s = secrets
        .get_opt(&ca_name)
        .await
        .map_err(phase_err(ns, "certificates"))?;
    let tls_s = secrets
        .get_opt(&tls_name)
        .await
        .map_err(phase_err(ns, "certificates"))?;
    let existing = match (&ca_s, &tls_s) {
        (Some(a), Some(b)) => CertBundle::from_secret_data(&secret_bytes(a), &secret_bytes(b)),
        _ => None,
    };
    let sans = management::serving_sans(&cfg, ns, ctx.local_mode);
    let now = jiff::Timestamp::now().as_second();
    let (certs, why) = certificates::plan(existing.as_ref(), &cfg, &sans, now).map_err(|e| {
        obs.insert(
            Concern::Certificate,
            Observation::violation(format!("certificate: {e}")),
        );
        ReconcileError::Phase {
            namespace: ns.to_string(),
            phase: "certificates",
            reason: e.to_string(),
        }
    })?;
    if let Some(why) = &why {
        info!(reason = %why, "certificates updated");
    }
    let facts =
        certificates::inspect(&certs.serving.cert_pem).map_err(|e| ReconcileError::Phase {
            namespace: ns.to_string(),
            phase: "certificates",
            reason: e.to_string(),
        })?;
    ctx.metrics
        .cert_expiry
        .get_or_create(&Context::labels(ns, cluster))
        .set(facts.not_after);
    let expires = jiff::Timestamp::from_second(facts.not_after)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| facts.not_after.to_string());

    // Phase 3: the admission service.
    let objs = management::render(
        &cfg,
        &HcpInputs {
            namespace: ns,
            owner,
            certs: &certs,
            has_policy_v1: ctx.caps.has_policy_v1,
        },
    )
    .map_err(|e| ReconcileError::Phase {
        namespace: ns.to_string(),
        phase: "render",
        reason: e.to_string(),
    })?;
    let applied: Result<Deployment, kube::Error> = async {
        apply(&secrets, &ca_name, &objs.ca_secret).await?;
        apply(&secrets, &tls_name, &objs.tls_secret).await?;
        let svc_name = &cfg.admission.service_name;
        apply(
            &Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns),
            svc_name,
            &objs.service_account,
        )
        .await?;
        apply(
            &Api::<Service>::namespaced(ctx.client.clone(), ns),
            svc_name,
            &objs.service,
        )
        .await?;
        apply(
            &Api::<NetworkPolicy>::namespaced(ctx.client.clone(), ns),
            svc_name,
            &objs.network_policy,
        )
        .await?;
        if let Some(pdb) = &objs.pdb {
            let gvk = GroupVersionKind::gvk("policy", "v1", "PodDisruptionBudget");
            let ar = ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
            let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
            let obj: DynamicObject =
                serde_json::from_value(pdb.clone()).map_err(kube::Error::SerdeError)?;
            apply(&api, svc_name, &obj).await?;
        }
        apply(
            &Api::<Deployment>::namespaced(ctx.client.clone(), ns),
            svc_name,
            &objs.deployment,
        )
        .await
    }
    .await;
    let deployment = match applied {
        Ok(d) => d,
        Err(e) => {
            obs.insert(
                Concern::AdmissionService,
                Observation::violation(format!("applying the admission service: {e}")),
            );
            ctx.metrics
                .reconcile_errors
                .get_or_create(&crate::metrics::PhaseLabels {
                    phase: "admission-service".into(),
                })
                .inc();
            return Err(phase_err(ns, "admission-service")(e));
        }
    };
    obs.insert(
        Concern::Certificate,
        Observation::compliant(format!("serving certificate valid until {expires}")),
    );
    if !management::deployment_available(&deployment) {
        obs.insert(
            Concern::AdmissionService,
            Observation::pending("waiting for the admission Deployment to become available"),
        );
        obs.insert(
            Concern::HostedWebhooks,
            Observation::pending("waiting for the admission service"),
        );
        // The Deployment watch (owns) brings us back when its status changes.
        return Ok(Action::requeue(Duration::from_secs(300)));
    }
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    obs.insert(
        Concern::AdmissionService,
        Observation::compliant(format!(
            "Deployment available ({ready}/{} replicas)",
            cfg.admission.replicas
        )),
    );

    // Phase 4: hosted cluster access.
    let access = &cfg.hosted_access;
    let refuse = |obs: &mut Observations, msg: String| {
        obs.insert(Concern::HostedWebhooks, Observation::violation(msg.clone()));
        ReconcileError::Phase {
            namespace: ns.to_string(),
            phase: "hosted-access",
            reason: msg,
        }
    };
    let secret = match secrets.get_opt(&access.kubeconfig_secret).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(refuse(
                obs,
                format!("kubeconfig secret {} not found", access.kubeconfig_secret),
            ));
        }
        Err(e) => return Err(refuse(obs, format!("reading kubeconfig secret: {e}"))),
    };
    let data = secret_bytes(&secret);
    let Some(raw) = data.get(&access.kubeconfig_key) else {
        return Err(refuse(
            obs,
            format!(
                "kubeconfig secret {} has no key {}",
                access.kubeconfig_secret, access.kubeconfig_key
            ),
        ));
    };
    // Bound first: the family's guard must not live across the await.
    let requests = ctx
        .metrics
        .hosted_requests
        .get_or_create(&Context::labels(ns, cluster))
        .clone();
    let (hosted, server) = match ctx
        .clients
        .get(ns, &access.kubeconfig_secret, raw, access, requests)
        .await
    {
        Ok(c) => c,
        Err(e) => return Err(refuse(obs, e.to_string())),
    };

    // Phase 5: webhook configurations in the hosted cluster.
    let url_base = match local_endpoint(ctx, &cfg, ns).await {
        Some(u) => u,
        None => (ctx.url_base)(&cfg, ns),
    };
    let desired = webhooks::render(&cfg, ns, &url_base, &certs.ca_bundle_pem())
        .map_err(|e| refuse(obs, e.to_string()))?;
    let want = usize::from(desired.validating.is_some()) + usize::from(desired.mutating.is_some());
    let labels = Context::labels(ns, cluster);
    ctx.metrics
        .webhooks_desired
        .get_or_create(&labels)
        .set(want as i64);
    let timeout = Duration::from_secs(u64::from(access.request_timeout_seconds));
    let t0 = Instant::now();
    // The drift watch learns the new desired state before we write it, so our own write is
    // never mistaken for someone else's change.
    ensure_drift_watch(ctx, ns, cluster, &server, &hosted, desired.clone());
    let installed = tokio::time::timeout(timeout, install_hosted(&hosted, &desired)).await;
    ctx.metrics
        .hosted_latency
        .get_or_create(&labels)
        .observe(t0.elapsed().as_secs_f64());
    match installed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            ctx.metrics.hosted_errors.get_or_create(&labels).inc();
            ctx.metrics.webhooks_installed.get_or_create(&labels).set(0);
            return Err(refuse(obs, format!("hosted kube-apiserver {server}: {e}")));
        }
        Err(_) => {
            ctx.metrics.hosted_errors.get_or_create(&labels).inc();
            ctx.metrics.webhooks_installed.get_or_create(&labels).set(0);
            return Err(refuse(
                obs,
                format!(
                    "hosted kube-apiserver {server} did not answer within {}s",
                    timeout.as_secs()
                ),
            ));
        }
    }
    ctx.metrics
        .webhooks_installed
        .get_or_create(&labels)
        .set(want as i64);

    // Phase 6: keep it so (the watch started above reports drift).
    let drift = ctx
        .drift_notes
        .lock()
        .ok()
        .and_then(|mut n| n.remove(ns))
        .unwrap_or_default();
    *drift_repaired = drift.len() as u64;
    let msg = if drift.is_empty() {
        format!("{want} webhook configuration(s) installed and current")
    } else {
        format!("drift repaired: {}", drift.join("; "))
    };
    obs.insert(Concern::HostedWebhooks, Observation::compliant(msg));
    if !drift.is_empty() {
        // Come back once more so the history also records the steady state after the repair.
        return Ok(Action::requeue(Duration::from_millis(500)));
    }

    // Phase 7: prove it end to end, through the hosted kube-apiserver.
    let probe = probe(&hosted, timeout).await;
    ctx.metrics
        .probe_success
        .get_or_create(&labels)
        .set(i64::from(probe.state == ComplianceState::Compliant));
    if let Ok(mut p) = ctx.probe_states.lock() {
        p.insert(ns.to_string(), probe.state);
    }
    ensure_probe_task(
        ctx,
        ns,
        cluster,
        &hosted,
        timeout,
        Duration::from_secs(u64::from(cfg.probe_interval_seconds)),
    );
    obs.insert(Concern::EndToEndProbe, probe);
    // Between reconciles only the probe task runs (one request per interval); it queues a
    // reconcile when its verdict changes.
    Ok(Action::await_change())
}

/// The periodic probe of one hosted cluster: the agent's only periodic request. A full
/// reconcile (which reports) is queued only when the verdict changes, so a steady fleet costs
/// one hosted request per cluster per interval and nothing on the management cluster.
fn ensure_probe_task(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    hosted: &Client,
    timeout: Duration,
    every: Duration,
) {
    let Ok(mut watches) = ctx.drift.lock() else {
        return;
    };
    let Some(w) = watches.get_mut(ns) else {
        return;
    };
    if w.probe_task.as_ref().is_some_and(|t| !t.is_finished()) {
        return;
    }
    let hosted = hosted.clone();
    let states = ctx.probe_states.clone();
    let tx = ctx.drift_tx.clone();
    let hcp_ref = ObjectRef::<HostedControlPlane>::new(cluster).within(ns);
    let ns = ns.to_string();
    w.probe_task = Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tick.tick().await;
            let now = probe(&hosted, timeout).await.state;
            let before = states.lock().ok().and_then(|s| s.get(&ns).copied());
            if before != Some(now) {
                info!(hcp_namespace = %ns, verdict = now.as_str(), "end-to-end probe changed");
                let _ = tx.send(hcp_ref.clone());
            }
        }
    }));
}

/// A dry-run create of a labelled ConfigMap that only the admission service's probe webhook
/// sees. Its denial (with the service's answer) proves the hosted kube-apiserver reaches the
/// service over TLS; an allowed request means the call failed and failurePolicy Ignore let it
/// through.
async fn probe(hosted: &Client, timeout: Duration) -> Observation {
    use crate::admission::policies::{PROBE_ANSWER, PROBE_LABEL};
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: Api<ConfigMap> = Api::namespaced(hosted.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("hcp-fleet-probe-".into());
    cm.metadata.labels = Some(BTreeMap::from([(
        PROBE_LABEL.to_string(),
        "true".to_string(),
    )]));
    let pp = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    match tokio::time::timeout(timeout, api.create(&pp, &cm)).await {
        // No timing in the message: a steady probe must not add history (and writes) each time.
        Ok(Err(kube::Error::Api(s))) if s.message.contains(PROBE_ANSWER) => {
            tracing::debug!(ms = t0.elapsed().as_millis() as u64, "probe answered");
            Observation::compliant(
                "the admission service answered the probe through the hosted kube-apiserver",
            )
        }
        Ok(Ok(_)) => Observation::violation(
            "the hosted kube-apiserver did not reach the admission service (the probe was let through by failurePolicy Ignore)",
        ),
        Ok(Err(e)) => Observation::violation(format!("probe failed: {e}")),
        Err(_) => {
            Observation::violation(format!("probe got no answer within {}s", timeout.as_secs()))
        }
    }
}

/// In local mode (the test bed), the address the stand-in kubelet published for the service.
async fn local_endpoint(ctx: &Context, cfg: &AgentConfig, ns: &str) -> Option<String> {
    if !ctx.local_mode {
        return None;
    }
    let svc = Api::<Service>::namespaced(ctx.client.clone(), ns)
        .get_opt(&cfg.admission.service_name)
        .await
        .ok()
        .flatten()?;
    svc.annotations()
        .get(crate::localcp::kubelet::LOCAL_ENDPOINT_ANNOTATION)
        .cloned()
}

/// Applies only what differs from the live object: some API servers (1.20 among them) bump a
/// no-op server-side apply's managedFields timestamp, and with it the resourceVersion, which
/// every watcher then sees as a change.
async fn apply_if_changed<K>(api: &Api<K>, name: &str, desired: &K) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(live) = api.get_opt(name).await? {
        let want = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
        let have = serde_json::to_value(&live).map_err(kube::Error::SerdeError)?;
        if webhooks::webhooks_match(&want, &have) {
            return Ok(());
        }
    }
    apply(api, name, desired).await.map(|_| ())
}

async fn install_hosted(hosted: &Client, desired: &HostedWebhooks) -> Result<(), kube::Error> {
    let vapi: Api<ValidatingWebhookConfiguration> = Api::all(hosted.clone());
    let mapi: Api<MutatingWebhookConfiguration> = Api::all(hosted.clone());
    match &desired.validating {
        Some(v) => apply_if_changed(&vapi, VALIDATING_NAME, v).await?,
        None => delete_if_present(&vapi, VALIDATING_NAME).await?,
    }
    match &desired.mutating {
        Some(m) => apply_if_changed(&mapi, MUTATING_NAME, m).await?,
        None => delete_if_present(&mapi, MUTATING_NAME).await?,
    }
    // Owned configurations under other names (an older agent's) are no longer wanted.
    let lp = ListParams::default().labels(&webhooks::owned_selector());
    for o in vapi.list_metadata(&lp).await? {
        let name = o.name_any();
        if name != VALIDATING_NAME {
            delete_if_present(&vapi, &name).await?;
        }
    }
    for o in mapi.list_metadata(&lp).await? {
        let name = o.name_any();
        if name != MUTATING_NAME {
            delete_if_present(&mapi, &name).await?;
        }
    }
    Ok(())
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// One watch per hosted cluster on the agent's own webhook configurations; a change that does
/// not match what we applied (or a deletion) is drift: counted, noted for the Policy, and the
/// HCP is queued for repair at once.
fn ensure_drift_watch(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    server: &str,
    hosted: &Client,
    desired: HostedWebhooks,
) {
    let Ok(mut watches) = ctx.drift.lock() else {
        return;
    };
    if let Some(w) = watches.get(ns)
        && w.server == server
        && !w.task.is_finished()
    {
        if let Ok(mut d) = w.desired.lock() {
            *d = desired;
        }
        return;
    }
    let desired = Arc::new(Mutex::new(desired));
    let tx = ctx.drift_tx.clone();
    let metrics = ctx.metrics.clone();
    let hcp_ref = ObjectRef::<HostedControlPlane>::new(cluster).within(ns);
    let ns_s = ns.to_string();
    let cluster_s = cluster.to_string();
    let hosted = hosted.clone();
    let d2 = desired.clone();
    let drift_notes = ctx.drift_notes.clone();
    let task = tokio::spawn(async move {
        let cfg = watcher::Config::default().labels(&webhooks::owned_selector());
        let v = watcher(
            Api::<ValidatingWebhookConfiguration>::all(hosted.clone()),
            cfg.clone(),
        )
        .default_backoff()
        .map(|e| {
            e.ok()
                .and_then(|ev| classify("ValidatingWebhookConfiguration", ev))
        });
        let m = watcher(Api::<MutatingWebhookConfiguration>::all(hosted), cfg)
            .default_backoff()
            .map(|e| {
                e.ok()
                    .and_then(|ev| classify("MutatingWebhookConfiguration", ev))
            });
        let mut events = std::pin::pin!(futures::stream::select(v, m));
        while let Some(ev) = events.next().await {
            let Some((kind, what, live)) = ev else {
                continue;
            };
            let want = {
                let Ok(d) = d2.lock() else { continue };
                match kind {
                    "ValidatingWebhookConfiguration" => d
                        .validating
                        .as_ref()
                        .and_then(|x| serde_json::to_value(x).ok()),
                    _ => d
                        .mutating
                        .as_ref()
                        .and_then(|x| serde_json::to_value(x).ok()),
                }
            };
            let Some(want) = want else { continue };
            let drifted = match &live {
                Some(l) => !webhooks::webhooks_match(&want, l),
                None => true,
            };
            if !drifted {
                continue;
            }
            let name = want["metadata"]["name"].as_str().unwrap_or("?").to_string();
            warn!(hcp_namespace = %ns_s, kind, name = %name, what, "webhook configuration drifted; repairing");
            metrics
                .drift
                .get_or_create(&DriftLabels {
                    hcp_namespace: ns_s.clone(),
                    hosted_cluster: cluster_s.clone(),
                    kind: kind.to_string(),
                })
                .inc();
            if let Ok(mut n) = drift_notes.lock() {
                n.entry(ns_s.clone())
                    .or_default()
                    .push(format!("{kind} {name} was {what} by someone else"));
            }
            let _ = tx.send(hcp_ref.clone());
        }
    });
    watches.insert(
        ns.to_string(),
        DriftWatch {
            server: server.to_string(),
            desired,
            task,
            probe_task: None,
        },
    );
}

/// A live change to one of our configurations: (kind, what happened, the live object).
/// Initial listings are not changes: the reconcile that started the watch applied them.
fn classify<K: serde::Serialize>(
    kind: &'static str,
    ev: watcher::Event<K>,
) -> Option<(&'static str, &'static str, Option<Value>)> {
    match ev {
        watcher::Event::Apply(o) => Some((kind, "changed", serde_json::to_value(o).ok())),
        watcher::Event::Delete(_) => Some((kind, "deleted", None)),
        _ => None,
    }
}

async fn report(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    obs: &Observations,
    drift_repaired: u64,
) {
    let overall = reporting::aggregate(obs.values().map(|o| &o.state));
    let v = match overall {
        ComplianceState::Compliant => 0,
        ComplianceState::NonCompliant => 1,
        ComplianceState::Pending => -1,
    };
    {
        let Ok(mut r) = ctx.rollup.lock() else {
            return;
        };
        // Under the roll-up lock, which `forget` also takes: the deletion watcher records the
        // tombstone before it forgets, so a late report can never resurrect the row.
        if ctx.is_deleted(hcp) {
            return;
        }
        ctx.metrics
            .compliance
            .get_or_create(&Context::labels(ns, cluster))
            .set(v);
        let row = RollupRow {
            cluster_name: cluster.to_string(),
            state: overall,
        };
        if r.get(ns) != Some(&row) {
            r.insert(ns.to_string(), row);
            ctx.rollup_changed.notify_one();
        }
    }
    ctx.update_known();
    if !ctx.caps.policy_crd {
        return;
    }
    if let Err(e) = write_policy(ctx, hcp, ns, cluster, obs, drift_repaired).await {
        warn!(hcp_namespace = %ns, error = %e, "writing the Policy failed");
    }
}

async fn write_policy(
    ctx: &Context,
    hcp: &HostedControlPlane,
    ns: &str,
    cluster: &str,
    obs: &Observations,
    drift_repaired: u64,
) -> Result<(), kube::Error> {
    let api: Api<Policy> = Api::namespaced(ctx.client.clone(), ns);
    let mut desired = reporting::render_policy(ns, cluster);
    if let Some(o) = hcp.controller_owner_ref(&()) {
        desired.metadata.owner_references = Some(vec![OwnerReference {
            controller: Some(false),
            block_owner_deletion: Some(false),
            ..o
        }]);
    }
    let current = api.get_opt(reporting::POLICY_NAME).await?;
    let mut current = match current {
        Some(c)
            if c.spec == desired.spec
                && c.labels().get(reporting::CLUSTER_LABEL) == Some(&cluster.to_string()) =>
        {
            c
        }
        _ => apply(&api, reporting::POLICY_NAME, &desired).await?,
    };
    if drift_repaired > 0 {
        // The running total lives on the Policy, so it survives agent restarts.
        let before: u64 = current
            .annotations()
            .get(reporting::DRIFT_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let patch = serde_json::json!({"metadata": {"annotations": {reporting::DRIFT_ANNOTATION: (before + drift_repaired).to_string()}}});
        current = api
            .patch(
                reporting::POLICY_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    let next = reporting::next_status(
        ns,
        current.status.as_ref(),
        obs,
        &now_rfc3339(),
        ctx.caps.pending_supported,
    );
    if current.status.as_ref() != Some(&next) {
        patch_policy_status(&api, reporting::POLICY_NAME, &next).await?;
        // Events on the Policy, as ACM's own controllers emit them.
        let reference = current.object_ref(&());
        for e in reporting::new_entries(current.status.as_ref(), &next) {
            let ev = kube::runtime::events::Event {
                type_: if e.compliant {
                    kube::runtime::events::EventType::Normal
                } else {
                    kube::runtime::events::EventType::Warning
                },
                reason: format!("policy: {ns}/{}", e.template),
                note: Some(e.message),
                action: "ComplianceStateUpdated".into(),
                secondary: None,
            };
            if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
                warn!(hcp_namespace = %ns, error = %err, "publishing a Policy event failed");
            }
        }
    }
    Ok(())
}

/// Per-HCP exponential backoff: 2 s, 4 s, … capped at 60 s; a success resets it (in
/// `reconcile`). One broken hosted cluster retries on its own schedule and never holds up the
/// others.
/// A whole status, by merge patch on the status subresource (the Policy's status is entirely
/// ours; arrays are replaced whole).
async fn patch_policy_status(
    api: &Api<Policy>,
    name: &str,
    status: &crate::crd::PolicyStatus,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

pub fn error_policy(
    hcp: Arc<HostedControlPlane>,
    _err: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let ns = hcp.namespace().unwrap_or_default();
    let failures = ctx
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(ns).or_insert(0);
            *n = n.saturating_add(1);
            *n
        })
        .unwrap_or(1);
    Action::requeue(backoff(failures))
}

pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(failures.min(6)).min(60))
}

/// How to run the controller.
pub struct RunOptions {
    /// Where the fleet roll-up Policy lives.
    pub agent_namespace: String,
    /// Loopback SANs on serving certificates (the local test bed).
    pub local_mode: bool,
    pub url_base: UrlBase,
}

/// What the management cluster offers: policy/v1 for PDBs, the Policy CRD, Pending in its
/// compliance enum.
pub async fn discover(client: &Client) -> Capabilities {
    let has_policy_v1 = match client.list_api_groups().await {
        Ok(groups) => groups
            .groups
            .iter()
            .any(|g| g.name == "policy" && g.versions.iter().any(|v| v.version == "v1")),
        Err(e) => {
            warn!(error = %e, "API discovery failed; assuming no policy/v1");
            false
        }
    };
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let (policy_crd, pending_supported) = match crds
        .get_opt("policies.policy.open-cluster-management.io")
        .await
    {
        Ok(Some(crd)) => {
            let v = serde_json::to_value(&crd).unwrap_or(Value::Null);
            let pending = v["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|ver| ver["name"] == "v1")
                .any(|ver| {
                    ver["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["compliant"]["enum"]
                        .as_array()
                        .is_none_or(|e| e.iter().any(|x| x == "Pending"))
                });
            (true, pending)
        }
        Ok(None) => (false, false),
        Err(e) => {
            warn!(error = %e, "cannot read the Policy CRD; reporting through metrics only");
            (false, false)
        }
    };
    Capabilities {
        has_policy_v1,
        policy_crd,
        pending_supported,
    }
}

impl Context {
    pub fn new(
        client: Client,
        config: Arc<std::sync::RwLock<Arc<AgentConfig>>>,
        metrics: Arc<Metrics>,
        caps: Capabilities,
        opts: RunOptions,
    ) -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<ObjectRef<HostedControlPlane>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "hcp-fleet-agent".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        let ctx = Arc::new(Self {
            failures: Mutex::new(HashMap::new()),
            probe_states: Arc::new(Mutex::new(HashMap::new())),
            tombstones: Mutex::new(std::collections::HashSet::new()),
            recorder,
            client,
            config,
            metrics,
            clients: HostedClients::default(),
            caps,
            agent_namespace: opts.agent_namespace,
            local_mode: opts.local_mode,
            url_base: opts.url_base,
            drift_tx: tx,
            drift: Mutex::new(HashMap::new()),
            drift_notes: Arc::new(Mutex::new(HashMap::new())),
            rollup: Mutex::new(BTreeMap::new()),
            rollup_changed: Notify::new(),
            policy_crd_warned: std::sync::atomic::AtomicBool::new(false),
        });
        (ctx, rx)
    }
}

/// Writes the roll-up Policy whenever a row changes (debounced).
async fn rollup_writer(ctx: Arc<Context>) {
    let api: Api<Policy> = Api::namespaced(ctx.client.clone(), &ctx.agent_namespace);
    let mut last: Option<crate::crd::PolicyStatus> = None;
    loop {
        ctx.rollup_changed.notified().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rows = ctx.rollup.lock().map(|r| r.clone()).unwrap_or_default();
        let status = reporting::rollup_status(&rows, ctx.caps.pending_supported);
        if last.as_ref() == Some(&status) {
            continue;
        }
        let res: Result<(), kube::Error> = async {
            let current = match api.get_opt(reporting::ROLLUP_NAME).await? {
                Some(p) => p,
                None => {
                    apply(
                        &api,
                        reporting::ROLLUP_NAME,
                        &reporting::render_rollup(&ctx.agent_namespace),
                    )
                    .await?
                }
            };
            if current.status.as_ref() != Some(&status) {
                patch_policy_status(&api, reporting::ROLLUP_NAME, &status).await?;
            }
            Ok(())
        }
        .await;
        match res {
            Ok(()) => last = Some(status),
            Err(e) => {
                warn!(error = %e, "writing the roll-up Policy failed; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
                ctx.rollup_changed.notify_one();
            }
        }
    }
}

/// HCP deletions: a controller never reconciles a deleted object, so a metadata watch tells
/// the context to forget it (row, series, client, drift watch).
async fn deletion_watcher(ctx: Arc<Context>) {
    let api: Api<PartialObjectMeta<HostedControlPlane>> = Api::all(ctx.client.clone());
    let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(ev) = s.next().await {
        if let Ok(watcher::Event::Delete(m)) = ev {
            let ns = m.namespace().unwrap_or_default();
            info!(hcp_namespace = %ns, "HostedControlPlane deleted; forgetting it");
            if let Some(uid) = m.uid()
                && let Ok(mut t) = ctx.tombstones.lock()
            {
                t.insert(uid);
            }
            ctx.forget(&ns, &m.name_any());
        }
    }
}

/// Runs the controller until `shutdown` resolves. Each item of `reload` (a new
/// configuration) reconciles every HCP.
pub async fn run(
    ctx: Arc<Context>,
    drift_rx: mpsc::UnboundedReceiver<ObjectRef<HostedControlPlane>>,
    reload: mpsc::UnboundedReceiver<()>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    if !ctx.caps.policy_crd
        && !ctx
            .policy_crd_warned
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        warn!(
            "the Policy CRD (policy.open-cluster-management.io/v1) is not installed; reporting through metrics only"
        );
    }
    // Tied to this future: when the controller stops (or its task is aborted) they stop too,
    // and with them the last references to the context, its drift watches and probes.
    let _rollup = ctx
        .caps
        .policy_crd
        .then(|| AbortOnDrop(tokio::spawn(rollup_writer(ctx.clone()))));
    let _deletions = AbortOnDrop(tokio::spawn(deletion_watcher(ctx.clone())));
    let concurrency = ctx.config().concurrency;
    let hcps: Api<HostedControlPlane> = Api::all(ctx.client.clone());
    let deployments: Api<Deployment> = Api::all(ctx.client.clone());
    let owned = watcher::Config::default().labels(&format!(
        "{}={}",
        management::MANAGED_BY,
        management::MANAGED_BY_VALUE
    ));
    let drift = futures::stream::unfold(drift_rx, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    });
    // A rotated (or repaired) kubeconfig secret must reach the hosted cluster's reconcile
    // without polling: watch those secrets by name and map each to its namespace's HCPs.
    let secrets: Api<Secret> = Api::all(ctx.client.clone());
    let by_name = watcher::Config::default().fields(&format!(
        "metadata.name={}",
        ctx.config().hosted_access.kubeconfig_secret
    ));
    let controller = Controller::new(hcps, watcher::Config::default());
    let store = controller.store();
    controller
        .owns(deployments, owned)
        .watches(secrets, by_name, move |s: Secret| {
            let ns = s.namespace();
            store
                .state()
                .iter()
                .filter(|h| h.namespace() == ns)
                .map(|h| ObjectRef::from_obj(h.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(drift)
        .reconcile_all_on(futures::stream::unfold(reload, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        }))
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// A spawned task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_context() -> Arc<Context> {
        let url = "https://127.0.0.1:1".parse().expect("url");
        let client = Client::try_from(kube::Config::new(url)).expect("client");
        let caps = Capabilities {
            has_policy_v1: true,
            policy_crd: false,
            pending_supported: true,
        };
        let opts = RunOptions {
            agent_namespace: "agent".into(),
            local_mode: false,
            url_base: Arc::new(|c: &AgentConfig, ns: &str| webhooks::default_url_base(c, ns)),
        };
        let cfg = Arc::new(std::sync::RwLock::new(Arc::new(AgentConfig::default())));
        Context::new(client, cfg, Arc::new(Metrics::new()), caps, opts).0
    }

    fn hcp(uid: &str) -> HostedControlPlane {
        let mut h = HostedControlPlane::new("hc-1", Default::default());
        h.metadata.namespace = Some("clusters-hc-1".into());
        h.metadata.uid = Some(uid.into());
        h
    }

    fn all_compliant() -> Observations {
        Concern::ALL
            .iter()
            .map(|c| (*c, Observation::compliant("ok")))
            .collect()
    }

    #[tokio::test]
    async fn a_late_report_never_resurrects_a_deleted_hcp() {
        let ctx = test_context();
        if let Ok(mut t) = ctx.tombstones.lock() {
            t.insert("uid-1".into());
        }
        report(
            &ctx,
            &hcp("uid-1"),
            "clusters-hc-1",
            "hc-1",
            &all_compliant(),
            0,
        )
        .await;
        assert!(ctx.rollup.lock().expect("lock").is_empty());
        assert!(!ctx.metrics.encode().contains("clusters-hc-1"));
        // A recreated HCP (new UID) in the same namespace is reported normally.
        report(
            &ctx,
            &hcp("uid-2"),
            "clusters-hc-1",
            "hc-1",
            &all_compliant(),
            0,
        )
        .await;
        assert_eq!(ctx.rollup.lock().expect("lock").len(), 1);
    }

    #[tokio::test]
    async fn forget_drops_every_series_even_without_a_rollup_row() {
        let ctx = test_context();
        let l = Context::labels("clusters-hc-1", "hc-1");
        ctx.metrics.cert_expiry.get_or_create(&l).set(1);
        ctx.metrics.hosted_requests.get_or_create(&l).inc();
        ctx.forget("clusters-hc-1", "hc-1");
        assert!(!ctx.metrics.encode().contains("clusters-hc-1"));
    }

    #[tokio::test]
    async fn stopping_the_agent_stops_its_background_tasks() {
        let ctx = test_context();
        let (_tx, rx) = mpsc::unbounded_channel();
        let (_rtx, rrx) = mpsc::unbounded_channel();
        let weak = Arc::downgrade(&ctx);
        let run = tokio::spawn(run(ctx, rx, rrx, futures::future::pending::<()>()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        run.abort();
        let _ = run.await;
        // Aborted tasks drop their futures on the runtime; give it a moment.
        for _ in 0..50 {
            if weak.strong_count() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            weak.strong_count(),
            0,
            "nothing keeps the context (and its watches) alive"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
