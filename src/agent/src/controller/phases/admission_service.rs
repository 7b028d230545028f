//! Phase 4: the admission service in the HCP namespace. Renders every management-side object
//! (pure, `hcp_fleet_render::management`), applies them in dependency order (certificates before the pods
//! that mount them), and reports whether the Deployment is available. Where no guard calls
//! the service (`webhooks::needs_admission_service`), `retire` removes all of it once the
//! hosted side no longer calls it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::controller::context::Context;
use crate::controller::error::Failure;
use crate::controller::io::apply::{Applied, Repair, apply_against, delete_if_present};
use crate::controller::io::cache::{self, object_key};
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use crate::metrics::DriftLabels;
use hcp_fleet_model::compare;
use hcp_fleet_model::crd::HostedControlPlane;
use hcp_fleet_model::crd::hostedcontrolplane::Scheduling;
use hcp_fleet_render::certificates::CertBundle;
use hcp_fleet_render::config::{AgentConfig, MonitoringApi};
use hcp_fleet_render::hosted::webhooks;
use hcp_fleet_render::management;
use hcp_fleet_render::management::HcpInputs;
use hcp_fleet_render::reporting::{Concern, Observation};
use tracing::warn;

/// This phase's part of an HCP's state (`HcpState::service`), written only here. Caches: a
/// restarted agent starts from its first look.
#[derive(Debug, Default)]
pub(in crate::controller) struct Kept {
    /// Management-side objects seen in place as rendered, by `Kind/name`, with the
    /// fingerprint of that rendering: a later write to one of them is drift.
    prints: std::collections::HashMap<String, u64>,
    /// Objects the configuration no longer asks for, seen deleted (same keys): not asked
    /// about again until the agent writes them once more.
    absent: std::collections::HashSet<String>,
    /// Whether the admission Deployment was available at the last look: losing it afterwards
    /// is an outage (NonCompliant), not a rollout in progress (Pending).
    served: bool,
}

/// Whether the admission Deployment serves now, and whether it did at the last look (kept for
/// the next). Once available, every later unavailability (in this agent's life) is an outage:
/// the Deployment rolls with maxUnavailable 0, so a rollout never makes it unavailable. A
/// generation its controller has not yet looked at (the spec just applied) is still served by
/// the replicas its status counts; only the first install waits for it.
pub(in crate::controller) fn served(s: &Scope<'_>, deployment: &Deployment) -> (bool, bool) {
    let was = s.ctx.with_hcp(s.ns, |h| h.service.served);
    let now = management::deployment_available(deployment)
        || (was && management::deployment_serving(deployment));
    s.ctx.with_hcp(s.ns, |h| h.service.served |= now);
    (now, was)
}

/// Where one management-side object lives: its API, kind and name, and the watch store that
/// may answer for it.
pub(crate) struct Target<'a, K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash,
{
    pub(crate) api: Api<K>,
    pub(crate) kind: &'static str,
    pub(crate) name: &'a str,
    pub(crate) store: Option<&'a dyn cache::Cached<K>>,
}

/// One management-side object: read, and written only where it differs from what is
/// rendered. A write to an object that was in place as rendered before (same desired state,
/// seen matching) is drift: someone else deleted or changed it. Returns the object as the
/// server has it, and a note when it repaired drift.
async fn put<K>(
    ctx: &Context,
    ns: &str,
    target: Target<'_, K>,
    obj: &K,
) -> Result<(K, Option<String>), Failure>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    put_wrote(ctx, ns, target, obj)
        .await
        .map(|(o, note, _)| (o, note))
}

/// `put`, its repair told to `note` (with the object's kind), which counts and keeps it.
async fn put_noted<K>(
    ctx: &Context,
    ns: &str,
    target: Target<'_, K>,
    obj: &K,
    note: &mut impl FnMut(Option<String>, &str),
) -> Result<K, Failure>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let kind = target.kind;
    let (live, n) = put(ctx, ns, target, obj).await?;
    note(n, kind);
    Ok(live)
}

/// `put`, also saying whether it wrote.
pub(crate) async fn put_wrote<K>(
    ctx: &Context,
    ns: &str,
    target: Target<'_, K>,
    obj: &K,
) -> Result<(K, Option<String>, bool), Failure>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let Target {
        api,
        kind,
        name,
        store,
    } = target;
    let failed = |source| Failure::ApplyAdmission {
        kind,
        name: name.to_string(),
        source,
    };
    let want = serde_json::to_value(obj)
        .map_err(kube::Error::SerdeError)
        .map_err(failed)?;
    let key = object_key(&api, name);
    let print = compare::fingerprint(&want);
    let seen = ctx.with_hcp(ns, |s| s.service.prints.get(&key).copied());
    let live = cache::read(ctx, ns, &api, store, name)
        .await
        .map_err(failed)?;
    // The Deployment's pods' spec, and the NetworkPolicy's and PDB's spec, are the agent's
    // whole (`management::owned_whole`): what another manager added there is named in the note
    // and removed.
    let (same, repair, foreign): (management::MatchFn, _, _) = match management::owned_whole(kind) {
        Some((under, same)) => {
            let foreign = live
                .as_ref()
                .and_then(|l| serde_json::to_value(l).ok())
                .map(|l| compare::foreign_to_apply(&l, management::FIELD_MANAGER, under))
                .unwrap_or_default();
            // Compared whole: any difference is replaced, whoever wrote it.
            let repair = if management::compared_whole(kind) {
                Repair::Replace
            } else {
                Repair::Whole(under)
            };
            (same, repair, foreign)
        }
        None => (compare::subset, Repair::Apply, Vec::new()),
    };
    let applied = apply_against(&api, name, obj, live, same, repair)
        .await
        .map_err(failed)?;
    if !matches!(applied, Applied::Unchanged(_)) {
        cache::wrote(ctx, ns, &api, name, Some(applied.object()));
    }
    let note = match (&applied, seen) {
        // Gone, though it was in place: whatever it held (a certificate, say) is new now.
        (Applied::Created(_), Some(_)) => Some(format!("{kind} {name} deleted; recreated")),
        (Applied::Updated(_), Some(p)) if p == print && foreign.is_empty() => {
            Some(format!("{kind} {name} changed; restored"))
        }
        (Applied::Updated(_), _) if !foreign.is_empty() => Some(format!(
            "{kind} {name} changed; restored: removed {}",
            compare::summary(&foreign).unwrap_or_default()
        )),
        _ => None,
    };
    // Only an object seen to match can later be said to have drifted.
    let in_place =
        matches!(applied, Applied::Unchanged(_)) || written_matches(&want, applied.object());
    ctx.with_hcp(ns, |s| {
        let kept = &mut s.service;
        kept.absent.remove(&key);
        if in_place {
            kept.prints.insert(key, print);
        } else {
            kept.prints.remove(&key);
        }
    });
    let wrote = !matches!(applied, Applied::Unchanged(_));
    Ok((applied.into_object(), note, wrote))
}

fn written_matches<K: Serialize>(want: &serde_json::Value, live: &K) -> bool {
    serde_json::to_value(live).is_ok_and(|l| compare::subset(want, &l))
}

/// Owned for garbage collection, but never blocking HyperShift's deletion of the HCP.
pub(crate) fn owner(hcp: &HostedControlPlane) -> Option<OwnerReference> {
    hcp.controller_owner_ref(&()).map(|o| OwnerReference {
        block_owner_deletion: Some(false),
        controller: Some(false),
        ..o
    })
}

/// What the phase found: the Deployment as the server has it, and the drift it repaired.
pub(crate) struct AdmissionService {
    pub(crate) deployment: Deployment,
    pub(crate) drift: Vec<String>,
}

/// Applies the admission service where it differs from the rendering; returns the
/// Deployment as the server has it now.
pub(crate) async fn ensure(
    s: &Scope<'_>,
    certs: &CertBundle,
    scheduling: &Scheduling,
) -> Result<AdmissionService, Failure> {
    let (ctx, cfg, ns, cluster) = (s.ctx, s.cfg, s.ns, s.cluster);
    let objs = management::render(
        cfg,
        &HcpInputs {
            namespace: ns,
            agent_namespace: &ctx.agent_namespace,
            owner: owner(s.hcp),
            certs,
            pdb_api: ctx.caps.pdb_api,
            scheduling,
            monitoring: ctx.caps.monitoring(cfg.admission.service_monitor.api_group),
            revision: Some(s.revision),
        },
    )
    .map_err(Failure::RenderAdmission)?;
    let c = || ctx.client.clone();
    let caches = ctx.caches();
    let name = cfg.admission.service_name.as_str();
    let mut drift = Vec::new();
    let mut note = |n: Option<String>, kind: &str| {
        if let Some(n) = n {
            ctx.metrics
                .management_drift
                .get_or_create(&DriftLabels::new(ns, cluster, kind))
                .inc();
            drift.push(n);
        }
    };
    around_the_deployment(ctx, cfg, ns, &objs, &mut note).await?;
    monitoring(ctx, cfg, ns, &objs, &mut note).await?;
    let deployment = put_noted(
        ctx,
        ns,
        Target {
            api: Api::<Deployment>::namespaced(c(), ns),
            kind: "Deployment",
            name,
            store: caches.deployments.as_ref().map(|s| s as _),
        },
        &objs.deployment,
        &mut note,
    )
    .await?;
    Ok(AdmissionService { deployment, drift })
}

/// Everything the Deployment needs beside it: its Secrets, ServiceAccount, Service,
/// NetworkPolicy and (where the server serves one) PodDisruptionBudget.
async fn around_the_deployment(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    objs: &management::ManagementObjects,
    note: &mut impl FnMut(Option<String>, &str),
) -> Result<(), Failure> {
    let c = || ctx.client.clone();
    let caches = ctx.caches();
    let name = cfg.admission.service_name.as_str();
    let secrets = || Api::<Secret>::namespaced(c(), ns);
    put_noted(
        ctx,
        ns,
        Target {
            api: secrets(),
            kind: "Secret",
            name: &management::ca_secret_name(cfg),
            store: caches.ca_secrets.as_ref().map(|s| s as _),
        },
        &objs.ca_secret,
        note,
    )
    .await?;
    put_noted(
        ctx,
        ns,
        Target {
            api: secrets(),
            kind: "Secret",
            name: &management::tls_secret_name(cfg),
            store: caches.tls_secrets.as_ref().map(|s| s as _),
        },
        &objs.tls_secret,
        note,
    )
    .await?;
    put_noted(
        ctx,
        ns,
        Target {
            api: Api::<ServiceAccount>::namespaced(c(), ns),
            kind: "ServiceAccount",
            name,
            store: caches.service_accounts.as_ref().map(|s| s as _),
        },
        &objs.service_account,
        note,
    )
    .await?;
    put_noted(
        ctx,
        ns,
        Target {
            api: Api::<Service>::namespaced(c(), ns),
            kind: "Service",
            name,
            store: caches.services.as_ref().map(|s| s as _),
        },
        &objs.service,
        note,
    )
    .await?;
    put_noted(
        ctx,
        ns,
        Target {
            api: Api::<NetworkPolicy>::namespaced(c(), ns),
            kind: "NetworkPolicy",
            name,
            store: caches.network_policies.as_ref().map(|s| s as _),
        },
        &objs.network_policy,
        note,
    )
    .await?;
    if let (Some(pdb), Some(ar)) = (&objs.pdb, ctx.caps.pdb_api.api_resource()) {
        let api = Api::<DynamicObject>::namespaced_with(c(), ns, &ar);
        put_noted(
            ctx,
            ns,
            Target {
                api,
                kind: "PodDisruptionBudget",
                name,
                store: caches.pdbs.as_ref().map(|s| s as _),
            },
            pdb,
            note,
        )
        .await?;
    }
    Ok(())
}

/// The ServiceMonitor in the configured API group and the platform Prometheus's RoleBinding;
/// whatever the configuration no longer asks for (another group, `none`, access turned off)
/// is removed, in every group the cluster serves.
async fn monitoring(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    objs: &management::ManagementObjects,
    note: &mut impl FnMut(Option<String>, &str),
) -> Result<(), Failure> {
    let name = cfg.admission.service_name.as_str();
    let wanted = ctx.caps.monitoring(cfg.admission.service_monitor.api_group);
    for api in ctx.caps.monitoring_apis() {
        let Some(ar) = management::service_monitor_resource(api) else {
            continue;
        };
        let monitors = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &ar);
        match (&objs.service_monitor, api == wanted) {
            (Some(sm), true) => {
                put_noted(
                    ctx,
                    ns,
                    Target {
                        api: monitors,
                        kind: "ServiceMonitor",
                        name,
                        store: None,
                    },
                    sm,
                    note,
                )
                .await?;
            }
            _ => {
                remove(ctx, ns, &monitors, "ServiceMonitor", name).await?;
            }
        }
    }
    if ctx.caps.monitoring(MonitoringApi::Coreos) == MonitoringApi::Coreos {
        let bindings = Api::<RoleBinding>::namespaced(ctx.client.clone(), ns);
        let rb_name = management::prometheus_binding_name(cfg);
        match &objs.prometheus_binding {
            Some(rb) => {
                put_noted(
                    ctx,
                    ns,
                    Target {
                        api: bindings,
                        kind: "RoleBinding",
                        name: &rb_name,
                        store: None,
                    },
                    rb,
                    note,
                )
                .await?;
            }
            None => {
                remove(ctx, ns, &bindings, "RoleBinding", &rb_name).await?;
            }
        }
    }
    Ok(())
}

/// Deletes an object the configuration no longer asks for. Only one this agent has seen in
/// place since it started is certain to exist; after a restart one DELETE per reconcile finds
/// out (a 404 is what was wanted). Whether it deleted one.
pub(crate) async fn remove<K>(
    ctx: &Context,
    ns: &str,
    api: &Api<K>,
    kind: &'static str,
    name: &str,
) -> Result<bool, Failure>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if noted_absent(ctx, ns, api, name) {
        return Ok(false);
    }
    let deleted = delete_if_present(api, name)
        .await
        .map_err(|source| Failure::ApplyAdmission {
            kind,
            name: name.to_string(),
            source,
        })?;
    note_absent(ctx, ns, api, name);
    Ok(deleted)
}

/// Whether the agent knows `name` to be gone (it removed it, and has not written it since).
fn noted_absent<K: Resource>(ctx: &Context, ns: &str, api: &Api<K>, name: &str) -> bool {
    let key = object_key(api, name);
    ctx.with_hcp(ns, |s| s.service.absent.contains(&key))
}

/// Records that `name` is gone: nothing asks for it again until the agent writes it.
fn note_absent<K: Resource>(ctx: &Context, ns: &str, api: &Api<K>, name: &str) {
    let key = object_key(api, name);
    cache::wrote::<K, _>(ctx, ns, api, name, None);
    ctx.with_hcp(ns, |s| {
        s.service.prints.remove(&key);
        s.service.absent.insert(key);
    });
}

/// Whether the admission Deployment is there (from its watch's store where it may be
/// believed). A read that fails says yes: what may be running is kept.
pub(crate) async fn exists(s: &Scope<'_>) -> bool {
    let (ctx, ns) = (s.ctx, s.ns);
    let api = Api::<Deployment>::namespaced(ctx.client.clone(), ns);
    let store = ctx.caches().deployments;
    cache::read(ctx, ns, &api, store.as_ref(), &s.cfg.admission.service_name)
        .await
        .map_or(true, |d| d.is_some())
}

/// Everything phase 4 keeps in the HCP namespace, removed: called once no guard needs the
/// service and the hosted cluster's install has removed the last webhook that called it. The
/// pods first, then what served, watched and secured them. Each object is read first (from
/// its watch's store where there is one), so a restart over HCPs that need no service writes
/// nothing. Returns the kinds it deleted.
pub(crate) async fn retire(s: &Scope<'_>) -> Result<Vec<&'static str>, Failure> {
    let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
    let c = || ctx.client.clone();
    let caches = ctx.caches();
    let name = cfg.admission.service_name.as_str();
    let mut gone = Vec::new();
    let mut note = |deleted: bool, kind: &'static str| {
        if deleted && !gone.contains(&kind) {
            gone.push(kind);
        }
    };
    let deployments = caches.deployments.as_ref().map(|s| s as _);
    let api = Api::<Deployment>::namespaced(c(), ns);
    note(
        retire_one(ctx, ns, target(api, "Deployment", name, deployments)).await?,
        "Deployment",
    );
    if let Some(ar) = ctx.caps.pdb_api.api_resource() {
        let api = Api::<DynamicObject>::namespaced_with(c(), ns, &ar);
        let pdbs = caches.pdbs.as_ref().map(|s| s as _);
        let t = target(api, "PodDisruptionBudget", name, pdbs);
        note(retire_one(ctx, ns, t).await?, "PodDisruptionBudget");
    }
    let services = caches.services.as_ref().map(|s| s as _);
    let api = Api::<Service>::namespaced(c(), ns);
    note(
        retire_one(ctx, ns, target(api, "Service", name, services)).await?,
        "Service",
    );
    let policies = caches.network_policies.as_ref().map(|s| s as _);
    let api = Api::<NetworkPolicy>::namespaced(c(), ns);
    let t = target(api, "NetworkPolicy", name, policies);
    note(retire_one(ctx, ns, t).await?, "NetworkPolicy");
    for api in ctx.caps.monitoring_apis() {
        if let Some(ar) = management::service_monitor_resource(api) {
            let api = Api::<DynamicObject>::namespaced_with(c(), ns, &ar);
            let t = target(api, "ServiceMonitor", name, None);
            note(retire_one(ctx, ns, t).await?, "ServiceMonitor");
        }
    }
    if ctx.caps.monitoring(MonitoringApi::Coreos) == MonitoringApi::Coreos {
        let rb = management::prometheus_binding_name(cfg);
        let t = target(
            Api::<RoleBinding>::namespaced(c(), ns),
            "RoleBinding",
            &rb,
            None,
        );
        note(retire_one(ctx, ns, t).await?, "RoleBinding");
    }
    let accounts = caches.service_accounts.as_ref().map(|s| s as _);
    let api = Api::<ServiceAccount>::namespaced(c(), ns);
    let t = target(api, "ServiceAccount", name, accounts);
    note(retire_one(ctx, ns, t).await?, "ServiceAccount");
    // Known to its watch to be absent (always, where no HCP ever had a service), no request.
    let registry = hcp_fleet_render::internal_registry::CONFIG_MAP;
    if !cache::config_map_absent(caches.registry_config_maps.as_ref(), registry, ns) {
        let api = Api::<ConfigMap>::namespaced(c(), ns);
        let t = target(api, "ConfigMap", registry, None);
        note(retire_one(ctx, ns, t).await?, "ConfigMap");
    }
    // The serving certificate, then its CA.
    for (secret, store) in [
        (management::tls_secret_name(cfg), &caches.tls_secrets),
        (management::ca_secret_name(cfg), &caches.ca_secrets),
    ] {
        let api = Api::<Secret>::namespaced(c(), ns);
        let t = target(api, "Secret", &secret, store.as_ref().map(|s| s as _));
        note(retire_one(ctx, ns, t).await?, "Secret");
    }
    // A service started again later is a new one: its first unavailability is a start, not
    // an outage, and its certificate must be seen served before it is settled.
    ctx.with_hcp(ns, |h| h.service.served = false);
    super::trust::forget(ctx, ns);
    ctx.metrics.cert_expiry.remove(&s.labels());
    Ok(gone)
}

fn target<'a, K: Resource + 'static>(
    api: Api<K>,
    kind: &'static str,
    name: &'a str,
    store: Option<&'a dyn cache::Cached<K>>,
) -> Target<'a, K>
where
    K::DynamicType: Eq + std::hash::Hash,
{
    Target {
        api,
        kind,
        name,
        store,
    }
}

/// One object `retire` removes: read first (from its store where it has one), so that one
/// already gone costs no DELETE, then `remove`d. Whether it deleted.
async fn retire_one<K>(ctx: &Context, ns: &str, t: Target<'_, K>) -> Result<bool, Failure>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    if noted_absent(ctx, ns, &t.api, t.name) {
        return Ok(false);
    }
    let live = cache::read(ctx, ns, &t.api, t.store, t.name)
        .await
        .map_err(|source| Failure::ApplyAdmission {
            kind: t.kind,
            name: t.name.to_string(),
            source,
        })?;
    if live.is_none() {
        note_absent(ctx, ns, &t.api, t.name);
        return Ok(false);
    }
    remove(ctx, ns, &t.api, t.kind, t.name).await
}

/// Phase 2's verdict, which decides whether this phase runs: whether a guard needs the
/// admission service, and whether that is known (the hosted cluster answered now, or what it
/// offered when it last did). Unknown, a service that exists is kept.
pub(in crate::controller) async fn needed(
    s: &Scope<'_>,
    hosted: &Result<HostedClient, Failure>,
) -> (bool, bool) {
    let features = match hosted {
        Ok(h) => Some(h.features().await),
        Err(_) => s
            .ctx
            .with_hcp(s.ns, |h| h.access.client().and_then(|c| c.known_features())),
    };
    match (features, hosted.is_ok()) {
        (Some(f), true) => (webhooks::needs_admission_service(s.cfg, f), true),
        // Not reached now: a service that runs is kept, whatever it offered.
        (Some(f), false) => (
            webhooks::needs_admission_service(s.cfg, f) || exists(s).await,
            true,
        ),
        (None, _) => (exists(s).await, false),
    }
}

/// Where no guard needs the admission service: what served it retired (`retire`), and the
/// record says so.
pub(in crate::controller) async fn retired(
    s: &Scope<'_>,
) -> Result<Vec<(Concern, Observation)>, Failure> {
    let gone = retire(s).await?;
    Ok(not_needed(&gone))
}

/// What the record says of an HCP that needs no admission service (`gone`: what was just
/// removed of one it had).
pub(in crate::controller) fn not_needed(gone: &[&str]) -> Vec<(Concern, Observation)> {
    let mut text = String::from(
        "not deployed: every guard runs inside the hosted kube-apiserver, and no webhook calls the admission service",
    );
    if !gone.is_empty() {
        text.push_str(&format!("; removed: {}", gone.join(", ")));
    }
    vec![
        (Concern::AdmissionService, Observation::compliant(text)),
        (
            Concern::Certificate,
            Observation::compliant("none needed: no webhook calls the admission service"),
        ),
    ]
}

/// Phase 4's product: what its apply found, for the record whether or not the Deployment
/// then serves.
pub(in crate::controller) struct Admitted {
    /// Whether the Deployment had fully rolled out to its current spec.
    pub(in crate::controller) rolled_out: bool,
    /// The management drift it repaired.
    pub(in crate::controller) drift: Vec<String>,
    pub(in crate::controller) observed: Vec<(Concern, Observation)>,
    /// Whether the Deployment serves (`false`: a first install waits for it), or the outage.
    pub(in crate::controller) serving: Result<bool, Failure>,
}

/// Phase 4: the admission service applied where it differs from the rendering, then its
/// Deployment's availability.
pub(in crate::controller) async fn admit(
    s: &Scope<'_>,
    certs: &super::certificates::Certificates,
) -> Result<Admitted, Failure> {
    let scheduling = s.hcp.scheduling();
    if !scheduling.ignored.is_empty() {
        warn!(ignored = ?scheduling.ignored, "malformed HCP scheduling fields not followed");
    }
    let service = ensure(s, &certs.bundle, &scheduling).await?;
    let deployment = service.deployment;
    let valid_until = format!("serving certificate valid until {}", certs.expires);
    let mut admitted = Admitted {
        rolled_out: management::deployment_rolled_out(&deployment),
        drift: service.drift,
        observed: vec![(Concern::Certificate, Observation::compliant(valid_until))],
        serving: Ok(false),
    };
    let (available, was_available) = served(s, &deployment);
    let want = management::replicas(s.cfg, &scheduling);
    if !available && was_available {
        // An outage, not a rollout that has yet to finish: the guard is off.
        let status = deployment.status.as_ref();
        admitted.serving = Err(Failure::AdmissionDown {
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            want,
        });
        return Ok(admitted);
    }
    if !available {
        let waiting = "waiting for the admission Deployment to become available";
        admitted.observed.extend([
            (Concern::AdmissionService, Observation::pending(waiting)),
            (
                Concern::HostedWebhooks,
                Observation::pending("waiting for the admission service"),
            ),
        ]);
        return Ok(admitted);
    }
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas);
    let mut available = format!(
        "Deployment available ({}/{want} replicas)",
        ready.unwrap_or(0)
    );
    if !scheduling.ignored.is_empty() {
        available.push_str(&format!(
            "; not followed (malformed): {}",
            scheduling.ignored.join("; ")
        ));
    }
    if !admitted.drift.is_empty() {
        available.push_str(&format!("; drift repaired: {}", admitted.drift.join("; ")));
    }
    admitted
        .observed
        .push((Concern::AdmissionService, Observation::compliant(available)));
    admitted.serving = Ok(true);
    Ok(admitted)
}
