//! One watch and one cache per kind for every controller of the process (issue 26; docs/shared-caches.md).
//!
//! A [`SharedCache`] drives one watch into one kube-runtime store and hands each subscriber the watch's events with
//! the cached object itself (an `Arc`, never a copy). Unlike kube-runtime's own shared reflector it passes deletes
//! and relists on (the MachineSet controller replaces a deleted machine; the overshoot loop and the class finalizer
//! follow relists), never blocks the watch on a slow subscriber (each has an unbounded queue of pointers), and a
//! subscriber that comes late (a controller started when its Lease is won) first gets the cache's current contents
//! as a relist, as a watch of its own would have given it.
//!
//! Readiness is a flag of its own ([`SharedCache::synced`]): kube's `Store::wait_until_ready` wakes only the last
//! of its waiters, and even a look without waiting (`now_or_never`) takes the place of a controller that waits on
//! it (docs/pitfalls.md), so nothing but the one controller built on a shared store may touch it.

use std::{
    fmt::Debug,
    hash::Hash,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::Machine;
use tokio::sync::mpsc;

/// Whether a shared cache has synced (seen its first complete list); cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Synced(Arc<AtomicBool>);

impl Synced {
    /// Whether the first list is in the cache.
    #[must_use]
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// One watch event as subscribers get it: the cached object, shared.
pub type SharedEvent<K> = watcher::Event<Arc<K>>;

type Subscribers<K> = Arc<Mutex<Vec<mpsc::UnboundedSender<SharedEvent<K>>>>>;

/// One kind's cache and the subscribers of its watch. Cheap to clone (all clones share the one cache).
pub struct SharedCache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    synced: Synced,
    subscribers: Subscribers<K>,
}

impl<K> Clone for SharedCache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            synced: self.synced.clone(),
            subscribers: self.subscribers.clone(),
        }
    }
}

impl<K> Debug for SharedCache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache")
            .field("objects", &self.store.len())
            .field("synced", &self.synced.get())
            .finish_non_exhaustive()
    }
}

impl<K> SharedCache<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    /// Starts driving `watch` (already trimmed and with its failures observed) into the cache, until `shutdown`
    /// resolves or the watch ends.
    pub fn start(
        watch: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        let (store, writer) = reflector::store::<K>();
        let cache = Self {
            store,
            synced: Synced::default(),
            subscribers: Arc::default(),
        };
        let driver = cache.clone();
        tokio::spawn(async move {
            let drive = driver.drive(writer, watch);
            tokio::select! {
                () = drive => {}
                () = shutdown => {}
            }
        });
        cache
    }

    /// A cache holding `objects` and driven by nothing (unit tests of what reads a cache), synced or not.
    #[cfg(test)]
    pub(crate) fn fixed(objects: Vec<K>, synced: bool) -> Self {
        let (store, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for object in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(object));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let cache = Self {
            store,
            synced: Synced::default(),
            subscribers: Arc::default(),
        };
        if synced {
            cache.synced.set();
        }
        cache
    }

    /// Marks a [`Self::fixed`] cache synced.
    #[cfg(test)]
    pub(crate) fn mark_synced(&self) {
        self.synced.set();
    }

    async fn drive(
        self,
        mut writer: reflector::store::Writer<K>,
        watch: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    ) {
        let mut watch = std::pin::pin!(watch);
        while let Some(item) = watch.next().await {
            // A failed watch retries by itself (its backoff); its failures were observed upstream.
            let Ok(event) = item else { continue };
            writer.apply_watcher_event(&event);
            match event {
                watcher::Event::Apply(object) => {
                    if let Some(cached) = self.store.get(&ObjectRef::from_obj(&object)) {
                        self.send(|| vec![watcher::Event::Apply(cached.clone())]);
                    }
                }
                watcher::Event::Delete(object) => {
                    let gone = Arc::new(object);
                    self.send(|| vec![watcher::Event::Delete(gone.clone())]);
                }
                // A relist is passed on once it is in the cache (the store swaps it in at its end).
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
                watcher::Event::InitDone => {
                    self.synced.set();
                    let relist = self.relist();
                    self.send(|| relist.clone());
                }
            }
        }
    }

    /// The cache's contents as a relist.
    fn relist(&self) -> Vec<SharedEvent<K>> {
        std::iter::once(watcher::Event::Init)
            .chain(self.store.state().into_iter().map(watcher::Event::InitApply))
            .chain(std::iter::once(watcher::Event::InitDone))
            .collect()
    }

    /// Sends `events()` to every subscriber, forgetting those that have gone.
    fn send(&self, events: impl Fn() -> Vec<SharedEvent<K>>) {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        subscribers.retain(|subscriber| events().into_iter().all(|event| subscriber.send(event).is_ok()));
    }

    /// The cache (read it; never wait on it: [`Self::synced`] says whether it has synced).
    #[must_use]
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Whether the cache has synced.
    #[must_use]
    pub fn synced(&self) -> bool {
        self.synced.get()
    }

    /// The readiness flag, to hand on.
    #[must_use]
    pub fn readiness(&self) -> Synced {
        self.synced.clone()
    }

    /// Every event of the watch from now on; a late subscriber first gets the cache's contents as a relist.
    pub fn events(&self) -> impl Stream<Item = SharedEvent<K>> + Send + 'static {
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut subscribers = self.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
            if self.synced.get() {
                for event in self.relist() {
                    let _ = tx.send(event);
                }
            }
            subscribers.push(tx);
        }
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    /// The objects applied or listed (not deleted): a controller's triggers of its own kind.
    pub fn applied(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.events().filter_map(|event| {
            futures::future::ready(match event {
                watcher::Event::Apply(object) | watcher::Event::InitApply(object) => Some(object),
                watcher::Event::Delete(_) | watcher::Event::Init | watcher::Event::InitDone => None,
            })
        })
    }

    /// The objects each event touches (applied, listed or deleted): what a controller maps to its triggers.
    pub fn objects(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.events().filter_map(|event| {
            futures::future::ready(match event {
                watcher::Event::Apply(object)
                | watcher::Event::InitApply(object)
                | watcher::Event::Delete(object) => Some(object),
                watcher::Event::Init | watcher::Event::InitDone => None,
            })
        })
    }
}

/// `event` as the shared cache hands it on (unit tests of what follows a shared cache's events).
#[cfg(test)]
pub(crate) fn shared_event<K>(event: watcher::Event<K>) -> SharedEvent<K> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(Arc::new(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(Arc::new(object)),
        watcher::Event::InitApply(object) => watcher::Event::InitApply(Arc::new(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The caches every controller of `mcm run` shares: the namespace's Machines (with their index by owner) and the
/// target cluster's Nodes.
#[derive(Clone, Debug)]
pub struct Caches {
    /// The Machines of the namespace, without what no controller reads (`crate::cache::lean`).
    pub machines: SharedCache<Machine>,
    /// The machines by controlling owner, fed ahead of the machine cache.
    pub(crate) owners: crate::owners::OwnerIndex,
    /// The machines by the node their `node` label names, fed ahead of the machine cache.
    pub(crate) by_node: crate::owners::OwnerIndex,
    /// The target cluster's Nodes (`None` for `--target-kubeconfig none`), without their image lists.
    pub nodes: Option<SharedCache<Node>>,
}

impl Caches {
    /// Starts the watches of `namespace`'s Machines on `control` and of the Nodes on `target`; they run until
    /// `shutdown` resolves. With `metrics`, each watch's failures are seen (and `/readyz` fails while one keeps
    /// failing).
    pub fn start(
        control: &Client,
        target: Option<&Client>,
        namespace: &str,
        metrics: Option<&crate::metrics::Metrics>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        let shutdown = futures::FutureExt::shared(futures::FutureExt::boxed(shutdown));
        let health = |kind| {
            let health = crate::watch_health::WatchHealth::new(kind);
            health.register(metrics);
            health
        };
        let owners = crate::owners::OwnerIndex::default();
        let by_node = crate::owners::OwnerIndex::by_node();
        let machine_health = health("Machine");
        let machine_watch = watcher(
            Api::<Machine>::namespaced(control.clone(), namespace),
            watcher::Config::default(),
        )
        .default_backoff()
        .inspect(move |item| machine_health.observe(item))
        .modify(crate::cache::lean)
        .inspect_ok({
            let (owners, by_node) = (owners.clone(), by_node.clone());
            move |event| {
                owners.observe(event);
                by_node.observe(event);
            }
        });
        let machines = SharedCache::start(machine_watch, shutdown.clone());
        let nodes = target.map(|target| {
            let node_health = health("Node");
            let node_watch = watcher(Api::<Node>::all(target.clone()), watcher::Config::default())
                .default_backoff()
                .inspect(move |item| node_health.observe(item))
                .modify(crate::cache::lean_node);
            SharedCache::start(node_watch, shutdown.clone())
        });
        Self {
            machines,
            owners,
            by_node,
            nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, rv: &str) -> Machine {
        let mut machine = mcm_api::builders::MachineBuilder::new(name)
            .namespace("ns")
            .build();
        machine.metadata.resource_version = Some(rv.into());
        machine
    }

    /// What a subscriber has received so far, as `(event, name@rv)` lines.
    async fn received(events: &mut (impl Stream<Item = SharedEvent<Machine>> + Unpin)) -> Vec<String> {
        let mut seen = Vec::new();
        while let Ok(Some(event)) =
            tokio::time::timeout(std::time::Duration::from_millis(200), events.next()).await
        {
            let line = |kind: &str, m: &Machine| {
                format!(
                    "{kind} {}@{}",
                    m.metadata.name.as_deref().unwrap_or_default(),
                    m.metadata.resource_version.as_deref().unwrap_or_default()
                )
            };
            seen.push(match &event {
                watcher::Event::Init => "Init".into(),
                watcher::Event::InitApply(m) => line("InitApply", m),
                watcher::Event::InitDone => "InitDone".into(),
                watcher::Event::Apply(m) => line("Apply", m),
                watcher::Event::Delete(m) => line("Delete", m),
            });
        }
        seen
    }

    #[tokio::test]
    async fn every_subscriber_sees_applies_deletes_and_relists_and_a_late_one_starts_with_the_contents() {
        let (tx, rx) = mpsc::unbounded_channel::<Result<watcher::Event<Machine>, watcher::Error>>();
        let watch = futures::stream::poll_fn({
            let mut rx = rx;
            move |cx| rx.poll_recv(cx)
        });
        let cache = SharedCache::start(watch, futures::future::pending());
        let mut early = Box::pin(cache.events());
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(machine("a", "1")),
            watcher::Event::InitApply(machine("b", "2")),
        ] {
            tx.send(Ok(event)).unwrap();
        }
        assert!(
            received(&mut early).await.is_empty(),
            "a relist is passed on once complete"
        );
        assert!(!cache.synced(), "not synced before the list is complete");
        tx.send(Ok(watcher::Event::InitDone)).unwrap();
        let mut relist = received(&mut early).await;
        relist[1..3].sort();
        assert_eq!(relist, ["Init", "InitApply a@1", "InitApply b@2", "InitDone"]);
        assert!(cache.synced());

        tx.send(Ok(watcher::Event::Apply(machine("a", "3")))).unwrap();
        tx.send(Ok(watcher::Event::Delete(machine("b", "4")))).unwrap();
        assert_eq!(received(&mut early).await, ["Apply a@3", "Delete b@4"]);

        let mut late = Box::pin(cache.events());
        assert_eq!(
            received(&mut late).await,
            ["Init", "InitApply a@3", "InitDone"],
            "a late subscriber starts from the cache as it is"
        );
        // The object handed on is the cached one, not a copy.
        let cached = cache.store().get(&ObjectRef::new("a").within("ns")).unwrap();
        let mut objects = Box::pin(cache.objects());
        let handed = objects.next().await.unwrap();
        assert!(Arc::ptr_eq(&handed, &cached));
        tx.send(Ok(watcher::Event::Apply(machine("c", "5")))).unwrap();
        drop(late);
        tx.send(Ok(watcher::Event::Apply(machine("a", "6")))).unwrap();
        assert_eq!(
            received(&mut early).await,
            ["Apply c@5", "Apply a@6"],
            "a gone subscriber does not stop the others"
        );
    }
}
