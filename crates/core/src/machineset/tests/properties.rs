//! Properties: the deletion order against the reference's comparison, and plans on random machines.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use mcm_api::{
    GoDuration, Machine, MachineConfiguration, MachinePhase, MetaExt, NodeTemplateSpec,
    keys::{annotations, extensions},
};
use proptest::prelude::*;

use super::*;
use crate::{machineset::common::name_of, timeouts};

/// The reference's criteria, written as the reference states them (reference §5 ActiveMachines.Less, 1–5), to
/// check [`DeletionOrder`] against. `Equal` where the reference has no opinion.
fn reference_compare(a: &Machine, b: &Machine, now: Timestamp) -> Ordering {
    let preserved = |m: &Machine| {
        m.is_preserved(now).then(|| {
            let auto = m.annotation(annotations::PRESERVE) == Some("auto-preserved");
            (!auto, m.preserve_expiry())
        })
    };
    match (preserved(a), preserved(b)) {
        (None, Some(_)) => return Ordering::Less,
        (Some(_), None) => return Ordering::Greater,
        (Some(x), Some(y)) if x != y => return x.cmp(&y),
        _ => {}
    }
    if a.priority() != b.priority() {
        return a.priority().cmp(&b.priority());
    }
    match (marked_for_deletion_at(a), marked_for_deletion_at(b)) {
        (Some(x), Some(y)) if x != y => return x.cmp(&y),
        (Some(_), None) => return Ordering::Less,
        (None, Some(_)) => return Ordering::Greater,
        _ => {}
    }
    let rank = |m: &Machine| phase_rank(m.phase());
    if rank(a) != rank(b) {
        return rank(a).cmp(&rank(b));
    }
    timeouts::created_at(a).cmp(&timeouts::created_at(b))
}

fn phase_strategy() -> impl Strategy<Value = Option<MachinePhase>> {
    prop_oneof![
        Just(None),
        proptest::sample::select(MachinePhase::ALL.to_vec()).prop_map(Some),
    ]
}

prop_compose! {
    fn arbitrary_machine(index: usize)(
        phase in phase_strategy(),
        priority in proptest::option::of(prop_oneof![Just("1"), Just("2"), Just("3"), Just("5"), Just("x")]),
        mark in proptest::option::of(0i64..4),
        created in proptest::option::of(0i64..4),
        preserved in proptest::option::of((0i64..4, any::<bool>())),
    ) -> Machine {
        let mut m = machine(&format!("m{index}"), phase);
        m.metadata.creation_timestamp = created.map(|c| Time(at(c)));
        if let Some(p) = priority {
            annotate(&mut m, annotations::MACHINE_PRIORITY, p);
        }
        if let Some(mark) = mark {
            annotate(&mut m, annotations::MARKED_FOR_DELETION_TIME, &at(mark).to_string());
        }
        if let Some((expiry, auto)) = preserved {
            // Expiries 0 and 1 lie in the past (now = 2), 2 is now (not preserved), 3 in the future.
            m.status.as_mut().unwrap().current_status.preserve_expiry_time = Some(Time(at(expiry)));
            if auto {
                annotate(&mut m, annotations::PRESERVE, "auto-preserved");
            }
        }
        m
    }
}

fn machines_strategy() -> impl Strategy<Value = Vec<Machine>> {
    (1usize..12).prop_flat_map(|n| (0..n).map(arbitrary_machine).collect::<Vec<_>>())
}

/// Durations as users write them: 5m and 300s are the same.
fn duration_text() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("5m"), Just("300s"), Just("1h")]
}

fn policy_strategy() -> impl Strategy<Value = Option<DeletePolicy>> {
    prop_oneof![
        Just(None),
        proptest::sample::select(DeletePolicy::ALL.to_vec()).prop_map(Some),
    ]
}

proptest! {
    #[test]
    fn the_deletion_order_is_a_total_order_consistent_with_the_reference(
        machines in machines_strategy(),
        policy in policy_strategy(),
        seed in any::<u64>(),
    ) {
        let now = at(2);
        let order = DeletionOrder::new(policy, seed, now);
        for a in &machines {
            for b in &machines {
                let ours = order.compare(a, b);
                // Antisymmetric, and equal only for the same machine.
                prop_assert_eq!(ours, order.compare(b, a).reverse());
                prop_assert_eq!(ours == Ordering::Equal, name_of(a) == name_of(b));
                let reference = reference_compare(a, b, now);
                if policy.is_none() {
                    // Without a policy: exactly the reference's criteria wherever they decide.
                    if reference != Ordering::Equal {
                        prop_assert_eq!(ours, reference, "{} vs {}", name_of(a), name_of(b));
                    }
                } else {
                    // With a policy: preservation, priority and mark still decide first.
                    let mut a_tail = a.clone();
                    let mut b_tail = b.clone();
                    for m in [&mut a_tail, &mut b_tail] {
                        m.status.as_mut().unwrap().current_status.phase = Some(MachinePhase::Running);
                        m.metadata.creation_timestamp = None;
                    }
                    let prefix = reference_compare(&a_tail, &b_tail, now);
                    let healthy = |m: &Machine| {
                        matches!(m.phase(), Some(MachinePhase::Running | MachinePhase::Available))
                    };
                    let (age_a, age_b) = (timeouts::created_at(a), timeouts::created_at(b));
                    if prefix != Ordering::Equal {
                        prop_assert_eq!(ours, prefix);
                    } else if healthy(a) != healthy(b) {
                        // Then unhealthy machines first, as Cluster API's delete policies.
                        prop_assert_eq!(ours, healthy(a).cmp(&healthy(b)));
                    } else if age_a != age_b && policy == Some(DeletePolicy::Oldest) {
                        prop_assert_eq!(ours, age_a.cmp(&age_b));
                    } else if age_a != age_b && policy == Some(DeletePolicy::Newest) {
                        prop_assert_eq!(ours, age_b.cmp(&age_a));
                    }
                }
            }
            for b in &machines {
                for c in &machines {
                    // Transitive.
                    if order.compare(a, b) != Ordering::Greater && order.compare(b, c) != Ordering::Greater {
                        prop_assert_ne!(order.compare(a, c), Ordering::Greater);
                    }
                }
            }
        }
        // Sorting is deterministic whatever the input order.
        let mut forward: Vec<&Machine> = machines.iter().collect();
        let mut backward: Vec<&Machine> = machines.iter().rev().collect();
        order.sort(&mut forward);
        order.sort(&mut backward);
        prop_assert_eq!(names(&forward), names(&backward));
    }

    #[test]
    fn slow_start_batches_sum_to_the_count_and_double(count in 0usize..500, initial in 1usize..4) {
        let batches = slow_start_batches(count, initial);
        prop_assert_eq!(batches.iter().sum::<usize>(), count);
        // Every batch but the last is `initial · 2^i`; the last is what is left, never more than that.
        for (i, batch) in batches.iter().enumerate() {
            let full = initial << i;
            if i + 1 < batches.len() {
                prop_assert_eq!(*batch, full);
            } else {
                prop_assert!(*batch >= 1 && *batch <= full);
            }
        }
    }

    #[test]
    fn decide_never_overshoots_never_undershoots_and_deletes_only_its_own(
        machines in machines_strategy(),
        replicas in 0i32..12,
        deleting_mask in proptest::collection::vec(any::<bool>(), 12),
        policy in policy_strategy(),
    ) {
        let mut set = set(replicas);
        if let Some(policy) = policy {
            annotate_set(&mut set, extensions::DELETE_POLICY, policy.as_str());
        }
        let machines: Vec<Machine> = machines
            .into_iter()
            .zip(deleting_mask)
            .map(|(mut m, deleting)| {
                if deleting {
                    m.metadata.deletion_timestamp = Some(Time(at(1)));
                }
                m
            })
            .collect();
        let refs: Vec<&Machine> = machines.iter().collect();
        let now = at(2);
        let plan = decide(&MachineSetInput {
            set: &set,
            machines: &refs,
            expectations: &Expectations::new(),
            deployment_delete_policy: None,
            now,
            random: 1,
        });
        let deleted: BTreeSet<&str> = plan.delete.iter().map(|d| d.name.as_str()).collect();
        prop_assert_eq!(deleted.len(), plan.delete.len(), "each machine once");
        for name in &deleted {
            let m = machines.iter().find(|m| name_of(m) == *name).unwrap();
            prop_assert!(!m.is_terminating(), "only machines not on their way out");
        }
        // Machines that stay and count.
        let staying = machines
            .iter()
            .filter(|m| !m.is_terminating() && !deleted.contains(name_of(m)))
            .filter(|m| m.phase() != Some(MachinePhase::Failed) || keeps_failed_machine(m, now))
            .count();
        let replicas = usize::try_from(replicas).unwrap();
        prop_assert!(staying + plan.create <= replicas.max(staying), "never more than replicas");
        let scale_down = plan.delete.iter().filter(|d| d.reason == DeletionReason::ScaleDown).count();
        if scale_down > 0 {
            prop_assert_eq!(staying, replicas, "scale-down stops at replicas");
            prop_assert_eq!(plan.create, 0);
        } else {
            prop_assert_eq!(staying + plan.create, replicas.max(staying));
        }
        prop_assert_eq!(plan.create_batches.iter().sum::<usize>(), plan.create);
    }

    #[test]
    fn propagation_converges_in_one_patch(
        template_timeouts in proptest::collection::vec(proptest::option::of(duration_text()), 3),
        machine_timeouts in proptest::collection::vec(proptest::option::of(duration_text()), 3),
        template_labels in proptest::option::of(proptest::collection::btree_map("[a-c]", "[x-z]", 0..3)),
        machine_labels in proptest::option::of(proptest::collection::btree_map("[a-c]", "[x-z]", 0..3)),
        set_timeout in proptest::option::of(prop_oneof![Just("20m"), Just("1h")]),
        machine_timeout in proptest::option::of(prop_oneof![Just("20m"), Just("1h")]),
    ) {
        let mut set = set(1);
        let mut m = running("a");
        let config = |c: &mut MachineConfiguration, values: &[Option<&str>]| {
            c.drain_timeout = values[0].map(GoDuration::new);
            c.health_timeout = values[1].map(GoDuration::new);
            c.creation_timeout = values[2].map(GoDuration::new);
        };
        config(&mut set.spec.template.spec.configuration, &template_timeouts);
        config(&mut m.spec.configuration, &machine_timeouts);
        let node_template = |labels: Option<BTreeMap<String, String>>| labels.map(|l| NodeTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(l), ..ObjectMeta::default() }),
            spec: None,
        });
        set.spec.template.spec.node_template = node_template(template_labels);
        m.spec.node_template = node_template(machine_labels);
        if let Some(t) = set_timeout {
            annotate_set(&mut set, annotations::EFFECTIVE_CREATION_TIMEOUT, t);
        }
        if let Some(t) = machine_timeout {
            annotate(&mut m, annotations::EFFECTIVE_CREATION_TIMEOUT, t);
        }
        let updated = match propagation_patch(&set, &m) {
            Some(patch) => apply_patch(&m, &patch),
            None => m.clone(),
        };
        prop_assert_eq!(propagation_patch(&set, &updated), None);
        prop_assert_eq!(&updated.spec.node_template, &set.spec.template.spec.node_template);
        prop_assert_eq!(
            updated.annotation(annotations::EFFECTIVE_CREATION_TIMEOUT),
            set_timeout
        );
        let parse = |d: &Option<GoDuration>| d.as_ref().map(|d| d.parse().unwrap());
        let (got, want) = (&updated.spec.configuration, &set.spec.template.spec.configuration);
        prop_assert_eq!(parse(&got.drain_timeout), parse(&want.drain_timeout));
        prop_assert_eq!(parse(&got.health_timeout), parse(&want.health_timeout));
        prop_assert_eq!(parse(&got.creation_timeout), parse(&want.creation_timeout));
        // Everything else is untouched.
        prop_assert_eq!(&updated.metadata.labels, &m.metadata.labels);
        prop_assert_eq!(&updated.spec.class.name, &m.spec.class.name);
    }
}
