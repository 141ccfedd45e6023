//! Orphan VM collection and unmanaged nodes (reference §3.9, the machine controller's safety loop; spec 002 "Safety
//! Controller", "How to avoid garbage collection of your node"; spec 000 ListMachines, and GetMachineStatus
//! `OutOfRange` "Multiple VMs found").
//!
//! **Orphan VMs.** Every pass, the controller asks each MachineClass's provider for the VMs of its cluster
//! (ListMachines: provider ID → machine name) and then lists the Machine objects. A listed VM is an orphan when
//! - no Machine of its machine name exists ([`OrphanReason::NoMachine`]), or
//! - its Machine exists but records another, non-empty provider ID and is not being created
//!   ([`OrphanReason::Duplicate`]: a second VM for one machine, which makes GetMachineStatus answer `OutOfRange`).
//!
//! A Machine is *being created* while its provider ID is empty or its phase is empty or CrashLoopBackOff (reference:
//! "whose phase is not empty and not CrashLoopBackOff"; a Pending machine without provider ID has not recorded its
//! VM yet). Its VMs are never orphans: the creation flow itself decides about them (adopt, or delete a stale one).
//! A VM whose machine name is empty is never an orphan either: DeleteMachine needs a machine name (spec 000:
//! "make sure that it is in the desired format and not a blank value"), and a VM without one was not made by us.
//!
//! **Never a young VM.** ListMachines tells no creation time, so the age of a VM is how long this controller has
//! seen it: [`FirstSeen`] maps each listed provider ID to the first pass that listed it. The caller keeps it between
//! passes (it is passed in and returned by [`decide_vms`]); a VM absent from a pass's answers is forgotten, so one
//! that comes back (or whose class's ListMachines failed for a pass) starts its grace again. An orphan candidate is
//! collected only once it has been seen for at least the grace period; until then it is [`VmPlan::waiting`] and
//! [`VmPlan::recheck_at`] tells when the earliest one matures. After a restart every VM is new: nothing is deleted
//! before a whole grace period has passed, whatever the caches or a former leader were doing.
//!
//! The caller must call ListMachines **before** it lists the Machines: a VM is created by the machine controller only
//! after its Machine exists, so every VM the answers hold that has a Machine shows that Machine in the later list.
//! Right before each deletion the caller checks the Machine of the name again ([`classify`]), for a Machine created
//! in between with the name of an orphan.
//!
//! **Unmanaged nodes.** A Node that no Machine claims and that is older than the creation timeout gets the annotation
//! `node.machine.sapcloud.io/not-managed-by-mcm=1`, and loses the node finalizer
//! `node.machine.sapcloud.io/machine-controller` (nothing would ever remove it); the annotation goes again once a
//! Machine claims the node ([`decide_nodes`]). A Machine claims a node when its `node` label names it, when both carry
//! the same non-empty provider ID, when the node's `node.gardener.cloud/machine-name` label names the Machine, or when
//! a Machine without `node` label has the node's name (providers that name nodes after machines, before the label is
//! written).

use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::{Resource as _, api::core::v1::Node};
use mcm_api::{
    ClassSpec, Machine, MachineClass, MachinePhase, MetaExt,
    keys::{annotations, finalizers, labels},
};
use serde_json::{Value, json};

use crate::timeouts;

/// `--machine-safety-orphan-vms-period`: how often the orphan VM collection runs (15m, reference §3.9 and §8.2).
pub const DEFAULT_PERIOD: Duration = Duration::from_mins(15);

/// How long a VM must have been seen before it may be collected (5m; this project's, the reference has none).
///
/// A VM is seen first at a pass, so it is collected between one grace and one period plus one grace after it
/// appears. Five minutes is far longer than any window in which a VM of ours can look orphaned (a create answer
/// in flight, a watch lagging, a leader hand-over of a 15s lease, #318), and short next to the 15m period, so an
/// orphan costs at most one extra pass: the controller looks again when the grace ends ([`VmPlan::recheck_at`]).
pub const DEFAULT_GRACE: Duration = Duration::from_mins(5);

/// The value of the annotation `node.machine.sapcloud.io/not-managed-by-mcm` on an unmanaged node.
pub const NOT_MANAGED_VALUE: &str = "1";

/// Per listed provider ID: when a pass first saw it (kept by the caller between passes).
pub type FirstSeen = BTreeMap<String, Timestamp>;

/// Why a VM is an orphan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrphanReason {
    /// No Machine of the VM's machine name exists.
    NoMachine,
    /// The Machine exists and records another VM: this one is extra.
    Duplicate {
        /// The provider ID the Machine records.
        machine_provider_id: String,
    },
}

/// A VM to delete (or to report, in a dry run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanVm {
    /// The VM's provider ID.
    pub provider_id: String,
    /// The machine name the provider lists for it.
    pub machine_name: String,
    /// The class whose ListMachines listed it (the first in name order when several did); DeleteMachine goes
    /// through this class and its secret.
    pub class: String,
    /// Why it is an orphan.
    pub reason: OrphanReason,
}

impl OrphanVm {
    /// A human-readable account, naming the provider ID, the machine and the class (no secret is ever involved).
    pub fn describe(&self) -> String {
        match &self.reason {
            OrphanReason::NoMachine => format!(
                "VM {} of machine {:?} (class {}) has no Machine object",
                self.provider_id, self.machine_name, self.class
            ),
            OrphanReason::Duplicate { machine_provider_id } => format!(
                "VM {} of machine {:?} (class {}) is extra: the machine's VM is {machine_provider_id}",
                self.provider_id, self.machine_name, self.class
            ),
        }
    }
}

/// What one listed VM is, given the Machine of its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The VM of its Machine.
    Managed,
    /// Its Machine is being created: the creation flow decides about its VMs.
    BeingCreated,
    /// The VM's machine name is empty: not ours to delete.
    Unnamed,
    /// An orphan.
    Orphan(OrphanReason),
}

/// Whether a machine is being created: no provider ID recorded yet, or phase empty or CrashLoopBackOff.
pub fn being_created(machine: &Machine) -> bool {
    machine.spec.provider_id.is_empty()
        || matches!(machine.phase(), None | Some(MachinePhase::CrashLoopBackOff))
}

/// What the VM `provider_id` listed for `machine_name` is, `machine` being the Machine of that name if one exists.
pub fn classify(provider_id: &str, machine_name: &str, machine: Option<&Machine>) -> Verdict {
    if machine_name.is_empty() {
        return Verdict::Unnamed;
    }
    match machine {
        None => Verdict::Orphan(OrphanReason::NoMachine),
        Some(machine) if machine.spec.provider_id == provider_id => Verdict::Managed,
        Some(machine) if being_created(machine) => Verdict::BeingCreated,
        Some(machine) => Verdict::Orphan(OrphanReason::Duplicate {
            machine_provider_id: machine.spec.provider_id.clone(),
        }),
    }
}

/// The inputs of one pass over the VMs. `M` is a Machine or a shared one (`Arc<Machine>`, from a cache).
#[derive(Clone, Copy, Debug)]
pub struct VmInput<'a, M: Borrow<Machine> = Machine> {
    /// Per class name, its ListMachines answer (provider ID → machine name). Classes whose call failed are left out.
    pub listed: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// The Machine objects of the namespace, read after the ListMachines calls.
    pub machines: &'a [M],
    /// Now.
    pub now: Timestamp,
    /// How long a VM must have been seen before it is collected.
    pub grace: Duration,
}

/// An orphan candidate still within its grace period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The candidate.
    pub vm: OrphanVm,
    /// When it may be collected.
    pub collectable_at: Timestamp,
}

/// The outcome of a pass over the VMs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct VmPlan {
    /// The orphans to delete (or report), in provider ID order.
    pub orphans: Vec<OrphanVm>,
    /// Orphan candidates not seen for long enough yet, in provider ID order.
    pub waiting: Vec<Waiting>,
    /// The sightings to keep for the next pass: every VM listed by this pass, with its first sighting.
    pub first_seen: FirstSeen,
    /// When the earliest waiting candidate may be collected (a pass then collects it), `None` without candidates.
    pub recheck_at: Option<Timestamp>,
}

/// Decides the orphans of a pass (see the module documentation); `first_seen` is the previous pass's
/// [`VmPlan::first_seen`] (empty at the first pass).
pub fn decide_vms<M: Borrow<Machine>>(input: &VmInput<'_, M>, mut first_seen: FirstSeen) -> VmPlan {
    let machines: BTreeMap<&str, &Machine> = input
        .machines
        .iter()
        .map(Borrow::borrow)
        .filter_map(|m: &Machine| Some((m.metadata.name.as_deref()?, m)))
        .collect();
    // One entry per provider ID: the first class (in name order) that listed it.
    let mut vms: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (class, answer) in input.listed {
        for (provider_id, machine_name) in answer {
            vms.entry(provider_id.as_str())
                .or_insert((machine_name.as_str(), class.as_str()));
        }
    }
    first_seen.retain(|provider_id, _| vms.contains_key(provider_id.as_str()));
    let mut plan = VmPlan::default();
    for (provider_id, (machine_name, class)) in vms {
        let seen = *first_seen.entry(provider_id.to_owned()).or_insert(input.now);
        let Verdict::Orphan(reason) =
            classify(provider_id, machine_name, machines.get(machine_name).copied())
        else {
            continue;
        };
        let vm = OrphanVm {
            provider_id: provider_id.to_owned(),
            machine_name: machine_name.to_owned(),
            class: class.to_owned(),
            reason,
        };
        let collectable_at = timeouts::add(seen, input.grace);
        if input.now >= collectable_at {
            plan.orphans.push(vm);
        } else {
            plan.recheck_at = Some(plan.recheck_at.map_or(collectable_at, |t| t.min(collectable_at)));
            plan.waiting.push(Waiting { vm, collectable_at });
        }
    }
    plan.first_seen = first_seen;
    plan
}

/// A Machine with the orphan's machine name and provider ID in `namespace`, of its class: the machine of the
/// DeleteMachine request for it (never stored in the API server).
pub fn stand_in(vm: &OrphanVm, namespace: &str) -> Machine {
    let mut machine = Machine::default();
    machine.metadata.name = Some(vm.machine_name.clone());
    machine.metadata.namespace = Some(namespace.to_owned());
    machine.spec.class = ClassSpec {
        kind: MachineClass::KIND.to_owned(),
        name: vm.class.clone(),
        ..ClassSpec::default()
    };
    machine.spec.provider_id.clone_from(&vm.provider_id);
    machine
}

/// Whether `machine` claims `node` (see the module documentation).
pub fn claims(machine: &Machine, node: &Node) -> bool {
    let Some(node_name) = node.metadata.name.as_deref() else {
        return false;
    };
    let machine_name = machine.metadata.name.as_deref().unwrap_or_default();
    let node_label = machine.node_name();
    let node_provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default();
    let named_by_node = node
        .label(labels::NODE_MACHINE_NAME)
        .is_some_and(|n| !n.is_empty() && n == machine_name);
    node_label.map_or(machine_name == node_name, |label| label == node_name)
        || (!node_provider_id.is_empty() && machine.spec.provider_id == node_provider_id)
        || named_by_node
}

/// What the Machines of a namespace claim, indexed so that asking about one node costs O(log N) instead of a scan
/// of every machine ([`claims`] over all of them made a pass O(nodes × machines)).
#[derive(Debug, Default)]
pub struct Claims<'a> {
    /// The `node` labels of the machines that have one.
    labelled: BTreeSet<&'a str>,
    /// The names of the machines without a `node` label (they claim the node of their own name).
    unlabelled: BTreeSet<&'a str>,
    /// Every machine's name (a node's `machine-name` label names one).
    names: BTreeSet<&'a str>,
    /// The machines' non-empty provider IDs.
    provider_ids: BTreeSet<&'a str>,
}

impl<'a> Claims<'a> {
    /// Indexes `machines`.
    pub fn of<M: Borrow<Machine>>(machines: &'a [M]) -> Self {
        let mut claims = Self::default();
        for machine in machines.iter().map(Borrow::borrow) {
            let name = machine.metadata.name.as_deref().unwrap_or_default();
            claims.names.insert(name);
            match machine.node_name() {
                Some(label) => claims.labelled.insert(label),
                None => claims.unlabelled.insert(name),
            };
            if !machine.spec.provider_id.is_empty() {
                claims.provider_ids.insert(&machine.spec.provider_id);
            }
        }
        claims
    }

    /// Whether any of the machines claims `node`: the same answer as [`claims`] for each machine, or'ed.
    pub fn any_claims(&self, node: &Node) -> bool {
        let Some(node_name) = node.metadata.name.as_deref() else {
            return false;
        };
        let node_provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        let named = node.label(labels::NODE_MACHINE_NAME).filter(|n| !n.is_empty());
        self.labelled.contains(node_name)
            || self.unlabelled.contains(node_name)
            || (!node_provider_id.is_empty() && self.provider_ids.contains(node_provider_id))
            || named.is_some_and(|n| self.names.contains(n))
    }
}

/// A change to a node's "not managed" marking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeChange {
    /// No Machine claims the node: annotate it (and drop the node finalizer if it has it).
    MarkUnmanaged {
        /// The node.
        node: String,
        /// The merge patch to apply to the node.
        patch: Value,
    },
    /// A Machine claims the node again: remove the annotation.
    Unmark {
        /// The node.
        node: String,
        /// The merge patch to apply to the node.
        patch: Value,
    },
}

impl NodeChange {
    /// The node's name.
    pub fn node(&self) -> &str {
        match self {
            Self::MarkUnmanaged { node, .. } | Self::Unmark { node, .. } => node,
        }
    }

    /// The merge patch.
    pub fn patch(&self) -> &Value {
        match self {
            Self::MarkUnmanaged { patch, .. } | Self::Unmark { patch, .. } => patch,
        }
    }
}

/// The inputs of a pass over the nodes. `N` and `M` are objects or shared ones (`Arc`s, from a cache).
#[derive(Clone, Copy, Debug)]
pub struct NodeInput<'a, N: Borrow<Node> = Node, M: Borrow<Machine> = Machine> {
    /// The nodes of the target cluster.
    pub nodes: &'a [N],
    /// The Machine objects.
    pub machines: &'a [M],
    /// Now.
    pub now: Timestamp,
    /// `--machine-creation-timeout`: a node without a Machine younger than this may still get one.
    pub creation_timeout: Duration,
}

/// The node changes of a pass, in node name order (see the module documentation).
///
/// The patch that drops the finalizer carries the node's resourceVersion, so that it fails (409) rather than
/// overwrite a finalizer list that changed since the node was read; the annotation-only patches merge and need
/// none.
pub fn decide_nodes<N: Borrow<Node>, M: Borrow<Machine>>(input: &NodeInput<'_, N, M>) -> Vec<NodeChange> {
    let mut changes: Vec<NodeChange> = Vec::new();
    let claims = Claims::of(input.machines);
    for node in input.nodes.iter().map(Borrow::borrow) {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let marked = node.annotation(annotations::NOT_MANAGED_BY_MCM).is_some();
        let claimed = claims.any_claims(node);
        if claimed {
            if marked {
                changes.push(NodeChange::Unmark {
                    node: name,
                    patch: json!({ "metadata": { "annotations": { annotations::NOT_MANAGED_BY_MCM: null } } }),
                });
            }
            continue;
        }
        let old_enough = node
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|created| input.now >= timeouts::add(created.0, input.creation_timeout));
        let finalizers = node.metadata.finalizers.clone().unwrap_or_default();
        let has_finalizer = node.has_finalizer(finalizers::NODE);
        if !old_enough || (marked && !has_finalizer) {
            continue;
        }
        let mut patch =
            json!({ "metadata": { "annotations": { annotations::NOT_MANAGED_BY_MCM: NOT_MANAGED_VALUE } } });
        if has_finalizer {
            let kept: Vec<&String> = finalizers.iter().filter(|f| *f != finalizers::NODE).collect();
            patch["metadata"]["finalizers"] = json!(kept);
            patch["metadata"]["resourceVersion"] = json!(node.metadata.resource_version);
        }
        changes.push(NodeChange::MarkUnmanaged { node: name, patch });
    }
    changes.sort_by(|a, b| a.node().cmp(b.node()));
    changes
}

/// The provider IDs among `orphans` not in `reported`: the ones to report now (each orphan once, however many
/// passes see it). Returns them and the set to keep (the current orphans' provider IDs, so that a VM that goes and
/// comes back is reported again).
pub fn to_report<'a>(
    orphans: &'a [OrphanVm],
    reported: &BTreeSet<String>,
) -> (Vec<&'a OrphanVm>, BTreeSet<String>) {
    let fresh = orphans
        .iter()
        .filter(|vm| !reported.contains(&vm.provider_id))
        .collect();
    let keep = orphans.iter().map(|vm| vm.provider_id.clone()).collect();
    (fresh, keep)
}

#[cfg(test)]
mod tests {
    use mcm_api::builders::{MachineBuilder, NodeBuilder};
    use pretty_assertions::assert_eq;

    use super::*;

    const GRACE: Duration = Duration::from_mins(5);

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    /// A machine `ns/<name>` with this providerID, and a status only when it has a phase.
    fn machine(name: &str, provider_id: &str, phase: Option<MachinePhase>) -> Machine {
        let m = MachineBuilder::new(name).namespace("ns").provider_id(provider_id);
        match phase {
            Some(phase) => m.phase(phase),
            None => m,
        }
        .build()
    }

    fn listed(class: &str, vms: &[(&str, &str)]) -> BTreeMap<String, BTreeMap<String, String>> {
        BTreeMap::from([(
            class.to_owned(),
            vms.iter()
                .map(|(id, name)| ((*id).to_owned(), (*name).to_owned()))
                .collect(),
        )])
    }

    /// Runs two passes: one at 0 (first sighting), one at `later`.
    fn two_passes(
        listed: &BTreeMap<String, BTreeMap<String, String>>,
        machines: &[Machine],
        later: i64,
    ) -> VmPlan {
        let first = decide_vms(
            &VmInput {
                listed,
                machines,
                now: at(0),
                grace: GRACE,
            },
            FirstSeen::new(),
        );
        decide_vms(
            &VmInput {
                listed,
                machines,
                now: at(later),
                grace: GRACE,
            },
            first.first_seen,
        )
    }

    #[test]
    fn a_vm_without_machine_is_collected_once_seen_for_the_grace_period() {
        let listed = listed("c", &[("id-1", "gone")]);
        let first = decide_vms(
            &VmInput {
                listed: &listed,
                machines: &[] as &[Machine],
                now: at(0),
                grace: GRACE,
            },
            FirstSeen::new(),
        );
        assert!(first.orphans.is_empty(), "never at first sight");
        assert_eq!(first.waiting.len(), 1);
        assert_eq!(first.recheck_at, Some(at(300)));
        assert_eq!(first.first_seen, FirstSeen::from([("id-1".to_owned(), at(0))]));

        let early = two_passes(&listed, &[], 299);
        assert!(early.orphans.is_empty());
        assert_eq!(early.waiting[0].collectable_at, at(300));

        let due = two_passes(&listed, &[], 300);
        assert_eq!(
            due.orphans,
            vec![OrphanVm {
                provider_id: "id-1".into(),
                machine_name: "gone".into(),
                class: "c".into(),
                reason: OrphanReason::NoMachine,
            }]
        );
        assert!(due.waiting.is_empty());
        assert_eq!(due.recheck_at, None);
        assert_eq!(
            due.first_seen.get("id-1"),
            Some(&at(0)),
            "the first sighting is kept"
        );
    }

    #[test]
    fn the_vm_of_a_machine_is_never_an_orphan() {
        let listed = listed("c", &[("id-1", "m1")]);
        let machines = [machine("m1", "id-1", Some(MachinePhase::Running))];
        let plan = two_passes(&listed, &machines, 3600);
        assert!(plan.orphans.is_empty());
        assert!(plan.waiting.is_empty());
        assert_eq!(plan.first_seen.len(), 1);
    }

    #[test]
    fn an_extra_vm_of_a_running_machine_is_a_duplicate() {
        let listed = listed("c", &[("id-1", "m1"), ("id-1/2", "m1")]);
        let machines = [machine("m1", "id-1", Some(MachinePhase::Running))];
        let plan = two_passes(&listed, &machines, 300);
        assert_eq!(
            plan.orphans,
            vec![OrphanVm {
                provider_id: "id-1/2".into(),
                machine_name: "m1".into(),
                class: "c".into(),
                reason: OrphanReason::Duplicate {
                    machine_provider_id: "id-1".into()
                },
            }]
        );
        assert!(plan.orphans[0].describe().contains("id-1/2"));
        assert!(plan.orphans[0].describe().contains("the machine's VM is id-1"));
    }

    #[test]
    fn the_vms_of_a_machine_being_created_are_left_to_the_creation_flow() {
        let listed = listed("c", &[("id-1", "m1")]);
        for m in [
            machine("m1", "", None),
            machine("m1", "", Some(MachinePhase::Pending)),
            machine("m1", "", Some(MachinePhase::Failed)),
            machine("m1", "id-0", None),
            machine("m1", "id-0", Some(MachinePhase::CrashLoopBackOff)),
        ] {
            let plan = two_passes(&listed, std::slice::from_ref(&m), 3600);
            assert!(plan.orphans.is_empty(), "{:?}", m.status);
            assert!(plan.waiting.is_empty());
            assert_eq!(classify("id-1", "m1", Some(&m)), Verdict::BeingCreated);
        }
        // Every other phase with another provider ID: an extra VM.
        for phase in MachinePhase::ALL
            .into_iter()
            .filter(|p| *p != MachinePhase::CrashLoopBackOff)
        {
            let m = machine("m1", "id-0", Some(phase));
            assert!(
                matches!(
                    classify("id-1", "m1", Some(&m)),
                    Verdict::Orphan(OrphanReason::Duplicate { .. })
                ),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn a_vm_without_machine_name_is_never_collected() {
        let listed = listed("c", &[("id-1", "")]);
        let plan = two_passes(&listed, &[], 3600);
        assert!(plan.orphans.is_empty());
        assert!(plan.waiting.is_empty());
        assert_eq!(classify("id-1", "", None), Verdict::Unnamed);
    }

    #[test]
    fn a_vm_that_leaves_the_answers_starts_its_grace_again() {
        let with = listed("c", &[("id-1", "gone")]);
        let without = listed("c", &[]);
        let mut seen = FirstSeen::new();
        for (now, answer) in [(0, &with), (200, &without), (400, &with), (650, &with)] {
            let plan = decide_vms(
                &VmInput {
                    listed: answer,
                    machines: &[] as &[Machine],
                    now: at(now),
                    grace: GRACE,
                },
                seen,
            );
            assert!(plan.orphans.is_empty(), "at {now}");
            seen = plan.first_seen;
        }
        let plan = decide_vms(
            &VmInput {
                listed: &with,
                machines: &[] as &[Machine],
                now: at(700),
                grace: GRACE,
            },
            seen,
        );
        assert_eq!(plan.orphans.len(), 1);
    }

    #[test]
    fn a_vm_listed_by_several_classes_is_collected_once_through_the_first() {
        let mut listed = listed("b", &[("id-1", "gone")]);
        listed.insert(
            "a".into(),
            BTreeMap::from([("id-1".to_owned(), "gone".to_owned())]),
        );
        let plan = two_passes(&listed, &[], 300);
        assert_eq!(plan.orphans.len(), 1);
        assert_eq!(plan.orphans[0].class, "a");
    }

    #[test]
    fn recheck_is_at_the_earliest_maturity() {
        let listed = listed("c", &[("id-1", "x")]);
        let first = decide_vms(
            &VmInput {
                listed: &listed,
                machines: &[] as &[Machine],
                now: at(0),
                grace: GRACE,
            },
            FirstSeen::new(),
        );
        let mut both = listed.clone();
        both.get_mut("c").unwrap().insert("id-2".into(), "y".into());
        let second = decide_vms(
            &VmInput {
                listed: &both,
                machines: &[] as &[Machine],
                now: at(100),
                grace: GRACE,
            },
            first.first_seen,
        );
        assert_eq!(second.waiting.len(), 2);
        assert_eq!(second.recheck_at, Some(at(300)));
    }

    #[test]
    fn the_stand_in_carries_name_provider_id_and_class() {
        let vm = OrphanVm {
            provider_id: "sim:///ns/m1/2".into(),
            machine_name: "m1".into(),
            class: "c".into(),
            reason: OrphanReason::NoMachine,
        };
        let m = stand_in(&vm, "ns");
        assert_eq!(m.metadata.name.as_deref(), Some("m1"));
        assert_eq!(m.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(m.spec.provider_id, "sim:///ns/m1/2");
        assert_eq!(m.spec.class.name, "c");
        assert_eq!(m.spec.class.kind, "MachineClass");
    }

    #[test]
    fn each_orphan_is_reported_once() {
        let vm = |id: &str| OrphanVm {
            provider_id: id.into(),
            machine_name: "m".into(),
            class: "c".into(),
            reason: OrphanReason::NoMachine,
        };
        let orphans = vec![vm("a"), vm("b")];
        let (fresh, keep) = to_report(&orphans, &BTreeSet::from(["a".to_owned(), "z".to_owned()]));
        assert_eq!(fresh, vec![&orphans[1]]);
        assert_eq!(keep, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    }

    fn node(name: &str, created: i64) -> Node {
        NodeBuilder::new(name)
            .created_at(at(created))
            .resource_version("7")
            .build()
    }

    fn with_label(mut m: Machine, key: &str, value: &str) -> Machine {
        m.metadata
            .labels
            .get_or_insert_default()
            .insert(key.into(), value.into());
        m
    }

    fn nodes_at(nodes: &[Node], machines: &[Machine], now: i64) -> Vec<NodeChange> {
        decide_nodes(&NodeInput {
            nodes,
            machines,
            now: at(now),
            creation_timeout: Duration::from_mins(20),
        })
    }

    #[test]
    fn a_node_without_machine_is_marked_after_the_creation_timeout() {
        let nodes = [node("n1", 0)];
        assert_eq!(nodes_at(&nodes, &[], 1199), vec![]);
        assert_eq!(
            nodes_at(&nodes, &[], 1200),
            vec![NodeChange::MarkUnmanaged {
                node: "n1".into(),
                patch: json!({ "metadata": { "annotations": {
                    "node.machine.sapcloud.io/not-managed-by-mcm": "1"
                } } }),
            }]
        );
        // Marked already: nothing more to do.
        let mut marked = node("n1", 0);
        marked.metadata.annotations = Some(BTreeMap::from([(
            annotations::NOT_MANAGED_BY_MCM.to_owned(),
            "1".to_owned(),
        )]));
        assert_eq!(nodes_at(&[marked], &[], 5000), vec![]);
        // Without a creation timestamp there is no age: left alone.
        let mut ageless = node("n1", 0);
        ageless.metadata.creation_timestamp = None;
        assert_eq!(nodes_at(&[ageless], &[], 5000), vec![]);
    }

    #[test]
    fn marking_drops_the_node_finalizer_under_a_precondition() {
        let mut n = node("n1", 0);
        n.metadata.finalizers = Some(vec![finalizers::NODE.into(), "other/keep".into()]);
        let changes = nodes_at(&[n.clone()], &[], 1200);
        assert_eq!(
            changes[0].patch(),
            &json!({ "metadata": {
                "annotations": { "node.machine.sapcloud.io/not-managed-by-mcm": "1" },
                "finalizers": ["other/keep"],
                "resourceVersion": "7",
            } })
        );
        // Marked but still holding the finalizer (a machine came and went): the finalizer goes.
        n.metadata.annotations = Some(BTreeMap::from([(
            annotations::NOT_MANAGED_BY_MCM.to_owned(),
            "1".to_owned(),
        )]));
        assert_eq!(nodes_at(&[n], &[], 1200).len(), 1);
    }

    #[test]
    fn a_claimed_node_is_never_marked_and_loses_the_mark() {
        let by_label = with_label(machine("m1", "", None), labels::NODE, "n1");
        let by_provider_id = machine("m2", "sim:///n1", Some(MachinePhase::Running));
        let by_name = machine("n1", "", None);
        let mut claimed_by_provider = node("n1", 0);
        claimed_by_provider.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("sim:///n1".into()),
            ..Default::default()
        });
        let mut named = node("n1", 0);
        named.metadata.labels = Some(BTreeMap::from([(
            labels::NODE_MACHINE_NAME.to_owned(),
            "m9".to_owned(),
        )]));
        let cases: [(Node, Machine); 4] = [
            (node("n1", 0), by_label),
            (claimed_by_provider, by_provider_id),
            (node("n1", 0), by_name),
            (named, machine("m9", "", None)),
        ];
        for (n, m) in cases {
            assert!(
                claims(&m, &n),
                "{:?} claims {:?}",
                m.metadata.name,
                n.metadata.name
            );
            assert_eq!(
                nodes_at(std::slice::from_ref(&n), std::slice::from_ref(&m), 5000),
                vec![]
            );
            let mut marked = n.clone();
            marked.metadata.annotations = Some(BTreeMap::from([(
                annotations::NOT_MANAGED_BY_MCM.to_owned(),
                "1".to_owned(),
            )]));
            assert_eq!(
                nodes_at(&[marked], std::slice::from_ref(&m), 5000),
                vec![NodeChange::Unmark {
                    node: "n1".into(),
                    patch: json!({ "metadata": { "annotations": {
                        "node.machine.sapcloud.io/not-managed-by-mcm": null
                    } } }),
                }]
            );
        }
    }

    #[test]
    fn a_machine_labelled_for_another_node_does_not_claim_by_name() {
        let m = with_label(machine("n1", "", None), labels::NODE, "n2");
        assert!(!claims(&m, &node("n1", 0)));
        assert!(claims(&m, &node("n2", 0)));
        // Empty provider IDs never match.
        assert!(!claims(&machine("m", "", None), &node("n1", 0)));
    }

    /// A machine or node drawn from a small alphabet, so that names, labels and provider IDs collide often.
    fn small() -> impl proptest::strategy::Strategy<Value = (u8, Option<u8>, Option<u8>)> {
        (0u8..4, proptest::option::of(0u8..4), proptest::option::of(0u8..4))
    }

    proptest::proptest! {
        /// The index answers as `claims` over every machine does: the pass may use it in place of the O(N×M) scan.
        #[test]
        fn the_claims_index_agrees_with_claims(
            machines in proptest::collection::vec(small(), 0..6),
            nodes in proptest::collection::vec(small(), 1..6),
        ) {
            let machines: Vec<Machine> = machines
                .into_iter()
                .map(|(name, label, provider)| {
                    let m = machine(
                        &format!("n{name}"),
                        &provider.map(|p| format!("sim:///{p}")).unwrap_or_default(),
                        None,
                    );
                    match label {
                        Some(3) => with_label(m, labels::NODE, ""),
                        Some(l) => with_label(m, labels::NODE, &format!("n{l}")),
                        None => m,
                    }
                })
                .collect();
            let index = Claims::of(&machines);
            for (name, named, provider) in nodes {
                let mut n = node(&format!("n{name}"), 0);
                n.spec = provider.map(|p| k8s_openapi::api::core::v1::NodeSpec {
                    provider_id: Some(if p == 3 { String::new() } else { format!("sim:///{p}") }),
                    ..Default::default()
                });
                if let Some(named) = named {
                    let value = if named == 3 { String::new() } else { format!("n{named}") };
                    n.metadata.labels = Some(BTreeMap::from([(labels::NODE_MACHINE_NAME.to_owned(), value)]));
                }
                proptest::prop_assert_eq!(index.any_claims(&n), machines.iter().any(|m| claims(m, &n)));
            }
        }
    }
}
