//! The deletion order: FAQ order, marks, preservation, delete policies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{
    Machine, MachinePhase,
    keys::{annotations, extensions},
};
use pretty_assertions::assert_eq;

use super::*;

#[test]
fn the_faq_order_least_priority_then_phase_then_oldest() {
    // Spec 002 FAQ: "Machine with least value of machinepriority annotation is picked up. If all machines have
    // equal priorities, then following precedence is followed: Terminating > Failed > CrashloopBackoff > Unknown >
    // Pending > Available > Running. If still there is no match, the machine with oldest creation time (.i.e.
    // creationTimestamp) is picked up."
    let mut prio1 = running("prio1");
    annotate(&mut prio1, annotations::MACHINE_PRIORITY, "1");
    let machines = [
        created(running("running-new"), 300),
        created(running("running-old"), 200),
        machine("available", Some(MachinePhase::Available)),
        machine("pending", Some(MachinePhase::Pending)),
        machine("unknown", Some(MachinePhase::Unknown)),
        machine("crash", Some(MachinePhase::CrashLoopBackOff)),
        machine("failed", Some(MachinePhase::Failed)),
        machine("terminating", Some(MachinePhase::Terminating)),
        prio1,
    ];
    let order = DeletionOrder::new(None, 0, at(1000));
    assert_eq!(
        sorted(&order, &machines),
        vec![
            "prio1",
            "terminating",
            "failed",
            "crash",
            "unknown",
            "pending",
            "available",
            "running-old",
            "running-new"
        ]
    );
}

#[test]
fn new_machines_rank_with_terminating_and_bad_priorities_count_as_three() {
    // Reference: "Any phase not listed ("" or InPlace*) ranks 0, so brand-new machines are deleted first";
    // "Machine priority is taken to be the default value (3)" when it does not parse.
    assert_eq!(phase_rank(None), 0);
    assert_eq!(phase_rank(Some(MachinePhase::InPlaceUpdating)), 0);
    // A phase this build does not know ranks 0, as the reference's map lookup of a missing key gives.
    assert_eq!(phase_rank(Some(MachinePhase::parse("Hibernating"))), 0);
    let mut bad = running("bad");
    annotate(&mut bad, annotations::MACHINE_PRIORITY, "high");
    assert_eq!(bad.priority(), Machine::DEFAULT_PRIORITY);
    let mut two = running("two");
    annotate(&mut two, annotations::MACHINE_PRIORITY, "2");
    let machines = [created(bad, 1), two, created(machine("new", None), 500)];
    let order = DeletionOrder::new(None, 0, at(1000));
    assert_eq!(sorted(&order, &machines), vec!["two", "new", "bad"]);
}

#[test]
fn marked_machines_go_first_older_mark_first() {
    // Reference §5 (3): "Both have a marked-for-deletion-time ⇒ the older one goes first. A machine that has the
    // annotation goes before one that does not."
    let mut old_mark = running("old-mark");
    annotate(
        &mut old_mark,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-01T00:00:00Z",
    );
    let mut new_mark = running("new-mark");
    annotate(
        &mut new_mark,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-02T00:00:00Z",
    );
    let machines = [
        machine("pending", Some(MachinePhase::Pending)),
        new_mark,
        old_mark,
    ];
    let order = DeletionOrder::new(None, 0, at(1000));
    assert_eq!(sorted(&order, &machines), vec!["old-mark", "new-mark", "pending"]);
}

#[test]
fn preserved_machines_go_last_auto_preserved_before_explicit_earlier_expiry_first() {
    // Reference §5 (1): "Preserved machines (expiry time in the future) are deleted last. Among preserved
    // machines, auto-preserved ones go before explicitly preserved ones, and an earlier expiry goes first."
    let preserve = |name: &str, expiry: i64, auto: bool| {
        let mut m = machine(name, Some(MachinePhase::Failed));
        m.status.as_mut().unwrap().current_status.preserve_expiry_time = Some(Time(at(expiry)));
        if auto {
            annotate(&mut m, annotations::PRESERVE, "auto-preserved");
        }
        annotate(&mut m, annotations::MACHINE_PRIORITY, "1");
        m
    };
    let machines = [
        preserve("explicit-late", 3000, false),
        preserve("explicit-early", 2000, false),
        preserve("auto-late", 3000, true),
        preserve("auto-early", 2000, true),
        preserve("expired", 500, false),
        running("running"),
    ];
    let order = DeletionOrder::new(None, 0, at(1000));
    assert_eq!(
        sorted(&order, &machines),
        vec![
            "expired",
            "running",
            "auto-early",
            "auto-late",
            "explicit-early",
            "explicit-late"
        ]
    );
}

#[test]
fn a_delete_policy_replaces_phase_rank_and_age_but_not_priority_or_mark() {
    let mut prio1 = created(running("prio1"), 50);
    annotate(&mut prio1, annotations::MACHINE_PRIORITY, "1");
    let mut marked = created(running("marked"), 60);
    annotate(
        &mut marked,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-01T00:00:00Z",
    );
    let machines = [
        created(running("old"), 100),
        created(running("new"), 300),
        created(running("mid"), 200),
        created(machine("pending-old", Some(MachinePhase::Pending)), 10),
        created(machine("unknown-new", Some(MachinePhase::Unknown)), 400),
        marked,
        prio1,
    ];
    let newest = DeletionOrder::new(Some(DeletePolicy::Newest), 0, at(1000));
    assert_eq!(
        sorted(&newest, &machines),
        vec![
            "prio1",
            "marked",
            "unknown-new",
            "pending-old",
            "new",
            "mid",
            "old"
        ]
    );
    let oldest = DeletionOrder::new(Some(DeletePolicy::Oldest), 0, at(1000));
    assert_eq!(
        sorted(&oldest, &machines),
        vec![
            "prio1",
            "marked",
            "pending-old",
            "unknown-new",
            "old",
            "mid",
            "new"
        ]
    );
    let random = DeletionOrder::new(Some(DeletePolicy::Random), 42, at(1000));
    let order = sorted(&random, &machines);
    assert_eq!(&order[..2], &["prio1", "marked"]);
    let mut unhealthy = order[2..4].to_vec();
    unhealthy.sort_unstable();
    assert_eq!(unhealthy, vec!["pending-old", "unknown-new"]);
}

#[test]
fn the_random_policy_depends_on_the_seed_only() {
    let machines: Vec<Machine> = (0..12).map(|i| running(&format!("m{i}"))).collect();
    let order = DeletionOrder::new(Some(DeletePolicy::Random), 9, at(1000));
    let first = sorted(&order, &machines);
    let reversed: Vec<Machine> = machines.iter().rev().cloned().collect();
    assert_eq!(sorted(&order, &reversed), first, "independent of the input order");
    let other = DeletionOrder::new(Some(DeletePolicy::Random), 10, at(1000));
    assert_ne!(sorted(&other, &machines), first, "another seed, another order");
}

#[test]
fn the_deployments_delete_policy_wins_and_a_bad_value_is_reported() {
    let mut set = set(1);
    assert_eq!(delete_policy(&set, None), Ok(None));
    annotate_set(&mut set, extensions::DELETE_POLICY, "Oldest");
    assert_eq!(delete_policy(&set, None), Ok(Some(DeletePolicy::Oldest)));
    assert_eq!(
        delete_policy(&set, Some("newest")),
        Ok(Some(DeletePolicy::Newest))
    );
    let err = delete_policy(&set, Some("Youngest")).unwrap_err();
    assert_eq!(err.source_kind, PolicySource::MachineDeployment);
    assert!(err.to_string().contains("\"Youngest\""), "{err}");

    annotate_set(&mut set, extensions::DELETE_POLICY, "bogus");
    let machines = [running("a")];
    let plan = plan_for(&set, &machines, &Expectations::new());
    assert_eq!(plan.delete_policy, None);
    assert_eq!(plan.policy_problem.unwrap().source_kind, PolicySource::MachineSet);
}
