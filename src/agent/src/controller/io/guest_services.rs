//! Which Services of each HCP namespace could make HyperShift delete guest webhooks
//! (`management::names_condemning`): the names of those without HyperShift's allow label,
//! kept by one metadata-only watch of every Service. A reconcile used to list its namespace's
//! Services for this, one request per HCP on every install (a thousand at a cold start).
//! Only names are kept, a few bytes each, never the objects.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

#[cfg(test)]
use hcp_fleet_render::management::ALLOW_GUEST_WEBHOOKS;
use hcp_fleet_render::management::allows_guest_webhooks;

/// How long a reconcile waits for the first listing before it lists its namespace itself.
const READY_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Index {
    /// namespace → names of the Services there without the allow label.
    unlabelled: HashMap<String, HashSet<String>>,
    /// The listing being built during a (re)list, swapped in when it completes.
    building: Option<HashMap<String, HashSet<String>>>,
}

fn put(map: &mut HashMap<String, HashSet<String>>, svc: &PartialObjectMeta<Service>) {
    let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) else {
        return;
    };
    if allows_guest_webhooks(&svc.metadata) {
        remove(map, svc);
    } else {
        map.entry(ns.clone()).or_default().insert(name.clone());
    }
}

fn remove(map: &mut HashMap<String, HashSet<String>>, svc: &PartialObjectMeta<Service>) {
    let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) else {
        return;
    };
    if let Some(names) = map.get_mut(ns) {
        names.remove(name);
        if names.is_empty() {
            map.remove(ns);
        }
    }
}

/// The index, shared by the watch that fills it and the reconciles that read it.
#[derive(Clone)]
pub(crate) struct GuestServices {
    index: Arc<RwLock<Index>>,
    ready: watch::Receiver<bool>,
    /// A wait for the first listing has timed out once (the watch cannot list, say): later
    /// reconciles look at once instead of each waiting `READY_WAIT`.
    waited: Arc<std::sync::atomic::AtomicBool>,
}

impl GuestServices {
    /// The index and the watch that keeps it (to be polled to the end; it never ends).
    pub(crate) fn watch(client: Client) -> (Self, impl std::future::Future<Output = ()> + Send) {
        let index = Arc::new(RwLock::new(Index::default()));
        let (tx, ready) = watch::channel(false);
        let filler = {
            let index = index.clone();
            let api = Api::<PartialObjectMeta<Service>>::all(client);
            async move {
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .for_each(|ev| {
                        let mut i = index.write().unwrap_or_else(PoisonError::into_inner);
                        match ev {
                            Ok(watcher::Event::Init) => i.building = Some(HashMap::new()),
                            Ok(watcher::Event::InitApply(s)) => {
                                if let Some(b) = i.building.as_mut() {
                                    put(b, &s);
                                }
                            }
                            Ok(watcher::Event::InitDone) => {
                                if let Some(b) = i.building.take() {
                                    i.unlabelled = b;
                                }
                                let _ = tx.send(true);
                            }
                            Ok(watcher::Event::Apply(s)) => put(&mut i.unlabelled, &s),
                            Ok(watcher::Event::Delete(s)) => remove(&mut i.unlabelled, &s),
                            Err(e) => tracing::warn!(error = %crate::human::WatchError(&e), "watching Services"),
                        }
                        futures::future::ready(())
                    })
                    .await;
            }
        };
        let waited = Arc::default();
        (
            Self {
                index,
                ready,
                waited,
            },
            filler,
        )
    }

    /// The names of the unlabelled Services in `ns`, once the first listing is complete
    /// (the first caller waits for it a while); `None` if it is not (the caller lists).
    pub(crate) async fn unlabelled(&self, ns: &str) -> Option<Vec<String>> {
        use std::sync::atomic::Ordering;
        let mut ready = self.ready.clone();
        if self.waited.load(Ordering::Relaxed) {
            if !*ready.borrow() {
                return None;
            }
        } else {
            let listed = tokio::time::timeout(READY_WAIT, ready.wait_for(|r| *r)).await;
            if !matches!(listed, Ok(Ok(_))) {
                self.waited.store(true, Ordering::Relaxed);
                return None;
            }
        }
        let i = self.index.read().unwrap_or_else(PoisonError::into_inner);
        Some(
            i.unlabelled
                .get(ns)
                .map(|n| n.iter().cloned().collect())
                .unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, allowed: bool) -> PartialObjectMeta<Service> {
        let mut m = PartialObjectMeta::<Service>::default();
        m.metadata.namespace = Some(ns.into());
        m.metadata.name = Some(name.into());
        if allowed {
            m.metadata.labels = Some([(ALLOW_GUEST_WEBHOOKS.to_string(), "true".into())].into());
        }
        m
    }

    /// Once listed, the names of a namespace; before, a caller after a timed-out wait is told
    /// at once that there is no listing (it lists itself) rather than waiting again.
    #[tokio::test]
    async fn names_once_listed_and_no_second_wait_when_the_watch_cannot_list() {
        let (tx, ready) = watch::channel(false);
        let g = GuestServices {
            index: Default::default(),
            ready,
            waited: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        };
        let t = std::time::Instant::now();
        assert_eq!(g.unlabelled("a").await, None);
        assert!(t.elapsed() < READY_WAIT / 10, "no second wait");
        if let Ok(mut i) = g.index.write() {
            put(&mut i.unlabelled, &svc("a", "hcp", false));
        }
        let _ = tx.send(true);
        assert_eq!(g.unlabelled("a").await, Some(vec!["hcp".to_string()]));
        assert_eq!(g.unlabelled("b").await, Some(vec![]));
    }

    #[test]
    fn only_unlabelled_names_are_kept_and_a_label_added_later_removes_one() {
        let mut map = HashMap::new();
        put(&mut map, &svc("a", "kube-apiserver", false));
        put(&mut map, &svc("a", "ignition", true));
        put(&mut map, &svc("b", "hcp", false));
        assert_eq!(map["a"], HashSet::from(["kube-apiserver".to_string()]));
        put(&mut map, &svc("b", "hcp", true));
        assert!(
            !map.contains_key("b"),
            "labelled since: no longer a candidate"
        );
        remove(&mut map, &svc("a", "kube-apiserver", false));
        assert!(map.is_empty());
    }
}
