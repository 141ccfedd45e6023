//! The rolling step, Recreate, OnDelete, rollbacks and completion.

use mcm_api::StrategyType;
use pretty_assertions::assert_eq;

use super::*;

#[test]
fn the_new_set_grows_by_what_the_surge_leaves() {
    // Kubernetes NewRSNewReplicas: min(replicas + maxSurge − total, replicas − new).
    let old = [view("old", 1, 10, 10, 10)];
    let new = view("new", 2, 0, 0, 0);
    assert_eq!(new_set_replicas(10, fp(3, 2), &new, &old), 3);
    // Machines still going away count: a set scaled down to 8 that still has 10 machines leaves no room.
    let draining = [view("old", 1, 8, 10, 8)];
    let grown = view("new", 2, 3, 3, 0);
    assert_eq!(new_set_replicas(10, fp(3, 2), &grown, &draining), 3);
    // Never beyond replicas.
    let small_old = [view("old", 1, 1, 1, 1)];
    assert_eq!(
        new_set_replicas(10, fp(5, 2), &view("new", 2, 8, 8, 8), &small_old),
        10
    );
}

#[test]
fn old_sets_are_not_scaled_down_while_the_new_one_is_unavailable() {
    // Kubernetes' example (case 1): 10 replicas, maxUnavailable 2, maxSurge 3; the new set is at 5 and its
    // machines never become available; the old set is at 8: 13 − 8 − 5 = 0, nothing is scaled down.
    let new = view("new", 2, 5, 5, 0);
    let old = [view("old", 1, 8, 8, 8)];
    assert!(scale_down_old(10, fp(3, 2), &new, &old).is_empty());
    // Once two new machines are available, two old ones may go.
    let better = view("new", 2, 5, 5, 2);
    assert_eq!(
        scales(&scale_down_old(10, fp(3, 2), &better, &old)),
        vec![("old", 6)]
    );
}

#[test]
fn unhealthy_old_replicas_are_cleaned_up_first_oldest_set_first() {
    let new = view("new", 3, 3, 3, 3);
    let old = [view("older", 1, 4, 4, 2), view("old", 2, 4, 4, 4)];
    // 11 − 8 − 0 = 3 may go: the 2 unhealthy of "older", then availability 3 + 2 + 4 = 9 > 8 allows 1 more.
    assert_eq!(
        scales(&scale_down_old(10, fp(1, 2), &new, &old)),
        vec![("older", 1)]
    );
}

#[test]
fn a_set_already_scaled_down_is_not_counted_twice() {
    // The old set's status still shows 10 available machines but it was scaled to 8: it keeps 8.
    let new = view("new", 2, 3, 3, 0);
    let old = [view("old", 1, 8, 10, 10)];
    assert!(scale_down_old(10, fp(3, 2), &new, &old).is_empty());
}

#[test]
fn scale_out_goes_to_the_new_set_only_and_scale_in_is_proportional() {
    // Spec 002 FAQ: "Case scale-out -> ONLY New machineSet is scaled out. Case scale-in -> ALL machineSets (new or
    // old) are scaled in, in proportion to their replica count, any leftover is adjusted in the largest
    // machineSet."
    let f = fp(3, 2);
    let old = [annotated(view("old", 1, 8, 8, 8), 10, f)];
    let new = annotated(view("new", 2, 5, 5, 2), 10, f);
    assert!(is_scaling_event(20, Some(&new), &old));
    assert!(!is_scaling_event(10, Some(&new), &old));
    // 10 → 20: allowed 23, total 13: +10, all to the new set.
    assert_eq!(
        scales(&scale(20, f, Some(&new), &old)),
        vec![("new", 15), ("old", 8)],
        "the old set keeps its size (its annotations are refreshed)"
    );
    // 10 → 4: allowed 7, total 13: −6, proportionally: old 8·7/13 ≈ 4, new 5·7/13 ≈ 3.
    assert_eq!(
        scales(&scale(4, f, Some(&new), &old)),
        vec![("new", 3), ("old", 4)]
    );
    // To zero: everything goes.
    assert_eq!(
        scales(&scale(0, f, Some(&new), &old)),
        vec![("new", 0), ("old", 0)]
    );
}

#[test]
fn a_single_active_set_takes_the_whole_count() {
    let f = fp(1, 1);
    let only = annotated(view("only", 1, 3, 3, 3), 3, f);
    assert_eq!(scales(&scale(7, f, Some(&only), &[])), vec![("only", 7)]);
    // None active: the new set, else the newest old one.
    let old = [view("a", 1, 0, 0, 0), view("b", 2, 0, 0, 0)];
    assert_eq!(scales(&scale(2, f, None, &old)), vec![("b", 2)]);
    assert!(is_scaling_event(2, None, &old));
    assert!(!is_scaling_event(0, None, &old));
}

#[test]
fn a_saturated_new_set_retires_the_old_ones() {
    let f = fp(1, 1);
    let new = annotated(view("new", 2, 5, 5, 5), 4, f);
    let old = [annotated(view("old", 1, 1, 1, 1), 4, f)];
    assert_eq!(
        scales(&scale(5, f, Some(&new), &old)),
        vec![("old", 0), ("new", 5)]
    );
}

#[test]
fn the_new_set_is_created_before_any_scaling() {
    // Issue #816: scaling ran before the new set existed and the rollout got stuck.
    let f = fp(3, 2);
    let old = [annotated(view("old", 1, 10, 10, 10), 10, f)];
    let plan = step(&input(20, StrategyType::RollingUpdate, f, None, &old));
    assert_eq!(plan.create_new, Some(13));
    assert!(plan.scale.is_empty());
    // Paused: no new set, scaling only.
    let mut paused = input(20, StrategyType::RollingUpdate, f, None, &old);
    paused.paused = true;
    let plan = step(&paused);
    assert_eq!(plan.create_new, None);
    assert_eq!(plan.phase, RolloutPhase::Paused);
    assert_eq!(scales(&plan.scale), vec![("old", 20)]);
}

#[test]
fn recreate_scales_old_to_zero_waits_then_creates() {
    let f = Fenceposts::default();
    let old = [annotated(view("old", 1, 3, 3, 3), 3, f)];
    let plan = step(&input(3, StrategyType::Recreate, f, None, &old));
    assert_eq!((plan.create_new, scales(&plan.scale)), (None, vec![("old", 0)]));
    let draining = [annotated(view("old", 1, 0, 2, 0), 3, f)];
    let plan = step(&input(3, StrategyType::Recreate, f, None, &draining));
    assert_eq!((plan.create_new, plan.phase), (None, RolloutPhase::Waiting));
    let gone = [annotated(view("old", 1, 0, 0, 0), 3, f)];
    assert_eq!(
        step(&input(3, StrategyType::Recreate, f, None, &gone)).create_new,
        Some(3)
    );
}

#[test]
fn on_delete_replaces_old_machines_only_as_they_are_deleted() {
    let f = Fenceposts::default();
    let old = [annotated(view("old", 1, 3, 3, 3), 3, f)];
    let plan = step(&input(3, StrategyType::OnDelete, f, None, &old));
    assert_eq!(plan.create_new, Some(0));
    assert_eq!(plan.disable_scale_up, vec!["old".to_owned()]);
    let mut labelled = old.clone();
    labelled[0].scale_up_disabled = true;
    let new = annotated(view("new", 2, 0, 0, 0), 3, f);
    let plan = step(&input(3, StrategyType::OnDelete, f, Some(&new), &labelled));
    assert_eq!(plan.phase, RolloutPhase::Waiting, "nobody deleted anything yet");
    // Someone deletes one old machine.
    labelled[0].live = 2;
    let plan = step(&input(3, StrategyType::OnDelete, f, Some(&new), &labelled));
    assert_eq!(scales(&plan.scale), vec![("old", 2), ("new", 1)]);
}

#[test]
fn a_rollback_makes_an_old_set_new_and_re_enables_its_scale_up() {
    let f = fp(1, 1);
    let mut back = annotated(view("back", 1, 0, 0, 0), 3, f);
    back.scale_up_disabled = true;
    let old = [annotated(view("current", 2, 3, 3, 3), 3, f)];
    let plan = step(&input(3, StrategyType::RollingUpdate, f, Some(&back), &old));
    assert_eq!(plan.enable_scale_up, vec!["back".to_owned()]);
    assert_eq!(scales(&plan.scale), vec![("back", 1)]);
}

#[test]
fn a_complete_rollout_is_reported() {
    let f = fp(1, 1);
    let new = annotated(view("new", 2, 3, 3, 3), 3, f);
    let old = [annotated(view("old", 1, 0, 0, 0), 3, f)];
    assert_eq!(
        step(&input(3, StrategyType::RollingUpdate, f, Some(&new), &old)).phase,
        RolloutPhase::Complete
    );
    let lingering = [annotated(view("old", 1, 0, 1, 0), 3, f)];
    assert_eq!(
        step(&input(3, StrategyType::RollingUpdate, f, Some(&new), &lingering)).phase,
        RolloutPhase::Waiting
    );
}
