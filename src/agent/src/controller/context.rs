//! The controller's context: the clients and settings every reconcile shares, and one
//! `HcpState` per HCP namespace holding what lives between reconciles (the hosted client, the
//! drift watch and probe tasks, the failure count, the roll-up row). Forgetting an HCP is one
//! removal from one map. Nothing here must survive a restart: certificates live in Secrets,
//! history and drift totals in each HCP's `AdmissionHealth`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, mpsc};

use super::discovery::Capabilities;
use super::endpoints::AdmissionEndpoints;
use crate::metrics::{HcpLabels, Metrics};
use hcp_fleet_model::crd::{ComplianceState, HostedControlPlane};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::hosted::wanted::Wanted;
use hcp_fleet_render::reporting::hub::RollupRow;

/// A lock that survives a panic elsewhere: every critical section here leaves the data
/// consistent, so a poisoned lock is taken as it is rather than skipping the work.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A spawned task that ends with its owner.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    pub(super) fn is_running(&self) -> bool {
        !self.0.is_finished()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one HCP's background tasks share with its reconciles: each field has one writer (the
/// module named above it, with its task), the others read.
#[derive(Default)]
pub(super) struct WatchShared {
    // Written by `io::watches` (the drift watch, and `installed_as` for the install).
    /// What the agent last applied, as the drift watch compares live objects with it.
    pub(crate) desired: Option<Wanted>,
    /// Whether `desired` has been installed: until it has, a listing that lacks or differs
    /// from it is the install still to come, not drift.
    pub(crate) applied: bool,
    /// Drift seen since the last reconcile (reported, then cleared).
    pub(crate) drift_notes: Vec<String>,
    /// Why the connection to the hosted cluster is down, while it is (set and cleared by the
    /// drift watch: a dropped watch, then an answer again).
    pub(crate) lost: Option<String>,
    // Written by `phases::probe` (its `plan`, before the install, and its task).
    /// The last end-to-end probe verdict.
    pub(crate) probe: Option<ComplianceState>,
    /// What the probe's answers must prove (the HCP's probe key; whether a rollout is on).
    pub(crate) proof: super::phases::proof::Proof,
    /// The canaries of the guards enforced now, sent one per probe round in turn.
    pub(crate) canaries: Arc<Vec<super::phases::canary::Planned>>,
    /// Each guard's last canary result (guards no longer planned are dropped).
    pub(crate) canary_results: std::collections::BTreeMap<String, super::phases::canary::Shown>,
    /// Which canary goes next.
    pub(crate) canary_next: usize,
    /// `switchOver.labelProvenNamespaces` as the last reconcile read it: the probe task asks
    /// for a reconcile when the last canary proves the guards, for it to label the namespace.
    pub(crate) label_proven: bool,
    /// The hosted cluster's own requests the admission replicas last reported denied
    /// (`probe::own_denials`; `None`: none did), read every few probe rounds.
    pub(crate) own_denials: Option<String>,
    // Written by `phases::internal_registry`.
    /// The internal registry the last reconcile wrote for the admission replicas: the probe
    /// task reads the hosted cluster's every few rounds and asks for a reconcile where it
    /// differs.
    pub(crate) internal_registry: Option<hcp_fleet_guards::pod_image_spec::InternalRegistry>,
}

/// The tasks that run between reconciles for one hosted cluster: started by `io::watches`
/// (the drift watch; `probe` by `phases::probe`).
pub(super) struct HostedWatch {
    pub(crate) server: String,
    /// What the server offered when the watch started (which kinds it watches).
    pub(crate) features: hcp_fleet_render::hosted::objects::HostedFeatures,
    pub(crate) shared: Arc<Mutex<WatchShared>>,
    pub(crate) drift: AbortOnDrop,
    pub(crate) probe: Option<AbortOnDrop>,
    /// Told once the new drift watch has the versions it watches from: the install reads after
    /// that, so a change between its read and the watch is still seen by the watch. Taken by
    /// the first install that waits for it.
    pub(crate) started: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// Everything the agent holds for one HCP namespace between reconciles, one part per owner:
/// each part is defined beside the one module that writes it, its fields private there, so no
/// field is written from two places (the others read it through the part's methods).
#[derive(Default)]
pub struct HcpState {
    /// The orchestrator's: failures and static-guard waits in a row (`reconcile::Pacing`).
    pub(super) pacing: super::reconcile::Pacing,
    /// Hosted access's: the client and the hosted cluster's confirmed identity
    /// (`phases::hosted_access::Access`).
    pub(super) access: super::phases::hosted_access::Access,
    /// The tasks between reconciles (drift watch, probe), started and stopped by
    /// `io::watches` only; what they share with the phases is `WatchShared`.
    pub(super) watch: Option<HostedWatch>,
    /// The admission service phase's: what it saw in place, what it removed, whether its
    /// Deployment served (`phases::admission_service::Kept`).
    pub(super) service: super::phases::admission_service::Kept,
    /// Trust's: the serving certificate every replica was seen to serve, and looks in a row
    /// that found one not yet serving it (`phases::trust::Settled`).
    pub(super) trust: super::phases::trust::Settled,
    /// The read cache's: what the agent last knew of each management object it reads
    /// (`io::cache::SeenMap`).
    pub(super) seen: super::io::cache::SeenMap,
    /// The report's: the HCP's fleet row and its first Pending (`report::Reported`).
    pub(super) report: super::report::Reported,
    /// The switch-over's: the namespace seen labelled (`phases::switch_over::Labelled`).
    pub(super) switch_over: super::phases::switch_over::Labelled,
}

/// How to run the controller.
pub struct RunOptions {
    /// The agent's namespace (its Lease).
    pub agent_namespace: String,
    /// How the hosted kube-apiserver reaches the admission services.
    pub endpoints: Arc<dyn AdmissionEndpoints>,
}

pub struct Context {
    pub(crate) client: Client,
    pub config: Arc<RwLock<Arc<AgentConfig>>>,
    pub metrics: Arc<Metrics>,
    pub caps: Capabilities,
    pub(crate) agent_namespace: String,
    pub(crate) endpoints: Arc<dyn AdmissionEndpoints>,
    /// Queues a reconcile of one HCP (drift seen, probe verdict changed).
    pub(super) requeue: mpsc::UnboundedSender<ObjectRef<HostedControlPlane>>,
    hcps: Mutex<HashMap<String, HcpState>>,
    /// How many of `hcps` have a roll-up row: `hcp_fleet_hosted_clusters`, moved under the
    /// `hcps` lock as rows come (`row_added`) and go (`drop_state`). Counted here, not by a
    /// pass over every HCP's state per report (quadratic in the fleet after a restart), and
    /// per controller, not on the shared gauge: a controller that stops leading cannot leave
    /// its count in the next one's.
    rows: std::sync::atomic::AtomicI64,
    /// UIDs of deleted HCPs (a UID is never reused, so a recreated HCP is not affected).
    tombstones: Mutex<HashSet<String>>,
    pub(super) rollup_changed: Notify,
    /// The management cluster's identity (the UID of its kube-system namespace), read once.
    management_identity: tokio::sync::OnceCell<String>,
    /// What publishes the agent's Events (shared with the drift tasks: one for the fleet, not
    /// a copy per hosted cluster).
    pub(super) events: Arc<Publisher>,
    /// The watch stores of the agent's own management objects (filled by `run`).
    caches: RwLock<super::io::cache::Caches>,
    /// The rollout as last read or written (`rollout.rs`): which revision each HCP runs.
    rollout: RwLock<Arc<hcp_fleet_render::rollout::RolloutView>>,
    /// Why the rollout is halted, while it is (the fleet report says so).
    rollout_halt: Mutex<Option<String>>,
    /// Why the configuration file last read was refused, while the agent runs an older one
    /// (the rollout's `ConfigurationAccepted` condition says so).
    config_refused: Mutex<Option<String>>,
    /// What is known of other installations' Leases, by namespace, and since when
    /// (`ownership.rs`: whether the installation that owns an HCP lives).
    pub(super) owner_leases: Mutex<HashMap<String, OwnerLease>>,
}

/// Whether another installation lived when last asked (an error where the server would not
/// say), and when that was.
pub(super) type OwnerLease = (std::time::Instant, Result<bool, String>);

/// The metric labels of one hosted cluster.
pub fn hcp_labels(ns: &str, cluster: &str) -> HcpLabels {
    HcpLabels {
        hcp_namespace: ns.to_string(),
        hosted_cluster: cluster.to_string(),
    }
}

/// The client and reporter the agent publishes its Events with.
pub(super) struct Publisher {
    client: Client,
    /// Who the agent's Events say reported them.
    reporter: Reporter,
}

impl Publisher {
    /// Publishes `ev` about `reference` as an Event of its own. kube's `Recorder` keys its
    /// cache by type, reason and action but not the note, so a second NonCompliant Event with
    /// a new message would only bump the first one's count and keep its old message (client-go
    /// keys by the note too): an SRE would read why the cluster failed an hour ago. A recorder
    /// without history per Event keeps each message; the agent only publishes when a message
    /// changes, so nothing repeats.
    pub(super) async fn publish(
        &self,
        ev: &kube::runtime::events::Event,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<(), kube::Error> {
        Recorder::new(self.client.clone(), self.reporter.clone())
            .publish(ev, reference)
            .await
    }

    /// A Warning with `reason`, `action` and `note` (cut to what the API server takes) about
    /// `reference`, published from a task of its own: the management API's rate limit must
    /// hold up neither a repair nor a configuration reload. A failure is logged.
    pub(super) fn warn_detached(
        self: &Arc<Self>,
        reference: k8s_openapi::api::core::v1::ObjectReference,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        use kube::runtime::events::{Event, EventType};
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(hcp_fleet_render::reporting::event_note(note)),
            action: action.into(),
            secondary: None,
        };
        let publisher = Arc::clone(self);
        rt.spawn(tracing::Instrument::in_current_span(async move {
            if let Err(e) = publisher.publish(&ev, &reference).await {
                tracing::warn!(error = %crate::human::KubeError(&e), reason = %ev.reason, "publishing an Event failed");
            }
        }));
    }
}

impl Context {
    /// `Publisher::publish`, with the agent's client and reporter.
    pub(super) async fn publish(
        &self,
        ev: &kube::runtime::events::Event,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<(), kube::Error> {
        self.events.publish(ev, reference).await
    }

    /// Publishes a Warning about the agent itself on its AdmissionRollout (`fleet` in its
    /// namespace, the object `kubectl get admissionrollout` shows), from a task of its own.
    pub fn warn_about_agent(&self, reason: &str, note: String) {
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(
                <hcp_fleet_model::crd::admission_rollout::AdmissionRollout as kube::Resource>::api_version(
                    &(),
                )
                .into_owned(),
            ),
            kind: Some("AdmissionRollout".into()),
            name: Some(hcp_fleet_model::crd::admission_rollout::ROLLOUT_NAME.into()),
            namespace: Some(self.agent_namespace.clone()),
            ..Default::default()
        };
        self.events
            .warn_detached(reference, reason, "ReadConfiguration", &note);
    }

    pub fn new(
        client: Client,
        config: Arc<RwLock<Arc<AgentConfig>>>,
        metrics: Arc<Metrics>,
        caps: Capabilities,
        opts: RunOptions,
    ) -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<ObjectRef<HostedControlPlane>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let reporter = Reporter {
            controller: "hcp-fleet-agent".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        // Each phase's error counter from zero, so the first failure shows in `increase`
        // (the alerts on reconcile errors and refused kubeconfigs).
        for phase in super::error::Phase::ALL {
            let _ = metrics
                .reconcile_errors
                .get_or_create(&crate::metrics::PhaseLabels {
                    phase: phase.as_str().into(),
                });
        }
        let events = Arc::new(Publisher {
            client: client.clone(),
            reporter,
        });
        let ctx = Arc::new(Self {
            events,
            client,
            config,
            metrics,
            caps,
            agent_namespace: opts.agent_namespace,
            endpoints: opts.endpoints,
            requeue: tx,
            hcps: Mutex::new(HashMap::new()),
            rows: std::sync::atomic::AtomicI64::new(0),
            tombstones: Mutex::new(HashSet::new()),
            rollup_changed: Notify::new(),
            management_identity: tokio::sync::OnceCell::new(),
            caches: RwLock::default(),
            rollout: RwLock::default(),
            rollout_halt: Mutex::new(None),
            config_refused: Mutex::new(None),
            owner_leases: Mutex::default(),
        });
        (ctx, rx)
    }

    pub(super) fn rollout_view(&self) -> Arc<hcp_fleet_render::rollout::RolloutView> {
        self.rollout
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_rollout_view(&self, view: hcp_fleet_render::rollout::RolloutView) {
        *self.rollout.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(view);
    }

    /// Why the rollout is halted, while it is.
    /// Records the outcome of reading the configuration file: `Some(why)` when refused.
    pub fn set_config_refused(&self, why: Option<String>) {
        *lock(&self.config_refused) = why;
    }

    pub(super) fn config_refused(&self) -> Option<String> {
        lock(&self.config_refused).clone()
    }

    pub(super) fn rollout_halt(&self) -> Option<String> {
        lock(&self.rollout_halt).clone()
    }

    /// Sets it; `true` when it changed.
    pub(super) fn set_rollout_halt(&self, halt: Option<String>) -> bool {
        let mut h = lock(&self.rollout_halt);
        let changed = *h != halt;
        *h = halt;
        changed
    }

    /// The watch stores (empty until the controller runs: every read then goes to the server).
    pub(super) fn caches(&self) -> super::io::cache::Caches {
        self.caches
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_caches(&self, caches: super::io::cache::Caches) {
        *self.caches.write().unwrap_or_else(PoisonError::into_inner) = caches;
    }

    /// The configuration in force (swapped whole on reload).
    pub fn config(&self) -> Arc<AgentConfig> {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` on the state of `ns`, creating it if this is the HCP's first reconcile.
    pub(super) fn with_hcp<R>(&self, ns: &str, f: impl FnOnce(&mut HcpState) -> R) -> R {
        f(lock(&self.hcps).entry(ns.to_string()).or_default())
    }

    /// Runs `f` on the state of `ns` if the agent holds one (a watch event must not create it).
    pub(super) fn with_known_hcp(&self, ns: &str, f: impl FnOnce(&mut HcpState)) {
        if let Some(s) = lock(&self.hcps).get_mut(ns) {
            f(s);
        }
    }

    /// The management cluster's identity: the UID of its kube-system namespace, read on first
    /// use and kept (a UID never changes).
    pub(super) async fn management_identity(&self) -> Result<String, kube::Error> {
        self.management_identity
            .get_or_try_init(|| async {
                let ns =
                    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone())
                        .get("kube-system")
                        .await?;
                Ok(ns.metadata.uid.unwrap_or_default())
            })
            .await
            .cloned()
    }

    /// The management cluster's identity if it has been read.
    pub(super) fn management_uid(&self) -> Option<String> {
        self.management_identity.get().cloned()
    }

    /// All HCP states, for the few places that need the whole fleet at once.
    pub(super) fn hcps(&self) -> MutexGuard<'_, HashMap<String, HcpState>> {
        lock(&self.hcps)
    }

    /// How many hosted clients the agent holds (one per reachable hosted cluster).
    pub fn hosted_clients(&self) -> usize {
        lock(&self.hcps)
            .values()
            .filter(|s| s.access.client().is_some())
            .count()
    }

    /// The roll-up rows, by HCP namespace.
    pub(super) fn rollup_rows(&self) -> BTreeMap<String, RollupRow> {
        lock(&self.hcps)
            .iter()
            .filter_map(|(ns, s)| s.report.row().cloned().map(|r| (ns.clone(), r)))
            .collect()
    }

    /// This HCP (by UID, never reused) was seen deleted.
    pub(super) fn is_deleted(&self, hcp: &HostedControlPlane) -> bool {
        hcp.uid()
            .is_some_and(|uid| lock(&self.tombstones).contains(&uid))
    }

    /// Records a deletion before `forget`, so a reconcile still in flight cannot bring the HCP
    /// back.
    pub(super) fn tombstone(&self, uid: String) {
        lock(&self.tombstones).insert(uid);
    }

    /// Everything the agent holds for an HCP that went away: its state (which stops its
    /// tasks and drops its client), its metric series and its roll-up row.
    /// `cluster` is the HCP's name (which names its metric series).
    pub(crate) fn forget(&self, ns: &str, cluster: &str) {
        self.drop_state(ns, cluster);
        self.metrics.set_owned_elsewhere(ns, None);
    }

    /// Everything held of the HCP (its watches, its row, its series), as `forget`, but not
    /// the note that another installation owns it.
    pub(super) fn drop_state(&self, ns: &str, cluster: &str) {
        {
            let mut hcps = lock(&self.hcps);
            if hcps.remove(ns).is_some_and(|s| s.report.row().is_some()) {
                self.rows_moved(-1);
            }
        }
        self.metrics.forget(ns, cluster);
        self.rollup_changed.notify_one();
    }

    /// Roll-up rows come (`report`: an HCP's first) or go (`drop_state`): counted in
    /// `hcp_fleet_hosted_clusters`. Called under the `hcps` lock, so the count and the rows
    /// move together.
    pub(super) fn rows_moved(&self, by: i64) {
        let n = self
            .rows
            .fetch_add(by, std::sync::atomic::Ordering::Relaxed)
            + by;
        self.metrics.hosted_clusters.set(n);
    }
}

impl super::io::cache::SeenLog for Context {
    fn last_seen(&self, ns: &str, key: &str) -> Option<super::io::cache::Seen> {
        self.with_hcp(ns, |s| s.seen.get(key))
    }

    fn record_seen(&self, ns: &str, key: String, seen: super::io::cache::Seen) {
        self.with_hcp(ns, |s| s.seen.record(key, seen));
    }

    fn mark_delivered(&self, ns: &str, key: &str, rv: &str) {
        self.with_known_hcp(ns, |s| s.seen.mark_delivered(key, rv));
    }
}
