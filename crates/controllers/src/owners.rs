//! Machines by their controlling owner, kept beside a reflector's store, so that a MachineSet or MachineDeployment
//! pass reads its own machines (and the orphans) instead of filtering every machine of the namespace: a pass costs
//! O(own machines), not O(all machines) (docs/benchmarks.md, issue 12).
//!
//! The index is fed the same watch events as the store, before it ([`OwnerIndex::observe`] in the stream ahead of
//! `reflect`), so it never lags the store. It only names machines: a pass looks each name up in the store and decides
//! from the object it finds there (ownership included), so a name the index still holds for a moment after a change
//! costs a lookup and nothing else.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use kube::runtime::{reflector::ObjectRef, reflector::Store, watcher};
use mcm_api::{Machine, MetaExt};

/// The uid of `machine`'s controlling owner, `""` for an orphan.
fn controller_uid(machine: &Machine) -> &str {
    machine.controller_ref().map_or("", |owner| owner.uid.as_str())
}

/// The node `machine`'s `node` label names, `""` without one.
fn node_label(machine: &Machine) -> &str {
    machine.node_name().unwrap_or_default()
}

/// What an index files a machine under.
type KeyOf = fn(&Machine) -> &str;

/// One complete picture: owner uid → machine names, and machine name → owner uid.
#[derive(Debug)]
struct Index {
    key_of: KeyOf,
    by_owner: HashMap<String, BTreeSet<String>>,
    owner_of: HashMap<String, String>,
}

impl Index {
    fn new(key_of: KeyOf) -> Self {
        Self {
            key_of,
            by_owner: HashMap::new(),
            owner_of: HashMap::new(),
        }
    }

    fn insert(&mut self, machine: &Machine) {
        let Some(name) = machine.metadata.name.as_deref() else {
            return;
        };
        let uid = (self.key_of)(machine);
        if self.owner_of.get(name).is_some_and(|old| old == uid) {
            return;
        }
        self.remove(name);
        self.owner_of.insert(name.to_owned(), uid.to_owned());
        self.by_owner
            .entry(uid.to_owned())
            .or_default()
            .insert(name.to_owned());
    }

    fn remove(&mut self, name: &str) {
        if let Some(old) = self.owner_of.remove(name)
            && let Some(names) = self.by_owner.get_mut(&old)
        {
            names.remove(name);
            if names.is_empty() {
                self.by_owner.remove(&old);
            }
        }
    }
}

/// Machine names by controlling owner uid (or, [`OwnerIndex::by_node`], by the node their `node` label names);
/// cheap to clone (shared).
#[derive(Clone, Debug)]
pub(crate) struct OwnerIndex(Arc<Mutex<State>>);

impl Default for OwnerIndex {
    fn default() -> Self {
        Self::keyed(controller_uid, true)
    }
}

#[derive(Debug)]
struct State {
    current: Index,
    /// The picture a relist is building; it replaces `current` when the relist is done (as the store does).
    relisting: Option<Index>,
    /// Machines whose last event took them from one owner to another: name → (the owner they left, the
    /// resourceVersion of that event). An entry goes with the machine's next event or its deletion. Kept by the owner
    /// index only (`None` for [`OwnerIndex::by_node`], whose moves nobody reads).
    moved: Option<HashMap<String, (String, String)>>,
}

impl State {
    /// Notes whether `machine`'s event takes it from one (non-empty) key to another, by the picture in place now.
    fn note_move(&mut self, machine: &Machine) {
        let (Some(moved), Some(name)) = (self.moved.as_mut(), machine.metadata.name.as_deref()) else {
            return;
        };
        let key = (self.current.key_of)(machine);
        match self.current.owner_of.get(name) {
            Some(old) if !old.is_empty() && old != key => {
                let version = machine.metadata.resource_version.clone().unwrap_or_default();
                moved.insert(name.to_owned(), (old.clone(), version));
            }
            _ => {
                moved.remove(name);
            }
        }
    }
}

impl OwnerIndex {
    fn keyed(key_of: KeyOf, track_moves: bool) -> Self {
        Self(Arc::new(Mutex::new(State {
            current: Index::new(key_of),
            relisting: None,
            moved: track_moves.then(HashMap::new),
        })))
    }

    /// Machine names by the node their `node` label names: the machine of a node without a scan of every machine
    /// (a scan per node deletion made the node deletion controller's cost quadratic in the machines).
    pub(crate) fn by_node() -> Self {
        Self::keyed(node_label, false)
    }

    /// Applies one watch event (put this in the watch stream ahead of the store's `reflect`).
    pub(crate) fn observe(&self, event: &watcher::Event<Machine>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(machine) => {
                state.note_move(machine);
                state.current.insert(machine);
            }
            watcher::Event::Delete(machine) => {
                if let Some(name) = machine.metadata.name.as_deref() {
                    state.current.remove(name);
                    if let Some(moved) = state.moved.as_mut() {
                        moved.remove(name);
                    }
                }
            }
            watcher::Event::Init => state.relisting = Some(Index::new(state.current.key_of)),
            watcher::Event::InitApply(machine) => {
                state.note_move(machine);
                let key_of = state.current.key_of;
                state
                    .relisting
                    .get_or_insert_with(|| Index::new(key_of))
                    .insert(machine);
            }
            watcher::Event::InitDone => {
                if let Some(fresh) = state.relisting.take() {
                    state.current = fresh;
                }
            }
        }
    }

    /// The key (owner uid) `machine` left with the very event that carries this version of it, if it came from
    /// another one: the MachineSet controller reconciles the set a machine left too (the reference's `updateMachine`
    /// enqueues the old controller), so that the old set's status stops counting it.
    pub(crate) fn moved_from(&self, machine: &Machine) -> Option<String> {
        let state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (old, version) = state.moved.as_ref()?.get(machine.metadata.name.as_deref()?)?;
        (machine.metadata.resource_version.as_ref() == Some(version)).then(|| old.clone())
    }

    /// The machines of `store` controlled by the owner of `uid`, and, with `orphans`, those without a controller too.
    pub(crate) fn machines(
        &self,
        store: &Store<Machine>,
        namespace: &str,
        uid: &str,
        orphans: bool,
    ) -> Vec<Arc<Machine>> {
        let names: Vec<String> = {
            let state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let owned = state.current.by_owner.get(uid).into_iter().flatten();
            let orphaned = state
                .current
                .by_owner
                .get("")
                .into_iter()
                .flatten()
                .filter(|_| orphans && !uid.is_empty());
            owned.chain(orphaned).cloned().collect()
        };
        names
            .iter()
            .filter_map(|name| store.get(&ObjectRef::new(name).within(namespace)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::reflector;

    use super::*;

    fn machine(name: &str, owner: Option<&str>) -> Machine {
        let machine = mcm_api::builders::MachineBuilder::new(name).namespace("ns");
        match owner {
            Some(uid) => machine
                .owner(OwnerReference {
                    uid: uid.into(),
                    controller: Some(true),
                    kind: "MachineSet".into(),
                    ..OwnerReference::default()
                })
                .build(),
            None => machine.build(),
        }
    }

    fn names(machines: &[Arc<Machine>]) -> Vec<String> {
        let mut names: Vec<String> = machines
            .iter()
            .map(|m| m.metadata.name.clone().unwrap_or_default())
            .collect();
        names.sort();
        names
    }

    /// Feeds `events` to a store and the index as the controllers' streams do.
    fn fed(events: Vec<watcher::Event<Machine>>) -> (Store<Machine>, OwnerIndex) {
        let (store, mut writer) = reflector::store::<Machine>();
        let index = OwnerIndex::default();
        for event in events {
            index.observe(&event);
            writer.apply_watcher_event(&event);
        }
        (store, index)
    }

    #[test]
    fn a_set_reads_its_own_machines_and_the_orphans_only() {
        let (store, index) = fed(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(machine("a1", Some("A"))),
            watcher::Event::InitApply(machine("b1", Some("B"))),
            watcher::Event::InitApply(machine("o1", None)),
            watcher::Event::InitDone,
            watcher::Event::Apply(machine("a2", Some("A"))),
        ]);
        assert_eq!(
            names(&index.machines(&store, "ns", "A", true)),
            ["a1", "a2", "o1"]
        );
        assert_eq!(names(&index.machines(&store, "ns", "A", false)), ["a1", "a2"]);
        assert_eq!(names(&index.machines(&store, "ns", "B", false)), ["b1"]);
        assert!(index.machines(&store, "ns", "C", false).is_empty());
    }

    #[test]
    fn by_node_finds_the_machines_whose_node_label_names_the_node_and_follows_relabels_and_relists() {
        let on = |name: &str, node: &str| {
            mcm_api::builders::MachineBuilder::new(name)
                .namespace("ns")
                .label(mcm_api::keys::labels::NODE, node)
                .build()
        };
        let (store, mut writer) = reflector::store::<Machine>();
        let index = OwnerIndex::by_node();
        let mut feed = |event: watcher::Event<Machine>| {
            index.observe(&event);
            writer.apply_watcher_event(&event);
        };
        feed(watcher::Event::Init);
        feed(watcher::Event::InitApply(on("m1", "n1")));
        feed(watcher::Event::InitApply(on("m2", "n2")));
        feed(watcher::Event::InitApply(machine("m3", None)));
        feed(watcher::Event::InitDone);
        assert_eq!(names(&index.machines(&store, "ns", "n1", false)), ["m1"]);
        feed(watcher::Event::Apply(on("m1", "n2")));
        assert!(index.machines(&store, "ns", "n1", false).is_empty());
        assert_eq!(names(&index.machines(&store, "ns", "n2", false)), ["m1", "m2"]);
        assert!(
            index.0.lock().unwrap().moved.is_none(),
            "moves between nodes are not kept"
        );
        feed(watcher::Event::Init);
        feed(watcher::Event::InitApply(on("m2", "n2")));
        feed(watcher::Event::InitDone);
        assert_eq!(
            names(&index.machines(&store, "ns", "n2", false)),
            ["m2"],
            "a relist forgets the machines gone meanwhile"
        );
    }

    #[test]
    fn adoption_release_and_deletion_move_a_machine() {
        let (store, index) = fed(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(machine("m", None)),
            watcher::Event::InitDone,
            // Adopted by A, released, adopted by B, deleted.
            watcher::Event::Apply(machine("m", Some("A"))),
        ]);
        assert_eq!(names(&index.machines(&store, "ns", "A", false)), ["m"]);
        index.observe(&watcher::Event::Apply(machine("m", None)));
        assert!(index.machines(&store, "ns", "A", false).is_empty());
        index.observe(&watcher::Event::Apply(machine("m", Some("B"))));
        assert_eq!(names(&index.machines(&store, "ns", "B", false)), ["m"]);
        index.observe(&watcher::Event::Delete(machine("m", Some("B"))));
        assert!(index.machines(&store, "ns", "B", false).is_empty());
        assert!(index.0.lock().unwrap().current.owner_of.is_empty());
    }

    #[test]
    fn a_move_between_owners_names_the_owner_left_for_that_event_only() {
        let versioned = |owner: Option<&str>, rv: &str| {
            let mut machine = machine("m", owner);
            machine.metadata.resource_version = Some(rv.into());
            machine
        };
        let index = OwnerIndex::default();
        index.observe(&watcher::Event::Apply(versioned(None, "1")));
        index.observe(&watcher::Event::Apply(versioned(Some("A"), "2")));
        assert_eq!(
            index.moved_from(&versioned(Some("A"), "2")),
            None,
            "an adoption leaves no owner"
        );
        index.observe(&watcher::Event::Apply(versioned(Some("B"), "3")));
        assert_eq!(index.moved_from(&versioned(Some("B"), "3")).as_deref(), Some("A"));
        assert_eq!(
            index.moved_from(&versioned(Some("B"), "4")),
            None,
            "another version"
        );
        index.observe(&watcher::Event::Apply(versioned(Some("B"), "4")));
        assert_eq!(
            index.moved_from(&versioned(Some("B"), "3")),
            None,
            "gone with the next event"
        );
        // A relist that finds the machine with another owner than the picture in place counts as a move too.
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(versioned(Some("C"), "5")));
        index.observe(&watcher::Event::InitDone);
        assert_eq!(index.moved_from(&versioned(Some("C"), "5")).as_deref(), Some("B"));
        index.observe(&watcher::Event::Delete(versioned(Some("C"), "6")));
        assert!(
            index
                .0
                .lock()
                .unwrap()
                .moved
                .as_ref()
                .is_some_and(HashMap::is_empty)
        );
    }

    #[test]
    fn a_relist_replaces_the_picture_when_it_is_done() {
        let (store, index) = fed(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(machine("gone", Some("A"))),
            watcher::Event::InitDone,
        ]);
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(machine("new", Some("A"))));
        // Until the relist is done, the old picture holds.
        assert_eq!(
            index.0.lock().unwrap().current.by_owner["A"],
            BTreeSet::from(["gone".to_owned()])
        );
        index.observe(&watcher::Event::InitDone);
        assert_eq!(
            index.0.lock().unwrap().current.by_owner["A"],
            BTreeSet::from(["new".to_owned()])
        );
        // The store has not seen the relist here: only names it holds come back.
        assert!(index.machines(&store, "ns", "A", false).is_empty());
    }
}
