//! Object storage: every object of every resource, one monotonic resourceVersion counter, and the log of recent
//! changes that watches replay.
//!
//! State lives in memory and, unless the server runs in memory only, in a redb database: each change is written in
//! a committed (fsynced) transaction holding the object, the change event and the counter, so a crash at any point
//! (kill -9 included) loses nothing that was acknowledged, and resourceVersions continue after a restart. The event
//! log keeps the last `window` changes on disk too, so that a watch resumes across a restart without lost or
//! repeated events; older resourceVersions get 410 Gone.
//!
//! Group commit: on disk, concurrent writers share transactions. A writer decides under the lock (seeing the
//! changes still waiting for their transaction, so decisions chain as if each had committed alone), takes the next
//! resourceVersion and queues its change; the first writer to find no transaction under way becomes the leader,
//! takes the whole queue and commits it as one transaction (one fsync) with the lock released, so that more
//! changes queue meanwhile. Only then are the changes applied to what reads see, sent to watches (in
//! resourceVersion order: one transaction at a time, queued in order) and their writers answered. A failed
//! transaction fails its writes and every write queued after them (they may have been decided on top of them),
//! and hands their resourceVersions out again: none of them was acknowledged.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::Path,
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::error::ApiError;

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const RV_KEY: &str = "resourceVersion";

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed; the object is its last state, carrying the deletion's resourceVersion.
    Deleted,
}

impl EventType {
    /// The watch frame's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "ADDED" => Some(Self::Added),
            "MODIFIED" => Some(Self::Modified),
            "DELETED" => Some(Self::Deleted),
            _ => None,
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct WatchEvent {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// What happened.
    pub event_type: EventType,
    /// The resource id (`group/plural`).
    pub resource: String,
    /// The object's namespace (empty for cluster-scoped).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object after the change (its last state for a deletion).
    pub object: Arc<Value>,
    /// The object before a modification, when known (used to turn selector transitions into ADDED/DELETED).
    pub previous: Option<Arc<Value>>,
    /// When the change was committed (or loaded), for the watch-delay test hook.
    pub at: std::time::Instant,
}

/// What a mutation decided.
#[derive(Debug)]
pub enum Mutation {
    /// Store this object (created or changed). Its `metadata.resourceVersion` is set by the store.
    Put(Value),
    /// Remove the object; the value is its last state (the store sets the deletion's resourceVersion on it).
    Delete(Value),
    /// Nothing changes (a no-op write writes nothing and emits no event).
    Unchanged,
}

/// Storage failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened, read or written.
    #[error("storage error: {0}")]
    Db(String),
    /// A stored record could not be decoded.
    #[error("corrupt record in the store: {0}")]
    Corrupt(String),
}

fn db_err<E: Into<redb::Error>>(err: E) -> StoreError {
    StoreError::Db(err.into().to_string())
}

/// Changes a watch replays, and the receiver of the changes to come.
pub type Subscription = (Vec<Arc<WatchEvent>>, broadcast::Receiver<Arc<WatchEvent>>);

/// Key of an object within a resource: (namespace, name).
type ObjectKey = (String, String);

struct Inner {
    /// The last durable (and visible) change's resourceVersion.
    rv: u64,
    objects: HashMap<String, BTreeMap<ObjectKey, Arc<Value>>>,
    log: VecDeque<Arc<WatchEvent>>,
    pending: Pending,
}

/// The group commit's state: changes decided but not yet durable (on disk only; always empty in memory).
#[derive(Default)]
struct Pending {
    /// The last resourceVersion handed out (0 when nothing is pending: then it is `Inner::rv`).
    issued: u64,
    /// The newest undurable change of each object, which later decisions read instead of the durable state.
    latest: HashMap<(String, ObjectKey), Arc<WatchEvent>>,
    /// Changes waiting for the next transaction, in resourceVersion order.
    queue: Vec<Arc<WatchEvent>>,
    /// Whether a leader is committing a transaction now.
    committing: bool,
    /// Raised by a failed transaction: the writes queued or committing under an older epoch have failed.
    epoch: u64,
    /// Why the last transaction failed.
    failure: String,
    /// For each failed transaction (by the epoch it ended), the first resourceVersion it failed: writes below it
    /// had been committed before.
    failed_from: Vec<u64>,
    /// Transactions committed since the store was opened.
    commits: u64,
}

impl Inner {
    /// The last resourceVersion handed out, durable or not.
    fn issued(&self) -> u64 {
        self.rv.max(self.pending.issued)
    }

    /// Applies durable changes: what reads see, the watch log, and the watches.
    fn apply(
        &mut self,
        events: &[Arc<WatchEvent>],
        sender: &broadcast::Sender<Arc<WatchEvent>>,
        window: usize,
    ) {
        let Some(last) = events.last() else {
            return;
        };
        self.rv = last.rv;
        for event in events {
            let objects = self.objects.entry(event.resource.clone()).or_default();
            let key = (event.namespace.clone(), event.name.clone());
            if event.event_type == EventType::Deleted {
                objects.remove(&key);
            } else {
                objects.insert(key, Arc::clone(&event.object));
            }
            self.log.push_back(Arc::clone(event));
            // No receiver is fine; lagging receivers notice and end their watch.
            let _ = sender.send(Arc::clone(event));
        }
        while self.log.len() > window {
            self.log.pop_front();
        }
    }

    /// The objects of a resource, in one namespace or all, ordered by namespace and name.
    fn objects_of(&self, resource: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.objects
            .get(resource)
            .map(|objects| {
                objects
                    .iter()
                    .filter(|((ns, _), _)| namespace.is_none_or(|wanted| wanted == ns))
                    .map(|(_, v)| Arc::clone(v))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The object store. Cheap to share behind an `Arc`.
pub struct Store {
    inner: Mutex<Inner>,
    /// Signalled when a transaction ends (committed or failed), for the writers waiting on it.
    durable: Condvar,
    db: Option<Database>,
    events: broadcast::Sender<Arc<WatchEvent>>,
    window: usize,
}

fn object_key(resource: &str, namespace: &str, name: &str) -> String {
    format!("{resource}\u{0}{namespace}\u{0}{name}")
}

impl Store {
    /// Opens (or creates) the store at `path`, or an in-memory store when `path` is None. `window` is how many
    /// recent changes watches can resume from.
    pub fn open(path: Option<&Path>, window: usize) -> Result<Self, StoreError> {
        let window = window.max(1);
        let (events, _) = broadcast::channel(65_536);
        let mut inner = Inner {
            rv: 0,
            objects: HashMap::new(),
            log: VecDeque::new(),
            pending: Pending::default(),
        };
        let db = match path {
            None => None,
            Some(path) => {
                let db = if path.exists() {
                    Database::open(path)
                } else {
                    Database::create(path)
                }
                .map_err(db_err)?;
                {
                    let txn = db.begin_write().map_err(db_err)?;
                    txn.open_table(OBJECTS).map_err(db_err)?;
                    txn.open_table(EVENTS).map_err(db_err)?;
                    txn.open_table(META).map_err(db_err)?;
                    txn.commit().map_err(db_err)?;
                }
                load(&db, &mut inner)?;
                prune_log(&db, &mut inner, window)?;
                Some(db)
            }
        };
        Ok(Self {
            inner: Mutex::new(inner),
            durable: Condvar::new(),
            db,
            events,
            window,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-written (each change is applied after the
        // database commit, in a few infallible steps), so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current resourceVersion (the last durable change's).
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Whether changes go to disk (and a write may wait for its transaction's fsync).
    pub fn on_disk(&self) -> bool {
        self.db.is_some()
    }

    /// How many database transactions (each one fsync) have been committed since the store was opened; 0 in memory.
    /// With concurrent writers it is below the number of changes: they share transactions (group commit).
    pub fn commits(&self) -> u64 {
        self.lock().pending.commits
    }

    /// One object.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(resource)?
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The objects of a resource (in one namespace, or all), ordered by namespace and name, and the
    /// resourceVersion they were read at.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        (inner.objects_of(resource, namespace), inner.rv)
    }

    /// How many objects are stored, per resource (`mcm bench` reports how the store grows).
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.lock()
            .objects
            .iter()
            .map(|(resource, objects)| (resource.clone(), objects.len()))
            .collect()
    }

    /// Whether any object of any resource lives in this namespace.
    pub fn namespace_is_empty(&self, namespace: &str) -> bool {
        let inner = self.lock();
        inner
            .objects
            .values()
            .all(|objects| objects.keys().all(|(ns, _)| ns != namespace))
    }

    /// Reads the current object and decides, under the store's lock, what to do; the decision is committed
    /// atomically with the next resourceVersion. Returns the object as stored (its last state after a deletion;
    /// the current one, or None, when nothing changed) and the event, if any.
    pub fn mutate<F>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        decide: F,
    ) -> Result<(Option<Arc<Value>>, Option<EventType>), ApiError>
    where
        F: FnOnce(Option<&Arc<Value>>) -> Result<Mutation, ApiError>,
    {
        let inner = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let (current, change) = decided(&inner, resource, &key, decide)?;
        let Some((event_type, object)) = change else {
            return Ok((current, None));
        };
        let event = change_event(inner.issued() + 1, resource, key, object, event_type, current);
        let object = Arc::clone(&event.object);
        self.commit(inner, vec![event])?;
        Ok((Some(object), Some(event_type)))
    }

    /// [`Store::mutate`] for many objects of one resource, committed together: one database transaction (one
    /// fsync) for all the changes, which take consecutive resourceVersions and are sent to watches in order. Each
    /// decision is taken under the lock as in `mutate`. For bulk work such as expiring Events, which
    /// kube-apiserver's storage also removes together (Events share etcd leases, and a lease's keys go at once).
    /// Returns how many objects changed.
    pub fn mutate_many<F>(
        &self,
        resource: &str,
        keys: &[(String, String)],
        mut decide: F,
    ) -> Result<usize, ApiError>
    where
        F: FnMut(Option<&Arc<Value>>) -> Result<Mutation, ApiError>,
    {
        let inner = self.lock();
        let mut events = Vec::new();
        for key in keys {
            let (current, change) = decided(&inner, resource, key, &mut decide)?;
            if let Some((event_type, object)) = change {
                let rv = inner.issued() + 1 + events.len() as u64;
                events.push(change_event(
                    rv,
                    resource,
                    key.clone(),
                    object,
                    event_type,
                    current,
                ));
            }
        }
        let changed = events.len();
        self.commit(inner, events)?;
        Ok(changed)
    }

    /// Makes `events` (consecutive resourceVersions after the last one handed out) durable, then applies them to
    /// the objects and the log and sends them to watches; returns once that is done. In memory this happens at
    /// once; on disk the events join the group commit's queue (module doc).
    fn commit<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        events: Vec<Arc<WatchEvent>>,
    ) -> Result<(), ApiError> {
        let Some(mine) = events.last().map(|e| e.rv) else {
            return Ok(());
        };
        let Some(db) = &self.db else {
            inner.apply(&events, &self.events, self.window);
            return Ok(());
        };
        let epoch = inner.pending.epoch;
        inner.pending.issued = mine;
        for event in events {
            let key = (
                event.resource.clone(),
                (event.namespace.clone(), event.name.clone()),
            );
            inner.pending.latest.insert(key, Arc::clone(&event));
            inner.pending.queue.push(event);
        }
        loop {
            if inner.pending.epoch != epoch {
                let failed_from = inner
                    .pending
                    .failed_from
                    .get(usize::try_from(epoch).unwrap_or(usize::MAX));
                if failed_from.is_some_and(|&first| mine < first) {
                    return Ok(());
                }
                return Err(ApiError::Internal(format!(
                    "the write was not stored: {}",
                    inner.pending.failure
                )));
            }
            if inner.rv >= mine {
                return Ok(());
            }
            if inner.pending.committing || inner.pending.queue.is_empty() {
                inner = self
                    .durable
                    .wait(inner)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            // The leader: commit everything queued, with the lock released so that more writers queue meanwhile.
            let batch = std::mem::take(&mut inner.pending.queue);
            inner.pending.committing = true;
            drop(inner);
            let result = self.persist(db, &batch);
            inner = self.lock();
            inner.pending.committing = false;
            match result {
                Ok(()) => {
                    inner.pending.commits += 1;
                    for event in &batch {
                        let key = (
                            event.resource.clone(),
                            (event.namespace.clone(), event.name.clone()),
                        );
                        if inner.pending.latest.get(&key).is_some_and(|e| e.rv == event.rv) {
                            inner.pending.latest.remove(&key);
                        }
                    }
                    inner.apply(&batch, &self.events, self.window);
                    if inner.pending.issued == inner.rv {
                        inner.pending.issued = 0;
                    }
                }
                Err(err) => {
                    tracing::error!(error = %err, writes = batch.len(), "a storage transaction failed");
                    let first_failed = inner.rv + 1;
                    let pending = &mut inner.pending;
                    pending.failed_from.push(first_failed);
                    pending.epoch += 1;
                    pending.failure = err.to_string();
                    pending.queue.clear();
                    pending.latest.clear();
                    pending.issued = 0;
                }
            }
            self.durable.notify_all();
        }
    }

    /// What [`Store::mutate`] would do, decided the same way under the lock, with nothing committed (a dry run):
    /// no resourceVersion is taken, nothing is stored or persisted, no watch event is sent. The object returned
    /// keeps the current object's resourceVersion (none for a creation), as kube-apiserver answers a dry run.
    pub fn preview<F>(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        decide: F,
    ) -> Result<(Option<Arc<Value>>, Option<EventType>), ApiError>
    where
        F: FnOnce(Option<&Arc<Value>>) -> Result<Mutation, ApiError>,
    {
        let key = (namespace.to_owned(), name.to_owned());
        let (current, change) = decided(&self.lock(), resource, &key, decide)?;
        let Some((event_type, mut object)) = change else {
            return Ok((current, None));
        };
        let current_rv = current
            .as_ref()
            .and_then(|c| c["metadata"]["resourceVersion"].as_str())
            .map(str::to_owned);
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            match current_rv {
                Some(rv) => meta.insert("resourceVersion".into(), json!(rv)),
                None => meta.remove("resourceVersion"),
            };
        }
        Ok((Some(Arc::new(object)), Some(event_type)))
    }

    fn persist(&self, db: &Database, events: &[Arc<WatchEvent>]) -> Result<(), StoreError> {
        let txn = db.begin_write().map_err(db_err)?;
        {
            let mut objects = txn.open_table(OBJECTS).map_err(db_err)?;
            let mut log = txn.open_table(EVENTS).map_err(db_err)?;
            let window = self.window as u64;
            for event in events {
                let key = object_key(&event.resource, &event.namespace, &event.name);
                if event.event_type == EventType::Deleted {
                    objects.remove(key.as_str()).map_err(db_err)?;
                } else {
                    let bytes =
                        serde_json::to_vec(&*event.object).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    objects.insert(key.as_str(), bytes.as_slice()).map_err(db_err)?;
                }
                log.insert(event.rv, log_record(event)?.as_slice())
                    .map_err(db_err)?;
                if event.rv > window {
                    log.remove(event.rv - window).map_err(db_err)?;
                }
            }
            if let Some(last) = events.last() {
                let mut meta = txn.open_table(META).map_err(db_err)?;
                meta.insert(RV_KEY, last.rv).map_err(db_err)?;
            }
        }
        txn.commit().map_err(db_err)
    }

    /// The changes after `rv` that the log still holds, and a receiver for the changes to come, taken atomically
    /// so that nothing is lost or repeated between them. Errors with 410 Expired when changes after `rv` are no
    /// longer retained.
    pub fn watch_from(&self, rv: u64) -> Result<Subscription, ApiError> {
        let inner = self.lock();
        let oldest_retained = inner.log.front().map_or(inner.rv + 1, |e| e.rv);
        if rv + 1 < oldest_retained && rv < inner.rv {
            return Err(ApiError::Expired(format!(
                "too old resource version: {rv} ({})",
                oldest_retained - 1
            )));
        }
        if rv > inner.rv {
            // A resourceVersion from the future: a real server waits for it; ours was never issued. Serve from now.
            tracing::debug!(
                requested = rv,
                current = inner.rv,
                "watch from a future resourceVersion"
            );
        }
        let backlog = inner.log.iter().filter(|e| e.rv > rv).cloned().collect();
        Ok((backlog, self.events.subscribe()))
    }

    /// The current objects of a resource and a receiver for the changes after them, taken atomically (a watch from
    /// resourceVersion 0 or unset starts with synthetic ADDED events for these).
    pub fn snapshot_and_subscribe(
        &self,
        resource: &str,
        namespace: Option<&str>,
    ) -> (Vec<Arc<Value>>, u64, broadcast::Receiver<Arc<WatchEvent>>) {
        let inner = self.lock();
        let receiver = self.events.subscribe();
        (inner.objects_of(resource, namespace), inner.rv, receiver)
    }
}

/// Drops retained changes beyond the window (the window may have been made smaller since the last start).
fn prune_log(db: &Database, inner: &mut Inner, window: usize) -> Result<(), StoreError> {
    let excess = inner.log.len().saturating_sub(window);
    if excess == 0 {
        return Ok(());
    }
    let dropped: Vec<u64> = inner.log.drain(..excess).map(|e| e.rv).collect();
    let txn = db.begin_write().map_err(db_err)?;
    {
        let mut events = txn.open_table(EVENTS).map_err(db_err)?;
        for rv in dropped {
            events.remove(rv).map_err(db_err)?;
        }
    }
    txn.commit().map_err(db_err)
}

/// A decided change: the event type and the object to write.
type Change = (EventType, Value);

/// The current object and what `decide` makes of it: the event type and the object to write, or `None` for no change.
/// Shared by [`Store::mutate`] and [`Store::preview`], so that a dry run decides exactly as the write does.
fn decided<F>(
    inner: &Inner,
    resource: &str,
    key: &ObjectKey,
    decide: F,
) -> Result<(Option<Arc<Value>>, Option<Change>), ApiError>
where
    F: FnOnce(Option<&Arc<Value>>) -> Result<Mutation, ApiError>,
{
    let pending = if inner.pending.latest.is_empty() {
        None
    } else {
        inner.pending.latest.get(&(resource.to_owned(), key.clone()))
    };
    let current = match pending {
        Some(event) if event.event_type == EventType::Deleted => None,
        Some(event) => Some(Arc::clone(&event.object)),
        None => inner.objects.get(resource).and_then(|m| m.get(key)).cloned(),
    };
    let change = match decide(current.as_ref())? {
        Mutation::Unchanged => None,
        Mutation::Put(object) if current.is_some() => Some((EventType::Modified, object)),
        Mutation::Put(object) => Some((EventType::Added, object)),
        Mutation::Delete(object) => Some((EventType::Deleted, object)),
    };
    Ok((current, change))
}

/// The watch event of a decided change, its object stamped with `rv`.
fn change_event(
    rv: u64,
    resource: &str,
    (namespace, name): ObjectKey,
    mut object: Value,
    event_type: EventType,
    previous: Option<Arc<Value>>,
) -> Arc<WatchEvent> {
    set_resource_version(&mut object, rv);
    Arc::new(WatchEvent {
        rv,
        event_type,
        resource: resource.to_owned(),
        namespace,
        name,
        object: Arc::new(object),
        previous,
        at: std::time::Instant::now(),
    })
}

/// The log's record of a change: what a watch resumed after a restart replays.
fn log_record(event: &WatchEvent) -> Result<Vec<u8>, StoreError> {
    let record = json!({
        "type": event.event_type.as_str(),
        "resource": event.resource,
        "namespace": event.namespace,
        "name": event.name,
        "object": &*event.object,
        // A selector watch resumed after a restart needs the state before a modification to tell a change from an
        // object entering or leaving the selector.
        "previous": event.previous.as_deref().filter(|_| event.event_type == EventType::Modified),
    });
    serde_json::to_vec(&record).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn set_resource_version(object: &mut Value, rv: u64) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

fn load(db: &Database, inner: &mut Inner) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(db_err)?;
    let objects = txn.open_table(OBJECTS).map_err(db_err)?;
    for item in objects.iter().map_err(db_err)? {
        let (key, value) = item.map_err(db_err)?;
        let mut parts = key.value().splitn(3, '\u{0}');
        let (Some(resource), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(StoreError::Corrupt(format!("object key {:?}", key.value())));
        };
        let object: Value =
            serde_json::from_slice(value.value()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        inner
            .objects
            .entry(resource.to_owned())
            .or_default()
            .insert((namespace.to_owned(), name.to_owned()), Arc::new(object));
    }
    let events = txn.open_table(EVENTS).map_err(db_err)?;
    for item in events.iter().map_err(db_err)? {
        let (rv, record) = item.map_err(db_err)?;
        let record: Value =
            serde_json::from_slice(record.value()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let text = |field: &str| record[field].as_str().unwrap_or_default().to_owned();
        let event_type = EventType::parse(record["type"].as_str().unwrap_or_default())
            .ok_or_else(|| StoreError::Corrupt(format!("event {} has no type", rv.value())))?;
        inner.log.push_back(Arc::new(WatchEvent {
            rv: rv.value(),
            event_type,
            resource: text("resource"),
            namespace: text("namespace"),
            name: text("name"),
            object: Arc::new(record["object"].clone()),
            previous: record
                .get("previous")
                .filter(|v| !v.is_null())
                .cloned()
                .map(Arc::new),
            at: std::time::Instant::now(),
        }));
    }
    let meta = txn.open_table(META).map_err(db_err)?;
    inner.rv = meta.get(RV_KEY).map_err(db_err)?.map_or(0, |v| v.value());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &Store, name: &str, value: i64) -> u64 {
        let (stored, _) = store
            .mutate("/secrets", "default", name, |_| {
                Ok(Mutation::Put(
                    json!({ "metadata": { "name": name, "namespace": "default" }, "v": value }),
                ))
            })
            .unwrap();
        stored.unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn temp_db(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mcm-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(crate::server::STORE_FILE)
    }

    #[test]
    fn mutate_many_commits_consecutive_versions_in_one_go_and_survives_a_reopen() {
        let path = temp_db("many");
        {
            let store = Store::open(Some(&path), 100).unwrap();
            for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
                put(&store, name, i64::try_from(i).unwrap());
            }
            let keys: Vec<(String, String)> = ["a", "b", "c", "missing"]
                .iter()
                .map(|n| ("default".to_owned(), (*n).to_owned()))
                .collect();
            let (_, mut watch) = store.watch_from(3).unwrap();
            // Deletes every object but the one with v = 1; the missing one stays missing.
            let changed = store
                .mutate_many("/secrets", &keys, |current| {
                    Ok(match current {
                        Some(c) if c["v"] != 1 => Mutation::Delete((**c).clone()),
                        _ => Mutation::Unchanged,
                    })
                })
                .unwrap();
            assert_eq!(changed, 2);
            assert_eq!(store.current_rv(), 5);
            let sent: Vec<(u64, String)> = (0..2)
                .map(|_| watch.try_recv().unwrap())
                .map(|e| (e.rv, e.name.clone()))
                .collect();
            assert_eq!(sent, [(4, "a".to_owned()), (5, "c".to_owned())]);
        }
        let store = Store::open(Some(&path), 100).unwrap();
        assert_eq!(store.current_rv(), 5, "the batch was persisted");
        assert_eq!(store.counts(), BTreeMap::from([("/secrets".to_owned(), 1)]));
        assert!(store.get("/secrets", "default", "b").is_some());
        let (backlog, _) = store.watch_from(3).unwrap();
        let replayed: Vec<(u64, EventType)> = backlog.iter().map(|e| (e.rv, e.event_type)).collect();
        assert_eq!(replayed, [(4, EventType::Deleted), (5, EventType::Deleted)]);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn counts_are_per_resource_and_follow_deletes() {
        let store = Store::open(None, 10).unwrap();
        put(&store, "a", 1);
        put(&store, "b", 2);
        store
            .mutate("/configmaps", "default", "c", |_| {
                Ok(Mutation::Put(
                    json!({ "metadata": { "name": "c", "namespace": "default" } }),
                ))
            })
            .unwrap();
        store
            .mutate("/secrets", "default", "a", |cur| {
                Ok(Mutation::Delete((**cur.unwrap()).clone()))
            })
            .unwrap();
        assert_eq!(
            store.counts(),
            BTreeMap::from([("/configmaps".to_owned(), 1), ("/secrets".to_owned(), 1)])
        );
    }

    #[test]
    fn resource_versions_increase_and_survive_a_reopen() {
        let path = temp_db("reopen");
        {
            let store = Store::open(Some(&path), 100).unwrap();
            assert_eq!(put(&store, "a", 1), 1);
            assert_eq!(put(&store, "b", 2), 2);
            store
                .mutate("/secrets", "default", "a", |cur| {
                    Ok(Mutation::Delete((**cur.unwrap()).clone()))
                })
                .unwrap();
        }
        let store = Store::open(Some(&path), 100).unwrap();
        assert_eq!(store.current_rv(), 3);
        assert!(store.get("/secrets", "default", "a").is_none());
        assert_eq!(store.get("/secrets", "default", "b").unwrap()["v"], 2);
        assert_eq!(
            put(&store, "c", 3),
            4,
            "resourceVersions continue after a restart"
        );
        let (backlog, _) = store.watch_from(1).unwrap();
        let seen: Vec<(u64, EventType)> = backlog.iter().map(|e| (e.rv, e.event_type)).collect();
        assert_eq!(
            seen,
            [
                (2, EventType::Added),
                (3, EventType::Deleted),
                (4, EventType::Added)
            ]
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn watching_from_before_the_window_is_gone() {
        let store = Store::open(None, 3).unwrap();
        for i in 0..10 {
            put(&store, &format!("o{i}"), i);
        }
        assert!(matches!(store.watch_from(2), Err(ApiError::Expired(_))));
        let (backlog, _) = store.watch_from(7).unwrap();
        assert_eq!(backlog.iter().map(|e| e.rv).collect::<Vec<_>>(), [8, 9, 10]);
        assert!(store.watch_from(10).unwrap().0.is_empty());
    }

    #[test]
    fn a_smaller_window_on_reopen_drops_older_changes_from_disk() {
        let path = temp_db("shrink");
        {
            let store = Store::open(Some(&path), 100).unwrap();
            for i in 0..10 {
                put(&store, &format!("o{i}"), i);
            }
        }
        {
            let store = Store::open(Some(&path), 3).unwrap();
            assert!(matches!(store.watch_from(5), Err(ApiError::Expired(_))));
            assert_eq!(store.watch_from(7).unwrap().0.len(), 3);
        }
        let store = Store::open(Some(&path), 100).unwrap();
        assert!(
            matches!(store.watch_from(5), Err(ApiError::Expired(_))),
            "pruned changes stay gone on disk"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Holds the group commit as if a transaction were under way, runs `writes` (each on its own thread) until
    /// `queued` changes wait for the next transaction, then lets the commit go; the writes' results.
    fn while_committing<T: Send>(
        store: &Store,
        queued: usize,
        writes: Vec<Box<dyn FnOnce() -> T + Send + '_>>,
    ) -> Vec<T> {
        store.lock().pending.committing = true;
        std::thread::scope(|scope| {
            let handles: Vec<_> = writes.into_iter().map(|w| scope.spawn(w)).collect();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while store.lock().pending.queue.len() < queued {
                assert!(std::time::Instant::now() < deadline, "the writes did not queue");
                std::thread::yield_now();
            }
            store.lock().pending.committing = false;
            store.durable.notify_all();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn concurrent_writes_share_one_transaction_and_survive_a_reopen() {
        let path = temp_db("group");
        {
            let store = Store::open(Some(&path), 100).unwrap();
            let (_, mut watch) = store.watch_from(0).unwrap();
            let store = &store;
            let writes: Vec<Box<dyn FnOnce() -> u64 + Send + '_>> = (0..8)
                .map(|i| Box::new(move || put(store, &format!("o{i}"), i)) as Box<_>)
                .collect();
            let mut versions = while_committing(store, 8, writes);
            assert_eq!(store.commits(), 1, "eight writes, one transaction");
            versions.sort_unstable();
            assert_eq!(versions, (1..=8).collect::<Vec<u64>>());
            let sent: Vec<u64> = (0..8).map(|_| watch.try_recv().unwrap().rv).collect();
            assert_eq!(
                sent,
                (1..=8).collect::<Vec<u64>>(),
                "watch events in resourceVersion order"
            );
        }
        let store = Store::open(Some(&path), 100).unwrap();
        assert_eq!(store.current_rv(), 8);
        assert_eq!(store.counts(), BTreeMap::from([("/secrets".to_owned(), 8)]));
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_refused_write_does_not_join_the_transaction_and_the_others_commit() {
        let path = temp_db("refused");
        let store = &Store::open(Some(&path), 100).unwrap();
        let mut writes: Vec<Box<dyn FnOnce() -> Result<(), ApiError> + Send + '_>> = (0..4)
            .map(|i| {
                Box::new(move || {
                    put(store, &format!("o{i}"), i);
                    Ok(())
                }) as Box<_>
            })
            .collect();
        writes.push(Box::new(|| {
            store
                .mutate("/secrets", "default", "bad", |_| {
                    Err(ApiError::BadRequest("spec.x: refused".into()))
                })
                .map(|_| ())
        }));
        let results = while_committing(store, 4, writes);
        assert!(matches!(results[4], Err(ApiError::BadRequest(_))));
        assert!(results[..4].iter().all(Result::is_ok));
        assert_eq!(store.commits(), 1);
        assert_eq!(store.counts(), BTreeMap::from([("/secrets".to_owned(), 4)]));
        assert!(store.get("/secrets", "default", "bad").is_none());
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_write_waiting_for_its_transaction_is_seen_by_later_decisions_but_not_by_reads() {
        let path = temp_db("chain");
        let store = Store::open(Some(&path), 100).unwrap();
        put(&store, "a", 0);
        let increment = || {
            store
                .mutate("/secrets", "default", "a", |current| {
                    let mut object = (**current.unwrap()).clone();
                    object["v"] = json!(object["v"].as_i64().unwrap() + 1);
                    Ok(Mutation::Put(object))
                })
                .map(|_| ())
        };
        store.lock().pending.committing = true;
        std::thread::scope(|scope| {
            let first = scope.spawn(increment);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while store.lock().pending.queue.is_empty() {
                assert!(std::time::Instant::now() < deadline, "the write did not queue");
                std::thread::yield_now();
            }
            assert_eq!(
                store.get("/secrets", "default", "a").unwrap()["v"],
                0,
                "reads see durable state only"
            );
            assert_eq!(store.current_rv(), 1);
            let second = scope.spawn(increment);
            while store.lock().pending.queue.len() < 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the second write did not queue"
                );
                std::thread::yield_now();
            }
            store.lock().pending.committing = false;
            store.durable.notify_all();
            first.join().unwrap().unwrap();
            second.join().unwrap().unwrap();
        });
        let a = store.get("/secrets", "default", "a").unwrap();
        assert_eq!(a["v"], 2, "the second decision read the first");
        assert_eq!(a["metadata"]["resourceVersion"], "3");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn an_unchanged_write_writes_nothing() {
        let store = Store::open(None, 10).unwrap();
        put(&store, "a", 1);
        let (stored, event) = store
            .mutate("/secrets", "default", "a", |_| Ok(Mutation::Unchanged))
            .unwrap();
        assert!(event.is_none());
        assert_eq!(stored.unwrap()["metadata"]["resourceVersion"], "1");
        assert_eq!(store.current_rv(), 1);
    }
}
