//! Watches that run beside the controller's own: one drift watch per hosted cluster on the
//! agent's webhook configurations there, and the deletion watch on HostedControlPlanes.

use std::collections::BTreeMap;
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

use crate::controller::context::{AbortOnDrop, Context, HostedWatch, WatchShared, lock};
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use crate::hosted::watch::{Watched, Watches};
use crate::metrics::DriftLabels;
use hcp_fleet_model::crd::HostedControlPlane;
use hcp_fleet_render::hosted::objects::HostedFeatures;
use hcp_fleet_render::hosted::wanted::Wanted;
use hcp_fleet_render::hosted::{admission_policies, objects};

/// Starts (or updates) the drift watch of one hosted cluster: each object the agent wants
/// there (webhook configurations, admission policies and bindings), watched by name. A change
/// that does not match what the agent applied, or a deletion, is drift: counted, noted for the
/// health record, and put back at once. A new server (rotated kubeconfig), or a new set of
/// names (a guard moved between engines, one added), restarts the watch.
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
            && lock(&w.shared)
                .desired
                .as_ref()
                .is_some_and(|d| d.same_objects(&desired))
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
        let span = tracing::info_span!(parent: None, "drift_watch", hcp_namespace = %ns, hosted_cluster = %cluster);
        let watched = desired.watched();
        let shared = Arc::new(Mutex::new(WatchShared {
            desired: Some(desired),
            applied: false,
            lost: None,
            ..carried.unwrap_or_default()
        }));
        let (started, on_start) = tokio::sync::oneshot::channel();
        let task = drift_task(ctx, ns, cluster, hosted, watched, Arc::clone(&shared), started)
            .instrument(span);
        s.watch = Some(HostedWatch {
            server: hosted.server.clone(),
            features,
            shared,
            drift: AbortOnDrop(tokio::spawn(task)),
            probe: None,
            started: Some(on_start),
        });
    });
}

/// Stops the drift watch and probe of one hosted cluster (a paused HCP): what they noted goes
/// with them.
pub(crate) fn stop(ctx: &Context, ns: &str) {
    ctx.with_hcp(ns, |s| s.watch = None);
}

/// Takes the signal a new drift watch gives once it has the versions it watches from (the
/// first install after it starts waits for it; `None` for a watch already running).
pub(crate) fn started(ctx: &Context, ns: &str) -> Option<tokio::sync::oneshot::Receiver<()>> {
    ctx.with_hcp(ns, |s| s.watch.as_mut()?.started.take())
}

/// Tells the drift watch that `wanted` is installed (from now on a listing that differs is
/// drift), and takes the drift it noted meanwhile.
pub(crate) fn installed_as(ctx: &Context, ns: &str, wanted: &Wanted) -> Vec<String> {
    ctx.with_hcp(ns, |s| {
        s.watch
            .as_ref()
            .map(|w| {
                let mut shared = lock(&w.shared);
                if shared.desired.as_ref() == Some(wanted) {
                    shared.applied = true;
                }
                std::mem::take(&mut shared.drift_notes)
            })
            .unwrap_or_default()
    })
}

fn drift_task(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    hosted: &HostedClient,
    watched: Vec<(&'static str, Arc<str>)>,
    shared: Arc<Mutex<WatchShared>>,
    started: tokio::sync::oneshot::Sender<()>,
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
        events: EventSink(Arc::clone(&ctx.events)),
        tally: Tally::default(),
    };
    let hosted = hosted.clone();
    let timeout = ctx.config().hosted_access.request_timeout();
    async move {
        let mut events = drift_events(hosted.service(), watched, timeout).await;
        // The install may read now (`hosted_webhooks::ensure`); gone if it stopped waiting.
        let _ = started.send(());
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
                _ = tokio::time::sleep_until(task.tally.ends()), if task.tally.untold > 0 => {
                    task.close_minute();
                    continue;
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

/// The drift watch's events: one watch per object the agent wants, by name (a field
/// selector), all in one stream (`hosted::watch::Watches`). Not by label: a tenant can label
/// objects of their own like the agent's, 300 of them at 900 KiB, and a watch by label would
/// make the agent read every one and every change to it; by name the server sends the
/// agent's objects and nothing else. The watches start from one listing per kind
/// (`Watches::started`): the install that follows every new drift watch reads the objects.
async fn drift_events(
    service: crate::hosted::clients::HostedService,
    watched: Vec<(&'static str, Arc<str>)>,
    within: std::time::Duration,
) -> futures::stream::BoxStream<'static, DriftEvent> {
    let watched = watched
        .into_iter()
        .map(|(kind, name)| Watched {
            kind,
            path: kind_path(kind),
            name,
        })
        .collect();
    // Never ending, as a watch: with nothing wanted the task waits for a new set of names.
    Box::pin(
        Watches::started(service, watched, within)
            .await
            .map(|(kind, name, ev)| classify(kind, &name, ev))
            .chain(futures::stream::pending()),
    )
}

/// The collection path of a kind the drift watch reads (static: every watch of every hosted
/// cluster holds it).
fn kind_path(kind: &str) -> &'static str {
    match kind {
        "ValidatingAdmissionPolicy" => {
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
        }
        "ValidatingAdmissionPolicyBinding" => {
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
        }
        "MutatingWebhookConfiguration" => {
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        }
        "MutatingAdmissionPolicy" => {
            "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
        }
        "MutatingAdmissionPolicyBinding" => {
            "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"
        }
        _ => "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    }
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
    /// The watches whose (re)list is in progress, by kind and name: has it shown the object?
    listed: BTreeMap<(&'static str, String), bool>,
    /// Set while the connection is down: a dropped watch (the HTTP/2 keepalive gave up on a
    /// hung server, or the server went away) queues a reconcile at once, which then reports
    /// the cluster.
    lost: Option<String>,
    /// Where each tampering is told: an Event on the HCP's AdmissionHealth record.
    events: EventSink,
    /// The tamperings of the current minute.
    tally: Tally,
}

/// What a drift task needs to publish Events on its HCP's record.
struct EventSink(Arc<crate::controller::context::Publisher>);

impl EventSink {
    /// Publishes a Warning on the HCP's AdmissionHealth record, in a task of its own.
    fn warn(&self, ns: &str, cluster: &str, reason: &str, note: String) {
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(
                <hcp_fleet_model::crd::AdmissionHealth as kube::Resource>::api_version(&())
                    .into_owned(),
            ),
            kind: Some("AdmissionHealth".into()),
            name: Some(hcp_fleet_render::reporting::record::health_name(cluster).into()),
            namespace: Some(ns.to_string()),
            ..Default::default()
        };
        self.0
            .warn_detached(reference, reason, "RepairTampering", &note);
    }
}

/// Tamperings told one Event each per minute and hosted cluster (a tenant's script trying
/// each field of a guard in turn is told whole); the rest of the minute's are told in one
/// Event when it ends. A tenant who deletes a guard whenever it exists tampers a hundred times
/// a second: one Event each would be the management API's whole write budget.
const EVENTS_PER_MINUTE: u32 = 10;

/// From this many tamperings in one minute the cluster is named as one that keeps tampering.
const KEEPS_TAMPERING: u32 = 3;

const MINUTE: std::time::Duration = std::time::Duration::from_secs(60);

/// The tamperings of one hosted cluster in the current minute (from the first of them).
#[derive(Debug, Default)]
struct Tally {
    start: Option<tokio::time::Instant>,
    /// Seen this minute.
    seen: u32,
    /// Seen this minute and not yet told in an Event.
    untold: u32,
}

/// What to tell of one tampering.
#[derive(Debug, PartialEq)]
enum Tell {
    /// An Event of its own: the `n`th tampering of the minute.
    Each(u32),
    /// Counted, told when the minute ends.
    Later,
}

impl Tally {
    /// When the current minute ends.
    fn ends(&self) -> tokio::time::Instant {
        self.start.unwrap_or_else(tokio::time::Instant::now) + MINUTE
    }

    /// One tampering at `now`. A minute that ended with tamperings untold is closed first
    /// (`close`), its summary returned.
    fn note(&mut self, now: tokio::time::Instant) -> (Tell, Option<(u32, u32)>) {
        let closed = match self.start {
            Some(start) if now < start + MINUTE => None,
            _ => self.close(),
        };
        self.start.get_or_insert(now);
        self.seen += 1;
        let tell = if self.seen <= EVENTS_PER_MINUTE {
            Tell::Each(self.seen)
        } else {
            self.untold += 1;
            Tell::Later
        };
        (tell, closed)
    }

    /// Ends the current minute: its count and how many were not told one by one, when any
    /// were not.
    fn close(&mut self) -> Option<(u32, u32)> {
        let out = (self.untold > 0).then_some((self.seen, self.untold));
        *self = Tally::default();
        out
    }
}

impl DriftTask {
    /// The minute ended: the tamperings not told one by one, told in one Event.
    fn close_minute(&mut self) {
        if let Some((seen, untold)) = self.tally.close() {
            self.tell_minute(seen, untold);
        }
    }

    fn tell_minute(&self, seen: u32, untold: u32) {
        self.events.warn(
            &self.ns,
            &self.cluster,
            "TamperingRepeated",
            format!(
                "hosted cluster {} keeps tampering with its guards: {seen} changes or deletions of the agent's objects in one minute, each put back ({untold} not told one by one; hcp_fleet_webhook_drift_total counts all)",
                self.cluster
            ),
        );
    }

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
            DriftEvent::ListStart(kind, name) => {
                self.back();
                self.listed.insert((kind, name), false);
                Vec::new()
            }
            DriftEvent::Listed(kind, name, live) => self.listed_one(kind, name, live),
            DriftEvent::ListDone(kind, name) => {
                let seen = self.listed.remove(&(kind, name.clone())).unwrap_or(false);
                let gone = !seen && {
                    let shared = lock(&self.shared);
                    shared.applied
                        && shared
                            .desired
                            .as_ref()
                            .is_some_and(|d| d.names(kind).contains(&name))
                };
                gone.then_some(Change {
                    kind,
                    what: "deleted while no watch was open",
                    name,
                    live: None,
                })
                .into_iter()
                .collect()
            }
        }
    }

    /// One object of a (re)list, compared once the agent has applied what it wants. The watch
    /// is by name, so only a server gone wrong lists another; such an object is passed over.
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
        if let Some(seen) = self.listed.get_mut(&(kind, name.clone())) {
            *seen = true;
        }
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
        // Not an object the agent renders (no longer wanted since the watch began): nothing
        // to compare.
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
        let note = tampering_note(kind, &name, what, &want, live.as_ref());
        warn!(kind, name = %name, what, note = %note, "the agent's object in the hosted cluster drifted; repairing");
        self.metrics
            .drift
            .get_or_create(&DriftLabels::new(&self.ns, &self.cluster, kind))
            .inc();
        let (tell, closed) = self.tally.note(tokio::time::Instant::now());
        if let Some((seen, untold)) = closed {
            self.tell_minute(seen, untold);
        }
        let record = if self.tally.seen >= KEEPS_TAMPERING {
            format!(
                "{note} (tampering {} within a minute: this hosted cluster keeps tampering with its guards)",
                self.tally.seen
            )
        } else {
            note.clone()
        };
        if let Tell::Each(_) = tell {
            self.events.warn(
                &self.ns,
                &self.cluster,
                "Tampered",
                format!("{note}; put back"),
            );
        }
        let applied = {
            let mut shared = lock(&self.shared);
            shared.drift_notes.push(record);
            shared.applied
        };
        self.requeue();
        // Installed as wanted: put back at once, not behind whatever reconcile is in flight (a
        // probe's wait, a slow server, an engine switch). Otherwise the reconcile installing
        // the new rendering writes it.
        applied.then_some(Fix { kind, name, want })
    }
}

/// What a tampering did, in words for the record and its Event: the object, what happened,
/// and who, as far as the server says. A change names the fields someone else holds and their
/// field manager; one under the agent's own manager name (any client can claim it) names what
/// differs from the rendering; a deletion names no one (the hosted cluster's audit log does).
fn tampering_note(
    kind: &str,
    name: &str,
    what: &str,
    want: &Value,
    live: Option<&Value>,
) -> String {
    let Some(live) = live else {
        return format!(
            "{kind} {name} was {what} by someone else (a deletion names no one: the hosted cluster's audit log does)"
        );
    };
    if let Some(f) = objects::foreign_summary(live) {
        return format!("{kind} {name} was {what} by someone else: {f}");
    }
    match hcp_fleet_model::compare::summary(&objects::differences(want, live)) {
        Some(f) => format!(
            "{kind} {name} was {what} by someone else under the agent's own field manager name: {f}"
        ),
        None => format!("{kind} {name} was {what} by someone else: its labels or annotations"),
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
        "MutatingAdmissionPolicy" => admission_policies::mutating_resource(),
        "MutatingAdmissionPolicyBinding" => admission_policies::mutating_binding_resource(),
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
    /// A (re)list of the watch of one object (kind, name) begins: what it lists is what is
    /// there now.
    ListStart(&'static str, String),
    /// One object of a (re)list: name and object.
    Listed(&'static str, String, Option<Value>),
    /// The (re)list of the watch of one object is complete: if it did not list the object,
    /// the object is gone.
    ListDone(&'static str, String),
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
fn classify(
    kind: &'static str,
    watched: &str,
    ev: Result<watcher::Event<Value>, watcher::Error>,
) -> DriftEvent {
    let name = |o: &Value| {
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    match ev {
        Ok(watcher::Event::Apply(o)) => DriftEvent::Change(kind, "changed", name(&o), Some(o)),
        Ok(watcher::Event::Delete(o)) => DriftEvent::Change(kind, "deleted", name(&o), None),
        Ok(watcher::Event::Init) => DriftEvent::ListStart(kind, watched.to_string()),
        Ok(watcher::Event::InitApply(o)) => DriftEvent::Listed(kind, name(&o), Some(o)),
        Ok(watcher::Event::InitDone) => DriftEvent::ListDone(kind, watched.to_string()),
        // The connection failed, as opposed to the server answering with an error status.
        Err(e) => match &e {
            watcher::Error::InitialListFailed(k)
            | watcher::Error::WatchStartFailed(k)
            | watcher::Error::WatchFailed(k)
                if crate::hosted::clients::unanswered(k) =>
            {
                DriftEvent::Lost(crate::human::KubeError(k).to_string())
            }
            // Too old a version to resume from: the watch reads its object again and goes
            // on, as routine as a watch's end (the drift watch asks for no bookmarks).
            watcher::Error::WatchError(s) if s.code == 410 => DriftEvent::Alive,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_kind_is_read_at_its_apis_path() {
        use kube::Resource;
        for (kind, path) in [
            (
                "ValidatingAdmissionPolicy",
                ValidatingAdmissionPolicy::url_path(&(), None),
            ),
            (
                "ValidatingAdmissionPolicyBinding",
                ValidatingAdmissionPolicyBinding::url_path(&(), None),
            ),
            (
                "MutatingWebhookConfiguration",
                MutatingWebhookConfiguration::url_path(&(), None),
            ),
            (
                "ValidatingWebhookConfiguration",
                ValidatingWebhookConfiguration::url_path(&(), None),
            ),
        ] {
            assert_eq!(kind_path(kind), path);
        }
    }

    #[test]
    fn a_minute_tells_its_first_tamperings_one_by_one_and_the_rest_at_its_end() {
        let t0 = tokio::time::Instant::now();
        let mut tally = Tally::default();
        for n in 1..=EVENTS_PER_MINUTE {
            assert_eq!(tally.note(t0), (Tell::Each(n), None));
        }
        for _ in 0..7 {
            assert_eq!(tally.note(t0 + MINUTE / 2).0, Tell::Later);
        }
        assert_eq!(tally.untold, 7);
        assert_eq!(tally.ends(), t0 + MINUTE);
        // The next minute's first tampering closes the last: its count and those untold.
        let (tell, closed) = tally.note(t0 + MINUTE);
        assert_eq!(closed, Some((EVENTS_PER_MINUTE + 7, 7)));
        assert_eq!(tell, Tell::Each(1));
        // A minute whose every tampering was told closes with nothing more to say.
        assert_eq!(tally.close(), None);
        assert_eq!(tally.seen, 0);
    }

    #[test]
    fn a_tamperings_note_names_the_fields_and_who_the_server_says_did_it() {
        let want = json!({"metadata": {}, "spec": {"failurePolicy": "Fail"}});
        let entry = |manager: &str| {
            json!([{"manager": manager, "operation": "Update", "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:failurePolicy": {}}}}])
        };
        let mut live = json!({"metadata": {"managedFields": entry("kubectl-edit")},
                              "spec": {"failurePolicy": "Ignore"}});
        let changed = |live: &Value| {
            tampering_note(
                "ValidatingAdmissionPolicy",
                "p",
                "changed",
                &want,
                Some(live),
            )
        };
        let by_tenant = changed(&live);
        assert!(
            by_tenant.contains("spec.failurePolicy (by kubectl-edit)"),
            "{by_tenant}"
        );
        // A client that claims the agent's manager name is named by what differs.
        live["metadata"]["managedFields"] = entry(hcp_fleet_render::management::FIELD_MANAGER);
        let claimed = changed(&live);
        assert!(
            claimed.contains("under the agent's own field manager name"),
            "{claimed}"
        );
        assert!(claimed.contains("failurePolicy"), "{claimed}");
        let deleted = tampering_note(
            "ValidatingAdmissionPolicyBinding",
            "p",
            "deleted",
            &want,
            None,
        );
        assert!(
            deleted.starts_with("ValidatingAdmissionPolicyBinding p was deleted"),
            "{deleted}"
        );
        assert!(deleted.contains("audit log"), "{deleted}");
    }
}
