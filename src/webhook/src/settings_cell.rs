//! The service's settings as every review reads them: one value, replaced whole when the
//! internal registry changes (`internal_registry::watch`), read by each worker thread from its
//! own copy. Under load both threads read the settings for every review; a shared lock and a
//! shared `Arc` were two atomics bounced between the cores per review, half a tenth of a
//! microsecond of the service's CPU per review (`make bench`, perf).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use hcp_fleet_guards::Settings;

/// The settings, and how many times they were replaced.
pub(crate) struct SettingsCell {
    /// Which cell this is: a thread serves the reviews of every service in its process (the
    /// tests run many), so its copy says whose it is.
    id: u64,
    value: RwLock<Arc<Settings>>,
    /// Bumped after each replacement, under the write lock.
    generation: AtomicU64,
}

/// A thread's copy: the cell's id, the generation it was read at, and the settings (an `Arc`
/// of the thread's own, so cloning it touches no line another core writes).
type Copy = (u64, u64, Arc<Settings>);

thread_local! {
    static COPY: RefCell<Option<Copy>> = const { RefCell::new(None) };
}

impl SettingsCell {
    pub(crate) fn new(settings: Settings) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            value: RwLock::new(Arc::new(settings)),
            generation: AtomicU64::new(0),
        }
    }

    /// The settings as they stand: the thread's copy while the generation it was read at is
    /// the current one, else a fresh copy.
    pub(crate) fn current(&self) -> Arc<Settings> {
        // Read before the value: a replacement in between is then read with the older
        // generation, and read once more at the next call, never missed.
        let generation = self.generation.load(Ordering::Acquire);
        COPY.with_borrow_mut(|copy| match copy {
            Some((id, g, s)) if *id == self.id && *g == generation => Arc::clone(s),
            _ => {
                let fresh = Arc::new(Settings::clone(&self.shared()));
                *copy = Some((self.id, generation, Arc::clone(&fresh)));
                fresh
            }
        })
    }

    /// The shared value. A writer cannot panic while it holds the lock (it only swaps an
    /// `Arc`), so a poisoned lock still holds a whole value.
    fn shared(&self) -> Arc<Settings> {
        Arc::clone(&self.value.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the settings with `change` of them, if it gives any: whether it did.
    pub(crate) fn replace(&self, change: impl FnOnce(&Settings) -> Option<Settings>) -> bool {
        let mut value = self.value.write().unwrap_or_else(PoisonError::into_inner);
        let Some(next) = change(&value) else {
            return false;
        };
        *value = Arc::new(next);
        self.generation.fetch_add(1, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_guards::pod_image_spec::InternalRegistry;
    use hcp_fleet_render::config::AgentConfig;

    fn registry(state: &str) -> Option<InternalRegistry> {
        Some(InternalRegistry {
            management_state: Some(state.into()),
            ..Default::default()
        })
    }

    #[test]
    fn a_thread_reads_each_replacement_and_each_cell_its_own() {
        let a = SettingsCell::new(Settings::from(&AgentConfig::default()));
        let b = SettingsCell::new(Settings::from(&AgentConfig::default()));
        assert_eq!(a.current().internal_registry, None);
        let reg = registry("Removed");
        let set = |r: Option<InternalRegistry>| {
            move |s: &Settings| {
                (s.internal_registry != r).then(|| Settings {
                    internal_registry: r.clone(),
                    ..s.clone()
                })
            }
        };
        assert!(a.replace(set(reg.clone())));
        assert!(!a.replace(set(reg.clone())), "the same value is no change");
        // This thread's copy of `a` was read before; the replacement shows at once.
        assert_eq!(a.current().internal_registry, reg);
        // `b` is another cell: this thread's copy of `a` is not `b`'s.
        assert_eq!(b.current().internal_registry, None);
        assert_eq!(a.current().internal_registry, reg);
        // Another thread sees the replacement too, and then the next one.
        std::thread::scope(|t| {
            t.spawn(|| assert_eq!(a.current().internal_registry, reg));
        });
        assert!(a.replace(set(None)));
        std::thread::scope(|t| {
            t.spawn(|| assert_eq!(a.current().internal_registry, None));
        });
        assert_eq!(a.current().internal_registry, None);
    }
}
