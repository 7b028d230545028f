//! A watch's store that holds each object as its JSON text, for the agent's own management
//! objects (each HCP's Deployment, ServiceAccount, Service, NetworkPolicy and
//! PodDisruptionBudget). A typed object in memory is several times its text: every optional
//! field of a Deployment's pod spec is a slot whether set or not, every string its own
//! allocation. Held typed, those five were about 30 KiB per HCP at a thousand (`make bench`,
//! the scale benchmark, heaptrack); as text about a fifth of that. An object is read back (a
//! parse of a few KiB) only when a reconcile reads it, which is rare next to how long it is
//! held.
//!
//! It follows a watch as kube's reflector store does: a relist is buffered until it is whole
//! and then replaces what was held, and the store counts as filled from the first whole list.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, PoisonError, RwLock};

use kube::Resource;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// One object as held: its JSON text, or `None` where it could not be written as JSON (a read
/// then goes to the server).
type Held = Option<Box<str>>;

#[derive(Default)]
struct Objects {
    /// By `namespace/name`.
    held: HashMap<Box<str>, Held>,
    /// A relist in progress (`watcher::Event::Init` until `InitDone`).
    relisting: Option<HashMap<Box<str>, Held>>,
    filled: bool,
}

/// The objects of one watch, as text. Clones share the objects.
pub(crate) struct TextStore<K> {
    objects: Arc<RwLock<Objects>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for TextStore<K> {
    fn clone(&self) -> Self {
        TextStore {
            objects: self.objects.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Default for TextStore<K> {
    fn default() -> Self {
        TextStore {
            objects: Arc::default(),
            kind: PhantomData,
        }
    }
}

fn key(ns: &str, name: &str) -> Box<str> {
    format!("{ns}/{name}").into_boxed_str()
}

impl<K: Resource + Serialize + DeserializeOwned> TextStore<K> {
    /// Takes in one event of the watch that fills this store.
    pub(crate) fn apply(&self, event: &watcher::Event<K>) {
        let mut objects = self.objects.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(o) => {
                if let Some((k, held)) = hold(o) {
                    objects.held.insert(k, held);
                }
            }
            watcher::Event::Delete(o) => {
                if let Some(k) = key_of(o) {
                    objects.held.remove(&k);
                }
            }
            watcher::Event::Init => objects.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                if let (Some(buffer), Some((k, held))) = (objects.relisting.as_mut(), hold(o)) {
                    buffer.insert(k, held);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = objects.relisting.take() {
                    objects.held = listed;
                }
                objects.filled = true;
            }
        }
    }

    /// Whether a whole list has been taken in (before that, absence means nothing).
    pub(crate) fn filled(&self) -> bool {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .filled
    }

    /// The object `name` in `ns`: `None` where the store holds none, an error where what it
    /// holds does not read back as a `K`.
    pub(crate) fn get(&self, ns: &str, name: &str) -> Option<Result<K, serde_json::Error>> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        let held = objects.held.get(&key(ns, name))?;
        Some(match held {
            Some(json) => serde_json::from_str(json),
            None => Err(serde::de::Error::custom(format!(
                "{ns}/{name} could not be held as JSON"
            ))),
        })
    }

    /// How many objects it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .held
            .len()
    }
}

fn key_of<K: Resource>(o: &K) -> Option<Box<str>> {
    let meta = o.meta();
    Some(key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref()?,
    ))
}

fn hold<K: Resource + Serialize>(o: &K) -> Option<(Box<str>, Held)> {
    let held = serde_json::to_string(o).ok().map(String::into_boxed_str);
    Some((key_of(o)?, held))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::ObjectMeta;

    fn deployment(ns: &str, name: &str, rv: &str, replicas: i32) -> Deployment {
        let mut d = Deployment {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        d.spec.get_or_insert_with(Default::default).replicas = Some(replicas);
        d
    }

    #[test]
    fn it_follows_a_watch_as_the_reflector_does() {
        let store = TextStore::<Deployment>::default();
        assert!(!store.filled(), "nothing listed yet");
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(deployment("a", "d", "1", 2)));
        assert!(!store.filled());
        assert!(
            store.get("a", "d").is_none(),
            "a list is whole before it counts"
        );
        store.apply(&watcher::Event::InitDone);
        assert!(store.filled());
        let got = store.get("a", "d").expect("held").expect("reads back");
        assert_eq!(got, deployment("a", "d", "1", 2), "the object as it came");
        store.apply(&watcher::Event::Apply(deployment("b", "d", "2", 3)));
        store.apply(&watcher::Event::Apply(deployment("a", "d", "3", 4)));
        let got = store.get("a", "d").expect("held").expect("reads back");
        assert_eq!(got.metadata.resource_version.as_deref(), Some("3"));
        assert_eq!(got.spec.and_then(|s| s.replicas), Some(4));
        store.apply(&watcher::Event::Delete(deployment("b", "d", "2", 3)));
        assert!(store.get("b", "d").is_none());
        // A relist replaces what was held once it is whole; until then the old view stands.
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(deployment("c", "d", "5", 1)));
        assert!(store.get("a", "d").is_some());
        store.apply(&watcher::Event::InitDone);
        assert!(
            store.get("a", "d").is_none(),
            "gone while the watch was down"
        );
        assert!(store.get("c", "d").is_some());
        assert_eq!(store.len(), 1);
        // Clones are views of one store.
        let view = store.clone();
        store.apply(&watcher::Event::Apply(deployment("e", "d", "6", 1)));
        assert!(view.get("e", "d").is_some());
    }

    #[test]
    fn held_as_text_it_is_smaller_than_typed() {
        // A Deployment like the admission service's, as the text held and as the typed
        // value's own size (its heap parts come on top of that).
        let mut d = deployment("clusters-a", "hcp-fleet-admission", "1", 2);
        let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "admission", "image": "quay.io/hcp-fleet/hcp-fleet-agent:0.1.0",
                "args": ["webhook", "--port", "8443"],
                "ports": [{"containerPort": 8443, "name": "https"}]}]
        }))
        .expect("pod spec");
        if let Some(s) = d.spec.as_mut() {
            s.template.spec = Some(spec);
        }
        let text = serde_json::to_string(&d).expect("json").len();
        let typed = std::mem::size_of::<Deployment>()
            + std::mem::size_of::<k8s_openapi::api::core::v1::Container>();
        assert!(
            text < typed,
            "text {text} bytes, typed {typed} bytes before its heap"
        );
    }
}
