//! The work queue of one controller as client-go's workqueue metrics see it (`mcm_workqueue_*{name}`), mirrored
//! from the outside of kube-runtime's scheduler: the scheduler keeps one entry per object, due at the earliest time
//! asked for, held while the object's reconcile runs, and popped when a reconcile starts (or dropped when the object
//! has left the cache). The mirror keeps the same entries, so the depth it reports is the scheduler's, not a bound.
//!
//! The mapping to client-go's queue (docs/operations.md): a watch trigger or a mapped trigger is `Add`; a requeue
//! asked by a reconcile or the error policy is `AddAfter` (it is *added* when it comes due, as client-go's delaying
//! queue adds it then); an error policy's requeue is also `AddRateLimited` (a retry); a reconcile start is `Get`; its
//! end is `Done`.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use prometheus_client::metrics::{counter::Counter, histogram::Histogram};

/// `(namespace, name)` of an object a controller reconciles.
pub(super) type WorkKey = (String, String);

/// One scheduler entry: due at `due`; `added` once counted in `adds_total` (an entry asked for later is added when
/// it comes due, as client-go's delaying queue adds it).
struct Entry {
    due: Instant,
    added: bool,
}

/// The per-queue counters and histograms, resolved once for the queue's `name` (no label lookup per event).
#[derive(Clone)]
pub(super) struct QueueHandles {
    pub(super) adds: Counter,
    pub(super) retries: Counter,
    pub(super) queue_duration: Histogram,
    pub(super) work_duration: Histogram,
}

/// The work queue figures of one controller at one instant.
pub(super) struct QueueView {
    pub(super) depth: usize,
    pub(super) longest_running: Duration,
    pub(super) unfinished: Duration,
}

/// The mirror of one controller's scheduler: entries waiting (due or not) and reconciles running (since when).
#[derive(Default)]
pub(super) struct Mirror {
    entries: HashMap<WorkKey, Entry>,
    running: HashMap<WorkKey, Instant>,
}

impl Mirror {
    /// A trigger (or a requeue) for `key` due at `due`: the earlier of it and any entry already there wins, as in
    /// the scheduler; an entry that becomes due now is added.
    pub(super) fn schedule(&mut self, handles: &QueueHandles, key: WorkKey, due: Instant, now: Instant) {
        let entry = self.entries.entry(key).or_insert(Entry { due, added: false });
        if due < entry.due {
            entry.due = due;
        }
        if !entry.added && entry.due <= now {
            entry.added = true;
            handles.adds.inc();
        }
    }

    /// A reconcile of `key` starts (`Get`): its entry is popped, and the time it waited since it was added is
    /// observed. A reconcile whose trigger was not seen counts as added now.
    pub(super) fn start(&mut self, handles: &QueueHandles, key: WorkKey, now: Instant) {
        let (added, since) = self
            .entries
            .remove(&key)
            .map_or((false, now), |entry| (entry.added, entry.due));
        if !added {
            handles.adds.inc();
        }
        handles
            .queue_duration
            .observe(now.saturating_duration_since(since).as_secs_f64());
        self.running.insert(key, now);
    }

    /// The reconcile of `key` ended (`Done`); `None` when it never started here.
    pub(super) fn finish(&mut self, key: &WorkKey) -> Option<Instant> {
        self.running.remove(key)
    }

    /// The scheduler dropped the entry of `key` without a reconcile (the object has left the cache).
    pub(super) fn dropped(&mut self, key: &WorkKey) {
        self.entries.remove(key);
    }

    /// The figures at `now`; entries that came due since the last look are counted as added.
    pub(super) fn view(&mut self, handles: &QueueHandles, now: Instant) -> QueueView {
        let mut depth = 0;
        for entry in self.entries.values_mut() {
            if entry.due <= now {
                depth += 1;
                if !entry.added {
                    entry.added = true;
                    handles.adds.inc();
                }
            }
        }
        let mut longest_running = Duration::ZERO;
        let mut unfinished = Duration::ZERO;
        for since in self.running.values() {
            let running = now.saturating_duration_since(*since);
            longest_running = longest_running.max(running);
            unfinished += running;
        }
        QueueView {
            depth,
            longest_running,
            unfinished,
        }
    }
}

/// The buckets of the queue and work duration histograms: client-go's workqueue buckets as the reference registers
/// them (`ExponentialBuckets(10e-9, 10, 10)`: 10 ns to 10 s).
pub(super) fn duration_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(1e-8, 10.0, 10)
}
