//! Garbage collection by `metadata.ownerReferences`, as kube-controller-manager's garbage collector does it, for
//! every served resource.
//!
//! - **Background** (the default): once an owner is gone, its dependents are deleted (each with its own
//!   finalizers respected), level after level. A dependent with several owners is deleted only when none of them
//!   remains; a reference to an owner that is gone is removed while other owners remain.
//! - **Foreground**: a DELETE with `propagationPolicy: Foreground` gives the owner `deletionTimestamp` and the
//!   finalizer [`FOREGROUND_DELETION`]; the collector deletes its dependents and removes the finalizer once no
//!   dependent with `blockOwnerDeletion: true` remains, which lets the owner go.
//! - **Orphan**: a DELETE with `propagationPolicy: Orphan` gives the owner the finalizer [`ORPHAN`]; the collector
//!   removes the references to the owner from its dependents, then the finalizer.
//!
//! An owner is named by `apiVersion`, `kind`, `name` and `uid`: a namespaced owner is looked up in its
//! dependent's namespace, a cluster-scoped one cluster-wide, and a reference whose object is missing or has
//! another uid names an owner that is gone. A reference the collector cannot resolve (a kind this server does not
//! serve, a namespaced owner of a cluster-scoped object, a missing field) leaves its dependent alone, as
//! kube-controller-manager leaves it (it retries such objects forever).
//!
//! [`collect`] makes passes over a snapshot of all objects (one index of owners by uid per pass) until a pass
//! changes nothing, so a cascade of several levels completes in one call; [`run`] calls it every
//! `Config::gc_interval` and skips the call while nothing has changed since the last settled one. Every write goes
//! through the `objects` helpers and so through [`Store::mutate`], each one guarded so that it applies only to
//! the state it was decided on: deletions carry uid and resourceVersion preconditions, reference and finalizer
//! removals are JSON patches that `test` the lists they replace. A write that loses a race changes nothing and
//! is decided again on the next pass.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{
    error::ApiError,
    objects::{self, Context, DeleteOptions, Deleted, FieldValidation},
    patch::PatchType,
    registry::{Registry, ResourceDef},
    store::Store,
};

/// The finalizer of a foreground deletion: the owner stays until no dependent blocks its deletion.
pub const FOREGROUND_DELETION: &str = "foregroundDeletion";

/// The finalizer of an orphaning deletion: the owner stays until its dependents no longer reference it.
pub const ORPHAN: &str = "orphan";

/// At most this many passes per [`collect`] call; a deeper cascade continues on the next call.
const MAX_PASSES: usize = 16;

/// How long [`run`] waits before retrying work that failed, when nothing else changes meanwhile.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A sweep reads every stored object, so its cost grows with the store: at 100,000 objects under a steady write
/// load (which makes it sweep every interval) it took over a quarter of the server's CPU. After a sweep that took
/// `t`, [`run`] rests `t` times this, so that sweeps take at most a tenth of the time whatever the store's size
/// (small stores sweep in microseconds and keep the interval).
const IDLE_PER_BUSY: u32 = 9;

/// What one [`collect`] call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Passes made.
    pub passes: usize,
    /// Dependents deleted (gone at once, or marked for deletion when they have finalizers).
    pub deleted: usize,
    /// Dependents whose ownerReferences were removed (or made non-blocking).
    pub unlinked: usize,
    /// Owners whose `orphan` or `foregroundDeletion` finalizer was removed.
    pub finalized: usize,
    /// Writes that failed for another reason than a lost race (they are retried later).
    pub errors: usize,
    /// The resourceVersion at which the last pass found nothing to do, if it did: until the store changes, another
    /// call would do nothing either.
    pub settled_at: Option<u64>,
}

/// The finalizers of an object being deleted, as kube-apiserver sets them for the garbage collector: an explicit
/// `Orphan` or `Foreground` policy adds its finalizer (and drops the other's), an explicit `Background` drops
/// both, and without a policy the object's own `orphan` or `foregroundDeletion` finalizer stays. Called by
/// `objects::delete` on the object it is about to store; the finalizers are left untouched unless they change.
pub fn apply_propagation_policy(object: &mut Value, policy: Option<&str>) {
    let current: Vec<String> = finalizers_of(object).map(str::to_owned).collect();
    let (orphan, foreground) = match policy {
        Some("Orphan") => (true, false),
        Some("Foreground") => (false, true),
        Some(_) => (false, false),
        None => current
            .iter()
            .find(|f| *f == ORPHAN || *f == FOREGROUND_DELETION)
            .map_or((false, false), |f| (f == ORPHAN, f == FOREGROUND_DELETION)),
    };
    let mut wanted: Vec<String> = current
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND_DELETION)
        .cloned()
        .collect();
    if orphan {
        wanted.push(ORPHAN.to_owned());
    }
    if foreground {
        wanted.push(FOREGROUND_DELETION.to_owned());
    }
    if wanted.iter().collect::<BTreeSet<_>>() == current.iter().collect::<BTreeSet<_>>() {
        return;
    }
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if wanted.is_empty() {
        meta.remove("finalizers");
    } else {
        meta.insert("finalizers".into(), json!(wanted));
    }
}

/// Runs [`collect`] every `every` until `shutdown` changes, on a blocking thread (writes fsync), skipping the
/// call while the store has not changed since the last call settled, and resting after each call
/// ([`IDLE_PER_BUSY`]). Failed writes are retried after a while even when nothing changes.
pub async fn run(
    store: Arc<Store>,
    registry: crate::registry::SharedRegistry,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(every.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The resourceVersion of the last settled call and, when it had failures, when to retry them.
    let mut settled: Option<(u64, Option<Instant>)> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        if let Some((rv, retry)) = settled
            && rv == store.current_rv()
            && retry.is_none_or(|at| Instant::now() < at)
        {
            continue;
        }
        // The resources served now: custom resources of CRDs created since the last call included.
        let (sweep_store, sweep_registry) = (Arc::clone(&store), registry.current());
        let started = Instant::now();
        let sweep = tokio::task::spawn_blocking(move || {
            collect(&sweep_store, &sweep_registry, jiff::Timestamp::now())
        });
        let result = sweep.await;
        // The next tick is due `every` after this sweep's start: resting `t × IDLE_PER_BUSY` after a sweep that took
        // `t` makes the cycle max(`every`, `t × (1 + IDLE_PER_BUSY)`).
        let rest = started.elapsed().saturating_mul(IDLE_PER_BUSY);
        if rest >= Duration::from_millis(1) {
            tracing::debug!(
                sweep_ms = started.elapsed().as_millis(),
                rest_ms = rest.as_millis(),
                "long garbage collection sweep; resting"
            );
            tokio::select! {
                () = tokio::time::sleep(rest) => {}
                _ = shutdown.changed() => return,
            }
        }
        settled = match result {
            Ok(report) => report
                .settled_at
                .map(|rv| (rv, (report.errors > 0).then(|| Instant::now() + RETRY_AFTER))),
            Err(err) => {
                tracing::error!(error = %err, "the garbage collector failed");
                None
            }
        };
    }
}

/// Collects garbage: deletes dependents whose owners are gone or deleting in the foreground, removes references
/// to owners that are gone from dependents that keep other owners, orphans the dependents of owners deleted with
/// `Orphan`, and removes the `foregroundDeletion` and `orphan` finalizers once their work is done. Passes repeat
/// until one changes nothing (at most a fixed number per call).
pub fn collect(store: &Store, registry: &Registry, now: jiff::Timestamp) -> Report {
    let kinds = Kinds::new(registry);
    let mut report = Report::default();
    while report.passes < MAX_PASSES {
        let rv = store.current_rv();
        report.passes += 1;
        let items = snapshot(store, registry);
        if pass(store, &kinds, &items, now, &mut report) == 0 {
            report.settled_at = Some(rv);
            break;
        }
    }
    report
}

/// The served kinds by apiVersion and kind.
struct Kinds(HashMap<String, HashMap<String, Arc<ResourceDef>>>);

impl Kinds {
    fn new(registry: &Registry) -> Self {
        let mut kinds: HashMap<String, HashMap<String, Arc<ResourceDef>>> = HashMap::new();
        for def in registry.all() {
            kinds
                .entry(def.api_version())
                .or_default()
                .insert(def.kind.clone(), Arc::clone(def));
        }
        Self(kinds)
    }

    fn get(&self, api_version: &str, kind: &str) -> Option<&Arc<ResourceDef>> {
        self.0.get(api_version)?.get(kind)
    }
}

/// One object of the snapshot.
struct Item {
    def: Arc<ResourceDef>,
    object: Arc<Value>,
}

impl Item {
    fn meta_str(&self, field: &str) -> &str {
        self.object["metadata"][field].as_str().unwrap_or_default()
    }

    fn uid(&self) -> &str {
        self.meta_str("uid")
    }

    fn namespace(&self) -> &str {
        self.meta_str("namespace")
    }

    fn name(&self) -> &str {
        self.meta_str("name")
    }

    fn owner_references(&self) -> &[Value] {
        self.object["metadata"]["ownerReferences"]
            .as_array()
            .map_or(&[], Vec::as_slice)
    }

    fn context(&self, now: jiff::Timestamp) -> Context {
        Context {
            def: Arc::clone(&self.def),
            namespace: if self.def.namespaced {
                self.namespace().to_owned()
            } else {
                String::new()
            },
            now,
            field_validation: FieldValidation::Ignore,
            admission: false,
            manager: None,
            dry_run: false,
        }
    }
}

fn finalizers_of(object: &Value) -> impl Iterator<Item = &str> {
    object["metadata"]["finalizers"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(Value::as_str)
}

fn reference_uid(reference: &Value) -> &str {
    reference["uid"].as_str().unwrap_or_default()
}

fn blocks(reference: &Value) -> bool {
    reference["blockOwnerDeletion"].as_bool() == Some(true)
}

/// Every object of every served resource. The lists are taken one resource after the other, not atomically: an
/// owner missing from the snapshot is therefore checked again in the store before anything is done about it.
fn snapshot(store: &Store, registry: &Registry) -> Vec<Item> {
    let mut items = Vec::new();
    for def in registry.stored() {
        let (objects, _) = store.list(&objects::resource_id(&def), None);
        items.extend(objects.into_iter().map(|object| Item {
            def: Arc::clone(&def),
            object,
        }));
    }
    items
}

/// What an ownerReference names.
enum Owner<'a> {
    /// The reference cannot be resolved: its dependent is left alone.
    Unresolvable,
    /// No object of that resource, namespace, name and uid is in the snapshot.
    Absent {
        def: &'a Arc<ResourceDef>,
        namespace: &'a str,
        name: &'a str,
        uid: &'a str,
    },
    /// The owner, by its index in the snapshot.
    Live(usize),
}

/// An object of the snapshot with what the collector reads of it, parsed once per pass.
struct Node<'a> {
    item: &'a Item,
    uid: &'a str,
    namespace: &'a str,
    name: &'a str,
    deleting: bool,
    orphan: bool,
    foreground: bool,
    references: &'a [Value],
}

impl<'a> Node<'a> {
    fn new(item: &'a Item) -> Self {
        let meta = &item.object["metadata"];
        let text = |field: &str| meta[field].as_str().unwrap_or_default();
        let (mut orphan, mut foreground) = (false, false);
        for finalizer in finalizers_of(&item.object) {
            orphan |= finalizer == ORPHAN;
            foreground |= finalizer == FOREGROUND_DELETION;
        }
        Self {
            item,
            uid: text("uid"),
            namespace: text("namespace"),
            name: text("name"),
            deleting: crate::metadata::is_deleting(&item.object),
            orphan,
            foreground,
            references: item.owner_references(),
        }
    }

    /// Being deleted in the foreground: waiting for its blocking dependents.
    fn deleting_dependents(&self) -> bool {
        self.deleting && self.foreground
    }
}

/// The snapshot with its index: objects by uid, what each reference resolves to, and the dependents of each object
/// (by index, with whether their reference blocks the owner's deletion).
struct Graph<'a> {
    nodes: Vec<Node<'a>>,
    owners: Vec<Vec<Owner<'a>>>,
    dependents: Vec<Vec<(usize, bool)>>,
}

impl<'a> Graph<'a> {
    fn new(items: &'a [Item], kinds: &'a Kinds) -> Self {
        let nodes: Vec<Node> = items.iter().map(Node::new).collect();
        let by_uid: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| !node.uid.is_empty())
            .map(|(index, node)| (node.uid, index))
            .collect();
        let mut dependents = vec![Vec::new(); nodes.len()];
        let owners = nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                node.references
                    .iter()
                    .map(|reference| {
                        let owner = resolve(kinds, &nodes, &by_uid, node, reference);
                        if let Owner::Live(owner) = owner {
                            dependents[owner].push((index, blocks(reference)));
                        }
                        owner
                    })
                    .collect()
            })
            .collect();
        Self {
            nodes,
            owners,
            dependents,
        }
    }
}

/// The owner a reference of `dependent` names, as kube-controller-manager finds it: by apiVersion and kind, in
/// the dependent's namespace when the owner's kind is namespaced, by name, and with the same uid.
fn resolve<'a>(
    kinds: &'a Kinds,
    nodes: &[Node<'a>],
    by_uid: &HashMap<&str, usize>,
    dependent: &Node<'a>,
    reference: &'a Value,
) -> Owner<'a> {
    let field = |name: &str| reference[name].as_str().filter(|v| !v.is_empty());
    let (Some(api_version), Some(kind), Some(name), Some(uid)) =
        (field("apiVersion"), field("kind"), field("name"), field("uid"))
    else {
        return Owner::Unresolvable;
    };
    let Some(def) = kinds.get(api_version, kind) else {
        return Owner::Unresolvable;
    };
    if def.namespaced && !dependent.item.def.namespaced {
        return Owner::Unresolvable;
    }
    let namespace = if def.namespaced { dependent.namespace } else { "" };
    match by_uid.get(uid).map(|&index| (index, &nodes[index])) {
        Some((index, owner))
            if Arc::ptr_eq(&owner.item.def, def) && owner.namespace == namespace && owner.name == name =>
        {
            Owner::Live(index)
        }
        _ => Owner::Absent {
            def,
            namespace,
            name,
            uid,
        },
    }
}

/// One pass over a snapshot; returns how many writes it made.
fn pass(store: &Store, kinds: &Kinds, items: &[Item], now: jiff::Timestamp, report: &mut Report) -> usize {
    let graph = Graph::new(items, kinds);
    let mut writer = Writer { store, now, report };
    let before = writer.writes();
    for (index, node) in graph.nodes.iter().enumerate() {
        if node.deleting {
            // "Being deleted" is a one-way trip; only the collector's own finalizers are looked after.
            finish_owner(&graph, index, &mut writer);
        } else if !node.references.is_empty() {
            attempt_to_delete(&graph, index, &mut writer);
        }
    }
    writer.writes() - before
}

/// An owner being deleted: orphans its dependents when it has `orphan`, and removes `foregroundDeletion` once no
/// dependent blocks its deletion (kube-controller-manager's attemptToOrphan and processDeletingDependentsItem).
fn finish_owner(graph: &Graph, index: usize, writer: &mut Writer) {
    let owner = &graph.nodes[index];
    let dependents = &graph.dependents[index];
    let mut done = Vec::new();
    if owner.orphan {
        let unique: BTreeSet<usize> = dependents.iter().map(|(d, _)| *d).collect();
        let mut orphaned = true;
        for dependent in unique {
            let dependent = graph.nodes[dependent].item;
            orphaned &= writer.remove_references(dependent, &[owner.uid], "orphaned");
        }
        if orphaned {
            done.push(ORPHAN);
        }
    }
    if owner.foreground && !dependents.iter().any(|(_, blocking)| *blocking) {
        done.push(FOREGROUND_DELETION);
    }
    if !done.is_empty() {
        writer.remove_finalizers(owner.item, &done);
    }
}

/// A dependent that is not being deleted: classifies its owners as solid (there, and not deleting in the
/// foreground), dangling (gone) or waiting (deleting in the foreground), and acts as kube-controller-manager's
/// attemptToDeleteItem does.
fn attempt_to_delete(graph: &Graph, index: usize, writer: &mut Writer) {
    let node = &graph.nodes[index];
    let mut solid = false;
    let mut unlink: Vec<&str> = Vec::new();
    let mut waiting = false;
    for (reference, owner) in node.references.iter().zip(&graph.owners[index]) {
        match owner {
            Owner::Unresolvable => {
                tracing::trace!(
                    kind = node.item.def.kind, namespace = node.namespace, name = node.name,
                    reference = %reference, "ownerReference cannot be resolved; object left alone"
                );
                return;
            }
            Owner::Absent {
                def,
                namespace,
                name,
                uid,
            } => {
                // The snapshot is not atomic across resources: confirm in the store that the owner is gone.
                let current = writer.store.get(&objects::resource_id(def), namespace, name);
                if current.is_some_and(|owner| owner["metadata"]["uid"].as_str() == Some(*uid)) {
                    return;
                }
                unlink.push(uid);
            }
            Owner::Live(owner) if graph.nodes[*owner].deleting_dependents() => {
                waiting = true;
                unlink.push(reference_uid(reference));
            }
            Owner::Live(_) => solid = true,
        }
    }
    let item = node.item;
    if solid {
        // Other owners remain: the references to owners that are gone (or waiting for their dependents, which
        // would otherwise wait forever) are removed and the object stays.
        if !unlink.is_empty() {
            writer.remove_references(item, &unlink, "unlinked from owners that are gone");
        }
        return;
    }
    let dependents = &graph.dependents[index];
    if waiting && !dependents.is_empty() {
        // An owner waits for this object, which has dependents of its own: it is deleted in the foreground too.
        // When one of its dependents also waits for its own dependents, its references stop blocking first, so
        // that a cycle cannot hold the deletion forever.
        let cycle = dependents
            .iter()
            .any(|(d, _)| graph.nodes[*d].deleting_dependents());
        if cycle && node.references.iter().any(blocks) {
            writer.unblock(item);
        } else {
            writer.delete(item, "Foreground");
        }
        return;
    }
    let policy = if node.orphan {
        "Orphan"
    } else if node.foreground {
        "Foreground"
    } else {
        "Background"
    };
    writer.delete(item, policy);
}

/// The collector's writes, each guarded to apply only to the state it was decided on, and their accounting.
struct Writer<'a> {
    store: &'a Store,
    now: jiff::Timestamp,
    report: &'a mut Report,
}

impl Writer<'_> {
    fn writes(&self) -> usize {
        self.report.deleted + self.report.unlinked + self.report.finalized
    }

    /// Logs a failed write; true when it succeeded.
    fn check<T>(&mut self, item: &Item, what: &str, result: Result<T, ApiError>) -> bool {
        match result {
            Ok(_) => {
                tracing::debug!(
                    kind = item.def.kind,
                    namespace = item.namespace(),
                    name = item.name(),
                    "{what}"
                );
                true
            }
            // The object changed since the snapshot (or is gone): decided again on the next pass.
            Err(err @ (ApiError::NotFound(_) | ApiError::Conflict(_) | ApiError::Invalid(..))) => {
                tracing::debug!(
                    kind = item.def.kind, namespace = item.namespace(), name = item.name(), error = %err,
                    "garbage collection raced with another change"
                );
                false
            }
            Err(err) => {
                tracing::warn!(
                    kind = item.def.kind, namespace = item.namespace(), name = item.name(), error = %err,
                    "garbage collection could not {what}"
                );
                self.report.errors += 1;
                false
            }
        }
    }

    /// Deletes `item` with a propagation policy, provided it is still the object of the snapshot.
    fn delete(&mut self, item: &Item, policy: &str) -> bool {
        let options = DeleteOptions {
            uid: Some(item.uid().to_owned()),
            resource_version: Some(item.meta_str("resourceVersion").to_owned()),
            propagation_policy: Some(policy.to_owned()),
            ..DeleteOptions::default()
        };
        let result = objects::delete(self.store, &item.context(self.now), item.name(), &options);
        let what = match &result {
            Ok(Deleted::Gone(_)) => "deleted",
            _ => "marked for deletion",
        };
        let done = self.check(item, what, result);
        self.report.deleted += usize::from(done);
        done
    }

    /// Applies a JSON patch that starts by testing the uid of the object of the snapshot.
    fn patch(&mut self, item: &Item, what: &str, mut operations: Vec<Value>) -> bool {
        operations.insert(
            0,
            json!({ "op": "test", "path": "/metadata/uid", "value": item.uid() }),
        );
        let body = Value::Array(operations).to_string();
        let result = objects::patch(
            self.store,
            &item.context(self.now),
            item.name(),
            None,
            PatchType::Json,
            body.as_bytes(),
        );
        self.check(item, what, result)
    }

    /// Replaces the ownerReferences of `item` as they are in the snapshot with `references` (removing the field
    /// when none remain).
    fn replace_references(&mut self, item: &Item, what: &str, references: &[Value]) -> bool {
        let path = "/metadata/ownerReferences";
        let replace = if references.is_empty() {
            json!({ "op": "remove", "path": path })
        } else {
            json!({ "op": "replace", "path": path, "value": references })
        };
        let test = json!({ "op": "test", "path": path, "value": item.owner_references() });
        let done = self.patch(item, what, vec![test, replace]);
        self.report.unlinked += usize::from(done);
        done
    }

    /// Removes the references to these owner uids from `item`.
    fn remove_references(&mut self, item: &Item, uids: &[&str], what: &str) -> bool {
        let kept: Vec<Value> = item
            .owner_references()
            .iter()
            .filter(|r| !uids.contains(&reference_uid(r)))
            .cloned()
            .collect();
        if kept.len() == item.owner_references().len() {
            return true;
        }
        self.replace_references(item, what, &kept)
    }

    /// Sets `blockOwnerDeletion: false` on the references of `item` that block.
    fn unblock(&mut self, item: &Item) -> bool {
        let references: Vec<Value> = item
            .owner_references()
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if blocks(&r) {
                    r["blockOwnerDeletion"] = json!(false);
                }
                r
            })
            .collect();
        self.replace_references(item, "references made non-blocking", &references)
    }

    /// Removes these finalizers from `item`; an object being deleted goes with its last finalizer.
    fn remove_finalizers(&mut self, item: &Item, finalizers: &[&str]) -> bool {
        let path = "/metadata/finalizers";
        let current = &item.object["metadata"]["finalizers"];
        let kept: Vec<&str> = finalizers_of(&item.object)
            .filter(|f| !finalizers.contains(f))
            .collect();
        let replace = if kept.is_empty() {
            json!({ "op": "remove", "path": path })
        } else {
            json!({ "op": "replace", "path": path, "value": kept })
        };
        let test = json!({ "op": "test", "path": path, "value": current });
        let what = format!("removed the finalizers {finalizers:?}");
        let done = self.patch(item, &what, vec![test, replace]);
        self.report.finalized += usize::from(done);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry_and_store() -> (Registry, Store) {
        let registry = Registry::new();
        let store = Store::open(None, 1000).unwrap();
        objects::ensure_default_namespaces(&store, &registry).unwrap();
        (registry, store)
    }

    /// A context for a core (`v1`) resource.
    fn context(registry: &Registry, plural: &str, namespace: &str) -> Context {
        Context {
            def: registry.find("", "v1", plural).unwrap(),
            namespace: namespace.to_owned(),
            now: jiff::Timestamp::now(),
            field_validation: FieldValidation::Strict,
            admission: false,
            manager: None,
            dry_run: false,
        }
    }

    fn create(store: &Store, registry: &Registry, plural: &str, namespace: &str, object: &Value) -> Value {
        let ctx = context(registry, plural, namespace);
        objects::create(store, &ctx, object.clone()).unwrap().object
    }

    fn owner_reference(owner: &Value, block: bool) -> Value {
        json!({
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "blockOwnerDeletion": block,
        })
    }

    fn secret(name: &str, owners: &[Value]) -> Value {
        json!({ "metadata": { "name": name, "ownerReferences": owners } })
    }

    fn with_policy(finalizers: &[&str], policy: Option<&str>) -> Value {
        let mut object = json!({ "metadata": { "name": "x", "finalizers": finalizers } });
        apply_propagation_policy(&mut object, policy);
        object["metadata"]["finalizers"].clone()
    }

    #[test]
    fn the_propagation_policy_sets_the_collectors_finalizers() {
        assert_eq!(
            with_policy(&[], Some("Foreground")),
            json!(["foregroundDeletion"])
        );
        assert_eq!(with_policy(&["a"], Some("Orphan")), json!(["a", "orphan"]));
        assert_eq!(
            with_policy(&["orphan", "a"], Some("Foreground")),
            json!(["a", "foregroundDeletion"])
        );
        assert_eq!(
            with_policy(&["foregroundDeletion"], Some("Background")),
            Value::Null
        );
        assert_eq!(
            with_policy(&["a", "orphan"], None),
            json!(["a", "orphan"]),
            "no policy keeps them"
        );
        assert_eq!(
            with_policy(&[], None),
            json!([]),
            "nothing to change leaves the object as it is"
        );
        assert_eq!(with_policy(&["a"], Some("Background")), json!(["a"]));
    }

    // kube-controller-manager looks owners up live; this collector's snapshot is taken resource after resource,
    // so an owner created after its resource was listed is missing from it. The store is asked before deleting.
    #[test]
    fn an_owner_missing_only_from_the_snapshot_keeps_its_dependent() {
        let (registry, store) = registry_and_store();
        let node = create(
            &store,
            &registry,
            "nodes",
            "",
            &json!({ "metadata": { "name": "n1" } }),
        );
        let dependent = create(
            &store,
            &registry,
            "secrets",
            "default",
            &secret("s1", &[owner_reference(&node, true)]),
        );
        let kinds = Kinds::new(&registry);
        let stale: Vec<Item> = snapshot(&store, &registry)
            .into_iter()
            .filter(|item| item.def.kind != "Node")
            .collect();
        let mut report = Report::default();
        assert_eq!(
            pass(&store, &kinds, &stale, jiff::Timestamp::now(), &mut report),
            0
        );
        assert_eq!(
            store.get("/secrets", "default", "s1").as_deref(),
            Some(&dependent)
        );
    }

    #[test]
    fn references_that_cannot_be_resolved_leave_the_object_alone() {
        let (registry, store) = registry_and_store();
        let unknown_kind = json!({ "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u1" });
        let no_uid = json!({ "apiVersion": "v1", "kind": "Node", "name": "gone", "uid": "" });
        create(
            &store,
            &registry,
            "secrets",
            "default",
            &secret("s1", &[unknown_kind]),
        );
        create(&store, &registry, "secrets", "default", &secret("s2", &[no_uid]));
        // A cluster-scoped object cannot have a namespaced owner.
        let owner = create(&store, &registry, "secrets", "default", &secret("owner", &[]));
        let pv =
            json!({ "metadata": { "name": "pv1", "ownerReferences": [owner_reference(&owner, false)] } });
        create(&store, &registry, "persistentvolumes", "", &pv);
        let secrets = context(&registry, "secrets", "default");
        objects::delete(&store, &secrets, "owner", &DeleteOptions::default()).unwrap();
        let report = collect(&store, &registry, jiff::Timestamp::now());
        assert_eq!((report.deleted, report.unlinked, report.errors), (0, 0, 0));
        assert!(store.get("/secrets", "default", "s1").is_some());
        assert!(store.get("/secrets", "default", "s2").is_some());
        assert!(store.get("/persistentvolumes", "", "pv1").is_some());
        assert_eq!(report.settled_at, Some(store.current_rv()));
    }

    #[test]
    fn a_cascade_of_several_levels_completes_in_one_call_and_the_next_call_has_nothing_to_do() {
        let (registry, store) = registry_and_store();
        let node = create(
            &store,
            &registry,
            "nodes",
            "",
            &json!({ "metadata": { "name": "n1" } }),
        );
        let first = create(
            &store,
            &registry,
            "secrets",
            "default",
            &secret("a", &[owner_reference(&node, true)]),
        );
        let second = create(
            &store,
            &registry,
            "secrets",
            "default",
            &secret("b", &[owner_reference(&first, true)]),
        );
        create(
            &store,
            &registry,
            "secrets",
            "default",
            &secret("c", &[owner_reference(&second, true)]),
        );
        let nodes = context(&registry, "nodes", "");
        objects::delete(&store, &nodes, "n1", &DeleteOptions::default()).unwrap();
        let report = collect(&store, &registry, jiff::Timestamp::now());
        assert_eq!(report.deleted, 3);
        assert_eq!(
            report.passes, 4,
            "one pass per level and one that finds nothing to do"
        );
        assert!(store.list("/secrets", Some("default")).0.is_empty());
        let again = collect(&store, &registry, jiff::Timestamp::now());
        assert_eq!((again.passes, again.deleted), (1, 0));
    }
}
