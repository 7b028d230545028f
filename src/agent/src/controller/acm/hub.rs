//! The hub half of reporting: the verdict of ACM's `AdmissionHealthPolicy` templates (the
//! fleet's summary on the management cluster's own, each hosted cluster's row on its
//! hosted-mode one) written as compliance Events on their parent Policies, from the rows the
//! per-HCP reports keep (`Context`'s fleet rows). What to say is computed by
//! `hcp_fleet_render::reporting::hub`; this module reads, compares and writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::managed_clusters;
use super::managed_clusters::{HostedClusterRef, KlusterletServer};
use crate::controller::context::{AbortOnDrop, Context};
use hcp_fleet_model::crd::health::TemplateHistoryEntry;
use hcp_fleet_model::crd::{
    AdmissionHealthPolicy, AdmissionHealthPolicyStatus, ComplianceState, HostedCluster, Policy,
};
use hcp_fleet_render::reporting;
use hcp_fleet_render::reporting::hub::RollupRow;

/// How often, at most, the templates are re-evaluated and written.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The HostedClusters' metadata, in a store (where HyperShift's API is served), each change
/// waking the reporter.
fn watch_hosted_clusters(
    ctx: &Arc<Context>,
) -> (
    kube::runtime::reflector::Store<PartialObjectMeta<HostedCluster>>,
    Option<AbortOnDrop>,
) {
    let (store, writer) = kube::runtime::reflector::store::<PartialObjectMeta<HostedCluster>>();
    let watch = ctx.caps.hosted_cluster_crd.then(|| {
        wake_on(
            ctx,
            watcher(
                Api::<PartialObjectMeta<HostedCluster>>::all(ctx.client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .modify(|m| m.metadata.managed_fields = None)
            .reflect(writer)
            .boxed(),
            "the HostedClusters",
        )
    });
    (store, watch)
}

/// What a template was last told (and which foreign entry answered); `false` when the write
/// failed, to be tried again.
fn remember(
    result: Result<AdmissionHealthPolicyStatus, kube::Error>,
    key: (String, String, String),
    foreign: Option<String>,
    written: &mut BTreeMap<(String, String, String), AdmissionHealthPolicyStatus>,
    answered: &mut BTreeMap<String, String>,
) -> bool {
    match result {
        Err(e) => {
            warn!(
                error = %crate::human::KubeError(&e),
                namespace = %key.0,
                template = %key.1,
                "reporting an AdmissionHealthPolicy failed; retrying"
            );
            written.remove(&key);
            false
        }
        Ok(status) => {
            if let Some(f) = foreign {
                answered.insert(key.2.clone(), f);
            }
            written.insert(key, status);
            true
        }
    }
}

/// Re-evaluates every `AdmissionHealthPolicy` template whenever a hosted cluster's row changes
/// or a template appears or changes (debounced, so a fleet converging at once costs a few
/// writes, not one per HCP).
pub(crate) async fn template_reporter(ctx: Arc<Context>) {
    let api: Api<AdmissionHealthPolicy> = Api::all(ctx.client.clone());
    // A new or changed template (ACM's framework addon creates it) must be reported at once,
    // not at the next change of a hosted cluster: watch them and wake the loop. The watch
    // keeps the templates in a store, so a report reads them without a request.
    let (templates, writer) = kube::runtime::reflector::store();
    let wake = reflect_and_wake(&ctx, api.clone(), writer, "AdmissionHealthPolicy templates");
    // The replicated Policies (where ACM's Policy CRD is served): the newest entry the hub
    // shows for each template, to answer template-sync's error and pending events.
    let (policies, policy_writer) = kube::runtime::reflector::store::<Policy>();
    let _policy_watch = ctx.caps.policy_crd.then(|| {
        let api = Api::all(ctx.client.clone());
        reflect_and_wake(&ctx, api, policy_writer, "the replicated Policies")
    });
    // Hosted-mode rows: which HCP each ACM managed cluster is. The HostedClusters' metadata
    // (ACM's managed-cluster annotation) where HyperShift's API is served, and the server of
    // each hosted-mode klusterlet's kubeconfig.
    let (hosted_clusters, _hc_watch) = watch_hosted_clusters(&ctx);
    let (klusterlet_servers, _klusterlet_watch) = watch_klusterlet_servers(&ctx);
    // The foreign entries already answered, per template UID (at most one each: the newest).
    let mut answered: BTreeMap<String, String> = BTreeMap::new();
    // What this reporter last wrote to each template: the store may not show it yet. Keyed by
    // the template's UID too: a template deleted and created again (its Policy re-created on
    // the hub: template-sync makes a new one, same namespace and name) is a new template with
    // no status and a new parent, and must be reported to at once.
    let mut written: BTreeMap<(String, String, String), AdmissionHealthPolicyStatus> =
        BTreeMap::new();
    loop {
        ctx.rollup_changed.notified().await;
        // A fleet converging at once changes rows many times a second; one report a second
        // carries them all (each is one status write, the size of the fleet, and an Event).
        tokio::time::sleep(REPORT_EVERY).await;
        if !wake.is_running() {
            warn!("the AdmissionHealthPolicy watch ended; ACM reporting stops");
            return;
        }
        if templates.wait_until_ready().await.is_err() {
            return;
        }
        let rows: BTreeMap<String, RollupRow> = ctx.rollup_rows();
        let halt = ctx.rollout_halt();
        let mut retry = false;
        // Hosted-mode templates first (in klusterlet-X, each its hosted cluster's own row on the
        // hub): the managed cluster each HCP maps to names that HCP in the fleet's row too.
        let mut rowing = HostedRows {
            ctx: &ctx,
            hosted_clusters: &hosted_clusters,
            klusterlet_servers: &klusterlet_servers,
            rows: &rows,
            mapping: None,
            managed: BTreeMap::new(),
        };
        let mut wants = Vec::new();
        // The fleet's summary is the owner's to write: an installation that leaves HCPs to
        // another reports no fleet (its rows would be a part of the fleet, read as all of it).
        let fleet_is_ours = !ctx.metrics.owned_elsewhere(None);
        for t in templates.state() {
            let key = (
                t.namespace().unwrap_or_default(),
                t.name_any(),
                t.uid().unwrap_or_default(),
            );
            match reporting::hub::hosted_cluster_of(&key.0, t.labels()) {
                None if fleet_is_ours => wants.push((t, key, None)),
                None => {}
                Some(x) => {
                    // Until the HostedClusters are listed, an annotated cluster would read as
                    // unknown: report it once they are (their watch wakes us).
                    if let Some(want) = rowing.own_row(&key.0, x) {
                        wants.push((t, key, Some(want)));
                    }
                }
            }
        }
        let managed = rowing.managed;
        let fleet = reporting::hub::evaluate_template(
            &rows,
            &managed,
            ctx.caps.pending_supported,
            halt.as_deref(),
        );
        for (t, key, want) in wants {
            let want = want.unwrap_or_else(|| fleet.clone());
            let mut t = (*t).clone();
            if let Some(w) = written.get(&key) {
                t.status = Some(w.clone());
            }
            let newest = hub_newest(&policies, &t);
            let ours = t.status.clone().unwrap_or_default();
            let foreign = reporting::hub::foreign_newest(
                newest.as_deref(),
                &ours,
                answered.get(&key.2).map(String::as_str),
            )
            .map(str::to_string);
            if foreign.is_none() && written.get(&key).is_some_and(|w| w.same_verdict(&want)) {
                continue;
            }
            if let Some(f) = &foreign {
                info!(namespace = %key.0, template = %key.1, newest = %f, "the hub's newest entry for the template is not the agent's; reporting the verdict again");
            }
            let result = report_template(&ctx, &t, &want, foreign.is_some()).await;
            retry |= !remember(result, key, foreign, &mut written, &mut answered);
        }
        // Templates gone (deleted, or replaced by a new one of the same name) are forgotten.
        let live: std::collections::BTreeSet<String> =
            templates.state().iter().filter_map(|t| t.uid()).collect();
        written.retain(|(_, _, uid), _| live.contains(uid));
        answered.retain(|uid, _| live.contains(uid));
        if retry {
            tokio::time::sleep(Duration::from_secs(2)).await;
            ctx.rollup_changed.notify_one();
        }
    }
}

/// What one report needs to give each hosted-mode template its own row, and what it learns
/// doing so: the managed cluster each HCP maps to.
struct HostedRows<'a> {
    ctx: &'a Context,
    hosted_clusters: &'a kube::runtime::reflector::Store<PartialObjectMeta<HostedCluster>>,
    klusterlet_servers: &'a std::sync::Mutex<BTreeMap<String, KlusterletServer>>,
    rows: &'a BTreeMap<String, RollupRow>,
    /// The HostedClusters, read once per report (where a hosted-mode template needs them).
    mapping: Option<Vec<HostedClusterRef>>,
    /// HCP namespace to the managed cluster that maps to it.
    managed: BTreeMap<String, String>,
}

impl HostedRows<'_> {
    /// The verdict of managed cluster `x`'s template in `namespace` (`klusterlet-X`); `None`
    /// until the HostedClusters are listed.
    fn own_row(&mut self, namespace: &str, x: &str) -> Option<AdmissionHealthPolicyStatus> {
        if self.mapping.is_none() {
            self.mapping = known_hosted_clusters(self.ctx, self.hosted_clusters, self.rows);
        }
        let hosted = self.mapping.as_ref()?;
        let server = self
            .klusterlet_servers
            .lock()
            .ok()
            .and_then(|m| m.get(namespace).cloned())
            .unwrap_or(KlusterletServer::Absent);
        let prefix = self.ctx.config().reporting.discovery_prefix.clone();
        let hcp = managed_clusters::resolve(x, hosted, Some(&prefix), &server);
        if let Ok(ns) = &hcp {
            self.managed.insert(ns.clone(), x.to_string());
            // Its owner, another installation, reports it: two verdicts would fight on the hub.
            if self.ctx.metrics.owned_elsewhere(Some(ns)) {
                return None;
            }
        }
        Some(reporting::hub::evaluate_cluster_template(
            self.rows,
            x,
            hcp.as_deref().map_err(|why| why as _),
            self.ctx.caps.pending_supported,
        ))
    }
}

/// The HostedClusters to map managed clusters against: listed from HyperShift's API where it
/// is served (None until the first list is in), else inferred from the HCPs.
fn known_hosted_clusters(
    ctx: &Context,
    store: &kube::runtime::reflector::Store<PartialObjectMeta<HostedCluster>>,
    rows: &BTreeMap<String, RollupRow>,
) -> Option<Vec<HostedClusterRef>> {
    if !ctx.caps.hosted_cluster_crd {
        let hcps = rows
            .iter()
            .map(|(ns, r)| (ns.clone(), r.cluster_name.clone()))
            .collect();
        return Some(managed_clusters::inferred(&hcps));
    }
    store.wait_until_ready().now_or_never()?.ok()?;
    Some(
        store
            .state()
            .iter()
            .map(|m| HostedClusterRef {
                namespace: m.namespace().unwrap_or_default(),
                name: m.name_any(),
                managed_cluster: m
                    .annotations()
                    .get(managed_clusters::MANAGED_CLUSTER_ANNOTATION)
                    .cloned(),
            })
            .collect(),
    )
}

/// Keeps, per `klusterlet-*` namespace, what its `external-managed-kubeconfig` says about the
/// server (never the Secret itself, which holds credentials), and wakes the report loop when
/// that changes.
fn watch_klusterlet_servers(
    ctx: &Arc<Context>,
) -> (
    Arc<std::sync::Mutex<BTreeMap<String, KlusterletServer>>>,
    Option<AbortOnDrop>,
) {
    let servers = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    if !ctx.caps.template_crd {
        return (servers, None);
    }
    let api: Api<Secret> = Api::all(ctx.client.clone());
    let cfg = watcher::Config::default().fields(&format!(
        "metadata.name={}",
        managed_clusters::EXTERNAL_KUBECONFIG
    ));
    let (ctx, shared) = (ctx.clone(), servers.clone());
    let task = tokio::spawn(async move {
        let mut events = watcher(api, cfg).default_backoff().boxed();
        let mut relisted: BTreeMap<String, KlusterletServer> = BTreeMap::new();
        let read = |s: &Secret| {
            let raw = s.data.as_ref().and_then(|d| d.get("kubeconfig"));
            raw.map_or(
                KlusterletServer::Unusable("it has no kubeconfig key".into()),
                |b| managed_clusters::klusterlet_server(&b.0),
            )
        };
        while let Some(ev) = events.next().await {
            let changed = match ev {
                Ok(watcher::Event::Init) => {
                    relisted.clear();
                    false
                }
                Ok(watcher::Event::InitApply(s)) => {
                    relisted.insert(s.namespace().unwrap_or_default(), read(&s));
                    false
                }
                Ok(watcher::Event::InitDone) => {
                    if let Ok(mut m) = shared.lock() {
                        *m = std::mem::take(&mut relisted);
                    }
                    true
                }
                Ok(watcher::Event::Apply(s)) => {
                    let (ns, now) = (s.namespace().unwrap_or_default(), read(&s));
                    shared
                        .lock()
                        .map(|mut m| m.insert(ns, now.clone()) != Some(now))
                        .unwrap_or(false)
                }
                Ok(watcher::Event::Delete(s)) => shared
                    .lock()
                    .map(|mut m| m.remove(&s.namespace().unwrap_or_default()).is_some())
                    .unwrap_or(false),
                Err(e) => {
                    warn!(error = %crate::human::WatchError(&e), "watching the klusterlets' external-managed-kubeconfig");
                    false
                }
            };
            if changed {
                ctx.rollup_changed.notify_one();
            }
        }
    });
    (servers, Some(AbortOnDrop(task)))
}

/// Keeps `writer`'s store from a watch of `api` and wakes the report loop when an object
/// appears or changes, or the store is filled again after a relist (whose objects come as
/// initial ones, not as changes).
fn reflect_and_wake<K>(
    ctx: &Arc<Context>,
    api: Api<K>,
    writer: kube::runtime::reflector::store::Writer<K>,
    what: &'static str,
) -> AbortOnDrop
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    // With backoff: an unreachable API server must not turn this into a busy loop
    // (it did, at 100% of two cores, in the admission e2e suite).
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    wake_on(ctx, events, what)
}

/// Drives a reflecting watch and wakes the report loop when an object appears or changes, or
/// the store is filled again after a relist.
fn wake_on<K>(
    ctx: &Arc<Context>,
    mut events: futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    what: &'static str,
) -> AbortOnDrop
where
    K: Send + 'static,
{
    let ctx = ctx.clone();
    AbortOnDrop(tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            match ev {
                Ok(watcher::Event::Apply(_) | watcher::Event::InitDone) => {
                    ctx.rollup_changed.notify_one()
                }
                Ok(_) => {}
                Err(e) => warn!(error = %crate::human::WatchError(&e), "watching {what}"),
            }
        }
    }))
}

/// One template: its status, then (when the verdict's message changed) a compliance Event on
/// the Policy that owns it, in the form ACM's status sync reads
/// (governance-policy-framework-addon, `controllers/statussync/policy_status_sync.go`,
/// `getEventsInCluster`: core/v1 Events in the Policy's namespace whose involvedObject UID is
/// the Policy's and whose reason is `policy: <namespace>/<template>`; the compliance is the
/// message's prefix, `parseComplianceFromMessage`).
async fn report_template(
    ctx: &Context,
    t: &AdmissionHealthPolicy,
    want: &AdmissionHealthPolicyStatus,
    again: bool,
) -> Result<AdmissionHealthPolicyStatus, kube::Error> {
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    if let Some(live) = t.status.as_ref().filter(|s| s.same_verdict(want) && !again) {
        return Ok(live.clone());
    }
    let before = t.status.as_ref().and_then(|s| s.message.clone());
    let mut status = AdmissionHealthPolicyStatus {
        history: t
            .status
            .as_ref()
            .map(|s| s.history.clone())
            .unwrap_or_default(),
        ..want.clone()
    };
    let parent = t
        .owner_references()
        .iter()
        .find(|o| {
            o.kind == "Policy"
                && o.api_version
                    .starts_with("policy.open-cluster-management.io/")
        })
        .cloned();
    // Event first: a status written without its Event would hide the change from the hub.
    if before != want.message || again {
        match &parent {
            Some(p) => {
                let (nanos, at) = reporting::hub::event_instant(jiff::Timestamp::now());
                emit_compliance_event(ctx, &ns, &name, p, want, nanos).await?;
                // The same message at the same instant: status-sync counts the Event and this
                // entry once, and still has the entry once the Event has expired.
                status.history = reporting::hub::with_entry(
                    &status.history,
                    TemplateHistoryEntry {
                        last_timestamp: at,
                        message: want.message.clone().unwrap_or_default(),
                    },
                );
                info!(namespace = %ns, template = %name, message = want.message.as_deref().unwrap_or_default(), "reported to ACM");
            }
            None => warn!(
                namespace = %ns,
                template = %name,
                "the AdmissionHealthPolicy has no parent Policy (ACM's framework addon sets one); its verdict stays in its status"
            ),
        }
    }
    let api: Api<AdmissionHealthPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    // A merge patch keeps an array it does not name: an empty list must be sent as one, or
    // the related objects of a verdict that has none (a summary with every cluster Compliant)
    // would stay the old ones.
    let mut patch = serde_json::json!({ "status": status });
    patch["status"]["relatedObjects"] = serde_json::json!(status.related_objects);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(status)
}

/// The newest history message the replicated Policy owning `t` shows for it (status-sync's
/// `details[].history[0]`), if the Policy is in the store.
fn hub_newest(
    policies: &kube::runtime::reflector::Store<Policy>,
    t: &AdmissionHealthPolicy,
) -> Option<String> {
    let parent = t.owner_references().iter().find(|o| o.kind == "Policy")?;
    let key = kube::runtime::reflector::ObjectRef::<Policy>::new(&parent.name)
        .within(&t.namespace().unwrap_or_default());
    let p = policies.get(&key)?;
    if p.uid().as_deref() != Some(parent.uid.as_str()) {
        return None;
    }
    p.status
        .as_ref()?
        .details
        .iter()
        .find(|d| d.template_meta.name == t.name_any())?
        .history
        .first()
        .map(|h| h.message.clone())
}

async fn emit_compliance_event(
    ctx: &Context,
    ns: &str,
    template: &str,
    parent: &OwnerReference,
    want: &AdmissionHealthPolicyStatus,
    nanos: i128,
) -> Result<(), kube::Error> {
    let now = jiff::Timestamp::from_nanosecond(nanos).unwrap_or_else(|_| jiff::Timestamp::now());
    let compliant = want.compliant == Some(ComplianceState::Compliant);
    let event = CoreEvent {
        metadata: kube::api::ObjectMeta {
            // client-go's convention, which the status sync reads for a precise timestamp.
            name: Some(format!("{}.{nanos:x}", parent.name)),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(parent.api_version.clone()),
            kind: Some(parent.kind.clone()),
            name: Some(parent.name.clone()),
            namespace: Some(ns.to_string()),
            uid: Some(parent.uid.clone()),
            ..Default::default()
        },
        reason: Some(format!("policy: {ns}/{template}")),
        message: want.message.clone(),
        type_: Some(if compliant { "Normal" } else { "Warning" }.into()),
        source: Some(EventSource {
            component: Some("hcp-fleet-agent".into()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some("hcp-fleet-agent".into()),
        reporting_instance: Some(
            std::env::var("POD_NAME").unwrap_or_else(|_| "hcp-fleet-agent".into()),
        ),
        ..Default::default()
    };
    Api::<CoreEvent>::namespaced(ctx.client.clone(), ns)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

/// Removes what earlier releases wrote outside ACM's flow (docs/reporting.md): the Policy in
/// each HCP namespace and the roll-up Policy in the agent's namespace. On a hub, ACM's
/// propagator takes such Policies for unplaced root policies and wipes their status.
pub(crate) async fn remove_legacy_policies(ctx: &Context) {
    if !ctx.caps.policy_crd {
        return;
    }
    let lp = kube::api::ListParams::default().labels(&format!(
        "{}={}",
        hcp_fleet_model::names::MANAGED_BY,
        hcp_fleet_model::names::MANAGED_BY_VALUE
    ));
    let mut targets: Vec<(String, String)> = vec![(
        ctx.agent_namespace.clone(),
        reporting::hub::LEGACY_ROLLUP_NAME.to_string(),
    )];
    match Api::<Policy>::all(ctx.client.clone())
        .list_metadata(&lp)
        .await
    {
        Ok(l) => targets.extend(
            l.items
                .iter()
                .filter(|p| p.name_any() == reporting::hub::LEGACY_POLICY_NAME)
                .filter_map(|p| Some((p.namespace()?, p.name_any()))),
        ),
        Err(e) => {
            warn!(error = %crate::human::KubeError(&e), "listing the Policies earlier releases wrote failed; they stay");
            return;
        }
    }
    for (ns, name) in targets {
        match Api::<Policy>::namespaced(ctx.client.clone(), &ns)
            .delete(&name, &Default::default())
            .await
        {
            Ok(_) => {
                info!(namespace = %ns, policy = %name, "removed a Policy an earlier release wrote outside ACM's flow")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(error = %crate::human::KubeError(&e), namespace = %ns, policy = %name, "removing a legacy Policy failed")
            }
        }
    }
}
