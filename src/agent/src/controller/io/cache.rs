//! Reads of the agent's own management-side objects from the watches it already runs (the
//! Controller's triggers, each kept in a reflector store), instead of a GET per object per
//! reconcile: at a thousand HCPs those reads were most of what the agent asked the
//! management kube-apiserver (`make bench`, the scale benchmark).
//!
//! A store lags the server by one watch event. So the store is believed only where this
//! agent's own last look at the object agrees with it (the same resourceVersion, or both say
//! absent), or where this agent has not looked at the object yet (the store is then the most
//! recent word there is); otherwise, as right after the agent's own write, the object is read
//! from the server. A write is never decided on a store that is behind the agent's own.

use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::text_store::TextStore;

/// The stores the controller's watches fill (`controller::run`). `None` where the kind is
/// not watched (no PodDisruptionBudget API served) or before the controller runs. The
/// admission services' own objects are held as text (`text_store.rs`); the Secrets typed
/// (their data is bytes, which as JSON text would be base64, a third larger).
#[derive(Clone, Default)]
pub(crate) struct Caches {
    pub(crate) ca_secrets: Option<Store<Secret>>,
    pub(crate) tls_secrets: Option<Store<Secret>>,
    pub(crate) kubeconfig_secrets: Option<Store<Secret>>,
    pub(crate) service_accounts: Option<TextStore<ServiceAccount>>,
    pub(crate) services: Option<TextStore<Service>>,
    pub(crate) network_policies: Option<TextStore<NetworkPolicy>>,
    pub(crate) deployments: Option<TextStore<Deployment>>,
    pub(crate) pdbs: Option<TextStore<DynamicObject>>,
    /// The health records (where their CRD is installed): read before each report.
    pub(crate) health: Option<Store<hcp_fleet_model::crd::AdmissionHealth>>,
    /// The clusters those records claim, by UID (`claims.rs`), filled with `health`.
    pub(crate) claims: Option<Arc<super::claims::Claims>>,
    /// Which Services could make HyperShift delete guest webhooks (`guest_services.rs`).
    pub(crate) guest_services: Option<super::guest_services::GuestServices>,
    /// The HostedAdmissionOverrides (where their CRD is installed).
    pub(crate) overrides:
        Option<Store<hcp_fleet_model::crd::admission_rollout::HostedAdmissionOverride>>,
    /// Which HCP namespaces hold the static guards' ConfigMap (`hosted::static_guards`),
    /// metadata only: an HCP without static guards needs no request to know it has none to
    /// remove, and the files of a thousand HCPs are not held.
    pub(crate) static_config_maps:
        Option<Store<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>>>,
    /// Which HCP namespaces hold the internal registry's ConfigMap (the admission replicas'),
    /// metadata only: retiring an admission service needs no request where there is none.
    pub(crate) registry_config_maps:
        Option<Store<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>>>,
    /// Whether each HCP's kube-apiserver mounts the static guards' files.
    pub(crate) kube_apiservers: Option<Arc<crate::controller::phases::static_guards::Offered>>,
    /// The admission services' ready replicas (`endpoints::ReadyEndpoints`).
    pub(crate) ready_endpoints: Option<Arc<crate::controller::endpoints::ReadyEndpoints>>,
}

/// Whether a metadata-only watch of ConfigMaps by name (`store`) has listed them all once and
/// holds none named `name` in `ns`: then there is nothing there to remove, and no request
/// needs to ask.
pub(crate) fn config_map_absent(
    store: Option<&Store<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>>>,
    name: &str,
    ns: &str,
) -> bool {
    store.is_some_and(|store| {
        store.wait_until_ready().now_or_never().is_some()
            && store.get(&ObjectRef::new(name).within(ns)).is_none()
    })
}

/// A little of each object a watch has seen (`V`, under its key `K`), with each (re)listing
/// swapped in whole when it completes, so an object deleted while the watch was down is not
/// kept; unknown until the first listing is done. What `static_guards::Offered` and
/// `endpoints::ReadyEndpoints` keep of HyperShift's Deployments and of EndpointSlices.
#[derive(Debug)]
pub(crate) struct Relisted<K, V> {
    listed: bool,
    held: std::collections::BTreeMap<K, V>,
    /// A listing under way (a watch that starts, or starts again).
    next: Option<std::collections::BTreeMap<K, V>>,
}

impl<K, V> Default for Relisted<K, V> {
    fn default() -> Self {
        Self {
            listed: false,
            held: Default::default(),
            next: None,
        }
    }
}

/// What one event did to a `Relisted`.
#[derive(Debug, PartialEq)]
pub(crate) enum Took<K, V> {
    /// Nothing held changed (a listing under way).
    Nothing,
    /// A listing completed: what was held before it (`None`: the first listing).
    Listed(Option<std::collections::BTreeMap<K, V>>),
    /// `K` now holds a new value; its old one.
    Put(K, Option<V>),
    /// `K` went; what it held.
    Removed(K, Option<V>),
}

impl<K: Ord + Clone, V> Relisted<K, V> {
    /// What is held, once the first listing is done.
    pub(crate) fn held(&self) -> Option<&std::collections::BTreeMap<K, V>> {
        self.listed.then_some(&self.held)
    }

    /// Takes one event of the watch, keeping `of` of each object.
    pub(crate) fn apply<O>(
        &mut self,
        event: &kube::runtime::watcher::Event<O>,
        of: impl Fn(&O) -> (K, V),
    ) -> Took<K, V> {
        use kube::runtime::watcher::Event;
        match event {
            Event::Init => {
                self.next = Some(Default::default());
                Took::Nothing
            }
            Event::InitApply(o) => {
                let (k, v) = of(o);
                self.next.get_or_insert_with(Default::default).insert(k, v);
                Took::Nothing
            }
            Event::InitDone => {
                let next = self.next.take().unwrap_or_default();
                let before = std::mem::replace(&mut self.held, next);
                let first = !std::mem::replace(&mut self.listed, true);
                Took::Listed((!first).then_some(before))
            }
            Event::Apply(o) => {
                let (k, v) = of(o);
                let was = self.held.insert(k.clone(), v);
                Took::Put(k, was)
            }
            Event::Delete(o) => {
                let (k, _) = of(o);
                let was = self.held.remove(&k);
                Took::Removed(k, was)
            }
        }
    }
}

/// What this agent last knew of one object, from its own reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// At this resourceVersion.
    At(String),
    Absent,
    /// The watch has delivered what the agent last knew (a watch delivers every change in
    /// order): whatever the store holds now is at least as new, such as the status a
    /// Deployment's controller wrote after the agent's own apply.
    Delivered,
}

impl Seen {
    pub(crate) fn of<K: Resource>(obj: Option<&K>) -> Self {
        match obj.and_then(|o| o.meta().resource_version.clone()) {
            Some(rv) => Seen::At(rv),
            None => Seen::Absent,
        }
    }
}

/// Where the agent keeps what it last knew of each HCP's objects, by HCP namespace and object
/// key (the controller's context, in each HCP's state). A trait, so this module reads the
/// context without depending on it: the context holds the stores this module defines.
pub(crate) trait SeenLog {
    fn last_seen(&self, ns: &str, key: &str) -> Option<Seen>;
    fn record_seen(&self, ns: &str, key: String, seen: Seen);
    /// A watch event for `key` at `rv`: where that is what the agent last knew of the object
    /// (its own write, or a read from the server), the store has caught up with the agent, and
    /// `key` is `Delivered`. Nothing for an HCP the agent holds no state for (a watch event
    /// must not create one).
    fn mark_delivered(&self, ns: &str, key: &str, rv: &str);
}

/// What the agent last knew of each management-side object of one HCP it reads (keyed as
/// `admission_service`'s prints: `Kind/name`): whether its watch store may stand in for a read.
/// Part of the HCP's state (`HcpState::seen`), written only here.
#[derive(Debug, Default)]
pub(crate) struct SeenMap(std::collections::HashMap<String, Seen>);

impl SeenMap {
    pub(crate) fn get(&self, key: &str) -> Option<Seen> {
        self.0.get(key).cloned()
    }

    pub(crate) fn record(&mut self, key: String, seen: Seen) {
        self.0.insert(key, seen);
    }

    /// `SeenLog::mark_delivered` for one HCP.
    pub(crate) fn mark_delivered(&mut self, key: &str, rv: &str) {
        if let Some(seen) = self.0.get_mut(key)
            && matches!(seen, Seen::At(at) if at == rv)
        {
            *seen = Seen::Delivered;
        }
    }
}

/// Whether a store's view may stand for the server's, given what the agent last knew.
pub(crate) fn trust_store(last: Option<&Seen>, stored_rv: Option<Option<&str>>) -> bool {
    match (last, stored_rv) {
        (None | Some(Seen::Delivered), _) => true,
        (Some(Seen::Absent), None) => true,
        (Some(Seen::At(rv)), Some(Some(s))) => rv == s,
        _ => false,
    }
}

/// One object's key in the HCP's state: its URL, so that the same kind in two API groups (or
/// versions) are two objects.
pub(crate) fn object_key<K: Resource>(api: &Api<K>, name: &str) -> String {
    format!("{}/{name}", api.resource_url())
}

/// A watch's store as `read` asks it: kube's reflector store, or one that holds text.
pub(crate) trait Cached<K>: Send + Sync {
    /// Whether the watch has listed everything once (before that, absence means nothing).
    fn filled(&self) -> bool;
    /// `name` in `ns` as held: `None` where nothing is held, an error where what is held
    /// cannot be read back (the server is asked instead).
    fn get(&self, ns: &str, name: &str) -> Option<Result<K, serde_json::Error>>;
}

impl<K> Cached<K> for Store<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn filled(&self) -> bool {
        self.wait_until_ready().now_or_never().is_some()
    }

    fn get(&self, ns: &str, name: &str) -> Option<Result<K, serde_json::Error>> {
        Store::get(self, &ObjectRef::new(name).within(ns)).map(|o| Ok(Arc::unwrap_or_clone(o)))
    }
}

impl<K> Cached<K> for TextStore<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    fn filled(&self) -> bool {
        TextStore::filled(self)
    }

    fn get(&self, ns: &str, name: &str) -> Option<Result<K, serde_json::Error>> {
        TextStore::get(self, ns, name)
    }
}

/// The live `name` in `ns`: from `store` where it may be believed (see the module), else from
/// the server. Either way the answer is what the agent knows of it from now on.
pub(crate) async fn read<K, L, S>(
    log: &L,
    ns: &str,
    api: &Api<K>,
    store: Option<&S>,
    name: &str,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
    L: SeenLog + ?Sized,
    S: Cached<K> + ?Sized,
{
    let key = object_key(api, name);
    if let Some(store) = store.filter(|s| s.filled()) {
        match store.get(ns, name) {
            // Held but unreadable: the server has it.
            Some(Err(e)) => {
                tracing::warn!(namespace = ns, name, error = %e, "a watch's store could not give back an object; reading it from the server");
            }
            cached => {
                let cached = cached.and_then(Result::ok);
                let stored_rv = cached
                    .as_ref()
                    .map(|o| o.meta().resource_version.as_deref());
                let last = log.last_seen(ns, &key);
                if trust_store(last.as_ref(), stored_rv) {
                    log.record_seen(ns, key, Seen::Delivered);
                    return Ok(cached);
                }
            }
        }
    }
    let obj = api.get_opt(name).await?;
    log.record_seen(ns, key, Seen::of(obj.as_ref()));
    Ok(obj)
}

/// Records what the agent's own write left: the object as the server returned it.
pub(crate) fn wrote<K: Resource, L: SeenLog + ?Sized>(
    log: &L,
    ns: &str,
    api: &Api<K>,
    name: &str,
    obj: Option<&K>,
) {
    log.record_seen(ns, object_key(api, name), Seen::of(obj));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_is_believed_only_where_it_agrees_with_the_agents_last_look() {
        let at = |rv: &str| Seen::At(rv.into());
        // Never looked: the store is the latest word (present or absent).
        assert!(trust_store(None, Some(Some("5"))));
        assert!(trust_store(None, None));
        // Same version, or both absent.
        assert!(trust_store(Some(&at("5")), Some(Some("5"))));
        assert!(trust_store(Some(&Seen::Absent), None));
        // Once the watch has delivered what the agent knew, the store is at least as new.
        assert!(trust_store(Some(&Seen::Delivered), Some(Some("9"))));
        assert!(trust_store(Some(&Seen::Delivered), None));
        // Behind the agent's own write, or changed or deleted by someone else since: ask.
        assert!(!trust_store(Some(&at("6")), Some(Some("5"))));
        assert!(!trust_store(Some(&at("5")), None));
        assert!(!trust_store(Some(&Seen::Absent), Some(Some("7"))));
        assert!(!trust_store(Some(&at("5")), Some(None)));
    }
}
