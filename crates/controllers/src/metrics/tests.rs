//! Unit tests of the metrics, one concern per file in `tests/`; the cache and text helpers they share are here.

use kube::{Resource, runtime::reflector::Store};
use mcm_api::builders::MachineBuilder;

mod caches;
mod driver;
mod endpoints;
mod reconcile;
mod steps;

fn store_of<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = kube::runtime::reflector::store::<K>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    store
}

/// A machine `ns/<name>`.
fn machine(name: &str) -> MachineBuilder {
    MachineBuilder::new(name).namespace("ns")
}

/// The lines of `text` that start with `prefix`.
fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}
