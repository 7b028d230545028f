//! Phase 5 and 6: the guards in the hosted cluster (webhook configurations and, where served,
//! admission policies with their bindings), applied where they differ and pruned where no
//! longer wanted, with the drift watch told the new desired state before the write so the
//! agent's own write is never taken for drift.
//!
//! A guard that moves between engines is never unguarded: the new path is written first and
//! proven in force by the probe of its revision before the old one is removed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};

use crate::controller::io::apply::{
    Applied, Repair, apply_against, apply_or_delete, delete_if_present,
};

use super::probe;
use super::proof::Proof;
use super::static_guards::{StaticForce, StaticState, Statics};
use crate::controller::context::Context;
use crate::controller::error::Failure;
use crate::controller::io::watches;
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use crate::metrics::EngineLabels;
use hcp_fleet_render::hosted::admission_policies;
use hcp_fleet_render::hosted::admission_policies::{Engine, type_warnings};
use hcp_fleet_render::hosted::objects;
use hcp_fleet_render::hosted::objects::HostedFeatures;
use hcp_fleet_render::hosted::static_guards;
use hcp_fleet_render::hosted::wanted::Wanted;
use hcp_fleet_render::hosted::webhooks;
use hcp_fleet_render::hosted::webhooks::{HostedWebhooks, MUTATING_NAME, VALIDATING_NAME};
use hcp_fleet_render::reporting::Observation;

/// What the phase found: how many configurations are installed, and the drift repaired since
/// the last reconcile (one note per change by someone else).
pub(crate) struct Installed {
    pub(crate) configurations: usize,
    pub(crate) drift: Vec<String>,
    /// Where the exemptions are applied: by the API server (matchConditions), or by the
    /// admission service after the call.
    pub(crate) exemptions_in_api_server: bool,
    /// Guards carried by webhooks and by admission policies.
    pub(crate) guards: (usize, usize),
    /// Mutations carried by MutatingAdmissionPolicies (the rest are webhooks).
    pub(crate) mutating_policies: usize,
    /// Guards (validating and mutating) the hosted kube-apiserver loads from files, proven in
    /// force.
    pub(crate) static_guards: usize,
    /// Guards not on the engine asked for, and why.
    pub(crate) notes: Vec<String>,
    /// What the API server's type check says is wrong in the agent's policies.
    pub(crate) type_warnings: Vec<String>,
    /// The revisions the probe asks for.
    pub(crate) targets: probe::ProbeTargets,
    /// Static guards are wanted whose revision is not yet proven in force (just written, or
    /// the hosted kube-apiserver does not load them): the reconcile looks again.
    pub(crate) static_waiting: bool,
    /// Guards asking for engine static that are not on it, and why (Pending while the
    /// hosted kube-apiserver may still be loading the files, then NonCompliant).
    pub(crate) static_notes: Vec<String>,
    /// This hosted kube-apiserver cannot load them at all (NonCompliant at once).
    pub(crate) static_refused: bool,
    /// The path each guard takes, for the record.
    pub(crate) paths: Vec<hcp_fleet_model::crd::GuardPath>,
}

/// What the guards in a hosted cluster are to trust and run, and what their answers prove.
pub(crate) struct Want<'a> {
    /// The caBundle the webhook configurations carry.
    pub(crate) ca_bundle: &'a str,
    /// The configuration revision (the rollout's) they are annotated with.
    pub(crate) revision: &'a str,
    /// What the probe's and the canaries' answers must prove.
    pub(crate) proof: &'a Proof,
    /// The static guards, their ConfigMap put in place where that only adds guards (phase 3).
    pub(crate) statics: &'a Statics,
    /// The hosted cluster's internal registry, which the pod image spec mutation's policy
    /// carries (`internal_registry::current`).
    pub(crate) registry: Option<&'a hcp_fleet_guards::pod_image_spec::InternalRegistry>,
    /// Whether a guard calls the admission service (`webhooks::needs_admission_service`): where
    /// none does, no address is looked up for it.
    pub(crate) service: bool,
}

/// Fails when a Service in the HCP namespace would make HyperShift delete the guest webhooks
/// at `url_base` (an unlabelled Service whose name the URL contains).
async fn not_condemned(
    ctx: &Context,
    index: Option<&crate::controller::io::guest_services::GuestServices>,
    ns: &str,
    url_base: &str,
) -> Result<(), Failure> {
    let indexed = match index {
        Some(index) => index.unlabelled(ns).await,
        None => None,
    };
    let unlabelled = match indexed {
        Some(names) => names,
        None => {
            let services = Api::<Service>::namespaced(ctx.client.clone(), ns)
                .list(&ListParams::default())
                .await
                .map_err(Failure::ListServices)?;
            hcp_fleet_render::management::unlabelled_services(&services.items)
        }
    };
    let condemning = hcp_fleet_render::management::names_condemning(url_base, &unlabelled);
    if condemning.is_empty() {
        Ok(())
    } else {
        Err(Failure::GuestWebhooksCondemned {
            url: url_base.to_string(),
            services: condemning,
        })
    }
}

/// What the install came to: the type checker's warnings, or the failure as reported.
fn outcome(
    installed: Result<Result<Vec<String>, InstallError>, tokio::time::error::Elapsed>,
    hosted: &HostedClient,
    timeout: Duration,
) -> Result<Vec<String>, Failure> {
    match installed {
        Ok(Ok(warnings)) => Ok(warnings),
        Ok(Err(InstallError::Api(source))) => Err(Failure::HostedApi {
            server: hosted.server.clone(),
            secret: hosted.secret.clone(),
            source,
        }),
        Ok(Err(InstallError::Unproven { to, why })) => Err(Failure::SwitchUnproven {
            server: hosted.server.clone(),
            to,
            seconds: timeout.as_secs(),
            why,
        }),
        Err(_) => Err(Failure::HostedTimeout {
            server: hosted.server.clone(),
            seconds: (timeout * 2).as_secs(),
        }),
    }
}

pub(crate) async fn ensure(
    s: &Scope<'_>,
    hosted: &HostedClient,
    want: Want<'_>,
) -> Result<Installed, Failure> {
    let (ctx, cfg, ns, cluster) = (s.ctx, s.cfg, s.ns, s.cluster);
    let Want {
        ca_bundle,
        revision,
        proof,
        statics,
        registry,
        service,
    } = want;
    let url_base = url_base(s, service).await?;
    let mut features = hosted.features().await;
    let timeout = cfg.hosted_access.request_timeout();
    let in_force = statics.in_force(hosted, features, timeout, proof).await;
    in_force.apply(&mut features, statics.offered);
    let mut desired = webhooks::render(cfg, ns, &url_base, ca_bundle, features, registry)
        .map_err(Failure::RenderWebhooks)?
        .annotated(hcp_fleet_render::rollout::REVISION_ANNOTATION, revision);
    carried_by_files(&mut desired, statics, &in_force);
    // Hosted access has confirmed the claim (and read the management identity) first.
    if let Some(uid) = ctx.management_uid() {
        desired = desired.claimed(&webhooks::claim_value(&uid, ns));
    }
    let (notes, static_notes) = engine_notes(cfg, features, &in_force);
    let want = usize::from(desired.validating.is_some()) + usize::from(desired.mutating.is_some());
    let guards = desired.guards();
    let labels = s.labels();
    let m = &ctx.metrics;
    m.webhooks_desired.get_or_create(&labels).set(want as i64);
    for (engine, n) in [
        (Engine::Webhook, guards.0),
        (Engine::Policy, guards.1),
        (Engine::Static, desired.static_guards.len()),
    ] {
        m.guards
            .get_or_create(&EngineLabels::new(ns, cluster, engine.as_str()))
            .set(n as i64);
    }
    let wanted = Wanted::of(&desired);
    watches::ensure_drift_watch(s, hosted, wanted.clone(), features);
    watch_told(
        ctx,
        ns,
        proof,
        super::canary::shared_plan(cfg, &desired),
        timeout,
    )
    .await;
    let t0 = Instant::now();
    // The deadline covers the writes and, when a guard moves, one proof of the new path.
    let installed = tokio::time::timeout(
        timeout * 2,
        install(
            &hosted.client(),
            &desired,
            &Ours {
                validating: admission_policies::names_ours(&cfg.webhooks),
                mutating: admission_policies::mutating_names_ours(&cfg.webhooks),
            },
            features,
            timeout,
            proof,
        ),
    )
    .await;
    m.hosted_latency
        .get_or_create(&labels)
        .observe(t0.elapsed().as_secs_f64());
    let type_warnings = match outcome(installed, hosted, timeout) {
        Ok(w) => w,
        Err(f) => {
            m.hosted_errors.get_or_create(&labels).inc();
            m.webhooks_installed.get_or_create(&labels).set(0);
            return Err(f);
        }
    };
    m.webhooks_installed.get_or_create(&labels).set(want as i64);
    // Every guard leaving the static guards has its API-side path proven now: the files may
    // follow.
    let wrote_statics = statics.ensure_after(s).await?;
    let drift = watches::installed_as(ctx, ns, &wanted);
    Ok(Installed {
        configurations: want,
        drift,
        exemptions_in_api_server: features.match_conditions,
        guards,
        mutating_policies: desired.policies.mutations().count(),
        static_guards: desired.static_guards.len(),
        notes,
        type_warnings,
        targets: probe::ProbeTargets {
            static_guards: desired.static_revision.clone(),
            static_mutating: desired.static_mutating_revision.clone(),
            ..probe::ProbeTargets::of(&wanted, proof.clone())
        },
        static_waiting: !statics.wanted.is_empty() && (wrote_statics || in_force.unsettled()),
        static_refused: in_force.refused(),
        static_notes,
        paths: desired.paths(cfg),
    })
}

/// Tells the probe what it must prove and which canaries run, and waits until a new drift watch
/// watches from versions taken before the install's reads: a change made after the install
/// read an object is then an event of its watch, not missed. Not longer than a request
/// (`within`): a watch that cannot list its kinds lists each object itself.
async fn watch_told(
    ctx: &Context,
    ns: &str,
    proof: &Proof,
    canaries: std::sync::Arc<Vec<super::canary::Planned>>,
    within: Duration,
) {
    probe::plan(ctx, ns, proof, canaries);
    if let Some(started) = watches::started(ctx, ns) {
        let _ = tokio::time::timeout(within, started).await;
    }
}

/// The guards of each static file proven in force, and its revision, on `desired` (which then
/// writes nothing of them through the API, and probes them).
fn carried_by_files(desired: &mut HostedWebhooks, statics: &Statics, in_force: &StaticForce) {
    if in_force.validating == StaticState::InForce {
        desired.static_guards = statics.wanted.validating_guards();
        desired.static_revision = statics.wanted.revision.clone();
    }
    if in_force.mutating == StaticState::InForce {
        desired
            .static_guards
            .extend(statics.wanted.mutating_guards());
        desired.static_mutating_revision = statics.wanted.mutating_revision.clone();
    }
}

/// Where the hosted kube-apiserver calls the admission service, once no Service in the HCP
/// namespace would make HyperShift delete webhooks pointing there. Where no guard calls it
/// (`service` false), the default, which no webhook carries.
async fn url_base(s: &Scope<'_>, service: bool) -> Result<String, Failure> {
    let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
    if !service {
        return Ok(webhooks::default_url_base(cfg, ns));
    }
    let caches = ctx.caches();
    let service = caches
        .services
        .and_then(|s| s.get(ns, &cfg.admission.service_name))
        .and_then(Result::ok);
    let url_base = ctx
        .endpoints
        .url_base(&ctx.client, cfg, ns, service.as_ref())
        .await;
    // Installing what HyperShift deletes at once would be a fight counted as drift forever.
    not_condemned(ctx, caches.guest_services.as_ref(), ns, &url_base).await?;
    Ok(url_base)
}

/// The guards not on the engine asked for, and why: (the others, and for those asking for
/// static, one note that says first why the static guards are not in force: a record's
/// message is cut at a length, and eight guards' names would hide the reason).
fn engine_notes(
    cfg: &hcp_fleet_render::config::AgentConfig,
    features: HostedFeatures,
    in_force: &StaticForce,
) -> (Vec<String>, Vec<String>) {
    let (mut notes, mut waiting) = (Vec::new(), Vec::new());
    // Why the first file a waiting guard needs is not in force.
    let mut first = None;
    for w in cfg.active_webhooks() {
        if let Some(note) = admission_policies::engine_of(w, features).1 {
            if static_guards::is_static(w) {
                waiting.push(w.name.as_str());
                let file = if static_guards::in_mutating_file(w) {
                    &in_force.mutating
                } else {
                    &in_force.validating
                };
                first = first.or(Some(file));
            } else {
                notes.push(note);
            }
        }
    }
    let static_notes = match first {
        Some(StaticState::Waiting(why) | StaticState::Refused(why)) if !waiting.is_empty() => {
            vec![format!(
                "the static guards are not in force in this hosted kube-apiserver: {why}; the {} guard(s) asking for engine static run where engine auto puts them meanwhile ({}; docs/static-guards.md)",
                waiting.len(),
                waiting.join(", ")
            )]
        }
        _ => Vec::new(),
    };
    (notes, static_notes)
}

/// Why `install` stopped.
#[derive(Debug)]
pub(crate) enum InstallError {
    Api(kube::Error),
    /// The path guards move to did not answer its probe in time; the old one was kept.
    Unproven {
        to: &'static str,
        why: String,
    },
}

impl From<kube::Error> for InstallError {
    fn from(e: kube::Error) -> Self {
        InstallError::Api(e)
    }
}

/// What the read of a live webhook configuration found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Hooks {
    /// Not read (no guard was moving off it).
    Unread,
    /// Not there: nothing to delete if it is not wanted.
    Absent,
    /// There; whether it holds an entry for a guard moving off it.
    Present { holds_moving: bool },
}

impl Hooks {
    fn hold_moving(self) -> bool {
        matches!(self, Hooks::Present { holds_moving: true })
    }
}

/// Does the live webhook configuration `name` of kind `K` still hold an entry for one of
/// `guards` (guards that now run as policies)?
async fn still_on_webhooks<K>(
    hosted: &Client,
    name: &str,
    guards: &BTreeSet<&str>,
) -> Result<Hooks, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + serde::Serialize,
    K: std::fmt::Debug,
{
    if guards.is_empty() {
        return Ok(Hooks::Unread);
    }
    let Some(live) = Api::<K>::all(hosted.clone()).get_opt(name).await? else {
        return Ok(Hooks::Absent);
    };
    let live = serde_json::to_value(live).map_err(kube::Error::SerdeError)?;
    let holds_moving = live["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["name"].as_str())
        .any(|n| guards.contains(n));
    Ok(Hooks::Present { holds_moving })
}

/// The webhook configuration `name` as wanted: written, or deleted if there, unless this
/// install's read just found it absent. Every guard on policies makes both configurations
/// unwanted, and a restart over such a fleet sent two deletes of nothing to each hosted
/// cluster (of 85 requests, `make bench`); one created since the read is a tenant's, found by
/// the next install as it would be after the delete.
async fn write_hooks<K>(
    hosted: &Client,
    name: &str,
    desired: Option<&K>,
    read: Hooks,
) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + serde::Serialize,
    K: std::fmt::Debug,
{
    if desired.is_none() && read == Hooks::Absent {
        return Ok(());
    }
    apply_or_delete(
        &Api::<K>::all(hosted.clone()),
        name,
        desired,
        objects::matches,
        Repair::Replace,
    )
    .await
}

/// The object named `name`, taken out of `live` (what remains is not wanted).
fn take_named<K: ResourceExt>(live: &mut Vec<K>, name: &str) -> Option<K> {
    let at = live.iter().position(|o| o.name_any() == name)?;
    Some(live.swap_remove(at))
}

/// Waits until the probe of `engine` at `revision` is answered, for at most `within`.
async fn prove(
    hosted: &Client,
    engine: Engine,
    revision: Option<&str>,
    within: Duration,
    proof: &Proof,
) -> Result<(), InstallError> {
    let to = match engine {
        Engine::Webhook => "webhooks",
        Engine::Policy => "admission policies",
        Engine::Static => "static guards",
    };
    let Some(revision) = revision else {
        return Err(InstallError::Unproven {
            to,
            why: "no probe is installed on that path".into(),
        });
    };
    let answered = |left| async move {
        probe::probe_path(hosted, left, engine, revision, proof)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    until_answered(to, within, answered).await
}

/// Asks `probe` (given the time left, at least a second) until it answers, for at most
/// `within`; `to` names the path for the error.
async fn until_answered<F, Fut>(
    to: &'static str,
    within: Duration,
    probe: F,
) -> Result<(), InstallError>
where
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match probe(left.max(Duration::from_secs(1))).await {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => {
                return Err(InstallError::Unproven { to, why });
            }
            // The API server reloads admission policies about once a second.
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The objects of `api` named in `ours`, each read by its name. Not a list by label: a tenant can label objects of their own like the
/// agent's, as many and as large as they like, and the agent would read them all each time.
/// Read from the API server's watch cache (`resourceVersion=0`), not etcd: a reconcile runs
/// after every tampering, and a quorum read per name slowed the repairs of a tenant who
/// deletes a guard whenever it exists. A stale read costs at most a replace refused at its
/// version and read again (`apply::apply_against`); a change it missed reaches the drift watch.
async fn read_ours<K>(api: &Api<K>, ours: &BTreeSet<String>) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use futures::{StreamExt, TryStreamExt};
    // A few at a time: read together they queued twenty requests at once, and the connection's
    // queues keep the room they grew to (`hosted::watch::Watched`); one at a time, a restarted
    // agent's reconcile waited out forty round trips in a row here, and with sixteen reconciles
    // at once that wait, not the CPU, set how long 1,000 HCPs took (`make bench`).
    // Each read owns what it reads with (a borrowed `api` in the futures makes the whole
    // controller's future not provably Send).
    futures::stream::iter(ours.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                match api.get_with(&name, &kube::api::GetParams::any()).await {
                    Ok(o) => Ok(Some(o)),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                    Err(e) => Err(e),
                }
            }
        })
        .buffered(READS_AT_ONCE)
        .try_filter_map(|o| futures::future::ready(Ok(o)))
        .try_collect()
        .await
}

/// How many of its objects `read_ours` reads from one hosted cluster at once: the drift watch
/// keeps a stream open per wanted object on the same connection, so four short requests more
/// grow none of its queues.
const READS_AT_ONCE: usize = 4;

/// The names the agent may have given its policies and bindings in a hosted cluster, by kind:
/// what `install` reads by name, compares and prunes (`admission_policies::names_ours`,
/// `mutating_names_ours`).
pub(crate) struct Ours {
    pub(crate) validating: BTreeSet<String>,
    pub(crate) mutating: BTreeSet<String>,
}

/// Everything the agent wants in one hosted cluster, in an order that never leaves a guard
/// without a path: policies and bindings are added and (if any was written, or a guard still
/// has its webhook entry) proven in force, then the webhook configurations are written, then
/// (if a policy going belongs to a guard now on a webhook) the webhooks are proven, then the
/// policies no longer wanted go. Stateless: a reconcile that stopped half-way is finished by
/// the next, with the same proofs. Returns the type-check
/// warnings of the policies as the server has them.
pub(crate) async fn install(
    hosted: &Client,
    desired: &HostedWebhooks,
    ours: &Ours,
    features: HostedFeatures,
    within: Duration,
    proof: &Proof,
) -> Result<Vec<String>, InstallError> {
    let papi = Api::<ValidatingAdmissionPolicy>::all(hosted.clone());
    let bapi = Api::<ValidatingAdmissionPolicyBinding>::all(hosted.clone());
    let wanted = &desired.policies;
    let mut warnings = Vec::new();
    let mut validating_read = Hooks::Unread;
    // What is there of every name the agent may have written: compared against, and pruned
    // from, below.
    let (mut live_policies, mut live_bindings) = if features.admission_policies {
        (
            read_ours(&papi, &ours.validating).await?,
            read_ours(&bapi, &ours.validating).await?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    if features.admission_policies {
        // Policies before bindings, the probe's last of each (see `hosted::admission_policies`).
        let mut wrote = false;
        for p in &wanted.policies {
            let name = p.name_any();
            let live = take_named(&mut live_policies, &name);
            let applied =
                apply_against(&papi, &name, p, live, objects::matches, Repair::Replace).await?;
            wrote |= !matches!(applied, Applied::Unchanged(_));
            let live = applied.object();
            warnings.extend(
                type_warnings(live)
                    .into_iter()
                    .map(|w| format!("ValidatingAdmissionPolicy {}: {w}", live.name_any())),
            );
        }
        for b in &wanted.bindings {
            let name = b.name_any();
            let live = take_named(&mut live_bindings, &name);
            let applied =
                apply_against(&bapi, &name, b, live, objects::matches, Repair::Replace).await?;
            wrote |= !matches!(applied, Applied::Unchanged(_));
        }
        // The API server takes up to a second to compile what changed. Until it runs this
        // revision, no guard leaves its webhook, and the probe would only report the delay.
        // Also when nothing was written but a guard still has its webhook entry: an earlier
        // reconcile wrote the policies and stopped before its proof.
        let moving: BTreeSet<&str> = wanted.guards().collect();
        if !wrote {
            validating_read = still_on_webhooks::<ValidatingWebhookConfiguration>(
                hosted,
                VALIDATING_NAME,
                &moving,
            )
            .await?;
        }
        if wrote || validating_read.hold_moving() {
            prove(
                hosted,
                Engine::Policy,
                wanted.revision.as_deref(),
                within,
                proof,
            )
            .await?;
        }
    }
    let (mutating_going, mutating_read) =
        install_mutating(hosted, desired, &ours.mutating, features, within).await?;
    write_hooks(
        hosted,
        VALIDATING_NAME,
        desired.validating.as_ref(),
        validating_read,
    )
    .await?;
    write_hooks(
        hosted,
        MUTATING_NAME,
        desired.mutating.as_ref(),
        mutating_read,
    )
    .await?;
    prune_mutating(hosted, desired, mutating_going, within, proof).await?;
    if !features.admission_policies {
        return Ok(warnings);
    }
    // What is left of the lists is no longer wanted.
    let going: Vec<String> = live_policies.iter().map(|p| p.name_any()).collect();
    let bindings_going: Vec<String> = live_bindings.iter().map(|b| b.name_any()).collect();
    if going.is_empty() && bindings_going.is_empty() {
        return Ok(warnings);
    }
    let hooks: BTreeSet<String> = desired
        .validating
        .iter()
        .flat_map(|v| v.webhooks.iter().flatten().map(|w| w.name.clone()))
        .collect();
    prune_policies(
        hosted,
        desired,
        &hooks,
        (&papi, &going),
        (&bapi, &bindings_going),
        within,
        proof,
    )
    .await?;
    Ok(warnings)
}

/// Policies and bindings no longer wanted go, once the webhook configurations are written: a
/// guard whose policy goes has its webhook entry (in `hooks`) again, proven first (every time:
/// an earlier reconcile may have written the webhook and stopped before its proof). Bindings
/// first: a binding without its policy is an error the server reports.
async fn prune_policies<P, B>(
    hosted: &Client,
    desired: &HostedWebhooks,
    hooks: &BTreeSet<String>,
    (papi, going): (&Api<P>, &[String]),
    (bapi, bindings_going): (&Api<B>, &[String]),
    within: Duration,
    proof: &Proof,
) -> Result<(), InstallError>
where
    P: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    B: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if going.iter().any(|g| hooks.contains(g)) {
        prove(
            hosted,
            Engine::Webhook,
            desired.webhook_revision.as_deref(),
            within,
            proof,
        )
        .await?;
    }
    for b in bindings_going {
        delete_if_present(bapi, b).await?;
    }
    for p in going {
        delete_if_present(papi, p).await?;
    }
    Ok(())
}

/// The mutating policies and bindings wanted, written (the probe's last) and, if any was
/// written or a mutation still has its webhook entry, proven in force by the mutating probe
/// before the webhook configurations lose them. Returns the live ones no longer wanted
/// (policies, bindings), for `prune_mutating` once the webhooks are written, and what the
/// read of the mutating webhook configuration found.
async fn install_mutating(
    hosted: &Client,
    desired: &HostedWebhooks,
    ours: &BTreeSet<String>,
    features: HostedFeatures,
    within: Duration,
) -> Result<((Vec<String>, Vec<String>), Hooks), InstallError> {
    if !features.mutating_policies {
        return Ok(((Vec::new(), Vec::new()), Hooks::Unread));
    }
    let papi =
        Api::<DynamicObject>::all_with(hosted.clone(), &admission_policies::mutating_resource());
    let bapi = Api::<DynamicObject>::all_with(
        hosted.clone(),
        &admission_policies::mutating_binding_resource(),
    );
    let wanted = &desired.policies;
    // `ours` names the probe too (the probe guard's name).
    let mut live_policies = read_ours(&papi, ours).await?;
    let mut live_bindings = read_ours(&bapi, ours).await?;
    let mut wrote = false;
    for (api, wanted, live) in [
        (&papi, &wanted.mutating, &mut live_policies),
        (&bapi, &wanted.mutating_bindings, &mut live_bindings),
    ] {
        for o in wanted {
            let name = o.name_any();
            let have = take_named(live, &name);
            let applied =
                apply_against(api, &name, o, have, objects::matches, Repair::Replace).await?;
            wrote |= !matches!(applied, Applied::Unchanged(_));
        }
    }
    let moving: BTreeSet<&str> = wanted.mutations().collect();
    let read =
        still_on_webhooks::<MutatingWebhookConfiguration>(hosted, MUTATING_NAME, &moving).await?;
    if let Some(revision) = wanted.mutating_revision.as_deref()
        && (wrote || read.hold_moving())
    {
        let answered = |left| probe::probe_mutating(hosted, left, revision);
        until_answered("mutating admission policies", within, answered).await?;
    }
    Ok((
        (
            live_policies.iter().map(|p| p.name_any()).collect(),
            live_bindings.iter().map(|b| b.name_any()).collect(),
        ),
        read,
    ))
}

/// The mutating policies and bindings no longer wanted go, once the webhooks are written: a
/// mutation whose policy goes has its webhook entry again, proven first.
async fn prune_mutating(
    hosted: &Client,
    desired: &HostedWebhooks,
    (going, bindings_going): (Vec<String>, Vec<String>),
    within: Duration,
    proof: &Proof,
) -> Result<(), InstallError> {
    if going.is_empty() && bindings_going.is_empty() {
        return Ok(());
    }
    let hooks: BTreeSet<String> = desired
        .mutating
        .iter()
        .flat_map(|m| m.webhooks.iter().flatten().map(|w| w.name.clone()))
        .collect();
    let papi =
        Api::<DynamicObject>::all_with(hosted.clone(), &admission_policies::mutating_resource());
    let bapi = Api::<DynamicObject>::all_with(
        hosted.clone(),
        &admission_policies::mutating_binding_resource(),
    );
    prune_policies(
        hosted,
        desired,
        &hooks,
        (&papi, &going),
        (&bapi, &bindings_going),
        within,
        proof,
    )
    .await
}

/// What phases 5-6 say of the hosted configurations: installed and current (on which
/// engines), or the drift repaired; and what an operator must fix while the guards run.
pub(in crate::controller) fn observation(
    installed: &Installed,
    drift: &[String],
    settled: bool,
    static_waits: u32,
) -> Observation {
    let mut webhooks = if drift.is_empty() {
        let n = installed.configurations;
        let exemptions = if installed.exemptions_in_api_server {
            "exemptions applied by the API server (matchConditions)"
        } else {
            "exemptions applied by the admission service"
        };
        let (by_webhook, by_policy) = installed.guards;
        let mut text = format!("{n} webhook configuration(s) installed and current; {exemptions}");
        if by_policy > 0 {
            text.push_str(&format!(
                "; {by_policy} guard(s) run as ValidatingAdmissionPolicy in the hosted kube-apiserver (exemptions as matchConditions), {by_webhook} as webhooks"
            ));
        }
        if installed.mutating_policies > 0 {
            text.push_str(&format!(
                "; {} mutation(s) run as MutatingAdmissionPolicy",
                installed.mutating_policies
            ));
        }
        if installed.static_guards > 0 {
            text.push_str(&format!(
                "; {} guard(s) loaded from files by the hosted kube-apiserver (static)",
                installed.static_guards
            ));
        }
        text
    } else {
        format!("drift repaired: {}", drift.join("; "))
    };
    if !settled {
        webhooks.push_str(
            "; the previous CA stays in the caBundle until every replica serves the new certificate",
        );
    }
    // A policy the API server cannot type-check, or a guard not on the engine asked for, is
    // for an operator to fix: the guards keep running meanwhile.
    let problems: Vec<String> = installed
        .type_warnings
        .iter()
        .map(|w| format!("type check: {w}"))
        .chain(installed.notes.iter().cloned())
        .collect();
    if !problems.is_empty() {
        return Observation::violation(format!("{}; {webhooks}", problems.join("; ")));
    }
    if installed.static_notes.is_empty() {
        return Observation::compliant(webhooks);
    }
    let why = installed.static_notes.join("; ");
    // Files written a moment ago take a kubelet's volume update and a reload to be in force.
    if !installed.static_refused && (1..=STATIC_GRACE_LOOKS).contains(&static_waits) {
        Observation::pending(format!(
            "waiting for the hosted kube-apiserver to load the static guards: {why}; {webhooks}"
        ))
    } else {
        Observation::violation(format!("{why}; {webhooks}"))
    }
}

/// Looks (`static_wait`: ten a second apart, then doubling, about 2 minutes in all: a kubelet
/// updates a ConfigMap volume within its sync period and cache TTL, about a minute each) that
/// static guards not yet in force on a server that can load them are Pending before they are
/// NonCompliant.
const STATIC_GRACE_LOOKS: u32 = 16;
