//! [`ReconcileMeter`]: counts, times and follows the reconciles of one controller, and the work queue gauges read
//! from the meters at scrape time. Separate because it follows kube-runtime's queue from the outside.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use kube::{
    Resource,
    runtime::{
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};

use super::{
    Metrics,
    labels::{ControllerLabels, QueueLabels, ReconcileFamilies, ReconcileLabels},
    scrape::count,
};

impl Metrics {
    /// A [`ReconcileMeter`] for the controller named `controller` (also the `name` of its work queue metrics), whose
    /// objects are in `store` (a requeue of an object gone from it is never run, so it stops counting). Without
    /// metrics the meter does nothing.
    pub fn reconcile_meter<K>(
        metrics: Option<&Arc<Self>>,
        controller: &str,
        store: &Store<K>,
    ) -> ReconcileMeter
    where
        K: Resource + Clone + Send + Sync + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let Some(metrics) = metrics else {
            return ReconcileMeter::default();
        };
        let store = store.clone();
        let shared = Arc::new(MeterShared {
            controller: controller.to_owned(),
            families: metrics.reconciles.clone(),
            work: Mutex::default(),
            exists: Box::new(move |(namespace, name): &WorkKey| {
                let reference = ObjectRef::<K>::new_with(name, K::DynamicType::default());
                let reference = if namespace.is_empty() {
                    reference
                } else {
                    reference.within(namespace)
                };
                store.get(&reference).is_some()
            }),
        });
        metrics
            .meters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(shared.clone());
        ReconcileMeter(Some(shared))
    }

    pub(super) fn refresh_queues(&self) {
        let meters = self.meters.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        for meter in meters.iter() {
            let queue = QueueLabels {
                name: meter.controller.clone(),
            };
            let view = meter.queue(now);
            let r = &self.reconciles;
            r.depth.get_or_create(&queue).set(count(view.depth));
            r.longest_running
                .get_or_create(&queue)
                .set(view.longest_running.as_secs_f64());
            r.unfinished
                .get_or_create(&queue)
                .set(view.unfinished.as_secs_f64());
        }
    }
}

/// `(namespace, name)` of an object a controller reconciles.
type WorkKey = (String, String);

fn work_key(object: &impl Resource) -> WorkKey {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// What a meter knows of its controller's work: reconciles running (since when) and requeues scheduled (due when).
#[derive(Default)]
struct Work {
    running: HashMap<WorkKey, Instant>,
    scheduled: HashMap<WorkKey, Instant>,
    /// When `scheduled` grows past this, the requeues of objects gone from the cache are dropped (scrapes drop them
    /// too; this bounds the map of a process that is never scraped).
    prune_at: usize,
}

/// The work queue figures of one controller at one instant.
struct QueueView {
    depth: usize,
    longest_running: Duration,
    unfinished: Duration,
}

pub(super) struct MeterShared {
    controller: String,
    families: ReconcileFamilies,
    work: Mutex<Work>,
    /// Whether the controller's cache still holds the object: kube-runtime drops a requeue of an object gone from
    /// it without a reconcile, so such a requeue must stop counting.
    exists: Box<dyn Fn(&WorkKey) -> bool + Send + Sync>,
}

impl MeterShared {
    fn work(&self) -> std::sync::MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self, now: Instant) -> QueueView {
        let mut work = self.work();
        let due: Vec<WorkKey> = work
            .scheduled
            .iter()
            .filter(|(_, due)| **due <= now)
            .map(|(key, _)| key.clone())
            .collect();
        let mut waiting = 0;
        for key in due {
            if (self.exists)(&key) {
                waiting += 1;
            } else {
                work.scheduled.remove(&key);
            }
        }
        let running: Vec<Duration> = work.running.values().map(|since| now - *since).collect();
        QueueView {
            depth: running.len() + waiting,
            longest_running: running.iter().max().copied().unwrap_or_default(),
            unfinished: running.iter().sum(),
        }
    }
}

/// Counts, times and follows the reconciles of one controller: `mcm_controller_reconcile_total{controller,result}`,
/// `mcm_controller_reconcile_errors_total`, `mcm_controller_reconcile_duration_seconds` and the work queue gauges.
/// kube-runtime's scheduler does not show its queue, so the meter follows what passes through the reconciler and
/// the error policy ([`ReconcileMeter::reconcile`], [`ReconcileMeter::error_policy`]): which objects are being
/// reconciled, and when each one's requeue is due. A default meter does nothing.
#[derive(Clone, Default)]
pub struct ReconcileMeter(Option<Arc<MeterShared>>);

impl std::fmt::Debug for ReconcileMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ReconcileMeter")
            .field(&self.0.as_ref().map(|m| m.controller.as_str()))
            .finish()
    }
}

impl ReconcileMeter {
    /// Notes that the reconcile of `object` starts: its earlier requeue, if any, is what started it (or was replaced
    /// by an earlier trigger). The returned guard records the reconcile when it is finished, and forgets it if it
    /// is dropped unfinished (a reconcile cancelled at shutdown counts nowhere).
    pub fn start(&self, object: &impl Resource) -> ReconcileGuard {
        let Some(shared) = &self.0 else {
            return ReconcileGuard(None);
        };
        let key = work_key(object);
        let started = Instant::now();
        {
            let mut work = shared.work();
            work.scheduled.remove(&key);
            work.running.insert(key.clone(), started);
        }
        ReconcileGuard(Some(GuardInner {
            shared: shared.clone(),
            key,
            started,
        }))
    }

    /// `reconcile` metered: pass the result to `Controller::run` in place of the reconciler.
    pub fn reconcile<K, C, E, Fut>(
        &self,
        mut reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
    ) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, E>>
    where
        K: Resource,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let meter = self.clone();
        move |object: Arc<K>, context: Arc<C>| {
            let guard = meter.start(&*object);
            let future = reconcile(object, context);
            Box::pin(async move {
                let result = future.await;
                guard.finish(result.as_ref().ok());
                result
            })
        }
    }

    /// `error_policy` metered (the requeue it asks for is followed): pass the result to `Controller::run`.
    pub fn error_policy<K, C, E>(
        &self,
        policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
    ) -> impl Fn(Arc<K>, &E, Arc<C>) -> Action
    where
        K: Resource,
    {
        let meter = self.clone();
        move |object: Arc<K>, error: &E, context: Arc<C>| -> Action {
            let key = work_key(&*object);
            let action = policy(object, error, context);
            if let Some(shared) = &meter.0 {
                schedule(shared, key, &action);
            }
            action
        }
    }
}

fn schedule(shared: &MeterShared, key: WorkKey, action: &Action) {
    let mut work = shared.work();
    match requeue_after(action).and_then(|after| Instant::now().checked_add(after)) {
        Some(due) => {
            work.scheduled.insert(key, due);
        }
        None => {
            work.scheduled.remove(&key);
        }
    }
    if work.scheduled.len() > work.prune_at.max(PRUNE_AT_LEAST) {
        work.scheduled.retain(|key, _| (shared.exists)(key));
        work.prune_at = work.scheduled.len() * 2;
    }
}

/// The size of the requeue map below which it is never pruned.
const PRUNE_AT_LEAST: usize = 1024;

/// When `action` requeues, read from its `Debug` text (`Action { requeue_after: Some(5s) }`): kube-runtime keeps the
/// field private. `None` for `await_change` (and, should the text ever change, for anything unreadable: the unit
/// test pins the format).
pub fn requeue_after(action: &Action) -> Option<Duration> {
    let text = format!("{action:?}");
    let inner = text.split("Some(").nth(1)?.split(')').next()?;
    let (number, scale) = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .into_iter()
        .find_map(|(unit, scale)| inner.strip_suffix(unit).map(|n| (n, scale)))?;
    let seconds: f64 = number.parse().ok()?;
    Duration::try_from_secs_f64(seconds * scale).ok()
}

struct GuardInner {
    shared: Arc<MeterShared>,
    key: WorkKey,
    started: Instant,
}

/// One reconcile in progress ([`ReconcileMeter::start`]).
pub struct ReconcileGuard(Option<GuardInner>);

impl ReconcileGuard {
    /// Records the reconcile: `Some(action)` when it succeeded (its requeue is followed), `None` when it failed (the
    /// error policy's requeue is followed by [`ReconcileMeter::error_policy`]).
    pub fn finish(mut self, outcome: Option<&Action>) {
        let Some(inner) = self.0.take() else { return };
        let shared = &inner.shared;
        let controller = ControllerLabels {
            controller: shared.controller.clone(),
        };
        shared
            .families
            .duration
            .get_or_create(&controller)
            .observe(inner.started.elapsed().as_secs_f64());
        let result = if outcome.is_some() { "success" } else { "error" };
        shared
            .families
            .total
            .get_or_create(&ReconcileLabels {
                controller: shared.controller.clone(),
                result: result.to_owned(),
            })
            .inc();
        if outcome.is_none() {
            shared.families.errors.get_or_create(&controller).inc();
        }
        shared.work().running.remove(&inner.key);
        if let Some(action) = outcome {
            schedule(shared, inner.key.clone(), action);
        }
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            inner.shared.work().running.remove(&inner.key);
        }
    }
}
