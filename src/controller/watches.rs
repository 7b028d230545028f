//! Watches that run beside the controller's own: one drift watch per hosted cluster on the
//! agent's webhook configurations there, and the deletion watch on HostedControlPlanes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::Value;
use tracing::{Instrument, info, warn};

use super::context::{AbortOnDrop, Context, HostedWatch, WatchShared, lock};
use super::scope::Scope;
use crate::crd::HostedControlPlane;
use crate::hosted::admission_policies;
use crate::hosted::clients::HostedClient;
use crate::hosted::objects::{self, HostedFeatures};
use crate::hosted::wanted::Wanted;
use crate::hosted::watch::{Selection, watch};
use crate::hosted::webhooks;
use crate::metrics::DriftLabels;

/// Starts (or updates) the drift watch of one hosted cluster: its webhook configurations and,
/// where served, its admission policies and bindings. A change that does not match what the
/// agent applied, or a deletion, is drift: counted, noted for the health record, and the HCP
/// queued for repair at once. A new server (rotated kubeconfig) restarts the watch.
pub(crate) fn ensure_drift_watch(
    scope: &Scope<'_>,
    hosted: &HostedClient,
    desired: Wanted,
    features: HostedFeatures,
) {
    let (ctx, ns, cluster) = (scope.ctx, scope.ns, scope.cluster);
    ctx.with_hcp(ns, |s| {
        if let Some(w) = &s.watch
            && w.server == hosted.server
            && w.drift.is_running()
            && w.features == features
        {
            let mut shared = lock(&w.shared);
            if shared.desired.as_ref() != Some(&desired) {
                shared.applied = false;
            }
            shared.desired = Some(desired);
            return;
        }
        // Notes and the last probe verdict outlive a restarted watch.
        let carried = s.watch.take().map(|w| std::mem::take(&mut *lock(&w.shared)));
        let shared = Arc::new(Mutex::new(WatchShared {
            desired: Some(desired),
            applied: false,
            lost: None,
            ..carried.unwrap_or_default()
        }));
        let span = tracing::info_span!(parent: None, "drift_watch", hcp_namespace = %ns, hosted_cluster = %cluster);
        let task = drift_task(ctx, ns, cluster, hosted, features, Arc::clone(&shared))
            .instrument(span);
        s.watch = Some(HostedWatch {
            server: hosted.server.clone(),
            features,
            shared,
            drift: AbortOnDrop(tokio::spawn(task)),
            probe: None,
        });
    });
}

/// Objects per page when listing what a tenant can add to (labelled hosted objects): what one
/// page holds is all the agent holds at once, whatever the tenant keeps.
pub(crate) const HOSTED_PAGE: u32 = 10;

fn drift_task(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    hosted: &HostedClient,
    features: HostedFeatures,
    shared: Arc<Mutex<WatchShared>>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut task = DriftTask {
        tx: ctx.requeue.clone(),
        metrics: ctx.metrics.clone(),
        hcp_ref: ObjectRef::<HostedControlPlane>::new(cluster).within(ns),
        ns: ns.to_string(),
        cluster: cluster.to_string(),
        shared,
        warned: BTreeMap::new(),
        listed: BTreeMap::new(),
        lost: None,
    };
    let hosted = hosted.clone();
    let timeout = ctx.config().hosted_access.request_timeout();
    async move {
        let mut events = drift_events(hosted.service(), features);
        // While the connection is down, a look every RECOVERY_CHECK brings it back as soon
        // as the server answers again (only then: a quiet watch costs nothing).
        let mut recovery = tokio::time::interval(RECOVERY_CHECK);
        recovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let seen = tokio::select! {
                ev = events.next() => match ev {
                    Some(ev) => ev,
                    None => break,
                },
                _ = recovery.tick(), if task.lost.is_some() => {
                    if hosted.answers(RECOVERY_CHECK).await {
                        DriftEvent::Alive
                    } else {
                        continue;
                    }
                }
            };
            for change in task.changes(seen, &mut recovery) {
                if let Some(fix) = task.compare(change) {
                    // Boxed: inline, the repair's future would size this task for its whole
                    // life, a thousand of them idle.
                    Box::pin(repair_now(&hosted, fix, timeout)).await;
                }
            }
        }
    }
}

/// The drift watch's events: the two configurations by name and, where served, the
/// policies and bindings by label.
fn drift_events(
    service: crate::hosted::clients::HostedService,
    features: HostedFeatures,
) -> futures::stream::BoxStream<'static, DriftEvent> {
    // The two configurations by name: a label any tenant can set on objects of their own
    // (300 of them, 900 KiB each) must not decide what the agent lists and holds.
    let by_name = |name: &str| Selection {
        fields: Some(format!("metadata.name={name}")),
        ..Default::default()
    };
    let v = watch::<ValidatingWebhookConfiguration>(
        service.clone(),
        by_name(webhooks::VALIDATING_NAME),
    )
    .default_backoff()
    .map(|e| classify("ValidatingWebhookConfiguration", e));
    let m =
        watch::<MutatingWebhookConfiguration>(service.clone(), by_name(webhooks::MUTATING_NAME))
            .default_backoff()
            .map(|e| classify("MutatingWebhookConfiguration", e));
    let hooks = futures::stream::select(v, m);
    // Only where served: a watch of a resource the server lacks would be refused forever.
    if !features.admission_policies {
        return Box::pin(hooks);
    }
    // The policies and bindings are one per guard, named by the configuration: by label, in
    // small pages, so a tenant's labelled objects pass through a few at a time and are
    // dropped (nothing here keeps an object whose name the agent does not render).
    let by_label = Selection {
        labels: Some(objects::owned_selector()),
        page: Some(HOSTED_PAGE),
        ..Default::default()
    };
    let p = watch::<ValidatingAdmissionPolicy>(service.clone(), by_label.clone())
        .default_backoff()
        .map(|e| classify("ValidatingAdmissionPolicy", e));
    let b = watch::<ValidatingAdmissionPolicyBinding>(service, by_label)
        .default_backoff()
        .map(|e| classify("ValidatingAdmissionPolicyBinding", e));
    Box::pin(futures::stream::select(
        hooks,
        futures::stream::select(p, b),
    ))
}

/// One object to compare with what the agent applied: kind, what happened to it, its name,
/// and the object (`None`: gone).
struct Change {
    kind: &'static str,
    what: &'static str,
    name: String,
    live: Option<Value>,
}

/// What one hosted cluster's drift task keeps between events.
struct DriftTask {
    tx: tokio::sync::mpsc::UnboundedSender<ObjectRef<HostedControlPlane>>,
    metrics: Arc<crate::metrics::Metrics>,
    hcp_ref: ObjectRef<HostedControlPlane>,
    ns: String,
    cluster: String,
    shared: Arc<Mutex<WatchShared>>,
    /// The type-check warnings last seen per policy: a new one queues a reconcile, which
    /// reports it (the status is the API server's, never drift).
    warned: BTreeMap<String, Vec<String>>,
    /// The names each kind's (re)list in progress has shown so far.
    listed: BTreeMap<&'static str, BTreeSet<String>>,
    /// Set while the connection is down: a dropped watch (the HTTP/2 keepalive gave up on a
    /// hung server, or the server went away) queues a reconcile at once, which then reports
    /// the cluster.
    lost: Option<String>,
}

impl DriftTask {
    fn requeue(&self) {
        let _ = self.tx.send(self.hcp_ref.clone());
    }

    /// The connection answers again (if it was lost): the HCP is looked at again.
    fn back(&mut self) {
        if self.lost.take().is_some() {
            lock(&self.shared).lost = None;
            info!("the hosted cluster answers again");
            self.requeue();
        }
    }

    /// What `seen` gives to compare; the connection's ups and downs and the lists' progress
    /// are kept here.
    fn changes(&mut self, seen: DriftEvent, recovery: &mut tokio::time::Interval) -> Vec<Change> {
        match seen {
            DriftEvent::Lost(why) => {
                if self.lost.is_none() {
                    warn!(error = %why, "lost the connection to the hosted cluster; reporting it");
                    recovery.reset();
                    lock(&self.shared).lost = Some(why.clone());
                    self.requeue();
                }
                self.lost = Some(why);
                Vec::new()
            }
            DriftEvent::Refused(why) => {
                warn!(error = %why, "the hosted cluster refused the drift watch; retrying");
                Vec::new()
            }
            DriftEvent::Alive => {
                self.back();
                Vec::new()
            }
            DriftEvent::Change(kind, what, name, live) => {
                self.back();
                vec![Change {
                    kind,
                    what,
                    name,
                    live,
                }]
            }
            DriftEvent::ListStart(kind) => {
                self.back();
                self.listed.insert(kind, BTreeSet::new());
                Vec::new()
            }
            DriftEvent::Listed(kind, name, live) => self.listed_one(kind, name, live),
            DriftEvent::ListDone(kind) => {
                let seen = self.listed.remove(kind).unwrap_or_default();
                let want = {
                    let shared = lock(&self.shared);
                    match (&shared.desired, shared.applied) {
                        (Some(d), true) => d.names(kind),
                        _ => Vec::new(),
                    }
                };
                want.into_iter()
                    .filter(|n| !seen.contains(n))
                    .map(|name| Change {
                        kind,
                        what: "deleted while no watch was open",
                        name,
                        live: None,
                    })
                    .collect()
            }
        }
    }

    /// One object of a (re)list: only the agent's own names are kept (a tenant's labelled
    /// objects pass), and compared once the agent has applied what it wants.
    fn listed_one(&mut self, kind: &'static str, name: String, live: Option<Value>) -> Vec<Change> {
        let (ours, applied) = {
            let shared = lock(&self.shared);
            let ours = shared
                .desired
                .as_ref()
                .is_some_and(|d| d.names(kind).contains(&name));
            (ours, shared.applied)
        };
        if !ours {
            return Vec::new();
        }
        self.listed.entry(kind).or_default().insert(name.clone());
        if !applied {
            return Vec::new();
        }
        vec![Change {
            kind,
            what: "changed while no watch was open",
            name,
            live,
        }]
    }

    /// Compares one live object with what the agent applied: drift is counted, noted for the
    /// health record, and the HCP queued for a reconcile (which reports it); where the agent
    /// has installed what it wants, the object to put back at once (`repair_now`).
    fn compare(&mut self, change: Change) -> Option<Fix> {
        let Change {
            kind,
            what,
            name,
            live,
        } = change;
        let want = lock(&self.shared)
            .desired
            .as_ref()
            .and_then(|d| d.object(kind, &name));
        // Not an object the agent renders (a tenant's, labelled like the agent's): nothing
        // to compare, and nothing of it kept.
        let want = want?;
        if kind == "ValidatingAdmissionPolicy"
            && let Some(l) = &live
            && let Ok(p) = serde_json::from_value::<ValidatingAdmissionPolicy>(l.clone())
        {
            let now = admission_policies::type_warnings(&p);
            if self.warned.get(&name) != Some(&now) {
                let queue = !now.is_empty() || self.warned.contains_key(&name);
                self.warned.insert(name.clone(), now);
                if queue {
                    self.requeue();
                }
            }
        }
        let drifted = match &live {
            Some(l) => !objects::matches(&want, l),
            None => true,
        };
        if !drifted {
            return None;
        }
        // Who changed what, where the live object says (its managedFields); where it names no
        // other manager (a client may claim the agent's own name), what differs.
        let fields = live.as_ref().and_then(|l| {
            objects::foreign_summary(l)
                .or_else(|| crate::compare::summary(&objects::differences(&want, l)))
        });
        warn!(kind, name = %name, what, fields = fields.as_deref().unwrap_or(""), "the agent's object in the hosted cluster drifted; repairing");
        self.metrics
            .drift
            .get_or_create(&DriftLabels::new(&self.ns, &self.cluster, kind))
            .inc();
        let applied = {
            let mut shared = lock(&self.shared);
            shared.drift_notes.push(match fields {
                Some(f) => format!("{kind} {name} was {what} by someone else: {f}"),
                None => format!("{kind} {name} was {what} by someone else"),
            });
            shared.applied
        };
        self.requeue();
        // Installed as wanted: put back at once, not behind whatever reconcile is in flight (a
        // probe's wait, a slow server, an engine switch). Otherwise the reconcile installing
        // the new rendering writes it.
        applied.then_some(Fix { kind, name, want })
    }
}

/// One drifted guard object to put back: its kind, name and what the agent wants of it
/// (`Wanted::object`: labels, annotations and the part owned whole).
struct Fix {
    kind: &'static str,
    name: String,
    want: Value,
}

/// Puts one drifted object back as rendered, by its own path: replaced at the version read
/// (or created), then applied, as the reconcile would (`Repair::Replace`). A failure is left
/// to the reconcile queued beside it.
async fn repair_now(hosted: &HostedClient, fix: Fix, timeout: std::time::Duration) {
    use kube::api::{ApiResource, DynamicObject};
    let Fix { kind, name, want } = fix;
    let resource = match kind {
        "ValidatingAdmissionPolicy" => ApiResource::erase::<ValidatingAdmissionPolicy>(&()),
        "ValidatingAdmissionPolicyBinding" => {
            ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&())
        }
        "MutatingWebhookConfiguration" => ApiResource::erase::<MutatingWebhookConfiguration>(&()),
        _ => ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
    };
    let mut object = want;
    object["apiVersion"] = Value::from(resource.api_version.clone());
    object["kind"] = Value::from(kind);
    object["metadata"]["name"] = Value::from(name.clone());
    let desired: DynamicObject = match serde_json::from_value(object) {
        Ok(d) => d,
        Err(e) => {
            warn!(kind, name = %name, error = %e, "the wanted object could not be read back; the reconcile repairs it");
            return;
        }
    };
    let api = Api::<DynamicObject>::all_with(hosted.client(), &resource);
    let t0 = std::time::Instant::now();
    let repaired = tokio::time::timeout(
        timeout,
        super::apply::apply_if_changed(
            &api,
            &name,
            &desired,
            objects::matches,
            super::apply::Repair::Replace,
        ),
    )
    .await;
    match repaired {
        Ok(Ok(_)) => {
            info!(kind, name = %name, ms = t0.elapsed().as_millis() as u64, "drift repaired at once");
        }
        Ok(Err(e)) => {
            warn!(kind, name = %name, error = %crate::human::KubeError(&e), "repairing at once failed; the reconcile repairs it");
        }
        Err(_) => {
            warn!(kind, name = %name, "repairing at once got no answer in time; the reconcile repairs it");
        }
    }
}

/// While a hosted cluster's watch is down, how often the drift task asks whether it answers
/// again (and how long it waits for the answer).
const RECOVERY_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// What one item of a drift watch means.
enum DriftEvent {
    /// A live change to one of the agent's objects: kind, what happened, its name, the object.
    Change(&'static str, &'static str, String, Option<Value>),
    /// A (re)list of `kind` begins: what it lists is what is there now.
    ListStart(&'static str),
    /// One object of a (re)list: name and object.
    Listed(&'static str, String, Option<Value>),
    /// The (re)list of `kind` is complete: any desired object it did not list is gone.
    ListDone(&'static str),
    /// The watch (re)started, or the server answered: the connection is up.
    Alive,
    /// The connection is down.
    Lost(String),
    /// The server answered the watch with an error (retried with backoff).
    Refused(String),
}

/// A listing (the watch's first, or a relist after it expired or lost its connection) is
/// compared like a change: an object deleted or edited while no watch was open (between the
/// apply and the watch's start, or in a gap) shows only there.
fn classify<K: serde::Serialize + kube::Resource>(
    kind: &'static str,
    ev: Result<watcher::Event<K>, watcher::Error>,
) -> DriftEvent {
    match ev {
        Ok(watcher::Event::Apply(o)) => {
            DriftEvent::Change(kind, "changed", o.name_any(), serde_json::to_value(o).ok())
        }
        Ok(watcher::Event::Delete(o)) => DriftEvent::Change(kind, "deleted", o.name_any(), None),
        Ok(watcher::Event::Init) => DriftEvent::ListStart(kind),
        Ok(watcher::Event::InitApply(o)) => {
            DriftEvent::Listed(kind, o.name_any(), serde_json::to_value(o).ok())
        }
        Ok(watcher::Event::InitDone) => DriftEvent::ListDone(kind),
        // The connection failed, as opposed to the server answering with an error status.
        Err(e) => match &e {
            watcher::Error::InitialListFailed(k)
            | watcher::Error::WatchStartFailed(k)
            | watcher::Error::WatchFailed(k)
                if crate::hosted::clients::unanswered(k) =>
            {
                DriftEvent::Lost(crate::human::KubeError(k).to_string())
            }
            _ => DriftEvent::Refused(crate::human::WatchError(&e).to_string()),
        },
    }
}

/// HCP deletions: a controller never reconciles a deleted object, so a metadata watch tells
/// the context to forget it (state, tasks, client, series, roll-up row).
pub(crate) async fn deletion_watcher(ctx: Arc<Context>) {
    let api: Api<PartialObjectMeta<HostedControlPlane>> = Api::all(ctx.client.clone());
    let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(ev) = s.next().await {
        if let Ok(watcher::Event::Delete(m)) = ev {
            let ns = m.namespace().unwrap_or_default();
            info!(hcp_namespace = %ns, "HostedControlPlane deleted; forgetting it");
            if let Some(uid) = m.uid() {
                ctx.tombstone(uid);
            }
            ctx.forget(&ns, &m.name_any());
        }
    }
}
