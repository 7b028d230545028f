//! The HCP controller: one kube-runtime Controller over HostedControlPlanes, reconciling each
//! through the phases of docs/architecture.md ("One reconcile, phase by phase").
//!
//! | module | what it holds |
//! |---|---|
//! | `mod.rs` (this file) | wiring: the Controller, what it watches, the tasks beside it |
//! | `reconcile` | the orchestrator: the phases in order, `error_policy`, backoff, pause |
//! | `phases/` | one module per phase (`phases/mod.rs` lists them in order) |
//! | `report` | the per-HCP half of reporting: AdmissionHealth status, history, Events, the fleet row |
//! | `acm/` | the ACM side: the hub's verdicts (`acm/hub.rs`), managed clusters, template access |
//! | `io/` | the I/O helpers the phases share: apply, the caches of the agent's objects, the watches |
//! | `context` | shared clients and settings; one `HcpState` per HCP namespace, a part per owner |
//! | `scope` | `Scope`: one HCP's identity, configuration and the agent's context, through every phase |
//! | `error` | `ReconcileError`: phase, concern, source |
//! | `discovery` | what the management cluster serves (PDB API, the agent's CRDs, ACM's Policy CRD) |
//! | `ownership` | one owner per HCP: another installation's HCPs are left alone |
//! | `rollout` | the progressive rollout's loop (`AdmissionRollout`); which revision and override an HCP runs |
//! | `endpoints` | the seam: how the hosted kube-apiserver reaches an admission service |

pub mod acm;
mod context;
mod discovery;
mod endpoints;
mod error;
mod io;
mod ownership;
mod phases;
mod reconcile;
mod report;
mod rollout;
mod scope;

use io::{cache, claims, guest_services, text_store, watches};
use phases::{static_guards, trust};

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tracing::warn;

pub use context::{Context, HcpState, RunOptions, hcp_labels};
pub use discovery::{Capabilities, discover};
pub use endpoints::{AdmissionEndpoints, InCluster, ReplicasUnknown, Seen};
pub use error::{Failure, Phase, ReconcileError};
pub use reconcile::{backoff, error_policy, reconcile};
pub use trust::installed_trust;

use context::AbortOnDrop;
use hcp_fleet_model::crd::HostedControlPlane;
use hcp_fleet_render::config::MonitoringApi;
use hcp_fleet_render::management;

/// What stops the controller: `run`'s `shutdown`.
pub type Shutdown = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>;

/// Runs the controller until `shutdown` resolves. Each item of `reload` (a new configuration)
/// reconciles every HCP.
///
/// The future is boxed here, and `shutdown` is a box, so that nothing of the controller is
/// generic: rustc compiles a generic `async fn`'s body, and everything it awaits, in each crate
/// that instantiates it. When this took `impl Future`, the release build compiled the whole
/// controller again in the cli crate: half of that crate's LLVM IR, and 43 of the 514 CPU-s
/// the image's second compile of the project's crates took (docs/testbed.md).
pub fn run(
    ctx: Arc<Context>,
    requeue: mpsc::UnboundedReceiver<ObjectRef<HostedControlPlane>>,
    reload: mpsc::UnboundedReceiver<()>,
    shutdown: Shutdown,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(running(ctx, requeue, reload, shutdown))
}

async fn running(
    ctx: Arc<Context>,
    requeue: mpsc::UnboundedReceiver<ObjectRef<HostedControlPlane>>,
    reload: mpsc::UnboundedReceiver<()>,
    shutdown: Shutdown,
) {
    say_what_is_missing(&ctx.caps);
    acm::hub::remove_legacy_policies(&ctx).await;
    // Tied to this future: when the controller stops (or its task is aborted) they stop too,
    // and with them the last references to the context, its drift watches and probes.
    let _templates = ctx
        .caps
        .template_crd
        .then(|| AbortOnDrop(tokio::spawn(acm::hub::template_reporter(ctx.clone()))));
    let _deletions = AbortOnDrop(tokio::spawn(watches::deletion_watcher(ctx.clone())));
    let cfg = ctx.config();
    let hcps: Api<HostedControlPlane> = Api::all(ctx.client.clone());
    let mut caches = cache::Caches::default();
    // The HCPs' store holds only what the agent reads of each (no managed fields, which
    // HyperShift's controllers write many of, and no part of HyperShift's spec and status the
    // agent has no use for): kept for every HCP, the whole objects were most of the store.
    let (store, fill) = Store::with_filler();
    let hcp_events = reflected(
        hcps,
        watcher::Config::default(),
        fill,
        &[],
        HostedControlPlane::keep_only_what_is_read,
        |_| {},
    );
    let controller = Controller::for_stream(hcp_events.applied_objects(), store.clone());
    let mut controller = owning(&ctx, controller, &cfg, &mut caches);
    // A rotated (or repaired) kubeconfig secret must reach the hosted cluster's reconcile
    // without polling: watch those secrets by name and map each to its namespace's HCPs.
    let kubeconfigs = cached(
        &ctx,
        by_name(cfg.hosted_access.kubeconfig_secret.clone()),
        &mut caches.kubeconfig_secrets,
        &[],
    );
    let _health = ctx
        .caps
        .health_crd
        .then(|| health_records(&ctx, &mut caches));
    let (guest_services, filler) = guest_services::GuestServices::watch(ctx.client.clone());
    caches.guest_services = Some(guest_services);
    let _guest_services = AbortOnDrop(tokio::spawn(filler));
    let _ready_endpoints = ready_endpoints(&ctx, &cfg.admission.service_name, &mut caches);
    let offered = Arc::new(static_guards::Offered::new());
    caches.kube_apiservers = Some(Arc::clone(&offered));
    // An override changes what its HCP runs: reconcile that HCP.
    let overrides = ctx
        .caps
        .override_crd
        .then(|| cached(&ctx, watcher::Config::default(), &mut caches.overrides, &[]));
    ctx.set_caches(caches);
    // Before the first reconcile: a restarted agent hands out what the rollout says.
    rollout::init(&ctx).await;
    let _rollout = ctx
        .caps
        .rollout_crd
        .then(|| AbortOnDrop(tokio::spawn(rollout::run(ctx.clone(), store.clone()))));
    let in_namespace = {
        let store = store.clone();
        move |ns: Option<String>| {
            // Every watched object's event maps through here (a restart lists each kubeconfig
            // Secret): compared in place, not through a copy of every HCP's namespace.
            store
                .state_filter(|h| h.metadata.namespace.as_deref() == ns.as_deref())
                .iter()
                .map(|h| ObjectRef::from_obj(h.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    if let Some(overrides) = overrides {
        let in_namespace = in_namespace.clone();
        controller = controller.watches_stream(overrides, move |o| in_namespace(o.namespace()));
    }
    let kube_apiservers = kube_apiservers(&ctx, offered);
    let in_namespace_too = in_namespace.clone();
    let running = controller
        .watches_stream(kube_apiservers, move |d| in_namespace_too(d.namespace()))
        .watches_stream(kubeconfigs, move |s: Secret| in_namespace(s.namespace()))
        .reconcile_on(receiver_stream(requeue))
        .reconcile_all_on(receiver_stream(reload))
        .with_config(kube::runtime::controller::Config::default().concurrency(cfg.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    // The heartbeat beats in the controller's own task: a controller stuck there (a blocking
    // call, a deadlock) stops it, and `/healthz` fails (`crate::liveness`).
    let heartbeat = async {
        let mut every = tokio::time::interval(crate::liveness::HEARTBEAT);
        loop {
            every.tick().await;
            ctx.metrics.liveness.beat();
        }
    };
    tokio::select! {
        () = running => {}
        () = heartbeat => {}
    }
}

/// The health records, read before each report (not a trigger: the agent writes them), and the
/// clusters they claim (`claims`).
fn health_records(ctx: &Arc<Context>, caches: &mut cache::Caches) -> AbortOnDrop {
    let (reader, mut fill) = Store::with_filler();
    caches.health = Some(reader);
    let claims = Arc::new(claims::Claims::default());
    caches.claims = Some(Arc::clone(&claims));
    let records = Api::<hcp_fleet_model::crd::AdmissionHealth>::all(ctx.client.clone());
    AbortOnDrop(tokio::spawn(
        reflected(
            records,
            watcher::Config::default(),
            // The claims first: a store that has listed means they have too.
            move |ev| {
                claims.take(ev);
                fill(ev);
            },
            &[],
            |_| {},
            delivered(ctx, ()),
        )
        .for_each(|_| futures::future::ready(())),
    ))
}

/// The admission services' ready replicas, kept by a watch in a task of its own (stopped with
/// the returned guard) and read through `caches`.
fn ready_endpoints(ctx: &Arc<Context>, service: &str, caches: &mut cache::Caches) -> AbortOnDrop {
    let ready = Arc::new(endpoints::ReadyEndpoints::new(service));
    caches.ready_endpoints = Some(Arc::clone(&ready));
    AbortOnDrop(tokio::spawn(endpoints::ReadyEndpoints::watch(
        ready,
        ctx.client.clone(),
    )))
}

/// HyperShift's kube-apiserver Deployments, by name: whether each mounts the static guards'
/// ConfigMap is kept in `offered` (one answer per namespace, nothing else of them), which the
/// reconciles read instead of the server, and each namespace whose answer changes is
/// reconciled (a stand-in Deployment with its namespace and name, for the Controller's mapper:
/// kube-runtime takes an object reference of every trigger, and one without a name panics).
fn kube_apiservers(
    ctx: &Arc<Context>,
    offered: Arc<static_guards::Offered>,
) -> impl futures::Stream<Item = Result<k8s_openapi::api::apps::v1::Deployment, watcher::Error>>
+ Send
+ 'static {
    watcher(
        Api::<k8s_openapi::api::apps::v1::Deployment>::all(ctx.client.clone()),
        by_name(hcp_fleet_render::hosted::static_guards::KUBE_APISERVER.into()),
    )
    .default_backoff()
    .map_ok(move |event| {
        let changed = offered.apply(event);
        futures::stream::iter(changed.into_iter().map(|ns| {
            Ok(k8s_openapi::api::apps::v1::Deployment {
                metadata: kube::api::ObjectMeta {
                    name: Some(hcp_fleet_render::hosted::static_guards::KUBE_APISERVER.into()),
                    namespace: Some(ns),
                    ..Default::default()
                },
                ..Default::default()
            })
        }))
    })
    .try_flatten()
}

/// The agent's ConfigMaps named `name` in every namespace, metadata only, kept in `store`
/// (which namespaces hold one): each touched one, for the Controller's owner mapping.
fn config_maps_named(
    ctx: &Arc<Context>,
    name: &str,
    store: &mut Option<Store<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>>>,
) -> impl futures::Stream<
    Item = Result<
        kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>,
        watcher::Error,
    >,
> + Send
+ 'static {
    let (held, writer) = kube::runtime::reflector::store();
    *store = Some(held);
    let configmaps =
        Api::<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>>::all(
            ctx.client.clone(),
        );
    kube::runtime::reflector(writer, watcher(configmaps, by_name(name.into())))
        .default_backoff()
        .touched_objects()
}

/// The Controller told of every object of the admission services (a deletion or an edit is
/// repaired at once rather than at the next unrelated reconcile), each watch also filling
/// `caches`' store for it, which the reconciles read instead of asking the server
/// (`cache.rs`). The Secrets by name: the agent may read only those (RBAC resourceNames), not
/// every Secret.
fn owning(
    ctx: &Arc<Context>,
    controller: Controller<HostedControlPlane>,
    cfg: &hcp_fleet_render::config::AgentConfig,
    caches: &mut cache::Caches,
) -> Controller<HostedControlPlane> {
    let owned = owned_objects();
    let mut controller = controller
        .owns_stream(cached(
            ctx,
            owned.clone(),
            &mut caches.deployments,
            management::DEPLOYMENT_OWNED_WHOLE,
        ))
        .owns_stream(cached(
            ctx,
            owned.clone(),
            &mut caches.service_accounts,
            &[],
        ))
        .owns_stream(cached(ctx, owned.clone(), &mut caches.services, &[]))
        .owns_stream(cached(
            ctx,
            owned.clone(),
            &mut caches.network_policies,
            management::SPEC_OWNED_WHOLE,
        ))
        .owns_stream(cached(
            ctx,
            by_name(management::ca_secret_name(cfg)),
            &mut caches.ca_secrets,
            &[],
        ))
        .owns_stream(cached(
            ctx,
            by_name(management::tls_secret_name(cfg)),
            &mut caches.tls_secrets,
            &[],
        ));
    // The static guards' ConfigMaps: an edit or a deletion is repaired at once. Their
    // metadata is kept (which namespaces hold one); their content is read by GET, once per
    // reconcile of an HCP with static guards.
    let stream = config_maps_named(
        ctx,
        hcp_fleet_render::hosted::static_guards::CONFIG_MAP,
        &mut caches.static_config_maps,
    );
    controller = controller.owns_stream(stream);
    // The internal registry's ConfigMaps (the admission replicas mount them), the same way:
    // a deletion is repaired at once, and retiring a service reads none that is not there.
    let stream = config_maps_named(
        ctx,
        hcp_fleet_render::internal_registry::CONFIG_MAP,
        &mut caches.registry_config_maps,
    );
    controller = controller.owns_stream(stream);
    if let Some(ar) = ctx.caps.pdb_api.api_resource() {
        let pdbs = Api::<DynamicObject>::all_with(ctx.client.clone(), &ar);
        let (held, fill) = text_store::TextStore::with_filler();
        caches.pdbs = Some(held);
        // A list's items carry no apiVersion and kind; a GET's do, and the comparison with
        // the rendered object needs them.
        let types = kube::api::TypeMeta {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
        };
        let stream = reflected(
            pdbs,
            owned.clone(),
            fill,
            management::SPEC_OWNED_WHOLE,
            move |o| o.types = Some(types.clone()),
            delivered(ctx, ar.clone()),
        )
        .touched_objects();
        controller = controller.owns_stream_with(stream, ar);
    }
    // Every served monitoring API, not only the configured one: a configuration change that
    // moves the ServiceMonitor leaves the old one to be pruned, and a deleted one repaired.
    for ar in ctx
        .caps
        .monitoring_apis()
        .filter_map(management::service_monitor_resource)
    {
        let monitors = Api::<DynamicObject>::all_with(ctx.client.clone(), &ar);
        controller = controller.owns_with(monitors, ar, owned.clone());
    }
    if ctx.caps.monitoring(MonitoringApi::Coreos) == MonitoringApi::Coreos {
        controller = controller.owns(Api::<RoleBinding>::all(ctx.client.clone()), owned);
    }
    controller
}

/// What works without each optional CRD, said once at start.
fn say_what_is_missing(caps: &Capabilities) {
    if !caps.health_crd {
        warn!(
            "the AdmissionHealth CRD ({}) is not installed; reporting through metrics only",
            discovery::HEALTH_CRD
        );
    }
    if !caps.template_crd {
        warn!(
            "the AdmissionHealthPolicy CRD ({}) is not installed; nothing is reported to ACM",
            discovery::TEMPLATE_CRD
        );
    }
    if !caps.override_crd {
        warn!(
            "the HostedAdmissionOverride CRD ({}) is not installed; no per-HCP overrides",
            discovery::OVERRIDE_CRD
        );
    }
}

/// One object by name in every namespace (a Secret the agent may read by RBAC resourceNames).
fn by_name(name: String) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={name}"))
}

/// The agent's own management objects: what it labels as managed by it.
fn owned_objects() -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{}={}",
        hcp_fleet_model::names::MANAGED_BY,
        hcp_fleet_model::names::MANAGED_BY_VALUE
    ))
}

/// A watch of `K` (selected by `cfg`) that keeps `slot`'s store, as a trigger stream for the
/// Controller. Of each object's managed fields the store keeps only the parts under `keep`
/// (for the comparison of a part the agent owns whole, `compare::foreign_fields`).
fn cached<K, S: Fillable<K>>(
    ctx: &Arc<Context>,
    cfg: watcher::Config,
    slot: &mut Option<S>,
    keep: &'static [&'static str],
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, fill) = S::with_filler();
    *slot = Some(store);
    let api = Api::<K>::all(ctx.client.clone());
    reflected(api, cfg, fill, keep, |_| {}, delivered(ctx, ())).touched_objects()
}

/// What fills a store from a watch's events.
type Filler<K> = Box<dyn FnMut(&watcher::Event<K>) + Send>;

/// A store a watch keeps (`cached`): kube's reflector store, objects typed, or a `TextStore`.
trait Fillable<K>: Sized {
    fn with_filler() -> (Self, Filler<K>);
}

impl<K> Fillable<K> for Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn with_filler() -> (Self, Filler<K>) {
        let (reader, mut writer) = kube::runtime::reflector::store();
        (reader, Box::new(move |ev| writer.apply_watcher_event(ev)))
    }
}

impl<K> Fillable<K> for text_store::TextStore<K>
where
    K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    fn with_filler() -> (Self, Filler<K>) {
        let held = text_store::TextStore::default();
        let filled = held.clone();
        (held, Box::new(move |ev| filled.apply(ev)))
    }
}

/// For `reflected`: tells the HCP's read cache that its store has delivered each object at
/// its current version (`cache::SeenLog::mark_delivered`). Holds the context weakly: a watch must not keep
/// the controller's context alive.
fn delivered<K: kube::Resource>(
    ctx: &Arc<Context>,
    dyntype: K::DynamicType,
) -> impl Fn(&K) + Send + 'static
where
    K::DynamicType: Send + 'static,
{
    let ctx = Arc::downgrade(ctx);
    move |o: &K| {
        let (Some(ctx), Some(ns), Some(name), Some(rv)) = (
            ctx.upgrade(),
            o.meta().namespace.as_deref(),
            o.meta().name.as_deref(),
            o.meta().resource_version.as_deref(),
        ) else {
            return;
        };
        let key = format!("{}/{name}", K::url_path(&dyntype, Some(ns)));
        cache::SeenLog::mark_delivered(ctx.as_ref(), ns, &key, rv);
    }
}

/// The managed-field entries `compare::foreign_to_apply` reads under `keep`: not of a
/// subresource, each set cut down to those parts, and then to what is foreign
/// (`compare::foreign_only`: the agent's own Apply set dropped, every other one without what
/// that set also owns; an entry under the agent's name by another operation is kept as
/// someone else's, named as `compare::not_applied` says); nothing at all where `keep` is
/// empty.
fn kept_managed_fields(
    entries: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
    keep: &[&str],
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    if keep.is_empty() {
        return Vec::new();
    }
    let pruned = entries
        .iter()
        .filter(|e| e.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|e| {
            let fields = hcp_fleet_model::compare::prune_fields(&e.fields_v1.as_ref()?.0, keep)?;
            let manager = e.manager.clone().unwrap_or_default();
            let applied = e.operation.as_deref().is_none_or(|o| o == "Apply");
            let manager = if manager == management::FIELD_MANAGER && !applied {
                hcp_fleet_model::compare::not_applied(&manager)
            } else {
                manager
            };
            Some((manager, fields))
        })
        .collect();
    hcp_fleet_model::compare::foreign_only(pruned, management::FIELD_MANAGER)
        .into_iter()
        .map(|(manager, fields)| ManagedFieldsEntry {
            manager: Some(manager),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        })
        .collect()
}

/// The events of a watch of `api` (selected by `cfg`, with backoff) as they fill a store
/// (`fill`): each object without its managed fields (most of a small object), but for the
/// parts under `keep` (`kept_managed_fields`), and `fix` applied.
fn reflected<K>(
    api: Api<K>,
    cfg: watcher::Config,
    mut fill: impl FnMut(&watcher::Event<K>) + Send + 'static,
    keep: &'static [&'static str],
    fix: impl Fn(&mut K) + Send + 'static,
    seen: impl Fn(&K) + Send + 'static,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    watcher(api, cfg).default_backoff().map_ok(move |ev| {
        let ev = ev.modify(|o| {
            let kept = kept_managed_fields(o.managed_fields(), keep);
            *o.managed_fields_mut() = kept;
            fix(o);
            seen(o);
        });
        fill(&ev);
        ev
    })
}

fn receiver_stream<T>(rx: mpsc::UnboundedReceiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::Metrics;
    use hcp_fleet_render::config::AgentConfig;
    use hcp_fleet_render::reporting::{Concern, Observation, Observations};

    /// What a watch's store keeps of a Deployment's managed fields is read as the live object
    /// is, under the rule that only the agent's apply is its own: a write under its name by
    /// an Update stays someone else's in the store too (a store that read it as the agent's
    /// would say "in place" where the server says "tampered", and the reconcile would believe
    /// the store).
    #[test]
    fn a_stores_managed_fields_read_as_the_live_objects_under_the_apply_only_rule() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let entry = |manager: &str, operation: &str, sub: Option<&str>, f: serde_json::Value| {
            ManagedFieldsEntry {
                manager: Some(manager.into()),
                operation: Some(operation.into()),
                subresource: sub.map(Into::into),
                fields_v1: Some(FieldsV1(f)),
                ..Default::default()
            }
        };
        let ours = management::FIELD_MANAGER;
        let apply = serde_json::json!({"f:spec": {"f:template": {"f:spec": {
            "f:containers": {"k:{\"name\":\"admission\"}": {".": {}, "f:image": {}}}}}}});
        let cases = [
            vec![entry(ours, "Apply", None, apply.clone())],
            vec![
                entry(ours, "Apply", None, apply.clone()),
                entry(
                    ours,
                    "Update",
                    None,
                    serde_json::json!({"f:spec": {"f:template": {"f:spec": {
                    "f:hostNetwork": {},
                    "f:containers": {"k:{\"name\":\"admission\"}": {"f:image": {}}}}}}}),
                ),
            ],
            vec![
                entry(ours, "Apply", None, apply.clone()),
                entry(
                    "tenant",
                    "Update",
                    None,
                    serde_json::json!({"f:spec": {"f:template": {"f:spec": {"f:nodeName": {}}}}}),
                ),
                entry(
                    ours,
                    "Update",
                    None,
                    serde_json::json!({"f:spec": {"f:template": {"f:spec": {"f:terminationGracePeriodSeconds": {}}}}}),
                ),
                entry(
                    "kube-controller-manager",
                    "Update",
                    Some("status"),
                    serde_json::json!({"f:status": {"f:replicas": {}}}),
                ),
            ],
        ];
        let live = |entries: &[ManagedFieldsEntry]| serde_json::json!({"metadata": {"managedFields": serde_json::to_value(entries).expect("json")}});
        let under = management::DEPLOYMENT_OWNED_WHOLE;
        for (i, entries) in cases.iter().enumerate() {
            let whole = hcp_fleet_model::compare::foreign_to_apply(&live(entries), ours, under);
            let kept = kept_managed_fields(entries, under);
            assert_eq!(
                hcp_fleet_model::compare::foreign_to_apply(&live(&kept), ours, under),
                whole,
                "case {i}"
            );
            assert_eq!(whole.is_empty(), i == 0, "case {i}: {whole:?}");
        }
    }

    fn test_context() -> Arc<Context> {
        let url = "https://127.0.0.1:1".parse().expect("url");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
        let caps = Capabilities {
            pdb_api: management::PdbApi::V1,
            policy_crd: false,
            pending_supported: true,
            health_crd: false,
            template_crd: false,
            monitoring_served: [false; 2],
            rollout_crd: false,
            override_crd: false,
            hosted_cluster_crd: false,
        };
        let opts = RunOptions {
            agent_namespace: "agent".into(),
            endpoints: Arc::new(InCluster),
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

    fn pass(obs: &Observations) -> report::Pass<'_> {
        report::Pass {
            obs,
            drift_repaired: 0,
            revision: "r",
            rolled_out: true,
            paused: None,
            paths: None,
        }
    }

    #[tokio::test]
    async fn a_late_report_never_resurrects_a_deleted_hcp() {
        let ctx = test_context();
        ctx.tombstone("uid-1".into());
        let (ns, hc) = ("clusters-hc-1", "hc-1");
        report::report(&ctx, &hcp("uid-1"), ns, hc, &pass(&all_compliant())).await;
        assert!(ctx.rollup_rows().is_empty());
        assert!(!ctx.metrics.encode().contains("clusters-hc-1"));
        // A recreated HCP (new UID) in the same namespace is reported normally.
        report::report(&ctx, &hcp("uid-2"), ns, hc, &pass(&all_compliant())).await;
        assert_eq!(ctx.rollup_rows().len(), 1);
    }

    #[tokio::test]
    async fn forget_drops_the_state_and_every_series_even_without_a_rollup_row() {
        let ctx = test_context();
        let l = hcp_labels("clusters-hc-1", "hc-1");
        ctx.metrics.cert_expiry.get_or_create(&l).set(1);
        ctx.metrics.hosted_requests.get_or_create(&l).inc();
        // A state to drop (the first look at an HCP creates it).
        ctx.with_hcp("clusters-hc-1", |_| ());
        ctx.forget("clusters-hc-1", "hc-1");
        assert!(!ctx.metrics.encode().contains("clusters-hc-1"));
        assert!(ctx.hcps().is_empty());
    }

    #[tokio::test]
    async fn a_failure_counts_by_phase_and_backs_off_per_hcp() {
        let ctx = test_context();
        let err = Failure::HostedTimeout {
            server: "https://x".into(),
            seconds: 1,
        }
        .in_namespace("clusters-hc-1");
        // Each retry at a jittered point of its backoff (`retries_are_spread_…` below).
        let first = error_policy(Arc::new(hcp("u")), &err, ctx.clone());
        let second = error_policy(Arc::new(hcp("u")), &err, ctx.clone());
        assert_ne!(first, kube::runtime::controller::Action::await_change());
        assert_ne!(second, kube::runtime::controller::Action::await_change());
        let text = ctx.metrics.encode();
        assert!(
            text.contains("hcp_fleet_reconcile_errors_total{phase=\"hosted-webhooks\"} 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn stopping_the_agent_stops_its_background_tasks() {
        let ctx = test_context();
        let (_tx, rx) = mpsc::unbounded_channel();
        let (_rtx, rrx) = mpsc::unbounded_channel();
        let weak = Arc::downgrade(&ctx);
        let run = tokio::spawn(run(
            ctx,
            rx,
            rrx,
            Box::pin(futures::future::pending::<()>()),
        ));
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
    fn retries_are_spread_over_their_whole_backoff() {
        use super::reconcile::jittered;
        let cap = Duration::from_secs(32);
        assert_eq!(jittered(cap, 0.0), Duration::from_secs(1), "never at once");
        assert_eq!(jittered(cap, 0.5), Duration::from_secs(16));
        assert!(jittered(cap, 0.999_999) <= cap);
        assert_eq!(
            jittered(cap, 7.0),
            cap,
            "a fraction out of range is clamped"
        );
        assert_eq!(
            jittered(Duration::from_millis(500), 0.0),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn unsettled_replicas_are_looked_at_every_two_seconds_then_backed_off() {
        let secs: Vec<u64> = (1..=18)
            .map(|n| reconcile::settle_wait(n).as_secs())
            .collect();
        assert_eq!(&secs[..15], &[2; 15]);
        assert_eq!(&secs[15..], &[2, 4, 8]);
    }
}
