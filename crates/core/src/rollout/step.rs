//! [`step`]: one pass of a rollout (rolling update, Recreate, OnDelete) and proportional scaling.
//!
//! Separate because it is the arithmetic proper; everything else feeds it or reports on it.

use std::{cmp::Ordering, collections::BTreeMap};

use mcm_api::StrategyType;

use super::{fenceposts::Fenceposts, sets::SetView};

/// What [`step`] looks at.
#[derive(Clone, Copy, Debug)]
pub struct RolloutInput<'a> {
    /// The deployment's `spec.replicas`.
    pub replicas: i32,
    /// The strategy. For InPlaceUpdate only creation, pause and scaling events are decided here; the rollout itself is
    /// [`in_place::decide`](super::in_place::decide)'s, which calls this for those.
    pub strategy: StrategyType,
    /// [`fenceposts`](fn@super::fenceposts) of the deployment.
    pub fenceposts: Fenceposts,
    /// `spec.paused`.
    pub paused: bool,
    /// The set whose template equals the deployment's ([`equal_ignore_hash`](super::equal_ignore_hash); the oldest if several), if any.
    pub new: Option<&'a SetView>,
    /// The deployment's other sets.
    pub old: &'a [SetView],
}

/// A set to scale: write `spec.replicas` = `replicas` and the [`replicas_annotations`](super::replicas_annotations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    /// The set's name.
    pub name: String,
    /// Its new `spec.replicas`.
    pub replicas: i32,
}

/// Where the rollout stands after the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RolloutPhase {
    /// Replicas changed: the sets are scaled (proportionally during a rollout).
    Scaling,
    /// The rollout moves (a set is created or scaled, or old sets labelled).
    Progressing,
    /// Nothing to do until machines come up or go away.
    Waiting,
    /// Paused: only scaling happens.
    Paused,
    /// Every machine is new and available, no old machine is left: clean up history, remove rollout markers.
    Complete,
}

/// What the deployment controller does now. Apply `create_new` (the new set: template with the hash label,
/// [`replicas_annotations`](super::replicas_annotations), the next revision), then `scale` in order, then the label changes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct RolloutPlan {
    /// Create the new set with this many replicas.
    pub create_new: Option<i32>,
    /// Sets to scale (replicas and annotations), in order.
    pub scale: Vec<Scale>,
    /// Sets that must get `node.machine.sapcloud.io/scale-up-disabled` (old sets of an OnDelete rollout: they must
    /// not replace the machines someone deletes).
    pub disable_scale_up: Vec<String>,
    /// Sets that must lose it (the new set, e.g. an old set that became new by a rollback).
    pub enable_scale_up: Vec<String>,
    /// Where the rollout stands.
    pub phase: RolloutPhase,
}

impl RolloutPlan {
    pub(super) fn new(phase: RolloutPhase) -> Self {
        Self {
            create_new: None,
            scale: Vec::new(),
            disable_scale_up: Vec::new(),
            enable_scale_up: Vec::new(),
            phase,
        }
    }
}

/// Older first, then by name (Kubernetes' `ReplicaSetsByCreationTimestamp`).
pub(super) fn by_age(a: &SetView, b: &SetView) -> Ordering {
    a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name))
}

fn annotations_stale(set: &SetView, replicas: i32, fenceposts: Fenceposts) -> bool {
    set.desired_replicas != Some(replicas)
        || set.max_replicas != Some(replicas.saturating_add(fenceposts.max_surge))
}

/// A scaling event (reference §6.1 step 10): an active set (replicas > 0) whose `desired-replicas` annotation differs
/// from the deployment's replicas. The FAQ: "It identifies scaling by comparing the desired-replicas annotation of each
/// machineset under the machinedeployment with machinedeployment's .spec.replicas." The reference also counts "no
/// active MachineSet while replicas > 0"; here only while no set has machines left either: a set scaled to 0 whose
/// machines are still going away must not let [`scale`] hand the whole count to another set at once (that would
/// exceed `replicas + maxSurge`); the rollout step grows the new set within the surge instead.
pub fn is_scaling_event(replicas: i32, new: Option<&SetView>, old: &[SetView]) -> bool {
    let all = || new.into_iter().chain(old.iter());
    let mut active = all().filter(|s| s.replicas > 0).peekable();
    if active.peek().is_none() {
        return replicas > 0 && all().all(|s| s.actual == 0);
    }
    active.any(|s| s.desired_replicas.is_some_and(|d| d != replicas))
}

/// The new set's replicas during a rolling update (Kubernetes' `NewRSNewReplicas`): grow it by what the surge leaves,
/// `min(replicas + maxSurge − total, replicas − new)`, where the total counts each set's [`SetView::footprint`].
pub fn new_set_replicas(replicas: i32, fenceposts: Fenceposts, new: &SetView, old: &[SetView]) -> i32 {
    let current: i32 = std::iter::once(new).chain(old).map(SetView::footprint).sum();
    let max_total = replicas.saturating_add(fenceposts.max_surge);
    if current >= max_total || new.replicas >= replicas {
        return new.replicas;
    }
    new.replicas + (max_total - current).min(replicas - new.replicas)
}

/// How far old sets are scaled down in a rolling update (Kubernetes' `reconcileOldReplicaSets`):
/// `maxScaledDown = Σreplicas − minAvailable − newUnavailable`; first the unhealthy replicas of old sets are removed
/// (oldest set first, up to `replicas − available` each, within `maxScaledDown`), then old sets go down by
/// `available − minAvailable` (oldest first). `minAvailable = replicas − maxUnavailable`. Availability counts each
/// set's [`SetView::kept_available`], so that a set already scaled down whose status still shows the machines it
/// will delete is not counted twice (Kubernetes counts `status.availableReplicas`, which races with the set's
/// deletions).
pub fn scale_down_old(replicas: i32, fenceposts: Fenceposts, new: &SetView, old: &[SetView]) -> Vec<Scale> {
    let old_total: i32 = old.iter().map(|s| s.replicas).sum();
    if old_total == 0 {
        return Vec::new();
    }
    let all_total = old_total + new.replicas;
    let min_available = replicas - fenceposts.max_unavailable;
    let new_unavailable = (new.replicas - new.available).max(0);
    let max_scaled_down = all_total - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    let mut sorted: Vec<SetView> = old.to_vec();
    sorted.sort_by(by_age);
    let mut targets: Vec<i32> = sorted.iter().map(|s| s.replicas).collect();

    // Unhealthy replicas first: removing them does not lower availability.
    let mut cleaned = 0;
    for (set, target) in sorted.iter().zip(targets.iter_mut()) {
        if cleaned >= max_scaled_down {
            break;
        }
        let unhealthy = (set.replicas - set.available).max(0);
        if set.replicas == 0 || unhealthy == 0 {
            continue;
        }
        let down = unhealthy.min(max_scaled_down - cleaned);
        *target -= down;
        cleaned += down;
    }

    // Then as far as availability allows.
    let available: i32 = new.kept_available()
        + sorted
            .iter()
            .zip(&targets)
            .map(|(s, t)| s.available.min(*t))
            .sum::<i32>();
    let mut allowed = (available - min_available).max(0);
    for target in &mut targets {
        if allowed == 0 {
            break;
        }
        let down = (*target).min(allowed);
        *target -= down;
        allowed -= down;
    }
    sorted
        .iter()
        .zip(targets)
        .filter(|(s, t)| s.replicas != *t)
        .map(|(s, t)| Scale {
            name: s.name.clone(),
            replicas: t,
        })
        .collect()
}

/// The size a set gets in a proportional scale (Kubernetes' `getReplicaSetFraction`): its share of
/// `replicas + maxSurge`, in proportion to the size it was scaled for (its `max-replicas` annotation, else
/// `fallback`), rounded half away from zero, minus its current size.
fn fraction(set: &SetView, replicas: i32, fenceposts: Fenceposts, fallback: i32) -> i32 {
    if replicas == 0 {
        return -set.replicas;
    }
    let total = f64::from(replicas.saturating_add(fenceposts.max_surge));
    let annotated = set.max_replicas.filter(|m| *m > 0).unwrap_or(fallback).max(1);
    let size = f64::from(set.replicas) * total / f64::from(annotated);
    #[allow(clippy::cast_possible_truncation)] // bounded by replicas + maxSurge
    let rounded = size.round() as i32;
    rounded - set.replicas
}

/// Scaling during a rollout (reference §6.4 `scale()`; spec 002 FAQ "How MCM responds when scale-out/scale-in is done
/// during rolling update"):
/// - a single active set (or, with none, the new set, else the newest old one) gets `replicas`;
/// - a saturated new set (replicas and available equal the deployment's) leaves old sets at 0;
/// - otherwise the total moves to `replicas + maxSurge` (0 when replicas is 0): "Case scale-out -> ONLY New
///   machineSet is scaled out" (up to `replicas`; without a new set, proportionally), and "Case scale-in -> ALL
///   machineSets (new or old) are scaled in, in proportion to their replica count, any leftover is adjusted in the
///   largest machineSet" (largest first, older first on ties).
///
/// Every active set whose replicas or annotations change is in the result (its annotations must be refreshed, or the
/// scaling event would be seen again).
pub fn scale(replicas: i32, fenceposts: Fenceposts, new: Option<&SetView>, old: &[SetView]) -> Vec<Scale> {
    let all: Vec<&SetView> = new.into_iter().chain(old.iter()).collect();
    let active: Vec<&SetView> = all.iter().copied().filter(|s| s.replicas > 0).collect();
    let scale_to = |set: &SetView, target: i32| {
        (set.replicas != target || annotations_stale(set, replicas, fenceposts)).then(|| Scale {
            name: set.name.clone(),
            replicas: target,
        })
    };
    let single = match active.as_slice() {
        [only] => Some(*only),
        [] => new.or_else(|| old.iter().max_by(|a, b| by_age(a, b))),
        _ => None,
    };
    if let Some(set) = single {
        return scale_to(set, replicas).into_iter().collect();
    }
    if let Some(new) = new
        && new.replicas == replicas
        && new.available >= replicas
    {
        return active
            .iter()
            .filter(|s| s.name != new.name)
            .filter_map(|s| scale_to(s, 0))
            .chain(scale_to(new, replicas))
            .collect();
    }
    let allowed = if replicas > 0 {
        replicas.saturating_add(fenceposts.max_surge)
    } else {
        0
    };
    let current: i32 = active.iter().map(|s| s.replicas).sum();
    let to_add = allowed - current;
    let mut targets: BTreeMap<&str, i32> = active.iter().map(|s| (s.name.as_str(), s.replicas)).collect();
    if to_add > 0
        && let Some(new) = new
    {
        let grown = new
            .replicas
            .saturating_add(to_add)
            .min(replicas.max(new.replicas));
        targets.insert(new.name.as_str(), grown);
    } else if to_add != 0 {
        let mut ordered = active.clone();
        if to_add > 0 {
            // Larger first, newer first on ties (Kubernetes' ReplicaSetsBySizeNewer).
            ordered.sort_by(|a, b| b.replicas.cmp(&a.replicas).then_with(|| by_age(b, a)));
        } else {
            // Larger first, older first on ties (ReplicaSetsBySizeOlder).
            ordered.sort_by(|a, b| b.replicas.cmp(&a.replicas).then_with(|| by_age(a, b)));
        }
        let mut added = 0;
        for set in &ordered {
            if added == to_add {
                break;
            }
            let share = fraction(set, replicas, fenceposts, current);
            let allowed_left = to_add - added;
            let proportion = if to_add > 0 {
                share.min(allowed_left)
            } else {
                share.max(allowed_left)
            };
            *targets.entry(set.name.as_str()).or_default() += proportion;
            added += proportion;
        }
        if let Some(first) = ordered.first() {
            let entry = targets.entry(first.name.as_str()).or_default();
            *entry = (*entry + to_add - added).max(0);
        }
    }
    all.iter()
        .filter(|s| s.replicas > 0 || targets.get(s.name.as_str()).is_some_and(|t| *t > 0))
        .filter_map(|s| {
            scale_to(
                s,
                targets.get(s.name.as_str()).copied().unwrap_or(s.replicas).max(0),
            )
        })
        .collect()
}

/// Whether the rollout is complete (Kubernetes' `DeploymentComplete`): the new set has `replicas` machines, all
/// available, and no old set has replicas or machines left.
pub fn is_complete(replicas: i32, new: Option<&SetView>, old: &[SetView]) -> bool {
    let new_done =
        new.is_some_and(|n| n.replicas == replicas && n.actual == replicas && n.available >= replicas);
    let no_new_needed = new.is_none() && replicas == 0;
    (new_done || no_new_needed) && old.iter().all(|s| s.replicas == 0 && s.actual == 0)
}

/// One step of the deployment controller (reference §6.1 steps 8–11, §6.3):
/// 1. not paused and no new set: create it — RollingUpdate with [`new_set_replicas`] (from 0), OnDelete with what the
///    old sets' live machines leave, Recreate only once no old machine is left (with `replicas`). The new set is
///    created **before** any scaling, so that scaling during a rollout never finds the new set missing (the
///    reference's open issue #816);
/// 2. a scaling event ([`is_scaling_event`]) or paused: [`scale`];
/// 3. otherwise by strategy: RollingUpdate scales the new set up ([`new_set_replicas`]) or, when it cannot, the old
///    sets down ([`scale_down_old`]); Recreate scales old sets to 0, waits until their machines are gone, then scales
///    the new set to `replicas`; OnDelete labels old sets `scale-up-disabled`, lowers each to its live machines and
///    gives the new set the rest.
pub fn step(input: &RolloutInput<'_>) -> RolloutPlan {
    let replicas = input.replicas.max(0);
    let fp = input.fenceposts;
    let mut plan = RolloutPlan::new(RolloutPhase::Progressing);
    if let Some(new) = input.new
        && new.scale_up_disabled
    {
        plan.enable_scale_up.push(new.name.clone());
    }
    let Some(new) = input.new else {
        if input.paused {
            plan.scale = scale(replicas, fp, None, input.old);
            plan.phase = RolloutPhase::Paused;
            return plan;
        }
        let old_machines: i32 = input.old.iter().map(|s| s.actual).sum();
        let old_live: i32 = input.old.iter().map(|s| s.live.min(s.replicas)).sum();
        plan.create_new = match input.strategy {
            StrategyType::Recreate if input.old.iter().any(|s| s.replicas > 0) => {
                plan.scale = scale_old_to_zero(input.old);
                None
            }
            StrategyType::Recreate if old_machines > 0 => {
                plan.phase = RolloutPhase::Waiting;
                None
            }
            StrategyType::Recreate => Some(replicas),
            StrategyType::OnDelete => Some((replicas - old_live).max(0)),
            StrategyType::RollingUpdate | StrategyType::InPlaceUpdate => {
                Some(new_set_replicas(replicas, fp, &SetView::default(), input.old))
            }
        };
        if input.strategy == StrategyType::OnDelete {
            plan.disable_scale_up = scale_up_to_disable(input.old);
        }
        return plan;
    };
    if input.paused || is_scaling_event(replicas, Some(new), input.old) {
        plan.scale = scale(replicas, fp, Some(new), input.old);
        plan.phase = if input.paused {
            RolloutPhase::Paused
        } else {
            RolloutPhase::Scaling
        };
        return plan;
    }
    match input.strategy {
        StrategyType::RollingUpdate => rolling(replicas, fp, new, input.old, &mut plan),
        // Moving machines in place needs their nodes: `in_place::decide` does it.
        StrategyType::InPlaceUpdate => {}
        StrategyType::Recreate => recreate(replicas, fp, new, input.old, &mut plan),
        StrategyType::OnDelete => on_delete(replicas, fp, new, input.old, &mut plan),
    }
    if plan.scale.is_empty() && plan.disable_scale_up.is_empty() && plan.enable_scale_up.is_empty() {
        plan.phase = if is_complete(replicas, Some(new), input.old) {
            RolloutPhase::Complete
        } else {
            RolloutPhase::Waiting
        };
    }
    plan
}

fn scale_old_to_zero(old: &[SetView]) -> Vec<Scale> {
    let mut sorted: Vec<&SetView> = old.iter().filter(|s| s.replicas > 0).collect();
    sorted.sort_by(|a, b| by_age(a, b));
    sorted
        .into_iter()
        .map(|s| Scale {
            name: s.name.clone(),
            replicas: 0,
        })
        .collect()
}

fn scale_up_to_disable(old: &[SetView]) -> Vec<String> {
    old.iter()
        .filter(|s| !s.scale_up_disabled && (s.replicas > 0 || s.actual > 0))
        .map(|s| s.name.clone())
        .collect()
}

fn rolling(replicas: i32, fp: Fenceposts, new: &SetView, old: &[SetView], plan: &mut RolloutPlan) {
    if new.replicas > replicas {
        plan.scale.push(Scale {
            name: new.name.clone(),
            replicas,
        });
        return;
    }
    let grown = new_set_replicas(replicas, fp, new, old);
    if grown != new.replicas {
        plan.scale.push(Scale {
            name: new.name.clone(),
            replicas: grown,
        });
        return;
    }
    plan.scale = scale_down_old(replicas, fp, new, old);
}

fn recreate(replicas: i32, fp: Fenceposts, new: &SetView, old: &[SetView], plan: &mut RolloutPlan) {
    plan.scale = scale_old_to_zero(old);
    if !plan.scale.is_empty() || old.iter().any(|s| s.actual > 0) {
        return;
    }
    if new.replicas != replicas || annotations_stale(new, replicas, fp) {
        plan.scale.push(Scale {
            name: new.name.clone(),
            replicas,
        });
    }
}

fn on_delete(replicas: i32, fp: Fenceposts, new: &SetView, old: &[SetView], plan: &mut RolloutPlan) {
    plan.disable_scale_up = scale_up_to_disable(old);
    let mut old_total = 0;
    for set in old {
        let target = set.replicas.min(set.live.max(0));
        old_total += target;
        if target != set.replicas {
            plan.scale.push(Scale {
                name: set.name.clone(),
                replicas: target,
            });
        }
    }
    let new_target = (replicas - old_total).clamp(0, replicas);
    if new_target != new.replicas || annotations_stale(new, replicas, fp) {
        plan.scale.push(Scale {
            name: new.name.clone(),
            replicas: new_target,
        });
    }
}
