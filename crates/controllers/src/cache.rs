//! Cache readiness, checked the one safe way.

use futures::FutureExt;
use kube::runtime::reflector::Store;

/// Whether a store has synced, without waiting: kube's `Store::wait_until_ready` wakes only the last of several
/// concurrent waiters, so reconciles started together must not await it (docs/pitfalls.md). A reconcile that finds
/// a store not synced requeues shortly instead.
pub(crate) fn synced<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.wait_until_ready().now_or_never().is_some()
}
