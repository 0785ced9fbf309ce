//! The registry of the live lease instances of this process, by (store, name, owner): two
//! instances of one lease never act at once.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use super::{lock, Shared};
use crate::backend::LeaseBackend;

/// (store, name, owner) of a lease instance.
pub(super) type Key = (String, String, String);

/// What the registry knows of an instance: whether it holds the lease or has an `acquire` or
/// `release` in flight.
trait Instance: Send + Sync {
    fn busy(&self) -> bool;
}

impl<B: LeaseBackend> Instance for Shared<B> {
    fn busy(&self) -> bool {
        self.tenure.watch().check_alive() || self.ops.try_lock().is_err()
    }
}

/// The live lease instances of this process, by (store, name, owner).
static INSTANCES: LazyLock<Mutex<HashMap<Key, Vec<Registered>>>> = LazyLock::new(Default::default);

/// A registered instance: its id and a weak handle.
type Registered = (u64, Weak<dyn Instance>);

/// This instance's entry in [`INSTANCES`]; removed on drop.
pub(super) struct InstanceKey {
    key: Key,
    id: u64,
}

impl InstanceKey {
    pub(super) fn register<B: LeaseBackend>(key: Key, shared: &Arc<Shared<B>>) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let weak: Weak<dyn Instance> = Arc::downgrade(shared) as Weak<dyn Instance>;
        lock(&INSTANCES)
            .entry(key.clone())
            .or_default()
            .push((id, weak));
        Self { key, id }
    }

    /// Whether another live instance with the same key holds the lease or is acquiring or
    /// releasing it. Called with this instance's own `ops` lock held, so two instances that try
    /// at once cannot both pass.
    pub(super) fn other_busy(&self) -> bool {
        let others: Vec<Arc<dyn Instance>> = lock(&INSTANCES)
            .get(&self.key)
            .into_iter()
            .flatten()
            .filter(|(id, _)| *id != self.id)
            .filter_map(|(_, weak)| weak.upgrade())
            .collect();
        others.iter().any(|other| other.busy())
    }
}

impl Drop for InstanceKey {
    fn drop(&mut self) {
        let mut instances = lock(&INSTANCES);
        if let Some(list) = instances.get_mut(&self.key) {
            list.retain(|(id, weak)| *id != self.id && weak.strong_count() > 0);
            if list.is_empty() {
                instances.remove(&self.key);
            }
        }
    }
}
