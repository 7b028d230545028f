//! Phase 5's static guards (`hosted::static_guards`, docs/static-guards.md): the ConfigMap the
//! hosted kube-apiserver loads them from, written so that no guard is ever without a path;
//! whether HyperShift's kube-apiserver mounts it (which offers them to engine `auto`); and
//! whether each of its files is in force there, proven through the hosted kube-apiserver
//! itself.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};

use super::probe;
use super::proof::Proof;
use crate::controller::error::Failure;
use crate::controller::io::cache::{self, Relisted, Took};
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use hcp_fleet_guards::pod_image_spec::InternalRegistry;
use hcp_fleet_render::hosted::admission_policies::{self, Engine};
use hcp_fleet_render::hosted::objects::HostedFeatures;
use hcp_fleet_render::hosted::static_guards;
use hcp_fleet_render::hosted::static_guards::StaticGuards;

/// Whether the watch of the static guards' ConfigMaps has listed and holds none in `ns`.
fn absent_by_watch(ctx: &crate::controller::context::Context, ns: &str) -> bool {
    cache::config_map_absent(
        ctx.caches().static_config_maps.as_ref(),
        static_guards::CONFIG_MAP,
        ns,
    )
}

/// Where one file of the static guards of one hosted cluster stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::controller) enum StaticState {
    /// The file carries no guard.
    Unwanted,
    /// Their probe of the wanted revision is answered by the files.
    InForce,
    /// Not (yet) answered, by a server that can load them: the files may still be on their way.
    Waiting(String),
    /// This server cannot load them, or something imitates them.
    Refused(String),
}

/// Both files: the validating policies and the mutating ones (each its own admission plugin,
/// directory and probe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::controller) struct StaticForce {
    pub(in crate::controller) validating: StaticState,
    pub(in crate::controller) mutating: StaticState,
}

impl StaticForce {
    /// Where the static guards stand in `features`.
    pub(in crate::controller) fn apply(&self, features: &mut HostedFeatures, offered: bool) {
        features.static_guards = self.validating == StaticState::InForce;
        features.static_mutating = self.mutating == StaticState::InForce;
        features.static_offered = offered;
    }

    /// A file wanted and not in force (yet).
    pub(in crate::controller) fn unsettled(&self) -> bool {
        [&self.validating, &self.mutating]
            .iter()
            .any(|s| matches!(s, StaticState::Waiting(_) | StaticState::Refused(_)))
    }

    /// A file the server cannot load (or one imitated).
    pub(in crate::controller) fn refused(&self) -> bool {
        [&self.validating, &self.mutating]
            .iter()
            .any(|s| matches!(s, StaticState::Refused(_)))
    }
}

/// With the feature gate off the API accepts the reserved names (with a warning), so a hosted
/// cluster's admin could create a policy that answers a static probe in its name, in the same
/// words (testdata/server-texts-v1.36.2.json). Loaded from files, no such object exists
/// through the API; one that does (made before the gate was turned on, say) is a forgery.
async fn forged(client: &Client, resource: &ApiResource) -> StaticState {
    match Api::<DynamicObject>::all_with(client.clone(), resource)
        .get_opt(&static_guards::probe_name())
        .await
    {
        Ok(None) => StaticState::InForce,
        Ok(Some(_)) => StaticState::Refused(format!(
            "a {} named {} exists through the API and answers the static probe in the files' name; the API-side guards stay until it is deleted",
            resource.kind,
            static_guards::probe_name()
        )),
        Err(e) => StaticState::Waiting(crate::human::KubeError(&e).to_string()),
    }
}

/// Does the server refuse API writes to names ending in `.static.k8s.io` (the feature gate is
/// on)? Asked by a dry-run create of such a policy, which stores nothing: refused as Invalid
/// with the words of kube-apiserver 1.36.2 when it does.
async fn static_names_reserved(client: &Client) -> Result<bool, String> {
    let check: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("hcp-fleet-agent-check{}", static_guards::SUFFIX)},
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["configmaps"],
            }]},
            "validations": [{"expression": "true"}],
        },
    }))
    .map_err(|e| e.to_string())?;
    let pp = kube::api::PostParams {
        dry_run: true,
        field_manager: Some(hcp_fleet_render::management::FIELD_MANAGER.into()),
    };
    match Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&pp, &check)
        .await
    {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(static_guards::SUFFIX) => {
            Ok(true)
        }
        Err(e) => Err(crate::human::KubeError(&e).to_string()),
    }
}

/// A probe of a file not answered: Waiting where the server can load files (the reserved
/// names are refused through the API), Refused where it cannot. `reserved` keeps the answer
/// for the other file of the same pass.
async fn unanswered(
    client: &Client,
    why: String,
    reserved: &mut Option<Result<bool, String>>,
) -> StaticState {
    if reserved.is_none() {
        *reserved = Some(static_names_reserved(client).await);
    }
    match reserved.as_ref() {
        Some(Ok(true)) => StaticState::Waiting(why),
        Some(Ok(false)) => StaticState::Refused(format!(
            "this hosted kube-apiserver does not load admission files: it accepts the names {} reserves for them through the API (feature gate ManifestBasedAdmissionControlConfig off, or a release before 1.36)",
            static_guards::SUFFIX
        )),
        Some(Err(e)) => StaticState::Waiting(format!("{why}; {e}")),
        None => StaticState::Waiting(why),
    }
}

/// Where one file stands: carrying nothing (`revision` `None`); refused where the server does
/// not serve its policy kind (`served`, `resource`); else its probe at `revision`, taken only
/// where no object of the probe's name and kind exists through the API (`forged`).
async fn file_state<'a, F>(
    client: &Client,
    revision: Option<&'a str>,
    served: bool,
    resource: ApiResource,
    probe: impl FnOnce(&'a str) -> F,
    reserved: &mut Option<Result<bool, String>>,
) -> StaticState
where
    F: std::future::Future<Output = Result<(), probe::ProbeFailure>>,
{
    let Some(rev) = revision else {
        return StaticState::Unwanted;
    };
    if !served {
        return StaticState::Refused(format!(
            "this hosted kube-apiserver does not serve {}",
            resource.kind
        ));
    }
    match probe(rev).await {
        Ok(()) => forged(client, &resource).await,
        Err(e) => unanswered(client, e.to_string(), reserved).await,
    }
}

/// Whether HyperShift's kube-apiserver Deployment in `ns` mounts the static guards'
/// ConfigMap (`hosted::static_guards::offered`): as the agent's watch of those Deployments
/// holds it (`Offered`), else, before the watch has listed them all once, listed by name,
/// which the agent's role allows in every namespace. None there (no HyperShift, or another
/// layout) offers nothing.
async fn offered(ctx: &crate::controller::context::Context, ns: &str) -> Result<bool, Failure> {
    if let Some(offered) = ctx.caches().kube_apiservers
        && let Some(known) = offered.known(ns).await
    {
        return Ok(known);
    }
    let lp = kube::api::ListParams::default()
        .fields(&format!("metadata.name={}", static_guards::KUBE_APISERVER));
    let listed = Api::<Deployment>::namespaced(ctx.client.clone(), ns)
        .list(&lp)
        .await
        .map_err(Failure::ReadKubeApiserver)?;
    Ok(listed.items.iter().any(static_guards::offered))
}

/// For how long after the controller starts a reconcile waits for the watch of the
/// kube-apiserver Deployments to list them all once before it lists its own: that takes
/// seconds at 3,000 HCPs, and a watch that cannot list (no RBAC for it) must not hold the
/// reconciles for longer.
const LISTING_PATIENCE: Duration = Duration::from_secs(10);

/// Which HCP namespaces' kube-apiserver Deployment mounts the static guards' ConfigMap, as the
/// agent's watch of those Deployments (`controller::kube_apiservers`) saw them: one answer per
/// namespace, nothing else of them. A reconcile reads it instead of listing the Deployment,
/// which at 3,000 HCPs was a third of a restarted agent's requests to the management cluster
/// (each under its request ceiling). Unknown until the watch has listed them all once.
#[derive(Debug)]
pub(crate) struct Offered {
    /// Per namespace: does its kube-apiserver mount the files.
    state: std::sync::RwLock<Relisted<String, bool>>,
    /// Told when the first listing is done.
    listed: tokio::sync::Notify,
    /// Until when a reconcile waits for the first listing (`known`).
    patience: tokio::time::Instant,
}

impl Offered {
    /// Held from the controller's start: reconciles wait for the first listing until
    /// `LISTING_PATIENCE` after it, and not at all once that has passed.
    pub(crate) fn new() -> Self {
        Self {
            state: Default::default(),
            listed: Default::default(),
            patience: tokio::time::Instant::now() + LISTING_PATIENCE,
        }
    }

    /// Whether the files are offered in `ns`; `None` before the first complete listing.
    pub(crate) fn get(&self, ns: &str) -> Option<bool> {
        let s = self
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.held()
            .map(|by_ns| by_ns.get(ns).copied().unwrap_or(false))
    }

    /// Whether the files are offered in `ns`, waiting for the first complete listing while the
    /// controller is young (`LISTING_PATIENCE`): a starting agent's first reconciles would
    /// otherwise each list a Deployment the watch is about to bring. `None` if it has not
    /// come by then; a watch that cannot list delays no reconcile after that.
    pub(crate) async fn known(&self, ns: &str) -> Option<bool> {
        let listed = self.listed.notified();
        if let Some(known) = self.get(ns) {
            return Some(known);
        }
        let _ = tokio::time::timeout_at(self.patience, listed).await;
        self.get(ns)
    }

    /// Takes one event of the watch; the namespaces whose answer it changed (a listing's
    /// answer where it differs from what was held before it: none at the first).
    pub(crate) fn apply(&self, event: kube::runtime::watcher::Event<Deployment>) -> Vec<String> {
        use kube::ResourceExt;
        let mut s = self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let took = s.apply(&event, |d| {
            (d.namespace().unwrap_or_default(), static_guards::offered(d))
        });
        let now = |ns: &str| s.held().and_then(|h| h.get(ns)).copied().unwrap_or(false);
        match took {
            Took::Nothing => Vec::new(),
            Took::Listed(before) => {
                self.listed.notify_waiters();
                // The first listing changes nothing: nothing was known before it.
                let Some(before) = before else {
                    return Vec::new();
                };
                let all: std::collections::BTreeSet<&String> = before
                    .keys()
                    .chain(s.held().into_iter().flat_map(|h| h.keys()))
                    .collect();
                all.into_iter()
                    .filter(|ns| before.get(*ns).copied().unwrap_or(false) != now(ns))
                    .cloned()
                    .collect()
            }
            Took::Put(ns, was) | Took::Removed(ns, was) => {
                if was.unwrap_or(false) == now(&ns) {
                    Vec::new()
                } else {
                    vec![ns]
                }
            }
        }
    }
}

/// The static guards of one HCP (`hosted::static_guards`): the ConfigMap the hosted
/// kube-apiserver loads them from, written so that no guard is ever without a path. A write
/// that only adds guards (or changes nothing) goes first; one that takes a guard out of the
/// files waits until the API-side path of every guard has been written and proven in this
/// pass (`ensure_after`). What the files hold is read back from the live ConfigMap, so this is
/// stateless like the rest of the reconcile.
pub(in crate::controller) struct Statics {
    pub(crate) wanted: StaticGuards,
    /// HyperShift's kube-apiserver mounts the ConfigMap: the files carry the guards on `auto`.
    pub(crate) offered: bool,
    /// The ConfigMap as rendered (`None`: no guard is static).
    config_map: Option<ConfigMap>,
    /// Whether `ensure_before` wrote it, where it put it in place (`None`: left for
    /// `ensure_after`).
    written_before: Option<bool>,
    /// The drift `ensure_before` repaired (someone else's edit or deletion).
    pub(crate) note: Option<String>,
}

impl Statics {
    /// Phase 3, beside the admission service and not gated on it or on the hosted cluster:
    /// the static guards are what keeps guarding while the admission service is down, so a
    /// deleted or edited ConfigMap is put back whatever the later phases find. Only a write
    /// that adds guards (or changes nothing of which guards) goes here.
    ///
    /// `registry`: the hosted cluster's internal registry as last read, which the pod image
    /// spec mutation carries in its CEL (`None`: not read; that mutation is then in no file).
    pub(crate) async fn ensure_before(
        s: &Scope<'_>,
        registry: Option<&InternalRegistry>,
    ) -> Result<Self, Failure> {
        let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
        let settings = hcp_fleet_guards::Settings {
            internal_registry: registry.cloned(),
            ..hcp_fleet_guards::Settings::from(cfg)
        };
        let offered = offered(ctx, ns).await?;
        let wanted =
            static_guards::render(cfg, &settings, ns, offered).map_err(Failure::RenderWebhooks)?;
        let config_map = if wanted.is_empty() {
            None
        } else {
            Some(
                static_guards::config_map(cfg, ns, &wanted, super::admission_service::owner(s.hcp))
                    .map_err(Failure::RenderWebhooks)?,
            )
        };
        let mut me = Self {
            wanted,
            offered,
            config_map,
            written_before: None,
            note: None,
        };
        let Some(cm) = &me.config_map else {
            return Ok(me);
        };
        let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns);
        let live = api
            .get_opt(static_guards::CONFIG_MAP)
            .await
            .map_err(|source| Failure::ApplyAdmission {
                kind: "ConfigMap",
                name: static_guards::CONFIG_MAP.into(),
                source,
            })?;
        let adds_only = live.as_ref().is_none_or(|l| {
            static_guards::guards_in(l).is_some_and(|held| held.is_subset(&me.wanted.guards()))
        });
        if adds_only {
            let (written, note) = me.put(s, cm).await?;
            me.written_before = Some(written);
            me.note = note;
        }
        Ok(me)
    }

    /// Whether each file of the static guards, at its wanted revision, is in force, and if
    /// not, why.
    pub(crate) async fn in_force(
        &self,
        hosted: &HostedClient,
        features: HostedFeatures,
        timeout: Duration,
        proof: &Proof,
    ) -> StaticForce {
        let client = hosted.client();
        let c = &client;
        // Asked once a pass, and only where a probe was not answered.
        let mut reserved = None;
        let validating = file_state(
            &client,
            self.wanted.revision.as_deref(),
            features.admission_policies,
            ApiResource::erase::<ValidatingAdmissionPolicy>(&()),
            |rev| async move {
                probe::probe_path(c, timeout, Engine::Static, rev, proof)
                    .await
                    .map(|_| ())
            },
            &mut reserved,
        )
        .await;
        let mutating = file_state(
            &client,
            self.wanted.mutating_revision.as_deref(),
            features.mutating_policies,
            admission_policies::mutating_resource(),
            |rev| probe::probe_static_mutating(&client, timeout, rev),
            &mut reserved,
        )
        .await;
        StaticForce {
            validating,
            mutating,
        }
    }

    /// The ConfigMap written where `ensure_before` left it, or deleted where no guard is
    /// static any more. Returns whether it was written.
    pub(crate) async fn ensure_after(&self, s: &Scope<'_>) -> Result<bool, Failure> {
        let (ctx, ns) = (s.ctx, s.ns);
        let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns);
        match &self.config_map {
            Some(_) if let Some(written) = self.written_before => Ok(written),
            Some(cm) => self.put(s, cm).await.map(|(written, _)| written),
            // Known to the watch to be absent (the usual case: no guard static anywhere), no
            // request; a ConfigMap it has not delivered yet triggers another reconcile.
            None if absent_by_watch(ctx, ns) => Ok(false),
            None => {
                super::admission_service::remove(
                    ctx,
                    ns,
                    &api,
                    "ConfigMap",
                    static_guards::CONFIG_MAP,
                )
                .await?;
                Ok(false)
            }
        }
    }

    /// Writes the ConfigMap where it differs; whether it did, and the drift it repaired.
    async fn put(&self, s: &Scope<'_>, cm: &ConfigMap) -> Result<(bool, Option<String>), Failure> {
        let (ctx, ns) = (s.ctx, s.ns);
        let (_, note, wrote) = super::admission_service::put_wrote(
            ctx,
            ns,
            super::admission_service::Target {
                api: Api::<ConfigMap>::namespaced(ctx.client.clone(), ns),
                kind: "ConfigMap",
                name: static_guards::CONFIG_MAP,
                store: None,
            },
            cm,
        )
        .await?;
        if let Some(n) = &note {
            ctx.metrics
                .management_drift
                .get_or_create(&crate::metrics::DriftLabels::new(
                    ns,
                    s.cluster,
                    "ConfigMap",
                ))
                .inc();
            tracing::warn!(namespace = %ns, note = %n, "static guards' ConfigMap repaired");
        }
        Ok((wrote, note))
    }
}

#[cfg(test)]
mod offered_tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, PodSpec, PodTemplateSpec, Volume};
    use kube::runtime::watcher::Event;

    fn kube_apiserver(ns: &str, mounts: bool) -> Deployment {
        let volumes = mounts.then(|| {
            vec![Volume {
                name: "any-name".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: static_guards::CONFIG_MAP.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]
        });
        Deployment {
            metadata: kube::api::ObjectMeta {
                name: Some(static_guards::KUBE_APISERVER.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        volumes,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Unknown until the first listing is done, then each namespace's answer; a change is
    /// told for its namespace only, a relist tells what it changed and drops what is gone.
    #[test]
    fn the_watch_keeps_one_answer_per_namespace_and_tells_what_changed() {
        let o = Offered::new();
        assert_eq!(o.apply(Event::Init), Vec::<String>::new());
        assert!(
            o.apply(Event::InitApply(kube_apiserver("a", true)))
                .is_empty()
        );
        assert!(
            o.apply(Event::InitApply(kube_apiserver("b", false)))
                .is_empty()
        );
        assert_eq!(o.get("a"), None, "not listed yet: unknown");
        assert!(
            o.apply(Event::InitDone).is_empty(),
            "the first listing changes nothing"
        );
        assert_eq!(
            (o.get("a"), o.get("b"), o.get("c")),
            (Some(true), Some(false), Some(false))
        );

        assert!(
            o.apply(Event::Apply(kube_apiserver("a", true))).is_empty(),
            "no change"
        );
        assert_eq!(o.apply(Event::Apply(kube_apiserver("b", true))), ["b"]);
        assert_eq!(o.apply(Event::Delete(kube_apiserver("a", true))), ["a"]);
        assert_eq!(o.get("a"), Some(false));
        assert!(
            o.apply(Event::Delete(kube_apiserver("c", false)))
                .is_empty()
        );

        // A relist: b is gone while the watch was down, c appears offering.
        o.apply(Event::Init);
        assert_eq!(
            o.get("b"),
            Some(true),
            "the old answers stand until the listing is done"
        );
        o.apply(Event::InitApply(kube_apiserver("c", true)));
        assert_eq!(o.apply(Event::InitDone), ["b", "c"]);
        assert_eq!((o.get("b"), o.get("c")), (Some(false), Some(true)));
    }
}
