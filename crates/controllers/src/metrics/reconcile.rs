//! [`ReconcileMeter`]: counts, times and follows the work of one controller — its reconciles
//! (`mcm_controller_reconcile_*`) and its work queue as client-go's workqueue metrics see it (`mcm_workqueue_*`,
//! mirrored in [`super::queue`]). Separate because it follows kube-runtime's queue from the outside.

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt as _, future::BoxFuture};
use kube::{
    Resource,
    runtime::{
        controller::{self, Action},
        reflector::ObjectRef,
    },
};

use super::{
    Metrics,
    labels::{ControllerLabels, QueueLabels, ReconcileLabels},
    queue::{Mirror, QueueHandles, WorkKey},
    scrape::count,
};

impl Metrics {
    /// A [`ReconcileMeter`] for the controller named `controller`, also the `name` of its work queue metrics (the
    /// reference's queue names: `machine`, `machineset`, ...). Its work queue families show a sample from now on.
    /// Without metrics the meter does nothing.
    pub fn reconcile_meter(metrics: Option<&Arc<Self>>, controller: &str) -> ReconcileMeter {
        let Some(metrics) = metrics else {
            return ReconcileMeter::default();
        };
        let queue = QueueLabels {
            name: controller.to_owned(),
        };
        let q = &metrics.queues;
        // Every family of the queue shows its sample from the start, at 0.
        q.depth.get_or_create(&queue).set(0);
        q.longest_running.get_or_create(&queue).set(0.0);
        q.unfinished.get_or_create(&queue).set(0.0);
        let handles = QueueHandles {
            adds: q.adds.get_or_create_owned(&queue),
            retries: q.retries.get_or_create_owned(&queue),
            queue_duration: q.queue_duration.get_or_create_owned(&queue),
            work_duration: q.work_duration.get_or_create_owned(&queue),
        };
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        let r = &metrics.reconciles;
        let shared = Arc::new(MeterShared {
            queue,
            handles,
            success: r.total.get_or_create_owned(&ReconcileLabels {
                controller: controller.to_owned(),
                result: "success".to_owned(),
            }),
            error: r.total.get_or_create_owned(&ReconcileLabels {
                controller: controller.to_owned(),
                result: "error".to_owned(),
            }),
            errors: r.errors.get_or_create_owned(&labels),
            duration: r.duration.get_or_create_owned(&labels),
            mirror: Mutex::default(),
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
            let view = meter.mirror().view(&meter.handles, now);
            let q = &self.queues;
            q.depth.get_or_create(&meter.queue).set(count(view.depth));
            q.longest_running
                .get_or_create(&meter.queue)
                .set(view.longest_running.as_secs_f64());
            q.unfinished
                .get_or_create(&meter.queue)
                .set(view.unfinished.as_secs_f64());
        }
    }
}

fn work_key(object: &impl Resource) -> WorkKey {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn reference_key<K: Resource>(reference: &ObjectRef<K>) -> WorkKey {
    (
        reference.namespace.clone().unwrap_or_default(),
        reference.name.clone(),
    )
}

pub(super) struct MeterShared {
    queue: QueueLabels,
    handles: QueueHandles,
    success: prometheus_client::metrics::counter::Counter,
    error: prometheus_client::metrics::counter::Counter,
    errors: prometheus_client::metrics::counter::Counter,
    duration: prometheus_client::metrics::histogram::Histogram,
    mirror: Mutex<Mirror>,
}

impl MeterShared {
    fn mirror(&self) -> std::sync::MutexGuard<'_, Mirror> {
        self.mirror.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn added(&self, key: WorkKey) {
        let now = Instant::now();
        self.mirror().schedule(&self.handles, key, now, now);
    }
}

/// Counts, times and follows the work of one controller: `mcm_controller_reconcile_total{controller,result}`,
/// `mcm_controller_reconcile_errors_total`, `mcm_controller_reconcile_duration_seconds` and the work queue families.
/// kube-runtime's scheduler does not show its queue, so the meter sees what goes into it — the triggers
/// ([`ReconcileMeter::triggers`], [`ReconcileMeter::mapper`]) and the requeues ([`ReconcileMeter::reconcile`],
/// [`ReconcileMeter::error_policy`]) — and what comes out ([`ReconcileMeter::start`] and
/// [`ReconcileMeter::outcome`] for an object gone from the cache). A default meter does nothing.
#[derive(Clone, Default)]
pub struct ReconcileMeter(Option<Arc<MeterShared>>);

impl std::fmt::Debug for ReconcileMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ReconcileMeter")
            .field(&self.0.as_ref().map(|m| m.queue.name.as_str()))
            .finish()
    }
}

impl ReconcileMeter {
    /// Notes that the reconcile of `object` starts (its scheduler entry is popped). The returned guard records the
    /// reconcile when it is finished, and forgets it if it is dropped unfinished (a reconcile cancelled at shutdown
    /// counts nowhere).
    pub fn start(&self, object: &impl Resource) -> ReconcileGuard {
        let Some(shared) = &self.0 else {
            return ReconcileGuard(None);
        };
        Self::started(shared, work_key(object))
    }

    /// Work on `key` picked up now, and the guard that notes its end.
    fn started(shared: &Arc<MeterShared>, key: WorkKey) -> ReconcileGuard {
        let started = Instant::now();
        shared.mirror().start(&shared.handles, key.clone(), started);
        ReconcileGuard(Some(GuardInner {
            shared: shared.clone(),
            key,
            started,
        }))
    }

    /// Notes that one pass of a periodic loop starts (the reference's safety queues hold one item, re-added each
    /// period): added and picked up now. Finish the guard with `Some(&Action::await_change())` when the pass ends.
    pub fn pass(&self) -> ReconcileGuard {
        let Some(shared) = &self.0 else {
            return ReconcileGuard(None);
        };
        Self::started(shared, (String::new(), shared.queue.name.clone()))
    }

    /// The controller's own objects as they come from its watch, each one a trigger: pass the result to
    /// `Controller::for_stream` in place of the stream.
    pub fn triggers<K, E>(
        &self,
        stream: impl Stream<Item = Result<K, E>> + Send + 'static,
    ) -> impl Stream<Item = Result<K, E>> + Send + 'static
    where
        K: Resource + Send + 'static,
        E: Send + 'static,
    {
        let meter = self.clone();
        stream.inspect(move |item| {
            if let (Some(shared), Ok(object)) = (&meter.0, item) {
                shared.added(work_key(object));
            }
        })
    }

    /// [`Self::triggers`] for a controller built on a shared cache (`Controller::for_shared_stream`).
    pub fn shared_triggers<K>(
        &self,
        stream: impl Stream<Item = Arc<K>> + Send + 'static,
    ) -> impl Stream<Item = Arc<K>> + Send + 'static
    where
        K: Resource + Send + Sync + 'static,
    {
        let meter = self.clone();
        stream.inspect(move |object| {
            if let Some(shared) = &meter.0 {
                shared.added(work_key(&**object));
            }
        })
    }

    /// A `watches_stream` mapper whose answers are each a trigger: pass the result in place of the mapper.
    pub fn mapper<O, K, I>(
        &self,
        mapper: impl Fn(O) -> I + Send + Sync + 'static,
    ) -> impl Fn(O) -> Vec<ObjectRef<K>> + Send + Sync + 'static
    where
        K: Resource,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let meter = self.clone();
        move |other: O| {
            let references: Vec<ObjectRef<K>> = mapper(other).into_iter().collect();
            if let Some(shared) = &meter.0 {
                for reference in &references {
                    shared.added(reference_key(reference));
                }
            }
            references
        }
    }

    /// Follows one item of the controller's output: an object that has left the cache is dropped by the scheduler
    /// without a reconcile, and leaves the queue.
    pub fn outcome<K, E, Q>(&self, result: &Result<(ObjectRef<K>, Action), controller::Error<E, Q>>)
    where
        K: Resource,
        E: std::error::Error + 'static,
        Q: std::error::Error + 'static,
    {
        if let (Some(shared), Err(controller::Error::ObjectNotFound(reference))) = (&self.0, result) {
            shared.mirror().dropped(&reference_key(reference));
        }
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

    /// `error_policy` metered (the requeue it asks for is followed, and counted as a retry): pass the result to
    /// `Controller::run`.
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
                if requeue_after(&action).is_some() {
                    shared.handles.retries.inc();
                }
                schedule(shared, key, &action);
            }
            action
        }
    }
}

/// A requeue asked for by a reconcile or the error policy; `await_change` asks for none.
fn schedule(shared: &MeterShared, key: WorkKey, action: &Action) {
    let now = Instant::now();
    if let Some(due) = requeue_after(action).and_then(|after| now.checked_add(after)) {
        shared.mirror().schedule(&shared.handles, key, due, now);
    }
}

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
        let took = inner.started.elapsed().as_secs_f64();
        shared.duration.observe(took);
        if outcome.is_some() {
            shared.success.inc();
        } else {
            shared.error.inc();
            shared.errors.inc();
        }
        if shared.mirror().finish(&inner.key).is_some() {
            shared.handles.work_duration.observe(took);
        }
        if let Some(action) = outcome {
            schedule(shared, inner.key.clone(), action);
        }
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            inner.shared.mirror().finish(&inner.key);
        }
    }
}
