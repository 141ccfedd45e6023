//! The whole flow against a simulated world, with crashes at every step.

use k8s_openapi::api::core::v1::Node;
use mcm_api::{Machine, MachineStatus, keys::labels};
use mcm_driver::{DeleteMachineResponse, GetMachineStatusResponse, MachineCode};
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;
use crate::drain::DrainOutcome;

/// A simulated world: the VM, the node, and counters.
#[derive(Debug)]
struct World {
    vm: bool,
    node: Option<Node>,
    vm_deletions: usize,
    drains_after_vm_deletion: usize,
    force: bool,
}

/// Performs `action` in the world and reports its outcome.
fn act(world: &mut World, action: &DeletionAction) -> Option<StepOutcome> {
    Some(match action {
        DeletionAction::Nothing | DeletionAction::Hold(_) => return None,
        DeletionAction::GetVmStatus => StepOutcome::GetVmStatus(if world.vm {
            Ok(GetMachineStatusResponse::default())
        } else {
            Err(err(MachineCode::NotFound))
        }),
        DeletionAction::Drain { mode, .. } => {
            if !world.vm {
                world.drains_after_vm_deletion += 1;
            }
            StepOutcome::Drain {
                force: mode.force.clone(),
                outcome: DrainOutcome::Drained {
                    evicted: 1,
                    deleted: 0,
                },
            }
        }
        DeletionAction::DeleteVolumeAttachments { .. } => {
            if let Some(status) = world.node.as_mut().and_then(|n| n.status.as_mut()) {
                status.volumes_attached = None;
            }
            StepOutcome::VolumeAttachments(Ok(1))
        }
        DeletionAction::DeleteVm => {
            if world.vm {
                world.vm = false;
                world.vm_deletions += 1;
                StepOutcome::DeleteVm(Ok(DeleteMachineResponse::default()))
            } else {
                StepOutcome::DeleteVm(Err(err(MachineCode::NotFound)))
            }
        }
        DeletionAction::DeleteNode { .. } => StepOutcome::DeleteNode(if world.node.take().is_some() {
            NodeDeletion::Deleted
        } else {
            NodeDeletion::NotFound
        }),
        DeletionAction::RemoveFinalizer => StepOutcome::RemoveFinalizer(Ok(())),
    })
}

fn apply(machine: &mut Machine, write: Option<&DeletionWrite>) {
    if let Some(write) = write {
        write
            .status
            .apply(machine.status.get_or_insert_with(MachineStatus::default));
    }
}

/// Stages `write` as the controller does: merged after the waiting one, applied to the controller's view, and
/// persisted (counted in `writes`) unless it may wait for the next.
fn stage(
    persisted: &mut Machine,
    view: &mut Machine,
    waiting: &mut Option<DeletionWrite>,
    writes: &mut usize,
    write: Option<DeletionWrite>,
) {
    let Some(write) = merge_writes(waiting.take(), write) else {
        return;
    };
    apply(view, Some(&write));
    if write.deferrable {
        *waiting = Some(write);
    } else {
        *persisted = view.clone();
        *writes += 1;
    }
}

/// Runs the flow to its end as the controller does, several steps in one pass, a write that may wait merged into
/// the next; `crashes[i]` says where step `i` is cut short (0: not at all, 1: before the plan's write, 2: before the
/// action, 3: before the write after it), and a crash loses every write still waiting. Returns the steps whose
/// actions ran, in order, and the status writes made.
fn run(f: &Fixture, world: &mut World, crashes: &[u8]) -> (Vec<DeletionStep>, usize) {
    let mut persisted = machine();
    if world.force {
        persisted
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::FORCE_DELETION.into(), "true".into());
    }
    let mut view = persisted.clone();
    let mut waiting = None;
    let mut writes = 0;
    let mut acted = Vec::new();
    for step in 0..100 {
        let crash = crashes.get(step).copied().unwrap_or(0);
        let now = DELETED + i64::try_from(step).unwrap();
        let plan = decide(&f.input(&view, world.node.as_ref(), now));
        if plan.action == DeletionAction::Nothing {
            return (acted, writes);
        }
        if crash == 1 {
            view = persisted.clone();
            waiting = None;
            continue;
        }
        stage(&mut persisted, &mut view, &mut waiting, &mut writes, plan.write);
        if crash == 2 {
            view = persisted.clone();
            waiting = None;
            continue;
        }
        let outcome = act(world, &plan.action).expect("no holds here");
        acted.push(plan.step);
        if crash == 3 {
            view = persisted.clone();
            waiting = None;
            continue;
        }
        let done = after(&f.input(&view, world.node.as_ref(), now), &outcome);
        if done.next.is_none() {
            // The finalizer is gone: so is the machine, and any write still waiting with it.
            persisted.metadata.finalizers = Some(vec![]);
            view = persisted.clone();
            waiting = None;
            continue;
        }
        stage(&mut persisted, &mut view, &mut waiting, &mut writes, done.write);
        if done.requeue_after != Some(std::time::Duration::ZERO) {
            // The pass ends here: a waiting write is written first.
            if let Some(write) = waiting.take() {
                stage(
                    &mut persisted,
                    &mut view,
                    &mut None,
                    &mut writes,
                    Some(DeletionWrite {
                        deferrable: false,
                        ..write
                    }),
                );
            }
        }
    }
    panic!("the flow did not end: {acted:?}");
}

fn world(force: bool) -> World {
    World {
        vm: true,
        node: Some(with_volumes(node("node-1"))),
        vm_deletions: 0,
        drains_after_vm_deletion: 0,
        force,
    }
}

#[test]
fn the_whole_flow_runs_each_step_once() {
    use DeletionStep as S;
    let f = Fixture::new();
    let mut w = world(false);
    let (acted, writes) = run(&f, &mut w, &[]);
    assert_eq!(
        acted,
        [
            S::GetVmStatus,
            S::Drain,
            S::DeleteVm,
            S::DeleteNode,
            S::RemoveFinalizer
        ]
    );
    // Issue 26: Terminating and the VM status ride with the drain's outcome, written before the VM deletion; the
    // VM deletion's outcome is written, the node deletion's is not (the machine is gone right after it).
    assert_eq!(
        writes, 2,
        "status writes of a deletion with a drain done in one pass"
    );
    assert_eq!(w.vm_deletions, 1);
    assert!(w.node.is_none());

    // A force drain goes through the VolumeAttachments (the attachment is deleted once, then none is live).
    let mut w = world(true);
    assert_eq!(
        run(&f, &mut w, &[]).0,
        [
            S::GetVmStatus,
            S::Drain,
            S::DeleteVolumeAttachments,
            S::DeleteVm,
            S::DeleteNode,
            S::RemoveFinalizer
        ]
    );

    // Without a target cluster: no drain, no node.
    let mut f = Fixture::new();
    f.target = false;
    let mut w = world(false);
    w.node = None;
    assert_eq!(
        run(&f, &mut w, &[]).0,
        [S::GetVmStatus, S::DeleteVm, S::RemoveFinalizer]
    );
}

proptest! {
    #[test]
    fn a_crash_anywhere_resumes_at_its_step_and_deletes_the_vm_once(
        crashes in proptest::collection::vec(0u8..4, 0..25),
        force in any::<bool>(),
    ) {
        let f = Fixture::new();
        let mut w = world(force);
        let (acted, _) = run(&f, &mut w, &crashes);
        // The VM is deleted exactly once; repeated DeleteMachine calls find it gone (NotFound counts as done).
        prop_assert_eq!(w.vm_deletions, 1);
        prop_assert!(!w.vm);
        prop_assert!(w.node.is_none(), "the node is deleted");
        prop_assert_eq!(w.drains_after_vm_deletion, 0, "never a drain after the VM is gone");
        // A crash repeats the step it was in, or the harmless steps whose writes were waiting (Terminating and the
        // VM status before the drain's outcome; the node deletion before the finalizer removal), never a drain once
        // the VM deletion began.
        prop_assert!(
            acted.windows(2).all(|p| p[0] <= p[1] || p[1] <= DeletionStep::Drain && p[0] <= DeletionStep::Drain
                || p[1] >= DeletionStep::DeleteNode),
            "{:?}",
            acted
        );
        prop_assert_eq!(acted.last().copied(), Some(DeletionStep::RemoveFinalizer));
    }
}
